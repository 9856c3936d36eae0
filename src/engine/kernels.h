/*
 * kernels.h - the numeric kernels of the engine's forward pass. Private to
 * llmem.
 *
 * Matrices are as llmem/model.h gives them: a weight W of dims (n, d) is d
 * rows of n elements of type wtype (F32, F16, BF16, or a block type of
 * llmem/quant.h, n a whole number of its blocks), read in place from the
 * mapped file. Activations are f32,
 * row-major, one row per token. Kernels are vectorised for the machine they
 * run on (AVX2/FMA/F16C where present, chosen at run time, a portable path
 * otherwise) and allocate nothing.
 */
#ifndef LLMEM_ENGINE_KERNELS_H
#define LLMEM_ENGINE_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/model.h"

#include "../core/half.h"
#include "threads.h"

/* Y = X W^T: y[b][r] = sum_c W[r][c] * x[b][c] for b < batch, r < d.
 * x: batch x n, y: batch x d (y must not alias x). Split over the team by
 * rows of W; with batch > 1 each W row is read once for the whole batch
 * (prefill is matrix-matrix, not a token loop). th may be NULL (one
 * thread). For block types x is first quantised to int8 activation rows
 * in scratch (llmem__matmul_scratch_bytes(wtype, n, batch) bytes, 64-byte
 * aligned; unused, may be NULL, for F32/F16/BF16) and the products are
 * integer dot products (kernels_q.h). */
void llmem__matmul(llmem__threads *th, float *y, const float *x, const void *w, uint32_t wtype, size_t n, size_t d,
                   size_t batch, void *scratch);

/* The wtype llmem__matmul takes for a q4_K matrix repacked 8 rows
 * interleaved by llmem__q4k_x8_pack (kernels_q4k_x8.h): not a GGUF type. */
#define LLMEM__WTYPE_Q4K_X8 0x10000u
/* The same for q5_0 (llmem__q5_0_x8_pack). */
#define LLMEM__WTYPE_Q5_0_X8 0x10001u
/* And for q8_0 (llmem__q8_0_x8_pack). */
#define LLMEM__WTYPE_Q8_0_X8 0x10002u
/* And for q4_0 (llmem__q4_0_x8_pack). */
#define LLMEM__WTYPE_Q4_0_X8 0x10003u

/* The GGUF type a repacked wtype holds (its activation rows'); wtype itself otherwise. */
static inline uint32_t llmem__x8_base_type(uint32_t wtype)
{
    return wtype == LLMEM__WTYPE_Q4K_X8 ? (uint32_t)LLMEM_DTYPE_Q4_K
         : wtype == LLMEM__WTYPE_Q5_0_X8 ? (uint32_t)LLMEM_DTYPE_Q5_0
         : wtype == LLMEM__WTYPE_Q8_0_X8 ? (uint32_t)LLMEM_DTYPE_Q8_0
         : wtype == LLMEM__WTYPE_Q4_0_X8 ? (uint32_t)LLMEM_DTYPE_Q4_0 : wtype;
}

/* Bytes of scratch llmem__matmul needs for a batch over rows of n of wtype. */
size_t llmem__matmul_scratch_bytes(uint32_t wtype, size_t n, size_t batch);

/* One matrix of a group: y (batch x d) = X W^T for W of d rows of type. */
typedef struct llmem__mm {
    float *y;        /* batch x d; must not alias x or another matrix's y */
    const void *w;   /* d rows of n elements of type, as for llmem__matmul */
    uint32_t type;   /* a type llmem__matmul_supports */
    size_t d;        /* rows of w */
} llmem__mm;

/* The most matrices one run of llmem__matmul_group takes (a longer list
 * goes in runs of this many). */
#define LLMEM__MM_GROUP_MAX 4

/* llmem__matmul for each of mats[0 .. count) over the same x (batch x n),
 * bitwise the results of the separate calls, in one run of the team: x is
 * quantised once for each activation layout the block types among them
 * need (kernels_q.h: one for the 32-element types, one for the k-quants),
 * and the team's row split covers all the matrices' rows at once, so a
 * Q/K/V or gate/up projection wakes the team once instead of up to six
 * times. scratch: llmem__matmul_group_scratch_bytes(types, count, n,
 * batch) bytes, 64-byte aligned (may be NULL when that is 0). Allocates
 * nothing. */
void llmem__matmul_group(llmem__threads *th, const llmem__mm *mats, size_t count, const float *x, size_t n,
                         size_t batch, void *scratch);

/* Bytes of scratch llmem__matmul_group needs for matrices of these types
 * over rows of n: the sum over the distinct activation layouts, at least
 * each type's llmem__matmul_scratch_bytes. */
