/*
 * heap.c: the allocator core (see heap.h for the model).
 *
 * Free blocks sit in one red-black tree per class ordered by (size, segment id, offset): an
 * allocation is one lower-bound search. Live blocks sit in their segment's tree by offset,
 * which is how a holder that knows only (segment, offset) finds one. The blocks of a segment
 * also form an address-ordered list, so a free merges with its neighbours in O(1). Held
 * blocks sit in two more trees instead of the free index: by (lane, size, ...), where an
 * allocation on the lane looks for its fit, and by (lane, fence, ...), where a release finds
 * those a fence frees, oldest first.
 */
#include "heap.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#define CMP(a, b) ((a) < (b) ? -1 : (a) > (b))

static int cmp_free_block(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        const struct heap_block *a = gp_rb_entry(x, struct heap_block, node);
        const struct heap_block *b = gp_rb_entry(y, struct heap_block, node);

        if (a->size != b->size)
                return CMP(a->size, b->size);
        if (a->segment->id != b->segment->id)
                return CMP(a->segment->id, b->segment->id);
        return CMP(a->offset, b->offset);
}

static int cmp_held_block(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        const struct heap_block *a = gp_rb_entry(x, struct heap_block, node);
        const struct heap_block *b = gp_rb_entry(y, struct heap_block, node);

        if (a->lane != b->lane)
                return CMP(a->lane, b->lane);
        return cmp_free_block(x, y);
}

static int cmp_held_fence(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        const struct heap_block *a = gp_rb_entry(x, struct heap_block, by_fence);
        const struct heap_block *b = gp_rb_entry(y, struct heap_block, by_fence);

        if (a->lane != b->lane)
                return CMP(a->lane, b->lane);
        if (a->fence != b->fence)
                return CMP(a->fence, b->fence);
        if (a->segment->id != b->segment->id)
                return CMP(a->segment->id, b->segment->id);
        return CMP(a->offset, b->offset);
}

static int cmp_live_block(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        return CMP(gp_rb_entry(x, struct heap_block, node)->offset, gp_rb_entry(y, struct heap_block, node)->offset);
}

static uint64_t round_up(uint64_t v, uint64_t align) {
        return (v + align - 1) / align * align;
}

uint64_t heap_round(uint64_t size) {
        if (size == 0 || size > HEAP_MAX_REQUEST)
                return 0;
        return round_up(size, HEAP_BLOCK_ALIGN);
}

enum heap_class heap_class_of(uint64_t rsize) {
        return rsize <= HEAP_SMALL_REQUEST ? HEAP_CLASS_SMALL : HEAP_CLASS_LARGE;
}

uint64_t heap_segment_bytes(uint64_t rsize) {
        if (rsize <= HEAP_SMALL_REQUEST)
                return HEAP_SMALL_SEGMENT;
        if (rsize <= HEAP_MEDIUM_REQUEST)
                return HEAP_MEDIUM_SEGMENT;
        return round_up(rsize, HEAP_SEGMENT_ALIGN);
}

uint64_t heap_min_segment_bytes(uint64_t rsize) {
        return round_up(rsize, HEAP_SEGMENT_ALIGN);
}

void heap_init(struct heap *h) {
        *h = (struct heap) { 0 };
        for (int c = 0; c < HEAP_CLASS_COUNT; c++) {
                gp_rb_init(&h->free_index[c], cmp_free_block);
                gp_rb_init(&h->held_index[c], cmp_held_block);
        }
        gp_rb_init(&h->held_fences, cmp_held_fence);
}

/* Whether s holds neither a live block nor a held one. */
static bool is_empty(const struct heap_segment *s) {
        return !s->live_blocks && !s->held_blocks;
}

/* Puts free block b into its index: the free one, or the held ones for its lane. */
static void index_insert(struct heap *h, struct heap_block *b) {
        if (!b->lane) {
                gp_rb_insert(&h->free_index[b->segment->class], &b->node);
                return;
        }
        gp_rb_insert(&h->held_index[b->segment->class], &b->node);
        gp_rb_insert(&h->held_fences, &b->by_fence);
        h->held_bytes += b->size;
}

