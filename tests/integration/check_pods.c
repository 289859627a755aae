/*
 * check_pods.c: clients told apart by their cgroup as well as their uid, with pods simulated as
 * the kubelet's cgroups (/kubepods.slice/.../kubepods-besteffort-pod<UID>.slice/...scope) in
 * the cgroup v2 hierarchy: root processes of two pods never see each other's bytes, a pod's
 * own memory comes back to it unzeroed, status shows each client's cgroup and pod, root in a
 * pod is no operator, and a client the daemon sees as pid 0 is a principal of its own. Needs
 * root and a writable cgroup v2 hierarchy; skipped, saying why, elsewhere.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpupool.h"
#include "suites.h"
#include "testlib.h"

#define MiB (1ULL << 20)
#define POD_A TEST_POD_A
#define POD_B TEST_POD_B
#define POD_D TEST_POD_D        /* the daemon's own, in a cgroup namespace of its own */
#define MARK 0xa5

/* Whether pod_dir() lays pods out as the kubelet's cgroupfs driver does, else as its systemd driver does. */
static bool cgroupfs_layout;

static void pod_dir(const char *mnt, const char *uid, int depth, char *buf, size_t size) {
        pod_cgroup_dir(cgroupfs_layout, mnt, uid, depth, buf, size);
}

struct pod_client {
        const char *mnt, *pod;
        bool wants_mark;                /* its memory must hold the mark (its own pod's), or must not */
        int up[2], go[2];               /* allocated, to the test; go on, from it */
};

/* In pod's cgroup: allocates 16 MiB, checks the mark is (or is not) there, marks it, says so, waits, and leaves. */
static int pod_client(struct testd *d, void *arg) {
        struct pod_client *pc = arg;
        char dir[1024];
        gpupool_client *c;
        unsigned char *p;
        char b;

        pod_dir(pc->mnt, pc->pod, 4, dir, sizeof(dir));
        if (cgroup_join(dir, 0) < 0)
                return 2;
        if (gpupool_connect(d->sock, pc->pod == (const char *) POD_A ? "in-pod-a" : "in-pod-b", &c) < 0 ||
            gpupool_alloc(c, 0, 16 * MiB, (void **) &p) < 0)
                return 3;
        for (size_t i = 0; i < 16 * MiB; i += 4096)
                if ((p[i] == MARK) != pc->wants_mark) {
                        fprintf(stderr, "pod_client %s: byte %zu is %#x\n", pc->pod, i, p[i]);
                        return 4;
                }
        memset(p, MARK, 16 * MiB);
        if (write(pc->up[1], "a", 1) != 1 || read(pc->go[0], &b, 1) != 1)
                return 5;
        gpupool_free(c, p);
        gpupool_disconnect(c);          /* the segment goes back to the cache, still this pod's */
        return 0;
}

/* Runs a client in pod; with a tenant to look for, checks what status says of it while it holds its block. */
static void run_in_pod(struct testd *d, const char *mnt, const char *pod, bool wants_mark, const char *look) {
        struct pod_client pc = { .mnt = mnt, .pod = pod, .wants_mark = wants_mark };
        pid_t pid;
        char b;

        ck_assert(pipe(pc.up) == 0 && pipe(pc.go) == 0);
        pid = spawn(pod_client, d, &pc);
        close(pc.up[1]);        /* its end only: a client that fails closes the pipe */
        close(pc.go[0]);
        pc.up[1] = pc.go[0] = -1;
        ck_assert_msg(read(pc.up[0], &b, 1) == 1, "the client in pod %s failed with %d", pod, reap(pid));
        if (look) {
                json_t *st = testd_ctl(d, "status");
                json_t *c = status_client_by_pid(st, pid);
                const char *cgroup = c ? json_string_value(json_object_get(c, "cgroup")) : NULL;

                ck_assert_ptr_nonnull(c);
                ck_assert_str_eq(json_string_value(json_object_get(c, "pod_uid")), pod);
                ck_assert_str_eq(json_string_value(json_object_get(c, "tenant")), look);
                ck_assert_msg(cgroup && strstr(cgroup, "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod") &&
                              strstr(cgroup, "/cri-containerd-test.scope"), "%s", cgroup ? cgroup : "(none)");
                json_decref(st);
        }
        ck_assert_int_eq(write(pc.go[1], "g", 1), 1);
        ck_assert_int_eq(reap(pid), 0);
        close(pc.up[0]);
        close(pc.go[1]);
}

