/*
 * client_cache.c: the client cache. A freed block stays in the process, still allocated at
 * the daemon, indexed by (device, rounded size, address), so that the next allocation of
 * that size takes it back with no round trip; past the bound the least recently freed go back
 * to the daemon. A block freed with a stream waits in the cache, reusable on that stream only,
 * until the stream's work before the free is done (client_cuda.c says when).
 *
 * This is the shared part, under the handle's lock. In front of it each thread keeps a few
 * blocks of its own (client_magazine.c); the bound counts both (cached_total), and giving the
 * cache back empties the magazines too once the shared part alone is not enough.
 */
#include "client.h"

#include <errno.h>
#include <stdlib.h>

#define CMP(a, b) ((a) < (b) ? -1 : (a) > (b))

/* The cache's order: device, then size, then address (a key with address 0 finds the first of a size). */
static int cmp_cached(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        const struct block *a = gp_rb_entry(x, struct block, node), *b = gp_rb_entry(y, struct block, node);

        if (a->mapping->device != b->mapping->device)
                return CMP(a->mapping->device, b->mapping->device);
        if (a->size != b->size)
                return CMP(a->size, b->size);
        return CMP((uintptr_t) a->ptr, (uintptr_t) b->ptr);
}

void client_cache_init(gpupool_client *c, uint64_t limit_bytes, uint64_t idle_ms, bool magazines) {
        gp_rb_init(&c->cache, cmp_cached);
        c->cache_limit = limit_bytes;
        /* A thread keeps blocks up to an eighth of the bound for itself; bigger ones are rare enough to share. */
        c->magazine_max = magazines ? limit_bytes / 8 : 0;
        c->cache_idle_ms = idle_ms;
}

static void lru_unlink(gpupool_client *c, struct block *b) {
        if (b->lru_prev)
                b->lru_prev->lru_next = b->lru_next;
        else
                c->lru_head = b->lru_next;
        if (b->lru_next)
                b->lru_next->lru_prev = b->lru_prev;
        else
                c->lru_tail = b->lru_prev;
        b->lru_prev = b->lru_next = NULL;
}

/* Takes a block out of the cache (it is still allocated at the daemon). Locked. */
void client_cache_take(gpupool_client *c, struct block *b) {
        gp_rb_remove(&c->cache, &b->node);
        if (b->pending) {
                /* Reused on its own stream before its work ended: the stream orders it; forget the event. */
                b->pending->block = NULL;
                b->pending = NULL;
                b->stream = NULL;
                return;
        }
        lru_unlink(c, b);
        c->cache_bytes -= b->size;
        __atomic_sub_fetch(&c->cached_total, b->size, __ATOMIC_RELAXED);
}

static uint64_t cached_total(gpupool_client *c) {
        return __atomic_load_n(&c->cached_total, __ATOMIC_RELAXED);
}

/*
 * Gives the daemon back what the cache holds, least recently freed first, until it holds at
 * most keep bytes: the shared part first, then what the magazines hold, moved to it. Locked.
 */
int client_cache_shrink(gpupool_client *c, uint64_t keep) {
        bool drained = false;
        int r = 0;

        while (cached_total(c) > keep) {
                struct block *b = c->lru_head;
                int e;

                if (!b) {
                        if (drained)
                                break;
                        client_magazines_drain(c);
                        drained = true;
                        continue;
                }
                client_cache_take(c, b);
                e = client_block_release(c, b);
                if (e < 0 && r == 0)
                        r = e;
        }
        return r;
}

static void lru_append(gpupool_client *c, struct block *b) {
        b->lru_prev = c->lru_tail;
        b->lru_next = NULL;
        if (c->lru_tail)
                c->lru_tail->lru_next = b;
        else
                c->lru_head = b;
        c->lru_tail = b;
        c->cache_bytes += b->size;
}

/* Makes a cached block available to any allocation, least recently freed last. Locked. */
static int cache_ready(gpupool_client *c, struct block *b) {
        lru_append(c, b);
        __atomic_add_fetch(&c->cached_total, b->size, __ATOMIC_RELAXED);
        return client_cache_shrink(c, c->cache_limit);
}

