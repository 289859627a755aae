/*
 * client_control.c: the control channel and its thread. The daemon pushes its requests for
 * memory back on a second connection of the process (Hello.control_for), and this thread
 * answers each at once, whatever the application's threads are doing; once a second it also
 * gives back the segments that have been empty for the idle time and tells the daemon what the
 * process holds if that changed (UsageReport).
 */
#include "client_control.h"

#include <errno.h>
#include <poll.h>
#include <semaphore.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "client_call.h"
#include "client_mem.h"
#include "client_pool.h"
#include "client_resume.h"
#include "client_return.h"
#include "client_segment.h"
#include "client_stream.h"
#include "size.h"

/* Sends env (its body set) on the control channel, where nothing answers. Returns 0 or -1. */
static int control_send(gpupool_client *c, Gpupool__Envelope *env) {
        uint8_t out[GP_MAX_REQUEST_BYTES];
        int n;

        env->version = GP_PROTOCOL_VERSION;
        n = gp_wire_pack(env, out, sizeof(out));
        return n < 0 || gp_wire_send_packet(c->control.conn->sock, out, (size_t) n, -1) < 0 ? -1 : 0;
}

/*
 * The control thread: waits for the daemon's reclaim requests on the control channel and
 * answers each at once, whatever the application is doing: it unmaps empty segments on the
 * device asked, worth the bytes asked, and says which, with what the process holds now.
 */
/*
 * How long the control thread waits, before it answers, for a framework to free what its own
 * cache holds (gpupool_release_wait()) and for that work to end: within half the daemon's
 * default reclaim_timeout (100 ms), the time those asked first have before others are asked.
 */
#define RELEASE_WAIT_MS 40

/*
 * Asks the framework's thread waiting in gpupool_release_wait() to free what its cache holds
 * unused, waits (the lock let go) until it has said it is done or RELEASE_WAIT_MS have passed,
 * and until then takes the segments on device (-1: all) its frees emptied, as their work ends
 * (a framework frees stream-ordered: each look fences them first), up to want bytes. A framework
 * that comes later still frees: what that empties goes back at the idle time, or at the next
 * request. Adds the segments' ids to ids[*n, max), their bytes to *got. Locked.
 */
static void release_framework(gpupool_client *c, int device, uint64_t want, uint64_t *ids, size_t *n, size_t max,
                              uint64_t *got) {
        uint64_t seq = c->release.done_seq, more;
        struct timespec at, step;

        gp_deadline_after_ms(RELEASE_WAIT_MS, &at);
        c->release.asked = true;
        pthread_cond_broadcast(&c->release.cond);
        while (c->release.done_seq == seq && !c->release.closing &&
               pthread_cond_timedwait(&c->release.cond, &c->lock, &at) != ETIMEDOUT)
                ;
        for (;;) {
                client_pool_drain(c, true);
                if (client_stream_pending(c))
                        (void) client_stream_collect(c, 1);
                *n += client_take_empty(c, device, want - *got, UINT64_MAX, ids + *n, max - *n, &more);
                *got += more;
                if (*got >= want || *n == max || !client_stream_pending(c))
                        break;
                /* Their fences have not completed yet: look again in a millisecond, until the deadline. */
                gp_deadline_after_ms(1, &step);
                if (step.tv_sec > at.tv_sec || (step.tv_sec == at.tv_sec && step.tv_nsec >= at.tv_nsec))
                        break;
                (void) pthread_cond_timedwait(&c->release.cond, &c->lock, &step);
        }
}

/* What client_control_open() hands the thread: the handle, and the semaphore it posts once it runs. */
struct control_start {
        gpupool_client *client;
        sem_t running;
};

static void serve(gpupool_client *c);
static bool wait_for_daemon(gpupool_client *c);

static void *control_main(void *arg) {
        struct control_start *start = arg;
        gpupool_client *c = start->client;

        sem_post(&start->running);     /* start is the opener's, gone once it wakes */
        do
                serve(c);
        while (wait_for_daemon(c));
        return NULL;
}