/*
 * Starts the daemon as the node runs it: in the host's cgroup namespace, or (in_pod) as the
 * DaemonSet's unprivileged container on cgroup v2, in pod D's container cgroup with a cgroup
 * namespace rooted there (what containerd, CRI-O and podman give it) and $GPUPOOL_POD_UID.
 */
static void start_daemon(struct testd *d, const char *mnt, bool in_pod, const char *config) {
        char dir[1024];

        pod_dir(mnt, POD_D, 4, dir, sizeof(dir));
        /* One segment's worth, all of it cacheable: the one segment goes from client to client. */
        if (in_pod)
                testd_start_in_pod(d, dir, POD_D, "--host-capacity", "16M", "--max-cached", "100%", "--config", config, NULL);
        else
                testd_start(d, "--host-capacity", "16M", "--max-cached", "100%", "--config", config, NULL);
}

/*
 * Root in pod A marks 16 MiB and leaves; root in pod A again gets that memory back unzeroed
 * (one principal), marks it and leaves; root in pod B then gets it without a byte of the mark.
 * A tenant by match_cgroup holds pod A's clients, and pod B's fall to the default.
 */
static void pods_see_nothing_of_each_other(const char *test, bool in_pod) {
        char mnt[512];
        struct testd d;

        if (!pods_ready(test, mnt, sizeof(mnt)))
                return;
        start_daemon(&d, mnt, in_pod, conf_new("[tenant:pod-a]\nmatch_cgroup = /kubepods.slice/*-pod0c1f2e3d_4b5a_*\n"));
        run_in_pod(&d, mnt, POD_A, false, "pod-a");
        run_in_pod(&d, mnt, POD_A, true, NULL);
        run_in_pod(&d, mnt, POD_B, false, "default");
        ck_assert_int_eq(testd_stop(&d), 0);
        conf_remove();
        pods_remove(mnt);
}

START_TEST(test_pods_of_one_uid_see_nothing_of_each_other) {
        pods_see_nothing_of_each_other(__func__, false);
}
END_TEST

/* The same, with the daemon as the DaemonSet runs it: its clients' cgroups read from a cgroup namespace of its own. */
START_TEST(test_pods_seen_from_the_daemonsets_cgroup_namespace) {
        pods_see_nothing_of_each_other(__func__, true);
}
END_TEST

/* In cgroup dir (under mnt), a client that says which pod status gives it ("" for none), and leaves. */
static int pod_of_client(struct testd *d, void *arg) {
        const char *dir = arg;
        gpupool_client *c;
        json_t *st, *me;
        int r;

        if (cgroup_join(dir, 0) < 0)
                return 2;
        if (gpupool_connect(d->sock, "pretender", &c) < 0)
                return 3;
        st = testd_ctl(d, "status");
        me = status_client_by_pid(st, getpid());
        r = !me ? 4 : json_is_string(json_object_get(me, "pod_uid")) ? 5 : 0;
        json_decref(st);
        gpupool_disconnect(c);
        return r;
}

/*
 * A user's own cgroup (systemd delegates user@UID.service's subtree to the user) named like a
 * pod is no pod, from either namespace: it is not in the kubelet's tree.
 */
