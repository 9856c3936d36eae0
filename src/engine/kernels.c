/*
 * kernels.c - the engine's numeric kernels: matmul over F32, F16, BF16 and
 * the block types (q4_0 .. q8_0, q2_k .. q6_k), and the small f32 kernels
 * around it.
 *
 * Dispatch. Two paths implement the hot kernels (matmul rows, dot, axpy,
 * f16 rows): a portable C one and, on x86-64 with GCC or Clang, one compiled
 * with __attribute__((target("avx2,fma,f16c"))) so the library itself needs
 * no -mavx2 (a third, "avx2+vnni", is that one with the block types' dot
 * products on AVX-VNNI where the CPU has it, and a fourth,
 * "avx2+avx512vnni", on AVX-512 + AVX512-VNNI, with 512-bit kernels for
 * the batches, and a fifth, "avx2+avx512vnni+amx", that one with the
 * repacked q8_0, q5_0 and q4_K batches on AMX-INT8 tiles (kernels_q_amx.c): the same results; the
 * last available of these is preferred). The path is picked once (pthread_once; CPUID for the features
 * and XGETBV for the OS saving the ymm state) and kept in a static table of
 * function pointers; llmem__kernels_force_portable switches to the
 * portable table for tests and benchmarks. A matmul reads the table once and
 * hands the same path to every thread of its run.
 *
 * Blocking. Y = X W^T splits the d rows of W over the team in parts of
 * MM_GRAIN rows (whole tiles, and whole cache lines of y for each thread).
 * A thread walks its rows in register tiles of R rows of W by B rows of X:
 * R x B accumulators, and per step of 8 elements R loads (converted to f32:
 * F16 by F16C, BF16 by a shift) and B loads of x
 * feed R x B FMAs. Batch 1 uses 8 x 1 tiles (8 independent FMA chains to
 * cover the FMA latency, the loads folded into the FMAs); a batch uses 4 x 2
 * tiles, looping over the whole batch for each tile of 4 rows, so a W row
 * comes from memory once per matmul and then from L1 for the other batch
 * rows: prefill is matrix-matrix work, not a loop of matrix-vector products.
 * The avx2+avx512vnni path runs batches of 4 and more in 8 x 4 tiles of
 * zmm registers, each zmm two of the ymm tile's accumulators side by side
 * (the same bits; f16 and bf16 widened to f32 a chunk at a time).
 *
 * Block types go another way (kernels_q.c): x is quantised once per matmul
 * to int8 activation rows in the caller's scratch (on the team when the
 * batch is large), then each weight row meets every activation row in
 * integer dot products, one weight row's blocks unpacked once for up to
 * four activation rows. The same split over the team and the same
 * batch-independent order hold there.
 *
 * Groups. Matrices that read the same x (Q, K, V; gate and up) go through
 * llmem__matmul_group: x is quantised once per activation layout (A8 for
 * the 32-element types, A8K for the k-quants), and one run of the team
 * splits the concatenation of all their rows, in MM_GRAIN grains counted
 * per matrix, so every part starts at a multiple of MM_GRAIN of its
 * matrix's rows, as a separate matmul's parts do. With a batch large
 * enough to quantise on the team the quantisation is that same run's first
 * phase: each thread quantises its share of the rows, a barrier
 * (llmem__threads_barrier), then the products; one wake of the team per
 * group instead of two per matrix. llmem__matmul is a group of one. Each
 * y is computed by the same kernel on the same rows as alone, so a group
 * gives the separate calls' bits.
 *
 * The summation-order invariant. Each y[b][r] is one dot product computed
 * by one thread, always in the same order, which depends on n alone:
 *
 *   lane l (0..7) of one accumulator takes the products of elements
 *   k = l, l + 8, l + 16, ... in increasing k (an FMA each on the AVX2
 *   path, a multiply then an add on the portable path); a last partial
 *   step is padded with zeros; then the lanes are summed as
 *   ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
 *
 * No tile shape, batch size, batch position, row position or thread count
 * enters that order, so on one machine and path a batched matmul gives
 * bitwise the same rows as batch-1 matmuls (batched prefill agrees with
 * token-by-token prefill), whatever the team. llmem__dot uses the same order
 * (llmem__dot(x, row) equals the matmul's y on F32 weights). The two paths
 * differ in rounding (FMA or not), so they agree with each other only
 * within tolerance.
 *
 * The library is built in ISO C mode, where GCC does not contract a * b + c
 * into an FMA: the portable path rounds as written, and FMAs happen only
 * where the intrinsics ask for them.
 *
 * Nothing here allocates: tails go through 8-element stack buffers.
 *
 * Why one file of about 1,000 lines: the portable and AVX2 paths of each
 * kernel sit side by side with the dispatch table that picks between them
 * and the matmul that calls through it, so a reader checks the summation
 * order above against both paths in one place; the static inline helpers
 * they share stay visible to the compiler in the hot loops. The block types
 * are already in kernels_q*.c.
 */
#include "kernels.h"
#include "exp.h"
#include "kernels_q.h"
#include "kernels_q_layout.h"
#include "kernels_q4k_x8.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/model.h"
#include "llmem/quant.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define KERNELS_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

#define MM_GRAIN 16             /* rows of W per part: whole tiles, whole lines of y */
#define MM_SERIAL_MACS 32768    /* below this many multiply-adds, one thread is faster than a run */

/* ---- f16 and bf16 ------------------------------------------------------- */

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

/* ---- weight rows ------------------------------------------------------- */

/* Bytes of one row of n elements (n a multiple of 32 for Q8_0). */
static inline size_t row_bytes(uint32_t type, size_t n)
{
    switch (type) {
    case LLMEM_DTYPE_F32: return n * 4;
    case LLMEM_DTYPE_F16: case LLMEM_DTYPE_BF16: return n * 2;
    default: return (size_t)llmem_dtype_bytes(type, n); /* block types */
    }
}

/* Elements k .. k+cnt-1 (cnt <= 8) of an F32/F16/BF16 row as f32 in
 * out[0..cnt), zeros after. Exact conversions: both paths see the same
 * values. */
static void load8_portable(uint32_t type, const void *row, size_t k, size_t cnt, float out[8])
{
    for (size_t i = cnt; i < 8; i++) out[i] = 0.0f;
    switch (type) {
    case LLMEM_DTYPE_F32: memcpy(out, (const float *)row + k, cnt * sizeof(float)); break;
    case LLMEM_DTYPE_F16:
        for (size_t i = 0; i < cnt; i++) out[i] = llmem__f16_to_f32(((const uint16_t *)row)[k + i]);
        break;
    default: /* BF16 */
        for (size_t i = 0; i < cnt; i++) out[i] = bf16_to_f32(((const uint16_t *)row)[k + i]);
        break;
    }
}

