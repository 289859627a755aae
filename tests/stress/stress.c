/*
 * stress.c: "make stress": gpupoold under load, abuse and injected faults, checked throughout.
 *
 * It starts a daemon (host backend, --check-invariants, two tenants, a short idle_release and
 * a small watermark so that every cache path runs, and TEST-ONLY fault injection of segment
 * creations, exports and zeroings), then for --seconds runs --clients worker processes doing
 * random allocations, writes, checks, frees, flushes and status requests (some keeping free
 * segments, some carving their own blocks from leased segments, some growing segments in
 * place, so reclaims happen), while the parent SIGKILLs a random worker every few hundred
 * milliseconds and starts another, and hostile peers connect: clients that never read their
 * replies, clients that say nothing, clients that send garbage, clients that claim memory
 * free and give none back (answering with nothing, or never), clients that connect, lease
 * and close over and over (sessions left exiting), clients that hand over a write-sealed
 * memfd for adoption (which must be refused), clients that ask to publish blocks whose
 * pages they pinned (which must be refused, the loop never waiting on the pins), and clients
 * of another uid that publish the workers' object names first (the workers must still attach
 * exactly their own). --daemon-kills times the
 * parent SIGKILLs the daemon itself and starts a new one a moment later, as systemd would:
 * the workers go on within what they hold (a lease fails with -ECONNRESET meanwhile), check
 * their data throughout, and reconnect on their own; the new daemon adopts what they hold,
 * checking its invariants after every adoption (--check-invariants), and takes over the named
 * objects from the descriptor store the parent keeps as systemd's (tests/fdstore.c). The parent asks the
 * daemon to check itself (CheckRequest) at sampled points and after every restart. At the end
 * every worker is gone and the daemon must hold no byte beyond its cache, give all of that
 * back on a flush, still answer, have an RSS under --max-rss, and stop cleanly. Exit 0 and a
 * summary line, or 1 saying what failed.
 *
 * Usage: stress --build DIR [--clients N] [--seconds S] [--max-rss MiB] [--faults SPEC] [--daemon-kills N]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "conn.h"
#include "fdstore.h"
#include "gpupool.h"

#define MiB (1ULL << 20)
#define MAX_CLIENTS 256

static char dir[64], sock_path[128], log_path[128], conf_path[128];
/* systemd's descriptor store, played here: named objects outlive the daemon's kills in it. */
static struct fdstore *store;
static pid_t daemon_pid;
static const char *daemon_build, *daemon_faults;

static double now_s(void) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

static void nap_ms(long ms) {
        struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

        nanosleep(&ts, NULL);
}

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *fmt, ...) {
        va_list ap;

        fputs("stress: FAILED: ", stderr);
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fprintf(stderr, "\n(daemon log: %s)\n", log_path);
        if (daemon_pid > 0)
                kill(daemon_pid, SIGKILL);
        exit(1);
}

/* ---- the daemon ---- */

/* Starts the daemon on the socket (a stale one after a kill included) and waits until it listens. */
static void launch_daemon(void) {
        char path[256];

        /* The daemon built with fault injection (the shipped one has none): the same code otherwise. */
        snprintf(path, sizeof(path), "%s/tests/gpupoold-faults", daemon_build);
        fdstore_freeze(store);          /* what the daemon before stored, up to its end */
        daemon_pid = fork();
        if (daemon_pid == 0) {
                int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);

                dup2(fd, 2);
                fdstore_pass(store);
                if (daemon_faults && *daemon_faults)
                        setenv("GPUPOOL_TEST_FAULTS", daemon_faults, 1);
                execl(path, path, "--config", conf_path, "--socket", sock_path, "--backend", "host", "--host-capacity",
                      "256M", "--check-invariants", "--log-level", "info", (char *) NULL);
                _exit(127);
        }
        fdstore_thaw(store);
        for (int i = 0; i < 2000; i++) {
                int s;

                if (gp_wire_connect(sock_path, &s) == 0) {
                        close(s);
                        return;
                }
                if (waitpid(daemon_pid, NULL, WNOHANG) == daemon_pid)
                        fail("gpupoold exited at start");
                nap_ms(5);
        }
        fail("gpupoold did not listen");
}

static void start_daemon(const char *build, const char *faults) {
        FILE *f;

        strcpy(dir, "/tmp/gpupool-stress-XXXXXX");
        if (!mkdtemp(dir))
                fail("mkdtemp: %s", strerror(errno));
        /* Another uid's peers (object squatters, where the run is root's) reach the socket too. */
        if (chmod(dir, 0755) < 0)
                fail("chmod %s: %s", dir, strerror(errno));
        snprintf(sock_path, sizeof(sock_path), "%s/gpupool.sock", dir);
        snprintf(log_path, sizeof(log_path), "%s/gpupoold.log", dir);
        snprintf(conf_path, sizeof(conf_path), "%s/gpupoold.conf", dir);
        f = fopen(conf_path, "w");
        if (!f)
                fail("cannot write %s", conf_path);
        fputs("[pool]\nidle_release = 1s\nmax_cached = 16M\nreclaim_timeout = 100ms\nidle_objects = 2s\n"
              "[limits]\nclient_max = 48M\n"
              "[tenant:even]\nmatch_name = worker-even-*\nmax = 160M\nguarantee = 32M\n", f);
        fclose(f);
        daemon_build = build;
        daemon_faults = faults;
        store = fdstore_new();
        launch_daemon();
}

