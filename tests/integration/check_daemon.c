/*
 * check_daemon.c: gpupoold end to end with real client processes on the host backend:
 * concurrent clients never overlap, killed clients' memory returns (only after they exit),
 * limits, flush, goodbye, bad frees, refusals, threads, restarts and the CLI. Granule leases
 * on the wire are in check_leases.c.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpupool.h"
#include "suites.h"
#include "testlib.h"

#define MiB (1ULL << 20)

/* Fills a block with a pattern only its owner and step produce. */
static void fill(void *p, size_t size, unsigned tag) {
        uint32_t *w = p;

        for (size_t i = 0; i < size / 4; i++)
                w[i] = tag * 2654435761u + (uint32_t) i;
}

static bool intact(const void *p, size_t size, unsigned tag) {
        const uint32_t *w = p;

        for (size_t i = 0; i < size / 4; i++)
                if (w[i] != tag * 2654435761u + (uint32_t) i)
                        return false;
        return true;
}

struct churn {
        int index;
        int steps;
};

/* A client that allocates, writes, checks and frees in random order. Exit 0 when all held. */
static int churn_client(struct testd *d, void *arg) {
        enum { LIVE = 24 };
        struct churn *c = arg;
        struct { void *p; size_t size; unsigned tag; } live[LIVE] = { 0 };
        unsigned seed = (unsigned) c->index * 7919u + 1;
        gpupool_client *client;
        char name[32];

        snprintf(name, sizeof(name), "churn-%d", c->index);
        if (gpupool_connect(d->sock, name, &client) < 0)
                return 10;
        for (int step = 0; step < c->steps; step++) {
                int s = (int) (rand_r(&seed) % LIVE);

                if (live[s].p) {
                        if (!intact(live[s].p, live[s].size, live[s].tag))
                                return 11;
                        if (gpupool_free(client, live[s].p) < 0)
                                return 12;
                        live[s].p = NULL;
                } else {
                        size_t size = rand_r(&seed) % 4 == 0 ? 1 + (size_t) rand_r(&seed) % (3 * MiB) : 4 + (size_t) rand_r(&seed) % 65536;

                        size &= ~(size_t) 3;
                        if (size == 0)
                                size = 4;
                        if (gpupool_alloc(client, 0, size, &live[s].p) < 0)
                                return 13;
                        live[s].size = size;
                        live[s].tag = (unsigned) (c->index << 20) + (unsigned) step;
                        fill(live[s].p, size, live[s].tag);
                }
        }
        for (int s = 0; s < LIVE; s++)
                if (live[s].p && !intact(live[s].p, live[s].size, live[s].tag))
                        return 14;
        gpupool_disconnect(client);
        return 0;
}

