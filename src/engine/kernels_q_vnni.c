/*
 * kernels_q_vnni.c - the integer dot products of kernels_q_x86.h compiled for
 * AVX2 + FMA + F16C + AVX-VNNI, behind a target attribute so the library
 * itself needs no -m flags; kernels.c picks the path at run time. Where
 * the compiler cannot target it, the function is the reference
 * (kernels_q_path.h).
 */
#define KQ_ISA vnni
#define KQ_TARGET_STR "avx2,fma,f16c,avxvnni"
#define KQ_VNNI 1
#define KQ_MIN_GCC 11
#include "kernels_q_path.h"
