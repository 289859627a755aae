/*
 * session.h: one connected client: its identity (SO_PEERCRED), its declared name, its part of
 * each device's pool, and its socket. When the socket closes without a goodbye, the session
 * lives on, holding the client's memory, until the client's process has exited (pidfd): a
 * dying process's GPU work may still write its blocks until then.
 */
#ifndef GP_SESSION_H
#define GP_SESSION_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "identity.h"
#include "log.h"
#include "policy.h"
#include "pool.h"
#include "node.h"
#include "reply.h"
#include "session_unread.h"
#include "unread.h"
#include "wire.h"

struct node;
struct evict_lease;

enum session_state {
        SESSION_NEW,            /* connected, no hello yet */
        SESSION_READY,          /* hello done */
        SESSION_EXITING,        /* socket closed; waiting for the process to exit */
        SESSION_CLOSED,         /* everything released; handles closing */
};

/*
 * What reclaim.c keeps of a client it asks for memory back: its file's alone, but for the
 * trust a new session starts with (its principal's, session_start()) and the session's end,
 * which drops what it left unanswered (session_forget_reclaims()).
 */
struct session_reclaim {
        unsigned outstanding;           /* requests it has not answered yet */
        /*
         * Of those, oldest in the lowest bit: the ones whose segments go back to the backend,
         * not to the cache (flush --tenant). It answers in order, so the first answer is the
         * lowest bit's. At most RECLAIM_MAX_OUTSTANDING are asked at a time.
         */
        uint64_t to_backend;
        uint64_t since_ms;              /* loop clock: since when its oldest unanswered request has waited, about */
        /* What it claimed to hold free for the requests outstanding (as asked), and what it gave back of it. */
        uint64_t claimed_bytes, given_bytes;
        /*
         * How far its reports are trusted in whom to ask: its held-free bytes count as
         * reported >> distrust. One more for each round of requests it did not honour (gave
         * back less than half its claim, or let expire), one less for each it honoured.
         */
        unsigned distrust;
        uint64_t asked_for;             /* the waiting lease's round it was last asked for (evict_lease.round) */
};

