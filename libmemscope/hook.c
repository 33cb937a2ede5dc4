// The hot path (DESIGN.md, "Rules of the hot path"): interposed allocator
// symbols, per-thread rings of fixed-size records, and the drain that copies
// rings to the spool. Nothing here calls into Go, allocates through the
// interposed functions, or takes a lock that a hook could wait on.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>
#include <cpuid.h>

#include "hook.h"
#include "pystack.h"

#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)
#define TLS __attribute__((tls_model("initial-exec"))) __thread

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);
extern void *__libc_stack_end;

// This library's own text, for telling its threads and frames apart.
extern const char __ehdr_start[] __attribute__((visibility("hidden")));
extern const char _etext[] __attribute__((visibility("hidden")));

// ---- configuration (MSMEMSCOPE_HOOK, parsed on the first hook call) ----
static int cfg_heap = 1;    // record the host heap
static int cfg_cstack = 0;  // C stack depth
static int cfg_deferred = 0;

// ---- global state ----
static _Atomic int ms_state;           // 0 new, 1 initializing, 2 ready
static _Atomic int ms_active;          // hooks record (heap events wanted, not a child)
static _Atomic int ms_collecting;      // collection switched on
static _Atomic int ms_direct;          // after the final drain: write straight to the spool
static int ms_rotating;  // rotating logs (ms_set_rotating): no short MALLOCs, no stack ids
static _Atomic int ms_spool_fd = -1;
static _Atomic uint64_t ms_lost_count;
static _Atomic uint64_t ms_fork_count;
static _Atomic uint64_t ms_mstx_next = 1;
// The hot path's gate: the fast tag in the top 16 bits, the drain epoch in
// the low 48 (G_EPOCH). The tag is nonzero while the fast path may run
// (ready, recording the heap, no stacks wanted, not writing directly; see
// ms_fast_update): C_COMPACT | a compact record's flags << 48 | C_SHORT where
// the short forms may be written.
// The epoch (~1 ms) is bumped by each drain pass. A thread stamps its first
// event of an epoch, and one every STAMP_UNITS units of its ring (2 KiB:
// 128 to 512 events), with the TSC; other events carry TS_EPOCH|epoch and the
// reader interpolates their time. A TSC read costs about as much as a whole
// malloc/free pair on some virtual machines.
// A thread's fast path runs while the gate equals its own copy (ms_thr.gate,
// taken in the general path): one test for both.
static _Atomic uint64_t ms_gate = 1;
#define G_EPOCH ((1ull << 48) - 1)
#define TS_EPOCH (1ull << 63)
#define STAMP_UNITS 256
static int ms_use_tsc;
static int ms_child;  // in a forked child: never record, never enter Go
static pid_t ms_mypid;
static pthread_key_t ms_key;
static pthread_mutex_t ms_drain_lock = PTHREAD_MUTEX_INITIALIZER;

// ---- per-thread state: keep the TLS block small (DESIGN: < 1 KiB free after torch) ----
// A segment is one mapping: a page of bookkeeping, then its data, which
// starts with room for a spool chunk header. A filled segment goes to the
// spool as it lies, by direct I/O (see the drain): no copy through the page
// cache, whose cost per event is as large as the hook's own on a fast machine.
#define SEG_META 4096   // bookkeeping page: hdr, the data's start, is page-aligned
#define DIO_ALIGN 4096  // direct I/O offsets, lengths and buffers are multiples of this
typedef struct ms_seg {
	struct ms_seg *_Atomic next;
	uint32_t cap;           // units
	_Atomic uint32_t head;  // units written, set by the owner when it moves on (else see ms_thr.wp)
	uint32_t tail;          // read by the drain
	uint32_t pad;
	size_t bytes;           // the whole mapping
	char meta_rest[SEG_META - 32];
	ms_chunk hdr;           // filled in by the drain for a direct write
	uint64_t u[];
} ms_seg;
_Static_assert(offsetof(ms_seg, hdr) == SEG_META, "segment data must start on a page");

// Drained segments kept for reuse, so that a thread whose drain lags (the
// disk is slower than the program) does not take fresh, zeroed memory for
// every segment: up to NSPARE a thread, SPARE_MAX in all.
#define NSPARE 8
#define SPARE_MAX 32
static _Atomic int spare_total;
typedef struct ms_thr {
	// The owner's line: what every event reads and writes.
	uint64_t *_Atomic wp;    // next unit to write in wseg (published: the drain reads up to it)
	uint64_t *flim;          // the fast path writes at w < flim only: a unit short of wend, or of where a precise stamp is due
	uint64_t *wend;          // end of wseg
	ms_seg *wseg;            // owner's current segment
	uint64_t gate;           // ms_gate as the fast path may write under it (its epoch said, its tag on), else 0
	int32_t tid;
	uint32_t half;           // 1: *wp holds a pair unit's first half, not yet published (see put_half)
	uintptr_t last_ra;       // call site of this thread's last MALLOC record when the fast path wrote it, else 0
	uint64_t last_ptr;       // address of this thread's last compact record (pair halves are relative to it)
	// The drain's side, on a line of its own.
	_Alignas(64) struct ms_thr *next_all; // registry, push-only
	uintptr_t stack_hi;      // frame-pointer walks stay below this (the owner's, set once)
	uint64_t last_epoch;     // the owner's: the epoch its last R_EPOCH said
	_Atomic int state;       // 0 owned, 1 dead (drain releases; its thread may take it back), 2 free for reuse, 3 being released
	ms_seg *rseg;            // drain's current segment
	_Atomic uint64_t segs;   // segments allocated and not yet released
	ms_seg *_Atomic spare[NSPARE]; // drained segments handed back for reuse
	uint64_t wait_since;     // when the drain first saw the current segment's undrained tail
} ms_thr;

static ms_thr *_Atomic ms_threads;

// One TLS block, so the hot path finds it with one offset.
static TLS struct {
	ms_thr *fast; // thr while guard is 0, else NULL: the fast path's one test
	ms_thr *thr;
	int guard; // >0: inside msmemscope (or an internal thread): invisible
	ms_thr *prev; // the ring this thread gave up at its end (thr_key_dtor)
} tls;
#define tls_thr tls.thr
#define tls_guard tls.guard
static inline void guard_up(void) {
	tls.guard++;
	tls.fast = NULL;
}
static inline void guard_down(void) {
	if (--tls.guard == 0) tls.fast = tls.thr;
}
static inline void set_thr(ms_thr *t) {
	tls.thr = t;
	tls.fast = tls.guard ? NULL : t;
}

#define SEG_MAP (2u << 20) // a segment's mapping: a huge page's size
#define SEG_BYTES (SEG_MAP - SEG_META) // its data part
#define SEG_FIRST ((1u << 20) - SEG_META) // a thread's first segment: 1 MiB in all, small pages
// Units a segment of data size d holds: the chunk header, then room to pad
// the last unit out to DIO_ALIGN with a padding chunk (at most DIO_ALIGN + 8).
#define SEG_UNITS(d) (((d) - sizeof(ms_chunk) - DIO_ALIGN - 8) / 8)
#define SEG_CAP SEG_UNITS(SEG_BYTES)
#define SEG_WAIT_CAP 256 // segments pending per thread (512 MiB) before a writer waits for the drain

