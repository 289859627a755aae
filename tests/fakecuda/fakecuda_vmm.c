/*
 * fakecuda_vmm.c: the fake driver's virtual memory management: cuMemCreate memory shared as
 * POSIX descriptors, address reservations, mappings and their access, with the documented
 * rules fakecuda.c's top comment lists (granularity, offset 0 and whole allocations, access
 * set before use, whole mappings unmapped, memory alive while any handle, descriptor or
 * mapping of it exists). cuMemCreate memory is a file, fakecuda-vmm-GPU-ID, in
 * $FAKECUDA_DIR, charged to the node's ledger.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake.h"

#define VMM_GRANULE (2ULL << 20)        /* what an H100 reports as MINIMUM and RECOMMENDED */

/*
 * A physical allocation this process holds a handle to (cuMemCreate, or imported from a
 * descriptor). It keeps no descriptor, as the driver keeps none: the process holds the memory
 * by a lock on the allocation's byte of the node's holds file (vmm_hold()).
 */
struct phys {
        struct gp_rb_node by_handle;    /* in physes */
        struct gp_rb_node by_id;        /* in phys_ids */
        char path[256];
        uint64_t id;                    /* the node's number for the allocation */
        uint64_t block_id;              /* what CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID says of its mappings here */
        int gpu;
        uint64_t size;
        bool exportable;                /* made with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (an import is not) */
        int handles;                    /* cuMemCreate or import, less cuMemRelease */
        int maps;                       /* mappings made with it */
};

struct reservation {
        struct gp_rb_node by_base;      /* in reservations */
        CUdeviceptr base;
        size_t size;
        void *mapped;                   /* the PROT_NONE reservation (aligned inside) */
        size_t mapped_size;
        /*
         * Where the host reaches what is mapped in it, at the same offsets: mappings side by
         * side are one run of bytes there, as they are one range of device addresses.
         */
        uint8_t *shadow;
};

/*
 * What each call takes, as an H200 with driver 580.159.04 took it, each call charged apart so
 * that a change in which calls a program makes shows in what it costs. Medians of bench-gpu
 * and bench-driver at 48e6b6b (bench/results/2026-11-27-H200-48e6b6b/): cuMemCreate 20 us for
 * 2 MiB to 27 us for 1 GiB, cuMemExportToShareableHandle 33 us, cuMemImportFromShareableHandle
 * 27-31 us; of a 2 MiB granule's move (bench-driver), cuMemMap 1.1 us, cuMemSetAccess 28 us and
 * cuMemUnmap 19 us. bench-gpu timed only sums beyond that: a reserve, map and access 30 us for
 * 2 MiB to 93 us for 1 GiB, an unmap, release and address free 28 us to 57 us. The rest of each
 * sum goes to the call not timed alone (the reserve 0.8 us; the release and address free 9 us,
 * charged to cuMemRelease), and the growth with size to cuMemSetAccess and cuMemUnmap, which
 * walk the range's page tables (an assumption: no run timed map and access apart past 2 MiB).
 * A call takes that long from its start, the fake's own work (files, mappings) within it, not
 * on top of it. $FAKECUDA_VMM_COSTS=0 makes them free.
 *
 * An export when no exported descriptor is open anywhere on the node costs export_build more:
 * the driver copies each exported object into one internal client for the whole host, built
 * (a client, a device and a subdevice, each a round trip to the GPU's firmware, under the
 * driver's lock) when the host's count of live exports leaves zero and torn down when the last
 * such descriptor anywhere is closed (NVIDIA's open kernel modules, 580 branch,
 * rmobjexportimport.c: hObjExportRmClient, objExportImportRefCount). gpupoold's pattern, each
 * export sent and closed before the next, took that count to zero every time: on an H200 at
 * 2813daa its exports took about 600 us in one ioctl (strace) where the probe's, with some
 * export always open, took 20-35 us (bench/results/2026-11-28-H200-2813daa/). The teardown is
 * paid by the last close() of such a descriptor, which the fake cannot see (a plain file's):
 * it charges the build alone.
 */
static struct {
        uint64_t create, create_per_mib, export_, export_build, import, reserve, map, access, access_per_mib, unmap,
                unmap_per_mib, release;
} cost;

