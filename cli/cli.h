/*
 * cli.h: what gpupoolctl's commands share: the connection to the daemon, the output mode,
 * and the command table entry each command file defines.
 */
#ifndef GP_CLI_H
#define GP_CLI_H

#include <stdbool.h>

#include "conn.h"

struct cli {
        const char *socket_path;
        bool json;
        struct gp_conn conn;
};

struct cli_command {
        const char *name;
        const char *usage;
        const char *summary;
        /* Runs the command; returns the process exit code. */
        int (*run)(struct cli *cli, int argc, char **argv);
};

extern const struct cli_command cli_cmd_status;
extern const struct cli_command cli_cmd_flush;

/*
 * Sends a request (its body set by the caller) and waits for the reply carrying body want;
 * prints why and returns a negative errno on failure. Free the reply with
 * gpupool__envelope__free_unpacked().
 */
int cli_call(struct cli *cli, Gpupool__Envelope *req, Gpupool__Envelope__BodyCase want, Gpupool__Envelope **ret_reply);

#endif
