/*
 * client.c: libgpupool, the thin client of gpupoold.
 *
 * Every call is one request and its reply on the handle's socket, under the handle's lock.
 * The library maps each segment the daemon hands it once (the host backend passes a memfd),
 * keeps the mappings in two trees (by address for free(), by segment id for alloc replies),
 * and unmaps a segment as soon as the daemon says it holds no live block, before telling the
 * daemon it may give the segment to someone else.
 */
#define _GNU_SOURCE
#include "gpupool.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "conn.h"
#include "rbtree.h"

struct mapping {
        uint64_t segment_id;
        uint64_t size;
        uint8_t *base;
        struct gp_rb_node by_addr;
        struct gp_rb_node by_id;
};

struct gpupool_client {
        pthread_mutex_t lock;   /* one request at a time on the connection */
        struct gp_conn conn;
        unsigned device_count;
        struct gp_rb_tree by_addr;
        struct gp_rb_tree by_id;
};

#define CMP(a, b) ((a) < (b) ? -1 : (a) > (b))

static int cmp_addr(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        return CMP((uintptr_t) gp_rb_entry(x, struct mapping, by_addr)->base,
                   (uintptr_t) gp_rb_entry(y, struct mapping, by_addr)->base);
}

static int cmp_id(const struct gp_rb_node *x, const struct gp_rb_node *y) {
        return CMP(gp_rb_entry(x, struct mapping, by_id)->segment_id, gp_rb_entry(y, struct mapping, by_id)->segment_id);
}

static void set_error(gpupool_client *c, const char *message) {
        snprintf(c->conn.error, sizeof(c->conn.error), "%s", message);
}

GPUPOOL_EXPORT int gpupool_connect(const char *socket_path, const char *client_name, gpupool_client **ret_client) {
        char name[GP_MAX_NAME_BYTES + 1];
        Gpupool__Envelope *hello;
        gpupool_client *c;
        int r;

        if (!ret_client)
                return -EINVAL;
        if (client_name && !gp_wire_name_is_valid(client_name))
                return -EINVAL;
        snprintf(name, sizeof(name), "%s", client_name ? client_name : program_invocation_short_name);
        if (!gp_wire_name_is_valid(name))
                strcpy(name, "client");

        c = calloc(1, sizeof(*c));
        if (!c)
                return -ENOMEM;
        r = gp_conn_open(&c->conn, socket_path, name, &hello);
        if (r < 0) {
                free(c);
                return r;
        }
        pthread_mutex_init(&c->lock, NULL);
        gp_rb_init(&c->by_addr, cmp_addr);
        gp_rb_init(&c->by_id, cmp_id);
        c->device_count = (unsigned) hello->hello_reply->n_devices;
        gpupool__envelope__free_unpacked(hello, NULL);
        *ret_client = c;
        return 0;
}

static void mapping_drop(gpupool_client *c, struct mapping *m) {
        gp_rb_remove(&c->by_addr, &m->by_addr);
        gp_rb_remove(&c->by_id, &m->by_id);
        munmap(m->base, m->size);
        free(m);
}

GPUPOOL_EXPORT void gpupool_disconnect(gpupool_client *c) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__ByeRequest bye = GPUPOOL__BYE_REQUEST__INIT;
        struct gp_rb_node *n;

        if (!c)
                return;
        pthread_mutex_lock(&c->lock);
        while ((n = gp_rb_first(&c->by_addr)))
                mapping_drop(c, gp_rb_entry(n, struct mapping, by_addr));
        /* Every mapping is gone: the daemon may hand our memory to others right away. */
        req.body_case = GPUPOOL__ENVELOPE__BODY_BYE;
        req.bye = &bye;
        if (!c->conn.broken && gp_conn_call(&c->conn, &req, GPUPOOL__ENVELOPE__BODY__NOT_SET, &rep, NULL) == 0)
                gpupool__envelope__free_unpacked(rep, NULL);
        gp_conn_close(&c->conn);
        pthread_mutex_unlock(&c->lock);
        pthread_mutex_destroy(&c->lock);
        free(c);
}

/* Maps a segment handed over with fd. Returns 0 or a negative errno; fd is closed. */
static int mapping_add(gpupool_client *c, uint64_t segment_id, uint64_t size, int fd, struct mapping **ret) {
        struct mapping *m;
        void *base;

        if (fd < 0)
                return -EPROTO;
        m = calloc(1, sizeof(*m));
        if (!m) {
                close(fd);
                return -ENOMEM;
        }
        base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (base == MAP_FAILED) {
                free(m);
                return -ENOMEM;
        }
        /* A forked child must not keep this memory: it may be another client's tomorrow. */
        (void) madvise(base, size, MADV_DONTFORK);
        m->segment_id = segment_id;
        m->size = size;
        m->base = base;
        gp_rb_insert(&c->by_addr, &m->by_addr);
        gp_rb_insert(&c->by_id, &m->by_id);
        *ret = m;
        return 0;
}

static struct mapping *mapping_by_id(gpupool_client *c, uint64_t segment_id) {
        struct mapping key = { .segment_id = segment_id };
        struct gp_rb_node *n = gp_rb_find(&c->by_id, &key.by_id);

        return n ? gp_rb_entry(n, struct mapping, by_id) : NULL;
}

static struct mapping *mapping_by_addr(gpupool_client *c, const void *ptr) {
        struct mapping key = { .base = (uint8_t *) ptr };
        struct gp_rb_node *n = gp_rb_floor(&c->by_addr, &key.by_addr);
        struct mapping *m = n ? gp_rb_entry(n, struct mapping, by_addr) : NULL;

        if (!m || (const uint8_t *) ptr >= m->base + m->size)
                return NULL;
        return m;
}

