/*
 * client_stream.c: stream-ordered frees. gpupool_free_async() frees the block at once for the
 * caller's stream and no one else: it is held in the device's heap for the stream's lane
 * (heap_free_held()), where an allocation on that same stream carves it, split and merged
 * with its neighbours, as any free block (the stream orders the new work after the old: this
 * is PyTorch's rule for a block freed on the stream that reuses it, and no event is needed for
 * it). The block is everyone's once a fence, an event recorded on the stream after the free,
 * has completed (heap_release()). One fence covers many frees: it is recorded after
 * STREAM_FENCE_FREES frees on a stream, or when something else needs the memory (a lease the
 * daemon refused, a trim, a return: client_stream_collect()), never once per free; an
 * allocation that finds nothing free fences only the streams with STREAM_FENCE_MISS_FREES
 * frees waiting (a fence it cannot wait for serves later allocations, and one for a handful
 * of frees would make a fence of nearly every miss where blocks of many sizes come and go),
 * and reaps what has completed: an event is a command on the stream and, made with CU_EVENT_BLOCKING_SYNC, an
 * interrupt, and PyTorch frees hundreds of blocks a training step. A stream's latest frees
 * (fewer than STREAM_FENCE_FREES) wait for the next free on it, something that needs the
 * memory, or STREAM_FENCE_AGE_NS, when the reaper fences them. The reaper records only on a
 * stream that is not capturing a graph; a capture that begins on it between its check and its
 * record (a window of a driver call) would take the event as a node of the graph, which
 * records nothing of the application's, and leave those frees' blocks held until the
 * disconnect.
 *
 * Fences are kept per stream, in the order they were recorded. A stream runs its work in that
 * order, so the fences that have completed are a prefix of its queue, found with a few event
 * queries (client_stream_reap()): with PyTorch's CPU thousands of frees ahead of the GPU,
 * reaping costs a few queries per stream. Streams are told apart by cuStreamGetId, not by
 * their handle: a destroyed stream's handle may come back for a new stream while the old
 * one's work still runs. A caller that promises that none it names is destroyed
 * (GPUPOOL_STREAMS_KEPT), and that it tells of every graph capture (GPUPOOL_CAPTURES_TOLD),
 * has its streams named by handle and asked nothing while no capture it told of is under way
 * (stream_ask()): an allocation or free then makes no driver call.
 *
 * A reaper thread (started on the first such free) waits, asleep, for the oldest fence
 * (CU_EVENT_BLOCKING_SYNC: an event without it spins the waiting core), then releases every
 * fence that has completed, at most once per REAP_INTERVAL_NS so that a GPU finishing work
 * fence by fence does not wake it (and take the lock) each time; it is signalled only when it
 * waits with nothing pending. An allocation that the process's pool cannot serve releases the
 * completed ones itself before it asks the daemon; nothing else on the fast path queries an
 * event. Only CUDA_SUCCESS counts as done: a driver error (an event recorded in a graph
 * capture, a context lost) leaves the blocks held, where the memory stays the process's until
 * it exits; never is a block handed to another stream on an error's word. Nothing the caller
 * calls waits for the device, except gpupool_disconnect().
 */
#define _GNU_SOURCE
#include "client_stream.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client_grow.h"
#include "client_mem.h"
#include "client_segment.h"

/* The GPU driver under the handle's memory (client_mem.h): its streams and events. */
static inline const struct client_driver_ops *drv(const gpupool_client *c) {
        return c->mem->driver;
}

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

/* The i-th oldest fence of sq. */
static struct stream_fence *fence_at(const struct stream_queue *sq, unsigned i) {
        return &sq->ring[(sq->first + i) & (sq->cap - 1)];
}

/* Makes room in sq's ring for one more fence. -ENOMEM when it cannot grow. Locked. */
static int queue_reserve(struct stream_queue *sq) {
        unsigned cap = sq->cap ? sq->cap * 2 : 16;
        struct stream_fence *ring;

        if (sq->count < sq->cap)
                return 0;
        ring = malloc(cap * sizeof(*ring));
        if (!ring || cap < sq->cap) {
                free(ring);
                return -ENOMEM;
        }
        for (unsigned i = 0; i < sq->count; i++)
                ring[i] = *fence_at(sq, i);
        free(sq->ring);
        sq->ring = ring;
        sq->cap = cap;
        sq->first = 0;
        return 0;
}

