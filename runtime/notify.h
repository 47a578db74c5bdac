/* systemd's Type=notify protocol over $NOTIFY_SOCKET (notify.c; a no-op
 * when it is unset), spoken by a worker's main thread and by the
 * supervisor. capstan__notify sends one state ("READY=1", "STOPPING=1")
 * and returns 0, CAPSTAN_EINVAL for an address it cannot use, or
 * CAPSTAN_ESYS. capstan__notify_watchdog sends "WATCHDOG=1" when half of
 * WATCHDOG_USEC has passed since the last one; only the main thread calls
 * it, from its signal loop, so a Redis outage (which the other threads
 * wait out) never gets the process restarted, while a wedged main thread
 * does. capstan__notify_watchdog_every is that half interval in seconds,
 * 0 when off. Not part of the public API. */
#ifndef CAPSTAN_RUNTIME_NOTIFY_H
#define CAPSTAN_RUNTIME_NOTIFY_H

int capstan__notify(const char *state);
void capstan__notify_watchdog(void);
double capstan__notify_watchdog_every(void);

#endif
