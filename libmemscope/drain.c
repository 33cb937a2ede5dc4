// The drain: every thread's published events from its ring (ring.c) to the
// spool, as chunks (writev of the rings' memory, direct I/O of whole
// segments), or into memory for the rotating logs; the drain thread that runs
// it every 1-8 ms; calibration points and the spool's descriptors.
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/uio.h>

HIDDEN _Atomic int ms_spool_fd = -1;
HIDDEN pthread_mutex_t ms_drain_lock = PTHREAD_MUTEX_INITIALIZER;

// Ring contents go to the spool with writev straight from the segments; a
// segment is recycled (or unmapped) only once its data has been written.
#define MAX_IOV 1024
static struct iovec iov[MAX_IOV];
static ms_chunk hdrs[MAX_IOV]; // a chunk takes one, and one or two iovecs (a drain mark one)
// A pending pair half taken as it is (seg_head) may still get its second
// half from its owner while the pass runs: it goes out from a copy, in a
// chunk of its own, so that its chunk's checksum is of what is written.
// Indexed like hdrs (the copy's chunk header is hdrs[i]).
static uint64_t half_copy[MAX_IOV];
static int niov, nhdr;
static struct {
	ms_thr *t;
	ms_seg *s;
	uint32_t direct; // units to write from s itself by direct I/O, after the iovecs
} done_segs[MAX_IOV / 2];
static int ndone;
static long drained_bytes;
static uint64_t cal_rec[REC_UNITS + 1]; // and the old epoch's end

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
// The drain thread polls every 1 ms, and every DRAIN_IDLE_MAX ms at most
// once passes find nothing (see drainer_main).
#define DRAIN_IDLE_SHIFT 3
#define DRAIN_IDLE_MAX (1 << DRAIN_IDLE_SHIFT)

// What SIGKILL may take (DESIGN rule 10: at most the last ~100 ms): an event
// published at time t is seen by the pass after it, at most DRAIN_IDLE_MAX ms
// later (a pass that leaves young events behind keeps the poll at 1 ms), and
// written through the page cache, where a killed process cannot take it
// back, once DIO_WAIT_NS have passed since that pass: by t + ~30 ms (plus
// the time of the pass's writes) while the drain thread gets a core and the
// disk keeps up. A filled segment goes out in the first pass after it
// filled. Not published, and so not bounded: a thread's one pending pair half
// (records.def), its last event while it records nothing more.
_Static_assert(DIO_WAIT_NS / 1000000 + DRAIN_IDLE_MAX <= 50, "SIGKILL must lose at most ~50 ms of published events");

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

