/* A pool of 8 threads sharing 4096 slots: each thread, 200,000 times, puts a
 * fresh block of a random size into a random slot and frees the block that
 * was there, most often another thread's. Whatever the slots hold at the end
 * is freed by main. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#define THREADS 8
#define ROUNDS 200000
#define SLOTS 4096
static _Atomic(void *) slot[SLOTS];
static void *worker(void *arg) {
	unsigned x = 2463534242u + (unsigned)(size_t)arg * 7919u;
	for (int i = 0; i < ROUNDS; i++) {
		x ^= x << 13; x ^= x >> 17; x ^= x << 5;
		char *p = malloc(8 + (x >> 20) % 512);
		p[0] = (char)i;
		void *old = atomic_exchange(&slot[x % SLOTS], p);
		free(old);
	}
	return NULL;
}
int main(void) {
	pthread_t th[THREADS];
	for (long i = 0; i < THREADS; i++)
		if (pthread_create(&th[i], NULL, worker, (void *)i)) return 1;
	for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
	for (int i = 0; i < SLOTS; i++) free(slot[i]);
	return 0;
}
