// Four threads each allocate 200,000 blocks, then free their neighbour's
// (every block is freed by a thread that did not allocate it); then main
// loses a malloc(20), its last allocation. valgrind: 20 bytes definitely
// lost, and the threads' DTVs possibly lost (glibc keeps their stacks).
#include <pthread.h>
#include <stdlib.h>

#define T 4
#define N 200000
static void *blocks[T][N];
static pthread_barrier_t bar;

static void *work(void *arg) {
	long id = (long)arg;
	for (int i = 0; i < N; i++) blocks[id][i] = malloc(16 + (i % 200));
	pthread_barrier_wait(&bar);
	long next = (id + 1) % T;
	for (int i = 0; i < N; i++) {
		free(blocks[next][i]);
		blocks[next][i] = NULL;
	}
	return NULL;
}

int main(void) {
	pthread_t th[T];
	pthread_barrier_init(&bar, NULL, T);
	for (long i = 0; i < T; i++) pthread_create(&th[i], NULL, work, (void *)i);
	for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
	void *volatile p = malloc(20);
	p = NULL;
	(void)p;
	return 0;
}
