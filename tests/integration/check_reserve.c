/*
 * check_reserve.c: reservations in the running daemon, as an operator's tool makes them
 * (gpupoolctl reserve, unreserve, reservations): put, list and delete with every refusal; a
 * reservation kept across a crash of the daemon and refused whole from a damaged file; and,
 * with clients in the kubelet's cgroups, a pod's processes held together to its limit, its
 * guarantee kept from a greedy pod, connected clients moved in and out as reservations come
 * and go, and a deleted pod's memory zeroed before another pod gets it. The tests with pods
 * need root and a writable cgroup v2 hierarchy; they are skipped, saying why, elsewhere.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpupool.h"
#include "suites.h"
#include "testlib.h"

#define MiB (1ULL << 20)
#define MARK 0x5a

static char state[96];

static void setup(void) {
        test_mkdtemp(state, sizeof(state), "state");
}

static void teardown(void) {
        char cmd[160];

        snprintf(cmd, sizeof(cmd), "rm -rf %s", state);
        ck_assert_int_eq(system(cmd), 0);
}

/* Runs "gpupoolctl --socket S ARGS" (stderr too into out); its exit status. */
static int ctl(struct testd *d, const char *args, char *out, size_t size) {
        char cmd[1024];

        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s %s 2>&1", build_dir(), d->sock, args);
        return run_capture(cmd, out, size);
}

/* The reservation of key in "gpupoolctl reservations --json" (a new reference), or NULL. */
static json_t *listed(struct testd *d, const char *key) {
        json_t *all = testd_ctl(d, "reservations"), *found = NULL, *r;
        size_t i;

        ck_assert_ptr_nonnull(all);
        json_array_foreach(json_object_get(all, "reservations"), i, r)
                if (strcmp(json_string_value(json_object_get(r, "key")), key) == 0)
                        found = json_incref(r);
        json_decref(all);
        return found;
}

static long long listed_field(struct testd *d, const char *key, const char *field) {
        json_t *r = listed(d, key);
        long long v = r ? json_integer_value(json_object_get(r, field)) : -1;

        json_decref(r);
        return v;
}

