/* The CUDA workload reaching the driver with dlopen("libcuda.so.1") and
 * dlsym of the versioned exported names (cuMemAlloc_v2, cuMemCreate, ...),
 * the way PyTorch's DriverAPI does. Not linked with -lcuda; the test puts the
 * stand-in's folder in LD_LIBRARY_PATH. Build: gcc -O0 -g -Wall -o cuda_dlsym
 * cuda_dlsym.c -ldl */
#include "workload.h"
#include <dlfcn.h>

static void *need(void *h, const char *name) {
	void *p = dlsym(h, name);
	if (!p) say("dlsym "), say(name), say(" failed\n"), exit(1);
	return p;
}

int main(void) {
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h) say("dlopen libcuda.so.1 failed\n"), exit(1);
	struct api a;
#define SET(f, exp, base, fl) a.f = (__typeof(a.f))need(h, #exp);
	API_FUNCS(SET)
#undef SET
	a.launches = (int (*)(void))need(h, "standin_launches");
	a.ptsz_calls = (int (*)(void))need(h, "standin_ptsz_calls");
	workload(&a);
	return finish(&a, 0);
}
