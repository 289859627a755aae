/* identity.c: a client's uid and cgroup, and the principals memory is zeroed between (see identity.h). */
#define _GNU_SOURCE
#include "identity.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct identity_pod {
        uint32_t uid;
        uint32_t id;                    /* in the order pairs were first seen: stable while the array is sorted */
        char pod[IDENTITY_POD_UID_LEN + 1];
};

/* Principals: below 2^32 a uid outside any pod; POD_BIT with an index: a (uid, pod); OWN_BIT with a client id: its own. */
#define POD_BIT (1ULL << 62)
#define OWN_BIT (1ULL << 63)

/* Where the daemon's cgroup namespace lies (identity_view_init()). */
static struct {
        int depth;                              /* its root's levels below the host's: 0 in the host's namespace */
        char pod[IDENTITY_POD_UID_LEN + 1];     /* the pod the daemon runs in ($GPUPOOL_POD_UID), or "": a claim, for the log */
} view;

static bool uid_at(const char *s, char ret[IDENTITY_POD_UID_LEN + 1]);

/* How many "/.." the path starts with (the levels it climbs above the reader's cgroup namespace root); *rest after them. */
static int climbs(const char *path, const char **rest) {
        int m = 0;

        while (strncmp(path, "/..", 3) == 0 && (path[3] == '/' || path[3] == '\0')) {
                path += 3;
                m++;
        }
        *rest = path;
        return m;
}

/* Reads pid's "0::" line of /proc/PID/cgroup into buf, as the daemon's cgroup namespace shows it. */
static int read_raw(pid_t pid, char buf[IDENTITY_MAX_CGROUP]) {
        char path[64], line[IDENTITY_MAX_CGROUP + 64];
        int r = -ENOENT;
        FILE *f;

        buf[0] = '\0';
        if (pid <= 0)
                return -ESRCH;
        snprintf(path, sizeof(path), "/proc/%d/cgroup", (int) pid);
        if (!(f = fopen(path, "re")))
                return -errno;
        while (r == -ENOENT && fgets(line, sizeof(line), f)) {
                size_t len;

                if (strncmp(line, "0::", 3) != 0)
                        continue;
                len = strcspn(line + 3, "\n");
                if (!line[3 + len] || len >= IDENTITY_MAX_CGROUP) {
                        r = -ENAMETOOLONG;      /* cut short by the line buffer, or too long to keep */
                        break;
                }
                memcpy(buf, line + 3, len);
                buf[len] = '\0';
                r = 0;
        }
        fclose(f);
        return r;
}

void identity_view_set(int depth, const char *pod) {
        view.depth = depth;
        snprintf(view.pod, sizeof(view.pod), "%s", pod ? pod : "");
}

/*
 * Whether pod is the one the daemon's own cgroup names, where the kernel shows it (in the
 * host's namespace): the one pod whose clients are the daemon's own. Never taken from
 * $GPUPOOL_POD_UID, which only says that the daemon runs in a pod (and may be wrong).
 */
static bool own_pod_is(const char *pod) {
        char mine[IDENTITY_MAX_CGROUP], own[IDENTITY_POD_UID_LEN + 1];

        return !view.depth && read_raw(getpid(), mine) == 0 && mine[0] == '/' && identity_pod_uid(mine, own) &&
               strcmp(own, pod) == 0;
}

int identity_view_init(char *what, size_t what_size) {
        char init[IDENTITY_MAX_CGROUP], pod[IDENTITY_POD_UID_LEN + 1] = "";
        const char *env = getenv("GPUPOOL_POD_UID"), *rest;
        int depth = 0;

        /* The host's init is in the host's root (or a child of it): how far up it lies is how deep the namespace is. */
        if (read_raw(1, init) == 0)
                depth = climbs(init, &rest);
        if (env && *env && (strlen(env) != IDENTITY_POD_UID_LEN || !uid_at(env, pod))) {
                snprintf(what, what_size, "$GPUPOOL_POD_UID is '%.64s', not a pod's UID (8-4-4-4-12 hex digits)", env);
                return -EINVAL;
        }
        identity_view_set(depth, pod);
        if (!depth)
                snprintf(what, what_size, "cgroups: in the host's cgroup namespace; pods by the kubelet's cgroup names "
                         "(systemd and cgroupfs drivers)");
        else if (pod[0])
                snprintf(what, what_size, "cgroups: in a cgroup namespace %d levels below the host's root, in a pod "
                         "($GPUPOOL_POD_UID %s): other pods by the kubelet's cgroup names (systemd and cgroupfs drivers); "
                         "a client whose cgroup names none is a principal of its own and never the operator", depth, pod);
        else
                snprintf(what, what_size, "cgroups: in a cgroup namespace %d levels below the host's root and "
                         "$GPUPOOL_POD_UID unset: pods by the kubelet's cgroup names (systemd and cgroupfs drivers); the "
                         "daemon's own container is its own, and a client beside it (another container of its pod, or "
                         "of no pod) cannot be placed: a principal of its own, never the operator (the DaemonSet sets "
                         "$GPUPOOL_POD_UID)", depth);
        return 0;
}