/* The fixed lane reduction of the summation-order invariant. */
static inline float hsum8_portable(const float a[8])
{
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

/* ---- the portable path -------------------------------------------------- */

#define PB 4 /* batch rows per pass over a W row on the portable path */

/* 8 weights from element k (k + 8 <= n) of a row; `type` is a constant
 * after inlining, so each type gets its own loop. */
static inline __attribute__((always_inline)) void load8_full(const uint32_t type, const void *row, size_t k,
                                                             float out[8])
{
    if (type == LLMEM_DTYPE_F32) {
        memcpy(out, (const float *)row + k, 8 * sizeof(float));
    } else if (type == LLMEM_DTYPE_F16) {
        for (int l = 0; l < 8; l++) out[l] = llmem__f16_to_f32(((const uint16_t *)row)[k + (size_t)l]);
    } else { /* BF16 */
        for (int l = 0; l < 8; l++) out[l] = bf16_to_f32(((const uint16_t *)row)[k + (size_t)l]);
    }
}

/* y[b*d + r] for r in [r0, r1), b < batch: each W row converted once per
 * PB batch rows; the lane loops are plain enough for the compiler to
 * vectorise with whatever the baseline ISA has (lane-wise, so the order of
 * the invariant holds). */
static inline __attribute__((always_inline)) void rows_portable_t(const uint32_t type, float *y, const float *x,
                                                                  const void *w, size_t n, size_t d, size_t batch,
                                                                  size_t r0, size_t r1)
{
    size_t rb = row_bytes(type, n), n8 = n & ~(size_t)7;
    for (size_t r = r0; r < r1; r++) {
        const void *row = (const char *)w + r * rb;
        for (size_t b0 = 0; b0 < batch; b0 += PB) {
            size_t nb = batch - b0 < PB ? batch - b0 : PB;
            const float *xr = x + b0 * n;
            float acc[PB][8] = {{0}};
            float wv[8];
            for (size_t k = 0; k < n8; k += 8) {
                load8_full(type, row, k, wv);
                for (size_t b = 0; b < nb; b++)
                    for (int l = 0; l < 8; l++) acc[b][l] += wv[l] * xr[b * n + k + (size_t)l];
            }
            if (n8 < n) { /* the zero-padded last step */
                float xv[8];
                load8_portable(type, row, n8, n - n8, wv);
                for (size_t b = 0; b < nb; b++) {
                    memset(xv, 0, sizeof xv);
                    memcpy(xv, xr + b * n + n8, (n - n8) * sizeof(float));
                    for (int l = 0; l < 8; l++) acc[b][l] += wv[l] * xv[l];
                }
            }
            for (size_t b = 0; b < nb; b++) y[(b0 + b) * d + r] = hsum8_portable(acc[b]);
        }
    }
}

static void rows_portable(float *y, const float *x, const void *w, uint32_t type, size_t n, size_t d, size_t batch,
                          size_t r0, size_t r1)
{
    switch (type) {
    case LLMEM_DTYPE_F32: rows_portable_t(LLMEM_DTYPE_F32, y, x, w, n, d, batch, r0, r1); break;
    case LLMEM_DTYPE_F16: rows_portable_t(LLMEM_DTYPE_F16, y, x, w, n, d, batch, r0, r1); break;
    default: rows_portable_t(LLMEM_DTYPE_BF16, y, x, w, n, d, batch, r0, r1); break;
    }
}

/* Element i of an F32 or F16 row as f32 (`type` a constant after
 * inlining): the attention runs read their cache rows in either type. */
static inline __attribute__((always_inline)) float row_elem(const uint32_t type, const void *row, size_t i)
{
    return type == LLMEM_DTYPE_F32 ? ((const float *)row)[i] : llmem__f16_to_f32(((const uint16_t *)row)[i]);
}

static inline __attribute__((always_inline)) float dot_portable_t(const uint32_t type, const float *a, const void *b,
                                                                   size_t n)
{
    float acc[8] = {0};
    for (size_t k = 0; k < n; k += 8) {
        size_t cnt = n - k < 8 ? n - k : 8;
        for (size_t l = 0; l < cnt; l++) acc[l] += a[k + l] * row_elem(type, b, k + l);
        for (size_t l = cnt; l < 8; l++) acc[l] += 0.0f; /* the zero padding, as the vector path does */
    }
    return hsum8_portable(acc);
}

static inline __attribute__((always_inline)) void axpy_portable_t(const uint32_t type, float *y, float alpha,
                                                                   const void *x, size_t n)
{
    for (size_t i = 0; i < n; i++) y[i] += alpha * row_elem(type, x, i);
}

static float dot_portable(const float *a, const float *b, size_t n) { return dot_portable_t(LLMEM_DTYPE_F32, a, b, n); }

static void axpy_portable(float *y, float alpha, const float *x, size_t n)
{
    axpy_portable_t(LLMEM_DTYPE_F32, y, alpha, x, n);
}

/* Attention's runs of cache rows (kernels.h), F32 or F16 (stride in
 * elements): the same order, row by row, as dot_portable and
 * axpy_portable on the rows converted to float. */
static inline __attribute__((always_inline)) void dot_rows_portable_t(const uint32_t type, float *out, const float *q,
                                                                       const void *k, size_t stride, size_t rows,
                                                                       size_t n, float scale)
{
    size_t sb = row_bytes(type, stride);
    for (size_t j = 0; j < rows; j++) out[j] = dot_portable_t(type, q, (const char *)k + j * sb, n) * scale;
}

static inline __attribute__((always_inline)) void axpy_rows_portable_t(const uint32_t type, float *y,
                                                                        const float *alpha, const void *x,
                                                                        size_t stride, size_t rows, size_t n)
{
    size_t sb = row_bytes(type, stride);
    for (size_t j = 0; j < rows; j++) axpy_portable_t(type, y, alpha[j], (const char *)x + j * sb, n);
}

static void dot_rows_portable(float *out, const float *q, const float *k, size_t stride, size_t rows, size_t n,
                              float scale)
{
    dot_rows_portable_t(LLMEM_DTYPE_F32, out, q, k, stride, rows, n, scale);
}

static void axpy_rows_portable(float *y, const float *alpha, const float *x, size_t stride, size_t rows, size_t n)
{
    axpy_rows_portable_t(LLMEM_DTYPE_F32, y, alpha, x, stride, rows, n);
}

static void dot_rows_f16_portable(float *out, const float *q, const uint16_t *k, size_t stride, size_t rows, size_t n,
                                  float scale)
{
    dot_rows_portable_t(LLMEM_DTYPE_F16, out, q, k, stride, rows, n, scale);
}

static void axpy_rows_f16_portable(float *y, const float *alpha, const uint16_t *x, size_t stride, size_t rows,
                                   size_t n)
{
    axpy_rows_portable_t(LLMEM_DTYPE_F16, y, alpha, x, stride, rows, n);
}

static void f16_from_f32_row_portable(uint16_t *h, const float *f, size_t n)
{
    for (size_t i = 0; i < n; i++) h[i] = llmem__f32_to_f16(f[i]);
}

static void f16_row_portable(const uint16_t *h, size_t n, float *out)
{
    for (size_t i = 0; i < n; i++) out[i] = llmem__f16_to_f32(h[i]);
}

/* ---- softmax and SwiGLU ------------------------------------------------------
 *
 * Both paths compute the same bits: e^x by llmem__expf or its 8-lane form
 * (exp.h: the same operations), and every other step in one order that the
 * portable loops spell out lane by lane. Softmax: the max over 8 lanes
 * (lane l takes the elements i = l (mod 8), `v > m ? v : m`, then the lanes
 * folded 0..7 the same way), the exps and their sum in 8 double lanes (the
 * same lanes, summed as ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))),
 * then each value divided by the sum rounded to float. SwiGLU:
 * a * (1 / (1 + e^-a)) * b, left to right. */

/* All -inf: nothing to prefer, uniform. Some +inf: they share the mass.
 * (x - max would be NaN in both cases.) All NaN (max -inf, no hits): left
 * as they are. */
static void softmax_inf(float *x, size_t n, float max)
{
    size_t hits = 0;
    for (size_t i = 0; i < n; i++) hits += x[i] == max;
    if (hits == 0) return;
    for (size_t i = 0; i < n; i++) x[i] = x[i] == max ? 1.0f / (float)hits : 0.0f;
}

static inline float max_fold8(const float m[8])
{
    float max = m[0];
    for (int l = 1; l < 8; l++) max = m[l] > max ? m[l] : max;
    return max;
}

static inline double hsum8d(const double a[8])
{
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

static void softmax_portable(float *x, size_t n)
{
    float m[8];
    for (int l = 0; l < 8; l++) m[l] = -INFINITY;
    for (size_t i = 0; i < n; i++) m[i % 8] = x[i] > m[i % 8] ? x[i] : m[i % 8];
    float max = max_fold8(m);
    if (max == -INFINITY || max == INFINITY) {
        softmax_inf(x, n, max);
        return;
    }
    double acc[8] = {0}; /* double lanes: exact enough for any vocabulary */
    for (size_t i = 0; i < n; i++) {
        x[i] = llmem__expf(x[i] - max);
        acc[i % 8] += x[i];
    }
    float s = (float)hsum8d(acc);
    for (size_t i = 0; i < n; i++) x[i] /= s;
}

static void swiglu_portable(float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float val = a[i];
        val *= 1.0f / (1.0f + llmem__expf(-val));
        a[i] = val * b[i];
    }
}

/* ---- the AVX2 + FMA + F16C path ----------------------------------------- */

#ifdef KERNELS_X86
#define X86_TARGET __attribute__((target("avx2,fma,f16c")))
#define X86_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))
/* Full unrolling of the tile loops, whose bounds are constants after
 * inlining: without it the accumulators stay in memory. */
#if defined(__clang__)
#define UNROLL _Pragma("unroll")
#else
#define UNROLL _Pragma("GCC unroll 8")
#endif

/* 8 weights from element k of a row; `type` is a constant after inlining. */
X86_INLINE __m256 x86_load8(const uint32_t type, const void *row, size_t k)
{
    if (type == LLMEM_DTYPE_F32) return _mm256_loadu_ps((const float *)row + k);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + k));
    if (type == LLMEM_DTYPE_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); /* BF16 */
}

/* ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)), as hsum8_portable. */
X86_INLINE float x86_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One R x B register tile: y[b*d + r] for rows r0..r0+R-1 of W and batch
 * rows 0..B-1 of x (x and y already offset to the first batch row). type,
 * R and B are constants after inlining, and the loops unroll, so the
 * accumulators live in registers. */