static void index_remove(struct heap *h, struct heap_block *b) {
        if (!b->lane) {
                gp_rb_remove(&h->free_index[b->segment->class], &b->node);
                return;
        }
        gp_rb_remove(&h->held_index[b->segment->class], &b->node);
        gp_rb_remove(&h->held_fences, &b->by_fence);
        h->held_bytes -= b->size;
}

static void empty_push(struct heap *h, struct heap_segment *s) {
        s->empty_next = NULL;
        s->empty_prev = h->empty_tail;
        if (h->empty_tail)
                h->empty_tail->empty_next = s;
        else
                h->empty_head = s;
        h->empty_tail = s;
        h->empty_count++;
        h->empty_bytes += s->size;
}

static void empty_unlink(struct heap *h, struct heap_segment *s) {
        if (s->empty_prev)
                s->empty_prev->empty_next = s->empty_next;
        else
                h->empty_head = s->empty_next;
        if (s->empty_next)
                s->empty_next->empty_prev = s->empty_prev;
        else
                h->empty_tail = s->empty_prev;
        s->empty_prev = s->empty_next = NULL;
        h->empty_count--;
        h->empty_bytes -= s->size;
}

int heap_add(struct heap *h, struct heap_segment *s, uint64_t id, uint64_t size, enum heap_class class) {
        struct heap_block *b;

        if (size == 0 || size % HEAP_BLOCK_ALIGN)
                return -EINVAL;
        b = calloc(1, sizeof(*b));
        if (!b)
                return -ENOMEM;
        *s = (struct heap_segment) { .id = id, .size = size, .class = class, .first = b, .heap = h };
        gp_rb_init(&s->live, cmp_live_block);
        b->segment = s;
        b->size = size;
        b->free = true;
        gp_rb_insert(&h->free_index[class], &b->node);
        s->next = h->segments;
        if (h->segments)
                h->segments->prev = s;
        h->segments = s;
        h->segment_count++;
        h->size_bytes += size;
        empty_push(h, s);
        return 0;
}

/* Unlinks s from its heap's segment list and sums, and frees its block records. */
static void segment_unlink(struct heap *h, struct heap_segment *s) {
        struct heap_block *b = s->first;

        while (b) {
                struct heap_block *next = b->next;

                free(b);
                b = next;
        }
        if (s->prev)
                s->prev->next = s->next;
        else
                h->segments = s->next;
        if (s->next)
                s->next->prev = s->prev;
        h->segment_count--;
        h->size_bytes -= s->size;
        s->first = NULL;
        s->prev = s->next = NULL;
        s->heap = NULL;
}

int heap_remove(struct heap_segment *s) {
        struct heap *h = s->heap;

        if (!is_empty(s))
                return -EBUSY;
        /* Empty: its one free block spans it. */
        gp_rb_remove(&h->free_index[s->class], &s->first->node);
        empty_unlink(h, s);
        segment_unlink(h, s);
        return 0;
}

uint64_t heap_drop(struct heap_segment *s) {
        struct heap *h = s->heap;
        uint64_t live = s->live_bytes;

        if (is_empty(s)) {
                (void) heap_remove(s);
                return 0;
        }
        for (struct heap_block *b = s->first; b; b = b->next)
                if (b->free)
                        index_remove(h, b);
                else
                        h->asked_bytes -= b->asked;
        /* Not empty (it holds a live or held block): not on the empty list. */
        h->in_use_bytes -= s->live_bytes;
        h->blocks -= s->live_blocks;
        s->live_blocks = 0;
        s->live_bytes = 0;
        s->held_blocks = 0;
        gp_rb_init(&s->live, cmp_live_block);
        segment_unlink(h, s);
        return live;
}

/*
 * Whether carving rsize bytes from a free block of size bytes splits off the rest: in the
 * small class whenever the rest is a block at all; in the large class only when it is more
 * than HEAP_SMALL_REQUEST, as PyTorch's allocator does, because a smaller rest of a large
 * segment could serve only requests that never come to the large class, and would keep the
 * segment from ever being whole again.
 */
static bool should_split(enum heap_class class, uint64_t rest) {
        if (class == HEAP_CLASS_PIECE)
                return false;   /* a piece is one block */
        return class == HEAP_CLASS_SMALL ? rest >= HEAP_BLOCK_ALIGN : rest > HEAP_SMALL_REQUEST;
}

