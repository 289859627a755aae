/*
 * request_objects.c: the requests on named objects (objects.h): publish, attach, detach,
 * unpublish, and the list gpupoolctl objects shows.
 */
#include "request.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "closer.h"
#include "log.h"
#include "node.h"
#include "objects.h"
#include "pool.h"
#include "session.h"
#include "size.h"
#include "users.h"

/* Checks an object's name; else refuses req with why. */
static bool name_ok(const char *name, uint64_t id, struct reply *ret) {
        char why[160];

        if (gp_wire_object_name_is_valid(name))
                return true;
        snprintf(why, sizeof(why), "an object's name is 1 to %d bytes of UTF-8 without control characters",
                 GP_MAX_OBJECT_NAME_BYTES);
        reply_error(id, -EINVAL, false, why, ret);
        return false;
}

/* Whether s has obj attached. */
static bool attached(const struct session *s, const struct object *obj) {
        for (unsigned i = 0; i < s->attached.count; i++)
                if (s->attached.list[i] == obj)
                        return true;
        return false;
}

/* Room on s's list for one more attachment, made before anything changes. Returns 0 or -ENOMEM. */
static int attach_room(struct session *s) {
        unsigned cap = s->attached.cap ? s->attached.cap * 2 : 4;
        struct object **n;

        if (s->attached.count < s->attached.cap)
                return 0;
        if (!(n = realloc(s->attached.list, cap * sizeof(*n))))
                return -ENOMEM;
        s->attached.list = n;
        s->attached.cap = cap;
        return 0;
}

/* s has obj attached (attach_room() made the room). */
static void attach_to(struct session *s, struct object *obj) {
        s->attached.list[s->attached.count++] = obj;
        objects_attach(obj);
}

/*
 * Who may attach obj: its publisher's principal (its uid, and its pod where it published from
 * one: the rule memory follows between clients), the node's operator, and the clients of its
 * tenant where that is a tenant of the config (default is everyone else, not a group anyone
 * chose), and its readers.
 */
static bool may_attach(const struct session *s, const struct object *obj) {
        return s->principal == obj->owner.principal || s->operator ||
               (s->tenant && s->tenant != &s->node->policy.tenants[0] && strcmp(s->tenant->conf.name, obj->tenant) == 0) ||
               objects_reader(obj, s->tenant ? s->tenant->conf.name : NULL);
}

/* Says why a publish failed with err, into why. */
static void publish_error(int err, const Gpupool__PublishRequest *p, char *why, size_t why_size) {
        if (err == -ENOENT)
                snprintf(why, why_size, "segment %" PRIu64 " is not leased to this client on device %u", p->segment_id,
                         p->device);
        else if (err == -EINVAL)
                snprintf(why, why_size, "an object of %" PRIu64 " bytes at offset %" PRIu64 " is not within its segment",
                         p->size, p->offset);
        else if (err == -ENOSPC)
                snprintf(why, why_size, "the node holds %d objects, the most it may", OBJECTS_MAX);
        else if (err == -EBUSY)
                snprintf(why, why_size, "segment %" PRIu64 " is still mapped writable somewhere, or pinned (vmsplice, "
                         "io_uring): an object is sealed against writing, and the kernel refuses while it is", p->segment_id);
        else if (err == -EEXIST)
                snprintf(why, why_size, "this uid has an object named '%s' already", p->name);
        else if (err == -EPERM)
                snprintf(why, why_size, "segment %" PRIu64 " is memory this process held through a restart of gpupoold, "
                         "adopted by its word: the daemon cannot share it (the driver exports no imported memory); "
                         "publish from a segment leased since", p->segment_id);
        else
                snprintf(why, why_size, "out of memory for an object");
}

