/*
 * kernels_q_amx.c - the repacked x8 layouts (kernels_q4k_x8.h: q8_0, q5_0,
 * q4_0, q4_K) against batches of 8 activation rows and more on AMX-INT8 tiles,
 * for the "avx2+avx512vnni+amx" path (kernels.c): prefill on Sapphire
 * Rapids and later Xeons, where llama.cpp's CPU build multiplies on these
 * tiles too. Everything else (batches below AMX_ALONE_ROWS, a last tile of
 * fewer than AMX_MIN_ROWS rows, rows outside whole pairs of 8-row groups) is the
 * AVX-512 path's kernel.
 *
 * Algorithm. Per 32-element block (q4_K: per 32-element group of a
 * super-block), one TDPBSSD multiplies a tile of 16 activation rows (16 x
 * 32 signed bytes, read in place: the A8/A8K rows' levels are their first
 * n bytes, one row every ab bytes) by a tile of 16 weight rows. The x8
 * layout is nearly the tile's "VNNI" form: dword j of a group's 8 rows is
 * 32 contiguous bytes, row i's levels 4j..4j+3 at 4i; two groups are joined
 * into one 16-column B tile (q5_0, q4_0 and q4_K unpacking their nibbles), 32
 * blocks (q4_K: 3 super-blocks) of a pair of groups at a time, reused by
 * every activation tile. The C tile holds the block's exact int32 sums; it
 * is stored and the epilogue runs in zmm registers, one activation row a
 * register, lane r a weight row: the x8 kernels' integers (q5_0, q4_0: minus 16 or 8
 * x the activation block's sum; q4_K: scales times group sums, mins times
 * the activation's sums of 32) and then their float operations (acc +=
 * (dw[r] * da) * (float)sum, a multiply and an add as written) in their
 * block order. The AVX-512 and AVX2 kernels reach the same integers by
 * another route (VNNI biases the levels and takes the bias off, exactly),
 * so every y is bitwise the batch-1 kernel's, and batched prefill still
 * equals token-by-token prefill.
 *
 * Tile state. Linux enables the AMX tile data only for a process that asks
 * (arch_prctl ARCH_REQ_XCOMP_PERM, once: llmem__amx_enable, called where
 * the path is chosen); each call loads the tile configuration and releases
 * the tiles when it returns, so a thread holds no 8 KiB of tile state
 * between matmuls and a context switch saves none.
 */
#include <stdint.h>
#include <string.h>

#include "kernels_q.h"
#include "kernels_q4k_x8.h"
#include "kernels_q_layout.h"

#if defined(__x86_64__) && (defined(__clang__) ? __clang_major__ >= 12 : (defined(__GNUC__) && __GNUC__ >= 11))
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define AMX_TARGET \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512vnni,amx-tile,amx-int8")))

const bool llmem__x8_rows_amx_built = true;

enum { ARCH_REQ_XCOMP_PERM_ = 0x1023, XFEATURE_XTILEDATA_ = 18 };

bool llmem__amx_enable(void)
{
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 0xd) return false;
    __cpuid_count(1, 0, a, b, c, d);
    if (!(c & (1u << 27))) return false; /* OSXSAVE: XGETBV usable */
    __cpuid_count(7, 0, a, b, c, d);
    /* AMX-TILE (EDX bit 24) and AMX-INT8 (bit 25) */
    if ((d & (3u << 24)) != (3u << 24)) return false;
    /* XTILECFG and XTILEDATA in the OS's XCR0 (bits 17, 18) */
    unsigned xcr0_lo, xcr0_hi;
    __asm__ __volatile__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    if ((xcr0_lo & (3u << 17)) != (3u << 17)) return false;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM_, XFEATURE_XTILEDATA_) == 0;
}

/* The tile configuration (palette 1): tile 0 the activations (16 rows of
 * 32 bytes: one block), 1 the weights (8 rows of 64 bytes: one block of 16
 * weight rows), 2 the sums (16 rows of 16 int32). */
