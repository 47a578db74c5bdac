/* A report in the log when the process dies of a fatal signal (SIGSEGV,
 * SIGBUS, SIGFPE, SIGILL, SIGABRT): the signal, the class and jid of every
 * job running (first the one whose thread took the signal), and a
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

/* The slots whose jobs a report names (NULL, 0: none). The handler reads
 * each slot's busy flag, class and jid without the lock. */
void capstan__crash_watch(capstan_slot_t *slots, int nslots);

/* An alternate signal stack for the calling thread, so that a handler that
 * overflows its stack is reported too; freed by capstan__crash_thread_end. A
 * thread that already has one (a sanitizer's) keeps it. */
void capstan__crash_thread_begin(void);
void capstan__crash_thread_end(void);

#endif