START_TEST(test_concurrent_clients_never_overlap) {
        enum { CLIENTS = 6 };
        struct churn args[CLIENTS];
        pid_t pids[CLIENTS];
        struct testd d;
        json_t *st;

        testd_start(&d, NULL);
        for (int i = 0; i < CLIENTS; i++) {
                args[i] = (struct churn) { .index = i, .steps = 600 };
                pids[i] = spawn(churn_client, &d, &args[i]);
        }
        for (int i = 0; i < CLIENTS; i++)
                ck_assert_msg(reap(pids[i]) == 0, "client %d found its memory changed or failed", i);
        ck_assert(testd_alive(&d));
        st = testd_ctl(&d, "status");
        ck_assert_int_eq(json_array_size(json_object_get(st, "clients")), 0);
        ck_assert_int_eq(status_device(st, "in_use_bytes"), 0);
        ck_assert_int_eq(status_device(st, "reserved_bytes"), status_device(st, "cached_bytes"));
        json_decref(st);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* Holds 4 MiB and more, says so on the pipe, then waits to be killed. */
static int holder_client(struct testd *d, void *arg) {
        int *fds = arg;
        gpupool_client *client;
        void *p, *q;

        if (gpupool_connect(d->sock, "holder", &client) < 0 || gpupool_alloc(client, 0, 4 * MiB, &p) < 0 ||
            gpupool_alloc(client, 0, 1000, &q) < 0)
                return 1;
        fill(p, 4 * MiB, 1);
        if (write(fds[1], "x", 1) != 1)
                return 2;
        for (;;)
                pause();
}

START_TEST(test_kill9_memory_returns) {
        struct testd d;
        json_t *st, *c;
        int fds[2];
        char ch;
        pid_t pid;
        double t0;
        bool freed = false;

        testd_start(&d, NULL);
        ck_assert_int_eq(pipe(fds), 0);
        pid = spawn(holder_client, &d, fds);
        ck_assert_int_eq(read(fds[0], &ch, 1), 1);
        st = testd_ctl(&d, "status");
        c = status_client_by_pid(st, pid);
        ck_assert_ptr_nonnull(c);
        ck_assert_str_eq(json_string_value(json_object_get(c, "name")), "holder");
        /* Its pool carves both blocks: the daemon knows the segments it leases. */
        ck_assert_int_ge(json_integer_value(json_object_get(c, "reserved_bytes")), 4 * MiB + 512);
        ck_assert_int_ge(json_integer_value(json_object_get(c, "in_use_bytes")), 4 * MiB);
        json_decref(st);

        kill(pid, SIGKILL);
        ck_assert_int_eq(reap(pid), 128 + SIGKILL);
        t0 = now_s();
        while (now_s() - t0 < 1.0 && !freed) {
                st = testd_ctl(&d, "status");
                freed = !status_client_by_pid(st, pid) && status_device(st, "in_use_bytes") == 0;
                json_decref(st);
        }
        ck_assert_msg(freed, "the killed client's memory was not free within a second of its exit");
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* Leases over raw protocol, closes its socket, and stays alive until told to go. */
static int closer_client(struct testd *d, void *arg) {
        int *fds = arg, sock = raw_hello(d, "closer");
        Gpupool__Envelope *rep = raw_lease(sock, 0, 3 * MiB);
        char ch;

        if (rep->status != GPUPOOL__STATUS__STATUS_OK)
                return 1;
        gpupool__envelope__free_unpacked(rep, NULL);
        close(sock);
        if (write(fds[1], "x", 1) != 1 || read(fds[2], &ch, 1) != 1)
                return 2;
        return 0;
}

START_TEST(test_memory_held_until_process_exits) {
        struct testd d;
        int fds[4], go[2];
        json_t *st, *c;
        pid_t pid;
        char ch;
        double t0;
        bool freed = false;

        testd_start(&d, NULL);
        ck_assert_int_eq(pipe(fds), 0);
        ck_assert_int_eq(pipe(go), 0);
        fds[2] = go[0];
        fds[3] = go[1];
        pid = spawn(closer_client, &d, fds);
        ck_assert_int_eq(read(fds[0], &ch, 1), 1);
        /* The socket is closed but the process lives: its memory must stay out of reach. */
        st = testd_ctl(&d, "status");
        c = status_client_by_pid(st, pid);
        ck_assert_ptr_nonnull(c);
        ck_assert_int_ge(json_integer_value(json_object_get(c, "reserved_bytes")), 3 * MiB);
        ck_assert_int_eq(status_device(st, "cached_bytes"), 0);
        json_decref(st);
        ck_assert_int_eq(write(go[1], "x", 1), 1);
        ck_assert_int_eq(reap(pid), 0);
        t0 = now_s();
        while (now_s() - t0 < 1.0 && !freed) {
                st = testd_ctl(&d, "status");
                freed = !status_client_by_pid(st, pid) && status_device(st, "in_use_bytes") == 0 &&
                        status_device(st, "cached_bytes") == status_device(st, "reserved_bytes");
                json_decref(st);
        }
        ck_assert(freed);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

START_TEST(test_client_limit) {
        static char log[8192];
        gpupool_client *c;
        void *p[3];
        char msg[512];
        struct testd d;
        json_t *st, *cl;

        testd_start(&d, "--client-limit", "16M", NULL);
        ck_assert_int_eq(gpupool_connect(d.sock, "limited", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 6 * MiB, &p[0]), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 6 * MiB, &p[1]), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 6 * MiB, &p[2]), -EDQUOT);
        gpupool_last_error(c, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, "limit of 16.0 MiB") && strstr(msg, "--client-limit"), "message: %s", msg);
        /* Within the segments it has, the client still allocates. */
        ck_assert_int_eq(gpupool_free(c, p[1]), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 6 * MiB, &p[1]), 0);
        /* The device as the client may use it: its limit, and nothing more to take once at it. */
        {
                uint64_t free_bytes, total;

                ck_assert_int_eq(gpupool_device_memory(c, 0, &free_bytes, &total), 0);
                ck_assert_uint_eq(total, 16 * MiB);
                ck_assert_uint_le(free_bytes, 16 * MiB - 12 * MiB);
                ck_assert_int_eq(gpupool_device_memory(c, 7, &free_bytes, &total), -ENODEV);
                ck_assert_int_eq(gpupool_device_memory(c, 0, NULL, &total), -EINVAL);
        }
        /* A query for a device the daemon does not have: refused, saying so, and the session goes on. */
        {
                Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT, *rep;
                Gpupool__MemInfoRequest mr = GPUPOOL__MEM_INFO_REQUEST__INIT;
                int sock = raw_hello(&d, "asker");

                mr.device = 99;
                env.id = 2;
                env.body_case = GPUPOOL__ENVELOPE__BODY_MEM_INFO;
                env.mem_info = &mr;
                rep = raw_call(sock, &env);
                ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_NO_DEVICE);
                ck_assert_msg(rep->error && strstr(rep->error, "no device 99"), "%s", rep->error);
                gpupool__envelope__free_unpacked(rep, NULL);
                mr.device = 0;
                env.id = 3;
                rep = raw_call(sock, &env);
                ck_assert_int_eq(rep->status, GPUPOOL__STATUS__STATUS_OK);
                ck_assert_int_eq(rep->body_case, GPUPOOL__ENVELOPE__BODY_MEM_INFO_REPLY);
                ck_assert(rep->mem_info_reply->has_may_lease_bytes && rep->mem_info_reply->may_lease_bytes == 16 * MiB);
                gpupool__envelope__free_unpacked(rep, NULL);
                close(sock);
        }
        st = testd_ctl(&d, "status");
        cl = status_client_by_pid(st, getpid());
        ck_assert_ptr_nonnull(cl);
        ck_assert_int_eq(json_integer_value(json_object_get(cl, "limit_bytes")), 16 * MiB);
        ck_assert_int_le(json_integer_value(json_object_get(cl, "reserved_bytes")), 16 * MiB);
        json_decref(st);
        gpupool_disconnect(c);
        /* The refusal and the disconnect each made one line, at info, with who and why. */
        ck_assert(testd_log_wait(&d, "tenant default) disconnected: "));
        read_text(d.log, log, sizeof(log));
        ck_assert_msg(strstr(log, "('limited', pid ") && strstr(log, "6291456 bytes on device 0 refused: ") &&
                      strstr(log, "tenant default) disconnected: "), "%s", log);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* A ChargeRequest on sock: device, bytes, a release or not; the reply's status (its sentence into why). */
static int raw_charge(int sock, uint64_t id, uint32_t device, uint64_t bytes, bool release, char *why, size_t why_size) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__ChargeRequest cr = GPUPOOL__CHARGE_REQUEST__INIT;
        int status;

        cr.device = device;
        cr.bytes = bytes;
        cr.has_release = release;
        cr.release = release;
        env.id = id;
        env.body_case = GPUPOOL__ENVELOPE__BODY_CHARGE;
        env.charge = &cr;
        rep = raw_call(sock, &env);
        ck_assert_ptr_nonnull(rep);
        status = rep->status;
        snprintf(why, why_size, "%s", rep->error ? rep->error : "");
        if (status == GPUPOOL__STATUS__STATUS_OK)
                ck_assert_int_eq(rep->body_case, GPUPOOL__ENVELOPE__BODY_CHARGE_REPLY);
        gpupool__envelope__free_unpacked(rep, NULL);
        return status;
}

/* The default tenant's charged bytes on device 0, as "limits --json" says. */
static long long default_charged(struct testd *d) {
        json_t *j = testd_ctl(d, "limits"), *t;
        long long v = -1;
        size_t i;

        json_array_foreach(json_object_get(j, "tenants"), i, t)
                if (strcmp(json_string_value(json_object_get(t, "name")), "default") == 0)
                        v = json_integer_value(json_array_get(json_object_get(t, "charged_bytes"), 0));
        json_decref(j);
        return v;
}

/*
 * Memory a process allocated outside the pool (gpupool-run's cuMemCreate) and charged counts
 * against its limit as leased memory does, in its status and its tenant's, until released or
 * its session ends; bad charges are refused, saying why, and the session goes on.
 */
