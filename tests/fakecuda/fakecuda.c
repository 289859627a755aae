/*
 * fakecuda.c: a CUDA driver for machines without a GPU, loaded through $GPUPOOL_LIBCUDA.
 *
 * It implements the entry points gpupool, its tests and its benchmark use, and enforces the
 * documented rules that bite a GPU memory service, so that breaking one fails in CI rather
 * than on a customer's GPU:
 *
 *   - entry points are found through cuGetProcAddress_v2 by base name and ABI version; the
 *     unversioned exports (cuMemAlloc, cuMemFree, cuMemGetInfo) are the 32-bit ABI of CUDA
 *     2.0, as in the real libcuda, and truncate 64-bit pointers and sizes;
 *   - device memory is not host memory: a CUdeviceptr points at an inaccessible (PROT_NONE)
 *     reservation, so dereferencing one faults; cuMemcpy and cuMemset reach the bytes;
 *   - cuIpcGetMemHandle wants the base of an allocation (an interior pointer is refused);
 *     a handle opens the whole allocation; opening it in the exporting process fails with
 *     CUDA_ERROR_INVALID_CONTEXT; a second open in one process returns the same pointer
 *     (refcounted) and cuIpcCloseMemHandle undoes one open;
 *   - freeing memory another process still has open is undefined behaviour in CUDA: here it
 *     aborts the freeing process, with a message;
 *   - a process forked after cuInit cannot use the driver (CUDA_ERROR_NOT_INITIALIZED);
 *   - calls that need a context fail without a current one (CUDA_ERROR_INVALID_CONTEXT);
 *   - $CUDA_VISIBLE_DEVICES selects and renumbers the GPUs, whose UUIDs stay fixed, by
 *     ordinal, by "GPU-" UUID (or a unique start of one), or by a MIG instance's "MIG-" UUID;
 *   - waits spin (cuEventSynchronize, cuStreamSynchronize, cuCtxSynchronize), as in a context
 *     of the default scheduling; only an event made with CU_EVENT_BLOCKING_SYNC waits asleep;
 *   - streams and events belong to the context they were made in and are refused with
 *     another's; a destroyed stream's work still runs, and its handle comes back for the next
 *     stream made (cuStreamGetId tells them apart);
 *   - the legacy default stream (NULL, CU_STREAM_LEGACY) is a stream of its context that
 *     waits for the work queued before on every blocking stream (made without
 *     CU_STREAM_NON_BLOCKING), which wait for its own in turn; CU_STREAM_PER_THREAD is a
 *     blocking stream of each thread; the synchronous memsets go to the legacy stream and
 *     return at once, the synchronous copies wait for it (the driver's "API synchronization
 *     behavior"); the default streams cannot be captured;
 *   - graph capture: work and events on a capturing stream become graph nodes (run nothing,
 *     complete nothing); a potentially unsafe call (allocation, free, IPC open or close, an
 *     event query or wait, a synchronization) made while a capture forbids it, by the modes
 *     of cuThreadExchangeStreamCaptureMode, fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
 *     and invalidates the capture; so does cuStreamGetId on a capturing stream, in any mode;
 *     an event recorded in a capture cannot be queried (CUDA_ERROR_CAPTURED_EVENT);
 *   - compute modes: no context on a PROHIBITED GPU, one process's at a time on an
 *     EXCLUSIVE_PROCESS one (CUDA_ERROR_DEVICE_UNAVAILABLE);
 *   - cuIpcOpenMemHandle costs time that grows with the allocation's size (what an H100
 *     took, by default), and a handle cannot be opened in another PID namespace than its
 *     exporter's (CUDA_ERROR_INVALID_CONTEXT), as legacy IPC handles cannot;
 *   - virtual memory management as documented: cuMemCreate sizes are granularity (2 MiB)
 *     multiples; only memory made for POSIX descriptors exports as one; an imported descriptor
 *     must name device memory, whose GPU cuMemGetAllocationPropertiesFromHandle gives as this
 *     process's ordinal; each export is a file of its own; cuMemMap wants offset 0, the whole allocation and a range of a
 *     reservation not mapped yet; mappings side by side are one range of addresses (a copy or
 *     memset may span them); a mapping is not accessible until cuMemSetAccess; unmapping
 *     takes whole mappings, and a reservation is freed only unmapped; the memory lives while
 *     any process holds a handle, a descriptor or a mapping of it (its creator's exit
 *     included), and is freed with the last;
 *   - a GPU's memory is the node's: every process's allocations and contexts count against
 *     it (a context takes memory too, so on a full GPU cuDevicePrimaryCtxRetain fails with
 *     CUDA_ERROR_OUT_OF_MEMORY), cuMemGetInfo reports what all processes leave free, and what
 *     a process had comes back when it exits.
 *
 * "Device memory" is a file per allocation in $FAKECUDA_DIR (default /dev/shm), which every
 * process of the test can open; an IPC handle names it. Importers hold a shared flock() on
 * it, which is how a free by the exporter sees that someone still has it open. Streams are
 * worker threads running their operations in order; an event is a point in a stream's
 * sequence. fakecuda_stream_hold() stops a stream's worker, so tests can keep device work
 * pending for as long as they need instead of sleeping; an exclusive flock() on
 * $FAKECUDA_DIR/fakecuda-memsets.hold holds every memset, in every process (the daemon's too).
 *
 * Knobs: $FAKECUDA_DEVICES (GPUs on the node, default 1; 0 = none), $FAKECUDA_MEM (bytes per
 * GPU, default 1.5 GiB and a context: 512 MiB of pool under the default headroom; K/M/G
 * suffixes), $FAKECUDA_CONTEXT_MEM (what a process's context takes of a GPU, default 16 MiB;
 * a real one takes hundreds: 518 MiB seen on an H100 with CUDA 13), $FAKECUDA_COMPUTE_MODES
 * (a mode per GPU, "default", "prohibited" or "exclusive-process", comma-separated),
 * $FAKECUDA_MIG (the GPUs that are MIG instances, e.g. "1"), $FAKECUDA_VMM=0 (GPUs without
 * virtual memory management or descriptor handles), $FAKECUDA_IPC_OPEN_NS and $FAKECUDA_IPC_OPEN_NS_PER_MIB (what a first cuIpcOpenMemHandle of
 * an allocation takes: default 50 us and 50 ns per MiB, as on an H100 with driver 580).
 * $FAKECUDA_DIR also holds fakecuda-ledger, the node's memory use by process.
 *
 * Virtual memory management (cuMemCreate and the rest) is in fakecuda_vmm.c; what the two
 * files share is in fake.h.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fake.h"

#define FAKE_DRIVER_VERSION 12080
#define MAX_STREAMS 256
#define HANDLE_MAGIC 0x55434b46u        /* "FKCU" */
#define EVENT_MAGIC 0x45564e54u         /* "EVNT" */

struct ctx {
        int gpu;                        /* physical index */
        int retained;
        int exclusive_fd;               /* EXCLUSIVE_PROCESS: the device's lock file, held while retained */
};

enum compute_mode { MODE_DEFAULT = 0, MODE_PROHIBITED = 2, MODE_EXCLUSIVE_PROCESS = 3 };
static int compute_modes[MAX_GPUS];
static bool mig[MAX_GPUS];              /* a MIG instance ($FAKECUDA_MIG): "MIG-" UUID, " MIG " in its name */
bool vmm_off;                           /* $FAKECUDA_VMM=0: GPUs without VMM or descriptor handles */

