/*
 * client_scope.c: scopes and arenas. A scope frees what was allocated in it and not freed,
 * into the process's pool; an arena is one block of the pool, bump-allocated.
 */
#include "client_common.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "client_call.h"
#include "client_pool.h"
#include "client_segment.h"

GPUPOOL_EXPORT int gpupool_scope_begin(gpupool_client *c) {
        int r = 0;

        if (!c)
                return client_invalid(NULL, "%s: no handle (NULL): gpupool_connect() gives one", __func__);
        pthread_mutex_lock(&c->lock);
        if (c->scope.depth == CLIENT_MAX_SCOPES) {
                client_set_error(c, "scopes nest at most %d deep", CLIENT_MAX_SCOPES);
                r = -EINVAL;
        } else {
                c->scope.ids[c->scope.depth] = ++c->scope.next;
                /* The threads' fast path reads it unlocked: it serves no allocation inside a scope. */
                __atomic_store_n(&c->scope.depth, c->scope.depth + 1, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&c->lock);
        return r;
}

GPUPOOL_EXPORT int gpupool_scope_end(gpupool_client *c) {
        uint32_t scope;

        if (!c)
                return client_invalid(NULL, "%s: no handle (NULL): gpupool_connect() gives one", __func__);
        pthread_mutex_lock(&c->lock);
        if (!c->scope.depth) {
                client_set_error(c, "gpupool_scope_end without gpupool_scope_begin");
                pthread_mutex_unlock(&c->lock);
                return -EINVAL;
        }
        scope = c->scope.ids[c->scope.depth - 1];
        __atomic_store_n(&c->scope.depth, c->scope.depth - 1, __ATOMIC_RELEASE);
        for (unsigned i = 0; i < CLIENT_SHARDS; i++) {
                struct live_shard *s = &c->live[i];
                struct gp_rb_node *x, *next;

                pthread_mutex_lock(&s->lock);
                for (x = gp_rb_first(&s->blocks); x; x = next) {
                        struct block *b = gp_rb_entry(x, struct block, node);

                        next = gp_rb_next(x);
                        if (b->scope == scope) {
                                gp_rb_remove(&s->blocks, x);
                                (void) client_free_unlinked(c, b);
                        }
                }
                pthread_mutex_unlock(&s->lock);
        }
        pthread_mutex_unlock(&c->lock);
        return 0;
}

struct gpupool_arena {
        gpupool_client *client;
        uint8_t *base;
        size_t size, used;
};

GPUPOOL_EXPORT int gpupool_arena_create(gpupool_client *c, int device, size_t bytes, gpupool_arena **ret_arena) {
        gpupool_arena *a;
        int r;

        if (!c)
                return client_invalid(NULL, "%s: no handle (NULL): gpupool_connect() gives one", __func__);
        if (!ret_arena)
                return client_invalid(c, "gpupool_arena_create: no place for the arena (ret_arena is NULL)");
        if (bytes == 0)
                return client_invalid(c, "gpupool_arena_create: an arena of 0 bytes: it is 1 byte or more");
        a = calloc(1, sizeof(*a));
        if (!a)
                return -ENOMEM;
        r = gpupool_alloc(c, device, bytes, (void **) &a->base);
        if (r < 0) {
                free(a);
                return r;
        }
        a->client = c;
        a->size = bytes;
        *ret_arena = a;
        return 0;
}

GPUPOOL_EXPORT int gpupool_arena_alloc(gpupool_arena *a, size_t size, size_t align, void **ret_ptr) {
        uintptr_t at, end;

        if (!a)
                return client_invalid(NULL, "gpupool_arena_alloc: no arena (NULL): gpupool_arena_create() gives one");
        if (!ret_ptr)
                return client_invalid(a->client, "gpupool_arena_alloc: no place for the pointer (ret_ptr is NULL)");
        if (size == 0)
                return client_invalid(a->client, "gpupool_arena_alloc: cannot allocate 0 bytes");
        if (align & (align - 1))
                return client_invalid(a->client, "gpupool_arena_alloc: an alignment of %zu: a power of two (0: 256)", align);
        if (!align)
                align = 256;
        at = ((uintptr_t) a->base + a->used + align - 1) & ~(uintptr_t) (align - 1);
        end = (uintptr_t) a->base + a->size;
        if (at < (uintptr_t) a->base || at > end || size > end - at) {
                pthread_mutex_lock(&a->client->lock);
                client_set_error(a->client, "the arena of %zu bytes has %zu left, less than the %zu asked (aligned to %zu)",
                                 a->size, a->size - a->used, size, align);
                pthread_mutex_unlock(&a->client->lock);
                return -ENOSPC;
        }
        a->used = at + size - (uintptr_t) a->base;
        *ret_ptr = (void *) at;
        return 0;
}

GPUPOOL_EXPORT void gpupool_arena_reset(gpupool_arena *a) {
        if (a)
                a->used = 0;
}

GPUPOOL_EXPORT size_t gpupool_arena_used(const gpupool_arena *a) {
        return a ? a->used : 0;
}

GPUPOOL_EXPORT int gpupool_arena_destroy(gpupool_arena *a) {
        int r;

        if (!a)
                return 0;
        r = gpupool_free(a->client, a->base);
        free(a);
        return r;
}

