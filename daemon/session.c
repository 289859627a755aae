/*
 * session.c: one client connection: reading requests, writing replies with back-pressure,
 * and the end of the session: at once after a goodbye, else once the process has exited.
 */
#define _GNU_SOURCE
#include "session.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "closer.h"
#include "log.h"
#include "node.h"
#include "objects.h"
#include "reply.h"
#include "session_unread.h"
#include "users.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

static void on_readable(uv_poll_t *handle, int status, int events);
static void on_process_exit(uv_poll_t *handle, int status, int events);

/*
 * A pidfd for the peer: SO_PEERPIDFD (Linux 6.5) names exactly the process that connected;
 * pidfd_open(pid) is the fallback. -1 when neither works (the process is gone, or the kernel
 * is older than 5.3): then the session's memory is released when the socket closes.
 */
static int peer_pidfd(int fd, pid_t pid) {
        socklen_t len = sizeof(int);
        int pidfd = -1;

        if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) == 0 && pidfd >= 0)
                return pidfd;
        pidfd = (int) syscall(SYS_pidfd_open, pid, 0);
        return pidfd >= 0 ? pidfd : -1;
}

/* Says how many of a client's lines its rate limit held back. */
static void say_suppressed(struct session *s, unsigned suppressed) {
        node_log(s->node, LOG_LEVEL_WARN, "client %llu (pid %d): %u messages suppressed (rate limit)",
                   (unsigned long long) s->id, (int) s->pid, suppressed);
}

void session_log_write(struct session *s, enum log_level level, const char *fmt, ...) {
        unsigned suppressed;
        va_list ap;

        if (!log_ratelimit_pass(&s->log, &suppressed))
                return;
        if (suppressed)
                say_suppressed(s, suppressed);
        va_start(ap, fmt);
        node_log_writev(s->node, level, fmt, ap);
        va_end(ap);
}

int session_start(struct node *node, int fd, enum session_admission how, bool past_uid_cap) {
        bool admin_only = how == SESSION_ADMIT_ADMIN_ONLY;
        enum identity_place place;
        struct ucred cred;
        socklen_t len = sizeof(cred);
        struct session *s;
        int r;

        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
                r = -errno;
                closer_close(fd);
                return r;
        }
        s = calloc(1, sizeof(*s));
        if (s)
                s->owners = calloc(node->device_count, sizeof(*s->owners));
        if (!s || !s->owners) {
                free(s);
                closer_close(fd);
                return -ENOMEM;
        }
        s->node = node;
        s->id = node->next_client_id++;
        s->state = SESSION_NEW;
        s->pid = cred.pid;
        s->uid = cred.uid;
        s->gid = cred.gid;
        strcpy(s->name, "client");
        s->fd = fd;
        s->pidfd = peer_pidfd(fd, cred.pid);
        s->limit_override_bytes = node_pid_limit(node, cred.pid);
        s->log = (struct log_ratelimit) LOG_RATELIMIT_CLIENT;
        s->admin_only = admin_only;
        s->past_uid_cap = past_uid_cap;
        s->control_only = how == SESSION_ADMIT_CONTROL_ONLY;
        s->uncounted = how != SESSION_ADMIT_CLIENT;     /* not one of --max-clients: room beyond them */
        s->connected_ms = uv_now(node->loop);
        /*
         * Its principal: the uid, and the pod its cgroup names. A cgroup that cannot be read
         * (pid 0: a process the daemon's PID namespace cannot see; /proc hidden) or placed (a
         * path relative to the daemon's namespace that names no pod) makes it a principal of its
         * own, whose memory is zeroed whichever way it moves, and never the operator.
         */
        s->cgroup_known = identity_read_cgroup(cred.pid, s->cgroup) == 0;
        place = identity_place(s->cgroup_known ? s->cgroup : NULL, s->pod_uid);
        s->user = users_owner(cred.uid, s->cgroup_known ? s->cgroup : NULL);
        s->principal = identity_principal(&node->identities, (uint32_t) cred.uid, place != IDENTITY_UNPLACED,
                                          place == IDENTITY_POD ? s->pod_uid : NULL, s->id);
        if (place == IDENTITY_UNPLACED && s->cgroup_known)
                session_log(s, LOG_LEVEL_WARN, "client %llu (pid %d, uid %u): cgroup %s is neither the node's, the "
                            "daemon's own container's nor a pod's by the kubelet's names: a principal of its own (its "
                            "memory always zeroed), never the operator", (unsigned long long) s->id, (int) cred.pid,
                            (unsigned) cred.uid, s->cgroup);
        /* A client that lied about its free memory before, from this principal, is not trusted afresh by reconnecting. */
        s->reclaim.distrust = node_distrust_get(node, s->principal);
        s->operator = identity_is_operator(cred.uid, cred.pid, s->cgroup_known ? s->cgroup : NULL, s->not_operator_why,
                                           sizeof(s->not_operator_why));
        for (unsigned d = 0; d < node->device_count; d++)
                pool_owner_attach(node->pools[d], &s->owners[d], s->principal);

        r = uv_poll_init(node->loop, &s->poll, fd);
        if (r < 0) {
                session_release_all(s);
                if (s->pidfd >= 0)
                        close(s->pidfd);
                free(s->owners);
                free(s);
                closer_close(fd);
                return r;
        }
        s->poll.data = s;
        s->poll_open = true;
        uv_poll_start(&s->poll, UV_READABLE, on_readable);

        s->next = node->sessions;
        if (node->sessions)
                node->sessions->prev = s;
        node->sessions = s;
        if (admin_only)
                node->admin_connected++;
        else if (!s->uncounted)
                node->connected++;
        session_log(s, LOG_LEVEL_DEBUG, "client %llu connected: pid %d, uid %u",
                    (unsigned long long) s->id, (int) s->pid, (unsigned) s->uid);
        return 0;
}

