/* Four mstx "step start" ranges; step k allocates and frees 10000+k bytes,
 * step 3 also keeps 20003 bytes until exit. 9000 bytes are allocated before the
 * first step, 9999 after the last, and a mark sits inside step 1. */
#include <stdlib.h>
#include <mstx/ms_tools_ext.h>

static void *volatile sink;

int main(void) {
	char *before = malloc(9000);
	sink = before;
	free(before);
	for (int k = 1; k <= 4; k++) {
		uint64_t id = mstxRangeStartA("step start", NULL);
		if (k == 1) mstxMarkA("inside step 1", NULL);
		char *p = malloc(10000 + (size_t)k);
		sink = p;
		free(p);
		if (k == 3) sink = malloc(20003); /* kept until exit */
		mstxRangeEnd(id);
	}
	char *after = malloc(9999);
	sink = after;
	free(after);
	return 0;
}
