/*
 * objects.h: named objects (objects.c), memory that outlives the process that made it. A
 * client publishes a segment it leases under a name: the segment leaves the client's lease for
 * the object's own owner in the pool, in the publisher's tenant's group, so that it counts
 * against the tenant's max and guarantee until unpublished, whoever has exited meanwhile.
 * Processes attach it (read-only, without a copy) and detach it; an unpublished object goes
 * once the last process has detached, and a process that exits detaches. The node holds the
 * list. Under systemd, each object's descriptor and a record of it are kept in the service's
 * descriptor store (notify.h), so that the daemon after a restart takes them over.
 */
#ifndef GP_OBJECTS_H
#define GP_OBJECTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "identity.h"
#include "pool.h"
#include "wire.h"

struct node;
struct session;
struct tenant;

/* The most objects a node holds at once (a reply lists them all). */
#define OBJECTS_MAX 256
/*
 * The most one holder may have: a pod, whatever uids its processes take (a pod may pick any),
 * or a uid outside pods. No one takes all of the node's: filling them takes four pods or users.
 */
#define OBJECTS_PER_HOLDER 64
/* Evicted names remembered, for the sentence of a later attach. */
#define OBJECTS_EVICTED_KEPT 64

struct object_evicted {
        char name[GP_MAX_OBJECT_NAME_BYTES + 1];
        uint64_t at_ms;
};

struct object {
        struct object *next;
        char name[GP_MAX_OBJECT_NAME_BYTES + 1];
        unsigned device;
        uint64_t segment_id, segment_size;
        uint64_t offset, size;                  /* the object's bytes in the segment */
        struct pool_owner owner;                /* holds the segment, in its tenant's group */
        char tenant[CONFIG_NAME_MAX + 1];       /* the publisher's, by name: a reload maps it again */
        uint32_t uid;                           /* the publisher's */
        uint32_t user;                          /* the user that uid is (users.h): what OBJECTS_PER_HOLDER counts */
        char pod[IDENTITY_POD_UID_LEN + 1];     /* the publisher's pod ("": none); its principal is the owner's */
        unsigned attachments;                   /* sessions that have it attached */
        uint64_t published_ms;
        uint64_t idle_since_ms;                 /* when attachments last fell to 0 (eviction's clock) */
        bool unpublished;                       /* goes once attachments is 0 */
        uint64_t id;                            /* unique, random: names it in systemd's store */
        /* Who else may attach it, as published: "*" (every client) or tenants by name. */
        char readers[GP_MAX_OBJECT_READERS][GP_MAX_READER_BYTES + 1];
        unsigned n_readers;
        bool stored;                            /* its descriptors are in systemd's store (objects_restore()) */
};

/*
 * The object called name that uid published, not unpublished, or NULL. Names are each uid's:
 * another uid's object of the same name is another object.
 */
struct object *objects_find(struct node *node, uint32_t uid, const char *name);

/* The bytes the objects of principal hold on device (their segments), and how many it holds on any device. */
uint64_t objects_principal_bytes(const struct node *node, uint64_t principal, unsigned device);
/*
 * How many objects a holder has (OBJECTS_PER_HOLDER): pod's, published by any uid, or, with pod
 * "", user's outside pods, published by any of her uids (session_same_group()).
 */
unsigned objects_holder_count(const struct node *node, uint32_t user, const char *pod);

/*
 * Says in buf (", "-separated uids, at most 8, then "..."), which uids other than but publish
 * an object called name; "" for none. Returns how many do.
 */
unsigned objects_publishers(struct node *node, const char *name, uint32_t but, char *buf, size_t size);

/*
 * Makes the object name of the segment segment_id that owner leases on device: the segment
 * moves to the object, in tenant t's group, sealed against writing (pool_seal()), attachable
 * by readers too (checked: objects_readers_valid()). Returns it, or
 * NULL with *ret_err: -ENOENT (no such segment of owner's), -EINVAL (offset and size not within
 * it), -EBUSY (still mapped writable), -EOPNOTSUPP (a backend that cannot seal), -ENOSPC
 * (OBJECTS_MAX), -ENOMEM. sealed: the segment was sealed already (pool_seal_begin(), off the
 * loop): it is not sealed again.
 */
struct object *objects_publish(struct node *node, const char *name, unsigned device, struct pool_owner *owner,
                               uint64_t segment_id, uint64_t offset, uint64_t size, struct tenant *t, uint32_t uid,
                               const char *pod, char *const *readers, size_t n_readers, bool sealed, int *ret_err);

/* Whether readers (n of them, each checked: gp_wire_reader_is_valid()) may be an object's. */
bool objects_readers_valid(char *const *readers, size_t n);

/* Whether a client of tenant (NULL: none yet) is among obj's readers. */
bool objects_reader(const struct object *obj, const char *tenant);

/* One more session has obj attached; and one less (the unpublished object goes at the last). */
void objects_attach(struct object *obj);
void objects_detach(struct node *node, struct object *obj);

/* Unpublishes obj: no one attaches it from now on; it goes at once when nobody has it attached. */
void objects_unpublish(struct node *node, struct object *obj);

/*
 * Memory pressure on device, for a lease of tenant requester: evicts objects nobody has
 * attached for idle_objects, the idlest first, whose memory would serve it (policy's
 * policy_object_evictable() and policy_object_serves()), until want_bytes have gone or none
 * is left. Returns the bytes evicted. An attached object never is.
 */
uint64_t objects_evict_idle(struct node *node, unsigned device, uint64_t want_bytes, const struct tenant *requester);

/* When the object name was evicted (loop clock), for the sentence of a later attach; false if it was not lately. */
bool objects_evicted(const struct node *node, const char *name, uint64_t *ret_ms);

/* Before the tenants are made anew (a reload, a reservation): every object leaves its tenant's group. */
void objects_leave_tenants(struct node *node);

/* After: each object in its tenant's group again, by name (default where it is gone). */
void objects_map_tenants(struct node *node);

/* What the objects of tenant t hold on device, for the tenants' check. */
void objects_tenant_sums(struct node *node, const struct tenant *t, unsigned device, uint64_t *ret_reserved,
                         uint64_t *ret_in_use);

/*
 * At the daemon's stop, after every session: every object goes from this daemon. What systemd
 * stores of them stays there, for the next daemon it starts (a restart keeps the store; a stop
 * of the unit empties it, and their memory goes then).
 */
void objects_destroy_all(struct node *node);

/*
 * At start, before any client: takes over the objects a daemon before this one kept in
 * systemd's descriptor store (passed: the descriptors named NOTIFY_STORED_PREFIX...), each
 * checked as adoption checks a client's segment, with its name, tenant (default where it is
 * gone), publisher and age. What cannot be taken over is logged, closed and removed from the
 * store; the descriptors taken are set to -1 in passed. Returns how many objects it took.
 */
struct notify_passed;
unsigned objects_restore(struct node *node, struct notify_passed *passed);

#endif
