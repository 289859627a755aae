/*
 * node.c: the node's state below the sessions (see node.h): its pools and policy, the
 * set-limit --pid table, the log's rate limit for all clients, and what follows a change.
 */
#define _GNU_SOURCE
#include "node.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <string.h>

#include "log.h"
#include "size.h"

/* Others took part of a device's headroom: the eviction ladder's headroom rungs (evict_keep_headroom()). */
static void on_headroom_timer(uv_timer_t *timer) {
        struct node *node = timer->data;

        if (node->hooks.keep_headroom)
                node->hooks.keep_headroom(node);
}

/*
 * How many descriptors sent may wait unread, node-wide (*budget): half the soft RLIMIT_NOFILE
 * (the kernel refuses the daemon's sends past all of it, unix_inflight), at least two full
 * pipelines of granule leases; and (*ceiling) the most past it, for groups that hold little
 * (session_unread.c): seven eighths of the limit, the rest for a packet's overshoot and the
 * daemon user's other senders.
 */
static void node_unread_limits(uint64_t *budget, uint64_t *ceiling) {
        struct rlimit rl;
        uint64_t cur = 1 << 20;

        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
                cur = rl.rlim_cur;
        *budget = cur / 2 > NODE_UNREAD_MIN ? cur / 2 : NODE_UNREAD_MIN;
        *ceiling = cur / 8 * 7 > *budget ? cur / 8 * 7 : *budget;
}

void node_adopted(struct node *node, unsigned device, uint64_t bytes, bool grow) {
        struct pool_stats st;

        if (!node->backend->adopt_grows)
                return;
        pool_get_stats(node->pools[device], &st);
        pool_set_capacity(node->pools[device], grow ? st.total_bytes + bytes : st.total_bytes - bytes);
        pool_get_stats(node->pools[device], &st);
        node->policy.capacity_bytes[device] = st.total_bytes;
}

int node_device_of(const struct node *node, const char *uuid, uint32_t index, bool by_uuid) {
        char text[BACKEND_UUID_TEXT_MAX];

        if (!by_uuid)
                return index < node->device_count ? (int) index : -ENODEV;
        for (unsigned d = 0; d < node->device_count; d++) {
                if (!node->devices[d].has_uuid)
                        continue;
                backend_uuid_text(node->devices[d].uuid, node->devices[d].mig, text);
                if (strcmp(text, uuid) == 0)
                        return (int) d;
        }
        return -ENODEV;
}

/*
 * Reads the reservations kept in the state directory and finds their GPUs, by UUID where they
 * name one (a GPU gone is said, and its reservations kept: a tool deletes them). Guarantees
 * that no longer fit (a GPU with less room than when they were made) are said, not refused:
 * the pods' reservations stand, and a new one is refused until they fit.
 */
static int load_reservations(struct node *node) {
        char err[600];
        int r;

        if (!node->options->state_dir[0])
                return 0;
        r = reservations_load(node->options->state_dir, &node->reservations, err, sizeof(err));
        if (r < 0) {
                log_err("%s", err);
                return r;
        }
        for (unsigned i = 0; i < node->reservations.count; i++) {
                struct reservation *rv = &node->reservations.r[i];
                int d = node_device_of(node, rv->device_uuid, rv->device, rv->device_uuid[0] != '\0');

                if (d < 0) {
                        rv->absent = true;
                        log_err("reservation %s: its GPU (device %u%s%s) is not among the daemon's %u: kept, and its pods "
                                "belong to the config's tenants until it is deleted or the GPU is back", rv->key, rv->device,
                                rv->device_uuid[0] ? ", " : "", rv->device_uuid, node->device_count);
                        continue;
                }
                if ((unsigned) d != rv->device)
                        log_info("reservation %s: its GPU %s is device %d now (was %u)", rv->key, rv->device_uuid, d, rv->device);
                rv->device = (uint32_t) d;
        }
        policy_reserve(&node->policy, &node->reservations);
        if (policy_check_guarantees(&node->policy, err, sizeof(err)) < 0)
                log_err("%s: the reservations stand, and new ones on it are refused until they fit", err);
        if (node->reservations.count)
                log_info("%u reservation%s read from %s/%s", node->reservations.count,
                         node->reservations.count == 1 ? "" : "s", node->options->state_dir, RESERVATIONS_FILE);
        return 0;
}

