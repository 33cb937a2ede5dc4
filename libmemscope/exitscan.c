// What the leak-kind scan at exit needs from the C side (the scan itself is
// Go: package leakscan, called from engine.go):
//
//   - msmemscope's own mappings (rings, segments, stacks of its threads, the
//     Python code table): they hold every block's address, so they are never
//     roots. Every mapping this library makes goes through own_note.
//   - where the program's stack ends at exit: the scan reads the main
//     thread's stack from there up, not the dead frames below it (valgrind
//     does not read them either: it knows they are undefined). main is
//     wrapped through __libc_start_main, and exit() called by the program
//     records its caller's frame.
//   - a handler that runs after every destructor, the loader's _dl_fini
//     included: registered with __cxa_atexit before __libc_start_main
//     registers _dl_fini, it runs after it (the handlers run last-in
//     first-out).
#define _GNU_SOURCE
#include <dlfcn.h>

#include "internal.h"

// ---- msmemscope's own mappings ----
#define OWN_MAX 65536 // a thread takes about three (its stack, its first segment, its ring page)
static struct {
	uintptr_t lo, hi;
} own[OWN_MAX];
static int own_n, own_free; // slots in use; a slot below which none is free
static atomic_flag own_lock = ATOMIC_FLAG_INIT;
static int own_full; // a mapping could not be noted

static void own_take(void) {
	while (atomic_flag_test_and_set_explicit(&own_lock, memory_order_acquire)) {
	}
}
static void own_give(void) { atomic_flag_clear_explicit(&own_lock, memory_order_release); }

// own_put notes [lo, hi) in a free slot; own_lock is held.
static void own_put(uintptr_t lo, uintptr_t hi) {
	int i = own_free;
	while (i < own_n && own[i].lo) i++;
	if (i < OWN_MAX) {
		own[i].lo = lo;
		own[i].hi = hi;
		if (i == own_n) own_n++;
		own_free = i + 1;
	} else {
		own_full = 1; // the scan says its kinds may be wrong
	}
}

HIDDEN void own_note(void *p, size_t n) {
	if (!p || !n) return;
	own_take();
	own_put((uintptr_t)p, (uintptr_t)p + n);
	own_give();
}

// own_map notes a mapping the Go runtime made: on linux/amd64 it maps
// through cgo's _cgo_mmap, which calls mmap from inside this library. Its
// heap arenas and what it keeps off its heap (heap metadata, the pages a
// growing slice left) hold copies of block addresses the scan must not read
// as the program's. Go maps over its own reservations (MAP_FIXED): a range
// already noted is not noted again.
HIDDEN void own_map(void *p, size_t n) {
	if (!p || !n) return;
	uintptr_t lo = (uintptr_t)p, hi = lo + n;
	own_take();
	int noted = 0;
	for (int i = 0; i < own_n && !noted; i++) noted = own[i].lo && own[i].lo <= lo && hi <= own[i].hi;
	if (!noted) own_put(lo, hi);
	own_give();
}

// own_unmap takes [p, p+n) out of the ranges noted: Go unmaps parts of its
// reservations (the excess of an aligned one), and the program may map
// there later.
HIDDEN void own_unmap(void *p, size_t n) {
	uintptr_t lo = (uintptr_t)p, hi = lo + n;
	own_take();
	for (int i = 0; i < own_n; i++) { // (a part split off starts at hi: not looked at again)
		uintptr_t a = own[i].lo, b = own[i].hi;
		if (!a || b <= lo || hi <= a) continue;
		if (lo <= a && b <= hi) { // all of it
			own[i].lo = own[i].hi = 0;
			if (i < own_free) own_free = i;
		} else if (lo <= a) {
			own[i].lo = hi;
		} else if (b <= hi) {
			own[i].hi = lo;
		} else { // a hole in it: two ranges
			own[i].hi = lo;
			own_put(hi, b);
		}
	}
	own_give();
}

// ms_own_regions copies up to cap [lo, hi) pairs of this library's mappings
// into out and returns how many there are.
int ms_own_regions(uint64_t *out, int cap) {
	int n = 0;
	own_take();
	for (int i = 0; i < own_n; i++) {
		if (!own[i].lo) continue;
		if (n < cap) {
			out[2 * n] = own[i].lo;
			out[2 * n + 1] = own[i].hi;
		}
		n++;
	}
	own_give();
	if (own_full && n <= cap) n = cap + 1; // some were not noted: the caller warns
	return n;
}

// ---- the stacks of threads that ended ----
// glibc keeps a joined thread's stack for the next thread (or unmaps it):
// its old frames are not roots. A ring of the latest ones; a stack a live
// thread uses again is told apart at the scan (its stack pointer is in it).
#define DEAD_MAX 4096
static uint64_t dead[DEAD_MAX][2];
static _Atomic uint64_t dead_n;

HIDDEN void dead_stack_note(uintptr_t lo, uintptr_t hi) {
	uint64_t i = atomic_fetch_add(&dead_n, 1) % DEAD_MAX;
	dead[i][0] = 0; // not read while half-written
	dead[i][1] = hi;
	__atomic_store_n(&dead[i][0], lo, __ATOMIC_RELEASE);
}

