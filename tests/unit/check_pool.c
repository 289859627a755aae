/*
 * check_pool.c: the daemon's segments through pool.h, on a counting fake backend: classes,
 * leases, returns and the cache, tenants, headroom, capacity and the release ladder, owners'
 * reports, refusals, and a random run checked by pool_check(). The blocks carved in segments
 * are the allocator core's (check_heap.c).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "suites.h"

#define MiB (1ULL << 20)

struct fake {
        struct backend base;
        uint64_t capacity;
        int live, created, destroyed, zeroed;
        uint64_t live_bytes;
        int fail_create;        /* creates fail with this until a segment is destroyed (a device full of others' memory) */
};

static int fake_info(struct backend *b, unsigned d, struct backend_device_info *ret) {
        memset(ret, 0, sizeof(*ret));
        ret->total_bytes = ((struct fake *) b)->capacity;
        return d == 0 ? 0 : -ENODEV;
}

static int fake_create(struct backend *b, unsigned d, uint64_t size, struct backend_mem *ret) {
        struct fake *f = (struct fake *) b;

        (void) d;
        if (f->fail_create)
                return f->fail_create;
        memset(ret, 0, sizeof(*ret));
        ret->fd = -1;
        ret->addr = 0x100000000ULL + (uint64_t) f->created * (1ULL << 32);
        f->live++;
        f->created++;
        f->live_bytes += size;
        return 0;
}

static void fake_destroy(struct backend *b, unsigned d, struct backend_mem *mem, uint64_t size) {
        struct fake *f = (struct fake *) b;

        (void) d, (void) mem;
        f->fail_create = 0;
        f->live--;
        f->destroyed++;
        f->live_bytes -= size;
}

static int fake_zero(struct backend *b, unsigned d, struct backend_mem *mem, uint64_t size) {
        (void) d, (void) mem, (void) size;
        ((struct fake *) b)->zeroed++;
        return 0;
}

static const struct backend_ops fake_ops = {
        .device_info = fake_info, .mem_create = fake_create, .mem_destroy = fake_destroy, .mem_zero = fake_zero,
};

static struct fake fake;
static struct pool *pool;

static void setup_capacity(uint64_t capacity) {
        memset(&fake, 0, sizeof(fake));
        fake.base.ops = &fake_ops;
        fake.base.name = "fake";
        fake.base.device_count = 1;
        fake.capacity = capacity;
        ck_assert_int_eq(pool_new(&fake.base, 0, capacity, &pool), 0);
}

static void check(void) {
        char why[256] = "";

        ck_assert_msg(pool_check(pool, why, sizeof(why)) == 0, "pool_check: %s", why);
}

/* The pool's rungs of the eviction ladder, in evict.c's order: the cache, free capacity, eviction. */
static int lease(struct pool *p, struct pool_owner *o, uint64_t size, uint64_t headroom, struct pool_lease *ret) {
        int r = pool_lease(p, o, POOL_FROM_CACHE, size, headroom, ret);

        if (r == -ENOENT)
                r = pool_lease(p, o, POOL_FROM_FREE, size, headroom, ret);
        if (r == -ENOENT)
                r = pool_lease(p, o, POOL_FROM_EVICTION, size, headroom, ret);
        return r;
}

static struct pool_lease lease_ok(struct pool_owner *o, uint64_t size) {
        struct pool_lease l;

        ck_assert_int_eq(lease(pool, o, size, UINT64_MAX, &l), 0);
        check();
        return l;
}

static void return_ok(struct pool_owner *o, const struct pool_lease *l) {
        ck_assert_int_eq(pool_return(pool, o, l->segment_id, false), 0);
        check();
}

static void teardown(void) {
        pool_free(pool);
        pool = NULL;
        ck_assert_int_eq(fake.live, 0);         /* every segment went back to the backend */
}

