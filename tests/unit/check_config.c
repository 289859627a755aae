/*
 * check_config.c: the config file (daemon/config.c): every key, drop-ins, the command line over
 * the file, every refusal with its file:line, and tenant matching. What the limits decide is
 * check_policy.c's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "suites.h"
#include "testlib.h"

#define MiB (1ULL << 20)
#define GiB (1ULL << 30)

static char dir[96], path[128];

static void setup(void) {
        test_mkdtemp(dir, sizeof(dir), "config");
        snprintf(path, sizeof(path), "%s/gpupoold.conf", dir);
}

static void teardown(void) {
        char cmd[160];

        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        ck_assert_int_eq(system(cmd), 0);
}

static void write_file(const char *file, const char *text) {
        FILE *f = fopen(file, "w");

        ck_assert_ptr_nonnull(f);
        fputs(text, f);
        fclose(f);
}

static struct config conf;

START_TEST(test_every_key) {
        char err[600] = "";

        write_file(path, "# every key\n"
                         "[daemon]\nsocket = /tmp/x.sock\nbackend = host\nhost_capacity = 2G\nlog_level = debug\n"
                         "max_clients = 7\ncheck_invariants = yes\nmetrics_listen = 127.0.0.1:9464\n"
                         "[pool]\nheadroom = 1G\nidle_release = 30s\nmax_cached = 10%\nreclaim_timeout = 250ms\n"
                         "[limits]\nclient_max = 8G ; inline comment\nmax_blocks = 99\n"
                         "[tenant:training]\nmatch_uid = 1000\nmatch_gid = 0\nmatch_name = train-*\nmax = 40G\n"
                         "guarantee = 10G\nclient_max = 4G\n"
                         "[tenant:one-gpu]\nmatch_name = serve-*\ndevice = 1\nguarantee = 2G\n"
                         "[tenant:default]\nmax = 20G\n");
        ck_assert_msg(config_load(path, true, &conf, err, sizeof(err)) == 0, "%s", err);
        ck_assert_str_eq(conf.options.socket_path, "/tmp/x.sock");
        ck_assert_int_eq(conf.options.backend, BACKEND_HOST);
        ck_assert_uint_eq(conf.options.host_capacity_bytes, 2 * GiB);
        ck_assert_int_eq(conf.options.log_level, LOG_LEVEL_DEBUG);
        ck_assert_uint_eq(conf.options.max_clients, 7);
        ck_assert(conf.options.check_invariants);
        ck_assert_int_eq(conf.options.metrics_addr.ss_family, AF_INET);
        ck_assert_uint_eq(conf.options.headroom_bytes, 1 * GiB);
        ck_assert_uint_eq(conf.options.idle_release_ms, 30000);
        ck_assert_uint_eq(conf.options.max_cached_percent, 10);
        ck_assert_uint_eq(conf.options.reclaim_timeout_ms, 250);
        ck_assert_uint_eq(conf.options.client_limit_bytes, 8 * GiB);
        /* Obsolete: accepted, and warned about. */
        ck_assert(conf.options.obsolete_max_blocks);
        {
                char warnings[1024];

                ck_assert_uint_eq(config_warnings(&conf, warnings, sizeof(warnings)), 1);
                ck_assert_msg(strstr(warnings, "max_blocks (--max-blocks) is obsolete and ignored"), "%s", warnings);
        }
        ck_assert_uint_eq(conf.tenant_count, 3);
        ck_assert(!conf.tenants[1].device_set);
        ck_assert_str_eq(conf.tenants[2].name, "one-gpu");
        ck_assert(conf.tenants[2].device_set && conf.tenants[2].device == 1);
        ck_assert_str_eq(conf.tenants[0].name, "default");
        ck_assert_uint_eq(conf.tenants[0].max_bytes, 20 * GiB);
        ck_assert_str_eq(conf.tenants[1].name, "training");
        ck_assert(conf.tenants[1].match_uid_set && conf.tenants[1].match_uid == 1000);
        ck_assert(conf.tenants[1].match_gid_set && conf.tenants[1].match_gid == 0);
        ck_assert_str_eq(conf.tenants[1].match_name, "train-*");
        ck_assert_uint_eq(conf.tenants[1].max_bytes, 40 * GiB);
        ck_assert_uint_eq(conf.tenants[1].guarantee_bytes, 10 * GiB);
        ck_assert(conf.tenants[1].client_max_set && conf.tenants[1].client_max_bytes == 4 * GiB);
        ck_assert_uint_eq(conf.file_count, 1);
}
END_TEST