START_TEST(test_charges_count_against_limits) {
        uint64_t free_bytes, total;
        gpupool_client *c;
        char msg[512];
        struct testd d;
        json_t *st, *cl;
        void *p, *q;
        int sock;

        testd_start(&d, "--client-limit", "16M", NULL);
        ck_assert_int_eq(gpupool_connect(d.sock, "charger", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 6 * MiB, &p), 0);
        ck_assert_int_eq(gpupool_charge(c, 0, 8 * MiB), 0);
        /* 6 MiB leased and 8 charged: 4 more fit neither way. */
        ck_assert_int_eq(gpupool_charge(c, 0, 4 * MiB), -EDQUOT);
        gpupool_last_error(c, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, "allocated outside the pool") && strstr(msg, "limit of 16.0 MiB"), "%s", msg);
        ck_assert_int_eq(gpupool_alloc(c, 0, 4 * MiB, &q), -EDQUOT);
        ck_assert_int_eq(gpupool_device_memory(c, 0, &free_bytes, &total), 0);
        ck_assert_uint_eq(total, 16 * MiB);
        ck_assert_uint_le(free_bytes, 2 * MiB);
        st = testd_ctl(&d, "status");
        cl = status_client_by_pid(st, getpid());
        ck_assert_ptr_nonnull(cl);
        ck_assert_int_eq(json_integer_value(json_object_get(cl, "charged_bytes")), 8 * MiB);
        json_decref(st);
        ck_assert_int_eq(default_charged(&d), 8 * MiB);
        /* Bad arguments: refused by the library. */
        ck_assert_int_eq(gpupool_charge(c, 0, 0), -EINVAL);
        ck_assert_int_eq(gpupool_charge(c, 7, MiB), -ENODEV);
        ck_assert_int_eq(gpupool_uncharge(c, 0, 9 * MiB), -EINVAL);
        /* Released: the room comes back. */
        ck_assert_int_eq(gpupool_uncharge(c, 0, 8 * MiB), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 4 * MiB, &q), 0);
        ck_assert_int_eq(default_charged(&d), 0);
        /* The daemon's own refusals, on a raw session that goes on after each. */
        sock = raw_hello(&d, "raw-charger");
        ck_assert_int_eq(raw_charge(sock, 2, 99, MiB, false, msg, sizeof(msg)), GPUPOOL__STATUS__STATUS_NO_DEVICE);
        ck_assert_msg(strstr(msg, "no device 99"), "%s", msg);
        ck_assert_int_eq(raw_charge(sock, 3, 0, 0, false, msg, sizeof(msg)), GPUPOOL__STATUS__STATUS_INVALID);
        ck_assert_msg(strstr(msg, "1 byte to 64 TiB"), "%s", msg);
        ck_assert_int_eq(raw_charge(sock, 4, 0, 1ULL << 47, false, msg, sizeof(msg)), GPUPOOL__STATUS__STATUS_INVALID);
        ck_assert_int_eq(raw_charge(sock, 5, 0, MiB, true, msg, sizeof(msg)), GPUPOOL__STATUS__STATUS_INVALID);
        ck_assert_msg(strstr(msg, "cannot release"), "%s", msg);
        ck_assert_int_eq(raw_charge(sock, 6, 0, 17 * MiB, false, msg, sizeof(msg)), GPUPOOL__STATUS__STATUS_QUOTA);
        ck_assert_int_eq(raw_charge(sock, 7, 0, 4 * MiB, false, msg, sizeof(msg)), GPUPOOL__STATUS__STATUS_OK);
        ck_assert_int_eq(default_charged(&d), 4 * MiB);
        json_decref(testd_ctl(&d, "check"));
        ck_assert_int_eq(raw_charge(sock, 8, 0, 4 * MiB, true, msg, sizeof(msg)), GPUPOOL__STATUS__STATUS_OK);
        ck_assert_int_eq(default_charged(&d), 0);
        close(sock);
        /* A process's charges last while it lives, its socket closed or not, and end with it. */
        {
                int ready[2], go[2];
                pid_t pid;
                char ch;

                ck_assert_int_eq(pipe(ready), 0);
                ck_assert_int_eq(pipe(go), 0);
                pid = fork();
                ck_assert_int_ge(pid, 0);
                if (pid == 0) {
                        int s2 = raw_hello(&d, "raw-charger");

                        if (raw_charge(s2, 2, 0, 4 * MiB, false, msg, sizeof(msg)) != GPUPOOL__STATUS__STATUS_OK)
                                _exit(1);
                        close(s2);
                        if (write(ready[1], "x", 1) != 1 || read(go[0], &ch, 1) != 1)
                                _exit(1);
                        _exit(0);
                }
                ck_assert_int_eq(read(ready[0], &ch, 1), 1);
                ck_assert_int_eq(default_charged(&d), 4 * MiB);
                ck_assert_int_eq(write(go[1], "x", 1), 1);
                ck_assert_int_eq(reap(pid), 0);
                for (double t0 = now_s(); default_charged(&d) != 0 && now_s() - t0 < 5.0;)
                        usleep(10000);
                ck_assert_int_eq(default_charged(&d), 0);
                close(ready[0]), close(ready[1]), close(go[0]), close(go[1]);
        }
        json_decref(testd_ctl(&d, "check"));
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