START_TEST(test_classes_and_rounding) {
        static const struct {
                uint64_t size, segment;
        } cases[] = {
                { 1, 2 * MiB },
                { 512, 2 * MiB },
                { 513, 2 * MiB },
                { 1 * MiB, 2 * MiB },
                { 1 * MiB + 1, 20 * MiB },
                { 10 * MiB, 20 * MiB },
                { 10 * MiB + 1, 12 * MiB },
                { 64 * MiB, 64 * MiB },
        };

        setup_capacity(1ULL << 30);
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                struct pool_owner o;
                struct pool_lease l;

                pool_owner_attach(pool, &o, 1);
                l = lease_ok(&o, cases[i].size);
                ck_assert_msg(l.segment_size == cases[i].segment, "size %llu: segment %llu",
                              (unsigned long long) cases[i].size, (unsigned long long) l.segment_size);
                ck_assert_uint_eq(o.reserved_bytes, l.segment_size);
                ck_assert_uint_eq(o.segments, 1);
                pool_owner_detach(&o);
                pool_flush(pool, NULL, NULL);
                check();
        }
        teardown();
}
END_TEST

START_TEST(test_cache_and_tenants) {
        struct pool_owner a, b, c;
        struct pool_lease l, m, n;
        struct pool_stats st;

        setup_capacity(1ULL << 30);
        pool_owner_attach(pool, &a, 1000);
        pool_owner_attach(pool, &b, 1000);
        pool_owner_attach(pool, &c, 2000);
        l = lease_ok(&a, 100);
        return_ok(&a, &l);
        pool_get_stats(pool, &st);
        ck_assert_uint_eq(st.cached_bytes, 2 * MiB);
        ck_assert_uint_eq(st.reserved_bytes, 2 * MiB);
        ck_assert_uint_eq(a.reserved_bytes, 0);

        /* Same tenant: the cached segment is reused as it is. */
        m = lease_ok(&b, 100);
        ck_assert_uint_eq(m.segment_id, l.segment_id);
        ck_assert_int_eq(fake.created, 1);
        ck_assert_int_eq(fake.zeroed, 0);
        return_ok(&b, &m);

        /* Another tenant: reused, but zeroed first. */
        n = lease_ok(&c, 100);
        ck_assert_uint_eq(n.segment_id, l.segment_id);
        ck_assert_int_eq(fake.zeroed, 1);
        ck_assert_int_eq(fake.created, 1);

        /* A cached segment more than a quarter larger than the class is not taken: 2 MiB for a small request. */
        pool_owner_detach(&c);
        l = lease_ok(&a, 5 * MiB);
        ck_assert_uint_eq(l.segment_size, 20 * MiB);
        ck_assert_int_eq(fake.created, 2);
        return_ok(&a, &l);
        l = lease_ok(&a, 100);
        ck_assert_uint_eq(l.segment_size, 2 * MiB);
        ck_assert_int_eq(fake.created, 2);      /* the cached 2 MiB one */
        pool_owner_detach(&a);
        pool_owner_detach(&b);
        pool_get_stats(pool, &st);
        ck_assert_uint_eq(st.cached_bytes, 22 * MiB);
        ck_assert_uint_eq(st.in_use_bytes, 0);
        {
                uint64_t segs, bytes;

                pool_flush(pool, &segs, &bytes);
                ck_assert_uint_eq(segs, 2);
                ck_assert_uint_eq(bytes, 22 * MiB);
        }
        ck_assert_int_eq(fake.live, 0);
        teardown();
}
END_TEST

START_TEST(test_headroom) {
        struct pool_owner o;
        struct pool_lease l;

        setup_capacity(1ULL << 30);
        pool_owner_attach(pool, &o, 1);
        /* 4 MiB would take a 20 MiB segment; with 8 MiB of headroom it gets the smallest that serves. */
        ck_assert_int_eq(lease(pool, &o, 4 * MiB, 8 * MiB, &l), 0);
        ck_assert_uint_eq(l.segment_size, 4 * MiB);
        ck_assert_int_eq(lease(pool, &o, 4 * MiB, 4 * MiB, &l), 0);
        ck_assert_int_eq(lease(pool, &o, 3 * MiB, 2 * MiB, &l), -EDQUOT);
        ck_assert_int_eq(lease(pool, &o, 1, 0, &l), -EDQUOT);
        check();
        ck_assert_uint_eq(o.reserved_bytes, 8 * MiB);
        pool_owner_detach(&o);
        teardown();
}
END_TEST

