/*
 * gpupool.h: the client library of gpupool, the node's GPU memory-pool daemon.
 *
 * A process connects to gpupoold once and then allocates and frees blocks of device memory
 * from its own pool, over segments it leases from the daemon; the daemon keeps one cache for
 * the whole node and enforces limits. Every function returns 0 or a negative errno:
 *
 *   -EINVAL        a bad argument (size 0, a negative device, a bad client name, a
 *                  $GPUPOOL_IDLE_RETURN that is not a duration)
 *   -ENODEV        no such device on this daemon
 *   -EDQUOT        over a limit (the client's reserved bytes, its number of blocks, clients)
 *   -ENOMEM        the device is full even after the daemon released its cache
 *   -ENOENT        a pointer this client does not hold (freed twice, never allocated)
 *   -EPROTO        the daemon answered something this library does not understand
 *   -ECONNRESET    the daemon is gone. On the cuda backend the handle is unusable except for
 *                  gpupool_reconnect() and gpupool_disconnect(); on host and cuda-vmm, whose
 *                  memory outlives the daemon, only what needs the daemon fails: the
 *                  process's blocks stay valid and it allocates on within what it holds.
 *                  The handle also reconnects on its own once a daemon listens again
 *                  (tried every second at most) and the new daemon adopts what the
 *                  process holds; calls that need a daemon work again from then on. To do
 *                  so the library keeps each segment's descriptor: it raises the
 *                  process's soft RLIMIT_NOFILE to its hard limit and keeps descriptors
 *                  at 1024 and above, leaving the application 2048
 *   -ETIMEDOUT     the daemon did not answer within $GPUPOOL_TIMEOUT (default 30s; a
 *                  duration, 0 for no limit): it is stopped or hung. The handle is given up as
 *                  after -ECONNRESET (later calls return -ECONNRESET); blocks it holds stay
 *                  mapped and counted to this process until it exits or gpupool_reconnect().
 *                  A handle given up (this, an answer it cannot read, a refusal) while
 *                  that daemon lives on does not reconnect on its own: gpupool_reconnect()
 *   -EIO           the daemon's backend or this process's CUDA driver failed
 *   others         from connect(2): -ENOENT no socket, -ECONNREFUSED no daemon, -EACCES
 *
 * On a daemon with the cuda backend, the library loads the CUDA driver (libcuda.so.1, or
 * $GPUPOOL_LIBCUDA) at connect and works in each GPU's primary context, the one the CUDA
 * runtime uses. Pointers are device pointers (CUdeviceptr values) in this process's address
 * space, usable by kernels and cuMemcpy, not by the CPU.
 *
 * gpupool_last_error() gives the daemon's sentence about the latest failure, which names the
 * limit or state that refused it.
 *
 * Handles are thread-safe; the library never logs and keeps no global state but the framework
 * hooks' shared handle and each thread's pointer to its cache of small freed blocks.
 */
#ifndef GPUPOOL_H
#define GPUPOOL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define GPUPOOL_EXPORT __attribute__((visibility("default")))
#else
#define GPUPOOL_EXPORT
#endif

#define GPUPOOL_VERSION_MAJOR 0
#define GPUPOOL_VERSION_MINOR 1

/* Where the daemon listens unless $GPUPOOL_SOCKET or an explicit path says otherwise. */
#define GPUPOOL_DEFAULT_SOCKET "/run/gpupool/gpupool.sock"

typedef struct gpupool_client gpupool_client;

/*
 * Connects to the daemon at socket_path (NULL: $GPUPOOL_SOCKET, else the default) as
 * client_name (NULL: the program's name; at most 63 bytes, no control characters), and sets
 * *ret_client. *ret_client is untouched on failure.
 */
GPUPOOL_EXPORT int gpupool_connect(const char *socket_path, const char *client_name, gpupool_client **ret_client);

/*
 * Waits for the work behind pending gpupool_free_async() calls and for all of this process's
 * work on the GPUs it used (cuCtxSynchronize: kernels may still write blocks never freed),
 * unmaps every segment, tells the daemon so (it reuses the memory at once) and frees the
 * handle. When the driver cannot say that the work ended, it does not tell the daemon, which
 * then keeps the memory until the process has exited. Every pointer from this handle is
 * invalid afterwards. NULL is fine.
 */
