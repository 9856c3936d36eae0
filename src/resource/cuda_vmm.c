/*
 * cuda_vmm.c - the cuda-vmm resource: device memory through the driver's
 * virtual memory API, so address space and physical memory are separate.
 *
 *  - map: cuMemAddressReserve of the whole size (address space only); then,
 *    unless LLMEM_MAP_UNCOMMITTED, commit of all of it.
 *  - commit: for every granularity chunk of the range, cuMemCreate (pinned
 *    device memory on the resource's device) and cuMemMap, then one
 *    cuMemSetAccess (read/write from the device) for the range. A failure
 *    part-way unmaps and releases what this call made: all or nothing.
 *  - decommit: cuMemUnmap and cuMemRelease chunk by chunk; the addresses
 *    stay reserved, so a later commit brings memory back at the same place.
 *  - unmap: release the committed chunks, then cuMemAddressFree.
 *  - copy: cudaMemcpy with cudaMemcpyDefault, as the other CUDA resources.
 *
 * One handle per chunk (the recommended granularity, 2 MiB on current
 * GPUs) is what lets any chunk-aligned sub-range be decommitted: the driver
 * unmaps whole physical allocations only. A pool over this resource with
 * reserve_bytes grows in place (pool.h): its blocks stay in one reserved
 * range while physical memory follows demand, the idea behind PyTorch's
 * expandable segments and vAttention.
 *
 * The driver functions are looked up at create with the runtime's
 * cudaGetDriverEntryPoint(ByVersion): linking libcuda would make libllmem
 * need libcuda.so.1, which only a driver installs (see CMakeLists.txt).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "llmem/cuda_resource.h"
#include "llmem/resource_impl.h"

#if defined(LLMEM_HAVE_CUDA) && LLMEM_HAVE_CUDA

#include <cuda.h>
#include <cuda_runtime_api.h>

typedef CUresult (*fn_granularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
typedef CUresult (*fn_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*fn_addr_free)(CUdeviceptr, size_t);
typedef CUresult (*fn_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*fn_release)(CUmemGenericAllocationHandle);
typedef CUresult (*fn_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*fn_unmap)(CUdeviceptr, size_t);
typedef CUresult (*fn_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*fn_error_string)(CUresult, const char **);

typedef struct driver {
    fn_granularity granularity;
    fn_reserve reserve;
    fn_addr_free addr_free;
    fn_create create;
    fn_release release;
    fn_map map;
    fn_unmap unmap;
    fn_access access;
    fn_error_string error_string;
} driver;

typedef struct vmm_map {
    uintptr_t base;
    size_t size;
    CUmemGenericAllocationHandle *chunk; /* one per granularity chunk; 0 = not committed */
} vmm_map;

typedef struct vmm_resource {
    llmem_resource base;
    driver d;
    int device;
    size_t gran;
    CUmemAllocationProp prop;
    CUmemAccessDesc access;
    pthread_mutex_t lock; /* guards maps */
    vmm_map *maps;
    size_t count, cap;
} vmm_resource;

static llmem_status drv_fail(const vmm_resource *v, CUresult e, const char *call)
{
    const char *text = NULL;
    if (!v->d.error_string || v->d.error_string(e, &text) != CUDA_SUCCESS || !text) text = "unknown error";
    llmem_status st = e == CUDA_ERROR_OUT_OF_MEMORY ? LLMEM_ENOMEM : LLMEM_EDEVICE;
    return llmem_error_set(st, "%s: %s failed: %s (CUresult %d)", v->base.info.name, call, text, (int)e);
}