void vmm_init(void) {
        const char *v = getenv("FAKECUDA_VMM_COSTS");

        if (v && strcmp(v, "0") == 0)
                return;
        cost.create = 20000;
        cost.create_per_mib = 7;
        cost.export_ = 33000;
        cost.export_build = 570000;
        cost.import = 28000;
        cost.reserve = 800;
        cost.map = 1100;
        cost.access = 28000;
        cost.access_per_mib = 62;
        cost.unmap = 18600;
        cost.unmap_per_mib = 29;
        cost.release = 9000;
}

/*
 * What this process holds, in trees: a lookup takes a few steps however many there are, as
 * the driver's take no longer with thousands (lists made a program of 4,000 granules pay the
 * fake's own scans on every call).
 */
static int cmp_handle(const struct gp_rb_node *a, const struct gp_rb_node *b) {
        return (a > b) - (a < b);       /* the node is the phys's first member: its address orders */
}

static int cmp_phys_id(const struct gp_rb_node *a, const struct gp_rb_node *b) {
        const struct phys *x = gp_rb_entry(a, struct phys, by_id), *y = gp_rb_entry(b, struct phys, by_id);

        if (x->id != y->id)
                return x->id < y->id ? -1 : 1;
        return (x > y) - (x < y);
}

static int cmp_base(const struct gp_rb_node *a, const struct gp_rb_node *b) {
        CUdeviceptr x = gp_rb_entry(a, struct reservation, by_base)->base, y = gp_rb_entry(b, struct reservation, by_base)->base;

        return (x > y) - (x < y);
}

static int cmp_vmap(const struct gp_rb_node *a, const struct gp_rb_node *b) {
        CUdeviceptr x = gp_rb_entry(a, struct vmap, by_ptr)->ptr, y = gp_rb_entry(b, struct vmap, by_ptr)->ptr;

        return (x > y) - (x < y);
}

static struct gp_rb_tree physes = { .cmp = cmp_handle }, phys_ids = { .cmp = cmp_phys_id };
static struct gp_rb_tree reservations = { .cmp = cmp_base };
struct gp_rb_tree vmaps = { .cmp = cmp_vmap };

static struct phys *phys_of(gp_cu_mem_handle h) {
        struct gp_rb_node *n = gp_rb_find(&physes, (const struct gp_rb_node *) (uintptr_t) h);
        struct phys *p = n ? gp_rb_entry(n, struct phys, by_handle) : NULL;

        return p && p->handles + p->maps > 0 ? p : NULL;
}

/* A valid prop for a device allocation of ours; its physical GPU in *gpu. */
static CUresult check_prop(const gp_cu_mem_prop *prop, int *gpu) {
        if (vmm_off)
                return GP_CUDA_ERROR_NOT_SUPPORTED;
        if (!prop || prop->type != GP_CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != GP_CU_MEM_LOCATION_TYPE_DEVICE ||
            (prop->requested_handle_types & ~GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) || prop->win32_handle_meta_data)
                return GP_CUDA_ERROR_INVALID_VALUE;
        if (prop->location.id < 0 || prop->location.id >= nvisible)
                return GP_CUDA_ERROR_INVALID_DEVICE;
        *gpu = visible[prop->location.id];
        return GP_CUDA_SUCCESS;
}

