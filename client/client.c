/*
 * client.c: libgpupool's public API (gpupool.h): the handle's session with gpupoold
 * (connect, reconnect, disconnect) and the allocation calls, which go down to the layers
 * below (client_common.h lists them).
 *
 * Blocks are carved in the process, from the segments it leases whole (client_pool.c); a
 * request to the daemon is made only to lease a segment, to give segments back, and for
 * status (client_segment.c). A thread's small frees and the allocations that follow them go
 * through its cache without the handle's lock (client_tcache.c).
 */
#define _GNU_SOURCE
#include "client_common.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client_call.h"
#include "client_control.h"
#include "client_grow.h"
#include "client_keep.h"
#include "client_mem.h"
#include "client_objects.h"
#include "client_pool.h"
#include "client_segment.h"
#include "client_stream.h"
#include "client_tcache.h"
#include "size.h"

/* Says hello on c->conn (closed first if open) and sets up devices and the control channel. Locked or private. */
static int session_open(gpupool_client *c) {
        Gpupool__Hello hello_req = GPUPOOL__HELLO__INIT;
        const char *path = client_socket_path(c);
        Gpupool__Envelope *hello;
        const struct client_mem_ops *mem = &client_mem_host;
        uint64_t client_id, granules = 0;
        int r;

        gp_conn_close(&c->conn);
        c->resume_refused = false;
        hello_req.name = c->name;
        hello_req.reservation = c->reservation[0] ? c->reservation : NULL;
        r = gp_conn_open(&c->conn, path, &hello_req, &hello);
        if (r < 0)
                return client_call_done(c, r);
        c->device_count = (unsigned) hello->hello_reply->n_devices;
        if (c->device_count > CLIENT_MAX_DEVICES)
                c->device_count = CLIENT_MAX_DEVICES;
        /* One backend serves every device: its memory seam maps what the process leases. */
        for (unsigned d = 0; d < c->device_count; d++) {
                const char *backend = hello->hello_reply->devices[d]->backend;
                const struct client_mem_ops *m = client_mem_of(backend);

                if (!m || (d > 0 && m != mem)) {
                        if (!m)
                                client_set_error(c, "gpupoold serves a backend this library does not know (%s): "
                                                    "a libgpupool as new as the daemon maps it", backend);
                        else
                                client_set_error(c, "gpupoold serves devices of two backends (%s and %s): "
                                                    "this library maps one", mem->backend, backend);
                        gpupool__envelope__free_unpacked(hello, NULL);
                        gp_conn_close(&c->conn);
                        return -EPROTO;
                }
                mem = m;
                c->devices[d].total_bytes = hello->hello_reply->devices[d]->total_bytes;
                granules += (c->devices[d].total_bytes + GP_GRANULE_BYTES - 1) / GP_GRANULE_BYTES;
        }
        __atomic_store_n(&c->mem, mem, __ATOMIC_RELEASE);       /* gpupool_free_async() reads it unlocked */
        /* Segments grow in place where asked and the seam maps granules at our addresses. */
        c->grow = c->grow_wanted && mem->grows;
        client_id = hello->hello_reply->client_id;
        c->limit_bytes = hello->hello_reply->has_limit_bytes ? hello->hello_reply->limit_bytes : 0;
        c->round_trips = c->conn.trips;
        r = mem->driver ? mem->driver->setup(c, hello->hello_reply) : 0;
        gpupool__envelope__free_unpacked(hello, NULL);
        /*
         * Before the control thread starts: the process may have one thread yet, and then growing
         * costs no wait. A descriptor kept per segment (host), at most one per granule.
         */
        if (r == 0 && !mem->ipc && !mem->adopted_held)
                client_fd_room(c->conn.sock, granules);
        /* The daemon asks for empty segments back on it; the idle return and usage reports run on its thread. */
        if (r == 0)
                r = client_control_open(c, path, c->name, client_id);
        if (r < 0) {
                if (mem->driver)
                        mem->driver->teardown(c);       /* nothing mapped yet: only what setup made */
                gp_conn_close(&c->conn);
        }
        return r;
}

/* Frees a handle no thread uses any more: its locks and the handle itself (what it held is gone already). */
static void handle_free(gpupool_client *c) {
        client_segments_destroy(c);
        client_stream_fini(c);
        pthread_cond_destroy(&c->conn_idle);
        pthread_cond_destroy(&c->control.wake);
        pthread_cond_destroy(&c->release.cond);
        pthread_mutex_destroy(&c->lock);
        free(c);
}

