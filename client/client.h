/*
 * client.h: libgpupool's insides, shared by its files: client.c (the handle, the protocol,
 * segments and blocks), client_pool.c (the process's own pool), client_control.c (the
 * control channel), client_tcache.c (each thread's cache of the small blocks it freed),
 * client_scope.c, client_hooks.c, and client_cuda.c (the CUDA driver: device UUIDs, IPC handles,
 * stream-ordered frees).
 */
#ifndef GP_CLIENT_H
#define GP_CLIENT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "conn.h"
#include "cudadrv.h"
#include "gpupool.h"
#include "heap.h"
#include "rbtree.h"

#define CLIENT_MAX_DEVICES 64
#define CLIENT_MAX_SCOPES 16
#define CLIENT_SHARDS 32        /* live-block table shards: threads freeing different blocks rarely meet */
#define CLIENT_RETURN_BATCH 256 /* segments per ReturnRequest or ReclaimReply: what the daemon takes in one */

/* One segment this process maps: an mmap of a memfd (host) or an opened IPC handle (cuda). */
struct mapping {
        uint64_t segment_id;
        uint64_t size;
        uint8_t *base;                  /* host: the mmap; cuda: the CUdeviceptr */
        unsigned device;                /* the daemon's index */
        bool ipc;
        uint8_t handle[GP_CU_IPC_HANDLE_SIZE];
        struct gp_rb_node by_addr;
        struct gp_rb_node by_id;
        struct gp_rb_node by_handle;    /* ipc only */
        /* Leased whole: the process's pool carves it (client_pool.c). */
        struct heap_segment hs;
        uint64_t emptied_ms;            /* when it last held no live block (client_now_ms()) */
};

/* One live block handed to the application. */
struct block {
        uint8_t *ptr;
        uint64_t size;                  /* as the pool rounded it */
        struct mapping *mapping;        /* its segment, and through it its device */
        struct heap_block *hb;          /* the process's pool's record of it */
        bool freeing;                   /* gpupool_free_async() queued it */
        uint32_t scope;                 /* the scope it was allocated in, 0: none */
        int local_device;               /* the device number the application asked for */
        uint64_t epoch;                 /* the handle's session it belongs to (gpupool_reconnect() starts a new one) */
        struct gp_rb_node node;         /* in a live shard */
};

/* A shard of the live blocks, by address: its own lock, on its own cache line. */
struct live_shard {
        pthread_mutex_t lock;
        struct gp_rb_tree blocks;
} __attribute__((aligned(64)));

/* A block whose free waits for the device work queued before it (gpupool_free_async). */
struct deferred {
        struct deferred *next;
        struct block *block;            /* NULL once reused on its stream before the work ended */
        void *stream;                   /* the stream it was freed on */
        unsigned device;
        gp_cu_event event;
};

/* A daemon device as this process sees it. */
struct client_device {
        bool visible;                   /* the GPU with this UUID is visible here */
        gp_cu_device dev;               /* this process's handle for it */
        gp_cu_context ctx;              /* its primary context, retained on first use */
        gp_cu_event *spare_events;      /* recorded-and-done events kept for reuse */
        unsigned spare_count, spare_cap;
        struct heap heap;               /* the process's pool on this device: every segment it leases */
        uint64_t reported_in_use, reported_held_free;   /* as the daemon last heard (client_pool_usage()) */
};

struct tcache;

