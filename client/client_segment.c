/*
 * client_segment.c: the segments the handle maps and the table of the live blocks it hands out.
 *
 * The library maps each segment it leases once, through the handle's memory seam
 * (client_mem.h: an mmap of a memfd, an opened IPC handle, an imported cuMemCreate
 * descriptor), keeps a segment's descriptor for a daemon after this one to adopt
 * (client_keep.c), keeps the mappings in trees (by address, by segment id, and by IPC handle
 * where segments come as handles), and keeps the live blocks it handed out in a table of its
 * own sharded by address.
 */
#define _GNU_SOURCE
#include "client_segment.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_keep.h"
#include "client_mem.h"

#define CMP(a, b) ((a) < (b) ? -1 : (a) > (b))

static int cmp_addr(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        return CMP((uintptr_t) gp_rb_entry(x, struct mapping, by_addr)->base,
                   (uintptr_t) gp_rb_entry(y, struct mapping, by_addr)->base);
}

static int cmp_id(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        return CMP(gp_rb_entry(x, struct mapping, by_id)->segment_id, gp_rb_entry(y, struct mapping, by_id)->segment_id);
}

static int cmp_handle(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        return memcmp(gp_rb_entry(x, struct mapping, by_handle)->handle, gp_rb_entry(y, struct mapping, by_handle)->handle,
                      GP_IPC_HANDLE_BYTES);
}

static int cmp_block(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        return CMP((uintptr_t) gp_rb_entry(x, struct block, node)->ptr, (uintptr_t) gp_rb_entry(y, struct block, node)->ptr);
}

static struct live_shard *shard_of(gpupool_client *c, const void *ptr) {
        /* Blocks are 512-byte aligned: hash the bits above, Fibonacci-style, into the top bits. */
        uint64_t h = ((uint64_t) (uintptr_t) ptr >> 9) * 0x9E3779B97F4A7C15ULL;

        return &c->live[h >> (64 - 5)];
}
_Static_assert(CLIENT_SHARDS == 1 << 5, "shard_of() hashes into 5 bits");

int client_live_insert(gpupool_client *c, struct block *b) {
        struct live_shard *s = shard_of(c, b->ptr);
        struct gp_rb_node *dup;

        pthread_mutex_lock(&s->lock);
        /* Checked under the shard's lock: drop_everything() bumps the epoch before it empties the shards. */
        if (b->epoch != __atomic_load_n(&c->epoch, __ATOMIC_ACQUIRE)) {
                pthread_mutex_unlock(&s->lock);
                return -ESTALE;
        }
        dup = gp_rb_insert(&s->blocks, &b->node);
        pthread_mutex_unlock(&s->lock);
        return dup ? -EEXIST : 0;
}

void client_live_remove(gpupool_client *c, struct block *b) {
        struct live_shard *s = shard_of(c, b->ptr);

        pthread_mutex_lock(&s->lock);
        gp_rb_remove(&s->blocks, &b->node);
        pthread_mutex_unlock(&s->lock);
}

struct block *client_live_take(gpupool_client *c, const void *ptr) {
        struct live_shard *s = shard_of(c, ptr);
        struct block key = { .ptr = (uint8_t *) ptr }, *b = NULL;
        struct gp_rb_node *n;

        pthread_mutex_lock(&s->lock);
        n = gp_rb_find(&s->blocks, &key.node);
        if (n) {
                b = gp_rb_entry(n, struct block, node);
                gp_rb_remove(&s->blocks, n);
        }
        pthread_mutex_unlock(&s->lock);
        return b;
}

int client_live_range(gpupool_client *c, const void *ptr, void **ret_base, uint64_t *ret_size) {
        struct block key = { .ptr = (uint8_t *) ptr };
        const struct block *best = NULL;

        /* Sharded by start: the block holding ptr starts at or below it, in whichever shard. */
        for (unsigned i = 0; i < CLIENT_SHARDS; i++) {
                struct live_shard *s = &c->live[i];
                struct gp_rb_node *n;

                pthread_mutex_lock(&s->lock);
                n = gp_rb_floor(&s->blocks, &key.node);
                if (n) {
                        const struct block *b = gp_rb_entry(n, struct block, node);

                        if ((uintptr_t) ptr - (uintptr_t) b->ptr < b->size && (!best || b->ptr > best->ptr)) {
                                *ret_base = b->ptr;
                                *ret_size = b->size;
                                best = b;
                        }
                }
                pthread_mutex_unlock(&s->lock);
                if (best)
                        return 0;
        }
        return -ENOENT;
}

void client_segments_init(gpupool_client *c) {
        gp_rb_init(&c->by_addr, cmp_addr);
        gp_rb_init(&c->by_id, cmp_id);
        gp_rb_init(&c->by_handle, cmp_handle);
        for (unsigned i = 0; i < CLIENT_SHARDS; i++) {
                pthread_mutex_init(&c->live[i].lock, NULL);
                gp_rb_init(&c->live[i].blocks, cmp_block);
        }
}

