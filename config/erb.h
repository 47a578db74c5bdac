/* The ERB of a Rails sidekiq.yml, rendered before the YAML is read, as
 * Sidekiq renders it (ERB with trim_mode "-"). Only what such files hold
 * is evaluated: ENV["X"], ENV.fetch("X", default), ENV.fetch("X") { default },
 * `||`, .to_i, .to_s and Integer(...) of those, and string, integer and nil
 * literals; <%# %> comments and the <%- -%> trimming forms. Anything else is
 * refused rather than guessed. Not public. */
#ifndef CAPSTAN_CONFIG_ERB_H
#define CAPSTAN_CONFIG_ERB_H

#include <stddef.h>

typedef struct capstan_erb {
    char *text;            /* the rendered file, NUL-terminated, owned */
    size_t len;            /* its length (it may hold NUL bytes of the file) */
    unsigned long *lines;  /* lines[i]: the file's line of rendered line i + 1 */
    size_t nlines;
} capstan_erb_t;

/* Renders src (len bytes, the contents of path) into *out, which the caller
 * clears with capstan__erb_clear (also after a failure). Returns 0, or
 * CAPSTAN_ECONFIG with err (CAPSTAN_ERRLEN) set to one line naming path, the
 * line and the tag ("path:3: unsupported ERB <%= Rails.env %>"), or
 * CAPSTAN_ENOMEM. */
int capstan__erb_render(const char *path, const char *src, size_t len, capstan_erb_t *out,
                        char *err);

/* The file's line of the rendered text's line (both counted from 1). */
unsigned long capstan__erb_line(const capstan_erb_t *e, unsigned long line);

/* Frees what e holds and zeroes it; NULL and a zeroed e are no-ops. */
void capstan__erb_clear(capstan_erb_t *e);

#endif