START_TEST(test_flush_and_bye) {
        gpupool_client *c;
        void *p[5];
        struct testd d;
        json_t *st, *fl, *dev;
        long long cached;

        testd_start(&d, NULL);
        ck_assert_int_eq(gpupool_connect(d.sock, "flusher", &c), 0);
        for (int i = 0; i < 5; i++)
                ck_assert_int_eq(gpupool_alloc(c, 0, (size_t) (i + 1) * 3 * MiB, &p[i]), 0);
        for (int i = 0; i < 4; i++)
                ck_assert_int_eq(gpupool_free(c, p[i]), 0);
        /* Goodbye hands everything back at once, while this process lives on. */
        gpupool_disconnect(c);
        st = testd_ctl(&d, "status");
        ck_assert_int_eq(json_array_size(json_object_get(st, "clients")), 0);
        ck_assert_int_eq(status_device(st, "in_use_bytes"), 0);
        cached = status_device(st, "cached_bytes");
        ck_assert_int_gt(cached, 0);
        ck_assert_int_eq(cached, status_device(st, "reserved_bytes"));
        json_decref(st);

        fl = testd_ctl(&d, "flush");
        dev = json_array_get(json_object_get(fl, "devices"), 0);
        ck_assert_int_eq(json_integer_value(json_object_get(dev, "released_bytes")), cached);
        ck_assert_int_gt(json_integer_value(json_object_get(dev, "released_segments")), 0);
        json_decref(fl);
        st = testd_ctl(&d, "status");
        ck_assert_int_eq(status_device(st, "reserved_bytes"), 0);
        ck_assert_int_eq(status_device(st, "cached_bytes"), 0);
        json_decref(st);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

START_TEST(test_bad_frees) {
        gpupool_client *c;
        void *p, *q, *heap = malloc(64);
        struct testd d;

        testd_start(&d, NULL);
        ck_assert_int_eq(gpupool_connect(d.sock, NULL, &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 4096, &p), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 4096, &q), 0);
        ck_assert_int_eq(gpupool_free(c, (char *) p + 512), -ENOENT);   /* interior: the daemon refuses */
        ck_assert_int_eq(gpupool_free(c, heap), -ENOENT);               /* never allocated */
        ck_assert_int_eq(gpupool_free(c, NULL), -ENOENT);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        ck_assert_int_eq(gpupool_free(c, p), -ENOENT);                  /* twice */
        /* q is intact and still freeable after all that. */
        memset(q, 7, 4096);
        ck_assert_int_eq(gpupool_free(c, q), 0);
        ck_assert_int_eq(gpupool_free(c, q), -ENOENT);
        gpupool_disconnect(c);
        free(heap);
        ck_assert(testd_alive(&d));
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

START_TEST(test_refusals) {
        gpupool_client *c, *c2, *c3;
        struct testd d;
        void *p;
        char msg[GP_MAX_ERROR_BYTES];

        testd_start(&d, "--max-clients", "2", "--max-blocks", "10", NULL);
        ck_assert_int_eq(gpupool_connect(d.dir, "x", &c), -ECONNREFUSED);      /* a directory, no daemon */
        ck_assert_int_eq(gpupool_connect("/nonexistent/gp.sock", "x", &c), -ENOENT);
        ck_assert_int_eq(gpupool_connect(d.sock, "bad\nname", &c), -EINVAL);
        ck_assert_int_eq(gpupool_connect(d.sock, "", &c), -EINVAL);
        ck_assert_int_eq(gpupool_connect(d.sock, "a", &c), 0);
        /* Every refusal has its sentence: a bad argument's too, in the thread's error with no handle. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 0, &p), -EINVAL);
        gpupool_last_error(c, msg, sizeof(msg));
        ck_assert_str_eq(msg, "cannot allocate 0 bytes: a request is 1 byte to 64 TiB");
        ck_assert_int_eq(gpupool_alloc(c, -1, 64, &p), -EINVAL);
        gpupool_last_error(c, msg, sizeof(msg));
        ck_assert_str_eq(msg, "gpupool_alloc: device -1: devices are numbered from 0");
        ck_assert_int_eq(gpupool_free(NULL, p), -EINVAL);
        gpupool_last_error(NULL, msg, sizeof(msg));
        ck_assert_str_eq(msg, "gpupool_free: no handle (NULL): gpupool_connect() gives one");
        ck_assert_int_eq(gpupool_alloc(c, 1, 64, &p), -ENODEV);
        ck_assert_int_eq(gpupool_alloc(c, 0, (size_t) 1 << 47, &p), -EINVAL);
        /* More than the device holds in all can never fit, and says so (nobody is asked for memory). */
        ck_assert_int_eq(gpupool_alloc(c, 0, 600 * MiB, &p), -ENOMEM);         /* capacity is 512M */
        gpupool_last_error(c, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, "device 0 can never fit 629145600 bytes (600.0 MiB): it holds 512.0 MiB in all"),
                      "message: %s", msg);
        /* --max-blocks is obsolete: the daemon said so at start, and bounds nothing. */
        ck_assert(testd_log_wait(&d, "max_blocks (--max-blocks) is obsolete and ignored"));
        for (int i = 0; i < 11; i++)
                ck_assert_int_eq(gpupool_alloc(c, 0, 64, &p), 0);
        /* A full device's refusal says who holds it, with what each reported. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 511 * MiB, &p), -ENOMEM);
        gpupool_last_error(c, msg, sizeof(msg));
        ck_assert_msg(strstr(msg, "; no other client could give back memory that would serve") &&
                      strstr(msg, "; it is leased to client ") && strstr(msg, " 'a' (pid ") && strstr(msg, "tenant default): 2.0 MiB, "),
                      "message: %s", msg);
        ck_assert_int_eq(gpupool_connect(d.sock, "b", &c2), 0);
        ck_assert_int_eq(gpupool_connect(d.sock, "c", &c3), -EDQUOT);         /* --max-clients 2 */
        gpupool_disconnect(c2);
        /* The daemon frees the slot when c2's socket closes; retry briefly until it has. */
        for (int i = 0; i < 200 && gpupool_connect(d.sock, "c", &c3) == -EDQUOT; i++)
                usleep(5000);
        ck_assert_int_eq(gpupool_connect(d.sock, "d", &c2), -EDQUOT);
        gpupool_disconnect(c3);
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

struct thread_arg {
        gpupool_client *client;
        int index;
        int failures;
};

static void *thread_churn(void *arg) {
        struct thread_arg *t = arg;
        void *p[16] = { 0 };

        for (int round = 0; round < 200; round++) {
                int s = round % 16;

                if (p[s]) {
                        if (!intact(p[s], 8192, (unsigned) (t->index * 1000 + s)) || gpupool_free(t->client, p[s]) < 0)
                                t->failures++;
                        p[s] = NULL;
                } else if (gpupool_alloc(t->client, 0, 8192, &p[s]) == 0) {
                        fill(p[s], 8192, (unsigned) (t->index * 1000 + s));
                } else {
                        t->failures++;
                }
        }
        for (int s = 0; s < 16; s++)
                if (p[s] && gpupool_free(t->client, p[s]) < 0)
                        t->failures++;
        return NULL;
}

START_TEST(test_threads_share_a_handle) {
        struct thread_arg args[4];
        pthread_t th[4];
        gpupool_client *c;
        struct testd d;
        json_t *st;

        testd_start(&d, NULL);
        ck_assert_int_eq(gpupool_connect(d.sock, "threads", &c), 0);
        for (int i = 0; i < 4; i++) {
                args[i] = (struct thread_arg) { .client = c, .index = i };
                ck_assert_int_eq(pthread_create(&th[i], NULL, thread_churn, &args[i]), 0);
        }
        for (int i = 0; i < 4; i++) {
                pthread_join(th[i], NULL);
                ck_assert_int_eq(args[i].failures, 0);
        }
        st = testd_ctl(&d, "status");
        ck_assert_int_eq(json_integer_value(json_object_get(status_client_by_pid(st, getpid()), "blocks")), 0);
        json_decref(st);
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/*
 * Waits (up to 10 s) until c sees its daemon gone: an allocation that needs a lease (given
 * back at once) is served until then, and refused after. Returns whether it did.
 */
static bool sees_daemon_gone(gpupool_client *c) {
        double t0 = now_s();
        void *p;
        int r;

        while (now_s() - t0 < 10.0) {
                r = gpupool_alloc(c, 0, 64 * MiB, &p);
                if (r == -ECONNRESET)
                        return true;
                if (r == 0) {
                        (void) gpupool_free(c, p);
                        (void) gpupool_trim(c);
                }
                usleep(1000);
        }
        return false;
}

START_TEST(test_daemon_gone) {
        gpupool_client *c;
        struct testd d;
        char why[512];
        void *p, *q;

        testd_start(&d, NULL);
        ck_assert_int_eq(gpupool_connect(d.sock, "orphan", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 4096, &p), 0);
        memset(p, 1, 4096);
        ck_assert_int_eq(testd_stop(&d), 0);
        /* What needs the daemon is refused, saying so; what the process holds serves on, its data intact. */
        ck_assert(sees_daemon_gone(c));
        gpupool_last_error(c, why, sizeof(why));
        ck_assert_msg(strstr(why, "gpupoold is gone") && strstr(why, "goes on allocating from the memory it holds"),
                      "%s", why);
        ck_assert_uint_eq(((unsigned char *) p)[4095], 1);
        ck_assert_int_eq(gpupool_alloc(c, 0, 4096, &q), 0);
        memset(q, 2, 4096);
        ck_assert_uint_eq(((unsigned char *) p)[0], 1);
        ck_assert_int_eq(gpupool_free(c, q), 0);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        /* Nobody to give it back to: it stays the process's. */
        ck_assert_int_eq(gpupool_trim(c), -ECONNRESET);
        /* No daemon yet: reconnect says so, and may be called again. */
        ck_assert_int_eq(gpupool_reconnect(c), -ENOENT);
        ck_assert_int_eq(gpupool_alloc(c, 0, 4096, &p), -ECONNRESET);
        gpupool_disconnect(c);
}
END_TEST

START_TEST(test_daemon_crash_and_reconnect) {
        gpupool_client *c;
        struct testd d;
        json_t *st;
        void *p, *q;

        testd_start(&d, NULL);
        ck_assert_int_eq(gpupool_connect(d.sock, "survivor", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 4096, &p), 0);
        /*
         * Calls soon say the daemon is gone: no hang, no crash. Seen before the next daemon
         * listens: once it does, the library may have resumed with it on its own (how soon
         * depends on how slowly the daemon starts: under valgrind, after the library's retries).
         */
        testd_crash(&d);
        ck_assert(sees_daemon_gone(c));
        testd_relaunch(&d);
        ck_assert_int_eq(gpupool_reconnect(c), 0);
        /* The old block belonged to the dead daemon: unknown now, not freed twice. */
        ck_assert_int_eq(gpupool_free(c, p), -ENOENT);
        ck_assert_int_eq(gpupool_alloc(c, 0, 4096, &q), 0);
        memset(q, 7, 4096);
        /* The new daemon leased a small-block segment to the new session. */
        st = testd_ctl(&d, "status");
        ck_assert_int_eq(status_device(st, "reserved_bytes"), 2 * MiB);
        json_decref(st);
        ck_assert_int_eq(gpupool_free(c, q), 0);
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/*
 * gpupool_reconnect() while the control thread has the daemon that came back adopt what the
 * process holds (the test daemon's adoptions wait 1.5 s: $GPUPOOL_TEST_FAULTS adopt_ms). The
 * thread let go of the handle's lock for the adoption, the reconnect closed the channel then,
 * and the thread went on to serve a channel it opened after: nothing shut that one, and the
 * reconnect waited for the thread forever (make valgrind's one hang, where a slow daemon made
 * the window wide). Now the reconnect returns once the adoption has, and says bye to the
 * daemon that adopted, so that what it adopted is not left reserved until this process exits.
 */
START_TEST(test_reconnect_while_the_daemon_adopts) {
        gpupool_client *c;
        struct testd d;
        json_t *st;
        void *p, *q;
        double t0;

        testd_start(&d, NULL);
        ck_assert_int_eq(gpupool_connect(d.sock, "survivor", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 4096, &p), 0);
        testd_crash(&d);
        ck_assert(sees_daemon_gone(c));
        /* The next daemon is the test build, slow to adopt (argv[...] points at d.path). */
        snprintf(d.path, sizeof(d.path), "%s/tests/gpupoold-faults", build_dir());
        setenv("GPUPOOL_TEST_FAULTS", "adopt_ms=1500", 1);
        testd_relaunch(&d);
        unsetenv("GPUPOOL_TEST_FAULTS");
        ck_assert(testd_log_wait(&d, "TEST ONLY: an adoption waits 1500 ms"));
        t0 = now_s();
        ck_assert_int_eq(gpupool_reconnect(c), 0);
        ck_assert_msg(now_s() - t0 < 20, "the reconnect took %.1f s", now_s() - t0);
        ck_assert_int_eq(gpupool_free(c, p), -ENOENT);
        ck_assert_int_eq(gpupool_alloc(c, 0, 4096, &q), 0);
        /* The new session's small-block segment, and nothing of the adopted one left reserved. */
        st = testd_ctl(&d, "status");
        ck_assert_int_eq(status_device(st, "reserved_bytes") - status_device(st, "cached_bytes"), 2 * MiB);
        json_decref(st);
        ck_assert_int_eq(gpupool_free(c, q), 0);
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

START_TEST(test_stale_socket_and_second_daemon) {
        char cmd[512], out[2048];
        struct testd d;

        testd_start(&d, NULL);
        /* A second daemon on a live socket refuses to start, in one line that says it all. */
        snprintf(cmd, sizeof(cmd), "%s/gpupoold --socket %s --backend host --log-level error 2>&1", build_dir(), d.sock);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "another gpupoold is listening there (stop it, or give this one another --socket)") &&
                      strchr(out, '\n') == out + strlen(out) - 1, "%s", out);
        ck_assert(testd_alive(&d));
        /* A crash leaves the socket file behind; the next daemon replaces it. */
        kill(d.pid, SIGKILL);
        waitpid(d.pid, NULL, 0);
        ck_assert_int_eq(access(d.sock, F_OK), 0);
        {
                struct testd d2;

                testd_start(&d2, NULL);
                ck_assert_int_eq(testd_stop(&d2), 0);
        }
        /* Nothing of the killed daemon's left behind: its stale socket, its log, its directory. */
        unlink(d.sock);
        unlink(d.log);
        ck_assert_int_eq(rmdir(d.dir), 0);
}
END_TEST

/* As another uid, allocates what the parent just released and reports whether it is all zero. */
static int other_uid_client(struct testd *d, void *arg) {
        const unsigned char *p;
        gpupool_client *c;
        void *ptr;

        (void) arg;
        if (setgid(65534) < 0 || setuid(65534) < 0)
                return 20;
        if (gpupool_connect(d->sock, "nobody", &c) < 0 || gpupool_alloc(c, 0, 64 * 1024, &ptr) < 0)
                return 21;
        p = ptr;
        for (size_t i = 0; i < 64 * 1024; i++)
                if (p[i])
                        return 22;
        gpupool_disconnect(c);
        return 0;
}

START_TEST(test_segment_zeroed_across_uids) {
        gpupool_client *c;
        struct testd d;
        json_t *st;
        void *p;

        if (geteuid() != 0) {
                TEST_SKIP("switching uid needs root");      /* CI runs as root: it runs there */
                return;
        }
        testd_start(&d, NULL);
        ck_assert_int_eq(chmod(d.dir, 0755), 0);        /* let the other uid reach the socket */
        ck_assert_int_eq(gpupool_connect(d.sock, "root", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 64 * 1024, &p), 0);
        memset(p, 0xee, 64 * 1024);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        ck_assert_int_eq(gpupool_trim(c), 0);  /* the process gives its empty segment back */
        st = testd_ctl(&d, "status");
        ck_assert_int_eq(status_device(st, "cached_bytes"), 2 * MiB);  /* the segment waits in the cache */
        json_decref(st);
        ck_assert_int_eq(reap(spawn(other_uid_client, &d, NULL)), 0);
        st = testd_ctl(&d, "status");
        ck_assert_int_eq(status_device(st, "reserved_bytes"), 2 * MiB); /* it was that segment, reused */
        json_decref(st);
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* A client that keeps the memfd of a segment it returned reads nothing another uid writes there. */
START_TEST(test_kept_descriptor_reads_nothing) {
        struct testd d;

        if (geteuid() != 0) {
                TEST_SKIP("switching uid needs root");
                return;
        }
        testd_start(&d, NULL);
        check_kept_descriptor_reads_nothing(&d, 0);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

START_TEST(test_cli) {
        const char *b = build_dir();
        char cmd[512], out[4096];
        gpupool_client *c;
        struct testd d;
        void *p;

        testd_start(&d, "--client-limit", "1G", NULL);
        ck_assert_int_eq(gpupool_connect(d.sock, "table-row", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 3 * MiB, &p), 0);
        snprintf(cmd, sizeof(cmd), "GPUPOOL_SOCKET=%s %s/gpupoolctl status", d.sock, b);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "DEVICE") && strstr(out, "host") && strstr(out, "512.0 MiB") &&
                      strstr(out, "table-row") && strstr(out, "1.0 GiB") && strstr(out, "20.0 MiB"), "%s", out);
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s/none status 2>&1", b, d.dir);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "gpupoolctl: no gpupoold listens at ") && strstr(out, "/none (there is no such socket)") &&
                      strstr(out, "start it, or set $GPUPOOL_SOCKET"), "%s", out);
        /* What is there when it is not a socket: a directory, a file; a socket nobody accepts on. */
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s status 2>&1", b, d.dir);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, " is a directory, not gpupoold's socket: set $GPUPOOL_SOCKET"), "%s", out);
        snprintf(cmd, sizeof(cmd), "touch %s/file && %s/gpupoolctl --socket %s/file status 2>&1", d.dir, b, d.dir);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "/file is a regular file, not gpupoold's socket"), "%s", out);
        {
                struct sockaddr_un sa = { .sun_family = AF_UNIX };
                int s = socket(AF_UNIX, SOCK_STREAM, 0);

                snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/dead.sock", d.dir);
                ck_assert_int_eq(bind(s, (struct sockaddr *) &sa, sizeof(sa)), 0);
                close(s);
                snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s status 2>&1", b, sa.sun_path);
                ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 1);
                ck_assert_msg(strstr(out, "(the socket is there, and nobody accepts on it: a daemon that stopped left it)"),
                              "%s", out);
                unlink(sa.sun_path);
        }
        unlink(strcat(strcpy(cmd, d.dir), "/file"));
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s frobnicate 2>&1", b, d.sock);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 2);
        ck_assert_msg(strstr(out, "unknown command 'frobnicate'"), "%s", out);
        /* -h is --help; a bad option is said as gpupoolctl says everything, not with the program's path. */
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl -h", b);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "Usage: gpupoolctl") && strstr(out, "-h, --help"), "%s", out);
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --frobnicate status 2>&1", b);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 2);
        ck_assert_msg(strncmp(out, "gpupoolctl: unknown option '--frobnicate'", 41) == 0, "%s", out);
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket 2>&1", b);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 2);
        ck_assert_msg(strncmp(out, "gpupoolctl: option '--socket' needs an argument", 47) == 0, "%s", out);
        /* Each usage line in its column: one too long for it has the summary on a line of its own. */
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --help", b);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "  set-limit --tenant NAME|--pid PID [max=SIZE] [guarantee=SIZE]\n"
                                  "                           change limits"), "%s", out);
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s flush", b, d.sock);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "device 0: released 0 cached segments"), "%s", out);
        /* One segment is one: the client's emptied segment goes to the cache, and flush says so. */
        ck_assert_int_eq(gpupool_free(c, p), 0);
        ck_assert_int_eq(gpupool_trim(c), 0);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "device 0: released 1 cached segment, "), "%s", out);
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/*
 * Every command answers --help, -h and "help COMMAND" with its usage, and a bad argument is
 * named with the usage, all without a daemon (the socket does not exist); gpupoold -h is --help.
 */
