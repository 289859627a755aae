/* objects.c: named objects (see objects.h). */
#include "objects.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "node.h"
#include "policy.h"
#include "size.h"

struct object *objects_find(struct node *node, const char *name) {
        for (struct object *o = node->objects; o; o = o->next)
                if (!o->unpublished && strcmp(o->name, name) == 0)
                        return o;
        return NULL;
}

struct object *objects_publish(struct node *node, const char *name, unsigned device, struct pool_owner *owner,
                               uint64_t segment_id, uint64_t offset, uint64_t size, struct tenant *t, uint32_t uid,
                               int *ret_err) {
        struct pool *pool = node->pools[device];
        struct object *o;
        uint64_t segment_size;
        int r;

        if (node->object_count >= OBJECTS_MAX) {
                *ret_err = -ENOSPC;
                return NULL;
        }
        o = calloc(1, sizeof(*o));
        if (!o) {
                *ret_err = -ENOMEM;
                return NULL;
        }
        snprintf(o->name, sizeof(o->name), "%s", name);
        o->device = device;
        o->segment_id = segment_id;
        o->offset = offset;
        o->size = size;
        o->uid = uid;
        snprintf(o->tenant, sizeof(o->tenant), "%s", t->conf.name);
        pool_owner_attach(pool, &o->owner, owner->principal);
        pool_owner_set_group(&o->owner, &t->sums[device]);
        r = pool_transfer(pool, owner, &o->owner, segment_id, &segment_size);
        if (r == 0 && (size == 0 || offset > segment_size || size > segment_size - offset))
                r = -EINVAL;    /* not within the segment */
        /* Immutable from now on, for everyone: the publisher has made its own mapping read-only first. */
        if (r == 0)
                r = pool_seal(pool, &o->owner, segment_id);
        if (r < 0 && r != -ENOENT)
                (void) pool_transfer(pool, &o->owner, owner, segment_id, &segment_size);    /* the client's again */
        if (r < 0) {
                (void) pool_owner_detach(&o->owner);
                free(o);
                *ret_err = r;
                return NULL;
        }
        o->segment_size = segment_size;
        /* Its bytes are in use for as long as it lives. */
        pool_owner_report(&o->owner, segment_size, 0, uv_now(node->loop));
        o->published_ms = o->idle_since_ms = uv_now(node->loop);
        o->next = node->objects;
        node->objects = o;
        node->object_count++;
        return o;
}

/* The object goes: its sealed segment back to the backend. */
static void object_destroy(struct node *node, struct object *obj) {
        char b[GP_SIZE_FORMAT_MAX];

        for (struct object **pp = &node->objects; *pp; pp = &(*pp)->next)
                if (*pp == obj) {
                        *pp = obj->next;
                        break;
                }
        node->object_count--;
        if (obj->unpublished)
                log_info("object '%s' (%s on device %u, tenant %s) is gone: unpublished, and the last process detached",
                         obj->name, gp_size_format(obj->segment_size, b, sizeof(b)), obj->device, obj->tenant);
        /* Sealed for good: the backend takes it back, nobody gets it again. */
        (void) pool_return(node->pools[obj->device], &obj->owner, obj->segment_id, true);
        (void) pool_owner_detach(&obj->owner);
        free(obj);
}

void objects_attach(struct object *obj) {
        obj->attachments++;
}

void objects_detach(struct node *node, struct object *obj) {
        if (obj->attachments && !--obj->attachments)
                obj->idle_since_ms = uv_now(node->loop);
        if (obj->unpublished && !obj->attachments)
                object_destroy(node, obj);
}

void objects_unpublish(struct node *node, struct object *obj) {
        obj->unpublished = true;
        if (!obj->attachments)
                object_destroy(node, obj);
}

/* Remembers that obj was evicted now, for a later attach's sentence. */
static void remember_evicted(struct node *node, const struct object *obj) {
        if (!node->evicted && !(node->evicted = calloc(OBJECTS_EVICTED_KEPT, sizeof(*node->evicted))))
                return;
        snprintf(node->evicted[node->evicted_next].name, sizeof(node->evicted[0].name), "%s", obj->name);
        node->evicted[node->evicted_next].at_ms = uv_now(node->loop);
        node->evicted_next = (node->evicted_next + 1) % OBJECTS_EVICTED_KEPT;
}

uint64_t objects_evict_idle(struct node *node, unsigned device, uint64_t want_bytes, const struct tenant *requester) {
        uint64_t now = uv_now(node->loop), evicted = 0;
        char b[GP_SIZE_FORMAT_MAX];

        while (evicted < want_bytes) {
                struct object *idlest = NULL;

                for (struct object *o = node->objects; o; o = o->next)
                        if (o->device == device && !o->attachments && !o->unpublished &&
                            policy_object_evictable(node->options->idle_objects_ms, o->idle_since_ms, now) &&
                            policy_object_serves(policy_tenant_by_name(&node->policy, o->tenant), requester, device) &&
                            (!idlest || o->idle_since_ms < idlest->idle_since_ms))
                                idlest = o;
                if (!idlest)
                        break;
                log_info("object '%s' (%s on device %u, tenant %s) evicted: nobody had it attached for %llu s and a lease "
                         "needed the memory", idlest->name, gp_size_format(idlest->segment_size, b, sizeof(b)),
                         idlest->device, idlest->tenant, (unsigned long long) ((now - idlest->idle_since_ms) / 1000));
                evicted += idlest->segment_size;
                remember_evicted(node, idlest);
                object_destroy(node, idlest);
        }
        return evicted;
}

bool objects_evicted(const struct node *node, const char *name, uint64_t *ret_ms) {
        bool found = false;

        /* The latest eviction of that name. */
        for (unsigned i = 0; node->evicted && i < OBJECTS_EVICTED_KEPT; i++)
                if (node->evicted[i].name[0] && strcmp(node->evicted[i].name, name) == 0 &&
                    (!found || node->evicted[i].at_ms > *ret_ms)) {
                        *ret_ms = node->evicted[i].at_ms;
                        found = true;
                }
        return found;
}

void objects_map_tenants(struct node *node) {
        for (struct object *o = node->objects; o; o = o->next) {
                struct tenant *t = policy_tenant_by_name(&node->policy, o->tenant);

                if (!t) {
                        log_info("object '%s': its tenant %s is gone with the reload; it counts to default now", o->name,
                                 o->tenant);
                        t = &node->policy.tenants[0];
                        snprintf(o->tenant, sizeof(o->tenant), "%s", t->conf.name);
                }
                pool_owner_set_group(&o->owner, &t->sums[o->device]);
        }
}

void objects_tenant_sums(struct node *node, const struct tenant *t, unsigned device, uint64_t *ret_reserved,
                         uint64_t *ret_in_use) {
        *ret_reserved = *ret_in_use = 0;
        for (struct object *o = node->objects; o; o = o->next)
                if (o->device == device && strcmp(o->tenant, t->conf.name) == 0) {
                        *ret_reserved += o->owner.reserved_bytes;
                        *ret_in_use += o->owner.reported_in_use_bytes;
                }
}

void objects_destroy_all(struct node *node) {
        free(node->evicted);
        node->evicted = NULL;
        while (node->objects)
                object_destroy(node, node->objects);
}