X86_INLINE void x86_tile(const uint32_t type, const int R, const int B, const void *w, size_t n, size_t r0,
                         const float *x, float *y, size_t d, const char *ahead)
{
    size_t rb = row_bytes(type, n);
    const char *wr[8];
    __m256 acc[8][2], wv[8];
UNROLL
    for (int r = 0; r < R; r++) wr[r] = (const char *)w + (r0 + (size_t)r) * rb;
UNROLL
    for (int r = 0; r < R; r++)
UNROLL
        for (int b = 0; b < B; b++) acc[r][b] = _mm256_setzero_ps();

    {
        size_t k = 0;
        for (; k + 8 <= n; k += 8) {
            /* The same region of the tile after next (ahead, contiguous
             * rows): R * 8 weights' bytes a step, so the fetches keep pace
             * with the loads. The R interleaved row streams alone kept
             * fewer lines in flight than one linear stream (f16 decode
             * moved 13.5 GB/s where f32 moved 18.6). */
            if (ahead)
                for (size_t o = 0; o < (size_t)R * row_bytes(type, 8); o += 64)
                    _mm_prefetch(ahead + k / 8 * (size_t)R * row_bytes(type, 8) + o, _MM_HINT_T0);
UNROLL
            for (int r = 0; r < R; r++) wv[r] = x86_load8(type, wr[r], k);
UNROLL
            for (int b = 0; b < B; b++) {
                __m256 xv = _mm256_loadu_ps(x + (size_t)b * n + k);
UNROLL
                for (int r = 0; r < R; r++) acc[r][b] = _mm256_fmadd_ps(wv[r], xv, acc[r][b]);
            }
        }
        if (k < n) { /* the zero-padded last step */
            float buf[8];
            for (int r = 0; r < R; r++) {
                load8_portable(type, wr[r], k, n - k, buf);
                wv[r] = _mm256_loadu_ps(buf);
            }
            for (int b = 0; b < B; b++) {
                memset(buf, 0, sizeof buf);
                memcpy(buf, x + (size_t)b * n + k, (n - k) * sizeof(float));
                __m256 xv = _mm256_loadu_ps(buf);
                for (int r = 0; r < R; r++) acc[r][b] = _mm256_fmadd_ps(wv[r], xv, acc[r][b]);
            }
        }
    }
UNROLL
    for (int r = 0; r < R; r++)
UNROLL
        for (int b = 0; b < B; b++) y[(size_t)b * d + (size_t)r0 + (size_t)r] = x86_hsum(acc[r][b]);
}

/* Rows [r0, r1) of W against the whole batch, for one weight type. */
X86_INLINE void x86_rows_t(const uint32_t type, float *y, const float *x, const void *w, size_t n, size_t d,
                           size_t batch, size_t r0, size_t r1)
{
    size_t r = r0;
    if (batch == 1) {
        size_t rb = row_bytes(type, n);
        for (; r + 8 <= r1; r += 8)
            x86_tile(type, 8, 1, w, n, r, x, y, d, r + 24 <= d ? (const char *)w + (r + 16) * rb : NULL);
        for (; r + 4 <= r1; r += 4) x86_tile(type, 4, 1, w, n, r, x, y, d, NULL);
        for (; r < r1; r++) x86_tile(type, 1, 1, w, n, r, x, y, d, NULL);
        return;
    }
    /* A tile of 4 rows of W stays in L1 while the whole batch streams by,
     * two batch rows at a time: 8 accumulators + 4 weight vectors + x fit
     * the 16 ymm registers (4 x 3 spills one accumulator, and the spill's
     * store-to-load latency joins the FMA chain: measured 45 against 85
     * GFLOPS on Zen 4). The AVX-512VL registers (32 ymm, same order of
     * summation) allowed 4 x 4 tiles but gained under 10%: not worth a
     * third path. */
    for (; r + 4 <= r1; r += 4) {
        size_t b = 0;
        for (; b + 2 <= batch; b += 2) x86_tile(type, 4, 2, w, n, r, x + b * n, y + b * d, d, NULL);
        if (b < batch) x86_tile(type, 4, 1, w, n, r, x + b * n, y + b * d, d, NULL);
    }
    for (; r < r1; r++) {
        size_t b = 0;
        for (; b < batch; b++) x86_tile(type, 1, 1, w, n, r, x + b * n, y + b * d, d, NULL);
    }
}

X86_TARGET static void rows_x86(float *y, const float *x, const void *w, uint32_t type, size_t n, size_t d,
                                size_t batch, size_t r0, size_t r1)
{
    switch (type) {
    case LLMEM_DTYPE_F32: x86_rows_t(LLMEM_DTYPE_F32, y, x, w, n, d, batch, r0, r1); break;
    case LLMEM_DTYPE_F16: x86_rows_t(LLMEM_DTYPE_F16, y, x, w, n, d, batch, r0, r1); break;
    default: x86_rows_t(LLMEM_DTYPE_BF16, y, x, w, n, d, batch, r0, r1); break;
    }
}

/* ---- the batches' 512-bit tiles (the avx2+avx512vnni path) ---------------
 *
 * An 8 x 4 tile: 8 rows of W against 4 batch rows, in 16 zmm accumulators
 * (the ymm tile is 4 x 2 in 8). A zmm holds two ymm accumulators side by
 * side, batch rows b and b + 1 of one W row: lanes 0-7 and 8-15 see exactly
 * the steps x86_tile's lanes see (element k + l of each step of 8, k
 * ascending, one FMA each, the same zero-padded last step, the same lane
 * sum), so a batch gives the batch-1 path's bits. Per step a W row's 8
 * weights are one broadcast load (two halves alike; f16 and bf16 widened
 * once for both batch rows) and each pair of batch rows one load and an
 * insert. Why: on Intel cores with two 512-bit FMA ports (this project's
 * Emerald Rapids VMs) a zmm FMA does twice a ymm one's work, and llama.cpp's
 * 512-bit f16 prefill ran 1.1-2.8x of llmem's ymm tiles there (2026-12-06);
 * on Zen 4 the ymm tiles' comment above applies (4 x 4 ymm gained under
 * 10%), and a zmm FMA there costs two ymm ones. */
#define X512_INLINE static inline __attribute__((always_inline, target("avx512f,avx2,fma,f16c")))
#define X512_TARGET __attribute__((target("avx512f,avx2,fma,f16c")))

/* 8 weights from element k of a row, as f32, in both halves of a zmm. */
X512_INLINE __m512 x512_wload(const uint32_t type, const void *row, size_t k)
{
    if (type == LLMEM_DTYPE_F32)
        return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps((const float *)row + k))));
    __m256i h = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + k)));
    if (type == LLMEM_DTYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); /* BF16 */
}

/* Two ymm halves as one zmm: lo in lanes 0-7. */
X512_INLINE __m512 x512_pair(__m256 lo, __m256 hi)
{
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}

/* `steps` steps of 8 elements of rows wr[0..7] (weights from element wk)
 * against batch rows 0..3 of x (x at the first step's element; rows n
 * apart) into acc[r][p] (batch rows 2p and 2p + 1 of W row r). */
X512_INLINE void x512_steps(const uint32_t type, const char *const wr[8], size_t wk, const float *x, size_t n,
                            size_t steps, __m512 acc[8][2])
{
    __m512 a[8][2];
UNROLL
    for (int r = 0; r < 8; r++) a[r][0] = acc[r][0], a[r][1] = acc[r][1];
    for (size_t s = 0, k = 0; s < steps; s++, k += 8) {
        const __m512 x01 = x512_pair(_mm256_loadu_ps(x + k), _mm256_loadu_ps(x + n + k));
        const __m512 x23 = x512_pair(_mm256_loadu_ps(x + 2 * n + k), _mm256_loadu_ps(x + 3 * n + k));
UNROLL
        for (int r = 0; r < 8; r++) {
            const __m512 wv = x512_wload(type, wr[r], wk + k);
            a[r][0] = _mm512_fmadd_ps(wv, x01, a[r][0]);
            a[r][1] = _mm512_fmadd_ps(wv, x23, a[r][1]);
        }
    }
UNROLL
    for (int r = 0; r < 8; r++) acc[r][0] = a[r][0], acc[r][1] = a[r][1];
}

/* The tile's end: x86_tile's zero-padded last step (elements n8..n-1 of
 * rows wr, x at batch row 0, element 0), then the lane sums into y (at
 * batch row 0) for rows r0..r0+7. */
X512_INLINE void x512_finish(const uint32_t type, const char *const wr[8], size_t n, size_t n8, const float *x,
                             float *y, size_t d, size_t r0, __m512 acc[8][2])
{
    if (n8 < n) {
        float buf[4][8], wb[8];
        memset(buf, 0, sizeof buf);
        for (int b = 0; b < 4; b++) memcpy(buf[b], x + (size_t)b * n + n8, (n - n8) * sizeof(float));
        const __m512 x01 = x512_pair(_mm256_loadu_ps(buf[0]), _mm256_loadu_ps(buf[1]));
        const __m512 x23 = x512_pair(_mm256_loadu_ps(buf[2]), _mm256_loadu_ps(buf[3]));
        for (int r = 0; r < 8; r++) {
            load8_portable(type, wr[r], n8, n - n8, wb);
            const __m512 wv = x512_pair(_mm256_loadu_ps(wb), _mm256_loadu_ps(wb));
            acc[r][0] = _mm512_fmadd_ps(wv, x01, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(wv, x23, acc[r][1]);
        }
    }
    for (int r = 0; r < 8; r++)
        for (int p = 0; p < 2; p++) {
            y[(size_t)(2 * p) * d + r0 + (size_t)r] = x86_hsum(_mm512_castps512_ps256(acc[r][p]));
            y[(size_t)(2 * p + 1) * d + r0 + (size_t)r] =
                x86_hsum(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[r][p]), 1)));
        }
}

