/* testlib.c: see testlib.h. */
#define _GNU_SOURCE
#include "testlib.h"
#include "fdstore.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void test_skipped(const char *test, const char *fmt, ...) {
        const char *list = getenv("GPUPOOL_SKIP_LOG");
        size_t len = strlen(test);
        char line[512];
        va_list ap;
        int n, fd;

        /* A Check test's function is its name with _fn after it. */
        if (len > 3 && strcmp(test + len - 3, "_fn") == 0)
                len -= 3;
        n = snprintf(line, sizeof(line) - 1, "%.*s: ", (int) len, test);
        va_start(ap, fmt);
        n += vsnprintf(line + n, sizeof(line) - 1 - (size_t) n, fmt, ap);
        va_end(ap);
        if (n > (int) sizeof(line) - 2)
                n = (int) sizeof(line) - 2;
        line[n++] = '\n';
        line[n] = '\0';
        /* One write with O_APPEND: tests in forked children at once never interleave a line. */
        if (list && (fd = open(list, O_WRONLY | O_APPEND | O_CLOEXEC)) >= 0) {
                (void) !write(fd, line, (size_t) n);
                close(fd);
        }
}

static char skip_list[64];

void skips_begin(void) {
        int fd;

        strcpy(skip_list, "/tmp/gpupool-skipped-XXXXXX");
        fd = mkstemp(skip_list);
        if (fd < 0) {
                skip_list[0] = '\0';
                return;
        }
        close(fd);
        setenv("GPUPOOL_SKIP_LOG", skip_list, 1);
}

unsigned skips_report(void) {
        char line[512];
        unsigned n = 0;
        FILE *f;

        if (!skip_list[0])
                return 0;
        f = fopen(skip_list, "re");
        while (f && fgets(line, sizeof(line), f))
                printf("%s  %s", n++ ? "" : "Skipped, counted passed but not run:\n", line);
        if (f)
                fclose(f);
        unlink(skip_list);
        printf("Skipped: %u\n", n);
        return n;
}

bool under_valgrind(void) {
        const char *v = getenv("GPUPOOL_TEST_VALGRIND");

        return v && *v;
}

const char *test_tmp(void) {
        const char *t = getenv("GPUPOOL_TEST_TMP");

        return t && *t ? t : "/tmp";
}

void test_mkdtemp(char *buf, size_t size, const char *tag) {
        ck_assert_int_lt(snprintf(buf, size, "%s/gpupool-%s-XXXXXX", test_tmp(), tag), (int) size);
        ck_assert_ptr_nonnull(mkdtemp(buf));
}

bool test_mkdtemp_shm(char *buf, size_t size, const char *tag) {
        const char *t = getenv("GPUPOOL_TEST_SHM");

        if (!t || !*t)
                return false;
        ck_assert_int_lt(snprintf(buf, size, "%s/gpupool-%s-XXXXXX", t, tag), (int) size);
        return mkdtemp(buf) != NULL;
}

const char *build_dir(void) {
        const char *b = getenv("GPUPOOL_BUILD_DIR");

        return b && *b ? b : "build";
}

int open_fds_to(pid_t pid, const char *target) {
        char path[64], link[64 + 256], to[512];
        struct dirent *e;
        DIR *dir;
        int n = 0;

        snprintf(path, sizeof(path), "/proc/%d/fd", (int) pid);
        dir = opendir(path);
        ck_assert_ptr_nonnull(dir);
        while ((e = readdir(dir))) {
                ssize_t len;

                if (e->d_name[0] == '.')
                        continue;
                if (!target) {
                        n++;
                        continue;
                }
                snprintf(link, sizeof(link), "%s/%s", path, e->d_name);
                len = readlink(link, to, sizeof(to) - 1);
                if (len > 0) {
                        to[len] = 0;
                        n += strstr(to, target) != NULL;
                }
        }
        closedir(dir);
        return n - (pid == getpid() && !target);        /* the directory's own */
}

int open_fds(pid_t pid) {
        return open_fds_to(pid, NULL);
}

double now_s(void) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

int run_capture(const char *cmd, char *out, size_t size) {
        FILE *p = popen(cmd, "r");
        size_t n;
        int status;

        ck_assert_ptr_nonnull(p);
        n = fread(out, 1, size - 1, p);
        out[n] = '\0';
        status = pclose(p);
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void nap_ms(long ms) {
        struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };

        nanosleep(&ts, NULL);
}

const char *read_text(const char *path, char *buf, size_t size) {
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(buf, 1, size - 1, f) : 0;

        buf[n] = '\0';
        if (f)
                fclose(f);
        return buf;
}

int listen_seqpacket(const char *path) {
        struct sockaddr_un a = { .sun_family = AF_UNIX };
        int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

        ck_assert_int_ge(sock, 0);
        ck_assert_uint_lt(strlen(path), sizeof(a.sun_path));
        memcpy(a.sun_path, path, strlen(path) + 1);
        ck_assert_int_eq(bind(sock, (struct sockaddr *) &a, sizeof(a)), 0);
        ck_assert_int_eq(listen(sock, 16), 0);
        return sock;
}

int fds_from(int floor) {
        DIR *dir = opendir("/proc/self/fd");
        struct dirent *e;
        int n = 0, self = dir ? dirfd(dir) : -1;

        while (dir && (e = readdir(dir)))
                if (e->d_name[0] != '.' && atoi(e->d_name) >= floor && atoi(e->d_name) != self)
                        n++;
        if (dir)
                closedir(dir);
        return n;
}

int fds_from_in_child(int floor) {
        pid_t pid = fork();
        int status;

        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                int n = fds_from(floor);

                _exit(n < 254 ? n : 254);
        }
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert(WIFEXITED(status));
        return WEXITSTATUS(status);
}

