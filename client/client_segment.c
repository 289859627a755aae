/*
 * client_segment.c: the handle's lowest layer: its calls to the daemon on the main connection,
 * the segments it maps, and the table of the live blocks it hands out.
 *
 * Every request is one round trip on the handle's main connection, under the handle's lock (a
 * lease lets go of the lock while it waits, client_call_unlocked()). The library maps each
 * segment it leases once (host backend: an mmap of the memfd that came with the reply; cuda
 * backend: cuIpcOpenMemHandle of the handle in it; cuda-vmm: an import of the descriptor that
 * came with it, mapped in a range of its own; client_cuda.c), keeps the mappings in trees
 * (by address, by segment id, by IPC handle), and keeps the live blocks it handed out in a
 * table of its own sharded by address.
 */
#define _GNU_SOURCE
#include "client_segment.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "client_cuda.h"

/* The descriptors below this stay the application's: select() sees only those under 1024. */
#define KEPT_FD_FLOOR 1024
/* No descriptor numbered this or more is kept: 2 MiB of bits, for 32 TiB in 2 MiB granules. */
#define KEPT_FD_LIMIT (1 << 24)
/* The most slots client_fd_room() grows the table to: 512 KiB of the kernel's, 128 GiB in 2 MiB granules. */
#define KEPT_ROOM_MAX 65536

static pthread_once_t keep_once = PTHREAD_ONCE_INIT;
static uint64_t kept_max;               /* set once */

/*
 * The kept descriptors, a bit each, so that a forked child closes them (keep_child()): there
 * one would hold its memory alive (cuda-vmm: the GPU's) after the parent gave it back,
 * counted nowhere, until the child exits or execs. keep_lock orders keeping and letting go
 * against fork().
 */
static pthread_mutex_t keep_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t *kept_bits;             /* kept_words words, a bit per descriptor number below the limit */
static size_t kept_words, kept_top;     /* the words; one past the highest word ever set */
static uint64_t kept_fds;

static void keep_prepare(void) {
        pthread_mutex_lock(&keep_lock);
}

static void keep_parent(void) {
        pthread_mutex_unlock(&keep_lock);
}

/* In a forked child: the parent's segments are not its own (nor mapped here: MADV_DONTFORK). */
static void keep_child(void) {
        for (size_t w = 0; w < kept_top; w++)
                for (uint64_t bits = kept_bits[w]; bits; bits &= bits - 1)
                        close((int) (w * 64 + (size_t) __builtin_ctzll(bits)));
        memset(kept_bits, 0, kept_top * sizeof(*kept_bits));
        kept_top = 0;
        kept_fds = 0;
        pthread_mutex_unlock(&keep_lock);
}

/* The most descriptors a process can have where the limit is infinite: fs.nr_open. */
static uint64_t nr_open(void) {
        FILE *f = fopen("/proc/sys/fs/nr_open", "re");
        unsigned long long n = 0;

        if (f) {
                if (fscanf(f, "%llu", &n) != 1)
                        n = 0;
                fclose(f);
        }
        return n ? n : 1 << 20;
}

/*
 * Raises the soft RLIMIT_NOFILE to the hard one, as the kernel lets any process, and sizes what
 * may be kept: the limit less 2048, a bit for each descriptor number under the limit.
 */
static void keep_init(void) {
        struct rlimit rl;
        uint64_t limit;

        if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
                return;
        if (rl.rlim_cur < rl.rlim_max) {
                struct rlimit raised = { .rlim_cur = rl.rlim_max, .rlim_max = rl.rlim_max };

                if (setrlimit(RLIMIT_NOFILE, &raised) == 0)
                        rl = raised;
        }
        limit = rl.rlim_cur == RLIM_INFINITY ? nr_open() : rl.rlim_cur;
        if (limit > KEPT_FD_LIMIT)
                limit = KEPT_FD_LIMIT;
        if (limit <= 2 * KEPT_FD_FLOOR)
                return;
        kept_words = (limit + 63) / 64;
        kept_bits = calloc(kept_words, sizeof(*kept_bits));     /* 128 KiB for a limit of 1M, touched where used */
        if (!kept_bits || pthread_atfork(keep_prepare, keep_parent, keep_child) != 0)
                return;
        kept_max = limit - 2 * KEPT_FD_FLOOR;
}

int client_fd_keep(int fd) {
        int high;

        pthread_once(&keep_once, keep_init);
        pthread_mutex_lock(&keep_lock);
        if (kept_fds >= kept_max) {
                pthread_mutex_unlock(&keep_lock);
                close(fd);
                return -1;
        }
        if (fd < KEPT_FD_FLOOR && (high = fcntl(fd, F_DUPFD_CLOEXEC, KEPT_FD_FLOOR)) >= 0) {
                close(fd);
                fd = high;
        }
        if ((size_t) fd / 64 >= kept_words) {
                pthread_mutex_unlock(&keep_lock);
                close(fd);      /* past the limit it was sized for (lowered meanwhile and raised again) */
                return -1;
        }
        kept_bits[fd / 64] |= 1ULL << (fd % 64);
        if ((size_t) fd / 64 >= kept_top)
                kept_top = (size_t) fd / 64 + 1;
        kept_fds++;
        pthread_mutex_unlock(&keep_lock);
        return fd;
}

