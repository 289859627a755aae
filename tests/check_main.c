/*
 * check_main.c: runs every suite in one runner, so that "make test" ends with one Check
 * summary line. CK_RUN_SUITE=name runs one suite.
 */
#include <stdlib.h>

#include "suites.h"

int main(void) {
        SRunner *sr;
        int failed;

        sr = srunner_create(suite_rbtree());

        srunner_add_suite(sr, suite_size());
        srunner_add_suite(sr, suite_wire());
        srunner_add_suite(sr, suite_options());
        srunner_add_suite(sr, suite_config());
        srunner_add_suite(sr, suite_heap());
        srunner_add_suite(sr, suite_granule());
        srunner_add_suite(sr, suite_pool());
        srunner_add_suite(sr, suite_identity());
        srunner_add_suite(sr, suite_daemon());
        srunner_add_suite(sr, suite_leases());
        srunner_add_suite(sr, suite_hostile());
        srunner_add_suite(sr, suite_hardening());
        srunner_add_suite(sr, suite_tenants());
        srunner_add_suite(sr, suite_process_pool());
        srunner_add_suite(sr, suite_grow());
        srunner_add_suite(sr, suite_survive());
        srunner_add_suite(sr, suite_adopt());
        srunner_add_suite(sr, suite_peers());
        srunner_add_suite(sr, suite_pods());
        srunner_add_suite(sr, suite_replies());
        srunner_add_suite(sr, suite_scopes());
        srunner_add_suite(sr, suite_metrics());
        srunner_add_suite(sr, suite_hooks());
        srunner_add_suite(sr, suite_cuda_fake());
        srunner_run_all(sr, CK_NORMAL);
        failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