static void *raw_mmap(size_t n) {
	void *p = (void *)syscall(SYS_mmap, 0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}
static void raw_munmap(void *p, size_t n) { syscall(SYS_munmap, p, n); }

static inline int in_self(uintptr_t pc) {
	return pc >= (uintptr_t)__ehdr_start && pc < (uintptr_t)_etext;
}

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
static void emit_n(uint16_t kind, uint16_t flags, uint64_t ts, uint64_t a, uint64_t b, const void *payload, uint32_t plen, uint32_t hi);

// The next precise stamp falls due STAMP_UNITS units on (or at wend); the
// fast path, which checks room against flim alone, stops there. So a
// position check it makes anyway replaces a count of events since a stamp.
// flim is a unit short of that end: w < flim leaves room for 2 units.
static inline void stamp_rearm(ms_thr *t) {
	uint64_t *wp = atomic_load_explicit(&t->wp, memory_order_relaxed);
	uint64_t *end = wp && t->wend - wp > STAMP_UNITS ? wp + STAMP_UNITS : t->wend;
	t->flim = end ? end - 1 : NULL;
}
// The stamp of a hot event: precise on the first event of a drain epoch and
// once flim is near, else the epoch alone. A thread entering a new epoch says
// so first (R_EPOCH): its compact records carry no stamp.
static inline uint64_t ev_stamp(ms_thr *t, int after) {
	uint64_t g = atomic_load_explicit(&ms_gate, memory_order_relaxed);
	uint64_t e = g & G_EPOCH;
	uint64_t *wp = atomic_load_explicit(&t->wp, memory_order_relaxed);
	t->gate = g & C_COMPACT ? g : 0;
	if (likely(t->last_epoch == e && (uintptr_t)wp + 2 * 8 <= (uintptr_t)t->flim)) return TS_EPOCH | e;
	if (t->last_epoch != e) {
		t->last_epoch = e;
		emit_n(R_EPOCH, 0, TS_EPOCH | e, 0, 0, NULL, 0, 0);
	}
	stamp_rearm(t);
	return after ? stamp_after() : stamp_before();
}

// The gate's parts change apart (a drain pass, a switch of the tag).
static uint64_t gate_set(uint64_t keep, uint64_t set) {
	uint64_t g = atomic_load(&ms_gate), n;
	do n = (g & keep) | set;
	while (!atomic_compare_exchange_weak(&ms_gate, &g, n));
	return n;
}
static inline uint64_t epoch_now(void) { return atomic_load(&ms_gate) & G_EPOCH; }

static int tsc_invariant(void) {
	unsigned a, b, c, d;
	if (!__get_cpuid(0x80000007, &a, &b, &c, &d)) return 0;
	return (d >> 8) & 1;
}

// ---- rings ----
// A pair unit whose first half waits at wp for a second goes out as it is
// (its second half empty) before anything else is written; returns wp.
static inline uint64_t *half_close(ms_thr *t) {
	uint64_t *wp = atomic_load_explicit(&t->wp, memory_order_relaxed);
	if (likely(!t->half)) return wp;
	t->half = 0;
	atomic_store_explicit(&t->wp, ++wp, memory_order_release);
	return wp;
}

// A thread's end: its ring is left for the drain to release. What the
// thread does after this (other keys' destructors, glibc's own clean-up)
// takes the ring back while the drain has not released it (thr_acquire),
// else a fresh one: the drain wrote the old one out in full first, so a
// tid's records stay in order (readers take its chunks in file order).
static void thr_key_dtor(void *v) {
	ms_thr *t = v;
	if (t && tls_thr == t) {
		half_close(t);
		tls.prev = t;
		set_thr(NULL);
		atomic_store_explicit(&t->state, 1, memory_order_release);
	}
}

static void thr_stack_bounds(ms_thr *t) {
	uintptr_t sp = (uintptr_t)__builtin_frame_address(0);
	t->stack_hi = 0;
	if (t->tid == ms_mypid) {
		t->stack_hi = (uintptr_t)__libc_stack_end;
	} else {
		pthread_attr_t at;
		if (pthread_getattr_np(pthread_self(), &at) == 0) {
			void *addr;
			size_t sz;
			if (pthread_attr_getstack(&at, &addr, &sz) == 0) t->stack_hi = (uintptr_t)addr + sz;
			pthread_attr_destroy(&at);
		}
	}
	if (t->stack_hi < sp) t->stack_hi = sp + 64 * 1024; // unknown: stay near the current frame
}

static ms_thr *thr_acquire(void) {
	ms_thr *t = tls.prev;
	if (t) {
		tls.prev = NULL;
		int dead = 1;
		if (atomic_compare_exchange_strong(&t->state, &dead, 0)) {
			set_thr(t); // as it was: write on where it stopped
			pthread_setspecific(ms_key, t);
			return t;
		}
	}
	for (t = atomic_load_explicit(&ms_threads, memory_order_acquire); t; t = t->next_all) {
		int want = 2;
		if (atomic_compare_exchange_strong(&t->state, &want, 0)) break;
	}
	if (!t) {
		t = raw_mmap(4096);
		if (!t) return NULL;
		t->next_all = atomic_load(&ms_threads);
		while (!atomic_compare_exchange_weak(&ms_threads, &t->next_all, t)) {
		}
	}
	t->tid = (int32_t)syscall(SYS_gettid);
	atomic_store(&t->wp, NULL);
	t->wend = t->flim = NULL;
	t->wseg = NULL;
	t->gate = 0;
	t->last_epoch = 0;
	t->last_ra = 0;
	t->half = 0;
	t->last_ptr = 1; // no pair half before a compact record names an address
	thr_stack_bounds(t);
	set_thr(t);
	pthread_setspecific(ms_key, t);
	return t;
}

// A thread's first segment is half the size and faulted in as it fills (a
// thread may record a few events only). Later ones, of a thread that filled one, come populated,
// on a huge page where the kernel has one: one fault instead of 512 in the
// program's thread, and one page to pin and unpin per direct write instead
// of 512 (that work lands on whichever core takes the disk's interrupts).
static ms_seg *seg_new(uint32_t need, int populate) {
	size_t data = populate ? SEG_BYTES : SEG_FIRST;
	if (need > SEG_UNITS(data)) data = ((sizeof(ms_chunk) + (size_t)need * 8 + DIO_ALIGN + 8) + 4095) & ~(size_t)4095;
	size_t bytes = SEG_META + data;
	char *p = NULL;
	if (populate && bytes == SEG_MAP) {
		// Over-map, keep the aligned middle.
		char *q = (void *)syscall(SYS_mmap, 0, 2 * SEG_MAP, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (q == MAP_FAILED) return NULL;
		p = (char *)(((uintptr_t)q + SEG_MAP - 1) & ~(uintptr_t)(SEG_MAP - 1));
		if (p > q) raw_munmap(q, (size_t)(p - q));
		if (q + SEG_MAP > p) raw_munmap(p + SEG_MAP, (size_t)(q + SEG_MAP - p));
		madvise(p, SEG_MAP, MADV_HUGEPAGE);
		if (madvise(p, SEG_MAP, 23 /* MADV_POPULATE_WRITE, Linux 5.14 */))
			for (size_t i = 0; i < SEG_MAP; i += 4096) ((volatile char *)p)[i] = 0;
	} else {
		p = (void *)syscall(SYS_mmap, 0, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == (char *)MAP_FAILED) return NULL;
	}
	ms_seg *s = (ms_seg *)p;
	s->cap = (uint32_t)SEG_UNITS(data);
	s->bytes = bytes;
	return s;
}

static long write_direct(const uint64_t *u, uint32_t n, int32_t tid);


// Room for n more units in the thread's current segment.
static inline int ring_room(ms_thr *t, uint64_t *wp, uint32_t n) {
	return likely((uintptr_t)wp + (uintptr_t)n * 8 <= (uintptr_t)t->wend);
}

// Reserves n contiguous units in the calling thread's ring, or NULL.
static uint64_t *ring_reserve(ms_thr *t, uint32_t n) {
	ms_seg *s = t->wseg;
	uint64_t *wp = half_close(t);
	if (s && ring_room(t, wp, n)) return wp;
	// Past the cap, wait for the drain while it is alive; never inside a child.
	while (atomic_load_explicit(&t->segs, memory_order_acquire) >= SEG_WAIT_CAP) {
		if (ms_child || atomic_load(&ms_spool_fd) < 0) break;
		struct timespec ts = {0, 200000};
		nanosleep(&ts, NULL);
	}
	ms_seg *ns = NULL;
	for (int i = 0; n <= SEG_CAP && !ns && i < NSPARE; i++)
		if (atomic_load_explicit(&t->spare[i], memory_order_relaxed) &&
		    (ns = atomic_exchange_explicit(&t->spare[i], NULL, memory_order_acquire)))
			atomic_fetch_sub_explicit(&spare_total, 1, memory_order_relaxed);
	if (!ns) ns = seg_new(n, s != NULL);
	if (!ns) return NULL;
	atomic_fetch_add(&t->segs, 1);
	// Moving on: s's head is final before the drain can see s->next, and
	// s->next is set before wp leaves s (see drain_thread).
	if (s) {
		atomic_store_explicit(&s->head, (uint32_t)(wp - s->u), memory_order_release);
		atomic_store_explicit(&s->next, ns, memory_order_release);
	} else {
		t->rseg = ns; // first segment: publish before the registry sees records
	}
	t->wseg = ns;
	t->wend = ns->u + ns->cap;
	atomic_store_explicit(&t->wp, ns->u, memory_order_release);
	stamp_rearm(t);
	return ns->u;
}

static inline void ring_commit(ms_thr *t, uint32_t n) {
	atomic_store_explicit(&t->wp, atomic_load_explicit(&t->wp, memory_order_relaxed) + n, memory_order_release);
}

// After the final drain: one event straight to the spool.
#define DIRECT_UNITS 1024 // payload units of an event written directly
static __attribute__((noinline)) void emit_direct(uint16_t kind, uint16_t flags, uint64_t ts, uint64_t a, uint64_t b, const void *payload, uint32_t plen, uint32_t hi) {
	uint32_t n = (plen + 7) / 8;
	uint64_t buf[REC_UNITS + DIRECT_UNITS];
	if (n > DIRECT_UNITS) n = DIRECT_UNITS, plen = DIRECT_UNITS * 8;
	ms_rec h = {n | hi << 16, flags, kind, ts, a, b};
	memcpy(buf, &h, sizeof h);
	if (n) {
		buf[REC_UNITS + n - 1] = 0;
		memcpy(&buf[REC_UNITS], payload, plen);
	}
	ms_thr *t = tls_thr;
	write_direct(buf, REC_UNITS + n, t ? t->tid : (int32_t)syscall(SYS_gettid));
}

// Appends an event and its payload; hi goes into the upper half of the
// record's n (a MALLOC's site id). Caller holds tls_guard.
static void emit_n(uint16_t kind, uint16_t flags, uint64_t ts, uint64_t a, uint64_t b, const void *payload, uint32_t plen, uint32_t hi) {
	if (plen > 0xffff * 8) plen = 0xffff * 8; // n holds 16 bits of units
	uint32_t n = (plen + 7) / 8;
	ms_thr *t = tls_thr;
	if (unlikely(atomic_load_explicit(&ms_direct, memory_order_acquire))) {
		if (t && t->half) { // after the final drain: its pending half goes first
			half_close(t);
			ms_drain();
		}
		emit_direct(kind, flags, ts, a, b, payload, plen, hi);
		return;
	}
	if (unlikely(!t)) {
		t = thr_acquire();
		if (!t) {
			atomic_fetch_add(&ms_lost_count, 1);
			return;
		}
	}
	uint64_t *r = ring_reserve(t, REC_UNITS + n);
	if (unlikely(!r)) {
		atomic_fetch_add(&ms_lost_count, 1);
		return;
	}
	ms_rec h = {n | hi << 16, flags, kind, ts, a, b};
	memcpy(r, &h, sizeof h);
	if (n) {
		r[REC_UNITS + n - 1] = 0;
		memcpy(&r[REC_UNITS], payload, plen);
	}
	ring_commit(t, REC_UNITS + n);
	// The final drain may have run between our check of ms_direct and the
	// commit: then nobody will drain this ring again, so drain it now.
	if (unlikely(atomic_load_explicit(&ms_direct, memory_order_acquire))) ms_drain();
}

static void emit(uint16_t kind, uint16_t flags, uint64_t ts, uint64_t a, uint64_t b, const void *payload, uint32_t plen) {
	emit_n(kind, flags, ts, a, b, payload, plen, 0);
}

// ---- stacks ----
static void *unw_lib;
static int (*unw_backtrace_fn)(void **, int);
static uintptr_t nofp_lo[4], nofp_hi[4]; // modules built without frame pointers
static int nofp_n;

static int nofp(uintptr_t pc) {
	for (int i = 0; i < nofp_n; i++)
		if (pc >= nofp_lo[i] && pc < nofp_hi[i]) return 1;
	return 0;
}
static int is_leading_skip(uintptr_t pc) { return in_self(pc) || nofp(pc); }

#define MAX_FRAMES 1000

// Raw return addresses of the caller, innermost first, msmemscope's and the
// allocator's own frames removed.
static __attribute__((noinline)) int capture_c(uintptr_t *out, int max) {
	ms_thr *t = tls_thr;
	if (!t) t = thr_acquire();
	int n = 0;
	uintptr_t fp = (uintptr_t)__builtin_frame_address(0);
	uintptr_t lo = fp, first = 0;
	// Find the first frame outside this library.
	while (t && fp >= lo && fp <= t->stack_hi - 16 && !(fp & 7)) {
		uintptr_t ra = ((uintptr_t *)fp)[1];
		uintptr_t next = ((uintptr_t *)fp)[0];
		if (!in_self(ra)) {
			first = ra;
			break;
		}
		if (next <= fp) break;
		fp = next;
	}
	if (first && nofp(first) && unw_backtrace_fn) {
		// Called from libc or libstdc++ (strdup, operator new): their frames
		// carry no frame pointer, so unwind with DWARF CFI instead.
		void *buf[MAX_FRAMES + 32];
		int want = max + 32 > MAX_FRAMES + 32 ? MAX_FRAMES + 32 : max + 32;
		int got = unw_backtrace_fn(buf, want);
		int i = 0;
		while (i < got && is_leading_skip((uintptr_t)buf[i])) i++;
		for (; i < got && n < max; i++) out[n++] = (uintptr_t)buf[i];
		return n;
	}
	while (t && n < max && fp >= lo && fp <= t->stack_hi - 16 && !(fp & 7)) {
		uintptr_t ra = ((uintptr_t *)fp)[1];
		uintptr_t next = ((uintptr_t *)fp)[0];
		if (ra < 4096) break;
		if (n > 0 || !is_leading_skip(ra)) out[n++] = ra;
		if (next <= fp) break;
		fp = next;
	}
	return n;
}

static int phdr_cb(struct dl_phdr_info *info, size_t sz, void *data) {
	(void)sz;
	(void)data;
	const char *name = info->dlpi_name;
	if (!name || nofp_n >= 4) return 0;
	const char *base = strrchr(name, '/');
	base = base ? base + 1 : name;
	if (strncmp(base, "libc.so", 7) && strncmp(base, "libstdc++.so", 12) && strncmp(base, "libgcc_s.so", 11)) return 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
			nofp_lo[nofp_n] = info->dlpi_addr + ph->p_vaddr;
			nofp_hi[nofp_n] = info->dlpi_addr + ph->p_vaddr + ph->p_memsz;
			nofp_n++;
			break;
		}
	}
	return 0;
}

