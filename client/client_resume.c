/*
 * client_resume.c: a handle's session with the daemon that came back. On the host and cuda-vmm
 * backends a process's memory outlives gpupoold (a memfd lives while it is mapped, cuMemCreate
 * memory while a handle or a mapping of it is held). Once a daemon listens again, the control
 * thread says hello to it and tells it every segment the process holds (AdoptRequest, 128 at a
 * time): on the host backend with each segment's descriptor, which the process kept
 * (client_fd_keep()); on cuda-vmm by the process's word (held), as the driver exports no
 * imported memory. Each the daemon adopts is leased to the process again, under a new id; one
 * it refuses (a limit, the capacity) stays the process's own (CLIENT_ORPHAN), given back to
 * nobody once it empties. Blocks, data and addresses never change: only the ids under them.
 */
#include "client_resume.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_call.h"
#include "client_grow.h"
#include "client_objects.h"
#include "client_mem.h"
#include "client_segment.h"

/* Ids for segments no daemon knows: unique in the process, never a daemon's. */
static uint64_t next_orphan;

/*
 * The next orphan's id. Atomic: each handle adopts under its own lock, so two handles of one
 * process may take ids at once.
 */
static uint64_t orphan_id(void) {
        return CLIENT_ORPHAN | __atomic_add_fetch(&next_orphan, 1, __ATOMIC_RELAXED);
}

/*
 * Asks the daemon to adopt n kept segments of device d (n at most 128), with their descriptors
 * or (held) by the process's word, and gives each its new id, or an orphan's where it was
 * refused, to take once the adoption is over (renamed). The lock is let go while the request is
 * out (adopt_all() holds the connection). Returns 0, or a negative errno when the daemon could
 * not be asked (the ids are left as they were).
 */
static int adopt_batch(gpupool_client *c, unsigned d, struct client_kept **k, size_t n, bool held) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep = NULL;
        Gpupool__AdoptRequest ar = GPUPOOL__ADOPT_REQUEST__INIT;
        uint64_t sizes[GP_MAX_LEASE_GRANULES];
        int fds[GP_MAX_LEASE_GRANULES];
        size_t adopted = 0;
        int r;

        for (size_t i = 0; i < n; i++) {
                sizes[i] = k[i]->size;
                fds[i] = k[i]->fd;
        }
        ar.device = d;
        ar.sizes = sizes;
        ar.n_sizes = n;
        ar.has_held = held;
        ar.held = held;
        req.body_case = GPUPOOL__ENVELOPE__BODY_ADOPT;
        req.adopt = &ar;
        pthread_mutex_unlock(&c->lock);
        r = gp_conn_call_passing(&c->conn, &req, fds, held ? 0 : n, GPUPOOL__ENVELOPE__BODY_ADOPT_REPLY, &rep);
        pthread_mutex_lock(&c->lock);
        if (r < 0 && c->conn.broken)
                return client_call_done(c, r);
        if (r == 0) {
                adopted = rep->adopt_reply->n_segment_ids < n ? rep->adopt_reply->n_segment_ids : n;
                for (size_t i = 0; i < adopted; i++)
                        k[i]->renamed = rep->adopt_reply->segment_ids[i];
                if (adopted < n)
                        client_set_error(c, "gpupoold adopted %zu of %zu segments of device %u this process held: %s",
                                         adopted, n, d, rep->adopt_reply->refused_error ? rep->adopt_reply->refused_error :
                                                        "(no reason given)");
                gpupool__envelope__free_unpacked(rep, NULL);
        } else {
                /* Refused whole (a descriptor the daemon would not take): none of these is its. */
                client_set_error(c, "gpupoold adopted none of %zu segments of device %u this process held: %s", n, d,
                                 c->conn.error);
        }
        for (size_t i = adopted; i < n; i++)
                k[i]->renamed = orphan_id();
        return 0;
}

/*
 * The memory outside the pool the process charged (gpupool_charge()), charged to this daemon:
 * where it will not count a device's (a limit), the process keeps it uncounted, as a refused
 * adoption. The lock is let go while each request is out (adopt_all() holds the connection).
 * Returns 0, or a negative errno when the daemon could not be asked.
 */
