/* msmemscope C API (SPEC §1.3). Link with -lmemscope, or run under the
 * msmemscope CLI, which preloads the library.
 *
 * Two kinds of call, one convention each:
 *
 * - Status calls return int: 0 on success, -1 on failure. The queries
 *   msmemscope_interposed and msmemscope_standalone return 1 or 0 (-1 in a
 *   forked child).
 *
 * - Calls that return data return a JSON document, NUL-terminated, in
 *   memory from malloc that the caller owns and releases with
 *   msmemscope_free_string (and nothing else; it accepts NULL):
 *
 *       {"ok": true, "result": <the call's result>}
 *       {"ok": true, "result": ..., "text": "console report"}   (analyze)
 *       {"ok": false, "type": "ValueError", "error": "one line"}
 *
 *   "type" names the Python exception the error becomes (ValueError,
 *   TypeError, FileNotFoundError, IsADirectoryError, PermissionError,
 *   RuntimeError). These calls return NULL only in a forked child or when
 *   out of memory.
 *
 * Every call is safe in a forked child: it is refused there (-1, 0 from
 * mstxRangeStartA, or NULL) by a C check before any Go code would run, and
 * records nothing; children are counted, not traced. msmemscope_free_string
 * and msmemscope_hash64 work there too. What a data call allocates is
 * msmemscope's own and never appears in the capture. */
#ifndef MSMEMSCOPE_H
#define MSMEMSCOPE_H
#include <stddef.h>
#include <stdint.h>
#include "mstx/ms_tools_ext.h"
#ifdef __cplusplus
extern "C" {
#endif

/* ---- collection (status calls) ---- */

/* Switches collection on (SYSTEM START). */
int msmemscope_start(void);
/* Switches collection off (SYSTEM STOP). Live blocks are still tracked, so a
 * block allocated while off and freed while on gets a shadow MALLOC row. */
int msmemscope_stop(void);
/* Ends the current step and starts the next (SYSTEM STEP, SPEC §3). */
int msmemscope_step(void);

/* ---- reports (data calls) ---- */

/* The live report (SPEC §7). result: {"total_size": N, "mem_report":
 * [{"site": "file:line", "function": "...", "size": N, "count": N}, ...]},
 * largest site first. */
char *msmemscope_get_mem_report(void);

/* The peak timeline of a finished capture (a capture or output folder, a
 * dump CSV or DB, a spool file or one rotated log). result: [[t_ms, max_live_bytes], ...]; and the
 * per-site report (as msmemscope_get_mem_report) at the maximum of the
 * interval holding t_ms. Errors are ValueError. */
char *msmemscope_get_all_time_size(const char *input, int interval_ms);
char *msmemscope_get_mem_report_with_time(const char *input, long long t_ms, int interval_ms);

/* Exports a capture or dump (any input of msmemscope_get_all_time_size) in
 * formats, comma-separated ("pprof"; NULL or "": every format), into
 * output/export, or with output NULL or "" into the capture's export
 * folder. result: the paths written. Errors are ValueError. */
char *msmemscope_export(const char *input, const char *formats, const char *output);

/* Measurement windows (the pytest plugin's per-test figures). begin: from
 * now on, blocks allocated are followed; result null. end: result
 * {"peak_bytes", "leaked_bytes", "leaked_blocks", "allocated_bytes",
 * "allocations", "peak_sites": [...], "leak_sites": [...]}: the highest
 * live bytes of blocks allocated in the window, those still live at its
 * end, and their sites ({"site", "function", "size", "count", "stack"}:
 * live bytes per site at the peak and at the end, largest first, the top
 * `top` of each, every one when top <= 0). Frees of older blocks count
 * for nothing. Needs the library preloaded and log_mode=full; errors are
 * RuntimeError. Costs a drain and the events recorded since the last
 * call (the spool is read as it grows), no replay. */
char *msmemscope_window_begin(void);
char *msmemscope_window_end(int top);

/* Offline analyses (SPEC §6) over CSV or DB dumps. list_analyzers' result:
 * ["leaks", ...]; analyzer_config's: {"params": {name: {"type", "required",
 * "default", "description"}}, "order": [names in order]}; analyze takes
 * kwargs, a JSON object of the analyzer's parameters (an absent one takes
 * its default), and returns the analysis' result and console report. */
char *msmemscope_list_analyzers(void);
char *msmemscope_analyzer_config(const char *name);
char *msmemscope_analyze(const char *name, const char *kwargs);

/* Releases a reply of a data call (NULL is accepted). */
void msmemscope_free_string(char *s);

/* ---- for the Python package (python/msmemscope/_lib.py) ---- */

/* Applies options, a JSON array of [name, value] pairs with the CLI's names,
 * all or none; result null, errors ValueError. */
char *msmemscope_config(const char *items);
/* result: the effective configuration (an object). */
char *msmemscope_get_config(void);
/* Begins the capture if it waits for start(), without (py_begin) or with
 * (py_start) switching collection on; result null, errors RuntimeError. */
char *msmemscope_py_begin(void);
char *msmemscope_py_start(void);
/* Switches collection off; without a CLI also writes the files (new ones on
 * each call). result: the dump's path, or null when the CLI writes them. */
char *msmemscope_py_stop(void);
/* result: this process's capture folder, or null before the capture begins. */
char *msmemscope_dir(void);
/* 1 when this copy of the library interposes the allocator (preloaded or
 * linked, not loaded later with dlopen); host-heap events need it. */
int msmemscope_interposed(void);
/* 1 when no CLI owns this capture (the library writes the files itself). */
int msmemscope_standalone(void);
/* Whether a standalone capture writes its files (dump, analyses) at exit:
 * 1, the default, or 0 to leave the spool alone (a scratch capture read
 * while it runs, as the pytest plugin's). */
int msmemscope_exit_files(int on);
/* Owner tags (msmemscope.describe): the block at addr, or the blocks this
 * thread allocates between push and pop. */
int msmemscope_describe(uint64_t addr, const char *owner);
int msmemscope_describe_push(const char *owner);
int msmemscope_describe_pop(void);
/* Python frames from files under dir are msmemscope's own: left out of stacks. */
int msmemscope_python_package(const char *dir);
/* A PyTorch record (operator, snapshot, watch, tag) with a text payload. */
int msmemscope_torch_event(uint16_t kind, uint64_t a, const char *payload, uint32_t len);
/* msmemscope's own work on this thread (on = 1, nested; 0 ends it): what it
 * allocates meanwhile is tracked (so that its frees pair) but makes no row,
 * no leak and no report entry (the Python package's operator hooks). */
int msmemscope_own(int on);
/* msmemscope_torch_event(kind, n, payload, len), then msmemscope_own(0):
 * the operator hooks' call, one where two were, with int and char pointer
 * arguments only (so that ctypes may call it without argument types). */
int msmemscope_torch_op(int kind, int n, const char *payload, int len);
/* 1 in a process forked from the one this library started in (where every
 * other call is refused), else 0. Safe in a forked child. */
int msmemscope_in_child(void);
/* A 64-bit hash of len bytes at data (the watch's); a pure function. */
uint64_t msmemscope_hash64(const void *data, size_t len);

#ifdef __cplusplus
}
#endif
#endif
