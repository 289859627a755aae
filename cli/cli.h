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
        bool connected;                 /* at the first call, once the arguments were found good */
        struct gp_conn conn;
};

struct cli_command {
        const char *name;
        const char *usage;
        const char *summary;
        const char *help;               /* what "COMMAND --help" adds: its arguments, what it prints */
        bool takes_args;                /* else anything after the name but --json is refused */
        /* Runs the command; returns the process exit code. */
        int (*run)(struct cli *cli, int argc, char **argv);
};

extern const struct cli_command cli_cmd_status;
extern const struct cli_command cli_cmd_objects;
extern const struct cli_command cli_cmd_unpublish;
extern const struct cli_command cli_cmd_limits;
extern const struct cli_command cli_cmd_set_limit;
extern const struct cli_command cli_cmd_flush;
extern const struct cli_command cli_cmd_trim;
extern const struct cli_command cli_cmd_check;
extern const struct cli_command cli_cmd_metrics;
extern const struct cli_command cli_cmd_reload;
extern const struct cli_command cli_cmd_reservations;
extern const struct cli_command cli_cmd_reserve;
extern const struct cli_command cli_cmd_unreserve;

/*
 * Sends a request (its body set by the caller), connecting first at the first call, and waits for the reply carrying body want;
 * prints why and returns a negative errno on failure. Free the reply with
 * gpupool__envelope__free_unpacked().
 */
int cli_call(struct cli *cli, Gpupool__Envelope *req, Gpupool__Envelope__BodyCase want, Gpupool__Envelope **ret_reply);

/* Says what is wrong with a command's arguments, its usage and where to read more; returns 2. */
int cli_usage_error(const struct cli_command *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

struct json_t;

/* Prints a command's JSON answer (adding "version": 1, keys sorted) and frees it. */
void cli_print_json(struct json_t *root);

/* Asks for the daemon's status (cmd-status.c). As cli_call(). */
int cli_status(struct cli *cli, Gpupool__Envelope **ret_reply);

/* The tenants of a status as a table (with their match rules if asked) or as JSON. */
void cli_print_tenants(const Gpupool__StatusReply *sr, bool with_rules);
struct json_t *cli_tenants_json(const Gpupool__StatusReply *sr);

/* Reservations as a table or as JSON (cmd-reservations.c). */
void cli_print_reservations(Gpupool__ReservationStatus *const *r, size_t n);
struct json_t *cli_reservations_json(Gpupool__ReservationStatus *const *r, size_t n);

#endif
