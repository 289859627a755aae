/* objects.c: named objects (see objects.h). */
#define _GNU_SOURCE
#include "objects.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gpupool.pb-c.h"
#include "identity.h"
#include "log.h"
#include "node.h"
#include "notify.h"
#include "policy.h"
#include "size.h"
#include "users.h"

/* A record in the store is a few hundred bytes: anything larger is not ours. */
#define RECORD_MAX 4096

static uint64_t unix_ms(void) {
        struct timespec ts;

        clock_gettime(CLOCK_REALTIME, &ts);
        return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

/* The names an object's two descriptors have in systemd's store: its segment's, and its record's. */
static void stored_names(uint64_t id, char segment[NOTIFY_NAME_MAX + 1], char record[NOTIFY_NAME_MAX + 1]) {
        snprintf(segment, NOTIFY_NAME_MAX + 1, NOTIFY_STORED_PREFIX "object-%016" PRIx64, id);
        snprintf(record, NOTIFY_NAME_MAX + 1, NOTIFY_STORED_PREFIX "record-%016" PRIx64, id);
}

/* A sealed memfd holding o's record, or a negative errno. */
static int record_memfd(struct node *node, const struct object *o) {
        Gpupool__ObjectRecord r = GPUPOOL__OBJECT_RECORD__INIT;
        char *readers[GP_MAX_OBJECT_READERS];
        uint8_t buf[RECORD_MAX];
        size_t n;
        int fd;

        r.name = (char *) o->name;
        r.backend = (char *) node->backend->name;
        r.device = o->device;
        r.segment_size = o->segment_size;
        r.offset = o->offset;
        r.size = o->size;
        r.tenant = (char *) o->tenant;
        r.uid = o->uid;
        r.pod_uid = o->pod[0] ? (char *) o->pod : NULL;
        r.id = o->id;
        r.published_unix_ms = unix_ms() - (uv_now(node->loop) - o->published_ms);
        for (unsigned i = 0; i < o->n_readers; i++)
                readers[i] = (char *) o->readers[i];
        r.readers = readers;
        r.n_readers = o->n_readers;
        if (node->devices[o->device].has_uuid) {
                r.has_device_uuid = true;
                r.device_uuid.len = sizeof(node->devices[o->device].uuid);
                r.device_uuid.data = (uint8_t *) node->devices[o->device].uuid;
        }
        if ((n = gpupool__object_record__get_packed_size(&r)) > sizeof(buf))
                return -EMSGSIZE;
        gpupool__object_record__pack(&r, buf);
        if ((fd = memfd_create("gpupool-object-record", MFD_CLOEXEC | MFD_ALLOW_SEALING)) < 0)
                return -errno;
        if (write(fd, buf, n) != (ssize_t) n ||
            fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
                int err = -errno;

                close(fd);
                return err ? err : -EIO;
        }
        return fd;
}

/*
 * Under systemd (a $NOTIFY_SOCKET), keeps o's segment and record in the service's descriptor
 * store, for the daemon after this one. Nothing when there is no systemd to keep them.
 */
static void object_store(struct node *node, struct object *o) {
        char segment[NOTIFY_NAME_MAX + 1], record[NOTIFY_NAME_MAX + 1];
        int fd = pool_leased_export(node->pools[o->device], &o->owner, o->segment_id, false), rfd, r;

        if (fd == -EOPNOTSUPP)
                return;         /* a backend without descriptors: its objects die with it */
        stored_names(o->id, segment, record);
        /* The segment first (0: no systemd to keep it): a record names a segment the store holds. */
        r = fd < 0 ? fd : notify_store(segment, fd);
        if (fd >= 0)
                close(fd);      /* the store has its own */
        if (r == 0)
                return;
        if (r > 0 && (rfd = r = record_memfd(node, o)) >= 0) {
                r = notify_store(record, rfd);
                close(rfd);
        }
        if (r <= 0) {
                log_warn("object '%s': it is not in systemd's store (%s): it will not outlive a restart of gpupoold",
                         o->name, strerror(r < 0 ? -r : EIO));
                (void) notify_store_remove(segment);
                return;
        }
        o->stored = true;
}

/* Takes o's descriptors out of systemd's store: the memory goes with this daemon's. */
static void object_unstore(const struct object *o) {
        char segment[NOTIFY_NAME_MAX + 1], record[NOTIFY_NAME_MAX + 1];
        int r;

        if (!o->stored)
                return;
        stored_names(o->id, segment, record);
        /* The record first: without it, a daemon after drops the segment rather than bring the object back. */
        if ((r = notify_store_remove(record)) < 0)
                log_err("object '%s': systemd did not take the removal of its record from its store (%s): a gpupoold "
                        "after a restart would take the object over again", o->name, strerror(-r));
        else if ((r = notify_store_remove(segment)) < 0)
                log_err("object '%s': systemd did not take the removal of its segment from its store (%s): its memory "
                        "stays there until gpupoold restarts or the unit stops", o->name, strerror(-r));
}

struct object *objects_find(struct node *node, uint32_t uid, const char *name) {
        for (struct object *o = node->objects; o; o = o->next)
                if (!o->unpublished && o->uid == uid && strcmp(o->name, name) == 0)
                        return o;
        return NULL;
}

uint64_t objects_principal_bytes(const struct node *node, uint64_t principal, unsigned device) {
        uint64_t bytes = 0;

        for (const struct object *o = node->objects; o; o = o->next)
                if (o->owner.principal == principal && o->device == device)
                        bytes += o->segment_size;
        return bytes;
}

unsigned objects_holder_count(const struct node *node, uint32_t user, const char *pod) {
        unsigned n = 0;

        for (const struct object *o = node->objects; o; o = o->next)
                n += users_same_group(o->user, o->pod, user, pod);
        return n;
}

unsigned objects_publishers(struct node *node, const char *name, uint32_t but, char *buf, size_t size) {
        unsigned n = 0;
        size_t len = 0;

        buf[0] = '\0';
        for (struct object *o = node->objects; o; o = o->next) {
                if (o->unpublished || o->uid == but || strcmp(o->name, name) != 0)
                        continue;
                if (n < 8 && len < size)
                        len += (size_t) snprintf(buf + len, size - len, "%s%u", n ? ", " : "", (unsigned) o->uid);
                else if (n == 8 && len < size)
                        len += (size_t) snprintf(buf + len, size - len, ", ...");
                n++;
        }
        return n;
}

bool objects_readers_valid(char *const *readers, size_t n) {
        if (n > GP_MAX_OBJECT_READERS)
                return false;
        for (size_t i = 0; i < n; i++)
                if (!gp_wire_reader_is_valid(readers[i]))
                        return false;
        return true;
}

bool objects_reader(const struct object *obj, const char *tenant) {
        for (unsigned i = 0; i < obj->n_readers; i++)
                if (strcmp(obj->readers[i], "*") == 0 || (tenant && strcmp(obj->readers[i], tenant) == 0))
                        return true;
        return false;
}

/* Sets obj's readers (valid, at most GP_MAX_OBJECT_READERS). */
static void set_readers(struct object *obj, char *const *readers, size_t n) {
        obj->n_readers = 0;
        for (size_t i = 0; i < n && i < GP_MAX_OBJECT_READERS; i++)
                snprintf(obj->readers[obj->n_readers++], sizeof(obj->readers[0]), "%s", readers[i]);
}

/*
 * A new object, not yet the node's: named, of size bytes at offset on device, for uid in
 * tenant t's group, its owner attached as principal. NULL when out of memory.
 */
static struct object *object_new(struct node *node, const char *name, unsigned device, uint64_t offset, uint64_t size,
                                  struct tenant *t, uint32_t uid, uint64_t principal, char *const *readers, size_t n_readers) {
        struct object *o = calloc(1, sizeof(*o));

        if (!o)
                return NULL;
        snprintf(o->name, sizeof(o->name), "%s", name);
        snprintf(o->tenant, sizeof(o->tenant), "%s", t->conf.name);
        o->device = device;
        o->offset = offset;
        o->size = size;
        o->uid = uid;
        set_readers(o, readers, n_readers);
        pool_owner_attach(node->pools[device], &o->owner, principal);
        pool_owner_set_group(&o->owner, &t->sums[device]);
        return o;
}

/* o, whose segment segment_id of segment_size bytes it owns now, becomes the node's: in use for as long as it lives. */
static void object_link(struct node *node, struct object *o, uint64_t segment_id, uint64_t segment_size) {
        o->segment_id = segment_id;
        o->segment_size = segment_size;
        pool_owner_report(&o->owner, segment_size, 0, uv_now(node->loop));
        o->next = node->objects;
        node->objects = o;
        node->object_count++;
}

struct object *objects_publish(struct node *node, const char *name, unsigned device, struct pool_owner *owner,
                               uint64_t segment_id, uint64_t offset, uint64_t size, struct tenant *t, uint32_t uid,
                               const char *pod, char *const *readers, size_t n_readers, bool sealed, int *ret_err) {
        struct pool *pool = node->pools[device];
        struct object *o;
        uint64_t segment_size;
        int r;

        if (node->object_count >= OBJECTS_MAX) {
                *ret_err = -ENOSPC;
                return NULL;
        }
        o = object_new(node, name, device, offset, size, t, uid, owner->principal, readers, n_readers);
        if (!o) {
                *ret_err = -ENOMEM;
                return NULL;
        }
        snprintf(o->pod, sizeof(o->pod), "%s", pod ? pod : "");
        r = pool_transfer(pool, owner, &o->owner, segment_id, &segment_size);
        if (r == 0 && (size == 0 || offset > segment_size || size > segment_size - offset))
                r = -EINVAL;    /* not within the segment */
        /* Immutable from now on, for everyone: the publisher has made its own mapping read-only first. */
        if (r == 0 && !sealed)
                r = pool_seal(pool, &o->owner, segment_id);
        if (r < 0 && r != -ENOENT)
                (void) pool_transfer(pool, &o->owner, owner, segment_id, &segment_size);    /* the client's again */
        if (r < 0) {
                (void) pool_owner_detach(&o->owner);
                free(o);
                *ret_err = r;
                return NULL;
        }
        o->published_ms = o->idle_since_ms = uv_now(node->loop);
        if (getrandom(&o->id, sizeof(o->id), 0) != sizeof(o->id))
                o->id = ((uint64_t) rand() << 32) ^ (uint64_t) rand() ^ unix_ms();
        object_link(node, o, segment_id, segment_size);
        object_store(node, o);
        return o;
}

/* The object goes: its sealed segment back to the backend; and (unstore) out of systemd's store. */
static void object_destroy(struct node *node, struct object *obj, bool unstore) {
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
        if (unstore)
                object_unstore(obj);
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
                object_destroy(node, obj, true);
}

void objects_unpublish(struct node *node, struct object *obj) {
        obj->unpublished = true;
        /*
         * Out of systemd's store now, not when the last process detaches: a daemon after a crash
         * would take the record over as published, the revoked bytes attachable by name again
         * and a new object of that name dropped for it. The attached processes keep their
         * mappings; after such a crash the memory is theirs, uncounted, until they detach.
         */
        object_unstore(obj);
        obj->stored = false;
        if (!obj->attachments)
                object_destroy(node, obj, true);
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
                object_destroy(node, idlest, true);
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

void objects_leave_tenants(struct node *node) {
        for (struct object *o = node->objects; o; o = o->next)
                pool_owner_set_group(&o->owner, NULL);
}

void objects_map_tenants(struct node *node) {
        for (struct object *o = node->objects; o; o = o->next) {
                struct tenant *t = policy_tenant_by_name(&node->policy, o->tenant);

                if (!t) {
                        log_info("object '%s': its tenant %s is gone; it counts to default now", o->name,
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
        /* The store keeps the others for the daemon systemd starts next; an unpublished one ends here. */
        while (node->objects)
                object_destroy(node, node->objects, node->objects->unpublished);
}

/* The index in passed of the descriptor called name, or -1. */
static int passed_index(const struct notify_passed *passed, const char *name) {
        for (unsigned i = 0; i < passed->n; i++)
                if (passed->fds[i] >= 0 && strcmp(passed->names[i], name) == 0)
                        return (int) i;
        return -1;
}

/* Reads the record in fd; NULL, saying why, when it is not one. */
static Gpupool__ObjectRecord *record_read(int fd, char *why, size_t why_size) {
        Gpupool__ObjectRecord *r;
        uint8_t buf[RECORD_MAX];
        struct stat st;
        ssize_t n;

        /* Only a memfd: never a file whose file system could keep the loop waiting. */
        if (fcntl(fd, F_GET_SEALS) < 0 || fstat(fd, &st) < 0 || st.st_size <= 0 || st.st_size > RECORD_MAX ||
            (n = pread(fd, buf, (size_t) st.st_size, 0)) != st.st_size) {
                snprintf(why, why_size, "its record is not a memfd of at most %d bytes", RECORD_MAX);
                return NULL;
        }
        if (!(r = gpupool__object_record__unpack(NULL, (size_t) n, buf)))
                snprintf(why, why_size, "its record does not parse");
        return r;
}

/*
 * Takes over the object r describes, of the segment *fd: set to -1 once the backend has it
 * (then closed, or the pool's). Returns 0, or -1 saying why.
 */
static int object_take(struct node *node, const Gpupool__ObjectRecord *r, int *fd, char *why, size_t why_size) {
        struct backend *b = node->backend;
        struct backend_mem mem;
        struct pool_lease lease;
        struct tenant *t;
        struct object *o;
        uint64_t now = uv_now(node->loop), age;
        char what[160];

        if (strcmp(r->backend, b->name) != 0) {
                snprintf(why, why_size, "it was on the %s backend, and this daemon runs %s", r->backend, b->name);
                return -1;
        }
        if (!gp_wire_object_name_is_valid(r->name) || r->device >= node->device_count || r->size == 0 ||
            !objects_readers_valid(r->readers, r->n_readers) ||
            r->offset > r->segment_size || r->size > r->segment_size - r->offset) {
                snprintf(why, why_size, "its record is not of an object this daemon can have (device %u, %" PRIu64
                         " bytes at %" PRIu64 " of %" PRIu64 ")", r->device, r->size, r->offset, r->segment_size);
                return -1;
        }
        if (r->has_device_uuid != (bool) node->devices[r->device].has_uuid ||
            (r->has_device_uuid && (r->device_uuid.len != sizeof(node->devices[r->device].uuid) ||
                                    memcmp(r->device_uuid.data, node->devices[r->device].uuid, r->device_uuid.len) != 0))) {
                snprintf(why, why_size, "it was on another GPU than this daemon's device %u", r->device);
                return -1;
        }
        if (objects_find(node, r->uid, r->name)) {
                snprintf(why, why_size, "an object of that name and uid was taken over already");
                return -1;
        }
        if (node->object_count >= OBJECTS_MAX) {
                snprintf(why, why_size, "this daemon holds %d objects, the most it may", OBJECTS_MAX);
                return -1;
        }
        if (!b->ops->mem_adopt || !b->ops->mem_seal) {
                snprintf(why, why_size, "the %s backend cannot take memory over", b->name);
                return -1;
        }
        if (b->ops->mem_adopt(b, r->device, *fd, r->segment_size, true, &mem, what, sizeof(what)) < 0) {
                snprintf(why, why_size, "its segment is %s", what);
                return -1;
        }
        if (mem.fd == *fd)
                *fd = -1;       /* the backend's, in mem */
        if (!(t = policy_tenant_by_name(&node->policy, r->tenant))) {
                log_info("object '%s': its tenant %s is not in the config; it counts to default now", r->name, r->tenant);
                t = &node->policy.tenants[0];
        }
        /* Its publisher's principal again: the uid, and the pod where it published from one. */
        o = object_new(node, r->name, r->device, r->offset, r->size, t, r->uid,
                       identity_principal(&node->identities, r->uid, true, r->pod_uid, 0), r->readers, r->n_readers);
        if (!o) {
                b->ops->mem_destroy(b, r->device, &mem, r->segment_size);
                snprintf(why, why_size, "out of memory");
                return -1;
        }
        o->id = r->id;
        snprintf(o->pod, sizeof(o->pod), "%s", r->pod_uid ? r->pod_uid : "");
        o->user = users_owner(r->uid, NULL);    /* by /etc/subuid: its publisher's cgroup is not kept */
        /* Memory the device holds already: no headroom applies, only the pool's capacity, which it joins (node_adopted()). */
        node_adopted(node, o->device, r->segment_size, true);
        if (pool_adopt(node->pools[o->device], &o->owner, &mem, r->segment_size, UINT64_MAX, &lease) < 0) {
                node_adopted(node, o->device, r->segment_size, false);
                b->ops->mem_destroy(b, r->device, &mem, r->segment_size);
                (void) pool_owner_detach(&o->owner);
                free(o);
                snprintf(why, why_size, "the pool has no room for its %" PRIu64 " bytes", r->segment_size);
                return -1;
        }
        age = unix_ms() > r->published_unix_ms ? unix_ms() - r->published_unix_ms : 0;
        o->published_ms = now > age ? now - age : 0;
        o->idle_since_ms = now;
        o->stored = true;
        object_link(node, o, lease.segment_id, r->segment_size);
        return 0;
}

/* Closes passed's descriptor i, which is taken care of. */
static void passed_done(struct notify_passed *passed, int i) {
        if (i >= 0 && passed->fds[i] >= 0) {
                close(passed->fds[i]);
                passed->fds[i] = -1;
        }
}

unsigned objects_restore(struct node *node, struct notify_passed *passed) {
        char segment[NOTIFY_NAME_MAX + 1], record[NOTIFY_NAME_MAX + 1], why[256], b[GP_SIZE_FORMAT_MAX];
        unsigned taken = 0;

        for (unsigned i = 0; i < passed->n; i++) {
                Gpupool__ObjectRecord *r = NULL;
                uint64_t id;
                int s;

                if (passed->fds[i] < 0 || sscanf(passed->names[i], NOTIFY_STORED_PREFIX "record-%" SCNx64, &id) != 1)
                        continue;
                stored_names(id, segment, record);
                if (strcmp(record, passed->names[i]) != 0)
                        continue;       /* not a name of ours after all: dropped below, by its own name */
                if ((s = passed_index(passed, segment)) < 0)
                        snprintf(why, sizeof(why), "systemd's store holds its record but not its segment");
                else if ((r = record_read(passed->fds[i], why, sizeof(why))) && r->id != id)
                        snprintf(why, sizeof(why), "its record names another object");
                if (s >= 0 && r && r->id == id && object_take(node, r, &passed->fds[s], why, sizeof(why)) == 0) {
                        /* Its segment is the pool's now; the store keeps its own copies. */
                        log_info("object '%s' (%s on device %u, tenant %s) taken over from the gpupoold before this one",
                                 r->name, gp_size_format(r->segment_size, b, sizeof(b)), r->device, node->objects->tenant);
                        taken++;
                } else {
                        log_warn("object '%s' kept in systemd's store: not taken over: %s; its memory goes",
                                 r ? r->name : record, why);
                        (void) notify_store_remove(record);
                        (void) notify_store_remove(segment);
                        passed_done(passed, s);
                }
                passed_done(passed, (int) i);
                if (r)
                        gpupool__object_record__free_unpacked(r, NULL);
        }
        /* The rest of ours: a segment without its record, or a name this daemon does not know. */
        for (unsigned i = 0; i < passed->n; i++)
                if (passed->fds[i] >= 0) {
                        log_warn("%s, kept in systemd's store, is no object's: dropped", passed->names[i]);
                        (void) notify_store_remove(passed->names[i]);
                        passed_done(passed, (int) i);
                }
        return taken;
}
