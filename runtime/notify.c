/* systemd's notify protocol (Type=notify), spoken directly rather than
 * through libsystemd so capstan has no such dependency: one datagram per state
 * change to the unix socket named by $NOTIFY_SOCKET. Without that variable
 * every call is a no-op, so the same binary runs under any supervisor. */
#include "runtime/notify.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "capstan/error.h"
#include "support/time.h"

int capstan__notify(const char *state)
{
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !*path)
        return 0;
    /* Only the two unix forms; systemd's vsock addresses are for VMs. */
    if (path[0] != '/' && path[0] != '@')
        return CAPSTAN_EINVAL;
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    size_t len = strlen(path);
    if (len >= sizeof(sa.sun_path))
        return CAPSTAN_EINVAL;
    memcpy(sa.sun_path, path, len);
    socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
    if (path[0] == '@')
        sa.sun_path[0] = '\0'; /* abstract name: its length is exact, no NUL */
    else
        salen++;
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return CAPSTAN_ESYS;
    int rc = 0;
    if (sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa, salen) < 0)
        rc = CAPSTAN_ESYS;
    int saved = errno;
    close(fd);
    errno = saved;
    return rc;
}

/* Seconds between watchdog pings: half of WATCHDOG_USEC, as systemd
 * advises, or 0 when the watchdog is off or meant for another process
 * (WATCHDOG_PID names the main pid when it is set). */
static double watchdog_every(void)
{
    const char *usec = getenv("WATCHDOG_USEC");
    const char *pid = getenv("WATCHDOG_PID");
    if (!usec || !*usec || !getenv("NOTIFY_SOCKET"))
        return 0;
    if (pid && *pid && strtol(pid, NULL, 10) != (long)getpid())
        return 0;
    char *end;
    unsigned long long us = strtoull(usec, &end, 10);
    if (*end || us == 0)
        return 0;
    return (double)us / 2e6;
}

/* Only the main thread pings (see notify.h), so plain statics suffice. */
static double wd_every = -1, wd_next;

void capstan__notify_watchdog(void)
{
    if (wd_every < 0) {
        wd_every = watchdog_every();
        wd_next = 0;
    }
    if (wd_every == 0)
        return;
    double now = capstan__mono();
    if (now < wd_next)
        return;
    wd_next = now + wd_every;
    capstan__notify("WATCHDOG=1");
}

double capstan__notify_watchdog_every(void)
{
    if (wd_every < 0)
        wd_every = watchdog_every();
    return wd_every;
}
