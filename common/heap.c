/*
 * heap.c: the allocator core (see heap.h for the model).
 *
 * Free blocks sit in one red-black tree per class ordered by (size, segment id, offset): an
 * allocation is one lower-bound search. Live blocks sit in their segment's tree by offset,
 * which is how a holder that knows only (segment, offset) finds one. The blocks of a segment
 * also form an address-ordered list, so a free merges with its neighbours in O(1).
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
        for (int c = 0; c < HEAP_CLASS_COUNT; c++)
                gp_rb_init(&h->free_index[c], cmp_free_block);
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

        if (s->live_blocks)
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

        if (!s->live_blocks) {
                (void) heap_remove(s);
                return 0;
        }
        for (struct heap_block *b = s->first; b; b = b->next)
                if (b->free)
                        gp_rb_remove(&h->free_index[s->class], &b->node);
                else
                        h->asked_bytes -= b->asked;
        h->in_use_bytes -= s->live_bytes;
        h->blocks -= s->live_blocks;
        s->live_blocks = 0;
        s->live_bytes = 0;
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
        return class == HEAP_CLASS_SMALL ? rest >= HEAP_BLOCK_ALIGN : rest > HEAP_SMALL_REQUEST;
}

/*
 * Takes rsize bytes from the front of free block b, splitting off the rest (should_split()).
 * Cannot fail: if there is no memory for the rest's record, the whole block is handed out.
 */
static void block_carve(struct heap *h, struct heap_block *b, uint64_t rsize) {
        struct heap_segment *s = b->segment;
        struct heap_block *rest = should_split(s->class, b->size - rsize) ? calloc(1, sizeof(*rest)) : NULL;

        gp_rb_remove(&h->free_index[s->class], &b->node);
        if (rest) {
                rest->segment = s;
                rest->offset = b->offset + rsize;
                rest->size = b->size - rsize;
                rest->free = true;
                rest->prev = b;
                rest->next = b->next;
                if (b->next)
                        b->next->prev = rest;
                b->next = rest;
                b->size = rsize;
                gp_rb_insert(&h->free_index[s->class], &rest->node);
        }
        b->free = false;
        gp_rb_insert(&s->live, &b->node);
        if (s->live_blocks++ == 0)
                empty_unlink(h, s);
        s->live_bytes += b->size;
        h->in_use_bytes += b->size;
        b->asked = rsize;
        h->asked_bytes += rsize;
        h->blocks++;
}

struct heap_block *heap_alloc(struct heap *h, enum heap_class class, uint64_t rsize) {
        /* Sorts before every block of the same size: the lowest segment id and offset win. */
        static const struct heap_segment key_segment = { .id = 0 };
        struct heap_block key = { .segment = (struct heap_segment *) &key_segment, .size = rsize }, *b;
        struct gp_rb_node *n = gp_rb_lower_bound(&h->free_index[class], &key.node);

        if (!n)
                return NULL;
        b = gp_rb_entry(n, struct heap_block, node);
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

bool heap_free(struct heap *h, struct heap_block *b) {
        struct heap_segment *s = b->segment;

        gp_rb_remove(&s->live, &b->node);
        s->live_blocks--;
        s->live_bytes -= b->size;
        h->in_use_bytes -= b->size;
        h->asked_bytes -= b->asked;
        h->blocks--;
        b->free = true;
        if (b->next && b->next->free) {
                gp_rb_remove(&h->free_index[s->class], &b->next->node);
                block_absorb_next(b);
        }
        if (b->prev && b->prev->free) {
                b = b->prev;
                gp_rb_remove(&h->free_index[s->class], &b->node);
                block_absorb_next(b);
        }
        gp_rb_insert(&h->free_index[s->class], &b->node);
        if (s->live_blocks)
                return false;
        empty_push(h, s);
        return true;
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
                         uint64_t *blocks, uint64_t *free_blocks, char *why, size_t why_size) {
        uint64_t offset = 0, live = 0, live_bytes = 0;

        if (s->heap != h || !s->first || s->first->prev)
                FAIL("segment %" PRIu64 " is not this heap's, or has no first block", s->id);
        if (gp_rb_verify(&s->live))
                FAIL("segment %" PRIu64 ": its live tree is not a valid red-black tree", s->id);
        for (const struct heap_block *b = s->first; b; b = b->next) {
                if (b->segment != s || b->offset != offset || b->size == 0 || b->size % HEAP_BLOCK_ALIGN ||
                    (b->next && b->next->prev != b))
                        FAIL("segment %" PRIu64 ": block at %" PRIu64 " breaks the tiling", s->id, b->offset);
                if (b->free) {
                        if (b->next && b->next->free)
                                FAIL("segment %" PRIu64 ": free neighbours at %" PRIu64 " not merged", s->id, b->offset);
                        if (gp_rb_find(&h->free_index[s->class], &b->node) != &b->node)
                                FAIL("segment %" PRIu64 ": free block at %" PRIu64 " missing from the index", s->id,
                                     b->offset);
                        (*free_blocks)++;
                } else {
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
        *in_use += live_bytes;
        *blocks += live;
        return 0;
}

int heap_check(const struct heap *h, char *why, size_t why_size) {
        uint64_t count = 0, size = 0, in_use = 0, asked = 0, blocks = 0, free_blocks = 0, indexed = 0;
        uint64_t empty = 0, empty_bytes = 0, listed = 0, listed_bytes = 0;
        int r;

        for (int c = 0; c < HEAP_CLASS_COUNT; c++) {
                if (gp_rb_verify(&h->free_index[c]))
                        FAIL("a free index is not a valid red-black tree");
                indexed += h->free_index[c].count;
        }
        for (const struct heap_segment *s = h->segments; s; s = s->next) {
                if (s->next && s->next->prev != s)
                        FAIL("the segment list is broken after segment %" PRIu64, s->id);
                r = check_segment(h, s, &in_use, &asked, &blocks, &free_blocks, why, why_size);
                if (r < 0)
                        return r;
                count++;
                size += s->size;
                if (!s->live_blocks) {
                        empty++;
                        empty_bytes += s->size;
                }
        }
        for (const struct heap_segment *s = h->empty_head; s; s = s->empty_next) {
                if (s->heap != h || s->live_blocks)
                        FAIL("segment %" PRIu64 " is on the empty list but holds live blocks", s->id);
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
        if (indexed != free_blocks)
                FAIL("%" PRIu64 " blocks indexed free, %" PRIu64 " free", indexed, free_blocks);
        if (empty != listed || empty_bytes != listed_bytes || empty != h->empty_count || empty_bytes != h->empty_bytes)
                FAIL("%" PRIu64 " empty segments of %" PRIu64 " bytes, %" PRIu64 " of %" PRIu64 " listed, counted %" PRIu64
                     " of %" PRIu64, empty, empty_bytes, listed, listed_bytes, h->empty_count, h->empty_bytes);
        return 0;
}
