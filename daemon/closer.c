/*
 * closer.c: a thread that closes what a peer sent, so that the loop never blocks in close(2)
 * (see closer.h).
 */
#include "closer.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "size.h"

static struct {
        pthread_mutex_t lock;
        pthread_cond_t wake;            /* work to do, or stop */
        pthread_cond_t idle;            /* the queue emptied */
        pthread_t thread;
        bool started, stopping, failed;
        int *fds;                       /* waiting to be closed: a stack, order does not matter */
        unsigned count, size;
        unsigned closing;               /* taken by the thread, in close(2) */
} closer = { .lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER, .idle = PTHREAD_COND_INITIALIZER };

/* A lingering socket would hold the thread for its linger time: a peer's socket is closed at once. */
static void no_linger(int fd) {
        struct linger off = { 0 };

        (void) setsockopt(fd, SOL_SOCKET, SO_LINGER, &off, sizeof(off));       /* ENOTSOCK for the rest */
}

static void *closer_main(void *arg) {
        (void) arg;
        pthread_mutex_lock(&closer.lock);
        for (;;) {
                int fd;

                while (closer.count == 0 && !closer.stopping)
                        pthread_cond_wait(&closer.wake, &closer.lock);
                if (closer.count == 0)
                        break;
                fd = closer.fds[--closer.count];
                closer.closing++;
                pthread_mutex_unlock(&closer.lock);
                (void) close(fd);       /* may block: that is why it is here */
                pthread_mutex_lock(&closer.lock);
                closer.closing--;
                if (closer.count == 0 && closer.closing == 0)
                        pthread_cond_broadcast(&closer.idle);
        }
        pthread_mutex_unlock(&closer.lock);
        return NULL;
}

/* Starts the thread, its signals blocked (the loop takes them). Locked. */
static bool start_locked(void) {
        sigset_t all, old;
        int r;

        if (closer.started || closer.failed)
                return closer.started;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        r = pthread_create(&closer.thread, NULL, closer_main, NULL);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (r != 0) {
                closer.failed = true;
                log_err("cannot start the thread that closes clients' descriptors (%s): closing them on the loop",
                        strerror(r));
                return false;
        }
        closer.started = true;
        return true;
}

void closer_close(int fd) {
        if (fd < 0)
                return;
        no_linger(fd);
        pthread_mutex_lock(&closer.lock);
        if (!closer.stopping && start_locked()) {
                if (closer.count == closer.size) {
                        unsigned size = closer.size ? closer.size * 2 : 64;
                        int *fds = realloc(closer.fds, size * sizeof(*fds));

                        if (!fds)
                                goto now;
                        closer.fds = fds;
                        closer.size = size;
                }
                closer.fds[closer.count++] = fd;
                pthread_cond_signal(&closer.wake);
                pthread_mutex_unlock(&closer.lock);
                return;
        }
now:
        pthread_mutex_unlock(&closer.lock);
        (void) close(fd);
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
        pthread_cond_signal(&closer.wake);
        pthread_mutex_unlock(&closer.lock);
        if (closer.started && left == 0) {
                pthread_join(closer.thread, NULL);
                closer.started = false;
                free(closer.fds);
                closer.fds = NULL;
                closer.size = 0;
        }
        return left;
}
