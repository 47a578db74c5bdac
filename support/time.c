/* Clocks, sleeps and a per-thread random generator. */
#include "support/time.h"

#include <stdint.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

double capstan__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

double capstan__mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct timespec capstan__timespec(double s)
{
    struct timespec ts = { .tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9) };
    return ts;
}

void capstan__sleep(double s)
{
    if (s <= 0)
        return;
    struct timespec ts = capstan__timespec(s);
    while (nanosleep(&ts, &ts) != 0)
        ;
}

double capstan__rand(void)
{
    /* xorshift64*, seeded per thread from the clock and the thread's stack
     * address; jitter and queue shuffles need spread, not secrecy. */
    static _Thread_local uint64_t state;
    if (!state) {
        int local;
        state = (uint64_t)(capstan__mono() * 1e9) ^ (uint64_t)(uintptr_t)&local ^ (uint64_t)getpid() << 32;
        if (!state)
            state = 0x9E3779B97F4A7C15ull;
    }
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return (double)((state * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
}

/* Fills buf with n bytes from the kernel's CSPRNG; falls back to the
 * per-thread generator if it fails. */
static void random_bytes(void *buf, size_t n)
{
    unsigned char *p = buf;
    size_t got = 0;
    while (got < n) {
        ssize_t k = getrandom(p + got, n - got, 0);
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    for (; got < n; got++)
        p[got] = (unsigned char)(capstan__rand() * 256);
}

void capstan__hex(char *out, const unsigned char *raw, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[raw[i] >> 4];
        out[2 * i + 1] = digits[raw[i] & 15];
    }
    out[2 * n] = '\0';
}

void capstan__random_hex(char *out, size_t nbytes)
{
    unsigned char raw[32];
    nbytes = nbytes < sizeof(raw) ? nbytes : sizeof(raw);
    random_bytes(raw, nbytes);
    capstan__hex(out, raw, nbytes);
}
