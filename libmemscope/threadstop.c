// The registers of the program's threads still alive at the leak-kind scan
// (exitscan.go): roots, as valgrind reads every thread's registers. Each
// thread the scan names is stopped with a real-time signal whose handler
// (installed only for the scan, then the previous one restored) copies the
// general-purpose registers and the stack pointer from its ucontext into the
// thread's slot, and waits there until the scan is done: the thread does not
// run, nor change memory, while its stack and registers are read.
//
//   - The signal: SIGRTMAX-4 (60 on Linux), or the next one below it, down to
//     SIGRTMIN, whose action is the default (none the program handles or
//     ignores). The caller does not name threads that block it.
//   - A thread that does not answer within the timeout (it blocks the signal
//     by now, or is ending) is not waited for: the scan reads its whole stack
//     mapping and no registers, as without this. Its signal, still pending,
//     is discarded (the action set to SIG_IGN, then restored): a default
//     action delivered later would end the process.
//   - A thread interrupted inside msmemscope (its guard up, or its program
//     counter in this library: a hook, Go code called back) is not held: it
//     may hold a lock the scan takes, or a Go P the scan's runtime waits for.
//   - msmemscope's own threads (started from this library: internal_start)
//     are never signalled: their ids are kept here (ms_internal_tids).
//
// The handler runs on the thread's alternate signal stack where it has one
// (every recording thread has msmemscope's: its own memory, not a root; Go
// code may be interrupted on a small goroutine stack), else below the
// interrupted stack pointer and its red zone: never in what the scan reads.
// It allocates nothing and takes no lock.
#include "internal.h"

#include <errno.h>
#include <linux/futex.h>
#include <signal.h>
#include <ucontext.h>

extern int __sigaction(int, const struct sigaction *, struct sigaction *);

// ---- msmemscope's own threads ----
#define INTERNAL_MAX 1024
static _Atomic int32_t internal_tid[INTERNAL_MAX];
static _Atomic int internal_n;

// A thread this library started (lifecycle.c's internal_start).
HIDDEN void internal_tid_note(void) {
	int i = atomic_fetch_add(&internal_n, 1);
	if (i < INTERNAL_MAX) atomic_store(&internal_tid[i], (int32_t)syscall(SYS_gettid));
}

// ms_internal_tids copies up to cap ids of msmemscope's threads into out and
// returns how many it copied.
int ms_internal_tids(int32_t *out, int cap) {
	int n = atomic_load(&internal_n), k = 0;
	for (int i = 0; i < n && i < INTERNAL_MAX && k < cap; i++) {
		int32_t t = atomic_load(&internal_tid[i]);
		if (t) out[k++] = t;
	}
	return k;
}

// ---- the registers ----
#if defined(__x86_64__)
// valgrind's amd64 set (VG_(apply_to_GP_regs)): the 16 general-purpose
// registers, not RIP.
static const int greg_ids[] = {REG_RAX, REG_RCX, REG_RDX, REG_RBX, REG_RSI, REG_RDI, REG_RSP, REG_RBP,
                               REG_R8,  REG_R9,  REG_R10, REG_R11, REG_R12, REG_R13, REG_R14, REG_R15};
