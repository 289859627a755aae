/*
 * check_leases.c: granule leases on the wire, end to end on the host backend with a raw
 * client: a lease of many granules in one reply, each its own memory and descriptor, given
 * back one by one; impossible leases refused with a sentence, and one over the limit leasing
 * none; granules asked for ahead coming as far as the limit allows, never refused for it and
 * never waiting on a reclaim; the granule stock (--granule-stock) made ahead of the next lease.
 */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "suites.h"
#include "testlib.h"

#define MiB (1ULL << 20)

/*
 * A granule lease: that many segments of one granule each, a descriptor each, in one reply,
 * each its own memory; they go back one by one like any segment, and the client's reserve
 * counts every one.
 */
START_TEST(test_granule_lease) {
        int fds[GP_WIRE_MAX_FDS];
        uint64_t ids[5];
        uint8_t *maps[5];
        Gpupool__Envelope *rep;
        struct testd d;
        size_t nfds;
        json_t *st;
        int sock;

        testd_start(&d, NULL);
        sock = raw_hello(&d, "granules");
        rep = raw_lease_granules(sock, 0, 5, 2 * MiB, fds, &nfds);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        ck_assert_int_eq(rep->body_case, GPUPOOL__ENVELOPE__BODY_LEASE_REPLY);
        ck_assert_uint_eq(nfds, 5);
        ck_assert_uint_eq(rep->lease_reply->segment_size, 2 * MiB);
        ck_assert_uint_eq(rep->lease_reply->n_more_segment_ids, 4);
        ids[0] = rep->lease_reply->segment_id;
        for (int i = 1; i < 5; i++)
                ids[i] = rep->lease_reply->more_segment_ids[i - 1];
        gpupool__envelope__free_unpacked(rep, NULL);
        for (int i = 0; i < 5; i++) {
                struct stat sb;

                for (int j = 0; j < i; j++)
                        ck_assert_uint_ne(ids[i], ids[j]);
                ck_assert_int_eq(fstat(fds[i], &sb), 0);
                ck_assert_int_eq(sb.st_size, 2 * MiB);
                maps[i] = mmap(NULL, 2 * MiB, PROT_READ | PROT_WRITE, MAP_SHARED, fds[i], 0);
                ck_assert_ptr_ne(maps[i], MAP_FAILED);
                close(fds[i]);
                memset(maps[i], 0x10 + i, 2 * MiB);
        }
        for (int i = 0; i < 5; i++) {
                ck_assert_uint_eq(maps[i][0], 0x10 + i);
                ck_assert_uint_eq(maps[i][2 * MiB - 1], 0x10 + i);
                ck_assert_int_eq(munmap(maps[i], 2 * MiB), 0);
        }
        st = testd_ctl(&d, "status");
        ck_assert_int_eq(json_integer_value(json_object_get(status_client_by_name(st, "granules"), "reserved_bytes")),
                         10 * MiB);
        json_decref(st);
        /* Two go back, on their own: the cache has them, and the next granule lease takes them. */
        rep = raw_return(sock, (uint64_t[]) { ids[1], ids[3] }, 2, NULL);
        ck_assert_uint_eq(rep->return_reply->returned, 2);
        gpupool__envelope__free_unpacked(rep, NULL);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 4 * MiB);
        raw_hold_granules(sock, 0, 2);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 0);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 10 * MiB);
        close(sock);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* Checks that rep refuses with status, no descriptor with it, saying why in a sentence containing text; frees it. */
static void refused(Gpupool__Envelope *rep, size_t nfds, Gpupool__Status status, const char *text) {
        ck_assert_int_eq(rep->status, status);
        ck_assert_uint_eq(nfds, 0);
        ck_assert_msg(rep->error && strstr(rep->error, text), "%s", rep->error ? rep->error : "(no message)");
        gpupool__envelope__free_unpacked(rep, NULL);
}

/* Asks for a granule lease that must be refused with status, and says why in a sentence containing text. */
static void granule_lease_refused(int sock, uint32_t granules, uint64_t size, Gpupool__Status status, const char *text) {
        int fds[GP_WIRE_MAX_FDS];
        size_t nfds;
        Gpupool__Envelope *rep = raw_lease_granules(sock, 0, granules, size, fds, &nfds);

        refused(rep, nfds, status, text);
}

