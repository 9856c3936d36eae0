/*
 * cuda_fence.c - fences from CUDA events, for the pool's fenced frees.
 *
 * An event is recorded on the stream whose work uses the block; the pool
 * polls it with cudaEventQuery (non-blocking) and, when an allocation would
 * otherwise fail, waits on it with cudaEventSynchronize: only that stream's
 * work up to the event is waited for, never the whole device. Events are
 * created without timing (cheaper to record and query).
 */
#include <stdlib.h>

#include "internal.h"
#include "llmem/cuda_resource.h"

#if defined(LLMEM_HAVE_CUDA) && LLMEM_HAVE_CUDA

#include <cuda_runtime_api.h>

static bool event_done(void *fence)
{
    cudaError_t e = cudaEventQuery((cudaEvent_t)fence);
    if (e == cudaSuccess) return true;
    if (e == cudaErrorNotReady) return false;
    /* A failed stream never reaches the event: waiting for it would hang. */
    (void)cudaGetLastError();
    llmem__log(LLMEM_LOG_ERROR, "cuda fence: cudaEventQuery failed: %s (%s); treated as done", cudaGetErrorString(e),
               cudaGetErrorName(e));
    return true;
}

static llmem_status event_wait(void *fence)
{
    cudaError_t e = cudaEventSynchronize((cudaEvent_t)fence);
    if (e == cudaSuccess) return LLMEM_OK;
    (void)cudaGetLastError();
    return llmem__fail(LLMEM_EDEVICE, "cuda fence: cudaEventSynchronize failed: %s (%s)", cudaGetErrorString(e),
                       cudaGetErrorName(e));
}

static void event_drop(void *fence) { (void)cudaEventDestroy((cudaEvent_t)fence); }

llmem_status llmem_cuda_fence_record(void *stream, llmem_fence *out)
{
    if (!out) return llmem__fail(LLMEM_EINVAL, "llmem_cuda_fence_record: null out");
    cudaEvent_t ev;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) {
        e = cudaEventRecord(ev, (cudaStream_t)stream);
        if (e != cudaSuccess) (void)cudaEventDestroy(ev);
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return llmem__fail(e == cudaErrorMemoryAllocation ? LLMEM_ENOMEM : LLMEM_EDEVICE,
                           "llmem_cuda_fence_record: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    }
    *out = (llmem_fence){event_done, event_wait, event_drop, (void *)ev};
    return LLMEM_OK;
}

#else /* built without CUDA */

llmem_status llmem_cuda_fence_record(void *stream, llmem_fence *out)
{
    LLMEM_UNUSED(stream);
    LLMEM_UNUSED(out);
    return llmem__fail(LLMEM_ENOTSUP, "llmem_cuda_fence_record: llmem was built without CUDA");
}

#endif