CUresult fk_MemGetAllocationGranularity(size_t *granularity, const gp_cu_mem_prop *prop, gp_cu_mem_granularity_flags option) {
        CUresult r = ready();
        int gpu;

        if (r)
                return r;
        if (!granularity || (option != GP_CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != GP_CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
                return GP_CUDA_ERROR_INVALID_VALUE;
        r = check_prop(prop, &gpu);
        if (r)
                return r;
        *granularity = VMM_GRANULE;
        return GP_CUDA_SUCCESS;
}

/* The node's holds file, one descriptor of it per process; -1 until the first hold. */
static int holds_fd = -1;

/* Locks (F_RDLCK) or unlocks (F_UNLCK) allocation id's byte of the holds file for this process. */
static int holds_lock(uint64_t id, short type) {
        struct flock fl = { .l_type = type, .l_whence = SEEK_SET, .l_start = (off_t) id, .l_len = 1 };
        char path[256];

        if (holds_fd < 0) {
                snprintf(path, sizeof(path), "%s/fakecuda-vmm-holds", mem_dir());
                holds_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
                if (holds_fd < 0)
                        return -1;
                (void) fchmod(holds_fd, 0666);  /* processes of other uids share it */
                ledger_vmm_holder();    /* this process's own slot: no lock needed */
        }
        while (fcntl(holds_fd, F_OFD_SETLKW, &fl) < 0)
                if (errno != EINTR)
                        return -1;
        return 0;
}

bool vmm_held(uint64_t id) {
        struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = (off_t) id, .l_len = 1 };
        char path[256];
        int fd;

        snprintf(path, sizeof(path), "%s/fakecuda-vmm-holds", mem_dir());
        if ((fd = open(path, O_RDWR | O_CLOEXEC)) < 0)
                return false;   /* nobody ever held one */
        /* A description of its own: this process's holds count too. */
        if (fcntl(fd, F_OFD_GETLK, &fl) < 0)
                fl.l_type = F_RDLCK;    /* cannot tell: held */
        close(fd);
        return fl.l_type != F_UNLCK;
}

/* Whether this process holds allocation id already, by another handle. Call locked. */
static bool phys_holds(uint64_t id) {
        struct phys key = { .id = id };
        struct gp_rb_node *n = gp_rb_lower_bound(&phys_ids, &key.by_id);

        /* The tree orders by (id, address): a phys of id is the first after the key's place, or the last before it. */
        if (n && gp_rb_entry(n, struct phys, by_id)->id == id)
                return true;
        n = gp_rb_floor(&phys_ids, &key.by_id);
        return n && gp_rb_entry(n, struct phys, by_id)->id == id;
}

/* Holds allocation id (file path) as a handle of this process. Call locked. */
static CUresult phys_hold(const char *path, uint64_t id, int gpu, uint64_t size, bool exportable, gp_cu_mem_handle *ret) {
        static uint64_t last_block_id;
        struct phys *p = calloc(1, sizeof(*p));

        if (!p)
                return GP_CUDA_ERROR_OUT_OF_MEMORY;
        if (!phys_holds(id) && holds_lock(id, F_RDLCK) < 0) {
                free(p);
                return GP_CUDA_ERROR_INVALID_VALUE;
        }
        snprintf(p->path, sizeof(p->path), "%s", path);
        p->id = id;
        /*
         * $FAKECUDA_BLOCK_IDS=allocation: one id for every import of an allocation. Else each
         * handle its own, counted in this process from small numbers, as an H200 gave them
         * (another process's ids are the same numbers for other memory).
         */
        p->block_id = block_ids_by_allocation ? id : ++last_block_id;
        p->gpu = gpu;
        p->size = size;
        p->exportable = exportable;
        p->handles = 1;
        (void) gp_rb_insert(&physes, &p->by_handle);
        (void) gp_rb_insert(&phys_ids, &p->by_id);
        *ret = (gp_cu_mem_handle) (uintptr_t) p;
        return GP_CUDA_SUCCESS;
}

/* This process lets go of p (no handle, no mapping left): freed once nobody holds it. Call locked. */
static void phys_drop(struct phys *p) {
        gp_rb_remove(&physes, &p->by_handle);
        gp_rb_remove(&phys_ids, &p->by_id);
        ledger_lock();
        if (!phys_holds(p->id))
                (void) holds_lock(p->id, F_UNLCK);
        (void) vmm_free_if_unheld(p->path, p->gpu, p->size);
        ledger_unlock();
        free(p);
}

CUresult fk_MemCreate(gp_cu_mem_handle *handle, size_t size, const gp_cu_mem_prop *prop, unsigned long long flags) {
        uint64_t t0 = fake_now_ns();
        unsigned long long id;
        char path[256];
        CUresult r;
        int gpu, fd;

        NEED_CTX();
        NO_UNSAFE_CALL_IN_CAPTURE();
        if (prop && (prop->requested_handle_types & FK_MEM_HANDLE_TYPE_FABRIC) && !vmm_off)
                return GP_CUDA_ERROR_NOT_PERMITTED;    /* no fabric (IMEX) channel to this process, as on an H200 */
        r = check_prop(prop, &gpu);
        if (r)
                return r;
        if (!handle || flags || size == 0 || size % VMM_GRANULE)
                return GP_CUDA_ERROR_INVALID_VALUE;    /* a multiple of the granularity, as documented */
        pthread_mutex_lock(&lock);
        /* Made and held under the ledger's lock: a sweep never sees it unheld. */
        ledger_lock();
        if (!ledger_fits(gpu, size)) {
                ledger_unlock();
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_OUT_OF_MEMORY;
        }
        id = ledger_vmm_id();
        snprintf(path, sizeof(path), "%s/fakecuda-vmm-%d-%llu", mem_dir(), gpu, (unsigned long long) id);
        fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 || fchmod(fd, 0666) < 0 || ftruncate(fd, (off_t) size) < 0)
                fatal("cannot make %s: %s", path, strerror(errno));
        close(fd);
        r = phys_hold(path, id, gpu, size, prop->requested_handle_types & GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, handle);
        if (r == GP_CUDA_SUCCESS)
                ledger_vmm_charge(gpu, size);
        else
                unlink(path);
        ledger_unlock();
        pthread_mutex_unlock(&lock);
        fake_spend_since(t0, cost.create + cost.create_per_mib * (size >> 20));
        return r;
}

