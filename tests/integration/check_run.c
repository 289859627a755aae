/*
 * check_run.c: gpupool-run on the fake driver, found as a program finds libcuda.so.1 (the fake
 * under that name in build/tests/cudalib): programs that know nothing of gpupool
 * (tests/run/cuprog.c), linked with -lcuda, with dlsym() and through cuGetProcAddress_v2, take
 * their memory from gpupoold under its limits. Part of the cuda-fake suite (check_cuda.c).
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cudatest.h"

#define LIMIT (64 * MiB)

/* The three kinds: a program and its first arguments. */
static const char *const kinds[][2] = {
        { "cuprog-linked", "" },
        { "cuprog-dynamic", "dlsym" },
        { "cuprog-dynamic", "procaddr" },
};

/* The shell's start of a command running build/tests/PROGRAM under gpupool-run on d, where libcuda.so.1 is the fake. */
static void run_prefix(struct testd *d, char *buf, size_t size, const char *options) {
        snprintf(buf, size,
                 "LD_LIBRARY_PATH=%s/tests/cudalib ASAN_OPTIONS=\"$ASAN_OPTIONS:verify_asan_link_order=0\" "
                 "%s/gpupool-run --socket %s %s --",
                 build_dir(), build_dir(), d->sock, options);
}

/* The value after key in a program's output ("key value..."), or NULL. */
static const char *field(const char *out, const char *key) {
        size_t n = strlen(key);

        for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
                if (strncmp(p, key, n) == 0 && (p[n] == ' ' || p[n] == '\n'))
                        return p + n + (p[n] == ' ');
        return NULL;
}

/*
 * Each kind fills its 64 MiB limit with 1 MiB blocks: the 65th is CUDA_ERROR_OUT_OF_MEMORY;
 * cuMemGetInfo_v2 says the limit is the total; data written reads back; a block's address
 * range is the block's own; all of it goes back to the pool when freed. cuMemCreate's memory,
 * the driver's, counts against the same limit until cuMemRelease.
 */
