/*
 * gpupoolctl.c: the command line of gpupool: global options, the command table, and the
 * connection to the daemon the commands share.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static const struct cli_command *const commands[] = {
        &cli_cmd_status,
        &cli_cmd_limits,
        &cli_cmd_set_limit,
        &cli_cmd_reservations,
        &cli_cmd_reserve,
        &cli_cmd_unreserve,
        &cli_cmd_flush,
        &cli_cmd_trim,
        &cli_cmd_check,
        &cli_cmd_metrics,
        &cli_cmd_reload,
        &cli_cmd_objects,
        &cli_cmd_unpublish,
};

static void usage(FILE *f) {
        fprintf(f, "Usage: gpupoolctl [--socket PATH] [--json] COMMAND\n\n"
                   "Inspect and manage the gpupool daemon of this node.\n\n"
                   "Commands:\n");
        /* A usage too long for its column gets a line of its own, the summary under it in the column. */
        for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
                if (strlen(commands[i]->usage) <= 24)
                        fprintf(f, "  %-24s %s\n", commands[i]->usage, commands[i]->summary);
                else
                        fprintf(f, "  %s\n  %-24s %s\n", commands[i]->usage, "", commands[i]->summary);
        fprintf(f, "  %-24s %s\n", "help [COMMAND]", "show this text, or what COMMAND takes and prints");
        fprintf(f, "\nOptions:\n"
                   "  --socket PATH   the daemon's socket (default: $GPUPOOL_SOCKET, else %s)\n"
                   "  --json          print JSON instead of a table\n"
                   "  -h, --help      show this text (COMMAND --help: that command's)\n"
                   "  --version       show the version\n", GP_DEFAULT_SOCKET);
}

static void command_help(const struct cli_command *cmd) {
        printf("Usage: gpupoolctl [--socket PATH] [--json] %s\n\n%c%s.\n", cmd->usage, cmd->summary[0] - 'a' + 'A',
               cmd->summary + 1);
        if (cmd->help)
                printf("\n%s", cmd->help);
}

int cli_usage_error(const struct cli_command *cmd, const char *fmt, ...) {
        va_list ap;

        fprintf(stderr, "gpupoolctl %s: ", cmd->name);
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fprintf(stderr, "\nUsage: gpupoolctl %s\n(gpupoolctl %s --help says more)\n", cmd->usage, cmd->name);
        return 2;
}

static const struct cli_command *find_command(const char *name) {
        for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
                if (strcmp(name, commands[i]->name) == 0)
                        return commands[i];
        return NULL;
}

void cli_print_json(json_t *root) {
        json_object_set_new(root, "version", json_integer(1));
        json_dumpf(root, stdout, JSON_INDENT(2) | JSON_SORT_KEYS);
        fputc('\n', stdout);
        json_decref(root);
}

static int cli_connect(struct cli *cli) {
        Gpupool__Hello hello = GPUPOOL__HELLO__INIT;
        int r;

        hello.name = "gpupoolctl";
        hello.has_admin = 1;
        hello.admin = 1;        /* let in past the client limits, as an operator's */
        r = gp_conn_open(&cli->conn, cli->socket_path, &hello, NULL);
        if (r < 0)
                fprintf(stderr, "gpupoolctl: %s\n", cli->conn.error);    /* it names the socket, and what to do */
        return r;
}

int cli_call(struct cli *cli, Gpupool__Envelope *req, Gpupool__Envelope__BodyCase want, Gpupool__Envelope **ret_reply) {
        int r;

        if (!cli->connected) {
                if (cli_connect(cli) < 0)
                        return -1;
                cli->connected = true;
        }
        r = gp_conn_call(&cli->conn, req, want, ret_reply, NULL);
        if (r < 0)
                fprintf(stderr, "gpupoolctl: %s\n", cli->conn.error);
        return r;
}

int main(int argc, char **argv) {
        static const struct option options[] = {
                { "socket", required_argument, NULL, 's' },
                { "json", no_argument, NULL, 'j' },
                { "help", no_argument, NULL, 'h' },
                { "version", no_argument, NULL, 'V' },
                { 0 },
        };
        static struct cli cli;  /* static: the connection holds a reply buffer */
        const struct cli_command *cmd = NULL;
        int c, r;

        /* "+": options stop at the command, whose own arguments follow it; ":", the errors are ours to say. */
        opterr = 0;
        while ((c = getopt_long(argc, argv, "+:h", options, NULL)) != -1) {
                switch (c) {
                case 's':
                        cli.socket_path = optarg;
                        break;
                case 'j':
                        cli.json = true;
                        break;
                case 'h':
                        usage(stdout);
                        return 0;
                case 'V':
                        printf("gpupoolctl %s\n", GPUPOOL_VERSION);
                        return 0;
                case ':':
                        fprintf(stderr, "gpupoolctl: option '%s' needs an argument\n\n", argv[optind - 1]);
                        usage(stderr);
                        return 2;
                default:
                        fprintf(stderr, "gpupoolctl: unknown option '%s'\n\n", argv[optind - 1]);
                        usage(stderr);
                        return 2;
                }
        }
        if (optind >= argc) {
                usage(stderr);
                return 2;
        }
        /* "help" alone is --help; "help COMMAND" is "COMMAND --help". */
        if (strcmp(argv[optind], "help") == 0) {
                if (optind + 1 >= argc) {
                        usage(stdout);
                        return 0;
                }
                if (optind + 2 < argc) {
                        fprintf(stderr, "gpupoolctl help: one command at a time, not '%s' too\nUsage: gpupoolctl help [COMMAND]\n", argv[optind + 2]);
                        return 2;
                }
                if (!(cmd = find_command(argv[optind + 1]))) {
                        fprintf(stderr, "gpupoolctl help: unknown command '%s'\n\n", argv[optind + 1]);
                        usage(stderr);
                        return 2;
                }
                command_help(cmd);
                return 0;
        }
        cmd = find_command(argv[optind]);
        if (!cmd) {
                fprintf(stderr, "gpupoolctl: unknown command '%s'\n\n", argv[optind]);
                usage(stderr);
                return 2;
        }
        /* Commands take --json after their name too: "gpupoolctl status --json"; the rest is theirs. */
        {
                int n = 0;
                bool names = false;     /* after "--", every argument is the command's as it stands */

                for (int i = optind; i < argc; i++) {
                        names = names || (i > optind && strcmp(argv[i], "--") == 0);
                        if (!names && i > optind && strcmp(argv[i], "--json") == 0)
                                cli.json = true;
                        else
                                argv[optind + n++] = argv[i];
                }
                argc = optind + n;
        }
        /* Every command answers -h and --help, before anything reaches the daemon. */
        for (int i = optind + 1; i < argc && strcmp(argv[i], "--") != 0; i++)
                if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
                        command_help(cmd);
                        return 0;
                }
        if (!cmd->takes_args && argc - optind > 1)
                return cli_usage_error(cmd, "unexpected argument '%s'", argv[optind + 1]);
        /* The command checks its arguments first; its first call connects (a bad command line is 2, daemon or not). */
        r = cmd->run(&cli, argc - optind, argv + optind);
        if (cli.connected)
                gp_conn_close(&cli.conn);
        return r;
}
