/*
 * fakecuda_stream.c: the fake driver's streams and events, with the rules fakecuda.c's top
 * comment lists: streams that run their work in order on worker threads, the legacy default
 * stream's ordering, events as points in a stream's sequence, waits that spin unless an event
 * was made with CU_EVENT_BLOCKING_SYNC, objects of one context refused in another, and graph
 * capture with the modes of cuThreadExchangeStreamCaptureMode. The synchronous and
 * asynchronous memsets are work of a stream, so they are here too; so are the test hooks
 * that hold a stream's work or fail every event query.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "fake.h"

#define MAX_STREAMS 256
#define EVENT_MAGIC 0x45564e54u         /* "EVNT" */

enum op_kind { OP_MEMSET8, OP_MEMSET32, OP_NOP };

/* An operation of a stream waits for another stream's work up to seq (the legacy stream's rules). */
struct op_wait {
        unsigned long long stream_id;
        uint64_t seq;
};

struct op {
        struct op *next;
        enum op_kind kind;
        uint8_t *dst;
        uint32_t value;
        size_t n;
        unsigned nwaits;
        struct op_wait *waits;
};

enum capture { CAPTURE_NONE, CAPTURE_ACTIVE, CAPTURE_INVALIDATED };

struct stream {
        struct stream *next;            /* every stream of the process, destroyed ones still running too */
        pthread_t worker;
        struct op *head, *tail;
        uint64_t submitted, done;
        unsigned long long id;          /* cuStreamGetId: never reused in the process */
        struct ctx *ctx;                /* the context it was made in */
        bool held, closing, blocking;
        bool legacy;                    /* the context's legacy default stream (NULL, CU_STREAM_LEGACY) */
        uint64_t run_to;                /* held: operations may still run until done reaches this */
        enum capture capture;
        int capture_mode;
        pthread_t capture_thread;
};

struct event {
        struct event *next;
        struct ctx *ctx;                /* the context it was made in */
        unsigned flags;
        struct stream *stream;          /* NULL: complete */
        uint64_t seq;
        bool captured;                  /* last recorded inside a capture */
        int waiters;                    /* threads in cuEventSynchronize on it */
        uint32_t magic;                 /* EVENT_MAGIC while it lives; destroyed events are kept, zeroed */
};

static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static struct stream *streams;
static struct event *events;
static struct event *destroyed_events;      /* kept for the process's life (see cuEventDestroy) */
static unsigned long long event_queries;        /* cuEventQuery calls (test hook) */
static unsigned long long event_records;        /* cuEventRecord calls that recorded (test hook) */
static CUresult event_failure;                  /* what event queries and waits return instead (test hook) */

/* Capture sequences begun in CU_STREAM_CAPTURE_MODE_GLOBAL and not yet ended, all threads'. */
static int global_captures;
static __thread int thread_capture_mode;        /* CU_STREAM_CAPTURE_MODE_GLOBAL */
static __thread int thread_captures;            /* begun here, not relaxed, not yet ended */
static __thread int thread_global_captures;     /* of those, begun in global mode */

/*
 * Whether this thread is prohibited from a potentially unsafe call (cuMemAlloc, a
 * synchronization, an event query, an IPC open or close) by a capture under way, as
 * cuThreadExchangeStreamCaptureMode documents the modes. If so, the captures it conflicts
 * with are invalidated, as the driver does. Call locked.
 */
bool capture_forbids(void) {
        bool own, others;

        if (thread_capture_mode == GP_CU_STREAM_CAPTURE_MODE_RELAXED)
                return false;
        own = thread_captures > 0;
        others = thread_capture_mode == GP_CU_STREAM_CAPTURE_MODE_GLOBAL && global_captures > thread_global_captures;
        if (!own && !others)
                return false;
        for (struct stream *s = streams; s; s = s->next) {
                bool mine = pthread_equal(s->capture_thread, pthread_self());

                if (s->capture == CAPTURE_ACTIVE && s->capture_mode != GP_CU_STREAM_CAPTURE_MODE_RELAXED &&
                    (mine || (others && s->capture_mode == GP_CU_STREAM_CAPTURE_MODE_GLOBAL)))
                        s->capture = CAPTURE_INVALIDATED;
        }
        return true;
}

