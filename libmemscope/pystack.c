// Python stacks from inside the hook (see pystack.h). Everything here reads
// the calling thread's own interpreter state with plain loads: the thread is
// inside malloc, so it is not running Python code, and its frame chain is
// intact whether it holds the GIL or not (torch allocates with it released).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "hook.h"
#include "pystack.h"
#include "records.h"

// exitscan.c: the code table holds code objects' addresses, never a root.
__attribute__((visibility("hidden"))) void own_note(void *p, size_t n);

// CPython 3.11 layouts (x86-64), checked against the 3.11 headers by
// python/tests/test_layout.py.
#define TS_CFRAME 56          // PyThreadState.cframe
#define CF_CURRENT_FRAME 8    // _PyCFrame.current_frame
#define FR_CODE 32            // _PyInterpreterFrame.f_code
#define FR_PREVIOUS 48        // _PyInterpreterFrame.previous
#define FR_PREV_INSTR 56      // _PyInterpreterFrame.prev_instr
#define FR_OWNER 69           // _PyInterpreterFrame.owner
#define OWNED_BY_GENERATOR 1  // FRAME_OWNED_BY_GENERATOR
#define OB_TYPE 8             // PyObject.ob_type
#define CO_FIRSTLINENO 72     // PyCodeObject.co_firstlineno
#define CO_FILENAME 112
#define CO_NAME 120
#define CO_QUALNAME 128
#define CO_LINETABLE 136
#define CO_FIRSTTRACEABLE 168 // PyCodeObject._co_firsttraceable
#define CO_CODE 184           // PyCodeObject.co_code_adaptive
#define STR_LENGTH 16         // PyASCIIObject.length
#define STR_STATE 32          // PyASCIIObject.state
#define STR_ASCII_DATA 48     // sizeof(PyASCIIObject)
#define STR_UTF8_LENGTH 48    // PyCompactUnicodeObject.utf8_length
#define STR_UTF8 56           // PyCompactUnicodeObject.utf8
#define STR_COMPACT_DATA 72   // sizeof(PyCompactUnicodeObject)
#define ST_KIND(s) (((s) >> 2) & 7)
#define ST_COMPACT 0x20
#define ST_ASCII 0x40
#define BYTES_SIZE 16         // PyVarObject.ob_size
#define BYTES_DATA 32         // PyBytesObject.ob_sval

#define MAX_FILE 1024
#define MAX_NAME 256
#define MAX_QUALNAME 512
#define MAX_LINETABLE (1u << 18) // 8192 continuation records at most
#define MAX_WALK 100000 // frames walked at most (a cycle would be a bug; never loop forever)

#define HIDDEN __attribute__((visibility("hidden")))

HIDDEN int ms_py_depth;
static void *(*tstate_fn)(void); // PyGILState_GetThisThreadState
static int (*finalizing_fn)(void); // _Py_IsFinalizing
static uintptr_t code_type, unicode_type, bytes_type;
static unsigned long py_version;

// ---- seen-set: code object -> id, lock-free, in mmap'd memory ----
// A slot holds the code object's address and {fingerprint << 32 | id}. The
// fingerprint (its names' and line table's addresses, first line) tells a
// new code object at a reused address from the old one: it gets a new id.
#define SLOTS (1u << 18)
#define PROBES 64
typedef struct {
	_Atomic uintptr_t key;
	_Atomic uint64_t val;
} slot;
static slot *seen;
static _Atomic uint32_t next_id = 1;

static inline uintptr_t ld(uintptr_t p) { return *(const uintptr_t *)p; }

static inline uint32_t fingerprint(uintptr_t code) {
	uint64_t h = ld(code + CO_LINETABLE) * 0x9E3779B97F4A7C15ull;
	h ^= ld(code + CO_FILENAME) + (h << 6) + (h >> 2);
	h ^= ld(code + CO_QUALNAME) + (h << 6) + (h >> 2);
	h ^= (uint64_t)(uint32_t) * (const int32_t *)(code + CO_FIRSTLINENO);
	h *= 0xff51afd7ed558ccdull;
	return (uint32_t)(h >> 32) | 1; // never 0
}

