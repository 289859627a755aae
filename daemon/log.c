/*
 * log.c: stderr logging for gpupoold, journal-aware (see daemon(7) and sd-daemon(3): a
 * "<N>" prefix carries the priority when systemd forwards stderr to the journal).
 */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

enum log_level log_max_level = LOG_LEVEL_INFO;
static bool log_to_journal;

/* True when $JOURNAL_STREAM names the device and inode stderr really is (systemd.exec(5)). */
static bool stderr_is_journal(void) {
        const char *env = getenv("JOURNAL_STREAM");
        unsigned long long dev, ino;
        struct stat st;

        if (!env || sscanf(env, "%llu:%llu", &dev, &ino) != 2 || fstat(2, &st) < 0)
                return false;
        return (unsigned long long) st.st_dev == dev && (unsigned long long) st.st_ino == ino;
}

void log_open(enum log_level level) {
        log_max_level = level;
        log_to_journal = stderr_is_journal();
}

int log_level_parse(const char *text, enum log_level *ret_level) {
        static const struct {
                const char *name;
                enum log_level level;
        } names[] = {
                { "err", LOG_LEVEL_ERR }, { "error", LOG_LEVEL_ERR },
                { "warn", LOG_LEVEL_WARN }, { "warning", LOG_LEVEL_WARN },
                { "info", LOG_LEVEL_INFO }, { "debug", LOG_LEVEL_DEBUG },
        };

        for (size_t i = 0; text && i < sizeof(names) / sizeof(names[0]); i++) {
                if (strcmp(text, names[i].name) == 0) {
                        *ret_level = names[i].level;
                        return 0;
                }
        }
        return -EINVAL;
}

void log_write(enum log_level level, const char *fmt, ...) {
        char line[1024];
        int saved_errno = errno;
        va_list ap;

        va_start(ap, fmt);
        vsnprintf(line, sizeof(line), fmt, ap);
        va_end(ap);
        /* One message is one line: the journal splits on newlines. */
        for (char *p = line; *p; p++)
                if (*p == '\n')
                        *p = ' ';

        if (log_to_journal) {
                fprintf(stderr, "<%d>%s\n", (int) level, line);
        } else {
                static const char *const tags[] = {
                        [LOG_LEVEL_ERR] = "error", [LOG_LEVEL_WARN] = "warning",
                        [LOG_LEVEL_INFO] = "info", [LOG_LEVEL_DEBUG] = "debug",
                };
                struct timespec ts;
                struct tm tm;
                char when[32];

                clock_gettime(CLOCK_REALTIME, &ts);
                localtime_r(&ts.tv_sec, &tm);
                strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
                fprintf(stderr, "%s.%03ld gpupoold %s: %s\n", when, ts.tv_nsec / 1000000,
                        tags[level], line);
        }
        errno = saved_errno;
}

void log_lines(enum log_level level, const char *text) {
        for (const char *nl; level <= log_max_level && (nl = strchr(text, '\n')); text = nl + 1)
                log_write(level, "%.*s", (int) (nl - text), text);
}
