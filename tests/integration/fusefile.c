/*
 * fusefile.c: a FUSE server that answers just enough to open one file, then nothing (see
 * fusefile.h). The requests and replies are the kernel's (linux/fuse.h); attributes are never
 * cached (valid for 0 s), so every fstat(2) of the file goes to the server.
 */
#define _GNU_SOURCE
#include "fusefile.h"

#include <check.h>
#include <poll.h>
#include <signal.h>

#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testlib.h"

static int fuse_fd = -1;
static unsigned long long file_size;
/* While frozen, the requests heard and not answered (answered -EIO on a thaw). */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static bool frozen;
static uint64_t unanswered[256];
static unsigned unanswered_count;

static void fill_attr(struct fuse_attr *a, uint64_t ino) {
        memset(a, 0, sizeof(*a));
        a->ino = ino;
        a->nlink = 1;
        if (ino == FUSE_ROOT_ID) {
                a->mode = S_IFDIR | 0755;
        } else {
                a->mode = S_IFREG | 0666;
                a->size = file_size;
        }
}

/* Answers request unique with error (negative) or the payload of len bytes. */
static void answer(uint64_t unique, int error, const void *payload, size_t len) {
        uint8_t buf[sizeof(struct fuse_out_header) + 256];
        struct fuse_out_header *h = (struct fuse_out_header *) buf;

        h->len = (uint32_t) (sizeof(*h) + (error ? 0 : len));
        h->error = error;
        h->unique = unique;
        if (!error && len)
                memcpy(buf + sizeof(*h), payload, len);
        (void) !write(fuse_fd, buf, h->len);
}

static void *serve(void *arg) {
        static uint8_t buf[1 << 20 | 8192];

        (void) arg;
        for (;;) {
                ssize_t n = read(fuse_fd, buf, sizeof(buf));
                const struct fuse_in_header *in = (const struct fuse_in_header *) buf;

                if (n < 0 && errno == EINTR)
                        continue;
                if (n < (ssize_t) sizeof(*in))
                        return NULL;
                pthread_mutex_lock(&lock);
                if (frozen) {
                        if (unanswered_count < sizeof(unanswered) / sizeof(unanswered[0]) && in->opcode != FUSE_FORGET &&
                            in->opcode != FUSE_BATCH_FORGET)
                                unanswered[unanswered_count++] = in->unique;
                        pthread_mutex_unlock(&lock);
                        continue;       /* heard, not answered */
                }
                pthread_mutex_unlock(&lock);
                switch (in->opcode) {
                case FUSE_INIT: {
                        const struct fuse_init_in *ii = (const void *) (in + 1);
                        struct fuse_init_out o = { .major = FUSE_KERNEL_VERSION, .max_write = 4096, .time_gran = 1 };

                        o.minor = ii->minor < FUSE_KERNEL_MINOR_VERSION ? ii->minor : FUSE_KERNEL_MINOR_VERSION;
                        answer(in->unique, 0, &o, sizeof(o));
                        break;
                }
                case FUSE_LOOKUP: {
                        struct fuse_entry_out e = { .nodeid = 2 };

                        fill_attr(&e.attr, 2);
                        answer(in->unique, 0, &e, sizeof(e));
                        break;
                }
                case FUSE_GETATTR: {
                        struct fuse_attr_out a = { 0 };

                        fill_attr(&a.attr, in->nodeid);
                        answer(in->unique, 0, &a, sizeof(a));
                        break;
                }
                case FUSE_OPEN: {
                        struct fuse_open_out o = { .fh = 1 };

                        answer(in->unique, 0, &o, sizeof(o));
                        break;
                }
                case FUSE_FORGET:
                case FUSE_BATCH_FORGET:
                        break;  /* no answer is expected */
                default:
                        answer(in->unique, -ENOSYS, NULL, 0);
                }
        }
}

int fusefile_open_frozen(const char *dir, unsigned long long size, char *why, size_t why_size) {
        char opts[128], path[300];
        pthread_t thread;
        int fd;

        file_size = size;
        if (geteuid() != 0) {
                snprintf(why, why_size, "mounting FUSE needs root");
                return -1;
        }
        if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) {
                snprintf(why, why_size, "no mount namespace of its own: %s", strerror(errno));
                return -1;
        }
        if ((fuse_fd = open("/dev/fuse", O_RDWR | O_CLOEXEC)) < 0) {
                snprintf(why, why_size, "/dev/fuse: %s", strerror(errno));
                return -1;
        }
        snprintf(opts, sizeof(opts), "fd=%d,rootmode=40000,user_id=0,group_id=0", fuse_fd);
        if (mount("gpupool-test", dir, "fuse", MS_NOSUID | MS_NODEV, opts) < 0) {
                snprintf(why, why_size, "mounting FUSE: %s", strerror(errno));
                return -1;
        }
        if (pthread_create(&thread, NULL, serve, NULL) != 0) {
                snprintf(why, why_size, "no thread for the FUSE server");
                return -1;
        }
        snprintf(path, sizeof(path), "%s/file", dir);
        fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0) {
                snprintf(why, why_size, "opening a file on FUSE: %s", strerror(errno));
                return -1;
        }
        pthread_mutex_lock(&lock);
        frozen = true;
        pthread_mutex_unlock(&lock);
        return fd;
}

