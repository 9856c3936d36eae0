/*
 * llmem/predictor.h - how much memory the next stage of inference needs.
 *
 * A model's memory is weights (fixed), KV state (grows with every token
 * kept) and activations (a workspace per step, large in prefill, small in
 * decode). The predictor answers for a model shape and any stage:
 *
 *   - weights bytes, KV bytes per token;
 *   - for a step of `batch` sequences with `tokens` new tokens each, after
 *     `context` tokens already held: the KV state after the step and the
 *     activation peak during it;
 *   - the reserve to take before the step: state and workspace, with the
 *     data-dependent parts at their worst case times a safety factor.
 *
 * Activations come from per-operation memory functions, registered per op
 * kind (defaults for the llama engine's operations are installed at
 * creation; llmem_predictor_register replaces one). Each gives, for a
 * query, the bytes the operation holds while it runs beyond the step's
 * residual stream (its inputs, outputs and scratch) and the state it adds;
 * an op whose size depends on data (attention: on how long sequences
 * become) is flagged, and is evaluated at its worst case (the context
 * at max_seq_len) when a reserve is asked for. The activation peak is the
 * largest op's bytes plus what lives through the whole step.
 *
 * An online corrector learns from measured peaks: llmem_predictor_observe
 * feeds (batch, tokens, measured activation bytes); a least-squares fit
 * peak ~ a + b * batch * tokens + c * batch over what was seen is used
 * once it has predicted better than the formula on the observations so far
 * (each scored before it was added). Both errors are in the stats.
 */
#ifndef LLMEM_PREDICTOR_H
#define LLMEM_PREDICTOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/shape.h"
#include "llmem/stage.h"
#include "llmem/stats.h"
#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_predictor llmem_predictor;

typedef enum llmem_op_kind {
    LLMEM_OP_EMBED = 0,      /* token rows into the residual stream */
    LLMEM_OP_NORM,           /* RMSNorm of every row */
    LLMEM_OP_QKV,            /* the q, k, v projections */
    LLMEM_OP_ATTENTION,      /* rope, K/V stored, scores and weighted sum (data-dependent: context) */
    LLMEM_OP_ATTN_OUT,       /* the output projection */
    LLMEM_OP_FFN,            /* gate and up, SwiGLU, down */
    LLMEM_OP_CLASSIFIER,     /* final norm and logits of each sequence's last token */
    LLMEM_OP_KIND_COUNT
} llmem_op_kind;

/* What an operation is asked about. */
typedef struct llmem_op_query {
    const llmem_shape *shape;
    uint32_t batch;          /* sequences in the step */
    uint32_t tokens;         /* new tokens per sequence */
    uint32_t context;        /* tokens each sequence holds before the step */
    uint32_t max_seq_len;    /* the longest a sequence may become */
    uint32_t block_tokens;   /* KV block size */
    size_t kv_elem_bytes;
    size_t act_elem_bytes;   /* 4: f32 activations */
    unsigned threads;
} llmem_op_query;

typedef struct llmem_op_memory {
    uint64_t workspace_bytes; /* held while it runs, beyond the step's residual stream */
    uint64_t state_bytes;     /* added for good (KV) */
} llmem_op_memory;

typedef llmem_op_memory (*llmem_op_memory_fn)(void *ctx, const llmem_op_query *q);

typedef struct llmem_predictor_options {
    llmem_shape shape;          /* required */
    uint32_t weight_type;       /* llmem_dtype of the matrices; default F16 */
    size_t kv_elem_bytes;       /* default 2 (f16) */
    unsigned threads;           /* default 2 */
    uint32_t max_seq_len;       /* worst case for data-dependent ops; default the shape's context */
    uint32_t block_tokens;      /* KV is held in blocks of this many tokens; default 16 */
    size_t kv_slab_bytes;       /* the KV manager takes blocks from the pool in slabs of this many bytes per
                                   layer; 0 = what llmem_engine asks for (2 blocks, at least a page) */
    double safety_factor;       /* on data-dependent bytes in a reserve; default 1.2 */
    bool activations_apart;     /* activations do not come from the pool the reserve is for (llmem_engine
                                   keeps them in an arena of its own): reserves cover KV only */
} llmem_predictor_options;

LLMEM_API llmem_predictor_options llmem_predictor_options_default(void);

typedef struct llmem_prediction {
    uint64_t weights_bytes;
    uint64_t kv_bytes_per_token;   /* all layers, K and V */
    uint64_t kv_bytes;             /* after the step: batch x (context + tokens), in whole blocks */
    uint64_t activation_bytes;     /* peak during the step, at the given context */
    llmem_op_kind peak_op;         /* the op at the peak */
    uint64_t reserve_bytes;        /* to take before the step: the KV slabs it may add (each sequence may
                                      start a slab per layer) and the activation peak with data-dependent
                                      ops times the safety factor */
    uint64_t corrected_activation_bytes; /* the corrector's estimate when it is in use, else activation_bytes */
    uint64_t corrected_reserve_bytes;    /* reserve_bytes with the corrected activation peak in place of the
                                            formula's (its data-dependent share still times the safety
                                            factor); = reserve_bytes while the corrector is not in use */
} llmem_prediction;

/* LLMEM_EINVAL for an incomplete shape or a safety factor below 1. */
LLMEM_API llmem_status llmem_predictor_create(const llmem_predictor_options *o, llmem_predictor **out);
LLMEM_API void llmem_predictor_destroy(llmem_predictor *p);

/* Replace the memory function of one op kind. */
LLMEM_API llmem_status llmem_predictor_register(llmem_predictor *p, llmem_op_kind kind, llmem_op_memory_fn fn,
                                                void *ctx, bool data_dependent);

/* The memory of a step: stage PREFILL or DECODE (DECODE means tokens = 1),
 * LOAD and IDLE give weights alone. */
LLMEM_API llmem_status llmem_predictor_predict(const llmem_predictor *p, llmem_stage stage, uint32_t batch,
                                               uint32_t tokens, uint32_t context, llmem_prediction *out);

/* A measured activation peak for a step of batch x tokens. */
LLMEM_API llmem_status llmem_predictor_observe(llmem_predictor *p, uint32_t batch, uint32_t tokens,
                                               uint32_t context, uint64_t measured_bytes);

/* The fields of llmem_predictor_stats after struct_size, in order: X(kind, value type,
 * name, help) for each; the struct and its schema are both made from it. */
#define LLMEM_PREDICTOR_STATS_FIELDS(X) \
    X(COUNTER, U64, observations, "Measured peaks fed to the corrector.") \
    /* mean |predicted - measured| / measured over the observations */ \
    X(GAUGE, DOUBLE, formula_error, "Mean relative error of the op formulas on the observations.") \
    /* the same for the corrector, each scored before it was added (0: none yet) */ \
    X(GAUGE, DOUBLE, corrector_error, "Mean relative error of the corrector, each scored before it was added.") \
    X(GAUGE, U64, corrector_in_use, "1 when the corrector predicts better than the formulas.")

typedef struct llmem_predictor_stats {
    size_t struct_size;
    LLMEM_PREDICTOR_STATS_FIELDS(LLMEM_STATS_MEMBER)
} llmem_predictor_stats;

LLMEM_API llmem_status llmem_predictor_get_stats(const llmem_predictor *p, llmem_predictor_stats *out);
LLMEM_API const llmem_stats_schema *llmem_predictor_stats_schema(void);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_PREDICTOR_H */
