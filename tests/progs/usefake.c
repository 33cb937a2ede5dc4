/* Linked with fakealloc.c's allocator: malloc_usable_size is the
 * allocator's own, so the block must be its. */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
int main(void) {
	void *p = malloc(100);
	printf("usable=%zu\n", malloc_usable_size(p));
	free(p);
	return 0;
}
