/*
 * adopt.c: "make bench-adopt": what adoption after a daemon restart costs, host backend.
 *
 * For each amount of memory a process holds, in 2 MiB granules:
 *
 *   lease     a raw client leases it from a private gpupoold, 128 granules per request: what
 *             the memory costs when it is asked for anew (the baseline, measured in the
 *             same run);
 *   adopt     the daemon is killed (SIGKILL) and a new one started; the client says hello to
 *             it and hands every descriptor back, 128 per AdoptRequest, as libgpupool does;
 *   resume    a libgpupool process holding the same memory in segments that grow in place:
 *             from the new daemon listening to its first lease that succeeds (its control
 *             thread tries 100 ms after the old daemon went, then backs off: that wait is in
 *             the figure, and is most of it);
 *   first     a new libgpupool process (forked by the launcher, so its descriptor table is
 *             as small as any new process's) connects to a new daemon and allocates the same
 *             memory in segments that grow in place: gpupool_connect() and gpupool_alloc()
 *             together, with the descriptor it keeps per granule and the growth of its
 *             descriptor table that takes (the raw lease is the baseline).
 *
 * Every daemon is started afresh, as systemd starts one, by a launcher process forked before
 * the benchmark opened any descriptor: a daemon forked from the benchmark itself would inherit
 * the size of its descriptor table (large, with the granules' descriptors), and never pay for
 * growing its own.
 *
 * Medians of --runs runs (7), in milliseconds. Usage: adopt --build DIR [--runs N] [--sizes MiB,...]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "conn.h"
#include "gpupool.h"
#include "measure.h"
#include "private_daemon.h"

#define MiB (1ULL << 20)
#define GRANULE (2 * MiB)
#define BATCH 128
#define MAX_GRANULES 4096
#define MAX_RUNS 31

static char dir[64], sock_path[128];
static const char *build = "build";
static pid_t daemon_pid;

static double now_ms(void) {
        return now_ns() / 1e6;
}

/* Nothing left behind: the socket, the empty config, the log, the directory. */
static void remove_dir(void) {
        static const char *const names[] = { "gpupool.sock", "empty.conf", "gpupoold.log" };
        char path[128];

        if (!dir[0])
                return;
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
                snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
                unlink(path);
        }
        rmdir(dir);
}

static void die(const char *what, const char *why) {
        fprintf(stderr, "adopt: %s: %s\n", what, why);
        if (daemon_pid > 0)
                kill(daemon_pid, SIGKILL);
        remove_dir();
        exit(1);
}

static int launch_req[2] = { -1, -1 }, launch_rep[2] = { -1, -1 };

static double first_run(size_t n);

/*
 * The launcher: for each 's' asked, a daemon, its pid answered; for each 'f' and a count of
 * granules, a new process that runs first_run(), its milliseconds answered. It never waits
 * for them (SIGCHLD ignored).
 */
static void launcher(void) {
        char path[256], log[160], conf[160], b;

        snprintf(path, sizeof(path), "%s/gpupoold", build);
        snprintf(log, sizeof(log), "%s/gpupoold.log", dir);
        snprintf(conf, sizeof(conf), "%s/empty.conf", dir);
        close(open(conf, O_WRONLY | O_CREAT | O_TRUNC, 0644));
        close(launch_req[1]);   /* the benchmark's: its end of the run closes the other */
        close(launch_rep[0]);
        signal(SIGCHLD, SIG_IGN);
        while (read(launch_req[0], &b, 1) == 1) {
                size_t n;
                pid_t pid;

                if (b == 'f') {
                        if (read(launch_req[0], &n, sizeof(n)) != sizeof(n))
                                _exit(1);
                        if (fork() == 0) {
                                double ms = first_run(n);

                                _exit(write(launch_rep[1], &ms, sizeof(ms)) == sizeof(ms) ? 0 : 1);
                        }
                        continue;
                }
                pid = fork();

                if (pid == 0) {
                        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);

                        dup2(fd, 2);
                        dup2(fd, 1);    /* not the benchmark's output: a pipe to tee would never end */
                        signal(SIGCHLD, SIG_DFL);
                        execl(path, path, "--socket", sock_path, "--backend", "host", "--host-capacity", "9G",
                              "--log-level", "err", "--config", conf, (char *) NULL);
                        _exit(127);
                }
                if (write(launch_rep[1], &pid, sizeof(pid)) != sizeof(pid))
                        _exit(1);
        }
        _exit(0);
}

/* A new daemon from the launcher, listening once this returns. */
static void start(void) {
        char b = 's', log[160];

        unlink(sock_path);
        if (write(launch_req[1], &b, 1) != 1 || read(launch_rep[0], &daemon_pid, sizeof(daemon_pid)) != sizeof(daemon_pid))
                die("launcher", "gone");
        snprintf(log, sizeof(log), "%s/gpupoold.log", dir);
        private_daemon_wait(sock_path, log);
}

