/*
 * kernels_q_path.h - one x86 path of the integer dot products, included
 * once by its .c file (kernels_q_avx2.c, kernels_q_vnni.c,
 * kernels_q_avx512.c) after it defines:
 *
 *     KQ_ISA          the path's name in its exports (avx2: llmem__qrows_avx2,
 *                     llmem__q4k_x8_rows_avx2, llmem__q5_0_x8_rows_avx2,
 *                     llmem__q4_0_x8_rows_avx2,
 *                     llmem__q8_0_x8_rows_avx2 and llmem__qrows_avx2_built)
 *     KQ_TARGET_STR   the target attribute the path compiles for
 *     KQ_VNNI         0 or 1 (kernels_q_x86.h)
 *     KQ_AVX512       1 for the AVX-512 path (EVEX vpdpbusd, 512-bit
 *                     prefill kernels; needs KQ_VNNI); 0 when undefined
 *     KQ_MIN_GCC      the oldest GCC that can target it (clang: 12)
 *
 * Where the compiler can, the exports are kernels_q_x86.h compiled for the
 * target; elsewhere they are the reference kernels and _built is false.
 */
#include "kernels_q.h"
#include "kernels_q4k_x8.h"

#define KQ_CAT2(a, b) a##b
#define KQ_CAT(a, b) KQ_CAT2(a, b)
#define KQ_EXPORT KQ_CAT(llmem__qrows_, KQ_ISA)
#define KQ_EXPORT_X8 KQ_CAT(llmem__q4k_x8_rows_, KQ_ISA)
#define KQ_EXPORT_X8_Q5_0 KQ_CAT(llmem__q5_0_x8_rows_, KQ_ISA)
#define KQ_EXPORT_X8_Q8_0 KQ_CAT(llmem__q8_0_x8_rows_, KQ_ISA)
#define KQ_EXPORT_X8_Q4_0 KQ_CAT(llmem__q4_0_x8_rows_, KQ_ISA)
#define KQ_BUILT KQ_CAT(KQ_EXPORT, _built)

#if (defined(__x86_64__) || defined(__i386__)) && \
    (defined(__clang__) ? __clang_major__ >= 12 : (defined(__GNUC__) && __GNUC__ >= KQ_MIN_GCC))
#include "kernels_q_x86.h"
const bool KQ_BUILT = true;
#else
void KQ_EXPORT(float *y, const void *act, const void *w, uint32_t wtype, size_t n, size_t d, size_t batch, size_t r0,
               size_t r1)
{
    llmem__qrows_ref(y, act, w, wtype, n, d, batch, r0, r1);
}
void KQ_EXPORT_X8(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch, size_t r0, size_t r1)
{
    llmem__q4k_x8_rows_ref(y, act, w, n, d, batch, r0, r1);
}
void KQ_EXPORT_X8_Q5_0(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch, size_t r0,
                       size_t r1)
{
    llmem__q5_0_x8_rows_ref(y, act, w, n, d, batch, r0, r1);
}
void KQ_EXPORT_X8_Q8_0(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch, size_t r0,
                       size_t r1)
{
    llmem__q8_0_x8_rows_ref(y, act, w, n, d, batch, r0, r1);
}
void KQ_EXPORT_X8_Q4_0(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch, size_t r0,
                       size_t r1)
{
    llmem__q4_0_x8_rows_ref(y, act, w, n, d, batch, r0, r1);
}
const bool KQ_BUILT = false;
#endif