GPUPOOL_EXPORT void gpupool_disconnect(gpupool_client *client);

/*
 * After -ECONNRESET (gpupoold stopped or crashed, and was started again): forgets every block
 * and mapping of the old daemon, which are invalid from now on (on the cuda backend the memory
 * died with the process that owned it; on host and cuda-vmm it is let go: on host the handle
 * reconnects by itself and keeps it instead, unless this is called), and connects again with
 * the same socket and name. A daemon that is there (the handle had reconnected by itself, or
 * never lost it) is told goodbye first, once the device has finished this process's work, so
 * that what it holds of this process goes back at once rather than at the process's exit.
 * Returns 0, or connect's errors (-ECONNREFUSED while no daemon listens: call again later);
 * the handle stays usable for gpupool_reconnect() and gpupool_disconnect() either way.
 */
GPUPOOL_EXPORT int gpupool_reconnect(gpupool_client *client);

/*
 * Allocates size bytes on device and sets *ret_ptr. device is this process's CUDA device
 * ordinal on the cuda backend (as cudaSetDevice() takes it, after $CUDA_VISIBLE_DEVICES; the
 * library finds the daemon's GPU by UUID), and 0 on the host backend. Blocks are 512-byte
 * aligned. On the host backend the memory is readable and writable by the caller; on the cuda
 * backend it is device memory. *ret_ptr is untouched on failure.
 */
GPUPOOL_EXPORT int gpupool_alloc(gpupool_client *client, int device, size_t size, void **ret_ptr);

/*
 * Frees a block from gpupool_alloc(). The caller guarantees that nothing (no queued device
 * work) still uses it. -ENOENT for a pointer that is not the start of a live block of this
 * client.
 */
GPUPOOL_EXPORT int gpupool_free(gpupool_client *client, void *ptr);

/*
 * gpupool_alloc() for use on stream: it may also be given memory freed with
 * gpupool_free_async() on the same stream whose work has not ended yet (split from such a
 * block, or merged with its neighbours), since the stream runs the new work after the old.
 * Other allocations get it only once that work is done.
 */
GPUPOOL_EXPORT int gpupool_alloc_async(gpupool_client *client, int device, size_t size, void *stream, void **ret_ptr);

/*
 * Frees a block from gpupool_alloc() once the work queued on stream (a CUstream or
 * cudaStream_t of the block's GPU's primary context; NULL for the legacy default stream)
 * before this call has completed. Returns at once. The block is free at once for
 * gpupool_alloc_async() on the same stream, which the stream orders after that work, and for
 * nobody else until an event the library records on stream after it has completed (one event
 * for up to 64 frees on a stream, or for those made when something else needs the memory: an
 * allocation the pool cannot serve, once 32 wait, a trim, a lease refused; the library's
 * thread records one for frees left 2 ms without). It asks the driver whether stream is
 * capturing and what its id is (gpupool_promise() spares both). On the host
 * backend stream must be NULL and the block is freed at once. -ENOENT as gpupool_free();
 * -EINVAL when no event can be recorded on stream (a stream of another context); -EBUSY when
 * stream is capturing a CUDA graph (a block freed inside a capture is the graph's: free it
 * after the capture ends). The block stays allocated on any error. Only a completed event
 * makes the block anyone's: if the driver fails to say (a faulted context), it stays the
 * stream's until the process exits. gpupool_disconnect() waits for such pending frees.
 */
GPUPOOL_EXPORT int gpupool_free_async(gpupool_client *client, void *ptr, void *stream);
/*
 * As gpupool_free_async()'s stream: the stream the block was allocated on (gpupool_alloc_async()'s;
 * the legacy default stream for gpupool_alloc()'s), for a caller that does not keep it.
 */
#define GPUPOOL_STREAM_OF_ALLOC ((void *) -1)

