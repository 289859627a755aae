/*
 * check_policy.c: the daemon's decisions (daemon/policy.c), which do no I/O: which tenant a
 * client is, how far its limits, its tenant's max and the others' guarantees let it lease
 * (admission) and what a refusal is counted as, whom to ask for memory back and in what order,
 * the cache's watermark, runtime limit changes and their refusals, and the pool's rules (the
 * size of a new segment, which cached one serves).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "heap.h"
#include "policy.h"
#include "suites.h"

#define MiB (1ULL << 20)
#define GiB (1ULL << 30)

static struct config conf;
static struct policy p;

/* A config of no tenant but default, limits as the defaults have them. */
static void conf_reset(void) {
        memset(&conf, 0, sizeof(conf));
        strcpy(conf.tenants[0].name, "default");
        conf.tenant_count = 1;
}

/* Adds a tenant matched by client name (a glob), with its max, guarantee and client_max (0: none, unset). */
static void conf_tenant(const char *name, const char *match_name, uint64_t max, uint64_t guarantee, uint64_t client_max) {
        struct tenant_conf *t = &conf.tenants[conf.tenant_count++];

        snprintf(t->name, sizeof(t->name), "%s", name);
        t->match_name_set = true;
        snprintf(t->match_name, sizeof(t->match_name), "%s", match_name);
        t->max_bytes = max;
        t->guarantee_bytes = guarantee;
        t->client_max_set = client_max != 0;
        t->client_max_bytes = client_max;
}

/* The policy of conf over devices of the given capacities. */
static void policy_over(unsigned devices, const uint64_t *capacity) {
        memset(&p, 0, sizeof(p));
        p.device_count = devices;
        for (unsigned d = 0; d < devices; d++)
                p.capacity_bytes[d] = capacity[d];
        policy_configure(&p, &conf);
}

START_TEST(test_tenant_for) {
        uint64_t cap[1] = { 80 * GiB };
        struct tenant_conf *by_uid;

        conf_reset();
        conf_tenant("train", "train-*", 0, 0, 0);
        conf_tenant("trainers", "train*", 0, 0, 0);
        by_uid = &conf.tenants[conf.tenant_count++];
        strcpy(by_uid->name, "uid1000");
        by_uid->match_uid_set = true;
        by_uid->match_uid = 1000;
        policy_over(1, cap);
        /* The first tenant whose rules all hold, in the file's order; default when none does. */
        ck_assert_str_eq(policy_tenant_for(&p, 1000, 1000, "train-a", NULL, NULL)->conf.name, "train");
        ck_assert_str_eq(policy_tenant_for(&p, 1000, 1000, "trainer", NULL, NULL)->conf.name, "trainers");
        ck_assert_str_eq(policy_tenant_for(&p, 1000, 1000, "serve", NULL, NULL)->conf.name, "uid1000");
        ck_assert_str_eq(policy_tenant_for(&p, 1001, 1001, "serve", NULL, NULL)->conf.name, "default");
        ck_assert_ptr_eq(policy_tenant_by_name(&p, "trainers"), &p.tenants[2]);
        ck_assert_ptr_null(policy_tenant_by_name(&p, "nobody"));
}
END_TEST

