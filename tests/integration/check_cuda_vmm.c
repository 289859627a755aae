/*
 * check_cuda_vmm.c: the cuda-vmm backend: the fake driver's virtual memory management rules,
 * granule leases, a kept descriptor that reads nothing of another uid, a client in its own
 * PID namespace, and memory that outlives the daemon (kill, reconnect, adoption). The last
 * two run on a GPU as well (make check-gpu).
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cudatest.h"
#include "fusefile.h"
#include "wire.h"

/* ---- the fake's virtual memory management: cuMemCreate memory shared by descriptor ---- */

static const gp_cu_mem_prop vmm_prop = {
        .type = GP_CU_MEM_ALLOCATION_TYPE_PINNED,
        .requested_handle_types = GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        .location = { .type = GP_CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 },
};

static const gp_cu_mem_access_desc vmm_rw = {
        .location = { .type = GP_CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 },
        .flags = GP_CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
};

static const gp_cu_mem_access_desc vmm_ro = {
        .location = { .type = GP_CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 },
        .flags = GP_CU_MEM_ACCESS_FLAGS_PROT_READ,
};

/* Whether the first bytes at p read value. */
static bool vmm_reads(struct gpu *g, gp_cu_deviceptr p, unsigned char value) {
        unsigned char buf[64];

        if (g->dtoh(buf, p, sizeof(buf)) != GP_CUDA_SUCCESS)
                return false;
        for (size_t i = 0; i < sizeof(buf); i++)
                if (buf[i] != value)
                        return false;
        return true;
}

/*
 * The two processes of test_fake_vmm_rules: a socket pair between them, and a pipe on which the
 * test tells the importer that the exporter has exited and been reaped, so that the node's
 * memory no longer counts the exporter's context when the importer measures it (a closed
 * socket says only that the exporter is exiting).
 */
struct vmm_pair {
        int sv[2];
        int reaped[2];
};

/* Makes 4 MiB, checks the rules on it, shares it by descriptor over sock, and lets go of it first. */
static int vmm_exporter(struct testd *d, void *arg) {
        struct vmm_pair *pair = arg;
        int *sv = pair->sv, sock = sv[0], fd = -1;
        size_t granularity = 0, free0, free1, total;
        unsigned char fill[64], byte;
        gp_cu_deviceptr va;
        gp_cu_mem_handle h, unexportable;
        gp_cu_mem_prop plain = vmm_prop;
        struct gpu g;

        (void) d;
        close(sv[1]);   /* the importer's end: its exit must reach us */
        close(pair->reaped[0]);
        close(pair->reaped[1]);
        memset(fill, 0xab, sizeof(fill));
        plain.requested_handle_types = GP_CU_MEM_HANDLE_TYPE_NONE;
        if (gpu_open(&g) < 0 || g.cu.cuMemGetInfo(&free0, &total) != GP_CUDA_SUCCESS)
                return 1;
        if (g.cu.cuMemGetAllocationGranularity(&granularity, &vmm_prop, GP_CU_MEM_ALLOC_GRANULARITY_MINIMUM) != GP_CUDA_SUCCESS ||
            granularity != 2 * MiB)
                return 2;
        if (g.cu.cuMemCreate(&h, 1 * MiB, &vmm_prop, 0) != GP_CUDA_ERROR_INVALID_VALUE)
                return 3;       /* not a multiple of the granularity */
        if (g.cu.cuMemCreate(&h, 4 * MiB, &vmm_prop, 0) != GP_CUDA_SUCCESS ||
            g.cu.cuMemGetInfo(&free1, &total) != GP_CUDA_SUCCESS || free1 != free0 - 4 * MiB)
                return 4;       /* the node's memory, counted */
        if (g.cu.cuMemCreate(&unexportable, 2 * MiB, &plain, 0) != GP_CUDA_SUCCESS ||
            g.cu.cuMemExportToShareableHandle(&fd, unexportable, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) !=
                    GP_CUDA_ERROR_INVALID_VALUE ||
            g.cu.cuMemRelease(unexportable) != GP_CUDA_SUCCESS)
                return 5;       /* only what was made for descriptors exports as one */
        if (g.cu.cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0) != GP_CUDA_SUCCESS ||
            g.cu.cuMemMap(va, 4 * MiB, 2 * MiB, h, 0) != GP_CUDA_ERROR_INVALID_VALUE ||
            g.cu.cuMemMap(va + 4 * MiB, 2 * MiB, 0, h, 0) != GP_CUDA_ERROR_NOT_SUPPORTED ||
            g.cu.cuMemMap(va, 6 * MiB, 0, h, 0) != GP_CUDA_ERROR_NOT_SUPPORTED ||
            g.cu.cuMemMap(va, 4 * MiB, 0, h, 0) != GP_CUDA_SUCCESS ||
            g.cu.cuMemMap(va, 4 * MiB, 0, h, 0) != GP_CUDA_ERROR_ALREADY_MAPPED)
                return 6;       /* offset 0, the whole allocation (part or more: not supported, as on an H200), on a range not mapped yet */
        if (g.htod(va, fill, sizeof(fill)) != GP_CUDA_ERROR_INVALID_VALUE)
                return 7;       /* mapped is not accessible before cuMemSetAccess */
        if (g.cu.cuMemSetAccess(va, 2 * MiB, &vmm_rw, 1) != GP_CUDA_ERROR_INVALID_VALUE ||
            g.cu.cuMemSetAccess(va, 4 * MiB, &vmm_rw, 1) != GP_CUDA_SUCCESS || g.htod(va, fill, sizeof(fill)) != GP_CUDA_SUCCESS)
                return 8;
        if (g.cu.cuMemAddressFree(va, 8 * MiB) != GP_CUDA_ERROR_INVALID_VALUE ||
            g.cu.cuMemUnmap(va, 2 * MiB) != GP_CUDA_ERROR_INVALID_VALUE)
                return 9;       /* unmap before free; no sub-range */
        if (g.cu.cuMemExportToShareableHandle(&fd, h, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != GP_CUDA_SUCCESS ||
            gp_wire_send_packet(sock, (const uint8_t *) "m", 1, fd) < 0)
                return 10;
        close(fd);
        /* The importer wrote through its own mapping: the same memory. */
        if (read(sock, &byte, 1) != 1 || !vmm_reads(&g, va, 0xcd))
                return 11;
        if (g.cu.cuMemUnmap(va, 4 * MiB) != GP_CUDA_SUCCESS || g.cu.cuMemRelease(h) != GP_CUDA_SUCCESS ||
            g.cu.cuMemRelease(h) != GP_CUDA_ERROR_INVALID_VALUE || g.cu.cuMemAddressFree(va, 8 * MiB) != GP_CUDA_SUCCESS)
                return 12;
        return 0;       /* and exits: the importer's mapping keeps the memory */
}

static int vmm_importer(struct testd *d, void *arg) {
        struct vmm_pair *pair = arg;
        int *sv = pair->sv, sock = sv[1], fd = -1, junk;
        unsigned char fill[64], buf[8];
        size_t free1, free2, total;
        gp_cu_mem_handle h, bad;
        gp_cu_deviceptr va;
        gp_cu_mem_prop prop;
        struct gpu g;

        (void) d;
        close(sv[0]);   /* the exporter's end: its exit must reach us */
        close(pair->reaped[1]);
        memset(fill, 0xcd, sizeof(fill));
        /* The GPU opened only now: our context would count in what the exporter measures. */
        if (gp_wire_recv_packet(sock, buf, sizeof(buf), &fd) != 1 || fd < 0 || gpu_open(&g) < 0)
                return 1;
        junk = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (g.cu.cuMemImportFromShareableHandle(&bad, (void *) (uintptr_t) junk, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) !=
            GP_CUDA_ERROR_INVALID_VALUE)
                return 2;       /* a descriptor that is not device memory */
        close(junk);
        if (g.cu.cuMemImportFromShareableHandle(&h, (void *) (uintptr_t) fd, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) !=
            GP_CUDA_SUCCESS)
                return 3;
        close(fd);      /* as NCCL does: the handle holds the memory now */
        /* An imported handle is not exported again (as on an H200): only its maker can share it. */
        if (g.cu.cuMemExportToShareableHandle(&junk, h, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) !=
            GP_CUDA_ERROR_INVALID_VALUE)
                return 3;
        /* An imported handle says where the memory is, not how it was made (as on an H200). */
        if (g.cu.cuMemGetAllocationPropertiesFromHandle(&prop, h) != GP_CUDA_SUCCESS ||
            prop.location.type != GP_CU_MEM_LOCATION_TYPE_DEVICE || prop.location.id != 0 || prop.requested_handle_types != 0)
                return 3;
        if (g.cu.cuMemAddressReserve(&va, 4 * MiB, 0, 0, 0) != GP_CUDA_SUCCESS || g.cu.cuMemMap(va, 4 * MiB, 0, h, 0) != GP_CUDA_SUCCESS ||
            g.cu.cuMemRelease(h) != GP_CUDA_SUCCESS || g.cu.cuMemSetAccess(va, 4 * MiB, &vmm_rw, 1) != GP_CUDA_SUCCESS)
                return 4;       /* released while mapped: the mapping keeps it */
        if (!vmm_reads(&g, va, 0xab) || g.htod(va, fill, sizeof(fill)) != GP_CUDA_SUCCESS || write(sock, "w", 1) != 1)
                return 5;
        /* The exporter let go and exited (and was reaped): the memory lives while this mapping does. */
        if (read(sock, buf, 1) != 0 || read(pair->reaped[0], buf, 1) != 1)
                return 6;
        if (!vmm_reads(&g, va, 0xcd) || g.cu.cuMemGetInfo(&free1, &total) != GP_CUDA_SUCCESS)
                return 7;
        if (g.cu.cuMemUnmap(va, 4 * MiB) != GP_CUDA_SUCCESS || g.cu.cuMemAddressFree(va, 4 * MiB) != GP_CUDA_SUCCESS ||
            g.cu.cuMemGetInfo(&free2, &total) != GP_CUDA_SUCCESS || free2 != free1 + 4 * MiB)
                return 8;       /* nobody holds it any more: freed */
        /* Mapped for reading only: copies read it; a write is refused at the call, the context unharmed (as on an H200). */
        if (g.cu.cuMemCreate(&h, 2 * MiB, &vmm_prop, 0) != GP_CUDA_SUCCESS ||
            g.cu.cuMemAddressReserve(&va, 2 * MiB, 0, 0, 0) != GP_CUDA_SUCCESS || g.cu.cuMemMap(va, 2 * MiB, 0, h, 0) != GP_CUDA_SUCCESS ||
            g.cu.cuMemSetAccess(va, 2 * MiB, &vmm_rw, 1) != GP_CUDA_SUCCESS || g.htod(va, fill, sizeof(fill)) != GP_CUDA_SUCCESS ||
            g.cu.cuMemSetAccess(va, 2 * MiB, &vmm_ro, 1) != GP_CUDA_SUCCESS || !vmm_reads(&g, va, 0xcd))
                return 9;
        memset(fill, 0xee, sizeof(fill));
        if (g.htod(va, fill, sizeof(fill)) != GP_CUDA_ERROR_INVALID_VALUE || !vmm_reads(&g, va, 0xcd) ||
            g.cu.cuMemGetInfo(&free1, &total) != GP_CUDA_SUCCESS)
                return 10;
        return 0;       /* and exits: what it held goes with it */
}