struct alloc {
        struct alloc *next;
        uint64_t id;
        int gpu;
        CUdeviceptr dptr;               /* PROT_NONE reservation: the "device address" */
        size_t size;
        uint8_t *host;                  /* the bytes, mapped for cuMemcpy/cuMemset */
        int fd;
        bool imported;
        int opens;                      /* imported: cuIpcOpenMemHandle count */
        pid_t exporter;
};

struct wire_handle {                    /* what a CUipcMemHandle holds here */
        uint32_t magic;
        int32_t gpu;
        int32_t pid;
        uint32_t pad;
        uint64_t id;
        uint64_t size;
        uint64_t pidns;                 /* the exporter's PID namespace (its inode) */
};

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

pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static pid_t init_pid;                  /* 0 before cuInit */
int gpus;                               /* physical GPUs */
int visible[MAX_GPUS], nvisible;        /* ordinal -> physical */
static uint64_t capacity;
static uint64_t context_bytes;          /* what a context takes of its GPU ($FAKECUDA_CONTEXT_MEM) */
static uint64_t ipc_open_ns, ipc_open_ns_per_mib;      /* what a first cuIpcOpenMemHandle takes */
static uint64_t my_pidns;               /* this process's PID namespace (its inode) */

/*
 * The node's device memory, as every process of the node sees it: a file in $FAKECUDA_DIR
 * that each process maps, with a slot per process that has called cuInit. A process charges
 * its allocations and contexts to its own slot; cuMemGetInfo and a cuMemAlloc that would not
 * fit count every running process's. A process that has exited (or is a zombie) counts for
 * nothing, as the driver frees what a process had when it exits.
 */
#define LEDGER_SLOTS 256
struct ledger_slot {
        int32_t pid;                    /* 0: free */
        uint32_t pad;
        uint64_t start_time;            /* /proc/PID/stat starttime: a reused pid is another process */
        uint64_t bytes[MAX_GPUS];       /* allocations and contexts, by physical GPU */
};
struct ledger_file {
        uint64_t vmm_bytes[MAX_GPUS];   /* cuMemCreate memory alive, whoever holds it (see vmm_sweep) */
        struct ledger_slot slots[LEDGER_SLOTS];
};
static struct ledger_file *ledger;      /* shared */
static int ledger_fd = -1;
static struct ledger_slot *my_slot;
static struct ctx ctxs[MAX_GPUS];
static struct alloc *allocs;
static struct stream *streams;
static struct event *events;
static struct event *destroyed_events;      /* kept for the process's life (see cuEventDestroy) */
static uint64_t next_id = 1;
static unsigned long long event_queries;        /* cuEventQuery calls (test hook) */
unsigned long long set_access_calls;            /* cuMemSetAccess calls (test hook) */
static CUresult event_failure;                  /* what event queries and waits return instead (test hook) */
static __thread struct ctx *ctx_stack[16];
static __thread int ctx_depth;

void fatal(const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        fputs("fakecuda: ", stderr);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
        abort();
}

static uint64_t parse_bytes(const char *s, uint64_t dflt) {
        char *end;
        unsigned long long v;

        if (!s || !*s)
                return dflt;
        v = strtoull(s, &end, 10);
        switch (*end) {
        case 'K': case 'k': v <<= 10; break;
        case 'M': case 'm': v <<= 20; break;
        case 'G': case 'g': v <<= 30; break;
        default: break;
        }
        return v;
}

const char *mem_dir(void) {
        const char *d = getenv("FAKECUDA_DIR");

        return d && *d ? d : "/dev/shm";
}

static void mem_path(char *buf, size_t size, pid_t pid, uint64_t id) {
        snprintf(buf, size, "%s/fakecuda-%d-%llu", mem_dir(), (int) pid, (unsigned long long) id);
}

/* The starttime of pid (field 22 of /proc/PID/stat), or 0 when it does not run (gone, or a zombie). */
static uint64_t process_start(pid_t pid) {
        char path[64], buf[1024], *p;
        unsigned long long start = 0;
        char state;
        ssize_t n;
        int fd;

        snprintf(path, sizeof(path), "/proc/%d/stat", (int) pid);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return 0;
        n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (n <= 0)
                return 0;
        buf[n] = '\0';
        p = strrchr(buf, ')');          /* the command may hold spaces and parentheses */
        if (!p || sscanf(p + 1, " %c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
                         &state, &start) != 2)
                return 0;
        return state == 'Z' || state == 'X' ? 0 : (uint64_t) start;
}

void ledger_lock(void) {
        while (flock(ledger_fd, LOCK_EX) < 0 && errno == EINTR)
                ;
}

void ledger_unlock(void) {
        (void) flock(ledger_fd, LOCK_UN);
}

/* What an exited process had is the node's again, as the driver frees it: its allocations' files go too. */
static void forget_process(struct ledger_slot *l) {
        char prefix[32];
        struct dirent *e;
        size_t n;
        DIR *dir;

        n = (size_t) snprintf(prefix, sizeof(prefix), "fakecuda-%d-", (int) l->pid);
        dir = opendir(mem_dir());
        while (dir && (e = readdir(dir)))
                if (strncmp(e->d_name, prefix, n) == 0)
                        (void) unlinkat(dirfd(dir), e->d_name, 0);      /* importers keep what they mapped */
        if (dir)
                closedir(dir);
        memset(l, 0, sizeof(*l));
}

/* Maps the ledger and takes a slot for this process (one left by an exited process if need be). */
static void ledger_join(void) {
        char path[256];
        uint64_t start = process_start(getpid());
        struct ledger_slot *free_slot = NULL;

        snprintf(path, sizeof(path), "%s/fakecuda-ledger", mem_dir());
        ledger_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        if (ledger_fd < 0)
                fatal("cannot open %s: %s", path, strerror(errno));
        (void) fchmod(ledger_fd, 0666);         /* processes of other uids share it */
        ledger_lock();
        if (ftruncate(ledger_fd, (off_t) sizeof(*ledger)) < 0)
                fatal("cannot size %s: %s", path, strerror(errno));
        ledger = mmap(NULL, sizeof(*ledger), PROT_READ | PROT_WRITE, MAP_SHARED, ledger_fd, 0);
        if (ledger == MAP_FAILED)
                fatal("cannot map %s: %s", path, strerror(errno));
        for (int i = 0; i < LEDGER_SLOTS && !free_slot; i++)
                if (ledger->slots[i].pid == 0 || process_start(ledger->slots[i].pid) != ledger->slots[i].start_time)
                        free_slot = &ledger->slots[i];
        if (!free_slot)
                fatal("more than %d processes use the driver at once", LEDGER_SLOTS);
        if (free_slot->pid)
                forget_process(free_slot);
        free_slot->pid = getpid();
        free_slot->start_time = start;
        my_slot = free_slot;
        ledger_unlock();
}

/*
 * cuMemCreate memory is a file, fakecuda-vmm-GPU-PID-ID, on which every process holding a
 * handle, an exported descriptor or a mapping of it holds a shared flock() (on a descriptor of
 * its own, or on the exported one it received). Nobody holding one: the driver would have
 * freed it, and so does this, under ledger_lock(). Returns whether path was freed.
 */
