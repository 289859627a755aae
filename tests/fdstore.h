/*
 * fdstore.h: systemd's descriptor store, played by the tests and the stress run: a
 * $NOTIFY_SOCKET (set in the environment by fdstore_new(), for every daemon started after)
 * that keeps the descriptors FDSTORE=1 sends, under their FDNAME=, and drops those
 * FDSTOREREMOVE=1 names, read by a thread of its own as they come (a daemon may wait for room
 * in the queue); fdstore_pass() hands what it holds to a daemon as systemd does.
 */
#ifndef GP_TESTS_FDSTORE_H
#define GP_TESTS_FDSTORE_H

#include <pthread.h>
#include <stdbool.h>

#define FDSTORE_MAX 600
struct fdstore {
        pthread_t thread;               /* reads the socket as it fills, as systemd does */
        pthread_mutex_t lock;           /* the rest */
        bool stop;
        int sock;
        char path[108];
        unsigned n;
        int fds[FDSTORE_MAX];
        char names[FDSTORE_MAX][64];
};

struct fdstore *fdstore_new(void);
/* Reads what daemons sent so far; returns how many descriptors the store holds. */
unsigned fdstore_count(struct fdstore *s);
/* Unsets $NOTIFY_SOCKET and closes everything the store holds (systemd's "stop"). */
void fdstore_free(struct fdstore *s);
/*
 * Around the fork of a daemon: everything read so far, and nothing changing until thawed, so
 * that the child sees all of it. In the daemon's child, before exec, fdstore_pass() puts what
 * the store holds from fd 3 on, with $LISTEN_FDS, $LISTEN_FDNAMES and $LISTEN_PID, as systemd
 * passes it (nothing when it holds nothing).
 */
void fdstore_freeze(struct fdstore *s);
void fdstore_thaw(struct fdstore *s);
void fdstore_pass(struct fdstore *s);

#endif
