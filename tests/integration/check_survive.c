/*
 * check_survive.c: processes that outlive their daemon, end to end on the host backend in
 * both segment modes: a daemon that starts or adopts slowly stalls no allocation within what
 * a process holds, and after a kill -9 of the daemon under four processes each keeps its
 * data, goes on allocating from what it holds, is refused at once what needs a lease, and is
 * adopted by the new daemon. The adoption's protocol and refusals are in check_adopt.c.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "gpupool.h"
#include "suites.h"
#include "testlib.h"
#include "wire.h"

#define MiB (1ULL << 20)

/*
 * Plays a daemon that came back, on holder: answers the hello of the process's control thread
 * (one host device of total bytes), takes its adoption and leaves it unanswered. Returns the
 * connection, to close.
 */
static int adoption_taker(int holder, uint64_t total) {
        Gpupool__Envelope *req, rep = GPUPOOL__ENVELOPE__INIT;
        Gpupool__HelloReply hr = GPUPOOL__HELLO_REPLY__INIT;
        Gpupool__DeviceInfo dev = GPUPOOL__DEVICE_INFO__INIT, *devs[1] = { &dev };
        struct timeval wait = { .tv_sec = 5 };
        uint8_t buf[GP_MAX_REPLY_BYTES];
        int fds[GP_WIRE_MAX_FDS], sock, n;
        size_t nfds;

        sock = accept4(holder, NULL, NULL, SOCK_CLOEXEC);
        ck_assert_int_ge(sock, 0);
        ck_assert_int_eq(setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait)), 0);
        n = gp_wire_recv_packet_fds(sock, buf, sizeof(buf), fds, &nfds);
        ck_assert_int_gt(n, 0);
        ck_assert_int_eq(gp_wire_unpack(buf, (size_t) n, &req), 0);
        ck_assert_int_eq(req->body_case, GPUPOOL__ENVELOPE__BODY_HELLO);
        dev.backend = "host";
        dev.total_bytes = total;
        hr.client_id = 99;
        hr.daemon_version = "taker";
        hr.n_devices = 1;
        hr.devices = devs;
        rep.version = GP_PROTOCOL_VERSION;
        rep.id = req->id;
        rep.has_status = true;
        rep.status = GPUPOOL__STATUS__STATUS_OK;
        rep.body_case = GPUPOOL__ENVELOPE__BODY_HELLO_REPLY;
        rep.hello_reply = &hr;
        gpupool__envelope__free_unpacked(req, NULL);
        n = gp_wire_pack(&rep, buf, sizeof(buf));
        ck_assert_int_gt(n, 0);
        ck_assert_int_eq(gp_wire_send_packet_fds(sock, buf, (size_t) n, NULL, 0), 0);
        n = gp_wire_recv_packet_fds(sock, buf, sizeof(buf), fds, &nfds);
        ck_assert_int_gt(n, 0);
        for (size_t i = 0; i < nfds; i++)
                close(fds[i]);
        ck_assert_int_eq(gp_wire_unpack(buf, (size_t) n, &req), 0);
        ck_assert_int_eq(req->body_case, GPUPOOL__ENVELOPE__BODY_ADOPT);
        ck_assert_uint_eq(nfds, req->adopt->n_sizes);
        gpupool__envelope__free_unpacked(req, NULL);
        return sock;
}

/*
 * A process holding 8 MiB (segments of mode), its daemon killed, and in the daemon's place a
 * socket that queues the control thread's hello (adopting false), or a fake daemon that
 * answers the hello and takes the adoption and leaves it unanswered (true): meanwhile an
 * allocation within what the process holds takes no time, and its counts stay right. Back,
 * the real daemon adopts the 8 MiB.
 */
static void held_memory_serves_while(const char *name, const char *mode, bool adopting) {
        struct gpupool_stats before, during;
        gpupool_client *c;
        struct testd d;
        double t0, took;
        int holder, taker = -1;
        long long total;
        void *p;

        setenv("GPUPOOL_TIMEOUT", "3s", 1);     /* what a stalled allocation would wait, at most */
        testd_start(&d, NULL);
        total = testd_device(&d, 0, "total_bytes");
        c = connect_segments(d.sock, name, mode);
        ck_assert_int_eq(gpupool_alloc(c, 0, 8 * MiB, &p), 0);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        before = client_stats(c);
        testd_crash(&d);
        unlink(d.sock);
        holder = listen_seqpacket(d.sock);
        if (adopting) {
                taker = adoption_taker(holder, (uint64_t) total);
        } else {
                /* The control thread's hello waits in the queue. */
                struct pollfd pending = { .fd = holder, .events = POLLIN };

                ck_assert_int_eq(poll(&pending, 1, 5000), 1);
        }
        t0 = now_s();
        ck_assert_int_eq(gpupool_alloc(c, 0, 6 * MiB, &p), 0);
        page_fill(p, 6 * MiB, 9);
        ck_assert(page_intact(p, 6 * MiB, 9));
        ck_assert_int_eq(gpupool_free(c, p), 0);
        took = now_s() - t0;
        ck_assert_msg(took < 0.5, "an allocation within what the process holds took %.2f s while a daemon %s", took,
                      adopting ? "adopted it" : "started");
        during = client_stats(c);
        ck_assert_uint_eq(during.mapped_segments, before.mapped_segments);
        ck_assert_uint_eq(during.mapped_bytes, before.mapped_bytes);
        /* An adoption under way fails with the connection. */
        if (taker >= 0)
                close(taker);
        close(holder);
        unlink(d.sock);
        testd_relaunch(&d);
        for (t0 = now_s(); testd_client_field(&d, 0, name, "reserved_bytes") < (long long) (8 * MiB) && now_s() - t0 < 20;)
                nap_ms(50);
        ck_assert_int_ge(testd_client_field(&d, 0, name, "reserved_bytes"), 8 * MiB);
        ck_assert_int_eq(gpupool_alloc(c, 0, 6 * MiB, &p), 0);
        page_fill(p, 6 * MiB, 10);
        ck_assert(page_intact(p, 6 * MiB, 10));
        ck_assert_int_eq(gpupool_free(c, p), 0);
        json_decref(testd_ctl(&d, "check"));
        gpupool_disconnect(c);
        unsetenv("GPUPOOL_TIMEOUT");
        ck_assert_int_eq(testd_stop(&d), 0);
}

