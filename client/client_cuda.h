/*
 * client_cuda.h: libgpupool's side of the cuda backend (client_cuda.c), the lowest layer. All
 * called locked.
 */
#ifndef GP_CLIENT_CUDA_H
#define GP_CLIENT_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client.h"

/* Loads the driver and matches the daemon's GPUs (hello's devices) to this process's by UUID. */
int client_cuda_setup(gpupool_client *c, const Gpupool__HelloReply *hello);

/* Opens a segment's IPC handle in the device's primary context; sets m->base. */
int client_cuda_open(gpupool_client *c, struct mapping *m);

/* Closes what client_cuda_open() opened. */
void client_cuda_close(gpupool_client *c, struct mapping *m);

/*
 * Records an event on stream in d's primary context after the work queued so far (a spare
 * one, or a new one). Returns 0, or a negative errno with the error set.
 */
int client_cuda_record(gpupool_client *c, struct client_device *d, void *stream, gp_cu_event *ret);

/* Whether event e of d has completed (or its context failed); with wait, waits for it first. */
bool client_cuda_event_done(gpupool_client *c, struct client_device *d, gp_cu_event e, bool wait);

/* Keeps a completed event of d for reuse. */
void client_cuda_event_put(gpupool_client *c, struct client_device *d, gp_cu_event e);

/* Once every mapping is closed and the reaper stopped: destroys the events and releases the contexts. */
void client_cuda_teardown(gpupool_client *c);

#endif
