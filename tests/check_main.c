/*
 * check_main.c: runs every suite in one runner, so that "make test" ends with one Check
 * summary line, after the count of tests skipped (TEST_SKIP(): not root, say) and why.
 * CK_RUN_SUITE=name runs one suite; an unknown name is an error that lists them. The build the
 * integration suites run (gpupoold, gpupoolctl, the fake driver) is $GPUPOOL_BUILD_DIR, else
 * the build directory this binary sits in (BUILD/tests/check_gpupool), from any directory.
 */
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "suites.h"
#include "testlib.h"

/* Every suite and its name (as suite_create() names it, and CK_RUN_SUITE picks it). */
#define SUITE(x) { #x, suite_##x }
static const struct {
        const char *name;
        Suite *(*make)(void);
} suites[] = {
        SUITE(rbtree), SUITE(size), SUITE(wire), SUITE(options), SUITE(config), SUITE(policy), SUITE(heap),
        SUITE(granule), SUITE(pool), SUITE(identity), SUITE(daemon), SUITE(leases), SUITE(hostile), SUITE(hardening),
        SUITE(tenants), SUITE(process_pool), SUITE(grow), SUITE(survive), SUITE(adopt), SUITE(peers), SUITE(pods),
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
        return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
