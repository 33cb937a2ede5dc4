/* main calls pthread_exit: the process ends with status 0 when its last
 * thread does (msmemscope's own threads live on: it must not wait for them),
 * after glibc ran main's cleanup handler and thread-specific destructor,
 * which free the blocks of 789 and 123 bytes (msmemscope called exit before
 * them). With "alone", main has no thread left to wait for. With "slow",
 * another thread's destructor frees a block of 4567 bytes 300 ms after its
 * start routine returned, while the worker ends first. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
static char *g;
static pthread_key_t key, slow_key;
static void *worker(void *arg) {
	usleep(50000);
	g = malloc(111);
	return arg;
}
static void slow_free(void *p) {
	// Busy, not asleep: a sleep ends early at the exit scan's stop signal.
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do
		clock_gettime(CLOCK_MONOTONIC, &t);
	while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 300000000L);
	free(p);
}
static void *slow(void *arg) {
	pthread_setspecific(slow_key, malloc(4567));
	return arg;
}
int main(int argc, char **argv) {
	pthread_key_create(&key, free);
	pthread_key_create(&slow_key, slow_free);
	pthread_setspecific(key, malloc(123));
	void *c = malloc(789);
	pthread_cleanup_push(free, c);
	pthread_t t;
	if (argc < 2 || strcmp(argv[1], "alone")) pthread_create(&t, NULL, worker, NULL);
	if (argc > 1 && !strcmp(argv[1], "slow")) pthread_create(&t, NULL, slow, NULL);
	pthread_exit(NULL);
	pthread_cleanup_pop(0);
}
