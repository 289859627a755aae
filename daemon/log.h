/*
 * log.h: the daemon's log. One line per message on stderr; "<N>" priority prefixes when
 * stderr is the journal ($JOURNAL_STREAM matches it), a timestamp otherwise. The macros
 * check the level before evaluating their arguments, so debug lines cost nothing when off.
 */
#ifndef GP_LOG_H
#define GP_LOG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>

enum log_level {
        LOG_LEVEL_ERR = 3,
        LOG_LEVEL_WARN = 4,
        LOG_LEVEL_INFO = 6,
        LOG_LEVEL_DEBUG = 7,
};

extern enum log_level log_max_level;

/* Sets up the log: level, and whether stderr is the journal. */
void log_open(enum log_level level);

/* Parses "err", "warn", "info" or "debug". Returns 0 or -EINVAL. */
int log_level_parse(const char *text, enum log_level *ret_level);

void log_write(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void log_writev(enum log_level level, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

/*
 * From here on lines go to stderr through a writer thread, so that a log nobody reads never
 * blocks the caller: what does not fit its buffer (256 KiB) is dropped, counted and said
 * when writing works again. Before it, lines are written at once. Returns 0 or a negative
 * errno (lines are then written at once, as before).
 */
int log_start_writer(void);

/* Waits up to wait_ms for the writer to write what it holds, then stops it. */
void log_stop_writer(unsigned wait_ms);

/* Logs each line of text (lines end with '\n') as a message of its own at level. */
void log_lines(enum log_level level, const char *text);

#define log_at(level, ...)                                      \
        do {                                                    \
                if ((level) <= log_max_level)                   \
                        log_write((level), __VA_ARGS__);        \
        } while (0)

/*
 * A rate limit on what one source may make the daemon log, as journald's per-service one:
 * at most burst messages in each interval_ms; the rest are counted, and the first message of
 * a later interval says how many were left out.
 */
struct log_ratelimit {
        unsigned burst;
        unsigned interval_ms;
        uint64_t begin_ms;              /* the current interval's start (monotonic) */
        unsigned count;                 /* messages in it */
        unsigned suppressed;            /* held back since the last message that went out */
};

/* What a client may make the daemon log, and all clients together. */
/* The longest message a log line carries; longer ones are cut there. */
#define LOG_MESSAGE_MAX 1024

#define LOG_RATELIMIT_CLIENT { .burst = 10, .interval_ms = 10000 }
#define LOG_RATELIMIT_CLIENTS { .burst = 1000, .interval_ms = 10000 }

/*
 * Whether one more message may go out under rl now. When it may, *ret_suppressed is how many
 * were held back before it (say so first), and the count starts again.
 */
bool log_ratelimit_pass(struct log_ratelimit *rl, unsigned *ret_suppressed);

#define log_err(...) log_at(LOG_LEVEL_ERR, __VA_ARGS__)
#define log_warn(...) log_at(LOG_LEVEL_WARN, __VA_ARGS__)
#define log_info(...) log_at(LOG_LEVEL_INFO, __VA_ARGS__)
#define log_debug(...) log_at(LOG_LEVEL_DEBUG, __VA_ARGS__)

#endif
