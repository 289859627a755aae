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
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
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
                              strstr(out, "guarantees on device 0 add up to 1.0 GiB"), "%s", out);
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

/* A reload with no config file (none given, none at the default path) says so, not "0 files". */
START_TEST(test_reload_without_a_file_says_so) {
        struct testd d;
        char out[2048];

        if (access(GP_SYSCONFDIR "/gpupool/gpupoold.conf", F_OK) == 0) {
                TEST_SKIP("this machine has a " GP_SYSCONFDIR "/gpupool/gpupoold.conf, which a daemon without --config reads");
                return;
        }
        testd_start(&d, NULL);
        ck_assert_int_eq(ctl(&d, out, sizeof(out), "reload"), 0);
        ck_assert_msg(strstr(out, "reloaded: there is no " GP_SYSCONFDIR "/gpupool/gpupoold.conf, so the defaults and the "
                                  "command line hold"), "%s", out);
        ck_assert_int_eq(testd_stop(&d), 0);
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

/* Open descriptors of pid once they stop changing (connections that just closed are gone). */
static int settled_fds(pid_t pid) {
        int n = open_fds(pid), same = 0;

        for (double t0 = now_s(); same < 3 && now_s() - t0 < 10;) {
                int m;

                usleep(100000);
                m = open_fds(pid);
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

        /* Only the peer writes: if it dies first, the read ends at once instead of waiting for the timeout. */
        close(p->ready[1]);
        p->ready[1] = -1;
        ck_assert_msg(read(p->ready[0], &ch, 1) == 1, "the peer process failed before it was ready");
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

/* CPU seconds process pid has used (user and system). */
static double cpu_seconds(pid_t pid) {
        char path[64], buf[1024], *p;
        unsigned long long utime, stime;

        snprintf(path, sizeof(path), "/proc/%d/stat", (int) pid);
        read_text(path, buf, sizeof(buf));
        p = strrchr(buf, ')');
        ck_assert_ptr_nonnull(p);
        /* After "pid (comm)": state is field 3; utime and stime are fields 14 and 15. */
        ck_assert_int_eq(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime, &stime), 2);
        return (double) (utime + stime) / (double) sysconf(_SC_CLK_TCK);
}

/* Lines of the daemon's log that contain text. */
static int log_count(struct testd *d, const char *text) {
        char cmd[512], out[64];

        snprintf(cmd, sizeof(cmd), "grep -c -- '%s' %s", text, d->log);
        run_capture(cmd, out, sizeof(out));
        return atoi(out);
}

/* Connects and says hello, waiting at most 3 s for the answer: 1 served, 0 refused saying why, -1 no answer. */
static int try_hello(struct testd *d, int *ret_sock, char *why, size_t why_size) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__Hello hello = GPUPOOL__HELLO__INIT;
        struct timeval tv = { .tv_sec = 3 };
        static uint8_t buf[GP_MAX_REPLY_BYTES];
        int sock = raw_connect(d), r, n;

        ck_assert_int_eq(setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
        hello.name = "many";
        env.id = 1;
        env.body_case = GPUPOOL__ENVELOPE__BODY_HELLO;
        env.hello = &hello;
        env.version = GP_PROTOCOL_VERSION;
        n = gp_wire_pack(&env, buf, sizeof(buf));
        ck_assert_int_gt(n, 0);
        /* A refused connection may be closed before the hello goes out: the refusal is still there to read. */
        (void) gp_wire_send_packet(sock, buf, (size_t) n, -1);
        /* A refusal may read as a reset first, with the reason still queued: read on once, as the library does. */
        n = gp_wire_recv_packet(sock, buf, sizeof(buf), NULL);
        if (n == -ECONNRESET)
                n = gp_wire_recv_packet(sock, buf, sizeof(buf), NULL);
        if (n <= 0) {
                close(sock);
                return -1;
        }
        ck_assert_int_eq(gp_wire_unpack(buf, (size_t) n, &rep), 0);
        r = rep->status == GPUPOOL__STATUS__STATUS_OK;
        snprintf(why, why_size, "%s", rep->error ? rep->error : "");
        gpupool__envelope__free_unpacked(rep, NULL);
        if (r)
                *ret_sock = sock;
        else
                close(sock);
        return r;
}

/* Out of descriptors, the daemon refuses new clients saying why, without spinning or flooding the log. */
START_TEST(test_out_of_descriptors) {
        int socks[64], n = 0, refused = 0, waiting;
        char why[256] = "";
        struct rlimit rl;
        struct testd d;
        double cpu;

        testd_start(&d, "--max-clients", "64", NULL);
        rl.rlim_cur = rl.rlim_max = (rlim_t) settled_fds(d.pid) + 6;
        ck_assert_int_eq(prlimit(d.pid, RLIMIT_NOFILE, &rl, NULL), 0);
        for (int i = 0; i < 20 && refused < 3; i++) {
                int r = try_hello(&d, &socks[n], why, sizeof(why));

                ck_assert_msg(r >= 0, "connection %d got no answer: it hangs in the backlog", i);
                if (r == 1)
                        n++;
                else
                        refused++;
        }
        ck_assert_int_ge(refused, 1);
        ck_assert_msg(strstr(why, "out of file descriptors"), "%s", why);
        /* A connection waiting in the backlog while the daemon has no descriptor: no spinning. */
        waiting = raw_connect(&d);
        cpu = cpu_seconds(d.pid);
        usleep(1500000);
        cpu = cpu_seconds(d.pid) - cpu;
        ck_assert_msg(cpu < 0.5, "the daemon used %.2f s of CPU in 1.5 s while out of descriptors", cpu);
        ck_assert_int_le(log_count(&d, "out of file descriptors"), 200 + 1);
        close(waiting);
        /* Once clients leave, new ones are served again. */
        while (n > 0)
                close(socks[--n]);
        {
                double t0 = now_s();
                int r = 0, sock;

                while (now_s() - t0 < 10 && (r = try_hello(&d, &sock, why, sizeof(why))) != 1)
                        usleep(100000);
                ck_assert_int_eq(r, 1);
                close(sock);
        }
        ck_assert(testd_alive(&d));
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/*
 * At start: the soft limit is raised for --max-clients, the descriptor table grown to it at
 * once (not doubling under load), and a hard limit too low is an error saying so.
 */
START_TEST(test_descriptor_limit_fits_max_clients) {
        char cmd[1024], out[2048];
        struct rlimit rl;
        struct testd d;

        if (under_valgrind()) {
                TEST_SKIP("valgrind does not let a process raise its descriptor limit");
                return;
        }

        ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
        if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 6000)
                return;         /* nothing to raise to here */
        rl.rlim_cur = 256;
        ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
        testd_start(&d, "--max-clients", "1000", NULL);
        /*
         * 320 fixed (a reply's 128 exports among them), 4 per client, one per 2 MiB segment of
         * 512 MiB, as the daemon says (valgrind keeps its own limit).
         */
        if (!under_tool()) {
                ck_assert_int_eq(log_count(&d, "file descriptor limit raised to 4576 for max_clients 1000"), 1);
                ck_assert_int_ge(fd_table_size(d.pid), 4576);
        }
        ck_assert_int_eq(testd_stop(&d), 0);

        /* Nothing fits a limit of 300, whatever max_clients: the error says what to raise and what to lower. */
        snprintf(cmd, sizeof(cmd), "ulimit -n 300 && %s/gpupoold --socket /tmp/gpupool-fdlimit-%d.sock --backend host "
                 "--host-capacity 64M 2>&1; echo \"exit $?\"", build_dir(), (int) getpid());
        run_capture(cmd, out, sizeof(out));
        ck_assert_msg(strstr(out, "max_clients 1024 with a host capacity of 64.0 MiB needs 4448 file descriptors, more than "
                              "the hard limit of 300: raise it (LimitNOFILE= in the unit, ulimit -Hn) or lower host_capacity") &&
                      strstr(out, "exit 1"), "%s", out);
        /* A max_clients chosen that does not fit is refused, naming what would. */
        snprintf(cmd, sizeof(cmd), "ulimit -n 1000 && %s/gpupoold --socket /tmp/gpupool-fdlimit-%d.sock --backend host "
                 "--host-capacity 64M --max-clients 500 2>&1; echo \"exit $?\"", build_dir(), (int) getpid());
        run_capture(cmd, out, sizeof(out));
        ck_assert_msg(strstr(out, "or lower max_clients to 162") && strstr(out, "exit 1"), "%s", out);
        /* At its default, max_clients fits the hard limit the node gives, and the log says so once. */
        rl.rlim_cur = rl.rlim_max = 1000;
        ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
        testd_start(&d, "--host-capacity", "64M", NULL);
        if (!under_tool())
                ck_assert_int_eq(log_count(&d, "max_clients 162, not the default 1024: the hard file descriptor limit is 1000"), 1);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* One request naming 256 segments it does not hold: a handful of lines, then one saying how many were left out. */
START_TEST(test_log_rate_limit_per_client) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__ReturnRequest b = GPUPOOL__RETURN_REQUEST__INIT;
        uint64_t ids[256];
        struct testd d;
        int sock;

        testd_start(&d, NULL);
        sock = raw_hello(&d, "noisy");
        for (unsigned i = 0; i < 256; i++)
                ids[i] = 1000 + i;
        b.n_segment_ids = 256;
        b.segment_ids = ids;
        env.id = 2;
        env.body_case = GPUPOOL__ENVELOPE__BODY_RETURN_SEGMENTS;
        env.return_segments = &b;
        rep = raw_call(sock, &env);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        gpupool__envelope__free_unpacked(rep, NULL);
        close(sock);
        /* Once the client has gone, everything it caused is in the log: a few lines and one summary. */
        ck_assert(testd_log_wait(&d, "messages suppressed (rate limit)"));
        ck_assert_int_le(log_count(&d, "it does not lease"), 10);
        ck_assert_int_eq(log_count(&d, "messages suppressed (rate limit)"), 1);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* stderr on a pipe nobody reads: the daemon serves on, and says what it dropped once the pipe drains. */
START_TEST(test_stuck_log_never_stops_serving) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__SetLimitRequest l = GPUPOOL__SET_LIMIT_REQUEST__INIT;
        static char buf[1 << 20];
        size_t got = 0;
        struct testd d;
        int p[2], op;
        double t0;

        if (under_tool())
                return;         /* 4000 requests through a daemon under valgrind outlast any timeout */
        ck_assert_int_eq(pipe(p), 0);
        testd_start_stderr(&d, p[1], NULL);
        close(p[1]);
        /* An operator's set-limit logs a line each (not a client's doing: no rate limit): 4000 fill any buffer. */
        op = raw_hello(&d, "operator");
        l.tenant = "default";
        l.has_max_bytes = 1;
        l.max_bytes = 1ULL << 30;
        env.body_case = GPUPOOL__ENVELOPE__BODY_SET_LIMIT;
        env.set_limit = &l;
        t0 = now_s();
        for (int i = 0; i < 4000; i++) {
                env.id = (uint64_t) i + 2;
                rep = raw_call(op, &env);
                ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
                gpupool__envelope__free_unpacked(rep, NULL);
                if (i % 500 == 0) {
                        char why[128];
                        int sock, r = try_hello(&d, &sock, why, sizeof(why));

                        ck_assert_msg(r == 1, "a client was not served with the log stuck (%d)", r);
                        close(sock);
                }
        }
        ck_assert_msg(now_s() - t0 < 30, "4000 requests took %.1f s", now_s() - t0);
        /* Drain the pipe, then one more line: the writer says how many it dropped. */
        fcntl(p[0], F_SETFL, O_NONBLOCK);
        t0 = now_s();
        while (now_s() - t0 < 10) {
                ssize_t n = read(p[0], buf + got, sizeof(buf) - 1 - got);

                if (n > 0) {
                        got += (size_t) n;
                        buf[got] = '\0';
                        if (strstr(buf, "log messages dropped: stderr was not being read"))
                                break;
                        if (got > sizeof(buf) / 2)
                                got = 0;        /* keep reading; only the notice matters */
                        continue;
                }
                env.id++;
                gpupool__envelope__free_unpacked(raw_call(op, &env), NULL);
                usleep(20000);
        }
        ck_assert_msg(strstr(buf, "log messages dropped: stderr was not being read"), "no notice of dropped lines");
        close(op);
        ck_assert_int_eq(testd_stop(&d), 0);
        close(p[0]);
}
END_TEST

/*
 * A stopped daemon: a call gives up after $GPUPOOL_TIMEOUT with -ETIMEDOUT; the handle is then
 * given up, says so (it does not come back on its own while that daemon lives on), and comes
 * back with reconnect.
 */
START_TEST(test_stopped_daemon_times_out) {
        gpupool_client *c;
        struct testd d;
        char why[256];
        double t0, took;
        void *p;

        testd_start(&d, NULL);
        setenv("GPUPOOL_TIMEOUT", "soon", 1);
        ck_assert_int_eq(gpupool_connect(d.sock, "patient", &c), -EINVAL);
        setenv("GPUPOOL_TIMEOUT", "700ms", 1);
        ck_assert_int_eq(gpupool_connect(d.sock, "patient", &c), 0);
        ck_assert_int_eq(kill(d.pid, SIGSTOP), 0);
        t0 = now_s();
        ck_assert_int_eq(gpupool_alloc(c, 0, 1 << 20, &p), -ETIMEDOUT);
        took = now_s() - t0;
        ck_assert_msg(took >= 0.6 && took < 3, "gave up after %.2f s", took);
        gpupool_last_error(c, why, sizeof(why));
        ck_assert_msg(strstr(why, "did not answer within 700 ms"), "%s", why);
        /* Given up: a late reply cannot answer a later request. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 1 << 20, &p), -ECONNRESET);
        gpupool_last_error(c, why, sizeof(why));
        ck_assert_msg(strstr(why, "given up: it did not answer in time") && strstr(why, "gpupool_reconnect() starts anew") &&
                      !strstr(why, "on its own"), "%s", why);
        ck_assert_int_eq(kill(d.pid, SIGCONT), 0);
        ck_assert_int_eq(gpupool_reconnect(c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 1 << 20, &p), 0);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        gpupool_disconnect(c);
        unsetenv("GPUPOOL_TIMEOUT");
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* Waits (10 s at most) until the daemon has no client: the start-up probe's close has been seen. */
static void wait_no_clients(struct testd *d) {
        char out[65536];

        for (double t0 = now_s(); now_s() - t0 < 10; usleep(50000))
                if (ctl(d, out, sizeof(out), "metrics") == 0 && strstr(out, "gpupool_clients{state=\"connected\"} 0\n"))
                        return;
        ck_abort_msg("the daemon still counts a client: %s", out);
}

/* As uid 65534: fills its per-uid cap with silent connections; one more is refused saying why. */
static int nobody_fills_its_cap(struct testd *d, void *arg) {
        struct peer *p = arg;
        char why[256] = "";
        int socks[4], sock;

        if (setgid(65534) < 0 || setuid(65534) < 0)
                return 20;
        for (int i = 0; i < 4; i++)
                socks[i] = raw_connect(d);
        if (try_hello(d, &sock, why, sizeof(why)) != 0 || !strstr(why, "max_clients_per_uid"))
                return 21;
        (void) socks;
        return peer_ready_then_wait(p);
}

/*
 * Silent connections: a per-uid cap stops one uid filling --max-clients, a hello deadline
 * drops them, and root still gets in past the limits for administrative requests.
 */
START_TEST(test_silent_connections_cannot_lock_out_the_operator) {
        Gpupool__Envelope *rep;
        Gpupool__Hello hello = GPUPOOL__HELLO__INIT;
        struct peer p = { 0 };
        char out[4096], why[256];
        gpupool_client *c;
        int mine[2], sock;
        const double hello_s = under_tool() ? 60 : 8;
        struct testd d;
        double t0;
        pid_t pid;

        testd_start(&d, "--max-clients", "6", "--max-clients-per-uid", "4", "--hello-timeout", under_tool() ? "60s" : "8s",
                    NULL);
        ck_assert_int_eq(chmod(d.dir, 0755), 0);
        wait_no_clients(&d);
        peer_pipes(&p);
        pid = spawn(nobody_fills_its_cap, &d, &p);
        peer_wait_ready(&p);
        /* Root fills the rest of --max-clients with silent connections of its own. */
        t0 = now_s();
        mine[0] = raw_connect(&d);
        mine[1] = raw_connect(&d);
        /* Even root's clients are refused at the limit (saying which)... */
        ck_assert_int_eq(try_hello(&d, &sock, why, sizeof(why)), 0);
        ck_assert_msg(strstr(why, "--max-clients"), "%s", why);
        ck_assert_int_eq(gpupool_connect(d.sock, "past-the-limit", &c), -EDQUOT);
        /* ...but the operator's tools get in, for administrative requests only. */
        ck_assert_int_eq(ctl(&d, out, sizeof(out), "status"), 0);
        hello.name = "operator";
        hello.has_admin = hello.admin = 1;
        sock = raw_hello_with(&d, &hello, NULL);
        rep = raw_lease(sock, 0, 4096);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_QUOTA);
        ck_assert_msg(strstr(rep->error, "administrative requests only"), "%s", rep->error);
        gpupool__envelope__free_unpacked(rep, NULL);
        close(sock);
        /* Silent connections are dropped after hello_timeout. */
        ck_assert_int_eq(recv(mine[0], out, sizeof(out), 0), 0);
        ck_assert_msg(now_s() - t0 >= hello_s - 1 && now_s() - t0 < hello_s * 1.5, "a silent connection lasted %.1f s",
                      now_s() - t0);
        close(mine[0]);
        close(mine[1]);
        ck_assert_int_eq(peer_finish(&p, pid), 0);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

Suite *suite_hardening(void) {
        Suite *s = suite_create("hardening");
        TCase *tc = tcase_create("host");

        tcase_add_test(tc, test_descriptor_that_blocks_on_close);
        tcase_add_test(tc, test_out_of_descriptors);
        tcase_add_test(tc, test_descriptor_limit_fits_max_clients);
        tcase_add_test(tc, test_log_rate_limit_per_client);
        tcase_add_test(tc, test_stuck_log_never_stops_serving);
        tcase_add_test(tc, test_stopped_daemon_times_out);
        tcase_add_test(tc, test_silent_connections_cannot_lock_out_the_operator);
        tcase_add_test(tc, test_reload_without_a_file_says_so);
        tcase_add_test(tc, test_refused_reload_keeps_tenant_sums);
        tcase_add_test(tc, test_reload_leaves_control_channels_out_of_tenants);
        tcase_add_test(tc, test_set_limit_pid_binds_later_connections);
        tcase_add_test(tc, test_start_errors_reach_the_journal_as_errors);
        tcase_add_test(tc, test_check_config_warns_of_name_before_uid);
        tcase_set_timeout(tc, 120);
        suite_add_tcase(s, tc);
        return s;
}
