/*
 * request_admin.c: the requests of operators and their tools rather than of allocating
 * clients: status, metrics, flush, set-limit, trim, check and reload. Those that reach other
 * clients' memory or the daemon's insides are for root and the daemon's own user only, as
 * request.c's table of request kinds says; request_handle() checks it before any handler runs.
 * A line that any client can cause (a plain flush) goes through its rate limits (session_log());
 * those of the operators' own requests (set-limit, reload, check) are theirs and kept whole.
 */
#include "request.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "metrics.h"
#include "node.h"
#include "reclaim.h"
#include "session.h"
#include "size.h"

/* A tenant's rules as text: uid, gid, a name glob and a cgroup glob, with their keys. */
#define RULES_TEXT_MAX (64 + CONFIG_NAME_MAX + CONFIG_CGROUP_MAX)

/* Describes a tenant's match rules: "uid=1000 gid=50 name=train-* cgroup=GLOB"; "" for default. */
static void rules_text(const struct tenant_conf *t, char *buf, size_t size) {
        int n = 0;

        buf[0] = '\0';
        if (t->match_uid_set)
                n += snprintf(buf + n, size - (size_t) n, "uid=%u ", t->match_uid);
        if (t->match_gid_set && (size_t) n < size)
                n += snprintf(buf + n, size - (size_t) n, "gid=%u ", t->match_gid);
        if (t->match_name_set && (size_t) n < size)
                n += snprintf(buf + n, size - (size_t) n, "name=%s ", t->match_name);
        if (t->match_cgroup_set && (size_t) n < size)
                n += snprintf(buf + n, size - (size_t) n, "cgroup=%s ", t->match_cgroup);
        if (t->device_set && (size_t) n < size)
                n += snprintf(buf + n, size - (size_t) n, "device=%u ", t->device);
        if (n > 0 && (size_t) n <= size)
                buf[n - 1] = '\0';
}

/* What a client last reported of what it leases (Usage), into its status. */
static void client_report(const struct session *c, uint64_t now_ms, Gpupool__ClientStatus *cs) {
        uint64_t held = 0, at = 0;
        bool reported = false;

        for (unsigned d = 0; d < c->node->device_count; d++) {
                const struct pool_owner *o = &c->owners[d];

                held += o->reported_held_free_bytes;
                if (o->reported && (!reported || o->reported_at_ms < at))
                        at = o->reported_at_ms;         /* the oldest report speaks for the sum */
                reported |= o->reported;
        }
        cs->has_held_free_bytes = 1;
        cs->held_free_bytes = held;
        if (reported) {
                cs->has_report_age_ms = 1;
                cs->report_age_ms = now_ms > at ? now_ms - at : 0;
        }
}

/* What a status reply's tenants and reservations point into, for every one there may be: about 90 KiB, made per request. */
struct tenants_text {
        Gpupool__TenantStatus tenants[CONFIG_MAX_TENANTS], *ptrs[CONFIG_MAX_TENANTS];
        char rules[CONFIG_MAX_TENANTS][RULES_TEXT_MAX];
        uint64_t in_use[CONFIG_MAX_TENANTS][BACKEND_MAX_DEVICES], reserved[CONFIG_MAX_TENANTS][BACKEND_MAX_DEVICES];
        Gpupool__ReservationStatus reservations[RESERVATIONS_MAX], *reservation_ptrs[RESERVATIONS_MAX];
        char *pods[RESERVATIONS_MAX][RESERVATION_PODS_MAX];
};