void client_cache_adopt(gpupool_client *c, struct block *b) {
        /* Counted in cached_total already, in its magazine. */
        gp_rb_insert(&c->cache, &b->node);
        lru_append(c, b);
}

bool client_cache_accepts(gpupool_client *c, const struct block *b) {
        return b->size <= c->cache_limit && !__atomic_load_n(&c->conn.broken, __ATOMIC_RELAXED);
}

int client_free_block(gpupool_client *c, struct block *b) {
        client_live_remove(c, b);
        return client_free_unlinked(c, b);
}

int client_free_unlinked(gpupool_client *c, struct block *b) {
        if (b->epoch != c->epoch) {
                /* Taken out by a thread while gpupool_reconnect() forgot the session it came from. */
                free(b);
                return 0;
        }
        if (!client_cache_accepts(c, b))
                return client_block_release(c, b);
        /* Kept for this process's next allocation of the size: no round trip now or then. */
        c->cache_uses++;
        gp_rb_insert(&c->cache, &b->node);
        return cache_ready(c, b);
}

bool client_cache_pending(gpupool_client *c, struct block *b, void *stream, struct deferred *q) {
        if (!client_cache_accepts(c, b))
                return false;
        b->stream = stream;
        b->pending = q;
        c->cache_uses++;
        gp_rb_insert(&c->cache, &b->node);
        return true;
}

void client_cache_ready(gpupool_client *c, struct block *b) {
        b->pending = NULL;
        b->stream = NULL;
        (void) cache_ready(c, b);
}

/*
 * A cached block of exactly this device and rounded size whose work is done, or, for an
 * allocation on stream, one freed on that same stream (its order makes waiting needless); or
 * NULL. Locked.
 */
struct block *client_cache_find(gpupool_client *c, unsigned device, uint64_t rsize, void *stream, bool on_stream) {
        struct mapping on_device = { .device = device };
        struct block key = { .mapping = &on_device, .size = rsize, .ptr = NULL };

        for (struct gp_rb_node *n = gp_rb_lower_bound(&c->cache, &key.node); n; n = gp_rb_next(n)) {
                struct block *b = gp_rb_entry(n, struct block, node);

                if (b->mapping->device != device || b->size != rsize)
                        return NULL;
                if (!b->pending || (on_stream && b->stream == stream))
                        return b;
        }
        return NULL;
}

GPUPOOL_EXPORT int gpupool_trim(gpupool_client *c) {
        int r;

        if (!c)
                return -EINVAL;
        pthread_mutex_lock(&c->lock);
        r = c->leasing ? client_pool_trim(c, -1, UINT64_MAX) : client_cache_shrink(c, 0);
        pthread_mutex_unlock(&c->lock);
        return r;
}

GPUPOOL_EXPORT size_t gpupool_cached_bytes(gpupool_client *c) {
        size_t bytes;

        if (!c)
                return 0;
        if (!c->leasing)
                return cached_total(c);
        pthread_mutex_lock(&c->lock);
        bytes = client_pool_free_bytes(c);
        pthread_mutex_unlock(&c->lock);
        return bytes;
}

/* Drops the cache's records without telling the daemon (it is leaving, or gone). Locked. */
void client_cache_forget(gpupool_client *c) {
        struct gp_rb_node *n;

        while ((n = gp_rb_first(&c->cache))) {
                gp_rb_remove(&c->cache, n);
                free(gp_rb_entry(n, struct block, node));
        }
        c->lru_head = c->lru_tail = NULL;
        __atomic_sub_fetch(&c->cached_total, c->cache_bytes, __ATOMIC_RELAXED);
        c->cache_bytes = 0;
        client_magazines_forget(c, false);
}


void client_cache_tick(gpupool_client *c, uint64_t now_ms) {
        /* Idle means no use since the previous tick for idle_ms: the hot path only counts. */
        uint64_t uses = c->cache_uses + client_magazines_collect(c);

        if (uses != c->cache_uses_seen) {
                c->cache_uses_seen = uses;
                c->cache_quiet_since_ms = now_ms;
                return;
        }
        if (cached_total(c) && c->cache_idle_ms && now_ms - c->cache_quiet_since_ms >= c->cache_idle_ms)
                (void) client_cache_shrink(c, 0);
}
