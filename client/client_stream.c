/*
 * client_stream.c: stream-ordered frees. gpupool_free_async() queues the block on the caller's
 * stream and returns; the block goes back to the process's pool once an event recorded on that
 * stream after the free (its fence) has completed. One fence covers many frees: it is recorded
 * after STREAM_FENCE_FREES frees on a stream, or when an allocation finds nothing free
 * (client_stream_collect()), never once per free: an event is a command on the stream and,
 * made with CU_EVENT_BLOCKING_SYNC, an interrupt, and PyTorch frees hundreds of blocks a
 * training step. A stream's latest frees (fewer than STREAM_FENCE_FREES) wait for the next free
 * on it, an allocation that finds nothing free, or STREAM_FENCE_AGE_NS, when the reaper fences
 * them. The reaper records only on a stream that is not capturing a graph; a capture that
 * begins on it between its check and its record (a window of a driver call) would take the
 * event as a node of the graph, which records nothing of the application's, and leave those
 * frees' blocks pending until the disconnect. Until its fence, a block is reused only by an
 * allocation on its own stream, which the stream orders after the work queued before.
 *
 * Pending frees are kept per stream, in the order they were queued. A stream runs its work in
 * that order, so the frees whose events have completed are a prefix of its queue, found with
 * a few event queries (client_stream_reap()): with PyTorch's CPU thousands of frees ahead of
 * the GPU, reaping costs a few queries per stream, not one per pending free. An allocation on the same stream may take a pending
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
 * fast path queries an event. Only CUDA_SUCCESS counts as done: a driver error (an event
 * recorded in a graph capture, a context lost) leaves the block pending, where the memory
 * stays the process's until it exits; never is a block handed out again on an error's word. Nothing the caller
 * calls waits for the device, except gpupool_disconnect().
 */
#define _GNU_SOURCE
#include "client_stream.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client_cuda.h"
#include "client_segment.h"

#define CMP(a, b) ((a) < (b) ? -1 : (a) > (b))

/* The reaper's shortest interval between two reaps: it frees in batches. */
#define REAP_INTERVAL_NS 1000000L
/*
 * A stream's frees get a fence once this many are queued after its last (bench-lag: 1 event per
 * 23 to 47 frees on the traces at a lag of 256; a fence per freed byte share cost 3 to 10 times
 * the events and held no less).
 */
#define STREAM_FENCE_FREES 64
/*
 * Frees left with no fence this long get one from the reaper thread, so that memory a process
 * freed comes back while it makes no further call (an idle process, a daemon asking for memory).
 */
#define STREAM_FENCE_AGE_NS 2000000ULL

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

/* The i-th oldest pending free of sq. */
static struct deferred *queue_at(const struct stream_queue *sq, unsigned i) {
        return sq->ring[(sq->first + i) & (sq->cap - 1)];
}

/* Appends q to sq. -ENOMEM when the ring cannot grow. Locked. */
static int queue_push(struct stream_queue *sq, struct deferred *q) {
        if (sq->count == sq->cap) {
                unsigned cap = sq->cap ? sq->cap * 2 : 16;
                struct deferred **ring = malloc(cap * sizeof(*ring));

                if (!ring || cap < sq->cap) {
                        free(ring);
                        return -ENOMEM;
                }
                for (unsigned i = 0; i < sq->count; i++)
                        ring[i] = queue_at(sq, i);
                free(sq->ring);
                sq->ring = ring;
                sq->cap = cap;
                sq->first = 0;
        }
        sq->ring[(sq->first + sq->count++) & (sq->cap - 1)] = q;
        return 0;
}

void client_stream_init(gpupool_client *c, int (*free_block)(gpupool_client *c, struct block *b)) {
        gp_rb_init(&c->pending, cmp_fit);
        c->free_deferred = free_block;
}

