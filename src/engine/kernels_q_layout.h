/*
 * kernels_q_layout.h - the activation-row views and block sizes shared by
 * kernels_q.c (the reference kernels) and kernels_q_x86.h (the vector
 * kernels, compiled once per instruction set). Private to llmem; layouts
 * in kernels_q.h and model/quant_internal.h.
 */
#ifndef LLMEM_ENGINE_KERNELS_Q_LAYOUT_H
#define LLMEM_ENGINE_KERNELS_Q_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/model.h"

#include "../model/quant_internal.h"

static inline bool is_k(uint32_t t) { return t >= LLMEM_DTYPE_Q2_K && t <= LLMEM_DTYPE_Q6_K; }

static inline size_t round64(size_t b) { return (b + 63) & ~(size_t)63; }

typedef struct a8 {
    const int8_t *qs;
    const float *d, *s;
    const int32_t *xs; /* the integer sum of each block's 32 qs */
} a8;

typedef struct a8k {
    const int8_t *qs;
    const int16_t *bs;
    const float *d;
} a8k;

static inline a8 a8_view(const void *row, size_t n)
{
    const uint8_t *p = row;
    a8 v = {(const int8_t *)p, (const float *)(p + n), (const float *)(p + n) + n / 32,
            (const int32_t *)(const void *)(p + n + 8 * (n / 32))};
    return v;
}

static inline a8k a8k_view(const void *row, size_t n)
{
    const uint8_t *p = row;
    a8k v = {(const int8_t *)p, (const int16_t *)(p + n), (const float *)(p + n + 2 * (n / 16))};
    return v;
}

static inline size_t block_bytes(uint32_t t)
{
    switch (t) {
    case LLMEM_DTYPE_Q4_0: return sizeof(llmem__q4_0);
    case LLMEM_DTYPE_Q4_1: return sizeof(llmem__q4_1);
    case LLMEM_DTYPE_Q5_0: return sizeof(llmem__q5_0);
    case LLMEM_DTYPE_Q5_1: return sizeof(llmem__q5_1);
    case LLMEM_DTYPE_Q8_0: return sizeof(llmem__q8_0);
    case LLMEM_DTYPE_Q2_K: return sizeof(llmem__q2_k);
    case LLMEM_DTYPE_Q3_K: return sizeof(llmem__q3_k);
    case LLMEM_DTYPE_Q4_K: return sizeof(llmem__q4_k);
    case LLMEM_DTYPE_Q5_K: return sizeof(llmem__q5_k);
    default: return sizeof(llmem__q6_k);
    }
}

#endif