START_TEST(test_admit) {
        uint64_t cap[1] = { 80 * GiB };
        struct pool_stats st = { .total_bytes = 80 * GiB };
        struct pool_owner owner = { .reserved_bytes = 2 * GiB };
        struct policy_admission a;
        struct tenant *train, *serve;
        char why[256];

        conf_reset();
        conf.options.client_limit_bytes = 8 * GiB;
        conf_tenant("train", "train-*", 40 * GiB, 0, 30 * GiB);
        conf_tenant("serve", "serve-*", 0, 20 * GiB, 0);
        policy_over(1, cap);
        ck_assert_int_eq(policy_check_guarantees(&p, why, sizeof(why)), 0);
        train = policy_tenant_for(&p, 1000, 1000, "train-a", NULL, NULL);
        serve = policy_tenant_for(&p, 1000, 1000, "serve-b", NULL, NULL);
        ck_assert_uint_eq(policy_client_limit(&p, train, POLICY_NO_OVERRIDE), 30 * GiB);
        ck_assert_uint_eq(policy_client_limit(&p, &p.tenants[0], POLICY_NO_OVERRIDE), 8 * GiB);
        ck_assert_uint_eq(policy_client_limit(&p, train, 1 * GiB), 1 * GiB);

        /* The client's limit binds first: 30G less its 2G, and the refusal names it and where it comes from. */
        train->sums[0].reserved_bytes = 2 * GiB;
        st.reserved_bytes = 2 * GiB;
        policy_admit(&p, train, POLICY_NO_OVERRIDE, 0, 0, &owner, 0, &st, &a);
        ck_assert_uint_eq(a.headroom_bytes, 28 * GiB);
        ck_assert_int_eq(a.bound, POLICY_CLIENT);
        ck_assert_uint_eq(a.limit_bytes, 30 * GiB);
        ck_assert_uint_eq(a.used_bytes, 2 * GiB);
        ck_assert_int_eq(a.client_limit_from, POLICY_LIMIT_TENANT);
        policy_admit(&p, train, 3 * GiB, 0, 0, &owner, 0, &st, &a);
        ck_assert_uint_eq(a.headroom_bytes, 1 * GiB);
        ck_assert_int_eq(a.client_limit_from, POLICY_LIMIT_PID);
        /* A set-limit --pid is the process's: its other connections' bytes count against it, and only against it. */
        policy_admit(&p, train, 3 * GiB, 1 * GiB, 0, &owner, 0, &st, &a);
        ck_assert_uint_eq(a.headroom_bytes, 0);
        ck_assert_uint_eq(a.used_bytes, 3 * GiB);
        policy_admit(&p, train, POLICY_NO_OVERRIDE, 1 * GiB, 0, &owner, 0, &st, &a);
        ck_assert_uint_eq(a.headroom_bytes, 28 * GiB);
        /* A set-limit --pid of 0 is no limit: the tenant's max binds instead. */
        policy_admit(&p, train, 0, 0, 0, &owner, 0, &st, &a);
        ck_assert_int_eq(a.bound, POLICY_TENANT);
        ck_assert_uint_eq(a.headroom_bytes, 38 * GiB);
        policy_admit(&p, &p.tenants[0], POLICY_NO_OVERRIDE, 0, 0, &owner, 0, &st, &a);
        ck_assert_uint_eq(a.headroom_bytes, 6 * GiB);
        ck_assert_int_eq(a.client_limit_from, POLICY_LIMIT_DEFAULT);
        /* Then the tenant's max, over all its clients. */
        train->sums[0].reserved_bytes = 35 * GiB;
        st.reserved_bytes = 35 * GiB;
        policy_admit(&p, train, POLICY_NO_OVERRIDE, 0, 0, &owner, 0, &st, &a);
        ck_assert_uint_eq(a.headroom_bytes, 5 * GiB);
        ck_assert_int_eq(a.bound, POLICY_TENANT);
        ck_assert_uint_eq(a.limit_bytes, 40 * GiB);
        ck_assert_uint_eq(a.used_bytes, 35 * GiB);
        /* Over it (a reload lowered it): no room at all, never a wrapped one. */
        train->sums[0].reserved_bytes = 45 * GiB;
        policy_admit(&p, train, POLICY_NO_OVERRIDE, 0, 0, &owner, 0, &st, &a);
        ck_assert_uint_eq(a.headroom_bytes, 0);
        train->sums[0].reserved_bytes = 35 * GiB;
        /* Then serve's unused 20G guarantee: default may not eat into it. */
        owner.reserved_bytes = 0;
        st.reserved_bytes = 55 * GiB;
        st.cached_bytes = 2 * GiB;      /* the cache can be released: it does not count */
        policy_admit(&p, &p.tenants[0], POLICY_NO_OVERRIDE, 0, 0, &owner, 0, &st, &a);
        ck_assert_uint_eq(a.headroom_bytes, 80 * GiB - 53 * GiB - 20 * GiB);
        ck_assert_int_eq(a.bound, POLICY_GUARANTEES);
        ck_assert_uint_eq(a.held_back_bytes, 20 * GiB);
        ck_assert_uint_eq(a.used_bytes, 53 * GiB + 20 * GiB);
        ck_assert_uint_eq(a.limit_bytes, 80 * GiB);
        ck_assert_uint_eq(policy_held_for_others(&p, &p.tenants[0], 0), 20 * GiB);
        /* What serve uses of its guarantee is held back no more. */
        serve->sums[0].reserved_bytes = 15 * GiB;
        ck_assert_uint_eq(policy_held_for_others(&p, &p.tenants[0], 0), 5 * GiB);
        ck_assert_uint_eq(policy_held_for_others(&p, serve, 0), 0);
        serve->sums[0].reserved_bytes = 0;
        /*
         * Charges count as leases of as many bytes would: serve's uses its guarantee, and every
         * tenant's takes the device (round six: charges were admitted as if none came before).
         */
        serve->charged_bytes[0] = 15 * GiB;
        ck_assert_uint_eq(policy_held_for_others(&p, &p.tenants[0], 0), 5 * GiB);
        ck_assert_uint_eq(policy_charged_bytes(&p, 0), 15 * GiB);
        serve->charged_bytes[0] = 0;
        p.tenants[0].charged_bytes[0] = 4 * GiB;
        ck_assert_uint_eq(policy_charged_bytes(&p, 0), 4 * GiB);
        policy_admit(&p, &p.tenants[0], POLICY_NO_OVERRIDE, 0, 0, &owner, 0, &st, &a);
        ck_assert_int_eq(a.bound, POLICY_GUARANTEES);
        ck_assert_uint_eq(a.headroom_bytes, 80 * GiB - 53 * GiB - 4 * GiB - 20 * GiB);
        p.tenants[0].charged_bytes[0] = 0;
        /* ... while nothing of policy's holds serve back: the device's free memory is the limit. */
        p.client_limit_bytes = 0;
        policy_admit(&p, serve, POLICY_NO_OVERRIDE, 0, 0, &owner, 0, &st, &a);
        ck_assert_uint_eq(a.headroom_bytes, UINT64_MAX);
        ck_assert_int_eq(a.bound, POLICY_UNBOUND);
        /* Guarantees beyond a device are refused. */
        serve->guarantee_bytes = 81 * GiB;
        ck_assert_int_eq(policy_check_guarantees(&p, why, sizeof(why)), -EINVAL);
        ck_assert_msg(strstr(why, "on device 0 add up to 81.0 GiB, more than its capacity"), "%s", why);
}
END_TEST

