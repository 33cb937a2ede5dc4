// A plugin linked with -lcuda, dlopen'ed RTLD_LOCAL by a program that is not
// (as Python loads an extension that links the driver): the plugin's calls
// bind to msmemscope's exported driver names, and the driver it brought is
// in no scope RTLD_NEXT searches. Built twice: -DPLUGIN as the plugin.
#include <dlfcn.h>
#include <stdio.h>

#include "standin_cuda.h"

#ifdef PLUGIN
int plugin_alloc(void) {
	CUcontext c;
	CUdeviceptr d;
	if (cuInit(0) || cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c)) return 1;
	if (cuMemAlloc_v2(&d, 777777)) return 2;
	return cuMemFree_v2(d) ? 3 : 0;
}
#else
int main(int argc, char **argv) {
	if (argc < 2) return 9;
	void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		fprintf(stderr, "%s\n", dlerror());
		return 8;
	}
	int (*f)(void) = (int (*)(void))dlsym(h, "plugin_alloc");
	int r = f ? f() : 7;
	printf("plugin %d\n", r);
	return r;
}
#endif
