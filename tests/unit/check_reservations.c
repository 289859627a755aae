/*
 * check_reservations.c: the table of reservations and its file (daemon/reservations.c): a
 * put's idempotence by key and generation and its refusals, delete, and the file kept in the
 * state directory: what is written is read back whole, every malformed line is refused naming
 * its file and line, and a write leaves nothing beside the file. What a reservation lets a pod
 * have is check_policy.c's; the daemon's requests are check_reservations_daemon.c's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "reservations.h"
#include "suites.h"
#include "testlib.h"

#define GiB (1ULL << 30)
#define POD_A "0a1b2c3d-0000-4000-8000-00000000000a"
#define POD_B "0a1b2c3d-0000-4000-8000-00000000000b"
#define POD_C "0a1b2c3d-0000-4000-8000-00000000000c"

static char dir[96], path[160];
static struct reservations rs, back;

static void setup(void) {
        test_mkdtemp(dir, sizeof(dir), "reservations");
        snprintf(path, sizeof(path), "%s/%s", dir, RESERVATIONS_FILE);
        memset(&rs, 0, sizeof(rs));
}

static void teardown(void) {
        char cmd[160];

        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        ck_assert_int_eq(system(cmd), 0);
}

/* A reservation of key for pod, generation gen, guarantee g and limit l GiB on device 0. */
static struct reservation one(const char *key, const char *pod, uint64_t gen, uint64_t g, uint64_t l) {
        struct reservation r = { .generation = gen, .guarantee_bytes = g * GiB, .limit_bytes = l * GiB, .pod_count = 1 };

        snprintf(r.key, sizeof(r.key), "%s", key);
        snprintf(r.pods[0], sizeof(r.pods[0]), "%s", pod);
        return r;
}

/* Whether a and b say the same, field by field. */
static void assert_same(const struct reservation *a, const struct reservation *b) {
        ck_assert_str_eq(a->key, b->key);
        ck_assert_uint_eq(a->generation, b->generation);
        ck_assert_uint_eq(a->device, b->device);
        ck_assert_str_eq(a->device_uuid, b->device_uuid);
        ck_assert_uint_eq(a->guarantee_bytes, b->guarantee_bytes);
        ck_assert_uint_eq(a->limit_bytes, b->limit_bytes);
        ck_assert_uint_eq(a->pod_count, b->pod_count);
        for (unsigned i = 0; i < a->pod_count; i++)
                ck_assert_str_eq(a->pods[i], b->pods[i]);
}

START_TEST(test_put_is_idempotent_by_generation) {
        struct reservation r = one("job-a", POD_A, 3, 2, 4);
        char why[300] = "";

        ck_assert_int_eq(reservations_put(&rs, &r, why, sizeof(why)), 1);
        /* The same again: nothing changes, nothing refused (a tool's retry). */
        ck_assert_int_eq(reservations_put(&rs, &r, why, sizeof(why)), 0);
        ck_assert_uint_eq(rs.count, 1);
        /* The same generation with other values is a conflict; an older one is stale. */
        r.limit_bytes = 5 * GiB;
        ck_assert_int_eq(reservations_put(&rs, &r, why, sizeof(why)), -EEXIST);
        ck_assert_msg(strstr(why, "reservation job-a is at generation 3 with other values"), "%s", why);
        r.generation = 2;
        ck_assert_int_eq(reservations_put(&rs, &r, why, sizeof(why)), -ESTALE);
        ck_assert_msg(strstr(why, "generation 2 is older"), "%s", why);
        /* A newer one replaces, in place. */
        r.generation = 4;
        ck_assert_int_eq(reservations_put(&rs, &r, why, sizeof(why)), 1);
        ck_assert_uint_eq(rs.count, 1);
        ck_assert_uint_eq(rs.r[0].limit_bytes, 5 * GiB);
        /* One reservation per pod: another key for the same pod is refused, a pod of its own is not. */
        r = one("job-b", POD_A, 0, 1, 1);
        ck_assert_int_eq(reservations_put(&rs, &r, why, sizeof(why)), -EBUSY);
        ck_assert_msg(strstr(why, "pod " POD_A " has reservation job-a already"), "%s", why);
        r = one("job-b", POD_B, 0, 1, 1);
        ck_assert_int_eq(reservations_put(&rs, &r, why, sizeof(why)), 1);
        /* A reservation may move its pods: job-a's pod goes to job-a's newer generation alone. */
        r = one("job-a", POD_C, 5, 2, 4);
        ck_assert_int_eq(reservations_put(&rs, &r, why, sizeof(why)), 1);
        ck_assert_ptr_eq(reservations_of_pod(&rs, POD_C), reservations_find(&rs, "job-a"));
        ck_assert_ptr_null(reservations_of_pod(&rs, POD_A));
        /* Delete: there, then not; the order of the rest is kept. */
        ck_assert(reservations_delete(&rs, "job-a"));
        ck_assert(!reservations_delete(&rs, "job-a"));
        ck_assert_uint_eq(rs.count, 1);
        ck_assert_str_eq(rs.r[0].key, "job-b");
}
END_TEST

