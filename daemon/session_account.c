/*
 * session_account.c: what a session counts to its tenant: its sums over the devices, its place
 * in its tenant's counts (the pool keeps the tenant's reserved and in-use sums as the client's
 * owners lease and report; the charges of memory outside the pool are kept here), and the
 * check that every tenant's counts are its clients' (the node's invariant 4).
 */
#include "session.h"

#include <errno.h>
#include <stdio.h>

#include "node.h"
#include "objects.h"

void session_totals(const struct session *s, uint64_t *ret_reserved, uint64_t *ret_in_use, uint64_t *ret_segments,
                    uint64_t *ret_charged) {
        uint64_t reserved = 0, in_use = 0, segments = 0, charged = 0;

        for (unsigned d = 0; d < s->node->device_count; d++) {
                reserved += s->owners[d].reserved_bytes;
                in_use += s->owners[d].reported_in_use_bytes;
                segments += s->owners[d].segments;
                charged += s->charged_bytes[d];
        }
        *ret_reserved = reserved;
        *ret_in_use = in_use;
        *ret_segments = segments;
        *ret_charged = charged;
}

/* The pools learn what all clients charged on their device (pool_set_charged()): it takes room as leases do. */
static void charges_changed(struct node *node, unsigned device) {
        pool_set_charged(node->pools[device], policy_charged_bytes(&node->policy, device));
}

void session_set_tenant(struct session *s, struct tenant *t) {
        for (unsigned d = 0; d < s->node->device_count; d++) {
                if (s->tenant)
                        s->tenant->charged_bytes[d] -= s->charged_bytes[d];
                if (t)
                        t->charged_bytes[d] += s->charged_bytes[d];
                pool_owner_set_group(&s->owners[d], t ? &t->sums[d] : NULL);
                if (s->charged_bytes[d])
                        charges_changed(s->node, d);
        }
        if (s->tenant)
                s->tenant->clients--;
        s->tenant = t;
        if (t)
                t->clients++;
}

struct tenant *session_tenant_of(struct session *s) {
        return policy_tenant_for(&s->node->policy, s->uid, s->gid, s->name, s->cgroup_known ? s->cgroup : NULL, s->pod_uid);
}

void session_leave_tenants(struct node *node) {
        SESSION_FOREACH(c, node)
                if (c->tenant)
                        session_set_tenant(c, NULL);
        objects_leave_tenants(node);
}

void session_join_tenants(struct node *node) {
        SESSION_FOREACH(c, node)
                if ((c->state == SESSION_READY || c->state == SESSION_EXITING) && !c->control_of)
                        session_set_tenant(c, session_tenant_of(c));
        objects_map_tenants(node);
}

int session_charge(struct session *s, unsigned device, uint64_t bytes, bool release) {
        if (release && bytes > s->charged_bytes[device])
                return -EINVAL;
        s->charged_bytes[device] = release ? s->charged_bytes[device] - bytes : s->charged_bytes[device] + bytes;
        s->tenant->charged_bytes[device] = release ? s->tenant->charged_bytes[device] - bytes :
                                                     s->tenant->charged_bytes[device] + bytes;
        charges_changed(s->node, device);
        return 0;
}

/* Invariant 4's bookkeeping: each tenant's sums are its clients' reserved, in-use and charged bytes, and each pool's charges all tenants'. */
int session_check_tenants(struct node *node, char *why, size_t why_size) {
        for (unsigned i = 0; i < node->policy.tenant_count; i++) {
                struct tenant *t = &node->policy.tenants[i];
                unsigned clients = 0;

                SESSION_FOREACH(c, node)
                        clients += c->tenant == t;
                if (clients != t->clients) {
                        snprintf(why, why_size, "tenant %s counts %u clients, has %u", t->conf.name, t->clients, clients);
                        return -EUCLEAN;
                }
                for (unsigned d = 0; d < node->device_count; d++) {
                        uint64_t sum = 0, in_use = 0, charged = 0;

                        /* Its named objects count to it as its clients do. */
                        objects_tenant_sums(node, t, d, &sum, &in_use);
                        SESSION_FOREACH(c, node)
                                if (c->tenant == t) {
                                        sum += c->owners[d].reserved_bytes;
                                        in_use += c->owners[d].reported_in_use_bytes;
                                        charged += c->charged_bytes[d];
                                }
                        if (charged != t->charged_bytes[d]) {
                                snprintf(why, why_size, "tenant %s counts %llu bytes charged on device %u, its clients %llu",
                                         t->conf.name, (unsigned long long) t->charged_bytes[d], d,
                                         (unsigned long long) charged);
                                return -EUCLEAN;
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
        for (unsigned d = 0; d < node->device_count; d++) {
                struct pool_stats st;

                pool_get_stats(node->pools[d], &st);
                if (st.charged_bytes != policy_charged_bytes(&node->policy, d)) {
                        snprintf(why, why_size, "device %u's pool counts %llu bytes charged, its tenants %llu", d,
                                 (unsigned long long) st.charged_bytes,
                                 (unsigned long long) policy_charged_bytes(&node->policy, d));
                        return -EUCLEAN;
                }
        }
        return 0;
}
