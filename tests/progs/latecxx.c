// Loads a C++ library (argv[1]) after start-up, as Python loads torch, and
// has it allocate with new: that block's site and C stack are the C++
// caller's (operator new is the allocator's entry point), though libstdc++
// came after msmemscope's start. Prints the live report while it lives.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "msmemscope.h"

int main(int argc, char **argv) {
	if (argc < 2) return 2;
	void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		fprintf(stderr, "%s\n", dlerror());
		return 1;
	}
	void *(*make)(void) = (void *(*)(void))dlsym(h, "make_object");
	void (*drop)(void *) = (void (*)(void *))dlsym(h, "drop_object");
	void *o = make(); // MAIN_CALL
	char *rep = msmemscope_get_mem_report();
	printf("%s\n", rep ? rep : "null");
	free(rep);
	drop(o);
	return 0;
}