/*
 * A stream's handle is the address of its slot; a new stream takes the lowest free slot, so a
 * handle comes back once its stream was destroyed, as handles may with the driver. Only
 * cuStreamGetId tells two streams of one handle apart.
 */
static struct stream *slots[MAX_STREAMS];
static char slot_handles[MAX_STREAMS];
static unsigned long long next_stream_id = 1;
#define IS_DEFAULT_STREAM(h) ((uintptr_t) (h) <= 2)    /* NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD */

static struct stream *legacy_streams[MAX_GPUS];                /* by physical GPU: its context's legacy stream */
static __thread struct stream *per_thread_streams[MAX_GPUS];    /* this thread's CU_STREAM_PER_THREAD */
static void *stream_worker(void *arg);

/* Starts a stream of ctx: its worker, its id, its place in the list. NULL when out of resources. Call locked. */
static struct stream *stream_start(struct ctx *ctx, bool blocking) {
        struct stream *s = calloc(1, sizeof(*s));

        if (!s)
                return NULL;
        s->ctx = ctx;
        s->blocking = blocking;
        if (pthread_create(&s->worker, NULL, stream_worker, s) != 0) {
                free(s);
                return NULL;
        }
        pthread_detach(s->worker);
        s->id = next_stream_id++;
        s->next = streams;
        streams = s;
        return s;
}

/*
 * The stream behind a handle, or NULL. The default streams are streams too, of the current
 * context, made at first use: the legacy stream (NULL, CU_STREAM_LEGACY), which waits for the
 * work of every blocking stream of its context and which they wait for, and each thread's
 * CU_STREAM_PER_THREAD, a blocking stream. Call locked.
 */
static struct stream *stream_of(gp_cu_stream h) {
        const char *p = (const char *) h;
        struct ctx *x = current();
        struct stream **slot;

        if (IS_DEFAULT_STREAM(h)) {
                if (!x)
                        return NULL;
                slot = (uintptr_t) h == 2 ? &per_thread_streams[x->gpu] : &legacy_streams[x->gpu];
                if (!*slot || (*slot)->ctx != x) {
                        *slot = stream_start(x, true);
                        if (*slot)
                                (*slot)->legacy = (uintptr_t) h != 2;
                }
                return *slot;
        }
        if (p < slot_handles || p >= slot_handles + MAX_STREAMS)
                return NULL;
        return slots[p - slot_handles];
}

/*
 * What an operation queued on s now waits for, by the legacy stream's rules: on the legacy
 * stream, the work queued so far on every blocking stream of its context; on a blocking
 * stream, the work queued so far on the legacy stream. A non-blocking stream waits for
 * nothing. Fills op's waits. Returns false when out of memory. Call locked.
 */
static bool orders_after(const struct stream *s, const struct stream *t) {
        return s->blocking && t != s && t->ctx == s->ctx && t->done < t->submitted && (s->legacy ? t->blocking : t->legacy);
}

static unsigned stream_wait_count(const struct stream *s) {
        unsigned n = 0;

        for (const struct stream *t = streams; t; t = t->next)
                n += orders_after(s, t);
        return n;
}

static bool stream_waits(const struct stream *s, struct op *op) {
        unsigned n = stream_wait_count(s);

        op->nwaits = 0;
        op->waits = NULL;
        if (!n)
                return true;
        op->waits = calloc(n, sizeof(*op->waits));
        if (!op->waits)
                return false;
        for (const struct stream *t = streams; t; t = t->next)
                if (orders_after(s, t))
                        op->waits[op->nwaits++] = (struct op_wait) { .stream_id = t->id, .seq = t->submitted };
        return true;
}

/* Queues op on s after what it waits for. Returns false when out of memory (op is the caller's). Call locked. */
static bool stream_push(struct stream *s, struct op *op) {
        if (!stream_waits(s, op))
                return false;
        if (s->tail)
                s->tail->next = op;
        else
                s->head = op;
        s->tail = op;
        s->submitted++;
        pthread_cond_broadcast(&cond);
        return true;
}

/*
 * Makes what comes next on s (an event's point) wait, as work would, for what the legacy
 * stream's rules order it after: a no-op on s, if there is anything to wait for. Call locked.
 */