bool under_tool(void) {
        return getenv("GPUPOOL_DAEMON_WRAPPER") != NULL;
}

long fd_table_size(pid_t pid) {
        char path[64], text[4096];
        const char *at;

        snprintf(path, sizeof(path), "/proc/%d/status", (int) pid);
        at = strstr(read_text(path, text, sizeof(text)), "FDSize:");
        return at ? strtol(at + 7, NULL, 10) : -1;
}

static void dump_log(const struct testd *d) {
        char line[512];
        FILE *f = fopen(d->log, "r");

        if (!f)
                return;
        fprintf(stderr, "---- gpupoold log %s ----\n", d->log);
        while (fgets(line, sizeof(line), f))
                fputs(line, stderr);
        fclose(f);
}

/* Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or its unified mount on a hybrid one), into buf. */
static bool cgroup2_mount(char *buf, size_t size) {
        char line[1024], mnt[512];
        bool found = false;
        FILE *f = fopen("/proc/self/mountinfo", "re");

        while (f && !found && fgets(line, sizeof(line), f))
                if (strstr(line, " - cgroup2 ") && sscanf(line, "%*s %*s %*s %*s %511s", mnt) == 1) {
                        snprintf(buf, size, "%s", mnt);
                        found = true;
                }
        if (f)
                fclose(f);
        return found;
}

void pod_cgroup_dir(bool cgroupfs, const char *mnt, const char *uid, int depth, char *buf, size_t size) {
        static const char *const levels[] = { "kubepods.slice", "kubepods-besteffort.slice" };
        static const char *const levels_cgroupfs[] = { "kubepods", "besteffort" };
        char u[64];
        int n;

        snprintf(u, sizeof(u), "%s", uid);
        for (char *p = u; *p && !cgroupfs; p++)
                if (*p == '-')
                        *p = '_';
        n = snprintf(buf, size, "%s", mnt);
        for (int i = 0; i < depth && i < 2; i++)
                n += snprintf(buf + n, size - (size_t) n, "/%s", cgroupfs ? levels_cgroupfs[i] : levels[i]);
        if (depth >= 3)
                n += snprintf(buf + n, size - (size_t) n, cgroupfs ? "/pod%s" : "/kubepods-besteffort-pod%s.slice", u);
        if (depth >= 4)
                snprintf(buf + n, size - (size_t) n, cgroupfs ? "/0123456789abcdef" : "/cri-containerd-test.scope");
}

static const char *const test_pods[] = { TEST_POD_A, TEST_POD_B, TEST_POD_D };

void pods_remove(const char *mnt) {
        char dir[1024];

        for (int p = 0; p < 6; p++)
                for (int depth = 4; depth >= 1; depth--) {
                        pod_cgroup_dir(p >= 3, mnt, test_pods[p % 3], depth, dir, sizeof(dir));
                        (void) rmdir(dir);
                }
}

bool pods_ready(const char *test, char *mnt, size_t size) {
        char dir[1024];

        if (geteuid() != 0 || !cgroup2_mount(mnt, size)) {
                test_skipped(test, "needs root and a cgroup v2 hierarchy");
                return false;
        }
        for (int p = 0; p < 6; p++)
                for (int depth = 1; depth <= 4; depth++) {
                        pod_cgroup_dir(p >= 3, mnt, test_pods[p % 3], depth, dir, sizeof(dir));
                        if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
                                test_skipped(test, "cannot make cgroup %s: %s", dir, strerror(errno));
                                pods_remove(mnt);
                                return false;
                        }
                }
        return true;
}

int cgroup_join(const char *dir, pid_t pid) {
        char path[1100];
        FILE *f;
        int r;

        snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
        if (!(f = fopen(path, "we")))
                return -errno;
        r = fprintf(f, "%d\n", (int) (pid ? pid : getpid())) < 0 ? -EIO : 0;
        if (fclose(f) != 0 && r == 0)
                r = -errno;
        return r;
}

/* Forks and execs the daemon of d (its argv is d->argv) and waits until it listens. */
static void launch(struct testd *d) {
        double limit_s = under_valgrind() ? 120 : 30;   /* a daemon under valgrind starts slowly on a loaded machine */

        if (d->store)
                fdstore_freeze(d->store);
        d->pid = fork();
        ck_assert_int_ge(d->pid, 0);
        if (d->pid == 0) {
                int fd = d->stderr_fd >= 0 ? d->stderr_fd : open(d->log, O_WRONLY | O_CREAT | O_APPEND, 0644);

                dup2(fd, 2);
                if (d->store)
                        fdstore_pass(d->store);
                if (d->cgroup_dir[0]) {
                        if (cgroup_join(d->cgroup_dir, 0) < 0 || unshare(CLONE_NEWCGROUP) < 0) {
                                fprintf(stderr, "cannot run in cgroup %s, in a namespace of its own: %s\n", d->cgroup_dir,
                                        strerror(errno));
                                _exit(126);
                        }
                        if (d->pod_uid[0])
                                setenv("GPUPOOL_POD_UID", d->pod_uid, 1);
                }
                if (d->run_as && (setgroups(0, NULL) < 0 || setgid(d->run_as) < 0 || setuid(d->run_as) < 0)) {
                        fprintf(stderr, "cannot run as uid %u: %s\n", d->run_as, strerror(errno));
                        _exit(126);
                }
                execvp(d->argv[0], d->argv);
                fprintf(stderr, "exec %s: %s\n", d->argv[0], strerror(errno));
                _exit(127);
        }
        if (d->store)
                fdstore_thaw(d->store);
        /*
         * Ready once it accepts a connection: bind and listen happen before the loop runs. The
         * probe takes a client slot until the daemon has seen it close: it waits for that (the
         * daemon closes a connection that ends before hello), so that a test at --max-clients 1
         * finds its one slot free however slow the daemon is (valgrind).
         */
        for (double t0 = now_s(); now_s() - t0 < limit_s; nap_ms(5)) {
                int sock, status;

                /* Bounded: a daemon that listens and never accepts must not stall the probe (a full backlog blocks connect). */
                if (gp_wire_connect_timeout(d->sock, 1000, &sock) == 0) {
                        struct pollfd p = { .fd = sock, .events = POLLIN };
                        char b;

                        shutdown(sock, SHUT_WR);
                        if (poll(&p, 1, 30000) == 1)
                                (void) !read(sock, &b, 1);
                        close(sock);
                        mark_point();   /* a test that times out after this says the daemon listened */
                        return;
                }
                if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
                        dump_log(d);
                        ck_abort_msg("gpupoold exited at start (status %d)", status);
                }
        }
        dump_log(d);
        ck_abort_msg("gpupoold did not listen on %s within %.0f s", d->sock, limit_s);
}

