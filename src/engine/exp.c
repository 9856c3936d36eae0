/*
 * exp.c - llmem__expf and its row loops (the algorithm and its error
 * bound: exp.h).
 */
#include "exp.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* 2^k for k in [-126, 127], built from its exponent bits. */
static inline float pow2i(int32_t k)
{
    uint32_t u = (uint32_t)(k + 127) << 23;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float llmem__expf(float x)
{
    if (x != x) return x + x;
    x = x > LLMEM__EXP_LO ? x : LLMEM__EXP_LO; /* as _mm256_max_ps(x, lo) */
    x = x < LLMEM__EXP_HI ? x : LLMEM__EXP_HI; /* as _mm256_min_ps(x, hi) */
    float nf = fmaf(x, LLMEM__EXP_LOG2E, LLMEM__EXP_SHIFT) - LLMEM__EXP_SHIFT;
    float r = fmaf(-nf, LLMEM__EXP_LN2_HI, x);
    r = fmaf(-nf, LLMEM__EXP_LN2_LO, r);
    float p = LLMEM__EXP_C7;
    p = fmaf(p, r, LLMEM__EXP_C6);
    p = fmaf(p, r, LLMEM__EXP_C5);
    p = fmaf(p, r, LLMEM__EXP_C4);
    p = fmaf(p, r, LLMEM__EXP_C3);
    p = fmaf(p, r, LLMEM__EXP_C2);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    int32_t n = (int32_t)nf;
    /* n >> 1 rounded down, as the vector arithmetic shift (n may be odd
     * and negative; >> of a negative int is implementation-defined). */
    int32_t n1 = n >= 0 ? n / 2 : -((1 - n) / 2), n2 = n - n1;
    return p * pow2i(n1) * pow2i(n2);
}

void llmem__exp_rows_portable(float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) y[i] = llmem__expf(x[i]);
}

#ifdef LLMEM__EXP_X86
__attribute__((target("avx2,fma"))) void llmem__exp_rows_avx2(float *y, const float *x, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, llmem__expf8_avx2(_mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] = llmem__expf(x[i]);
}
#else
void llmem__exp_rows_avx2(float *y, const float *x, size_t n) { llmem__exp_rows_portable(y, x, n); }
#endif
