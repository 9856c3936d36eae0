/*
 * kernels_q_avx2.c - the integer dot products of kernels_q_x86.h compiled for
 * AVX2 + FMA + F16C, behind a target attribute so the library
 * itself needs no -m flags; kernels.c picks the path at run time. Where
 * the compiler cannot target it, the function is the reference.
 */
#include "kernels_q.h"
#include "kernels_q4k_x8.h"

#if (defined(__x86_64__) || defined(__i386__)) && \
    (defined(__clang__) ? __clang_major__ >= 12 : (defined(__GNUC__) && __GNUC__ >= 5))
#define KQ_TARGET_STR "avx2,fma,f16c"
#define KQ_VNNI 0
#define KQ_EXPORT llmem__qrows_avx2
#define KQ_EXPORT_X8 llmem__q4k_x8_rows_avx2
#define KQ_EXPORT_X8_Q5_0 llmem__q5_0_x8_rows_avx2
#include "kernels_q_x86.h"
const bool llmem__qrows_avx2_built = true;
#else
void llmem__qrows_avx2(float *y, const void *act, const void *w, uint32_t wtype, size_t n, size_t d, size_t batch,
                     size_t r0, size_t r1)
{
    llmem__qrows_ref(y, act, w, wtype, n, d, batch, r0, r1);
}
void llmem__q4k_x8_rows_avx2(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch, size_t r0,
                             size_t r1)
{
    llmem__q4k_x8_rows_ref(y, act, w, n, d, batch, r0, r1);
}
void llmem__q5_0_x8_rows_avx2(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch,
                              size_t r0, size_t r1)
{
    llmem__q5_0_x8_rows_ref(y, act, w, n, d, batch, r0, r1);
}
const bool llmem__qrows_avx2_built = false;
#endif
