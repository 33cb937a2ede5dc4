// The run's life: init on the first hook call, the threads this library
// starts (internal for life), fork and exec, the end of the run, and the
// functions the Go side and pystack.c call.
#include "internal.h"

#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <cpuid.h>

// ---- configuration (MSMEMSCOPE_HOOK) and global state: see internal.h ----
HIDDEN int cfg_heap = 1;
HIDDEN int cfg_cstack = 0;
HIDDEN int cfg_deferred = 0;
HIDDEN _Atomic int ms_state;
HIDDEN _Atomic int ms_active;
HIDDEN _Atomic int ms_collecting;
HIDDEN _Atomic int ms_direct;
HIDDEN int ms_rotating;
HIDDEN _Atomic uint64_t ms_fork_count;
HIDDEN _Atomic uint64_t ms_mstx_next = 1;
HIDDEN int ms_use_tsc;
HIDDEN int ms_child;
HIDDEN pid_t ms_mypid;
HIDDEN pthread_key_t ms_key;

static int tsc_invariant(void) {
	unsigned a, b, c, d;
	if (!__get_cpuid(0x80000007, &a, &b, &c, &d)) return 0;
	return (d >> 8) & 1;
}

// ---- init ----
static void atfork_prepare(void) {}
static void atfork_parent(void) { atomic_fetch_add(&ms_fork_count, 1); }
static void atfork_child(void) {
	ms_child = 1;
	atomic_store(&ms_active, 0);
	atomic_store(&ms_sink_busy, 0); // the parent's batches are its own to write
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

HIDDEN void ms_init(void) {
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
		cfg_cuda = (uint32_t)env_int(h, "cuda", 0); // a hook without cuda= (the pytest plugin's): none
		cfg_kernel = (int)env_int(h, "kernel", 0);
		cfg_cstack = (int)env_int(h, "cstack", 0);
		cfg_deferred = (int)env_int(h, "deferred", 0);
		// Known from the first event: rotating logs are read one by one.
		ms_rotating = (int)env_int(h, "rotate", 0) != 0;
		if (cfg_cstack > MAX_FRAMES) cfg_cstack = MAX_FRAMES;
	}
	pthread_key_create(&ms_key, thr_key_dtor);
	pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
	crash_install();
	atomic_store(&ms_collecting, !cfg_deferred);
	emit(R_CALIB, F_EPOCH, stamp_after(), mono_ns(), 1, NULL, 0);
	if (!cfg_deferred) emit(R_START, 0, stamp_after(), 0, 0, NULL, 0);
	atomic_store(&ms_active, cfg_heap);
	guard_down();
	atomic_store(&ms_state, 2);
	ms_fast_update();
}

static void resolve_reals(void);

