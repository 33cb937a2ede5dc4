/* A thread that records after its end, in a ring another thread used
 * meanwhile: thread A's last block is freed by a thread-specific key's
 * destructor, which runs after msmemscope's own (A gives its ring up). While
 * it waits, the drain releases A's ring and thread B takes it, records and
 * ends. A's FREE must then go to a ring of A's own, not back into the ring
 * it gave up (now B's): its row says A's thread. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define A_SIZE 4343
#define B_SIZE 3131

static pthread_key_t key;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int a_ending, b_done;

static void late_free(void *p) {
	usleep(100 * 1000); /* the drain releases A's ring */
	pthread_mutex_lock(&mu);
	a_ending = 1;
	pthread_cond_broadcast(&cv);
	while (!b_done) pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
	free(p);
}

static void *thread_a(void *arg) {
	(void)arg;
	pthread_setspecific(key, malloc(A_SIZE));
	return NULL;
}

static void *thread_b(void *arg) {
	(void)arg;
	for (int i = 0; i < 10; i++) {
		void *volatile p = malloc(B_SIZE);
		free(p);
	}
	return NULL;
}

int main(void) {
	pthread_key_create(&key, late_free);
	pthread_t a, b;
	pthread_create(&a, NULL, thread_a, NULL);
	pthread_mutex_lock(&mu);
	while (!a_ending) pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
	pthread_create(&b, NULL, thread_b, NULL);
	pthread_join(b, NULL); /* B gave the ring up; the drain has yet to release it */
	pthread_mutex_lock(&mu);
	b_done = 1;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	pthread_join(a, NULL);
	printf("done\n");
	return 0;
}