static llmem_status rt_fail(const char *who, cudaError_t e, const char *call)
{
    (void)cudaGetLastError();
    return llmem_error_set(e == cudaErrorMemoryAllocation ? LLMEM_ENOMEM : LLMEM_EDEVICE, "%s: %s failed: %s (%s)",
                           who, call, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* The map holding [p, p+n), or NULL. Lock held. */
static vmm_map *find(vmm_resource *v, uintptr_t p, size_t n)
{
    for (size_t i = 0; i < v->count; i++)
        if (p >= v->maps[i].base && p - v->maps[i].base <= v->maps[i].size && n <= v->maps[i].size - (p - v->maps[i].base))
            return &v->maps[i];
    return NULL;
}

/* Unmap and release chunks [c0, c1) of m that are committed. */
static void release_chunks(vmm_resource *v, vmm_map *m, size_t c0, size_t c1)
{
    for (size_t c = c0; c < c1; c++) {
        if (!m->chunk[c]) continue;
        (void)v->d.unmap((CUdeviceptr)(m->base + c * v->gran), v->gran);
        (void)v->d.release(m->chunk[c]);
        m->chunk[c] = 0;
    }
}

/* Commit chunks [c0, c1) of m; all or nothing. Lock held. */
static llmem_status commit_chunks(vmm_resource *v, vmm_map *m, size_t c0, size_t c1)
{
    int prev = 0;
    cudaError_t re = cudaGetDevice(&prev);
    if (re == cudaSuccess && prev != v->device) re = cudaSetDevice(v->device);
    if (re != cudaSuccess) return rt_fail(v->base.info.name, re, "cudaSetDevice");
    llmem_status st = LLMEM_OK;
    size_t c = c0;
    for (; c < c1; c++) {
        if (m->chunk[c]) continue; /* the contract says uncommitted ranges only; be safe */
        CUmemGenericAllocationHandle h;
        CUresult e = v->d.create(&h, v->gran, &v->prop, 0);
        if (e != CUDA_SUCCESS) {
            st = drv_fail(v, e, "cuMemCreate");
            break;
        }
        e = v->d.map((CUdeviceptr)(m->base + c * v->gran), v->gran, 0, h, 0);
        if (e != CUDA_SUCCESS) {
            (void)v->d.release(h);
            st = drv_fail(v, e, "cuMemMap");
            break;
        }
        m->chunk[c] = h;
    }
    if (!st) {
        CUresult e = v->d.access((CUdeviceptr)(m->base + c0 * v->gran), (c1 - c0) * v->gran, &v->access, 1);
        if (e != CUDA_SUCCESS) st = drv_fail(v, e, "cuMemSetAccess");
    }
    if (st) release_chunks(v, m, c0, c); /* what this call made */
    if (prev != v->device) (void)cudaSetDevice(prev);
    return st;
}

static llmem_status vmm_map_op(llmem_resource *r, size_t size, size_t align, unsigned flags, const char *tag,
                               void **out)
{
    LLMEM_UNUSED(tag);
    vmm_resource *v = (vmm_resource *)r;
    CUdeviceptr p = 0;
    CUresult e = v->d.reserve(&p, size, align, 0, 0);
    if (e != CUDA_SUCCESS) return drv_fail(v, e, "cuMemAddressReserve");
    vmm_map m = {(uintptr_t)p, size, calloc(size / v->gran, sizeof(CUmemGenericAllocationHandle))};
    llmem_status st = m.chunk ? LLMEM_OK : llmem_error_set(LLMEM_ENOMEM, "%s: out of host memory", r->info.name);
    pthread_mutex_lock(&v->lock);
    if (!st && v->count == v->cap) {
        size_t ncap = v->cap ? v->cap * 2 : 16;
        vmm_map *n = realloc(v->maps, ncap * sizeof *n);
        if (n) {
            v->maps = n;
            v->cap = ncap;
        } else {
            st = llmem_error_set(LLMEM_ENOMEM, "%s: out of host memory", r->info.name);
        }
    }
    if (!st) {
        v->maps[v->count++] = m;
        if (!(flags & LLMEM_MAP_UNCOMMITTED)) {
            st = commit_chunks(v, &v->maps[v->count - 1], 0, size / v->gran);
            if (st) v->count--;
        }
    }
    pthread_mutex_unlock(&v->lock);
    if (st) {
        free(m.chunk);
        (void)v->d.addr_free(p, size);
        return st;
    }
    *out = (void *)(uintptr_t)p;
    return LLMEM_OK;
}

static llmem_status vmm_commit(llmem_resource *r, void *ptr, size_t size)
{
    vmm_resource *v = (vmm_resource *)r;
    pthread_mutex_lock(&v->lock);
    vmm_map *m = find(v, (uintptr_t)ptr, size);
    llmem_status st = m ? commit_chunks(v, m, ((uintptr_t)ptr - m->base) / v->gran,
                                        ((uintptr_t)ptr - m->base + size) / v->gran)
                        : llmem_error_set(LLMEM_EINVAL, "%s: commit of %p (%zu bytes) outside any mapping",
                                          r->info.name, ptr, size);
    pthread_mutex_unlock(&v->lock);
    return st;
}

static llmem_status vmm_decommit(llmem_resource *r, void *ptr, size_t size)
{
    vmm_resource *v = (vmm_resource *)r;
    pthread_mutex_lock(&v->lock);
    vmm_map *m = find(v, (uintptr_t)ptr, size);
    if (m) release_chunks(v, m, ((uintptr_t)ptr - m->base) / v->gran, ((uintptr_t)ptr - m->base + size) / v->gran);
    pthread_mutex_unlock(&v->lock);
    return m ? LLMEM_OK
             : llmem_error_set(LLMEM_EINVAL, "%s: decommit of %p (%zu bytes) outside any mapping", r->info.name, ptr,
                               size);
}

static llmem_status vmm_unmap(llmem_resource *r, void *ptr, size_t size, size_t committed)
{
    LLMEM_UNUSED(committed);
    vmm_resource *v = (vmm_resource *)r;
    pthread_mutex_lock(&v->lock);
    vmm_map *m = find(v, (uintptr_t)ptr, size);
    if (!m || m->base != (uintptr_t)ptr || m->size != size) {
        pthread_mutex_unlock(&v->lock);
        return llmem_error_set(LLMEM_EINVAL, "%s: unmap of %p (%zu bytes) is not a mapping", r->info.name, ptr, size);
    }
    vmm_map gone = *m;
    *m = v->maps[--v->count];
    release_chunks(v, &gone, 0, gone.size / v->gran);
    pthread_mutex_unlock(&v->lock);
    free(gone.chunk);
    CUresult e = v->d.addr_free((CUdeviceptr)gone.base, gone.size);
    return e == CUDA_SUCCESS ? LLMEM_OK : drv_fail(v, e, "cuMemAddressFree");
}

static llmem_status vmm_copy(llmem_resource *r, void *dst, const void *src, size_t n)
{
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    if ((d < s && s - d < n) || (s <= d && d - s < n))
        return llmem_error_set(LLMEM_EINVAL, "%s: copy ranges overlap", r->info.name);
    cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyDefault);
    return e == cudaSuccess ? LLMEM_OK : rt_fail(r->info.name, e, "cudaMemcpy");
}

static void vmm_destroy(llmem_resource *r)
{
    vmm_resource *v = (vmm_resource *)r;
    for (size_t i = 0; i < v->count; i++) {
        release_chunks(v, &v->maps[i], 0, v->maps[i].size / v->gran);
        (void)v->d.addr_free((CUdeviceptr)v->maps[i].base, v->maps[i].size);
        free(v->maps[i].chunk);
    }
    free(v->maps);
    pthread_mutex_destroy(&v->lock);
    free(v);
}

static const llmem_resource_ops vmm_ops = {
    .map = vmm_map_op,
    .unmap = vmm_unmap,
    .commit = vmm_commit,
    .decommit = vmm_decommit,
    .copy = vmm_copy,
    .destroy = vmm_destroy,
};

/* One driver entry point by name; false (and a message) if missing. */
static bool entry(const char *name, void **fn)
{
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    cudaError_t e = cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &q);
#else
    cudaError_t e = cudaGetDriverEntryPoint(name, fn, cudaEnableDefault, &q);
#endif
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !*fn) {
        (void)cudaGetLastError();
        llmem_error_set(LLMEM_EDEVICE, "cuda-vmm: the driver has no %s (%s)", name,
                        e != cudaSuccess ? cudaGetErrorString(e) : "symbol not found or version too old");
        return false;
    }
    return true;
}

