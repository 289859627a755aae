/*
 * identity.h: who a client is, for the memory that moves between clients: its uid and its
 * cgroup v2 path (on Kubernetes, its pod; under systemd, its unit). On a node where every pod
 * runs as root the uid alone tells no pod from another, so memory that moves between uids or
 * between pods is zeroed (or fresh). Each principal gets a 64-bit id the pool compares
 * (pool_owner_attach()): the uid alone outside a pod; an interned (uid, pod) pair in a pod; and
 * for a client whose cgroup cannot be read (pid 0 from another PID namespace, /proc hidden) an
 * id of its own, so that memory moving to or from it is always zeroed.
 */
#ifndef GP_IDENTITY_H
#define GP_IDENTITY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The longest cgroup path kept; a longer one is not trusted to name a pod, and its client is a principal of its own. */
#define IDENTITY_MAX_CGROUP 256
/* A pod's UID as Kubernetes writes it: 8-4-4-4-12 hex digits. */
#define IDENTITY_POD_UID_LEN 36
/* The most (uid, pod) pairs interned; past them a new pod's clients are principals of their own (always zeroed). */
#define IDENTITY_MAX_PODS 65536

/*
 * Where the daemon's cgroup namespace lies, read once at start: how many levels below the
 * host's cgroup root (the host's init, /proc/1/cgroup, seen from inside: a container runtime
 * gives an unprivileged container a namespace of its own on cgroup v2), and the pod the
 * daemon runs in ($GPUPOOL_POD_UID, the DaemonSet's downward API). Says which in what.
 * Returns 0, or -EINVAL for a $GPUPOOL_POD_UID that is no pod UID (what says so).
 */
int identity_view_init(char *what, size_t what_size);
/* The same, told (tests). */
void identity_view_set(int depth, const char *pod);

/*
 * A cgroup path as the daemon's namespace shows it ("/../../kubepods-besteffort-pod<UID>.slice/
 * x.scope" in a namespace of its own) into buf, from the host's root where that can be known:
 * in the host's namespace, or climbing to its root, as it is; in the daemon's own pod (the
 * kubelet's tree), a systemd slice's path from its name. Else relative to the namespace's root,
 * starting with "." ("." the daemon's own cgroup, "../x" a sibling), which names no pod but the
 * daemon's own (identity_pod_uid()). Returns 0 or -ENAMETOOLONG.
 */
int identity_resolve(const char *raw, char buf[IDENTITY_MAX_CGROUP]);

/*
 * Reads process pid's cgroup v2 path (/proc/PID/cgroup, the "0::" line, which a hybrid
 * hierarchy has too) into buf, resolved (identity_resolve()). Returns 0, -ESRCH for pid 0 (a
 * process the daemon's PID namespace cannot see), -ENAMETOOLONG for a path longer than
 * IDENTITY_MAX_CGROUP - 1, or another negative errno.
 */
int identity_read_cgroup(pid_t pid, char buf[IDENTITY_MAX_CGROUP]);

/*
 * The pod UID in a kubelet's cgroup path, with either cgroup driver's naming, into ret (lower
 * case, with dashes, NUL-terminated): from the host's root
 * ("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<UID>.slice/...", the
 * UID's dashes as underscores; "/kubepods/besteffort/pod<UID>/..."), or relative to the
 * daemon's cgroup namespace two or more levels up in the cgroupfs driver's shapes
 * ("../../pod<UID>/...", "../../../burstable/pod<UID>/..."). Returns whether the path is a pod's.
 */
bool identity_pod_uid(const char *cgroup, char ret[IDENTITY_POD_UID_LEN + 1]);

/* Where a client's cgroup puts it: what its principal is, and whether it may be the node's operator. */
enum identity_place {
        /*
         * Its cgroup unreadable, or a path the daemon cannot place (relative to its namespace
         * and naming no pod: beside the daemon's container with $GPUPOOL_POD_UID unset, or a
         * layout it does not know): a principal of its own, always zeroed, never the operator.
         */
        IDENTITY_UNPLACED,
        IDENTITY_NODE,          /* from the host's root, in no pod: its uid */
        /*
         * In the daemon's own container ("." and below), beside it in its pod ($GPUPOOL_POD_UID
         * set), or, seen from the host's namespace, in the pod the daemon's own cgroup names:
         * its uid, as on the node. $GPUPOOL_POD_UID's value decides nothing.
         */
        IDENTITY_DAEMON_POD,
        IDENTITY_POD,           /* in another pod, named by the kubelet's cgroups: (uid, pod) */
};

/*
 * Where a resolved cgroup path (identity_read_cgroup(); NULL: unreadable) puts its client,
 * with the pod's UID into ret_pod for IDENTITY_POD ("" else).
 */
enum identity_place identity_place(const char *cgroup, char ret_pod[IDENTITY_POD_UID_LEN + 1]);

/*
 * How many PID namespaces deep process pid (0: the daemon) is, as /proc sees it: the count of
 * its NSpid entries (/proc/PID/status, readable without ptrace rights). 0 when unknown.
 */
unsigned identity_pid_ns_depth(pid_t pid);

/*
 * Whether a client of uid and process pid is the node's operator: root or the daemon's own
 * user, on the node itself: on the node or in the daemon's own container or pod
 * (identity_place(): kubectl exec lands there), in the daemon's PID namespace (not a
 * container's). Root in another pod, in a cgroup the daemon cannot place, or in a container is
 * root only there. cgroup is the one identity_read_cgroup() gave for pid (NULL:
 * it could not be read). Else says why not in why.
 */
bool identity_is_operator(uid_t uid, pid_t pid, const char *cgroup, char *why, size_t why_size);

/* The principals of pods seen so far. */
struct identity_table {
        struct identity_pod *pods;      /* sorted by (uid, pod UID) */
        size_t count, room;
};

/*
 * The principal of a client of uid, placed (identity_place() gave other than
 * IDENTITY_UNPLACED) and with its pod UID (NULL: not in another pod), or unplaced its own,
 * made from client_id. Never fails: where the table
 * is full or out of memory, the client is a principal of its own.
 */
uint64_t identity_principal(struct identity_table *t, uint32_t uid, bool placed, const char *pod_uid,
                            uint64_t client_id);

/* Frees the table. */
void identity_table_free(struct identity_table *t);

#endif