bool vmm_free_if_unheld(const char *path, int gpu, uint64_t size) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        bool unheld;

        if (fd < 0)
                return false;
        unheld = flock(fd, LOCK_EX | LOCK_NB) == 0;
        if (unheld) {
                unlink(path);
                __atomic_sub_fetch(&ledger->vmm_bytes[gpu], size, __ATOMIC_RELAXED);
        }
        close(fd);
        return unheld;
}

/* Frees the cuMemCreate memory no process holds any more (its holders exited). Under ledger_lock(). */
static void vmm_sweep(void) {
        struct dirent *e;
        DIR *dir = opendir(mem_dir());

        while (dir && (e = readdir(dir))) {
                char path[512];
                struct stat st;
                int gpu;

                if (sscanf(e->d_name, "fakecuda-vmm-%d-", &gpu) != 1 || gpu < 0 || gpu >= MAX_GPUS)
                        continue;
                snprintf(path, sizeof(path), "%s/%s", mem_dir(), e->d_name);
                if (stat(path, &st) == 0)
                        (void) vmm_free_if_unheld(path, gpu, (uint64_t) st.st_size);
        }
        if (dir)
                closedir(dir);
}

/* What every process has of physical GPU gpu; with check, those that have exited are forgotten. Under ledger_lock(). */
static uint64_t ledger_used(int gpu, bool check) {
        uint64_t sum;

        if (check)
                vmm_sweep();
        sum = __atomic_load_n(&ledger->vmm_bytes[gpu], __ATOMIC_RELAXED);

        for (int i = 0; i < LEDGER_SLOTS; i++) {
                struct ledger_slot *l = &ledger->slots[i];
                uint64_t b = __atomic_load_n(&l->bytes[gpu], __ATOMIC_RELAXED);

                if (l->pid == 0 || (b == 0 && l != my_slot))
                        continue;
                if (check && l != my_slot && process_start(l->pid) != l->start_time) {
                        forget_process(l);
                        continue;
                }
                sum += b;
        }
        return sum;
}

/* Whether size more bytes fit physical GPU gpu, every running process counted. Under ledger_lock(). */
bool ledger_fits(int gpu, uint64_t size) {
        /* Exited processes' slots only make the sum larger: look at them only when it does not fit. */
        return size <= capacity && (ledger_used(gpu, false) <= capacity - size || ledger_used(gpu, true) <= capacity - size);
}

/* Charges size bytes of cuMemCreate memory to gpu, whoever holds it. Under ledger_lock(). */
void ledger_vmm_charge(int gpu, uint64_t size) {
        __atomic_add_fetch(&ledger->vmm_bytes[gpu], size, __ATOMIC_RELAXED);
}

/* Charges size bytes of physical GPU gpu to this process if the node has them. */
static bool ledger_charge(int gpu, uint64_t size) {
        bool ok;

        ledger_lock();
        ok = ledger_fits(gpu, size);
        if (ok)
                __atomic_add_fetch(&my_slot->bytes[gpu], size, __ATOMIC_RELAXED);
        ledger_unlock();
        return ok;
}

static void ledger_uncharge(int gpu, uint64_t size) {
        __atomic_sub_fetch(&my_slot->bytes[gpu], size, __ATOMIC_RELAXED);
}

/* $FAKECUDA_COMPUTE_MODES: a mode per physical GPU, "default", "prohibited" or "exclusive-process", comma-separated. */
static void parse_compute_modes(const char *spec) {
        int gpu = 0;

        memset(compute_modes, 0, sizeof(compute_modes));
        for (const char *p = spec; p && *p && gpu < MAX_GPUS; gpu++) {
                size_t n = strcspn(p, ",");

                if (n == 10 && strncmp(p, "prohibited", n) == 0)
                        compute_modes[gpu] = MODE_PROHIBITED;
                else if (n == 17 && strncmp(p, "exclusive-process", n) == 0)
                        compute_modes[gpu] = MODE_EXCLUSIVE_PROCESS;
                p += n + (p[n] == ',');
        }
}

/* Every call but cuInit and the pure lookups starts here. */
CUresult ready(void) {
        if (!init_pid || init_pid != getpid())
                return GP_CUDA_ERROR_NOT_INITIALIZED;
        return GP_CUDA_SUCCESS;
}

struct ctx *current(void) {
        return ctx_depth ? ctx_stack[ctx_depth - 1] : NULL;
}

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

/* ---- initialization and devices ---- */

/* GPU gpu's UUID as nvidia-smi -L prints it: "GPU-" or, for a MIG instance, "MIG-", then 8-4-4-4-12 hex. */
static void uuid_text(int gpu, char *buf, size_t size) {
        unsigned char u[16];

        for (int i = 0; i < 16; i++)
                u[i] = (unsigned char) (0xf0 + gpu + i * 17);
        snprintf(buf, size, "%s-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                 mig[gpu] ? "MIG" : "GPU", u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
                 u[12], u[13], u[14], u[15]);
}

/*
 * One entry of $CUDA_VISIBLE_DEVICES, as CUDA reads it: an ordinal, a "GPU-" UUID or a unique
 * start of one, or a MIG instance's "MIG-" UUID. Returns the physical GPU, or -1.
 */
static int visible_entry(const char *s, size_t n) {
        char uuid[48];
        int found = -1;

        if (n > 4 && (strncmp(s, "GPU-", 4) == 0 || strncmp(s, "MIG-", 4) == 0)) {
                for (int g = 0; g < gpus; g++) {
                        uuid_text(g, uuid, sizeof(uuid));
                        if (strncmp(uuid, s, n) == 0) {
                                if (found >= 0)
                                        return -1;      /* not unique */
                                found = g;
                        }
                }
                return found;
        }
        for (size_t i = 0; i < n; i++)
                if (s[i] < '0' || s[i] > '9')
                        return -1;
        found = n ? atoi(s) : -1;
        return found < gpus ? found : -1;
}

