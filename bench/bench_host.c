/*
 * bench_host.c: "make bench": what gpupool costs on the CPU, on the host backend, next to
 * baselines measured in the same run.
 *
 *   echo     a bare SOCK_SEQPACKET round trip to a server process that is one poll loop (as
 *            gpupoold is one loop), with packets of the sizes of a lease request and its
 *            reply: the floor any daemon round trip stands on;
 *   daemon   the round trips a process still makes: leasing a 2 MiB segment (from the
 *            daemon's cache after the first; its descriptor comes with the reply) and
 *            returning it, over the protocol (what gpupool_alloc() costs when the process's
 *            pool has no room, before it maps the segment);
 *   clients  8 processes leasing and returning at once for --seconds: round trips per
 *            second, next to 8 processes doing echo round trips;
 *   threads  1, 2 and 4 threads of one process sharing one handle, allocating and freeing
 *            4 KiB blocks (served by each thread's cache) and 64 KiB blocks (past it: the
 *            process's pool, under the handle's lock): alloc+free pairs per second, the median
 *            of 5 rounds;
 *   pairs    a 4 KiB and a 64 KiB alloc+free pair in the process, next to glibc's
 *            malloc+free of the same size (the baseline), the median of 10 alternating rounds;
 *   core     the allocator core alone (common/heap.c, which the process's pool runs): ns per
 *            alloc+free pair with 1 thousand, 100 thousand and 1 million free blocks in the
 *            index.
 *
 * Latencies are medians and p99 of --ops single operations timed with CLOCK_MONOTONIC (echo
 * and the daemon in 10 alternating rounds, so drifts of the machine fall on both alike).
 * Where the server runs matters more than anything it does: waking a process on another,
 * idle CPU costs far more than switching to it on the caller's, on virtual machines most of
 * all, and the scheduler chooses differently from one process to the next. So the
 * single-client round trips are measured twice, with the client and both servers pinned to
 * one CPU (the software's cost), and with the servers pinned to another CPU than the client
 * (the cost of a wakeup across CPUs added); the concurrent parts run unpinned. It prints one
 * table and writes the same as JSON to --json FILE.
 *
 * "make bench-instructions" runs the allocator core (--core-only N) and libgpupool's loop
 * (--client-only SIZE: 4096 for the thread cache, 65536 for the pool, against a daemon of its
 * own) under callgrind and reports instructions per alloc+free pair, which unlike nanoseconds
 * repeat exactly.
 *
 * Usage: bench_host --build DIR [--ops N] [--seconds S] [--json FILE]
 *        bench_host --ops N --core-only FREE_BLOCKS
 *        bench_host --build DIR --ops N --client-only SIZE
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <sched.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "conn.h"
#include "gpupool.h"
#include "heap.h"
#include "measure.h"
#include "private_daemon.h"
#include "wire.h"

#define MiB (1ULL << 20)

struct dist {
        double median, p99;
};

static struct dist summarize(double *v, size_t n) {
        qsort(v, n, sizeof(*v), cmp_double);
        return (struct dist) { v[n / 2], v[(size_t) ((double) n * 0.99)] };
}

/* ---- the packets of a lease and its reply, as the wire carries them ---- */

static size_t request_bytes, reply_bytes;

static void packet_sizes(void) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
        Gpupool__LeaseRequest l = GPUPOOL__LEASE_REQUEST__INIT;
        Gpupool__LeaseReply r = GPUPOOL__LEASE_REPLY__INIT;
        uint8_t buf[256];

        env.version = GP_PROTOCOL_VERSION;
        env.id = 1000;
        l.size = 4096;
        env.body_case = GPUPOOL__ENVELOPE__BODY_LEASE;
        env.lease = &l;
        request_bytes = (size_t) gp_wire_pack(&env, buf, sizeof(buf));
        env.has_status = 1;
        r.segment_id = 1;
        r.segment_size = 2 * MiB;
        env.body_case = GPUPOOL__ENVELOPE__BODY_LEASE_REPLY;
        env.lease_reply = &r;
        reply_bytes = (size_t) gp_wire_pack(&env, buf, sizeof(buf));
}