START_TEST(test_put_list_delete) {
        char out[4096], args[512], metrics[1 << 16];
        struct testd d;
        json_t *r, *st;

        /* Without a state directory, nothing would outlive a restart: refused, saying so. */
        testd_start(&d, "--host-capacity", "64M", NULL);
        ck_assert_int_eq(ctl(&d, "reserve job-a device=0 guarantee=16M pod=" TEST_POD_A, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "gpupoold has no state directory (--state-dir"), "%s", out);
        ck_assert_int_eq(testd_stop(&d), 0);

        testd_start(&d, "--host-capacity", "64M", "--state-dir", state, "--config", conf_new(""), NULL);
        ck_assert_int_eq(ctl(&d, "reservations", out, sizeof(out)), 0);
        ck_assert_str_eq(out, "no reservations\n");
        ck_assert_int_eq(ctl(&d, "reserve job-a device=0 guarantee=16M limit=32M pod=" TEST_POD_A, out, sizeof(out)), 0);
        ck_assert_str_eq(out, "reserved job-a on device 0\n");
        /* A retry changes nothing; the same generation with other values, or an older one, is refused. */
        ck_assert_int_eq(ctl(&d, "reserve job-a device=0 guarantee=16M limit=32M pod=" TEST_POD_A, out, sizeof(out)), 0);
        ck_assert_str_eq(out, "job-a on device 0 was reserved already, as asked\n");
        ck_assert_int_eq(ctl(&d, "reserve job-a device=0 guarantee=16M limit=24M pod=" TEST_POD_A, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "reservation job-a is at generation 0 with other values: a change takes a higher "
                                  "generation"), "%s", out);
        ck_assert_int_eq(ctl(&d, "reserve job-a device=0 guarantee=16M limit=24M generation=2 pod=" TEST_POD_A, out,
                             sizeof(out)), 0);
        ck_assert_int_eq(ctl(&d, "reserve job-a device=0 guarantee=16M generation=1 pod=" TEST_POD_A, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "generation 1 is older"), "%s", out);
        r = listed(&d, "job-a");
        ck_assert_ptr_nonnull(r);
        ck_assert_int_eq(json_integer_value(json_object_get(r, "generation")), 2);
        ck_assert_int_eq(json_integer_value(json_object_get(r, "guarantee_bytes")), 16 * MiB);
        ck_assert_int_eq(json_integer_value(json_object_get(r, "limit_bytes")), 24 * MiB);
        ck_assert_int_eq(json_integer_value(json_object_get(r, "device")), 0);
        ck_assert_str_eq(json_string_value(json_array_get(json_object_get(r, "pod_uids"), 0)), TEST_POD_A);
        ck_assert(json_is_false(json_object_get(r, "absent")));
        json_decref(r);
        /* status --json lists them too; the tenants' list does not (a reservation is a tenant of its own kind). */
        ck_assert_int_eq(ctl(&d, "status", out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "RESERVATION ") && strstr(out, "\njob-a ") && strstr(out, TEST_POD_A), "%s", out);
        ck_assert_int_eq(ctl(&d, "reservations", out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "\njob-a ") && strstr(out, "16.0 MiB") && strstr(out, "24.0 MiB"), "%s", out);
        st = testd_ctl(&d, "status");
        ck_assert_int_eq(json_array_size(json_object_get(st, "reservations")), 1);
        ck_assert_int_eq(json_array_size(json_object_get(st, "tenants")), 1);
        json_decref(st);
        testd_metrics(&d, metrics, sizeof(metrics));
        ck_assert(metrics_value(metrics, "gpupool_reservations") == 1);
        ck_assert(metrics_value(metrics, "gpupool_reservation_guarantee_bytes{reservation=\"job-a\",device=\"0\"}") == 16 * MiB);
        ck_assert(metrics_value(metrics, "gpupool_reservation_limit_bytes{reservation=\"job-a\",device=\"0\"}") == 24 * MiB);
        ck_assert(metrics_value(metrics, "gpupool_reservation_reserved_bytes{reservation=\"job-a\",device=\"0\"}") == 0);
        ck_assert_msg(!strstr(metrics, "gpupool_tenant_clients{tenant=\"job-a\"}"), "a reservation among the tenants' series");

        /* Refusals, each saying why: the GPU's capacity, a GPU it lacks, a pod reserved already, a bad key or pod. */
        ck_assert_int_eq(ctl(&d, "reserve job-b device=0 guarantee=49M pod=" TEST_POD_B, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "the tenants' guarantees on device 0 add up to 65.0 MiB (65.0 MiB of it reservations'), "
                                  "more than its capacity of 64.0 MiB"), "%s", out);
        ck_assert_int_eq(ctl(&d, "reserve job-b device=1 guarantee=1M pod=" TEST_POD_B, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "reservation job-b: no device 1: this daemon has 1"), "%s", out);
        ck_assert_int_eq(ctl(&d, "reserve job-b device=GPU-00000000-0000-0000-0000-000000000000 guarantee=1M pod="
                             TEST_POD_B, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "reservation job-b: no GPU GPU-00000000-0000-0000-0000-000000000000 on this node"), "%s",
                      out);
        ck_assert_int_eq(ctl(&d, "reserve job-b device=0 guarantee=1M pod=" TEST_POD_A, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "pod " TEST_POD_A " has reservation job-a already: one reservation per pod"), "%s", out);
        ck_assert_int_eq(ctl(&d, "reserve job/b device=0 guarantee=1M pod=" TEST_POD_B, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "a reservation's key is 1 to 63 letters"), "%s", out);
        ck_assert_int_eq(ctl(&d, "reserve job-b device=0 guarantee=1M pod=POD-B", out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "'POD-B' is not a pod UID"), "%s", out);
        ck_assert_int_eq(ctl(&d, "reserve job-b device=0 guarantee=2M limit=1M pod=" TEST_POD_B, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "a guarantee of 2.0 MiB is more than its limit of 1.0 MiB"), "%s", out);
        /* The command line's own mistakes never reach the daemon. */
        ck_assert_int_eq(ctl(&d, "reserve job-b device=0 guarantee=1M", out, sizeof(out)), 2);
        ck_assert_msg(strstr(out, "name its pods (pod=UID, once for each) or give it a token"), "%s", out);
        ck_assert_int_eq(ctl(&d, "reserve job-b guarantee=1M pod=" TEST_POD_B, out, sizeof(out)), 2);
        ck_assert_int_eq(ctl(&d, "reserve job-b device=zero guarantee=1M pod=" TEST_POD_B, out, sizeof(out)), 2);
        ck_assert_int_eq(ctl(&d, "unreserve", out, sizeof(out)), 2);
        ck_assert_int_eq(listed_field(&d, "job-b", "device"), -1);

        /* A reservation's limits change by a put, not by set-limit; the config may not take its key. */
        ck_assert_int_eq(ctl(&d, "set-limit --tenant job-a max=1G", out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "job-a is a reservation: gpupoolctl reserve"), "%s", out);
        conf_write("[tenant:job-a]\nmatch_uid = 4242\n");
        ck_assert_int_eq(ctl(&d, "reload", out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "has the key of a reservation"), "%s", out);
        conf_write("");
        /* The file holds it as it stands. */
        snprintf(args, sizeof(args), "grep -c 'key=job-a generation=2 device=0 uuid=- guarantee=16777216 limit=25165824 "
                 "pods=%s' %s/reservations", TEST_POD_A, state);
        ck_assert_int_eq(run_capture(args, out, sizeof(out)), 0);

        /* Delete: once, then nothing to delete, which is no error. */
        ck_assert_int_eq(ctl(&d, "unreserve job-a", out, sizeof(out)), 0);
        ck_assert_str_eq(out, "deleted job-a\n");
        ck_assert_int_eq(ctl(&d, "unreserve job-a", out, sizeof(out)), 0);
        ck_assert_str_eq(out, "no reservation job-a (nothing to delete)\n");
        ck_assert_int_eq(ctl(&d, "reservations", out, sizeof(out)), 0);
        ck_assert_str_eq(out, "no reservations\n");
        ck_assert_int_eq(ctl(&d, "check", out, sizeof(out)), 0);
        ck_assert_int_eq(testd_stop(&d), 0);
        conf_remove();
}
END_TEST

