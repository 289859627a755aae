/*
 * server.c: the listening socket, accepting clients, signals and an orderly stop.
 */
#define _GNU_SOURCE
#include "server.h"

#include <errno.h>
#include <fcntl.h>
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
#include "log.h"
#include "notify.h"
#include "request.h"
#include "session.h"
#include "size.h"

static void on_connection(uv_poll_t *handle, int status, int events);

/*
 * Refuses a connection with one packet saying why, so the client reports it instead of a bare
 * reset. The packet is id 0: the client has not asked anything yet.
 */
static void refuse_client(int fd, int err, const char *why) {
        struct reply rep;

        request_error_reply(0, err, true, why, &rep);
        (void) gp_wire_send_packet(fd, reply_bytes(&rep), rep.len, -1);
        reply_release(&rep);
        closer_close(fd);       /* what it queued before being refused may carry descriptors */
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
        server_log(server, LOG_LEVEL_ERR, "cannot accept a client: out of file descriptors (%s); refusing new ones "
                   "for a moment (see LimitNOFILE= in docs/operations.md)", strerror(err));
        if (server->spare_fd >= 0) {
                close(server->spare_fd);
                server->spare_fd = -1;
                fd = accept4(server->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd >= 0)
                        refuse_client(fd, -EIO, why);
        }
        uv_poll_stop(&server->listen_poll);
        uv_timer_start(&server->accept_timer, on_accept_timer, 100, 0);
}

/* Open connections of uid that count against the limits. */
static unsigned uid_connections(const struct server *server, uid_t uid) {
        unsigned n = 0;

        for (const struct session *c = server->sessions; c; c = c->next)
                n += c->uid == uid && c->fd >= 0 && !c->uncounted;
        return n;
}

/* Says which limit a refused connection is past. */
void server_limit_text(const struct server *server, bool per_uid, uid_t uid, char *buf, size_t size) {
        if (per_uid)
                snprintf(buf, size, "uid %u already has %u connections, the most one uid may have (max_clients_per_uid)",
                         (unsigned) uid, server->options->max_clients_per_uid);
        else
                snprintf(buf, size, "the daemon already serves %u clients, its limit (--max-clients)",
                         server->options->max_clients);
}

/*
 * Whether process pid has a client without a control channel, and no connection let in past
 * the limits to be that channel yet: its control channel is part of it, not one client more.
 */
static bool control_room(const struct server *server, pid_t pid) {
        bool room = false;

        for (const struct session *c = server->sessions; c; c = c->next) {
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
 * daemon's user, within SERVER_OPERATOR_ROOM). Returns how it is let in (*ret_per_uid says
 * which limit it is past), or -1: refused (the socket is answered and closed).
 */
static int admit(struct server *server, int fd, bool *ret_per_uid) {
        const struct options *o = server->options;
        struct ucred cred;
        socklen_t len = sizeof(cred);
        char why[160];

        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
                closer_close(fd);
                return -1;
        }
        *ret_per_uid = false;
        if (server->connected < o->max_clients) {
                *ret_per_uid = uid_connections(server, cred.uid) >= o->max_clients_per_uid;
                if (!*ret_per_uid)
                        return SESSION_ADMIT_CLIENT;
        }
        if (control_room(server, cred.pid))
                return SESSION_ADMIT_CONTROL_ONLY;
        /* Root's and the daemon's own: in, but its hello must say it is an operator's tool. */
        if ((cred.uid == 0 || cred.uid == geteuid()) && server->admin_connected < SERVER_OPERATOR_ROOM)
                return SESSION_ADMIT_ADMIN_ONLY;
        server_limit_text(server, *ret_per_uid, cred.uid, why, sizeof(why));
        server_log(server, LOG_LEVEL_WARN, "refusing a client (pid %d, uid %u): %s", (int) cred.pid, (unsigned) cred.uid, why);
        refuse_client(fd, -EDQUOT, why);
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
                                server_log(server, LOG_LEVEL_WARN, "accept: %s", strerror(errno));
                        return;
                }
                r = admit(server, fd, &per_uid);
                if (r < 0)
                        continue;
                r = session_start(server, fd, (enum session_admission) r, per_uid);
                if (r < 0)
                        server_log(server, LOG_LEVEL_WARN, "cannot start a session: %s", strerror(-r));
        }
}

