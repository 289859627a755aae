/*
 * cmd-flush.c: "gpupoolctl flush [--device N] [--tenant NAME]": give every cached (wholly
 * free) segment back to the backend, on every device or on one, and say what was released;
 * with a tenant, ask its clients for the segments they keep free, which go to the backend
 * as they come back.
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "size.h"

static int run(struct cli *cli, int argc, char **argv) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__FlushRequest fr = GPUPOOL__FLUSH_REQUEST__INIT;
        const Gpupool__FlushReply *f;
        char size[GP_SIZE_FORMAT_MAX];

        for (int i = 1; i < argc; i++) {
                char *end;
                long d;

                if (strcmp(argv[i], "--tenant") == 0 && i + 1 < argc) {
                        fr.tenant = argv[++i];
                        continue;
                }
                if (strcmp(argv[i], "--device") == 0 && i + 1 >= argc)
                        return cli_usage_error(&cli_cmd_flush, "--device needs a value");
                if (strcmp(argv[i], "--tenant") == 0)
                        return cli_usage_error(&cli_cmd_flush, "--tenant needs a value");
                if (strcmp(argv[i], "--device") != 0)
                        return cli_usage_error(&cli_cmd_flush, "unexpected argument '%s'", argv[i]);
                d = strtol(argv[++i], &end, 10);
                if (!*argv[i] || *end || d < 0 || d > 255)
                        return cli_usage_error(&cli_cmd_flush, "'%s' is not a device index (0 to 255)", argv[i]);
                fr.has_device = 1;
                fr.device = (uint32_t) d;
        }
        req.body_case = GPUPOOL__ENVELOPE__BODY_FLUSH;
        req.flush = &fr;
        if (cli_call(cli, &req, GPUPOOL__ENVELOPE__BODY_FLUSH_REPLY, &rep) < 0)
                return 1;
        f = rep->flush_reply;
        if (fr.tenant) {
                if (cli->json)
                        cli_print_json(json_pack("{s:I, s:I}", "clients_asked", (json_int_t) f->clients_asked,
                                                 "bytes_asked", (json_int_t) f->bytes_asked));
                else
                        printf("asked %u client%s of tenant %s to give back what %s free (%s as last known); it goes "
                               "back to the backend as the clients return it\n", f->clients_asked,
                               f->clients_asked == 1 ? "" : "s", fr.tenant, f->clients_asked == 1 ? "it holds" : "they hold",
                               gp_size_format(f->bytes_asked, size, sizeof(size)));
        } else if (cli->json) {
                json_t *root = json_object(), *devices = json_array();

                for (size_t i = 0; i < f->n_devices; i++)
                        json_array_append_new(devices, json_pack("{s:I, s:I, s:I}",
                                "index", (json_int_t) f->devices[i]->index,
                                "released_segments", (json_int_t) f->devices[i]->segments,
                                "released_bytes", (json_int_t) f->devices[i]->bytes));
                json_object_set_new(root, "devices", devices);
                cli_print_json(root);
        } else {
                for (size_t i = 0; i < f->n_devices; i++)
                        printf("device %u: released %" PRIu64 " cached segment%s, %s\n", f->devices[i]->index,
                               f->devices[i]->segments, f->devices[i]->segments == 1 ? "" : "s",
                               gp_size_format(f->devices[i]->bytes, size, sizeof(size)));
        }
        gpupool__envelope__free_unpacked(rep, NULL);
        return 0;
}

const struct cli_command cli_cmd_flush = {
        .name = "flush",
        .usage = "flush [--device N] [--tenant NAME]",
        .summary = "release cached segments (or a tenant's kept ones) to the backend",
        .help = "  --device N          device N only (default: every device)\n"
                "  --tenant NAME       leave the cache; ask the tenant's clients for the segments they keep\n"
                "                      free, which go straight back to the backend\n\n"
                "Prints per device the segments and bytes released. Memory clients hold is not touched.\n"
                "Root or the daemon's user only.\n",
        .takes_args = true,
        .run = run,
};