/* Reservations outlive a crash of the daemon; a damaged file stops the start, naming its line. */
START_TEST(test_reservations_survive_a_crash) {
        char out[4096], cmd[1024], path[160];
        struct testd d;
        FILE *f;

        testd_start(&d, "--host-capacity", "64M", "--state-dir", state, NULL);
        ck_assert_int_eq(ctl(&d, "reserve job-a device=0 guarantee=8M limit=16M generation=3 pod=" TEST_POD_A " pod="
                             TEST_POD_B, out, sizeof(out)), 0);
        ck_assert_int_eq(ctl(&d, "reserve job-d device=0 guarantee=4M pod=" TEST_POD_D, out, sizeof(out)), 0);
        testd_crash_and_restart(&d);
        ck_assert_int_eq(listed_field(&d, "job-a", "generation"), 3);
        ck_assert_int_eq(listed_field(&d, "job-a", "limit_bytes"), 16 * MiB);
        ck_assert_int_eq(listed_field(&d, "job-d", "guarantee_bytes"), 4 * MiB);
        ck_assert(testd_log_wait(&d, "2 reservations read from"));
        /* What they guarantee still counts: a third that would pass the capacity is refused. */
        ck_assert_int_eq(ctl(&d, "reserve job-x device=0 guarantee=53M pod=ffffffff-0000-4000-8000-000000000000", out,
                             sizeof(out)), 1);
        ck_assert_int_eq(testd_stop(&d), 0);

        snprintf(path, sizeof(path), "%s/reservations", state);
        f = fopen(path, "a");
        ck_assert_ptr_nonnull(f);
        fputs("key=broken generation=1\n", f);
        fclose(f);
        snprintf(cmd, sizeof(cmd), "%s/gpupoold --backend host --socket %s/x.sock --state-dir %s 2>&1", build_dir(), state,
                 state);
        ck_assert_int_ne(run_capture(cmd, out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "/reservations:5: a reservation's line has key, generation"), "%s", out);
        /* A state directory that is no absolute path is refused as any bad option is. */
        snprintf(cmd, sizeof(cmd), "%s/gpupoold --backend host --state-dir relative 2>&1", build_dir());
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 2);
        ck_assert_msg(strstr(out, "'relative' is not an absolute path"), "%s", out);
}
END_TEST

