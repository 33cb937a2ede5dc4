/* A stand-in CUDA driver (built as libcuda.so.1) for the end-to-end tests:
 * no GPU, fake addresses from bump counters, nothing is ever dereferenced.
 *
 * Its entry points never call malloc/calloc/free/mmap: the profiler records
 * those and the tests count the host heap exactly. State lives in static
 * tables under one mutex (a static pthread mutex allocates nothing).
 *
 * Every entry point is a static s_NAME with the exported NAME as an alias.
 * cuGetProcAddress hands out the static addresses and the _ptsz variants call
 * the static functions, so what the stand-in returns or calls is always its
 * own code, even when a preloaded library interposes the exported names.
 *
 * STANDIN_CUDA_OOM_AT=N: the N-th device allocation call (cuMemAlloc_v2,
 * Pitch, Async, FromPool, Managed, cuMemCreate; 1-based, counting calls that
 * pass the argument checks) fails with CUDA_ERROR_OUT_OF_MEMORY. */
#include "standin_cuda.h"
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned long long u64; /* same type as CUdeviceptr */
#define ALIAS(name) extern __typeof(s_##name) name __attribute__((alias("s_" #name)))
#define BAD CUDA_ERROR_INVALID_VALUE
#define LOCK pthread_mutex_lock(&mu)
#define UNLOCK pthread_mutex_unlock(&mu)
#define PTSZ __atomic_add_fetch(&ptsz_calls, 1, __ATOMIC_SEQ_CST) /* counts a _ptsz call */
#define NDEV 2
#define TOTAL (80ULL << 30)

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
/* initial-exec: glibc puts this in the static TLS surplus even when the
 * library is dlopen'ed, so reading it never makes __tls_get_addr malloc. */
static __thread int cur_dev __attribute__((tls_model("initial-exec")));
static __thread int has_ctx __attribute__((tls_model("initial-exec"))); /* cuCtxSetCurrent made one current */
static u64 next_dev = 0x7e0000000000ULL, next_host = 0x7d0000000000ULL;
static u64 next_handle = 0x1000, next_va = 0x7c0000000000ULL;
static u64 live[NDEV]; /* live device bytes per device, for cuMemGetInfo */
static int launches, ptsz_calls, alloc_calls, oom_at;

__attribute__((constructor)) static void init_env(void) {
	const char *s = getenv("STANDIN_CUDA_OOM_AT"); /* getenv allocates nothing */
	oom_at = s ? atoi(s) : 0;
}

/* Everything the driver hands out (device and pinned blocks, VMM handles,
 * reservations, mappings) lives in one open-addressing table keyed by
 * (address or handle, kind), with backward-shift deletion (no tombstones). */
enum { DEV = 1, HOST, HANDLE, RESERVED, MAPPED };
#define NB (1 << 16)
static struct blk { u64 key, size; int dev, kind; } blks[NB];
static unsigned nblk;
static unsigned home(u64 k) { return (unsigned)((k * 0x9E3779B97F4A7C15ULL) >> 48); }
static struct blk *find(u64 k, int kind) { /* the entry, or the empty slot where it would go */
	unsigned i = home(k);
	while (blks[i].key && (blks[i].key != k || blks[i].kind != kind)) i = (i + 1) & (NB - 1);
	return &blks[i];
}
static int put(u64 k, u64 size, int dev, int kind) { /* called locked */
	if (!k || nblk >= NB / 2) return 0;
	*find(k, kind) = (struct blk){k, size, dev, kind};
	nblk++;
	if (kind == DEV || kind == HANDLE) live[dev] += size;
	return 1;
}
static void drop(struct blk *b) { /* called locked */
	unsigned i = (unsigned)(b - blks);
	if (b->kind == DEV || b->kind == HANDLE) live[b->dev] -= b->size;
	for (unsigned j = i;;) {
		j = (j + 1) & (NB - 1);
		if (!blks[j].key) break;
		unsigned h = home(blks[j].key); /* may blks[j] move back to i? */
		if ((j > i && (h <= i || h > j)) || (j < i && h <= i && h > j)) { blks[i] = blks[j]; i = j; }
	}
	blks[i].key = 0;
	nblk--;
}
/* Removes the entry (k, kind), if any (and its size is `size`, unless ~0). */
static CUresult give(u64 k, int kind, u64 size) {
	LOCK;
	struct blk *b = find(k, kind);
	int ok = k && b->key && (size == ~0ULL || b->size == size);
	if (ok) drop(b);
	UNLOCK;
	return ok ? CUDA_SUCCESS : BAD;
}
static int oom_now(void) { return oom_at > 0 && __atomic_add_fetch(&alloc_calls, 1, __ATOMIC_SEQ_CST) == oom_at; }
static u64 up(u64 n, u64 to) { return (n + to - 1) / to * to; }

