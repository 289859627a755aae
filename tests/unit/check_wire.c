/* check_wire.c: packets on a SEQPACKET socket pair: framing, descriptors, limits. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "suites.h"
#include "wire.h"

static void pair(int sv[2]) {
        ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
}

START_TEST(test_roundtrip) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT, *got;
        Gpupool__LeaseRequest a = GPUPOOL__LEASE_REQUEST__INIT;
        uint8_t buf[GP_MAX_REQUEST_BYTES];
        int sv[2], n, fd = 99;

        pair(sv);
        env.version = GP_PROTOCOL_VERSION;
        env.id = 42;
        env.body_case = GPUPOOL__ENVELOPE__BODY_LEASE;
        env.lease = &a;
        a.device = 3;
        a.size = 1ULL << 40;
        n = gp_wire_pack(&env, buf, sizeof(buf));
        ck_assert_int_gt(n, 0);
        ck_assert_int_eq(gp_wire_send_packet(sv[0], buf, (size_t) n, -1), 0);
        memset(buf, 0, sizeof(buf));
        ck_assert_int_eq(gp_wire_recv_packet(sv[1], buf, sizeof(buf), &fd), n);
        ck_assert_int_eq(fd, -1);
        ck_assert_int_eq(gp_wire_unpack(buf, (size_t) n, &got), 0);
        ck_assert_uint_eq(got->id, 42);
        ck_assert_int_eq(got->body_case, GPUPOOL__ENVELOPE__BODY_LEASE);
        ck_assert_uint_eq(got->lease->device, 3);
        ck_assert_uint_eq(got->lease->size, 1ULL << 40);
        gpupool__envelope__free_unpacked(got, NULL);
        close(sv[0]);
        ck_assert_int_eq(gp_wire_recv_packet(sv[1], buf, sizeof(buf), NULL), 0);   /* peer closed */
        close(sv[1]);
}
END_TEST

START_TEST(test_fd_passing) {
        uint8_t buf[16] = "x", got[16];
        int sv[2], p[2], fd = -1;

        pair(sv);
        ck_assert_int_eq(pipe(p), 0);
        ck_assert_int_eq(gp_wire_send_packet(sv[0], buf, 1, p[1]), 0);
        ck_assert_int_eq(gp_wire_recv_packet(sv[1], got, sizeof(got), &fd), 1);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
        ck_assert_int_eq(write(fd, "y", 1), 1);
        ck_assert_int_eq(read(p[0], got, 1), 1);
        ck_assert_int_eq(got[0], 'y');
        close(fd);

        /* A receiver that takes no descriptors refuses the packet, and the descriptor is closed. */
        ck_assert_int_eq(gp_wire_send_packet(sv[0], buf, 1, p[1]), 0);
        close(p[1]);
        ck_assert_int_eq(gp_wire_recv_packet(sv[1], got, sizeof(got), NULL), -EBADMSG);
        ck_assert_int_eq(read(p[0], got, 1), 0);        /* every write end is closed: EOF */
        close(p[0]);
        close(sv[0]);
        close(sv[1]);
}
END_TEST

START_TEST(test_oversized_and_empty) {
        static uint8_t big[GP_MAX_REQUEST_BYTES + 100];
        uint8_t buf[GP_MAX_REQUEST_BYTES], small[4] = "ok";
        int sv[2];

        pair(sv);
        ck_assert_int_eq(gp_wire_send_packet(sv[0], big, sizeof(big), -1), 0);
        ck_assert_int_eq(gp_wire_send_packet(sv[0], small, 2, -1), 0);
        ck_assert_int_eq(gp_wire_recv_packet(sv[1], buf, sizeof(buf), NULL), -EMSGSIZE);
        /* The oversized packet is consumed whole; the next one arrives intact. */
        ck_assert_int_eq(gp_wire_recv_packet(sv[1], buf, sizeof(buf), NULL), 2);
        ck_assert_int_eq(memcmp(buf, "ok", 2), 0);
        close(sv[0]);
        close(sv[1]);
}
END_TEST