/* A token instead of pods: bound later, kept bound by a put of the same token, one reservation's only. */
START_TEST(test_tokens) {
        struct reservation r = one("job-t", POD_A, 1, 1, 1);
        char why[300] = "", err[600] = "";

        r.pod_count = 0;
        strcpy(r.token, "abcdefghijklmnop-_0123");
        ck_assert_msg(reservation_check(&r, why, sizeof(why)) == 0, "%s", why);
        ck_assert_int_eq(reservations_put(&rs, &r, why, sizeof(why)), 1);
        ck_assert_ptr_eq(reservations_of_token(&rs, "abcdefghijklmnop-_0123"), &rs.r[0]);
        ck_assert_ptr_null(reservations_of_token(&rs, "abcdefghijklmnop-_012"));
        ck_assert_ptr_null(reservations_of_token(&rs, "abcdefghijklmnop-_01234"));
        ck_assert_ptr_null(reservations_of_token(&rs, ""));
        /* Bound (as the daemon does when a pod presents it), a put of the same token keeps the pod. */
        strcpy(rs.r[0].pods[0], POD_A);
        rs.r[0].pod_count = 1;
        ck_assert_int_eq(reservations_put(&rs, &r, why, sizeof(why)), 0);
        r.generation = 2;
        r.limit_bytes = 2 * GiB;
        ck_assert_int_eq(reservations_put(&rs, &r, why, sizeof(why)), 1);
        ck_assert_uint_eq(rs.r[0].pod_count, 1);
        ck_assert_str_eq(rs.r[0].pods[0], POD_A);
        /* Another token unbinds it: a new secret is a new pod's. */
        r.generation = 3;
        strcpy(r.token, "qrstuvwxyzqrstuvwxyz");
        ck_assert_int_eq(reservations_put(&rs, &r, why, sizeof(why)), 1);
        ck_assert_uint_eq(rs.r[0].pod_count, 0);
        /* A token is one reservation's. */
        r = one("job-u", POD_B, 0, 1, 1);
        r.pod_count = 0;
        strcpy(r.token, "qrstuvwxyzqrstuvwxyz");
        ck_assert_int_eq(reservations_put(&rs, &r, why, sizeof(why)), -EBUSY);
        ck_assert_msg(strstr(why, "reservation job-t has that token already"), "%s", why);
        /* Too short, a character outside base64url, a token with two pods. */
        strcpy(r.token, "short");
        ck_assert_int_eq(reservation_check(&r, why, sizeof(why)), -EINVAL);
        ck_assert_msg(strstr(why, "a token is 16 to 128 letters"), "%s", why);
        strcpy(r.token, "abcdefghijklmnop+");
        ck_assert_int_eq(reservation_check(&r, why, sizeof(why)), -EINVAL);
        strcpy(r.token, "abcdefghijklmnopq");
        r.pod_count = 2;
        strcpy(r.pods[1], POD_C);
        ck_assert_int_eq(reservation_check(&r, why, sizeof(why)), -EINVAL);
        ck_assert_msg(strstr(why, "a token binds one pod"), "%s", why);
        /* The file keeps a token and the pod it bound, or none yet. */
        strcpy(rs.r[0].pods[0], POD_C);
        rs.r[0].pod_count = 1;
        r = one("job-v", POD_B, 0, 1, 1);
        r.pod_count = 0;
        strcpy(r.token, "0123456789abcdefXYZ");
        ck_assert_int_eq(reservations_put(&rs, &r, why, sizeof(why)), 1);
        ck_assert_msg(reservations_save(dir, &rs, err, sizeof(err)) == 0, "%s", err);
        ck_assert_msg(reservations_load(dir, &back, err, sizeof(err)) == 0, "%s", err);
        ck_assert_uint_eq(back.count, 2);
        assert_same(&back.r[0], &rs.r[0]);
        ck_assert_str_eq(back.r[0].token, "qrstuvwxyzqrstuvwxyz");
        assert_same(&back.r[1], &rs.r[1]);
        ck_assert_str_eq(back.r[1].token, "0123456789abcdefXYZ");
        ck_assert_uint_eq(back.r[1].pod_count, 0);
}
END_TEST

