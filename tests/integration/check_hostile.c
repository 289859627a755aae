/*
 * check_hostile.c: what a malicious or broken client can send, and that none of it harms the
 * daemon or another client: random bytes, oversized packets, descriptors, messages out of
 * order, replies sent as requests, another client's blocks, and a client that never reads.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gpupool.h"
#include "suites.h"
#include "testlib.h"

#define MiB (1ULL << 20)

/* Sends one packet and reports whether the daemon closed the connection (reading to EOF). */
static bool closed_after(int sock) {
        uint8_t buf[GP_MAX_REPLY_BYTES];
        int n;

        while ((n = gp_wire_recv_packet(sock, buf, sizeof(buf), NULL)) > 0)
                ;
        return n == 0 || n == -ECONNRESET;
}

/* Expects one error reply with status, then the connection closed. */
static void expect_error_then_close(int sock, Gpupool__Status status) {
        Gpupool__Envelope *rep = raw_recv(sock);

        ck_assert_ptr_nonnull(rep);
        ck_assert_int_eq(rep->status, status);
        ck_assert_ptr_nonnull(rep->error);
        gpupool__envelope__free_unpacked(rep, NULL);
        ck_assert(closed_after(sock));
        close(sock);
}

/* A hello with this name gets STATUS_INVALID, then the connection closed. */
static void expect_name_refused(struct testd *d, const char *name) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
        Gpupool__Hello hello = GPUPOOL__HELLO__INIT;
        int sock = raw_connect(d);

        hello.name = (char *) name;
        env.id = 1;
        env.body_case = GPUPOOL__ENVELOPE__BODY_HELLO;
        env.hello = &hello;
        raw_send(sock, &env);
        expect_error_then_close(sock, GPUPOOL__STATUS__STATUS_INVALID);
}

static void send_raw_bytes(int sock, const uint8_t *buf, size_t len) {
        (void) send(sock, buf, len, MSG_NOSIGNAL);
}

