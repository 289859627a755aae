/*
 * check_peers.c: peers that stop reading, lie or hand over strange descriptors, against a
 * real gpupoold: what each may do to the daemon and to other clients, and what it may not
 * (a live process's memory given to another, a frozen loop, reclaim diverted or switched off,
 * a status that no longer fits, a log flooded, scrapes locked out).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "closer.h"
#include "fusefile.h"
#include "gpupool.h"
#include "suites.h"
#include "testlib.h"

#define MiB (1ULL << 20)

/*
 * A client that keeps a segment mapped and stops reading is disconnected once, after
 * --send-timeout; its memory stays reserved to its live process (it is still exiting seconds
 * later), and the next lessee gets other memory: nothing it writes shows in the first one's
 * mapping.
 */
START_TEST(test_deaf_client_keeps_its_live_memory) {
        Gpupool__Envelope *rep;
        struct testd d;
        int deaf, other, fd = -1, fd2 = -1;
        uint8_t *mine, *theirs;
        char log[65536];

        testd_start(&d, "--send-timeout", "1s", NULL);
        deaf = raw_hello(&d, "deaf");
        rep = raw_lease_fd(deaf, 0, MiB, &fd);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        ck_assert_int_ge(fd, 0);
        mine = mmap(NULL, rep->lease_reply->segment_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        ck_assert_ptr_ne(mine, MAP_FAILED);
        memset(mine, 0x5a, rep->lease_reply->segment_size);
        gpupool__envelope__free_unpacked(rep, NULL);

        fcntl(deaf, F_SETFL, O_NONBLOCK);
        ck_assert_int_gt(queue_status_requests(deaf, 50), 10);
        ck_assert_msg(testd_client_becomes(&d, 0, "deaf", "exiting", 1), "the deaf client was not disconnected");
        /* Two more ticks of the stuck timer: it is not disconnected again, and keeps its memory. */
        nap_ms(2500);
        ck_assert_int_eq(testd_client_field(&d, 0, "deaf", "exiting"), 1);
        ck_assert_int_eq(testd_client_field(&d, 0, "deaf", "reserved_bytes"), 2 * MiB);

        other = raw_hello(&d, "next");
        rep = raw_lease_fd(other, 0, MiB, &fd2);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        theirs = mmap(NULL, rep->lease_reply->segment_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd2, 0);
        ck_assert_ptr_ne(theirs, MAP_FAILED);
        for (size_t i = 0; i < 2 * MiB; i += 4096)
                ck_assert_msg(theirs[i] != 0x5a, "the next lessee reads the live client's bytes at %zu", i);
        memset(theirs, 0xa5, rep->lease_reply->segment_size);
        for (size_t i = 0; i < 2 * MiB; i += 4096)
                ck_assert_msg(mine[i] == 0x5a, "the next lessee's writes show in the live client's mapping at %zu", i);
        munmap(theirs, rep->lease_reply->segment_size);
        gpupool__envelope__free_unpacked(rep, NULL);
        read_text(d.log, log, sizeof(log));
        ck_assert_msg(!strstr(log, "releasing its memory now"), "%s", log);

        munmap(mine, 2 * MiB);
        close(fd);
        close(fd2);
        close(deaf);
        close(other);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/*
 * An adoption of a file on FUSE whose server stops answering: the daemon refuses it at once,
 * never asking the file system (fstat(2) would wait for the server), and everyone else,
 * gpupoolctl status included, is served meanwhile. Needs root and FUSE; skipped saying why
 * where the machine has neither.
 */
START_TEST(test_adopting_a_frozen_fuse_file_stalls_nothing) {
        struct testd d;

        testd_start(&d, NULL);
        check_frozen_fuse_adoption(__func__, &d);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/*
 * Round five: the daemon refuses a descriptor on a FUSE file system, but closes it, and that
 * close waits forever on a server that does not answer FLUSH. On one closer thread nothing was
 * closed after it: 156 adoptions of 128 /dev/null descriptors filled the table, new clients
 * were refused and leases dropped their clients. Here a user (another uid, the daemon as the
 * unit runs it: unprivileged) hands over three such descriptors: two closes stick, on two
 * threads; 200 other clients come and go, and their sockets are closed at once. Then the same
 * user floods descriptors, which wait behind its stuck closes: at CLOSER_BACKLOG_MAX it is
 * dropped and refused, and nobody else is. Once the server answers, every descriptor goes.
 */
struct stuck_closer {
        int up[2], go[2];
};

/* Sends an adoption of n segments of 2 MiB with fds, and reads its answer; false when the daemon dropped us. */
static bool adopt_fds(int sock, const int *fds, size_t n) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__AdoptRequest ar = GPUPOOL__ADOPT_REQUEST__INIT;
        uint64_t sizes[GP_WIRE_MAX_FDS];
        bool ok;

        for (size_t i = 0; i < n; i++)
                sizes[i] = 2 * MiB;
        ar.device = 0;
        ar.sizes = sizes;
        ar.n_sizes = n;
        env.id = 7;
        env.body_case = GPUPOOL__ENVELOPE__BODY_ADOPT;
        env.adopt = &ar;
        raw_send_fds(sock, &env, fds, n);
        rep = raw_recv(sock);
        ok = rep && rep->status != GPUPOOL__STATUS__STATUS_OK;      /* refused, as it must be */
        if (rep)
                gpupool__envelope__free_unpacked(rep, NULL);
        return ok;
}

static int stick_closes(struct testd *d, void *arg) {
        struct stuck_closer *sc = arg;
        int fd, fds[3], nulls[128], sock;
        char why[200], dir[300], b;
        bool dropped = false;

        snprintf(dir, sizeof(dir), "%s/fuse", d->dir);
        fd = fusefile_open_frozen_flushing(dir, 2 * MiB, why, sizeof(why));
        if (fd < 0) {
                (void) !write(sc->up[1], "S", 1);
                (void) !write(sc->up[1], why, strlen(why) + 1);
                return 0;
        }
        if (setgid(65533) < 0 || setuid(65533) < 0)
                return 2;
        sock = raw_hello(d, "stuck-closer");
        fds[0] = fd;
        fds[1] = dup(fd);
        fds[2] = dup(fd);
        if (!adopt_fds(sock, fds, 3))
                return 3;
        /* Ours stay open until the thaw: closing one here would wait on the server as the daemon's do. */
        if (write(sc->up[1], "A", 1) != 1 || read(sc->go[0], &b, 1) != 1)
                return 4;
        /* Descriptors that close at once, but wait behind this user's stuck closes. */
        for (int i = 0; i < 128; i++)
                nulls[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
        for (int i = 0; i < 40 && !dropped; i++)
                dropped = !adopt_fds(sock, nulls, 128);
        for (int i = 0; i < 128; i++)
                close(nulls[i]);
        close(sock);
        if (!dropped || write(sc->up[1], "D", 1) != 1 || read(sc->go[0], &b, 1) != 1)
                return 5;
        /* Refused while its descriptors wait. */
        {
                gpupool_client *c;

                if (gpupool_connect(d->sock, "stuck-closer-again", &c) == 0)
                        return 6;
        }
        if (write(sc->up[1], "R", 1) != 1 || read(sc->go[0], &b, 1) != 1)
                return 7;
        fusefile_thaw();
        close(fds[2]);
        close(fds[1]);
        close(fd);
        return 0;
}

/*
 * In a process of its own (a FUSE mount's namespace), the closer as the daemon has it: two
 * closes of a file whose FUSE server never answers its FLUSH from each of 32 senders, 64 in
 * all, as many as the closer has threads; then one of the daemon's own descriptors (a pipe's
 * end), which must close at once all the same. 0, 100 skipped (why on report), or the step.
 */
static int own_close_behind_peers(struct testd *d, void *arg) {
        int *report = arg, p[2], fd;
        unsigned closing = 0, waiting = 0;
        char dir[300], why[200];
        struct pollfd hup;
        double t0;

        snprintf(dir, sizeof(dir), "%s/fuse-own", d->dir);
        if (mkdir(dir, 0755) < 0)
                return 1;
        fd = fusefile_open_frozen_flushing(dir, 4096, why, sizeof(why));
        if (fd < 0) {
                (void) !write(report[1], why, strlen(why) + 1);
                return 100;
        }
        for (int i = 0; i < CLOSER_THREADS; i++)
                closer_close_from(dup(fd), (uid_t) (5000 + i / CLOSER_PER_SENDER));
        /* Every peer's close taken or held back: none waits for a thread to start. */
        for (t0 = now_s(); now_s() - t0 < 10; nap_ms(10)) {
                closer_counts(&closing, &waiting);
                if (closing + waiting == CLOSER_THREADS && closing >= CLOSER_THREADS - CLOSER_OWN_THREADS)
                        break;
        }
        if (closing < CLOSER_THREADS - CLOSER_OWN_THREADS)
                return 2;
        if (pipe(p) < 0)
                return 3;
        closer_close(p[1]);
        hup = (struct pollfd) { .fd = p[0], .events = POLLIN };
        if (poll(&hup, 1, 2000) != 1 || !(hup.revents & POLLHUP))
                return 4;       /* the daemon's own waited behind the peers' */
        fusefile_thaw();
        close(fd);
        close(p[0]);
        return closer_stop(10000) == 0 ? 0 : 5;
}

/*
 * Round six: with two closes stuck on FUSE from each of 32 users (or 32 subordinate uids, now
 * one user), every closer thread waited, and nothing else was closed, the daemon's own
 * descriptors included. Peers' closes now leave CLOSER_OWN_THREADS threads to the daemon's own.
 */
START_TEST(test_own_closes_never_wait_behind_peers) {
        char why[200] = "";
        struct testd d;
        int report[2], r;

        if (under_valgrind()) {
                TEST_SKIP("valgrind holds its one lock through a close(2) that waits on FUSE");
                return;
        }
        testd_start(&d, NULL);          /* for its directory: the closer under test is the child's own */
        ck_assert_int_eq(pipe(report), 0);
        r = reap(spawn(own_close_behind_peers, &d, report));
        close(report[1]);
        if (r == 100) {
                (void) !read(report[0], why, sizeof(why) - 1);
                TEST_SKIP("a close stuck on FUSE: %s", why);
        } else {
                ck_assert_msg(r == 0, "the daemon's own descriptor waited behind peers' stuck closes (step %d)", r);
        }
        close(report[0]);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* Waits up to 5 s for the daemon to hold at most want descriptors; returns what it holds. */
static int fds_settle(struct testd *d, int want) {
        int n = open_fds(d->pid);

        for (double t0 = now_s(); n > want && now_s() - t0 < 5; nap_ms(20))
                n = open_fds(d->pid);
        return n;
}

START_TEST(test_a_close_stuck_on_fuse_stops_no_other) {
        struct stuck_closer sc;
        char dir[300], c = 0;
        gpupool_client *cl;
        int base, n;
        struct testd d;
        pid_t pid;
        void *p;

        /*
         * Valgrind runs one thread at a time and keeps its lock through a close(2), so the stuck
         * close stops the daemon whole there; its --sim-hints=fuse-compatible, which would let
         * go, stops valgrind 3.19 itself on this close (an assertion in vgPlain_client_syscall).
         */
        if (under_valgrind()) {
                TEST_SKIP("valgrind holds its one lock through a close(2) that waits on FUSE");
                return;
        }
        testd_start_as(&d, 65534, NULL);       /* as the unit runs it */
        snprintf(dir, sizeof(dir), "%s/fuse", d.dir);
        ck_assert_int_eq(mkdir(dir, 0755), 0);
        ck_assert_int_eq(pipe(sc.up), 0);
        ck_assert_int_eq(pipe(sc.go), 0);
        ck_assert_int_eq(gpupool_connect(d.sock, "before", &cl), 0);
        gpupool_disconnect(cl);
        base = fds_settle(&d, 0);
        pid = spawn(stick_closes, &d, &sc);
        ck_assert_int_eq(read(sc.up[0], &c, 1), 1);
        if (c == 'S') {
                char why[200] = "";

                (void) !read(sc.up[0], why, sizeof(why) - 1);
                TEST_SKIP("a close stuck on FUSE: %s", why);
                ck_assert_int_eq(reap(pid), 0);
                goto out;
        }
        ck_assert_int_eq(c, 'A');
        /* Two closes stick; 200 clients of another user come and go, and their sockets close at once. */
        for (int i = 0; i < 200; i++) {
                ck_assert_int_eq(gpupool_connect(d.sock, "comes-and-goes", &cl), 0);
                gpupool_disconnect(cl);
        }
        /* Beyond what it held: the stuck user's socket and pidfd, and its third descriptor, waiting. */
        n = fds_settle(&d, base + 3);
        ck_assert_msg(n <= base + 3, "the daemon holds %d descriptors, %d before: its closes wait", n, base);
        ck_assert(testd_log_wait(&d, "closing clients' descriptors on 2 threads"));
        /* The same user's flood waits behind its own stuck closes, bounded, and then it is dropped. */
        ck_assert_int_eq(write(sc.go[1], "g", 1), 1);
        ck_assert_msg(read(sc.up[0], &c, 1) == 1 && c == 'D', "the flooder was not dropped (%d)", reap(pid));
        n = open_fds(d.pid);
        ck_assert_msg(n <= base + 3 + CLOSER_BACKLOG_MAX + GP_WIRE_MAX_FDS, "the daemon holds %d descriptors", n);
        ck_assert_int_eq(write(sc.go[1], "g", 1), 1);
        ck_assert_int_eq(read(sc.up[0], &c, 1), 1);
        ck_assert_int_eq(c, 'R');
        /* Everyone else is served meanwhile. */
        ck_assert_int_eq(gpupool_connect(d.sock, "served", &cl), 0);
        ck_assert_int_eq(gpupool_alloc(cl, 0, 4 * MiB, &p), 0);
        ck_assert_int_eq(gpupool_free(cl, p), 0);
        gpupool_disconnect(cl);
        /* The server answers: every descriptor goes (but the segment "served" leased, cached: the host backend keeps its memfd). */
        ck_assert_int_eq(write(sc.go[1], "g", 1), 1);
        ck_assert_int_eq(reap(pid), 0);
        n = fds_settle(&d, base + 1);
        ck_assert_msg(n <= base + 1, "the daemon holds %d descriptors after the thaw, %d before", n, base);
out:
        close(sc.up[0]), close(sc.up[1]), close(sc.go[0]), close(sc.go[1]);
        rmdir(dir);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* A liar's control channel answers each request for memory back with nothing (or, silent, never). */
static void answer_with_nothing(int control) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT, *rep = raw_recv(control);
        Gpupool__ReclaimReply answer = GPUPOOL__RECLAIM_REPLY__INIT;

        ck_assert_ptr_nonnull(rep);
        ck_assert_int_eq(rep->body_case, GPUPOOL__ENVELOPE__BODY_RECLAIM);
        gpupool__envelope__free_unpacked(rep, NULL);
        env.version = GP_PROTOCOL_VERSION;
        env.body_case = GPUPOOL__ENVELOPE__BODY_RECLAIM_REPLY;
        env.reclaim_reply = &answer;
        raw_send(control, &env);
}

/*
 * A client that leases 40 MiB and reports it all free, then gives back nothing when asked
 * (answering with nothing, or never), cannot make another's allocation fail while an honest
 * process holds 24 MiB free: the daemon asks the next clients within the same deadline, and
 * trusts the liar less (its reports count for half) next time.
 */
static void check_liar(bool silent) {
        gpupool_client *honest, *needy;
        struct testd d;
        int liar, control;
        void *p;
        double t0;

        testd_start(&d, "--host-capacity", "64M", "--reclaim-timeout", "2s", NULL);
        liar = raw_keeper(&d, "liar", 20 * MiB, 2, NULL, &control);
        setenv("GPUPOOL_IDLE_RETURN", "10min", 1);     /* the honest one gives nothing back by itself */
        ck_assert_int_eq(gpupool_connect(d.sock, "honest", &honest), 0);
        unsetenv("GPUPOOL_IDLE_RETURN");
        ck_assert_int_eq(gpupool_alloc(honest, 0, 24 * MiB, &p), 0);
        ck_assert_int_eq(gpupool_free(honest, p), 0);
        ck_assert(testd_client_becomes(&d, 0, "honest", "held_free_bytes", 24 * MiB));
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 64 * MiB);

        ck_assert_int_eq(gpupool_connect(d.sock, "needy", &needy), 0);
        t0 = now_s();
        if (silent) {
                /* Asked first (it claims the most), never answering: the next are asked at half the deadline. */
                ck_assert_int_eq(gpupool_alloc(needy, 0, 2 * MiB, &p), 0);
                ck_assert_msg(now_s() - t0 < 1.9, "the allocation waited %.2f s, the whole reclaim_timeout", now_s() - t0);
        } else {
                pid_t pid = fork();

                ck_assert_int_ge(pid, 0);
                if (pid == 0) {
                        answer_with_nothing(control);
                        _exit(0);
                }
                ck_assert_int_eq(gpupool_alloc(needy, 0, 2 * MiB, &p), 0);
                ck_assert_msg(now_s() - t0 < 1.0, "the allocation took %.2f s", now_s() - t0);
                ck_assert_int_eq(reap(pid), 0);
                ck_assert(testd_log_wait(&d, "what it reports free counts for 1/2 in whom to ask"));
        }
        ck_assert(testd_client_becomes(&d, 0, "honest", "reserved_bytes", 0));
        ck_assert_int_eq(testd_client_field(&d, 0, "liar", "reserved_bytes"), 40 * MiB);
        ck_assert_int_eq(gpupool_free(needy, p), 0);
        json_decref(testd_ctl(&d, "check"));
        gpupool_disconnect(needy);
        gpupool_disconnect(honest);
        close(control);
        close(liar);
        ck_assert_int_eq(testd_stop(&d), 0);
}

/* In a child: the liar's control channel answers the next request for memory back with nothing. */
static pid_t lie_once(int control) {
        pid_t pid = fork();

        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                answer_with_nothing(control);
                _exit(0);
        }
        return pid;
}

/*
 * A liar does not start trusted again by reconnecting: its distrust is its principal's. The
 * second time the same principal answers with nothing, from a new connection, its reports
 * count for a quarter, not a half afresh.
 */
START_TEST(test_liar_reconnecting_stays_distrusted) {
        /* Each round a new connection of the same principal (the one before's memory stays its process's). */
        static const struct {
                uint64_t want;
                const char *said;
        } rounds[] = {
                { 56 * MiB, "what it reports free counts for 1/2 in whom to ask" },
                { 44 * MiB, "what it reports free counts for 1/4 in whom to ask" },
        };
        gpupool_client *needy;
        struct testd d;
        int liar, control;
        pid_t pid;
        void *p;

        testd_start(&d, "--host-capacity", "64M", "--reclaim-timeout", "500ms", NULL);
        ck_assert_int_eq(gpupool_connect(d.sock, "needy", &needy), 0);
        for (size_t i = 0; i < sizeof(rounds) / sizeof(rounds[0]); i++) {
                liar = raw_keeper(&d, "liar", 12 * MiB, 1, NULL, &control);
                pid = lie_once(control);
                ck_assert_int_eq(gpupool_alloc(needy, 0, rounds[i].want, &p), -ENOMEM);
                ck_assert_int_eq(reap(pid), 0);
                ck_assert(testd_log_wait(&d, rounds[i].said));
                close(control);
                close(liar);
        }
        gpupool_disconnect(needy);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

START_TEST(test_liar_answering_nothing_diverts_no_reclaim) {
        check_liar(false);
}
END_TEST

START_TEST(test_silent_liar_diverts_no_reclaim) {
        check_liar(true);
}
END_TEST

/* How many lines of the daemon's log hold text. */
static int log_lines_with(struct testd *d, const char *text) {
        static char log[1 << 20];
        int n = 0;

        read_text(d->log, log, sizeof(log));
        for (const char *p = log; (p = strstr(p, text)); p++)
                n++;
        return n;
}

/*
 * An unprivileged client in a loop of lease, return and plain flush (which releases the cache
 * it returned to) makes the daemon log a handful of lines, not one per flush: every line a
 * client can cause goes through its rate limit.
 */
START_TEST(test_flush_loop_floods_no_log) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__FlushRequest fr = GPUPOOL__FLUSH_REQUEST__INIT;
        struct testd d;
        int sock;

        testd_start(&d, NULL);
        sock = raw_hello(&d, "flusher");
        for (int i = 0; i < 300; i++) {
                uint64_t id;

                rep = raw_lease(sock, 0, MiB);
                ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
                id = rep->lease_reply->segment_id;
                gpupool__envelope__free_unpacked(rep, NULL);
                gpupool__envelope__free_unpacked(raw_return(sock, &id, 1, NULL), NULL);
                env.id = 9;
                env.body_case = GPUPOOL__ENVELOPE__BODY_FLUSH;
                env.flush = &fr;
                rep = raw_call(sock, &env);
                ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
                gpupool__envelope__free_unpacked(rep, NULL);
        }
        close(sock);
        ck_assert(testd_log_wait(&d, "messages suppressed (rate limit)"));
        ck_assert_int_le(log_lines_with(&d, "flush by client"), 10);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/*
 * set-limit --pid limits the process, not each of its connections: with 10 MiB set, the
 * process's eight connections together get five 2 MiB segments, and the sixth is refused
 * naming the process's limit.
 */
START_TEST(test_pid_limit_sums_connections) {
        char cmd[64];
        int socks[8], leased = 0;
        struct testd d;

        testd_start(&d, NULL);
        socks[0] = raw_hello(&d, "many");
        snprintf(cmd, sizeof(cmd), "set-limit --pid %d max=10M", (int) getpid());
        json_decref(testd_ctl(&d, cmd));
        for (int i = 0; i < 8; i++) {
                Gpupool__Envelope *rep;

                if (i)
                        socks[i] = raw_hello(&d, "many");
                rep = raw_lease(socks[i], 0, MiB);
                if (rep->status == GPUPOOL__STATUS__STATUS_OK)
                        leased++;
                else
                        ck_assert_msg(rep->status == GPUPOOL__STATUS__STATUS_QUOTA && strstr(rep->error, "would take process") &&
                                      strstr(rep->error, "over its limit of 10.0 MiB (set-limit --pid)"), "%s", rep->error);
                gpupool__envelope__free_unpacked(rep, NULL);
        }
        ck_assert_int_eq(leased, 5);
        for (int i = 0; i < 8; i++)
                close(socks[i]);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/*
 * set-limit --pid sums what every connection of the process charges too (memory the driver
 * made for it outside the pool), not its leases alone: 200 MiB charged on one connection and
 * 100 MiB asked on another pass a 256 MiB process limit no more (round six: 456 MiB held).
 */
START_TEST(test_pid_limit_sums_charges) {
        gpupool_client *a, *b;
        char cmd[64], msg[512];
        struct testd d;
        void *p;

        testd_start(&d, NULL);
        ck_assert_int_eq(gpupool_connect(d.sock, "charger", &a), 0);
        ck_assert_int_eq(gpupool_connect(d.sock, "leaser", &b), 0);
        snprintf(cmd, sizeof(cmd), "set-limit --pid %d max=256M", (int) getpid());
        json_decref(testd_ctl(&d, cmd));
        ck_assert_int_eq(gpupool_charge(a, 0, 200 * MiB), 0);
        ck_assert_int_eq(gpupool_alloc(b, 0, 100 * MiB, &p), -EDQUOT);
        gpupool_last_error(b, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, "over its limit of 256.0 MiB (set-limit --pid)"), "%s", msg);
        ck_assert_int_eq(gpupool_alloc(b, 0, 40 * MiB, &p), 0);
        ck_assert_int_eq(gpupool_free(b, p), 0);
        gpupool_disconnect(a);
        gpupool_disconnect(b);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* A 63-byte name, the longest a client may declare. */
#define LONG_NAME "a-client-name-of-sixty-three-bytes-the-longest-that-hello-takes"

/* Connects, says hello as LONG_NAME, leases 1 MiB and closes: one session left exiting. Returns the lease's status. */
static int leave_one_behind(struct testd *d) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__Hello hello = GPUPOOL__HELLO__INIT;
        int sock = raw_connect(d), status;

        hello.name = LONG_NAME;
        env.id = 1;
        env.body_case = GPUPOOL__ENVELOPE__BODY_HELLO;
        env.hello = &hello;
        rep = raw_call(sock, &env);
        status = rep ? (int) rep->status : -1;
        if (rep)
                gpupool__envelope__free_unpacked(rep, NULL);
        if (status == GPUPOOL__STATUS__STATUS_OK) {
                rep = raw_lease(sock, 0, MiB);
                status = (int) rep->status;
                gpupool__envelope__free_unpacked(rep, NULL);
        }
        close(sock);
        return status;
}

/*
 * One process that connects, leases and closes over and over leaves sessions exiting (their
 * memory is its live process's), but no more than max_clients_per_uid: past them its uid is
 * refused, and the memory it left stays counted.
 */
START_TEST(test_exiting_sessions_count_against_the_uid) {
        int ok = 0, refused = 0;
        struct testd d;

        testd_start(&d, "--max-clients-per-uid", "16", NULL);
        for (int i = 0; i < 40; i++) {
                if (leave_one_behind(&d) == GPUPOOL__STATUS__STATUS_OK)
                        ok++;
                else
                        refused++;
        }
        ck_assert_int_eq(ok, 16);
        ck_assert_int_eq(refused, 24);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes") - testd_device(&d, 0, "cached_bytes"), 16 * 2 * MiB);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/*
 * status answers at any number of clients: 1000 sessions left exiting with 63-byte names are
 * all listed, with their counts, by gpupoolctl status and status --json; and the protocol's
 * pages (after_client_id) hold each client once, in the order of their ids.
 */
START_TEST(test_status_at_a_thousand_exiting_clients) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__StatusRequest sr = GPUPOOL__STATUS_REQUEST__INIT;
        char cmd[512];
        static char out[1 << 20];
        json_t *st;
        uint64_t mid;
        struct testd d;
        int sock;

        testd_start(&d, "--max-clients-per-uid", "1024", "--host-capacity", "4G", NULL);
        for (int i = 0; i < 1000; i++)
                ck_assert_int_eq(leave_one_behind(&d), GPUPOOL__STATUS__STATUS_OK);
        st = testd_ctl(&d, "status");
        ck_assert_ptr_nonnull(st);
        ck_assert_int_eq(json_array_size(json_object_get(st, "clients")), 1000);
        ck_assert_int_eq(json_integer_value(json_object_get(st, "clients_total")), 1000);
        ck_assert_int_eq(json_integer_value(json_object_get(st, "clients_exiting")), 1000);
        json_decref(st);
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s status | grep -c '(exiting)'", build_dir(), d.sock);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        ck_assert_int_eq(atoi(out), 1000);

        /* A page from the middle: the clients after that id, none left out. */
        sock = raw_hello(&d, "pager");
        env.id = 2;
        env.body_case = GPUPOOL__ENVELOPE__BODY_STATUS_REQUEST;
        env.status_request = &sr;
        rep = raw_call(sock, &env);
        ck_assert_int_eq(rep->status_reply->n_clients, 1000);
        ck_assert_int_eq(rep->status_reply->clients_left_out, 0);
        for (size_t i = 1; i < rep->status_reply->n_clients; i++)
                ck_assert_uint_gt(rep->status_reply->clients[i]->client_id, rep->status_reply->clients[i - 1]->client_id);
        mid = rep->status_reply->clients[599]->client_id;
        gpupool__envelope__free_unpacked(rep, NULL);
        sr.has_after_client_id = 1;
        sr.after_client_id = mid;
        rep = raw_call(sock, &env);
        ck_assert_int_eq(rep->status_reply->n_clients, 400);
        ck_assert_uint_gt(rep->status_reply->clients[0]->client_id, mid);
        ck_assert_int_eq(rep->status_reply->clients_total, 1000);
        gpupool__envelope__free_unpacked(rep, NULL);
        close(sock);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/*
 * A refused gpupool_connect() leaves no handle, yet its reason reaches the program:
 * gpupool_last_error(NULL) gives the calling thread's latest failed connect's sentence, the
 * daemon's refusal at hello, or the socket that could not be reached.
 */
START_TEST(test_refused_connect_says_why) {
        gpupool_client *first, *second = NULL;
        char why[1024];
        struct testd d;

        ck_assert_int_eq(gpupool_connect("/nonexistent/gpupool.sock", "lost", &second), -ENOENT);
        ck_assert_uint_gt(gpupool_last_error(NULL, why, sizeof(why)), 0);
        ck_assert_msg(strstr(why, "/nonexistent/gpupool.sock"), "%s", why);

        testd_start(&d, "--max-clients", "1", NULL);
        /* The daemon's start was checked with gpupoolctl, whose connection may not have closed yet. */
        for (double t0 = now_s(); gpupool_connect(d.sock, "first", &first) < 0; nap_ms(10))
                ck_assert_msg(now_s() - t0 < 5, "%s", (gpupool_last_error(NULL, why, sizeof(why)), why));
        ck_assert_int_lt(gpupool_connect(d.sock, "second", &second), 0);
        ck_assert_ptr_null(second);
        gpupool_last_error(NULL, why, sizeof(why));
        ck_assert_msg(strstr(why, "--max-clients") || strstr(why, "administrative requests only"), "%s", why);
        /* A connect that succeeds clears it. */
        gpupool_disconnect(first);
        ck_assert_int_eq(gpupool_connect(d.sock, "third", &first), 0);
        ck_assert_uint_eq(gpupool_last_error(NULL, why, sizeof(why)), 0);
        gpupool_disconnect(first);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

Suite *suite_peers(void) {
        Suite *s = suite_create("peers");
        TCase *tc = tcase_create("peers");

        tcase_add_test(tc, test_deaf_client_keeps_its_live_memory);
        tcase_add_test(tc, test_adopting_a_frozen_fuse_file_stalls_nothing);
        tcase_add_test(tc, test_a_close_stuck_on_fuse_stops_no_other);
        tcase_add_test(tc, test_own_closes_never_wait_behind_peers);
        tcase_add_test(tc, test_liar_answering_nothing_diverts_no_reclaim);
        tcase_add_test(tc, test_silent_liar_diverts_no_reclaim);
        tcase_add_test(tc, test_liar_reconnecting_stays_distrusted);
        tcase_add_test(tc, test_flush_loop_floods_no_log);
        tcase_add_test(tc, test_pid_limit_sums_connections);
        tcase_add_test(tc, test_pid_limit_sums_charges);
        tcase_add_test(tc, test_exiting_sessions_count_against_the_uid);
        tcase_add_test(tc, test_status_at_a_thousand_exiting_clients);
        tcase_add_test(tc, test_refused_connect_says_why);
        tcase_set_timeout(tc, 120);
        suite_add_tcase(s, tc);
        return s;
}
