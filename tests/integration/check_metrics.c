/*
 * check_metrics.c: the Prometheus metrics end to end: "gpupoolctl metrics" and GET /metrics
 * parse line by line as the text format, agree with what clients did, and the HTTP endpoint
 * answers only GET /metrics and holds nothing a peer could pile up (connections, bytes, time).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gpupool.h"
#include "metrics.h"
#include "suites.h"
#include "testlib.h"

#define KiB (1ULL << 10)
#define MiB (1ULL << 20)

/* The port the daemon's log says it serves metrics on (it was started on port 0). */
static int metrics_port(struct testd *d) {
        static char log[16384];
        const char *at;

        read_text(d->log, log, sizeof(log));
        at = strstr(log, "metrics: serving http://127.0.0.1:");
        ck_assert_msg(at, "no metrics line in the log: %s", log);
        return atoi(at + strlen("metrics: serving http://127.0.0.1:"));
}

static int tcp_connect(int port) {
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t) port) };
        struct timeval tv = { .tv_sec = 10 };
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

        ck_assert_int_ge(fd, 0);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ck_assert_int_eq(connect(fd, (struct sockaddr *) &a, sizeof(a)), 0);
        /* Nothing here waits longer than this for the daemon: a hang fails instead. */
        ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
        return fd;
}

/* Reads until the daemon closes; returns the bytes read (NUL-terminated). */
static size_t read_to_end(int fd, char *buf, size_t size) {
        size_t len = 0;
        ssize_t n;

        while ((n = recv(fd, buf + len, size - 1 - len, 0)) > 0)
                len += (size_t) n;
        ck_assert_msg(n == 0, "the daemon did not close the connection: %s", strerror(errno));
        buf[len] = '\0';
        return len;
}

/* Sends request as is and returns the whole answer in buf. */
static const char *http(int port, const char *request, char *buf, size_t size) {
        int fd = tcp_connect(port);

        ck_assert_int_eq(send(fd, request, strlen(request), MSG_NOSIGNAL), (ssize_t) strlen(request));
        read_to_end(fd, buf, size);
        close(fd);
        return buf;
}

/* An answer's body, after its empty line. */
static const char *body_of(const char *answer) {
        const char *b = strstr(answer, "\r\n\r\n");

        ck_assert_msg(b, "no end of headers in: %s", answer);
        return b + 4;
}

static bool name_char(char c, bool first) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' || (!first && c >= '0' && c <= '9');
}

/*
 * Parses text as the Prometheus text format (0.0.4), failing the test at the first line that
 * is not: HELP and TYPE once per family and before its samples, names and labels of the
 * allowed characters, label values quoted with only the allowed escapes, a number for every
 * value, no series twice, counters named *_total, no pid label, a newline at the end.
 * Returns the number of samples.
 */
