/* Prints the number of TLS modules in the process ("tls_modules N"): the
 * highest TLS module id. glibc sizes each new thread's DTV -- a calloc the
 * heap totals count -- by it, so the accuracy tests give valgrind's run as many
 * modules as msmemscope's (see tlspad.c). */
#define _GNU_SOURCE
#include <link.h>
#include <string.h>
#include <unistd.h>

static int max_modid(struct dl_phdr_info *info, size_t size, void *data) {
	(void)size;
	size_t *m = data;
	if (info->dlpi_tls_modid > *m) *m = info->dlpi_tls_modid;
	return 0;
}

/* Writes "tls_modules N\n" to fd 1 without stdio (no heap use). */
void print_tls_modules(void) {
	size_t n = 0;
	dl_iterate_phdr(max_modid, &n);
	char buf[32] = "tls_modules ";
	size_t len = strlen(buf);
	char tmp[20];
	int k = 0;
	do tmp[k++] = (char)('0' + n % 10); while ((n /= 10) > 0);
	while (k) buf[len++] = tmp[--k];
	buf[len++] = '\n';
	if (write(1, buf, len) != (ssize_t)len) _exit(99);
}

#ifndef TLSMODS_NO_MAIN
int main(void) {
	print_tls_modules();
	return 0;
}
#endif