GPUPOOL_EXPORT int gpupool_connect(const char *socket_path, const char *client_name, gpupool_client **ret_client) {
        const char *idle_return = getenv("GPUPOOL_IDLE_RETURN"), *segments = getenv("GPUPOOL_SEGMENTS");
        const char *piece = getenv("GPUPOOL_GROW_PIECE"), *reservation = getenv("GPUPOOL_RESERVATION");
        uint64_t idle_return_ms = GPUPOOL_DEFAULT_IDLE_RETURN_MS, piece_bytes = GROW_PIECE_BYTES;
        static uint64_t next_serial;
        gpupool_client *c;
        int r;

        (void) client_thread_failed(0, "%s", "");
        if (!ret_client)
                return client_thread_failed(-EINVAL, "gpupool_connect() needs a place for the handle");
        if (client_name && !gp_wire_name_is_valid(client_name))
                return client_thread_failed(-EINVAL, "a client name is 1 to %d bytes of UTF-8 without control characters",
                                      GP_MAX_NAME_BYTES);
        if (socket_path && strlen(socket_path) >= sizeof(c->socket_path))
                return client_thread_failed(-ENAMETOOLONG, "the socket path is longer than a Unix socket's address allows");
        if (idle_return && *idle_return && gp_duration_parse(idle_return, &idle_return_ms) < 0)
                return client_thread_failed(-EINVAL, "$GPUPOOL_IDLE_RETURN: '%.64s' is not a duration (e.g. 30s, 2min)",
                                      idle_return);
        if (segments && *segments && strcmp(segments, "grow") != 0 && strcmp(segments, "whole") != 0)
                return client_thread_failed(-EINVAL, "$GPUPOOL_SEGMENTS: '%.64s' is neither grow nor whole", segments);
        if (reservation && strlen(reservation) > GP_RESERVATION_TOKEN_MAX)
                return client_thread_failed(-EINVAL, "$GPUPOOL_RESERVATION is longer than a reservation's token (%d bytes)",
                                            GP_RESERVATION_TOKEN_MAX);
        if (piece && strcmp(piece, "off") == 0)
                piece_bytes = UINT64_MAX;
        else if (piece && *piece && (gp_size_parse(piece, &piece_bytes) < 0 || piece_bytes < GROW_PIECE_MIN_BYTES))
                return client_thread_failed(-EINVAL, "$GPUPOOL_GROW_PIECE: '%.64s' is neither a size of 64M or more nor off",
                                            piece);
        c = calloc(1, sizeof(*c));
        if (!c)
                return client_thread_failed(-ENOMEM, "out of memory for a handle");
        snprintf(c->reservation, sizeof(c->reservation), "%s", reservation ? reservation : "");
        c->serial = __atomic_add_fetch(&next_serial, 1, __ATOMIC_RELAXED);
        c->conn.sock = -1;
        c->mem = &client_mem_host;
        snprintf(c->name, sizeof(c->name), "%s", client_name ? client_name : program_invocation_short_name);
        if (!gp_wire_name_is_valid(c->name))
                strcpy(c->name, "client");
        snprintf(c->socket_path, sizeof(c->socket_path), "%s", socket_path ? socket_path : "");
        pthread_mutex_init(&c->lock, NULL);
        pthread_cond_init(&c->conn_idle, NULL);
        pthread_cond_init(&c->control.wake, NULL);
        pthread_cond_init(&c->release.cond, NULL);
        client_segments_init(c);
        client_stream_init(c);
        c->epoch = 1;
        c->idle_return_ms = idle_return_ms;
        c->grow_wanted = segments && strcmp(segments, "grow") == 0;
        c->piece_bytes = piece_bytes;
        /* Empty until the first lease, and empty again after drop_everything() on a reconnect. */
        for (unsigned d = 0; d < CLIENT_MAX_DEVICES; d++)
                heap_init(&c->devices[d].heap);
        r = session_open(c);
        if (r < 0) {
                /* No handle to read the message from: the thread keeps it (gpupool_last_error(NULL)). */
                (void) client_thread_failed(r, "%s", c->error[0] ? c->error : strerror(-r));
                handle_free(c);
                return r;
        }
        *ret_client = c;
        return 0;
}

/*
 * Forgets every block and mapping (unmapping), and the CUDA state. Locked. The epoch goes
 * first: a block another thread has in hand (taken out of the live table, not yet freed) is
 * then seen as stale wherever it lands, and freed there.
 */
