// Python stacks read from inside the hook (DESIGN.md, rule 7): the calling
// thread's own CPython frames (3.10 to 3.13, layouts in pylayout.h), kept as (code id, instruction) pairs; each
// code object's names and line table go to the spool once, as an R_PYCODE
// record, and line numbers are computed when files are written (Go:
// spool/pycode.go). Their encoders are in records.h.
//
// A MALLOC record with F_PYSTACK carries the payload
//
//	uint64 {n_c | n_py << 32}, n_c return addresses, n_py frames
//
// where a frame is uint64 {code id | (uint32)instruction << 32}, innermost
// first; the instruction is the frame's index in code units of the
// instruction it executes (f_lasti on 3.10; prev_instr or instr_ptr minus the
// start of the code from 3.11 on; -1 before the first instruction on 3.10 to
// 3.12). The R_PYCODE record says how to read its line table.
#ifndef MEMSCOPE_PYSTACK_H
#define MEMSCOPE_PYSTACK_H

#include <stdint.h>

// The R_PYCODE payload is ms_pycode (format/records.def) then the file name,
// name, qualified name and the line table (co_linetable bytes), unpadded.

// Python stack depth; 0 when off. Read by the hook (hooks.c, rec_alloc).
extern int ms_py_depth;

// Switches Python stacks on with the given depth (0: off). Returns 1 when on,
// 0 when off, -1 when no CPython is in the process, -2 when its version has
// no supported frame layout (ms_py_version tells which), -3 when the build's
// object layout is not the default one (free-threaded, Py_TRACE_REFS).
int ms_py_enable(int depth);
// ms_py_version: major << 24 | minor << 16 (Py_Version's form); 0 if unknown.
unsigned long ms_py_version(void);

// Fills out with up to max frames of the calling thread, innermost first.
// Runs inside the hook: no allocation, no Python API that could allocate or
// take a lock. The caller holds the reentrancy guard.
int ms_py_capture(uint64_t *out, int max);
// py_skip_add: frames from files under dir (len bytes) are left out of
// stacks from now on (msmemscope_python_package).
void py_skip_add(const char *dir, uint32_t len);

// In lifecycle.c: appends an event stamped now to the calling thread's ring
// (caller holds the reentrancy guard).
void ms_emit(uint16_t kind, uint16_t flags, uint64_t a, uint64_t b, const void *payload, uint32_t plen);
// In lifecycle.c: applies a configuration change (msmemscope.config()).
void ms_set_hook(int heap, int cstack);
void ms_set_cuda(uint32_t mask, int kernel); // cuda.c
// In lifecycle.c: whether this copy of the library interposes the allocator (it
// was preloaded or linked), as opposed to loaded later with dlopen.
int ms_interposed(void);

// A text event from the Python API (R_PYSKIP, R_CONFIG, R_DESCRIBE,
// R_OWNER_PUSH, R_OWNER_POP); -1 in a forked child.
int ms_py_event(uint16_t kind, uint64_t a, const char *text, uint32_t len);
// Whether a CPython interpreter is linked into the process.
int ms_py_present(void);
// ms_py_flag: CPython's Py_IsolatedFlag (0), Py_IgnoreEnvironmentFlag (1) or
// Py_NoSiteFlag (2), as looked up when the library loaded (0: no Python then).
int ms_py_flag(int i);

// Public (include/msmemscope.h is not extended: these serve the Python
// package); in capi_shims.c.
int msmemscope_describe(uint64_t addr, const char *owner);
int msmemscope_describe_push(const char *owner);
int msmemscope_describe_pop(void);
int msmemscope_python_package(const char *dir);

#endif
