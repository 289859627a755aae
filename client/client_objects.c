/*
 * client_objects.c: named objects (gpupool.h). Publishing hands a block's segment to the
 * daemon under a name: the segment leaves the process's pool (its other bytes zeroed first,
 * since others will map all of it), and the process keeps it mapped read-only as its first
 * attachment. Attaching maps an object's segment read-only from the descriptor the daemon sends
 * (host: open for reading only, so no mapping of it can be made writable; cuda-vmm: mapped with
 * read access only; cuda: an IPC handle, which opens read-write). The memory seam does the
 * mapping (client_mem.h). Built for whole segments; with segments that grow in place the calls
 * say so (-EOPNOTSUPP).
 */
#define _GNU_SOURCE
#include "client_objects.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_call.h"
#include "client_keep.h"
#include "client_mem.h"
#include "client_pool.h"
#include "client_segment.h"
#include "wire.h"

/* Whether the handle's session can have named objects; else says why. Locked. */
static int objects_built(gpupool_client *c) {
        if (c->grow) {
                client_set_error(c, "named objects need whole segments so far: unset $GPUPOOL_SEGMENTS (it is grow)");
                return -EOPNOTSUPP;
        }
        return 0;
}

static int name_ok(gpupool_client *c, const char *name) {
        if (gp_wire_object_name_is_valid(name))
                return 0;
        client_set_error(c, "an object's name is 1 to %d bytes of UTF-8 without control characters",
                         GP_MAX_OBJECT_NAME_BYTES);
        return -EINVAL;
}

/* What this process has attached as name: by name alone (publisher -1), or naming that publisher. */
static struct client_attachment *by_name(gpupool_client *c, const char *name, int64_t publisher) {
        for (struct client_attachment *a = c->attachments; a; a = a->next)
                if (strcmp(a->name, name) == 0 &&
                    (publisher < 0 ? !a->named : a->named && a->publisher_uid == (uint32_t) publisher))
                        return a;
        return NULL;
}

/* Unmaps a (and lets go of the descriptor kept, where the process published it). */
static void attachment_unmap(gpupool_client *c, struct client_attachment *a) {
        c->mem->unmap_read(c, a->device, a->base, a->segment_size);
        client_fd_release(a->fd);
}

/* Asks the daemon for req; 0 or a negative errno with the error set. Locked. */
static int ask(gpupool_client *c, Gpupool__Envelope *req, Gpupool__Envelope__BodyCase want, Gpupool__Envelope **ret,
               int *ret_fd) {
        Gpupool__Envelope *rep = NULL;
        int r = client_call(c, req, want, &rep, ret_fd);

        if (r == 0 && ret)
                *ret = rep;
        else if (rep)
                gpupool__envelope__free_unpacked(rep, NULL);
        return r;
}

/*
 * Asks the daemon to attach name, of publisher (-1: the daemon's default, this uid's or its
 * tenant's): the reply, and the descriptor that came with it (-1: none). Locked.
 */
static int ask_attach(gpupool_client *c, const char *name, int64_t publisher, Gpupool__Envelope **ret, int *ret_fd) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT;
        Gpupool__AttachRequest ar = GPUPOOL__ATTACH_REQUEST__INIT;

        ar.name = (char *) name;
        if (publisher >= 0) {
                ar.has_publisher_uid = true;
                ar.publisher_uid = (uint32_t) publisher;
        }
        req.body_case = GPUPOOL__ENVELOPE__BODY_ATTACH;
        req.attach = &ar;
        return ask(c, &req, GPUPOOL__ENVELOPE__BODY_ATTACH_REPLY, ret, ret_fd);
}

/* Tells the daemon this process no longer has name (the object id, where known) attached. Locked. */
static int ask_detach(gpupool_client *c, const char *name, uint64_t id) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT;
        Gpupool__DetachRequest dr = GPUPOOL__DETACH_REQUEST__INIT;

        dr.name = (char *) name;
        dr.has_id = id != 0;
        dr.id = id;
        req.body_case = GPUPOOL__ENVELOPE__BODY_DETACH;
        req.detach = &dr;
        return ask(c, &req, GPUPOOL__ENVELOPE__BODY_DETACH_REPLY, NULL, NULL);
}

