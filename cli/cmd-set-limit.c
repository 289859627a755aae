/*
 * cmd-set-limit.c: "gpupoolctl set-limit --tenant NAME|--pid PID max=SIZE guarantee=SIZE":
 * changes a tenant's limits, or one client's, in the running daemon. The change lasts until
 * the next reload (SIGHUP) or restart, which restore the config file's values.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "size.h"

#define bad(...) cli_usage_error(&cli_cmd_set_limit, __VA_ARGS__)

static int run(struct cli *cli, int argc, char **argv) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__SetLimitRequest sl = GPUPOOL__SET_LIMIT_REQUEST__INIT;

        for (int i = 1; i < argc; i++) {
                const char *a = argv[i];

                if (strcmp(a, "--tenant") == 0 && i + 1 < argc) {
                        sl.tenant = argv[++i];
                } else if (strcmp(a, "--pid") == 0 && i + 1 < argc) {
                        char *end;
                        long pid = strtol(argv[++i], &end, 10);

                        if (*end || pid <= 0 || pid > INT32_MAX)
                                return bad("'%s' is not a pid", argv[i]);
                        sl.has_pid = 1;
                        sl.pid = (int32_t) pid;
                } else if (strncmp(a, "max=", 4) == 0) {
                        if (gp_size_parse(a + 4, &sl.max_bytes) < 0)
                                return bad("max: '%s' is not a size (0 for none)", a + 4);
                        sl.has_max_bytes = 1;
                } else if (strncmp(a, "guarantee=", 10) == 0) {
                        if (gp_size_parse(a + 10, &sl.guarantee_bytes) < 0)
                                return bad("guarantee: '%s' is not a size", a + 10);
                        sl.has_guarantee_bytes = 1;
                } else if (strcmp(a, "--tenant") == 0 || strcmp(a, "--pid") == 0) {
                        return bad("%s needs a value", a);
                } else {
                        return bad("unexpected argument '%s'", a);
                }
        }
        if (!sl.tenant == !sl.has_pid)
                return bad("name one tenant (--tenant) or one client (--pid)");
        if (!sl.has_max_bytes && !sl.has_guarantee_bytes)
                return bad("give max=SIZE, guarantee=SIZE or both");
        req.body_case = GPUPOOL__ENVELOPE__BODY_SET_LIMIT;
        req.set_limit = &sl;
        if (cli_call(cli, &req, GPUPOOL__ENVELOPE__BODY__NOT_SET, &rep) < 0)
                return 1;
        gpupool__envelope__free_unpacked(rep, NULL);
        if (!cli->json)
                printf("set until the next reload of gpupoold's config\n");
        return 0;
}

const struct cli_command cli_cmd_set_limit = {
        .name = "set-limit",
        .usage = "set-limit --tenant NAME|--pid PID [max=SIZE] [guarantee=SIZE]",
        .summary = "change limits in the running daemon (until reload)",
        .help = "  --tenant NAME       a tenant's max and guarantee\n"
                "  --pid PID           one client process's per-device max\n"
                "  max=SIZE            the most bytes (0: no limit); SIZE as 512M, 4G, 1.5GiB\n"
                "  guarantee=SIZE      bytes kept for the tenant\n\n"
                "Until the next reload or restart, which restore the config file's. Root or the daemon's user\n"
                "only. Exit 1 when refused (saying why), 2 for a bad command line.\n",
        .takes_args = true,
        .run = run,
};
