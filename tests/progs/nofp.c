// Built with -O2 and no frame pointers (as most programs are): the C stack of
// leaf's block is leaf < mid < top < main, as valgrind gives it, not leaf
// and then whatever the frame-pointer register held.
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) void *leaf(int n) {
	void *p = malloc(n); // LEAF
	if (!p) abort();
	return p;
}
__attribute__((noinline)) void *mid(int n) {
	void *p = leaf(n + 1); // MID
	__asm__ volatile("" ::: "memory"); // (no tail call)
	return p;
}
__attribute__((noinline)) void *top(int n) {
	void *p = mid(n + 1); // TOP
	__asm__ volatile("" ::: "memory");
	return p;
}
int main(void) {
	void *volatile p = top(4321); // MAIN
	printf("%p\n", p);
	free(p);
	return 0;
}