/* A client in a pod: allocates size bytes (on a fresh handle), checks its first byte is (not) the mark, marks it, and says what it got. */
struct in_pod {
        const char *mnt, *pod;
        const char *token;              /* its $GPUPOOL_RESERVATION, or NULL */
        size_t size;
        int want_mark;                  /* 1: the mark must be there; 0: must not; -1: either */
        int up[2], go[2];
};

static int pod_client(struct testd *d, void *arg) {
        struct in_pod *a = arg;
        char dir[1024], why[512];
        gpupool_client *c;
        unsigned char *p;
        int r;
        char b;

        if (a->pod) {
                pod_cgroup_dir(false, a->mnt, a->pod, 4, dir, sizeof(dir));
                if (cgroup_join(dir, 0) < 0)
                        return 2;
        }
        if (a->token)
                setenv("GPUPOOL_RESERVATION", a->token, 1);
        r = gpupool_connect(d->sock, "in-pod", &c);
        if (r < 0) {
                gpupool_last_error(NULL, why, sizeof(why));
                dprintf(a->up[1], "%d %s", r, why);
                return 0;
        }
        r = gpupool_alloc(c, 0, a->size, (void **) &p);
        if (r < 0) {
                gpupool_last_error(c, why, sizeof(why));
                dprintf(a->up[1], "%d %s", r, why);
                return 0;
        }
        if (a->want_mark >= 0 && (p[0] == MARK) != a->want_mark)
                return 4;
        memset(p, MARK, a->size);
        dprintf(a->up[1], "0 ok");
        if (read(a->go[0], &b, 1) != 1)
                return 5;
        gpupool_free(c, p);
        gpupool_disconnect(c);
        return 0;
}

/*
 * Starts a client in pod (NULL: in the test's own cgroup) presenting token (NULL: none),
 * asking for size; its answer ("0 ok", or "-ERRNO sentence" of its connect or allocation) into
 * out. Holds until pod_done() where it got its memory.
 */
static pid_t pod_alloc_with(struct testd *d, struct in_pod *a, const char *mnt, const char *pod, const char *token,
                            size_t size, int want_mark, char *out, size_t out_size) {
        ssize_t n;
        pid_t pid;

        *a = (struct in_pod) { .mnt = mnt, .pod = pod, .token = token, .size = size, .want_mark = want_mark };
        ck_assert(pipe(a->up) == 0 && pipe(a->go) == 0);
        pid = spawn(pod_client, d, a);
        close(a->up[1]);
        close(a->go[0]);
        n = read(a->up[0], out, out_size - 1);
        ck_assert_msg(n > 0, "the client in pod %s failed with %d", pod, n > 0 ? 0 : reap(pid));
        out[n] = '\0';
        return pid;
}

static pid_t pod_alloc(struct testd *d, struct in_pod *a, const char *mnt, const char *pod, size_t size, int want_mark,
                       char *out, size_t out_size) {
        return pod_alloc_with(d, a, mnt, pod, NULL, size, want_mark, out, out_size);
}

