// What the native files share (DESIGN.md, "Rules of the hot path"):
//
//   hooks.c       the interposed allocator symbols and their fast path
//   ring.c        per-thread rings of segments, the general event writer
//   stacks.c      C stack capture, stack and allocation-site interning
//   drain.c       the drain (rings -> spool or memory) and its thread
//   lifecycle.c   init, pthread_create/fork/exec wrappers, the run's end
//   crash.c       crash signals: the final drain in a handler, then the program's
//                 own handler or the default action
//   capi_shims.c  the public C functions that never enter Go
//   records.h     the record encoders (the layout: format/records.def)
//
// cgo compiles each .c file on its own: what the fast path calls is inline
// here, and state shared between files is hidden (never exported from the
// library). Nothing here calls into Go, allocates through the interposed
// functions, or takes a lock that a hook could wait on.
#ifndef MEMSCOPE_INTERNAL_H
#define MEMSCOPE_INTERNAL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#include "hook.h"
#include "pystack.h"
#include "records.h"

#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)
#define HIDDEN __attribute__((visibility("hidden")))
#define TLS_ATTR __attribute__((visibility("hidden"), tls_model("initial-exec")))

// glibc's allocator, reached by address (libc.c): msmemscope defines
// __libc_malloc and its family itself, as valgrind replaces them (a program
// may call them by name), so its own calls by those names would come back
// to it. Each starts as a stub that finds glibc's, then calls it: the hooks
// make one indirect call, as they made one through the PLT.
typedef struct {
	void *(*malloc)(size_t);
	void (*free)(void *);
	void *(*calloc)(size_t, size_t);
	void *(*realloc)(void *, size_t);
	void *(*memalign)(size_t, size_t);
	void *(*valloc)(size_t);
	void *(*pvalloc)(size_t);
} ms_libc_fns;
extern ms_libc_fns ms_libc HIDDEN;
HIDDEN void *libc_text(void); // an address in the allocator's text (glibc's)
extern void *__libc_stack_end;

// This library's own text, for telling its threads and frames apart.
extern const char __ehdr_start[] HIDDEN;
extern const char _etext[] HIDDEN;

// ---- configuration (MSMEMSCOPE_HOOK, parsed on the first hook call; lifecycle.c) ----
extern HIDDEN int cfg_heap;     // record the host heap
extern HIDDEN int cfg_cstack;   // C stack depth
extern HIDDEN int cfg_deferred;
extern HIDDEN uint32_t cfg_cuda; // CUDA ordinals recorded, one bit each (cuda.c)
extern HIDDEN int cfg_kernel;    // CUDA kernel launches recorded
void ms_cuda_snapshot(void);     // cuda.c: a SNAPSHOT row of the current CUDA device
// cuda_vmm.c: VMM handles' devices and the mappings of cuMemMap
HIDDEN void vmm_handle_put(uint64_t h, uint64_t dev);
HIDDEN void vmm_handle_drop(uint64_t h);
HIDDEN int vmm_handle_dev(uint64_t h, uint64_t *dev);
HIDDEN void vmm_map_put(uint64_t va, uint64_t size, uint64_t h, uint64_t dev);
HIDDEN int vmm_map_take(uint64_t va, uint64_t size, uint64_t *h, uint64_t *dev);

// ---- global state (lifecycle.c) ----
extern HIDDEN _Atomic int ms_state;      // 0 new, 1 initializing, 2 ready
extern HIDDEN _Atomic int ms_active;     // hooks record (heap events wanted, not a child)
extern HIDDEN _Atomic int ms_collecting; // collection switched on
extern HIDDEN _Atomic int ms_direct;     // after the final drain: write straight to the spool
extern HIDDEN int ms_rotating;           // rotating logs (ms_set_rotating): no short MALLOCs, no stack ids
extern HIDDEN _Atomic int ms_precise;    // two threads record: every MALLOC and FREE has a precise stamp (ring.c)
extern HIDDEN _Atomic uint64_t ms_fork_count;
extern HIDDEN _Atomic uint64_t ms_mstx_next;
extern HIDDEN int ms_use_tsc;
extern HIDDEN int ms_child; // in a forked child: never record, never enter Go
extern HIDDEN pid_t ms_mypid;
extern HIDDEN pthread_key_t ms_key;
// drain.c
extern HIDDEN _Atomic int ms_spool_fd;
extern HIDDEN pthread_mutex_t ms_drain_lock;
// ring.c
extern HIDDEN _Atomic uint64_t ms_lost_count;

