/*
 * check_adopt.c: a daemon adopting the memory that processes kept from the daemon before it
 * (AdoptRequest), on the host backend, over the raw protocol: what a process leased before a
 * kill -9 is leased to it again with its data, counted once; and the refusals: a descriptor
 * that is not a segment (a pipe, an unsealed or write-sealed memfd), memory adopted twice or
 * held by the daemon already, adoption beyond a limit or the capacity, and descriptors riding
 * with any other request.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gpupool.h"
#include "suites.h"
#include "testlib.h"

#define MiB (1ULL << 20)

/* A memfd of size bytes sealed as a segment is: what a process keeps, as far as a daemon can tell. */
static int segment_like(uint64_t size, unsigned seals) {
        int fd = memfd_create("kept", MFD_CLOEXEC | MFD_ALLOW_SEALING);

        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(ftruncate(fd, (off_t) size), 0);
        if (seals)
                ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, seals), 0);
        return fd;
}

#define SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

/* Adopts n segments that must all be adopted; their new ids into ids (if given). */
static void adopt_all(int sock, uint64_t *sizes, const int *fds, size_t n, uint64_t *ids) {
        Gpupool__Envelope *rep = raw_adopt(sock, 0, sizes, n, fds, n);

        ck_assert_msg(rep->status == GPUPOOL__STATUS__STATUS_OK, "%s", rep->error ? rep->error : "");
        ck_assert_uint_eq(rep->adopt_reply->n_segment_ids, n);
        ck_assert(!rep->adopt_reply->has_refused_status);
        if (ids)
                memcpy(ids, rep->adopt_reply->segment_ids, n * sizeof(*ids));
        gpupool__envelope__free_unpacked(rep, NULL);
}

/* An adoption of n segments (descriptors fds, nfds of them) refused whole with status, saying text. */
static void adopt_refused(int sock, uint64_t *sizes, size_t n, const int *fds, size_t nfds, Gpupool__Status status,
                          const char *text) {
        Gpupool__Envelope *rep = raw_adopt(sock, 0, sizes, n, fds, nfds);

        ck_assert_int_eq(rep->status, status);
        ck_assert_msg(rep->error && strstr(rep->error, text), "%s", rep->error ? rep->error : "(no message)");
        gpupool__envelope__free_unpacked(rep, NULL);
}

/* Bytes leased to clients on device 0: reserved less cached. */
static long long leased(struct testd *d) {
        return testd_device(d, 0, "reserved_bytes") - testd_device(d, 0, "cached_bytes");
}

/*
 * A process leases a segment, a larger one and two granules, writes them, and the daemon is
 * killed; on the new daemon it adopts all four: they are its again, counted once, with its data,
 * and go back and come out of the cache as any segment does.
 */