typedef struct tilecfg {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

enum {
    AMX_M = 16,     /* activation rows a tile */
    AMX_SLICE = 32, /* blocks of a pair of groups joined at a time (16 KiB) */
    AMX_BB = 512    /* bytes of one block of 16 weight rows, joined */
};

/* Blocks [k0, k0 + kn) of the groups at wg and wg2 joined as B tiles of
 * 16 weight rows: row j of block kk is the first group's dword j (32
 * bytes, rows 0..7) then the second's (rows 8..15), so a tile has 16
 * columns instead of 8 (half the tile loads, stores and TDPBSSDs of two
 * 8-column tiles: those were the kernel's time); their scales as 16
 * floats a block. */
AMX_TARGET static void amx_join(const uint8_t *wg, const uint8_t *wg2, size_t k0, size_t kn, uint8_t *bj, float *dj)
{
    for (size_t kk = 0; kk < kn; kk++) {
        const uint8_t *b1 = wg + (k0 + kk) * LLMEM__X8_Q8_0_BLOCK, *b2 = wg2 + (k0 + kk) * LLMEM__X8_Q8_0_BLOCK;
        for (int j = 0; j < 8; j++) {
            const __m256i lo = _mm256_loadu_si256((const __m256i *)(const void *)(b1 + 32 * j));
            const __m256i hi = _mm256_loadu_si256((const __m256i *)(const void *)(b2 + 32 * j));
            _mm512_store_si512(bj + kk * AMX_BB + 64 * (size_t)j, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
        }
        const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(b1 + 256)));
        const __m256 d2 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(b2 + 256)));
        _mm512_store_ps(dj + 16 * kk, _mm512_insertf32x8(_mm512_castps256_ps512(d1), d2, 1));
    }
}

/* The same for q5_0 repacked x8 (LLMEM__X8_Q5_0_BLOCK): row j of a block's
 * B tile is the levels 4j..4j+3 as stored, q + 16 in 0..31 (a nibble and
 * its fifth bit, moved as x8_q5_0_group moves them), the x8 kernel's
 * unsigned levels; the epilogue takes 16 x the activation block's sum off. */
AMX_TARGET static void amx_join_q5_0(const uint8_t *wg, const uint8_t *wg2, size_t k0, size_t kn, uint8_t *bj,
                                     float *dj)
{
    const __m512i m15 = _mm512_set1_epi8(15), m16 = _mm512_set1_epi8(16);
    for (size_t kk = 0; kk < kn; kk++) {
        const uint8_t *b1 = wg + (k0 + kk) * LLMEM__X8_Q5_0_BLOCK, *b2 = wg2 + (k0 + kk) * LLMEM__X8_Q5_0_BLOCK;
        const __m512i qh = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)(b1 + 128))),
            _mm256_loadu_si256((const __m256i *)(const void *)(b2 + 128)), 1);
        for (int j = 0; j < 4; j++) {
            const __m512i raw = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)(b1 + 32 * j))),
                _mm256_loadu_si256((const __m256i *)(const void *)(b2 + 32 * j)), 1);
            const __m512i lo =
                _mm512_or_si512(_mm512_and_si512(raw, m15), _mm512_and_si512(_mm512_slli_epi16(qh, 4 - j), m16));
            const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(raw, 4), m15),
                                               _mm512_and_si512(_mm512_srli_epi16(qh, j), m16));
            _mm512_store_si512(bj + kk * AMX_BB + 64 * (size_t)j, lo);
            _mm512_store_si512(bj + kk * AMX_BB + 64 * (size_t)(4 + j), hi);
        }
        const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(b1 + 160)));
        const __m256 d2 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(b2 + 160)));
        _mm512_store_ps(dj + 16 * kk, _mm512_insertf32x8(_mm512_castps256_ps512(d1), d2, 1));
    }
}

/* The same for q4_0 repacked x8 (LLMEM__X8_Q4_0_BLOCK): q5_0's join
 * without the fifth bits, the levels q + 8 in 0..15; the epilogue takes 8
 * x the activation block's sum off. */