START_TEST(test_fake_vmm_rules) {
        struct vmm_pair pair;
        pid_t exporter, importer;
        int e, i;

        fake_node_new();
        ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair.sv), 0);
        ck_assert_int_eq(pipe2(pair.reaped, O_CLOEXEC), 0);
        exporter = spawn(vmm_exporter, NULL, &pair);
        importer = spawn(vmm_importer, NULL, &pair);
        close(pair.sv[0]);
        close(pair.sv[1]);
        close(pair.reaped[0]);
        e = reap(exporter);
        /* An importer that failed before reading is gone: no SIGPIPE for the test then. */
        {
                void (*was)(int) = signal(SIGPIPE, SIG_IGN);

                (void) !write(pair.reaped[1], "r", 1);
                signal(SIGPIPE, was);
        }
        close(pair.reaped[1]);
        i = reap(importer);
        ck_assert_msg(e == 0, "the exporter's side of the VMM rules failed at step %d", e);
        ck_assert_msg(i == 0, "the importer's side of the VMM rules failed at step %d", i);
        fake_node_done();       /* nothing left: the last holder freed it */
}
END_TEST

static int cmp_double(const void *a, const void *b) {
        double x = *(const double *) a, y = *(const double *) b;

        return (x > y) - (x < y);
}

/*
 * Times 31 exports and 31 imports of one 2 MiB allocation, and one access and unmap of a
 * mapping of it 31 times; the medians must be the H200's prices (33, 28, 28 and 19 us) and
 * not much more: a call that slept to its end took the scheduler's wake-up besides (a 28 us
 * import took 35 on a 2-core machine), which made every granule's calls cost more on the fake
 * than on the GPU. Returns the step that failed.
 */
static double us_since(const struct timespec *a) {
        struct timespec b;

        clock_gettime(CLOCK_MONOTONIC, &b);
        return (double) (b.tv_sec - a->tv_sec) * 1e6 + (double) (b.tv_nsec - a->tv_nsec) / 1e3;
}

/*
 * The fake's prices: an export, an import, an access and an unmap with another export open on
 * the node (the steady state), and an export with none open, which pays the driver's build of
 * its export client (fakecuda_vmm.c).
 */
static int vmm_price_client(struct testd *d, void *arg) {
        static const double price_us[5] = { 33.0, 28.0, 28.0, 18.6, 603.0 };
        static const char *const what[5] = { "export", "import", "access", "unmap", "export with none open" };
        double us[5][31];
        gp_cu_deviceptr va = 0;
        gp_cu_mem_handle h, hi, hkept;
        struct timespec t;
        struct gpu g;
        int fd, kept;

        (void) d, (void) arg;
        if (gpu_open(&g) < 0 || g.cu.cuMemCreate(&h, 2 * MiB, &vmm_prop, 0) != GP_CUDA_SUCCESS ||
            g.cu.cuMemAddressReserve(&va, 2 * MiB, 0, 0, 0) != GP_CUDA_SUCCESS)
                return 1;
        for (int i = 0; i < 31; i++) {
                clock_gettime(CLOCK_MONOTONIC, &t);
                if (g.cu.cuMemExportToShareableHandle(&fd, h, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != GP_CUDA_SUCCESS)
                        return 2;
                us[4][i] = us_since(&t);
                close(fd);
        }
        if (g.cu.cuMemCreate(&hkept, 2 * MiB, &vmm_prop, 0) != GP_CUDA_SUCCESS ||
            g.cu.cuMemExportToShareableHandle(&kept, hkept, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != GP_CUDA_SUCCESS)
                return 1;
        for (int i = 0; i < 31; i++) {
                clock_gettime(CLOCK_MONOTONIC, &t);
                if (g.cu.cuMemExportToShareableHandle(&fd, h, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != GP_CUDA_SUCCESS)
                        return 2;
                us[0][i] = us_since(&t);
                clock_gettime(CLOCK_MONOTONIC, &t);
                if (g.cu.cuMemImportFromShareableHandle(&hi, (void *) (uintptr_t) fd, GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) !=
                    GP_CUDA_SUCCESS)
                        return 3;
                us[1][i] = us_since(&t);
                close(fd);
                if (g.cu.cuMemRelease(hi) != GP_CUDA_SUCCESS || g.cu.cuMemMap(va, 2 * MiB, 0, h, 0) != GP_CUDA_SUCCESS)
                        return 4;
                clock_gettime(CLOCK_MONOTONIC, &t);
                if (g.cu.cuMemSetAccess(va, 2 * MiB, &vmm_rw, 1) != GP_CUDA_SUCCESS)
                        return 5;
                us[2][i] = us_since(&t);
                clock_gettime(CLOCK_MONOTONIC, &t);
                if (g.cu.cuMemUnmap(va, 2 * MiB) != GP_CUDA_SUCCESS)
                        return 6;
                us[3][i] = us_since(&t);
        }
        close(kept);
        (void) g.cu.cuMemRelease(hkept);
        for (int k = 0; k < 5; k++) {
                qsort(us[k], 31, sizeof(us[k][0]), cmp_double);
                if (us[k][15] < price_us[k] || us[k][15] > price_us[k] * 1.15 + 1.0) {
                        fprintf(stderr, "vmm_price_client: %s took %.1f us (the median of 31), not about %.1f\n", what[k],
                                us[k][15], price_us[k]);
                        return 10 + k;
                }
        }
        (void) g.cu.cuMemAddressFree(va, 2 * MiB);
        (void) g.cu.cuMemRelease(h);
        return 0;
}

START_TEST(test_fake_vmm_calls_take_their_price) {
        int r;

        if (under_valgrind()) {
                fprintf(stderr, "test_fake_vmm_calls_take_their_price: skipped under valgrind (its own time is the fake's)\n");
                return;
        }
        fake_node_new();
        r = reap(spawn(vmm_price_client, NULL, NULL));
        ck_assert_msg(r == 0, "the fake's VMM calls did not take their price (step %d)", r);
        fake_node_done();
}
END_TEST

/*
 * With cuda-vmm, a client in a PID namespace of its own (a container) is served: descriptors
 * pass namespaces, which legacy IPC handles do not.
 */
static int pidns_vmm_client(struct testd *d, void *arg) {
        pid_t pid;
        int status;

        (void) arg;
        if (unshare(CLONE_NEWPID) < 0)
                return 10;
        pid = fork();           /* the new namespace's pid 1 */
        if (pid < 0)
                return 11;
        if (pid == 0) {
                gpupool_client *c = NULL;
                struct gpu g;
                void *p;

                if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "contained", &c) < 0 ||
                    gpupool_alloc(c, 0, 6 * MiB, &p) < 0)
                        _exit(12);
                if (write_pattern(&g, p, 6 * MiB, 9) < 0 || !pattern_intact(&g, p, 6 * MiB, 9) || gpupool_free(c, p) < 0)
                        _exit(13);
                gpupool_disconnect(c);
                _exit(0);
        }
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
                return 14;
        return WEXITSTATUS(status);
}

START_TEST(test_fake_vmm_serves_pid_namespace) {
        struct testd d;

        if (geteuid() != 0) {
                TEST_SKIP("making a PID namespace needs root");
                return;
        }
        vmm_start(&d);
        ck_assert_msg(reap(spawn(pidns_vmm_client, &d, NULL)) == 0, "a client in its own PID namespace was not served");
        ck_assert_int_eq(testd_device(&d, 0, "in_use_bytes"), 0);
        cuda_stop(&d);
}
END_TEST

/* Imports three granules' descriptors and maps them side by side in a range of its own. */
static int import_granules(struct testd *d, void *arg) {
        const int *fds = arg;
        gp_cu_deviceptr va;
        struct gpu g;

        (void) d;
        if (gpu_open(&g) < 0 || g.cu.cuMemAddressReserve(&va, 6 * MiB, 0, 0, 0) != GP_CUDA_SUCCESS)
                return 1;
        for (int i = 0; i < 3; i++) {
                gp_cu_mem_handle h;

                if (g.cu.cuMemImportFromShareableHandle(&h, (void *) (uintptr_t) fds[i],
                                                        GP_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != GP_CUDA_SUCCESS ||
                    g.cu.cuMemMap(va + (gp_cu_deviceptr) i * 2 * MiB, 2 * MiB, 0, h, 0) != GP_CUDA_SUCCESS ||
                    g.cu.cuMemRelease(h) != GP_CUDA_SUCCESS)
                        return 2 + i;
        }
        /* A memset of device memory returns before it has run: its work ends before the unmap. */
        if (g.cu.cuMemSetAccess(va, 6 * MiB, &vmm_rw, 1) != GP_CUDA_SUCCESS || g.memset_d32(va, 0x5a5a5a5a, 6 * MiB / 4) != GP_CUDA_SUCCESS ||
            g.cu.cuCtxSynchronize() != GP_CUDA_SUCCESS || g.cu.cuMemUnmap(va, 6 * MiB) != GP_CUDA_SUCCESS ||
            g.cu.cuMemAddressFree(va, 6 * MiB) != GP_CUDA_SUCCESS)
                return 5;
        return 0;
}

/*
 * Granule leases: on cuda-vmm, a descriptor of its own cuMemCreate memory per granule, which
 * another process imports and maps; the legacy backend refuses them with the reason.
 */
START_TEST(test_fake_granule_leases) {
        int fds[GP_WIRE_MAX_FDS];
        Gpupool__Envelope *rep;
        struct testd d;
        size_t nfds;
        int sock, r;

        vmm_start(&d);
        sock = raw_hello(&d, "granules");
        rep = raw_lease_granules(sock, 0, 3, 2 * MiB, fds, &nfds);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        ck_assert_uint_eq(nfds, 3);
        ck_assert_uint_eq(rep->lease_reply->n_more_segment_ids, 2);
        ck_assert(!rep->lease_reply->has_ipc_handle);
        gpupool__envelope__free_unpacked(rep, NULL);
        r = reap(spawn(import_granules, NULL, fds));
        ck_assert_msg(r == 0, "the granules' descriptors did not import (step %d)", r);
        for (size_t i = 0; i < nfds; i++)
                close(fds[i]);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 6 * MiB);
        close(sock);
        cuda_stop(&d);

        cuda_start(&d, NULL, NULL);     /* the legacy backend */
        sock = raw_hello(&d, "granules");
        rep = raw_lease_granules(sock, 0, 3, 2 * MiB, fds, &nfds);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_INVALID);
        ck_assert_uint_eq(nfds, 0);
        ck_assert_msg(strstr(rep->error, "granule leases need the host or cuda-vmm backend"), "%s", rep->error);
        gpupool__envelope__free_unpacked(rep, NULL);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 0);
        close(sock);
        cuda_stop(&d);
}
END_TEST