void client_stream_init(gpupool_client *c) {
        c->streams = (struct client_streams) { .queues = NULL };
        pthread_cond_init(&c->streams.cond, NULL);
}

void client_stream_fini(gpupool_client *c) {
        pthread_cond_destroy(&c->streams.cond);
}

/* Frees the queues with nothing held: no fence pending and no free waiting for one. Locked. */
static void prune_queues(gpupool_client *c) {
        struct stream_queue **pp = &c->streams.queues, *sq;

        while ((sq = *pp)) {
                if (sq->count || sq->unfenced) {
                        pp = &sq->next;
                        continue;
                }
                *pp = sq->next;
                free(sq->ring);
                free(sq);
        }
}

/* Whether a queue has lane. Locked. */
static bool queue_find_lane(const gpupool_client *c, uint32_t lane) {
        for (const struct stream_queue *sq = c->streams.queues; sq; sq = sq->next)
                if (sq->lane == lane)
                        return true;
        return false;
}

/* The queue of a stream on device d, or NULL. Locked. */
static struct stream_queue *queue_find(gpupool_client *c, unsigned d, unsigned long long stream_id) {
        for (struct stream_queue *sq = c->streams.queues; sq; sq = sq->next)
                if (sq->stream_id == stream_id && sq->device == d)
                        return sq;
        return NULL;
}

/*
 * The queue of a stream on device d, made on first use with a lane of its own. NULL when out
 * of memory. Locked. An emptied queue stays for its stream's next free; those of streams gone
 * are freed when a new stream's queue is made, so there are never many more than the streams
 * with frees held.
 */
static struct stream_queue *queue_of(gpupool_client *c, unsigned d, unsigned long long stream_id) {
        struct stream_queue *sq = queue_find(c, d, stream_id);

        if (sq)
                return sq;
        prune_queues(c);
        sq = calloc(1, sizeof(*sq));
        if (!sq)
                return NULL;
        sq->stream_id = stream_id;
        sq->device = d;
        /* Lanes are never reused while a queue has one: a pruned queue held nothing. */
        do
                sq->lane = ++c->streams.last_lane;
        while (!sq->lane || queue_find_lane(c, sq->lane));
        sq->next_fence = 1;
        sq->next = c->streams.queues;
        c->streams.queues = sq;
        return sq;
}

/* A stream's key when its handle names it (GPUPOOL_STREAMS_KEPT): never a driver's id, which counts from 1. */
#define STREAM_KEY_HANDLE (1ULL << 63)

/*
 * What the driver must be asked of stream to name it and to know that it is not capturing a
 * graph (CLIENT_ASK_*): nothing under both of the caller's promises (gpupool_promise()) while
 * no capture it told of is under way. CU_STREAM_PER_THREAD is a stream of each thread: its
 * handle never names one stream. Locked.
 */
static unsigned stream_ask(const gpupool_client *c, const void *stream, unsigned promises) {
        unsigned ask = 0;

        promises |= c->streams.promises;
        if (!(promises & GPUPOOL_STREAMS_KEPT) || (uintptr_t) stream == 2)
                ask |= CLIENT_ASK_ID;
        if (!(promises & GPUPOOL_CAPTURES_TOLD) || c->streams.captures)
                ask |= CLIENT_ASK_CAPTURE;
        return ask;
}

/*
 * stream's key on device d (its id, or its handle's key), as the driver's stream_id() returns,
 * for a call that makes promises besides the handle's. Locked.
 */
static int stream_key(gpupool_client *c, unsigned d, void *stream, unsigned promises, unsigned long long *ret) {
        unsigned ask = stream_ask(c, stream, promises);

        if (!(ask & CLIENT_ASK_ID))     /* NULL and CU_STREAM_LEGACY are one stream */
                *ret = STREAM_KEY_HANDLE | ((uintptr_t) stream == 1 ? 0 : (uintptr_t) stream);
        return ask ? drv(c)->stream_id(c, d, stream, ask, ret) : 0;
}

