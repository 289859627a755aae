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

#include "log.h"
#include "reclaim.h"
#include "server.h"
#include "session.h"
#include "size.h"

static void pack_reply(struct session *s, Gpupool__Envelope *env, int fd, bool disconnect, struct reply *ret) {
        int n = gp_wire_pack(env, s->server->send_buf, sizeof(s->server->send_buf));

        if (n < 0) {
                /* Only a status of very many clients could get here; say so rather than truncate. */
                request_error_reply(s, env->id, -EIO, false, "the reply is larger than the protocol allows", ret);
                return;
        }
        *ret = (struct reply) { .len = (size_t) n, .fd = fd, .disconnect = disconnect };
}

void request_error_reply(struct session *s, uint64_t id, int err, bool disconnect, const char *message,
                         struct reply *ret) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
        int n;

        env.version = GP_PROTOCOL_VERSION;
        env.id = id;
        env.has_status = 1;
        env.status = gp_errno_to_status(err);
        env.error = (char *) message;
        n = gp_wire_pack(&env, s->server->send_buf, sizeof(s->server->send_buf));
        /* An error reply is a few hundred bytes at most: it always fits. */
        *ret = (struct reply) { .len = n > 0 ? (size_t) n : 0, .fd = -1, .disconnect = disconnect };
}

static void ok_envelope(Gpupool__Envelope *env, uint64_t id) {
        gpupool__envelope__init(env);
        env->version = GP_PROTOCOL_VERSION;
        env->id = id;
        env->has_status = 1;
        env->status = GPUPOOL__STATUS__STATUS_OK;
}

