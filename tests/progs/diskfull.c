/* A disk that fills while the program runs and frees again (with
 * diskfull_shim.so preloaded): rounds of malloc/free pairs of sizes 100,
 * 101, ..., 299, a round every millisecond: 100 rounds, the disk full for
 * 50 rounds and 60 ms more, then 100 rounds on free disk. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void disk_full(int on) __attribute__((weak));

static void rounds(int n) {
	struct timespec ms = {0, 1000000};
	for (int r = 0; r < n; r++) {
		for (int i = 0; i < 200; i++) {
			void *volatile p = malloc(100 + i);
			free(p);
		}
		nanosleep(&ms, NULL);
	}
}

int main(void) {
	if (!disk_full) {
		fprintf(stderr, "diskfull_shim.so is not preloaded\n");
		return 1;
	}
	rounds(100);
	disk_full(1);
	rounds(50);
	struct timespec wait = {0, 60000000}; /* the drain meets the full disk */
	nanosleep(&wait, NULL);
	disk_full(0);
	rounds(100);
	puts("done");
	return 0;
}
