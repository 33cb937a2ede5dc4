// Per-thread rings: each thread writes its events into segments of its own
// (ms_seg, ms_thr in internal.h) that the drain (drain.c) takes out; the
// general event writer (emit_n) for every record the fast path does not write.
#include "internal.h"

__thread ms_tls_t ms_tls TLS_ATTR;
HIDDEN ms_thr *_Atomic ms_threads;
HIDDEN _Atomic int spare_total;
HIDDEN _Atomic uint64_t ms_lost_count;

// A thread's end: its ring is left for the drain to release. What the
// thread does after this (other keys' destructors, glibc's own clean-up)
// takes the ring back while the drain has not released it (thr_acquire),
// else a fresh one: the drain wrote the old one out in full first, so a
// tid's records stay in order (readers take its chunks in file order).
HIDDEN void thr_key_dtor(void *v) {
	ms_thr *t = v;
	if (t && tls_thr == t) {
		// Below this frame, the thread's frames are dead; above it are
		// glibc's start frame, the thread's descriptor and its TLS.
		uintptr_t top = (uintptr_t)__builtin_frame_address(0);
		if (ms_tls.frames_top > top && ms_tls.frames_top < t->stack_hi) top = ms_tls.frames_top;
		if (t->stack_lo) dead_stack_note(t->stack_lo, top);
		half_close(t);
		ms_tls.prev = t;
		ms_tls.prev_state = THR_WITH(atomic_load_explicit(&t->state, memory_order_relaxed), THR_DEAD);
		set_thr(NULL);
		atomic_store_explicit(&t->state, ms_tls.prev_state, memory_order_release);
	}
	crash_altstack_free();
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
			if (pthread_attr_getstack(&at, &addr, &sz) == 0) {
				t->stack_hi = (uintptr_t)addr + sz;
				t->stack_lo = (uintptr_t)addr;
			}
			pthread_attr_destroy(&at);
		}
	}
	if (t->stack_hi < sp) t->stack_hi = sp + 64 * 1024; // unknown: stay near the current frame
}

// While two threads record, every MALLOC and FREE carries a precise stamp
// taken inside the allocator call's window (before free, after malloc):
// two threads' events on one address are then in the order the allocator
// gave them, and the reader repairs only the stamps' jitter with the
// allocator's rules (spool/order.go). A thread alone needs none: its ring is
// in program order. Two threads record when a second one enters an epoch
// another thread recorded in (precise_check); after PRECISE_IDLE epochs with
// one thread the stamps stop (drain.c, precise_idle).
HIDDEN _Atomic int ms_precise;
HIDDEN _Atomic uint64_t ms_epoch_owner; // epoch (low 32 bits) << 32 | the first thread to record in it
HIDDEN _Atomic uint64_t ms_epoch_shared; // the last epoch two threads recorded in

HIDDEN void precise_check(ms_thr *t, uint64_t e) {
	uint64_t mine = (e & 0xffffffffu) << 32 | (uint32_t)t->tid;
	uint64_t o = atomic_load_explicit(&ms_epoch_owner, memory_order_relaxed);
	while (o >> 32 != (e & 0xffffffffu)) {
		if (atomic_compare_exchange_weak(&ms_epoch_owner, &o, mine)) return;
	}
	if ((uint32_t)o == (uint32_t)t->tid) return;
	atomic_store_explicit(&ms_epoch_shared, e, memory_order_relaxed);
	if (!atomic_load_explicit(&ms_precise, memory_order_relaxed)) {
		atomic_store(&ms_precise, 1);
		ms_fast_update();
		// Stamped once every thread's fast path sees the change: each event
		// without a precise stamp happened before this one (the reader
		// bounds their times by it).
		emit(R_PRECISE, 0, stamp_after(), 0, 0, NULL, 0);
	}
}

// The drain, starting epoch e: precise stamps stop once PRECISE_IDLE epochs
// (~8 ms) went by with one thread recording.
#define PRECISE_IDLE 8
HIDDEN void precise_idle(uint64_t e) {
	if (atomic_load(&ms_precise) && e - atomic_load(&ms_epoch_shared) > PRECISE_IDLE) {
		atomic_store(&ms_precise, 0);
		ms_fast_update();
	}
}

