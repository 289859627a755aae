/*
 * check_objects.c: named objects on the host backend: a block published under a name is
 * mapped read-only by other processes without a copy, outlives its publisher (counted to its
 * tenant), goes once unpublished and detached by everyone (or, idle, under memory pressure),
 * and bad input gets a sentence with nothing lost.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpupool.h"
#include "suites.h"
#include "testlib.h"
#include "wire.h"

#define OBJECTS_PER_HOLDER 64  /* daemon/objects.h */

#define MiB (1ULL << 20)
#define OBJ (16 * MiB)          /* over 10 MiB: a segment of its own */

static unsigned char pattern(size_t i) {
        return (unsigned char) (i * 131 + 7);
}

/* The object's field key, from gpupoolctl objects --json (-1: no such object). */
static long long object_field(struct testd *d, const char *name, const char *key) {
        json_t *j = testd_ctl(d, "objects"), *o;
        long long r = -1;
        size_t i;

        json_array_foreach(json_object_get(j, "objects"), i, o)
                if (strcmp(json_string_value(json_object_get(o, "name")), name) == 0) {
                        json_t *v = json_object_get(o, key);

                        r = json_is_boolean(v) ? json_is_true(v) : json_integer_value(v);
                }
        json_decref(j);
        return r;
}

/* gpupoolctl check: every pool's and tenant's invariant holds, objects counted. */
static void check_ok(struct testd *d) {
        json_t *j = testd_ctl(d, "check");

        ck_assert_msg(j != NULL, "gpupoolctl check failed");
        json_decref(j);
}

/* Publishes "weights" (OBJ bytes of pattern), then writes into it: the write must fault. */
static int publish_then_write(struct testd *d, void *arg) {
        gpupool_client *c;
        unsigned char *p;

        (void) arg;
        if (gpupool_connect(d->sock, "publisher", &c) < 0 || gpupool_alloc(c, 0, OBJ, (void **) &p) < 0)
                return 10;
        for (size_t i = 0; i < OBJ; i++)
                p[i] = pattern(i);
        if (gpupool_publish(c, "weights", p, OBJ) < 0)
                return 11;
        /* Still mapped here, read-only: reading works, writing faults (the process dies of it). */
        if (p[12345] != pattern(12345))
                return 12;
        signal(SIGSEGV, SIG_DFL);       /* the kernel's verdict, not a sanitizer's report of it */
        p[0] = 0;
        return 13;
}

/* Attaches "weights" and checks every byte; a write, or making the mapping writable, is refused. */
static int attach_and_read(struct testd *d, void *arg) {
        gpupool_client *c;
        const unsigned char *p;
        size_t size;
        pid_t pid;

        (void) arg;
        if (gpupool_connect(d->sock, "reader", &c) < 0 || gpupool_attach(c, "weights", (const void **) &p, &size) < 0)
                return 20;
        if (size != OBJ)
                return 21;
        for (size_t i = 0; i < size; i++)
                if (p[i] != pattern(i))
                        return 22;
        /* The descriptor was open for reading only: no mapping of it can be made writable. */
        if (mprotect((void *) p, size, PROT_READ | PROT_WRITE) == 0 || errno != EACCES)
                return 23;
        pid = fork();
        if (pid == 0) {
                signal(SIGSEGV, SIG_DFL);
                ((volatile unsigned char *) p)[1] = 1;  /* MADV_DONTFORK: not even mapped here */
                _exit(0);
        }
        if (pid < 0 || waitpid(pid, NULL, 0) != pid)
                return 24;
        if (gpupool_detach(c, p) < 0)
                return 25;
        gpupool_disconnect(c);
        return 0;
}

/*
 * A hostile attacher, on the raw protocol: the descriptor it is sent is read-only, and opening
 * the memory again for writing through /proc gets it nowhere: the object is sealed.
 */
static int write_through_proc(struct testd *d, void *arg) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__AttachRequest ar = GPUPOOL__ATTACH_REQUEST__INIT;
        char path[64];
        int sock, fd = -1, rw;

        (void) arg;
        sock = raw_hello(d, "hostile-reader");
        if (sock < 0)
                return 60;
        ar.name = "weights";
        env.body_case = GPUPOOL__ENVELOPE__BODY_ATTACH;
        env.attach = &ar;
        rep = raw_call_fd(sock, &env, &fd);
        if (!rep || rep->status != GPUPOOL__STATUS__STATUS_OK || fd < 0)
                return 61;
        if (fcntl(fd, F_GETFL) & O_ACCMODE)
                return 62;      /* not read-only */
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        rw = open(path, O_RDWR);
        if (rw >= 0 && (mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0) != MAP_FAILED ||
                        pwrite(rw, "x", 1, 0) == 1))
                return 63;      /* written */
        gpupool__envelope__free_unpacked(rep, NULL);
        return 0;
}