/* The widened tiles of f16 and bf16: X512_KC elements of 8 rows widened to
 * f32 at a time (16 KiB, in L1), against X512_BB batch rows at a time
 * (their accumulators, 4 KiB, kept between chunks). Widening in the tile's
 * loop, 8 conversions to 16 FMAs, held f16 to 62-76 GFLOPS a thread where
 * f32 ran 116 (llmem bench kernels, batch 32, 2026-12-06). */
enum { X512_KC = 512, X512_BB = 16 };

/* Rows r0..r0+7 of W against batch rows [0, b4) of x (b4 a multiple of 4;
 * x and y at batch row 0). */
X512_INLINE void x512_rows8(const uint32_t type, float *y, const float *x, const void *w, size_t n, size_t d,
                            size_t b4, size_t r0)
{
    size_t rb = row_bytes(type, n), n8 = n & ~(size_t)7;
    const char *wr[8];
    for (int r = 0; r < 8; r++) wr[r] = (const char *)w + (r0 + (size_t)r) * rb;
    if (type == LLMEM_DTYPE_F32) {
        for (size_t b = 0; b < b4; b += 4) {
            __m512 acc[8][2];
            for (int r = 0; r < 8; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
            x512_steps(type, wr, 0, x + b * n, n, n8 / 8, acc);
            x512_finish(type, wr, n, n8, x + b * n, y + b * d, d, r0, acc);
        }
        return;
    }
    _Alignas(64) float wf[8][X512_KC];
    const char *wfr[8];
    for (int r = 0; r < 8; r++) wfr[r] = (const char *)wf[r];
    __m512 acc[X512_BB / 4][8][2];
    for (size_t b0 = 0; b0 < b4; b0 += X512_BB) {
        size_t groups = (b4 - b0 < X512_BB ? b4 - b0 : X512_BB) / 4;
        for (size_t g = 0; g < groups; g++)
            for (int r = 0; r < 8; r++) acc[g][r][0] = acc[g][r][1] = _mm512_setzero_ps();
        for (size_t k0 = 0; k0 < n8; k0 += X512_KC) {
            size_t kc = n8 - k0 < X512_KC ? n8 - k0 : X512_KC;
            for (int r = 0; r < 8; r++)
                for (size_t k = 0; k < kc; k += 8) _mm256_store_ps(&wf[r][k], x86_load8(type, wr[r], k0 + k));
            for (size_t g = 0; g < groups; g++)
                x512_steps(LLMEM_DTYPE_F32, wfr, 0, x + (b0 + 4 * g) * n + k0, n, kc / 8, acc[g]);
        }
        for (size_t g = 0; g < groups; g++)
            x512_finish(type, wr, n, n8, x + (b0 + 4 * g) * n, y + (b0 + 4 * g) * d, d, r0, acc[g]);
    }
}

/* Rows [r0, r1) of W against the batch: 8 x 4 tiles over every whole group
 * of 4 batch rows, the ymm tiles (x86_rows_t) for the rest. */
X512_INLINE void x512_rows_t(const uint32_t type, float *y, const float *x, const void *w, size_t n, size_t d,
                             size_t batch, size_t r0, size_t r1)
{
    if (batch < 4) {
        x86_rows_t(type, y, x, w, n, d, batch, r0, r1);
        return;
    }
    size_t b4 = batch & ~(size_t)3, r = r0;
    for (; r + 8 <= r1; r += 8) x512_rows8(type, y, x, w, n, d, b4, r);
    if (r < r1) x86_rows_t(type, y, x, w, n, d, b4, r, r1);
    if (b4 < batch) x86_rows_t(type, y + b4 * d, x + b4 * n, w, n, d, batch - b4, r0, r1);
}

X512_TARGET static void rows_x512(float *y, const float *x, const void *w, uint32_t type, size_t n, size_t d,
                                  size_t batch, size_t r0, size_t r1)
{
    switch (type) {
    case LLMEM_DTYPE_F32: x512_rows_t(LLMEM_DTYPE_F32, y, x, w, n, d, batch, r0, r1); break;
    case LLMEM_DTYPE_F16: x512_rows_t(LLMEM_DTYPE_F16, y, x, w, n, d, batch, r0, r1); break;
    default: x512_rows_t(LLMEM_DTYPE_BF16, y, x, w, n, d, batch, r0, r1); break;
    }
}

X86_TARGET static void axpy_x86(float *y, float alpha, const float *x, size_t n)
{
    __m256 a = _mm256_set1_ps(alpha);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] = fmaf(alpha, x[i], y[i]);
}

/* The last n - full (< 8) elements of a row, zero-padded to 8 lanes. */
X86_INLINE __m256 x86_tail8(const uint32_t type, const void *row, size_t full, size_t rem)
{
    if (type == LLMEM_DTYPE_F32) {
        float t[8] = {0};
        memcpy(t, (const float *)row + full, rem * sizeof(float));
        return _mm256_loadu_ps(t);
    }
    uint16_t t[8] = {0}; /* +0.0 in half */
    memcpy(t, (const uint16_t *)row + full, rem * sizeof(uint16_t));
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)t));
}

/* q . row over n elements, the row F32 or F16: 8 FMA lanes, the tail
 * zero-padded, then x86_hsum (dot_x86 is its F32 form). */
X86_INLINE float x86_dot_t(const uint32_t type, const float *q, const void *row, size_t n)
{
    __m256 acc = _mm256_setzero_ps();
    size_t k = 0;
    for (; k + 8 <= n; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + k), x86_load8(type, row, k), acc);
    if (k < n) {
        float tq[8] = {0};
        memcpy(tq, q + k, (n - k) * sizeof(float));
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(tq), x86_tail8(type, row, k, n - k), acc);
    }
    return x86_hsum(acc);
}

X86_TARGET static float dot_x86(const float *a, const float *b, size_t n)
{
    return x86_dot_t(LLMEM_DTYPE_F32, a, b, n);
}

/* dot_x86 of q against `rows` rows of k (F32 or F16 elements, stride in
 * elements), four rows at a time: four independent FMA chains where a
 * single dot has one, each row's chain the one dot_x86 runs (same steps,
 * same zero padding, same lane sum). */
X86_INLINE void x86_dot_rows_t(const uint32_t type, float *out, const float *q, const void *k, size_t stride,
                               size_t rows, size_t n, float scale)
{
    size_t full = n & ~(size_t)7, rem = n - full, sb = row_bytes(type, stride);
    const char *kb = k;
    float tq[8] = {0};
    if (rem) memcpy(tq, q + full, rem * sizeof(float));
    __m256 qt = _mm256_loadu_ps(tq);
    size_t j = 0;
    for (; j + 4 <= rows; j += 4) {
        const char *k0 = kb + j * sb, *k1 = k0 + sb, *k2 = k1 + sb, *k3 = k2 + sb;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (size_t c = 0; c < full; c += 8) {
            __m256 qv = _mm256_loadu_ps(q + c);
            a0 = _mm256_fmadd_ps(qv, x86_load8(type, k0, c), a0);
            a1 = _mm256_fmadd_ps(qv, x86_load8(type, k1, c), a1);
            a2 = _mm256_fmadd_ps(qv, x86_load8(type, k2, c), a2);
            a3 = _mm256_fmadd_ps(qv, x86_load8(type, k3, c), a3);
        }
        if (rem) {
            a0 = _mm256_fmadd_ps(qt, x86_tail8(type, k0, full, rem), a0);
            a1 = _mm256_fmadd_ps(qt, x86_tail8(type, k1, full, rem), a1);
            a2 = _mm256_fmadd_ps(qt, x86_tail8(type, k2, full, rem), a2);
            a3 = _mm256_fmadd_ps(qt, x86_tail8(type, k3, full, rem), a3);
        }
        out[j] = x86_hsum(a0) * scale;
        out[j + 1] = x86_hsum(a1) * scale;
        out[j + 2] = x86_hsum(a2) * scale;
        out[j + 3] = x86_hsum(a3) * scale;
    }
    for (; j < rows; j++) out[j] = x86_dot_t(type, q, kb + j * sb, n) * scale;
}

X86_TARGET static void dot_rows_x86(float *out, const float *q, const float *k, size_t stride, size_t rows, size_t n,
                                    float scale)
{
    x86_dot_rows_t(LLMEM_DTYPE_F32, out, q, k, stride, rows, n, scale);
}

X86_TARGET static void dot_rows_f16_x86(float *out, const float *q, const uint16_t *k, size_t stride, size_t rows,
                                        size_t n, float scale)
{
    x86_dot_rows_t(LLMEM_DTYPE_F16, out, q, k, stride, rows, n, scale);
}

