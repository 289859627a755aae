/*
 * cmd-check.c: "gpupoolctl check": has the daemon run every consistency check now (pools and
 * tenants' sums). Exit 0 and a line saying so; exit 1 with what is broken.
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>

#include "cli.h"

static int run(struct cli *cli, int argc, char **argv) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__CheckRequest cr = GPUPOOL__CHECK_REQUEST__INIT;
        const Gpupool__CheckReply *c;

        (void) argc, (void) argv;
        req.body_case = GPUPOOL__ENVELOPE__BODY_CHECK;
        req.check = &cr;
        if (cli_call(cli, &req, GPUPOOL__ENVELOPE__BODY_CHECK_REPLY, &rep) < 0)
                return 1;
        c = rep->check_reply;
        if (cli->json)
                cli_print_json(json_pack("{s:I, s:I, s:I}", "pools", (json_int_t) c->pools, "checks_total",
                                         (json_int_t) c->checks_total, "faults_injected", (json_int_t) c->faults_injected));
        else
                printf("consistent: %u pool%s checked (%" PRIu64 " checks since start)\n", c->pools, c->pools == 1 ? "" : "s",
                       c->checks_total);
        gpupool__envelope__free_unpacked(rep, NULL);
        return 0;
}

const struct cli_command cli_cmd_check = {
        .name = "check",
        .usage = "check",
        .summary = "have the daemon check its pools and tenants now",
        .help = "Every pool's tiling, indices and byte accounting, and every tenant's sums. Prints how many\n"
                "pools were checked, or exits 1 saying what is broken. Root or the daemon's user only.\n",
        .run = run,
};
