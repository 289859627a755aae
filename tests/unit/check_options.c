/* check_options.c: gpupoold's command line: defaults, every option, every refusal. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
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
        ck_assert_uint_eq(o.headroom_bytes, 1ULL << 30);
        ck_assert_uint_eq(o.max_clients, 1024);
        ck_assert_int_eq(o.action, OPTIONS_RUN);
        ck_assert(!o.check_invariants);
        ck_assert(o.export_keepalive);
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
        ck_assert(o.obsolete_max_blocks);      /* accepted, ignored (a warning at start) */
        ck_assert(o.check_invariants);
        ck_assert_int_eq(parse(&o, err, "--socket=/tmp/t", "--backend=cuda", "--headroom", "2G", NULL), 0);
        ck_assert_str_eq(o.socket_path, "/tmp/t");
        ck_assert_int_eq(o.backend, BACKEND_CUDA);
        ck_assert_uint_eq(o.headroom_bytes, 2ULL << 30);
        ck_assert_int_eq(parse(&o, err, "--headroom", "0", NULL), 0);
        ck_assert_uint_eq(o.headroom_bytes, 0);
        ck_assert_uint_eq(o.granule_stock, 0);
        ck_assert_int_eq(parse(&o, err, "--granule-stock", "128", NULL), 0);
        ck_assert_uint_eq(o.granule_stock, 128);
        /* A yes-or-no option alone is yes; =no turns one off whose default is yes. */
        ck_assert_int_eq(parse(&o, err, "--export-keepalive=no", "--check-invariants=yes", NULL), 0);
        ck_assert(!o.export_keepalive);
        ck_assert(o.check_invariants);
        ck_assert_int_eq(parse(&o, err, "--export-keepalive", NULL), 0);
        ck_assert(o.export_keepalive);
        ck_assert_int_eq(parse(&o, err, "--export-keepalive=maybe", NULL), -EINVAL);
        ck_assert_msg(strstr(err, "--export-keepalive: 'maybe' is not yes or no"), "%s", err);
        ck_assert_int_eq(parse(&o, err, "--help", NULL), 0);
        ck_assert_int_eq(o.action, OPTIONS_HELP);
        ck_assert_int_eq(parse(&o, err, "-h", NULL), 0);
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
                { { "--granule-stock", "4097" }, "--granule-stock: '4097' is not a number from 0 to 4096" },
                { { "--granule-stock", "some" }, "--granule-stock" },
                { { "--max-blocks", "x" }, "--max-blocks" },
                { { "--socket", "" }, "--socket" },
                { { "--frobnicate" }, "--frobnicate" },
                { { "-x" }, "-x" },
                { { "stray" }, "stray" },
                { { "--socket" }, "--socket" },
                { { "--metrics-listen", "127.0.0.1" }, "--metrics-listen: '127.0.0.1' is not an address" },
                { { "--metrics-listen", "example.org:80" }, "--metrics-listen" },
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

/* metrics_listen: loopback for a port alone, literal addresses only, and a clear no to anything else. */
START_TEST(test_metrics_listen) {
        static const char *const bad[] = {
                "127.0.0.1", "127.0.0.1:", ":9464", "127.0.0.1:65536", "127.0.0.1:-1", "127.0.0.1:94x", "example.org:80",
                "[::1]", "::1:9464", "[::1:9464", "[]:9464", "256.0.0.1:9464", "9464 ", " 9464", "on",
        };
        struct sockaddr_storage a = { .ss_family = AF_INET6 };
        const struct sockaddr_in *in = (const struct sockaddr_in *) &a;
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *) &a;
        struct options o;
        char err[256];

        ck_assert_int_eq(parse(&o, err, NULL), 0);
        ck_assert_int_eq(o.metrics_addr.ss_family, AF_UNSPEC);         /* off unless asked */
        ck_assert_int_eq(options_parse_listen("127.0.0.1:9464", &a), 0);
        ck_assert_int_eq(a.ss_family, AF_INET);
        ck_assert_uint_eq(ntohs(in->sin_port), 9464);
        ck_assert_uint_eq(ntohl(in->sin_addr.s_addr), INADDR_LOOPBACK);
        ck_assert_int_eq(options_parse_listen("9100", &a), 0);          /* a port alone: loopback */
        ck_assert_uint_eq(ntohl(in->sin_addr.s_addr), INADDR_LOOPBACK);
        ck_assert_uint_eq(ntohs(in->sin_port), 9100);
        ck_assert_int_eq(options_parse_listen("localhost:0", &a), 0);
        ck_assert_uint_eq(ntohl(in->sin_addr.s_addr), INADDR_LOOPBACK);
        ck_assert_int_eq(options_parse_listen("0.0.0.0:9464", &a), 0);  /* any address, when said so */
        ck_assert_uint_eq(in->sin_addr.s_addr, 0);
        ck_assert_int_eq(options_parse_listen("[::1]:9464", &a), 0);
        ck_assert_int_eq(a.ss_family, AF_INET6);
        ck_assert_uint_eq(ntohs(in6->sin6_port), 9464);
        ck_assert(IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr));
        ck_assert_int_eq(options_parse_listen("off", &a), 0);
        ck_assert_int_eq(a.ss_family, AF_UNSPEC);
        ck_assert_int_eq(options_parse_listen("", &a), 0);
        ck_assert_int_eq(a.ss_family, AF_UNSPEC);
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                a.ss_family = AF_INET6;
                ck_assert_msg(options_parse_listen(bad[i], &a) == -EINVAL, "'%s' accepted", bad[i]);
                ck_assert_int_eq(a.ss_family, AF_INET6);                /* untouched */
        }
        ck_assert_int_eq(parse(&o, err, "--metrics-listen", "[::1]:1", NULL), 0);
        ck_assert_int_eq(o.metrics_addr.ss_family, AF_INET6);
}
END_TEST

Suite *suite_options(void) {
        Suite *s = suite_create("options");
        TCase *tc = tcase_create("core");

        tcase_add_test(tc, test_defaults);
        tcase_add_test(tc, test_all_options);
        tcase_add_test(tc, test_refusals);
        tcase_add_test(tc, test_metrics_listen);
        suite_add_tcase(s, tc);
        return s;
}
