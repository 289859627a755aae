/* check_size.c: size parsing and printing. */
#include <errno.h>
#include <stdint.h>

#include "size.h"
#include "suites.h"

START_TEST(test_parse_good) {
        static const struct {
                const char *text;
                uint64_t bytes;
        } cases[] = {
                { "0", 0 }, { "1048576", 1048576 }, { "512M", 512ULL << 20 }, { "4G", 4ULL << 30 },
                { "1.5GiB", 3ULL << 29 }, { "1.5G", 3ULL << 29 }, { "2k", 2048 }, { "2KB", 2048 },
                { "2KiB", 2048 }, { "10B", 10 }, { "1T", 1ULL << 40 }, { "0.5K", 512 }, { ".5K", 512 },
                { "1.0001K", 1024 }, { "16383P", 16383ULL << 50 }, { "18446744073709551615", UINT64_MAX },
        };

        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                uint64_t v = 1;

                ck_assert_msg(gp_size_parse(cases[i].text, &v) == 0, "'%s' should parse", cases[i].text);
                ck_assert_msg(v == cases[i].bytes, "'%s' gave %llu", cases[i].text, (unsigned long long) v);
        }
}
END_TEST

START_TEST(test_parse_bad) {
        static const char *const bad[] = { "", "M", "-1", "1 G", " 1G", "1G ", "1X", "1GG", "1Gi", "1.2.3", "abc",
                                           "0x10", "1e9", "1,5G", "." };
        uint64_t v = 77;

        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
                ck_assert_msg(gp_size_parse(bad[i], &v) == -EINVAL, "'%s' should be refused", bad[i]);
        ck_assert_int_eq(gp_size_parse(NULL, &v), -EINVAL);
        ck_assert_int_eq(gp_size_parse("18446744073709551616", &v), -ERANGE);
        ck_assert_int_eq(gp_size_parse("16384P", &v), -ERANGE);
        ck_assert_uint_eq(v, 77);       /* untouched on failure */
}
END_TEST

START_TEST(test_format) {
        char buf[GP_SIZE_FORMAT_MAX];

        ck_assert_str_eq(gp_size_format(0, buf, sizeof(buf)), "0 B");
        ck_assert_str_eq(gp_size_format(1023, buf, sizeof(buf)), "1023 B");
        ck_assert_str_eq(gp_size_format(1024, buf, sizeof(buf)), "1.0 KiB");
        ck_assert_str_eq(gp_size_format(3ULL << 29, buf, sizeof(buf)), "1.5 GiB");
        ck_assert_str_eq(gp_size_format(UINT64_MAX, buf, sizeof(buf)), "16.0 EiB");
}
END_TEST

START_TEST(test_durations) {
        static const struct {
                const char *text;
                uint64_t ms;
        } good[] = {
                { "0", 0 }, { "100ms", 100 }, { "30s", 30000 }, { "5min", 300000 }, { "2h", 7200000 },
                { "1d", 86400000 }, { "0s", 0 },
        };
        static const char *const bad[] = { "", "30", "5m", "5 min", "-1s", "1.5s", "s", "10sec", "99999999999999999999d" };
        char buf[32];

        for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
                uint64_t v = 7;

                ck_assert_msg(gp_duration_parse(good[i].text, &v) == 0 && v == good[i].ms, "'%s'", good[i].text);
        }
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                uint64_t v = 7;

                ck_assert_msg(gp_duration_parse(bad[i], &v) < 0 && v == 7, "'%s' should not parse", bad[i]);
        }
        ck_assert_str_eq(gp_duration_format(300000, buf, sizeof(buf)), "5min");
        ck_assert_str_eq(gp_duration_format(1500, buf, sizeof(buf)), "1500ms");
        ck_assert_str_eq(gp_duration_format(0, buf, sizeof(buf)), "0");
}
END_TEST

Suite *suite_size(void) {
        Suite *s = suite_create("size");
        TCase *tc = tcase_create("core");

        tcase_add_test(tc, test_parse_good);
        tcase_add_test(tc, test_parse_bad);
        tcase_add_test(tc, test_durations);
        tcase_add_test(tc, test_format);
        suite_add_tcase(s, tc);
        return s;
}
