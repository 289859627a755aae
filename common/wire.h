/*
 * wire.h: packets of the gpupool protocol on an AF_UNIX SOCK_SEQPACKET socket.
 *
 * One packet is one packed Envelope, optionally carrying file descriptors. The daemon,
 * the client library and the CLI all frame through here, so the limits below are enforced
 * the same way on both ends. See docs/protocol.md.
 */
#ifndef GP_WIRE_H
#define GP_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpupool.pb-c.h"

#define GP_PROTOCOL_VERSION 2

/* The release, set by the Makefile from its VERSION. */
#ifndef GPUPOOL_VERSION
#define GPUPOOL_VERSION "0.1.0"
#endif

/* A request larger than this is a protocol violation: the daemon disconnects its sender. */
#define GP_MAX_REQUEST_BYTES 4096
/* The largest reply (a status of every client). Below the default SO_SNDBUF of AF_UNIX. */
#define GP_MAX_REPLY_BYTES (192 * 1024)
/* The longest reservation token (Hello.reservation, $GPUPOOL_RESERVATION). */
#define GP_RESERVATION_TOKEN_MAX 128
/* Every block's size is rounded up to this (AllocRequest); the client's cache is keyed on it. */
#define GP_BLOCK_ALIGN 512ULL
/* The longest sentence an error reply carries, with its NUL; the library keeps all of it. */
#define GP_MAX_ERROR_BYTES 900
/* A client's declared name, bytes, not counting the NUL. */
#define GP_MAX_NAME_BYTES 63
/* A named object's name: 1 to this many bytes of UTF-8, no control characters. */
#define GP_MAX_OBJECT_NAME_BYTES 255
/* A tenant's name, bytes: letters, digits, '-', '_', '.'. */
#define GP_MAX_TENANT_NAME_BYTES 63
/* Who else may attach an object: at most this many readers, each "*" or a tenant's name. */
#define GP_MAX_OBJECT_READERS 16
#define GP_MAX_READER_BYTES GP_MAX_TENANT_NAME_BYTES

#define GP_DEFAULT_SOCKET "/run/gpupool/gpupool.sock"

/* Packs env into buf. Returns the length, or -EMSGSIZE when it does not fit in size bytes. */
int gp_wire_pack(const Gpupool__Envelope *env, uint8_t *buf, size_t size);

/* A segment's legacy CUDA IPC handle (cuIpcGetMemHandle), as the wire carries it: the cuda backend's. */
#define GP_IPC_HANDLE_BYTES 64

/* The granule of segments that grow in place: a granule lease's segments are this size. */
#define GP_GRANULE_BYTES (2ULL << 20)
/* The most granules one lease brings (a descriptor each, in one packet). */
#define GP_MAX_LEASE_GRANULES 128

/*
 * Sends one packet, with pass_fd attached when it is >= 0. Returns 0, -EAGAIN on a full
 * non-blocking socket, or another negative errno. Never raises SIGPIPE.
 */
int gp_wire_send_packet(int sock, const uint8_t *buf, size_t len, int pass_fd);

/* The same with nfds descriptors (at most GP_WIRE_MAX_FDS) attached, in their order. */
int gp_wire_send_packet_fds(int sock, const uint8_t *buf, size_t len, const int *fds, size_t nfds);

/* The most descriptors one packet can carry (the kernel's SCM_MAX_FD). */
#define GP_WIRE_MAX_FDS 253
_Static_assert(GP_MAX_LEASE_GRANULES <= GP_WIRE_MAX_FDS, "a granule lease's descriptors fit one packet");

/*
 * Receives one packet into buf, with every descriptor that came with it into fds (room for
 * GP_WIRE_MAX_FDS; *ret_nfds says how many), whatever the result: none is closed here, so that
 * the caller decides where (a peer's descriptor may block close(2): daemon/closer.h). The
 * control buffer has room for all, so the kernel never drops one itself (it would close it in
 * this thread). Returns as gp_wire_recv_packet(), with -EBADMSG for an empty packet.
 */
