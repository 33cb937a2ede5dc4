// A failed dlopen leaves glibc's dlerror() result allocated on the thread
// (the program's blocks: valgrind calls them still reachable). msmemscope's
// own dl calls on this thread (its fork wrapper's, its exit's) would free
// them with no FREE recorded: they must be found still reachable, and the
// malloc(24) at the end definitely lost, as valgrind says.
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
	if (!dlopen("/nonexistent/libnothing.so", RTLD_LAZY)) dlerror();
	if (fork() == 0) _exit(0);
	wait(NULL);
	void *volatile p = malloc(24);
	p = NULL;
	return 0;
}
