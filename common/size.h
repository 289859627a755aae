/*
 * size.h: byte sizes as people write them ("512M", "4G", "1.5GiB", "1048576") and as the CLI
 * and the log print them ("1.5 GiB").
 */
#ifndef GP_SIZE_H
#define GP_SIZE_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

/*
 * Parses a size: digits, an optional fraction, an optional unit K, M, G, T or P (any case,
 * optionally followed by "B" or "iB"), or "B". Every unit is a power of 1024. A fraction is
 * rounded down to whole bytes. Returns 0 and sets *ret_bytes, or -EINVAL for text that is not
 * a size, -ERANGE for one that does not fit 64 bits; *ret_bytes is untouched on failure.
 */
int gp_size_parse(const char *text, uint64_t *ret_bytes);

/* Writes bytes as "512 B", "4.0 KiB", "1.5 GiB" into buf (at least 16 bytes); returns buf. */
char *gp_size_format(uint64_t bytes, char *buf, size_t size);

#define GP_SIZE_FORMAT_MAX 24

/*
 * Parses a duration: whole digits and a unit ms, s, min, h or d ("0" alone is zero), e.g.
 * "100ms", "30s", "5min", "2h". Returns 0 and sets *ret_ms, or -EINVAL (no unit, a bad unit,
 * not a number) or -ERANGE; *ret_ms is untouched on failure.
 */
int gp_duration_parse(const char *text, uint64_t *ret_ms);

/* The CLOCK_REALTIME time ms from now, as pthread_cond_timedwait() takes it. */
void gp_deadline_after_ms(uint64_t ms, struct timespec *ret);

/* Writes ms as "100ms", "30s", "5min", "2h" (the largest unit that divides it) into buf. */
char *gp_duration_format(uint64_t ms, char *buf, size_t size);

#endif