START_TEST(test_capacity_and_ladder) {
        struct pool_owner a, b;
        struct pool_lease l[8], x;
        struct pool_stats st;

        setup_capacity(8 * MiB);
        pool_owner_attach(pool, &a, 1);
        pool_owner_attach(pool, &b, 2);
        for (int i = 0; i < 4; i++)
                l[i] = lease_ok(&a, 2 * MiB);
        ck_assert_int_eq(lease(pool, &b, 512, UINT64_MAX, &x), -ENOMEM);
        check();
        /* a returns two: those segments are cached, and b's request reuses... */
        for (int i = 0; i < 2; i++)
                return_ok(&a, &l[i]);
        /* ...a cached 2 MiB segment directly (it is the small class's). */
        x = lease_ok(&b, 512);
        ck_assert_uint_eq(x.segment_id, l[1].segment_id);       /* most recently cached first */
        ck_assert_int_eq(fake.zeroed, 1);
        /* A 4 MiB request does not fit: the last cached segment is released to make room... */
        ck_assert_int_eq(lease(pool, &b, 4 * MiB, UINT64_MAX, &x), -ENOMEM);
        check();
        pool_get_stats(pool, &st);
        ck_assert_uint_eq(st.cached_bytes, 0);
        ck_assert_uint_eq(st.reserved_bytes, 6 * MiB);
        ck_assert_uint_eq(st.evictions_total, 1);
        /* ...and a 2 MiB one then fits in what it freed. */
        x = lease_ok(&b, 2 * MiB);
        ck_assert_uint_eq(x.segment_size, 2 * MiB);
        pool_owner_detach(&a);
        pool_owner_detach(&b);
        teardown();
}
END_TEST

START_TEST(test_backend_full_releases_cache) {
        struct pool_owner o;
        struct pool_lease l;

        setup_capacity(1ULL << 30);
        pool_owner_attach(pool, &o, 1);
        l = lease_ok(&o, 100);
        return_ok(&o, &l);
        /* The device is fuller than the pool knows: the cache goes, and the retry succeeds. */
        fake.fail_create = -ENOMEM;
        l = lease_ok(&o, 8 * MiB);
        ck_assert_int_eq(fake.destroyed, 1);
        /* A failure with nothing cached is reported as it is. */
        fake.fail_create = -ENOMEM;
        ck_assert_int_eq(lease(pool, &o, 30 * MiB, UINT64_MAX, &l), -ENOMEM);
        fake.fail_create = -EIO;
        ck_assert_int_eq(lease(pool, &o, 30 * MiB, UINT64_MAX, &l), -EIO);
        check();
        pool_owner_detach(&o);
        teardown();
}
END_TEST