/*
 * Promises about the streams given to this handle's stream-ordered calls, which spare the
 * driver calls that otherwise check each stream: cuStreamIsCapturing and cuStreamGetId, on
 * every gpupool_alloc_async() that may take a block held for its stream and every
 * gpupool_free_async(). With both, and no capture told of under way, those calls make no
 * driver call at all; a fence (one per 64 frees) still records an event.
 *
 *   GPUPOOL_STREAMS_KEPT   no stream given is destroyed while a block freed on it may be
 *                          pending (before gpupool_disconnect()): streams are told apart by
 *                          handle, not by cuStreamGetId. A stream destroyed early, whose handle
 *                          then comes back for a new stream, would have the new stream's
 *                          allocations take blocks the old stream's work may still use.
 *                          PyTorch's streams (its pool's, never destroyed) keep it.
 *                          CU_STREAM_PER_THREAD, a stream of each thread, is still asked.
 *   GPUPOOL_CAPTURES_TOLD  every CUDA graph capture in the process begins after a
 *                          gpupool_capture_begin() on this handle and ends before the matching
 *                          gpupool_capture_end(): the driver is asked whether a stream
 *                          captures only while one is under way. A capture not told of would
 *                          take a free's event as a node of its graph, and a block its graph
 *                          uses could be handed out before the graph runs.
 *
 * Promises add up and hold for the life of the handle (gpupool_reconnect() keeps them); none
 * is taken back. -EINVAL for a bit that is none of these.
 */
#define GPUPOOL_STREAMS_KEPT 1u
#define GPUPOOL_CAPTURES_TOLD 2u
GPUPOOL_EXPORT int gpupool_promise(gpupool_client *client, unsigned promises);
/*
 * Around each graph capture, for GPUPOOL_CAPTURES_TOLD: gpupool_capture_begin() before the
 * capture begins (cuStreamBeginCapture), gpupool_capture_end() once it has ended or failed to
 * begin. Captures nest and overlap. They return how many are under way after the call;
 * gpupool_capture_end() with none is -EINVAL.
 */
GPUPOOL_EXPORT int gpupool_capture_begin(gpupool_client *client);
GPUPOOL_EXPORT int gpupool_capture_end(gpupool_client *client);

/*
 * Scopes: every block allocated through this handle between gpupool_scope_begin() and the
 * matching gpupool_scope_end(), and not freed by then, is freed at the end, into the
 * process's pool. Scopes nest (16 deep) and belong to the handle, not to a thread: allocations of any
 * thread of the handle in between belong to the innermost open scope. The caller guarantees,
 * as for gpupool_free(), that no device work still uses the blocks; blocks already given to
 * gpupool_free_async() are left to it. -EINVAL for an end without a begin or past the depth.
 */
GPUPOOL_EXPORT int gpupool_scope_begin(gpupool_client *client);
GPUPOOL_EXPORT int gpupool_scope_end(gpupool_client *client);

/*
 * Arenas: one block of bytes from the process's pool, handed out by bumping an offset, for one
 * pipeline run; gpupool_arena_reset() makes all of it free again at once. Allocations are
 * aligned to align (a power of two; 0 means 256) on the pointer's value. An arena never grows:
 * an allocation that does not fit is -ENOSPC, and gpupool_last_error() says how much was left.
 * Not thread-safe: one thread at a time per arena. gpupool_arena_destroy() frees the block.
 */
typedef struct gpupool_arena gpupool_arena;
GPUPOOL_EXPORT int gpupool_arena_create(gpupool_client *client, int device, size_t bytes, gpupool_arena **ret_arena);
GPUPOOL_EXPORT int gpupool_arena_alloc(gpupool_arena *arena, size_t size, size_t align, void **ret_ptr);
GPUPOOL_EXPORT void gpupool_arena_reset(gpupool_arena *arena);
GPUPOOL_EXPORT size_t gpupool_arena_used(const gpupool_arena *arena);
GPUPOOL_EXPORT int gpupool_arena_destroy(gpupool_arena *arena);

/*
 * Copies the daemon's message about this handle's latest failed call into buf (always
 * NUL-terminated when size > 0); "" when there is none. Returns the message's length.
 * Every failure has one, a bad argument's too. With a NULL client: the calling thread's
 * latest failure that left no handle to keep it in, a call given a NULL handle or a failed
 * gpupool_connect(): why the daemon refused it (its limits, its protocol version, a PID
 * namespace of its own on the legacy cuda backend, ...) or why it could not be reached, with
 * the socket's path.
 */
GPUPOOL_EXPORT size_t gpupool_last_error(gpupool_client *client, char *buf, size_t size);

/*
 * The daemon's backend, which says what the pointers this handle hands out are: "host" (host
 * memory), "cuda" or "cuda-vmm" (device pointers). NULL for a NULL client. The string lives as
 * long as the library.
 */