struct gpupool_client {
        uint64_t serial;                /* unique in the process: a thread's cache names its handle by it */
        pthread_mutex_t lock;           /* everything below but what conn_busy lends out */
        /*
         * The main connection: used under the lock, one request at a time, except by a lease
         * (client_call_unlocked()), which lends it out with conn_busy and lets go of the lock
         * while the daemon may park it, so that the control thread and the other threads go on.
         */
        struct gp_conn conn;
        bool conn_busy;
        pthread_cond_t conn_idle;       /* signalled when conn_busy clears */
        uint64_t round_trips;           /* conn.calls as of the latest call's end */
        char error[GP_MAX_ERROR_BYTES]; /* why the latest call failed (gpupool_last_error()) */
        char socket_path[108];          /* as given to connect, for reconnect ("" = the default) */
        char name[64];
        unsigned device_count;
        bool cuda;                      /* the daemon serves CUDA devices */
        struct gp_cuda cu;
        struct client_device devices[CLIENT_MAX_DEVICES];
        int local_to_daemon[CLIENT_MAX_DEVICES];        /* this process's CUDA ordinal -> daemon index, or -1 */
        int local_count;
        struct gp_rb_tree by_addr, by_id, by_handle;
        /* Live blocks the application holds, by address; a shard's lock nests inside the handle's. */
        struct live_shard live[CLIENT_SHARDS];
        uint64_t epoch;                 /* atomic; written locked: bumped when every block is forgotten */
        uint64_t segments_imported;     /* segments mapped since connect */
        /* Open scopes, innermost last (gpupool_scope_begin/end). */
        uint32_t scopes[CLIENT_MAX_SCOPES];
        unsigned scope_depth;           /* written locked, read atomically (the threads' fast path) */
        uint32_t next_scope;
        struct tcache *tcaches;         /* the threads' caches of freed small blocks (client_tcache.c) */
        uint64_t idle_return_ms;        /* empty segments go back after this long ($GPUPOOL_IDLE_RETURN; 0: never) */
        /* The control channel: the daemon's reclaim requests, answered by the control thread. */
        struct gp_conn *control;
        bool daemon_gone;               /* atomic: the control channel closed under us (the process pool then serves nothing) */
        pthread_t control_thread;
        bool control_started;
        /* Stream-ordered frees, oldest first, and the thread that completes them. */
        struct deferred *deferred_head, *deferred_tail;
        pthread_cond_t deferred_cond;
        pthread_t reaper;
        bool reaper_started, stopping;
};

