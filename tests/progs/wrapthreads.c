// Threads that allocate through libc's wrappers (strdup: its site is found
// by unwinding, with the libunwind msmemscope loads), then end: four at
// once, then four one after another (each on the stack glibc kept from the
// last). libunwind's per-thread cache is unmapped as each thread ends, and
// its thread-local block freed when glibc reuses the thread's stack: both
// msmemscope's, not the program's (no FREE without its MALLOC).
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static void *work(void *arg) {
	(void)arg;
	for (int i = 0; i < 1000; i++) free(strdup("a string of some length"));
	return NULL;
}

int main(void) {
	pthread_t t[4];
	for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, work, NULL);
	for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
	for (int i = 0; i < 4; i++) {
		pthread_create(&t[0], NULL, work, NULL);
		pthread_join(t[0], NULL);
	}
	return 0;
}