/*
 * A tenant of one device (device = 1, as a reservation is its pod's tenant on one GPU): its
 * guarantee is held back on that device alone, its clients hold nothing on another, and the
 * guarantees are summed per device.
 */
START_TEST(test_tenant_of_one_device) {
        uint64_t cap[2] = { 80 * GiB, 80 * GiB };
        struct pool_stats st = { .total_bytes = 80 * GiB };
        struct pool_owner owner = { 0 };
        struct policy_admission a;
        struct tenant *one, *zero;
        char why[256];

        conf_reset();
        conf_tenant("one", "one-*", 0, 60 * GiB, 0);
        conf.tenants[1].device_set = true;
        conf.tenants[1].device = 1;
        conf_tenant("zero", "zero-*", 0, 60 * GiB, 0);
        conf.tenants[2].device_set = true;
        conf.tenants[2].device = 0;
        policy_over(2, cap);
        /* 60 on each device, not 120 on both. */
        ck_assert_msg(policy_check_guarantees(&p, why, sizeof(why)) == 0, "%s", why);
        one = policy_tenant_for(&p, 1000, 1000, "one-a", NULL, NULL);
        zero = policy_tenant_for(&p, 1000, 1000, "zero-a", NULL, NULL);
        ck_assert(tenant_on(one, 1) && !tenant_on(one, 0) && tenant_on(&p.tenants[0], 0));
        ck_assert_uint_eq(tenant_guarantee(one, 0), 0);
        ck_assert_uint_eq(tenant_guarantee(one, 1), 60 * GiB);
        ck_assert_uint_eq(policy_held_for_others(&p, &p.tenants[0], 0), 60 * GiB);
        ck_assert_uint_eq(policy_held_for_others(&p, &p.tenants[0], 1), 60 * GiB);
        ck_assert_uint_eq(policy_held_for_others(&p, zero, 1), 60 * GiB);
        ck_assert_uint_eq(policy_held_for_others(&p, zero, 0), 0);
        /* On its device, as any tenant; on the other, no room, whatever the limits say. */
        policy_admit(&p, one, POLICY_NO_OVERRIDE, 0, 0, &owner, 1, &st, &a);
        ck_assert_int_eq(a.bound, POLICY_UNBOUND);
        policy_admit(&p, one, POLICY_NO_OVERRIDE, 0, 0, &owner, 0, &st, &a);
        ck_assert_uint_eq(a.headroom_bytes, 0);
        ck_assert_int_eq(a.bound, POLICY_OTHER_DEVICE);
        ck_assert_int_eq(policy_refusal_of(a.bound), POLICY_REFUSED_TENANT_LIMIT);
        /* What it leases past its guarantee there is its excess there only. */
        one->sums[1].reserved_bytes = 70 * GiB;
        ck_assert_uint_eq(policy_reclaim_order(&p.tenants[0], 1, &(struct policy_candidate) { .tenant = one }, 1), 1);
        /* A third guarantee on device 1 would pass it; a tenant for a device the daemon lacks is refused. */
        one->guarantee_bytes = 81 * GiB;
        ck_assert_int_eq(policy_check_guarantees(&p, why, sizeof(why)), -EINVAL);
        ck_assert_msg(strstr(why, "on device 1 add up to 81.0 GiB"), "%s", why);
        one->guarantee_bytes = 60 * GiB;
        p.tenants[1].conf.device = 2;
        ck_assert_int_eq(policy_check_guarantees(&p, why, sizeof(why)), -EINVAL);
        ck_assert_msg(strstr(why, "tenant one is for device 2, and the daemon has 2 devices (0 to 1)"), "%s", why);
}
END_TEST

