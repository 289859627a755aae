/*
 * check_replies.c: libgpupool against a daemon that answers a lease wrongly (a fake one, in a
 * process of its own, host backend). Whatever the reply (descriptors missing, of another size,
 * not memory at all, shorter than the segment; a segment too small or already mapped; a
 * granule the process holds already, or one named twice; a reply of another kind), the
 * allocation fails with an errno and a sentence, the process keeps no descriptor of it and
 * never maps memory that is not there (a memfd too short would raise SIGBUS where the
 * application writes), every segment a wrong reply names that the process does not hold goes
 * back (the daemon counts it leased), and what it held before stays its own, its data intact.
 * And a daemon that refuses the first of the requests a trim sends together: the trim says
 * why, every segment it took went, and the replies after it are read, the connection in step.
 * And one that holds a lease of granules ahead only while another thread of the process takes
 * the idle granules the block counted on: the block leases what it then lacks. And hellos of
 * a backend the library does not know, or of two: the connect fails, saying so. And one that
 * seals a segment for a publish and then fails it, as a daemon killed between its seal and its
 * reply leaves it: no allocation comes from that segment again, its free rest included.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpupool.h"
#include "heap.h"
#include "suites.h"
#include "testlib.h"
#include "wire.h"

#define MiB (1ULL << 20)

enum scenario {
        GRANULES_FEWER_FDS,     /* two granules, one descriptor */
        GRANULES_OTHER_SIZE,    /* "granules" of 4 MiB */
        GRANULES_TOO_MANY,      /* more than asked and ahead together */
        GRANULES_NOT_MEMORY,    /* pipes for granules */
        GRANULES_SHORT,         /* memfds of 4 KiB for granules */
        GRANULES_HELD_ID,       /* every granule lease names segments 1, 2, ... */
        GRANULES_TWICE,         /* a granule lease names one segment twice */
        WHOLE_TOO_SMALL,        /* a segment smaller than the request */
        WHOLE_NO_FD,            /* a segment without its descriptor */
        WHOLE_SHORT,            /* a memfd shorter than the segment it stands for */
        WHOLE_SAME_ID,          /* every lease names segment 1 */
        OTHER_KIND,             /* a lease answered with a ReturnReply */
        RETURN_REFUSED,         /* leases right, the first ReturnRequest refused */
        AHEAD_HELD,             /* leases right, but one of granules ahead only is held, then brings none */
        HELLO_UNKNOWN_BACKEND,  /* hello names a backend no libgpupool knows */
        HELLO_TWO_BACKENDS,     /* hello names two devices of two backends */
        PUBLISH_SEALED,         /* leases right; a publish seals the segment against writing, then fails */
};

/* What the fake daemon saw, on a shared page: segment ids its lease replies named, and those the library gave back. */
struct seen {
        unsigned named, returned, returns;
};

struct fake {
        char dir[96], path[128];
        pid_t pid;
        struct seen *seen;
        int held[2], go[2];     /* AHEAD_HELD: a byte when it holds one, a byte to answer it */
};

static void reply(int sock, Gpupool__Envelope *env, const int *fds, size_t nfds) {
        uint8_t out[GP_MAX_REQUEST_BYTES];
        int n;

        env->version = GP_PROTOCOL_VERSION;
        n = gp_wire_pack(env, out, sizeof(out));
        if (n < 0 || gp_wire_send_packet_fds(sock, out, (size_t) n, fds, nfds) < 0)
                _exit(3);
}

/* A memfd of size bytes, or a pipe's read end when size is 0. */
static int memory(uint64_t size) {
        int fd, p[2];

        if (size == 0) {
                if (pipe(p) < 0)
                        _exit(4);
                close(p[1]);
                return p[0];
        }
        fd = memfd_create("fake-segment", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0 || ftruncate(fd, (off_t) size) < 0)
                _exit(4);
        return fd;
}