/* How many exports the fake node has made: a byte of $FAKECUDA_DIR/fakecuda-exports each. */
static long long fake_exports(void) {
        char path[sizeof(fake_dir) + 32];
        struct stat st;

        snprintf(path, sizeof(path), "%s/fakecuda-exports", fake_dir);
        return stat(path, &st) == 0 ? (long long) st.st_size : 0;
}

/* Leases 3 granules on sock; their descriptors, imported and mapped in another process, then closed. */
static void lease_three_imported(int sock) {
        int fds[GP_WIRE_MAX_FDS];
        Gpupool__Envelope *rep;
        size_t nfds;
        int r;

        rep = raw_lease_granules(sock, 0, 3, 2 * MiB, fds, &nfds);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        ck_assert_uint_eq(nfds, 3);
        gpupool__envelope__free_unpacked(rep, NULL);
        r = reap(spawn(import_granules, NULL, fds));
        ck_assert_msg(r == 0, "the granules' descriptors did not import (step %d)", r);
        for (size_t i = 0; i < nfds; i++)
                close(fds[i]);
}

/*
 * --granule-stock on cuda-vmm: each granule of the stock is exported as it is made, off any
 * request's path, and a lease that takes it from the cache sends that descriptor instead of
 * exporting one: the daemon holds one per granule of the stock (its fd limit counts them), and
 * lets go of those it holds with their memory (a flush).
 */
START_TEST(test_fake_vmm_stock_exported_ahead) {
        struct testd d;
        long long exports;
        int sock, base;

        cuda_backend = "cuda-vmm";
        cuda_start(&d, "--granule-stock", "3");
        sock = raw_hello(&d, "stocker");
        base = open_fds_to(d.pid, "/fakecuda-vmm-");       /* the fake's own, if any */
        exports = fake_exports();
        lease_three_imported(sock);
        /* Three made ahead of the next lease, and exported as they were made. */
        ck_assert(testd_device_becomes(&d, 0, "stocked_total", 3));
        ck_assert_int_eq(fake_exports(), exports + 3 + 3);
        ck_assert_int_eq(open_fds_to(d.pid, "/fakecuda-vmm-"), base + 3);
        /* The next takes them with their descriptors: only the three made again are exported. */
        lease_three_imported(sock);
        ck_assert(testd_device_becomes(&d, 0, "stocked_total", 6));
        ck_assert_int_eq(fake_exports(), exports + 3 + 3 + 3);
        ck_assert_int_eq(open_fds_to(d.pid, "/fakecuda-vmm-"), base + 3);
        json_decref(testd_ctl(&d, "check"));
        /* A flush gives the stock back, and with it the descriptors held for it. */
        json_decref(testd_ctl(&d, "flush"));
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 0);
        ck_assert_int_eq(open_fds_to(d.pid, "/fakecuda-vmm-"), base);
        close(sock);
        cuda_stop(&d);
}
END_TEST

/* How many of the fake node's exports found no other export open: a byte of $FAKECUDA_DIR/fakecuda-export-builds each. */
static long long fake_export_builds(void) {
        char path[sizeof(fake_dir) + 32];
        struct stat st;

        snprintf(path, sizeof(path), "%s/fakecuda-export-builds", fake_dir);
        return stat(path, &st) == 0 ? (long long) st.st_size : 0;
}

/*
 * The driver builds its export client when an export finds none open on the host, about 0.6 ms
 * (the fake charges it as fakecuda_vmm.c says): a lease's export, sent and closed, and its
 * client's copy closed once imported, paid it every time. gpupoold keeps one export per GPU
 * open for its life (export_keepalive, on by default), out of the pool's capacity, so that no
 * lease's export pays it; export_keepalive = no is the daemon as before.
 */
START_TEST(test_fake_vmm_export_kept_open) {
        long long builds, total_kept, total_not;
        struct testd d;
        int sock, fds_not;

        cuda_backend = "cuda-vmm";
        cuda_start(&d, "--export-keepalive=no", NULL);
        fds_not = open_fds_to(d.pid, "/fakecuda-vmm-");         /* the fake's own (its holds file) */
        total_not = testd_device(&d, 0, "total_bytes");
        sock = raw_hello(&d, "leaser");
        builds = fake_export_builds();
        for (int i = 0; i < 3; i++)
                lease_three_imported(sock);
        ck_assert_int_eq(fake_export_builds(), builds + 3);      /* each lease the first export on the node */
        close(sock);
        cuda_stop(&d);

        cuda_backend = "cuda-vmm";
        cuda_start(&d, NULL, NULL);
        ck_assert_int_eq(open_fds_to(d.pid, "/fakecuda-vmm-"), fds_not + 1);
        total_kept = testd_device(&d, 0, "total_bytes");
        ck_assert_int_eq(total_kept, total_not - 2 * MiB);
        sock = raw_hello(&d, "leaser");
        builds = fake_export_builds();
        for (int i = 0; i < 3; i++)
                lease_three_imported(sock);
        ck_assert_int_eq(fake_export_builds(), builds);
        json_decref(testd_ctl(&d, "flush"));
        ck_assert_int_eq(open_fds_to(d.pid, "/fakecuda-vmm-"), fds_not + 1);    /* kept through a flush: for the daemon's life */
        close(sock);
        cuda_stop(&d);
}
END_TEST

/* A client that keeps the descriptor of cuda-vmm memory it returned reads nothing another uid writes there. */
START_TEST(test_fake_vmm_kept_descriptor_reads_nothing) {
        struct testd d;

        if (geteuid() != 0) {
                TEST_SKIP("switching uid needs root");
                return;
        }
        vmm_start(&d);
        check_kept_descriptor_reads_nothing(&d, 0);
        cuda_stop(&d);
}
END_TEST

/* ---- cuda-vmm memory outlives the daemon ---- */

/*
 * Holds blocks with data in them; once the daemon is killed, finds the data intact, goes on
 * allocating from what it holds, and is told at once that it cannot lease more; once a daemon
 * is back, is adopted by it on its own, counted once, its data still intact.
 */
