/*
 * session_unread.c: the descriptors the sessions' clients have not read, across the node
 * (unread.h counts them on one socket): whether a reply's descriptors may go to a client now,
 * within its own bound, its group's and the node's; and the sockets of ended sessions kept
 * open, draining, until their peers read what is queued or close. session.c holds a reply back
 * while it may not go, and runs the timer that calls session_unread_drain().
 */
#define _GNU_SOURCE
#include "session_unread.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "closer.h"
#include "node.h"
#include "session.h"
#include "unread.h"
#include "users.h"

/*
 * Whether n descriptors more may go to s now: within what it may have unread, what its group
 * may (SESSION_UNREAD_FDS) and what the node may (node->unread_budget). Its own count is read
 * afresh from its socket; the others' as last read (the timer reads them while a reply waits).
 */
bool session_unread_admits(struct session *s, unsigned n) {
        struct node *node = s->node;
        uint64_t group_cap = node->unread_budget / 8, mine = group_cap < SESSION_UNREAD_FDS ? group_cap : SESSION_UNREAD_FDS;
        uint64_t group = 0;

        unread_update(&s->unread, s->fd, &node->unread_fds);
        if (!unread_room(&s->unread) || s->unread.fds + n > mine || node->unread_fds + n > node->unread_budget)
                return false;
        if (node->unread_fds + n <= group_cap)
                return true;            /* no group can be past it */
        SESSION_FOREACH(c, node)
                if (c->fd >= 0 && users_same_group(c->user, c->pod_uid, s->user, s->pod_uid))
                        group += c->unread.fds;
        for (const struct unread_socket *u = node->draining; u; u = u->next)
                if (users_same_group(u->user, u->pod, s->user, s->pod_uid))
                        group += u->unread.fds;
        return group + n <= group_cap;
}

/*
 * Keeps an ending session's socket open and counted among the node's draining sockets (its
 * user's connections too) while its peer has descriptors unread, until the peer reads them or
 * closes: closing ours would leave them charged to the daemon, uncounted.
 */
bool session_unread_keep_socket(struct session *s) {
        struct node *node = s->node;
        struct unread_socket *u;

        if (!unread_update(&s->unread, s->fd, &node->unread_fds) || node->stopping || !(u = calloc(1, sizeof(*u)))) {
                node->unread_fds -= s->unread.fds;
                closer_close_from(s->fd, s->user);      /* its queue may hold descriptors in flight, dropped with it: its user's */
                return false;
        }
        u->fd = s->fd;
        u->user = s->user;
        snprintf(u->pod, sizeof(u->pod), "%s", s->pod_uid);
        u->unread = s->unread;
        u->next = node->draining;
        node->draining = u;
        node->draining_count++;
        return true;
}

void session_unread_drain(struct node *node) {
        struct unread_socket **at = &node->draining;

        SESSION_FOREACH(c, node)
                if (c->fd >= 0 && c->unread.count)
                        (void) unread_update(&c->unread, c->fd, &node->unread_fds);
        while (*at) {
                struct unread_socket *u = *at;

                if (unread_update(&u->unread, u->fd, &node->unread_fds)) {
                        at = &u->next;
                        continue;
                }
                *at = u->next;
                node->draining_count--;
                closer_close_from(u->fd, u->user);
                free(u);
        }
}
