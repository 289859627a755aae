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

/* The median of v's n values (n at least 1), which it sorts. */
static inline double median(double *v, size_t n) {
        qsort(v, n, sizeof(*v), cmp_double);
        return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#endif
