/*
 * cmd-objects.c: "gpupoolctl objects": the named objects, with their size, tenant, publisher's
 * uid, attachments and age; "gpupoolctl unpublish NAME": ends one (its publisher's uid, or the
 * node's operator), its memory going once the last process detaches.
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "size.h"

/* The page of objects after object id after (0: from the first). */
static int objects_page(struct cli *cli, uint64_t after, Gpupool__Envelope **ret_reply) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT;
        Gpupool__ObjectsRequest orq = GPUPOOL__OBJECTS_REQUEST__INIT;

        if (after) {
                orq.has_after_id = 1;
                orq.after_id = after;
        }
        req.body_case = GPUPOOL__ENVELOPE__BODY_OBJECTS;
        req.objects = &orq;
        return cli_call(cli, &req, GPUPOOL__ENVELOPE__BODY_OBJECTS_REPLY, ret_reply);
}

/* The most pages one listing reads: far more than the daemon's OBJECTS_MAX could fill. */
#define OBJECTS_MAX_PAGES 256

/* One object, as a JSON object or a line of the table. */
static void object_show(const struct cli *cli, const Gpupool__ObjectStatus *x, json_t *list) {
        char a[GP_SIZE_FORMAT_MAX], b[GP_SIZE_FORMAT_MAX];

        if (cli->json) {
                json_t *readers = json_array(), *pids = json_array();

                for (size_t k = 0; k < x->n_readers; k++)
                        json_array_append_new(readers, json_string(x->readers[k]));
                for (size_t k = 0; k < x->n_attached_pids; k++)
                        json_array_append_new(pids, json_integer(x->attached_pids[k]));
                json_array_append_new(list, json_pack("{s:s, s:I, s:I, s:I, s:s, s:I, s:I, s:I, s:b, s:o, s:o}", "name",
                                                      x->name, "device", (json_int_t) x->device, "size_bytes",
                                                      (json_int_t) x->size, "reserved_bytes",
                                                      (json_int_t) x->reserved_bytes, "tenant", x->tenant, "uid",
                                                      (json_int_t) x->uid, "attachments", (json_int_t) x->attachments,
                                                      "age_ms", (json_int_t) x->age_ms, "unpublished", x->unpublished,
                                                      "readers", readers, "attached_pids", pids));
                return;
        }
        printf("%-32.32s %6u %12s %12s %-16.16s %8u %8u %7" PRIu64 "s%s", x->name, x->device,
               gp_size_format(x->size, a, sizeof(a)), gp_size_format(x->reserved_bytes, b, sizeof(b)), x->tenant, x->uid,
               x->attachments, x->age_ms / 1000, x->unpublished ? "  (unpublished: goes at the last detach)" : "");
        for (size_t k = 0; k < x->n_readers; k++)
                printf("%s%s", k ? "," : "  readers: ", x->readers[k]);
        for (size_t k = 0; k < x->n_attached_pids; k++)
                printf("%s%d", k ? "," : "  attached by pids: ", (int) x->attached_pids[k]);
        printf("\n");
}

/* Every object, page after page (a reply holds as many as fit a packet), so that the list works at any count. */
static int objects(struct cli *cli, int argc, char **argv) {
        json_t *list = cli->json ? json_array() : NULL;
        Gpupool__Envelope *rep, *next;
        unsigned pages = 1;
        size_t shown = 0;

        (void) argc, (void) argv;
        if (objects_page(cli, 0, &rep) < 0) {
                json_decref(list);
                return 1;
        }
        for (;;) {
                const Gpupool__ObjectsReply *o = rep->objects_reply;

                if (!cli->json && !shown && o->n_objects)
                        printf("%-32s %6s %12s %12s %-16s %8s %8s %8s\n", "NAME", "DEVICE", "SIZE", "RESERVED", "TENANT",
                               "UID", "ATTACHED", "AGE");
                for (size_t i = 0; i < o->n_objects; i++)
                        object_show(cli, o->objects[i], list);
                shown += o->n_objects;
                if (!o->objects_left_out || !o->n_objects || !o->objects[o->n_objects - 1]->has_id ||
                    pages == OBJECTS_MAX_PAGES)
                        break;
                if (objects_page(cli, o->objects[o->n_objects - 1]->id, &next) < 0) {
                        gpupool__envelope__free_unpacked(rep, NULL);
                        json_decref(list);
                        return 1;
                }
                gpupool__envelope__free_unpacked(rep, NULL);
                rep = next;
                pages++;
        }
        if (cli->json)
                cli_print_json(json_pack("{s:o}", "objects", list));
        else if (!shown)
                printf("no objects\n");
        gpupool__envelope__free_unpacked(rep, NULL);
        return 0;
}

