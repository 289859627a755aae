/*
 * check_identity.c: daemon/identity.c through its header: the pod a kubelet's cgroup path
 * names, under either cgroup driver, and the principals memory is zeroed between.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#include "identity.h"
#include "suites.h"

#define UID "0c1f2e3d-4b5a-6978-8a9b-acbdcedf0f1e"

START_TEST(test_pod_uid_from_cgroup_paths) {
        char pod[IDENTITY_POD_UID_LEN + 1];

        /* The systemd driver writes the UID with underscores, in each QoS class's slice, and for guaranteed pods without one. */
        ck_assert(identity_pod_uid("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0c1f2e3d_4b5a_6978_"
                                   "8a9b_acbdcedf0f1e.slice/cri-containerd-abc.scope", pod));
        ck_assert_str_eq(pod, UID);
        ck_assert(identity_pod_uid("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0C1F2E3D_4B5A_6978_"
                                   "8A9B_ACBDCEDF0F1E.slice/cri-containerd-abc.scope", pod));
        ck_assert_str_eq(pod, UID);
        ck_assert(identity_pod_uid("/kubepods.slice/kubepods-pod0c1f2e3d_4b5a_6978_8a9b_acbdcedf0f1e.slice/x.scope", pod));
        ck_assert_str_eq(pod, UID);
        /* The cgroupfs driver: dashes, plain directories. */
        ck_assert(identity_pod_uid("/kubepods/besteffort/pod" UID "/0123456789abcdef", pod));
        ck_assert_str_eq(pod, UID);
        ck_assert(identity_pod_uid("/kubepods/pod" UID "/0123456789abcdef", pod));
        ck_assert_str_eq(pod, UID);
        /* Not a pod: outside the kubelet's tree, a slice that only says pod, a UID cut short or running on. */
        ck_assert(!identity_pod_uid("/system.slice/pod" UID ".service", pod));
        ck_assert(!identity_pod_uid("/user.slice/kubepods/pod" UID, pod));
        ck_assert(!identity_pod_uid("/kubepodsX/pod" UID, pod));
        ck_assert(!identity_pod_uid("/kubepods.slice/kubepods-besteffort.slice", pod));
        ck_assert(!identity_pod_uid("/kubepods/besteffort/pod0c1f2e3d-4b5a-6978-8a9b", pod));
        ck_assert(!identity_pod_uid("/kubepods/besteffort/pod" UID "0", pod));
        ck_assert(!identity_pod_uid("/kubepods/besteffort/apod" UID, pod));
        ck_assert(!identity_pod_uid("/", pod));
}
END_TEST

/* Resolves path as a daemon whose cgroup namespace is depth below the host's root, in pod (NULL: none), sees it. */
static const char *resolved(int depth, const char *pod, const char *path) {
        static char buf[IDENTITY_MAX_CGROUP];

        identity_view_set(depth, pod);
        ck_assert_int_eq(identity_resolve(path, buf), 0);
        return buf;
}

#define D "d0d0d0d0-e1e1-f2f2-a3a3-b4b4b4b4b4b4"
#define A_SLICE "kubepods-besteffort-pod0c1f2e3d_4b5a_6978_8a9b_acbdcedf0f1e.slice"

/*
 * Paths read from a cgroup namespace of the daemon's own (the DaemonSet's container, 4 levels
 * down in pod D): resolved from the host's root where that can be known, the pod they name.
 */
