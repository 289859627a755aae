/*
 * granule.c: physical granules behind virtual ranges (see granule.h for the model).
 *
 * Each range keeps a count of live blocks per granule and two bitmaps, mapped and idle, so
 * that finding the highest idle granule is a scan of words from the top. The set keeps room
 * for every physical granule it holds in its spare array, so an unmap never needs memory.
 */
#include "granule.h"
#include "heap.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool bit(const uint64_t *m, uint64_t k) {
        return m[k / 64] >> (k % 64) & 1;
}

static void bit_set(uint64_t *m, uint64_t k) {
        m[k / 64] |= 1ULL << (k % 64);
}

static void bit_clear(uint64_t *m, uint64_t k) {
        m[k / 64] &= ~(1ULL << (k % 64));
}

int granule_set_init(struct granule_set *s, uint64_t granule_bytes, const struct granule_ops *ops, void *ctx) {
        if (!granule_bytes)
                return -EINVAL;
        *s = (struct granule_set) { .granule_bytes = granule_bytes, .ops = ops, .ctx = ctx };
        return 0;
}

void granule_set_destroy(struct granule_set *s) {
        free(s->spare);
        free(s->spare_since);
        s->spare = s->spare_since = NULL;
        s->spare_count = s->spare_cap = 0;
}

int granule_range_init(struct granule_set *s, struct granule_range *r, uint64_t bytes) {
        uint64_t count = bytes / s->granule_bytes, words = (count + 63) / 64;

        if (!bytes || bytes % s->granule_bytes)
                return -EINVAL;
        if (s->range_count == GRANULE_MAX_RANGES)
                return -ENOSPC;
        *r = (struct granule_range) { .set = s, .count = count };
        r->refs = calloc(count, sizeof(*r->refs));
        r->phys = calloc(count, sizeof(*r->phys));
        r->mapped = calloc(words, sizeof(*r->mapped));
        r->idle = calloc(words, sizeof(*r->idle));
        r->idle_since = calloc(count, sizeof(*r->idle_since));
        if (!r->refs || !r->phys || !r->mapped || !r->idle || !r->idle_since) {
                granule_range_destroy(r);
                return -ENOMEM;
        }
        s->ranges[s->range_count++] = r;
        return 0;
}

void granule_range_destroy(struct granule_range *r) {
        struct granule_set *s = r->set;

        for (unsigned i = 0; s && i < s->range_count; i++)
                if (s->ranges[i] == r) {
                        s->ranges[i] = s->ranges[--s->range_count];
                        break;
                }
        if (s)
                s->held -= r->mapped_count;     /* what was mapped there is the caller's to give back */
        free(r->refs);
        free(r->phys);
        free(r->mapped);
        free(r->idle);
        free(r->idle_since);
        *r = (struct granule_range) { 0 };
}

/* The ops' clock, or 0 without one. */
static uint64_t now_of(const struct granule_set *s) {
        return s->ops->now ? s->ops->now(s->ctx) : 0;
}

/* Counts the n physical granules just put above the spares as spares, held and obtained, free from now. */
static void spares_in(struct granule_set *s, uint64_t n) {
        uint64_t now = now_of(s);

        for (uint64_t i = 0; i < n; i++)
                s->spare_since[s->spare_count + i] = now;
        s->spare_count += n;
        s->held += n;
        s->obtained += n;
}

/* Makes room in the spare array for n physical granules in all. Returns 0 or -ENOMEM. */
static int spare_reserve(struct granule_set *s, uint64_t n) {
        uint64_t cap = s->spare_cap ? s->spare_cap : 64, *p;

        if (n <= s->spare_cap)
                return 0;
        while (cap < n)
                cap *= 2;
        p = realloc(s->spare, cap * sizeof(*p));
        if (!p)
                return -ENOMEM;
        s->spare = p;
        p = realloc(s->spare_since, cap * sizeof(*p));
        if (!p)
                return -ENOMEM;         /* the larger spare array is harmless: cap still says the smaller */
        s->spare_since = p;
        s->spare_cap = cap;
        return 0;
}

