// A SIGTERM handler that calls exit(3), after allocating: the handler runs
// after msmemscope's (on its alternate signal stack), and exit() does the
// capture's exit work from there (argv[1]: that many runs of work first).
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *volatile keep[5];

static void on_term(int sig) {
	(void)sig;
	exit(3);
}

int main(void) {
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_term;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGTERM, &sa, NULL)) return 5;
	for (int k = 0; k < 5; k++) keep[k] = malloc(12345 + 1000 * (size_t)k);
	for (int i = 0; i < 200000; i++) free(malloc(64)); // exit's work has events to read
	kill(getpid(), SIGTERM);
	pause();
	return 6;
}
