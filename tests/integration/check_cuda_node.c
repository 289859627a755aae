/*
 * check_cuda_node.c: a GPU's memory is the node's, on the fake driver: every process's
 * allocations and contexts count, the daemon keeps its headroom as other processes take
 * memory (and takes it back from its clients), and it starts without a driver or a GPU.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cudatest.h"

/* ---- the node's memory: every process's allocations and contexts count ---- */

struct node_memory {
        int up[2];                      /* children to the test: a byte when they are ready */
        int go[2], go2[2];              /* the test to the holder, and to the checker: a byte to go on */
};

/* Holds 256 MiB of the GPU and a context until told to go on, then exits without freeing either. */
static int holder_client(struct testd *d, void *arg) {
        struct node_memory *m = arg;
        gp_cu_deviceptr p;
        struct gpu g;
        char c;

        (void) d;
        if (gpu_open(&g) < 0 || g.cu.cuMemAlloc(&p, 256 * MiB) != GP_CUDA_SUCCESS)
                return 1;
        if (write(m->up[1], "h", 1) != 1 || read(m->go[0], &c, 1) != 1)
                return 2;
        return 0;
}

/* Sees the holder's memory and context in cuMemGetInfo and cuMemAlloc, fills the GPU, then sees the holder's come back. */
static int checker_client(struct testd *d, void *arg) {
        struct node_memory *m = arg;
        size_t free1, free2, total;
        gp_cu_deviceptr p;
        struct gpu g;
        char c;

        (void) d;
        if (gpu_open(&g) < 0 || g.cu.cuMemGetInfo(&free1, &total) != GP_CUDA_SUCCESS)
                return 1;
        if (total != 1024 * MiB || free1 != total - 2 * 64 * MiB - 256 * MiB) {
                fprintf(stderr, "checker: %zu free of %zu, not the two contexts and the holder's 256 MiB less\n", free1, total);
                return 2;
        }
        if (g.cu.cuMemAlloc(&p, free1 + 4096) != GP_CUDA_ERROR_OUT_OF_MEMORY)
                return 3;       /* what another process holds is not free */
        if (g.cu.cuMemAlloc(&p, free1 - 32 * MiB) != GP_CUDA_SUCCESS)
                return 4;
        if (write(m->up[1], "c", 1) != 1 || read(m->go2[0], &c, 1) != 1)
                return 5;
        /* The holder has exited: what it had is free again. */
        if (g.cu.cuMemGetInfo(&free2, &total) != GP_CUDA_SUCCESS || free2 != 32 * MiB + 256 * MiB + 64 * MiB) {
                fprintf(stderr, "checker: %zu free after the holder exited\n", free2);
                return 6;
        }
        return g.cu.cuMemFree(p) == GP_CUDA_SUCCESS ? 0 : 7;
}

/* On a full GPU a new process cannot even make its context. */
static int late_client(struct testd *d, void *arg) {
        char err[256];
        struct gp_cuda cu;
        gp_cu_device dev;
        gp_cu_context ctx;

        (void) d, (void) arg;
        if (gp_cuda_load(&cu, err, sizeof(err)) < 0 || cu.cuDeviceGet(&dev, 0) != GP_CUDA_SUCCESS)
                return 1;
        return cu.cuDevicePrimaryCtxRetain(&ctx, dev) == GP_CUDA_ERROR_OUT_OF_MEMORY ? 0 : 2;
}