GPUPOOL_EXPORT const char *gpupool_backend(gpupool_client *client);

/*
 * The process's own pool: the handle leases whole segments from the daemon and carves its
 * blocks from them itself (best fit, split and merge, as PyTorch's caching allocator does), so
 * that an allocation or a free that fits what it holds makes no request. A segment that
 * empties stays mapped until the daemon asks for memory back (a full device, gpupoolctl trim;
 * the handle keeps a second connection to the daemon and a thread that answers at once), it
 * has been empty for $GPUPOOL_IDLE_RETURN (a duration; default 10s; 0: never), an allocation
 * needs room under a limit or on a full device, gpupool_trim(), or disconnect. The same thread
 * tells the daemon what the process holds in use and free, at most once a second when it
 * changed. gpupool_trim() gives back every empty segment now (after the stream-ordered
 * frees whose work has ended); gpupool_cached_bytes() is what the pool holds free for any
 * allocation (in empty segments and between live blocks; not what is free only for the stream
 * it was freed on).
 *
 * Each thread parks the blocks of at most 16 KiB it frees without a stream (at most 32 and
 * 256 KiB) and takes them back for its next allocations of the same size and device, outside
 * the lock the handle's threads share. The handle takes them back into its pool before a
 * lease, when the daemon asks for memory, on gpupool_trim(), and once a thread has not used
 * its cache for a second or exited.
 *
 * Earlier versions had the daemon carve every block, with a client cache in front; their
 * $GPUPOOL_LEASE, $GPUPOOL_KEEP_FREE, $GPUPOOL_CLIENT_CACHE, $GPUPOOL_CLIENT_CACHE_IDLE and
 * $GPUPOOL_THREAD_CACHE are no longer read: the process's pool does what they tuned.
 */
#define GPUPOOL_DEFAULT_IDLE_RETURN_MS 10000
GPUPOOL_EXPORT int gpupool_trim(gpupool_client *client);
GPUPOOL_EXPORT size_t gpupool_cached_bytes(gpupool_client *client);

/*
 * A framework that caches blocks of its own over this handle's (PyTorch's caching allocator in
 * use_with_torch("mempool")) holds memory the library cannot give back: the framework can. A
 * thread of the framework's glue waits in gpupool_release_wait(), which returns 1 when the
 * daemon asks this process for memory its pool does not hold free, 0 after timeout_ms, or
 * -ECANCELED once gpupool_disconnect() has begun (which waits for waiting threads to leave);
 * -EINVAL for a negative timeout. The thread then frees what its cache holds unused (from
 * its own thread, never under the library's lock) and calls gpupool_release_done(): the
 * library waits up to 40 ms for that, and answers the daemon with the segments that emptied
 * (it asks no thread while a lease of this handle is out: the framework may hold its own lock
 * waiting for it). gpupool_release_report() says how many bytes of its blocks on the process's
 * device the framework's cache holds unused: the library reports them to the daemon as free
 * (not in use), so that the daemon asks this process among the first; -ENODEV for a device
 * the daemon does not serve (or, on a GPU backend, none allocated on yet).
 */
GPUPOOL_EXPORT int gpupool_release_wait(gpupool_client *client, int timeout_ms);
GPUPOOL_EXPORT int gpupool_release_done(gpupool_client *client);
GPUPOOL_EXPORT int gpupool_release_report(gpupool_client *client, int device, uint64_t bytes);