void session_release_all(struct session *s) {
        /* Its segments leave its tenant's sums as they go to the cache. */
        for (unsigned d = 0; d < s->node->device_count; d++)
                pool_owner_detach(&s->owners[d]);
}

int session_return(struct session *s, uint64_t segment_id, bool to_backend) {
        struct node *node = s->node;
        uint64_t d = segment_id >> 56;

        if (d >= node->device_count || !s->owners)
                return -ENOENT;
        return pool_return(node->pools[d], &s->owners[d], segment_id, to_backend);
}

bool session_detach(struct session *s, struct object *obj) {
        for (unsigned i = 0; i < s->attached.count; i++)
                if (s->attached.list[i] == obj) {
                        s->attached.list[i] = s->attached.list[--s->attached.count];
                        objects_detach(s->node, obj);
                        return true;
                }
        return false;
}

void session_forget_reclaims(struct session *s) {
        s->node->reclaim_outstanding -= s->reclaim.outstanding;
        s->reclaim.outstanding = 0;
        s->reclaim.to_backend = 0;
}

static void session_free(struct session *s) {
        free(s->lease);
        free(s->pending);
        free(s->pending_fds);
        free(s->owners);
        free(s);
}

/* A session is freed once it is closed and libuv has let go of both its handles. */
static void on_handle_closed(uv_handle_t *handle) {
        struct session *s = handle->data;

        if (handle == (uv_handle_t *) &s->poll)
                s->poll_open = false;
        else
                s->pid_poll_open = false;
        if (s->state == SESSION_CLOSED && !s->poll_open && !s->pid_poll_open)
                session_free(s);
}

static void unread_arm(struct node *node);

/* Closes the session's socket, or keeps it open, draining, while its peer has descriptors unread. */
static void drop_socket(struct session *s) {
        if (s->unread_wait) {
                s->unread_wait = false;
                s->node->unread_waiting--;
        }
        if (!session_unread_keep_socket(s))
                return;
        session_log(s, LOG_LEVEL_WARN, "client %llu (pid %d, uid %u): %u descriptors sent to it unread; its socket stays "
                    "open, one of its user's connections, until it reads them or closes it",
                    (unsigned long long) s->id, (int) s->pid, (unsigned) s->uid, s->unread.fds);
        unread_arm(s->node);
}

/* Stops watching the socket and closes it. */
static void close_socket(struct session *s) {
        if (s->fd < 0)
                return;
        if (s->admin_only)
                s->node->admin_connected--;
        else if (!s->uncounted)
                s->node->connected--;
        uv_close((uv_handle_t *) &s->poll, on_handle_closed);
        drop_socket(s);
        s->fd = -1;
        /* A reply that waited for the client has nowhere to go now. */
        free(s->pending);
        s->pending = NULL;
        free(s->pending_fds);
        s->pending_fds = NULL;
}

