/*
 * fuzz_pool.c: libFuzzer target for the allocator core (daemon/pool.c), driven by sequences
 * of operations and checked after every step against a plain reference model: pool_check()
 * must pass, every block handed out must be aligned, inside its segment, at least the size
 * asked, and overlap no live block of anyone; owners' byte and block counts must equal the
 * model's; a block frees once and only once.
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
#define MAX_LIVE 256
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

struct live_block {
        uint64_t segment, offset, size;
};

struct model_owner {
        struct live_block live[MAX_LIVE];
        size_t n;
        uint64_t releasing[64];         /* segments the pool told it to release */
        size_t nrel;
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
        uint64_t total_in_use = 0;
        struct pool_stats st;

        CHECK(pool_check(pool, why, sizeof(why)) == 0, "pool_check: %s", why);
        for (int o = 0; o < OWNERS; o++) {
                uint64_t in_use = 0;

                for (size_t i = 0; i < model[o].n; i++)
                        in_use += model[o].live[i].size;
                CHECK(pool_owner_carved_bytes(&owners[o]) == in_use, "owner %d: in use %llu, model %llu", o,
                      (unsigned long long) pool_owner_carved_bytes(&owners[o]), (unsigned long long) in_use);
                CHECK(pool_owner_blocks(&owners[o]) == model[o].n, "owner %d: %llu blocks, model %zu", o,
                      (unsigned long long) pool_owner_blocks(&owners[o]), model[o].n);
                total_in_use += in_use;
        }
        pool_get_stats(pool, &st);
        CHECK(st.in_use_bytes == total_in_use, "device in use %llu, model %llu", (unsigned long long) st.in_use_bytes,
              (unsigned long long) total_in_use);
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
                case 2: {       /* allocate: mostly small, sometimes large */
                        uint64_t want = data[0] % 10 == 2 ? (uint64_t) arg * 1024 + 1 : (uint64_t) arg * 16 + 1;
                        struct pool_lease l;
                        int r;

                        if (m->n == MAX_LIVE)
                                break;
                        r = pool_alloc(pool, &owners[o], want, arg % 7 == 0 ? 8 * MiB : UINT64_MAX, &l);
                        if (r < 0) {
                                CHECK(r == -ENOMEM || r == -EDQUOT, "alloc: unexpected %d", r);
                                break;
                        }
                        CHECK(l.size >= want && l.size % POOL_BLOCK_ALIGN == 0 && l.offset % POOL_BLOCK_ALIGN == 0 &&
                                      l.offset + l.size <= l.segment_size,
                              "alloc of %llu: block %llu+%llu in a %llu segment", (unsigned long long) want,
                              (unsigned long long) l.offset, (unsigned long long) l.size, (unsigned long long) l.segment_size);
                        for (int p = 0; p < OWNERS; p++)
                                for (size_t i = 0; i < model[p].n; i++) {
                                        const struct live_block *b = &model[p].live[i];

                                        CHECK(b->segment != l.segment_id || b->offset + b->size <= l.offset ||
                                                      l.offset + l.size <= b->offset,
                                              "owner %d's block overlaps owner %d's", o, p);
                                }
                        m->live[m->n++] = (struct live_block) { l.segment_id, l.offset, l.size };
                        break;
                }
                case 3:
                case 4: {       /* free a live block, maybe one freed already */
                        bool release = false;
                        size_t i;

                        if (!m->n)
                                break;
                        i = arg % m->n;
                        CHECK(pool_free_block(pool, &owners[o], m->live[i].segment, m->live[i].offset, &release) == 0,
                              "free of a live block failed");
                        if (release && m->nrel < 64)
                                m->releasing[m->nrel++] = m->live[i].segment;
                        if (arg & 1) {
                                /* A second free of it must be refused. */
                                CHECK(pool_free_block(pool, &owners[o], m->live[i].segment, m->live[i].offset,
                                                      &release) == -ENOENT, "double free accepted");
                        }
                        m->live[i] = m->live[--m->n];
                        break;
                }
                case 5:         /* free at a made-up place: refused unless a live block starts there */
                        if (m->n) {
                                bool release = false, starts = false;
                                uint64_t seg = m->live[arg % m->n].segment, off = (uint64_t) (arg % 64) * 512;

                                for (size_t i = 0; i < m->n; i++)
                                        starts |= m->live[i].segment == seg && m->live[i].offset == off;
                                if (!starts)
                                        CHECK(pool_free_block(pool, &owners[o], seg, off, &release) == -ENOENT,
                                              "a free at no block's start was accepted");
                        }
                        break;
                case 6:         /* release what the pool asked to */
                        while (m->nrel)
                                CHECK(pool_release(pool, &owners[o], m->releasing[--m->nrel]) == 0, "release refused");
                        break;
                case 7:         /* the owner leaves (its process exited) and a new one comes */
                        pool_owner_detach(&owners[o]);
                        m->n = m->nrel = 0;
                        pool_owner_attach(pool, &owners[o], (uint32_t) arg % 3);
                        owners[o].keep_bytes = (arg & 4) ? 16 * MiB : 0;
                        break;
                case 8: {       /* cache pressure: flush, decay, watermark, reclaim */
                        uint64_t ids[16], bytes;
                        size_t n;

                        now_ms += arg;
                        if (arg % 4 == 0)
                                pool_flush(pool, NULL, NULL);
                        else if (arg % 4 == 1)
                                (void) pool_release_idle(pool, 1000, NULL);
                        else if (arg % 4 == 2)
                                (void) pool_trim_cache(pool, (uint64_t) (arg % 32) * MiB);
                        else {
                                n = pool_reclaim(pool, &owners[o], UINT64_MAX, arg & 8, ids, 16, &bytes);
                                for (size_t i = 0; i < n && m->nrel < 64; i++)
                                        m->releasing[m->nrel++] = ids[i];
                        }
                        break;
                }
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
