/*
 * check_users.c: daemon/users.c through its header: which user a uid is, from /etc/subuid's
 * ranges (named by user or uid) and a login's slice, and the groups the bounds per user count.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "suites.h"
#include "testlib.h"
#include "users.h"

/* Writes text to a file named subuid in a directory of the run's own: its path into path. */
static void subuid_file(char *path, size_t size, const char *text) {
        char dir[512];
        FILE *f;

        test_mkdtemp(dir, sizeof(dir), "users");
        ck_assert_int_lt(snprintf(path, size, "%s/subuid", dir), (int) size);
        ck_assert_ptr_nonnull(f = fopen(path, "w"));
        ck_assert_int_ge(fputs(text, f), 0);
        ck_assert_int_eq(fclose(f), 0);
}

START_TEST(test_subordinate_ranges) {
        char path[600];
        unsigned skipped = 0;

        subuid_file(path, sizeof(path),
                    "# useradd's, by name and by uid\n"
                    "root:100000:65536\n"
                    "1000:165536:65536\n"
                    "\n"
                    "nosuchuser-of-this-node:300000:10\n"      /* a name the system does not know */
                    "1001:200000\n"                             /* no count */
                    "1002:x:5\n"
                    "1003:400000:0\n"                           /* an empty range */
                    "1004:4294967290:10\n"                      /* past the last uid */
                    "1005:170000:10\n");                        /* inside 1000's */
        ck_assert_int_eq(users_load(path, &skipped), 2);
        ck_assert_uint_eq(skipped, 6);
        ck_assert_uint_eq(users_owner(100000, NULL), 0);
        ck_assert_uint_eq(users_owner(165535, NULL), 0);
        ck_assert_uint_eq(users_owner(165536, NULL), 1000);
        ck_assert_uint_eq(users_owner(231071, NULL), 1000);
        ck_assert_uint_eq(users_owner(231072, NULL), 231072);  /* past the last range: itself */
        ck_assert_uint_eq(users_owner(99999, NULL), 99999);
        ck_assert_uint_eq(users_owner(1000, NULL), 1000);
        ck_assert_uint_eq(users_owner(170005, NULL), 1000);    /* the overlapping range was left out */
        /* A file that is gone is no range; one that cannot be read keeps those held. */
        ck_assert_int_eq(unlink(path), 0);
        ck_assert_int_eq(users_load(path, NULL), 0);
        ck_assert_uint_eq(users_owner(165536, NULL), 165536);
        users_reset();
}
END_TEST

START_TEST(test_login_slices) {
        static const char *const slice = "/user.slice/user-1000.slice/user@1000.service/app.slice/podman.scope";

        users_reset();
        /* A uid no login has (65536 or more) in a login's slice is that login's; a login's own uid stays itself. */
        ck_assert_uint_eq(users_owner(500000, slice), 1000);
        ck_assert_uint_eq(users_owner(1001, slice), 1001);
        ck_assert_uint_eq(users_owner(0, "/user.slice/user-1000.slice/session-3.scope"), 0);
        ck_assert_uint_eq(users_owner(500000, "/user.slice/user-1000.slice"), 1000);
        /* Only a login's slice by systemd's name, from the host's root. */
        ck_assert_uint_eq(users_owner(500000, "/user.slice/user-x.slice/a.scope"), 500000);
        ck_assert_uint_eq(users_owner(500000, "/user.slice/user-1000.slicex/a.scope"), 500000);
        ck_assert_uint_eq(users_owner(500000, "/system.slice/user-1000.slice/a.scope"), 500000);
        ck_assert_uint_eq(users_owner(500000, "/user.slice/user-99999999999.slice/a.scope"), 500000);
        ck_assert_uint_eq(users_owner(500000, NULL), 500000);
}
END_TEST

START_TEST(test_refresh_follows_the_file) {
        char path[600];
        FILE *f;

        users_reset();
        subuid_file(path, sizeof(path), "1000:100000:65536\n");
        users_refresh(path, 5000);
        ck_assert_uint_eq(users_owner(100001, NULL), 1000);
        /* Changed (its size): read again, but not within a second of the last look. */
        ck_assert_ptr_nonnull(f = fopen(path, "w"));
        ck_assert_int_ge(fputs("2000:100000:65536\n3000:165536:65536\n", f), 0);
        ck_assert_int_eq(fclose(f), 0);
        users_refresh(path, 5500);
        ck_assert_uint_eq(users_owner(100001, NULL), 1000);
        users_refresh(path, 6000);
        ck_assert_uint_eq(users_owner(100001, NULL), 2000);
        ck_assert_uint_eq(users_owner(165536, NULL), 3000);
        users_reset();
}
END_TEST

START_TEST(test_groups) {
        /* In a pod, the pod, whatever user; outside pods, the user; a pod is never a user's. */
        ck_assert(users_same_group(1000, "pod-a", 2000, "pod-a"));
        ck_assert(!users_same_group(1000, "pod-a", 1000, "pod-b"));
        ck_assert(users_same_group(1000, "", 1000, ""));
        ck_assert(!users_same_group(1000, "", 2000, ""));
        ck_assert(!users_same_group(1000, "pod-a", 1000, ""));
        ck_assert(!users_same_group(1000, "", 1000, "pod-a"));
}
END_TEST

Suite *suite_users(void) {
        Suite *s = suite_create("users");
        TCase *tc = tcase_create("users");

        tcase_add_test(tc, test_subordinate_ranges);
        tcase_add_test(tc, test_login_slices);
        tcase_add_test(tc, test_refresh_follows_the_file);
        tcase_add_test(tc, test_groups);
        suite_add_tcase(s, tc);
        return s;
}
