// Crash signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT), and the signals
// that end a program (SIGTERM, SIGINT, SIGHUP): everything the program
// recorded before one is in the capture (DESIGN rule 10). Handlers
// installed at init, on an alternate stack of each recording thread (a stack
// overflow too), move every ring to the spool and chain to the program's
// handler, or restore the default action and raise the signal again, so that
// the exit status (128+N) and the core dump are the program's own.
//
// The chain: this library's first hook call installs ours; the Go runtime,
// starting next, installs its own for SIGSEGV, SIGBUS and SIGFPE and forwards
// every one raised outside Go code to ours. The program's sigaction() and
// signal() for these signals are interposed: its handler is kept here and
// called from ours (with its flags and mask), so it runs as before, after
// the drain. A program that installs one with the raw system call replaces
// ours; then its handler runs and the capture keeps what the drain thread
// wrote (all but the last ~50 ms), or everything if the handler exits.
//
// Nothing here allocates or enters Go: the handler uses system calls, the
// drain (drain.c) and the spool's descriptor.
#include "internal.h"

#include <dlfcn.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <ucontext.h>

extern int __sigaction(int, const struct sigaction *, struct sigaction *);
extern __sighandler_t bsd_signal(int, __sighandler_t);

static const int crash_sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
#define NCRASH (int)(sizeof crash_sigs / sizeof crash_sigs[0])
// Signals that end a program by default: drained the same way, unless the
// program ignores them (then ours is not there: an ignored signal stays
// ignored across exec). The first NFORWARD are the ones the CLI forwards;
// the others (a write to a closed pipe, as in `prog | head -1`, a timer or
// a user signal the program has no handler for) are drained only when they
// end the program: a program's handler of them may run often.
static const int end_sigs[] = {SIGTERM, SIGINT, SIGHUP, SIGPIPE, SIGALRM, SIGUSR1, SIGUSR2, SIGVTALRM, SIGXCPU};
#define NEND (int)(sizeof end_sigs / sizeof end_sigs[0])
#define NFORWARD 3
static int end_index(int sig) {
	for (int i = 0; i < NEND; i++)
		if (end_sigs[i] == sig) return i;
	return -1;
}
static int ending(int sig) { return end_index(sig) >= 0; }
static int forwarded(int sig) { return (unsigned)end_index(sig) < NFORWARD; }

// For each crash signal: ours is installed, and the program's handler as the
// program believes it to be (the one before ours, or what its sigaction and
// signal set since), under a spin lock (threads may race in sigaction).
static _Atomic int ours[NSIG];
static struct sigaction prog[NSIG];
static _Atomic int prog_mu;

// The Go engine has finished starting (the capture exists, or never will).
static _Atomic int engine_settled;
// The crash marker's path: <capture>/spool/crash.json (set by the engine).
static char crash_path[4096];

// The engine creates the capture folder as it starts, 1-5 ms after the
// program's main begins: a crash before waits for it this long at most.
#define ENGINE_WAIT_NS 3000000000ull
// The drain thread may hold the drain lock: waited for this long at most.
#define LOCK_WAIT_NS 2000000000ull

static void prog_lock(void) {
	int spins = 0, z = 0;
	// Bounded: a thread interrupted by a crash while in sigaction() below
	// could hold it (then the table is read unlocked).
	while (!atomic_compare_exchange_weak(&prog_mu, &z, 1)) {
		z = 0;
		if (++spins > (1 << 22)) return;
	}
}
static void prog_unlock(void) { atomic_store(&prog_mu, 0); }

static void crash_handler(int sig, siginfo_t *si, void *uc);

static _Atomic int handlers_on; // crash_install ran (MSMEMSCOPE_CRASH is not 0)

// Our action for sig in front of the program's p. For an ending signal,
// whether an interrupted system call restarts is the kernel's reading of
// our flags, so it takes the program's SA_RESTART (Python's SIGINT handler
// has none: a read() must end with EINTR for KeyboardInterrupt to come).
static void our_action(struct sigaction *sa, int sig, const struct sigaction *p) {
	memset(sa, 0, sizeof *sa);
	sa->sa_sigaction = crash_handler;
	sa->sa_flags = SA_SIGINFO | SA_ONSTACK | (ending(sig) ? p->sa_flags & SA_RESTART : SA_RESTART);
	sigfillset(&sa->sa_mask);
}

