/*
 * check_main.c: runs every suite in one runner, so that "make test" ends with one Check
 * summary line, after the count of tests skipped (TEST_SKIP(): not root, say) and why.
 * CK_RUN_SUITE=name runs one suite.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int main(void) {
        const char *only = getenv("CK_RUN_SUITE");
        SRunner *sr = NULL;
        int failed;

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
