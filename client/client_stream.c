/*
 * client_stream.c: stream-ordered frees. gpupool_free_async() records an event on the
 * caller's stream and returns; the block goes back to the process's pool once the event has
 * completed.
 *
 * Pending frees are kept per stream, in the order they were queued. A stream runs its work in
 * that order, so a reaping walk stops at the first free of each stream whose event has not
 * completed: with PyTorch's CPU thousands of frees ahead of the GPU, it costs one event query
 * per stream, not one per pending free. An allocation on the same stream may take a pending
 * block at once (the stream orders the new work after the old); those are found in a tree by
 * (stream, device, size). Streams are told apart by cuStreamGetId, never by their handle: a
 * destroyed stream's handle may come back for a new stream while the old one's work still runs.
 *
 * A reaper thread (started on the first such free) waits, asleep, for the oldest pending
 * event (CU_EVENT_BLOCKING_SYNC: an event without it spins the waiting core), then frees
 * every block whose event has completed, at most once per REAP_INTERVAL_NS so that a GPU
 * finishing work event by event does not wake it (and take the lock) per free; it is
 * signalled only when it waits with nothing pending. An allocation that the process's pool
 * cannot serve frees the completed ones itself before it asks the daemon; nothing else on the
 * fast path queries an event. Only CUDA_SUCCESS counts as done: a driver error (an event recorded in a graph
 * capture, a context lost) leaves the block pending, where the memory stays the process's
 * until it exits; never is a block handed out again on an error's word. Nothing the caller
 * calls waits for the device, except gpupool_disconnect().
 */
#define _GNU_SOURCE
#include "client_stream.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client_cuda.h"
#include "client_pool.h"
#include "client_segment.h"

#define CMP(a, b) ((a) < (b) ? -1 : (a) > (b))

/* The reaper's shortest interval between two reaps: it frees in batches. */
#define REAP_INTERVAL_NS 1000000L

static void *reaper_main(void *arg);

/* By stream, device, size, then age: the lower bound of (stream, device, size) fits best. */
static int cmp_fit(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        const struct deferred *a = gp_rb_entry(x, struct deferred, by_fit);
        const struct deferred *b = gp_rb_entry(y, struct deferred, by_fit);

        if (a->queue->stream_id != b->queue->stream_id)
                return CMP(a->queue->stream_id, b->queue->stream_id);
        if (a->queue->device != b->queue->device)
                return CMP(a->queue->device, b->queue->device);
        if (a->block->size != b->block->size)
                return CMP(a->block->size, b->block->size);
        return CMP(a->seq, b->seq);
}

void client_stream_init(gpupool_client *c) {
        gp_rb_init(&c->pending, cmp_fit);
}

/* Frees the queues left empty. Locked. */
static void prune_queues(gpupool_client *c) {
        struct stream_queue **pp = &c->queues, *sq;

        while ((sq = *pp)) {
                if (sq->head) {
                        pp = &sq->next;
                        continue;
                }
                *pp = sq->next;
                free(sq);
        }
}

/*
 * The queue of a stream on device d, made on first use. NULL when out of memory. Locked. An
 * emptied queue stays for its stream's next free; those of streams gone are freed when a new
 * stream's queue is made, so there are never many more than the streams with frees pending.
 */
static struct stream_queue *queue_of(gpupool_client *c, unsigned d, unsigned long long stream_id) {
        struct stream_queue *sq;

        for (sq = c->queues; sq; sq = sq->next)
                if (sq->stream_id == stream_id && sq->device == d)
                        return sq;
        prune_queues(c);
        sq = calloc(1, sizeof(*sq));
        if (!sq)
                return NULL;
        sq->stream_id = stream_id;
        sq->device = d;
        sq->next = c->queues;
        c->queues = sq;
        return sq;
}

