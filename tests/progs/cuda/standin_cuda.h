/* Types and prototypes of the slice of the CUDA 12 driver API that the
 * stand-in driver (standin_cuda.c) exports and the test programs call. No
 * NVIDIA header is used: the layouts below match CUDA 12's cuda.h. */
#ifndef STANDIN_CUDA_H
#define STANDIN_CUDA_H
#include <stddef.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUfunc_st *CUfunction;
typedef struct CUlib_st *CUlibrary;
typedef struct CUmod_st *CUmodule;
typedef struct CUmemPool_st *CUmemoryPool;
typedef unsigned long long CUmemGenericAllocationHandle;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_FOUND 500

/* CUdriverProcAddress_flags: cuda.h has LEGACY_STREAM = 1 << 0 and
 * PER_THREAD_DEFAULT_STREAM = 1 << 1. */
#define CU_GET_PROC_ADDRESS_DEFAULT 0
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM 1
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2
/* CUdriverProcAddressQueryResult */
#define CU_GET_PROC_ADDRESS_SUCCESS 0
#define CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND 1
#define CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT 2

typedef struct {
	int type; /* 1 = CU_MEM_ALLOCATION_TYPE_PINNED */
	int requestedHandleTypes;
	struct { int type; int id; } location; /* type 1 = device, id = ordinal */
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} CUmemAllocationProp;

typedef struct {
	unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
	CUstream hStream;
	void *attrs;
	unsigned numAttrs;
} CUlaunchConfig;

CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int *v);
CUresult cuDeviceGet(CUdevice *d, int ordinal);
CUresult cuDeviceGetCount(int *n);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxGetDevice(CUdevice *dev);

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes);
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t widthBytes, size_t height, unsigned int elementSize);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream s);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream s);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags);
CUresult cuMemAllocHost_v2(void **pp, size_t bytes);
CUresult cuMemHostAlloc(void **pp, size_t bytes, unsigned int flags);
CUresult cuMemFreeHost(void *p);
CUresult cuMemGetInfo_v2(size_t *free, size_t *total);

CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop, unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle h);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);

CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name);
CUresult cuFuncGetName(const char **name, CUfunction f);
CUresult cuLibraryGetKernel(CUfunction *k, CUlibrary l, const char *name); /* a CUkernel, as a CUfunction */
CUresult cuKernelGetName(const char **name, CUfunction k);
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
			unsigned sharedMem, CUstream s, void **params, void **extra);
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
			     unsigned sharedMem, CUstream s, void **params, void **extra);
CUresult cuLaunchKernelEx(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra);

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, unsigned long long flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, unsigned long long flags, int *symbolStatus);

/* Stand-in only: how many kernel launches, and how many calls reached a
 * _ptsz entry point (checks that a wrapper forwards to the right variant). */
int standin_launches(void);
int standin_ptsz_calls(void);

#endif
