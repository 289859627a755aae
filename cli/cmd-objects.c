/*
 * cmd-objects.c: "gpupoolctl objects": the named objects, with their size, tenant, publisher's
 * uid, attachments and age; "gpupoolctl unpublish NAME": ends one (its publisher's uid, or the
 * node's operator), its memory going once the last process detaches.
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>

#include "cli.h"
#include "size.h"

static int objects(struct cli *cli, int argc, char **argv) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__ObjectsRequest orq = GPUPOOL__OBJECTS_REQUEST__INIT;
        const Gpupool__ObjectsReply *o;
        char a[GP_SIZE_FORMAT_MAX], b[GP_SIZE_FORMAT_MAX];

        (void) argc, (void) argv;
        req.body_case = GPUPOOL__ENVELOPE__BODY_OBJECTS;
        req.objects = &orq;
        if (cli_call(cli, &req, GPUPOOL__ENVELOPE__BODY_OBJECTS_REPLY, &rep) < 0)
                return 1;
        o = rep->objects_reply;
        if (cli->json) {
                json_t *list = json_array();

                for (size_t i = 0; i < o->n_objects; i++) {
                        const Gpupool__ObjectStatus *x = o->objects[i];
                        json_t *readers = json_array();

                        for (size_t k = 0; k < x->n_readers; k++)
                                json_array_append_new(readers, json_string(x->readers[k]));
                        json_array_append_new(list, json_pack("{s:s, s:I, s:I, s:I, s:s, s:I, s:I, s:I, s:b, s:o}", "name",
                                                              x->name, "device", (json_int_t) x->device, "size_bytes",
                                                              (json_int_t) x->size, "reserved_bytes",
                                                              (json_int_t) x->reserved_bytes, "tenant", x->tenant, "uid",
                                                              (json_int_t) x->uid, "attachments", (json_int_t) x->attachments,
                                                              "age_ms", (json_int_t) x->age_ms, "unpublished", x->unpublished,
                                                              "readers", readers));
                }
                cli_print_json(json_pack("{s:o}", "objects", list));
        } else if (!o->n_objects) {
                printf("no objects\n");
        } else {
                printf("%-32s %6s %12s %12s %-16s %8s %8s %8s\n", "NAME", "DEVICE", "SIZE", "RESERVED", "TENANT", "UID",
                       "ATTACHED", "AGE");
                for (size_t i = 0; i < o->n_objects; i++) {
                        const Gpupool__ObjectStatus *x = o->objects[i];

                        printf("%-32.32s %6u %12s %12s %-16.16s %8u %8u %7" PRIu64 "s%s", x->name, x->device,
                               gp_size_format(x->size, a, sizeof(a)), gp_size_format(x->reserved_bytes, b, sizeof(b)),
                               x->tenant, x->uid, x->attachments, x->age_ms / 1000,
                               x->unpublished ? "  (unpublished: goes at the last detach)" : "");
                        for (size_t k = 0; k < x->n_readers; k++)
                                printf("%s%s", k ? "," : "  readers: ", x->readers[k]);
                        printf("\n");
                }
        }
        gpupool__envelope__free_unpacked(rep, NULL);
        return 0;
}

static int unpublish(struct cli *cli, int argc, char **argv) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__UnpublishRequest ur = GPUPOOL__UNPUBLISH_REQUEST__INIT;

        if (argc != 2) {
                fprintf(stderr, "gpupoolctl unpublish: name one object\nUsage: gpupoolctl %s\n", cli_cmd_unpublish.usage);
                return 2;
        }
        ur.name = argv[1];
        req.body_case = GPUPOOL__ENVELOPE__BODY_UNPUBLISH;
        req.unpublish = &ur;
        if (cli_call(cli, &req, GPUPOOL__ENVELOPE__BODY_UNPUBLISH_REPLY, &rep) < 0)
                return 1;
        gpupool__envelope__free_unpacked(rep, NULL);
        if (cli->json)
                cli_print_json(json_pack("{s:s}", "unpublished", argv[1]));
        else
                printf("unpublished '%s': it goes once the last process has detached it\n", argv[1]);
        return 0;
}

const struct cli_command cli_cmd_objects = {
        .name = "objects",
        .usage = "objects [--json]",
        .summary = "show the named objects: size, tenant, attachments, age, readers",
        .run = objects,
};

const struct cli_command cli_cmd_unpublish = {
        .name = "unpublish",
        .usage = "unpublish NAME",
        .summary = "end a named object (it goes at its last detach)",
        .takes_args = true,
        .run = unpublish,
};