/*
 * Impossible granule leases are refused with a sentence; one over the client's limit leases
 * none of its granules (those it took before the limit go back to the cache), and the
 * connection serves on.
 */
START_TEST(test_granule_lease_refusals) {
        struct testd d;
        int sock;

        testd_start(&d, "--client-limit", "8M", NULL);
        sock = raw_hello(&d, "granules");
        granule_lease_refused(sock, 0, 2 * MiB, GPUPOOL__STATUS__STATUS_INVALID,
                              "1 to 128 granules of 2097152 bytes, or for 0 and some ahead, not 0 of 2097152 and 0 ahead");
        granule_lease_refused(sock, 129, 2 * MiB, GPUPOOL__STATUS__STATUS_INVALID, "not 129 of");
        granule_lease_refused(sock, 2, 4 * MiB, GPUPOOL__STATUS__STATUS_INVALID, "not 2 of 4194304");
        granule_lease_refused(sock, 2, 4096, GPUPOOL__STATUS__STATUS_INVALID, "not 2 of 4096");
        granule_lease_refused(sock, 5, 2 * MiB, GPUPOOL__STATUS__STATUS_QUOTA, "limit of 8.0 MiB");
        /* Refused before any granule was made: none went to the cache either (on a GPU, each costs a cuMemCreate). */
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 0);
        /* Four fit the limit. */
        raw_hold_granules(sock, 0, 4);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes") - testd_device(&d, 0, "cached_bytes"), 8 * MiB);
        granule_lease_refused(sock, 1, 2 * MiB, GPUPOOL__STATUS__STATUS_QUOTA, "limit of 8.0 MiB");
        close(sock);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* Asks for a lease with granules_ahead that must be refused as invalid, and says why in a sentence containing text. */
static void ahead_refused(int sock, bool granule_lease, uint32_t granules, uint32_t ahead, const char *text) {
        int fds[GP_WIRE_MAX_FDS];
        size_t nfds;
        Gpupool__Envelope *rep = raw_lease_ahead(sock, 0, 2 * MiB, granule_lease, granules, ahead, fds, &nfds);

        refused(rep, nfds, GPUPOOL__STATUS__STATUS_INVALID, text);
}

/* Leases granules and up to ahead more; checks that got came, and closes their descriptors. */
static void lease_ahead_gets(int sock, uint32_t granules, uint32_t ahead, size_t got) {
        int fds[GP_WIRE_MAX_FDS];
        Gpupool__Envelope *rep;
        size_t nfds;

        rep = raw_lease_ahead(sock, 0, 2 * MiB, true, granules, ahead, fds, &nfds);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        ck_assert_uint_eq(nfds, got);
        /* None (granules ahead only): segment id 0 names no segment. */
        ck_assert_uint_eq(rep->lease_reply->segment_id ? 1 + rep->lease_reply->n_more_segment_ids : 0, got);
        ck_assert_uint_eq(rep->lease_reply->segment_size, 2 * MiB);
        for (size_t i = 0; i < nfds; i++)
                close(fds[i]);
        gpupool__envelope__free_unpacked(rep, NULL);
}

/*
 * Granules asked for ahead come as far as the limit allows, and never make a lease wait or
 * fail; asking for them wrongly is refused.
 */
