/* Leak kinds: a cycle nothing points to (one block definitely lost, the
 * other indirectly), a lost chain (its head definitely lost, the rest
 * indirectly), and a lost malloc(20) as the last allocation: glibc's top
 * chunk pointer (in libc's data) points into it, which is not a pointer to
 * it. */
#include <stdlib.h>
#include <string.h>
struct node { struct node *next; char pad[24]; };
int main(void) {
	struct node *a = malloc(sizeof *a), *b = malloc(sizeof *b);
	a->next = b;
	b->next = a;
	a = b = NULL;
	struct node *h = malloc(sizeof *h);
	h->next = malloc(sizeof *h);
	h->next->next = malloc(sizeof *h);
	h->next->next->next = NULL;
	h = NULL;
	char *last = malloc(20);
	memset(last, 1, 20);
	last = NULL;
	return 0;
}