static CUresult fk_Init(unsigned flags) {
        const char *cvd = getenv("CUDA_VISIBLE_DEVICES");

        if (flags)
                return GP_CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&lock);
        if (init_pid && init_pid != getpid()) {
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_NOT_INITIALIZED;  /* forked after cuInit: unusable, as in CUDA */
        }
        if (!init_pid) {
                gpus = (int) parse_bytes(getenv("FAKECUDA_DEVICES"), 1);
                if (gpus > MAX_GPUS)
                        gpus = MAX_GPUS;
                context_bytes = parse_bytes(getenv("FAKECUDA_CONTEXT_MEM"), 16ULL << 20);
                capacity = parse_bytes(getenv("FAKECUDA_MEM"), (1536ULL << 20) + context_bytes);
                nvisible = 0;
                memset(mig, 0, sizeof(mig));
                for (const char *m = getenv("FAKECUDA_MIG"); m && *m; m += strcspn(m, ",") + (m[strcspn(m, ",")] == ',')) {
                        int g = atoi(m);

                        if (g >= 0 && g < MAX_GPUS)
                                mig[g] = true;
                }
                if (cvd) {
                        /* As CUDA: ordinals or UUIDs; the first invalid entry ends the list. */
                        for (const char *s = cvd; *s && nvisible < MAX_GPUS; ) {
                                size_t n = strcspn(s, ",");
                                int v = visible_entry(s, n);

                                if (v < 0)
                                        break;
                                visible[nvisible++] = v;
                                s += n + (s[n] == ',');
                        }
                } else {
                        for (int i = 0; i < gpus; i++)
                                visible[nvisible++] = i;
                }
                for (int i = 0; i < MAX_GPUS; i++) {
                        ctxs[i].gpu = i;
                        ctxs[i].exclusive_fd = -1;
                }
                parse_compute_modes(getenv("FAKECUDA_COMPUTE_MODES"));
                vmm_off = getenv("FAKECUDA_VMM") && strcmp(getenv("FAKECUDA_VMM"), "0") == 0;
                /* An H100 with driver 580 took 50 us for 2 MiB and 102 us for 1 GiB (docs/performance.md). */
                ipc_open_ns = parse_bytes(getenv("FAKECUDA_IPC_OPEN_NS"), 50000);
                ipc_open_ns_per_mib = parse_bytes(getenv("FAKECUDA_IPC_OPEN_NS_PER_MIB"), 50);
                {
                        struct stat ns;

                        my_pidns = stat("/proc/self/ns/pid", &ns) == 0 ? (uint64_t) ns.st_ino : 0;
                }
                ledger_join();
                init_pid = getpid();
        }
        pthread_mutex_unlock(&lock);
        return nvisible ? GP_CUDA_SUCCESS : GP_CUDA_ERROR_NO_DEVICE;
}

static CUresult fk_DriverGetVersion(int *v) {
        if (!v)
                return GP_CUDA_ERROR_INVALID_VALUE;
        *v = FAKE_DRIVER_VERSION;
        return GP_CUDA_SUCCESS;
}

static CUresult fk_DeviceGetCount(int *n) {
        CUresult r = ready();

        if (r)
                return r;
        *n = nvisible;
        return GP_CUDA_SUCCESS;
}

static CUresult fk_DeviceGet(gp_cu_device *d, int ordinal) {
        CUresult r = ready();

        if (r)
                return r;
        if (ordinal < 0 || ordinal >= nvisible)
                return GP_CUDA_ERROR_INVALID_DEVICE;
        *d = ordinal;
        return GP_CUDA_SUCCESS;
}

static CUresult fk_DeviceGetName(char *name, int len, gp_cu_device d) {
        CUresult r = ready();

        if (r)
                return r;
        if (d < 0 || d >= nvisible || len <= 0)
                return GP_CUDA_ERROR_INVALID_VALUE;
        /* A MIG instance's name carries its profile, as "NVIDIA A100-SXM4-40GB MIG 1g.5gb" does. */
        snprintf(name, (size_t) len, "Fake GPU %d%s", visible[d], mig[visible[d]] ? " MIG 1g.10gb" : "");
        return GP_CUDA_SUCCESS;
}

static CUresult fk_DeviceGetUuid(gp_cu_uuid *uuid, gp_cu_device d) {
        CUresult r = ready();

        if (r)
                return r;
        if (d < 0 || d >= nvisible)
                return GP_CUDA_ERROR_INVALID_DEVICE;
        /* Fixed per physical GPU, whatever CUDA_VISIBLE_DEVICES says. */
        for (int i = 0; i < 16; i++)
                uuid->bytes[i] = (char) (0xf0 + visible[d] + i * 17);
        return GP_CUDA_SUCCESS;
}

/*
 * As the driver: no context on a PROHIBITED GPU, and on an EXCLUSIVE_PROCESS one only in one
 * process at a time (a lock on a file of the GPU's, which the process's exit lets go of too).
 */
static CUresult fk_DeviceGetAttribute(int *value, int attribute, gp_cu_device d) {
        CUresult r = ready();

        if (r)
                return r;
        if (!value)
                return GP_CUDA_ERROR_INVALID_VALUE;
        if (d < 0 || d >= nvisible)
                return GP_CUDA_ERROR_INVALID_DEVICE;
        switch (attribute) {
        case GP_CU_DEVICE_ATTRIBUTE_COMPUTE_MODE:
                *value = compute_modes[visible[d]];
                return GP_CUDA_SUCCESS;
        case GP_CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
        case GP_CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
                *value = !vmm_off;
                return GP_CUDA_SUCCESS;
        default:
                return GP_CUDA_ERROR_INVALID_VALUE;    /* not one the fake knows */
        }
}

static CUresult fk_DevicePrimaryCtxRetain(gp_cu_context *c, gp_cu_device d) {
        struct ctx *x;
        CUresult r = ready();

        if (r)
                return r;
        if (d < 0 || d >= nvisible)
                return GP_CUDA_ERROR_INVALID_DEVICE;
        x = &ctxs[visible[d]];
        if (compute_modes[x->gpu] == MODE_PROHIBITED)
                return GP_CUDA_ERROR_DEVICE_UNAVAILABLE;
        pthread_mutex_lock(&lock);
        if (compute_modes[x->gpu] == MODE_EXCLUSIVE_PROCESS && x->retained == 0) {
                char path[256];

                snprintf(path, sizeof(path), "%s/fakecuda-gpu%d.exclusive", mem_dir(), x->gpu);
                x->exclusive_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
                if (x->exclusive_fd < 0 || flock(x->exclusive_fd, LOCK_EX | LOCK_NB) < 0) {
                        if (x->exclusive_fd >= 0)
                                close(x->exclusive_fd);
                        x->exclusive_fd = -1;
                        pthread_mutex_unlock(&lock);
                        return GP_CUDA_ERROR_DEVICE_UNAVAILABLE;
                }
                (void) fchmod(x->exclusive_fd, 0666);
        }
        if (x->retained == 0 && !ledger_charge(x->gpu, context_bytes)) {
                /* A context takes device memory too: on a full GPU a new process cannot start. */
                if (x->exclusive_fd >= 0)
                        close(x->exclusive_fd);
                x->exclusive_fd = -1;
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_OUT_OF_MEMORY;
        }
        x->retained++;
        pthread_mutex_unlock(&lock);
        *c = (gp_cu_context) &ctxs[visible[d]];
        return GP_CUDA_SUCCESS;
}

static CUresult fk_DevicePrimaryCtxRelease(gp_cu_device d) {
        CUresult r = ready();

        if (r)
                return r;
        if (d < 0 || d >= nvisible || ctxs[visible[d]].retained == 0)
                return GP_CUDA_ERROR_INVALID_CONTEXT;
        pthread_mutex_lock(&lock);
        if (--ctxs[visible[d]].retained == 0) {
                ledger_uncharge(ctxs[visible[d]].gpu, context_bytes);
                if (ctxs[visible[d]].exclusive_fd >= 0) {
                        close(ctxs[visible[d]].exclusive_fd);
                        ctxs[visible[d]].exclusive_fd = -1;
                }
        }
        pthread_mutex_unlock(&lock);
        return GP_CUDA_SUCCESS;
}

static bool valid_ctx(gp_cu_context c) {
        struct ctx *x = (struct ctx *) c;

        return x >= ctxs && x < ctxs + MAX_GPUS && x->retained > 0;
}

