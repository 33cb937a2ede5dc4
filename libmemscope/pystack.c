// Python stacks from inside the hook (see pystack.h), CPython 3.10 to 3.13
// (pylayout.h). Everything here reads the calling thread's own interpreter
// state with plain loads: the thread is inside malloc, so it is not running
// Python code, and its frame chain is intact whether it holds the GIL or not
// (torch allocates with it released).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "hook.h"
#include "pylayout.h"
#include "pystack.h"
#include "records.h"

// exitscan.c: the code table holds code objects' addresses, never a root.
__attribute__((visibility("hidden"))) void own_note(void *p, size_t n);

// The interpreter's layout (pylayout.h), chosen once by ms_py_enable.
_Static_assert(PYLT_LOCATIONS == 0 && PYLT_PEP626 == 1, "pylayout.h writes the line table formats as numbers");
static const ms_pylayout *lay;

#define MAX_FILE 1024
#define MAX_NAME 256
#define MAX_QUALNAME 512
#define MAX_LINETABLE (1u << 18) // 8192 continuation records at most
#define MAX_WALK 100000 // frames walked at most (a cycle would be a bug; never loop forever)

#define HIDDEN __attribute__((visibility("hidden")))

HIDDEN int ms_py_depth;
// Python's symbols msmemscope reads, looked up once at load (the loader's
// constructor, before the program runs): a dl call later, on a program
// thread, would free that thread's pending dlerror() result (glibc keeps
// one per thread, freed at its next dl call, successful or not) with no
// FREE recorded: a block the program allocated would read as leaked.
static const char *const py_names[] = {"Py_IsInitialized", "Py_Version", "Py_GetVersion",
                                       "PyGILState_GetThisThreadState", "PyCode_Type", "PyUnicode_Type",
                                       "PyBytes_Type", "PyType_Type", "_Py_IsFinalizing", "Py_IsFinalizing",
                                       "Py_IsolatedFlag", "Py_IgnoreEnvironmentFlag", "Py_NoSiteFlag"};
enum { PY_IS_INIT, PY_VERSION_SYM, PY_GET_VERSION, PY_TSTATE, PY_CODE_TYPE, PY_UNICODE_TYPE, PY_BYTES_TYPE,
       PY_TYPE_TYPE, PY_IS_FIN_OLD, PY_IS_FIN, PY_FLAGS };
static void *py_syms[sizeof py_names / sizeof py_names[0]];
static int py_at_load; // Python was there when the library loaded: py_syms holds its symbols

// Python's symbol i: as looked up at load, or now for a Python loaded after
// msmemscope (an embedding program's dlopen).
static void *py_sym(int i) { return py_at_load ? py_syms[i] : dlsym(RTLD_DEFAULT, py_names[i]); }

static void *(*tstate_fn)(void); // PyGILState_GetThisThreadState
static int (*finalizing_fn)(void); // _Py_IsFinalizing (Py_IsFinalizing on 3.13)
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

// Code objects from files under these folders (msmemscope's package, torch's
// dispatch-mode module: msmemscope_python_package) are msmemscope's own:
// their frames are left out as a stack is taken, so that they do not use up
// its depth. The seen-set marks such a code object's id with CODE_SKIP.
#define CODE_SKIP (1u << 31)
#define SKIP_DIRS 8
#define SKIP_DIR_MAX 1024
static char skip_dir[SKIP_DIRS][SKIP_DIR_MAX];
static uint32_t skip_len[SKIP_DIRS];
static _Atomic int skip_n;
static atomic_flag skip_lock = ATOMIC_FLAG_INIT;

static int skipped_file(const char *f, uint32_t n) {
	int k = atomic_load_explicit(&skip_n, memory_order_acquire);
	for (int i = 0; i < k; i++)
		if (n >= skip_len[i] && !memcmp(f, skip_dir[i], skip_len[i])) return 1;
	return 0;
}

static inline uintptr_t ld(uintptr_t p) { return *(const uintptr_t *)p; }

