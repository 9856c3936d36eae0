/*
 * llmem/shape.h - the shape of a llama-family model: what its weights, KV
 * cache and activations weigh, without the weights.
 *
 * Shapes come from built-in presets (the published configurations of
 * llama-2-7b, llama-2-13b and yi-coder-1.5b, and the tiny models in
 * ../shared/models) or from a Hugging Face config.json (parsed with cJSON;
 * every field is checked: a missing or absurd value is LLMEM_EFORMAT naming
 * the field). The KV manager, the replay tool and the planner size memory
 * from them.
 */
#ifndef LLMEM_SHAPE_H
#define LLMEM_SHAPE_H

#include <stddef.h>
#include <stdint.h>

#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_shape {
    char name[64];
    uint32_t layers;
    uint32_t hidden;       /* model dimension */
    uint32_t heads;
    uint32_t kv_heads;     /* < heads: grouped-query attention */
    uint32_t head_dim;     /* hidden / heads unless the config says otherwise */
    uint32_t ffn;          /* intermediate (SwiGLU) dimension */
    uint32_t vocab;
    uint32_t max_ctx;      /* context length */
    double rope_theta;
    int tied_embeddings;   /* classifier shares the embedding matrix */
} llmem_shape;

/* A preset by name ("llama-2-7b", "llama-2-13b", "yi-coder-1.5b",
 * "tiny-15m", "stories260k", "tiny-random"). LLMEM_ENOTFOUND lists them. */
LLMEM_API llmem_status llmem_shape_preset(const char *name, llmem_shape *out);

/* The preset names, NULL-terminated. */
LLMEM_API const char *const *llmem_shape_preset_names(void);

/* Parse a Hugging Face config.json held in memory (len bytes, need not be
 * NUL-terminated). LLMEM_EFORMAT with the offending field in the message. */
LLMEM_API llmem_status llmem_shape_from_json(const char *json, size_t len, llmem_shape *out);

/* A preset name, or a path to a config.json. */
LLMEM_API llmem_status llmem_shape_load(const char *name_or_path, llmem_shape *out);

/* Parameters (embeddings, attention, FFN, norms, classifier). Wraps for a
 * shape whose count does not fit 64 bits: check such shapes (any shape a
 * user typed) with llmem_shape_sizes first. */
LLMEM_API uint64_t llmem_shape_params(const llmem_shape *s);

/* KV bytes per token over all layers (K and V) at elem_bytes per value.
 * Wraps as llmem_shape_params does. */
LLMEM_API uint64_t llmem_shape_kv_bytes_per_token(const llmem_shape *s, size_t elem_bytes);

/* Both of the above, overflow-checked: LLMEM_EOVERFLOW naming the product
 * that does not fit 64 bits; either output may be NULL. */
LLMEM_API llmem_status llmem_shape_sizes(const llmem_shape *s, size_t elem_bytes, uint64_t *params,
                                         uint64_t *kv_bytes_per_token);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_SHAPE_H */
