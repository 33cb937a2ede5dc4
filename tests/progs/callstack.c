/* --call-stack=c:N on a program built with -g: the innermost frame of the
 * 4321-byte block is make_block at the malloc line (the test finds it by
 * its comment), then middle and main at their call lines. */
#include <stdlib.h>

static void *volatile sink;

static __attribute__((noinline)) void *make_block(size_t n) {
	return malloc(n); /* ALLOC_SITE */
}

static __attribute__((noinline)) void *middle(size_t n) {
	return make_block(n); /* MIDDLE_SITE */
}

int main(void) {
	sink = middle(4321); /* MAIN_SITE */
	free(sink);
	return 0;
}