/* ---- echo ---- */

static char echo_path[108];

/*
 * The echo server: one process, one poll loop over every connection (as gpupoold is one loop),
 * answering each packet with a reply-sized one.
 */
static pid_t echo_server(void) {
        int l = socket(AF_UNIX, SOCK_SEQPACKET, 0);
        struct sockaddr_un_ { sa_family_t f; char p[108]; } addr = { AF_UNIX, "" };
        pid_t pid;

        memcpy(addr.p, echo_path, sizeof(addr.p));
        unlink(echo_path);
        if (l < 0 || bind(l, (struct sockaddr *) &addr, sizeof(addr)) < 0 || listen(l, 64) < 0) {
                perror("bench_host: echo server");
                exit(1);
        }
        pid = fork();
        if (pid == 0) {
                struct pollfd fds[64] = { { .fd = l, .events = POLLIN } };
                nfds_t n = 1;
                uint8_t buf[256] = { 0 };

                for (;;) {
                        if (poll(fds, n, -1) < 0)
                                continue;
                        for (nfds_t i = 1; i < n; i++) {
                                if (!(fds[i].revents & (POLLIN | POLLHUP)))
                                        continue;
                                if (recv(fds[i].fd, buf, sizeof(buf), MSG_DONTWAIT) <= 0 ||
                                    send(fds[i].fd, buf, reply_bytes, 0) < 0) {
                                        close(fds[i].fd);
                                        fds[i--] = fds[--n];
                                }
                        }
                        if ((fds[0].revents & POLLIN) && n < 64) {
                                int c = accept(l, NULL, NULL);

                                if (c >= 0)
                                        fds[n++] = (struct pollfd) { .fd = c, .events = POLLIN };
                        }
                }
        }
        close(l);
        return pid;
}

static int echo_connect(void) {
        int s;

        if (gp_wire_connect(echo_path, &s) < 0) {
                fprintf(stderr, "bench_host: cannot reach the echo server\n");
                exit(1);
        }
        return s;
}

/* Times ops echo round trips into t. */
static void echo_latency(size_t ops, double *t) {
        uint8_t buf[256] = { 0 };
        int s = echo_connect();

        for (size_t i = 0; i < ops; i++) {
                double t0 = now_ns();

                if (send(s, buf, request_bytes, 0) < 0 || recv(s, buf, sizeof(buf), 0) <= 0)
                        exit(1);
                t[i] = now_ns() - t0;
        }
        close(s);
}

/* ---- the daemon ---- */

static char sock_path[128], dir[64];

static pid_t start_daemon(const char *build) {
        return private_daemon_start(build, dir, sock_path, "2G");
}

/* ---- where processes run ---- */

static cpu_set_t all_cpus;

/* Pins pid (0: this thread) to cpu, or lets it run anywhere it could at start (cpu < 0). */
static void place(pid_t pid, int cpu) {
        cpu_set_t set = all_cpus;

        if (cpu >= 0) {
                CPU_ZERO(&set);
                CPU_SET(cpu, &set);
        }
        if (sched_setaffinity(pid, sizeof(set), &set) < 0) {
                perror("bench_host: sched_setaffinity");
                exit(1);
        }
}

/* The n-th CPU this process may run on, or -1. */
static int allowed_cpu(int n) {
        for (int c = 0; c < CPU_SETSIZE; c++)
                if (CPU_ISSET(c, &all_cpus) && n-- == 0)
                        return c;
        return -1;
}

/* A connection of its own to the daemon, as a process's main connection is. */
static void lessee_open(struct gp_conn *c) {
        Gpupool__Hello hello = GPUPOOL__HELLO__INIT;

        memset(c, 0, sizeof(*c));
        c->sock = -1;
        hello.name = "bench";
        if (gp_conn_open(c, sock_path, &hello, NULL) < 0) {
                fprintf(stderr, "bench_host: cannot connect to the daemon\n");
                exit(1);
        }
}