AMX_TARGET static void amx_join_q4_0(const uint8_t *wg, const uint8_t *wg2, size_t k0, size_t kn, uint8_t *bj,
                                     float *dj)
{
    const __m512i m15 = _mm512_set1_epi8(15);
    for (size_t kk = 0; kk < kn; kk++) {
        const uint8_t *b1 = wg + (k0 + kk) * LLMEM__X8_Q4_0_BLOCK, *b2 = wg2 + (k0 + kk) * LLMEM__X8_Q4_0_BLOCK;
        for (int j = 0; j < 4; j++) {
            const __m512i raw = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)(b1 + 32 * j))),
                _mm256_loadu_si256((const __m256i *)(const void *)(b2 + 32 * j)), 1);
            _mm512_store_si512(bj + kk * AMX_BB + 64 * (size_t)j, _mm512_and_si512(raw, m15));
            _mm512_store_si512(bj + kk * AMX_BB + 64 * (size_t)(4 + j),
                               _mm512_and_si512(_mm512_srli_epi16(raw, 4), m15));
        }
        const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(b1 + 128)));
        const __m256 d2 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(b2 + 128)));
        _mm512_store_ps(dj + 16 * kk, _mm512_insertf32x8(_mm512_castps256_ps512(d1), d2, 1));
    }
}

/* Block k0 + kk's int32 sums into cb (cb[16 g + r]: activation row g,
 * weight row r): tiles 0 and 2 for 16 activation rows, 3 and 4 for a
 * batch's last rows (the tile numbers must be constants). */
#define AMX_BLOCK(TA, TC, act, ab, k, bblk, cb)            \
    do {                                                   \
        _tile_loadd(TA, (act) + 32 * (k), (long)(ab));     \
        _tile_loadd(1, (bblk), 64);                        \
        _tile_zero(TC);                                    \
        _tile_dpbssd(TC, TA, 1);                           \
        _tile_stored(TC, (cb), 64);                        \
    } while (0)

AMX_TARGET static inline __attribute__((always_inline)) void amx_block(const bool tail, const uint8_t *act, size_t ab,
                                                                     size_t k, const uint8_t *bblk, int32_t *cb)
{
    if (tail) AMX_BLOCK(3, 4, act, ab, k, bblk, cb);
    else AMX_BLOCK(0, 2, act, ab, k, bblk, cb);
}

/* y[g][0..15] (stride d) for the M activation rows at act (stride ab)
 * over blocks [k0, k0 + kn) joined in bj, dj: the sums so far come from y
 * when k0 > 0 (a float stored and loaded back is the same float). cbuf:
 * 2 KiB, 64-byte aligned. Block kk + 1's tile work is issued before block
 * kk's epilogue, into the other half of cbuf, so the epilogue's loads
 * never wait on the stores just issued (that wait was a third of the
 * kernel's samples). Inlined twice: M = 16 (tiles 0, 2) with the
 * accumulators in registers, and a batch's last M < 16 rows (tiles 3, 4). */
AMX_TARGET static inline __attribute__((always_inline)) void amx_tile(const int bias, const bool tail, const int M,
                                                                    float *y, size_t d, const uint8_t *act, size_t ab,
                                                                    size_t n, size_t k0, size_t kn, const uint8_t *bj,
                                                                    const float *dj, int32_t *cbuf)
{
    __m512 acc[AMX_M];
    for (int g = 0; g < M; g++) acc[g] = k0 ? _mm512_loadu_ps(y + (size_t)g * d) : _mm512_setzero_ps();
    const float *da = (const float *)(const void *)(act + n) + k0; /* row 0's block scales (a8_view's d) */
    /* row 0's exact block sums (a8_view's xs), for a biased type */
    const int32_t *xs = (const int32_t *)(const void *)(act + n + 8 * (n / 32)) + k0;
    amx_block(tail, act, ab, k0, bj, cbuf);
    for (size_t kk = 0; kk < kn; kk++) {
        if (kk + 1 < kn) amx_block(tail, act, ab, k0 + kk + 1, bj + (kk + 1) * AMX_BB, cbuf + 256 * ((kk + 1) & 1));
        const int32_t *cb = cbuf + 256 * (kk & 1);
        const __m512 dw = _mm512_load_ps(dj + 16 * kk);
        for (int g = 0; g < M; g++) {
            const float dag = *(const float *)(const void *)((const uint8_t *)(da + kk) + (size_t)g * ab);
            const __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(dag));
            __m512i sum = _mm512_load_si512(cb + 16 * g);
            if (bias) {
                const int32_t x = *(const int32_t *)(const void *)((const uint8_t *)(xs + kk) + (size_t)g * ab);
                sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(bias * x));
            }
            acc[g] = _mm512_add_ps(acc[g], _mm512_mul_ps(sc, _mm512_cvtepi32_ps(sum)));
        }
    }
    for (int g = 0; g < M; g++) _mm512_storeu_ps(y + (size_t)g * d, acc[g]);
}

