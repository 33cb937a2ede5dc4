/* Leak kinds from global roots: a static pointer, a pointer inside a global
 * struct, a thread-local pointer of the main thread, a pointer in a global
 * array; blocks they lead to through other blocks; one lost; a lost
 * malloc(20) last. */
#include <stdlib.h>
struct holder { int n; void *p; };
static void *plain;
static struct holder box;
static __thread void *tls_p;
void *table[4];
int main(void) {
	plain = malloc(10);
	box.p = malloc(200);
	((void **)box.p)[0] = malloc(30);  /* reachable through box.p */
	tls_p = malloc(40);
	table[2] = malloc(50);
	void *lost = malloc(60);            /* lost */
	(void)lost;
	char *last = malloc(20);
	last[0] = 0;
	return 0;
}