static int charge_all(gpupool_client *c) {
        for (unsigned d = 0; d < c->device_count; d++) {
                Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep = NULL;
                Gpupool__ChargeRequest cr = GPUPOOL__CHARGE_REQUEST__INIT;
                uint64_t bytes = c->devices[d].charged;
                int r;

                c->devices[d].charge_counted = 0;
                if (!bytes)
                        continue;
                cr.device = d;
                cr.bytes = bytes;
                req.body_case = GPUPOOL__ENVELOPE__BODY_CHARGE;
                req.charge = &cr;
                pthread_mutex_unlock(&c->lock);
                r = gp_conn_call(&c->conn, &req, GPUPOOL__ENVELOPE__BODY_CHARGE_REPLY, &rep, NULL);
                pthread_mutex_lock(&c->lock);
                if (r < 0 && c->conn.broken)
                        return client_call_done(c, r);
                if (r == 0)
                        c->devices[d].charge_counted = bytes < c->devices[d].charged ? bytes : c->devices[d].charged;
                else
                        client_set_error(c, "gpupoold does not count the %" PRIu64 " bytes of device %u this process "
                                         "allocated outside the pool: %s", bytes, d, c->conn.error);
                if (rep)
                        gpupool__envelope__free_unpacked(rep, NULL);
        }
        return 0;
}

/*
 * Has the daemon adopt every segment of device d in k (n of them): each with its kept
 * descriptor (host; one without is an orphan at once), or every one by the process's word
 * where the memory seam says so (cuda-vmm).
 */
static int adopt_device(gpupool_client *c, unsigned d, struct client_kept *k, size_t n) {
        struct client_kept *batch[GP_MAX_LEASE_GRANULES];
        bool held = c->mem->adopted_held;
        size_t b = 0;
        int r = 0;

        for (size_t i = 0; i < n && r == 0; i++) {
                if (!held && k[i].fd < 0) {
                        k[i].renamed = orphan_id();
                        continue;
                }
                batch[b++] = &k[i];
                if (b == GP_MAX_LEASE_GRANULES) {
                        r = adopt_batch(c, d, batch, b, held);
                        b = 0;
                }
        }
        if (r == 0 && b)
                r = adopt_batch(c, d, batch, b, held);
        return r;
}

/*
 * Every segment the process holds, each device's adopted in turn, then all renamed at once,
 * out of their indexes by id (an old id may be a new one's too). The connection is this
 * thread's throughout (client_conn_take()), and the lock is let go while each request is out, so that
 * the application's threads allocate and free in what the process holds meanwhile, the
 * indexes as they were. Nothing the list names can go away in between: segments leave the
 * process only to be given back, which waits for the connection before it takes any
 * (client_return_empty(); the control thread's own returns are this thread's).
 */
static int adopt_all(gpupool_client *c) {
        size_t whole = c->by_id.count, n = 0, m = 0, at = 0, first[CLIENT_MAX_DEVICES + 1];
        struct mapping **maps = NULL;
        struct client_kept *k;
        int r = 0;

        for (unsigned d = 0; d < c->device_count; d++)
                n += client_grow_held(c, d);
        k = calloc(n + whole + 1, sizeof(*k));
        maps = calloc(whole + 1, sizeof(*maps));
        if (!k || !maps) {
                free(k);
                free(maps);
                client_set_error(c, "out of memory listing the segments for gpupoold to adopt");
                return -ENOMEM;
        }
        for (struct gp_rb_node *x = gp_rb_first(&c->by_id); x; x = gp_rb_next(x))
                maps[m++] = gp_rb_entry(x, struct mapping, by_id);
        /* Each device's, in k from first[d] to first[d + 1]. */
        for (unsigned d = 0; d < c->device_count; d++) {
                first[d] = at;
                at += client_grow_kept(c, d, k + at, n + whole - at);
                for (size_t i = 0; i < whole; i++)
                        if (maps[i]->device == d && !maps[i]->sealed)
                                k[at++] = (struct client_kept) { .id = &maps[i]->segment_id, .fd = maps[i]->fd,
                                                                 .size = maps[i]->size, .renamed = maps[i]->segment_id };
                first[d + 1] = at;
        }
        client_conn_take(c);
        for (unsigned d = 0; d < c->device_count && r == 0; d++)
                r = adopt_device(c, d, k + first[d], first[d + 1] - first[d]);
        if (r == 0)
                r = charge_all(c);
        client_conn_give(c);
        for (size_t i = 0; i < whole; i++)
                gp_rb_remove(&c->by_id, &maps[i]->by_id);
        for (unsigned d = 0; d < c->device_count; d++)
                client_grow_index(c, d, false);
        for (size_t i = 0; i < first[c->device_count]; i++)
                *k[i].id = k[i].renamed;
        /* A segment sealed by a lost publish is offered to no daemon: the process's own from now on. */
        for (size_t i = 0; i < whole; i++)
                if (maps[i]->sealed)
                        maps[i]->segment_id = orphan_id();
        for (unsigned d = 0; d < c->device_count; d++)
                client_grow_index(c, d, true);
        for (size_t i = 0; i < whole; i++)
                (void) gp_rb_insert(&c->by_id, &maps[i]->by_id);
        free(k);
        free(maps);
        return r;
}

