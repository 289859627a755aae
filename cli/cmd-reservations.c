/*
 * cmd-reservations.c: "gpupoolctl reservations", "reserve" and "unreserve": the node's
 * reservations of memory for pods (listed, put and deleted), and their part of "status".
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "cli.h"
#include "size.h"

#define SZ(v, buf) gp_size_format((v), (buf), sizeof(buf))
#define RESERVE_PODS_MAX 16

json_t *cli_reservations_json(Gpupool__ReservationStatus *const *r, size_t n) {
        json_t *list = json_array();

        for (size_t i = 0; i < n; i++) {
                json_t *pods = json_array();

                for (size_t j = 0; j < r[i]->n_pod_uids; j++)
                        json_array_append_new(pods, json_string(r[i]->pod_uids[j]));
                json_array_append_new(list, json_pack("{s:s, s:I, s:I, s:s?, s:I, s:I, s:o, s:I, s:I, s:I, s:I, s:b}",
                                                      "key", r[i]->key, "generation", (json_int_t) r[i]->generation,
                                                      "device", (json_int_t) r[i]->device, "device_uuid", r[i]->device_uuid,
                                                      "guarantee_bytes", (json_int_t) r[i]->guarantee_bytes,
                                                      "limit_bytes", (json_int_t) r[i]->limit_bytes, "pod_uids", pods,
                                                      "clients", (json_int_t) r[i]->clients,
                                                      "reserved_bytes", (json_int_t) r[i]->reserved_bytes,
                                                      "in_use_bytes", (json_int_t) r[i]->in_use_bytes,
                                                      "charged_bytes", (json_int_t) r[i]->charged_bytes,
                                                      "absent", r[i]->has_absent && r[i]->absent));
                json_object_set_new(json_array_get(list, json_array_size(list) - 1), "token",
                                    json_boolean(r[i]->has_token && r[i]->token));
                json_object_set_new(json_array_get(list, json_array_size(list) - 1), "available_bytes",
                                    r[i]->has_available_bytes ? json_integer((json_int_t) r[i]->available_bytes) : json_null());
        }
        return list;
}

void cli_print_reservations(Gpupool__ReservationStatus *const *r, size_t n) {
        char a[GP_SIZE_FORMAT_MAX], b[GP_SIZE_FORMAT_MAX], c[GP_SIZE_FORMAT_MAX], d[GP_SIZE_FORMAT_MAX];

        printf("%-24s %6s %12s %12s %12s %12s %7s  %s\n", "RESERVATION", "DEVICE", "GUARANTEE", "LIMIT", "RESERVED", "IN USE",
               "CLIENTS", "PODS");
        for (size_t i = 0; i < n; i++) {
                char device[16];

                snprintf(device, sizeof(device), "%u%s", r[i]->device, r[i]->has_absent && r[i]->absent ? "?" : "");
                printf("%-24.24s %6s %12s %12s %12s %12s %7u  ", r[i]->key, device, SZ(r[i]->guarantee_bytes, a),
                       SZ(r[i]->limit_bytes, b), SZ(r[i]->reserved_bytes, c), SZ(r[i]->in_use_bytes, d), r[i]->clients);
                for (size_t j = 0; j < r[i]->n_pod_uids; j++)
                        printf("%s%s", j ? "," : "", r[i]->pod_uids[j]);
                if (r[i]->has_token && r[i]->token)
                        printf(r[i]->n_pod_uids ? " (by its token)" : "(a token no pod has presented yet)");
                printf("%s\n", r[i]->has_absent && r[i]->absent ? "  (its GPU is gone: it binds nobody)" : "");
        }
}

static int run_list(struct cli *cli, int argc, char **argv) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__ReservationsRequest rr = GPUPOOL__RESERVATIONS_REQUEST__INIT;
        const Gpupool__ReservationsReply *list;

        (void) argc, (void) argv;
        req.body_case = GPUPOOL__ENVELOPE__BODY_RESERVATIONS;
        req.reservations = &rr;
        if (cli_call(cli, &req, GPUPOOL__ENVELOPE__BODY_RESERVATIONS_REPLY, &rep) < 0)
                return 1;
        list = rep->reservations_reply;
        if (cli->json) {
                json_t *root = json_object();

                json_object_set_new(root, "reservations", cli_reservations_json(list->reservations, list->n_reservations));
                cli_print_json(root);
        } else if (list->n_reservations == 0) {
                printf("no reservations\n");
        } else {
                cli_print_reservations(list->reservations, list->n_reservations);
        }
        gpupool__envelope__free_unpacked(rep, NULL);
        return 0;
}

const struct cli_command cli_cmd_reservations = {
        .name = "reservations",
        .usage = "reservations [--json]",
        .summary = "show reservations: pods, GPU, guarantee, limit and use",
        .help = "Each reservation with its GPU, guarantee and limit, what its pods' clients hold of it (RESERVED) and\n"
                "use in blocks (IN USE), how many are connected, and its pods' UIDs. A device marked '?' is not\n"
                "among the daemon's now: the reservation is kept and binds nobody until it is deleted.\n",
        .run = run_list,
};

#define bad_reserve(...) cli_usage_error(&cli_cmd_reserve, __VA_ARGS__)

/* A token of 32 base64url characters from 24 random bytes into buf (33 bytes); 0 or -errno. */
static int random_token(char buf[33]) {
        static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        unsigned char b[24];

        if (getrandom(b, sizeof(b), 0) != (ssize_t) sizeof(b))
                return -errno;
        for (int i = 0; i < 8; i++) {
                uint32_t v = (uint32_t) b[3 * i] << 16 | (uint32_t) b[3 * i + 1] << 8 | b[3 * i + 2];

                for (int j = 0; j < 4; j++)
                        buf[4 * i + j] = alphabet[(v >> (18 - 6 * j)) & 63];
        }
        buf[32] = '\0';
        return 0;
}

