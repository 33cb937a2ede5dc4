/* Every HOST allocator of SPEC §4.1 except pvalloc (valgrind aborts on it),
 * and glibc's own names for them, called by name. No stdio: its buffers
 * would differ from nothing, but keep the heap ours alone. */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

static void *volatile sink;

int main(void) {
	/* realloc: from NULL, grow, shrink, grow again */
	char *r = realloc(NULL, 10);
	memset(r, 1, 10);
	r = realloc(r, 1000);
	r = realloc(r, 20);
	r = realloc(r, 70000);
	free(r);
	/* calloc */
	int *c = calloc(25, sizeof(int));
	sink = c;
	free(c);
	c = calloc(3, 333); /* kept */
	sink = c;
	/* reallocarray */
	long *ra = reallocarray(NULL, 7, sizeof(long));
	ra = reallocarray(ra, 70, sizeof(long));
	free(ra);
	ra = reallocarray(NULL, 11, 13); /* kept */
	sink = ra;
	/* posix_memalign */
	void *pm = NULL;
	if (posix_memalign(&pm, 64, 1000)) return 1;
	free(pm);
	if (posix_memalign(&pm, 4096, 123)) return 1; /* kept */
	sink = pm;
	/* aligned_alloc */
	void *aa = aligned_alloc(256, 512);
	free(aa);
	aa = aligned_alloc(32, 96); /* kept */
	sink = aa;
	/* memalign */
	void *ma = memalign(128, 300);
	free(ma);
	ma = memalign(16, 48); /* kept */
	sink = ma;
	/* valloc */
	void *va = valloc(5000);
	free(va);
	va = valloc(17); /* kept */
	sink = va;
	/* strdup goes through malloc */
	char *s = strdup("msmemscope accuracy");
	free(s);
	s = strndup("kept for the exit summary", 9);
	sink = s;
	free(NULL); /* nothing */
	/* glibc's names, mixed with the plain ones */
	void *lm = malloc(41);
	__libc_free(lm);
	lm = __libc_malloc(42);
	free(lm);
	lm = __libc_calloc(3, 43);
	lm = __libc_realloc(lm, 4400);
	__libc_free(lm);
	lm = __libc_memalign(64, 45);
	__libc_free(lm);
	lm = __libc_malloc(46); /* kept */
	sink = lm;
	return 0;
}
