/*
 * client_magazine.c: the per-thread front of the client cache.
 *
 * Each thread that frees through a handle gets a magazine for it: up to MAGAZINE_ENTRIES
 * cached blocks of at most magazine_max bytes, under a lock of the magazine's own. The thread
 * finds it through a few thread-local slots keyed by the handle's serial, so a cache hit
 * takes that lock (no other thread wants it but to give the cache back) and the lock of one of
 * the live table's shards, and no system call: threads of one handle do not wait for each
 * other in the common case. What does not fit (a full magazine, a big block, the bound
 * reached, an open scope) takes the shared cache's locked path in client_cache.c.
 *
 * A magazine belongs to its thread and to its handle: two references, the last one frees it.
 * A thread lets go when it exits (a pthread key's destructor) or needs the slot for a fifth
 * handle; the handle moves an orphan's blocks to its shared cache at its next tick. A handle
 * lets go at gpupool_disconnect(), after dropping the blocks; the thread's slot then keys a
 * serial nobody has and is reused.
 *
 * Lock order: the handle's lock, then a magazine's, then a shard's. The fast path holds one
 * at a time.
 */
#include "client.h"

#include <stdlib.h>

#define SLOTS 4

struct slot {
        uint64_t serial;
        struct magazine *m;
};

static __thread struct slot slots[SLOTS];
static __thread unsigned next_slot;
static pthread_key_t exit_key;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;
static bool exit_key_made;

static void unref(struct magazine *m) {
        if (__atomic_sub_fetch(&m->refs, 1, __ATOMIC_ACQ_REL) == 0) {
                pthread_mutex_destroy(&m->lock);
                free(m);
        }
}

/* The thread lets go of a slot's magazine: its handle takes the blocks back at its next tick. */
static void let_go(struct slot *s) {
        if (!s->m)
                return;
        __atomic_store_n(&s->m->orphan, true, __ATOMIC_RELEASE);
        unref(s->m);
        s->m = NULL;
        s->serial = 0;
}

static void thread_exit(void *unused) {
        (void) unused;
        for (unsigned i = 0; i < SLOTS; i++)
                let_go(&slots[i]);
}

static void make_exit_key(void) {
        exit_key_made = pthread_key_create(&exit_key, thread_exit) == 0;
}

static struct magazine *find(const gpupool_client *c) {
        for (unsigned i = 0; i < SLOTS; i++)
                if (slots[i].serial == c->serial)
                        return slots[i].m;
        return NULL;
}

/* The calling thread's magazine for c, made on its first free through c; NULL if none can be. */
static struct magazine *magazine_of(gpupool_client *c) {
        struct magazine *m = find(c);
        struct slot *s = NULL;

        if (m)
                return m;
        pthread_once(&exit_once, make_exit_key);
        if (!exit_key_made)
                return NULL;
        m = calloc(1, sizeof(*m));
        if (!m)
                return NULL;
        /* A free slot, else one whose handle let go, else the next in turn. */
        for (unsigned i = 0; i < SLOTS && !s; i++)
                if (!slots[i].m)
                        s = &slots[i];
        for (unsigned i = 0; i < SLOTS && !s; i++)
                if (__atomic_load_n(&slots[i].m->refs, __ATOMIC_ACQUIRE) == 1)
                        s = &slots[i];
        if (!s)
                s = &slots[next_slot++ % SLOTS];
        let_go(s);
        /* Any non-NULL value: the destructor runs at the thread's exit. */
        if (pthread_setspecific(exit_key, slots) != 0) {
                free(m);
                return NULL;
        }
        pthread_mutex_init(&m->lock, NULL);
        m->refs = 2;
        pthread_mutex_lock(&c->lock);
        m->next = c->magazines;
        c->magazines = m;
        pthread_mutex_unlock(&c->lock);
        s->serial = c->serial;
        s->m = m;
        return m;
}

