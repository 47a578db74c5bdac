/* W3C trace context checks and the thread's current context (see
 * support/trace.h). */
#include "support/trace.h"

static _Thread_local const char *cur_parent, *cur_state;

static int lower_hex(const char *s, size_t n, int *zero)
{
    *zero = 1;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return 0;
        *zero &= c == '0';
    }
    return 1;
}

int capstan__traceparent_valid(const char *s, size_t len)
{
    int zero;
    if (!s || len != CAPSTAN_TRACEPARENT_LEN || s[0] != '0' || s[1] != '0' || s[2] != '-'
        || s[35] != '-' || s[52] != '-')
        return 0;
    if (!lower_hex(s + 3, 32, &zero) || zero) /* trace id */
        return 0;
    if (!lower_hex(s + 36, 16, &zero) || zero) /* parent (span) id */
        return 0;
    return lower_hex(s + 53, 2, &zero); /* flags */
}

int capstan__tracestate_valid(const char *s, size_t len)
{
    if (!s || !len || len > CAPSTAN_TRACESTATE_MAX)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (s[i] < 0x20 || s[i] > 0x7e)
            return 0;
    return 1;
}

void capstan__trace_enter(const char *traceparent, const char *tracestate)
{
    cur_parent = traceparent;
    cur_state = traceparent ? tracestate : NULL;
}

void capstan__trace_leave(void)
{
    cur_parent = cur_state = NULL;
}

const char *capstan__trace_parent(void) { return cur_parent; }
const char *capstan__trace_state(void) { return cur_state; }
