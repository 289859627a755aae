/*
 * closer.h: closing descriptors that a peer could make close(2) block on, off the loop.
 *
 * close(2) can block: on a TCP socket with SO_LINGER and unsent data for the linger time, on
 * a FUSE or NFS file while it flushes (forever, where a FUSE server has read the FLUSH and never
 * answers: the wait cannot even be killed), on a Unix socket whose queue holds such
 * descriptors in flight (their last reference is dropped in the closing thread). Any client
 * can pass the daemon a descriptor, so every descriptor a peer sent, and every client socket,
 * is closed here, on threads of the closer's own, so that the loop never waits on a peer
 * (architecture invariant 5).
 *
 * One close that never returns must not stop the others: the closer starts another thread
 * when descriptors wait and none is free (up to CLOSER_THREADS), and what one user sent is
 * closed on at most CLOSER_PER_SENDER threads at once, so that its stuck closes hold those and
 * no more; its other descriptors wait behind them, counted (closer_backlog()), and a user with
 * CLOSER_BACKLOG_MAX waiting is sent nothing more to close: its connections are dropped and
 * refused (session.c, server.c). A stuck close holds no slot of the descriptor table (the
 * kernel takes the descriptor out of it before it flushes), only its thread.
 *
 * Peers' closes (and a client's socket, whose queue may hold what it sent) take at most
 * CLOSER_THREADS - CLOSER_OWN_THREADS threads at once, whoever sent them: the rest are for the
 * daemon's own descriptors, which never wait behind a peer's file however many senders have
 * closes stuck (round six: 32 users with a FUSE server held every thread).
 */
#ifndef GP_CLOSER_H
#define GP_CLOSER_H

#include <sys/types.h>

/* The most threads that close; each holds a small stack. */
#define CLOSER_THREADS 64
/* The sender of a descriptor whose peer's credentials could not be read: a sender of its own. */
#define CLOSER_UNKNOWN_SENDER ((uid_t) -2)
/* Threads only the daemon's own descriptors may take (closer_close()). */
#define CLOSER_OWN_THREADS 4
/* The most threads closing what one user sent, at once. */
#define CLOSER_PER_SENDER 2
/* The most descriptors one user sent that may wait to be closed before it may send no more. */
#define CLOSER_BACKLOG_MAX 1024

/*
 * Closes fd, the daemon's own (a client's socket), without blocking the caller: on a thread of
 * the closer's (started on first use). A socket's SO_LINGER is turned off first, so that a
 * lingering socket does not hold the thread either. Where no thread can be started, closes at
 * once after that (and logs it once).
 */
void closer_close(int fd);

/*
 * The same for a descriptor that a peer sent: sender is the user (users.h) whose closes it
 * counts among.
 */
void closer_close_from(int fd, uid_t sender);

/*
 * The same for the daemon's socket to a client of user's (whose queue may hold descriptors the
 * client sent, counted as that user's): shut down at once, so that the client sees the end
 * although the close may wait.
 */
void closer_close_socket(int fd, uid_t user);

/* How many descriptors that sender sent wait to be closed (not yet on a thread). */
unsigned closer_backlog(uid_t sender);

/* How many closes are under way now (in close(2) on a thread), and how many wait for one. */
void closer_counts(unsigned *ret_closing, unsigned *ret_waiting);

/*
 * Waits up to wait_ms for every handed-over descriptor to be closed, then stops the threads.
 * Those still blocked then are left to the process's exit. Returns how many were left.
 */
unsigned closer_stop(unsigned wait_ms);

#endif