/* The answer to a lease in scenario s: its body in lr (more_segment_ids in more), its descriptors in fds. */
static size_t answer_lease(enum scenario s, const Gpupool__LeaseRequest *req, Gpupool__LeaseReply *lr, uint64_t *more,
                           int *fds) {
        static uint64_t next_id = 100;
        uint64_t n = req->has_granules ? req->granules : 0, ahead = req->has_granules_ahead ? req->granules_ahead : 0;
        uint64_t granule_size = GP_GRANULE_BYTES, count = n, fd_count, fd_size = GP_GRANULE_BYTES;

        switch (s) {
        case GRANULES_FEWER_FDS: fd_count = count - 1; break;
        case GRANULES_OTHER_SIZE: granule_size = fd_size = 2 * GP_GRANULE_BYTES, fd_count = count; break;
        case GRANULES_TOO_MANY: count = fd_count = n + ahead + 1; break;
        case GRANULES_NOT_MEMORY: fd_size = 0, fd_count = count; break;
        case GRANULES_SHORT: fd_size = 4096, fd_count = count; break;
        case GRANULES_HELD_ID:
        case GRANULES_TWICE:
        case RETURN_REFUSED:
        case AHEAD_HELD: fd_count = count; break;
        default: fd_count = 1; break;
        }
        if (req->has_granules && n == 0) {
                /* Granules ahead only: none (segment id 0 names no segment). */
                lr->segment_size = GP_GRANULE_BYTES;
                return 0;
        }
        if (!req->has_granules) {
                /* The class's segment, as gpupoold leases it (a rest after the block), or just the block. */
                granule_size = fd_size = s == PUBLISH_SEALED ? heap_segment_bytes(req->size) : req->size;
                if (s == WHOLE_TOO_SMALL)
                        granule_size = fd_size = req->size / 2;
                if (s == WHOLE_SHORT)
                        fd_size = req->size / 2;
                if (s == WHOLE_NO_FD)
                        fd_count = 0;
                count = 1;
        }
        lr->segment_id = s == WHOLE_SAME_ID || s == GRANULES_HELD_ID ? 1 : next_id++;
        lr->segment_size = granule_size;
        for (uint64_t i = 1; i < count; i++)
                more[i - 1] = s == GRANULES_HELD_ID ? 1 + i : s == GRANULES_TWICE ? lr->segment_id : next_id++;
        lr->n_more_segment_ids = count - 1;
        lr->more_segment_ids = more;
        for (uint64_t i = 0; i < fd_count; i++)
                fds[i] = memory(fd_size);
        return fd_count;
}