void session_destroy(struct session *s) {
        struct node *node = s->node;

        if (s->state == SESSION_CLOSED)
                return;
        if (s->state == SESSION_EXITING)
                node->exiting--;
        s->state = SESSION_CLOSED;
        if (s->log.suppressed)
                say_suppressed(s, s->log.suppressed);
        if (s->parked) {
                s->parked = false;
                node->parked--;
        }
        session_forget_reclaims(s);     /* it will not answer now */
        session_release_all(s);
        /* Its process has exited, or said bye having unmapped everything: it has nothing attached now. */
        while (s->attached.count)
                objects_detach(node, s->attached.list[--s->attached.count]);
        free(s->attached.list);
        s->attached.list = NULL;
        s->attached.cap = 0;
        session_set_tenant(s, NULL);
        if (s->control_of) {
                struct session *c = s->control_of;

                /* What its client was asked on this channel will not be answered now: nothing waits on it. */
                session_forget_reclaims(c);
                c->control = NULL;
        }
        s->control_of = NULL;
        if (s->control)
                session_destroy(s->control);    /* a control channel serves one client only */
        if (s->prev)
                s->prev->next = s->next;
        else
                node->sessions = s->next;
        if (s->next)
                s->next->prev = s->prev;
        s->prev = s->next = NULL;

        if (s->pid_poll_open && !uv_is_closing((uv_handle_t *) &s->pid_poll))
                uv_close((uv_handle_t *) &s->pid_poll, on_handle_closed);
        if (s->pidfd >= 0)
                close(s->pidfd);
        s->pidfd = -1;
        if (s->fd >= 0)
                close_socket(s);
        if (!s->poll_open && !s->pid_poll_open)
                session_free(s);
}

struct session *session_find(const struct node *node, uint64_t id) {
        SESSION_FOREACH(c, node)
                if (c->id == id)
                        return c;
        return NULL;
}

ssize_t session_collect(const struct node *node, bool (*pick)(const struct session *c, const void *arg), const void *arg,
                        struct session ***ret) {
        struct session **list;
        size_t n = 0;

        *ret = NULL;
        SESSION_FOREACH(c, node)
                n += pick(c, arg);
        if (!n)
                return 0;
        /* However many: sessions are bounded by the node's limits, not here. */
        list = calloc(n, sizeof(*list));
        if (!list)
                return -ENOMEM;
        n = 0;
        SESSION_FOREACH(c, node)
                if (pick(c, arg))
                        list[n++] = c;
        *ret = list;
        return (ssize_t) n;
}

void session_destroy_all(struct node *node) {
        while (node->sessions)
                session_destroy(node->sessions);
        /* The daemon stops: what its peers left unread goes with its sockets. */
        while (node->draining) {
                struct unread_socket *u = node->draining;

                node->draining = u->next;
                node->unread_fds -= u->unread.fds;
                closer_close_socket(u->fd, u->user);
                free(u);
        }
        node->draining_count = 0;
}

/*
 * The socket is gone. After a goodbye, or with nothing held, the session ends now. Otherwise
 * its memory waits for the process to exit; without a pidfd there is nothing to wait on, and
 * the memory goes back now (logged, since the process may still be running).
 */
static void session_disconnect(struct session *s, const char *why) {
        uint64_t reserved, in_use, segments, charged;
        int r;

        /* Once only: an exiting session's memory is its live process's until the pidfd says it exited. */
        if (s->state == SESSION_EXITING || s->state == SESSION_CLOSED)
                return;
        session_totals(s, &reserved, &in_use, &segments, &charged);
        /* Memory it charged from outside the pool is its process's while that lives: held too. */
        reserved += charged;
        /* At info only for a client whose hello was logged at info: the pair of lines. */
        if (s->control_of || !s->tenant || s->admin_tool)
                session_log(s, LOG_LEVEL_DEBUG, "client %llu (pid %d) closed: %s",
                            (unsigned long long) s->id, (int) s->pid, why);
        else
                session_log(s, LOG_LEVEL_INFO, "client %llu ('%s', pid %d, uid %u, tenant %s) disconnected: %s",
                            (unsigned long long) s->id, s->name,
                            (int) s->pid, (unsigned) s->uid, s->tenant->conf.name, why);
        if (s->said_bye || reserved == 0 || s->pidfd < 0) {
                if (!s->said_bye && reserved && s->pidfd < 0)
                        session_log(s, LOG_LEVEL_WARN,
                                    "client %llu (pid %d): no pidfd to wait on; releasing its memory at disconnect",
                                    (unsigned long long) s->id, (int) s->pid);
                session_destroy(s);
                return;
        }
        close_socket(s);
        s->state = SESSION_EXITING;
        s->node->exiting++;
        r = uv_poll_init(s->node->loop, &s->pid_poll, s->pidfd);
        if (r < 0) {
                /*
                 * The process may well be alive and mapping its memory: it stays reserved, and
                 * the stuck timer asks the pidfd once a second instead (session_expire_stuck()).
                 */
                s->pid_polled = true;
                session_log(s, LOG_LEVEL_WARN, "client %llu (pid %d): cannot watch its pidfd (%s); its memory stays "
                            "reserved, and whether its process exited is checked once a second",
                            (unsigned long long) s->id, (int) s->pid, uv_strerror(r));
                return;
        }
        s->pid_poll.data = s;
        s->pid_poll_open = true;
        uv_poll_start(&s->pid_poll, UV_READABLE, on_process_exit);
}

