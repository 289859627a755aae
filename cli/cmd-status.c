/*
 * cmd-status.c: "gpupoolctl status": every device's pool and every client, as an aligned
 * table or as JSON (keys documented in docs/cli.md and relied on by scripts).
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>

#include "cli.h"
#include "size.h"

static int print_json(const Gpupool__StatusReply *sr) {
        json_t *root = json_object(), *devices = json_array(), *clients = json_array();

        for (size_t i = 0; i < sr->n_devices; i++) {
                const Gpupool__DeviceStatus *d = sr->devices[i];

                json_array_append_new(devices, json_pack("{s:I, s:s, s:I, s:I, s:I, s:I}",
                        "index", (json_int_t) d->index, "backend", d->backend,
                        "total_bytes", (json_int_t) d->total_bytes, "reserved_bytes", (json_int_t) d->reserved_bytes,
                        "in_use_bytes", (json_int_t) d->in_use_bytes, "cached_bytes", (json_int_t) d->cached_bytes));
        }
        for (size_t i = 0; i < sr->n_clients; i++) {
                const Gpupool__ClientStatus *c = sr->clients[i];

                json_array_append_new(clients, json_pack("{s:I, s:I, s:s, s:I, s:I, s:I, s:I}",
                        "pid", (json_int_t) c->pid, "uid", (json_int_t) c->uid, "name", c->name,
                        "reserved_bytes", (json_int_t) c->reserved_bytes, "in_use_bytes", (json_int_t) c->in_use_bytes,
                        "blocks", (json_int_t) c->blocks, "limit_bytes", (json_int_t) c->limit_bytes));
        }
        json_object_set_new(root, "version", json_integer(1));
        json_object_set_new(root, "devices", devices);
        json_object_set_new(root, "clients", clients);
        json_dumpf(root, stdout, JSON_INDENT(2) | JSON_SORT_KEYS);
        fputc('\n', stdout);
        json_decref(root);
        return 0;
}

#define SZ(v, buf) gp_size_format((v), (buf), sizeof(buf))

static int print_table(const Gpupool__StatusReply *sr) {
        char a[GP_SIZE_FORMAT_MAX], b[GP_SIZE_FORMAT_MAX], c[GP_SIZE_FORMAT_MAX], d[GP_SIZE_FORMAT_MAX];

        printf("%-6s %-8s %12s %12s %12s %12s\n", "DEVICE", "BACKEND", "TOTAL", "RESERVED", "IN USE", "CACHED");
        for (size_t i = 0; i < sr->n_devices; i++) {
                const Gpupool__DeviceStatus *dev = sr->devices[i];

                printf("%-6u %-8s %12s %12s %12s %12s\n", dev->index, dev->backend, SZ(dev->total_bytes, a),
                       SZ(dev->reserved_bytes, b), SZ(dev->in_use_bytes, c), SZ(dev->cached_bytes, d));
        }
        printf("\n");
        if (sr->n_clients == 0) {
                printf("no clients\n");
                return 0;
        }
        printf("%-8s %-6s %-20s %12s %12s %8s %12s\n", "PID", "UID", "NAME", "RESERVED", "IN USE", "BLOCKS", "LIMIT");
        for (size_t i = 0; i < sr->n_clients; i++) {
                const Gpupool__ClientStatus *cl = sr->clients[i];

                printf("%-8d %-6u %-20.20s %12s %12s %8" PRIu64 " %12s%s\n", cl->pid, cl->uid, cl->name,
                       SZ(cl->reserved_bytes, a), SZ(cl->in_use_bytes, b), cl->blocks,
                       cl->limit_bytes ? SZ(cl->limit_bytes, c) : "-",
                       cl->has_exiting && cl->exiting ? "  (exiting)" : "");
        }
        return 0;
}

static int run(struct cli *cli, int argc, char **argv) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__StatusRequest sr = GPUPOOL__STATUS_REQUEST__INIT;
        int r;

        (void) argc, (void) argv;
        req.body_case = GPUPOOL__ENVELOPE__BODY_STATUS_REQUEST;
        req.status_request = &sr;
        if (cli_call(cli, &req, GPUPOOL__ENVELOPE__BODY_STATUS_REPLY, &rep) < 0)
                return 1;
        r = cli->json ? print_json(rep->status_reply) : print_table(rep->status_reply);
        gpupool__envelope__free_unpacked(rep, NULL);
        return r;
}

const struct cli_command cli_cmd_status = {
        .name = "status",
        .usage = "status [--json]",
        .summary = "show devices, pools and clients",
        .run = run,
};
