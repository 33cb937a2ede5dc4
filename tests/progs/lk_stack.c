/* Leak kinds from stack roots: exit() called from a nested function, while
 * its frame and its caller's hold blocks (still reachable); a malloc(0)
 * held; a lost malloc(20) last, just before exit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static void finish(char **held) {
	char *local = malloc(33);
	strcpy(local, "local");
	printf("%s %s\n", held[0], local);
	char *last = malloc(20);
	last[0] = 0;
	last = NULL;
	exit(0);
}
int main(void) {
	char *held[2];
	held[0] = malloc(64);
	strcpy(held[0], "held");
	held[1] = malloc(0);
	finish(held);
}
