/*
 * llmem/replay.h - replay a request trace through the scheduler
 * (llmem/sched.h) over a simulated engine: the KV cache is really
 * allocated through llmem (on a simulated device, so no byte is touched),
 * the clock is simulated and each step's time comes from a step model
 * (llmem/step_model.h; by default the H100 roofline, or a linear model
 * calibrated on a real engine).
 *
 * Requests are submitted when the simulated clock reaches their arrival
 * (the trace's, divided by speedup); with nothing to run the clock jumps to
 * the next arrival (IDLE: with the controller, the pool shrinks once the
 * idle decay has passed). The scheduler's policy is the one a server runs
 * (admission, chunked prefill within max_prefill_tokens per step,
 * preemption of the most recently admitted sequence by recomputation,
 * prefix reuse); see llmem/sched.h. Synthetic token ids: a declared shared
 * prefix (prefix_id) has the same ids in every request naming it,
 * everything else is unique to its request. Outcomes: a prompt longer than
 * the context, or empty, is rejected at submission; one that can never fit
 * in the KV is rejected by the scheduler; a request that reaches the
 * context, or that runs alone when the KV refuses it twice, stops there
 * (truncated).
 *
 * With options.engine the same trace runs on a real engine instead (wall
 * clock, measured step times): the figures of the two are comparable line
 * by line (docs/BENCHMARKS.md compares them).
 *
 * Refusals (what a fault campaign drives: tests/test_fault_campaign.c): the
 * KV manager answers LLMEM_ENOMEM the same whether the budget or the
 * resource beneath refused, and changes nothing either way, so a refused
 * step preempts (and is tried again), a refused admission waits, and a
 * request alone is tried twice: a transient failure costs a preemption or
 * a delay, never a request. Any other error ends the replay (its status
 * is returned) after tearing everything down.
 */
#ifndef LLMEM_REPLAY_H
#define LLMEM_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/engine.h"
#include "llmem/kv.h"
#include "llmem/resource.h"
#include "llmem/shape.h"
#include "llmem/status.h"
#include "llmem/step_model.h"
#include "llmem/timeline.h"
#include "llmem/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_replay_options {
    llmem_kv_strategy strategy;
    size_t kv_budget;             /* bytes; required */
    llmem_shape shape;            /* required */
    size_t kv_elem_bytes;         /* bytes per KV value; default 2 (f16) */
    size_t weight_elem_bytes;     /* bytes per weight; default 2 */
    uint32_t block_tokens;        /* default 16 */
    uint32_t slab_blocks;         /* PAGED: blocks per slab (per layer); default 2 */
    uint32_t max_seq_len;         /* context limit, and STATIC's reservation; default shape.max_ctx */
    uint32_t max_batch;           /* running requests at most; default 256 */
    uint32_t max_prefill_tokens;  /* tokens per step at most (prompt chunks and decodes); default 8192 */
    double bandwidth;             /* roofline: bytes/s; default 3.35e12 (H100 SXM HBM3) */
    double peak_flops;            /* roofline: flop/s; default 989e12 (H100 SXM dense bf16) */
    double mfu;                   /* roofline: fraction of peak compute reached; default 0.5 */
    double step_overhead_s;       /* roofline: per step; default 0.0003 */
    const llmem_step_model *model; /* another step model (e.g. a calibrated LINEAR one); NULL = the
                                     roofline of the four figures above */
    bool prefix_cache;            /* PAGED: the prefix cache (requests declaring a prefix share it) */
    size_t max_requests;          /* replay only the first N; 0 = all */
    double speedup;               /* arrivals come this many times faster than the trace's; default 1 */
    bool controller;              /* the stage-aware controller runs the pool, on the simulated clock */
    uint32_t idle_decay_ms;       /* the controller's idle decay (simulated); default 1000 */
    llmem_timeline *timeline;     /* borrowed: the pool's memory samples and the controller's decisions
                                     are recorded here (the caller writes it); NULL = none */
    llmem_resource *resource;     /* device memory of the KV pool; borrowed (e.g. fault(tracking(sim)) in
                                     a fault campaign); NULL = a sim-device resource of the replay's own,
                                     sized to the budget */
    bool check;                   /* llmem_kv_check after every step; a violation ends the replay */
    uint32_t pool_decay_ms;       /* the KV pool's decay_ms (wall clock: an empty superblock kept longer
                                     goes back on a slow path); 0 = the pool's default; UINT32_MAX = never,
                                     so the resource calls do not depend on timing (fault campaigns) */
    llmem_engine *engine;         /* borrowed: run the trace on this real engine instead, on the wall clock
                                     (arrivals waited for; its KV, budget and geometry are its own, the
                                     options above that describe the KV and the step model unused; no
                                     controller): what the simulation is compared with */
    size_t first_request;         /* start at this request of the trace (arrivals counted from it) */
    bool fit_steps;               /* fit a LINEAR step model to the steps as they ran (measured on an
                                     engine): result.step_fit */
    double prompt_scale;          /* prompt lengths x this (at least 1 token), to fit a small model's
                                     context; default 1 */
    double output_scale;          /* output lengths x this (at least 1 token); default 1 */
    uint32_t vocab;               /* synthetic token ids are below it (an engine's vocabulary; the same in
                                     the simulation it is compared with); default 2^31 - 1 */
    void (*progress)(void *ctx, size_t done, size_t total, double sim_s); /* now and then; optional */
    void *progress_ctx;
} llmem_replay_options;

typedef struct llmem_replay_result {
    const char *strategy;
    size_t requests_total, requests_completed, requests_rejected, requests_truncated;
    uint64_t preemptions;
    double kv_utilization;        /* time-weighted over busy steps: KV bytes holding tokens / KV bytes reserved */
    uint64_t peak_reserved_bytes;
    double mean_concurrency;      /* time-weighted over busy steps */
    uint32_t max_concurrency;
    double prefix_hit_rate;       /* prompt tokens found cached / prompt tokens looked up */
    double ttft_p50_s, ttft_p99_s, tpot_p50_s, tpot_p99_s, e2e_p50_s, e2e_p99_s;
    double sim_time_s, wall_time_s;
    uint64_t steps, tokens_generated, prompt_tokens; /* prompt_tokens: computed, recomputation included */
    double throughput_tokens_per_s; /* generated tokens / simulated time */
    /* The KV's device memory (the resource under the pool; CONTIGUOUS maps it
     * directly), over the simulated time (idle gaps included). */
    uint64_t resource_calls;      /* map, unmap, commit, decommit */
    uint64_t peak_committed_bytes;
    double mean_committed_bytes;  /* time-weighted */
    uint64_t controller_reserves, controller_grows, controller_shrinks;
    llmem_step_model step_fit;    /* fit_steps: the least-squares LINEAR model of this run's steps */
    double step_fit_error;        /* its mean relative error over them */
} llmem_replay_result;

LLMEM_API llmem_replay_options llmem_replay_options_default(void);

/* Replay trace under o into *r. LLMEM_EINVAL (no budget, an incomplete
 * shape, bad options), LLMEM_ENOMEM (host memory for the simulation), or
 * the status of the error that ended it (the message says which). */
LLMEM_API llmem_status llmem_replay_run(const llmem_trace *trace, const llmem_replay_options *o,
                                        llmem_replay_result *r);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_REPLAY_H */