// Pads the spool, through fd, to a multiple of DIO_ALIGN; -1 on error.
static int spool_align(int fd) {
	off_t end = lseek(fd, 0, SEEK_END);
	if (end < 0) return -1;
	size_t len = (size_t)(-end & (DIO_ALIGN - 1));
	if (!len) return 0;
	if (len < sizeof(ms_chunk)) len += DIO_ALIGN;
	uint64_t buf[(DIO_ALIGN + sizeof(ms_chunk)) / 8] = {0};
	enc_pad(buf, len);
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
		enc_chunk(&s->hdr, MS_CHUNK_MAGIC, units, done_segs[j].t->tid, s->u);
		size_t end = sizeof(ms_chunk) + (size_t)units * 8;
		size_t len = (end + DIO_ALIGN - 1) & ~(size_t)(DIO_ALIGN - 1);
		if (len > end && len - end < sizeof(ms_chunk)) len += DIO_ALIGN;
		if (len > end) enc_pad((char *)s + SEG_META + end, len - end);
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

// A write to the spool failed (a full disk, say): the spool is cut back to
// where the failed write began, a chunk's end, and takes nothing more.
// Writing on once the disk has room again would not mend it: a chunk cut
// short makes what follows unreadable, and records after lost ones would be
// read against the wrong deltas (a pair half's address, records.def). Later
// passes drop what they take from the rings (and count as failed); end.json's
// drain_errors tells readers the capture ends short. Callers hold
// ms_drain_lock, so no flush is under way.
static _Atomic int spool_stopped;
static void spool_stop(int fd, off_t cut) {
	atomic_store(&spool_stopped, 1);
	if (cut >= 0 && ftruncate(fd, cut)) {
		// The reader stops at the cut chunk instead, as after a kill.
	}
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
	if (sink) {
		rc = segs_write(fd); // (none: the sink has no direct writes)
	} else if (!atomic_load_explicit(&spool_stopped, memory_order_relaxed)) {
		// Where this flush begins: whole chunks end there (O_APPEND
		// writes land whole before or after it).
		off_t start = lseek(fd, 0, SEEK_END);
		if (i < niov) rc = writev_all(fd, &iov[i], niov - i);
		if (!rc) rc = segs_write(fd);
		if (rc) spool_stop(fd, start);
	}
	niov = nhdr = 0;
	for (int j = 0; j < ndone; j++) seg_release(done_segs[j].t, done_segs[j].s);
	ndone = 0;
	return rc;
}

// A chunk of n units at r (none: a drain mark, see drain_mark).
static int add_chunk(int fd, int32_t tid, const uint64_t *r, uint32_t n) {
	if (niov + 1 + (n != 0) > MAX_IOV && iov_flush(fd)) return -1;
	enc_chunk(&hdrs[nhdr], MS_CHUNK_MAGIC, n, tid, sink ? NULL : r); // (the rotating logs' chunks are made anew: capture/observe.go)
	iov[niov++] = (struct iovec){&hdrs[nhdr++], sizeof(ms_chunk)};
	if (n) iov[niov++] = (struct iovec){(void *)r, (size_t)n * 8};
	iov_pending += sizeof(ms_chunk) + (size_t)n * 8;
	return 0;
}

// Rotating logs: the drain goes round the threads (a pass that fills the
// buffer stops at a thread, and the next begins at the one after it), and
// marks each thread it took everything from: an empty chunk of its tid
// (of -tid once its ring is released: it records nothing more). The rotator
// learns from the marks when every record published before a point has
// reached it (capture/liveset.go).
static ms_thr *rr_next;
static int thr_partial;            // drain_thread left published records behind
static size_t thr_left = SIZE_MAX; // bytes the thread at hand may still fill in the buffer: each gets a share, so that their records reach the rotator at a like pace
static size_t thr_share;           // the share (thr_left before the thread took any)
static int pass_more;              // the pass left published records in some ring

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }
static int sink_room(size_t n) { return sink_cap - sink_used - iov_pending >= n; }

// Marks tid drained; 0 when the buffer has no room for the mark.
static int drain_mark(int32_t tid) { return sink_room(sizeof(ms_chunk)) && !add_chunk(-1, tid, NULL, 0); }

// A drain pass begins a new epoch: its calibration point (taken before the
// epoch moves on, so no thread stamps earlier in it) goes out first.
// Callers hold ms_drain_lock.
static int epoch_start(int fd) {
	uint64_t e = epoch_now() + 1;
	precise_idle(e);
	uint64_t tick = stamp_after(), ns = mono_ns();
	gate_set(~G_EPOCH, e & G_EPOCH);
	// The old epoch ends here, not at tick: a thread that read the gate just
	// before it moved on labels its records with the old epoch, however
	// long the drain was preempted in between (spool/order.go's bounds).
	uint64_t end = stamp_after();
	uint32_t n = enc_full(cal_rec, R_CALIB, F_EPOCH, tick, ns, e, 0, &end, sizeof end);
	return add_chunk(fd, 0, cal_rec, n);
}

// How many of n units (whole events only) fit in room bytes of the sink.
static uint32_t fit(const uint64_t *r, uint32_t n, size_t room) {
	if (room < sizeof(ms_chunk) + sizeof(ms_rec)) return 0;
	size_t maxu = (room - sizeof(ms_chunk)) / 8;
	if (n <= maxu) return n;
	uint32_t take = 0;
	while (take < n) {
		uint32_t ev = rec_units(&r[take]);
		if (take + ev > maxu) break;
		take += ev;
	}
	return take;
}

