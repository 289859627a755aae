/*
 * client_return.h: what the process tells gpupoold it holds, and what it gives back
 * (client_return.c). All called locked.
 */
#ifndef GP_CLIENT_RETURN_H
#define GP_CLIENT_RETURN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client_common.h"

/*
 * What the process holds per device where it leases anything, or leased anything when it last
 * reported, for a request's envelope; remembered as reported. Returns how many.
 */
size_t client_usage(gpupool_client *c, Gpupool__Usage *u, Gpupool__Usage **ptrs);

/* Whether what the process holds changed since it last reported. */
bool client_usage_changed(gpupool_client *c);

/*
 * Takes segments holding no live block out of the pool, on daemon device d (-1: all), oldest
 * emptied first and emptied at or before before_ms, until want bytes or max: unmaps them and
 * fills ids (to be returned, or named in a reclaim answer). Returns how many; *ret_bytes (if
 * given) their bytes.
 */
size_t client_take_empty(gpupool_client *c, int d, uint64_t want, uint64_t before_ms, uint64_t *ids, size_t max,
                         uint64_t *ret_bytes);

/*
 * Segments that grow in place: the empty pieces of device d (-1: all) as client_take_empty()
 * takes segments, but the largest first where largest (else the oldest emptied first).
 */
size_t client_take_pieces(gpupool_client *c, int d, uint64_t want, uint64_t before_ms, bool largest, uint64_t *ids,
                          size_t max, uint64_t *ret_bytes);

/*
 * Tells the daemon these n segments, unmapped, are back: a ReturnRequest per
 * CLIENT_RETURN_BATCH, sent back to back (CLIENT_PIPELINE unanswered at most), the usage with
 * the last. After a failure the rest still go and every reply is read. Returns 0, or the first
 * failure's negative errno with the error set.
 */
int client_return(gpupool_client *c, const uint64_t *ids, size_t n);

/*
 * What client_return_taken() gives back: up to max ids taken out of the pool (unmapped), and
 * their bytes into *ret_bytes, until want bytes. Fewer than max when nothing more is to go.
 */
typedef size_t (*client_take_fn)(gpupool_client *c, const void *arg, uint64_t want, uint64_t *ids, size_t max,
                                 uint64_t *ret_bytes);

/*
 * Gives back what take takes, until want bytes: CLIENT_PIPELINE requests' worth of ids at a
 * time, one round trip each (client_return()), or, without memory for that,
 * CLIENT_RETURN_BATCH. Returns 0 or the first failure, the error set. The lock is kept.
 */
int client_return_taken(gpupool_client *c, client_take_fn take, const void *arg, uint64_t want);

/*
 * Gives back empty segments on device d (-1: all), emptied at or before before_ms, until want
 * bytes (client_take_empty(), client_return_taken()), once the connection is free; -ECONNRESET
 * with the daemon gone.
 */
int client_return_empty(gpupool_client *c, int d, uint64_t want, uint64_t before_ms);

/*
 * Segments that grow in place: gives back empty pieces of device d, the largest first, or
 * granules no block touches there, until want bytes, as client_return_empty() does.
 */
int client_return_pieces(gpupool_client *c, unsigned d, uint64_t want);
int client_return_granules(gpupool_client *c, unsigned d, uint64_t want);

/* Segment ids gathered to give back once the connection is free again (client_returns_send()). */
struct client_returns {
        uint64_t *ids;
        size_t n, cap;
        size_t lost;            /* ids there was no memory to remember */
};

/* Adds id (counted in lost when there is no memory for it). */
void client_returns_add(struct client_returns *b, uint64_t id);

/* Gives the ids back (the connection free) and frees them; c->error stays what it was, lost ids said. */
void client_returns_send(gpupool_client *c, struct client_returns *b);

#endif
