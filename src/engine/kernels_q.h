/*
 * kernels_q.h - integer dot products of quantised weight rows against
 * activations quantised once per matmul (kernels_q.c). Private to llmem;
 * kernels.c dispatches to these and tests call them directly.
 *
 * Activation rows. A matmul over a block-type weight first quantises each
 * row of x (n f32, n a whole number of the weight's blocks) to one of two
 * layouts, each a struct of arrays so the int8 values are contiguous:
 *
 *   A8   (for q4_0, q4_1, q5_0, q5_1, q8_0): int8 qs[n], then float d[n/32]
 *        (the block's scale amax/127, rounded to f16 as a Q8_0 scale
 *        is), float s[n/32] (d * the block's sum of qs, before d's
 *        rounding, itself rounded to f16: the minimum's term of q4_1/q5_1),
 *        int32 xs[n/32] (the block's exact sum of qs: the vector kernels
 *        take the signed types' levels unsigned, q + bias, and subtract
 *        bias * xs)
 *   A8K  (for the k-quants): int8 qs[n], then int16 bsums[n/16] (sums of
 *        16 qs), float d[n/256] (1 / the inverse scale -127 / the signed
 *        value of largest magnitude, in full precision)
 *
 * Values round half to even. Each row is padded to a multiple of 64
 * bytes; llmem__act_row_bytes gives the stride.
 */
#ifndef LLMEM_ENGINE_KERNELS_Q_H
#define LLMEM_ENGINE_KERNELS_Q_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whether the type is a block type the integer kernels take. */
bool llmem__is_qtype(uint32_t wtype);

/* Bytes of one quantised activation row of n elements for weights of
 * wtype (a multiple of 64); 0 if wtype is not a block type. */
size_t llmem__act_row_bytes(uint32_t wtype, size_t n);

/* The portable references: x (n f32) to an activation row for wtype, and
 * the dot product of weight row w (n elements of wtype) with it. */
void llmem__act_quantize_ref(uint32_t wtype, const float *x, size_t n, void *row);
float llmem__qdot_ref(uint32_t wtype, const void *w, const void *act, size_t n);

/* The vector paths (AVX2 + FMA + F16C; for the dot products also with
 * AVX-VNNI), when compiled; same contracts. Callers check the CPU
 * (kernels.c's dispatch). */
void llmem__act_quantize_avx2(uint32_t wtype, const float *x, size_t n, void *row);

/* y[b*d + r] for r in [r0, r1), b < batch: row r of w (rows of n elements
 * of wtype) against activation row b (stride llmem__act_row_bytes). Each
 * (r, b) is summed in one order that depends on n alone, so a batched
 * call gives bitwise the rows of batch-1 calls. */
void llmem__qrows_ref(float *y, const void *act, const void *w, uint32_t wtype, size_t n, size_t d, size_t batch,
                      size_t r0, size_t r1);
void llmem__qrows_avx2(float *y, const void *act, const void *w, uint32_t wtype, size_t n, size_t d, size_t batch,
                       size_t r0, size_t r1);
/* The same with AVX-VNNI's vpdpbusd (kernels_q_vnni.c): bitwise the AVX2
 * path's results. */
void llmem__qrows_vnni(float *y, const void *act, const void *w, uint32_t wtype, size_t n, size_t d, size_t batch,
                       size_t r0, size_t r1);

/* The same with AVX-512 + AVX512-VNNI (kernels_q_avx512.c): the EVEX
 * vpdpbusd, and 16 weight rows a pass in 512-bit registers for batches:
 * bitwise the AVX2 path's results. */
void llmem__qrows_avx512(float *y, const void *act, const void *w, uint32_t wtype, size_t n, size_t d, size_t batch,
                         size_t r0, size_t r1);

/* Whether the compiler built the vector paths (else they are the reference). */
extern const bool llmem__qrows_avx2_built, llmem__qrows_vnni_built, llmem__qrows_avx512_built;

#endif
