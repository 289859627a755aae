/*
 * fdstore.c: systemd's descriptor store, played by the tests and the stress run (fdstore.h).
 */
#define _GNU_SOURCE
#include "fdstore.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* A failure of the store itself: says so and aborts (the test or the run fails with it). */
static void fdstore_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fdstore_fail(const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        fprintf(stderr, "fdstore: ");
        vfprintf(stderr, fmt, ap);
        fprintf(stderr, "\n");
        va_end(ap);
        abort();
}

static void *reader(void *arg);

struct fdstore *fdstore_new(void) {
        struct fdstore *s = calloc(1, sizeof(*s));
        struct sockaddr_un addr = { .sun_family = AF_UNIX };

        if (!s)
                fdstore_fail("out of memory");
        snprintf(s->path, sizeof(s->path), "%s/gpupool-fdstore-%d",
                 getenv("GPUPOOL_TEST_TMP") && *getenv("GPUPOOL_TEST_TMP") ? getenv("GPUPOOL_TEST_TMP") : "/tmp",
                 (int) getpid());
        unlink(s->path);
        s->sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (s->sock < 0)
                fdstore_fail("socket: %s", strerror(errno));
        snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", s->path);
        if (bind(s->sock, (struct sockaddr *) &addr, sizeof(addr)) < 0)
                fdstore_fail("bind %s: %s", s->path, strerror(errno));
        setenv("NOTIFY_SOCKET", s->path, 1);
        pthread_mutex_init(&s->lock, NULL);
        if ((errno = pthread_create(&s->thread, NULL, reader, s)) != 0)
                fdstore_fail("pthread_create: %s", strerror(errno));
        return s;
}

/* Drops what the store holds under name. */
static void fdstore_remove(struct fdstore *s, const char *name) {
        for (unsigned i = 0; i < s->n;)
                if (strcmp(s->names[i], name) == 0) {
                        close(s->fds[i]);
                        s->fds[i] = s->fds[--s->n];
                        memcpy(s->names[i], s->names[s->n], sizeof(s->names[i]));
                } else {
                        i++;
                }
}

/* The value of key= in a notification, into buf ("" when absent). */
static const char *notify_field(const char *msg, const char *key, char *buf, size_t size) {
        const char *p = strstr(msg, key);
        size_t n;

        buf[0] = '\0';
        if (p && (p == msg || p[-1] == '\n')) {
                p += strlen(key);
                n = strcspn(p, "\n");
                snprintf(buf, size, "%.*s", (int) (n < size ? n : size - 1), p);
        }
        return buf;
}

/* Reads every notification waiting. Locked. */
static void drain(struct fdstore *s) {
        for (;;) {
                char msg[1024], name[64], flag[8];
                union {
                        struct cmsghdr align;
                        char buf[CMSG_SPACE(sizeof(int) * 8)];
                } control;
                struct iovec iov = { .iov_base = msg, .iov_len = sizeof(msg) - 1 };
                struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                                    .msg_controllen = sizeof(control.buf) };
                int fds[8];
                unsigned nfds = 0;
                ssize_t n = recvmsg(s->sock, &m, MSG_CMSG_CLOEXEC);

                if (n < 0)
                        return;
                msg[n] = '\0';
                for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
                        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
                                for (size_t k = 0; k < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int) && nfds < 8; k++)
                                        memcpy(&fds[nfds++], CMSG_DATA(c) + k * sizeof(int), sizeof(int));
                notify_field(msg, "FDNAME=", name, sizeof(name));
                if (strcmp(notify_field(msg, "FDSTOREREMOVE=", flag, sizeof(flag)), "1") == 0)
                        fdstore_remove(s, name);
                if (strcmp(notify_field(msg, "FDSTORE=", flag, sizeof(flag)), "1") == 0) {
                        for (unsigned k = 0; k < nfds; k++) {
                                if (s->n == FDSTORE_MAX)
                                        fdstore_fail("the descriptor store is full (%d)", FDSTORE_MAX);
                                s->fds[s->n] = fds[k];
                                snprintf(s->names[s->n++], sizeof(s->names[0]), "%s", name);
                        }
                        nfds = 0;
                }
                for (unsigned k = 0; k < nfds; k++)
                        close(fds[k]);
        }
}

/* Reads as systemd does: at once, whatever the test's own thread is waiting for. */
static void *reader(void *arg) {
        struct fdstore *s = arg;

        for (;;) {
                struct pollfd p = { .fd = s->sock, .events = POLLIN };

                (void) poll(&p, 1, 5);
                pthread_mutex_lock(&s->lock);
                if (s->stop) {
                        pthread_mutex_unlock(&s->lock);
                        return NULL;
                }
                drain(s);
                pthread_mutex_unlock(&s->lock);
        }
}

unsigned fdstore_count(struct fdstore *s) {
        unsigned n;

        pthread_mutex_lock(&s->lock);
        drain(s);
        n = s->n;
        pthread_mutex_unlock(&s->lock);
        return n;
}

void fdstore_freeze(struct fdstore *s) {
        pthread_mutex_lock(&s->lock);
        drain(s);
}

void fdstore_thaw(struct fdstore *s) {
        pthread_mutex_unlock(&s->lock);
}

void fdstore_free(struct fdstore *s) {
        unsetenv("NOTIFY_SOCKET");
        pthread_mutex_lock(&s->lock);
        s->stop = true;
        pthread_mutex_unlock(&s->lock);
        pthread_join(s->thread, NULL);
        drain(s);
        while (s->n)
                close(s->fds[--s->n]);
        close(s->sock);
        unlink(s->path);
        free(s);
}

void fdstore_pass(struct fdstore *s) {
        char names[FDSTORE_MAX * 64] = "", n[16];
        int high[FDSTORE_MAX];
        struct rlimit rl;

        if (!s->n)
                return;
        /* Out of the way first, above where they go: fd 3 on may be any of them. */
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
                rl.rlim_cur = rl.rlim_max;
                (void) setrlimit(RLIMIT_NOFILE, &rl);
        }
        for (unsigned i = 0; i < s->n; i++)
                if ((high[i] = fcntl(s->fds[i], F_DUPFD, 3 + (int) s->n)) < 0)
                        fdstore_fail("dup: %s", strerror(errno));
        for (unsigned i = 0; i < s->n; i++) {
                dup2(high[i], 3 + (int) i);
                close(high[i]);
                if (i)
                        strcat(names, ":");
                strcat(names, s->names[i]);
        }
        snprintf(n, sizeof(n), "%u", s->n);
        setenv("LISTEN_FDS", n, 1);
        setenv("LISTEN_FDNAMES", names, 1);
        snprintf(n, sizeof(n), "%d", (int) getpid());
        setenv("LISTEN_PID", n, 1);
}
