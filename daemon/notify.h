/*
 * notify.h: systemd's notification and socket-activation protocols (sd_notify(3),
 * sd_listen_fds(3)), without libsystemd.
 */
#ifndef GP_NOTIFY_H
#define GP_NOTIFY_H

#include <stddef.h>
#include <stdint.h>

/*
 * Sends state ("READY=1", "STATUS=...", newline-separated assignments) to $NOTIFY_SOCKET.
 * Returns 1 when sent, 0 when there is no $NOTIFY_SOCKET, or a negative errno.
 */
int notify_send(const char *state);

/* The watchdog interval systemd asks for ($WATCHDOG_USEC, for this pid), or 0 for none. */
uint64_t notify_watchdog_usec(void);

/*
 * The listening socket systemd passed ($LISTEN_FDS, $LISTEN_PID; unset afterwards): 1 with
 * *ret_fd set, 0 when none was passed, or a negative errno with the reason in err (more than
 * one socket, or not a listening AF_UNIX SOCK_SEQPACKET one).
 */
int notify_listen_fd(int *ret_fd, char *err, size_t err_size);

#endif