/*
 * Records one fence after sq's unfenced frees, on the stream their latest free came with.
 * Nothing when the stream is capturing or its handle is another stream's now: they wait for a
 * later fence (or the end of the process's work at disconnect). checked: the caller has just
 * asked the driver what stream_key() asks, under the lock held since. Locked.
 */
static int fence(gpupool_client *c, struct stream_queue *sq, bool checked) {
        unsigned ask = checked ? 0 : stream_ask(c, sq->stream, sq->promises);
        client_event e;
        int r;

        if (!sq->unfenced || sq->gone)
                return 0;
        if (queue_reserve(sq) < 0)
                return -ENOMEM;         /* they wait for a later fence */
        /* A queue named by its stream's id before the promise was made is asked for it still. */
        if (!checked && !(sq->stream_id & STREAM_KEY_HANDLE))
                ask |= CLIENT_ASK_ID;
        r = drv(c)->fence(c, sq->device, sq->stream, sq->stream_id, ask, &e);
        sq->gone = r == 2;      /* its frees wait for the disconnect's end of all work */
        if (r != 0)
                return r < 0 ? r : 0;
        sq->ring[(sq->first + sq->count++) & (sq->cap - 1)] =
                (struct stream_fence) { .event = e, .number = sq->next_fence++, .seq = ++c->streams.fence_seq };
        sq->unfenced = 0;
        /* A reaper waiting with nothing fenced waits for this one now. */
        if (c->streams.reaper_idle)
                pthread_cond_signal(&c->streams.cond);
        return 0;
}

int client_stream_defer_free(gpupool_client *c, struct block *b, void *stream, unsigned promises) {
        unsigned d = b->mapping->device;
        struct client_device *dev = &c->devices[d];
        struct stream_queue *sq;
        unsigned long long id;
        int err;

        err = stream_key(c, d, stream, promises, &id);
        if (err == 1) {
                client_set_error(c, "the stream is capturing a CUDA graph: a block freed inside a capture belongs to "
                                    "the graph, and gpupool cannot order its reuse; free it after the capture ends "
                                    "(the block stays allocated)");
                return -EBUSY;
        }
        if (err < 0)
                return err;
        if (!(sq = queue_of(c, d, id)))
                return -ENOMEM;
        /* Its granules (segments that grow in place) stay counted until the release: work may still touch them. */
        heap_free_held(&dev->heap, b->hb, sq->lane, sq->next_fence);
        free(b);
        sq->stream = stream;
        sq->gone = false;
        /* A later fence asks what the least promised of the frees it covers did not promise. */
        sq->promises = sq->unfenced ? sq->promises & promises : promises;
        if (!sq->unfenced++)
                sq->unfenced_since_ns = client_now_ns();
        if (!c->streams.reaper_started && pthread_create(&c->streams.reaper, NULL, reaper_main, c) == 0)
                c->streams.reaper_started = true;
        /* Without a reaper thread an allocation that needs the memory still releases the blocks. */
        if (sq->unfenced >= STREAM_FENCE_FREES)
                (void) fence(c, sq, true);     /* stream_key() just asked */
        else if (c->streams.reaper_idle)
                pthread_cond_signal(&c->streams.cond);         /* it fences these in time */
        return 0;
}

bool client_stream_pending(const gpupool_client *c) {
        for (const struct stream_queue *sq = c->streams.queues; sq; sq = sq->next)
                if (sq->count || sq->unfenced)
                        return true;
        return false;
}

uint32_t client_stream_lane(gpupool_client *c, unsigned d, void *stream, unsigned promises) {
        struct stream_queue *sq;
        unsigned long long id;

        /* Not on a capturing stream: its work is the graph's, ordered when the graph runs. */
        if (!client_stream_pending(c) || stream_key(c, d, stream, promises, &id) != 0)
                return 0;
        sq = queue_find(c, d, id);
        return sq ? sq->lane : 0;
}

/*
 * Recycles fence e of device d: unless the reaper is waiting for it unlocked, which would
 * then wait for whatever it was recorded for next (another window of a stream's work); the
 * reaper recycles it after its wait. Locked.
 */