// ---- init ----
static void atfork_prepare(void) {}
static void atfork_parent(void) { atomic_fetch_add(&ms_fork_count, 1); }
static void atfork_child(void) {
	ms_child = 1;
	atomic_store(&ms_active, 0);
	gate_set(G_EPOCH, 0);
}

static long env_int(const char *s, const char *key, long def) {
	size_t k = strlen(key);
	for (const char *p = s; p && *p;) {
		if (!strncmp(p, key, k) && p[k] == '=') return strtol(p + k + 1, NULL, 10);
		p = strchr(p, ',');
		if (p) p++;
	}
	return def;
}

static void ms_init(void) {
	int want = 0;
	if (!atomic_compare_exchange_strong(&ms_state, &want, 1)) {
		while (atomic_load(&ms_state) != 2) {
		}
		return;
	}
	guard_up();
	ms_mypid = (pid_t)syscall(SYS_getpid);
	ms_use_tsc = tsc_invariant();
	const char *h = getenv("MSMEMSCOPE_HOOK");
	if (h) {
		cfg_heap = (int)env_int(h, "heap", 1);
		cfg_cstack = (int)env_int(h, "cstack", 0);
		cfg_deferred = (int)env_int(h, "deferred", 0);
		// Known from the first event: rotating logs are read one by one.
		ms_rotating = (int)env_int(h, "rotate", 0) != 0;
		if (cfg_cstack > MAX_FRAMES) cfg_cstack = MAX_FRAMES;
	}
	pthread_key_create(&ms_key, thr_key_dtor);
	pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
	atomic_store(&ms_collecting, !cfg_deferred);
	emit(R_CALIB, F_EPOCH, stamp_after(), mono_ns(), 1, NULL, 0);
	if (!cfg_deferred) emit(R_START, 0, stamp_after(), 0, 0, NULL, 0);
	atomic_store(&ms_active, cfg_heap);
	guard_down();
	atomic_store(&ms_state, 2);
	ms_fast_update();
}

static inline int ready(void) {
	if (unlikely(atomic_load_explicit(&ms_state, memory_order_acquire) != 2)) {
		if (tls_guard) return 0;
		ms_init();
	}
	return 1;
}

// Constructor: set up stack unwinding helpers (they need the loader).
__attribute__((constructor(101))) static void ms_ctor(void) {
	ready();
	guard_up();
	dl_iterate_phdr(phdr_cb, NULL);
	if (cfg_heap) {
		// C stacks, and sites of allocations made through libc/libstdc++ wrappers.
		unw_lib = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
		if (unw_lib) unw_backtrace_fn = (int (*)(void **, int))dlsym(unw_lib, "unw_backtrace");
	}
	guard_down();
}

// ---- recording helpers used by the interposers ----
static inline int should_record(void) {
	return likely(atomic_load_explicit(&ms_active, memory_order_relaxed)) && !tls_guard;
}

static inline ms_thr *cur_thr(void) {
	ms_thr *t = tls_thr;
	return likely(t != NULL) ? t : thr_acquire();
}

// Writes a compact event (units 1 to 3) at w, the thread's write position,
// and publishes it. The final drain may have run between the caller's check
// and this commit: then nobody will drain this ring again, so drain it now.
static inline __attribute__((always_inline)) void put_compact(ms_thr *t, uint64_t *w, uint64_t ptr, uint64_t u0, uint64_t u1, uint64_t u2, int units) {
	t->last_ptr = ptr;
	w[0] = u0;
	if (units >= 2) w[1] = u1;
	if (units == 3) w[2] = u2;
	atomic_store_explicit(&t->wp, w + units, memory_order_release);
	if (unlikely(atomic_load_explicit(&ms_direct, memory_order_acquire))) ms_drain();
}

// Half of a pair unit (see hook.h): the first waits at wp, unpublished, for
// a second; a record of any other form publishes it as it is (half_close).
static inline __attribute__((always_inline)) void put_half(ms_thr *t, uint64_t *w, uint64_t ptr, uint32_t h) {
	t->last_ptr = ptr;
	if (t->half) {
		((uint32_t *)w)[0] = h | P_SECOND; // little-endian: the unit's low half
		t->half = 0;
		atomic_store_explicit(&t->wp, w + 1, memory_order_release);
	} else {
		w[0] = C_PAIR | (uint64_t)h << 32;
		t->half = 1;
	}
	if (unlikely(atomic_load_explicit(&ms_direct, memory_order_acquire))) {
		half_close(t);
		ms_drain();
	}
}

// The home slot of an allocation site in the site table (and its id).
static inline uint32_t site_hash(uintptr_t ra) { return (uint32_t)((ra * 0x9E3779B97F4A7C15ull) >> 48); }

// A MALLOC or FREE whose only payload is a stack id (id, with F_STACKID in
// flags; else 0): compact when its stamp is the epoch alone and its values
// fit (see hook.h).
static inline void emit1(ms_thr *t, uint16_t kind, uint16_t flags, uint64_t ts, uint64_t a, uint64_t b, uint32_t site, uint64_t id) {
	uint64_t *w = half_close(t);
	if (likely((ts & TS_EPOCH) && a <= C_MAX && !(flags & ~C_FLAGS) &&
	           !atomic_load_explicit(&ms_direct, memory_order_relaxed))) {
		int units = id ? 3 : 2;
		if (kind == R_MALLOC && b <= C_MAX && ring_room(t, w, units)) {
			put_compact(t, w, a, a | C_COMPACT | (uint64_t)flags << 48, b | (uint64_t)site << 48, id, units);
			return;
		}
		if (kind == R_FREE && b == 0 && !id && ring_room(t, w, 1)) {
			put_compact(t, w, a, a | C_COMPACT | C_FREE | (uint64_t)flags << 48, 0, 0, 1);
			return;
		}
	}
	emit_n(kind, flags, ts, a, b, id ? &id : NULL, id ? sizeof id : 0, site);
}

// The lock-free table at *slot, mapped (bytes long) by whichever thread gets
// there first; *made says whether this call did. NULL if it cannot be mapped.
static void *lazy_table(void *_Atomic *slot, size_t bytes, int *made) {
	void *tab = atomic_load_explicit(slot, memory_order_acquire);
	if (likely(tab != NULL)) return tab;
	tab = raw_mmap(bytes);
	void *none = NULL;
	if (tab && atomic_compare_exchange_strong(slot, &none, tab)) {
		if (made) *made = 1;
		return tab;
	}
	if (tab) raw_munmap(tab, bytes);
	return atomic_load(slot);
}