/*
 * Named objects: memory that outlives the process that made it, for many processes to map
 * read-only without a copy (model weights that every worker loads).
 *
 * Names are each publisher's uid's: the object name of uid 1000 and the object name of uid
 * 2000 are two objects, and nobody can take a name another uid means to use first.
 *
 * gpupool_publish() makes the block at ptr (the start of a live block) the object name (1 to
 * 255 bytes of UTF-8, no control characters, none that shows nothing or turns text around,
 * such as U+200B or U+202E; not taken by this uid): its first size bytes (at most the
 * block's) are the object's. The block must have its segment to itself (a block over 10 MiB
 * always has; the threads' caches are emptied first), whose other bytes are zeroed. It stops
 * being the process's block: it is not freed, it counts against the publisher's tenant until
 * unpublished, it is sealed against writing for good, and the process has it attached
 * read-only at ptr (a write there faults) until it detaches it. Refused (-EINVAL) for a block that shares its segment, a name taken or
 * invalid, a size of 0 or over the block; -ENOENT for a pointer that is no live block. On any
 * failure the block is still the application's, writable, but for -EROFS: gpupoold sealed its
 * segment and went (killed) before it answered; the block is then read-only and no longer the
 * application's to write or free (the library keeps its whole segment out of use, and offers it
 * to no later daemon).
 *
 * gpupool_attach() maps the object name read-only and returns where and how large: the one
 * this process's uid published, else (for a client of a tenant of the config) the one its
 * tenant published; never another uid's by its name alone (-ENOENT, naming the uids that
 * publish one: a name is no proof of who wrote the bytes). gpupool_attach_of() attaches the
 * object name that uid publisher_uid published. gpupool_object_publisher() says who published
 * the object attached at ptr: its uid, and its tenant into tenant (tenant_size bytes). Host
 * backend: the daemon sealed its memory against writing at publish, so nobody can write it,
 * whatever descriptor they hold. cuda-vmm: the driver cannot seal; every mapping the library
 * makes (the publisher's after publishing included) has read access only, and a write through
 * one is an illegal address that ends the process's CUDA context (publish waits for the
 * device's work first, cuCtxSynchronize). cuda (legacy IPC handles): not read-only at all, since
 * an IPC handle opens read-write; nothing stops a write, and the object dies with the daemon.
 * Returns -ENOENT for no such object, -EACCES for one that is not for this process (its
 * publisher's principal, that is its uid and its pod where it published from one, the node's
 * operator, the clients of its tenant where that is a tenant of the config, not default, and
 * its readers may attach it). Attaching one the handle has
 * attached already returns the same mapping, counted: each attach takes one gpupool_detach().
 * gpupool_detach() unmaps it.
 *
 * gpupool_publish_to() is gpupool_publish() naming who else may attach the object, its
 * readers: comma-separated, "*" for every client of the node (read-only where the backend
 * enforces it: that is all they get), or tenants' names ("inference,eval": their clients).
 * At most 16; NULL or "" for none. A bad list is -EINVAL, saying why.
 *
 * gpupool_unpublish() ends this uid's object name: no one attaches it from then on, its name
 * is free at once, and its memory goes back once the last process has detached (or exited).
 * The node's operator ends another uid's with gpupoolctl unpublish --uid.
 *
 * With idle_objects set (gpupoold.conf(5)), an object nobody has attached that long may be
 * evicted under memory pressure: a later attach is -ENOENT saying it was evicted and when.
 *
 * Built for whole segments (not $GPUPOOL_SEGMENTS=grow: -EOPNOTSUPP, saying so). On host and
 * cuda-vmm, objects outlive a restart of a daemon run by systemd (its descriptor store keeps
 * them; gpupoold(8)): a handle that has one
 * attached attaches it again, counted, once it has reconnected. A daemon started by hand
 * forgets them when it stops; the processes that have them mapped keep their mappings.
 */
GPUPOOL_EXPORT int gpupool_publish(gpupool_client *client, const char *name, void *ptr, size_t size);
GPUPOOL_EXPORT int gpupool_publish_to(gpupool_client *client, const char *name, void *ptr, size_t size,
                                      const char *readers);
GPUPOOL_EXPORT int gpupool_attach(gpupool_client *client, const char *name, const void **ret_ptr, size_t *ret_size);
GPUPOOL_EXPORT int gpupool_attach_of(gpupool_client *client, const char *name, unsigned publisher_uid, const void **ret_ptr,
                                     size_t *ret_size);
GPUPOOL_EXPORT int gpupool_object_publisher(gpupool_client *client, const void *ptr, unsigned *ret_uid, char *tenant,
                                            size_t tenant_size);
GPUPOOL_EXPORT int gpupool_detach(gpupool_client *client, const void *ptr);
GPUPOOL_EXPORT int gpupool_unpublish(gpupool_client *client, const char *name);

