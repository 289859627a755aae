/*
 * cmd-trim.c: "gpupoolctl trim --pid PID | --tenant NAME": asks clients to give back every
 * segment they hold mapped with no live block in it. Their library answers on its control
 * thread; the segments go to the daemon's cache, from which "gpupoolctl flush" or
 * idle_release returns them to the driver.
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
        Gpupool__TrimRequest tr = GPUPOOL__TRIM_REQUEST__INIT;
        const Gpupool__TrimReply *t;
        char size[GP_SIZE_FORMAT_MAX];

        for (int i = 1; i < argc; i++) {
                if (strcmp(argv[i], "--pid") == 0 && i + 1 < argc) {
                        char *end;
                        long pid = strtol(argv[++i], &end, 10);

                        if (*end || pid <= 0 || pid > INT32_MAX)
                                return cli_usage_error(&cli_cmd_trim, "--pid takes a process id, not '%s'", argv[i]);
                        tr.has_pid = 1;
                        tr.pid = (int32_t) pid;
                } else if (strcmp(argv[i], "--tenant") == 0 && i + 1 < argc) {
                        tr.tenant = argv[++i];
                } else if (strcmp(argv[i], "--pid") == 0 || strcmp(argv[i], "--tenant") == 0) {
                        return cli_usage_error(&cli_cmd_trim, "%s needs a value", argv[i]);
                } else {
                        return cli_usage_error(&cli_cmd_trim, "unexpected argument '%s'", argv[i]);
                }
        }
        if (!tr.tenant == !tr.has_pid)
                return cli_usage_error(&cli_cmd_trim, "name one process (--pid) or one tenant (--tenant)");
        req.body_case = GPUPOOL__ENVELOPE__BODY_TRIM;
        req.trim = &tr;
        if (cli_call(cli, &req, GPUPOOL__ENVELOPE__BODY_TRIM_REPLY, &rep) < 0)
                return 1;
        t = rep->trim_reply;
        if (cli->json)
                cli_print_json(json_pack("{s:I, s:I}", "clients", (json_int_t) t->clients, "bytes", (json_int_t) t->bytes));
        else
                printf("asked %u client%s to give back what %s free (%s as last known)\n", t->clients,
                       t->clients == 1 ? "" : "s", t->clients == 1 ? "it holds" : "they hold",
                       gp_size_format(t->bytes, size, sizeof(size)));
        gpupool__envelope__free_unpacked(rep, NULL);
        return 0;
}

const struct cli_command cli_cmd_trim = {
        .name = "trim",
        .usage = "trim --pid PID|--tenant NAME",
        .summary = "ask clients to give back the segments they keep free",
        .help = "  --pid PID           the clients of one process\n"
                "  --tenant NAME       the clients of one tenant\n\n"
                "Their library answers on its own thread; the segments go to the daemon's cache. Prints how\n"
                "many clients were asked and what they held free as last known. Root or the daemon's user only.\n",
        .takes_args = true,
        .run = run,
};
