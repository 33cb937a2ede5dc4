// A planted leak for the pprof export: lose() drops three 100,000-byte
// blocks (definitely lost), keep() holds 50 small ones (still reachable),
// churn() allocates 1,000 blocks and frees them (allocated, not in use).
#include <stdlib.h>

static void *kept[50];

static __attribute__((noinline)) void lose(void) {
	void *volatile p = malloc(100000);
	(void)p;
}
static __attribute__((noinline)) void keep(void) {
	for (int i = 0; i < 50; i++) kept[i] = malloc(64);
}
static __attribute__((noinline)) void churn(void) {
	for (int i = 0; i < 1000; i++) {
		void *volatile p = malloc(512);
		free(p);
	}
}

int main(void) {
	for (int i = 0; i < 3; i++) lose();
	keep();
	churn();
	return 0;
}
