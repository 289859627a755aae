/*
 * size.c: parsing and printing byte sizes.
 *
 * Parsing uses integer arithmetic only, so "1.5GiB" is exactly 1610612736 and no size near
 * 2^64 is silently rounded through a double.
 */
#include "size.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static int unit_shift(const char *unit, unsigned *ret_shift) {
        static const struct {
                char letter;
                unsigned shift;
        } units[] = {
                { 'k', 10 }, { 'm', 20 }, { 'g', 30 }, { 't', 40 }, { 'p', 50 },
        };

        if (*unit == '\0' || strcasecmp(unit, "b") == 0) {
                *ret_shift = 0;
                return 0;
        }
        for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
                if ((unit[0] | 0x20) != units[i].letter)
                        continue;
                if (unit[1] == '\0' || strcasecmp(unit + 1, "b") == 0 ||
                    strcasecmp(unit + 1, "ib") == 0) {
                        *ret_shift = units[i].shift;
                        return 0;
                }
        }
        return -EINVAL;
}

int gp_size_parse(const char *text, uint64_t *ret_bytes) {
        uint64_t whole = 0, frac = 0, frac_scale = 1, bytes;
        const char *p = text;
        unsigned shift;
        bool digits = false;

        if (!text)
                return -EINVAL;
        for (; *p >= '0' && *p <= '9'; p++) {
                uint64_t digit = (uint64_t) (*p - '0');

                if (whole > UINT64_MAX / 10 || (whole == UINT64_MAX / 10 && digit > UINT64_MAX % 10))
                        return -ERANGE;
                whole = whole * 10 + digit;
                digits = true;
        }
        if (*p == '.') {
                p++;
                /* Eighteen fractional digits are more than any unit can resolve. */
                for (; *p >= '0' && *p <= '9'; p++) {
                        if (frac_scale < 1000000000000000000ULL) {
                                frac = frac * 10 + (uint64_t) (*p - '0');
                                frac_scale *= 10;
                        }
                        digits = true;
                }
        }
        if (!digits || unit_shift(p, &shift) < 0)
                return -EINVAL;
        if (shift && whole > (UINT64_MAX >> shift))
                return -ERANGE;
        bytes = whole << shift;
        if (frac) {
                /* frac / frac_scale of one unit, computed without overflow. */
                unsigned __int128 part = ((unsigned __int128) frac << shift) / frac_scale;

                if (bytes > UINT64_MAX - (uint64_t) part)
                        return -ERANGE;
                bytes += (uint64_t) part;
        }
        *ret_bytes = bytes;
        return 0;
}

char *gp_size_format(uint64_t bytes, char *buf, size_t size) {
        static const char *const names[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
        unsigned i = 0;
        uint64_t scale = 1;

        while (i + 1 < sizeof(names) / sizeof(names[0]) && bytes / scale >= 1024) {
                scale <<= 10;
                i++;
        }
        if (i == 0)
                snprintf(buf, size, "%llu B", (unsigned long long) bytes);
        else
                snprintf(buf, size, "%.1f %s", (double) bytes / (double) scale, names[i]);
        return buf;
}

static const struct {
        const char *name;
        uint64_t ms;
} duration_units[] = {
        { "d", 86400000 }, { "h", 3600000 }, { "min", 60000 }, { "s", 1000 }, { "ms", 1 },
};

int gp_duration_parse(const char *text, uint64_t *ret_ms) {
        uint64_t n = 0;
        const char *p = text;

        if (!text || !(*p >= '0' && *p <= '9'))
                return -EINVAL;
        for (; *p >= '0' && *p <= '9'; p++) {
                if (n > (UINT64_MAX - 9) / 10)
                        return -ERANGE;
                n = n * 10 + (uint64_t) (*p - '0');
        }
        if (*p == '\0') {
                if (n != 0)
                        return -EINVAL;         /* "30" is ambiguous: seconds? milliseconds? */
                *ret_ms = 0;
                return 0;
        }
        for (size_t i = 0; i < sizeof(duration_units) / sizeof(duration_units[0]); i++)
                if (strcmp(p, duration_units[i].name) == 0) {
                        if (n > UINT64_MAX / duration_units[i].ms)
                                return -ERANGE;
                        *ret_ms = n * duration_units[i].ms;
                        return 0;
                }
        return -EINVAL;
}

char *gp_duration_format(uint64_t ms, char *buf, size_t size) {
        for (size_t i = 0; i < sizeof(duration_units) / sizeof(duration_units[0]); i++)
                if (ms && ms % duration_units[i].ms == 0) {
                        snprintf(buf, size, "%llu%s", (unsigned long long) (ms / duration_units[i].ms),
                                 duration_units[i].name);
                        return buf;
                }
        snprintf(buf, size, "0");
        return buf;
}

void gp_deadline_after_ms(uint64_t ms, struct timespec *ret) {
        clock_gettime(CLOCK_REALTIME, ret);
        ret->tv_sec += (time_t) (ms / 1000);
        ret->tv_nsec += (long) (ms % 1000) * 1000000L;
        if (ret->tv_nsec >= 1000000000L) {
                ret->tv_sec++;
                ret->tv_nsec -= 1000000000L;
        }
}
