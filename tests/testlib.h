/*
 * testlib.h: helpers for the integration suites: a real gpupoold on a socket in a private
 * temp dir, the real gpupoolctl, and raw protocol access for hostile clients.
 */
#ifndef GP_TESTLIB_H
#define GP_TESTLIB_H

#include <jansson.h>
#include <stdbool.h>
#include <sys/types.h>

#include "gpupool.h"
#include "wire.h"

struct testd {
        pid_t pid;
        char dir[96];
        char sock[128];
        char log[128];
        char path[256];
        char wrapper[256];
        char *argv[40];         /* points into the above and at the caller's strings */
        int stderr_fd;          /* the daemon's stderr when >= 0 (testd_start_stderr), else the log file */
        struct fdstore *store;  /* systemd's descriptor store, played by the test; set before testd_relaunch() */
        char cgroup_dir[512];   /* testd_start_in_pod(): the cgroup the daemon runs in, a namespace of its own rooted there */
        char pod_uid[40];       /* and its $GPUPOOL_POD_UID ("": unset) */
        unsigned run_as;        /* testd_start_as(): the uid (and gid) the daemon runs as; 0: the test's own */
};

/* systemd's descriptor store, played by the tests (tests/fdstore.h). */
#include "fdstore.h"

/*
 * Says that test did not run, and why (not root, no cgroup v2 hierarchy, no FUSE): written to
 * the runner's list ($GPUPOOL_SKIP_LOG), whose summary lists them and says how many did not
 * run. The test then returns: Check counts it passed, and the summary says otherwise.
 * TEST_SKIP() names the calling test.
 */
