// The CUDA driver API (SPEC §4.4): device, managed, VMM and pinned memory as
// HAL and HOST_PINNED MALLOC/FREE records, VMM mappings as R_VMAP/R_VUNMAP
// (cuda_vmm.c keeps their tables), kernel launches as R_KLAUNCH.
//
// A program reaches the driver three ways, and each is covered:
// - by the exported names (linked with -lcuda): ours come first, preloaded,
//   and call the next definition (RTLD_NEXT);
// - by dlsym on a libcuda handle (PyTorch's DriverAPI: cuMemCreate...):
//   dlsym is interposed (cuda_dlsym.S) and hands out a wrapper;
// - by cuGetProcAddress (the CUDA runtime, which dlopens libcuda and takes
//   every entry point from it): its wrapper replaces what the driver hands out.
// The driver is asked exactly what the program asked; msmemscope never calls
// cuInit or makes a context (that costs memory on every GPU).
//
// Every wrapped function has two slots, each holding one real function: the
// driver hands out variants (the _ptsz ones, per-thread default stream) with
// one signature, and a slot is taken by the first real function seen; a
// third variant is passed through unwrapped rather than called wrongly.
#include "internal.h"
#include "pystack.h"

#include <dlfcn.h>
#include <link.h>
#include <stdio.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;
typedef void *CUfunction;
typedef unsigned long long CUmemHandle;
typedef struct {
	int type, requestedHandleTypes;
	struct {
		int type, id;
	} location;
} CUmemAllocationPropHead; // the part of CUmemAllocationProp read here
typedef struct {
	unsigned gx, gy, gz, bx, by, bz, shared;
	CUstream stream;
} CUlaunchConfigHead; // the part of CUlaunchConfig read here

#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define NO_DEVICE UINT64_MAX

HIDDEN uint32_t cfg_cuda = UINT32_MAX; // ordinals recorded, one bit each
HIDDEN int cfg_kernel;                  // kernel launches recorded

void ms_set_cuda(uint32_t mask, int kernel) {
	cfg_cuda = mask;
	cfg_kernel = kernel;
}

// ---- the driver's own helpers, found once libcuda is loaded ----
static void *(*real_dlsym)(void *, const char *);
static int (*drv_ctx_get_device)(int *);
static int (*drv_func_get_name)(const char **, CUfunction);
static int (*drv_kernel_get_name)(const char **, CUfunction); // a CUkernel: what the runtime launches (CUDA 12)
static int (*drv_mem_get_info)(size_t *, size_t *);
static _Atomic int drv_looked;

static void *dlsym_real(void *h, const char *name) {
	if (!real_dlsym) {
		real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
		if (!real_dlsym) real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
	}
	return real_dlsym && name ? real_dlsym(h, name) : NULL;
}

// cuCtxGetDevice and cuFuncGetName of the libcuda already loaded (never
// loads it: RTLD_NOLOAD; looked for again while it is not loaded).
static void drv_lookup(void) {
	if (atomic_load_explicit(&drv_looked, memory_order_acquire)) return;
	own_up(); // what the loader allocates here is msmemscope's (no rows; the leak scan follows it)
	int found = 0;
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (!h) h = dlopen("libcuda.so", RTLD_NOW | RTLD_NOLOAD);
	if (h) {
		drv_ctx_get_device = (int (*)(int *))dlsym_real(h, "cuCtxGetDevice");
		drv_func_get_name = (int (*)(const char **, CUfunction))dlsym_real(h, "cuFuncGetName");
		drv_kernel_get_name = (int (*)(const char **, CUfunction))dlsym_real(h, "cuKernelGetName");
		drv_mem_get_info = (int (*)(size_t *, size_t *))dlsym_real(h, "cuMemGetInfo_v2");
		dlclose(h);
		found = 1;
	}
	own_down();
	if (found) atomic_store_explicit(&drv_looked, 1, memory_order_release);
}

// The calling thread's current device, or NO_DEVICE when not known.
static uint64_t cur_device(void) {
	drv_lookup();
	int d;
	if (drv_ctx_get_device && drv_ctx_get_device(&d) == 0 && d >= 0) return (uint64_t)d;
	return NO_DEVICE;
}

static int wanted(uint64_t dev) {
	if (ms_child || tls_guard || !cfg_cuda) return 0;
	if (dev != NO_DEVICE && (dev >= 32 || !(cfg_cuda >> dev & 1))) return 0;
	return ready();
}

// dev_b is a device record's b: the size, and the ordinal + 1 (0: none).
static uint64_t dev_b(uint64_t size, uint64_t dev) {
	return (size & DEV_B_SIZE) | (dev == NO_DEVICE ? 0 : (dev + 1) & 0xff) << DEV_B_DEV_SHIFT;
}