// ms_dead_stacks copies up to cap [lo, hi) pairs of ended threads' stacks
// into out and returns how many it copied.
int ms_dead_stacks(uint64_t *out, int cap) {
	uint64_t n = atomic_load(&dead_n);
	int k = 0;
	for (uint64_t i = 0; i < n && i < DEAD_MAX && k < cap; i++) {
		uint64_t lo = __atomic_load_n(&dead[i][0], __ATOMIC_ACQUIRE);
		if (!lo) continue;
		out[2 * k] = lo;
		out[2 * k + 1] = dead[i][1];
		k++;
	}
	return k;
}

// ---- where the program's stack ends at exit ----
static _Atomic uintptr_t exit_sp;  // the lowest live frame when exit began
static _Atomic int late_armed;      // late_exit will run
static int (*real_main)(int, char **, char **);
typedef void (*exit_fn)(int) __attribute__((noreturn));
static exit_fn real_exit; // resolved before main: dlsym may allocate

// ms_exit_sp is the main thread's stack pointer as the program left it.
uint64_t ms_exit_sp(void) { return atomic_load(&exit_sp); }
int ms_late_armed(void) { return atomic_load(&late_armed); }

static int main_shim(int argc, char **argv, char **envp) {
	int r = real_main(argc, argv, envp);
	// main's frames are gone: what lies above this frame is libc's start
	// code and the initial stack (argv, environment).
	uintptr_t none = 0;
	atomic_compare_exchange_strong(&exit_sp, &none, (uintptr_t)__builtin_frame_address(0));
	return r;
}

extern void msGoLeakScan(uint64_t sp);
extern void msGoAtExit(void);

// Runs after every destructor: the blocks alive now are the exit leaks.
static void late_exit(void *arg) {
	(void)arg;
	if (in_child() || atomic_load(&ms_state) != 2) return;
	uintptr_t none = 0;
	atomic_compare_exchange_strong(&exit_sp, &none, (uintptr_t)__builtin_frame_address(0));
	sigset_t old;
	int blocked = exit_work_begin(&old);
	guard_up();
	// Another thread's exit() may still be in _dl_fini, before this
	// library's destructor: the capture is finished here first (once).
	msGoAtExit();
	msGoLeakScan(atomic_load(&exit_sp));
	guard_down();
	exit_work_end(blocked, &old);
}

extern int __cxa_atexit(void (*fn)(void *), void *arg, void *dso);

typedef int (*start_main_fn)(int (*)(int, char **, char **), int, char **, void (*)(void), void (*)(void),
                             void (*)(void), void *);

int __libc_start_main(int (*main)(int, char **, char **), int argc, char **argv, void (*init)(void),
                      void (*fini)(void), void (*rtld_fini)(void), void *stack_end) {
	start_main_fn real = (start_main_fn)dlsym(RTLD_NEXT, "__libc_start_main");
	real_exit = (exit_fn)dlsym(RTLD_NEXT, "exit");
	real_main = main;
	// Registered before the real one registers rtld_fini, so run after it;
	// with no DSO handle, so that this library's own finalization leaves it.
	if (!__cxa_atexit(late_exit, NULL, NULL)) atomic_store(&late_armed, 1);
	return real(main_shim, argc, argv, init, fini, rtld_fini, stack_end);
}

// exit() called by the program: its caller's frames are live, and so are
// the callee-saved registers it was called with (roots, as valgrind reads
// the registers of the threads at exit). The entry keeps them before any
// compiled code can touch them, then goes on in C.
__attribute__((used, visibility("hidden"))) uint64_t ms_exit_entry[7]; // rsp, rbx, rbp, r12-r15
__attribute__((used, visibility("hidden"))) uint64_t ms_exit_claim;    // bit 0: a thread saved them
static _Atomic int exit_regs_set;
// Only the first thread to call exit() saves its registers.
__asm__(".globl exit\n"
        ".type exit, @function\n"
        "exit:\n"
        "	lock btsq $0, ms_exit_claim(%rip)\n"
        "	jc 1f\n"
        "	movq %rsp, ms_exit_entry(%rip)\n"
        "	movq %rbx, ms_exit_entry+8(%rip)\n"
        "	movq %rbp, ms_exit_entry+16(%rip)\n"
        "	movq %r12, ms_exit_entry+24(%rip)\n"
        "	movq %r13, ms_exit_entry+32(%rip)\n"
        "	movq %r14, ms_exit_entry+40(%rip)\n"
        "	movq %r15, ms_exit_entry+48(%rip)\n"
        "1:	jmp ms_exit_impl\n"
        ".size exit, .-exit\n");

__attribute__((used, visibility("hidden"), noreturn)) void ms_exit_impl(int status) {
	uintptr_t none = 0, sp = __atomic_load_n(&ms_exit_entry[0], __ATOMIC_ACQUIRE);
	if (sp && atomic_compare_exchange_strong(&exit_sp, &none, sp)) atomic_store(&exit_regs_set, 1);
	exit_fn real = real_exit ? real_exit : (exit_fn)dlsym(RTLD_NEXT, "exit");
	real(status);
}

// ms_exit_regs copies the callee-saved registers exit() was called with
// into out (6 words) and returns 1, or 0 when the program did not call it
// (main returned: the registers hold libc's start code's values).
int ms_exit_regs(uint64_t *out) {
	if (!atomic_load(&exit_regs_set)) return 0;
	memcpy(out, ms_exit_entry + 1, 6 * sizeof(uint64_t));
	return 1;
}