START_TEST(test_a_cgroup_named_like_a_pod_is_none) {
        static const char *const levels_user[] = { "user.slice", "user-1000.slice", "user@1000.service",
                                                   "kubepods-besteffort-pod0c1f2e3d_4b5a_6978_8a9b_acbdcedf0f1e.slice",
                                                   "cri-containerd-fake.scope" };
        char mnt[512], dir[1024];
        struct testd d;
        size_t n;

        if (!pods_ready(__func__, mnt, sizeof(mnt)))
                return;
        n = (size_t) snprintf(dir, sizeof(dir), "%s", mnt);
        for (size_t i = 0; i < 5; i++) {
                n += (size_t) snprintf(dir + n, sizeof(dir) - n, "/%s", levels_user[i]);
                ck_assert_msg(mkdir(dir, 0755) == 0 || errno == EEXIST, "%s: %s", dir, strerror(errno));
        }
        for (int in_pod = 0; in_pod <= 1; in_pod++) {
                start_daemon(&d, mnt, in_pod, conf_new(""));
                ck_assert_msg(reap(spawn(pod_of_client, &d, dir)) == 0, "a user's cgroup passed for pod A (%s namespace)",
                              in_pod ? "the DaemonSet's" : "the host's");
                ck_assert_int_eq(testd_stop(&d), 0);
                conf_remove();
        }
        for (size_t i = 5; i-- > 0;) {
                (void) rmdir(dir);
                *strrchr(dir, '/') = '\0';
        }
        pods_remove(mnt);
}
END_TEST

/* Runs "gpupoolctl --socket S ARGS" from inside pod's cgroup; its exit status, its output (stderr too) in out. */
static int ctl_in_pod(struct testd *d, const char *mnt, const char *pod, const char *args, char *out, size_t size) {
        char dir[1024], cmd[2048];

        pod_dir(mnt, pod, 4, dir, sizeof(dir));
        snprintf(cmd, sizeof(cmd), "sh -c 'echo $$ > %s/cgroup.procs && exec %s/gpupoolctl --socket %s %s' 2>&1", dir,
                 build_dir(), d->sock, args);
        return run_capture(cmd, out, size);
}

/*
 * Root in a pod is no operator: set-limit, check, trim, reload and flush --tenant are refused,
 * saying it runs in a pod, and it cannot take the operators' slots past --max-clients; the
 * node's root can do all of it, and so can root in the daemon's own pod. status stays open to
 * it, as to everyone.
 */
START_TEST(test_root_in_a_pod_is_no_operator) {
        static const char *const admin[] = {
                "set-limit --tenant default max=1G", "check", "trim --tenant default", "reload", "flush --tenant default",
        };
        char mnt[512], out[8192], cmd[1024];
        gpupool_client *c;
        struct testd d;

        if (!pods_ready(__func__, mnt, sizeof(mnt)))
                return;
        testd_start(&d, "--max-clients", "1", NULL);
        for (size_t i = 0; i < sizeof(admin) / sizeof(admin[0]); i++) {
                ck_assert_msg(ctl_in_pod(&d, mnt, POD_A, admin[i], out, sizeof(out)) != 0, "%s: %s", admin[i], out);
                ck_assert_msg(strstr(out, "not a process in a pod (pod " POD_A ")"), "%s: %s", admin[i], out);
                snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s %s >/dev/null 2>&1", build_dir(), d.sock, admin[i]);
                ck_assert_msg(run_capture(cmd, out, sizeof(out)) == 0, "the node's root: %s", admin[i]);
        }
        ck_assert_int_eq(ctl_in_pod(&d, mnt, POD_A, "status", out, sizeof(out)), 0);
        /* The daemon's own pod is the operator's (kubectl exec into its container), and no other pod. */
        {
                char dir[1024];

                pod_dir(mnt, POD_B, 4, dir, sizeof(dir));
                ck_assert_int_eq(cgroup_join(dir, d.pid), 0);
                ck_assert_msg(ctl_in_pod(&d, mnt, POD_B, "check", out, sizeof(out)) == 0, "%s", out);
                ck_assert_int_ne(ctl_in_pod(&d, mnt, POD_A, "check", out, sizeof(out)), 0);
        }
        /* At --max-clients, the operators' slots are the node's: a pod's root is refused, the node's root gets in. */
        for (double t0 = now_s(); gpupool_connect(d.sock, "the-one-client", &c) < 0; nap_ms(10))
                ck_assert(now_s() - t0 < 5);
        ck_assert_int_ne(ctl_in_pod(&d, mnt, POD_A, "status", out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "--max-clients"), "%s", out);
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s status >/dev/null 2>&1", build_dir(), d.sock);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
        pods_remove(mnt);
}
END_TEST