static uint16_t off_flag(void) { return atomic_load_explicit(&ms_collecting, memory_order_relaxed) ? 0 : F_OFF; }

// A device MALLOC with the program's stacks; its b holds the size, the
// device and the kind (DEV_B_*: a rotated log that repeats the record keeps
// them), an R_DEVATTR before it the stream of an async one (stream: NULL
// for the others; the default stream is 0).
static void dev_alloc(uint16_t sub, uint16_t kind, uint64_t dev, const uint64_t *stream, uint64_t p, uint64_t size, uintptr_t ra) {
	if (!wanted(dev)) return;
	guard_up();
	ms_thr *t = cur_thr();
	if (t) t->last_ra = 0; // the next fast host MALLOC names its own site again
	uint16_t fl = sub | off_flag() | (ms_tls.own ? F_OWN : 0);
	uint32_t site = site_id(ra);
	if (site == SITE_SELF) site = 0;
	if (stream) emit(R_DEVATTR, kind, stamp_after(), dev, *stream, NULL, 0);
	uint64_t ts = stamp_after();
	size = dev_b(size, dev) | (uint64_t)kind << DEV_B_KIND_SHIFT;
	if (ms_py_depth > 0)
		emit_with_stacks(fl, ts, p, size, site);
	else if (cfg_cstack > 0)
		emit_with_cstack(R_MALLOC, fl, ts, p, size, site);
	else
		emit_n(R_MALLOC, fl, ts, p, size, NULL, 0, site);
	guard_down();
}

// A failed allocation: the device's memory was exhausted (the conversion
// reports what was live on it then).
static void dev_oom(uint16_t kind, uint64_t dev, uint64_t size) {
	if (!wanted(dev)) return;
	guard_up();
	uint16_t fl = kind | off_flag();
	if (cfg_cstack > 0)
		emit_with_cstack(R_OOM, fl, stamp_after(), dev, size, 0);
	else
		emit(R_OOM, fl, stamp_after(), dev, size, NULL, 0);
	guard_down();
}
#define OOM(r, kind, dev, size) \
	if ((r) == CUDA_ERROR_OUT_OF_MEMORY) dev_oom(kind, dev, size)

// ts: taken before the driver freed the block (another thread may be
// handed its address next).
// free_stamp is a FREE's stamp, taken before the driver frees (another
// thread may get the memory next), and only when the FREE may be recorded.
static uint64_t free_stamp(void) { return wanted(NO_DEVICE) ? stamp_before() : 0; }

static void dev_free(uint16_t sub, uint64_t p, uint64_t ts) {
	if (!p || !wanted(NO_DEVICE)) return; // the block's device is the decoder's to know
	if (!ts) ts = stamp_after(); // recording began during the call
	guard_up();
	emit(R_FREE, sub | off_flag(), ts, p, 0, NULL, 0);
	guard_down();
}

// A SNAPSHOT of the calling thread's current device (cuMemGetInfo: free and
// total), at start(), each step and stop(): nothing when the program has no
// CUDA context on this thread (msmemscope never makes one).
void ms_cuda_snapshot(void) {
	// Only once a wrapper found the driver: a program without CUDA pays
	// nothing, and no dlopen runs here (Go's threads call start() and stop()).
	if (!cfg_cuda || in_child() || tls_guard || !atomic_load_explicit(&drv_looked, memory_order_acquire)) return;
	int dev;
	size_t fr, tot;
	if (!drv_ctx_get_device || !drv_mem_get_info || drv_ctx_get_device(&dev) != 0 || dev < 0 || !wanted((uint64_t)dev))
		return;
	own_up();
	int r = drv_mem_get_info(&fr, &tot);
	own_down();
	if (r != 0) return;
	char buf[160];
	int n = snprintf(buf, sizeof buf, "device:%d,free:%zu,total:%zu,used:%zu", dev, fr, tot, tot - fr);
	guard_up();
	emit(R_SNAPSHOT, F_TEXT, stamp_after(), 0, (uint64_t)n, buf, (uint32_t)n);
	guard_down();
}