/* A reservation's tenant: its pods before any rule of the config, on its device alone, its guarantee counted there. */
START_TEST(test_reservation_tenants) {
        static const char pod_a[] = "0a1b2c3d-0000-4000-8000-00000000000a", pod_b[] = "0a1b2c3d-0000-4000-8000-00000000000b";
        static struct reservations rs;
        uint64_t cap[2] = { 80 * GiB, 80 * GiB };
        struct reservation r = { .device = 1, .guarantee_bytes = 30 * GiB, .limit_bytes = 40 * GiB, .pod_count = 1 };
        struct tenant *t;
        char why[300];

        conf_reset();
        conf_tenant("train", "train-*", 0, 50 * GiB, 0);
        policy_over(2, cap);
        memset(&rs, 0, sizeof(rs));
        strcpy(r.key, "job-a");
        strcpy(r.pods[0], pod_a);
        ck_assert_int_eq(reservations_put(&rs, &r, why, sizeof(why)), 1);
        policy_reserve(&p, &rs);
        ck_assert_uint_eq(p.tenant_count, 3);
        ck_assert_uint_eq(p.config_tenant_count, 2);
        ck_assert_msg(policy_check_guarantees(&p, why, sizeof(why)) == 0, "%s", why);
        /* Its pod's clients are its, whatever their names say; another pod's and a client in no pod follow the rules. */
        t = policy_tenant_for(&p, 0, 0, "train-a", NULL, pod_a);
        ck_assert_str_eq(t->conf.name, "job-a");
        ck_assert_ptr_eq(t->reservation, &rs.r[0]);
        ck_assert_str_eq(policy_tenant_for(&p, 0, 0, "train-a", NULL, pod_b)->conf.name, "train");
        ck_assert_str_eq(policy_tenant_for(&p, 0, 0, "serve", NULL, "")->conf.name, "default");
        ck_assert_ptr_eq(policy_tenant_by_name(&p, "job-a"), t);
        ck_assert(tenant_on(t, 1) && !tenant_on(t, 0));
        ck_assert_uint_eq(t->max_bytes, 40 * GiB);
        ck_assert_uint_eq(policy_held_for_others(&p, &p.tenants[0], 1), 80 * GiB);
        ck_assert_uint_eq(policy_held_for_others(&p, &p.tenants[0], 0), 50 * GiB);

        /* A guarantee that passes the device's capacity with the config's is refused, saying how much is reservations'. */
        r.generation = 1;
        r.guarantee_bytes = r.limit_bytes = 21 * GiB;
        strcpy(r.key, "job-b");
        strcpy(r.pods[0], pod_b);
        ck_assert_int_eq(reservations_put(&rs, &r, why, sizeof(why)), 1);
        policy_reserve(&p, &rs);
        ck_assert_int_eq(policy_check_guarantees(&p, why, sizeof(why)), -EINVAL);
        ck_assert_msg(strstr(why, "on device 1 add up to 101.0 GiB (51.0 GiB of it reservations'), more than its capacity of "
                                  "80.0 GiB"), "%s", why);
        /* A reservation whose GPU is gone makes no tenant; the others keep theirs. */
        rs.r[0].absent = true;
        policy_reserve(&p, &rs);
        ck_assert_uint_eq(p.tenant_count, 3);
        ck_assert_str_eq(p.tenants[2].conf.name, "job-b");
        ck_assert_str_eq(policy_tenant_for(&p, 0, 0, "x", NULL, pod_a)->conf.name, "default");
        ck_assert_msg(policy_check_guarantees(&p, why, sizeof(why)) == 0, "%s", why);
        /* The config's tenants may not take a reservation's key. */
        strcpy(p.tenants[1].conf.name, "job-b");
        strcpy(p.tenants[1].conf.where, "gpupoold.conf:3");
        ck_assert_int_eq(policy_check_guarantees(&p, why, sizeof(why)), -EINVAL);
        ck_assert_msg(strstr(why, "tenant job-b (gpupoold.conf:3) has the key of a reservation"), "%s", why);
        /* A reload's configure drops them: the caller reserves again. */
        policy_configure(&p, &conf);
        ck_assert_uint_eq(p.tenant_count, 2);
}
END_TEST

