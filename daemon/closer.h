/*
 * closer.h: closing descriptors that a peer could make close(2) block on, off the loop.
 *
 * close(2) can block: on a TCP socket with SO_LINGER and unsent data for the linger time, on
 * a FUSE or NFS file while it flushes, on a Unix socket whose queue holds such descriptors in
 * flight (their last reference is dropped in the closing thread). Any client can pass the
 * daemon a descriptor, so every descriptor a peer sent, and every client socket, is closed
 * here: handed to one thread that does the closing, so that the loop never waits on a peer
 * (architecture invariant 5).
 */
#ifndef GP_CLOSER_H
#define GP_CLOSER_H

/*
 * Closes fd without blocking the caller: on the closer's thread (started on first use). A
 * socket's SO_LINGER is turned off first, so that a lingering socket does not hold the thread
 * either. Where no thread can be started, closes at once after that (and logs it once).
 */
void closer_close(int fd);

/*
 * Waits up to wait_ms for every handed-over descriptor to be closed, then stops the thread.
 * One still blocked then is left to the process's exit. Returns how many were left.
 */
unsigned closer_stop(unsigned wait_ms);

#endif
