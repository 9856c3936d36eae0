/*
 * llmem/engine.h - a small CPU inference engine for llama-family models,
 * with every byte from llmem.
 *
 * The model: RMSNorm, rotary embeddings (base and rotated dimensions from
 * the file), grouped-query attention, SwiGLU, tied or separate classifier;
 * weights F32, F16, BF16 or Q8_0 read in place from the mapped file
 * (llmem/model.h).
 *
 * Memory:
 *  - weights: the model's mapping; only 1-D tensors stored in another type
 *    than f32 are converted, into blocks of the engine's pool;
 *  - KV cache: an llmem_kv (paged by default) over the engine's pool;
 *  - activations: one arena, sized at creation for the largest step as
 *    planned by llmem/planner.h (buffers not alive together share bytes),
 *    (max_step_tokens tokens), reset after every step, so a step never asks
 *    malloc for anything; the first decode step after a prefill gives the
 *    pages only the prompt needed back to the OS (one decommit), and the
 *    next prefill takes them again;
 *  - the engine's own tables (sequences, per-step block tables) are taken
 *    at creation.
 * A decode step calls no malloc (test_engine proves it by counting malloc
 * calls), and no resource either as long as the pool holds the KV blocks
 * the step needs (llmem_engine_seq_reserve takes them ahead, at
 * admission) - but for the first decode step after a prefill, which gives
 * the prompt's workspace pages back.
 *
 * A step runs any mix of sequences: each brings n >= 1 new tokens (a
 * prompt, or one token while decoding); all tokens of the step go through
 * every matrix multiply together (prefill is matrix-matrix, not a token
 * loop), attention runs per token against its own sequence's cache, and the
 * step gives the logits of each sequence's last token.
 *
 *     llmem_engine *e;
 *     llmem_engine_create(model, NULL, &e);
 *     llmem_engine_seq s;
 *     llmem_engine_seq_create(e, &s);
 *     llmem_engine_batch_item it = {s, prompt, n};
 *     llmem_engine_step(e, &it, 1);                 // prefill
 *     int32_t tok = llmem_logits_argmax(llmem_engine_logits(e, 0), vocab);
 *     for (...) { it.tokens = &tok; it.n = 1; llmem_engine_step(e, &it, 1); ... }
 *     llmem_engine_seq_free(e, s);
 *
 * The engine reports its stages (llmem/stage.h) to its pool and to an
 * optional listener. One thread drives an engine; its kernels run on a team
 * of worker threads of its own.
 *
 * With alloc = LLMEM_ENGINE_ALLOC_MALLOC the same engine takes everything
 * from the C library instead - a KV buffer of max_seq_len per sequence
 * (as llama2.c does) and activations malloc'd and freed every step - the
 * baseline llmem is measured against (llmem run --alloc malloc).
 */
#ifndef LLMEM_ENGINE_H
#define LLMEM_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/kv.h"
#include "llmem/model.h"
#include "llmem/planner.h"
#include "llmem/pool.h"
#include "llmem/predictor.h"
#include "llmem/stage.h"
#include "llmem/stats.h"
#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_engine llmem_engine;
typedef uint32_t llmem_engine_seq; /* 0 is never a sequence */

typedef enum llmem_engine_alloc {
    LLMEM_ENGINE_ALLOC_LLMEM = 0,  /* default: pool, KV manager, arena */
    LLMEM_ENGINE_ALLOC_MALLOC = 1  /* the C library's malloc, as a baseline */
} llmem_engine_alloc;

