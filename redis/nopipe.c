/* SIGPIPE kept from the program around the library's writes (see
 * nopipe.h). */
#include "redis/nopipe.h"

#include <errno.h>
#include <pthread.h>
#include <time.h>

static void pipe_only(sigset_t *s)
{
    sigemptyset(s);
    sigaddset(s, SIGPIPE);
}

void capstan__nopipe_begin(capstan_nopipe_t *p)
{
    sigset_t pipe_set, pending;
    pipe_only(&pipe_set);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &p->old);
    /* Only a thread that blocked SIGPIPE itself can have one pending; the
     * usual case, unblocked, costs no sigpending. */
    p->was_pending = sigismember(&p->old, SIGPIPE) && sigpending(&pending) == 0
                     && sigismember(&pending, SIGPIPE);
}

void capstan__nopipe_end(capstan_nopipe_t *p, int failed)
{
    int saved = errno;
    if (failed && !p->was_pending) {
        sigset_t pipe_set;
        pipe_only(&pipe_set);
        /* Returns at once, with EAGAIN when the write raised nothing. */
        struct timespec now = { 0, 0 };
        while (sigtimedwait(&pipe_set, NULL, &now) < 0 && errno == EINTR)
            ;
    }
    pthread_sigmask(SIG_SETMASK, &p->old, NULL);
    errno = saved;
}