size_t llmem__matmul_group_scratch_bytes(const uint32_t *types, size_t count, size_t n, size_t batch);

/* Whether llmem__matmul takes this weight type. */
bool llmem__matmul_supports(uint32_t wtype);

/* Row `row` of a weight matrix (rows of n elements of type wtype) as f32:
 * embedding lookups, and converting 1-D tensors at load. */
void llmem__dequant_row(uint32_t wtype, const void *w, size_t row, size_t n, float *out);

/* o = x * w / sqrt(mean(x^2) + eps) (o may be x). */
void llmem__rmsnorm(float *o, const float *x, const float *w, size_t n, float eps);

/* In place, numerically stable (max subtracted); e^x by llmem__expf
 * (exp.h), the same bits on every path (kernels.c). */
void llmem__softmax(float *x, size_t n);

/* Rotary embedding at position pos over n_heads heads of head_dim, rotating
 * adjacent pairs (v[2i], v[2i+1]) of the first rope_dim dims of each head
 * by pos * theta^(-2i / rope_dim), computed as run.c does
 * (1.0f / powf(theta, 2i / (float)rope_dim)). */
void llmem__rope(float *v, size_t n_heads, size_t head_dim, size_t rope_dim, size_t pos, float theta);

/* a = silu(a) * b, element-wise (SwiGLU); e^x by llmem__expf, the same
 * bits on every path. */
void llmem__swiglu(float *a, const float *b, size_t n);

/* y[i] = llmem__expf(x[i]) on the current path (y may be x): the vector
 * exp softmax and SwiGLU use, exposed for tests. */
void llmem__exp_rows(float *y, const float *x, size_t n);

/* llmem__swiglu split over the team th when n is large (a prefill step),
 * one thread otherwise; the same results either way. */
void llmem__swiglu_team(llmem__threads *th, float *a, const float *b, size_t n);

/* For each of `rows` rows of n: x[r] += add[r] (llmem__axpy by 1; none
 * when add is NULL), then o[r] = llmem__rmsnorm(x[r]); the rows split over
 * the team th when there are many, with the same results. */
void llmem__rmsnorm_rows(llmem__threads *th, float *o, float *x, const float *add, const float *w, size_t n,
                         size_t rows, float eps);

float llmem__dot(const float *a, const float *b, size_t n);

/* y += alpha * x */
void llmem__axpy(float *y, float alpha, const float *x, size_t n);

/* Attention over a run of cache rows x + j * stride (j < rows, stride in
 * floats), bitwise what the row-by-row loops give on the same path:
 * dot_rows: out[j] = llmem__dot(q, k + j * stride, n) * scale;
 * axpy_rows: llmem__axpy(y, alpha[j], x + j * stride, n) for j = 0, 1, ...
 * in turn (y held in registers across the rows). */
void llmem__dot_rows(float *out, const float *q, const float *k, size_t stride, size_t rows, size_t n, float scale);
void llmem__axpy_rows(float *y, const float *alpha, const float *x, size_t stride, size_t rows, size_t n);

/* The same over an f16 KV cache (k, x and stride in halves): bitwise what
 * dot_rows and axpy_rows give on the rows converted to float (an exact
 * conversion), on every path, with the conversion in the loads. */
void llmem__dot_rows_f16(float *out, const float *q, const uint16_t *k, size_t stride, size_t rows, size_t n,
                         float scale);
void llmem__axpy_rows_f16(float *y, const float *alpha, const uint16_t *x, size_t stride, size_t rows, size_t n);

/* h[i] = llmem__f32_to_f16(f[i]) for i < n, the same bits on every path:
 * the store of a K or V row into an f16 cache. */
void llmem__f16_from_f32_row(uint16_t *h, const float *f, size_t n);

/* IEEE half <-> float (round to nearest even): core/half.h. */

/* The instruction set the kernels run on: "avx2" (AVX2 + FMA + F16C, chosen
 * at run time), "avx2+vnni" (also AVX-VNNI for the block types),
 * "avx2+avx512vnni" (also AVX-512 + AVX512-VNNI for the block types) or
 * "portable": every vector path's name starts with "avx2". */
const char *llmem__kernels_isa(void);

/* Whether this CPU runs the path named (one of llmem__kernels_isa's
 * names) and it was built: for tests that run every path the machine can,
 * not only the dispatched one. Unknown names: false. */
bool llmem__kernels_path_available(const char *name);

/* Force the portable path (true) or return to the best one (false): for
 * tests and benchmarks that compare the two. Calls already running keep
 * the path they started with. */
void llmem__kernels_force_portable(bool on);

#endif