CUresult fk_MemRelease(gp_cu_mem_handle handle) {
        uint64_t t0 = fake_now_ns();
        struct phys *p;

        NEED_CTX();
        pthread_mutex_lock(&lock);
        p = phys_of(handle);
        if (!p || p->handles == 0) {
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_INVALID_VALUE;
        }
        /* The memory stays while mapped: the documented rule, which lets a mapping outlive the handle. */
        if (--p->handles == 0 && p->maps == 0)
                phys_drop(p);
        pthread_mutex_unlock(&lock);
        fake_spend_since(t0, cost.release);
        return GP_CUDA_SUCCESS;
}

/*
 * Counts an export node-wide, for the tests: a byte appended to $FAKECUDA_DIR/fakecuda-exports
 * for each, and to fakecuda-export-builds for each that found no other export open on the node.
 */
static void count_export(const char *name) {
        char path[4096];
        int fd;

        snprintf(path, sizeof(path), "%s/%s", mem_dir(), name);
        fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
        if (fd >= 0) {
                if (write(fd, "e", 1) < 0) {
                        /* a count the tests read; the export stands without it */
                }
                close(fd);
        }
}

CUresult fk_MemExportToShareableHandle(void *shareable, gp_cu_mem_handle handle, gp_cu_mem_handle_type type,
                                       unsigned long long flags) {
        uint64_t t0 = fake_now_ns();
        struct phys *p;
        bool alive;
        int fd;

        NEED_CTX();
        if (!shareable || flags || type != GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
                return GP_CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&lock);
        p = phys_of(handle);
        if (!p || p->handles == 0 || !p->exportable) {
                /* Only memory made with the descriptor handle type requested can be exported as one. */
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_INVALID_VALUE;
        }
        /* A descriptor of its own, locked: the memory lives while any copy of it is open, in any process. */
        ledger_lock();
        alive = ledger_export_alive(p->gpu, p->id);
        fd = open(p->path, O_RDWR | O_CLOEXEC);
        if (fd >= 0 && flock(fd, LOCK_SH) < 0) {
                close(fd);
                fd = -1;
        }
        ledger_unlock();
        pthread_mutex_unlock(&lock);
        if (fd < 0)
                return GP_CUDA_ERROR_OUT_OF_MEMORY;
        count_export("fakecuda-exports");
        if (!alive)
                count_export("fakecuda-export-builds");
        fake_spend_since(t0, cost.export_ + (alive ? 0 : cost.export_build));
        *(int *) shareable = fd;
        return GP_CUDA_SUCCESS;
}

CUresult fk_MemImportFromShareableHandle(gp_cu_mem_handle *handle, void *os_handle, gp_cu_mem_handle_type type) {
        uint64_t t0 = fake_now_ns();
        int fd = (int) (uintptr_t) os_handle, gpu;
        char link[64], path[256], prefix[280];
        unsigned long long id;
        struct stat st;
        ssize_t n;
        CUresult r;

        NEED_CTX();
        if (!handle || type != GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || fd < 0 || fstat(fd, &st) < 0)
                return GP_CUDA_ERROR_INVALID_VALUE;
        /* The descriptor by value, as the driver takes it: what it names must be memory of ours. */
        snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
        n = readlink(link, path, sizeof(path) - 1);
        if (n <= 0)
                return GP_CUDA_ERROR_INVALID_VALUE;
        path[n] = '\0';
        snprintf(prefix, sizeof(prefix), "%s/fakecuda-vmm-", mem_dir());
        if (strncmp(path, prefix, strlen(prefix)) != 0 || sscanf(path + strlen(prefix), "%d-%llu", &gpu, &id) != 2 || gpu < 0 ||
            gpu >= gpus)
                return GP_CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&lock);
        /*
         * Not exportable: an H200 refused to export an imported handle (CUDA_ERROR_INVALID_VALUE,
         * driver 580.159.04, bench/results/2026-11-28-H200-d2ec017/), so memory goes on from the
         * process that made it only.
         */
        r = phys_hold(path, id, gpu, (uint64_t) st.st_size, false, handle);
        pthread_mutex_unlock(&lock);
        fake_spend_since(t0, cost.import);
        return r;
}

