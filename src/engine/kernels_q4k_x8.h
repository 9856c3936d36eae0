/*
 * kernels_q4k_x8.h - q4_K (and q5_0, q4_0, q8_0) weight matrices repacked 8 rows
 * interleaved, for the decode matmul (kernels_q4k_x8.c: the layout, the repack and the
 * scalar reference; kernels_q_x86.h: the AVX2 and AVX-VNNI kernels).
 * Private to llmem.
 *
 * Why. A q4_K row is read one super-block (144 bytes) at a time; to fill a
 * vector with 8 rows' sums the decode kernel reduces 8 rows' lanes, and its
 * 8-bit scales are unpacked from 12 packed bytes per super-block per row.
 * Interleaved, the 4-bit levels of 8 rows for the same 4 columns are one
 * 32-bit lane each of one 32-byte load, so one broadcast of 4 activation
 * bytes feeds 8 rows (lane i = row i), no lane reduction is needed, and the
 * scales and mins are stored decoded. The copy is 1184 bytes per 8 rows and
 * super-block against 1152 (2.8% more).
 *
 * Layout of a matrix of d rows of n (n a multiple of 256, nb = n / 256):
 * the d / 8 groups of 8 rows, each nb blocks of X8_BLOCK bytes (block k:
 * super-block k of the group's 8 rows), then the d % 8 tail rows as q4_K
 * rows (144 nb bytes each), unchanged. Block k of rows i = 0..7:
 *   qs[1024]  byte ((p * 8 + j) * 8 + i) * 4 + b = byte 32 p + 4 j + b of
 *             row i's qs (p < 4, j < 8, b < 4): low nibble the level of
 *             element 64 p + 4 j + b, high nibble of element 64 p + 32 + 4 j + b
 *   sc[64]    byte g * 8 + i: row i's 6-bit scale of 32-group g
 *   mn[64]    byte (g / 2) * 16 + i * 2 + g % 2: row i's 6-bit min of group g
 *   d[8]      f16, row i's d; then dmin[8], f16
 * The values are q4_K's exactly, so every kernel over it gives the bits of
 * the q4_K kernels (kernels_q.c's order: super-blocks in increasing order
 * into one float, acc += (d da) sumi, then acc -= (dmin da) summ).
 */
#ifndef LLMEM_ENGINE_KERNELS_Q4K_X8_H
#define LLMEM_ENGINE_KERNELS_Q4K_X8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LLMEM__X8_BLOCK 1184 /* bytes of one super-block of 8 rows */

/* Bytes of the repacked copy of a q4_K matrix of d rows of n. */
size_t llmem__q4k_x8_bytes(size_t n, size_t d);

/* Repack src (d q4_K rows of n) into dst (llmem__q4k_x8_bytes(n, d)
 * bytes; no overlap). */
void llmem__q4k_x8_pack(void *dst, const void *src, size_t n, size_t d);

/* y[b*d + r] for r in [r0, r1), b < batch: row r of the repacked matrix w
 * against activation row b (the A8K rows of kernels_q.h for q4_K, stride
 * llmem__act_row_bytes(Q4_K, n)). The bits of llmem__qrows_ref over the
 * matrix before repacking. The reference, then the vector paths (when
 * compiled; callers check the CPU), declared through their one type. */
typedef void llmem__x8_rows_fn(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch, size_t r0,
                               size_t r1);
llmem__x8_rows_fn llmem__q4k_x8_rows_ref, llmem__q4k_x8_rows_avx2, llmem__q4k_x8_rows_vnni,
    llmem__q4k_x8_rows_avx512;

/* ---- q5_0, the same interleave ----
 *
 * The 32-element q5_0 blocks (ffn_down of a q4_K file whose rows are not
 * whole super-blocks) the same way, in exactly the source's size: the d / 8
 * groups of 8 rows, each n / 32 blocks of X8_Q5_0_BLOCK bytes, then the
 * d % 8 tail rows as q5_0 rows. Block k of rows i = 0..7:
 *   qs[128]  byte (j * 8 + i) * 4 + b = qs[4 j + b] of row i (j < 4, b < 4):
 *            low nibble element 4 j + b, high nibble element 16 + 4 j + b
 *   qh[32]   byte i * 4 + b: bit j the fifth bit of row i's element 4 j + b,
 *            bit 4 + j that of element 16 + 4 j + b
 *   d[8]     f16, row i's scale
 * Results are the q5_0 kernels' bits (acc += (d da) sum per block, in
 * increasing order). */