static void testd_startv(struct testd *d, int stderr_fd, const char *cgroup_dir, const char *pod_uid, unsigned run_as,
                         va_list ap) {
        char *wrapper;
        int argc = 0;

        memset(d, 0, sizeof(*d));
        snprintf(d->cgroup_dir, sizeof(d->cgroup_dir), "%s", cgroup_dir ? cgroup_dir : "");
        snprintf(d->pod_uid, sizeof(d->pod_uid), "%s", pod_uid ? pod_uid : "");
        d->run_as = run_as;
        d->stderr_fd = stderr_fd;
        test_mkdtemp(d->dir, sizeof(d->dir), "test");
        /* The daemon's user makes its socket there; everyone else may reach it. */
        if (run_as)
                ck_assert(chown(d->dir, run_as, run_as) == 0 && chmod(d->dir, 0755) == 0);
        snprintf(d->path, sizeof(d->path), "%s/gpupoold", build_dir());
        snprintf(d->sock, sizeof(d->sock), "%s/gpupool.sock", d->dir);
        snprintf(d->log, sizeof(d->log), "%s/gpupoold.log", d->dir);
        /* Its user may not reach the build (a checkout in a directory of mode 0700): a copy it can run. */
        if (run_as) {
                char build[sizeof(d->path)];

                snprintf(build, sizeof(build), "%s", d->path);
                testd_copy_for_others(d, build, d->path, sizeof(d->path));
        }
        /* $GPUPOOL_DAEMON_WRAPPER (e.g. "valgrind -q --error-exitcode=99") runs the daemon under a tool. */
        if (getenv("GPUPOOL_DAEMON_WRAPPER")) {
                snprintf(d->wrapper, sizeof(d->wrapper), "%s", getenv("GPUPOOL_DAEMON_WRAPPER"));
                wrapper = d->wrapper;
                for (char *save = NULL, *w = strtok_r(wrapper, " ", &save); w && argc < 8; w = strtok_r(NULL, " ", &save))
                        d->argv[argc++] = w;
        }
        d->argv[argc++] = d->path;
        d->argv[argc++] = "--socket";
        d->argv[argc++] = d->sock;
        d->argv[argc++] = "--backend";
        d->argv[argc++] = "host";
        d->argv[argc++] = "--host-capacity";
        d->argv[argc++] = "512M";
        d->argv[argc++] = "--check-invariants";
        d->argv[argc++] = "--log-level";
        d->argv[argc++] = "debug";
        for (char *a; (a = va_arg(ap, char *)) && argc < 38;)
                d->argv[argc++] = a;
        d->argv[argc] = NULL;
        launch(d);
        /* The harness's own check (tests/check-newcomer.sh): a test that fails with its daemon up leaves nothing. */
        if (getenv("GPUPOOL_TEST_FAIL_AT_START"))
                ck_abort_msg("failing on purpose after the daemon started ($GPUPOOL_TEST_FAIL_AT_START)");
}

void testd_start(struct testd *d, ...) {
        va_list ap;

        va_start(ap, d);
        testd_startv(d, -1, NULL, NULL, 0, ap);
        va_end(ap);
}

void testd_start_in_pod(struct testd *d, const char *cgroup_dir, const char *pod_uid, ...) {
        va_list ap;

        va_start(ap, pod_uid);
        testd_startv(d, -1, cgroup_dir, pod_uid, 0, ap);
        va_end(ap);
}

void testd_start_as(struct testd *d, unsigned uid, ...) {
        va_list ap;

        va_start(ap, uid);
        testd_startv(d, -1, NULL, NULL, uid, ap);
        va_end(ap);
}

void testd_start_unread_bounded(struct testd *d, const char *host_capacity, const char *send_timeout) {
        struct rlimit old, rl;

        ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &old), 0);
        rl = (struct rlimit) { 16384, old.rlim_max };
        ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
        testd_start_as(d, 65534, "--host-capacity", host_capacity, "--send-timeout", send_timeout, NULL);
        ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &old), 0);
        ck_assert_int_eq(chmod(d->dir, 0755), 0);
}

void testd_start_stderr(struct testd *d, int fd, ...) {
        va_list ap;

        va_start(ap, fd);
        testd_startv(d, fd, NULL, NULL, 0, ap);
        va_end(ap);
}

void testd_crash(struct testd *d) {
        kill(d->pid, SIGKILL);
        ck_assert_int_eq(waitpid(d->pid, NULL, 0), d->pid);
}

void testd_relaunch(struct testd *d) {
        /* The stale socket file stays, as after a real crash: the new daemon replaces it. */
        launch(d);
}

void testd_crash_and_restart(struct testd *d) {
        testd_crash(d);
        testd_relaunch(d);
}

bool testd_log_wait(struct testd *d, const char *text) {
        static char log[1 << 20];

        for (double t0 = now_s(); now_s() - t0 < 10; nap_ms(20))
                if (strstr(read_text(d->log, log, sizeof(log)), text))
                        return true;
        return false;
}