int node_init(struct node *node, uv_loop_t *loop, const struct config *config, struct backend *backend) {
        char why[256];
        int r;

        node->loop = loop;
        node->config = *config;
        node->options = &node->config.options;
        node->backend = backend;
        node->device_count = backend->device_count;
        node->next_client_id = 1;
        node->peer_log = (struct log_ratelimit) LOG_RATELIMIT_CLIENTS;
        gp_wire_arena_init(&node->arena);

        node->policy.device_count = node->device_count;
        for (unsigned d = 0; d < node->device_count; d++) {
                struct backend_device_info info;

                r = backend->ops->device_info(backend, d, &info);
                if (r < 0) {
                        log_err("device %u: %s", d, strerror(-r));
                        return r;
                }
                node->devices[d] = info;
                node->policy.capacity_bytes[d] = info.total_bytes;
                r = pool_new(backend, d, info.total_bytes, &node->pools[d]);
                if (r < 0)
                        return r;
        }
        policy_configure(&node->policy, &node->config);
        r = policy_check_guarantees(&node->policy, why, sizeof(why));
        if (r < 0) {
                log_err("%s", why);
                return r;
        }
        r = load_reservations(node);
        if (r < 0)
                return r;
        uv_timer_init(loop, &node->idle_release_timer);
        node->idle_release_timer.data = node;
        node->idle_release_timer_open = true;
        uv_timer_init(loop, &node->reclaim_timer);
        node->reclaim_timer.data = node;
        node->reclaim_timer_open = true;
        uv_timer_init(loop, &node->zero_timer);
        node->zero_timer.data = node;
        node->zero_timer_open = true;
        uv_timer_init(loop, &node->headroom_timer);
        node->headroom_timer.data = node;
        node->headroom_timer_open = true;
        uv_timer_init(loop, &node->unread_timer);
        node->unread_timer.data = node;
        node->unread_timer_open = true;
        uv_timer_init(loop, &node->stock_timer);
        node->stock_timer.data = node;
        node->stock_timer_open = true;
        node_unread_limits(&node->unread_budget, &node->unread_ceiling);
        if (backend->ops->device_memory)
                uv_timer_start(&node->headroom_timer, on_headroom_timer, NODE_HEADROOM_POLL_MS, NODE_HEADROOM_POLL_MS);
        return 0;
}

void node_close(struct node *node) {
        node->stopping = true;
        if (node->idle_release_timer_open) {
                uv_close((uv_handle_t *) &node->idle_release_timer, NULL);
                node->idle_release_timer_open = false;
        }
        if (node->reclaim_timer_open) {
                uv_close((uv_handle_t *) &node->reclaim_timer, NULL);
                node->reclaim_timer_open = false;
        }
        if (node->zero_timer_open) {
                uv_close((uv_handle_t *) &node->zero_timer, NULL);
                node->zero_timer_open = false;
        }
        if (node->headroom_timer_open) {
                uv_close((uv_handle_t *) &node->headroom_timer, NULL);
                node->headroom_timer_open = false;
        }
        if (node->unread_timer_open) {
                uv_close((uv_handle_t *) &node->unread_timer, NULL);
                node->unread_timer_open = false;
        }
        if (node->stock_timer_open) {
                uv_close((uv_handle_t *) &node->stock_timer, NULL);
                node->stock_timer_open = false;
        }
        node_forget_pid_limits(node);
        identity_table_free(&node->identities);
        for (unsigned d = 0; d < node->device_count; d++) {
                pool_free(node->pools[d]);
                node->pools[d] = NULL;
        }
        if (node->backend)
                node->backend->ops->close(node->backend);
        node->backend = NULL;
}

void node_log_writev(struct node *node, enum log_level level, const char *fmt, va_list ap) {
        unsigned suppressed;

        if (!log_ratelimit_pass(&node->peer_log, &suppressed))
                return;
        if (suppressed)
                log_write(LOG_LEVEL_WARN, "%u messages about clients suppressed in the last %u s (rate limit)", suppressed,
                          node->peer_log.interval_ms / 1000);
        log_writev(level, fmt, ap);
}

void node_log_write(struct node *node, enum log_level level, const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        node_log_writev(node, level, fmt, ap);
        va_end(ap);
}