/* One lease round trip (a 2 MiB segment for 4 KiB; its descriptor closed) and one return; their times if asked. */
static void lease_and_return(struct gp_conn *c, double *tl, double *tr) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__LeaseRequest lr = GPUPOOL__LEASE_REQUEST__INIT;
        Gpupool__ReturnRequest rr = GPUPOOL__RETURN_REQUEST__INIT;
        uint64_t id;
        double t0 = now_ns(), t1;
        int fd = -1;

        lr.size = 4096;
        req.body_case = GPUPOOL__ENVELOPE__BODY_LEASE;
        req.lease = &lr;
        if (gp_conn_call(c, &req, GPUPOOL__ENVELOPE__BODY_LEASE_REPLY, &rep, &fd) < 0)
                _exit(1);
        t1 = now_ns();
        id = rep->lease_reply->segment_id;
        gpupool__envelope__free_unpacked(rep, NULL);
        if (fd >= 0)
                close(fd);
        rr.n_segment_ids = 1;
        rr.segment_ids = &id;
        req.body_case = GPUPOOL__ENVELOPE__BODY_RETURN_SEGMENTS;
        req.return_segments = &rr;
        if (gp_conn_call(c, &req, GPUPOOL__ENVELOPE__BODY_RETURN_REPLY, &rep, NULL) < 0)
                _exit(1);
        gpupool__envelope__free_unpacked(rep, NULL);
        if (tl)
                *tl = t1 - t0;
        if (tr)
                *tr = now_ns() - t1;
}

/* Times ops leases and their returns into tl and tr. */
static void daemon_latency(size_t ops, double *tl, double *tr) {
        struct gp_conn c;

        lessee_open(&c);
        for (size_t i = 0; i < ops; i++)
                lease_and_return(&c, &tl[i], &tr[i]);
        gp_conn_close(&c);
}

/* ---- threads of one handle on the process's pool ---- */

struct spinner {
        gpupool_client *c;
        size_t size;
        const bool *stop;
        uint64_t pairs;
        bool failed;
};

static void *spin_main(void *arg) {
        struct spinner *s = arg;
        void *p;

        while (!__atomic_load_n(s->stop, __ATOMIC_RELAXED)) {
                for (int i = 0; i < 64; i++) {
                        if (gpupool_alloc(s->c, 0, s->size, &p) < 0 || gpupool_free(s->c, p) < 0) {
                                s->failed = true;
                                return NULL;
                        }
                }
                s->pairs += 64;
        }
        return NULL;
}

/* Alloc+free pairs of size bytes per second of n threads sharing one handle for seconds. */
static double threaded(int n, size_t size, double seconds) {
        struct spinner s[8];
        pthread_t t[8];
        gpupool_client *c;
        bool stop = false;
        uint64_t pairs = 0;
        double t0;
        void *p;

        if (gpupool_connect(sock_path, "bench-threads", &c) < 0) {
                fprintf(stderr, "bench_host: cannot connect to the daemon\n");
                exit(1);
        }
        /* The first block leases its segment; from then on the process's pool serves. */
        if (gpupool_alloc(c, 0, size, &p) < 0 || gpupool_free(c, p) < 0)
                exit(1);
        t0 = now_ns();
        for (int i = 0; i < n; i++) {
                s[i] = (struct spinner) { .c = c, .size = size, .stop = &stop };
                if (pthread_create(&t[i], NULL, spin_main, &s[i]) != 0)
                        exit(1);
        }
        usleep((useconds_t) (seconds * 1e6));
        __atomic_store_n(&stop, true, __ATOMIC_RELAXED);
        for (int i = 0; i < n; i++) {
                pthread_join(t[i], NULL);
                if (s[i].failed) {
                        fprintf(stderr, "bench_host: an allocation failed in a thread\n");
                        exit(1);
                }
                pairs += s[i].pairs;
        }
        t0 = now_ns() - t0;
        gpupool_disconnect(c);
        return (double) pairs / (t0 / 1e9);
}

/* The median of 5 rounds for n threads. */
static double threaded_median(int n, size_t size, double seconds) {
        double rounds[5];

        for (int r = 0; r < 5; r++)
                rounds[r] = threaded(n, size, seconds / 5);
        qsort(rounds, 5, sizeof(double), cmp_double);
        return rounds[2];
}

