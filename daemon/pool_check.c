/*
 * pool_check.c: the pool's invariants (pool.h's byte accounting, every index against the
 * segments), read from every index at once: what --check-invariants, the unit tests and the
 * fuzzer run after each change. It only reads.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include "pool.h"
#include "pool_internal.h"

#define FAIL(...)                                       \
        do {                                            \
                snprintf(why, why_size, __VA_ARGS__);   \
                return -EUCLEAN;                        \
        } while (0)

int pool_check(const struct pool *p, char *why, size_t why_size) {
        uint64_t reserved = 0, cached = 0, cached_count = 0, owned = 0, reported = 0, zeroing = 0, idents = 0, fresh = 0;

        if (gp_rb_verify(&p->segments_by_id) || gp_rb_verify(&p->cache_by_size) ||
            gp_rb_verify(&p->cache_by_age))
                FAIL("a pool index is not a valid red-black tree");
        for (struct gp_rb_node *n = gp_rb_first(&p->segments_by_id); n; n = gp_rb_next(n)) {
                const struct segment *s = gp_rb_entry(n, struct segment, by_id);

                reserved += s->size;
                if (s->ident && gp_rb_find(&p->by_ident, &s->ident_node) != &s->ident_node)
                        FAIL("segment %" PRIu64 " is not found by its memory's name", s->id);
                idents += s->ident != 0;
                if (s->zeroing) {
                        if (s->owner || gp_rb_find(&p->zeroing, &s->owner_node) != &s->owner_node)
                                FAIL("segment %" PRIu64 " is being zeroed but not in the pool's list", s->id);
                        zeroing += s->size;
                } else if (!s->owner) {
                        if (gp_rb_find(&p->cache_by_age, &s->age_node) != &s->age_node)
                                FAIL("segment %" PRIu64 " is neither leased nor cached", s->id);
                        cached += s->size;
                        cached_count++;
                        fresh += pool_fresh_granule(s);
                } else if (s->owner->pool != p) {
                        FAIL("segment %" PRIu64 " is leased to no owner of this pool", s->id);
                } else {
                        owned++;
                }
        }
        if (reserved != p->reserved_bytes || cached != p->cached_bytes ||
            cached_count != p->cache_by_size.count || cached_count != p->cache_by_age.count)
                FAIL("device %u: reserved %" PRIu64 " (counted %" PRIu64 "), cached %" PRIu64 " (counted %" PRIu64 ")",
                     p->device, reserved, p->reserved_bytes, cached, p->cached_bytes);
        if (fresh != p->fresh_granules)
                FAIL("device %u: %" PRIu64 " fresh granules cached (counted %" PRIu64 ")", p->device, fresh, p->fresh_granules);
        if (zeroing != p->zeroing_bytes || gp_rb_verify(&p->zeroing))
                FAIL("device %u: %" PRIu64 " bytes being zeroed (counted %" PRIu64 ")", p->device, zeroing, p->zeroing_bytes);
        if (idents != p->by_ident.count || gp_rb_verify(&p->by_ident))
                FAIL("device %u: %" PRIu64 " segments named by their memory, %zu in the index", p->device, idents,
                     p->by_ident.count);
        if (p->reserved_bytes > p->capacity_bytes)
                FAIL("device %u: reserved %" PRIu64 " over capacity %" PRIu64, p->device, p->reserved_bytes, p->capacity_bytes);

        for (const struct pool_owner *o = p->owners; o; o = o->next) {
                uint64_t o_reserved = 0;

                reported += o->reported_in_use_bytes;
                if (o->reported_in_use_bytes + o->reported_held_free_bytes > o->reserved_bytes)
                        FAIL("owner: reports %" PRIu64 " in use and %" PRIu64 " free of %" PRIu64 " leased",
                             o->reported_in_use_bytes, o->reported_held_free_bytes, o->reserved_bytes);
                if (gp_rb_verify(&o->segments_by_id))
                        FAIL("an owner's segment index is not a valid red-black tree");
                for (struct gp_rb_node *n = gp_rb_first(&o->segments_by_id); n; n = gp_rb_next(n)) {
                        const struct segment *s = gp_rb_entry(n, struct segment, owner_node);

                        if (s->owner != o)
                                FAIL("segment %" PRIu64 " is in an owner's index but not its", s->id);
                        o_reserved += s->size;
                        owned--;
                }
                if (o_reserved != o->reserved_bytes || o->segments != o->segments_by_id.count)
                        FAIL("owner: reserved %" PRIu64 "/%" PRIu64 ", segments %" PRIu64 "/%zu", o_reserved,
                             o->reserved_bytes, o->segments, o->segments_by_id.count);
        }
        if (owned != 0)
                FAIL("device %u: %" PRIu64 " leased segments belong to no attached owner", p->device, owned);
        if (reported != p->reported_in_use_bytes)
                FAIL("device %u: reported in use %" PRIu64 ", counted %" PRIu64, p->device, reported,
                     p->reported_in_use_bytes);
        return 0;
}
