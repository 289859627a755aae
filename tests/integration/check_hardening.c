/*
 * check_hardening.c: what hostile peers and unlucky operators did to gpupoold, each as a
 * scenario against a real daemon: reloads that are refused, set-limit on a process's later
 * connections, control channels and tenants, start-up errors in the journal, and configs
 * that let a process leave its tenant.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpupool.h"
#include "suites.h"
#include "testlib.h"

#define MiB (1ULL << 20)

/* Runs "gpupoolctl --socket S ARGS" (stderr too) into out; returns its exit status. */
static int ctl(struct testd *d, char *out, size_t size, const char *args) {
        char cmd[512];

        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s %s 2>&1", build_dir(), d->sock, args);
        return run_capture(cmd, out, size);
}

/* A tenant's field from "limits --json" (arrays: device 0's). */
static long long tenant_field(struct testd *d, const char *tenant, const char *key) {
        json_t *j = testd_ctl(d, "limits"), *t, *v;
        long long r = -1;
        size_t i;

        json_array_foreach(json_object_get(j, "tenants"), i, t) {
                if (strcmp(json_string_value(json_object_get(t, "name")), tenant) != 0)
                        continue;
                v = json_object_get(t, key);
                r = json_integer_value(json_is_array(v) ? json_array_get(v, 0) : v);
        }
        json_decref(j);
        return r;
}

/*
 * A refused reload leaves every sum as it was: restoring the old policy used to map each
 * client again into sums that held it already (with --check-invariants, an abort).
 */
START_TEST(test_refused_reload_keeps_tenant_sums) {
        gpupool_client *c;
        struct testd d;
        char out[2048];
        void *p, *q;

        testd_start(&d, "--config", conf_new("[tenant:t3]\nmatch_name = job\nmax = 48M\nguarantee = 8M\n"),
                    "--host-capacity", "64M", NULL);
        ck_assert_int_eq(gpupool_connect(d.sock, "job", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 20 * MiB, &p), 0);
        conf_write("[tenant:t3]\nmatch_name = job\nmax = 2G\nguarantee = 1G\n");
        for (int i = 0; i < 3; i++) {
                /* gpupoolctl reload answers with the outcome: exit 1 and why. */
                ck_assert_int_eq(ctl(&d, out, sizeof(out), "reload"), 1);
                ck_assert_msg(strstr(out, "reload refused, the running config stays") &&
                              strstr(out, "guarantees add up to 1.0 GiB"), "%s", out);
        }
        kill(d.pid, SIGHUP);    /* the signal's path too */
        ck_assert_int_eq(ctl(&d, out, sizeof(out), "check"), 0);
        ck_assert_int_eq(tenant_field(&d, "t3", "clients"), 1);
        ck_assert_int_eq(tenant_field(&d, "t3", "reserved_bytes"), 20 * MiB);
        ck_assert_int_eq(tenant_field(&d, "t3", "guarantee_bytes"), 8 * MiB);
        /* A real request under the tenant's max is served (it was refused over sums that did not exist). */
        ck_assert_int_eq(gpupool_alloc(c, 0, 12 * MiB, &q), 0);
        ck_assert_int_eq(gpupool_free(c, q), 0);
        /* A reload that loads says what it loaded. */
        conf_write("[tenant:t3]\nmatch_name = job\nmax = 40M\n");
        ck_assert_int_eq(ctl(&d, out, sizeof(out), "reload"), 0);
        ck_assert_msg(strstr(out, "reloaded ") && strstr(out, "1 file, 2 tenants"), "%s", out);
        ck_assert_int_eq(tenant_field(&d, "t3", "max_bytes"), 40 * MiB);
        ck_assert_int_eq(tenant_field(&d, "t3", "clients"), 1);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
        conf_remove();
}
END_TEST

/* A control channel is part of its client: a reload must not count it in a tenant. */
START_TEST(test_reload_leaves_control_channels_out_of_tenants) {
        Gpupool__Hello hello = GPUPOOL__HELLO__INIT;
        char out[65536];
        uint64_t id;
        struct testd d;
        int client, channel;

        testd_start(&d, "--config", conf_new(""), NULL);
        hello.name = "owner";
        client = raw_hello_with(&d, &hello, &id);
        hello.has_control_for = 1;
        hello.control_for = id;
        channel = raw_hello_with(&d, &hello, NULL);
        for (int i = 0; i < 2; i++) {
                ck_assert_int_eq(ctl(&d, out, sizeof(out), "metrics"), 0);
                ck_assert_msg(strstr(out, "gpupool_tenant_clients{tenant=\"default\"} 1\n"), "%s", out);
                ck_assert_int_eq(tenant_field(&d, "default", "clients"), 1);
                ck_assert_int_eq(ctl(&d, out, sizeof(out), "reload"), 0);
        }
        close(channel);
        close(client);
        ck_assert_int_eq(testd_stop(&d), 0);
        conf_remove();
}
END_TEST