AMX_TARGET static void amx_tile16(float *y, size_t d, const uint8_t *act, size_t ab, size_t n, size_t k0, size_t kn,
                                  const uint8_t *bj, const float *dj, int32_t *cbuf)
{
    amx_tile(0, false, AMX_M, y, d, act, ab, n, k0, kn, bj, dj, cbuf);
}

AMX_TARGET static void amx_tile_tail(int M, float *y, size_t d, const uint8_t *act, size_t ab, size_t n, size_t k0,
                                     size_t kn, const uint8_t *bj, const float *dj, int32_t *cbuf)
{
    amx_tile(0, true, M, y, d, act, ab, n, k0, kn, bj, dj, cbuf);
}

AMX_TARGET static void amx_q5_tile16(float *y, size_t d, const uint8_t *act, size_t ab, size_t n, size_t k0,
                                     size_t kn, const uint8_t *bj, const float *dj, int32_t *cbuf)
{
    amx_tile(16, false, AMX_M, y, d, act, ab, n, k0, kn, bj, dj, cbuf);
}

AMX_TARGET static void amx_q5_tile_tail(int M, float *y, size_t d, const uint8_t *act, size_t ab, size_t n,
                                        size_t k0, size_t kn, const uint8_t *bj, const float *dj, int32_t *cbuf)
{
    amx_tile(16, true, M, y, d, act, ab, n, k0, kn, bj, dj, cbuf);
}

AMX_TARGET static void amx_q4_tile16(float *y, size_t d, const uint8_t *act, size_t ab, size_t n, size_t k0,
                                     size_t kn, const uint8_t *bj, const float *dj, int32_t *cbuf)
{
    amx_tile(8, false, AMX_M, y, d, act, ab, n, k0, kn, bj, dj, cbuf);
}

AMX_TARGET static void amx_q4_tile_tail(int M, float *y, size_t d, const uint8_t *act, size_t ab, size_t n,
                                        size_t k0, size_t kn, const uint8_t *bj, const float *dj, int32_t *cbuf)
{
    amx_tile(8, true, M, y, d, act, ab, n, k0, kn, bj, dj, cbuf);
}

/* ---- q4_K repacked x8 ---------------------------------------------------------
 * Per super-block (256 elements), each of its eight 32-element groups is
 * one TDPBSSD (the 4-bit levels 0..15 are valid signed bytes) of 16
 * activation rows by 16 weight rows, the two x8 groups' nibbles unpacked
 * into one 16-column B tile at the join; the eight C tiles are stored and
 * the epilogue forms, per activation row, the x8 kernel's integers in
 * int32 (sumi = sum over groups of scale x group sum, sm = sum of min x
 * the activation's sums of 32) and then its float operations: acc += (d
 * da) sumi, acc -= (dmin da) sm. The same integers, the same floats in the
 * same order: the bits of llmem__q4k_x8_rows_avx512 (x8_group). */