START_TEST(test_cgroup_paths_from_a_namespace) {
        char pod[IDENTITY_POD_UID_LEN + 1];

        /* In the host's namespace: as read. */
        ck_assert_str_eq(resolved(0, NULL, "/kubepods.slice/x.scope"), "/kubepods.slice/x.scope");
        /* Another pod of the same QoS class: its slices from its name. */
        ck_assert_str_eq(resolved(4, D, "/../../" A_SLICE "/cri-containerd-a.scope"),
                         "/kubepods.slice/kubepods-besteffort.slice/" A_SLICE "/cri-containerd-a.scope");
        ck_assert(identity_pod_uid(resolved(4, D, "/../../" A_SLICE "/cri-containerd-a.scope"), pod));
        ck_assert_str_eq(pod, UID);
        /* Another class, a guaranteed pod: one level further up. */
        ck_assert_str_eq(resolved(4, D, "/../../../kubepods-burstable.slice/kubepods-burstable-pod0c1f2e3d_4b5a_6978_8a9b_"
                                        "acbdcedf0f1e.slice/c.scope"),
                         "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0c1f2e3d_4b5a_6978_8a9b_acbdcedf0f1e"
                         ".slice/c.scope");
        ck_assert_str_eq(resolved(4, D, "/../../../kubepods-pod0c1f2e3d_4b5a_6978_8a9b_acbdcedf0f1e.slice/c.scope"),
                         "/kubepods.slice/kubepods-pod0c1f2e3d_4b5a_6978_8a9b_acbdcedf0f1e.slice/c.scope");
        /* Up to the root: the rest is the path. A user's cgroup named like a pod is none. */
        ck_assert_str_eq(resolved(4, D, "/../../../../user.slice/user-1000.slice/user@1000.service/" A_SLICE),
                         "/user.slice/user-1000.slice/user@1000.service/" A_SLICE);
        ck_assert(!identity_pod_uid(resolved(4, D, "/../../../../user.slice/user-1000.slice/user@1000.service/" A_SLICE), pod));
        ck_assert_str_eq(resolved(4, D, "/../../../../init.scope"), "/init.scope");
        ck_assert_str_eq(resolved(4, D, "/../../../.."), "/");
        /* The daemon's own container, or a sibling in its pod: relative, the daemon's own (as the node's). */
        ck_assert_str_eq(resolved(4, D, "/"), ".");
        ck_assert_int_eq(identity_place(".", pod), IDENTITY_DAEMON_POD);
        ck_assert_str_eq(pod, "");
        ck_assert_str_eq(resolved(4, D, "/sub"), "./sub");
        ck_assert_int_eq(identity_place("./sub", pod), IDENTITY_DAEMON_POD);
        ck_assert_str_eq(resolved(4, D, "/../cri-containerd-other.scope"), "../cri-containerd-other.scope");
        ck_assert_int_eq(identity_place("../cri-containerd-other.scope", pod), IDENTITY_DAEMON_POD);
        /* Names that say nothing of where they are stay relative, name no pod, and cannot be placed. */
        ck_assert_str_eq(resolved(4, D, "/../../system-" A_SLICE "/c"), "../../system-" A_SLICE "/c");
        ck_assert_int_eq(identity_place("../../system-" A_SLICE "/c", pod), IDENTITY_UNPLACED);
        ck_assert_int_eq(identity_place("../../../../..", pod), IDENTITY_UNPLACED);
        /* From the root, in no pod: the node's. */
        ck_assert_int_eq(identity_place(resolved(4, D, "/../../../../init.scope"), pod), IDENTITY_NODE);
        /* Unreadable: nobody's. */
        ck_assert_int_eq(identity_place(NULL, pod), IDENTITY_UNPLACED);
        /*
         * Without $GPUPOOL_POD_UID the slices are read all the same (its value decides
         * nothing); a sibling of the daemon's container may be of no pod, and is placed nowhere.
         */
        ck_assert_str_eq(resolved(4, NULL, "/../../" A_SLICE "/c.scope"),
                         "/kubepods.slice/kubepods-besteffort.slice/" A_SLICE "/c.scope");
        ck_assert_int_eq(identity_place(resolved(4, NULL, "/../../" A_SLICE "/c.scope"), pod), IDENTITY_POD);
        ck_assert_str_eq(pod, UID);
        ck_assert_int_eq(identity_place(resolved(4, NULL, "/"), pod), IDENTITY_DAEMON_POD);
        ck_assert_int_eq(identity_place(resolved(4, NULL, "/../other.scope"), pod), IDENTITY_UNPLACED);
        /* A wrong $GPUPOOL_POD_UID (pod A's) makes pod A nobody's but its own. */
        ck_assert_int_eq(identity_place(resolved(4, UID, "/../../" A_SLICE "/c.scope"), pod), IDENTITY_POD);
        ck_assert_str_eq(pod, UID);
        identity_view_set(0, NULL);
}
END_TEST