START_TEST(test_run_programs_of_every_kind_on_the_pool) {
        char cmd[2048], out[8192], prefix[1024];
        struct testd d;

        cuda_start(&d, "--client-limit", "64M");
        run_prefix(&d, prefix, sizeof(prefix), "");
        for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
                const char *v;
                unsigned long long free_bytes, total;

                snprintf(cmd, sizeof(cmd), "%s %s/tests/%s %s fill 100 2>&1", prefix, build_dir(), kinds[k][0], kinds[k][1]);
                ck_assert_msg(run_capture(cmd, out, sizeof(out)) == 0, "%s: %s", cmd, out);
                ck_assert_msg((v = field(out, "info")) && sscanf(v, "%llu %llu", &free_bytes, &total) == 2 &&
                              total == LIMIT && free_bytes == LIMIT, "cuMemGetInfo_v2 is not the client's limit: %s", out);
                ck_assert_msg((v = field(out, "refused")) && strncmp(v, "64 2\n", 5) == 0,
                              "the 65th MiB was not CUDA_ERROR_OUT_OF_MEMORY: %s", out);
                ck_assert_msg(strstr(out, "gpupool-run: ") && strstr(out, "cuMemAlloc of 1048576 bytes on device 0"),
                              "the refusal's reason was not said: %s", out);
                ck_assert_msg((v = field(out, "full")) && sscanf(v, "%llu %llu", &free_bytes, &total) == 2 &&
                              free_bytes == 0 && total == LIMIT, "a full client's cuMemGetInfo_v2: %s", out);
                ck_assert_msg((v = field(out, "data")) && strncmp(v, "ok", 2) == 0, "data did not read back: %s", out);
                ck_assert_msg((v = field(out, "range")) && strncmp(v, "base 1048576\n", 13) == 0,
                              "cuMemGetAddressRange_v2 is not the block's: %s", out);
                ck_assert_msg((v = field(out, "attribute")) && strncmp(v, "base 1048576\n", 13) == 0,
                              "cuPointerGetAttribute's range is not the block's: %s", out);
                ck_assert_msg((v = field(out, "ipc")) && strncmp(v, "801\n", 4) == 0 && strstr(out, "cuIpcGetMemHandle of"),
                              "an IPC handle of a block was not refused, saying why: %s", out);
                ck_assert_msg(field(out, "freed"), "%s", out);
                ck_assert_msg(testd_device_becomes(&d, 0, "in_use_bytes", 0), "%s's memory did not come back", kinds[k][0]);
                /* A context of the program's own is the driver's: past the limit, the GPU's size for its total. */
                snprintf(cmd, sizeof(cmd), "%s %s/tests/%s %s ownctx 100 2>&1", prefix, build_dir(), kinds[k][0], kinds[k][1]);
                ck_assert_msg(run_capture(cmd, out, sizeof(out)) == 0 && field(out, "allocated") &&
                              (v = field(out, "ownctx")) && sscanf(v, "%llu %llu", &free_bytes, &total) == 2 && total > LIMIT,
                              "a context of the program's own: %s", out);
                /* cuMemCreate is the driver's, counted against the same limit until released. */
                snprintf(cmd, sizeof(cmd), "%s %s/tests/%s %s create 100 2>&1", prefix, build_dir(), kinds[k][0], kinds[k][1]);
                ck_assert_msg(run_capture(cmd, out, sizeof(out)) == 0, "%s: %s", cmd, out);
                ck_assert_msg((v = field(out, "refused")) && strncmp(v, "32 2\n", 5) == 0 &&
                              strstr(out, "cuMemCreate of 2097152 bytes on device 0") && strstr(out, "outside the pool"),
                              "the 33rd 2 MiB of cuMemCreate was not CUDA_ERROR_OUT_OF_MEMORY, saying why: %s", out);
                ck_assert_msg((v = field(out, "full")) && sscanf(v, "%llu %llu", &free_bytes, &total) == 2 &&
                              free_bytes == 0 && total == LIMIT, "cuMemGetInfo_v2 at the limit by cuMemCreate: %s", out);
                ck_assert_msg((v = field(out, "alloc")) && strncmp(v, "2\n", 2) == 0,
                              "cuMemAlloc_v2 past the limit cuMemCreate's memory took: %s", out);
                ck_assert_msg((v = field(out, "alloc-after-release")) && strncmp(v, "0\n", 2) == 0,
                              "cuMemAlloc_v2 once cuMemRelease gave room: %s", out);
                ck_assert_msg((v = field(out, "released")) && sscanf(v, "%llu %llu", &free_bytes, &total) == 2 &&
                              free_bytes == LIMIT, "cuMemGetInfo_v2 once all is released: %s", out);
                /* The stream-ordered allocator: the same limit; a pitch of 512-byte multiples. */
                snprintf(cmd, sizeof(cmd), "%s %s/tests/%s %s async 100 2>&1", prefix, build_dir(), kinds[k][0], kinds[k][1]);
                ck_assert_msg(run_capture(cmd, out, sizeof(out)) == 0, "%s: %s", cmd, out);
                ck_assert_msg((v = field(out, "refused")) && strncmp(v, "64 2\n", 5) == 0 && strstr(out, "cuMemAllocAsync of"),
                              "the 65th MiB on a stream was not CUDA_ERROR_OUT_OF_MEMORY: %s", out);
                ck_assert_msg((v = field(out, "pitch")) && strncmp(v, "1024 65536\n", 11) == 0, "cuMemAllocPitch_v2: %s", out);
                ck_assert_msg(field(out, "freed"), "%s", out);
                ck_assert_msg(testd_device_becomes(&d, 0, "in_use_bytes", 0), "%s's memory did not come back", kinds[k][0]);
        }
        cuda_stop(&d);
}
END_TEST

