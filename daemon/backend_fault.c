/*
 * backend_fault.c: TEST ONLY. Wraps a backend and makes a chosen fraction of its segment
 * creations, exports and zeroings fail, so that the stress run (tests/stress) proves every
 * failure path returns its memory and keeps the invariants. Enabled by $GPUPOOL_TEST_FAULTS,
 * e.g. "create=0.05,export=0.02,zero=0.1,seed=7"; the daemon says so loudly at start. And
 * "adopt_ms=N" makes each adoption of a segment wait N ms first, the loop blocked: a daemon
 * slow to adopt, for the tests of what a client does meanwhile. It is
 * linked into the test daemon build/tests/gpupoold-faults (and the test and fuzz programs)
 * only: the shipped gpupoold has none of it.
 */
#include "backend.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

struct fault_backend {
        struct backend base;
        struct backend *inner;
        struct backend_ops ops;         /* fault_ops, less what the inner backend does not do */
        double create, export_, zero;   /* probabilities of failure */
        unsigned adopt_ms;              /* each adoption of a segment waits this long first, the loop blocked */
        uint64_t rng;
};

static struct fault_backend *fault_of(struct backend *b) {
        return (struct fault_backend *) b;
}

/* xorshift64*: deterministic for a seed, so a failing run can be repeated. */
static bool roll(struct fault_backend *f, double p) {
        f->rng ^= f->rng >> 12;
        f->rng ^= f->rng << 25;
        f->rng ^= f->rng >> 27;
        return p > 0 && (double) ((f->rng * 2685821657736338717ULL) >> 11) / 9007199254740992.0 < p;
}

static int fault_device_info(struct backend *b, unsigned device, struct backend_device_info *ret) {
        struct backend *inner = fault_of(b)->inner;

        return inner->ops->device_info(inner, device, ret);
}

static int fault_mem_create(struct backend *b, unsigned device, uint64_t size, struct backend_mem *ret) {
        struct fault_backend *f = fault_of(b);
        int r;

        if (roll(f, f->create)) {
                b->faults_injected++;
                return -ENOMEM;         /* as a driver out of memory */
        }
        r = f->inner->ops->mem_create(f->inner, device, size, ret);
        if (r == 0 && roll(f, f->export_)) {
                /* Made, then the export failed: the backend gives it back, as cuda_mem_create does. */
                f->inner->ops->mem_destroy(f->inner, device, ret, size);
                b->faults_injected++;
                return -EIO;
        }
        return r;
}

static void fault_mem_destroy(struct backend *b, unsigned device, struct backend_mem *mem, uint64_t size) {
        struct backend *inner = fault_of(b)->inner;

        inner->ops->mem_destroy(inner, device, mem, size);
}

static int fault_mem_zero(struct backend *b, unsigned device, struct backend_mem *mem, uint64_t size) {
        struct fault_backend *f = fault_of(b);

        if (roll(f, f->zero)) {
                b->faults_injected++;
                return -EIO;
        }
        return f->inner->ops->mem_zero(f->inner, device, mem, size);
}

static int fault_mem_zero_done(struct backend *b, unsigned device, struct backend_mem *mem) {
        struct backend *inner = fault_of(b)->inner;

        return inner->ops->mem_zero_done(inner, device, mem);
}

/* This and the two below are set only where the inner backend has them (backend_fault_wrap()). */
static int fault_device_memory(struct backend *b, unsigned device, struct backend_device_memory *ret) {
        struct backend *inner = fault_of(b)->inner;

        return inner->ops->device_memory(inner, device, ret);
}

static int fault_mem_adopt(struct backend *b, unsigned device, int fd, uint64_t size, bool sealed, struct backend_mem *ret, char *why,
                           size_t why_size) {
        struct fault_backend *f = fault_of(b);

        if (f->adopt_ms) {
                log_warn("TEST ONLY: an adoption waits %u ms ($GPUPOOL_TEST_FAULTS adopt_ms)", f->adopt_ms);
                usleep(f->adopt_ms * 1000);
        }
        return f->inner->ops->mem_adopt(f->inner, device, fd, size, sealed, ret, why, why_size);
}

static uint64_t fault_mem_ident(struct backend *b, unsigned device, const struct backend_mem *mem) {
        struct backend *inner = fault_of(b)->inner;

        return inner->ops->mem_ident(inner, device, mem);
}

