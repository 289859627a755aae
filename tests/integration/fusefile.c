/*
 * fusefile.c: a FUSE server that answers just enough to open one file, then nothing (see
 * fusefile.h). The requests and replies are the kernel's (linux/fuse.h); attributes are never
 * cached (valid for 0 s), so every fstat(2) of the file goes to the server.
 *
 * The server is a process of its own, the only holder of /dev/fuse's descriptor, and it dies
 * with the process that mounted (PR_SET_PDEATHSIG). When it goes, the kernel aborts the
 * connection and every request waiting on it fails: a process that held the file (one exiting,
 * whose close asks the server; the daemon's closer) is never left waiting for a server that is
 * gone. A server thread in the holder's own process could not promise that: at the holder's
 * exit the thread dies first, and the close of the file then waits forever, unkillable.
 */
#define _GNU_SOURCE
#include "fusefile.h"

#include <check.h>
#include <poll.h>
#include <signal.h>

#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testlib.h"

static int fuse_fd = -1;                /* the server's */
static unsigned long long file_size;
static int ctl = -1;                    /* the mounting process's end of the server's control socket */
/* In the server, while frozen: the requests heard and not answered (answered -EIO on a thaw). */
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

/* A command on the control socket: 'F' freeze, 'T' thaw (what was heard fails with EIO); each acknowledged. */
static void command(int sock, char c) {
        if (c == 'T') {
                for (unsigned k = 0; k < unanswered_count; k++)
                        answer(unanswered[k], -EIO, NULL, 0);
                unanswered_count = 0;
        }
        frozen = c == 'F';
        (void) !write(sock, &c, 1);
}

/* The server process: answers the kernel, or while frozen hears it only, until the mounting process is gone. */
static void serve(int sock) {
        static uint8_t buf[1 << 20 | 8192];

        for (;;) {
                struct pollfd p[2] = { { .fd = fuse_fd, .events = POLLIN }, { .fd = sock, .events = POLLIN } };
                const struct fuse_in_header *in = (const struct fuse_in_header *) buf;
                ssize_t n;
                char c;

                if (poll(p, 2, -1) < 0) {
                        if (errno == EINTR)
                                continue;
                        return;
                }
                if (p[1].revents) {
                        if (read(sock, &c, 1) != 1)
                                return;         /* the mounting process is gone */
                        command(sock, c);
                        continue;
                }
                n = read(fuse_fd, buf, sizeof(buf));
                if (n < 0 && (errno == EINTR || errno == EAGAIN))
                        continue;
                if (n < (ssize_t) sizeof(*in))
                        return;
                if (frozen) {
                        if (unanswered_count < sizeof(unanswered) / sizeof(unanswered[0]) && in->opcode != FUSE_FORGET &&
                            in->opcode != FUSE_BATCH_FORGET)
                                unanswered[unanswered_count++] = in->unique;
                        continue;       /* heard, not answered */
                }
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

/* Sends the server a command and waits for its acknowledgement; false if it is gone. */
static bool tell(char c) {
        char ack;

        return write(ctl, &c, 1) == 1 && read(ctl, &ack, 1) == 1 && ack == c;
}

static int open_frozen(const char *dir, unsigned long long size, bool flushes, char *why, size_t why_size) {
        char opts[128], path[300];
        pid_t parent = getpid(), pid;
        int fd, sv[2];

        file_size = size;
        if (geteuid() != 0) {
                snprintf(why, why_size, "mounting FUSE needs root");
                return -1;
        }
        if (unshare(CLONE_NEWNS) < 0 || mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL) < 0) {
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
                close(fuse_fd);
                return -1;
        }
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0 || (pid = fork()) < 0) {
                snprintf(why, why_size, "no server process for FUSE: %s", strerror(errno));
                umount2(dir, MNT_DETACH);
                close(fuse_fd);
                return -1;
        }
        if (pid == 0) {
                /* The server: nothing but /dev/fuse and its control socket; it goes with the mounting process. */
                if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
                        _exit(0);
                close(sv[0]);
                serve(sv[1]);
                _exit(0);
        }
        close(sv[1]);
        close(fuse_fd);         /* the server's alone: when it goes, the connection is aborted */
        fuse_fd = -1;
        ctl = sv[0];
        snprintf(path, sizeof(path), "%s/file", dir);
        /*
         * A close asks the server to flush, and waits for its answer, unless the server has
         * said it does not flush (ENOSYS, the kernel's no_flush): one open and close while it
         * still answers says so, and no close of the file waits on the frozen server after.
         */
        if (!flushes) {
                fd = open(path, O_RDONLY | O_CLOEXEC);
                if (fd >= 0)
                        close(fd);
        }
        fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0 || !tell('F')) {
                snprintf(why, why_size, "opening a file on FUSE: %s", fd < 0 ? strerror(errno) : "the server is gone");
                if (fd >= 0)
                        close(fd);
                return -1;
        }
        return fd;
}

int fusefile_open_frozen(const char *dir, unsigned long long size, char *why, size_t why_size) {
        return open_frozen(dir, size, false, why, why_size);
}

int fusefile_open_frozen_flushing(const char *dir, unsigned long long size, char *why, size_t why_size) {
        return open_frozen(dir, size, true, why, why_size);
}

void fusefile_thaw(void) {
        if (ctl >= 0)
                (void) tell('T');
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
                if (rep)
                        gpupool__envelope__free_unpacked(rep, NULL);
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
        close(report[1]);       /* the adopter's ends: if it dies, the reads below end */
        close(report[2]);
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
        close(report[0]);
        close(report[3]);
        rmdir(dir);
}