static void fence_put(gpupool_client *c, unsigned d, client_event e) {
        if (e == c->streams.reaper_event)
                c->streams.reaper_event_done = true;
        else
                drv(c)->event_put(c, d, e);
}

/* A held block is everyone's now: its granules no live block touches become idle (segments that grow in place). */
static void on_released(void *ctx, struct heap_block *hb) {
        struct mapping *m = gp_rb_entry(hb->segment, struct mapping, hs);

        if (m->grow)
                client_grow_give(ctx, hb->segment, hb->offset, hb->size);
}

static void on_emptied(void *ctx, struct heap_segment *s) {
        (void) ctx;
        gp_rb_entry(s, struct mapping, hs)->emptied_ms = client_now_ms();
}

static const struct heap_release_ops release_ops = { on_released, on_emptied };

/* Takes sq's n oldest fences off, completed, and makes what they held everyone's. Locked. */
static void complete(gpupool_client *c, struct stream_queue *sq, unsigned n) {
        uint64_t upto = fence_at(sq, n - 1)->number;

        for (unsigned i = 0; i < n; i++)
                fence_put(c, sq->device, fence_at(sq, i)->event);
        sq->first = (sq->first + n) & (sq->cap - 1);
        sq->count -= n;
        (void) heap_release(&c->devices[sq->device].heap, sq->lane, upto, &release_ops, c);
}

/*
 * Stream order makes one query answer for many: once a fence has completed, so have the
 * earlier ones on its stream, so the completed fences of a stream are a prefix of its queue.
 * The newest is asked first (all done), then the oldest (none done), and else the end of the
 * prefix is found by an exponential and then a binary search: a few queries however many
 * fences a batch completes, not one each.
 */
int client_stream_reap(gpupool_client *c, bool wait) {
        int r = 0;

        for (struct stream_queue *sq = c->streams.queues; sq; sq = sq->next) {
                unsigned d = sq->device, n = sq->count, done_to, not_done, step;
                int done;

                if (!n)
                        continue;
                done = drv(c)->event_done(c, d, fence_at(sq, n - 1)->event, wait);
                if (done < 0 && wait)
                        r = done;
                if (done == 1) {
                        complete(c, sq, n);
                        continue;
                }
                if (wait || n == 1 || drv(c)->event_done(c, d, fence_at(sq, 0)->event, false) != 1)
                        continue;       /* none done (or, waiting, the driver failed us) */
                /* Entry done_to is done and not_done is not: probe 1, 2, 4... past the oldest, then halve. */
                done_to = 0;
                not_done = n - 1;
                for (step = 1; done_to + step < not_done; step *= 2) {
                        if (drv(c)->event_done(c, d, fence_at(sq, done_to + step)->event, false) != 1) {
                                not_done = done_to + step;
                                break;
                        }
                        done_to += step;
                }
                while (not_done - done_to > 1) {
                        unsigned mid = done_to + (not_done - done_to) / 2;

                        if (drv(c)->event_done(c, d, fence_at(sq, mid)->event, false) == 1)
                                done_to = mid;
                        else
                                not_done = mid;
                }
                complete(c, sq, done_to + 1);
        }
        return r;
}

int client_stream_collect(gpupool_client *c, unsigned fewest) {
        for (struct stream_queue *sq = c->streams.queues; sq; sq = sq->next)
                if (sq->unfenced >= (fewest ? fewest : 1))
                        (void) fence(c, sq, false);
        return client_stream_reap(c, false);
}

/* The queue whose oldest fence is the oldest of all, or NULL. Locked. */
static struct stream_queue *oldest(gpupool_client *c) {
        struct stream_queue *best = NULL;

        for (struct stream_queue *sq = c->streams.queues; sq; sq = sq->next)
                if (sq->count && (!best || fence_at(sq, 0)->seq < fence_at(best, 0)->seq))
                        best = sq;
        return best;
}

/* Whether some stream has frees with no fence yet that one may still follow. Locked. */
static bool unfenced(const gpupool_client *c) {
        for (const struct stream_queue *sq = c->streams.queues; sq; sq = sq->next)
                if (sq->unfenced && !sq->gone)
                        return true;
        return false;
}