bool testd_alive(struct testd *d) {
        return kill(d->pid, 0) == 0 && waitpid(d->pid, NULL, WNOHANG) == 0;
}

int testd_stop(struct testd *d) {
        int status;

        kill(d->pid, SIGTERM);
        ck_assert_int_eq(waitpid(d->pid, &status, 0), d->pid);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                dump_log(d);
        unlink(d->log);
        unlink(d->sock);
        if (d->run_as)
                unlink(d->path);        /* the copy its user could run */
        rmdir(d->dir);
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static char conf_dir[96], conf_path[128];

void conf_write(const char *text) {
        FILE *f = fopen(conf_path, "w");

        ck_assert_ptr_nonnull(f);
        fputs(text, f);
        fclose(f);
}

const char *conf_new(const char *text) {
        test_mkdtemp(conf_dir, sizeof(conf_dir), "conf");
        ck_assert_int_eq(chmod(conf_dir, 0755), 0);
        snprintf(conf_path, sizeof(conf_path), "%s/gpupoold.conf", conf_dir);
        conf_write(text);
        return conf_path;
}

void conf_remove(void) {
        unlink(conf_path);
        rmdir(conf_dir);
}

json_t *testd_ctl(struct testd *d, const char *cmd) {
        char command[512];
        json_error_t err;
        json_t *j;
        FILE *p;

        snprintf(command, sizeof(command), "%s/gpupoolctl --socket %s --json %s", build_dir(), d->sock, cmd);
        p = popen(command, "r");
        ck_assert_ptr_nonnull(p);
        j = json_loadf(p, 0, &err);
        ck_assert_int_eq(pclose(p), 0);
        return j;
}

long long status_device(json_t *status, const char *key) {
        json_t *dev = json_array_get(json_object_get(status, "devices"), 0);

        return dev ? json_integer_value(json_object_get(dev, key)) : -1;
}

const char *testd_copy_for_others(struct testd *d, const char *path, char *buf, size_t size) {
        const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        char cmd[1024];

        snprintf(buf, size, "%s/%s", d->dir, base);
        snprintf(cmd, sizeof(cmd), "cp '%s' '%s' && chmod 0755 '%s'", path, buf, buf);
        ck_assert_int_eq(system(cmd), 0);
        return buf;
}

long long testd_device(struct testd *d, unsigned index, const char *key) {
        json_t *st = testd_ctl(d, "status");
        json_t *dev = json_array_get(json_object_get(st, "devices"), index);
        long long v = dev ? json_integer_value(json_object_get(dev, key)) : -1;

        json_decref(st);
        return v;
}

bool testd_device_becomes(struct testd *d, unsigned index, const char *key, long long want) {
        double t0 = now_s();

        while (now_s() - t0 < 10.0)
                if (testd_device(d, index, key) == want)
                        return true;
        return false;
}

long long testd_client_field(struct testd *d, pid_t pid, const char *name, const char *key) {
        json_t *st = testd_ctl(d, "status");
        json_t *c = pid ? status_client_by_pid(st, pid) : status_client_by_name(st, name);
        json_t *v_json = c ? json_object_get(c, key) : NULL;
        long long v = !c ? -1 : json_is_boolean(v_json) ? json_is_true(v_json) : json_integer_value(v_json);

        json_decref(st);
        return v;
}

bool testd_client_becomes(struct testd *d, pid_t pid, const char *name, const char *key, long long want) {
        double t0 = now_s();

        while (now_s() - t0 < 10.0) {
                if (testd_client_field(d, pid, name, key) == want)
                        return true;
                usleep(10000);
        }
        return false;
}

json_t *status_client_by_pid(json_t *status, pid_t pid) {
        json_t *clients = json_object_get(status, "clients"), *c;
        size_t i;

        json_array_foreach(clients, i, c)
                if (json_integer_value(json_object_get(c, "pid")) == pid)
                        return c;
        return NULL;
}

json_t *status_client_by_name(json_t *status, const char *name) {
        json_t *clients = json_object_get(status, "clients"), *c;
        size_t i;

        json_array_foreach(clients, i, c)
                if (strcmp(json_string_value(json_object_get(c, "name")), name) == 0)
                        return c;
        return NULL;
}

int raw_connect(struct testd *d) {
        int sock;

        ck_assert_int_eq(gp_wire_connect(d->sock, &sock), 0);
        return sock;
}

void raw_send_fds(int sock, Gpupool__Envelope *env, const int *fds, size_t nfds) {
        uint8_t buf[GP_MAX_REQUEST_BYTES];
        int n;

        if (!env->version)
                env->version = GP_PROTOCOL_VERSION;
        n = gp_wire_pack(env, buf, sizeof(buf));
        ck_assert_int_gt(n, 0);
        ck_assert_int_eq(gp_wire_send_packet_fds(sock, buf, (size_t) n, fds, nfds), 0);
}

void raw_send(int sock, Gpupool__Envelope *env) {
        raw_send_fds(sock, env, NULL, 0);
}

static Gpupool__Envelope *adopt(int sock, uint32_t device, uint64_t *sizes, size_t n, const int *fds, size_t nfds, bool held) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__AdoptRequest rq = GPUPOOL__ADOPT_REQUEST__INIT;

        env.id = 31;
        rq.device = device;
        rq.sizes = sizes;
        rq.n_sizes = n;
        rq.has_held = held;
        rq.held = held;
        env.body_case = GPUPOOL__ENVELOPE__BODY_ADOPT;
        env.adopt = &rq;
        raw_send_fds(sock, &env, fds, nfds);
        rep = raw_recv(sock);
        ck_assert_ptr_nonnull(rep);
        return rep;
}