/* The readers a publish names: "*" or tenants, comma-separated (NULL or "": none). Returns how many, or -EINVAL. Locked. */
static int readers_parse(gpupool_client *c, const char *text, char buf[GP_MAX_OBJECT_READERS][GP_MAX_READER_BYTES + 1],
                         char *ret[GP_MAX_OBJECT_READERS]) {
        int n = 0;

        for (const char *p = text; p && *p; n++) {
                size_t len = strcspn(p, ",");

                if (n == GP_MAX_OBJECT_READERS || len == 0 || len > GP_MAX_READER_BYTES) {
                        n = -1;
                        break;
                }
                memcpy(buf[n], p, len);
                buf[n][len] = '\0';
                ret[n] = buf[n];
                if (!gp_wire_reader_is_valid(buf[n])) {
                        n = -1;
                        break;
                }
                p += len + (p[len] == ',');
        }
        if (n < 0)
                client_set_error(c, "readers are at most %d, comma-separated, each '*' (every client of the node) or a "
                                    "tenant's name (letters, digits, '-', '_', '.'), not '%s'", GP_MAX_OBJECT_READERS, text);
        return n < 0 ? -EINVAL : n;
}

/* Takes m's segment out of the process's pool, its one live block b and its free rest alike. Locked. */
static void leave_pool(gpupool_client *c, struct mapping *m, struct block *b) {
        if (heap_free(&c->devices[m->device].heap, b->hb))
                (void) heap_remove(&m->hs);
}

/* Publishes live block b, out of the live table, of mapping m; on failure b is put back. Locked. */
static int publish_block(gpupool_client *c, const char *name, struct block *b, uint64_t size, char **readers,
                         int n_readers) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep = NULL;
        Gpupool__PublishRequest pr = GPUPOOL__PUBLISH_REQUEST__INIT;
        struct mapping *m = b->mapping;
        struct client_attachment *a;
        uint64_t offset = (uint64_t) (b->ptr - m->base);
        int r;

        if (m->segment_id & CLIENT_ORPHAN) {
                client_set_error(c, "the block at %p is in memory this process holds outside the pool (a daemon after a "
                                 "restart did not adopt it): it cannot become an object", (void *) b->ptr);
                return -EINVAL;
        }
        if (m->grow || m->hs.live_blocks != 1) {
                client_set_error(c, "the block at %p shares its segment with other blocks of this process: a published "
                                 "block must have its segment to itself (a block over 10 MiB always has)", (void *) b->ptr);
                return -EINVAL;
        }
        if (size == 0 || size > b->size) {
                client_set_error(c, "an object of %zu bytes is not within the block at %p of %llu bytes", (size_t) size,
                                 (void *) b->ptr, (unsigned long long) b->size);
                return -EINVAL;
        }
        a = calloc(1, sizeof(*a));
        if (!a)
                return -ENOMEM;
        /*
         * Others map all of the segment: nothing of this process's but the object may be in it.
         * Then read-only here, in place: the daemon seals what the backend can seal against
         * writing, which the kernel refuses while a writable mapping exists.
         */
        if ((r = c->mem->zero(c, m->device, m->base, offset)) < 0 ||
            (r = c->mem->zero(c, m->device, b->ptr + size, m->size - offset - size)) < 0 ||
            (r = c->mem->protect(c, m, false)) < 0) {
                free(a);
                return r;
        }
        pr.name = (char *) name;
        pr.device = m->device;
        pr.segment_id = m->segment_id;
        pr.offset = offset;
        pr.size = size;
        pr.readers = readers;
        pr.n_readers = (size_t) n_readers;
        req.body_case = GPUPOOL__ENVELOPE__BODY_PUBLISH;
        req.publish = &pr;
        r = ask(c, &req, GPUPOOL__ENVELOPE__BODY_PUBLISH_REPLY, &rep, NULL);
        if (r < 0) {
                free(a);
                /* Still the process's block: writable again, in place. */
                if (c->mem->protect(c, m, true) == 0)
                        return r;
                /*
                 * It cannot be: the daemon sealed the segment against writing and went before it
                 * answered (killed between its seal and its reply). The block stays allocated in the
                 * pool, read-only, never handed out again, and is no longer the application's.
                 */
                client_set_error(c, "the publish of '%s' got no answer (%s), and gpupoold had sealed the block's segment "
                                    "against writing already: the block is read-only now and no longer this process's "
                                    "to write or free", name, strerror(-r));
                /* All of the segment is read-only: none of it may be carved again, the free rest included. */
                leave_pool(c, m, b);
                m->sealed = true;
                return -EROFS;
        }
        /* The object's now, not the pool's: out of the heap and the trees, mapped read-only. */
        leave_pool(c, m, b);
        client_mapping_unlink(c, m);
        snprintf(a->name, sizeof(a->name), "%s", name);
        a->base = m->base;
        a->segment_size = m->size;
        a->ptr = b->ptr;
        a->size = size;
        a->count = 1;
        a->device = m->device;
        a->id = rep->publish_reply->has_id ? rep->publish_reply->id : 0;
        a->publisher_uid = (uint32_t) getuid();
        gpupool__envelope__free_unpacked(rep, NULL);
        a->fd = m->fd;
        a->next = c->attachments;
        c->attachments = a;
        free(m);
        free(b);
        return 0;
}