// The hot path's gate (hooks.c): the fast tag in the top 16 bits, the drain
// epoch in the low 48 (G_EPOCH). The tag is nonzero while the fast path may
// run (ready, recording the heap, no stacks wanted, not writing directly; see
// ms_fast_update): enc_tag(flags) | C_SHORT where the short forms may be
// written.
// The epoch (~1 ms) is bumped by each drain pass. A thread stamps its first
// event of an epoch, and one every STAMP_UNITS units of its ring (2 KiB:
// 128 to 512 events), with the TSC; other events carry TS_EPOCH|epoch and the
// reader interpolates their time. A TSC read costs about as much as a whole
// malloc/free pair on some virtual machines.
// A thread's fast path runs while the gate equals its own copy (ms_thr.gate,
// taken in the general path): one test for both.
extern HIDDEN _Atomic uint64_t ms_gate;
#define G_EPOCH ((1ull << 48) - 1)
#define G_PRECISE C_FREE // in the tag: a stamp unit goes before each fast record (ms_precise)
#define G_STACKS ((uint64_t)F_CSTACK << 48) // in the tag: MALLOCs want stacks (the general path); never in a fast record
#define STAMP_UNITS 256

// ---- per-thread state: keep the TLS block small (DESIGN: < 1 KiB free after torch) ----
// A segment is one mapping: a page of bookkeeping, then its data, which
// starts with room for a spool chunk header. A filled segment goes to the
// spool as it lies, by direct I/O (see drain.c): no copy through the page
// cache, whose cost per event is as large as the hook's own on a fast machine.
#define SEG_META 4096  // bookkeeping page: hdr, the data's start, is page-aligned
#define DIO_ALIGN 4096 // direct I/O offsets, lengths and buffers are multiples of this
typedef struct ms_seg {
	struct ms_seg *_Atomic next;
	uint32_t cap;          // units
	_Atomic uint32_t head; // units written, set by the owner when it moves on (else see ms_thr.wp)
	uint32_t tail;         // read by the drain
	uint32_t pad;
	size_t bytes;          // the whole mapping
	char meta_rest[SEG_META - 32];
	ms_chunk hdr;          // filled in by the drain for a direct write
	uint64_t u[];
} ms_seg;
_Static_assert(offsetof(ms_seg, hdr) == SEG_META, "segment data must start on a page");

#define SEG_MAP (2u << 20)                // a segment's mapping: a huge page's size
#define SEG_BYTES (SEG_MAP - SEG_META)    // its data part
#define SEG_FIRST ((1u << 20) - SEG_META) // a thread's first segment: 1 MiB in all, small pages
// Units a segment of data size d holds: the chunk header, then room to pad
// the last unit out to DIO_ALIGN with a padding chunk (at most DIO_ALIGN + 8).
#define SEG_UNITS(d) (((d) - sizeof(ms_chunk) - DIO_ALIGN - 8) / 8)
#define SEG_CAP SEG_UNITS(SEG_BYTES)
#define SEG_WAIT_CAP 256 // segments pending per thread (512 MiB) before a writer waits for the drain
#define SEG_WAIT_CAP_ROTATE 2 // the same with rotating logs (4 MiB)