Gpupool__Envelope *raw_adopt(int sock, uint32_t device, uint64_t *sizes, size_t n, const int *fds, size_t nfds) {
        return adopt(sock, device, sizes, n, fds, nfds, false);
}

Gpupool__Envelope *raw_adopt_held(int sock, uint32_t device, uint64_t *sizes, size_t n, const int *fds, size_t nfds) {
        return adopt(sock, device, sizes, n, fds, nfds, true);
}

/*
 * Reads one reply, keeping the descriptors that came with it in fds (room for
 * GP_WIRE_MAX_FDS), how many in *ret_nfds; with fds NULL they are closed. NULL when the daemon
 * closed.
 */
static Gpupool__Envelope *recv_fds(int sock, int *fds, size_t *ret_nfds) {
        static uint8_t buf[GP_MAX_REPLY_BYTES];
        int got[GP_WIRE_MAX_FDS];
        Gpupool__Envelope *env;
        size_t nfds;
        int n;

        n = gp_wire_recv_packet_fds(sock, buf, sizeof(buf), got, &nfds);
        if (n <= 0 || !fds) {
                for (size_t i = 0; i < nfds; i++)
                        close(got[i]);
                nfds = 0;
        }
        if (fds)
                memcpy(fds, got, nfds * sizeof(int));
        if (ret_nfds)
                *ret_nfds = nfds;
        if (n <= 0)
                return NULL;
        ck_assert_int_eq(gp_wire_unpack(buf, (size_t) n, &env), 0);
        return env;
}

Gpupool__Envelope *raw_recv_fd(int sock, int *ret_fd) {
        int fds[GP_WIRE_MAX_FDS];
        Gpupool__Envelope *env;
        size_t nfds;

        env = recv_fds(sock, ret_fd ? fds : NULL, &nfds);
        ck_assert_uint_le(nfds, 1);
        if (ret_fd)
                *ret_fd = nfds ? fds[0] : -1;
        return env;
}

Gpupool__Envelope *raw_recv(int sock) {
        return raw_recv_fd(sock, NULL);
}

Gpupool__Envelope *raw_call_fd(int sock, Gpupool__Envelope *env, int *ret_fd) {
        Gpupool__Envelope *rep;

        raw_send(sock, env);
        rep = raw_recv_fd(sock, ret_fd);
        ck_assert_ptr_nonnull(rep);
        return rep;
}

Gpupool__Envelope *raw_call(int sock, Gpupool__Envelope *env) {
        return raw_call_fd(sock, env, NULL);
}

/* Sends a LeaseRequest: a granule lease (of granules, 0 included) or a plain one. */
/* A LeaseRequest; granules and ahead sent where granule_lease and ahead_set say. */
static void send_lease(int sock, uint32_t device, uint64_t size, bool granule_lease, uint32_t granules, bool ahead_set,
                       uint32_t ahead) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
        Gpupool__LeaseRequest lr = GPUPOOL__LEASE_REQUEST__INIT;

        lr.device = device;
        lr.size = size;
        lr.has_granules = granule_lease;
        lr.granules = granules;
        lr.has_granules_ahead = ahead_set;
        lr.granules_ahead = ahead;
        env.id = 7;
        env.body_case = GPUPOOL__ENVELOPE__BODY_LEASE;
        env.lease = &lr;
        raw_send(sock, &env);
}

Gpupool__Envelope *raw_lease_fd(int sock, uint32_t device, uint64_t size, int *ret_fd) {
        Gpupool__Envelope *rep;

        send_lease(sock, device, size, false, 0, false, 0);
        rep = raw_recv_fd(sock, ret_fd);
        ck_assert_ptr_nonnull(rep);
        return rep;
}

/* Sends a LeaseRequest (send_lease()) and receives its reply, with its descriptors into fds. */
static Gpupool__Envelope *lease_with_fds(int sock, uint32_t device, uint64_t size, bool granule_lease, uint32_t granules,
                                         bool ahead_set, uint32_t ahead, int *fds, size_t *ret_nfds) {
        Gpupool__Envelope *rep;

        send_lease(sock, device, size, granule_lease, granules, ahead_set, ahead);
        rep = recv_fds(sock, fds, ret_nfds);
        ck_assert_ptr_nonnull(rep);
        return rep;
}

Gpupool__Envelope *raw_lease_granules(int sock, uint32_t device, uint32_t granules, uint64_t size, int *fds,
                                      size_t *ret_nfds) {
        return lease_with_fds(sock, device, size, true, granules, false, 0, fds, ret_nfds);
}

void raw_hold_granules(int sock, uint32_t device, uint32_t granules) {
        int fds[GP_WIRE_MAX_FDS];
        size_t nfds;
        Gpupool__Envelope *rep = raw_lease_granules(sock, device, granules, GP_GRANULE_BYTES, fds, &nfds);

        ck_assert_msg(rep->status == GPUPOOL__STATUS__STATUS_OK, "%s", rep->error);
        ck_assert_uint_eq(nfds, granules);
        ck_assert_uint_eq(rep->lease_reply->n_more_segment_ids, granules - 1);
        for (size_t i = 0; i < nfds; i++)
                close(fds[i]);
        gpupool__envelope__free_unpacked(rep, NULL);
}

Gpupool__Envelope *raw_lease_ahead(int sock, uint32_t device, uint64_t size, bool granule_lease, uint32_t granules,
                                   uint32_t ahead, int *fds, size_t *ret_nfds) {
        return lease_with_fds(sock, device, size, granule_lease, granules, true, ahead, fds, ret_nfds);
}

Gpupool__Envelope *raw_lease(int sock, uint32_t device, uint64_t size) {
        return raw_lease_fd(sock, device, size, NULL);
}

