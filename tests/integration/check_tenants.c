/*
 * check_tenants.c: tenants, quotas and the cache's limits end to end, on the host backend:
 * a tenant's max across several processes, a guarantee holding another tenant off, the
 * ladder's counters, idle release, the watermark, reload, runtime limits and bad configs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpupool.h"
#include "suites.h"
#include "testlib.h"

#define MiB (1ULL << 20)

#define write_conf conf_write

static void start(struct testd *d, const char *conf, const char *capacity) {
        testd_start(d, "--config", conf_new(conf), "--host-capacity", capacity, NULL);
}

static void stop(struct testd *d) {
        ck_assert_int_eq(testd_stop(d), 0);
        conf_remove();
}

/* A tenant's field from "limits --json" (reserved_bytes: device 0's). */
static long long tenant_field(struct testd *d, const char *tenant, const char *key) {
        json_t *j = testd_ctl(d, "limits"), *t;
        long long v = -1;
        size_t i;

        json_array_foreach(json_object_get(j, "tenants"), i, t) {
                if (strcmp(json_string_value(json_object_get(t, "name")), tenant) != 0)
                        continue;
                if (json_is_array(json_object_get(t, key)))
                        v = json_integer_value(json_array_get(json_object_get(t, key), 0));
                else
                        v = json_integer_value(json_object_get(t, key));
        }
        json_decref(j);
        return v;
}

/* One process of a tenant: allocates size bytes as name, reports, and holds until told to go. */
struct holder {
        const char *name;
        size_t size;
        int ready[2], go[2];
};

static int holder_main(struct testd *d, void *arg) {
        struct holder *h = arg;
        gpupool_client *c;
        char ch = 'x';
        void *p;
        int r;

        if (gpupool_connect(d->sock, h->name, &c) < 0)
                return 1;
        r = gpupool_alloc(c, 0, h->size, &p);
        ch = r == 0 ? 'y' : r == -EDQUOT ? 'q' : 'n';
        if (write(h->ready[1], &ch, 1) != 1 || read(h->go[0], &ch, 1) != 1)
                return 2;
        gpupool_disconnect(c);
        return 0;
}

static pid_t hold(struct testd *d, struct holder *h, const char *name, size_t size, char *ret_result) {
        pid_t pid;

        h->name = name;
        h->size = size;
        ck_assert_int_eq(pipe(h->ready), 0);
        ck_assert_int_eq(pipe(h->go), 0);
        pid = spawn(holder_main, d, h);
        ck_assert_int_eq(read(h->ready[0], ret_result, 1), 1);
        return pid;
}

static void release(struct holder *h, pid_t pid) {
        ck_assert_int_eq(write(h->go[1], "g", 1), 1);
        ck_assert_int_eq(reap(pid), 0);
        close(h->ready[0]), close(h->ready[1]), close(h->go[0]), close(h->go[1]);
}

START_TEST(test_tenant_max_across_processes) {
        struct holder a, b;
        gpupool_client *c;
        char ra, rb, msg[512];
        struct testd d;
        pid_t pa, pb;
        void *p;

        start(&d, "[tenant:jobs]\nmatch_name = job-*\nmax = 24M\n", "256M");
        /* Two processes of one tenant: 12 MiB each fills its 24 MiB. */
        pa = hold(&d, &a, "job-a", 12 * MiB, &ra);
        pb = hold(&d, &b, "job-b", 12 * MiB, &rb);
        ck_assert_int_eq(ra, 'y');
        ck_assert_int_eq(rb, 'y');
        ck_assert_int_eq(tenant_field(&d, "jobs", "reserved_bytes"), 24 * MiB);
        ck_assert_int_eq(tenant_field(&d, "jobs", "clients"), 2);
        /* A third is refused, and told by whom and why. */
        ck_assert_int_eq(gpupool_connect(d.sock, "job-c", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 4 * MiB, &p), -EDQUOT);
        gpupool_last_error(c, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, "tenant jobs (3 clients) to 28.0 MiB reserved, over its max of 24.0 MiB"), "%s", msg);
        /* Memory outside the pool it charges meets the same max. */
        ck_assert_int_eq(gpupool_charge(c, 0, 4 * MiB), -EDQUOT);
        gpupool_last_error(c, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, "outside the pool") && strstr(msg, "over its max of 24.0 MiB"), "%s", msg);
        /* Another tenant is not held back by it. */
        {
                gpupool_client *other;

                ck_assert_int_eq(gpupool_connect(d.sock, "web", &other), 0);
                ck_assert_int_eq(gpupool_alloc(other, 0, 40 * MiB, &p), 0);
                gpupool_disconnect(other);
        }
        /* When one of the tenant leaves, the third gets its share. */
        release(&a, pa);
        ck_assert_int_eq(gpupool_alloc(c, 0, 4 * MiB, &p), 0);
        /* 12 leased by b, 4 by c, and 4 charged: the max has 4 left, not 8. */
        ck_assert_int_eq(gpupool_charge(c, 0, 4 * MiB), 0);
        ck_assert_int_eq(tenant_field(&d, "jobs", "charged_bytes"), 4 * MiB);
        ck_assert_int_eq(gpupool_charge(c, 0, 8 * MiB), -EDQUOT);
        ck_assert_int_eq(gpupool_uncharge(c, 0, 4 * MiB), 0);
        ck_assert_int_eq(tenant_field(&d, "jobs", "charged_bytes"), 0);
        gpupool_disconnect(c);
        release(&b, pb);
        ck_assert_int_eq(tenant_field(&d, "jobs", "reserved_bytes"), 0);
        stop(&d);
}
END_TEST