static double concurrent(int n, double seconds, bool use_daemon) {
        uint64_t *counts = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        double start, elapsed;
        uint64_t total = 0;

        memset(counts, 0, 4096);
        start = now_ns();
        for (int k = 0; k < n; k++) {
                if (fork() != 0)
                        continue;
                double end = now_ns() + seconds * 1e9;
                uint64_t ops = 0;

                if (use_daemon) {
                        struct gp_conn c;

                        lessee_open(&c);
                        while (now_ns() < end) {
                                lease_and_return(&c, NULL, NULL);
                                ops += 2;
                        }
                        gp_conn_close(&c);
                } else {
                        uint8_t buf[256] = { 0 };
                        int s = echo_connect();

                        while (now_ns() < end) {
                                if (send(s, buf, request_bytes, 0) < 0 || recv(s, buf, sizeof(buf), 0) <= 0)
                                        _exit(1);
                                ops++;
                        }
                }
                counts[k] = ops;
                _exit(0);
        }
        for (int k = 0; k < n; k++) {
                int status;

                wait(&status);
                if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                        fprintf(stderr, "bench_host: a concurrent client failed\n");
                        exit(1);
                }
        }
        elapsed = (now_ns() - start) / 1e9;
        for (int k = 0; k < n; k++)
                total += counts[k];
        munmap(counts, 4096);
        return (double) total / elapsed;
}

/* ---- alloc+free pairs in the process: the process's own pool, and malloc as the baseline ---- */

/* The measured loop, alone in a function so that callgrind can count just it (--toggle-collect). */
__attribute__((noinline)) void client_loop(gpupool_client *c, size_t size, size_t ops, double *t) {
        void *p;

        for (size_t i = 0; i < ops; i++) {
                double t0 = t ? now_ns() : 0;

                if (gpupool_alloc(c, 0, size, &p) < 0 || gpupool_free(c, p) < 0)
                        exit(1);
                if (t)
                        t[i] = now_ns() - t0;
        }
}

/*
 * ns per alloc+free pair of size bytes through libgpupool, one block staying allocated and
 * the first pair untimed, so that every timed one is served in the process (t NULL: untimed,
 * for callgrind).
 */
static struct dist client_pairs(size_t size, size_t ops, double *t) {
        gpupool_client *c;
        void *keep;

        if (gpupool_connect(sock_path, "bench", &c) < 0 || gpupool_alloc(c, 0, size, &keep) < 0)
                exit(1);
        client_loop(c, size, 1, NULL);
        client_loop(c, size, ops, t);
        gpupool_free(c, keep);
        gpupool_disconnect(c);
        return t ? summarize(t, ops) : (struct dist) { 0, 0 };
}

/* ns per malloc+free pair of size bytes: the baseline, glibc's allocator in the same process. */
__attribute__((noinline)) static struct dist malloc_pairs(size_t size, size_t ops, double *t) {
        void *keep = malloc(size);

        for (size_t i = 0; i < ops; i++) {
                double t0 = now_ns();
                void *p = malloc(size);

                if (!p)
                        exit(1);
                __asm__ volatile("" : : "r"(p) : "memory");     /* kept: the pair is not optimized away */
                free(p);
                t[i] = now_ns() - t0;
        }
        free(keep);
        return summarize(t, ops);
}

/* ---- the allocator core alone ---- */

/* The measured loop, alone in a function so that callgrind can count just it (--toggle-collect). */
__attribute__((noinline)) void core_loop(struct heap *h, size_t ops, double *t) {
        for (size_t i = 0; i < ops; i++) {
                double t0 = t ? now_ns() : 0;
                struct heap_block *b = heap_alloc(h, HEAP_CLASS_SMALL, 512);

                if (!b)
                        exit(1);
                (void) heap_free(h, b);
                if (t)
                        t[i] = now_ns() - t0;
        }
}

