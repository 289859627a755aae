/*
 * request.c: the handlers behind each request of the protocol (docs/protocol.md).
 *
 * A handler checks everything the client sent before it acts, answers with a status and, on
 * failure, a sentence a person can act on: what was asked, what limit or state refused it.
 * Messages out of order, or of a kind only the daemon sends, get an error reply and the
 * client's disconnection.
 */
#include "request.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "evict.h"
#include "log.h"
#include "node.h"
#include "identity.h"
#include "reclaim.h"
#include "session.h"
#include "size.h"

_Static_assert(POOL_BLOCK_ALIGN == GP_BLOCK_ALIGN, "the pool rounds blocks as the protocol says");

static void handle_hello(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        struct node *node = s->node;
        Gpupool__DeviceInfo infos[BACKEND_MAX_DEVICES], *info_ptrs[BACKEND_MAX_DEVICES];
        Gpupool__HelloReply hr = GPUPOOL__HELLO_REPLY__INIT;
        Gpupool__Envelope env;
        const char *name = req->hello->name;

        if (s->state != SESSION_NEW) {
                reply_error(req->id, -EPROTO, true, "hello sent twice", ret);
                return;
        }
        if (name && !gp_wire_name_is_valid(name)) {
                reply_error(req->id, -EINVAL, true,
                            "the client name must be 1 to 63 bytes of UTF-8 with no control characters", ret);
                return;
        }
        /*
         * Legacy CUDA IPC handles cannot be opened across PID namespaces (the open fails with
         * "invalid device context"; UCX and NCCL say the same): a client in a container with a
         * PID namespace of its own would get -EIO on every allocation. Say so at once, and how.
         */
        if (node->backend->ipc_handles && !req->hello->admin) {
                static unsigned mine;   /* the daemon's own: read once */
                unsigned theirs = identity_pid_ns_depth(s->pid);

                if (!mine)
                        mine = identity_pid_ns_depth(0);
                if (s->pid <= 0 || (mine && theirs && theirs != mine)) {
                        session_log(s, LOG_LEVEL_WARN, "client %llu (pid %d) refused: it runs in a PID namespace of its "
                                    "own, and IPC handles cannot be opened across PID namespaces",
                                    (unsigned long long) s->id, (int) s->pid);
                        reply_error(req->id, -EACCES, true,
                                    "this process runs in a PID namespace of its own (a container), and the cuda "
                                    "backend's IPC handles cannot be opened across PID namespaces: run it in the "
                                    "host's PID namespace (docker/podman --pid=host, Kubernetes hostPID: true); "
                                    "see docs/operations.md", ret);
                        return;
                }
        }
        if (req->hello->has_control_for) {
                struct session *c = session_find(node, req->hello->control_for);

                /* Only the client's own process may listen for its reclaim requests. */
                if (!c || c == s || c->state != SESSION_READY || c->pid != s->pid || c->control || c->control_of) {
                        reply_error(req->id, -EINVAL, true,
                                    "control_for names no connected client of this process without a control channel",
                                    ret);
                        return;
                }
                c->control = s;
                s->control_of = c;
                /* Part of its client: --max-clients counts clients, not their channels. */
                if (!s->uncounted) {
                        s->uncounted = true;
                        node->connected--;
                }
        }
        if (name)
                strcpy(s->name, name);
        /* A reservation's token binds its pod at the first process that presents it (request_reservations.c). */
        if (req->hello->reservation && !s->control_of) {
                char why[400];
                int r = request_reservation_present(s, req->hello->reservation, why, sizeof(why));

                if (r < 0) {
                        session_log(s, LOG_LEVEL_WARN, "client %llu (pid %d) refused: %s", (unsigned long long) s->id,
                                    (int) s->pid, why);
                        reply_error(req->id, r, true, why, ret);
                        return;
                }
        }
        s->admin_tool = req->hello->admin;
        s->state = SESSION_READY;
        if (!s->control_of)
                session_set_tenant(s, session_tenant_of(s));

        for (unsigned d = 0; d < node->device_count; d++) {
                struct pool_stats st;

                pool_get_stats(node->pools[d], &st);
                gpupool__device_info__init(&infos[d]);
                infos[d].index = d;
                infos[d].backend = (char *) node->backend->name;
                infos[d].total_bytes = st.total_bytes;
                if (node->devices[d].has_uuid) {
                        /* Clients find their own ordinal for this GPU by its UUID. */
                        infos[d].has_uuid = 1;
                        infos[d].uuid.len = sizeof(node->devices[d].uuid);
                        infos[d].uuid.data = node->devices[d].uuid;
                }
                info_ptrs[d] = &infos[d];
        }
        hr.client_id = s->id;
        hr.daemon_version = (char *) GPUPOOL_VERSION;
        hr.n_devices = node->device_count;
        hr.devices = info_ptrs;
        hr.has_limit_bytes = 1;
        hr.limit_bytes = s->tenant ? policy_client_limit(&node->policy, s->tenant, s->limit_override_bytes) : 0;
        reply_ok(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_HELLO_REPLY;
        env.hello_reply = &hr;
        if (s->control_of)
                session_log(s, LOG_LEVEL_DEBUG, "client %llu: control channel of client %llu", (unsigned long long) s->id,
                            (unsigned long long) s->control_of->id);
        else if (s->admin_tool)         /* gpupoolctl: a probe every few seconds must not log two lines each */
                session_log(s, LOG_LEVEL_DEBUG, "client %llu hello: '%s' (administrative), pid %d, uid %u",
                            (unsigned long long) s->id, s->name, (int) s->pid, (unsigned) s->uid);
        else
                session_log(s, LOG_LEVEL_INFO, "client %llu hello: '%s', pid %d, uid %u, tenant %s",
                            (unsigned long long) s->id, s->name,
                            (int) s->pid, (unsigned) s->uid, s->tenant->conf.name);
        (void) reply_pack(&env, false, ret);
}

static void handle_return(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        const Gpupool__ReturnRequest *rq = req->return_segments;
        Gpupool__ReturnReply rr = GPUPOOL__RETURN_REPLY__INIT;
        Gpupool__Envelope env;

        if (rq->n_segment_ids > REQUEST_MAX_RETURNS) {
                reply_error(req->id, -EINVAL, false, "a return names at most 256 segments", ret);
                return;
        }
        for (size_t i = 0; i < rq->n_segment_ids; i++) {
                if (session_return(s, rq->segment_ids[i], false) == 0) {
                        rr.returned++;
                        continue;
                }
                /* The process's pool and the daemon disagree: a bug of the client's, worth a (rate-limited) line. */
                rr.not_found++;
                session_log(s, LOG_LEVEL_WARN, "client %llu (pid %d): returned segment %" PRIu64 " it does not lease",
                            (unsigned long long) s->id, (int) s->pid, rq->segment_ids[i]);
        }
        reply_ok(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_RETURN_REPLY;
        env.return_reply = &rr;
        (void) reply_pack(&env, false, ret);
}

static void handle_reclaim_reply(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        reclaim_answered(s, req->reclaim_reply);
        *ret = (struct reply) { .none = true };
}

static void handle_usage_report(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        (void) s, (void) req;
        /* Nothing to do but take the envelope's usage, after this. */
        *ret = (struct reply) { .none = true };
}

static void handle_mem_info(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        Gpupool__MemInfoReply mr = GPUPOOL__MEM_INFO_REPLY__INIT;
        uint32_t d = req->mem_info->device;
        struct policy_admission adm;
        Gpupool__Envelope env;
        struct pool_stats st;
        uint64_t held;

        if (d >= s->node->device_count) {
                char why[96];

                snprintf(why, sizeof(why), "no device %u: this daemon has %u", d, s->node->device_count);
                reply_error(req->id, -ENODEV, false, why, ret);
                return;
        }
        pool_get_stats(s->node->pools[d], &st);
        evict_admit(s, d, &st, &adm);
        if (adm.headroom_bytes != UINT64_MAX) {
                mr.has_may_lease_bytes = 1;
                mr.may_lease_bytes = adm.headroom_bytes;
        }
        /* What clients hold is theirs, leased or charged; the cache is anyone's to take. */
        held = policy_device_held(&s->node->policy, d, &st);
        mr.unheld_bytes = st.total_bytes > held ? st.total_bytes - held : 0;
        mr.reclaimable_bytes = reclaim_askable_bytes(s->node, s, d);
        mr.has_reclaimable_bytes = mr.reclaimable_bytes != 0;
        reply_ok(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_MEM_INFO_REPLY;
        env.mem_info_reply = &mr;
        (void) reply_pack(&env, false, ret);
}

static void handle_bye(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        Gpupool__Envelope env;

        /* The client unmapped everything: its memory can serve others now. */
        s->said_bye = true;
        session_release_all(s);
        reply_ok(&env, req->id);
        (void) reply_pack(&env, false, ret);
}

/* Checks a usage report (Envelope.usage): 0, or -EINVAL with why for one of no device or too many. */
static int check_usage(const struct session *s, const Gpupool__Envelope *req, char *why, size_t why_size) {
        const struct node *node = s->node;

        if (req->n_usage > node->device_count) {
                snprintf(why, why_size, "a usage report names %zu devices: this daemon has %u", req->n_usage,
                         node->device_count);
                return -EINVAL;
        }
        for (size_t i = 0; i < req->n_usage; i++)
                if (req->usage[i]->device >= node->device_count) {
                        snprintf(why, why_size, "a usage report names device %u: this daemon has %u", req->usage[i]->device,
                                 node->device_count);
                        return -EINVAL;
                }
        return 0;
}

/*
 * Keeps what a process reports it holds (Envelope.usage, checked), for its client (the
 * control channel's client on a control channel). The report is as of sending, after what the
 * request returns: it is taken after the request. It is the client's own word: it chooses
 * whom to ask for memory, never what anyone may have, and is clamped to what the client leases.
 */
static void take_usage(struct session *s, const Gpupool__Envelope *req) {
        struct session *c = s->control_of ? s->control_of : s;
        uint64_t now = uv_now(s->node->loop);

        if (!c->owners || c->said_bye)
                return;         /* a session before hello, or one whose memory went already */
        for (size_t i = 0; i < req->n_usage; i++)
                pool_owner_report(&c->owners[req->usage[i]->device], req->usage[i]->in_use_bytes,
                                  req->usage[i]->held_free_bytes, now);
}

/* Who may send a kind of request (struct request_kind's roles). */
enum {
        /* Allowed on an operator's connection let in past the client limits (session.admin_only). */
        ROLE_ADMIN_ROOM = 1 << 0,
        /* For root and the daemon's own user only (always, or with operator_if: when it says so). */
        ROLE_OPERATOR = 1 << 1,
        /* Of a control channel, and only it: there, nothing else is; elsewhere, this is not. */
        ROLE_CONTROL_CHANNEL = 1 << 2,
};

/* A request the daemon serves: its handler and who may send it, checked in request_handle() alone. */
struct request_kind {
        Gpupool__Envelope__BodyCase body;
        void (*handle)(struct session *s, const Gpupool__Envelope *req, struct reply *ret);
        unsigned roles;
        const char *what;               /* for the refusals: "set-limit", "a usage report" */
        /* With ROLE_OPERATOR: for operators only when this says so (NULL: always). */
        bool (*operator_if)(const Gpupool__Envelope *req);
};

/* flush --tenant asks a tenant's clients for memory: an operator's act; a flush of the cache is anyone's. */
static bool flush_names_tenant(const Gpupool__Envelope *req) {
        return req->flush->tenant != NULL;
}

static const struct request_kind kinds[] = {
        { GPUPOOL__ENVELOPE__BODY_HELLO, handle_hello, ROLE_ADMIN_ROOM, "hello", NULL },
        { GPUPOOL__ENVELOPE__BODY_STATUS_REQUEST, request_status, ROLE_ADMIN_ROOM, "status", NULL },
        { GPUPOOL__ENVELOPE__BODY_FLUSH, request_flush, ROLE_ADMIN_ROOM | ROLE_OPERATOR, "flush --tenant",
          flush_names_tenant },
        { GPUPOOL__ENVELOPE__BODY_BYE, handle_bye, ROLE_ADMIN_ROOM, "bye", NULL },
        { GPUPOOL__ENVELOPE__BODY_SET_LIMIT, request_set_limit, ROLE_ADMIN_ROOM | ROLE_OPERATOR, "set-limit", NULL },
        { GPUPOOL__ENVELOPE__BODY_TRIM, request_trim, ROLE_ADMIN_ROOM | ROLE_OPERATOR, "trim", NULL },
        { GPUPOOL__ENVELOPE__BODY_CHECK, request_check, ROLE_ADMIN_ROOM | ROLE_OPERATOR, "check", NULL },
        { GPUPOOL__ENVELOPE__BODY_METRICS, request_metrics, ROLE_ADMIN_ROOM, "metrics", NULL },
        { GPUPOOL__ENVELOPE__BODY_RELOAD, request_reload, ROLE_ADMIN_ROOM | ROLE_OPERATOR, "reload", NULL },
        { GPUPOOL__ENVELOPE__BODY_RESERVATION_PUT, request_reservation_put, ROLE_ADMIN_ROOM | ROLE_OPERATOR, "reserve",
          NULL },
        { GPUPOOL__ENVELOPE__BODY_RESERVATION_DELETE, request_reservation_delete, ROLE_ADMIN_ROOM | ROLE_OPERATOR,
          "unreserve", NULL },
        { GPUPOOL__ENVELOPE__BODY_RESERVATIONS, request_reservations, ROLE_ADMIN_ROOM, "reservations", NULL },
        { GPUPOOL__ENVELOPE__BODY_LEASE, request_lease, 0, "a lease", NULL },
        { GPUPOOL__ENVELOPE__BODY_RETURN_SEGMENTS, handle_return, 0, "a return", NULL },
        { GPUPOOL__ENVELOPE__BODY_MEM_INFO, handle_mem_info, 0, "a memory query", NULL },
        { GPUPOOL__ENVELOPE__BODY_CHARGE, request_charge, 0, "a charge", NULL },
        { GPUPOOL__ENVELOPE__BODY_ADOPT, request_adopt, 0, "an adoption", NULL },
        { GPUPOOL__ENVELOPE__BODY_PUBLISH, request_publish, 0, "a publish", NULL },
        { GPUPOOL__ENVELOPE__BODY_ATTACH, request_attach, 0, "an attach", NULL },
        { GPUPOOL__ENVELOPE__BODY_DETACH, request_detach, 0, "a detach", NULL },
        { GPUPOOL__ENVELOPE__BODY_UNPUBLISH, request_unpublish, ROLE_ADMIN_ROOM, "unpublish", NULL },
        { GPUPOOL__ENVELOPE__BODY_OBJECTS, request_objects, ROLE_ADMIN_ROOM, "objects", NULL },
        { GPUPOOL__ENVELOPE__BODY_RECLAIM_REPLY, handle_reclaim_reply, ROLE_CONTROL_CHANNEL, "a reclaim answer", NULL },
        { GPUPOOL__ENVELOPE__BODY_USAGE_REPORT, handle_usage_report, ROLE_CONTROL_CHANNEL, "a usage report", NULL },
};

static const struct request_kind *kind_of(Gpupool__Envelope__BodyCase body) {
        for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
                if (kinds[i].body == body)
                        return &kinds[i];
        return NULL;
}

/*
 * Whether s may send req, of kind k: the one place that checks the session's state, how it
 * was let in, its channel and its user against the request. Else fills *ret with the refusal.
 */
static bool allowed(struct session *s, const Gpupool__Envelope *req, const struct request_kind *k, struct reply *ret) {
        bool hello = req->body_case == GPUPOOL__ENVELOPE__BODY_HELLO;
        char why[256];

        if (s->said_bye) {
                reply_error(req->id, -EPROTO, true, "request after goodbye", ret);
                return false;
        }
        if (s->state == SESSION_NEW && !hello) {
                reply_error(req->id, -EPROTO, true, "the first message must be hello", ret);
                return false;
        }
        /* Past the limits, only a connection whose hello says what it was let in as gets in. */
        if (hello && ((s->admin_only && !req->hello->admin) || (s->control_only && !req->hello->has_control_for))) {
                node_limit_text(s->node, s->past_uid_cap, s->uid, s->user, s->pod_uid, why, sizeof(why));
                reply_error(req->id, -EDQUOT, true, why, ret);
                return false;
        }
        if (!k) {
                reply_error(req->id, -EPROTO, true, req->body_case == GPUPOOL__ENVELOPE__BODY__NOT_SET ?
                            "the request has no body" : "that message is a reply, which only the daemon sends", ret);
                return false;
        }
        /* An operator's connection past the limits: nothing that holds memory or serves a client. */
        if (s->admin_only && (!(k->roles & ROLE_ADMIN_ROOM) || (hello && req->hello->has_control_for))) {
                reply_error(req->id, -EDQUOT, false, "the daemon is at its client limits: this connection of an "
                            "operator was let in past them for administrative requests only", ret);
                return false;
        }
        if ((k->roles & ROLE_CONTROL_CHANNEL) && !s->control_of) {
                snprintf(why, sizeof(why), "%s belongs on a control channel", k->what);
                reply_error(req->id, -EPROTO, true, why, ret);
                return false;
        }
        if (!(k->roles & ROLE_CONTROL_CHANNEL) && s->control_of) {
                snprintf(why, sizeof(why), "%s does not belong on a control channel, which answers reclaims and reports "
                         "usage only", k->what);
                reply_error(req->id, -EPROTO, true, why, ret);
                return false;
        }
        /* Limits and other clients' memory are the operator's: a client acting on them would make them mean nothing. */
        if ((k->roles & ROLE_OPERATOR) && (!k->operator_if || k->operator_if(req)) && !s->operator) {
                snprintf(why, sizeof(why), "%s is %s", k->what, s->not_operator_why);
                reply_error(req->id, -EACCES, false, why, ret);
                return false;
        }
        return true;
}

static void request_handle(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        const struct request_kind *k = kind_of(req->body_case);
        char why[160];

        if (req->n_usage && !s->said_bye && check_usage(s, req, why, sizeof(why)) < 0) {
                /* A control channel's answer still counts as an answer; only its report is refused. */
                if (req->body_case == GPUPOOL__ENVELOPE__BODY_RECLAIM_REPLY && s->control_of)
                        reclaim_answered(s, req->reclaim_reply);
                reply_error(req->id, -EINVAL, false, why, ret);
                return;
        }
        if (!allowed(s, req, k, ret))
                return;
        k->handle(s, req, ret);
        if (req->n_usage)
                take_usage(s, req);
}

/* Called by session.c for each request it reads, through node->hooks.request (node.h lists the hooks). */
void request_serve(struct session *s, const Gpupool__Envelope *req) {
        struct node *node = s->node;
        struct reply rep = { 0 };

        request_handle(s, req, &rep);
        if (rep.parked)
                session_park(s);
        else if (rep.held)
                session_hold(s);
        else
                (void) session_send(s, &rep);  /* which may end the session */
        node_after_change(node);
}
