// The interposed allocator symbols (SPEC §4.1) and their fast path: a
// compact record straight into the calling thread's ring (ring.c) while the
// gate allows it, else the general path (rec_alloc, rec_free) with stamps,
// sites and stacks (stacks.c).
#include "internal.h"

#include <errno.h>

HIDDEN _Atomic uint64_t ms_gate = 1;

// The gate's parts change apart (a drain pass, a switch of the tag).
HIDDEN uint64_t gate_set(uint64_t keep, uint64_t set) {
	uint64_t g = atomic_load(&ms_gate), n;
	do n = (g & keep) | set;
	while (!atomic_compare_exchange_weak(&ms_gate, &g, n));
	return n;
}

// ---- the general path ----
static void rec_alloc(void *p, size_t size, uint16_t sub, uintptr_t ra) {
	// Made from inside this library (cgo's own C, say, on a program thread
	// entering Go before the guard is up): msmemscope's, not the program's.
	// Its site never enters the table, so the fast path never takes it.
	if (unlikely(in_self(ra))) return;
	guard_up();
	ms_thr *t = cur_thr();
	if (likely(t != NULL)) t->last_ra = 0; // the next fast MALLOC names its site again
	uint64_t ts = t ? ev_stamp(t, 1) : stamp_after();
	int own = ms_tls.own; // read once: the calls below keep the compiler from merging reads
	uint16_t fl = sub | (atomic_load_explicit(&ms_collecting, memory_order_relaxed) ? 0 : F_OFF) |
	              (own && !(sub & F_UNDO) ? F_OWN : 0); // a failed realloc's block stays the program's
	uint32_t site = site_id(ra);
	if (unlikely(site == SITE_SELF)) {
		guard_down();
		return;
	}
	if (unlikely(ms_py_depth > 0) && !own)
		emit_with_stacks(fl, ts, (uint64_t)p, size, site);
	else if (cfg_cstack > 0 && !own) // msmemscope's own blocks make no rows: no stacks
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
// The tag is computed inside the exchange loop: two threads changing the
// state at once (precise stamps switched on by one, off by the drain) both
// retry until the gate says what the state says last.
void ms_fast_update(void) {
	uint64_t g = atomic_load(&ms_gate), n;
	do {
		int f = atomic_load(&ms_state) == 2 && atomic_load(&ms_active) && !atomic_load(&ms_direct) && !ms_child &&
		        atomic_load(&site_tab);
		uint16_t fl = F_HOST | (atomic_load(&ms_collecting) ? 0 : F_OFF);
		// C_SHORT: the forms that need their reader to know the thread's past
		// (short MALLOCs, pair halves: F_HOST alone) may be written.
		int precise = atomic_load(&ms_precise);
		// The fast path stamps with the TSC: without an invariant one the
		// stamps are CLOCK_MONOTONIC, taken on the general path.
		f = f && !(precise && !ms_use_tsc);
		// C_SHORT also allows stamped halves (also read with the thread's past).
		// G_STACKS: MALLOCs take stacks, on the general path; FREEs, which
		// take none, keep the fast one.
		n = (g & G_EPOCH) | (f ? enc_tag(fl) | (ms_rotating || (fl & F_OFF) ? 0 : C_SHORT) | (precise ? G_PRECISE : 0) |
		                             (cfg_cstack > 0 || ms_py_depth > 0 ? G_STACKS : 0)
		                       : 0);
	} while (!atomic_compare_exchange_weak(&ms_gate, &g, n));
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

// Whether ra is a known allocation site in its home slot (*site): the tag
// is on only once the site table exists; slot 0 stays empty.
static inline __attribute__((always_inline)) int fast_site(uintptr_t ra, uint32_t *site) {
	uintptr_t *tab = atomic_load_explicit(&site_tab, memory_order_relaxed);
	*site = site_hash(ra);
	return tab[*site] == ra;
}

// While two threads record (G_PRECISE): each event with its stamp, in one
// unit when it fits a stamped half (near the thread's last address, its
// stamp soon after the last), else a stamp unit and the compact record.
static __attribute__((noinline)) int fast_precise(ms_thr *t, uint64_t *w, uint64_t g, uint64_t p, size_t n,
                                                  uintptr_t ra, int is_malloc) {
	uint64_t ts = stamp_fast(); // after the malloc, before the free: inside the call's window
	if (unlikely(t->half) && !ring_room(t, w = half_close(t), 3)) return 0;
	uint64_t delta = ts - t->last_stamp, d = p - t->last_ptr;
	// A half has no flags (F_HOST alone) and needs its thread's past: only
	// where the gate allows the short forms (C_SHORT).
	if (likely(delta <= P_STAMP_DMAX && (g & C_SHORT))) {
		if (is_malloc ? ra == t->last_ra && ENC_HALF_MALLOC_FITS(d, n) : ENC_HALF_FREE_FITS(d)) {
			enc_stamped_half(w, delta, is_malloc ? enc_half_malloc(d, n) : enc_half_free(d));
			t->last_stamp = ts;
			publish(t, w, p, 1);
			return 1;
		}
	}
	if (unlikely(ts > P_STAMP_MAX)) return 0;
	uint64_t tag = g & ~(C_SHORT | G_PRECISE | G_STACKS | G_EPOCH);
	if (is_malloc) {
		if (unlikely(((p | n) > C_MAX) | (g & G_STACKS))) return 0;
		uint32_t site;
		if (unlikely(!fast_site(ra, &site))) return 0;
		t->last_ra = ra;
		publish(t, w, p, put_stamp(t, w, ts) + enc_malloc(w + 1, tag, p, n, site));
		return 1;
	}
	if (unlikely(p > C_MAX)) return 0;
	publish(t, w, p, put_stamp(t, w, ts) + enc_free(w + 1, tag, p));
	return 1;
}

static inline __attribute__((always_inline)) int fast_alloc(uint64_t g, void *p, size_t n, uintptr_t ra) {
	ms_thr *t = ms_tls.fast;
	if (unlikely(t == NULL)) return 0;
	uint64_t *w;
	if (unlikely(!fast_slot(t, g, &w))) return 0;
	if (g & G_PRECISE) return fast_precise(t, w, g, (uint64_t)p, n, ra, 1);
	// The same call site as the thread's last MALLOC (a loop, mostly): half
	// a unit when small and near the last address, else one; the reader
	// knows the site from that MALLOC.
	if (likely(ra == t->last_ra && (g & C_SHORT))) {
		uint64_t d = (uint64_t)p - t->last_ptr;
		if (likely(ENC_HALF_MALLOC_FITS(d, n))) {
			put_half(t, w, (uint64_t)p, enc_half_malloc(d, n));
			return 1;
		}
		if (ENC_SHORT_FITS((uintptr_t)p, n)) {
			if (unlikely(t->half) && !ring_room(t, w = half_close(t), 1)) return 0;
			publish(t, w, (uint64_t)p, enc_short(w, (uint64_t)p, n, 0));
			return 1;
		}
	}
	// Stacks wanted (G_STACKS): every MALLOC takes the general path. The
	// branch above never runs then: ev_stamp clears last_ra under such a
	// gate. (Tested here, off the loop's path: at the top it cost ~1 ns a
	// pair.)
	if (unlikely((((uintptr_t)p | n) > C_MAX) | (g & G_STACKS))) return 0;
	uint32_t site;
	if (unlikely(!fast_site(ra, &site))) return 0;
	if (unlikely(t->half) && !ring_room(t, w = half_close(t), 2)) return 0;
	t->last_ra = ra;
	publish(t, w, (uint64_t)p, enc_malloc(w, g & ~(C_SHORT | G_STACKS | G_EPOCH), (uint64_t)p, n, site));
	return 1;
}

static inline __attribute__((always_inline)) int fast_free(uint64_t g, void *p) {
	ms_thr *t = ms_tls.fast;
	if (unlikely(t == NULL)) return 0;
	uint64_t *w;
	if (unlikely(!fast_slot(t, g, &w))) return 0;
	if (g & G_PRECISE) return fast_precise(t, w, g, (uint64_t)p, 0, 0, 0);
	// A pair half names p relative to the last address: p's width is no matter.
	uint64_t d = (uint64_t)p - t->last_ptr;
	if (likely((g & C_SHORT) && ENC_HALF_FREE_FITS(d))) {
		put_half(t, w, (uint64_t)p, enc_half_free(d));
		return 1;
	}
	if (unlikely((uintptr_t)p > C_MAX)) return 0;
	if (unlikely(t->half) && !ring_room(t, w = half_close(t), 1)) return 0;
	publish(t, w, (uint64_t)p, enc_free(w, g & ~(C_SHORT | G_STACKS | G_EPOCH), (uint64_t)p));
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
	ms_libc.free(p);
}

static inline __attribute__((always_inline)) void *malloc_at(size_t n, uintptr_t ra) {
	void *p = ms_libc.malloc(n);
	if (likely(p != NULL) && fast_alloc(gate_now(), p, n, ra)) return p;
	return alloc_slow(p, n, ra);
}

void *malloc(size_t n) { return malloc_at(n, (uintptr_t)__builtin_return_address(0)); }

void free(void *p) {
	if (!p) return;
	if (fast_free(gate_now(), p)) {
		ms_libc.free(p);
		return;
	}
	free_slow(p);
}

void *calloc(size_t n, size_t m) {
	void *p = ms_libc.calloc(n, m);
	uintptr_t ra = (uintptr_t)__builtin_return_address(0);
	if (likely(p != NULL) && fast_alloc(gate_now(), p, n * m, ra)) return p;
	return alloc_slow(p, n * m, ra);
}

static inline __attribute__((always_inline)) void *realloc_at(void *old, size_t n, uintptr_t ra) {
	if (!old) return malloc_at(n, ra);
	int rec = ready() && should_record();
	if (rec && !fast_free(gate_now(), old)) rec_free(old, 0, F_HOST);
	void *p = ms_libc.realloc(old, n);
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
	void *p = ms_libc.memalign(align, n);
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
	void *p = ms_libc.valloc(n);
	if (ready() && should_record() && p) rec_alloc(p, n, F_HOST, (uintptr_t)__builtin_return_address(0));
	return p;
}

void *pvalloc(size_t n) {
	void *p = ms_libc.pvalloc(n);
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
	// cgo's _cgo_mmap) is no row (rec_alloc drops it, its unmapping here)
	// and never a root of the leak-kind scan.
	uintptr_t ra = (uintptr_t)__builtin_return_address(0);
	if (p != MAP_FAILED && in_self(ra)) {
		own_map(p, len);
		return p;
	}
	if (p != MAP_FAILED && (flags & MAP_ANONYMOUS) && !in_unwinder(ra) && ready() && should_record()) rec_alloc(p, len, F_MMAP, ra);
	return p;
}
void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) __attribute__((alias("mmap")));

int munmap(void *addr, size_t len) {
	uintptr_t ra = (uintptr_t)__builtin_return_address(0);
	if (in_self(ra)) {
		int r = (int)syscall(SYS_munmap, addr, len);
		if (r == 0) own_unmap(addr, len);
		return r;
	}
	if (!in_unwinder(ra) && ready() && should_record()) rec_free(addr, len, F_MMAP);
	return (int)syscall(SYS_munmap, addr, len);
}

// glibc's own names for its allocator, called by name by some programs
// (valgrind replaces them too): the same entry points.
void *__libc_malloc(size_t n) __attribute__((alias("malloc"), copy(malloc)));
void __libc_free(void *p) __attribute__((alias("free"), copy(free)));
void *__libc_calloc(size_t n, size_t m) __attribute__((alias("calloc"), copy(calloc)));
void *__libc_realloc(void *old, size_t n) __attribute__((alias("realloc"), copy(realloc)));
void *__libc_memalign(size_t align, size_t n) __attribute__((alias("memalign"), copy(memalign)));
void *__libc_valloc(size_t n) __attribute__((alias("valloc"), copy(valloc)));
void *__libc_pvalloc(size_t n) __attribute__((alias("pvalloc"), copy(pvalloc)));

// This copy's malloc, for ms_interposed (lifecycle.c): an alias must be
// defined beside its target.
extern void *ms_own_malloc(size_t) __attribute__((alias("malloc"), copy(malloc), visibility("hidden")));
