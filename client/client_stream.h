/*
 * client_stream.h: stream-ordered frees (client_stream.c), on the cuda backend. All called locked.
 */
#ifndef GP_CLIENT_STREAM_H
#define GP_CLIENT_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client.h"

/*
 * Makes the handle's pending tree empty, at connect; free_block frees a block whose work ended
 * (the layer above's: the process's pool), called locked with the block in the live table.
 */
void client_stream_init(gpupool_client *c, int (*free_block)(gpupool_client *c, struct block *b));

/*
 * Queues b's free on stream after the work queued so far, fenced with the frees around it by
 * one event (after STREAM_FENCE_FREES of them, or at client_stream_collect()). b is out of the
 * live table; it goes back there marked freeing, where an allocation on the same stream may
 * take it at once (client_stream_take()). On error b is untouched (the caller puts it back):
 * -EBUSY for a stream capturing a CUDA graph, -EINVAL for a stream of another context, -ENOMEM.
 */
int client_stream_defer_free(gpupool_client *c, struct block *b, void *stream);

/*
 * A block freed on this same stream of daemon device d whose work may still run (the stream
 * orders new work after it), of at least rsize and at most a quarter more: taken out of its
 * stream-ordered free, live again. NULL when there is none.
 */
struct block *client_stream_take(gpupool_client *c, unsigned d, uint64_t rsize, void *stream);

/*
 * Before an allocation asks the daemon for memory the pending frees may hold: records a fence on
 * every stream with frees queued since its last (a stream capturing a graph, or destroyed, gets
 * none), then frees what has completed (client_stream_reap() without waiting). Called by a thread
 * of the application's, never the reaper.
 */
int client_stream_collect(gpupool_client *c);

/*
 * Frees the deferred blocks whose fence has completed, stopping on each stream at the first
 * that has not (or has no fence yet). With wait, waits for all the fenced ones first, and
 * returns -EIO when the driver could not prove that some work ended (those blocks stay
 * pending); 0 otherwise. Frees with no fence stay pending: at disconnect the process's work
 * ends first (cuCtxSynchronize), and they go with the live table.
 */
int client_stream_reap(gpupool_client *c, bool wait);

/* The daemon is gone: drops the pending stream-ordered frees without waiting (their blocks went with it). */
void client_stream_forget(gpupool_client *c);

/* Stops the reaper thread, unlocking while joining it. Locked. */
void client_stream_stop(gpupool_client *c);

#endif