void node_limit_text(const struct node *node, bool per_uid, uid_t uid, uid_t user, const char *pod, char *buf, size_t size) {
        if (per_uid && pod[0])
                snprintf(buf, size, "pod %s already has %u connections, the most one pod may have, whatever uids its "
                         "processes take (max_clients_per_uid; a closed one counts until its process exits)", pod,
                         node->options->max_clients_per_uid);
        else if (per_uid && user != uid)
                snprintf(buf, size, "user %u already has %u connections, the most one user may have (max_clients_per_uid; "
                         "uid %u is one of her subordinate uids; a closed one counts until its process exits)",
                         (unsigned) user, node->options->max_clients_per_uid, (unsigned) uid);
        else if (per_uid)
                snprintf(buf, size, "uid %u already has %u connections, the most one user may have (max_clients_per_uid, "
                         "with her subordinate uids; a closed one counts until its process exits)", (unsigned) uid,
                         node->options->max_clients_per_uid);
        else
                snprintf(buf, size, "the daemon already serves %u clients, its limit (--max-clients; %u of them closed, "
                         "held until their process exits)", node->options->max_clients, node->exiting);
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

/* Forgets set-limits of processes that have exited. */
static void prune_pid_limits(struct node *node) {
        unsigned kept = 0;

        for (unsigned i = 0; i < node->pid_limit_count; i++)
                if (pid_limit_alive(&node->pid_limits[i]))
                        node->pid_limits[kept++] = node->pid_limits[i];
        node->pid_limit_count = kept;
}

void node_forget_pid_limits(struct node *node) {
        node->pid_limit_count = 0;
}

int node_set_pid_limit(struct node *node, pid_t pid, uint64_t max_bytes) {
        struct pid_limit *l = NULL;
        unsigned long long start;

        if (process_start_time(pid, &start) < 0)
                return -ESRCH;
        prune_pid_limits(node);
        for (unsigned i = 0; i < node->pid_limit_count; i++)
                if (node->pid_limits[i].pid == pid)
                        l = &node->pid_limits[i];
        if (!l) {
                if (node->pid_limit_count == NODE_MAX_PID_LIMITS)
                        return -ENOSPC;
                l = &node->pid_limits[node->pid_limit_count++];
                *l = (struct pid_limit) { .pid = pid, .start_time = start };
        }
        l->max_bytes = max_bytes;
        return 0;
}

uint64_t node_pid_limit(struct node *node, pid_t pid) {
        for (unsigned i = 0; i < node->pid_limit_count; i++) {
                struct pid_limit *l = &node->pid_limits[i];

                if (l->pid == pid && pid_limit_alive(l))
                        return l->max_bytes;
        }
        return POLICY_NO_OVERRIDE;
}

int node_check(struct node *node, char *why, size_t why_size) {
        node->checks_total++;
        for (unsigned d = 0; d < node->device_count; d++)
                if (node->pools[d] && pool_check(node->pools[d], why, why_size) < 0)
                        return -EUCLEAN;
        return node->hooks.check ? node->hooks.check(node, why, why_size) : 0;
}

static void on_idle_release_timer(uv_timer_t *timer) {
        struct node *node = timer->data;
        char b[GP_SIZE_FORMAT_MAX];

        for (unsigned d = 0; d < node->device_count; d++) {
                uint64_t bytes = pool_release_idle(node->pools[d], node->options->idle_release_ms, NULL);

                if (bytes)
                        log_info("device %u: released %s of cache idle for idle_release", d, gp_size_format(bytes, b, sizeof(b)));
        }
        node_after_change(node);
}

static void on_reclaim_timer(uv_timer_t *timer) {
        node_after_change(timer->data);
}

/* Zeroings under way: those ended put their segments in the cache, where parked leases find them. */
static void on_zero_timer(uv_timer_t *timer) {
        struct node *node = timer->data;
        unsigned ended = 0;

        for (unsigned d = 0; d < node->device_count; d++)
                ended += pool_poll_zeroing(node->pools[d]);
        node->zeroings_ended += ended;
        if (ended)
                node_after_change(node);        /* retries the parked leases, and polls again if need be */
        else
                uv_timer_start(&node->zero_timer, on_zero_timer, NODE_ZERO_POLL_MS, 0);
}

void node_stock_want(struct node *node, unsigned device, unsigned n) {
        uint64_t want = (uint64_t) node->stock_want[device] + n;

        node->stock_want[device] = want < node->options->granule_stock ? (unsigned) want : node->options->granule_stock;
}

/* Whether a device makes granule segments ahead now: it has fewer than wanted, and no allocation waits. */
static bool stock_short(const struct node *node) {
        if (node->parked)
                return false;
        for (unsigned d = 0; d < node->device_count; d++)
                if (pool_stocked(node->pools[d]) < node->stock_want[d])
                        return true;
        return false;
}

/* Makes one granule segment ahead on each device short of its stock; a device without room stops until its next lease. */
static void on_stock_timer(uv_timer_t *timer) {
        struct node *node = timer->data;

        for (unsigned d = 0; d < node->device_count && !node->parked; d++) {
                int r;

                if (pool_stocked(node->pools[d]) >= node->stock_want[d])
                        continue;
                if ((r = pool_stock(node->pools[d], policy_max_cached(&node->policy, d),
                                    backend_exports_ahead(node->backend, node->options->granule_stock))) < 0) {
                        if (r != -ENOSPC && r != -ENOMEM)
                                log_warn("device %u: making a granule segment ahead: %s", d, strerror(-r));
                        node->stock_want[d] = 0;
                }
                /* Made: what takes them from here on (leases, eviction, a flush) is not made again until the next lease. */
                if (pool_stocked(node->pools[d]) >= node->stock_want[d])
                        node->stock_want[d] = 0;
        }
        node_after_change(node);        /* the cache's timers, and the next one if still short */
}

void node_after_change(struct node *node) {
        uint64_t due = UINT64_MAX;
        char why[256];

        if (node->stopping)
                return;
        /* Allocations waiting for memory to come back: try them, and wake when the first times out. */
        if (node->parked && node->hooks.retry_parked) {
                uint64_t now = uv_now(node->loop), deadline = node->hooks.retry_parked(node, now);

                if (deadline != UINT64_MAX)
                        uv_timer_start(&node->reclaim_timer, on_reclaim_timer, deadline > now ? deadline - now : 0, 0);
                else
                        uv_timer_stop(&node->reclaim_timer);
        } else if (node->reclaim_timer_open) {
                uv_timer_stop(&node->reclaim_timer);
        }
        if (node->zero_timer_open && !uv_is_active((uv_handle_t *) &node->zero_timer))
                for (unsigned d = 0; d < node->device_count; d++)
                        if (pool_zeroing(node->pools[d])) {
                                uv_timer_start(&node->zero_timer, on_zero_timer, NODE_ZERO_POLL_MS, 0);
                                break;
                        }
        for (unsigned d = 0; d < node->device_count; d++) {
                uint64_t next;

                (void) pool_trim_cache(node->pools[d], policy_max_cached(&node->policy, d));
                next = pool_idle_due_ms(node->pools[d], node->options->idle_release_ms);
                if (next < due)
                        due = next;
        }
        /* Between requests: the timer runs once the loop has served what is ready. */
        if (node->stock_timer_open && !uv_is_active((uv_handle_t *) &node->stock_timer) && stock_short(node))
                uv_timer_start(&node->stock_timer, on_stock_timer, 0, 0);
        if (node->idle_release_timer_open) {
                if (node->options->idle_release_ms && due != UINT64_MAX)
                        uv_timer_start(&node->idle_release_timer, on_idle_release_timer, due, 0);
                else
                        uv_timer_stop(&node->idle_release_timer);
        }
        if (node->options->check_invariants && node_check(node, why, sizeof(why)) < 0) {
                log_err("invariant broken: %s", why);
                abort();
        }
}

unsigned node_distrust_get(const struct node *node, uint64_t principal) {
        for (size_t i = 0; i < sizeof(node->distrusted) / sizeof(node->distrusted[0]); i++)
                if (node->distrusted[i].distrust && node->distrusted[i].principal == principal)
                        return node->distrusted[i].distrust;
        return 0;
}

void node_distrust_set(struct node *node, uint64_t principal, unsigned distrust) {
        size_t n = sizeof(node->distrusted) / sizeof(node->distrusted[0]);

        for (size_t i = 0; i < n; i++)
                if (node->distrusted[i].distrust && node->distrusted[i].principal == principal) {
                        node->distrusted[i].distrust = distrust;
                        return;
                }
        if (!distrust)
                return;
        /* A full table forgets the oldest distrusted. */
        node->distrusted[node->distrusted_next].principal = principal;
        node->distrusted[node->distrusted_next].distrust = distrust;
        node->distrusted_next = (node->distrusted_next + 1) % (unsigned) n;
}