/* The process of an exiting session has exited: its memory goes back. */
static void session_exited(struct session *s) {
        struct node *node = s->node;
        uint64_t reserved, in_use, segments, charged;

        session_totals(s, &reserved, &in_use, &segments, &charged);
        session_log(s, LOG_LEVEL_INFO, "client %llu (%s, pid %d) exited holding %llu segment%s; %llu bytes return to the cache",
                    (unsigned long long) s->id, s->name, (int) s->pid, (unsigned long long) segments,
                    segments == 1 ? "" : "s", (unsigned long long) reserved);
        session_destroy(s);
        node_after_change(node);
}

static void on_process_exit(uv_poll_t *handle, int status, int events) {
        (void) status, (void) events;
        session_exited(handle->data);
}

/*
 * Sends buf with descriptors of the reply's segments: the session's own, or (rf->owner) a named
 * object's, opened for reading only where rf->read_only. Each is made now (the backend's
 * mem_export) and closed once sent, so that the daemon holds no descriptor per segment; one the
 * client no longer leases (it returned it on its control channel while the reply waited) is never
 * sent (-ENOENT).
 */
static int send_with_fds(struct session *s, const uint8_t *buf, size_t len, const struct reply_fds *rf) {
        int fds[GP_MAX_LEASE_GRANULES] = { 0 };  /* (gcc 12 cannot tell that only those made are sent) */
        unsigned n = rf ? rf->n : 0, made = 0;
        int r = 0, queued = 0;

        /* Past what the client, its group or the node may leave unread, the reply waits (-EBUSY): s->unread_bound says which. */
        if (n && (s->unread_bound = session_unread_bound(s, n)) != SESSION_UNREAD_GOES)
                return -EBUSY;
        queued = n ? unread_queue_bytes(s->fd) : 0;
        for (; made < n; made++) {
                const struct pool_owner *o = rf->owner ? rf->owner : &s->owners[rf->device];

                if ((r = pool_leased_export(s->node->pools[rf->device], o, rf->segments[made], rf->read_only)) < 0)
                        break;
                fds[made] = r;
                r = 0;
        }
        if (r == 0)
                r = gp_wire_send_packet_fds(s->fd, buf, len, fds, n);
        if (r == 0 && n)
                unread_sent(&s->unread, s->fd, queued, n, &s->node->unread_fds);
        while (made--)
                close(fds[made]);
        return r;
}

/* Why a send failed, for the disconnect. */
static const char *send_error(int r) {
        if (r == -ENOENT)
                return "it returned a segment its lease's reply had not brought yet";
        if (r == -EMFILE || r == -ENFILE)
                return "the daemon is out of file descriptors for the segments it sends (raise LimitNOFILE= or lower "
                       "max_clients)";
        return strerror(-r);
}

static void flush_pending(struct session *s);

static bool pick_unread_wait(const struct session *c, const void *arg) {
        (void) arg;
        return c->unread_wait;
}

/*
 * Every NODE_UNREAD_POLL_MS while a reply waits for its client to read, else every
 * NODE_DRAIN_POLL_MS while a socket drains: reads what each peer has read since, closes the
 * draining sockets read to the end (or closed by their peers), and sends the waiting replies
 * that fit now.
 */
