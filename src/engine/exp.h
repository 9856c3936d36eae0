/*
 * exp.h - a vectorisable expf for the engine's softmax and SwiGLU. Private
 * to llmem.
 *
 * Why not libm. glibc's expf is a scalar call (~10 ns a value here); a
 * prefill step takes hundreds of thousands of them in SwiGLU and attention,
 * a sizeable share of its time. This one runs 8 lanes per AVX2 instruction
 * sequence and has a portable twin that gives the same bits.
 *
 * The algorithm (both forms, operation for operation):
 *   1. NaN returns x + x (quiet, payload kept); otherwise x is clamped to
 *      [-104, 89]: below -104 expf is 0 after rounding (e^-104 < half the
 *      smallest subnormal), above 89 it is +inf, and the clamp keeps 2^n
 *      below in range. +-inf and huge inputs fall out of the clamp.
 *   2. n = nearest integer to x log2(e), by adding and subtracting
 *      1.5 * 2^23 around one FMA (ties to even, as the hardware rounds).
 *   3. r = x - n ln2 in two FMAs, ln2 split into a float hi part and the
 *      float nearest the remainder: |r| <= ln2/2 + tiny, error ~2^-26.
 *   4. e^r by its Taylor polynomial of degree 7 in Horner form (FMAs):
 *      the truncation error r^8/8! < 6e-9 relative is under 0.1 ulp.
 *   5. e^x = p * 2^n1 * 2^n2 with n1 = n >> 1 (arithmetic), n2 = n - n1,
 *      each in [-75, 64] so each 2^k is a normal float: the first product
 *      is exact, the second rounds once, so subnormal results are rounded
 *      correctly from p and results past FLT_MAX become +inf, where one
 *      2^n factor would itself under- or overflow.
 * Error: within 2 ulp of glibc's correctly rounded expf over the whole
 * range (tests/test_exp.c measures it over [-110, 95] in steps of 2^-10).
 *
 * The AVX2 form uses only exact or correctly rounded operations (add, mul,
 * FMA, min, max, conversions of integral values), as the portable form
 * does through fmaf and plain arithmetic (ISO C mode: no contraction), so
 * the two agree bitwise for every input.
 */
#ifndef LLMEM_ENGINE_EXP_H
#define LLMEM_ENGINE_EXP_H

#include <stddef.h>

#define LLMEM__EXP_LO (-104.0f)
#define LLMEM__EXP_HI 89.0f
#define LLMEM__EXP_LOG2E 0x1.715476p+0f
#define LLMEM__EXP_SHIFT 0x1.8p23f    /* adding it rounds a float below 2^22 to an integer */
#define LLMEM__EXP_LN2_HI 0x1.62e430p-1f
#define LLMEM__EXP_LN2_LO (-0x1.05c610p-29f) /* ln2 - LN2_HI, rounded */
/* 1/k! for k = 2..7, rounded to float. */
#define LLMEM__EXP_C2 0x1p-1f
#define LLMEM__EXP_C3 0x1.555556p-3f
#define LLMEM__EXP_C4 0x1.555556p-5f
#define LLMEM__EXP_C5 0x1.111112p-7f
#define LLMEM__EXP_C6 0x1.6c16c2p-10f
#define LLMEM__EXP_C7 0x1.a01a02p-13f

/* e^x as described above, one value (the portable form). */
float llmem__expf(float x);

/* y[i] = llmem__expf(x[i]) for i < n (y may be x): the portable loop and
 * the AVX2 one (which falls back to the portable loop where the compiler
 * cannot target AVX2). kernels.c picks one per path (llmem__exp_rows). */
void llmem__exp_rows_portable(float *y, const float *x, size_t n);
void llmem__exp_rows_avx2(float *y, const float *x, size_t n);

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define LLMEM__EXP_X86 1
#include <immintrin.h>

/* Eight lanes of llmem__expf, for inlining into AVX2 kernels. */
static inline __attribute__((always_inline, target("avx2,fma"))) __m256 llmem__expf8_avx2(__m256 x)
{
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    const __m256 xnan = _mm256_add_ps(x, x);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(LLMEM__EXP_LO)), _mm256_set1_ps(LLMEM__EXP_HI));
    const __m256 shift = _mm256_set1_ps(LLMEM__EXP_SHIFT);
    __m256 nf = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(LLMEM__EXP_LOG2E), shift), shift);
    __m256 r = _mm256_fnmadd_ps(nf, _mm256_set1_ps(LLMEM__EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(nf, _mm256_set1_ps(LLMEM__EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(LLMEM__EXP_C7);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(LLMEM__EXP_C6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(LLMEM__EXP_C5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(LLMEM__EXP_C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(LLMEM__EXP_C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(LLMEM__EXP_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i n = _mm256_cvtps_epi32(nf); /* nf is integral: exact */
    __m256i n1 = _mm256_srai_epi32(n, 1), n2 = _mm256_sub_epi32(n, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
    return _mm256_blendv_ps(y, xnan, nan);
}
#endif

#endif
