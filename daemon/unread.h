/*
 * unread.h: the descriptors a peer has not read yet.
 *
 * A descriptor sent over SCM_RIGHTS is charged, until the receiver reads it, to the sender's
 * user (the kernel's unix_inflight), and past the sender's RLIMIT_NOFILE every sendmsg() with
 * descriptors fails ETOOMANYREFS: one client that never read its replies would stop the daemon
 * sending memory to anyone. Only CAP_SYS_RESOURCE exempts a sender, and the unit drops it. So
 * the daemon counts, per socket, what it sent and the peer has not read, from the socket's own
 * send queue (SIOCOUTQ: the bytes of the packets it sent that the peer has not taken), and
 * holds a reply back while its client, its client's group or the node is at its bound
 * (session.c, session_unread.c). A socket whose session ends with descriptors unread stays
 * open, counted, until the peer reads them or closes (its queue goes with it): closing ours would
 * not take them back.
 */
#ifndef GP_UNREAD_H
#define GP_UNREAD_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/*
 * The replies with descriptors counted per socket: past them a reply waits, as past the
 * descriptors' bound. The library has at most 16 requests out (CLIENT_PIPELINE).
 */
#define UNREAD_PACKETS 32

/* What one socket's peer has not read of the descriptors sent to it. */
struct unread {
        unsigned fds;                   /* descriptors sent and not known read */
        unsigned head, count;           /* the packets that carried them, oldest at head */
        struct {
                uint32_t fds;
                uint32_t bytes;         /* what the packet added to the send queue, at most its size there */
        } packets[UNREAD_PACKETS];
};

/* The bytes in fd's send queue that its peer has not read (SIOCOUTQ), or a negative errno. */
int unread_queue_bytes(int fd);

/*
 * Drops the packets that fd's peer has read, from the send queue's size now: the queue holds
 * every packet not read, so a packet is read once the queue is smaller than it and all after
 * it; an empty queue means all were. *total (the node's sum) follows. Returns u->fds.
 */
unsigned unread_update(struct unread *u, int fd, uint64_t *total);

/* Whether another packet can be counted (UNREAD_PACKETS). */
static inline bool unread_room(const struct unread *u) {
        return u->count < UNREAD_PACKETS;
}

/*
 * Counts a packet of nfds descriptors just sent on fd, whose send queue held before_bytes
 * before it (unread_queue_bytes()). What a concurrent read took off makes the packet's size
 * seem smaller, never larger, so that no packet is ever taken for read too soon.
 */
void unread_sent(struct unread *u, int fd, int before_bytes, unsigned nfds, uint64_t *total);

/* A socket kept open after its session ended, until its peer has read what it was sent. */
struct unread_socket {
        int fd;
        uid_t user;                     /* the user its client's uid is (users.h) */
        char pod[40];                   /* the pod of its client, "" outside one (identity.h) */
        struct unread unread;
        struct unread_socket *next;
};

#endif