/* kill -9 of the daemon, gone once this returns, and a new one. */
static void restart(void) {
        kill(daemon_pid, SIGKILL);
        while (kill(daemon_pid, 0) == 0)
                usleep(200);
        start();
}

static void hello(struct gp_conn *c, const char *name) {
        Gpupool__Hello h = GPUPOOL__HELLO__INIT;

        h.name = (char *) name;
        if (gp_conn_open(c, sock_path, &h, NULL) < 0)
                die("hello", c->error);
}

/* Leases n granules, 128 per request; their descriptors into fds. Returns the milliseconds it took. */
static double lease(struct gp_conn *c, int *fds, size_t n) {
        double t0 = now_ms();

        for (size_t done = 0; done < n;) {
                Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
                Gpupool__LeaseRequest lr = GPUPOOL__LEASE_REQUEST__INIT;
                uint32_t k = (uint32_t) (n - done < BATCH ? n - done : BATCH);
                size_t got = 0;

                lr.size = GRANULE;
                lr.has_granules = true;
                lr.granules = k;
                req.body_case = GPUPOOL__ENVELOPE__BODY_LEASE;
                req.lease = &lr;
                if (gp_conn_call_fds(c, &req, GPUPOOL__ENVELOPE__BODY_LEASE_REPLY, &rep, fds + done, BATCH, &got) < 0 ||
                    got != k)
                        die("lease", c->error);
                gpupool__envelope__free_unpacked(rep, NULL);
                done += got;
        }
        return now_ms() - t0;
}

/* Has the daemon adopt n granules (fds), 128 per request, all of which it must. Returns the milliseconds it took. */
static double adopt(struct gp_conn *c, const int *fds, size_t n) {
        uint64_t sizes[BATCH];
        double t0 = now_ms();

        for (size_t i = 0; i < BATCH; i++)
                sizes[i] = GRANULE;
        for (size_t done = 0; done < n;) {
                Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
                Gpupool__AdoptRequest ar = GPUPOOL__ADOPT_REQUEST__INIT;
                size_t k = n - done < BATCH ? n - done : BATCH;

                ar.sizes = sizes;
                ar.n_sizes = k;
                req.body_case = GPUPOOL__ENVELOPE__BODY_ADOPT;
                req.adopt = &ar;
                if (gp_conn_call_passing(c, &req, fds + done, k, GPUPOOL__ENVELOPE__BODY_ADOPT_REPLY, &rep) < 0)
                        die("adopt", c->error);
                if (rep->adopt_reply->n_segment_ids != k)
                        die("adopt", rep->adopt_reply->refused_error ? rep->adopt_reply->refused_error : "fewer adopted");
                gpupool__envelope__free_unpacked(rep, NULL);
                done += k;
        }
        return now_ms() - t0;
}

/* One run over the raw protocol: the lease from a daemon that has nothing cached, then the adoption after a restart. */
static void raw_run(size_t n, double *lease_ms, double *adopt_ms) {
        static int fds[MAX_GRANULES];
        struct gp_conn before = { .sock = -1 }, after = { .sock = -1 };

        restart();
        hello(&before, "bench-before");
        *lease_ms = lease(&before, fds, n);
        restart();
        gp_conn_close(&before);
        hello(&after, "bench-after");
        *adopt_ms = adopt(&after, fds, n);
        gp_conn_close(&after);
        for (size_t i = 0; i < n; i++)
                close(fds[i]);
}

/* One run through libgpupool: a process holding n granules, from the new daemon listening to its first lease that succeeds. */
static double resume_run(size_t n) {
        struct gpupool_stats st;
        gpupool_client *c = NULL;
        void *held, *more;
        double t0;
        int r;

        setenv("GPUPOOL_SEGMENTS", "grow", 1);
        setenv("GPUPOOL_IDLE_RETURN", "0", 1);
        restart();      /* the raw run's memory is this process's until it exits, to the daemon before */
        if (gpupool_connect(sock_path, "bench-resume", &c) < 0)
                die("resume", "cannot connect");
        if ((r = gpupool_alloc(c, 0, n * GRANULE - MiB, &held)) < 0) {
                char why[256];

                gpupool_last_error(c, why, sizeof(why));
                die("resume", *why ? why : gpupool_strerror(r));
        }
        /*
         * What the process holds free (granules leased ahead of a large block) would serve the
         * 64 MiB below in the process, with no daemon: a figure of 0.1 ms that measures no
         * resume. It gives them back first, so that the allocation must lease.
         */
        if (gpupool_trim(c) < 0 || gpupool_stats(c, &st) < 0)
                die("resume", "cannot trim");
        if (st.cached_bytes >= 64 * MiB)
                die("resume", "the process still holds 64 MiB free after a trim: the figure would measure no resume");
        restart();
        t0 = now_ms();
        while ((r = gpupool_alloc(c, 0, 64 * MiB, &more)) == -ECONNRESET && now_ms() - t0 < 10000)
                usleep(200);
        if (r < 0)
                die("resume", gpupool_strerror(r));
        t0 = now_ms() - t0;
        gpupool_free(c, more);
        gpupool_free(c, held);
        gpupool_disconnect(c);
        return t0;
}