static int run_reserve(struct cli *cli, int argc, char **argv) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__ReservationPutRequest p = GPUPOOL__RESERVATION_PUT_REQUEST__INIT;
        char *pods[RESERVE_PODS_MAX], token[33];
        bool guarantee = false;

        for (int i = 1; i < argc; i++) {
                const char *a = argv[i];

                if (strncmp(a, "guarantee=", 10) == 0) {
                        if (gp_size_parse(a + 10, &p.guarantee_bytes) < 0)
                                return bad_reserve("guarantee: '%s' is not a size", a + 10);
                        guarantee = true;
                } else if (strncmp(a, "limit=", 6) == 0) {
                        if (gp_size_parse(a + 6, &p.limit_bytes) < 0)
                                return bad_reserve("limit: '%s' is not a size", a + 6);
                        p.has_limit_bytes = 1;
                } else if (strncmp(a, "device=", 7) == 0) {
                        char *end;
                        unsigned long d = strtoul(a + 7, &end, 10);

                        if (strncmp(a + 7, "GPU-", 4) == 0 || strncmp(a + 7, "MIG-", 4) == 0) {
                                p.device_uuid = (char *) a + 7;
                        } else if (a[7] >= '0' && a[7] <= '9' && !*end && d <= UINT32_MAX) {
                                p.has_device = 1;
                                p.device = (uint32_t) d;
                        } else {
                                return bad_reserve("device: '%s' is neither an index nor a UUID (GPU-…, MIG-…)", a + 7);
                        }
                } else if (strncmp(a, "generation=", 11) == 0) {
                        char *end;

                        if (a[11] < '0' || a[11] > '9' || (errno = 0, p.generation = strtoull(a + 11, &end, 10), errno) || *end)
                                return bad_reserve("generation: '%s' is not a number", a + 11);
                        p.has_generation = 1;
                } else if (strncmp(a, "token=", 6) == 0) {
                        if (strcmp(a + 6, "random") == 0) {
                                if (random_token(token) < 0) {
                                        fprintf(stderr, "gpupoolctl reserve: no random bytes for a token: %s\n", strerror(errno));
                                        return 1;
                                }
                                p.token = token;
                        } else {
                                p.token = (char *) a + 6;
                        }
                } else if (strncmp(a, "pod=", 4) == 0) {
                        if (p.n_pod_uids == RESERVE_PODS_MAX)
                                return bad_reserve("at most %d pods", RESERVE_PODS_MAX);
                        pods[p.n_pod_uids++] = (char *) a + 4;
                } else if (a[0] != '-' && !strchr(a, '=') && !p.key) {
                        p.key = (char *) a;
                } else {
                        return bad_reserve("unexpected argument '%s'", a);
                }
        }
        if (!p.key)
                return bad_reserve("name the reservation (its KEY)");
        if (!guarantee)
                return bad_reserve("give its guarantee=SIZE (0 for a limit alone, with limit=SIZE)");
        if (!p.has_device && !p.device_uuid)
                return bad_reserve("give its GPU: device=INDEX or device=UUID");
        if (!p.n_pod_uids == !p.token)
                return bad_reserve("name its pods (pod=UID, once for each) or give it a token (token=SECRET|random), one of them");
        p.pod_uids = pods;
        req.body_case = GPUPOOL__ENVELOPE__BODY_RESERVATION_PUT;
        req.reservation_put = &p;
        if (cli_call(cli, &req, GPUPOOL__ENVELOPE__BODY_RESERVATION_PUT_REPLY, &rep) < 0)
                return 1;
        if (cli->json) {
                json_t *root = json_object();

                json_object_set_new(root, "changed", json_boolean(rep->reservation_put_reply->changed));
                json_object_set_new(root, "device", json_integer(rep->reservation_put_reply->device));
                if (p.token)
                        json_object_set_new(root, "token", json_string(p.token));
                cli_print_json(root);
        } else {
                printf(rep->reservation_put_reply->changed ? "reserved %s on device %u\n" :
                                                             "%s on device %u was reserved already, as asked\n",
                       p.key, rep->reservation_put_reply->device);
                if (p.token)
                        printf("its pod's processes present GPUPOOL_RESERVATION=%s\n", p.token);
        }
        gpupool__envelope__free_unpacked(rep, NULL);
        return 0;
}

