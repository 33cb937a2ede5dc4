/* Leak kinds: a tree whose root is held only through an interior pointer
 * (possibly lost, and so is what it reaches), a tree held at its root
 * (still reachable), a lost tree (root definitely lost, its nodes
 * indirectly), and a lost malloc(20) last. */
#include <stdlib.h>
struct tree { struct tree *l, *r; long v[4]; };
static struct tree *grow(int depth) {
	if (!depth) return NULL;
	struct tree *t = malloc(sizeof *t);
	t->l = grow(depth - 1);
	t->r = grow(depth - 1);
	t->v[0] = depth;
	return t;
}
static long *inner;      /* &root->v[1]: interior */
static struct tree *held; /* the root */
int main(void) {
	inner = &grow(3)->v[1];
	held = grow(3);
	grow(4);
	char *last = malloc(20);
	last[0] = 0;
	return 0;
}
