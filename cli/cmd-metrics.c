/*
 * cmd-metrics.c: "gpupoolctl metrics": the daemon's metrics in the Prometheus text format, as
 * its metrics_listen endpoint serves them; for node_exporter's textfile collector, or a look
 * without HTTP.
 */
#include <stdio.h>

#include "cli.h"

static int run(struct cli *cli, int argc, char **argv) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__MetricsRequest mr = GPUPOOL__METRICS_REQUEST__INIT;
        int r = 0;

        (void) argc, (void) argv;
        if (cli->json) {
                fprintf(stderr, "gpupoolctl metrics: the metrics are Prometheus text; --json does not apply "
                                "(gpupoolctl status --json has the same numbers)\n");
                return 2;
        }
        req.body_case = GPUPOOL__ENVELOPE__BODY_METRICS;
        req.metrics = &mr;
        if (cli_call(cli, &req, GPUPOOL__ENVELOPE__BODY_METRICS_REPLY, &rep) < 0)
                return 1;
        if (fputs(rep->metrics_reply->text, stdout) == EOF || fflush(stdout) == EOF) {
                perror("gpupoolctl metrics: writing");
                r = 1;
        }
        gpupool__envelope__free_unpacked(rep, NULL);
        return r;
}

const struct cli_command cli_cmd_metrics = {
        .name = "metrics",
        .usage = "metrics",
        .summary = "print the metrics in the Prometheus text format",
        .help = "The text gpupoold --metrics-listen serves over HTTP (format 0.0.4), for node_exporter's textfile\n"
                "collector where there is no endpoint. --json does not apply: status --json has the numbers.\n",
        .run = run,
};