void raw_lease_granule_ids(int sock, uint64_t *ids) {
        int fds[GP_WIRE_MAX_FDS];
        size_t nfds;
        Gpupool__Envelope *rep = raw_lease_granules(sock, 0, GP_MAX_LEASE_GRANULES, GP_GRANULE_BYTES, fds, &nfds);

        ck_assert_msg(rep->status == GPUPOOL__STATUS__STATUS_OK, "%s", rep->error);
        ck_assert_uint_eq(nfds, GP_MAX_LEASE_GRANULES);
        ids[0] = rep->lease_reply->segment_id;
        for (size_t i = 0; i < rep->lease_reply->n_more_segment_ids; i++)
                ids[i + 1] = rep->lease_reply->more_segment_ids[i];
        for (size_t i = 0; i < nfds; i++)
                close(fds[i]);
        gpupool__envelope__free_unpacked(rep, NULL);
}

bool raw_lease_unread(int sock, const uint64_t *ids, unsigned pairs, unsigned wait_s) {
        Gpupool__Envelope ret = GPUPOOL__ENVELOPE__INIT, lease = GPUPOOL__ENVELOPE__INIT;
        Gpupool__ReturnRequest rr = GPUPOOL__RETURN_REQUEST__INIT;
        Gpupool__LeaseRequest lr = GPUPOOL__LEASE_REQUEST__INIT;
        uint8_t ret_buf[GP_MAX_REQUEST_BYTES], lease_buf[GP_MAX_REQUEST_BYTES];
        int ret_len, lease_len, queued = -1;

        rr.segment_ids = (uint64_t *) ids;
        rr.n_segment_ids = GP_MAX_LEASE_GRANULES;
        ret.version = lease.version = GP_PROTOCOL_VERSION;
        ret.body_case = GPUPOOL__ENVELOPE__BODY_RETURN_SEGMENTS;
        ret.return_segments = &rr;
        lr.size = GP_GRANULE_BYTES;
        lr.has_granules = true;
        lr.granules = GP_MAX_LEASE_GRANULES;
        lease.body_case = GPUPOOL__ENVELOPE__BODY_LEASE;
        lease.lease = &lr;
        for (unsigned i = 0; i < pairs; i++) {
                ret.id = 100 + 2 * (uint64_t) i;
                lease.id = ret.id + 1;
                ret_len = ids ? gp_wire_pack(&ret, ret_buf, sizeof(ret_buf)) : 0;
                lease_len = gp_wire_pack(&lease, lease_buf, sizeof(lease_buf));
                if (ret_len < 0 || lease_len < 0 ||
                    (ids && gp_wire_send_packet(sock, ret_buf, (size_t) ret_len, -1) < 0) ||
                    gp_wire_send_packet(sock, lease_buf, (size_t) lease_len, -1) < 0)
                        return false;
        }
        /* The daemon has taken a request off the socket once it answered it, or holds its reply. */
        for (unsigned ms = 0; ms < wait_s * 1000; ms++) {
                if (ioctl(sock, SIOCOUTQ, &queued) < 0 || queued == 0)
                        break;
                usleep(1000);
        }
        return queued == 0;
}

int raw_read_replies(int sock, int n, size_t *ret_fds, int *ret_refused, const char *refusal, char *why, size_t why_size) {
        int fds[GP_WIRE_MAX_FDS], got = 0;

        *ret_fds = 0;
        *ret_refused = 0;
        for (; got < n; got++) {
                Gpupool__Envelope *rep;
                size_t nfds;

                if (!(rep = recv_fds(sock, fds, &nfds)))
                        break;
                *ret_fds += nfds;
                for (size_t i = 0; i < nfds; i++)
                        close(fds[i]);
                if (rep->error && strstr(rep->error, refusal)) {
                        (*ret_refused)++;
                        snprintf(why, why_size, "%s", rep->error);
                }
                gpupool__envelope__free_unpacked(rep, NULL);
        }
        return got;
}

int queue_status_requests(int sock, int idle_ticks) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
        Gpupool__StatusRequest sr = GPUPOOL__STATUS_REQUEST__INIT;
        uint8_t buf[GP_MAX_REQUEST_BYTES];
        int sent = 0;

        env.version = GP_PROTOCOL_VERSION;
        env.body_case = GPUPOOL__ENVELOPE__BODY_STATUS_REQUEST;
        env.status_request = &sr;
        for (int i = 0, idle = 0; i < 100000 && idle < idle_ticks; i++) {
                env.id = (uint64_t) sent + 2;
                if (gp_wire_send_packet(sock, buf, (size_t) gp_wire_pack(&env, buf, sizeof(buf)), -1) < 0) {
                        usleep(10000);
                        idle++;
                        continue;
                }
                idle = 0;
                sent++;
        }
        return sent;
}

/* Raw protocol: a request of body_case on sock, with what it holds on device 0 reported. */
Gpupool__Envelope *call_reporting(int sock, Gpupool__Envelope *env, uint64_t in_use, uint64_t held_free) {
        Gpupool__Usage u = GPUPOOL__USAGE__INIT, *up = &u;

        u.device = 0;
        u.in_use_bytes = in_use;
        u.held_free_bytes = held_free;
        env->n_usage = 1;
        env->usage = &up;
        return raw_call(sock, env);
}

/*
 * Raw protocol: a client named name that leases n segments of size bytes (their ids into ids,
 * when given) and says it holds them all free, and its control channel, said hello to, which
 * the caller reads, or never does.
 */
