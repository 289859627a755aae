/*
 * request_reservations.c: an operator's reservations of memory for pods (reservations.h):
 * put, delete and list, and their part of a status.
 *
 * A put or a delete is checked on copies first (the table, then the policy with it), written
 * to the state directory, and only then taken: a refusal, or a file that cannot be written,
 * leaves the running daemon as it was. Taking it is a reload's dance on the tenants alone:
 * every client and object leaves its tenant, the reservations' tenants are made anew, and each
 * joins the tenant the policy gives it now, carrying what it holds.
 */
#include "request.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "node.h"
#include "pool.h"
#include "session.h"
#include "size.h"

/* The tenant of reservation r, or NULL (its GPU is absent). */
static struct tenant *tenant_of(struct node *node, const struct reservation *r) {
        for (unsigned i = node->policy.config_tenant_count; i < node->policy.tenant_count; i++)
                if (node->policy.tenants[i].reservation == r)
                        return &node->policy.tenants[i];
        return NULL;
}

void request_reservations_status(struct session *asking, Gpupool__ReservationStatus *out,
                                 char *(*pods)[RESERVATION_PODS_MAX], size_t *ret_n) {
        struct node *node = asking->node;

        for (unsigned i = 0; i < node->reservations.count; i++) {
                struct reservation *r = &node->reservations.r[i];
                struct tenant *t = tenant_of(node, r);
                Gpupool__ReservationStatus *rs = &out[i];

                gpupool__reservation_status__init(rs);
                rs->key = r->key;
                rs->generation = r->generation;
                rs->device = r->device;
                rs->device_uuid = r->device_uuid[0] ? r->device_uuid : NULL;
                rs->guarantee_bytes = r->guarantee_bytes;
                rs->limit_bytes = r->limit_bytes;
                for (unsigned j = 0; j < r->pod_count; j++)
                        pods[i][j] = r->pods[j];
                rs->n_pod_uids = r->pod_count;
                rs->pod_uids = pods[i];
                if (t) {
                        struct pool_owner none = { 0 };
                        struct policy_admission adm;
                        struct pool_stats st;
                        uint64_t room;

                        /* A new client of its pods, no limit of its own: the reservation's room, and the device's. */
                        pool_get_stats(node->pools[r->device], &st);
                        policy_admit(&node->policy, t, 0, 0, 0, &none, r->device, &st, &adm);
                        room = policy_device_room(&node->policy, t, r->device, &st);
                        rs->has_available_bytes = 1;
                        rs->available_bytes = adm.headroom_bytes < room ? adm.headroom_bytes : room;
                        rs->clients = t->clients - (asking->tenant == t);       /* not the one asking */
                        rs->reserved_bytes = t->sums[r->device].reserved_bytes;
                        rs->in_use_bytes = t->sums[r->device].in_use_bytes;
                        rs->charged_bytes = t->charged_bytes[r->device];
                }
                rs->has_absent = r->absent;
                rs->absent = r->absent;
                rs->has_token = r->token[0] != '\0';
                rs->token = rs->has_token;
        }
        *ret_n = node->reservations.count;
}

/*
 * Takes next as the node's reservations: checks the guarantees with it, writes it, and moves
 * the tenants. Returns 0, or a negative errno with why (nothing changed).
 */
static int take(struct node *node, const struct reservations *next, char *why, size_t why_size) {
        struct policy *trial = malloc(sizeof(*trial));
        char err[600];
        int r;

        if (!trial) {
                snprintf(why, why_size, "the daemon is out of memory");
                return -EIO;
        }
        *trial = node->policy;
        policy_reserve(trial, next);
        r = policy_check_guarantees(trial, why, why_size);
        free(trial);
        if (r < 0)
                return r;
        r = reservations_save(node->options->state_dir, next, err, sizeof(err));
        if (r < 0) {
                log_err("reservations: %s", err);
                snprintf(why, why_size, "the daemon cannot keep it: %s", err);
                return -EIO;
        }
        session_leave_tenants(node);
        node->reservations = *next;
        policy_reserve(&node->policy, &node->reservations);
        session_join_tenants(node);
        node_after_change(node);
        return 0;
}

