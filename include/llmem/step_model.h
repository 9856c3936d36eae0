/*
 * llmem/step_model.h - how long one engine step takes, as a function of
 * what it computes: the clock of a simulated engine (llmem/sched.h).
 *
 * A step is described by its shape (llmem_step_shape): the tokens it
 * prefills, the sequences it decodes, the attention work (query-key pairs)
 * and the device bytes it copies. Two models:
 *  - ROOFLINE, for hardware we do not have (the H100 defaults `llmem
 *    replay` publishes): overhead + max(flops / (peak_flops * mfu),
 *    bytes / bandwidth), flops = 2 * params per token + attn_flops_per_pair
 *    per query-key pair, bytes = the weights read once + every KV byte
 *    decode attention reads + the KV prefill writes + 2 x the bytes copied;
 *  - LINEAR, for an engine we can measure: c0 + c_prefill_token x prefill
 *    tokens + c_decode_seq x decode sequences + c_attn_pair x query-key
 *    pairs, its coefficients a least-squares fit (llmem_step_model_fit) of
 *    measured steps: the steps of a real run (llmem/replay.h fit_steps:
 *    what `llmem replay --engine` prints) or a grid of step shapes
 *    measured on an idle engine (llmem_step_model_calibrate).
 */
#ifndef LLMEM_STEP_MODEL_H
#define LLMEM_STEP_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/shape.h"
#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_engine llmem_engine;

/* What one step computed. */
typedef struct llmem_step_shape {
    uint32_t sequences;        /* items in the step */
    uint64_t prefill_tokens;   /* tokens of items bringing a prompt (or a chunk of one) */
    uint32_t decode_seqs;      /* items bringing one token to a sequence that holds some */
    double attn_pairs;         /* query-key pairs attention computes: each new token attends to every
                                  position up to its own */
    double decode_kv_tokens;   /* KV tokens decode attention reads (the decoding sequences' lengths) */
    uint64_t copy_bytes;       /* device bytes copied during the step (bucket growth, copy-on-write) */
} llmem_step_shape;

typedef enum llmem_step_model_kind {
    LLMEM_STEP_ROOFLINE = 0,
    LLMEM_STEP_LINEAR = 1
} llmem_step_model_kind;

typedef struct llmem_step_model {
    llmem_step_model_kind kind;
    /* ROOFLINE */
    double bandwidth;          /* bytes/s */
    double peak_flops;         /* flop/s */
    double mfu;                /* fraction of peak compute reached, (0, 1] */
    double overhead_s;         /* per step */
    double params;             /* model parameters (2 flops each per token) */
    double weights_bytes;      /* read once a step */
    double kv_bytes_per_token; /* all layers, K and V */
    double attn_flops_per_pair; /* 4 x layers x heads x head_dim */
    /* LINEAR: seconds = c0 + c_prefill_token x prefill_tokens + c_decode_seq x decode_seqs
     *                  + c_attn_pair x attn_pairs */
    double c0, c_prefill_token, c_decode_seq, c_attn_pair;
} llmem_step_model;

/* The roofline of a model of this shape on H100-SXM-class defaults
 * (3.35e12 B/s, 989e12 flop/s dense bf16, mfu 0.5, 0.3 ms a step), weights
 * of weight_elem_bytes and KV of kv_elem_bytes per value. */
LLMEM_API llmem_step_model llmem_step_model_roofline(const llmem_shape *shape, size_t weight_elem_bytes,
                                                     size_t kv_elem_bytes);

/* A LINEAR model with these coefficients (seconds). */
LLMEM_API llmem_step_model llmem_step_model_linear(double c0, double c_prefill_token, double c_decode_seq,
                                                   double c_attn_pair);

/* Seconds for a step of this shape (never negative). */
LLMEM_API double llmem_step_model_time(const llmem_step_model *m, const llmem_step_shape *s);

/* LLMEM_EINVAL for an unknown kind or a model whose figures are not finite
 * and positive where they must be (bandwidth, peak_flops, mfu in (0, 1]). */
LLMEM_API llmem_status llmem_step_model_check(const llmem_step_model *m);

/* Least squares: the LINEAR coefficients that best fit seconds[i] for
 * shapes[i], i < n, none negative (a coefficient that comes out negative is
 * dropped and the rest refitted). relative: minimise the squared relative
 * error (a grid of very different steps) instead of the squared seconds (a
 * real run's steps: the fit then keeps their total). *rel_error
 * (optional): mean |fit - measured| / measured. LLMEM_EINVAL for n < 4 or
 * a singular system. */
LLMEM_API llmem_status llmem_step_model_fit(const llmem_step_shape *shapes, const double *seconds, size_t n,
                                            bool relative, llmem_step_model *out, double *rel_error);

typedef struct llmem_step_calibration {
    size_t struct_size;
    uint32_t points;           /* step shapes measured */
    uint32_t repeats;          /* each measured this many times, the median kept */
    double rel_error;          /* of the fit, over the points */
    double seconds;            /* the calibration's own wall time */
} llmem_step_calibration;

/* Measure steps of a real engine over a grid of shapes (prefill chunks of
 * 1..max_step_tokens tokens after contexts of 0..max_seq_len / 2, decode
 * batches of 1..max_seqs sequences at several context lengths), each
 * `repeats` times (default 3 for 0), and fit a LINEAR model. The engine
 * must be idle (no live sequences); it is left so. */
LLMEM_API llmem_status llmem_step_model_calibrate(llmem_engine *e, uint32_t repeats, llmem_step_model *out,
                                                  llmem_step_calibration *report);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_STEP_MODEL_H */