START_TEST(test_dropins_and_command_line) {
        char err[600] = "", dropins[160], file[200];
        char *argv[] = { "gpupoold", "--client-limit", "1G", NULL };
        struct options o;

        write_file(path, "[limits]\nclient_max = 8G\n[pool]\nreclaim_timeout = 5ms\n[tenant:a]\nmatch_uid = 1\nmax = 1G\n");
        snprintf(dropins, sizeof(dropins), "%s.d", path);
        ck_assert_int_eq(mkdir(dropins, 0755), 0);
        /* Name order: 10- before 20-, whatever order they were written in; other names are ignored. */
        snprintf(file, sizeof(file), "%s/20-late.conf", dropins);
        write_file(file, "[pool]\nreclaim_timeout = 20ms\n");
        snprintf(file, sizeof(file), "%s/10-early.conf", dropins);
        write_file(file, "[pool]\nreclaim_timeout = 10ms\n[tenant:a]\nmax = 2G\n[tenant:b]\nmatch_uid = 2\n");
        snprintf(file, sizeof(file), "%s/30-off.conf.disabled", dropins);
        write_file(file, "[pool]\nreclaim_timeout = 30ms\n");
        ck_assert_msg(config_load(path, true, &conf, err, sizeof(err)) == 0, "%s", err);
        ck_assert_uint_eq(conf.file_count, 3);
        ck_assert_uint_eq(conf.options.reclaim_timeout_ms, 20);
        ck_assert_uint_eq(conf.tenant_count, 3);
        ck_assert_uint_eq(conf.tenants[1].max_bytes, 2 * GiB);
        /* The command line wins over the files. */
        ck_assert_int_eq(options_parse_over(3, argv, &conf.options, &o, err, sizeof(err)), 0);
        ck_assert_uint_eq(o.client_limit_bytes, 1 * GiB);
        ck_assert_uint_eq(o.reclaim_timeout_ms, 20);
}
END_TEST

START_TEST(test_missing_files) {
        char err[600] = "";

        /* The default file may be absent; a file named with --config may not. */
        ck_assert_int_eq(config_load(path, false, &conf, err, sizeof(err)), 0);
        ck_assert_uint_eq(conf.file_count, 0);
        ck_assert_uint_eq(conf.tenant_count, 1);
        ck_assert_uint_eq(conf.options.idle_release_ms, 5 * 60 * 1000);
        ck_assert_int_eq(config_load(path, true, &conf, err, sizeof(err)), -ENOENT);
        ck_assert_msg(strstr(err, "gpupoold.conf: No such file"), "%s", err);
}
END_TEST

START_TEST(test_refusals_name_file_and_line) {
        static const struct {
                const char *text;
                const char *must_say;
        } cases[] = {
                { "[daemon]\nsocket = /s\n[nonsense]\nx = 1\n", ":4: unknown section [nonsense]" },
                { "[pool]\nidle_release = 5min\nidel_release = 1s\n", ":3: unknown key 'idel_release' in [pool]" },
                { "[daemon]\nhost_capacity = lots\n", ":2: host_capacity: 'lots' is not a size" },
                { "[daemon]\nhost_capacity = 1M\n", ":2: host_capacity: '1M' is less than one 2 MiB segment" },
                { "[pool]\nidle_release = 5\n", ":2: idle_release: '5' is not a duration" },
                { "[pool]\nmax_cached = 120%\n", ":2: max_cached: '120%' is not a percentage" },
                { "[pool]\nmax_cached = lots\n", ":2: max_cached: 'lots' is neither a size nor a percentage" },
                { "[daemon]\nbackend = opencl\n", ":2: backend: unknown backend 'opencl'" },
                { "[daemon]\ncheck_invariants = maybe\n", ":2: check_invariants: 'maybe' is not yes or no" },
                { "[daemon]\nmax_clients = 0\n", ":2: max_clients: '0' is not a number from 1 to 1024" },
                { "[daemon]\nmetrics_listen = 0.0.0.0\n", ":2: metrics_listen: '0.0.0.0' is not an address to listen on" },
                { "socket = /s\n", ":1: 'socket' is outside any section" },
                { "[pool]\nidle_release = 5min\n  max_cached = 25%\n", ":3: an indented line continues the previous value" },
                { "[pool\n", ":1: '[pool' is not a section header: it has no ']'" },
                { "[limits\nclient_max = 1G\n", ":1: '[limits' is not a section header: it has no ']'" },
                { "[daemon]\nthis line has no equals sign\n", ":2: not a [section] or a key = value line" },
                { "[tenant:a]\nmax = 1G\n", ":2: [tenant:a] has no match_uid, match_gid, match_name or match_cgroup" },
                { "[tenant:a]\nmatch_cgroup = kubepods\n", ":2: match_cgroup: a glob over a cgroup v2 path, starting with / or *" },
                { "[tenant:a]\nmatch_cgroup = /kubepods.slice/*\n[tenant:b]\nmatch_cgroup = /kubepods.slice/*\n",
                  ":4: [tenant:b] overlaps [tenant:a]" },
                { "[tenant:a b]\nmatch_uid = 1\n", ":2: [tenant:a b]: a tenant name is 1 to 63 letters" },
                { "[tenant:a]\nmatch_uid = nosuchuser-gpupool\n", ":2: match_uid: 'nosuchuser-gpupool' is not a user" },
                { "[tenant:a]\nmatch_gid = -1\n", ":2: match_gid: '-1' is not a group" },
                { "[tenant:a]\nmatch_name = x\nfavourite = 1\n", ":3: unknown key 'favourite' in [tenant:a]" },
                { "[tenant:a]\nmatch_name = x\nmax = big\n", ":3: max: 'big' is not a size" },
                { "[tenant:a]\nmatch_name = x\nmax = 1G\nguarantee = 2G\n",
                  ":4: guarantee = 2G: [tenant:a] guarantees more than its max" },
                { "[tenant:a]\nmatch_name = x\nguarantee = 2G\nmax = 1G\n", ":4: max = 1G: [tenant:a] guarantees more than its max" },
                { "[tenant:default]\nmatch_uid = 1\n", ":2: [tenant:default] takes no match rule" },
                { "[tenant:default]\ndevice = 0\n", ":2: [tenant:default] takes no device" },
                { "[tenant:a]\nmatch_name = x\ndevice = gpu0\n", ":3: device: 'gpu0' is not a device index (0 to 63)" },
                { "[tenant:a]\nmatch_name = x\ndevice = 64\n", ":3: device: '64' is not a device index (0 to 63)" },
                { "[tenant:a]\nmatch_name = x\ndevice = -1\n", ":3: device: '-1' is not a device index (0 to 63)" },
                { "[tenant:a]\nmatch_name = x\ndevice =\n", ":3: device: '' is not a device index (0 to 63)" },
                { "[tenant:a]\nmatch_uid = 1000\n[tenant:b]\nmatch_uid = 1000\nmatch_name = x*\n",
                  ":4: [tenant:b] overlaps [tenant:a]" },
                { "[tenant:a]\nmatch_name = job-*\n[tenant:b]\nmatch_name = job-*\n", ":4: [tenant:b] overlaps [tenant:a]" },
        };
        char err[600];

        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                char want[256];

                write_file(path, cases[i].text);
                err[0] = '\0';
                ck_assert_msg(config_load(path, true, &conf, err, sizeof(err)) < 0, "case %zu loaded", i);
                snprintf(want, sizeof(want), "gpupoold.conf%s", cases[i].must_say);
                ck_assert_msg(strstr(err, want), "case %zu: '%s' does not say '%s'", i, err, want);
        }
}
END_TEST