START_TEST(test_two_hundred_hostile_connections) {
        static uint8_t junk[9000];
        unsigned seed = 4242;
        gpupool_client *good;
        struct testd d;
        void *p;
        json_t *st;

        testd_start(&d, NULL);
        ck_assert_int_eq(gpupool_connect(d.sock, "bystander", &good), 0);
        ck_assert_int_eq(gpupool_alloc(good, 0, MiB, &p), 0);
        memset(p, 0x5a, MiB);
        for (int i = 0; i < 200; i++) {
                int sock = raw_connect(&d);
                size_t len;

                for (size_t j = 0; j < sizeof(junk); j++)
                        junk[j] = (uint8_t) rand_r(&seed);
                switch (i % 5) {
                case 0: /* random bytes as a first message */
                        len = 1 + rand_r(&seed) % 2000;
                        send_raw_bytes(sock, junk, len);
                        break;
                case 1: /* a packet over the request limit */
                        send_raw_bytes(sock, junk, GP_MAX_REQUEST_BYTES + 1 + rand_r(&seed) % 4000);
                        break;
                case 2: /* a valid hello, then random bytes */
                        close(sock);
                        sock = raw_hello(&d, "hostile");
                        send_raw_bytes(sock, junk, 1 + rand_r(&seed) % 3000);
                        break;
                case 3: /* an empty packet */
                        send_raw_bytes(sock, junk, 0);
                        break;
                case 4: /* a descriptor the daemon never asked for */
                        ck_assert_int_eq(gp_wire_send_packet(sock, junk, 16, 0), 0);
                        break;
                }
                ck_assert_msg(closed_after(sock), "connection %d was not dropped", i);
                close(sock);
                if (i % 40 == 0) {
                        void *q;

                        ck_assert_int_eq(gpupool_alloc(good, 0, 4096, &q), 0);
                        ck_assert_int_eq(gpupool_free(good, q), 0);
                }
        }
        ck_assert(testd_alive(&d));
        for (size_t j = 0; j < MiB; j++)
                ck_assert_int_eq(((uint8_t *) p)[j], 0x5a);
        st = testd_ctl(&d, "status");
        ck_assert_int_eq(json_array_size(json_object_get(st, "clients")), 1);   /* only the bystander */
        json_decref(st);
        ck_assert_int_eq(gpupool_free(good, p), 0);
        gpupool_disconnect(good);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

START_TEST(test_protocol_violations) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
        Gpupool__StatusRequest sr = GPUPOOL__STATUS_REQUEST__INIT;
        Gpupool__Hello hello = GPUPOOL__HELLO__INIT;
        Gpupool__LeaseReply lr = GPUPOOL__LEASE_REPLY__INIT;
        /* Version 2, id 2, and field 18 (version 1's AllocRequest, reserved now), empty. */
        static const uint8_t old_alloc[] = { 0x08, 0x02, 0x10, 0x02, 0x92, 0x01, 0x00 };
        struct testd d;
        int sock;

        testd_start(&d, NULL);
        /* Another protocol version: told so, then dropped. */
        sock = raw_connect(&d);
        env.version = 7;
        env.id = 1;
        env.body_case = GPUPOOL__ENVELOPE__BODY_HELLO;
        env.hello = &hello;
        raw_send(sock, &env);
        expect_error_then_close(sock, GPUPOOL__STATUS__STATUS_VERSION);
        /* Version 1 (blocks carved by the daemon) included. */
        sock = raw_connect(&d);
        env.version = 1;
        raw_send(sock, &env);
        expect_error_then_close(sock, GPUPOOL__STATUS__STATUS_VERSION);

        /* A request before hello. */
        sock = raw_connect(&d);
        gpupool__envelope__init(&env);
        env.id = 1;
        env.body_case = GPUPOOL__ENVELOPE__BODY_STATUS_REQUEST;
        env.status_request = &sr;
        raw_send(sock, &env);
        expect_error_then_close(sock, GPUPOOL__STATUS__STATUS_PROTOCOL);

        /* Hello twice. */
        sock = raw_hello(&d, "twice");
        gpupool__envelope__init(&env);
        env.id = 2;
        env.body_case = GPUPOOL__ENVELOPE__BODY_HELLO;
        env.hello = &hello;
        raw_send(sock, &env);
        expect_error_then_close(sock, GPUPOOL__STATUS__STATUS_PROTOCOL);

        /* A name with control characters; one that is not UTF-8 (jansson would drop it from --json, hiding the client). */
        expect_name_refused(&d, "evil\033[2J");
        expect_name_refused(&d, "hidden-\xff\xfe");


        /* A reply sent as a request. */
        sock = raw_hello(&d, "replier");
        gpupool__envelope__init(&env);
        env.id = 2;
        env.body_case = GPUPOOL__ENVELOPE__BODY_LEASE_REPLY;
        env.lease_reply = &lr;
        raw_send(sock, &env);
        expect_error_then_close(sock, GPUPOOL__STATUS__STATUS_PROTOCOL);

        /* A message of version 1 that version 2 dropped: a request with no body it knows. */
        sock = raw_hello(&d, "old-alloc");
        ck_assert_int_eq(gp_wire_send_packet(sock, old_alloc, sizeof(old_alloc), -1), 0);
        expect_error_then_close(sock, GPUPOOL__STATUS__STATUS_PROTOCOL);

        /* An envelope with no body. */
        sock = raw_hello(&d, "empty");
        gpupool__envelope__init(&env);
        env.id = 2;
        raw_send(sock, &env);
        expect_error_then_close(sock, GPUPOOL__STATUS__STATUS_PROTOCOL);

        ck_assert(testd_alive(&d));
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

START_TEST(test_other_clients_segments) {
        Gpupool__Envelope *a, *rep;
        uint64_t segment;
        struct testd d;
        int victim, thief;
        json_t *st;

        testd_start(&d, NULL);
        victim = raw_hello(&d, "victim");
        thief = raw_hello(&d, "thief");
        a = raw_lease(victim, 0, 8192);
        ck_assert_int_eq(a->status, GPUPOOL__STATUS__STATUS_OK);
        segment = a->lease_reply->segment_id;

        /* The thief returns the victim's segment: counted as not found, nothing changes. */
        rep = raw_return(thief, &segment, 1, NULL);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        ck_assert_uint_eq(rep->return_reply->returned, 0);
        ck_assert_uint_eq(rep->return_reply->not_found, 1);
        gpupool__envelope__free_unpacked(rep, NULL);
        st = testd_ctl(&d, "status");
        ck_assert_int_eq(json_integer_value(json_object_get(status_client_by_name(st, "victim"), "reserved_bytes")),
                         2 * MiB);
        ck_assert_int_eq(status_device(st, "cached_bytes"), 0);
        json_decref(st);
        /* The victim returns its own: it goes to the cache. */
        rep = raw_return(victim, &segment, 1, NULL);
        ck_assert_uint_eq(rep->return_reply->returned, 1);
        gpupool__envelope__free_unpacked(rep, NULL);
        st = testd_ctl(&d, "status");
        ck_assert_int_eq(status_device(st, "cached_bytes"), 2 * MiB);
        json_decref(st);
        gpupool__envelope__free_unpacked(a, NULL);
        close(victim);
        close(thief);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

START_TEST(test_client_that_never_reads) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
        Gpupool__StatusRequest sr = GPUPOOL__STATUS_REQUEST__INIT;
        uint8_t buf[GP_MAX_REQUEST_BYTES];
        gpupool_client *good;
        struct testd d;
        int sock, n, sent = 0;
        void *p;

        testd_start(&d, "--send-timeout", "1s", NULL);
        sock = raw_hello(&d, "deaf");
        fcntl(sock, F_SETFL, O_NONBLOCK);
        env.version = GP_PROTOCOL_VERSION;
        env.body_case = GPUPOOL__ENVELOPE__BODY_STATUS_REQUEST;
        env.status_request = &sr;
        /*
         * Queue requests until the daemon stops taking them for good (half a second without
         * room): its replies fill our socket, and it must stop reading us, not block.
         */
        for (int i = 0, idle = 0; i < 100000 && idle < 50; i++) {
                env.id = (uint64_t) i + 2;
                n = gp_wire_pack(&env, buf, sizeof(buf));
                if (gp_wire_send_packet(sock, buf, (size_t) n, -1) < 0) {
                        usleep(10000);
                        idle++;
                        continue;
                }
                idle = 0;
                sent++;
        }
        ck_assert_int_gt(sent, 10);
        ck_assert_int_eq(gpupool_connect(d.sock, "patient", &good), 0);
        ck_assert_int_eq(gpupool_alloc(good, 0, 4096, &p), 0);
        ck_assert_int_eq(gpupool_free(good, p), 0);
        /* Past --send-timeout with a reply unread, the deaf client is dropped; the patient one stays. */
        {
                double t0 = now_s();
                bool gone = false;

                while (!gone && now_s() - t0 < 10) {
                        json_t *st = testd_ctl(&d, "status");

                        gone = !status_client_by_name(st, "deaf");
                        json_decref(st);
                }
                ck_assert_msg(gone, "a client that never reads was not disconnected");
                ck_assert_msg(now_s() - t0 < 5, "it took %.1f s", now_s() - t0);
        }
        ck_assert_int_eq(gpupool_alloc(good, 0, 4096, &p), 0);
        gpupool_disconnect(good);
        close(sock);
        ck_assert(testd_alive(&d));
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* Sends a hello-less packet carrying two descriptors. */
static bool send_two_fds(int sock) {
        char ctl[CMSG_SPACE(2 * sizeof(int))] = { 0 };
        char byte = 'x';
        struct iovec iov = { &byte, 1 };
        struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof(ctl) };
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        int fds[2] = { 0, 1 };

        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(fds));
        memcpy(CMSG_DATA(c), fds, sizeof(fds));
        return sendmsg(sock, &msg, MSG_NOSIGNAL) == 1;
}

START_TEST(test_too_many_descriptors) {
        struct testd d;
        char buf[64];
        int sock;

        testd_start(&d, NULL);
        sock = raw_hello(&d, "fdflood");
        ck_assert(send_two_fds(sock));
        /* Dropped: the connection reads to EOF, and the daemon serves on. */
        ck_assert_int_eq(recv(sock, buf, sizeof(buf), 0), 0);
        close(sock);
        ck_assert(testd_alive(&d));
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

Suite *suite_hostile(void) {
        Suite *s = suite_create("hostile");
        TCase *tc = tcase_create("host");

        tcase_add_test(tc, test_two_hundred_hostile_connections);
        tcase_add_test(tc, test_protocol_violations);
        tcase_add_test(tc, test_other_clients_segments);
        tcase_add_test(tc, test_client_that_never_reads);
        tcase_add_test(tc, test_too_many_descriptors);
        tcase_set_timeout(tc, 120);
        suite_add_tcase(s, tc);
        return s;
}