int gp_wire_recv_packet_fds(int sock, uint8_t *buf, size_t size, int *fds, size_t *ret_nfds);

/*
 * Receives one packet into buf. Returns its length (> 0), 0 when the peer has closed, or a
 * negative errno: -EMSGSIZE for a packet larger than size (consumed and dropped), -EBADMSG
 * for an empty packet or one carrying descriptors that ret_fd is NULL to refuse (they are
 * closed). With ret_fd non-NULL, *ret_fd is the descriptor that came with the packet or -1.
 */
int gp_wire_recv_packet(int sock, uint8_t *buf, size_t size, int *ret_fd);

/*
 * Unpacks a packet and checks the envelope's version (an error reply has no body, so whether
 * a body must be set is the caller's to check). Returns 0 and the
 * envelope (free with gpupool__envelope__free_unpacked(env, NULL)), -EBADMSG for bytes that do
 * not parse, or -EPROTONOSUPPORT for another version.
 */
int gp_wire_unpack(const uint8_t *buf, size_t len, Gpupool__Envelope **ret_env);

/* Connects a blocking, close-on-exec SEQPACKET socket to path. Returns 0 or a negative errno. */
int gp_wire_connect(const char *path, int *ret_sock);

/*
 * gp_wire_connect() whose connect, sends and receives each give up after timeout_ms (0: never):
 * -ETIMEDOUT from connect, -EAGAIN from gp_wire_send_packet() and gp_wire_recv_packet().
 */
int gp_wire_connect_timeout(const char *path, uint64_t timeout_ms, int *ret_sock);

/* The socket path a client uses: path if given, else $GPUPOOL_SOCKET, else the default. */
const char *gp_wire_socket_path(const char *path);

/*
 * Whether text is well-formed UTF-8 without control characters: what the daemon shows of a
 * peer must print in a table and in JSON alike, so that nobody can hide from either.
 */
bool gp_wire_text_is_valid(const char *text);

/* Whether name is a valid client name: 1 to 63 bytes of valid text (gp_wire_text_is_valid()). */
bool gp_wire_name_is_valid(const char *name);
/*
 * Whether name is a valid object name: 1 to GP_MAX_OBJECT_NAME_BYTES bytes of UTF-8, no
 * control characters, and none that shows nothing or reorders text (zero-width, bidirectional
 * controls: a look-alike of another name).
 */
bool gp_wire_object_name_is_valid(const char *name);
/* Whether name is a tenant's name as the config spells one: 1 to 63 letters, digits, '-', '_', '.'. */
bool gp_wire_tenant_name_is_valid(const char *name);
/* Whether reader is "*" or a tenant's name. */
bool gp_wire_reader_is_valid(const char *reader);

/* The negative errno a Status stands for (STATUS_OK is 0). */
int gp_status_to_errno(Gpupool__Status status);

/* The Status for a negative errno from the daemon's layers. */
Gpupool__Status gp_errno_to_status(int err);

/*
 * Unpacking without malloc(): a request's decoded structures go into a fixed buffer (bump
 * allocation; larger ones fall back to malloc()), reset before each request. The daemon
 * decodes every request this way.
 */
struct gp_wire_arena {
        ProtobufCAllocator allocator;
        size_t used;
        bool spilled;                   /* something went to malloc(): the envelope must be freed field by field */
        uint8_t buf[32768] __attribute__((aligned(16)));
};

void gp_wire_arena_init(struct gp_wire_arena *arena);

/* Frees an envelope unpacked into the arena and empties it: no walk over the message unless it spilled. */
void gp_wire_arena_release(struct gp_wire_arena *arena, Gpupool__Envelope *env);

/* gp_wire_unpack() with an allocator (free the envelope with the same one). */
int gp_wire_unpack_with(const uint8_t *buf, size_t len, ProtobufCAllocator *allocator, Gpupool__Envelope **ret_env);

#endif
