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
 * Records an event on stream after the work queued so far and queues b's free behind it. b is
 * out of the live table; it goes back there marked freeing, where an allocation on the same
 * stream may take it at once (client_pool_alloc()). On error b is untouched (the caller puts
 * it back).
 */
int client_stream_defer_free(gpupool_client *c, struct block *b, void *stream);

/* Frees the deferred blocks whose work is done; with wait, waits for all of them first. */
void client_stream_reap(gpupool_client *c, bool wait);

/* The daemon is gone: drops the pending stream-ordered frees without waiting (their blocks went with it). */
void client_stream_forget(gpupool_client *c);

/* Stops the reaper thread, unlocking while joining it. Locked. */
void client_stream_stop(gpupool_client *c);

#endif