START_TEST(test_cli_help_everywhere) {
        static const char *const bad[][2] = {
                { "trim --bogus", "gpupoolctl trim: unexpected argument '--bogus'" },
                { "trim --pid", "gpupoolctl trim: --pid needs a value" },
                { "status extra", "gpupoolctl status: unexpected argument 'extra'" },
                { "unpublish a b", "gpupoolctl unpublish: one object at a time: 'a', then 'b'" },
                { "unpublish --uid", "gpupoolctl unpublish: --uid needs a value" },
                { "flush --device x", "gpupoolctl flush: 'x' is not a device index" },
                { "set-limit --tenant t bogus", "gpupoolctl set-limit: unexpected argument 'bogus'" },
                { "help status trim", "gpupoolctl help: one command at a time" },
                { "help nosuch", "gpupoolctl help: unknown command 'nosuch'" },
        };
        const char *b = build_dir();
        char cmd[512], out[8192], names[4096], *save = NULL;
        int commands = 0;

        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --help | awk '/^Commands:/ { on = 1; next } /^$/ { on = 0 } "
                 "on && /^  [a-z]/ { print $1 }'", b);
        ck_assert_int_eq(run_capture(cmd, names, sizeof(names)), 0);
        for (char *name = strtok_r(names, "\n", &save); name; name = strtok_r(NULL, "\n", &save)) {
                static const char *const forms[] = { "%s/gpupoolctl --socket /nonexistent/sock %s --help",
                                                     "%s/gpupoolctl --socket /nonexistent/sock %s -h",
                                                     "%s/gpupoolctl --socket /nonexistent/sock help %s" };
                char want[128];

                if (strcmp(name, "help") == 0)
                        continue;
                snprintf(want, sizeof(want), "Usage: gpupoolctl [--socket PATH] [--json] %s", name);
                for (size_t f = 0; f < sizeof(forms) / sizeof(forms[0]); f++) {
                        snprintf(cmd, sizeof(cmd), forms[f], b, name);
                        strcat(cmd, " 2>&1");
                        ck_assert_msg(run_capture(cmd, out, sizeof(out)) == 0, "%s: %s", cmd, out);
                        ck_assert_msg(strncmp(out, want, strlen(want)) == 0 && strchr(out, '.'), "%s: %s", cmd, out);
                }
                commands++;
        }
        ck_assert_int_ge(commands, 10);
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket /nonexistent/sock %s 2>&1", b, bad[i][0]);
                ck_assert_msg(run_capture(cmd, out, sizeof(out)) == 2, "%s: %s", cmd, out);
                ck_assert_msg(strncmp(out, bad[i][1], strlen(bad[i][1])) == 0 && strstr(out, "Usage: gpupoolctl"), "%s: %s",
                              cmd, out);
        }
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl help", b);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "Commands:") && strstr(out, "help [COMMAND]"), "%s", out);
        snprintf(cmd, sizeof(cmd), "%s/gpupoold -h", b);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "Usage: gpupoold") && strstr(out, "-h, --help"), "%s", out);
}
END_TEST

