/*
 * server.c: the listening socket, accepting clients, signals and an orderly stop.
 */
#define _GNU_SOURCE
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "closer.h"
#include "evict.h"
#include "identity.h"
#include "log.h"
#include "notify.h"
#include "objects.h"
#include "reclaim.h"
#include "request.h"
#include "session.h"
#include "size.h"
#include "users.h"

static void on_connection(uv_poll_t *handle, int status, int events);

/*
 * Refuses a connection of user (users.h) with one packet saying why, so the client reports it
 * instead of a bare reset. The packet is id 0: the client has not asked anything yet.
 */
static void refuse_client(int fd, uid_t user, int err, const char *why) {
        struct reply rep;

        reply_error(0, err, true, why, &rep);
        (void) gp_wire_send_packet(fd, reply_bytes(&rep), rep.len, -1);
        reply_release(&rep);
        closer_close_socket(fd, user);  /* what it queued before being refused may carry descriptors: its user's */
}

/* Accepting again, once the spare is back: without it the next refusal could not be made. */
static void on_accept_timer(uv_timer_t *timer) {
        struct server *server = timer->data;

        if (server->spare_fd < 0)
                server->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (server->spare_fd < 0)
                uv_timer_start(&server->accept_timer, on_accept_timer, 100, 0);
        else if (server->listen_fd >= 0)
                uv_poll_start(&server->listen_poll, UV_READABLE, on_connection);
}

/*
 * Out of descriptors, accept4() leaves the connection queued and the socket readable: the loop
 * would spin on it. As libuv does, the spare descriptor is given up to accept the connection
 * and refuse it saying why; then accepting pauses for a moment (and the spare comes back).
 */
static void out_of_fds(struct server *server, int err) {
        char why[160];
        int fd;

        snprintf(why, sizeof(why), "the daemon is out of file descriptors (%s); try again later", strerror(err));
        node_log(&server->node, LOG_LEVEL_ERR, "cannot accept a client: out of file descriptors (%s); refusing new ones "
                   "for a moment (see LimitNOFILE= in docs/operations.md)", strerror(err));
        if (server->spare_fd >= 0) {
                close(server->spare_fd);
                server->spare_fd = -1;
                fd = accept4(server->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd >= 0) {
                        struct ucred cred;
                        socklen_t len = sizeof(cred);

                        refuse_client(fd, getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 ?
                                      users_owner(cred.uid, NULL) : CLOSER_UNKNOWN_SENDER, -EIO, why);
                }
        }
        uv_poll_stop(&server->listen_poll);
        uv_timer_start(&server->accept_timer, on_accept_timer, 100, 0);
}

/*
 * Connections of a group (users_same_group(): a pod, or a user outside pods) that count
 * against max_clients_per_uid: open ones, and closed ones whose process has not exited (their
 * memory is held for it), so that a process cannot leave sessions behind without bound by
 * connecting and closing.
 */
static unsigned group_connections(const struct server *server, uid_t user, const char *pod) {
        unsigned n = 0;

        SESSION_FOREACH(c, &server->node)
                n += users_same_group(c->user, c->pod_uid, user, pod) && (c->fd >= 0 || c->state == SESSION_EXITING) &&
                     !c->uncounted;
        /* A socket kept open for what its peer has not read is one of its group's (unread.h). */
        for (const struct unread_socket *u = server->node.draining; u; u = u->next)
                n += users_same_group(u->user, u->pod, user, pod);
        return n;
}

/*
 * Whether process pid has a client without a control channel, and no connection let in past
 * the limits to be that channel yet: its control channel is part of it, not one client more.
 */
static bool control_room(const struct server *server, pid_t pid) {
        bool room = false;

        SESSION_FOREACH(c, &server->node) {
                if (c->pid != pid || c->fd < 0)
                        continue;
                if (c->control_only && c->state == SESSION_NEW)
                        return false;
                if (c->state == SESSION_READY && !c->control && !c->control_of && !c->admin_only)
                        room = true;
        }
        return room;
}

/*
 * Whether a new connection fits --max-clients and max_clients_per_uid; past them, whether it
 * may be a client's control channel or an operator's administrative connection (root and the
 * daemon's user, within NODE_OPERATOR_ROOM). Returns how it is let in (*ret_per_uid says
 * which limit it is past), or -1: refused (the socket is answered and closed).
 */
