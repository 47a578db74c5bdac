/* W3C trace context, as OpenTelemetry's Sidekiq instrumentation carries it:
 * "traceparent" and "tracestate" at the top level of a job's payload. The
 * checks of their format, and the context of the job this thread runs,
 * which the client copies into the jobs a handler pushes. */
#ifndef CAPSTAN_SUPPORT_TRACE_H
#define CAPSTAN_SUPPORT_TRACE_H

#include <stddef.h>

/* Length of a version-00 traceparent, "00-<32 hex>-<16 hex>-<2 hex>". */
#define CAPSTAN_TRACEPARENT_LEN 55
/* Longest tracestate kept (W3C: 32 members of up to 256 characters are
 * allowed, and a vendor may cut; 512 is what it asks every vendor to pass). */
#define CAPSTAN_TRACESTATE_MAX 512

/* Whether s[0..len) is a version-00 traceparent: lowercase hex fields, and
 * neither the trace id nor the parent id all zeros (W3C: such a header is
 * invalid, the context absent). */
int capstan__traceparent_valid(const char *s, size_t len);
/* Whether s[0..len) is a tracestate worth carrying: 1 to
 * CAPSTAN_TRACESTATE_MAX printable ASCII characters. */
int capstan__tracestate_valid(const char *s, size_t len);

/* Sets the calling thread's current trace context: a valid traceparent (or
 * NULL: none) and its tracestate (or NULL). Borrowed: both must stay valid
 * until capstan__trace_leave on the same thread. */
void capstan__trace_enter(const char *traceparent, const char *tracestate);
void capstan__trace_leave(void);
/* The calling thread's current context (NULL when none). */
const char *capstan__trace_parent(void);
const char *capstan__trace_state(void);

#endif