START_TEST(test_adopt_after_restart) {
        uint64_t sizes[4] = { 2 * MiB, 20 * MiB, 2 * MiB, 2 * MiB }, ids[4];
        int fds[GP_WIRE_MAX_FDS], sock, other;
        uint8_t *maps[4];
        Gpupool__Envelope *rep;
        struct testd d;
        size_t nfds;

        testd_start(&d, NULL);
        sock = raw_hello(&d, "before");
        gpupool__envelope__free_unpacked(raw_lease_fd(sock, 0, 1 * MiB, &fds[0]), NULL);
        gpupool__envelope__free_unpacked(raw_lease_fd(sock, 0, 5 * MiB, &fds[1]), NULL);
        rep = raw_lease_granules(sock, 0, 2, 2 * MiB, fds + 2, &nfds);
        ck_assert_uint_eq(nfds, 2);
        gpupool__envelope__free_unpacked(rep, NULL);
        for (int i = 0; i < 4; i++) {
                maps[i] = mmap(NULL, sizes[i], PROT_READ | PROT_WRITE, MAP_SHARED, fds[i], 0);
                ck_assert_ptr_ne(maps[i], MAP_FAILED);
                memset(maps[i], 'a' + i, sizes[i]);
        }
        testd_crash_and_restart(&d);
        close(sock);

        sock = raw_hello(&d, "after");
        adopt_all(sock, sizes, fds, 4, ids);
        ck_assert_int_eq(leased(&d), 26 * MiB);
        ck_assert_int_eq(testd_client_field(&d, getpid(), "after", "reserved_bytes"), 26 * MiB);
        json_decref(testd_ctl(&d, "check"));
        for (int i = 0; i < 4; i++)
                ck_assert(maps[i][0] == 'a' + i && maps[i][sizes[i] - 1] == 'a' + i);

        /* Adopted again, by anyone: the daemon holds it already. */
        adopt_refused(sock, sizes + 1, 1, fds + 1, 1, GPUPOOL__STATUS__STATUS_INVALID, "holds already");
        other = raw_hello(&d, "other");
        adopt_refused(other, sizes, 1, fds, 1, GPUPOOL__STATUS__STATUS_INVALID, "holds already");
        ck_assert_int_eq(leased(&d), 26 * MiB);

        /* An adopted segment goes back to the cache, and a lease of the same uid takes it from there. */
        rep = raw_return(sock, ids, 1, NULL);
        ck_assert_uint_eq(rep->return_reply->returned, 1);
        gpupool__envelope__free_unpacked(rep, NULL);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 2 * MiB);
        rep = raw_lease(other, 0, 1 * MiB);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        ck_assert_uint_eq(rep->lease_reply->segment_id, ids[0]);
        gpupool__envelope__free_unpacked(rep, NULL);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 26 * MiB);
        json_decref(testd_ctl(&d, "check"));

        close(sock);
        close(other);
        for (int i = 0; i < 4; i++) {
                munmap(maps[i], sizes[i]);
                close(fds[i]);
        }
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* Whatever a descriptor is that is not a segment, the adoption is refused whole, saying why, and nothing is counted. */
START_TEST(test_adopt_refusals) {
        uint64_t sizes[2] = { 2 * MiB, 2 * MiB }, odd = 3 * MiB, big = 2 * MiB;
        int good = segment_like(2 * MiB, SEALS), fds[2], pipe_fds[2], leased_fd, sock, other;
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__StatusRequest sr = GPUPOOL__STATUS_REQUEST__INIT;
        char path[64];
        struct testd d;

        testd_start(&d, NULL);
        sock = raw_hello(&d, "adopter");
        other = raw_hello(&d, "other");
        ck_assert_int_eq(pipe(pipe_fds), 0);

        fds[0] = good, fds[1] = pipe_fds[0];
        adopt_refused(sock, sizes, 2, fds, 2, GPUPOOL__STATUS__STATUS_INVALID, "descriptor 1 of the adoption (a segment "
                      "of 2.0 MiB on device 0) is not a memfd: nothing adopted");
        /* By the process's word (cuda-vmm's way): here the descriptors are the memory, and none came. */
        rep = raw_adopt_held(sock, 0, sizes, 2, NULL, 0);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_INVALID);
        ck_assert_msg(strstr(rep->error, "the host backend adopts a segment only with its descriptor, which is its memory"),
                      "%s", rep->error);
        gpupool__envelope__free_unpacked(rep, NULL);
        fds[1] = segment_like(2 * MiB, 0);
        adopt_refused(sock, sizes, 2, fds, 2, GPUPOOL__STATUS__STATUS_INVALID, "not sealed as a segment is");
        close(fds[1]);
        /* Sealed against writing as well: nobody could use it, so it is not taken (the daemon's seals exactly). */
        fds[1] = segment_like(2 * MiB, SEALS | F_SEAL_WRITE);
        adopt_refused(sock, sizes, 2, fds, 2, GPUPOOL__STATUS__STATUS_INVALID, "it is sealed against writing");
        close(fds[1]);
        fds[1] = segment_like(2 * MiB, SEALS | F_SEAL_FUTURE_WRITE);
        adopt_refused(sock, sizes, 2, fds, 2, GPUPOOL__STATUS__STATUS_INVALID, "it is sealed against writing");
        close(fds[1]);
        fds[1] = segment_like(4 * MiB, SEALS);
        adopt_refused(sock, sizes, 2, fds, 2, GPUPOOL__STATUS__STATUS_INVALID, "a memfd of 4194304 bytes, not 2097152");
        close(fds[1]);
        fds[1] = dup(good);
        adopt_refused(sock, sizes, 2, fds, 2, GPUPOOL__STATUS__STATUS_INVALID, "the same memory as descriptor 0");
        close(fds[1]);
        fds[1] = segment_like(2 * MiB, SEALS);
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fds[1]);
        fds[0] = open(path, O_RDONLY | O_CLOEXEC);
        adopt_refused(sock, sizes, 1, fds, 1, GPUPOOL__STATUS__STATUS_INVALID, "open read-only");
        close(fds[0]);
        close(fds[1]);

        /* A segment the daemon leases now (to another connection of the same uid) is not adoptable. */
        gpupool__envelope__free_unpacked(raw_lease_fd(other, 0, 1 * MiB, &leased_fd), NULL);
        fds[0] = good, fds[1] = leased_fd;
        adopt_refused(sock, sizes, 2, fds, 2, GPUPOOL__STATUS__STATUS_INVALID, "descriptor 1 of the adoption (a segment "
                      "of 2.0 MiB on device 0) is memory this daemon holds already");

        /* Sizes and descriptors that do not match, and a size no segment has. */
        adopt_refused(sock, sizes, 2, &good, 1, GPUPOOL__STATUS__STATUS_INVALID, "each with its descriptor, not 2 with 1");
        adopt_refused(sock, sizes, 0, NULL, 0, GPUPOOL__STATUS__STATUS_INVALID, "not 0 with 0");
        adopt_refused(sock, &odd, 1, &good, 1, GPUPOOL__STATUS__STATUS_INVALID, "a multiple of 2097152 bytes");
        ck_assert_int_eq(leased(&d), 2 * MiB);

        /* None of that lost the connection, and memory of the process's own, sealed as a segment, is adopted as its own. */
        adopt_all(sock, &big, &good, 1, NULL);
        ck_assert_int_eq(testd_client_field(&d, getpid(), "adopter", "reserved_bytes"), 2 * MiB);
        json_decref(testd_ctl(&d, "check"));

        /* Descriptors with any other request make a malformed packet: the daemon hangs up. */
        env.id = 5;
        env.body_case = GPUPOOL__ENVELOPE__BODY_STATUS_REQUEST;
        env.status_request = &sr;
        raw_send_fds(other, &env, &pipe_fds[1], 1);
        ck_assert_ptr_null(raw_recv(other));
        ck_assert(testd_log_wait(&d, "descriptors with a request other than an adoption"));
        rep = raw_call(sock, &env);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        gpupool__envelope__free_unpacked(rep, NULL);

        close(sock);
        close(other);
        close(good);
        close(leased_fd);
        close(pipe_fds[0]);
        close(pipe_fds[1]);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/*
 * Adoption stops where the client's limit, then the device's capacity, would be passed: what
 * came first is adopted, the reply says why the rest was not, and nothing is counted twice.
 */