/*
 * The same from the DaemonSet's cgroup namespace: root in pod A is refused, saying its pod;
 * root in the daemon's own container (kubectl exec) is the operator.
 */
START_TEST(test_root_in_a_pod_is_no_operator_from_a_cgroup_namespace) {
        char mnt[512], out[8192];
        struct testd d;

        if (!pods_ready(__func__, mnt, sizeof(mnt)))
                return;
        start_daemon(&d, mnt, true, conf_new(""));
        ck_assert_int_ne(ctl_in_pod(&d, mnt, POD_A, "check", out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "not a process in a pod (pod " POD_A ")"), "%s", out);
        ck_assert_msg(ctl_in_pod(&d, mnt, POD_D, "check", out, sizeof(out)) == 0, "%s", out);
        ck_assert_int_eq(testd_stop(&d), 0);
        conf_remove();
        pods_remove(mnt);
}
END_TEST

/* In pod's cgroup: publishes "pod-weights" (what = 'p'), or attaches and unpublishes it expecting err (what = 'a'). */
struct pod_object {
        const char *mnt, *pod;
        char what;
        int err;
};

static int pod_object_client(struct testd *d, void *arg) {
        struct pod_object *po = arg;
        char dir[1024];
        gpupool_client *c;
        const void *q;
        size_t size;
        void *p;

        pod_dir(po->mnt, po->pod, 4, dir, sizeof(dir));
        if (cgroup_join(dir, 0) < 0)
                return 2;
        if (gpupool_connect(d->sock, "pod-object", &c) < 0)
                return 3;
        if (po->what == 'p') {
                if (gpupool_alloc(c, 0, 12 * MiB, &p) < 0 || gpupool_publish(c, "pod-weights", p, 12 * MiB) < 0)
                        return 4;
        } else {
                int r = gpupool_attach(c, "pod-weights", &q, &size);

                if (r != po->err)
                        return 5;
                if (r == 0 && gpupool_detach(c, q) < 0)
                        return 6;
                if (po->err && gpupool_unpublish(c, "pod-weights") != po->err)
                        return 7;
        }
        gpupool_disconnect(c);
        return 0;
}

/*
 * Objects follow the rule memory follows: root in pod B (the same uid as root in pod A, as
 * every job of client-job.yaml) can neither attach nor unpublish pod A's object, which names no
 * readers; root in pod A can.
 */
START_TEST(test_pods_of_one_uid_share_no_objects) {
        struct pod_object a = { .pod = POD_A, .what = 'p' }, b = { .pod = POD_B, .what = 'a', .err = -EACCES },
                          again = { .pod = POD_A, .what = 'a', .err = 0 };
        char mnt[512];
        struct testd d;

        if (!pods_ready(__func__, mnt, sizeof(mnt)))
                return;
        a.mnt = b.mnt = again.mnt = mnt;
        testd_start(&d, "--host-capacity", "64M", NULL);
        ck_assert_int_eq(reap(spawn(pod_object_client, &d, &a)), 0);
        ck_assert_int_eq(reap(spawn(pod_object_client, &d, &b)), 0);
        ck_assert_int_eq(reap(spawn(pod_object_client, &d, &again)), 0);
        ck_assert_int_eq(testd_stop(&d), 0);
        pods_remove(mnt);
}
END_TEST

