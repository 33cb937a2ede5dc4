/* The CUDA driver workload shared by cuda_direct.c, cuda_procaddr.c and
 * cuda_dlsym.c: the same calls, reached three ways (a struct of function
 * pointers filled differently), so the tests share one set of totals.
 *
 * Expected totals (run under the profiler against the stand-in driver):
 *   device-kind MALLOCs on device 0: 1,000,000 (d1) + 4,096 (d2) + 10,240
 *     (pitch: 1,000 wide -> pitch 1,024, x 10 rows) + 2,000,000 (async)
 *     + 300,000 (pool async) = 3,314,336 B in 5 blocks
 *   managed: 65,536 B in 1 block (device 0)
 *   device 1: 8,192 B in 1 block (d3)
 *   pinned host: 1,048,576 (h1) + 4,096 (h2) = 1,052,672 B in 2 blocks
 *   vmm (cuMemCreate): 2,097,152 B on device 0 (g1) and 2,097,152 B on
 *     device 1 (g2), 2 handles
 *   VMM mappings (no bytes of their own), on their handle's device, in a
 *     4 MiB reservation va (the stand-in's first: 0x7c0000000000), handles
 *     g1 0x1000 and g2 0x1010 (the stand-in's first two), device 0 current:
 *     MAP va 2 MiB offset 0 of g1; MAP va+2 MiB 1 MiB offset 0 of g2; MAP
 *     va+3 MiB 1 MiB offset 1 MiB of g2; UNMAP va+2 MiB 2 MiB (both of
 *     g2's at once); one map and one unmap the driver refuses (no rows)
 *   FREEs: d2, async, h2, g2, d1 (5)
 *   alive at exit: device kind on device 0: pitch 10,240 + pool 300,000 =
 *     310,240 B; managed 65,536; device 1: 8,192; pinned 1,048,576;
 *     vmm 2,097,152 (g1 on device 0, still mapped)
 *   launches: 5 = 3 of scale<4>(float*, int) (_Z5scaleILi4EEvPfi)
 *     + 2 of add(float const*, float const*, float*, int) (_Z3addPKfS0_Pfi)
 *   _ptsz entry points reached: 8 through cuGetProcAddress with the
 *     per-thread flag (alloc async, pool async, free async, 4 launches,
 *     1 launchEx); 0 for the other two programs.
 *
 * Output goes through write(2), never stdio, so that the programs make no
 * host heap blocks of their own (a stdio buffer would be one). */
#ifndef WORKLOAD_H
#define WORKLOAD_H
#include "standin_cuda.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* X(field, exported name, base name for cuGetProcAddress, flags) */
#define PTDS CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
#define API_FUNCS(X)                                                      \
	X(Init, cuInit, cuInit, 0)                                        \
	X(PrimaryCtxRetain, cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 0) \
	X(CtxSetCurrent, cuCtxSetCurrent, cuCtxSetCurrent, 0)             \
	X(MemAlloc, cuMemAlloc_v2, cuMemAlloc, 0)                         \
	X(MemAllocPitch, cuMemAllocPitch_v2, cuMemAllocPitch, 0)          \
	X(MemFree, cuMemFree_v2, cuMemFree, 0)                            \
	X(MemAllocManaged, cuMemAllocManaged, cuMemAllocManaged, 0)       \
	X(MemAllocAsync, cuMemAllocAsync, cuMemAllocAsync, PTDS)          \
	X(MemAllocFromPoolAsync, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, PTDS) \
	X(MemFreeAsync, cuMemFreeAsync, cuMemFreeAsync, PTDS)             \
	X(MemAllocHost, cuMemAllocHost_v2, cuMemAllocHost, 0)             \
	X(MemHostAlloc, cuMemHostAlloc, cuMemHostAlloc, 0)                \
	X(MemFreeHost, cuMemFreeHost, cuMemFreeHost, 0)                   \
	X(MemCreate, cuMemCreate, cuMemCreate, 0)                         \
	X(MemRelease, cuMemRelease, cuMemRelease, 0)                      \
	X(MemAddressReserve, cuMemAddressReserve, cuMemAddressReserve, 0) \
	X(MemMap, cuMemMap, cuMemMap, 0)                                  \
	X(MemUnmap, cuMemUnmap, cuMemUnmap, 0)                            \
	X(ModuleGetFunction, cuModuleGetFunction, cuModuleGetFunction, 0) \
	X(LibraryGetKernel, cuLibraryGetKernel, cuLibraryGetKernel, 0)    \
	X(LaunchKernel, cuLaunchKernel, cuLaunchKernel, PTDS)             \
	X(LaunchKernelEx, cuLaunchKernelEx, cuLaunchKernelEx, PTDS)

struct api {
#define FIELD(f, exp, base, fl) __typeof(exp) *f;
	API_FUNCS(FIELD)
#undef FIELD
	int (*launches)(void);   /* standin_launches */
	int (*ptsz_calls)(void); /* standin_ptsz_calls */
};

