/* Rotate mode's memory with a large live set (make bench, issue 18): N
 * blocks of 32 bytes kept live, then 5 M malloc/free pairs beside them,
 * then all freed. */
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
	long n = argc > 1 ? atol(argv[1]) : 1000000;
	void **kept = malloc(n * sizeof(void *));
	for (long i = 0; i < n; i++) kept[i] = malloc(32);
	for (long i = 0; i < 5000000; i++) {
		void *volatile p = malloc(64);
		free(p);
	}
	for (long i = 0; i < n; i++) free(kept[i]);
	free(kept);
	return 0;
}
