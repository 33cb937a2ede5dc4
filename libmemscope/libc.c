// glibc's allocator functions (or those of an allocator that replaces it),
// found in the loaded objects' dynamic symbol tables (in memory: no loader
// call that could allocate) the first time one is needed.
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

HIDDEN ms_libc_fns ms_libc __attribute__((aligned(64))) = {boot_malloc, boot_free, boot_calloc, boot_realloc, boot_memalign, boot_valloc, boot_pvalloc};

// What the lookup found, in ms_libc's order.
static const char *const names[] = {"__libc_malloc", "__libc_free", "__libc_calloc", "__libc_realloc",
                                    "__libc_memalign", "__libc_valloc", "__libc_pvalloc"};

// What the walk found, by name: the first definition after this library
// in the loader's order (as dlsym(RTLD_NEXT) finds it: an allocator that
// replaces glibc's, jemalloc or tcmalloc, defines these names too, and the
// program's blocks are its), and libc's own, where none comes after it (a
// library loaded with dlopen comes last).
struct lookup {
	int after; // this library's object was passed
	void *next[sizeof names / sizeof names[0]], *libc[sizeof names / sizeof names[0]];
	void **into; // next or libc, for found
};

static void found(const char *name, uintptr_t addr, size_t size, void *arg) {
	(void)size;
	void **out = ((struct lookup *)arg)->into;
	for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
		if (!out[k] && !strcmp(name, names[k])) out[k] = (void *)addr;
}

static int libc_cb(struct dl_phdr_info *info, size_t sz, void *arg) {
	(void)sz;
	struct lookup *l = arg;
	if (info->dlpi_addr == (uintptr_t)__ehdr_start) { // this library
		l->after = 1;
		return 0;
	}
	const char *name = info->dlpi_name, *base = name ? strrchr(name, '/') : NULL;
	base = base ? base + 1 : name;
	int libc = base && !strncmp(base, "libc.so", 7);
	if (l->after) {
		l->into = l->next;
		dynsym_each(info, found, l);
	}
	if (libc && !l->after) { // (after this library: next has what it defines)
		l->into = l->libc;
		dynsym_each(info, found, l);
	}
	return 0;
}

static void libc_resolve(void) {
	struct lookup l = {0};
	dl_iterate_phdr(libc_cb, &l);
	void *fn[sizeof names / sizeof names[0]];
	for (size_t k = 0; k < sizeof fn / sizeof fn[0]; k++) {
		fn[k] = l.next[k] ? l.next[k] : l.libc[k];
		if (!fn[k]) {
			// No glibc to reach: nothing can be allocated at all.
			static const char msg[] = "msmemscope: glibc's __libc_malloc family not found: a glibc program is needed\n";
			ssize_t w = write(2, msg, sizeof msg - 1);
			(void)w;
			syscall(SYS_exit_group, 127);
		}
	}
	// One field at a time: another thread may call through them meanwhile
	// (each is a stub or the function, either of which does).
	atomic_store_explicit((_Atomic(void *) *)&ms_libc.malloc, fn[0], memory_order_relaxed);
	atomic_store_explicit((_Atomic(void *) *)&ms_libc.free, fn[1], memory_order_relaxed);
	atomic_store_explicit((_Atomic(void *) *)&ms_libc.calloc, fn[2], memory_order_relaxed);
	atomic_store_explicit((_Atomic(void *) *)&ms_libc.realloc, fn[3], memory_order_relaxed);
	atomic_store_explicit((_Atomic(void *) *)&ms_libc.memalign, fn[4], memory_order_relaxed);
	atomic_store_explicit((_Atomic(void *) *)&ms_libc.valloc, fn[5], memory_order_relaxed);
	atomic_store_explicit((_Atomic(void *) *)&ms_libc.pvalloc, fn[6], memory_order_relaxed);
}

// An address in the allocator's text (glibc's, or that of the library that
// replaces it), found now if not yet.
HIDDEN void *libc_text(void) {
	if (ms_libc.malloc == boot_malloc) libc_resolve();
	return (void *)ms_libc.malloc;
}