// Drained segments kept for reuse, so that a thread whose drain lags (the
// disk is slower than the program) does not take fresh, zeroed memory for
// every segment: up to NSPARE a thread, SPARE_MAX in all.
#define NSPARE 8
#define SPARE_MAX 32
extern HIDDEN _Atomic int spare_total;
#define STK_MEMO 16
typedef struct ms_thr {
	// The owner's line: what every event reads and writes.
	uint64_t *_Atomic wp; // next unit to write in wseg (published: the drain reads up to it)
	uint64_t *flim;       // the fast path writes at w < flim only: a unit short of wend, or of where a precise stamp is due
	uint64_t *wend;       // end of wseg
	ms_seg *wseg;         // owner's current segment
	uint64_t gate;        // ms_gate as the fast path may write under it (its epoch said, its tag on), else 0
	int32_t tid;
	uint32_t half;     // 1: *wp holds a pair unit's first half, not yet published (see put_half)
	uintptr_t last_ra; // call site of this thread's last MALLOC record when the fast path wrote it, else 0
	uint64_t last_ptr; // address of this thread's last compact record (pair halves are relative to it)
	// The drain's side, on a line of its own.
	_Alignas(64) struct ms_thr *next_all; // registry, push-only
	uintptr_t stack_hi;  // frame-pointer walks stay below this (the owner's, set once)
	uintptr_t stack_lo;  // its stack's lowest address, 0 unknown (the leak scan leaves a dead thread's out)
	uint64_t last_epoch; // the owner's: the epoch its last R_EPOCH said
	int precise_seen;    // the owner's: ms_precise as its last stamp saw it
	uint64_t last_stamp; // the owner's: the stamp of its last stamp unit or stamped half
	uintptr_t fpl_ra;    // the owner's: the caller of its last C stack's allocation (stacks.c)...
	uint32_t fpl_gen;    // ... the generation of the answers it was given in (code_gen)...
	int fpl;             // ... and whether its function keeps no frame pointer
	int stk_n;                 // the owner's: its last interned C stack (stacks.c), up to STK_MEMO frames...
	uint32_t stk_id;           // ... its id...
	uintptr_t stk_f[STK_MEMO]; // ... and its frames (a loop allocating from one place repeats them)
	_Atomic uint32_t state; // THR_* in the low 2 bits; above them, how many times the ring changed owner
	ms_seg *rseg;        // drain's current segment
	_Atomic uint64_t segs; // segments allocated and not yet released
	ms_seg *_Atomic spare[NSPARE]; // drained segments handed back for reuse
	uint64_t wait_since; // when the drain first saw the current segment's undrained tail
} ms_thr;
_Static_assert(sizeof(ms_thr) <= 4096, "a thread's state is one page (ring.c)");

extern HIDDEN ms_thr *_Atomic ms_threads;

// ms_thr.state. A thread that ends gives its ring up (DEAD) and may take it
// back for what it records after (thr_acquire). Each taking counts in the
// upper bits, so that a compare-and-swap on the whole word fails once the
// ring changed hands: the ending thread takes back only the ring it gave up
// (not one the drain released, another thread took and gave up meanwhile),
// and the drain releases only a ring drained since it was given up.
enum { THR_OWNED, THR_DEAD, THR_FREE, THR_RELEASING };
#define THR_STATE(v) ((v) & 3u)
#define THR_WITH(v, st) (((v) & ~3u) | (st))
static inline uint32_t thr_state(ms_thr *t) { return THR_STATE(atomic_load_explicit(&t->state, memory_order_acquire)); }

// One TLS block, so the hot path finds it with one offset (ring.c).
typedef struct {
	ms_thr *fast; // thr while guard is 0, else NULL: the fast path's one test
	ms_thr *thr;
	int guard;    // >0: inside msmemscope (or an internal thread): invisible
	int own;      // >0: msmemscope's own work (msmemscope_own): recorded F_OWN, never the fast path
	ms_thr *prev; // the ring this thread gave up at its end (thr_key_dtor)
	uint32_t prev_state; // prev's state as it gave it up
	void *alt;    // the alternate signal stack crash.c gave this thread, or NULL
	uintptr_t frames_top; // a program thread's: above its start routine's frame (lifecycle.c), 0 unknown
} ms_tls_t;
extern __thread ms_tls_t ms_tls TLS_ATTR;
#define INTERNAL_GUARD (1 << 20) // the guard of a thread this library started, for life
#define tls_thr ms_tls.thr
#define tls_guard ms_tls.guard
static inline void sleep_ns(long ns) { // ns < 1 s
	struct timespec ts = {0, ns};
	nanosleep(&ts, NULL);
}
static inline void guard_up(void) {
	ms_tls.guard++;
	ms_tls.fast = NULL;
}
static inline void guard_down(void) {
	if (--ms_tls.guard == 0 && !ms_tls.own) ms_tls.fast = ms_tls.thr;
}
// msmemscope's own work on this thread (msmemscope_own): recorded F_OWN.
static inline void own_up(void) {
	ms_tls.own++;
	ms_tls.fast = NULL;
}
static inline void own_down(void) {
	if (--ms_tls.own == 0 && !ms_tls.guard) ms_tls.fast = ms_tls.thr;
}
static inline void set_thr(ms_thr *t) {
	ms_tls.thr = t;
	ms_tls.fast = ms_tls.guard || ms_tls.own ? NULL : t;
}