const struct cli_command cli_cmd_reserve = {
        .name = "reserve",
        .usage = "reserve KEY device=N|UUID guarantee=SIZE [limit=SIZE] pod=UID...|token=SECRET|random [generation=N]",
        .summary = "reserve memory on a GPU for pods",
        .help = "  KEY                 the reservation's name: 1 to 63 letters, digits, '-', '_' or '.'\n"
                "  device=N|UUID       its GPU: the daemon's index, or GPU-…/MIG-… as nvidia-smi -L says\n"
                "  guarantee=SIZE      memory no one else may take; SIZE as 512M, 4G, 1.5GiB\n"
                "  limit=SIZE          the most its pods may hold together (default: the guarantee)\n"
                "  pod=UID             a pod it is for, by UID (up to 16; one reservation per pod)\n"
                "  token=SECRET        instead of pods: the first pod whose process presents SECRET in\n"
                "                      $GPUPOOL_RESERVATION is its pod (16 to 128 letters, digits, '-', '_');\n"
                "                      token=random makes one and prints it\n"
                "  generation=N        its version (default 0): the same again changes nothing, a higher one\n"
                "                      replaces it, an older one or the same with other values is refused\n\n"
                "The pods' processes together are its tenant on that GPU, and have no memory on another. It is kept\n"
                "in the daemon's state directory and outlives a restart. Refused, saying why, where the guarantees\n"
                "on the GPU would pass its capacity. Root or the daemon's user only. Exit 1 when refused, 2 for a\n"
                "bad command line.\n",
        .takes_args = true,
        .run = run_reserve,
};

static int run_unreserve(struct cli *cli, int argc, char **argv) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__ReservationDeleteRequest d = GPUPOOL__RESERVATION_DELETE_REQUEST__INIT;

        if (argc < 2)
                return cli_usage_error(&cli_cmd_unreserve, "name the reservation (its KEY)");
        if (argc > 2 || argv[1][0] == '-')
                return cli_usage_error(&cli_cmd_unreserve, "unexpected argument '%s'", argv[argc > 2 ? 2 : 1]);
        d.key = argv[1];
        req.body_case = GPUPOOL__ENVELOPE__BODY_RESERVATION_DELETE;
        req.reservation_delete = &d;
        if (cli_call(cli, &req, GPUPOOL__ENVELOPE__BODY_RESERVATION_DELETE_REPLY, &rep) < 0)
                return 1;
        if (cli->json) {
                json_t *root = json_object();

                json_object_set_new(root, "deleted", json_boolean(rep->reservation_delete_reply->deleted));
                cli_print_json(root);
        } else {
                printf(rep->reservation_delete_reply->deleted ? "deleted %s\n" : "no reservation %s (nothing to delete)\n",
                       d.key);
        }
        gpupool__envelope__free_unpacked(rep, NULL);
        return 0;
}

const struct cli_command cli_cmd_unreserve = {
        .name = "unreserve",
        .usage = "unreserve KEY",
        .summary = "delete a reservation",
        .help = "Its pods' clients belong to the config's tenants again; what they hold stays theirs. A key with no\n"
                "reservation is no error (a retry is harmless). Root or the daemon's user only.\n",
        .takes_args = true,
        .run = run_unreserve,
};