// The slot of key (nonzero) in the open-addressed table tab (mask + 1
// slots), looked for from slot home on, or a free slot it is put in (*fresh
// set: the caller announces it). Slot 0 stays empty (id 0 means none); 0
// when probes slots are all taken by others.
static uint32_t intern(uint64_t *tab, uint32_t mask, uint64_t key, uint32_t home, int probes, int *fresh) {
	for (uint32_t i = 0; i < (uint32_t)probes; i++) {
		uint32_t idx = (home + i) & mask;
		if (idx == 0) continue;
		uint64_t cur = atomic_load_explicit((_Atomic uint64_t *)&tab[idx], memory_order_acquire);
		if (cur == key) return idx;
		if (cur == 0) {
			uint64_t zero = 0;
			if (atomic_compare_exchange_strong((_Atomic uint64_t *)&tab[idx], &zero, key)) {
				*fresh = 1;
				return idx;
			}
			if (zero == key) return idx;
		}
	}
	return 0;
}

// ---- C stacks: each distinct one is written once ----
// A stack is known by a 64-bit hash of its frames (two stacks colliding,
// about 2^-64 a pair, would be reported as one), interned in a lock-free
// table whose slot is its id. The first time, the thread that interns it
// writes an R_STACK record (the frames); MALLOCs then carry the id alone
// (F_STACKID, one payload unit), so a 16-frame MALLOC takes 5 units, not 20.
// Readers collect every R_STACK before handing out records (as R_SITE).
#define STACK_SLOTS (1u << 18)
static uint64_t *_Atomic stack_tab;

static inline uint64_t stack_hash(const uintptr_t *f, int n) {
	uint64_t h = 0x9E3779B97F4A7C15ull * (uint64_t)(n + 1);
	for (int i = 0; i < n; i++) {
		h = (h ^ f[i]) * 0xff51afd7ed558ccdull;
		h ^= h >> 32;
	}
	return h | 1; // 0 marks an empty slot
}

// The id of the stack f[0..n), announced the first time; 0 when the table
// cannot take it (the stack then goes whole).
static uint32_t stack_id(const uintptr_t *f, int n) {
	uint64_t *tab = lazy_table((void *_Atomic *)&stack_tab, STACK_SLOTS * sizeof(uint64_t), NULL);
	if (unlikely(!tab)) return 0;
	uint64_t h = stack_hash(f, n);
	int fresh = 0;
	uint32_t idx = intern(tab, STACK_SLOTS - 1, h, (uint32_t)(h >> 40), 32, &fresh);
	if (fresh) emit(R_STACK, F_CSTACK, stamp_after(), idx, (uint64_t)n, f, (uint32_t)n * sizeof(uintptr_t));
	return idx;
}

static __attribute__((noinline)) void emit_with_cstack(uint16_t kind, uint16_t flags, uint64_t ts, uint64_t a, uint64_t b, uint32_t site) {
	int depth = *(volatile int *)&cfg_cstack; // read once: the Python API may change it meanwhile
	if (depth < 1) depth = 1;
	uintptr_t frames[depth]; // as deep as asked: a small frame stays in cache
	int n = capture_c(frames, depth);
	uint64_t id = n && !ms_rotating ? stack_id(frames, n) : 0;
	ms_thr *t = tls_thr;
	if (id && t)
		emit1(t, kind, flags | F_CSTACK | F_STACKID, ts, a, b, site, id);
	else
		emit_n(kind, flags | (n ? F_CSTACK : 0), ts, a, b, frames, n * sizeof(uintptr_t), site);
}

// ---- allocation sites: every MALLOC names its caller, stacks or not ----
// A site is the allocator's caller (the first frame outside libc, libstdc++
// and msmemscope when the caller is a wrapper such as operator new or strdup),
// interned in a lock-free table; its 16-bit id rides in the record's n and
// the address is written once, as an R_SITE record (SPEC §7 live report).
#define SITE_SLOTS 65536
static uintptr_t *_Atomic site_tab;

#define SITE_SELF UINT32_MAX // site_id: the allocation is msmemscope's own

// The caller of the wrapper (strdup, fopen...) that called the allocator, or
// 0 when that is this library: cgo's C calls pthread_getattr_np, which reads
// /proc/self/maps, when a program thread first enters msmemscope's Go code.
static __attribute__((noinline)) uintptr_t site_through_wrapper(uintptr_t ra) {
	void *buf[24]; // stdio's buffer allocation sits ~7 libc frames deep
	int got = unw_backtrace_fn(buf, 24), i = 0;
	while (i < got && in_self((uintptr_t)buf[i])) i++; // the hook
	while (i < got && nofp((uintptr_t)buf[i])) i++;    // the wrappers
	if (i < got && in_self((uintptr_t)buf[i])) return 0;
	for (; i < got; i++)
		if (!is_leading_skip((uintptr_t)buf[i])) return (uintptr_t)buf[i];
	return ra;
}

static __attribute__((noinline)) uint32_t site_insert(uintptr_t *tab, uintptr_t ra, uint32_t h) {
	int fresh = 0;
	uint32_t idx = intern((uint64_t *)tab, SITE_SLOTS - 1, ra, h, 16, &fresh);
	if (fresh) emit(R_SITE, 0, stamp_after(), ra, idx, NULL, 0);
	return idx; // 0: crowded, the site stays unknown
}

static inline uint32_t site_id(uintptr_t ra) {
	uintptr_t *tab = atomic_load_explicit(&site_tab, memory_order_acquire);
	if (unlikely(!tab)) {
		int made = 0;
		tab = lazy_table((void *_Atomic *)&site_tab, SITE_SLOTS * sizeof(uintptr_t), &made);
		if (!tab) return 0;
		if (made) ms_fast_update(); // the fast path needs the table
	}
	// Fast path: a caller seen before sits in its home slot. Callers inside
	// libc/libstdc++ never do (their site is the wrapper's caller), so the
	// range check and the unwind happen only on a miss.
	uint32_t h = site_hash(ra);
	if (likely(h != 0 && atomic_load_explicit((_Atomic uintptr_t *)&tab[h], memory_order_relaxed) == ra)) return h;
	if (unlikely(nofp(ra)) && unw_backtrace_fn) {
		if (!(ra = site_through_wrapper(ra))) return SITE_SELF;
		h = site_hash(ra);
	}
	return site_insert(tab, ra, h);
}

// A MALLOC with a Python stack (and a C stack when asked for): see pystack.h.
static __attribute__((noinline)) void emit_with_stacks(uint16_t flags, uint64_t ts, uint64_t a, uint64_t b, uint32_t site) {
	int maxc = *(volatile int *)&cfg_cstack, maxp = *(volatile int *)&ms_py_depth; // read once (ms_set_hook)
	if (maxc < 0) maxc = 0;
	if (maxp < 0) maxp = 0;
	uint64_t buf[1 + maxc + maxp];
	int nc = maxc ? capture_c((uintptr_t *)&buf[1], maxc) : 0;
	int np = ms_py_capture(&buf[1 + nc], maxp);
	if (!np) {
		emit_n(R_MALLOC, flags | (nc ? F_CSTACK : 0), ts, a, b, &buf[1], nc * sizeof(uint64_t), site);
		return;
	}
	buf[0] = (uint64_t)nc | (uint64_t)np << 32;
	emit_n(R_MALLOC, flags | F_PYSTACK | (nc ? F_CSTACK : 0), ts, a, b, buf, (1 + nc + np) * sizeof(uint64_t), site);
}

static void rec_alloc(void *p, size_t size, uint16_t sub, uintptr_t ra) {
	// Made from inside this library (cgo's own C, say, on a program thread
	// entering Go before the guard is up): msmemscope's, not the program's.
	// Its site never enters the table, so the fast path never takes it.
	if (unlikely(in_self(ra))) return;
	guard_up();
	ms_thr *t = cur_thr();
	if (likely(t != NULL)) t->last_ra = 0; // the next fast MALLOC names its site again
	uint64_t ts = t ? ev_stamp(t, 1) : stamp_after();
	uint16_t fl = sub | (atomic_load_explicit(&ms_collecting, memory_order_relaxed) ? 0 : F_OFF);
	uint32_t site = site_id(ra);
	if (unlikely(site == SITE_SELF)) {
		guard_down();
		return;
	}
	if (unlikely(ms_py_depth > 0))
		emit_with_stacks(fl, ts, (uint64_t)p, size, site);
	else if (cfg_cstack > 0)
		emit_with_cstack(R_MALLOC, fl, ts, (uint64_t)p, size, site);
	else if (likely(t != NULL))
		emit1(t, R_MALLOC, fl, ts, (uint64_t)p, size, site, 0);
	else
		emit_n(R_MALLOC, fl, ts, (uint64_t)p, size, NULL, 0, site);
	guard_down();
}

static void rec_free(void *p, size_t size, uint16_t sub) {
	guard_up();
	ms_thr *t = cur_thr();
	uint64_t ts = t ? ev_stamp(t, 0) : stamp_before();
	uint16_t fl = sub | (atomic_load_explicit(&ms_collecting, memory_order_relaxed) ? 0 : F_OFF);
	if (likely(t != NULL))
		emit1(t, R_FREE, fl, ts, (uint64_t)p, size, 0, 0);
	else
		emit(R_FREE, fl, ts, (uint64_t)p, size, NULL, 0);
	guard_down();
}

// ---- the fast path: a compact record straight into the ring ----
// Runs only while the gate's tag is on; returns 0 whenever the general path must
// run instead (a precise stamp is due, a new site, no ring yet, inside
// msmemscope). Takes no guard: it calls nothing that allocates.
void ms_fast_update(void) {
	int f = atomic_load(&ms_state) == 2 && atomic_load(&ms_active) && cfg_cstack <= 0 &&
	        ms_py_depth <= 0 && !atomic_load(&ms_direct) && !ms_child && atomic_load(&site_tab);
	uint64_t fl = F_HOST | (atomic_load(&ms_collecting) ? 0 : F_OFF);
	// C_SHORT: the forms that need their reader to know the thread's past
	// (short MALLOCs, pair halves: F_HOST alone) may be written.
	gate_set(G_EPOCH, f ? C_COMPACT | fl << 48 | (ms_rotating || (fl & F_OFF) ? 0 : C_SHORT) : 0);
}