/* Frees the queues left empty. Locked. */
static void prune_queues(gpupool_client *c) {
        struct stream_queue **pp = &c->queues, *sq;

        while ((sq = *pp)) {
                if (sq->count) {
                        pp = &sq->next;
                        continue;
                }
                *pp = sq->next;
                free(sq->ring);
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

/*
 * Records one fence after sq's unfenced frees, on the stream their latest free came with, and
 * hands it to each. Nothing when the stream is capturing or its handle is another stream's now:
 * they wait for a later fence (or the end of the process's work at disconnect). Locked.
 */
static int fence(gpupool_client *c, struct stream_queue *sq) {
        gp_cu_event e;
        int r;

        if (!sq->unfenced || sq->gone)
                return 0;
        r = client_cuda_fence(c, &c->devices[sq->device], sq->stream, sq->stream_id, &e);
        sq->gone = r == 2;      /* its frees wait for the disconnect's end of all work */
        if (r != 0)
                return r < 0 ? r : 0;
        for (unsigned i = sq->count - sq->unfenced; i < sq->count; i++)
                queue_at(sq, i)->event = e;
        sq->unfenced = 0;
        /* A reaper waiting with nothing fenced waits for this one now. */
        if (c->reaper_idle)
                pthread_cond_signal(&c->deferred_cond);
        return 0;
}

int client_stream_defer_free(gpupool_client *c, struct block *b, void *stream) {
        unsigned d = b->mapping->device;
        struct client_device *dev = &c->devices[d];
        struct deferred *q = c->spare_deferred;
        struct stream_queue *sq = NULL;
        unsigned long long id;
        int err;

        err = client_cuda_stream_id(c, dev, stream, &id);
        if (err == 1) {
                client_set_error(c, "the stream is capturing a CUDA graph: a block freed inside a capture belongs to "
                                    "the graph, and gpupool cannot order its reuse; free it after the capture ends "
                                    "(the block stays allocated)");
                return -EBUSY;
        }
        if (err < 0)
                return err;
        if (q)
                c->spare_deferred = q->next;
        else if (!(q = malloc(sizeof(*q))))
                return -ENOMEM;
        memset(q, 0, sizeof(*q));
        if (!(sq = queue_of(c, d, id)) || queue_push(sq, q) < 0) {
                q->next = c->spare_deferred;
                c->spare_deferred = q;
                return -ENOMEM;
        }
        q->queue = sq;
        q->block = b;
        q->seq = ++c->deferred_seq;
        sq->stream = stream;
        sq->gone = false;
        if (!sq->unfenced++)
                sq->unfenced_since_ns = client_now_ns();
        /*
         * Live until its work ends, but nobody's to free again, nor the scope's; an allocation
         * on this same stream may take it at once (the stream orders the new work after the old).
         */
        b->freeing = true;
        (void) client_live_insert(c, b);
        gp_rb_insert(&c->pending, &q->by_fit);
        if (!c->reaper_started && pthread_create(&c->reaper, NULL, reaper_main, c) == 0)
                c->reaper_started = true;
        /* Without a reaper thread an allocation that needs the memory still frees the block. */
        if (sq->unfenced >= STREAM_FENCE_FREES)
                (void) fence(c, sq);
        else if (c->reaper_idle)
                pthread_cond_signal(&c->deferred_cond);         /* it fences these in time */
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

/* Whether the i-th oldest free of sq is the last its fence covers (a fence covers a run of them). */
static bool fence_ends_at(const struct stream_queue *sq, unsigned i) {
        return queue_at(sq, i)->event && !(i + 1 < sq->count && queue_at(sq, i + 1)->event == queue_at(sq, i)->event);
}

/*
 * Recycles fence e of device d once no free needs it: unless the reaper is waiting for it
 * unlocked, which would then wait for whatever it was recorded for next (another window of a
 * stream's work); the reaper recycles it after its wait. Locked.
 */
static void fence_put(gpupool_client *c, unsigned d, gp_cu_event e) {
        if (e == c->reaper_event)
                c->reaper_event_done = true;
        else
                client_cuda_event_put(c, &c->devices[d], e);
}

/*
 * Takes the oldest free off sq, frees its block (into the process's pool), and recycles its
 * fence once no later free shares it. Locked.
 */
static void complete(gpupool_client *c, struct stream_queue *sq) {
        struct deferred *q = queue_at(sq, 0);

        if (fence_ends_at(sq, 0))
                fence_put(c, sq->device, q->event);
        sq->first = (sq->first + 1) & (sq->cap - 1);
        sq->count--;
        if (q->block) {
                gp_rb_remove(&c->pending, &q->by_fit);
                (void) c->free_deferred(c, q->block);
        }
        q->next = c->spare_deferred;
        c->spare_deferred = q;
}

/*
 * Stream order makes one query answer for many: once a free's event has completed, so have
 * those of every earlier free on its stream, so the completed frees of a stream are a prefix
 * of its queue. The newest is asked first (all done), then the oldest (none done), and else
 * the end of the prefix is found by an exponential and then a binary search: a few queries
 * however many frees a batch completes, not one each.
 */
int client_stream_reap(gpupool_client *c, bool wait) {
        int r = 0;

        for (struct stream_queue *sq = c->queues; sq; sq = sq->next) {
                struct client_device *d = &c->devices[sq->device];
                unsigned n = sq->count - sq->unfenced, done_to, not_done, step;     /* the fenced ones */
                int done;

                if (!n)
                        continue;
                done = client_cuda_event_done(c, d, queue_at(sq, n - 1)->event, wait);
                if (done < 0 && wait)
                        r = done;
                if (done == 1) {
                        for (unsigned i = 0; i < n; i++)
                                complete(c, sq);        /* the fenced ones: the rest have no fence yet */
                        continue;
                }
                if (wait || n == 1 || client_cuda_event_done(c, d, queue_at(sq, 0)->event, false) != 1)
                        continue;       /* none done (or, waiting, the driver failed us) */
                /* Entry done_to is done and not_done is not: probe 1, 2, 4... past the oldest, then halve. */
                done_to = 0;
                not_done = n - 1;
                for (step = 1; done_to + step < not_done; step *= 2) {
                        if (client_cuda_event_done(c, d, queue_at(sq, done_to + step)->event, false) != 1) {
                                not_done = done_to + step;
                                break;
                        }
                        done_to += step;
                }
                while (not_done - done_to > 1) {
                        unsigned mid = done_to + (not_done - done_to) / 2;

                        if (client_cuda_event_done(c, d, queue_at(sq, mid)->event, false) == 1)
                                done_to = mid;
                        else
                                not_done = mid;
                }
                for (unsigned i = 0; i <= done_to; i++)
                        complete(c, sq);
        }
        return r;
}

int client_stream_collect(gpupool_client *c) {
        for (struct stream_queue *sq = c->queues; sq; sq = sq->next)
                (void) fence(c, sq);
        return client_stream_reap(c, false);
}

/* The oldest pending free that has a fence, or NULL. Locked. */
static struct deferred *oldest(gpupool_client *c) {
        struct deferred *best = NULL;

        for (struct stream_queue *sq = c->queues; sq; sq = sq->next)
                if (sq->count > sq->unfenced && (!best || queue_at(sq, 0)->seq < best->seq))
                        best = queue_at(sq, 0);
        return best;
}

/* Whether some stream has frees with no fence yet that one may still follow. Locked. */
static bool unfenced(const gpupool_client *c) {
        for (const struct stream_queue *sq = c->queues; sq; sq = sq->next)
                if (sq->unfenced && !sq->gone)
                        return true;
        return false;
}

/* The reaper's: fences the streams whose frees have waited STREAM_FENCE_AGE_NS for one. Locked. */
static void fence_aged(gpupool_client *c) {
        uint64_t now = client_now_ns();

        for (struct stream_queue *sq = c->queues; sq; sq = sq->next)
                if (sq->unfenced && now - sq->unfenced_since_ns >= STREAM_FENCE_AGE_NS)
                        (void) fence(c, sq);
}

/*
 * Pauses the reaper for ns, locked, or until stop: only stop signals it now (reaper_idle is
 * false). A timed pause between batches, not a wait for the GPU.
 */
static void reaper_pause(gpupool_client *c, long ns) {
        struct timespec ts;

        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += ns;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        while (!c->stopping && pthread_cond_timedwait(&c->deferred_cond, &c->lock, &ts) == 0)
                ;
}

static void *reaper_main(void *arg) {
        gpupool_client *c = arg;
        unsigned backoff_ms = 0;

        /* Our own thread: its waits must not disturb a graph capture of the application's. */
        client_cuda_thread_relaxed(c);
        pthread_mutex_lock(&c->lock);
        for (;;) {
                struct deferred *q = NULL;
                struct client_device *d;
                gp_cu_event e;
                int done;

                c->reaper_idle = true;
                while (!c->stopping && !(q = oldest(c))) {
                        if (!unfenced(c)) {
                                pthread_cond_wait(&c->deferred_cond, &c->lock);
                                continue;
                        }
                        /* Only frees with no fence yet: they get one once they have waited long enough. */
                        reaper_pause(c, (long) STREAM_FENCE_AGE_NS);
                        fence_aged(c);
                }
                c->reaper_idle = false;
                if (c->stopping)
                        break;
                d = &c->devices[q->queue->device];
                e = q->event;
                /*
                 * Wait without the lock, so the application's calls go on meanwhile. Another
                 * thread may complete these frees meanwhile: the event is then not recorded
                 * again until this wait has ended (fence_put()).
                 */
                c->reaper_event = e;
                c->reaper_event_done = false;
                pthread_mutex_unlock(&c->lock);
                done = client_cuda_event_wait(c, d, e);
                pthread_mutex_lock(&c->lock);
                c->reaper_event = NULL;
                if (c->reaper_event_done)
                        client_cuda_event_put(c, d, e);
                (void) client_stream_reap(c, false);
                if (c->stopping)
                        break;
                /* A driver error: look again later, not in a loop that pins a core. Else the next batch. */
                backoff_ms = done < 0 ? (backoff_ms ? (backoff_ms < 500 ? backoff_ms * 2 : 1000) : 10) : 0;
                reaper_pause(c, backoff_ms ? (long) backoff_ms * 1000000L : REAP_INTERVAL_NS);
        }
        pthread_mutex_unlock(&c->lock);
        return NULL;
}

void client_stream_forget(gpupool_client *c) {
        struct stream_queue *sq;
        struct deferred *q;

        while ((sq = c->queues)) {
                for (unsigned i = 0; i < sq->count; i++) {
                        q = queue_at(sq, i);
                        /* Its block, live and marked freeing, goes with the live table (client_live_forget()). */
                        if (fence_ends_at(sq, i))
                                client_cuda_event_put(c, &c->devices[sq->device], q->event);
                        free(q);
                }
                c->queues = sq->next;
                free(sq->ring);
                free(sq);
        }
        while ((q = c->spare_deferred)) {
                c->spare_deferred = q->next;
                free(q);
        }
        gp_rb_init(&c->pending, cmp_fit);
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
