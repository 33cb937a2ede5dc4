/* Leak kinds through other blocks: a block reached only from a reachable
 * block (still reachable), one reached only through an interior pointer
 * stored in a lost block (indirectly lost), a pointer hidden by XOR (its
 * block definitely lost, as for valgrind), a block referenced only at an
 * odd offset (not an aligned word: lost), and a lost malloc(20) last. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
static void **root;
static uintptr_t hidden;
static char odd[17];
int main(void) {
	root = malloc(4 * sizeof(void *));
	root[0] = malloc(70);                         /* through a block */
	root[1] = NULL;
	void **box = malloc(2 * sizeof(void *));      /* lost */
	box[0] = (char *)malloc(80) + 8;              /* reached from a lost block */
	box[1] = NULL;
	box = NULL;
	hidden = (uintptr_t)malloc(90) ^ 0x5555;
	void *p = malloc(100);
	memcpy(odd + 1, &p, sizeof p);               /* unaligned: not a root */
	p = NULL;
	char *last = malloc(20);
	last[0] = 0;
	return 0;
}