static void on_unread_timer(uv_timer_t *timer) {
        struct node *node = timer->data;
        struct session **waiting;
        ssize_t n;

        session_unread_drain(node);
        if (node->unread_waiting && (n = session_collect(node, pick_unread_wait, NULL, &waiting)) > 0) {
                for (ssize_t i = 0; i < n; i++)
                        flush_pending(waiting[i]);      /* may end that session, never another */
                free(waiting);
        }
        unread_arm(node);
}

static void unread_arm(struct node *node) {
        uint64_t ms = node->unread_waiting ? NODE_UNREAD_POLL_MS : node->draining ? NODE_DRAIN_POLL_MS : 0;

        if (!node->unread_timer_open || node->stopping)
                return;
        if (!ms) {
                uv_timer_stop(&node->unread_timer);
                return;
        }
        if (!uv_is_active((uv_handle_t *) &node->unread_timer) || uv_timer_get_repeat(&node->unread_timer) != ms)
                uv_timer_start(&node->unread_timer, on_unread_timer, ms, ms);
}

/* The session's pending reply waits for its client to read what it was sent: nothing more is read from it meanwhile. */
static void unread_wait(struct session *s) {
        s->unread_wait = true;
        s->node->unread_waiting++;
        uv_poll_stop(&s->poll);
        session_log(s, LOG_LEVEL_DEBUG, "client %llu (pid %d): %u descriptors sent to it unread; its next reply waits "
                    "until it reads", (unsigned long long) s->id, (int) s->pid, s->unread.fds);
        unread_arm(s->node);
}

bool session_send(struct session *s, struct reply *rep) {
        int r;

        if (rep->none)
                return true;
        r = send_with_fds(s, reply_bytes(rep), rep->len, &rep->fds);
        if (r == -EAGAIN || r == -EBUSY) {
                /* The reply's bytes wait with the session: taken over when they are the reply's own memory. */
                s->pending = rep->heap ? rep->heap : malloc(rep->len);
                if (!s->pending) {
                        session_disconnect(s, "out of memory for a reply");
                        return false;
                }
                if (!rep->heap)
                        memcpy(s->pending, rep->inline_bytes, rep->len);
                rep->heap = NULL;
                s->pending_len = rep->len;
                s->pending_since_ms = uv_now(s->node->loop);
                session_log(s, LOG_LEVEL_DEBUG, "client %llu (pid %d): its socket is full; holding a reply until it reads",
                            (unsigned long long) s->id, (int) s->pid);
                if (rep->fds.n) {
                        s->pending_fds = malloc(sizeof(*s->pending_fds));
                        if (!s->pending_fds) {
                                session_disconnect(s, "out of memory for a reply");
                                return false;
                        }
                        *s->pending_fds = rep->fds;
                }
                /* Stop reading until the client reads: one pending reply per client at most. */
                if (r == -EBUSY)
                        unread_wait(s);
                else
                        uv_poll_start(&s->poll, UV_WRITABLE, on_readable);
                return true;
        }
        reply_release(rep);
        if (r < 0) {
                session_disconnect(s, send_error(r));
                return false;
        }
        if (rep->disconnect) {
                session_disconnect(s, "protocol error");
                return false;
        }
        return true;
}

/*
 * A reply that others' unread descriptors (its group's bound or the node's) held back for
 * send_timeout: not its client's fault, which reads what it is sent. It is refused instead,
 * saying why, and what it gave is taken back (a lease's segments to the pool, an attached
 * object detached); the client keeps its connection and is read from again.
 */
static void refuse_held(struct session *s, uint64_t waited_ms) {
        struct reply_fds *rf = s->pending_fds;
        struct node *node = s->node;
        char bound[GP_MAX_ERROR_BYTES - 96], why[GP_MAX_ERROR_BYTES];
        struct reply rep;

        session_unread_why(s, s->unread_bound, rf->n, bound, sizeof(bound));
        snprintf(why, sizeof(why), "its reply's %u descriptor%s could not be sent in %llu ms (send_timeout): %s", rf->n,
                 rf->n == 1 ? "" : "s", (unsigned long long) waited_ms, bound);
        session_log(s, LOG_LEVEL_WARN, "client %llu (%s, pid %d, uid %u): refusing a request: %s",
                    (unsigned long long) s->id, s->name, (int) s->pid, (unsigned) s->uid, why);
        if (rf->object)
                (void) session_detach(s, rf->object);
        else
                for (unsigned i = 0; i < rf->n; i++)
                        pool_lease_undo(node->pools[rf->device], &s->owners[rf->device], rf->segments[i]);
        node->refusals_total[POLICY_REFUSED_UNREAD]++;
        reply_error(rf->request_id, -ENOMEM, false, why, &rep);
        free(s->pending);
        s->pending = NULL;
        free(s->pending_fds);
        s->pending_fds = NULL;
        s->unread_wait = false;
        node->unread_waiting--;
        if (session_send(s, &rep) && !s->pending && !s->held)
                uv_poll_start(&s->poll, UV_READABLE, on_readable);
        node_after_change(node);        /* what came back may be what a parked lease waits for */
}