/*
 * A program under gpupool-run is a client of the daemon, by the name given and its pid, while
 * it holds memory; what it frees serves the next program, from the daemon's cache.
 */
START_TEST(test_run_program_is_a_client) {
        char cmd[2048], prefix[1024], path[512], out[8192];
        long long cached;
        struct testd d;
        pid_t pid = 0;
        FILE *in;

        cuda_start(&d, NULL, NULL);
        run_prefix(&d, prefix, sizeof(prefix), "--name held-by-run");
        snprintf(path, sizeof(path), "%s/run-hold.out", test_tmp());
        snprintf(cmd, sizeof(cmd), "%s %s/tests/cuprog-linked hold 8 > %s 2>&1", prefix, build_dir(), path);
        in = popen(cmd, "w");
        ck_assert_ptr_nonnull(in);
        for (double t0 = now_s(); !field(read_text(path, out, sizeof(out)), "held") && now_s() - t0 < 10; nap_ms(10))
                ;
        ck_assert_msg(field(out, "held") && field(out, "pid") && sscanf(field(out, "pid"), "%d", &pid) == 1, "%s", out);
        ck_assert_msg(testd_client_field(&d, 0, "held-by-run", "pid") == pid, "no client held-by-run of pid %d", (int) pid);
        ck_assert_msg(testd_client_field(&d, pid, NULL, "reserved_bytes") >= (long long) (8 * MiB),
                      "the client holds less than its 8 MiB");
        fputs("\n", in);
        ck_assert_int_eq(pclose(in), 0);
        ck_assert_msg(field(read_text(path, out, sizeof(out)), "freed"), "%s", out);
        ck_assert_msg(testd_device_becomes(&d, 0, "in_use_bytes", 0), "the program's memory did not come back");
        /* A child CMD starts (here through a shell) is on the pool too: its total is the pool's, not the GPU's. */
        snprintf(cmd, sizeof(cmd), "%s sh -c '%s/tests/cuprog-linked fill 4' 2>&1", prefix, build_dir());
        {
                unsigned long long free_bytes, total;
                const char *v;

                ck_assert_msg(run_capture(cmd, out, sizeof(out)) == 0 && (v = field(out, "info")) &&
                              sscanf(v, "%llu %llu", &free_bytes, &total) == 2 &&
                              (long long) total == testd_device(&d, 0, "total_bytes"), "a child of CMD: %s", out);
        }
        cached = testd_device(&d, 0, "cached_bytes");
        ck_assert_msg(cached >= (long long) (8 * MiB), "the daemon caches %lld bytes of the program's", cached);
        /* The next program's blocks come from that cache: the daemon's memory does not grow. */
        snprintf(cmd, sizeof(cmd), "%s %s/tests/cuprog-dynamic procaddr fill 8 2>&1", prefix, build_dir());
        ck_assert_msg(run_capture(cmd, out, sizeof(out)) == 0 && field(out, "allocated"), "%s", out);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), cached);
        cuda_stop(&d);
}
END_TEST

/*
 * Memory a program under gpupool-run freed and its pool keeps idle goes back when another
 * client needs it: the daemon asks the program's library for it, as it asks any client's.
 */