/*
 * What this handle holds now, counted when asked: live_blocks and live_bytes are the blocks
 * the application holds (rounded sizes; a gpupool_free_async() counts as freed at once),
 * cached_bytes what the process's pool holds free for any allocation (what mapped_bytes
 * holds beyond the two is free only for the stream it was freed on), and mapped_segments and mapped_bytes the
 * segments mapped in this process (with $GPUPOOL_SEGMENTS=grow, the 2 MiB granules it holds,
 * each a segment of the daemon's), which is what the daemon counts as this client's reserved
 * bytes.
 * round_trips counts the times the handle waited for gpupoold: a request and its reply, or
 * requests sent together and their replies (the leases of a block of more 2 MiB granules
 * than one lease brings, 128), and
 * segments_imported the segments it mapped (host: an mmap; cuda: a cuIpcOpenMemHandle;
 * cuda-vmm: an import), both since gpupool_connect(): in a steady state neither should grow.
 */
struct gpupool_stats {
        uint64_t live_blocks;
        uint64_t live_bytes;
        uint64_t cached_bytes;
        uint64_t mapped_segments;
        uint64_t mapped_bytes;
        uint64_t round_trips;
        uint64_t segments_imported;
};
GPUPOOL_EXPORT int gpupool_stats(gpupool_client *client, struct gpupool_stats *ret);

/*
 * The device's memory as this client may use it (what cuMemGetInfo tells a program under
 * gpupool-run): *ret_total is the daemon's limit on this client per device where it has one
 * (as it said at connect), else the device's size; *ret_free is what the process may still
 * allocate there now: what its pool holds free and what the daemon would lease it more (its
 * limits, its tenant's and others' guarantees, and what no other client holds or keeps free
 * that the daemon would ask back for it: a round trip),
 * never more than the total less its blocks. Without a daemon to ask, the total less its
 * blocks. device as gpupool_alloc()'s; -ENODEV for one the daemon does not serve.
 */
GPUPOOL_EXPORT int gpupool_device_memory(gpupool_client *client, int device, uint64_t *ret_free, uint64_t *ret_total);

/*
 * Memory the process allocated outside the pool, from the driver (cuMemCreate, as gpupool-run
 * does for a program), counted against this client's limit and its tenant's max on device as
 * leased memory is, until gpupool_uncharge() or the handle's end: what the daemon's limits are
 * for is the process's use of the GPU, not only the pool's part of it. Charge before
 * allocating: -EDQUOT (gpupool_last_error() saying which limit) where a limit has no room, and
 * the caller should not allocate. Without a daemon it is counted when one comes back (where that
 * one's limits have no room, it stays uncounted). gpupool_uncharge() takes back bytes charged
 * before (-EINVAL past what is charged). device as gpupool_alloc()'s; 1 byte to 64 TiB.
 * gpupool_device_memory()'s free leaves charged memory out.
 */
GPUPOOL_EXPORT int gpupool_charge(gpupool_client *client, int device, uint64_t bytes);
GPUPOOL_EXPORT int gpupool_uncharge(gpupool_client *client, int device, uint64_t bytes);

/*
 * The live block ptr lies in (at its start or inside it): its start and size as the pool
 * rounded it (512-byte multiples). -ENOENT for a pointer in no live block of this client.
 */
GPUPOOL_EXPORT int gpupool_block_range(gpupool_client *client, const void *ptr, void **ret_base, size_t *ret_size);

/*
 * With $GPUPOOL_SEGMENTS=grow, what lies under the process's ranges (all 0 in whole mode):
 * granules_held the 2 MiB granules it holds now (as mapped_segments counts them) and
 * granules_free those no live block touches (idle under the ranges, or spare); and since
 * gpupool_connect(), granules_mapped the times a granule was mapped under blocks (host: an
 * mremap(); cuda-vmm: a cuMemMap, and a cuMemSetAccess per run mapped side by side) and
 * granules_unmapped the times one was unmapped from there (host: an mmap() of the reservation
 * over it; cuda-vmm: a cuMemUnmap), to serve a block elsewhere or to go back. A granule that moves counts once in
 * each; in a steady state neither should grow.
 */
struct gpupool_grow_stats {
        uint64_t granules_held;
        uint64_t granules_free;
        uint64_t granules_mapped;
        uint64_t granules_unmapped;
};
GPUPOOL_EXPORT int gpupool_grow_stats(gpupool_client *client, struct gpupool_grow_stats *ret);