int identity_resolve(const char *raw, char buf[IDENTITY_MAX_CGROUP]) {
        const char *rest, *first, *end;
        int m = climbs(raw, &rest), n = 0;

        if (!view.depth || m == view.depth) {
                /* From the host's root (above it, there is nothing to climb to). */
                n = snprintf(buf, IDENTITY_MAX_CGROUP, "%s", view.depth && !*rest ? "/" : rest);
                return n < IDENTITY_MAX_CGROUP ? 0 : -ENAMETOOLONG;
        }
        first = rest[0] == '/' ? rest + 1 : rest;
        end = strchrnul(first, '/');
        /*
         * Below a level the daemon's namespace hides, two or more above its own cgroup: the
         * kubelet's tree, where the daemon runs in a pod. A systemd slice's name says where it
         * is ("kubepods-besteffort-pod<UID>.slice" is in kubepods-besteffort.slice, in
         * kubepods.slice): the path from the host's root follows. Only root makes cgroups there
         * (a user's delegated subtree is under user.slice, which a path from the root shows).
         */
        if (m < view.depth && m >= 2 && strncmp(first, "kubepods", 8) == 0 && end - first > 6 &&
            strncmp(end - 6, ".slice", 6) == 0) {
                /* Each prefix up to a dash, and the whole name, is a slice of its own: "/a.slice/a-b.slice/a-b-c.slice". */
                for (const char *q = first, *base_end = end - 6;; q++)
                        if (q == base_end || *q == '-') {
                                n += snprintf(buf + n, IDENTITY_MAX_CGROUP - (size_t) n, "/%.*s.slice", (int) (q - first),
                                              first);
                                if (n >= IDENTITY_MAX_CGROUP)
                                        return -ENAMETOOLONG;
                                if (q == base_end)
                                        break;
                        }
                n += snprintf(buf + n, IDENTITY_MAX_CGROUP - (size_t) n, "%s", end);
                return n < IDENTITY_MAX_CGROUP ? 0 : -ENAMETOOLONG;
        }
        /* Else relative to the namespace's root, and said so: "." for it, "../x" for a sibling. */
        n = snprintf(buf, IDENTITY_MAX_CGROUP, "%s", m ? "" : ".");
        /* A path that climbs further than the namespace is deep (more than the kernel writes) may not fit. */
        for (int i = 0; i < m && n < IDENTITY_MAX_CGROUP; i++)
                n += snprintf(buf + n, IDENTITY_MAX_CGROUP - (size_t) n, "%s..", i ? "/" : "");
        if (n >= IDENTITY_MAX_CGROUP)
                return -ENAMETOOLONG;
        n += snprintf(buf + n, IDENTITY_MAX_CGROUP - (size_t) n, "%s", strcmp(rest, "/") == 0 ? "" : rest);
        return n < IDENTITY_MAX_CGROUP ? 0 : -ENAMETOOLONG;
}

int identity_read_cgroup(pid_t pid, char buf[IDENTITY_MAX_CGROUP]) {
        char raw[IDENTITY_MAX_CGROUP];
        int r = read_raw(pid, raw);

        if (r == 0)
                r = identity_resolve(raw, buf);
        if (r < 0)
                buf[0] = '\0';
        return r;
}

/* Whether s starts with a pod UID (dashes or, in systemd's unit names, underscores); copies it, dashed, into ret. */
static bool uid_at(const char *s, char ret[IDENTITY_POD_UID_LEN + 1]) {
        for (int i = 0; i < IDENTITY_POD_UID_LEN; i++) {
                bool dash = i == 8 || i == 13 || i == 18 || i == 23;

                if (dash ? (s[i] != '-' && s[i] != '_') : !isxdigit((unsigned char) s[i]))
                        return false;
                ret[i] = dash ? '-' : (char) tolower((unsigned char) s[i]);
        }
        ret[IDENTITY_POD_UID_LEN] = '\0';
        return true;
}