START_TEST(test_granules_ahead) {
        struct testd d;
        int sock;

        testd_start(&d, "--client-limit", "16M", NULL);
        sock = raw_hello(&d, "ahead");
        ahead_refused(sock, false, 0, 4, "granules_ahead is for a granule lease");
        ahead_refused(sock, true, 100, 29, "not 100 and 29");
        ahead_refused(sock, true, 0, 129, "not 0 and 129");
        lease_ahead_gets(sock, 2, 3, 5);
        /* Granules ahead only: as many as fit. */
        lease_ahead_gets(sock, 0, 1, 1);
        /* Two of the five asked fit under the limit: the lease is granted with those. */
        lease_ahead_gets(sock, 1, 4, 2);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes") - testd_device(&d, 0, "cached_bytes"), 16 * MiB);
        /* None fits: nothing ahead comes, and the granule asked for is refused as it would be alone. */
        granule_lease_refused(sock, 1, 2 * MiB, GPUPOOL__STATUS__STATUS_QUOTA, "limit of 16.0 MiB");
        /* Granules ahead only are never refused for a limit: none come. */
        lease_ahead_gets(sock, 0, 3, 0);
        close(sock);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/*
 * Granules ahead only never wait: on a full device where another client reports memory free
 * (a lease of a granule would wait for it to give some back, up to the reclaim timeout), a
 * lease of granules ahead only is answered at once with none, and nobody is asked.
 */
START_TEST(test_granules_ahead_only_never_wait) {
        Gpupool__Usage u = GPUPOOL__USAGE__INIT;
        Gpupool__Hello hello = GPUPOOL__HELLO__INIT;
        Gpupool__Envelope *rep;
        int holder, control, sock;
        uint64_t holder_id;
        struct testd d;

        testd_start(&d, "--host-capacity", "8M", "--reclaim-timeout", "600s", NULL);
        hello.name = "holder";
        holder = raw_hello_with(&d, &hello, &holder_id);
        /* Its control channel, where the daemon would ask it for memory back: never read. */
        hello.has_control_for = 1;
        hello.control_for = holder_id;
        control = raw_hello_with(&d, &hello, NULL);
        raw_hold_granules(holder, 0, 4);
        /* All of it free, by its word: the reclaim would ask it, and it never answers. */
        u.device = 0;
        u.in_use_bytes = 0;
        u.held_free_bytes = 8 * MiB;
        rep = raw_return(holder, NULL, 0, &u);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        gpupool__envelope__free_unpacked(rep, NULL);
        sock = raw_hello(&d, "ahead");
        lease_ahead_gets(sock, 0, 2, 0);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 8 * MiB);
        close(sock);
        close(control);
        close(holder);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* A granule lease of n on sock, its descriptors closed; returns its status. */
static int lease_granules(int sock, uint32_t n) {
        int fds[GP_WIRE_MAX_FDS], status;
        Gpupool__Envelope *rep;
        size_t nfds = 0;

        rep = raw_lease_granules(sock, 0, n, 2 * MiB, fds, &nfds);
        status = rep->status;
        gpupool__envelope__free_unpacked(rep, NULL);
        while (nfds)
                close(fds[--nfds]);
        return status;
}

/*
 * --granule-stock: after a granule lease the daemon makes as many granule segments ahead (at
 * most the option's), fresh, into the cache, in free capacity only, for the next lease to take
 * there instead of waiting for each to be made; a flush gives them back like any cached one.
 */
START_TEST(test_granule_stock) {
        struct testd d;
        int sock;

        testd_start(&d, "--granule-stock", "3", "--host-capacity", "20M", "--max-cached", "100%", NULL);
        sock = raw_hello(&d, "stocker");
        ck_assert_int_eq(lease_granules(sock, 4), GPUPOOL__STATUS__STATUS_OK);
        /* Three (the option's most) made ahead of the next. */
        ck_assert(testd_device_becomes(&d, 0, "stocked_total", 3));
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 6 * MiB);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 14 * MiB);
        json_decref(testd_ctl(&d, "check"));
        /* The next takes two of them; as many are wanted ahead again, and one more is made. */
        ck_assert_int_eq(lease_granules(sock, 2), GPUPOOL__STATUS__STATUS_OK);
        ck_assert(testd_device_becomes(&d, 0, "stocked_total", 4));
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 4 * MiB);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes") - testd_device(&d, 0, "cached_bytes"), 12 * MiB);
        /* The capacity bounds it: 3 more leased (2 of the stock, 1 new) leave room for one ahead, of 3 wanted. */
        ck_assert_int_eq(lease_granules(sock, 3), GPUPOOL__STATUS__STATUS_OK);
        ck_assert(testd_device_becomes(&d, 0, "stocked_total", 5));
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 20 * MiB);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 2 * MiB);
        /* Under pressure the stock is the cache's: a lease that needs its room takes it. */
        ck_assert_int_eq(lease_granules(sock, 1), GPUPOOL__STATUS__STATUS_OK);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes") - testd_device(&d, 0, "cached_bytes"), 20 * MiB);
        json_decref(testd_ctl(&d, "check"));
        close(sock);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* A LeaseRequest for a segment of size bytes, exact or not; its reply (the descriptor closed), the segment's id and size out. */