/* A put's reservation from its request, the GPU found; or -errno with why. */
static int reservation_of(struct node *node, const Gpupool__ReservationPutRequest *p, struct reservation *r, char *why,
                          size_t why_size) {
        int d;

        memset(r, 0, sizeof(*r));
        if (strlen(p->key) > RESERVATION_KEY_MAX) {
                snprintf(why, why_size, "a reservation's key is 1 to %d letters, digits, '-', '_' or '.'", RESERVATION_KEY_MAX);
                return -EINVAL;
        }
        snprintf(r->key, sizeof(r->key), "%s", p->key);
        if (p->has_device == !!p->device_uuid) {
                snprintf(why, why_size, "reservation %s: name its GPU by index or by UUID, one of them", r->key);
                return -EINVAL;
        }
        d = node_device_of(node, p->device_uuid, p->device, p->device_uuid != NULL);
        if (d < 0) {
                if (p->device_uuid)
                        snprintf(why, why_size, "reservation %s: no GPU %.48s on this node", r->key, p->device_uuid);
                else
                        snprintf(why, why_size, "reservation %s: no device %u: this daemon has %u", r->key, p->device,
                                 node->device_count);
                return -ENODEV;
        }
        r->device = (uint32_t) d;
        if (node->devices[d].has_uuid)
                backend_uuid_text(node->devices[d].uuid, node->devices[d].mig, r->device_uuid);
        r->generation = p->generation;
        r->guarantee_bytes = p->guarantee_bytes;
        r->limit_bytes = p->has_limit_bytes ? p->limit_bytes : p->guarantee_bytes;
        if (!!p->token == (p->n_pod_uids > 0)) {
                snprintf(why, why_size, "reservation %s: name its pods by UID, or give it a token their processes will "
                         "present, one of them", r->key);
                return -EINVAL;
        }
        if (p->token) {
                if (!reservation_token_ok(p->token)) {
                        snprintf(why, why_size, "reservation %s: a token is %d to %d letters, digits, '-' or '_'", r->key,
                                 RESERVATION_TOKEN_MIN, RESERVATION_TOKEN_MAX);
                        return -EINVAL;
                }
                snprintf(r->token, sizeof(r->token), "%s", p->token);
        }
        if (p->n_pod_uids > RESERVATION_PODS_MAX) {
                snprintf(why, why_size, "reservation %s: it is for 1 to %d pods, named by their UIDs", r->key,
                         RESERVATION_PODS_MAX);
                return -EINVAL;
        }
        for (size_t i = 0; i < p->n_pod_uids; i++) {
                if (!reservation_pod_uid_ok(p->pod_uids[i])) {
                        snprintf(why, why_size, "reservation %s: '%.40s' is not a pod UID (8-4-4-4-12 lower-case hex digits)",
                                 r->key, p->pod_uids[i]);
                        return -EINVAL;
                }
                snprintf(r->pods[i], sizeof(r->pods[i]), "%s", p->pod_uids[i]);
        }
        r->pod_count = (unsigned) p->n_pod_uids;
        return reservation_check(r, why, why_size);
}