/* What each bound is counted as in gpupool_refusals_total. */
START_TEST(test_refusal_of) {
        ck_assert_int_eq(policy_refusal_of(POLICY_CLIENT), POLICY_REFUSED_CLIENT_LIMIT);
        ck_assert_int_eq(policy_refusal_of(POLICY_TENANT), POLICY_REFUSED_TENANT_LIMIT);
        ck_assert_int_eq(policy_refusal_of(POLICY_GUARANTEES), POLICY_REFUSED_GUARANTEES);
}
END_TEST

START_TEST(test_reclaim_order) {
        uint64_t cap[1] = { 80 * GiB };
        struct tenant *train, *serve, *dflt;
        int a = 0, b = 1, c = 2, d = 3, e = 4;
        struct policy_candidate cand[5];
        size_t n;

        conf_reset();
        conf_tenant("train", "train-*", 0, 10 * GiB, 0);
        conf_tenant("serve", "serve-*", 0, 20 * GiB, 0);
        policy_over(1, cap);
        train = policy_tenant_by_name(&p, "train");
        serve = policy_tenant_by_name(&p, "serve");
        dflt = &p.tenants[0];
        train->sums[0].reserved_bytes = 14 * GiB;       /* 4G over */
        serve->sums[0].reserved_bytes = 12 * GiB;       /* under: what it frees stays held back for it */
        dflt->sums[0].reserved_bytes = 6 * GiB;         /* 6G over (no guarantee) */
        cand[0] = (struct policy_candidate) { .tenant = serve, .held_free_bytes = 8 * GiB, .client = &a };
        cand[1] = (struct policy_candidate) { .tenant = train, .held_free_bytes = 1 * GiB, .client = &b };
        cand[2] = (struct policy_candidate) { .tenant = dflt, .held_free_bytes = 0, .client = &c };
        cand[3] = (struct policy_candidate) { .tenant = train, .held_free_bytes = 3 * GiB, .client = &d };
        cand[4] = (struct policy_candidate) { .tenant = dflt, .held_free_bytes = 1 * GiB, .client = &e };

        /* For a default client: the tenants over their guarantee, largest free first, then the larger excess. */
        n = policy_reclaim_order(dflt, 0, cand, 5);
        ck_assert_uint_eq(n, 4);
        ck_assert_ptr_eq(cand[0].client, &d);
        ck_assert_ptr_eq(cand[1].client, &e);   /* 1G free like b, and default is further over */
        ck_assert_ptr_eq(cand[2].client, &b);
        ck_assert_ptr_eq(cand[3].client, &c);
        ck_assert_uint_eq(cand[1].excess_bytes, 6 * GiB);

        /* For a serve client, serve's own free memory serves too, after the tenants over their guarantee. */
        cand[0] = (struct policy_candidate) { .tenant = serve, .held_free_bytes = 8 * GiB, .client = &a };
        cand[1] = (struct policy_candidate) { .tenant = train, .held_free_bytes = 1 * GiB, .client = &b };
        n = policy_reclaim_order(serve, 0, cand, 2);
        ck_assert_uint_eq(n, 2);
        ck_assert_ptr_eq(cand[0].client, &b);
        ck_assert_ptr_eq(cand[1].client, &a);
        ck_assert_uint_eq(policy_reclaim_order(serve, 0, cand, 0), 0);

        /* For the headroom (no requester): only tenants over their guarantee give anything back. */
        cand[0] = (struct policy_candidate) { .tenant = serve, .held_free_bytes = 8 * GiB, .client = &a };
        cand[1] = (struct policy_candidate) { .tenant = train, .held_free_bytes = 1 * GiB, .client = &b };
        n = policy_reclaim_order(NULL, 0, cand, 2);
        ck_assert_uint_eq(n, 1);
        ck_assert_ptr_eq(cand[0].client, &b);
}
END_TEST

