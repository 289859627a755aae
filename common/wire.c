/*
 * wire.c: sending and receiving protocol packets with an optional file descriptor.
 */
#include "wire.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
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

int gp_wire_send_packet_fds(int sock, const uint8_t *buf, size_t len, const int *fds, size_t nfds) {
        union {
                char buf[CMSG_SPACE(GP_WIRE_MAX_FDS * sizeof(int))];
                struct cmsghdr align;
        } control;
        struct iovec iov = { .iov_base = (void *) buf, .iov_len = len };
        struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
        ssize_t n;

        if (nfds > GP_WIRE_MAX_FDS)
                return -EINVAL;
        if (nfds) {
                struct cmsghdr *cmsg;

                memset(&control, 0, sizeof(control));
                msg.msg_control = control.buf;
                msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
                cmsg = CMSG_FIRSTHDR(&msg);
                cmsg->cmsg_level = SOL_SOCKET;
                cmsg->cmsg_type = SCM_RIGHTS;
                cmsg->cmsg_len = CMSG_LEN(nfds * sizeof(int));
                memcpy(CMSG_DATA(cmsg), fds, nfds * sizeof(int));
        }
        do
                n = sendmsg(sock, &msg, MSG_NOSIGNAL);
        while (n < 0 && errno == EINTR);
        if (n < 0)
                return errno == EWOULDBLOCK ? -EAGAIN : -errno;
        return (size_t) n == len ? 0 : -EIO;
}

int gp_wire_send_packet(int sock, const uint8_t *buf, size_t len, int pass_fd) {
        return gp_wire_send_packet_fds(sock, buf, len, &pass_fd, pass_fd >= 0);
}

int gp_wire_recv_packet_fds(int sock, uint8_t *buf, size_t size, int *fds, size_t *ret_nfds) {
        union {
                /* Room for every descriptor a packet can carry, and credentials besides. */
                char buf[CMSG_SPACE(GP_WIRE_MAX_FDS * sizeof(int)) + CMSG_SPACE(64)];
                struct cmsghdr align;
        } control;
        struct iovec iov = { .iov_base = buf, .iov_len = size };
        struct msghdr msg = {
                .msg_iov = &iov, .msg_iovlen = 1,
                .msg_control = control.buf, .msg_controllen = sizeof(control.buf),
        };
        size_t nfds = 0;
        ssize_t n;

        *ret_nfds = 0;
        do
                n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
        while (n < 0 && errno == EINTR);
        if (n < 0)
                return errno == EWOULDBLOCK ? -EAGAIN : -errno;

        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
                if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                        continue;
                for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int) && nfds < GP_WIRE_MAX_FDS; i++)
                        memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        }
        *ret_nfds = nfds;
        if (msg.msg_flags & MSG_TRUNC)
                return -EMSGSIZE;
        if (msg.msg_flags & MSG_CTRUNC)
                return -EBADMSG;
        if (n == 0 && nfds == 0)
                return 0;       /* SEQPACKET: a zero-length read is the peer's close. */
        return n == 0 ? -EBADMSG : (int) n;
}