/* kill -9 of the daemon, and a new one a moment later on the same socket and config. */
static void restart_daemon(unsigned *seed) {
        if (kill(daemon_pid, SIGKILL) < 0 || waitpid(daemon_pid, NULL, 0) != daemon_pid)
                fail("cannot kill gpupoold: %s", strerror(errno));
        daemon_pid = -1;
        nap_ms((long) (rand_r(seed) % 300));
        launch_daemon();
}

/*
 * How many adoptions the daemons' log tells of, how many segments they adopted, and how many
 * named objects they took over from systemd's store.
 */
static void count_adoptions(unsigned long *requests, unsigned long *segments, unsigned long *objects) {
        char line[1024];
        FILE *f = fopen(log_path, "r");

        *requests = *segments = *objects = 0;
        while (f && fgets(line, sizeof(line), f)) {
                const char *at = strstr(line, "): adopted ");
                unsigned long n;

                if (at && sscanf(at, "): adopted %lu of", &n) == 1) {
                        (*requests)++;
                        *segments += n;
                }
                if (sscanf(line, "%*s %*s gpupoold info: took over %lu named object", &n) == 1)
                        *objects += n;
        }
        if (f)
                fclose(f);
}

static void daemon_alive(void) {
        int status;

        if (waitpid(daemon_pid, &status, WNOHANG) == daemon_pid) {
                daemon_pid = -1;
                fail("gpupoold died (%s %d)", WIFSIGNALED(status) ? "signal" : "exit status",
                     WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        }
}

/* One request on a fresh control connection of the parent's. */
static Gpupool__Envelope *ask(Gpupool__Envelope *req, Gpupool__Envelope__BodyCase want, int *ret_err, char *why,
                              size_t why_size) {
        static struct gp_conn conn;
        Gpupool__Hello hello = GPUPOOL__HELLO__INIT;
        Gpupool__Envelope *rep = NULL;
        int r;

        hello.name = "stress-parent";
        r = gp_conn_open(&conn, sock_path, &hello, NULL);
        if (r == 0)
                r = gp_conn_call(&conn, req, want, &rep, NULL);
        if (r < 0)
                snprintf(why, why_size, "%s", conn.error);
        gp_conn_close(&conn);
        *ret_err = r;
        return rep;
}

struct totals {
        uint64_t reserved, in_use, cached, total;
        size_t clients;
};

static int get_status(struct totals *t, char *why, size_t why_size) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__StatusRequest sr = GPUPOOL__STATUS_REQUEST__INIT;
        const Gpupool__DeviceStatus *d;
        int r;

        req.body_case = GPUPOOL__ENVELOPE__BODY_STATUS_REQUEST;
        req.status_request = &sr;
        rep = ask(&req, GPUPOOL__ENVELOPE__BODY_STATUS_REPLY, &r, why, why_size);
        if (r < 0)
                return r;
        d = rep->status_reply->devices[0];
        *t = (struct totals) { d->reserved_bytes, d->in_use_bytes, d->cached_bytes, d->total_bytes,
                               rep->status_reply->has_clients_total ? rep->status_reply->clients_total :
                                                                      rep->status_reply->n_clients };
        gpupool__envelope__free_unpacked(rep, NULL);
        return 0;
}

static uint64_t checks, checks_earlier, faults_injected;   /* checks: the daemon's now; earlier: its predecessors' */
static int daemon_kills;

/* The daemon checks itself; the parent checks what status shows. */
static void check(const char *when) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__CheckRequest cr = GPUPOOL__CHECK_REQUEST__INIT;
        struct totals t;
        char why[GP_MAX_ERROR_BYTES];
        int r;

        daemon_alive();
        req.body_case = GPUPOOL__ENVELOPE__BODY_CHECK;
        req.check = &cr;
        rep = ask(&req, GPUPOOL__ENVELOPE__BODY_CHECK_REPLY, &r, why, sizeof(why));
        if (r < 0)
                fail("%s: the daemon's check: %s", when, why);
        checks = rep->check_reply->checks_total;
        faults_injected = rep->check_reply->faults_injected;
        gpupool__envelope__free_unpacked(rep, NULL);
        if (get_status(&t, why, sizeof(why)) < 0)
                fail("%s: status: %s", when, why);
        if (t.reserved > t.total || t.in_use + t.cached > t.reserved)
                fail("%s: reserved %llu, in use %llu, cached %llu of %llu", when, (unsigned long long) t.reserved,
                     (unsigned long long) t.in_use, (unsigned long long) t.cached, (unsigned long long) t.total);
}

/*
 * After the run: every named object the workers (and squatters) left is unpublished, as the
 * operator, naming its publisher (nobody has one attached now, so each goes at once). Returns
 * how many there were (one page: the daemon holds at most 256, short names).
 */