// This library's own mappings, never roots of the leak-kind scan (exitscan.c).
HIDDEN void own_note(void *p, size_t n);
HIDDEN void own_map(void *p, size_t n);   // a mapping the Go runtime made (hooks.c: mmap)
HIDDEN void own_unmap(void *p, size_t n); // a range unmapped: out of the notes
HIDDEN void dead_stack_note(uintptr_t lo, uintptr_t hi); // a thread's stack at its end (glibc may cache it)
HIDDEN void internal_tid_note(void); // the calling thread is msmemscope's own (threadstop.c)

static inline void *raw_mmap(size_t n) {
	void *p = (void *)syscall(SYS_mmap, 0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) return NULL;
	own_note(p, n);
	return p;
}
static inline void raw_munmap(void *p, size_t n) {
	own_unmap(p, n);
	syscall(SYS_munmap, p, n);
}

static inline int in_self(uintptr_t pc) {
	return pc >= (uintptr_t)__ehdr_start && pc < (uintptr_t)_etext;
}

static inline int in_child(void) { return ms_child || (pid_t)syscall(SYS_getpid) != ms_mypid; }

// ---- clock ----
static inline uint64_t mono_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}
// Stamp for an event that must be ordered after the work before it (MALLOC).
static inline uint64_t stamp_after(void) {
	if (likely(ms_use_tsc)) {
		unsigned aux;
		return __rdtscp(&aux);
	}
	return mono_ns();
}
// Stamp for an event that must be ordered before the work after it (FREE).
static inline uint64_t stamp_before(void) {
	if (likely(ms_use_tsc)) {
		uint64_t t = __rdtsc();
		_mm_lfence();
		return t;
	}
	return mono_ns();
}

// ---- writing events (ring.c) ----
// Appends an event and its payload to the calling thread's ring; site goes
// into the upper half of the record's n (a MALLOC's site id). Caller holds
// the guard.
HIDDEN void emit_n(uint16_t kind, uint16_t flags, uint64_t ts, uint64_t a, uint64_t b, const void *payload, uint32_t plen, uint32_t site);
HIDDEN void emit(uint16_t kind, uint16_t flags, uint64_t ts, uint64_t a, uint64_t b, const void *payload, uint32_t plen);
HIDDEN ms_thr *thr_acquire(void);
HIDDEN void thr_key_dtor(void *v);
HIDDEN uint64_t *ring_reserve(ms_thr *t, uint32_t n);
HIDDEN uint64_t gate_set(uint64_t keep, uint64_t set);
#define DIRECT_UNITS 1024 // payload units of an event written directly
// drain.c: one chunk straight to the spool.
HIDDEN long write_direct(const uint64_t *u, uint32_t n, int32_t tid, int locked);

// The next precise stamp falls due STAMP_UNITS units on (or at wend); the
// fast path, which checks room against flim alone, stops there. So a
// position check it makes anyway replaces a count of events since a stamp.
// flim is a unit short of that end: w < flim leaves room for 2 units.
// While stamp units go out, flim leaves room for 3 units (a stamp, then a
// 2-unit MALLOC).
static inline void stamp_rearm(ms_thr *t) {
	uint64_t *wp = atomic_load_explicit(&t->wp, memory_order_relaxed);
	uint64_t *end = wp && t->wend - wp > STAMP_UNITS ? wp + STAMP_UNITS : t->wend;
	t->flim = end ? end - 2 : NULL;
}
HIDDEN void precise_check(ms_thr *t, uint64_t e);
HIDDEN void precise_idle(uint64_t e); // the drain, starting epoch e

// The stamp of a hot event: precise on the first event of a drain epoch, once
// flim is near, and always while two threads record (ms_precise); else the
// epoch alone. A thread entering a new epoch says so first (R_EPOCH): its
// compact records carry no stamp.
static inline uint64_t ev_stamp(ms_thr *t, int after) {
	uint64_t g = atomic_load_explicit(&ms_gate, memory_order_relaxed);
	uint64_t e = g & G_EPOCH;
	uint64_t *wp = atomic_load_explicit(&t->wp, memory_order_relaxed);
	t->gate = g & C_COMPACT ? g : 0;
	if (g & G_STACKS) t->last_ra = 0; // (no half MALLOC: fast_alloc)
	int precise = atomic_load_explicit(&ms_precise, memory_order_relaxed);
	// The first event after precise stamps stopped is stamped too: the
	// reader bounds the epoch-only events that follow by it (spool/order.go).
	if (likely(t->last_epoch == e && (uintptr_t)wp + 2 * 8 <= (uintptr_t)t->flim) && !precise &&
	    !t->precise_seen)
		return TS_EPOCH | e;
	t->precise_seen = precise;
	if (t->last_epoch != e) {
		t->last_epoch = e;
		emit_n(R_EPOCH, 0, TS_EPOCH | e, 0, 0, NULL, 0, 0);
		precise_check(t, e);
	}
	stamp_rearm(t);
	return after ? stamp_after() : stamp_before();
}