START_TEST(test_object_outlives_its_publisher) {
        gpupool_client *c;
        const unsigned char *p;
        size_t size;
        struct testd d;
        char out[4096];

        testd_start(&d, "--host-capacity", "256M", NULL);
        /* The publisher writes into its published block and dies of it: the object stays, detached. */
        ck_assert_int_eq(reap(spawn(publish_then_write, &d, NULL)), 128 + SIGSEGV);
        ck_assert_int_eq(object_field(&d, "weights", "size_bytes"), OBJ);
        ck_assert_int_eq(object_field(&d, "weights", "attachments"), 0);
        ck_assert_int_eq(object_field(&d, "weights", "uid"), (long long) getuid());
        /* No client holds it, and it counts to its tenant: reserved, in use, not cached. */
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), OBJ);
        ck_assert_int_eq(testd_device(&d, 0, "cached_bytes"), 0);
        ck_assert_int_eq(testd_device(&d, 0, "in_use_bytes"), OBJ);
        check_ok(&d);
        /* Another process maps it read-only, every byte as written; one that means to write cannot. */
        ck_assert_int_eq(reap(spawn(attach_and_read, &d, NULL)), 0);
        ck_assert_int_eq(reap(spawn(write_through_proc, &d, NULL)), 0);
        ck_assert_int_eq(object_field(&d, "weights", "attachments"), 0);
        /* Attached here twice: one mapping, counted; the daemon sees one attachment. */
        ck_assert_int_eq(gpupool_connect(d.sock, "holder", &c), 0);
        ck_assert_int_eq(gpupool_attach(c, "weights", (const void **) &p, &size), 0);
        {
                const void *q;
                size_t qs;

                ck_assert_int_eq(gpupool_attach(c, "weights", &q, &qs), 0);
                ck_assert_ptr_eq(q, p);
                ck_assert_int_eq(gpupool_detach(c, q), 0);
        }
        ck_assert_int_eq(object_field(&d, "weights", "attachments"), 1);
        snprintf(out, sizeof(out), "%s/gpupoolctl --socket %s objects", build_dir(), d.sock);
        ck_assert_int_eq(run_capture(out, out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "weights") && strstr(out, "16.0 MiB") && strstr(out, "default"), "%s", out);
        /* Unpublished while attached: the name is free at once, the memory stays until the detach. */
        snprintf(out, sizeof(out), "%s/gpupoolctl --socket %s unpublish weights", build_dir(), d.sock);
        ck_assert_int_eq(run_capture(out, out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "unpublished 'weights'"), "%s", out);
        ck_assert_int_eq(object_field(&d, "weights", "unpublished"), 1);
        ck_assert_int_eq(gpupool_attach(c, "weights", (const void **) &p, &size) == 0, 1);      /* its own mapping, counted */
        ck_assert_int_eq(gpupool_detach(c, p), 0);
        ck_assert_int_eq(p[777], pattern(777));
        ck_assert_int_eq(gpupool_detach(c, p), 0);
        ck_assert_int_eq(object_field(&d, "weights", "size_bytes"), -1);
        /* Sealed for good, the segment went back to the backend, not the cache. */
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 0);
        check_ok(&d);
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* A memfd named name in the test's store holding text (a record that is none, a segment alone). */
static void store_forged(struct fdstore *store, const char *name, const char *text) {
        int fd = memfd_create("forged", MFD_CLOEXEC);

        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t) strlen(text));
        ck_assert_uint_lt(store->n, FDSTORE_MAX);
        store->fds[store->n] = fd;
        snprintf(store->names[store->n++], sizeof(store->names[0]), "%s", name);
}

/*
 * Under systemd, an object outlives its daemon: the daemon keeps its segment and a record of it
 * in the service's descriptor store, and the daemon after a kill -9 (or a clean restart) takes
 * it over, name, size, tenant and bytes. What the store holds that is no object's is dropped,
 * saying so; an unpublished object leaves the store.
 */
START_TEST(test_object_outlives_daemon_restart) {
        struct fdstore *store = fdstore_new();
        gpupool_client *c, *holder;
        const unsigned char *q;
        unsigned char *p;
        struct testd d;
        size_t size;

        testd_start(&d, NULL);
        d.store = store;
        ck_assert_int_eq(gpupool_connect(d.sock, "publisher", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, OBJ, (void **) &p), 0);
        for (size_t i = 0; i < OBJ; i++)
                p[i] = pattern(i);
        ck_assert_int_eq(gpupool_publish_to(c, "weights", p, OBJ - 100, "inference,eval"), 0);
        gpupool_disconnect(c);
        ck_assert_uint_eq(fdstore_count(store), 2);     /* its segment and its record */
        /* A process keeps it attached across the restart: the daemon after counts it again. */
        ck_assert_int_eq(gpupool_connect(d.sock, "holder", &holder), 0);
        ck_assert_int_eq(gpupool_attach(holder, "weights", (const void **) &q, &size), 0);

        testd_crash(&d);
        store_forged(store, "gpupool-record-00000000000000aa", "not a record");
        store_forged(store, "gpupool-object-00000000000000bb", "a segment without a record");
        store_forged(store, "gpupool-record-00000000000000cc", "\x0a\xff not a record");
        store_forged(store, "gpupool-object-00000000000000cc", "its segment");
        store_forged(store, "gpupool-record-12zz", "a name that only starts like a record's");
        testd_relaunch(&d);
        ck_assert(testd_log_wait(&d, "object 'weights' (16.0 MiB on device 0, tenant default) taken over"));
        ck_assert(testd_log_wait(&d, "not taken over: systemd's store holds its record but not its segment"));
        ck_assert(testd_log_wait(&d, "gpupool-object-00000000000000bb, kept in systemd's store, is no object's: dropped"));
        ck_assert(testd_log_wait(&d, "not taken over: its record does not parse; its memory goes"));
        ck_assert(testd_log_wait(&d, "gpupool-record-12zz, kept in systemd's store, is no object's: dropped"));
        ck_assert_uint_eq(fdstore_count(store), 2);     /* the forged ones dropped */
        ck_assert_int_eq(object_field(&d, "weights", "size_bytes"), OBJ - 100);
        ck_assert_int_eq(object_field(&d, "weights", "uid"), (long long) getuid());
        {
                char out[4096];

                snprintf(out, sizeof(out), "%s/gpupoolctl --socket %s objects", build_dir(), d.sock);
                ck_assert_int_eq(run_capture(out, out, sizeof(out)), 0);
                ck_assert_msg(strstr(out, "readers: inference,eval"), "%s", out);       /* kept too */
        }
        for (double t0 = now_s(); object_field(&d, "weights", "attachments") != 1 && now_s() - t0 < 10;)
                nap_ms(20);
        ck_assert_int_eq(object_field(&d, "weights", "attachments"), 1);
        ck_assert_int_eq(q[4242], pattern(4242));
        ck_assert_int_eq(gpupool_detach(holder, q), 0);
        ck_assert_int_eq(object_field(&d, "weights", "attachments"), 0);
        gpupool_disconnect(holder);
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), OBJ);
        ck_assert_int_eq(testd_device(&d, 0, "in_use_bytes"), OBJ);
        check_ok(&d);
        ck_assert_int_eq(reap(spawn(write_through_proc, &d, NULL)), 0);         /* sealed still */

        /* A clean stop and start (systemctl restart) keeps it too. */
        kill(d.pid, SIGTERM);
        ck_assert_int_eq(waitpid(d.pid, NULL, 0), d.pid);
        testd_relaunch(&d);
        ck_assert_int_eq(gpupool_connect(d.sock, "reader", &c), 0);
        ck_assert_int_eq(gpupool_attach(c, "weights", (const void **) &q, &size), 0);
        ck_assert_uint_eq(size, OBJ - 100);
        for (size_t i = 0; i < size; i++)
                if (q[i] != pattern(i))
                        ck_abort_msg("byte %zu of the object changed across the restarts", i);
        ck_assert_int_eq(gpupool_detach(c, q), 0);
        ck_assert_int_eq(gpupool_unpublish(c, "weights"), 0);
        ck_assert_uint_eq(fdstore_count(store), 0);     /* gone from the store with it */
        ck_assert_int_eq(testd_device(&d, 0, "reserved_bytes"), 0);
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
        fdstore_free(store);
}
END_TEST

