/*
 * notify.c: the two pieces of the systemd protocol gpupoold speaks, in our own few lines
 * rather than libsystemd: state notifications (sd_notify(3): a datagram to $NOTIFY_SOCKET, with
 * descriptors for the store: FDSTORE=1) and the descriptors passed at start (sd_listen_fds(3):
 * from fd 3 on, for $LISTEN_PID, named by $LISTEN_FDNAMES): the socket, and what it stored.
 */
#define _GNU_SOURCE
#include "notify.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define LISTEN_FDS_START 3
/* The most descriptors one notification here carries. */
#define MAX_FDS_PER_SEND 1

/*
 * Sends state with fds to $NOTIFY_SOCKET: at once or not at all, or (wait) waiting up to
 * NOTIFY_STORE_WAIT_MS for room in the manager's queue.
 */
static int send_state(const char *state, const int *fds, unsigned n_fds, bool wait) {
        const char *path = getenv("NOTIFY_SOCKET");
        struct sockaddr_un addr = { .sun_family = AF_UNIX };
        union {
                struct cmsghdr align;
                char buf[CMSG_SPACE(sizeof(int) * MAX_FDS_PER_SEND)];
        } control;
        struct iovec iov = { .iov_base = (void *) state, .iov_len = strlen(state) };
        struct msghdr msg = { .msg_name = &addr, .msg_iov = &iov, .msg_iovlen = 1 };
        size_t len;
        ssize_t n;
        int fd;

        if (!path || !*path)
                return 0;       /* not started by systemd, or not Type=notify: nobody listens */
        len = strlen(path);
        if ((path[0] != '/' && path[0] != '@') || len >= sizeof(addr.sun_path) || n_fds > MAX_FDS_PER_SEND)
                return -EINVAL;
        memcpy(addr.sun_path, path, len);
        if (path[0] == '@')
                addr.sun_path[0] = '\0';        /* an abstract socket */
        msg.msg_namelen = (socklen_t) (offsetof(struct sockaddr_un, sun_path) + len + (path[0] == '/'));
        if (n_fds) {
                struct cmsghdr *c;

                memset(&control, 0, sizeof(control));
                msg.msg_control = control.buf;
                msg.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
                c = CMSG_FIRSTHDR(&msg);
                c->cmsg_level = SOL_SOCKET;
                c->cmsg_type = SCM_RIGHTS;
                c->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
                memcpy(CMSG_DATA(c), fds, sizeof(int) * n_fds);
        }
        fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        if (wait) {
                struct timeval tv = { .tv_sec = NOTIFY_STORE_WAIT_MS / 1000, .tv_usec = NOTIFY_STORE_WAIT_MS % 1000 * 1000 };

                (void) setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        }
        n = sendmsg(fd, &msg, MSG_NOSIGNAL | (wait ? 0 : MSG_DONTWAIT));
        close(fd);
        if (n < 0)
                return -errno;
        return 1;
}

int notify_send(const char *state) {
        return send_state(state, NULL, 0, false);
}

int notify_store(const char *name, int fd) {
        char state[NOTIFY_NAME_MAX + 64];

        /* FDPOLL=0: systemd must keep it whatever poll(2) says of it (a GPU driver's descriptor). */
        snprintf(state, sizeof(state), "FDSTORE=1\nFDPOLL=0\nFDNAME=%s", name);
        return send_state(state, &fd, 1, true);
}

int notify_store_remove(const char *name) {
        char state[NOTIFY_NAME_MAX + 64];

        snprintf(state, sizeof(state), "FDSTOREREMOVE=1\nFDNAME=%s", name);
        return send_state(state, NULL, 0, true);
}

uint64_t notify_watchdog_usec(void) {
        const char *usec = getenv("WATCHDOG_USEC"), *pid = getenv("WATCHDOG_PID");
        unsigned long long v;
        char *end;

        if (!usec || !*usec)
                return 0;
        /* WATCHDOG_PID, when set, names the process the watchdog is for. */
        if (pid && *pid && strtoll(pid, NULL, 10) != (long long) getpid())
                return 0;
        errno = 0;
        v = strtoull(usec, &end, 10);
        if (errno || *end || v == 0)
                return 0;
        return v;
}