int client_stream_defer_free(gpupool_client *c, struct block *b, void *stream) {
        unsigned d = b->mapping->device;
        struct client_device *dev = &c->devices[d];
        struct deferred *q = c->spare_deferred;
        unsigned long long id;
        gp_cu_event e;
        int err;

        if (q)
                c->spare_deferred = q->next;
        else if (!(q = malloc(sizeof(*q))))
                return -ENOMEM;
        memset(q, 0, sizeof(*q));
        err = client_cuda_record(c, dev, stream, &e, &id);
        if (err == 0 && !(q->queue = queue_of(c, d, id))) {
                client_cuda_event_put(c, dev, e);
                err = -ENOMEM;
        }
        if (err < 0) {
                q->next = c->spare_deferred;
                c->spare_deferred = q;
                return err;
        }
        q->block = b;
        q->event = e;
        q->seq = ++c->deferred_seq;
        /*
         * Live until its work ends, but nobody's to free again, nor the scope's; an allocation
         * on this same stream may take it at once (the stream orders the new work after the old).
         */
        b->freeing = true;
        (void) client_live_insert(c, b);
        gp_rb_insert(&c->pending, &q->by_fit);
        if (q->queue->tail)
                q->queue->tail->next = q;
        else
                q->queue->head = q;
        q->queue->tail = q;
        if (!c->reaper_started && pthread_create(&c->reaper, NULL, reaper_main, c) == 0)
                c->reaper_started = true;
        /* Without a reaper thread an allocation that needs the memory still frees the block. */
        if (c->reaper_idle)
                pthread_cond_signal(&c->deferred_cond);
        return 0;
}

struct block *client_stream_take(gpupool_client *c, unsigned d, uint64_t rsize, void *stream) {
        struct stream_queue key_queue;
        struct block key_block = { .size = rsize };
        struct deferred key = { .queue = &key_queue, .block = &key_block, .seq = 0 }, *q;
        struct gp_rb_node *n;
        struct block *b;

        /* Not on a capturing stream: its work is the graph's, ordered when the graph runs. */
        if (!c->pending.count || client_cuda_stream_id(c, &c->devices[d], stream, &key_queue.stream_id) != 0)
                return NULL;
        key_queue.device = d;
        n = gp_rb_lower_bound(&c->pending, &key.by_fit);
        if (!n)
                return NULL;
        q = gp_rb_entry(n, struct deferred, by_fit);
        b = q->block;
        if (q->queue->stream_id != key_queue.stream_id || q->queue->device != d || b->size > rsize + rsize / 4)
                return NULL;
        gp_rb_remove(&c->pending, n);
        q->block = NULL;        /* its event ends nothing now */
        b->freeing = false;
        return b;
}

/* Takes q off the head of its queue, frees its block into the process's pool and recycles its event. Locked. */
static void complete(gpupool_client *c, struct deferred *q) {
        struct stream_queue *sq = q->queue;

        sq->head = q->next;
        if (!sq->head)
                sq->tail = NULL;
        client_cuda_event_put(c, &c->devices[sq->device], q->event);
        if (q->block) {
                gp_rb_remove(&c->pending, &q->by_fit);
                (void) client_free_block(c, q->block);
        }
        q->next = c->spare_deferred;
        c->spare_deferred = q;
}

/*
 * Stream order makes one query answer for many: once a free's event has completed, so have
 * those of every earlier free on its stream. So the newest is asked first, and else, from
 * the oldest on, only the frees that give a block back (or the newest) are asked about:
 * those whose block an allocation on the stream took already only wait to recycle their
 * event, which a later free's answer settles.
 */
int client_stream_reap(gpupool_client *c, bool wait) {
        int r = 0;

        for (struct stream_queue *sq = c->queues; sq; sq = sq->next) {
                struct client_device *d = &c->devices[sq->device];
                struct deferred *q;
                int tail_done = -1;

                if (sq->head && sq->head != sq->tail && (tail_done = client_cuda_event_done(c, d, sq->tail->event, false)) == 1) {
                        while (sq->head)
                                complete(c, sq->head);
                        continue;
                }
                q = sq->head;
                while (q) {
                        struct deferred *next = q->next;
                        int done;

                        if (!q->block && q != sq->tail) {
                                q = next;
                                continue;
                        }
                        if (q == sq->tail && tail_done == 0 && !wait)
                                break;          /* asked just now */
                        done = client_cuda_event_done(c, d, q->event, wait);
                        if (done < 0 && wait)
                                r = done;
                        if (done != 1)
                                break;          /* the stream's later frees wait behind this one */
                        while (sq->head != next)
                                complete(c, sq->head);
                        q = next;
                }
        }
        return r;
}