START_TEST(test_fake_memory_is_the_nodes) {
        struct node_memory m;
        pid_t holder, checker;
        char c;

        setenv("FAKECUDA_MEM", "1G", 1);
        setenv("FAKECUDA_CONTEXT_MEM", "64M", 1);
        fake_node_new();
        ck_assert(pipe(m.up) == 0 && pipe(m.go) == 0 && pipe(m.go2) == 0);
        holder = spawn(holder_client, NULL, &m);
        ck_assert_int_eq(read(m.up[0], &c, 1), 1);
        checker = spawn(checker_client, NULL, &m);
        ck_assert_int_eq(read(m.up[0], &c, 1), 1);
        ck_assert_msg(reap(spawn(late_client, NULL, NULL)) == 0, "a context was made on a full GPU");
        ck_assert_int_eq(write(m.go[1], "g", 1), 1);
        ck_assert_int_eq(reap(holder), 0);
        ck_assert_int_eq(write(m.go2[1], "g", 1), 1);
        ck_assert_msg(reap(checker) == 0, "the node's memory was not counted across processes");
        for (int i = 0; i < 2; i++) {
                close(m.up[i]), close(m.go[i]), close(m.go2[i]);
        }
        fake_node_done();       /* the holder's allocation went with it */
        unsetenv("FAKECUDA_CONTEXT_MEM");
        unsetenv("FAKECUDA_MEM");
}
END_TEST

/* ---- the headroom is kept as other processes take memory ---- */

/* Leases 256 MiB and exits holding it: the daemon caches the segment. */
static int leaving_client(struct testd *d, void *arg) {
        gpupool_client *c = NULL;
        void *p;

        (void) arg;
        return gpupool_connect(d->sock, "leaving", &c) == 0 && gpupool_alloc(c, 0, 256 * MiB, &p) == 0 ? 0 : 1;
}

/* A program without gpupool: takes all but 128 MiB of what the GPU has free, until told to let go. */
static int hog_client(struct testd *d, void *arg) {
        struct node_memory *m = arg;
        size_t free_bytes, total;
        gp_cu_deviceptr p;
        struct gpu g;
        char c;

        (void) d;
        if (gpu_open(&g) < 0 || g.cu.cuMemGetInfo(&free_bytes, &total) != GP_CUDA_SUCCESS ||
            g.cu.cuMemAlloc(&p, free_bytes - 128 * MiB) != GP_CUDA_SUCCESS)
                return 1;
        if (write(m->up[1], "h", 1) != 1 || read(m->go[0], &c, 1) != 1)
                return 2;
        return g.cu.cuMemFree(p) == GP_CUDA_SUCCESS ? 0 : 3;
}

/* Asks for 256 MiB: refused while the GPU lacks it beyond the headroom, saying so; served once it has it. */
static int headroom_client(struct testd *d, void *arg) {
        bool want_refusal = arg != NULL;
        gpupool_client *c = NULL;
        char err[1024];
        void *p;
        int r;

        if (gpupool_connect(d->sock, "headroom", &c) < 0)
                return 1;
        r = gpupool_alloc(c, 0, 256 * MiB, &p);
        if (!want_refusal)
                return r == 0 ? 0 : 2;
        gpupool_last_error(c, err, sizeof(err));
        if (r != -ENOMEM || !strstr(err, "of it (headroom) to contexts and programs outside the pool")) {
                fprintf(stderr, "headroom_client: %d: %s\n", r, err);
                return 3;
        }
        return 0;
}