START_TEST(test_run_program_gives_idle_memory_back) {
        char cmd[2048], prefix[1024], path[512], out[8192];
        long long pool;
        unsigned want;
        struct testd d;
        FILE *in;

        cuda_start(&d, NULL, NULL);
        pool = testd_device(&d, 0, "total_bytes");
        ck_assert_msg(pool > (long long) (64 * MiB), "a pool of %lld bytes", pool);
        /* The first program caches most of the pool; the second wants more than is left. */
        want = (unsigned) (pool * 3 / 4 / MiB);
        run_prefix(&d, prefix, sizeof(prefix), "--name cacher");
        snprintf(path, sizeof(path), "%s/run-cache.out", test_tmp());
        snprintf(cmd, sizeof(cmd), "%s %s/tests/cuprog-linked cache %u > %s 2>&1", prefix, build_dir(), want, path);
        in = popen(cmd, "w");
        ck_assert_ptr_nonnull(in);
        for (double t0 = now_s(); !field(read_text(path, out, sizeof(out)), "cached") && now_s() - t0 < 10; nap_ms(10))
                ;
        ck_assert_msg(field(out, "cached"), "%s", out);
        ck_assert_msg(testd_client_field(&d, 0, "cacher", "reserved_bytes") >= (long long) want * (long long) MiB,
                      "the first program does not hold what it freed");
        /* Its library says it keeps that free (within a second of the frees). */
        ck_assert_msg(testd_client_becomes(&d, 0, "cacher", "held_free_bytes",
                                           testd_client_field(&d, 0, "cacher", "reserved_bytes")),
                      "the first program did not report what it keeps free");
        run_prefix(&d, prefix, sizeof(prefix), "--name wanter");
        snprintf(cmd, sizeof(cmd), "%s %s/tests/cuprog-dynamic procaddr fill %u 2>&1", prefix, build_dir(), want);
        ck_assert_msg(run_capture(cmd, out, sizeof(out)) == 0 && field(out, "allocated"),
                      "the second program did not get the memory the first kept idle: %s", out);
        /* cuMemGetInfo_v2's free counts what the other keeps idle, which the daemon asks back for it. */
        {
                unsigned long long free_bytes, total;
                const char *v = field(out, "info");

                ck_assert_msg(v && sscanf(v, "%llu %llu", &free_bytes, &total) == 2 && (long long) total == pool &&
                              (long long) free_bytes >= (long long) want * (long long) MiB &&
                              (long long) free_bytes <= pool,
                              "the second program was told %s", v ? v : out);
        }
        fputs("\n", in);
        ck_assert_int_eq(pclose(in), 0);
        ck_assert_msg(testd_device_becomes(&d, 0, "in_use_bytes", 0), "the programs' memory did not come back");
        cuda_stop(&d);
}
END_TEST

/*
 * A stream-ordered allocation is for the stream's device, as the driver's is, not the current
 * context's: a stream of GPU 1 takes GPU 1's memory while GPU 0's context is current.
 */
START_TEST(test_run_stream_of_another_device) {
        char cmd[2048], prefix[1024], path[512], out[8192];
        struct testd d;
        FILE *in;

        setenv("FAKECUDA_DEVICES", "2", 1);
        cuda_start(&d, NULL, NULL);
        run_prefix(&d, prefix, sizeof(prefix), "--name streamer");
        snprintf(path, sizeof(path), "%s/run-stream1.out", test_tmp());
        snprintf(cmd, sizeof(cmd), "%s %s/tests/cuprog-dynamic procaddr stream1 8 > %s 2>&1", prefix, build_dir(), path);
        in = popen(cmd, "w");
        ck_assert_ptr_nonnull(in);
        for (double t0 = now_s(); !field(read_text(path, out, sizeof(out)), "held") && !field(out, "error") && now_s() - t0 < 10;
             nap_ms(10))
                ;
        ck_assert_msg(field(out, "held"), "%s", out);
        ck_assert_msg(testd_device(&d, 1, "reserved_bytes") >= (long long) (8 * MiB) &&
                      testd_device(&d, 0, "reserved_bytes") == 0,
                      "GPU 1's stream took %lld bytes of GPU 1 and %lld of GPU 0", testd_device(&d, 1, "reserved_bytes"),
                      testd_device(&d, 0, "reserved_bytes"));
        fputs("\n", in);
        ck_assert_int_eq(pclose(in), 0);
        ck_assert_msg(field(read_text(path, out, sizeof(out)), "freed"), "%s", out);
        cuda_stop(&d);
        unsetenv("FAKECUDA_DEVICES");
}
END_TEST