void server_log_writev(struct server *server, enum log_level level, const char *fmt, va_list ap) {
        unsigned suppressed;

        if (!log_ratelimit_pass(&server->peer_log, &suppressed))
                return;
        if (suppressed)
                log_write(LOG_LEVEL_WARN, "%u messages about clients suppressed in the last %u s (rate limit)", suppressed,
                          server->peer_log.interval_ms / 1000);
        log_writev(level, fmt, ap);
}

void server_log_write(struct server *server, enum log_level level, const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        server_log_writev(server, level, fmt, ap);
        va_end(ap);
}

static void on_signal(uv_signal_t *handle, int signum) {
        struct server *server = handle->data;

        log_info("%s: shutting down", strsignal(signum));
        (void) notify_send("STOPPING=1");
        server_stop(server);
}

/*
 * Binds path. A socket file nobody listens on is a leftover of a crash and is replaced; one
 * that answers belongs to a running daemon, and starting a second is an error.
 */
static int listen_on(const char *path, int *ret_fd) {
        struct sockaddr_un addr = { .sun_family = AF_UNIX };
        struct stat st;
        int fd, probe, r;

        if (strlen(path) >= sizeof(addr.sun_path))
                return -ENAMETOOLONG;
        strcpy(addr.sun_path, path);
        if (lstat(path, &st) == 0) {
                if (!S_ISSOCK(st.st_mode)) {
                        log_err("%s exists and is not a socket; not replacing it", path);
                        return -EEXIST;
                }
                if (gp_wire_connect(path, &probe) == 0) {
                        close(probe);
                        log_err("another gpupoold is listening on %s", path);
                        return -EADDRINUSE;
                }
                if (unlink(path) < 0)
                        return -errno;
        }
        fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        if (bind(fd, (struct sockaddr *) &addr, sizeof(addr)) < 0 || listen(fd, 128) < 0) {
                r = -errno;
                close(fd);
                return r;
        }
        /* Any local user may connect; what each may have is the policy's to decide. */
        if (chmod(path, 0666) < 0) {
                r = -errno;
                close(fd);
                unlink(path);
                return r;
        }
        *ret_fd = fd;
        return 0;
}

/*
 * Maps every client to its tenant under a freshly configured policy (whose sums are zero),
 * carrying its reserved bytes. A control channel is part of its client and in no tenant.
 */
static void map_clients(struct server *server) {
        for (struct session *c = server->sessions; c; c = c->next)
                if ((c->state == SESSION_READY || c->state == SESSION_EXITING) && !c->control_of)
                        session_set_tenant(c, policy_tenant_for(&server->policy, c->uid, c->gid, c->name));
}

static void on_decay_timer(uv_timer_t *timer) {
        struct server *server = timer->data;
        char b[GP_SIZE_FORMAT_MAX];

        for (unsigned d = 0; d < server->device_count; d++) {
                uint64_t bytes = pool_release_idle(server->pools[d], server->options->idle_release_ms, NULL);

                if (bytes)
                        log_info("device %u: released %s of cache idle for idle_release", d, gp_size_format(bytes, b, sizeof(b)));
        }
        server_after_change(server);
}

static void on_stuck_timer(uv_timer_t *timer) {
        session_expire_stuck(timer->data);
        server_notify_status(timer->data);
}

static void on_watchdog_timer(uv_timer_t *timer) {
        (void) timer;
        (void) notify_send("WATCHDOG=1");
}

void server_notify_status(struct server *server) {
        char line[sizeof(server->status)], state[sizeof(line) + 16], used[32], total[32];
        uint64_t in_use = 0, capacity = 0;
        struct pool_stats st;

        for (unsigned d = 0; d < server->device_count; d++) {
                pool_get_stats(server->pools[d], &st);
                in_use += st.in_use_bytes;
                capacity += st.total_bytes;
        }
        snprintf(line, sizeof(line), "%u client%s, %s of %s in use on %u device%s", server->connected,
                 server->connected == 1 ? "" : "s", gp_size_format(in_use, used, sizeof(used)),
                 gp_size_format(capacity, total, sizeof(total)), server->device_count, server->device_count == 1 ? "" : "s");
        if (strcmp(line, server->status) == 0)
                return;
        snprintf(server->status, sizeof(server->status), "%s", line);
        snprintf(state, sizeof(state), "STATUS=%s", line);
        (void) notify_send(state);
}

static void on_reclaim_timer(uv_timer_t *timer) {
        server_after_change(timer->data);
}

static void on_sighup(uv_signal_t *handle, int signum) {
        char why[600];

        (void) signum;
        (void) server_reload(handle->data, why, sizeof(why));
}

