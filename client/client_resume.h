/*
 * client_resume.h: a handle's session with a daemon that came back, adopting what the process
 * holds (client_resume.c).
 */
#ifndef GP_CLIENT_RESUME_H
#define GP_CLIENT_RESUME_H

#include "client.h"

/*
 * After the daemon died (host backend): says hello to the one listening now on c->conn, has
 * it adopt every segment the process holds (their ids change; those it refuses become
 * CLIENT_ORPHAN's), and opens a control channel for the new session into *ret_control.
 * Locked, the main connection idle. Returns 0, or a negative errno with the handle's error
 * set (none listens yet: -ECONNREFUSED or -ENOENT; the main connection is then broken). A
 * daemon with other devices or another backend adopts nothing: -ECONNRESET, the main
 * connection broken and c->resume_refused set, for the next lease to say why.
 */
int client_resume(gpupool_client *c, struct gp_conn **ret_control);

#endif
