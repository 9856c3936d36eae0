/*
 * kernels_q_avx512.c - the integer dot products of kernels_q_x86.h compiled
 * for AVX2 + FMA + F16C + AVX-512 (F, VL, BW) + AVX512-VNNI, behind a target
 * attribute so the library itself needs no -m flags; kernels.c picks the
 * path at run time. The 256-bit kernels use the EVEX vpdpbusd (no VEX
 * AVX-VNNI needed: Zen 4, Ice Lake and later Xeons have only this one),
 * and the prefill kernels of the 32-element types and of q8_0 repacked run
 * 16 weight rows a pass in 512-bit registers (KQ_AVX512). Where the
 * compiler cannot target it, the function is the reference
 * (kernels_q_path.h).
 */
#define KQ_ISA avx512
#define KQ_TARGET_STR "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni"
#define KQ_VNNI 1
#define KQ_AVX512 1
#define KQ_MIN_GCC 8
#include "kernels_q_path.h"
