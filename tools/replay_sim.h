/*
 * replay_sim.h - replay a request trace through a continuous-batching
 * scheduler whose KV cache is really allocated through llmem (on a
 * simulated device, so no byte is touched), with a simulated clock.
 *
 * The scheduler (vLLM's policy): each step first admits waiting requests in
 * arrival order while their prompts fit in KV memory (at most max_batch
 * running, at most max_prefill_tokens new prompt tokens per step, a request
 * that could never fit alone is rejected); the step prefills the admitted
 * prompts (producing each one's first token) and decodes one token for every
 * other running request. When a decode cannot get a KV slot, the most
 * recently admitted request is preempted: its KV is freed and it goes back
 * to the head of the queue to be recomputed (prompt plus the tokens it had
 * generated). A request whose prompt exceeds the context length is
 * rejected; one that reaches the context length stops there (truncated).
 *
 * Refusals (what a fault campaign drives: tests/test_fault_campaign.c). The
 * KV manager answers LLMEM_ENOMEM the same whether the budget or the
 * resource beneath refused, and changes nothing either way, so:
 *  - a decode append refused: the most recently admitted request is
 *    preempted, as for a full cache, and the append tried again; a request
 *    running alone is tried once more before it is truncated (a transient
 *    refusal passes the second time, a full budget refuses again);
 *  - an admission refused: the request stays at the head of the queue for a
 *    later step; with nothing running it is tried once more before it is
 *    rejected as one that can never fit;
 *  - any other error ends the replay (replay_run returns 1), after tearing
 *    everything down.
 * So a transient failure costs at most a preemption (the request is
 * recomputed later) or a delayed admission, never a request.
 *
 * With the controller, the engine's stage events are simulated: a step that
 * admits prompts is PREFILL (the controller reserves ahead of it), others
 * DECODE, and an empty queue is IDLE until the next arrival (the controller
 * shrinks once IDLE has lasted its decay, on the simulated clock).
 *
 * Step time (a roofline, H100-SXM-class defaults, all flags): overhead +
 * max(flops / (peak_flops * mfu), bytes / bandwidth), where flops counts
 * 2 * params per token processed plus attention (quadratic in each prompt,
 * linear in each decode context) and bytes counts the weights read once a
 * step plus every KV byte read by decode attention and written by prefill.
 */
#ifndef LLMEM_TOOLS_REPLAY_SIM_H
#define LLMEM_TOOLS_REPLAY_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/kv.h"
#include "llmem/shape.h"
#include "llmem/trace.h"

typedef struct replay_options {
    llmem_kv_strategy strategy;
    size_t kv_budget;             /* bytes; required */
    llmem_shape shape;
    size_t kv_elem_bytes;         /* bytes per KV value; default 2 (f16) */
    size_t weight_elem_bytes;     /* bytes per weight; default 2 */
    uint32_t block_tokens;        /* default 16 */
    uint32_t slab_blocks;         /* PAGED: blocks per slab (per layer); default 2 */
    uint32_t max_seq_len;         /* context limit, and STATIC's reservation; default shape.max_ctx */
    uint32_t max_batch;           /* running requests at most; default 256 */
    uint32_t max_prefill_tokens;  /* new prompt tokens per step at most; default 8192 */
    double bandwidth;             /* bytes/s; default 3.35e12 (H100 SXM HBM3) */
    double peak_flops;            /* flop/s; default 989e12 (H100 SXM dense bf16) */
    double mfu;                   /* fraction of peak compute reached; default 0.5 */
    double step_overhead_s;       /* per step; default 0.0003 */
    bool prefix_cache;            /* PAGED: share prefixes the trace declares (prefix_id) */
    size_t max_requests;          /* replay only the first N; 0 = all */
    double speedup;               /* arrivals come this many times faster than the trace's; default 1 */
    bool progress;                /* a progress line on stderr */
    bool controller;              /* the stage-aware controller runs the pool, on the simulated clock */
    uint32_t idle_decay_ms;       /* the controller's idle decay (simulated); default 1000 */
    const char *timeline;         /* write the memory timeline (HTML) here; NULL = none */
    llmem_resource *resource;     /* device memory of the KV pool; borrowed (e.g. fault(tracking(sim)) in
                                     a fault campaign); NULL = a sim-device resource of the replay's own,
                                     sized to the budget */
    bool check;                   /* llmem_kv_check after every step; a violation ends the replay */
    uint32_t pool_decay_ms;       /* the KV pool's decay_ms (wall clock: an empty superblock kept longer
                                     goes back on a slow path); 0 = the pool's default; UINT32_MAX = never,
                                     so the resource calls do not depend on timing (fault campaigns) */
} replay_options;

typedef struct replay_result {
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
    uint64_t steps, tokens_generated, prompt_tokens;
    double throughput_tokens_per_s; /* generated tokens / simulated time */
    /* The KV's device memory (the resource under the pool; CONTIGUOUS maps it
     * directly), over the simulated time (idle gaps included). */
    uint64_t resource_calls;      /* map, unmap, commit, decommit */
    uint64_t peak_committed_bytes;
    double mean_committed_bytes;  /* time-weighted */
    uint64_t controller_reserves, controller_grows, controller_shrinks;
} replay_result;

void replay_options_default(replay_options *o);

/* 0 on success; on failure prints the reason to stderr and returns 1. */
int replay_run(const llmem_trace *trace, const replay_options *o, replay_result *r);

#endif