/* Publishes p for s, its segment sealed already or not (sealed), and replies (or says why not). */
static void publish_now(struct session *s, const Gpupool__PublishRequest *p, uint64_t request_id, bool sealed,
                        struct reply *ret) {
        struct node *node = s->node;
        char why[GP_MAX_OBJECT_NAME_BYTES + 200], b[GP_SIZE_FORMAT_MAX];
        Gpupool__PublishReply pr = GPUPOOL__PUBLISH_REPLY__INIT;
        Gpupool__Envelope env;
        struct object *obj;
        int err;

        /* Checked again after a seal off the loop: another client may have taken the name meanwhile. */
        err = objects_find(node, (uint32_t) s->uid, p->name) ? -EEXIST : attach_room(s);
        obj = err < 0 ? NULL : objects_publish(node, p->name, p->device, &s->owners[p->device], p->segment_id, p->offset,
                                               p->size, s->tenant, (uint32_t) s->uid, s->pod_uid, p->readers, p->n_readers,
                                               sealed, &err);
        if (!obj) {
                publish_error(err, p, why, sizeof(why));
                reply_error(request_id, err == -ENOSPC ? -EDQUOT : err == -EBUSY || err == -EEXIST ? -EINVAL : err, false,
                            why, ret);
                return;
        }
        obj->user = s->user;
        attach_to(s, obj);
        session_log(s, LOG_LEVEL_INFO, "client %llu ('%s', pid %d, tenant %s) published '%s': %s on device %u",
                    (unsigned long long) s->id, s->name, (int) s->pid, obj->tenant, obj->name,
                    gp_size_format(obj->size, b, sizeof(b)), obj->device);
        pr.has_id = true;
        pr.id = obj->id;
        reply_ok(&env, request_id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_PUBLISH_REPLY;
        env.publish_reply = &pr;
        (void) reply_pack(&env, false, ret);
}

/*
 * A publish whose seal runs on libuv's threads (the backend's seal_waits): the request, copied
 * (the one read is gone once the handler returns), and the segment's mem with a descriptor of
 * its own.
 */
struct seal_job {
        uv_work_t work;
        struct node *node;
        uint64_t session_id, request_id;
        Gpupool__PublishRequest req;
        char name[GP_MAX_OBJECT_NAME_BYTES + 1];
        char readers[GP_MAX_OBJECT_READERS][GP_MAX_READER_BYTES + 1];
        char *reader_ptrs[GP_MAX_OBJECT_READERS];
        struct backend_mem mem;
        int result;
};

/* On a thread of libuv's: the seal, which may wait (about 150 ms) for pages a client pinned. */
static void seal_work(uv_work_t *w) {
        struct seal_job *job = w->data;
        struct backend *b = job->node->backend;

        job->result = b->ops->mem_seal(b, job->req.device, &job->mem, 0);
}

/* Back on the loop: the publish goes on if its client is still there; the segment says how the seal went. */
static void seal_done(uv_work_t *w, int status) {
        struct seal_job *job = w->data;
        struct node *node = job->node;
        struct session *s = session_find(node, job->session_id);
        struct reply rep = { 0 };
        char why[GP_MAX_OBJECT_NAME_BYTES + 200];

        if (job->mem.fd >= 0)
                closer_close(job->mem.fd);
        if (status < 0 && job->result == 0)
                job->result = -ECANCELED;       /* the loop is closing: it never ran */
        node->seals_in_flight--;
        pool_seal_end(node->pools[job->req.device], job->req.segment_id, job->result == 0);
        if (s && s->held) {
                session_resume(s);
                if (job->result == 0) {
                        publish_now(s, &job->req, job->request_id, true, &rep);
                } else {
                        publish_error(job->result, &job->req, why, sizeof(why));
                        reply_error(job->request_id, job->result == -EBUSY ? -EINVAL : job->result, false, why, &rep);
                }
                (void) session_send(s, &rep);   /* which may end the session */
        }
        free(job);
        if (node->close_when_sealed && !node->seals_in_flight)
                node_close(node);       /* the daemon stopped meanwhile (server_stop()) */
        else
                node_after_change(node);
}

/*
 * Whether a client of s's group (users_same_group(): its pod, or its user with her subordinate
 * uids) has a seal under way: one at a time per user, so that no user takes libuv's threads.
 */
static bool group_sealing(const struct session *s) {
        SESSION_FOREACH(c, s->node)
                if (c->held && users_same_group(c->user, c->pod_uid, s->user, s->pod_uid))
                        return true;
        return false;
}

/* Starts p's seal off the loop and holds s until it ends (seal_done()); else replies why not. */
static void publish_later(struct session *s, const Gpupool__PublishRequest *p, uint64_t request_id, struct reply *ret) {
        struct node *node = s->node;
        struct seal_job *job;
        char why[GP_MAX_OBJECT_NAME_BYTES + 200];
        int err;

        if (group_sealing(s)) {
                if (s->pod_uid[0])
                        snprintf(why, sizeof(why), "a publish of pod %s is being sealed: one at a time per pod; try again "
                                 "once it is answered", s->pod_uid);
                else
                        snprintf(why, sizeof(why), "a publish of user %u is being sealed: one at a time per user; try "
                                 "again once it is answered", (unsigned) s->user);
                reply_error(request_id, -EDQUOT, false, why, ret);
                return;
        }
        job = calloc(1, sizeof(*job));
        if (!job) {
                reply_error(request_id, -ENOMEM, false, "out of memory for an object", ret);
                return;
        }
        job->node = node;
        job->session_id = s->id;
        job->request_id = request_id;
        job->req = *p;
        snprintf(job->name, sizeof(job->name), "%s", p->name);
        job->req.name = job->name;
        for (size_t i = 0; i < p->n_readers; i++) {
                snprintf(job->readers[i], sizeof(job->readers[i]), "%s", p->readers[i]);
                job->reader_ptrs[i] = job->readers[i];
        }
        job->req.readers = job->reader_ptrs;
        job->work.data = job;
        err = pool_seal_begin(node->pools[p->device], &s->owners[p->device], p->segment_id, &job->mem);
        if (err == 0) {
                err = uv_queue_work(node->loop, &job->work, seal_work, seal_done);
                if (err == 0) {
                        node->seals_in_flight++;
                        *ret = (struct reply) { .held = true };
                        return;
                }
                /* Not begun after all: its descriptor closed, the segment as it was. */
                if (job->mem.fd >= 0)
                        closer_close(job->mem.fd);
                pool_seal_end(node->pools[p->device], p->segment_id, false);
        }
        publish_error(err, p, why, sizeof(why));
        reply_error(request_id, err == -EBUSY ? -EINVAL : err, false, why, ret);
        free(job);
}

void request_publish(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        const Gpupool__PublishRequest *p = req->publish;
        struct node *node = s->node;
        char why[GP_MAX_OBJECT_NAME_BYTES + 200];

        if (!name_ok(p->name, req->id, ret))
                return;
        if (p->device >= node->device_count) {
                snprintf(why, sizeof(why), "no device %u: this daemon has %u", p->device, node->device_count);
                reply_error(req->id, -ENODEV, false, why, ret);
                return;
        }
        if (!node->backend->ops->mem_seal) {
                snprintf(why, sizeof(why), "named objects are not built for the %s backend yet (host and cuda-vmm have them)",
                         node->backend->name);
                reply_error(req->id, -EINVAL, false, why, ret);
                return;
        }
        if (!objects_readers_valid(p->readers, p->n_readers)) {
                snprintf(why, sizeof(why), "an object's readers are at most %d, each '*' (every client) or a tenant's name "
                         "(1 to %d letters, digits, '-', '_' or '.')", GP_MAX_OBJECT_READERS, GP_MAX_READER_BYTES);
                reply_error(req->id, -EINVAL, false, why, ret);
                return;
        }
        /* Names are each uid's: another uid's object of this name is no obstacle, and never what this uid's name means. */
        if (objects_find(node, (uint32_t) s->uid, p->name)) {
                snprintf(why, sizeof(why), "this uid has an object named '%s' already", p->name);
                reply_error(req->id, -EINVAL, false, why, ret);
                return;
        }
        /* No one pod, whatever uids it takes, nor one uid outside pods, takes all of the node's objects. */
        if (objects_holder_count(node, s->user, s->pod_uid) >= OBJECTS_PER_HOLDER) {
                if (s->pod_uid[0])
                        snprintf(why, sizeof(why), "pod %s holds %d named objects (published by any of its uids), the "
                                 "most one pod may (of the node's %d): unpublish one first", s->pod_uid, OBJECTS_PER_HOLDER,
                                 OBJECTS_MAX);
                else
                        snprintf(why, sizeof(why), "user %u holds %d named objects (published by any of her uids), the "
                                 "most one may (of the node's %d): unpublish one first", (unsigned) s->user,
                                 OBJECTS_PER_HOLDER, OBJECTS_MAX);
                reply_error(req->id, -EDQUOT, false, why, ret);
                return;
        }
        /*
         * The node's table full, counting the publishes being sealed: refused before the seal,
         * which cannot be undone (the block would stay read-only and be the publisher's no more).
         */
        if (node->object_count + node->seals_in_flight >= OBJECTS_MAX) {
                snprintf(why, sizeof(why), "the node holds %u named objects%s, the most it may (%d): the operator's "
                         "gpupoolctl unpublish, or idle_objects, makes room", node->object_count,
                         node->seals_in_flight ? " with those being sealed" : "", OBJECTS_MAX);
                reply_error(req->id, -EDQUOT, false, why, ret);
                return;
        }
        /* The loop never waits on what a client controls: a seal that may wait runs on another thread. */
        if (node->backend->seal_waits)
                publish_later(s, p, req->id, ret);
        else
                publish_now(s, p, req->id, false, ret);
}

/*
 * The object an attach means: the named publisher's (publisher_uid); else the caller's own
 * uid's; else, for a client of a tenant of the config, the one of that name its tenant
 * published (several: none, saying so). Never another uid's by name alone: a name is no
 * proof of who made the bytes, and anyone may publish any name first. NULL with why set
 * where more is to say than that there is none ("" otherwise).
 */
static struct object *attach_target(struct session *s, const Gpupool__AttachRequest *a, char *why, size_t why_size,
                                    int *ret_err) {
        struct node *node = s->node;
        struct object *found = NULL;
        char uids[128];
        unsigned n = 0;

        why[0] = '\0';
        *ret_err = -ENOENT;
        if (a->has_publisher_uid)
                return objects_find(node, a->publisher_uid, a->name);
        if ((found = objects_find(node, (uint32_t) s->uid, a->name)))
                return found;
        if (s->tenant && s->tenant != &node->policy.tenants[0])
                for (struct object *o = node->objects; o; o = o->next)
                        if (!o->unpublished && strcmp(o->name, a->name) == 0 && strcmp(o->tenant, s->tenant->conf.name) == 0) {
                                found = o;
                                n++;
                        }
        if (n == 1)
                return found;
        if (n > 1) {
                (void) objects_publishers(node, a->name, (uint32_t) s->uid, uids, sizeof(uids));
                snprintf(why, why_size, "several uids of tenant %s publish an object named '%s' (%s): name the publisher",
                         s->tenant->conf.name, a->name, uids);
                *ret_err = -EINVAL;
                return NULL;
        }
        if (objects_publishers(node, a->name, (uint32_t) s->uid, uids, sizeof(uids)))
                snprintf(why, why_size, "no object named '%s' of uid %u%s%s; uid %s publish%s one: name the publisher to "
                         "attach another uid's (gpupool_attach_of())", a->name, (unsigned) s->uid,
                         s->tenant && s->tenant != &node->policy.tenants[0] ? " or of tenant " : "",
                         s->tenant && s->tenant != &node->policy.tenants[0] ? s->tenant->conf.name : "", uids,
                         strchr(uids, ',') ? "" : "es");
        return NULL;
}

void request_attach(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        struct node *node = s->node;
        Gpupool__AttachReply ar = GPUPOOL__ATTACH_REPLY__INIT;
        const struct backend_mem *mem;
        char why[GP_MAX_OBJECT_NAME_BYTES + 300];
        Gpupool__Envelope env;
        struct object *obj;
        int err;

        if (!name_ok(req->attach->name, req->id, ret))
                return;
        obj = attach_target(s, req->attach, why, sizeof(why), &err);
        if (!obj) {
                uint64_t at;

                if (!why[0] && objects_evicted(node, req->attach->name, &at))
                        snprintf(why, sizeof(why), "object '%s' was evicted %llu ms ago: nobody had it attached for "
                                 "idle_objects and a lease needed the memory", req->attach->name,
                                 (unsigned long long) (uv_now(node->loop) - at));
                else if (!why[0])
                        snprintf(why, sizeof(why), "no object named '%s' (see gpupoolctl objects)", req->attach->name);
                reply_error(req->id, err, false, why, ret);
                return;
        }
        if (!may_attach(s, obj)) {
                snprintf(why, sizeof(why), "object '%s' is for uid %u%s%s and tenant %s: not for uid %u%s%s of tenant %s",
                         obj->name, (unsigned) obj->uid, obj->pod[0] ? " in pod " : "", obj->pod, obj->tenant,
                         (unsigned) s->uid, s->pod_uid[0] ? " in pod " : "", s->pod_uid,
                         s->tenant ? s->tenant->conf.name : "-");
                reply_error(req->id, -EACCES, false, why, ret);
                return;
        }
        if (attached(s, obj)) {
                snprintf(why, sizeof(why), "this client has '%s' attached already", obj->name);
                reply_error(req->id, -EINVAL, false, why, ret);
                return;
        }
        if (attach_room(s) < 0) {
                reply_error(req->id, -ENOMEM, false, "out of memory attaching an object", ret);
                return;
        }
        attach_to(s, obj);
        ar.device = obj->device;
        ar.segment_size = obj->segment_size;
        ar.offset = obj->offset;
        ar.size = obj->size;
        ar.has_id = true;
        ar.id = obj->id;
        ar.has_publisher_uid = true;
        ar.publisher_uid = obj->uid;
        ar.publisher_tenant = obj->tenant;
        mem = pool_leased_mem(node->pools[obj->device], &obj->owner, obj->segment_id);
        if (mem->ipc_handle_len) {
                ar.has_ipc_handle = true;
                ar.ipc_handle.len = mem->ipc_handle_len;
                ar.ipc_handle.data = (uint8_t *) mem->ipc_handle;
        }
        reply_ok(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_ATTACH_REPLY;
        env.attach_reply = &ar;
        if (reply_pack(&env, false, ret) < 0) {
                (void) session_detach(s, obj);
                return;
        }
        if (mem->ipc_handle_len)
                return;         /* the handle is in the reply */
        ret->fds.device = obj->device;
        ret->fds.owner = &obj->owner;
        ret->fds.read_only = node->backend->reopens_read_only;
        ret->fds.request_id = req->id;
        ret->fds.object = obj;
        ret->fds.segments[0] = obj->segment_id;
        ret->fds.n = 1;
}

/* The object name (with id, that one) as s has it attached (unpublished ones too), or NULL. */
static struct object *attached_by_name(const struct session *s, const char *name, bool has_id, uint64_t id) {
        for (unsigned i = 0; i < s->attached.count; i++)
                if (strcmp(s->attached.list[i]->name, name) == 0 && (!has_id || s->attached.list[i]->id == id))
                        return s->attached.list[i];
        return NULL;
}

void request_detach(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        Gpupool__DetachReply dr = GPUPOOL__DETACH_REPLY__INIT;
        char why[GP_MAX_OBJECT_NAME_BYTES + 100];
        Gpupool__Envelope env;
        struct object *obj;

        if (!name_ok(req->detach->name, req->id, ret))
                return;
        obj = attached_by_name(s, req->detach->name, req->detach->has_id, req->detach->id);
        if (!obj) {
                snprintf(why, sizeof(why), "this client has no object named '%s' attached", req->detach->name);
                reply_error(req->id, -ENOENT, false, why, ret);
                return;
        }
        (void) session_detach(s, obj);
        reply_ok(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_DETACH_REPLY;
        env.detach_reply = &dr;
        (void) reply_pack(&env, false, ret);
}

void request_unpublish(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        Gpupool__UnpublishReply ur = GPUPOOL__UNPUBLISH_REPLY__INIT;
        char why[GP_MAX_OBJECT_NAME_BYTES + 200];
        Gpupool__Envelope env;
        struct object *obj;

        if (!name_ok(req->unpublish->name, req->id, ret))
                return;
        if (req->unpublish->has_publisher_uid && req->unpublish->publisher_uid != (uint32_t) s->uid && !s->operator) {
                snprintf(why, sizeof(why), "uid %u's objects are uid %u's to unpublish (or the node's operator's), not uid "
                         "%u's", (unsigned) req->unpublish->publisher_uid, (unsigned) req->unpublish->publisher_uid,
                         (unsigned) s->uid);
                reply_error(req->id, -EACCES, false, why, ret);
                return;
        }
        obj = objects_find(s->node, req->unpublish->has_publisher_uid ? req->unpublish->publisher_uid : (uint32_t) s->uid,
                           req->unpublish->name);
        if (!obj) {
                char uids[128];

                if (!req->unpublish->has_publisher_uid &&
                    objects_publishers(s->node, req->unpublish->name, (uint32_t) s->uid, uids, sizeof(uids)))
                        snprintf(why, sizeof(why), "no object named '%s' of uid %u; uid %s publish%s one (the node's "
                                 "operator may name the publisher: gpupoolctl unpublish --uid)", req->unpublish->name,
                                 (unsigned) s->uid, uids, strchr(uids, ',') ? "" : "es");
                else
                        snprintf(why, sizeof(why), "no object named '%s' (see gpupoolctl objects)", req->unpublish->name);
                reply_error(req->id, -ENOENT, false, why, ret);
                return;
        }
        if (s->principal != obj->owner.principal && !s->operator) {
                snprintf(why, sizeof(why), "object '%s' is uid %u%s%s's to unpublish (or the node's operator's), not this "
                         "client's (uid %u%s%s)", obj->name, (unsigned) obj->uid, obj->pod[0] ? " in pod " : "", obj->pod,
                         (unsigned) s->uid, s->pod_uid[0] ? " in pod " : "", s->pod_uid);
                reply_error(req->id, -EACCES, false, why, ret);
                return;
        }
        session_log(s, LOG_LEVEL_INFO, "client %llu (pid %d) unpublished '%s' (%u attached)", (unsigned long long) s->id,
                    (int) s->pid, obj->name, obj->attachments);
        objects_unpublish(s->node, obj);
        reply_ok(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_UNPUBLISH_REPLY;
        env.unpublish_reply = &ur;
        (void) reply_pack(&env, false, ret);
}

/* The processes an object's listing names that have it attached: the first seen. */
#define OBJECTS_LISTED_PIDS 16

static int cmp_object_id(const void *x, const void *y) {
        uint64_t a = (*(const struct object *const *) x)->id, b = (*(const struct object *const *) y)->id;

        return a < b ? -1 : a > b;
}

void request_objects(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        struct node *node = s->node;
        Gpupool__ObjectsReply orep = GPUPOOL__OBJECTS_REPLY__INIT;
        uint64_t after = req->objects->has_after_id ? req->objects->after_id : 0, now = uv_now(node->loop);
        struct object **all = calloc(node->object_count + 1, sizeof(*all));
        Gpupool__ObjectStatus *st = calloc(node->object_count + 1, sizeof(*st));
        Gpupool__ObjectStatus **ptrs = calloc(node->object_count + 1, sizeof(*ptrs));
        char **readers = calloc((size_t) node->object_count * GP_MAX_OBJECT_READERS + 1, sizeof(*readers));
        int32_t *pids = calloc((size_t) node->object_count * OBJECTS_LISTED_PIDS + 1, sizeof(*pids));
        size_t n = 0, count = 0, room, first;
        Gpupool__Envelope env;

        if (!all || !st || !ptrs || !readers || !pids) {
                free(all);
                free(st);
                free(ptrs);
                free(readers);
                free(pids);
                reply_error(req->id, -EIO, false, "out of memory listing the objects", ret);
                return;
        }
        for (struct object *o = node->objects; o; o = o->next)
                all[count++] = o;
        qsort(all, count, sizeof(*all), cmp_object_id);
        for (first = 0; first < count && all[first]->id <= after; first++)
                ;
        /* A page that fits a reply: what the envelope and the count take aside, each object's packed size. */
        room = GP_MAX_REPLY_BYTES - 256;
        for (size_t k = first; k < count; k++) {
                struct object *o = all[k];
                size_t size;

                gpupool__object_status__init(&st[n]);
                st[n].name = o->name;
                st[n].device = o->device;
                st[n].size = o->size;
                st[n].reserved_bytes = o->segment_size;
                st[n].tenant = o->tenant;
                st[n].uid = o->uid;
                st[n].attachments = o->attachments;
                st[n].age_ms = now - o->published_ms;
                st[n].unpublished = o->unpublished;
                st[n].readers = readers + n * GP_MAX_OBJECT_READERS;
                st[n].n_readers = o->n_readers;
                for (unsigned i = 0; i < o->n_readers; i++)
                        st[n].readers[i] = o->readers[i];
                st[n].has_id = true;
                st[n].id = o->id;
                /* Who holds it: an operator ends an unpublished object a reader keeps by ending that process. */
                st[n].attached_pids = pids + n * OBJECTS_LISTED_PIDS;
                SESSION_FOREACH(c, node)
                        for (unsigned i = 0; i < c->attached.count && st[n].n_attached_pids < OBJECTS_LISTED_PIDS; i++)
                                if (c->attached.list[i] == o)
                                        st[n].attached_pids[st[n].n_attached_pids++] = (int32_t) c->pid;
                size = gpupool__object_status__get_packed_size(&st[n]) + 8;
                if (size > room)
                        break;
                room -= size;
                ptrs[n] = &st[n];
                n++;
        }
        orep.n_objects = n;
        orep.objects = ptrs;
        orep.has_objects_left_out = true;
        orep.objects_left_out = (uint32_t) (count - first - n);
        reply_ok(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_OBJECTS_REPLY;
        env.objects_reply = &orep;
        (void) reply_pack(&env, false, ret);
        free(all);
        free(st);
        free(ptrs);
        free(readers);
        free(pids);
}
