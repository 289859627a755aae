/*
 * client_scope.c: scopes and arenas. A scope frees what was allocated in it and not freed, in
 * batch requests (FreeBatchRequest); an arena is one block from the daemon, bump-allocated in
 * the process.
 */
#include "client.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

GPUPOOL_EXPORT int gpupool_scope_begin(gpupool_client *c) {
        int r = 0;

        if (!c)
                return -EINVAL;
        pthread_mutex_lock(&c->lock);
        if (c->scope_depth == CLIENT_MAX_SCOPES) {
                client_set_error(c, "scopes nest at most %d deep", CLIENT_MAX_SCOPES);
                r = -EINVAL;
        } else {
                c->scopes[c->scope_depth] = ++c->next_scope;
                __atomic_store_n(&c->scope_depth, c->scope_depth + 1, __ATOMIC_RELAXED);
        }
        pthread_mutex_unlock(&c->lock);
        return r;
}

/*
 * Frees up to CLIENT_BATCH blocks, out of the live table already, in one request. Segments
 * left without a live block are unmapped first and released in the same request, unless this
 * handle keeps free segments (then the daemon decides, and says which to release). Locked.
 */
static int free_batch(gpupool_client *c, struct block **blocks, size_t n) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__FreeBatchRequest fb = GPUPOOL__FREE_BATCH_REQUEST__INIT;
        Gpupool__FreeRequest frees[CLIENT_BATCH], *free_ptrs[CLIENT_BATCH];
        uint64_t release[CLIENT_BATCH];
        size_t nrelease = 0;
        int r;

        if (c->leasing) {
                /* The process's pool takes them back in the process: nothing to ask. */
                for (size_t i = 0; i < n; i++)
                        (void) client_pool_free(c, blocks[i]);
                return 0;
        }
        for (size_t i = 0; i < n; i++) {
                struct mapping *m = blocks[i]->mapping;

                gpupool__free_request__init(&frees[i]);
                frees[i].segment_id = m->segment_id;
                frees[i].offset = (uint64_t) (blocks[i]->ptr - m->base);
                free_ptrs[i] = &frees[i];
                free(blocks[i]);
                if (--m->live == 0 && !c->keep_free_bytes) {
                        release[nrelease++] = m->segment_id;
                        client_mapping_drop(c, m);
                }
        }
        fb.n_frees = n;
        fb.frees = free_ptrs;
        fb.n_release_segment_ids = nrelease;
        fb.release_segment_ids = release;
        req.body_case = GPUPOOL__ENVELOPE__BODY_FREE_BATCH;
        req.free_batch = &fb;
        r = client_call(c, &req, GPUPOOL__ENVELOPE__BODY_FREE_BATCH_REPLY, &rep, NULL);
        if (r < 0)
                return r;
        /* Segments the daemon wants back that we did not release already (this handle keeps some). */
        for (size_t i = 0; i < rep->free_batch_reply->n_release_segment_ids; i++) {
                uint64_t id = rep->free_batch_reply->release_segment_ids[i];

                client_release_segment(c, client_mapping_by_id(c, id), id);
        }
        r = rep->free_batch_reply->not_found ? -ENOENT : 0;
        if (r < 0)
                client_set_error(c, "gpupoold knew %u of the scope's blocks as freed already",
                                 rep->free_batch_reply->not_found);
        gpupool__envelope__free_unpacked(rep, NULL);
        return r;
}

GPUPOOL_EXPORT int gpupool_scope_end(gpupool_client *c) {
        struct block *batch[CLIENT_BATCH];
        uint32_t scope;
        int r = 0;

        if (!c)
                return -EINVAL;
        pthread_mutex_lock(&c->lock);
        if (!c->scope_depth) {
                client_set_error(c, "gpupool_scope_end without gpupool_scope_begin");
                pthread_mutex_unlock(&c->lock);
                return -EINVAL;
        }
        scope = c->scopes[c->scope_depth - 1];
        __atomic_store_n(&c->scope_depth, c->scope_depth - 1, __ATOMIC_RELAXED);
        for (;;) {
                size_t n = 0;

                /* Blocks freed with a stream are the reaper's; the scope leaves them be. */
                for (unsigned i = 0; i < CLIENT_SHARDS && n < CLIENT_BATCH; i++) {
                        struct live_shard *s = &c->live[i];
                        struct gp_rb_node *x, *next;

                        pthread_mutex_lock(&s->lock);
                        for (x = gp_rb_first(&s->blocks); x && n < CLIENT_BATCH; x = next) {
                                struct block *b = gp_rb_entry(x, struct block, node);

                                next = gp_rb_next(x);
                                if (b->scope == scope && !b->freeing) {
                                        gp_rb_remove(&s->blocks, x);
                                        batch[n++] = b;
                                }
                        }
                        pthread_mutex_unlock(&s->lock);
                }
                if (!n)
                        break;
                r = free_batch(c, batch, n);
                if (r < 0 && r != -ENOENT)
                        break;
        }
        pthread_mutex_unlock(&c->lock);
        return r;
}

struct gpupool_arena {
        gpupool_client *client;
        uint8_t *base;
        size_t size, used;
};

GPUPOOL_EXPORT int gpupool_arena_create(gpupool_client *c, int device, size_t bytes, gpupool_arena **ret_arena) {
        gpupool_arena *a;
        int r;

        if (!c || !ret_arena || bytes == 0)
                return -EINVAL;
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

        if (!a || !ret_ptr || size == 0 || (align & (align - 1)))
                return -EINVAL;
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