/*
 * An unpublish holds across a crash: v1 unpublished while a process still has it attached
 * leaves systemd's store at once, so that after a kill -9 the next daemon takes over v2, the
 * object now published under that name, and never the revoked v1.
 */
START_TEST(test_unpublish_survives_a_crash) {
        struct fdstore *store = fdstore_new();
        gpupool_client *c, *holder;
        const unsigned char *q, *r;
        unsigned char *p1, *p2;
        struct testd d;
        size_t size;

        testd_start(&d, NULL);
        d.store = store;
        ck_assert_int_eq(gpupool_connect(d.sock, "publisher", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, OBJ, (void **) &p1), 0);
        memset(p1, 1, OBJ);
        ck_assert_int_eq(gpupool_publish(c, "model", p1, OBJ), 0);
        ck_assert_int_eq(gpupool_connect(d.sock, "holder", &holder), 0);
        ck_assert_int_eq(gpupool_attach(holder, "model", (const void **) &q, &size), 0);
        ck_assert_int_eq(gpupool_unpublish(c, "model"), 0);
        ck_assert_uint_eq(fdstore_count(store), 0);     /* revoked: out of the store, though still attached */
        ck_assert_int_eq(gpupool_alloc(c, 0, OBJ, (void **) &p2), 0);
        memset(p2, 2, OBJ);
        ck_assert_int_eq(gpupool_publish(c, "model", p2, OBJ), 0);
        ck_assert_uint_eq(fdstore_count(store), 2);
        gpupool_disconnect(c);

        testd_crash(&d);
        testd_relaunch(&d);
        ck_assert(testd_log_wait(&d, "object 'model' (16.0 MiB on device 0, tenant default) taken over"));
        ck_assert_int_eq(gpupool_connect(d.sock, "reader", &c), 0);
        ck_assert_int_eq(gpupool_attach(c, "model", (const void **) &r, &size), 0);
        ck_assert_int_eq(r[4242], 2);   /* v2's bytes, not the revoked v1's */
        ck_assert_int_eq(q[4242], 1);   /* the holder's mapping is its own still */
        ck_assert_int_eq(gpupool_detach(c, r), 0);
        ck_assert_int_eq(gpupool_unpublish(c, "model"), 0);
        gpupool_disconnect(c);
        gpupool_disconnect(holder);
        ck_assert_uint_eq(fdstore_count(store), 0);
        check_ok(&d);
        ck_assert_int_eq(testd_stop(&d), 0);
        fdstore_free(store);
}
END_TEST

/* As uid (0: the test's own), publishes objects from to from + count - 1, long names and 16 long readers each, and stays. */
struct many {
        unsigned uid;
        int from, count;
        int ready[2];
};

static int publish_many(struct testd *d, void *arg) {
        struct many *m = arg;
        char name[256 + 16], readers[16 * 64 + 1]; /* room for any int: the compiler cannot know i < 1000 */
        gpupool_client *c;
        size_t n = 0;
        void *p;
        char x = 'y';

        if (m->uid && (setgid(m->uid) < 0 || setuid(m->uid) < 0))
                return 60;
        if (gpupool_connect(d->sock, "many", &c) < 0)
                return 61;
        for (int r = 0; r < 16; r++)
                n += (size_t) snprintf(readers + n, sizeof(readers) - n, "%s%c%062d", r ? "," : "", 'a' + r, r);
        for (int i = m->from; i < m->from + m->count; i++) {
                snprintf(name, sizeof(name), "%03d-%0251d", i, i);
                if (gpupool_alloc(c, 0, 11 * MiB, &p) < 0 || gpupool_publish_to(c, name, p, 11 * MiB, readers) < 0)
                        return 62;
        }
        if (write(m->ready[1], &x, 1) != 1)
                return 63;
        pause();
        return 0;
}

/*
 * The objects list works at any count: 130 objects (three uids' worth: one holds at most 64)
 * with 255-byte names and 16 readers of 63 bytes each pass the 160 KiB of one reply, and
 * gpupoolctl objects (and --json) lists every one, the daemon's replies in pages.
 */
