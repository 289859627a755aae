/*
 * peerfd.h: what a descriptor a peer sent is, found without waiting on its file system.
 * fstat(2), statfs(2) and a driver's import of a file on FUSE wait for the FUSE server, which
 * may never answer (a network file system's, for the network): the daemon would stall on the
 * loop. So the daemon inspects a descriptor only with calls that never reach a file system
 * (fcntl(F_GET_SEALS), /proc's links and fdinfo, the mount tables) before anything else sees it.
 */
#ifndef GP_PEERFD_H
#define GP_PEERFD_H

#include <stddef.h>
#include <sys/types.h>

/*
 * Whether fd, sent by process pid, is safe to inspect: shared memory (a memfd), a kernel
 * object of no file system (a pipe, a socket, an anonymous inode), or a file on a mount
 * whose operations never wait for a server or a process (not FUSE, not a network file
 * system). Returns 0, or -EINVAL saying what it is in why. Never blocks on the file.
 */
int peerfd_check(int fd, pid_t pid, char *why, size_t why_size);

#endif