static unsigned long unpublish_all(void) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__ObjectsRequest orq = GPUPOOL__OBJECTS_REQUEST__INIT;
        char why[GP_MAX_ERROR_BYTES];
        unsigned long n;
        int r;

        req.body_case = GPUPOOL__ENVELOPE__BODY_OBJECTS;
        req.objects = &orq;
        rep = ask(&req, GPUPOOL__ENVELOPE__BODY_OBJECTS_REPLY, &r, why, sizeof(why));
        if (r < 0)
                fail("objects: %s", why);
        n = rep->objects_reply->n_objects;
        for (size_t i = 0; i < n; i++) {
                Gpupool__Envelope ureq = GPUPOOL__ENVELOPE__INIT, *urep;
                Gpupool__UnpublishRequest ur = GPUPOOL__UNPUBLISH_REQUEST__INIT;
                const Gpupool__ObjectStatus *o = rep->objects_reply->objects[i];

                if (o->attachments)
                        fail("object %s has %u attachments after every worker exited", o->name, o->attachments);
                ur.name = o->name;
                ur.has_publisher_uid = 1;       /* names are each publisher uid's: the squatters' too */
                ur.publisher_uid = o->uid;
                ureq.body_case = GPUPOOL__ENVELOPE__BODY_UNPUBLISH;
                ureq.unpublish = &ur;
                urep = ask(&ureq, GPUPOOL__ENVELOPE__BODY_UNPUBLISH_REPLY, &r, why, sizeof(why));
                if (r < 0)
                        fail("unpublish %s: %s", o->name, why);
                gpupool__envelope__free_unpacked(urep, NULL);
        }
        gpupool__envelope__free_unpacked(rep, NULL);
        return n;
}

/* ---- workers ---- */

static void fill(uint8_t *p, size_t n, uint32_t tag) {
        for (size_t i = 0; i + 4 <= n; i += 4)
                memcpy(p + i, &(uint32_t) { tag ^ (uint32_t) i }, 4);
}

static int intact(const uint8_t *p, size_t n, uint32_t tag) {
        for (size_t i = 0; i + 4 <= n; i += 4) {
                uint32_t v;

                memcpy(&v, p + i, 4);
                if (v != (tag ^ (uint32_t) i))
                        return 0;
        }
        return 1;
}

/* Whether a connection failed only because no daemon listens now (it was killed, the next is starting). */
static bool no_daemon_now(int r) {
        return daemon_kills && (r == -ECONNREFUSED || r == -ENOENT || r == -ECONNRESET || r == -EPIPE);
}

/* The tag a named object's bytes are filled with: its name's (FNV-1a), so that any attacher can check them. */
static uint32_t name_tag(const char *name) {
        uint32_t h = 2166136261u;

        for (; *name; name++)
                h = (h ^ (uint8_t) *name) * 16777619u;
        return h;
}

/* Workers started at once (-c): the object names an attacher tries. */
static int worker_count;

/* What the workers did with named objects, on a page they share: published, attached and checked. */
static unsigned long *object_counts;

/* Detaches the object at p: unmapped whatever the daemon says; only a failure it must not have is false. */
static bool detached(gpupool_client *c, int index, const void *p) {
        char msg[GP_MAX_ERROR_BYTES];
        int r = gpupool_detach(c, p);

        if (r == 0 || r == -EIO || no_daemon_now(r))
                return true;
        gpupool_last_error(c, msg, sizeof(msg));
        fprintf(stderr, "stress: worker %d: detach: %s: %s\n", index, gpupool_strerror(r), msg);
        return false;
}

/*
 * Named objects, on whole segments: publishes a new block of over 10 MiB as obj-INDEX-K
 * (unpublishing the last one of that name first), or attaches a random worker's object and
 * checks every byte against its name. Returns 0, or an exit status for what must not happen.
 */
static int object_op(gpupool_client *c, int index, unsigned *seed) {
        char name[40], msg[GP_MAX_ERROR_BYTES];
        const void *q;
        uint8_t *block;
        size_t size, qs;
        int r;

        if (rand_r(seed) % 2) {
                snprintf(name, sizeof(name), "obj-%d-%u", index, rand_r(seed) % 2);
                (void) gpupool_unpublish(c, name);      /* -ENOENT where there is none */
                size = 10 * MiB + 1 + (size_t) rand_r(seed) % (2 * MiB);
                r = gpupool_alloc(c, 0, size, (void **) &block);
                if (r == -ENOMEM || r == -EDQUOT || r == -EIO || no_daemon_now(r))
                        return 0;
                if (r < 0)
                        return 14;
                fill(block, size, name_tag(name));
                r = gpupool_publish(c, name, block, size);
                if (r == 0) {
                        __atomic_add_fetch(&object_counts[0], 1, __ATOMIC_RELAXED);
                        /* The object's now, attached here read-only until detached: every byte as written. */
                        if (!intact(block, size, name_tag(name)))
                                return 16;
                        return detached(c, index, block) ? 0 : 17;
                }
                (void) gpupool_free(c, block);
                /*
                 * The node's 256 objects, no daemon for a moment, an injected fault, or (after a
                 * restart) a block in memory the new daemon did not adopt: allowed.
                 */
                /* -EROFS: the daemon was killed between its seal of the segment and its answer. */
                if (r == -EDQUOT || r == -EIO || no_daemon_now(r) || (daemon_kills && (r == -EINVAL || r == -EROFS)))
                        return 0;
                gpupool_last_error(c, msg, sizeof(msg));
                fprintf(stderr, "stress: worker %d: publish %s: %s: %s\n", index, name, gpupool_strerror(r), msg);
                return 18;
        }
        snprintf(name, sizeof(name), "obj-%d-%u", (int) (rand_r(seed) % (unsigned) worker_count), rand_r(seed) % 2);
        r = gpupool_attach(c, name, &q, &qs);
        if (r == -ENOENT || r == -EIO || no_daemon_now(r))
                return 0;
        if (r < 0) {
                gpupool_last_error(c, msg, sizeof(msg));
                fprintf(stderr, "stress: worker %d: attach %s: %s: %s\n", index, name, gpupool_strerror(r), msg);
                return 19;
        }
        if (!intact(q, qs, name_tag(name)))
                return 20;      /* a published object changed */
        __atomic_add_fetch(&object_counts[1], 1, __ATOMIC_RELAXED);
        return detached(c, index, q) ? 0 : 21;
}

