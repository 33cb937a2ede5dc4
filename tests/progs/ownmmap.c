/* The program's anonymous mapping is an MMAP block; one made from inside
 * libmemscope (the Go runtime maps its memory through cgo's x_cgo_mmap, at
 * times on a program thread calling the C API) is msmemscope's own and is
 * never recorded. No stdio: the only events are these. */
#include <dlfcn.h>
#include <stdint.h>
#include <sys/mman.h>

typedef uintptr_t (*cgo_mmap_fn)(void *, uintptr_t, int32_t, int32_t, int32_t, uint32_t);
typedef void (*cgo_munmap_fn)(void *, uintptr_t);

int main(void) {
	void *a = mmap(0, 1 << 18, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (a == MAP_FAILED) return 2;
	munmap(a, 1 << 18);
	cgo_mmap_fn own = (cgo_mmap_fn)dlsym(RTLD_DEFAULT, "x_cgo_mmap");
	cgo_munmap_fn own_un = (cgo_munmap_fn)dlsym(RTLD_DEFAULT, "x_cgo_munmap");
	if (!own || !own_un) return 3;
	uintptr_t b = own(0, 3 << 18, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (b < 4096) return 4; /* an errno */
	own_un((void *)b, 3 << 18);
	return 0;
}
