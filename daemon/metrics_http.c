/*
 * metrics_http.c: GET /metrics for a Prometheus scraper, on the daemon's own libuv loop. It
 * is just enough HTTP/1.x for that: one request per connection, answered and closed. Every
 * resource a peer can hold is bounded: connections (METRICS_HTTP_MAX_CONNECTIONS), request
 * bytes (METRICS_HTTP_MAX_REQUEST) and time: send_timeout from accept to close, however
 * slowly the peer trickles its bytes, and METRICS_HTTP_LINGER_MS once answered. With every
 * connection taken, a new one displaces the oldest answered one, else the oldest that has not
 * finished its request, so that neither slow peers nor peers that keep their answered
 * connections open can keep scrapes out.
 */
#include "metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "node.h"

struct http_conn {
        struct metrics_http *http;
        uv_tcp_t tcp;
        uv_timer_t timer;
        uv_write_t write;
        uv_shutdown_t shutdown;
        unsigned handles;               /* open handles; the connection is freed at 0 */
        bool answered;                  /* reading on only drains what the peer still sends */
        bool closing;
        char *reply;
        size_t len;
        char request[METRICS_HTTP_MAX_REQUEST];
        struct http_conn *prev, *next;
};

struct metrics_http {
        struct node *node;
        uv_tcp_t listener;
        bool listener_open;
        struct http_conn *conns;
        unsigned count;
        unsigned closing;               /* of count, those closing */
        bool stopping;
};

static void maybe_free(struct metrics_http *http) {
        if (http->stopping && !http->listener_open && !http->conns)
                free(http);
}

static void on_conn_closed(uv_handle_t *handle) {
        struct http_conn *c = handle->data;
        struct metrics_http *http = c->http;

        if (--c->handles)
                return;
        http->closing--;
        if (c->prev)
                c->prev->next = c->next;
        else
                http->conns = c->next;
        if (c->next)
                c->next->prev = c->prev;
        http->count--;
        free(c->reply);
        free(c);
        maybe_free(http);
}

static void conn_close(struct http_conn *c) {
        if (c->closing)
                return;
        c->closing = true;
        c->http->closing++;
        uv_close((uv_handle_t *) &c->tcp, on_conn_closed);
        uv_close((uv_handle_t *) &c->timer, on_conn_closed);
}

static void on_timeout(uv_timer_t *timer) {
        conn_close(timer->data);
}

/* A connection's whole life, request and answer, is send_timeout from accept; 0 is never, as for clients. */
static void conn_deadline(struct http_conn *c) {
        uint64_t ms = c->http->node->options->send_timeout_ms;

        if (ms)
                uv_timer_start(&c->timer, on_timeout, ms, 0);
}

static void on_shutdown(uv_shutdown_t *req, int status) {
        struct http_conn *c = req->data;

        /*
         * Our half is closed; what the peer still sends is read and dropped until it closes, for
         * METRICS_HTTP_LINGER_MS at most: a peer that keeps an answered connection open holds
         * nothing for long (and its slot goes first to a new peer, on_connection()).
         */
        if (status < 0 || c->closing) {
                conn_close(c);
                return;
        }
        uv_timer_start(&c->timer, on_timeout, METRICS_HTTP_LINGER_MS, 0);
}

static void on_written(uv_write_t *req, int status) {
        struct http_conn *c = req->data;

        free(c->reply);
        c->reply = NULL;
        if (status < 0 || c->closing || uv_shutdown(&c->shutdown, (uv_stream_t *) &c->tcp, on_shutdown) < 0) {
                conn_close(c);
                return;
        }
}

/* Sends one answer (status line, headers, body unless head_only) and closes our half after it. */
static void answer(struct http_conn *c, const char *status, const char *extra_headers, const char *body, size_t body_len,
                   bool head_only) {
        static const char plain[] = "text/plain; charset=utf-8";
        static const char exposition[] = "text/plain; version=0.0.4; charset=utf-8";
        size_t head_max = 256 + strlen(extra_headers), size = head_max + body_len;
        uv_buf_t buf;
        int n;

        c->answered = true;
        c->reply = malloc(size);
        if (!c->reply) {
                log_warn("metrics: out of memory answering a scrape");
                conn_close(c);
                return;
        }
        n = snprintf(c->reply, head_max,
                     "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%sConnection: close\r\n\r\n", status,
                     status[0] == '2' ? exposition : plain, body_len, extra_headers);
        if (n < 0 || (size_t) n >= head_max) {
                conn_close(c);
                return;
        }
        if (!head_only)
                memcpy(c->reply + n, body, body_len);
        buf = uv_buf_init(c->reply, (unsigned) n + (head_only ? 0 : (unsigned) body_len));
        c->write.data = c->shutdown.data = c;
        if (uv_write(&c->write, (uv_stream_t *) &c->tcp, &buf, 1, on_written) < 0)
                conn_close(c);
}