/* Frees (segment, offset) at the daemon; unmaps and releases the segment when told to. */
static int free_block(gpupool_client *c, struct mapping *m, uint64_t segment_id, uint64_t offset) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__FreeRequest fr = GPUPOOL__FREE_REQUEST__INIT;
        Gpupool__ReleaseRequest rr = GPUPOOL__RELEASE_REQUEST__INIT;
        bool release;
        int r;

        fr.segment_id = segment_id;
        fr.offset = offset;
        req.body_case = GPUPOOL__ENVELOPE__BODY_FREE;
        req.free = &fr;
        r = gp_conn_call(&c->conn, &req, GPUPOOL__ENVELOPE__BODY_FREE_REPLY, &rep, NULL);
        if (r < 0)
                return r;
        release = rep->free_reply->has_release_segment && rep->free_reply->release_segment;
        gpupool__envelope__free_unpacked(rep, NULL);
        if (!release)
                return 0;

        if (m)
                mapping_drop(c, m);
        gpupool__envelope__init(&req);
        rr.segment_id = segment_id;
        req.body_case = GPUPOOL__ENVELOPE__BODY_RELEASE;
        req.release = &rr;
        /* The block is freed either way; a failed release only keeps the segment ours. */
        if (gp_conn_call(&c->conn, &req, GPUPOOL__ENVELOPE__BODY__NOT_SET, &rep, NULL) == 0)
                gpupool__envelope__free_unpacked(rep, NULL);
        return 0;
}

GPUPOOL_EXPORT int gpupool_alloc(gpupool_client *c, int device, size_t size, void **ret_ptr) {
        Gpupool__Envelope req = GPUPOOL__ENVELOPE__INIT, *rep;
        Gpupool__AllocRequest ar = GPUPOOL__ALLOC_REQUEST__INIT;
        const Gpupool__AllocReply *a;
        struct mapping *m;
        int r, fd = -1;
        bool is_new;

        if (!c || !ret_ptr || device < 0 || size == 0)
                return -EINVAL;
        pthread_mutex_lock(&c->lock);
        ar.device = (uint32_t) device;
        ar.size = size;
        req.body_case = GPUPOOL__ENVELOPE__BODY_ALLOC;
        req.alloc = &ar;
        r = gp_conn_call(&c->conn, &req, GPUPOOL__ENVELOPE__BODY_ALLOC_REPLY, &rep, &fd);
        if (r < 0)
                goto out;
        a = rep->alloc_reply;
        if (a->offset > a->segment_size || a->size > a->segment_size - a->offset || a->size < size) {
                r = -EPROTO;
                set_error(c, "gpupoold handed out a block outside its segment");
                if (fd >= 0)
                        close(fd);
                goto out_reply;
        }
        is_new = a->has_new_segment && a->new_segment;
        m = mapping_by_id(c, a->segment_id);
        if (is_new && !m) {
                r = mapping_add(c, a->segment_id, a->segment_size, fd, &m);     /* takes fd */
                fd = -1;
        } else {
                /*
                 * A "new" segment we already map, or an old one we never got: the daemon and we
                 * disagree. Never replace a mapping: live blocks of ours may be in it.
                 */
                r = !is_new && m ? 0 : -EPROTO;
        }
        if (fd >= 0)
                close(fd);
        if (r < 0) {
                /* We hold a block we cannot reach: give it back before failing. */
                set_error(c, r == -ENOMEM ? "cannot map the segment into this process" :
                                            "gpupoold's reply does not match the segments this process maps");
                (void) free_block(c, NULL, a->segment_id, a->offset);
                goto out_reply;
        }
        *ret_ptr = m->base + a->offset;
out_reply:
        gpupool__envelope__free_unpacked(rep, NULL);
out:
        pthread_mutex_unlock(&c->lock);
        return r;
}

GPUPOOL_EXPORT int gpupool_free(gpupool_client *c, void *ptr) {
        struct mapping *m;
        int r;

        if (!c)
                return -EINVAL;
        if (!ptr)
                return -ENOENT;
        pthread_mutex_lock(&c->lock);
        m = mapping_by_addr(c, ptr);
        if (!m) {
                set_error(c, "the pointer is in no segment this client holds");
                r = -ENOENT;
        } else {
                r = free_block(c, m, m->segment_id, (uint64_t) ((uint8_t *) ptr - m->base));
        }
        pthread_mutex_unlock(&c->lock);
        return r;
}

GPUPOOL_EXPORT size_t gpupool_last_error(gpupool_client *c, char *buf, size_t size) {
        size_t len;

        if (!c)
                return 0;
        pthread_mutex_lock(&c->lock);
        len = strlen(c->conn.error);
        if (size)
                snprintf(buf, size, "%s", c->conn.error);
        pthread_mutex_unlock(&c->lock);
        return len;
}

GPUPOOL_EXPORT const char *gpupool_strerror(int err) {
        switch (err) {
        case 0:
                return "success";
        case -EINVAL:
                return "invalid argument";
        case -ENODEV:
                return "no such device";
        case -EDQUOT:
                return "over a gpupool limit";
        case -ENOMEM:
                return "device memory exhausted";
        case -ENOENT:
                return "not found (no such block of this client, or no gpupoold socket)";
        case -EPROTO:
                return "gpupool protocol error";
        case -EPROTONOSUPPORT:
                return "gpupool protocol version not supported";
        case -ECONNRESET:
                return "gpupoold is gone";
        case -ECONNREFUSED:
                return "gpupoold is not running";
        case -EACCES:
                return "permission denied on the gpupool socket";
        case -EIO:
                return "gpupoold failed";
        default:
                return "unknown error";
        }
}