static int parse_exposition(const char *text) {
        static char families[64][80], series[512][256];
        static char types[64][16];
        size_t nfam = 0, nser = 0;
        char line[512];
        const char *p = text;
        int samples = 0;

        ck_assert_msg(*text && text[strlen(text) - 1] == '\n', "the text does not end with a newline");
        while (*p) {
                const char *nl = strchr(p, '\n');
                size_t len = (size_t) (nl - p), i = 0, name_len;
                char *end;

                ck_assert_uint_lt(len, sizeof(line));
                memcpy(line, p, len);
                line[len] = '\0';
                p = nl + 1;
                if (strncmp(line, "# HELP ", 7) == 0 || strncmp(line, "# TYPE ", 7) == 0) {
                        char name[80], rest[400];
                        size_t f;

                        ck_assert_msg(sscanf(line + 7, "%79s %399[^\n]", name, rest) == 2, "bad comment: %s", line);
                        for (f = 0; f < nfam && strcmp(families[f], name); f++)
                                ;
                        if (line[2] == 'H') {
                                ck_assert_msg(f == nfam, "second HELP for %s", name);
                                ck_assert_uint_lt(nfam, 64);
                                snprintf(families[nfam], sizeof(families[nfam]), "%s", name);
                                types[nfam++][0] = '\0';
                        } else {
                                ck_assert_msg(f < nfam && !types[f][0], "TYPE for %s without its HELP, or twice", name);
                                ck_assert_msg(!strcmp(rest, "counter") || !strcmp(rest, "gauge"), "type %s", rest);
                                snprintf(types[f], sizeof(types[f]), "%.15s", rest);
                                if (!strcmp(rest, "counter"))
                                        ck_assert_msg(strlen(name) > 6 && !strcmp(name + strlen(name) - 6, "_total"),
                                                      "counter %s does not end in _total", name);
                        }
                        ck_assert_msg(strncmp(name, "gpupool_", 8) == 0, "%s lacks the gpupool_ prefix", name);
                        continue;
                }
                ck_assert_msg(line[0] != '#', "unknown comment: %s", line);
                /* name{label="value",...} value */
                while (name_char(line[i], i == 0))
                        i++;
                name_len = i;
                ck_assert_msg(name_len > 0, "no metric name: %s", line);
                {
                        size_t f;

                        for (f = 0; f < nfam && (strlen(families[f]) != name_len || strncmp(families[f], line, name_len)); f++)
                                ;
                        ck_assert_msg(f < nfam && types[f][0], "sample before its family's TYPE: %s", line);
                }
                if (line[i] == '{') {
                        i++;
                        while (line[i] != '}') {
                                size_t label = i;

                                while (name_char(line[i], i == label) && line[i] != ':')
                                        i++;
                                ck_assert_msg(i > label && line[i] == '=' && line[i + 1] == '"', "bad label: %s", line);
                                ck_assert_msg(strncmp(line + label, "pid=", 4), "a pid label: %s", line);
                                for (i += 2; line[i] != '"'; i++) {
                                        ck_assert_msg(line[i], "unterminated label value: %s", line);
                                        if (line[i] == '\\') {
                                                i++;
                                                ck_assert_msg(line[i] == '\\' || line[i] == '"' || line[i] == 'n',
                                                              "bad escape: %s", line);
                                        }
                                }
                                i++;
                                ck_assert_msg(line[i] == ',' || line[i] == '}', "bad label list: %s", line);
                                if (line[i] == ',')
                                        i++;
                        }
                        i++;
                }
                ck_assert_msg(line[i] == ' ', "no space before the value: %s", line);
                line[i] = '\0';
                (void) strtod(line + i + 1, &end);
                ck_assert_msg(end != line + i + 1 && *end == '\0', "bad value in: %s %s", line, line + i + 1);
                for (size_t k = 0; k < nser; k++)
                        ck_assert_msg(strcmp(series[k], line), "series %s twice", line);
                ck_assert_uint_lt(nser, 512);
                snprintf(series[nser++], sizeof(series[0]), "%.255s", line);
                samples++;
        }
        return samples;
}

#define DEV "{device=\"0\",uuid=\"\"}"