void request_reservation_put(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        Gpupool__ReservationPutReply pr = GPUPOOL__RESERVATION_PUT_REPLY__INIT;
        struct node *node = s->node;
        struct reservations *next = NULL;
        char why[700], b1[GP_SIZE_FORMAT_MAX], b2[GP_SIZE_FORMAT_MAX];
        struct reservation r;
        Gpupool__Envelope env;
        int rc;

        if (!node->options->state_dir[0]) {
                reply_error(req->id, -EINVAL, false, "gpupoold has no state directory (--state-dir, or systemd's "
                            "StateDirectory=) to keep reservations in across a restart: a reservation is refused", ret);
                return;
        }
        rc = reservation_of(node, req->reservation_put, &r, why, sizeof(why));
        if (rc == 0 && !(next = malloc(sizeof(*next)))) {
                snprintf(why, sizeof(why), "the daemon is out of memory");
                rc = -EIO;
        }
        if (rc == 0) {
                *next = node->reservations;
                rc = reservations_put(next, &r, why, sizeof(why));
                if (rc < 0)
                        rc = -EINVAL;   /* the sentence says which: a conflict, an older generation, a pod's, full */
        }
        if (rc > 0) {
                pr.changed = true;
                rc = take(node, next, why, sizeof(why));
        }
        free(next);
        if (rc < 0) {
                log_info("reservation %s refused to pid %d: %s", r.key, (int) s->pid, why);
                reply_error(req->id, rc, false, why, ret);
                return;
        }
        if (pr.changed)
                log_info("reservation %s (generation %" PRIu64 ") put by pid %d: device %u, guarantee %s, limit %s, %u pod%s",
                         r.key, r.generation, (int) s->pid, r.device, gp_size_format(r.guarantee_bytes, b1, sizeof(b1)),
                         gp_size_format(r.limit_bytes, b2, sizeof(b2)), r.pod_count, r.pod_count == 1 ? "" : "s");
        pr.device = r.device;
        reply_ok(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_RESERVATION_PUT_REPLY;
        env.reservation_put_reply = &pr;
        (void) reply_pack(&env, false, ret);
}

int request_reservation_present(struct session *s, const char *token, char *why, size_t why_size) {
        struct node *node = s->node;
        struct reservation *r = reservations_of_token(&node->reservations, token);
        const struct reservation *other;
        struct reservations *next;
        int rc;

        if (!r) {
                snprintf(why, why_size, "no reservation on this node has the token in $GPUPOOL_RESERVATION (deleted, or "
                         "made on another node)");
                return -EACCES;
        }
        if (!s->pod_uid[0]) {
                snprintf(why, why_size, "reservation %s is for a pod's processes, and this process is in no pod the daemon "
                         "can tell (its cgroup: %s)", r->key, s->cgroup_known ? s->cgroup : "unknown");
                return -EACCES;
        }
        if (r->pod_count) {
                if (strcmp(r->pods[0], s->pod_uid) == 0)
                        return 0;
                /* The caller logs why, naming both pods, within the client's rate limit. */
                snprintf(why, why_size, "reservation %s is pod %s's: this process is in pod %s", r->key, r->pods[0],
                         s->pod_uid);
                return -EACCES;
        }
        other = reservations_of_pod(&node->reservations, s->pod_uid);
        if (other) {
                snprintf(why, why_size, "pod %s has reservation %s already: one reservation per pod, and %s is another",
                         s->pod_uid, other->key, r->key);
                return -EACCES;
        }
        if (!(next = malloc(sizeof(*next)))) {
                snprintf(why, why_size, "the daemon is out of memory");
                return -EIO;
        }
        *next = node->reservations;
        r = &next->r[r - node->reservations.r];
        snprintf(r->pods[0], sizeof(r->pods[0]), "%s", s->pod_uid);
        r->pod_count = 1;
        rc = take(node, next, why, why_size);
        if (rc == 0)
                log_info("reservation %s is pod %s's: pid %d presented its token", r->key, s->pod_uid, (int) s->pid);
        free(next);
        return rc;
}

void request_reservation_delete(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        Gpupool__ReservationDeleteReply dr = GPUPOOL__RESERVATION_DELETE_REPLY__INIT;
        const char *key = req->reservation_delete->key;
        struct node *node = s->node;
        struct reservations *next;
        Gpupool__Envelope env;
        char why[700];

        if (reservations_find(&node->reservations, key)) {
                if (!(next = malloc(sizeof(*next)))) {
                        reply_error(req->id, -EIO, false, "the daemon is out of memory", ret);
                        return;
                }
                *next = node->reservations;
                (void) reservations_delete(next, key);
                if (take(node, next, why, sizeof(why)) < 0) {
                        free(next);
                        reply_error(req->id, -EIO, false, why, ret);
                        return;
                }
                free(next);
                dr.deleted = true;
                log_info("reservation %s deleted by pid %d", key, (int) s->pid);
        }
        reply_ok(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_RESERVATION_DELETE_REPLY;
        env.reservation_delete_reply = &dr;
        (void) reply_pack(&env, false, ret);
}

/* What a list's reply points into, for every reservation there may be: about 20 KiB, made per request. */
struct reservations_text {
        Gpupool__ReservationStatus status[RESERVATIONS_MAX], *ptrs[RESERVATIONS_MAX];
        char *pods[RESERVATIONS_MAX][RESERVATION_PODS_MAX];
};

void request_reservations(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        Gpupool__ReservationsReply rr = GPUPOOL__RESERVATIONS_REPLY__INIT;
        struct reservations_text *x = malloc(sizeof(*x));
        Gpupool__Envelope env;

        if (!x) {
                reply_error(req->id, -EIO, false, "the daemon is out of memory", ret);
                return;
        }
        request_reservations_status(s, x->status, x->pods, &rr.n_reservations);
        for (size_t i = 0; i < rr.n_reservations; i++)
                x->ptrs[i] = &x->status[i];
        rr.reservations = x->ptrs;
        reply_ok(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_RESERVATIONS_REPLY;
        env.reservations_reply = &rr;
        (void) reply_pack(&env, false, ret);
        free(x);
}