START_TEST(test_fake_headroom_kept) {
        struct node_memory m;
        char cmd[512], out[4096];
        struct testd d;
        pid_t hog;
        char c;

        setenv("FAKECUDA_MEM", "1G", 1);
        setenv("FAKECUDA_CONTEXT_MEM", "64M", 1);
        cuda_start(&d, "--headroom=256M", "--max-cached=100%");
        ck_assert_int_eq(testd_device(&d, 0, "total_bytes"), 1024 * MiB - 64 * MiB - 256 * MiB);
        ck_assert_int_eq(testd_device(&d, 0, "gpu_total_bytes"), 1024 * MiB);
        ck_assert_int_eq(testd_device(&d, 0, "headroom_bytes"), 256 * MiB);
        ck_assert_int_eq(reap(spawn(leaving_client, &d, NULL)), 0);
        ck_assert(testd_device_becomes(&d, 0, "cached_bytes", testd_device(&d, 0, "reserved_bytes")));
        ck_assert_int_ge(testd_device(&d, 0, "cached_bytes"), 256 * MiB);

        /* A program without gpupool leaves 128 MiB free: the daemon gives its cache back for the headroom. */
        ck_assert(pipe(m.up) == 0 && pipe(m.go) == 0);
        hog = spawn(hog_client, &d, &m);
        ck_assert_int_eq(read(m.up[0], &c, 1), 1);
        ck_assert_msg(testd_device_becomes(&d, 0, "cached_bytes", 0), "the cache was kept with the headroom taken");
        ck_assert_int_ge(testd_device(&d, 0, "gpu_free_bytes"), 256 * MiB);
        ck_assert_int_ge(testd_device(&d, 0, "headroom_releases_total"), 1);
        ck_assert(testd_log_wait(&d, "others had taken part of the 256.0 MiB headroom"));
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s metrics | grep -c '^gpupool_headroom_releases_total{.*} [1-9]'",
                 build_dir(), d.sock);
        ck_assert_msg(run_capture(cmd, out, sizeof(out)) == 0, "no headroom releases in the metrics: %s", out);

        /* Growing would take the headroom: refused, with why; once the program exits, served. */
        ck_assert_msg(reap(spawn(headroom_client, &d, &m)) == 0, "the pool grew into the headroom, or did not say why not");
        ck_assert_int_eq(write(m.go[1], "g", 1), 1);
        ck_assert_int_eq(reap(hog), 0);
        ck_assert_msg(reap(spawn(headroom_client, &d, NULL)) == 0, "memory the program gave back did not serve");
        for (int i = 0; i < 2; i++) {
                close(m.up[i]);
                close(m.go[i]);
        }
        cuda_stop(&d);
        unsetenv("FAKECUDA_CONTEXT_MEM");
        unsetenv("FAKECUDA_MEM");
}
END_TEST

/* Allocates 256 MiB and frees it: its process keeps the segment, free, until told to exit. */
static int keeper_client(struct testd *d, void *arg) {
        struct node_memory *m = arg;
        gpupool_client *c = NULL;
        void *p;
        char b;

        if (gpupool_connect(d->sock, "keeper", &c) < 0 || gpupool_alloc(c, 0, 256 * MiB, &p) < 0 || gpupool_free(c, p) < 0)
                return 1;
        if (write(m->up[1], "k", 1) != 1 || read(m->go[0], &b, 1) != 1)
                return 2;
        gpupool_disconnect(c);
        return 0;
}

/*
 * With the cache empty, what clients keep free goes back for the headroom; with silent set, a
 * client whose control channel never answers was asked first (flush --tenant), and its request
 * expires with reclaim_timeout instead of turning headroom reclaim off for good.
 */
static void check_headroom_reclaimed(bool silent) {
        struct node_memory keep, hog_pipes;
        int quiet = -1, quiet_control = -1;
        pid_t keeper, hog;
        struct testd d;
        char c;

        setenv("FAKECUDA_MEM", "1G", 1);
        setenv("FAKECUDA_CONTEXT_MEM", "64M", 1);
        cuda_start(&d, "--headroom=256M", NULL);
        if (silent) {
                quiet = raw_keeper(&d, "silent", 2 * MiB, 1, NULL, &quiet_control);
                json_decref(testd_ctl(&d, "flush --tenant default"));  /* asks it: no answer ever comes */
        }
        ck_assert(pipe(keep.up) == 0 && pipe(keep.go) == 0 && pipe(hog_pipes.up) == 0 && pipe(hog_pipes.go) == 0);
        setenv("GPUPOOL_IDLE_RETURN", "10min", 1);     /* the keeper gives nothing back by itself */
        keeper = spawn(keeper_client, &d, &keep);
        unsetenv("GPUPOOL_IDLE_RETURN");
        ck_assert_int_eq(read(keep.up[0], &c, 1), 1);
        ck_assert(testd_client_becomes(&d, keeper, NULL, "held_free_bytes", 256 * MiB));
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 0);

        hog = spawn(hog_client, &d, &hog_pipes);
        ck_assert_int_eq(read(hog_pipes.up[0], &c, 1), 1);
        ck_assert_msg(testd_client_becomes(&d, keeper, NULL, "reserved_bytes", 0),
                      "the client kept its free segment with the headroom taken");
        ck_assert(testd_log_wait(&d, "others took part of the headroom and the cache is empty: asked 1 client for 128.0 MiB"));
        ck_assert_int_ge(testd_device(&d, 0, "gpu_free_bytes"), 256 * MiB);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 0);      /* straight back to the driver */
        ck_assert_int_ge(testd_device(&d, 0, "reclaims_total"), 1);

        ck_assert(write(hog_pipes.go[1], "g", 1) == 1 && write(keep.go[1], "g", 1) == 1);
        ck_assert_int_eq(reap(hog), 0);
        ck_assert_int_eq(reap(keeper), 0);
        for (int i = 0; i < 2; i++) {
                close(keep.up[i]);
                close(keep.go[i]);
                close(hog_pipes.up[i]);
                close(hog_pipes.go[i]);
        }
        if (silent) {
                close(quiet_control);
                close(quiet);
        }
        cuda_stop(&d);
        unsetenv("FAKECUDA_CONTEXT_MEM");
        unsetenv("FAKECUDA_MEM");
}

