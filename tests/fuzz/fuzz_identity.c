/*
 * fuzz_identity.c: libFuzzer target for what the daemon reads of where a peer runs
 * (daemon/identity.c): a client's cgroup path, whose names a user with a delegated subtree (or a
 * container runtime) chooses, as the daemon's cgroup namespace shows it, resolved from the
 * host's root where that can be known, and the place it gives the client (the node, the
 * daemon's own pod, a pod, or nowhere). Checked on every input: the resolved path fits its
 * buffer, terminated; a pod's UID is one (8-4-4-4-12 lower-case hex digits); only the kubelet's
 * tree names a pod (a path from the host's root outside /kubepods never does); a path relative
 * to the daemon's namespace that climbs less than two levels is never another pod; and placing
 * is a function of the path (the same answer twice).
 *
 * Input: one byte for the depth of the daemon's namespace (0 to 5), one saying whether
 * $GPUPOOL_POD_UID is set, then the path as /proc/PID/cgroup's "0::" line would hold it.
 */
#include <ctype.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "identity.h"

#define DAEMON_POD "d0d0d0d0-e1e1-f2f2-a3a3-b4b4b4b4b4b4"

static void check_uid(const char *pod) {
        if (strlen(pod) != IDENTITY_POD_UID_LEN)
                abort();
        for (int i = 0; i < IDENTITY_POD_UID_LEN; i++) {
                bool dash = i == 8 || i == 13 || i == 18 || i == 23;

                if (dash ? pod[i] != '-' : !isxdigit((unsigned char) pod[i]) || isupper((unsigned char) pod[i]))
                        abort();
        }
}

/* How many ".." a relative path starts with ("." none); -1 from the host's root. */
static int climbs(const char *path) {
        int m = 0;

        if (path[0] != '.')
                return -1;
        for (const char *p = path; p[0] == '.' && p[1] == '.' && (p[2] == '/' || p[2] == '\0'); p += p[2] ? 3 : 2)
                m++;
        return m;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        char raw[IDENTITY_MAX_CGROUP * 2], resolved[IDENTITY_MAX_CGROUP], pod[IDENTITY_POD_UID_LEN + 1],
                again[IDENTITY_POD_UID_LEN + 1];
        enum identity_place place;

        if (size < 2)
                return 0;
        identity_view_set(data[0] % 6, data[1] & 1 ? DAEMON_POD : NULL);
        size -= 2;
        if (size >= sizeof(raw))
                size = sizeof(raw) - 1;
        memcpy(raw, data + 2, size);
        raw[size] = '\0';
        memset(resolved, 0x5a, sizeof(resolved));
        if (identity_resolve(raw, resolved) < 0)
                return 0;
        if (!memchr(resolved, '\0', sizeof(resolved)))
                abort();
        place = identity_place(resolved, pod);
        if (place == IDENTITY_POD) {
                int m = climbs(resolved);

                check_uid(pod);
                if (m < 0 && strncmp(resolved, "/kubepods", 9) != 0)
                        abort();        /* a pod outside the kubelet's tree */
                if (m >= 0 && m < 2)
                        abort();        /* the daemon's own container or pod taken for another pod */
        } else if (pod[0]) {
                abort();                /* a pod's UID without a pod */
        }
        if (identity_place(resolved, again) != place || strcmp(again, pod) != 0)
                abort();
        if (identity_pod_uid(resolved, again))
                check_uid(again);
        return 0;
}