/* Unmaps granule k of r (mapped, not idle) into the spares, free since since. */
static void unmap_to_spare(struct granule_range *r, uint64_t k, uint64_t since) {
        struct granule_set *s = r->set;

        bit_clear(r->mapped, k);
        r->mapped_count--;
        s->ops->unmap(s->ctx, r, k, r->phys[k]);
        s->spare_since[s->spare_count] = since;
        s->spare[s->spare_count++] = r->phys[k];
        s->unmaps++;
}

uint64_t granule_unmap_idle(struct granule_set *s, uint64_t want, uint64_t before) {
        uint64_t done = 0;

        for (unsigned i = 0; i < s->range_count && done < want; i++) {
                struct granule_range *r = s->ranges[i];

                for (uint64_t w = (r->count + 63) / 64; w-- > 0 && done < want;)
                        for (uint64_t left = r->idle[w]; left && done < want;) {
                                uint64_t k = w * 64 + 63 - (uint64_t) __builtin_clzll(left);

                                left &= ~(1ULL << (k % 64));
                                if (r->idle_since[k] > before)
                                        continue;
                                bit_clear(r->idle, k);
                                r->idle_count--;
                                unmap_to_spare(r, k, r->idle_since[k]);
                                done++;
                        }
        }
        return done;
}

/*
 * Takes the count of a block off granules first..last: those it leaves untouched become idle,
 * stamped with the clock, read once and only then (a free that idles nothing reads none).
 */
static void uncount(struct granule_range *r, uint64_t first, uint64_t last) {
        const struct granule_set *s = r->set;
        uint64_t now = 0;
        bool read = false;

        for (uint64_t k = first; k <= last; k++)
                if (r->refs[k] && --r->refs[k] == 0 && bit(r->mapped, k)) {
                        if (!read)
                                now = now_of(s);
                        read = true;
                        bit_set(r->idle, k);
                        r->idle_since[k] = now;
                        r->idle_count++;
                }
}

/* The granules first..last that [offset, offset + size) touches; false if it is empty or leaves r. */
static bool span(const struct granule_range *r, uint64_t offset, uint64_t size, uint64_t *first, uint64_t *last) {
        uint64_t g = r->set->granule_bytes;

        if (!size || offset + size < offset || (offset + size - 1) / g >= r->count)
                return false;
        *first = offset / g;
        *last = (offset + size - 1) / g;
        return true;
}

/*
 * Makes the run of *run granules just mapped before granule end of r usable (ops->access), or,
 * if that fails, unmaps them again into the spares. Returns 0 or the failure; *run is 0 after.
 */
static int access_run(struct granule_range *r, uint64_t end, uint64_t *run, int err) {
        struct granule_set *s = r->set;

        if (!*run)
                return err;
        if (!err && s->ops->access)
                err = s->ops->access(s->ctx, r, end - *run, *run);
        for (uint64_t k = end - *run, now = err ? now_of(s) : 0; err && k < end; k++)
                unmap_to_spare(r, k, now);
        *run = 0;
        return err;
}

int granule_take(struct granule_range *r, uint64_t offset, uint64_t size) {
        struct granule_set *s = r->set;
        uint64_t first, last, need = 0, run = 0;
        int err = 0;

        if (!span(r, offset, size, &first, &last))
                return -EINVAL;
        /* Counted first, so that none of its own granules is unmapped to make room for the others. */
        for (uint64_t k = first; k <= last; k++) {
                if (r->refs[k]++ == 0 && bit(r->mapped, k)) {
                        bit_clear(r->idle, k);
                        r->idle_count--;
                }
                need += !bit(r->mapped, k);
        }
        if (need > s->spare_count)
                (void) granule_unmap_idle(s, need - s->spare_count, UINT64_MAX);
        if (need > s->spare_count) {
                uint64_t n = need - s->spare_count;

                if ((err = spare_reserve(s, s->held + n)) < 0 ||
                    (err = s->ops->obtain(s->ctx, n, s->spare + s->spare_count)) < 0)
                        goto undo;
                spares_in(s, n);
        }
        for (uint64_t k = first; k <= last; k++) {
                uint64_t phys;

                if (bit(r->mapped, k)) {
                        if ((err = access_run(r, k, &run, 0)) < 0)
                                goto undo;
                        continue;
                }
                phys = s->spare[--s->spare_count];
                if ((err = s->ops->map(s->ctx, r, k, phys)) < 0) {
                        s->spare_count++;
                        (void) access_run(r, k, &run, err);     /* those mapped before it go back unusable */
                        goto undo;
                }
                bit_set(r->mapped, k);
                r->phys[k] = phys;
                r->mapped_count++;
                s->maps++;
                run++;
        }
        if ((err = access_run(r, last + 1, &run, 0)) < 0)
                goto undo;
        return 0;
undo:
        uncount(r, first, last);
        return err;
}