static CUresult fk_CtxPushCurrent(gp_cu_context c) {
        CUresult r = ready();

        if (r)
                return r;
        if (!valid_ctx(c) || ctx_depth == 16)
                return GP_CUDA_ERROR_INVALID_CONTEXT;
        ctx_stack[ctx_depth++] = (struct ctx *) c;
        return GP_CUDA_SUCCESS;
}

static CUresult fk_CtxPopCurrent(gp_cu_context *c) {
        CUresult r = ready();

        if (r)
                return r;
        if (!ctx_depth)
                return GP_CUDA_ERROR_INVALID_CONTEXT;
        ctx_depth--;
        if (c)
                *c = (gp_cu_context) ctx_stack[ctx_depth];
        return GP_CUDA_SUCCESS;
}

static CUresult fk_CtxSetCurrent(gp_cu_context c) {
        CUresult r = ready();

        if (r)
                return r;
        if (!c) {
                if (ctx_depth)
                        ctx_depth--;
                return GP_CUDA_SUCCESS;
        }
        if (!valid_ctx(c))
                return GP_CUDA_ERROR_INVALID_CONTEXT;
        if (ctx_depth)
                ctx_stack[ctx_depth - 1] = (struct ctx *) c;
        else
                ctx_stack[ctx_depth++] = (struct ctx *) c;
        return GP_CUDA_SUCCESS;
}

/* ---- memory ---- */

/* Whether [p, p + n) lies in [base, base + size). */
bool within(CUdeviceptr p, size_t n, CUdeviceptr base, size_t size) {
        return p >= base && p < base + size && n <= size - (p - base);
}

/* The allocation containing [p, p + n), or NULL. Call locked. */
static struct alloc *find(CUdeviceptr p, size_t n) {
        for (struct alloc *a = allocs; a; a = a->next)
                if (within(p, n, a->dptr, a->size))
                        return a;
        return NULL;
}

static struct alloc *find_base(CUdeviceptr p) {
        for (struct alloc *a = allocs; a; a = a->next)
                if (a->dptr == p)
                        return a;
        return NULL;
}

static void unlink_alloc(struct alloc *a) {
        for (struct alloc **pp = &allocs; *pp; pp = &(*pp)->next)
                if (*pp == a) {
                        *pp = a->next;
                        return;
                }
}

/* Maps the bytes of fd and reserves a device address for them. Call locked. */
static CUresult map_alloc(struct alloc *a) {
        void *dev, *host;

        host = mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
        if (host == MAP_FAILED)
                return GP_CUDA_ERROR_OUT_OF_MEMORY;
        dev = mmap(NULL, a->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (dev == MAP_FAILED) {
                munmap(host, a->size);
                return GP_CUDA_ERROR_OUT_OF_MEMORY;
        }
        a->host = host;
        a->dptr = (CUdeviceptr) (uintptr_t) dev;
        return GP_CUDA_SUCCESS;
}

static void unmap_alloc(struct alloc *a) {
        munmap(a->host, a->size);
        munmap((void *) (uintptr_t) a->dptr, a->size);
        close(a->fd);
}

static CUresult fk_MemAlloc_v2(CUdeviceptr *dptr, size_t size) {
        struct alloc *a;
        char path[256];
        CUresult r;
        int gpu;

        NEED_CTX();
        NO_UNSAFE_CALL_IN_CAPTURE();
        if (!dptr || size == 0)
                return GP_CUDA_ERROR_INVALID_VALUE;
        gpu = current()->gpu;
        size = (size + 4095) & ~(size_t) 4095;
        pthread_mutex_lock(&lock);
        if (!ledger_charge(gpu, size)) {
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_OUT_OF_MEMORY;     /* the GPU is full, with every process's memory */
        }
        a = calloc(1, sizeof(*a));
        if (!a) {
                ledger_uncharge(gpu, size);
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_OUT_OF_MEMORY;
        }
        a->id = next_id++;
        a->gpu = gpu;
        a->size = size;
        a->exporter = getpid();
        mem_path(path, sizeof(path), a->exporter, a->id);
        a->fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (a->fd < 0)
                fatal("cannot create %s: %s", path, strerror(errno));
        (void) fchmod(a->fd, 0666);     /* importers may run as another uid */
        if (ftruncate(a->fd, (off_t) size) < 0)
                fatal("cannot size %s: %s", path, strerror(errno));
        r = map_alloc(a);
        if (r) {
                close(a->fd);
                unlink(path);
                free(a);
                ledger_uncharge(gpu, size);
                pthread_mutex_unlock(&lock);
                return r;
        }
        a->next = allocs;
        allocs = a;
        pthread_mutex_unlock(&lock);
        *dptr = a->dptr;
        return GP_CUDA_SUCCESS;
}

static CUresult fk_MemFree_v2(CUdeviceptr dptr) {
        struct alloc *a;
        char path[256];

        NEED_CTX();
        NO_UNSAFE_CALL_IN_CAPTURE();
        pthread_mutex_lock(&lock);
        a = find_base(dptr);
        if (!a || a->imported) {
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_INVALID_VALUE;    /* not an allocation of ours (or an IPC mapping) */
        }
        mem_path(path, sizeof(path), a->exporter, a->id);
        if (flock(a->fd, LOCK_EX | LOCK_NB) < 0)
                fatal("cuMemFree of a %zu-byte allocation that another process still has open through "
                      "cuIpcOpenMemHandle: undefined behaviour in CUDA", a->size);
        unlink_alloc(a);
        ledger_uncharge(a->gpu, a->size);
        unlink(path);
        unmap_alloc(a);
        free(a);
        pthread_mutex_unlock(&lock);
        return GP_CUDA_SUCCESS;
}

static CUresult fk_MemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
        NEED_CTX();
        ledger_lock();
        *free_bytes = capacity - ledger_used(current()->gpu, true);     /* every process's memory counted */
        *total_bytes = capacity;
        ledger_unlock();
        return GP_CUDA_SUCCESS;
}

static CUresult fk_MemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr) {
        struct alloc *a;

        NEED_CTX();
        pthread_mutex_lock(&lock);
        a = find(dptr, 1);
        if (a) {
                if (base)
                        *base = a->dptr;
                if (size)
                        *size = a->size;
        }
        pthread_mutex_unlock(&lock);
        return a ? GP_CUDA_SUCCESS : GP_CUDA_ERROR_NOT_FOUND;
}

/* The 32-bit ABI of CUDA 2.0, which the unversioned names still export. */
static CUresult fk_MemAlloc_v1(unsigned *dptr, unsigned size) {
        CUdeviceptr p;
        CUresult r = fk_MemAlloc_v2(&p, size);

        if (r == GP_CUDA_SUCCESS)
                *dptr = (unsigned) p;          /* the top half of the address is lost */
        return r;
}

static CUresult fk_MemFree_v1(unsigned dptr) {
        return fk_MemFree_v2(dptr);
}

static CUresult fk_MemGetInfo_v1(unsigned *free_bytes, unsigned *total_bytes) {
        size_t f, t;
        CUresult r = fk_MemGetInfo_v2(&f, &t);

        if (r == GP_CUDA_SUCCESS) {
                *free_bytes = (unsigned) f;
                *total_bytes = (unsigned) t;
        }
        return r;
}