static int admit(struct server *server, int fd, bool *ret_per_uid) {
        const struct options *o = server->node.options;
        char why[256], cgroup[IDENTITY_MAX_CGROUP], pod[IDENTITY_POD_UID_LEN + 1];
        struct ucred cred;
        socklen_t len = sizeof(cred);
        bool known;
        uid_t user;

        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
                closer_close(fd);
                return -1;
        }
        *ret_per_uid = false;
        /*
         * Its group for the bounds per user: its pod, or its user, whatever subordinate uid she
         * runs it as (users.h; /etc/subuid looked at again when it changed).
         */
        known = identity_read_cgroup(cred.pid, cgroup) == 0;
        if (identity_place(known ? cgroup : NULL, pod) != IDENTITY_POD)
                pod[0] = '\0';
        users_refresh(USERS_SUBUID_PATH, uv_now(server->node.loop));
        user = users_owner(cred.uid, known ? cgroup : NULL);
        /* A user whose descriptors wait to be closed behind closes that do not return may send no more (closer.h). */
        if (closer_backlog(user) >= CLOSER_BACKLOG_MAX) {
                snprintf(why, sizeof(why), "%u descriptors user %u sent wait to be closed behind closes that do not "
                         "return (a FUSE or network file system that does not answer?)", closer_backlog(user),
                         (unsigned) user);
                node_log(&server->node, LOG_LEVEL_WARN, "refusing a client (pid %d, uid %u): %s", (int) cred.pid,
                         (unsigned) cred.uid, why);
                refuse_client(fd, user, -EAGAIN, why);
                return -1;
        }
        if (server->node.connected + server->node.exiting + server->node.draining_count < o->max_clients) {
                *ret_per_uid = group_connections(server, user, pod) >= o->max_clients_per_uid;
                if (!*ret_per_uid)
                        return SESSION_ADMIT_CLIENT;
        }
        if (control_room(server, cred.pid))
                return SESSION_ADMIT_CONTROL_ONLY;
        /* The node's operator's (root or the daemon's user, in no pod or container): in, but its hello must say it is an operator's tool. */
        if (server->node.admin_connected < NODE_OPERATOR_ROOM &&
            identity_is_operator(cred.uid, cred.pid, known ? cgroup : NULL, why, sizeof(why)))
                return SESSION_ADMIT_ADMIN_ONLY;
        node_limit_text(&server->node, *ret_per_uid, cred.uid, user, pod, why, sizeof(why));
        node_log(&server->node, LOG_LEVEL_WARN, "refusing a client (pid %d, uid %u): %s", (int) cred.pid, (unsigned) cred.uid, why);
        refuse_client(fd, user, -EDQUOT, why);
        return -1;
}

static void on_connection(uv_poll_t *handle, int status, int events) {
        struct server *server = handle->data;

        (void) events;
        if (status < 0) {
                log_err("listening socket: %s", uv_strerror(status));
                return;
        }
        /* Accept what is queued, a bounded number at a time. */
        for (int i = 0; i < 64; i++) {
                int fd = accept4(server->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                bool per_uid;
                int r;

                if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
                        out_of_fds(server, errno);
                        return;
                }
                if (fd < 0) {
                        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
                                node_log(&server->node, LOG_LEVEL_WARN, "accept: %s", strerror(errno));
                        return;
                }
                r = admit(server, fd, &per_uid);
                if (r < 0)
                        continue;
                r = session_start(&server->node, fd, (enum session_admission) r, per_uid);
                if (r < 0)
                        node_log(&server->node, LOG_LEVEL_WARN, "cannot start a session: %s", strerror(-r));
        }
}

static void on_signal(uv_signal_t *handle, int signum) {
        struct server *server = handle->data;

        log_info("%s: shutting down", strsignal(signum));
        (void) notify_send("STOPPING=1");
        server_stop(server);
}

/*
 * Binds path. A socket file nobody listens on is a leftover of a crash and is replaced; one
 * that answers belongs to a running daemon, and starting a second is an error. Returns 0, or a
 * negative errno with why (one sentence that says it all).
 */