/* Serves the control channel until it closes: disconnect shut it, or the daemon is gone. */
static void serve(gpupool_client *c) {
        uint8_t buf[GP_MAX_REPLY_BYTES];

        for (;;) {
                Gpupool__Envelope *push, answer = GPUPOOL__ENVELOPE__INIT;
                Gpupool__ReclaimReply rr = GPUPOOL__RECLAIM_REPLY__INIT;
                Gpupool__UsageReport report = GPUPOOL__USAGE_REPORT__INIT;
                Gpupool__Usage usage[CLIENT_MAX_DEVICES], *usage_ptrs[CLIENT_MAX_DEVICES];
                uint64_t ids[CLIENT_RETURN_BATCH], want, got;
                struct pollfd pfd = { .fd = c->control.conn->sock, .events = POLLIN };
                int n, device;

                /* A tick a second when nothing comes (poll's timeout: a receive timeout did not always fire under valgrind). */
                n = poll(&pfd, 1, 1000);
                if (n < 0 && errno == EINTR)
                        continue;
                n = n == 0 ? -EAGAIN : gp_wire_recv_packet(c->control.conn->sock, buf, sizeof(buf), NULL);
                if (n == -EAGAIN || n == -EWOULDBLOCK) {
                        pthread_mutex_lock(&c->lock);
                        /* Never wait on a lease that is out: the daemon may be waiting on this thread. */
                        if (!c->conn_busy)
                                client_pool_tick(c, client_now_ms());
                        /* What the process holds changed since it last said: tell the daemon, which asks no reply. */
                        if (client_usage_changed(c)) {
                                answer.n_usage = client_usage(c, usage, usage_ptrs);
                                answer.usage = usage_ptrs;
                                answer.body_case = GPUPOOL__ENVELOPE__BODY_USAGE_REPORT;
                                answer.usage_report = &report;
                        }
                        pthread_mutex_unlock(&c->lock);
                        if (answer.n_usage && control_send(c, &answer) < 0)
                                break;
                        continue;
                }
                if (n <= 0 || gp_wire_unpack(buf, (size_t) n, &push) < 0)
                        break;
                if (push->body_case != GPUPOOL__ENVELOPE__BODY_RECLAIM) {
                        gpupool__envelope__free_unpacked(push, NULL);
                        continue;
                }
                /* Segments holding no live block, on the device asked (all without one), worth the bytes asked. */
                device = push->reclaim->has_device ? (int) push->reclaim->device : -1;
                want = push->reclaim->has_bytes ? push->reclaim->bytes : UINT64_MAX;
                pthread_mutex_lock(&c->lock);
                client_pool_drain(c, true);     /* a parked block may be all that keeps a segment */
                if (client_stream_pending(c))
                        (void) client_stream_collect(c, 1);        /* and blocks held for their streams */
                rr.n_segment_ids = client_take_empty(c, device, want, UINT64_MAX, ids, CLIENT_RETURN_BATCH, &got);
                /*
                 * A framework's cache may hold what is asked: its thread frees it, unless a lease is
                 * out (the framework may hold its own lock while it waits on that lease).
                 */
                if (got < want && rr.n_segment_ids < CLIENT_RETURN_BATCH && c->release.waiters && !c->conn_busy)
                        release_framework(c, device, want, ids, &rr.n_segment_ids, CLIENT_RETURN_BATCH, &got);
                /*
                 * More than one answer names: the rest goes back on the main connection first,
                 * unless a lease has it out: then this answer is all the asker gets.
                 */
                if (rr.n_segment_ids == CLIENT_RETURN_BATCH && got < want && !c->conn_busy)
                        (void) client_pool_trim(c, device, want - got);
                answer.n_usage = client_usage(c, usage, usage_ptrs);
                answer.usage = usage_ptrs;
                pthread_mutex_unlock(&c->lock);
                gpupool__envelope__free_unpacked(push, NULL);
                rr.segment_ids = ids;
                answer.body_case = GPUPOOL__ENVELOPE__BODY_RECLAIM_REPLY;
                answer.reclaim_reply = &rr;
                if (control_send(c, &answer) < 0)
                        break;
        }
        /*
         * Disconnect shut the channel, or the daemon is gone: then on the cuda backend what
         * this process leases is no longer its own (it died with the daemon's context), and
         * the pool hands none of it out; elsewhere it goes on serving what it holds.
         */
        __atomic_store_n(&c->daemon_gone, true, __ATOMIC_RELEASE);
}

/* How long the control thread waits between tries to reach a daemon that came back: doubling from the first to the last. */
#define RESUME_FIRST_MS 100
#define RESUME_LAST_MS 1000