static void drop_everything(gpupool_client *c) {
        client_live_forget(c);
        client_tcache_forget(c);
        client_objects_forget(c);
        client_grow_forget(c);
        client_mappings_forget(c);
        for (unsigned d = 0; d < CLIENT_MAX_DEVICES; d++)
                c->devices[d].reported_in_use = c->devices[d].reported_held_free = 0;
        if (c->mem->driver) {
                client_stream_stop(c);
                c->mem->driver->teardown(c);
        }
}

GPUPOOL_EXPORT void gpupool_disconnect(gpupool_client *c) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__ByeRequest bye = GPUPOOL__BYE_REQUEST__INIT;
        bool device_done = true;

        if (!c)
                return;
        /* The control thread takes the lock: stop it before taking it here. */
        client_control_close(c);
        pthread_mutex_lock(&c->lock);
        /* A framework's thread waiting to be asked for memory leaves first: the handle goes. */
        c->release.closing = true;
        pthread_cond_broadcast(&c->release.cond);
        while (c->release.waiters)
                pthread_cond_wait(&c->release.cond, &c->lock);
        client_conn_wait(c);    /* a lease of another thread is out: its reply comes first */
        /*
         * The memory goes back with bye, and the daemon may hand it to another uid at once: the
         * work this process queued on it must have ended first, not only the work before
         * stream-ordered frees (kernels may still write blocks the application never freed).
         */
        if (c->mem->driver) {
                int reaped = client_stream_reap(c, true);

                /* Both, whatever the first says: the mappings close next. */
                device_done = c->mem->driver->synchronize(c) == 0 && reaped == 0;
                /* The fences, and frees still held if the driver failed us (their blocks go with the heaps). */
                client_stream_forget(c);
        }
        drop_everything(c);
        client_tcache_detach(c);
        /*
         * Every mapping is gone: the daemon may hand our memory to others right away. Unless the
         * driver could not say that our work ended: then no bye, and the daemon keeps the memory
         * until this process has exited (its pidfd), when no work of ours can run any more.
         */
        req.body_case = GPUPOOL__ENVELOPE__BODY_BYE;
        req.bye = &bye;
        if (device_done && !c->conn.broken && client_call(c, &req, GPUPOOL__ENVELOPE__BODY__NOT_SET, &rep, NULL) == 0)
                gpupool__envelope__free_unpacked(rep, NULL);
        gp_conn_close(&c->conn);
        pthread_mutex_unlock(&c->lock);
        handle_free(c);
}

GPUPOOL_EXPORT int gpupool_reconnect(gpupool_client *c) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__ByeRequest bye = GPUPOOL__BYE_REQUEST__INIT;
        bool live, device_done = true;
        int r;

        if (!c)
                return client_invalid(NULL, "%s: no handle (NULL): gpupool_connect() gives one", __func__);
        client_control_close(c);
        pthread_mutex_lock(&c->lock);
        client_conn_wait(c);
        /*
         * A daemon that is there (this one, or one that came back and adopted what the process
         * held: the control thread resumes on its own) is told bye once everything is unmapped,
         * as at a disconnect, so that what it holds of ours is not left reserved until the
         * process exits; and, where a device may still run our work on it, only once that
         * work has ended. A daemon that is gone took its memory with it: no event is waited for.
         */
        live = !c->conn.broken && !__atomic_load_n(&c->daemon_gone, __ATOMIC_ACQUIRE);
        if (c->mem->driver) {
                if (live)
                        device_done = client_stream_reap(c, true) == 0 && c->mem->driver->synchronize(c) == 0;
                client_stream_forget(c);
        }
        drop_everything(c);
        req.body_case = GPUPOOL__ENVELOPE__BODY_BYE;
        req.bye = &bye;
        if (live && device_done && client_call(c, &req, GPUPOOL__ENVELOPE__BODY__NOT_SET, &rep, NULL) == 0)
                gpupool__envelope__free_unpacked(rep, NULL);
        r = session_open(c);
        if (r < 0)
                client_set_error(c, "%s", c->error[0] ? c->error : "cannot reconnect to gpupoold");
        pthread_mutex_unlock(&c->lock);
        return r;
}

/* The daemon's index for the caller's device number (its own CUDA ordinal on the cuda backend), or -1. */
static int daemon_device(gpupool_client *c, int device) {
        if (!c->mem->driver)
                return (unsigned) device < c->device_count ? device : -1;
        return device < c->local_count ? c->local_to_daemon[device] : -1;
}

