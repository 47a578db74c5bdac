/* A report in the log when the process dies of a fatal signal (SIGSEGV,
 * SIGBUS, SIGFPE, SIGILL, SIGABRT): the signal, the class and jid of every
 * job running in every shard's processors (first the one whose thread took
 * the signal), and a
 * backtrace; then the process dies of that signal as it
 * would have (exit status 128+sig, core dump). Without it a handler that
 * crashes leaves nothing but the shell's "Segmentation fault". */
#ifndef CAPSTAN_RUNTIME_CRASH_H
#define CAPSTAN_RUNTIME_CRASH_H

#include "runtime/rt.h"

/* Installs the handlers, for each signal whose action is still the default
 * (a program that set its own keeps it), and gives the calling thread an
 * alternate signal stack. capstan__crash_uninstall puts the old actions back. */
void capstan__crash_install(void);
void capstan__crash_uninstall(void);

/* The slots whose jobs a report names for the runtime member of the
 * process (0: the front, or the one runtime without shards; a shard's
 * member its index), each line naming shard (NULL: none; a string that
 * outlives the watch). NULL, 0: none of that member's. The handler reads
 * each slot's busy flag, class and jid without the lock. Members from
 * CAPSTAN_CRASH_WATCH_MAX on are not listed. */
#define CAPSTAN_CRASH_WATCH_MAX 64
void capstan__crash_watch(size_t member, const char *shard, capstan_slot_t *slots, int nslots);

/* An alternate signal stack for the calling thread, so that a handler that
 * overflows its stack is reported too; freed by capstan__crash_thread_end. A
 * thread that already has one (a sanitizer's) keeps it. */
void capstan__crash_thread_begin(void);
void capstan__crash_thread_end(void);

#endif