static void answer_error(struct http_conn *c, const char *status, const char *extra_headers, const char *why) {
        char body[192];
        int n = snprintf(body, sizeof(body), "%s: %s\n", status, why);

        answer(c, status, extra_headers, body, n > 0 ? (size_t) n : 0, false);
}

static void answer_metrics(struct http_conn *c, bool head_only) {
        char *text = malloc(METRICS_TEXT_MAX);
        int n;

        if (!text) {
                answer_error(c, "503 Service Unavailable", "", "out of memory");
                return;
        }
        n = metrics_format(c->http->node, NULL, text, METRICS_TEXT_MAX);
        if (n < 0) {
                log_err("metrics: the text does not fit %d bytes", METRICS_TEXT_MAX);
                answer_error(c, "500 Internal Server Error", "", "the metrics do not fit the daemon's buffer");
        } else {
                answer(c, "200 OK", "", text, (size_t) n, head_only);
        }
        free(text);
}

/* The request line and headers are all in: "METHOD TARGET HTTP/1.x". Headers are not needed. */
static void handle_request(struct http_conn *c, size_t line_len) {
        char line[METRICS_HTTP_MAX_REQUEST + 1], method[16], target[256], version[16], extra;
        size_t path_len;

        memcpy(line, c->request, line_len);
        line[line_len] = '\0';
        if (line_len && line[line_len - 1] == '\r')
                line[line_len - 1] = '\0';
        if (sscanf(line, "%15[^ ] %255[^ ] %15[^ ] %c", method, target, version, &extra) != 3 ||
            strlen(line) != strlen(method) + strlen(target) + strlen(version) + 2 ||
            (strcmp(version, "HTTP/1.0") && strcmp(version, "HTTP/1.1"))) {
                answer_error(c, "400 Bad Request", "", "expected a request line such as GET /metrics HTTP/1.1");
                return;
        }
        if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
                answer_error(c, "405 Method Not Allowed", "Allow: GET, HEAD\r\n", "only GET and HEAD are served");
                return;
        }
        path_len = strcspn(target, "?");
        if (path_len != strlen("/metrics") || strncmp(target, "/metrics", path_len)) {
                answer_error(c, "404 Not Found", "", "gpupoold serves only /metrics");
                return;
        }
        answer_metrics(c, strcmp(method, "HEAD") == 0);
}

static void on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf) {
        struct http_conn *c = handle->data;

        (void) suggested;
        /* Once answered, whatever comes is read over the buffer's start and dropped. */
        if (c->answered)
                *buf = uv_buf_init(c->request, sizeof(c->request));
        else
                *buf = uv_buf_init(c->request + c->len, (unsigned) (sizeof(c->request) - c->len));
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
        struct http_conn *c = stream->data;
        const char *nl;

        (void) buf;
        if (nread < 0) {
                conn_close(c);  /* the peer closed (or failed) before asking, or after our answer */
                return;
        }
        if (nread == 0 || c->answered)
                return;
        c->len += (size_t) nread;
        /* The headers end at an empty line. */
        for (const char *p = c->request; (nl = memchr(p, '\n', c->len - (size_t) (p - c->request))); p = nl + 1) {
                const char *next = nl + 1;
                size_t rest = c->len - (size_t) (next - c->request);

                if ((rest >= 1 && next[0] == '\n') || (rest >= 2 && next[0] == '\r' && next[1] == '\n')) {
                        handle_request(c, (size_t) ((const char *) memchr(c->request, '\n', c->len) - c->request));
                        return;
                }
        }
        if (c->len == sizeof(c->request))
                answer_error(c, "431 Request Header Fields Too Large", "", "a request is at most 4096 bytes");
}

