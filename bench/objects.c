/*
 * objects.c: "make bench-objects": what a named object saves a process that needs bytes another
 * process already loaded, on the host backend, against a private gpupoold.
 *
 *   load     what a worker does without gpupool: read a file of SIZE bytes (in the page cache:
 *            read once before) into new memory, touching every page (malloc + read()).
 *   attach   gpupool_attach() of an object of SIZE bytes that another handle published, then a
 *            read of one byte per page (the pages are the object's: mapped, not copied), and
 *            gpupool_detach().
 *   attach with N attached: one more handle's gpupool_attach() + gpupool_detach() while N other
 *            handles (sessions of the daemon) have the object attached, N = 1, 8, 64.
 *
 * With --backend cuda-vmm (or cuda), on GPU 0: load is malloc + read() + cuMemAlloc +
 * cuMemcpyHtoD of the file (what a worker does to put weights on its GPU), and attach reads 4
 * KiB back with cuMemcpyDtoH instead of a byte per page (device memory is mapped whole).
 *
 * Medians over --reps runs (default 5; 200 for the attach-only figures), both measured in the
 * same run. Usage: objects --build DIR [--size BYTES] [--reps N] [--backend host|cuda|cuda-vmm]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cudadrv.h"
#include "gpu_open.h"
#include "gpupool.h"
#include "measure.h"
#include "private_daemon.h"

#define MiB (1ULL << 20)
#define PAGE 4096

static pid_t daemon_pid = -1;

static void die(const char *what, int r) {
        fprintf(stderr, "bench-objects: %s: %s\n", what, r < 0 ? gpupool_strerror(r) : strerror(errno));
        if (daemon_pid > 0)
                kill(daemon_pid, SIGTERM);      /* it holds our stdout: a pipe's reader would wait for it */
        exit(1);
}

/* All of size bytes at offset, written or read in as many calls as the kernel takes (2 GiB at most each). */
static void whole(int fd, uint8_t *buf, size_t size, bool writing) {
        for (size_t done = 0; done < size;) {
                ssize_t n = writing ? pwrite(fd, buf + done, size - done, (off_t) done) :
                                      pread(fd, buf + done, size - done, (off_t) done);

                if (n <= 0)
                        die(writing ? "write the file" : "read the file", 0);
                done += (size_t) n;
        }
}

static gpupool_client *connect_or_die(const char *sock, const char *name) {
        gpupool_client *c;
        char why[GP_MAX_ERROR_BYTES];

        if (gpupool_connect(sock, name, &c) < 0) {
                gpupool_last_error(NULL, why, sizeof(why));
                fprintf(stderr, "bench-objects: connect: %s\n", why);
                exit(1);
        }
        return c;
}

/* On a GPU backend: the driver, GPU 0's primary context current, and the copies the library does not use. */
static struct gp_cuda cu;
static gp_cu_result (*htod)(gp_cu_deviceptr dst, const void *src, size_t n);
static gp_cu_result (*dtoh)(void *dst, gp_cu_deviceptr src, size_t n);

static void gpu_open(void) {
        bench_gpu_open(&cu, NULL, "bench-objects");
        *(void **) &htod = gp_cuda_symbol(&cu, "cuMemcpyHtoD", 3020);
        *(void **) &dtoh = gp_cuda_symbol(&cu, "cuMemcpyDtoH", 3020);
        if (!htod || !dtoh)
                die("find cuMemcpyHtoD_v2 and cuMemcpyDtoH_v2 in the driver", 0);
}

/* The GPU's load: size bytes from fd into new device memory, through host memory; freed after. */
static void gpu_load(int fd, size_t size) {
        uint8_t *copy = malloc(size);
        gp_cu_deviceptr d;

        if (!copy)
                die("malloc", 0);
        whole(fd, copy, size, false);
        if (cu.cuMemAlloc(&d, size) != GP_CUDA_SUCCESS || htod(d, copy, size) != GP_CUDA_SUCCESS ||
            cu.cuMemFree(d) != GP_CUDA_SUCCESS)
                die("cuMemAlloc, cuMemcpyHtoD, cuMemFree", 0);
        free(copy);
}

/* Reads one byte per page, so that every page is mapped; returns their sum (kept from the compiler). */
static unsigned touch(const volatile uint8_t *p, size_t size) {
        unsigned sum = 0;

        for (size_t i = 0; i < size; i += PAGE)
                sum += p[i];
        return sum;
}

