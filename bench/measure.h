/*
 * measure.h: the clock and the sort the benchmarks read their medians with.
 */
#ifndef GP_BENCH_MEASURE_H
#define GP_BENCH_MEASURE_H

#include <stdlib.h>
#include <time.h>

/* The monotonic clock, in ns. */
static inline double now_ns(void) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec * 1e9 + (double) ts.tv_nsec;
}

/* For qsort() of doubles, smallest first. */
static inline int cmp_double(const void *a, const void *b) {
        double x = *(const double *) a, y = *(const double *) b;

        return x < y ? -1 : x > y;
}

#endif
