/* check_options.c: gpupoold's command line: defaults, every option, every refusal. */
#include <errno.h>
#include <stdarg.h>
#include <string.h>

#include "options.h"
#include "suites.h"

static int parse(struct options *o, char *err, ...) {
        char *argv[16] = { "gpupoold" };
        int argc = 1;
        va_list ap;

        va_start(ap, err);
        for (char *a; (a = va_arg(ap, char *));)
                argv[argc++] = a;
        va_end(ap);
        err[0] = '\0';
        return options_parse(argc, argv, o, err, 256);
}

START_TEST(test_defaults) {
        struct options o;
        char err[256];

        ck_assert_int_eq(parse(&o, err, NULL), 0);
        ck_assert_str_eq(o.socket_path, "/run/gpupool/gpupool.sock");
        ck_assert_int_eq(o.backend, BACKEND_AUTO);
        ck_assert_uint_eq(o.host_capacity_bytes, 1ULL << 30);
        ck_assert_uint_eq(o.client_limit_bytes, 0);
        ck_assert_uint_eq(o.headroom_bytes, 512ULL << 20);
        ck_assert_uint_eq(o.max_clients, 1024);
        ck_assert_int_eq(o.action, OPTIONS_RUN);
        ck_assert(!o.check_invariants);
}
END_TEST

START_TEST(test_all_options) {
        struct options o;
        char err[256];

        ck_assert_int_eq(parse(&o, err, "--socket", "/tmp/s", "--backend", "host", "--host-capacity", "1.5GiB",
                               "--client-limit", "512M", "--log-level", "debug", "--max-clients", "7",
                               "--max-blocks", "9", "--check-invariants", NULL), 0);
        ck_assert_str_eq(o.socket_path, "/tmp/s");
        ck_assert_int_eq(o.backend, BACKEND_HOST);
        ck_assert_uint_eq(o.host_capacity_bytes, 3ULL << 29);
        ck_assert_uint_eq(o.client_limit_bytes, 512ULL << 20);
        ck_assert_int_eq(o.log_level, LOG_LEVEL_DEBUG);
        ck_assert_uint_eq(o.max_clients, 7);
        ck_assert_uint_eq(o.max_blocks, 9);
        ck_assert(o.check_invariants);
        ck_assert_int_eq(parse(&o, err, "--socket=/tmp/t", "--backend=cuda", "--headroom", "2G", NULL), 0);
        ck_assert_str_eq(o.socket_path, "/tmp/t");
        ck_assert_int_eq(o.backend, BACKEND_CUDA);
        ck_assert_uint_eq(o.headroom_bytes, 2ULL << 30);
        ck_assert_int_eq(parse(&o, err, "--headroom", "0", NULL), 0);
        ck_assert_uint_eq(o.headroom_bytes, 0);
        ck_assert_int_eq(parse(&o, err, "--help", NULL), 0);
        ck_assert_int_eq(o.action, OPTIONS_HELP);
        ck_assert_int_eq(parse(&o, err, "--version", NULL), 0);
        ck_assert_int_eq(o.action, OPTIONS_VERSION);
}
END_TEST

START_TEST(test_refusals) {
        static const struct {
                const char *args[3];
                const char *must_mention;
        } cases[] = {
                { { "--host-capacity", "lots" }, "--host-capacity" },
                { { "--host-capacity", "1M" }, "--host-capacity" },
                { { "--headroom", "a little" }, "--headroom: 'a little' is not a size" },
                { { "--headroom", "-1G" }, "--headroom" },
                { { "--host-capacity", "99999999999999999999" }, "too large" },
                { { "--client-limit", "4Q" }, "--client-limit" },
                { { "--backend", "opencl" }, "--backend" },
                { { "--log-level", "loud" }, "--log-level" },
                { { "--max-clients", "0" }, "--max-clients" },
                { { "--max-clients", "1025" }, "--max-clients" },
                { { "--max-clients", "-3" }, "--max-clients" },
                { { "--max-blocks", "x" }, "--max-blocks" },
                { { "--socket", "" }, "--socket" },
                { { "--frobnicate" }, "--frobnicate" },
                { { "-x" }, "-x" },
                { { "stray" }, "stray" },
                { { "--socket" }, "--socket" },
        };
        struct options o = { .max_clients = 5 };
        char err[256];

        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                ck_assert_int_eq(parse(&o, err, cases[i].args[0], cases[i].args[1], NULL), -EINVAL);
                ck_assert_msg(strstr(err, cases[i].must_mention), "case %zu: '%s' does not mention '%s'", i, err,
                              cases[i].must_mention);
        }
        ck_assert_uint_eq(o.max_clients, 5);    /* untouched on failure */
}
END_TEST

Suite *suite_options(void) {
        Suite *s = suite_create("options");
        TCase *tc = tcase_create("core");

        tcase_add_test(tc, test_defaults);
        tcase_add_test(tc, test_all_options);
        tcase_add_test(tc, test_refusals);
        suite_add_tcase(s, tc);
        return s;
}
