/*
 * llmem/workload.h - the memory plan of a workload before it runs: what
 * `llmem plan` prints, for any program that sizes a server or a batch.
 *
 * For a model shape and a batch of B sequences of P prompt tokens that
 * generate up to T tokens each:
 *  - KV: bytes per token (all layers, K and V) and for the workload
 *    (B x (P + T) tokens, each sequence rounded up to whole blocks);
 *  - activations: the engine's planned workspace (llmem_engine_plan_step)
 *    for the largest step of the workload - the prefill of all prompts in
 *    steps of at most max_step_tokens, or a decode step of B tokens;
 *  - the reserve to take before prefill: (KV + activations) x the safety
 *    factor, rounded up, so the run makes no resource call;
 *  - given device memory, how many such sequences fit beside the weights
 *    and the activations.
 * Every size comes from user input: each product and sum is checked
 * (LLMEM_EOVERFLOW with the numbers), and no double is cast to an integer
 * it does not fit.
 */
#ifndef LLMEM_WORKLOAD_H
#define LLMEM_WORKLOAD_H

#include <stdbool.h>
#include <stdint.h>

#include "llmem/planner.h"
#include "llmem/shape.h"
#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_workload {
    llmem_shape shape;
    uint64_t weights_bytes;   /* the file's tensor bytes, or llmem_workload_weights_bytes */
    uint32_t kv_elem_bytes;   /* 4 (f32), 2 (f16), 1 (8-bit) */
    uint32_t batch;           /* concurrent sequences, >= 1 */
    uint32_t prompt_tokens, max_tokens; /* per sequence; not both 0 */
    uint32_t threads;         /* kernel threads, >= 1 */
    double device_bytes;      /* 0: no fit computed */
    uint32_t block_tokens;    /* KV block, 16 */
    uint32_t max_step_tokens; /* prefill chunk, 512 */
    double safety;            /* 1.2: the reserve's factor (x + ceil(x / 5) when 1.2) */
} llmem_workload;

typedef struct llmem_workload_plan {
    uint64_t seq_tokens;        /* prompt + generated */
    bool over_context;          /* seq_tokens > the shape's context */
    uint64_t kv_bytes_per_token;
    uint64_t kv_bytes_per_seq;  /* in whole blocks */
    uint64_t kv_bytes;          /* x batch */
    llmem_plan_result prefill, decode; /* zero when the step does not happen */
    bool prefill_is_peak;       /* which of the two is the largest step */
    uint64_t activation_peak_bytes;
    uint64_t reserve_bytes;     /* (KV + activation peak) x safety, rounded up */
    long long max_concurrent;   /* sequences that fit in device_bytes; -1 without it */
} llmem_workload_plan;

/* Block 16, step 512, safety 1.2, f16 KV, 1 sequence of 512 + 256 tokens,
 * 2 threads; shape and weights zero. */
LLMEM_API llmem_workload llmem_workload_default(void);

/* Parameters x the element size of dtype (LLMEM_DTYPE_F32, F16, Q8_0:
 * 34 bytes a 32-element block; norms counted alike, a rounding error). */
LLMEM_API llmem_status llmem_workload_weights_bytes(const llmem_shape *s, uint32_t dtype, uint64_t *out);

LLMEM_API llmem_status llmem_workload_plan_make(const llmem_workload *w, llmem_workload_plan *out);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_WORKLOAD_H */
