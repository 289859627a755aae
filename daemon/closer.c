/*
 * closer.c: threads that close what a peer sent, so that the loop never blocks in close(2),
 * and no close that never returns stops the others (see closer.h).
 */
#include "closer.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "size.h"

/* The daemon's own descriptors (client sockets): no sender's, never held back. */
#define OWN ((uid_t) -1)

/* A thread's stack: close(2) needs little (ASan's instrumentation more than the call itself). */
#define CLOSER_STACK_BYTES (256 * 1024)

struct waiting {
        int fd;
        uid_t sender;
};

static struct {
        pthread_mutex_t lock;
        pthread_cond_t wake;            /* work to do, or stop */
        pthread_cond_t idle;            /* the queue emptied */
        pthread_t threads[CLOSER_THREADS];
        uid_t closing_for[CLOSER_THREADS];      /* whose descriptor each thread is closing; OWN also when idle */
        bool in_close[CLOSER_THREADS];
        unsigned started, free_threads;
        bool stopping, failed;
        struct waiting *fds;            /* waiting to be closed, oldest first */
        unsigned count, size;
        unsigned closing;               /* taken by the threads, in close(2) */
        unsigned waiting;               /* count, for closer_backlog() without the lock (written under it) */
} closer = { .lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER, .idle = PTHREAD_COND_INITIALIZER };

/* A lingering socket would hold the thread for its linger time: a peer's socket is closed at once. */
static void no_linger(int fd) {
        struct linger off = { 0 };

        (void) setsockopt(fd, SOL_SOCKET, SO_LINGER, &off, sizeof(off));       /* ENOTSOCK for the rest */
}

/* How many threads are closing what sender sent. Locked. */
static unsigned closing_for(uid_t sender) {
        unsigned n = 0;

        for (unsigned t = 0; t < closer.started; t++)
                n += closer.in_close[t] && closer.closing_for[t] == sender;
        return n;
}

/*
 * The oldest waiting descriptor whose sender has room for one more close, or -1: the daemon's
 * own always, a peer's while peers' closes hold fewer than all but CLOSER_OWN_THREADS. Locked.
 */
static int next_index(void) {
        bool peers_room = closer.closing - closing_for(OWN) < CLOSER_THREADS - CLOSER_OWN_THREADS;

        for (unsigned i = 0; i < closer.count; i++)
                if (closer.fds[i].sender == OWN ||
                    (peers_room && closing_for(closer.fds[i].sender) < CLOSER_PER_SENDER))
                        return (int) i;
        return -1;
}

static bool grow_locked(void);

static void *closer_main(void *arg) {
        unsigned me = (unsigned) (uintptr_t) arg;

        pthread_mutex_lock(&closer.lock);
        for (;;) {
                struct waiting w;
                int i;

                while ((i = next_index()) < 0 && !closer.stopping)
                        pthread_cond_wait(&closer.wake, &closer.lock);
                if (i < 0)
                        break;
                w = closer.fds[i];
                memmove(&closer.fds[i], &closer.fds[i + 1], (closer.count - (unsigned) i - 1) * sizeof(*closer.fds));
                closer.count--;
                __atomic_store_n(&closer.waiting, closer.count, __ATOMIC_RELAXED);
                closer.closing++;
                closer.free_threads--;
                closer.in_close[me] = true;
                closer.closing_for[me] = w.sender;
                if (closer.count && !closer.free_threads)
                        (void) grow_locked();   /* the rest may wait on a thread as this close may never return */
                pthread_mutex_unlock(&closer.lock);
                (void) close(w.fd);     /* may block, even forever: that is why it is here */
                pthread_mutex_lock(&closer.lock);
                closer.in_close[me] = false;
                closer.closing--;
                closer.free_threads++;
                /* Its sender may have more waiting that another thread held back for it. */
                if (closer.count)
                        pthread_cond_broadcast(&closer.wake);
                if (closer.count == 0 && closer.closing == 0)
                        pthread_cond_broadcast(&closer.idle);
        }
        pthread_mutex_unlock(&closer.lock);
        return NULL;
}

/*
 * Starts one more thread, its signals blocked (the loop takes them), where descriptors wait
 * and no thread is free to take them: as one is handed over, and as a thread takes one while
 * others wait (a burst would otherwise wait behind a close that never returns). Locked.
 * Returns whether any thread runs.
 */