void session_expire_stuck(struct node *node) {
        uint64_t now = uv_now(node->loop), limit = node->options->send_timeout_ms;
        uint64_t hello = node->options->hello_timeout_ms;
        struct session *s = node->sessions;

        while (s) {
                struct session *next = s->next;

                /* The next one may be this one's control channel, which ends with it: skip past it. */
                if (next && next == s->control)
                        next = next->next;
                if (s->state == SESSION_NEW && hello && now - s->connected_ms >= hello) {
                        session_log(s, LOG_LEVEL_WARN,
                                    "client %llu (pid %d, uid %u) said no hello in %llu ms (hello_timeout); "
                                    "disconnecting it", (unsigned long long) s->id, (int) s->pid, (unsigned) s->uid,
                                    (unsigned long long) (now - s->connected_ms));
                        session_disconnect(s, "no hello in time");
                } else if (s->state == SESSION_EXITING && s->pid_polled) {
                        struct pollfd pfd = { .fd = s->pidfd, .events = POLLIN };

                        if (poll(&pfd, 1, 0) > 0)
                                session_exited(s);
                } else if (s->fd >= 0 && s->pending && limit && now - s->pending_since_ms >= limit &&
                           s->unread_wait && s->unread_bound != SESSION_UNREAD_OWN) {
                        refuse_held(s, now - s->pending_since_ms);
                } else if (s->fd >= 0 && s->pending && limit && now - s->pending_since_ms >= limit) {
                        session_log(s, LOG_LEVEL_WARN,
                                    "client %llu (%s, pid %d) has not read a reply for %llu ms; disconnecting it",
                                    (unsigned long long) s->id, s->name, (int) s->pid,
                                    (unsigned long long) (now - s->pending_since_ms));
                        session_disconnect(s, "did not read its replies");
                }
                s = next;
        }
}

void session_park(struct session *s) {
        s->parked = true;
        s->node->parked++;
        uv_poll_stop(&s->poll);
}

void session_unpark(struct session *s) {
        s->parked = false;
        s->node->parked--;
        if (s->fd >= 0 && !s->pending)
                uv_poll_start(&s->poll, UV_READABLE, on_readable);
}

void session_hold(struct session *s) {
        s->held = true;
        uv_poll_stop(&s->poll);
}

void session_resume(struct session *s) {
        s->held = false;
        if (s->fd >= 0 && !s->pending && !s->parked)
                uv_poll_start(&s->poll, UV_READABLE, on_readable);
}

int session_push(struct session *s, Gpupool__Envelope *env) {
        uint8_t buf[GP_MAX_REQUEST_BYTES];
        int n;

        if (s->fd < 0 || s->pending)
                return -EAGAIN;
        env->version = GP_PROTOCOL_VERSION;
        env->id = 0;
        n = gp_wire_pack(env, buf, sizeof(buf));
        if (n < 0)
                return n;
        return gp_wire_send_packet(s->fd, buf, (size_t) n, -1);
}

static void flush_pending(struct session *s) {
        int r = send_with_fds(s, s->pending, s->pending_len, s->pending_fds);

        /* Waiting for the client to read some descriptors, or, those read, for room in its socket. */
        if (r == -EBUSY) {
                if (!s->unread_wait)
                        unread_wait(s);
                return;
        }
        if (s->unread_wait) {
                s->unread_wait = false;
                s->node->unread_waiting--;
        }
        if (r == -EAGAIN) {
                uv_poll_start(&s->poll, UV_WRITABLE, on_readable);
                return;
        }
        free(s->pending);
        s->pending = NULL;
        free(s->pending_fds);
        s->pending_fds = NULL;
        if (r < 0) {
                session_disconnect(s, send_error(r));
                return;
        }
        if (!s->held)
                uv_poll_start(&s->poll, UV_READABLE, on_readable);
}

