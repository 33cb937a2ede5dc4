// Steps in a CUDA program (the C API's msmemscope_step, an mstx "step start"
// range) and the device
// SNAPSHOT rows they bring: cuMemGetInfo's free and total of the current
// device. The program prints what the driver says after each step, for the
// test to compare. Linked with -lmemscope and the stand-in driver.
#include <msmemscope.h>
#include <stdio.h>

#include "standin_cuda.h"

static void used(void) {
	size_t fr, tot;
	if (cuMemGetInfo_v2(&fr, &tot) == 0) printf("used %zu total %zu\n", tot - fr, tot);
}

int main(void) {
	CUcontext c;
	CUdeviceptr a, b;
	msmemscope_step(); // before any context: no SNAPSHOT (msmemscope never makes one)
	if (cuInit(0) || cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c)) return 1;
	if (cuMemAlloc_v2(&a, 1000000)) return 1;
	msmemscope_step();
	used();
	if (cuMemAlloc_v2(&b, 2000000)) return 1;
	msmemscope_step();
	used();
	cuMemFree_v2(a);
	uint64_t s = mstxRangeStartA("step start", NULL); // an mstx (or NVTX) step brings one too
	used();
	mstxRangeEnd(s);
	mstxRangeEnd(mstxRangeStartA("forward", NULL)); // another range: none
	cuMemFree_v2(b);
	return 0;
}