START_TEST(test_objects_list_in_pages) {
        enum { COUNT = 130 };
        struct many m[3] = { { .uid = 0, .from = 0, .count = 50 }, { .uid = 65534, .from = 50, .count = 50 },
                             { .uid = 65533, .from = 100, .count = 30 } };
        pid_t pids[3];
        struct testd d;
        char *out, x;
        json_t *j;

        if (geteuid() != 0) {
                TEST_SKIP("publishing as three uids (one holds at most 64 objects) needs root");
                return;
        }
        testd_start(&d, "--host-capacity", "2G", NULL);
        ck_assert_int_eq(chmod(d.dir, 0755), 0);
        for (int i = 0; i < 3; i++) {
                ck_assert_int_eq(pipe(m[i].ready), 0);
                pids[i] = spawn(publish_many, &d, &m[i]);
                ck_assert_msg(read(m[i].ready[0], &x, 1) == 1, "publisher %d failed: %d", i, reap(pids[i]));
        }
        j = testd_ctl(&d, "objects");
        ck_assert_ptr_nonnull(j);
        ck_assert_uint_eq(json_array_size(json_object_get(j, "objects")), COUNT);
        json_decref(j);
        out = malloc(1 << 20);
        ck_assert_ptr_nonnull(out);
        snprintf(out, 1 << 20, "%s/gpupoolctl --socket %s objects", build_dir(), d.sock);
        ck_assert_int_eq(run_capture(out, out, 1 << 20), 0);
        ck_assert_msg(strstr(out, "129-000") && strstr(out, "000-000"), "%.300s", out);
        free(out);
        for (int i = 0; i < 3; i++) {
                kill(pids[i], SIGKILL);
                (void) reap(pids[i]);
                close(m[i].ready[0]);
                close(m[i].ready[1]);
        }
        check_ok(&d);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/*
 * Objects count against their publisher's limits: under --client-limit 64M, what one client
 * published counts with what it leases (a publish moves a segment out of its lease, not out
 * of what it holds), so it cannot publish its way past the limit; and one principal holds at
 * most 64 objects, so no one takes all of the node's 256.
 */
START_TEST(test_objects_count_against_their_publisher) {
        char why[GP_MAX_ERROR_BYTES], name[32];
        gpupool_client *c;
        struct testd d;
        void *p;
        int i, r;

        testd_start(&d, "--host-capacity", "1G", "--client-limit", "64M", NULL);
        ck_assert_int_eq(gpupool_connect(d.sock, "publisher", &c), 0);
        for (i = 0; i < 10; i++) {
                snprintf(name, sizeof(name), "part-%d", i);
                if ((r = gpupool_alloc(c, 0, 11 * MiB, &p)) < 0)
                        break;
                ck_assert_int_eq(gpupool_publish(c, name, p, 11 * MiB), 0);
        }
        /* Five segments of 12 MiB are 60 MiB; a sixth would be 72. */
        ck_assert_int_eq(i, 5);
        ck_assert_int_eq(r, -EDQUOT);
        gpupool_last_error(c, why, sizeof(why));
        ck_assert_msg(strstr(why, "over its limit of 64.0 MiB") && strstr(why, "60.0 MiB of it in named objects it published"),
                      "%s", why);
        for (i = 0; i < 5; i++) {
                snprintf(name, sizeof(name), "part-%d", i);
                ck_assert_int_eq(gpupool_unpublish(c, name), 0);
        }
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);

        testd_start(&d, "--host-capacity", "1G", NULL);
        ck_assert_int_eq(gpupool_connect(d.sock, "hoarder", &c), 0);
        for (i = 0; i < OBJECTS_PER_HOLDER + 1; i++) {
                snprintf(name, sizeof(name), "hoard-%d", i);
                ck_assert_int_eq(gpupool_alloc(c, 0, 11 * MiB, &p), 0);
                if ((r = gpupool_publish(c, name, p, 11 * MiB)) < 0)
                        break;
        }
        ck_assert_int_eq(i, OBJECTS_PER_HOLDER);
        ck_assert_int_eq(r, -EDQUOT);
        gpupool_last_error(c, why, sizeof(why));
        ck_assert_msg(strstr(why, "user 0 holds 64 named objects (published by any of her uids), the most one may (of the node's 256)"), "%s", why);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        gpupool_disconnect(c);
        check_ok(&d);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* Holds "kept" attached, then waits to be killed. */
static int attach_and_wait(struct testd *d, void *arg) {
        int *ready = arg;
        gpupool_client *c;
        const void *p;
        size_t size;
        char x = 'a';

        if (gpupool_connect(d->sock, "attacher", &c) < 0 || gpupool_attach(c, "kept", &p, &size) < 0)
                return 30;
        if (write(ready[1], &x, 1) != 1)
                return 31;
        pause();
        return 0;
}

START_TEST(test_unpublished_object_goes_when_the_last_attacher_dies) {
        gpupool_client *c;
        struct testd d;
        int ready[2];
        void *p;
        pid_t pid;
        char x;

        testd_start(&d, "--host-capacity", "256M", NULL);
        ck_assert_int_eq(gpupool_connect(d.sock, "owner", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, OBJ, &p), 0);
        ck_assert_int_eq(gpupool_publish(c, "kept", p, 4096), 0);
        ck_assert_int_eq(pipe(ready), 0);
        pid = spawn(attach_and_wait, &d, ready);
        ck_assert_int_eq(read(ready[0], &x, 1), 1);
        ck_assert_int_eq(gpupool_detach(c, p), 0);
        ck_assert_int_eq(gpupool_unpublish(c, "kept"), 0);
        ck_assert_int_eq(object_field(&d, "kept", "attachments"), 1);
        /* The operator sees what keeps it, and which process: ending that process ends it. */
        {
                json_t *j = testd_ctl(&d, "objects"), *o = json_array_get(json_object_get(j, "objects"), 0);

                ck_assert(json_is_true(json_object_get(o, "unpublished")));
                ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(o, "attached_pids"), 0)), pid);
                json_decref(j);
        }
        kill(pid, SIGKILL);
        ck_assert_int_eq(reap(pid), 128 + SIGKILL);
        ck_assert(testd_device_becomes(&d, 0, "reserved_bytes", 0));
        ck_assert_int_eq(object_field(&d, "kept", "size_bytes"), -1);
        check_ok(&d);
        gpupool_disconnect(c);
        close(ready[0]);
        close(ready[1]);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* The attacker of the pinned-publish test: its handles and blocks, and its two publishes' results at once. */
struct pinned {
        gpupool_client *c, *c2;
        unsigned char *p, *p2;
        int results[2];
};

static void *second_publish(void *arg) {
        struct pinned *a = arg;

        a->results[1] = gpupool_publish(a->c2, "pinned-too", a->p2, OBJ);
        return NULL;
}

/*
 * Pins a page of its block (vmsplice into a pipe it never reads: the kernel then waits about
 * 160 ms before it refuses a seal against writing) and publishes it, six times: each refused,
 * saying so, after the kernel's wait. Then two publishes of one uid at once: one is refused
 * at once ("one at a time per user", -EDQUOT), the other waits for the kernel's refusal.
 */
static int pinned_publisher(struct testd *d, void *arg) {
        struct pinned a = { 0 };
        char why[512];
        int pipes[2][2];
        pthread_t t;

        (void) arg;
        if (gpupool_connect(d->sock, "pinner", &a.c) < 0 || gpupool_connect(d->sock, "pinner-2", &a.c2) < 0 ||
            gpupool_alloc(a.c, 0, OBJ, (void **) &a.p) < 0 || gpupool_alloc(a.c2, 0, OBJ, (void **) &a.p2) < 0 ||
            pipe(pipes[0]) < 0 || pipe(pipes[1]) < 0)
                return 2;
        memset(a.p, 1, OBJ);
        memset(a.p2, 1, OBJ);
        if (vmsplice(pipes[0][1], &(struct iovec) { a.p, 4096 }, 1, 0) != 4096 ||
            vmsplice(pipes[1][1], &(struct iovec) { a.p2, 4096 }, 1, 0) != 4096)
                return 3;
        for (int i = 0; i < 6; i++) {
                double t0 = now_s();
                int r = gpupool_publish(a.c, "pinned", a.p, OBJ);

                gpupool_last_error(a.c, why, sizeof(why));
                if (r != -EINVAL || !strstr(why, "pinned") || now_s() - t0 < 0.1) {
                        fprintf(stderr, "pinned publish %d: %d after %.3f s: %s\n", i, r, now_s() - t0, why);
                        return 4;
                }
        }
        if (pthread_create(&t, NULL, second_publish, &a) != 0)
                return 5;
        a.results[0] = gpupool_publish(a.c, "pinned", a.p, OBJ);
        pthread_join(t, NULL);
        if (!((a.results[0] == -EDQUOT && a.results[1] == -EINVAL) || (a.results[0] == -EINVAL && a.results[1] == -EDQUOT))) {
                fprintf(stderr, "two publishes of one uid at once: %d and %d\n", a.results[0], a.results[1]);
                return 6;
        }
        gpupool_disconnect(a.c);
        gpupool_disconnect(a.c2);
        return 0;
}