/* Connects, trying again while no daemon listens (until the deadline). */
static int connect_retrying(const char *name, double deadline, gpupool_client **c) {
        int r;

        while ((r = gpupool_connect(sock_path, name, c)) < 0 && no_daemon_now(r) && now_s() < deadline)
                nap_ms(20);
        return r;
}

static int worker(int index, double deadline) {
        enum { LIVE = 32 };
        struct { uint8_t *p; size_t size; uint32_t tag; } live[LIVE] = { 0 };
        unsigned seed = (unsigned) getpid() * 2654435761u;
        gpupool_client *c = NULL;
        char name[40];
        uint32_t tag = (uint32_t) getpid() << 12;
        bool gone = false;      /* the daemon was, at the latest lease: the process waits to be adopted */

        snprintf(name, sizeof(name), "worker-%s-%d", index % 2 ? "odd" : "even", index);
        /*
         * One in four keeps its empty segments until asked (reclaims), one in four gives them
         * back soon (leases and returns all along), the rest as by default.
         */
        if (index % 4 == 0)
                setenv("GPUPOOL_IDLE_RETURN", "0", 1);
        if (index % 4 == 3)
                setenv("GPUPOOL_IDLE_RETURN", "200ms", 1);
        if (index % 3 == 1)
                setenv("GPUPOOL_SEGMENTS", "grow", 1);
        if (connect_retrying(name, deadline, &c) < 0)
                return now_s() < deadline ? 10 : 0;
        while (now_s() < deadline) {
                int s = (int) (rand_r(&seed) % LIVE), r, op = (int) (rand_r(&seed) % 100);

                /* Without a daemon, as an application would: it goes on with its blocks, and nothing else. */
                if (gone && op < 3)
                        continue;

                if (op == 1 || op == 2) {
                        /* Now and then: a status or a flush of the cache, as an operator's tool would. */
                        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
                        Gpupool__StatusRequest sr = GPUPOOL__STATUS_REQUEST__INIT;
                        Gpupool__FlushRequest fr = GPUPOOL__FLUSH_REQUEST__INIT;
                        Gpupool__Hello hello = GPUPOOL__HELLO__INIT;
                        struct gp_conn *ctl = calloc(1, sizeof(*ctl));

                        hello.name = "worker-tool";
                        if (op == 1) {
                                req.body_case = GPUPOOL__ENVELOPE__BODY_STATUS_REQUEST;
                                req.status_request = &sr;
                        } else {
                                req.body_case = GPUPOOL__ENVELOPE__BODY_FLUSH;
                                req.flush = &fr;
                        }
                        if (!ctl || (r = gp_conn_open(ctl, sock_path, &hello, NULL)) < 0 ||
                            (r = gp_conn_call(ctl, &req, op == 1 ? GPUPOOL__ENVELOPE__BODY_STATUS_REPLY :
                                                                   GPUPOOL__ENVELOPE__BODY_FLUSH_REPLY, &rep, NULL)) < 0) {
                                /* Over --max-clients is allowed, and no daemon for a moment; anything else is not. */
                                if (!ctl || (strstr(ctl->error, "--max-clients") == NULL && !no_daemon_now(r)))
                                        return 15;
                        } else {
                                gpupool__envelope__free_unpacked(rep, NULL);
                        }
                        if (ctl)
                                gp_conn_close(ctl);
                        free(ctl);
                        continue;
                }
                if (op == 0) {
                        /*
                         * Now and then: leave, with blocks held, and come back; unless the daemon is
                         * gone (the trim says so): then the process waits to be adopted instead.
                         */
                        if (daemon_kills && gpupool_trim(c) == -ECONNRESET) {
                                gone = true;
                                continue;
                        }
                        gpupool_disconnect(c);
                        memset(live, 0, sizeof(live));
                        if (connect_retrying(name, deadline, &c) < 0)
                                return now_s() < deadline ? 11 : 0;
                        continue;
                }
                if ((op == 3 || op == 4) && index % 3 != 1 && !gone) {
                        /* Now and then, with whole segments: publish a large block, or attach another's object. */
                        if ((r = object_op(c, index, &seed)) != 0)
                                return r;
                        continue;
                }
                if (live[s].p) {
                        if (!intact(live[s].p, live[s].size, live[s].tag))
                                return 12;      /* someone wrote into our block */
                        r = gpupool_free(c, live[s].p);
                        if (r < 0) {
                                fprintf(stderr, "stress: worker %d: free: %s\n", index, gpupool_strerror(r));
                                return 13;
                        }
                        live[s].p = NULL;
                        continue;
                }
                live[s].size = 1 + (size_t) rand_r(&seed) % (rand_r(&seed) % 8 == 0 ? 12 * MiB : 256 * 1024);
                r = gpupool_alloc(c, 0, live[s].size, (void **) &live[s].p);
                /* Full, over a limit, an injected fault, or no daemon for a moment (it reconnects by itself): all allowed. */
                gone = r == -ECONNRESET && daemon_kills;
                if (gone)
                        nap_ms(1);      /* a lease fails at once: no need to spin */
                if (r == -ENOMEM || r == -EDQUOT || r == -EIO || gone) {
                        if (getenv("STRESS_VERBOSE")) {
                                char msg[GP_MAX_ERROR_BYTES];

                                gpupool_last_error(c, msg, sizeof(msg));
                                fprintf(stderr, "stress: worker %d: alloc of %zu: %s: %s\n", index, live[s].size,
                                        gpupool_strerror(r), msg);
                        }
                        live[s].p = NULL;
                        continue;
                }
                if (r < 0) {
                        char msg[GP_MAX_ERROR_BYTES];

                        gpupool_last_error(c, msg, sizeof(msg));
                        fprintf(stderr, "stress: worker %d: alloc of %zu: %s: %s\n", index, live[s].size, gpupool_strerror(r), msg);
                        return 14;
                }
                live[s].tag = ++tag;
                fill(live[s].p, live[s].size, live[s].tag);
        }
        for (int s = 0; s < LIVE; s++)
                if (live[s].p && !intact(live[s].p, live[s].size, live[s].tag))
                        return 12;
        gpupool_disconnect(c);
        return 0;
}