// How many of n units (whole events only) the thread at hand may put in the
// sink: within its share, but its first event of the pass whatever its size
// (a Python code object can be larger than a share).
static uint32_t sink_fit(const uint64_t *r, uint32_t n) {
	size_t room = sink_cap - sink_used - iov_pending;
	uint32_t take = fit(r, n, room < thr_left ? room : thr_left);
	if (!take && n && thr_left == thr_share) take = fit(r, rec_units(r), room);
	return take;
}

// Moves a thread's published records [tail, h) of s out: 0 done, 1 the sink
// is full (the rest stays in the ring), -1 error.
static int drain_range(int fd, ms_thr *t, ms_seg *s, uint32_t h, int half) {
	if (h <= s->tail) return 0;
	uint32_t take = h - s->tail;
	if (sink) take = sink_fit(&s->u[s->tail], take);
	if (half && s->tail + take == h) { // the pending half last, from a copy
		if (take > 1 && add_chunk(fd, t->tid, &s->u[s->tail], take - 1)) return -1;
		if (niov + 2 > MAX_IOV && iov_flush(fd)) return -1; // (the copy's slot stays this flush's)
		half_copy[nhdr] = *(volatile uint64_t *)&s->u[h - 1];
		if (add_chunk(fd, t->tid, &half_copy[nhdr], 1)) return -1;
	} else if (take && add_chunk(fd, t->tid, &s->u[s->tail], take)) {
		return -1;
	}
	if (sink && take) thr_left -= min_size(thr_left, sizeof(ms_chunk) + (size_t)take * 8);
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

// One chunk straight to the spool (after the final drain, and the crash
// handler's calibration point), by whoever records it; locked: the caller
// holds ms_drain_lock.
static void warn_drain_failed(int err);
HIDDEN long write_direct(const uint64_t *r, uint32_t n, int32_t tid, int locked) {
	int fd = atomic_load(&ms_spool_fd);
	if (fd < 0 || atomic_load_explicit(&spool_stopped, memory_order_relaxed)) {
		atomic_fetch_add(&ms_lost_count, 1);
		return -1;
	}
	char buf[sizeof(ms_chunk) + (REC_UNITS + DIRECT_UNITS) * 8];
	enc_chunk(buf, MS_CHUNK_MAGIC, n, tid, r);
	memcpy(buf + sizeof(ms_chunk), r, n * 8);
	off_t start = lseek(fd, 0, SEEK_END);
	if (!write_all(fd, buf, sizeof(ms_chunk) + n * 8)) return 0; // O_APPEND: one write, one chunk
	int err = errno;
	atomic_fetch_add(&ms_lost_count, 1);
	if (atomic_fetch_add(&drain_errs, 1) == 0) warn_drain_failed(err);
	// Part of it may be in the file: cut back, as a failed drain does
	// (what other writers added since start goes too: lost, not torn).
	if (!locked) pthread_mutex_lock(&ms_drain_lock);
	spool_stop(fd, start);
	if (!locked) pthread_mutex_unlock(&ms_drain_lock);
	return -1;
}

// How far the writer got in s, the drain's segment: its final head once the
// writer moved on (s->next set), else the writer's position; -1 while the
// writer is between the two (try again next pass).
static int64_t seg_head(ms_thr *t, ms_seg *s, ms_seg **next, int *half) {
	*half = 0;
	*next = atomic_load_explicit(&s->next, memory_order_acquire);
	if (*next) return atomic_load_explicit(&s->head, memory_order_acquire);
	uint64_t *wp = atomic_load_explicit(&t->wp, memory_order_acquire);
	// After the final drain began nobody may write a pending pair half out
	// but its owner, who may never run again: take it as it is (its last
	// unit, which the owner may still change: *half).
	if (wp && atomic_load_explicit(&ms_direct, memory_order_acquire) && *(volatile uint32_t *)&t->half) {
		wp++;
		*half = 1;
	}
	if (wp < s->u || wp > s->u + s->cap) return -1;
	return wp - s->u;
}

// Moves out what thread t has published. A segment its writer has left goes
// out directly when none of it was drained before (see dio_fd); the one it
// writes now waits while young, and always after a direct write of this pass,
// as direct writes follow the iovecs of the same flush.
static int drain_thread(int fd, ms_thr *t) {
	uint32_t st = atomic_load_explicit(&t->state, memory_order_acquire);
	int dead = THR_STATE(st) == THR_DEAD;
	ms_seg *s = t->rseg, *next = NULL;
	int64_t h = -1;
	int queued = 0, half = 0;
	while (s) {
		h = seg_head(t, s, &next, &half);
		if (h < 0) {
			thr_partial = 1;
			break;
		}
		uint32_t direct = next && pass_dio && s->tail == 0 && h > 0 ? (uint32_t)h : 0;
		if (!next && h > s->tail && pass_dio) {
			if (!t->wait_since) t->wait_since = pass_now;
			if (queued || (!dead && pass_now - t->wait_since < DIO_WAIT_NS)) {
				pass_waiting = 1;
				break;
			}
		}
		if (!direct) {
			int rc = drain_range(fd, t, s, (uint32_t)h, half);
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
	// thread took it back meanwhile (thr_acquire). Rotating logs: once the
	// mark saying so fits.
	if (dead && s && h == s->tail && !next && (!sink || sink_room(2 * sizeof(ms_chunk)))) {
		if (!atomic_compare_exchange_strong(&t->state, &st, THR_WITH(st, THR_RELEASING))) return 0;
		if (iov_flush(fd)) {
			atomic_store(&t->state, st);
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
		if (sink) drain_mark(-t->tid); // room checked above
		atomic_store(&t->state, THR_WITH(st, THR_FREE));
	}
	return 0;
}

// One pass: every thread's published events to the spool; with dio, by
// direct I/O where it may, leaving young partial segments for later (their
// undrained events are counted in pass_waiting). The caller holds the drain
// lock and the guard.
static long drain_locked(int fd, int dio) {
	long before = drained_bytes;
	pass_dio = dio && dio_fd >= 0 && !atomic_load(&ms_direct);
	pass_now = pass_dio ? mono_ns() : 0;
	pass_waiting = pass_direct = 0;
	int rc = epoch_start(fd);
	for (ms_thr *t = atomic_load(&ms_threads); t && !rc; t = t->next_all) {
		if (thr_state(t) == THR_FREE) continue;
		rc = drain_thread(fd, t);
	}
	if (iov_flush(fd)) rc = -1;
	pass_dio = 0;
	// Once the spool stopped, each pass drops what it took: a failure.
	return rc || atomic_load(&spool_stopped) ? -1 : drained_bytes - before;
}

// warn_drain_failed says, once, that the spool stopped taking events (a
// full disk, say): else the capture ends short without a word, and reads
// as a killed run's. One raw write: this thread allocates nothing.
static void warn_drain_failed(int err) {
	char line[200];
	int n = snprintf(line, sizeof line,
	                 "msmemscope: process %d: writing the spool failed (%s): events are being lost, and the capture will end short\n",
	                 (int)getpid(), err == ENOSPC ? "no space left on the device" : err == EDQUOT ? "disk quota exceeded" : err == EFBIG ? "file size limit exceeded" : "a write error");
	if (n > 0) {
		ssize_t w = write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
		(void)w;
	}
}

// drain_locked, a failure counted (and said, the first time).
static long drain_counted(int fd, int dio) {
	errno = 0;
	long out = drain_locked(fd, dio);
	if (out < 0 && atomic_fetch_add(&drain_errs, 1) == 0) warn_drain_failed(errno);
	return out;
}

static long drain_pass(int dio) {
	int fd = atomic_load(&ms_spool_fd);
	if (fd < 0 || ms_child) return -1;
	guard_up();
	pthread_mutex_lock(&ms_drain_lock);
	long out = drain_counted(fd, dio);
	pthread_mutex_unlock(&ms_drain_lock);
	guard_down();
	return out;
}

// The drain passes that failed to write so far (end.json's drain_errors).
uint64_t ms_drain_errors(void) { return atomic_load(&drain_errs); }

// A calibration point straight to the spool (ms_drain_lock held).
static void calib_write(void) {
	uint64_t r[REC_UNITS];
	write_direct(r, enc_full(r, R_CALIB, 0, stamp_after(), mono_ns(), epoch_now(), 0, NULL, 0), 0, 1);
}

// The drain of a crash handler (crash.c): everything published, through the
// page cache, after a clock calibration point (as at the exit). The drain
// thread runs on while the crashed thread is in its handler and may hold the
// lock, in the middle of a pass: it is waited for at most wait_ns. The
// caller holds the guard.
HIDDEN long ms_drain_crash(uint64_t wait_ns) {
	int fd = atomic_load(&ms_spool_fd);
	if (fd < 0 || ms_child) return -1;
	uint64_t until = mono_ns() + wait_ns;
	while (pthread_mutex_trylock(&ms_drain_lock)) {
		if (mono_ns() > until) return -2;
		sleep_ns(100000);
	}
	calib_write();
	long out = drain_counted(fd, 0);
	pthread_mutex_unlock(&ms_drain_lock);
	return out;
}

// Drains everything published, through the page cache, the calling thread's
// pending pair half first: a live report or a test's leak check on this
// thread must see its last FREE (it waited for a second half).
long ms_drain(void) {
	ms_thr *t = tls_thr;
	if (t && t->half) half_close(t);
	return drain_pass(0);
}


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
		long n = drain_pass(1); // (a failure is counted and said there)
		// A pass that found no events wrote only its calibration point.
		if (n > (long)(sizeof(ms_chunk) + sizeof cal_rec) || pass_waiting) idle = 0;
		else if (idle < DRAIN_IDLE_SHIFT) idle++;
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

void ms_drainer_stop(void) {
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
}

// How many batches drained into memory are not yet in their logs (each
// ms_drain_into counts one, the Go engine uncounts it once written, which a
// goroutine does while the next batch is drained): a crash handler waits
// for none.
HIDDEN _Atomic int ms_sink_busy;
void ms_sink_done(void) { atomic_fetch_sub(&ms_sink_busy, 1); }

// Drains into buf (cap bytes, at least 64 KiB) instead of the spool file, in
// the spool's chunk format, whole events only. Returns the bytes written;
// when close to cap, call again: the rest is still in the rings.
long ms_drain_into(void *buf, long cap) {
	atomic_fetch_add(&ms_sink_busy, 1); // uncounted by ms_sink_done, whatever this returns
	if (ms_child || cap < 4096) return -1;
	guard_up();
	pthread_mutex_lock(&ms_drain_lock);
	sink = buf;
	sink_cap = (size_t)cap;
	sink_used = iov_pending = 0;
	int rc = epoch_start(-1);
	ms_thr *head = atomic_load(&ms_threads), *first = rr_next ? rr_next : head, *t = first;
	rr_next = NULL;
	size_t live = 0;
	for (ms_thr *u = head; u; u = u->next_all) live += thr_state(u) != THR_FREE;
	size_t share = sink_cap / (live ? live : 1);
	thr_share = share > 65536 ? share : 65536;
	pass_more = 0;
	while (t && !rc) {
		uint32_t st = atomic_load(&t->state);
		if (THR_STATE(st) != THR_FREE) {
			int32_t tid = t->tid;
			thr_partial = 0;
			thr_left = thr_share;
			rc = drain_thread(-1, t);
			if (rc == 1 && sink_room(65536)) {
				rc = 0; // its share is taken: on to the next thread
				thr_partial = 1;
			}
			// Marked drained while the same owner holds it (released: marked
			// -tid in drain_thread; taken since: not this owner's to mark).
			uint32_t now = atomic_load(&t->state);
			if (!rc && !thr_partial && THR_STATE(now) != THR_FREE && (now >> 2 != st >> 2 || !drain_mark(tid))) thr_partial = 1;
			pass_more |= thr_partial;
		}
		if (!(t = t->next_all)) t = head;
		if (rc == 1) {
			rr_next = t; // the buffer is full: the next pass begins after this thread
			pass_more = 1;
		}
		if (t == first) break;
	}
	thr_left = thr_share = SIZE_MAX;
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
	guard_up();
	pthread_mutex_lock(&ms_drain_lock);
	calib_write();
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

// Whether the last ms_drain_into left published records in the rings (the
// buffer filled, or a thread's share did): drain again at once.
int ms_drain_into_more(void) { return pass_more; }
