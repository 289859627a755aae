/*
 * client_common.h: libgpupool's internal header (as libuv's uv-common.h is its): the handle,
 * the data every layer of the library shares, included by every file of client/. Each layer has
 * its own header, and calls go down only, with no circle among the files (client/LAYERS holds
 * the order; make layers checks it against the objects):
 *
 *   client_hooks.c, client_scope.c             the framework hooks, scopes
 *   client.c                                   the public API (gpupool.h)
 *   client_control.c                           the control thread: the daemon's reclaims, usage,
 *                                              reaching a daemon that came back
 *   client_resume.c                            the new daemon adopting what the process holds
 *   client_objects.c                           named objects: publish, attach, detach, unpublish
 *   client_pool.c                              the process's own pool over the leased segments
 *   client_stream.c                            stream-ordered frees (held in the pool's heap for
 *                                              their stream's lane), fences and their reaper thread
 *   client_return.c                            what it tells the daemon it holds, and gives back
 *   client_grow.c                              segments that grow in place: granules under ranges
 *   client_tcache.c                            each thread's cache of the small blocks it freed
 *   client_segment.c                           the segments mapped, the live blocks
 *   client_call.c                              requests on the main connection
 *   client_mem.c                               the memory seam, a table per backend (client_mem.h)
 *   client_cuda.c                              the CUDA driver: UUIDs, contexts, IPC handles, VMM, events
 *   client_keep.c                              the descriptors kept for a daemon after this one
 */
#ifndef GP_CLIENT_COMMON_H
#define GP_CLIENT_COMMON_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "conn.h"
#include "gpupool.h"
#include "heap.h"
#include "rbtree.h"

#define CLIENT_MAX_DEVICES 64
#define CLIENT_MAX_SCOPES 16
#define CLIENT_SHARDS 32        /* live-block table shards: threads freeing different blocks rarely meet */
#define CLIENT_RETURN_BATCH 256 /* segments per ReturnRequest or ReclaimReply: what the daemon takes in one */

/* An event of a GPU's driver (client_mem.h's driver table; a CUevent): one fence on a stream. */
typedef void *client_event;

/*
 * Requests sent back to back on the main connection, at most this many unanswered, their
 * replies read as they come: a block's granule leases (GP_MAX_LEASE_GRANULES each, a packet's
 * worth of descriptors: 4 GiB of granules) and segments given back (CLIENT_RETURN_BATCH each),
 * one round trip however many. The daemon answers in order, one request per turn of its loop,
 * and its replies (a packet each) fit the socket while it sends them.
 */
#define CLIENT_PIPELINE 16

/*
 * The bit of a segment id that says no daemon knows it: a segment the process keeps after a
 * daemon's restart that the new one did not adopt (a limit, the capacity, no descriptor kept).
 * It is the process's own until it empties; then it is unmapped and told to nobody. Daemon ids
 * carry the device in their top byte, under 64: never this bit.
 */
#define CLIENT_ORPHAN (1ULL << 63)

/*
 * A segment held from a daemon before this one, for the next to adopt (client_resume()):
 * where its id is kept, its descriptor, and the id it is to have once the adoption is over.
 */
struct client_kept {
        uint64_t *id;
        int fd;                 /* kept (host); -1: none (cuda-vmm: adopted by the process's word) */
        uint64_t size;
        uint64_t renamed;
};

/* One segment this process maps, as the handle's memory seam mapped it (client_mem.h). */
struct mapping {
        uint64_t segment_id;
        uint64_t size;
        uint8_t *base;                  /* where the process sees it (on a GPU: the CUdeviceptr) */
        unsigned device;                /* the daemon's index */
        bool grow;                      /* a range that grows in place (client_grow.c), in no tree */
        int fd;                         /* its descriptor, kept for a later daemon to adopt (-1: none) */
        uint8_t handle[GP_IPC_HANDLE_BYTES];        /* where segments come as IPC handles (mem->ipc) */
        struct gp_rb_node by_addr;
        struct gp_rb_node by_id;
        struct gp_rb_node by_handle;    /* mem->ipc only */
        /* Leased whole: the process's pool carves it (client_pool.c). */
        struct heap_segment hs;
        uint64_t emptied_ms;            /* when it last held no live block (client_now_ms()) */
        /*
         * Sealed against writing by a publish whose answer was lost (client_objects.c): out of
         * the heap, so that nothing is carved from it again, and offered to no later daemon
         * (which would refuse it, and every segment sent with it).
         */
        bool sealed;
};