static void handle_hello(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        struct server *server = s->server;
        Gpupool__DeviceInfo infos[BACKEND_MAX_DEVICES], *info_ptrs[BACKEND_MAX_DEVICES];
        Gpupool__HelloReply hr = GPUPOOL__HELLO_REPLY__INIT;
        Gpupool__Envelope env;
        const char *name = req->hello->name;

        if (s->state != SESSION_NEW) {
                request_error_reply(s, req->id, -EPROTO, true, "hello sent twice", ret);
                return;
        }
        if (name && !gp_wire_name_is_valid(name)) {
                request_error_reply(s, req->id, -EINVAL, true,
                                    "the client name must be 1 to 63 bytes with no control characters", ret);
                return;
        }
        if (req->hello->has_control_for) {
                struct session *c = server->sessions;

                while (c && c->id != req->hello->control_for)
                        c = c->next;
                /* Only the client's own process may listen for its reclaim requests. */
                if (!c || c == s || c->state != SESSION_READY || c->pid != s->pid || c->control || c->control_of) {
                        request_error_reply(s, req->id, -EINVAL, true,
                                            "control_for names no connected client of this process without a control channel",
                                            ret);
                        return;
                }
                c->control = s;
                s->control_of = c;
                /* Part of its client: --max-clients counts clients, not their channels. */
                s->uncounted = true;
                server->connected--;
        }
        if (name)
                strcpy(s->name, name);
        s->state = SESSION_READY;
        if (!s->control_of) {
                session_set_tenant(s, policy_tenant_for(&server->policy, s->uid, s->gid, s->name));
                for (unsigned d = 0; d < server->device_count; d++)
                        s->owners[d].keep_bytes = req->hello->has_keep_free_bytes ? req->hello->keep_free_bytes : 0;
        }

        for (unsigned d = 0; d < server->device_count; d++) {
                struct pool_stats st;

                pool_get_stats(server->pools[d], &st);
                gpupool__device_info__init(&infos[d]);
                infos[d].index = d;
                infos[d].backend = (char *) server->backend->name;
                infos[d].total_bytes = st.total_bytes;
                if (server->devices[d].has_uuid) {
                        /* Clients find their own ordinal for this GPU by its UUID. */
                        infos[d].has_uuid = 1;
                        infos[d].uuid.len = sizeof(server->devices[d].uuid);
                        infos[d].uuid.data = server->devices[d].uuid;
                }
                info_ptrs[d] = &infos[d];
        }
        hr.client_id = s->id;
        hr.daemon_version = (char *) GPUPOOL_VERSION;
        hr.n_devices = server->device_count;
        hr.devices = info_ptrs;
        hr.has_limit_bytes = 1;
        hr.limit_bytes = s->tenant ? policy_client_limit(&server->policy, s->tenant, s->limit_override_bytes) : 0;
        ok_envelope(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_HELLO_REPLY;
        env.hello_reply = &hr;
        if (s->control_of)
                log_debug("client %llu: control channel of client %llu", (unsigned long long) s->id,
                          (unsigned long long) s->control_of->id);
        else
                log_info("client %llu hello: '%s', pid %d, uid %u, tenant %s", (unsigned long long) s->id, s->name,
                         (int) s->pid, (unsigned) s->uid, s->tenant->conf.name);
        pack_reply(s, &env, -1, false, ret);
}

/* Says which limit refused an allocation, with the request and the use that it met. */
static void quota_message(struct session *s, unsigned d, uint64_t size, uint64_t client_limit, enum policy_bound bound,
                          char *why, size_t why_size) {
        struct server *server = s->server;
        const struct tenant *t = s->tenant;
        const struct pool_owner *owner = &s->owners[d];
        uint64_t seg = pool_min_segment_bytes(size);
        char b1[GP_SIZE_FORMAT_MAX], b2[GP_SIZE_FORMAT_MAX], b3[GP_SIZE_FORMAT_MAX], b4[GP_SIZE_FORMAT_MAX];
        int n;

        n = snprintf(why, why_size, "allocating %" PRIu64 " bytes on device %u needs a %s segment, which ", size, d,
                     gp_size_format(seg, b1, sizeof(b1)));
        if (n < 0 || (size_t) n >= why_size)
                return;
        why += n, why_size -= (size_t) n;
        switch (bound) {
        case POLICY_CLIENT:
                snprintf(why, why_size, "would take client '%s' (pid %d, tenant %s) to %s reserved, over its limit of %s (%s)",
                         s->name, (int) s->pid, t->conf.name, gp_size_format(owner->reserved_bytes + seg, b2, sizeof(b2)),
                         gp_size_format(client_limit, b3, sizeof(b3)),
                         s->limit_override_bytes ? "set-limit --pid" :
                         t->conf.client_max_set  ? "its tenant's client_max" : "client_max, --client-limit");
                return;
        case POLICY_TENANT:
                snprintf(why, why_size, "would take tenant %s (%u client%s) to %s reserved, over its max of %s%s", t->conf.name,
                         t->clients, t->clients == 1 ? "" : "s", gp_size_format(t->reserved_bytes[d] + seg, b2, sizeof(b2)),
                         gp_size_format(t->max_bytes, b3, sizeof(b3)), t->overridden ? " (set-limit)" : "");
                return;
        case POLICY_GUARANTEES: {
                struct pool_stats st;

                pool_get_stats(server->pools[d], &st);
                snprintf(why, why_size,
                         "does not fit: of the device's %s, clients hold %s and %s is held back for other tenants' unused "
                         "guarantees (tenant %s holds %s)",
                         gp_size_format(st.total_bytes, b2, sizeof(b2)),
                         gp_size_format(st.reserved_bytes - st.cached_bytes, b3, sizeof(b3)),
                         gp_size_format(policy_held_for_others(&server->policy, t, d), b4, sizeof(b4)), t->conf.name,
                         gp_size_format(t->reserved_bytes[d], b1, sizeof(b1)));
                return;
        }
        case POLICY_UNBOUND:
                break;
        }
        snprintf(why, why_size, "no limit allows");
}

enum attempt {
        ATTEMPT_FIRST,          /* a new request: may park to ask others for memory */
        ATTEMPT_RETRY,          /* parked: memory came back; keep waiting if it still does not fit */
        ATTEMPT_FINAL,          /* parked, and its time is up */
};

/*
 * One try at an allocation, of request id. Fills *ret with the reply and returns true, or
 * returns false when the request waits (parked) for other clients to give memory back.
 */
static bool alloc_attempt(struct session *s, uint64_t id, uint32_t device, uint64_t size, enum attempt attempt,
                          struct reply *ret) {
        struct server *server = s->server;
        Gpupool__AllocReply ar = GPUPOOL__ALLOC_REPLY__INIT;
        char why[640], b1[GP_SIZE_FORMAT_MAX], b2[GP_SIZE_FORMAT_MAX], b3[GP_SIZE_FORMAT_MAX];
        char tried[256] = "";
        uint64_t headroom, client_limit, before;
        struct pool_owner *owner = &s->owners[device];
        struct pool_lease lease;
        enum policy_bound bound;
        struct pool_stats st;
        Gpupool__Envelope env;
        int r, fd = -1;

        r = policy_admit(&server->policy, owner, size, why, sizeof(why));
        if (r < 0) {
                request_error_reply(s, id, r, false, why, ret);
                return true;
        }
        pool_get_stats(server->pools[device], &st);
        client_limit = policy_client_limit(&server->policy, s->tenant, s->limit_override_bytes);
        headroom = policy_headroom(&server->policy, s->tenant, client_limit, owner, device, &st, &bound);
        before = owner->reserved_bytes;
        r = pool_alloc(server->pools[device], owner, size, headroom, &lease);
        policy_account(&server->policy, s->tenant, device, before, owner->reserved_bytes);
        if (r == -EDQUOT) {
                quota_message(s, device, size, client_limit, bound, why, sizeof(why));
                request_error_reply(s, id, r, false, why, ret);
                return true;
        }
        if (r == -ENOMEM && attempt == ATTEMPT_FIRST) {
                /* Ladder step 3: clients over their guarantee give back segments they keep free. */
                unsigned clients = 0;
                uint64_t asked = reclaim_ask(server, s, device, pool_min_segment_bytes(size), &clients);

                if (clients) {
                        s->parked_id = id;
                        s->parked_device = device;
                        s->parked_size = size;
                        s->parked_asked_bytes = asked;
                        s->parked_asked_clients = clients;
                        s->parked_cached_before = st.cached_bytes;
                        s->parked_deadline_ms = uv_now(server->loop) + server->options->reclaim_timeout_ms;
                        *ret = (struct reply) { .fd = -1, .parked = true };
                        return false;
                }
        }
        if (r == -ENOMEM && attempt == ATTEMPT_RETRY)
                return false;
        if (r == -ENOMEM) {
                if (attempt == ATTEMPT_FINAL)
                        snprintf(tried, sizeof(tried), "; asked %u client%s over their guarantee for %s they kept free, "
                                 "and not enough came back within %llu ms (reclaim_timeout)",
                                 s->parked_asked_clients, s->parked_asked_clients == 1 ? "" : "s",
                                 gp_size_format(s->parked_asked_bytes, b1, sizeof(b1)),
                                 (unsigned long long) server->options->reclaim_timeout_ms);
                else
                        snprintf(tried, sizeof(tried), "; no client over its guarantee keeps free segments to give back");
                pool_get_stats(server->pools[device], &st);
                snprintf(why, sizeof(why),
                         "device %u is full: %" PRIu64 " bytes asked, %s of %s reserved and %s in use after "
                         "releasing the cache%s",
                         device, size, gp_size_format(st.reserved_bytes, b1, sizeof(b1)),
                         gp_size_format(st.total_bytes, b2, sizeof(b2)), gp_size_format(st.in_use_bytes, b3, sizeof(b3)),
                         tried);
                request_error_reply(s, id, r, false, why, ret);
                return true;
        }
        if (r < 0) {
                snprintf(why, sizeof(why), "the %s backend failed: %s", server->backend->name, strerror(-r));
                log_err("client %llu: allocating %" PRIu64 " bytes: %s", (unsigned long long) s->id, size, why);
                request_error_reply(s, id, -EIO, false, why, ret);
                return true;
        }
        ar.segment_id = lease.segment_id;
        ar.segment_size = lease.segment_size;
        ar.offset = lease.offset;
        ar.size = lease.size;
        if (lease.new_segment) {
                ar.has_new_segment = 1;
                ar.new_segment = 1;
                if (lease.mem->ipc_handle_len) {
                        ar.has_ipc_handle = 1;
                        ar.ipc_handle.len = lease.mem->ipc_handle_len;
                        ar.ipc_handle.data = (uint8_t *) lease.mem->ipc_handle;
                } else {
                        fd = lease.mem->fd;
                }
        }
        ok_envelope(&env, id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_ALLOC_REPLY;
        env.alloc_reply = &ar;
        pack_reply(s, &env, fd, false, ret);
        return true;
}

static void handle_alloc(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        struct server *server = s->server;
        const Gpupool__AllocRequest *a = req->alloc;
        char why[128];

        if (s->control_of) {
                request_error_reply(s, req->id, -EPROTO, true, "a control channel allocates nothing", ret);
                return;
        }
        if (a->device >= server->device_count) {
                snprintf(why, sizeof(why), "no device %u: this daemon has %u", a->device, server->device_count);
                request_error_reply(s, req->id, -ENODEV, false, why, ret);
                return;
        }
        if (a->size == 0 || a->size > POOL_MAX_REQUEST) {
                snprintf(why, sizeof(why), "cannot allocate %" PRIu64 " bytes: a request is 1 byte to 64 TiB", a->size);
                request_error_reply(s, req->id, -EINVAL, false, why, ret);
                return;
        }
        (void) alloc_attempt(s, req->id, a->device, a->size, ATTEMPT_FIRST, ret);
}

uint64_t request_retry_parked(struct server *server, uint64_t now_ms) {
        static struct session *parked[1024];
        uint64_t next = UINT64_MAX;
        size_t n = 0;

        /*
         * Collected first: answering one may end its session, and with it that session's
         * control channel, which is never parked itself.
         */
        for (struct session *c = server->sessions; c && n < sizeof(parked) / sizeof(parked[0]); c = c->next)
                if (c->parked)
                        parked[n++] = c;
        for (size_t i = 0; i < n; i++) {
                struct session *c = parked[i];
                struct reply rep = { .fd = -1 };
                /* Final at the deadline, or once every client asked has answered and it still does not fit. */
                bool final = now_ms >= c->parked_deadline_ms || server->reclaim_outstanding == 0;

                if (alloc_attempt(c, c->parked_id, c->parked_device, c->parked_size, final ? ATTEMPT_FINAL : ATTEMPT_RETRY,
                                  &rep)) {
                        session_unpark(c);
                        (void) session_send(c, &rep);
                } else if (c->parked_deadline_ms < next) {
                        next = c->parked_deadline_ms;
                }
        }
        return next;
}

/* The device a segment id belongs to (its top byte), or -1. */
static int segment_device(const struct server *server, uint64_t segment_id) {
        uint64_t d = segment_id >> 56;

        return d < server->device_count ? (int) d : -1;
}

static void handle_free(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        struct server *server = s->server;
        const Gpupool__FreeRequest *f = req->free;
        Gpupool__FreeReply fr = GPUPOOL__FREE_REPLY__INIT;
        int d = segment_device(server, f->segment_id), r = -ENOENT;
        Gpupool__Envelope env;
        bool release = false;
        char why[256];

        if (d >= 0)
                r = pool_free_block(server->pools[d], &s->owners[d], f->segment_id, f->offset, &release);
        if (r < 0) {
                snprintf(why, sizeof(why),
                         "this client has no live block at offset %" PRIu64 " of segment %" PRIu64
                         " (freed already, or never allocated)", f->offset, f->segment_id);
                request_error_reply(s, req->id, r, false, why, ret);
                return;
        }
        if (release) {
                fr.has_release_segment = 1;
                fr.release_segment = 1;
        }
        ok_envelope(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_FREE_REPLY;
        env.free_reply = &fr;
        pack_reply(s, &env, -1, false, ret);
}

#define BATCH_MAX 256

static void handle_free_batch(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        const Gpupool__FreeBatchRequest *b = req->free_batch;
        struct server *server = s->server;
        Gpupool__FreeBatchReply fr = GPUPOOL__FREE_BATCH_REPLY__INIT;
        uint64_t release[BATCH_MAX];
        size_t nrelease = 0;
        Gpupool__Envelope env;

        if (b->n_frees > BATCH_MAX || b->n_release_segment_ids > BATCH_MAX) {
                request_error_reply(s, req->id, -EINVAL, false, "a batch frees at most 256 blocks", ret);
                return;
        }
        for (size_t i = 0; i < b->n_frees; i++) {
                const Gpupool__FreeRequest *f = b->frees[i];
                int d = segment_device(server, f->segment_id);
                bool rel = false, pre = false;

                if (d < 0 || pool_free_block(server->pools[d], &s->owners[d], f->segment_id, f->offset, &rel) < 0) {
                        fr.not_found++;
                        continue;
                }
                fr.freed++;
                for (size_t k = 0; k < b->n_release_segment_ids; k++)
                        pre |= b->release_segment_ids[k] == f->segment_id;
                if (rel && !pre)
                        release[nrelease++] = f->segment_id;
        }
        /* Segments the client unmapped already: released now, if they are empty as it said. */
        for (size_t k = 0; k < b->n_release_segment_ids; k++) {
                uint64_t id = b->release_segment_ids[k], before;
                int d = segment_device(server, id);

                if (d < 0)
                        continue;
                before = s->owners[d].reserved_bytes;
                if (pool_release(server->pools[d], &s->owners[d], id) == 0)
                        policy_account(&server->policy, s->tenant, (unsigned) d, before, s->owners[d].reserved_bytes);
                else
                        log_warn("client %llu (pid %d): released segment %" PRIu64 " it does not hold empty",
                                 (unsigned long long) s->id, (int) s->pid, id);
        }
        fr.n_release_segment_ids = nrelease;
        fr.release_segment_ids = release;
        ok_envelope(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_FREE_BATCH_REPLY;
        env.free_batch_reply = &fr;
        pack_reply(s, &env, -1, false, ret);
}

static void handle_release(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        struct server *server = s->server;
        uint64_t id = req->release->segment_id;
        int d = segment_device(server, id), r = -ENOENT;
        Gpupool__Envelope env;
        char why[256];

        if (d >= 0) {
                uint64_t before = s->owners[d].reserved_bytes;

                r = pool_release(server->pools[d], &s->owners[d], id);
                policy_account(&server->policy, s->tenant, (unsigned) d, before, s->owners[d].reserved_bytes);
        }
        if (r == -EBUSY) {
                snprintf(why, sizeof(why), "segment %" PRIu64 " still holds live blocks of this client", id);
                request_error_reply(s, req->id, -EINVAL, false, why, ret);
                return;
        }
        if (r < 0) {
                snprintf(why, sizeof(why), "this client holds no segment %" PRIu64, id);
                request_error_reply(s, req->id, r, false, why, ret);
                return;
        }
        ok_envelope(&env, req->id);
        pack_reply(s, &env, -1, false, ret);
}

/* Describes a tenant's match rules: "uid=1000 gid=50 name=train-*"; "" for default. */
static void rules_text(const struct tenant_conf *t, char *buf, size_t size) {
        int n = 0;

        buf[0] = '\0';
        if (t->match_uid_set)
                n += snprintf(buf + n, size - (size_t) n, "uid=%u ", t->match_uid);
        if (t->match_gid_set && (size_t) n < size)
                n += snprintf(buf + n, size - (size_t) n, "gid=%u ", t->match_gid);
        if (t->match_name_set && (size_t) n < size)
                n += snprintf(buf + n, size - (size_t) n, "name=%s ", t->match_name);
        if (n > 0 && (size_t) n <= size)
                buf[n - 1] = '\0';
}

/* Fills the status reply's tenants (the arrays are the caller's, sized for every tenant). */
static void tenants_status(struct session *s, Gpupool__StatusReply *sr, Gpupool__TenantStatus *tenants,
                           Gpupool__TenantStatus **ptrs, char rules[][160], uint64_t in_use[][BACKEND_MAX_DEVICES]) {
        struct server *server = s->server;
        struct policy *p = &server->policy;

        for (unsigned i = 0; i < p->tenant_count; i++) {
                struct tenant *t = &p->tenants[i];
                Gpupool__TenantStatus *ts = &tenants[i];

                gpupool__tenant_status__init(ts);
                rules_text(&t->conf, rules[i], sizeof(rules[i]));
                memset(in_use[i], 0, sizeof(in_use[i]));
                for (struct session *c = server->sessions; c; c = c->next)
                        if (c->tenant == t)
                                for (unsigned d = 0; d < server->device_count; d++)
                                        in_use[i][d] += c->owners[d].in_use_bytes;
                ts->name = t->conf.name;
                ts->rules = rules[i];
                ts->clients = t->clients - (s->tenant == t);   /* not the one asking */
                ts->max_bytes = t->max_bytes;
                ts->guarantee_bytes = t->guarantee_bytes;
                ts->client_max_bytes = policy_client_limit(p, t, 0);
                ts->has_overridden = t->overridden;
                ts->overridden = t->overridden;
                ts->n_reserved_bytes = server->device_count;
                ts->reserved_bytes = t->reserved_bytes;
                ts->n_in_use_bytes = server->device_count;
                ts->in_use_bytes = in_use[i];
                ptrs[i] = ts;
        }
        sr->n_tenants = p->tenant_count;
        sr->tenants = ptrs;
}

static void handle_status(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        struct server *server = s->server;
        Gpupool__DeviceStatus devs[BACKEND_MAX_DEVICES], *dev_ptrs[BACKEND_MAX_DEVICES];
        Gpupool__StatusReply sr = GPUPOOL__STATUS_REPLY__INIT;
        Gpupool__ClientStatus *clients = NULL, **client_ptrs = NULL;
        static Gpupool__TenantStatus tenants[CONFIG_MAX_TENANTS], *tenant_ptrs[CONFIG_MAX_TENANTS];
        static char rules[CONFIG_MAX_TENANTS][160];
        static uint64_t in_use[CONFIG_MAX_TENANTS][BACKEND_MAX_DEVICES];
        Gpupool__Envelope env;
        size_t n = 0, count = 0;

        for (struct session *c = server->sessions; c; c = c->next)
                count++;
        if (count) {
                clients = calloc(count, sizeof(*clients));
                client_ptrs = calloc(count, sizeof(*client_ptrs));
                if (!clients || !client_ptrs) {
                        free(clients);
                        free(client_ptrs);
                        request_error_reply(s, req->id, -EIO, false, "out of memory building the status", ret);
                        return;
                }
        }
        for (unsigned d = 0; d < server->device_count; d++) {
                struct pool_stats st;

                pool_get_stats(server->pools[d], &st);
                gpupool__device_status__init(&devs[d]);
                devs[d].index = d;
                devs[d].backend = (char *) server->backend->name;
                devs[d].total_bytes = st.total_bytes;
                devs[d].reserved_bytes = st.reserved_bytes;
                devs[d].in_use_bytes = st.in_use_bytes;
                devs[d].cached_bytes = st.cached_bytes;
                devs[d].segments = st.segments;
                devs[d].has_max_cached_bytes = devs[d].has_evictions_total = devs[d].has_reclaims_total = 1;
                devs[d].has_decay_releases_total = devs[d].has_watermark_releases_total = 1;
                devs[d].max_cached_bytes = server_max_cached(server, d);
                devs[d].evictions_total = st.evictions_total;
                devs[d].reclaims_total = server->reclaims_total[d];
                devs[d].decay_releases_total = st.decay_releases_total;
                devs[d].watermark_releases_total = st.watermark_releases_total;
                dev_ptrs[d] = &devs[d];
        }
        /* Every client but the one asking (the CLI has nothing to show). */
        for (struct session *c = server->sessions; c; c = c->next) {
                Gpupool__ClientStatus *cs = &clients[n];

                if (c == s || c->control_of)
                        continue;       /* not the one asking, and control channels are part of their client */
                gpupool__client_status__init(cs);
                cs->client_id = c->id;
                cs->pid = c->pid;
                cs->uid = c->uid;
                cs->name = c->name;
                session_totals(c, &cs->reserved_bytes, &cs->in_use_bytes, &cs->blocks);
                cs->limit_bytes = c->tenant ? policy_client_limit(&server->policy, c->tenant, c->limit_override_bytes) :
                                              server->policy.client_limit_bytes;
                if (c->tenant)
                        cs->tenant = c->tenant->conf.name;
                cs->has_cached_in_client_bytes = 1;
                cs->cached_in_client_bytes = c->client_cached_bytes;
                if (c->state == SESSION_EXITING) {
                        cs->has_exiting = 1;
                        cs->exiting = 1;
                }
                client_ptrs[n++] = cs;
        }
        sr.n_devices = server->device_count;
        sr.devices = dev_ptrs;
        sr.n_clients = n;
        sr.clients = client_ptrs;
        tenants_status(s, &sr, tenants, tenant_ptrs, rules, in_use);
        ok_envelope(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_STATUS_REPLY;
        env.status_reply = &sr;
        pack_reply(s, &env, -1, false, ret);
        free(clients);
        free(client_ptrs);
}

static void handle_flush(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        struct server *server = s->server;
        Gpupool__FlushedDevice devs[BACKEND_MAX_DEVICES], *dev_ptrs[BACKEND_MAX_DEVICES];
        Gpupool__FlushReply fr = GPUPOOL__FLUSH_REPLY__INIT;
        Gpupool__Envelope env;

        const Gpupool__FlushRequest *f = req->flush;
        unsigned n = 0;

        if (f->has_device && f->device >= server->device_count) {
                char why[128];

                snprintf(why, sizeof(why), "no device %u: this daemon has %u", f->device, server->device_count);
                request_error_reply(s, req->id, -ENODEV, false, why, ret);
                return;
        }
        if (f->tenant) {
                struct tenant *t = policy_tenant_by_name(&server->policy, f->tenant);

                if (s->uid != 0 && s->uid != geteuid()) {
                        request_error_reply(s, req->id, -EACCES, false, "flush --tenant is for root or the daemon's own user", ret);
                        return;
                }
                if (!t) {
                        char why[160];

                        snprintf(why, sizeof(why), "no tenant '%.64s' (see gpupoolctl limits)", f->tenant);
                        request_error_reply(s, req->id, -ENOENT, false, why, ret);
                        return;
                }
                fr.has_clients_asked = fr.has_segments_asked = fr.has_bytes_asked = 1;
                for (struct session *c = server->sessions; c; c = c->next) {
                        uint64_t segments;

                        if (c->tenant != t || c == s)
                                continue;
                        bool asked = false;

                        segments = reclaim_all(server, c, f->has_device ? (int) f->device : -1, true, &fr.bytes_asked, &asked);
                        fr.segments_asked += segments;
                        fr.clients_asked += asked;
                }
                log_info("flush by client %llu (pid %d): asked %u clients of tenant %s for %" PRIu64 " segments",
                         (unsigned long long) s->id, (int) s->pid, fr.clients_asked, t->conf.name, fr.segments_asked);
                ok_envelope(&env, req->id);
                env.body_case = GPUPOOL__ENVELOPE__BODY_FLUSH_REPLY;
                env.flush_reply = &fr;
                pack_reply(s, &env, -1, false, ret);
                return;
        }
        for (unsigned d = 0; d < server->device_count; d++) {
                if (f->has_device && d != f->device)
                        continue;
                gpupool__flushed_device__init(&devs[n]);
                devs[n].index = d;
                pool_flush(server->pools[d], &devs[n].segments, &devs[n].bytes);
                dev_ptrs[n] = &devs[n];
                if (devs[n].segments)
                        log_info("flush by client %llu (pid %d): device %u released %" PRIu64 " segments, %" PRIu64 " bytes",
                                 (unsigned long long) s->id, (int) s->pid, d, devs[n].segments, devs[n].bytes);
                n++;
        }
        fr.n_devices = n;
        fr.devices = dev_ptrs;
        ok_envelope(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_FLUSH_REPLY;
        env.flush_reply = &fr;
        pack_reply(s, &env, -1, false, ret);
}

static void handle_set_limit(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        const Gpupool__SetLimitRequest *l = req->set_limit;
        struct server *server = s->server;
        char why[256], b1[GP_SIZE_FORMAT_MAX], b2[GP_SIZE_FORMAT_MAX];
        Gpupool__Envelope env;

        if (s->uid != 0 && s->uid != geteuid()) {
                /* Limits are the operator's: a client raising its own would make them mean nothing. */
                request_error_reply(s, req->id, -EACCES, false, "set-limit is for root or the daemon's own user", ret);
                return;
        }
        if (!!l->tenant == l->has_pid || (!l->has_max_bytes && !l->has_guarantee_bytes)) {
                request_error_reply(s, req->id, -EINVAL, false,
                                    "set-limit takes a tenant or a pid, and max, guarantee or both", ret);
                return;
        }
        if (l->has_pid) {
                struct session *c = server->sessions;

                while (c && !(c->pid == l->pid && c->tenant))
                        c = c->next;
                if (!c || l->has_guarantee_bytes) {
                        snprintf(why, sizeof(why), c ? "a guarantee belongs to a tenant, not to one client (pid %d)" :
                                                       "no client of pid %d is connected", (int) l->pid);
                        request_error_reply(s, req->id, c ? -EINVAL : -ENOENT, false, why, ret);
                        return;
                }
                /* Every session of that process: a process may hold several handles. */
                for (c = server->sessions; c; c = c->next)
                        if (c->pid == l->pid)
                                c->limit_override_bytes = l->max_bytes;
                log_info("set-limit by pid %d: clients of pid %d may reserve %s per device until the next reload",
                         (int) s->pid, (int) l->pid, l->max_bytes ? gp_size_format(l->max_bytes, b1, sizeof(b1)) : "their tenant's limit");
        } else {
                struct tenant *t = policy_tenant_by_name(&server->policy, l->tenant);
                uint64_t max = l->has_max_bytes ? l->max_bytes : t ? t->max_bytes : 0;
                uint64_t guarantee = l->has_guarantee_bytes ? l->guarantee_bytes : t ? t->guarantee_bytes : 0;
                uint64_t old_guarantee;

                if (!t) {
                        snprintf(why, sizeof(why), "no tenant '%.64s' (see gpupoolctl limits)", l->tenant);
                        request_error_reply(s, req->id, -ENOENT, false, why, ret);
                        return;
                }
                if (max && guarantee > max) {
                        snprintf(why, sizeof(why), "tenant %s: a guarantee of %s is more than its max of %s", t->conf.name,
                                 gp_size_format(guarantee, b1, sizeof(b1)), gp_size_format(max, b2, sizeof(b2)));
                        request_error_reply(s, req->id, -EINVAL, false, why, ret);
                        return;
                }
                old_guarantee = t->guarantee_bytes;
                t->guarantee_bytes = guarantee;
                if (policy_check_guarantees(&server->policy, why, sizeof(why)) < 0) {
                        t->guarantee_bytes = old_guarantee;
                        request_error_reply(s, req->id, -EINVAL, false, why, ret);
                        return;
                }
                t->max_bytes = max;
                t->overridden = true;
                log_info("set-limit by pid %d: tenant %s max %s, guarantee %s until the next reload", (int) s->pid, t->conf.name,
                         max ? gp_size_format(max, b1, sizeof(b1)) : "none", gp_size_format(guarantee, b2, sizeof(b2)));
        }
        ok_envelope(&env, req->id);
        pack_reply(s, &env, -1, false, ret);
}

static void handle_reclaim_reply(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        if (!s->control_of) {
                request_error_reply(s, req->id, -EPROTO, true, "a reclaim answer belongs on a control channel", ret);
                return;
        }
        reclaim_answered(s, req->reclaim_reply);
        *ret = (struct reply) { .fd = -1, .none = true };
}

static void handle_trim(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        const Gpupool__TrimRequest *t = req->trim;
        struct server *server = s->server;
        Gpupool__TrimReply tr = GPUPOOL__TRIM_REPLY__INIT;
        struct tenant *tenant = NULL;
        Gpupool__Envelope env;
        char why[160];

        if (s->uid != 0 && s->uid != geteuid()) {
                request_error_reply(s, req->id, -EACCES, false, "trim is for root or the daemon's own user", ret);
                return;
        }
        if (!!t->tenant == t->has_pid) {
                request_error_reply(s, req->id, -EINVAL, false, "trim takes a pid or a tenant", ret);
                return;
        }
        if (t->tenant && !(tenant = policy_tenant_by_name(&server->policy, t->tenant))) {
                snprintf(why, sizeof(why), "no tenant '%.64s' (see gpupoolctl limits)", t->tenant);
                request_error_reply(s, req->id, -ENOENT, false, why, ret);
                return;
        }
        for (struct session *c = server->sessions; c; c = c->next) {
                bool chosen = t->has_pid ? c->pid == t->pid : c->tenant == tenant;
                uint64_t segments;

                if (!chosen || c->control_of || c == s || !c->tenant)
                        continue;
                {
                        bool asked = false;

                        segments = reclaim_all(server, c, -1, false, &tr.bytes, &asked);
                        tr.segments += segments;
                        tr.clients += asked;
                }
        }
        ok_envelope(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_TRIM_REPLY;
        env.trim_reply = &tr;
        pack_reply(s, &env, -1, false, ret);
}

static void handle_check(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        struct server *server = s->server;
        Gpupool__CheckReply cr = GPUPOOL__CHECK_REPLY__INIT;
        Gpupool__Envelope env;
        char why[256];

        if (s->uid != 0 && s->uid != geteuid()) {
                request_error_reply(s, req->id, -EACCES, false, "check is for root or the daemon's own user", ret);
                return;
        }
        if (server_check(server, why, sizeof(why)) < 0) {
                char msg[300];

                log_err("check by pid %d: invariant broken: %s", (int) s->pid, why);
                snprintf(msg, sizeof(msg), "invariant broken: %s", why);
                request_error_reply(s, req->id, -EIO, false, msg, ret);
                return;
        }
        cr.pools = server->device_count;
        cr.checks_total = server->checks_total;
        cr.faults_injected = server->backend->faults_injected;
        ok_envelope(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_CHECK_REPLY;
        env.check_reply = &cr;
        pack_reply(s, &env, -1, false, ret);
}

static void handle_bye(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        Gpupool__Envelope env;

        /* The client unmapped everything: its memory can serve others now. */
        s->said_bye = true;
        session_release_all(s);
        ok_envelope(&env, req->id);
        pack_reply(s, &env, -1, false, ret);
}

void request_handle(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        if (req->has_client_cached_bytes)
                s->client_cached_bytes = req->client_cached_bytes;
        if (s->said_bye) {
                request_error_reply(s, req->id, -EPROTO, true, "request after goodbye", ret);
                return;
        }
        if (s->state == SESSION_NEW && req->body_case != GPUPOOL__ENVELOPE__BODY_HELLO) {
                request_error_reply(s, req->id, -EPROTO, true, "the first message must be hello", ret);
                return;
        }
        switch (req->body_case) {
        case GPUPOOL__ENVELOPE__BODY_HELLO:
                handle_hello(s, req, ret);
                return;
        case GPUPOOL__ENVELOPE__BODY_ALLOC:
                handle_alloc(s, req, ret);
                return;
        case GPUPOOL__ENVELOPE__BODY_FREE:
                handle_free(s, req, ret);
                return;
        case GPUPOOL__ENVELOPE__BODY_RELEASE:
                handle_release(s, req, ret);
                return;
        case GPUPOOL__ENVELOPE__BODY_STATUS_REQUEST:
                handle_status(s, req, ret);
                return;
        case GPUPOOL__ENVELOPE__BODY_FLUSH:
                handle_flush(s, req, ret);
                return;
        case GPUPOOL__ENVELOPE__BODY_BYE:
                handle_bye(s, req, ret);
                return;
        case GPUPOOL__ENVELOPE__BODY_SET_LIMIT:
                handle_set_limit(s, req, ret);
                return;
        case GPUPOOL__ENVELOPE__BODY_RECLAIM_REPLY:
                handle_reclaim_reply(s, req, ret);
                return;
        case GPUPOOL__ENVELOPE__BODY_TRIM:
                handle_trim(s, req, ret);
                return;
        case GPUPOOL__ENVELOPE__BODY_CHECK:
                handle_check(s, req, ret);
                return;
        case GPUPOOL__ENVELOPE__BODY_FREE_BATCH:
                handle_free_batch(s, req, ret);
                return;
        case GPUPOOL__ENVELOPE__BODY__NOT_SET:
                request_error_reply(s, req->id, -EPROTO, true, "the request has no body", ret);
                return;
        default:
                request_error_reply(s, req->id, -EPROTO, true, "that message is a reply, which only the daemon sends", ret);
                return;
        }
}