/*
 * Closes the descriptors of the request just read that no handler kept: through the closer,
 * never close(2) in the loop, counted as sender's (closer.h).
 */
static void drop_fds(struct node *node, uid_t sender) {
        for (size_t i = 0; i < node->recv_nfds; i++)
                if (node->recv_fds[i] >= 0)
                        closer_close_from(node->recv_fds[i], sender);
        node->recv_nfds = 0;
}

static void on_readable(uv_poll_t *handle, int status, int events) {
        struct session *s = handle->data;
        struct node *node = s->node;
        Gpupool__Envelope *req = NULL;
        unsigned backlog;
        int n, r;

        if (status < 0) {
                session_disconnect(s, uv_strerror(status));
                return;
        }
        if (s->pending) {
                if (events & UV_WRITABLE)
                        flush_pending(s);
                return;
        }
        /* A parked allocation (or a held request) is this client's one request in flight: nothing to read until it is answered. */
        if (s->parked || s->held)
                return;
        (void) unread_update(&s->unread, s->fd, &node->unread_fds);
        /*
         * What its user sent waits to be closed behind closes that do not return (the closer
         * holds its closes to CLOSER_PER_SENDER threads): nothing more is taken from it.
         */
        if ((backlog = closer_backlog(s->user)) >= CLOSER_BACKLOG_MAX) {
                session_log(s, LOG_LEVEL_WARN, "client %llu (pid %d, uid %u): %u descriptors its user sent wait to be "
                            "closed behind closes that do not return (a FUSE or network file system that does not "
                            "answer?); disconnecting it", (unsigned long long) s->id, (int) s->pid, (unsigned) s->uid,
                            backlog);
                session_disconnect(s, "what its user sent waits to be closed");
                return;
        }
        /*
         * One request per wake-up. Clients wait for each reply, so a wake-up finds one: reading
         * on until EAGAIN would cost a system call per request for nothing. A client that sends
         * several at once is served one per turn of the loop (the poll is level-triggered).
         */
        n = gp_wire_recv_packet_fds(s->fd, node->recv_buf, sizeof(node->recv_buf), node->recv_fds, &node->recv_nfds);
        if (n <= 0)
                drop_fds(node, s->user);
        if (n == -EAGAIN)
                return;
        if (n == 0) {
                session_disconnect(s, "closed its socket");
                return;
        }
        if (n < 0) {
                session_log(s, LOG_LEVEL_WARN, "client %llu (pid %d): %s; disconnecting it",
                            (unsigned long long) s->id, (int) s->pid,
                            n == -EMSGSIZE ? "packet over the request size limit" :
                            n == -EBADMSG ? "malformed packet (empty, or with descriptors only)" : strerror(-n));
                session_disconnect(s, "bad packet");
                return;
        }
        node->arena.used = 0;
        r = gp_wire_unpack_with(node->recv_buf, (size_t) n, &node->arena.allocator, &req);
        /* Only an adoption carries descriptors: with any other request they make the packet malformed. */
        if (r < 0)
                drop_fds(node, s->user);
        if (r == 0 && node->recv_nfds && req->body_case != GPUPOOL__ENVELOPE__BODY_ADOPT) {
                gp_wire_arena_release(&node->arena, req);
                drop_fds(node, s->user);
                session_log(s, LOG_LEVEL_WARN, "client %llu (pid %d): malformed packet (descriptors with a request "
                            "other than an adoption); disconnecting it", (unsigned long long) s->id, (int) s->pid);
                session_disconnect(s, "bad packet");
                return;
        }
        if (r == -EPROTONOSUPPORT) {
                char why[128];

                snprintf(why, sizeof(why), "this daemon speaks gpupool protocol version %d only: the client's libgpupool "
                         "is of another release", GP_PROTOCOL_VERSION);
                struct reply rep;

                reply_error(0, r, true, why, &rep);
                (void) session_send(s, &rep);
                return;
        }
        if (r < 0) {
                session_log(s, LOG_LEVEL_WARN, "client %llu (pid %d): message does not parse; disconnecting it",
                            (unsigned long long) s->id, (int) s->pid);
                session_disconnect(s, "unparsable message");
                return;
        }
        /* request_serve() (node.h's hooks): replies, parks or ends the session: s may be gone after this. */
        node->hooks.request(s, req);
        gp_wire_arena_release(&node->arena, req);
        drop_fds(node, s->user);
}
