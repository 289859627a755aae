/*
 * node.h: the node's state, below the sessions: the settings, the policy, the backend, a pool
 * per device, the counters, the set-limit --pid table, and the head of the sessions' list
 * (walked through session.h's registry). What changes a pool ends in node_after_change(),
 * which holds the cache to its watermark, arms the idle-release timer and checks the
 * invariants.
 *
 * Calls go down: server → requests → sessions → node → policy, pool, backend. What the node
 * needs from above (a request to serve, parked leases to try again, the sessions' own checks,
 * a reload) it reaches through the hooks the server sets at start, as libuv hands events to
 * callbacks.
 */
#ifndef GP_NODE_H
#define GP_NODE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "backend.h"
#include "config.h"
#include "identity.h"
#include "log.h"
#include "unread.h"
#include "options.h"
#include "policy.h"
#include "pool.h"
#include "wire.h"

struct node;
struct object;
struct object_evicted;
struct session;

/*
 * Connections of root and the daemon's user let in past --max-clients and max_clients_per_uid,
 * for administrative requests: silent peers filling the limits cannot lock the operator out.
 */
#define NODE_OPERATOR_ROOM 8

/* Processes with a set-limit --pid at once. */
#define NODE_MAX_PID_LIMITS 64

/* A set-limit --pid: the process (its start time tells a reused pid apart) and its limit. */
struct pid_limit {
        pid_t pid;
        unsigned long long start_time;  /* /proc/PID/stat's starttime, in clock ticks after boot */
        uint64_t max_bytes;             /* per device; 0: no limit */
};

/*
 * What the layers above the node do for it: the only calls that go up, each one function the
 * server plugs in before the first client (server_init() in server.c), each called from one
 * place. grep for the function finds its caller here:
 *
 *   hook           the function                     called from
 *   request        request_serve() (request.c)      session.c, on each request read
 *   retry_parked   request_retry_parked()           node_after_change() (node.c), after every change
 *                  (request_lease.c)
 *   check          session_check_tenants()          node_check() (node.c)
 *                  (session_account.c)
 *   reload         reload_hook() (server.c)         request_admin.c, gpupoolctl reload
 *   keep_headroom  evict_keep_headroom() (evict.c)  on_headroom_timer() (node.c), each NODE_HEADROOM_POLL_MS
 */
struct node_hooks {
        /* Serves one request of session (the request layer): replies, parks or ends it. */
        void (*request)(struct session *session, const Gpupool__Envelope *req);
        /*
         * Tries the parked leases again. Returns the earliest deadline left (loop clock, ms),
         * or UINT64_MAX with none parked.
         */
        uint64_t (*retry_parked)(struct node *node, uint64_t now_ms);
        /* Checks what the sessions keep (tenants' clients and sums). 0, or -EUCLEAN with why. */
        int (*check)(struct node *node, char *why, size_t why_size);
        /* Reads the config again and applies it (the server's: it has the command line). */
        int (*reload)(struct node *node, char *why, size_t why_size);
        /* Frees what others took of the devices' headroom: the cache, then what clients keep free. */
        void (*keep_headroom)(struct node *node);
};

/* How often the loop asks the GPU whether a segment's zeroing has ended: it never waits for it. */
#define NODE_ZERO_POLL_MS 1

/* The least of the node's budget of descriptors unread (node.c): two full pipelines of granule leases. */
#define NODE_UNREAD_MIN (2 * 16 * GP_MAX_LEASE_GRANULES)

/* How often the loop looks whether the clients whose replies wait on their unread descriptors have read them (unread.h). */
#define NODE_UNREAD_POLL_MS 1

/* How often it looks at the sockets of ended sessions kept open while their peers have descriptors unread. */
#define NODE_DRAIN_POLL_MS 100

/* How often the loop reads each GPU's free memory to keep its headroom (a cuMemGetInfo_v2 each). */
#define NODE_HEADROOM_POLL_MS 1000

