/*
 * request.c: the handlers behind each request of the protocol (docs/protocol.md).
 *
 * A handler checks everything the client sent before it acts, answers with a status and, on
 * failure, a sentence a person can act on: what was asked, what limit or state refused it.
 * Messages out of order, or of a kind only the daemon sends, get an error reply and the
 * client's disconnection.
 */
#include "request.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "server.h"
#include "session.h"
#include "size.h"

static void pack_reply(struct session *s, Gpupool__Envelope *env, int fd, bool disconnect, struct reply *ret) {
        int n = gp_wire_pack(env, s->server->send_buf, sizeof(s->server->send_buf));

        if (n < 0) {
                /* Only a status of very many clients could get here; say so rather than truncate. */
                request_error_reply(s, env->id, -EIO, false, "the reply is larger than the protocol allows", ret);
                return;
        }
        *ret = (struct reply) { .len = (size_t) n, .fd = fd, .disconnect = disconnect };
}

void request_error_reply(struct session *s, uint64_t id, int err, bool disconnect, const char *message,
                         struct reply *ret) {
        Gpupool__Envelope env = GPUPOOL__ENVELOPE__INIT;
        int n;

        env.version = GP_PROTOCOL_VERSION;
        env.id = id;
        env.has_status = 1;
        env.status = gp_errno_to_status(err);
        env.error = (char *) message;
        n = gp_wire_pack(&env, s->server->send_buf, sizeof(s->server->send_buf));
        /* An error reply is a few hundred bytes at most: it always fits. */
        *ret = (struct reply) { .len = n > 0 ? (size_t) n : 0, .fd = -1, .disconnect = disconnect };
}

static void ok_envelope(Gpupool__Envelope *env, uint64_t id) {
        gpupool__envelope__init(env);
        env->version = GP_PROTOCOL_VERSION;
        env->id = id;
        env->has_status = 1;
        env->status = GPUPOOL__STATUS__STATUS_OK;
}

