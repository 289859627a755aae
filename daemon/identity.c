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

int identity_read_cgroup(pid_t pid, char buf[IDENTITY_MAX_CGROUP]) {
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

bool identity_pod_uid(const char *cgroup, char ret[IDENTITY_POD_UID_LEN + 1]) {
        const char *p;

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

/* Whether process pid is in the daemon's PID namespace (the same inode of /proc/PID/ns/pid). */
static bool same_pid_ns(pid_t pid) {
        struct stat mine, its;
        char path[64];

        snprintf(path, sizeof(path), "/proc/%d/ns/pid", (int) pid);
        return stat("/proc/self/ns/pid", &mine) == 0 && stat(path, &its) == 0 && mine.st_ino == its.st_ino &&
               mine.st_dev == its.st_dev;
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
        if (identity_pod_uid(cgroup, pod)) {
                char mine[IDENTITY_MAX_CGROUP], my_pod[IDENTITY_POD_UID_LEN + 1];

                /* The daemon's own pod is the operator's (kubectl exec into the daemon's container): no other pod is. */
                if (identity_read_cgroup(getpid(), mine) == 0 && identity_pod_uid(mine, my_pod) && strcmp(pod, my_pod) == 0 &&
                    same_pid_ns(pid))
                        return true;
                snprintf(why, why_size, "for the node's operator, not a process in a pod (pod %s)", pod);
                return false;
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

uint64_t identity_principal(struct identity_table *t, uint32_t uid, bool cgroup_known, const char *pod_uid,
                            uint64_t client_id) {
        size_t lo = 0, hi = t->count;

        if (!cgroup_known)
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
