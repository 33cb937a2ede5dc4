/* msmemscope C API (SPEC §1.3). Link with -lmemscope, or run under the
 * msmemscope CLI, which preloads the library. Every function is safe to call
 * in a forked child (it does nothing there and returns -1). */
#ifndef MSMEMSCOPE_H
#define MSMEMSCOPE_H
#include "mstx/ms_tools_ext.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Switches collection on (SYSTEM START). Returns 0, or -1 in a forked child. */
int msmemscope_start(void);
/* Switches collection off (SYSTEM STOP). Live blocks are still tracked, so a
 * block allocated while off and freed while on gets a shadow MALLOC row. */
int msmemscope_stop(void);
/* Ends the current step and starts the next (SYSTEM STEP, SPEC §3). */
int msmemscope_step(void);
/* The live report (SPEC §7): writes JSON {"total_size": N, "mem_report":
 * [{"site": "file:line", "function": "...", "size": N, "count": N}, ...]},
 * largest site first, into buf (n bytes, NUL-terminated). Returns the JSON's
 * length: when that is n or more, call again with a larger buffer to get the
 * same report. Returns -1 on error, with the message in buf. */
int msmemscope_get_mem_report(char *buf, int n);

/* The peak timeline of a finished capture (a capture folder, or an output
 * folder holding one): JSON [[t_ms, max_live_bytes], ...], and the per-site
 * report at the maximum of the interval holding t_ms. Same buffer contract
 * as msmemscope_get_mem_report. */
int msmemscope_get_all_time_size(const char *input, int interval_ms, char *buf, int n);
int msmemscope_get_mem_report_with_time(const char *input, long long t_ms, int interval_ms, char *buf, int n);

/* Offline analyses (SPEC §6) over CSV or DB dumps. Each returns a JSON
 * string {"ok": true, "result": ...} or {"ok": false, "error": ...} to be
 * released with msmemscope_free_string. kwargs is a JSON object of the
 * analyzer's parameters (msmemscope_analyzer_config lists them). */
char *msmemscope_list_analyzers(void);
char *msmemscope_analyzer_config(const char *name);
char *msmemscope_analyze(const char *name, const char *kwargs);
void msmemscope_free_string(char *s);

#ifdef __cplusplus
}
#endif
#endif
