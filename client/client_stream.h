/*
 * client_stream.h: stream-ordered frees (client_stream.c), on the cuda backend. All called locked.
 */
#ifndef GP_CLIENT_STREAM_H
#define GP_CLIENT_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client_common.h"

/* No stream-ordered frees yet, at connect. */
void client_stream_init(gpupool_client *c);

/* The handle goes: what client_stream_init() made (the reaper stopped, the queues forgotten). */
void client_stream_fini(gpupool_client *c);

/*
 * Frees b, out of the live table, for an allocation on stream at once (held in its device's
 * heap for the stream's lane; b is gone), and for any other once a fence recorded after it
 * has completed: one fence for the frees around it (after STREAM_FENCE_FREES of them, or at
 * client_stream_collect()). On error b is untouched (the caller puts it back): -EBUSY for a
 * stream capturing a CUDA graph, -EINVAL for a stream of another context, -ENOMEM. promises:
 * the call's own about the stream (GPUPOOL_STREAMS_KEPT...), besides the handle's.
 */
int client_stream_defer_free(gpupool_client *c, struct block *b, void *stream, unsigned promises);

/*
 * The lane whose held blocks an allocation on stream of daemon device d may carve
 * (heap_alloc_on()): its stream's, while it holds some; 0 for none (or a capturing stream).
 */
uint32_t client_stream_lane(gpupool_client *c, unsigned d, void *stream, unsigned promises);

/* Whether some stream-ordered free still waits for a fence to complete. */
bool client_stream_pending(const gpupool_client *c);

/*
 * Before an allocation asks the daemon for memory the held frees may hold: records a fence on
 * every stream with at least fewest frees since its last (1 for 0; a stream capturing a graph,
 * or destroyed, gets none), then releases what has completed (client_stream_reap() without
 * waiting). Called by a thread of the application's, never the reaper.
 */
int client_stream_collect(gpupool_client *c, unsigned fewest);

/*
 * An allocation the process's pool cannot serve fences a stream's frees only once this many
 * wait for a fence (client_stream_collect()'s fewest): bench-lag's traces record 1 fence per
 * 28 to 49 frees at a lag of 256 with every stream fenced at a miss, 1 per 45 to 60 with this,
 * and hold the same (docs/performance.md). A refusal of the daemon fences every stream.
 */
#define STREAM_FENCE_MISS_FREES 32

/*
 * Releases the blocks held until a fence that has completed, stopping on each stream at the
 * first that has not. With wait, waits for all the fences first, and returns -EIO when the
 * driver could not prove that some work ended (those blocks stay held); 0 otherwise. Frees
 * with no fence stay held: at disconnect the process's work ends first (cuCtxSynchronize),
 * and they go with the heaps.
 */
int client_stream_reap(gpupool_client *c, bool wait);

/* The daemon is gone: drops the fences without waiting (the blocks they held go with the heaps). */
void client_stream_forget(gpupool_client *c);

/*
 * Adds the caller's promises about its streams (gpupool_promise()): 0, or -EINVAL with the
 * error set for a bit that names none. Locked.
 */
int client_stream_promise(gpupool_client *c, unsigned promises);

/*
 * A graph capture the caller tells of begins (begin) or has ended: while one is under way the
 * driver is asked whether a stream captures, promise or not. Returns the captures under way
 * after it, or -EINVAL with the error set for an end with none. Locked.
 */
int client_stream_capture(gpupool_client *c, bool begin);

/* Stops the reaper thread, unlocking while joining it. Locked. */
void client_stream_stop(gpupool_client *c);

#endif