/* ---- hostile peers ---- */

/* Sends requests and never reads a reply, then lingers. */
static int deaf_peer(void) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
        Gpupool__StatusRequest sr = GPUPOOL__STATUS_REQUEST__INIT;
        Gpupool__Hello hello = GPUPOOL__HELLO__INIT;
        uint8_t buf[GP_MAX_REQUEST_BYTES];
        int s, n;

        if (gp_wire_connect(sock_path, &s) < 0)
                return 0;
        hello.name = "deaf";
        env.version = GP_PROTOCOL_VERSION;
        env.id = 1;
        env.body_case = GPUPOOL__ENVELOPE__BODY_HELLO;
        env.hello = &hello;
        n = gp_wire_pack(&env, buf, sizeof(buf));
        (void) gp_wire_send_packet(s, buf, (size_t) n, -1);
        env.body_case = GPUPOOL__ENVELOPE__BODY_STATUS_REQUEST;
        env.status_request = &sr;
        for (int i = 0; i < 2000; i++) {
                env.id = (uint64_t) i + 2;
                n = gp_wire_pack(&env, buf, sizeof(buf));
                if (send(s, buf, (size_t) n, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
                        break;          /* the daemon stopped reading us: as it should */
        }
        nap_ms(500);
        return 0;
}

/* Connects and says nothing. */
static int silent_peer(void) {
        int s;

        if (gp_wire_connect(sock_path, &s) == 0)
                nap_ms(700);
        return 0;
}

/* Sends random packets, some with a descriptor. */
static int garbage_peer(unsigned seed) {
        uint8_t buf[600];
        int s;

        if (gp_wire_connect(sock_path, &s) < 0)
                return 0;
        for (int i = 0; i < 50; i++) {
                size_t n = 1 + rand_r(&seed) % sizeof(buf);

                for (size_t k = 0; k < n; k++)
                        buf[k] = (uint8_t) rand_r(&seed);
                if (gp_wire_send_packet(s, buf, n, rand_r(&seed) % 5 == 0 ? 0 : -1) < 0)
                        break;          /* disconnected, as it should be */
        }
        return 0;
}

/*
 * Connects as name and leases a segment for 1 MiB, reporting it all held free (a claim), and
 * opens its control channel; the connection and the channel into c and *ret_control. Returns
 * 0, or -1 when the daemon is not there or refuses (it may be restarting: no failure).
 */
static int leasing_peer(const char *name, struct gp_conn *c, int *ret_control) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT, *rep = NULL;
        Gpupool__LeaseRequest lr = GPUPOOL__LEASE_REQUEST__INIT;
        Gpupool__Hello hello = GPUPOOL__HELLO__INIT;
        Gpupool__Usage u = GPUPOOL__USAGE__INIT, *up = &u;
        struct gp_conn control = { .sock = -1 };
        uint64_t id;
        int fd = -1;

        *c = (struct gp_conn) { .sock = -1 };
        hello.name = (char *) name;
        if (gp_conn_open(c, sock_path, &hello, &rep) < 0)
                return -1;
        id = rep->hello_reply->client_id;
        gpupool__envelope__free_unpacked(rep, NULL);
        lr.size = 1 << 20;
        env.body_case = GPUPOOL__ENVELOPE__BODY_LEASE;
        env.lease = &lr;
        if (gp_conn_call(c, &env, GPUPOOL__ENVELOPE__BODY_LEASE_REPLY, &rep, &fd) < 0)
                return -1;
        /* It says it holds all of it free, whatever it will give back. */
        u.held_free_bytes = rep->lease_reply->segment_size;
        gpupool__envelope__free_unpacked(rep, NULL);
        if (fd >= 0)
                close(fd);
        env = (Gpupool__Envelope) GPUPOOL__ENVELOPE__INIT;
        env.body_case = GPUPOOL__ENVELOPE__BODY_STATUS_REQUEST;
        {
                Gpupool__StatusRequest sr = GPUPOOL__STATUS_REQUEST__INIT;

                env.status_request = &sr;
                env.n_usage = 1;
                env.usage = &up;
                if (gp_conn_call(c, &env, GPUPOOL__ENVELOPE__BODY_STATUS_REPLY, &rep, NULL) < 0)
                        return -1;
                gpupool__envelope__free_unpacked(rep, NULL);
        }
        hello.has_control_for = 1;
        hello.control_for = id;
        if (gp_conn_open(&control, sock_path, &hello, NULL) < 0)
                return -1;
        *ret_control = control.sock;
        return 0;
}