/* ns per alloc+free pair with free_blocks fragments in the free index (t NULL: untimed, for callgrind). */
static struct dist pool_core(size_t free_blocks, size_t ops, double *t) {
        size_t per_segment = 2 * MiB / 512, nseg = (2 * free_blocks + 1) / per_segment + 1;
        struct heap_segment *segs = calloc(nseg, sizeof(*segs));
        struct heap_block **held = malloc(2 * free_blocks * sizeof(*held));
        struct heap h;

        if (!segs || !held)
                exit(1);
        heap_init(&h);
        for (size_t i = 0; i < nseg; i++)
                if (heap_add(&h, &segs[i], i + 1, 2 * MiB, HEAP_CLASS_SMALL) < 0)
                        exit(1);
        /* Alternate held and freed 512-byte blocks: every freed one is its own fragment. */
        for (size_t i = 0; i < 2 * free_blocks; i++)
                if (!(held[i] = heap_alloc(&h, HEAP_CLASS_SMALL, 512)))
                        exit(1);
        for (size_t i = 0; i < 2 * free_blocks; i += 2)
                (void) heap_free(&h, held[i]);
        core_loop(&h, ops, t);
        for (size_t i = 0; i < nseg; i++)
                (void) heap_drop(&segs[i]);
        free(held);
        free(segs);
        return t ? summarize(t, ops) : (struct dist) { 0, 0 };
}