static int listen_on(const char *path, int *ret_fd, char *why, size_t why_size) {
        struct sockaddr_un addr = { .sun_family = AF_UNIX };
        struct stat st;
        int fd, probe, r;

        snprintf(why, why_size, "cannot listen on %s: %s", path, strerror(ENAMETOOLONG));
        if (strlen(path) >= sizeof(addr.sun_path))
                return -ENAMETOOLONG;
        strcpy(addr.sun_path, path);
        if (lstat(path, &st) == 0) {
                if (!S_ISSOCK(st.st_mode)) {
                        snprintf(why, why_size, "cannot listen on %s: it exists and is not a socket (not replacing it)", path);
                        return -EEXIST;
                }
                if (gp_wire_connect(path, &probe) == 0) {
                        close(probe);
                        snprintf(why, why_size, "cannot listen on %s: another gpupoold is listening there (stop it, or "
                                 "give this one another --socket)", path);
                        return -EADDRINUSE;
                }
                if (unlink(path) < 0) {
                        snprintf(why, why_size, "cannot listen on %s: removing the socket left there: %s", path,
                                 strerror(errno));
                        return -errno;
                }
        }
        fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        if (bind(fd, (struct sockaddr *) &addr, sizeof(addr)) < 0 || listen(fd, 128) < 0) {
                r = -errno;
                snprintf(why, why_size, "cannot listen on %s: %s", path, strerror(-r));
                close(fd);
                return r;
        }
        /* Any local user may connect; what each may have is the policy's to decide. */
        if (chmod(path, 0666) < 0) {
                r = -errno;
                snprintf(why, why_size, "cannot listen on %s: %s", path, strerror(-r));
                close(fd);
                unlink(path);
                return r;
        }
        *ret_fd = fd;
        return 0;
}

static void on_stuck_timer(uv_timer_t *timer) {
        struct server *server = timer->data;

        session_expire_stuck(&server->node);
        /* Requests for memory back that nobody answered in time hold nothing back any more. */
        reclaim_expire(&server->node, uv_now(server->node.loop));
        server_notify_status(server);
}

static void on_watchdog_timer(uv_timer_t *timer) {
        (void) timer;
        (void) notify_send("WATCHDOG=1");
}

void server_notify_status(struct server *server) {
        char line[sizeof(server->status)], state[sizeof(line) + 16], used[32], total[32];
        uint64_t in_use = 0, capacity = 0;
        struct pool_stats st;

        for (unsigned d = 0; d < server->node.device_count; d++) {
                pool_get_stats(server->node.pools[d], &st);
                in_use += st.in_use_bytes;
                capacity += st.total_bytes;
        }
        snprintf(line, sizeof(line), "%u client%s, %s of %s in use on %u device%s", server->node.connected,
                 server->node.connected == 1 ? "" : "s", gp_size_format(in_use, used, sizeof(used)),
                 gp_size_format(capacity, total, sizeof(total)), server->node.device_count, server->node.device_count == 1 ? "" : "s");
        if (strcmp(line, server->status) == 0)
                return;
        snprintf(server->status, sizeof(server->status), "%s", line);
        snprintf(state, sizeof(state), "STATUS=%s", line);
        (void) notify_send(state);
}

static void on_sighup(uv_signal_t *handle, int signum) {
        char why[600];

        (void) signum;
        (void) server_reload(handle->data, why, sizeof(why));
}

/* The server that holds node. */
static struct server *server_of(struct node *node) {
        return (struct server *) ((char *) node - offsetof(struct server, node));
}

static int reload_hook(struct node *node, char *why, size_t why_size) {
        return server_reload(server_of(node), why, why_size);
}

int server_init(struct server *server, uv_loop_t *loop, const struct config *config, int argc, char **argv,
                struct backend *backend) {
        int r;

        server->argc = argc;
        server->argv = argv;
        server->listen_fd = -1;
        server->spare_fd = -1;
        r = node_init(&server->node, loop, config, backend);
        if (r < 0)
                return r;
        /* The layers above the node, joined here: calls go down, events come up through these. */
        server->node.hooks = (struct node_hooks) {
                .request = request_serve,
                .retry_parked = request_retry_parked,
                .check = session_check_tenants,
                .reload = reload_hook,
                .keep_headroom = evict_keep_headroom,
        };
        uv_timer_init(loop, &server->stuck_timer);
        server->stuck_timer.data = server;
        server->stuck_timer_open = true;
        uv_timer_start(&server->stuck_timer, on_stuck_timer, 1000, 1000);
        /* A check once a second never keeps the loop alive by itself. */
        uv_unref((uv_handle_t *) &server->stuck_timer);
        return 0;
}

