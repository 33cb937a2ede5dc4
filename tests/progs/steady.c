/* Allocates block k (size BASE+k) for k = 0, 1, ... N-1, one about every
 * millisecond (every argv[1] microseconds when given), and after each
 * allocation reports "k" on stdout with write(2). The first line is "pid P".
 * Every fourth block is freed again. The tests kill it with SIGKILL half-way
 * or at a random moment. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BASE 50000
#define N 4000

static void *volatile sink;

static int put(const char *prefix, long v) {
	char buf[40];
	size_t n = strlen(prefix);
	memcpy(buf, prefix, n);
	char tmp[24];
	int m = 0;
	do tmp[m++] = (char)('0' + v % 10); while ((v /= 10) > 0);
	while (m) buf[n++] = tmp[--m];
	buf[n++] = '\n';
	return write(1, buf, n) == (ssize_t)n ? 0 : -1;
}

int main(int argc, char **argv) {
	long us = argc > 1 ? atol(argv[1]) : 1000;
	if (put("pid ", (long)getpid())) return 1;
	char *prev = NULL;
	for (long k = 0; k < N; k++) {
		char *p = malloc(BASE + (size_t)k);
		p[0] = 1;
		sink = p;
		if (k % 4 == 3) {
			free(prev); /* block k-1 */
		}
		prev = p;
		if (put("", k)) return 1;
		struct timespec ts = {0, us * 1000};
		nanosleep(&ts, NULL);
	}
	return 0;
}
