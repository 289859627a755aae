/* unread.c: the descriptors a peer has not read yet (see unread.h). */
#include "unread.h"

#include <errno.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>

int unread_queue_bytes(int fd) {
        int n = 0;

        if (ioctl(fd, SIOCOUTQ, &n) < 0)
                return -errno;
        return n < 0 ? 0 : n;
}

static void drop_oldest(struct unread *u, uint64_t *total) {
        unsigned fds = u->packets[u->head].fds;

        u->fds -= fds;
        *total -= fds;
        u->head = (u->head + 1) % UNREAD_PACKETS;
        u->count--;
}

unsigned unread_update(struct unread *u, int fd, uint64_t *total) {
        uint64_t after = 0;             /* the bytes of the packets from the one looked at on */
        int queued;

        if (!u->count)
                return 0;
        queued = unread_queue_bytes(fd);
        if (queued < 0)
                return u->fds;          /* nothing known: nothing dropped */
        if (queued == 0) {
                while (u->count)
                        drop_oldest(u, total);
                return 0;
        }
        for (unsigned i = 0; i < u->count; i++)
                after += u->packets[(u->head + i) % UNREAD_PACKETS].bytes;
        /* Oldest first: read if the queue is smaller than it and everything after it (replies without descriptors count too). */
        while (u->count && (uint64_t) queued < after) {
                after -= u->packets[u->head].bytes;
                drop_oldest(u, total);
        }
        return u->fds;
}

void unread_sent(struct unread *u, int fd, int before_bytes, unsigned nfds, uint64_t *total) {
        int now = unread_queue_bytes(fd);
        unsigned at;

        if (!nfds || u->count == UNREAD_PACKETS)
                return;
        at = (u->head + u->count) % UNREAD_PACKETS;
        u->packets[at].fds = nfds;
        u->packets[at].bytes = now > before_bytes && before_bytes >= 0 ? (uint32_t) (now - before_bytes) : 0;
        u->count++;
        u->fds += nfds;
        *total += nfds;
}