/* As uid 65534, with the daemon at --max-clients: gpupoolctl is refused, and says why. */
static int nobody_refused(struct testd *d, void *arg) {
        const char *ctl = arg;
        char cmd[512], out[4096];

        if (setgid(65534) < 0 || setuid(65534) < 0)
                return 20;
        snprintf(cmd, sizeof(cmd), "%s --socket %s status 2>&1", ctl, d->sock);
        for (int i = 0; i < 20; i++)
                if (run_capture(cmd, out, sizeof(out)) != 1 || !strstr(out, "--max-clients"))
                        return 21;
        return 0;
}

START_TEST(test_cli_refused_over_max_clients) {
        const char *b = build_dir();
        char cmd[512], out[4096], ctl[256];
        gpupool_client *c;
        struct testd d;
        int r;

        testd_start(&d, "--max-clients", "1", NULL);
        /* The start-up probe holds the one slot until the daemon has seen it close. */
        for (int i = 0; i < 200 && (r = gpupool_connect(d.sock, "only", &c)) == -EDQUOT; i++)
                usleep(5000);
        /* The one client, and its control channel let in past the limit as part of it. */
        ck_assert_int_eq(r, 0);
        /* The daemon's reason reaches the user, not a bare reset. */
        ck_assert_int_eq(chmod(d.dir, 0755), 0);
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl", b);
        testd_copy_for_others(&d, cmd, ctl, sizeof(ctl));
        ck_assert_int_eq(reap(spawn(nobody_refused, &d, ctl)), 0);
        unlink(ctl);
        /* The operator (root, the daemon's user) still gets in, for administrative requests. */
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s status 2>&1", b, d.sock);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

START_TEST(test_daemon_command_line_errors) {
        const char *b = build_dir();
        char cmd[512], out[4096];

        snprintf(cmd, sizeof(cmd), "%s/gpupoold --host-capacity lots 2>&1", b);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 2);
        ck_assert_msg(strstr(out, "--host-capacity: 'lots' is not a size"), "%s", out);
        snprintf(cmd, sizeof(cmd), "%s/gpupoold --help", b);
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, "--client-limit SIZE"), "%s", out);
}
END_TEST

