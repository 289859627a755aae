/*
 * cli.h: what gpupoolctl's commands share: the connection to the daemon, the output mode,
 * and the command table entry each command file defines.
 */
#ifndef GP_CLI_H
#define GP_CLI_H

#include <stdbool.h>

#include "wire.h"

struct cli {
        const char *socket_path;
        bool json;
        int sock;
        uint64_t next_id;
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
 * Sends a request with body (its case set by the caller) and waits for the reply; prints the
 * daemon's error and returns a negative errno when the status is not OK. Free the reply with
 * gpupool__envelope__free_unpacked().
 */
int cli_call(struct cli *cli, Gpupool__Envelope *req, Gpupool__Envelope__BodyCase want, Gpupool__Envelope **ret_reply);

#endif
