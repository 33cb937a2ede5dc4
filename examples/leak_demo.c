/* A training-loop-shaped C program with a planted leak, for `make demo`.
 * Each iteration is an mstx "step start" range. Every step allocates and
 * frees a work buffer; from step 2 on, remember_batch() keeps a copy of the
 * batch that nothing ever frees: the leak msmemscope should name. */
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <mstx/ms_tools_ext.h>

struct node { struct node *next; char data[1000]; };
static struct node *history;

static __attribute__((noinline)) void remember_batch(const char *batch) {
	struct node *n = malloc(sizeof *n); /* leaks: history is never freed */
	memcpy(n->data, batch, sizeof n->data);
	n->next = history;
	history = n;
}

static __attribute__((noinline)) void train_step(int step) {
	char *batch = malloc(4096);
	memset(batch, step, 4096);
	float *grad = calloc(256, sizeof(float));
	if (step >= 2) remember_batch(batch);
	free(grad);
	free(batch);
}

int main(void) {
	for (int step = 1; step <= 5; step++) {
		uint64_t id = mstxRangeStartA("step start", NULL);
		train_step(step);
		mstxRangeEnd(id);
	}
	printf("trained 5 steps\n");
	return 0;
}
