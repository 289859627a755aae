/*
 * main.c: gpupoold, the node's GPU memory-pool daemon. Parses the command line, opens the
 * backend, runs the loop until SIGINT or SIGTERM, and checks that everything was closed.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "backend.h"
#include "closer.h"
#include "config.h"
#include "identity.h"
#include "log.h"
#include "notify.h"
#include "options.h"
#include "server.h"
#include "size.h"

static int open_backend(const struct options *o, struct backend **ret) {
        char cap[GP_SIZE_FORMAT_MAX], err[512];
        int r;

        if (o->backend != BACKEND_HOST) {
                /* auto: the legacy cuda backend, until cuda-vmm has run on a GPU. */
                r = backend_cuda_open(o->headroom_bytes, o->backend == BACKEND_CUDA_VMM, o->export_keepalive, ret, err,
                                      sizeof(err));
                if (r == 0)
                        return 0;
                if (o->backend == BACKEND_CUDA || o->backend == BACKEND_CUDA_VMM) {
                        log_err("--backend %s: %s", o->backend == BACKEND_CUDA ? "cuda" : "cuda-vmm", err);
                        return r;
                }
                /* No driver or no GPU: a CPU-only node. A GPU node whose driver fails must not pass for one. */
                if (r != -ENOENT && r != -ENODEV) {
                        log_err("--backend auto: %s (--backend host serves host memory regardless)", err);
                        return r;
                }
                log_info("backend auto: %s; using the host backend", err);
        }
        log_info("host backend: %s of shared memory", gp_size_format(o->host_capacity_bytes, cap, sizeof(cap)));
        return backend_host_open(o->host_capacity_bytes, ret);
}

int main(int argc, char **argv) {
        static struct server server;
        static struct config config;
        struct backend *backend;
        struct options cmd;
        uv_loop_t loop;
        char warning_text[4096];
        char err[600];
        int r;

        /* Until the config says otherwise: errors at start carry their priority to the journal too. */
        log_open(LOG_LEVEL_INFO);
        /* The command line first, for --config, --help and its own mistakes; then the file under it. */
        if (options_parse(argc, argv, &cmd, err, sizeof(err)) < 0) {
                log_err("%s", err);
                fprintf(stderr, "Try 'gpupoold --help'.\n");
                return 2;
        }
        if (cmd.action == OPTIONS_HELP) {
                fputs(options_usage, stdout);
                return 0;
        }
        if (cmd.action == OPTIONS_VERSION) {
                printf("gpupoold %s\n", GPUPOOL_VERSION);
                return 0;
        }
        r = config_load(cmd.config_path, cmd.config_given, &config, err, sizeof(err));
        if (r == 0)
                r = options_parse_over(argc, argv, &config.options, &config.options, err, sizeof(err));
        if (r < 0) {
                /* A check prints what a checker does: file:line: what, alone on its line. */
                if (cmd.action == OPTIONS_CHECK_CONFIG)
                        fprintf(stderr, "%s\n", err);
                else
                        log_err("%s", err);
                return 1;
        }
        (void) config_warnings(&config, warning_text, sizeof(warning_text));
        if (cmd.action == OPTIONS_CHECK_CONFIG) {
                /* Warnings do not fail the check: the config works, if not as its author likely meant. */
                for (char *line = warning_text, *nl; (nl = strchr(line, '\n')); line = nl + 1)
                        fprintf(stderr, "warning: %.*s\n", (int) (nl - line), line);
                printf("%s: good (%u file%s, %u tenant%s)\n", config.options.config_path, config.file_count,
                       config.file_count == 1 ? "" : "s", config.tenant_count, config.tenant_count == 1 ? "" : "s");
                return 0;
        }
        log_open(config.options.log_level);
        log_lines(LOG_LEVEL_WARN, warning_text);
        if (config.file_count)
                log_info("config: %s (%u file%s, %u tenant%s)", config.options.config_path, config.file_count,
                         config.file_count == 1 ? "" : "s", config.tenant_count, config.tenant_count == 1 ? "" : "s");

        /* Where its cgroup namespace lies, before any client's cgroup is read. */
        if (identity_view_init(err, sizeof(err)) < 0) {
                log_err("%s", err);
                return 1;
        }
        log_info("%s", err);
        r = open_backend(&config.options, &backend);
        if (r < 0)
                return 1;
        if (server_fit_fd_limit(&config.options, backend, err, sizeof(err)) < 0) {
                log_err("%s", err);
                backend->ops->close(backend);
                return 1;
        }
#ifdef GPUPOOL_FAULT_INJECTION
        /* Only in the test build (build/tests/gpupoold-faults): the shipped daemon has no such code. */
        if (getenv("GPUPOOL_TEST_FAULTS") && *getenv("GPUPOOL_TEST_FAULTS")) {
                struct backend *faulty;

                if (backend_fault_wrap(backend, getenv("GPUPOOL_TEST_FAULTS"), &faulty, err, sizeof(err)) < 0) {
                        log_err("%s", err);
                        backend->ops->close(backend);
                        return 1;
                }
                backend = faulty;
        }
#endif
        r = uv_loop_init(&loop);
        if (r < 0) {
                log_err("cannot start the event loop: %s", uv_strerror(r));
                backend->ops->close(backend);
                return 1;
        }
        r = server_start(&server, &loop, &config, argc, argv, backend);
        if (r < 0) {
                server_stop(&server);
                uv_run(&loop, UV_RUN_DEFAULT);
                uv_loop_close(&loop);
                return 1;
        }
        log_info("gpupoold %s %s %s", GPUPOOL_VERSION, server.listen_inherited ? "serving systemd's socket" : "listening on",
                 server.node.options->socket_path);
        r = log_start_writer();
        if (r < 0)
                log_warn("cannot start the log's writer thread (%s): a log nobody reads may stall the daemon", strerror(-r));
        /* Every device's pool exists and the socket is live: ready, for Type=notify. */
        (void) notify_send("READY=1");
        server_notify_status(&server);
        uv_run(&loop, UV_RUN_DEFAULT);
        if (closer_stop(1000))
                log_warn("stopping with descriptors from clients still closing (a peer's socket lingers)");
        r = uv_loop_close(&loop);
        if (r < 0) {
                log_err("event loop closed with handles still open: %s", uv_strerror(r));
                log_stop_writer(1000);
                return 1;
        }
        log_info("stopped");
        log_stop_writer(1000);
        return 0;
}