int gp_wire_recv_packet(int sock, uint8_t *buf, size_t size, int *ret_fd) {
        int fds[GP_WIRE_MAX_FDS];
        size_t nfds;
        int n = gp_wire_recv_packet_fds(sock, buf, size, fds, &nfds);

        /* One descriptor where the caller takes one; any other is a malformed packet. */
        if (n > 0 && ret_fd && nfds <= 1) {
                *ret_fd = nfds ? fds[0] : -1;
                return n;
        }
        for (size_t i = 0; i < nfds; i++)
                close(fds[i]);
        if (n > 0 && nfds)
                return -EBADMSG;
        if (n > 0 && ret_fd)
                *ret_fd = -1;
        return n;
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

int gp_wire_connect_timeout(const char *path, uint64_t timeout_ms, int *ret_sock) {
        struct sockaddr_un addr = { .sun_family = AF_UNIX };
        struct timeval tv = { .tv_sec = (time_t) (timeout_ms / 1000), .tv_usec = (suseconds_t) (timeout_ms % 1000) * 1000 };
        int sock, r;

        if (!path || strlen(path) >= sizeof(addr.sun_path))
                return -ENAMETOOLONG;
        strcpy(addr.sun_path, path);
        sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (sock < 0)
                return -errno;
        /* SO_SNDTIMEO bounds connect(2) too, when the daemon's backlog is full. */
        if (timeout_ms && (setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0 ||
                           setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0)) {
                r = -errno;
                close(sock);
                return r;
        }
        do
                r = connect(sock, (struct sockaddr *) &addr, sizeof(addr));
        while (r < 0 && errno == EINTR);
        if (r < 0) {
                r = errno == EAGAIN || errno == EINPROGRESS ? -ETIMEDOUT : -errno;
                close(sock);
                return r;
        }
        *ret_sock = sock;
        return 0;
}

int gp_wire_connect(const char *path, int *ret_sock) {
        return gp_wire_connect_timeout(path, 0, ret_sock);
}

const char *gp_wire_socket_path(const char *path) {
        const char *env;

        if (path && *path)
                return path;
        env = getenv("GPUPOOL_SOCKET");
        return env && *env ? env : GP_DEFAULT_SOCKET;
}

/*
 * The code point of the UTF-8 sequence at p (of at most left bytes) into *ret, returning its
 * length, or 0 when it is not well-formed (RFC 3629: no overlong forms, no surrogates, nothing
 * past U+10FFFF).
 */
static size_t utf8_decode(const unsigned char *p, size_t left, uint32_t *ret) {
        static const uint32_t min[] = { 0, 0, 0x80, 0x800, 0x10000 };
        size_t len = p[0] < 0x80 ? 1 : (p[0] & 0xe0) == 0xc0 ? 2 : (p[0] & 0xf0) == 0xe0 ? 3 : (p[0] & 0xf8) == 0xf0 ? 4 : 0;
        uint32_t cp;

        if (len == 0 || len > left)
                return 0;
        cp = len == 1 ? p[0] : p[0] & (0x7f >> len);
        for (size_t i = 1; i < len; i++) {
                if ((p[i] & 0xc0) != 0x80)
                        return 0;
                cp = cp << 6 | (p[i] & 0x3f);
        }
        if (cp < min[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
                return 0;
        *ret = cp;
        return len;
}

bool gp_wire_text_is_valid(const char *text) {
        const unsigned char *p = (const unsigned char *) text;
        size_t left = strlen(text);

        /* No control characters (C0, DEL, C1): text ends up in logs and in gpupoolctl's table. */
        while (left) {
                uint32_t cp;
                size_t n = utf8_decode(p, left, &cp);

                if (n == 0 || cp < 0x20 || (cp >= 0x7f && cp < 0xa0))
                        return false;
                p += n;
                left -= n;
        }
        return true;
}

bool gp_wire_name_is_valid(const char *name) {
        size_t len = name ? strlen(name) : 0;

        return len > 0 && len <= GP_MAX_NAME_BYTES && gp_wire_text_is_valid(name);
}

/*
 * Whether cp shows nothing, or reorders what follows, where names are listed: soft hyphen,
 * zero-width and joiner characters, bidirectional marks, embeddings, overrides and isolates,
 * word joiner and invisible operators, the byte order mark. A name holding one looks like
 * another (U+202E turns "llama" into what reads as another name; U+200B hides inside one).
 */
static bool invisible(uint32_t cp) {
        return cp == 0xad || (cp >= 0x200b && cp <= 0x200f) || (cp >= 0x202a && cp <= 0x202e) ||
               (cp >= 0x2060 && cp <= 0x2064) || (cp >= 0x2066 && cp <= 0x2069) || cp == 0xfeff || cp == 0x061c ||
               cp == 0x180e;
}

bool gp_wire_object_name_is_valid(const char *name) {
        const unsigned char *p = (const unsigned char *) name;
        size_t len = name ? strlen(name) : 0, left = len;

        if (len == 0 || len > GP_MAX_OBJECT_NAME_BYTES || !gp_wire_text_is_valid(name))
                return false;
        while (left) {
                uint32_t cp;
                size_t n = utf8_decode(p, left, &cp);

                if (invisible(cp))
                        return false;
                p += n;
                left -= n;
        }
        return true;
}

bool gp_wire_tenant_name_is_valid(const char *name) {
        size_t len = name ? strlen(name) : 0;

        if (len == 0 || len > GP_MAX_TENANT_NAME_BYTES)
                return false;
        for (const char *p = name; *p; p++)
                if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' ||
                      *p == '_' || *p == '.'))
                        return false;
        return true;
}

bool gp_wire_reader_is_valid(const char *reader) {
        return (reader && strcmp(reader, "*") == 0) || gp_wire_tenant_name_is_valid(reader);
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