llmem_status llmem_cuda_vmm_resource_create(const llmem_cuda_options *opts, llmem_resource **out)
{
    if (!out) return llmem__fail(LLMEM_EINVAL, "cuda-vmm: null out");
    *out = NULL;
    llmem_cuda_options o;
    memset(&o, 0, sizeof o);
    if (opts) o = *opts;
    if (o.device < 0) return llmem__fail(LLMEM_EINVAL, "cuda-vmm: device index %d is negative", o.device);
    int count = 0;
    llmem_status st = llmem_cuda_device_count(&count);
    if (st) return st;
    if (count == 0) {
        char why[256];
        snprintf(why, sizeof why, "%s", llmem_error_message());
        return llmem__fail(LLMEM_EDEVICE, "cuda-vmm: no CUDA device (%s)", why);
    }
    if (o.device >= count) return llmem__fail(LLMEM_EDEVICE, "cuda-vmm: no CUDA device %d (%d found)", o.device, count);
    int vmm = 0;
    /* The runtime's attribute numbers are the driver's; CUDA 13's runtime
     * header has no name for this one. */
    cudaError_t ce = cudaDeviceGetAttribute(
        &vmm, (enum cudaDeviceAttr)CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, o.device);
    if (ce != cudaSuccess) return rt_fail("cuda-vmm", ce, "cudaDeviceGetAttribute(VirtualMemoryManagementSupported)");
    if (!vmm) return llmem__fail(LLMEM_ENOTSUP, "cuda-vmm: device %d does not support virtual memory management", o.device);

    vmm_resource *v = calloc(1, sizeof *v);
    if (!v) return llmem__fail(LLMEM_ENOMEM, "cuda-vmm: out of memory");
    v->device = o.device;
    pthread_mutex_init(&v->lock, NULL);
    /* The runtime initialises the driver and the device's primary context. */
    int prev = 0;
    ce = cudaGetDevice(&prev);
    if (ce == cudaSuccess) ce = cudaSetDevice(o.device);
    if (ce == cudaSuccess) ce = cudaFree(NULL);
    if (prev != o.device) (void)cudaSetDevice(prev);
    if (ce != cudaSuccess) {
        st = rt_fail("cuda-vmm", ce, "cudaSetDevice/cudaFree(NULL)");
        goto fail;
    }
    if (!entry("cuMemGetAllocationGranularity", (void **)&v->d.granularity) ||
        !entry("cuMemAddressReserve", (void **)&v->d.reserve) || !entry("cuMemAddressFree", (void **)&v->d.addr_free) ||
        !entry("cuMemCreate", (void **)&v->d.create) || !entry("cuMemRelease", (void **)&v->d.release) ||
        !entry("cuMemMap", (void **)&v->d.map) || !entry("cuMemUnmap", (void **)&v->d.unmap) ||
        !entry("cuMemSetAccess", (void **)&v->d.access) || !entry("cuGetErrorString", (void **)&v->d.error_string)) {
        st = LLMEM_EDEVICE;
        goto fail;
    }
    v->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    v->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    v->prop.location.id = o.device;
    v->access.location = v->prop.location;
    v->access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    llmem_resource_init(&v->base, &vmm_ops, o.name ? o.name : "cuda-vmm", LLMEM_MEM_DEVICE, 1, 1, 1, 0);
    CUresult e = v->d.granularity(&v->gran, &v->prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (e != CUDA_SUCCESS || !v->gran || (v->gran & (v->gran - 1))) {
        st = e != CUDA_SUCCESS ? drv_fail(v, e, "cuMemGetAllocationGranularity")
                               : llmem__fail(LLMEM_EDEVICE, "cuda-vmm: granularity %zu is not a power of two", v->gran);
        goto fail;
    }
    llmem_resource_init(&v->base, &vmm_ops, o.name ? o.name : "cuda-vmm", LLMEM_MEM_DEVICE, v->gran, v->gran,
                        LLMEM_MAX_ALIGN, LLMEM_RES_CAP_DECOMMIT | LLMEM_RES_CAP_RESERVE | LLMEM_RES_CAP_COPY);
    *out = &v->base;
    return LLMEM_OK;
fail:
    pthread_mutex_destroy(&v->lock);
    free(v);
    return st;
}

#else /* built without CUDA */

llmem_status llmem_cuda_vmm_resource_create(const llmem_cuda_options *opts, llmem_resource **out)
{
    LLMEM_UNUSED(opts);
    if (out) *out = NULL;
    return llmem__fail(LLMEM_ENOTSUP, "llmem_cuda_vmm_resource_create: llmem was built without CUDA");
}

#endif
