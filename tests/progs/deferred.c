/* --collect-mode=deferred with the C API: nothing is collected before the
 * first msmemscope_start(); blocks allocated while stopped and freed while
 * started appear as shadow MALLOCs just before their FREE; blocks allocated
 * while started and freed while stopped keep their FREE row (else they
 * would read as alive at exit). */
#include <stdlib.h>
#include <msmemscope.h>

static void *volatile sink;

int main(void) {
	char *a = malloc(30001); /* before start: not collected */
	sink = a;
	if (msmemscope_start()) return 1;
	char *b = malloc(30002);
	sink = b;
	free(b);
	free(a); /* shadow MALLOC 30001, then FREE */
	if (msmemscope_stop()) return 1;
	char *c = malloc(30003); /* while stopped */
	sink = c;
	char *d = malloc(30004); /* allocated and freed while stopped: never seen */
	sink = d;
	free(d);
	if (msmemscope_start()) return 1;
	free(c); /* shadow MALLOC 30003, then FREE */
	char *e = malloc(30005); /* kept */
	sink = e;
	char *g = malloc(30007); /* freed after stop: its FREE row still comes */
	sink = g;
	if (msmemscope_stop()) return 1;
	free(g);
	char *f = malloc(30006); /* stopped, kept: never seen */
	sink = f;
	return 0;
}