static int survivor_client(struct testd *d, void *arg) {
        enum { N = 7 };
        struct survivor *w = arg;
        gpupool_client *c = NULL;
        /* Growing in place, the last block is a piece ($GPUPOOL_GROW_PIECE), adopted as a segment is. */
        size_t sizes[N] = { 4096, 100000, 1 * MiB, 3 * MiB, 3 * MiB, 8 * MiB, w->index % 2 ? 4096 : 64 * MiB };
        struct gpupool_stats held;
        char err[512], b;
        void *p[N], *big;
        struct gpu g;
        int r;

        setenv("GPUPOOL_SEGMENTS", w->index % 2 ? "whole" : "grow", 1);
        setenv("GPUPOOL_GROW_PIECE", "64M", 1);
        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "survivor", &c) < 0)
                return 1;
        for (int i = 0; i < N; i++)
                if (gpupool_alloc(c, 0, sizes[i], &p[i]) < 0 || write_pattern(&g, p[i], sizes[i], (unsigned) (w->index * 16 + i)) < 0)
                        return 2;
        if (write(w->up[1], "r", 1) != 1 || read(w->go[0], &b, 1) != 1)
                return 3;
        for (int i = 0; i < N; i++)
                if (!pattern_intact(&g, p[i], sizes[i], (unsigned) (w->index * 16 + i)))
                        return 4;
        /* Freed and allocated again from what the process holds: no daemon needed. */
        for (int round = 0; round < 3; round++) {
                if (gpupool_free(c, p[3]) != 0 || gpupool_alloc(c, 0, sizes[3], &p[3]) != 0 ||
                    write_pattern(&g, p[3], sizes[3], (unsigned) (w->index * 16 + 3)) < 0)
                        return 5;
        }
        /* More than it holds needs the daemon: refused at once, saying so. */
        r = gpupool_alloc(c, 0, 256 * MiB, &big);
        gpupool_last_error(c, err, sizeof(err));
        if (r != -ECONNRESET || !strstr(err, "goes on allocating from the cuda-vmm memory it holds")) {
                fprintf(stderr, "survivor %d: %d: %s\n", w->index, r, err);
                return 6;
        }
        for (int i = 0; i < N; i++)
                if (!pattern_intact(&g, p[i], sizes[i], (unsigned) (w->index * 16 + i)))
                        return 7;
        if (gpupool_stats(c, &held) != 0 || !survivor_restarted(w))
                return 8;
        /* The new daemon: the process reconnects on its own, and it adopts what the process holds, counted once. */
        if (!(big = survivor_adopted(d, w, c, &held, 32 * MiB)) || write_pattern(&g, big, 32 * MiB, 3) < 0)
                return 9;
        for (int i = 0; i < N; i++)
                if (!pattern_intact(&g, p[i], sizes[i], (unsigned) (w->index * 16 + i)) || gpupool_free(c, p[i]) != 0)
                        return 11;
        if (!pattern_intact(&g, big, 32 * MiB, 3) || gpupool_free(c, big) != 0 || gpupool_trim(c) != 0)
                return 12;
        gpupool_disconnect(c);
        return 0;
}

/* kill -9 of a cuda-vmm daemon under four processes, two in each mode: each keeps its data, goes on, and is adopted. */
START_TEST(test_vmm_survives_daemon_kill) {
        struct testd d;

        vmm_start(&d);
        run_survivors(&d, 4, survivor_client);
        unsetenv("GPUPOOL_SEGMENTS");
        json_decref(testd_ctl(&d, "check"));
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes") - testd_device(&d, 0, "cached_bytes"), 0);
        cuda_stop(&d);          /* what the clients held went back: nothing is left */
}
END_TEST

/*
 * Frees every block once the daemon is gone, then allocates blocks of other sizes from what it
 * holds: the memory it freed serves them (round six: a program that freed its blocks could not
 * allocate 1 MiB again, the message saying it "goes on allocating from the cuda-vmm memory it
 * holds"). Whole segments serve blocks of another class; growing in place, idle granules move.
 */
static int freed_survivor(struct testd *d, void *arg) {
        enum { N = 3 };
        struct survivor *w = arg;
        gpupool_client *c = NULL;
        size_t sizes[N] = { 64 * MiB, 24 * MiB, 3 * MiB }, again[] = { 1 * MiB, 4096, 100000, 5 * MiB, 30 * MiB };
        char err[512], b;
        void *p[N], *q[sizeof(again) / sizeof(again[0])];
        struct gpu g;

        setenv("GPUPOOL_SEGMENTS", w->index % 2 ? "whole" : "grow", 1);
        setenv("GPUPOOL_GROW_PIECE", "64M", 1);         /* growing in place, the 64 MiB block is a piece */
        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "survivor", &c) < 0)
                return 1;
        for (int i = 0; i < N; i++)
                if (gpupool_alloc(c, 0, sizes[i], &p[i]) < 0)
                        return 2;
        if (write(w->up[1], "r", 1) != 1 || read(w->go[0], &b, 1) != 1)
                return 3;
        for (int i = 0; i < N; i++)
                if (gpupool_free(c, p[i]) != 0)
                        return 4;
        for (size_t i = 0; i < sizeof(again) / sizeof(again[0]); i++) {
                int r = gpupool_alloc(c, 0, again[i], &q[i]);

                if (r != 0) {
                        gpupool_last_error(c, err, sizeof(err));
                        fprintf(stderr, "survivor %d (%s), %zu bytes after freeing: %d: %s\n", w->index,
                                w->index % 2 ? "whole" : "grow", again[i], r, err);
                        return 5;
                }
                if (write_pattern(&g, q[i], again[i], (unsigned) i) < 0)
                        return 6;
        }
        for (size_t i = 0; i < sizeof(again) / sizeof(again[0]); i++)
                if (!pattern_intact(&g, q[i], again[i], (unsigned) i) || gpupool_free(c, q[i]) != 0)
                        return 7;
        if (!survivor_restarted(w))
                return 8;
        gpupool_disconnect(c);
        return 0;
}

START_TEST(test_vmm_freed_memory_serves_without_a_daemon) {
        struct testd d;

        vmm_start(&d);
        run_survivors(&d, 2, freed_survivor);
        unsetenv("GPUPOOL_SEGMENTS");
        cuda_stop(&d);
}
END_TEST

/*
 * Holds a block on its device 0 while the daemon, which sees that GPU alone, is killed and
 * comes back seeing only the other GPU (the test relaunches it so): the process is refused
 * adoption and told why at its next lease, keeps its data and allocates within what it holds,
 * and gpupool_reconnect() starts anew on the GPU the daemon has now.
 */
static int other_gpus_client(struct testd *d, void *arg) {
        struct survivor *w = arg;
        gpupool_client *c = NULL;
        char err[512], b;
        void *p, *big;
        struct gpu g;
        int r;

        unsetenv("CUDA_VISIBLE_DEVICES");       /* this process sees both GPUs; each daemon one */
        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "moved", &c) < 0)
                return 1;
        if (gpupool_alloc(c, 0, 3 * MiB, &p) < 0 || write_pattern(&g, p, 3 * MiB, 21) < 0)
                return 2;
        if (write(w->up[1], "r", 1) != 1 || read(w->go[0], &b, 1) != 1)
                return 3;
        /* The control thread tries the new daemon within a second, and is refused: the next lease says why. */
        for (double t0 = now_s();; nap_ms(50)) {
                r = gpupool_alloc(c, 0, 256 * MiB, &big);
                gpupool_last_error(c, err, sizeof(err));
                if (r != -ECONNRESET || now_s() - t0 > 20) {
                        fprintf(stderr, "other_gpus_client: %d: %s\n", r, err);
                        return 4;
                }
                if (strstr(err, "came back with other devices (or another backend) than this process holds memory of"))
                        break;
        }
        if (!pattern_intact(&g, p, 3 * MiB, 21) || leased_on(d, 0) != 0)
                return 5;       /* intact, and nothing of it adopted */
        if (gpupool_free(c, p) != 0 || gpupool_alloc(c, 0, 3 * MiB, &p) != 0 || write_pattern(&g, p, 3 * MiB, 22) < 0 ||
            !pattern_intact(&g, p, 3 * MiB, 22))
                return 6;       /* within what it holds */
        if (gpupool_reconnect(c) != 0)
                return 7;
        /* Anew: the daemon's one GPU is this process's device 1; its device 0 is not the daemon's. */
        if (gpupool_alloc(c, 1, 3 * MiB, &p) != 0 || leased_on(d, 0) < (long long) (3 * MiB) ||
            gpupool_alloc(c, 0, 4096, &big) != -ENODEV || gpupool_free(c, p) != 0)
                return 8;
        gpupool_disconnect(c);
        return 0;
}

/* A cuda-vmm daemon that comes back with another GPU than a process holds memory of adopts none of it. */
START_TEST(test_fake_vmm_resume_refused_other_gpus) {
        struct survivor w = { 0 };
        struct testd d;
        int status;
        pid_t pid;
        char b;

        setenv("FAKECUDA_DEVICES", "2", 1);
        setenv("CUDA_VISIBLE_DEVICES", "0", 1);
        vmm_start(&d);
        ck_assert(pipe(w.up) == 0 && pipe(w.go) == 0);
        pid = spawn(other_gpus_client, &d, &w);
        ck_assert_int_eq(read(w.up[0], &b, 1), 1);
        testd_crash(&d);
        setenv("CUDA_VISIBLE_DEVICES", "1", 1);
        testd_relaunch(&d);
        unsetenv("CUDA_VISIBLE_DEVICES");
        ck_assert_int_eq(write(w.go[1], "g", 1), 1);
        status = reap(pid);
        ck_assert_msg(status == 0, "other_gpus_client failed at step %d", status);
        close(w.up[0]), close(w.up[1]), close(w.go[0]), close(w.go[1]);
        json_decref(testd_ctl(&d, "check"));
        ck_assert_int_eq(leased_on(&d, 0), 0);
        cuda_stop(&d);
        unsetenv("FAKECUDA_DEVICES");
}
END_TEST

/* An adoption's reply that must be a refusal whole with STATUS_INVALID, saying text; freed. */
static void refused_with(Gpupool__Envelope *rep, const char *text) {
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_INVALID);
        ck_assert_msg(rep->error && strstr(rep->error, text), "%s", rep->error ? rep->error : "(no message)");
        gpupool__envelope__free_unpacked(rep, NULL);
}

/* An adoption of n segments of device, each with its descriptor, refused whole, saying text. */
static void vmm_adopt_refused(int sock, uint32_t device, uint64_t *sizes, size_t n, const int *fds, const char *text) {
        refused_with(raw_adopt(sock, device, sizes, n, fds, n), text);
}

/* A connection named "before" to d, holding three granules of device 0 (their descriptors in fds). */
static int vmm_three_granules(struct testd *d, int *fds) {
        Gpupool__Envelope *rep;
        int sock = raw_hello(d, "before");
        size_t nfds;

        rep = raw_lease_granules(sock, 0, 3, 2 * MiB, fds, &nfds);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        ck_assert_uint_eq(nfds, 3);
        gpupool__envelope__free_unpacked(rep, NULL);
        return sock;
}