/*
 * Takes rsize bytes from the front of free or held block b, splitting off the rest
 * (should_split(); never from a held block of a segment that holds whole), which stays as b
 * was. Cannot fail: if there is no memory for the rest's record, the whole block is handed out.
 */
static void block_carve(struct heap *h, struct heap_block *b, uint64_t rsize) {
        struct heap_segment *s = b->segment;
        bool was_empty = is_empty(s), whole = b->lane && s->hold_whole;
        struct heap_block *rest = !whole && should_split(s->class, b->size - rsize) ? calloc(1, sizeof(*rest)) : NULL;

        index_remove(h, b);
        if (rest) {
                rest->segment = s;
                rest->offset = b->offset + rsize;
                rest->size = b->size - rsize;
                rest->free = true;
                rest->lane = b->lane;
                rest->fence = b->fence;
                rest->prev = b;
                rest->next = b->next;
                if (b->next)
                        b->next->prev = rest;
                b->next = rest;
                b->size = rsize;
                index_insert(h, rest);
        } else if (b->lane) {
                s->held_blocks--;
        }
        b->free = false;
        b->lane = 0;
        b->fence = 0;
        gp_rb_insert(&s->live, &b->node);
        if (was_empty)
                empty_unlink(h, s);
        s->live_blocks++;
        s->live_bytes += b->size;
        h->in_use_bytes += b->size;
        b->asked = rsize;
        h->asked_bytes += rsize;
        h->blocks++;
}

/* The best fit of rsize among the free blocks of class (lane 0) or those held for lane, or NULL. */
static struct heap_block *best_fit(struct heap *h, enum heap_class class, uint64_t rsize, uint32_t lane) {
        /* Sorts before every block of the same size: the lowest segment id and offset win. */
        static const struct heap_segment key_segment = { .id = 0 };
        struct heap_block key = { .segment = (struct heap_segment *) &key_segment, .size = rsize, .lane = lane }, *b;
        struct gp_rb_node *n = gp_rb_lower_bound(lane ? &h->held_index[class] : &h->free_index[class], &key.node);

        if (!n)
                return NULL;
        b = gp_rb_entry(n, struct heap_block, node);
        if (b->lane != lane || (lane && b->segment->hold_whole && b->size > rsize + rsize / 4))
                return NULL;
        /* The smallest piece is too large: all are. */
        if (class == HEAP_CLASS_PIECE && b->size > rsize + rsize / HEAP_PIECE_FIT_DIVISOR)
                return NULL;
        return b;
}

struct heap_block *heap_alloc(struct heap *h, enum heap_class class, uint64_t rsize) {
        struct heap_block *b = best_fit(h, class, rsize, 0);

        if (b)
                block_carve(h, b, rsize);
        return b;
}

/*
 * From free block b, the best fit, and the free blocks after it in the index (larger, or as
 * large further on) of at most choice->max_size, choice->tries in all: the first that costs
 * least by choice->cost(). A block that costs nothing ends the search.
 */
static struct heap_block *cheapest_from(struct heap_block *b, uint64_t rsize, const struct heap_choice *choice) {
        struct heap_block *best = b;
        uint64_t best_cost = choice->cost(choice->ctx, b, rsize);

        for (unsigned i = 1; best_cost && i < choice->tries; i++) {
                struct gp_rb_node *n = gp_rb_next(&b->node);
                uint64_t cost;

                if (!n)
                        break;
                b = gp_rb_entry(n, struct heap_block, node);
                if (b->size > choice->max_size)
                        break;
                cost = choice->cost(choice->ctx, b, rsize);
                if (cost < best_cost) {
                        best = b;
                        best_cost = cost;
                }
        }
        return best;
}

/* heap_alloc_cheapest(), choice NULL for heap_alloc_on(): one static body the compiler inlines into both. */
static inline struct heap_block *alloc_on(struct heap *h, enum heap_class class, uint64_t rsize, uint32_t lane, bool *ret_held,
                                          const struct heap_choice *choice) {
        struct heap_block *b = best_fit(h, class, rsize, 0), *held = lane ? best_fit(h, class, rsize, lane) : NULL;

        /* The one a heap of both would pick: a stream with all its frees held is served as with all free. */
        *ret_held = held && (!b || cmp_free_block(&held->node, &b->node) < 0);
        if (*ret_held)
                b = held;
        else if (b && choice && class != HEAP_CLASS_PIECE)
                b = cheapest_from(b, rsize, choice);
        if (b)
                block_carve(h, b, rsize);
        return b;
}