typedef struct llmem_engine_options {
    unsigned threads;              /* kernel threads, the caller included; 0 = online CPUs */
    uint32_t max_seqs;             /* live sequences at once; default 16 */
    uint32_t max_step_tokens;      /* tokens in one step (all sequences); default 512. Longer
                                      prompts are processed in chunks of this many */
    uint32_t max_seq_len;          /* tokens per sequence; default (and at most) the model's context */
    llmem_engine_alloc alloc;      /* default LLMEM_ENGINE_ALLOC_LLMEM */
    llmem_kv_strategy kv_strategy; /* default PAGED */
    llmem_kv_dtype kv_dtype;       /* F32 (default, exact) or F16 */
    uint32_t kv_block_tokens;      /* default 16 */
    size_t kv_budget_bytes;        /* cap on KV storage; 0 = none */
    bool kv_prefix_cache;          /* PAGED: index full prompt blocks for reuse (llmem_engine_seq_match_prefix) */
    llmem_resource *kv_swap_resource; /* PAGED: host memory swapped-out sequences wait in (llmem_kv_options
                                     swap_resource); borrowed; NULL: no swapping */
    size_t kv_swap_budget_bytes;   /* cap on swap memory; 0 = none */
    llmem_pool *pool;              /* borrowed; default a pool of the engine's own */
    llmem_stage_fn on_stage;       /* optional listener for stage events */
    void *stage_ctx;
    /* Optional, called after every step with stage_ctx: the step's batch,
     * tokens per sequence (the most of any), the context held before it
     * (the longest sequence) and the activation workspace it used, in bytes
     * (llmem_controller_on_step_done feeds it to the predictor). */
    void (*on_step_done)(void *ctx, uint32_t batch, uint32_t tokens, uint32_t context, uint64_t activation_bytes);
    /* Sliding-window attention: a token attends to the last attn_window
     * positions, itself included. 0 (default): the model's sliding_window
     * (llmem_model_config; 0 there: full attention); LLMEM_ENGINE_FULL_ATTENTION:
     * full attention whatever the model says (what llama.cpp does with llama
     * and qwen2 files). With PAGED KV each sequence gets a KV window of
     * attn_window + 4 x kv_block_tokens tokens, so the blocks that left it
     * go back and a long generation's KV stays bounded; a step item longer
     * than that slack, past the window, is run in chunks inside the step
     * (the same logits). Other strategies and ALLOC_MALLOC only mask. */
    uint32_t attn_window;
} llmem_engine_options;

#define LLMEM_ENGINE_FULL_ATTENTION UINT32_MAX

LLMEM_API llmem_engine_options llmem_engine_options_default(void);

/* An engine over an open model (borrowed: it must outlive the engine).
 * LLMEM_ENOTSUP for weight types the kernels do not take (Q4_0),
 * LLMEM_EINVAL for bad options, LLMEM_ENOMEM. */
LLMEM_API llmem_status llmem_engine_create(const llmem_model *m, const llmem_engine_options *opts,
                                           llmem_engine **out);
LLMEM_API void llmem_engine_destroy(llmem_engine *e);

/* A new empty sequence; LLMEM_ECAPACITY past max_seqs, LLMEM_ENOMEM when the
 * KV budget refuses (static strategy). */
LLMEM_API llmem_status llmem_engine_seq_create(llmem_engine *e, llmem_engine_seq *out);
/* Free a sequence and its KV (0 is a no-op); LLMEM_EINVAL for an unknown one. */
LLMEM_API llmem_status llmem_engine_seq_free(llmem_engine *e, llmem_engine_seq s);
/* Make sure the pool holds memory for `tokens` more tokens of this
 * sequence's KV, so the steps that write them call no resource and no
 * malloc (the admission-time reservation of a scheduler). */
LLMEM_API llmem_status llmem_engine_seq_reserve(llmem_engine *e, llmem_engine_seq s, size_t tokens);
/* For an empty sequence: attach the longest run of cached full blocks
 * (kv_prefix_cache) that tokens[0..n) starts with; *matched gets the tokens
 * covered (a multiple of kv_block_tokens, 0 without a cache), which count
 * as held: the next step brings tokens[*matched..]. A caller that needs the
 * logits of the prompt's last token passes n - 1. LLMEM_ESTATE if the
 * sequence holds tokens, LLMEM_EINVAL for an unknown one. */
LLMEM_API llmem_status llmem_engine_seq_match_prefix(llmem_engine *e, llmem_engine_seq s, const int32_t *tokens,
                                                     size_t n, size_t *matched);
/* A new sequence holding the same tokens as parent, sharing its KV blocks
 * (PAGED: copy-on-write; STATIC and BUCKETS copy). LLMEM_ECAPACITY past
 * max_seqs, LLMEM_ENOMEM, LLMEM_ENOTSUP with ALLOC_MALLOC. */
