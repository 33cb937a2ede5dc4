/* main calls pthread_exit: the process ends with status 0 when its last
 * thread does (msmemscope's own threads live on: it must not wait for them),
 * after glibc ran main's cleanup handler and thread-specific destructor,
 * which free the blocks of 789 and 123 bytes (msmemscope called exit before
 * them). With an argument, main has no thread left to wait for. */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>
static char *g;
static pthread_key_t key;
static void *worker(void *arg) {
	usleep(50000);
	g = malloc(111);
	return arg;
}
int main(int argc, char **argv) {
	(void)argv;
	pthread_key_create(&key, free);
	pthread_setspecific(key, malloc(123));
	void *c = malloc(789);
	pthread_cleanup_push(free, c);
	if (argc < 2) {
		pthread_t t;
		pthread_create(&t, NULL, worker, NULL);
	}
	pthread_exit(NULL);
	pthread_cleanup_pop(0);
}