/* NV vectors of y held in registers over all the rows: the FMAs of
 * axpy_x86, row after row, without a store and reload of y per row. x's
 * elements F32 or F16, its stride in elements. */
X86_INLINE void axpy_rows_x86_nv(const uint32_t type, const int NV, float *y, const float *alpha, const void *x,
                                 size_t stride, size_t rows)
{
    size_t sb = row_bytes(type, stride);
    __m256 acc[8];
    UNROLL
    for (int v = 0; v < NV; v++) acc[v] = _mm256_loadu_ps(y + 8 * v);
    for (size_t j = 0; j < rows; j++) {
        __m256 a = _mm256_set1_ps(alpha[j]);
        const char *xr = (const char *)x + j * sb;
        UNROLL
        for (int v = 0; v < NV; v++) acc[v] = _mm256_fmadd_ps(a, x86_load8(type, xr, 8 * (size_t)v), acc[v]);
    }
    UNROLL
    for (int v = 0; v < NV; v++) _mm256_storeu_ps(y + 8 * v, acc[v]);
}

X86_INLINE void x86_axpy_rows_t(const uint32_t type, float *y, const float *alpha, const void *x, size_t stride,
                                size_t rows, size_t n)
{
    size_t i = 0, es = row_bytes(type, 1), sb = row_bytes(type, stride);
    const char *xb = x;
    for (; i + 64 <= n; i += 64) axpy_rows_x86_nv(type, 8, y + i, alpha, xb + i * es, stride, rows);
    switch ((n - i) / 8) {
    case 7: axpy_rows_x86_nv(type, 7, y + i, alpha, xb + i * es, stride, rows); break;
    case 6: axpy_rows_x86_nv(type, 6, y + i, alpha, xb + i * es, stride, rows); break;
    case 5: axpy_rows_x86_nv(type, 5, y + i, alpha, xb + i * es, stride, rows); break;
    case 4: axpy_rows_x86_nv(type, 4, y + i, alpha, xb + i * es, stride, rows); break;
    case 3: axpy_rows_x86_nv(type, 3, y + i, alpha, xb + i * es, stride, rows); break;
    case 2: axpy_rows_x86_nv(type, 2, y + i, alpha, xb + i * es, stride, rows); break;
    case 1: axpy_rows_x86_nv(type, 1, y + i, alpha, xb + i * es, stride, rows); break;
    default: break;
    }
    i += (n - i) / 8 * 8;
    for (; i < n; i++)
        for (size_t j = 0; j < rows; j++) y[i] = fmaf(alpha[j], row_elem(type, xb + j * sb, i), y[i]);
}

X86_TARGET static void axpy_rows_x86(float *y, const float *alpha, const float *x, size_t stride, size_t rows,
                                     size_t n)
{
    x86_axpy_rows_t(LLMEM_DTYPE_F32, y, alpha, x, stride, rows, n);
}

X86_TARGET static void axpy_rows_f16_x86(float *y, const float *alpha, const uint16_t *x, size_t stride, size_t rows,
                                         size_t n)
{
    x86_axpy_rows_t(LLMEM_DTYPE_F16, y, alpha, x, stride, rows, n);
}

/* Round to nearest even by the immediate (not MXCSR's mode), as
 * llmem__f32_to_f16; a NaN comes out quiet with its payload's top bits,
 * as there too (the test kernels checks every class of input). */
X86_TARGET static void f16_from_f32_row_x86(uint16_t *h, const float *f, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(f + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) h[i] = llmem__f32_to_f16(f[i]);
}

X86_TARGET static void f16_row_x86(const uint16_t *h, size_t n, float *out)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < n; i++) out[i] = llmem__f16_to_f32(h[i]);
}
/* softmax_portable's order, 8 lanes a vector (see "softmax and SwiGLU"). */
X86_TARGET static void softmax_x86(float *x, size_t n)
{
    size_t n8 = n & ~(size_t)7;
    __m256 mv = _mm256_set1_ps(-INFINITY);
    for (size_t i = 0; i < n8; i += 8) mv = _mm256_max_ps(_mm256_loadu_ps(x + i), mv); /* v > m ? v : m */
    float m[8];
    _mm256_storeu_ps(m, mv);
    for (size_t i = n8; i < n; i++) m[i % 8] = x[i] > m[i % 8] ? x[i] : m[i % 8];
    float max = max_fold8(m);
    if (max == -INFINITY || max == INFINITY) {
        softmax_inf(x, n, max);
        return;
    }
    __m256 maxv = _mm256_set1_ps(max);
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    for (size_t i = 0; i < n8; i += 8) {
        __m256 e = llmem__expf8_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), maxv));
        _mm256_storeu_ps(x + i, e);
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double acc[8];
    _mm256_storeu_pd(acc, lo);
    _mm256_storeu_pd(acc + 4, hi);
    for (size_t i = n8; i < n; i++) {
        x[i] = llmem__expf(x[i] - max);
        acc[i % 8] += x[i];
    }
    float s = (float)hsum8d(acc);
    __m256 sv = _mm256_set1_ps(s);
    for (size_t i = 0; i < n8; i += 8) _mm256_storeu_ps(x + i, _mm256_div_ps(_mm256_loadu_ps(x + i), sv));
    for (size_t i = n8; i < n; i++) x[i] /= s;
}

X86_TARGET static void swiglu_x86(float *a, const float *b, size_t n)
{
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(a + i);
        __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, llmem__expf8_avx2(_mm256_xor_ps(v, sign))));
        _mm256_storeu_ps(a + i, _mm256_mul_ps(_mm256_mul_ps(v, s), _mm256_loadu_ps(b + i)));
    }
    swiglu_portable(a + i, b + i, n - i);
}
#endif /* KERNELS_X86 */

/* ---- dispatch ------------------------------------------------------------ */

typedef struct kernel_path {
    const char *name;
    void (*rows)(float *y, const float *x, const void *w, uint32_t type, size_t n, size_t d, size_t batch, size_t r0,
                 size_t r1);
    float (*dot)(const float *a, const float *b, size_t n);
    void (*axpy)(float *y, float alpha, const float *x, size_t n);
    void (*dot_rows)(float *out, const float *q, const float *k, size_t stride, size_t rows, size_t n, float scale);
    void (*axpy_rows)(float *y, const float *alpha, const float *x, size_t stride, size_t rows, size_t n);
    void (*f16_row)(const uint16_t *h, size_t n, float *out);
    void (*dot_rows_f16)(float *out, const float *q, const uint16_t *k, size_t stride, size_t rows, size_t n,
                         float scale);
    void (*axpy_rows_f16)(float *y, const float *alpha, const uint16_t *x, size_t stride, size_t rows, size_t n);
    void (*f16_from_f32_row)(uint16_t *h, const float *f, size_t n);
    void (*softmax)(float *x, size_t n);
    void (*swiglu)(float *a, const float *b, size_t n);
    void (*exp_rows)(float *y, const float *x, size_t n);
    /* block-type weights: quantise activation rows, then integer dot products (kernels_q.h) */
    void (*act_quantize)(uint32_t wtype, const float *x, size_t n, void *row);
    void (*qrows)(float *y, const void *act, const void *w, uint32_t wtype, size_t n, size_t d, size_t batch,
                  size_t r0, size_t r1);
    /* q4_K repacked 8 rows interleaved (kernels_q4k_x8.h) */
    void (*qrows_x8)(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch, size_t r0, size_t r1);
    void (*qrows_x8_q5_0)(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch, size_t r0,
                          size_t r1);
    void (*qrows_x8_q8_0)(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch, size_t r0,
                          size_t r1);
    void (*qrows_x8_q4_0)(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch, size_t r0,
                          size_t r1);
} kernel_path;

static const kernel_path path_portable = {
    /* .name = */ "portable",
    /* .rows = */ rows_portable,
    /* .dot = */ dot_portable,
    /* .axpy = */ axpy_portable,
    /* .dot_rows = */ dot_rows_portable,
    /* .axpy_rows = */ axpy_rows_portable,
    /* .f16_row = */ f16_row_portable,
    /* .dot_rows_f16 = */ dot_rows_f16_portable,
    /* .axpy_rows_f16 = */ axpy_rows_f16_portable,
    /* .f16_from_f32_row = */ f16_from_f32_row_portable,
    /* .softmax = */ softmax_portable,
    /* .swiglu = */ swiglu_portable,
    /* .exp_rows = */ llmem__exp_rows_portable,
    /* .act_quantize = */ llmem__act_quantize_ref,
    /* .qrows = */ llmem__qrows_ref,
    /* .qrows_x8 = */ llmem__q4k_x8_rows_ref,
    /* .qrows_x8_q5_0 = */ llmem__q5_0_x8_rows_ref,
    /* .qrows_x8_q8_0 = */ llmem__q8_0_x8_rows_ref,
    /* .qrows_x8_q4_0 = */ llmem__q4_0_x8_rows_ref,
};