// ---- what each wrapped function does around the driver's call ----
typedef CUresult (*fn_alloc)(CUdeviceptr *, size_t);
typedef CUresult (*fn_pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
typedef CUresult (*fn_free)(CUdeviceptr);
typedef CUresult (*fn_alloc_async)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*fn_alloc_pool)(CUdeviceptr *, size_t, void *, CUstream);
typedef CUresult (*fn_free_async)(CUdeviceptr, CUstream);
typedef CUresult (*fn_managed)(CUdeviceptr *, size_t, unsigned);
typedef CUresult (*fn_host)(void **, size_t);
typedef CUresult (*fn_host_alloc)(void **, size_t, unsigned);
typedef CUresult (*fn_free_host)(void *);
typedef CUresult (*fn_create)(CUmemHandle *, size_t, const CUmemAllocationPropHead *, unsigned long long);
typedef CUresult (*fn_release)(CUmemHandle);
typedef CUresult (*fn_map)(CUdeviceptr, size_t, size_t, CUmemHandle, unsigned long long);
typedef CUresult (*fn_unmap)(CUdeviceptr, size_t);
typedef CUresult (*fn_launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                              void **, void **);
typedef CUresult (*fn_launch_ex)(const CUlaunchConfigHead *, CUfunction, void **, void **);

#define NOT_LOADED(f) \
	if (!(f)) return CUDA_ERROR_NOT_INITIALIZED

static CUresult do_alloc(fn_alloc f, uintptr_t ra, CUdeviceptr *dp, size_t n) {
	NOT_LOADED(f);
	CUresult r = f(dp, n);
	if (r == 0 && dp) dev_alloc(F_HAL, DEV_DEVICE, cur_device(), NULL, *dp, n, ra);
	OOM(r, DEV_DEVICE, cur_device(), n);
	return r;
}
static CUresult do_pitch(fn_pitch f, uintptr_t ra, CUdeviceptr *dp, size_t *pitch, size_t w, size_t h, unsigned e) {
	NOT_LOADED(f);
	CUresult r = f(dp, pitch, w, h, e);
	if (r == 0 && dp && pitch) dev_alloc(F_HAL, DEV_DEVICE, cur_device(), NULL, *dp, *pitch * h, ra);
	OOM(r, DEV_DEVICE, cur_device(), w * h);
	return r;
}
static CUresult do_free(fn_free f, uintptr_t ra, CUdeviceptr p) {
	(void)ra;
	NOT_LOADED(f);
	uint64_t ts = free_stamp();
	CUresult r = f(p);
	if (r == 0) dev_free(F_HAL, p, ts);
	return r;
}
static CUresult do_alloc_async(fn_alloc_async f, uintptr_t ra, CUdeviceptr *dp, size_t n, CUstream s) {
	NOT_LOADED(f);
	CUresult r = f(dp, n, s);
	if (r == 0 && dp) dev_alloc(F_HAL, DEV_DEVICE, cur_device(), &(uint64_t){(uintptr_t)s}, *dp, n, ra);
	OOM(r, DEV_DEVICE, cur_device(), n);
	return r;
}
static CUresult do_alloc_pool(fn_alloc_pool f, uintptr_t ra, CUdeviceptr *dp, size_t n, void *pool, CUstream s) {
	NOT_LOADED(f);
	CUresult r = f(dp, n, pool, s);
	if (r == 0 && dp) dev_alloc(F_HAL, DEV_DEVICE, cur_device(), &(uint64_t){(uintptr_t)s}, *dp, n, ra);
	OOM(r, DEV_DEVICE, cur_device(), n);
	return r;
}
static CUresult do_free_async(fn_free_async f, uintptr_t ra, CUdeviceptr p, CUstream s) {
	(void)ra;
	NOT_LOADED(f);
	uint64_t ts = free_stamp();
	CUresult r = f(p, s);
	if (r == 0) dev_free(F_HAL, p, ts);
	return r;
}
static CUresult do_managed(fn_managed f, uintptr_t ra, CUdeviceptr *dp, size_t n, unsigned fl) {
	NOT_LOADED(f);
	CUresult r = f(dp, n, fl);
	if (r == 0 && dp) dev_alloc(F_HAL, DEV_MANAGED, cur_device(), NULL, *dp, n, ra);
	OOM(r, DEV_MANAGED, cur_device(), n);
	return r;
}
static CUresult do_host(fn_host f, uintptr_t ra, void **pp, size_t n) {
	NOT_LOADED(f);
	CUresult r = f(pp, n);
	if (r == 0 && pp) dev_alloc(F_PINNED, DEV_PINNED, NO_DEVICE, NULL, (uint64_t)(uintptr_t)*pp, n, ra);
	return r;
}
static CUresult do_host_alloc(fn_host_alloc f, uintptr_t ra, void **pp, size_t n, unsigned fl) {
	NOT_LOADED(f);
	CUresult r = f(pp, n, fl);
	if (r == 0 && pp) dev_alloc(F_PINNED, DEV_PINNED, NO_DEVICE, NULL, (uint64_t)(uintptr_t)*pp, n, ra);
	return r;
}
static CUresult do_free_host(fn_free_host f, uintptr_t ra, void *p) {
	(void)ra;
	NOT_LOADED(f);
	uint64_t ts = free_stamp();
	CUresult r = f(p);
	if (r == 0) dev_free(F_PINNED, (uint64_t)(uintptr_t)p, ts);
	return r;
}
// The handle and mapping tables (cuda_vmm.c) serve the MAP/UNMAP rows only:
// left alone where no CUDA is recorded. Handles of a device --device leaves
// out are kept (their maps are named by them).
static int vmm_tracked(void) { return cfg_cuda && !ms_child; }