START_TEST(test_guarantee_holds_others_off) {
        gpupool_client *greedy, *serve;
        struct testd d;
        char msg[512];
        void *p, *q;

        start(&d, "[tenant:serve]\nmatch_name = serve\nguarantee = 32M\n", "64M");
        ck_assert_int_eq(gpupool_connect(d.sock, "greedy", &greedy), 0);
        ck_assert_int_eq(gpupool_alloc(greedy, 0, 40 * MiB, &p), -EDQUOT);
        gpupool_last_error(greedy, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, "held back for other tenants' unused guarantees"), "%s", msg);
        ck_assert_int_eq(gpupool_alloc(greedy, 0, 30 * MiB, &p), 0);
        /* The guaranteed tenant gets its 32 MiB although the device is half taken. */
        ck_assert_int_eq(gpupool_connect(d.sock, "serve", &serve), 0);
        ck_assert_int_eq(gpupool_alloc(serve, 0, 32 * MiB, &q), 0);
        ck_assert_int_eq(gpupool_free(serve, q), 0);
        gpupool_disconnect(serve);
        gpupool_disconnect(greedy);
        stop(&d);
}
END_TEST

/*
 * Charges (memory the driver made for a process outside the pool, gpupool-run's cuMemCreate)
 * count as leases of as many bytes would, one after another: against another tenant's
 * guarantee, in the guaranteed tenant's use of it, and against the device. Round six: a second
 * charge, and a lease after it, were admitted as if nothing had been charged.
 */
START_TEST(test_charges_count_as_leases) {
        gpupool_client *greedy, *serve;
        struct testd d;
        char msg[512];
        void *p, *q;

        start(&d, "[tenant:serve]\nmatch_name = serve\nguarantee = 32M\n", "64M");
        ck_assert_int_eq(gpupool_connect(d.sock, "greedy", &greedy), 0);
        ck_assert_int_eq(gpupool_charge(greedy, 0, 20 * MiB), 0);
        /* 20 charged and 32 held back of 64: not 20 more, charged or leased. */
        ck_assert_int_eq(gpupool_charge(greedy, 0, 20 * MiB), -EDQUOT);
        gpupool_last_error(greedy, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, "held back for other tenants' unused guarantees"), "%s", msg);
        ck_assert_int_eq(gpupool_alloc(greedy, 0, 16 * MiB, &p), -EDQUOT);
        ck_assert_int_eq(gpupool_alloc(greedy, 0, 10 * MiB, &p), 0);
        /* The guaranteed tenant charges half its guarantee and leases the other half. */
        ck_assert_int_eq(gpupool_connect(d.sock, "serve", &serve), 0);
        ck_assert_int_eq(gpupool_charge(serve, 0, 16 * MiB), 0);
        ck_assert_int_eq(gpupool_alloc(serve, 0, 16 * MiB, &q), 0);
        /* Past the device, a charge is refused as a lease would be: 64 MiB hold 62 now. */
        ck_assert_int_eq(gpupool_charge(serve, 0, 8 * MiB), -ENOMEM);
        gpupool_last_error(serve, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, "the device holds 64.0 MiB in all"), "%s", msg);
        ck_assert_int_eq(gpupool_free(serve, q), 0);
        ck_assert_int_eq(gpupool_free(greedy, p), 0);
        gpupool_disconnect(serve);
        gpupool_disconnect(greedy);
        stop(&d);
}
END_TEST

/*
 * Without a guarantee anywhere, charges still take the device's room as leases do (round six,
 * item 6): on the host backend, whose device the pool cannot read, 40 MiB charged of 64 leave
 * a lease of 32 MiB no room (before, the pool counted its capacity alone and leased it); the
 * device's row shows the charges, and room comes back with them.
 */
START_TEST(test_charges_take_room_without_guarantees) {
        gpupool_client *outside, *leaser;
        struct testd d;
        char msg[512];
        void *p, *q;

        start(&d, "", "64M");
        ck_assert_int_eq(gpupool_connect(d.sock, "outside", &outside), 0);
        ck_assert_int_eq(gpupool_connect(d.sock, "leaser", &leaser), 0);
        ck_assert_int_eq(gpupool_charge(outside, 0, 40 * MiB), 0);
        ck_assert_int_eq(testd_device(&d, 0, "charged_bytes"), 40 * MiB);
        ck_assert_int_eq(gpupool_alloc(leaser, 0, 32 * MiB, &p), -ENOMEM);
        gpupool_last_error(leaser, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, "device 0 is full") && strstr(msg, "(and 40.0 MiB charged outside the pool)"), "%s", msg);
        ck_assert_int_eq(gpupool_alloc(leaser, 0, 20 * MiB, &q), 0);
        /* Taken back: the room comes back. */
        ck_assert_int_eq(gpupool_uncharge(outside, 0, 40 * MiB), 0);
        ck_assert_int_eq(testd_device(&d, 0, "charged_bytes"), 0);
        ck_assert_int_eq(gpupool_alloc(leaser, 0, 32 * MiB, &p), 0);
        ck_assert_int_eq(gpupool_free(leaser, p), 0);
        ck_assert_int_eq(gpupool_free(leaser, q), 0);
        ck_assert_int_eq(gpupool_trim(leaser), 0);
        /* A charge that ends with its handle gives its room back too. */
        ck_assert_int_eq(gpupool_charge(outside, 0, 40 * MiB), 0);
        gpupool_disconnect(outside);
        ck_assert_int_eq(testd_device(&d, 0, "charged_bytes"), 0);
        json_decref(testd_ctl(&d, "check"));
        gpupool_disconnect(leaser);
        stop(&d);
}
END_TEST