#ifdef KERNELS_X86
static const kernel_path path_x86 = {
    /* .name = */ "avx2",
    /* .rows = */ rows_x86,
    /* .dot = */ dot_x86,
    /* .axpy = */ axpy_x86,
    /* .dot_rows = */ dot_rows_x86,
    /* .axpy_rows = */ axpy_rows_x86,
    /* .f16_row = */ f16_row_x86,
    /* .dot_rows_f16 = */ dot_rows_f16_x86,
    /* .axpy_rows_f16 = */ axpy_rows_f16_x86,
    /* .f16_from_f32_row = */ f16_from_f32_row_x86,
    /* .softmax = */ softmax_x86,
    /* .swiglu = */ swiglu_x86,
    /* .exp_rows = */ llmem__exp_rows_avx2,
    /* .act_quantize = */ llmem__act_quantize_avx2,
    /* .qrows = */ llmem__qrows_avx2,
    /* .qrows_x8 = */ llmem__q4k_x8_rows_avx2,
    /* .qrows_x8_q5_0 = */ llmem__q5_0_x8_rows_avx2,
    /* .qrows_x8_q8_0 = */ llmem__q8_0_x8_rows_avx2,
    /* .qrows_x8_q4_0 = */ llmem__q4_0_x8_rows_avx2,
};

/* AVX2 with AVX-VNNI for the integer dot products (same results). */
static const kernel_path path_x86_vnni = {
    /* .name = */ "avx2+vnni",
    /* .rows = */ rows_x86,
    /* .dot = */ dot_x86,
    /* .axpy = */ axpy_x86,
    /* .dot_rows = */ dot_rows_x86,
    /* .axpy_rows = */ axpy_rows_x86,
    /* .f16_row = */ f16_row_x86,
    /* .dot_rows_f16 = */ dot_rows_f16_x86,
    /* .axpy_rows_f16 = */ axpy_rows_f16_x86,
    /* .f16_from_f32_row = */ f16_from_f32_row_x86,
    /* .softmax = */ softmax_x86,
    /* .swiglu = */ swiglu_x86,
    /* .exp_rows = */ llmem__exp_rows_avx2,
    /* .act_quantize = */ llmem__act_quantize_avx2,
    /* .qrows = */ llmem__qrows_vnni,
    /* .qrows_x8 = */ llmem__q4k_x8_rows_vnni,
    /* .qrows_x8_q5_0 = */ llmem__q5_0_x8_rows_vnni,
    /* .qrows_x8_q8_0 = */ llmem__q8_0_x8_rows_vnni,
    /* .qrows_x8_q4_0 = */ llmem__q4_0_x8_rows_vnni,
};

/* AVX2 with AVX-512 + AVX512-VNNI for the integer dot products: the EVEX
 * vpdpbusd, 16 weight rows a pass for batches (same results). */
static const kernel_path path_x86_avx512 = {
    /* .name = */ "avx2+avx512vnni",
    /* .rows = */ rows_x512,
    /* .dot = */ dot_x86,
    /* .axpy = */ axpy_x86,
    /* .dot_rows = */ dot_rows_x86,
    /* .axpy_rows = */ axpy_rows_x86,
    /* .f16_row = */ f16_row_x86,
    /* .dot_rows_f16 = */ dot_rows_f16_x86,
    /* .axpy_rows_f16 = */ axpy_rows_f16_x86,
    /* .f16_from_f32_row = */ f16_from_f32_row_x86,
    /* .softmax = */ softmax_x86,
    /* .swiglu = */ swiglu_x86,
    /* .exp_rows = */ llmem__exp_rows_avx2,
    /* .act_quantize = */ llmem__act_quantize_avx2,
    /* .qrows = */ llmem__qrows_avx512,
    /* .qrows_x8 = */ llmem__q4k_x8_rows_avx512,
    /* .qrows_x8_q5_0 = */ llmem__q5_0_x8_rows_avx512,
    /* .qrows_x8_q8_0 = */ llmem__q8_0_x8_rows_avx512,
    /* .qrows_x8_q4_0 = */ llmem__q4_0_x8_rows_avx512,
};

/* The AVX-512 path with the repacked q8_0, q5_0, q4_0 and q4_K batches of 16
 * and more on AMX-INT8 tiles (kernels_q_amx.c; same results). */
static const kernel_path path_x86_amx = {
    /* .name = */ "avx2+avx512vnni+amx",
    /* .rows = */ rows_x512,
    /* .dot = */ dot_x86,
    /* .axpy = */ axpy_x86,
    /* .dot_rows = */ dot_rows_x86,
    /* .axpy_rows = */ axpy_rows_x86,
    /* .f16_row = */ f16_row_x86,
    /* .dot_rows_f16 = */ dot_rows_f16_x86,
    /* .axpy_rows_f16 = */ axpy_rows_f16_x86,
    /* .f16_from_f32_row = */ f16_from_f32_row_x86,
    /* .softmax = */ softmax_x86,
    /* .swiglu = */ swiglu_x86,
    /* .exp_rows = */ llmem__exp_rows_avx2,
    /* .act_quantize = */ llmem__act_quantize_avx2,
    /* .qrows = */ llmem__qrows_avx512,
    /* .qrows_x8 = */ llmem__q4k_x8_rows_amx,
    /* .qrows_x8_q5_0 = */ llmem__q5_0_x8_rows_amx,
    /* .qrows_x8_q8_0 = */ llmem__q8_0_x8_rows_amx,
    /* .qrows_x8_q4_0 = */ llmem__q4_0_x8_rows_amx,
};
#endif

static pthread_once_t path_once = PTHREAD_ONCE_INIT;
static const kernel_path *path_best = &path_portable; /* written once, under path_once */
static int force_portable;                            /* atomic flag */

#ifdef KERNELS_X86
/* AVX2, FMA and F16C in the CPU, and the ymm state saved by the OS. CPUID
 * rather than __builtin_cpu_supports, which Clang 14 does not give "f16c". */
static bool x86_has_avx2_fma_f16c(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    unsigned need1 = bit_FMA | bit_OSXSAVE | bit_AVX | bit_F16C;
    if ((c & need1) != need1) return false;
    unsigned xcr0_lo, xcr0_hi;
    __asm__ __volatile__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    if ((xcr0_lo & 6u) != 6u) return false; /* XMM and YMM state enabled */
    if (__get_cpuid_max(0, NULL) < 7) return false;
    __cpuid_count(7, 0, a, b, c, d);
    return (b & bit_AVX2) != 0;
}

/* AVX-VNNI (CPUID.(7,1):EAX bit 4), the VEX-encoded vpdpbusd. */
static bool x86_has_avxvnni(void)
{
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7) return false;
    __cpuid_count(7, 1, a, b, c, d);
    return (a & (1u << 4)) != 0;
}

/* AVX-512 F, BW, VL and AVX512-VNNI (CPUID.(7,0): EBX bits 16, 30, 31;
 * ECX bit 11), and the opmask, ZMM_Hi256 and Hi16_ZMM state saved by the
 * OS (XCR0 bits 5-7, beside SSE and AVX's 1-2). */
static bool x86_has_avx512vnni(void)
{
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7) return false;
    __cpuid_count(7, 0, a, b, c, d);
    const unsigned need_b = (1u << 16) | (1u << 30) | (1u << 31);
    if ((b & need_b) != need_b || !(c & (1u << 11))) return false;
    unsigned xcr0_lo, xcr0_hi;
    __asm__ __volatile__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    return (xcr0_lo & 0xe6u) == 0xe6u;
}

/* AMX for the process, asked of the kernel once (kernels_q_amx.c), unless
 * LLMEM_NO_AMX is set (to anything but 0): a process granted the tile
 * state has 8 KiB larger signal frames, and Linux then refuses a
 * sigaltstack too small for them, which a host program may not expect. */
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static bool amx_granted;
static void amx_init(void)
{
    const char *no = getenv("LLMEM_NO_AMX");
    amx_granted = !(no && *no && strcmp(no, "0") != 0) && llmem__amx_enable();
}
static bool x86_has_amx(void)
{
    pthread_once(&amx_once, amx_init);
    return amx_granted;
}
#endif

/* The first path, in order of preference, that this CPU runs and the
 * compiler built: one test for both the choice and the tests' question. */
static void path_init(void)
{
#ifdef KERNELS_X86
    static const kernel_path *const preferred[] = {&path_x86_amx, &path_x86_avx512, &path_x86_vnni, &path_x86};
    for (size_t i = 0; i < sizeof preferred / sizeof preferred[0]; i++)
        if (llmem__kernels_path_available(preferred[i]->name)) {
            path_best = preferred[i];
            return;
        }
#endif
}

static const kernel_path *path_get(void)
{
    if (__atomic_load_n(&force_portable, __ATOMIC_RELAXED)) return &path_portable;
    pthread_once(&path_once, path_init);
    return path_best;
}