#define LLMEM__X8_Q5_0_BLOCK 176

size_t llmem__q5_0_x8_bytes(size_t n, size_t d);
void llmem__q5_0_x8_pack(void *dst, const void *src, size_t n, size_t d);
/* As llmem__q4k_x8_rows_*, over A8 activation rows (q5_0's). */
llmem__x8_rows_fn llmem__q5_0_x8_rows_ref, llmem__q5_0_x8_rows_avx2, llmem__q5_0_x8_rows_vnni,
    llmem__q5_0_x8_rows_avx512;

/* ---- q4_0, the same interleave ----
 *
 * q4_0 blocks the same way as q5_0's, without the fifth bits: the d / 8
 * groups of 8 rows, each n / 32 blocks of X8_Q4_0_BLOCK bytes (exactly
 * the source's size), then the d % 8 tail rows as q4_0 rows. Block k of
 * rows i = 0..7:
 *   qs[128]  byte (j * 8 + i) * 4 + b = qs[4 j + b] of row i (j < 4, b < 4):
 *            low nibble element 4 j + b, high nibble element 16 + 4 j + b
 *   d[8]     f16, row i's scale
 * Results are the q4_0 kernels' bits (acc += (d da) sum per block, in
 * increasing order). Why: the in-place q4_0 rows were 0.79x of llama.cpp's
 * prefill and 0.94x of its decode on yi-coder-1.5b (docs/BENCHMARKS.md,
 * 2026-12-06); the interleave gives the decode one linear stream and the
 * prefill the AMX tiles of q5_0. */
#define LLMEM__X8_Q4_0_BLOCK 144

size_t llmem__q4_0_x8_bytes(size_t n, size_t d);
void llmem__q4_0_x8_pack(void *dst, const void *src, size_t n, size_t d);
/* As llmem__q4k_x8_rows_*, over A8 activation rows (q4_0's). */
llmem__x8_rows_fn llmem__q4_0_x8_rows_ref, llmem__q4_0_x8_rows_avx2, llmem__q4_0_x8_rows_vnni,
    llmem__q4_0_x8_rows_avx512;

/* ---- q8_0, the same interleave ----
 *
 * Why. The in-place q8_0 decode reads 8 rows a block at a time: 8
 * interleaved streams 34 bytes a step, which the hardware prefetcher
 * follows worse than one (the kernel prefetches them itself), and each
 * block's 8 f16 scales are gathered from 8 places. Interleaved, the 8
 * rows' block is one linear 272-byte step, its scales one 16-byte load,
 * and the levels are already transposed for the broadcast kernel (lane i
 * = row i, no lane reduction). Exactly the source's size: the d / 8 groups
 * of 8 rows, each n / 32 blocks of X8_Q8_0_BLOCK bytes, then the d % 8
 * tail rows as q8_0 rows. Block k of rows i = 0..7:
 *   qs[256]  byte (j * 8 + i) * 4 + b = qs[4 j + b] of row i (j < 8, b < 4)
 *   d[8]     f16, row i's scale
 * Results are the q8_0 kernels' bits (acc += (d da) sum per block, in
 * increasing order). */
#define LLMEM__X8_Q8_0_BLOCK 272

size_t llmem__q8_0_x8_bytes(size_t n, size_t d);
void llmem__q8_0_x8_pack(void *dst, const void *src, size_t n, size_t d);
/* As llmem__q4k_x8_rows_*, over A8 activation rows (q8_0's). */
llmem__x8_rows_fn llmem__q8_0_x8_rows_ref, llmem__q8_0_x8_rows_avx2, llmem__q8_0_x8_rows_vnni,
    llmem__q8_0_x8_rows_avx512;
/* The AVX-512 kernels (q8_0's, q4_K's, q5_0's, q4_0's) with batches of 8 and more on
 * AMX-INT8 tiles (kernels_q_amx.c): the same bits. Callable only once llmem__amx_enable
 * returned true in this process (the CPU has AMX-TILE and AMX-INT8, the
 * OS saves their state and granted it to the process); _built is false
 * where the compiler cannot target AMX (then it is the AVX-512 kernel). */
llmem__x8_rows_fn llmem__q8_0_x8_rows_amx, llmem__q4k_x8_rows_amx, llmem__q5_0_x8_rows_amx,
    llmem__q4_0_x8_rows_amx;
extern const bool llmem__x8_rows_amx_built;
bool llmem__amx_enable(void);

#endif