/* One allocation of `size` (already rounded) of `kind` on the current device. */
static CUresult take(u64 *out, u64 size, int kind, int counted) {
	*out = 0;
	if (counted && oom_now()) return CUDA_ERROR_OUT_OF_MEMORY;
	LOCK;
	u64 *next = kind == DEV ? &next_dev : &next_host;
	if (put(*next, size, cur_dev, kind)) { *out = *next; *next += size; }
	UNLOCK;
	return *out ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult dev_alloc(CUdeviceptr *d, size_t n) { return !d || !n ? BAD : take(d, up(n, 512), DEV, 1); }

/* ---- init, devices, contexts */
static CUresult s_cuInit(unsigned int flags) { return flags ? BAD : CUDA_SUCCESS; }
static CUresult s_cuDriverGetVersion(int *v) { if (!v) return BAD; *v = 12040; return 0; }
static CUresult s_cuDeviceGet(CUdevice *d, int ord) {
	if (!d) return BAD;
	return ord < 0 || ord >= NDEV ? CUDA_ERROR_INVALID_DEVICE : (*d = ord, 0);
}
static CUresult s_cuDeviceGetCount(int *n) { if (!n) return BAD; *n = NDEV; return 0; }
static CUresult s_cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice dev) { /* context = device + 1 */
	if (!c) return BAD;
	return dev < 0 || dev >= NDEV ? CUDA_ERROR_INVALID_DEVICE : (*c = (CUcontext)(uintptr_t)(dev + 1), 0);
}
static CUresult s_cuCtxSetCurrent(CUcontext c) { /* NULL (unbind) means device 0 here */
	uintptr_t d = (uintptr_t)c;
	return d > NDEV ? CUDA_ERROR_INVALID_CONTEXT : (cur_dev = d ? (int)d - 1 : 0, has_ctx = d != 0, 0);
}
/* As the real driver: no device until the thread has a context. */
static CUresult s_cuCtxGetDevice(CUdevice *d) {
	if (!d) return BAD;
	if (!has_ctx) return CUDA_ERROR_INVALID_CONTEXT;
	*d = cur_dev;
	return 0;
}

/* ---- device, managed and pinned memory */
static CUresult s_cuMemAlloc_v2(CUdeviceptr *d, size_t n) { return dev_alloc(d, n); }
static CUresult s_cuMemAllocPitch_v2(CUdeviceptr *d, size_t *pitch, size_t w, size_t h, unsigned int elem) {
	if (!d || !pitch || !w || !h || (elem != 4 && elem != 8 && elem != 16)) return BAD;
	*pitch = up(w, 512);
	CUresult r = take(d, *pitch * h, DEV, 1);
	if (r) *pitch = 0;
	return r;
}
static CUresult s_cuMemFree_v2(CUdeviceptr d) { return d ? give(d, DEV, ~0ULL) : CUDA_SUCCESS; }
static CUresult s_cuMemAllocAsync(CUdeviceptr *d, size_t n, CUstream s) { (void)s; return dev_alloc(d, n); }
static CUresult s_cuMemAllocAsync_ptsz(CUdeviceptr *d, size_t n, CUstream s) {
	return PTSZ, s_cuMemAllocAsync(d, n, s);
}
static CUresult s_cuMemAllocFromPoolAsync(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s) {
	return (void)s, p ? dev_alloc(d, n) : BAD;
}
static CUresult s_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s) {
	return PTSZ, s_cuMemAllocFromPoolAsync(d, n, p, s);
}
static CUresult s_cuMemFreeAsync(CUdeviceptr d, CUstream s) { (void)s; return give(d, DEV, ~0ULL); }
static CUresult s_cuMemFreeAsync_ptsz(CUdeviceptr d, CUstream s) {
	return PTSZ, s_cuMemFreeAsync(d, s);
}
static CUresult s_cuMemAllocManaged(CUdeviceptr *d, size_t n, unsigned int flags) { /* ATTACH_GLOBAL/HOST */
	return flags != 1 && flags != 2 ? BAD : dev_alloc(d, n);
}
static CUresult s_cuMemHostAlloc(void **pp, size_t n, unsigned int flags) {
	(void)flags;
	if (!pp || !n) return BAD;
	u64 a;
	CUresult r = take(&a, up(n, 4096), HOST, 0);
	*pp = (void *)(uintptr_t)a;
	return r;
}
static CUresult s_cuMemAllocHost_v2(void **pp, size_t n) { return s_cuMemHostAlloc(pp, n, 0); }
static CUresult s_cuMemFreeHost(void *p) { return give((uintptr_t)p, HOST, ~0ULL); }
static CUresult s_cuMemGetInfo_v2(size_t *fr, size_t *total) {
	if (!fr || !total) return BAD;
	LOCK;
	*fr = TOTAL - live[cur_dev], *total = TOTAL;
	UNLOCK;
	return 0;
}