int main(int argc, char **argv) {
        static const struct option opts[] = {
                { "build", required_argument, NULL, 'b' }, { "ops", required_argument, NULL, 'n' },
                { "seconds", required_argument, NULL, 's' }, { "json", required_argument, NULL, 'j' },
                { "core-only", required_argument, NULL, 'c' }, { "client-only", required_argument, NULL, 'l' }, { 0 },
        };
        const char *build = "build", *json = NULL;
        size_t ops = 100000;
        double seconds = 3, echo8, daemon8, *t1, *t2, *t3;
        struct dist echo[2], alloc[2], freed[2], core[3], pair_malloc[2], pair_pool[2];
        double threads[2][3];
        static const int thread_counts[3] = { 1, 2, 4 };
        /* A block the thread's cache serves, and one past it (the pool, under the handle's lock). */
        static const size_t pair_sizes[2] = { 4096, 65536 };
        static const char *const pair_names[2] = { "4 KiB", "64 KiB" };
        size_t client_only = 0;
        static const size_t core_sizes[3] = { 1000, 100000, 1000000 };
        pid_t echo_pid, daemon_pid;
        bool apart;
        int o;
        FILE *f;

        while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
                switch (o) {
                case 'b': build = optarg; break;
                case 'n': ops = strtoull(optarg, NULL, 10); break;
                case 's': seconds = atof(optarg); break;
                case 'j': json = optarg; break;
                case 'c':
                        /* Only the core loop, untimed, with this many free blocks: for callgrind. */
                        (void) pool_core(strtoull(optarg, NULL, 10), ops, NULL);
                        return 0;
                case 'l':
                        /* Only libgpupool's loop, untimed, against a daemon of its own: for callgrind. */
                        client_only = strtoull(optarg, NULL, 10);
                        if (!client_only) {
                                fprintf(stderr, "bench_host: --client-only takes a block size in bytes\n");
                                return 2;
                        }
                        break;
                default:
                        fprintf(stderr, "usage: bench_host --build DIR [--ops N] [--seconds S] [--json FILE]\n");
                        return 2;
                }
        }
        if (ops < 100 || seconds <= 0) {
                fprintf(stderr, "bench_host: --ops at least 100, --seconds positive\n");
                return 2;
        }
        if (sched_getaffinity(0, sizeof(all_cpus), &all_cpus) < 0)
                return 1;
        t1 = malloc(ops * sizeof(double));
        t2 = malloc(ops * sizeof(double));
        t3 = malloc(ops * sizeof(double));
        strcpy(dir, "/tmp/gpupool-bench-XXXXXX");
        if (!t1 || !t2 || !t3 || !mkdtemp(dir))
                return 1;
        snprintf(sock_path, sizeof(sock_path), "%s/gpupool.sock", dir);
        snprintf(echo_path, sizeof(echo_path), "%s/echo.sock", dir);
        if (client_only) {
                daemon_pid = start_daemon(build);
                (void) client_pairs(client_only, ops, NULL);
                kill(daemon_pid, SIGTERM);
                waitpid(daemon_pid, NULL, 0);
                return 0;
        }
        packet_sizes();
        echo_pid = echo_server();
        daemon_pid = start_daemon(build);

        /*
         * Warm both up, then measure them in 10 alternating rounds, so that the machine's
         * drifts fall on both alike: everything on one CPU, then the servers on another.
         */
        apart = allowed_cpu(1) >= 0;
        for (int placement = 0; placement < (apart ? 2 : 1); placement++) {
                place(0, allowed_cpu(0));
                place(echo_pid, allowed_cpu(placement));
                place(daemon_pid, allowed_cpu(placement));
                echo_latency(ops / 10, t1);
                daemon_latency(ops / 10, t1, t2);
                for (size_t r = 0, k = ops / 10; r < 10; r++) {
                        size_t n = r < 9 ? k : ops - 9 * k;

                        echo_latency(n, t3 + r * k);
                        daemon_latency(n, t1 + r * k, t2 + r * k);
                }
                echo[placement] = summarize(t3, ops);
                alloc[placement] = summarize(t1, ops);
                freed[placement] = summarize(t2, ops);
        }
        place(0, -1);
        place(echo_pid, -1);
        place(daemon_pid, -1);
        echo8 = concurrent(8, seconds, false);
        daemon8 = concurrent(8, seconds, true);
        /* Pairs served in the process, and malloc's of the same size, alternating in 10 rounds. */
        for (int s = 0; s < 2; s++) {
                for (size_t r = 0, k = ops / 10; r < 10; r++) {
                        size_t n = r < 9 ? k : ops - 9 * k;

                        (void) malloc_pairs(pair_sizes[s], n, t2 + r * k);
                        (void) client_pairs(pair_sizes[s], n, t3 + r * k);
                }
                pair_malloc[s] = summarize(t2, ops);
                pair_pool[s] = summarize(t3, ops);
                for (int i = 0; i < 3; i++)
                        threads[s][i] = threaded_median(thread_counts[i], pair_sizes[s], seconds);
        }
        for (int i = 0; i < 3; i++)
                core[i] = pool_core(core_sizes[i], ops, t1);

        kill(daemon_pid, SIGTERM);
        waitpid(daemon_pid, NULL, 0);
        kill(echo_pid, SIGKILL);
        waitpid(echo_pid, NULL, 0);

        printf("gpupool bench (host backend); request %zu B, reply %zu B; %zu operations each\n\n",
               request_bytes, reply_bytes, ops);
        for (int placement = 0; placement < (apart ? 2 : 1); placement++) {
                printf("%-44s %12s %12s %10s\n", placement ? "round trip (1 client), servers on another CPU"
                                                           : "round trip (1 client), all on one CPU",
                       "median ns", "p99 ns", "x echo");
                printf("%-44s %12.0f %12.0f %10s\n", "echo, bare SEQPACKET (baseline)", echo[placement].median,
                       echo[placement].p99, "1.00");
                printf("%-44s %12.0f %12.0f %10.2f\n", "lease of a cached 2 MiB segment", alloc[placement].median,
                       alloc[placement].p99, alloc[placement].median / echo[placement].median);
                printf("%-44s %12.0f %12.0f %10.2f\n\n", "its return", freed[placement].median, freed[placement].p99,
                       freed[placement].median / echo[placement].median);
        }
        printf("%-44s %12s %10s\n", "8 concurrent clients", "ops/s", "x echo");
        printf("%-44s %12.0f %10s\n", "echo round trips (baseline)", echo8, "1.00");
        printf("%-44s %12.0f %10.2f\n", "gpupool leases and returns", daemon8, daemon8 / echo8);
        printf("\n%-44s %12s %12s\n", "threads of one handle", "pairs/s", "per thread");
        for (int s = 0; s < 2; s++) {
                for (int i = 0; i < 3; i++) {
                        char name[64];

                        snprintf(name, sizeof(name), "%d thread%s, %s alloc+free (%s)", thread_counts[i],
                                 thread_counts[i] > 1 ? "s" : "", pair_names[s], s ? "pool" : "thread cache");
                        printf("%-44s %12.0f %12.0f\n", name, threads[s][i], threads[s][i] / thread_counts[i]);
                }
        }
        for (int s = 0; s < 2; s++) {
                char name[64];

                snprintf(name, sizeof(name), "%s alloc+free pair in the process", pair_names[s]);
                printf("\n%-44s %12s %12s %10s\n", name, "median ns", "p99 ns", "x malloc");
                printf("%-44s %12.0f %12.0f %10s\n", "glibc malloc+free (baseline)", pair_malloc[s].median,
                       pair_malloc[s].p99, "1.00");
                printf("%-44s %12.0f %12.0f %10.2f\n", s ? "libgpupool: the process's pool" : "libgpupool: the thread's cache",
                       pair_pool[s].median, pair_pool[s].p99, pair_pool[s].median / pair_malloc[s].median);
        }
        printf("\n%-44s %12s %12s\n", "allocator core alone, alloc+free pair", "median ns", "p99 ns");
        for (int i = 0; i < 3; i++) {
                char name[64];

                snprintf(name, sizeof(name), "%zu free blocks in the index", core_sizes[i]);
                printf("%-44s %12.0f %12.0f\n", name, core[i].median, core[i].p99);
        }
        if (json) {
                f = fopen(json, "w");
                if (!f) {
                        perror(json);
                        return 1;
                }
                fprintf(f, "{\n  \"ops\": %zu, \"seconds\": %.1f, \"request_bytes\": %zu, \"reply_bytes\": %zu,\n", ops, seconds,
                        request_bytes, reply_bytes);
                for (int placement = 0; placement < (apart ? 2 : 1); placement++) {
                        const char *where = placement ? "apart" : "one_cpu";

                        fprintf(f, "  \"echo_ns_%s\": {\"median\": %.0f, \"p99\": %.0f},\n", where, echo[placement].median,
                                echo[placement].p99);
                        fprintf(f, "  \"lease_ns_%s\": {\"median\": %.0f, \"p99\": %.0f},\n", where, alloc[placement].median,
                                alloc[placement].p99);
                        fprintf(f, "  \"return_ns_%s\": {\"median\": %.0f, \"p99\": %.0f},\n", where, freed[placement].median,
                                freed[placement].p99);
                }
                for (int s = 0; s < 2; s++) {
                        fprintf(f, "  \"pair_malloc_%zu_ns\": {\"median\": %.0f, \"p99\": %.0f},\n", pair_sizes[s],
                                pair_malloc[s].median, pair_malloc[s].p99);
                        fprintf(f, "  \"pair_%s_%zu_ns\": {\"median\": %.0f, \"p99\": %.0f},\n",
                                s ? "process_pool" : "thread_cache", pair_sizes[s], pair_pool[s].median, pair_pool[s].p99);
                }
                fprintf(f, "  \"echo_8_clients_ops_per_s\": %.0f, \"gpupool_8_clients_ops_per_s\": %.0f,\n", echo8, daemon8);
                fprintf(f, "  \"threads_pairs_per_s\": [");
                for (int s = 0; s < 2; s++)
                        for (int i = 0; i < 3; i++)
                                fprintf(f, "%s{\"threads\": %d, \"block_bytes\": %zu, \"pairs_per_s\": %.0f}", s || i ? ", " : "",
                                        thread_counts[i], pair_sizes[s], threads[s][i]);
                fprintf(f, "],\n");
                fprintf(f, "  \"pool_core_ns\": [");
                for (int i = 0; i < 3; i++)
                        fprintf(f, "%s{\"free_blocks\": %zu, \"median\": %.0f, \"p99\": %.0f}", i ? ", " : "", core_sizes[i],
                                core[i].median, core[i].p99);
                fprintf(f, "]\n}\n");
                fclose(f);
        }
        unlink(echo_path);
        return 0;
}