void client_fd_room(int fd, uint64_t n) {
        static uint64_t grown;  /* atomic: the slot the table reaches */
        uint64_t want;
        int high;

        pthread_once(&keep_once, keep_init);
        if (n > kept_max)
                n = kept_max;
        want = KEPT_FD_FLOOR + n;
        if (want > KEPT_ROOM_MAX)
                want = KEPT_ROOM_MAX;
        if (n == 0 || want <= __atomic_load_n(&grown, __ATOMIC_RELAXED))
                return;
        /* The lowest free slot from want - 1 up: the kernel grows the table to cover it, at once. */
        high = fcntl(fd, F_DUPFD_CLOEXEC, (int) (want - 1));
        if (high < 0)
                return;         /* no room (RLIMIT_NOFILE, fs.nr_open): descriptors are kept as the table grows */
        close(high);
        __atomic_store_n(&grown, want, __ATOMIC_RELAXED);
}

bool client_fd_is_memory(int fd, uint64_t size) {
        struct stat st;

        return fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t) st.st_size >= size;
}

void client_fd_release(int fd) {
        if (fd < 0)
                return;
        pthread_mutex_lock(&keep_lock);
        /* Not kept any more where a fork closed it: the number may be another descriptor's now. */
        if ((size_t) fd / 64 < kept_words && (kept_bits[fd / 64] & 1ULL << (fd % 64))) {
                kept_bits[fd / 64] &= ~(1ULL << (fd % 64));
                kept_fds--;
                close(fd);
        }
        pthread_mutex_unlock(&keep_lock);
}

#define CMP(a, b) ((a) < (b) ? -1 : (a) > (b))

static int cmp_addr(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        return CMP((uintptr_t) gp_rb_entry(x, struct mapping, by_addr)->base,
                   (uintptr_t) gp_rb_entry(y, struct mapping, by_addr)->base);
}

static int cmp_id(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        return CMP(gp_rb_entry(x, struct mapping, by_id)->segment_id, gp_rb_entry(y, struct mapping, by_id)->segment_id);
}

static int cmp_handle(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        return memcmp(gp_rb_entry(x, struct mapping, by_handle)->handle, gp_rb_entry(y, struct mapping, by_handle)->handle,
                      GP_CU_IPC_HANDLE_SIZE);
}

static int cmp_block(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        return CMP((uintptr_t) gp_rb_entry(x, struct block, node)->ptr, (uintptr_t) gp_rb_entry(y, struct block, node)->ptr);
}

static struct live_shard *shard_of(gpupool_client *c, const void *ptr) {
        /* Blocks are 512-byte aligned: hash the bits above, Fibonacci-style, into the top bits. */
        uint64_t h = ((uint64_t) (uintptr_t) ptr >> 9) * 0x9E3779B97F4A7C15ULL;

        return &c->live[h >> (64 - 5)];
}
_Static_assert(CLIENT_SHARDS == 1 << 5, "shard_of() hashes into 5 bits");

int client_live_insert(gpupool_client *c, struct block *b) {
        struct live_shard *s = shard_of(c, b->ptr);
        struct gp_rb_node *dup;

        pthread_mutex_lock(&s->lock);
        /* Checked under the shard's lock: drop_everything() bumps the epoch before it empties the shards. */
        if (b->epoch != __atomic_load_n(&c->epoch, __ATOMIC_ACQUIRE)) {
                pthread_mutex_unlock(&s->lock);
                return -ESTALE;
        }
        dup = gp_rb_insert(&s->blocks, &b->node);
        pthread_mutex_unlock(&s->lock);
        return dup ? -EEXIST : 0;
}

void client_live_remove(gpupool_client *c, struct block *b) {
        struct live_shard *s = shard_of(c, b->ptr);

        pthread_mutex_lock(&s->lock);
        gp_rb_remove(&s->blocks, &b->node);
        pthread_mutex_unlock(&s->lock);
}

struct block *client_live_take(gpupool_client *c, const void *ptr) {
        struct live_shard *s = shard_of(c, ptr);
        struct block key = { .ptr = (uint8_t *) ptr }, *b = NULL;
        struct gp_rb_node *n;

        pthread_mutex_lock(&s->lock);
        n = gp_rb_find(&s->blocks, &key.node);
        if (n && !gp_rb_entry(n, struct block, node)->freeing) {
                b = gp_rb_entry(n, struct block, node);
                gp_rb_remove(&s->blocks, n);
        }
        pthread_mutex_unlock(&s->lock);
        return b;
}

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

void client_segments_init(gpupool_client *c) {
        gp_rb_init(&c->by_addr, cmp_addr);
        gp_rb_init(&c->by_id, cmp_id);
        gp_rb_init(&c->by_handle, cmp_handle);
        for (unsigned i = 0; i < CLIENT_SHARDS; i++) {
                pthread_mutex_init(&c->live[i].lock, NULL);
                gp_rb_init(&c->live[i].blocks, cmp_block);
        }
}