int server_init(struct server *server, uv_loop_t *loop, const struct config *config, int argc, char **argv,
                struct backend *backend) {
        char why[256];
        int r;

        server->loop = loop;
        server->config = *config;
        server->options = &server->config.options;
        server->argc = argc;
        server->argv = argv;
        server->backend = backend;
        server->device_count = backend->device_count;
        server->next_client_id = 1;
        server->listen_fd = -1;
        server->spare_fd = -1;
        server->peer_log = (struct log_ratelimit) LOG_RATELIMIT_CLIENTS;
        gp_wire_arena_init(&server->arena);

        server->policy.device_count = server->device_count;
        for (unsigned d = 0; d < server->device_count; d++) {
                struct backend_device_info info;

                r = backend->ops->device_info(backend, d, &info);
                if (r < 0) {
                        log_err("device %u: %s", d, strerror(-r));
                        return r;
                }
                server->devices[d] = info;
                server->policy.capacity_bytes[d] = info.total_bytes;
                r = pool_new(backend, d, info.total_bytes, &server->pools[d]);
                if (r < 0)
                        return r;
        }
        policy_configure(&server->policy, &server->config);
        r = policy_check_guarantees(&server->policy, why, sizeof(why));
        if (r < 0) {
                log_err("%s", why);
                return r;
        }
        uv_timer_init(loop, &server->decay_timer);
        server->decay_timer.data = server;
        server->decay_timer_open = true;
        uv_timer_init(loop, &server->reclaim_timer);
        server->reclaim_timer.data = server;
        server->reclaim_timer_open = true;
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

        /* Before the socket: once clients can connect, a scrape can too, and the log says where. */
        if (server->options->metrics_addr.ss_family != AF_UNSPEC) {
                r = metrics_http_start(server, loop, (const struct sockaddr *) &server->options->metrics_addr,
                                       &server->metrics_http);
                if (r < 0)
                        return r;
        }
        r = notify_listen_fd(&server->listen_fd, why, sizeof(why));
        if (r < 0) {
                log_err("%s", why);
                return r;
        }
        server->listen_inherited = r > 0;
        if (!server->listen_inherited)
                r = listen_on(server->options->socket_path, &server->listen_fd);
        if (r < 0) {
                log_err("cannot listen on %s: %s", server->options->socket_path, strerror(-r));
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
 * The start time of process pid (field 22 of /proc/PID/stat): with the pid it names one process
 * for good, where a pid alone may be reused. Returns 0, or -ESRCH when no such process runs.
 */
static int process_start_time(pid_t pid, unsigned long long *ret) {
        /* pid (comm) state and 19 numbers come before field 22: comm is at most 64 bytes, each number 20. */
        char path[64], buf[64 + 32 + 21 * 21], *p;
        FILE *f;
        size_t n;

        snprintf(path, sizeof(path), "/proc/%d/stat", (int) pid);
        f = fopen(path, "re");
        if (!f)
                return -ESRCH;
        n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        /* The name in parentheses may hold anything: the fields count from its last ')'. */
        p = strrchr(buf, ')');
        if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
                         ret) != 1)
                return -ESRCH;
        return 0;
}

/* Whether the set-limit l still names a running process. */
static bool pid_limit_alive(const struct pid_limit *l) {
        unsigned long long start;

        return process_start_time(l->pid, &start) == 0 && start == l->start_time;
}

/* Forgets set-limits of processes that have exited, or every one (a reload). */
static void prune_pid_limits(struct server *server, bool all) {
        unsigned kept = 0;

        for (unsigned i = 0; i < server->pid_limit_count; i++)
                if (!all && pid_limit_alive(&server->pid_limits[i]))
                        server->pid_limits[kept++] = server->pid_limits[i];
        server->pid_limit_count = kept;
}

int server_set_pid_limit(struct server *server, pid_t pid, uint64_t max_bytes) {
        struct pid_limit *l = NULL;
        unsigned long long start;

        if (process_start_time(pid, &start) < 0)
                return -ESRCH;
        prune_pid_limits(server, false);
        for (unsigned i = 0; i < server->pid_limit_count; i++)
                if (server->pid_limits[i].pid == pid)
                        l = &server->pid_limits[i];
        if (!l) {
                if (server->pid_limit_count == SERVER_MAX_PID_LIMITS)
                        return -ENOSPC;
                l = &server->pid_limits[server->pid_limit_count++];
                *l = (struct pid_limit) { .pid = pid, .start_time = start };
        }
        l->max_bytes = max_bytes;
        for (struct session *c = server->sessions; c; c = c->next)
                if (c->pid == pid)
                        c->limit_override_bytes = max_bytes;
        return 0;
}

