/*
 * fusefile.h: a file on a real FUSE mount whose server stops answering, for the tests of
 * descriptors that could make the daemon wait: a minimal server over /dev/fuse (no libfuse),
 * in a mount namespace of the calling process's own, which needs root and a kernel with FUSE.
 */
#ifndef GP_FUSEFILE_H
#define GP_FUSEFILE_H

#include <stddef.h>

struct testd;

/*
 * In a child process (it unshares its mount namespace): mounts a FUSE file system on dir (an
 * empty directory) with one regular file of size bytes, served by a process of its own that
 * dies with the caller, opens it read-write, and from then on the server answers nothing, so
 * that fstat(2) or anything else that asks the server waits until fusefile_thaw(), or until
 * the caller exits (the server goes with it, and the kernel fails what waited). Returns the
 * open descriptor, or -1 with why (a reason to skip: no root, no FUSE).
 */
int fusefile_open_frozen(const char *dir, unsigned long long size, char *why, size_t why_size);

/*
 * The same, with a server that has never said it does not flush: every close of the file, in
 * any process that holds it, then waits for an answer to its FLUSH that does not come (and
 * cannot be killed, once the server has read it), until fusefile_thaw() or the caller's exit.
 */
int fusefile_open_frozen_flushing(const char *dir, unsigned long long size, char *why, size_t why_size);

/*
 * The server answers again: what it heard while frozen fails with EIO, and the rest is served,
 * so that every process holding the file can close it (a close asks the server too).
 */
void fusefile_thaw(void);

/*
 * Hands the daemon d (any backend that adopts) a file on a frozen FUSE mount for adoption, from
 * a child process: the daemon must refuse it at once, saying it is on FUSE, and gpupoolctl
 * status must answer meanwhile. Where FUSE cannot be mounted, test (the caller) is skipped,
 * saying why (test_skipped()).
 */
void check_frozen_fuse_adoption(const char *test, struct testd *d);

#endif
