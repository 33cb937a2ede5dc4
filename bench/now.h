/* The benchmarks' clock: CLOCK_MONOTONIC in ns, for their "loop_ns". */
#include <time.h>

static double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}
