// Lost cycles whose later block reuses the chunk of a block freed before:
// natively it lies below the first, where valgrind's allocator (which
// reuses freed memory late) puts it above. valgrind makes the lowest block
// of a lost cycle definitely lost and the rest indirectly; msmemscope leads
// with the block allocated first, so the two agree.
#include <stdlib.h>

struct node {
	struct node *next;
	char pad[40];
};

int main(void) {
	for (int i = 0; i < 3; i++) {
		void *volatile t = malloc(72 + 8 * i);
		free(t);
		struct node *a = malloc(sizeof *a);           // 48 bytes
		struct node *b = malloc(72 + 8 * (size_t)i); // the freed chunk again
		a->next = b;
		b->next = a;
		a = b = NULL;
	}
	return 0;
}
