/*
 * client_resume.h: a handle's session with a daemon that came back, adopting what the process
 * holds (client_resume.c).
 */
#ifndef GP_CLIENT_RESUME_H
#define GP_CLIENT_RESUME_H

#include "client_common.h"

/*
 * After the daemon died (host and cuda-vmm backends), the first half, unlocked: says hello to
 * the daemon listening now on a connection of its own, *conn, and returns 0 with its reply in
 * *ret_hello, or a negative errno (none listens yet: -ECONNREFUSED or -ENOENT). A daemon that
 * systemd's socket holds while it starts answers once it has; the application's threads do
 * not wait for that.
 */
int client_resume_hello(const gpupool_client *c, struct gp_conn *conn, Gpupool__Envelope **ret_hello);

/*
 * The second half, locked: makes conn the main connection, has the daemon adopt every segment
 * the process holds (their ids change; those it refuses become CLIENT_ORPHAN's), and opens a
 * control channel for the new session into *ret_control. It takes conn and hello whatever it
 * returns: -ECANCELED (conn closed) where the handle began closing or lent its main connection
 * out meanwhile. Returns 0, or a negative errno with the handle's error set. A daemon with other
 * devices or another backend adopts nothing: -ECONNRESET, the main connection broken and
 * c->resume_refused set, for the next lease to say why.
 */
int client_resume(gpupool_client *c, struct gp_conn *conn, Gpupool__Envelope *hello, struct gp_conn **ret_control);

#endif