/* The shortfall of granules first..last of r (granule_shortfall()); *ret_need those of them not mapped. */
static uint64_t shortfall_of(const struct granule_range *r, uint64_t first, uint64_t last, uint64_t *ret_need) {
        const struct granule_set *s = r->set;
        uint64_t need = 0, own_idle = 0, elsewhere = 0;

        for (uint64_t k = first; k <= last; k++) {
                need += !bit(r->mapped, k);
                own_idle += bit(r->idle, k);
        }
        /* Its own idle granules serve it where they are: they are not there to be moved. */
        for (unsigned i = 0; i < s->range_count; i++)
                elsewhere += s->ranges[i]->idle_count;
        elsewhere -= own_idle;
        *ret_need = need;
        return need > s->spare_count + elsewhere ? need - s->spare_count - elsewhere : 0;
}

uint64_t granule_unmapped(const struct granule_range *r, uint64_t offset, uint64_t size) {
        uint64_t first, last, mapped = 0;

        if (!span(r, offset, size, &first, &last))
                return 0;
        /* A word at a time: a block of gigabytes is weighed in a few hundred steps, not thousands. */
        for (uint64_t w = first / 64; w <= last / 64; w++) {
                uint64_t word = r->mapped[w];

                if (w == first / 64)
                        word &= ~0ULL << (first % 64);
                if (w == last / 64 && last % 64 != 63)
                        word &= (1ULL << (last % 64 + 1)) - 1;
                mapped += (uint64_t) __builtin_popcountll(word);
        }
        return last - first + 1 - mapped;
}

/* heap_choice's cost: the granules of ranges[] (by the block's segment class) under rsize bytes from b's front not mapped. */
static uint64_t unmapped_under(void *ctx, const struct heap_block *b, uint64_t rsize) {
        const struct granule_range *ranges = ctx;

        return granule_unmapped(&ranges[b->segment->class], b->offset, rsize);
}

void granule_choice(struct granule_range *ranges, uint64_t rsize, struct heap_choice *ret) {
        uint64_t g = ranges[0].set->granule_bytes;

        *ret = (struct heap_choice) { .cost = unmapped_under, .ctx = ranges, .max_size = rsize + (rsize > g ? rsize : g),
                                      .tries = GRANULE_PLACE_TRIES };
}

uint64_t granule_shortfall(const struct granule_range *r, uint64_t offset, uint64_t size) {
        uint64_t first, last, need;

        return span(r, offset, size, &first, &last) ? shortfall_of(r, first, last, &need) : 0;
}

/* How many granules s may hold beyond what it holds, within a GRANULE_KEEP_DIVISOR-th over peak_in_use. */
static uint64_t room_within(const struct granule_set *s, uint64_t peak_in_use) {
        uint64_t budget = (peak_in_use + peak_in_use / GRANULE_KEEP_DIVISOR + s->granule_bytes - 1) / s->granule_bytes;

        return budget > s->held ? budget - s->held : 0;
}

void granule_plan(const struct granule_range *r, uint64_t offset, uint64_t size, uint64_t peak_in_use, uint64_t in_use,
                  struct granule_plan *p) {
        const struct granule_set *s = r->set;
        uint64_t first, last, need, lack, room = room_within(s, peak_in_use);

        *p = (struct granule_plan) { 0 };
        if (!span(r, offset, size, &first, &last))
                return;
        p->must = shortfall_of(r, first, last, &need);
        lack = need > s->spare_count ? need - s->spare_count : 0;
        /* A lease of its own only for room worth a round trip; one it sends anyway carries what there is. */
        if (!p->must && (!room || room < s->held / GRANULE_KEEP_MIN_DIVISOR))
                return;
        p->want = lack < room ? lack : room;
        if (p->want <= p->must) {
                p->want = p->must;
                p->ahead = granule_ahead(s, p->must, in_use);
                return;
        }
        /* The rest of the room comes with it, so that the blocks after it find spares and need no lease. */
        p->ahead = p->want - p->must + granule_ahead(s, p->want, in_use);
        if (p->must + p->ahead < room)
                p->ahead = room - p->must;
}

