/* Label values of /metrics: whatever bytes a payload's class or a queue
 * name holds, the escaped value is valid UTF-8 without a raw newline or
 * quote, reads back as the input (invalid bytes as U+FFFD), and a rendered
 * registry holding it is well-formed text format 0.0.4.
 *
 * Input: class NUL queue NUL lock-type (missing parts are empty). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "support/buf.h"
#include "support/json.h"
#include "observe/prometheus.h"

#define CHECK(c) ((c) ? (void)0 : abort())

/* Checks v (escaped) against the text format's label-value grammar and
 * returns it unescaped (malloc'd) for comparison with the input. */
static char *unescape(const char *v, size_t len)
{
    CHECK(capstan__utf8_valid(v, len));
    char *out = malloc(len + 1), *o = out;
    CHECK(out != NULL);
    for (size_t i = 0; i < len; i++) {
        CHECK(v[i] != '\n' && v[i] != '"');
        if (v[i] != '\\') {
            *o++ = v[i];
            continue;
        }
        CHECK(i + 1 < len);
        char e = v[++i];
        CHECK(e == '\\' || e == '"' || e == 'n');
        *o++ = e == 'n' ? '\n' : e;
    }
    *o = '\0';
    return out;
}

/* What the escaper must read back as: s with each byte that begins no
 * valid UTF-8 sequence replaced by U+FFFD. */
static char *expected(const char *s)
{
    size_t len = strlen(s);
    char *out = malloc(3 * len + 1), *o = out;
    CHECK(out != NULL);
    for (size_t i = 0; i < len;) {
        size_t k = capstan__utf8_seq(s + i, len - i);
        if (k) {
            memcpy(o, s + i, k);
            o += k;
            i += k;
        } else {
            memcpy(o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    *o = '\0';
    return out;
}

static void check_escape(const char *s)
{
    capstan_buf_t b = {0};
    CHECK(capstan__metrics_escape(&b, s) == 0);
    CHECK(b.p != NULL);
    char *back = unescape(b.p, b.len), *want = expected(s);
    CHECK(strcmp(back, want) == 0);
    free(back);
    free(want);
    capstan__buf_free(&b);
}

/* One sample line: name{l="v",...} value, every value well-formed. */
static void check_sample(const char *line, size_t len)
{
    size_t i = 0;
    while (i < len && line[i] != '{' && line[i] != ' ')
        i++;
    CHECK(i > 0 && i < len);
    if (line[i] == '{') {
        i++;
        for (;;) {
            while (i < len && line[i] != '=') {
                CHECK(line[i] != '"' && line[i] != '}');
                i++;
            }
            CHECK(i + 1 < len && line[i + 1] == '"');
            size_t start = i + 2, j = start;
            while (j < len && line[j] != '"')
                j += line[j] == '\\' ? 2 : 1;
            CHECK(j < len);
            free(unescape(line + start, j - start));
            i = j + 1;
            CHECK(i < len);
            if (line[i] == '}')
                break;
            CHECK(line[i] == ',');
            i++;
        }
        i++;
    }
    CHECK(i < len && line[i] == ' ' && i + 1 < len);
}

/* The part after p's NUL, or the final NUL at end once there are no more. */
static const char *next_part(const char *p, const char *end)
{
    p += strlen(p);
    return p < end ? p + 1 : p;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    CHECK(s != NULL);
    memcpy(s, data, size);
    s[size] = '\0';
    const char *cls = s, *queue = next_part(cls, s + size), *type = next_part(queue, s + size);
    check_escape(cls);
    check_escape(queue);
    check_escape(type);

    capstan_metrics_t *m = capstan__metrics_new();
    CHECK(m != NULL);
    capstan__metrics_job(m, cls, queue, (double)size / 100, size & 1, size & 2 ? cls : NULL);
    capstan__metrics_job(m, queue, cls, 0.5, 0, NULL);
    capstan__metrics_lock_event(m, type, "locked");
    capstan_buf_t b = {0};
    CHECK(capstan__metrics_render(m, &b) == 0);
    CHECK(capstan__utf8_valid(b.p, b.len));
    for (const char *p = b.p, *end = b.p + b.len; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        CHECK(nl != NULL);
        if (*p != '#')
            check_sample(p, (size_t)(nl - p));
        p = nl + 1;
    }
    capstan__buf_free(&b);
    capstan__metrics_free(m);
    free(s);
    return 0;
}
