/*
 * llmem/cuda_resource.h - CUDA memory behind the resource interface.
 *
 * Four resources over the CUDA runtime, so the pool, the KV manager and
 * the controller run unchanged on GPU memory:
 *
 *  - cuda:         cudaMalloc/cudaFree on one device. Kind DEVICE.
 *  - cuda-async:   cudaMallocFromPoolAsync/cudaFreeAsync on one stream with a
 *                  memory pool (a pool of its own, or the device's default
 *                  pool) and a release threshold. Kind DEVICE.
 *  - cuda-host:    pinned host memory (cudaHostAlloc), for staging and KV
 *                  offload. Kind HOST: the CPU may touch it.
 *  - cuda-managed: unified memory (cudaMallocManaged) advised to prefer the
 *                  device and prefetched to it on map. Kind DEVICE: the CPU
 *                  could touch it, but every touch migrates pages, so llmem
 *                  treats it as device memory (copy() only).
 *
 * Contract, beyond llmem/resource.h's:
 *  - Alignment: 256 bytes natively (cudaMalloc's guarantee; a page for
 *    cuda-host). A larger alignment, up to 1 GiB, is served by asking for
 *    size + align bytes and handing out the aligned address inside; the
 *    resource keeps the raw pointer for unmap. Since the driver usually
 *    aligns large allocations to 2 MiB, the first try is the exact size and
 *    only a misaligned result is given back and asked for again.
 *  - commit/decommit: CUDA memory from these calls is always backed, so
 *    commit is a no-op and decommit is LLMEM_ENOTSUP (growable device memory
 *    is the job of cuda-vmm, below).
 *  - copy(dst, src, n): cudaMemcpy with cudaMemcpyDefault (unified
 *    addressing tells host from device), synchronous; cuda-async copies on
 *    its stream and waits for it. Overlapping ranges are LLMEM_EINVAL.
 *  - cuda-managed refuses (LLMEM_ENOMEM) any map larger than the device's
 *    free memory as cudaMemGetInfo reports it: oversubscribed managed memory
 *    can stall a GPU in page migration rather than fail.
 *  - Every call selects the resource's device and restores the calling
 *    thread's current device afterwards.
 *  - Every CUDA error is a status - LLMEM_ENOMEM for
 *    cudaErrorMemoryAllocation, LLMEM_EDEVICE otherwise - with a message
 *    naming the call and cudaGetErrorString's text. Nothing aborts.
 *
 * Built without CUDA (cmake -DLLMEM_CUDA=OFF, or AUTO without a toolkit),
 * every function here still exists and returns LLMEM_ENOTSUP with the
 * message "llmem was built without CUDA".
 *
 *     int n = 0;
 *     if (llmem_cuda_device_count(&n) == LLMEM_OK && n > 0) {
 *         llmem_resource *gpu;
 *         llmem_cuda_resource_create(NULL, &gpu);          // device 0
 *         llmem_pool_options po = {.resource = gpu};       // metadata stays on the host
 *         ...
 *     }
 */
#ifndef LLMEM_CUDA_RESOURCE_H
#define LLMEM_CUDA_RESOURCE_H

#include "llmem/fence.h"
#include "llmem/resource.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_cuda_options {
    const char *name;           /* default "cuda", "cuda-async", "cuda-host" or "cuda-managed" */
    int device;                 /* CUDA device index; default 0 */
    /* cuda-async only: */
    void *stream;               /* a cudaStream_t to allocate and free on (borrowed); NULL: the
                                   resource creates a non-blocking stream of its own */
    bool use_default_pool;      /* allocate from the device's default memory pool (shared with
                                   the rest of the process; the threshold below is then set on
                                   it) instead of a pool of the resource's own */
    uint64_t release_threshold; /* bytes the memory pool keeps cached across synchronisations
                                   (cudaMemPoolAttrReleaseThreshold); 0 = CUDA's default (0:
                                   free memory goes back at every synchronise); UINT64_MAX keeps all */
    /* cuda-host only: */
    unsigned host_flags;        /* cudaHostAlloc flags; default cudaHostAllocPortable (1) */
    /* cuda-managed only: */
    bool no_prefetch;           /* skip the cudaMemPrefetchAsync to the device on map */
} llmem_cuda_options;

/* Number of CUDA devices. No driver or no device (cudaErrorNoDevice,
 * cudaErrorInsufficientDriver) is *out = 0 and LLMEM_OK, with
 * llmem_error_message() saying why ("cudaGetDeviceCount: ..."), so callers can
 * skip cleanly; other runtime errors are LLMEM_EDEVICE. LLMEM_ENOTSUP
 * (and *out = 0) without CUDA. */
LLMEM_API llmem_status llmem_cuda_device_count(int *out);

/* Create a resource (see above). opts NULL means all defaults. Errors:
 * LLMEM_EINVAL (null out, negative device), LLMEM_EDEVICE (no such device,
 * no driver, or a runtime error), LLMEM_ENOMEM, LLMEM_ENOTSUP (built
 * without CUDA). On failure *out is NULL. Destroy with
 * llmem_resource_destroy; mappings still live then are freed with it. */
LLMEM_API llmem_status llmem_cuda_resource_create(const llmem_cuda_options *opts, llmem_resource **out);
LLMEM_API llmem_status llmem_cuda_async_resource_create(const llmem_cuda_options *opts,
                                                        llmem_resource **out);
LLMEM_API llmem_status llmem_cuda_host_resource_create(const llmem_cuda_options *opts,
                                                       llmem_resource **out);
LLMEM_API llmem_status llmem_cuda_managed_resource_create(const llmem_cuda_options *opts,
                                                          llmem_resource **out);

/* cuda-vmm: device memory through the driver's virtual memory API
 * (cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess). Unlike the
 * others it can reserve address space and commit and decommit physical
 * memory inside it (LLMEM_RES_CAP_RESERVE | DECOMMIT | COPY), at the
 * driver's recommended granularity (2 MiB on current GPUs): a pool over it
 * with reserve_bytes grows in place (pool.h). Only `device` and `name` of
 * opts are used. Errors as above, plus LLMEM_ENOTSUP for a device without
 * virtual memory management. The driver is reached through
 * cudaGetDriverEntryPoint: libllmem does not link libcuda. */
LLMEM_API llmem_status llmem_cuda_vmm_resource_create(const llmem_cuda_options *opts, llmem_resource **out);

/* A fence for llmem_pool_free_fenced: a CUDA event recorded now on
 * `stream` (a cudaStream_t; NULL = the legacy default stream) on the
 * current device. done() is cudaEventQuery (an error there counts as done,
 * logged: the work will not complete), wait() cudaEventSynchronize, drop()
 * destroys the event. Errors: LLMEM_EINVAL (null out), LLMEM_EDEVICE,
 * LLMEM_ENOMEM, LLMEM_ENOTSUP (built without CUDA). */
LLMEM_API llmem_status llmem_cuda_fence_record(void *stream, llmem_fence *out);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_CUDA_RESOURCE_H */