// The precise stamp of a fast record while two threads record: the TSC
// unfenced (a fence would double the cost); the reader allows for its
// jitter (spool/order.go).
static inline uint64_t stamp_fast(void) { return __rdtsc(); }

static inline uint64_t epoch_now(void) { return atomic_load(&ms_gate) & G_EPOCH; }

// A pair unit whose first half waits at wp for a second goes out as it is
// (its second half empty) before anything else is written; returns wp.
static inline uint64_t *half_close(ms_thr *t) {
	uint64_t *wp = atomic_load_explicit(&t->wp, memory_order_relaxed);
	if (likely(!t->half)) return wp;
	t->half = 0;
	atomic_store_explicit(&t->wp, ++wp, memory_order_release);
	return wp;
}

// Room for n more units in the thread's current segment.
static inline int ring_room(ms_thr *t, uint64_t *wp, uint32_t n) {
	return likely((uintptr_t)wp + (uintptr_t)n * 8 <= (uintptr_t)t->wend);
}

static inline void ring_commit(ms_thr *t, uint32_t n) {
	atomic_store_explicit(&t->wp, atomic_load_explicit(&t->wp, memory_order_relaxed) + n, memory_order_release);
}

// ---- readiness (lifecycle.c) ----
HIDDEN void ms_init(void);
static inline int ready(void) {
	if (unlikely(atomic_load_explicit(&ms_state, memory_order_acquire) != 2)) {
		if (tls_guard) return 0;
		ms_init();
	}
	return 1;
}

static inline int should_record(void) {
	return likely(atomic_load_explicit(&ms_active, memory_order_relaxed)) && !tls_guard;
}

static inline ms_thr *cur_thr(void) {
	ms_thr *t = tls_thr;
	return likely(t != NULL) ? t : thr_acquire();
}

// ---- compact records into the ring (the hot path and emit1) ----
// Publishes the units (from 1 to 3) just encoded at w, the thread's write
// position, for an event at ptr. The final drain may have run between the
// caller's check and this commit: then nobody will drain this ring again, so
// drain it now.
static inline __attribute__((always_inline)) void publish(ms_thr *t, uint64_t *w, uint64_t ptr, uint32_t units) {
	t->last_ptr = ptr;
	atomic_store_explicit(&t->wp, w + units, memory_order_release);
	if (unlikely(atomic_load_explicit(&ms_direct, memory_order_acquire))) ms_drain();
}

// Half of a pair unit (see records.def): the first waits at wp, unpublished,
// for a second; a record of any other form publishes it as it is (half_close).
static inline __attribute__((always_inline)) void put_half(ms_thr *t, uint64_t *w, uint64_t ptr, uint32_t h) {
	t->last_ptr = ptr;
	if (t->half) {
		enc_pair_second(w, h);
		t->half = 0;
		atomic_store_explicit(&t->wp, w + 1, memory_order_release);
	} else {
		enc_pair_first(w, h);
		t->half = 1;
	}
	if (unlikely(atomic_load_explicit(&ms_direct, memory_order_acquire))) {
		half_close(t);
		ms_drain();
	}
}

// A stamp unit at w for the record after it: its units (1).
static inline uint32_t put_stamp(ms_thr *t, uint64_t *w, uint64_t ts) {
	enc_stamp(w, ts);
	t->last_stamp = ts;
	return 1;
}