START_TEST(test_full) {
        char key[16], pod[40], why[300];
        struct reservation r;

        for (unsigned i = 0; i < RESERVATIONS_MAX; i++) {
                snprintf(key, sizeof(key), "k%u", i);
                snprintf(pod, sizeof(pod), "0a1b2c3d-0000-4000-8000-%012x", i);
                r = one(key, pod, 0, 0, 1);
                ck_assert_int_eq(reservations_put(&rs, &r, why, sizeof(why)), 1);
        }
        r = one("one-more", "ffffffff-0000-4000-8000-000000000000", 0, 0, 1);
        ck_assert_int_eq(reservations_put(&rs, &r, why, sizeof(why)), -ENOSPC);
        ck_assert_msg(strstr(why, "the node has 64 reservations, the most it keeps"), "%s", why);
        /* A newer generation of one already there still goes in. */
        r = one("k7", "0a1b2c3d-0000-4000-8000-000000000007", 1, 0, 2);
        ck_assert_int_eq(reservations_put(&rs, &r, why, sizeof(why)), 1);
}
END_TEST

/* Each field checked on its own, with a sentence that names the reservation and what is wrong. */
START_TEST(test_check) {
        static const struct {
                const char *key, *pod, *says;
                uint64_t guarantee, limit;
                unsigned pods;
        } cases[] = {
                { "", POD_A, "a reservation's key is 1 to 63", 1, 1, 1 },
                { "a b", POD_A, "a reservation's key is 1 to 63", 1, 1, 1 },
                { "x/y", POD_A, "a reservation's key is 1 to 63", 1, 1, 1 },
                { "default", POD_A, "'default' is the default tenant's name", 1, 1, 1 },
                { "k", POD_A, "reservation k: a limit of 0", 0, 0, 1 },
                { "k", POD_A, "reservation k: a guarantee of 2.0 GiB is more than its limit of 1.0 GiB", 2, 1, 1 },
                { "k", POD_A, "reservation k: it is for 1 to 16 pods", 1, 1, 0 },
                { "k", "0A1B2C3D-0000-4000-8000-00000000000A", "is not a pod UID", 1, 1, 1 },
                { "k", "0a1b2c3d-0000-4000-8000-00000000000", "is not a pod UID", 1, 1, 1 },
                { "k", "0a1b2c3d_0000_4000_8000_00000000000a", "is not a pod UID", 1, 1, 1 },
                { "k", POD_A, "reservation k names pod " POD_A " twice", 1, 1, 2 },
        };
        char why[300];

        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                struct reservation r = one(cases[i].key, cases[i].pod, 0, cases[i].guarantee, cases[i].limit);

                r.pod_count = cases[i].pods;
                strcpy(r.pods[1], cases[i].pod);
                why[0] = '\0';
                ck_assert_msg(reservation_check(&r, why, sizeof(why)) == -EINVAL, "case %zu passed", i);
                ck_assert_msg(strstr(why, cases[i].says), "case %zu: %s", i, why);
        }
        {
                struct reservation r = one("claim-0a1b.gpu_0", POD_A, 0, 0, 1);

                ck_assert_msg(reservation_check(&r, why, sizeof(why)) == 0, "%s", why);
        }
}
END_TEST