// Constructor: set up stack unwinding helpers (they need the loader), and
// find the functions the wrappers below call.
__attribute__((constructor(101))) static void ms_ctor(void) {
	ready();
	guard_up();
	stacks_modules();
	if (cfg_heap) stacks_load();
	resolve_reals();
	crash_quick_exit();
	guard_down();
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
	tls_guard = INTERNAL_GUARD; // never recorded, whatever it calls
	ms_tls.fast = NULL;
	internal_tid_note(); // never stopped by the leak scan (threadstop.c)

	ms_libc.free(v);
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
// The stack of such a thread is not unmapped if it exits (Go's seldom do:
// the live-set follower's, once, at exit; the drain thread brings and
// unmaps its own).
// Maps a stack of size bytes (rounded up to pages) with a guard page below
// it and initializes at to run a thread on it; returns the mapping (size +
// one page), or NULL.
HIDDEN void *map_stack(pthread_attr_t *at, size_t size) {
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

// The program's threads are counted (from start to end, however they end):
// when main calls pthread_exit the process must end with the last of them,
// as it does bare, although msmemscope's own threads live on (pthread_exit).
static long prog_threads;
static pthread_mutex_t prog_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t prog_cv = PTHREAD_COND_INITIALIZER;
// The threads that counted down last: a thread counts down as its start
// routine ends, before its own thread-specific and C++ thread_local
// destructors run, which may still free (main_left waits for them).
#define ENDING_MAX 64
static pid_t prog_ending[ENDING_MAX];
static unsigned prog_nending;

static void prog_end(void *unused) {
	(void)unused;
	pthread_mutex_lock(&prog_mu);
	prog_ending[prog_nending++ % ENDING_MAX] = (pid_t)syscall(SYS_gettid);
	if (--prog_threads == 0) pthread_cond_broadcast(&prog_cv);
	pthread_mutex_unlock(&prog_mu);
}

// prog_wait waits until the program's threads have all counted down, then
// (10 s at most: an id could be a new thread's) until the last ones to do so
// are gone.
static void prog_wait(void) {
	pid_t ending[ENDING_MAX];
	pthread_mutex_lock(&prog_mu);
	while (prog_threads > 0) pthread_cond_wait(&prog_cv, &prog_mu);
	unsigned n = prog_nending < ENDING_MAX ? prog_nending : ENDING_MAX;
	memcpy(ending, prog_ending, sizeof ending);
	pthread_mutex_unlock(&prog_mu);
	long spent = 0;
	for (unsigned i = 0; i < n; i++)
		while (ending[i] && spent < 100000 && syscall(SYS_tgkill, ms_mypid, ending[i], 0) == 0) {
			sleep_ns(100000);
			spent++;
		}
}

// A program thread's start record is taken from this library's own memory,
// never the heap: glibc keeps the thread's argument in its descriptor, where
// the leak scan would read it as a pointer to whatever block reused the
// memory. A record is held only until its thread starts.
#define TRAMPS 1024
static struct tramp tramps[TRAMPS];
static int tramp_free[TRAMPS], tramp_nfree = -1;
static atomic_flag tramp_lock = ATOMIC_FLAG_INIT;

static struct tramp *tramp_get(void) {
	struct tramp *t = NULL;
	while (atomic_flag_test_and_set_explicit(&tramp_lock, memory_order_acquire)) {
	}
	if (tramp_nfree < 0)
		for (tramp_nfree = 0; tramp_nfree < TRAMPS; tramp_nfree++) tramp_free[tramp_nfree] = TRAMPS - 1 - tramp_nfree;
	if (tramp_nfree > 0) t = &tramps[tramp_free[--tramp_nfree]];
	atomic_flag_clear_explicit(&tramp_lock, memory_order_release);
	return t;
}

static void tramp_put(struct tramp *t) {
	while (atomic_flag_test_and_set_explicit(&tramp_lock, memory_order_acquire)) {
	}
	tramp_free[tramp_nfree++] = (int)(t - tramps);
	atomic_flag_clear_explicit(&tramp_lock, memory_order_release);
}

static void *program_start(void *v) {
	struct tramp tr = *(struct tramp *)v;
	tramp_put(v);
	// Below this frame's top lie the thread's own frames: dead once it
	// ends (the leak scan leaves them out, exitscan.c), this one included.
	ms_tls.frames_top = (uintptr_t)__builtin_frame_address(0) + 16;
	stacks_thread_start();
	void *r;
	pthread_cleanup_push(prog_end, NULL);
	r = tr.fn(tr.arg);
	pthread_cleanup_pop(1);
	return r;
}

// main leaves with pthread_exit: glibc unwinds it (its cleanup handlers, its
// frames' C++ destructors), runs its thread-specific destructors, and ends
// the process with status 0 when the last thread ends, which msmemscope's
// own threads never do. So main_left, a destructor of main's, waits there
// for the program's threads (pthread_create's count) and their last one's
// end, then calls exit(0). It lets the program's own destructors of main
// run first: set again, it is called in each of glibc's rounds, and waits
// in the last one.
static pthread_key_t main_left_key;

static void main_left(void *v) {
	static int rounds;
	if (++rounds < PTHREAD_DESTRUCTOR_ITERATIONS) {
		pthread_setspecific(main_left_key, v);
		return;
	}
	prog_wait();
	exit(0);
}

typedef void (*pthread_exit_fn)(void *) __attribute__((noreturn));
static pthread_exit_fn real_pthread_exit;

void pthread_exit(void *ret) {
	if (!real_pthread_exit) {
		guard_up();
		real_pthread_exit = (pthread_exit_fn)dlsym(RTLD_NEXT, "pthread_exit");
		guard_down();
	}
	if (!in_child() && (pid_t)syscall(SYS_gettid) == ms_mypid && atomic_load(&ms_state) == 2) {
		if (pthread_key_create(&main_left_key, main_left) == 0) {
			pthread_setspecific(main_left_key, &main_left_key);
		} else {
			// No key left (1024 taken): main's destructors are skipped,
			// but the process still ends with its last thread.
			prog_wait();
			exit(0);
		}
	}
	real_pthread_exit(ret);
}

int pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg) {
	if (!real_pthread_create) {
		guard_up();
		real_pthread_create = (pthread_create_fn)dlsym(RTLD_NEXT, "pthread_create");
		guard_down();
	}
	if (in_self((uintptr_t)__builtin_return_address(0))) {
		guard_up();
		struct tramp *tr = ms_libc.malloc(sizeof *tr);
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
			if (rc) ms_libc.free(tr);
		}
		guard_down();
		return rc;
	}
	struct tramp *tr = tramp_get();
	if (!tr) return real_pthread_create(th, attr, fn, arg); // 1024 threads starting at once: not counted
	tr->fn = fn;
	tr->arg = arg;
	pthread_mutex_lock(&prog_mu);
	prog_threads++;
	pthread_mutex_unlock(&prog_mu);
	int rc = real_pthread_create(th, attr, program_start, tr);
	if (rc) {
		tramp_put(tr);
		prog_end(NULL);
	}
	return rc;
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

// The wrappers' real functions, found at load: a dlsym later, on the
// program's thread, would free that thread's pending dlerror() result (glibc
// frees it at the next dl call) with no FREE recorded, and the program's
// block would read as leaked. (Each wrapper still looks for its own when
// called before this, from another constructor.)
typedef int (*execve_fn)(const char *, char *const[], char *const[]);
typedef int (*execv_fn)(const char *, char *const[]);
static execve_fn real_execve, real_execvpe;
static execv_fn real_execv, real_execvp;

static void resolve_reals(void) {
	if (!real_pthread_exit) real_pthread_exit = (pthread_exit_fn)dlsym(RTLD_NEXT, "pthread_exit");
	if (!real_pthread_create) real_pthread_create = (pthread_create_fn)dlsym(RTLD_NEXT, "pthread_create");
	if (!real_fork) real_fork = (fork_fn)dlsym(RTLD_NEXT, "fork");
	if (!real_execve) real_execve = (execve_fn)dlsym(RTLD_NEXT, "execve");
	if (!real_execv) real_execv = (execv_fn)dlsym(RTLD_NEXT, "execv");
	if (!real_execvp) real_execvp = (execv_fn)dlsym(RTLD_NEXT, "execvp");
	if (!real_execvpe) real_execvpe = (execve_fn)dlsym(RTLD_NEXT, "execvpe");
	dlerror(); // (none failed, normally: nothing is pending; but cleared so)
}

// Before an exec replaces this image, everything recorded so far goes to the
// spool: the new image starts a capture of its own.
static void before_exec(const char *path) {
	if (in_child() || atomic_load(&ms_state) != 2) return;
	guard_up();
	emit(R_EXEC, F_TEXT, stamp_after(), 0, path ? strlen(path) : 0, path, path ? (uint32_t)strnlen(path, 4000) : 0);
	engine_wait(); // an exec in the image's first milliseconds
	if (atomic_load(&ms_spool_fd) >= 0) ms_drain();
	guard_down();
}

#define REAL(name, type) \
	if (!real_##name) { \
		guard_up(); \
		real_##name = (type)dlsym(RTLD_NEXT, #name); \
		guard_down(); \
	}

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
void ms_guard_enter(void) { guard_up(); }
void ms_guard_leave(void) { guard_down(); }

// ---- for the Python side (pystack.c, api.go) ----
void ms_emit(uint16_t kind, uint16_t flags, uint64_t a, uint64_t b, const void *payload, uint32_t plen) {
	emit(kind, flags, stamp_after(), a, b, payload, plen);
}

void ms_set_hook(int heap, int cstack) {
	if (cstack > MAX_FRAMES) cstack = MAX_FRAMES;
	if (cstack > 0) {
		guard_up();
		stacks_load();
		guard_down();
	}
	cfg_cstack = cstack;
	cfg_heap = heap;
	if (!ms_child) atomic_store(&ms_active, heap);
	ms_fast_update();
}

extern void *ms_own_malloc(size_t) HIDDEN; // hooks.c: this copy's malloc
// The main program's handle searches the global scope in order: our malloc
// comes first only if this copy was preloaded or linked (RTLD_DEFAULT would
// search this object's own scope first when it was dlopen'ed).
// Computed once, at load (pystack.c's constructor), while the loader runs.
// Asking dlsym(self, "malloc") is not enough: a program built without PIE
// that takes malloc's address (CPython's allocator table does; Debian's and
// Ubuntu's /usr/bin/python3 are such programs) owns the canonical address,
// its PLT entry, which then jumps to ours. So: whether this library comes
// before libc in the program's list of loaded objects, as a preloaded or
// linked one does and a dlopen'ed one never does.
int ms_interposed(void) {
	static int known = -1;
	if (known < 0) {
		void *self = dlopen(NULL, RTLD_NOW | RTLD_NOLOAD);
		known = self && dlsym(self, "malloc") == (void *)ms_own_malloc;
		struct link_map *me = NULL, *libc = NULL, *lm = NULL;
		Dl_info di;
		if (!known && self && dladdr1((void *)ms_own_malloc, &di, (void **)&me, RTLD_DL_LINKMAP) &&
		    dladdr1(libc_text(), &di, (void **)&libc, RTLD_DL_LINKMAP) && me && libc &&
		    dlinfo(self, RTLD_DI_LINKMAP, &lm) == 0)
			for (; lm && lm != libc; lm = lm->l_next)
				if (lm == me) known = 1;
		if (self) dlclose(self);
	}
	return known;
}

// ---- exit ----
extern void msGoAtExit(void);

// Runs after main returns or exit() is called. Events after the final drain
// (frees in other libraries' destructors) go straight to the spool.
__attribute__((destructor)) static void ms_dtor(void) {
	if (in_child() || atomic_load(&ms_state) != 2) return;
	sigset_t old;
	int blocked = exit_work_begin(&old);
	guard_up();
	msGoAtExit(); // waits for the Go runtime's start, then calls ms_finish
	guard_down();
	exit_work_end(blocked, &old);
}