int server_start(struct server *server, uv_loop_t *loop, const struct config *config, int argc, char **argv,
                 struct backend *backend) {
        int r = server_init(server, loop, config, argc, argv, backend);
        struct notify_passed *passed;
        uint64_t watchdog_usec;
        char why[256];

        if (r < 0)
                return r;
        /*
         * Signals first: once the socket is live a client (or a test) may ask for a stop at
         * once, and a SIGTERM before the handler exists would kill the daemon uncleanly.
         */
        uv_signal_init(loop, &server->sigint);
        uv_signal_init(loop, &server->sigterm);
        uv_signal_init(loop, &server->sighup);
        server->sigint.data = server->sigterm.data = server->sighup.data = server;
        uv_signal_start(&server->sigint, on_signal, SIGINT);
        uv_signal_start(&server->sigterm, on_signal, SIGTERM);
        uv_signal_start(&server->sighup, on_sighup, SIGHUP);
        server->signals_open = true;
        /* A client that vanishes mid-send must not kill the daemon (sends also use MSG_NOSIGNAL). */
        signal(SIGPIPE, SIG_IGN);
        /* Which user each uid is (users.h), said once at start; read again as the file changes. */
        users_refresh(USERS_SUBUID_PATH, uv_now(loop));

        /* Before the socket: once clients can connect, a scrape can too, and the log says where. */
        if (server->node.options->metrics_addr.ss_family != AF_UNSPEC) {
                r = metrics_http_start(&server->node, loop, (const struct sockaddr *) &server->node.options->metrics_addr,
                                       &server->metrics_http);
                if (r < 0)
                        return r;
        }
        if (!(passed = malloc(sizeof(*passed))))
                return -ENOMEM;
        r = notify_listen_fds(passed, why, sizeof(why));
        if (r < 0) {
                free(passed);
                log_err("%s", why);
                return r;
        }
        server->listen_fd = passed->listen_fd;
        passed->listen_fd = -1;
        server->listen_inherited = r > 0;
        /* Before any client: the objects systemd kept for us are there when the first one asks. */
        if (passed->n) {
                unsigned taken = objects_restore(&server->node, passed);

                log_info("took over %u named object%s that systemd kept from the gpupoold before this one", taken,
                         taken == 1 ? "" : "s");
        }
        notify_passed_close(passed);
        free(passed);
        if (!server->listen_inherited)
                r = listen_on(server->node.options->socket_path, &server->listen_fd, why, sizeof(why));
        if (r < 0) {
                log_err("%s", why);
                return r;
        }
        watchdog_usec = notify_watchdog_usec();
        if (watchdog_usec) {
                /* Twice per interval, as sd_watchdog_enabled(3) advises; never what keeps the loop alive. */
                uv_timer_init(loop, &server->watchdog_timer);
                server->watchdog_timer_open = true;
                uv_timer_start(&server->watchdog_timer, on_watchdog_timer, 0, watchdog_usec / 2000 ? watchdog_usec / 2000 : 1);
                uv_unref((uv_handle_t *) &server->watchdog_timer);
        }
        server->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        uv_timer_init(loop, &server->accept_timer);
        server->accept_timer.data = server;
        server->accept_timer_open = true;
        uv_poll_init(loop, &server->listen_poll, server->listen_fd);
        server->listen_poll.data = server;
        uv_poll_start(&server->listen_poll, UV_READABLE, on_connection);
        return 0;
}

/*
 * Grows the descriptor table to need slots at once. The kernel grows it by doubling as
 * descriptors are made, and in a process with threads (the closer's, the CUDA driver's) each
 * doubling waits for an RCU grace period (expand_fdtable()): a fresh daemon's first large
 * leases, or the adoptions after a restart, stalled on every doubling (1 GiB of granules: 23 ms
 * instead of 2, bench-adopt). One wait at start (or at a reload that raises the need) instead.
 */