START_TEST(test_adopt_within_limits) {
        uint64_t sizes[16], ids[16];
        int fds[16], sock, other, extra;
        Gpupool__Envelope *rep;
        struct testd d;

        testd_start(&d, "--client-limit", "20M", "--host-capacity", "30M", NULL);
        for (int i = 0; i < 16; i++) {
                sizes[i] = 2 * MiB;
                fds[i] = segment_like(2 * MiB, SEALS);
        }
        sock = raw_hello(&d, "limited");
        rep = raw_adopt(sock, 0, sizes, 16, fds, 16);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        ck_assert_uint_eq(rep->adopt_reply->n_segment_ids, 10);
        ck_assert(rep->adopt_reply->has_refused_status);
        ck_assert_int_eq(rep->adopt_reply->refused_status, GPUPOOL__STATUS__STATUS_QUOTA);
        ck_assert_msg(strstr(rep->adopt_reply->refused_error, "adopting a segment of 2.0 MiB on device 0 would take "
                             "client 'limited'") && strstr(rep->adopt_reply->refused_error, "over its limit of 20.0 MiB"),
                      "%s", rep->adopt_reply->refused_error);
        memcpy(ids, rep->adopt_reply->segment_ids, 10 * sizeof(*ids));
        gpupool__envelope__free_unpacked(rep, NULL);
        ck_assert_int_eq(leased(&d), 20 * MiB);

        /* The rest, by another client: up to the capacity (one cached segment released to make room). */
        rep = raw_return(sock, ids, 1, NULL);
        gpupool__envelope__free_unpacked(rep, NULL);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 2 * MiB);
        other = raw_hello(&d, "second");
        rep = raw_adopt(other, 0, sizes + 10, 6, fds + 10, 6);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        ck_assert_uint_eq(rep->adopt_reply->n_segment_ids, 6);
        gpupool__envelope__free_unpacked(rep, NULL);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 0);
        ck_assert_int_eq(leased(&d), 30 * MiB);
        extra = segment_like(2 * MiB, SEALS);
        rep = raw_adopt(other, 0, sizes, 1, &extra, 1);
        ck_assert_uint_eq(rep->adopt_reply->n_segment_ids, 0);
        ck_assert_int_eq(rep->adopt_reply->refused_status, GPUPOOL__STATUS__STATUS_NO_MEMORY);
        ck_assert_msg(strstr(rep->adopt_reply->refused_error, "device 0 is full: adopting a segment of 2.0 MiB would take "
                             "it to 32.0 MiB reserved, over its capacity of 30.0 MiB"),
                      "%s", rep->adopt_reply->refused_error);
        gpupool__envelope__free_unpacked(rep, NULL);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 30 * MiB);
        json_decref(testd_ctl(&d, "check"));

        close(sock);
        close(other);
        for (int i = 0; i < 16; i++)
                close(fds[i]);
        close(extra);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/*
 * A process whose daemon comes back with a lower limit: the library reconnects on its own and
 * the new daemon adopts what fits; the rest stays the process's, its data intact, and once
 * empty is let go without a word to the daemon (nothing it does not lease is returned).
 */