// Installs ours for each crash signal, keeping the one before (lifecycle.c's
// ms_init, the first hook call: before the Go runtime and any constructor).
HIDDEN void crash_install(void) {
	const char *off = getenv("MSMEMSCOPE_CRASH"); // "0": no crash handlers
	if (off && off[0] == '0') return;
	atomic_store(&handlers_on, 1);
	for (int i = 0; i < NCRASH + NEND; i++) {
		int sig = i < NCRASH ? crash_sigs[i] : end_sigs[i - NCRASH];
		struct sigaction cur;
		if (__sigaction(sig, NULL, &cur) || (i >= NCRASH && cur.sa_handler == SIG_IGN)) continue;
		struct sigaction sa;
		our_action(&sa, sig, &cur);
		if (__sigaction(sig, &sa, &prog[sig]) == 0) atomic_store(&ours[sig], 1);
	}
}

// ---- alternate signal stacks (mapped raw: never from the heap) ----
#define ALT_SIZE (64u << 10)
#define ALT_GUARD 4096u

// Gives the calling thread an alternate signal stack unless it has one
// (ring.c's thr_acquire: a thread's first event).
HIDDEN void crash_altstack(void) {
	if (ms_tls.alt || ms_child) return;
	stack_t cur;
	if (sigaltstack(NULL, &cur) == 0 && !(cur.ss_flags & SS_DISABLE)) return; // its own
	char *m = raw_mmap(ALT_SIZE + ALT_GUARD);
	if (!m) return;
	syscall(SYS_mprotect, m, ALT_GUARD, PROT_NONE);
	stack_t ss = {.ss_sp = m + ALT_GUARD, .ss_size = ALT_SIZE, .ss_flags = 0};
	if (sigaltstack(&ss, NULL)) {
		raw_munmap(m, ALT_SIZE + ALT_GUARD);
		return;
	}
	ms_tls.alt = m;
}

// exit() called from a signal handler (a program's, which ours calls on
// this alternate stack) runs the exit's Go work from there: Go moves to its
// own stacks, and a signal with SA_ONSTACK then (Go's preemption, SIGURG)
// would be delivered at the top of the alternate stack, over the live
// frames below. Until that work is done, the asynchronous signals wait (the
// synchronous faults cannot). Returns whether it blocked them.
extern void msGoEnter(void);
HIDDEN int exit_work_begin(sigset_t *old) {
	stack_t cur;
	if (sigaltstack(NULL, &cur) || !(cur.ss_flags & SS_ONSTACK)) return 0;
	// The thread's first call into Go sets its signal mask: made first, so
	// that the mask set below stays (a later call does not set it again).
	guard_up();
	msGoEnter();
	guard_down();
	sigset_t all;
	sigfillset(&all);
	for (int i = 0; i < NCRASH; i++) sigdelset(&all, crash_sigs[i]);
	return pthread_sigmask(SIG_BLOCK, &all, old) == 0;
}
HIDDEN void exit_work_end(int blocked, const sigset_t *old) {
	if (blocked) pthread_sigmask(SIG_SETMASK, old, NULL);
}

// The thread's end (thr_key_dtor): its stack goes, unless a handler runs on it.
HIDDEN void crash_altstack_free(void) {
	char *m = ms_tls.alt;
	if (!m) return;
	stack_t cur;
	if (sigaltstack(NULL, &cur)) return;
	if (cur.ss_sp == m + ALT_GUARD && !(cur.ss_flags & SS_DISABLE)) {
		if (cur.ss_flags & SS_ONSTACK) return;
		stack_t off = {.ss_flags = SS_DISABLE};
		if (sigaltstack(&off, NULL)) return;
	}
	raw_munmap(m, ALT_SIZE + ALT_GUARD);
	ms_tls.alt = NULL;
}