START_TEST(test_cache_counters_decay_and_watermark) {
        gpupool_client *c;
        struct testd d;
        void *p[3];
        double t0;

        start(&d, "[pool]\nidle_release = 1s\nmax_cached = 16M\n", "40M");
        ck_assert_int_eq(gpupool_connect(d.sock, "cacher", &c), 0);
        /*
         * Two 12 MiB segments given back (the process keeps what empties until trimmed): 24 MiB
         * over the 16 MiB watermark, so the older goes at once.
         */
        ck_assert_int_eq(gpupool_alloc(c, 0, 12 * MiB, &p[0]), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 12 * MiB, &p[1]), 0);
        ck_assert_int_eq(gpupool_free(c, p[0]), 0);
        ck_assert_int_eq(gpupool_free(c, p[1]), 0);
        ck_assert_int_eq(gpupool_trim(c), 0);
        ck_assert_int_eq(testd_device(&d, 0, "watermark_releases_total"), 1);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 12 * MiB);
        /* 30 MiB beside the cached 12 in 40: the cache makes room (ladder step 2), counted. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 30 * MiB, &p[2]), 0);
        ck_assert_int_eq(testd_device(&d, 0, "evictions_total"), 1);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 0);
        /* Given back, the 30 MiB segment alone is over the watermark: it is not kept. */
        ck_assert_int_eq(gpupool_free(c, p[2]), 0);
        ck_assert_int_eq(gpupool_trim(c), 0);
        ck_assert_int_eq(testd_device(&d, 0, "watermark_releases_total"), 2);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 0);
        /* Idle a second in the cache, a segment goes back to the backend on the timer, with no request. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 12 * MiB, &p[0]), 0);
        ck_assert_int_eq(gpupool_free(c, p[0]), 0);
        ck_assert_int_eq(gpupool_trim(c), 0);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 12 * MiB);
        t0 = now_s();
        while (now_s() - t0 < 10 && testd_device(&d, 0, "idle_releases_total") < 1)
                ;
        ck_assert_int_eq(testd_device(&d, 0, "idle_releases_total"), 1);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 0);
        ck_assert_msg(now_s() - t0 > 0.5, "released before it was idle for a second");
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 0);
        gpupool_disconnect(c);
        stop(&d);
}
END_TEST

START_TEST(test_reload_and_runtime_limits) {
        gpupool_client *c;
        struct testd d;
        char cmd[512], out[4096];
        void *p, *q;

        start(&d, "[tenant:jobs]\nmatch_name = job\nmax = 8M\n", "256M");
        ck_assert_int_eq(gpupool_connect(d.sock, "job", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 6 * MiB, &p), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 6 * MiB, &q), -EDQUOT);

        /* Runtime: raise the tenant's max; the same client may now have more. */
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s set-limit --tenant jobs max=16M 2>&1", build_dir(), d.sock);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        ck_assert_int_eq(tenant_field(&d, "jobs", "max_bytes"), 16 * MiB);
        ck_assert_int_eq(gpupool_alloc(c, 0, 6 * MiB, &q), 0);
        ck_assert_int_eq(gpupool_free(c, q), 0);
        /* A client's own limit, by pid. */
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s set-limit --pid %d max=8M 2>&1", build_dir(), d.sock,
                 (int) getpid());
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        /* A limit bounds what is leased next: the segment the process holds empty goes back first. */
        ck_assert_int_eq(gpupool_trim(c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 6 * MiB, &q), -EDQUOT);
        /* Refusals: no such tenant, a guarantee for a pid, nothing to set. */
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s set-limit --tenant nope max=1G 2>&1", build_dir(), d.sock);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "no tenant 'nope'"), "%s", out);
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s set-limit --pid %d guarantee=1G 2>&1", build_dir(), d.sock,
                 (int) getpid());
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "a guarantee belongs to a tenant"), "%s", out);
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s set-limit --tenant jobs 2>&1", build_dir(), d.sock);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 2);

        /* Reload: the file's values come back, runtime ones go, and nobody is disconnected. */
        ck_assert_int_eq(gpupool_charge(c, 0, 1 * MiB), 0);
        write_conf("[tenant:jobs]\nmatch_name = job\nmax = 32M\n");
        kill(d.pid, SIGHUP);
        {
                double t0 = now_s();

                while (now_s() - t0 < 10 && tenant_field(&d, "jobs", "max_bytes") != 32 * MiB)
                        ;
        }
        ck_assert_int_eq(tenant_field(&d, "jobs", "max_bytes"), 32 * MiB);
        ck_assert_int_eq(tenant_field(&d, "jobs", "reserved_bytes"), 6 * MiB);  /* the client is still counted */
        ck_assert_int_eq(gpupool_alloc(c, 0, 6 * MiB, &q), 0);                 /* and its pid limit is gone */
        ck_assert_int_eq(tenant_field(&d, "jobs", "charged_bytes"), 1 * MiB);   /* its charge moved with it */
        json_decref(testd_ctl(&d, "check"));

        /* A config that does not load is refused; the running one stays. */
        write_conf("[tenant:jobs]\nmatch_name = job\nmax = lots\n");
        kill(d.pid, SIGHUP);
        {
                double t0 = now_s();

                snprintf(cmd, sizeof(cmd), "grep -c 'reload refused' %s", d.log);
                while (now_s() - t0 < 10 && run_capture(cmd, out, sizeof(out)) != 0)
                        ;
                ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        }
        ck_assert_int_eq(tenant_field(&d, "jobs", "max_bytes"), 32 * MiB);
        gpupool_disconnect(c);
        stop(&d);
}
END_TEST

