// The native side's functions that the Go engine calls. The records that
// rings and the spool hold are format/records.def's (records_gen.h); their
// encoders are in records.h.
#ifndef MEMSCOPE_HOOK_H
#define MEMSCOPE_HOOK_H

#include <stdint.h>
#include <stddef.h>

#include "records_gen.h" // the record format (format/records.def)

// Called by the Go engine.
void ms_set_spool(int fd);
long ms_drain(void);          // writes pending events; returns bytes written, -1 on error
long ms_drain_into(void *buf, long cap); // the same into memory (rotating logs)
int ms_drain_into_more(void);            // it left records in the rings: drain again at once
void ms_sink_done(void);                  // one batch of those is written (crash handlers wait for all)
int ms_drainer_start(void);    // the drain thread: ms_drain every 1-8 ms (spool mode)
void ms_drainer_stop(void);     // stops it (its failed passes: ms_drain_errors)
uint64_t ms_drain_errors(void); // the drain passes that failed to write, any thread's
void ms_finish(void);         // PROCESS_EXIT, final drain, then direct writes
int ms_finish_begin(void);    // ms_finish without its drain (rotating logs drain into memory); 0 in a child
void ms_calibrate(void);      // adds a clock calibration point to the spool
int ms_pid(void);
uint64_t ms_lost(void);
uint64_t ms_forks(void);
// The leak-kind scan at exit (exitscan.c): this library's own mappings as
// [lo, hi) pairs (returns their number, copies up to cap), the main
// thread's stack pointer as the program left it, whether the scan will run.
int ms_own_regions(uint64_t *out, int cap);
uint64_t ms_exit_sp(void);
int ms_exit_regs(uint64_t *out); // the callee-saved registers exit() was called with (6), 0: none
int ms_late_armed(void);
int ms_dead_stacks(uint64_t *out, int cap); // ended threads' stacks as [lo, hi) pairs
int msmemscope_in_child(void); // the C API's (capi_shims.c): a forked child
void ms_guard_enter(void);
void ms_guard_leave(void);
void ms_fast_update(void); // after changing what the hot path records
void ms_set_rotating(int on); // rotating logs: no short MALLOCs or stack ids (each log is read alone)
void ms_engine_settled(void); // the engine has started (or never will): crash handlers stop waiting for it
void ms_set_crash_file(const char *path, int n); // where a crash handler marks how the process ended

#endif
