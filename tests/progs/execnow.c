/* An image that execs in its first milliseconds, before msmemscope's engine
 * has opened its spool: a block of 111 bytes and ten pairs of 16, then
 * itself again ("second"), which allocates 321 bytes and returns. */
#include <stdlib.h>
#include <unistd.h>

static void *volatile sink;

int main(int argc, char **argv) {
	if (argc > 1) {
		sink = malloc(321);
		return 0;
	}
	sink = malloc(111);
	for (int i = 0; i < 10; i++) {
		void *volatile p = malloc(16);
		free(p);
	}
	execl(argv[0], argv[0], "second", (char *)NULL);
	return 1;
}