/* set-limit --pid holds for every connection of the process, later ones too; max=0 is no limit. */
START_TEST(test_set_limit_pid_binds_later_connections) {
        gpupool_client *a, *b;
        struct testd d;
        char args[128], out[1024];
        void *p, *q;

        testd_start(&d, "--client-limit", "8M", NULL);
        ck_assert_int_eq(gpupool_connect(d.sock, "first", &a), 0);
        snprintf(args, sizeof(args), "set-limit --pid %d max=4M", (int) getpid());
        ck_assert_int_eq(ctl(&d, out, sizeof(out), args), 0);
        ck_assert_int_eq(gpupool_alloc(a, 0, 6 * MiB, &p), -EDQUOT);
        /* A new connection of the same process: bound as well, not by the default 8M. */
        ck_assert_int_eq(gpupool_connect(d.sock, "second", &b), 0);
        ck_assert_int_eq(gpupool_alloc(b, 0, 6 * MiB, &p), -EDQUOT);
        gpupool_last_error(b, out, sizeof(out));
        ck_assert_msg(strstr(out, "set-limit --pid"), "%s", out);
        gpupool_disconnect(b);
        /* Even with none of its connections left in between. */
        gpupool_disconnect(a);
        ck_assert_int_eq(gpupool_connect(d.sock, "third", &a), 0);
        ck_assert_int_eq(gpupool_alloc(a, 0, 6 * MiB, &p), -EDQUOT);
        /* max=0: no limit at all, not the default 8M. */
        snprintf(args, sizeof(args), "set-limit --pid %d max=0", (int) getpid());
        ck_assert_int_eq(ctl(&d, out, sizeof(out), args), 0);
        ck_assert_int_eq(gpupool_alloc(a, 0, 12 * MiB, &p), 0);
        ck_assert_int_eq(gpupool_connect(d.sock, "fourth", &b), 0);
        ck_assert_int_eq(gpupool_alloc(b, 0, 12 * MiB, &q), 0);
        ck_assert_int_eq(gpupool_free(b, q), 0);
        gpupool_disconnect(b);
        ck_assert_int_eq(gpupool_free(a, p), 0);
        /* A process that is not running cannot be given a limit. */
        ck_assert_int_eq(ctl(&d, out, sizeof(out), "set-limit --pid 2147483646 max=1M"), 1);
        gpupool_disconnect(a);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* A daemon that cannot start says why at error priority, so "journalctl -p warning" shows it. */
START_TEST(test_start_errors_reach_the_journal_as_errors) {
        char cmd[1024], out[2048], log[128];
        const char *conf = conf_new("[pool]\nidle_release = soon\n");
        struct stat st;
        int fd;

        snprintf(log, sizeof(log), "%.*s/stderr", (int) (strrchr(conf, '/') - conf), conf);
        fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(fstat(fd, &st), 0);
        close(fd);
        /* $JOURNAL_STREAM naming stderr's device and inode is how systemd says stderr is the journal. */
        snprintf(cmd, sizeof(cmd), "JOURNAL_STREAM=%llu:%llu %s/gpupoold --config %s --backend host 2>>%s; echo $?",
                 (unsigned long long) st.st_dev, (unsigned long long) st.st_ino, build_dir(), conf, log);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        ck_assert_str_eq(out, "1\n");
        read_text(log, out, sizeof(out));
        ck_assert_msg(strncmp(out, "<3>", 3) == 0 && strstr(out, "idle_release: 'soon' is not a duration"), "%s", out);
        unlink(log);
        conf_remove();
}
END_TEST

/* A tenant matched by name alone before one matched by uid: a process of that uid can opt out by its name. */
START_TEST(test_check_config_warns_of_name_before_uid) {
        char cmd[512], out[4096];
        const char *conf = conf_new("[tenant:byname]\nmatch_name = train-*\n\n[tenant:byuid]\nmatch_uid = 1000\nmax = 1G\n");

        snprintf(cmd, sizeof(cmd), "%s/gpupoold --config %s --check-config 2>&1", build_dir(), conf);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "warning: ") && strstr(out, "[tenant:byname] matches by client name only and comes before "
                                                             "[tenant:byuid]") && strstr(out, "'train-*'") &&
                      strstr(out, "good (1 file, 3 tenants)"), "%s", out);
        /* The other order is what the operator means: no warning. */
        conf_write("[tenant:byuid]\nmatch_uid = 1000\nmax = 1G\n\n[tenant:byname]\nmatch_name = train-*\n");
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        ck_assert_msg(!strstr(out, "warning") && strstr(out, "good (1 file, 3 tenants)"), "%s", out);
        conf_remove();
}
END_TEST

/* Open descriptors of process pid. */
static int count_fds(pid_t pid) {
        char path[64];
        struct dirent *e;
        DIR *dir;
        int n = 0;

        snprintf(path, sizeof(path), "/proc/%d/fd", (int) pid);
        dir = opendir(path);
        ck_assert_ptr_nonnull(dir);
        while ((e = readdir(dir)))
                n += e->d_name[0] != '.';
        closedir(dir);
        return n;
}