/*
 * Paths that do not fit the buffer, however they are shaped (the kernel writes none, but
 * identity_resolve() takes any string): -ENAMETOOLONG, and nothing written past the buffer.
 */
START_TEST(test_overlong_paths) {
        char raw[3 * IDENTITY_MAX_CGROUP + 2], buf[IDENTITY_MAX_CGROUP + 16];
        int n = 0;

        /* Climbing far above a namespace 4 levels deep, from the host's root, and a long name. */
        while (n < 3 * IDENTITY_MAX_CGROUP)
                n += snprintf(raw + n, sizeof(raw) - (size_t) n, "/..");
        for (int depth = 1; depth <= 4; depth += 3) {
                identity_view_set(depth, D);
                memset(buf, 0x5a, sizeof(buf));
                ck_assert_int_eq(identity_resolve(raw, buf), -ENAMETOOLONG);
                for (size_t i = IDENTITY_MAX_CGROUP; i < sizeof(buf); i++)
                        ck_assert_int_eq(buf[i], 0x5a);
        }
        memset(raw, 'x', sizeof(raw) - 1);
        raw[0] = '/';
        raw[sizeof(raw) - 1] = '\0';
        for (int depth = 0; depth <= 4; depth += 4) {
                identity_view_set(depth, D);
                memset(buf, 0x5a, sizeof(buf));
                ck_assert_int_eq(identity_resolve(raw, buf), -ENAMETOOLONG);
                for (size_t i = IDENTITY_MAX_CGROUP; i < sizeof(buf); i++)
                        ck_assert_int_eq(buf[i], 0x5a);
        }
        /* The longest that fits still resolves. */
        raw[IDENTITY_MAX_CGROUP - 1] = '\0';
        identity_view_set(0, NULL);
        ck_assert_int_eq(identity_resolve(raw, buf), 0);
        ck_assert_uint_eq(strlen(buf), IDENTITY_MAX_CGROUP - 1);
}
END_TEST

/*
 * The kubelet's cgroupfs driver (containerd's default, k3s) seen from the DaemonSet's cgroup
 * namespace, 4 levels down (/kubepods/besteffort/pod<D>/<container>) or 3 (a guaranteed pod,
 * /kubepods/pod<D>/<container>): a path cannot be rebuilt, but every shape names its pod.
 */