// ---- the marker ----
static char *put_u(char *p, uint64_t v) {
	char tmp[24];
	int n = 0;
	do tmp[n++] = (char)('0' + v % 10);
	while ((v /= 10) > 0);
	while (n) *p++ = tmp[--n];
	return p;
}
static char *put_s(char *p, const char *s) {
	while (*s) *p++ = *s++;
	return p;
}
static char *put_i(char *p, int64_t v) {
	if (v < 0) {
		*p++ = '-';
		return put_u(p, (uint64_t)-v);
	}
	return put_u(p, (uint64_t)v);
}

// spool/crash.json: the process died of sig after the final drain; drained
// says whether every ring reached the spool (else the drain lock never came
// free and the spool ends at the drain thread's last pass).
static int quick_status; // _exit's status (crash_mark's signal 0)

static void crash_mark(int sig, const siginfo_t *si, int drained) {
	if (!crash_path[0]) return;
	int fd = open(crash_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
	if (fd < 0) return;
	char b[256], *p = b;
	p = put_s(p, "{\"signal\": ");
	p = put_u(p, (uint64_t)sig);
	p = put_s(p, ", \"si_code\": ");
	p = put_i(p, si ? si->si_code : 0);
	p = put_s(p, ", \"tid\": ");
	p = put_u(p, (uint64_t)syscall(SYS_gettid));
	p = put_s(p, ", \"end_mono_ns\": ");
	p = put_u(p, mono_ns());
	p = put_s(p, ", \"events_lost\": ");
	p = put_u(p, atomic_load(&ms_lost_count));
	if (sig == 0) { // _exit: the status it was given
		p = put_s(p, ", \"exit_status\": ");
		p = put_i(p, quick_status);
	}
	p = put_s(p, drained ? ", \"drained\": true}\n" : ", \"drained\": false}\n");
	ssize_t w = write(fd, b, (size_t)(p - b));
	(void)w;
	close(fd);
}

// ---- the handler ----
// Every ring to the spool. final: the process is about to die (no program
// handler follows): from now on events go straight to the spool, and each
// thread's pending pair half is taken as it is (the exit path's final
// drain). Otherwise what is published goes: the program's handler may
// recover and carry on recording.
// Waits for the engine to open the spool (or to settle without one), at
// most ENGINE_WAIT_NS: an image that ends in its first milliseconds (a
// crash, an exec) has its events in the rings only.
HIDDEN void engine_wait(void) {
	uint64_t until = mono_ns() + ENGINE_WAIT_NS;
	while (atomic_load(&ms_spool_fd) < 0 && !atomic_load(&engine_settled) && mono_ns() < until) sleep_ns(1000000);
}

static void crash_drain(int sig, const siginfo_t *si, int final) {
	engine_wait();
	if (atomic_load(&ms_spool_fd) < 0) return;
	if (final && !atomic_load(&ms_direct)) {
		atomic_store(&ms_direct, 1);
		ms_fast_update();
	}
	long n = ms_drain_crash(tls_guard >= INTERNAL_GUARD ? LOCK_WAIT_NS / 10 : LOCK_WAIT_NS);
	// Rotating logs: a batch the engine drained before is written to its log
	// by a goroutine that runs on meanwhile; the process must not die first.
	uint64_t until = mono_ns() + LOCK_WAIT_NS;
	while (ms_rotating && atomic_load(&ms_sink_busy) > 0 && mono_ns() < until) sleep_ns(100000);
	if (final) crash_mark(sig, si, n >= 0);
}

// The default action: the process dies of sig (a core where enabled). The
// signal is blocked while the handler runs: it is delivered on return.
static void die_default(int sig) {
	struct sigaction dfl;
	memset(&dfl, 0, sizeof dfl);
	dfl.sa_handler = SIG_DFL;
	sigemptyset(&dfl.sa_mask);
	atomic_store(&ours[sig], 0);
	__sigaction(sig, &dfl, NULL);
	syscall(SYS_tgkill, (pid_t)syscall(SYS_getpid), (pid_t)syscall(SYS_gettid), sig);
}

// Calls the program's handler as the kernel would have: with the mask of
// the interrupted code, its sa_mask and the signal itself (not with
// SA_NODEFER) blocked; reset first with SA_RESETHAND (crash_handler).
static void call_prog(const struct sigaction *p, int sig, siginfo_t *si, void *uc) {
	sigset_t m, old;
	if (uc)
		m = ((ucontext_t *)uc)->uc_sigmask;
	else
		pthread_sigmask(SIG_SETMASK, NULL, &m);
	sigorset(&m, &m, &p->sa_mask);
	if (p->sa_flags & SA_NODEFER)
		sigdelset(&m, sig);
	else
		sigaddset(&m, sig);
	pthread_sigmask(SIG_SETMASK, &m, &old);
	if (p->sa_flags & SA_SIGINFO)
		p->sa_sigaction(sig, si, uc);
	else
		p->sa_handler(sig);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static void crash_handler(int sig, siginfo_t *si, void *uc) {
	int saved = errno;
	int sent = si && si->si_code <= 0; // raise, kill, abort: not a fault
	struct sigaction p;
	prog_lock();
	p = prog[sig];
	if (p.sa_flags & SA_RESETHAND && p.sa_handler != SIG_IGN && p.sa_handler != SIG_DFL) {
		prog[sig].sa_handler = SIG_DFL;
		prog[sig].sa_flags &= ~SA_SIGINFO;
	}
	prog_unlock();
	int has_prog = p.sa_handler != SIG_DFL && p.sa_handler != SIG_IGN;
	int guard = tls_guard;
	// A fault inside msmemscope (the guard is up: its own code, this
	// handler's drain included, or one of its threads) must not recurse:
	// the default action. A signal sent to one of its threads is drained.
	// An ending signal is no fault: inside a hook on the program's thread
	// (a record half written) it is not drained, and goes on as it would.
	int end = ending(sig);
	if (guard && !end && !(guard >= INTERNAL_GUARD && sent)) {
		die_default(sig);
		errno = saved;
		return;
	}
	if (atomic_load_explicit(&ms_state, memory_order_acquire) == 2 && !in_child() &&
	    !(end && guard && guard < INTERNAL_GUARD) && !(end && !forwarded(sig) && (has_prog || p.sa_handler == SIG_IGN))) {
		guard_up();
		crash_drain(sig, si, !has_prog);
		guard_down();
	}
	if (has_prog)
		call_prog(&p, sig, si, uc);
	else if (!(p.sa_handler == SIG_IGN && sent))
		die_default(sig);
	errno = saved;
}

// ---- _exit ----
// _exit and _Exit (Python's os._exit, a signal handler's way out, a child
// after fork) skip exit()'s handlers, where the capture is finished: the
// final drain happens here, as a crash's does, so that every event recorded
// reaches the spool; crash.json says how the process ended (signal 0, the
// status). (exit() ends with libc's own _exit, not this one.)
__attribute__((noreturn)) void _exit(int status) {
	if (atomic_load_explicit(&ms_state, memory_order_acquire) == 2 && !in_child() && !tls_guard) {
		quick_status = status;
		guard_up();
		crash_drain(0, NULL, 1);
		guard_down();
	}
	syscall(SYS_exit_group, status);
	__builtin_unreachable();
}
void _Exit(int status) __attribute__((noreturn, alias("_exit")));

// quick_exit runs the at_quick_exit handlers, then libc's own _exit (not the
// one above): the final drain is a handler of its own, registered at load
// (crash_quick_exit), before the program registers any, so run after every
// one of the program's, with the status quick_exit was given.
static int quick_exit_status;

static void quick_exit_last(void) {
	if (atomic_load_explicit(&ms_state, memory_order_acquire) == 2 && !in_child() && !tls_guard) {
		quick_status = quick_exit_status;
		guard_up();
		crash_drain(0, NULL, 1);
		guard_down();
	}
}

HIDDEN void crash_quick_exit(void) { at_quick_exit(quick_exit_last); }

typedef void (*quick_exit_fn)(int) __attribute__((noreturn));

__attribute__((noreturn)) void quick_exit(int status) {
	static quick_exit_fn real;
	if (!real) {
		guard_up();
		real = (quick_exit_fn)dlsym(RTLD_NEXT, "quick_exit");
		guard_down();
	}
	quick_exit_status = status;
	if (real) real(status);
	_exit(status); // (no libc quick_exit: the handlers are libc's to run)
}

// ---- the program's view of these signals ----
static int kept(int sig) {
	return sig > 0 && sig < NSIG && atomic_load(&ours[sig]);
}

static void prog_swap(int sig, const struct sigaction *act, struct sigaction *old) {
	prog_lock();
	struct sigaction was = prog[sig];
	if (act) {
		prog[sig] = *act;
		if (ending(sig)) { // (a crash signal's may have Go's handler in front: left as it is)
			struct sigaction sa;
			our_action(&sa, sig, act); // its SA_RESTART now
			__sigaction(sig, &sa, NULL);
		}
	}
	prog_unlock();
	if (old) *old = was;
}

// The program ignores an ending signal: for real (ours goes), so that it
// stays ignored across exec, as the program means.
static int ignore_ending(int sig, const struct sigaction *act, struct sigaction *old) {
	prog_lock();
	struct sigaction was = prog[sig];
	int r = __sigaction(sig, act, NULL);
	if (r == 0) atomic_store(&ours[sig], 0);
	prog_unlock();
	if (old && r == 0) *old = was;
	return r;
}

// The program sets an ending signal's action (not to ignore it) after
// ignoring it, or after starting with it ignored: ours goes in front again.
static int restore_ending(int sig, const struct sigaction *act, struct sigaction *old) {
	struct sigaction sa, prev;
	our_action(&sa, sig, act);
	prog_lock();
	int r = __sigaction(sig, &sa, &prev);
	if (r == 0) {
		if (prev.sa_sigaction == crash_handler) prev = prog[sig]; // ours already: the program's is behind it
		prog[sig] = *act;
		atomic_store(&ours[sig], 1);
	}
	prog_unlock();
	if (old && r == 0) *old = prev;
	return r;
}

// (sa_handler and sa_sigaction share their storage: SIG_IGN reads the same.)
static int ignores(const struct sigaction *act) { return act->sa_handler == SIG_IGN; }

// The program's sigaction for sig, as sigaction() and signal() take it.
static int prog_sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
	if (!kept(sig)) {
		if (ending(sig) && act && !ignores(act) && atomic_load(&handlers_on)) return restore_ending(sig, act, old);
		return __sigaction(sig, act, old);
	}
	if (ending(sig) && act && ignores(act)) return ignore_ending(sig, act, old);
	prog_swap(sig, act, old);
	return 0;
}

int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
	// This library's own calls (the Go runtime's, through cgo) are real, as
	// are a forked child's (its tables shared with the parent after vfork).
	if (in_self((uintptr_t)__builtin_return_address(0)) || in_child()) return __sigaction(sig, act, old);
	return prog_sigaction(sig, act, old);
}

// glibc's signal(): BSD semantics (the signal blocked in its handler,
// system calls restarted).
__sighandler_t signal(int sig, __sighandler_t h) {
	if (in_self((uintptr_t)__builtin_return_address(0)) || in_child()) return bsd_signal(sig, h);
	if (h == SIG_ERR || sig <= 0 || sig >= NSIG) {
		errno = EINVAL;
		return SIG_ERR;
	}
	struct sigaction sa, old;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = h;
	sigemptyset(&sa.sa_mask);
	sigaddset(&sa.sa_mask, sig);
	sa.sa_flags = SA_RESTART;
	if (prog_sigaction(sig, &sa, &old)) return SIG_ERR;
	return old.sa_handler;
}

// Called by the Go engine.
void ms_engine_settled(void) { atomic_store(&engine_settled, 1); }

void ms_set_crash_file(const char *path, int n) {
	if (n <= 0 || n >= (int)sizeof crash_path) return;
	memcpy(crash_path, path, (size_t)n);
	crash_path[n] = 0;
}