START_TEST(test_matching) {
        struct tenant_conf t = { .match_uid_set = true, .match_uid = 1000, .match_name_set = true };
        struct tenant_conf none = { 0 };

        strcpy(t.match_name, "train-*");
        ck_assert(tenant_conf_matches(&t, 1000, 5, "train-resnet", NULL));
        ck_assert(!tenant_conf_matches(&t, 1001, 5, "train-resnet", NULL));     /* every rule must hold */
        ck_assert(!tenant_conf_matches(&t, 1000, 5, "serve", NULL));
        ck_assert(!tenant_conf_matches(&none, 0, 0, "x", NULL));                /* no rule matches nobody */

        /* A cgroup glob: '*' crosses '/', both cgroup drivers' pod paths and systemd units; an unknown cgroup matches none. */
        struct tenant_conf pods = { .match_cgroup_set = true }, units = { .match_cgroup_set = true };

        strcpy(pods.match_cgroup, "/kubepods*pod0c1f2e3d?4b5a*");
        strcpy(units.match_cgroup, "/system.slice/inference@*.service");
        ck_assert(tenant_conf_matches(&pods, 0, 0, "x", "/kubepods.slice/kubepods-besteffort.slice/"
                                      "kubepods-besteffort-pod0c1f2e3d_4b5a_6978_8a9b_acbdcedf0f1e.slice/cri-containerd-1.scope"));
        ck_assert(tenant_conf_matches(&pods, 0, 0, "x", "/kubepods/besteffort/pod0c1f2e3d-4b5a-6978-8a9b-acbdcedf0f1e/1"));
        ck_assert(!tenant_conf_matches(&pods, 0, 0, "x", "/kubepods/besteffort/pod11111111-2222-3333-4444-555555555555/1"));
        ck_assert(!tenant_conf_matches(&pods, 0, 0, "x", NULL));
        ck_assert(tenant_conf_matches(&units, 0, 0, "x", "/system.slice/inference@7.service"));
        ck_assert(!tenant_conf_matches(&units, 0, 0, "x", "/system.slice/training.service"));
}
END_TEST

Suite *suite_config(void) {
        Suite *s = suite_create("config");
        TCase *tc = tcase_create("config");

        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_add_test(tc, test_every_key);
        tcase_add_test(tc, test_dropins_and_command_line);
        tcase_add_test(tc, test_missing_files);
        tcase_add_test(tc, test_refusals_name_file_and_line);
        tcase_add_test(tc, test_matching);
        suite_add_tcase(s, tc);
        return s;
}
