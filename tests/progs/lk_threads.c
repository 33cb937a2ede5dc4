/* Leak kinds with threads: a thread leaks a block and ends (its stack, kept
 * by glibc for the next thread, is not a root: definitely lost); a thread in
 * another arena leaves a pointer in a chunk it freed (a free chunk is not a
 * root: definitely lost); a block held in shared anonymous memory and one
 * held in a private pool that the kernel may merge with a neighbouring
 * mmapped chunk (still reachable); a lost malloc(20) last. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
static void *dropper(void *a) {
	(void)a;
	void *volatile p = malloc(1 << 20);
	(void)p;
	return NULL;
}
static void *arena_user(void *a) {
	(void)a;
	volatile uintptr_t x = (uintptr_t)malloc(1 << 19) ^ 0x5555000000000000; // hidden: no address, not even inside the block
	void **q = malloc(64);
	q[2] = (void *)(x ^ 0x5555000000000000);
	free(q);
	x = 0;
	return NULL;
}
int main(void) {
	pthread_t t;
	pthread_create(&t, NULL, dropper, NULL);
	pthread_join(t, NULL);
	pthread_create(&t, NULL, arena_user, NULL);
	pthread_join(t, NULL);
	void **sh = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	sh[0] = malloc(40);
	void **pool = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	static char *big;
	big = malloc(1 << 20);
	memset(big, 1, 1 << 20);
	pool[0] = malloc(32);
	sh = pool = NULL;
	char *last = malloc(20);
	last[0] = 0;
	return 0;
}
