/* Short-lived threads for `make bench`: T threads, W at a time, each
 * allocating B blocks and freeing the B blocks the thread before it in its
 * slot left behind, so nearly every block is freed by another thread than
 * the one that allocated it (T*B mallocs in all). Prints "loop_ns" as
 * malloc_bench does. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include "now.h"

#define W 8

static int blocks;
static void **handed[W]; /* per slot: the blocks the last thread there left */

static void *work(void *arg) {
	long slot = (long)arg;
	void **mine = malloc(blocks * sizeof *mine);
	for (int i = 0; i < blocks; i++) mine[i] = malloc(16 + (i * 37) % 500);
	void **prev = handed[slot];
	if (prev) {
		for (int i = 0; i < blocks; i++) free(prev[i]);
		free(prev);
	}
	handed[slot] = mine;
	return NULL;
}

int main(int argc, char **argv) {
	int threads = argc > 1 ? atoi(argv[1]) : 2000;
	blocks = argc > 2 ? atoi(argv[2]) : 200;
	double t0 = now();
	for (int done = 0; done < threads; done += W) {
		pthread_t th[W];
		int n = threads - done < W ? threads - done : W;
		for (long i = 0; i < n; i++) pthread_create(&th[i], NULL, work, (void *)i);
		for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
	}
	for (int s = 0; s < W; s++) {
		if (!handed[s]) continue;
		for (int i = 0; i < blocks; i++) free(handed[s][i]);
		free(handed[s]);
	}
	printf("loop_ns %.0f threads %d blocks %d\n", now() - t0, threads, blocks);
	return 0;
}