/* Connects, allocates 16 MiB and checks it holds no byte of the mark, marks it and leaves (goodbye). */
static int marks_fresh_memory(struct testd *d, void *arg) {
        gpupool_client *c;
        unsigned char *p;

        (void) arg;
        if (gpupool_connect(d->sock, "unseen", &c) < 0 || gpupool_alloc(c, 0, 16 * MiB, (void **) &p) < 0)
                return 2;
        for (size_t i = 0; i < 16 * MiB; i += 4096)
                if (p[i] == MARK)
                        return 3;
        memset(p, MARK, 16 * MiB);
        gpupool_free(c, p);
        gpupool_disconnect(c);
        return 0;
}

/*
 * Every layout and configuration of the DaemonSet's cgroup namespace: the kubelet's systemd
 * and cgroupfs drivers, $GPUPOOL_POD_UID right, unset and wrong (naming pod A). Root in pod A
 * marks its memory; root in pod A again may see it, root in pod B never does; root in pod A
 * (a hostPID pod: the test's own PID namespace) is never the operator, and root in the daemon's
 * own container always is.
 */
START_TEST(test_pods_apart_in_every_layout_and_configuration) {
        static const char *const envs[] = { POD_D, NULL, POD_A };
        char mnt[512], out[8192], dir[1024];
        struct testd d;

        if (!pods_ready(__func__, mnt, sizeof(mnt)))
                return;
        for (int layout = 0; layout < 2; layout++)
                for (size_t e = 0; e < sizeof(envs) / sizeof(envs[0]); e++) {
                        const char *how = e == 0 ? "right" : e == 1 ? "unset" : "wrong";

                        cgroupfs_layout = layout;
                        pod_dir(mnt, POD_D, 4, dir, sizeof(dir));
                        testd_start_in_pod(&d, dir, envs[e], "--host-capacity", "16M", "--max-cached", "100%", NULL);
                        run_in_pod(&d, mnt, POD_A, false, NULL);
                        run_in_pod(&d, mnt, POD_B, false, NULL);
                        run_in_pod(&d, mnt, POD_A, false, NULL);
                        run_in_pod(&d, mnt, POD_A, true, NULL);
                        ck_assert_msg(ctl_in_pod(&d, mnt, POD_A, "set-limit --tenant default max=1G", out, sizeof(out)) != 0,
                                      "%s layout, $GPUPOOL_POD_UID %s: root in pod A is the operator: %s",
                                      layout ? "cgroupfs" : "systemd", how, out);
                        ck_assert_msg(strstr(out, "not a process in a pod (pod " POD_A ")"), "%s", out);
                        ck_assert_msg(ctl_in_pod(&d, mnt, POD_D, "check", out, sizeof(out)) == 0,
                                      "%s layout, $GPUPOOL_POD_UID %s: root in the daemon's container: %s",
                                      layout ? "cgroupfs" : "systemd", how, out);
                        ck_assert_int_eq(testd_stop(&d), 0);
                }
        cgroupfs_layout = false;
        pods_remove(mnt);
}
END_TEST

/*
 * A client beside the daemon's container, where the daemon cannot tell whether it is of its
 * pod ($GPUPOOL_POD_UID unset), is a principal of its own: zeroed against root on the node and
 * in the daemon's own container, never the operator, and the log says why.
 */
static int beside_client(struct testd *d, void *arg) {
        if (cgroup_join(arg, 0) < 0)
                return 2;
        return marks_fresh_memory(d, NULL);
}