static void on_listener_closed(uv_handle_t *handle) {
        struct metrics_http *http = handle->data;

        http->listener_open = false;
        maybe_free(http);
}

static void on_connection(uv_stream_t *listener, int status) {
        struct metrics_http *http = listener->data;
        struct http_conn *c;

        if (status < 0) {
                node_log(http->node, LOG_LEVEL_WARN, "metrics: accept: %s", uv_strerror(status));
                return;
        }
        c = calloc(1, sizeof(*c));
        if (!c) {
                /* Nothing to accept it into: libuv then waits for an accept, so stop answering at all. */
                log_err("metrics: out of memory accepting a scrape; the endpoint stops");
                uv_close((uv_handle_t *) &http->listener, on_listener_closed);
                return;
        }
        c->http = http;
        c->tcp.data = c->timer.data = c;
        uv_tcp_init(listener->loop, &c->tcp);
        uv_timer_init(listener->loop, &c->timer);
        c->handles = 2;
        c->next = http->conns;
        if (c->next)
                c->next->prev = c;
        http->conns = c;
        http->count++;
        if (uv_accept(listener, (uv_stream_t *) &c->tcp) < 0) {
                conn_close(c);
                return;
        }
        if (http->count - http->closing > METRICS_HTTP_MAX_CONNECTIONS) {
                /*
                 * A new peer always gets a slot: the oldest answered connection goes (its peer
                 * has its answer), else the oldest still asking (connections are listed newest
                 * first), and only when every other one is closing already, this one.
                 */
                struct http_conn *oldest = NULL, *oldest_answered = NULL;

                for (struct http_conn *o = c->next; o; o = o->next)
                        if (!o->closing && o->answered)
                                oldest_answered = o;
                        else if (!o->closing)
                                oldest = o;
                if (oldest_answered)
                        oldest = oldest_answered;
                node_log(http->node, LOG_LEVEL_DEBUG, "metrics: %u scrapes open, the limit; closing %s",
                         METRICS_HTTP_MAX_CONNECTIONS, oldest_answered ? "the oldest answered one" :
                         oldest ? "the oldest that has not finished its request" : "the new one");
                conn_close(oldest ? oldest : c);
                if (!oldest)
                        return;
        }
        if (uv_read_start((uv_stream_t *) &c->tcp, on_alloc, on_read) < 0) {
                conn_close(c);
                return;
        }
        conn_deadline(c);
}

int metrics_http_start(struct node *node, uv_loop_t *loop, const struct sockaddr *addr, struct metrics_http **ret) {
        struct metrics_http *http = calloc(1, sizeof(*http));
        struct sockaddr_storage bound;
        int r, len = sizeof(bound);
        char name[64] = "?";

        if (!http)
                return -ENOMEM;
        http->node = node;
        http->listener.data = http;
        uv_tcp_init(loop, &http->listener);
        http->listener_open = true;
        r = uv_tcp_bind(&http->listener, addr, 0);
        if (r == 0)
                r = uv_listen((uv_stream_t *) &http->listener, 16, on_connection);
        if (r == 0)
                r = uv_tcp_getsockname(&http->listener, (struct sockaddr *) &bound, &len);
        if (r == 0)
                r = uv_ip_name((const struct sockaddr *) &bound, name, sizeof(name));
        if (r < 0) {
                log_err("metrics_listen: cannot listen: %s", uv_strerror(r));
                http->stopping = true;
                uv_close((uv_handle_t *) &http->listener, on_listener_closed);
                return r;
        }
        log_info("metrics: serving http://%s%s%s:%d/metrics", bound.ss_family == AF_INET6 ? "[" : "", name,
                 bound.ss_family == AF_INET6 ? "]" : "",
                 ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *) &bound)->sin6_port :
                                                     ((struct sockaddr_in *) &bound)->sin_port));
        *ret = http;
        return 0;
}

void metrics_http_stop(struct metrics_http *http) {
        if (!http || http->stopping)
                return;
        http->stopping = true;
        for (struct http_conn *c = http->conns; c; c = c->next)
                conn_close(c);
        if (uv_is_closing((uv_handle_t *) &http->listener))
                maybe_free(http);       /* closed when it ran out of memory */
        else
                uv_close((uv_handle_t *) &http->listener, on_listener_closed);
}
