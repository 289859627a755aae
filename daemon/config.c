/*
 * config.c: loading gpupoold.conf and its drop-ins (see config.h).
 *
 * inih does the INI syntax; it reads through our line reader, which counts lines, so that
 * every error can name its file and line. The first error stops the load: a half-read config
 * is never used.
 */
#define _GNU_SOURCE
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <grp.h>
#include <ini.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "size.h"
#include "wire.h"

struct load {
        struct config *c;
        const char *file;
        FILE *f;
        int line;
        bool line_indented;     /* the line being parsed starts with white space */
        char err[512];
        bool failed;
};

static void fail(struct load *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static char *read_line(char *str, int num, void *stream) {
        struct load *l = stream;
        char *s = fgets(str, num, l->f);

        if (s) {
                const char *at = s + strspn(s, " \t");

                l->line++;
                l->line_indented = s[0] == ' ' || s[0] == '\t';
                /* inih would take the keys after it as outside any section: say what is wrong, here. */
                if (*at == '[' && !strchr(at, ']'))
                        fail(l, "'%.*s' is not a section header: it has no ']'", (int) strcspn(at, "\r\n"), at);
        }
        return s;
}

static void fail(struct load *l, const char *fmt, ...) {
        va_list ap;
        int n;

        if (l->failed)
                return;
        l->failed = true;
        n = snprintf(l->err, sizeof(l->err), "%s:%d: ", l->file, l->line);
        va_start(ap, fmt);
        vsnprintf(l->err + n, sizeof(l->err) - (size_t) n, fmt, ap);
        va_end(ap);
}

static struct tenant_conf *tenant_get(struct load *l, const char *name) {
        struct config *c = l->c;
        struct tenant_conf *t;

        for (unsigned i = 0; i < c->tenant_count; i++)
                if (strcmp(c->tenants[i].name, name) == 0)
                        return &c->tenants[i];
        if (c->tenant_count == CONFIG_MAX_TENANTS) {
                fail(l, "more than %d tenants", CONFIG_MAX_TENANTS);
                return NULL;
        }
        t = &c->tenants[c->tenant_count++];
        memset(t, 0, sizeof(*t));
        snprintf(t->name, sizeof(t->name), "%s", name);
        snprintf(t->where, sizeof(t->where), "%s:%d", l->file, l->line);
        return t;
}

/* A uid or gid: a number, or a name the system knows. */
static int parse_id(const char *v, bool group, uint32_t *ret) {
        char *end;
        unsigned long n;

        if (*v >= '0' && *v <= '9') {
                errno = 0;
                n = strtoul(v, &end, 10);
                if (errno || *end || n >= UINT32_MAX)
                        return -EINVAL;
                *ret = (uint32_t) n;
                return 0;
        }
        if (group) {
                struct group *g = getgrnam(v);

                if (!g)
                        return -ENOENT;
                *ret = g->gr_gid;
        } else {
                struct passwd *p = getpwnam(v);

                if (!p)
                        return -ENOENT;
                *ret = p->pw_uid;
        }
        return 0;
}

static void tenant_key(struct load *l, struct tenant_conf *t, const char *key, const char *value) {
        bool is_default = strcmp(t->name, CONFIG_DEFAULT_TENANT) == 0;
        uint64_t *size = NULL;
        int r;

        if (strncmp(key, "match_", 6) == 0 && is_default) {
                fail(l, "[tenant:default] takes no match rule: it holds every client no other tenant matches");
                return;
        }
        if (strcmp(key, "match_uid") == 0 || strcmp(key, "match_gid") == 0) {
                bool group = key[6] == 'g';

                r = parse_id(value, group, group ? &t->match_gid : &t->match_uid);
                if (r < 0) {
                        fail(l, "%s: '%s' is not a %s number or a known %s name", key, value, group ? "group" : "user",
                             group ? "group" : "user");
                        return;
                }
                if (group)
                        t->match_gid_set = true;
                else
                        t->match_uid_set = true;
                return;
        }
        if (strcmp(key, "match_name") == 0) {
                if (!*value || strlen(value) > CONFIG_NAME_MAX || !gp_wire_text_is_valid(value)) {
                        fail(l, "match_name: a glob of 1 to %d bytes of UTF-8 with no control characters", CONFIG_NAME_MAX);
                        return;
                }
                snprintf(t->match_name, sizeof(t->match_name), "%s", value);
                t->match_name_set = true;
                return;
        }
        if (strcmp(key, "match_cgroup") == 0) {
                /* A cgroup path is the kernel's word, as a uid is: for pods and for systemd units alike. */
                if (!*value || strlen(value) > CONFIG_CGROUP_MAX || !gp_wire_text_is_valid(value) ||
                    (value[0] != '/' && value[0] != '*')) {
                        fail(l, "match_cgroup: a glob over a cgroup v2 path, starting with / or *, of 1 to %d bytes of "
                             "UTF-8 with no control characters", CONFIG_CGROUP_MAX);
                        return;
                }
                snprintf(t->match_cgroup, sizeof(t->match_cgroup), "%s", value);
                t->match_cgroup_set = true;
                return;
        }
        if (strcmp(key, "device") == 0) {
                uint64_t v;
                char *end;

                if (is_default) {
                        fail(l, "[tenant:default] takes no device: it holds every client no other tenant matches, on "
                             "every device");
                        return;
                }
                errno = 0;
                v = strtoull(value, &end, 10);
                if (!*value || *value < '0' || *value > '9' || *end || errno || v >= CONFIG_MAX_DEVICES) {
                        fail(l, "device: '%s' is not a device index (0 to %d)", value, CONFIG_MAX_DEVICES - 1);
                        return;
                }
                t->device = (uint32_t) v;
                t->device_set = true;
                return;
        }
        if (strcmp(key, "max") == 0)
                size = &t->max_bytes;
        else if (strcmp(key, "guarantee") == 0)
                size = &t->guarantee_bytes;
        else if (strcmp(key, "client_max") == 0) {
                size = &t->client_max_bytes;
                t->client_max_set = true;
        } else {
                fail(l, "unknown key '%s' in [tenant:%s] (match_uid, match_gid, match_name, match_cgroup, max, guarantee, "
                     "client_max, device)",
                     key, t->name);
                return;
        }
        if (gp_size_parse(value, size) < 0)
                fail(l, "%s: '%s' is not a size (e.g. 512M, 40G; 0 for none)", key, value);
        else if (size != &t->client_max_bytes)
                /* Where a max and a guarantee that disagree are said (validate()): the latest of the two. */
                snprintf(t->limit_where, sizeof(t->limit_where), "%s:%d: %s = %.64s", l->file, l->line, key, value);
}

static int on_key(void *user, const char *section, const char *key, const char *value) {
        struct load *l = user;
        char why[256];
        int r;

        if (l->failed)
                return 1;
        if (l->line_indented) {
                fail(l, "an indented line continues the previous value in INI; do not indent '%s'", key);
                return 0;
        }
        if (strncmp(section, "tenant:", 7) == 0) {
                struct tenant_conf *t;

                if (!gp_wire_tenant_name_is_valid(section + 7)) {
                        fail(l, "[%s]: a tenant name is 1 to %d letters, digits, '-', '_' or '.'", section, CONFIG_NAME_MAX);
                        return 0;
                }
                t = tenant_get(l, section + 7);
                if (t)
                        tenant_key(l, t, key, value);
                return !l->failed;
        }
        if (strcmp(section, "daemon") && strcmp(section, "pool") && strcmp(section, "limits")) {
                fail(l, *section ? "unknown section [%s] (daemon, pool, limits, tenant:NAME)" :
                                   "'%s' is outside any section", *section ? section : key);
                return 0;
        }
        r = options_set_key(&l->c->options, section, key, value, why, sizeof(why));
        if (r == -ENOENT)
                fail(l, "unknown key '%s' in [%s]", key, section);
        else if (r < 0)
                fail(l, "%s: %s", key, why);
        return !l->failed;
}

static int load_file(struct config *c, const char *file, char *err, size_t err_size) {
        struct load l = { .c = c, .file = file };
        int r;

        l.f = fopen(file, "re");
        if (!l.f) {
                r = -errno;
                snprintf(err, err_size, "%s: %s", file, strerror(errno));
                return r;
        }
        r = ini_parse_stream(read_line, &l, on_key, &l);
        fclose(l.f);
        if (l.failed) {
                snprintf(err, err_size, "%s", l.err);
                return -EINVAL;
        }
        if (r != 0) {
                /* inih's own refusal: a line that is neither [section] nor key = value. */
                snprintf(err, err_size, "%s:%d: not a [section] or a key = value line", file, r);
                return -EINVAL;
        }
        c->file_count++;
        return 0;
}

static int conf_filter(const struct dirent *d) {
        size_t len = strlen(d->d_name);

        return d->d_name[0] != '.' && len > 5 && strcmp(d->d_name + len - 5, ".conf") == 0;
}

/* Whether every client t matches is matched by earlier: earlier's rules are a subset of t's. */
static bool shadows(const struct tenant_conf *earlier, const struct tenant_conf *t) {
        if (earlier->match_uid_set && (!t->match_uid_set || t->match_uid != earlier->match_uid))
                return false;
        if (earlier->match_gid_set && (!t->match_gid_set || t->match_gid != earlier->match_gid))
                return false;
        if (earlier->match_name_set && (!t->match_name_set || strcmp(t->match_name, earlier->match_name) != 0))
                return false;
        if (earlier->match_cgroup_set && (!t->match_cgroup_set || strcmp(t->match_cgroup, earlier->match_cgroup) != 0))
                return false;
        return true;
}

static int validate(struct config *c, char *err, size_t err_size) {
        for (unsigned i = 0; i < c->tenant_count; i++) {
                const struct tenant_conf *t = &c->tenants[i];

                if (i > 0 && !t->match_uid_set && !t->match_gid_set && !t->match_name_set && !t->match_cgroup_set) {
                        snprintf(err, err_size, "%s: [tenant:%s] has no match_uid, match_gid, match_name or match_cgroup: it "
                                 "would hold no client",
                                 t->where, t->name);
                        return -EINVAL;
                }
                if (t->max_bytes && t->guarantee_bytes > t->max_bytes) {
                        snprintf(err, err_size, "%s: [tenant:%s] guarantees more than its max", t->limit_where, t->name);
                        return -EINVAL;
                }
                for (unsigned j = 1; j < i; j++)
                        if (shadows(&c->tenants[j], t)) {
                                snprintf(err, err_size,
                                         "%s: [tenant:%s] overlaps [tenant:%s] (%s): every client it matches is matched "
                                         "there first, so it would hold none",
                                         t->where, t->name, c->tenants[j].name, c->tenants[j].where);
                                return -EINVAL;
                        }
        }
        return 0;
}

int config_load(const char *path, bool required, struct config *c, char *err, size_t err_size) {
        char dir[PATH_MAX], file[PATH_MAX + 256];
        struct dirent **names = NULL;
        int n, r = 0;
        FILE *probe;

        memset(c, 0, sizeof(*c));
        options_defaults(&c->options);
        c->tenant_count = 1;
        snprintf(c->tenants[0].name, sizeof(c->tenants[0].name), "%s", CONFIG_DEFAULT_TENANT);
        snprintf(c->tenants[0].where, sizeof(c->tenants[0].where), "(built in)");

        probe = fopen(path, "re");
        if (!probe && errno == ENOENT && !required)
                return 0;
        if (probe)
                fclose(probe);
        r = load_file(c, path, err, err_size);
        if (r < 0)
                return r;
        snprintf(dir, sizeof(dir), "%s.d", path);
        n = scandir(dir, &names, conf_filter, alphasort);
        for (int i = 0; i < n; i++) {
                if (r == 0) {
                        snprintf(file, sizeof(file), "%s/%s", dir, names[i]->d_name);
                        r = load_file(c, file, err, err_size);
                }
                free(names[i]);
        }
        free(names);
        if (r < 0)
                return r;
        return validate(c, err, err_size);
}

size_t config_warnings(const struct config *c, char *buf, size_t size) {
        size_t count = 0, used = 0;

        if (size)
                buf[0] = '\0';
        if (c->options.obsolete_max_blocks) {
                int n = snprintf(buf, size, "max_blocks (--max-blocks) is obsolete and ignored: each process carves its own "
                                            "blocks from the segments it leases; bound a client by client_max\n");

                count++;
                if (n > 0 && (size_t) n < size)
                        used = (size_t) n;
        }
        for (unsigned i = 1; i < c->tenant_count; i++) {
                const struct tenant_conf *t = &c->tenants[i];

                if (t->match_uid_set || t->match_gid_set || t->match_cgroup_set)
                        continue;
                /* A name is the client's own claim: a uid's process can pick one that lands it here first. */
                for (unsigned j = i + 1; j < c->tenant_count; j++) {
                        const struct tenant_conf *later = &c->tenants[j];
                        int n;

                        if (!later->match_uid_set && !later->match_gid_set && !later->match_cgroup_set)
                                continue;
                        count++;
                        n = snprintf(buf + used, size - used,
                                     "%s: [tenant:%s] matches by client name only and comes before [tenant:%s] (%s), "
                                     "which matches by %s: a process of that %s can leave its tenant by calling itself "
                                     "'%s'; put [tenant:%s] first, or give [tenant:%s] a match_uid, match_gid or "
                                     "match_cgroup\n", t->where, t->name, later->name, later->where,
                                     later->match_uid_set ? "uid" : later->match_gid_set ? "gid" : "cgroup",
                                     later->match_uid_set ? "uid" : later->match_gid_set ? "gid" : "cgroup", t->match_name,
                                     later->name, t->name);
                        if (n > 0 && (size_t) n < size - used)
                                used += (size_t) n;
                }
        }
        return count;
}

bool tenant_conf_matches(const struct tenant_conf *t, uint32_t uid, uint32_t gid, const char *name, const char *cgroup) {
        /* fnmatch() without FNM_PATHNAME: '*' crosses '/', so a pod's pattern reaches down to its containers' scopes. */
        return (t->match_uid_set || t->match_gid_set || t->match_name_set || t->match_cgroup_set) &&
               (!t->match_uid_set || t->match_uid == uid) && (!t->match_gid_set || t->match_gid == gid) &&
               (!t->match_name_set || fnmatch(t->match_name, name, 0) == 0) &&
               (!t->match_cgroup_set || (cgroup && fnmatch(t->match_cgroup, cgroup, 0) == 0));
}
