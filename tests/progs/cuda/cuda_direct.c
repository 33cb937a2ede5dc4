/* The CUDA workload calling the driver by its exported names, linked with
 * -lcuda (build: gcc -O0 -g -Wall -o cuda_direct cuda_direct.c -L DIR -lcuda
 * -Wl,-rpath,DIR, DIR holding the stand-in libcuda.so.1 and libcuda.so).
 * This is how a program written against the driver API reaches it. */
#include "workload.h"

int main(void) {
	struct api a = {
#define SET(f, exp, base, fl) .f = exp,
		API_FUNCS(SET)
#undef SET
		.launches = standin_launches,
		.ptsz_calls = standin_ptsz_calls,
	};
	workload(&a);
	return finish(&a, 0);
}