/* ---- virtual memory management: handles, reservations, mappings */
static CUresult s_cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
			      unsigned long long flags) {
	if (!h || !size || !prop || flags || prop->location.type != 1 || prop->location.id < 0 ||
	    prop->location.id >= NDEV)
		return BAD;
	*h = 0;
	if (oom_now()) return CUDA_ERROR_OUT_OF_MEMORY;
	LOCK;
	if (put(next_handle, size, prop->location.id, HANDLE)) { *h = next_handle; next_handle += 0x10; }
	UNLOCK;
	return *h ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult s_cuMemRelease(CUmemGenericAllocationHandle h) { return give(h, HANDLE, ~0ULL); }
static CUresult s_cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
				      unsigned long long flags) {
	(void)addr; /* the hint is ignored, as the driver may */
	if (!p || !size || flags || (align & (align - 1))) return BAD;
	*p = 0;
	LOCK;
	u64 a = up(next_va, align ? align : 2 << 20);
	if (put(a, size, 0, RESERVED)) { *p = a; next_va = a + up(size, 2 << 20); }
	UNLOCK;
	return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult s_cuMemAddressFree(CUdeviceptr p, size_t size) { return give(p, RESERVED, size); }
/* Checks the handle and its range, not that [p, p+size) lies in a reservation. */
static CUresult s_cuMemMap(CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h,
			   unsigned long long flags) {
	LOCK;
	struct blk *b = find(h, HANDLE);
	int ok = h && b->key && off + size <= b->size && p && size && !flags && !find(p, MAPPED)->key &&
		 put(p, size, 0, MAPPED);
	UNLOCK;
	return ok ? CUDA_SUCCESS : BAD;
}
/* As the driver: the range is one or more whole mappings, adjacent. */
static CUresult s_cuMemUnmap(CUdeviceptr p, size_t size) {
	u64 at = p, end = p + size;
	LOCK;
	while (at && at < end && find(at, MAPPED)->key) at += find(at, MAPPED)->size;
	int ok = p && size && at == end;
	for (at = p; ok && at < end;) {
		struct blk *b = find(at, MAPPED);
		at += b->size;
		drop(b);
	}
	UNLOCK;
	return ok ? CUDA_SUCCESS : BAD;
}

/* ---- kernels: one stable fake handle (the address of a slot) per name */
#define NF 64
static struct fn { char name[1024]; int kernel; } fns[NF];
static int nfns;
static CUresult get_fn(CUfunction *f, const void *m, const char *name, int kernel) {
	if (!f || !m || !name || strlen(name) >= sizeof fns[0].name) return BAD;
	CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
	LOCK;
	int i = 0;
	while (i < nfns && strcmp(fns[i].name, name)) i++;
	if (i < NF) {
		if (i == nfns) strcpy(fns[i].name, name), fns[i].kernel = kernel, __atomic_store_n(&nfns, i + 1, __ATOMIC_SEQ_CST);
		*f = (CUfunction)&fns[i];
		r = CUDA_SUCCESS;
	}
	UNLOCK;
	return r;
}
static CUresult s_cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) { return get_fn(f, m, name, 0); }
/* A CUkernel (what the CUDA 12 runtime launches): launched as a CUfunction,
 * named by cuKernelGetName only, as the real driver does. */
static CUresult s_cuLibraryGetKernel(CUfunction *k, CUlibrary l, const char *name) { return get_fn(k, l, name, 1); }
static struct fn *known(CUfunction f) {
	struct fn *p = (struct fn *)f;
	return p >= fns && p < fns + __atomic_load_n(&nfns, __ATOMIC_SEQ_CST) ? p : NULL;
}
static CUresult s_cuFuncGetName(const char **name, CUfunction f) {
	struct fn *p = known(f);
	return !name ? BAD : !p || p->kernel ? CUDA_ERROR_INVALID_HANDLE : (*name = p->name, 0);
}
static CUresult s_cuKernelGetName(const char **name, CUfunction k) {
	struct fn *p = known(k);
	return !name ? BAD : !p || !p->kernel ? CUDA_ERROR_INVALID_HANDLE : (*name = p->name, 0);
}
static CUresult s_cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
				 unsigned bz, unsigned shm, CUstream s, void **params, void **extra) {
	(void)shm, (void)s, (void)params, (void)extra;
	if (!known(f)) return CUDA_ERROR_INVALID_HANDLE;
	if (!gx || !gy || !gz || !bx || !by || !bz) return BAD;
	__atomic_add_fetch(&launches, 1, __ATOMIC_SEQ_CST);
	return 0;
}
static CUresult s_cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
				      unsigned by, unsigned bz, unsigned shm, CUstream s, void **params, void **extra) {
	return PTSZ, s_cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
}
static CUresult s_cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
	if (!c) return BAD;
	return s_cuLaunchKernel(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
				c->sharedMemBytes, c->hStream, params, extra);
}
static CUresult s_cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
	return PTSZ, s_cuLaunchKernelEx(c, f, params, extra);
}

