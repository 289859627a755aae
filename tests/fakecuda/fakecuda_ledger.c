/*
 * fakecuda_ledger.c: the node's device memory, as every process of the node sees it: a file in
 * $FAKECUDA_DIR that each process maps, with a slot per process that has called cuInit. A
 * process charges its allocations and contexts to its own slot; cuMemGetInfo and a cuMemAlloc
 * that would not fit count every running process's. A process that has exited (or is a
 * zombie) counts for nothing, as the driver frees what a process had when it exits; so is
 * cuMemCreate memory that no process holds a handle, descriptor or mapping of any more.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake.h"

#define LEDGER_SLOTS 256
/* Exports of the node that may still be open somewhere (ledger_export_alive()): more than 8 GPUs' stocks ahead. */
#define LEDGER_EXPORTS 1024
struct ledger_export {
        uint64_t id;                    /* the allocation's number */
        int32_t gpu;
        int32_t pad;
};
struct ledger_slot {
        int32_t pid;                    /* 0: free */
        uint32_t vmm_holder;            /* it has held cuMemCreate memory: its exit may leave some unheld */
        uint64_t start_time;            /* /proc/PID/stat starttime: a reused pid is another process */
        uint64_t bytes[MAX_GPUS];       /* allocations and contexts, by physical GPU */
};
struct ledger_file {
        uint64_t vmm_bytes[MAX_GPUS];   /* cuMemCreate memory alive, whoever holds it (see vmm_sweep) */
        uint64_t vmm_last_id;           /* the node's last cuMemCreate allocation (its file's name, its byte in the holds) */
        uint64_t vmm_fd_only;           /* allocations last seen held by exported descriptors alone (see vmm_sweep) */
        uint64_t vmm_exits;             /* holders of cuMemCreate memory that exited since the last sweep */
        uint32_t nexports;              /* exports[]' entries, oldest first */
        uint32_t pad;
        struct ledger_export exports[LEDGER_EXPORTS];
        struct ledger_slot slots[LEDGER_SLOTS];
};
static struct ledger_file *ledger;      /* shared */
static int ledger_fd = -1;
static struct ledger_slot *my_slot;

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
        if (l->vmm_holder)
                ledger->vmm_exits++;    /* what it held may be nobody's now: the next check sweeps */
        memset(l, 0, sizeof(*l));
}