/*
 * A client that pins pages of its segment and asks to publish it stalls nobody: the seal, which
 * the kernel makes wait for the pins, runs off the loop, so another client's round trips keep
 * their time: it waits a small part of the attack's time (on the loop, each publish held every
 * client ~160 ms, and the bystander waited most of it).
 */
START_TEST(test_pinned_publisher_stalls_nothing) {
        double lat[2000], t0, took, waited = 0;
        Gpupool__Envelope *rep;
        size_t n = 0;
        struct testd d;
        pid_t pid, reaped = 0;
        int sock, status = 0;

        if (under_valgrind()) {
                TEST_SKIP("valgrind runs one thread at a time: the seal on a thread of its own stalls the loop there");
                return;
        }

        testd_start(&d, "--host-capacity", "256M", NULL);
        sock = raw_hello(&d, "bystander");
        pid = spawn(pinned_publisher, &d, NULL);
        /* Round trips of a lease and its return, for as long as the attacker runs. */
        for (t0 = now_s(); n < 2000 && (reaped = waitpid(pid, &status, WNOHANG)) == 0 && now_s() - t0 < 20; n++) {
                uint64_t id;
                double t = now_s();

                rep = raw_lease(sock, 0, 2 * MiB);
                ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
                id = rep->lease_reply->segment_id;
                gpupool__envelope__free_unpacked(rep, NULL);
                rep = raw_return(sock, &id, 1, NULL);
                gpupool__envelope__free_unpacked(rep, NULL);
                lat[n] = now_s() - t;
                nap_ms(2);
        }
        if (reaped != pid)
                ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        took = now_s() - t0;
        ck_assert_uint_gt(n, 10);
        /* Each publish held the loop ~160 ms when the seal ran there (8 of them): the bystander waited most of the time. */
        for (size_t i = 0; i < n; i++)
                waited += lat[i];
        ck_assert_msg(waited < took / 4, "a bystander waited %.0f ms of %.0f in %zu round trips while a client's "
                      "publishes waited on pinned pages", waited * 1e3, took * 1e3, n);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the pinned publisher failed: %d", status);
        close(sock);
        check_ok(&d);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

START_TEST(test_object_bad_input) {
        char why[GP_MAX_ERROR_BYTES], name[300];
        gpupool_client *c;
        struct testd d;
        void *big, *small1, *small2;
        const void *q;
        size_t size;
        int fds;

        testd_start(&d, "--host-capacity", "256M", NULL);
        ck_assert_int_eq(gpupool_connect(d.sock, "bad", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, OBJ, &big), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 4096, &small1), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 4096, &small2), 0);
        fds = fds_from(0);
        memset(name, 'n', 256);
        name[256] = '\0';
        ck_assert_int_eq(gpupool_publish(c, name, big, OBJ), -EINVAL);
        gpupool_last_error(c, why, sizeof(why));
        ck_assert_msg(strstr(why, "1 to 255 bytes of UTF-8"), "%s", why);
        ck_assert_int_eq(gpupool_publish(c, "", big, OBJ), -EINVAL);
        ck_assert_int_eq(gpupool_publish(c, "bad\xff", big, OBJ), -EINVAL);
        ck_assert_int_eq(gpupool_publish(c, "tab\there", big, OBJ), -EINVAL);
        ck_assert_int_eq(gpupool_publish(c, "inside", (char *) big + 4096, 4096), -ENOENT);
        gpupool_last_error(c, why, sizeof(why));
        ck_assert_msg(strstr(why, "is not a live block of this client"), "%s", why);
        ck_assert_int_eq(gpupool_publish(c, "shared", small1, 4096), -EINVAL);
        gpupool_last_error(c, why, sizeof(why));
        ck_assert_msg(strstr(why, "shares its segment with other blocks"), "%s", why);
        ck_assert_int_eq(gpupool_publish(c, "zero", big, 0), -EINVAL);
        ck_assert_int_eq(gpupool_publish(c, "over", big, OBJ + 1), -EINVAL);
        gpupool_last_error(c, why, sizeof(why));
        ck_assert_msg(strstr(why, "is not within the block"), "%s", why);
        ck_assert_int_eq(gpupool_publish_to(c, "readers", big, OBJ, "ml,bad name"), -EINVAL);
        gpupool_last_error(c, why, sizeof(why));
        ck_assert_msg(strstr(why, "each '*' (every client of the node) or a tenant's name"), "%s", why);
        ck_assert_int_eq(gpupool_publish_to(c, "readers", big, OBJ, "a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q"), -EINVAL);
        ck_assert_int_eq(gpupool_publish_to(c, "readers", big, OBJ, "ml,,eval"), -EINVAL);
        {
                /* The daemon checks them too: a peer need not be libgpupool. */
                Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT, *rep;
                Gpupool__PublishRequest pr = GPUPOOL__PUBLISH_REQUEST__INIT;
                char *readers[] = { "ml", "no/slash" };
                int sock = raw_hello(&d, "raw-publisher");

                rep = raw_lease(sock, 0, OBJ);
                ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
                pr.name = "raw";
                pr.segment_id = rep->lease_reply->segment_id;
                pr.size = 4096;
                pr.readers = readers;
                pr.n_readers = 2;
                gpupool__envelope__free_unpacked(rep, NULL);
                env.body_case = GPUPOOL__ENVELOPE__BODY_PUBLISH;
                env.publish = &pr;
                rep = raw_call(sock, &env);
                ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_INVALID);
                ck_assert_msg(strstr(rep->error, "each '*' (every client) or a tenant's name"), "%s", rep->error);
                gpupool__envelope__free_unpacked(rep, NULL);
                close(sock);
        }
        ck_assert_int_eq(gpupool_attach(c, "nothing", &q, &size), -ENOENT);
        gpupool_last_error(c, why, sizeof(why));
        ck_assert_msg(strstr(why, "no object named 'nothing'"), "%s", why);
        ck_assert_int_eq(gpupool_detach(c, big), -ENOENT);
        ck_assert_int_eq(gpupool_unpublish(c, "nothing"), -ENOENT);
        /* Nothing refused took a block or a descriptor: each is still the application's. */
        ck_assert_int_eq(fds_from(0), fds);
        memset(big, 1, OBJ);
        ck_assert_int_eq(gpupool_publish(c, "taken", big, OBJ), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, OBJ, &big), 0);
        ck_assert_int_eq(gpupool_publish(c, "taken", big, OBJ), -EINVAL);
        gpupool_last_error(c, why, sizeof(why));
        ck_assert_msg(strstr(why, "this uid has an object named 'taken' already"), "%s", why);
        ck_assert_int_eq(gpupool_free(c, big), 0);
        ck_assert_int_eq(gpupool_free(c, small1), 0);
        ck_assert_int_eq(gpupool_free(c, small2), 0);
        check_ok(&d);
        /* Its publisher's disconnect detaches it; the object stays. */
        gpupool_disconnect(c);
        ck_assert_int_eq(object_field(&d, "taken", "attachments"), 0);
        /* Segments that grow in place cannot publish yet, and say so. */
        setenv("GPUPOOL_SEGMENTS", "grow", 1);
        ck_assert_int_eq(gpupool_connect(d.sock, "grower", &c), 0);
        unsetenv("GPUPOOL_SEGMENTS");
        ck_assert_msg(gpupool_alloc(c, 0, OBJ, &big) == 0, "%s", (gpupool_last_error(c, why, sizeof(why)), why));
        ck_assert_int_eq(gpupool_publish(c, "grown", big, OBJ), -EOPNOTSUPP);
        gpupool_last_error(c, why, sizeof(why));
        ck_assert_msg(strstr(why, "need whole segments"), "%s", why);
        ck_assert_int_eq(gpupool_free(c, big), 0);
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/*
 * idle_objects: an object nobody has attached that long goes when a lease needs the memory,
 * after the cache, and a later attach says so; one attached never goes; without the setting,
 * none does.
 */
