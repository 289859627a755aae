/*
 * policy.h: who may have how much. The pool asks nothing; the request handler asks policy
 * how many more bytes a client may reserve on a device and passes that to pool_lease() as
 * headroom, and names the limit that bound it when the pool refuses.
 *
 * Three limits bind, per device: the client's own (its tenant's client_max, else [limits]
 * client_max / --client-limit, or a runtime set-limit on its pid), its tenant's max over all
 * the tenant's clients, and the guarantees of the other tenants: memory a tenant is
 * guaranteed and does not use is held back from everyone else.
 *
 * Tenants' reserved bytes are kept as sums, updated whenever a client's reserved bytes
 * change (policy_account()); policy_check() recomputes them from the sessions.
 */
#ifndef GP_POLICY_H
#define GP_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "config.h"
#include "pool.h"

struct tenant {
        struct tenant_conf conf;        /* its rules and its limits as the config file says */
        uint64_t max_bytes;             /* in force: the file's, or a runtime set-limit's */
        uint64_t guarantee_bytes;
        bool overridden;                /* set-limit changed it; a reload restores the file's */
        uint64_t reserved_bytes[BACKEND_MAX_DEVICES];   /* its clients' together */
        unsigned clients;
};

enum policy_bound {
        POLICY_UNBOUND,
        POLICY_CLIENT,                  /* the client's limit */
        POLICY_TENANT,                  /* its tenant's max */
        POLICY_GUARANTEES,              /* other tenants' unused guarantees */
};

struct policy {
        uint64_t client_limit_bytes;    /* [limits] client_max: per client and device; 0: none */
        unsigned device_count;
        uint64_t capacity_bytes[BACKEND_MAX_DEVICES];
        unsigned tenant_count;          /* tenants[0] is "default" */
        struct tenant tenants[CONFIG_MAX_TENANTS];
};

/* Sets limits and tenants from a loaded config (a start, or a reload: runtime overrides go). */
void policy_configure(struct policy *p, const struct config *c);

/* Whether the tenants' guarantees fit every device. Returns 0, or -EINVAL saying which does not. */
int policy_check_guarantees(const struct policy *p, char *why, size_t why_size);

/* The tenant a client of uid, gid and declared name belongs to. */
struct tenant *policy_tenant_for(struct policy *p, uint32_t uid, uint32_t gid, const char *name);

/* The tenant called name, or NULL. */
struct tenant *policy_tenant_by_name(struct policy *p, const char *name);

/* No runtime override of a client's limit (set-limit --pid sets one; its 0 is "no limit"). */
#define POLICY_NO_OVERRIDE UINT64_MAX

/*
 * A client's limit on each device: its runtime override (POLICY_NO_OVERRIDE for none), else
 * its tenant's client_max, else the default. 0: none.
 */
uint64_t policy_client_limit(const struct policy *p, const struct tenant *t, uint64_t override_bytes);

/*
 * How many more bytes owner (of tenant t, with client limit client_limit_bytes, 0: none) may
 * reserve on device, given the device's stats: UINT64_MAX when nothing binds. *ret_bound
 * says which limit gave the answer.
 */
uint64_t policy_headroom(const struct policy *p, const struct tenant *t, uint64_t client_limit_bytes,
                         const struct pool_owner *owner, unsigned device, const struct pool_stats *st,
                         enum policy_bound *ret_bound);

/* Bytes of device held back from tenant t for the other tenants' unused guarantees. */
uint64_t policy_held_for_others(const struct policy *p, const struct tenant *t, unsigned device);

/* A client of t went from before to after reserved bytes on device. */
void policy_account(struct policy *p, struct tenant *t, unsigned device, uint64_t before, uint64_t after);

#endif