#define NREGS 16
#define RED_ZONE 128 // below the stack pointer, live in a leaf function (the ABI's)
static uint64_t uc_sp(const ucontext_t *uc) { return (uint64_t)uc->uc_mcontext.gregs[REG_RSP]; }
static uint64_t uc_pc(const ucontext_t *uc) { return (uint64_t)uc->uc_mcontext.gregs[REG_RIP]; }
static void uc_regs(const ucontext_t *uc, uint64_t *out) {
	for (int i = 0; i < NREGS; i++) out[i] = (uint64_t)uc->uc_mcontext.gregs[greg_ids[i]];
}
#elif defined(__aarch64__)
#define NREGS 32 // x0-x30 and sp
#define RED_ZONE 0
static uint64_t uc_sp(const ucontext_t *uc) { return uc->uc_mcontext.sp; }
static uint64_t uc_pc(const ucontext_t *uc) { return uc->uc_mcontext.pc; }
static void uc_regs(const ucontext_t *uc, uint64_t *out) {
	for (int i = 0; i < 31; i++) out[i] = uc->uc_mcontext.regs[i];
	out[31] = uc->uc_mcontext.sp;
}
#else
#define NREGS 1 // no registers read: the thread is stopped, its stack read whole
#define RED_ZONE 0
static uint64_t uc_sp(const ucontext_t *uc) {
	(void)uc;
	return 0;
}
static uint64_t uc_pc(const ucontext_t *uc) {
	(void)uc;
	return 0;
}
static void uc_regs(const ucontext_t *uc, uint64_t *out) {
	(void)uc;
	out[0] = 0;
}
#endif

// ---- stopping ----
enum { ST_FREE, ST_SENT, ST_STOPPED, ST_BUSY, ST_LATE, ST_GONE };

typedef struct {
	int32_t tid;
	_Atomic int state;
	uint64_t sp;
	uint64_t regs[NREGS];
} stop_slot;

#define STOP_MAX 4096
static stop_slot *slots; // msmemscope's own mapping (never a root), kept: a late handler may read it
static _Atomic int slot_n;
static _Atomic uint32_t release; // 1: the scan is done, the stopped threads go on
static _Atomic int in_handler;   // threads inside the handler
static int stop_sig;             // the signal in use, 0 none
static struct sigaction stop_old;
static int stop_discard; // a signal may still be pending: discard it before restoring

static long futex(_Atomic uint32_t *a, int op, uint32_t v, const struct timespec *ts) {
	return syscall(SYS_futex, a, op | FUTEX_PRIVATE_FLAG, v, ts, NULL, 0);
}

static void stop_handler(int sig, siginfo_t *si, void *ucv) {
	(void)sig;
	(void)si;
	int saved = errno;
	atomic_fetch_add(&in_handler, 1);
	const ucontext_t *uc = ucv;
	int32_t tid = (int32_t)syscall(SYS_gettid);
	int n = atomic_load(&slot_n);
	stop_slot *s = NULL;
	for (int i = 0; i < n; i++)
		if (slots[i].tid == tid) s = &slots[i];
	int want = ST_SENT;
	if (!s || !uc) goto out;
	if (ms_tls.guard || in_self((uintptr_t)uc_pc(uc))) {
		atomic_compare_exchange_strong(&s->state, &want, ST_BUSY);
		goto out;
	}
	s->sp = uc_sp(uc);
	uc_regs(uc, s->regs);
	if (!atomic_compare_exchange_strong(&s->state, &want, ST_STOPPED)) goto out; // too late: the scan went on
	// Held until the scan is done (bounded: a scan never takes a minute
	// without the process being gone).
	for (int waits = 0; !atomic_load(&release) && waits < 60; waits++) {
		struct timespec ts = {1, 0};
		futex(&release, FUTEX_WAIT, 0, &ts);
	}
out:
	atomic_fetch_sub(&in_handler, 1);
	errno = saved;
}