/* Adopts n segments of device that must all be adopted. */
static void vmm_adopt_all(int sock, uint32_t device, uint64_t *sizes, size_t n, const int *fds) {
        Gpupool__Envelope *rep = raw_adopt(sock, device, sizes, n, fds, n);

        ck_assert_msg(rep->status == GPUPOOL__STATUS__STATUS_OK, "%s", rep->error ? rep->error : "");
        ck_assert_uint_eq(rep->adopt_reply->n_segment_ids, n);
        gpupool__envelope__free_unpacked(rep, NULL);
}

/*
 * A descriptor of a file on FUSE whose server stops answering never reaches the driver's
 * import (which would wait on the file as fstat(2) does): refused at once, the loop serving on.
 */
START_TEST(test_vmm_adopting_a_frozen_fuse_file) {
        struct testd d;

        vmm_start(&d);
        check_frozen_fuse_adoption(__func__, &d);
        cuda_stop(&d);
}
END_TEST

/* The last place needle stands in text, or NULL. */
static const char *last_of(const char *text, const char *needle) {
        const char *last = NULL;

        for (const char *p = text; (p = strstr(p, needle)); p++)
                last = p;
        return last;
}

/* The last word a cuda-vmm daemon's log has on whether the driver names allocations (it says at start). */
static bool vmm_names_allocations(struct testd *d) {
        static char log[1 << 20];
        const char *text = read_text(d->log, log, sizeof(log));
        const char *named = last_of(text, "the driver names allocations");
        const char *unnamed = last_of(text, "cannot tell two descriptors of one allocation apart");

        ck_assert_msg(named || unnamed, "the daemon's log does not say whether the driver names allocations");
        return named > unnamed;
}

/*
 * What a cuda-vmm daemon adopts, over the raw protocol: granules a process kept from the daemon
 * before it; not a descriptor that is no CUDA memory, memory of another GPU (on the fake, which
 * has two), nor memory stated larger than it maps. Where the driver names allocations (the
 * fake's $FAKECUDA_BLOCK_IDS=allocation; on a GPU, whatever the daemon found), the same memory
 * twice and memory the daemon holds are refused; where it does not (the fake as it comes), they
 * are adopted and counted again: more, never less. The legacy backend adopts nothing, saying why.
 */
START_TEST(test_vmm_adoption) {
        uint64_t two[2] = { 2 * MiB, 2 * MiB }, four = 4 * MiB;
        int fds[GP_WIRE_MAX_FDS], other[GP_WIRE_MAX_FDS], now[GP_WIRE_MAX_FDS], pair[2], pipe_fds[2], sock;
        bool two_gpus = !on_gpu, named;
        Gpupool__Envelope *rep;
        struct testd d;
        size_t nfds;

        if (two_gpus)
                setenv("FAKECUDA_DEVICES", "2", 1);
        if (!on_gpu)
                setenv("FAKECUDA_BLOCK_IDS", "allocation", 1);
        vmm_start(&d);
        sock = vmm_three_granules(&d, fds);
        if (two_gpus) {
                rep = raw_lease_granules(sock, 1, 1, 2 * MiB, other, &nfds);
                ck_assert_uint_eq(nfds, 1);
                gpupool__envelope__free_unpacked(rep, NULL);
        }
        testd_crash_and_restart(&d);
        close(sock);
        sock = raw_hello(&d, "after");
        named = vmm_names_allocations(&d);
        ck_assert(named || on_gpu);

        ck_assert_int_eq(pipe(pipe_fds), 0);
        vmm_adopt_refused(sock, 0, two, 1, pipe_fds, "not memory the CUDA driver exported as a descriptor");
        if (two_gpus)
                vmm_adopt_refused(sock, 0, two, 1, other, "not memory of GPU 0");
        vmm_adopt_refused(sock, 0, &four, 1, fds, "does not map as 4194304 bytes");
        pair[0] = fds[0];
        pair[1] = dup(fds[0]);
        if (named) {
                vmm_adopt_refused(sock, 0, two, 2, pair, "the same memory as descriptor 0");
                ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 0);
        }

        /* Adopted once, counted once; again, by any descriptor of it, it is held already. */
        vmm_adopt_all(sock, 0, two, 2, fds);
        ck_assert_int_eq(testd_client_field(&d, getpid(), "after", "reserved_bytes"), 4 * MiB);
        rep = raw_lease_granules(sock, 0, 1, 2 * MiB, now, &nfds);
        ck_assert_uint_eq(nfds, 1);
        gpupool__envelope__free_unpacked(rep, NULL);
        if (named) {
                vmm_adopt_refused(sock, 0, two, 1, &pair[1], "holds already");
                /* Nor memory this daemon leases now. */
                vmm_adopt_refused(sock, 0, two, 1, now, "holds already");
        }
        if (two_gpus)
                vmm_adopt_all(sock, 1, two, 1, other);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 6 * MiB);
        json_decref(testd_ctl(&d, "check"));

        /*
         * Where the driver's block ids do not name allocations (the fake as it comes), the same
         * memory handed over twice is adopted twice: counted more than it is, against the client's
         * own limits, never less.
         */
        if (!on_gpu) {
                testd_crash(&d);
                unsetenv("FAKECUDA_BLOCK_IDS");
                testd_relaunch(&d);
                close(sock);
                sock = raw_hello(&d, "unnamed");
                ck_assert(!vmm_names_allocations(&d));
                pair[0] = fds[2];
                close(pair[1]);
                pair[1] = dup(fds[2]);
                vmm_adopt_all(sock, 0, two, 2, pair);
                ck_assert_int_eq(testd_client_field(&d, getpid(), "unnamed", "reserved_bytes"), 4 * MiB);
                json_decref(testd_ctl(&d, "check"));
        }
        close(sock);
        ck_assert_int_eq(testd_stop(&d), 0);

        /* The legacy backend's memory goes with its daemon: nothing to adopt. */
        testd_start(&d, "--backend", "cuda", NULL);
        sock = raw_hello(&d, "legacy");
        vmm_adopt_refused(sock, 0, two, 1, &fds[2], "its segments lived in the daemon's context and went with it");
        close(sock);
        for (int i = 0; i < 3; i++)
                close(fds[i]);
        close(pair[1]);
        close(now[0]);
        close(pipe_fds[0]);
        close(pipe_fds[1]);
        if (two_gpus)
                close(other[0]);
        cuda_stop(&d);
        unsetenv("FAKECUDA_DEVICES");
        unsetenv("FAKECUDA_BLOCK_IDS");
}
END_TEST

/* An adoption by the process's word of n segments of device, with nfds descriptors, refused whole, saying text. */
static void vmm_held_refused(int sock, uint32_t device, uint64_t *sizes, size_t n, const int *fds, size_t nfds,
                             const char *text) {
        refused_with(raw_adopt_held(sock, device, sizes, n, fds, nfds), text);
}

/*
 * The driver exports no imported memory (an H200, bench/results/2026-11-28-H200-d2ec017/), so a
 * process cannot hand a cuda-vmm daemon after a restart what it maps: it tells the daemon what it
 * holds (AdoptRequest.held), over the raw protocol here. Refused: with a descriptor, with no
 * segment, past the GPU's memory. Adopted: counted as the client's, the capacity as much larger;
 * given back, to the driver with the process's mapping, never to the cache or another client
 * (the capacity stays: the memory is free on the GPU then); never published, saying why.
 */
START_TEST(test_vmm_adoption_by_word) {
        uint64_t three[3] = { 2 * MiB, 2 * MiB, 2 * MiB }, huge = 1ULL << 42, ids[3];
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__PublishRequest pr = GPUPOOL__PUBLISH_REQUEST__INIT;
        int fds[GP_WIRE_MAX_FDS], sock;
        long long total, after;
        struct testd d;

        vmm_start(&d);
        sock = vmm_three_granules(&d, fds);
        testd_crash_and_restart(&d);
        close(sock);
        sock = raw_hello(&d, "after");
        total = testd_device(&d, 0, "total_bytes");

        vmm_held_refused(sock, 0, three, 1, fds, 1, "names 1 to 128 segments and no descriptor, not 1 with 1");
        vmm_held_refused(sock, 0, three, 0, NULL, 0, "names 1 to 128 segments and no descriptor, not 0 with 0");
        vmm_held_refused(sock, 0, &huge, 1, NULL, 0, "past the GPU's memory");
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 0);
        ck_assert_int_eq(testd_device(&d, 0, "total_bytes"), total);

        rep = raw_adopt_held(sock, 0, three, 3, NULL, 0);
        ck_assert_msg(rep->status == GPUPOOL__STATUS__STATUS_OK, "%s", rep->error ? rep->error : "");
        ck_assert_uint_eq(rep->adopt_reply->n_segment_ids, 3);
        memcpy(ids, rep->adopt_reply->segment_ids, sizeof(ids));
        gpupool__envelope__free_unpacked(rep, NULL);
        ck_assert(testd_log_wait(&d, "adopted 3 of 3 segments (6.0 MiB) on device 0, held by the process (by its word)"));
        ck_assert_int_eq(testd_client_field(&d, getpid(), "after", "reserved_bytes"), 6 * MiB);
        ck_assert_int_eq(testd_device(&d, 0, "total_bytes"), total + 6 * MiB);
        json_decref(testd_ctl(&d, "check"));

        /* Never an object: the daemon has none of its memory to seal or send. */
        env.id = 7;
        pr.name = "held";
        pr.segment_id = ids[0];
        pr.size = 4096;
        env.body_case = GPUPOOL__ENVELOPE__BODY_PUBLISH;
        env.publish = &pr;
        rep = raw_call(sock, &env);
        ck_assert_int_ne(rep->status, GPUPOOL__STATUS__STATUS_OK);
        ck_assert_msg(rep->error && strstr(rep->error, "adopted by its word: the daemon cannot share it"), "%s",
                      rep->error ? rep->error : "(no message)");
        gpupool__envelope__free_unpacked(rep, NULL);

        /* Given back: to the driver with the process's mapping, not to the cache; the capacity stays. */
        rep = raw_return(sock, ids, 1, NULL);
        ck_assert_uint_eq(rep->return_reply->returned, 1);
        gpupool__envelope__free_unpacked(rep, NULL);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 0);
        ck_assert_int_eq(testd_client_field(&d, getpid(), "after", "reserved_bytes"), 4 * MiB);
        after = testd_device(&d, 0, "total_bytes");
        ck_assert_int_eq(after, total + 6 * MiB);
        json_decref(testd_ctl(&d, "check"));
        rep = raw_return(sock, ids + 1, 2, NULL);
        ck_assert_uint_eq(rep->return_reply->returned, 2);
        gpupool__envelope__free_unpacked(rep, NULL);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 0);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 0);
        close(sock);
        for (int i = 0; i < 3; i++)
                close(fds[i]);
        cuda_stop(&d);
}
END_TEST

