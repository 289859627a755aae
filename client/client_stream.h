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
 * Records an event on stream after the work queued so far and queues b's free behind it. b is
 * out of the live table; it goes back there marked freeing, where an allocation on the same
 * stream may take it at once (client_stream_take()). On error b is untouched (the caller puts
 * it back): -EBUSY for a stream capturing a CUDA graph, -EINVAL for a stream of another
 * context, -ENOMEM, -EIO.
 */
int client_stream_defer_free(gpupool_client *c, struct block *b, void *stream);

/*
 * A block freed on this same stream of daemon device d whose work may still run (the stream
 * orders new work after it), of at least rsize and at most a quarter more: taken out of its
 * stream-ordered free, live again. NULL when there is none.
 */
struct block *client_stream_take(gpupool_client *c, unsigned d, uint64_t rsize, void *stream);

/*
 * Frees the deferred blocks whose work is done, stopping on each stream at the first that is
 * not. With wait, waits for all of them first, and returns -EIO when the driver could not
 * prove that some work ended (those blocks stay pending); 0 otherwise.
 */
int client_stream_reap(gpupool_client *c, bool wait);

/* The daemon is gone: drops the pending stream-ordered frees without waiting (their blocks went with it). */
void client_stream_forget(gpupool_client *c);

/* Stops the reaper thread, unlocking while joining it. Locked. */
void client_stream_stop(gpupool_client *c);

#endif
