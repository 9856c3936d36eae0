/*
 * llmem/planner.h - offsets for the tensors of a forward pass in one
 * workspace.
 *
 * A forward pass is a sequence of operations; each temporary tensor is
 * written by one (first) and read up to another (last). Two tensors whose
 * [first, last] intervals intersect are alive together and must not
 * overlap; all others may share bytes. The planner assigns offsets greedily
 * by size, the approach of TensorFlow Lite's arena planner: largest tensor
 * first, each at the best-fitting gap among the tensors already placed
 * that are alive at the same time (or at the end of them). It reports the
 * planned peak (the workspace size) against the lower bound no plan can
 * beat (the largest total of bytes alive at one moment) and against the
 * naive layout (every tensor its own bytes).
 *
 * An operation that may write its output over an input it reads for the
 * last time (element-wise ops) says so with `inplace_of`: the output then
 * takes the input's bytes when sizes allow, and counts once.
 *
 * Planning allocates nothing: the caller passes scratch of
 * llmem_plan_scratch_bytes(n) bytes, so an engine can plan every step.
 * Cost O(n^2) for n tensors (a forward step has a few dozen).
 *
 *     llmem_plan_tensor t[3] = {
 *         {"x", 4096, 0, 2, -1, 0}, {"h", 16384, 1, 2, -1, 0}, {"y", 4096, 2, 3, -1, 0}};
 *     llmem_plan_result r;
 *     llmem_plan(t, 3, 64, scratch, sizeof scratch, &r);   // t[i].offset set; r.peak_bytes
 */
#ifndef LLMEM_PLANNER_H
#define LLMEM_PLANNER_H

#include <stddef.h>
#include <stdint.h>

#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_plan_tensor {
    const char *name;   /* optional, for reports */
    size_t bytes;       /* 0: takes no space (offset 0) */
    uint32_t first;     /* the operation that writes it */
    uint32_t last;      /* the last operation that reads it (>= first) */
    int32_t inplace_of; /* -1, or the index of a tensor whose last use is this one's first, whose bytes it
                           may take over */
    size_t offset;      /* out: from the workspace base, a multiple of the alignment */
} llmem_plan_tensor;

typedef struct llmem_plan_result {
    size_t peak_bytes;        /* the workspace the plan needs */
    size_t lower_bound_bytes; /* the most bytes alive at one operation (aligned sizes) */
    size_t naive_bytes;       /* every tensor its own bytes (aligned sizes) */
    size_t inplace_reuses;    /* tensors placed over their inplace_of input */
} llmem_plan_result;

/* Scratch bytes llmem_plan needs for n tensors. */
LLMEM_API size_t llmem_plan_scratch_bytes(size_t n);

/* Assign offsets. align: a power of two (0 = 64). Errors: LLMEM_EINVAL (null
 * tensors with n > 0, null out, last < first, inplace_of out of range or
 * itself or not ending where this one starts), LLMEM_EALIGN,
 * LLMEM_ERANGE (scratch too small), LLMEM_EOVERFLOW (sizes). */
LLMEM_API llmem_status llmem_plan(llmem_plan_tensor *t, size_t n, size_t align, void *scratch,
                                  size_t scratch_bytes, llmem_plan_result *out);

/* Whether a plan is sound: no two tensors alive together overlap (except
 * an in-place output over its input), every offset is aligned, and every
 * tensor ends within peak. For tests and assertions; O(n^2). */
LLMEM_API llmem_status llmem_plan_check(const llmem_plan_tensor *t, size_t n, size_t align, size_t peak);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_PLANNER_H */