/* As another uid: set-limit is refused. */
static int nobody_sets_limit(struct testd *d, void *arg) {
        const char *ctl = arg;
        char cmd[512], out[1024];

        if (setgid(65534) < 0 || setuid(65534) < 0)
                return 20;
        snprintf(cmd, sizeof(cmd), "%s --socket %s set-limit --tenant default max=1T 2>&1", ctl, d->sock);
        if (run_capture(cmd, out, sizeof(out)) != 1 || !strstr(out, "set-limit is for root"))
                return 21;
        /* The other requests that reach other clients' memory or the daemon's insides too. */
        snprintf(cmd, sizeof(cmd), "%s --socket %s trim --tenant default 2>&1", ctl, d->sock);
        if (run_capture(cmd, out, sizeof(out)) != 1 || !strstr(out, "trim is for root"))
                return 22;
        snprintf(cmd, sizeof(cmd), "%s --socket %s flush --tenant default 2>&1", ctl, d->sock);
        if (run_capture(cmd, out, sizeof(out)) != 1 || !strstr(out, "is for root"))
                return 23;
        snprintf(cmd, sizeof(cmd), "%s --socket %s check 2>&1", ctl, d->sock);
        if (run_capture(cmd, out, sizeof(out)) != 1 || !strstr(out, "check is for root"))
                return 24;
        snprintf(cmd, sizeof(cmd), "%s --socket %s reload 2>&1", ctl, d->sock);
        if (run_capture(cmd, out, sizeof(out)) != 1 || !strstr(out, "reload is for root"))
                return 26;
        /* A plain flush returns only memory nobody holds: open to all. */
        snprintf(cmd, sizeof(cmd), "%s --socket %s flush 2>&1", ctl, d->sock);
        if (run_capture(cmd, out, sizeof(out)) != 0)
                return 25;
        return 0;
}

START_TEST(test_set_limit_needs_root) {
        char src[512], ctl[256];
        struct testd d;

        if (geteuid() != 0) {
                TEST_SKIP("switching uid needs root");
                return;
        }
        start(&d, "", "64M");
        ck_assert_int_eq(chmod(d.dir, 0755), 0);
        snprintf(src, sizeof(src), "%s/gpupoolctl", build_dir());
        testd_copy_for_others(&d, src, ctl, sizeof(ctl));
        ck_assert_int_eq(reap(spawn(nobody_sets_limit, &d, ctl)), 0);
        unlink(ctl);
        stop(&d);
}
END_TEST

/*
 * Under the unit's user (User=gpupool, not root) root is still the node's operator: whether it
 * runs in the daemon's PID namespace is read without ptrace rights over it, which that user has
 * not over root's processes. Root in a PID namespace of its own (a container's) is not.
 */
START_TEST(test_root_is_the_operator_under_the_units_user) {
        char cmd[768], out[4096];
        struct testd d;

        if (geteuid() != 0) {
                TEST_SKIP("running the daemon as another user needs root");
                return;
        }
        testd_start_as(&d, 65534, NULL);
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s check 2>&1", build_dir(), d.sock);
        ck_assert_msg(run_capture(cmd, out, sizeof(out)) == 0, "%s", out);
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s set-limit --tenant default max=1G 2>&1", build_dir(), d.sock);
        ck_assert_msg(run_capture(cmd, out, sizeof(out)) == 0, "%s", out);
        snprintf(cmd, sizeof(cmd), "unshare --pid --fork %s/gpupoolctl --socket %s check 2>&1", build_dir(), d.sock);
        ck_assert_int_ne(run_capture(cmd, out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "not a process in a container"), "%s", out);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

START_TEST(test_status_and_check_config) {
        char cmd[512], out[4096], dir[128];
        const char *path;
        gpupool_client *c;
        struct testd d;
        json_t *st, *cl;
        void *p;

        start(&d, "[tenant:jobs]\nmatch_name = job-*\nmax = 1G\nguarantee = 8M\n", "64M");
        ck_assert_int_eq(gpupool_connect(d.sock, "job-1", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 3 * MiB, &p), 0);
        st = testd_ctl(&d, "status");
        cl = status_client_by_pid(st, getpid());
        ck_assert_ptr_nonnull(cl);
        ck_assert_str_eq(json_string_value(json_object_get(cl, "tenant")), "jobs");
        ck_assert_int_eq(json_array_size(json_object_get(st, "tenants")), 2);
        json_decref(st);
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s limits", build_dir(), d.sock);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "name=job-*") && strstr(out, "(everyone else)"), "%s", out);
        gpupool_disconnect(c);
        stop(&d);

        /* --check-config: good, bad with file:line, missing. */
        path = conf_new("[pool]\nidle_release = 10min\n");
        snprintf(dir, sizeof(dir), "%.*s", (int) (strrchr(path, '/') - path), path);
        snprintf(cmd, sizeof(cmd), "%s/gpupoold --config %s --check-config 2>&1", build_dir(), path);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "good (1 file, 1 tenant)"), "%s", out);
        write_conf("[pool]\nidle_release = 10 minutes\n");
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 1);
        /* As docs/cli.md shows it: file:line: what, and nothing before it. */
        ck_assert_msg(strncmp(out, path, strlen(path)) == 0 &&
                      strstr(out, "gpupoold.conf:2: idle_release: '10 minutes' is not a duration"), "%s", out);
        write_conf("[tenant:a]\nmatch_uid = 0\nguarantee = 1G\n");
        snprintf(cmd, sizeof(cmd), "%s/gpupoold --config %s --backend host --host-capacity 64M --socket %s/s.sock 2>&1", build_dir(),
                 path, dir);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "guarantees on device 0 add up to 1.0 GiB, more than its capacity of 64.0 MiB"), "%s", out);
        unlink(path);
        snprintf(cmd, sizeof(cmd), "%s/gpupoold --config %s --check-config 2>&1", build_dir(), path);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "No such file"), "%s", out);
        conf_remove();
}
END_TEST

/* A client that frees all it allocated, its pool keeping the segment, then makes no call at all. */
struct keeper {
        size_t size;
        int ready[2], go[2];
};

static int keeper_main(struct testd *d, void *arg) {
        struct keeper *k = arg;
        gpupool_client *c;
        char ch;
        void *p;

        if (gpupool_connect(d->sock, "keeper", &c) < 0 || gpupool_alloc(c, 0, k->size, &p) < 0 || gpupool_free(c, p) < 0)
                return 1;
        if (write(k->ready[1], "r", 1) != 1 || read(k->go[0], &ch, 1) != 1)
                return 2;
        gpupool_disconnect(c);
        return 0;
}