static int fault_mem_seal(struct backend *b, unsigned device, struct backend_mem *mem, uint64_t size) {
        struct backend *inner = fault_of(b)->inner;

        return inner->ops->mem_seal(inner, device, mem, size);
}

static int fault_mem_export(struct backend *b, unsigned device, struct backend_mem *mem, bool read_only) {
        struct backend *inner = fault_of(b)->inner;

        return inner->ops->mem_export(inner, device, mem, read_only);
}

static int fault_mem_export_ahead(struct backend *b, unsigned device, struct backend_mem *mem, unsigned most) {
        struct backend *inner = fault_of(b)->inner;

        return inner->ops->mem_export_ahead(inner, device, mem, most);
}

static void fault_close(struct backend *b) {
        struct fault_backend *f = fault_of(b);

        log_info("fault injection: %llu faults injected", (unsigned long long) b->faults_injected);
        f->inner->ops->close(f->inner);
        free(f);
}

static const struct backend_ops fault_ops = {
        .device_info = fault_device_info,
        .mem_create = fault_mem_create,
        .mem_destroy = fault_mem_destroy,
        .mem_zero = fault_mem_zero,
        .mem_zero_done = fault_mem_zero_done,
        .device_memory = fault_device_memory,
        .close = fault_close,
        .mem_adopt = fault_mem_adopt,
        .mem_ident = fault_mem_ident,
        .mem_seal = fault_mem_seal,
        .mem_export = fault_mem_export,
        .mem_export_ahead = fault_mem_export_ahead,
};

int backend_fault_wrap(struct backend *inner, const char *spec, struct backend **ret, char *err, size_t err_size) {
        struct fault_backend *f = calloc(1, sizeof(*f));
        char copy[256], *save = NULL;

        if (!f) {
                snprintf(err, err_size, "out of memory");
                return -ENOMEM;
        }
        f->rng = 0x9e3779b97f4a7c15ULL;
        snprintf(copy, sizeof(copy), "%s", spec);
        for (char *kv = strtok_r(copy, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
                char *eq = strchr(kv, '='), *end;
                double v;

                if (!eq) {
                        snprintf(err, err_size, "$GPUPOOL_TEST_FAULTS: '%s' is not key=value", kv);
                        free(f);
                        return -EINVAL;
                }
                *eq = '\0';
                v = strtod(eq + 1, &end);
                if (*end || v < 0 || (strcmp(kv, "seed") != 0 && strcmp(kv, "adopt_ms") != 0 && v > 1) || v > 60000) {
                        snprintf(err, err_size, "$GPUPOOL_TEST_FAULTS: %s=%s is not a probability from 0 to 1", kv, eq + 1);
                        free(f);
                        return -EINVAL;
                }
                if (strcmp(kv, "create") == 0)
                        f->create = v;
                else if (strcmp(kv, "export") == 0)
                        f->export_ = v;
                else if (strcmp(kv, "zero") == 0)
                        f->zero = v;
                else if (strcmp(kv, "adopt_ms") == 0)
                        f->adopt_ms = (unsigned) v;
                else if (strcmp(kv, "seed") == 0)
                        f->rng = (uint64_t) v * 0x9e3779b97f4a7c15ULL + 1;
                else {
                        snprintf(err, err_size, "$GPUPOOL_TEST_FAULTS: unknown key '%s' (create, export, zero, adopt_ms, seed)", kv);
                        free(f);
                        return -EINVAL;
                }
        }
        f->inner = inner;
        f->base = *inner;
        f->ops = fault_ops;
        if (!inner->ops->device_memory)
                f->ops.device_memory = NULL;
        if (!inner->ops->mem_adopt)
                f->ops.mem_adopt = NULL;
        if (!inner->ops->mem_ident)
                f->ops.mem_ident = NULL;
        if (!inner->ops->mem_seal)
                f->ops.mem_seal = NULL;
        if (!inner->ops->mem_export)
                f->ops.mem_export = NULL;
        if (!inner->ops->mem_export_ahead)
                f->ops.mem_export_ahead = NULL;
        f->base.ops = &f->ops;
        f->base.faults_injected = 0;
        log_warn("TEST ONLY: fault injection is on ($GPUPOOL_TEST_FAULTS=%s): segment creations fail at %.3f, "
                 "exports at %.3f, zeroings at %.3f", spec, f->create, f->export_, f->zero);
        *ret = &f->base;
        return 0;
}