START_TEST(test_max_cached) {
        uint64_t cap[2] = { 80 * GiB, 8 * GiB };

        conf_reset();
        conf.options.max_cached_percent = 25;
        policy_over(2, cap);
        ck_assert_uint_eq(policy_max_cached(&p, 0), 20 * GiB);
        ck_assert_uint_eq(policy_max_cached(&p, 1), 2 * GiB);
        conf.options.max_cached_percent = 0;
        conf.options.max_cached_bytes = 3 * GiB;
        policy_over(2, cap);
        ck_assert_uint_eq(policy_max_cached(&p, 0), 3 * GiB);
        ck_assert_uint_eq(policy_max_cached(&p, 1), 3 * GiB);
}
END_TEST

/* set-limit of a tenant: what is refused changes nothing; what is taken holds until policy_configure() (a reload). */
START_TEST(test_set_tenant_limits) {
        uint64_t cap[2] = { 80 * GiB, 40 * GiB };
        struct tenant *train, *serve;
        char why[256];

        conf_reset();
        conf_tenant("train", "train-*", 40 * GiB, 10 * GiB, 0);
        conf_tenant("serve", "serve-*", 0, 20 * GiB, 0);
        policy_over(2, cap);
        train = policy_tenant_by_name(&p, "train");
        serve = policy_tenant_by_name(&p, "serve");

        ck_assert_int_eq(policy_set_tenant_limits(&p, train, 8 * GiB, 10 * GiB, why, sizeof(why)), -EINVAL);
        ck_assert_msg(strstr(why, "tenant train: a guarantee of 10.0 GiB is more than its max of 8.0 GiB"), "%s", why);
        ck_assert_uint_eq(train->max_bytes, 40 * GiB);
        ck_assert(!train->overridden);
        /* 25G + 20G is more than the smaller device's 40G. */
        ck_assert_int_eq(policy_set_tenant_limits(&p, train, 40 * GiB, 25 * GiB, why, sizeof(why)), -EINVAL);
        ck_assert_msg(strstr(why, "the tenants' guarantees on device 1 add up to 45.0 GiB, more than its capacity of 40.0 GiB"), "%s", why);
        ck_assert_uint_eq(train->guarantee_bytes, 10 * GiB);
        ck_assert_uint_eq(train->max_bytes, 40 * GiB);
        ck_assert(!train->overridden);

        ck_assert_int_eq(policy_set_tenant_limits(&p, train, 30 * GiB, 20 * GiB, why, sizeof(why)), 0);
        ck_assert_uint_eq(train->max_bytes, 30 * GiB);
        ck_assert_uint_eq(train->guarantee_bytes, 20 * GiB);
        ck_assert(train->overridden);
        /* A max of 0 is none: any guarantee that fits goes with it. */
        ck_assert_int_eq(policy_set_tenant_limits(&p, serve, 0, 20 * GiB, why, sizeof(why)), 0);
        ck_assert_uint_eq(serve->max_bytes, 0);
        /* A reload puts the file's back. */
        policy_configure(&p, &conf);
        ck_assert_uint_eq(train->max_bytes, 40 * GiB);
        ck_assert_uint_eq(train->guarantee_bytes, 10 * GiB);
        ck_assert(!train->overridden);
}
END_TEST