/* A client (client_name) that publishes 40 MiB as name, and detaches it or keeps it attached. */
static gpupool_client *publish_40m(struct testd *d, const char *client_name, const char *name, bool detach) {
        gpupool_client *c;
        void *p;

        ck_assert_int_eq(gpupool_connect(d->sock, client_name, &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 40 * MiB, &p), 0);
        ck_assert_int_eq(gpupool_publish(c, name, p, 40 * MiB), 0);
        if (detach)
                ck_assert_int_eq(gpupool_detach(c, p), 0);
        return c;
}

START_TEST(test_idle_object_evicted_under_pressure) {
        char why[GP_MAX_ERROR_BYTES];
        gpupool_client *pub, *c;
        const void *q;
        struct testd d;
        size_t size;
        void *big;

        for (int attached = 0; attached < 2; attached++) {
                testd_start(&d, "--host-capacity", "64M", "--idle-objects", "100ms", NULL);
                pub = publish_40m(&d, "pub", "idle", !attached);
                nap_ms(150);
                ck_assert_int_eq(gpupool_connect(d.sock, "needy", &c), 0);
                if (attached) {
                        /* Attached: never evicted, and the lease is refused as the device is full. */
                        ck_assert_int_eq(gpupool_alloc(c, 0, 40 * MiB, &big), -ENOMEM);
                        ck_assert_int_eq(object_field(&d, "idle", "attachments"), 1);
                } else {
                        ck_assert_int_eq(gpupool_alloc(c, 0, 40 * MiB, &big), 0);
                        ck_assert_int_eq(object_field(&d, "idle", "size_bytes"), -1);
                        ck_assert_int_eq(gpupool_attach(c, "idle", &q, &size), -ENOENT);
                        gpupool_last_error(c, why, sizeof(why));
                        ck_assert_msg(strstr(why, "object 'idle' was evicted") && strstr(why, "idle_objects"), "%s", why);
                        ck_assert_int_eq(gpupool_free(c, big), 0);
                }
                check_ok(&d);
                gpupool_disconnect(c);
                gpupool_disconnect(pub);
                ck_assert_int_eq(testd_stop(&d), 0);
        }
        /* An object within its tenant's guarantee goes for that tenant's leases only. */
        testd_start(&d, "--config", conf_new("[tenant:keep]\nmatch_name = keep-*\nguarantee = 40M\n"), "--host-capacity", "64M",
                    "--idle-objects", "100ms", NULL);
        pub = publish_40m(&d, "keep-pub", "guarded", true);
        nap_ms(150);
        ck_assert_int_eq(gpupool_connect(d.sock, "outsider", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 40 * MiB, &big), -ENOMEM);
        ck_assert_int_eq(object_field(&d, "guarded", "size_bytes"), 40 * MiB);
        gpupool_disconnect(c);
        ck_assert_int_eq(gpupool_connect(d.sock, "keep-worker", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 40 * MiB, &big), 0);
        ck_assert_int_eq(object_field(&d, "guarded", "size_bytes"), -1);
        check_ok(&d);
        gpupool_disconnect(c);
        gpupool_disconnect(pub);
        ck_assert_int_eq(testd_stop(&d), 0);
        conf_remove();
        /* Without idle_objects (the default), an idle object stays and the lease is refused. */
        testd_start(&d, "--host-capacity", "64M", NULL);
        pub = publish_40m(&d, "pub", "kept", true);
        ck_assert_int_eq(gpupool_connect(d.sock, "needy", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 40 * MiB, &big), -ENOMEM);
        ck_assert_int_eq(object_field(&d, "kept", "size_bytes"), 40 * MiB);
        gpupool_disconnect(c);
        gpupool_disconnect(pub);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* As uid 65534: attaching or unpublishing root's object is refused, saying whose it is. */
static int foreign(struct testd *d, void *arg) {
        char why[GP_MAX_ERROR_BYTES];
        gpupool_client *c;
        const void *p;
        size_t size;

        (void) arg;
        if (setgid(65534) < 0 || setuid(65534) < 0)
                return 40;
        if (gpupool_connect(d->sock, "stranger", &c) < 0)
                return 41;
        int r = gpupool_attach(c, "private", &p, &size);
        unsigned uid;

        /* Another uid's object is never found by its name alone: the name is this uid's to use. */
        gpupool_last_error(c, why, sizeof(why));
        if (r != -ENOENT || !strstr(why, "no object named 'private' of uid 65534; uid 0 publishes one")) {
                fprintf(stderr, "foreign attach by name: %d: %s\n", r, why);
                return 42;
        }
        r = gpupool_attach_of(c, "private", 0, &p, &size);
        gpupool_last_error(c, why, sizeof(why));
        if (r != -EACCES || !strstr(why, "object 'private' is for uid 0 and tenant default: not for uid 65534")) {
                fprintf(stderr, "foreign attach of uid 0: %d: %s\n", r, why);
                return 43;
        }
        if (gpupool_unpublish(c, "private") != -ENOENT)
                return 44;
        /* Published for every client ("*"): attached naming its publisher, read-only as for anyone, and said whose. */
        if (gpupool_attach(c, "open", &p, &size) != -ENOENT || gpupool_attach_of(c, "open", 0, &p, &size) != 0 ||
            size != 4096 || gpupool_object_publisher(c, p, &uid, why, sizeof(why)) != 0 || uid != 0 ||
            strcmp(why, "default") != 0 || gpupool_detach(c, p) != 0)
                return 45;
        /* For tenant ml's clients: this one is default's. */
        if (gpupool_attach_of(c, "for-ml", 0, &p, &size) != -EACCES)
                return 46;
        gpupool_disconnect(c);
        return 0;
}

START_TEST(test_foreign_object_refused) {
        gpupool_client *c;
        struct testd d;
        void *p;

        if (geteuid() != 0) {
                TEST_SKIP("switching uid needs root");
                return;
        }
        testd_start(&d, "--host-capacity", "256M", NULL);
        ck_assert_int_eq(chmod(d.dir, 0755), 0);
        ck_assert_int_eq(gpupool_connect(d.sock, "private-owner", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, OBJ, &p), 0);
        ck_assert_int_eq(gpupool_publish(c, "private", p, OBJ), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, OBJ, &p), 0);
        ck_assert_int_eq(gpupool_publish_to(c, "open", p, 4096, "*"), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, OBJ, &p), 0);
        ck_assert_int_eq(gpupool_publish_to(c, "for-ml", p, 4096, "ml"), 0);
        ck_assert_int_eq(reap(spawn(foreign, &d, NULL)), 0);
        ck_assert_int_eq(object_field(&d, "private", "attachments"), 1);
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* As uid 65534, before the real job: publishes the job's object name, for every client, with bytes of its own. */
static int squatter(struct testd *d, void *arg) {
        int *ready = arg;
        gpupool_client *c;
        unsigned char *p;
        char x = 's';

        if (setgid(65534) < 0 || setuid(65534) < 0)
                return 50;
        if (gpupool_connect(d->sock, "squatter", &c) < 0 || gpupool_alloc(c, 0, OBJ, (void **) &p) < 0)
                return 51;
        memset(p, 0xee, OBJ);
        if (gpupool_publish_to(c, "llama-70b-weights", p, OBJ, "*") < 0)
                return 52;
        /* A look-alike of the name (a right-to-left override in it) is refused. */
        if (gpupool_alloc(c, 0, OBJ, (void **) &p) < 0 ||
            gpupool_publish_to(c, "llama-70b\xe2\x80\xae-weights", p, OBJ, "*") != -EINVAL)
                return 53;
        if (write(ready[1], &x, 1) != 1)
                return 54;
        pause();
        return 0;
}

