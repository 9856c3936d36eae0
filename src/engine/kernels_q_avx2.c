/*
 * kernels_q_avx2.c - the integer dot products of kernels_q_x86.h compiled for
 * AVX2 + FMA + F16C, behind a target attribute so the library
 * itself needs no -m flags; kernels.c picks the path at run time. Where
 * the compiler cannot target it, the function is the reference
 * (kernels_q_path.h).
 */
#define KQ_ISA avx2
#define KQ_TARGET_STR "avx2,fma,f16c"
#define KQ_VNNI 0
#define KQ_MIN_GCC 5
#include "kernels_q_path.h"
