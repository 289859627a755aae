/*
 * client_tcache.h: each thread's cache of the small blocks it freed (client_tcache.c). The fast
 * path (take and put) runs without the handle's lock; the rest is called locked.
 */
#ifndef GP_CLIENT_TCACHE_H
#define GP_CLIENT_TCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client_common.h"

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

/*
 * Empties caches, each block into to_pool (the pool's free): every one (all), or those not
 * used since the last drain and those whose thread exited, which then go. Locked.
 */
void client_tcache_drain(gpupool_client *c, bool all, int (*to_pool)(gpupool_client *c, struct block *b));

/* Forgets what the caches hold (the session is over: the pool forgets its blocks). Locked. */
void client_tcache_forget(gpupool_client *c);

/* At disconnect, after client_tcache_forget(): the handle lets go of every cache. Locked. */
void client_tcache_detach(gpupool_client *c);

/* What the caches hold, per daemon device (an array of CLIENT_MAX_DEVICES, or NULL) and in all (or NULL). Locked. */
void client_tcache_bytes(gpupool_client *c, uint64_t *per_device, uint64_t *ret_total);

#endif