static void grow_fd_table(uint64_t need) {
        int base, fd;

        if (need < 2 || need > INT_MAX || (base = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0)
                return;
        fd = fcntl(base, F_DUPFD_CLOEXEC, (int) need - 1);
        if (fd >= 0)
                close(fd);
        close(base);
}

/* The memory backend keeps as descriptors with the settings o (options_fds_needed()): its own, and the exports ahead. */
static uint64_t fd_bytes(const struct options *o, const struct backend *backend) {
        return backend->fd_bytes + (uint64_t) backend->device_count * backend_exports_ahead(backend, o->granule_stock) * GP_GRANULE_BYTES;
}

/* The most clients a hard limit of max descriptors leaves room for, with the rest of what o needs. */
static unsigned clients_fitting(const struct options *o, const struct backend *backend, uint64_t max) {
        struct options none = *o;
        uint64_t base;

        none.max_clients = 0;
        base = options_fds_needed(&none, fd_bytes(o, backend));
        return max > base ? (unsigned) ((max - base) / OPTIONS_FDS_PER_CLIENT) : 0;
}

int server_fit_fd_limit(struct options *o, const struct backend *backend, char *why, size_t why_size) {
        bool host = strcmp(backend->name, "host") == 0;
        uint64_t need = options_fds_needed(o, fd_bytes(o, backend));
        char cap[GP_SIZE_FORMAT_MAX], lower[64];
        struct rlimit rl;
        unsigned fit;

        if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
                return -errno;
        if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need) {
                fit = clients_fitting(o, backend, rl.rlim_max);
                /* max_clients as it comes is a ceiling, not a demand: fit it to the limit the node gives. */
                if (o->max_clients == OPTIONS_DEFAULT_MAX_CLIENTS && fit >= OPTIONS_MIN_FITTED_CLIENTS) {
                        log_info("max_clients %u, not the default %u: the hard file descriptor limit is %llu, and each "
                                 "client takes %d (raise LimitNOFILE= or ulimit -Hn for more)", fit, o->max_clients,
                                 (unsigned long long) rl.rlim_max, OPTIONS_FDS_PER_CLIENT);
                        o->max_clients = fit;
                        need = options_fds_needed(o, fd_bytes(o, backend));
                } else {
                        if (fit)
                                snprintf(lower, sizeof(lower), " or lower max_clients to %u", fit);
                        else
                                snprintf(lower, sizeof(lower), "%s", host ? " or lower host_capacity" : "");
                        snprintf(why, why_size, "max_clients %u%s%s needs %llu file descriptors, more than the hard limit "
                                 "of %llu: raise it (LimitNOFILE= in the unit, ulimit -Hn)%s", o->max_clients,
                                 host ? " with a host capacity of " : "",
                                 host ? gp_size_format(o->host_capacity_bytes, cap, sizeof(cap)) : "",
                                 (unsigned long long) need, (unsigned long long) rl.rlim_max, lower);
                        return -EMFILE;
                }
        }
        if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need) {
                grow_fd_table(need);
                return 0;
        }
        rl.rlim_cur = need;
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0) {
                snprintf(why, why_size, "cannot raise the file descriptor limit to %llu: %s", (unsigned long long) need,
                         strerror(errno));
                return -errno;
        }
        log_info("file descriptor limit raised to %llu for max_clients %u", (unsigned long long) need, o->max_clients);
        grow_fd_table(need);
        return 0;
}

/* Settings a reload cannot change in a running daemon: it says so and keeps the old. */
static void keep_fixed(const struct options *old, struct options *o) {
        if (strcmp(old->socket_path, o->socket_path) || old->backend != o->backend ||
            old->host_capacity_bytes != o->host_capacity_bytes || old->headroom_bytes != o->headroom_bytes ||
            memcmp(&old->metrics_addr, &o->metrics_addr, sizeof(o->metrics_addr)) || strcmp(old->state_dir, o->state_dir))
                log_warn("reload: socket, backend, host_capacity, headroom, metrics_listen and state_dir take effect at the "
                         "next start");
        snprintf(o->state_dir, sizeof(o->state_dir), "%s", old->state_dir);
        snprintf(o->socket_path, sizeof(o->socket_path), "%s", old->socket_path);
        o->backend = old->backend;
        o->host_capacity_bytes = old->host_capacity_bytes;
        o->headroom_bytes = old->headroom_bytes;
        o->check_invariants = old->check_invariants;
        o->metrics_addr = old->metrics_addr;
}

/* systemd's reload protocol: RELOADING=1 with the time, then READY=1 once done (or refused). */
static void notify_reloading(void) {
        struct timespec now;
        char state[96];

        clock_gettime(CLOCK_MONOTONIC, &now);
        snprintf(state, sizeof(state), "RELOADING=1\nMONOTONIC_USEC=%llu",
                 (unsigned long long) now.tv_sec * 1000000ULL + (unsigned long long) now.tv_nsec / 1000);
        (void) notify_send(state);
}

/* What a reload reads and checks before it takes any of it: some hundreds of KiB, made for the reload. */
struct reload_state {
        struct config next;
        struct policy policy;
        char warnings[4096];
};