static pid_t keep(struct testd *d, struct keeper *k, size_t size) {
        pid_t pid;
        char ch;

        k->size = size;
        ck_assert_int_eq(pipe(k->ready), 0);
        ck_assert_int_eq(pipe(k->go), 0);
        pid = spawn(keeper_main, d, k);
        ck_assert_int_eq(read(k->ready[0], &ch, 1), 1);
        return pid;
}

static void unkeep(struct keeper *k, pid_t pid) {
        ck_assert_int_eq(write(k->go[1], "g", 1), 1);
        ck_assert_int_eq(reap(pid), 0);
        close(k->ready[0]), close(k->ready[1]), close(k->go[0]), close(k->go[1]);
}

START_TEST(test_reclaim_from_a_client_that_makes_no_call) {
        struct keeper k;
        gpupool_client *c;
        struct testd d;
        double t0;
        pid_t pid;
        void *p;

        /* reclaim_timeout is the default, 100 ms: the keeper's library must answer within it. */
        start(&d, "[pool]\nreclaim_timeout = 100ms\n", "64M");
        pid = keep(&d, &k, 40 * MiB);
        ck_assert_int_eq(testd_client_field(&d, pid, NULL, "reserved_bytes"), 40 * MiB);   /* held free, not cached */
        ck_assert(testd_client_becomes(&d, pid, NULL, "in_use_bytes", 0));
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 0);
        ck_assert_int_eq(gpupool_connect(d.sock, "needy", &c), 0);
        t0 = now_s();
        ck_assert_int_eq(gpupool_alloc(c, 0, 40 * MiB, &p), 0);
        ck_assert_msg(now_s() - t0 < 0.1 + 0.5, "the allocation waited %.3f s", now_s() - t0);
        ck_assert_int_eq(testd_device(&d, 0, "reclaims_total"), 1);
        ck_assert_int_eq(testd_client_field(&d, pid, NULL, "reserved_bytes"), 0);
        gpupool_disconnect(c);
        unkeep(&k, pid);
        stop(&d);
}
END_TEST

/*
 * A granule lease that does not fit waits, as one request for all its bytes, while the daemon
 * asks others for memory; what it took before it did not fit waits in the cache meanwhile.
 */
START_TEST(test_granule_lease_waits_for_reclaim) {
        struct keeper k;
        struct testd d;
        int sock;
        pid_t pid;

        start(&d, "[pool]\nreclaim_timeout = 2s\n", "64M");
        pid = keep(&d, &k, 40 * MiB);
        ck_assert(testd_client_becomes(&d, pid, NULL, "in_use_bytes", 0));
        sock = raw_hello(&d, "granules");
        raw_hold_granules(sock, 0, 20);
        ck_assert_int_eq(testd_device(&d, 0, "reclaims_total"), 1);
        ck_assert_int_eq(testd_client_field(&d, pid, NULL, "reserved_bytes"), 0);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes") - testd_device(&d, 0, "cached_bytes"), 40 * MiB);
        close(sock);
        unkeep(&k, pid);
        stop(&d);
}
END_TEST

/* Raw protocol: a return of n segments, with what the client holds on device 0 reported. */
static Gpupool__Envelope *return_call(int sock, uint64_t *ids, size_t n, uint64_t in_use, uint64_t held_free) {
        Gpupool__Usage u = GPUPOOL__USAGE__INIT;

        u.in_use_bytes = in_use;
        u.held_free_bytes = held_free;
        return raw_return(sock, ids, n, &u);
}

/* Raw protocol: sends a lease of size bytes on device 0 and leaves its answer to be read later. */
static void lease_without_waiting(int sock, uint64_t size) {
        Gpupool__LeaseRequest lr = GPUPOOL__LEASE_REQUEST__INIT;
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT;

        lr.size = size;
        req.id = 2;
        req.body_case = GPUPOOL__ENVELOPE__BODY_LEASE;
        req.lease = &lr;
        raw_send(sock, &req);
}

START_TEST(test_reclaim_times_out_and_says_so) {
        gpupool_client *c;
        struct testd d;
        char msg[GP_MAX_ERROR_BYTES];
        int sock, control;
        double t0, waited;
        void *p;

        start(&d, "[pool]\nreclaim_timeout = 300ms\n", "64M");
        sock = raw_keeper(&d, "silent", 40 * MiB, 1, NULL, &control);     /* its control channel never answers */
        ck_assert_int_eq(gpupool_connect(d.sock, "needy", &c), 0);
        t0 = now_s();
        ck_assert_int_eq(gpupool_alloc(c, 0, 40 * MiB, &p), -ENOMEM);
        waited = now_s() - t0;
        ck_assert_msg(waited >= 0.29 && waited < 5, "waited %.3f s for a 300 ms reclaim_timeout", waited);
        gpupool_last_error(c, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, "asked 1 client for 40.0 MiB they reported free, and not enough came "
                                  "back within 300 ms (reclaim_timeout)"), "%s", msg);
        /* ... and who holds the device: the silent client, with what it reported. */
        ck_assert_msg(strstr(msg, "; it is leased to client ") && strstr(msg, " 'silent' (pid ") &&
                      strstr(msg, "tenant default): 40.0 MiB, 0 B in use and 40.0 MiB free as of "), "%s", msg);
        /* Other clients were served meanwhile: parking one request does not stop the daemon. */
        ck_assert_int_eq(testd_device(&d, 0, "reclaims_total"), 0);
        /* A control channel may only answer reclaims; and it must name a client of its own process. */
        {
                Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT, *rep;
                Gpupool__Hello hello = GPUPOOL__HELLO__INIT;
                int other = raw_connect(&d);

                hello.has_control_for = 1;
                hello.control_for = 999;
                env.id = 1;
                env.body_case = GPUPOOL__ENVELOPE__BODY_HELLO;
                env.hello = &hello;
                rep = raw_call(other, &env);
                ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_INVALID);
                gpupool__envelope__free_unpacked(rep, NULL);
                close(other);
        }
        gpupool_disconnect(c);
        close(control);
        close(sock);
        stop(&d);
}
END_TEST

