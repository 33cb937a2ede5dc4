/* Test shim, preloaded before libmemscope.so: a disk that fills and frees
 * again while the program runs. The program (diskfull.c) switches it with
 * disk_full(1) and disk_full(0). While full, the first write to a file named
 * spool.bin is cut short (half of it goes out, as the kernel does when the
 * disk fills in the middle of a write) and the next ones fail with ENOSPC. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

static _Atomic int full, cut_done;

void disk_full(int on) {
	atomic_store(&full, on);
}

static int is_spool(int fd) {
	char p[64], l[4096];
	snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
	ssize_t n = readlink(p, l, sizeof l - 1);
	return n >= 9 && memcmp(l + n - 9, "spool.bin", 9) == 0;
}

/* The bytes of want that may go out: want, fewer, or -1 (ENOSPC). */
static long allowed(int fd, size_t want) {
	if (!atomic_load(&full) || !is_spool(fd)) return (long)want;
	if (want > 16 && !atomic_exchange(&cut_done, 1)) return (long)(want / 2);
	errno = ENOSPC;
	return -1;
}

ssize_t write(int fd, const void *b, size_t n) {
	static ssize_t (*real)(int, const void *, size_t);
	if (!real) real = (ssize_t (*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
	long ok = allowed(fd, n);
	return ok < 0 ? -1 : real(fd, b, (size_t)ok);
}

ssize_t writev(int fd, const struct iovec *iov, int cnt) {
	static ssize_t (*real)(int, const struct iovec *, int);
	if (!real) real = (ssize_t (*)(int, const struct iovec *, int))dlsym(RTLD_NEXT, "writev");
	size_t want = 0;
	for (int i = 0; i < cnt; i++) want += iov[i].iov_len;
	long ok = allowed(fd, want);
	if (ok < 0) return -1;
	if ((size_t)ok == want) return real(fd, iov, cnt);
	struct iovec cut[1024];
	int k = 0;
	size_t left = (size_t)ok;
	for (int i = 0; i < cnt && i < 1024 && left; i++) {
		cut[k] = iov[i];
		if (cut[k].iov_len > left) cut[k].iov_len = left;
		left -= cut[k++].iov_len;
	}
	return real(fd, cut, k);
}