/* One super-block of a pair of x8 groups, joined. */
typedef struct q4k_joined {
    _Alignas(64) uint8_t b[8][512]; /* group g's B tile: row j = the two groups' levels 4j..4j+3 */
    int32_t sc[8][16];              /* group g's scale of weight row r */
    int16_t mp[4][32];              /* mins of groups 2q, 2q + 1, an int16 pair per row r */
    float dw[16], dm[16];           /* d and dmin of row r */
} q4k_joined;

enum { AMX_Q4K_SLICE = 3 }; /* super-blocks joined at a time (15 KiB) */

AMX_TARGET static void amx_q4k_join(const uint8_t *wg, const uint8_t *wg2, size_t k0, size_t kn, q4k_joined *bj)
{
    const __m512i m15 = _mm512_set1_epi8(15);
    for (size_t kk = 0; kk < kn; kk++) {
        const uint8_t *b1 = wg + (k0 + kk) * LLMEM__X8_BLOCK, *b2 = wg2 + (k0 + kk) * LLMEM__X8_BLOCK;
        q4k_joined *o = bj + kk;
        for (int p = 0; p < 4; p++)
            for (int j = 0; j < 8; j++) {
                const size_t off = (size_t)(p * 8 + j) * 32;
                const __m512i raw = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)(b1 + off))),
                    _mm256_loadu_si256((const __m256i *)(const void *)(b2 + off)), 1);
                _mm512_store_si512(o->b[2 * p] + 64 * j, _mm512_and_si512(raw, m15));
                _mm512_store_si512(o->b[2 * p + 1] + 64 * j, _mm512_and_si512(_mm512_srli_epi16(raw, 4), m15));
            }
        for (int g = 0; g < 8; g++) {
            const __m128i s = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(const void *)(b1 + 1024 + 8 * g)),
                                                 _mm_loadl_epi64((const __m128i *)(const void *)(b2 + 1024 + 8 * g)));
            _mm512_store_si512(o->sc[g], _mm512_cvtepu8_epi32(s));
        }
        for (int q = 0; q < 4; q++) {
            const __m256i m = _mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(b1 + 1088 + 16 * q))),
                _mm_loadu_si128((const __m128i *)(const void *)(b2 + 1088 + 16 * q)), 1);
            _mm512_store_si512(o->mp[q], _mm512_cvtepu8_epi16(m));
        }
        const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(b1 + 1152)));
        const __m256 d2 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(b2 + 1152)));
        const __m256 m1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(b1 + 1168)));
        const __m256 m2 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(b2 + 1168)));
        _mm512_store_ps(o->dw, _mm512_insertf32x8(_mm512_castps256_ps512(d1), d2, 1));
        _mm512_store_ps(o->dm, _mm512_insertf32x8(_mm512_castps256_ps512(m1), m2, 1));
    }
}

/* Super-block k's eight groups of sums into cb (cb[256 g + 16 m + r]). */
AMX_TARGET static inline __attribute__((always_inline)) void amx_q4k_blocks(const bool tail, const uint8_t *act,
                                                                          size_t ab, size_t k, const q4k_joined *o,
                                                                          int32_t *cb)
{
    for (int g = 0; g < 8; g++) amx_block(tail, act + 256 * k, ab, (size_t)g, o->b[g], cb + 256 * g);
}

/* y[m][0..15] (stride d) for the M activation rows at act (A8K rows,
 * stride ab) over super-blocks [k0, k0 + kn) joined in bj; the sums so
 * far come from y when k0 > 0. cbuf: 16 KiB (two halves, as amx_tile). */
