// A program built without PIE that calls malloc through a table holding
// malloc's address, as CPython's allocator does (Debian's and Ubuntu's
// /usr/bin/python3 are built so): the program then owns malloc's canonical
// address, its PLT entry, which jumps to the preloaded one; every call must
// still be recorded once. 300 allocations, 200 frees, 100 blocks of 100 B
// left. (TestSystemPythonNotPIE covers what Python adds to this.)
#include <stdlib.h>

struct allocator {
	void *(*alloc)(size_t);
	void (*release)(void *);
};
static struct allocator raw;

int main(void) {
	// Taken in code (an absolute address in a non-PIE text), the addresses
	// are the program's PLT entries: its canonical malloc and free.
	raw.alloc = malloc;
	raw.release = free;
	void *keep[100], *tmp[200];
	for (int i = 0; i < 200; i++) tmp[i] = raw.alloc(16 + i);
	for (int i = 0; i < 100; i++) keep[i] = raw.alloc(100);
	for (int i = 0; i < 200; i++) raw.release(tmp[i]);
	return keep[0] == NULL;
}
