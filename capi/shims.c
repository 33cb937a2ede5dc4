// The public calls of include/msmemscope.h that need Go. Each refuses in a
// forked child before Go is entered (a child of a multi-threaded Go process
// must never run Go code: its other threads, the runtime's included, did not
// survive the fork), and holds the reentrancy guard around the Go call, so
// what the call allocates on this thread is msmemscope's own and never
// recorded. The Go exports are in exports.go.
#include <stdlib.h>
#include <string.h>
#include "msmemscope.h"
#include "hook.h"
#include "pystack.h"
#include "_cgo_export.h"

// A reply (main.go's out): a NUL-terminated copy from malloc, NULL when out of memory.
char *capi_reply(const char *json, size_t n) {
	char *s = malloc(n + 1);
	if (!s) return NULL;
	memcpy(s, json, n);
	s[n] = 0;
	return s;
}

#define REPLY(call)                                     \
	do {                                            \
		if (msmemscope_in_child()) return NULL; \
		ms_guard_enter();                       \
		char *r_ = (call);                      \
		ms_guard_leave();                       \
		return r_;                              \
	} while (0)

char *msmemscope_get_mem_report(void) { REPLY(msgo_get_mem_report()); }

char *msmemscope_get_all_time_size(const char *input, int interval_ms) {
	REPLY(msgo_get_all_time_size((char *)input, interval_ms));
}

char *msmemscope_get_mem_report_with_time(const char *input, long long t_ms, int interval_ms) {
	REPLY(msgo_get_mem_report_with_time((char *)input, t_ms, interval_ms));
}

char *msmemscope_export(const char *input, const char *formats, const char *output) {
	REPLY(msgo_export((char *)input, (char *)(formats ? formats : ""), (char *)(output ? output : "")));
}

char *msmemscope_list_analyzers(void) { REPLY(msgo_list_analyzers()); }
char *msmemscope_analyzer_config(const char *name) { REPLY(msgo_analyzer_config((char *)name)); }
char *msmemscope_analyze(const char *name, const char *kwargs) { REPLY(msgo_analyze((char *)name, (char *)kwargs)); }

char *msmemscope_config(const char *items) { REPLY(msgo_config((char *)items)); }
char *msmemscope_get_config(void) { REPLY(msgo_get_config()); }
char *msmemscope_py_begin(void) { REPLY(msgo_py_begin()); }
char *msmemscope_py_start(void) { REPLY(msgo_py_start()); }
char *msmemscope_py_stop(void) { REPLY(msgo_py_stop()); }
char *msmemscope_dir(void) { REPLY(msgo_dir()); }

// Safe in a forked child too: a reply taken before the fork may be freed there.
void msmemscope_free_string(char *s) {
	ms_guard_enter();
	free(s);
	ms_guard_leave();
}

int msmemscope_interposed(void) { return msmemscope_in_child() ? -1 : ms_interposed(); }

int msmemscope_standalone(void) {
	if (msmemscope_in_child()) return -1;
	ms_guard_enter();
	int r = msgo_standalone();
	ms_guard_leave();
	return r;
}

char *msmemscope_window_begin(void) { REPLY(msgo_window_begin()); }
char *msmemscope_window_end(int top) { REPLY(msgo_window_end(top)); }

int msmemscope_exit_files(int on) {
	if (msmemscope_in_child()) return -1;
	ms_guard_enter();
	msgo_exit_files(on);
	ms_guard_leave();
	return 0;
}
