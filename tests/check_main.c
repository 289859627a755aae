/*
 * check_main.c: runs every suite in one runner, so that "make test" ends with one Check
 * summary line, after the count of tests skipped (TEST_SKIP(): not root, say) and why.
 * CK_RUN_SUITE=name runs one suite; an unknown name is an error that lists them. The build the
 * integration suites run (gpupoold, gpupoolctl, the fake driver) is $GPUPOOL_BUILD_DIR, else
 * the build directory this binary sits in (BUILD/tests/check_gpupool), from any directory.
 * The tests make their files in directories of the run's own (testlib.h: test_tmp()), which
 * the runner removes after the last suite: a test that fails, or is killed at its timeout
 * (Check ends its process group), leaves nothing behind.
 */
#define _GNU_SOURCE
#include <ftw.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "suites.h"
#include "testlib.h"

/* Every suite and its name (as suite_create() names it, and CK_RUN_SUITE picks it). */
#define SUITE(x) { #x, suite_##x }
static const struct {
        const char *name;
        Suite *(*make)(void);
} suites[] = {
        SUITE(rbtree), SUITE(size), SUITE(wire), SUITE(options), SUITE(config), SUITE(policy), SUITE(reservations), SUITE(heap),
        SUITE(granule), SUITE(pool), SUITE(identity), SUITE(users), SUITE(daemon), SUITE(leases), SUITE(hostile), SUITE(hardening),
        SUITE(tenants), SUITE(process_pool), SUITE(grow), SUITE(survive), SUITE(adopt), SUITE(peers), SUITE(subuids), SUITE(pods), SUITE(reserve),
        SUITE(replies), SUITE(objects), SUITE(scopes), SUITE(metrics), SUITE(hooks), { "cuda-fake", suite_cuda_fake },
};

/* Sets $GPUPOOL_BUILD_DIR (for build_dir() and what the tests start) when unset, from this binary's path; 0, or -1 saying why. */
static int find_build(void) {
        const char *b = getenv("GPUPOOL_BUILD_DIR");
        char exe[PATH_MAX], daemon[PATH_MAX + 16];
        ssize_t n;

        if (!b || !*b) {
                n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
                if (n < 0) {
                        perror("check_gpupool: /proc/self/exe");
                        return -1;
                }
                exe[n] = '\0';
                b = dirname(dirname(exe));      /* BUILD/tests/check_gpupool: BUILD */
                setenv("GPUPOOL_BUILD_DIR", b, 1);
                b = getenv("GPUPOOL_BUILD_DIR");
        }
        snprintf(daemon, sizeof(daemon), "%s/gpupoold", b);
        if (access(daemon, X_OK) < 0) {
                fprintf(stderr, "check_gpupool: no gpupoold in the build directory %s: build it (make; make test builds "
                        "what the suites need), or set GPUPOOL_BUILD_DIR to the build that has it\n", b);
                return -1;
        }
        return 0;
}

static char run_tmp[64], run_shm[64];    /* under $TMPDIR (under 32 bytes; else /tmp) and /dev/shm */

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
        (void) st, (void) flag, (void) ftw;
        if (remove(path) < 0)
                fprintf(stderr, "check_gpupool: cannot remove %s: %m\n", path);
        return 0;
}

/* Makes the run's directory from template into dir, open to the uids the tests switch to, and names it in env. */
static void run_dir(char *dir, size_t size, const char *template, const char *env) {
        snprintf(dir, size, "%s", template);
        if (!mkdtemp(dir) || chmod(dir, 0755) < 0) {
                dir[0] = '\0';
                return;
        }
        setenv(env, dir, 1);
}

static void run_dirs_remove(void) {
        if (run_tmp[0])
                nftw(run_tmp, remove_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
        if (run_shm[0])
                nftw(run_shm, remove_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

int main(void) {
        const char *only = getenv("CK_RUN_SUITE");
        SRunner *sr = NULL;
        size_t known = 0;
        int failed;

        if (only) {
                for (size_t i = 0; i < sizeof(suites) / sizeof(suites[0]); i++)
                        known += strcmp(only, suites[i].name) == 0;
                if (!known) {
                        fprintf(stderr, "check_gpupool: no suite named '%s' (CK_RUN_SUITE); the suites:", only);
                        for (size_t i = 0; i < sizeof(suites) / sizeof(suites[0]); i++)
                                fprintf(stderr, " %s", suites[i].name);
                        fprintf(stderr, "\n");
                        return 2;
                }
        }
        if (find_build() < 0)
                return 2;
        {
                const char *t = getenv("TMPDIR");
                char template[sizeof(run_tmp)];

                snprintf(template, sizeof(template), "%s/gpupool-run-XXXXXX", t && *t && strlen(t) < 32 ? t : "/tmp");
                run_dir(run_tmp, sizeof(run_tmp), template, "GPUPOOL_TEST_TMP");
                if (!run_tmp[0]) {
                        fprintf(stderr, "check_gpupool: cannot make %s: %m\n", template);
                        return 2;
                }
        }
        if (access("/dev/shm", W_OK) == 0)
                run_dir(run_shm, sizeof(run_shm), "/dev/shm/gpupool-run-XXXXXX", "GPUPOOL_TEST_SHM");

        for (size_t i = 0; i < sizeof(suites) / sizeof(suites[0]); i++) {
                Suite *s = suites[i].make();

                if (!sr)
                        sr = srunner_create(s);
                else
                        srunner_add_suite(sr, s);
        }
        skips_begin();
        /* Suite by suite, each named as it starts; the skipped tests, then the summary as the last line. */
        printf("Running suite(s):");
        for (size_t i = 0; i < sizeof(suites) / sizeof(suites[0]); i++)
                if (!only || strcmp(only, suites[i].name) == 0) {
                        printf(" %s", suites[i].name);
                        fflush(stdout);
                        srunner_run(sr, suites[i].name, NULL, CK_SILENT);
                }
        printf("\n");
        fflush(stderr);
        (void) skips_report();
        srunner_print(sr, CK_NORMAL);
        failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        run_dirs_remove();
        return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