/* The size of a new segment: the class's where the limit allows, else the smallest that serves. */
START_TEST(test_segment_bytes) {
        ck_assert_uint_eq(policy_segment_bytes(4096, UINT64_MAX), 2 * MiB);
        ck_assert_uint_eq(policy_segment_bytes(1 * MiB, UINT64_MAX), 2 * MiB);
        ck_assert_uint_eq(policy_segment_bytes(1 * MiB + 512, UINT64_MAX), 20 * MiB);
        ck_assert_uint_eq(policy_segment_bytes(10 * MiB, UINT64_MAX), 20 * MiB);
        ck_assert_uint_eq(policy_segment_bytes(10 * MiB + 512, UINT64_MAX), 12 * MiB);
        ck_assert_uint_eq(policy_segment_bytes(10 * MiB, 20 * MiB), 20 * MiB);
        /* Less room than the class: the smallest that serves, 2 MiB multiples. */
        ck_assert_uint_eq(policy_segment_bytes(10 * MiB, 20 * MiB - 1), 10 * MiB);
        ck_assert_uint_eq(policy_segment_bytes(3 * MiB, 4 * MiB), 4 * MiB);
        ck_assert_uint_eq(policy_segment_bytes(4096, 0), 2 * MiB);      /* the caller refuses what does not fit at all */
        ck_assert_uint_eq(heap_min_segment_bytes(heap_round(3 * MiB)), 4 * MiB);
}
END_TEST

/* Which cached segment serves a new one: want to a quarter more, never less. */
START_TEST(test_cache_serves) {
        ck_assert(policy_cache_serves(2 * MiB, 2 * MiB));
        ck_assert(policy_cache_serves(20 * MiB, 16 * MiB));
        ck_assert(!policy_cache_serves(20 * MiB + 512, 16 * MiB));
        ck_assert(!policy_cache_serves(20 * MiB, 2 * MiB));     /* a 20 MiB segment is not spent on a small request */
        ck_assert(!policy_cache_serves(2 * MiB, 4 * MiB));
        ck_assert(policy_cache_serves(UINT64_MAX / 2, UINT64_MAX / 2));
}
END_TEST

/* An object of a tenant under its guarantee goes only for that tenant's clients; over it, for anyone's. */
START_TEST(test_object_serves) {
        uint64_t cap[1] = { 80 * GiB };
        struct tenant *keep, *dflt;

        conf_reset();
        conf_tenant("keep", "keep-*", 0, 40 * GiB, 0);
        policy_over(1, cap);
        keep = policy_tenant_by_name(&p, "keep");
        dflt = &p.tenants[0];
        keep->sums[0].reserved_bytes = 40 * GiB;
        ck_assert(!policy_object_serves(keep, dflt, 0));
        ck_assert(policy_object_serves(keep, keep, 0));
        keep->sums[0].reserved_bytes = 41 * GiB;
        ck_assert(policy_object_serves(keep, dflt, 0));
        dflt->sums[0].reserved_bytes = 1 * GiB;
        ck_assert(policy_object_serves(dflt, keep, 0));         /* default has no guarantee: what it holds is over it */
}
END_TEST

/* An object nobody attached for idle_objects may be evicted; with 0, never. */
START_TEST(test_object_evictable) {
        ck_assert(!policy_object_evictable(0, 0, 1000000));
        ck_assert(!policy_object_evictable(100, 1000, 1099));
        ck_assert(policy_object_evictable(100, 1000, 1100));
        ck_assert(!policy_object_evictable(100, 2000, 1000));  /* a clock that went back: not idle */
}
END_TEST

Suite *suite_policy(void) {
        Suite *s = suite_create("policy");
        TCase *tc = tcase_create("policy");

        tcase_add_test(tc, test_tenant_for);
        tcase_add_test(tc, test_admit);
        tcase_add_test(tc, test_tenant_of_one_device);
        tcase_add_test(tc, test_refusal_of);
        tcase_add_test(tc, test_reclaim_order);
        tcase_add_test(tc, test_max_cached);
        tcase_add_test(tc, test_set_tenant_limits);
        tcase_add_test(tc, test_segment_bytes);
        tcase_add_test(tc, test_cache_serves);
        tcase_add_test(tc, test_object_evictable);
        tcase_add_test(tc, test_object_serves);
        tcase_add_test(tc, test_reservation_tenants);
        suite_add_tcase(s, tc);
        return s;
}