// Short MALLOCs and stack ids need their reader to know what came before
// (the thread's last site, every R_STACK); rotating logs are read one by
// one, so they get the 2-unit form and whole stacks only.
void ms_set_rotating(int on) {
	ms_rotating = on;
	ms_fast_update();
}

static inline uint64_t gate_now(void) { return atomic_load_explicit(&ms_gate, memory_order_relaxed); }

// Whether the next event may go at *w, the thread's write position: not when
// a precise stamp is due or the segment is full (or there is none yet: wp and
// wend are both NULL then).
static inline __attribute__((always_inline)) int fast_slot(ms_thr *t, uint64_t g, uint64_t **w) {
	if (unlikely(g != t->gate)) return 0;
	*w = atomic_load_explicit(&t->wp, memory_order_relaxed);
	return likely((uintptr_t)*w < (uintptr_t)t->flim); // room for 2 units, the most a fast record takes
}

static inline __attribute__((always_inline)) int fast_alloc(uint64_t g, void *p, size_t n, uintptr_t ra) {
	ms_thr *t = tls.fast;
	if (unlikely(t == NULL)) return 0;
	uint64_t *w;
	if (unlikely(!fast_slot(t, g, &w))) return 0;
	// The same call site as the thread's last MALLOC (a loop, mostly): half
	// a unit when small and near the last address, else one; the reader
	// knows the site from that MALLOC.
	if (likely(ra == t->last_ra && (g & C_SHORT))) {
		uint64_t d = (uint64_t)p - t->last_ptr;
		if (likely(n < P_MSIZE && !((d + P_MNEAR) & ~(2 * P_MNEAR - 16)))) {
			put_half(t, w, (uint64_t)p, P_MALLOC | (uint32_t)n << P_MSHIFT | (uint32_t)(d >> 4 & (P_MNEAR / 8 - 1)));
			return 1;
		}
		if (n < C_SHORT_SIZE && !((uintptr_t)p & ~(((uintptr_t)1 << 47) - 16))) {
			if (unlikely(t->half) && !ring_room(t, w = half_close(t), 1)) return 0;
			put_compact(t, w, (uint64_t)p, C_COMPACT | C_SHORT | (uint64_t)n << 43 | (uintptr_t)p >> 4, 0, 0, 1);
			return 1;
		}
	}
	if (unlikely(((uintptr_t)p | n) > C_MAX)) return 0;
	// The tag is on only once the site table exists; slot 0 stays empty.
	uintptr_t *tab = atomic_load_explicit(&site_tab, memory_order_relaxed);
	uint32_t site = site_hash(ra);
	if (unlikely(tab[site] != ra)) return 0;
	if (unlikely(t->half) && !ring_room(t, w = half_close(t), 2)) return 0;
	t->last_ra = ra;
	put_compact(t, w, (uint64_t)p, (uint64_t)p | (g & ~(C_SHORT | G_EPOCH)), n | (uint64_t)site << 48, 0, 2);
	return 1;
}

static inline __attribute__((always_inline)) int fast_free(uint64_t g, void *p) {
	ms_thr *t = tls.fast;
	if (unlikely(t == NULL)) return 0;
	uint64_t *w;
	if (unlikely(!fast_slot(t, g, &w))) return 0;
	// A pair half names p relative to the last address: p's width is no matter.
	uint64_t d = (uint64_t)p - t->last_ptr;
	if (likely((g & C_SHORT) && !((d + P_FNEAR) & ~(2 * P_FNEAR - 16)))) {
		put_half(t, w, (uint64_t)p, (uint32_t)(d >> 4 & (P_FNEAR / 8 - 1)));
		return 1;
	}
	if (unlikely((uintptr_t)p > C_MAX)) return 0;
	if (unlikely(t->half) && !ring_room(t, w = half_close(t), 1)) return 0;
	put_compact(t, w, (uint64_t)p, (uint64_t)p | (g & ~(C_SHORT | G_EPOCH)) | C_FREE, 0, 0, 1);
	return 1;
}

// ---- the host allocator family (SPEC §4.1) ----
// The public entry points pass their caller's return address down: it is the
// allocation site (an inlined helper would otherwise name msmemscope itself).
// The general paths stand apart, tail-called, so that an entry point's fast
// path saves few registers and sets up no frame.
static __attribute__((noinline)) void *alloc_slow(void *p, size_t n, uintptr_t ra) {
	if (ready() && should_record() && p) rec_alloc(p, n, F_HOST, ra);
	return p;
}

static __attribute__((noinline)) void free_slow(void *p) {
	if (ready() && should_record()) rec_free(p, 0, F_HOST);
	__libc_free(p);
}

static inline __attribute__((always_inline)) void *malloc_at(size_t n, uintptr_t ra) {
	void *p = __libc_malloc(n);
	if (likely(p != NULL) && fast_alloc(gate_now(), p, n, ra)) return p;
	return alloc_slow(p, n, ra);
}

void *malloc(size_t n) { return malloc_at(n, (uintptr_t)__builtin_return_address(0)); }

void free(void *p) {
	if (!p) return;
	if (fast_free(gate_now(), p)) {
		__libc_free(p);
		return;
	}
	free_slow(p);
}

void *calloc(size_t n, size_t m) {
	void *p = __libc_calloc(n, m);
	uintptr_t ra = (uintptr_t)__builtin_return_address(0);
	if (likely(p != NULL) && fast_alloc(gate_now(), p, n * m, ra)) return p;
	return alloc_slow(p, n * m, ra);
}

static inline __attribute__((always_inline)) void *realloc_at(void *old, size_t n, uintptr_t ra) {
	if (!old) return malloc_at(n, ra);
	int rec = ready() && should_record();
	if (rec && !fast_free(gate_now(), old)) rec_free(old, 0, F_HOST);
	void *p = __libc_realloc(old, n);
	if (rec) {
		if (p) {
			if (!fast_alloc(gate_now(), p, n, ra)) rec_alloc(p, n, F_HOST, ra);
		} else if (n != 0) {
			rec_alloc(old, 0, F_HOST | F_UNDO, ra); // failed: the old block lives on
		}
	}
	return p;
}

void *reallocarray(void *old, size_t n, size_t m) {
	size_t bytes;
	if (__builtin_mul_overflow(n, m, &bytes)) {
		errno = ENOMEM;
		return NULL;
	}
	return realloc_at(old, bytes, (uintptr_t)__builtin_return_address(0));
}

void *realloc(void *old, size_t n) { return realloc_at(old, n, (uintptr_t)__builtin_return_address(0)); }

static inline __attribute__((always_inline)) void *aligned(size_t align, size_t n, uintptr_t ra) {
	void *p = __libc_memalign(align, n);
	if (ready() && should_record() && p) rec_alloc(p, n, F_HOST, ra);
	return p;
}

int posix_memalign(void **out, size_t align, size_t n) {
	if (align % sizeof(void *) || (align & (align - 1)) || align == 0) return EINVAL;
	int saved = errno;
	void *p = aligned(align, n, (uintptr_t)__builtin_return_address(0));
	if (!p) return ENOMEM;
	errno = saved;
	*out = p;
	return 0;
}

void *aligned_alloc(size_t align, size_t n) { return aligned(align, n, (uintptr_t)__builtin_return_address(0)); }
void *memalign(size_t align, size_t n) { return aligned(align, n, (uintptr_t)__builtin_return_address(0)); }

void *valloc(size_t n) {
	void *p = __libc_valloc(n);
	if (ready() && should_record() && p) rec_alloc(p, n, F_HOST, (uintptr_t)__builtin_return_address(0));
	return p;
}

void *pvalloc(size_t n) {
	void *p = __libc_pvalloc(n);
	if (ready() && should_record() && p) rec_alloc(p, n, F_HOST, (uintptr_t)__builtin_return_address(0));
	return p;
}

// Anonymous mappings (MMAP). glibc's own mmap is a thin syscall wrapper; ours
// is the same, so nothing is looked up before the first call.
void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
	if (off & 4095) {
		errno = EINVAL;
		return MAP_FAILED;
	}
	long r = syscall(SYS_mmap, addr, len, prot, flags, fd, off);
	void *p = (void *)r;
	// A mapping made from inside this library (the Go runtime maps through
	// cgo's _cgo_mmap) is dropped by rec_alloc, its unmapping here.
	if (p != MAP_FAILED && (flags & MAP_ANONYMOUS) && ready() && should_record()) rec_alloc(p, len, F_MMAP, (uintptr_t)__builtin_return_address(0));
	return p;
}
void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) __attribute__((alias("mmap")));

int munmap(void *addr, size_t len) {
	if (!in_self((uintptr_t)__builtin_return_address(0)) && ready() && should_record()) rec_free(addr, len, F_MMAP);
	return (int)syscall(SYS_munmap, addr, len);
}

