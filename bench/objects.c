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
 * Medians over --reps runs (default 5; 200 for the attach-only figures), both measured in the
 * same run. Usage: objects --build DIR [--size BYTES] [--reps N]
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

/* Reads one byte per page, so that every page is mapped; returns their sum (kept from the compiler). */
static unsigned touch(const volatile uint8_t *p, size_t size) {
        unsigned sum = 0;

        for (size_t i = 0; i < size; i += PAGE)
                sum += p[i];
        return sum;
}

int main(int argc, char **argv) {
        const char *build = "build";
        size_t size = 4096 * MiB, reps = 5;
        char dir[] = "/tmp/gpupool-bench-objects-XXXXXX", sock[128], file[128], capacity[32];
        static const unsigned counts[] = { 1, 8, 64 };
        gpupool_client *pub, *holders[64], *c;
        double *load, *attach, t;
        unsigned sum = 0;
        uint8_t *block;
        pid_t daemon;
        int fd, r;

        for (int i = 1; i + 1 < argc; i += 2) {
                if (strcmp(argv[i], "--build") == 0)
                        build = argv[i + 1];
                else if (strcmp(argv[i], "--size") == 0)
                        size = strtoull(argv[i + 1], NULL, 0);
                else if (strcmp(argv[i], "--reps") == 0)
                        reps = strtoull(argv[i + 1], NULL, 0);
        }
        if (size < 16 * MiB || reps < 1) {
                fprintf(stderr, "usage: objects --build DIR [--size BYTES (16 MiB at least)] [--reps N]\n");
                return 2;
        }
        if (!mkdtemp(dir))
                die("mkdtemp", 0);
        snprintf(sock, sizeof(sock), "%s/gpupool.sock", dir);
        snprintf(file, sizeof(file), "%s/weights", dir);
        snprintf(capacity, sizeof(capacity), "%zu", (size_t) (size + 64 * MiB));
        daemon = daemon_pid = private_daemon_start(build, dir, sock, capacity);

        /* The bytes: published by one handle, and in a file for the load, read once (page cache). */
        pub = connect_or_die(sock, "publisher");
        if ((r = gpupool_alloc(pub, 0, size, (void **) &block)) < 0)
                die("alloc", r);
        for (size_t i = 0; i < size; i++)
                block[i] = (uint8_t) (i * 131);
        fd = open(file, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0)
                die("create the file", 0);
        whole(fd, block, size, true);
        if ((r = gpupool_publish(pub, "weights", block, size)) < 0 || (r = gpupool_detach(pub, block)) < 0)
                die("publish", r);

        load = calloc(reps, sizeof(*load));
        attach = calloc(reps > 200 ? reps : 200, sizeof(*attach));
        printf("# bench-objects: %zu MiB, host backend, medians of %zu runs (attach with N attached: 200)\n", (size_t) (size / MiB),
               reps);
        for (size_t k = 0; k < reps; k++) {
                uint8_t *copy;
                const void *p;
                size_t got;

                /* Load: malloc + read() from the page cache, every page touched by the copy. */
                t = now_ns();
                copy = malloc(size);
                if (!copy)
                        die("malloc", 0);
                whole(fd, copy, size, false);
                sum += touch(copy, size);
                load[k] = now_ns() - t;
                free(copy);
                /* Attach, a byte per page read, detach. */
                c = connect_or_die(sock, "reader");
                t = now_ns();
                if ((r = gpupool_attach(c, "weights", &p, &got)) < 0)
                        die("attach", r);
                sum += touch(p, got);
                if ((r = gpupool_detach(c, p)) < 0)
                        die("detach", r);
                attach[k] = now_ns() - t;
                gpupool_disconnect(c);
        }
        printf("load from the page cache into new memory   %10.1f ms\n", median(load, reps) / 1e6);
        printf("attach, read a byte per page, detach      %10.1f ms   (%.0fx less)\n", median(attach, reps) / 1e6,
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