// The signal for the scan: the highest real-time one but four whose action
// is the default, or 0.
static int pick_signal(void) {
	for (int sig = SIGRTMAX - 4; sig >= SIGRTMIN; sig--) {
		struct sigaction cur;
		if (__sigaction(sig, NULL, &cur)) continue;
		if (!(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == SIG_DFL) return sig;
	}
	return 0;
}

// ms_stop_signal is the signal the next ms_threads_stop will use (the caller
// leaves out the threads that block it), or 0.
int ms_stop_signal(void) { return pick_signal(); }

// ms_threads_stop stops the threads tids[0..n) (n at most STOP_MAX), waiting
// at most timeout_ms for all of them to answer; returns how many stopped.
// ms_threads_resume must follow, whatever it returns.
int ms_threads_stop(const int32_t *tids, int n, int sig, int timeout_ms) {
	if (n > STOP_MAX) n = STOP_MAX;
	stop_sig = 0;
	stop_discard = 0;
	atomic_store(&release, 0);
	if (n <= 0 || sig <= 0 || sig != pick_signal()) return 0;
	if (!slots && !(slots = raw_mmap(STOP_MAX * sizeof(stop_slot)))) return 0;
	for (int i = 0; i < n; i++) {
		slots[i].tid = tids[i];
		slots[i].sp = 0;
		atomic_store(&slots[i].state, ST_FREE);
	}
	atomic_store(&slot_n, n);
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = stop_handler;
	sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
	sigfillset(&sa.sa_mask);
	if (__sigaction(sig, &sa, &stop_old)) {
		atomic_store(&slot_n, 0);
		return 0;
	}
	stop_sig = sig;
	pid_t pid = (pid_t)syscall(SYS_getpid), self = (pid_t)syscall(SYS_gettid);
	int pending = 0;
	for (int i = 0; i < n; i++) {
		atomic_store(&slots[i].state, ST_SENT);
		if (tids[i] == self || syscall(SYS_tgkill, pid, (pid_t)tids[i], sig))
			atomic_store(&slots[i].state, ST_GONE);
		else
			pending++;
	}
	uint64_t deadline = mono_ns() + (uint64_t)timeout_ms * 1000000u;
	while (pending > 0 && mono_ns() < deadline) {
		sleep_ns(100000);
		pending = 0;
		for (int i = 0; i < n; i++) pending += atomic_load(&slots[i].state) == ST_SENT;
	}
	int stopped = 0;
	for (int i = 0; i < n; i++) {
		int want = ST_SENT;
		if (atomic_compare_exchange_strong(&slots[i].state, &want, ST_LATE)) stop_discard = 1;
		stopped += atomic_load(&slots[i].state) == ST_STOPPED;
	}
	return stopped;
}

// ms_thread_regs reports slot i of the last ms_threads_stop: 1 with its
// registers (NREGS words into regs, at most cap) and its stack's lowest live
// address (*sp: its stack pointer less the red zone) when it is stopped, 2
// when it was busy inside msmemscope, 3 when it did not answer, 0 when it
// was gone.
int ms_thread_regs(int i, uint64_t *regs, int cap, uint64_t *sp, int *nregs) {
	if (i < 0 || i >= atomic_load(&slot_n)) return 0;
	switch (atomic_load(&slots[i].state)) {
	case ST_STOPPED:
		break;
	case ST_BUSY:
		return 2;
	case ST_LATE:
		return 3;
	default:
		return 0;
	}
	int k = NREGS < cap ? NREGS : cap;
	memcpy(regs, slots[i].regs, (size_t)k * sizeof(uint64_t));
	*nregs = k;
	*sp = slots[i].sp > RED_ZONE ? slots[i].sp - RED_ZONE : slots[i].sp;
	return 1;
}

// ms_threads_resume lets the stopped threads go on and restores the
// signal's previous action.
void ms_threads_resume(void) {
	atomic_store(&release, 1);
	futex(&release, FUTEX_WAKE, 0x7fffffff, NULL);
	if (!stop_sig) return;
	// Wait (bounded) for the handlers to return before their action goes.
	for (int i = 0; i < 1000 && atomic_load(&in_handler) > 0; i++) sleep_ns(100000);
	if (stop_discard) {
		// A thread that did not answer may still have it pending.
		struct sigaction ign;
		memset(&ign, 0, sizeof ign);
		ign.sa_handler = SIG_IGN;
		sigemptyset(&ign.sa_mask);
		__sigaction(stop_sig, &ign, NULL);
	}
	__sigaction(stop_sig, &stop_old, NULL);
	stop_sig = 0;
	atomic_store(&slot_n, 0);
}
