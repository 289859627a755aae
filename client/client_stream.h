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
 * stream capturing a CUDA graph, -EINVAL for a stream of another context, -ENOMEM.
 */
int client_stream_defer_free(gpupool_client *c, struct block *b, void *stream);

/*
 * The lane whose held blocks an allocation on stream of daemon device d may carve
 * (heap_alloc_on()): its stream's, while it holds some; 0 for none (or a capturing stream).
 */
uint32_t client_stream_lane(gpupool_client *c, unsigned d, void *stream);

/* Whether some stream-ordered free still waits for a fence to complete. */
bool client_stream_pending(const gpupool_client *c);

/*
 * Before an allocation asks the daemon for memory the held frees may hold: records a fence on
 * every stream with frees since its last (a stream capturing a graph, or destroyed, gets
 * none), then releases what has completed (client_stream_reap() without waiting). Called by a
 * thread of the application's, never the reaper.
 */
int client_stream_collect(gpupool_client *c);

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

/* Stops the reaper thread, unlocking while joining it. Locked. */
void client_stream_stop(gpupool_client *c);

#endif
