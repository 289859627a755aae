/*
 * client_grow.h: segments that grow in place (client_grow.c), the pool's other mode. Per
 * device, the process reserves one virtual range per heap class and the device's heap carves
 * each as one segment; physical granules (2 MiB segments of their own, leased many at a time)
 * are mapped under the blocks as they need them (common/granule.c). All called locked.
 */
#ifndef GP_CLIENT_GROW_H
#define GP_CLIENT_GROW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client_common.h"
#include "granule.h"

/*
 * A block of c->piece_bytes ($GPUPOOL_GROW_PIECE, GROW_PIECE_BYTES by default) or more is a
 * piece instead: a segment leased for it alone, the heap's HEAP_CLASS_PIECE, imported and
 * mapped whole (client_pool.c), so that a block of gigabytes (a KV cache, a model's weights)
 * costs what a whole segment costs, not a lease and an import per granule. Granules and pieces
 * together keep within the budget of granule_plan() over the peak in use.
 */
#define GROW_PIECE_BYTES (4ULL << 30)       /* the default ($GPUPOOL_GROW_PIECE) */
#define GROW_PIECE_MIN_BYTES (64ULL << 20)  /* the least it may be: a piece is a lease and an import of its own */

/*
 * How many bytes what device d holds (granules and pieces) and more would take past the budget
 * over its peak in use (that and in_use_more counted in): 0 within it.
 */
uint64_t client_grow_over(gpupool_client *c, unsigned d, uint64_t more, uint64_t in_use_more);

/* Sets up device d's ranges and adds them to its heap, the first time. Returns 0 or a negative errno, the error set. */
int client_grow_start(gpupool_client *c, unsigned d);

/*
 * What a block of the device's heap is to lease (granule_plan(), over the most its blocks held
 * since granules last went back, and asking for no more than it must after
 * client_grow_wanted(false) until granules go back). Returns the granules to ask for in all
 * (0: it has what it needs), as p says them.
 */
uint64_t client_grow_plan(gpupool_client *c, const struct heap_block *hb, struct granule_plan *p);

/* After a lease that asked device d for granules wanted beyond what a block must have: whether they came. */
void client_grow_wanted(gpupool_client *c, unsigned d, bool all_came);

/*
 * Takes n granules the daemon leased on d (their segment ids, and their descriptors, closed
 * here either way) as spares: maps each at a parking spot of its own (host) or imports it
 * (cuda-vmm). Returns 0, or a negative errno with the error set and none of them taken (the
 * daemon is to have them all back).
 */
int client_grow_adopt(gpupool_client *c, unsigned d, const uint64_t *ids, const int *fds, size_t n);

/* Whether segment id is a granule this process holds, of any device. */
bool client_grow_holds(gpupool_client *c, uint64_t id);

/* How device d's heap weighs where a block of rsize bytes lands in its ranges (granule_choice()). */
void client_grow_choice(gpupool_client *c, unsigned d, uint64_t rsize, struct heap_choice *choice);

/* Maps what a block lacks under it (granule_take(); nothing to obtain). Returns 0 or a negative errno, the error set. */
int client_grow_take(gpupool_client *c, struct heap_block *hb);

/* As the block at [offset, offset + size) of segment s is freed: its granules no other block touches become idle. */
void client_grow_give(gpupool_client *c, struct heap_segment *s, uint64_t offset, uint64_t size);

/*
 * Takes granules no live block touches out of device d (-1: all), spares first, then idle
 * granules idle since before_ms, until want bytes or max: unmaps them and fills ids (to be
 * returned, or named in a reclaim answer). Returns how many; *ret_bytes their bytes.
 */
size_t client_grow_take_free(gpupool_client *c, int d, uint64_t want, uint64_t before_ms, uint64_t *ids, size_t max,
                             uint64_t *ret_bytes);

/* Takes up to max spares (granules mapped nowhere) out of device d, their ids into ids. Returns how many. */
size_t client_grow_take_spares(gpupool_client *c, unsigned d, uint64_t *ids, size_t max);

/* Device d's granules, up to max, for a new daemon to adopt (client_resume()). Returns how many (client_grow_held() at most). */
size_t client_grow_kept(gpupool_client *c, unsigned d, struct client_kept *out, size_t max);

/* Puts device d's granules into their index by id (in) or takes them out, for the adoption to rename them. */
void client_grow_index(gpupool_client *c, unsigned d, bool in);

/* gpupool_grow_stats(): the granules held and free on every device, and the maps and unmaps since connect. */
void client_grow_stats(gpupool_client *c, struct gpupool_grow_stats *st);

/* Granules held on d. */
uint64_t client_grow_held(gpupool_client *c, unsigned d);

/* Bytes mapped on d: its granules and its pieces; and of them, those no live block touches. */
uint64_t client_grow_mapped(gpupool_client *c, unsigned d);
uint64_t client_grow_free_bytes(gpupool_client *c, unsigned d);

/* Unmaps and forgets everything of every device (the session is over), its blocks with it. */
void client_grow_forget(gpupool_client *c);

#endif