struct node {
        uv_loop_t *loop;
        const struct options *options;  /* &config.options */
        struct config config;           /* as loaded, with the command line over it */
        struct policy policy;
        struct reservations reservations;       /* the reservations' tenants point into it (policy_reserve()) */
        struct backend *backend;
        struct pool *pools[BACKEND_MAX_DEVICES];
        struct backend_device_info devices[BACKEND_MAX_DEVICES];   /* as the backend described them */
        unsigned device_count;
        struct node_hooks hooks;
        uint64_t reclaims_total[BACKEND_MAX_DEVICES];   /* segments clients gave back when asked */
        uint64_t leases_total[BACKEND_MAX_DEVICES];             /* segments leased */
        uint64_t refusals_total[POLICY_REFUSAL_COUNT];          /* allocations refused, by reason */
        uint64_t checks_total;          /* node_check() runs */
        struct log_ratelimit peer_log;  /* what all clients together may make it log */
        uv_timer_t reclaim_timer;       /* the earliest parked allocation's deadline */
        bool reclaim_timer_open;
        uv_timer_t zero_timer;          /* polls zeroings under way (NODE_ZERO_POLL_MS) */
        bool zero_timer_open;
        uv_timer_t idle_release_timer;         /* fires when the oldest cached segment has idled idle_release */
        bool idle_release_timer_open;
        uv_timer_t headroom_timer;      /* keeps each device's headroom free (NODE_HEADROOM_POLL_MS) */
        bool headroom_timer_open;
        /*
         * The stock of granule segments each device makes ahead (--granule-stock): how many the
         * granule leases there took since it was last made up (at most the option's), and the
         * timer that makes them one at a time between requests while fewer are cached
         * (node_stock_want()).
         */
        unsigned stock_want[BACKEND_MAX_DEVICES];
        uv_timer_t stock_timer;
        bool stock_timer_open;
        /*
         * Descriptors sent that peers have not read (unread.h; session.c's): all of them, the
         * most the node lets be (half the soft RLIMIT_NOFILE, against which the kernel counts
         * them) and past that for groups that hold little (session_unread.c), the sessions
         * whose reply waits for their client to read, the sockets of ended sessions kept open
         * until their peers read or close, and the timer that looks.
         */
        uint64_t unread_fds, unread_budget, unread_ceiling;
        unsigned unread_waiting;
        struct unread_socket *draining;
        unsigned draining_count;
        uv_timer_t unread_timer;
        bool unread_timer_open;
        /* The sessions (session.h's registry keeps the list; the node only holds its head and counts). */
        struct session *sessions;       /* connected and exiting clients */
        unsigned connected;             /* sessions with an open socket, of --max-clients */
        unsigned admin_connected;       /* operators' sessions let in past the limits */
        unsigned exiting;               /* sessions whose socket closed, waiting for their process to exit */
        uint64_t next_client_id;
        unsigned parked;                /* sessions with a parked allocation */
        uint64_t zeroings_ended;        /* zeroings seen to end, all devices: wakes the leases waiting for one */
        unsigned reclaim_outstanding;   /* reclaim requests no client has answered yet */
        struct identity_table identities;       /* the (uid, pod) principals seen */
        /* Principals whose reports of free memory are trusted less (node_distrust_get()), the last 16. */
        struct { uint64_t principal; unsigned distrust; } distrusted[16];
        unsigned distrusted_next;
        uint64_t reclaim_rounds;        /* parked leases that asked clients for memory, ever (their rounds' names) */
        struct pid_limit pid_limits[NODE_MAX_PID_LIMITS];       /* set-limit --pid, until a reload */
        struct object *objects;         /* named objects (objects.h), newest first */
        unsigned object_count;
        struct object_evicted *evicted;         /* the names evicted lately, a ring of OBJECTS_EVICTED_KEPT (or NULL) */
        unsigned evicted_next;
        unsigned pid_limit_count;
        bool stopping;                  /* the daemon stops: nothing more follows a change */
        unsigned seals_in_flight;       /* publishes whose seal runs on libuv's threads (request_objects.c) */
        bool close_when_sealed;         /* stopped with seals in flight: node_close() once the last ends */
        uint8_t recv_buf[GP_MAX_REQUEST_BYTES];
        struct gp_wire_arena arena;     /* the current request's decoded structures */
        /*
         * The descriptors that came with it (an adoption's only), in their order: a handler
         * that keeps one sets its entry to -1; the reader closes the rest after the request.
         */
        int recv_fds[GP_WIRE_MAX_FDS];
        size_t recv_nfds;
};