/* ---- named objects: published once, mapped read-only by others, outliving the publisher ---- */

#define VMM_OBJ (16 * MiB)      /* over 10 MiB: a segment of its own */

/*
 * Whether a write of 4 KiB at p, into an object of size bytes that holds pattern tag, is kept out
 * of memory mapped read-only: refused when it is queued (what an H200 answered, driver 580.159.04:
 * CUDA_ERROR_INVALID_VALUE, bench/results/2026-11-28-H200-d2ec017/, and so does the fake),
 * faulting at the sync, or neither and the bytes still as they were. Which one the driver gave
 * goes to the test's log.
 */
static bool write_kept_out(struct gpu *g, const void *p, size_t size, unsigned tag) {
        gp_cu_result queued = g->memset_d8_async(dptr((void *) p), 0, 4096, NULL), synced = GP_CUDA_SUCCESS;
        bool intact;

        if (queued == GP_CUDA_SUCCESS)
                synced = g->cu.cuCtxSynchronize();
        if (queued != GP_CUDA_SUCCESS || synced != GP_CUDA_SUCCESS) {
                fprintf(stderr, "a write into a read-only mapping: refused %s (%s)\n", queued ? "when queued" : "at the sync",
                        gp_cuda_error_name(&g->cu, queued ? queued : synced));
                return true;
        }
        intact = pattern_intact(g, (void *) p, size, tag);
        fprintf(stderr, "a write into a read-only mapping: no error; the bytes %s\n", intact ? "unchanged" : "CHANGED");
        return intact;
}

/* The object's field key in gpupoolctl objects --json (-1: no such object). */
static long long vmm_object_field(struct testd *d, const char *name, const char *key) {
        json_t *j = testd_ctl(d, "objects"), *o;
        long long r = -1;
        size_t i;

        json_array_foreach(json_object_get(j, "objects"), i, o)
                if (strcmp(json_string_value(json_object_get(o, "name")), name) == 0)
                        r = json_integer_value(json_object_get(o, key));
        json_decref(j);
        return r;
}

/* Publishes "weights" (a pattern), reads it still, attaches its own (the same bytes), and exits: the object stays. */
static int vmm_publisher(struct testd *d, void *arg) {
        void *fail_page = arg, *p;
        gpupool_client *c = NULL;
        const void *q;
        size_t size;
        struct gpu g;

        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "publisher", &c) < 0)
                FAIL();
        if (gpupool_alloc(c, 0, VMM_OBJ, &p) != 0 || write_pattern(&g, p, VMM_OBJ, 7) < 0)
                FAIL();
        if (gpupool_publish(c, "weights", p, VMM_OBJ) != 0 || !pattern_intact(&g, p, VMM_OBJ, 7))
                FAIL();
        if (gpupool_attach(c, "weights", &q, &size) != 0 || q != p || size != VMM_OBJ || gpupool_detach(c, q) != 0)
                FAIL();
        return 0;       /* exits attached: the exit detaches, the object stays */
}

/* In an attacher: the GPU opened, connected as c, "weights" attached and every byte as published; NULL if not. */
static const void *attach_weights(struct testd *d, struct gpu *g, gpupool_client **c) {
        const void *p;
        size_t size;

        if (gpu_open(g) < 0 || gpupool_connect(d->sock, "attacher", c) < 0)
                return NULL;
        if (gpupool_attach(*c, "weights", &p, &size) != 0 || size != VMM_OBJ || !pattern_intact(g, (void *) p, VMM_OBJ, 7))
                return NULL;
        return p;
}

/* Attaches "weights" twice over (one mapping), reads it, and finds a write refused. */
static int vmm_attacher(struct testd *d, void *arg) {
        void *fail_page = arg;
        gpupool_client *c = NULL;
        const void *p, *q;
        size_t size;
        struct gpu g;

        if (!(p = attach_weights(d, &g, &c)))
                FAIL();
        if (gpupool_attach(c, "weights", &q, &size) != 0 || q != p || gpupool_detach(c, q) != 0 ||
            vmm_object_field(d, "weights", "attachments") != 1)
                FAIL();
        if (!write_kept_out(&g, p, VMM_OBJ, 7))
                FAIL();
        return 0;
}

/* Publishes "scratch" and writes into it: refused, as the publisher's own mapping is read-only from the publish. */
static int vmm_publisher_writes(struct testd *d, void *arg) {
        void *fail_page = arg, *p;
        gpupool_client *c = NULL;
        struct gpu g;

        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "scribbler", &c) < 0 ||
            gpupool_alloc(c, 0, VMM_OBJ, &p) != 0 || write_pattern(&g, p, VMM_OBJ, 9) < 0 ||
            gpupool_publish(c, "scratch", p, VMM_OBJ) != 0)
                FAIL();
        if (!write_kept_out(&g, p, VMM_OBJ, 9))
                FAIL();
        return 0;
}

/*
 * cuda-vmm objects: what one process published, others map read-only without a copy after
 * it has exited (counted to its tenant meanwhile); a write through any process's mapping is kept
 * out; unpublished and detached, the object's memory goes back to the GPU.
 */
START_TEST(test_vmm_objects) {
        struct fdstore *store = fdstore_new();
        struct testd d;

        vmm_start(&d);
        d.store = store;
        check_client(&d, vmm_publisher, "the publisher");
        ck_assert_int_eq(vmm_object_field(&d, "weights", "size_bytes"), VMM_OBJ);
        ck_assert_int_eq(vmm_object_field(&d, "weights", "attachments"), 0);
        ck_assert_int_eq(leased_on(&d, 0), VMM_OBJ);    /* the object's, its publisher gone */
        check_client(&d, vmm_attacher, "the attacher");
        check_client(&d, vmm_publisher_writes, "the publisher that writes");
        json_decref(testd_ctl(&d, "check"));
        /* Kept in systemd's store (the test plays it), they outlive a kill -9 of the daemon. */
        testd_crash(&d);
        testd_relaunch(&d);
        ck_assert(testd_log_wait(&d, "took over 2 named objects"));
        ck_assert_int_eq(leased_on(&d, 0), 2 * VMM_OBJ);
        check_client(&d, vmm_attacher, "the attacher after a restart");
        json_decref(testd_ctl(&d, "unpublish weights"));
        json_decref(testd_ctl(&d, "unpublish scratch"));
        ck_assert_int_eq(vmm_object_field(&d, "weights", "size_bytes"), -1);
        /* Gone, not cached: a sealed segment is never leased again; and out of the store. */
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 0);
        ck_assert_uint_eq(fdstore_count(store), 0);
        fdstore_free(store);
        cuda_stop(&d);
}
END_TEST

/* An object kept in the store from GPU 0 is not taken over by a daemon that has GPU 1 at index 0. */
START_TEST(test_fake_vmm_object_on_another_gpu) {
        struct fdstore *store = fdstore_new();
        struct testd d;

        setenv("FAKECUDA_DEVICES", "2", 1);
        setenv("CUDA_VISIBLE_DEVICES", "0", 1);
        vmm_start(&d);
        d.store = store;
        check_client(&d, vmm_publisher, "the publisher");
        ck_assert_uint_eq(fdstore_count(store), 2);
        testd_crash(&d);
        setenv("CUDA_VISIBLE_DEVICES", "1", 1);
        testd_relaunch(&d);
        unsetenv("CUDA_VISIBLE_DEVICES");
        ck_assert(testd_log_wait(&d, "object 'weights' kept in systemd's store: not taken over: it was on another GPU "
                                     "than this daemon's device 0; its memory goes"));
        ck_assert_uint_eq(fdstore_count(store), 0);
        ck_assert_int_eq(vmm_object_field(&d, "weights", "size_bytes"), -1);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 0);
        fdstore_free(store);
        cuda_stop(&d);
        unsetenv("FAKECUDA_DEVICES");
}
END_TEST

/* Attaches "weights" on the legacy cuda backend and reads it: the IPC handle opens the object as it does a segment. */
static int legacy_attacher(struct testd *d, void *arg) {
        void *fail_page = arg;
        gpupool_client *c = NULL;
        const void *p;
        struct gpu g;

        if (!(p = attach_weights(d, &g, &c)))
                FAIL();
        if (vmm_object_field(d, "weights", "attachments") != 1 || gpupool_detach(c, p) != 0)
                FAIL();
        gpupool_disconnect(c);
        return 0;
}

/*
 * Legacy cuda objects: published, outliving the publisher, attached through the segment's IPC
 * handle (read-write: the driver has no read-only open), and kept in no store: they live in
 * the daemon's context and die with it.
 */