LLMEM_API llmem_status llmem_engine_seq_fork(llmem_engine *e, llmem_engine_seq parent, llmem_engine_seq *child);
/* Preemption by offload (kv_swap_resource set): swap_out copies the
 * sequence's KV to swap memory and lets its blocks go (it stays live, holds
 * its slot, and may not be stepped); swap_in takes blocks again and copies
 * it back. Errors as llmem_kv_seq_swap_out/in (LLMEM_ENOTSUP without a swap
 * resource; on any error nothing changed). */
LLMEM_API llmem_status llmem_engine_seq_swap_out(llmem_engine *e, llmem_engine_seq s);
LLMEM_API llmem_status llmem_engine_seq_swap_in(llmem_engine *e, llmem_engine_seq s);
/* Tokens the sequence holds (its next position). */
LLMEM_API size_t llmem_engine_seq_length(const llmem_engine *e, llmem_engine_seq s);
/* The KV manager's sequence behind s, to read its cache (llmem_kv_seq_token
 * on llmem_engine_kv(e)); 0 for an unknown sequence or with ALLOC_MALLOC. */
LLMEM_API llmem_kv_seq llmem_engine_seq_kv(const llmem_engine *e, llmem_engine_seq s);

typedef struct llmem_engine_batch_item {
    llmem_engine_seq seq;
    const int32_t *tokens;         /* n tokens, each < vocab */
    uint32_t n;                    /* >= 1 */
    uint32_t cache_end;            /* positions at or past this one are not offered to the prefix cache
                                      (a prompt's private part); 0 = every position */
} llmem_engine_batch_item;

/* One forward step over items[0..count): each item's tokens are appended
 * to its sequence. Sequences appear at most once. All or nothing: on
 * LLMEM_ENOMEM (KV full: preempt someone and retry), LLMEM_ERANGE (past
 * max_seq_len), LLMEM_EINVAL (bad token, unknown sequence) or
 * LLMEM_ECAPACITY (more than max_step_tokens tokens or max_seqs items) no
 * sequence changes. Prompts longer than max_step_tokens: call once per
 * chunk. */
LLMEM_API llmem_status llmem_engine_step(llmem_engine *e, const llmem_engine_batch_item *items, size_t count);

/* Logits (vocab floats) of item i's last token from the last step; valid
 * until the next step. NULL if i is out of range. The caller may modify
 * them (the sampler does). */
LLMEM_API float *llmem_engine_logits(llmem_engine *e, size_t i);

/* Report a stage that is not a step: IDLE when the server has no work. */
LLMEM_API void llmem_engine_set_idle(llmem_engine *e);

/* The fields of llmem_engine_stats after struct_size, in order: X(kind, value type,
 * name, help) for each; the struct and its schema are both made from it. */
