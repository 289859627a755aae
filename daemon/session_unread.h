/*
 * session_unread.h: the descriptors the sessions' clients have not read, across the node
 * (session_unread.c), for session.c.
 */
#pragma once

#include <stdbool.h>

struct node;
struct session;

/*
 * Whether n descriptors more may go to s now: within what it may have unread, what its group
 * may (SESSION_UNREAD_FDS) and what the node may (node->unread_budget).
 */
bool session_unread_admits(struct session *s, unsigned n);

/*
 * An ending session's socket: kept open, draining, while its peer has descriptors unread
 * (true); else closed (false). Either way the session no longer owns s->fd.
 */
bool session_unread_keep_socket(struct session *s);

/* Reads afresh what each session's peer and each draining socket's has not read, and closes the draining sockets read to the end (or closed by their peers). */
void session_unread_drain(struct node *node);