/* Open descriptors of pid once they stop changing (connections that just closed are gone). */
static int settled_fds(pid_t pid) {
        int n = count_fds(pid), same = 0;

        for (double t0 = now_s(); same < 3 && now_s() - t0 < 10;) {
                int m;

                usleep(100000);
                m = count_fds(pid);
                same = m == n ? same + 1 : 0;
                n = m;
        }
        return n;
}

/* A peer in a process of its own; it says when it has done its part and waits to be told to go. */
struct peer {
        int ready[2], go[2];
        int arg;
};

static void peer_pipes(struct peer *p) {
        ck_assert_int_eq(pipe(p->ready), 0);
        ck_assert_int_eq(pipe(p->go), 0);
}

static int peer_ready_then_wait(struct peer *p) {
        char ch = 'r';

        if (write(p->ready[1], &ch, 1) != 1 || read(p->go[0], &ch, 1) < 0)
                return 99;
        return 0;
}

static void peer_wait_ready(struct peer *p) {
        char ch;

        ck_assert_int_eq(read(p->ready[0], &ch, 1), 1);
}

static int peer_finish(struct peer *p, pid_t pid) {
        int r;

        ck_assert_int_eq(write(p->go[1], "g", 1), 1);
        r = reap(pid);
        close(p->ready[0]), close(p->ready[1]), close(p->go[0]), close(p->go[1]);
        return r;
}

/*
 * Passes the daemon a TCP socket with SO_LINGER (p->arg seconds) and unsent data, its own
 * copy closed: the daemon's close(2) is the last, and would wait out the linger time.
 */
static int lingering_peer(struct testd *d, void *arg) {
        struct peer *p = arg;
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        struct linger lg = { .l_onoff = 1, .l_linger = p->arg };
        static char junk[65536];
        socklen_t len = sizeof(a);
        int lst, tcp, far, sock;

        lst = socket(AF_INET, SOCK_STREAM, 0);
        if (lst < 0 || bind(lst, (struct sockaddr *) &a, sizeof(a)) < 0 || listen(lst, 1) < 0 ||
            getsockname(lst, (struct sockaddr *) &a, &len) < 0)
                return 10;
        tcp = socket(AF_INET, SOCK_STREAM, 0);
        if (tcp < 0 || connect(tcp, (struct sockaddr *) &a, sizeof(a)) < 0 || (far = accept(lst, NULL, NULL)) < 0)
                return 11;
        /* The far end never reads: fill both buffers, so that data stays unsent. */
        fcntl(tcp, F_SETFL, O_NONBLOCK);
        while (send(tcp, junk, sizeof(junk), MSG_NOSIGNAL) > 0)
                ;
        fcntl(tcp, F_SETFL, 0);
        if (setsockopt(tcp, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)) < 0)
                return 12;
        sock = raw_connect(d);
        if (gp_wire_send_packet(sock, (const uint8_t *) junk, 16, tcp) < 0)
                return 13;
        close(tcp);
        return peer_ready_then_wait(p);        /* far stays open: the data stays unsent */
}

/* A descriptor that blocks on close is closed off the loop: other clients are served meanwhile. */
START_TEST(test_descriptor_that_blocks_on_close) {
        struct peer p = { .arg = 3 };
        struct testd d;
        double t0, took;
        pid_t pid;
        int base;

        testd_start(&d, NULL);
        base = settled_fds(d.pid);
        peer_pipes(&p);
        pid = spawn(lingering_peer, &d, &p);
        peer_wait_ready(&p);
        /* Five hellos, one after another: the daemon has surely met the peer's packet by the last. */
        t0 = now_s();
        for (int i = 0; i < 5; i++)
                close(raw_hello(&d, "bystander"));
        took = now_s() - t0;
        ck_assert_msg(took < 1.5, "five hellos took %.1f s while a peer's socket lingered", took);
        /* The descriptor is closed once its linger time is out: nothing leaks. */
        t0 = now_s();
        while (settled_fds(d.pid) != base && now_s() - t0 < 10)
                ;
        ck_assert_int_eq(settled_fds(d.pid), base);
        ck_assert_int_eq(peer_finish(&p, pid), 0);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

Suite *suite_hardening(void) {
        Suite *s = suite_create("hardening");
        TCase *tc = tcase_create("host");

        tcase_add_test(tc, test_descriptor_that_blocks_on_close);
        tcase_add_test(tc, test_refused_reload_keeps_tenant_sums);
        tcase_add_test(tc, test_reload_leaves_control_channels_out_of_tenants);
        tcase_add_test(tc, test_set_limit_pid_binds_later_connections);
        tcase_add_test(tc, test_start_errors_reach_the_journal_as_errors);
        tcase_add_test(tc, test_check_config_warns_of_name_before_uid);
        tcase_set_timeout(tc, 120);
        suite_add_tcase(s, tc);
        return s;
}