/* Both ways of asking say what the clients did, and every line parses. */
START_TEST(test_metrics_scrape) {
        static char text[METRICS_TEXT_MAX], answer[METRICS_TEXT_MAX + 1024], head[1024];
        gpupool_client *c;
        void *p[4], *big;
        struct testd d;
        char cmd[512];
        int port;

        testd_start(&d, "--metrics-listen", "127.0.0.1:0", "--client-limit", "8M", NULL);
        port = metrics_port(&d);
        ck_assert_int_eq(gpupool_connect(d.sock, "scraped", &c), 0);
        for (int i = 0; i < 4; i++)
                ck_assert_int_eq(gpupool_alloc(c, 0, 512 * KiB, &p[i]), 0);
        /* A 12 MiB block needs a 20 MiB segment: over the client's 8 MiB. */
        ck_assert_int_eq(gpupool_alloc(c, 0, 12 * MiB, &big), -EDQUOT);

        testd_metrics(&d, text, sizeof(text));
        ck_assert_int_gt(parse_exposition(text), 20);
        ck_assert(metrics_value(text, "gpupool_build_info{version=\"" GPUPOOL_VERSION "\",backend=\"host\"}") == 1);
        ck_assert(metrics_value(text, "gpupool_clients{state=\"connected\"}") == 1);       /* not gpupoolctl itself */
        ck_assert(metrics_value(text, "gpupool_device_total_bytes" DEV) == testd_device(&d, 0, "total_bytes"));
        /* The process's pool carved the four blocks from one segment it leased; in use is as it last reported. */
        ck_assert(metrics_value(text, "gpupool_device_in_use_bytes" DEV) == testd_device(&d, 0, "in_use_bytes"));
        ck_assert(metrics_value(text, "gpupool_device_reserved_bytes" DEV) == 2 * MiB);
        ck_assert(metrics_value(text, "gpupool_device_cached_bytes" DEV) == 0);
        ck_assert(metrics_value(text, "gpupool_leases_total" DEV) == 1);
        ck_assert(metrics_value(text, "gpupool_refusals_total{reason=\"client_limit\"}") == 1);
        ck_assert(metrics_value(text, "gpupool_refusals_total{reason=\"device_full\"}") == 0);
        ck_assert(metrics_value(text, "gpupool_tenant_in_use_bytes{tenant=\"default\"}") ==
                  metrics_value(text, "gpupool_device_in_use_bytes" DEV));
        ck_assert(metrics_value(text, "gpupool_tenant_clients{tenant=\"default\"}") == 1);

        /* Over HTTP: the same text (nothing changed), with the exposition format's content type. */
        http(port, "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n", answer, sizeof(answer));
        ck_assert_msg(strncmp(answer, "HTTP/1.1 200 OK\r\n", 17) == 0, "%s", answer);
        ck_assert_msg(strstr(answer, "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"), "%s", answer);
        ck_assert_str_eq(body_of(answer), text);
        /* HEAD: the headers alone, the length of what GET sends. */
        http(port, "HEAD /metrics HTTP/1.0\r\n\r\n", head, sizeof(head));
        ck_assert_str_eq(body_of(head), "");
        {
                char want[64];

                snprintf(want, sizeof(want), "\r\nContent-Length: %zu\r\n", strlen(text));
                ck_assert_msg(strstr(head, want), "%s", head);
        }
        /* A query string is the same page; bare newlines end headers too. */
        http(port, "GET /metrics?name[]=x HTTP/1.0\n\n", answer, sizeof(answer));
        ck_assert_str_eq(body_of(answer), text);

        for (int i = 0; i < 4; i++)
                ck_assert_int_eq(gpupool_free(c, p[i]), 0);
        gpupool_disconnect(c);
        http(port, "GET /metrics HTTP/1.1\r\n\r\n", answer, sizeof(answer));
        ck_assert_int_gt(parse_exposition(body_of(answer)), 20);
        ck_assert(metrics_value(answer, "gpupool_clients{state=\"connected\"}") == 0);
        ck_assert(metrics_value(answer, "gpupool_device_in_use_bytes" DEV) == 0);
        ck_assert(metrics_value(answer, "gpupool_device_cached_bytes" DEV) == 2 * MiB);
        ck_assert(metrics_value(answer, "gpupool_leases_total" DEV) == 1);    /* a counter keeps counting */

        /* --json has no meaning for Prometheus text: said, not ignored. */
        snprintf(cmd, sizeof(cmd), "%s/gpupoolctl --socket %s metrics --json 2>&1", build_dir(), d.sock);
        ck_assert_int_eq(run_capture(cmd, text, sizeof(text)), 2);
        ck_assert_msg(strstr(text, "--json does not apply"), "%s", text);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* Tenants and refusal reasons each get their own series. */
START_TEST(test_metrics_tenants_and_reasons) {
        static char text[METRICS_TEXT_MAX];
        char conf[128], dir[96];
        gpupool_client *c;
        struct testd d;
        void *p;
        FILE *f;

        test_mkdtemp(dir, sizeof(dir), "metrics");
        snprintf(conf, sizeof(conf), "%s/gpupoold.conf", dir);
        f = fopen(conf, "w");
        ck_assert_ptr_nonnull(f);
        fputs("[tenant:train]\nmatch_name = train-*\nmax = 4M\n", f);
        fclose(f);
        testd_start(&d, "--config", conf, NULL);
        ck_assert_int_eq(gpupool_connect(d.sock, "train-1", &c), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 5 * MiB, &p), -EDQUOT);           /* a 6 MiB segment at least: over 4M */
        ck_assert_int_eq(gpupool_alloc(c, 0, 1 * MiB, &p), 0);
        ck_assert_int_eq(gpupool_alloc(c, 0, 2 * (1ULL << 30), &p), -EDQUOT);  /* the tenant, before the device */
        ck_assert_int_eq(gpupool_alloc(c, 0, 1 * KiB, &p), 0);                 /* from the 2 MiB segment it holds */
        /* What the process holds in use reaches the daemon in its next report. */
        ck_assert(testd_client_becomes(&d, 0, "train-1", "in_use_bytes", 1 * MiB + 1 * KiB));
        testd_metrics(&d, text, sizeof(text));
        parse_exposition(text);
        ck_assert(metrics_value(text, "gpupool_refusals_total{reason=\"tenant_limit\"}") == 2);
        ck_assert_ptr_null(strstr(text, "max_blocks"));        /* obsolete: no reason of that name */
        ck_assert(metrics_value(text, "gpupool_refusals_total{reason=\"client_limit\"}") == 0);
        ck_assert(metrics_value(text, "gpupool_tenant_clients{tenant=\"train\"}") == 1);
        ck_assert(metrics_value(text, "gpupool_tenant_clients{tenant=\"default\"}") == 0);     /* gpupoolctl is not counted */
        ck_assert(metrics_value(text, "gpupool_tenant_in_use_bytes{tenant=\"train\"}") == 1 * MiB + 1 * KiB);
        ck_assert(metrics_value(text, "gpupool_tenant_reserved_bytes{tenant=\"train\"}") == 2 * MiB);
        ck_assert(metrics_value(text, "gpupool_tenant_in_use_bytes{tenant=\"default\"}") == 0);
        gpupool_disconnect(c);
        ck_assert_int_eq(testd_stop(&d), 0);
        unlink(conf);
        rmdir(dir);
}
END_TEST

