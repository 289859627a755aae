/*
 * fuzz_protocol.c: libFuzzer target for everything a client's bytes reach in gpupoold: the
 * packet reader (with descriptors), the decoder and every request handler, against a real
 * server on the host backend with --check-invariants (a broken invariant aborts, which the
 * fuzzer reports).
 *
 * An input is a sequence of packets, each: one flags byte (bit 0: pass a descriptor with it;
 * bit 1: start a second client), two length bytes (little endian), then the payload. After
 * each packet the daemon's loop runs once and the client reads what came back. At the end the
 * clients leave and every session is torn down, so inputs do not leak state into each other.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "backend.h"
#include "config.h"
#include "server.h"
#include "session.h"

static uv_loop_t loop;
static struct server server;
static struct config config;

static char state_dir[] = "/tmp/gpupool-fuzz-XXXXXX";

/* The reservations' file the inputs make, and its directory, go when the fuzzer exits. */
static void remove_state(void) {
        char path[sizeof(state_dir) + 32];

        snprintf(path, sizeof(path), "%s/reservations", state_dir);
        (void) unlink(path);
        snprintf(path, sizeof(path), "%s/.reservations.new", state_dir);
        (void) unlink(path);
        (void) rmdir(state_dir);
}

static void setup(void) {
        struct backend *backend;
        static char *argv[] = { "gpupoold", NULL };

        options_defaults(&config.options);
        /* Reservations are kept somewhere, so that their puts reach past the first refusal. */
        if (!mkdtemp(state_dir))
                abort();
        atexit(remove_state);
        snprintf(config.options.state_dir, sizeof(config.options.state_dir), "%s", state_dir);
        config.options.check_invariants = true;
        config.options.log_level = LOG_LEVEL_ERR;
        config.tenant_count = 1;
        strcpy(config.tenants[0].name, "default");
        log_open(LOG_LEVEL_ERR);
        if (uv_loop_init(&loop) < 0 || backend_host_open(64ULL << 20, &backend) < 0 ||
            server_init(&server, &loop, &config, 1, argv, backend) < 0)
                abort();
}

/* Reads and drops what the daemon sent to sock. */
static void drain(int sock) {
        uint8_t buf[GP_MAX_REPLY_BYTES];
        int fd;

        for (;;) {
                fd = -1;
                if (gp_wire_recv_packet(sock, buf, sizeof(buf), &fd) <= 0)
                        break;
                if (fd >= 0)
                        close(fd);
        }
}

static int client(void) {
        int sv[2];

        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
                abort();
        if (session_start(&server.node, sv[0], SESSION_ADMIT_CLIENT, false) < 0) {
                close(sv[1]);
                return -1;
        }
        return sv[1];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        static bool ready;
        int socks[2] = { -1, -1 }, n = 0;

        if (!ready) {
                setup();
                ready = true;
        }
        socks[n++] = client();
        while (size >= 3 && socks[0] >= 0) {
                uint8_t flags = data[0];
                size_t len = (size_t) data[1] | (size_t) data[2] << 8;
                int sock, fd = -1;

                data += 3, size -= 3;
                if (len > size)
                        len = size;
                if ((flags & 2) && n < 2)
                        socks[n++] = client();
                sock = socks[(flags & 4) && n == 2 && socks[1] >= 0 ? 1 : 0];
                if (flags & 1)
                        fd = memfd_create("fuzz", MFD_CLOEXEC);
                /* An empty packet is a case too: the reader must refuse it. */
                if (len)
                        (void) gp_wire_send_packet(sock, data, len, fd);
                else
                        (void) send(sock, "", 0, MSG_DONTWAIT | MSG_NOSIGNAL);
                if (fd >= 0)
                        close(fd);
                data += len, size -= len;
                uv_run(&loop, UV_RUN_NOWAIT);
                drain(sock);
        }
        for (int i = 0; i < n; i++)
                if (socks[i] >= 0)
                        close(socks[i]);
        uv_run(&loop, UV_RUN_NOWAIT);
        session_destroy_all(&server.node);
        for (unsigned d = 0; d < server.node.device_count; d++)
                pool_flush(server.node.pools[d], NULL, NULL);
        uv_run(&loop, UV_RUN_NOWAIT);
        node_after_change(&server.node);
        return 0;
}
