/*
 * client_tcache.c: each thread's cache of the small blocks it freed, in front of the process's
 * pool. A thread that frees a small block keeps it, still carved from its segment, and its
 * next allocation of the same size and device takes it back without the handle's lock: the
 * threads of one handle then meet only on a live shard's lock, not on the pool's.
 *
 * A cache holds at most TCACHE_BLOCKS blocks of at most TCACHE_MAX_BLOCK bytes each and
 * TCACHE_MAX_BYTES in all, newest last; the oldest goes to the pool when a new one does not
 * fit. Small enough that what the caches park changes no trace's peak of make bench-replay
 * (larger ones, 64 KiB blocks and 512 KiB in all, cost two of them a segment more). The handle empties the caches into its pool when the daemon asks for
 * memory back, on gpupool_trim() and before it asks again after a refusal, and each second the
 * caches of threads that did not use them since the last second, or that exited. What a cache
 * holds counts neither as in use nor as free in what the process tells the daemon: it is the
 * pool's, only parked.
 *
 * A thread gets its cache on its first allocation that takes the handle's lock: a thread that
 * only frees (blocks another one allocated) parks nothing, since only the cache's own thread
 * takes from it. A cache is the handle's and its thread's (refs): the handle lists it
 * (c->tcaches, under the handle's lock), the thread finds it through a thread-local pointer,
 * and whichever lets go last frees it. The lock order is the handle's, then a cache's; a thread on its fast path
 * takes its cache's lock alone (uncontended but for a drain) and then a live shard's.
 */
#include "client_tcache.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define TCACHE_BLOCKS 32
#define TCACHE_MAX_BLOCK (16ULL << 10)
#define TCACHE_MAX_BYTES (256ULL << 10)

struct tcache {
        pthread_mutex_t lock;           /* all below but next */
        const gpupool_client *client;   /* whose: compared, never followed, by the thread */
        uint64_t serial;                /* the handle's serial, against a new handle at a freed one's address */
        unsigned count;
        uint64_t bytes;
        struct block *blocks[TCACHE_BLOCKS];    /* oldest first */
        uint64_t uses, uses_seen;       /* bumped on each take and put; as the last drain saw it */
        bool dead;                      /* its handle let go of it (disconnect): the thread makes another */
        bool thread_gone;               /* its thread exited: the handle drains and frees it */
        unsigned refs;                  /* atomic: its handle's and its thread's */
        struct tcache *next;            /* the handle's caches, under the handle's lock */
};

static pthread_key_t tcache_key;        /* its destructor tells a cache its thread exited */
static pthread_once_t tcache_once = PTHREAD_ONCE_INIT;
static bool tcache_key_ok;
static __thread struct tcache *my_cache;

static void release(struct tcache *t) {
        if (__atomic_sub_fetch(&t->refs, 1, __ATOMIC_ACQ_REL) == 0) {
                pthread_mutex_destroy(&t->lock);
                free(t);
        }
}

static void thread_exit(void *arg) {
        struct tcache *t = arg;

        pthread_mutex_lock(&t->lock);
        t->thread_gone = true;
        pthread_mutex_unlock(&t->lock);
        my_cache = NULL;
        release(t);
}

/* In a forked child: the cache is of a handle the child does not share (its locks and threads are the parent's). */
static void forget_in_child(void) {
        my_cache = NULL;
}

/* The key's destructor stays loaded: libgpupool is linked -z nodelete. */
static void tcache_setup(void) {
        tcache_key_ok = pthread_key_create(&tcache_key, thread_exit) == 0;
        (void) pthread_atfork(NULL, NULL, forget_in_child);
}

/* This thread's cache for c, or NULL. */
static struct tcache *mine(const gpupool_client *c) {
        struct tcache *t = my_cache;

        return t && t->client == c && t->serial == c->serial ? t : NULL;
}

void client_tcache_adopt(gpupool_client *c) {
        struct tcache *t = my_cache;

        if (t && t->client == c && t->serial == c->serial)
                return;
        if (t) {
                bool dead;

                pthread_mutex_lock(&t->lock);
                dead = t->dead;
                pthread_mutex_unlock(&t->lock);
                if (!dead)
                        return;
                my_cache = NULL;
                if (tcache_key_ok)
                        (void) pthread_setspecific(tcache_key, NULL);
                release(t);
        }
        (void) pthread_once(&tcache_once, tcache_setup);
        if (!tcache_key_ok || !(t = calloc(1, sizeof(*t))))
                return;
        pthread_mutex_init(&t->lock, NULL);
        t->client = c;
        t->serial = c->serial;
        t->refs = 2;
        if (pthread_setspecific(tcache_key, t) != 0) {
                pthread_mutex_destroy(&t->lock);
                free(t);
                return;
        }
        t->next = c->tcaches;
        c->tcaches = t;
        my_cache = t;
}