int client_resume_hello(const gpupool_client *c, struct gp_conn *conn, Gpupool__Envelope **ret_hello) {
        Gpupool__Hello hello_req = GPUPOOL__HELLO__INIT;

        *conn = (struct gp_conn) { .sock = -1 };
        hello_req.name = (char *) c->name;
        hello_req.reservation = c->reservation[0] ? (char *) c->reservation : NULL;
        return gp_conn_open(conn, client_socket_path(c), &hello_req, ret_hello);
}

int client_resume(gpupool_client *c, struct gp_conn *conn, Gpupool__Envelope *hello, struct gp_conn **ret_control) {
        Gpupool__Hello control_hello = GPUPOOL__HELLO__INIT;
        Gpupool__HelloReply *hr = hello->hello_reply;
        uint64_t client_id, calls = c->conn.calls, trips = c->conn.trips;
        struct gp_conn *control;
        bool same;
        int r;

        /* The handle closing, or its main connection lent out, while the hello was out: not now. */
        if (c->control.stopping || c->conn_busy) {
                gpupool__envelope__free_unpacked(hello, NULL);
                gp_conn_close(conn);
                return -ECANCELED;
        }
        gp_conn_close(&c->conn);
        c->conn = *conn;
        client_objects_daemon_changed(c);       /* the objects it has attached: the new daemon may not know them */
        c->conn.calls += calls;         /* the handle's requests and round trips count on */
        c->conn.trips += trips;
        /* The memory held is adoptable by a daemon of the same kind only, with the same devices (GPUs: by UUID). */
        same = hr->n_devices == c->device_count;
        for (size_t d = 0; same && d < hr->n_devices; d++)
                same = strcmp(hr->devices[d]->backend, c->mem->backend) == 0;
        if (same && c->mem->driver)
                same = c->mem->driver->same_devices(c, hr);
        client_id = hr->client_id;
        gpupool__envelope__free_unpacked(hello, NULL);
        /* The next lease says so (daemon_gone_error()); the thread tries again, for a daemon after this one. */
        c->resume_refused = !same;
        if (!same) {
                gp_conn_give_up(&c->conn, -ECONNRESET);
                return -ECONNRESET;
        }
        if ((r = adopt_all(c)) < 0)
                return r;
        client_objects_resume(c);
        control = calloc(1, sizeof(*control));
        if (!control)
                return -ENOMEM;
        control_hello.name = c->name;
        control_hello.has_control_for = 1;
        control_hello.control_for = client_id;
        if ((r = gp_conn_open(control, client_socket_path(c), &control_hello, NULL)) < 0) {
                client_set_error(c, "%s", control->error);
                free(control);
                return r;
        }
        /* The new daemon has heard nothing of what the process holds: the next tick reports it. */
        for (unsigned d = 0; d < c->device_count; d++)
                c->devices[d].reported_in_use = c->devices[d].reported_held_free = UINT64_MAX;
        *ret_control = control;
        return 0;
}