/* Whether a passed descriptor's name is one gpupoold stored (notify_store()), not a socket unit's. */
static bool stored_name(const char *name) {
        return strncmp(name, NOTIFY_STORED_PREFIX, strlen(NOTIFY_STORED_PREFIX)) == 0;
}

/* Checks that fd is a listening AF_UNIX SOCK_SEQPACKET socket and sets it up; else says why. */
static int listen_socket(int fd, char *err, size_t err_size) {
        int type = 0, listening = 0, domain = 0;
        socklen_t len = sizeof(int);

        if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) < 0 ||
            getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0 ||
            getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) < 0) {
                snprintf(err, err_size, "the socket systemd passed (fd %d) is not a socket: %s", fd, strerror(errno));
                return -ENOTSOCK;
        }
        if (domain != AF_UNIX || type != SOCK_SEQPACKET || !listening) {
                snprintf(err, err_size, "the socket systemd passed is not a listening AF_UNIX SOCK_SEQPACKET socket "
                                        "(use ListenSequentialPacket=)");
                return -EINVAL;
        }
        if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0) {
                snprintf(err, err_size, "cannot set up the socket systemd passed: %s", strerror(errno));
                return -errno;
        }
        return 0;
}

int notify_listen_fds(struct notify_passed *ret, char *err, size_t err_size) {
        const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS"), *names = getenv("LISTEN_FDNAMES");
        /* The colon-separated names, walked along with the descriptors ("" past the last: a socket). */
        const char *name = names ? names : "";
        unsigned sockets = 0;
        long n;
        int r = 0;

        ret->listen_fd = -1;
        ret->n = 0;
        if (!pid || !fds || strtoll(pid, NULL, 10) != (long long) getpid())
                return 0;
        n = strtol(fds, NULL, 10);
        if (n < 0 || n > NOTIFY_MAX_PASSED) {
                snprintf(err, err_size, "systemd passed %ld descriptors; gpupoold takes at most %d", n, NOTIFY_MAX_PASSED);
                r = -EINVAL;
                n = 0;
        }
        for (long i = 0; i < n; i++) {
                int fd = LISTEN_FDS_START + (int) i;
                const char *end = strchr(name, ':');
                size_t len = end ? (size_t) (end - name) : strlen(name);

                /* None of them for the programs this one runs. */
                (void) fcntl(fd, F_SETFD, FD_CLOEXEC);
                if (len <= NOTIFY_NAME_MAX && len > strlen(NOTIFY_STORED_PREFIX) && stored_name(name)) {
                        memcpy(ret->names[ret->n], name, len);
                        ret->names[ret->n][len] = '\0';
                        ret->fds[ret->n++] = fd;
                } else if (sockets++ == 0) {
                        ret->listen_fd = fd;
                }       /* a second socket is refused below, and left as it is */
                name = end ? end + 1 : name + len;
        }
        /* The variables are for this process alone: children must not think they have our descriptors. */
        unsetenv("LISTEN_PID");
        unsetenv("LISTEN_FDS");
        unsetenv("LISTEN_FDNAMES");
        if (r == 0 && sockets > 1) {
                snprintf(err, err_size, "systemd passed %u sockets; gpupoold takes one (ListenSequentialPacket= once)", sockets);
                r = -EINVAL;
        }
        if (r == 0 && ret->listen_fd >= 0)
                r = listen_socket(ret->listen_fd, err, err_size);
        if (r < 0) {
                notify_passed_close(ret);
                return r;
        }
        return ret->listen_fd >= 0;
}

void notify_passed_close(struct notify_passed *p) {
        for (unsigned i = 0; i < p->n; i++)
                if (p->fds[i] >= 0)
                        close(p->fds[i]);
        p->n = 0;
        if (p->listen_fd >= 0)
                close(p->listen_fd);
        p->listen_fd = -1;
}
