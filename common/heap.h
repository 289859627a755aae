/*
 * heap.h: the allocator core. Blocks carved from segments, free of I/O and of any notion of
 * who owns the memory: the caller adds segments it holds (the daemon's pool for one client,
 * libgpupool for one device of its process) and asks for blocks; the heap finds the best fit
 * among its free blocks in O(log n), splits it, and merges a freed block with its free
 * neighbours.
 *
 * Sizes are rounded to HEAP_BLOCK_ALIGN. Blocks live in one of two classes, each with its own
 * free index ordered by (size, segment id, offset), so that small requests are carved from
 * small segments and never split a large one: requests of at most HEAP_SMALL_REQUEST are
 * small. The segment sizes of the classes (heap_segment_bytes()) follow PyTorch's caching
 * allocator: 2 MiB for small requests, 20 MiB for those up to 10 MiB, else the request
 * rounded up to 2 MiB. A third class, never given by heap_class_of(), is for pieces: a
 * segment leased for one block alone (segments that grow in place give a block of gigabytes
 * one, client_grow.h): a block carved there takes the whole segment, and a free piece serves
 * again only a block it fits within a HEAP_PIECE_FIT_DIVISOR-th.
 *
 * A segment with no live block is "empty": it stays in the heap and serves the next requests
 * until its holder takes it out (heap_remove()), and the heap lists the empty ones in the
 * order they emptied, oldest first, for whoever gives idle memory back.
 *
 * A block may also be freed "held" (heap_free_held()): free for one lane (the caller's name
 * for a stream of work, 1 or more) at once, and for everyone else once the lane's fence of a
 * given number has passed (heap_release()). That is PyTorch's rule for a block freed on the
 * stream that reuses it: the stream orders the new work after the old, so no event is needed
 * until another stream, or the holder giving memory back, needs the block. Allocations on the
 * lane (heap_alloc_on()) carve held blocks as they carve free ones, and a held block merges
 * with its free neighbours and with those held for the same lane (the later fence wins); an
 * allocation on no lane or another one never sees it, and a segment holding one is not empty.
 * In a segment marked heap_hold_whole() a held block is neither merged nor split (its holder
 * counts what backs a block by the block's own span: client_grow.c), and serves only requests
 * of up to a quarter less than its size.
 *
 * Nothing here locks: the caller serializes every call on one heap.
 */
#ifndef GP_HEAP_H
#define GP_HEAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rbtree.h"

#define HEAP_BLOCK_ALIGN 512ULL
#define HEAP_SMALL_REQUEST (1ULL << 20)
#define HEAP_SMALL_SEGMENT (2ULL << 20)
#define HEAP_MEDIUM_REQUEST (10ULL << 20)
#define HEAP_MEDIUM_SEGMENT (20ULL << 20)
#define HEAP_SEGMENT_ALIGN (2ULL << 20)
/* The largest single request: larger ones are refused before any arithmetic can overflow. */
#define HEAP_MAX_REQUEST (1ULL << 46)

enum heap_class {
        HEAP_CLASS_SMALL,       /* blocks of at most HEAP_SMALL_REQUEST, from small segments */
        HEAP_CLASS_LARGE,       /* everything else */
        HEAP_CLASS_PIECE,       /* one block alone in a segment of its own, asked for by the caller */
        HEAP_CLASS_COUNT,
};

/* The classes heap_class_of() gives. */
#define HEAP_CARVED_CLASSES HEAP_CLASS_PIECE
/* A free piece serves a block of rsize bytes if it is at most rsize / HEAP_PIECE_FIT_DIVISOR larger (granule.h's budget). */
#define HEAP_PIECE_FIT_DIVISOR 24

struct heap_segment;

