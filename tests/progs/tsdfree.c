/* Threads whose last free happens after msmemscope's own thread-exit hook:
 * each thread mallocs a block of TSD_SIZE bytes and hands it to a
 * thread-specific key, whose destructor frees it as the thread ends. The
 * library's key was created first, so its destructor runs first: the frees
 * that follow are recorded in a ring the thread takes anew, under the same
 * tid. Every block must come out freed. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define THREADS 200
#define TSD_SIZE 4242

static pthread_key_t key;

static void *worker(void *arg) {
	(void)arg;
	for (int i = 0; i < 50; i++) free(malloc(16 + i)); /* a little history */
	pthread_setspecific(key, malloc(TSD_SIZE));
	return NULL;
}

int main(void) {
	pthread_key_create(&key, free);
	for (int i = 0; i < THREADS; i += 4) {
		pthread_t th[4];
		for (int j = 0; j < 4; j++) pthread_create(&th[j], NULL, worker, NULL);
		for (int j = 0; j < 4; j++) pthread_join(th[j], NULL);
	}
	printf("done\n");
	return 0;
}