/* Anything but GET or HEAD of /metrics gets a status saying so, and the connection closes. */
START_TEST(test_metrics_http_refusals) {
        static const struct {
                const char *request, *status;
        } cases[] = {
                { "GET / HTTP/1.1\r\n\r\n", "404 Not Found" },
                { "GET /metricsx HTTP/1.1\r\n\r\n", "404 Not Found" },
                { "GET /debug/pprof HTTP/1.1\r\n\r\n", "404 Not Found" },
                { "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", "405 Method Not Allowed" },
                { "DELETE /metrics HTTP/1.1\r\n\r\n", "405 Method Not Allowed" },
                { "hello\r\n\r\n", "400 Bad Request" },
                { "\r\n\r\n", "400 Bad Request" },
                { "GET /metrics HTTP/2.0\r\n\r\n", "400 Bad Request" },
                { "GET  /metrics HTTP/1.1\r\n\r\n", "400 Bad Request" },
                { "GET /metrics HTTP/1.1 extra\r\n\r\n", "400 Bad Request" },
                { "GET /metrics\r\n\r\n", "400 Bad Request" },
        };
        static char answer[8192], big[METRICS_HTTP_MAX_REQUEST + 512];
        struct testd d;
        int port;

        testd_start(&d, "--metrics-listen", "127.0.0.1:0", NULL);
        port = metrics_port(&d);
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                char want[64];

                snprintf(want, sizeof(want), "HTTP/1.1 %s\r\n", cases[i].status);
                http(port, cases[i].request, answer, sizeof(answer));
                ck_assert_msg(strncmp(answer, want, strlen(want)) == 0, "case %zu: %s", i, answer);
                ck_assert_msg(!strstr(answer, "gpupool_"), "case %zu answered metrics", i);
        }
        http(port, "PUT /metrics HTTP/1.1\r\n\r\n", answer, sizeof(answer));
        ck_assert_msg(strstr(answer, "\r\nAllow: GET, HEAD\r\n"), "%s", answer);
        /* Headers that never end within the limit: 431, not a growing buffer. */
        memset(big, 'a', sizeof(big) - 1);
        memcpy(big, "GET /metrics HTTP/1.1\r\nX-Long: ", 31);
        http(port, big, answer, sizeof(answer));
        ck_assert_msg(strncmp(answer, "HTTP/1.1 431 ", 13) == 0, "%s", answer);
        /* And it still serves. */
        http(port, "GET /metrics HTTP/1.1\r\n\r\n", answer, sizeof(answer));
        ck_assert_msg(strncmp(answer, "HTTP/1.1 200 OK\r\n", 17) == 0, "%s", answer);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* Peers that connect and say nothing hold at most METRICS_HTTP_MAX_CONNECTIONS, each for send_timeout at most. */