/* Each rung alone: the cache takes nothing new, free capacity releases nothing, eviction releases the oldest first. */
START_TEST(test_sources_one_at_a_time) {
        struct pool_owner a, b;
        struct pool_lease l[4], x;
        struct pool_stats st;

        setup_capacity(8 * MiB);
        pool_owner_attach(pool, &a, 1);
        pool_owner_attach(pool, &b, 1);
        for (int i = 0; i < 4; i++)
                l[i] = lease_ok(&a, 2 * MiB);
        return_ok(&a, &l[0]);
        return_ok(&a, &l[1]);
        /* No cached segment serves 4 MiB, and none is made. */
        ck_assert_int_eq(pool_lease(pool, &b, POOL_FROM_CACHE, 4 * MiB, UINT64_MAX, &x), -ENOENT);
        ck_assert_int_eq(fake.created, 4);
        /* The capacity is all reserved: free capacity has none, and releases nothing to make some. */
        ck_assert_int_eq(pool_lease(pool, &b, POOL_FROM_FREE, 4 * MiB, UINT64_MAX, &x), -ENOENT);
        pool_get_stats(pool, &st);
        ck_assert_uint_eq(st.cached_bytes, 4 * MiB);
        ck_assert_uint_eq(st.evictions_total, 0);
        check();
        /* Eviction releases both cached segments and makes one of 4 MiB. */
        ck_assert_int_eq(pool_lease(pool, &b, POOL_FROM_EVICTION, 4 * MiB, UINT64_MAX, &x), 0);
        pool_get_stats(pool, &st);
        ck_assert_uint_eq(st.cached_bytes, 0);
        ck_assert_uint_eq(st.evictions_total, 2);
        ck_assert_uint_eq(x.segment_size, 4 * MiB);
        check();
        /* Nothing left to release: the device is full. */
        ck_assert_int_eq(pool_lease(pool, &b, POOL_FROM_EVICTION, 2 * MiB, UINT64_MAX, &x), -ENOMEM);
        pool_owner_detach(&a);
        pool_owner_detach(&b);
        teardown();
        /* A backend fuller than counted, with a segment cached: free capacity leaves it to eviction, which releases it. */
        setup_capacity(1ULL << 30);
        pool_owner_attach(pool, &a, 1);
        x = lease_ok(&a, 100);
        return_ok(&a, &x);
        fake.fail_create = -ENOMEM;
        ck_assert_int_eq(pool_lease(pool, &a, POOL_FROM_FREE, 8 * MiB, UINT64_MAX, &x), -ENOENT);
        ck_assert_int_eq(fake.destroyed, 0);
        ck_assert_int_eq(pool_lease(pool, &a, POOL_FROM_EVICTION, 8 * MiB, UINT64_MAX, &x), 0);
        ck_assert_int_eq(fake.destroyed, 1);
        check();
        pool_owner_detach(&a);
        teardown();
}
END_TEST

START_TEST(test_refusals) {
        struct pool_owner a, b;
        struct pool_lease l, m;

        setup_capacity(1ULL << 30);
        pool_owner_attach(pool, &a, 1);
        pool_owner_attach(pool, &b, 1);
        ck_assert_int_eq(lease(pool, &a, 0, UINT64_MAX, &l), -EINVAL);
        ck_assert_int_eq(lease(pool, &a, POOL_MAX_REQUEST + 1, UINT64_MAX, &l), -EINVAL);
        ck_assert_int_eq(lease(pool, &a, UINT64_MAX, UINT64_MAX, &l), -EINVAL);
        l = lease_ok(&a, 4096);
        m = lease_ok(&a, 4096);
        ck_assert_uint_ne(l.segment_id, m.segment_id);         /* a segment is leased whole, once */
        ck_assert_int_eq(pool_return(pool, &b, l.segment_id, false), -ENOENT);         /* not b's */
        ck_assert_int_eq(pool_return(pool, &a, l.segment_id + 100, false), -ENOENT);   /* no segment */
        ck_assert_int_eq(pool_return(pool, NULL, l.segment_id, false), -ENOENT);
        return_ok(&a, &l);
        ck_assert_int_eq(pool_return(pool, &a, l.segment_id, false), -ENOENT);         /* twice: cached now */
        check();
        pool_owner_detach(&a);
        pool_owner_detach(&b);
        teardown();
}
END_TEST

START_TEST(test_detach_with_leases) {
        struct pool_owner o;
        struct pool_stats st;

        setup_capacity(1ULL << 30);
        pool_owner_attach(pool, &o, 1);
        for (int i = 0; i < 50; i++)
                lease_ok(&o, (uint64_t) (i + 1) * 100000);
        pool_owner_report(&o, o.reserved_bytes / 2, 0, 1);
        pool_get_stats(pool, &st);
        ck_assert_uint_eq(st.in_use_bytes, o.reserved_bytes / 2);
        ck_assert_uint_eq(pool_owner_detach(&o), fake.live_bytes);
        check();
        pool_get_stats(pool, &st);
        ck_assert_uint_eq(st.in_use_bytes, 0);
        ck_assert_uint_eq(st.cached_bytes, st.reserved_bytes);
        teardown();
}
END_TEST

