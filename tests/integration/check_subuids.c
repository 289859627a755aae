/*
 * check_subuids.c: one user with many uids is one user (trust round six). A user made by a real
 * useradd gets a range of subordinate uids in /etc/subuid; with newuidmap (the uidmap package,
 * as rootless podman uses it) she runs processes as any of them in a user namespace of her own,
 * which the daemon, in the host's namespace, sees as other uids. Each test makes its user and
 * removes her (userdel) at its end; without root or newuidmap it is skipped, saying why.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpupool.h"
#include "suites.h"
#include "testlib.h"

#define NEWUIDMAP "/usr/bin/newuidmap"

/* A user useradd made for a test, and the subordinate range it gave her. */
struct subuser {
        char name[32];
        uid_t uid;
        gid_t gid;
        unsigned long start, count;
};

/* Runs argv (no shell), its output dropped; its exit status, or -1. */
static int run_quiet(char *const argv[]) {
        int status;
        pid_t pid = fork();

        if (pid == 0) {
                int null = open("/dev/null", O_WRONLY | O_CLOEXEC);

                if (null >= 0) {
                        (void) dup2(null, 1);
                        (void) dup2(null, 2);
                }
                execv(argv[0], argv);
                _exit(127);
        }
        if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
                return -1;
        return WEXITSTATUS(status);
}

/*
 * The user's name, fixed by the runner before the test's process is forked: the runner removes
 * her after the test, whatever became of it (a failed check ends the test's process at once).
 */
static char subuser_name[32];

static void subuser_name_set(void) {
        snprintf(subuser_name, sizeof(subuser_name), "gpt%d", (int) getpid());
}

static void subuser_remove_name(void) {
        char *argv[] = { "/usr/sbin/userdel", subuser_name, NULL };

        if (geteuid() == 0 && getpwnam(subuser_name))
                (void) run_quiet(argv);
}

static void subuser_remove(struct subuser *u) {
        if (u->name[0])
                subuser_remove_name();
        u->name[0] = '\0';
}

/* Makes a user with useradd, as an operator would, and reads her range from /etc/subuid; false (skipped, saying why) where it cannot. */
static bool subuser_make(struct subuser *u, const char *test) {
        char *argv[] = { "/usr/sbin/useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", u->name, NULL };
        char line[256];
        struct passwd *pw;
        size_t n;
        FILE *f;

        memset(u, 0, sizeof(*u));
        if (geteuid() != 0) {
                test_skipped(test, "making a user with useradd needs root");
                return false;
        }
        if (access(NEWUIDMAP, X_OK) != 0) {
                test_skipped(test, "no " NEWUIDMAP " (apt-get install uidmap; .ci/run installs it)");
                return false;
        }
        snprintf(u->name, sizeof(u->name), "%s", subuser_name);
        subuser_remove_name();          /* one a test killed before its end left */
        if (run_quiet(argv) != 0 || !(pw = getpwnam(u->name))) {
                u->name[0] = '\0';
                ck_abort_msg("useradd %s failed", argv[4]);
        }
        u->uid = pw->pw_uid;
        u->gid = pw->pw_gid;
        n = strlen(u->name);
        if ((f = fopen("/etc/subuid", "re"))) {
                while (!u->count && fgets(line, sizeof(line), f))
                        if (strncmp(line, u->name, n) == 0 && line[n] == ':')
                                (void) sscanf(line + n + 1, "%lu:%lu", &u->start, &u->count);
                fclose(f);
        }
        if (u->count < 16) {
                subuser_remove(u);
                test_skipped(test, "useradd gave the user no subordinate uids (no /etc/subuid, or SUB_UID_COUNT 0 in "
                             "/etc/login.defs)");
                return false;
        }
        return true;
}