struct heap_block *heap_alloc_on(struct heap *h, enum heap_class class, uint64_t rsize, uint32_t lane, bool *ret_held) {
        return alloc_on(h, class, rsize, lane, ret_held, NULL);
}

struct heap_block *heap_alloc_cheapest(struct heap *h, enum heap_class class, uint64_t rsize, uint32_t lane, bool *ret_held,
                                       const struct heap_choice *choice) {
        return alloc_on(h, class, rsize, lane, ret_held, choice);
}

struct heap_block *heap_alloc_in(struct heap *h, struct heap_segment *s, uint64_t rsize) {
        struct heap_block *b = s->first;

        if (s->heap != h || !is_empty(s) || b->size < rsize || !rsize || rsize % HEAP_BLOCK_ALIGN)
                return NULL;
        block_carve(h, b, rsize);
        return b;
}

struct heap_block *heap_find_live(const struct heap_segment *s, uint64_t offset) {
        struct heap_block key = { .offset = offset };
        struct gp_rb_node *n = gp_rb_find(&s->live, &key.node);

        return n ? gp_rb_entry(n, struct heap_block, node) : NULL;
}

/* Joins b's successor into b. The caller has taken the successor out of the free index. */
static void block_absorb_next(struct heap_block *b) {
        struct heap_block *n = b->next;

        b->size += n->size;
        b->next = n->next;
        if (n->next)
                n->next->prev = b;
        free(n);
}

/* Takes live block b out of its segment's live tree and the sums: it is free or held after. */
static void block_unlive(struct heap *h, struct heap_block *b) {
        struct heap_segment *s = b->segment;

        gp_rb_remove(&s->live, &b->node);
        s->live_blocks--;
        s->live_bytes -= b->size;
        h->in_use_bytes -= b->size;
        h->asked_bytes -= b->asked;
        h->blocks--;
        b->free = true;
}

/*
 * Merges free block b (out of every index) with its neighbours that merge takes, and theirs
 * (a held block may take a free one and, past it, one held for its lane), out of their
 * indexes; each held one among them counts no more as one. Returns the merged block.
 */
static struct heap_block *block_merge(struct heap *h, struct heap_block *b, bool (*merge)(const struct heap_block *b,
                                                                                         const struct heap_block *n)) {
        struct heap_segment *s = b->segment;

        while (b->next && merge(b, b->next)) {
                if (b->next->lane) {
                        s->held_blocks--;
                        if (b->next->fence > b->fence)
                                b->fence = b->next->fence;
                }
                index_remove(h, b->next);
                block_absorb_next(b);
        }
        while (b->prev && merge(b, b->prev)) {
                struct heap_block *p = b->prev;

                if (p->lane) {
                        s->held_blocks--;
                        if (p->fence > b->fence)
                                b->fence = p->fence;
                }
                index_remove(h, p);
                p->lane = b->lane;
                p->fence = b->fence;
                block_absorb_next(p);
                b = p;
        }
        return b;
}

/* A free block merges with free neighbours only. */
static bool merges_free(const struct heap_block *b, const struct heap_block *n) {
        (void) b;
        return n->free && !n->lane;
}

/* A held block merges with free neighbours and those held for its lane, unless its segment holds whole. */
static bool merges_held(const struct heap_block *b, const struct heap_block *n) {
        return !b->segment->hold_whole && n->free && (!n->lane || n->lane == b->lane);
}

bool heap_free(struct heap *h, struct heap_block *b) {
        struct heap_segment *s = b->segment;

        block_unlive(h, b);
        b = block_merge(h, b, merges_free);
        index_insert(h, b);
        if (!is_empty(s))
                return false;
        empty_push(h, s);
        return true;
}

void heap_free_held(struct heap *h, struct heap_block *b, uint32_t lane, uint64_t fence) {
        block_unlive(h, b);
        b->lane = lane;
        b->fence = fence;
        b->segment->held_blocks++;
        b = block_merge(h, b, merges_held);
        index_insert(h, b);
}