static void say(const char *s) {
	size_t n = strlen(s);
	if (write(1, s, n) != (ssize_t)n) _exit(3);
}
static void say_num(const char *label, long v) { /* "label v\n" without stdio */
	char buf[32], *p = buf + sizeof buf;
	unsigned long u = v < 0 ? -(unsigned long)v : (unsigned long)v;
	*--p = 0, *--p = '\n';
	do *--p = (char)('0' + u % 10); while (u /= 10);
	if (v < 0) *--p = '-';
	say(label), say(" "), say(p);
}
static void fail(const char *what, long code) { say_num(what, code); exit(1); }
#define CK(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) fail(#call " failed:", r_); } while (0)

static void workload(const struct api *a) {
	CUcontext c0, c1;
	CUdeviceptr d1, d2, dp, dm, da, dpool, d3, va;
	size_t pitch;
	void *h1, *h2;
	CUmemGenericAllocationHandle g1, g2;
	CUfunction k1, k2;
	CUstream s = (CUstream)0x1234;

	/* 1. init, device 0 current */
	CK(a->Init(0));
	CK(a->PrimaryCtxRetain(&c0, 0));
	CK(a->CtxSetCurrent(c0));
	/* 2. device 0: plain, pitched, managed, async and pool-async blocks */
	CK(a->MemAlloc(&d1, 1000000));
	CK(a->MemAlloc(&d2, 4096));
	CK(a->MemAllocPitch(&dp, &pitch, 1000, 10, 4));
	if (pitch != 1024) fail("pitch", (long)pitch);
	CK(a->MemAllocManaged(&dm, 65536, 1 /* CU_MEM_ATTACH_GLOBAL */));
	CK(a->MemAllocAsync(&da, 2000000, s));
	CK(a->MemAllocFromPoolAsync(&dpool, 300000, (CUmemoryPool)0x99, s));
	/* 3. two frees */
	CK(a->MemFree(d2));
	CK(a->MemFreeAsync(da, s));
	/* 4. one block on device 1, then back to device 0 */
	CK(a->PrimaryCtxRetain(&c1, 1));
	CK(a->CtxSetCurrent(c1));
	CK(a->MemAlloc(&d3, 8192));
	CK(a->CtxSetCurrent(c0));
	/* 5. pinned host memory */
	CK(a->MemAllocHost(&h1, 1048576));
	CK(a->MemHostAlloc(&h2, 4096, 0));
	CK(a->MemFreeHost(h2));
	/* 6. VMM: two 2 MiB handles mapped into a 4 MiB reservation, g2 in two
	 * halves; g2 unmapped (one call for both) and released, g1 left mapped */
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof prop);
	prop.type = 1; /* CU_MEM_ALLOCATION_TYPE_PINNED */
	prop.location.type = 1; /* CU_MEM_LOCATION_TYPE_DEVICE */
	prop.location.id = 0;
	CK(a->MemCreate(&g1, 2097152, &prop, 0));
	prop.location.id = 1; /* g2 on device 1, mapped while device 0 is current */
	CK(a->MemCreate(&g2, 2097152, &prop, 0));
	CK(a->MemAddressReserve(&va, 4194304, 0, 0, 0));
	/* refused (past the handle's end; not a mapping's start): no rows */
	if (a->MemMap(va, 2097152, 1048576, g1, 0) == CUDA_SUCCESS) fail("a map past the handle's end:", 0);
	CK(a->MemMap(va, 2097152, 0, g1, 0));
	if (a->MemUnmap(va + 1048576, 1048576) == CUDA_SUCCESS) fail("an unmap inside a mapping:", 0);
	CK(a->MemMap(va + 2097152, 1048576, 0, g2, 0));
	CK(a->MemMap(va + 3145728, 1048576, 1048576, g2, 0));
	CK(a->MemUnmap(va + 2097152, 2097152));
	CK(a->MemRelease(g2));
	/* 7. kernels: 3 + 1 launches and one cuLaunchKernelEx */
	CK(a->ModuleGetFunction(&k1, (CUmodule)1, "_Z5scaleILi4EEvPfi"));
	CK(a->LibraryGetKernel(&k2, (CUlibrary)1, "_Z3addPKfS0_Pfi")); /* a CUkernel, as the runtime's */
	for (int i = 0; i < 3; i++) CK(a->LaunchKernel(k1, 2, 1, 1, 128, 1, 1, 0, s, NULL, NULL));
	CK(a->LaunchKernel(k2, 10, 2, 1, 256, 1, 1, 0, NULL, NULL, NULL));
	CUlaunchConfig cfg = {4, 4, 1, 32, 8, 1, 0, s, NULL, 0};
	CK(a->LaunchKernelEx(&cfg, k2, NULL, NULL));
	/* 8. free d1; the rest stays alive at exit */
	CK(a->MemFree(d1));
}

/* Prints "launches N", "ptsz N" and "ok"; exits 1 if a count is off. */
static int finish(const struct api *a, int want_ptsz) {
	int n = a->launches(), p = a->ptsz_calls();
	say_num("launches", n);
	say_num("ptsz", p);
	if (n != 5 || p != want_ptsz) fail("unexpected counts; want launches 5, ptsz", want_ptsz);
	say("ok\n");
	return 0;
}
#endif
