/*
 * llmem/sampler.h - choosing the next token from logits, as llama2.c's
 * run.c does, so a seeded run picks the same tokens:
 *  - temperature 0: argmax (the first of equal maxima);
 *  - else logits / temperature, softmax, a coin from xorshift64* (run.c's
 *    random_f32), then top-p (nucleus) sampling when 0 < top_p < 1 (the
 *    smallest set of most probable tokens whose mass passes top_p, found
 *    after dropping tokens under (1 - top_p) / (n - 1)), else sampling from
 *    the whole distribution.
 * All memory is taken at creation; sampling allocates nothing.
 */
#ifndef LLMEM_SAMPLER_H
#define LLMEM_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_sampler llmem_sampler;

typedef struct llmem_sampler_options {
    uint32_t vocab_size;    /* required */
    float temperature;      /* >= 0; default 0 (argmax) -- set 1.0 for plain sampling */
    float top_p;            /* in [0, 1]; 0 or 1 = off; default 0.9 as run.c */
    uint64_t seed;          /* xorshift state; 0 = run.c's default (time) is NOT used: 0 becomes 1 */
} llmem_sampler_options;

LLMEM_API llmem_sampler_options llmem_sampler_options_default(void);

/* LLMEM_EINVAL for a zero vocabulary, a negative or NaN temperature, top_p
 * outside [0, 1]. */
LLMEM_API llmem_status llmem_sampler_create(const llmem_sampler_options *o, llmem_sampler **out);
LLMEM_API void llmem_sampler_destroy(llmem_sampler *s);

/* Pick a token from logits[0..vocab_size) (modified in place when the
 * temperature is not 0). */
LLMEM_API int32_t llmem_sampler_sample(llmem_sampler *s, float *logits);

/* The argmax alone (no sampler needed). */
LLMEM_API int32_t llmem_logits_argmax(const float *v, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_SAMPLER_H */