struct session {
        struct node *node;
        uint64_t id;
        enum session_state state;
        pid_t pid;
        uid_t uid;
        uid_t user;                     /* the user uid is (users.h): what the bounds per user count */
        gid_t gid;
        char name[GP_MAX_NAME_BYTES + 1];
        /* Its cgroup v2 path and pod (identity.h), read at connect; unknown: a principal of its own. */
        bool cgroup_known;
        char cgroup[IDENTITY_MAX_CGROUP];
        char pod_uid[IDENTITY_POD_UID_LEN + 1];        /* "" outside a pod */
        uint64_t principal;             /* whom its memory is zeroed between (pool_owner_attach()) */
        bool operator;                  /* the node's operator (identity_is_operator()): administrative requests */
        char not_operator_why[160];     /* else why not, for the refusal */
        struct tenant *tenant;          /* from hello on; NULL before, and for a control channel */
        /*
         * The named objects it has attached (objects.h), each once: request_objects.c's, but
         * for the session's end, which detaches them.
         */
        struct {
                struct object **list;
                unsigned count, cap;
        } attached;
        struct session *control;        /* its control channel (reclaim requests), or NULL */
        struct session *control_of;     /* for a control channel: the client it serves */
        bool uncounted;                 /* a control channel: not one of --max-clients */
        bool admin_only;                /* an operator's let in past the limits: administrative requests only */
        bool admin_tool;                /* its hello said admin (gpupoolctl): its coming and going logged at debug */
        bool control_only;              /* let in past the limits as a client's control channel: its hello must say so */
        bool past_uid_cap;              /* for admin_only: past max_clients_per_uid, else past --max-clients */
        uint64_t connected_ms;          /* when it connected (loop clock), for the hello deadline */
        /* Asked for memory back: reclaim.c's (struct session_reclaim). */
        struct session_reclaim reclaim;
        /* Its lease waiting (parked) for memory to come back, or for a zeroing (evict.c's ladder). */
        bool parked;
        bool held;                      /* its request's work runs off the loop (session_hold()) */
        /*
         * The lease it asked for last, on its way down the eviction ladder (evict.h): the
         * request layer's (request_lease.c) and the ladder's, made at its first lease and
         * freed with the session; NULL before.
         */
        struct evict_lease *lease;
        uint64_t limit_override_bytes;  /* gpupoolctl set-limit --pid (0: no limit); POLICY_NO_OVERRIDE: none */
        int fd;
        int pidfd;              /* -1 when the kernel gave none */
        uv_poll_t poll;
        uv_poll_t pid_poll;
        bool poll_open, pid_poll_open;
        bool pid_polled;        /* exiting, and its pidfd could not be watched: the stuck timer polls it */
        bool said_bye;
        uint8_t *pending;       /* a reply the socket had no room for */
        uint64_t pending_since_ms;      /* loop clock */
        size_t pending_len;
        struct reply_fds *pending_fds;  /* the descriptors that go with it, or NULL */
        /*
         * What the client has not read of the descriptors sent to it (unread.h), and whether its
         * pending reply waits for it to read some (past its bound, its group's or the node's)
         * rather than for room in its socket.
         */
        struct unread unread;
        bool unread_wait;
        enum session_unread_bound unread_bound;         /* which bound it waits for (its own: its fault) */
        struct pool_owner *owners;      /* one per device */
        /*
         * Memory its process allocated outside the pool, from the driver (cuMemCreate under
         * gpupool-run), that it charged to its limits (ChargeRequest): counted against them and
         * its tenant's (tenant->charged_bytes), never in the pool, gone with the session.
         */
        uint64_t charged_bytes[BACKEND_MAX_DEVICES];
        struct log_ratelimit log;       /* what this client may make the daemon log */
        struct session *prev, *next;
};

/*
 * Logs a message the client caused (bad input, refusals, its coming and going) under its own
 * rate limit and then the one for all clients (node_log()): no client can flood the log.
 */
#define session_log(session, level, ...)                                        \
        do {                                                                    \
                if ((level) <= log_max_level)                                   \
                        session_log_write((session), (level), __VA_ARGS__);     \
        } while (0)
