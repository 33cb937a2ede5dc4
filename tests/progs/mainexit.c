/* main calls pthread_exit: the process ends with status 0 when its last
 * thread does (msmemscope's own threads live on: it must not wait for them). */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
static char *g;
static void *worker(void *arg) {
	usleep(50000);
	g = malloc(111);
	return arg;
}
int main(void) {
	pthread_t t;
	pthread_create(&t, NULL, worker, NULL);
	pthread_exit(NULL);
}