/* In a new process: from nothing to holding n granules through libgpupool, connect included. */
static double first_run(size_t n) {
        gpupool_client *c = NULL;
        double t0;
        void *held;

        setenv("GPUPOOL_SEGMENTS", "grow", 1);
        setenv("GPUPOOL_IDLE_RETURN", "0", 1);
        t0 = now_ms();
        if (gpupool_connect(sock_path, "bench-first", &c) < 0 || gpupool_alloc(c, 0, n * GRANULE - MiB, &held) < 0)
                return -1;
        t0 = now_ms() - t0;
        gpupool_free(c, held);
        gpupool_disconnect(c);
        return t0;
}

/* One run of first_run() in a new process, against a new daemon. */
static double first_in_new_process(size_t n) {
        char b = 'f';
        double ms;

        restart();
        if (write(launch_req[1], &b, 1) != 1 || write(launch_req[1], &n, sizeof(n)) != sizeof(n) ||
            read(launch_rep[0], &ms, sizeof(ms)) != sizeof(ms))
                die("launcher", "gone");
        if (ms < 0)
                die("first", "the new process could not lease the memory");
        return ms;
}

int main(int argc, char **argv) {
        static const struct option opts[] = {
                { "build", required_argument, NULL, 'b' }, { "runs", required_argument, NULL, 'r' },
                { "sizes", required_argument, NULL, 's' }, { 0 },
        };
        char sizes_arg[256] = "64,256,1024,4096,8192";
        int runs = 7, o;
        struct rlimit rl;

        while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
                switch (o) {
                case 'b': build = optarg; break;
                case 'r': runs = atoi(optarg); break;
                case 's': snprintf(sizes_arg, sizeof(sizes_arg), "%s", optarg); break;
                default:
                        fprintf(stderr, "usage: adopt --build DIR [--runs N] [--sizes MiB,...]\n");
                        return 2;
                }
        }
        if (runs < 1 || runs > MAX_RUNS) {
                fprintf(stderr, "adopt: --runs is 1 to %d\n", MAX_RUNS);
                return 2;
        }
        signal(SIGPIPE, SIG_IGN);
        /* The raw client holds a descriptor per granule, as the library does (which raises its own). */
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
                rl.rlim_cur = rl.rlim_max;
                (void) setrlimit(RLIMIT_NOFILE, &rl);
        }
        strcpy(dir, "/tmp/gpupool-bench-adopt-XXXXXX");
        if (!mkdtemp(dir))
                die("mkdtemp", strerror(errno));
        snprintf(sock_path, sizeof(sock_path), "%s/gpupool.sock", dir);
        if (pipe2(launch_req, O_CLOEXEC) < 0 || pipe2(launch_rep, O_CLOEXEC) < 0)
                die("pipe", strerror(errno));
        if (fork() == 0)
                launcher();
        close(launch_req[0]);
        close(launch_rep[1]);
        start();
        printf("adoption after a daemon restart, host backend: medians of %d runs, in ms\n", runs);
        printf("%10s %9s %12s %12s %8s %14s %13s\n", "held", "granules", "lease anew", "adopt", "ratio", "resume (lib)",
               "first (lib)");
        for (char *save = NULL, *s = strtok_r(sizes_arg, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
                size_t mib = strtoul(s, NULL, 10), n = mib * MiB / GRANULE;
                double leases[MAX_RUNS], adopts[MAX_RUNS], resumes[MAX_RUNS], firsts[MAX_RUNS], l, a;

                if (n == 0 || n > MAX_GRANULES)
                        die("--sizes", "each is 2 to 8192 MiB");
                for (int i = 0; i < runs; i++) {
                        raw_run(n, &leases[i], &adopts[i]);
                        resumes[i] = resume_run(n);
                        firsts[i] = first_in_new_process(n);
                }
                l = median(leases, (size_t) runs);
                a = median(adopts, (size_t) runs);
                printf("%6zu MiB %9zu %12.2f %12.2f %8.2f %14.1f %13.2f\n", mib, n, l, a, a / l,
                       median(resumes, (size_t) runs), median(firsts, (size_t) runs));
                fflush(stdout);
        }
        kill(daemon_pid, SIGTERM);
        close(launch_req[1]);   /* the launcher ends */
        remove_dir();
        return 0;
}