// ---- threads: those started from this library are internal for life ----
typedef int (*pthread_create_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
static pthread_create_fn real_pthread_create;

struct tramp {
	void *(*fn)(void *);
	void *arg;
};

static void *internal_start(void *v) {
	struct tramp tr = *(struct tramp *)v;
	tls_guard = 1 << 20; // never recorded, whatever it calls
	tls.fast = NULL;

	__libc_free(v);
	return tr.fn(tr.arg);
}

// The program's asynchronous signals are its own: a signal it blocks (to
// sigwait for it, say) must never be delivered to msmemscope's threads. They
// start with these blocked (set in the creator around pthread_create, so there
// is no window before the thread runs), and Go's threads inherit the mask; the
// faults and SIGURG (Go's preemption) stay deliverable.
static void internal_sigmask(sigset_t *set) {
	sigfillset(set);
	int keep[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT, SIGURG};
	for (unsigned i = 0; i < sizeof keep / sizeof keep[0]; i++) sigdelset(set, keep[i]);
}

// Threads started from this library run on stacks it maps, never on ones
// from glibc's stack cache: glibc would hand a new thread the cached stack of
// a program thread that was joined, and with it that thread's DTV (a calloc
// the program's heap totals count, then never freed). Go's runtime starts
// its threads while the program runs, as its own start-up is asynchronous.
// The stack of such a thread is not unmapped if it exits (Go's never do;
// the drain thread brings and unmaps its own).
// Maps a stack of size bytes (rounded up to pages) with a guard page below
// it and initializes at to run a thread on it; returns the mapping (size +
// one page), or NULL.
static void *map_stack(pthread_attr_t *at, size_t size) {
	size = (size + 4095) & ~(size_t)4095;
	char *m = raw_mmap(size + 4096);
	if (!m) return NULL;
	mprotect(m, 4096, PROT_NONE);
	pthread_attr_init(at);
	pthread_attr_setstack(at, m + 4096, size);
	return m;
}

static int own_stack(const pthread_attr_t *attr, pthread_attr_t *own) {
	size_t size = 0;
	if (attr) {
		// With no stack set, glibc reports its address as 0 - stacksize.
		void *addr = NULL;
		size_t ssz = 0;
		if (pthread_attr_getstack(attr, &addr, &ssz) == 0 && addr && (uintptr_t)addr + ssz != 0) return 0; // brings its own
		pthread_attr_getstacksize(attr, &size);
	}
	if (!size) {
		pthread_attr_t d;
		if (pthread_getattr_default_np(&d) == 0) {
			pthread_attr_getstacksize(&d, &size);
			pthread_attr_destroy(&d);
		}
	}
	if (size < (64u << 10)) size = 8u << 20;
	if (!map_stack(own, size)) return 0;
	int ds;
	if (attr && pthread_attr_getdetachstate(attr, &ds) == 0) pthread_attr_setdetachstate(own, ds);
	return 1;
}

int pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg) {
	if (!real_pthread_create) {
		guard_up();
		real_pthread_create = (pthread_create_fn)dlsym(RTLD_NEXT, "pthread_create");
		guard_down();
	}
	if (in_self((uintptr_t)__builtin_return_address(0))) {
		guard_up();
		struct tramp *tr = __libc_malloc(sizeof *tr);
		int rc;
		if (!tr) {
			rc = EAGAIN;
		} else {
			tr->fn = fn;
			tr->arg = arg;
			sigset_t set, old;
			internal_sigmask(&set);
			pthread_attr_t own;
			int mine = own_stack(attr, &own);
			pthread_sigmask(SIG_BLOCK, &set, &old);
			rc = real_pthread_create(th, mine ? &own : attr, internal_start, tr);
			pthread_sigmask(SIG_SETMASK, &old, NULL);
			if (mine) pthread_attr_destroy(&own);
			if (rc) __libc_free(tr);
		}
		guard_down();
		return rc;
	}
	return real_pthread_create(th, attr, fn, arg);
}

// ---- fork and exec ----
typedef pid_t (*fork_fn)(void);
static fork_fn real_fork;

pid_t fork(void) {
	if (!real_fork) {
		guard_up();
		real_fork = (fork_fn)dlsym(RTLD_NEXT, "fork");
		guard_down();
	}
	pid_t pid = real_fork();
	if (pid > 0 && !ms_child && ready()) {
		guard_up();
		emit(R_FORK, 0, stamp_after(), (uint64_t)pid, 0, NULL, 0);
		guard_down();
	}
	return pid;
}

static int in_child(void) { return ms_child || (pid_t)syscall(SYS_getpid) != ms_mypid; }

// Before an exec replaces this image, everything recorded so far goes to the
// spool: the new image starts a capture of its own.
static void before_exec(const char *path) {
	if (in_child() || atomic_load(&ms_state) != 2) return;
	guard_up();
	emit(R_EXEC, F_TEXT, stamp_after(), 0, path ? strlen(path) : 0, path, path ? (uint32_t)strnlen(path, 4000) : 0);
	if (atomic_load(&ms_spool_fd) >= 0) ms_drain();
	guard_down();
}

#define REAL(name, type) \
	static type real_##name; \
	if (!real_##name) { \
		guard_up(); \
		real_##name = (type)dlsym(RTLD_NEXT, #name); \
		guard_down(); \
	}

typedef int (*execve_fn)(const char *, char *const[], char *const[]);
typedef int (*execv_fn)(const char *, char *const[]);

int execve(const char *path, char *const argv[], char *const envp[]) {
	REAL(execve, execve_fn);
	before_exec(path);
	return real_execve(path, argv, envp);
}
int execv(const char *path, char *const argv[]) {
	REAL(execv, execv_fn);
	before_exec(path);
	return real_execv(path, argv);
}
int execvp(const char *file, char *const argv[]) {
	REAL(execvp, execv_fn);
	before_exec(file);
	return real_execvp(file, argv);
}
int execvpe(const char *file, char *const argv[], char *const envp[]) {
	REAL(execvpe, execve_fn);
	before_exec(file);
	return real_execvpe(file, argv, envp);
}

#define COLLECT_ARGS(first, argv, withenv, envp) \
	int argc = 1; \
	va_list ap; \
	va_start(ap, first); \
	while (va_arg(ap, char *)) argc++; \
	va_end(ap); \
	char **argv = __builtin_alloca((argc + 1) * sizeof(char *)); \
	va_start(ap, first); \
	argv[0] = (char *)first; \
	for (int i = 1; i <= argc; i++) argv[i] = va_arg(ap, char *); \
	if (withenv) envp = va_arg(ap, char **); \
	va_end(ap);

int execl(const char *path, const char *arg, ...) {
	char **envp = NULL;
	COLLECT_ARGS(arg, argv, 0, envp);
	(void)envp;
	return execv(path, argv);
}
int execlp(const char *file, const char *arg, ...) {
	char **envp = NULL;
	COLLECT_ARGS(arg, argv, 0, envp);
	(void)envp;
	return execvp(file, argv);
}
int execle(const char *path, const char *arg, ...) {
	char **envp = NULL;
	COLLECT_ARGS(arg, argv, 1, envp);
	return execve(path, argv, envp);
}

// ---- the drain: rings -> spool ----
// Ring contents go to the spool with writev straight from the segments; a
// segment is recycled (or unmapped) only once its data has been written.
#define MAX_IOV 1024
static struct iovec iov[MAX_IOV];
static ms_chunk hdrs[MAX_IOV / 2];
static int niov, nhdr;
static struct {
	ms_thr *t;
	ms_seg *s;
	uint32_t direct; // units to write from s itself by direct I/O, after the iovecs
} done_segs[MAX_IOV / 2];
static int ndone;
static long drained_bytes;
static ms_rec cal_rec;

// Direct I/O (see ms_seg): a second descriptor on the spool opened with
// O_DIRECT, or -1 where the file system refuses it (tmpfs) or it failed once.
// The file is kept a multiple of DIO_ALIGN long before each direct write by a
// padding chunk that readers skip. A segment still being written is drained
// only once its oldest undrained events are DIO_WAIT_NS old (or at a forced
// drain): a busy thread fills it first, and it goes out whole.
static int dio_fd = -1;
static int pass_dio;          // this pass may write segments directly
static uint64_t pass_now;     // this pass's CLOCK_MONOTONIC ns
static int pass_waiting;      // this pass left young events in a ring
static int pass_direct;       // segments this pass wrote from memory
static _Atomic uint64_t drain_errs; // passes that failed to write
#define DIO_WAIT_NS 20000000ull

// Units the event starting at u spans (see hook.h).
static inline uint32_t ev_units(const uint64_t *u) {
	if (u[0] & C_COMPACT) return (u[0] & (C_FREE | C_SHORT)) ? 1 : (u[0] >> 48 & F_STACKID) ? 3 : 2;
	return REC_UNITS + (uint32_t)(u[0] & 0xffff); // a full record: n is the low half of unit 0
}

static int write_all(int fd, const void *buf, size_t n) {
	const char *p = buf;
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w < 0) {
			if (errno == EINTR) continue;
			return -1;
		}
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

static void seg_release(ms_thr *t, ms_seg *s) {
	atomic_fetch_sub(&t->segs, 1);
	if (s->cap == SEG_CAP && atomic_load_explicit(&spare_total, memory_order_relaxed) < SPARE_MAX) {
		atomic_store_explicit(&s->head, 0, memory_order_relaxed);
		atomic_store_explicit(&s->next, NULL, memory_order_relaxed);
		s->tail = 0;
		for (int i = 0; i < NSPARE; i++) {
			ms_seg *empty = NULL;
			if (atomic_compare_exchange_strong_explicit(&t->spare[i], &empty, s, memory_order_release, memory_order_relaxed)) {
				atomic_fetch_add_explicit(&spare_total, 1, memory_order_relaxed);
				return; // reused next time: no page faults
			}
		}
	}
	raw_munmap(s, s->bytes);
}

// Rotating logs (--log-mode=rotate): the Go engine drains into memory
// (ms_drain_into), compresses and rotates; the sink replaces the file.
static char *sink;
static size_t sink_cap, sink_used, iov_pending;

// A padding chunk of len bytes (>= its header) at p: readers skip it.
static void pad_chunk(void *p, size_t len) {
	ms_chunk h = {MS_PAD_MAGIC, (uint32_t)((len - sizeof(ms_chunk)) / 8), 0, 0};
	memcpy(p, &h, sizeof h);
}

// Pads the spool, through fd, to a multiple of DIO_ALIGN; -1 on error.
static int spool_align(int fd) {
	off_t end = lseek(fd, 0, SEEK_END);
	if (end < 0) return -1;
	size_t len = (size_t)(-end & (DIO_ALIGN - 1));
	if (!len) return 0;
	if (len < sizeof(ms_chunk)) len += DIO_ALIGN;
	uint64_t buf[(DIO_ALIGN + sizeof(ms_chunk)) / 8] = {0};
	pad_chunk(buf, len);
	if (write_all(fd, buf, len)) return -1;
	drained_bytes += (long)len;
	return 0;
}

