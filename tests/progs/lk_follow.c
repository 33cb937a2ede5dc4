/* Leak kinds of a program that runs a while: blocks are made, handed to a
 * second thread that frees some, and lost or kept over five phases 0.8 s
 * apart, so that msmemscope's live set is read as the run goes (from 2 s
 * on; the exit scan reads only the rest). Kinds at exit: per phase, one lost list of 3
 * (definitely 1, indirectly 2), one kept block, and the freed ones gone. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct node { struct node *next; char pad[40]; };
static void *kept[5];
static void *volatile handoff[64];

static void *freer(void *arg) {
	(void)arg;
	/* No stale pointer stays: the allocator hands these addresses out
	 * again (valgrind's would not, see the test). */
	for (int i = 0; i < 64; i++) {
		free(handoff[i]);
		handoff[i] = NULL;
	}
	return NULL;
}

static __attribute__((noinline)) void lose_list(void) {
	struct node *head = NULL;
	for (int i = 0; i < 3; i++) {
		struct node *n = malloc(sizeof *n);
		memset(n, 0, sizeof *n);
		n->next = head;
		head = n;
	}
	memset(&head, 0, sizeof head); /* the only pointer to the list is gone */
	__asm__ volatile("" ::: "memory");
}

int main(void) {
	for (int phase = 0; phase < 5; phase++) {
		for (int i = 0; i < 64; i++) handoff[i] = malloc(24 + i);
		pthread_t t;
		if (pthread_create(&t, NULL, freer, NULL)) return 1;
		pthread_join(t, NULL);
		kept[phase] = malloc(100 + phase);
		lose_list();
		struct timespec ts = {0, 800 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	return 0;
}