GPUPOOL_EXPORT int gpupool_publish_to(gpupool_client *c, const char *name, void *ptr, size_t size, const char *readers) {
        char buf[GP_MAX_OBJECT_READERS][GP_MAX_READER_BYTES + 1], *list[GP_MAX_OBJECT_READERS];
        struct block *b;
        int r, n;

        if (!c)
                return client_invalid(NULL, "%s: no handle (NULL): gpupool_connect() gives one", __func__);
        pthread_mutex_lock(&c->lock);
        if ((r = name_ok(c, name)) < 0 || (r = objects_built(c)) < 0 || (r = n = readers_parse(c, readers, buf, list)) < 0) {
                pthread_mutex_unlock(&c->lock);
                return r;
        }
        /* The blocks the threads' caches park are live in their segments: back to the pool first. */
        client_pool_drain(c, true);
        b = client_live_take(c, ptr);
        if (!b) {
                client_set_error(c, "%p is not a live block of this client (freed already, never allocated, or not the "
                                    "start of a block)", ptr);
                r = -ENOENT;
        } else if ((r = publish_block(c, name, b, size, list, n)) == -EROFS) {
                free(b);        /* its segment stays this process's, out of the pool and of use for good */
        } else if (r < 0) {
                (void) client_live_insert(c, b);        /* not published: still the application's */
        }
        pthread_mutex_unlock(&c->lock);
        return r;
}

GPUPOOL_EXPORT int gpupool_publish(gpupool_client *c, const char *name, void *ptr, size_t size) {
        return gpupool_publish_to(c, name, ptr, size, NULL);
}

/* gpupool_attach() and gpupool_attach_of(): publisher -1 for the daemon's default. */
static int attach(gpupool_client *c, const char *name, int64_t publisher, const void **ret_ptr, size_t *ret_size) {
        Gpupool__Envelope *rep = NULL;
        struct client_attachment *a;
        const Gpupool__AttachReply *reply;
        int fd = -1, r;

        if (!c)
                return client_invalid(NULL, "%s: no handle (NULL): gpupool_connect() gives one", "gpupool_attach");
        if (!ret_ptr || !ret_size)
                return client_invalid(c, "%s: no place for the pointer or the size (NULL)", "gpupool_attach");
        pthread_mutex_lock(&c->lock);
        if ((r = name_ok(c, name)) < 0 || (r = objects_built(c)) < 0)
                goto out;
        if ((a = by_name(c, name, publisher))) {
                a->count++;
                goto found;
        }
        if ((r = ask_attach(c, name, publisher, &rep, &fd)) < 0)
                goto out;
        reply = rep->attach_reply;
        a = calloc(1, sizeof(*a));
        if (!a || (c->mem->ipc ? !reply->has_ipc_handle || reply->ipc_handle.len != GP_IPC_HANDLE_BYTES : fd < 0) ||
            reply->device >= c->device_count || reply->offset > reply->segment_size ||
            reply->size > reply->segment_size - reply->offset) {
                client_set_error(c, "gpupoold attached '%s' without a segment that holds it", name);
                r = a ? -EPROTO : -ENOMEM;
                free(a);
                goto out;
        }
        if ((r = c->mem->map_read(c, reply->device, fd, reply->ipc_handle.data, reply->segment_size, &a->base)) < 0) {
                free(a);
                goto out;
        }
        snprintf(a->name, sizeof(a->name), "%s", name);
        a->segment_size = reply->segment_size;
        a->ptr = a->base + reply->offset;
        a->size = reply->size;
        a->count = 1;
        a->device = reply->device;
        a->id = reply->has_id ? reply->id : 0;
        a->named = publisher >= 0;
        a->publisher_uid = reply->has_publisher_uid ? reply->publisher_uid : (uint32_t) publisher;
        snprintf(a->publisher_tenant, sizeof(a->publisher_tenant), "%s",
                 reply->publisher_tenant ? reply->publisher_tenant : "");
        a->fd = -1;
        a->next = c->attachments;
        c->attachments = a;
found:
        *ret_ptr = a->ptr;
        *ret_size = a->size;
        r = 0;
out:
        if (fd >= 0)
                close(fd);
        if (rep)
                gpupool__envelope__free_unpacked(rep, NULL);
        pthread_mutex_unlock(&c->lock);
        return r;
}

GPUPOOL_EXPORT int gpupool_attach(gpupool_client *c, const char *name, const void **ret_ptr, size_t *ret_size) {
        return attach(c, name, -1, ret_ptr, ret_size);
}

