/*
 * client_control.h: the control channel and its thread (client_control.c): the daemon's reclaim
 * requests, answered from the process's pool, and the usage reports.
 */
#ifndef GP_CLIENT_CONTROL_H
#define GP_CLIENT_CONTROL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client_common.h"

/* Opens the control channel of client id and starts its thread. Locked or private. Returns 0 or a negative errno. */
int client_control_open(gpupool_client *c, const char *socket_path, const char *name, uint64_t id);

/* Stops the control thread and closes its channel. Call unlocked: the thread takes the lock. */
void client_control_close(gpupool_client *c);

#endif