static int alloc_on(gpupool_client *c, int device, size_t size, void *stream, bool on_stream, unsigned promises,
                    void **ret_ptr);

/*
 * Whether what the process leases went with the daemon (client_memory_lost()); says so. The
 * pool then hands none of it out. Locked.
 */
static bool memory_is_lost(gpupool_client *c) {
        if (!client_memory_lost(c))
                return false;
        client_set_error(c, "gpupoold is gone (or the connection to it is): its memory is no longer this process's; "
                            "gpupool_reconnect() starts anew");
        return true;
}

GPUPOOL_EXPORT int gpupool_alloc(gpupool_client *c, int device, size_t size, void **ret_ptr) {
        return alloc_on(c, device, size, NULL, false, 0, ret_ptr);
}

GPUPOOL_EXPORT int gpupool_alloc_async(gpupool_client *c, int device, size_t size, void *stream, void **ret_ptr) {
        return alloc_on(c, device, size, stream, true, 0, ret_ptr);
}

int client_alloc_async(gpupool_client *c, int device, size_t size, void *stream, unsigned promises, void **ret_ptr) {
        return alloc_on(c, device, size, stream, true, promises, ret_ptr);
}

static int alloc_on(gpupool_client *c, int device, size_t size, void *stream, bool on_stream, unsigned promises,
                    void **ret_ptr) {
        /* The size as the pool rounds it (0: too large to round). */
        uint64_t rsize = size <= UINT64_MAX - GP_BLOCK_ALIGN ? (size + GP_BLOCK_ALIGN - 1) & ~(GP_BLOCK_ALIGN - 1) : 0;
        struct block *b = NULL;
        int r, d;

        if (!c)
                return client_invalid(NULL, "gpupool_alloc: no handle (NULL): gpupool_connect() gives one");
        if (!ret_ptr)
                return client_invalid(c, "gpupool_alloc: no place for the pointer (ret_ptr is NULL)");
        if (device < 0)
                return client_invalid(c, "gpupool_alloc: device %d: devices are numbered from 0", device);
        if (size == 0)
                return client_invalid(c, "cannot allocate 0 bytes: a request is 1 byte to 64 TiB");
        /* This thread's cache first, without the handle's lock (never inside a scope: its blocks are the scope's). */
        if (rsize && !client_memory_lost(c) && !__atomic_load_n(&c->scope.depth, __ATOMIC_ACQUIRE) &&
            (b = client_tcache_take(c, device, rsize))) {
                void *ptr = b->ptr;

                b->stream = on_stream ? stream : NULL;
                /* Once live, another thread's gpupool_reconnect() may forget (free) it: ptr is read first. */
                r = client_live_insert(c, b);
                if (r == 0) {
                        *ret_ptr = ptr;
                        return 0;
                }
        }
        pthread_mutex_lock(&c->lock);
        if (b) {
                /* Of a session gpupool_reconnect() ended (freed here), or, by a bug of ours, live twice. */
                (void) client_free_unlinked(c, b);
                if (r == -EEXIST) {
                        client_set_error(c, "the process's pool handed out a block that is live already");
                        pthread_mutex_unlock(&c->lock);
                        return -EPROTO;
                }
        }
        /* A thread that allocates gets a cache for what it frees: only it takes from it. */
        client_tcache_adopt(c);
        d = daemon_device(c, device);
        if (d < 0) {
                r = -ENODEV;
                if (c->mem->driver)
                        client_set_error(c, "CUDA device %d of this process is not one gpupoold serves "
                                            "(no GPU of the daemon has its UUID)", device);
                else
                        client_set_error(c, "no device %d: gpupoold has %u", device, c->device_count);
        } else if (memory_is_lost(c)) {
                r = -ECONNRESET;
        } else if (!rsize || rsize > HEAP_MAX_REQUEST) {
                client_set_error(c, "cannot allocate %zu bytes: a request is 1 byte to 64 TiB", size);
                r = -EINVAL;
        } else {
                /* A block held for this stream's lane is this allocation's at once: the stream orders the work. */
                uint32_t lane = on_stream && c->mem->driver ? client_stream_lane(c, (unsigned) d, stream, promises) : 0;

                r = client_pool_alloc(c, (unsigned) d, device, rsize, on_stream ? stream : NULL, lane, ret_ptr);
        }
        pthread_mutex_unlock(&c->lock);
        return r;
}