/*
 * Names cannot be squatted: another uid publishing the job's object name first (for every
 * client) takes nothing from the job, whose publish of that name succeeds and whose workers
 * attach exactly its bytes, learning who published them; the squatter's object is reached
 * only by naming its publisher.
 */
START_TEST(test_object_names_cannot_be_squatted) {
        const unsigned char *q;
        gpupool_client *c, *w;
        char tenant[64], why[GP_MAX_ERROR_BYTES];
        unsigned char *p;
        struct testd d;
        unsigned uid;
        int ready[2];
        size_t size;
        pid_t pid;
        char x;

        if (geteuid() != 0) {
                TEST_SKIP("switching uid needs root");
                return;
        }
        testd_start(&d, "--host-capacity", "256M", NULL);
        ck_assert_int_eq(chmod(d.dir, 0755), 0);
        ck_assert_int_eq(pipe(ready), 0);
        pid = spawn(squatter, &d, ready);
        ck_assert_int_eq(read(ready[0], &x, 1), 1);
        /* The real job (root) publishes its weights under the name the squatter took first. */
        ck_assert_int_eq(gpupool_connect(d.sock, "job", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, OBJ, (void **) &p), 0);
        memset(p, 0x11, OBJ);
        ck_assert_int_eq(gpupool_publish_to(c, "llama-70b-weights", p, OBJ, "*"), 0);
        /* Its worker gets its bytes, and can tell whose they are. */
        ck_assert_int_eq(gpupool_connect(d.sock, "worker", &w), 0);
        ck_assert_int_eq(gpupool_attach(w, "llama-70b-weights", (const void **) &q, &size), 0);
        ck_assert_int_eq(q[12345], 0x11);
        ck_assert_int_eq(gpupool_object_publisher(w, q, &uid, tenant, sizeof(tenant)), 0);
        ck_assert_uint_eq(uid, getuid());
        ck_assert_int_eq(gpupool_detach(w, q), 0);
        /* The squatter's is reached only by naming it. */
        ck_assert_int_eq(gpupool_attach_of(w, "llama-70b-weights", 65534, (const void **) &q, &size), 0);
        ck_assert_int_eq(q[12345], 0xee);
        ck_assert_int_eq(gpupool_detach(w, q), 0);
        /* The operator ends the squatter's object by its publisher; the job's stays. */
        snprintf(why, sizeof(why), "%s/gpupoolctl --socket %s unpublish llama-70b-weights --uid 65534 >/dev/null 2>&1",
                 build_dir(), d.sock);
        ck_assert_int_eq(system(why), 0);
        ck_assert_int_eq(gpupool_attach_of(w, "llama-70b-weights", 65534, (const void **) &q, &size), -ENOENT);
        ck_assert_int_eq(gpupool_attach(w, "llama-70b-weights", (const void **) &q, &size), 0);
        ck_assert_int_eq(q[12345], 0x11);
        ck_assert_int_eq(gpupool_detach(w, q), 0);
        gpupool_disconnect(w);
        gpupool_disconnect(c);
        kill(pid, SIGKILL);
        (void) reap(pid);
        close(ready[0]);
        close(ready[1]);
        check_ok(&d);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* As uid 65534, of tenant team by its client name: attaches team's object (another uid's). */
