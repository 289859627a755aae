/*
 * wire.c: sending and receiving protocol packets with an optional file descriptor.
 */
#include "wire.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* A ProtobufCBuffer over a fixed buffer that notes, rather than makes, an overflow. */
struct bounded {
        ProtobufCBuffer base;
        uint8_t *buf;
        size_t size, len;
        bool overflow;
};

static void bounded_append(ProtobufCBuffer *b, size_t len, const uint8_t *data) {
        struct bounded *o = (struct bounded *) b;

        if (o->overflow || len > o->size - o->len) {
                o->overflow = true;
                return;
        }
        memcpy(o->buf + o->len, data, len);
        o->len += len;
}

int gp_wire_pack(const Gpupool__Envelope *env, uint8_t *buf, size_t size) {
        /* One pass: sizing the envelope first would walk it twice (this is every reply's path). */
        struct bounded out = { .base.append = bounded_append, .buf = buf, .size = size };

        (void) gpupool__envelope__pack_to_buffer(env, &out.base);
        if (out.overflow || out.len > INT32_MAX)
                return -EMSGSIZE;
        return (int) out.len;
}

int gp_wire_send_packet(int sock, const uint8_t *buf, size_t len, int pass_fd) {
        union {
                char buf[CMSG_SPACE(sizeof(int))];
                struct cmsghdr align;
        } control;
        struct iovec iov = { .iov_base = (void *) buf, .iov_len = len };
        struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
        ssize_t n;

        if (pass_fd >= 0) {
                struct cmsghdr *cmsg;

                memset(&control, 0, sizeof(control));
                msg.msg_control = control.buf;
                msg.msg_controllen = sizeof(control.buf);
                cmsg = CMSG_FIRSTHDR(&msg);
                cmsg->cmsg_level = SOL_SOCKET;
                cmsg->cmsg_type = SCM_RIGHTS;
                cmsg->cmsg_len = CMSG_LEN(sizeof(int));
                memcpy(CMSG_DATA(cmsg), &pass_fd, sizeof(int));
        }
        do
                n = sendmsg(sock, &msg, MSG_NOSIGNAL);
        while (n < 0 && errno == EINTR);
        if (n < 0)
                return errno == EWOULDBLOCK ? -EAGAIN : -errno;
        return (size_t) n == len ? 0 : -EIO;
}

int gp_wire_recv_packet(int sock, uint8_t *buf, size_t size, int *ret_fd) {
        union {
                /* Room for a few descriptors, so that extra ones are seen and closed. */
                char buf[CMSG_SPACE(4 * sizeof(int))];
                struct cmsghdr align;
        } control;
        struct iovec iov = { .iov_base = buf, .iov_len = size };
        struct msghdr msg = {
                .msg_iov = &iov, .msg_iovlen = 1,
                .msg_control = control.buf, .msg_controllen = sizeof(control.buf),
        };
        int got_fd = -1, extra = 0;
        ssize_t n;

        do
                n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
        while (n < 0 && errno == EINTR);
        if (n < 0)
                return errno == EWOULDBLOCK ? -EAGAIN : -errno;

        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
                size_t nfds;

                if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                        continue;
                nfds = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                for (size_t i = 0; i < nfds; i++) {
                        int fd;

                        memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                        if (got_fd < 0 && ret_fd) {
                                got_fd = fd;
                        } else {
                                close(fd);
                                extra++;
                        }
                }
        }
        if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC) || extra) {
                if (got_fd >= 0)
                        close(got_fd);
                return msg.msg_flags & MSG_TRUNC ? -EMSGSIZE : -EBADMSG;
        }
        if (n == 0 && got_fd < 0)
                return 0;       /* SEQPACKET: a zero-length read is the peer's close. */
        if (n == 0) {
                close(got_fd);
                return -EBADMSG;
        }
        if (ret_fd)
                *ret_fd = got_fd;
        return (int) n;
}

int gp_wire_unpack_with(const uint8_t *buf, size_t len, ProtobufCAllocator *allocator, Gpupool__Envelope **ret_env) {
        Gpupool__Envelope *env = gpupool__envelope__unpack(allocator, len, buf);

        if (!env)
                return -EBADMSG;
        if (env->version != GP_PROTOCOL_VERSION) {
                gpupool__envelope__free_unpacked(env, allocator);
                return -EPROTONOSUPPORT;
        }
        *ret_env = env;
        return 0;
}