/* Says that ptr is no block to free. Locked. */
static int not_a_block(gpupool_client *c, void *ptr) {
        client_set_error(c, "%p is not a live block of this client (freed already, never allocated, or "
                            "not the start of a block)", ptr);
        return -ENOENT;
}

/*
 * Frees a block the device is done with: into this thread's cache without the handle's lock
 * when it is small and the thread has one, else into the pool.
 */
static int free_now(gpupool_client *c, void *ptr) {
        bool gone = client_memory_lost(c);
        struct block *b = client_live_take(c, ptr), *rest = b;
        int r;

        if (b && !gone && !(rest = client_tcache_put(c, b)))
                return 0;
        pthread_mutex_lock(&c->lock);
        r = b ? client_free_unlinked(c, rest) : not_a_block(c, ptr);
        if (r == 0 && memory_is_lost(c))
                r = -ECONNRESET;        /* freed, but into memory that is not ours any more */
        pthread_mutex_unlock(&c->lock);
        return r;
}

GPUPOOL_EXPORT int gpupool_free(gpupool_client *c, void *ptr) {
        if (!c)
                return client_invalid(NULL, "%s: no handle (NULL): gpupool_connect() gives one", __func__);
        return free_now(c, ptr);
}

GPUPOOL_EXPORT int gpupool_free_async(gpupool_client *c, void *ptr, void *stream) {
        return client_free_async(c, ptr, stream, 0);
}

int client_free_async(gpupool_client *c, void *ptr, void *stream, unsigned promises) {
        struct block *b;
        int r;

        if (!c)
                return client_invalid(NULL, "%s: no handle (NULL): gpupool_connect() gives one", __func__);
        /* Host memory: no device queues work on it, so there is nothing to wait for. */
        if ((!stream || stream == GPUPOOL_STREAM_OF_ALLOC) && !__atomic_load_n(&c->mem, __ATOMIC_ACQUIRE)->driver)
                return free_now(c, ptr);
        pthread_mutex_lock(&c->lock);
        b = client_live_take(c, ptr);
        if (!b) {
                r = not_a_block(c, ptr);
        } else {
                if (!c->mem->driver) {
                        client_set_error(c, "a stream was given for a block of host memory");
                        r = -EINVAL;
                } else {
                        r = client_stream_defer_free(c, b, stream == GPUPOOL_STREAM_OF_ALLOC ? b->stream : stream, promises);
                }
                if (r < 0)
                        (void) client_live_insert(c, b);        /* not freed: still the application's */
        }
        pthread_mutex_unlock(&c->lock);
        return r;
}

GPUPOOL_EXPORT int gpupool_promise(gpupool_client *c, unsigned promises) {
        int r;

        if (!c)
                return client_invalid(NULL, "%s: no handle (NULL): gpupool_connect() gives one", __func__);
        pthread_mutex_lock(&c->lock);
        r = client_stream_promise(c, promises);
        pthread_mutex_unlock(&c->lock);
        return r;
}

/* A capture the caller tells of begins or ends: the captures under way after it. */
static int capture(gpupool_client *c, bool begin, const char *fn) {
        int r;

        if (!c)
                return client_invalid(NULL, "%s: no handle (NULL): gpupool_connect() gives one", fn);
        pthread_mutex_lock(&c->lock);
        r = client_stream_capture(c, begin);
        pthread_mutex_unlock(&c->lock);
        return r;
}

GPUPOOL_EXPORT int gpupool_capture_begin(gpupool_client *c) {
        return capture(c, true, __func__);
}

GPUPOOL_EXPORT int gpupool_capture_end(gpupool_client *c) {
        return capture(c, false, __func__);
}

/*
 * What the daemon says this client may still lease on daemon device d now: the least of what its
 * limits leave and what no client holds or others keep free for the daemon to ask back. UINT64_MAX where the daemon cannot be asked (gone): the
 * process's own view then. Locked.
 */