int raw_keeper(struct testd *d, const char *name, uint64_t size, unsigned n, uint64_t *ids, int *ret_control) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__Hello hello = GPUPOOL__HELLO__INIT;
        Gpupool__StatusRequest sr = GPUPOOL__STATUS_REQUEST__INIT;
        uint64_t client_id;
        int sock;

        hello.name = (char *) name;
        sock = raw_hello_with(d, &hello, &client_id);
        for (unsigned i = 0; i < n; i++) {
                rep = raw_lease(sock, 0, size);
                ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
                if (ids)
                        ids[i] = rep->lease_reply->segment_id;
                gpupool__envelope__free_unpacked(rep, NULL);
        }
        env.id = 3;
        env.body_case = GPUPOOL__ENVELOPE__BODY_STATUS_REQUEST;
        env.status_request = &sr;
        rep = call_reporting(sock, &env, 0, n * size);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        gpupool__envelope__free_unpacked(rep, NULL);
        hello.has_control_for = 1;
        hello.control_for = client_id;
        *ret_control = raw_hello_with(d, &hello, NULL);
        return sock;
}

Gpupool__Envelope *raw_return(int sock, uint64_t *ids, size_t n, Gpupool__Usage *usage) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
        Gpupool__ReturnRequest rr = GPUPOOL__RETURN_REQUEST__INIT;

        rr.segment_ids = ids;
        rr.n_segment_ids = n;
        env.id = 8;
        env.body_case = GPUPOOL__ENVELOPE__BODY_RETURN_SEGMENTS;
        env.return_segments = &rr;
        if (usage) {
                env.n_usage = 1;
                env.usage = &usage;
        }
        return raw_call(sock, &env);
}

int raw_hello_with(struct testd *d, Gpupool__Hello *hello, uint64_t *ret_client_id) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT, *rep;
        int sock = raw_connect(d);

        env.id = 1;
        env.body_case = GPUPOOL__ENVELOPE__BODY_HELLO;
        env.hello = hello;
        rep = raw_call(sock, &env);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        if (ret_client_id)
                *ret_client_id = rep->hello_reply->client_id;
        gpupool__envelope__free_unpacked(rep, NULL);
        return sock;
}

int raw_hello(struct testd *d, const char *name) {
        Gpupool__Hello hello = GPUPOOL__HELLO__INIT;

        hello.name = (char *) name;
        return raw_hello_with(d, &hello, NULL);
}

const char *testd_metrics(struct testd *d, char *buf, size_t size) {
        char cmd[512];

        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s metrics", build_dir(), d->sock);
        ck_assert_int_eq(run_capture(cmd, buf, size), 0);
        return buf;
}