void test_skipped(const char *test, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define TEST_SKIP(...) test_skipped(__func__, __VA_ARGS__)

/*
 * The runner's side: skips_begin() makes the list and sets $GPUPOOL_SKIP_LOG for the tests
 * (their forked children inherit it); skips_report() prints how many tests were skipped and
 * why, and removes the list. Returns how many.
 */
void skips_begin(void);
unsigned skips_report(void);

/* $GPUPOOL_BUILD_DIR, where the binaries under test are, else "build". */
const char *build_dir(void);

/*
 * Where a test makes its files: the run's own directory ($GPUPOOL_TEST_TMP, made by the runner,
 * which removes it after the last suite whatever failed), else /tmp. test_mkdtemp() makes a
 * directory gpupool-TAG-XXXXXX there into buf; test_mkdtemp_shm() the same under the run's
 * directory on /dev/shm ($GPUPOOL_TEST_SHM), false where there is none.
 */
const char *test_tmp(void);

/*
 * Whether the suites run under valgrind (make valgrind sets $GPUPOOL_TEST_VALGRIND), where a
 * few checks cannot hold: valgrind runs one thread at a time (a loop that must not wait on
 * another thread's work), keeps descriptors of its own at the top of the table, and does not
 * let a process raise its descriptor limit. Those tests are skipped there, saying which.
 */
bool under_valgrind(void);
void test_mkdtemp(char *buf, size_t size, const char *tag);
bool test_mkdtemp_shm(char *buf, size_t size, const char *tag);

/* Seconds on the monotonic clock. */
double now_s(void);
/* The descriptors process pid has open (this process's less the one that lists them). */
int open_fds(pid_t pid);
/* How many of them lead to a file whose path holds target. */
int open_fds_to(pid_t pid, const char *target);

/* Sleeps ms milliseconds. */
void nap_ms(long ms);

/* Runs a shell command, puts its stdout (NUL-terminated, truncated to size) in out, returns its exit status. */
int run_capture(const char *cmd, char *out, size_t size);

/* Reads a text file into buf (NUL-terminated, truncated to size); "" if it cannot be read. Returns buf. */
const char *read_text(const char *path, char *buf, size_t size);

/*
 * Whether the tests run under a tool ($GPUPOOL_DAEMON_WRAPPER: make valgrind, the suites and
 * their daemons), which keeps its own descriptor limit, runs one thread at a time and is tens
 * of times slower: what a test times is scaled or left to the plain and sanitizer runs.
 */
bool under_tool(void);

/*
 * A SOCK_SEQPACKET socket listening at path, close-on-exec, with a backlog of 16: the socket
 * systemd makes from ListenSequentialPacket= (connections queue there until someone accepts).
 */
int listen_seqpacket(const char *path);

/* How many descriptors this process has open numbered floor or more. */
int fds_from(int floor);

/* The same, counted in a child forked now (which exits at once): at most 254. */
int fds_from_in_child(int floor);

/* The size of a process's descriptor table (FDSize in /proc/PID/status), or -1. */
long fd_table_size(pid_t pid);

/* Starts gpupoold (host backend, --check-invariants) with extra arguments (NULL-ended). */
void testd_start(struct testd *d, ...);

/* testd_start() with the daemon's stderr on fd (a pipe, say) instead of the log file. */
void testd_start_stderr(struct testd *d, int fd, ...);

/*
 * testd_start() as an unprivileged DaemonSet's container runs it on cgroup v2: in cgroup
 * cgroup_dir (a directory of the cgroup v2 mount), in a cgroup namespace rooted there, with
 * $GPUPOOL_POD_UID pod_uid (NULL: unset). Needs root.
 */
void testd_start_in_pod(struct testd *d, const char *cgroup_dir, const char *pod_uid, ...);

/* Moves process pid (0: the caller) into cgroup v2 directory dir (its cgroup.procs). Returns 0 or a negative errno. */
int cgroup_join(const char *dir, pid_t pid);

/* Pods as the kubelet's cgroups make them, for the tests: A and B of clients, D the daemon's own. */
#define TEST_POD_A "0c1f2e3d-4b5a-6978-8a9b-acbdcedf0f1e"
#define TEST_POD_B "11111111-2222-3333-4444-555555555555"
#define TEST_POD_D "d0d0d0d0-e1e1-f2f2-a3a3-b4b4b4b4b4b4"

/*
 * Finds the cgroup v2 hierarchy (into mnt) and makes the three pods' cgroups there, in both of
 * the kubelet's layouts; false (test skipped, saying why) without root or cgroup v2.
 */
bool pods_ready(const char *test, char *mnt, size_t size);

/* Removes them. */
void pods_remove(const char *mnt);

/*
 * The cgroup of a pod's container scope under mnt, depth levels deep (4: the scope): the
 * kubelet's systemd driver's naming (/kubepods.slice/kubepods-besteffort.slice/
 * kubepods-besteffort-pod<UID>.slice/cri-containerd-test.scope, the UID's dashes as
 * underscores), or with cgroupfs its cgroupfs driver's (/kubepods/besteffort/pod<UID>/0123456789abcdef).
 */
void pod_cgroup_dir(bool cgroupfs, const char *mnt, const char *uid, int depth, char *buf, size_t size);

/* testd_start() as the systemd unit runs it: as user uid (group uid too), not root. Needs root. */
void testd_start_as(struct testd *d, unsigned uid, ...);
/*
 * As the unit runs it, against what the kernel counts descriptors in flight by: the daemon as
 * uid 65534 without capabilities (CAP_SYS_RESOURCE would exempt it), with a soft RLIMIT_NOFILE
 * of 16,384, a host pool of host_capacity and send_timeout; its directory open to other uids.
 */
void testd_start_unread_bounded(struct testd *d, const char *host_capacity, const char *send_timeout);

/*
 * Waits (up to 10 s) for text to appear in the daemon's log: lines written while it serves go
 * through its writer thread, after the request that caused them. Returns whether it did.
 */
bool testd_log_wait(struct testd *d, const char *text);

/* Kills the daemon with SIGKILL and starts it again on the same socket, with the same arguments. */
void testd_crash_and_restart(struct testd *d);
/* Its two halves: kill -9 (and reap), and a new daemon on the same socket and options. */
void testd_crash(struct testd *d);
void testd_relaunch(struct testd *d);

/* A process that outlives its daemon: its index, and the pipes it says ready on and waits on. */
struct survivor {
        int index;
        int up[2], go[2];               /* ready, to the test; the daemon was killed, from it (a byte) */
};

/*
 * Runs n survivors (fn, with their struct survivor as arg) against d: once each says ready
 * (a byte on up), kills the daemon and lets them go on (a byte on go); once each says it is
 * done without one (survivor_restarted()), starts a new daemon as systemd would and lets them
 * go on again; then checks that each exits 0 (else fails, naming the survivor and its exit
 * status: its step).
 */
void run_survivors(struct testd *d, int n, int (*fn)(struct testd *d, void *arg));
/* In a survivor: says it is done without a daemon, and waits for the new one. False on a broken pipe. */
bool survivor_restarted(struct survivor *w);
/*
 * After survivor_restarted(), in a survivor named "survivor": waits (20 s at most) until its
 * handle c has reconnected and been adopted, which a lease of size bytes succeeding shows, and
 * checks that the new daemon counts exactly what the process maps, at least what it held before
 * (held) and size more. Returns the block leased, or NULL saying why on stderr.
 */
void *survivor_adopted(struct testd *d, const struct survivor *w, gpupool_client *c, const struct gpupool_stats *held,
                       size_t size);

/* Connects to sock with segments of mode ($GPUPOOL_SEGMENTS: grow or whole), nothing given back by itself. */
gpupool_client *connect_segments(const char *sock, const char *name, const char *mode);
/* gpupool_stats(), which must succeed. */
struct gpupool_stats client_stats(gpupool_client *c);
/* Fills each 4 KiB page of a block with a byte of its own, from seed; page_intact() checks each page's ends. */
void page_fill(void *p, size_t size, unsigned seed);
bool page_intact(const void *p, size_t size, unsigned seed);

/* SIGTERM; returns the daemon's exit status (0 after a clean stop), -1 if it was killed. */
int testd_stop(struct testd *d);

/* Whether the daemon is still running. */
bool testd_alive(struct testd *d);

/*
 * A config file in a fresh private directory (mode 0755, for tests that drop to another
 * uid) holding text; returns its path. conf_write() rewrites it (before a reload);
 * conf_remove() removes both.
 */
const char *conf_new(const char *text);
void conf_write(const char *text);
void conf_remove(void);

/* Runs "gpupoolctl --socket S --json CMD" and returns its parsed output (NULL on failure). */
json_t *testd_ctl(struct testd *d, const char *cmd);

/* The daemon's metrics text, through "gpupoolctl metrics", into buf; returns buf. */
const char *testd_metrics(struct testd *d, char *buf, size_t size);
/* The value of one series of a metrics text ("name{labels}" exactly as printed); the series must be there. */
double metrics_value(const char *text, const char *series);
/* Waits (wait_s at most, asking every 10 ms) for a series of the daemon's metrics to reach want; returns whether it did. */
bool testd_metric_becomes(struct testd *d, const char *series, double want, unsigned wait_s);

/* A device's or the first client's field from a status, or -1. */
long long status_device(json_t *status, const char *key);
json_t *status_client_by_pid(json_t *status, pid_t pid);
json_t *status_client_by_name(json_t *status, const char *name);
/* key of the client of pid (0: the one named name) in the daemon's status (a boolean as 0 or 1), or -1 when there is none. */
long long testd_client_field(struct testd *d, pid_t pid, const char *name, const char *key);

/*
 * Waits (up to 10 s) until the status of the client of pid (0: the one named name) has key at
 * want: what a process holds reaches the daemon with its requests and its usage reports (at
 * most a second apart). Returns whether it did.
 */
bool testd_client_becomes(struct testd *d, pid_t pid, const char *name, const char *key, long long want);

/*
 * Copies the file at path into the daemon's directory (mode 0755) and returns the copy's path
 * in buf: for tests that drop to another uid, which may not reach the build directory (a
 * checkout in a private home or a mktemp -d directory).
 */
const char *testd_copy_for_others(struct testd *d, const char *path, char *buf, size_t size);

/* A device's field from a fresh "status", or -1. */
long long testd_device(struct testd *d, unsigned index, const char *key);

/* Waits (up to 10 s, polling status) for a device's field to reach want; returns whether it did. */
bool testd_device_becomes(struct testd *d, unsigned index, const char *key, long long want);

/* Raw protocol: connect, send an envelope, read one reply (NULL when the daemon closed). */
int raw_connect(struct testd *d);
void raw_send(int sock, Gpupool__Envelope *env);
/* raw_send with nfds descriptors riding with env. */
void raw_send_fds(int sock, Gpupool__Envelope *env, const int *fds, size_t nfds);
Gpupool__Envelope *raw_recv(int sock);
/* raw_recv, keeping the descriptor that came with the reply in *ret_fd (-1 when none). */
Gpupool__Envelope *raw_recv_fd(int sock, int *ret_fd);
/* Sends env and returns its reply (which must come). */
Gpupool__Envelope *raw_call(int sock, Gpupool__Envelope *env);
/* raw_call, keeping the descriptor that came with the reply in *ret_fd (-1 when none). */
Gpupool__Envelope *raw_call_fd(int sock, Gpupool__Envelope *env, int *ret_fd);
/* Connect and say hello (as name; or with the caller's Hello, setting its client id). */
int raw_hello(struct testd *d, const char *name);
int raw_hello_with(struct testd *d, Gpupool__Hello *hello, uint64_t *ret_client_id);
/* A LeaseRequest for a block of size bytes on device, and its reply. */
Gpupool__Envelope *raw_lease(int sock, uint32_t device, uint64_t size);
/* raw_lease, keeping the segment's descriptor (host, cuda-vmm) in *ret_fd. */
Gpupool__Envelope *raw_lease_fd(int sock, uint32_t device, uint64_t size, int *ret_fd);
/*
 * A granule lease (granules of size bytes each) on device, and its reply; the descriptors that
 * came with it into fds (room for GP_WIRE_MAX_FDS), how many into *ret_nfds.
 */
Gpupool__Envelope *raw_lease_granules(int sock, uint32_t device, uint32_t granules, uint64_t size, int *fds,
                                      size_t *ret_nfds);
/*
 * Leases granules granules of 2 MiB on device and keeps them leased: the lease must succeed
 * with one descriptor per granule, and the descriptors are closed (the daemon still counts
 * them the client's).
 */
void raw_hold_granules(int sock, uint32_t device, uint32_t granules);
/* The same with granules_ahead set to ahead (and granules only where granule_lease). */
Gpupool__Envelope *raw_lease_ahead(int sock, uint32_t device, uint64_t size, bool granule_lease, uint32_t granules,
                                   uint32_t ahead, int *fds, size_t *ret_nfds);
/* An AdoptRequest of n segments of sizes on device, nfds descriptors riding with it, and its reply. */
Gpupool__Envelope *raw_adopt(int sock, uint32_t device, uint64_t *sizes, size_t n, const int *fds, size_t nfds);
/* The same, by the process's word (AdoptRequest.held): nfds should be 0. */
Gpupool__Envelope *raw_adopt_held(int sock, uint32_t device, uint64_t *sizes, size_t n, const int *fds, size_t nfds);
/*
 * Queues status requests (ids 2, 3, ...) on a non-blocking sock until the daemon stops taking
 * them for good (idle_ticks of 10 ms without room): a client that never reads. Returns how many went.
 */
int queue_status_requests(int sock, int idle_ticks);
/*
 * Leases GP_MAX_LEASE_GRANULES granules of 2 MiB on device 0 on sock and reads the reply, which
 * must bring them: their segment ids into ids (room for GP_MAX_LEASE_GRANULES), their
 * descriptors closed.
 */
void raw_lease_granule_ids(int sock, uint64_t *ids);
/*
 * A client that does not read: sends pairs times "give ids back" and "lease as many granules
 * again" on sock back to back (ids 100, 101, ...; without ids, the leases alone), never
 * reading a reply, then waits (wait_s at
 * most) until the daemon has taken every request off the socket (SIOCOUTQ 0: it answered each,
 * or holds the last one's reply). Returns whether it did.
 */
bool raw_lease_unread(int sock, const uint64_t *ids, unsigned pairs, unsigned wait_s);
/*
 * Reads n replies off sock (blocking), closing their descriptors: how many descriptors came into
 * *ret_fds, how many replies' errors say refusal into *ret_refused (the last such error into
 * why). Returns how many replies came before the daemon closed the socket.
 */
int raw_read_replies(int sock, int n, size_t *ret_fds, int *ret_refused, const char *refusal, char *why, size_t why_size);
/* Raw protocol: sends env on sock with what it holds on device 0 reported (Usage), and returns the reply. */
Gpupool__Envelope *call_reporting(int sock, Gpupool__Envelope *env, uint64_t in_use, uint64_t held_free);
/*
 * Raw protocol: a client named name that leases n segments of size bytes (their ids into ids,
 * when given) and says it holds them all free, and its control channel, said hello to, which
 * the caller reads, or never does. Returns the client's socket.
 */
int raw_keeper(struct testd *d, const char *name, uint64_t size, unsigned n, uint64_t *ids, int *ret_control);
/* A ReturnRequest of n segment ids, with usage reported if given, and its reply. */
Gpupool__Envelope *raw_return(int sock, uint64_t *ids, size_t n, Gpupool__Usage *usage);

/*
 * The hostile-descriptor case, for a backend that passes descriptors (host, cuda-vmm): a raw
 * client keeps the descriptor and a mapping of a segment it returned, another uid leases that
 * segment and fills it; the kept memory shows none of it. Needs root (a second uid).
 */
void check_kept_descriptor_reads_nothing(struct testd *d, uint32_t device);

/* Forks a child running fn(arg); returns its pid. The child exits with fn's return value. */
pid_t spawn(int (*fn)(struct testd *d, void *arg), struct testd *d, void *arg);
/* Waits for pid; returns its exit status, or 128 + signal. */
int reap(pid_t pid);

#endif