START_TEST(test_legacy_objects) {
        struct fdstore *store = fdstore_new();
        struct testd d;

        cuda_backend = "cuda";
        cuda_start(&d, NULL, NULL);
        d.store = store;
        check_client(&d, vmm_publisher, "the publisher");
        ck_assert_int_eq(vmm_object_field(&d, "weights", "size_bytes"), VMM_OBJ);
        ck_assert_int_eq(leased_on(&d, 0), VMM_OBJ);
        check_client(&d, legacy_attacher, "the attacher");
        ck_assert_uint_eq(fdstore_count(store), 0);
        json_decref(testd_ctl(&d, "check"));
        json_decref(testd_ctl(&d, "unpublish weights"));
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 0);
        fdstore_free(store);
        cuda_stop(&d);
}
END_TEST

/* ---- a node as it comes: eight GPUs of 141 GB, a hard limit of 4096 descriptors ---- */

#define NODE_GPUS 8
#define NODE_HELD (14ULL << 30)         /* what each holder holds */
#define NODE_FDS_MAX 1024               /* what the daemon may hold, whatever the memory it serves */

struct node_holder {
        struct survivor w;
        unsigned device;
        size_t block;
        const char *segments;           /* GPUPOOL_SEGMENTS */
};

/*
 * Holds 14 GiB of its device in blocks of its size, keeping no descriptor for them; once the
 * daemon has been killed and has come back, finds every byte it maps counted by the new daemon
 * within 10 s of going on, then frees it all.
 */
static int node_holder(struct testd *d, void *arg) {
        struct node_holder *h = arg;
        size_t n = NODE_HELD / h->block;
        struct gpupool_stats held;
        gpupool_client *c = NULL;
        void **p = calloc(n, sizeof(*p));
        long long counted = -1;
        double t0;
        char b;

        setenv("GPUPOOL_SEGMENTS", h->segments, 1);
        if (!p || gpupool_connect(d->sock, "holder", &c) < 0)
                return 1;
        for (size_t i = 0; i < n; i++)
                if (gpupool_alloc(c, h->device, h->block, &p[i]) != 0)
                        return 2;
        if (gpupool_stats(c, &held) != 0 || held.mapped_bytes < NODE_HELD || open_fds(getpid()) > 64) {
                fprintf(stderr, "holder %d: maps %llu bytes with %d descriptors open\n", h->w.index,
                        (unsigned long long) held.mapped_bytes, open_fds(getpid()));
                return 3;
        }
        if (write(h->w.up[1], "r", 1) != 1 || read(h->w.go[0], &b, 1) != 1 || !survivor_restarted(&h->w))
                return 4;
        /*
         * The new daemon: the process reconnects on its own and hands over what it holds, all of
         * it counted (less what it gives back meanwhile: granules leased ahead that no block uses).
         */
        for (t0 = now_s(); now_s() - t0 < 10; nap_ms(50))
                if (gpupool_stats(c, &held) == 0 && held.mapped_bytes >= NODE_HELD &&
                    (counted = testd_client_field(d, getpid(), "holder", "reserved_bytes")) == (long long) held.mapped_bytes)
                        break;
        fprintf(stderr, "holder %d: maps %llu bytes; the daemon counts %lld after %.1f s\n", h->w.index,
                (unsigned long long) held.mapped_bytes, counted, now_s() - t0);
        if (counted != (long long) held.mapped_bytes)
                return 5;
        for (size_t i = 0; i < n; i++)
                if (gpupool_free(c, p[i]) != 0)
                        return 6;
        if (gpupool_trim(c) != 0)
                return 7;
        gpupool_disconnect(c);
        free(p);
        return 0;
}

/*
 * Round five: a restarted cuda-vmm daemon reads its capacity from the GPU's free memory, which
 * leaves out what clients still hold, and adoption took that memory out of the capacity again:
 * a client holding 600 MiB of a 1 GiB GPU got 3 of its 6 segments adopted ("device 0 is full"),
 * and once it exited the pool stayed at 328 MiB while the GPU had 1,008 MiB free. Now every
 * segment is adopted, each byte counted once, and once they are freed the pool is the GPU's
 * size again (less the context the client held at the restart).
 */
static int holds_six_segments(struct testd *d, void *arg) {
        struct survivor *w = arg;
        gpupool_client *c;
        void *p[6];
        char b;

        if (gpupool_connect(d->sock, "holder", &c) < 0)
                return 1;
        for (int i = 0; i < 6; i++)
                if (gpupool_alloc(c, 0, 100 * MiB, &p[i]) < 0)
                        return 2;
        if (write(w->up[1], "r", 1) != 1 || read(w->go[0], &b, 1) != 1)
                return 3;
        /* Adopted by the daemon after the restart: within a few seconds its control thread has said hello. */
        for (double t0 = now_s(); leased_on(d, 0) < (long long) (600 * MiB); nap_ms(50))
                if (now_s() - t0 > 20)
                        return 4;
        for (int i = 0; i < 6; i++)
                if (gpupool_free(c, p[i]) < 0)
                        return 5;
        if (gpupool_trim(c) < 0)
                return 6;
        gpupool_disconnect(c);
        return 0;
}

START_TEST(test_fake_vmm_restart_counts_adopted_memory_once) {
        struct survivor w = { 0 };
        long long total, after;
        struct testd d;
        pid_t pid;
        char b;

        setenv("FAKECUDA_MEM", "1G", 1);
        cuda_backend = "cuda-vmm";
        cuda_start(&d, "--headroom", "8M");      /* the default of 1 GiB would leave nothing */
        total = testd_device(&d, 0, "total_bytes");
        ck_assert(pipe(w.up) == 0 && pipe(w.go) == 0);
        pid = spawn(holds_six_segments, &d, &w);
        ck_assert_int_eq(read(w.up[0], &b, 1), 1);
        testd_crash_and_restart(&d);
        ck_assert_int_eq(write(w.go[1], "g", 1), 1);
        ck_assert(testd_log_wait(&d, "adopted 6 of 6 segments"));
        ck_assert_int_eq(reap(pid), 0);
        json_decref(testd_ctl(&d, "check"));
        after = testd_device(&d, 0, "total_bytes");
        ck_assert_msg(after >= total - (long long) (16 * MiB) && after <= total, "capacity %lld after, %lld before", after,
                      total);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes") - testd_device(&d, 0, "cached_bytes"), 0);
        close(w.up[0]), close(w.up[1]), close(w.go[0]), close(w.go[1]);
        cuda_stop(&d);
        unsetenv("FAKECUDA_MEM");
}
END_TEST

/* Holds a 100 MiB block (and a context of its own) through a restart, until told, then gives it back once the new daemon counts it. */
static int holds_through_restart(struct testd *d, void *arg) {
        struct survivor *w = arg;
        gpupool_client *c;
        void *p;
        char b;

        if (gpupool_connect(d->sock, "context", &c) < 0 || gpupool_alloc(c, 0, 100 * MiB, &p) < 0)
                return 1;
        if (write(w->up[1], "r", 1) != 1 || read(w->go[0], &b, 1) != 1)
                return 2;
        for (double t0 = now_s(); testd_client_field(d, getpid(), "context", "reserved_bytes") < (long long) (100 * MiB);
             nap_ms(50))
                if (now_s() - t0 > 20)
                        return 3;
        if (gpupool_free(c, p) < 0 || gpupool_trim(c) < 0)
                return 4;
        gpupool_disconnect(c);
        return 0;
}

/*
 * Round six: a restarted daemon read its capacity with the contexts of the clients alive then
 * (300 MiB each here, as a real one takes hundreds) taken, and kept it that small for good. It
 * grows back as that memory comes free: once the three have exited, within a few seconds.
 */
START_TEST(test_fake_vmm_capacity_grows_back) {
        struct survivor w[3];
        long long total, after;
        struct testd d;
        pid_t pid[3];
        char b;

        setenv("FAKECUDA_MEM", "3G", 1);
        setenv("FAKECUDA_CONTEXT_MEM", "300M", 1);
        cuda_backend = "cuda-vmm";
        cuda_start(&d, "--headroom", "8M");
        total = testd_device(&d, 0, "total_bytes");
        for (int i = 0; i < 3; i++) {
                memset(&w[i], 0, sizeof(w[i]));
                ck_assert(pipe(w[i].up) == 0 && pipe(w[i].go) == 0);
                pid[i] = spawn(holds_through_restart, &d, &w[i]);
                ck_assert_int_eq(read(w[i].up[0], &b, 1), 1);
        }
        testd_crash_and_restart(&d);
        after = testd_device(&d, 0, "total_bytes");
        ck_assert_msg(after <= total - (long long) (800 * MiB), "capacity %lld after the restart, %lld before", after, total);
        for (int i = 0; i < 3; i++) {
                ck_assert_int_eq(write(w[i].go[1], "g", 1), 1);
                ck_assert_int_eq(reap(pid[i]), 0);
                close(w[i].up[0]), close(w[i].up[1]), close(w[i].go[0]), close(w[i].go[1]);
        }
        ck_assert_msg(testd_device_becomes(&d, 0, "total_bytes", total), "capacity %lld, not %lld again",
                      testd_device(&d, 0, "total_bytes"), total);
        ck_assert(testd_log_wait(&d, "is free again"));
        json_decref(testd_ctl(&d, "check"));
        cuda_stop(&d);
        unsetenv("FAKECUDA_MEM");
        unsetenv("FAKECUDA_CONTEXT_MEM");
}
END_TEST

/*
 * The descriptors held ahead for the granule stock count in the fd limit: on eight GPUs under a
 * hard limit of 4096, --granule-stock 128 leaves room for 688 clients (4096 less 320 and 128 per
 * GPU, 4 each) where the default fits 944; 1000 asks no more than the most held, 128 per GPU.
 */