static void handle_hello(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        struct server *server = s->server;
        Gpupool__DeviceInfo infos[BACKEND_MAX_DEVICES], *info_ptrs[BACKEND_MAX_DEVICES];
        Gpupool__HelloReply hr = GPUPOOL__HELLO_REPLY__INIT;
        Gpupool__Envelope env;
        const char *name = req->hello->name;

        if (s->state != SESSION_NEW) {
                request_error_reply(s, req->id, -EPROTO, true, "hello sent twice", ret);
                return;
        }
        if (name && !gp_wire_name_is_valid(name)) {
                request_error_reply(s, req->id, -EINVAL, true,
                                    "the client name must be 1 to 63 bytes with no control characters", ret);
                return;
        }
        if (name)
                strcpy(s->name, name);
        s->state = SESSION_READY;

        for (unsigned d = 0; d < server->device_count; d++) {
                struct pool_stats st;

                pool_get_stats(server->pools[d], &st);
                gpupool__device_info__init(&infos[d]);
                infos[d].index = d;
                infos[d].backend = (char *) server->backend->name;
                infos[d].total_bytes = st.total_bytes;
                if (server->devices[d].has_uuid) {
                        /* Clients find their own ordinal for this GPU by its UUID. */
                        infos[d].has_uuid = 1;
                        infos[d].uuid.len = sizeof(server->devices[d].uuid);
                        infos[d].uuid.data = server->devices[d].uuid;
                }
                info_ptrs[d] = &infos[d];
        }
        hr.client_id = s->id;
        hr.daemon_version = (char *) GPUPOOL_VERSION;
        hr.n_devices = server->device_count;
        hr.devices = info_ptrs;
        hr.has_limit_bytes = 1;
        hr.limit_bytes = server->policy.client_limit_bytes;
        ok_envelope(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_HELLO_REPLY;
        env.hello_reply = &hr;
        log_info("client %llu hello: '%s', pid %d, uid %u", (unsigned long long) s->id, s->name, (int) s->pid,
                 (unsigned) s->uid);
        pack_reply(s, &env, -1, false, ret);
}

static void handle_alloc(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        struct server *server = s->server;
        const Gpupool__AllocRequest *a = req->alloc;
        Gpupool__AllocReply ar = GPUPOOL__ALLOC_REPLY__INIT;
        char why[512], b1[GP_SIZE_FORMAT_MAX], b2[GP_SIZE_FORMAT_MAX], b3[GP_SIZE_FORMAT_MAX];
        struct pool_owner *owner;
        struct pool_lease lease;
        Gpupool__Envelope env;
        uint64_t headroom;
        int r, fd = -1;

        if (a->device >= server->device_count) {
                snprintf(why, sizeof(why), "no device %u: this daemon has %u", a->device, server->device_count);
                request_error_reply(s, req->id, -ENODEV, false, why, ret);
                return;
        }
        if (a->size == 0 || a->size > POOL_MAX_REQUEST) {
                snprintf(why, sizeof(why), "cannot allocate %" PRIu64 " bytes: a request is 1 byte to 64 TiB", a->size);
                request_error_reply(s, req->id, -EINVAL, false, why, ret);
                return;
        }
        owner = &s->owners[a->device];
        r = policy_admit(&server->policy, owner, a->size, why, sizeof(why));
        if (r < 0) {
                request_error_reply(s, req->id, r, false, why, ret);
                return;
        }
        headroom = policy_headroom(&server->policy, owner);
        r = pool_alloc(server->pools[a->device], owner, a->size, headroom, &lease);
        if (r == -EDQUOT) {
                snprintf(why, sizeof(why),
                         "allocating %" PRIu64 " bytes on device %u needs a %s segment, which would take client '%s' "
                         "(pid %d) to %s reserved, over its limit of %s (--client-limit)",
                         a->size, a->device, gp_size_format(pool_min_segment_bytes(a->size), b1, sizeof(b1)), s->name,
                         (int) s->pid,
                         gp_size_format(owner->reserved_bytes + pool_min_segment_bytes(a->size), b2, sizeof(b2)),
                         gp_size_format(server->policy.client_limit_bytes, b3, sizeof(b3)));
                request_error_reply(s, req->id, r, false, why, ret);
                return;
        }
        if (r == -ENOMEM) {
                struct pool_stats st;

                pool_get_stats(server->pools[a->device], &st);
                snprintf(why, sizeof(why),
                         "device %u is full: %" PRIu64 " bytes asked, %s of %s reserved and %s in use after "
                         "releasing the cache",
                         a->device, a->size, gp_size_format(st.reserved_bytes, b1, sizeof(b1)),
                         gp_size_format(st.total_bytes, b2, sizeof(b2)), gp_size_format(st.in_use_bytes, b3, sizeof(b3)));
                request_error_reply(s, req->id, r, false, why, ret);
                return;
        }
        if (r < 0) {
                snprintf(why, sizeof(why), "the %s backend failed: %s", server->backend->name, strerror(-r));
                log_err("client %llu: allocating %" PRIu64 " bytes: %s", (unsigned long long) s->id, a->size, why);
                request_error_reply(s, req->id, -EIO, false, why, ret);
                return;
        }
        ar.segment_id = lease.segment_id;
        ar.segment_size = lease.segment_size;
        ar.offset = lease.offset;
        ar.size = lease.size;
        if (lease.new_segment) {
                ar.has_new_segment = 1;
                ar.new_segment = 1;
                if (lease.mem->ipc_handle_len) {
                        ar.has_ipc_handle = 1;
                        ar.ipc_handle.len = lease.mem->ipc_handle_len;
                        ar.ipc_handle.data = (uint8_t *) lease.mem->ipc_handle;
                } else {
                        fd = lease.mem->fd;
                }
        }
        ok_envelope(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_ALLOC_REPLY;
        env.alloc_reply = &ar;
        pack_reply(s, &env, fd, false, ret);
}

/* The device a segment id belongs to (its top byte), or -1. */
static int segment_device(const struct server *server, uint64_t segment_id) {
        uint64_t d = segment_id >> 56;

        return d < server->device_count ? (int) d : -1;
}

static void handle_free(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        struct server *server = s->server;
        const Gpupool__FreeRequest *f = req->free;
        Gpupool__FreeReply fr = GPUPOOL__FREE_REPLY__INIT;
        int d = segment_device(server, f->segment_id), r = -ENOENT;
        Gpupool__Envelope env;
        bool release = false;
        char why[256];

        if (d >= 0)
                r = pool_free_block(server->pools[d], &s->owners[d], f->segment_id, f->offset, &release);
        if (r < 0) {
                snprintf(why, sizeof(why),
                         "this client has no live block at offset %" PRIu64 " of segment %" PRIu64
                         " (freed already, or never allocated)", f->offset, f->segment_id);
                request_error_reply(s, req->id, r, false, why, ret);
                return;
        }
        if (release) {
                fr.has_release_segment = 1;
                fr.release_segment = 1;
        }
        ok_envelope(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_FREE_REPLY;
        env.free_reply = &fr;
        pack_reply(s, &env, -1, false, ret);
}

static void handle_release(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        struct server *server = s->server;
        uint64_t id = req->release->segment_id;
        int d = segment_device(server, id), r = -ENOENT;
        Gpupool__Envelope env;
        char why[256];

        if (d >= 0)
                r = pool_release(server->pools[d], &s->owners[d], id);
        if (r == -EBUSY) {
                snprintf(why, sizeof(why), "segment %" PRIu64 " still holds live blocks of this client", id);
                request_error_reply(s, req->id, -EINVAL, false, why, ret);
                return;
        }
        if (r < 0) {
                snprintf(why, sizeof(why), "this client holds no segment %" PRIu64, id);
                request_error_reply(s, req->id, r, false, why, ret);
                return;
        }
        ok_envelope(&env, req->id);
        pack_reply(s, &env, -1, false, ret);
}

static void handle_status(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        struct server *server = s->server;
        Gpupool__DeviceStatus devs[BACKEND_MAX_DEVICES], *dev_ptrs[BACKEND_MAX_DEVICES];
        Gpupool__StatusReply sr = GPUPOOL__STATUS_REPLY__INIT;
        Gpupool__ClientStatus *clients = NULL, **client_ptrs = NULL;
        Gpupool__Envelope env;
        size_t n = 0, count = 0;

        for (struct session *c = server->sessions; c; c = c->next)
                count++;
        if (count) {
                clients = calloc(count, sizeof(*clients));
                client_ptrs = calloc(count, sizeof(*client_ptrs));
                if (!clients || !client_ptrs) {
                        free(clients);
                        free(client_ptrs);
                        request_error_reply(s, req->id, -EIO, false, "out of memory building the status", ret);
                        return;
                }
        }
        for (unsigned d = 0; d < server->device_count; d++) {
                struct pool_stats st;

                pool_get_stats(server->pools[d], &st);
                gpupool__device_status__init(&devs[d]);
                devs[d].index = d;
                devs[d].backend = (char *) server->backend->name;
                devs[d].total_bytes = st.total_bytes;
                devs[d].reserved_bytes = st.reserved_bytes;
                devs[d].in_use_bytes = st.in_use_bytes;
                devs[d].cached_bytes = st.cached_bytes;
                devs[d].segments = st.segments;
                dev_ptrs[d] = &devs[d];
        }
        /* Every client but the one asking (the CLI has nothing to show). */
        for (struct session *c = server->sessions; c; c = c->next) {
                Gpupool__ClientStatus *cs = &clients[n];

                if (c == s)
                        continue;
                gpupool__client_status__init(cs);
                cs->client_id = c->id;
                cs->pid = c->pid;
                cs->uid = c->uid;
                cs->name = c->name;
                session_totals(c, &cs->reserved_bytes, &cs->in_use_bytes, &cs->blocks);
                cs->limit_bytes = server->policy.client_limit_bytes;
                if (c->state == SESSION_EXITING) {
                        cs->has_exiting = 1;
                        cs->exiting = 1;
                }
                client_ptrs[n++] = cs;
        }
        sr.n_devices = server->device_count;
        sr.devices = dev_ptrs;
        sr.n_clients = n;
        sr.clients = client_ptrs;
        ok_envelope(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_STATUS_REPLY;
        env.status_reply = &sr;
        pack_reply(s, &env, -1, false, ret);
        free(clients);
        free(client_ptrs);
}

static void handle_flush(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        struct server *server = s->server;
        Gpupool__FlushedDevice devs[BACKEND_MAX_DEVICES], *dev_ptrs[BACKEND_MAX_DEVICES];
        Gpupool__FlushReply fr = GPUPOOL__FLUSH_REPLY__INIT;
        Gpupool__Envelope env;

        for (unsigned d = 0; d < server->device_count; d++) {
                gpupool__flushed_device__init(&devs[d]);
                devs[d].index = d;
                pool_flush(server->pools[d], &devs[d].segments, &devs[d].bytes);
                dev_ptrs[d] = &devs[d];
                if (devs[d].segments)
                        log_info("flush by client %llu (pid %d): device %u released %" PRIu64 " segments, %" PRIu64 " bytes",
                                 (unsigned long long) s->id, (int) s->pid, d, devs[d].segments, devs[d].bytes);
        }
        fr.n_devices = server->device_count;
        fr.devices = dev_ptrs;
        ok_envelope(&env, req->id);
        env.body_case = GPUPOOL__ENVELOPE__BODY_FLUSH_REPLY;
        env.flush_reply = &fr;
        pack_reply(s, &env, -1, false, ret);
}

static void handle_bye(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        Gpupool__Envelope env;

        /* The client unmapped everything: its memory can serve others now. */
        s->said_bye = true;
        session_release_all(s);
        ok_envelope(&env, req->id);
        pack_reply(s, &env, -1, false, ret);
}

void request_handle(struct session *s, const Gpupool__Envelope *req, struct reply *ret) {
        if (s->said_bye) {
                request_error_reply(s, req->id, -EPROTO, true, "request after goodbye", ret);
                return;
        }
        if (s->state == SESSION_NEW && req->body_case != GPUPOOL__ENVELOPE__BODY_HELLO) {
                request_error_reply(s, req->id, -EPROTO, true, "the first message must be hello", ret);
                return;
        }
        switch (req->body_case) {
        case GPUPOOL__ENVELOPE__BODY_HELLO:
                handle_hello(s, req, ret);
                return;
        case GPUPOOL__ENVELOPE__BODY_ALLOC:
                handle_alloc(s, req, ret);
                return;
        case GPUPOOL__ENVELOPE__BODY_FREE:
                handle_free(s, req, ret);
                return;
        case GPUPOOL__ENVELOPE__BODY_RELEASE:
                handle_release(s, req, ret);
                return;
        case GPUPOOL__ENVELOPE__BODY_STATUS_REQUEST:
                handle_status(s, req, ret);
                return;
        case GPUPOOL__ENVELOPE__BODY_FLUSH:
                handle_flush(s, req, ret);
                return;
        case GPUPOOL__ENVELOPE__BODY_BYE:
                handle_bye(s, req, ret);
                return;
        case GPUPOOL__ENVELOPE__BODY__NOT_SET:
                request_error_reply(s, req->id, -EPROTO, true, "the request has no body", ret);
                return;
        default:
                request_error_reply(s, req->id, -EPROTO, true, "that message is a reply, which only the daemon sends", ret);
                return;
        }
}