uint64_t server_pid_limit(struct server *server, pid_t pid) {
        for (unsigned i = 0; i < server->pid_limit_count; i++) {
                struct pid_limit *l = &server->pid_limits[i];

                if (l->pid == pid && pid_limit_alive(l))
                        return l->max_bytes;
        }
        return POLICY_NO_OVERRIDE;
}

int server_fit_fd_limit(const struct options *o, const struct backend *backend, char *why, size_t why_size) {
        bool host = strcmp(backend->name, "host") == 0;
        uint64_t need = options_fds_needed(o, host);
        char cap[GP_SIZE_FORMAT_MAX];
        struct rlimit rl;

        if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
                return -errno;
        if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need)
                return 0;
        if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need) {
                snprintf(why, why_size, "max_clients %u%s%s needs %llu file descriptors, more than the hard limit of %llu: "
                         "raise it (LimitNOFILE= in the unit, ulimit -Hn) or lower max_clients", o->max_clients,
                         host ? " with a host capacity of " : "", host ? gp_size_format(o->host_capacity_bytes, cap, sizeof(cap)) : "",
                         (unsigned long long) need, (unsigned long long) rl.rlim_max);
                return -EMFILE;
        }
        rl.rlim_cur = need;
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0) {
                snprintf(why, why_size, "cannot raise the file descriptor limit to %llu: %s", (unsigned long long) need,
                         strerror(errno));
                return -errno;
        }
        log_info("file descriptor limit raised to %llu for max_clients %u", (unsigned long long) need, o->max_clients);
        return 0;
}