/* A datagram socket standing in for systemd's $NOTIFY_SOCKET. */
static int notify_listener(const char *path) {
        struct sockaddr_un addr = { .sun_family = AF_UNIX };
        int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);

        ck_assert_int_ge(fd, 0);
        snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
        ck_assert_int_eq(bind(fd, (struct sockaddr *) &addr, sizeof(addr)), 0);
        return fd;
}

/*
 * Starts a daemon whose service manager listens at path (made of tag) and asks for the
 * watchdog every watchdog_usec: the listener's descriptor, to read (or not).
 */
static int start_notified(struct testd *d, const char *tag, const char *watchdog_usec, char *path, size_t path_size) {
        int fd;

        snprintf(path, path_size, "%s/gpupool-%s-%d", test_tmp(), tag, (int) getpid());
        unlink(path);
        fd = notify_listener(path);
        setenv("NOTIFY_SOCKET", path, 1);
        setenv("WATCHDOG_USEC", watchdog_usec, 1);
        testd_start(d, NULL);
        unsetenv("NOTIFY_SOCKET");
        unsetenv("WATCHDOG_USEC");
        return fd;
}

/* Waits up to timeout_s for a notification containing want; everything else read is dropped. */
static bool notified(int fd, const char *want, double timeout_s) {
        double end = now_s() + timeout_s;
        char buf[512];

        while (now_s() < end) {
                struct pollfd p = { .fd = fd, .events = POLLIN };
                ssize_t n;

                if (poll(&p, 1, 50) <= 0)
                        continue;
                n = recv(fd, buf, sizeof(buf) - 1, 0);
                if (n <= 0)
                        continue;
                buf[n] = '\0';
                if (strstr(buf, want))
                        return true;
        }
        return false;
}

