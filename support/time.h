/* Clocks, sleeps and randomness. */
#ifndef CAPSTAN_SUPPORT_TIME_H
#define CAPSTAN_SUPPORT_TIME_H

#include <stddef.h>
#include <time.h>

/* Wall-clock epoch seconds (for timestamps written to Redis). */
double capstan__now(void);
/* Monotonic seconds (for intervals and deadlines). */
double capstan__mono(void);
/* s seconds as a timespec: an epoch time (capstan__now() + s) for the deadline
 * of pthread_cond_timedwait, or a duration. s >= 0. */
struct timespec capstan__timespec(double s);
/* Sleeps for s seconds (no-op for s <= 0). */
void capstan__sleep(double s);
/* raw[0..n) as 2 * n lowercase hex digits and a NUL into out. */
void capstan__hex(char *out, const unsigned char *raw, size_t n);
/* nbytes random bytes from the kernel's CSPRNG (getrandom; the per-thread
 * generator if it fails), for jids and identities, as 2 * nbytes hex
 * digits and a NUL into out (room for 2 * nbytes + 1); nbytes is at most
 * 32. */
void capstan__random_hex(char *out, size_t nbytes);
/* A uniform random double in [0, 1) from a per-thread generator. */
double capstan__rand(void);

#endif
