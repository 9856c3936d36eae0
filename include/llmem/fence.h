/*
 * llmem/fence.h - a point in asynchronous work that the host can poll.
 *
 * A fence stands for work queued somewhere else (a CUDA stream, a DMA
 * engine, another thread): done() says, without blocking, whether it has
 * completed. The pool's fenced frees (pool.h) hold a block back until its
 * fence is done; llmem_cuda_fence_record (cuda_resource.h) makes one from a
 * CUDA event, and tests make them from a flag.
 *
 * The pool calls done() under its lock from whichever thread is allocating,
 * wait() with the lock dropped, and drop() once; all three must be safe to
 * call from any thread.
 */
#ifndef LLMEM_FENCE_H
#define LLMEM_FENCE_H

#include <stdbool.h>

#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_fence {
    bool (*done)(void *fence);          /* required: has the work completed? must not block */
    llmem_status (*wait)(void *fence);  /* optional: block until it has; NULL: poll done() with sleeps */
    void (*drop)(void *fence);          /* optional: called once when the holder is done with the fence */
    void *fence;
} llmem_fence;

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_FENCE_H */
