/*
 * client_keep.c: the descriptors the process keeps, for a daemon after this one to adopt what
 * it holds (client_resume.c). Host and cuda-vmm memory outlives gpupoold while this process
 * maps it; the new daemon needs each segment's descriptor to lease it again, so the library
 * keeps one per segment it maps, high in the table, and closes them in a forked child.
 */
#define _GNU_SOURCE
#include "client_keep.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

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

void *client_fd_map(int fd, uint64_t size, void *at, int prot) {
        void *p = mmap(at, size, prot, MAP_SHARED | (at ? MAP_FIXED : 0), fd, 0);

        if (p != MAP_FAILED)
                (void) madvise(p, size, MADV_DONTFORK);
        return p;
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
