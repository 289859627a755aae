/* peerfd.c: telling what a peer's descriptor is without touching its file system (see peerfd.h). */
#define _GNU_SOURCE
#include "peerfd.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/*
 * File systems whose calls may wait on a server: a user process (FUSE and what runs on it) or
 * the network. A descriptor on one is refused before fstat(2) or a driver could hang on it.
 */
static bool fstype_may_wait(const char *type) {
        static const char *const waiting[] = {
                "fuse", "fuseblk", "virtiofs", "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "afs",
                "gfs2", "ocfs2", "glusterfs", "lustre", "orangefs", "coda", "ncpfs",
        };

        if (strncmp(type, "fuse.", 5) == 0)     /* fuse.sshfs, fuse.glusterfs, ... */
                return true;
        for (size_t i = 0; i < sizeof(waiting) / sizeof(waiting[0]); i++)
                if (strcmp(type, waiting[i]) == 0)
                        return true;
        return false;
}

/* The mount id of fd (/proc/self/fdinfo, Linux 3.15), or -1. */
static long mount_id(int fd) {
        char path[64], line[256];
        long id = -1;
        FILE *f;

        snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
        if (!(f = fopen(path, "re")))
                return -1;
        while (id < 0 && fgets(line, sizeof(line), f))
                if (strncmp(line, "mnt_id:", 7) == 0)
                        id = strtol(line + 7, NULL, 10);
        fclose(f);
        return id;
}

/*
 * The type of mount id as the mount table at path lists it, into type (64 bytes). Mount ids are
 * the system's, not a namespace's: the same in every table that lists the mount. Returns
 * whether it was found.
 */
static bool mount_type(const char *path, long id, char type[64]) {
        char line[4096];
        bool found = false;
        FILE *f;

        if (!(f = fopen(path, "re")))
                return false;
        while (!found && fgets(line, sizeof(line), f)) {
                const char *sep;

                if (strtol(line, NULL, 10) != id || !(sep = strstr(line, " - ")))
                        continue;
                /* "36 35 98:0 /a /b rw master:1 - ext4 /dev/root rw": the type follows the separator. */
                found = sscanf(sep + 3, "%63s", type) == 1;
        }
        fclose(f);
        return found;
}

int peerfd_check(int fd, pid_t pid, char *why, size_t why_size) {
        char path[64], link[256], type[64], table[64];
        ssize_t n;
        long id;

        /* Shared memory: F_GET_SEALS answers only for shmem and never reaches a file system. */
        if (fcntl(fd, F_GET_SEALS) >= 0)
                return 0;
        /* A pipe, a socket, an anonymous inode: no file system of anybody's, named so by /proc. */
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        n = readlink(path, link, sizeof(link) - 1);
        if (n > 0 && link[0] != '/')
                return 0;
        id = mount_id(fd);
        if (id < 0) {
                snprintf(why, why_size, "a file whose mount /proc does not tell");
                return -EINVAL;
        }
        /* The daemon's mount table, then the sender's: a file of its private namespace is listed there. */
        snprintf(table, sizeof(table), "/proc/%d/mountinfo", (int) pid);
        if (!mount_type("/proc/self/mountinfo", id, type) && !mount_type(table, id, type)) {
                snprintf(why, why_size, "a file on a mount (id %ld) in neither the daemon's mount table nor its "
                         "sender's", id);
                return -EINVAL;
        }
        if (fstype_may_wait(type)) {
                snprintf(why, why_size, "a file on a %s file system, whose server could keep the daemon waiting", type);
                return -EINVAL;
        }
        return 0;
}