/* The oldest pending free's event and device, or NULL. Locked. */
static struct deferred *oldest(gpupool_client *c) {
        struct deferred *best = NULL;

        for (struct stream_queue *sq = c->queues; sq; sq = sq->next)
                if (sq->head && (!best || sq->head->seq < best->seq))
                        best = sq->head;
        return best;
}

static void *reaper_main(void *arg) {
        gpupool_client *c = arg;
        unsigned backoff_ms = 0;

        /* Our own thread: its waits must not disturb a graph capture of the application's. */
        client_cuda_thread_relaxed(c);
        pthread_mutex_lock(&c->lock);
        for (;;) {
                struct deferred *q;
                struct client_device *d;
                gp_cu_event e;
                int done;

                c->reaper_idle = true;
                while (!c->stopping && !(q = oldest(c)))
                        pthread_cond_wait(&c->deferred_cond, &c->lock);
                c->reaper_idle = false;
                if (c->stopping)
                        break;
                d = &c->devices[q->queue->device];
                e = q->event;
                /*
                 * Wait without the lock, so the application's calls go on meanwhile. Another
                 * thread may complete this free and record the event again meanwhile, which only
                 * makes this wait end sooner or later; no event is destroyed before we are joined.
                 */
                pthread_mutex_unlock(&c->lock);
                done = client_cuda_event_wait(c, d, e);
                pthread_mutex_lock(&c->lock);
                (void) client_stream_reap(c, false);
                if (c->stopping)
                        break;
                /* A driver error: look again later, not in a loop that pins a core. Else the next batch. */
                backoff_ms = done < 0 ? (backoff_ms ? (backoff_ms < 500 ? backoff_ms * 2 : 1000) : 10) : 0;
                {
                        struct timespec ts;
                        long ns = backoff_ms ? (long) backoff_ms * 1000000L : REAP_INTERVAL_NS;

                        clock_gettime(CLOCK_REALTIME, &ts);
                        ts.tv_nsec += ns;
                        ts.tv_sec += ts.tv_nsec / 1000000000L;
                        ts.tv_nsec %= 1000000000L;
                        /* Only stop signals it now (reaper_idle is false): a timed pause, not a wait for the GPU. */
                        while (!c->stopping && pthread_cond_timedwait(&c->deferred_cond, &c->lock, &ts) == 0)
                                ;
                }
        }
        pthread_mutex_unlock(&c->lock);
        return NULL;
}

void client_stream_forget(gpupool_client *c) {
        struct stream_queue *sq;
        struct deferred *q;

        while ((sq = c->queues)) {
                while ((q = sq->head)) {
                        sq->head = q->next;
                        /* Its block, live and marked freeing, goes with the live table (client_live_forget()). */
                        client_cuda_event_put(c, &c->devices[sq->device], q->event);
                        free(q);
                }
                c->queues = sq->next;
                free(sq);
        }
        while ((q = c->spare_deferred)) {
                c->spare_deferred = q->next;
                free(q);
        }
        client_stream_init(c);
}

void client_stream_stop(gpupool_client *c) {
        if (!c->reaper_started)
                return;
        c->stopping = true;
        pthread_cond_broadcast(&c->deferred_cond);
        pthread_mutex_unlock(&c->lock);
        pthread_join(c->reaper, NULL);
        pthread_mutex_lock(&c->lock);
        c->reaper_started = false;
        c->stopping = false;    /* a reconnected handle's next stream-ordered free starts a new one */
}