HIDDEN ms_thr *thr_acquire(void) {
	ms_thr *t = ms_tls.prev;
	if (t) {
		ms_tls.prev = NULL;
		uint32_t dead = ms_tls.prev_state;
		if (atomic_compare_exchange_strong(&t->state, &dead, THR_WITH(dead + 4, THR_OWNED))) {
			set_thr(t); // as it was: write on where it stopped
			pthread_setspecific(ms_key, t);
			return t;
		}
	}
	for (t = atomic_load_explicit(&ms_threads, memory_order_acquire); t; t = t->next_all) {
		uint32_t v = atomic_load(&t->state);
		if (THR_STATE(v) == THR_FREE && atomic_compare_exchange_strong(&t->state, &v, THR_WITH(v + 4, THR_OWNED))) break;
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
	t->precise_seen = 0;
	t->last_stamp = 0;
	t->last_ra = 0;
	t->half = 0;
	t->last_ptr = 1; // no pair half before a compact record names an address
	thr_stack_bounds(t);
	set_thr(t);
	pthread_setspecific(ms_key, t);
	crash_altstack();
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
		if (p > q) syscall(SYS_munmap, q, (size_t)(p - q));
		if (q + SEG_MAP > p) syscall(SYS_munmap, p + SEG_MAP, (size_t)(q + SEG_MAP - p));
		madvise(p, SEG_MAP, MADV_HUGEPAGE);
		if (madvise(p, SEG_MAP, 23 /* MADV_POPULATE_WRITE, Linux 5.14 */))
			for (size_t i = 0; i < SEG_MAP; i += 4096) ((volatile char *)p)[i] = 0;
	} else {
		p = (void *)syscall(SYS_mmap, 0, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == (char *)MAP_FAILED) return NULL;
	}
	own_note(p, bytes);
	ms_seg *s = (ms_seg *)p;
	s->cap = (uint32_t)SEG_UNITS(data);
	s->bytes = bytes;
	return s;
}

// Reserves n contiguous units in the calling thread's ring, or NULL.
HIDDEN uint64_t *ring_reserve(ms_thr *t, uint32_t n) {
	ms_seg *s = t->wseg;
	uint64_t *wp = half_close(t);
	if (s && ring_room(t, wp, n)) return wp;
	// Past the cap, wait for the drain while it is alive; never inside a child.
	// Rotating logs keep the backlog short: a new log's prologue waits for
	// every thread's records up to its start (capture/liveset.go).
	while (atomic_load_explicit(&t->segs, memory_order_acquire) >= (ms_rotating ? SEG_WAIT_CAP_ROTATE : SEG_WAIT_CAP)) {
		if (ms_child || atomic_load(&ms_spool_fd) < 0) break;
		sleep_ns(200000);
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

// After the final drain: one event straight to the spool.
static __attribute__((noinline)) void emit_direct(uint16_t kind, uint16_t flags, uint64_t ts, uint64_t a, uint64_t b, const void *payload, uint32_t plen, uint32_t site) {
	uint64_t buf[REC_UNITS + DIRECT_UNITS];
	if (plen > DIRECT_UNITS * 8) plen = DIRECT_UNITS * 8;
	uint32_t n = enc_full(buf, kind, flags, ts, a, b, site, payload, plen);
	ms_thr *t = tls_thr;
	write_direct(buf, n, t ? t->tid : (int32_t)syscall(SYS_gettid), 0);
}

HIDDEN void emit_n(uint16_t kind, uint16_t flags, uint64_t ts, uint64_t a, uint64_t b, const void *payload, uint32_t plen, uint32_t site) {
	if (plen > REC_MAX_PAYLOAD) plen = REC_MAX_PAYLOAD;
	ms_thr *t = tls_thr;
	if (unlikely(atomic_load_explicit(&ms_direct, memory_order_acquire))) {
		if (t && t->half) { // after the final drain: its pending half goes first
			half_close(t);
			ms_drain();
		}
		emit_direct(kind, flags, ts, a, b, payload, plen, site);
		return;
	}
	if (unlikely(!t)) {
		t = thr_acquire();
		if (!t) {
			atomic_fetch_add(&ms_lost_count, 1);
			return;
		}
	}
	uint64_t *r = ring_reserve(t, enc_full_units(plen));
	if (unlikely(!r)) {
		atomic_fetch_add(&ms_lost_count, 1);
		return;
	}
	ring_commit(t, enc_full(r, kind, flags, ts, a, b, site, payload, plen));
	// The final drain may have run between our check of ms_direct and the
	// commit: then nobody will drain this ring again, so drain it now.
	if (unlikely(atomic_load_explicit(&ms_direct, memory_order_acquire))) ms_drain();
}

HIDDEN void emit(uint16_t kind, uint16_t flags, uint64_t ts, uint64_t a, uint64_t b, const void *payload, uint32_t plen) {
	emit_n(kind, flags, ts, a, b, payload, plen, 0);
}