void session_log_write(struct session *session, enum log_level level, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

/* How a connection was let in (the server's admit()). */
enum session_admission {
        SESSION_ADMIT_CLIENT,           /* within --max-clients and max_clients_per_uid */
        /* Past them: an operator's (NODE_OPERATOR_ROOM), whose hello must say admin, for administrative requests only. */
        SESSION_ADMIT_ADMIN_ONLY,
        /* Past them: the control channel of a client of the same process that has none yet, which its hello must name. */
        SESSION_ADMIT_CONTROL_ONLY,
};

/*
 * Takes an accepted socket, let in as how says; past_uid_cap: past max_clients_per_uid, else
 * past --max-clients (for the refusal's text). Returns 0 or a negative errno (the socket is
 * closed then).
 */
int session_start(struct node *node, int fd, enum session_admission how, bool past_uid_cap);

/* Ends a session now, whatever its state: its memory is released. For shutdown. */
void session_destroy(struct session *session);

/*
 * The registry of node's sessions, connected and exiting, newest first: every walk over them
 * goes through it. The body may not end a session: a walk that may (sending can) collects
 * first (session_collect()).
 */
#define SESSION_FOREACH(c, node) for (struct session *c = (node)->sessions; c; c = c->next)

/* The session of client id, or NULL. */
struct session *session_find(const struct node *node, uint64_t id);

/*
 * The sessions that pick() chooses (given arg), in a new array (free() it) at *ret, for a
 * walk that may end sessions as it goes. Returns how many, 0 with none, or -ENOMEM.
 */
ssize_t session_collect(const struct node *node, bool (*pick)(const struct session *c, const void *arg), const void *arg,
                        struct session ***ret);

/* Ends every session (the daemon stops). */
void session_destroy_all(struct node *node);

/*
 * Checks what the sessions keep: each tenant counts its clients and sums their bytes per
 * device. Returns 0, or -EUCLEAN with what is wrong in why (the node's check hook).
 */
int session_check_tenants(struct node *node, char *why, size_t why_size);

/*
 * The most descriptors one client may have sent to it and not read: a full pipeline of the
 * library's granule leases (CLIENT_PIPELINE of GP_MAX_LEASE_GRANULES), or an eighth of the
 * node's budget where that is less. A client's group (users_same_group()) may have
 * an eighth of the node's budget (session_unread.c); past either, or the node's, its next
 * reply with descriptors waits (unread.h). After --send-timeout one held at its own bound is
 * dropped with the client; one held at its group's or the node's is refused, saying why.
 */
#define SESSION_UNREAD_FDS (16 * GP_MAX_LEASE_GRANULES)

/* Sums of a session's parts over all devices (session_account.c): leased, reported in use, segments, charged. */
void session_totals(const struct session *session, uint64_t *ret_reserved, uint64_t *ret_in_use, uint64_t *ret_segments,
                    uint64_t *ret_charged);

/*
 * Counts bytes of memory outside the pool on device to the session and its tenant (a
 * ChargeRequest), or (release) stops counting them: -EINVAL, nothing changed, for more than
 * the session has charged there.
 */
int session_charge(struct session *session, unsigned device, uint64_t bytes, bool release);

/* Takes obj off the session's attached objects, detaching it (objects_detach()); false where it had not attached it. */
bool session_detach(struct session *session, struct object *obj);

/* Releases everything the client holds (it unmapped all, or its process is gone). */
void session_release_all(struct session *session);

/*
 * Once a second: disconnects sessions that said no hello within hello_timeout or whose pending
 * reply has waited longer than the send timeout, and ends exiting sessions whose process
 * exited where its pidfd could not be watched.
 */
void session_expire_stuck(struct node *node);

/*
 * Sends a reply, taking it (its bytes wait with the session until the socket drains, or are
 * freed). Returns false if the session ended.
 */
bool session_send(struct session *session, struct reply *rep);

/* Parks the session's current request: nothing more is read from it until session_unpark(). */
void session_park(struct session *session);
void session_unpark(struct session *session);

/*
 * Holds the session's current request while work for it runs off the loop (a seal): nothing
 * more is read from it until session_resume(), which the work's end calls with its reply.
 */
void session_hold(struct session *session);
void session_resume(struct session *session);

/* Sends a message the daemon pushes (id 0) without blocking. Returns 0 or a negative errno. */
int session_push(struct session *session, Gpupool__Envelope *env);

/*
 * The client unmapped a segment leased to it whole: it goes to the cache (or with to_backend
 * to the backend). Returns 0, or -ENOENT for a segment not leased whole to the client.
 */
int session_return(struct session *session, uint64_t segment_id, bool to_backend);

/* Forgets the reclaim requests the client has not answered (they count as answered with nothing). */
void session_forget_reclaims(struct session *session);

/* Moves the client to tenant t (NULL: none), carrying its reserved bytes along. */
void session_set_tenant(struct session *session, struct tenant *t);

/* The tenant the policy gives the client now: its pod's reservation, else the config's rules. */
struct tenant *session_tenant_of(struct session *session);

/*
 * Before the policy's tenants are made anew (a reload, a reservation put or deleted): every
 * client and named object leaves its tenant, whose sums go to zero.
 */
void session_leave_tenants(struct node *node);

/*
 * After: every client (a control channel is part of its client, in no tenant) and named object
 * joins its tenant under the policy now, carrying its bytes.
 */
void session_join_tenants(struct node *node);

#endif
