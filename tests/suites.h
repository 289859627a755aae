/* suites.h: every Check suite of the project, run together by check_main.c. */
#ifndef GP_SUITES_H
#define GP_SUITES_H

#include <check.h>

Suite *suite_rbtree(void);
Suite *suite_size(void);
Suite *suite_wire(void);
Suite *suite_options(void);
Suite *suite_config(void);
Suite *suite_policy(void);
Suite *suite_reservations(void);
Suite *suite_objects(void);
Suite *suite_heap(void);
Suite *suite_granule(void);
Suite *suite_pool(void);
Suite *suite_identity(void);
Suite *suite_users(void);
Suite *suite_subuids(void);
Suite *suite_daemon(void);
Suite *suite_leases(void);
Suite *suite_hostile(void);
Suite *suite_hardening(void);
Suite *suite_tenants(void);
Suite *suite_process_pool(void);
Suite *suite_grow(void);
Suite *suite_survive(void);
Suite *suite_adopt(void);
Suite *suite_peers(void);
Suite *suite_pods(void);
Suite *suite_reserve(void);
Suite *suite_replies(void);
Suite *suite_scopes(void);
Suite *suite_metrics(void);
Suite *suite_hooks(void);
Suite *suite_cuda_fake(void);
Suite *suite_cuda_gpu(void);

#endif