/* The fake daemon: serves hello, leases (as the scenario says), returns and bye, until killed. */
static void fake_main(int listen_sock, enum scenario s, struct seen *seen, const struct fake *f) {
        struct pollfd p[16] = { { .fd = listen_sock, .events = POLLIN } };
        int last = -1;          /* PUBLISH_SEALED: the latest segment leased, to seal */
        nfds_t n = 1;

        for (;;) {
                if (poll(p, n, -1) < 0)
                        _exit(2);
                if (p[0].revents & POLLIN) {
                        int sock = accept4(listen_sock, NULL, NULL, SOCK_CLOEXEC);

                        if (sock >= 0 && n < 16)
                                p[n++] = (struct pollfd) { .fd = sock, .events = POLLIN };
                }
                for (nfds_t i = 1; i < n; i++) {
                        Gpupool__Envelope *req, rep = GPUPOOL__ENVELOPE__INIT;
                        Gpupool__HelloReply hr = GPUPOOL__HELLO_REPLY__INIT;
                        Gpupool__DeviceInfo dev = GPUPOOL__DEVICE_INFO__INIT, dev2 = GPUPOOL__DEVICE_INFO__INIT;
                        Gpupool__DeviceInfo *devs[2] = { &dev, &dev2 };
                        Gpupool__LeaseReply lr = GPUPOOL__LEASE_REPLY__INIT;
                        Gpupool__ReturnReply rr = GPUPOOL__RETURN_REPLY__INIT;
                        uint8_t buf[GP_MAX_REQUEST_BYTES];
                        uint64_t more[GP_MAX_LEASE_GRANULES + 1];
                        int fds[GP_WIRE_MAX_FDS];
                        size_t nfds = 0, out = 0;
                        int len;

                        if (!(p[i].revents & (POLLIN | POLLHUP)))
                                continue;
                        len = gp_wire_recv_packet_fds(p[i].fd, buf, sizeof(buf), fds, &nfds);
                        for (size_t k = 0; k < nfds; k++)
                                close(fds[k]);
                        if (len <= 0) {
                                close(p[i].fd);
                                p[i--] = p[--n];
                                continue;
                        }
                        if (gp_wire_unpack(buf, (size_t) len, &req) < 0)
                                _exit(5);
                        rep.id = req->id;
                        rep.has_status = true;
                        rep.status = GPUPOOL__STATUS__STATUS_OK;
                        switch (req->body_case) {
                        case GPUPOOL__ENVELOPE__BODY_HELLO:
                                dev.backend = s == HELLO_UNKNOWN_BACKEND ? "tpu" : "host";
                                dev.total_bytes = dev2.total_bytes = 1024 * MiB;
                                dev2.backend = "cuda-vmm";
                                hr.client_id = 7;
                                hr.daemon_version = "fake";
                                hr.n_devices = s == HELLO_TWO_BACKENDS ? 2 : 1;
                                hr.devices = devs;
                                rep.body_case = GPUPOOL__ENVELOPE__BODY_HELLO_REPLY;
                                rep.hello_reply = &hr;
                                break;
                        case GPUPOOL__ENVELOPE__BODY_LEASE:
                                if (s == OTHER_KIND) {
                                        rr.returned = 1;
                                        rep.body_case = GPUPOOL__ENVELOPE__BODY_RETURN_REPLY;
                                        rep.return_reply = &rr;
                                        break;
                                }
                                out = answer_lease(s, req->lease, &lr, more, fds);
                                seen->named += lr.segment_id ? 1 + (unsigned) lr.n_more_segment_ids : 0;
                                if (s == AHEAD_HELD && !lr.segment_id) {
                                        char ch = 'h';

                                        if (write(f->held[1], &ch, 1) != 1 || read(f->go[0], &ch, 1) != 1)
                                                _exit(6);
                                }
                                rep.body_case = GPUPOOL__ENVELOPE__BODY_LEASE_REPLY;
                                rep.lease_reply = &lr;
                                if (s == PUBLISH_SEALED && out) {
                                        if (last >= 0)
                                                close(last);
                                        last = dup(fds[0]);
                                }
                                break;
                        case GPUPOOL__ENVELOPE__BODY_PUBLISH:
                                /* Sealed as gpupoold seals, then no publish: as when it is killed before it answers. */
                                if (last < 0 || fcntl(last, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) < 0)
                                        _exit(7);
                                rep.status = GPUPOOL__STATUS__STATUS_INTERNAL;
                                rep.error = "the fake daemon sealed the segment, then failed the publish";
                                break;
                        case GPUPOOL__ENVELOPE__BODY_RETURN_SEGMENTS:
                                seen->returned += (unsigned) req->return_segments->n_segment_ids;
                                if (s == RETURN_REFUSED && seen->returns++ == 0) {
                                        rep.status = GPUPOOL__STATUS__STATUS_INVALID;
                                        rep.error = "the fake daemon refuses the first return";
                                        break;
                                }
                                rr.returned = (uint32_t) req->return_segments->n_segment_ids;
                                rep.body_case = GPUPOOL__ENVELOPE__BODY_RETURN_REPLY;
                                rep.return_reply = &rr;
                                break;
                        case GPUPOOL__ENVELOPE__BODY_BYE:
                                break;
                        default:        /* usage reports: nothing answers them */
                                gpupool__envelope__free_unpacked(req, NULL);
                                continue;
                        }
                        reply(p[i].fd, &rep, fds, out);
                        for (size_t k = 0; k < out; k++)
                                close(fds[k]);
                        gpupool__envelope__free_unpacked(req, NULL);
                }
        }
}

