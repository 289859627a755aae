/*
 * gpupoolctl.c: the command line of gpupool: global options, the command table, and the
 * connection to the daemon the commands share.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#ifndef GPUPOOL_VERSION
#define GPUPOOL_VERSION "0.1.0"
#endif

static const struct cli_command *const commands[] = {
        &cli_cmd_status,
        &cli_cmd_flush,
};

static void usage(FILE *f) {
        fprintf(f, "Usage: gpupoolctl [--socket PATH] [--json] COMMAND\n\n"
                   "Inspect and manage the gpupool daemon of this node.\n\n"
                   "Commands:\n");
        for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
                fprintf(f, "  %-24s %s\n", commands[i]->usage, commands[i]->summary);
        fprintf(f, "\nOptions:\n"
                   "  --socket PATH   the daemon's socket (default: $GPUPOOL_SOCKET, else %s)\n"
                   "  --json          print JSON instead of a table\n"
                   "  --help          show this text\n"
                   "  --version       show the version\n", GP_DEFAULT_SOCKET);
}

int cli_call(struct cli *cli, Gpupool__Envelope *req, Gpupool__Envelope__BodyCase want, Gpupool__Envelope **ret_reply) {
        static uint8_t buf[GP_MAX_REPLY_BYTES];
        Gpupool__Envelope *rep;
        int n, r;

        req->version = GP_PROTOCOL_VERSION;
        req->id = cli->next_id++;
        n = gp_wire_pack(req, buf, GP_MAX_REQUEST_BYTES);
        if (n < 0)
                return n;
        r = gp_wire_send_packet(cli->sock, buf, (size_t) n, -1);
        if (r < 0) {
                fprintf(stderr, "gpupoolctl: sending to gpupoold: %s\n", strerror(-r));
                return r;
        }
        n = gp_wire_recv_packet(cli->sock, buf, sizeof(buf), NULL);
        if (n <= 0) {
                fprintf(stderr, "gpupoolctl: gpupoold closed the connection%s%s\n", n < 0 ? ": " : "",
                        n < 0 ? strerror(-n) : "");
                return n < 0 ? n : -ECONNRESET;
        }
        r = gp_wire_unpack(buf, (size_t) n, &rep);
        if (r < 0) {
                fprintf(stderr, "gpupoolctl: gpupoold sent a message this version cannot read\n");
                return -EPROTO;
        }
        if (rep->has_status && rep->status != GPUPOOL__STATUS__STATUS_OK) {
                r = gp_status_to_errno(rep->status);
                fprintf(stderr, "gpupoolctl: %s\n", rep->error ? rep->error : strerror(-r));
                gpupool__envelope__free_unpacked(rep, NULL);
                return r;
        }
        if (rep->id != req->id || (want != GPUPOOL__ENVELOPE__BODY__NOT_SET && rep->body_case != want)) {
                fprintf(stderr, "gpupoolctl: gpupoold answered with the wrong message\n");
                gpupool__envelope__free_unpacked(rep, NULL);
                return -EPROTO;
        }
        *ret_reply = rep;
        return 0;
}

static int cli_connect(struct cli *cli) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__Hello hello = GPUPOOL__HELLO__INIT;
        const char *path = gp_wire_socket_path(cli->socket_path);
        int r;

        r = gp_wire_connect(path, &cli->sock);
        if (r < 0) {
                fprintf(stderr, "gpupoolctl: cannot connect to %s: %s%s\n", path, strerror(-r),
                        r == -ENOENT || r == -ECONNREFUSED ? " (is gpupoold running?)" : "");
                return r;
        }
        hello.name = (char *) "gpupoolctl";
        req.body_case = GPUPOOL__ENVELOPE__BODY_HELLO;
        req.hello = &hello;
        r = cli_call(cli, &req, GPUPOOL__ENVELOPE__BODY_HELLO_REPLY, &rep);
        if (r < 0)
                return r;
        gpupool__envelope__free_unpacked(rep, NULL);
        return 0;
}

int main(int argc, char **argv) {
        static const struct option options[] = {
                { "socket", required_argument, NULL, 's' },
                { "json", no_argument, NULL, 'j' },
                { "help", no_argument, NULL, 'h' },
                { "version", no_argument, NULL, 'V' },
                { 0 },
        };
        struct cli cli = { .sock = -1, .next_id = 1 };
        const struct cli_command *cmd = NULL;
        int c, r;

        /* "+": options stop at the command, whose own arguments follow it. */
        while ((c = getopt_long(argc, argv, "+", options, NULL)) != -1) {
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
                default:
                        usage(stderr);
                        return 2;
                }
        }
        if (optind >= argc) {
                usage(stderr);
                return 2;
        }
        for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
                if (strcmp(argv[optind], commands[i]->name) == 0)
                        cmd = commands[i];
        if (!cmd) {
                fprintf(stderr, "gpupoolctl: unknown command '%s'\n\n", argv[optind]);
                usage(stderr);
                return 2;
        }
        /* Commands take --json after their name too: "gpupoolctl status --json". */
        for (int i = optind + 1; i < argc; i++) {
                if (strcmp(argv[i], "--json") == 0) {
                        cli.json = true;
                } else {
                        fprintf(stderr, "gpupoolctl %s: unexpected argument '%s'\nUsage: gpupoolctl %s\n", cmd->name,
                                argv[i], cmd->usage);
                        return 2;
                }
        }
        if (cli_connect(&cli) < 0)
                return 1;
        r = cmd->run(&cli, argc - optind, argv + optind);
        close(cli.sock);
        return r;
}