START_TEST(test_metrics_http_bounded) {
        static char answer[METRICS_TEXT_MAX + 1024];
        int idle[METRICS_HTTP_MAX_CONNECTIONS], extra, port;
        struct testd d;
        double t0;

        testd_start(&d, "--metrics-listen", "127.0.0.1:0", NULL);
        port = metrics_port(&d);
        for (int i = 0; i < METRICS_HTTP_MAX_CONNECTIONS; i++)
                idle[i] = tcp_connect(port);
        /* One more displaces the oldest that has not asked (silent peers cannot keep scrapes out), and is served. */
        extra = tcp_connect(port);
        ck_assert_uint_eq(read_to_end(idle[0], answer, sizeof(answer)), 0);
        close(idle[0]);
        ck_assert_int_eq(send(extra, "GET /metrics HTTP/1.1\r\n\r\n", 25, MSG_NOSIGNAL), 25);
        read_to_end(extra, answer, sizeof(answer));
        ck_assert_msg(strncmp(answer, "HTTP/1.1 200 OK\r\n", 17) == 0, "%s", answer);
        close(extra);
        /* The idle ones left are still served when they ask. */
        ck_assert_int_eq(send(idle[1], "GET /metrics HTTP/1.1\r\n\r\n", 25, MSG_NOSIGNAL), 25);
        read_to_end(idle[1], answer, sizeof(answer));
        ck_assert_msg(strncmp(answer, "HTTP/1.1 200 OK\r\n", 17) == 0, "%s", answer);
        close(idle[1]);
        /* Once the others have gone (the daemon closed its side), a new scrape is served. */
        for (int i = 2; i < METRICS_HTTP_MAX_CONNECTIONS; i++) {
                ck_assert_int_eq(shutdown(idle[i], SHUT_WR), 0);
                read_to_end(idle[i], answer, sizeof(answer));
                close(idle[i]);
        }
        http(port, "GET /metrics HTTP/1.1\r\n\r\n", answer, sizeof(answer));
        ck_assert_msg(strncmp(answer, "HTTP/1.1 200 OK\r\n", 17) == 0, "%s", answer);
        /* A stop with a scrape open is still clean. */
        extra = tcp_connect(port);
        ck_assert_int_eq(testd_stop(&d), 0);
        close(extra);

        /* With a short send_timeout, a silent peer and a half-sent request are each dropped after it. */
        testd_start(&d, "--metrics-listen", "127.0.0.1:0", "--send-timeout", "300ms", NULL);
        port = metrics_port(&d);
        t0 = now_s();
        idle[0] = tcp_connect(port);
        idle[1] = tcp_connect(port);
        ck_assert_int_eq(send(idle[1], "GET /metr", 9, MSG_NOSIGNAL), 9);
        ck_assert_uint_eq(read_to_end(idle[0], answer, sizeof(answer)), 0);
        ck_assert_uint_eq(read_to_end(idle[1], answer, sizeof(answer)), 0);
        ck_assert_msg(now_s() - t0 >= 0.29, "closed after %.3f s, before send_timeout", now_s() - t0);
        close(idle[0]);
        close(idle[1]);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/*
 * Slowloris: every connection taken by peers that send a byte now and then. Scrapes are served
 * all the same, and no trickling peer lasts past send_timeout from its accept.
 */
START_TEST(test_metrics_http_slow_peers) {
        static char answer[METRICS_TEXT_MAX + 1024];
        int slow[METRICS_HTTP_MAX_CONNECTIONS], port, served = 0;
        const char *request = "GET /metrics HTTP/1.1\r\nX-Slow: ";
        struct testd d;
        double t0;

        testd_start(&d, "--metrics-listen", "127.0.0.1:0", "--send-timeout", "2s", NULL);
        port = metrics_port(&d);
        t0 = now_s();
        for (int i = 0; i < METRICS_HTTP_MAX_CONNECTIONS; i++)
                slow[i] = tcp_connect(port);
        for (size_t k = 0; k < 30; k++) {
                for (int i = 0; i < METRICS_HTTP_MAX_CONNECTIONS; i++)
                        (void) send(slow[i], &request[k % strlen(request)], 1, MSG_NOSIGNAL);
                if (k % 10 == 9) {
                        /* Each scrape displaces the oldest trickler; they come back, as an attacker would. */
                        http(port, "GET /metrics HTTP/1.1\r\n\r\n", answer, sizeof(answer));
                        served += strncmp(answer, "HTTP/1.1 200 OK\r\n", 17) == 0;
                        for (int i = 0; i < METRICS_HTTP_MAX_CONNECTIONS; i++) {
                                char b;

                                if (recv(slow[i], &b, 1, MSG_DONTWAIT) == 0) {
                                        close(slow[i]);
                                        slow[i] = tcp_connect(port);
                                }
                        }
                }
                usleep(50000);
        }
        ck_assert_int_eq(served, 3);
        /* Trickling or not, a connection ends send_timeout after its accept. */
        t0 = now_s();
        slow[0] = (close(slow[0]), tcp_connect(port));
        for (int n = 0; now_s() - t0 < 5; n++) {
                char b;

                if (send(slow[0], "x", 1, MSG_NOSIGNAL) < 0 || recv(slow[0], &b, 1, MSG_DONTWAIT) == 0)
                        break;
                usleep(100000);
        }
        ck_assert_msg(now_s() - t0 < 3.0, "a trickling peer lasted %.1f s with send_timeout 2s", now_s() - t0);
        for (int i = 0; i < METRICS_HTTP_MAX_CONNECTIONS; i++)
                close(slow[i]);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/*
 * Peers that send a whole GET and keep their connections open hold no slot for long: scrapes
 * get through while all eight are answered and open (a new peer displaces the oldest answered
 * one), and an answered connection is closed by the daemon within a second or so.
 */
START_TEST(test_metrics_http_held_connections) {
        static char answer[METRICS_TEXT_MAX + 1024];
        const char *request = "GET /metrics HTTP/1.1\r\n\r\n";
        int held[METRICS_HTTP_MAX_CONNECTIONS], port, served = 0;
        struct testd d;
        double t0;

        testd_start(&d, "--metrics-listen", "127.0.0.1:0", "--send-timeout", "10s", NULL);
        port = metrics_port(&d);
        for (int round = 0; round < 20; round++) {
                /* The attacker fills every slot with answered connections it keeps, again before each scrape. */
                for (int i = 0; i < METRICS_HTTP_MAX_CONNECTIONS; i++) {
                        if (round)
                                close(held[i]);
                        held[i] = tcp_connect(port);
                        ck_assert_int_eq(send(held[i], request, strlen(request), MSG_NOSIGNAL), (ssize_t) strlen(request));
                }
                usleep(20000);
                http(port, request, answer, sizeof(answer));
                served += strncmp(answer, "HTTP/1.1 200 OK\r\n", 17) == 0;
        }
        ck_assert_int_eq(served, 20);
        /* An answered connection its peer keeps is closed by the daemon soon after, not at send_timeout. */
        t0 = now_s();
        held[0] = (close(held[0]), tcp_connect(port));
        ck_assert_int_eq(send(held[0], request, strlen(request), MSG_NOSIGNAL), (ssize_t) strlen(request));
        while (now_s() - t0 < 5 && recv(held[0], answer, sizeof(answer), 0) > 0)
                ;
        ck_assert_msg(now_s() - t0 < 3.0, "an answered connection stayed open %.1f s", now_s() - t0);
        for (int i = 0; i < METRICS_HTTP_MAX_CONNECTIONS; i++)
                close(held[i]);
        ck_assert_int_eq(testd_stop(&d), 0);
}
END_TEST

/* A port already taken stops the start with a line saying so: metrics asked for are not silently missing. */
START_TEST(test_metrics_listen_taken) {
        struct sockaddr_in a = { .sin_family = AF_INET };
        socklen_t len = sizeof(a);
        char cmd[512], out[4096], dir[96];
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ck_assert_int_eq(bind(fd, (struct sockaddr *) &a, sizeof(a)), 0);
        ck_assert_int_eq(listen(fd, 1), 0);
        ck_assert_int_eq(getsockname(fd, (struct sockaddr *) &a, &len), 0);
        test_mkdtemp(dir, sizeof(dir), "metrics");
        snprintf(cmd, sizeof(cmd), "%s/gpupoold --backend host --socket %s/s --metrics-listen 127.0.0.1:%d 2>&1",
                 build_dir(), dir, ntohs(a.sin_port));
        ck_assert_int_eq(run_capture(cmd, out, sizeof(out)), 1);
        ck_assert_msg(strstr(out, "metrics_listen: cannot listen: address already in use"), "%s", out);
        snprintf(cmd, sizeof(cmd), "%s/s", dir);
        ck_assert_int_ne(access(cmd, F_OK), 0);         /* it never listened on its socket either */
        rmdir(dir);
        close(fd);
}
END_TEST

Suite *suite_metrics(void) {
        Suite *s = suite_create("metrics");
        TCase *tc = tcase_create("metrics");

        tcase_add_test(tc, test_metrics_scrape);
        tcase_add_test(tc, test_metrics_tenants_and_reasons);
        tcase_add_test(tc, test_metrics_http_refusals);
        tcase_add_test(tc, test_metrics_http_bounded);
        tcase_add_test(tc, test_metrics_http_slow_peers);
        tcase_add_test(tc, test_metrics_http_held_connections);
        tcase_add_test(tc, test_metrics_listen_taken);
        tcase_set_timeout(tc, 60);
        suite_add_tcase(s, tc);
        return s;
}