START_TEST(test_random_leases) {
        enum { OWNERS = 3, SLOTS = 100 };
        static struct pool_lease slots[OWNERS][SLOTS];
        struct pool_owner owners[OWNERS];
        struct pool_group groups[2] = { { 0 } };        /* owner 0 in the first, 2 in the second, 1 moving */
        unsigned seed = 777;
        char why[256];

        setup_capacity(2ULL << 30);
        for (int i = 0; i < OWNERS; i++) {
                pool_owner_attach(pool, &owners[i], (uint32_t) i % 2);
                pool_owner_set_group(&owners[i], &groups[i / 2]);
        }
        for (int step = 0; step < 30000; step++) {
                int o = (int) (rand_r(&seed) % OWNERS), s = (int) (rand_r(&seed) % SLOTS);
                struct pool_lease *lv = &slots[o][s];

                if (lv->segment_size) {
                        ck_assert_int_eq(pool_return(pool, &owners[o], lv->segment_id, rand_r(&seed) % 8 == 0), 0);
                        lv->segment_size = 0;
                } else {
                        /* Mostly small, some medium, a few large; some under a limit. */
                        unsigned kind = rand_r(&seed) % 100;
                        uint64_t r = (uint64_t) rand_r(&seed), size = kind < 80 ? 1 + r % (256 * 1024) :
                                        kind < 97 ? 1 + r % (8 * MiB) : 11 * MiB + r % (16 * MiB);
                        uint64_t headroom = kind % 7 == 0 ? 16 * MiB : UINT64_MAX;
                        int e = lease(pool, &owners[o], size, headroom, lv);

                        ck_assert_msg(e == 0 || e == -EDQUOT || e == -ENOMEM, "lease: %d", e);
                        if (e == 0)
                                ck_assert_uint_ge(lv->segment_size, size);
                        else
                                lv->segment_size = 0;
                }
                if (step % 97 == 0) {
                        uint64_t r = (uint64_t) rand_r(&seed);

                        pool_owner_report(&owners[o], r % (64 * MiB), (r >> 8) % (64 * MiB), (uint64_t) step);
                }
                if (step % 1000 == 0) {
                        ck_assert_msg(pool_check(pool, why, sizeof(why)) == 0, "step %d: %s", step, why);
                        /* The groups' sums follow their owners' leases and returns, and an owner that moves. */
                        ck_assert_uint_eq(groups[0].reserved_bytes, owners[0].reserved_bytes +
                                          (owners[1].group == &groups[0] ? owners[1].reserved_bytes : 0));
                        ck_assert_uint_eq(groups[1].reserved_bytes, owners[2].reserved_bytes +
                                          (owners[1].group == &groups[1] ? owners[1].reserved_bytes : 0));
                        ck_assert_uint_eq(groups[0].in_use_bytes, owners[0].reported_in_use_bytes +
                                          (owners[1].group == &groups[0] ? owners[1].reported_in_use_bytes : 0));
                        ck_assert_uint_eq(groups[1].in_use_bytes, owners[2].reported_in_use_bytes +
                                          (owners[1].group == &groups[1] ? owners[1].reported_in_use_bytes : 0));
                        pool_owner_set_group(&owners[1], step % 3000 == 0 ? NULL : &groups[step / 1000 % 2]);
                }
        }
        /* Every live lease is its owner's, once. */
        for (int o = 0; o < OWNERS; o++)
                for (int s = 0; s < SLOTS; s++)
                        for (int t = s + 1; t < SLOTS && slots[o][s].segment_size; t++)
                                ck_assert(!slots[o][t].segment_size || slots[o][t].segment_id != slots[o][s].segment_id);
        ck_assert_msg(pool_check(pool, why, sizeof(why)) == 0, "%s", why);
        for (int i = 0; i < OWNERS; i++)
                pool_owner_detach(&owners[i]);
        ck_assert_uint_eq(groups[0].reserved_bytes, 0);
        ck_assert_uint_eq(groups[1].reserved_bytes, 0);
        ck_assert_uint_eq(groups[0].in_use_bytes, 0);
        ck_assert_uint_eq(groups[1].in_use_bytes, 0);
        check();
        teardown();
}
END_TEST

static uint64_t fake_now_ms;

