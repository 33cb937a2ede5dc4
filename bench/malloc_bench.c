/* malloc/free microbenchmark for `make bench`: N pairs of mixed sizes per
 * thread. Prints the loop's own wall time (start-up and exit excluded) as
 * "loop_ns <total> pairs <n>" on stdout. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include "now.h"

static long pairs;

static void *work(void *arg) {
	unsigned x = (unsigned)(long)arg * 2654435761u + 1;
	char *volatile keep[64] = {0};
	for (long i = 0; i < pairs; i++) {
		x = x * 1103515245u + 12345u;
		size_t sz = 8 + ((x >> 16) & 1023); /* 8..1031 bytes */
		int slot = (x >> 8) & 63;
		char *p = malloc(sz);
		p[0] = (char)i;
		if (keep[slot]) free(keep[slot]); /* frees lag allocations a little, like real programs */
		keep[slot] = p;
	}
	for (int i = 0; i < 64; i++) free(keep[i]);
	return NULL;
}

int main(int argc, char **argv) {
	long total = argc > 1 ? atol(argv[1]) : 20000000;
	int threads = argc > 2 ? atoi(argv[2]) : 1;
	pairs = total / threads;
	pthread_t th[64];
	double t0 = now();
	for (int i = 0; i < threads; i++) pthread_create(&th[i], NULL, work, (void *)(long)i);
	for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
	double t1 = now();
	printf("loop_ns %.0f pairs %ld\n", t1 - t0, pairs * threads);
	return 0;
}
