/*
 * session_unread.h: the descriptors the sessions' clients have not read, across the node
 * (session_unread.c), for session.c.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>

struct node;
struct session;

/* Which bound holds a reply with descriptors back, if any. */
enum session_unread_bound {
        SESSION_UNREAD_GOES,            /* none: it may go now */
        SESSION_UNREAD_OWN,             /* its client's: the client does not read (its fault) */
        SESSION_UNREAD_GROUP,           /* its group's (its pod's, else its user's): others of the group do not read */
        SESSION_UNREAD_NODE,            /* the node's: other groups do not read */
};

/*
 * Whether n descriptors more may go to s now, and else which bound holds them: what its client
 * may have unread (SESSION_UNREAD_FDS, at most an eighth of the node's budget), what its group
 * may (an eighth of the node's budget) and what the node may (node->unread_budget, and past it,
 * for groups holding little, node->unread_ceiling).
 */
enum session_unread_bound session_unread_bound(struct session *s, unsigned n);

/*
 * Says in why which bound holds s's reply of n descriptors, and where it is the node's, the
 * group of the client that holds the most unread and what that group holds: for the refusal
 * and the log.
 */
void session_unread_why(struct session *s, enum session_unread_bound bound, unsigned n, char *why, size_t why_size);

/*
 * An ending session's socket: kept open, draining, while its peer has descriptors unread
 * (true); else closed (false). Either way the session no longer owns s->fd.
 */
bool session_unread_keep_socket(struct session *s);

/* Reads afresh what each session's peer and each draining socket's has not read, and closes the draining sockets read to the end (or closed by their peers). */
void session_unread_drain(struct node *node);
