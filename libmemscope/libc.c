// glibc's allocator functions, found in libc's dynamic symbol table (in
// memory: no loader call that could allocate) the first time one is needed.
// msmemscope exports __libc_malloc and its family (hooks.c): a program that
// calls them by name is recorded as one that calls malloc, and blocks it
// frees with __libc_free are not left live.
#include "internal.h"

#include <link.h>

static void libc_resolve(void);

static void *boot_malloc(size_t n) {
	libc_resolve();
	return ms_libc.malloc(n);
}
static void boot_free(void *p) {
	libc_resolve();
	ms_libc.free(p);
}
static void *boot_calloc(size_t n, size_t m) {
	libc_resolve();
	return ms_libc.calloc(n, m);
}
static void *boot_realloc(void *p, size_t n) {
	libc_resolve();
	return ms_libc.realloc(p, n);
}
static void *boot_memalign(size_t a, size_t n) {
	libc_resolve();
	return ms_libc.memalign(a, n);
}
static void *boot_valloc(size_t n) {
	libc_resolve();
	return ms_libc.valloc(n);
}
static void *boot_pvalloc(size_t n) {
	libc_resolve();
	return ms_libc.pvalloc(n);
}

HIDDEN ms_libc_fns ms_libc = {boot_malloc, boot_free, boot_calloc, boot_realloc, boot_memalign, boot_valloc, boot_pvalloc};

// What the lookup found, in ms_libc's order.
static const char *const names[] = {"__libc_malloc", "__libc_free", "__libc_calloc", "__libc_realloc",
                                    "__libc_memalign", "__libc_valloc", "__libc_pvalloc"};

static void found(const char *name, uintptr_t addr, size_t size, void *arg) {
	(void)size;
	void **out = arg;
	for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
		if (!out[k] && !strcmp(name, names[k])) out[k] = (void *)addr;
}

static int libc_cb(struct dl_phdr_info *info, size_t sz, void *arg) {
	(void)sz;
	const char *name = info->dlpi_name, *base = name ? strrchr(name, '/') : NULL;
	base = base ? base + 1 : name;
	if (!base || strncmp(base, "libc.so", 7)) return 0;
	dynsym_each(info, found, arg);
	return 1;
}

static void libc_resolve(void) {
	void *fn[sizeof names / sizeof names[0]] = {0};
	dl_iterate_phdr(libc_cb, fn);
	for (size_t k = 0; k < sizeof fn / sizeof fn[0]; k++)
		if (!fn[k]) {
			// No glibc to reach: nothing can be allocated at all.
			static const char msg[] = "msmemscope: glibc's __libc_malloc family not found: a glibc program is needed\n";
			ssize_t w = write(2, msg, sizeof msg - 1);
			(void)w;
			syscall(SYS_exit_group, 127);
		}
	ms_libc_fns f;
	memcpy(&f, fn, sizeof f);
	// (Two threads may both get here: they find the same.)
	ms_libc = f;
}

// An address in glibc's text (its allocator's), found now if not yet.
HIDDEN void *libc_text(void) {
	if (ms_libc.malloc == boot_malloc) libc_resolve();
	return (void *)ms_libc.malloc;
}
