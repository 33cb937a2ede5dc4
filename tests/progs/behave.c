/* CLI behaviour:
 *   exit N          exits with N
 *   signal N        kills itself with signal N after 300 ms (its capture has
 *                   started by then)
 *   early-signal N  kills itself with signal N at once
 *   trap            prints "ready", waits for SIGTERM (caught by a handler,
 *                   on whichever thread), then exits 42
 *   sigwait         blocks SIGTERM, prints "ready", sleeps 300 ms (the signal
 *                   arrives meanwhile and stays pending), then takes it with
 *                   sigwait() and exits 42 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t got;
static void *volatile sink;

static void on_term(int sig) { got = sig; }

static void sleep_ms(long ms) {
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
	nanosleep(&ts, NULL);
}

int main(int argc, char **argv) {
	if (argc < 2) return 100;
	sink = malloc(1234);
	if (!strcmp(argv[1], "exit") && argc > 2) return atoi(argv[2]);
	if (!strcmp(argv[1], "signal") && argc > 2) {
		sleep_ms(300);
		raise(atoi(argv[2]));
		return 101;
	}
	if (!strcmp(argv[1], "early-signal") && argc > 2) {
		raise(atoi(argv[2]));
		return 101;
	}
	if (!strcmp(argv[1], "trap")) {
		struct sigaction sa;
		memset(&sa, 0, sizeof sa);
		sa.sa_handler = on_term;
		sigaction(SIGTERM, &sa, NULL);
		if (write(1, "ready\n", 6) != 6) return 102;
		for (int i = 0; i < 60000 && !got; i++) sleep_ms(1);
		sink = malloc(4321); /* after the signal: still recorded */
		return got == SIGTERM ? 42 : 103;
	}
	if (!strcmp(argv[1], "sigwait")) {
		sigset_t set;
		sigemptyset(&set);
		sigaddset(&set, SIGTERM);
		if (pthread_sigmask(SIG_BLOCK, &set, NULL)) return 104;
		if (write(1, "ready\n", 6) != 6) return 102;
		sleep_ms(300);
		int sig = 0;
		if (sigwait(&set, &sig) || sig != SIGTERM) return 105;
		return 42;
	}
	return 106;
}