uint64_t heap_release(struct heap *h, uint32_t lane, uint64_t fence, const struct heap_release_ops *ops, void *ctx) {
        static const struct heap_segment key_segment = { .id = 0 };
        struct heap_block key = { .segment = (struct heap_segment *) &key_segment, .lane = lane };
        struct gp_rb_node *n;
        uint64_t done = 0;

        while ((n = gp_rb_lower_bound(&h->held_fences, &key.by_fence))) {
                struct heap_block *b = gp_rb_entry(n, struct heap_block, by_fence);
                struct heap_segment *s = b->segment;

                if (b->lane != lane || b->fence > fence)
                        break;
                index_remove(h, b);
                s->held_blocks--;
                if (ops && ops->released)
                        ops->released(ctx, b);
                b->lane = 0;
                b->fence = 0;
                b = block_merge(h, b, merges_free);
                index_insert(h, b);
                done++;
                if (is_empty(s)) {
                        empty_push(h, s);
                        if (ops && ops->emptied)
                                ops->emptied(ctx, s);
                }
        }
        return done;
}

void heap_hold_whole(struct heap_segment *s) {
        s->hold_whole = true;
}

struct heap_segment *heap_oldest_empty(const struct heap *h) {
        return h->empty_head;
}

#define FAIL(...)                                       \
        do {                                            \
                snprintf(why, why_size, __VA_ARGS__);   \
                return -EUCLEAN;                        \
        } while (0)

/* Checks one segment's blocks and adds to the sums. */
static int check_segment(const struct heap *h, const struct heap_segment *s, uint64_t *in_use, uint64_t *asked,
                         uint64_t *blocks, uint64_t *free_blocks, uint64_t *held_bytes, char *why, size_t why_size) {
        uint64_t offset = 0, live = 0, live_bytes = 0, held = 0;

        if (s->heap != h || !s->first || s->first->prev)
                FAIL("segment %" PRIu64 " is not this heap's, or has no first block", s->id);
        if (gp_rb_verify(&s->live))
                FAIL("segment %" PRIu64 ": its live tree is not a valid red-black tree", s->id);
        for (const struct heap_block *b = s->first; b; b = b->next) {
                if (b->segment != s || b->offset != offset || b->size == 0 || b->size % HEAP_BLOCK_ALIGN ||
                    (b->next && b->next->prev != b))
                        FAIL("segment %" PRIu64 ": block at %" PRIu64 " breaks the tiling", s->id, b->offset);
                if (b->free) {
                        const struct heap_block *n = b->next;

                        /* Free neighbours for the same lane (or both for none) merge, but held whole. */
                        if (n && n->free && n->lane == b->lane && (!b->lane || !s->hold_whole))
                                FAIL("segment %" PRIu64 ": free neighbours at %" PRIu64 " not merged", s->id, b->offset);
                        if (b->lane ? gp_rb_find(&h->held_index[s->class], &b->node) != &b->node ||
                                              gp_rb_find(&h->held_fences, &b->by_fence) != &b->by_fence
                                    : gp_rb_find(&h->free_index[s->class], &b->node) != &b->node)
                                FAIL("segment %" PRIu64 ": free block at %" PRIu64 " missing from the index", s->id,
                                     b->offset);
                        held += b->lane != 0;
                        *held_bytes += b->lane ? b->size : 0;
                        (*free_blocks)++;
                } else {
                        if (b->lane || b->fence)
                                FAIL("segment %" PRIu64 ": live block at %" PRIu64 " held for lane %" PRIu32, s->id,
                                     b->offset, b->lane);
                        if (gp_rb_find(&s->live, &b->node) != &b->node)
                                FAIL("segment %" PRIu64 ": live block at %" PRIu64 " missing from the live tree", s->id,
                                     b->offset);
                        if (!b->asked || b->asked > b->size)
                                FAIL("segment %" PRIu64 ": live block at %" PRIu64 " of %" PRIu64 " bytes carved for %"
                                     PRIu64, s->id, b->offset, b->size, b->asked);
                        live++;
                        live_bytes += b->size;
                        *asked += b->asked;
                }
                offset += b->size;
        }
        if (offset != s->size)
                FAIL("segment %" PRIu64 ": blocks cover %" PRIu64 " of %" PRIu64 " bytes", s->id, offset, s->size);
        if (live != s->live_blocks || live != s->live.count || live_bytes != s->live_bytes)
                FAIL("segment %" PRIu64 ": %" PRIu64 " live blocks of %" PRIu64 " bytes, counted %" PRIu64 " of %" PRIu64,
                     s->id, live, live_bytes, s->live_blocks, s->live_bytes);
        if (held != s->held_blocks)
                FAIL("segment %" PRIu64 ": %" PRIu64 " held blocks, counted %" PRIu64, s->id, held, s->held_blocks);
        *in_use += live_bytes;
        *blocks += live;
        return 0;
}