/*
 * A process that leases whole segments and carves them itself: leases and returns, its
 * reports in the status, bad requests, and ladder step 3 asking it for bytes on its control
 * channel, which it answers by returning segments.
 */
START_TEST(test_lease_return_and_reclaim_by_bytes) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__Hello hello = GPUPOOL__HELLO__INIT;
        Gpupool__ReclaimReply answer = GPUPOOL__RECLAIM_REPLY__INIT;
        Gpupool__Usage u[2] = { GPUPOOL__USAGE__INIT, GPUPOOL__USAGE__INIT }, *up[2] = { &u[0], &u[1] };
        uint64_t ids[257] = { 0 }, seg, client_id;
        json_t *st, *cl;
        struct testd d;
        int sock, control, needy;

        start(&d, "[pool]\nreclaim_timeout = 5s\n[tenant:lessees]\nmatch_name = lessee\n", "64M");
        hello.name = "lessee";
        sock = raw_hello_with(&d, &hello, &client_id);
        rep = raw_lease(sock, 0, 30 * MiB);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        ck_assert_uint_eq(rep->lease_reply->segment_size, 30 * MiB);
        seg = rep->lease_reply->segment_id;
        gpupool__envelope__free_unpacked(rep, NULL);
        rep = raw_lease(sock, 0, 4096);
        ck_assert_uint_eq(rep->lease_reply->segment_size, 2 * MiB);
        ids[0] = rep->lease_reply->segment_id;
        gpupool__envelope__free_unpacked(rep, NULL);

        /* Returned, a segment goes to the cache; one not leased to it is not found. */
        ids[1] = 12345;
        rep = return_call(sock, ids, 2, 10 * MiB, 20 * MiB);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        ck_assert_uint_eq(rep->return_reply->returned, 1);
        ck_assert_uint_eq(rep->return_reply->not_found, 1);
        gpupool__envelope__free_unpacked(rep, NULL);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 2 * MiB);
        st = testd_ctl(&d, "status");
        cl = status_client_by_name(st, "lessee");
        ck_assert_ptr_nonnull(cl);
        ck_assert_int_eq(json_integer_value(json_object_get(cl, "reserved_bytes")), 30 * MiB);
        ck_assert_int_eq(json_integer_value(json_object_get(cl, "reserved_bytes")), 30 * MiB);
        ck_assert_int_eq(json_integer_value(json_object_get(cl, "in_use_bytes")), 10 * MiB);
        ck_assert_int_eq(json_integer_value(json_object_get(cl, "held_free_bytes")), 20 * MiB);
        ck_assert(json_integer_value(json_object_get(cl, "report_age_ms")) < 10000);
        json_decref(st);

        /* Bad leases, returns and reports: each an error saying what was wrong, the client kept. */
        rep = raw_lease(sock, 0, 0);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_INVALID);
        gpupool__envelope__free_unpacked(rep, NULL);
        rep = raw_lease(sock, 3, 4096);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_NO_DEVICE);
        gpupool__envelope__free_unpacked(rep, NULL);
        rep = return_call(sock, ids, 257, 0, 0);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_INVALID);
        ck_assert_str_eq(rep->error, "a return names at most 256 segments");
        gpupool__envelope__free_unpacked(rep, NULL);
        env.id = 9;
        env.body_case = GPUPOOL__ENVELOPE__BODY_STATUS_REQUEST;
        {
                Gpupool__StatusRequest sr = GPUPOOL__STATUS_REQUEST__INIT;

                env.status_request = &sr;
                u[0].device = 0;
                u[1].device = 0;
                env.usage = up;
                env.n_usage = 2;
                rep = raw_call(sock, &env);
                ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_INVALID);
                ck_assert_str_eq(rep->error, "a usage report names 2 devices: this daemon has 1");
                gpupool__envelope__free_unpacked(rep, NULL);
                u[0].device = 4;
                env.n_usage = 1;
                rep = raw_call(sock, &env);
                ck_assert_str_eq(rep->error, "a usage report names device 4: this daemon has 1");
                gpupool__envelope__free_unpacked(rep, NULL);
                /* A report above what it leases is held to it. */
                u[0].device = 0;
                u[0].held_free_bytes = 1ULL << 40;
                rep = raw_call(sock, &env);
                ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
                gpupool__envelope__free_unpacked(rep, NULL);
        }
        st = testd_ctl(&d, "status");
        cl = status_client_by_name(st, "lessee");
        ck_assert_int_eq(json_integer_value(json_object_get(cl, "held_free_bytes")), 30 * MiB);
        json_decref(st);

        /* Its control channel; a return does not belong there. */
        hello.has_control_for = 1;
        hello.control_for = client_id;
        control = raw_hello_with(&d, &hello, NULL);
        rep = return_call(control, ids, 0, 0, 0);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_PROTOCOL);
        gpupool__envelope__free_unpacked(rep, NULL);
        ck_assert_ptr_null(raw_recv(control));          /* and it was dropped */
        close(control);
        control = raw_hello_with(&d, &hello, NULL);

        /* Usage reports on the control channel, with no reply: the daemon's view follows them. */
        {
                Gpupool__Envelope r = GPUPOOL__ENVELOPE__INIT;
                Gpupool__UsageReport ur = GPUPOOL__USAGE_REPORT__INIT;
                Gpupool__Usage ru = GPUPOOL__USAGE__INIT, *rup = &ru;
                int other;

                r.body_case = GPUPOOL__ENVELOPE__BODY_USAGE_REPORT;
                r.usage_report = &ur;
                r.n_usage = 1;
                r.usage = &rup;
                ru.in_use_bytes = 20 * MiB;
                ru.held_free_bytes = 10 * MiB;
                raw_send(control, &r);
                ck_assert(testd_client_becomes(&d, 0, "lessee", "held_free_bytes", 10 * MiB));
                ck_assert(testd_client_becomes(&d, 0, "lessee", "in_use_bytes", 20 * MiB));
                ru.in_use_bytes = 0;
                ru.held_free_bytes = 30 * MiB;
                raw_send(control, &r);
                ck_assert(testd_client_becomes(&d, 0, "lessee", "held_free_bytes", 30 * MiB));
                /* On a main connection it is a protocol error. */
                other = raw_hello(&d, "reporter");
                r.id = 5;
                rep = raw_call(other, &r);
                ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_PROTOCOL);
                ck_assert_str_eq(rep->error, "a usage report belongs on a control channel");
                gpupool__envelope__free_unpacked(rep, NULL);
                ck_assert_ptr_null(raw_recv(other));
                close(other);
        }

        /* 30 MiB leased, 2 MiB cached, 64 MiB in all: 40 more do not fit without it. */
        needy = raw_hello(&d, "needy");
        lease_without_waiting(needy, 40 * MiB);
        rep = raw_recv(control);
        ck_assert_ptr_nonnull(rep);
        ck_assert_int_eq(rep->body_case, GPUPOOL__ENVELOPE__BODY_RECLAIM);
        ck_assert(rep->reclaim->has_device && rep->reclaim->device == 0);
        ck_assert(rep->reclaim->has_bytes);
        ck_assert_uint_ge(rep->reclaim->bytes, 38 * MiB);      /* what the cache cannot cover */
        gpupool__envelope__free_unpacked(rep, NULL);
        /* It returns its segment, unmapped, and says it holds nothing now. */
        answer.segment_ids = &seg;
        answer.n_segment_ids = 1;
        env = (Gpupool__Envelope) GPUPOOL__ENVELOPE__INIT;
        env.version = GP_PROTOCOL_VERSION;
        env.body_case = GPUPOOL__ENVELOPE__BODY_RECLAIM_REPLY;
        env.reclaim_reply = &answer;
        u[0] = (Gpupool__Usage) GPUPOOL__USAGE__INIT;
        env.usage = up;
        env.n_usage = 1;
        raw_send(control, &env);
        rep = raw_recv(needy);
        ck_assert_ptr_nonnull(rep);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        ck_assert_uint_eq(rep->lease_reply->segment_size, 40 * MiB);
        gpupool__envelope__free_unpacked(rep, NULL);
        ck_assert_int_eq(testd_device(&d, 0, "reclaims_total"), 1);
        st = testd_ctl(&d, "status");
        cl = status_client_by_name(st, "lessee");
        ck_assert_int_eq(json_integer_value(json_object_get(cl, "reserved_bytes")), 0);
        ck_assert_int_eq(json_integer_value(json_object_get(cl, "held_free_bytes")), 0);
        json_decref(st);

        /* A tenant's flush asks for everything; what comes back goes to the backend, not the cache. */
        rep = raw_lease(sock, 0, 12 * MiB);
        seg = rep->lease_reply->segment_id;
        gpupool__envelope__free_unpacked(rep, NULL);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 0);
        {
                char cmd[512], out[512];

                snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s flush --tenant lessees 2>&1", build_dir(), d.sock);
                ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        }
        rep = raw_recv(control);
        ck_assert_int_eq(rep->body_case, GPUPOOL__ENVELOPE__BODY_RECLAIM);
        ck_assert(!rep->reclaim->has_bytes);
        gpupool__envelope__free_unpacked(rep, NULL);
        raw_send(control, &env);
        ck_assert(testd_device_becomes(&d, 0, "reserved_bytes", 40 * MiB));
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 0);
        close(needy);
        close(control);
        close(sock);
        stop(&d);
}
END_TEST

