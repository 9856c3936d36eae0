/*
 * synth_model.h - the tests' synthetic llama model: a GGUF file of any
 * small shape and weight type, with deterministic weights, for tests that
 * need a model but not a trained one (test_engine's weight types, rope and
 * tied classifier; test_fault_campaign's engine under faults).
 *
 * Weights are values in [-0.5, 0.5) from a mix of (tensor index, element);
 * norm vectors are 1 + a quarter of that. Norms are always f32; the other
 * tensors are `type` (F32, F16, BF16 or Q8_0, rounded to nearest even).
 * The same shape and type always give the same bytes.
 */
#ifndef LLMEM_TEST_SYNTH_MODEL_H
#define LLMEM_TEST_SYNTH_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "llmem/model.h"

typedef struct test_synth_model {
    uint32_t dim, ffn, heads, kv_heads, layers, vocab;
    uint32_t ctx;      /* llama.context_length */
    uint32_t type;     /* llmem_dtype of the non-norm tensors */
    float theta;       /* llama.rope.freq_base */
    uint32_t rope_dim; /* llama.rope.dimension_count */
    bool tied;         /* no output.weight: token_embd serves as the classifier */
} test_synth_model;

/* The llama keys every test model starts with: general.architecture
 * "llama", llama.context_length, embedding_length, block_count,
 * feed_forward_length, attention.head_count, and attention.head_count_kv
 * unless kv_heads is 0. Fails the test on any error. */
void test_gguf_llama_keys(llmem_gguf_writer *w, uint32_t ctx, uint32_t dim, uint32_t layers, uint32_t ffn,
                          uint32_t heads, uint32_t kv_heads);

/* Write the model to path (replacing it); fails the test on any error. */
void test_synth_write(const test_synth_model *sm, const char *path);

#endif