uint64_t granule_ahead(const struct granule_set *s, uint64_t shortfall, uint64_t in_use) {
        uint64_t budget = (in_use + in_use / GRANULE_SLACK_DIVISOR + s->granule_bytes - 1) / s->granule_bytes;
        uint64_t floor = (s->held + shortfall) / GRANULE_AHEAD_DIVISOR;

        if (!shortfall)
                return 0;       /* nothing leased, nothing ahead */
        return budget > s->held + shortfall + floor ? budget - s->held - shortfall : floor;
}

int granule_add_spares(struct granule_set *s, const uint64_t *phys, uint64_t n) {
        if (spare_reserve(s, s->held + n) < 0)
                return -ENOMEM;
        memcpy(s->spare + s->spare_count, phys, n * sizeof(*phys));
        spares_in(s, n);
        return 0;
}

uint64_t granule_free_count(const struct granule_set *s) {
        uint64_t n = s->spare_count;

        for (unsigned i = 0; i < s->range_count; i++)
                n += s->ranges[i]->idle_count;
        return n;
}

void granule_give(struct granule_range *r, uint64_t offset, uint64_t size) {
        uint64_t first, last;

        if (span(r, offset, size, &first, &last))
                uncount(r, first, last);
}

uint64_t granule_release_spares(struct granule_set *s, uint64_t *phys, uint64_t max, uint64_t before) {
        uint64_t n = 0, kept = 0;

        /* From the bottom, where the oldest lie (granule_take() uses the top); the rest keep their order. */
        for (uint64_t i = 0; i < s->spare_count; i++) {
                if (n < max && s->spare_since[i] <= before) {
                        phys[n++] = s->spare[i];
                        continue;
                }
                s->spare[kept] = s->spare[i];
                s->spare_since[kept++] = s->spare_since[i];
        }
        s->spare_count = kept;
        s->held -= n;
        return n;
}

uint64_t granule_release(struct granule_set *s, uint64_t *phys, uint64_t max, uint64_t before) {
        uint64_t old = 0;

        for (uint64_t i = 0; i < s->spare_count; i++)
                old += s->spare_since[i] <= before;
        /* Those it unmaps become spares free since before or earlier. */
        if (old < max)
                (void) granule_unmap_idle(s, max - old, before);
        return granule_release_spares(s, phys, max, before);
}

#define FAIL(...)                                       \
        do {                                            \
                snprintf(why, why_size, __VA_ARGS__);   \
                return -EUCLEAN;                        \
        } while (0)

int granule_check(const struct granule_set *s, char *why, size_t why_size) {
        uint64_t mapped_all = 0;

        for (unsigned i = 0; i < s->range_count; i++) {
                const struct granule_range *r = s->ranges[i];
                uint64_t mapped = 0, idle = 0;

                if (r->set != s)
                        FAIL("range %u is not this set's", i);
                for (uint64_t k = 0; k < r->count; k++) {
                        bool m = bit(r->mapped, k), d = bit(r->idle, k);

                        if (r->refs[k] && !m)
                                FAIL("range %u: granule %" PRIu64 " holds %" PRIu32 " live blocks, unmapped", i, k,
                                     r->refs[k]);
                        if (d != (m && !r->refs[k]))
                                FAIL("range %u: granule %" PRIu64 " is %s idle", i, k, d ? "wrongly" : "not");
                        mapped += m;
                        idle += d;
                }
                if (mapped != r->mapped_count || idle != r->idle_count)
                        FAIL("range %u: %" PRIu64 " mapped and %" PRIu64 " idle, counted %" PRIu64 " and %" PRIu64, i,
                             mapped, idle, r->mapped_count, r->idle_count);
                mapped_all += mapped;
        }
        if (mapped_all + s->spare_count != s->held)
                FAIL("%" PRIu64 " mapped and %" PRIu64 " spare, but %" PRIu64 " held", mapped_all, s->spare_count, s->held);
        if (s->spare_cap < s->held)
                FAIL("room for %" PRIu64 " spares, %" PRIu64 " held", s->spare_cap, s->held);
        return 0;
}