/* Claims its segment free and answers every request for memory back with nothing, for a while. */
static int liar_peer(void) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
        Gpupool__ReclaimReply answer = GPUPOOL__RECLAIM_REPLY__INIT;
        uint8_t buf[GP_MAX_REQUEST_BYTES];
        struct gp_conn c;
        double t0 = now_s();
        int control, n;

        if (leasing_peer("liar", &c, &control) < 0)
                return 0;
        env.version = GP_PROTOCOL_VERSION;
        env.body_case = GPUPOOL__ENVELOPE__BODY_RECLAIM_REPLY;
        env.reclaim_reply = &answer;
        n = gp_wire_pack(&env, buf, sizeof(buf));
        while (now_s() - t0 < 0.7) {
                uint8_t in[GP_MAX_REPLY_BYTES];

                if (recv(control, in, sizeof(in), MSG_DONTWAIT) > 0)
                        (void) send(control, buf, (size_t) n, MSG_NOSIGNAL);
                nap_ms(5);
        }
        return 0;
}

/* Claims its segment free and never reads its control channel. */
static int silent_control_peer(void) {
        struct gp_conn c;
        int control;

        if (leasing_peer("silent-control", &c, &control) == 0)
                nap_ms(700);
        return 0;
}

/* Connects, says hello with a 63-byte name, leases and closes, over and over: sessions left exiting. */
static int churn_peer(void) {
        for (int i = 0; i < 40; i++) {
                struct gp_conn c;
                int control;

                if (leasing_peer("a-client-name-of-sixty-three-bytes-the-longest-that-hello-takes", &c, &control) < 0)
                        break;          /* refused past max_clients_per_uid, or no daemon: as it should be */
                close(control);
                gp_conn_close(&c);
        }
        nap_ms(700);
        return 0;
}

/* Hands over for adoption a memfd sealed against writing, which the daemon must refuse. */
static int sealed_adopter_peer(void) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT, *rep = NULL;
        Gpupool__AdoptRequest ar = GPUPOOL__ADOPT_REQUEST__INIT;
        Gpupool__Hello hello = GPUPOOL__HELLO__INIT;
        struct gp_conn c = { .sock = -1 };
        uint64_t size = 2 << 20;
        int fd = memfd_create("sealed", MFD_CLOEXEC | MFD_ALLOW_SEALING), r;

        if (fd < 0 || ftruncate(fd, (off_t) size) < 0 ||
            fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0)
                return 1;
        hello.name = "sealed-adopter";
        if (gp_conn_open(&c, sock_path, &hello, NULL) < 0)
                return 0;
        ar.sizes = &size;
        ar.n_sizes = 1;
        env.body_case = GPUPOOL__ENVELOPE__BODY_ADOPT;
        env.adopt = &ar;
        r = gp_conn_call_passing(&c, &env, &fd, 1, GPUPOOL__ENVELOPE__BODY_ADOPT_REPLY, &rep);
        if (r == 0) {
                gpupool__envelope__free_unpacked(rep, NULL);
                fprintf(stderr, "stress: a write-sealed memfd was adopted\n");
                return 1;       /* adopted: the daemon took memory nobody can use */
        }
        gp_conn_close(&c);
        close(fd);
        return 0;
}

/*
 * Pins a page of a block of its own (vmsplice into a pipe it never reads) and asks to publish
 * it, three times: each must be refused (the kernel will not seal pinned pages), the daemon's
 * loop never waiting for the pins meanwhile.
 */
static int pinned_publisher_peer(void) {
        gpupool_client *c;
        unsigned char *p;
        int pipefd[2], r = 0;

        if (gpupool_connect(sock_path, "pinned-publisher", &c) < 0)
                return 0;       /* refused (a limit) or no daemon: as it may be */
        if (gpupool_alloc(c, 0, 12 * MiB, (void **) &p) < 0 || pipe(pipefd) < 0) {
                gpupool_disconnect(c);
                return 0;
        }
        memset(p, 0x5a, 12 * MiB);
        if (vmsplice(pipefd[1], &(struct iovec) { p, 4096 }, 1, 0) != 4096)
                r = 1;
        for (int i = 0; r == 0 && i < 3; i++)
                if (gpupool_publish(c, "pinned-object", p, 12 * MiB) == 0) {
                        fprintf(stderr, "stress: a block with pinned pages was published\n");
                        r = 1;
                }
        gpupool_disconnect(c);
        return r;
}

/*
 * As another uid (65534, where the run is root's), publishes the workers' object names first,
 * for every client, with bytes of its own: the workers must still attach exactly theirs (names
 * are each publisher uid's), which they check byte by byte against the name.
 */