/* Maps the ledger and takes a slot for this process (one left by an exited process if need be). */
void ledger_join(void) {
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

/* A new cuMemCreate allocation's number, unique on the node. Under ledger_lock(). */
uint64_t ledger_vmm_id(void) {
        return ++ledger->vmm_last_id;
}

/*
 * cuMemCreate memory is a file, fakecuda-vmm-GPU-ID, held as the driver holds it, with no
 * descriptor per allocation in any process: a process that holds a handle or a mapping of it
 * has a read lock on byte ID of fakecuda-vmm-holds (an open file description lock, on the one
 * descriptor of that file the process has: vmm_hold()); an exported descriptor is a descriptor
 * of the file itself, with a shared flock() on it, wherever it has been passed. Nobody holding
 * either: the driver would have freed it, and so does this, under ledger_lock(). Returns
 * whether path was freed.
 */
int vmm_free_if_unheld(const char *path, int gpu, uint64_t size) {
        unsigned long long id;
        const char *name = strrchr(path, '/');
        int fd = open(path, O_RDONLY | O_CLOEXEC), r;
        bool by_fd;

        if (fd < 0 || !name || sscanf(name, "/fakecuda-vmm-%*d-%llu", &id) != 1) {
                if (fd >= 0)
                        close(fd);
                return 0;
        }
        by_fd = flock(fd, LOCK_EX | LOCK_NB) < 0;
        r = vmm_held(id) ? 0 : by_fd ? -1 : 1;
        if (r == 1) {
                unlink(path);
                __atomic_sub_fetch(&ledger->vmm_bytes[gpu], size, __ATOMIC_RELAXED);
        } else if (r == -1) {
                __atomic_add_fetch(&ledger->vmm_fd_only, 1, __ATOMIC_RELAXED);
        }
        close(fd);
        return r;
}

void ledger_vmm_holder(void) {
        my_slot->vmm_holder = 1;
}

/*
 * Frees the cuMemCreate memory no process holds any more (its holders exited, or closed the last
 * descriptor of it), and counts again what only descriptors hold. Each file is looked at, so it
 * runs only when something may have let go unseen (ledger_used()), as the driver's own
 * bookkeeping costs a cuMemGetInfo nothing. Under ledger_lock().
 */
static void vmm_sweep(void) {
        struct dirent *e;
        DIR *dir = opendir(mem_dir());

        ledger->vmm_fd_only = 0;
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
uint64_t ledger_used(int gpu, bool check) {
        uint64_t sum;

        for (int i = 0; check && i < LEDGER_SLOTS; i++) {
                struct ledger_slot *l = &ledger->slots[i];

                if (l->pid && l != my_slot && process_start(l->pid) != l->start_time)
                        forget_process(l);
        }
        if (check && (ledger->vmm_exits || ledger->vmm_fd_only)) {
                ledger->vmm_exits = 0;
                vmm_sweep();
        }
        sum = __atomic_load_n(&ledger->vmm_bytes[gpu], __ATOMIC_RELAXED);
        for (int i = 0; i < LEDGER_SLOTS; i++)
                sum += ledger->slots[i].pid ? __atomic_load_n(&ledger->slots[i].bytes[gpu], __ATOMIC_RELAXED) : 0;
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
bool ledger_charge(int gpu, uint64_t size) {
        bool ok;

        ledger_lock();
        ok = ledger_fits(gpu, size);
        if (ok)
                __atomic_add_fetch(&my_slot->bytes[gpu], size, __ATOMIC_RELAXED);
        ledger_unlock();
        return ok;
}

void ledger_uncharge(int gpu, uint64_t size) {
        __atomic_sub_fetch(&my_slot->bytes[gpu], size, __ATOMIC_RELAXED);
}

/* Whether an exported descriptor of allocation e is open anywhere (its file holds a shared flock() of an export). */
static bool export_open(const struct ledger_export *e) {
        char path[512];
        bool open_somewhere;
        int fd;

        snprintf(path, sizeof(path), "%s/fakecuda-vmm-%d-%llu", mem_dir(), (int) e->gpu, (unsigned long long) e->id);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return false;           /* freed: nothing of it is open */
        open_somewhere = flock(fd, LOCK_EX | LOCK_NB) < 0;
        close(fd);                      /* and with it the lock, where it got one */
        return open_somewhere;
}

/* Forgets exports[i]. */
static void export_forget(uint32_t i) {
        memmove(&ledger->exports[i], &ledger->exports[i + 1], (ledger->nexports - i - 1) * sizeof(ledger->exports[0]));
        ledger->nexports--;
}

/*
 * The node's exported descriptors: whether any is open anywhere, as the driver counts them in one
 * count for the whole host. Exports are recorded as they are made; those whose every copy was
 * closed since are forgotten as they are met, oldest first, up to the first still open. Then
 * (gpu, id)'s export, about to be made, is recorded. Under ledger_lock().
 */
bool ledger_export_alive(int gpu, uint64_t id) {
        struct ledger_export mine = { .id = id, .gpu = gpu };
        bool alive = false, recorded = false;

        while (ledger->nexports && !(alive = export_open(&ledger->exports[0])))
                export_forget(0);
        for (uint32_t i = 0; i < ledger->nexports && !recorded; i++)
                recorded = ledger->exports[i].id == id;
        if (!recorded && ledger->nexports == LEDGER_EXPORTS)
                for (uint32_t i = LEDGER_EXPORTS; i-- > 1;)     /* full: forget every closed one (the first is open) */
                        if (!export_open(&ledger->exports[i]))
                                export_forget(i);
        if (!recorded && ledger->nexports < LEDGER_EXPORTS)
                ledger->exports[ledger->nexports++] = mine;
        return alive;
}