// A MALLOC or FREE whose only payload is a stack id (id, with F_STACKID in
// flags; else 0): compact when its stamp is the epoch alone and its values
// fit (see records.def).
static inline void emit1(ms_thr *t, uint16_t kind, uint16_t flags, uint64_t ts, uint64_t a, uint64_t b, uint32_t site, uint64_t id) {
	uint64_t *w = half_close(t);
	// A precise stamp goes in a stamp unit before the compact record while
	// two threads record (most events then have one).
	int stamp = !(ts & TS_EPOCH) && ts <= P_STAMP_MAX && atomic_load_explicit(&ms_precise, memory_order_relaxed);
	if (likely(((ts & TS_EPOCH) || stamp) && a <= C_MAX && !(flags & ~C_FLAGS) &&
	           !atomic_load_explicit(&ms_direct, memory_order_relaxed))) {
		int units = (id ? 3 : 2) + stamp;
		if (kind == R_MALLOC && b <= C_MAX && ring_room(t, w, units)) {
			uint64_t tag = enc_tag(flags);
			if (stamp) put_stamp(t, w, ts);
			publish(t, w, a, stamp + (id ? enc_malloc_id(w + stamp, tag, a, b, site, id) : enc_malloc(w + stamp, tag, a, b, site)));
			return;
		}
		if (kind == R_FREE && b == 0 && !id && ring_room(t, w, 1 + stamp)) {
			if (stamp) put_stamp(t, w, ts);
			publish(t, w, a, stamp + enc_free(w + stamp, enc_tag(flags), a));
			return;
		}
	}
	emit_n(kind, flags, ts, a, b, id ? &id : NULL, id ? sizeof id : 0, site);
}

// ---- stacks and allocation sites (stacks.c) ----
#define MAX_FRAMES 1000
HIDDEN int capture_c(uintptr_t *out, int max);
HIDDEN void emit_with_cstack(uint16_t kind, uint16_t flags, uint64_t ts, uint64_t a, uint64_t b, uint32_t site);
HIDDEN void emit_with_stacks(uint16_t flags, uint64_t ts, uint64_t a, uint64_t b, uint32_t site);
HIDDEN void stacks_load(void);   // the unwinder (libunwind), loaded once
HIDDEN void stacks_modules(void); // notes the modules built without frame pointers
struct dl_phdr_info;
HIDDEN void dynsym_each(const struct dl_phdr_info *info, void (*fn)(const char *name, uintptr_t addr, size_t size, void *arg), void *arg);
HIDDEN int in_unwinder(uintptr_t pc); // pc is libunwind's (loaded by stacks_load, for msmemscope alone)
HIDDEN void stacks_thread_start(void); // a program thread's start: libunwind's thread-local block made, as msmemscope's

// Every MALLOC names its allocation site: the allocator's caller, interned
// in a lock-free table whose slot is the site's id (stacks.c).
#define SITE_SLOTS 65536
#define SITE_SELF UINT32_MAX // site_id: the allocation is msmemscope's own
extern HIDDEN uintptr_t *_Atomic site_tab;
// The home slot of an allocation site in the site table (and its id).
static inline uint32_t site_hash(uintptr_t ra) { return (uint32_t)((ra * 0x9E3779B97F4A7C15ull) >> 48); }
// site_id's slow part: a site not in its home slot, or the table not made.
HIDDEN uint32_t site_miss(uintptr_t ra, uint32_t h);

static inline uint32_t site_id(uintptr_t ra) {
	uintptr_t *tab = atomic_load_explicit(&site_tab, memory_order_acquire);
	// Fast path: a caller seen before sits in its home slot. Callers inside
	// libc/libstdc++ never do (their site is the wrapper's caller), so the
	// range check and the unwind happen only on a miss.
	uint32_t h = site_hash(ra);
	if (likely(tab != NULL && h != 0 && atomic_load_explicit((_Atomic uintptr_t *)&tab[h], memory_order_relaxed) == ra)) return h;
	return site_miss(ra, h);
}

// ---- crash signals (crash.c) ----
HIDDEN void crash_install(void);       // ms_init: our handlers, the program's kept
HIDDEN void crash_quick_exit(void);    // load: the final drain as the last at_quick_exit handler
HIDDEN void crash_altstack(void);      // a recording thread's alternate signal stack
HIDDEN void crash_altstack_free(void); // its end
HIDDEN void engine_wait(void);         // until the spool is open (or never will be), 3 s at most
// Around the exit's Go work: the asynchronous signals blocked while it runs
// on the alternate signal stack (exit() from a signal handler).
HIDDEN int exit_work_begin(sigset_t *old);
HIDDEN void exit_work_end(int blocked, const sigset_t *old);
// drain.c: the drain of a crash handler: waits for the drain lock at most
// wait_ns; -2 when it never came free.
HIDDEN long ms_drain_crash(uint64_t wait_ns);
extern HIDDEN _Atomic int ms_sink_busy; // batches of the rotating logs' drain not yet written

// ---- threads (lifecycle.c) ----
HIDDEN void *map_stack(pthread_attr_t *at, size_t size);

#endif