static CUresult stream_fence(struct stream *s) {
        struct op *op;

        if (stream_wait_count(s) == 0)
                return GP_CUDA_SUCCESS;
        op = calloc(1, sizeof(*op));
        if (!op)
                return GP_CUDA_ERROR_OUT_OF_MEMORY;
        op->kind = OP_NOP;
        if (!stream_push(s, op)) {
                free(op);
                return GP_CUDA_ERROR_OUT_OF_MEMORY;
        }
        return GP_CUDA_SUCCESS;
}

static bool stream_idle(const void *arg);
static void wait_until(bool (*done)(const void *arg), const void *arg, bool blocking);

/* Waits (spinning, as the driver does) until the legacy stream has run what was queued before, in its order. */
CUresult legacy_synchronize(void) {
        struct stream *s;
        CUresult r;

        pthread_mutex_lock(&lock);
        s = stream_of(NULL);
        r = s ? stream_fence(s) : GP_CUDA_ERROR_OUT_OF_MEMORY;
        if (r == GP_CUDA_SUCCESS)
                wait_until(stream_idle, s, false);
        pthread_mutex_unlock(&lock);
        return r;
}

/* Whether every stream op waits for has run that far (or has drained and gone). Call locked. */
static bool op_ready(const struct op *op) {
        for (unsigned i = 0; i < op->nwaits; i++)
                for (const struct stream *t = streams; t; t = t->next)
                        if (t->id == op->waits[i].stream_id && t->done < op->waits[i].seq)
                                return false;
        return true;
}

/*
 * Waits until done(arg), locked. With blocking, the thread sleeps on the condition; without,
 * it spins, as the driver's waits do in a context of the default CU_CTX_SCHED_AUTO with fewer
 * contexts than cores (and yields in a loop with more, which costs a core just the same):
 * only an event made with CU_EVENT_BLOCKING_SYNC waits asleep.
 */
static void wait_until(bool (*done)(const void *arg), const void *arg, bool blocking) {
        while (!done(arg)) {
                if (blocking) {
                        pthread_cond_wait(&cond, &lock);
                } else {
                        pthread_mutex_unlock(&lock);
                        sched_yield();
                        pthread_mutex_lock(&lock);
                }
        }
}

static bool stream_idle(const void *arg) {
        const struct stream *s = arg;

        return s->done >= s->submitted;
}

static bool ctx_idle(const void *arg) {
        for (struct stream *s = streams; s; s = s->next)
                if (s->ctx == arg && s->done < s->submitted)
                        return false;
        return true;
}

/*
 * While any process holds an exclusive flock() on $FAKECUDA_DIR/fakecuda-memsets.hold, every
 * memset on every stream, in every process, waits before it runs: how a test holds the
 * daemon's zeroing on the device from outside the daemon.
 */
static void memset_gate(void) {
        char path[512];
        int fd;

        snprintf(path, sizeof(path), "%s/fakecuda-memsets.hold", mem_dir());
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return;
        (void) flock(fd, LOCK_SH);
        close(fd);
}

/* Runs a stream's operations in order. A destroyed stream finishes its work, then frees itself. */
static void *stream_worker(void *arg) {
        struct stream *s = arg;

        pthread_mutex_lock(&lock);
        for (;;) {
                struct op *op;

                while ((s->held && s->done >= s->run_to) || (!s->head && !s->closing))
                        pthread_cond_wait(&cond, &lock);
                if (!s->head)
                        break;          /* closing, and nothing left */
                op = s->head;
                if (!op_ready(op)) {
                        pthread_cond_wait(&cond, &lock);
                        continue;
                }
                pthread_mutex_unlock(&lock);
                if (op->kind == OP_MEMSET8) {
                        memset_gate();
                        memset(op->dst, (int) op->value, op->n);
                } else if (op->kind == OP_MEMSET32) {
                        memset_gate();
                        for (size_t i = 0; i < op->n; i++)
                                ((uint32_t *) op->dst)[i] = op->value;
                }
                pthread_mutex_lock(&lock);
                s->head = op->next;
                if (!s->head)
                        s->tail = NULL;
                s->done++;
                free(op->waits);
                free(op);
                pthread_cond_broadcast(&cond);
        }
        /* Destroyed and drained: nothing refers to it any more. */
        for (struct stream **pp = &streams; *pp; pp = &(*pp)->next)
                if (*pp == s) {
                        *pp = s->next;
                        break;
                }
        for (struct event *e = events; e; e = e->next)
                if (e->stream == s)
                        e->stream = NULL;
        pthread_cond_broadcast(&cond);
        pthread_mutex_unlock(&lock);
        free(s);
        return NULL;
}