/* Fills the status reply's tenants (the config's: a reservation's is in its own list), pointing into x. */
static void tenants_status(struct session *s, Gpupool__StatusReply *sr, struct tenants_text *x) {
        struct node *node = s->node;
        struct policy *p = &node->policy;
        Gpupool__TenantStatus *tenants = x->tenants, **ptrs = x->ptrs;
        char (*rules)[RULES_TEXT_MAX] = x->rules;
        uint64_t (*in_use)[BACKEND_MAX_DEVICES] = x->in_use, (*reserved)[BACKEND_MAX_DEVICES] = x->reserved;

        for (unsigned i = 0; i < p->config_tenant_count; i++) {
                struct tenant *t = &p->tenants[i];
                Gpupool__TenantStatus *ts = &tenants[i];

                gpupool__tenant_status__init(ts);
                rules_text(&t->conf, rules[i], sizeof(rules[i]));
                for (unsigned d = 0; d < node->device_count; d++) {
                        reserved[i][d] = t->sums[d].reserved_bytes;
                        in_use[i][d] = t->sums[d].in_use_bytes;
                }
                ts->name = t->conf.name;
                ts->rules = rules[i];
                ts->clients = t->clients - (s->tenant == t);   /* not the one asking */
                ts->max_bytes = t->max_bytes;
                ts->guarantee_bytes = t->guarantee_bytes;
                ts->client_max_bytes = policy_client_limit(p, t, POLICY_NO_OVERRIDE);
                ts->has_overridden = t->overridden;
                ts->overridden = t->overridden;
                ts->n_reserved_bytes = node->device_count;
                ts->reserved_bytes = reserved[i];
                ts->n_in_use_bytes = node->device_count;
                ts->in_use_bytes = in_use[i];
                ts->n_charged_bytes = node->device_count;
                ts->charged_bytes = t->charged_bytes;
                ptrs[i] = ts;
        }
        sr->n_tenants = p->config_tenant_count;
        sr->tenants = ptrs;
        request_reservations_status(s, x->reservations, x->pods, &sr->n_reservations);
        for (size_t i = 0; i < sr->n_reservations; i++)
                x->reservation_ptrs[i] = &x->reservations[i];
        sr->reservations = x->reservation_ptrs;
}

