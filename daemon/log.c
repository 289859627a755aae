/*
 * log.c: stderr logging for gpupoold, journal-aware (see daemon(7) and sd-daemon(3): a
 * "<N>" prefix carries the priority when systemd forwards stderr to the journal).
 */
#include "log.h"

#include "size.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

/*
 * Once the daemon serves, lines go through a ring to a writer thread: a write to stderr blocks
 * when nobody reads it (a pipe, a stuck journald), and a stuck log must never stop the loop.
 * What does not fit the ring is dropped and counted, and said once writing works again.
 */
#define LOG_RING_BYTES (256 * 1024)

static struct {
        pthread_mutex_t lock;
        pthread_cond_t wake, drained;
        pthread_t thread;
        bool running, stopping, writing;
        size_t head, tail;              /* bytes in [tail, head) mod the ring's size; head - tail <= size */
        uint64_t dropped;
        char ring[LOG_RING_BYTES];
        char chunk[64 * 1024];          /* the writer thread's: what it writes out of the ring at once, unlocked */
} writer = { .lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER, .drained = PTHREAD_COND_INITIALIZER };

/* Writes all of buf to stderr, which may block (only the writer thread, or before it runs). */
static void write_all(const char *buf, size_t len) {
        while (len) {
                ssize_t n = write(2, buf, len);

                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        return;
                buf += n;
                len -= (size_t) n;
        }
}

/* Formats one line as stderr gets it: "<N>text" for the journal, else a timestamp and a tag. */
static size_t format_line(enum log_level level, const char *text, char *out, size_t size) {
        static const char *const tags[] = {
                [LOG_LEVEL_ERR] = "error", [LOG_LEVEL_WARN] = "warning",
                [LOG_LEVEL_INFO] = "info", [LOG_LEVEL_DEBUG] = "debug",
        };
        struct timespec ts;
        struct tm tm;
        char when[32];
        int n;

        if (log_to_journal) {
                n = snprintf(out, size, "<%d>%s\n", (int) level, text);
        } else {
                clock_gettime(CLOCK_REALTIME, &ts);
                localtime_r(&ts.tv_sec, &tm);
                strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
                n = snprintf(out, size, "%s.%03ld gpupoold %s: %s\n", when, ts.tv_nsec / 1000000, tags[level], text);
        }
        if (n < 0)
                return 0;
        if ((size_t) n >= size) {
                out[size - 2] = '\n';  /* cut, but still one line */
                return size - 1;
        }
        return (size_t) n;
}

static void *writer_main(void *arg) {
        char *chunk = writer.chunk;

        (void) arg;
        pthread_mutex_lock(&writer.lock);
        for (;;) {
                size_t len, at;
                uint64_t dropped;

                while (writer.head == writer.tail && !writer.stopping)
                        pthread_cond_wait(&writer.wake, &writer.lock);
                if (writer.head == writer.tail)
                        break;
                at = writer.tail % LOG_RING_BYTES;
                len = writer.head - writer.tail;
                if (len > LOG_RING_BYTES - at)
                        len = LOG_RING_BYTES - at;      /* up to the ring's end; the rest next time */
                if (len > sizeof(writer.chunk))
                        len = sizeof(writer.chunk);
                memcpy(chunk, writer.ring + at, len);
                writer.tail += len;
                writer.writing = true;
                pthread_mutex_unlock(&writer.lock);
                write_all(chunk, len);
                pthread_mutex_lock(&writer.lock);
                writer.writing = false;
                dropped = writer.dropped;
                writer.dropped = 0;
                if (dropped) {
                        char text[160], line[256];
                        size_t n;

                        /* Writing works again: say what was lost while it did not. */
                        snprintf(text, sizeof(text), "%llu log messages dropped: stderr was not being read "
                                 "(a stuck journal or pipe)", (unsigned long long) dropped);
                        n = format_line(LOG_LEVEL_WARN, text, line, sizeof(line));
                        pthread_mutex_unlock(&writer.lock);
                        write_all(line, n);
                        pthread_mutex_lock(&writer.lock);
                }
                if (writer.head == writer.tail)
                        pthread_cond_broadcast(&writer.drained);
        }
        pthread_mutex_unlock(&writer.lock);
        return NULL;
}

int log_start_writer(void) {
        sigset_t all, old;
        int r;

        if (writer.running)
                return 0;
        writer.stopping = false;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        r = pthread_create(&writer.thread, NULL, writer_main, NULL);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (r != 0)
                return -r;
        writer.running = true;
        return 0;
}

void log_stop_writer(unsigned wait_ms) {
        struct timespec deadline;
        bool drained;

        if (!writer.running)
                return;
        gp_deadline_after_ms(wait_ms, &deadline);
        pthread_mutex_lock(&writer.lock);
        while ((writer.head != writer.tail || writer.writing) &&
               pthread_cond_timedwait(&writer.drained, &writer.lock, &deadline) != ETIMEDOUT)
                ;
        drained = writer.head == writer.tail && !writer.writing;
        writer.stopping = true;
        pthread_cond_signal(&writer.wake);
        pthread_mutex_unlock(&writer.lock);
        /* A writer stuck on stderr is left to the process's exit: stopping must not hang on it either. */
        if (drained) {
                pthread_join(writer.thread, NULL);
                writer.running = false;
        }
}

void log_write(enum log_level level, const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        log_writev(level, fmt, ap);
        va_end(ap);
}

void log_writev(enum log_level level, const char *fmt, va_list ap) {
        /* The line adds a timestamp and the level to the message. */
        char text[LOG_MESSAGE_MAX], line[LOG_MESSAGE_MAX + 176];
        int saved_errno = errno;
        size_t len, at, first;

        vsnprintf(text, sizeof(text), fmt, ap);
        /* One message is one line: the journal splits on newlines. */
        for (char *p = text; *p; p++)
                if (*p == '\n')
                        *p = ' ';
        len = format_line(level, text, line, sizeof(line));
        if (!writer.running) {
                write_all(line, len);
                errno = saved_errno;
                return;
        }
        pthread_mutex_lock(&writer.lock);
        if (LOG_RING_BYTES - (writer.head - writer.tail) < len) {
                writer.dropped++;
        } else {
                at = writer.head % LOG_RING_BYTES;
                first = len < LOG_RING_BYTES - at ? len : LOG_RING_BYTES - at;
                memcpy(writer.ring + at, line, first);
                memcpy(writer.ring, line + first, len - first);
                writer.head += len;
                pthread_cond_signal(&writer.wake);
        }
        pthread_mutex_unlock(&writer.lock);
        errno = saved_errno;
}

void log_lines(enum log_level level, const char *text) {
        for (const char *nl; level <= log_max_level && (nl = strchr(text, '\n')); text = nl + 1)
                log_write(level, "%.*s", (int) (nl - text), text);
}

bool log_ratelimit_pass(struct log_ratelimit *rl, unsigned *ret_suppressed) {
        struct timespec ts;
        uint64_t now;

        clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
        now = (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
        if (rl->count == 0 || now - rl->begin_ms >= rl->interval_ms) {
                rl->begin_ms = now;
                rl->count = 0;
        }
        if (rl->count >= rl->burst) {
                rl->suppressed++;
                return false;
        }
        rl->count++;
        *ret_suppressed = rl->suppressed;
        rl->suppressed = 0;
        return true;
}