START_TEST(test_a_client_the_daemon_cannot_place_is_its_own) {
        char mnt[512], out[8192], dir[1024], cmd[2048];
        struct testd d;

        if (!pods_ready(__func__, mnt, sizeof(mnt)))
                return;
        pod_dir(mnt, POD_D, 4, dir, sizeof(dir));
        testd_start_in_pod(&d, dir, NULL, "--host-capacity", "16M", "--max-cached", "100%", NULL);
        /* A sibling of the daemon's container: pod D's own cgroup dir holds it. */
        pod_dir(mnt, POD_D, 3, dir, sizeof(dir));
        snprintf(dir + strlen(dir), sizeof(dir) - strlen(dir), "/beside");
        ck_assert(mkdir(dir, 0755) == 0 || errno == EEXIST);
        for (int i = 0; i < 2; i++)
                ck_assert_int_eq(reap(spawn(beside_client, &d, dir)), 0);
        snprintf(cmd, sizeof(cmd), "sh -c 'echo $$ > %s/cgroup.procs && exec %s/gpupoolctl --socket %s check' 2>&1", dir,
                 build_dir(), d.sock);
        ck_assert_int_ne(run_capture(cmd, out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "cannot place this process's cgroup (../beside)"), "%s", out);
        ck_assert(testd_log_wait(&d, "cgroup ../beside is neither the node's"));
        ck_assert_int_eq(testd_stop(&d), 0);
        ck_assert_int_eq(rmdir(dir), 0);
        pods_remove(mnt);
}
END_TEST

/* In pod (under mnt) as uid, publishes n objects of 1 MiB ("<uid>-<i>"); 0, or the step that failed (10 + i: -EDQUOT at i). */
struct pod_publisher {
        const char *mnt, *pod;
        unsigned uid, n;
};

static int publish_in_pod(struct testd *d, void *arg) {
        struct pod_publisher *pp = arg;
        char dir[1024], name[64];
        gpupool_client *c;
        void *p;

        pod_dir(pp->mnt, pp->pod, 4, dir, sizeof(dir));
        if (cgroup_join(dir, 0) < 0 || setgid(pp->uid) < 0 || setuid(pp->uid) < 0)
                return 2;
        if (gpupool_connect(d->sock, "publisher", &c) < 0)
                return 3;
        for (unsigned i = 0; i < pp->n; i++) {
                int r;

                snprintf(name, sizeof(name), "%u-%u", pp->uid, i);
                if (gpupool_alloc(c, 0, MiB, &p) < 0)
                        return 4;
                if ((r = gpupool_publish(c, name, p, MiB)) < 0) {
                        char why[512];

                        gpupool_last_error(c, why, sizeof(why));
                        return r == -EDQUOT && strstr(why, "pod " POD_A " holds 64 named objects (published by any of its "
                                                     "uids)") ? 10 + (int) i : 5;
                }
        }
        gpupool_disconnect(c);
        return 0;
}

/*
 * The node's 256 objects against one pod of many uids (a pod may pick any): each uid held 64
 * of its own, so one pod filled the table. Now a pod holds 64, whatever uids publish them: the
 * fifth uid of pod A is refused its first, and a client of pod B is not.
 */
START_TEST(test_one_pod_of_many_uids_fills_no_table) {
        struct pod_publisher pp = { 0 };
        char mnt[512];
        struct testd d;

        if (!pods_ready(__func__, mnt, sizeof(mnt)))
                return;
        testd_start(&d, "--host-capacity", "1G", NULL);
        ck_assert_int_eq(chmod(d.dir, 0755), 0);        /* let the other uids reach the socket */
        pp.mnt = mnt;
        pp.pod = POD_A;
        pp.n = 16;
        for (pp.uid = 2000; pp.uid < 2004; pp.uid++)
                ck_assert_int_eq(reap(spawn(publish_in_pod, &d, &pp)), 0);
        pp.n = 1;
        ck_assert_int_eq(reap(spawn(publish_in_pod, &d, &pp)), 10);
        pp.pod = POD_B;
        ck_assert_int_eq(reap(spawn(publish_in_pod, &d, &pp)), 0);
        ck_assert_int_eq(testd_stop(&d), 0);
        pods_remove(mnt);
}
END_TEST

/* In pod (under mnt) as uid: n connections held until hold closes, then one more; 'y' or 'n' (refused as the pod's) a connection to report. */
struct pod_connector {
        const char *mnt, *pod;
        unsigned uid, n;
        int report[2], hold[2];
};