/* A client that was refused has exited: reaps it. */
static void pod_refused(struct in_pod *a, pid_t pid) {
        ck_assert_int_eq(reap(pid), 0);
        close(a->up[0]);
        close(a->go[1]);
}

static void pod_done(struct in_pod *a, pid_t pid) {
        ck_assert_int_eq(write(a->go[1], "g", 1), 1);
        ck_assert_int_eq(reap(pid), 0);
        close(a->up[0]);
        close(a->go[1]);
}

/*
 * Two processes of one pod share its reservation's limit: 2 MiB each fills a limit of 4 MiB,
 * and the next byte is refused with a sentence naming the reservation; a greedy pod with none
 * gets only what the reservation does not keep, and the reserved pod still gets all of its own.
 */
START_TEST(test_a_reservation_holds_its_pod) {
        struct in_pod a1, a2, a3, g1, g2;
        char mnt[512], out[600];
        pid_t p1, p2, p3, q1, q2;
        struct testd d;

        if (!pods_ready(__func__, mnt, sizeof(mnt)))
                return;
        testd_start(&d, "--host-capacity", "16M", "--max-cached", "0", "--state-dir", state, NULL);
        ck_assert_int_eq(ctl(&d, "reserve job-a device=0 guarantee=4M pod=" TEST_POD_A, out, sizeof(out)), 0);
        p1 = pod_alloc(&d, &a1, mnt, TEST_POD_A, 2 * MiB, -1, out, sizeof(out));
        ck_assert_str_eq(out, "0 ok");
        p2 = pod_alloc(&d, &a2, mnt, TEST_POD_A, 2 * MiB, -1, out, sizeof(out));
        ck_assert_str_eq(out, "0 ok");
        ck_assert_int_eq(listed_field(&d, "job-a", "reserved_bytes"), 4 * MiB);
        ck_assert_int_eq(listed_field(&d, "job-a", "clients"), 2);
        p3 = pod_alloc(&d, &a3, mnt, TEST_POD_A, 1, -1, out, sizeof(out));
        ck_assert_msg(strstr(out, "-122 ") == out && strstr(out, "would take reservation job-a (3 clients of its pods) to "
                                                              "6.0 MiB reserved on device 0, over its limit of 4.0 MiB"),
                      "%s", out);
        pod_refused(&a3, p3);
        pod_done(&a2, p2);
        pod_done(&a1, p1);

        /* Pod B has no reservation: of 16 MiB, 4 are job-a's, whether its pods use them or not. */
        q1 = pod_alloc(&d, &g1, mnt, TEST_POD_B, 12 * MiB, -1, out, sizeof(out));
        ck_assert_str_eq(out, "0 ok");
        q2 = pod_alloc(&d, &g2, mnt, TEST_POD_B, 1, -1, out, sizeof(out));
        ck_assert_msg(strstr(out, "held back for other tenants' unused guarantees"), "%s", out);
        pod_refused(&g2, q2);
        p1 = pod_alloc(&d, &a1, mnt, TEST_POD_A, 4 * MiB, -1, out, sizeof(out));
        ck_assert_str_eq(out, "0 ok");
        pod_done(&a1, p1);
        pod_done(&g1, q1);
        ck_assert_int_eq(ctl(&d, "check", out, sizeof(out)), 0);
        ck_assert_int_eq(testd_stop(&d), 0);
        pods_remove(mnt);
}
END_TEST

/*
 * A put moves its pods' connected clients into it, with what they hold, and a delete moves
 * them out; the pod's memory comes back to it unzeroed, and goes to another pod zeroed.
 */