/* ---- cuGetProcAddress: BASE name -> the default, _v2 or _ptsz variant */
static CUresult s_cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *st);
static CUresult s_cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags) {
	return s_cuGetProcAddress_v2(sym, pfn, ver, flags, NULL);
}
#define E(n) {#n, (void *)s_##n, 0, 0, 0}
#define V2(n, ver) {#n, 0, (void *)s_##n##_v2, ver, 0} /* no v1 here: older versions are not found */
#define PT(n) {#n, (void *)s_##n, 0, 0, (void *)s_##n##_ptsz}
static const struct pa { const char *name; void *fn, *v2; int v2ver; void *ptsz; } pas[] = {
	E(cuInit), E(cuDriverGetVersion), E(cuDeviceGet), E(cuDeviceGetCount), E(cuDevicePrimaryCtxRetain),
	E(cuCtxSetCurrent), E(cuCtxGetDevice), V2(cuMemAlloc, 3020), V2(cuMemAllocPitch, 3020), V2(cuMemFree, 3020),
	V2(cuMemAllocHost, 3020), V2(cuMemGetInfo, 3020), PT(cuMemAllocAsync), PT(cuMemAllocFromPoolAsync),
	PT(cuMemFreeAsync), E(cuMemAllocManaged), E(cuMemHostAlloc), E(cuMemFreeHost), E(cuMemCreate),
	E(cuMemRelease), E(cuMemAddressReserve), E(cuMemAddressFree), E(cuMemMap), E(cuMemUnmap),
	E(cuModuleGetFunction), E(cuFuncGetName), E(cuLibraryGetKernel), E(cuKernelGetName),
	PT(cuLaunchKernel), PT(cuLaunchKernelEx),
	{"cuGetProcAddress", (void *)s_cuGetProcAddress, (void *)s_cuGetProcAddress_v2, 12000, 0},
};
static CUresult s_cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *st) {
	if (!sym || !pfn) return BAD;
	*pfn = NULL;
	if (st) *st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	for (size_t i = 0; i < sizeof pas / sizeof pas[0]; i++) {
		const struct pa *e = &pas[i];
		if (strcmp(e->name, sym)) continue;
		void *f = e->v2 && ver >= e->v2ver ? e->v2 : e->fn;
		if (e->ptsz && (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)) f = e->ptsz;
		if (!f) {
			if (st) *st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
			return CUDA_ERROR_NOT_FOUND;
		}
		*pfn = f;
		if (st) *st = CU_GET_PROC_ADDRESS_SUCCESS;
		return CUDA_SUCCESS;
	}
	return CUDA_ERROR_NOT_FOUND;
}

static int s_standin_launches(void) { return __atomic_load_n(&launches, __ATOMIC_SEQ_CST); }
static int s_standin_ptsz_calls(void) { return __atomic_load_n(&ptsz_calls, __ATOMIC_SEQ_CST); }

ALIAS(cuInit); ALIAS(cuDriverGetVersion); ALIAS(cuDeviceGet); ALIAS(cuDeviceGetCount);
ALIAS(cuDevicePrimaryCtxRetain); ALIAS(cuCtxSetCurrent); ALIAS(cuCtxGetDevice);
ALIAS(cuMemAlloc_v2); ALIAS(cuMemAllocPitch_v2); ALIAS(cuMemFree_v2); ALIAS(cuMemAllocAsync);
ALIAS(cuMemAllocAsync_ptsz); ALIAS(cuMemAllocFromPoolAsync); ALIAS(cuMemAllocFromPoolAsync_ptsz);
ALIAS(cuMemFreeAsync); ALIAS(cuMemFreeAsync_ptsz); ALIAS(cuMemAllocManaged); ALIAS(cuMemAllocHost_v2);
ALIAS(cuMemHostAlloc); ALIAS(cuMemFreeHost); ALIAS(cuMemGetInfo_v2);
ALIAS(cuMemCreate); ALIAS(cuMemRelease); ALIAS(cuMemAddressReserve); ALIAS(cuMemAddressFree);
ALIAS(cuMemMap); ALIAS(cuMemUnmap); ALIAS(cuModuleGetFunction); ALIAS(cuFuncGetName);
ALIAS(cuLibraryGetKernel); ALIAS(cuKernelGetName);
ALIAS(cuLaunchKernel); ALIAS(cuLaunchKernel_ptsz); ALIAS(cuLaunchKernelEx); ALIAS(cuLaunchKernelEx_ptsz);
ALIAS(cuGetProcAddress); ALIAS(cuGetProcAddress_v2); ALIAS(standin_launches); ALIAS(standin_ptsz_calls);
