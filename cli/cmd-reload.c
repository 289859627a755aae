/*
 * cmd-reload.c: "gpupoolctl reload": has the daemon read its config file again and says how
 * it went: exit 0 with what was loaded, exit 1 with why a reload was refused (the running
 * config stays). Unlike a bare SIGHUP, the caller learns the outcome: the unit's ExecReload=.
 */
#include <jansson.h>
#include <stdio.h>

#include "cli.h"

static int run(struct cli *cli, int argc, char **argv) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__ReloadRequest rr = GPUPOOL__RELOAD_REQUEST__INIT;

        (void) argc, (void) argv;
        req.body_case = GPUPOOL__ENVELOPE__BODY_RELOAD;
        req.reload = &rr;
        if (cli_call(cli, &req, GPUPOOL__ENVELOPE__BODY_RELOAD_REPLY, &rep) < 0)
                return 1;
        if (cli->json)
                cli_print_json(json_pack("{s:s}", "outcome", rep->reload_reply->outcome));
        else
                printf("%s\n", rep->reload_reply->outcome);
        gpupool__envelope__free_unpacked(rep, NULL);
        return 0;
}

const struct cli_command cli_cmd_reload = {
        .name = "reload",
        .usage = "reload",
        .summary = "have the daemon read its config again; exit 1 saying why if refused",
        .help = "As SIGHUP does. Prints the files and tenants loaded, or why the reload was refused (the running\n"
                "config stays; exit 1). Root or the daemon's user only.\n",
        .run = run,
};