/* The host bytes behind [p, p + n) (an allocation, or a mapping made accessible), or NULL. */
static uint8_t *bytes_at(CUdeviceptr p, size_t n) {
        struct alloc *a;
        uint8_t *host = NULL;

        pthread_mutex_lock(&lock);
        a = find(p, n);
        if (a)
                host = a->host + (p - a->dptr);
        else
                host = vmap_bytes(p, n);
        pthread_mutex_unlock(&lock);
        return host;
}

static CUresult enqueue(gp_cu_stream hs, enum op_kind kind, CUdeviceptr p, uint32_t value, size_t n, size_t bytes);
static CUresult legacy_synchronize(void);

/*
 * The synchronous memsets go to the legacy stream and return at once for device memory (the
 * driver's "API synchronization behavior"); the synchronous copies run once the legacy stream,
 * and so every blocking stream's work queued before, has run.
 */
static CUresult fk_MemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n) {
        NEED_CTX();
        NO_UNSAFE_CALL_IN_CAPTURE();
        return enqueue(NULL, OP_MEMSET8, p, v, n, n);
}

static CUresult fk_MemsetD32_v2(CUdeviceptr p, unsigned v, size_t n) {
        NEED_CTX();
        NO_UNSAFE_CALL_IN_CAPTURE();
        if (p % 4 || n > SIZE_MAX / 4)
                return GP_CUDA_ERROR_INVALID_VALUE;
        return enqueue(NULL, OP_MEMSET32, p, v, n, n * 4);
}

static CUresult fk_MemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
        uint8_t *h;
        CUresult r;

        NEED_CTX();
        NO_UNSAFE_CALL_IN_CAPTURE();
        h = bytes_at(dst, n);
        if (!h)
                return GP_CUDA_ERROR_INVALID_VALUE;
        r = legacy_synchronize();
        if (r == GP_CUDA_SUCCESS)
                memcpy(h, src, n);
        return r;
}

static CUresult fk_MemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
        uint8_t *h;
        CUresult r;

        NEED_CTX();
        NO_UNSAFE_CALL_IN_CAPTURE();
        h = bytes_at(src, n);
        if (!h)
                return GP_CUDA_ERROR_INVALID_VALUE;
        r = legacy_synchronize();
        if (r == GP_CUDA_SUCCESS)
                memcpy(dst, h, n);
        return r;
}

/* ---- IPC ---- */

static CUresult fk_IpcGetMemHandle(gp_cu_ipc_mem_handle *handle, CUdeviceptr dptr) {
        struct wire_handle w = { .magic = HANDLE_MAGIC };
        struct alloc *a;

        NEED_CTX();
        pthread_mutex_lock(&lock);
        a = find_base(dptr);
        if (!a || a->imported) {
                /* The documented contract: the base of a cuMemAlloc allocation, nothing else. */
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_INVALID_VALUE;
        }
        w.gpu = a->gpu;
        w.pid = (int32_t) a->exporter;
        w.id = a->id;
        w.size = a->size;
        w.pidns = my_pidns;
        pthread_mutex_unlock(&lock);
        memset(handle, 0, sizeof(*handle));
        memcpy(handle->reserved, &w, sizeof(w));
        return GP_CUDA_SUCCESS;
}