/*
 * What the handle was made with; an imported one's location is its GPU's ordinal in this
 * process, and it carries no requested handle types: the driver does not promise that an import
 * keeps the creator's, and on an H200 (driver 580.159.04) an imported handle's properties failed
 * a check of type and handle types that the location passed (bench/results/2026-11-27-H200-48e6b6b/).
 */
CUresult fk_MemGetAllocationPropertiesFromHandle(gp_cu_mem_prop *prop, gp_cu_mem_handle handle) {
        struct phys *p;
        int ordinal = -1;

        NEED_CTX();
        if (!prop)
                return GP_CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&lock);
        p = phys_of(handle);
        if (!p || p->handles == 0) {
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_INVALID_VALUE;
        }
        for (int i = 0; i < nvisible && ordinal < 0; i++)
                if (visible[i] == p->gpu)
                        ordinal = i;
        memset(prop, 0, sizeof(*prop));
        prop->type = GP_CU_MEM_ALLOCATION_TYPE_PINNED;
        prop->requested_handle_types = p->exportable ? GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : 0;
        prop->location.type = GP_CU_MEM_LOCATION_TYPE_DEVICE;
        prop->location.id = ordinal;
        pthread_mutex_unlock(&lock);
        return ordinal < 0 ? GP_CUDA_ERROR_INVALID_DEVICE : GP_CUDA_SUCCESS;
}