START_TEST(test_unpack_bad) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT, *got = NULL;
        uint8_t junk[] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0x01 }, buf[64];
        int n;

        ck_assert_int_eq(gp_wire_unpack(junk, sizeof(junk), &got), -EBADMSG);
        ck_assert_int_eq(gp_wire_unpack(junk, 0, &got), -EBADMSG);      /* required fields missing */
        env.version = GP_PROTOCOL_VERSION + 1;
        env.id = 1;
        n = gp_wire_pack(&env, buf, sizeof(buf));
        ck_assert_int_gt(n, 0);
        ck_assert_int_eq(gp_wire_unpack(buf, (size_t) n, &got), -EPROTONOSUPPORT);
        env.version = 1;        /* blocks carved by the daemon: no longer spoken */
        n = gp_wire_pack(&env, buf, sizeof(buf));
        ck_assert_int_eq(gp_wire_unpack(buf, (size_t) n, &got), -EPROTONOSUPPORT);
        ck_assert_int_eq(gp_wire_pack(&env, buf, 2), -EMSGSIZE);
        ck_assert_ptr_null(got);
}
END_TEST

/* The arena: a small request stays in it; a large one spills to malloc() and is freed (ASan's leak check sees it). */
START_TEST(test_arena) {
        static struct gp_wire_arena arena;
        static uint8_t buf[1 << 20];
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT, *got;
        Gpupool__ReturnRequest rr = GPUPOOL__RETURN_REQUEST__INIT;
        size_t n_ids = 40000;
        uint64_t *ids;
        int n;

        gp_wire_arena_init(&arena);
        ids = calloc(n_ids, sizeof(*ids));
        ck_assert_ptr_nonnull(ids);
        env.version = GP_PROTOCOL_VERSION;
        env.id = 7;
        env.body_case = GPUPOOL__ENVELOPE__BODY_RETURN_SEGMENTS;
        env.return_segments = &rr;
        for (size_t i = 0; i < n_ids; i++)
                ids[i] = 1 + i;
        for (int round = 0; round < 2; round++) {
                rr.n_segment_ids = round == 0 ? 1 : n_ids;
                rr.segment_ids = ids;
                n = gp_wire_pack(&env, buf, sizeof(buf));
                ck_assert_int_gt(n, 0);
                /* Exactly the room it needs is enough; a byte less is not. */
                ck_assert_int_eq(gp_wire_pack(&env, buf, (size_t) n), n);
                ck_assert_int_eq(gp_wire_pack(&env, buf, (size_t) n - 1), -EMSGSIZE);
                ck_assert_int_eq(gp_wire_unpack_with(buf, (size_t) n, &arena.allocator, &got), 0);
                ck_assert_uint_eq(got->return_segments->n_segment_ids, rr.n_segment_ids);
                ck_assert_uint_eq(got->return_segments->segment_ids[rr.n_segment_ids - 1], rr.n_segment_ids);
                ck_assert(arena.spilled == (round == 1));
                gp_wire_arena_release(&arena, got);
                ck_assert_uint_eq(arena.used, 0);
                ck_assert(!arena.spilled);
        }
        free(ids);
}
END_TEST

START_TEST(test_status_errno) {
        ck_assert_int_eq(gp_status_to_errno(GPUPOOL__STATUS__STATUS_OK), 0);
        ck_assert_int_eq(gp_status_to_errno(GPUPOOL__STATUS__STATUS_QUOTA), -EDQUOT);
        ck_assert_int_eq(gp_status_to_errno((Gpupool__Status) 999), -EPROTO);
        ck_assert_int_eq(gp_errno_to_status(-ENOENT), GPUPOOL__STATUS__STATUS_NOT_FOUND);
        ck_assert_int_eq(gp_errno_to_status(-EXDEV), GPUPOOL__STATUS__STATUS_INTERNAL);
}
END_TEST