/* Without a daemon: the driver's memory, said once, or (--without-daemon refuse) every allocation refused. */
START_TEST(test_run_without_a_daemon) {
        char cmd[2048], out[8192], dir[512];
        struct testd d = { 0 };

        fake_node_new();
        test_mkdtemp(dir, sizeof(dir), "run-nodaemon");
        ck_assert_int_lt(snprintf(d.sock, sizeof(d.sock), "%s/none.sock", dir), (int) sizeof(d.sock));
        for (int refuse = 0; refuse < 2; refuse++) {
                char prefix[1024];

                run_prefix(&d, prefix, sizeof(prefix), refuse ? "--without-daemon refuse" : "");
                snprintf(cmd, sizeof(cmd), "%s %s/tests/cuprog-linked fill 4 2>&1", prefix, build_dir());
                ck_assert_msg(run_capture(cmd, out, sizeof(out)) == 0, "%s", out);
                ck_assert_msg(strstr(out, "no gpupoold to take memory from"), "%s", out);
                if (refuse)
                        ck_assert_msg(field(out, "refused") && strncmp(field(out, "refused"), "0 2\n", 4) == 0, "%s", out);
                else
                        ck_assert_msg(field(out, "allocated") && field(out, "data") && strncmp(field(out, "data"), "ok", 2) == 0,
                                      "%s", out);
        }
        snprintf(cmd, sizeof(cmd), "%s/gpupool-run --without-daemon maybe -- true 2>&1", build_dir());
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 2);
        ck_assert_msg(strstr(out, "\"driver\""), "%s", out);
        snprintf(cmd, sizeof(cmd), "%s/gpupool-run -- %s/no-such-program 2>&1", build_dir(), dir);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 127);
        snprintf(cmd, sizeof(cmd), "%s/gpupool-run 2>&1", build_dir());
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 2);
        rmdir(dir);
        fake_node_done();
}
END_TEST

/*
 * A daemon on the host backend (a node whose driver gpupoold could not load, or `make run`
 * where it found none) serves host memory, which is no GPU's: the preload treats it as no
 * daemon, saying why, and the program gets the driver's memory (or, refused, none), and
 * cuMemGetInfo tells the GPU's memory, not the host pool's.
 */
START_TEST(test_run_against_a_host_daemon) {
        char cmd[2048], out[8192], prefix[1024];
        struct testd d;

        fake_node_new();
        testd_start(&d, "--backend", "host", "--host-capacity", "256M", NULL);
        for (int refuse = 0; refuse < 2; refuse++) {
                const char *info;

                run_prefix(&d, prefix, sizeof(prefix), refuse ? "--without-daemon refuse" : "");
                snprintf(cmd, sizeof(cmd), "%s %s/tests/cuprog-linked fill 4 2>&1", prefix, build_dir());
                ck_assert_msg(run_capture(cmd, out, sizeof(out)) == 0, "%s", out);
                ck_assert_msg(strstr(out, "no gpupoold to take memory from (the gpupoold that answered serves host memory "
                                          "(its backend is \"host\")"), "%s", out);
                ck_assert_msg((info = field(out, "info")) && !strstr(info, " 268435456\n"), "%s", out);
                if (refuse)
                        ck_assert_msg(field(out, "refused") && strncmp(field(out, "refused"), "0 2\n", 4) == 0, "%s", out);
                else
                        ck_assert_msg(field(out, "allocated") && field(out, "data") && strncmp(field(out, "data"), "ok", 2) == 0,
                                      "%s", out);
        }
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 0);
        ck_assert_int_eq(testd_stop(&d), 0);
        fake_node_done();
}
END_TEST

void cuda_run_add(TCase *tc) {
        tcase_add_test(tc, test_run_programs_of_every_kind_on_the_pool);
        tcase_add_test(tc, test_run_program_is_a_client);
        tcase_add_test(tc, test_run_program_gives_idle_memory_back);
        tcase_add_test(tc, test_run_stream_of_another_device);
        tcase_add_test(tc, test_run_without_a_daemon);
        tcase_add_test(tc, test_run_against_a_host_daemon);
}
