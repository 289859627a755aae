/*
 * client_call.c: the handle's requests on its main connection. Every request is one round trip
 * under the handle's lock, one at a time; a request the daemon may park (a lease, a block's
 * granule leases, an adoption) borrows the connection (conn_busy) and lets go of the lock while
 * it is out, so that the control thread answers the daemon's reclaims meanwhile.
 */
#include "client_call.h"

#include <stdio.h>

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
