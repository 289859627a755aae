/*
 * client_segment.h: the segments the handle maps and the table of the live blocks it hands out
 * (client_segment.c). All called locked but the live table's.
 */
#ifndef GP_CLIENT_SEGMENT_H
#define GP_CLIENT_SEGMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client_common.h"

/* The handle's trees of mappings and its live-block table, empty; and their locks' end. */
void client_segments_init(gpupool_client *c);
void client_segments_destroy(gpupool_client *c);

/* The live-block table. Each takes the block's shard lock; callable with or without the handle's. */
int client_live_insert(gpupool_client *c, struct block *b);            /* -EEXIST: its address is live already */
void client_live_remove(gpupool_client *c, struct block *b);
/* Takes the live block at ptr out of the table for freeing; NULL if none. */
struct block *client_live_take(gpupool_client *c, const void *ptr);

/*
 * The live block ptr lies in (its start or inside it): its start and size, as the pool rounded
 * it. -ENOENT for none. Unlocked: each shard's lock in turn.
 */
int client_live_range(gpupool_client *c, const void *ptr, void **ret_base, uint64_t *ret_size);

/*
 * Forgets every live block. The epoch goes first: a block another thread has in hand (taken
 * out of the table, not yet freed) is then seen as stale wherever it lands, and freed there.
 */
void client_live_forget(gpupool_client *c);

/* The mapping of a segment, or NULL; and unmapping one (out of the process's pool, if in it). */
struct mapping *client_mapping_by_id(gpupool_client *c, uint64_t segment_id);
void client_mapping_drop(gpupool_client *c, struct mapping *m);

/*
 * Takes m out of the handle's trees, mapped still: its segment is no longer the process's lease
 * (it became a named object, client_objects.c). The caller unmaps and frees it later.
 */
void client_mapping_unlink(gpupool_client *c, struct mapping *m);

/* Unmaps every mapping (the session is over). */
void client_mappings_forget(gpupool_client *c);

/*
 * Maps a segment the daemon handed over: fd (taken: kept for adoption, or closed) or
 * ipc_handle, as the handle's memory seam takes segments. Returns 0 with the mapping, or a
 * negative errno with the error set.
 */
int client_mapping_add(gpupool_client *c, unsigned device, uint64_t segment_id, uint64_t size,
                       const ProtobufCBinaryData *ipc_handle, int fd, struct mapping **ret);

#endif
