/*
 * notify.c: the two pieces of the systemd protocol gpupoold speaks, in our own few lines
 * rather than libsystemd: state notifications (sd_notify(3): a datagram to $NOTIFY_SOCKET) and
 * socket activation (sd_listen_fds(3): descriptors from fd 3 on, for $LISTEN_PID).
 */
#define _GNU_SOURCE
#include "notify.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define LISTEN_FDS_START 3

int notify_send(const char *state) {
        const char *path = getenv("NOTIFY_SOCKET");
        struct sockaddr_un addr = { .sun_family = AF_UNIX };
        size_t len;
        socklen_t addr_len;
        ssize_t n;
        int fd;

        if (!path || !*path)
                return 0;       /* not started by systemd, or not Type=notify: nobody listens */
        len = strlen(path);
        if ((path[0] != '/' && path[0] != '@') || len >= sizeof(addr.sun_path))
                return -EINVAL;
        memcpy(addr.sun_path, path, len);
        if (path[0] == '@')
                addr.sun_path[0] = '\0';        /* an abstract socket */
        addr_len = (socklen_t) (offsetof(struct sockaddr_un, sun_path) + len + (path[0] == '/'));
        fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        n = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *) &addr, addr_len);
        close(fd);
        if (n < 0)
                return -errno;
        return 1;
}

uint64_t notify_watchdog_usec(void) {
        const char *usec = getenv("WATCHDOG_USEC"), *pid = getenv("WATCHDOG_PID");
        unsigned long long v;
        char *end;

        if (!usec || !*usec)
                return 0;
        /* WATCHDOG_PID, when set, names the process the watchdog is for. */
        if (pid && *pid && strtoll(pid, NULL, 10) != (long long) getpid())
                return 0;
        errno = 0;
        v = strtoull(usec, &end, 10);
        if (errno || *end || v == 0)
                return 0;
        return v;
}

int notify_listen_fd(int *ret_fd, char *err, size_t err_size) {
        const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
        int type = 0, listening = 0, domain = 0;
        socklen_t len = sizeof(int);
        long n;

        *ret_fd = -1;
        if (!pid || !fds || strtoll(pid, NULL, 10) != (long long) getpid())
                return 0;
        n = strtol(fds, NULL, 10);
        /* The variables are for this process alone: children must not think they have our sockets. */
        unsetenv("LISTEN_PID");
        unsetenv("LISTEN_FDS");
        unsetenv("LISTEN_FDNAMES");
        if (n == 0)
                return 0;
        if (n != 1) {
                snprintf(err, err_size, "systemd passed %ld sockets; gpupoold takes one (ListenSequentialPacket= once)", n);
                return -EINVAL;
        }
        if (getsockopt(LISTEN_FDS_START, SOL_SOCKET, SO_DOMAIN, &domain, &len) < 0 ||
            getsockopt(LISTEN_FDS_START, SOL_SOCKET, SO_TYPE, &type, &len) < 0 ||
            getsockopt(LISTEN_FDS_START, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) < 0) {
                snprintf(err, err_size, "the socket systemd passed (fd %d) is not a socket: %s", LISTEN_FDS_START,
                         strerror(errno));
                return -ENOTSOCK;
        }
        if (domain != AF_UNIX || type != SOCK_SEQPACKET || !listening) {
                snprintf(err, err_size, "the socket systemd passed is not a listening AF_UNIX SOCK_SEQPACKET socket "
                                        "(use ListenSequentialPacket=)");
                return -EINVAL;
        }
        if (fcntl(LISTEN_FDS_START, F_SETFD, FD_CLOEXEC) < 0 ||
            fcntl(LISTEN_FDS_START, F_SETFL, fcntl(LISTEN_FDS_START, F_GETFL) | O_NONBLOCK) < 0) {
                snprintf(err, err_size, "cannot set up the socket systemd passed: %s", strerror(errno));
                return -errno;
        }
        *ret_fd = LISTEN_FDS_START;
        return 1;
}