static CUresult do_create(fn_create f, uintptr_t ra, CUmemHandle *h, size_t n, const CUmemAllocationPropHead *prop,
                          unsigned long long fl) {
	NOT_LOADED(f);
	CUresult r = f(h, n, prop, fl);
	// location.type 1: a device, location.id its ordinal
	uint64_t dev = prop && prop->location.type == 1 && prop->location.id >= 0 ? (uint64_t)prop->location.id : NO_DEVICE;
	if (r == 0 && h) {
		if (vmm_tracked()) vmm_handle_put(*h, dev); // its maps' device, recorded or not (--device)
		dev_alloc(F_VMM, DEV_VMM, dev, NULL, *h, n, ra);
	}
	OOM(r, DEV_VMM, dev, n);
	return r;
}
static CUresult do_release(fn_release f, uintptr_t ra, CUmemHandle h) {
	(void)ra;
	NOT_LOADED(f);
	uint64_t ts = free_stamp();
	CUresult r = f(h);
	if (r == 0) {
		if (vmm_tracked()) vmm_handle_drop(h);
		dev_free(F_VMM, h, ts);
	}
	return r;
}

// A mapping of VMM memory (no bytes of its own: the handle's MALLOC has
// them): b holds the size and the device as a device MALLOC's does;
// payload: n units.
static void vmm_record(uint16_t kind, uint64_t dev, uint64_t ts, uint64_t va, uint64_t size, const uint64_t *pl,
                       uint32_t n) {
	if (!wanted(dev)) return;
	guard_up();
	uint64_t b = dev_b(size, dev);
	emit(kind, off_flag(), ts, va, b, pl, n * 8);
	guard_down();
}
static CUresult do_map(fn_map f, uintptr_t ra, CUdeviceptr p, size_t size, size_t off, CUmemHandle h,
                       unsigned long long fl) {
	(void)ra;
	NOT_LOADED(f);
	CUresult r = f(p, size, off, h, fl);
	if (r == 0 && vmm_tracked()) {
		uint64_t dev;
		if (!vmm_handle_dev(h, &dev)) dev = cur_device(); // made before msmemscope was there, or imported
		vmm_map_put(p, size, h, dev);
		uint64_t pl[2] = {off, h};
		vmm_record(R_VMAP, dev, stamp_after(), p, size, pl, 2);
	}
	return r;
}
static CUresult do_unmap(fn_unmap f, uintptr_t ra, CUdeviceptr p, size_t size) {
	(void)ra;
	NOT_LOADED(f);
	uint64_t ts = vmm_tracked() ? stamp_before() : 0; // the range may be mapped again by another thread next
	CUresult r = f(p, size);
	if (r == 0 && ts) {
		uint64_t h, dev;
		if (!vmm_map_take(p, size, &h, &dev)) dev = cur_device();
		vmm_record(R_VUNMAP, dev, ts, p, size, &h, h ? 1 : 0);
	}
	return r;
}

// A kernel launch: "device\tname\tgrid\tblock" (the name as the driver has
// it, mangled; the conversion demangles).
static void launch_record(CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                          CUstream s) {
	if (!cfg_kernel) return;
	uint64_t dev = cur_device();
	if (!wanted(dev)) return;
	guard_up();
	// The runtime (CUDA 12 on) launches CUkernel handles of its libraries
	// through cuLaunchKernel: cuFuncGetName refuses those.
	const char *name = NULL;
	if ((!drv_func_get_name || drv_func_get_name(&name, fn) != 0 || !name) &&
	    (!drv_kernel_get_name || drv_kernel_get_name(&name, fn) != 0 || !name))
		name = "N/A";
	char buf[1024];
	// a name past 900 bytes is cut, never the fields after it
	int n = snprintf(buf, sizeof buf, "%lld\t%.900s\t%u,%u,%u\t%u,%u,%u", dev == NO_DEVICE ? -1ll : (long long)dev, name, gx,
	                 gy, gz, bx, by, bz);
	if (n < 0) n = 0;
	if (n >= (int)sizeof buf) n = sizeof buf - 1;
	emit(R_KLAUNCH, F_TEXT | off_flag(), stamp_after(), (uint64_t)(uintptr_t)s, (uint64_t)n, buf, (uint32_t)n);
	guard_down();
}
static CUresult do_launch(fn_launch f, uintptr_t ra, CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                          unsigned by, unsigned bz, unsigned sh, CUstream s, void **params, void **extra) {
	(void)ra;
	NOT_LOADED(f);
	CUresult r = f(fn, gx, gy, gz, bx, by, bz, sh, s, params, extra);
	if (r == 0) launch_record(fn, gx, gy, gz, bx, by, bz, s);
	return r;
}
static CUresult do_launch_ex(fn_launch_ex f, uintptr_t ra, const CUlaunchConfigHead *c, CUfunction fn, void **params,
                             void **extra) {
	(void)ra;
	NOT_LOADED(f);
	CUresult r = f(c, fn, params, extra);
	if (r == 0 && c) launch_record(fn, c->gx, c->gy, c->gz, c->bx, c->by, c->bz, c->stream);
	return r;
}