static Gpupool__Envelope *lease_exact(int sock, uint64_t size, bool exact, bool granule) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__LeaseRequest lr = GPUPOOL__LEASE_REQUEST__INIT;
        int fd = -1;

        lr.device = 0;
        lr.size = size;
        lr.has_exact = true;
        lr.exact = exact;
        lr.has_granules = granule;
        lr.granules = granule ? 1 : 0;
        env.id = 9;
        env.body_case = GPUPOOL__ENVELOPE__BODY_LEASE;
        env.lease = &lr;
        rep = raw_call_fd(sock, &env, &fd);
        ck_assert_ptr_nonnull(rep);
        if (fd >= 0)
                close(fd);
        return rep;
}

/*
 * exact: the cache serves a lease only with a segment of its size rounded to 2 MiB, where it
 * would otherwise take one of up to a quarter more; a new segment is that size. Not for a
 * granule lease: refused, saying why.
 */
START_TEST(test_exact_lease) {
        Gpupool__Envelope *rep;
        struct testd d;
        uint64_t id;
        int sock;

        testd_start(&d, NULL);
        sock = raw_hello(&d, "exact");
        rep = lease_exact(sock, 24 * MiB, false, false);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        id = rep->lease_reply->segment_id;
        gpupool__envelope__free_unpacked(rep, NULL);
        gpupool__envelope__free_unpacked(raw_return(sock, &id, 1, NULL), NULL);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 24 * MiB);
        /* 20 MiB exact: not the cached 24, a new 20. */
        rep = lease_exact(sock, 20 * MiB, true, false);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        ck_assert_uint_eq(rep->lease_reply->segment_size, 20 * MiB);
        ck_assert_uint_ne(rep->lease_reply->segment_id, id);
        gpupool__envelope__free_unpacked(rep, NULL);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 24 * MiB);
        /* Not exact, 20 MiB takes the cached 24 (a sixth more). */
        rep = lease_exact(sock, 20 * MiB, false, false);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        ck_assert_uint_eq(rep->lease_reply->segment_size, 24 * MiB);
        ck_assert_uint_eq(rep->lease_reply->segment_id, id);
        gpupool__envelope__free_unpacked(rep, NULL);
        gpupool__envelope__free_unpacked(raw_return(sock, &id, 1, NULL), NULL);
        /* 23 MiB exact rounds up to 24: the cached one serves. */
        rep = lease_exact(sock, 23 * MiB, true, false);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        ck_assert_uint_eq(rep->lease_reply->segment_id, id);
        gpupool__envelope__free_unpacked(rep, NULL);
        /* A granule lease is each the granule: exact there is a mistake. */
        rep = lease_exact(sock, 2 * MiB, true, true);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_INVALID);
        ck_assert_msg(strstr(rep->error, "exact is for a segment lease"), "%s", rep->error);
        gpupool__envelope__free_unpacked(rep, NULL);
        json_decref(testd_ctl(&d, "check"));
        close(sock);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

Suite *suite_leases(void) {
        Suite *s = suite_create("leases");
        TCase *tc = tcase_create("host");

        tcase_add_test(tc, test_granule_lease);
        tcase_add_test(tc, test_granule_lease_refusals);
        tcase_add_test(tc, test_granules_ahead);
        tcase_add_test(tc, test_granules_ahead_only_never_wait);
        tcase_add_test(tc, test_granule_stock);
        tcase_add_test(tc, test_exact_lease);
        tcase_set_timeout(tc, 120);
        suite_add_tcase(s, tc);
        return s;
}
