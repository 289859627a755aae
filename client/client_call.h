/*
 * client_call.h: the handle's requests on its main connection (client_call.c). All called
 * locked.
 */
#ifndef GP_CLIENT_CALL_H
#define GP_CLIENT_CALL_H

#include <stddef.h>

#include "client_common.h"

/* Waits (letting go of the lock meanwhile) until no lease has the main connection out. Locked. */
/*
 * Fails with err, keeping why for gpupool_last_error(NULL): for failures that leave no handle
 * (a refused gpupool_connect(), a call given none). client_thread_error() is the latest.
 */
int client_thread_failed(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *client_thread_error(void);

/*
 * Fails a call of the API for a bad argument: returns -EINVAL, saying why in c's error (taking
 * its lock: call it unlocked), or with c NULL in the thread's (gpupool_last_error(NULL)).
 */
int client_invalid(gpupool_client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

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

#endif
