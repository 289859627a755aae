/*
 * client_stream.c: stream-ordered frees. gpupool_free_async() records an event on the
 * caller's stream and returns; the block goes back to the process's pool once the event has
 * completed. A reaper thread (started on the first such free) waits for the oldest pending
 * event and then frees every block whose event has completed; every allocation call also
 * frees the completed ones first. Nothing the caller calls waits for the device, except
 * gpupool_disconnect(), which must not give memory back while queued work may still touch it.
 */
#define _GNU_SOURCE
#include "client_stream.h"

#include <errno.h>
#include <stdlib.h>

#include "client_cuda.h"
#include "client_pool.h"
#include "client_segment.h"

static void *reaper_main(void *arg);

int client_stream_defer_free(gpupool_client *c, struct block *b, void *stream) {
        struct client_device *d = &c->devices[b->mapping->device];
        struct deferred *q = calloc(1, sizeof(*q));
        gp_cu_event e;
        int err;

        if (!q)
                return -ENOMEM;
        err = client_cuda_record(c, d, stream, &e);
        if (err < 0) {
                free(q);
                return err;
        }
        q->block = b;
        q->stream = stream;
        q->event = e;
        q->device = b->mapping->device;
        /*
         * Live until its work ends, but nobody's to free again, nor the scope's; an allocation
         * on this same stream may take it at once (the stream orders the new work after the old).
         */
        b->freeing = true;
        (void) client_live_insert(c, b);
        if (c->deferred_tail)
                c->deferred_tail->next = q;
        else
                c->deferred_head = q;
        c->deferred_tail = q;
        if (!c->reaper_started && pthread_create(&c->reaper, NULL, reaper_main, c) == 0)
                c->reaper_started = true;
        /* Without a reaper thread the next call of this handle still frees the block. */
        pthread_cond_signal(&c->deferred_cond);
        return 0;
}

/* Frees q's block into the process's pool and recycles its event. Locked. */
static void complete(gpupool_client *c, struct deferred *q) {
        client_cuda_event_put(c, &c->devices[q->device], q->event);
        if (q->block)
                (void) client_free_block(c, q->block);
        free(q);
}

void client_stream_reap(gpupool_client *c, bool wait) {
        struct deferred **pp = &c->deferred_head, *q;

        while ((q = *pp)) {
                if (!client_cuda_event_done(c, &c->devices[q->device], q->event, wait)) {
                        pp = &q->next;
                        continue;
                }
                *pp = q->next;
                complete(c, q);
        }
        c->deferred_tail = NULL;
        for (q = c->deferred_head; q; q = q->next)
                c->deferred_tail = q;
}

static void *reaper_main(void *arg) {
        gpupool_client *c = arg;

        pthread_mutex_lock(&c->lock);
        for (;;) {
                struct deferred *oldest;
                struct client_device *d;
                gp_cu_context ctx;
                gp_cu_event e;

                while (!c->stopping && !c->deferred_head)
                        pthread_cond_wait(&c->deferred_cond, &c->lock);
                if (c->stopping)
                        break;
                oldest = c->deferred_head;
                d = &c->devices[oldest->device];
                e = oldest->event;
                /*
                 * Wait without the lock, so the application's calls go on meanwhile. Another
                 * thread may complete this free and reuse the event meanwhile, which only makes
                 * this wait end sooner or later; events are destroyed only after we are joined.
                 * The driver is called directly: nothing here may touch the handle's error.
                 */
                pthread_mutex_unlock(&c->lock);
                if (c->cu.cuCtxPushCurrent(d->ctx) == GP_CUDA_SUCCESS) {
                        (void) c->cu.cuEventSynchronize(e);
                        (void) c->cu.cuCtxPopCurrent(&ctx);
                }
                pthread_mutex_lock(&c->lock);
                client_stream_reap(c, false);
        }
        pthread_mutex_unlock(&c->lock);
        return NULL;
}

void client_stream_forget(gpupool_client *c) {
        struct deferred *q;

        while ((q = c->deferred_head)) {
                c->deferred_head = q->next;
                /* Its block, live and marked freeing, goes with the live table (client_live_forget()). */
                client_cuda_event_put(c, &c->devices[q->device], q->event);
                free(q);
        }
        c->deferred_tail = NULL;
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