void client_set_error(gpupool_client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Waits (letting go of the lock meanwhile) until no lease has the main connection out. Locked. */
void client_conn_wait(gpupool_client *c);

/* gp_conn_call() on the main connection, once no lease has it out; its error into c->error. Locked. */
int client_call(gpupool_client *c, Gpupool__Envelope *req, Gpupool__Envelope__BodyCase want,
                Gpupool__Envelope **ret_reply, int *ret_fd);

/*
 * The same, letting go of the lock while the request is out, for a request the daemon may park
 * until other processes give memory back: this process's control thread must meanwhile be
 * able to answer the daemon's own reclaim requests, or two such processes wait on each other.
 * Locked on entry and on return; anything read before may have changed (but the session:
 * reconnect and disconnect wait for the connection).
 */
int client_call_unlocked(gpupool_client *c, Gpupool__Envelope *req, Gpupool__Envelope__BodyCase want,
                         Gpupool__Envelope **ret_reply, int *ret_fd);

/* client.c, all called locked but the live table's. */

/* The live-block table. Each takes the block's shard lock; callable with or without the handle's. */
int client_live_insert(gpupool_client *c, struct block *b);            /* -EEXIST: its address is live already */
void client_live_remove(gpupool_client *c, struct block *b);
/* Takes the live block at ptr out of the table for freeing; NULL if none (or being freed already). */
struct block *client_live_take(gpupool_client *c, const void *ptr);

/* The mapping of a segment, or NULL; and unmapping one (out of the process's pool, if in it). */
struct mapping *client_mapping_by_id(gpupool_client *c, uint64_t segment_id);
void client_mapping_drop(gpupool_client *c, struct mapping *m);

/*
 * Maps a segment the daemon handed over: fd (host backend; taken, closed on failure too) or
 * ipc_handle (cuda). Returns 0 with the mapping, or a negative errno with the error set.
 */
int client_mapping_add(gpupool_client *c, unsigned device, uint64_t segment_id, uint64_t size,
                       const ProtobufCBinaryData *ipc_handle, int fd, struct mapping **ret);

/* CLOCK_MONOTONIC in milliseconds. */
uint64_t client_now_ms(void);

/* Frees a block the application gave up (the device is done with it) into the process's pool. */
int client_free_block(gpupool_client *c, struct block *b);

/* The same for a block already out of the live table (client_live_take()). */
int client_free_unlinked(gpupool_client *c, struct block *b);

/* client_control.c: the control channel. */

/* Opens the control channel of client id and starts its thread. Locked or private. Returns 0 or a negative errno. */
int client_control_open(gpupool_client *c, const char *socket_path, const char *name, uint64_t id);

/* Stops the control thread and closes its channel. Call unlocked: the thread takes the lock. */
void client_control_close(gpupool_client *c);

/* client_pool.c: the process's own pool, all called locked. */

/* Allocates a block of rsize (rounded) bytes on daemon device d from the pool, leasing a segment if need be. */
int client_pool_alloc(gpupool_client *c, unsigned d, int device, uint64_t rsize, void *stream, bool on_stream,
                      void **ret_ptr);

/* Frees a block out of the live table into the pool; its segment stays mapped. */
int client_pool_free(gpupool_client *c, struct block *b);

/*
 * What the process holds per device where it leases anything, or leased anything when it last
 * reported, for a request's envelope; remembered as reported. Returns how many.
 */
size_t client_pool_usage(gpupool_client *c, Gpupool__Usage *u, Gpupool__Usage **ptrs);

/* Whether what the process holds changed since it last reported. */
bool client_pool_usage_changed(gpupool_client *c);

/*
 * Takes segments holding no live block out of the pool, on daemon device d (-1: all), oldest
 * emptied first and emptied at or before before_ms, until want bytes or max: unmaps them and
 * fills ids (to be returned, or named in a reclaim answer). Returns how many; *ret_bytes (if
 * given) their bytes.
 */
size_t client_pool_take_empty(gpupool_client *c, int d, uint64_t want, uint64_t before_ms, uint64_t *ids, size_t max,
                              uint64_t *ret_bytes);

/* Tells the daemon these segments, unmapped, are back (ReturnRequest, with the usage). */
int client_pool_return(gpupool_client *c, const uint64_t *ids, size_t n);

/* Gives back segments holding no live block on d (-1: all), until want bytes. */
int client_pool_trim(gpupool_client *c, int d, uint64_t want);

/* What the pool holds free in its segments, on every device. */
uint64_t client_pool_free_bytes(gpupool_client *c);

/* Once a second from the control thread: gives back segments empty for the idle time. */
void client_pool_tick(gpupool_client *c, uint64_t now_ms);

/*
 * client_tcache.c: each thread's cache of the small blocks it freed. The fast path (take and
 * put) runs without the handle's lock; the rest is called locked.
 */

/* A block of rsize bytes on the caller's device from this thread's cache, out of the live table; or NULL. */
struct block *client_tcache_take(gpupool_client *c, int device, uint64_t rsize);

/*
 * Parks b (out of the live table) in this thread's cache, if it has one: NULL, or the block
 * that must go to the pool instead (b itself, or the oldest it pushed out). A block of an
 * earlier session is freed here.
 */
struct block *client_tcache_put(gpupool_client *c, struct block *b);

/*
 * Gives this thread a cache for c, unless it has one, or has one for another handle that is
 * still connected (one fast path per thread: the first handle's). Locked.
 */
void client_tcache_adopt(gpupool_client *c);

/* Empties every cache into the pool. Locked. */
void client_tcache_drain(gpupool_client *c);

/* Once a second: empties the caches not used since the last tick, and frees those of exited threads. Locked. */
void client_tcache_tick(gpupool_client *c);

/* Forgets what the caches hold (the session is over: the pool forgets its blocks). Locked. */
void client_tcache_forget(gpupool_client *c);

/* At disconnect, after client_tcache_forget(): the handle lets go of every cache. Locked. */
void client_tcache_detach(gpupool_client *c);

/* What the caches hold, per daemon device (an array of CLIENT_MAX_DEVICES, or NULL) and in all (or NULL). Locked. */
void client_tcache_bytes(gpupool_client *c, uint64_t *per_device, uint64_t *ret_total);

/* client_cuda.c, all called locked. */

/* Loads the driver and matches the daemon's GPUs (hello's devices) to this process's by UUID. */
int client_cuda_setup(gpupool_client *c, const Gpupool__HelloReply *hello);

/* Opens a segment's IPC handle in the device's primary context; sets m->base. */
int client_cuda_open(gpupool_client *c, struct mapping *m);

/* Closes what client_cuda_open() opened. */
void client_cuda_close(gpupool_client *c, struct mapping *m);

/*
 * Records an event on stream after the work queued so far and queues b's free behind it. b is
 * out of the live table; it goes back there marked freeing, where an allocation on the same
 * stream may take it at once (client_pool_alloc()). On error b is untouched (the caller puts
 * it back).
 */
int client_cuda_defer_free(gpupool_client *c, struct block *b, void *stream);

/* Frees the deferred blocks whose work is done; with wait, waits for all of them first. */
void client_cuda_reap(gpupool_client *c, bool wait);

/* The daemon is gone: drops the pending stream-ordered frees without waiting (their blocks went with it). */
void client_cuda_forget_deferred(gpupool_client *c);

/* Once every mapping is closed: stops the reaper thread (unlocking while joining it), destroys the events and releases the contexts. */
void client_cuda_teardown(gpupool_client *c);

#endif
