/*
 * client_keep.h: the process's table of kept descriptors (client_keep.c), the library's lowest
 * layer: one table for every handle, since the descriptor table and fork() are the process's.
 */
#ifndef GP_CLIENT_KEEP_H
#define GP_CLIENT_KEEP_H

#include <stdbool.h>
#include <stdint.h>

/*
 * Keeps a segment's descriptor, which a daemon after this one adopts (client_resume()): the
 * process's soft RLIMIT_NOFILE is raised to its hard limit once, kept descriptors sit at 1024
 * and above where that allows (out of select()'s sight), and at most the limit less 2048 are
 * kept, leaving the application its room. A forked child closes them all at once
 * (pthread_atfork): it must not hold the memory alive. Returns the descriptor kept, or -1 (fd
 * closed, the segment then unadoptable) beyond that. client_fd_release() closes one (-1: none;
 * nothing where a fork closed it).
 */
int client_fd_keep(int fd);
void client_fd_release(int fd);

/*
 * Whether fd (host backend) is memory of at least size bytes: a file (a memfd) that long. A
 * shorter one would map, and raise SIGBUS where the application touches what is not there.
 */
bool client_fd_is_memory(int fd, uint64_t size);

/*
 * Maps size bytes of fd shared, at at (MAP_FIXED) or anywhere (at NULL), with prot, kept from
 * forked children (MADV_DONTFORK: a child must not hold memory that may be another client's
 * tomorrow). Returns the mapping, or MAP_FAILED with errno set.
 */
void *client_fd_map(int fd, uint64_t size, void *at, int prot);

/*
 * Grows the process's descriptor table once, with room to keep n descriptors more (at most
 * what client_fd_keep() would keep, and 64K slots in all): the kernel grows the table by
 * doubling as descriptors arrive, and in a process with threads each doubling waits for an RCU
 * grace period (milliseconds). Called before the handle's control thread starts, where an
 * application with one thread pays no wait at all. fd: any open descriptor, to duplicate.
 */
void client_fd_room(int fd, uint64_t n);

#endif