/* What subuid_clients() does: as user, n processes of her subordinate uids 1..n connect to sock. */
struct subuid_job {
        const struct subuser *user;
        int n;
        int publish;            /* objects each client publishes, once let in: 'y' all, 'n' refused as the user's */
        /*
         * Leases of 128 granules each client sends, never reading, once let in ('y' once the
         * daemon took them all); when the connections end, each reads its replies and writes
         * "replies descriptors refusals" to result.
         */
        unsigned unread_leases;
        int result[2];
        /* Called once every client reported, before the connections end (may be NULL). */
        void (*before_end)(struct testd *d, struct subuid_job *j);
        int report[2];          /* a byte a connection: 'y' let in, 'n' refused as one user's, 'x' refused otherwise */
        int step[2];            /* the same byte to the namespace's first process: the next may ask */
        int hold[2];            /* closed by the test: the connections end */
};

/* A client of j->unread_leases (its uid set): pipelines the leases, and once hold closes reads every reply. */
static int subuid_unread_client(struct testd *d, struct subuid_job *j) {
        int sock = raw_hello(d, "subuid"), refused, got;
        char b, why[512] = "", line[64];
        size_t fds;

        b = raw_lease_unread(sock, NULL, j->unread_leases, 30) ? 'y' : 'x';
        if (write(j->report[1], &b, 1) != 1 || write(j->step[1], &b, 1) != 1)
                return 2;
        close(j->report[1]);
        close(j->step[1]);
        while (read(j->hold[0], &b, 1) > 0)
                ;
        got = raw_read_replies(sock, (int) j->unread_leases, &fds, &refused, "could not be sent", why, sizeof(why));
        snprintf(line, sizeof(line), "%d %zu %d\n", got, fds, refused);
        if (write(j->result[1], line, strlen(line)) != (ssize_t) strlen(line))
                return 3;
        if (refused)
                fprintf(stderr, "a subordinate uid's lease, refused: %s\n", why);
        close(sock);
        return 0;
}

/* The i-th client, in the namespace: uid i there, start + i on the host; holds its connection until hold closes. */
static int subuid_client(struct testd *d, struct subuid_job *j, int i) {
        char why[512], want[64], b;
        gpupool_client *c = NULL;

        if (setresuid((uid_t) i, (uid_t) i, (uid_t) i) < 0)
                return 1;
        if (j->unread_leases)
                return subuid_unread_client(d, j);
        if (gpupool_connect(d->sock, "subuid", &c) == 0) {
                b = 'y';
                for (int k = 0; k < j->publish && b == 'y'; k++) {
                        char name[32];
                        void *p;
                        int r;

                        snprintf(name, sizeof(name), "s%d-%d", i, k);
                        if (gpupool_alloc(c, 0, 4096, &p) < 0)
                                return 3;
                        if ((r = gpupool_publish(c, name, p, 4096)) < 0) {
                                gpupool_last_error(c, why, sizeof(why));
                                snprintf(want, sizeof(want), "user %u holds 64 named objects", (unsigned) j->user->uid);
                                b = r == -EDQUOT && strstr(why, want) ? 'n' : 'x';
                                if (b == 'x')
                                        fprintf(stderr, "subuid client %d, object %d: %s\n", i, k, why);
                        }
                }
        } else {
                gpupool_last_error(NULL, why, sizeof(why));
                snprintf(want, sizeof(want), "user %u already has", (unsigned) j->user->uid);
                b = strstr(why, want) ? 'n' : 'x';
                if (b == 'x')
                        fprintf(stderr, "subuid client %d (host uid %lu): %s\n", i, j->user->start + (unsigned long) i, why);
        }
        if (write(j->report[1], &b, 1) != 1 || write(j->step[1], &b, 1) != 1)
                return 2;
        close(j->report[1]);
        close(j->step[1]);
        while (read(j->hold[0], &b, 1) > 0)
                ;
        if (c)
                gpupool_disconnect(c);
        return 0;
}

/*
 * As user: a process that makes a user namespace of its own, which newuidmap maps onto her
 * subordinate uids (uid 0 there is start), then the n clients, one after another.
 */
