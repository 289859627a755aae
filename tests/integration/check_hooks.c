/*
 * check_hooks.c: the PyTorch and CuPy allocator hooks and gpupool_stats(), on the host
 * backend: lazy connect with $GPUPOOL_SOCKET and $GPUPOOL_CLIENT_NAME, size 0, refusals with
 * their reason per thread, a retry after a failed connect, an explicit handle for CuPy, a
 * forked child connecting on its own, and a C++ caller catching a refusal as an exception.
 * Each test runs in its own process (Check forks), so each starts without the shared handle.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpupool.h"
#include "suites.h"
#include "testlib.h"

#define KiB (1ULL << 10)
#define MiB (1ULL << 20)

START_TEST(test_hooks_connect_lazily_by_environment) {
        char why[512];
        struct testd d;
        json_t *st, *cl;
        void *p, *q;

        testd_start(&d, NULL);
        setenv("GPUPOOL_SOCKET", d.sock, 1);
        setenv("GPUPOOL_CLIENT_NAME", "hooked-job", 1);
        /* Nothing connects before the first allocation. */
        st = testd_ctl(&d, "status");
        ck_assert_uint_eq(json_array_size(json_object_get(st, "clients")), 0);
        json_decref(st);
        p = gpupool_torch_alloc(1 * MiB, 0, NULL);
        ck_assert_ptr_nonnull(p);
        memset(p, 0xab, 1 * MiB);       /* host memory: the caller's to write */
        q = gpupool_cupy_malloc(NULL, 3 * KiB, 0);
        ck_assert_ptr_nonnull(q);
        ck_assert_int_eq(gpupool_hook_last_error(why, sizeof(why)), 0);
        ck_assert_str_eq(why, "");
        /* One handle for both frameworks, named by the environment. */
        st = testd_ctl(&d, "status");
        ck_assert_uint_eq(json_array_size(json_object_get(st, "clients")), 1);
        cl = status_client_by_name(st, "hooked-job");
        ck_assert_ptr_nonnull(cl);
        json_decref(st);
        /* What it holds in use reaches the daemon with its next report. */
        ck_assert(testd_client_becomes(&d, 0, "hooked-job", "in_use_bytes", 1 * MiB + 3 * KiB));
        /* Size 0 is NULL and no failure; freeing NULL does nothing. */
        ck_assert_ptr_null(gpupool_torch_alloc(0, 0, NULL));
        ck_assert_int_eq(gpupool_hook_last_error(NULL, 0), 0);
        ck_assert_ptr_null(gpupool_cupy_malloc(NULL, 0, 0));
        ck_assert_int_eq(gpupool_hook_last_error(NULL, 0), 0);
        gpupool_torch_free(NULL, 0, 0, NULL);
        gpupool_cupy_free(NULL, NULL, 0);
        ck_assert_int_eq(gpupool_hook_last_error(NULL, 0), 0);
        /* A negative size (ssize_t) is refused, saying so. */
        ck_assert_ptr_null(gpupool_torch_alloc(-5, 0, NULL));
        ck_assert_int_eq(gpupool_hook_last_error(why, sizeof(why)), -EINVAL);
        ck_assert_msg(strstr(why, "-5 bytes"), "%s", why);
        /* Frees go back to the process's pool, as the daemon hears; a second free of the same pointer is refused. */
        gpupool_torch_free(p, 1 * MiB, 0, NULL);
        ck_assert_int_eq(gpupool_hook_last_error(NULL, 0), 0);
        gpupool_cupy_free(NULL, q, 0);
        ck_assert(testd_client_becomes(&d, 0, "hooked-job", "in_use_bytes", 0));
        gpupool_torch_free(p, 1 * MiB, 0, NULL);
        ck_assert_int_eq(gpupool_hook_last_error(why, sizeof(why)), -ENOENT);
        ck_assert_msg(strstr(why, "freeing 0x"), "%s", why);
        /* A device the daemon does not have. */
        ck_assert_ptr_null(gpupool_cupy_malloc(NULL, 4 * KiB, 3));
        ck_assert_int_eq(gpupool_hook_last_error(why, sizeof(why)), -ENODEV);
        ck_assert_msg(strstr(why, "on device 3: no such device: no device 3"), "%s", why);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

