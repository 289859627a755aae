/*
 * cudatest.h: what the cuda suites share (check_cuda.c and the files beside it): a client
 * process's driver, device data written and checked, the backend of a loop test, a fresh
 * node on the fake driver, a daemon started and stopped on it, and client processes whose
 * failures come back with the line and gpupool's sentence.
 */
#ifndef GP_CUDATEST_H
#define GP_CUDATEST_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cudadrv.h"
#include "gpupool.h"
#include "testlib.h"

#define MiB (1ULL << 20)

extern bool on_gpu;                     /* the real driver (make check-gpu), set by the suite */
extern char fake_dir[96];               /* on the fake: the node's directory ($FAKECUDA_DIR) */

/* What a client process needs of the driver beyond what libgpupool uses. */
struct gpu {
        struct gp_cuda cu;
        gp_cu_context ctx;
        gp_cu_result (*memset_d32)(gp_cu_deviceptr p, unsigned v, size_t n);
        gp_cu_result (*memset_d8_async)(gp_cu_deviceptr p, unsigned char v, size_t n, gp_cu_stream s);
        gp_cu_result (*htod)(gp_cu_deviceptr dst, const void *src, size_t n);
        gp_cu_result (*dtoh)(void *dst, gp_cu_deviceptr src, size_t n);
        gp_cu_result (*begin_capture)(gp_cu_stream s, int mode);
        gp_cu_result (*end_capture)(gp_cu_stream s, void **graph);
        gp_cu_result (*graph_destroy)(void *graph);
        int (*hold)(gp_cu_stream s, int hold);  /* fake only; gpu_hold() on a GPU */
        gp_cu_result (*host_alloc)(void **p, size_t n, unsigned flags);                 /* GPU only */
        gp_cu_result (*host_device_ptr)(gp_cu_deviceptr *d, void *p, unsigned flags);   /* GPU only */
        gp_cu_result (*wait_value32)(gp_cu_stream s, gp_cu_deviceptr addr, uint32_t v, unsigned flags); /* GPU only */
        volatile uint32_t *gates;               /* GPU only: a word per hold, 1 lets its stream go */
        gp_cu_deviceptr gates_dev;
        int ngates;
        struct { gp_cu_stream s; int gate; } held[16];
        int (*open_handles)(void);              /* fake only */
        unsigned long long (*event_queries)(void);      /* fake only */
        unsigned long long (*event_records)(void);      /* fake only: events this process recorded */
        unsigned long long (*set_access_calls)(void);   /* fake only */
        unsigned long long (*calls)(const char *name, int mine);        /* fake only: entry points' calls (fakecuda_calls) */
        void (*fail_events)(int r);             /* fake only */
        void (*release_all)(void);              /* fake only */
        int (*run)(gp_cu_stream s, unsigned n); /* fake only: n more operations of a held stream */
};

/* In a client process: the driver, and device 0's primary context made current. */
int gpu_open(struct gpu *g);
/* Holds stream s still (hold 1) until it is let go (hold 0). */
int gpu_hold(struct gpu *g, gp_cu_stream s, int hold);
gp_cu_deviceptr dptr(void *p);
/* A pattern only (tag, size) produce, and whether it is still there. */
int write_pattern(struct gpu *g, void *p, size_t size, unsigned tag);
bool pattern_intact(struct gpu *g, void *p, size_t size, unsigned tag);

/*
 * The backend cuda_start() starts; a loop test of BACKEND_LOOPS iterations runs on cuda,
 * cuda-vmm, and cuda-vmm with segments that grow in place.
 */
extern const char *cuda_backend;
#define BACKEND_LOOPS 3
bool choose_backend(int i);
/* First in a loop test's body: the backend of this iteration. */
#define BACKEND_OF_LOOP const bool backend_chosen_ __attribute__((unused)) = choose_backend(_i)

/* On the fake: a fresh node; and at its end, every allocation freed and the node removed. */
void fake_node_new(void);
void fake_node_done(void);
/* A cuda daemon (of cuda_backend; vmm_start: of cuda-vmm) on a fresh node, and its stop. */
void cuda_start(struct testd *d, const char *extra1, const char *extra2);
void vmm_start(struct testd *d);
void cuda_stop(struct testd *d);

/*
 * What a client process that failed leaves on run_client()'s shared page: the line it failed
 * at and gpupool's sentence about the latest failure (the hooks' where c is NULL).
 */
struct client_failure {
        long long line;
        char error[1016];
};

void client_failed(void *page, int line, gpupool_client *c);
/* In a client function with fail_page (run_client's page) and c (NULL until connected). */
#define FAIL() do { client_failed(fail_page, __LINE__, c); return 1; } while (0)

/* Runs client in a process of its own against d (run_client: a fresh daemon); it must exit 0. */
void check_client(struct testd *d, int (*client)(struct testd *d, void *arg), const char *name);
void run_client(int (*client)(struct testd *d, void *arg), const char *name);
/* Device work on s writing block p, held still until release_work(). */
int queue_work(struct gpu *g, gp_cu_stream s, void *p, size_t size);
void release_work(struct gpu *g, gp_cu_stream s);
/* What device index holds leased to clients: reserved but not cached. */
long long leased_on(struct testd *d, unsigned index);

/* Each file's tests, added to the suites by check_cuda.c. */
void cuda_fake_add(TCase *tc);          /* check_cuda_fake.c: the fake driver's rules */
void cuda_vmm_add_common(TCase *tc);    /* check_cuda_vmm.c: on the fake and on a GPU */
void cuda_vmm_add_fake(TCase *tc);      /* check_cuda_vmm.c: on the fake only */
void cuda_node_add(TCase *tc);          /* check_cuda_node.c: the node's memory */
void cuda_run_add(TCase *tc);           /* check_run.c: gpupool-run and programs that know nothing of gpupool */

#endif