const char *llmem__kernels_isa(void) { return path_get()->name; }

bool llmem__kernels_path_available(const char *name)
{
    if (!strcmp(name, "portable")) return true;
#ifdef KERNELS_X86
    if (!x86_has_avx2_fma_f16c()) return false;
    if (!strcmp(name, "avx2")) return true;
    if (!strcmp(name, "avx2+vnni")) return llmem__qrows_vnni_built && x86_has_avxvnni();
    if (!strcmp(name, "avx2+avx512vnni")) return llmem__qrows_avx512_built && x86_has_avx512vnni();
    if (!strcmp(name, "avx2+avx512vnni+amx"))
        return llmem__qrows_avx512_built && llmem__x8_rows_amx_built && x86_has_avx512vnni() && x86_has_amx();
#endif
    return false;
}

void llmem__kernels_force_portable(bool on) { __atomic_store_n(&force_portable, on ? 1 : 0, __ATOMIC_RELAXED); }

/* ---- matmul ---------------------------------------------------------------- */

bool llmem__matmul_supports(uint32_t wtype)
{
    return wtype == LLMEM_DTYPE_F32 || wtype == LLMEM_DTYPE_F16 || wtype == LLMEM_DTYPE_BF16 || llmem__is_qtype(wtype) ||
           wtype == LLMEM__WTYPE_Q4K_X8 || wtype == LLMEM__WTYPE_Q5_0_X8 || wtype == LLMEM__WTYPE_Q8_0_X8 ||
           wtype == LLMEM__WTYPE_Q4_0_X8;
}

size_t llmem__matmul_scratch_bytes(uint32_t wtype, size_t n, size_t batch)
{
    return llmem__act_row_bytes(llmem__x8_base_type(wtype), n) * batch;
}

/* The activation layouts (kernels_q.h): A8 for the 32-element block types,
 * A8K for the k-quants; a group quantises x once for each layout its
 * matrices need. */
enum { ACT_A8, ACT_A8K, ACT_KINDS };

static int act_kind(uint32_t base)
{
    if (!llmem__is_qtype(base)) return -1;
    return is_k(base) ? ACT_A8K : ACT_A8;
}

/* Bytes of each layout's rows for the group (0 where none needs it), and
 * the type that stands for it (any of its types: the rows are the same). */
static size_t group_act_bytes(const uint32_t *types, size_t count, size_t n, uint32_t rep[ACT_KINDS],
                              size_t bytes[ACT_KINDS])
{
    size_t total = 0;
    for (int k = 0; k < ACT_KINDS; k++) bytes[k] = 0, rep[k] = 0;
    for (size_t i = 0; i < count; i++) {
        uint32_t base = llmem__x8_base_type(types[i]);
        int k = act_kind(base);
        if (k < 0 || bytes[k]) continue;
        rep[k] = base;
        bytes[k] = llmem__act_row_bytes(base, n);
        total += bytes[k];
    }
    return total;
}

size_t llmem__matmul_group_scratch_bytes(const uint32_t *types, size_t count, size_t n, size_t batch)
{
    uint32_t rep[ACT_KINDS];
    size_t bytes[ACT_KINDS];
    return group_act_bytes(types, count, n, rep, bytes) * batch;
}

typedef struct mm_mat {
    float *y;
    const void *w;
    uint32_t type;           /* the GGUF type (a repacked one's base type) */
    bool x8;                 /* w is repacked 8 rows interleaved (type Q4_K, Q5_0, Q4_0 or Q8_0) */
    size_t d;
    size_t g0;               /* its first grain in the concatenation of the group's rows */
    const void *act;         /* block types: its activation rows (stride llmem__act_row_bytes(type, n)) */
} mm_mat;

typedef struct mm_job {
    const kernel_path *path; /* one path for every thread of the run */
    const llmem__threads *th;
    const float *x;
    size_t n, batch;
    mm_mat m[LLMEM__MM_GROUP_MAX];
    size_t count, grains;    /* matrices; grains of MM_GRAIN rows over all of them */
    uint32_t act_type[ACT_KINDS]; /* a type of each layout the group needs (0: none) */
    void *act[ACT_KINDS];    /* that layout's rows, stride act_bytes */
    size_t act_bytes[ACT_KINDS];
    bool fold;               /* each thread quantises its share of the rows, then the barrier, then the products */
    uint32_t arrived;        /* the barrier's counter */
    /* The first grain no thread has taken (mm_part), on a line of its own:
     * each thread's fetch_add takes the line from the other, which on the
     * line of act[] and the matrices' fields made every chunk's reads of
     * them miss. */
    _Alignas(64) size_t next;
    char pad_next[64 - sizeof(size_t)];
} mm_job;

/* Activation rows [lo, hi) of every layout the group needs. */
static void act_rows(const mm_job *j, size_t lo, size_t hi)
{
    for (int k = 0; k < ACT_KINDS; k++)
        if (j->act_type[k])
            for (size_t b = lo; b < hi; b++)
                j->path->act_quantize(j->act_type[k], j->x + b * j->n, j->n, (char *)j->act[k] + b * j->act_bytes[k]);
}

/* Rows [lo, hi) of one matrix against the whole batch. */
static void mat_rows(const mm_job *j, const mm_mat *m, size_t lo, size_t hi)
{
    if (m->x8 && m->type == LLMEM_DTYPE_Q4_K) j->path->qrows_x8(m->y, m->act, m->w, j->n, m->d, j->batch, lo, hi);
    else if (m->x8 && m->type == LLMEM_DTYPE_Q5_0) j->path->qrows_x8_q5_0(m->y, m->act, m->w, j->n, m->d, j->batch, lo, hi);
    else if (m->x8 && m->type == LLMEM_DTYPE_Q4_0) j->path->qrows_x8_q4_0(m->y, m->act, m->w, j->n, m->d, j->batch, lo, hi);
    else if (m->x8) j->path->qrows_x8_q8_0(m->y, m->act, m->w, j->n, m->d, j->batch, lo, hi);
    else if (m->act) j->path->qrows(m->y, m->act, m->w, m->type, j->n, m->d, j->batch, lo, hi);
    else j->path->rows(m->y, j->x, m->w, m->type, j->n, m->d, j->batch, lo, hi);
}

/* Grains [g0, g1) of the concatenated rows, cut at the matrices' bounds so
 * that every part of a matrix starts at a multiple of MM_GRAIN of its own
 * rows (whole tiles, whole 8-row groups of x8). */
static void mm_grains(const mm_job *j, size_t g0, size_t g1)
{
    for (size_t i = 0; i < j->count && g0 < g1; i++) {
        const mm_mat *m = &j->m[i];
        size_t mg = (m->d + MM_GRAIN - 1) / MM_GRAIN;
        if (g0 >= m->g0 + mg) continue;
        size_t lo = (g0 - m->g0) * MM_GRAIN, hi = (g1 < m->g0 + mg ? g1 - m->g0 : mg) * MM_GRAIN;
        if (hi > m->d) hi = m->d;
        mat_rows(j, m, lo, hi);
        g0 = m->g0 + mg;
    }
}

/* Chunks of grains a thread takes from the shared counter, about this
 * many per thread a run: the two vCPUs of a shared VM do not run at one
 * speed (the same allocator benchmark took 1.4x as long on one as on the
 * other, docs/BENCHMARKS.md, 2026-12-06), and with halves fixed in
 * advance every run waited for the slower thread. Taken in order, so each
 * thread still reads long runs of consecutive rows; any split gives the
 * same bits. */
#define MM_CHUNKS_PER_THREAD 4

/* Thread index of count: (with fold) its share of the activation rows and
 * the barrier, then chunks of grains from j->next until none is left. */
static void mm_part(void *ctx, unsigned index, unsigned count)
{
    mm_job *j = ctx;
    if (j->fold) {
        size_t lo, hi;
        llmem__threads_split(j->batch, 1, index, count, &lo, &hi);
        act_rows(j, lo, hi);
        llmem__threads_barrier(j->th, &j->arrived, count);
    }
    if (count == 1) {
        mm_grains(j, 0, j->grains);
        return;
    }
    size_t chunk = j->grains / ((size_t)count * MM_CHUNKS_PER_THREAD);
    if (chunk == 0) chunk = 1;
    for (;;) {
        size_t g0 = __atomic_fetch_add(&j->next, chunk, __ATOMIC_RELAXED);
        if (g0 >= j->grains) break;
        mm_grains(j, g0, g0 + chunk < j->grains ? g0 + chunk : j->grains);
    }
}

static void act_part(void *ctx, unsigned index, unsigned count)
{
    const mm_job *j = ctx;
    size_t lo, hi;
    llmem__threads_split(j->batch, 1, index, count, &lo, &hi);
    act_rows(j, lo, hi);
}

/* Batches at least this large quantise their activation rows on the team. */
#define ACT_TEAM_ROWS 8
/* 1: on the team, the activation rows and the products in one run with a
 * barrier between them; 0: two runs (kept to measure the difference). */
