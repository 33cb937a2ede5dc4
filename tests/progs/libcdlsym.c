/* glibc's own names taken with dlsym from libc's handle (as
 * ctypes.CDLL("libc.so.6").__libc_free does): five blocks from malloc freed
 * with __libc_free, five from __libc_malloc freed with free. */
#include <dlfcn.h>
#include <stdlib.h>
int main(void) {
	void *h = dlopen("libc.so.6", RTLD_NOW);
	void (*lf)(void *) = (void (*)(void *))dlsym(h, "__libc_free");
	void *(*lm)(size_t) = (void *(*)(size_t))dlsym(h, "__libc_malloc");
	if (!lf || !lm) return 2;
	for (int i = 0; i < 5; i++) lf(malloc(1000 + i));
	for (int i = 0; i < 5; i++) free(lm(2000 + i));
	return 0;
}