START_TEST(test_fake_headroom_reclaimed_from_clients) {
        check_headroom_reclaimed(false);
}
END_TEST

START_TEST(test_fake_headroom_reclaim_outlives_a_silent_channel) {
        check_headroom_reclaimed(true);
}
END_TEST

START_TEST(test_fake_start_without_driver_or_gpu) {
        const char *b = build_dir();
        char cmd[768], out[4096];
        const char *lib = getenv("GPUPOOL_LIBCUDA");
        struct testd d;

        fake_node_new();
        snprintf(cmd, sizeof(cmd), "GPUPOOL_LIBCUDA=/nonexistent/libcuda.so.1 %s/gpupoold --backend cuda --socket /tmp/gp-never.sock 2>&1", b);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "--backend cuda: no CUDA driver: cannot load /nonexistent/libcuda.so.1"), "%s", out);
        snprintf(cmd, sizeof(cmd), "GPUPOOL_LIBCUDA=%s FAKECUDA_DEVICES=0 %s/gpupoold --backend cuda --socket /tmp/gp-never.sock 2>&1", lib, b);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "finds no GPU"), "%s", out);
        snprintf(cmd, sizeof(cmd), "GPUPOOL_LIBCUDA=%s %s/gpupoold --backend cuda --headroom 4G --socket /tmp/gp-never.sock 2>&1", lib, b);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "--headroom 4.0 GiB leaves nothing"), "%s", out);
        snprintf(cmd, sizeof(cmd), "GPUPOOL_LIBCUDA=%s FAKECUDA_VMM=0 %s/gpupoold --backend cuda-vmm --socket /tmp/gp-never.sock 2>&1",
                 lib, b);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "--backend cuda-vmm: GPU 0 (Fake GPU 0) does not support virtual memory management"), "%s", out);

        /* auto: no GPU means the host backend, said in the log. */
        setenv("FAKECUDA_DEVICES", "0", 1);
        testd_start(&d, "--backend", "auto", NULL);
        unsetenv("FAKECUDA_DEVICES");
        {
                json_t *st = testd_ctl(&d, "status");
                json_t *dev = json_array_get(json_object_get(st, "devices"), 0);

                ck_assert_str_eq(json_string_value(json_object_get(dev, "backend")), "host");
                json_decref(st);
        }
        snprintf(cmd, sizeof(cmd), "grep -c 'finds no GPU; using the host backend' %s", d.log);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        ck_assert_int_eq(testd_stop(&d), 0);
        fake_node_done();
}
END_TEST

void cuda_node_add(TCase *tc) {
        tcase_add_test(tc, test_fake_memory_is_the_nodes);
        tcase_add_test(tc, test_fake_headroom_kept);
        tcase_add_test(tc, test_fake_headroom_reclaimed_from_clients);
        tcase_add_test(tc, test_fake_headroom_reclaim_outlives_a_silent_channel);
        tcase_add_test(tc, test_fake_start_without_driver_or_gpu);
}
