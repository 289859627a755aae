/*
 * client_pool.h: the process's own pool (client_pool.c): blocks carved from the segments it
 * leases, with the threads' caches in front. All called locked.
 */
#ifndef GP_CLIENT_POOL_H
#define GP_CLIENT_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client_common.h"

/*
 * Allocates a block of rsize (rounded) bytes on daemon device d from the pool, leasing a
 * segment if need be; an allocation on stream (NULL: none, or the legacy one) may carve what
 * is held for its lane (client_stream_lane(); 0: none).
 */
int client_pool_alloc(gpupool_client *c, unsigned d, int device, uint64_t rsize, void *stream, uint32_t lane,
                      void **ret_ptr);

/* Frees a block out of the live table into the pool; its segment stays mapped. */
int client_pool_free(gpupool_client *c, struct block *b);

/* Gives back segments holding no live block on d (-1: all), until want bytes. */
int client_pool_trim(gpupool_client *c, int d, uint64_t want);

/* What the pool holds free in its segments, on every device. */
uint64_t client_pool_free_bytes(gpupool_client *c);

/* Once a second from the control thread: gives back segments empty for the idle time. */
void client_pool_tick(gpupool_client *c, uint64_t now_ms);

/* Empties the threads' caches into the pool: all of them, or (not all) those idle since the last time. */
void client_pool_drain(gpupool_client *c, bool all);

/* Frees a block the application gave up (the device is done with it), out of the live table (client_live_take()), into the process's pool. */
int client_free_unlinked(gpupool_client *c, struct block *b);

#endif