START_TEST(test_adopt_past_a_new_limit) {
        void *p[6];
        gpupool_client *c;
        struct testd d;
        void *more;
        int r;

        testd_start(&d, "--config", conf_new(""), NULL);
        c = connect_segments(d.sock, "orphans", "whole");
        for (int i = 0; i < 6; i++) {
                ck_assert_int_eq(gpupool_alloc(c, 0, 12 * MiB, &p[i]), 0);  /* a segment of its own each */
                memset(p[i], 'a' + i, 12 * MiB);
        }
        testd_crash(&d);
        conf_write("[limits]\nclient_max = 40M\n");
        testd_relaunch(&d);
        /* Three segments adopted (36 MiB of the 40), three the process's own: nothing more fits. */
        ck_assert(testd_client_becomes(&d, getpid(), "orphans", "reserved_bytes", 36 * MiB));
        ck_assert(testd_log_wait(&d, "adopted 3 of 6 segments (36.0 MiB) on device 0; the rest refused"));
        for (double t0 = now_s(); (r = gpupool_alloc(c, 0, 8 * MiB, &more)) == -ECONNRESET && now_s() - t0 < 10;)
                usleep(20 * 1000);
        ck_assert_int_eq(r, -EDQUOT);
        for (int i = 0; i < 6; i++) {
                ck_assert(((char *) p[i])[0] == 'a' + i && ((char *) p[i])[12 * MiB - 1] == 'a' + i);
                ck_assert_int_eq(gpupool_free(c, p[i]), 0);
        }
        ck_assert_int_eq(gpupool_trim(c), 0);
        ck_assert(testd_client_becomes(&d, getpid(), "orphans", "reserved_bytes", 0));
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes") - testd_device(&d, 0, "cached_bytes"), 0);
        /* The limit is the process's whole again. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 38 * MiB, &more), 0);
        ck_assert_int_eq(gpupool_free(c, more), 0);
        gpupool_disconnect(c);
        json_decref(testd_ctl(&d, "check"));
        ck_assert_int_eq(testd_stop(&d), 0);
        conf_remove();
}
END_TEST

/*
 * Memory a process charged (outside the pool, gpupool_charge()) is charged to the daemon that
 * comes back; where that one's limit has no room for it, the process keeps it uncounted, and
 * its release takes back nothing the daemon does not count.
 */
START_TEST(test_charges_after_restart) {
        gpupool_client *c;
        struct testd d;
        void *p, *q;
        int r;

        testd_start(&d, "--config", conf_new(""), NULL);
        c = connect_segments(d.sock, "charger", "whole");
        ck_assert_int_eq(gpupool_alloc(c, 0, 1 * MiB, &p), 0);       /* a 2 MiB segment */
        ck_assert_int_eq(gpupool_charge(c, 0, 6 * MiB), 0);
        testd_crash(&d);
        conf_write("[limits]\nclient_max = 40M\n");
        testd_relaunch(&d);
        ck_assert(testd_client_becomes(&d, getpid(), "charger", "charged_bytes", 6 * MiB));
        ck_assert(testd_client_becomes(&d, getpid(), "charger", "reserved_bytes", 2 * MiB));
        ck_assert_int_eq(gpupool_uncharge(c, 0, 2 * MiB), 0);
        ck_assert_int_eq(testd_client_field(&d, getpid(), "charger", "charged_bytes"), 4 * MiB);
        json_decref(testd_ctl(&d, "check"));

        /* A daemon whose limit has room for the segment but not the charge too. */
        testd_crash(&d);
        conf_write("[limits]\nclient_max = 4M\n");
        testd_relaunch(&d);
        ck_assert(testd_client_becomes(&d, getpid(), "charger", "reserved_bytes", 2 * MiB));
        for (double t0 = now_s(); (r = gpupool_alloc(c, 0, 2 * MiB, &q)) == -ECONNRESET && now_s() - t0 < 10;)
                usleep(20 * 1000);
        ck_assert_int_eq(r, 0);         /* its own segment and one more: 4 MiB, the charge left uncounted */
        ck_assert_int_eq(testd_client_field(&d, getpid(), "charger", "reserved_bytes"), 4 * MiB);
        ck_assert_int_eq(testd_client_field(&d, getpid(), "charger", "charged_bytes"), 0);
        ck_assert_int_eq(gpupool_uncharge(c, 0, 4 * MiB), 0);
        ck_assert_int_eq(gpupool_uncharge(c, 0, 1), -EINVAL);   /* nothing charged any more */
        ck_assert_int_eq(gpupool_charge(c, 0, 1), -EDQUOT);
        ck_assert_int_eq(gpupool_free(c, q), 0);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        gpupool_disconnect(c);
        json_decref(testd_ctl(&d, "check"));
        ck_assert_int_eq(testd_stop(&d), 0);
        conf_remove();
}
END_TEST

Suite *suite_adopt(void) {
        Suite *s = suite_create("adopt");
        TCase *tc = tcase_create("host");

        tcase_add_test(tc, test_adopt_after_restart);
        tcase_add_test(tc, test_adopt_refusals);
        tcase_add_test(tc, test_adopt_within_limits);
        tcase_add_test(tc, test_adopt_past_a_new_limit);
        tcase_add_test(tc, test_charges_after_restart);
        tcase_set_timeout(tc, 60);
        suite_add_tcase(s, tc);
        return s;
}