/*
 * With the daemon gone (host and cuda-vmm backends), tries to reach the one that comes back, as
 * systemd restarts it (the hello unlocked, client_resume_hello()), and has it adopt what the
 * process holds (client_resume(), locked): then the
 * channel is the new session's and the thread serves it again (true). False once the handle
 * closes the channel, and at once on the legacy cuda backend (its memory went with the daemon:
 * gpupool_reconnect() starts anew).
 */
static bool wait_for_daemon(gpupool_client *c) {
        uint64_t wait_ms = RESUME_FIRST_MS;
        bool resumed = false;

        pthread_mutex_lock(&c->lock);
        while (!c->control.stopping && client_memory_outlives_daemon(c) && !resumed) {
                struct gp_conn *control, *fresh;
                Gpupool__Envelope *hello;
                struct timespec at;
                int r;

                gp_deadline_after_ms(wait_ms, &at);
                (void) pthread_cond_timedwait(&c->control.wake, &c->lock, &at);
                if (c->control.stopping || c->conn_busy || !(fresh = malloc(sizeof(*fresh))))
                        continue;
                /* The hello without the lock: a daemon still starting must not stop the application's threads. */
                pthread_mutex_unlock(&c->lock);
                r = client_resume_hello(c, fresh, &hello);
                pthread_mutex_lock(&c->lock);
                if (r == 0)
                        r = client_resume(c, fresh, hello, &control);
                free(fresh);
                /*
                 * The handle closed the channel while the adoption was out (it lets go of the
                 * lock for each request): the channel just opened is not served, or nothing
                 * would shut it and client_control_close() would wait for this thread forever.
                 * The main connection stays the new daemon's, for the closer to say bye on.
                 */
                if (r == 0 && c->control.stopping) {
                        gp_conn_close(control);
                        free(control);
                        __atomic_store_n(&c->daemon_gone, false, __ATOMIC_RELEASE);
                        break;
                }
                if (r == 0) {
                        gp_conn_close(c->control.conn);
                        free(c->control.conn);
                        c->control.conn = control;
                        __atomic_store_n(&c->daemon_gone, false, __ATOMIC_RELEASE);
                        resumed = true;
                }
                wait_ms = wait_ms * 2 < RESUME_LAST_MS ? wait_ms * 2 : RESUME_LAST_MS;
        }
        pthread_mutex_unlock(&c->lock);
        return resumed;
}

int client_control_open(gpupool_client *c, const char *socket_path, const char *name, uint64_t id) {
        Gpupool__Hello hello = GPUPOOL__HELLO__INIT;
        struct control_start start = { .client = c };
        int r;

        c->control.conn = calloc(1, sizeof(*c->control.conn));
        if (!c->control.conn)
                return -ENOMEM;
        __atomic_store_n(&c->daemon_gone, false, __ATOMIC_RELEASE);
        c->control.stopping = false;
        hello.name = (char *) name;
        hello.has_control_for = 1;
        hello.control_for = id;
        r = gp_conn_open(c->control.conn, socket_path, &hello, NULL);
        sem_init(&start.running, 0, 0);
        if (r == 0 && pthread_create(&c->control.thread, NULL, control_main, &start) != 0) {
                gp_conn_close(c->control.conn);
                r = -EAGAIN;
        }
        /*
         * Returns once the thread runs: a thread still starting up may hold the allocator's
         * locks (a sanitizer's do not follow fork), and a fork then would leave them held in
         * the child.
         */
        if (r == 0)
                while (sem_wait(&start.running) < 0 && errno == EINTR)
                        ;
        sem_destroy(&start.running);
        if (r < 0) {
                client_set_error(c, "%s", c->control.conn->error[0] ? c->control.conn->error : "cannot start the control thread");
                free(c->control.conn);
                c->control.conn = NULL;
                return r;
        }
        c->control.started = true;
        return 0;
}

void client_control_close(gpupool_client *c) {
        if (!c->control.conn)
                return;
        /* Serving, the thread wakes to the shutdown; waiting for the daemon, to the flag. */
        pthread_mutex_lock(&c->lock);
        c->control.stopping = true;
        pthread_cond_broadcast(&c->control.wake);
        shutdown(c->control.conn->sock, SHUT_RDWR);
        pthread_mutex_unlock(&c->lock);
        if (c->control.started)
                pthread_join(c->control.thread, NULL);
        c->control.started = false;
        gp_conn_close(c->control.conn);
        free(c->control.conn);
        c->control.conn = NULL;
}
