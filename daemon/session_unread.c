/*
 * session_unread.c: the descriptors the sessions' clients have not read, across the node
 * (unread.h counts them on one socket): whether a reply's descriptors may go to a client now,
 * within its own bound, its group's and the node's; and the sockets of ended sessions kept
 * open, draining, until their peers read what is queued or close. session.c holds a reply back
 * while it may not go, and runs the timer that calls session_unread_drain().
 */
#define _GNU_SOURCE
#include "session_unread.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "closer.h"
#include "identity.h"
#include "node.h"
#include "session.h"
#include "unread.h"
#include "users.h"

/* What the group of (user, pod) has not read: its sessions' and its draining sockets'. */
static uint64_t group_unread(const struct node *node, uid_t user, const char *pod) {
        uint64_t group = 0;

        SESSION_FOREACH(c, node)
                if (c->fd >= 0 && users_same_group(c->user, c->pod_uid, user, pod))
                        group += c->unread.fds;
        for (const struct unread_socket *u = node->draining; u; u = u->next)
                if (users_same_group(u->user, u->pod, user, pod))
                        group += u->unread.fds;
        return group;
}

/*
 * A group may have an eighth of the node's budget unread, and one client of it as much, or
 * SESSION_UNREAD_FDS where that is less. Past the budget, up to its ceiling, only a group that
 * holds little (a thirty-second of the budget, two granule leases at least) is sent more: eight
 * groups that do not read fill the budget, and the rest of the node is still served; the
 * groups that hold the most wait.
 */
static uint64_t group_cap(const struct node *node) {
        return node->unread_budget / 8;
}

static uint64_t group_little(const struct node *node) {
        uint64_t little = node->unread_budget / 32;

        return little > 2 * GP_MAX_LEASE_GRANULES ? little : 2 * GP_MAX_LEASE_GRANULES;
}

/*
 * Its own count is read afresh from its socket; the others' as last read (the timer reads them
 * while a reply waits).
 */
enum session_unread_bound session_unread_bound(struct session *s, unsigned n) {
        struct node *node = s->node;
        uint64_t cap = group_cap(node), mine = cap < SESSION_UNREAD_FDS ? cap : SESSION_UNREAD_FDS, group;

        unread_update(&s->unread, s->fd, &node->unread_fds);
        if (!unread_room(&s->unread) || s->unread.fds + n > mine)
                return SESSION_UNREAD_OWN;
        if (node->unread_fds + n > node->unread_ceiling)
                return SESSION_UNREAD_NODE;
        if (node->unread_fds + n <= cap)
                return SESSION_UNREAD_GOES;     /* no group can be past its cap */
        group = group_unread(node, s->user, s->pod_uid);
        if (group + n > cap)
                return SESSION_UNREAD_GROUP;
        if (node->unread_fds + n > node->unread_budget && group + n > group_little(node))
                return SESSION_UNREAD_NODE;
        return SESSION_UNREAD_GOES;
}

/* Names the group of (user, pod) into buf. */
static const char *group_name(uid_t user, const char *pod, char *buf, size_t size) {
        if (pod[0])
                snprintf(buf, size, "pod %s", pod);
        else
                snprintf(buf, size, "user %u", (unsigned) user);
        return buf;
}

void session_unread_why(struct session *s, enum session_unread_bound bound, unsigned n, char *why, size_t why_size) {
        const struct node *node = s->node;
        char name[IDENTITY_POD_UID_LEN + 8];

        if (bound == SESSION_UNREAD_OWN) {
                snprintf(why, why_size, "it has %u descriptors sent to it and not read (of %u replies), its bound",
                         s->unread.fds, s->unread.count);
        } else if (bound == SESSION_UNREAD_GROUP) {
                snprintf(why, why_size, "the clients of %s have %" PRIu64 " descriptors sent to them and not read, "
                         "an eighth of the node's budget of %" PRIu64 ", their bound; its %u more wait for them to read",
                         group_name(s->user, s->pod_uid, name, sizeof(name)),
                         group_unread(node, s->user, s->pod_uid), node->unread_budget, n);
        } else {
                /*
                 * Whose share keeps this reply back: the group of the client (or ended session's
                 * socket) that holds the most, and what that group holds. One pass and one sum,
                 * however many clients wait: each refusal costs the sessions once.
                 */
                uid_t top_user = 0;
                const char *top_pod = "";
                uint64_t most = 0, top = 0;

                SESSION_FOREACH(c, node)
                        if (c->fd >= 0 && c->unread.fds > most) {
                                most = c->unread.fds;
                                top_user = c->user;
                                top_pod = c->pod_uid;
                        }
                for (const struct unread_socket *u = node->draining; u; u = u->next)
                        if (u->unread.fds > most) {
                                most = u->unread.fds;
                                top_user = u->user;
                                top_pod = u->pod;
                        }
                if (most)
                        top = group_unread(node, top_user, top_pod);
                snprintf(why, why_size, "the node has %" PRIu64 " descriptors sent and not read, its budget (%" PRIu64
                         ", and %" PRIu64 " for groups that hold little); the most are a client's of %s, whose clients hold %" PRIu64,
                         node->unread_fds, node->unread_budget, node->unread_ceiling,
                         group_name(top_user, top_pod, name, sizeof(name)), top);
        }
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
                closer_close_socket(s->fd, s->user);    /* its queue may hold descriptors in flight, dropped with it: its user's */
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
                closer_close_socket(u->fd, u->user);
                free(u);
        }
}
