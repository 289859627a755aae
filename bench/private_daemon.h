/*
 * private_daemon.h: a gpupoold of the benchmark's own, for the benchmarks that talk to one
 * (bench_host.c, replay.c; adopt.c starts its own and waits here): host backend, an empty
 * config (the node's own /etc/gpupool must not change what is measured), errors only in its
 * log, listening before this returns.
 */
#ifndef GP_BENCH_PRIVATE_DAEMON_H
#define GP_BENCH_PRIVATE_DAEMON_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "wire.h"

/* Waits until a daemon listens on sock_path; exits the benchmark, saying why (its log), if none does in 10 s. */
static inline void private_daemon_wait(const char *sock_path, const char *log) {
        for (int i = 0; i < 2000; i++) {
                int s;

                if (gp_wire_connect(sock_path, &s) == 0) {
                        close(s);
                        return;
                }
                usleep(5000);
        }
        fprintf(stderr, "gpupoold did not start (see %s)\n", log);
        exit(1);
}

/*
 * Starts build/gpupoold on sock_path with backend (host: capacity, a size, of host memory; a
 * GPU backend: the GPUs' memory), its config and log in dir. Returns its pid; exits the
 * benchmark, saying why, if it does not listen in 10 s.
 */
/* What the private daemon's config file says (NULL: nothing), for a benchmark that sets one before starting it. */
static const char *private_daemon_conf;

static inline pid_t private_daemon_start_backend(const char *build, const char *dir, const char *sock_path,
                                                 const char *backend, const char *capacity) {
        char path[256], log[160], conf[160];
        pid_t pid;
        int cfd;

        snprintf(path, sizeof(path), "%s/gpupoold", build);
        snprintf(log, sizeof(log), "%s/gpupoold.log", dir);
        snprintf(conf, sizeof(conf), "%s/empty.conf", dir);
        cfd = open(conf, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (cfd >= 0 && private_daemon_conf && write(cfd, private_daemon_conf, strlen(private_daemon_conf)) < 0)
                perror("private daemon: its config");
        close(cfd);
        unlink(sock_path);
        pid = fork();
        if (pid == 0) {
                int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);

                dup2(fd, 2);
                if (strcmp(backend, "host") == 0)
                        execl(path, path, "--socket", sock_path, "--backend", "host", "--host-capacity", capacity,
                              "--log-level", "err", "--config", conf, (char *) NULL);
                else
                        execl(path, path, "--socket", sock_path, "--backend", backend, "--log-level", "err", "--config", conf,
                              (char *) NULL);
                _exit(127);
        }
        private_daemon_wait(sock_path, log);
        return pid;
}

/* The host backend's: capacity (a size) of host memory. */
static inline pid_t private_daemon_start(const char *build, const char *dir, const char *sock_path, const char *capacity) {
        return private_daemon_start_backend(build, dir, sock_path, "host", capacity);
}

/* Removes what private_daemon_start() made in dir, and dir (the daemon has stopped). */
static inline void private_daemon_remove(const char *dir, const char *sock_path) {
        char path[256];

        unlink(sock_path);
        snprintf(path, sizeof(path), "%s/gpupoold.log", dir);
        unlink(path);
        snprintf(path, sizeof(path), "%s/empty.conf", dir);
        unlink(path);
        rmdir(dir);
}

#endif