double metrics_value(const char *text, const char *series) {
        size_t len = strlen(series);

        for (const char *p = text; p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
                if (strncmp(p, series, len) == 0 && p[len] == ' ')
                        return strtod(p + len + 1, NULL);
        ck_abort_msg("no series %s in:\n%s", series, text);
        return -1;
}

bool testd_metric_becomes(struct testd *d, const char *series, double want, unsigned wait_s) {
        static char text[160 * 1024];

        for (unsigned ms = 0; ms <= wait_s * 1000; ms += 10) {
                if (metrics_value(testd_metrics(d, text, sizeof(text)), series) == want)
                        return true;
                usleep(10000);
        }
        return false;
}

pid_t spawn(int (*fn)(struct testd *d, void *arg), struct testd *d, void *arg) {
        pid_t pid = fork();

        ck_assert_int_ge(pid, 0);
        if (pid == 0)
                _exit(fn(d, arg));
        return pid;
}

int reap(pid_t pid) {
        int status;

        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* ---- the hostile-descriptor case ---- */

#define KEPT_SECRET 0x5c

struct kept_next_owner {
        uint32_t device;
        uint64_t segment_size;
        int up[2], go[2];       /* filled, to the test; done, from it */
};

/* As uid 65534, over the raw protocol: leases a block, maps its segment, fills it with the secret. */
static int kept_next_owner(struct testd *d, void *arg) {
        struct kept_next_owner *k = arg;
        Gpupool__Envelope *rep;
        uint8_t *m;
        int sock, fd;
        char b;

        if (setgid(65534) < 0 || setuid(65534) < 0)
                return 20;
        sock = raw_hello(d, "next-owner");
        rep = raw_lease_fd(sock, k->device, 64 * 1024, &fd);
        if (rep->status != GPUPOOL__STATUS__STATUS_OK || fd < 0 || !rep->lease_reply ||
            rep->lease_reply->segment_size != k->segment_size)
                return 21;
        m = mmap(NULL, k->segment_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED)
                return 22;
        memset(m, KEPT_SECRET, k->segment_size);
        if (write(k->up[1], "f", 1) != 1 || read(k->go[0], &b, 1) != 1)
                return 23;
        gpupool__envelope__free_unpacked(rep, NULL);
        munmap(m, k->segment_size);
        close(fd);
        close(sock);
        return 0;
}

/* Whether none of size bytes at m is the secret. */
static bool shows_no_secret(const uint8_t *m, uint64_t size) {
        for (uint64_t i = 0; i < size; i++)
                if (m[i] == KEPT_SECRET)
                        return false;
        return true;
}

void check_kept_descriptor_reads_nothing(struct testd *d, uint32_t device) {
        struct kept_next_owner k = { .device = device };
        Gpupool__Envelope *rep, *ret;
        uint8_t *kept, *again;
        uint64_t segment;
        int sock, fd;
        pid_t child;
        char b;

        ck_assert_int_eq(chmod(d->dir, 0755), 0);       /* let the other uid reach the socket */
        sock = raw_hello(d, "keeps-descriptors");
        rep = raw_lease_fd(sock, device, 64 * 1024, &fd);
        ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
        ck_assert_int_ge(fd, 0);
        segment = rep->lease_reply->segment_id;
        k.segment_size = rep->lease_reply->segment_size;
        gpupool__envelope__free_unpacked(rep, NULL);    /* before the fork: the child would carry it to its exit */
        kept = mmap(NULL, k.segment_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        ck_assert_ptr_ne(kept, MAP_FAILED);
        memset(kept, 0x11, k.segment_size);
        /* Returned, yet the descriptor and the mapping stay: nothing can take them back. */
        ret = raw_return(sock, &segment, 1, NULL);
        ck_assert_int_eq(ret->status, GPUPOOL__STATUS__STATUS_OK);
        ck_assert_uint_eq(ret->return_reply->returned, 1);
        gpupool__envelope__free_unpacked(ret, NULL);
        ck_assert_int_eq(testd_device(d, device, "cached_bytes"), (long long) k.segment_size);

        ck_assert_int_eq(pipe(k.up), 0);
        ck_assert_int_eq(pipe(k.go), 0);
        child = spawn(kept_next_owner, d, &k);
        ck_assert_int_eq(read(k.up[0], &b, 1), 1);
        /* The next owner holds that very segment (no new one was made) and filled it. */
        ck_assert_int_eq(testd_device(d, device, "cached_bytes"), 0);
        ck_assert_int_eq(testd_device(d, device, "reserved_bytes"), (long long) k.segment_size);
        ck_assert_msg(shows_no_secret(kept, k.segment_size), "a kept mapping shows what another uid wrote");
        again = mmap(NULL, k.segment_size, PROT_READ, MAP_SHARED, fd, 0);
        ck_assert_ptr_ne(again, MAP_FAILED);
        ck_assert_msg(shows_no_secret(again, k.segment_size), "a kept descriptor, mapped again, shows what another uid wrote");
        ck_assert_int_eq(write(k.go[1], "d", 1), 1);
        ck_assert_int_eq(reap(child), 0);
        munmap(again, k.segment_size);
        munmap(kept, k.segment_size);
        close(fd);
        close(k.up[0]), close(k.up[1]), close(k.go[0]), close(k.go[1]);
        close(sock);
}

bool survivor_restarted(struct survivor *w) {
        char b;

        return write(w->up[1], "d", 1) == 1 && read(w->go[0], &b, 1) == 1;
}

void *survivor_adopted(struct testd *d, const struct survivor *w, gpupool_client *c, const struct gpupool_stats *held,
                       size_t size) {
        struct gpupool_stats now;
        char err[512];
        void *p = NULL;
        int r;

        for (double t0 = now_s(); (r = gpupool_alloc(c, 0, size, &p)) == -ECONNRESET && now_s() - t0 < 20;)
                usleep(20 * 1000);
        if (r != 0) {
                gpupool_last_error(c, err, sizeof(err));
                fprintf(stderr, "survivor %d: after the restart: %d: %s\n", w->index, r, err);
                return NULL;
        }
        /* Counted once: the daemon leases it what it held and what it leased since, the blocks still where they were. */
        if (gpupool_stats(c, &now) != 0 || now.mapped_bytes < held->mapped_bytes + size ||
            testd_client_field(d, getpid(), "survivor", "reserved_bytes") != (long long) now.mapped_bytes) {
                fprintf(stderr, "survivor %d: held %llu, then %llu; the daemon counts %lld\n", w->index,
                        (unsigned long long) held->mapped_bytes, (unsigned long long) now.mapped_bytes,
                        testd_client_field(d, getpid(), "survivor", "reserved_bytes"));
                return NULL;
        }
        return p;
}

gpupool_client *connect_segments(const char *sock, const char *name, const char *mode) {
        gpupool_client *c;

        setenv("GPUPOOL_SEGMENTS", mode, 1);
        setenv("GPUPOOL_IDLE_RETURN", "0", 1);
        ck_assert_int_eq(gpupool_connect(sock, name, &c), 0);
        return c;
}

struct gpupool_stats client_stats(gpupool_client *c) {
        struct gpupool_stats st;

        ck_assert_int_eq(gpupool_stats(c, &st), 0);
        return st;
}

void page_fill(void *p, size_t size, unsigned seed) {
        for (size_t i = 0; i < size; i += 4096)
                memset((char *) p + i, (int) (seed + i / 4096) & 0xff, size - i < 4096 ? size - i : 4096);
}

bool page_intact(const void *p, size_t size, unsigned seed) {
        for (size_t i = 0; i < size; i += 4096) {
                const unsigned char *q = (const unsigned char *) p + i;
                size_t n = size - i < 4096 ? size - i : 4096;

                if (q[0] != ((seed + i / 4096) & 0xff) || q[n - 1] != ((seed + i / 4096) & 0xff))
                        return false;
        }
        return true;
}

void run_survivors(struct testd *d, int n, int (*fn)(struct testd *d, void *arg)) {
        struct survivor w[16];
        pid_t pids[16];
        char b;

        ck_assert_int_le(n, 16);
        for (int i = 0; i < n; i++) {
                w[i].index = i;
                ck_assert(pipe(w[i].up) == 0 && pipe(w[i].go) == 0);
                pids[i] = spawn(fn, d, &w[i]);
                /* The survivor's ends are its own: one that dies ends the reads below, failing the test, not hanging it. */
                close(w[i].up[1]), close(w[i].go[0]);
        }
        for (int i = 0; i < n; i++)
                ck_assert_msg(read(w[i].up[0], &b, 1) == 1, "survivor %d failed at step %d", i, reap(pids[i]));
        testd_crash(d);
        for (int i = 0; i < n; i++)
                ck_assert_int_eq(write(w[i].go[1], "k", 1), 1);
        /* Each goes on without a daemon, then says so (survivor_restarted()), or exits. */
        for (int i = 0; i < n; i++)
                (void) read(w[i].up[0], &b, 1);
        testd_relaunch(d);
        for (int i = 0; i < n; i++)
                (void) write(w[i].go[1], "u", 1);
        for (int i = 0; i < n; i++) {
                int status = reap(pids[i]);

                ck_assert_msg(status == 0, "survivor %d failed at step %d", i, status);
                close(w[i].up[0]), close(w[i].go[1]);
        }
}