/* The reaper's: fences the streams whose frees have waited STREAM_FENCE_AGE_NS for one. Locked. */
static void fence_aged(gpupool_client *c) {
        uint64_t now = client_now_ns();

        for (struct stream_queue *sq = c->streams.queues; sq; sq = sq->next)
                if (sq->unfenced && now - sq->unfenced_since_ns >= STREAM_FENCE_AGE_NS)
                        (void) fence(c, sq, false);
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
        while (!c->streams.stopping && pthread_cond_timedwait(&c->streams.cond, &c->lock, &ts) == 0)
                ;
}

static void *reaper_main(void *arg) {
        gpupool_client *c = arg;
        unsigned backoff_ms = 0;

        /* Our own thread: its waits must not disturb a graph capture of the application's. */
        pthread_mutex_lock(&c->lock);
        drv(c)->thread_relaxed(c);
        for (;;) {
                struct stream_queue *sq = NULL;
                client_event e;
                unsigned d;
                int done;

                c->streams.reaper_idle = true;
                while (!c->streams.stopping && !(sq = oldest(c))) {
                        if (!unfenced(c)) {
                                pthread_cond_wait(&c->streams.cond, &c->lock);
                                continue;
                        }
                        /* Only frees with no fence yet: they get one once they have waited long enough. */
                        reaper_pause(c, (long) STREAM_FENCE_AGE_NS);
                        fence_aged(c);
                }
                c->streams.reaper_idle = false;
                if (c->streams.stopping)
                        break;
                d = sq->device;
                e = fence_at(sq, 0)->event;
                /*
                 * Wait without the lock, so the application's calls go on meanwhile. Another
                 * thread may complete this fence meanwhile: the event is then not recorded
                 * again until this wait has ended (fence_put()).
                 */
                c->streams.reaper_event = e;
                c->streams.reaper_event_done = false;
                pthread_mutex_unlock(&c->lock);
                done = drv(c)->event_wait(c, d, e);
                pthread_mutex_lock(&c->lock);
                c->streams.reaper_event = NULL;
                if (c->streams.reaper_event_done)
                        drv(c)->event_put(c, d, e);
                (void) client_stream_reap(c, false);
                if (c->streams.stopping)
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

        /* The blocks they held go with the heaps (client_mappings_forget()). */
        while ((sq = c->streams.queues)) {
                for (unsigned i = 0; i < sq->count; i++)
                        drv(c)->event_put(c, sq->device, fence_at(sq, i)->event);
                c->streams.queues = sq->next;
                free(sq->ring);
                free(sq);
        }
}

void client_stream_stop(gpupool_client *c) {
        if (!c->streams.reaper_started)
                return;
        c->streams.stopping = true;
        pthread_cond_broadcast(&c->streams.cond);
        pthread_mutex_unlock(&c->lock);
        pthread_join(c->streams.reaper, NULL);
        pthread_mutex_lock(&c->lock);
        c->streams.reaper_started = false;
        c->streams.stopping = false;    /* a reconnected handle's next stream-ordered free starts a new one */
}

int client_stream_promise(gpupool_client *c, unsigned promises) {
        if (promises & ~(GPUPOOL_STREAMS_KEPT | GPUPOOL_CAPTURES_TOLD)) {
                client_set_error(c, "gpupool_promise: unknown promises 0x%x (GPUPOOL_STREAMS_KEPT, GPUPOOL_CAPTURES_TOLD)",
                                 promises & ~(GPUPOOL_STREAMS_KEPT | GPUPOOL_CAPTURES_TOLD));
                return -EINVAL;
        }
        c->streams.promises |= promises;
        return 0;
}

int client_stream_capture(gpupool_client *c, bool begin) {
        if (begin ? c->streams.captures == INT_MAX : !c->streams.captures) {
                client_set_error(c, begin ? "gpupool_capture_begin: %d captures under way already" :
                                            "gpupool_capture_end: no capture begun (gpupool_capture_begin()) is under way", INT_MAX);
                return -EINVAL;
        }
        c->streams.captures += begin ? 1 : -1;
        return (int) c->streams.captures;
}