static int connect_in_pod(struct testd *d, void *arg) {
        struct pod_connector *pc = arg;
        gpupool_client *c[8] = { 0 };
        char dir[1024], want[96], why[512], b;

        close(pc->report[0]);
        close(pc->hold[1]);
        pod_dir(pc->mnt, pc->pod, 4, dir, sizeof(dir));
        if (cgroup_join(dir, 0) < 0 || setgid(pc->uid) < 0 || setuid(pc->uid) < 0 || pc->n > 8)
                return 2;
        snprintf(want, sizeof(want), "pod %s already has", pc->pod);
        for (unsigned i = 0; i < pc->n; i++) {
                b = 'y';
                if (gpupool_connect(d->sock, "connector", &c[i]) < 0) {
                        gpupool_last_error(NULL, why, sizeof(why));
                        b = strstr(why, want) ? 'n' : 'x';
                        if (b == 'x')
                                fprintf(stderr, "connect_in_pod: %s\n", why);
                }
                if (write(pc->report[1], &b, 1) != 1)
                        return 3;
        }
        close(pc->report[1]);
        while (read(pc->hold[0], &b, 1) > 0)
                ;
        for (unsigned i = 0; i < pc->n; i++)
                if (c[i])
                        gpupool_disconnect(c[i]);
        return 0;
}

/* Starts connect_in_pod() for n connections of uid in pod; the bytes they reported into got (n + 1 bytes). */
static pid_t pod_connections(struct testd *d, struct pod_connector *pc, const char *pod, unsigned n, char *got) {
        pid_t pid;
        unsigned k = 0;

        pc->pod = pod;
        pc->n = n;
        ck_assert(pipe(pc->report) == 0 && pipe(pc->hold) == 0);
        pid = spawn(connect_in_pod, d, pc);
        close(pc->report[1]);
        close(pc->hold[0]);
        while (k < n && read(pc->report[0], &got[k], 1) == 1)
                k++;
        got[k] = '\0';
        close(pc->report[0]);
        return pid;
}

/*
 * max_clients_per_uid counts a pod's connections, whatever uid its processes take, and not a
 * uid's across pods: client-job.yaml runs every job as uid 1000, and one pod that opened the
 * most one uid may have locked every other pod of that uid out. Pod A's third connection is
 * refused under a bound of 2, saying it is the pod's; pod B, of the same uid, is let in.
 */
START_TEST(test_connections_are_counted_per_pod) {
        struct pod_connector a = { .uid = 2000 }, b = { .uid = 2000 };
        char mnt[512], got_a[8], got_b[8];
        struct testd d;
        pid_t pa, pb;

        if (!pods_ready(__func__, mnt, sizeof(mnt)))
                return;
        testd_start(&d, "--max-clients-per-uid", "2", NULL);
        ck_assert_int_eq(chmod(d.dir, 0755), 0);        /* let the other uids reach the socket */
        a.mnt = b.mnt = mnt;
        pa = pod_connections(&d, &a, POD_A, 3, got_a);
        pb = pod_connections(&d, &b, POD_B, 1, got_b);
        close(a.hold[1]);
        close(b.hold[1]);
        ck_assert_int_eq(reap(pa), 0);
        ck_assert_int_eq(reap(pb), 0);
        ck_assert_msg(strcmp(got_a, "yyn") == 0, "pod A, three connections under a bound of 2: %s", got_a);
        ck_assert_msg(strcmp(got_b, "y") == 0, "pod B, of the same uid, after pod A's two: %s", got_b);
        ck_assert_int_eq(testd_stop(&d), 0);
        pods_remove(mnt);
}
END_TEST

static volatile sig_atomic_t namespaced_daemon;

static void forward_term(int sig) {
        if (namespaced_daemon > 0)
                kill(namespaced_daemon, sig);
}

