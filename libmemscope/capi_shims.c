// The public C API (include/msmemscope.h) that needs no Go: C shims that
// never enter Go in a forked child.
#include "internal.h"

static int api_event(uint16_t kind, uint16_t flags, uint64_t a, const char *text) {
	if (in_child()) return -1;
	ready();
	guard_up();
	uint32_t len = text ? (uint32_t)strnlen(text, 4000) : 0;
	emit(kind, flags | (text ? F_TEXT : 0), stamp_after(), a, len, text, len);
	guard_down();
	return 0;
}

int msmemscope_start(void) {
	if (in_child()) return -1;
	ready();
	if (atomic_exchange(&ms_collecting, 1)) return 0;
	ms_fast_update();
	int r = api_event(R_START, 0, 0, NULL);
	ms_cuda_snapshot();
	return r;
}

int msmemscope_stop(void) {
	if (in_child()) return -1;
	ready();
	if (!atomic_load(&ms_collecting)) return 0;
	ms_cuda_snapshot(); // before collection stops: its row is still written
	if (!atomic_exchange(&ms_collecting, 0)) return 0;
	ms_fast_update();
	return api_event(R_STOP, 0, 0, NULL);
}

int msmemscope_step(void) {
	int r = api_event(R_STEP, 0, 0, NULL);
	ms_cuda_snapshot();
	return r;
}

void mstxMarkA(const char *msg, void *stream) {
	(void)stream;
	api_event(R_MARK, 0, atomic_fetch_add(&ms_mstx_next, 1), msg ? msg : "");
}

uint64_t mstxRangeStartA(const char *msg, void *stream) {
	(void)stream;
	uint64_t id = atomic_fetch_add(&ms_mstx_next, 1);
	if (api_event(R_RSTART, 0, id, msg ? msg : "")) return 0;
	// A step (mstx's or NVTX's "step start" range) brings its device
	// SNAPSHOT, as msmemscope_step() does: programs that mark steps so get
	// decompose's context_inferred line too.
	if (msg && !strcmp(msg, "step start")) ms_cuda_snapshot();
	return id;
}

void mstxRangeEnd(uint64_t id) { api_event(R_REND, 0, id, NULL); }

// PyTorch events (R_OP_START..R_TAG) from the Python package: text payload.
int msmemscope_torch_event(uint16_t kind, uint64_t a, const char *payload, uint32_t len) {
	if (kind < R_OP_START || kind > R_TAG || in_child()) return -1;
	// Operator launches and watch results while collection is off (the
	// hooks stay installed between stop() and start()) make no rows.
	if ((kind == R_OP_START || kind == R_OP_END || kind == R_WATCH) && !atomic_load_explicit(&ms_collecting, memory_order_relaxed))
		return 0;
	ready();
	guard_up();
	emit(kind, payload ? F_TEXT : 0, stamp_after(), a, len, payload, payload ? len : 0);
	guard_down();
	return 0;
}

int msmemscope_torch_op(int kind, int n, const char *payload, int len) {
	int rc = kind < 0 || n < 0 || len < 0 ? -1 : msmemscope_torch_event((uint16_t)kind, (uint64_t)n, payload, (uint32_t)len);
	if (!in_child() && ms_tls.own > 0) own_down();
	return rc;
}

int msmemscope_in_child(void) { return in_child(); }

int msmemscope_own(int on) {
	if (in_child()) return -1;
	ready();
	if (on) own_up();
	else if (ms_tls.own > 0) own_down();
	else return -1;
	return 0;
}

// ---- public C API for msmemscope.describe: C shims, safe in a forked child ----
int msmemscope_describe(uint64_t addr, const char *owner) {
	return ms_py_event(R_DESCRIBE, addr, owner, owner ? (uint32_t)strnlen(owner, 1000) : 0);
}
int msmemscope_describe_push(const char *owner) {
	return ms_py_event(R_OWNER_PUSH, 0, owner, owner ? (uint32_t)strnlen(owner, 1000) : 0);
}
int msmemscope_describe_pop(void) { return ms_py_event(R_OWNER_POP, 0, NULL, 0); }
// Frames from files under this folder are msmemscope's own: left out of stacks.
int msmemscope_python_package(const char *dir) {
	uint32_t n = dir ? (uint32_t)strnlen(dir, 4000) : 0;
	if (in_child()) return -1; // (refused there, as ms_py_event refuses it: nothing changed)
	py_skip_add(dir, n);
	return ms_py_event(R_PYSKIP, 0, dir, n);
}