/* One live block handed to the application. */
struct block {
        uint8_t *ptr;
        uint64_t size;                  /* as the pool rounded it */
        struct mapping *mapping;        /* its segment, and through it its device */
        struct heap_block *hb;          /* the process's pool's record of it */
        void *stream;                   /* gpupool_alloc_async()'s stream (NULL: gpupool_alloc()'s, the legacy one) */
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

/* A fence recorded on a stream: the frees held for its lane until then are everyone's once its event has completed. */
struct stream_fence {
        client_event event;
        uint64_t number;                /* the lane's count of fences: heap_release() up to it */
        uint64_t seq;                   /* the handle's count of fences: oldest first across streams */
};

/*
 * The fences of one stream, in the order they were recorded, in a ring: the stream runs its
 * work in that order, so those whose events have completed are a prefix, found by search. Its
 * frees are held in the device's heap for its lane (heap_free_held()).
 */
struct stream_queue {
        struct stream_queue *next;
        unsigned long long stream_id;   /* cuStreamGetId: a handle may come back for a new stream, an id never */
        unsigned device;
        uint32_t lane;                  /* the heap's name for this stream: unique in the handle */
        struct stream_fence *ring;      /* cap entries, a power of two; the oldest at first */
        unsigned cap, first, count;
        unsigned unfenced;              /* the newest frees, with no fence recorded after them yet */
        uint64_t next_fence;            /* the number of the fence they wait for */
        uint64_t unfenced_since_ns;     /* when the oldest of them was queued (client_now_ns()) */
        void *stream;                   /* the handle the latest free came with: a later fence goes there, if still this stream */
        bool gone;                      /* that handle is another stream's now: no fence can follow its unfenced frees */
        unsigned promises;              /* what every one of the unfenced frees promised (gpupool_promise()) */
};

/* A daemon device as this process sees it. */
struct client_device {
        struct heap heap;               /* the process's pool on this device: every segment it leases */
        uint64_t total_bytes;           /* as hello said */
        struct client_grow *grow;       /* segments that grow in place: its ranges, once used */
        uint64_t reported_in_use, reported_held_free;   /* as the daemon last heard (client_usage()) */
        uint64_t framework_free;        /* what a framework's own cache holds unused of its blocks (gpupool_release_report()) */
        /*
         * Memory the process allocated outside the pool and charged (gpupool_charge()): all of
         * it, and what the daemon counts of it (less where it was gone, or a daemon after it
         * would not count it all).
         */
        uint64_t charged, charge_counted;
};

struct tcache;

/* A named object the handle has attached (client_objects.c), or published (then mapping is its segment's). */
struct client_attachment {
        struct client_attachment *next;
        char name[GP_MAX_OBJECT_NAME_BYTES + 1];
        uint8_t *base;                  /* the mapping: the object's segment, read-only */
        uint64_t segment_size;
        const uint8_t *ptr;             /* the object's bytes in it */
        uint64_t size;
        unsigned count;                 /* attaches not yet detached */
        unsigned device;                /* the daemon's index */
        uint64_t id;                    /* the object's, as the daemon said (0: it did not) */
        uint32_t publisher_uid;         /* who published it, as the daemon said (its own uid's for a publish here) */
        char publisher_tenant[GP_MAX_TENANT_NAME_BYTES + 1];
        bool named;                     /* attached naming its publisher (gpupool_attach_of()), not by name alone */
        bool unknown;                   /* the daemon now does not count it: attached from one before, which it did not take over */
        int fd;                         /* published here: the segment's descriptor, kept (else -1) */
};

/*
 * The control channel (client_control.c's): the daemon's reclaim requests, answered by the
 * control thread, which also reaches a daemon that came back. client.c makes and destroys the
 * condition with the handle; client_resume.c reads stopping.
 */
struct client_control {
        struct gp_conn *conn;
        pthread_t thread;
        bool started;
        bool stopping;                  /* locked: client_control_close() ends the thread's wait for a daemon */
        pthread_cond_t wake;            /* signalled with stopping */
};

/*
 * A framework's cache over the handle's blocks (gpupool_release_wait() in client.c; the
 * control thread asks): the threads waiting to be asked, whether the control thread asks now,
 * how many releases ended (gpupool_release_done()), and whether the handle is closing; all
 * with cond, under the handle's lock.
 */
struct client_release {
        unsigned waiters;
        bool asked, closing;
        uint64_t done_seq;
        pthread_cond_t cond;
};

/*
 * Stream-ordered frees (client_stream.c's alone, under the handle's lock): a queue of fences
 * per stream (its frees are held in the device's heap for its lane), and the reaper thread
 * that completes them.
 */
struct client_streams {
        struct stream_queue *queues;
        uint32_t last_lane;
        uint64_t fence_seq;
        pthread_cond_t cond;            /* the reaper's: a fence to wait for, or stop */
        pthread_t reaper;
        bool reaper_started, stopping;
        bool reaper_idle;               /* waiting for a free to be queued: only then is it signalled */
        client_event reaper_event;      /* the event the reaper waits for, unlocked: never reused meanwhile */
        bool reaper_event_done;         /* its frees completed meanwhile: the reaper recycles it after its wait */
        unsigned promises;              /* the caller's, about its streams (gpupool_promise()): GPUPOOL_STREAMS_KEPT... */
        unsigned captures;              /* graph captures the caller said are under way (gpupool_capture_begin()) */
};

struct gpupool_client {
        uint64_t serial;                /* unique in the process: a thread's cache names its handle by it */
        pthread_mutex_t lock;           /* everything below but what conn_busy lends out */
        /*
         * The main connection: used under the lock, one request at a time, except where it is
         * lent out with conn_busy (client_conn_take(): a lease, a block's granule leases, an
         * adoption), which lets go of the lock while the requests are out (the daemon may park
         * a lease), so that the control thread and the other threads go on.
         */
        struct gp_conn conn;
        bool conn_busy;
        pthread_cond_t conn_idle;       /* signalled when conn_busy clears */
        uint64_t round_trips;           /* conn.trips as of the latest call's end */
        char error[GP_MAX_ERROR_BYTES]; /* why the latest call failed (gpupool_last_error()) */
        uint64_t limit_bytes;           /* the daemon's limit on this client per device, as hello said (0: none) */
        char socket_path[108];          /* as given to connect, for reconnect ("" = the default) */
        char name[64];
        char reservation[GP_RESERVATION_TOKEN_MAX + 1];        /* $GPUPOOL_RESERVATION at connect, presented at every hello; "": none */
        unsigned device_count;
        /*
         * How this process maps what the daemon's backend leases (client_mem.h), set by hello;
         * the host backend's before. Read unlocked by gpupool_free_async() (atomic).
         */
        const struct client_mem_ops *mem;
        bool grow_wanted;               /* $GPUPOOL_SEGMENTS is "grow" */
        uint64_t piece_bytes;           /* grow: blocks this large or larger are pieces ($GPUPOOL_GROW_PIECE; UINT64_MAX: none) */
        bool grow;                      /* segments grow in place: granules leased under ranges of ours (mem->grows) */
        /* The GPU driver's own state (mem->driver; client_cuda.c's), from its setup to its teardown. */
        void *driver_state;
        struct client_device devices[CLIENT_MAX_DEVICES];
        /* This process's CUDA ordinal -> daemon index, or -1: filled by the driver's setup (mem->driver). */
        int local_to_daemon[CLIENT_MAX_DEVICES];
        int local_count;
        struct gp_rb_tree by_addr, by_id, by_handle;
        /* Live blocks the application holds, by address; a shard's lock nests inside the handle's. */
        struct live_shard live[CLIENT_SHARDS];
        uint64_t epoch;                 /* atomic; written locked: bumped when every block is forgotten */
        uint64_t segments_imported;     /* segments mapped since connect */
        /* Grow: the granules the ranges of sessions before this one mapped and unmapped (client_grow.c's). */
        struct {
                uint64_t mapped, unmapped;
        } granules_before;
        /*
         * Open scopes, innermost last (gpupool_scope_begin/end): client_scope.c's; the pool
         * tags a block with the innermost, and the threads' fast path reads depth.
         */
        struct {
                uint32_t ids[CLIENT_MAX_SCOPES];
                unsigned depth;         /* written locked, read atomically (the threads' fast path) */
                uint32_t next;
        } scope;
        struct tcache *tcaches;         /* the threads' caches of freed small blocks (client_tcache.c) */
        struct client_attachment *attachments;  /* named objects attached (client_objects.c) */
        uint64_t idle_return_ms;        /* empty segments go back after this long ($GPUPOOL_IDLE_RETURN; 0: never) */
        struct client_control control;  /* the control channel and its thread: client_control.c's */
        bool daemon_gone;               /* atomic: the control channel closed under us (then the pool serves nothing, but on cuda-vmm) */
        bool resume_refused;            /* locked: the daemon that came back has other devices or another backend */
        struct client_release release;  /* a framework's cache over the handle's blocks: client.c's and the control thread's */
        struct client_streams streams;  /* stream-ordered frees: client_stream.c's alone */
};

/*
 * client.c's gpupool_alloc_async() and gpupool_free_async() for a caller that makes promises
 * about the stream (gpupool_promise()'s) for this call alone, besides the handle's: the hooks,
 * whose shared handle serves PyTorch's calls, which promise, and CuPy's, which do not.
 */
int client_alloc_async(gpupool_client *c, int device, size_t size, void *stream, unsigned promises, void **ret_ptr);
int client_free_async(gpupool_client *c, void *ptr, void *stream, unsigned promises);

/* Sets the handle's error (gpupool_last_error()), at any layer. */
static inline __attribute__((format(printf, 2, 3))) void client_set_error(gpupool_client *c, const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(c->error, sizeof(c->error), fmt, ap);
        va_end(ap);
}

/* The socket the handle was given (NULL: $GPUPOOL_SOCKET or the default, gp_wire_socket_path()). */
static inline const char *client_socket_path(const gpupool_client *c) {
        return c->socket_path[0] ? c->socket_path : NULL;
}

/* Whether the daemon is gone, as the control thread or the latest request saw it. Unlocked. */
static inline bool client_daemon_gone(gpupool_client *c) {
        return __atomic_load_n(&c->daemon_gone, __ATOMIC_ACQUIRE) || __atomic_load_n(&c->conn.broken, __ATOMIC_RELAXED);
}

/* CLOCK_MONOTONIC in milliseconds. */
static inline uint64_t client_now_ms(void) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

/* CLOCK_MONOTONIC in nanoseconds. */
static inline uint64_t client_now_ns(void) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

#endif