// Writes v[0..n) to fd, going on after short writes; -1 (errno set) when a
// write fails, with v advanced past what went out.
static int writev_all(int fd, struct iovec *v, int n) {
	int i = 0;
	while (i < n) {
		ssize_t w = writev(fd, &v[i], n - i); // n <= MAX_IOV, the kernel's limit
		if (w < 0) {
			if (errno == EINTR) continue;
			for (int j = 0; j < i; j++) v[j].iov_len = 0;
			return -1;
		}
		drained_bytes += w;
		while (i < n && (size_t)w >= v[i].iov_len) w -= (ssize_t)v[i++].iov_len;
		if (i < n) {
			v[i].iov_base = (char *)v[i].iov_base + w;
			v[i].iov_len -= (size_t)w;
		}
	}
	return 0;
}

// The segments done this flush whose whole content goes out from memory, as
// chunks (header in front of the data, a padding chunk up to DIO_ALIGN), in
// one direct writev: the kernel has them all in flight at once, and the drain
// wakes once. Both descriptors append, so a write racing this one (after the
// final drain) leaves the end misaligned and the direct write refused, not
// lost: then the rest, and every later write, goes through fd.
static struct iovec dio_iov[MAX_IOV / 2];
static int segs_write(int fd) {
	int n = 0;
	for (int j = 0; j < ndone; j++) {
		uint32_t units = done_segs[j].direct;
		if (!units) continue;
		ms_seg *s = done_segs[j].s;
		s->hdr = (ms_chunk){MS_CHUNK_MAGIC, units, done_segs[j].t->tid, ms_mypid};
		size_t end = sizeof(ms_chunk) + (size_t)units * 8;
		size_t len = (end + DIO_ALIGN - 1) & ~(size_t)(DIO_ALIGN - 1);
		if (len > end && len - end < sizeof(ms_chunk)) len += DIO_ALIGN;
		if (len > end) pad_chunk((char *)s + SEG_META + end, len - end);
		dio_iov[n++] = (struct iovec){(char *)s + SEG_META, len};
	}
	if (!n) return 0;
	pass_direct += n;
	if (dio_fd >= 0 && !spool_align(fd)) {
		if (!writev_all(dio_fd, dio_iov, n)) return 0;
		close(dio_fd);
		dio_fd = -1;
	}
	return writev_all(fd, dio_iov, n);
}

static int iov_flush(int fd) {
	int rc = 0, i = 0;
	if (sink) {
		for (; i < niov; i++) {
			memcpy(sink + sink_used, iov[i].iov_base, iov[i].iov_len);
			sink_used += iov[i].iov_len;
		}
		drained_bytes += (long)iov_pending;
	}
	iov_pending = 0;
	if (i < niov) rc = writev_all(fd, &iov[i], niov - i);
	niov = nhdr = 0;
	if (!rc) rc = segs_write(fd);
	for (int j = 0; j < ndone; j++) seg_release(done_segs[j].t, done_segs[j].s);
	ndone = 0;
	return rc;
}

static int add_chunk(int fd, int32_t tid, const uint64_t *r, uint32_t n) {
	if (niov + 2 > MAX_IOV && iov_flush(fd)) return -1;
	hdrs[nhdr] = (ms_chunk){MS_CHUNK_MAGIC, n, tid, ms_mypid};
	iov[niov++] = (struct iovec){&hdrs[nhdr++], sizeof(ms_chunk)};
	iov[niov++] = (struct iovec){(void *)r, (size_t)n * 8};
	iov_pending += sizeof(ms_chunk) + (size_t)n * 8;
	return 0;
}

// A drain pass begins a new epoch: its calibration point (taken before the
// epoch moves on, so no thread stamps earlier in it) goes out first.
// Callers hold ms_drain_lock.
static int epoch_start(int fd) {
	uint64_t e = epoch_now() + 1;
	cal_rec = (ms_rec){0, F_EPOCH, R_CALIB, stamp_after(), mono_ns(), e};
	gate_set(~G_EPOCH, e & G_EPOCH);
	return add_chunk(fd, 0, (const uint64_t *)&cal_rec, REC_UNITS);
}

// How many of n units (whole events only) still fit in the sink.
static uint32_t sink_fit(const uint64_t *r, uint32_t n) {
	size_t room = sink_cap - sink_used - iov_pending;
	if (room < sizeof(ms_chunk) + sizeof(ms_rec)) return 0;
	size_t maxu = (room - sizeof(ms_chunk)) / 8;
	if (n <= maxu) return n;
	uint32_t take = 0;
	while (take < n) {
		uint32_t ev = ev_units(&r[take]);
		if (take + ev > maxu) break;
		take += ev;
	}
	return take;
}

// Moves a thread's published records [tail, h) of s out: 0 done, 1 the sink
// is full (the rest stays in the ring), -1 error.
static int drain_range(int fd, ms_thr *t, ms_seg *s, uint32_t h) {
	if (h <= s->tail) return 0;
	uint32_t take = h - s->tail;
	if (sink) take = sink_fit(&s->u[s->tail], take);
	if (take && add_chunk(fd, t->tid, &s->u[s->tail], take)) return -1;
	s->tail += take;
	return s->tail < h ? 1 : 0;
}

// s is drained for good once the pending iovecs are written; direct units
// of it (its whole content) are to be written from s itself after them.
static int seg_done(int fd, ms_thr *t, ms_seg *s, uint32_t direct) {
	if (ndone == MAX_IOV / 2 && iov_flush(fd)) return -1;
	done_segs[ndone].t = t;
	done_segs[ndone].s = s;
	done_segs[ndone].direct = direct;
	ndone++;
	return 0;
}

static long write_direct(const uint64_t *r, uint32_t n, int32_t tid) {
	int fd = atomic_load(&ms_spool_fd);
	if (fd < 0) {
		atomic_fetch_add(&ms_lost_count, 1);
		return -1;
	}
	char buf[sizeof(ms_chunk) + (REC_UNITS + DIRECT_UNITS) * 8];
	ms_chunk h = {MS_CHUNK_MAGIC, n, tid, ms_mypid};
	memcpy(buf, &h, sizeof h);
	memcpy(buf + sizeof h, r, n * 8);
	return write_all(fd, buf, sizeof h + n * 8); // O_APPEND: one write, one chunk
}

// How far the writer got in s, the drain's segment: its final head once the
// writer moved on (s->next set), else the writer's position; -1 while the
// writer is between the two (try again next pass).
static int64_t seg_head(ms_thr *t, ms_seg *s, ms_seg **next) {
	*next = atomic_load_explicit(&s->next, memory_order_acquire);
	if (*next) return atomic_load_explicit(&s->head, memory_order_acquire);
	uint64_t *wp = atomic_load_explicit(&t->wp, memory_order_acquire);
	// After the final drain began nobody may write a pending pair half out
	// but its owner, who may never run again: take it as it is.
	if (wp && atomic_load_explicit(&ms_direct, memory_order_acquire) && *(volatile uint32_t *)&t->half) wp++;
	if (wp < s->u || wp > s->u + s->cap) return -1;
	return wp - s->u;
}

// Moves out what thread t has published. A segment its writer has left goes
// out directly when none of it was drained before (see dio_fd); the one it
// writes now waits while young, and always after a direct write of this pass,
// as direct writes follow the iovecs of the same flush.
static int drain_thread(int fd, ms_thr *t) {
	int dead = atomic_load_explicit(&t->state, memory_order_acquire) == 1;
	ms_seg *s = t->rseg, *next = NULL;
	int64_t h = -1;
	int queued = 0;
	while (s) {
		h = seg_head(t, s, &next);
		if (h < 0) break;
		uint32_t direct = next && pass_dio && s->tail == 0 && h > 0 ? (uint32_t)h : 0;
		if (!next && h > s->tail && pass_dio) {
			if (!t->wait_since) t->wait_since = pass_now;
			if (queued || (!dead && pass_now - t->wait_since < DIO_WAIT_NS)) {
				pass_waiting = 1;
				break;
			}
		}
		if (!direct) {
			int rc = drain_range(fd, t, s, (uint32_t)h);
			if (rc) return rc;
		}
		t->wait_since = 0;
		if (!next) break;
		t->rseg = next; // the writer moved on: s is drained for good
		if (seg_done(fd, t, s, direct)) return -1;
		queued |= direct != 0;
		s = next;
	}
	// A dead thread, fully drained: release its ring for reuse, unless the
	// thread took it back meanwhile (thr_acquire).
	if (dead && s && h == s->tail && !next) {
		int one = 1;
		if (!atomic_compare_exchange_strong(&t->state, &one, 3)) return 0;
		if (iov_flush(fd)) {
			atomic_store(&t->state, 1);
			return -1;
		}
		raw_munmap(s, s->bytes);
		atomic_fetch_sub(&t->segs, 1);
		for (int i = 0; i < NSPARE; i++) {
			ms_seg *sp = atomic_exchange(&t->spare[i], NULL);
			if (sp) {
				atomic_fetch_sub(&spare_total, 1);
				raw_munmap(sp, sp->bytes);
			}
		}
		t->rseg = t->wseg = NULL;
		t->wend = t->flim = NULL;
		atomic_store(&t->wp, NULL);
		atomic_store(&t->state, 2);
	}
	return 0;
}

// One pass: every thread's published events to the spool; with dio, by
// direct I/O where it may, leaving young partial segments for later (their
// undrained events are counted in pass_waiting).
static long drain_pass(int dio) {
	int fd = atomic_load(&ms_spool_fd);
	if (fd < 0 || ms_child) return -1;
	guard_up();
	pthread_mutex_lock(&ms_drain_lock);
	long before = drained_bytes;
	pass_dio = dio && dio_fd >= 0 && !atomic_load(&ms_direct);
	pass_now = pass_dio ? mono_ns() : 0;
	pass_waiting = pass_direct = 0;
	int rc = epoch_start(fd);
	for (ms_thr *t = atomic_load(&ms_threads); t && !rc; t = t->next_all) {
		if (atomic_load(&t->state) == 2) continue;
		rc = drain_thread(fd, t);
	}
	if (iov_flush(fd)) rc = -1;
	long out = rc ? -1 : drained_bytes - before;
	pass_dio = 0;
	pthread_mutex_unlock(&ms_drain_lock);
	guard_down();
	return out;
}