// Copies a str object as UTF-8 (at most cap bytes); returns the length.
static uint32_t str_utf8(uintptr_t o, char *out, uint32_t cap) {
	if (!o || (o & 7) || ld(o + OB_TYPE) != unicode_type) return 0;
	uint32_t st = *(const uint32_t *)(o + STR_STATE);
	int64_t len = *(const int64_t *)(o + STR_LENGTH);
	if (!(st & ST_COMPACT) || len < 0) return 0;
	if (st & ST_ASCII) {
		uint32_t n = len < cap ? (uint32_t)len : cap;
		memcpy(out, (const char *)(o + STR_ASCII_DATA), n);
		return n;
	}
	const char *u8 = (const char *)ld(o + STR_UTF8);
	if (u8) {
		int64_t n8 = *(const int64_t *)(o + STR_UTF8_LENGTH);
		uint32_t n = n8 < cap ? (uint32_t)n8 : cap;
		memcpy(out, u8, n);
		return n;
	}
	int kind = ST_KIND(st);
	const unsigned char *d = (const unsigned char *)(o + STR_COMPACT_DATA);
	uint32_t n = 0;
	for (int64_t i = 0; i < len; i++) {
		uint32_t c = kind == 1 ? d[i] : kind == 2 ? ((const uint16_t *)d)[i] : ((const uint32_t *)d)[i];
		char b[4];
		uint32_t k;
		if (c < 0x80) {
			b[0] = (char)c, k = 1;
		} else if (c < 0x800) {
			b[0] = (char)(0xC0 | c >> 6), b[1] = (char)(0x80 | (c & 63)), k = 2;
		} else if (c < 0x10000) {
			b[0] = (char)(0xE0 | c >> 12), b[1] = (char)(0x80 | ((c >> 6) & 63)), b[2] = (char)(0x80 | (c & 63)), k = 3;
		} else {
			b[0] = (char)(0xF0 | c >> 18), b[1] = (char)(0x80 | ((c >> 12) & 63)), b[2] = (char)(0x80 | ((c >> 6) & 63));
			b[3] = (char)(0x80 | (c & 63)), k = 4;
		}
		if (n + k > cap) break;
		memcpy(out + n, b, k);
		n += k;
	}
	return n;
}