START_TEST(test_socket_path) {
        unsetenv("GPUPOOL_SOCKET");
        ck_assert_str_eq(gp_wire_socket_path(NULL), GP_DEFAULT_SOCKET);
        setenv("GPUPOOL_SOCKET", "/tmp/x.sock", 1);
        ck_assert_str_eq(gp_wire_socket_path(NULL), "/tmp/x.sock");
        ck_assert_str_eq(gp_wire_socket_path("/a"), "/a");
        unsetenv("GPUPOOL_SOCKET");
}
END_TEST

START_TEST(test_names) {
        char long_name[GP_MAX_NAME_BYTES + 2];

        ck_assert(gp_wire_name_is_valid("trainer-0"));
        ck_assert(gp_wire_name_is_valid("g\xc3\xa9nial"));     /* UTF-8 is fine */
        ck_assert(!gp_wire_name_is_valid(""));
        ck_assert(!gp_wire_name_is_valid(NULL));
        ck_assert(!gp_wire_name_is_valid("tab\there"));
        ck_assert(!gp_wire_name_is_valid("del\x7f"));
        /* Not UTF-8: jansson refuses such strings, so a client could hide from gpupoolctl --json. */
        ck_assert(!gp_wire_name_is_valid("latin1-\xe9t\xe9"));        /* a lone lead byte */
        ck_assert(!gp_wire_name_is_valid("cut-\xc3"));                /* a sequence cut short */
        ck_assert(!gp_wire_name_is_valid("\xc0\xaf"));                /* overlong '/' */
        ck_assert(!gp_wire_name_is_valid("\xed\xa0\x80"));            /* a UTF-16 surrogate */
        /* Object names: none that shows nothing or turns text around (a look-alike of another name). */
        ck_assert(gp_wire_object_name_is_valid("llama-70b-weights"));
        ck_assert(gp_wire_object_name_is_valid("mod\xc3\xa8le"));
        ck_assert(!gp_wire_object_name_is_valid("llama-70b\xe2\x80\xae-weights"));   /* U+202E, right-to-left override */
        ck_assert(!gp_wire_object_name_is_valid("llama\xe2\x80\x8b-70b"));          /* U+200B, zero width space */
        ck_assert(!gp_wire_object_name_is_valid("\xef\xbb\xbfweights"));           /* U+FEFF */
        ck_assert(!gp_wire_object_name_is_valid("soft\xc2\xadhyphen"));             /* U+00AD */
        ck_assert(!gp_wire_object_name_is_valid("iso\xe2\x81\xa6late"));           /* U+2066 */
        ck_assert(!gp_wire_name_is_valid("\xf4\x90\x80\x80"));        /* past U+10FFFF */
        ck_assert(!gp_wire_name_is_valid("c1-\xc2\x85"));             /* U+0085, a C1 control */
        ck_assert(!gp_wire_name_is_valid("\x80"));                    /* a continuation byte alone */
        ck_assert(gp_wire_name_is_valid("\xe6\x97\xa5\xe6\x9c\xac"));    /* CJK, 3-byte */
        ck_assert(gp_wire_name_is_valid("\xf0\x9f\x9a\x80 job"));      /* 4-byte */
        memset(long_name, 'a', sizeof(long_name) - 1);
        long_name[sizeof(long_name) - 1] = '\0';
        ck_assert(!gp_wire_name_is_valid(long_name));            /* 64 bytes */
        long_name[GP_MAX_NAME_BYTES] = '\0';
        ck_assert(gp_wire_name_is_valid(long_name));             /* 63 bytes */
}
END_TEST

Suite *suite_wire(void) {
        Suite *s = suite_create("wire");
        TCase *tc = tcase_create("core");

        tcase_add_test(tc, test_roundtrip);
        tcase_add_test(tc, test_fd_passing);
        tcase_add_test(tc, test_oversized_and_empty);
        tcase_add_test(tc, test_unpack_bad);
        tcase_add_test(tc, test_arena);
        tcase_add_test(tc, test_status_errno);
        tcase_add_test(tc, test_socket_path);
        tcase_add_test(tc, test_names);
        suite_add_tcase(s, tc);
        return s;
}
