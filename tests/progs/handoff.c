/* Producer/consumer: one thread mallocs N blocks and hands each through a
 * queue to a second thread, which frees it. Sizes vary so that a FREE paired
 * with the wrong MALLOC shows in the byte totals. */
#include <pthread.h>
#include <stdlib.h>
#define N 1000000
#define Q 1024
static void *q[Q];
static unsigned head, tail;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t notempty = PTHREAD_COND_INITIALIZER, notfull = PTHREAD_COND_INITIALIZER;
static void *consumer(void *arg) {
	(void)arg;
	for (int i = 0; i < N; i++) {
		pthread_mutex_lock(&mu);
		while (head == tail) pthread_cond_wait(&notempty, &mu);
		void *p = q[tail++ % Q];
		pthread_cond_signal(&notfull);
		pthread_mutex_unlock(&mu);
		free(p);
	}
	return NULL;
}
int main(void) {
	pthread_t th;
	if (pthread_create(&th, NULL, consumer, NULL)) return 1;
	for (int i = 0; i < N; i++) {
		char *p = malloc(16 + (i % 7) * 16);
		p[0] = (char)i;
		pthread_mutex_lock(&mu);
		while (head - tail == Q) pthread_cond_wait(&notfull, &mu);
		q[head++ % Q] = p;
		pthread_cond_signal(&notempty);
		pthread_mutex_unlock(&mu);
	}
	pthread_join(th, NULL);
	return 0;
}