static void *other_thread_error(void *arg) {
        (void) arg;
        return (void *) (intptr_t) gpupool_hook_last_error(NULL, 0);
}

START_TEST(test_hooks_refusal_reason_per_thread) {
        char why[1024];
        struct testd d;
        pthread_t t;
        void *ret;

        testd_start(&d, "--client-limit", "8M", NULL);
        setenv("GPUPOOL_SOCKET", d.sock, 1);
        ck_assert_ptr_null(gpupool_torch_alloc(12 * MiB, 0, NULL));
        ck_assert_int_eq(gpupool_hook_last_error(why, sizeof(why)), -EDQUOT);
        ck_assert_msg(strstr(why, "allocating 12.0 MiB (12582912 bytes) on device 0: over a gpupool limit: ") &&
                      strstr(why, "over its limit of 8.0 MiB"), "%s", why);
        /* The reason is this thread's: another thread has its own (none). */
        pthread_create(&t, NULL, other_thread_error, NULL);
        pthread_join(t, &ret);
        ck_assert_int_eq((int) (intptr_t) ret, 0);
        /* A success clears it. */
        ck_assert_ptr_nonnull(gpupool_torch_alloc(1 * MiB, 0, NULL));
        ck_assert_int_eq(gpupool_hook_last_error(why, sizeof(why)), 0);
        /* Without the C++ runtime in the process there is nothing to throw with (a sanitizer's runtime brings one). */
        {
                void *cxx = dlopen("libstdc++.so.6", RTLD_NOW | RTLD_NOLOAD);

                ck_assert_int_eq(gpupool_torch_set_throw(1), cxx ? 0 : -ENOENT);
                if (cxx)
                        dlclose(cxx);
        }
        ck_assert_int_eq(gpupool_torch_set_throw(0), 0);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

START_TEST(test_hooks_retry_after_failed_connect) {
        char why[512], path[160];
        struct testd d;

        testd_start(&d, NULL);
        snprintf(path, sizeof(path), "%s.absent", d.sock);
        setenv("GPUPOOL_SOCKET", path, 1);
        ck_assert_ptr_null(gpupool_cupy_malloc(NULL, 4 * KiB, 0));
        ck_assert_int_eq(gpupool_hook_last_error(why, sizeof(why)), -ENOENT);
        ck_assert_msg(strstr(why, "no gpupoold listens at ") && strstr(why, ".absent (there is no such socket)") &&
                      strstr(why, "start it, or set $GPUPOOL_SOCKET"), "%s", why);
        /* A daemon that comes later is found at the next call. */
        setenv("GPUPOOL_SOCKET", d.sock, 1);
        ck_assert_ptr_nonnull(gpupool_cupy_malloc(NULL, 4 * KiB, 0));
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

START_TEST(test_hooks_bad_client_name) {
        char why[512];
        struct testd d;

        testd_start(&d, NULL);
        setenv("GPUPOOL_SOCKET", d.sock, 1);
        setenv("GPUPOOL_CLIENT_NAME", "tab\there", 1);
        ck_assert_ptr_null(gpupool_torch_alloc(4 * KiB, 0, NULL));
        ck_assert_int_eq(gpupool_hook_last_error(why, sizeof(why)), -EINVAL);
        ck_assert_msg(strstr(why, "$GPUPOOL_CLIENT_NAME"), "%s", why);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* CuPy's param: a handle of the caller's own instead of the shared one. */
START_TEST(test_hooks_cupy_with_own_handle) {
        struct gpupool_stats st;
        gpupool_client *c;
        struct testd d;
        json_t *status;
        void *p;

        testd_start(&d, NULL);
        unsetenv("GPUPOOL_SOCKET");
        ck_assert_int_eq(gpupool_connect(d.sock, "own-handle", &c), 0);
        p = gpupool_cupy_malloc(c, 100 * KiB, 0);
        ck_assert_ptr_nonnull(p);
        ck_assert_int_eq(gpupool_stats(c, &st), 0);
        ck_assert_uint_eq(st.live_blocks, 1);
        ck_assert_uint_eq(st.live_bytes, 100 * KiB);
        status = testd_ctl(&d, "status");
        ck_assert_uint_eq(json_array_size(json_object_get(status, "clients")), 1);      /* no shared handle made */
        json_decref(status);
        gpupool_cupy_free(c, p, 0);
        ck_assert_int_eq(gpupool_hook_last_error(NULL, 0), 0);
        ck_assert_int_eq(gpupool_stats(c, &st), 0);
        ck_assert_uint_eq(st.live_blocks, 0);
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

START_TEST(test_stats_counts) {
        struct gpupool_grow_stats gs;
        struct gpupool_stats st;
        gpupool_client *c, *h;
        struct testd d;
        void *p[3];

        testd_start(&d, NULL);
        ck_assert_int_eq(gpupool_connect(d.sock, "counted", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 1000, &p[0]), 0);         /* rounded to 1024 */
        ck_assert_int_eq(gpupool_alloc(c, 0, 64 * KiB, &p[1]), 0);     /* beside it, in its 2 MiB segment */
        ck_assert_int_eq(gpupool_alloc(c, 0, 3 * MiB, &p[2]), 0);      /* a 20 MiB segment of its own class */
        ck_assert_int_eq(gpupool_stats(c, &st), 0);
        ck_assert_uint_eq(st.live_blocks, 3);
        ck_assert_uint_eq(st.live_bytes, 1024 + 64 * KiB + 3 * MiB);
        ck_assert_uint_eq(st.mapped_segments, 2);
        ck_assert_uint_eq(st.mapped_bytes, 2 * MiB + 20 * MiB);
        ck_assert_uint_eq(st.cached_bytes, st.mapped_bytes - st.live_bytes);   /* the rest is the pool's, free */
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), (long long) st.mapped_bytes);
        /* The hello and two leases asked the daemon; two segments were mapped. */
        ck_assert_uint_eq(st.round_trips, 3);
        ck_assert_uint_eq(st.segments_imported, 2);
        ck_assert_int_eq(gpupool_free(c, p[1]), 0);
        ck_assert_int_eq(gpupool_stats(c, &st), 0);
        ck_assert_uint_eq(st.live_blocks, 2);
        ck_assert_uint_eq(st.cached_bytes, st.mapped_bytes - 1024 - 3 * MiB);
        ck_assert_uint_eq(st.round_trips, 3);            /* the free stayed in the process */
        /* Trimmed, the segments that hold nothing go back; those with live blocks stay. */
        ck_assert_int_eq(gpupool_free(c, p[2]), 0);
        ck_assert_int_eq(gpupool_trim(c), 0);
        ck_assert_int_eq(gpupool_stats(c, &st), 0);
        ck_assert_uint_eq(st.mapped_bytes, 2 * MiB);
        ck_assert_uint_eq(st.cached_bytes, 2 * MiB - 1024);
        ck_assert_int_eq(gpupool_free(c, p[0]), 0);
        ck_assert_int_eq(gpupool_trim(c), 0);
        ck_assert_uint_eq(gpupool_cached_bytes(c), 0);
        ck_assert_int_eq(gpupool_stats(NULL, &st), -EINVAL);
        ck_assert_int_eq(gpupool_stats(c, NULL), -EINVAL);
        ck_assert_int_eq(gpupool_grow_stats(NULL, &gs), -EINVAL);
        ck_assert_int_eq(gpupool_grow_stats(c, NULL), -EINVAL);
        gpupool_disconnect(c);
        /* The hooks' handle is a handle like any other. */
        setenv("GPUPOOL_SOCKET", d.sock, 1);
        ck_assert_int_eq(gpupool_hook_client(&h), 0);
        ck_assert_int_eq(gpupool_hook_client(&c), 0);
        ck_assert_ptr_eq(h, c);
        ck_assert_ptr_nonnull(gpupool_torch_alloc(5000, 0, NULL));
        ck_assert_int_eq(gpupool_stats(h, &st), 0);
        ck_assert_uint_eq(st.live_bytes, 5120);
        ck_assert_int_eq(gpupool_hook_client(NULL), -EINVAL);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* A forked child must not use its parent's connection: it gets one of its own. */
START_TEST(test_hooks_forked_child_connects_anew) {
        struct testd d;
        json_t *st;
        pid_t pid;
        int up[2], down[2], status;
        char go;

        testd_start(&d, NULL);
        setenv("GPUPOOL_SOCKET", d.sock, 1);
        ck_assert_ptr_nonnull(gpupool_torch_alloc(1 * MiB, 0, NULL));
        ck_assert_int_eq(pipe(up), 0);
        ck_assert_int_eq(pipe(down), 0);
        pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                void *p = gpupool_torch_alloc(2 * MiB, 0, NULL);

                if (!p)
                        _exit(1);
                memset(p, 1, 2 * MiB);
                if (write(up[1], "x", 1) != 1 || read(down[0], &go, 1) != 1)
                        _exit(2);
                _exit(0);
        }
        ck_assert_int_eq(read(up[0], &go, 1), 1);
        st = testd_ctl(&d, "status");
        ck_assert_ptr_nonnull(status_client_by_pid(st, getpid()));
        ck_assert_ptr_nonnull(status_client_by_pid(st, pid));
        json_decref(st);
        ck_assert(testd_client_becomes(&d, pid, NULL, "in_use_bytes", 2 * MiB));
        ck_assert(testd_client_becomes(&d, getpid(), NULL, "in_use_bytes", 1 * MiB));
        ck_assert_int_eq(write(down[1], "x", 1), 1);
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_int_eq(WEXITSTATUS(status), 0);
        /* The parent's handle is unharmed. */
        ck_assert_ptr_nonnull(gpupool_torch_alloc(1 * MiB, 0, NULL));
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* A C++ caller (as PyTorch is) catches a refusal as std::runtime_error with gpupool's reason. */
START_TEST(test_hooks_torch_throw_from_cxx) {
        char cmd[512], out[4096];
        struct testd d;

        testd_start(&d, "--client-limit", "8M", NULL);
        snprintf(cmd, sizeof(cmd), "GPUPOOL_SOCKET=%s %s/tests/hooks_throw 2>&1", d.sock, build_dir());
        ck_assert_msg(run_capture(cmd, out, sizeof(out)) == 0, "%s", out);
        ck_assert_msg(strstr(out, "caught: CUDA out of memory. gpupool refused allocating 12.0 MiB (12582912 bytes) on "
                                  "device 0: over a gpupool limit: ") &&
                      strstr(out, "over its limit of 8.0 MiB"), "%s", out);
        ck_assert_msg(strstr(out, "after the throw: allocated"), "%s", out);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

Suite *suite_hooks(void) {
        Suite *s = suite_create("hooks");
        TCase *tc = tcase_create("hooks");

        tcase_add_test(tc, test_hooks_connect_lazily_by_environment);
        tcase_add_test(tc, test_hooks_refusal_reason_per_thread);
        tcase_add_test(tc, test_hooks_retry_after_failed_connect);
        tcase_add_test(tc, test_hooks_bad_client_name);
        tcase_add_test(tc, test_hooks_cupy_with_own_handle);
        tcase_add_test(tc, test_stats_counts);
        tcase_add_test(tc, test_hooks_forked_child_connects_anew);
        tcase_add_test(tc, test_hooks_torch_throw_from_cxx);
        tcase_set_timeout(tc, 60);
        suite_add_tcase(s, tc);
        return s;
}
