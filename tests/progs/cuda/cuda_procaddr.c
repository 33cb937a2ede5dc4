/* The CUDA workload reaching the driver the way the CUDA runtime does:
 * dlopen("libcuda.so.1"), dlsym("cuGetProcAddress_v2"), then every entry
 * point through it by BASE name (cuMemAlloc, not cuMemAlloc_v2) with
 * cudaVersion 12000. Launches and the async calls are asked for with
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, so they are the _ptsz
 * variants (the stand-in counts 8 such calls). Not linked with -lcuda; the
 * test puts the stand-in's folder in LD_LIBRARY_PATH. Build: gcc -O0 -g -Wall
 * -o cuda_procaddr cuda_procaddr.c -ldl */
#include "workload.h"
#include <dlfcn.h>

static __typeof(cuGetProcAddress_v2) *gpa;

static void *lookup(const char *base, unsigned long long flags) {
	void *p = NULL;
	int st = -1;
	CUresult r = gpa(base, &p, 12000, flags, &st);
	if (r != CUDA_SUCCESS || !p || st != CU_GET_PROC_ADDRESS_SUCCESS)
		say("cuGetProcAddress_v2 "), say(base), fail(" failed:", r);
	return p;
}

int main(void) {
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h) say("dlopen libcuda.so.1 failed\n"), exit(1);
	gpa = (__typeof(gpa))dlsym(h, "cuGetProcAddress_v2");
	if (!gpa) say("dlsym cuGetProcAddress_v2 failed\n"), exit(1);
	struct api a;
#define SET(f, exp, base, fl) a.f = (__typeof(a.f))lookup(#base, fl);
	API_FUNCS(SET)
#undef SET
	/* an unknown name: NULL, CUDA_ERROR_NOT_FOUND, status "not found" */
	void *p = &a;
	int st = -1;
	CUresult r = gpa("cuNoSuchFunction", &p, 12000, 0, &st);
	if (r != CUDA_ERROR_NOT_FOUND || p || st != CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)
		fail("cuGetProcAddress_v2 of an unknown name returned", r);
	a.launches = (int (*)(void))dlsym(h, "standin_launches");
	a.ptsz_calls = (int (*)(void))dlsym(h, "standin_ptsz_calls");
	if (!a.launches || !a.ptsz_calls) say("dlsym standin_* failed\n"), exit(1);
	workload(&a);
	return finish(&a, 8);
}