static int subuid_clients(struct testd *d, void *arg) {
        struct subuid_job *j = arg;
        int ready[2], mapped[2];
        char b = 0, pidtext[16], start[24], count[24];
        pid_t ns;
        int status;

        close(j->hold[1]);      /* the test's end: its close ends the connections */
        close(j->report[0]);
        if (setgroups(0, NULL) < 0 || setresgid(j->user->gid, j->user->gid, j->user->gid) < 0 ||
            setresuid(j->user->uid, j->user->uid, j->user->uid) < 0 || pipe(ready) < 0 || pipe(mapped) < 0)
                return 10;
        if ((ns = fork()) == 0) {
                close(ready[0]);
                close(mapped[1]);
                if (unshare(CLONE_NEWUSER) < 0 || write(ready[1], "u", 1) != 1 || read(mapped[0], &b, 1) != 1 || b != 'm' ||
                    pipe(j->step) < 0)
                        _exit(11);
                for (int i = 1; i <= j->n; i++) {
                        pid_t pid = fork();

                        if (pid == 0)
                                _exit(subuid_client(d, j, i));
                        /* One at a time: each is let in or refused before the next asks. */
                        if (pid < 0 || read(j->step[0], &b, 1) != 1)
                                _exit(12);
                }
                close(j->report[1]);
                while (wait(&status) > 0)
                        if (!WIFEXITED(status) || WEXITSTATUS(status))
                                _exit(14);
                _exit(0);
        }
        close(ready[1]);
        close(mapped[0]);
        if (ns < 0 || read(ready[0], &b, 1) != 1)
                return 15;
        snprintf(pidtext, sizeof(pidtext), "%d", (int) ns);
        snprintf(start, sizeof(start), "%lu", j->user->start);
        snprintf(count, sizeof(count), "%lu", j->user->count);
        {
                char *argv[] = { NEWUIDMAP, pidtext, "0", start, count, NULL };

                if (run_quiet(argv) != 0)
                        return 16;
        }
        if (write(mapped[1], "m", 1) != 1)
                return 17;
        close(j->report[1]);
        if (waitpid(ns, &status, 0) != ns || !WIFEXITED(status))
                return 18;
        return WEXITSTATUS(status);
}

/* Runs j's clients against d as the user's subordinate uids; their bytes into got (j->n + 1 bytes), once all have ended. */
static void run_subuid_clients(struct testd *d, struct subuid_job *j, char *got) {
        pid_t pid;
        int n = 0;

        ck_assert_int_eq(chmod(d->dir, 0755), 0);       /* let the other uids reach the socket */
        ck_assert(pipe(j->report) == 0 && pipe(j->hold) == 0);
        pid = spawn(subuid_clients, d, j);
        close(j->report[1]);
        while (n < j->n && read(j->report[0], &got[n], 1) == 1)
                n++;
        got[n] = '\0';
        if (j->before_end)
                j->before_end(d, j);
        close(j->hold[1]);
        ck_assert_int_eq(reap(pid), 0);
        close(j->report[0]);
        close(j->hold[0]);
}

/*
 * max_clients_per_uid counts a user, not a uid: six connections from six of one user's
 * subordinate uids, under a bound of 4, are four let in and two refused, saying whose they
 * are (before, each uid was a user of its own: six let in). The daemon runs as the unit's user.
 */
START_TEST(test_subordinate_uids_are_one_user) {
        struct subuid_job j = { .n = 6 };
        struct subuser u;
        char got[8];
        struct testd d;

        if (!subuser_make(&u, __func__))
                return;
        j.user = &u;
        testd_start_as(&d, 65534, "--max-clients-per-uid", "4", NULL);
        run_subuid_clients(&d, &j, got);
        ck_assert_msg(strcmp(got, "yyyynn") == 0, "six subordinate uids of one user, a bound of 4: %s", got);
        ck_assert_int_eq(testd_stop(&d), 0);
        subuser_remove(&u);
}
END_TEST