START_TEST(test_file_round_trip) {
        struct reservation r = one("job-a", POD_A, 7, 2, 4);
        char err[600] = "", leftover[200];
        struct stat st;

        /* No file yet: no reservations, no error. */
        back.count = 9;
        ck_assert_msg(reservations_load(dir, &back, err, sizeof(err)) == 0, "%s", err);
        ck_assert_uint_eq(back.count, 0);
        r.device = 3;
        strcpy(r.device_uuid, "GPU-8d1e2f00-1111-2222-3333-444455556666");
        r.pod_count = 2;
        strcpy(r.pods[1], POD_B);
        ck_assert_int_eq(reservations_put(&rs, &r, err, sizeof(err)), 1);
        r = one("job-c", POD_C, 0, 0, 1);
        ck_assert_int_eq(reservations_put(&rs, &r, err, sizeof(err)), 1);
        ck_assert_msg(reservations_save(dir, &rs, err, sizeof(err)) == 0, "%s", err);
        ck_assert_msg(reservations_load(dir, &back, err, sizeof(err)) == 0, "%s", err);
        ck_assert_uint_eq(back.count, 2);
        assert_same(&back.r[0], &rs.r[0]);
        assert_same(&back.r[1], &rs.r[1]);
        /* Only the owner reads it, and the new file's temporary name is gone. */
        ck_assert_int_eq(stat(path, &st), 0);
        ck_assert_uint_eq(st.st_mode & 0777, 0600);
        snprintf(leftover, sizeof(leftover), "%s/.%s.new", dir, RESERVATIONS_FILE);
        ck_assert_int_eq(access(leftover, F_OK), -1);
        /* An empty table is written too: deleting the last leaves none to come back. */
        rs.count = 0;
        ck_assert_msg(reservations_save(dir, &rs, err, sizeof(err)) == 0, "%s", err);
        ck_assert_msg(reservations_load(dir, &back, err, sizeof(err)) == 0, "%s", err);
        ck_assert_uint_eq(back.count, 0);
        /* A state directory that is not there is an error that names the file. */
        ck_assert_int_eq(reservations_save("/nonexistent-gpupool", &rs, err, sizeof(err)), -ENOENT);
        ck_assert_msg(strstr(err, "cannot write /nonexistent-gpupool/.reservations.new"), "%s", err);
}
END_TEST

/*
 * A crash between the new file's write and its rename leaves the old file whole, and the
 * temporary one beside it: the next load reads the old, and the next save replaces both.
 */
START_TEST(test_crash_before_rename) {
        struct reservation r = one("job-a", POD_A, 1, 1, 1);
        char err[600] = "", tmp[200];
        FILE *f;

        ck_assert_int_eq(reservations_put(&rs, &r, err, sizeof(err)), 1);
        ck_assert_msg(reservations_save(dir, &rs, err, sizeof(err)) == 0, "%s", err);
        snprintf(tmp, sizeof(tmp), "%s/.%s.new", dir, RESERVATIONS_FILE);
        f = fopen(tmp, "w");
        ck_assert_ptr_nonnull(f);
        fputs("gpupool-reservations 1\nkey=half", f);
        fclose(f);
        ck_assert_msg(reservations_load(dir, &back, err, sizeof(err)) == 0, "%s", err);
        ck_assert_uint_eq(back.count, 1);
        ck_assert_str_eq(back.r[0].key, "job-a");
        ck_assert_msg(reservations_save(dir, &rs, err, sizeof(err)) == 0, "%s", err);
        ck_assert_int_eq(access(tmp, F_OK), -1);
}
END_TEST