CUresult fk_MemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                              unsigned long long flags) {
        uint64_t t0 = fake_now_ns();
        struct reservation *v;
        size_t align = alignment ? alignment : VMM_GRANULE;
        uint8_t *m;

        NEED_CTX();
        (void) addr;            /* a hint, which the driver may ignore too */
        if (!ptr || flags || size == 0 || size % (size_t) sysconf(_SC_PAGESIZE) || (align & (align - 1)))
                return GP_CUDA_ERROR_INVALID_VALUE;
        v = calloc(1, sizeof(*v));
        if (!v)
                return GP_CUDA_ERROR_OUT_OF_MEMORY;
        v->mapped_size = size + align;
        v->mapped = mmap(NULL, v->mapped_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (v->mapped == MAP_FAILED) {
                free(v);
                return GP_CUDA_ERROR_OUT_OF_MEMORY;
        }
        v->shadow = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (v->shadow == MAP_FAILED) {
                munmap(v->mapped, v->mapped_size);
                free(v);
                return GP_CUDA_ERROR_OUT_OF_MEMORY;
        }
        m = (uint8_t *) (((uintptr_t) v->mapped + align - 1) & ~(uintptr_t) (align - 1));
        v->base = (CUdeviceptr) (uintptr_t) m;
        v->size = size;
        pthread_mutex_lock(&lock);
        (void) gp_rb_insert(&reservations, &v->by_base);
        pthread_mutex_unlock(&lock);
        *ptr = v->base;
        fake_spend_since(t0, cost.reserve);
        return GP_CUDA_SUCCESS;
}

/* The reservation [p, p + n) lies in (reservations never overlap), or NULL. Call locked. */
static struct reservation *reservation_of(CUdeviceptr p, size_t n) {
        struct reservation key = { .base = p };
        struct gp_rb_node *x = gp_rb_floor(&reservations, &key.by_base);
        struct reservation *v = x ? gp_rb_entry(x, struct reservation, by_base) : NULL;

        return v && within(p, n, v->base, v->size) ? v : NULL;
}

/* The first mapping at or after address at, or NULL. Call locked. */
static struct vmap *vmap_from(CUdeviceptr at) {
        struct vmap key = { .ptr = at };
        struct gp_rb_node *x = gp_rb_lower_bound(&vmaps, &key.by_ptr);

        return x ? gp_rb_entry(x, struct vmap, by_ptr) : NULL;
}

static struct vmap *vmap_next(struct vmap *m) {
        struct gp_rb_node *x = gp_rb_next(&m->by_ptr);

        return x ? gp_rb_entry(x, struct vmap, by_ptr) : NULL;
}

/* The mapping containing address at, or NULL (mappings never overlap). Call locked. */
static struct vmap *vmap_at(CUdeviceptr at) {
        struct vmap key = { .ptr = at };
        struct gp_rb_node *x = gp_rb_floor(&vmaps, &key.by_ptr);
        struct vmap *m = x ? gp_rb_entry(x, struct vmap, by_ptr) : NULL;

        return m && at < m->ptr + m->size ? m : NULL;
}

/* Whether any mapping overlaps [p, p + n). */
static bool mapped_in(CUdeviceptr p, size_t n) {
        struct vmap *m = vmap_at(p);

        if (m)
                return true;
        m = vmap_from(p);
        return m && m->ptr < p + n;
}

CUresult fk_MemAddressFree(CUdeviceptr ptr, size_t size) {
        NEED_CTX();
        struct reservation *v;

        pthread_mutex_lock(&lock);
        v = reservation_of(ptr, size);
        /* The whole reservation, and nothing mapped in it: the documented order is unmap, release, free. */
        if (!v || v->base != ptr || v->size != size || mapped_in(ptr, size)) {
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_INVALID_VALUE;
        }
        gp_rb_remove(&reservations, &v->by_base);
        pthread_mutex_unlock(&lock);
        munmap(v->mapped, v->mapped_size);
        munmap(v->shadow, v->size);
        free(v);
        return GP_CUDA_SUCCESS;
}

CUresult fk_MemMap(CUdeviceptr ptr, size_t size, size_t offset, gp_cu_mem_handle handle, unsigned long long flags) {
        uint64_t t0 = fake_now_ns();
        struct reservation *v;
        struct phys *p;
        struct vmap *m;
        int fd = -1;

        NEED_CTX();
        if (offset || flags || ptr % VMM_GRANULE || size % VMM_GRANULE || size == 0)
                return GP_CUDA_ERROR_INVALID_VALUE;    /* offset "currently must be zero"; granularity multiples */
        pthread_mutex_lock(&lock);
        p = phys_of(handle);
        v = reservation_of(ptr, size);
        if (!p || p->handles == 0 || size != p->size || !v || mapped_in(ptr, size)) {
                CUresult r = GP_CUDA_ERROR_INVALID_VALUE;

                if (p && mapped_in(ptr, size))
                        r = GP_CUDA_ERROR_ALREADY_MAPPED;
                else if (p && p->handles && v && size != p->size)
                        r = GP_CUDA_ERROR_NOT_SUPPORTED;       /* part of it, or more: as an H200 answered */
                pthread_mutex_unlock(&lock);
                return r;
        }
        m = calloc(1, sizeof(*m));
        /* Mapped through a descriptor opened for the call: the mapping holds the pages, the byte lock the memory. */
        fd = m ? open(p->path, O_RDWR | O_CLOEXEC) : -1;
        if (fd >= 0) {
                m->host = mmap(v->shadow + (ptr - v->base), size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
                close(fd);
        }
        if (!m || fd < 0 || m->host == MAP_FAILED) {
                free(m);
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_OUT_OF_MEMORY;
        }
        m->ptr = ptr;
        m->size = size;
        m->phys = p;
        m->access = GP_CU_MEM_ACCESS_FLAGS_PROT_NONE;   /* mapped is not accessible: cuMemSetAccess */
        p->maps++;
        (void) gp_rb_insert(&vmaps, &m->by_ptr);
        pthread_mutex_unlock(&lock);
        fake_spend_since(t0, cost.map);
        return GP_CUDA_SUCCESS;
}

/* Whether mappings exactly cover [ptr, ptr + size), one after another: no cut, no hole. Call locked. */
static bool whole_mappings(CUdeviceptr ptr, size_t size) {
        CUdeviceptr at = ptr;

        while (at < ptr + size) {
                struct vmap *m = vmap_at(at);

                if (!m || m->ptr != at || m->size > ptr + size - at)
                        return false;
                at += m->size;
        }
        return size != 0;
}

CUresult fk_MemUnmap(CUdeviceptr ptr, size_t size) {
        uint64_t t0 = fake_now_ns();
        NEED_CTX();
        pthread_mutex_lock(&lock);
        if (!whole_mappings(ptr, size)) {
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_INVALID_VALUE;    /* "cuMemUnmap cannot unmap a sub-range" */
        }
        for (struct vmap *m = vmap_from(ptr), *next; m && m->ptr < ptr + size; m = next) {
                next = vmap_next(m);
                gp_rb_remove(&vmaps, &m->by_ptr);
                /* Its place in the reservation's shadow stays reserved, unreachable. */
                (void) mmap(m->host, m->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
                if (--m->phys->maps == 0 && m->phys->handles == 0)
                        phys_drop(m->phys);
                free(m);
        }
        pthread_mutex_unlock(&lock);
        fake_spend_since(t0, cost.unmap + cost.unmap_per_mib * (size >> 20));
        return GP_CUDA_SUCCESS;
}

CUresult fk_MemSetAccess(CUdeviceptr ptr, size_t size, const gp_cu_mem_access_desc *desc, size_t count) {
        uint64_t t0 = fake_now_ns();
        NEED_CTX();
        if (!desc || count == 0)
                return GP_CUDA_ERROR_INVALID_VALUE;
        for (size_t i = 0; i < count; i++) {
                if (desc[i].location.type != GP_CU_MEM_LOCATION_TYPE_DEVICE ||
                    (desc[i].flags != GP_CU_MEM_ACCESS_FLAGS_PROT_NONE && desc[i].flags != GP_CU_MEM_ACCESS_FLAGS_PROT_READ &&
                     desc[i].flags != GP_CU_MEM_ACCESS_FLAGS_PROT_READWRITE))
                        return GP_CUDA_ERROR_INVALID_VALUE;
                if (desc[i].location.id < 0 || desc[i].location.id >= nvisible)
                        return GP_CUDA_ERROR_INVALID_DEVICE;
        }
        pthread_mutex_lock(&lock);
        set_access_calls++;
        if (!whole_mappings(ptr, size)) {
                pthread_mutex_unlock(&lock);
                return GP_CUDA_ERROR_INVALID_VALUE;    /* "a fully mapped address range" */
        }
        for (struct vmap *m = vmap_from(ptr); m && m->ptr < ptr + size; m = vmap_next(m))
                for (size_t i = 0; i < count; i++)
                        if (visible[desc[i].location.id] == m->phys->gpu)
                                m->access = desc[i].flags;
        pthread_mutex_unlock(&lock);
        fake_spend_since(t0, cost.access + cost.access_per_mib * (size >> 20));
        return GP_CUDA_SUCCESS;
}

/* The access a device has to the mapping at ptr, as cuMemSetAccess left it (0: none yet). */
CUresult fk_MemGetAccess(unsigned long long *flags, const gp_cu_mem_location *location, CUdeviceptr ptr) {
        struct vmap *m;

        NEED_CTX();
        if (!flags || !location || location->type != GP_CU_MEM_LOCATION_TYPE_DEVICE)
                return GP_CUDA_ERROR_INVALID_VALUE;
        if (location->id < 0 || location->id >= nvisible)
                return GP_CUDA_ERROR_INVALID_DEVICE;
        pthread_mutex_lock(&lock);
        m = vmap_at(ptr);
        if (m)
                *flags = visible[location->id] == m->phys->gpu ? (unsigned long long) m->access : 0;
        pthread_mutex_unlock(&lock);
        return m ? GP_CUDA_SUCCESS : GP_CUDA_ERROR_INVALID_VALUE;
}

/* The host bytes behind [p, p + n): mapped and accessible throughout, across mappings side by side. Call locked. */
uint8_t *vmap_bytes(CUdeviceptr p, size_t n, bool *ret_read_only) {
        struct reservation *v = reservation_of(p, n ? n : 1);
        CUdeviceptr at = p;

        *ret_read_only = false;
        if (!v)
                return NULL;
        do {
                struct vmap *m = vmap_at(at);

                if (!m || m->access == GP_CU_MEM_ACCESS_FLAGS_PROT_NONE)
                        return NULL;
                *ret_read_only |= m->access == GP_CU_MEM_ACCESS_FLAGS_PROT_READ;
                at = m->ptr + m->size;
        } while (at < p + n);
        return v->shadow + (p - v->base);
}

/*
 * The handle a mapping was made with, retained once more (released with cuMemRelease), as the
 * driver documents it: addr anywhere in a mapping of this process.
 */
CUresult fk_MemRetainAllocationHandle(gp_cu_mem_handle *handle, void *addr) {
        struct vmap *m;

        NEED_CTX();
        if (!handle)
                return GP_CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_lock(&lock);
        m = vmap_at((CUdeviceptr) (uintptr_t) addr);
        if (m)
                m->phys->handles++;
        pthread_mutex_unlock(&lock);
        if (!m)
                return GP_CUDA_ERROR_INVALID_VALUE;
        *handle = (gp_cu_mem_handle) (uintptr_t) m->phys;
        return GP_CUDA_SUCCESS;
}

#define FK_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES 14
#define FK_POINTER_ATTRIBUTE_ACCESS_FLAGS 16
#define FK_POINTER_ATTRIBUTE_MAPPING_SIZE 18
#define FK_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID 20
#define FK_POINTER_ATTRIBUTE_RANGE_START_ADDR 11
#define FK_POINTER_ATTRIBUTE_RANGE_SIZE 12

/*
 * Of the pointer attributes, the one gpupoold asks of cuMemCreate memory mapped here (which
 * allocation it is), and an allocation's range (its start and size).
 */
CUresult fk_PointerGetAttribute(void *data, int attribute, CUdeviceptr ptr) {
        struct vmap *m;

        NEED_CTX();
        /* An allocation's range, as cuMemGetAddressRange_v2 gives it. */
        if (data && (attribute == FK_POINTER_ATTRIBUTE_RANGE_START_ADDR || attribute == FK_POINTER_ATTRIBUTE_RANGE_SIZE)) {
                CUdeviceptr base;
                size_t size;
                CUresult r = fk_MemGetAddressRange_v2(&base, &size, ptr);

                if (r == GP_CUDA_SUCCESS && attribute == FK_POINTER_ATTRIBUTE_RANGE_START_ADDR)
                        *(CUdeviceptr *) data = base;
                else if (r == GP_CUDA_SUCCESS)
                        *(size_t *) data = size;
                return r;
        }
        if (!data)
                return GP_CUDA_ERROR_INVALID_VALUE;
        /*
         * Of a mapping, as an H200 answered them (bench/results/2026-11-28-H200-d2ec017/): the
         * handle types it may be exported as (none once imported), its access (0 before
         * cuMemSetAccess), its size, and its memory block id (given before cuMemSetAccess too).
         */
        pthread_mutex_lock(&lock);
        m = vmap_at(ptr);
        if (m) {
                switch (attribute) {
                case FK_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
                        *(unsigned long long *) data = m->phys->exportable ? GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : 0;
                        break;
                case FK_POINTER_ATTRIBUTE_ACCESS_FLAGS:
                        *(unsigned long long *) data = (unsigned long long) m->access;
                        break;
                case FK_POINTER_ATTRIBUTE_MAPPING_SIZE:
                        *(size_t *) data = m->size;
                        break;
                case FK_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
                        *(unsigned long long *) data = m->phys->block_id;
                        break;
                default:
                        m = NULL;               /* not one the fake knows */
                }
        }
        pthread_mutex_unlock(&lock);
        return m ? GP_CUDA_SUCCESS : GP_CUDA_ERROR_INVALID_VALUE;
}

/* The entry points above under the names libcuda.so.1 exports them by (fake.h, FK_EXPORT). */
FK_EXPORT(cuMemAddressFree, fk_MemAddressFree);
FK_EXPORT(cuMemAddressReserve, fk_MemAddressReserve);
FK_EXPORT(cuMemCreate, fk_MemCreate);
FK_EXPORT(cuMemExportToShareableHandle, fk_MemExportToShareableHandle);
FK_EXPORT(cuMemGetAccess, fk_MemGetAccess);
FK_EXPORT(cuMemGetAllocationGranularity, fk_MemGetAllocationGranularity);
FK_EXPORT(cuMemGetAllocationPropertiesFromHandle, fk_MemGetAllocationPropertiesFromHandle);
FK_EXPORT(cuMemImportFromShareableHandle, fk_MemImportFromShareableHandle);
FK_EXPORT(cuMemMap, fk_MemMap);
FK_EXPORT(cuMemRelease, fk_MemRelease);
FK_EXPORT(cuMemRetainAllocationHandle, fk_MemRetainAllocationHandle);
FK_EXPORT(cuMemSetAccess, fk_MemSetAccess);
FK_EXPORT(cuMemUnmap, fk_MemUnmap);
FK_EXPORT(cuPointerGetAttribute, fk_PointerGetAttribute);