static void fake_start(struct fake *f, enum scenario s) {
        int sock;

        test_mkdtemp(f->dir, sizeof(f->dir), "replies");
        snprintf(f->path, sizeof(f->path), "%s/gpupool.sock", f->dir);
        f->seen = mmap(NULL, sizeof(*f->seen), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        ck_assert_ptr_ne(f->seen, MAP_FAILED);
        sock = listen_seqpacket(f->path);
        ck_assert_int_eq(pipe2(f->held, O_CLOEXEC), 0);
        ck_assert_int_eq(pipe2(f->go, O_CLOEXEC), 0);
        f->pid = fork();
        ck_assert_int_ge(f->pid, 0);
        if (f->pid == 0)
                fake_main(sock, s, f->seen, f);
        close(sock);
}

static void fake_stop(struct fake *f) {
        kill(f->pid, SIGKILL);
        ck_assert_int_eq(waitpid(f->pid, NULL, 0), f->pid);
        munmap(f->seen, sizeof(*f->seen));
        close(f->held[0]), close(f->held[1]), close(f->go[0]), close(f->go[1]);
        unlink(f->path);
        rmdir(f->dir);
}

static const struct {
        enum scenario s;
        const char *mode;       /* $GPUPOOL_SEGMENTS */
        size_t size;            /* the allocation */
        int err;                /* what it returns */
        const char *text;       /* in the sentence */
        bool returned;          /* the segments handed over go back */
} cases[] = {
        { GRANULES_FEWER_FDS, "grow", 4 * MiB, -EPROTO, "segments of 2097152 bytes and 1 descriptors", true },
        { GRANULES_OTHER_SIZE, "grow", 4 * MiB, -EPROTO, "segments of 4194304 bytes", true },
        { GRANULES_TOO_MANY, "grow", 4 * MiB, -EPROTO, "answered a lease of 2 granules", true },
        { GRANULES_NOT_MEMORY, "grow", 4 * MiB, -EPROTO, "is not 2 MiB of memory", true },
        { GRANULES_SHORT, "grow", 4 * MiB, -EPROTO, "is not 2 MiB of memory", true },
        { GRANULES_HELD_ID, "grow", 4 * MiB, -EPROTO, "leased segment 1, which this process holds already", false },
        { GRANULES_TWICE, "grow", 4 * MiB, -EPROTO, "which this process holds already", true },
        { WHOLE_TOO_SMALL, "whole", 64 * MiB, -EPROTO, "cannot serve the request", true },
        { WHOLE_NO_FD, "whole", 64 * MiB, -EPROTO, "without its file descriptor", true },
        { WHOLE_SHORT, "whole", 64 * MiB, -EPROTO, "is not 67108864 bytes of memory", true },
        { WHOLE_SAME_ID, "whole", 64 * MiB, -EPROTO, "maps already", false },
        { OTHER_KIND, "whole", 64 * MiB, -EPROTO, "answered with the wrong kind of message", false },
};

START_TEST(test_wrong_lease_replies) {
        const int k = _i;
        gpupool_client *c;
        struct fake f;
        char err[GP_MAX_ERROR_BYTES];
        void *p = NULL, *q;
        int before, r;

        before = fds_from(0);
        fake_start(&f, cases[k].s);
        c = connect_segments(f.path, "wronged", cases[k].mode);
        if (cases[k].s == WHOLE_SAME_ID || cases[k].s == GRANULES_HELD_ID) {
                /* The first lease is right; the second names it again. */
                ck_assert_int_eq(gpupool_alloc(c, 0, cases[k].size, &p), 0);
                memset(p, 1, cases[k].size);
        }
        r = gpupool_alloc(c, 0, cases[k].size, &q);
        gpupool_last_error(c, err, sizeof(err));
        ck_assert_msg(r == cases[k].err && *err && strstr(err, cases[k].text), "case %d: %d (%s): %s", k, r, gpupool_strerror(r),
                      err);
        /* Of a wrong reply, all it named; of the right one before it (WHOLE_SAME_ID, GRANULES_HELD_ID), none. */
        ck_assert_msg(f.seen->returned == (cases[k].returned ? f.seen->named : 0), "case %d: %u of %u segments returned", k,
                      f.seen->returned, f.seen->named);
        if (p) {
                ck_assert(((char *) p)[0] == 1 && ((char *) p)[cases[k].size - 1] == 1);
                ck_assert_int_eq(gpupool_free(c, p), 0);
        }
        gpupool_disconnect(c);
        unsetenv("GPUPOOL_SEGMENTS");
        fake_stop(&f);
        ck_assert_msg(fds_from(0) == before, "case %d: %d descriptors open before, %d after", k, before, fds_from(0));
}
END_TEST

/*
 * A publish that fails after the daemon sealed the segment: -EROFS, the block no longer the
 * application's; and every allocation after it, of any size, comes from other segments and is
 * writable (the segment's free rest, as read-only as the block, would fault where written).
 */
START_TEST(test_sealed_publish_leaves_its_segment) {
        gpupool_client *c;
        struct fake f;
        char err[GP_MAX_ERROR_BYTES];
        uint8_t *big, *small[64];

        fake_start(&f, PUBLISH_SEALED);
        c = connect_segments(f.path, "sealed", "whole");
        /* 10 MiB and 64 KiB in a segment of 12 MiB of its own: a free rest of 1.9 MiB after it. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 10 * MiB + 64 * 1024, (void **) &big), 0);
        memset(big, 7, 10 * MiB + 64 * 1024);
        ck_assert_int_eq(gpupool_publish(c, "weights", big, 10 * MiB + 64 * 1024), -EROFS);
        gpupool_last_error(c, err, sizeof(err));
        ck_assert_msg(strstr(err, "had sealed the block's segment against writing already"), "%s", err);
        /* Small ones, and large ones the free rest would fit (over 1 MiB: the class of large segments). */
        for (int i = 0; i < 64; i++) {
                size_t size = i % 2 ? (size_t) (i % 8 + 1) * 16 * 1024 : MiB + (size_t) (i % 8 + 1) * 64 * 1024;

                ck_assert_int_eq(gpupool_alloc(c, 0, size, (void **) &small[i]), 0);
                ck_assert_msg(small[i] + size <= big || small[i] >= big + 12 * MiB, "block %d at %p is in the sealed segment at %p",
                              i, (void *) small[i], (void *) big);
                memset(small[i], i, size);
        }
        for (int i = 0; i < 64; i++)
                ck_assert_int_eq(gpupool_free(c, small[i]), 0);
        ck_assert_int_eq(gpupool_free(c, big), -ENOENT);        /* not the application's any more */
        gpupool_disconnect(c);
        unsetenv("GPUPOOL_SEGMENTS");
        fake_stop(&f);
}
END_TEST

START_TEST(test_refused_return) {
        struct gpupool_stats before, st;
        gpupool_client *c;
        struct fake f;
        char err[GP_MAX_ERROR_BYTES];
        void *p;

        fake_start(&f, RETURN_REFUSED);
        c = connect_segments(f.path, "refused", "grow");
        ck_assert_int_eq(gpupool_alloc(c, 0, 600 * MiB, &p), 0);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        ck_assert_uint_eq(f.seen->named, 300);
        /* 300 granules: two requests, sent together; the first refused. */
        ck_assert_int_eq(gpupool_stats(c, &before), 0);
        ck_assert_int_eq(gpupool_trim(c), -EINVAL);
        gpupool_last_error(c, err, sizeof(err));
        ck_assert_msg(strstr(err, "the fake daemon refuses the first return"), "%s", err);
        ck_assert_int_eq(gpupool_stats(c, &st), 0);
        ck_assert_uint_eq(st.round_trips - before.round_trips, 1);
        /* Every granule taken went (the daemon sorts out those it refused), and none is held. */
        ck_assert_uint_eq(f.seen->returns, 2);
        ck_assert_uint_eq(f.seen->returned, 300);
        ck_assert_uint_eq(st.mapped_segments, 0);
        /* The second reply was read: the next request gets its own. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 4 * MiB, &p), 0);
        memset(p, 2, 4 * MiB);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        gpupool_disconnect(c);
        unsetenv("GPUPOOL_SEGMENTS");
        fake_stop(&f);
}
END_TEST

/* Thread A's block: 8 MiB, which fits neither 6 MiB hole. */
static void *ahead_main(void *arg) {
        gpupool_client *c = arg;
        void *r;

        if (gpupool_alloc(c, 0, 8 * MiB, &r) < 0)
                return NULL;
        memset(r, 3, 8 * MiB);
        return r;
}

/*
 * A block whose idle granules elsewhere cover it asks for granules ahead only, and the lock is
 * let go while that lease is out; another thread's blocks take those idle granules meanwhile.
 * The lease brings none: the block counts again, leases what it now lacks, and is served.
 */
START_TEST(test_idle_taken_while_ahead_out) {
        void *w, *p1, *s1, *p2, *s2, *b1, *b2, *r;
        gpupool_client *c;
        pthread_t thread;
        struct fake f;
        char ch;

        fake_start(&f, AHEAD_HELD);
        c = connect_segments(f.path, "raced", "grow");
        /* 200 MiB, then two 6 MiB blocks apart, freed: 6 granules idle in two holes (108 held; this daemon gives none ahead). */
        ck_assert_int_eq(gpupool_alloc(c, 0, 200 * MiB, &w), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 6 * MiB, &p1), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 2 * MiB, &s1), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 6 * MiB, &p2), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 2 * MiB, &s2), 0);
        ck_assert_int_eq(gpupool_free(c, p1), 0);
        ck_assert_int_eq(gpupool_free(c, p2), 0);
        /*
         * 8 MiB lands after them, on 4 granules the idle ones cover; the peak of 216 MiB and a
         * 24th allow 113, so it asks for them ahead only, and the fake daemon holds that.
         */
        ck_assert_int_eq(pthread_create(&thread, NULL, ahead_main, c), 0);
        ck_assert_int_eq(read(f.held[0], &ch, 1), 1);
        /* Meanwhile this thread's blocks fill both holes, on the idle granules, asking nothing. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 6 * MiB, &b1), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 6 * MiB, &b2), 0);
        ck_assert_ptr_eq(b1, p1);
        ck_assert_ptr_eq(b2, p2);
        memset(b1, 1, 6 * MiB);
        memset(b2, 2, 6 * MiB);
        ck_assert_int_eq(write(f.go[1], "g", 1), 1);
        ck_assert_int_eq(pthread_join(thread, &r), 0);
        ck_assert_ptr_nonnull(r);
        /* The 4 granules it then lacked came in a lease of their own. */
        ck_assert_uint_eq(f.seen->named, 112);
        ck_assert(((char *) r)[0] == 3 && ((char *) r)[8 * MiB - 1] == 3);
        ck_assert(((char *) b1)[0] == 1 && ((char *) b1)[6 * MiB - 1] == 1);
        ck_assert(((char *) b2)[0] == 2 && ((char *) b2)[6 * MiB - 1] == 2);
        gpupool_disconnect(c);
        unsetenv("GPUPOOL_SEGMENTS");
        fake_stop(&f);
}
END_TEST