#define LLMEM_ENGINE_STATS_FIELDS(X) \
    X(COUNTER, U64, steps_total, "Forward steps run.") \
    /* tokens of prefill steps: an item brings a prompt (more than one token, or a sequence's first) */ \
    X(COUNTER, U64, prefill_tokens_total, "Tokens processed in prefill steps.") \
    X(COUNTER, U64, decode_tokens_total, "Tokens processed in decode steps.") \
    X(COUNTER, DOUBLE, prefill_seconds_total, "Seconds spent in prefill steps.") \
    X(COUNTER, DOUBLE, decode_seconds_total, "Seconds spent in decode steps.") \
    X(GAUGE, U64, sequences, "Live sequences.") \
    X(GAUGE, U64, weights_mapped_bytes, "Tensor bytes read in place from the mapped file.") \
    /* copies made (1-D tensors not in f32; q4_K matrices repacked) */ \
    X(GAUGE, U64, weights_converted_bytes, "Bytes of weights copied at load: f32 copies of 1-D tensors, repacked q4_K matrices.") \
    X(GAUGE, U64, workspace_bytes, "Bytes of the activation arena.") \
    /* most of it one step used */ \
    X(GAUGE, U64, workspace_peak_bytes, "Most of the arena one step used.") \
    /* the largest step's buffers laid end to end */ \
    X(GAUGE, U64, workspace_naive_bytes, "The largest step's activation buffers laid end to end.") \
    /* the most bytes alive at once in the largest step */ \
    X(GAUGE, U64, workspace_lower_bound_bytes, "The most activation bytes alive at once in the largest step.") \
    /* prefill pages given back when decode began */ \
    X(COUNTER, U64, workspace_releases_total, "Prefill workspace pages given back when decode began.") \
    /* KV storage held now (reserved) */ \
    X(GAUGE, U64, kv_bytes, "KV storage held.") \
    /* of which holding tokens of live sequences */ \
    X(GAUGE, U64, kv_used_bytes, "KV storage holding tokens of live sequences.") \
    X(GAUGE, U64, kv_peak_bytes, "Highest kv_bytes.") \
    /* the engine's pool (0 with malloc) */ \
    X(GAUGE, U64, pool_reserved_bytes, "Bytes the engine's pool holds.") \
    /* ALLOC_MALLOC: bytes malloc'd now (KV and tables) */ \
    X(GAUGE, U64, malloc_bytes, "Bytes held from malloc (the malloc baseline).") \
    /* the last llmem_stage the engine reported (IDLE before any) */ \
    X(GAUGE, U64, stage, "The last stage reported (0 idle, 1 load, 2 prefill, 3 decode).") \
    X(COUNTER, U64, stage_changes_total, "Stage reports that changed the stage.") \
    /* PREFILL reports */ \
    X(COUNTER, U64, prefill_steps_total, "Prefill stage reports.") \
    /* DECODE reports */ \
    X(COUNTER, U64, decode_steps_total, "Decode stage reports.")

typedef struct llmem_engine_stats {
    size_t struct_size;
    LLMEM_ENGINE_STATS_FIELDS(LLMEM_STATS_MEMBER)
} llmem_engine_stats;

/* The activation workspace of one step of `tokens` tokens over `seqs`
 * sequences on a model of this shape, planned as the engine plans it
 * (llmem/planner.h: peak, lower bound, naive sum). threads: the kernel
 * threads (each has a score row of max_seq_len). KV blocks of 16 tokens. */
LLMEM_API llmem_status llmem_engine_plan_step(const llmem_shape *shape, uint32_t tokens, uint32_t seqs,
                                              uint32_t max_seq_len, unsigned threads, llmem_plan_result *out);

LLMEM_API llmem_status llmem_engine_get_stats(const llmem_engine *e, llmem_engine_stats *out);
LLMEM_API const llmem_stats_schema *llmem_engine_stats_schema(void);

/* What a scheduler needs to know of an engine. */
typedef struct llmem_engine_info {
    uint32_t vocab;
    uint32_t max_seqs, max_step_tokens, max_seq_len; /* as resolved at creation */
    uint32_t live_seqs;
    uint32_t kv_block_tokens;
    llmem_kv_strategy kv_strategy;
    llmem_kv_dtype kv_dtype;
    size_t kv_elem_bytes;          /* bytes per K or V value */
    bool use_malloc;               /* ALLOC_MALLOC */
    uint32_t attn_window;          /* the attention window in positions; 0 = full attention */
    uint32_t kv_window;            /* the KV window each sequence has (attn_window + slack); 0 = none */
} llmem_engine_info;

LLMEM_API llmem_status llmem_engine_get_info(const llmem_engine *e, llmem_engine_info *out);

/* The predictor options that describe an engine of these options over this
 * model (KV element size, block and slab geometry, activations in the
 * engine's own arena): what a controller sizing the engine's pool should
 * predict with (llmem/memctl.h). opts NULL: the defaults. */
LLMEM_API llmem_status llmem_engine_predictor_options(const llmem_model *m, const llmem_engine_options *opts,
                                                      llmem_predictor_options *out);

/* The KV manager and pool in use (NULL with ALLOC_MALLOC), for stats. */
LLMEM_API llmem_kv *llmem_engine_kv(llmem_engine *e);
LLMEM_API llmem_pool *llmem_engine_pool(llmem_engine *e);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_ENGINE_H */