static int object_squatter_peer(void) {
        gpupool_client *c;
        char name[40];
        uint8_t *block;

        if (geteuid() == 0 && (setgid(65534) < 0 || setuid(65534) < 0))
                return 1;
        if (gpupool_connect(sock_path, "object-squatter", &c) < 0)
                return 0;       /* refused (a limit) or no daemon: as it may be */
        for (int i = 0; i < 4; i++) {
                snprintf(name, sizeof(name), "obj-%d-%d", i, i % 2);
                if (gpupool_alloc(c, 0, 11 * MiB, (void **) &block) < 0)
                        break;
                memset(block, 0xee, 11 * MiB);
                if (gpupool_publish_to(c, name, block, 11 * MiB, "*") < 0)
                        (void) gpupool_free(c, block);
        }
        nap_ms(300);
        /* Its objects outlive it until it unpublishes them (none attached them by name). */
        for (int i = 0; i < 4; i++) {
                snprintf(name, sizeof(name), "obj-%d-%d", i, i % 2);
                (void) gpupool_unpublish(c, name);
        }
        gpupool_disconnect(c);
        return 0;
}

/* ---- the run ---- */

static long rss_kib(pid_t pid) {
        char path[64], line[256];
        long kib = -1;
        FILE *f;

        snprintf(path, sizeof(path), "/proc/%d/status", (int) pid);
        f = fopen(path, "r");
        if (!f)
                return -1;
        while (fgets(line, sizeof(line), f))
                if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
                        break;
        fclose(f);
        return kib;
}

static pid_t spawn_worker(int index, double deadline) {
        pid_t pid = fork();

        if (pid == 0)
                _exit(worker(index, deadline));
        return pid;
}

static pid_t spawn_fn(int (*fn)(void)) {
        pid_t pid = fork();

        if (pid == 0)
                _exit(fn());
        return pid;
}