static uint64_t fake_clock(void *ctx) {
        (void) ctx;
        return fake_now_ms;
}

/* Leases and returns a segment for size, so that it goes to the cache. */
static void cache_one(struct pool_owner *o, uint64_t size) {
        struct pool_lease l = lease_ok(o, size);

        return_ok(o, &l);
}

START_TEST(test_idle_release_by_age) {
        struct pool_owner o;
        struct pool_stats st;
        uint64_t next = 0;

        setup_capacity(1ULL << 30);
        pool_set_clock(pool, fake_clock, NULL);
        fake_now_ms = 1000;
        pool_owner_attach(pool, &o, 1);
        ck_assert_uint_eq(pool_idle_due_ms(pool, 5000), UINT64_MAX);   /* nothing cached: nothing due */
        cache_one(&o, 12 * MiB);
        fake_now_ms = 3000;
        cache_one(&o, 14 * MiB);
        ck_assert_uint_eq(pool_idle_due_ms(pool, 5000), 3000);          /* the first is due at 6000 */
        fake_now_ms = 5999;
        ck_assert_uint_eq(pool_release_idle(pool, 5000, &next), 0);
        ck_assert_uint_eq(next, 1);
        fake_now_ms = 6000;
        ck_assert_uint_eq(pool_release_idle(pool, 5000, &next), 12 * MiB);     /* the oldest only */
        ck_assert_uint_eq(next, 2000);
        check();
        fake_now_ms = 9000;
        ck_assert_uint_eq(pool_release_idle(pool, 5000, &next), 14 * MiB);
        ck_assert_uint_eq(next, UINT64_MAX);
        pool_get_stats(pool, &st);
        ck_assert_uint_eq(st.idle_releases_total, 2);
        ck_assert_uint_eq(st.cached_bytes, 0);
        ck_assert_uint_eq(st.evictions_total + st.watermark_releases_total, 0);
        ck_assert_int_eq(fake.live, 0);
        pool_owner_detach(&o);
        teardown();
}
END_TEST

START_TEST(test_watermark_and_evictions) {
        struct pool_owner o;
        struct pool_stats st;

        setup_capacity(40 * MiB);
        pool_owner_attach(pool, &o, 1);
        cache_one(&o, 12 * MiB);
        cache_one(&o, 16 * MiB);
        ck_assert_uint_eq(pool_trim_cache(pool, 20 * MiB), 12 * MiB);  /* the oldest goes first */
        check();
        pool_get_stats(pool, &st);
        ck_assert_uint_eq(st.cached_bytes, 16 * MiB);
        ck_assert_uint_eq(st.watermark_releases_total, 1);
        /* 30 MiB does not fit beside the cached 16 MiB in 40: the cache makes room, counted as an eviction. */
        lease_ok(&o, 30 * MiB);
        pool_get_stats(pool, &st);
        ck_assert_uint_eq(st.evictions_total, 1);
        ck_assert_uint_eq(st.cached_bytes, 0);
        pool_owner_detach(&o);
        teardown();
}
END_TEST