void client_segments_destroy(gpupool_client *c) {
        for (unsigned i = 0; i < CLIENT_SHARDS; i++)
                pthread_mutex_destroy(&c->live[i].lock);
}

void client_live_forget(gpupool_client *c) {
        struct gp_rb_node *n;

        __atomic_add_fetch(&c->epoch, 1, __ATOMIC_SEQ_CST);
        for (unsigned i = 0; i < CLIENT_SHARDS; i++) {
                pthread_mutex_lock(&c->live[i].lock);
                while ((n = gp_rb_first(&c->live[i].blocks))) {
                        gp_rb_remove(&c->live[i].blocks, n);
                        free(gp_rb_entry(n, struct block, node));
                }
                pthread_mutex_unlock(&c->live[i].lock);
        }
}

void client_mapping_drop(gpupool_client *c, struct mapping *m) {
        /* Forgotten with its blocks (the session is over); a returned segment left its heap already. */
        if (m->hs.heap)
                (void) heap_drop(&m->hs);
        gp_rb_remove(&c->by_addr, &m->by_addr);
        gp_rb_remove(&c->by_id, &m->by_id);
        if (c->mem->ipc)
                gp_rb_remove(&c->by_handle, &m->by_handle);
        c->mem->segment_unmap(c, m);
        client_fd_release(m->fd);
        free(m);
}

/* What identifies a segment that comes as an IPC handle: one open per allocation per process. Returns 0 or -EPROTO. */
static int take_handle(gpupool_client *c, struct mapping *m, const ProtobufCBinaryData *ipc_handle) {
        if (!ipc_handle || ipc_handle->len != GP_IPC_HANDLE_BYTES) {
                client_set_error(c, "gpupoold sent a CUDA segment without its IPC handle");
                return -EPROTO;
        }
        memcpy(m->handle, ipc_handle->data, GP_IPC_HANDLE_BYTES);
        /* A handle we hold already means we disagree with the daemon. */
        if (gp_rb_find(&c->by_handle, &m->by_handle)) {
                client_set_error(c, "gpupoold handed over a segment this process already has open");
                return -EPROTO;
        }
        return 0;
}

int client_mapping_add(gpupool_client *c, unsigned device, uint64_t segment_id, uint64_t size,
                       const ProtobufCBinaryData *ipc_handle, int fd, struct mapping **ret) {
        const struct client_mem_ops *mem = c->mem;
        struct mapping *m = calloc(1, sizeof(*m));
        int r;

        if (!m) {
                if (fd >= 0)
                        close(fd);
                return -ENOMEM;
        }
        m->segment_id = segment_id;
        m->size = size;
        m->device = device;
        m->fd = -1;
        if (mem->ipc) {
                if (fd >= 0)
                        close(fd);
                fd = -1;
                r = take_handle(c, m, ipc_handle);
        } else if (fd < 0) {
                client_set_error(c, "gpupoold sent a segment without its file descriptor");
                r = -EPROTO;
        } else {
                r = 0;
        }
        if (r == 0)
                r = mem->segment_map(c, m, fd);
        if (r < 0) {
                if (fd >= 0)
                        close(fd);
                free(m);
                return r;
        }
        if (mem->ipc)
                gp_rb_insert(&c->by_handle, &m->by_handle);
        if (fd >= 0 && !mem->adopted_held)
                m->fd = client_fd_keep(fd);     /* for a daemon after this one to adopt */
        else if (fd >= 0)
                close(fd);      /* the mapping holds the memory; a daemon after this one adopts it by our word */
        gp_rb_insert(&c->by_addr, &m->by_addr);
        gp_rb_insert(&c->by_id, &m->by_id);
        c->segments_imported++;
        *ret = m;
        return 0;
}

void client_mapping_unlink(gpupool_client *c, struct mapping *m) {
        gp_rb_remove(&c->by_addr, &m->by_addr);
        gp_rb_remove(&c->by_id, &m->by_id);
        if (c->mem->ipc)
                gp_rb_remove(&c->by_handle, &m->by_handle);
}

struct mapping *client_mapping_by_id(gpupool_client *c, uint64_t segment_id) {
        struct mapping key = { .segment_id = segment_id };
        struct gp_rb_node *n = gp_rb_find(&c->by_id, &key.by_id);

        return n ? gp_rb_entry(n, struct mapping, by_id) : NULL;
}

void client_mappings_forget(gpupool_client *c) {
        struct gp_rb_node *n;

        while ((n = gp_rb_first(&c->by_addr)))
                client_mapping_drop(c, gp_rb_entry(n, struct mapping, by_addr));
}