static int reload_with(struct server *server, struct reload_state *x, char *why, size_t why_size) {
        struct node *node = &server->node;
        char err[600];
        int r;

        r = config_load(node->options->config_path, node->options->config_given, &x->next, err, sizeof(err));
        if (r == 0)
                r = options_parse_over(server->argc, server->argv, &x->next.options, &x->next.options, err, sizeof(err));
        if (r == 0) {
                /* Checked apart: a refused reload leaves the running policy, and its sums, untouched. */
                keep_fixed(node->options, &x->next.options);
                x->policy = node->policy;
                policy_configure(&x->policy, &x->next);
                policy_reserve(&x->policy, &node->reservations);
                r = policy_check_guarantees(&x->policy, err, sizeof(err));
        }
        if (r == 0)
                r = server_fit_fd_limit(&x->next.options, node->backend, err, sizeof(err));
        if (r < 0) {
                log_err("reload refused, the running config stays: %s", err);
                snprintf(why, why_size, "%s", err);
                return r;
        }
        /* Every client leaves its old tenant, whose sums go to zero, before the new tenants take their place. */
        session_leave_tenants(node);
        node->policy = x->policy;
        x->next.options.config_path[0] = '\0';
        snprintf(x->next.options.config_path, sizeof(x->next.options.config_path), "%s", node->options->config_path);
        x->next.options.config_given = node->options->config_given;
        node->config = x->next;
        node->options = &node->config.options;
        node_forget_pid_limits(node);           /* set-limit --pid lasts until a reload too */
        SESSION_FOREACH(c, node)
                c->limit_override_bytes = POLICY_NO_OVERRIDE;
        log_open(node->options->log_level);
        session_join_tenants(node);
        if (x->next.file_count)
                snprintf(why, why_size, "reloaded %s: %u file%s, %u tenant%s", node->options->config_path, x->next.file_count,
                         x->next.file_count == 1 ? "" : "s", x->next.tenant_count, x->next.tenant_count == 1 ? "" : "s");
        else
                snprintf(why, why_size, "reloaded: there is no %s, so the defaults and the command line hold (1 tenant, "
                         "default)", node->options->config_path);
        log_info("%s", why);
        (void) config_warnings(&x->next, x->warnings, sizeof(x->warnings));
        log_lines(LOG_LEVEL_WARN, x->warnings);
        node_after_change(node);
        return 0;
}

static int reload(struct server *server, char *why, size_t why_size) {
        struct reload_state *x = malloc(sizeof(*x));
        int r;

        if (!x) {
                snprintf(why, why_size, "out of memory reading the config again");
                log_err("reload refused, the running config stays: %s", why);
                return -ENOMEM;
        }
        r = reload_with(server, x, why, why_size);
        free(x);
        return r;
}

int server_reload(struct server *server, char *why, size_t why_size) {
        int r;

        notify_reloading();
        r = reload(server, why, why_size);
        (void) notify_send("READY=1");
        server_notify_status(server);
        return r;
}

void server_stop(struct server *server) {
        if (server->node.stopping)
                return;
        server->node.stopping = true;   /* nothing more follows a change */
        if (server->signals_open) {
                uv_close((uv_handle_t *) &server->sigint, NULL);
                uv_close((uv_handle_t *) &server->sigterm, NULL);
                uv_close((uv_handle_t *) &server->sighup, NULL);
                server->signals_open = false;
        }
        if (server->stuck_timer_open) {
                uv_close((uv_handle_t *) &server->stuck_timer, NULL);
                server->stuck_timer_open = false;
        }
        if (server->accept_timer_open) {
                uv_close((uv_handle_t *) &server->accept_timer, NULL);
                server->accept_timer_open = false;
        }
        if (server->spare_fd >= 0)
                close(server->spare_fd);
        server->spare_fd = -1;
        if (server->watchdog_timer_open) {
                uv_close((uv_handle_t *) &server->watchdog_timer, NULL);
                server->watchdog_timer_open = false;
        }
        metrics_http_stop(server->metrics_http);
        server->metrics_http = NULL;
        if (server->listen_fd >= 0) {
                uv_close((uv_handle_t *) &server->listen_poll, NULL);
                close(server->listen_fd);
                server->listen_fd = -1;
                if (!server->listen_inherited)
                        unlink(server->node.options->socket_path);
        }
        session_destroy_all(&server->node);
        objects_destroy_all(&server->node);
        /* A seal on libuv's threads uses the backend and its pool: they close once it has ended (the loop runs on until then). */
        if (server->node.seals_in_flight)
                server->node.close_when_sealed = true;
        else
                node_close(&server->node);
}