/* A block of a segment, free or live. Fields are read-only outside heap.c. */
struct heap_block {
        struct heap_segment *segment;
        uint64_t offset;
        uint64_t size;                  /* a multiple of HEAP_BLOCK_ALIGN */
        uint64_t asked;                 /* live: the rounded size it was carved for (size, or less by a rest kept) */
        bool free;
        uint32_t lane;                  /* free and held: for this lane until fence has passed; else 0 */
        uint64_t fence;
        struct heap_block *prev, *next; /* address order within the segment */
        struct gp_rb_node node;         /* free: the heap's free index (held: its held index); live: the segment's live tree */
        struct gp_rb_node by_fence;     /* held: the heap's held blocks by (lane, fence) */
};

/*
 * A segment as the heap sees it, embedded in the caller's own record of it (gp_rb_entry
 * finds the container). Read-only outside heap.c.
 */
struct heap_segment {
        uint64_t id;                    /* orders equal-size free blocks, lowest first; unique in a heap */
        uint64_t size;
        enum heap_class class;
        uint64_t live_blocks;
        uint64_t live_bytes;
        uint64_t held_blocks;           /* free blocks held for a lane (heap_free_held()) */
        bool hold_whole;                /* held blocks neither merge nor split (heap_hold_whole()) */
        struct heap_block *first;       /* the blocks in address order, tiling the segment */
        struct gp_rb_tree live;         /* live blocks by offset */
        struct heap *heap;              /* NULL while in no heap */
        struct heap_segment *prev, *next;               /* the heap's segments */
        struct heap_segment *empty_prev, *empty_next;   /* the heap's empty segments, while empty */
};

struct heap {
        struct gp_rb_tree free_index[HEAP_CLASS_COUNT];
        struct gp_rb_tree held_index[HEAP_CLASS_COUNT];        /* held blocks by (lane, size, segment id, offset) */
        struct gp_rb_tree held_fences;                          /* held blocks by (lane, fence, segment id, offset) */
        struct heap_segment *segments;
        struct heap_segment *empty_head, *empty_tail;   /* oldest emptied first */
        uint64_t segment_count;
        uint64_t size_bytes;            /* sum of the segments' sizes */
        uint64_t in_use_bytes;          /* sum of the live blocks' sizes */
        uint64_t asked_bytes;           /* sum of what they were carved for (without the rests they keep) */
        uint64_t blocks;                /* live blocks */
        uint64_t empty_count;
        uint64_t empty_bytes;           /* sum of the empty segments' sizes */
        uint64_t held_bytes;            /* sum of the held blocks' sizes (free for their lanes only) */
};

/* size rounded up to HEAP_BLOCK_ALIGN, or 0 for 0 or a size over HEAP_MAX_REQUEST. */
uint64_t heap_round(uint64_t size);

/* The class of a rounded size. */
enum heap_class heap_class_of(uint64_t rsize);

/* The segment size of a rounded request's class: 2 MiB, 20 MiB, or the request rounded up to 2 MiB. */
uint64_t heap_segment_bytes(uint64_t rsize);

/* The smallest segment that serves a rounded request: the request rounded up to 2 MiB. */
uint64_t heap_min_segment_bytes(uint64_t rsize);

void heap_init(struct heap *heap);

/*
 * Adds segment s (id, size, class; its other fields are set here) to heap as one free block.
 * Returns 0, -EINVAL for a size that is 0 or not a multiple of HEAP_BLOCK_ALIGN, or -ENOMEM.
 * The new segment counts as empty.
 */
int heap_add(struct heap *heap, struct heap_segment *s, uint64_t id, uint64_t size, enum heap_class class);

/* Takes an empty segment out of its heap. Returns 0, or -EBUSY while it holds a live or held block. */
int heap_remove(struct heap_segment *s);

/*
 * Takes a segment out of its heap whatever it holds: its live blocks are forgotten (their
 * holder can no longer touch them). Returns the bytes that were live in it.
 */
uint64_t heap_drop(struct heap_segment *s);

/*
 * Carves a block of rsize bytes (heap_round()ed, not 0) of class from the best-fitting free
 * block: the smallest that is large enough, the lowest segment id and offset among equals.
 * The rest is split off when it is at least HEAP_BLOCK_ALIGN in the small class, more than
 * HEAP_SMALL_REQUEST in the large one (as PyTorch does); else the block keeps it, so a large
 * block may be up to 1 MiB larger than asked. Returns the live block, or NULL when no free
 * block is large enough.
 */