START_TEST(test_systemd_notify) {
        char path[100];
        struct testd d;
        int fd;

        fd = start_notified(&d, "notify", "200000", path, sizeof(path));
        /* READY=1 once the pools exist and the socket listens; then a status line. */
        ck_assert(notified(fd, "READY=1", 5));
        ck_assert(notified(fd, "STATUS=0 clients", 5));
        /* The watchdog at half the interval: several within a second. */
        for (int i = 0; i < 3; i++)
                ck_assert(notified(fd, "WATCHDOG=1", 1));
        /* A reload: RELOADING=1 with the time, then READY=1 again. */
        kill(d.pid, SIGHUP);
        ck_assert(notified(fd, "RELOADING=1\nMONOTONIC_USEC=", 5));
        ck_assert(notified(fd, "READY=1", 5));
        ck_assert(testd_alive(&d));
        /* One SIGTERM (testd_stop's): STOPPING=1 waits in our socket after the daemon is gone. */
        ck_assert_int_eq(testd_stop(&d), 0);
        ck_assert(notified(fd, "STOPPING=1", 1));
        close(fd);
        unlink(path);
}
END_TEST

/*
 * A service manager that stops reading its $NOTIFY_SOCKET (a datagram queue holds 10 by
 * default, net.unix.max_dgram_qlen) loses notifications; the daemon never waits on it.
 */
START_TEST(test_notify_never_blocks) {
        char path[100];
        struct testd d;
        int fd;

        /* A WATCHDOG=1 every 10 ms: far more than the queue holds. */
        fd = start_notified(&d, "notify-deaf", "20000", path, sizeof(path));
        nap_ms(500);
        json_decref(testd_ctl(&d, "status"));   /* still answering */
        ck_assert_int_eq(testd_stop(&d), 0);
        close(fd);
        unlink(path);
}
END_TEST

/* Starts gpupoold as systemd would with one passed socket (fd 3, $LISTEN_FDS, $LISTEN_PID). */
static pid_t start_activated(int listen_fd, const char *sock, const char *log, const char *fds) {
        pid_t pid = fork();
        char exe[256], me[32];

        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
                int err = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);

                dup2(err, 2);
                dup2(listen_fd, 3);
                snprintf(me, sizeof(me), "%d", (int) getpid());
                setenv("LISTEN_PID", me, 1);
                setenv("LISTEN_FDS", fds, 1);
                snprintf(exe, sizeof(exe), "%s/gpupoold", build_dir());
                execl(exe, exe, "--socket", sock, "--backend", "host", "--host-capacity", "64M", (char *) NULL);
                _exit(127);
        }
        return pid;
}

START_TEST(test_socket_activation) {
        char dir[96], sock[128], log[128], out[4096];
        gpupool_client *c;
        int lfd, status;
        pid_t pid;
        void *p;

        test_mkdtemp(dir, sizeof(dir), "act");
        snprintf(sock, sizeof(sock), "%s/gpupool.sock", dir);
        snprintf(log, sizeof(log), "%s/gpupoold.log", dir);
        lfd = listen_seqpacket(sock);
        pid = start_activated(lfd, sock, log, "1");
        /* Clients reach it through the socket systemd holds; no bind of its own. */
        ck_assert_int_eq(gpupool_connect(sock, "activated", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 4096, &p), 0);
        ck_assert_int_eq(gpupool_free(c, p), 0);
        gpupool_disconnect(c);
        kill(pid, SIGTERM);
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        /* The socket file is systemd's: it stays, and still accepts (queued for the next start). */
        ck_assert_int_eq(access(sock, F_OK), 0);
        read_text(log, out, sizeof(out));
        ck_assert_msg(strstr(out, "serving systemd's socket"), "%s", out);

        /* Two sockets, or one that is not a listening SEQPACKET socket: a clear error, exit 1. */
        pid = start_activated(lfd, sock, log, "2");
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1);
        close(lfd);
        lfd = socket(AF_UNIX, SOCK_DGRAM, 0);
        pid = start_activated(lfd, sock, log, "1");
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1);
        read_text(log, out, sizeof(out));
        ck_assert_msg(strstr(out, "not a listening AF_UNIX SOCK_SEQPACKET socket"), "%s", out);
        close(lfd);
        unlink(sock);
        unlink(log);
        rmdir(dir);
}
END_TEST

Suite *suite_daemon(void) {
        Suite *s = suite_create("daemon");
        TCase *tc = tcase_create("host");

        tcase_add_test(tc, test_concurrent_clients_never_overlap);
        tcase_add_test(tc, test_kill9_memory_returns);
        tcase_add_test(tc, test_memory_held_until_process_exits);
        tcase_add_test(tc, test_client_limit);
        tcase_add_test(tc, test_charges_count_against_limits);
        tcase_add_test(tc, test_flush_and_bye);
        tcase_add_test(tc, test_bad_frees);
        tcase_add_test(tc, test_systemd_notify);
        tcase_add_test(tc, test_notify_never_blocks);
        tcase_add_test(tc, test_socket_activation);
        tcase_add_test(tc, test_refusals);
        tcase_add_test(tc, test_threads_share_a_handle);
        tcase_add_test(tc, test_daemon_gone);
        tcase_add_test(tc, test_daemon_crash_and_reconnect);
        tcase_add_test(tc, test_reconnect_while_the_daemon_adopts);
        tcase_add_test(tc, test_stale_socket_and_second_daemon);
        tcase_add_test(tc, test_segment_zeroed_across_uids);
        tcase_add_test(tc, test_kept_descriptor_reads_nothing);
        tcase_add_test(tc, test_cli);
        tcase_add_test(tc, test_cli_help_everywhere);
        tcase_add_test(tc, test_cli_refused_over_max_clients);
        tcase_add_test(tc, test_daemon_command_line_errors);
        tcase_set_timeout(tc, 120);
        suite_add_tcase(s, tc);
        return s;
}