/* Segments leased to owners, reported on, and given back. */
START_TEST(test_lease_and_return) {
        struct pool_owner a, b;
        struct pool_lease l1, l2, l3, l4;
        struct pool_stats st;

        setup_capacity(64 * MiB);
        pool_owner_attach(pool, &a, 1);
        pool_owner_attach(pool, &b, 2);
        /* The class's segment: 2 MiB for a small block, 20 MiB up to 10 MiB, else rounded to 2 MiB. */
        ck_assert_int_eq(lease(pool, &a, 4096, UINT64_MAX, &l1), 0);
        ck_assert_uint_eq(l1.segment_size, 2 * MiB);
        ck_assert_int_eq(lease(pool, &a, 3 * MiB, UINT64_MAX, &l2), 0);
        ck_assert_uint_eq(l2.segment_size, 20 * MiB);
        /* With 12 MiB of headroom left, the smallest segment that serves. */
        ck_assert_int_eq(lease(pool, &a, 3 * MiB, 12 * MiB, &l3), 0);
        ck_assert_uint_eq(l3.segment_size, 4 * MiB);
        ck_assert_int_eq(lease(pool, &a, 13 * MiB, 12 * MiB, &l4), -EDQUOT);
        ck_assert_int_eq(lease(pool, &a, 0, UINT64_MAX, &l4), -EINVAL);
        ck_assert_uint_eq(a.reserved_bytes, 26 * MiB);
        ck_assert_uint_eq(a.segments, 3);
        check();

        /* Only the lessee returns a segment. */
        ck_assert_int_eq(pool_return(pool, &b, l1.segment_id, false), -ENOENT);
        ck_assert_int_eq(pool_return(pool, &a, 12345, false), -ENOENT);
        l4 = lease_ok(&a, 4096);
        return_ok(&a, &l4);

        /* Returned, a segment goes to the cache, and to another tenant zeroed. */
        pool_owner_report(&a, 5 * MiB, 3 * MiB, 1);
        pool_get_stats(pool, &st);
        ck_assert_uint_eq(st.in_use_bytes, 5 * MiB);    /* the device counts what the owner reports */
        ck_assert_int_eq(pool_return(pool, &a, l1.segment_id, false), 0);
        ck_assert_int_eq(pool_return(pool, &a, l1.segment_id, false), -ENOENT);
        ck_assert_uint_eq(a.reported_held_free_bytes, 1 * MiB);
        ck_assert_uint_eq(a.reported_in_use_bytes, 5 * MiB);
        ck_assert_uint_eq(a.reserved_bytes, 24 * MiB);
        pool_get_stats(pool, &st);
        ck_assert_uint_eq(st.cached_bytes, 4 * MiB);    /* l1 and l4's segment */
        check();
        /* A report past what it leases is held to it, free first. */
        pool_owner_report(&a, 1ULL << 40, 1ULL << 40, 2);
        ck_assert_uint_eq(a.reported_held_free_bytes, 24 * MiB);
        ck_assert_uint_eq(a.reported_in_use_bytes, 0);
        pool_owner_report(&a, 30 * MiB, 4 * MiB, 3);
        ck_assert_uint_eq(a.reported_in_use_bytes, 20 * MiB);
        check();
        ck_assert_int_eq(lease(pool, &b, 512, UINT64_MAX, &l4), 0);
        ck_assert_uint_eq(l4.segment_size, 2 * MiB);
        ck_assert_int_eq(fake.zeroed, 1);
        check();

        /* Returned to the backend (a tenant's flush), it is gone; a stale report is held to what is left. */
        ck_assert_int_eq(pool_return(pool, &a, l3.segment_id, true), 0);
        ck_assert_int_eq(fake.destroyed, 1);
        ck_assert_uint_eq(a.reported_held_free_bytes, 0);
        ck_assert_uint_eq(a.reported_in_use_bytes, 20 * MiB);
        check();
        /* Detaching returns what is still leased to the cache. */
        ck_assert_uint_eq(pool_owner_detach(&a), 20 * MiB);
        ck_assert_uint_eq(pool_owner_detach(&b), 2 * MiB);
        pool_get_stats(pool, &st);
        ck_assert_uint_eq(st.cached_bytes, 24 * MiB);
        check();
        teardown();
}
END_TEST

Suite *suite_pool(void) {
        Suite *s = suite_create("pool");
        TCase *tc = tcase_create("core");

        tcase_add_test(tc, test_classes_and_rounding);
        tcase_add_test(tc, test_cache_and_tenants);
        tcase_add_test(tc, test_headroom);
        tcase_add_test(tc, test_capacity_and_ladder);
        tcase_add_test(tc, test_backend_full_releases_cache);
        tcase_add_test(tc, test_sources_one_at_a_time);
        tcase_add_test(tc, test_refusals);
        tcase_add_test(tc, test_detach_with_leases);
        tcase_add_test(tc, test_random_leases);
        tcase_add_test(tc, test_idle_release_by_age);
        tcase_add_test(tc, test_watermark_and_evictions);
        tcase_add_test(tc, test_lease_and_return);
        tcase_set_timeout(tc, 120);
        suite_add_tcase(s, tc);
        return s;
}