GPUPOOL_EXPORT int gpupool_attach_of(gpupool_client *c, const char *name, unsigned publisher_uid, const void **ret_ptr,
                                     size_t *ret_size) {
        return attach(c, name, publisher_uid, ret_ptr, ret_size);
}

GPUPOOL_EXPORT int gpupool_object_publisher(gpupool_client *c, const void *ptr, unsigned *ret_uid, char *tenant,
                                            size_t tenant_size) {
        int r = -ENOENT;

        if (!c)
                return client_invalid(NULL, "%s: no handle (NULL): gpupool_connect() gives one", __func__);
        if (!ret_uid)
                return client_invalid(c, "gpupool_object_publisher: no place for the uid (ret_uid is NULL)");
        pthread_mutex_lock(&c->lock);
        for (struct client_attachment *a = c->attachments; a; a = a->next)
                if (a->ptr == ptr) {
                        *ret_uid = a->publisher_uid;
                        if (tenant_size)
                                snprintf(tenant, tenant_size, "%s", a->publisher_tenant);
                        r = 0;
                        break;
                }
        if (r < 0)
                client_set_error(c, "%p is not where an object this client attached starts", ptr);
        pthread_mutex_unlock(&c->lock);
        return r;
}

GPUPOOL_EXPORT int gpupool_detach(gpupool_client *c, const void *ptr) {
        struct client_attachment **pp, *a = NULL;
        int r = 0;

        if (!c)
                return client_invalid(NULL, "%s: no handle (NULL): gpupool_connect() gives one", __func__);
        pthread_mutex_lock(&c->lock);
        for (pp = &c->attachments; *pp; pp = &(*pp)->next)
                if ((*pp)->ptr == ptr) {
                        a = *pp;
                        break;
                }
        if (!a) {
                client_set_error(c, "%p is not where an object this client attached starts", ptr);
                r = -ENOENT;
        } else if (--a->count == 0) {
                *pp = a->next;
                /* Unmapped first: once the daemon hears of it, the memory may go. */
                attachment_unmap(c, a);
                if (!a->unknown)
                        r = ask_detach(c, a->name, a->id);
                free(a);
        }
        pthread_mutex_unlock(&c->lock);
        return r;
}

GPUPOOL_EXPORT int gpupool_unpublish(gpupool_client *c, const char *name) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT;
        Gpupool__UnpublishRequest ur = GPUPOOL__UNPUBLISH_REQUEST__INIT;
        int r;

        if (!c)
                return client_invalid(NULL, "%s: no handle (NULL): gpupool_connect() gives one", __func__);
        pthread_mutex_lock(&c->lock);
        if ((r = name_ok(c, name)) == 0) {
                ur.name = (char *) name;
                req.body_case = GPUPOOL__ENVELOPE__BODY_UNPUBLISH;
                req.unpublish = &ur;
                r = ask(c, &req, GPUPOOL__ENVELOPE__BODY_UNPUBLISH_REPLY, NULL, NULL);
        }
        pthread_mutex_unlock(&c->lock);
        return r;
}

void client_objects_daemon_changed(gpupool_client *c) {
        for (struct client_attachment *a = c->attachments; a; a = a->next)
                a->unknown = true;
}

/*
 * Attaches a again, on the daemon after the one it was attached from: counted there if that
 * daemon took the same object over (its id), so that it is never evicted from under this
 * process; told at once that it is not, otherwise. Locked.
 */
static void attach_again(gpupool_client *c, struct client_attachment *a) {
        Gpupool__Envelope *rep = NULL;
        const Gpupool__AttachReply *reply;
        int fd = -1;

        if (!a->id || ask_attach(c, a->name, a->publisher_uid, &rep, &fd) < 0)
                return;         /* gone with the daemon before (no store kept it), or not this process's to attach */
        if (fd >= 0)
                close(fd);      /* mapped already */
        reply = rep->attach_reply;
        if (reply->has_id && reply->id == a->id && reply->size == a->size && reply->segment_size == a->segment_size) {
                a->unknown = false;
        } else {
                (void) ask_detach(c, a->name, reply->has_id ? reply->id : 0);   /* another object of that name: not this process's mapping */
        }
        gpupool__envelope__free_unpacked(rep, NULL);
}

void client_objects_resume(gpupool_client *c) {
        for (struct client_attachment *a = c->attachments; a; a = a->next)
                if (a->unknown)
                        attach_again(c, a);
}

void client_objects_forget(gpupool_client *c) {
        struct client_attachment *a;

        while ((a = c->attachments)) {
                c->attachments = a->next;
                attachment_unmap(c, a);
                free(a);
        }
}
