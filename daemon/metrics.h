/*
 * metrics.h: the daemon's state as Prometheus metrics (text exposition format 0.0.4), and the
 * small HTTP endpoint that serves them (metrics_listen). "gpupoolctl metrics" asks for the same
 * text over the daemon's socket.
 */
#ifndef GP_METRICS_H
#define GP_METRICS_H

#include <stddef.h>
#include <uv.h>

struct node;
struct session;

/*
 * The most bytes the metrics text takes: every device, tenant and reason at the longest
 * label and value. A protocol reply holds it (checked at build time in metrics.c).
 */
#define METRICS_TEXT_MAX (188 * 1024)

/*
 * Writes the metrics of node into buf, NUL-terminated. asking is the session that asked
 * (not counted as a client), or NULL. Returns the length, or -ENOBUFS when size is too small.
 */
int metrics_format(const struct node *node, const struct session *asking, char *buf, size_t size);

/* Most HTTP connections open at once; more are closed as they come. */
#define METRICS_HTTP_MAX_CONNECTIONS 8
/* How long an answered connection stays open for the peer to close it first (then it is closed). */
#define METRICS_HTTP_LINGER_MS 1000
/* Most bytes of an HTTP request (its line and headers); a longer one gets 431. */
#define METRICS_HTTP_MAX_REQUEST 4096

struct metrics_http;

/*
 * Serves GET /metrics on addr (options' metrics_listen) from loop: one request per
 * connection, which is closed after the answer or after send_timeout_ms without progress.
 * Every other path is 404, every other method 405. Returns 0 and *ret, or a negative errno
 * (logged).
 */
int metrics_http_start(struct node *node, uv_loop_t *loop, const struct sockaddr *addr,
                       struct metrics_http **ret);

/* Closes the listener and every connection; the memory goes when their handles have closed. NULL is fine. */
void metrics_http_stop(struct metrics_http *http);

#endif