/*
 * Framework hooks: functions with exactly the signatures PyTorch's CUDAPluggableAllocator and
 * CuPy's CFunctionAllocator call, so that either takes its memory from gpupool with no code of
 * the application's (the Python package gpupool installs them: docs/frameworks.md).
 *
 * They share one handle per process, connected at the first call: the socket is
 * $GPUPOOL_SOCKET (else the default), the client name $GPUPOOL_CLIENT_NAME (else the program's
 * name). A failed connect is tried again at the next call. A forked child starts without it
 * and connects on its own. A size of 0 gives NULL, which is success, and freeing NULL does
 * nothing. On any failure the allocation returns NULL (a failed free returns nothing) and
 * gpupool_hook_last_error() gives the calling thread the reason.
 *
 * gpupool_torch_alloc() is gpupool_alloc_async() on stream, and gpupool_torch_free() frees
 * stream-ordered on the stream PyTorch gives it (the allocation's). struct CUstream_st * is
 * what cudaStream_t and CUstream are.
 *
 * gpupool_cupy_malloc() and gpupool_cupy_free() take param as a handle from
 * gpupool_connect(), or NULL for the shared one. CuPy's allocator interface names no stream,
 * so the calling thread says which stream is CuPy's current one with gpupool_cupy_stream()
 * (use_with_cupy() does, whenever it changes; NULL, the legacy default stream, until then):
 * gpupool_cupy_malloc() is gpupool_alloc_async() on it, and gpupool_cupy_free() frees
 * stream-ordered on the stream the block was allocated on (GPUPOOL_STREAM_OF_ALLOC), as
 * CuPy's own pool orders a free on the allocation's stream.
 */
struct CUstream_st;
GPUPOOL_EXPORT void *gpupool_torch_alloc(ssize_t size, int device, struct CUstream_st *stream);
GPUPOOL_EXPORT void gpupool_torch_free(void *ptr, ssize_t size, int device, struct CUstream_st *stream);
GPUPOOL_EXPORT void *gpupool_cupy_malloc(void *param, size_t size, int device);
GPUPOOL_EXPORT void gpupool_cupy_free(void *param, void *ptr, int device);
GPUPOOL_EXPORT void gpupool_cupy_stream(struct CUstream_st *stream);

/*
 * The negative errno of the calling thread's latest failed hook call (0: none since the last
 * success) and, in buf, a sentence saying what was asked and why it failed, gpupoold's reason
 * included (always NUL-terminated when size > 0).
 */
GPUPOOL_EXPORT int gpupool_hook_last_error(char *buf, size_t size);

/* The hooks' shared handle, connecting it if need be, for gpupool_stats() and gpupool_trim(). As gpupool_connect(). */
GPUPOOL_EXPORT int gpupool_hook_client(gpupool_client **ret_client);

/*
 * gpupool_torch_promise() makes gpupool_promise()'s promises for the calls of
 * gpupool_torch_alloc() and gpupool_torch_free() alone (the shared handle also serves CuPy's
 * hooks, which make none: CuPy destroys a stream when it is collected); they add up, and
 * -EINVAL for a bit that is no promise. gpupool_hook_capture() is gpupool_capture_begin()
 * (begin 1, before a capture begins) and gpupool_capture_end() (0, once it has ended) for the
 * shared handle, said to it when it connects if it has not yet; it returns the captures under
 * way after it (-EINVAL for an end with none). use_with_torch() makes both promises and tells
 * of every capture of torch.cuda.CUDAGraph.
 */
GPUPOOL_EXPORT int gpupool_torch_promise(unsigned promises);
GPUPOOL_EXPORT int gpupool_hook_capture(int begin);

/*
 * PyTorch does not check its allocator's result: a NULL would become a tensor whose first use
 * faults. With on set, a refused gpupool_torch_alloc() throws a C++ std::runtime_error instead
 * ("CUDA out of memory. Tried to allocate ...: gpupool's reason"), which PyTorch raises in
 * Python as a RuntimeError. The C++ runtime (libstdc++.so.6) must already be loaded, as it is
 * in any PyTorch process: -ENOENT otherwise, and nothing changes. Off by default.
 */
GPUPOOL_EXPORT int gpupool_torch_set_throw(int on);

/* A static description of one of the negative errnos above. */
GPUPOOL_EXPORT const char *gpupool_strerror(int err);

#ifdef __cplusplus
}
#endif

#endif
