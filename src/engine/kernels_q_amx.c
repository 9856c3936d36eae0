/*
 * kernels_q_amx.c - q8_0 repacked 8 rows interleaved (kernels_q4k_x8.h)
 * against batches of 16 activation rows and more on AMX-INT8 tiles, for
 * the "avx2+avx512vnni+amx" path (kernels.c): prefill on Sapphire Rapids
 * and later Xeons, where llama.cpp's CPU build multiplies q8_0 on these
 * tiles too. Everything else (decode, batch tails, rows outside whole
 * pairs of 8-row groups) is the AVX-512 path's kernel.
 *
 * Algorithm. Per block of 32 elements, one TDPBSSD multiplies a tile of
 * 16 activation rows (16 x 32 signed bytes, read in place: the A8 rows'
 * levels are their first n bytes, one row every ab bytes) by a tile of 8
 * weight rows. The x8 layout is already the tile's "VNNI" form: dword j
 * of the group's 8 rows is 32 contiguous bytes, row i's 4 levels 4j..4j+3
 * at 4i, which is exactly row j of a B tile of 8 columns. Two groups (16
 * weight rows) a pass, two B tiles and two C tiles. The C tiles hold the
 * blocks' exact int32 sums; they are stored (1 KiB) and the float
 * epilogue runs in zmm registers: lane (g, r) takes acc += (dw[r] * da[g])
 * * (float)sum, a multiply and an add as written, the same operations in
 * the same block order as the AVX-512 and AVX2 kernels (x8_q8_0_group16,
 * x8_q8_0_group), whose int32 sums are the same integers by another route
 * (VNNI biases the levels and takes the bias off, exactly). So every y is
 * bitwise the batch-1 kernel's, and batched prefill still equals
 * token-by-token prefill.
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

const bool llmem__q8_0_x8_rows_amx_built = true;

enum { ARCH_REQ_XCOMP_PERM_ = 0x1023, XFEATURE_XTILEDATA_ = 18 };

bool llmem__amx_enable(void)
{
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 0xd) return false;
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
AMX_TARGET static inline __attribute__((always_inline)) void amx_tile(const bool tail, const int M, float *y, size_t d,
                                                                    const uint8_t *act, size_t ab, size_t n, size_t k0,
                                                                    size_t kn, const uint8_t *bj, const float *dj,
                                                                    int32_t *cbuf)
{
    __m512 acc[AMX_M];
    for (int g = 0; g < M; g++) acc[g] = k0 ? _mm512_loadu_ps(y + (size_t)g * d) : _mm512_setzero_ps();
    const float *da = (const float *)(const void *)(act + n) + k0; /* row 0's block scales */
    amx_block(tail, act, ab, k0, bj, cbuf);
    for (size_t kk = 0; kk < kn; kk++) {
        if (kk + 1 < kn) amx_block(tail, act, ab, k0 + kk + 1, bj + (kk + 1) * AMX_BB, cbuf + 256 * ((kk + 1) & 1));
        const int32_t *cb = cbuf + 256 * (kk & 1);
        const __m512 dw = _mm512_load_ps(dj + 16 * kk);
        for (int g = 0; g < M; g++) {
            const float dag = *(const float *)(const void *)((const uint8_t *)(da + kk) + (size_t)g * ab);
            const __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(dag));
            acc[g] = _mm512_add_ps(acc[g], _mm512_mul_ps(sc, _mm512_cvtepi32_ps(_mm512_load_si512(cb + 16 * g))));
        }
    }
    for (int g = 0; g < M; g++) _mm512_storeu_ps(y + (size_t)g * d, acc[g]);
}

AMX_TARGET static void amx_tile16(float *y, size_t d, const uint8_t *act, size_t ab, size_t n, size_t k0, size_t kn,
                                  const uint8_t *bj, const float *dj, int32_t *cbuf)
{
    amx_tile(false, AMX_M, y, d, act, ab, n, k0, kn, bj, dj, cbuf);
}

AMX_TARGET static void amx_tile_tail(int M, float *y, size_t d, const uint8_t *act, size_t ab, size_t n, size_t k0,
                                     size_t kn, const uint8_t *bj, const float *dj, int32_t *cbuf)
{
    amx_tile(true, M, y, d, act, ab, n, k0, kn, bj, dj, cbuf);
}

/* The fewest rows of a smaller last tile, after whole ones: below, the
 * AVX-512 kernel takes them. A batch below 16 (decode of a few sequences)
 * stays on the AVX-512 kernel whole: memory-bound, it streams the weights
 * with its prefetches, where the tiles would join every block for a
 * handful of rows (4 sequences' decode on yi-coder-1.5b q8_0: 0.76x). */
enum { AMX_MIN_ROWS = 4 };

AMX_TARGET void llmem__q8_0_x8_rows_amx(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch,
                                        size_t r0, size_t r1)
{
    const size_t d8 = d / 8 * 8, nb = n / 32, ab = llmem__act_row_bytes(LLMEM_DTYPE_Q8_0, n);
    /* whole pairs of groups inside [r0, r1), from the first group boundary */
    const size_t ra = (r0 + 7) / 8 * 8, top = r1 < d8 ? r1 : d8;
    const size_t rb = top > ra ? ra + (top - ra) / 16 * 16 : ra;
    /* bm rows in whole tiles of 16, then mt more in a smaller one */
    const size_t bm = batch / AMX_M * AMX_M, mt = batch - bm;
    const size_t bt = bm + (mt >= AMX_MIN_ROWS ? mt : 0);
    if (rb == ra || bm == 0) {
        llmem__q8_0_x8_rows_avx512(y, act, w, n, d, batch, r0, r1);
        return;
    }
    if (r0 < ra) llmem__q8_0_x8_rows_avx512(y, act, w, n, d, batch, r0, ra);
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
    _Alignas(64) uint8_t bj[AMX_SLICE * AMX_BB];
    _Alignas(64) float dj[AMX_SLICE * 16];
    _Alignas(64) int32_t cbuf[512];
    const uint8_t *w8 = w, *a0 = act;
    for (size_t r = ra; r < rb; r += 16) {
        const uint8_t *wg = w8 + r / 8 * nb * LLMEM__X8_Q8_0_BLOCK;
        for (size_t k0 = 0; k0 < nb; k0 += AMX_SLICE) {
            const size_t kn = nb - k0 < AMX_SLICE ? nb - k0 : AMX_SLICE;
            amx_join(wg, wg + nb * LLMEM__X8_Q8_0_BLOCK, k0, kn, bj, dj);
            for (size_t b = 0; b < bm; b += AMX_M) amx_tile16(y + b * d + r, d, a0 + b * ab, ab, n, k0, kn, bj, dj, cbuf);
            if (bt > bm) amx_tile_tail((int)mt, y + bm * d + r, d, a0 + bm * ab, ab, n, k0, kn, bj, dj, cbuf);
        }
    }
    _tile_release();
    if (bt < batch) llmem__q8_0_x8_rows_avx512(y + bt * d, a0 + bt * ab, w, n, d, batch - bt, ra, rb);
    if (rb < r1) llmem__q8_0_x8_rows_avx512(y, act, w, n, d, batch, rb, r1);
}

#else
const bool llmem__q8_0_x8_rows_amx_built = false;

bool llmem__amx_enable(void) { return false; }

void llmem__q8_0_x8_rows_amx(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch, size_t r0,
                             size_t r1)
{
    llmem__q8_0_x8_rows_avx512(y, act, w, n, d, batch, r0, r1);
}
#endif