bool client_magazine_alloc(gpupool_client *c, int device, uint64_t rsize, void **ret_ptr) {
        struct magazine *m;
        struct block *b = NULL;
        void *ptr;

        if (!c->magazine_max || __atomic_load_n(&c->scope_depth, __ATOMIC_RELAXED))
                return false;   /* inside a scope the block must carry the scope: the locked path */
        m = find(c);
        if (!m)
                return false;
        pthread_mutex_lock(&m->lock);
        for (unsigned i = m->n; i-- > 0;) {
                if (m->e[i].size == rsize && m->e[i].device == device) {
                        b = m->e[i].block;
                        m->e[i] = m->e[--m->n];
                        m->bytes -= b->size;
                        m->uses++;
                        __atomic_sub_fetch(&c->cached_total, b->size, __ATOMIC_RELAXED);
                        break;
                }
        }
        pthread_mutex_unlock(&m->lock);
        if (!b)
                return false;
        b->scope = 0;
        ptr = b->ptr;
        /* Once inserted another thread may free it, or gpupool_reconnect() forget it: read ptr first. */
        if (client_live_insert(c, b) < 0) {
                free(b);        /* of a session gpupool_reconnect() forgot meanwhile */
                return false;
        }
        *ret_ptr = ptr;
        return true;
}

bool client_magazine_free(gpupool_client *c, struct block *b) {
        struct magazine *m;
        bool ok;

        if (b->size > c->magazine_max || !client_cache_accepts(c, b))
                return false;
        m = magazine_of(c);
        if (!m)
                return false;
        pthread_mutex_lock(&m->lock);
        ok = m->n < MAGAZINE_ENTRIES && b->epoch == __atomic_load_n(&c->epoch, __ATOMIC_ACQUIRE);
        if (ok && __atomic_add_fetch(&c->cached_total, b->size, __ATOMIC_RELAXED) > c->cache_limit) {
                /* At the bound: the locked path gives the least recently freed back first. */
                __atomic_sub_fetch(&c->cached_total, b->size, __ATOMIC_RELAXED);
                ok = false;
        }
        if (ok) {
                m->e[m->n].size = b->size;
                m->e[m->n].device = b->local_device;
                m->e[m->n].block = b;
                m->n++;
                m->bytes += b->size;
                m->uses++;
        }
        pthread_mutex_unlock(&m->lock);
        return ok;
}

/* Empties m: into the shared cache, or (forget) into nothing. Locked, m too. */
static void empty(gpupool_client *c, struct magazine *m, bool forget) {
        for (unsigned i = 0; i < m->n; i++) {
                if (forget)
                        free(m->e[i].block);
                else
                        client_cache_adopt(c, m->e[i].block);
        }
        if (forget)
                __atomic_sub_fetch(&c->cached_total, m->bytes, __ATOMIC_RELAXED);
        m->n = 0;
        m->bytes = 0;
}

/* Walks the magazines, emptying those asked for (all, or the orphans) and unlinking the orphans (all, with detach). Locked. */
static uint64_t walk(gpupool_client *c, bool all, bool forget, bool detach) {
        struct magazine **pp = &c->magazines, *m;
        uint64_t uses = 0;

        while ((m = *pp)) {
                bool orphan = detach || __atomic_load_n(&m->orphan, __ATOMIC_ACQUIRE);

                pthread_mutex_lock(&m->lock);
                if (all || orphan)
                        empty(c, m, forget);
                uses += m->uses;
                pthread_mutex_unlock(&m->lock);
                if (orphan) {
                        *pp = m->next;
                        unref(m);
                } else {
                        pp = &m->next;
                }
        }
        return uses;
}

void client_magazines_drain(gpupool_client *c) {
        (void) walk(c, true, false, false);
}

void client_magazines_forget(gpupool_client *c, bool detach) {
        (void) walk(c, true, true, detach);
}

uint64_t client_magazines_collect(gpupool_client *c) {
        return walk(c, false, false, false);
}
