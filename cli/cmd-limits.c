/*
 * cmd-limits.c: "gpupoolctl limits": every tenant, the rules that select its clients, its
 * limits and guarantee, and what its clients use.
 */
#include <jansson.h>
#include <stdio.h>

#include "cli.h"

static int run(struct cli *cli, int argc, char **argv) {
        Gpupool__Envelope *rep;

        (void) argc, (void) argv;
        if (cli_status(cli, &rep) < 0)
                return 1;
        if (cli->json) {
                json_t *root = json_object();

                                json_object_set_new(root, "tenants", cli_tenants_json(rep->status_reply));
                cli_print_json(root);
        } else {
                cli_print_tenants(rep->status_reply, true);
        }
        gpupool__envelope__free_unpacked(rep, NULL);
        return 0;
}

const struct cli_command cli_cmd_limits = {
        .name = "limits",
        .usage = "limits [--json]",
        .summary = "show tenants: rules, limits, guarantees and use",
        .help = "Every tenant with the rules that select its clients, its clients, reserved and in-use bytes,\n"
                "max, guarantee and client max ('-' for none); (set-limit) marks values changed at run time.\n",
        .run = run,
};