/* Settings a reload cannot change in a running daemon: it says so and keeps the old. */
static void keep_fixed(const struct options *old, struct options *o) {
        if (strcmp(old->socket_path, o->socket_path) || old->backend != o->backend ||
            old->host_capacity_bytes != o->host_capacity_bytes || old->headroom_bytes != o->headroom_bytes ||
            memcmp(&old->metrics_addr, &o->metrics_addr, sizeof(o->metrics_addr)))
                log_warn("reload: socket, backend, host_capacity, headroom and metrics_listen take effect at the next start");
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

static int reload(struct server *server, char *why, size_t why_size) {
        static struct config next;     /* large; reloads run one at a time on the loop */
        static struct policy policy;
        static char warnings[4096];
        char err[600];
        int r;

        r = config_load(server->options->config_path, server->options->config_given, &next, err, sizeof(err));
        if (r == 0)
                r = options_parse_over(server->argc, server->argv, &next.options, &next.options, err, sizeof(err));
        if (r == 0) {
                /* Checked apart: a refused reload leaves the running policy, and its sums, untouched. */
                keep_fixed(server->options, &next.options);
                policy = server->policy;
                policy_configure(&policy, &next);
                r = policy_check_guarantees(&policy, err, sizeof(err));
        }
        if (r == 0)
                r = server_fit_fd_limit(&next.options, server->backend, err, sizeof(err));
        if (r < 0) {
                log_err("reload refused, the running config stays: %s", err);
                snprintf(why, why_size, "%s", err);
                return r;
        }
        /* Every client leaves its old tenant, whose sums go to zero, before the new tenants take their place. */
        for (struct session *c = server->sessions; c; c = c->next)
                if (c->tenant)
                        session_set_tenant(c, NULL);
        server->policy = policy;
        next.options.config_path[0] = '\0';
        snprintf(next.options.config_path, sizeof(next.options.config_path), "%s", server->options->config_path);
        next.options.config_given = server->options->config_given;
        server->config = next;
        server->options = &server->config.options;
        prune_pid_limits(server, true);         /* set-limit --pid lasts until a reload too */
        for (struct session *c = server->sessions; c; c = c->next)
                c->limit_override_bytes = POLICY_NO_OVERRIDE;
        log_open(server->options->log_level);
        map_clients(server);
        snprintf(why, why_size, "reloaded %s: %u file%s, %u tenant%s", server->options->config_path, next.file_count,
                 next.file_count == 1 ? "" : "s", next.tenant_count, next.tenant_count == 1 ? "" : "s");
        log_info("%s", why);
        (void) config_warnings(&next, warnings, sizeof(warnings));
        log_lines(LOG_LEVEL_WARN, warnings);
        server_after_change(server);
        return 0;
}

int server_reload(struct server *server, char *why, size_t why_size) {
        int r;

        notify_reloading();
        r = reload(server, why, why_size);
        (void) notify_send("READY=1");
        server_notify_status(server);
        return r;
}

static void free_pools(struct server *server) {
        for (unsigned d = 0; d < server->device_count; d++) {
                pool_free(server->pools[d]);
                server->pools[d] = NULL;
        }
        if (server->backend)
                server->backend->ops->close(server->backend);
        server->backend = NULL;
}

void server_stop(struct server *server) {
        if (server->stopping)
                return;
        server->stopping = true;
        if (server->signals_open) {
                uv_close((uv_handle_t *) &server->sigint, NULL);
                uv_close((uv_handle_t *) &server->sigterm, NULL);
                uv_close((uv_handle_t *) &server->sighup, NULL);
                server->signals_open = false;
        }
        if (server->decay_timer_open) {
                uv_close((uv_handle_t *) &server->decay_timer, NULL);
                server->decay_timer_open = false;
        }
        if (server->reclaim_timer_open) {
                uv_close((uv_handle_t *) &server->reclaim_timer, NULL);
                server->reclaim_timer_open = false;
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
                        unlink(server->options->socket_path);
        }
        while (server->sessions)
                session_destroy(server->sessions);
        prune_pid_limits(server, true);
        free_pools(server);
}

/* Invariant 4's bookkeeping: each tenant's sums are its clients' reserved bytes. */
static int check_tenants(struct server *server, char *why, size_t why_size) {
        for (unsigned i = 0; i < server->policy.tenant_count; i++) {
                struct tenant *t = &server->policy.tenants[i];
                unsigned clients = 0;

                for (struct session *c = server->sessions; c; c = c->next)
                        clients += c->tenant == t;
                if (clients != t->clients) {
                        snprintf(why, why_size, "tenant %s counts %u clients, has %u", t->conf.name, t->clients, clients);
                        return -EUCLEAN;
                }
                for (unsigned d = 0; d < server->device_count; d++) {
                        uint64_t sum = 0, in_use = 0;

                        for (struct session *c = server->sessions; c; c = c->next)
                                if (c->tenant == t) {
                                        sum += c->owners[d].reserved_bytes;
                                        in_use += c->owners[d].reported_in_use_bytes;
                                }
                        if (sum != t->sums[d].reserved_bytes || in_use != t->sums[d].in_use_bytes) {
                                snprintf(why, why_size, "tenant %s counts %llu bytes (%llu in use) on device %u, its clients "
                                         "hold %llu (%llu in use)", t->conf.name,
                                         (unsigned long long) t->sums[d].reserved_bytes,
                                         (unsigned long long) t->sums[d].in_use_bytes, d, (unsigned long long) sum,
                                         (unsigned long long) in_use);
                                return -EUCLEAN;
                        }
                }
        }
        return 0;
}

int server_check(struct server *server, char *why, size_t why_size) {
        server->checks_total++;
        for (unsigned d = 0; d < server->device_count; d++)
                if (server->pools[d] && pool_check(server->pools[d], why, why_size) < 0)
                        return -EUCLEAN;
        return check_tenants(server, why, why_size);
}

void server_after_change(struct server *server) {
        uint64_t due = UINT64_MAX;
        char why[256];

        if (server->stopping)
                return;
        /* Allocations waiting for memory to come back: try them, and wake when the first times out. */
        if (server->parked) {
                uint64_t now = uv_now(server->loop), deadline = request_retry_parked(server, now);

                if (deadline != UINT64_MAX)
                        uv_timer_start(&server->reclaim_timer, on_reclaim_timer, deadline > now ? deadline - now : 0, 0);
                else
                        uv_timer_stop(&server->reclaim_timer);
        } else if (server->reclaim_timer_open) {
                uv_timer_stop(&server->reclaim_timer);
        }
        for (unsigned d = 0; d < server->device_count; d++) {
                uint64_t next;

                (void) pool_trim_cache(server->pools[d], policy_max_cached(&server->policy, d));
                next = pool_idle_due_ms(server->pools[d], server->options->idle_release_ms);
                if (next < due)
                        due = next;
        }
        if (server->decay_timer_open) {
                if (server->options->idle_release_ms && due != UINT64_MAX)
                        uv_timer_start(&server->decay_timer, on_decay_timer, due, 0);
                else
                        uv_timer_stop(&server->decay_timer);
        }
        if (server->options->check_invariants && server_check(server, why, sizeof(why)) < 0) {
                log_err("invariant broken: %s", why);
                abort();
        }
}