static CUresult fk_IpcOpenMemHandle_v2(CUdeviceptr *dptr, gp_cu_ipc_mem_handle handle, unsigned flags) {
        struct wire_handle w;
        struct alloc *a;
        struct stat st;
        char path[256];
        CUresult r;

        NEED_CTX();
        NO_UNSAFE_CALL_IN_CAPTURE();
        memcpy(&w, handle.reserved, sizeof(w));
        if (!dptr || flags != GP_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
                return GP_CUDA_ERROR_INVALID_VALUE;
        if (w.magic != HANDLE_MAGIC || w.gpu < 0 || w.gpu >= gpus)
                return GP_CUDA_ERROR_INVALID_HANDLE;
        if (w.pidns != my_pidns)
                return GP_CUDA_ERROR_INVALID_CONTEXT;  /* as CUDA: not across PID namespaces (containers) */
        if (w.pid == getpid())
                return GP_CUDA_ERROR_INVALID_CONTEXT;  /* as CUDA: not in the exporting process */
        pthread_mutex_lock(&lock);
        for (a = allocs; a; a = a->next)
                if (a->imported && a->exporter == w.pid && a->id == w.id) {
                        a->opens++;
                        *dptr = a->dptr;
                        pthread_mutex_unlock(&lock);
                        return GP_CUDA_SUCCESS;
                }
        a = calloc(1, sizeof(*a));
        if (!a) {
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_OUT_OF_MEMORY;
        }
        mem_path(path, sizeof(path), w.pid, w.id);
        a->fd = open(path, O_RDWR | O_CLOEXEC);
        if (a->fd < 0 || fstat(a->fd, &st) < 0 || (uint64_t) st.st_size != w.size) {
                /* The exporter freed it (or never made it): a stale or forged handle. */
                if (a->fd >= 0)
                        close(a->fd);
                free(a);
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_INVALID_HANDLE;
        }
        (void) flock(a->fd, LOCK_SH);
        a->id = w.id;
        a->gpu = w.gpu;
        a->size = w.size;
        a->imported = true;
        a->opens = 1;
        a->exporter = w.pid;
        r = map_alloc(a);
        if (r) {
                close(a->fd);
                free(a);
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_MAP_FAILED;
        }
        a->next = allocs;
        allocs = a;
        *dptr = a->dptr;
        pthread_mutex_unlock(&lock);
        /* Mapping another process's allocation costs time that grows with its size. */
        {
                uint64_t ns = ipc_open_ns + ipc_open_ns_per_mib * (w.size >> 20);
                struct timespec ts = { .tv_sec = (time_t) (ns / 1000000000u), .tv_nsec = (long) (ns % 1000000000u) };

                while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                        ;
        }
        return GP_CUDA_SUCCESS;
}

static CUresult fk_IpcCloseMemHandle(CUdeviceptr dptr) {
        struct alloc *a;

        NEED_CTX();
        NO_UNSAFE_CALL_IN_CAPTURE();
        pthread_mutex_lock(&lock);
        a = find_base(dptr);
        if (!a || !a->imported) {
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_INVALID_VALUE;
        }
        if (--a->opens == 0) {
                unlink_alloc(a);
                unmap_alloc(a);
                free(a);
        }
        pthread_mutex_unlock(&lock);
        return GP_CUDA_SUCCESS;
}

/* ---- streams and events ---- */

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
static CUresult legacy_synchronize(void) {
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
        const char *dir = getenv("FAKECUDA_DIR");
        char path[512];
        int fd;

        snprintf(path, sizeof(path), "%s/fakecuda-memsets.hold", dir && *dir ? dir : "/dev/shm");
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

static CUresult fk_StreamCreate(gp_cu_stream *ret, unsigned flags) {
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
static CUresult fk_StreamDestroy_v2(gp_cu_stream hs) {
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

static CUresult fk_StreamGetId(gp_cu_stream hs, unsigned long long *id) {
        struct stream *s;
        CUresult r = ready();

        if (r)
                return r;
        if (!id)
                return GP_CUDA_ERROR_INVALID_VALUE;
        if (IS_DEFAULT_STREAM(hs)) {
                *id = (uintptr_t) hs == 2 ? ~0ULL - (unsigned long long) gettid() : 0;
                return GP_CUDA_SUCCESS;
        }
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

static CUresult fk_StreamSynchronize(gp_cu_stream hs) {
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
static CUresult fk_CtxSynchronize(void) {
        NEED_CTX();
        NO_UNSAFE_CALL_IN_CAPTURE();
        pthread_mutex_lock(&lock);
        wait_until(ctx_idle, current(), false);
        pthread_mutex_unlock(&lock);
        return GP_CUDA_SUCCESS;
}

static CUresult fk_StreamBeginCapture(gp_cu_stream hs, int mode) {
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

static CUresult fk_GraphDestroy(void *graph) {
        return graph ? GP_CUDA_SUCCESS : GP_CUDA_ERROR_INVALID_VALUE;
}

/* Ends a capture; the graph is a token (the fake launches no graphs). */
static CUresult fk_StreamEndCapture(gp_cu_stream hs, void **graph) {
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

static CUresult fk_StreamIsCapturing(gp_cu_stream hs, int *status) {
        struct stream *s;
        CUresult r = ready();

        if (r)
                return r;
        if (!status)
                return GP_CUDA_ERROR_INVALID_VALUE;
        if (IS_DEFAULT_STREAM(hs)) {
                *status = GP_CU_STREAM_CAPTURE_STATUS_NONE;
                return GP_CUDA_SUCCESS;
        }
        pthread_mutex_lock(&lock);
        s = stream_of(hs);
        if (s)
                *status = s->capture == CAPTURE_ACTIVE ? GP_CU_STREAM_CAPTURE_STATUS_ACTIVE :
                          s->capture == CAPTURE_INVALIDATED ? GP_CU_STREAM_CAPTURE_STATUS_INVALIDATED :
                          GP_CU_STREAM_CAPTURE_STATUS_NONE;
        pthread_mutex_unlock(&lock);
        return s ? GP_CUDA_SUCCESS : GP_CUDA_ERROR_INVALID_HANDLE;
}

static CUresult fk_ThreadExchangeStreamCaptureMode(int *mode) {
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

        NEED_CTX();
        h = bytes_at(p, bytes);
        if (!h)
                return GP_CUDA_ERROR_INVALID_VALUE;
        op = calloc(1, sizeof(*op));
        if (!op)
                return GP_CUDA_ERROR_OUT_OF_MEMORY;
        *op = (struct op) { .kind = kind, .dst = h, .value = value, .n = n };
        pthread_mutex_lock(&lock);
        s = stream_of(hs);
        if (!s || s->ctx != current() || s->capture != CAPTURE_NONE) {
                /* Another context's stream is refused; work captured becomes a graph node, not run now. */
                CUresult r = !s || s->ctx != current() ? GP_CUDA_ERROR_INVALID_HANDLE : GP_CUDA_SUCCESS;

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

static CUresult fk_MemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, gp_cu_stream s) {
        return enqueue(s, OP_MEMSET8, p, v, n, n);
}

static CUresult fk_MemsetD32Async(CUdeviceptr p, unsigned v, size_t n, gp_cu_stream s) {
        if (p % 4 || n > SIZE_MAX / 4)
                return GP_CUDA_ERROR_INVALID_VALUE;
        return enqueue(s, OP_MEMSET32, p, v, n, n * 4);
}

/* O(1), so that the fake's query costs what the driver's does, however many events live. */
static bool valid_event(struct event *e) {
        return e && e->magic == EVENT_MAGIC;
}

static CUresult fk_EventCreate(gp_cu_event *ret, unsigned flags) {
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
static CUresult fk_EventRecord(gp_cu_event he, gp_cu_stream hs) {
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
        pthread_mutex_unlock(&lock);
        return GP_CUDA_SUCCESS;
}

static bool event_done(const void *arg) {
        const struct event *e = arg;

        return !e->stream || e->stream->done >= e->seq;
}

static CUresult fk_EventQuery(gp_cu_event he) {
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
static CUresult fk_EventSynchronize(gp_cu_event he) {
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

static CUresult fk_EventDestroy_v2(gp_cu_event he) {
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

/* ---- stream-ordered allocation, for the benchmark's baseline ---- */

static CUresult fk_MemAllocAsync(CUdeviceptr *dptr, size_t size, gp_cu_stream s) {
        (void) s;
        return fk_MemAlloc_v2(dptr, size);
}

static CUresult fk_MemFreeAsync(CUdeviceptr dptr, gp_cu_stream s) {
        (void) s;
        return fk_MemFree_v2(dptr);
}

static CUresult fk_DeviceGetDefaultMemPool(gp_cu_mempool *pool, gp_cu_device d) {
        CUresult r = ready();

        if (r)
                return r;
        if (d < 0 || d >= nvisible)
                return GP_CUDA_ERROR_INVALID_DEVICE;
        *pool = (gp_cu_mempool) &ctxs[visible[d]];
        return GP_CUDA_SUCCESS;
}

static CUresult fk_MemPoolSetAttribute(gp_cu_mempool pool, int attr, void *value) {
        (void) pool, (void) attr;
        return value ? GP_CUDA_SUCCESS : GP_CUDA_ERROR_INVALID_VALUE;
}

/* The fake's stream-ordered frees free at once: there is never anything to trim. */
static CUresult fk_MemPoolTrimTo(gp_cu_mempool pool, size_t keep) {
        (void) keep;
        return pool ? GP_CUDA_SUCCESS : GP_CUDA_ERROR_INVALID_VALUE;
}

/* ---- errors and entry points ---- */

static CUresult fk_GetErrorName(CUresult r, const char **name) {
        static const struct { CUresult r; const char *name; } names[] = {
                { GP_CUDA_SUCCESS, "CUDA_SUCCESS" },
                { GP_CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE" },
                { GP_CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY" },
                { GP_CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED" },
                { GP_CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA_ERROR_DEVICE_UNAVAILABLE" },
                { GP_CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE" },
                { GP_CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE" },
                { GP_CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT" },
                { GP_CUDA_ERROR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED" },
                { GP_CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE" },
                { GP_CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND" },
                { GP_CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY" },
                { GP_CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE" },
                { GP_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED" },
                { GP_CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED" },
                { GP_CUDA_ERROR_CAPTURED_EVENT, "CUDA_ERROR_CAPTURED_EVENT" },
                { GP_CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD" },
        };

        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
                if (names[i].r == r) {
                        *name = names[i].name;
                        return GP_CUDA_SUCCESS;
                }
        *name = NULL;
        return GP_CUDA_ERROR_INVALID_VALUE;
}

struct symbol {
        const char *name;
        int version;                    /* the lowest cudaVersion that gets this ABI */
        void *fn;
};

#define SYM(name, version, fn) { name, version, (void *) fn }
static const struct symbol symbols[] = {
        SYM("cuInit", 2000, fk_Init),
        SYM("cuDriverGetVersion", 2020, fk_DriverGetVersion),
        SYM("cuGetErrorName", 6000, fk_GetErrorName),
        SYM("cuDeviceGetCount", 2000, fk_DeviceGetCount),
        SYM("cuDeviceGet", 2000, fk_DeviceGet),
        SYM("cuDeviceGetName", 2000, fk_DeviceGetName),
        SYM("cuDeviceGetUuid", 9020, fk_DeviceGetUuid),
        SYM("cuDeviceGetUuid", 11040, fk_DeviceGetUuid),
        SYM("cuDeviceGetAttribute", 2000, fk_DeviceGetAttribute),
        SYM("cuDevicePrimaryCtxRetain", 7000, fk_DevicePrimaryCtxRetain),
        SYM("cuDevicePrimaryCtxRelease", 11000, fk_DevicePrimaryCtxRelease),
        SYM("cuCtxPushCurrent", 4000, fk_CtxPushCurrent),
        SYM("cuCtxPopCurrent", 4000, fk_CtxPopCurrent),
        SYM("cuCtxSetCurrent", 4000, fk_CtxSetCurrent),
        SYM("cuCtxSynchronize", 2000, fk_CtxSynchronize),
        SYM("cuMemAlloc", 2000, fk_MemAlloc_v1),
        SYM("cuMemAlloc", 3020, fk_MemAlloc_v2),
        SYM("cuMemFree", 2000, fk_MemFree_v1),
        SYM("cuMemFree", 3020, fk_MemFree_v2),
        SYM("cuMemGetInfo", 2000, fk_MemGetInfo_v1),
        SYM("cuMemGetInfo", 3020, fk_MemGetInfo_v2),
        SYM("cuMemGetAddressRange", 3020, fk_MemGetAddressRange_v2),
        SYM("cuMemsetD8", 3020, fk_MemsetD8_v2),
        SYM("cuMemsetD32", 3020, fk_MemsetD32_v2),
        SYM("cuMemsetD8Async", 3020, fk_MemsetD8Async),
        SYM("cuMemsetD32Async", 3020, fk_MemsetD32Async),
        SYM("cuMemcpyHtoD", 3020, fk_MemcpyHtoD_v2),
        SYM("cuMemcpyDtoH", 3020, fk_MemcpyDtoH_v2),
        SYM("cuIpcGetMemHandle", 4010, fk_IpcGetMemHandle),
        SYM("cuIpcOpenMemHandle", 11000, fk_IpcOpenMemHandle_v2),
        SYM("cuIpcCloseMemHandle", 4010, fk_IpcCloseMemHandle),
        SYM("cuStreamCreate", 2000, fk_StreamCreate),
        SYM("cuStreamDestroy", 4000, fk_StreamDestroy_v2),
        SYM("cuStreamSynchronize", 2000, fk_StreamSynchronize),
        SYM("cuStreamGetId", 12000, fk_StreamGetId),
        SYM("cuStreamBeginCapture", 10010, fk_StreamBeginCapture),
        SYM("cuStreamEndCapture", 10000, fk_StreamEndCapture),
        SYM("cuStreamIsCapturing", 10000, fk_StreamIsCapturing),
        SYM("cuThreadExchangeStreamCaptureMode", 10010, fk_ThreadExchangeStreamCaptureMode),
        SYM("cuGraphDestroy", 10000, fk_GraphDestroy),
        SYM("cuEventCreate", 2000, fk_EventCreate),
        SYM("cuEventRecord", 2000, fk_EventRecord),
        SYM("cuEventQuery", 2000, fk_EventQuery),
        SYM("cuEventSynchronize", 2000, fk_EventSynchronize),
        SYM("cuEventDestroy", 4000, fk_EventDestroy_v2),
        SYM("cuMemAllocAsync", 11020, fk_MemAllocAsync),
        SYM("cuMemFreeAsync", 11020, fk_MemFreeAsync),
        SYM("cuDeviceGetDefaultMemPool", 11020, fk_DeviceGetDefaultMemPool),
        SYM("cuMemPoolSetAttribute", 11020, fk_MemPoolSetAttribute),
        SYM("cuMemPoolTrimTo", 11020, fk_MemPoolTrimTo),
        SYM("cuMemGetAllocationGranularity", 10020, fk_MemGetAllocationGranularity),
        SYM("cuMemCreate", 10020, fk_MemCreate),
        SYM("cuMemRelease", 10020, fk_MemRelease),
        SYM("cuMemExportToShareableHandle", 10020, fk_MemExportToShareableHandle),
        SYM("cuMemImportFromShareableHandle", 10020, fk_MemImportFromShareableHandle),
        SYM("cuMemGetAllocationPropertiesFromHandle", 10020, fk_MemGetAllocationPropertiesFromHandle),
        SYM("cuMemAddressReserve", 10020, fk_MemAddressReserve),
        SYM("cuMemAddressFree", 10020, fk_MemAddressFree),
        SYM("cuMemMap", 10020, fk_MemMap),
        SYM("cuMemUnmap", 10020, fk_MemUnmap),
        SYM("cuMemSetAccess", 10020, fk_MemSetAccess),
};

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, int *status) {
        const struct symbol *best = NULL;
        bool named = false;

        if (!symbol || !pfn || version > FAKE_DRIVER_VERSION || flags > 2)
                return GP_CUDA_ERROR_INVALID_VALUE;
        for (size_t i = 0; i < sizeof(symbols) / sizeof(symbols[0]); i++) {
                if (strcmp(symbols[i].name, symbol) != 0)
                        continue;
                named = true;
                if (symbols[i].version <= version && (!best || symbols[i].version > best->version))
                        best = &symbols[i];
        }
        *pfn = best ? best->fn : NULL;
        if (status)
                *status = best ? 0 : named ? 2 : 1;    /* SUCCESS, VERSION_NOT_SUFFICIENT, SYMBOL_NOT_FOUND */
        return GP_CUDA_SUCCESS;
}

/* The unversioned names, exported as the real driver exports them: the 32-bit ABI. */
EXPORT CUresult cuInit(unsigned flags) { return fk_Init(flags); }
EXPORT CUresult cuMemAlloc(unsigned *dptr, unsigned size) { return fk_MemAlloc_v1(dptr, size); }
EXPORT CUresult cuMemFree(unsigned dptr) { return fk_MemFree_v1(dptr); }
EXPORT CUresult cuMemGetInfo(unsigned *free_bytes, unsigned *total_bytes) { return fk_MemGetInfo_v1(free_bytes, total_bytes); }

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

/* A call counter's value, read locked. */
static unsigned long long counted(const unsigned long long *counter) {
        unsigned long long n;

        pthread_mutex_lock(&lock);
        n = *counter;
        pthread_mutex_unlock(&lock);
        return n;
}

/* How many times cuEventQuery was called in this process. */
EXPORT unsigned long long fakecuda_event_queries(void) {
        return counted(&event_queries);
}

/* How many times cuMemSetAccess was called in this process. */
EXPORT unsigned long long fakecuda_set_access_calls(void) {
        return counted(&set_access_calls);
}

/* From now on event queries and waits fail with r (0: work again), as on a context lost to a fault. */
EXPORT void fakecuda_fail_events(int r) {
        pthread_mutex_lock(&lock);
        event_failure = r;
        pthread_cond_broadcast(&cond);
        pthread_mutex_unlock(&lock);
}

/* How many mappings of device memory this process has: IPC handles open, and VMM mappings. */
EXPORT int fakecuda_open_handles(void) {
        int n = 0;

        pthread_mutex_lock(&lock);
        for (struct alloc *a = allocs; a; a = a->next)
                n += a->imported;
        for (struct vmap *m = vmaps; m; m = m->next)
                n++;            /* another process's memory mapped here, or ours: a mapping each */
        pthread_mutex_unlock(&lock);
        return n;
}