// Drains everything published, through the page cache.
long ms_drain(void) { return drain_pass(0); }


// ---- the drain thread (spool mode) ----
// Plain C, not a goroutine: a 1 ms goroutine timer kept the Go runtime awake
// (sysmon, timer and scheduler wakeups, ~2,000 a second), and on a machine
// with no spare core each wakeup preempted a program thread. Now the runtime
// sleeps while the program runs. An idle process is polled less often, up to
// every 8 ms.
static pthread_t drainer;
static int drainer_on, drainer_quit;
// It brings its own stack (never one of glibc's: see own_stack), small, and
// unmapped after the join at exit.
#define DRAINER_STACK (256u << 10)
static void *drainer_stack;
static pthread_mutex_t drainer_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t drainer_cv;

static void *drainer_main(void *arg) {
	(void)arg;
	int idle = 0;
	pthread_mutex_lock(&drainer_mu);
	while (!drainer_quit) {
		pthread_mutex_unlock(&drainer_mu);
		long n = drain_pass(1);
		if (n < 0) atomic_fetch_add(&drain_errs, 1);
		// A pass that found no events wrote only its calibration point.
		if (n > (long)(sizeof(ms_chunk) + sizeof(ms_rec)) || pass_waiting) idle = 0;
		else if (idle < 3) idle++;
		if (pass_direct) {
			// The disk took whole segments, and that took a while: more are
			// likely full. Keep it busy rather than sleep.
			pthread_mutex_lock(&drainer_mu);
			continue;
		}
		struct timespec until;
		clock_gettime(CLOCK_MONOTONIC, &until);
		until.tv_nsec += 1000000L << idle;
		if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
		pthread_mutex_lock(&drainer_mu);
		while (!drainer_quit && pthread_cond_timedwait(&drainer_cv, &drainer_mu, &until) != ETIMEDOUT) {
		}
	}
	pthread_mutex_unlock(&drainer_mu);
	return NULL;
}

int ms_drainer_start(void) {
	if (drainer_on) return 0;
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&drainer_cv, &ca);
	pthread_condattr_destroy(&ca);
	drainer_quit = 0;
	pthread_attr_t at;
	if (!(drainer_stack = map_stack(&at, DRAINER_STACK))) return ENOMEM;
	int rc = pthread_create(&drainer, &at, drainer_main, NULL); // internal: see pthread_create
	pthread_attr_destroy(&at);
	drainer_on = rc == 0;
	if (rc) {
		raw_munmap(drainer_stack, DRAINER_STACK + 4096);
		drainer_stack = NULL;
	}
	return rc;
}

uint64_t ms_drainer_stop(void) {
	if (drainer_on && !in_child()) { // a forked child has no drain thread
		pthread_mutex_lock(&drainer_mu);
		drainer_quit = 1;
		pthread_cond_signal(&drainer_cv);
		pthread_mutex_unlock(&drainer_mu);
		pthread_join(drainer, NULL);
		pthread_cond_destroy(&drainer_cv);
		raw_munmap(drainer_stack, DRAINER_STACK + 4096);
		drainer_stack = NULL;
		drainer_on = 0;
	}
	return atomic_load(&drain_errs);
}

// Drains into buf (cap bytes, at least 64 KiB) instead of the spool file, in
// the spool's chunk format, whole events only. Returns the bytes written;
// when close to cap, call again: the rest is still in the rings.
long ms_drain_into(void *buf, long cap) {
	if (ms_child || cap < 4096) return -1;
	guard_up();
	pthread_mutex_lock(&ms_drain_lock);
	sink = buf;
	sink_cap = (size_t)cap;
	sink_used = iov_pending = 0;
	int rc = epoch_start(-1);
	for (ms_thr *t = atomic_load(&ms_threads); t && !rc; t = t->next_all) {
		if (atomic_load(&t->state) == 2) continue;
		rc = drain_thread(-1, t);
	}
	if (iov_flush(-1)) rc = -1;
	long out = rc < 0 ? -1 : (long)sink_used;
	sink = NULL;
	pthread_mutex_unlock(&ms_drain_lock);
	guard_down();
	return out;
}

void ms_calibrate(void) {
	int fd = atomic_load(&ms_spool_fd);
	if (fd < 0) return;
	ms_rec r = {0, 0, R_CALIB, stamp_after(), mono_ns(), epoch_now()};
	guard_up();
	pthread_mutex_lock(&ms_drain_lock);
	write_direct((const uint64_t *)&r, REC_UNITS, 0);
	pthread_mutex_unlock(&ms_drain_lock);
	guard_down();
}

void ms_set_spool(int fd) {
	const char *off = getenv("MSMEMSCOPE_DIRECT_IO"); // "0": through the page cache only
	if (fd >= 0 && dio_fd < 0 && !(off && off[0] == '0')) {
		char path[40];
		snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
		dio_fd = open(path, O_WRONLY | O_DIRECT | O_APPEND | O_CLOEXEC);
	}
	atomic_store(&ms_spool_fd, fd);
}

// The end of the run: PROCESS_EXIT, and from now on direct writes; what is
// in the rings (pending pair halves too) goes out with the next drain, into
// the spool (ms_finish) or the rotating logs (ms_drain_into: each thread's
// past is known there, not in the raw spool read after the logs).
int ms_finish_begin(void) {
	if (in_child()) return 0;
	guard_up();
	uint64_t lost = atomic_load(&ms_lost_count);
	emit(R_EXIT, 0, stamp_after(), 0, 0, NULL, 0);
	if (lost) emit(R_LOST, 0, stamp_after(), lost, 0, NULL, 0);
	ms_calibrate();
	atomic_store(&ms_direct, 1);
	ms_fast_update();
	guard_down();
	return 1;
}

void ms_finish(void) {
	if (ms_finish_begin()) ms_drain();
}

int ms_pid(void) { return ms_mypid; }
uint64_t ms_lost(void) { return atomic_load(&ms_lost_count); }
uint64_t ms_forks(void) { return atomic_load(&ms_fork_count); }
int ms_is_child(void) { return in_child(); }
void ms_guard_enter(void) { guard_up(); }
void ms_guard_leave(void) { guard_down(); }

// ---- for the Python side (pystack.c, api.go) ----
void ms_emit(uint16_t kind, uint16_t flags, uint64_t a, uint64_t b, const void *payload, uint32_t plen) {
	emit(kind, flags, stamp_after(), a, b, payload, plen);
}

void ms_set_hook(int heap, int cstack) {
	if (cstack > MAX_FRAMES) cstack = MAX_FRAMES;
	if (cstack > 0 && !unw_lib) {
		guard_up();
		unw_lib = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
		if (unw_lib) unw_backtrace_fn = (int (*)(void **, int))dlsym(unw_lib, "unw_backtrace");
		guard_down();
	}
	cfg_cstack = cstack;
	cfg_heap = heap;
	if (!ms_child) atomic_store(&ms_active, heap);
	ms_fast_update();
}

extern void *ms_own_malloc(size_t) __attribute__((alias("malloc"), copy(malloc), visibility("hidden")));
// The main program's handle searches the global scope in order: our malloc
// comes first only if this copy was preloaded or linked (RTLD_DEFAULT would
// search this object's own scope first when it was dlopen'ed).
// Computed once, at load (pystack.c's constructor), while the loader runs.
int ms_interposed(void) {
	static int known = -1;
	if (known < 0) {
		void *self = dlopen(NULL, RTLD_NOW | RTLD_NOLOAD);
		known = self && dlsym(self, "malloc") == (void *)ms_own_malloc;
		if (self) dlclose(self);
	}
	return known;
}

// ---- public C API (include/msmemscope.h); C shims that never enter Go in a child ----
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
	return api_event(R_START, 0, 0, NULL);
}

int msmemscope_stop(void) {
	if (in_child()) return -1;
	ready();
	if (!atomic_exchange(&ms_collecting, 0)) return 0;
	ms_fast_update();
	return api_event(R_STOP, 0, 0, NULL);
}

int msmemscope_step(void) { return api_event(R_STEP, 0, 0, NULL); }

void mstxMarkA(const char *msg, void *stream) {
	(void)stream;
	api_event(R_MARK, 0, atomic_fetch_add(&ms_mstx_next, 1), msg ? msg : "");
}

uint64_t mstxRangeStartA(const char *msg, void *stream) {
	(void)stream;
	uint64_t id = atomic_fetch_add(&ms_mstx_next, 1);
	if (api_event(R_RSTART, 0, id, msg ? msg : "")) return 0;
	return id;
}

void mstxRangeEnd(uint64_t id) { api_event(R_REND, 0, id, NULL); }

// PyTorch events (R_OP_START..R_TAG) from the Python package: text payload.
int msmemscope_torch_event(uint16_t kind, uint64_t a, const char *payload, uint32_t len) {
	if (kind < R_OP_START || kind > R_TAG || in_child()) return -1;
	ready();
	guard_up();
	emit(kind, payload ? F_TEXT : 0, stamp_after(), a, len, payload, payload ? len : 0);
	guard_down();
	return 0;
}

// ---- exit ----
extern void msGoAtExit(void);

// Runs after main returns or exit() is called. Events after the final drain
// (frees in other libraries' destructors) go straight to the spool.
__attribute__((destructor)) static void ms_dtor(void) {
	if (in_child() || atomic_load(&ms_state) != 2) return;
	guard_up();
	msGoAtExit(); // waits for the Go runtime's start, then calls ms_finish
	guard_down();
}
