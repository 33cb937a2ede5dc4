/* Allocates NBLK blocks of known sizes (BASE + 1000*k, kept), then ends at
 * once the way argv[1] says, with no pause in between:
 *   segv   raise(SIGSEGV)
 *   fault  a write through a null pointer
 *   abort  abort()
 *   double a double free: glibc's malloc aborts (SIGABRT inside free)
 *   stack  infinite recursion (a stack overflow)
 *   own    its own SIGSEGV handler (sigaction, SA_SIGINFO) prints
 *          "handled 11" and exits 3; then raise(SIGSEGV)
 *   signal the same handler installed with signal()
 *   _exit  _exit(7) (no exit handlers: msmemscope's final drain is in it)
 *   _Exit  _Exit(7)
 *   quick_exit  quick_exit(7), whose at_quick_exit handler frees the first block
 *   term   a SIGTERM handler that calls _exit(7), then raise(SIGTERM)
 *   sigterm, sigint, sighup, sigusr1  raise that signal (its default action ends the process)
 *   sigpipe  write to a pipe whose reading end is closed (SIGPIPE, as under `| head -1`)
 *   ignterm  SIGTERM ignored (signal), raised, then exit(0)
 *   unignterm  SIGTERM ignored then set to its default again (sigaction), raised
 * argv[2], if given: that many malloc(4093)/free pairs first (a busy drain).
 * No stdio before the crash. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BASE 12345
#define NBLK 5

static void *volatile sink[NBLK];
static volatile int depth;

static void on_segv(int sig, siginfo_t *info, void *uc) {
	(void)info;
	(void)uc;
	char msg[] = "handled 00\n";
	msg[8] = (char)('0' + sig / 10);
	msg[9] = (char)('0' + sig % 10);
	if (write(1, msg, sizeof msg - 1) < 0) _exit(4);
	exit(3);
}

static void on_segv_plain(int sig) { on_segv(sig, NULL, NULL); }

static void on_quick(void) { free(sink[0]); }

static void on_term(int sig) {
	(void)sig;
	_exit(7);
}

#pragma GCC diagnostic ignored "-Winfinite-recursion"
static int recurse(int n) {
	volatile char frame[256];
	frame[0] = (char)n;
	depth++;
	return recurse(n + 1) + frame[0];
}

int main(int argc, char **argv) {
	const char *mode = argc > 1 ? argv[1] : "segv";
	if (!strcmp(mode, "own")) {
		struct sigaction sa;
		memset(&sa, 0, sizeof sa);
		sa.sa_sigaction = on_segv;
		sa.sa_flags = SA_SIGINFO;
		sigemptyset(&sa.sa_mask);
		if (sigaction(SIGSEGV, &sa, NULL)) return 5;
	}
	if (!strcmp(mode, "signal") && signal(SIGSEGV, on_segv_plain) == SIG_ERR) return 5;
	if (!strcmp(mode, "term") && signal(SIGTERM, on_term) == SIG_ERR) return 5;
	if (!strcmp(mode, "unignterm")) {
		struct sigaction sa;
		memset(&sa, 0, sizeof sa);
		sa.sa_handler = SIG_IGN;
		if (sigaction(SIGTERM, &sa, NULL)) return 5;
		sa.sa_handler = SIG_DFL;
		if (sigaction(SIGTERM, &sa, NULL)) return 5;
	}
	for (long i = 0, n = argc > 2 ? atol(argv[2]) : 0; i < n; i++) {
		void *volatile p = malloc(4093);
		free(p);
	}
	for (int k = 0; k < NBLK; k++) sink[k] = malloc(BASE + 1000 * (size_t)k);
	if (!strcmp(mode, "fault")) *(volatile int *)(sink[0] ? NULL : sink[1]) = 1;
	if (!strcmp(mode, "abort")) abort();
	if (!strcmp(mode, "double")) {
		free(sink[0]);
		free(sink[0]);
	}
	if (!strcmp(mode, "stack")) return recurse(0);
	if (!strcmp(mode, "_exit")) _exit(7);
	if (!strcmp(mode, "_Exit")) _Exit(7);
	if (!strcmp(mode, "quick_exit") && !at_quick_exit(on_quick)) quick_exit(7);
	if (!strcmp(mode, "term")) raise(SIGTERM);
	if (!strcmp(mode, "sigterm") || !strcmp(mode, "unignterm")) raise(SIGTERM);
	if (!strcmp(mode, "sigint")) raise(SIGINT);
	if (!strcmp(mode, "sighup")) raise(SIGHUP);
	if (!strcmp(mode, "sigusr1")) raise(SIGUSR1);
	if (!strcmp(mode, "sigpipe")) {
		int fd[2];
		if (pipe(fd)) return 5;
		close(fd[0]);
		if (write(fd[1], "x", 1) < 0) return 5;
	}
	if (!strcmp(mode, "ignterm")) {
		if (signal(SIGTERM, SIG_IGN) == SIG_ERR) return 5;
		raise(SIGTERM);
		exit(0);
	}
	raise(SIGSEGV);
	return 6;
}
