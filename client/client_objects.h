/*
 * client_objects.h: named objects the handle publishes and attaches (client_objects.c); the
 * public calls are gpupool_publish(), gpupool_attach(), gpupool_detach(), gpupool_unpublish().
 */
#ifndef GP_CLIENT_OBJECTS_H
#define GP_CLIENT_OBJECTS_H

#include "client_common.h"

/* Unmaps every object the handle has attached, telling nobody (the session is over). Locked. */
void client_objects_forget(gpupool_client *c);

/*
 * The handle's connection is to a daemon after the one it attached its objects from (it
 * resumed): that one knows nothing of them, and a detach tells it nothing. Locked.
 */
void client_objects_daemon_changed(gpupool_client *c);

/*
 * Once the daemon after it has adopted what the process holds: attaches again, there, each
 * object the handle has attached, where that daemon took it over (systemd's store kept it),
 * so that it counts the attachment. Locked, the main connection free.
 */
void client_objects_resume(gpupool_client *c);

#endif