static int unpublish(struct cli *cli, int argc, char **argv) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__UnpublishRequest ur = GPUPOOL__UNPUBLISH_REQUEST__INIT;
        const char *name = NULL;
        char *end;

        bool names_only = false;

        for (int i = 1; i < argc; i++) {
                if (names_only || argv[i][0] != '-') {
                        if (name)
                                return cli_usage_error(&cli_cmd_unpublish, "one object at a time: '%s', then '%s'", name, argv[i]);
                        name = argv[i];
                } else if (strcmp(argv[i], "--") == 0) {
                        names_only = true;
                } else if (strcmp(argv[i], "--uid") == 0 && i + 1 < argc) {
                        unsigned long uid = strtoul(argv[++i], &end, 10);

                        if (!*argv[i] || *end || uid > UINT32_MAX)
                                return cli_usage_error(&cli_cmd_unpublish, "--uid takes a uid (a number), not '%s'", argv[i]);
                        ur.has_publisher_uid = 1;
                        ur.publisher_uid = (uint32_t) uid;
                } else if (strcmp(argv[i], "--uid") == 0) {
                        return cli_usage_error(&cli_cmd_unpublish, "--uid needs a value");
                } else {
                        return cli_usage_error(&cli_cmd_unpublish, "unexpected argument '%s' (a name that starts with "
                                               "'-' goes after --)", argv[i]);
                }
        }
        if (!name)
                return cli_usage_error(&cli_cmd_unpublish, "name one object (and, for another uid's, --uid UID)");
        ur.name = (char *) name;
        req.body_case = GPUPOOL__ENVELOPE__BODY_UNPUBLISH;
        req.unpublish = &ur;
        if (cli_call(cli, &req, GPUPOOL__ENVELOPE__BODY_UNPUBLISH_REPLY, &rep) < 0)
                return 1;
        gpupool__envelope__free_unpacked(rep, NULL);
        if (cli->json)
                cli_print_json(json_pack("{s:s}", "unpublished", name));
        else
                printf("unpublished '%s': it goes once the last process has detached it\n", name);
        return 0;
}

const struct cli_command cli_cmd_objects = {
        .name = "objects",
        .usage = "objects [--json]",
        .summary = "show the named objects: size, tenant, attachments, age, readers",
        .help = "Name, device, size, tenant, the publisher's uid, attachments, age, readers, and the pids that\n"
                "have it attached: an unpublished object a reader keeps goes when those processes end.\n"
                "Listed page by page whatever the count.\n",
        .run = objects,
};

const struct cli_command cli_cmd_unpublish = {
        .name = "unpublish",
        .usage = "unpublish [--uid UID] [--] NAME",
        .summary = "end a named object, this uid's or (operator) uid UID's (it goes at its last detach)",
        .help = "  NAME                the object (names are each publisher uid's); after -- when it starts with -\n"
                "  --uid UID           another uid's object, for the node's operator (root or the daemon's user)\n\n"
                "Nobody attaches it from now on and its name is free; its memory goes back once the last\n"
                "process has detached it or exited.\n",
        .takes_args = true,
        .run = unpublish,
};