AMX_TARGET static inline __attribute__((always_inline)) void amx_q4k_tile(const bool tail, const int M, float *y,
                                                                        size_t d, const uint8_t *act, size_t ab,
                                                                        size_t n, size_t k0, size_t kn,
                                                                        const q4k_joined *bj, int32_t *cbuf)
{
    const size_t bs_off = n, d_off = n + 2 * (n / 16); /* a8k_view's bs and d */
    amx_q4k_blocks(tail, act, ab, k0, bj, cbuf);
    for (size_t kk = 0; kk < kn; kk++) {
        if (kk + 1 < kn) amx_q4k_blocks(tail, act, ab, k0 + kk + 1, bj + kk + 1, cbuf + 2048 * ((kk + 1) & 1));
        const int32_t *cb = cbuf + 2048 * (kk & 1);
        const q4k_joined *o = bj + kk;
        const size_t k = k0 + kk;
        for (int m = 0; m < M; m++) {
            const uint8_t *row = act + (size_t)m * ab;
            __m512i sumi = _mm512_mullo_epi32(_mm512_load_si512(cb + 16 * m), _mm512_load_si512(o->sc[0]));
            for (int g = 1; g < 8; g++)
                sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(_mm512_load_si512(cb + 256 * g + 16 * m),
                                                                 _mm512_load_si512(o->sc[g])));
            const int16_t *bs = (const int16_t *)(const void *)(row + bs_off) + 16 * k;
            /* the activation's sums of 32: B_q = bs[2q] + bs[2q + 1], as int16 */
            const __m128i B = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)(const void *)bs),
                                             _mm_loadu_si128((const __m128i *)(const void *)(bs + 8)));
            __m512i sm = _mm512_madd_epi16(_mm512_load_si512(o->mp[0]), _mm512_broadcastd_epi32(B));
            sm = _mm512_add_epi32(sm, _mm512_madd_epi16(_mm512_load_si512(o->mp[1]),
                                                        _mm512_broadcastd_epi32(_mm_srli_si128(B, 4))));
            sm = _mm512_add_epi32(sm, _mm512_madd_epi16(_mm512_load_si512(o->mp[2]),
                                                        _mm512_broadcastd_epi32(_mm_srli_si128(B, 8))));
            sm = _mm512_add_epi32(sm, _mm512_madd_epi16(_mm512_load_si512(o->mp[3]),
                                                        _mm512_broadcastd_epi32(_mm_srli_si128(B, 12))));
            const __m512 da = _mm512_set1_ps(((const float *)(const void *)(row + d_off))[k]);
            float *ym = y + (size_t)m * d;
            __m512 acc = k ? _mm512_loadu_ps(ym) : _mm512_setzero_ps();
            acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(_mm512_load_ps(o->dw), da), _mm512_cvtepi32_ps(sumi)));
            acc = _mm512_sub_ps(acc, _mm512_mul_ps(_mm512_mul_ps(_mm512_load_ps(o->dm), da), _mm512_cvtepi32_ps(sm)));
            _mm512_storeu_ps(ym, acc);
        }
    }
}

AMX_TARGET static void amx_q4k_tile16(float *y, size_t d, const uint8_t *act, size_t ab, size_t n, size_t k0,
                                      size_t kn, const q4k_joined *bj, int32_t *cbuf)
{
    amx_q4k_tile(false, AMX_M, y, d, act, ab, n, k0, kn, bj, cbuf);
}

AMX_TARGET static void amx_q4k_tile_tail(int M, float *y, size_t d, const uint8_t *act, size_t ab, size_t n,
                                         size_t k0, size_t kn, const q4k_joined *bj, int32_t *cbuf)
{
    amx_q4k_tile(true, M, y, d, act, ab, n, k0, kn, bj, cbuf);
}

/* ---- the row loop, both layouts ------------------------------------------------ */

/* The fewest rows of a smaller last tile, after whole ones: below, the
 * AVX-512 kernel takes them. A batch below 16 takes one tile alone from
 * AMX_ALONE_ROWS rows: below that (decode of a few sequences) it stays on
 * the AVX-512 kernel whole, memory-bound, streaming the weights with its
 * prefetches, where the tiles would join every block for a handful of
 * rows (4 sequences' decode on yi-coder-1.5b q8_0 with a tile of 4:
 * 0.76x). From 8 the tile pays (paired A/B against 4 alone-free, the
 * 11-token short prompt's prefill on yi-coder-1.5b q8_0 1.113x; 8
 * sequences' decode q8_0 0.972x and 1.017x in two series, q4_K 1.107x). */
enum { AMX_MIN_ROWS = 4, AMX_ALONE_ROWS = 8 };

