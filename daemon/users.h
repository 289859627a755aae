/*
 * users.h: which user a client's uid is, for the bounds the daemon keeps per user
 * (max_clients_per_uid, named objects, unread descriptors, the closer's threads), so that one
 * user's many uids count as one user. On Debian, Ubuntu and Fedora useradd gives each user a
 * range of subordinate uids in /etc/subuid, and with newuidmap she runs processes as any of
 * them in a user namespace of her own (rootless podman and docker): the kernel, and so
 * SO_PEERCRED, names each as another uid. A uid in such a range is its owner's; a uid of
 * USERS_SUBORDINATE_MIN or more whose process is in a login's cgroup (user-N.slice, which
 * systemd-logind makes and only root can move a process out of) is N's, for ranges handed out
 * by other means (a directory's subid service); any other uid is itself. docs/security.md
 * says what this cannot see.
 */
#ifndef GP_USERS_H
#define GP_USERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#define USERS_SUBUID_PATH "/etc/subuid"
/* The most ranges read from the file; past them the rest are left out, with a warning. */
#define USERS_MAX_RANGES 65536
/* The largest file read (a line per range, about 24 bytes each). */
#define USERS_MAX_FILE_BYTES (4u << 20)
/* Where uids no login's own can be start: useradd's UID_MAX is 60000, SUB_UID_MIN 100000. */
#define USERS_SUBORDINATE_MIN 65536

/*
 * Reads the subordinate ranges of path (the daemon: USERS_SUBUID_PATH), replacing those held.
 * A missing file is no range. Lines are "OWNER:START:COUNT", OWNER a user's name or uid; a line
 * that is not, or a range that overlaps one before it, is left out, counted in *ret_skipped
 * (may be NULL). Returns the number of ranges, or a negative errno (the ranges held stay).
 */
int users_load(const char *path, unsigned *ret_skipped);

/*
 * Reads path again where it changed (its size, time or inode) since the last look, at most once
 * a second (now_ms: a monotonic clock's milliseconds). Logs what it found when it changed.
 */
void users_refresh(const char *path, uint64_t now_ms);

/*
 * The user uid is: the owner of the subordinate range it lies in; else, for a uid of
 * USERS_SUBORDINATE_MIN or more, the login whose slice cgroup (the client's cgroup v2 path
 * from the host's root, or NULL) lies in; else uid itself.
 */
uid_t users_owner(uid_t uid, const char *cgroup);

/*
 * Whether two clients are of one group for the bounds the daemon keeps per user (connections,
 * named objects, unread descriptors, the closer's threads): in a pod, the pod, whatever uids its
 * processes take; outside pods, the user (users_owner()), whatever subordinate uids she runs
 * as. pod "" outside one.
 */
static inline bool users_same_group(uid_t user_a, const char *pod_a, uid_t user_b, const char *pod_b) {
        return pod_b[0] ? strcmp(pod_a, pod_b) == 0 : !pod_a[0] && user_a == user_b;
}

/* Drops every range held (tests). */
void users_reset(void);

#endif
