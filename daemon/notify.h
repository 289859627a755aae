/*
 * notify.h: systemd's notification and socket-activation protocols (sd_notify(3),
 * sd_listen_fds(3)), without libsystemd.
 */
#ifndef GP_NOTIFY_H
#define GP_NOTIFY_H

#include <stddef.h>
#include <stdint.h>

/* What systemd passes at start, at most. */
#define NOTIFY_MAX_PASSED 1024
/* A stored descriptor's name (FDNAME=): gpupoold's start with the prefix; at most this long. */
#define NOTIFY_STORED_PREFIX "gpupool-"
#define NOTIFY_NAME_MAX 63

/*
 * Sends state ("READY=1", "STATUS=...", newline-separated assignments) to $NOTIFY_SOCKET, never
 * waiting: a manager whose queue is full loses it (-EAGAIN). Returns 1 when sent, 0 when there
 * is no $NOTIFY_SOCKET, or a negative errno.
 */
int notify_send(const char *state);

/*
 * systemd's descriptor store (FileDescriptorStoreMax= in the unit): keeps fd under name (which
 * starts with NOTIFY_STORED_PREFIX) and passes it to the next gpupoold it starts; and forgets
 * name's. As notify_send(), but what must not be lost waits up to NOTIFY_STORE_WAIT_MS for
 * room; systemd does not answer, and drops what the unit has no room for.
 */
#define NOTIFY_STORE_WAIT_MS 1000
int notify_store(const char *name, int fd);
int notify_store_remove(const char *name);

/* The watchdog interval systemd asks for ($WATCHDOG_USEC, for this pid), or 0 for none. */
uint64_t notify_watchdog_usec(void);

/* What systemd passed at start: the listening socket, and what gpupoold stored before. */
struct notify_passed {
        int listen_fd;                                  /* -1: none passed */
        unsigned n;
        int fds[NOTIFY_MAX_PASSED];                     /* -1 once taken */
        char names[NOTIFY_MAX_PASSED][NOTIFY_NAME_MAX + 1];
};

/*
 * Takes what systemd passed ($LISTEN_FDS, $LISTEN_FDNAMES, for $LISTEN_PID; unset afterwards),
 * close-on-exec: descriptors named with NOTIFY_STORED_PREFIX are the store's, the rest must be
 * one listening AF_UNIX SOCK_SEQPACKET socket. Returns 1 with a socket, 0 without, or a
 * negative errno with the reason in err (more than one socket, or not such a socket), nothing kept.
 */
int notify_listen_fds(struct notify_passed *ret, char *err, size_t err_size);

/* Closes what is left of p (the socket too, if still there). */
void notify_passed_close(struct notify_passed *p);

#endif
