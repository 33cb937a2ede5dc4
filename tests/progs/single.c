/* Single-threaded C: a mix of sizes, most freed, some kept until exit. No
 * stdio (SPEC §4.1: "for a program without stdio buffers"). */
#include <stdlib.h>
#include <string.h>

static void *volatile sink;

int main(int argc, char **argv) {
	(void)argv;
	void *keep[64];
	int nkeep = 0;
	for (int i = 0; i < 1000; i++) {
		size_t n = 1 + (size_t)(i * 37) % 3000 + (size_t)argc;
		char *p = malloc(n);
		memset(p, i, n);
		sink = p;
		if (i % 17 == 0 && nkeep < 64)
			keep[nkeep++] = p; /* still in use at exit */
		else
			free(p);
	}
	char *big = malloc(1 << 20); /* above the mmap threshold */
	sink = big;
	free(big);
	sink = keep[0];
	return 0;
}