int main(int argc, char **argv) {
        const char *build = "build", *backend = "host";
        size_t size = 4096 * MiB, reps = 5;
        char dir[] = "/tmp/gpupool-bench-objects-XXXXXX", sock[128], file[128], capacity[32];
        static const unsigned counts[] = { 1, 8, 64 };
        gpupool_client *pub, *holders[64], *c;
        double *load, *attach, t;
        static uint8_t page[PAGE];
        unsigned sum = 0;
        uint8_t *block, *bytes;
        bool gpu;
        pid_t daemon;
        int fd, r;

        for (int i = 1; i + 1 < argc; i += 2) {
                if (strcmp(argv[i], "--build") == 0)
                        build = argv[i + 1];
                else if (strcmp(argv[i], "--size") == 0)
                        size = strtoull(argv[i + 1], NULL, 0);
                else if (strcmp(argv[i], "--reps") == 0)
                        reps = strtoull(argv[i + 1], NULL, 0);
                else if (strcmp(argv[i], "--backend") == 0)
                        backend = argv[i + 1];
        }
        gpu = strcmp(backend, "host") != 0;
        if (size < 16 * MiB || reps < 1 || (gpu && strcmp(backend, "cuda") != 0 && strcmp(backend, "cuda-vmm") != 0)) {
                fprintf(stderr, "usage: objects --build DIR [--size BYTES (16 MiB at least)] [--reps N] "
                                "[--backend host|cuda|cuda-vmm]\n");
                return 2;
        }
        if (gpu)
                gpu_open();
        if (!mkdtemp(dir))
                die("mkdtemp", 0);
        snprintf(sock, sizeof(sock), "%s/gpupool.sock", dir);
        snprintf(file, sizeof(file), "%s/weights", dir);
        snprintf(capacity, sizeof(capacity), "%zu", (size_t) (size + 64 * MiB));
        daemon = daemon_pid = private_daemon_start_backend(build, dir, sock, backend, capacity);

        /* The bytes: published by one handle, and in a file for the load, read once (page cache). */
        pub = connect_or_die(sock, "publisher");
        if ((r = gpupool_alloc(pub, 0, size, (void **) &block)) < 0)
                die("alloc", r);
        bytes = gpu ? malloc(size) : block;
        if (!bytes)
                die("malloc", 0);
        for (size_t i = 0; i < size; i++)
                bytes[i] = (uint8_t) (i * 131);
        if (gpu && htod((gp_cu_deviceptr) (uintptr_t) block, bytes, size) != GP_CUDA_SUCCESS)
                die("cuMemcpyHtoD", 0);
        fd = open(file, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0)
                die("create the file", 0);
        whole(fd, bytes, size, true);
        if (gpu)
                free(bytes);
        if ((r = gpupool_publish(pub, "weights", block, size)) < 0 || (r = gpupool_detach(pub, block)) < 0)
                die("publish", r);

        load = calloc(reps, sizeof(*load));
        attach = calloc(reps > 200 ? reps : 200, sizeof(*attach));
        printf("# bench-objects: %zu MiB, %s backend, medians of %zu runs (attach with N attached: 200)\n", (size_t) (size / MiB),
               backend, reps);
        for (size_t k = 0; k < reps; k++) {
                uint8_t *copy;
                const void *p;
                size_t got;

                /* Load: malloc + read() from the page cache, every page touched by the copy (GPU: and onto it). */
                t = now_ns();
                if (gpu) {
                        gpu_load(fd, size);
                } else {
                        copy = malloc(size);
                        if (!copy)
                                die("malloc", 0);
                        whole(fd, copy, size, false);
                        sum += touch(copy, size);
                        free(copy);
                }
                load[k] = now_ns() - t;
                /* Attach, a byte per page read (GPU: 4 KiB copied back), detach. */
                c = connect_or_die(sock, "reader");
                t = now_ns();
                if ((r = gpupool_attach(c, "weights", &p, &got)) < 0)
                        die("attach", r);
                if (gpu && (dtoh(page, (gp_cu_deviceptr) (uintptr_t) p + got - PAGE, PAGE) != GP_CUDA_SUCCESS ||
                            page[PAGE - 1] != (uint8_t) ((got - 1) * 131)))
                        die("read the attached object back", 0);
                sum += gpu ? page[0] : touch(p, got);
                if ((r = gpupool_detach(c, p)) < 0)
                        die("detach", r);
                attach[k] = now_ns() - t;
                gpupool_disconnect(c);
        }
        printf("%-43s%10.1f ms\n", gpu ? "load from the page cache onto the GPU" : "load from the page cache into new memory",
               median(load, reps) / 1e6);
        printf("%-42s%10.1f ms   (%.0fx less)\n", gpu ? "attach, read 4 KiB back, detach" : "attach, read a byte per page, detach",
               median(attach, reps) / 1e6,
               median(load, reps) / median(attach, reps));

        for (size_t n = 0; n < sizeof(counts) / sizeof(counts[0]); n++) {
                const void *p;
                size_t got;

                for (unsigned h = 0; h < counts[n]; h++) {
                        holders[h] = connect_or_die(sock, "holder");
                        if ((r = gpupool_attach(holders[h], "weights", &p, &got)) < 0)
                                die("attach", r);
                }
                c = connect_or_die(sock, "reader");
                for (size_t k = 0; k < 200; k++) {
                        t = now_ns();
                        if ((r = gpupool_attach(c, "weights", &p, &got)) < 0 || (r = gpupool_detach(c, p)) < 0)
                                die("attach", r);
                        attach[k] = now_ns() - t;
                }
                gpupool_disconnect(c);
                printf("attach + detach with %2u attached           %10.1f us\n", counts[n], median(attach, 200) / 1e3);
                for (unsigned h = 0; h < counts[n]; h++)
                        gpupool_disconnect(holders[h]);
        }
        if ((r = gpupool_unpublish(pub, "weights")) < 0)
                die("unpublish", r);
        gpupool_disconnect(pub);
        close(fd);
        unlink(file);
        kill(daemon, SIGTERM);
        waitpid(daemon, NULL, 0);
        private_daemon_remove(dir, sock);
        free(load);
        free(attach);
        return sum == 0xdeadbeef;       /* the sum is read; it is no result */
}