int main(int argc, char **argv) {
        static const struct option opts[] = {
                { "build", required_argument, NULL, 'b' }, { "clients", required_argument, NULL, 'c' },
                { "seconds", required_argument, NULL, 's' }, { "max-rss", required_argument, NULL, 'r' },
                { "faults", required_argument, NULL, 'f' }, { "daemon-kills", required_argument, NULL, 'k' }, { 0 },
        };
        const char *build = "build", *faults = "create=0.05,export=0.02,zero=0.05,seed=1";
        int clients = 32, o;
        double seconds = 30, deadline, next_kill, next_hostile, next_check, next_daemon_kill, t0;
        long max_rss_mib = 64, rss;
        pid_t pids[MAX_CLIENTS];
        static pid_t hostile_pids[8192];
        unsigned long kinds[9] = { 0 };         /* hostile peers of each kind, in the switch's order */
        size_t nhostile = 0;
        unsigned seed = 12345;
        unsigned long kills = 0, spawned = 0, hostile = 0, restarts = 0, adoptions, adopted, taken_over, objects = 0;
        struct totals t;
        char why[GP_MAX_ERROR_BYTES];
        int status;

        while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
                switch (o) {
                case 'b': build = optarg; break;
                case 'c': clients = atoi(optarg); break;
                case 's': seconds = atof(optarg); break;
                case 'r': max_rss_mib = atol(optarg); break;
                case 'f': faults = optarg; break;
                case 'k': daemon_kills = atoi(optarg); break;
                default:
                        fprintf(stderr, "usage: stress --build DIR [--clients N] [--seconds S] [--max-rss MiB] [--faults SPEC] "
                                        "[--daemon-kills N]\n");
                        return 2;
                }
        }
        if (clients < 1 || clients > MAX_CLIENTS || seconds <= 0 || daemon_kills < 0 || daemon_kills > 1000) {
                fprintf(stderr, "stress: --clients is 1 to %d, --seconds positive, --daemon-kills 0 to 1000\n", MAX_CLIENTS);
                return 2;
        }
        signal(SIGPIPE, SIG_IGN);
        worker_count = clients;
        object_counts = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (object_counts == MAP_FAILED)
                fail("mmap: %s", strerror(errno));
        start_daemon(build, faults);
        t0 = now_s();
        deadline = t0 + seconds;
        for (int i = 0; i < clients; i++, spawned++)
                pids[i] = spawn_worker(i, deadline);
        next_kill = next_hostile = next_check = t0;
        /* The daemon's kills spread over the run, the last well before its end. */
        next_daemon_kill = daemon_kills ? t0 + seconds / (daemon_kills + 1) : deadline;
        while (now_s() < deadline) {
                pid_t done;

                /* Workers that ended on their own: any exit but 0 is a failure they saw. */
                daemon_alive();
                for (int i = 0; i < clients; i++) {
                        done = waitpid(pids[i], &status, WNOHANG);
                        if (done != pids[i])
                                continue;
                        if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
                                fail("worker %d (pid %d) failed with %d (12: its data was damaged)", i, (int) done,
                                     WEXITSTATUS(status));
                        if (now_s() < deadline) {
                                pids[i] = spawn_worker(i, deadline);
                                spawned++;
                        }
                }
                if (now_s() >= next_kill) {
                        int i = (int) (rand_r(&seed) % (unsigned) clients);

                        if (kill(pids[i], SIGKILL) == 0) {
                                waitpid(pids[i], NULL, 0);
                                kills++;
                                pids[i] = spawn_worker(i, deadline);
                                spawned++;
                        }
                        next_kill = now_s() + 0.1 + (rand_r(&seed) % 300) / 1000.0;
                }
                if (now_s() >= next_hostile && nhostile < sizeof(hostile_pids) / sizeof(hostile_pids[0])) {
                        unsigned g = rand_r(&seed);
                        pid_t p;

                        kinds[g % 9]++;
                        switch (g % 9) {
                        case 0: p = spawn_fn(deaf_peer); break;
                        case 1: p = spawn_fn(silent_peer); break;
                        case 2: p = spawn_fn(liar_peer); break;
                        case 3: p = spawn_fn(silent_control_peer); break;
                        case 4: p = spawn_fn(churn_peer); break;
                        case 5: p = spawn_fn(sealed_adopter_peer); break;
                        case 6: p = spawn_fn(pinned_publisher_peer); break;
                        case 7: p = spawn_fn(object_squatter_peer); break;
                        default:
                                p = fork();
                                if (p == 0)
                                        _exit(garbage_peer(g));
                                break;
                        }
                        hostile_pids[nhostile++] = p;
                        hostile++;
                        next_hostile = now_s() + 0.25;
                }
                if (now_s() >= next_check) {
                        check("during the run");
                        next_check = now_s() + 0.5;
                }
                if (now_s() >= next_daemon_kill && restarts < (unsigned long) daemon_kills) {
                        check("before a restart");
                        checks_earlier += checks;
                        restart_daemon(&seed);
                        restarts++;
                        check("after a restart");
                        next_daemon_kill = t0 + seconds * (double) (restarts + 1) / (daemon_kills + 1);
                }
                nap_ms(10);
        }
        /* Everyone leaves: workers at their deadline, hostile peers after their naps. */
        for (int i = 0; i < clients; i++)
                if (waitpid(pids[i], &status, 0) == pids[i] && WIFEXITED(status) && WEXITSTATUS(status) != 0)
                        fail("worker %d failed with %d at the end", i, WEXITSTATUS(status));
        for (size_t i = 0; i < nhostile; i++)
                if (waitpid(hostile_pids[i], &status, 0) == hostile_pids[i] && WIFEXITED(status) && WEXITSTATUS(status))
                        fail("a hostile peer saw the daemon do what it must not (exit %d)", WEXITSTATUS(status));
        {
                double t1 = now_s();

                /* Every session gone (an exited process's detaches its objects), then the objects, then their memory. */
                for (int pass = 0; pass < 2; pass++) {
                        for (;;) {
                                if (get_status(&t, why, sizeof(why)) < 0)
                                        fail("status after the run: %s", why);
                                if ((!t.clients && (!pass || (!t.in_use && t.reserved == t.cached))) || now_s() - t1 > 10)
                                        break;
                                nap_ms(50);
                        }
                        if (!pass)
                                objects = unpublish_all();
                }
        }
        check("after the run");
        if (t.clients || t.in_use || t.reserved != t.cached)
                fail("after every client left: %zu clients, %llu bytes in use, %llu reserved, %llu cached", t.clients,
                     (unsigned long long) t.in_use, (unsigned long long) t.reserved, (unsigned long long) t.cached);
        {
                Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
                Gpupool__FlushRequest fr = GPUPOOL__FLUSH_REQUEST__INIT;
                int r;

                req.body_case = GPUPOOL__ENVELOPE__BODY_FLUSH;
                req.flush = &fr;
                rep = ask(&req, GPUPOOL__ENVELOPE__BODY_FLUSH_REPLY, &r, why, sizeof(why));
                if (r < 0)
                        fail("flush: %s", why);
                gpupool__envelope__free_unpacked(rep, NULL);
        }
        if (get_status(&t, why, sizeof(why)) < 0 || t.reserved != 0)
                fail("after a flush the daemon still holds %llu bytes", (unsigned long long) t.reserved);
        rss = rss_kib(daemon_pid);
        if (rss < 0 || rss > max_rss_mib * 1024)
                fail("the daemon's RSS is %ld KiB, over the bound of %ld MiB", rss, max_rss_mib);
        kill(daemon_pid, SIGTERM);
        if (waitpid(daemon_pid, &status, 0) != daemon_pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
                fail("gpupoold did not stop cleanly");
        daemon_pid = -1;
        count_adoptions(&adoptions, &adopted, &taken_over);
        if (restarts && !adoptions)
                fail("the daemon was killed %lu times and its successors adopted nothing", restarts);
        /* Every object unpublished took its descriptors out of the store: nothing is kept for nobody. */
        if (fdstore_count(store))
                fail("systemd's store still holds %u descriptors after every object was unpublished", fdstore_count(store));
        fdstore_free(store);
        printf("stress: OK: %d clients x %.0f s, %lu worker processes, %lu killed with SIGKILL, %lu hostile peers "
               "(%lu deaf, %lu silent, %lu liars, %lu silent control channels, %lu churning, %lu write-sealed adoptions, "
               "%lu pinned publishers, %lu object squatters, %lu garbage), %llu faults injected (the last daemon's), over %llu invariant checks, daemon killed %lu times "
               "and its successors adopted %lu segments in %lu requests and took over %lu named objects from systemd's store, "
               "%lu named objects published and %lu attached and checked (%lu left, unpublished at the end), 0 bytes lost, "
               "daemon RSS %ld KiB (bound %ld MiB)\n",
               clients, seconds, spawned, kills, hostile, kinds[0], kinds[1], kinds[2], kinds[3], kinds[4], kinds[5],
               kinds[6], kinds[7], kinds[8], (unsigned long long) faults_injected,
               (unsigned long long) (checks_earlier + checks),
               restarts, adopted, adoptions, taken_over, object_counts[0], object_counts[1], objects, rss, max_rss_mib);
        unlink(conf_path);
        unlink(log_path);
        rmdir(dir);
        return 0;
}