static uint64_t may_lease(gpupool_client *c, unsigned d) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep = NULL;
        Gpupool__MemInfoRequest mr = GPUPOOL__MEM_INFO_REQUEST__INIT;
        uint64_t bytes = UINT64_MAX;

        if (client_memory_lost(c) || client_daemon_gone(c))
                return bytes;
        mr.device = d;
        req.body_case = GPUPOOL__ENVELOPE__BODY_MEM_INFO;
        req.mem_info = &mr;
        if (client_call(c, &req, GPUPOOL__ENVELOPE__BODY_MEM_INFO_REPLY, &rep, NULL) == 0) {
                const Gpupool__MemInfoReply *r = rep->mem_info_reply;

                /* What no client holds, and what others keep free that the daemon would ask back for it. */
                bytes = r->unheld_bytes + (r->has_reclaimable_bytes ? r->reclaimable_bytes : 0);
                if (r->has_may_lease_bytes && r->may_lease_bytes < bytes)
                        bytes = r->may_lease_bytes;
        }
        if (rep)
                gpupool__envelope__free_unpacked(rep, NULL);
        return bytes;
}

GPUPOOL_EXPORT int gpupool_device_memory(gpupool_client *c, int device, uint64_t *ret_free, uint64_t *ret_total) {
        uint64_t total, used, mapped, more, free_bytes;
        int d;

        if (!c)
                return client_invalid(NULL, "%s: no handle (NULL): gpupool_connect() gives one", __func__);
        if (!ret_free || !ret_total)
                return client_invalid(c, "%s: no place for the figures (NULL)", __func__);
        pthread_mutex_lock(&c->lock);
        d = device < 0 ? -1 : daemon_device(c, device);
        if (d < 0) {
                client_set_error(c, "no device %d of this process is one gpupoold serves", device);
                pthread_mutex_unlock(&c->lock);
                return -ENODEV;
        }
        total = c->devices[d].total_bytes;
        if (c->limit_bytes && c->limit_bytes < total)
                total = c->limit_bytes;
        /* Memory outside the pool it charged is used too (the daemon's answer counts it already). */
        used = c->devices[d].heap.in_use_bytes + c->devices[d].charged;
        /* Segments that grow in place map granules under ranges: the granules it holds and its pieces, not the ranges. */
        mapped = c->grow ? client_grow_mapped(c, (unsigned) d) : c->devices[d].heap.size_bytes;
        if (mapped < used)
                mapped = used;
        /* What its pool holds free, and what the daemon would lease it more. */
        more = may_lease(c, (unsigned) d);
        pthread_mutex_unlock(&c->lock);
        free_bytes = used < total ? total - used : 0;
        if (more != UINT64_MAX && mapped - used + more < free_bytes)
                free_bytes = mapped - used + more;
        *ret_total = total;
        *ret_free = free_bytes;
        return 0;
}

/* A ChargeRequest for bytes of daemon device d: a charge, or a release. Locked. Returns 0, or a negative errno with the sentence. */
static int charge_call(gpupool_client *c, unsigned d, uint64_t bytes, bool release) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep = NULL;
        Gpupool__ChargeRequest cr = GPUPOOL__CHARGE_REQUEST__INIT;
        int r;

        cr.device = d;
        cr.bytes = bytes;
        cr.has_release = release;
        cr.release = release;
        req.body_case = GPUPOOL__ENVELOPE__BODY_CHARGE;
        req.charge = &cr;
        r = client_call(c, &req, GPUPOOL__ENVELOPE__BODY_CHARGE_REPLY, &rep, NULL);
        if (rep)
                gpupool__envelope__free_unpacked(rep, NULL);
        return r;
}

/* The daemon's index of the process's device, for a charge; -ENODEV saying so. Locked. */
static int charge_device(gpupool_client *c, int device) {
        int d = device < 0 ? -1 : daemon_device(c, device);

        if (d < 0)
                client_set_error(c, "no device %d of this process is one gpupoold serves", device);
        return d < 0 ? -ENODEV : d;
}

GPUPOOL_EXPORT int gpupool_charge(gpupool_client *c, int device, uint64_t bytes) {
        struct client_device *dev;
        int d, r = 0;

        if (!c)
                return client_invalid(NULL, "%s: no handle (NULL): gpupool_connect() gives one", __func__);
        if (bytes == 0 || bytes > HEAP_MAX_REQUEST)
                return client_invalid(c, "%s: %" PRIu64 " bytes: a charge is 1 byte to 64 TiB", __func__, bytes);
        pthread_mutex_lock(&c->lock);
        if ((d = charge_device(c, device)) < 0) {
                pthread_mutex_unlock(&c->lock);
                return d;
        }
        dev = &c->devices[d];
        /* Without a daemon nothing counts it now; the next daemon is told (client_resume.c). */
        if (!client_daemon_gone(c) && (r = charge_call(c, (unsigned) d, bytes, false)) == 0)
                dev->charge_counted += bytes;
        if (r == 0 || (r != -EDQUOT && client_daemon_gone(c))) {
                dev->charged += bytes;
                r = 0;
        }
        pthread_mutex_unlock(&c->lock);
        return r;
}

