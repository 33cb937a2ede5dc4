// Built with frame pointers, but for work(), which keeps none and leaves
// rbp as its caller set it: a frame-pointer walk from use() would go from
// work straight to main, top lost. The stack is use < work < top < main.
// apply() keeps none either and holds a small number in rbp across its call
// of cb(): the walk from cb found no frame to go on from (rbp 3) and ended
// there. The stack is cb < apply < top2 < main.
#include <stdio.h>
#include <stdlib.h>

void *volatile keep[8];

__attribute__((noinline)) void use(long *p, long i) {
	p[0] = 1;
	keep[i] = malloc(4000 + i); // USE
}

__attribute__((noinline, optimize("omit-frame-pointer"))) void *work(long n) {
	long buf[4];
	use(buf, n); // WORK
	use(buf, n + 1);
	return (void *)(buf[0] + n);
}

__attribute__((noinline)) void *top(long n) {
	void *r = work(n); // TOP
	__asm__ volatile("" ::: "memory"); // (no tail call)
	return r;
}

__attribute__((noinline)) void cb(long i) {
	keep[i] = malloc(4100 + i); // CB
}

__attribute__((noinline, optimize("omit-frame-pointer"))) long apply(void (*f)(long), long n) {
	register long counter __asm__("rbp") = 3;
	__asm__ volatile("" : "+r"(counter));
	f(n); // APPLY
	__asm__ volatile("" : "+r"(counter));
	return counter;
}

__attribute__((noinline)) long top2(long n) {
	long r = apply(cb, n); // T2
	__asm__ volatile("" ::: "memory");
	return r;
}

int main(void) {
	top(1); // MAIN
	top2(3); // M2
	for (int i = 0; i < 8; i++) free(keep[i]);
	return 0;
}