// ---- the entry points: two slots per function, and the exported names ----
#define RA ((uintptr_t)__builtin_return_address(0))
#define SLOTS(ID, T, DO, PARAMS, ARGS)                                                                        \
	static void *_Atomic ID##_real[2];                                                                  \
	static CUresult ID##_0 PARAMS { return DO((T)atomic_load_explicit(&ID##_real[0], memory_order_acquire), RA, ARGS); } \
	static CUresult ID##_1 PARAMS { return DO((T)atomic_load_explicit(&ID##_real[1], memory_order_acquire), RA, ARGS); }
// An exported name: the next definition of the same name (libcuda's).
#define EXPORT(NAME, T, DO, PARAMS, ARGS)                                                                   \
	CUresult NAME PARAMS {                                                                              \
		static void *_Atomic next;                                                                  \
		return DO((T)next_of(&next, #NAME), RA, ARGS);                                              \
	}

// A libcuda loaded as a dependency of an object dlopen'ed RTLD_LOCAL (a
// Python extension linked with -lcuda) is not in RTLD_NEXT's scope, while
// the extension's calls bind to these names: then its own handle is asked.
// Nothing found is not remembered (the driver may be loaded later).
static void *next_of(void *_Atomic *slot, const char *name) {
	void *f = atomic_load_explicit(slot, memory_order_acquire);
	if (!f) {
		own_up();
		f = dlsym_real(RTLD_NEXT, name);
		if (!f) {
			void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
			if (h) {
				f = dlsym_real(h, name);
				dlclose(h);
			}
		}
		own_down();
		if (f && in_self((uintptr_t)f)) f = NULL; // never ourselves
		if (f) atomic_store_explicit(slot, f, memory_order_release);
	}
	return f;
}

#define P_ALLOC (CUdeviceptr * dp, size_t n)
#define A_ALLOC dp, n
#define P_PITCH (CUdeviceptr * dp, size_t * pitch, size_t w, size_t h, unsigned e)
#define A_PITCH dp, pitch, w, h, e
#define P_FREE (CUdeviceptr p)
#define A_FREE p
#define P_AASYNC (CUdeviceptr * dp, size_t n, CUstream s)
#define A_AASYNC dp, n, s
#define P_APOOL (CUdeviceptr * dp, size_t n, void *pool, CUstream s)
#define A_APOOL dp, n, pool, s
#define P_FASYNC (CUdeviceptr p, CUstream s)
#define A_FASYNC p, s
#define P_MANAGED (CUdeviceptr * dp, size_t n, unsigned fl)
#define A_MANAGED dp, n, fl
#define P_HOST (void **pp, size_t n)
#define A_HOST pp, n
#define P_HOSTALLOC (void **pp, size_t n, unsigned fl)
#define A_HOSTALLOC pp, n, fl
#define P_FREEHOST (void *p)
#define A_FREEHOST p
#define P_CREATE (CUmemHandle * h, size_t n, const CUmemAllocationPropHead *prop, unsigned long long fl)
#define A_CREATE h, n, prop, fl
#define P_RELEASE (CUmemHandle h)
#define A_RELEASE h
#define P_MAP (CUdeviceptr p, size_t size, size_t off, CUmemHandle h, unsigned long long fl)
#define A_MAP p, size, off, h, fl
#define P_UNMAP (CUdeviceptr p, size_t size)
#define A_UNMAP p, size
#define P_LAUNCH                                                                                                    \
	(CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sh, CUstream s, \
	 void **params, void **extra)
#define A_LAUNCH fn, gx, gy, gz, bx, by, bz, sh, s, params, extra
#define P_LAUNCHEX (const CUlaunchConfigHead *c, CUfunction fn, void **params, void **extra)
#define A_LAUNCHEX c, fn, params, extra

SLOTS(w_alloc, fn_alloc, do_alloc, P_ALLOC, A_ALLOC)
SLOTS(w_pitch, fn_pitch, do_pitch, P_PITCH, A_PITCH)
SLOTS(w_free, fn_free, do_free, P_FREE, A_FREE)
SLOTS(w_aasync, fn_alloc_async, do_alloc_async, P_AASYNC, A_AASYNC)
SLOTS(w_apool, fn_alloc_pool, do_alloc_pool, P_APOOL, A_APOOL)
SLOTS(w_fasync, fn_free_async, do_free_async, P_FASYNC, A_FASYNC)
SLOTS(w_managed, fn_managed, do_managed, P_MANAGED, A_MANAGED)
SLOTS(w_host, fn_host, do_host, P_HOST, A_HOST)
SLOTS(w_hostalloc, fn_host_alloc, do_host_alloc, P_HOSTALLOC, A_HOSTALLOC)
SLOTS(w_freehost, fn_free_host, do_free_host, P_FREEHOST, A_FREEHOST)
SLOTS(w_create, fn_create, do_create, P_CREATE, A_CREATE)
SLOTS(w_release, fn_release, do_release, P_RELEASE, A_RELEASE)
SLOTS(w_map, fn_map, do_map, P_MAP, A_MAP)
SLOTS(w_unmap, fn_unmap, do_unmap, P_UNMAP, A_UNMAP)
SLOTS(w_launch, fn_launch, do_launch, P_LAUNCH, A_LAUNCH)
SLOTS(w_launchex, fn_launch_ex, do_launch_ex, P_LAUNCHEX, A_LAUNCHEX)

EXPORT(cuMemAlloc_v2, fn_alloc, do_alloc, P_ALLOC, A_ALLOC)
EXPORT(cuMemAllocPitch_v2, fn_pitch, do_pitch, P_PITCH, A_PITCH)
EXPORT(cuMemFree_v2, fn_free, do_free, P_FREE, A_FREE)
EXPORT(cuMemAllocAsync, fn_alloc_async, do_alloc_async, P_AASYNC, A_AASYNC)
EXPORT(cuMemAllocAsync_ptsz, fn_alloc_async, do_alloc_async, P_AASYNC, A_AASYNC)
EXPORT(cuMemAllocFromPoolAsync, fn_alloc_pool, do_alloc_pool, P_APOOL, A_APOOL)
EXPORT(cuMemAllocFromPoolAsync_ptsz, fn_alloc_pool, do_alloc_pool, P_APOOL, A_APOOL)
EXPORT(cuMemFreeAsync, fn_free_async, do_free_async, P_FASYNC, A_FASYNC)
EXPORT(cuMemFreeAsync_ptsz, fn_free_async, do_free_async, P_FASYNC, A_FASYNC)
EXPORT(cuMemAllocManaged, fn_managed, do_managed, P_MANAGED, A_MANAGED)
EXPORT(cuMemAllocHost_v2, fn_host, do_host, P_HOST, A_HOST)
EXPORT(cuMemHostAlloc, fn_host_alloc, do_host_alloc, P_HOSTALLOC, A_HOSTALLOC)
EXPORT(cuMemFreeHost, fn_free_host, do_free_host, P_FREEHOST, A_FREEHOST)
EXPORT(cuMemCreate, fn_create, do_create, P_CREATE, A_CREATE)
EXPORT(cuMemRelease, fn_release, do_release, P_RELEASE, A_RELEASE)
EXPORT(cuMemMap, fn_map, do_map, P_MAP, A_MAP)
EXPORT(cuMemUnmap, fn_unmap, do_unmap, P_UNMAP, A_UNMAP)
EXPORT(cuLaunchKernel, fn_launch, do_launch, P_LAUNCH, A_LAUNCH)
EXPORT(cuLaunchKernel_ptsz, fn_launch, do_launch, P_LAUNCH, A_LAUNCH)
EXPORT(cuLaunchKernelEx, fn_launch_ex, do_launch_ex, P_LAUNCHEX, A_LAUNCHEX)
EXPORT(cuLaunchKernelEx_ptsz, fn_launch_ex, do_launch_ex, P_LAUNCHEX, A_LAUNCHEX)

// ---- cuGetProcAddress: what the driver hands out, wrapped ----
typedef CUresult (*fn_gpa)(const char *, void **, int, unsigned long long);
typedef CUresult (*fn_gpa2)(const char *, void **, int, unsigned long long, int *);
static CUresult do_gpa(fn_gpa f, uintptr_t ra, const char *sym, void **pfn, int ver, unsigned long long fl);
static CUresult do_gpa2(fn_gpa2 f, uintptr_t ra, const char *sym, void **pfn, int ver, unsigned long long fl, int *st);
#define P_GPA (const char *sym, void **pfn, int ver, unsigned long long fl)
#define A_GPA sym, pfn, ver, fl
#define P_GPA2 (const char *sym, void **pfn, int ver, unsigned long long fl, int *st)
#define A_GPA2 sym, pfn, ver, fl, st
SLOTS(w_gpa, fn_gpa, do_gpa, P_GPA, A_GPA)
SLOTS(w_gpa2, fn_gpa2, do_gpa2, P_GPA2, A_GPA2)
EXPORT(cuGetProcAddress, fn_gpa, do_gpa, P_GPA, A_GPA)
EXPORT(cuGetProcAddress_v2, fn_gpa2, do_gpa2, P_GPA2, A_GPA2)

// A wrapped function: the driver's base name (what cuGetProcAddress is
// asked), the exported names dlsym may be asked, its slots.
typedef struct {
	const char *base;
	const char *names[2];
	void *wrap[2];
	void *_Atomic *real;
} entry;
#define E(BASE, N1, N2, ID) {BASE, {N1, N2}, {(void *)ID##_0, (void *)ID##_1}, ID##_real}
static const entry entries[] = {
    E("cuMemAlloc", "cuMemAlloc_v2", NULL, w_alloc),
    E("cuMemAllocPitch", "cuMemAllocPitch_v2", NULL, w_pitch),
    E("cuMemFree", "cuMemFree_v2", NULL, w_free),
    E("cuMemAllocAsync", "cuMemAllocAsync", "cuMemAllocAsync_ptsz", w_aasync),
    E("cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz", w_apool),
    E("cuMemFreeAsync", "cuMemFreeAsync", "cuMemFreeAsync_ptsz", w_fasync),
    E("cuMemAllocManaged", "cuMemAllocManaged", NULL, w_managed),
    E("cuMemAllocHost", "cuMemAllocHost_v2", NULL, w_host),
    E("cuMemHostAlloc", "cuMemHostAlloc", NULL, w_hostalloc),
    E("cuMemFreeHost", "cuMemFreeHost", NULL, w_freehost),
    E("cuMemCreate", "cuMemCreate", NULL, w_create),
    E("cuMemRelease", "cuMemRelease", NULL, w_release),
    E("cuMemMap", "cuMemMap", NULL, w_map),
    E("cuMemUnmap", "cuMemUnmap", NULL, w_unmap),
    E("cuLaunchKernel", "cuLaunchKernel", "cuLaunchKernel_ptsz", w_launch),
    E("cuLaunchKernelEx", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz", w_launchex),
    E(NULL, "cuGetProcAddress", NULL, w_gpa), // asked by its base name: version-dependent, see do_gpa
    E(NULL, "cuGetProcAddress_v2", NULL, w_gpa2),
};
#define N_ENTRIES (sizeof entries / sizeof entries[0])

// The wrapper standing for the driver's function f: the slot f already has,
// or the first free one; f itself when both hold other variants.
static void *wrap_real(const entry *e, void *f) {
	if (!f || in_self((uintptr_t)f)) return f; // ours already (an exported name found first)
	for (int i = 0; i < 2; i++) {
		void *cur = NULL;
		if (atomic_compare_exchange_strong(&e->real[i], &cur, f) || cur == f) return e->wrap[i];
	}
	return f;
}

static const entry *by_base(const char *sym) {
	for (size_t i = 0; i < N_ENTRIES; i++)
		if (entries[i].base && !strcmp(entries[i].base, sym)) return &entries[i];
	return NULL;
}

static const entry *by_name(const char *name) {
	for (size_t i = 0; i < N_ENTRIES; i++)
		for (int j = 0; j < 2; j++)
			if (entries[i].names[j] && !strcmp(entries[i].names[j], name)) return &entries[i];
	return NULL;
}

// What cuGetProcAddress handed out: base names of versions whose signature
// is the one wrapped (3.2 gave cuMemAlloc its 64-bit _v2), and
// cuGetProcAddress itself (from 12.0 on, the five-argument _v2).
static void wrap_proc(const char *sym, void **pfn, int ver) {
	if (!sym || !pfn || !*pfn || ver < 3020) return;
	const entry *e = by_base(sym);
	if (!e && !strcmp(sym, "cuGetProcAddress")) e = by_name(ver >= 12000 ? "cuGetProcAddress_v2" : "cuGetProcAddress");
	if (e) *pfn = wrap_real(e, *pfn);
}

static CUresult do_gpa(fn_gpa f, uintptr_t ra, const char *sym, void **pfn, int ver, unsigned long long fl) {
	(void)ra;
	NOT_LOADED(f);
	CUresult r = f(sym, pfn, ver, fl);
	if (r == 0) wrap_proc(sym, pfn, ver);
	return r;
}
static CUresult do_gpa2(fn_gpa2 f, uintptr_t ra, const char *sym, void **pfn, int ver, unsigned long long fl, int *st) {
	(void)ra;
	NOT_LOADED(f);
	CUresult r = f(sym, pfn, ver, fl, st);
	if (r == 0) wrap_proc(sym, pfn, ver);
	return r;
}

// ---- dlsym ----
// dlsym is replaced by a stub (below) that asks ms_dlsym_pick for a wrapper
// and otherwise jumps to the real dlsym with the stack as it found it, so
// that RTLD_NEXT still means "after the caller" (glibc reads the caller's
// return address).
HIDDEN void *ms_dlsym_next;
static void *_Atomic cuda_handle; // the last libcuda handle seen

static int is_libcuda(void *h) {
	if (h == atomic_load_explicit(&cuda_handle, memory_order_relaxed)) return 1;
	struct link_map *lm = NULL;
	if (dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0 || !lm || !lm->l_name) return 0;
	const char *b = strrchr(lm->l_name, '/');
	b = b ? b + 1 : lm->l_name;
	if (strncmp(b, "libcuda.so", 10)) return 0;
	atomic_store_explicit(&cuda_handle, h, memory_order_relaxed);
	return 1;
}

// The allocator functions msmemscope interposes. A program that asks libc's
// own handle for one (Python's ctypes.CDLL("libc.so.6").malloc) gets this
// library's, as it does by name: else its blocks would go unrecorded.
static const char *const alloc_names[] = {"malloc", "free", "calloc", "realloc", "reallocarray", "posix_memalign",
                                          "aligned_alloc", "memalign", "valloc", "pvalloc", "mmap", "mmap64", "munmap",
                                          "__libc_malloc", "__libc_free", "__libc_calloc", "__libc_realloc",
                                          "__libc_memalign", "__libc_valloc", "__libc_pvalloc"};

static __thread int picking __attribute__((tls_model("initial-exec"))); // ms_interposed asks dlsym itself, once

static void *alloc_pick(void *h, const char *name) {
	size_t i = 0, n = sizeof alloc_names / sizeof alloc_names[0];
	while (i < n && strcmp(name, alloc_names[i])) i++;
	if (i == n || picking) return NULL;
	picking = 1;
	void *f = NULL;
	if (ms_interposed()) {
		f = dlsym_real(h, name);
		// Only libc's: another allocator's (a handle to jemalloc) is its own.
		f = f && f == dlsym_real(RTLD_NEXT, name) ? dlsym_real(RTLD_DEFAULT, name) : NULL;
	}
	picking = 0;
	return f;
}

HIDDEN void *ms_dlsym_pick(void *h, const char *name) {
	if (!ms_dlsym_next) {
		own_up();
		dlsym_real(NULL, NULL); // finds glibc's dlsym: the stub jumps to it
		own_down();
		ms_dlsym_next = (void *)real_dlsym;
	}
	if (!name || h == RTLD_DEFAULT || h == RTLD_NEXT) return NULL;
	if (name[0] != 'c' || name[1] != 'u') return alloc_pick(h, name);
	const entry *e = by_name(name);
	if (!e || !is_libcuda(h)) return NULL;
	return wrap_real(e, dlsym_real(h, name));
}

__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, @function\n"
        "dlsym:\n"
        "\t.cfi_startproc\n"
        "\tendbr64\n"
        "\tpush %rdi\n"
        "\t.cfi_adjust_cfa_offset 8\n"
        "\tpush %rsi\n"
        "\t.cfi_adjust_cfa_offset 8\n"
        "\tsub $8, %rsp\n" // the call below with a 16-byte aligned stack
        "\t.cfi_adjust_cfa_offset 8\n"
        "\tcall ms_dlsym_pick\n"
        "\tadd $8, %rsp\n"
        "\t.cfi_adjust_cfa_offset -8\n"
        "\tpop %rsi\n"
        "\t.cfi_adjust_cfa_offset -8\n"
        "\tpop %rdi\n"
        "\t.cfi_adjust_cfa_offset -8\n"
        "\ttest %rax, %rax\n"
        "\tjz 1f\n"
        "\tret\n"
        "1:\tjmp *ms_dlsym_next(%rip)\n"
        "\t.cfi_endproc\n"
        ".size dlsym, .-dlsym\n");