struct block *client_tcache_take(gpupool_client *c, int device, uint64_t rsize) {
        struct tcache *t = mine(c);
        struct block *b = NULL;

        if (!t || rsize > TCACHE_MAX_BLOCK)
                return NULL;
        pthread_mutex_lock(&t->lock);
        for (unsigned i = t->count; i-- > 0;) {
                if (t->blocks[i]->size == rsize && t->blocks[i]->local_device == device) {
                        b = t->blocks[i];
                        memmove(&t->blocks[i], &t->blocks[i + 1], (t->count - i - 1) * sizeof(t->blocks[0]));
                        t->count--;
                        t->bytes -= rsize;
                        t->uses++;
                        break;
                }
        }
        pthread_mutex_unlock(&t->lock);
        return b;
}

struct block *client_tcache_put(gpupool_client *c, struct block *b) {
        struct tcache *t = mine(c);
        struct block *out = NULL;

        if (!t || b->size > TCACHE_MAX_BLOCK)
                return b;
        pthread_mutex_lock(&t->lock);
        /* Checked under the cache's lock: drop_everything() bumps the epoch before it empties the caches. */
        if (b->epoch != __atomic_load_n(&c->epoch, __ATOMIC_ACQUIRE)) {
                pthread_mutex_unlock(&t->lock);
                free(b);
                return NULL;
        }
        if (t->count == TCACHE_BLOCKS || t->bytes + b->size > TCACHE_MAX_BYTES) {
                /* The oldest makes room, or b goes to the pool itself when that would not be enough. */
                if (!t->count || t->bytes - t->blocks[0]->size + b->size > TCACHE_MAX_BYTES) {
                        pthread_mutex_unlock(&t->lock);
                        return b;
                }
                out = t->blocks[0];
                memmove(&t->blocks[0], &t->blocks[1], (t->count - 1) * sizeof(t->blocks[0]));
                t->count--;
                t->bytes -= out->size;
        }
        t->blocks[t->count++] = b;
        t->bytes += b->size;
        t->uses++;
        pthread_mutex_unlock(&t->lock);
        return out;
}

/* Empties caches through to_pool (see client_tcache.h). Locked. */
void client_tcache_drain(gpupool_client *c, bool all, int (*to_pool)(gpupool_client *c, struct block *b)) {
        struct tcache **pt = &c->tcaches, *t;

        while ((t = *pt)) {
                struct block *blocks[TCACHE_BLOCKS];
                unsigned n = 0;
                bool gone;

                pthread_mutex_lock(&t->lock);
                gone = t->thread_gone;
                if (all || gone || t->uses == t->uses_seen) {
                        n = t->count;
                        memcpy(blocks, t->blocks, n * sizeof(blocks[0]));
                        t->count = 0;
                        t->bytes = 0;
                }
                t->uses_seen = t->uses;
                pthread_mutex_unlock(&t->lock);
                for (unsigned i = 0; i < n; i++)
                        (void) to_pool(c, blocks[i]);
                if (gone) {
                        *pt = t->next;
                        release(t);
                } else {
                        pt = &t->next;
                }
        }
}

void client_tcache_forget(gpupool_client *c) {
        for (struct tcache *t = c->tcaches; t; t = t->next) {
                pthread_mutex_lock(&t->lock);
                for (unsigned i = 0; i < t->count; i++)
                        free(t->blocks[i]);
                t->count = 0;
                t->bytes = 0;
                pthread_mutex_unlock(&t->lock);
        }
}

void client_tcache_detach(gpupool_client *c) {
        struct tcache *t;

        client_tcache_forget(c);
        while ((t = c->tcaches)) {
                c->tcaches = t->next;
                pthread_mutex_lock(&t->lock);
                t->dead = true;
                pthread_mutex_unlock(&t->lock);
                if (t == my_cache) {
                        /* The disconnecting thread's own: nothing will use it again. */
                        my_cache = NULL;
                        (void) pthread_setspecific(tcache_key, NULL);
                        release(t);
                }
                release(t);
        }
}

void client_tcache_bytes(gpupool_client *c, uint64_t *per_device, uint64_t *ret_total) {
        uint64_t total = 0;

        if (per_device)
                memset(per_device, 0, CLIENT_MAX_DEVICES * sizeof(per_device[0]));
        for (struct tcache *t = c->tcaches; t; t = t->next) {
                pthread_mutex_lock(&t->lock);
                for (unsigned i = 0; i < t->count; i++) {
                        if (per_device)
                                per_device[t->blocks[i]->mapping->device] += t->blocks[i]->size;
                        total += t->blocks[i]->size;
                }
                pthread_mutex_unlock(&t->lock);
        }
        if (ret_total)
                *ret_total = total;
}
