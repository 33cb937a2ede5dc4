/* --collect-mode=deferred, two threads allocating and freeing small blocks
 * before the first msmemscope_start(): precise stamps are on (two threads
 * record), and nothing recorded while collection was off becomes a row. */
#include <msmemscope.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

static void *volatile sink;

static void *work(void *arg) {
	(void)arg;
	for (int r = 0; r < 200; r++) {
		void *p[64];
		for (int i = 0; i < 64; i++) p[i] = malloc(24);
		for (int i = 0; i < 64; i++) free(p[i]);
		usleep(100);
	}
	return NULL;
}

int main(void) {
	pthread_t t[2];
	for (int i = 0; i < 2; i++)
		if (pthread_create(&t[i], NULL, work, NULL)) return 1;
	for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
	if (msmemscope_start()) return 1;
	sink = malloc(30002);
	if (msmemscope_stop()) return 1;
	return 0;
}
