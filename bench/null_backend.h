/*
 * null_backend.h: a backend with no memory behind it, for the benchmarks that run the
 * allocator core alone (bench_host.c, frag.c): segments are bookkeeping only.
 */
#ifndef GP_BENCH_NULL_BACKEND_H
#define GP_BENCH_NULL_BACKEND_H

#include <string.h>

#include "backend.h"

static int nb_info(struct backend *b, unsigned d, struct backend_device_info *ret) {
        (void) b, (void) d;
        memset(ret, 0, sizeof(*ret));
        return 0;
}

static int nb_create(struct backend *b, unsigned d, uint64_t size, struct backend_mem *ret) {
        (void) b, (void) d, (void) size;
        memset(ret, 0, sizeof(*ret));
        ret->fd = -1;
        return 0;
}

static void nb_destroy(struct backend *b, unsigned d, struct backend_mem *m, uint64_t size) {
        (void) b, (void) d, (void) m, (void) size;
}

static int nb_zero(struct backend *b, unsigned d, struct backend_mem *m, uint64_t size) {
        (void) b, (void) d, (void) m, (void) size;
        return 0;
}

static const struct backend_ops null_ops = { nb_info, nb_create, nb_destroy, nb_zero, NULL };

/* A one-device null backend. */
static inline struct backend null_backend(void) {
        return (struct backend) { .ops = &null_ops, .name = "null", .device_count = 1 };
}

#endif