static int teammate(struct testd *d, void *arg) {
        gpupool_client *c;
        const unsigned char *p;
        size_t size;

        (void) arg;
        if (setgid(65534) < 0 || setuid(65534) < 0)
                return 50;
        if (gpupool_connect(d->sock, "team-reader", &c) < 0)
                return 51;
        if (gpupool_attach(c, "shared-weights", (const void **) &p, &size) < 0 || size != 4096 || p[100] != pattern(100))
                return 52;
        if (gpupool_detach(c, p) < 0)
                return 53;
        gpupool_disconnect(c);
        return 0;
}

/* A configured tenant shares its objects across uids; its publisher's object counts to it. */
START_TEST(test_tenant_shares_its_objects) {
        gpupool_client *c;
        struct testd d;
        unsigned char *p;

        if (geteuid() != 0) {
                TEST_SKIP("switching uid needs root");
                return;
        }
        testd_start(&d, "--config", conf_new("[tenant:team]\nmatch_name = team-*\n"), "--host-capacity", "256M", NULL);
        ck_assert_int_eq(chmod(d.dir, 0755), 0);
        ck_assert_int_eq(gpupool_connect(d.sock, "team-loader", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, OBJ, (void **) &p), 0);
        for (size_t i = 0; i < 4096; i++)
                p[i] = pattern(i);
        ck_assert_int_eq(gpupool_publish(c, "shared-weights", p, 4096), 0);
        ck_assert_int_eq(gpupool_detach(c, p), 0);
        gpupool_disconnect(c);
        {
                json_t *j = testd_ctl(&d, "limits"), *t;
                size_t i;
                long long reserved = -1;

                json_array_foreach(json_object_get(j, "tenants"), i, t)
                        if (strcmp(json_string_value(json_object_get(t, "name")), "team") == 0)
                                reserved = json_integer_value(json_array_get(json_object_get(t, "reserved_bytes"), 0));
                json_decref(j);
                ck_assert_int_eq(reserved, OBJ);        /* no client of team is left: the object's */
        }
        ck_assert_int_eq(reap(spawn(teammate, &d, NULL)), 0);
        check_ok(&d);
        ck_assert_int_eq(testd_stop(&d), 0);
        conf_remove();
}
END_TEST

/* As uid *arg: publishes 64 objects of 4 KiB, or (uid 3004) one more after the table is full; 0, or the step that failed. */
static int publish_as(struct testd *d, void *arg) {
        unsigned uid = *(unsigned *) arg;
        gpupool_client *c;
        char name[32], why[512];
        unsigned n = uid == 3004 ? 1 : 64;
        void *p;
        int r;

        if (setgid(uid) < 0 || setuid(uid) < 0 || gpupool_connect(d->sock, "filler", &c) < 0)
                return 1;
        for (unsigned k = 0; k < n; k++) {
                snprintf(name, sizeof(name), "t%u-%u", uid, k);
                if (gpupool_alloc(c, 0, 4096, &p) < 0)
                        return 2;
                memset(p, 7, 4096);
                r = gpupool_publish(c, name, p, 4096);
                if (uid != 3004 && r < 0)
                        return 10;
        }
        if (uid == 3004) {
                /* Refused before its seal: the block is still the process's, writable, and frees. */
                gpupool_last_error(c, why, sizeof(why));
                if (r != -EDQUOT || !strstr(why, "the node holds 256 named objects, the most it may (256)"))
                        return 20;
                memset(p, 9, 4096);
                if (((unsigned char *) p)[4095] != 9 || gpupool_free(c, p) != 0)
                        return 21;
        }
        gpupool_disconnect(c);
        return 0;
}

/*
 * A publish refused because the node's table is full is refused before its segment is sealed:
 * it was refused after, and the publisher lost the block (read-only for good, -EROFS).
 */
START_TEST(test_full_table_refused_before_the_seal) {
        struct testd d;
        unsigned uid;

        if (geteuid() != 0) {
                TEST_SKIP("publishing as four other uids needs root");
                return;
        }
        testd_start(&d, "--host-capacity", "1G", NULL);
        ck_assert_int_eq(chmod(d.dir, 0755), 0);        /* let the other uids reach the socket */
        for (uid = 3000; uid < 3004; uid++)
                ck_assert_int_eq(reap(spawn(publish_as, &d, &uid)), 0);
        ck_assert_int_eq(reap(spawn(publish_as, &d, &uid)), 0);
        check_ok(&d);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

Suite *suite_objects(void) {
        Suite *s = suite_create("objects");
        TCase *tc = tcase_create("host");

        tcase_add_test(tc, test_object_outlives_its_publisher);
        tcase_add_test(tc, test_unpublished_object_goes_when_the_last_attacher_dies);
        tcase_add_test(tc, test_object_bad_input);
        tcase_add_test(tc, test_pinned_publisher_stalls_nothing);
        tcase_add_test(tc, test_unpublish_survives_a_crash);
        tcase_add_test(tc, test_objects_list_in_pages);
        tcase_add_test(tc, test_objects_count_against_their_publisher);
        tcase_add_test(tc, test_foreign_object_refused);
        tcase_add_test(tc, test_object_names_cannot_be_squatted);
        tcase_add_test(tc, test_idle_object_evicted_under_pressure);
        tcase_add_test(tc, test_tenant_shares_its_objects);
        tcase_add_test(tc, test_object_outlives_daemon_restart);
        tcase_add_test(tc, test_full_table_refused_before_the_seal);
        tcase_set_timeout(tc, 30);     /* restarts and 16 MiB checked byte by byte, under a sanitizer too */
        suite_add_tcase(s, tc);
        return s;
}