/*
 * How many levels a path relative to the daemon's cgroup namespace climbs ("." none, ".." one,
 * "../.." two), and the rest after them ("" or "/..."); -1 for a path from the host's root.
 */
static int relative_climbs(const char *cgroup, const char **rest) {
        int m = 0;

        if (cgroup[0] != '.')
                return -1;
        if (cgroup[1] != '.') {
                *rest = cgroup + 1;
                return 0;
        }
        for (;;) {
                m++;
                cgroup += 2;
                if (strncmp(cgroup, "/..", 3) != 0 || (cgroup[3] != '/' && cgroup[3] != '\0'))
                        break;
                cgroup++;
        }
        *rest = cgroup;
        return m;
}

/* Whether the path element at s (up to end) is exactly "pod<UID>" (the cgroupfs driver's); the UID into ret. */
static bool cgroupfs_pod_at(const char *s, const char *end, char ret[IDENTITY_POD_UID_LEN + 1]) {
        return end - s == 3 + IDENTITY_POD_UID_LEN && strncmp(s, "pod", 3) == 0 && uid_at(s + 3, ret);
}

bool identity_pod_uid(const char *cgroup, char ret[IDENTITY_POD_UID_LEN + 1]) {
        const char *p, *rest;
        int m = relative_climbs(cgroup, &rest);

        /*
         * Relative to the daemon's cgroup namespace, two or more levels above its own cgroup:
         * the kubelet's cgroupfs driver's tree, which a path cannot be rebuilt from (the QoS
         * class of the daemon's pod is hidden), in its shapes: a pod beside the daemon's
         * ("../../pod<UID>/c"), in another QoS class ("../../../burstable/pod<UID>/c"), or a
         * guaranteed pod (".../../pod<UID>/c"). The systemd driver's slices were rebuilt into a
         * path from the root (identity_resolve()). Nothing else relative names a pod.
         */
        if (m >= 0) {
                const char *first, *end;

                if (m < 2 || rest[0] != '/')
                        return false;
                first = rest + 1;
                end = strchrnul(first, '/');
                if (cgroupfs_pod_at(first, end, ret))
                        return true;
                if (*end != '/' || !((end - first == 9 && strncmp(first, "burstable", 9) == 0) ||
                                     (end - first == 10 && strncmp(first, "besteffort", 10) == 0)))
                        return false;
                first = end + 1;
                return cgroupfs_pod_at(first, strchrnul(first, '/'), ret);
        }
        /* Only the kubelet's tree names pods: a path elsewhere that says "pod" is not one. */
        if (strncmp(cgroup, "/kubepods", 9) != 0 || (cgroup[9] != '/' && cgroup[9] != '.' && cgroup[9] != '\0'))
                return false;
        for (p = cgroup; (p = strchr(p, '/')); p++) {
                const char *element = p + 1, *end = strchrnul(element, '/'), *at;

                /* "pod<UID>" (cgroupfs), or "kubepods[-<qos>]-pod<UID>.slice" (systemd). */
                for (at = element; (at = memmem(at, (size_t) (end - at), "pod", 3)); at += 3)
                        if ((at == element || at[-1] == '-') && end - (at + 3) >= IDENTITY_POD_UID_LEN &&
                            uid_at(at + 3, ret) &&
                            (at + 3 + IDENTITY_POD_UID_LEN == end || strncmp(at + 3 + IDENTITY_POD_UID_LEN, ".slice", 6) == 0))
                                return true;
        }
        return false;
}

enum identity_place identity_place(const char *cgroup, char ret_pod[IDENTITY_POD_UID_LEN + 1]) {
        const char *rest;
        int m;

        ret_pod[0] = '\0';
        if (!cgroup || !cgroup[0])
                return IDENTITY_UNPLACED;
        m = relative_climbs(cgroup, &rest);
        /* The daemon's own container (kubectl exec lands there), whatever $GPUPOOL_POD_UID says. */
        if (m == 0)
                return IDENTITY_DAEMON_POD;
        /* Beside it: another container of its pod where it runs in one (the kubelet's layout), else unknown. */
        if (m == 1)
                return view.pod[0] ? IDENTITY_DAEMON_POD : IDENTITY_UNPLACED;
        if (identity_pod_uid(cgroup, ret_pod)) {
                /* Seen from the host's namespace, the daemon's own pod is known by its own path. */
                if (m < 0 && own_pod_is(ret_pod)) {
                        ret_pod[0] = '\0';
                        return IDENTITY_DAEMON_POD;
                }
                return IDENTITY_POD;
        }
        ret_pod[0] = '\0';
        /* From the host's root and in no pod: the node's. Relative and naming no pod: nobody can say whose. */
        return m < 0 ? IDENTITY_NODE : IDENTITY_UNPLACED;
}