struct heap_block *heap_alloc(struct heap *heap, enum heap_class class, uint64_t rsize);

/* The live block of s at offset, or NULL. */
struct heap_block *heap_find_live(const struct heap_segment *s, uint64_t offset);

/*
 * Frees a live block, merging it with its free neighbours (b is then gone). Returns true when
 * its segment holds no live block any more (it joins the empty list, newest).
 */
bool heap_free(struct heap *heap, struct heap_block *b);

/*
 * Frees a live block for lane (1 or more) at once and for the others once fence has passed
 * (heap_release()), merging it with its free neighbours and those held for the same lane
 * (the merged block waits for the later fence), but in a segment that holds whole.
 */
void heap_free_held(struct heap *heap, struct heap_block *b, uint32_t lane, uint64_t fence);

/*
 * heap_alloc() for an allocation on lane (0: none): the best fit among the free blocks and
 * those held for lane, by the same order (size, segment id, offset); in a segment that holds whole, a held block only
 * of at most a quarter more than rsize, carved whole. *ret_held says whether it was held.
 */
struct heap_block *heap_alloc_on(struct heap *heap, enum heap_class class, uint64_t rsize, uint32_t lane, bool *ret_held);

/*
 * How heap_alloc_cheapest() weighs free blocks beyond the best fit: cost() of carving rsize
 * bytes from the front of b (for segments that grow in place: the granules there not mapped),
 * for the best fit and the free blocks after it of at most max_size bytes, tries in all.
 */
struct heap_choice {
        uint64_t (*cost)(void *ctx, const struct heap_block *b, uint64_t rsize);
        void *ctx;
        uint64_t max_size;
        unsigned tries;
};

/*
 * heap_alloc_on(), but where it would carve a free block, it carves the first of those choice
 * weighs that costs least: the best fit unless a larger one costs less (choice NULL: the best
 * fit, which is heap_alloc_on()). A held block is taken as heap_alloc_on() takes it (it was
 * live: nothing to weigh), and a piece is carved whole.
 */
struct heap_block *heap_alloc_cheapest(struct heap *heap, enum heap_class class, uint64_t rsize, uint32_t lane, bool *ret_held,
                                       const struct heap_choice *choice);

/* heap_alloc() from empty segment s (of heap, a piece just added): its first block. NULL if s is not empty or too small. */
struct heap_block *heap_alloc_in(struct heap *heap, struct heap_segment *s, uint64_t rsize);

/* What heap_release() tells its caller; either may be NULL. */
struct heap_release_ops {
        /* Block b, held, is free for all now (called before it merges with its free neighbours). */
        void (*released)(void *ctx, struct heap_block *b);
        /* Segment s holds no live block and no held one any more (it joined the empty list, newest). */
        void (*emptied)(void *ctx, struct heap_segment *s);
};

/* Frees for all every block held for lane until a fence of at most fence. Returns how many. */
uint64_t heap_release(struct heap *heap, uint32_t lane, uint64_t fence, const struct heap_release_ops *ops, void *ctx);

/* Marks s as holding whole (see above), before any block of it is held. */
void heap_hold_whole(struct heap_segment *s);

/* The segment that has been empty longest, or NULL. */
struct heap_segment *heap_oldest_empty(const struct heap *heap);

/* Bytes in free blocks, held ones among them (the heap's size less what is in use). */
static inline uint64_t heap_free_bytes(const struct heap *heap) {
        return heap->size_bytes - heap->in_use_bytes;
}

/*
 * Checks every invariant: blocks tile each segment without overlap, no two free neighbours that
 * should have merged, the free and held indexes hold exactly the free and held blocks and each
 * segment's live tree its live ones, the empty list exactly the segments with neither, and
 * every sum. Returns 0, or
 * -EUCLEAN with what is wrong in why.
 */
int heap_check(const struct heap *heap, char *why, size_t why_size);

#endif