static inline uint32_t fingerprint(const ms_pylayout *l, uintptr_t code) {
	uint64_t h = ld(code + l->co_linetable) * 0x9E3779B97F4A7C15ull;
	h ^= ld(code + l->co_filename) + (h << 6) + (h >> 2);
	h ^= ld(code + l->co_qualname) + (h << 6) + (h >> 2);
	h ^= (uint64_t)(uint32_t) * (const int32_t *)(code + l->co_firstlineno);
	h *= 0xff51afd7ed558ccdull;
	return (uint32_t)(h >> 32) | 1; // never 0
}

// Copies a str object as UTF-8 (at most cap bytes); returns the length.
static uint32_t str_utf8(const ms_pylayout *l, uintptr_t o, char *out, uint32_t cap) {
	if (!o || (o & 7) || ld(o + PYL_OB_TYPE) != unicode_type) return 0;
	uint32_t st = *(const uint32_t *)(o + l->str_state);
	int64_t len = *(const int64_t *)(o + l->str_length);
	if (!(st & l->st_compact) || len < 0) return 0;
	if (st & l->st_ascii) {
		uint32_t n = len < cap ? (uint32_t)len : cap;
		memcpy(out, (const char *)(o + l->str_ascii_data), n);
		return n;
	}
	const char *u8 = (const char *)ld(o + l->str_utf8);
	if (u8) {
		int64_t n8 = *(const int64_t *)(o + l->str_utf8_length);
		uint32_t n = n8 < cap ? (uint32_t)n8 : cap;
		memcpy(out, u8, n);
		return n;
	}
	int kind = (st >> l->st_kind_shift) & 7;
	const unsigned char *d = (const unsigned char *)(o + l->str_compact_data);
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
static uint32_t emit_code(const ms_pylayout *l, uintptr_t code) {
	uint32_t id = atomic_fetch_add_explicit(&next_id, 1, memory_order_relaxed);
	uintptr_t lt = ld(code + l->co_linetable);
	uint32_t ltlen = 0;
	if (lt && !(lt & 7) && ld(lt + PYL_OB_TYPE) == bytes_type) {
		int64_t n = *(const int64_t *)(lt + PYL_BYTES_SIZE);
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
	uint16_t flen = (uint16_t)str_utf8(l, ld(code + l->co_filename), p, MAX_FILE);
	p += flen;
	uint16_t nlen = (uint16_t)str_utf8(l, ld(code + l->co_name), p, MAX_NAME);
	p += nlen;
	uint16_t qlen = (uint16_t)str_utf8(l, ld(code + l->co_qualname), p, MAX_QUALNAME);
	p += qlen;
	if (ltlen) memcpy(p, (const char *)(lt + PYL_BYTES_DATA), ltlen);
	p += ltlen;
	int32_t first = l->co_firsttraceable >= 0 ? *(const int32_t *)(code + l->co_firsttraceable) : 0;
	enc_pycode_head(buf, id, *(const int32_t *)(code + l->co_firstlineno), first, flen, nlen, qlen,
	                (uint16_t)l->linetable_format, ltlen);
	uint32_t plen = (uint32_t)(p - buf);
	ms_emit(R_PYCODE, F_TEXT, id, plen, buf, plen);
	int skip = skipped_file(buf + sizeof(ms_pycode), flen);
	if (buf != local) syscall(SYS_munmap, buf, need);
	return skip ? id | CODE_SKIP : id;
}

// Frames from files under dir are msmemscope's own from now on. The code
// objects seen so far are forgotten, to be judged again (each gets a new id
// and R_PYCODE record).
HIDDEN void py_skip_add(const char *dir, uint32_t len) {
	if (!dir || !len || len >= SKIP_DIR_MAX) return;
	while (atomic_flag_test_and_set_explicit(&skip_lock, memory_order_acquire)) {
	}
	int k = atomic_load_explicit(&skip_n, memory_order_relaxed), known = 0;
	for (int i = 0; i < k; i++) known |= skip_len[i] == len && !memcmp(skip_dir[i], dir, len);
	if (!known && k < SKIP_DIRS) {
		memcpy(skip_dir[k], dir, len);
		skip_len[k] = len;
		atomic_store_explicit(&skip_n, k + 1, memory_order_release);
		if (seen)
			for (uint32_t i = 0; i < SLOTS; i++)
				if (atomic_load_explicit(&seen[i].key, memory_order_relaxed)) {
					atomic_store_explicit(&seen[i].val, 0, memory_order_relaxed);
					atomic_store_explicit(&seen[i].key, 0, memory_order_release);
				}
	}
	atomic_flag_clear_explicit(&skip_lock, memory_order_release);
}

static uint32_t code_id(const ms_pylayout *l, uintptr_t code) {
	uint32_t fp = fingerprint(l, code);
	uint64_t h = (uint64_t)code * 0x9E3779B97F4A7C15ull;
	uint32_t i = (uint32_t)(h >> 40);
	for (int probe = 0; probe < PROBES; probe++, i++) {
		slot *s = &seen[i & (SLOTS - 1)];
		uintptr_t k = atomic_load_explicit(&s->key, memory_order_acquire);
		if (k == 0) {
			uintptr_t zero = 0;
			if (atomic_compare_exchange_strong(&s->key, &zero, code)) {
				uint32_t id = emit_code(l, code);
				atomic_store_explicit(&s->val, (uint64_t)fp << 32 | id, memory_order_release);
				return id;
			}
			k = zero;
		}
		if (k != code) continue;
		uint64_t v = atomic_load_explicit(&s->val, memory_order_acquire);
		if (v == 0) return emit_code(l, code); // another thread is inserting it: a duplicate is harmless
		if ((uint32_t)(v >> 32) == fp) return (uint32_t)v;
		uint32_t id = emit_code(l, code); // a new code object at a reused address
		atomic_compare_exchange_strong(&s->val, &v, (uint64_t)fp << 32 | id);
		return id;
	}
	return emit_code(l, code); // neighbourhood full: correct, only slower
}

int ms_py_capture(uint64_t *out, int max) {
	void *(*fn)(void) = tstate_fn;
	if (!fn) return 0;
	const ms_pylayout *l = lay; // set before tstate_fn (ms_py_enable)
	// Once the interpreter finalizes, it frees other threads' states and
	// frame stacks while daemon threads may still run C code: no stacks.
	if (finalizing_fn && finalizing_fn()) return 0;
	uintptr_t ts = (uintptr_t)fn();
	if (!ts) return 0;
	uintptr_t f = ld(ts + l->ts_frame);
	if (l->cf_current_frame >= 0) f = f ? ld(f + l->cf_current_frame) : 0; // through _PyCFrame
	int n = 0;
	for (int walked = 0; f && n < max && walked < MAX_WALK; walked++, f = ld(f + l->fr_previous)) {
		if (f & 7) break;
		int owner = l->fr_owner >= 0 ? *(const char *)(f + l->fr_owner) : 0;
		// An entry shim (3.12 on) runs no Python code: skip it. So is a
		// 3.13 frame whose f_executable is not a code object.
		if (owner == l->owned_by_cstack) continue;
		uintptr_t code = ld(f + l->fr_code);
		if (!code || (code & 7) || ld(code + PYL_OB_TYPE) != code_type) continue;
		intptr_t lasti = l->instr_is_index ? *(const int32_t *)(f + l->fr_instr)
		                                   : ((intptr_t)ld(f + l->fr_instr) - (intptr_t)(code + l->co_code)) / 2;
		// A frame being set up has not reached its first traceable
		// instruction: Python itself leaves such frames out of tracebacks
		// (3.10 has no such marker: -1 keeps every frame).
		int first = l->co_firsttraceable >= 0 ? *(const int32_t *)(code + l->co_firsttraceable) : -1;
		if (owner != l->owned_by_generator && lasti < first) continue;
		uint32_t id = code_id(l, code);
		if (!(id & CODE_SKIP)) out[n++] = enc_pyframe(id, (int32_t)lasti); // (ours: not counted)
	}
	return n;
}

// major << 24 | minor << 16 from a version text such as "3.10.13 (main, ...)".
static unsigned long parse_version(const char *s) {
	unsigned long maj = 0, min = 0;
	if (!s || *s < '0' || *s > '9') return 0;
	while (*s >= '0' && *s <= '9') maj = maj * 10 + (unsigned long)(*s++ - '0');
	if (*s++ != '.' || *s < '0' || *s > '9') return 0;
	while (*s >= '0' && *s <= '9') min = min * 10 + (unsigned long)(*s++ - '0');
	return maj < 256 && min < 256 ? maj << 24 | min << 16 : 0;
}

unsigned long ms_py_version(void) {
	if (!py_version) {
		const unsigned long *v = py_sym(PY_VERSION_SYM); // 3.11 on
		if (v) {
			py_version = *v;
		} else {
			// Before 3.11: the version text (static strings only, no
			// interpreter state, so it answers before Py_Initialize too).
			const char *(*gv)(void) = (const char *(*)(void))py_sym(PY_GET_VERSION);
			if (gv) py_version = parse_version(gv());
		}
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
		void *fn = py_sym(PY_TSTATE);
		if (!fn) return -1;
		unsigned long v = ms_py_version() >> 16;
		const ms_pylayout *l = NULL;
		for (size_t i = 0; i < sizeof ms_pylayouts / sizeof ms_pylayouts[0]; i++)
			if (ms_pylayouts[i].version == v) l = &ms_pylayouts[i];
		if (!l) return -2;
		code_type = (uintptr_t)py_sym(PY_CODE_TYPE);
		unicode_type = (uintptr_t)py_sym(PY_UNICODE_TYPE);
		bytes_type = (uintptr_t)py_sym(PY_BYTES_TYPE);
		uintptr_t type_type = (uintptr_t)py_sym(PY_TYPE_TYPE);
		finalizing_fn = (int (*)(void))py_sym(PY_IS_FIN_OLD);
		if (!finalizing_fn) finalizing_fn = (int (*)(void))py_sym(PY_IS_FIN); // 3.13
		if (!code_type || !unicode_type || !bytes_type || !type_type) return -1;
		// A free-threaded or Py_TRACE_REFS build moves ob_type (and more):
		// the tables describe the default build only.
		if (ld(code_type + PYL_OB_TYPE) != type_type) return -3;
		if (!seen) {
			void *m = (void *)syscall(SYS_mmap, 0, SLOTS * sizeof(slot), PROT_READ | PROT_WRITE,
			                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
			if (m == MAP_FAILED) return -1;
			own_note(m, SLOTS * sizeof(slot));
			seen = m;
		}
		lay = l;
		atomic_thread_fence(memory_order_release);
		tstate_fn = (void *(*)(void))fn;
	}
	ms_py_depth = depth;
	ms_fast_update();
	return 1;
}

int ms_py_event(uint16_t kind, uint64_t a, const char *text, uint32_t len) {
	if (msmemscope_in_child()) return -1;
	ms_guard_enter();
	ms_emit(kind, text ? F_TEXT : 0, a, len, text, len);
	ms_guard_leave();
	return 0;
}

int ms_py_present(void) { return py_at_load; }

int ms_py_flag(int i) {
	const int *p = py_at_load && i >= 0 && i < 3 ? py_syms[PY_FLAGS + i] : NULL;
	return p ? *p : 0;
}

// Learn at load time, inside the loader, whether this copy interposes (see
// ms_interposed): later, from a Go thread, dlopen could wait on the loader
// lock of a thread that is waiting for Go. Python's symbols too (py_syms).
__attribute__((constructor(102))) static void py_ctor(void) {
	ms_guard_enter();
	ms_interposed();
	if (dlsym(RTLD_DEFAULT, py_names[PY_IS_INIT])) {
		for (size_t i = 0; i < sizeof py_names / sizeof py_names[0]; i++)
			py_syms[i] = dlsym(RTLD_DEFAULT, py_names[i]);
		py_at_load = 1;
	}
	// A failed lookup left its error: read and freed here, so that the
	// program's dlerror() never tells of it.
	dlerror();
	dlerror();
	ms_guard_leave();
}