/*
 * Memory given back for a lease that waits is that lease's: while it waits, another client's
 * granule lease gets what it asks for, but nothing ahead, which would take what came back.
 * The device: 64 MiB, a keeper holding two 20 MiB segments free, a filler the rest; a lease of
 * 30 MiB waits, the keeper gives back one segment (not enough yet), a granule lease asks for 9
 * more ahead, then the keeper gives back the other: the 30 MiB fit.
 */
START_TEST(test_granules_ahead_leave_a_waiting_lease_its_memory) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__ReclaimReply answer = GPUPOOL__RECLAIM_REPLY__INIT;
        uint64_t seg[2];
        int keeper, control, filler, needy, grabber, fds[GP_WIRE_MAX_FDS];
        size_t nfds;
        struct testd d;

        start(&d, "[pool]\nreclaim_timeout = 20s\n", "64M");
        keeper = raw_keeper(&d, "keeper", 20 * MiB, 2, seg, &control);
        filler = raw_hello(&d, "filler");
        rep = raw_lease(filler, 0, 24 * MiB);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        gpupool__envelope__free_unpacked(rep, NULL);

        /* 30 MiB more do not fit: the lease waits while the keeper is asked. */
        needy = raw_hello(&d, "needy");
        lease_without_waiting(needy, 30 * MiB);
        rep = raw_recv(control);
        ck_assert_ptr_nonnull(rep);
        ck_assert_int_eq(rep->body_case, GPUPOOL__ENVELOPE__BODY_RECLAIM);
        gpupool__envelope__free_unpacked(rep, NULL);
        /* One segment back, on its main connection: 20 MiB free, the lease still waits. */
        rep = return_call(keeper, &seg[0], 1, 0, 20 * MiB);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        gpupool__envelope__free_unpacked(rep, NULL);

        /* A granule lease meanwhile: its granule, none of the 9 it asks for ahead. */
        grabber = raw_hello(&d, "grabber");
        rep = raw_lease_ahead(grabber, 0, 2 * MiB, true, 1, 9, fds, &nfds);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        ck_assert_uint_eq(rep->lease_reply->n_more_segment_ids, 0);
        ck_assert_uint_eq(nfds, 1);
        close(fds[0]);
        gpupool__envelope__free_unpacked(rep, NULL);

        /* The other segment back, as the answer: the 30 MiB fit. */
        answer.segment_ids = &seg[1];
        answer.n_segment_ids = 1;
        env.version = GP_PROTOCOL_VERSION;
        env.body_case = GPUPOOL__ENVELOPE__BODY_RECLAIM_REPLY;
        env.reclaim_reply = &answer;
        raw_send(control, &env);
        rep = raw_recv(needy);
        ck_assert_ptr_nonnull(rep);
        ck_assert_msg(rep->status == GPUPOOL__STATUS__STATUS_OK, "%s", rep->error ? rep->error : "");
        ck_assert_uint_eq(rep->lease_reply->segment_size, 30 * MiB);
        gpupool__envelope__free_unpacked(rep, NULL);

        /* Nobody waits now: granules come ahead again where they fit. */
        rep = raw_lease_ahead(grabber, 0, 2 * MiB, true, 1, 1, fds, &nfds);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        ck_assert_uint_eq(nfds, 2);
        close(fds[0]);
        close(fds[1]);
        gpupool__envelope__free_unpacked(rep, NULL);
        close(grabber);
        close(needy);
        close(filler);
        close(control);
        close(keeper);
        stop(&d);
}
END_TEST

