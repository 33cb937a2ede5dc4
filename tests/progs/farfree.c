// FREEs far from the thread's last address (a mapped 1 MiB block, then a
// small heap block), so that they are written as whole compact records,
// not as pair halves: with stacks wanted, none may carry a stack's flag.
#include <stdlib.h>

void *volatile big, *volatile small;

int main(void) {
	for (int i = 0; i < 50; i++) {
		big = malloc(1 << 20);
		small = malloc(32);
		free(big);
		free(small);
	}
	return 0;
}