START_TEST(test_cgroupfs_paths_from_a_namespace) {
        char pod[IDENTITY_POD_UID_LEN + 1];

        /* A pod of the daemon's QoS class, of another class, a guaranteed one; and from the root. */
        ck_assert_str_eq(resolved(4, D, "/../../pod" UID "/0123abcd"), "../../pod" UID "/0123abcd");
        ck_assert_int_eq(identity_place("../../pod" UID "/0123abcd", pod), IDENTITY_POD);
        ck_assert_str_eq(pod, UID);
        ck_assert_int_eq(identity_place(resolved(4, NULL, "/../../../burstable/pod" UID "/c"), pod), IDENTITY_POD);
        ck_assert_str_eq(pod, UID);
        ck_assert_int_eq(identity_place(resolved(4, NULL, "/../../../pod" UID "/c"), pod), IDENTITY_POD);
        ck_assert_str_eq(pod, UID);
        ck_assert_str_eq(resolved(4, NULL, "/../../../../kubepods/besteffort/pod" UID "/c"), "/kubepods/besteffort/pod" UID "/c");
        ck_assert_int_eq(identity_place("/kubepods/besteffort/pod" UID "/c", pod), IDENTITY_POD);
        /* From a guaranteed pod: one level less to the root, the QoS classes beside the daemon's pod. */
        ck_assert_int_eq(identity_place(resolved(3, NULL, "/../../besteffort/pod" UID "/c"), pod), IDENTITY_POD);
        ck_assert_int_eq(identity_place(resolved(3, NULL, "/../../../kubepods/besteffort/pod" UID "/c"), pod), IDENTITY_POD);
        ck_assert_int_eq(identity_place(resolved(3, NULL, "/../../pod" UID "/c"), pod), IDENTITY_POD);
        /* Look-alikes name none: a pod element with more or less, a QoS class as deep as a pod. */
        ck_assert_int_eq(identity_place(resolved(4, D, "/../../pod" UID "0/c"), pod), IDENTITY_UNPLACED);
        ck_assert_int_eq(identity_place(resolved(4, D, "/../../xpod" UID "/c"), pod), IDENTITY_UNPLACED);
        ck_assert_int_eq(identity_place(resolved(4, D, "/../../guaranteed/pod" UID "/c"), pod), IDENTITY_UNPLACED);
        /* Beside the daemon's container: its pod's, where it knows it runs in one. */
        ck_assert_int_eq(identity_place(resolved(4, D, "/../fedcba98"), pod), IDENTITY_DAEMON_POD);
        ck_assert_int_eq(identity_place(resolved(4, NULL, "/../fedcba98"), pod), IDENTITY_UNPLACED);
        identity_view_set(0, NULL);
}
END_TEST

START_TEST(test_principals) {
        struct identity_table t = { 0 };
        uint64_t a, b, a_other_uid, a_again;

        /* Outside a pod the uid is the principal; in one, the pair; unknown, the client's own. */
        ck_assert_uint_eq(identity_principal(&t, 1000, true, NULL, 7), 1000);
        a = identity_principal(&t, 0, true, UID, 1);
        b = identity_principal(&t, 0, true, "11111111-2222-3333-4444-555555555555", 2);
        a_other_uid = identity_principal(&t, 1000, true, UID, 3);
        a_again = identity_principal(&t, 0, true, UID, 4);
        ck_assert_uint_ne(a, b);
        ck_assert_uint_ne(a, a_other_uid);
        ck_assert_uint_ne(a, 0);
        ck_assert_uint_eq(a, a_again);
        /* Ids stay as they were when pairs that sort before them come. */
        ck_assert_uint_eq(identity_principal(&t, 0, true, "00000000-0000-0000-0000-000000000000", 5) != a, 1);
        ck_assert_uint_eq(identity_principal(&t, 0, true, UID, 6), a);
        /* A client whose cgroup is unknown or unplaced is no one else, and itself only. */
        ck_assert_uint_ne(identity_principal(&t, 0, false, NULL, 8), identity_principal(&t, 0, false, NULL, 9));
        ck_assert_uint_eq(identity_principal(&t, 0, false, NULL, 8), identity_principal(&t, 0, false, NULL, 8));
        ck_assert_uint_ne(identity_principal(&t, 0, false, NULL, 8), 0);
        identity_table_free(&t);
}
END_TEST

Suite *suite_identity(void) {
        Suite *s = suite_create("identity");
        TCase *tc = tcase_create("identity");

        tcase_add_test(tc, test_pod_uid_from_cgroup_paths);
        tcase_add_test(tc, test_cgroup_paths_from_a_namespace);
        tcase_add_test(tc, test_overlong_paths);
        tcase_add_test(tc, test_cgroupfs_paths_from_a_namespace);
        tcase_add_test(tc, test_principals);
        suite_add_tcase(s, tc);
        return s;
}
