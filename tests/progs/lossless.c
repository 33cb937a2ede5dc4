/* 8 threads x 1,000,000 malloc/free pairs; thread t allocates SIZE+t bytes so
 * each thread's events can be counted in the dump. The volatile pointer keeps
 * gcc from removing the pair. */
#include <pthread.h>
#include <stdlib.h>

#define THREADS 8
#define PAIRS 1000000
#define SIZE 1000

static void *worker(void *arg) {
	size_t n = SIZE + (size_t)arg;
	for (int i = 0; i < PAIRS; i++) {
		char *volatile p = malloc(n);
		p[0] = (char)i;
		free(p);
	}
	return NULL;
}

int main(void) {
	pthread_t th[THREADS];
	for (long i = 0; i < THREADS; i++)
		if (pthread_create(&th[i], NULL, worker, (void *)i)) return 1;
	for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
	return 0;
}
