/* Ends with _exit: no destructor and no exit handler runs, so no scan sorts
 * its blocks into leak kinds (the leaks report says N/A). */
#include <stdlib.h>
#include <unistd.h>
static void *keep;
int main(void) {
	keep = malloc(48);
	void *lost = malloc(20);
	(void)lost;
	usleep(300000); /* the capture's start is asynchronous */
	_exit(0);
}