START_TEST(test_reservations_move_clients_and_zero_between_pods) {
        char mnt[512], out[600];
        struct in_pod a, b;
        struct testd d;
        pid_t p, q;
        json_t *st, *c;

        if (!pods_ready(__func__, mnt, sizeof(mnt)))
                return;
        testd_start(&d, "--host-capacity", "16M", "--max-cached", "100%", "--state-dir", state, NULL);
        p = pod_alloc(&d, &a, mnt, TEST_POD_A, 2 * MiB, 0, out, sizeof(out));
        ck_assert_str_eq(out, "0 ok");
        ck_assert_int_eq(testd_client_field(&d, p, NULL, "reserved_bytes"), 2 * MiB);
        ck_assert_int_eq(ctl(&d, "reserve job-a device=0 guarantee=2M limit=8M pod=" TEST_POD_A, out, sizeof(out)), 0);
        ck_assert_int_eq(listed_field(&d, "job-a", "reserved_bytes"), 2 * MiB);
        ck_assert_int_eq(listed_field(&d, "job-a", "clients"), 1);
        st = testd_ctl(&d, "status");
        c = status_client_by_pid(st, p);
        ck_assert_str_eq(json_string_value(json_object_get(c, "tenant")), "job-a");
        json_decref(st);
        ck_assert_int_eq(ctl(&d, "check", out, sizeof(out)), 0);
        ck_assert_int_eq(ctl(&d, "unreserve job-a", out, sizeof(out)), 0);
        st = testd_ctl(&d, "status");
        c = status_client_by_pid(st, p);
        ck_assert_str_eq(json_string_value(json_object_get(c, "tenant")), "default");
        json_decref(st);
        ck_assert_int_eq(ctl(&d, "check", out, sizeof(out)), 0);
        pod_done(&a, p);
        /* Its segment is cached, pod A's: pod A again finds its mark, pod B none of it. */
        p = pod_alloc(&d, &a, mnt, TEST_POD_A, 2 * MiB, 1, out, sizeof(out));
        ck_assert_str_eq(out, "0 ok");
        pod_done(&a, p);
        q = pod_alloc(&d, &b, mnt, TEST_POD_B, 2 * MiB, 0, out, sizeof(out));
        ck_assert_str_eq(out, "0 ok");
        pod_done(&b, q);
        ck_assert_int_eq(testd_stop(&d), 0);
        pods_remove(mnt);
}
END_TEST

#define TOKEN "tok-0123456789abcdef_TOKEN"

/*
 * A reservation by token: the first pod whose process presents it is its pod, kept across a
 * crash; the pod's other processes are its without the token; a process of another pod, or in
 * none, that presents it is refused, saying so, and the log names both pods.
 */