CUresult fk_StreamCreate(gp_cu_stream *ret, unsigned flags) {
        struct stream *s;
        int slot = -1;

        NEED_CTX();
        if (!ret || flags > GP_CU_STREAM_NON_BLOCKING)
                return GP_CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&lock);
        for (int i = 0; i < MAX_STREAMS && slot < 0; i++)
                if (!slots[i])
                        slot = i;
        s = slot < 0 ? NULL : stream_start(current(), !(flags & GP_CU_STREAM_NON_BLOCKING));
        if (!s) {
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_OUT_OF_MEMORY;
        }
        slots[slot] = s;
        pthread_mutex_unlock(&lock);
        *ret = (gp_cu_stream) &slot_handles[slot];
        return GP_CUDA_SUCCESS;
}

/* As the driver: returns at once; the stream's queued work still runs, and its handle may come back. */
CUresult fk_StreamDestroy_v2(gp_cu_stream hs) {
        struct stream *s;

        NEED_CTX();
        if (IS_DEFAULT_STREAM(hs))
                return GP_CUDA_ERROR_INVALID_HANDLE;
        pthread_mutex_lock(&lock);
        s = stream_of(hs);
        if (!s || s->capture != CAPTURE_NONE) {
                pthread_mutex_unlock(&lock);
                return s ? GP_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : GP_CUDA_ERROR_INVALID_HANDLE;
        }
        slots[(const char *) hs - slot_handles] = NULL;
        s->closing = true;
        pthread_cond_broadcast(&cond);
        pthread_mutex_unlock(&lock);
        return GP_CUDA_SUCCESS;
}

