/*
 * tensor_mix.h - the allocation sequence of llama-2-7b forward passes, for
 * benchmarks: prefill of 16-512 tokens every eighth step, decode of
 * batches 1-8 otherwise; per layer the activations, q/k/v, attention scores
 * and FFN buffers an engine allocates, freed in the order it frees them;
 * request objects of 16 B - 1 KiB living across steps. Shapes are the
 * published configs. Deterministic for a seed.
 */
#ifndef LLMEM_BENCH_TENSOR_MIX_H
#define LLMEM_BENCH_TENSOR_MIX_H

#include <stddef.h>
#include <stdint.h>

typedef struct tensor_mix_ops {
    void *(*alloc)(void *ctx, size_t size); /* must not return NULL */
    void (*free)(void *ctx, void *ptr, size_t size);
    void *ctx;
} tensor_mix_ops;

/* A model's published shape. */
typedef struct tensor_mix_shape {
    const char *name;
    size_t dim, ffn, heads, kv_dim, vocab, layers;
} tensor_mix_shape;

extern const tensor_mix_shape tensor_mix_llama2_7b;    /* 4096, 11008, 32 heads, kv 4096, 32000, 32 layers */
extern const tensor_mix_shape tensor_mix_yi_coder_1_5b; /* 2048, 5504, 16 heads, kv 2048, 64000, 24 layers */

/* Run `steps` steps of a shape (NULL: llama-2-7b); returns the number of
 * allocations made. Each block gets one byte written, as an engine's first
 * touch. */
uint64_t tensor_mix_run(int steps, uint64_t seed, const tensor_mix_shape *shape, const tensor_mix_ops *ops);

/* Small objects of a long-running server: each step allocates and frees a
 * few of 48 fixed odd sizes (100 B - 24 KiB, Zipf-distributed: a handful
 * dominate) living for several steps. */
uint64_t object_mix_run(int steps, uint64_t seed, const tensor_mix_ops *ops);

#endif