static bool grow_locked(void) {
        pthread_attr_t attr;
        sigset_t all, old;
        int r;

        if (closer.failed || closer.started == CLOSER_THREADS || (closer.started && closer.free_threads))
                return closer.started > 0;
        sigfillset(&all);
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, CLOSER_STACK_BYTES);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        r = pthread_create(&closer.threads[closer.started], &attr, closer_main, (void *) (uintptr_t) closer.started);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&attr);
        if (r != 0) {
                if (!closer.started) {
                        closer.failed = true;
                        log_err("cannot start a thread that closes clients' descriptors (%s): closing them on the loop",
                                strerror(r));
                } else {
                        log_warn("cannot start another thread that closes clients' descriptors (%s): %u close, one may "
                                 "be stuck", strerror(r), closer.started);
                }
                return closer.started > 0;
        }
        closer.closing_for[closer.started] = OWN;
        closer.in_close[closer.started] = false;
        closer.started++;
        closer.free_threads++;
        if (closer.started > 1)
                log_warn("closing clients' descriptors on %u threads: a close(2) waits (a FUSE or network file system "
                         "that does not answer, or a socket that lingers)", closer.started);
        return true;
}

void closer_close_from(int fd, uid_t sender) {
        if (fd < 0)
                return;
        no_linger(fd);
        pthread_mutex_lock(&closer.lock);
        if (!closer.stopping && grow_locked()) {
                if (closer.count == closer.size) {
                        unsigned size = closer.size ? closer.size * 2 : 64;
                        struct waiting *fds = realloc(closer.fds, size * sizeof(*fds));

                        if (!fds)
                                goto now;
                        closer.fds = fds;
                        closer.size = size;
                }
                closer.fds[closer.count++] = (struct waiting) { fd, sender };
                __atomic_store_n(&closer.waiting, closer.count, __ATOMIC_RELAXED);
                pthread_cond_broadcast(&closer.wake);
                pthread_mutex_unlock(&closer.lock);
                return;
        }
now:
        pthread_mutex_unlock(&closer.lock);
        (void) close(fd);
}

void closer_close_socket(int fd, uid_t user) {
        /*
         * Shut down now, never blocking, so that its peer sees the end at once although the
         * close may wait behind its user's stuck closes (what its queue holds in flight is
         * dropped only with the last close). Only the daemon's own sockets: one a peer sent is
         * shared with whoever else holds it.
         */
        if (fd >= 0)
                (void) shutdown(fd, SHUT_RDWR);
        closer_close_from(fd, user);
}

void closer_close(int fd) {
        closer_close_socket(fd, OWN);
}

unsigned closer_backlog(uid_t sender) {
        unsigned n = 0;

        /* Asked before every request a session reads: nothing waiting (always, but under a stuck close) takes no lock. */
        if (!__atomic_load_n(&closer.waiting, __ATOMIC_RELAXED))
                return 0;
        pthread_mutex_lock(&closer.lock);
        for (unsigned i = 0; i < closer.count; i++)
                n += closer.fds[i].sender == sender;
        pthread_mutex_unlock(&closer.lock);
        return n;
}

void closer_counts(unsigned *ret_closing, unsigned *ret_waiting) {
        pthread_mutex_lock(&closer.lock);
        *ret_closing = closer.closing;
        *ret_waiting = closer.count;
        pthread_mutex_unlock(&closer.lock);
}

unsigned closer_stop(unsigned wait_ms) {
        struct timespec deadline;
        unsigned left;

        gp_deadline_after_ms(wait_ms, &deadline);
        pthread_mutex_lock(&closer.lock);
        while (closer.started && (closer.count || closer.closing) &&
               pthread_cond_timedwait(&closer.idle, &closer.lock, &deadline) != ETIMEDOUT)
                ;
        left = closer.count + closer.closing;
        closer.stopping = true;
        pthread_cond_broadcast(&closer.wake);
        pthread_mutex_unlock(&closer.lock);
        if (closer.started && left == 0) {
                for (unsigned t = 0; t < closer.started; t++)
                        pthread_join(closer.threads[t], NULL);
                closer.started = closer.free_threads = 0;
                free(closer.fds);
                closer.fds = NULL;
                closer.size = 0;
        }
        return left;
}