START_TEST(test_fake_vmm_stock_in_the_fd_limit) {
        struct rlimit rl = { .rlim_cur = 4096, .rlim_max = 4096 };
        static const char *const stocks[] = { "128", "1000" };
        struct testd d;

        if (under_valgrind()) {
                TEST_SKIP("valgrind does not let a process raise its descriptor limit");
                return;
        }
        ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);    /* this test's process only, and what it starts */
        setenv("FAKECUDA_DEVICES", "8", 1);
        for (int i = 0; i < 2; i++) {
                cuda_backend = "cuda-vmm";
                cuda_start(&d, "--granule-stock", stocks[i]);
                ck_assert(testd_log_wait(&d, "max_clients 688, not the default 1024: the hard file descriptor limit is 4096"));
                cuda_stop(&d);
        }
        unsetenv("FAKECUDA_DEVICES");
}
END_TEST

/*
 * gpupoold --backend cuda-vmm with default options on a node of eight GPUs of 141 GB under a
 * hard limit of 4096 descriptors: it starts, fitting max_clients to the limit; offers at least
 * 120 GiB of each GPU; holds at most 1,024 descriptors while three processes hold 14 GiB each
 * (2 MiB blocks growing in place, 64 MiB in whole segments, 256 MiB growing in place), as they
 * hold none per granule; and after a kill -9 and a restart knows every byte each holds within
 * 10 s, all of which they then give back.
 */
START_TEST(test_fake_vmm_node_scale) {
        struct node_holder h[3] = {
                { .device = 0, .block = 2 * MiB, .segments = "grow" },
                { .device = 1, .block = 64 * MiB, .segments = "whole" },
                { .device = 5, .block = 256 * MiB, .segments = "grow" },
        };
        struct rlimit rl = { .rlim_cur = 4096, .rlim_max = 4096 };
        pid_t pids[3];
        struct testd d;
        int fds;
        char b;

        if (under_valgrind()) {
                TEST_SKIP("valgrind does not let a process raise its descriptor limit");
                return;
        }

        ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);    /* this test's process only, and what it starts */
        setenv("FAKECUDA_DEVICES", "8", 1);
        setenv("FAKECUDA_MEM", "141000000000", 1);
        setenv("FAKECUDA_CONTEXT_MEM", "518M", 1);
        vmm_start(&d);
        ck_assert(testd_log_wait(&d, "max_clients 944, not the default 1024: the hard file descriptor limit is 4096"));
        for (unsigned i = 0; i < NODE_GPUS; i++)
                ck_assert_int_ge(testd_device(&d, i, "total_bytes"), 120LL << 30);
        for (int i = 0; i < 3; i++) {
                h[i].w.index = i;
                ck_assert(pipe(h[i].w.up) == 0 && pipe(h[i].w.go) == 0);
                pids[i] = spawn(node_holder, &d, &h[i]);
        }
        for (int i = 0; i < 3; i++)
                ck_assert_int_eq(read(h[i].w.up[0], &b, 1), 1);
        fds = open_fds(d.pid);
        ck_assert_msg(fds > 0 && fds <= NODE_FDS_MAX, "the daemon holds %d descriptors serving 42 GiB", fds);
        ck_assert_int_ge(leased_on(&d, 0) + leased_on(&d, 1) + leased_on(&d, 5), (long long) (3 * NODE_HELD));
        testd_crash(&d);
        for (int i = 0; i < 3; i++)
                ck_assert_int_eq(write(h[i].w.go[1], "k", 1), 1);
        for (int i = 0; i < 3; i++)
                ck_assert_int_eq(read(h[i].w.up[0], &b, 1), 1);
        testd_relaunch(&d);
        for (int i = 0; i < 3; i++)
                ck_assert_int_eq(write(h[i].w.go[1], "u", 1), 1);
        for (int i = 0; i < 3; i++) {
                int status = reap(pids[i]);

                ck_assert_msg(status == 0, "holder %d failed at step %d", i, status);
                close(h[i].w.up[0]), close(h[i].w.up[1]), close(h[i].w.go[0]), close(h[i].w.go[1]);
        }
        fds = open_fds(d.pid);
        ck_assert_msg(fds > 0 && fds <= NODE_FDS_MAX, "the daemon holds %d descriptors after the adoption", fds);
        json_decref(testd_ctl(&d, "check"));
        for (unsigned i = 0; i < NODE_GPUS; i++)
                ck_assert_int_eq(testd_device(&d, i, "reserved_bytes") - testd_device(&d, i, "cached_bytes"), 0);
        cuda_stop(&d);
        unsetenv("FAKECUDA_DEVICES");
        unsetenv("FAKECUDA_MEM");
        unsetenv("FAKECUDA_CONTEXT_MEM");
}
END_TEST

void cuda_vmm_add_common(TCase *tc) {
        tcase_add_test(tc, test_vmm_survives_daemon_kill);
        tcase_add_test(tc, test_vmm_freed_memory_serves_without_a_daemon);
        tcase_add_test(tc, test_vmm_adoption);
        tcase_add_test(tc, test_vmm_adoption_by_word);
        tcase_add_test(tc, test_vmm_adopting_a_frozen_fuse_file);
        tcase_add_test(tc, test_vmm_objects);
        tcase_add_test(tc, test_legacy_objects);
}

/*
 * Growing in place on a GPU of 141 GB, a block of 16 GiB is a piece: one import, one map and
 * one cuMemSetAccess, where granules would be 8,192 imports. Freed on a stream under running
 * work, it is held for that stream: the next block of its size there takes it at once, one on
 * another stream gets a piece of its own; trimmed, everything goes back.
 */
static int piece_client(struct testd *d, void *arg) {
        const size_t big = 16ULL << 30, page = 4096;
        struct gpupool_stats before, st;
        gpupool_client *c = NULL;
        unsigned long long access;
        gp_cu_stream s, other;
        void *p, *q, *r;
        struct gpu g;

        (void) arg;
        setenv("GPUPOOL_SEGMENTS", "grow", 1);
        if (gpu_open(&g) < 0 || gpupool_connect(d->sock, "piece", &c) < 0 ||
            g.cu.cuStreamCreate(&s, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS ||
            g.cu.cuStreamCreate(&other, GP_CU_STREAM_NON_BLOCKING) != GP_CUDA_SUCCESS)
                return 1;
        if (gpupool_alloc(c, 0, 3 * MiB, &q) < 0 || gpupool_stats(c, &before) < 0)
                return 2;
        access = g.set_access_calls();
        if (gpupool_alloc_async(c, 0, big, s, &p) < 0 || gpupool_stats(c, &st) < 0)
                return 3;
        if (st.segments_imported != before.segments_imported + 1 || st.mapped_bytes != before.mapped_bytes + big ||
            g.set_access_calls() != access + 1)
                return 4;
        /* Its ends written and read through the driver (16 GiB of bytes would be 16 GiB of this machine's memory). */
        if (write_pattern(&g, p, page, 31) < 0 || write_pattern(&g, (char *) p + big - page, page, 32) < 0 ||
            !pattern_intact(&g, p, page, 31) || !pattern_intact(&g, (char *) p + big - page, page, 32))
                return 5;
        if (queue_work(&g, s, p, page) < 0 || gpupool_free_async(c, p, s) < 0)
                return 6;
        if (gpupool_alloc_async(c, 0, big, s, &r) < 0 || r != p || gpupool_stats(c, &st) < 0 ||
            st.segments_imported != before.segments_imported + 1)
                return 7;       /* held for s: taken again there, nothing leased */
        if (gpupool_free_async(c, r, s) < 0 || gpupool_alloc_async(c, 0, big, other, &r) < 0 || r == p)
                return 8;       /* another stream does not see it while s runs */
        release_work(&g, s);
        if (g.cu.cuStreamSynchronize(s) != GP_CUDA_SUCCESS || gpupool_free(c, r) < 0 || gpupool_free(c, q) < 0 ||
            gpupool_trim(c) < 0 || gpupool_stats(c, &st) < 0 || st.mapped_bytes != 0 || g.open_handles() != 0)
                return 9;
        gpupool_disconnect(c);
        return 0;
}

START_TEST(test_fake_vmm_piece_on_a_node_sized_gpu) {
        struct testd d;
        int r;

        if (under_valgrind()) {
                TEST_SKIP("valgrind cannot reserve the address ranges of a 141 GB GPU growing in place (564 GB)");
                return;
        }
        setenv("FAKECUDA_MEM", "141000000000", 1);
        vmm_start(&d);
        r = reap(spawn(piece_client, &d, NULL));
        ck_assert_msg(r == 0, "the piece client failed at step %d", r);
        json_decref(testd_ctl(&d, "check"));
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes") - testd_device(&d, 0, "cached_bytes"), 0);
        cuda_stop(&d);
        unsetenv("FAKECUDA_MEM");
}
END_TEST

void cuda_vmm_add_fake(TCase *tc) {
        tcase_add_test(tc, test_fake_vmm_rules);
        tcase_add_test(tc, test_fake_vmm_calls_take_their_price);
        tcase_add_test(tc, test_fake_vmm_export_kept_open);
        tcase_add_test(tc, test_fake_vmm_serves_pid_namespace);
        tcase_add_test(tc, test_fake_vmm_kept_descriptor_reads_nothing);
        tcase_add_test(tc, test_fake_vmm_resume_refused_other_gpus);
        tcase_add_test(tc, test_fake_granule_leases);
        tcase_add_test(tc, test_fake_vmm_stock_exported_ahead);
        tcase_add_test(tc, test_fake_vmm_stock_in_the_fd_limit);
        tcase_add_test(tc, test_fake_vmm_object_on_another_gpu);
        tcase_add_test(tc, test_fake_vmm_node_scale);
        tcase_add_test(tc, test_fake_vmm_restart_counts_adopted_memory_once);
        tcase_add_test(tc, test_fake_vmm_capacity_grows_back);
        tcase_add_test(tc, test_fake_vmm_piece_on_a_node_sized_gpu);
}