/*
 * Sets the node up on loop with config (copied) and backend (taken over: node_close() closes
 * it): a pool per device and the policy. Returns 0 or a negative errno, logged.
 */
int node_init(struct node *node, uv_loop_t *loop, const struct config *config, struct backend *backend);

/*
 * The device of index or UUID text (as the backend describes it, "GPU-…"/"MIG-…"): its index,
 * or -ENODEV.
 */
int node_device_of(const struct node *node, const char *uuid, uint32_t index, bool by_uuid);

/* Closes the node's timers and frees its pools and backend; the sessions must be gone. */
void node_close(struct node *node);

/*
 * set-limit --pid: the process pid (not a later process that reuses the pid) may reserve
 * max_bytes per device (0: no limit) until the next reload; the caller applies it to the
 * sessions it has already. Returns 0, -ESRCH when no such process runs, or -ENOSPC when
 * NODE_MAX_PID_LIMITS processes have one already.
 */
int node_set_pid_limit(struct node *node, pid_t pid, uint64_t max_bytes);

/* The set-limit of a new connection of pid: POLICY_NO_OVERRIDE when its process has none. */
uint64_t node_pid_limit(struct node *node, pid_t pid);

/*
 * Memory of bytes on device about to be adopted (grow) or not adopted after all (!grow): where
 * the backend's capacity left it out (backend.adopt_grows), the pool's and policy's capacity
 * grow or shrink by it, so that memory a client held across a restart is counted once.
 */
void node_adopted(struct node *node, unsigned device, uint64_t bytes, bool grow);

/* Forgets every set-limit --pid (a reload, a stop). */
void node_forget_pid_limits(struct node *node);

/*
 * Logs a message that a client's doing caused (its connection, refusals, bad input), under
 * the rate limit for all clients together; session_log() adds the client's own limit.
 */
#define node_log(node, level, ...)                                              \
        do {                                                                    \
                if ((level) <= log_max_level)                                   \
                        node_log_write((node), (level), __VA_ARGS__);           \
        } while (0)
void node_log_write(struct node *node, enum log_level level, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
void node_log_writev(struct node *node, enum log_level level, const char *fmt, va_list ap)
        __attribute__((format(printf, 3, 0)));

/*
 * Why a connection is over --max-clients, or (per_uid) over max_clients_per_uid for its group:
 * pod ("" outside one), else user, the user its uid is (users.h).
 */
void node_limit_text(const struct node *node, bool per_uid, uid_t uid, uid_t user, const char *pod, char *buf, size_t size);

/* Checks every pool, then what the sessions keep (hooks.check). Returns 0, or -EUCLEAN with what is wrong in why. */
int node_check(struct node *node, char *why, size_t why_size);

/*
 * After anything that may have changed a pool: tries the parked leases (and wakes at the
 * first deadline), holds the cache to its watermark, arms the idle-release timer, and with
 * --check-invariants checks everything (aborting on a broken invariant).
 */
/*
 * A granule lease on device took n segments: the device makes as many ahead for the next
 * (with what the leases took since its stock was last made up, at most --granule-stock: the
 * leases of one burst add up), one at a time between requests, in free capacity only
 * (pool_stock()), and not while an allocation waits for memory. Until the next such lease,
 * nothing is made again of what leases, eviction, idle release or a flush take.
 */
void node_stock_want(struct node *node, unsigned device, unsigned n);

void node_after_change(struct node *node);

/*
 * How far principal's reports of free memory are trusted (reclaim.c: its sessions' reports
 * count >> distrust), kept across its sessions so that one that lied does not start trusted
 * again by reconnecting. The table holds the last 16 principals distrusted; others get 0.
 */
unsigned node_distrust_get(const struct node *node, uint64_t principal);
void node_distrust_set(struct node *node, uint64_t principal, unsigned distrust);

#endif
