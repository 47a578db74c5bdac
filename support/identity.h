/* The process identity Sidekiq's API shows: "hostname:pid:12hex". */
#ifndef CAPSTAN_SUPPORT_IDENTITY_H
#define CAPSTAN_SUPPORT_IDENTITY_H

#include <stddef.h>

/* Writes a fresh identity into out (n bytes). The hostname is $DYNO when set,
 * as Sidekiq does, else gethostname(). */
void capstan__identity_make(char *out, size_t n);
/* The hostname part used above, into out. */
void capstan__hostname(char *out, size_t n);

#endif