GPUPOOL_EXPORT int gpupool_uncharge(gpupool_client *c, int device, uint64_t bytes) {
        struct client_device *dev;
        uint64_t counted;
        int d;

        if (!c)
                return client_invalid(NULL, "%s: no handle (NULL): gpupool_connect() gives one", __func__);
        pthread_mutex_lock(&c->lock);
        if ((d = charge_device(c, device)) < 0) {
                pthread_mutex_unlock(&c->lock);
                return d;
        }
        dev = &c->devices[d];
        if (bytes == 0 || bytes > dev->charged) {
                pthread_mutex_unlock(&c->lock);
                return client_invalid(c, "%s: %" PRIu64 " bytes of device %d, of which %" PRIu64 " are charged", __func__,
                                      bytes, device, dev->charged);
        }
        /* What is uncounted goes first: the daemon counts the rest. */
        counted = bytes > dev->charged - dev->charge_counted ? bytes - (dev->charged - dev->charge_counted) : 0;
        dev->charged -= bytes;
        dev->charge_counted -= counted;
        if (counted && !client_daemon_gone(c))
                (void) charge_call(c, (unsigned) d, counted, true);     /* a daemon gone with it counts nothing */
        pthread_mutex_unlock(&c->lock);
        return 0;
}

GPUPOOL_EXPORT int gpupool_block_range(gpupool_client *c, const void *ptr, void **ret_base, size_t *ret_size) {
        uint64_t size;
        void *base;

        if (!c)
                return client_invalid(NULL, "%s: no handle (NULL): gpupool_connect() gives one", __func__);
        if (!ret_base || !ret_size)
                return client_invalid(c, "%s: no place for the range (NULL)", __func__);
        if (client_live_range(c, ptr, &base, &size) < 0) {
                pthread_mutex_lock(&c->lock);
                client_set_error(c, "%p lies in no live block of this client", ptr);
                pthread_mutex_unlock(&c->lock);
                return -ENOENT;
        }
        *ret_base = base;
        *ret_size = (size_t) size;
        return 0;
}

GPUPOOL_EXPORT int gpupool_grow_stats(gpupool_client *c, struct gpupool_grow_stats *ret) {
        struct gpupool_grow_stats st;

        if (!c)
                return client_invalid(NULL, "%s: no handle (NULL): gpupool_connect() gives one", __func__);
        if (!ret)
                return client_invalid(c, "%s: no place for the figures (ret is NULL)", __func__);
        pthread_mutex_lock(&c->lock);
        client_grow_stats(c, &st);
        pthread_mutex_unlock(&c->lock);
        *ret = st;
        return 0;
}

GPUPOOL_EXPORT int gpupool_release_wait(gpupool_client *c, int timeout_ms) {
        struct timespec at;
        int r = 0;

        if (!c)
                return client_invalid(NULL, "%s: no handle (NULL): gpupool_connect() gives one", __func__);
        if (timeout_ms < 0)
                return client_invalid(c, "gpupool_release_wait: a timeout of %d ms: 0 or more", timeout_ms);
        gp_deadline_after_ms((uint64_t) timeout_ms, &at);
        pthread_mutex_lock(&c->lock);
        c->release.waiters++;
        while (!c->release.asked && !c->release.closing && r == 0)
                r = pthread_cond_timedwait(&c->release.cond, &c->lock, &at) == ETIMEDOUT ? 1 : 0;
        if (c->release.closing) {
                r = -ECANCELED;
        } else if (c->release.asked) {
                c->release.asked = false;       /* this thread's to serve */
                r = 1;
        } else {
                r = 0;
        }
        if (--c->release.waiters == 0 && c->release.closing)
                pthread_cond_broadcast(&c->release.cond);
        pthread_mutex_unlock(&c->lock);
        return r;
}

GPUPOOL_EXPORT int gpupool_release_done(gpupool_client *c) {
        if (!c)
                return client_invalid(NULL, "%s: no handle (NULL): gpupool_connect() gives one", __func__);
        pthread_mutex_lock(&c->lock);
        c->release.done_seq++;
        pthread_cond_broadcast(&c->release.cond);
        pthread_mutex_unlock(&c->lock);
        return 0;
}