START_TEST(test_trim_and_flush_tenant) {
        char cmd[512], out[1024];
        struct keeper k;
        struct testd d;
        double t0;
        pid_t pid;

        start(&d, "[tenant:keepers]\nmatch_name = keeper\n", "64M");
        /* trim: the kept segment comes back to the cache. */
        pid = keep(&d, &k, 12 * MiB);
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s trim --pid %d 2>&1", build_dir(), d.sock, (int) pid);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "asked 1 client to give back what it holds free"), "%s", out);
        t0 = now_s();
        while (now_s() - t0 < 10 && testd_device(&d, 0, "cached_bytes") != 12 * MiB)
                ;
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 12 * MiB);
        ck_assert_int_eq(testd_client_field(&d, pid, NULL, "reserved_bytes"), 0);
        ck_assert_int_eq(testd_device(&d, 0, "reclaims_total"), 1);
        unkeep(&k, pid);

        /* flush --tenant: kept segments go straight back to the backend; the cache is left alone. */
        pid = keep(&d, &k, 20 * MiB);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 32 * MiB);         /* 20 kept, 12 cached */
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s flush --tenant keepers 2>&1", build_dir(), d.sock);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "asked 1 client of tenant keepers to give back what it holds free"), "%s", out);
        t0 = now_s();
        while (now_s() - t0 < 10 && testd_device(&d, 0, "reserved_bytes") != 12 * MiB)
                ;
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 12 * MiB);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 12 * MiB);
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s trim --tenant nope 2>&1", build_dir(), d.sock);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 1);
        /* A pid with no client: asking nobody is an error, as set-limit --pid says. */
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s trim --pid %d 2>&1", build_dir(), d.sock, (int) getpid());
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "no client of pid "), "%s", out);
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s flush --tenant nope 2>&1", build_dir(), d.sock);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "no tenant 'nope'"), "%s", out);
        {
                gpupool_client *c = NULL;

                setenv("GPUPOOL_IDLE_RETURN", "plenty", 1);
                ck_assert_int_eq(gpupool_connect(d.sock, "bad-env", &c), -EINVAL);
                unsetenv("GPUPOOL_IDLE_RETURN");
                ck_assert_ptr_null(c);
        }
        unkeep(&k, pid);
        stop(&d);
}
END_TEST

/*
 * A reload makes the tenants anew: a named object's bytes leave the old tenant and join the new
 * one like a client's, so that the tenant counts them once, not zero times.
 */
START_TEST(test_reload_keeps_objects_counted) {
        gpupool_client *c;
        struct testd d;
        char cmd[512], out[4096];
        long long held;
        void *p;

        start(&d, "[tenant:jobs]\nmatch_name = job\n", "64M");
        ck_assert_int_eq(gpupool_connect(d.sock, "job", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 2 * MiB, &p), 0);
        ck_assert_int_eq(gpupool_publish(c, "weights", p, 2 * MiB), 0);
        held = tenant_field(&d, "jobs", "reserved_bytes");
        ck_assert_int_ge(held, 2 * MiB);
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s reload 2>&1", build_dir(), d.sock);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        ck_assert_int_eq(tenant_field(&d, "jobs", "reserved_bytes"), held);
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s check 2>&1", build_dir(), d.sock);
        ck_assert_msg(run_capture(cmd, out, sizeof(out)) == 0, "%s", out);
        gpupool_disconnect(c);
        stop(&d);
}
END_TEST

Suite *suite_tenants(void) {
        Suite *s = suite_create("tenants");
        TCase *tc = tcase_create("host");

        tcase_add_test(tc, test_tenant_max_across_processes);
        tcase_add_test(tc, test_guarantee_holds_others_off);
        tcase_add_test(tc, test_charges_count_as_leases);
        tcase_add_test(tc, test_charges_take_room_without_guarantees);
        tcase_add_test(tc, test_cache_counters_decay_and_watermark);
        tcase_add_test(tc, test_reload_and_runtime_limits);
        tcase_add_test(tc, test_set_limit_needs_root);
        tcase_add_test(tc, test_root_is_the_operator_under_the_units_user);
        tcase_add_test(tc, test_status_and_check_config);
        tcase_add_test(tc, test_granule_lease_waits_for_reclaim);
        tcase_add_test(tc, test_reclaim_from_a_client_that_makes_no_call);
        tcase_add_test(tc, test_reclaim_times_out_and_says_so);
        tcase_add_test(tc, test_lease_return_and_reclaim_by_bytes);
        tcase_add_test(tc, test_granules_ahead_leave_a_waiting_lease_its_memory);
        tcase_add_test(tc, test_trim_and_flush_tenant);
        tcase_add_test(tc, test_reload_keeps_objects_counted);
        tcase_set_timeout(tc, 120);
        suite_add_tcase(s, tc);
        return s;
}