void request_status(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        struct node *node = s->node;
        Gpupool__DeviceStatus devs[BACKEND_MAX_DEVICES], *dev_ptrs[BACKEND_MAX_DEVICES];
        char uuids[BACKEND_MAX_DEVICES][BACKEND_UUID_TEXT_MAX];
        Gpupool__StatusReply sr = GPUPOOL__STATUS_REPLY__INIT;
        Gpupool__ClientStatus *clients = NULL, **client_ptrs = NULL;
        struct tenants_text *tenants = malloc(sizeof(*tenants));
        Gpupool__Envelope env;
        uint64_t after = req->status_request->has_after_client_id ? req->status_request->after_client_id : 0;
        size_t n = 0, count = 0, room, total = 0, exiting = 0, left_out = 0;
        struct session *last = NULL;

        SESSION_FOREACH(c, node)
                count++;
        if (count) {
                clients = calloc(count, sizeof(*clients));
                client_ptrs = calloc(count, sizeof(*client_ptrs));
        }
        if (!tenants || (count && (!clients || !client_ptrs))) {
                free(tenants);
                free(clients);
                free(client_ptrs);
                reply_error(req->id, -EIO, false, "out of memory building the status", ret);
                return;
        }
        for (unsigned d = 0; d < node->device_count; d++) {
                struct pool_stats st;

                (void) pool_read_device(node->pools[d]);        /* the GPU's free memory now */
                pool_get_stats(node->pools[d], &st);
                gpupool__device_status__init(&devs[d]);
                devs[d].index = d;
                devs[d].backend = (char *) node->backend->name;
                devs[d].total_bytes = st.total_bytes;
                devs[d].reserved_bytes = st.reserved_bytes;
                devs[d].in_use_bytes = st.in_use_bytes;
                devs[d].cached_bytes = st.cached_bytes;
                devs[d].segments = st.segments;
                devs[d].has_max_cached_bytes = devs[d].has_evictions_total = devs[d].has_reclaims_total = 1;
                devs[d].has_idle_releases_total = devs[d].has_watermark_releases_total = devs[d].has_zeroing_bytes = 1;
                devs[d].zeroing_bytes = st.zeroing_bytes;
                devs[d].max_cached_bytes = policy_max_cached(&node->policy, d);
                devs[d].evictions_total = st.evictions_total;
                devs[d].reclaims_total = node->reclaims_total[d];
                devs[d].idle_releases_total = st.idle_releases_total;
                devs[d].watermark_releases_total = st.watermark_releases_total;
                devs[d].has_stocked_total = devs[d].has_charged_bytes = 1;
                devs[d].stocked_total = st.stocked_total;
                devs[d].charged_bytes = st.charged_bytes;
                if (node->devices[d].has_uuid) {
                        backend_uuid_text(node->devices[d].uuid, node->devices[d].mig, uuids[d]);
                        devs[d].uuid = uuids[d];
                }
                if (st.gpu_known) {
                        devs[d].has_gpu_free_bytes = devs[d].has_gpu_total_bytes = devs[d].has_headroom_bytes = 1;
                        devs[d].has_headroom_releases_total = 1;
                        devs[d].gpu_free_bytes = st.gpu_free_bytes;
                        devs[d].gpu_total_bytes = st.gpu_total_bytes;
                        devs[d].headroom_bytes = st.headroom_bytes;
                        devs[d].headroom_releases_total = st.headroom_releases_total;
                }
                dev_ptrs[d] = &devs[d];
        }
        sr.n_devices = node->device_count;
        sr.devices = dev_ptrs;
        tenants_status(s, &sr, tenants);
        /*
         * Every client but the one asking (the CLI has nothing to show), a page of them: those
         * after the one named, oldest first (the list is newest first: walked from its end), as
         * many as fit a reply beside the devices and tenants; the counts cover them all.
         */
        room = gpupool__status_reply__get_packed_size(&sr) + 64;
        room = room < GP_MAX_REPLY_BYTES ? GP_MAX_REPLY_BYTES - room : 0;
        SESSION_FOREACH(c, node)
                if (!c->next)
                        last = c;
        for (struct session *c = last; c; c = c->prev) {
                Gpupool__ClientStatus *cs = &clients[n];
                size_t size;

                if (c == s || c->control_of)
                        continue;       /* not the one asking, and control channels are part of their client */
                total++;
                exiting += c->state == SESSION_EXITING;
                if (c->id <= after || left_out) {
                        left_out += c->id > after;
                        continue;
                }
                gpupool__client_status__init(cs);
                cs->client_id = c->id;
                cs->pid = c->pid;
                cs->uid = c->uid;
                cs->name = c->name;
                cs->has_segments = 1;
                session_totals(c, &cs->reserved_bytes, &cs->in_use_bytes, &cs->segments, &cs->charged_bytes);
                cs->has_charged_bytes = cs->charged_bytes != 0;
                cs->limit_bytes = c->tenant ? policy_client_limit(&node->policy, c->tenant, c->limit_override_bytes) :
                                              node->policy.client_limit_bytes;
                if (c->tenant)
                        cs->tenant = c->tenant->conf.name;
                if (c->cgroup_known)
                        cs->cgroup = c->cgroup;
                if (c->pod_uid[0])
                        cs->pod_uid = c->pod_uid;
                client_report(c, uv_now(node->loop), cs);
                if (c->state == SESSION_EXITING) {
                        cs->has_exiting = 1;
                        cs->exiting = 1;
                }
                /* Its bytes in the reply: the message, its tag and its length. */
                size = gpupool__client_status__get_packed_size(cs) + 4;
                if (size > room) {
                        left_out++;
                        continue;
                }
                room -= size;
                client_ptrs[n++] = cs;
        }
        sr.has_clients_total = sr.has_clients_exiting = sr.has_clients_left_out = 1;
        sr.clients_total = (uint32_t) total;
        sr.clients_exiting = (uint32_t) exiting;
        sr.clients_left_out = (uint32_t) left_out;
        sr.n_clients = n;
        sr.clients = client_ptrs;
        reply_ok(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_STATUS_REPLY;
        env.status_reply = &sr;
        (void) reply_pack(&env, false, ret);
        free(tenants);
        free(clients);
        free(client_ptrs);
}

void request_flush(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        struct node *node = s->node;
        Gpupool__FlushedDevice devs[BACKEND_MAX_DEVICES], *dev_ptrs[BACKEND_MAX_DEVICES];
        Gpupool__FlushReply fr = GPUPOOL__FLUSH_REPLY__INIT;
        Gpupool__Envelope env;

        const Gpupool__FlushRequest *f = req->flush;
        unsigned n = 0;

        if (f->has_device && f->device >= node->device_count) {
                char why[128];

                snprintf(why, sizeof(why), "no device %u: this daemon has %u", f->device, node->device_count);
                reply_error(req->id, -ENODEV, false, why, ret);
                return;
        }
        if (f->tenant) {
                struct tenant *t = policy_tenant_by_name(&node->policy, f->tenant);

                if (!t) {
                        char why[160];

                        snprintf(why, sizeof(why), "no tenant '%.64s' (see gpupoolctl limits)", f->tenant);
                        reply_error(req->id, -ENOENT, false, why, ret);
                        return;
                }
                fr.has_clients_asked = fr.has_bytes_asked = 1;
                SESSION_FOREACH(c, node)
                        if (c->tenant == t && c != s)
                                reclaim_all(node, c, f->has_device ? (int) f->device : -1, true, &fr.clients_asked,
                                            &fr.bytes_asked);
                session_log(s, LOG_LEVEL_INFO, "flush by client %llu (pid %d): asked %u clients of tenant %s for their "
                            "free segments (%" PRIu64 " bytes as last reported)", (unsigned long long) s->id, (int) s->pid,
                            fr.clients_asked, t->conf.name, fr.bytes_asked);
                reply_ok(&env, req->id);
                env.body_case = GPUPOOL__ENVELOPE__BODY_FLUSH_REPLY;
                env.flush_reply = &fr;
                (void) reply_pack(&env, false, ret);
                return;
        }
        for (unsigned d = 0; d < node->device_count; d++) {
                if (f->has_device && d != f->device)
                        continue;
                gpupool__flushed_device__init(&devs[n]);
                devs[n].index = d;
                pool_flush(node->pools[d], &devs[n].segments, &devs[n].bytes);
                dev_ptrs[n] = &devs[n];
                if (devs[n].segments)
                        session_log(s, LOG_LEVEL_INFO, "flush by client %llu (pid %d): device %u released %" PRIu64
                                    " segments, %" PRIu64 " bytes", (unsigned long long) s->id, (int) s->pid, d,
                                    devs[n].segments, devs[n].bytes);
                n++;
        }
        fr.n_devices = n;
        fr.devices = dev_ptrs;
        reply_ok(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_FLUSH_REPLY;
        env.flush_reply = &fr;
        (void) reply_pack(&env, false, ret);
}

void request_set_limit(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        const Gpupool__SetLimitRequest *l = req->set_limit;
        struct node *node = s->node;
        char why[256], b1[GP_SIZE_FORMAT_MAX], b2[GP_SIZE_FORMAT_MAX];
        Gpupool__Envelope env;
        int r;

        if (!!l->tenant == l->has_pid || (!l->has_max_bytes && !l->has_guarantee_bytes)) {
                reply_error(req->id, -EINVAL, false,
                            "set-limit takes a tenant or a pid, and max, guarantee or both", ret);
                return;
        }
        if (l->has_pid) {
                struct session *c = NULL;

                SESSION_FOREACH(x, node)
                        if (x->pid == l->pid && x->tenant && !c)
                                c = x;
                if (!c || l->has_guarantee_bytes) {
                        snprintf(why, sizeof(why), c ? "a guarantee belongs to a tenant, not to one client (pid %d)" :
                                                       "no client of pid %d is connected", (int) l->pid);
                        reply_error(req->id, c ? -EINVAL : -ENOENT, false, why, ret);
                        return;
                }
                /* Every session of that process, and those it opens later: a process may hold several handles. */
                r = node_set_pid_limit(node, l->pid, l->max_bytes);
                if (r < 0) {
                        if (r == -ENOSPC)
                                snprintf(why, sizeof(why), "%d processes have a set-limit already, the most at once "
                                         "(a reload ends them)", NODE_MAX_PID_LIMITS);
                        else
                                snprintf(why, sizeof(why), "no process %d is running", (int) l->pid);
                        reply_error(req->id, r == -ENOSPC ? -EINVAL : -ENOENT, false, why, ret);
                        return;
                }
                SESSION_FOREACH(x, node)
                        if (x->pid == l->pid)
                                x->limit_override_bytes = l->max_bytes;
                log_info("set-limit by pid %d: the clients of pid %d together may reserve %s per device until the next "
                         "reload", (int) s->pid, (int) l->pid, l->max_bytes ? gp_size_format(l->max_bytes, b1, sizeof(b1)) : "any amount (no limit)");
        } else {
                struct tenant *t = policy_tenant_by_name(&node->policy, l->tenant);
                uint64_t max = l->has_max_bytes ? l->max_bytes : t ? t->max_bytes : 0;
                uint64_t guarantee = l->has_guarantee_bytes ? l->guarantee_bytes : t ? t->guarantee_bytes : 0;

                if (!t) {
                        snprintf(why, sizeof(why), "no tenant '%.64s' (see gpupoolctl limits)", l->tenant);
                        reply_error(req->id, -ENOENT, false, why, ret);
                        return;
                }
                if (t->reservation) {
                        snprintf(why, sizeof(why), "%s is a reservation: gpupoolctl reserve, with a higher generation, "
                                 "changes its limit and guarantee", t->conf.name);
                        reply_error(req->id, -EINVAL, false, why, ret);
                        return;
                }
                if (policy_set_tenant_limits(&node->policy, t, max, guarantee, why, sizeof(why)) < 0) {
                        reply_error(req->id, -EINVAL, false, why, ret);
                        return;
                }
                log_info("set-limit by pid %d: tenant %s max %s, guarantee %s until the next reload", (int) s->pid, t->conf.name,
                         max ? gp_size_format(max, b1, sizeof(b1)) : "none", gp_size_format(guarantee, b2, sizeof(b2)));
        }
        reply_ok(&env, req->id);
        (void) reply_pack(&env, false, ret);
}

void request_trim(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        const Gpupool__TrimRequest *t = req->trim;
        struct node *node = s->node;
        Gpupool__TrimReply tr = GPUPOOL__TRIM_REPLY__INIT;
        struct tenant *tenant = NULL;
        Gpupool__Envelope env;
        char why[160];

        if (!!t->tenant == t->has_pid) {
                reply_error(req->id, -EINVAL, false, "trim takes a pid or a tenant", ret);
                return;
        }
        if (t->tenant && !(tenant = policy_tenant_by_name(&node->policy, t->tenant))) {
                snprintf(why, sizeof(why), "no tenant '%.64s' (see gpupoolctl limits)", t->tenant);
                reply_error(req->id, -ENOENT, false, why, ret);
                return;
        }
        if (t->has_pid) {
                bool found = false;

                SESSION_FOREACH(c, node)
                        found |= c->pid == t->pid && !c->control_of && c != s;
                if (!found) {
                        /* As set-limit --pid says: asking nobody is not what was meant. */
                        snprintf(why, sizeof(why), "no client of pid %d is connected", (int) t->pid);
                        reply_error(req->id, -ENOENT, false, why, ret);
                        return;
                }
        }
        SESSION_FOREACH(c, node) {
                bool chosen = t->has_pid ? c->pid == t->pid : c->tenant == tenant;

                if (chosen && !c->control_of && c != s && c->tenant)
                        reclaim_all(node, c, -1, false, &tr.clients, &tr.bytes);
        }
        reply_ok(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_TRIM_REPLY;
        env.trim_reply = &tr;
        (void) reply_pack(&env, false, ret);
}

void request_check(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        struct node *node = s->node;
        Gpupool__CheckReply cr = GPUPOOL__CHECK_REPLY__INIT;
        Gpupool__Envelope env;
        char why[256];

        if (node_check(node, why, sizeof(why)) < 0) {
                char msg[300];

                log_err("check by pid %d: invariant broken: %s", (int) s->pid, why);
                snprintf(msg, sizeof(msg), "invariant broken: %s", why);
                reply_error(req->id, -EIO, false, msg, ret);
                return;
        }
        cr.pools = node->device_count;
        cr.checks_total = node->checks_total;
        cr.faults_injected = node->backend->faults_injected;
        reply_ok(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_CHECK_REPLY;
        env.check_reply = &cr;
        (void) reply_pack(&env, false, ret);
}

void request_metrics(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        char *text = malloc(METRICS_TEXT_MAX);
        Gpupool__MetricsReply mr = GPUPOOL__METRICS_REPLY__INIT;
        Gpupool__Envelope env;

        if (!text) {
                reply_error(req->id, -EIO, false, "out of memory building the metrics", ret);
                return;
        }
        if (metrics_format(s->node, s, text, METRICS_TEXT_MAX) < 0) {
                free(text);
                log_err("metrics: the text does not fit %d bytes", METRICS_TEXT_MAX);
                reply_error(req->id, -EIO, false, "the metrics do not fit the daemon's buffer", ret);
                return;
        }
        mr.text = text;
        reply_ok(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_METRICS_REPLY;
        env.metrics_reply = &mr;
        (void) reply_pack(&env, false, ret);      /* the reply keeps a copy */
        free(text);
}

void request_reload(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        Gpupool__ReloadReply rr = GPUPOOL__RELOAD_REPLY__INIT;
        Gpupool__Envelope env;
        char outcome[640];
        int r;

        log_info("reload asked by client %llu (pid %d)", (unsigned long long) s->id, (int) s->pid);
        r = s->node->hooks.reload(s->node, outcome, sizeof(outcome));
        if (r < 0) {
                char why[700];

                snprintf(why, sizeof(why), "reload refused, the running config stays: %s", outcome);
                reply_error(req->id, -EINVAL, false, why, ret);
                return;
        }
        rr.outcome = outcome;
        reply_ok(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_RELOAD_REPLY;
        env.reload_reply = &rr;
        (void) reply_pack(&env, false, ret);
}