void fusefile_thaw(void) {
        pthread_mutex_lock(&lock);
        frozen = false;
        for (unsigned i = 0; i < unanswered_count; i++)
                answer(unanswered[i], -EIO, NULL, 0);
        unanswered_count = 0;
        pthread_mutex_unlock(&lock);
}

/*
 * The FUSE adopter's end: says on report[1] what happened ('S' and why: skipped; 'A': sent;
 * then 'R' refused, 'X' anything else, 'T' no answer), and thaws its server on a byte on report[2].
 */
static int fuse_adopter(struct testd *d, void *arg) {
        const int *report = arg;
        char why[200], dir[300];
        uint64_t size = 2 << 20;
        struct pollfd pfd;
        int fd, sock;

        close(report[0]);
        close(report[3]);       /* so that the test's end, or its failure, closes the pipe */
        snprintf(dir, sizeof(dir), "%s/fuse", d->dir);
        fd = fusefile_open_frozen(dir, size, why, sizeof(why));
        if (fd < 0) {
                (void) !write(report[1], "S", 1);
                (void) !write(report[1], why, strlen(why) + 1);
                return 0;
        }
        sock = raw_hello(d, "fuse-adopter");
        {
                Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
                Gpupool__AdoptRequest ar = GPUPOOL__ADOPT_REQUEST__INIT;

                ar.device = 0;
                ar.sizes = &size;
                ar.n_sizes = 1;
                env.id = 7;
                env.body_case = GPUPOOL__ENVELOPE__BODY_ADOPT;
                env.adopt = &ar;
                raw_send_fds(sock, &env, &fd, 1);
        }
        (void) !write(report[1], "A", 1);
        pfd = (struct pollfd) { .fd = sock, .events = POLLIN };
        if (poll(&pfd, 1, 5000) == 1) {
                Gpupool__Envelope *rep = raw_recv(sock);
                bool refused = rep && rep->status == GPUPOOL__STATUS__STATUS_INVALID && rep->error &&
                               strstr(rep->error, "a file on a fuse file system");

                (void) !write(report[1], refused ? "R" : "X", 1);
        } else {
                (void) !write(report[1], "T", 1);
        }
        /* Frozen until the test has seen what it must (or failed, closing the pipe); then everyone's close is answered. */
        (void) !read(report[2], why, 1);
        fusefile_thaw();
        close(sock);
        close(fd);
        return 0;
}

void check_frozen_fuse_adoption(const char *test, struct testd *d) {
        char cmd[512], out[4096], dir[300], c = 0;
        int report[4];
        double t0;
        pid_t pid;

        snprintf(dir, sizeof(dir), "%s/fuse", d->dir);
        ck_assert_int_eq(mkdir(dir, 0700), 0);
        ck_assert_int_eq(pipe(report), 0);
        ck_assert_int_eq(pipe(report + 2), 0);
        pid = spawn(fuse_adopter, d, report);
        ck_assert_int_eq(read(report[0], &c, 1), 1);
        if (c == 'S') {
                char why[200] = "";

                (void) !read(report[0], why, sizeof(why) - 1);
                test_skipped(test, "adopting a frozen FUSE file: %s", why);
        } else {
                ck_assert_int_eq(c, 'A');
                snprintf(cmd, sizeof(cmd), "timeout 5 %s/gpupoolctl --socket %s status >/dev/null", build_dir(), d->sock);
                t0 = now_s();
                ck_assert_msg(run_capture(cmd, out, sizeof(out)) == 0, "gpupoolctl status did not answer in 5 s");
                ck_assert_msg(now_s() - t0 < 2, "gpupoolctl status took %.1f s", now_s() - t0);
                ck_assert_int_eq(read(report[0], &c, 1), 1);
                ck_assert_msg(c == 'R', "the adoption of a FUSE file was %s", c == 'T' ? "not answered in 5 s" : "not refused");
        }
        ck_assert_int_eq(write(report[3], "t", 1), 1);
        ck_assert_int_eq(reap(pid), 0);
        for (int i = 0; i < 4; i++)
                close(report[i]);
        rmdir(dir);
}