GPUPOOL_EXPORT int gpupool_release_report(gpupool_client *c, int device, uint64_t bytes) {
        int d;

        if (!c)
                return client_invalid(NULL, "%s: no handle (NULL): gpupool_connect() gives one", __func__);
        if (device < 0)
                return client_invalid(c, "gpupool_release_report: device %d: devices are numbered from 0", device);
        pthread_mutex_lock(&c->lock);
        d = daemon_device(c, device);
        if (d >= 0)
                c->devices[d].framework_free = bytes;
        else
                client_set_error(c, "no device %d of this process is one gpupoold serves", device);
        pthread_mutex_unlock(&c->lock);
        return d < 0 ? -ENODEV : 0;
}

GPUPOOL_EXPORT int gpupool_stats(gpupool_client *c, struct gpupool_stats *ret) {
        struct gpupool_stats st = { 0 };

        if (!c)
                return client_invalid(NULL, "%s: no handle (NULL): gpupool_connect() gives one", __func__);
        if (!ret)
                return client_invalid(c, "%s: no place for the figures (ret is NULL)", __func__);
        /* Counted now rather than on every allocation. */
        pthread_mutex_lock(&c->lock);
        for (struct gp_rb_node *n = gp_rb_first(&c->by_id); n; n = gp_rb_next(n)) {
                st.mapped_segments++;
                st.mapped_bytes += gp_rb_entry(n, struct mapping, by_id)->size;
        }
        /* Segments that grow in place: each granule held is a segment of the daemon's. */
        for (unsigned d = 0; d < c->device_count; d++) {
                uint64_t held = client_grow_held(c, d);

                st.mapped_segments += held;
                st.mapped_bytes += held * GP_GRANULE_BYTES;
        }
        for (unsigned i = 0; i < CLIENT_SHARDS; i++) {
                pthread_mutex_lock(&c->live[i].lock);
                for (struct gp_rb_node *n = gp_rb_first(&c->live[i].blocks); n; n = gp_rb_next(n)) {
                        const struct block *b = gp_rb_entry(n, struct block, node);

                        st.live_blocks++;
                        st.live_bytes += b->size;
                }
                pthread_mutex_unlock(&c->live[i].lock);
        }
        st.round_trips = c->round_trips;
        st.segments_imported = c->segments_imported;
        st.cached_bytes = client_pool_free_bytes(c);     /* the threads' caches too */
        pthread_mutex_unlock(&c->lock);
        *ret = st;
        return 0;
}

GPUPOOL_EXPORT const char *gpupool_backend(gpupool_client *c) {
        return c ? __atomic_load_n(&c->mem, __ATOMIC_ACQUIRE)->backend : NULL;
}

GPUPOOL_EXPORT size_t gpupool_last_error(gpupool_client *c, char *buf, size_t size) {
        size_t len;

        if (!c) {
                if (size)
                        snprintf(buf, size, "%s", client_thread_error());
                return strlen(client_thread_error());
        }
        pthread_mutex_lock(&c->lock);
        len = strlen(c->error);
        if (size)
                snprintf(buf, size, "%s", c->error);
        pthread_mutex_unlock(&c->lock);
        return len;
}

GPUPOOL_EXPORT const char *gpupool_strerror(int err) {
        switch (err) {
        case 0:
                return "success";
        case -EINVAL:
                return "invalid argument";
        case -ENODEV:
                return "no such device";
        case -EDQUOT:
                return "over a gpupool limit";
        case -ENOMEM:
                return "device memory exhausted";
        case -ENOENT:
                return "not a live block of this client (or no gpupoold at the socket)";
        case -EPROTO:
                return "gpupool protocol error";
        case -EPROTONOSUPPORT:
                return "gpupool protocol version not supported";
        case -ECONNRESET:
                return "gpupoold is gone";
        case -ETIMEDOUT:
                return "gpupoold did not answer in time ($GPUPOOL_TIMEOUT)";
        case -ECONNREFUSED:
                return "gpupoold is not running";
        case -EACCES:
                return "permission denied on the gpupool socket";
        case -EIO:
                return "gpupoold or the CUDA driver failed";
        case -ENOSYS:
                return "the CUDA driver is missing or too old";
        case -ENOSPC:
                return "the arena is full";
        case -EOPNOTSUPP:
                return "not built for this backend or mode yet";
        default:
                return "unknown error";
        }
}