/* Every malformed file is refused whole, naming its file and line and what is wrong. */
START_TEST(test_bad_files) {
#define LINE "key=k generation=1 device=0 uuid=- guarantee=1 limit=2 pods=" POD_A
        static const struct {
                const char *text, *says;
        } cases[] = {
                { "key=k\n", ":1: the file does not start with 'gpupool-reservations 1'" },
                { "gpupool-reservations 2\n" LINE "\n", ":1: the file does not start with" },
                { "# a comment\n\ngpupool-reservations 1\nkey=k generation=1\n", ":4: a reservation's line has key, generation" },
                { "gpupool-reservations 1\n" LINE " color=red\n", ":2: unknown field 'color'" },
                { "gpupool-reservations 1\n" LINE " key=j\n", ":2: field 'key' twice" },
                { "gpupool-reservations 1\nkey\n", ":2: 'key' is no key=value field" },
                { "gpupool-reservations 1\nkey=k generation=x device=0 uuid=- guarantee=1 limit=2 pods=" POD_A "\n",
                  ":2: generation: 'x' is not a valid value" },
                { "gpupool-reservations 1\nkey=k generation=1 device=64 uuid=- guarantee=1 limit=2 pods=" POD_A "\n",
                  ":2: device: '64' is not a valid value" },
                { "gpupool-reservations 1\nkey=k generation=1 device=0 uuid=XYZ guarantee=1 limit=2 pods=" POD_A "\n",
                  ":2: uuid: 'XYZ' is not a valid value" },
                { "gpupool-reservations 1\nkey=k generation=1 device=0 uuid=- guarantee=-1 limit=2 pods=" POD_A "\n",
                  ":2: guarantee: '-1' is not a valid value" },
                { "gpupool-reservations 1\nkey=k generation=1 device=0 uuid=- guarantee=1 limit=99999999999999999999 pods="
                  POD_A "\n", ":2: limit: '99999999999999999999' is not a valid value" },
                { "gpupool-reservations 1\nkey=k generation=1 device=0 uuid=- guarantee=3 limit=2 pods=" POD_A "\n",
                  ":2: reservation k: a guarantee of 3 B is more than its limit of 2 B" },
                { "gpupool-reservations 1\nkey=k generation=1 device=0 uuid=- guarantee=1 limit=2 pods=nope\n",
                  ":2: reservation k: 'nope' is not a pod UID" },
                { "gpupool-reservations 1\n" LINE "\n" LINE "\n", ":3: reservation k twice" },
                { "gpupool-reservations 1\n" LINE "\nkey=j generation=1 device=0 uuid=- guarantee=1 limit=2 pods=" POD_A "\n",
                  ":3: pod " POD_A " has reservation k already" },
                { "gpupool-reservations 1\nkey=k generation=1 device=0 uuid=- guarantee=1 limit=2 pods=- token=short\n",
                  ":2: token: 'short' is not a valid value" },
                { "gpupool-reservations 1\nkey=k generation=1 device=0 uuid=- guarantee=1 limit=2 pods=-\n",
                  ":2: reservation k: it is for 1 to 16 pods" },
                { "# only a comment\n", NULL },
        };
        char err[600];

        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                FILE *f = fopen(path, "w");
                int r;

                ck_assert_ptr_nonnull(f);
                fputs(cases[i].text, f);
                fclose(f);
                err[0] = '\0';
                r = reservations_load(dir, &back, err, sizeof(err));
                if (!cases[i].says) {
                        /* A file of comments alone has no header: it is not ours. */
                        ck_assert_msg(r == -EINVAL && strstr(err, "no 'gpupool-reservations 1' line"), "case %zu: %s", i, err);
                        continue;
                }
                ck_assert_msg(r == -EINVAL, "case %zu loaded", i);
                ck_assert_msg(strstr(err, path) == err, "case %zu does not name the file: %s", i, err);
                ck_assert_msg(strstr(err, cases[i].says), "case %zu: %s", i, err);
                ck_assert_uint_eq(back.count, 0);
        }
        /* A line longer than any reservation's is refused, not split. */
        {
                FILE *f = fopen(path, "w");

                fputs("gpupool-reservations 1\nkey=", f);
                for (int i = 0; i < 3000; i++)
                        fputc('k', f);
                fputc('\n', f);
                fclose(f);
                ck_assert_int_eq(reservations_load(dir, &back, err, sizeof(err)), -EINVAL);
                ck_assert_msg(strstr(err, ":2: a line longer than 2048 bytes"), "%s", err);
        }
#undef LINE
}
END_TEST

Suite *suite_reservations(void) {
        Suite *s = suite_create("reservations");
        TCase *tc = tcase_create("reservations");

        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_add_test(tc, test_put_is_idempotent_by_generation);
        tcase_add_test(tc, test_full);
        tcase_add_test(tc, test_tokens);
        tcase_add_test(tc, test_check);
        tcase_add_test(tc, test_file_round_trip);
        tcase_add_test(tc, test_crash_before_rename);
        tcase_add_test(tc, test_bad_files);
        suite_add_tcase(s, tc);
        return s;
}