/* A hello this library cannot map memory for: the connect fails, saying why, and keeps no descriptor. */
START_TEST(test_hello_of_unknown_backends) {
        static const struct {
                enum scenario s;
                const char *text;
        } hellos[] = {
                { HELLO_UNKNOWN_BACKEND, "serves a backend this library does not know (tpu)" },
                { HELLO_TWO_BACKENDS, "serves devices of two backends (host and cuda-vmm)" },
        };
        gpupool_client *c = NULL;
        char why[GP_MAX_ERROR_BYTES];
        struct fake f;
        int before, r;

        before = fds_from(0);
        fake_start(&f, hellos[_i].s);
        r = gpupool_connect(f.path, "unmappable", &c);
        gpupool_last_error(NULL, why, sizeof(why));
        ck_assert_msg(r == -EPROTO && !c && strstr(why, hellos[_i].text), "%d: %s", r, why);
        fake_stop(&f);
        ck_assert_msg(fds_from(0) == before, "%d descriptors open before, %d after", before, fds_from(0));
}
END_TEST

Suite *suite_replies(void) {
        Suite *s = suite_create("replies");
        TCase *tc = tcase_create("host");

        tcase_add_loop_test(tc, test_wrong_lease_replies, 0, (int) (sizeof(cases) / sizeof(cases[0])));
        tcase_add_test(tc, test_refused_return);
        tcase_add_test(tc, test_sealed_publish_leaves_its_segment);
        tcase_add_test(tc, test_idle_taken_while_ahead_out);
        tcase_add_loop_test(tc, test_hello_of_unknown_backends, 0, 2);
        suite_add_tcase(s, tc);
        return s;
}