CUresult fk_StreamGetId(gp_cu_stream hs, unsigned long long *id) {
        struct stream *s;
        CUresult r = ready();

        if (r)
                return r;
        if (!id)
                return GP_CUDA_ERROR_INVALID_VALUE;
        /* A default stream is the current context's: none without one. Each has an id of its own. */
        if (IS_DEFAULT_STREAM(hs) && !current())
                return GP_CUDA_ERROR_INVALID_CONTEXT;
        pthread_mutex_lock(&lock);
        s = stream_of(hs);
        if (s && s->capture != CAPTURE_NONE) {
                /* As the driver does (580): refused on a capturing stream, in any mode, and the capture is lost. */
                s->capture = CAPTURE_INVALIDATED;
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
        if (s)
                *id = s->id;
        pthread_mutex_unlock(&lock);
        return s ? GP_CUDA_SUCCESS : GP_CUDA_ERROR_INVALID_HANDLE;
}

/* The context a stream was made in; a default stream's is the current context (none: INVALID_CONTEXT). */
CUresult fk_StreamGetCtx(gp_cu_stream hs, gp_cu_context *ret) {
        struct stream *s;
        CUresult r = ready();

        if (r)
                return r;
        if (!ret)
                return GP_CUDA_ERROR_INVALID_VALUE;
        if (IS_DEFAULT_STREAM(hs) && !current())
                return GP_CUDA_ERROR_INVALID_CONTEXT;
        pthread_mutex_lock(&lock);
        if ((s = stream_of(hs)))
                *ret = (gp_cu_context) s->ctx;
        pthread_mutex_unlock(&lock);
        return s ? GP_CUDA_SUCCESS : GP_CUDA_ERROR_INVALID_HANDLE;
}

CUresult fk_StreamSynchronize(gp_cu_stream hs) {
        struct stream *s;
        CUresult r = ready();

        if (r)
                return r;
        NO_UNSAFE_CALL_IN_CAPTURE();
        if (IS_DEFAULT_STREAM(hs) && !current())
                return GP_CUDA_ERROR_INVALID_CONTEXT;
        pthread_mutex_lock(&lock);
        s = stream_of(hs);
        if (!s) {
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_INVALID_HANDLE;
        }
        if (s->capture != CAPTURE_NONE) {
                s->capture = CAPTURE_INVALIDATED;
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
        wait_until(stream_idle, s, false);
        pthread_mutex_unlock(&lock);
        return GP_CUDA_SUCCESS;
}

/* Waits for every stream of the current context, spinning as the driver does by default. */
CUresult fk_CtxSynchronize(void) {
        NEED_CTX();
        NO_UNSAFE_CALL_IN_CAPTURE();
        pthread_mutex_lock(&lock);
        wait_until(ctx_idle, current(), false);
        pthread_mutex_unlock(&lock);
        return GP_CUDA_SUCCESS;
}

CUresult fk_StreamBeginCapture(gp_cu_stream hs, int mode) {
        struct stream *s;

        NEED_CTX();
        if (mode < GP_CU_STREAM_CAPTURE_MODE_GLOBAL || mode > GP_CU_STREAM_CAPTURE_MODE_RELAXED)
                return GP_CUDA_ERROR_INVALID_VALUE;
        if (IS_DEFAULT_STREAM(hs))
                return GP_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;       /* the legacy stream cannot be captured */
        pthread_mutex_lock(&lock);
        s = stream_of(hs);
        if (!s || s->capture != CAPTURE_NONE) {
                pthread_mutex_unlock(&lock);
                return s ? GP_CUDA_ERROR_ILLEGAL_STATE : GP_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
        s->capture = CAPTURE_ACTIVE;
        s->capture_mode = mode;
        s->capture_thread = pthread_self();
        if (mode != GP_CU_STREAM_CAPTURE_MODE_RELAXED)
                thread_captures++;
        if (mode == GP_CU_STREAM_CAPTURE_MODE_GLOBAL) {
                thread_global_captures++;
                global_captures++;
        }
        pthread_mutex_unlock(&lock);
        return GP_CUDA_SUCCESS;
}

CUresult fk_GraphDestroy(void *graph) {
        return graph ? GP_CUDA_SUCCESS : GP_CUDA_ERROR_INVALID_VALUE;
}

/* Ends a capture; the graph is a token (the fake launches no graphs). */
CUresult fk_StreamEndCapture(gp_cu_stream hs, void **graph) {
        static char graph_token;
        enum capture was;
        struct stream *s;

        NEED_CTX();
        pthread_mutex_lock(&lock);
        s = stream_of(hs);
        if (!s || s->capture == CAPTURE_NONE) {
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_ILLEGAL_STATE;
        }
        if (s->capture_mode != GP_CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(s->capture_thread, pthread_self())) {
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
        }
        was = s->capture;
        if (s->capture_mode != GP_CU_STREAM_CAPTURE_MODE_RELAXED)
                thread_captures--;
        if (s->capture_mode == GP_CU_STREAM_CAPTURE_MODE_GLOBAL) {
                thread_global_captures--;
                global_captures--;
        }
        s->capture = CAPTURE_NONE;
        pthread_mutex_unlock(&lock);
        if (graph)
                *graph = was == CAPTURE_ACTIVE ? &graph_token : NULL;
        return was == CAPTURE_ACTIVE ? GP_CUDA_SUCCESS : GP_CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
}

/* Whether a blocking stream of the legacy stream s's context is capturing. Call locked. */
static bool legacy_captured(const struct stream *s) {
        for (const struct stream *t = streams; t; t = t->next)
                if (t != s && t->ctx == s->ctx && t->blocking && t->capture == CAPTURE_ACTIVE)
                        return true;
        return false;
}

CUresult fk_StreamIsCapturing(gp_cu_stream hs, int *status) {
        struct stream *s;
        CUresult r = ready();

        if (r)
                return r;
        if (!status)
                return GP_CUDA_ERROR_INVALID_VALUE;
        if (IS_DEFAULT_STREAM(hs) && !current())
                return GP_CUDA_ERROR_INVALID_CONTEXT;
        pthread_mutex_lock(&lock);
        s = stream_of(hs);
        /* As cuda.h says: the legacy stream while a blocking stream of its context captures (which goes on). */
        if (s && s->legacy && legacy_captured(s)) {
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        }
        if (s)
                *status = s->capture == CAPTURE_ACTIVE ? GP_CU_STREAM_CAPTURE_STATUS_ACTIVE :
                          s->capture == CAPTURE_INVALIDATED ? GP_CU_STREAM_CAPTURE_STATUS_INVALIDATED :
                          GP_CU_STREAM_CAPTURE_STATUS_NONE;
        pthread_mutex_unlock(&lock);
        return s ? GP_CUDA_SUCCESS : GP_CUDA_ERROR_INVALID_HANDLE;
}

CUresult fk_ThreadExchangeStreamCaptureMode(int *mode) {
        int old;

        if (!mode || *mode < GP_CU_STREAM_CAPTURE_MODE_GLOBAL || *mode > GP_CU_STREAM_CAPTURE_MODE_RELAXED)
                return GP_CUDA_ERROR_INVALID_VALUE;
        old = thread_capture_mode;
        thread_capture_mode = *mode;
        *mode = old;
        return GP_CUDA_SUCCESS;
}

static CUresult enqueue(gp_cu_stream hs, enum op_kind kind, CUdeviceptr p, uint32_t value, size_t n, size_t bytes) {
        struct stream *s;
        struct op *op;
        uint8_t *h;
        CUresult r;

        NEED_CTX();
        if ((r = bytes_at(p, bytes, true, &h)))
                return r;
        op = calloc(1, sizeof(*op));
        if (!op)
                return GP_CUDA_ERROR_OUT_OF_MEMORY;
        *op = (struct op) { .kind = kind, .dst = h, .value = value, .n = n };
        pthread_mutex_lock(&lock);
        s = stream_of(hs);
        if (!s || s->ctx != current() || s->capture != CAPTURE_NONE) {
                /* Another context's stream is refused; work captured becomes a graph node, not run now. */
                r = !s || s->ctx != current() ? GP_CUDA_ERROR_INVALID_HANDLE : GP_CUDA_SUCCESS;
                pthread_mutex_unlock(&lock);
                free(op);
                return r;
        }
        if (!stream_push(s, op)) {
                pthread_mutex_unlock(&lock);
                free(op);
                return GP_CUDA_ERROR_OUT_OF_MEMORY;
        }
        pthread_mutex_unlock(&lock);
        return GP_CUDA_SUCCESS;
}

CUresult fk_MemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, gp_cu_stream s) {
        return enqueue(s, OP_MEMSET8, p, v, n, n);
}

CUresult fk_MemsetD32Async(CUdeviceptr p, unsigned v, size_t n, gp_cu_stream s) {
        if (p % 4 || n > SIZE_MAX / 4)
                return GP_CUDA_ERROR_INVALID_VALUE;
        return enqueue(s, OP_MEMSET32, p, v, n, n * 4);
}

/*
 * The synchronous memsets go to the legacy stream and return at once for device memory (the
 * driver's "API synchronization behavior").
 */
CUresult fk_MemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n) {
        NEED_CTX();
        NO_UNSAFE_CALL_IN_CAPTURE();
        return enqueue(NULL, OP_MEMSET8, p, v, n, n);
}

CUresult fk_MemsetD32_v2(CUdeviceptr p, unsigned v, size_t n) {
        NEED_CTX();
        NO_UNSAFE_CALL_IN_CAPTURE();
        if (p % 4 || n > SIZE_MAX / 4)
                return GP_CUDA_ERROR_INVALID_VALUE;
        return enqueue(NULL, OP_MEMSET32, p, v, n, n * 4);
}

/* O(1), so that the fake's query costs what the driver's does, however many events live. */
static bool valid_event(struct event *e) {
        return e && e->magic == EVENT_MAGIC;
}

CUresult fk_EventCreate(gp_cu_event *ret, unsigned flags) {
        struct event *e;

        NEED_CTX();
        if (!ret || (flags & ~0xfu))
                return GP_CUDA_ERROR_INVALID_VALUE;
        e = calloc(1, sizeof(*e));
        if (!e)
                return GP_CUDA_ERROR_OUT_OF_MEMORY;
        e->ctx = current();
        e->flags = flags;
        e->magic = EVENT_MAGIC;
        pthread_mutex_lock(&lock);
        e->next = events;
        events = e;
        pthread_mutex_unlock(&lock);
        *ret = (gp_cu_event) e;
        return GP_CUDA_SUCCESS;
}

/* As the driver: the event and the stream must be of one context, the current one for a default stream. */
CUresult fk_EventRecord(gp_cu_event he, gp_cu_stream hs) {
        struct event *e = (struct event *) he;
        struct stream *s;
        CUresult r = ready();

        if (r)
                return r;
        pthread_mutex_lock(&lock);
        s = stream_of(hs);
        if (!s && !current())
                r = GP_CUDA_ERROR_INVALID_CONTEXT;
        else if (!valid_event(e) || (!IS_DEFAULT_STREAM(hs) && !s) || (s ? s->ctx : current()) != e->ctx)
                r = GP_CUDA_ERROR_INVALID_HANDLE;
        if (r) {
                pthread_mutex_unlock(&lock);
                return r;
        }
        /* Recorded in a capture, it is a node of the graph: it stands for no work of the stream now. */
        e->captured = s && s->capture != CAPTURE_NONE;
        /* An event is work of its stream: it comes after what the legacy stream's rules order it after. */
        if (!e->captured && s && (r = stream_fence(s)) != GP_CUDA_SUCCESS) {
                pthread_mutex_unlock(&lock);
                return r;
        }
        /* The event completes when everything queued on s so far has run. */
        e->stream = e->captured ? NULL : s;
        e->seq = s ? s->submitted : 0;
        event_records++;
        pthread_mutex_unlock(&lock);
        return GP_CUDA_SUCCESS;
}

static bool event_done(const void *arg) {
        const struct event *e = arg;

        return !e->stream || e->stream->done >= e->seq;
}

CUresult fk_EventQuery(gp_cu_event he) {
        struct event *e = (struct event *) he;
        CUresult r = ready();

        if (r)
                return r;
        NO_UNSAFE_CALL_IN_CAPTURE();
        pthread_mutex_lock(&lock);
        event_queries++;
        if (!valid_event(e))
                r = GP_CUDA_ERROR_INVALID_HANDLE;
        else if (event_failure)
                r = event_failure;
        else if (e->captured)
                r = GP_CUDA_ERROR_CAPTURED_EVENT;
        else
                r = event_done(e) ? GP_CUDA_SUCCESS : GP_CUDA_ERROR_NOT_READY;
        pthread_mutex_unlock(&lock);
        return r;
}

/* Sleeps only for an event made with CU_EVENT_BLOCKING_SYNC; spins otherwise, as the driver does. */
CUresult fk_EventSynchronize(gp_cu_event he) {
        struct event *e = (struct event *) he;
        CUresult r = ready();

        if (r)
                return r;
        NO_UNSAFE_CALL_IN_CAPTURE();
        pthread_mutex_lock(&lock);
        if (!valid_event(e) || e->captured) {
                pthread_mutex_unlock(&lock);
                return e && valid_event(e) ? GP_CUDA_ERROR_CAPTURED_EVENT : GP_CUDA_ERROR_INVALID_HANDLE;
        }
        if (event_failure) {
                r = event_failure;
                pthread_mutex_unlock(&lock);
                return r;
        }
        e->waiters++;
        wait_until(event_done, e, e->flags & GP_CU_EVENT_BLOCKING_SYNC);
        e->waiters--;
        pthread_mutex_unlock(&lock);
        return GP_CUDA_SUCCESS;
}

CUresult fk_EventDestroy_v2(gp_cu_event he) {
        struct event *e = (struct event *) he;
        CUresult r = ready();

        if (r)
                return r;
        pthread_mutex_lock(&lock);
        for (struct event **pp = &events; *pp; pp = &(*pp)->next)
                if (*pp == e) {
                        *pp = e->next;
                        if (e->waiters)
                                fatal("cuEventDestroy of an event another thread waits for in cuEventSynchronize "
                                      "(the wait may never end)");
                        /* Kept, not freed: a later use of the handle is then refused, not undefined. */
                        e->magic = 0;
                        e->next = destroyed_events;
                        destroyed_events = e;
                        pthread_mutex_unlock(&lock);
                        return GP_CUDA_SUCCESS;
                }
        pthread_mutex_unlock(&lock);
        return GP_CUDA_ERROR_INVALID_HANDLE;
}

/* ---- test hooks (not CUDA) ---- */

/* Stops (hold != 0) or restarts a stream's worker: its queued work waits until released. */
EXPORT int fakecuda_stream_hold(gp_cu_stream hs, int hold) {
        struct stream *s;
        int r = -1;

        pthread_mutex_lock(&lock);
        s = stream_of(hs);
        if (s) {
                s->held = hold != 0;
                pthread_cond_broadcast(&cond);
                r = 0;
        }
        pthread_mutex_unlock(&lock);
        return r;
}

/*
 * Lets a held stream run exactly n more of its queued operations and returns once they have
 * run (0), so that a test can complete some of a stream's work and not the rest. -1 when the
 * stream is not held or has fewer than n operations queued.
 */
EXPORT int fakecuda_stream_run(gp_cu_stream hs, unsigned n) {
        struct stream *s;
        uint64_t target;
        int r = -1;

        pthread_mutex_lock(&lock);
        s = stream_of(hs);
        if (s && s->held && s->done >= s->run_to && s->submitted - s->done >= n) {
                target = s->done + n;
                s->run_to = target;
                pthread_cond_broadcast(&cond);
                while (s->done < target)
                        pthread_cond_wait(&cond, &lock);
                r = 0;
        }
        pthread_mutex_unlock(&lock);
        return r;
}

/* Releases every held stream, destroyed ones too (their work still runs). */
EXPORT void fakecuda_release_all(void) {
        pthread_mutex_lock(&lock);
        for (struct stream *s = streams; s; s = s->next)
                s->held = false;
        pthread_cond_broadcast(&cond);
        pthread_mutex_unlock(&lock);
}

/* How many events this process recorded (cuEventRecord that succeeded). */
EXPORT unsigned long long fakecuda_event_records(void) {
        return counted(&event_records);
}

/* How many times cuEventQuery was called in this process. */
EXPORT unsigned long long fakecuda_event_queries(void) {
        return counted(&event_queries);
}

/* From now on event queries and waits fail with r (0: work again), as on a context lost to a fault. */
EXPORT void fakecuda_fail_events(int r) {
        pthread_mutex_lock(&lock);
        event_failure = r;
        pthread_cond_broadcast(&cond);
        pthread_mutex_unlock(&lock);
}

/* The entry points above under the names libcuda.so.1 exports them by (fake.h, FK_EXPORT). */
FK_EXPORT(cuCtxSynchronize, fk_CtxSynchronize);
FK_EXPORT(cuEventCreate, fk_EventCreate);
FK_EXPORT(cuEventDestroy_v2, fk_EventDestroy_v2);
FK_EXPORT(cuEventQuery, fk_EventQuery);
FK_EXPORT(cuEventRecord, fk_EventRecord);
FK_EXPORT(cuEventSynchronize, fk_EventSynchronize);
FK_EXPORT(cuGraphDestroy, fk_GraphDestroy);
FK_EXPORT(cuMemsetD32Async, fk_MemsetD32Async);
FK_EXPORT(cuMemsetD32_v2, fk_MemsetD32_v2);
FK_EXPORT(cuMemsetD8Async, fk_MemsetD8Async);
FK_EXPORT(cuMemsetD8_v2, fk_MemsetD8_v2);
FK_EXPORT(cuStreamBeginCapture_v2, fk_StreamBeginCapture);
FK_EXPORT(cuStreamCreate, fk_StreamCreate);
FK_EXPORT(cuStreamDestroy_v2, fk_StreamDestroy_v2);
FK_EXPORT(cuStreamEndCapture, fk_StreamEndCapture);
FK_EXPORT(cuStreamGetId, fk_StreamGetId);
FK_EXPORT(cuStreamGetCtx, fk_StreamGetCtx);
FK_EXPORT(cuStreamIsCapturing, fk_StreamIsCapturing);
FK_EXPORT(cuStreamSynchronize, fk_StreamSynchronize);
FK_EXPORT(cuThreadExchangeStreamCaptureMode, fk_ThreadExchangeStreamCaptureMode);