/* Rows [r0, r1) of y for `batch` activation rows: whole pairs of x8
 * groups of type t (q8_0, q5_0, q4_0, q4_K) on tiles, 16 activation rows a
 * tile and a smaller last one of at least AMX_MIN_ROWS (alone: at least
 * AMX_ALONE_ROWS); everything else
 * through `rest`, the AVX-512 kernel. */
AMX_TARGET static inline __attribute__((always_inline)) void amx_rows(const uint32_t t, llmem__x8_rows_fn *rest,
                                                                    float *y, const void *act, const void *w, size_t n,
                                                                    size_t d, size_t batch, size_t r0, size_t r1)
{
    const bool q4k = t == LLMEM_DTYPE_Q4_K, q5 = t == LLMEM_DTYPE_Q5_0, q4 = t == LLMEM_DTYPE_Q4_0;
    const size_t d8 = d / 8 * 8, nb = n / (q4k ? 256 : 32), ab = llmem__act_row_bytes(t, n);
    const size_t gbytes = nb * (q4k  ? LLMEM__X8_BLOCK
                                : q5 ? LLMEM__X8_Q5_0_BLOCK
                                : q4 ? LLMEM__X8_Q4_0_BLOCK
                                     : LLMEM__X8_Q8_0_BLOCK); /* a group */
    /* whole pairs of groups inside [r0, r1), from the first group boundary */
    const size_t ra = (r0 + 7) / 8 * 8, top = r1 < d8 ? r1 : d8;
    const size_t rb = top > ra ? ra + (top - ra) / 16 * 16 : ra;
    /* bm rows in whole tiles of 16, then mt more in a smaller one */
    const size_t bm = batch / AMX_M * AMX_M, mt = batch - bm;
    const size_t bt = bm + (mt >= (bm ? AMX_MIN_ROWS : AMX_ALONE_ROWS) ? mt : 0);
    if (rb == ra || bt == 0) {
        rest(y, act, w, n, d, batch, r0, r1);
        return;
    }
    if (r0 < ra) rest(y, act, w, n, d, batch, r0, ra);
    tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    cfg.rows[0] = AMX_M; /* A, 16 rows */
    cfg.colsb[0] = 32;
    cfg.rows[1] = 8; /* B */
    cfg.colsb[1] = 64;
    cfg.rows[2] = AMX_M; /* C, 16 rows */
    cfg.colsb[2] = 64;
    if (bt > bm) {
        cfg.rows[3] = (uint8_t)mt; /* A, the last rows */
        cfg.colsb[3] = 32;
        cfg.rows[4] = (uint8_t)mt; /* C, the last rows */
        cfg.colsb[4] = 64;
    }
    _tile_loadconfig(&cfg);
    const uint8_t *w8 = w, *a0 = act;
    if (q4k) {
        _Alignas(64) q4k_joined bj[AMX_Q4K_SLICE];
        _Alignas(64) int32_t cbuf[2 * 2048];
        for (size_t r = ra; r < rb; r += 16) {
            const uint8_t *wg = w8 + r / 8 * gbytes;
            for (size_t k0 = 0; k0 < nb; k0 += AMX_Q4K_SLICE) {
                const size_t kn = nb - k0 < AMX_Q4K_SLICE ? nb - k0 : AMX_Q4K_SLICE;
                amx_q4k_join(wg, wg + gbytes, k0, kn, bj);
                for (size_t b = 0; b < bm; b += AMX_M)
                    amx_q4k_tile16(y + b * d + r, d, a0 + b * ab, ab, n, k0, kn, bj, cbuf);
                if (bt > bm) amx_q4k_tile_tail((int)mt, y + bm * d + r, d, a0 + bm * ab, ab, n, k0, kn, bj, cbuf);
            }
        }
    } else {
        _Alignas(64) uint8_t bj[AMX_SLICE * AMX_BB];
        _Alignas(64) float dj[AMX_SLICE * 16];
        _Alignas(64) int32_t cbuf[512];
        for (size_t r = ra; r < rb; r += 16) {
            const uint8_t *wg = w8 + r / 8 * gbytes;
            for (size_t k0 = 0; k0 < nb; k0 += AMX_SLICE) {
                const size_t kn = nb - k0 < AMX_SLICE ? nb - k0 : AMX_SLICE;
                if (q5) {
                    amx_join_q5_0(wg, wg + gbytes, k0, kn, bj, dj);
                    for (size_t b = 0; b < bm; b += AMX_M)
                        amx_q5_tile16(y + b * d + r, d, a0 + b * ab, ab, n, k0, kn, bj, dj, cbuf);
                    if (bt > bm) amx_q5_tile_tail((int)mt, y + bm * d + r, d, a0 + bm * ab, ab, n, k0, kn, bj, dj, cbuf);
                } else if (q4) {
                    amx_join_q4_0(wg, wg + gbytes, k0, kn, bj, dj);
                    for (size_t b = 0; b < bm; b += AMX_M)
                        amx_q4_tile16(y + b * d + r, d, a0 + b * ab, ab, n, k0, kn, bj, dj, cbuf);
                    if (bt > bm) amx_q4_tile_tail((int)mt, y + bm * d + r, d, a0 + bm * ab, ab, n, k0, kn, bj, dj, cbuf);
                } else {
                    amx_join(wg, wg + gbytes, k0, kn, bj, dj);
                    for (size_t b = 0; b < bm; b += AMX_M)
                        amx_tile16(y + b * d + r, d, a0 + b * ab, ab, n, k0, kn, bj, dj, cbuf);
                    if (bt > bm) amx_tile_tail((int)mt, y + bm * d + r, d, a0 + bm * ab, ab, n, k0, kn, bj, dj, cbuf);
                }
            }
        }
    }
    _tile_release();
    if (bt < batch) rest(y + bt * d, a0 + bt * ab, w, n, d, batch - bt, ra, rb);
    if (rb < r1) rest(y, act, w, n, d, batch, rb, r1);
}

