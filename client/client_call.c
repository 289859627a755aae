/*
 * client_call.c: the handle's requests on its main connection. Every request is one round trip
 * under the handle's lock, one at a time; a request the daemon may park (a lease, a block's
 * granule leases, an adoption) borrows the connection (conn_busy) and lets go of the lock while
 * it is out, so that the control thread answers the daemon's reclaims meanwhile.
 */
#include "client_call.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

/*
 * The calling thread's latest failure that left no handle to keep its sentence in: a refused
 * gpupool_connect(), or a call given no handle. gpupool_last_error(NULL) reads it.
 */
static __thread char thread_error[GP_MAX_ERROR_BYTES];

int client_thread_failed(int err, const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(thread_error, sizeof(thread_error), fmt, ap);
        va_end(ap);
        return err;
}

const char *client_thread_error(void) {
        return thread_error;
}

int client_invalid(gpupool_client *c, const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        if (c) {
                pthread_mutex_lock(&c->lock);
                vsnprintf(c->error, sizeof(c->error), fmt, ap);
                pthread_mutex_unlock(&c->lock);
        } else {
                vsnprintf(thread_error, sizeof(thread_error), fmt, ap);
        }
        va_end(ap);
        return -EINVAL;
}

void client_conn_wait(gpupool_client *c) {
        while (c->conn_busy)
                pthread_cond_wait(&c->conn_idle, &c->lock);
}

void client_conn_take(gpupool_client *c) {
        client_conn_wait(c);
        c->conn_busy = true;
}

void client_conn_give(gpupool_client *c) {
        c->conn_busy = false;
        pthread_cond_broadcast(&c->conn_idle);
        c->round_trips = c->conn.trips;
}

/* After a call on the main connection: what it counted, and why it failed. Locked, the connection ours. */
int client_call_done(gpupool_client *c, int r) {
        c->round_trips = c->conn.trips;
        if (r < 0)
                snprintf(c->error, sizeof(c->error), "%s", c->conn.error);
        return r;
}

int client_call(gpupool_client *c, Gpupool__Envelope *req, Gpupool__Envelope__BodyCase want,
                Gpupool__Envelope **ret_reply, int *ret_fd) {
        client_conn_wait(c);
        return client_call_done(c, gp_conn_call(&c->conn, req, want, ret_reply, ret_fd));
}

int client_call_unlocked(gpupool_client *c, Gpupool__Envelope *req, Gpupool__Envelope__BodyCase want,
                         Gpupool__Envelope **ret_reply, int *fds, size_t max_fds, size_t *ret_nfds) {
        int r;

        client_conn_take(c);
        pthread_mutex_unlock(&c->lock);
        r = gp_conn_call_fds(&c->conn, req, want, ret_reply, fds, max_fds, ret_nfds);
        pthread_mutex_lock(&c->lock);
        client_conn_give(c);
        return client_call_done(c, r);
}