/*
 * A daemon that systemd's socket holds while it starts (connections queue, nobody answers)
 * stops no allocation: the control thread's hello waits for it without the handle's lock, and
 * the process goes on allocating within what it holds. Once a daemon answers, it adopts.
 */
START_TEST(test_starting_daemon_stalls_no_allocation) {
        held_memory_serves_while("patient", "grow", false);
}
END_TEST

/* The adoption holds the connection, not the allocator. */
START_TEST(test_adoption_stalls_no_allocation) {
        held_memory_serves_while("adopted", "grow", true);
        held_memory_serves_while("adopted-whole", "whole", true);
}
END_TEST

/*
 * Holds blocks of many sizes with data of its own (in grow mode when its index is even, whole
 * segments when odd), says ready, and once the daemon was killed: finds its data intact,
 * frees and allocates again from what it holds, is refused at once what needs a lease, and
 * reconnects to the new daemon. Returns 0, or the step that failed.
 */
static int survivor_main(struct testd *d, void *arg) {
        enum { N = 7 };
        static const size_t sizes[N] = { 4096, 100000, 1 * MiB, 3 * MiB, 3 * MiB, 8 * MiB, 40 * MiB };
        struct survivor *w = arg;
        struct gpupool_stats held;
        gpupool_client *c;
        char err[512], b;
        void *p[N], *big;
        int r;

        setenv("GPUPOOL_SEGMENTS", w->index % 2 ? "whole" : "grow", 1);
        if (gpupool_connect(d->sock, "survivor", &c) < 0)
                return 1;
        for (int i = 0; i < N; i++) {
                if (gpupool_alloc(c, 0, sizes[i], &p[i]) < 0)
                        return 2;
                page_fill(p[i], sizes[i], (unsigned) (w->index * 16 + i));
        }
        if (write(w->up[1], "r", 1) != 1 || read(w->go[0], &b, 1) != 1)
                return 3;
        for (int i = 0; i < N; i++)
                if (!page_intact(p[i], sizes[i], (unsigned) (w->index * 16 + i)))
                        return 4;
        /* Freed and allocated again from what the process holds: no daemon needed. */
        for (int round = 0; round < 3; round++) {
                if (gpupool_free(c, p[3]) != 0 || gpupool_alloc(c, 0, sizes[3], &p[3]) != 0)
                        return 5;
                page_fill(p[3], sizes[3], (unsigned) (w->index * 16 + 3 + round));
                if (!page_intact(p[4], sizes[4], (unsigned) (w->index * 16 + 4)))
                        return 6;
        }
        page_fill(p[3], sizes[3], (unsigned) (w->index * 16 + 3));
        /* More than it holds needs the daemon: refused at once, saying so. */
        r = gpupool_alloc(c, 0, 256 * MiB, &big);
        gpupool_last_error(c, err, sizeof(err));
        if (r != -ECONNRESET || !strstr(err, "goes on allocating from the memory it holds")) {
                fprintf(stderr, "survivor %d: %d: %s\n", w->index, r, err);
                return 7;
        }
        for (int i = 0; i < N; i++)
                if (!page_intact(p[i], sizes[i], (unsigned) (w->index * 16 + i)))
                        return 8;
        if (gpupool_stats(c, &held) != 0 || !survivor_restarted(w))
                return 9;
        /* The new daemon: the process reconnects on its own and it adopts what the process holds. */
        if (!(big = survivor_adopted(d, w, c, &held, 32 * MiB)))
                return 10;
        page_fill(big, 32 * MiB, 3);
        for (int i = 0; i < N; i++)
                if (!page_intact(p[i], sizes[i], (unsigned) (w->index * 16 + i)) || gpupool_free(c, p[i]) != 0)
                        return 12;
        if (!page_intact(big, 32 * MiB, 3) || gpupool_free(c, big) != 0 || gpupool_trim(c) != 0)
                return 13;
        gpupool_disconnect(c);
        return 0;
}

/* kill -9 of the daemon under four processes, two in each mode: each keeps its data and goes on. */
START_TEST(test_host_survives_daemon_kill) {
        struct testd d;

        testd_start(&d, NULL);
        setenv("GPUPOOL_IDLE_RETURN", "0", 1);
        run_survivors(&d, 4, survivor_main);
        json_decref(testd_ctl(&d, "check"));
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes") - testd_device(&d, 0, "cached_bytes"), 0);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

Suite *suite_survive(void) {
        Suite *s = suite_create("survive");
        TCase *tc = tcase_create("host");

        tcase_add_test(tc, test_starting_daemon_stalls_no_allocation);
        tcase_add_test(tc, test_adoption_stalls_no_allocation);
        tcase_add_test(tc, test_host_survives_daemon_kill);
        tcase_set_timeout(tc, 60);
        suite_add_tcase(s, tc);
        return s;
}
