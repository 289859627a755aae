/*
 * log.h: the daemon's log. One line per message on stderr; "<N>" priority prefixes when
 * stderr is the journal ($JOURNAL_STREAM matches it), a timestamp otherwise. The macros
 * check the level before evaluating their arguments, so debug lines cost nothing when off.
 */
#ifndef GP_LOG_H
#define GP_LOG_H

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

/* Logs each line of text (lines end with '\n') as a message of its own at level. */
void log_lines(enum log_level level, const char *text);

#define log_at(level, ...)                                      \
        do {                                                    \
                if ((level) <= log_max_level)                   \
                        log_write((level), __VA_ARGS__);        \
        } while (0)

#define log_err(...) log_at(LOG_LEVEL_ERR, __VA_ARGS__)
#define log_warn(...) log_at(LOG_LEVEL_WARN, __VA_ARGS__)
#define log_info(...) log_at(LOG_LEVEL_INFO, __VA_ARGS__)
#define log_debug(...) log_at(LOG_LEVEL_DEBUG, __VA_ARGS__)

#endif