#ifndef MM_FOLD_ACT
#define MM_FOLD_ACT 1
#endif

void llmem__matmul_group(llmem__threads *th, const llmem__mm *mats, size_t count, const float *x, size_t n,
                         size_t batch, void *scratch)
{
    if (count == 0 || batch == 0) return;
    if (count > LLMEM__MM_GROUP_MAX) { /* not in the engine's use; the same results */
        for (size_t i = 0; i < count; i += LLMEM__MM_GROUP_MAX)
            llmem__matmul_group(th, mats + i, count - i < LLMEM__MM_GROUP_MAX ? count - i : LLMEM__MM_GROUP_MAX, x,
                                n, batch, scratch);
        return;
    }
    mm_job j;
    memset(&j, 0, sizeof j);
    j.path = path_get();
    j.th = th;
    j.x = x;
    j.n = n;
    j.batch = batch;
    uint32_t types[LLMEM__MM_GROUP_MAX];
    for (size_t i = 0; i < count; i++) types[i] = mats[i].type;
    size_t act_row = group_act_bytes(types, count, n, j.act_type, j.act_bytes);
    /* The layouts one after the other in scratch, each batch rows. */
    char *a = scratch;
    for (int k = 0; k < ACT_KINDS; k++)
        if (j.act_type[k]) {
            j.act[k] = a;
            a += j.act_bytes[k] * batch;
        }
    size_t rows = 0;
    for (size_t i = 0; i < count; i++) {
        if (mats[i].d == 0) continue;
        mm_mat *m = &j.m[j.count++];
        m->y = mats[i].y;
        m->w = mats[i].w;
        m->type = llmem__x8_base_type(mats[i].type);
        m->x8 = m->type != mats[i].type;
        m->d = mats[i].d;
        m->g0 = j.grains;
        int k = act_kind(m->type);
        m->act = k < 0 ? NULL : j.act[k];
        j.grains += (m->d + MM_GRAIN - 1) / MM_GRAIN;
        rows += m->d;
    }
    if (j.count == 0) return;
    bool team = th && llmem__threads_count(th) > 1;
    /* Any split gives the same bits (see the file comment); a tiny product
     * is not worth waking the team for. */
    bool mm_team = team && n * rows * batch >= MM_SERIAL_MACS && rows > MM_GRAIN;
    bool act_team = act_row && team && batch >= ACT_TEAM_ROWS;
    if (act_team && mm_team && MM_FOLD_ACT) {
        j.fold = true;
    } else if (act_row) {
        if (act_team) llmem__threads_run(th, act_part, &j);
        else act_part(&j, 0, 1);
    }
    if (mm_team) llmem__threads_run(th, mm_part, &j);
    else mm_part(&j, 0, 1);
}

void llmem__matmul(llmem__threads *th, float *y, const float *x, const void *w, uint32_t wtype, size_t n, size_t d,
                   size_t batch, void *scratch)
{
    llmem__mm m = {y, w, wtype, d};
    llmem__matmul_group(th, &m, 1, x, n, batch, scratch);
}

void llmem__dequant_row(uint32_t wtype, const void *w, size_t row, size_t n, float *out)
{
    const void *r = (const char *)w + row * row_bytes(wtype, n);
    switch (wtype) {
    case LLMEM_DTYPE_F32: memcpy(out, r, n * sizeof(float)); break;
    case LLMEM_DTYPE_F16: path_get()->f16_row(r, n, out); break;
    default:
        /* The other types decode as quant.c defines them; an unknown one
         * (callers check llmem__matmul_supports) gives zeros. */
        if (llmem_dequantize_row(wtype, r, out, n) != LLMEM_OK) memset(out, 0, n * sizeof(float));
        break;
    }
}

/* ---- the small kernels ------------------------------------------------------ */

void llmem__rmsnorm(float *o, const float *x, const float *w, size_t n, float eps)
{
    /* Eight lanes as in the dot: vectorisable, and more accurate than one
     * running sum. */
    float acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (size_t l = 0; l < 8; l++) acc[l] += x[i + l] * x[i + l];
    for (size_t l = 0; i + l < n; l++) acc[l] += x[i + l] * x[i + l];
    float ss = hsum8_portable(acc);
    ss = ss / (float)n + eps;
    ss = 1.0f / sqrtf(ss);
    for (size_t j = 0; j < n; j++) o[j] = w[j] * (ss * x[j]);
}

void llmem__softmax(float *x, size_t n)
{
    if (n) path_get()->softmax(x, n);
}

void llmem__rope(float *v, size_t n_heads, size_t head_dim, size_t rope_dim, size_t pos, float theta)
{
    if (rope_dim > head_dim) rope_dim = head_dim;
    /* One cos/sin per pair index, shared by every head: the same values
     * run.c computes per head. */
    for (size_t i = 0; i + 1 < rope_dim; i += 2) {
        float freq = 1.0f / powf(theta, (float)i / (float)rope_dim);
        float val = (float)pos * freq;
        float fcr = cosf(val), fci = sinf(val);
        for (size_t h = 0; h < n_heads; h++) {
            float *p = v + h * head_dim + i;
            float v0 = p[0], v1 = p[1];
            p[0] = v0 * fcr - v1 * fci;
            p[1] = v0 * fci + v1 * fcr;
        }
    }
}

void llmem__swiglu(float *a, const float *b, size_t n) { path_get()->swiglu(a, b, n); }

void llmem__exp_rows(float *y, const float *x, size_t n) { path_get()->exp_rows(y, x, n); }

float llmem__dot(const float *a, const float *b, size_t n) { return path_get()->dot(a, b, n); }

void llmem__axpy(float *y, float alpha, const float *x, size_t n) { path_get()->axpy(y, alpha, x, n); }

void llmem__dot_rows(float *out, const float *q, const float *k, size_t stride, size_t rows, size_t n, float scale)
{
    path_get()->dot_rows(out, q, k, stride, rows, n, scale);
}

void llmem__axpy_rows(float *y, const float *alpha, const float *x, size_t stride, size_t rows, size_t n)
{
    path_get()->axpy_rows(y, alpha, x, stride, rows, n);
}

void llmem__dot_rows_f16(float *out, const float *q, const uint16_t *k, size_t stride, size_t rows, size_t n,
                         float scale)
{
    path_get()->dot_rows_f16(out, q, k, stride, rows, n, scale);
}

void llmem__axpy_rows_f16(float *y, const float *alpha, const uint16_t *x, size_t stride, size_t rows, size_t n)
{
    path_get()->axpy_rows_f16(y, alpha, x, stride, rows, n);
}

void llmem__f16_from_f32_row(uint16_t *h, const float *f, size_t n) { path_get()->f16_from_f32_row(h, f, n); }

/* Element-wise and row-wise work of a prefill step on the team: below these
 * sizes (a decode step) one thread is faster than a run. Each element or row
 * is computed as the serial call computes it, so the results do not depend
 * on the team. */
#define TEAM_MIN_ELEMS 8192
#define TEAM_MIN_ROWS 8

typedef struct swiglu_job {
    float *a;
    const float *b;
    size_t n;
} swiglu_job;

static void swiglu_part(void *ctx, unsigned index, unsigned count)
{
    swiglu_job *j = ctx;
    size_t lo, hi;
    llmem__threads_split(j->n, 64, index, count, &lo, &hi);
    if (hi > lo) llmem__swiglu(j->a + lo, j->b + lo, hi - lo);
}

void llmem__swiglu_team(llmem__threads *th, float *a, const float *b, size_t n)
{
    if (llmem__threads_count(th) < 2 || n < TEAM_MIN_ELEMS) {
        llmem__swiglu(a, b, n);
        return;
    }
    swiglu_job j = {a, b, n};
    llmem__threads_run(th, swiglu_part, &j);
}

typedef struct rmsnorm_job {
    float *o, *x;
    const float *add, *w;
    size_t n, rows;
    float eps;
} rmsnorm_job;

static void rmsnorm_part(void *ctx, unsigned index, unsigned count)
{
    rmsnorm_job *j = ctx;
    size_t lo, hi;
    llmem__threads_split(j->rows, 1, index, count, &lo, &hi);
    for (size_t r = lo; r < hi; r++) {
        if (j->add) llmem__axpy(j->x + r * j->n, 1.0f, j->add + r * j->n, j->n);
        llmem__rmsnorm(j->o + r * j->n, j->x + r * j->n, j->w, j->n, j->eps);
    }
}

void llmem__rmsnorm_rows(llmem__threads *th, float *o, float *x, const float *add, const float *w, size_t n,
                         size_t rows, float eps)
{
    rmsnorm_job j = {o, x, add, w, n, rows, eps};
    if (llmem__threads_count(th) < 2 || rows < TEAM_MIN_ROWS || rows * n < TEAM_MIN_ELEMS)
        rmsnorm_part(&j, 0, 1);
    else
        llmem__threads_run(th, rmsnorm_part, &j);
}
