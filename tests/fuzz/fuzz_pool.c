/*
 * fuzz_pool.c: libFuzzer target for the daemon's segments (daemon/pool.c), driven by
 * sequences of operations and checked after every step against a plain reference model:
 * pool_check() must pass, every segment leased must serve the size asked, within the headroom,
 * and be leased to nobody else; owners' bytes and segment counts must equal the model's; a
 * segment returns once and only to its owner; reports are held to what an owner leases.
 *
 * Each operation is 4 input bytes: an opcode, an owner (of 4), and two argument bytes.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"

#define OWNERS 4
#define MAX_LEASES 64
#define MiB (1ULL << 20)

struct fake_backend {
        struct backend base;
        uint64_t live;
        bool fail_next;
};

static int fb_info(struct backend *b, unsigned d, struct backend_device_info *ret) {
        (void) b, (void) d;
        memset(ret, 0, sizeof(*ret));
        ret->total_bytes = 96 * MiB;
        return 0;
}

static int fb_create(struct backend *b, unsigned d, uint64_t size, struct backend_mem *ret) {
        struct fake_backend *f = (struct fake_backend *) b;

        (void) d, (void) size;
        if (f->fail_next) {
                f->fail_next = false;
                return -ENOMEM;
        }
        memset(ret, 0, sizeof(*ret));
        ret->fd = -1;
        f->live++;
        return 0;
}

static void fb_destroy(struct backend *b, unsigned d, struct backend_mem *mem, uint64_t size) {
        (void) d, (void) mem, (void) size;
        ((struct fake_backend *) b)->live--;
}

static int fb_zero(struct backend *b, unsigned d, struct backend_mem *mem, uint64_t size) {
        (void) b, (void) d, (void) mem, (void) size;
        return 0;
}

static const struct backend_ops fb_ops = { fb_info, fb_create, fb_destroy, fb_zero, NULL };

struct lease {
        uint64_t segment, size;
};

struct model_owner {
        struct lease leases[MAX_LEASES];
        size_t n;
};

static uint64_t now_ms;

static uint64_t fake_clock(void *ctx) {
        (void) ctx;
        return now_ms;
}

#define CHECK(cond, ...)                                        \
        do {                                                    \
                if (!(cond)) {                                  \
                        fprintf(stderr, "fuzz_pool: " __VA_ARGS__); \
                        fputc('\n', stderr);                    \
                        abort();                                \
                }                                               \
        } while (0)

static void check_all(struct pool *pool, struct pool_owner *owners, struct model_owner *model) {
        char why[256];
        uint64_t reported = 0;
        struct pool_stats st;

        CHECK(pool_check(pool, why, sizeof(why)) == 0, "pool_check: %s", why);
        for (int o = 0; o < OWNERS; o++) {
                uint64_t bytes = 0;

                for (size_t i = 0; i < model[o].n; i++)
                        bytes += model[o].leases[i].size;
                CHECK(owners[o].reserved_bytes == bytes, "owner %d: leases %llu, model %llu", o,
                      (unsigned long long) owners[o].reserved_bytes, (unsigned long long) bytes);
                CHECK(owners[o].segments == model[o].n, "owner %d: %llu segments, model %zu", o,
                      (unsigned long long) owners[o].segments, model[o].n);
                CHECK(owners[o].reported_in_use_bytes + owners[o].reported_held_free_bytes <= bytes,
                      "owner %d: reports more than it leases", o);
                reported += owners[o].reported_in_use_bytes;
        }
        pool_get_stats(pool, &st);
        CHECK(st.in_use_bytes == reported, "device in use %llu, reported %llu", (unsigned long long) st.in_use_bytes,
              (unsigned long long) reported);
}

/* Whether any owner's model holds segment. */
static bool leased_anywhere(const struct model_owner *model, uint64_t segment) {
        for (int p = 0; p < OWNERS; p++)
                for (size_t i = 0; i < model[p].n; i++)
                        if (model[p].leases[i].segment == segment)
                                return true;
        return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        static struct model_owner model[OWNERS];
        struct fake_backend fb = { .base = { .ops = &fb_ops, .name = "fake", .device_count = 1 } };
        struct pool_owner owners[OWNERS];
        struct pool *pool;

        memset(model, 0, sizeof(model));
        now_ms = 0;
        if (pool_new(&fb.base, 0, 96 * MiB, &pool) < 0)
                return 0;
        pool_set_clock(pool, fake_clock, NULL);
        for (int o = 0; o < OWNERS; o++)
                pool_owner_attach(pool, &owners[o], (uint32_t) (o % 2));
        for (; size >= 4; data += 4, size -= 4) {
                int o = data[1] % OWNERS;
                struct model_owner *m = &model[o];
                unsigned arg = (unsigned) data[2] | (unsigned) data[3] << 8;

                switch (data[0] % 10) {
                case 0:
                case 1:
                case 2: {       /* lease: mostly small, sometimes large, sometimes under a limit */
                        uint64_t want = data[0] % 10 == 2 ? (uint64_t) arg * 1024 + 1 : (uint64_t) arg * 16 + 1;
                        uint64_t headroom = arg % 7 == 0 ? 8 * MiB : UINT64_MAX;
                        struct pool_lease l;
                        int r;

                        /* One source alone, or the three in the eviction ladder's order (evict.c). */
                        int step = data[1] / OWNERS % 4, last = step == 3 ? POOL_FROM_EVICTION : step;

                        if (m->n == MAX_LEASES)
                                break;
                        r = -ENOENT;
                        for (int from = step == 3 ? POOL_FROM_CACHE : step; r == -ENOENT && from <= last; from++)
                                r = pool_lease(pool, &owners[o], (enum pool_source) from, want, headroom, &l);
                        if (r < 0) {
                                CHECK(r == -ENOMEM || r == -EDQUOT || (r == -ENOENT && last != POOL_FROM_EVICTION),
                                      "lease from source %d: unexpected %d", step, r);
                                break;
                        }
                        CHECK(l.segment_size >= want && l.segment_size % (2 * MiB) == 0 && l.segment_size <= headroom,
                              "a lease of %llu under %llu: a %llu segment", (unsigned long long) want,
                              (unsigned long long) headroom, (unsigned long long) l.segment_size);
                        CHECK(!leased_anywhere(model, l.segment_id), "segment %llu leased twice",
                              (unsigned long long) l.segment_id);
                        m->leases[m->n++] = (struct lease) { l.segment_id, l.segment_size };
                        break;
                }
                case 3:
                case 4: {       /* return a leased segment (to the cache or the backend), maybe twice */
                        size_t i;

                        if (!m->n)
                                break;
                        i = arg % m->n;
                        CHECK(pool_return(pool, &owners[o], m->leases[i].segment, arg & 2) == 0, "return refused");
                        if (arg & 1)
                                CHECK(pool_return(pool, &owners[o], m->leases[i].segment, false) == -ENOENT,
                                      "a second return accepted");
                        m->leases[i] = m->leases[--m->n];
                        break;
                }
                case 5: {       /* return another owner's segment, or a made-up one: refused */
                        const struct model_owner *other = &model[(o + 1) % OWNERS];
                        uint64_t seg = other->n ? other->leases[arg % other->n].segment : (uint64_t) arg;
                        bool its_own = false;

                        for (size_t i = 0; i < m->n; i++)
                                its_own |= m->leases[i].segment == seg;
                        if (!its_own)
                                CHECK(pool_return(pool, &owners[o], seg, false) == -ENOENT,
                                      "a return of a segment not the owner's accepted");
                        break;
                }
                case 6:         /* a report, any numbers: held to what the owner leases */
                        pool_owner_report(&owners[o], (uint64_t) arg * 64 * 1024, (uint64_t) data[0] * MiB, now_ms);
                        break;
                case 7:         /* the owner leaves (its process exited) and a new one comes */
                        pool_owner_detach(&owners[o]);
                        m->n = 0;
                        pool_owner_attach(pool, &owners[o], (uint32_t) arg % 3);
                        break;
                case 8:         /* cache pressure: flush, decay, watermark */
                        now_ms += arg;
                        if (arg % 3 == 0)
                                pool_flush(pool, NULL, NULL);
                        else if (arg % 3 == 1)
                                (void) pool_release_idle(pool, 1000, NULL);
                        else
                                (void) pool_trim_cache(pool, (uint64_t) (arg % 32) * MiB);
                        break;
                case 9:         /* the backend fails the next segment */
                        fb.fail_next = true;
                        break;
                }
                check_all(pool, owners, model);
        }
        for (int o = 0; o < OWNERS; o++)
                pool_owner_detach(&owners[o]);
        pool_free(pool);
        CHECK(fb.live == 0, "%llu segments never went back to the backend", (unsigned long long) fb.live);
        return 0;
}
