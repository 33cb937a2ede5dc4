/* Blocks libc makes for the program, alive at exit: printf's stdio buffer,
 * strdup's copy, localtime's time-zone data. Their C stacks go through
 * libc's own frames, as valgrind shows them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static char *volatile keep;
int main(void) {
	printf("hello %d\n", 42);
	keep = strdup("a string kept");
	time_t t = 0;
	struct tm *volatile tm = localtime(&t);
	(void)tm;
	return 0;
}