/*
 * A user outside pods holds at most 64 of the node's 256 named objects, whatever uids she
 * publishes them as (round six: four subordinate uids of 64 each filled the table, and objects
 * outlive their processes). Three of her subordinate uids publish 22 each: the third is refused
 * its 21st, saying whose objects they are (before, each uid had 64 of its own).
 */
START_TEST(test_subordinate_uids_share_one_object_quota) {
        struct subuid_job j = { .n = 3, .publish = 22 };
        struct subuser u;
        char got[8];
        struct testd d;

        if (!subuser_make(&u, __func__))
                return;
        j.user = &u;
        testd_start_as(&d, 65534, NULL);
        run_subuid_clients(&d, &j, got);
        ck_assert_msg(strcmp(got, "yyn") == 0, "three subordinate uids of one user, 22 objects each: %s", got);
        ck_assert_int_eq(testd_stop(&d), 0);
        subuser_remove(&u);
}
END_TEST

/*
 * Descriptors sent and not read count per user (round six, item 1): eight of one user's
 * subordinate uids each pipeline two granule leases of 128 and read nothing. Her clients
 * together get the user's share (an eighth of the node's budget: 1,024 at a soft limit of
 * 16,384), the rest are refused after --send-timeout, saying why, and no client loses its
 * connection (before, each uid had a share of its own: 2,048 sent, and eight uids filled the
 * node's budget; then a reply held for the group was dropped with its client).
 */
/* Half of the sixteen leases were refused: none waits any more, and what the clients read is what was sent. */
static void eight_refused(struct testd *d, struct subuid_job *j) {
        (void) j;
        ck_assert_msg(testd_metric_becomes(d, "gpupool_refusals_total{reason=\"unread_budget\"}", 8, 20),
                      "eight leases refused for the user's unread descriptors");
}

START_TEST(test_subordinate_uids_share_one_unread_share) {
        struct subuid_job j = { .n = 8, .unread_leases = 2, .before_end = eight_refused };
        size_t fds_total = 0;
        int refused_total = 0, got, refused;
        struct subuser u;
        char got_bytes[16];
        struct testd d;
        size_t fds;
        FILE *f;

        if (under_valgrind()) {
                TEST_SKIP("valgrind does not let a process raise its descriptor limit: the daemon's budget is another");
                return;
        }
        if (!subuser_make(&u, __func__))
                return;
        j.user = &u;
        testd_start_unread_bounded(&d, "8G", "1s");
        ck_assert_int_eq(pipe(j.result), 0);
        run_subuid_clients(&d, &j, got_bytes);
        close(j.result[1]);
        ck_assert_msg(strcmp(got_bytes, "yyyyyyyy") == 0, "eight subordinate uids' pipelines: %s", got_bytes);
        ck_assert_ptr_nonnull(f = fdopen(j.result[0], "r"));
        for (int i = 0; i < j.n; i++) {
                ck_assert_int_eq(fscanf(f, "%d %zu %d", &got, &fds, &refused), 3);
                ck_assert_msg(got == 2, "a client read %d of its 2 replies: the daemon dropped it", got);
                fds_total += fds;
                refused_total += refused;
        }
        fclose(f);
        ck_assert_uint_eq(fds_total, 1024);
        ck_assert_int_eq(refused_total, 8);
        ck_assert_int_eq(testd_stop(&d), 0);
        subuser_remove(&u);
}
END_TEST

Suite *suite_subuids(void) {
        Suite *s = suite_create("subuids");
        TCase *tc = tcase_create("subuids");

        tcase_add_unchecked_fixture(tc, subuser_name_set, subuser_remove_name);
        tcase_add_test(tc, test_subordinate_uids_are_one_user);
        tcase_add_test(tc, test_subordinate_uids_share_one_object_quota);
        tcase_add_test(tc, test_subordinate_uids_share_one_unread_share);
        tcase_set_timeout(tc, 60);
        suite_add_tcase(s, tc);
        return s;
}