START_TEST(test_a_token_binds_the_first_pod) {
        char mnt[512], out[600], want[300];
        struct in_pod a, a2, b;
        struct testd d;
        pid_t p, p2, q;
        json_t *r, *st;

        if (!pods_ready(__func__, mnt, sizeof(mnt)))
                return;
        testd_start(&d, "--host-capacity", "16M", "--max-cached", "0", "--state-dir", state, NULL);
        ck_assert_int_eq(ctl(&d, "reserve job-t device=0 guarantee=2M limit=4M token=" TOKEN, out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "its pod's processes present GPUPOOL_RESERVATION=" TOKEN), "%s", out);
        r = listed(&d, "job-t");
        ck_assert(json_is_true(json_object_get(r, "token")));
        ck_assert_int_eq(json_array_size(json_object_get(r, "pod_uids")), 0);
        json_decref(r);
        ck_assert_int_eq(ctl(&d, "reservations", out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "(a token no pod has presented yet)"), "%s", out);
        /* The status of a reservation shows whether it has a token, never the token. */
        ck_assert_int_eq(ctl(&d, "--json status", out, sizeof(out)), 0);
        ck_assert_msg(!strstr(out, TOKEN), "the token shows in status: %s", out);

        /* Pod A presents it first: the reservation is pod A's. */
        p = pod_alloc_with(&d, &a, mnt, TEST_POD_A, TOKEN, 2 * MiB, -1, out, sizeof(out));
        ck_assert_str_eq(out, "0 ok");
        r = listed(&d, "job-t");
        ck_assert_str_eq(json_string_value(json_array_get(json_object_get(r, "pod_uids"), 0)), TEST_POD_A);
        json_decref(r);
        /* Another process of pod A needs no token; together they are held to the limit. */
        p2 = pod_alloc(&d, &a2, mnt, TEST_POD_A, 2 * MiB, -1, out, sizeof(out));
        ck_assert_str_eq(out, "0 ok");
        st = testd_ctl(&d, "status");
        ck_assert_str_eq(json_string_value(json_object_get(status_client_by_pid(st, p2), "tenant")), "job-t");
        json_decref(st);
        ck_assert_int_eq(listed_field(&d, "job-t", "reserved_bytes"), 4 * MiB);

        /* Pod B presents it: refused at connect, saying whose it is; the log names both pods. */
        q = pod_alloc_with(&d, &b, mnt, TEST_POD_B, TOKEN, 2 * MiB, -1, out, sizeof(out));
        snprintf(want, sizeof(want), "reservation job-t is pod %s's: this process is in pod %s", TEST_POD_A, TEST_POD_B);
        ck_assert_msg(strstr(out, "-13 ") == out && strstr(out, want), "%s", out);
        pod_refused(&b, q);
        ck_assert(testd_log_wait(&d, want));
        /* A process in no pod, and a token no reservation has, are refused too. */
        q = pod_alloc_with(&d, &b, mnt, NULL, TOKEN, 2 * MiB, -1, out, sizeof(out));
        ck_assert_msg(strstr(out, "reservation job-t is for a pod's processes, and this process is in no pod"), "%s", out);
        pod_refused(&b, q);
        q = pod_alloc_with(&d, &b, mnt, TEST_POD_B, "nobody-has-this-token", 2 * MiB, -1, out, sizeof(out));
        ck_assert_msg(strstr(out, "no reservation on this node has the token in $GPUPOOL_RESERVATION"), "%s", out);
        pod_refused(&b, q);
        pod_done(&a2, p2);
        pod_done(&a, p);

        /* The binding outlives a crash; the same token put again keeps it. */
        testd_crash_and_restart(&d);
        ck_assert_int_eq(ctl(&d, "reserve job-t device=0 guarantee=2M limit=8M generation=1 token=" TOKEN, out, sizeof(out)),
                         0);
        r = listed(&d, "job-t");
        ck_assert_str_eq(json_string_value(json_array_get(json_object_get(r, "pod_uids"), 0)), TEST_POD_A);
        ck_assert_int_eq(json_integer_value(json_object_get(r, "limit_bytes")), 8 * MiB);
        json_decref(r);
        q = pod_alloc_with(&d, &b, mnt, TEST_POD_B, TOKEN, 2 * MiB, -1, out, sizeof(out));
        ck_assert_msg(strstr(out, want), "%s", out);
        pod_refused(&b, q);
        /* Pods or a token, one of them; a token of a mistaken form is refused before the daemon. */
        ck_assert_int_eq(ctl(&d, "reserve job-u device=0 guarantee=1M", out, sizeof(out)), 2);
        ck_assert_int_eq(ctl(&d, "reserve job-u device=0 guarantee=1M token=short", out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "a token is 16 to 128 letters"), "%s", out);
        ck_assert_int_eq(ctl(&d, "reserve job-u device=0 guarantee=1M token=random", out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "GPUPOOL_RESERVATION="), "%s", out);
        ck_assert_int_eq(ctl(&d, "check", out, sizeof(out)), 0);
        ck_assert_int_eq(testd_stop(&d), 0);
        pods_remove(mnt);
}
END_TEST

Suite *suite_reserve(void) {
        Suite *s = suite_create("reserve");
        TCase *tc = tcase_create("reserve");

        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, test_put_list_delete);
        tcase_add_test(tc, test_reservations_survive_a_crash);
        tcase_add_test(tc, test_a_reservation_holds_its_pod);
        tcase_add_test(tc, test_reservations_move_clients_and_zero_between_pods);
        tcase_add_test(tc, test_a_token_binds_the_first_pod);
        suite_add_tcase(s, tc);
        return s;
}