int heap_check(const struct heap *h, char *why, size_t why_size) {
        uint64_t count = 0, size = 0, in_use = 0, asked = 0, blocks = 0, free_blocks = 0, indexed = 0;
        uint64_t empty = 0, empty_bytes = 0, listed = 0, listed_bytes = 0, held_indexed = 0, held_bytes = 0;
        int r;

        for (int c = 0; c < HEAP_CLASS_COUNT; c++) {
                if (gp_rb_verify(&h->free_index[c]))
                        FAIL("a free index is not a valid red-black tree");
                if (gp_rb_verify(&h->held_index[c]))
                        FAIL("a held index is not a valid red-black tree");
                indexed += h->free_index[c].count + h->held_index[c].count;
                held_indexed += h->held_index[c].count;
        }
        if (gp_rb_verify(&h->held_fences) || h->held_fences.count != held_indexed)
                FAIL("%" PRIu64 " held blocks by size, %" PRIu64 " by fence", held_indexed, (uint64_t) h->held_fences.count);
        for (const struct heap_segment *s = h->segments; s; s = s->next) {
                if (s->next && s->next->prev != s)
                        FAIL("the segment list is broken after segment %" PRIu64, s->id);
                r = check_segment(h, s, &in_use, &asked, &blocks, &free_blocks, &held_bytes, why, why_size);
                if (r < 0)
                        return r;
                count++;
                size += s->size;
                if (is_empty(s)) {
                        empty++;
                        empty_bytes += s->size;
                }
        }
        for (const struct heap_segment *s = h->empty_head; s; s = s->empty_next) {
                if (s->heap != h || !is_empty(s))
                        FAIL("segment %" PRIu64 " is on the empty list but holds live or held blocks", s->id);
                if (s->empty_next ? s->empty_next->empty_prev != s : h->empty_tail != s)
                        FAIL("the empty list is broken after segment %" PRIu64, s->id);
                listed++;
                listed_bytes += s->size;
        }
        if (count != h->segment_count || size != h->size_bytes)
                FAIL("%" PRIu64 " segments of %" PRIu64 " bytes, counted %" PRIu64 " of %" PRIu64, count, size,
                     h->segment_count, h->size_bytes);
        if (in_use != h->in_use_bytes || blocks != h->blocks)
                FAIL("%" PRIu64 " live blocks of %" PRIu64 " bytes, counted %" PRIu64 " of %" PRIu64, blocks, in_use,
                     h->blocks, h->in_use_bytes);
        if (asked != h->asked_bytes)
                FAIL("live blocks carved for %" PRIu64 " bytes, counted %" PRIu64, asked, h->asked_bytes);
        if (held_bytes != h->held_bytes)
                FAIL("held blocks of %" PRIu64 " bytes, counted %" PRIu64, held_bytes, h->held_bytes);
        if (indexed != free_blocks)
                FAIL("%" PRIu64 " blocks indexed free, %" PRIu64 " free", indexed, free_blocks);
        if (empty != listed || empty_bytes != listed_bytes || empty != h->empty_count || empty_bytes != h->empty_bytes)
                FAIL("%" PRIu64 " empty segments of %" PRIu64 " bytes, %" PRIu64 " of %" PRIu64 " listed, counted %" PRIu64
                     " of %" PRIu64, empty, empty_bytes, listed, listed_bytes, h->empty_count, h->empty_bytes);
        return 0;
}
