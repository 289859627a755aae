/*
 * client_segment.h: the handle's lowest layer (client_segment.c): its calls to the daemon on the
 * main connection, the segments it maps, and the table of the live blocks it hands out. All
 * called locked but the live table's.
 */
#ifndef GP_CLIENT_SEGMENT_H
#define GP_CLIENT_SEGMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client.h"

/* The handle's trees of mappings and its live-block table, empty; and their locks' end. */
void client_segments_init(gpupool_client *c);
void client_segments_destroy(gpupool_client *c);

/* Waits (letting go of the lock meanwhile) until no lease has the main connection out. Locked. */
void client_conn_wait(gpupool_client *c);

/*
 * Lends the main connection to this thread (conn_busy), once no other has it, so that it may
 * let go of the lock while its requests are out; client_conn_give() ends the loan, counting
 * the round trips. Locked.
 */
void client_conn_take(gpupool_client *c);
void client_conn_give(gpupool_client *c);

/* gp_conn_call() on the main connection, once no lease has it out; its error into c->error. Locked. */
int client_call(gpupool_client *c, Gpupool__Envelope *req, Gpupool__Envelope__BodyCase want,
                Gpupool__Envelope **ret_reply, int *ret_fd);

/* After a call on the main connection: what it counted, and why it failed (returns r). Locked, the connection ours. */
int client_call_done(gpupool_client *c, int r);

/*
 * The same, letting go of the lock while the request is out, for a request the daemon may park
 * until other processes give memory back (a lease): this process's control thread must
 * meanwhile be able to answer the daemon's own reclaim requests, or two such processes wait on
 * each other. The reply may carry up to max_fds descriptors (gp_conn_call_fds()). Locked on
 * entry and on return; anything read before may have changed (but the session: reconnect and
 * disconnect wait for the connection).
 */
int client_call_unlocked(gpupool_client *c, Gpupool__Envelope *req, Gpupool__Envelope__BodyCase want,
                         Gpupool__Envelope **ret_reply, int *fds, size_t max_fds, size_t *ret_nfds);

/* The live-block table. Each takes the block's shard lock; callable with or without the handle's. */
int client_live_insert(gpupool_client *c, struct block *b);            /* -EEXIST: its address is live already */
void client_live_remove(gpupool_client *c, struct block *b);
/* Takes the live block at ptr out of the table for freeing; NULL if none (or being freed already). */
struct block *client_live_take(gpupool_client *c, const void *ptr);

/*
 * Forgets every live block. The epoch goes first: a block another thread has in hand (taken
 * out of the table, not yet freed) is then seen as stale wherever it lands, and freed there.
 */
void client_live_forget(gpupool_client *c);

/* The mapping of a segment, or NULL; and unmapping one (out of the process's pool, if in it). */
struct mapping *client_mapping_by_id(gpupool_client *c, uint64_t segment_id);
void client_mapping_drop(gpupool_client *c, struct mapping *m);

/* Unmaps every mapping (the session is over). */
void client_mappings_forget(gpupool_client *c);

/*
 * Maps a segment the daemon handed over: fd (host backend; taken, closed on failure too) or
 * ipc_handle (cuda). Returns 0 with the mapping, or a negative errno with the error set.
 */
int client_mapping_add(gpupool_client *c, unsigned device, uint64_t segment_id, uint64_t size,
                       const ProtobufCBinaryData *ipc_handle, int fd, struct mapping **ret);

/* CLOCK_MONOTONIC in milliseconds. */
uint64_t client_now_ms(void);

/*
 * Keeps a host segment's descriptor, which a daemon after this one adopts (client_resume()):
 * the process's soft RLIMIT_NOFILE is raised to its hard limit once, kept descriptors sit at
 * 1024 and above where that allows (out of select()'s sight), and at most the limit less 2048
 * are kept, leaving the application its room. A forked child closes them all at once
 * (pthread_atfork): it must not hold the memory alive. Returns the descriptor kept, or -1 (fd
 * closed, the segment then unadoptable) beyond that. client_fd_release() closes one (-1: none;
 * nothing where a fork closed it).
 */
int client_fd_keep(int fd);
void client_fd_release(int fd);

/*
 * Whether fd (host backend) is memory of at least size bytes: a file (a memfd) that long. A
 * shorter one would map, and raise SIGBUS where the application touches what is not there.
 */
bool client_fd_is_memory(int fd, uint64_t size);

/*
 * Grows the process's descriptor table once, with room to keep n descriptors more (at most
 * what client_fd_keep() would keep, and 64K slots in all): the kernel grows the table by
 * doubling as descriptors arrive, and in a process with threads each doubling waits for an RCU
 * grace period (milliseconds). Called before the handle's control thread starts, where an
 * application with one thread pays no wait at all. fd: any open descriptor, to duplicate.
 */
void client_fd_room(int fd, uint64_t n);

#endif