void client_segments_destroy(gpupool_client *c) {
        for (unsigned i = 0; i < CLIENT_SHARDS; i++)
                pthread_mutex_destroy(&c->live[i].lock);
}

void client_live_forget(gpupool_client *c) {
        struct gp_rb_node *n;

        __atomic_add_fetch(&c->epoch, 1, __ATOMIC_SEQ_CST);
        for (unsigned i = 0; i < CLIENT_SHARDS; i++) {
                pthread_mutex_lock(&c->live[i].lock);
                while ((n = gp_rb_first(&c->live[i].blocks))) {
                        gp_rb_remove(&c->live[i].blocks, n);
                        free(gp_rb_entry(n, struct block, node));
                }
                pthread_mutex_unlock(&c->live[i].lock);
        }
}

uint64_t client_now_ms(void) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

void client_mapping_drop(gpupool_client *c, struct mapping *m) {
        /* Forgotten with its blocks (the session is over); a returned segment left its heap already. */
        if (m->hs.heap)
                (void) heap_drop(&m->hs);
        gp_rb_remove(&c->by_addr, &m->by_addr);
        gp_rb_remove(&c->by_id, &m->by_id);
        if (m->ipc) {
                gp_rb_remove(&c->by_handle, &m->by_handle);
                client_cuda_close(c, m);
        } else if (m->vmm) {
                client_cuda_unmap(c, m);
                client_fd_release(m->fd);
        } else {
                munmap(m->base, m->size);
                client_fd_release(m->fd);
        }
        free(m);
}

int client_mapping_add(gpupool_client *c, unsigned device, uint64_t segment_id, uint64_t size,
                       const ProtobufCBinaryData *ipc_handle, int fd, struct mapping **ret) {
        struct mapping *m = calloc(1, sizeof(*m));
        int r;

        if (!m) {
                if (fd >= 0)
                        close(fd);
                return -ENOMEM;
        }
        m->segment_id = segment_id;
        m->size = size;
        m->device = device;
        m->fd = -1;
        /* Host and cuda-vmm segments come as descriptors. */
        if ((c->vmm || !c->cuda) && fd < 0) {
                free(m);
                client_set_error(c, "gpupoold sent a segment without its file descriptor");
                return -EPROTO;
        }
        if (c->vmm) {
                m->vmm = true;
                r = client_cuda_map_fd(c, m, fd);
                if (r < 0) {
                        free(m);
                        return r;
                }
        } else if (c->cuda) {
                if (fd >= 0)
                        close(fd);
                if (!ipc_handle || ipc_handle->len != GP_CU_IPC_HANDLE_SIZE) {
                        free(m);
                        client_set_error(c, "gpupoold sent a CUDA segment without its IPC handle");
                        return -EPROTO;
                }
                m->ipc = true;
                memcpy(m->handle, ipc_handle->data, GP_CU_IPC_HANDLE_SIZE);
                /* One open per allocation per process: a handle we hold already means we disagree with the daemon. */
                if (gp_rb_find(&c->by_handle, &m->by_handle)) {
                        free(m);
                        client_set_error(c, "gpupoold handed over a segment this process already has open");
                        return -EPROTO;
                }
                r = client_cuda_open(c, m);
                if (r < 0) {
                        free(m);
                        return r;
                }
                gp_rb_insert(&c->by_handle, &m->by_handle);
        } else {
                void *base;

                if (!client_fd_is_memory(fd, m->size)) {
                        close(fd);
                        free(m);
                        client_set_error(c, "gpupoold sent a segment that is not %llu bytes of memory",
                                         (unsigned long long) size);
                        return -EPROTO;
                }
                base = mmap(NULL, m->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

                if (base == MAP_FAILED) {
                        close(fd);
                        free(m);
                        client_set_error(c, "cannot map the segment into this process");
                        return -ENOMEM;
                }
                /* A forked child must not keep this memory: it may be another client's tomorrow. */
                (void) madvise(base, m->size, MADV_DONTFORK);
                m->base = base;
                m->fd = client_fd_keep(fd);     /* for a daemon after this one to adopt */
        }
        gp_rb_insert(&c->by_addr, &m->by_addr);
        gp_rb_insert(&c->by_id, &m->by_id);
        c->segments_imported++;
        *ret = m;
        return 0;
}

struct mapping *client_mapping_by_id(gpupool_client *c, uint64_t segment_id) {
        struct mapping key = { .segment_id = segment_id };
        struct gp_rb_node *n = gp_rb_find(&c->by_id, &key.by_id);

        return n ? gp_rb_entry(n, struct mapping, by_id) : NULL;
}

void client_mappings_forget(gpupool_client *c) {
        struct gp_rb_node *n;

        while ((n = gp_rb_first(&c->by_addr)))
                client_mapping_drop(c, gp_rb_entry(n, struct mapping, by_addr));
}