AMX_TARGET void llmem__q8_0_x8_rows_amx(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch,
                                        size_t r0, size_t r1)
{
    amx_rows(LLMEM_DTYPE_Q8_0, llmem__q8_0_x8_rows_avx512, y, act, w, n, d, batch, r0, r1);
}

AMX_TARGET void llmem__q5_0_x8_rows_amx(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch,
                                        size_t r0, size_t r1)
{
    amx_rows(LLMEM_DTYPE_Q5_0, llmem__q5_0_x8_rows_avx512, y, act, w, n, d, batch, r0, r1);
}

AMX_TARGET void llmem__q4_0_x8_rows_amx(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch,
                                        size_t r0, size_t r1)
{
    amx_rows(LLMEM_DTYPE_Q4_0, llmem__q4_0_x8_rows_avx512, y, act, w, n, d, batch, r0, r1);
}

AMX_TARGET void llmem__q4k_x8_rows_amx(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch,
                                       size_t r0, size_t r1)
{
    amx_rows(LLMEM_DTYPE_Q4_K, llmem__q4k_x8_rows_avx512, y, act, w, n, d, batch, r0, r1);
}

#else
const bool llmem__x8_rows_amx_built = false;

bool llmem__amx_enable(void) { return false; }

void llmem__q8_0_x8_rows_amx(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch, size_t r0,
                             size_t r1)
{
    llmem__q8_0_x8_rows_avx512(y, act, w, n, d, batch, r0, r1);
}

void llmem__q4k_x8_rows_amx(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch, size_t r0,
                            size_t r1)
{
    llmem__q4k_x8_rows_avx512(y, act, w, n, d, batch, r0, r1);
}

void llmem__q5_0_x8_rows_amx(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch, size_t r0,
                             size_t r1)
{
    llmem__q5_0_x8_rows_avx512(y, act, w, n, d, batch, r0, r1);
}

void llmem__q4_0_x8_rows_amx(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch, size_t r0,
                             size_t r1)
{
    llmem__q4_0_x8_rows_avx512(y, act, w, n, d, batch, r0, r1);
}
#endif