/*
 * A daemon in a PID namespace of its own sees its clients as pid 0 (as one in a pod without
 * hostPID would): it cannot read their cgroups, so each is a principal of its own, and memory
 * that moves from one such client to the next, of the same uid and even the same process, is
 * fresh; status says the cgroup is unknown.
 */
START_TEST(test_a_client_seen_as_pid_0_is_its_own_principal) {
        struct testd d = { 0 };
        int status, sock;
        json_t *st, *c;
        pid_t pid;

        if (geteuid() != 0) {
                TEST_SKIP("a daemon in a PID namespace of its own needs root");
                return;
        }
        test_mkdtemp(d.dir, sizeof(d.dir), "test");
        snprintf(d.sock, sizeof(d.sock), "%s/gpupool.sock", d.dir);
        /* The daemon as pid 1 of a PID namespace of its own, under a parent that hands it SIGTERM. */
        pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                char path[256];

                if (unshare(CLONE_NEWPID) < 0)
                        _exit(126);
                snprintf(path, sizeof(path), "%s/gpupoold", build_dir());
                namespaced_daemon = fork();
                if (namespaced_daemon == 0) {
                        int log;

                        snprintf(path, sizeof(path), "%s/gpupoold.log", d.dir);
                        if ((log = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) >= 0)
                                dup2(log, 2);
                        snprintf(path, sizeof(path), "%s/gpupoold", build_dir());
                        execl(path, path, "--socket", d.sock, "--backend", "host", "--host-capacity", "16M",
                              "--max-cached", "100%", "--check-invariants", (char *) NULL);
                        _exit(127);
                }
                signal(SIGTERM, forward_term);
                while (waitpid(namespaced_daemon, &status, 0) < 0)
                        ;
                _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
        }
        for (int i = 0; i < 2000 && gp_wire_connect(d.sock, &sock) < 0; i++)
                nap_ms(5);
        close(sock);
        d.pid = pid;
        for (int i = 0; i < 2; i++)
                ck_assert_msg(reap(spawn(marks_fresh_memory, &d, NULL)) == 0, "client %d read another's bytes", i);
        /* While it is connected, a client shows an unknown cgroup. */
        sock = raw_hello(&d, "unseen");
        st = testd_ctl(&d, "status");
        c = status_client_by_name(st, "unseen");
        ck_assert_ptr_nonnull(c);
        ck_assert(json_is_null(json_object_get(c, "cgroup")));
        ck_assert_int_eq(json_integer_value(json_object_get(c, "pid")), 0);
        json_decref(st);
        close(sock);
        kill(pid, SIGTERM);
        ck_assert_int_eq(reap(pid), 0);
        snprintf(d.log, sizeof(d.log), "%s/gpupoold.log", d.dir);
        unlink(d.log);
        unlink(d.sock);
        rmdir(d.dir);
}
END_TEST

Suite *suite_pods(void) {
        Suite *s = suite_create("pods");
        TCase *tc = tcase_create("pods");

        tcase_add_test(tc, test_pods_of_one_uid_see_nothing_of_each_other);
        tcase_add_test(tc, test_pods_seen_from_the_daemonsets_cgroup_namespace);
        tcase_add_test(tc, test_a_cgroup_named_like_a_pod_is_none);
        tcase_add_test(tc, test_pods_of_one_uid_share_no_objects);
        tcase_add_test(tc, test_root_in_a_pod_is_no_operator);
        tcase_add_test(tc, test_root_in_a_pod_is_no_operator_from_a_cgroup_namespace);
        tcase_add_test(tc, test_a_client_seen_as_pid_0_is_its_own_principal);
        tcase_add_test(tc, test_pods_apart_in_every_layout_and_configuration);
        tcase_add_test(tc, test_a_client_the_daemon_cannot_place_is_its_own);
        tcase_add_test(tc, test_one_pod_of_many_uids_fills_no_table);
        tcase_add_test(tc, test_connections_are_counted_per_pod);
        tcase_set_timeout(tc, 60);
        suite_add_tcase(s, tc);
        return s;
}