int gp_wire_unpack(const uint8_t *buf, size_t len, Gpupool__Envelope **ret_env) {
        return gp_wire_unpack_with(buf, len, NULL, ret_env);
}

/* The arena: bump allocation in a buffer, malloc() beyond it; freeing inside it is a no-op. */
static void *arena_alloc(void *data, size_t size) {
        struct gp_wire_arena *a = data;
        size_t at = (a->used + 15) & ~(size_t) 15;

        if (size <= sizeof(a->buf) && at <= sizeof(a->buf) - size) {
                a->used = at + size;
                return a->buf + at;
        }
        a->spilled = true;
        return malloc(size);
}

static void arena_free(void *data, void *p) {
        struct gp_wire_arena *a = data;

        if ((uint8_t *) p < a->buf || (uint8_t *) p >= a->buf + sizeof(a->buf))
                free(p);
}

void gp_wire_arena_release(struct gp_wire_arena *a, Gpupool__Envelope *env) {
        if (a->spilled)
                gpupool__envelope__free_unpacked(env, &a->allocator);
        a->used = 0;
        a->spilled = false;
}

void gp_wire_arena_init(struct gp_wire_arena *a) {
        a->used = 0;
        a->spilled = false;
        a->allocator = (ProtobufCAllocator) { .alloc = arena_alloc, .free = arena_free, .allocator_data = a };
}

int gp_wire_connect(const char *path, int *ret_sock) {
        struct sockaddr_un addr = { .sun_family = AF_UNIX };
        int sock, r;

        if (!path || strlen(path) >= sizeof(addr.sun_path))
                return -ENAMETOOLONG;
        strcpy(addr.sun_path, path);
        sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (sock < 0)
                return -errno;
        do
                r = connect(sock, (struct sockaddr *) &addr, sizeof(addr));
        while (r < 0 && errno == EINTR);
        if (r < 0) {
                r = -errno;
                close(sock);
                return r;
        }
        *ret_sock = sock;
        return 0;
}

const char *gp_wire_socket_path(const char *path) {
        const char *env;

        if (path && *path)
                return path;
        env = getenv("GPUPOOL_SOCKET");
        return env && *env ? env : GP_DEFAULT_SOCKET;
}

bool gp_wire_name_is_valid(const char *name) {
        size_t len = name ? strlen(name) : 0;

        if (len == 0 || len > GP_MAX_NAME_BYTES)
                return false;
        /* No control characters: names end up in logs and in gpupoolctl's table. */
        for (const unsigned char *p = (const unsigned char *) name; *p; p++)
                if (*p < 0x20 || *p == 0x7f)
                        return false;
        return true;
}

static const struct {
        Gpupool__Status status;
        int err;
} status_errno[] = {
        { GPUPOOL__STATUS__STATUS_OK, 0 },
        { GPUPOOL__STATUS__STATUS_INVALID, -EINVAL },
        { GPUPOOL__STATUS__STATUS_NO_MEMORY, -ENOMEM },
        { GPUPOOL__STATUS__STATUS_QUOTA, -EDQUOT },
        { GPUPOOL__STATUS__STATUS_NOT_FOUND, -ENOENT },
        { GPUPOOL__STATUS__STATUS_PROTOCOL, -EPROTO },
        { GPUPOOL__STATUS__STATUS_VERSION, -EPROTONOSUPPORT },
        { GPUPOOL__STATUS__STATUS_NO_DEVICE, -ENODEV },
        { GPUPOOL__STATUS__STATUS_INTERNAL, -EIO },
        { GPUPOOL__STATUS__STATUS_DENIED, -EACCES },
};

int gp_status_to_errno(Gpupool__Status status) {
        for (size_t i = 0; i < sizeof(status_errno) / sizeof(status_errno[0]); i++)
                if (status_errno[i].status == status)
                        return status_errno[i].err;
        return -EPROTO;
}

Gpupool__Status gp_errno_to_status(int err) {
        for (size_t i = 0; i < sizeof(status_errno) / sizeof(status_errno[0]); i++)
                if (status_errno[i].err == err)
                        return status_errno[i].status;
        return GPUPOOL__STATUS__STATUS_INTERNAL;
}
