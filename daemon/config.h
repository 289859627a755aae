/*
 * config.h: gpupoold's config file: /etc/gpupool/gpupoold.conf (INI, parsed with inih), then
 * the drop-ins gpupoold.conf.d/NAME.conf in name order, each overriding what came before.
 *
 *   [daemon]       socket, backend, host_capacity, log_level, max_clients, check_invariants
 *   [pool]         headroom, idle_release, max_cached, granule_stock, reclaim_timeout
 *   [limits]       client_max (max_blocks: obsolete, accepted and ignored with a warning)
 *   [tenant:NAME]  match_uid, match_gid, match_name (a glob over the client's declared name),
 *                  match_cgroup (a glob over its cgroup v2 path, '*' crossing '/'), max,
 *                  guarantee, client_max
 *
 * A client belongs to the first tenant (in the order of first appearance) all of whose match
 * rules hold, else to "default", whose limits a [tenant:default] section may set. Every
 * mistake is an error naming file:line: unknown sections and keys, bad values, a tenant with
 * no rule, a tenant no client could ever reach because an earlier one matches all it would
 * match, a guarantee above the tenant's max.
 */
#ifndef GP_CONFIG_H
#define GP_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "options.h"

#define CONFIG_MAX_TENANTS 64
#define CONFIG_MAX_DEVICES 64   /* a tenant's device = is below it (BACKEND_MAX_DEVICES) */
#define CONFIG_NAME_MAX 63
#define CONFIG_CGROUP_MAX 255   /* a match_cgroup glob's bytes: a cgroup path the daemon keeps is shorter */
#define CONFIG_DEFAULT_TENANT "default"

struct tenant_conf {
        char name[CONFIG_NAME_MAX + 1];
        char where[128];                /* "file:line" of its first key, for messages */
        char limit_where[160];          /* "file:line: key = value" of its latest max or guarantee */
        bool match_uid_set, match_gid_set, match_name_set, match_cgroup_set;
        uint32_t match_uid, match_gid;
        char match_name[CONFIG_NAME_MAX + 1];
        char match_cgroup[CONFIG_CGROUP_MAX + 1];
        uint64_t max_bytes;             /* all its clients together, per device; 0: none */
        uint64_t guarantee_bytes;       /* per device */
        uint64_t client_max_bytes;      /* per client and device; 0: none */
        bool client_max_set;            /* else [limits] client_max applies */
        /*
         * The one device its clients may hold memory on, its max and guarantee that device's
         * (device = N; a reservation's GPU); unset: every device, each its own max and guarantee.
         */
        bool device_set;
        uint32_t device;
};

struct config {
        struct options options;         /* the defaults, then the files' keys */
        unsigned file_count;            /* files read */
        unsigned tenant_count;          /* tenants[0] is "default" */
        struct tenant_conf tenants[CONFIG_MAX_TENANTS];
};

/*
 * Loads path, then the *.conf files in path.d, over the defaults. A missing path is no error unless
 * required (--config was given). Returns 0, or a negative errno with "file:line: what" in
 * err.
 */
int config_load(const char *path, bool required, struct config *ret, char *err, size_t err_size);

/*
 * What a loaded config allows but an operator likely did not mean, one line each into buf
 * (NUL-terminated; lines that do not fit are dropped): a tenant matched only by client name
 * before one matched by uid or gid, which a process of that uid could leave by its name.
 * Returns how many there are.
 */
size_t config_warnings(const struct config *c, char *buf, size_t size);

/*
 * Whether a client of uid, gid, declared name and cgroup (NULL: unknown, which no match_cgroup
 * matches) meets every match rule of t.
 */
bool tenant_conf_matches(const struct tenant_conf *t, uint32_t uid, uint32_t gid, const char *name, const char *cgroup);

#endif