unsigned identity_pid_ns_depth(pid_t pid) {
        char path[64], line[256];
        unsigned depth = 0;
        FILE *f;

        if (pid > 0)
                snprintf(path, sizeof(path), "/proc/%d/status", (int) pid);
        else
                snprintf(path, sizeof(path), "/proc/self/status");
        f = fopen(path, "re");
        if (!f)
                return 0;
        while (fgets(line, sizeof(line), f))
                if (strncmp(line, "NSpid:", 6) == 0) {
                        for (char *save, *p = strtok_r(line + 6, " \t\n", &save); p; p = strtok_r(NULL, " \t\n", &save))
                                depth++;
                        break;
                }
        fclose(f);
        return depth;
}

/*
 * Whether process pid, a peer the daemon's PID namespace sees (SO_PEERCRED gave its pid: it is
 * in that namespace or one below it), is in that namespace itself: as deep as the daemon. From
 * /proc/PID/status, which anyone may read, not /proc/PID/ns/pid, which needs ptrace rights over
 * the process: the unit's user has none over root's processes.
 */
static bool same_pid_ns(pid_t pid) {
        unsigned theirs = identity_pid_ns_depth(pid);

        return theirs && theirs == identity_pid_ns_depth(0);
}

bool identity_is_operator(uid_t uid, pid_t pid, const char *cgroup, char *why, size_t why_size) {
        char pod[IDENTITY_POD_UID_LEN + 1];

        if (uid != 0 && uid != geteuid()) {
                snprintf(why, why_size, "for root or the daemon's own user");
                return false;
        }
        if (!cgroup) {
                snprintf(why, why_size, "for the node's operator, and the daemon cannot tell where this process runs "
                         "(pid %d, its cgroup unreadable)", (int) pid);
                return false;
        }
        switch (identity_place(cgroup, pod)) {
        case IDENTITY_POD:
                snprintf(why, why_size, "for the node's operator, not a process in a pod (pod %s)", pod);
                return false;
        case IDENTITY_UNPLACED:
                snprintf(why, why_size, "for the node's operator, and the daemon cannot place this process's cgroup "
                         "(%.96s): neither the node's, the daemon's own container's nor a pod's", cgroup);
                return false;
        case IDENTITY_NODE:
        case IDENTITY_DAEMON_POD:
                break;
        }
        if (!same_pid_ns(pid)) {
                snprintf(why, why_size, "for the node's operator, not a process in a container (a PID namespace of its own)");
                return false;
        }
        return true;
}

static int cmp_pod(uint32_t uid, const char *pod, const struct identity_pod *x) {
        if (uid != x->uid)
                return uid < x->uid ? -1 : 1;
        return strcmp(pod, x->pod);
}

uint64_t identity_principal(struct identity_table *t, uint32_t uid, bool placed, const char *pod_uid,
                            uint64_t client_id) {
        size_t lo = 0, hi = t->count;

        if (!placed)
                return OWN_BIT | client_id;
        if (!pod_uid)
                return uid;
        while (lo < hi) {
                size_t mid = (lo + hi) / 2;
                int c = cmp_pod(uid, pod_uid, &t->pods[mid]);

                if (c == 0)
                        return POD_BIT | t->pods[mid].id;
                if (c < 0)
                        hi = mid;
                else
                        lo = mid + 1;
        }
        /* A pair not seen before goes in at lo, under the next id; none past the bound (then its own). */
        if (t->count == IDENTITY_MAX_PODS)
                return OWN_BIT | client_id;
        if (t->count == t->room) {
                size_t room = t->room ? t->room * 2 : 16;
                struct identity_pod *pods = realloc(t->pods, room * sizeof(*pods));

                if (!pods)
                        return OWN_BIT | client_id;
                t->pods = pods;
                t->room = room;
        }
        memmove(&t->pods[lo + 1], &t->pods[lo], (t->count - lo) * sizeof(*t->pods));
        t->pods[lo].uid = uid;
        t->pods[lo].id = (uint32_t) t->count;
        snprintf(t->pods[lo].pod, sizeof(t->pods[lo].pod), "%s", pod_uid);
        t->count++;
        return POD_BIT | t->pods[lo].id;
}

void identity_table_free(struct identity_table *t) {
        free(t->pods);
        *t = (struct identity_table) { 0 };
}