// Writes the code object's R_PYCODE record under a new id.
static uint32_t emit_code(uintptr_t code) {
	uint32_t id = atomic_fetch_add_explicit(&next_id, 1, memory_order_relaxed);
	uintptr_t lt = ld(code + CO_LINETABLE);
	uint32_t ltlen = 0;
	if (lt && !(lt & 7) && ld(lt + OB_TYPE) == bytes_type) {
		int64_t n = *(const int64_t *)(lt + BYTES_SIZE);
		ltlen = n < 0 ? 0 : n > MAX_LINETABLE ? MAX_LINETABLE : (uint32_t)n;
	}
	size_t need = sizeof(ms_pycode) + MAX_FILE + MAX_NAME + MAX_QUALNAME + ltlen;
	char local[4096];
	char *buf = local;
	if (need > sizeof local) {
		// Rare (a long module): a private mapping, never the heap we measure.
		void *m = (void *)syscall(SYS_mmap, 0, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (m == MAP_FAILED) {
			ltlen = 0; // names only: lines fall back to the first line
			need = sizeof(ms_pycode) + MAX_FILE + MAX_NAME + MAX_QUALNAME;
		} else {
			buf = m;
		}
	}
	char *p = buf + sizeof(ms_pycode);
	uint16_t flen = (uint16_t)str_utf8(ld(code + CO_FILENAME), p, MAX_FILE);
	p += flen;
	uint16_t nlen = (uint16_t)str_utf8(ld(code + CO_NAME), p, MAX_NAME);
	p += nlen;
	uint16_t qlen = (uint16_t)str_utf8(ld(code + CO_QUALNAME), p, MAX_QUALNAME);
	p += qlen;
	if (ltlen) memcpy(p, (const char *)(lt + BYTES_DATA), ltlen);
	p += ltlen;
	enc_pycode_head(buf, id, *(const int32_t *)(code + CO_FIRSTLINENO), *(const int32_t *)(code + CO_FIRSTTRACEABLE),
	                flen, nlen, qlen, PYLT_LOCATIONS, ltlen);
	uint32_t plen = (uint32_t)(p - buf);
	ms_emit(R_PYCODE, F_TEXT, id, plen, buf, plen);
	if (buf != local) syscall(SYS_munmap, buf, need);
	return id;
}

static uint32_t code_id(uintptr_t code) {
	uint32_t fp = fingerprint(code);
	uint64_t h = (uint64_t)code * 0x9E3779B97F4A7C15ull;
	uint32_t i = (uint32_t)(h >> 40);
	for (int probe = 0; probe < PROBES; probe++, i++) {
		slot *s = &seen[i & (SLOTS - 1)];
		uintptr_t k = atomic_load_explicit(&s->key, memory_order_acquire);
		if (k == 0) {
			uintptr_t zero = 0;
			if (atomic_compare_exchange_strong(&s->key, &zero, code)) {
				uint32_t id = emit_code(code);
				atomic_store_explicit(&s->val, (uint64_t)fp << 32 | id, memory_order_release);
				return id;
			}
			k = zero;
		}
		if (k != code) continue;
		uint64_t v = atomic_load_explicit(&s->val, memory_order_acquire);
		if (v == 0) return emit_code(code); // another thread is inserting it: a duplicate is harmless
		if ((uint32_t)(v >> 32) == fp) return (uint32_t)v;
		uint32_t id = emit_code(code); // a new code object at a reused address
		atomic_compare_exchange_strong(&s->val, &v, (uint64_t)fp << 32 | id);
		return id;
	}
	return emit_code(code); // neighbourhood full: correct, only slower
}

int ms_py_capture(uint64_t *out, int max) {
	void *(*fn)(void) = tstate_fn;
	if (!fn) return 0;
	// Once the interpreter finalizes, it frees other threads' states and
	// frame stacks while daemon threads may still run C code: no stacks.
	if (finalizing_fn && finalizing_fn()) return 0;
	uintptr_t ts = (uintptr_t)fn();
	if (!ts) return 0;
	uintptr_t cf = ld(ts + TS_CFRAME);
	if (!cf) return 0;
	uintptr_t f = ld(cf + CF_CURRENT_FRAME);
	int n = 0;
	for (int walked = 0; f && n < max && walked < MAX_WALK; walked++) {
		if (f & 7) break;
		uintptr_t code = ld(f + FR_CODE);
		if (!code || (code & 7) || ld(code + OB_TYPE) != code_type) break;
		intptr_t lasti = ((intptr_t)ld(f + FR_PREV_INSTR) - (intptr_t)(code + CO_CODE)) / 2;
		int first = *(const int32_t *)(code + CO_FIRSTTRACEABLE);
		// A frame being set up has not reached its first traceable
		// instruction: Python itself leaves such frames out of tracebacks.
		if (*(const char *)(f + FR_OWNER) == OWNED_BY_GENERATOR || lasti >= first) {
			uint32_t id = code_id(code);
			out[n++] = enc_pyframe(id, (int32_t)lasti);
		}
		f = ld(f + FR_PREVIOUS);
	}
	return n;
}

unsigned long ms_py_version(void) {
	if (!py_version) {
		const unsigned long *v = dlsym(RTLD_DEFAULT, "Py_Version");
		if (v) py_version = *v;
	}
	return py_version;
}

int ms_py_enable(int depth) {
	if (depth <= 0) {
		ms_py_depth = 0;
		ms_fast_update();
		return 0;
	}
	if (!tstate_fn) {
		void *fn = dlsym(RTLD_DEFAULT, "PyGILState_GetThisThreadState");
		if (!fn) return -1;
		unsigned long v = ms_py_version(); // Py_Version exists from 3.11 on
		if ((v >> 16) != 0x030B) return -2;
		code_type = (uintptr_t)dlsym(RTLD_DEFAULT, "PyCode_Type");
		unicode_type = (uintptr_t)dlsym(RTLD_DEFAULT, "PyUnicode_Type");
		bytes_type = (uintptr_t)dlsym(RTLD_DEFAULT, "PyBytes_Type");
		finalizing_fn = (int (*)(void))dlsym(RTLD_DEFAULT, "_Py_IsFinalizing");
		if (!code_type || !unicode_type || !bytes_type) return -1;
		if (!seen) {
			void *m = (void *)syscall(SYS_mmap, 0, SLOTS * sizeof(slot), PROT_READ | PROT_WRITE,
			                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
			if (m == MAP_FAILED) return -1;
			own_note(m, SLOTS * sizeof(slot));
			seen = m;
		}
		atomic_thread_fence(memory_order_release);
		tstate_fn = (void *(*)(void))fn;
	}
	ms_py_depth = depth;
	ms_fast_update();
	return 1;
}

int ms_py_event(uint16_t kind, uint64_t a, const char *text, uint32_t len) {
	if (ms_is_child()) return -1;
	ms_guard_enter();
	ms_emit(kind, text ? F_TEXT : 0, a, len, text, len);
	ms_guard_leave();
	return 0;
}

int ms_py_present(void) { return dlsym(RTLD_DEFAULT, "Py_IsInitialized") != NULL; }

// Learn at load time, inside the loader, whether this copy interposes (see
// ms_interposed): later, from a Go thread, dlopen could wait on the loader
// lock of a thread that is waiting for Go.
__attribute__((constructor(102))) static void py_ctor(void) {
	ms_guard_enter();
	ms_interposed();
	ms_guard_leave();
}
