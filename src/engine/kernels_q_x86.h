/*
 * kernels_q_x86.h - the vector integer dot products of kernels_q.c, as a
 * template: kernels_q_path.h defines KQ_TARGET_STR (the target attribute),
 * KQ_VNNI (0 or 1) and the export names (KQ_EXPORT, KQ_EXPORT_X8,
 * KQ_EXPORT_X8_Q5_0, KQ_EXPORT_X8_Q4_0, KQ_EXPORT_X8_Q8_0) and includes this once for each path's .c file;
 * every helper is static to that file. Private to llmem.
 *
 * With KQ_VNNI the u8 x s8 sums of four products are one vpdpbusd
 * (AVX-VNNI) instead of vpmaddubsw + vpmaddwd: the same integers (none of
 * the sums here saturates maddubs' int16), so the same bits out. With
 * KQ_AVX512 (which needs KQ_VNNI) that vpdpbusd is the EVEX one of
 * AVX512-VNNI + VL, and batches of the 32-element types (in place) and of
 * q8_0 repacked run 16 weight rows a pass, one row a 32-bit lane of a zmm
 * (the "16 rows" section below): the same integers and the same float
 * operations per row, so the same bits again.
 */
#include <immintrin.h>
#include <string.h>

#include "kernels_q.h"
#include "kernels_q_layout.h"

#ifndef KQ_AVX512
#define KQ_AVX512 0
#endif
#if KQ_AVX512 && !KQ_VNNI
#error "KQ_AVX512 needs KQ_VNNI: its kernels keep every level unsigned"
#endif
/* acc + the u8 x s8 4-product sums per int32 lane, 256 bits: VEX (AVX-VNNI)
 * or EVEX (AVX512-VNNI + VL) encoded. */
#if KQ_AVX512
#define kq_dpbusd256 _mm256_dpbusd_epi32
#else
#define kq_dpbusd256 _mm256_dpbusd_avx_epi32
#endif

#define KQ_TARGET __attribute__((target(KQ_TARGET_STR)))
#define KQ_INLINE static inline __attribute__((always_inline, target(KQ_TARGET_STR)))
#if defined(__clang__)
#define KQ_UNROLL _Pragma("unroll")
#else
#define KQ_UNROLL _Pragma("GCC unroll 8")
#endif
#define MAXB 4 /* activation rows per pass over a weight row */

KQ_INLINE float kq_h2f(uint16_t h) { return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h))); }

/* Every 64-byte line of [p, p + bytes) fetched into L1: the weight streams
 * that the kernels below read ahead of their loads. A line past the end
 * of a mapping is harmless (a prefetch never faults). */
KQ_INLINE void fetch_lines(const void *p, size_t bytes)
{
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)p + o, _MM_HINT_T0);
}

/* 32 nibbles of 16 bytes: low nibbles in bytes 0..15, high nibbles in 16..31. */
KQ_INLINE __m256i nibbles16(const uint8_t *p)
{
    __m128i b = _mm_loadu_si128((const __m128i *)(const void *)p);
    __m128i m = _mm_set1_epi8(15);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}

/* Byte j of the result is 0xFF where bit j of the u32 at p is set. */
KQ_INLINE __m256i bits32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    __m256i x = _mm256_shuffle_epi8(_mm256_set1_epi32((int)v),
                                    _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                                      0x0101010101010101LL, 0x0000000000000000LL));
    __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_cmpeq_epi8(_mm256_and_si256(x, bit), bit);
}

/* The bias the vector kernels add to a signed type's levels to make them
 * unsigned for the u8 x s8 products (then subtract bias * the activation
 * block's sum, xs): q4_0 and q5_0 as stored (q + 8, q + 16); q8_0 only
 * with VNNI, whose vpdpbusd sums into int32 (with maddubs, 255 x 127 x 2
 * would saturate int16: that path keeps the levels signed and moves their
 * signs onto the activation). 0: unsigned already (q4_1, q5_1), or signed. */
KQ_INLINE int w_bias(const uint32_t t)
{
    return t == LLMEM_DTYPE_Q4_0 ? 8 : t == LLMEM_DTYPE_Q5_0 ? 16 : t == LLMEM_DTYPE_Q8_0 && KQ_VNNI ? 128 : 0;
}

/* The 32 weight levels of a 32-element block, unsigned (q + w_bias(t);
 * q4_1, q5_1 as stored) or, for q8_0 without VNNI, signed; and its scale
 * and minimum. */
KQ_INLINE __m256i w_levels32(const uint32_t t, const uint8_t *blk, float *dw, float *mw)
{
    switch (t) {
    case LLMEM_DTYPE_Q8_0: {
        *dw = kq_h2f(((const llmem__q8_0 *)(const void *)blk)->d);
        __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 2));
        return KQ_VNNI ? _mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)) : q;
    }
    case LLMEM_DTYPE_Q4_0:
        *dw = kq_h2f(((const llmem__q4_0 *)(const void *)blk)->d);
        return nibbles16(blk + 2);
    case LLMEM_DTYPE_Q4_1:
        *dw = kq_h2f(((const llmem__q4_1 *)(const void *)blk)->d);
        *mw = kq_h2f(((const llmem__q4_1 *)(const void *)blk)->m);
        return nibbles16(blk + 4);
    case LLMEM_DTYPE_Q5_0:
        *dw = kq_h2f(((const llmem__q5_0 *)(const void *)blk)->d);
        return _mm256_or_si256(nibbles16(blk + 6), _mm256_and_si256(bits32(blk + 2), _mm256_set1_epi8(16)));
    default: { /* q5_1 */
        *dw = kq_h2f(((const llmem__q5_1 *)(const void *)blk)->d);
        *mw = kq_h2f(((const llmem__q5_1 *)(const void *)blk)->m);
        __m256i hb = _mm256_and_si256(bits32(blk + 4), _mm256_set1_epi8(16));
        return _mm256_or_si256(nibbles16(blk + 8), hb);
    }
    }
}

/* ---- the 32-element types: eight weight rows a pass, one row per lane ----
 *
 * A block's dot product for 8 weight rows at once: the 8 rows' levels are
 * transposed so that 32-bit lane i of T[j] holds bytes 4j..4j+3 of row i
 * (an 8 x 8 transpose of dwords), and the activation's bytes 4j..4j+3 are
 * broadcast: one vpdpbusd then adds 4 products to every row's sum, 8 of
 * them make the block, and lane i ends with row i's exact block sum. The
 * float epilogue (scale, convert, add) is then one vector op for 8 rows
 * instead of 8, and no lane reduction is needed at the end. Batches of 2
 * or more unpack and transpose a tile of 8 rows x KC blocks once into a
 * stack buffer and run every activation row over it (4 at a time, the
 * buffer's rows loaded once for 4); batch 1 (decode) needs no transpose:
 * it sums each row's block in 8 lanes and reduces the 8 rows' lanes at
 * once (hsum8_epi32), the same exact integers.
 *
 * Order: per (row, activation row) blocks in increasing order, as the
 * reference: acc += (dw * da) * (float)Σ, then (q4_1, q5_1) acc += mw *
 * sa, a multiply and an add each (ISO C: nothing is contracted), so both
 * paths and every batch give the reference's bits. */
#define TR 8  /* weight rows a tile */
#define KC 32 /* blocks a tile buffer holds */

/* r[i] (lanes j = dwords of row i) to r[j] (lanes i). */
KQ_INLINE void transpose8_epi32(__m256i r[8])
{
    __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]), t5 = _mm256_unpackhi_epi32(r[4], r[5]);
    __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]), t7 = _mm256_unpackhi_epi32(r[6], r[7]);
    __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
    __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
    r[0] = _mm256_permute2x128_si256(u0, u4, 0x20);
    r[1] = _mm256_permute2x128_si256(u1, u5, 0x20);
    r[2] = _mm256_permute2x128_si256(u2, u6, 0x20);
    r[3] = _mm256_permute2x128_si256(u3, u7, 0x20);
    r[4] = _mm256_permute2x128_si256(u0, u4, 0x31);
    r[5] = _mm256_permute2x128_si256(u1, u5, 0x31);
    r[6] = _mm256_permute2x128_si256(u2, u6, 0x31);
    r[7] = _mm256_permute2x128_si256(u3, u7, 0x31);
}

/* hsum8_epi32 from its first step: h[i] = hadd(p[2i], p[2i + 1]). */
KQ_INLINE __m256i hsum8_pairs(const __m256i h[4])
{
    /* lanes 0..3: rows 0..3's (or 4..7's) low-half sums; 4..7: high-half sums */
    __m256i h03 = _mm256_hadd_epi32(h[0], h[1]), h47 = _mm256_hadd_epi32(h[2], h[3]);
    return _mm256_add_epi32(_mm256_permute2x128_si256(h03, h47, 0x20), _mm256_permute2x128_si256(h03, h47, 0x31));
}

/* Lane i of the result: the sum of p[i]'s 8 lanes. */
KQ_INLINE __m256i hsum8_epi32(const __m256i p[8])
{
    const __m256i h[4] = {_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]), _mm256_hadd_epi32(p[4], p[5]),
                          _mm256_hadd_epi32(p[6], p[7])};
    return hsum8_pairs(h);
}

/* acc + the 4-product sums of u (unsigned) and s (signed), per int32 lane. */
KQ_INLINE __m256i dp_acc(__m256i acc, __m256i u, __m256i s)
{
#if KQ_VNNI
    return kq_dpbusd256(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

KQ_INLINE __m256i bcast32(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Block k of rows wr[0..rows) (rows <= 8; the others are zero): the
 * transposed levels in q, the scales and minimums in dw, mw. */
KQ_INLINE void tile_block(const uint32_t t, const uint8_t *w, size_t rb, size_t bb, int rows, size_t k, __m256i q[8],
                          float dw[8], float mw[8])
{
KQ_UNROLL
    for (int i = 0; i < TR; i++) {
        dw[i] = mw[i] = 0;
        q[i] = i < rows ? w_levels32(t, w + (size_t)i * rb + k * bb, &dw[i], &mw[i]) : _mm256_setzero_si256();
    }
    transpose8_epi32(q);
}

/* The f16 at offset off of block k of rows 0..rows-1 (0 for the others),
 * as 8 floats: loads from the weights, no store to forward. */
KQ_INLINE __m256 h8(const uint8_t *w0, size_t rb, size_t kb, size_t off, int rows)
{
    uint16_t h[TR];
KQ_UNROLL
    for (int i = 0; i < TR; i++) {
        h[i] = 0;
        if (i < rows) memcpy(&h[i], w0 + (size_t)i * rb + kb + off, 2);
    }
    return _mm256_cvtph_ps(_mm_set_epi16((short)h[7], (short)h[6], (short)h[5], (short)h[4], (short)h[3], (short)h[2],
                                         (short)h[1], (short)h[0]));
}

/* Decode, rows [0, rows) of y from w0 for G activation rows (stride ab;
 * y's stride d): each row's block against the activation block as it lies
 * (no transpose: one load of x for the 8 rows), 8 int32 partial sums a
 * row, then one horizontal reduction for the 8 rows puts row i's block sum
 * in lane i; a biased type's bias * xs is then one subtraction for the 8
 * rows. The 8 rows' scales are gathered once a block for all G (the
 * gather was a quarter of the work at G = 4); the G passes reload the
 * block's levels from L1. Integer sums are exact in any order, so the
 * floats are the tile path's and the reference's. Called with rows a
 * constant TR for whole tiles, so the row tests fold away. */
KQ_INLINE void row8_decode(const uint32_t t, const size_t bb, const bool with_min, const int G, float *y, size_t d,
                           const uint8_t *act, size_t ab, const uint8_t *w0, size_t rb, size_t n, int rows,
                           const uint8_t *ahead)
{
    a8 a[MAXB];
    __m256 acc[MAXB];
KQ_UNROLL
    for (int g = 0; g < G; g++) {
        a[g] = a8_view(act + (size_t)g * ab, n);
        acc[g] = _mm256_setzero_ps();
    }
    const size_t nb = n / 32;
    const int bias = w_bias(t);
    const bool uns = with_min || bias;
    /* The tile reads 8 rows a block at a time, 8 interleaved streams that
     * the hardware prefetcher follows worse than the one linear stream of
     * a row at a time (without this, q8_0 decode on tiny-15m ran at half
     * speed): fetch the tile after next (ahead; NULL past the matrix)
     * linearly, TR * bb bytes of it a block, so that the fetches keep
     * pace with the loads. One burst of the whole tile at its start (17
     * KB on the yi-coder shape) overflowed the miss buffers and the L1. */
    for (size_t k = 0; k < nb; k++) {
        if (ahead) fetch_lines(ahead + k * TR * bb, (size_t)TR * bb);
        const __m256 dwv = h8(w0, rb, k * bb, 0, rows);
        const __m256 mwv = with_min ? h8(w0, rb, k * bb, 2, rows) : _mm256_setzero_ps();
KQ_UNROLL
        for (int g = 0; g < G; g++) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(a[g].qs + 32 * k));
            __m256i p[TR];
KQ_UNROLL
            for (int i = 0; i < TR; i++) {
                if (i >= rows) {
                    p[i] = _mm256_setzero_si256();
                    continue;
                }
                float dw, mw;
                __m256i q = w_levels32(t, w0 + (size_t)i * rb + k * bb, &dw, &mw);
                p[i] = uns ? dp_acc(_mm256_setzero_si256(), q, x)
                           : dp_acc(_mm256_setzero_si256(), _mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q));
            }
            __m256i sum = hsum8_epi32(p);
            if (bias) sum = _mm256_sub_epi32(sum, _mm256_set1_epi32(bias * a[g].xs[k]));
            __m256 sc = _mm256_mul_ps(dwv, _mm256_set1_ps(a[g].d[k]));
            acc[g] = _mm256_add_ps(acc[g], _mm256_mul_ps(sc, _mm256_cvtepi32_ps(sum)));
            if (with_min) acc[g] = _mm256_add_ps(acc[g], _mm256_mul_ps(mwv, _mm256_set1_ps(a[g].s[k])));
        }
    }
KQ_UNROLL
    for (int g = 0; g < G; g++) {
        float res[TR];
        _mm256_storeu_ps(res, acc[g]);
        for (int i = 0; i < rows; i++) y[(size_t)g * d + (size_t)i] = res[i];
    }
}

/* G activation rows (stride ab) over a tile buffer of kn blocks from
 * block k0: their sums so far from y (stride d; none when k0 is 0), back
 * into y after. Each block's 8 dword products are summed in two chains
 * (even and odd j) so that 2G vpdpbusd are in flight, not G. */
KQ_INLINE void tile_pass(const uint32_t t, const bool with_min, const int G, float *y, size_t d, const uint8_t *act,
                         size_t ab, size_t n, size_t k0, size_t kn, int rows, __m256i (*tq)[8], __m256i (*taq)[8],
                         float (*tdw)[8], float (*tmw)[8])
{
    const int bias = w_bias(t);
    const bool uns = with_min || bias;
    __m256 acc[MAXB];
    a8 a[MAXB];
    float res[TR] = {0};
KQ_UNROLL
    for (int g = 0; g < G; g++) {
        a[g] = a8_view(act + (size_t)g * ab, n);
        if (k0) memcpy(res, y + (size_t)g * d, (size_t)rows * sizeof(float));
        acc[g] = _mm256_loadu_ps(res);
    }
    for (size_t kk = 0; kk < kn; kk++) {
        const size_t k = k0 + kk;
        __m256i p[MAXB], p2[MAXB];
KQ_UNROLL
        for (int g = 0; g < G; g++) {
            p[g] = bias ? _mm256_set1_epi32(-bias * a[g].xs[k]) : _mm256_setzero_si256();
            p2[g] = _mm256_setzero_si256();
        }
KQ_UNROLL
        for (int j = 0; j < 8; j++) {
            const __m256i qj = tq[kk][j], aj = uns ? qj : taq[kk][j];
KQ_UNROLL
            for (int g = 0; g < G; g++) {
                __m256i xb = bcast32(a[g].qs + 32 * k + 4 * (size_t)j);
                __m256i *pg = j & 1 ? &p2[g] : &p[g];
                *pg = uns ? dp_acc(*pg, qj, xb) : dp_acc(*pg, aj, _mm256_sign_epi8(xb, qj));
            }
        }
        const __m256 dwv = _mm256_loadu_ps(tdw[kk]);
KQ_UNROLL
        for (int g = 0; g < G; g++) {
            __m256 sc = _mm256_mul_ps(dwv, _mm256_set1_ps(a[g].d[k]));
            __m256i sum = _mm256_add_epi32(p[g], p2[g]);
            acc[g] = _mm256_add_ps(acc[g], _mm256_mul_ps(sc, _mm256_cvtepi32_ps(sum)));
            if (with_min) acc[g] = _mm256_add_ps(acc[g], _mm256_mul_ps(_mm256_loadu_ps(tmw[kk]), _mm256_set1_ps(a[g].s[k])));
        }
    }
KQ_UNROLL
    for (int g = 0; g < G; g++) {
        _mm256_storeu_ps(res, acc[g]);
        memcpy(y + (size_t)g * d, res, (size_t)rows * sizeof(float));
    }
}

/* Rows [r, r + rows) (rows <= 8) of y for activation rows [0, batch). */
KQ_INLINE void tile_rows(const uint32_t t, float *y, const uint8_t *act, size_t ab, const uint8_t *w, size_t rb,
                         size_t n, size_t d, size_t batch, size_t r, int rows)
{
    const size_t bb = t == LLMEM_DTYPE_Q8_0 ? 34 : t == LLMEM_DTYPE_Q4_0 ? 18 : t == LLMEM_DTYPE_Q4_1 ? 20
                    : t == LLMEM_DTYPE_Q5_0 ? 22 : 24;
    const bool with_min = t == LLMEM_DTYPE_Q4_1 || t == LLMEM_DTYPE_Q5_1;
    const bool uns = with_min || w_bias(t);
    const size_t nb = n / 32;
    const uint8_t *w0 = w + r * rb;
    if (batch <= MAXB) {
        /* Decode, one sequence or a few: the weights stream by once, a
         * block of 8 rows at a time, against every activation row. */
        const uint8_t *ahead = r + 3 * TR <= d ? w0 + 2 * TR * rb : NULL;
        float *yr = y + r;
        switch (batch * 2 + (rows == TR)) {
        case 3: row8_decode(t, bb, with_min, 1, yr, d, act, ab, w0, rb, n, TR, ahead); break;
        case 2: row8_decode(t, bb, with_min, 1, yr, d, act, ab, w0, rb, n, rows, ahead); break;
        case 5: row8_decode(t, bb, with_min, 2, yr, d, act, ab, w0, rb, n, TR, ahead); break;
        case 4: row8_decode(t, bb, with_min, 2, yr, d, act, ab, w0, rb, n, rows, ahead); break;
        case 7: row8_decode(t, bb, with_min, 3, yr, d, act, ab, w0, rb, n, TR, ahead); break;
        case 6: row8_decode(t, bb, with_min, 3, yr, d, act, ab, w0, rb, n, rows, ahead); break;
        case 9: row8_decode(t, bb, with_min, 4, yr, d, act, ab, w0, rb, n, TR, ahead); break;
        default: row8_decode(t, bb, with_min, 4, yr, d, act, ab, w0, rb, n, rows, ahead); break;
        }
        return;
    }
    /* Levels (signed q8_0: and their magnitudes), scales and minimums of
     * KC blocks; a tile's running sums live in y between buffers. */
    __m256i tq[KC][8], taq[KC][8];
    float tdw[KC][8], tmw[KC][8];
    /* The next tile's rows, KC blocks of each ahead of their use: with a
     * few sequences decode still streams the weights from memory. */
    const uint8_t *next = r + 2 * TR <= d ? w0 + TR * rb : NULL;
    for (size_t k0 = 0; k0 < nb; k0 += KC) {
        const size_t kn = nb - k0 < KC ? nb - k0 : KC;
        if (next)
            for (int i = 0; i < TR; i++) fetch_lines(next + (size_t)i * rb + k0 * bb, kn * bb);
        for (size_t kk = 0; kk < kn; kk++) {
            tile_block(t, w0, rb, bb, rows, k0 + kk, tq[kk], tdw[kk], tmw[kk]);
            if (!uns)
KQ_UNROLL
                for (int j = 0; j < 8; j++) taq[kk][j] = _mm256_sign_epi8(tq[kk][j], tq[kk][j]);
        }
        /* A whole tile passes rows as the constant TR, so its loads and
         * stores of y are single vector moves, not memcpy calls. */
        for (size_t b = 0; b < batch;) {
            const bool four = batch - b >= MAXB;
            float *yb = y + b * d + r;
            const uint8_t *ax = act + b * ab;
            if (four && rows == TR) tile_pass(t, with_min, MAXB, yb, d, ax, ab, n, k0, kn, TR, tq, taq, tdw, tmw);
            else if (four) tile_pass(t, with_min, MAXB, yb, d, ax, ab, n, k0, kn, rows, tq, taq, tdw, tmw);
            else if (rows == TR) tile_pass(t, with_min, 1, yb, d, ax, ab, n, k0, kn, TR, tq, taq, tdw, tmw);
            else tile_pass(t, with_min, 1, yb, d, ax, ab, n, k0, kn, rows, tq, taq, tdw, tmw);
            b += four ? MAXB : 1;
        }
    }
}

#if KQ_AVX512
/* ---- 16 rows: the 32-element types' batches in 512-bit registers ----
 *
 * The tile path above with two 8-row tiles side by side: zmm lane i
 * (i < 16) is row r + i, so one vpdpbusd with the activation dword
 * broadcast from memory ({1to16}) adds 4 products to 16 rows' sums, where
 * the 256-bit path needs two. The tile is filled by tile_block as before
 * (rows r..r+7 and r+8..r+15, each transposed as 8 x 8 dwords), then the
 * halves are joined. Every level is unsigned here (KQ_VNNI: q8_0 + 128),
 * and each lane's integers and float operations are tile_pass's for its
 * row, in the same order: the same bits. Rows past the tile's (rows < 16)
 * are zero levels, masked off at the loads and stores of y. */
#define TR16 16

KQ_INLINE __mmask16 mask16(int rows) { return rows >= TR16 ? (__mmask16)0xffff : (__mmask16)((1u << rows) - 1u); }

/* G activation rows (stride ab) over a 16-row tile buffer of kn blocks
 * from block k0: their sums so far from y (stride d; none when k0 is 0),
 * back into y after; two chains (even, odd j) as tile_pass. */
KQ_INLINE void tile16_pass(const uint32_t t, const bool with_min, const int G, float *y, size_t d, const uint8_t *act,
                           size_t ab, size_t n, size_t k0, size_t kn, int rows, __m512i (*tq)[8], float (*tdw)[TR16],
                           float (*tmw)[TR16])
{
    const int bias = w_bias(t);
    const __mmask16 m = mask16(rows);
    __m512 acc[MAXB];
    a8 a[MAXB];
KQ_UNROLL
    for (int g = 0; g < G; g++) {
        a[g] = a8_view(act + (size_t)g * ab, n);
        acc[g] = k0 ? _mm512_maskz_loadu_ps(m, y + (size_t)g * d) : _mm512_setzero_ps();
    }
    for (size_t kk = 0; kk < kn; kk++) {
        const size_t k = k0 + kk;
        __m512i p[MAXB], p2[MAXB];
KQ_UNROLL
        for (int g = 0; g < G; g++) {
            p[g] = bias ? _mm512_set1_epi32(-bias * a[g].xs[k]) : _mm512_setzero_si512();
            p2[g] = _mm512_setzero_si512();
        }
KQ_UNROLL
        for (int j = 0; j < 8; j++) {
            const __m512i qj = tq[kk][j];
KQ_UNROLL
            for (int g = 0; g < G; g++) {
                int32_t v;
                memcpy(&v, a[g].qs + 32 * k + 4 * (size_t)j, 4);
                __m512i *pg = j & 1 ? &p2[g] : &p[g];
                *pg = _mm512_dpbusd_epi32(*pg, qj, _mm512_set1_epi32(v));
            }
        }
        const __m512 dwv = _mm512_loadu_ps(tdw[kk]);
KQ_UNROLL
        for (int g = 0; g < G; g++) {
            __m512 sc = _mm512_mul_ps(dwv, _mm512_set1_ps(a[g].d[k]));
            __m512i sum = _mm512_add_epi32(p[g], p2[g]);
            acc[g] = _mm512_add_ps(acc[g], _mm512_mul_ps(sc, _mm512_cvtepi32_ps(sum)));
            if (with_min)
                acc[g] = _mm512_add_ps(acc[g], _mm512_mul_ps(_mm512_loadu_ps(tmw[kk]), _mm512_set1_ps(a[g].s[k])));
        }
    }
KQ_UNROLL
    for (int g = 0; g < G; g++) _mm512_mask_storeu_ps(y + (size_t)g * d, m, acc[g]);
}

/* Rows [r, r + rows) (rows <= 16) of y for activation rows [0, batch),
 * batch > MAXB. */
KQ_INLINE void tile16_rows(const uint32_t t, float *y, const uint8_t *act, size_t ab, const uint8_t *w, size_t rb,
                           size_t n, size_t d, size_t batch, size_t r, int rows)
{
    const size_t bb = t == LLMEM_DTYPE_Q8_0 ? 34 : t == LLMEM_DTYPE_Q4_0 ? 18 : t == LLMEM_DTYPE_Q4_1 ? 20
                    : t == LLMEM_DTYPE_Q5_0 ? 22 : 24;
    const bool with_min = t == LLMEM_DTYPE_Q4_1 || t == LLMEM_DTYPE_Q5_1;
    const size_t nb = n / 32;
    const uint8_t *w0 = w + r * rb;
    const int lo = rows < TR ? rows : TR, hi = rows - lo;
    __m512i tq[KC][8];
    float tdw[KC][TR16], tmw[KC][TR16];
    const uint8_t *next = r + 2 * TR16 <= d ? w0 + TR16 * rb : NULL;
    for (size_t k0 = 0; k0 < nb; k0 += KC) {
        const size_t kn = nb - k0 < KC ? nb - k0 : KC;
        if (next)
            for (int i = 0; i < TR16; i++) fetch_lines(next + (size_t)i * rb + k0 * bb, kn * bb);
        for (size_t kk = 0; kk < kn; kk++) {
            __m256i q0[8], q1[8];
            tile_block(t, w0, rb, bb, lo, k0 + kk, q0, tdw[kk], tmw[kk]);
            tile_block(t, hi ? w0 + TR * rb : w0, rb, bb, hi, k0 + kk, q1, tdw[kk] + TR, tmw[kk] + TR);
KQ_UNROLL
            for (int j = 0; j < 8; j++) tq[kk][j] = _mm512_inserti64x4(_mm512_castsi256_si512(q0[j]), q1[j], 1);
        }
        /* MAXB activation rows a pass, then the 1-3 left in one pass (3
         * passes of 1 kept one chain pair in flight: a sixth of the
         * kernel's time at 99 rows). */
        for (size_t b = 0; b < batch;) {
            const int G = batch - b >= MAXB ? MAXB : (int)(batch - b);
            float *yb = y + b * d + r;
            const uint8_t *ax = act + b * ab;
            switch (G * 2 + (rows == TR16)) {
            case 9: tile16_pass(t, with_min, MAXB, yb, d, ax, ab, n, k0, kn, TR16, tq, tdw, tmw); break;
            case 8: tile16_pass(t, with_min, MAXB, yb, d, ax, ab, n, k0, kn, rows, tq, tdw, tmw); break;
            case 7: tile16_pass(t, with_min, 3, yb, d, ax, ab, n, k0, kn, TR16, tq, tdw, tmw); break;
            case 6: tile16_pass(t, with_min, 3, yb, d, ax, ab, n, k0, kn, rows, tq, tdw, tmw); break;
            case 5: tile16_pass(t, with_min, 2, yb, d, ax, ab, n, k0, kn, TR16, tq, tdw, tmw); break;
            case 4: tile16_pass(t, with_min, 2, yb, d, ax, ab, n, k0, kn, rows, tq, tdw, tmw); break;
            case 3: tile16_pass(t, with_min, 1, yb, d, ax, ab, n, k0, kn, TR16, tq, tdw, tmw); break;
            default: tile16_pass(t, with_min, 1, yb, d, ax, ab, n, k0, kn, rows, tq, tdw, tmw); break;
            }
            b += (size_t)G;
        }
    }
}
#endif

/* ---- the k-quants: eight weight rows a pass as well ----
 *
 * A super-block of one row unpacked (k_unpack): its 256 levels as stored
 * (unsigned) in element order, 8 chunks of 32; its 16 group scales as
 * int16 (a q4_k/q5_k group of 32 gives its scale to both its 16s), its
 * mins likewise (zero for q3_k, q6_k). Then, with bs the activation's
 * sums of 16 and off the stored offset (q3_k 4, q6_k 32),
 *   sumi = Σ_h sc_h Σ_{e in h} q_e x_e - off Σ_h sc_h bs_h
 *   summ = Σ_h m_h bs_h
 * exact integers, and per super-block acc += (d da) sumi, then acc -=
 * (dmin da) summ: the reference's order, so every path gives its bits.
 *
 * Decode (batch 1) sums each row's chunks in 8 int32 lanes (maddubs, then
 * madd by the chunk's two group scales) and reduces 8 rows at once
 * (hsum8_epi32); batches unpack a tile of 8 rows x KCK super-blocks once,
 * transposed as the 32-element tiles are (lane i = row i), and run every
 * activation row over it, 4 at a time. */
#define KCK 4 /* super-blocks a k-quant tile buffer holds */

KQ_INLINE size_t k_bb(const uint32_t t)
{
    return t == LLMEM_DTYPE_Q2_K ? 84 : t == LLMEM_DTYPE_Q3_K ? 110 : t == LLMEM_DTYPE_Q4_K ? 144
         : t == LLMEM_DTYPE_Q5_K ? 176 : 210;
}
KQ_INLINE int k_off_shift(const uint32_t t) { return t == LLMEM_DTYPE_Q3_K ? 2 : t == LLMEM_DTYPE_Q6_K ? 5 : 0; }
KQ_INLINE bool k_has_min(const uint32_t t)
{
    return t == LLMEM_DTYPE_Q2_K || t == LLMEM_DTYPE_Q4_K || t == LLMEM_DTYPE_Q5_K;
}
/* Offsets of the f16 d and dmin in the block. */
KQ_INLINE size_t k_doff(const uint32_t t)
{
    return t == LLMEM_DTYPE_Q2_K ? 80 : t == LLMEM_DTYPE_Q3_K ? 108 : t == LLMEM_DTYPE_Q6_K ? 208 : 0;
}
KQ_INLINE size_t k_moff(const uint32_t t) { return t == LLMEM_DTYPE_Q2_K ? 82 : 2; }

KQ_INLINE void k_unpack(const uint32_t t, const uint8_t *blk, __m256i q[8], __m256i *sc, __m256i *mn)
{
    const __m256i m3 = _mm256_set1_epi8(3), m15 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    *mn = _mm256_setzero_si256();
    if (t == LLMEM_DTYPE_Q4_K || t == LLMEM_DTYPE_Q5_K) {
        const bool five = t == LLMEM_DTYPE_Q5_K;
        const llmem__q4_k *b4 = (const void *)blk;
        const llmem__q5_k *b5 = (const void *)blk;
        const uint8_t *qs = five ? b5->qs : b4->qs;
        uint8_t s8[16], m8[16];
        llmem__k4_scales_mins(five ? b5->scales : b4->scales, s8, m8);
        __m128i sv = _mm_loadl_epi64((const __m128i *)(const void *)s8);
        __m128i mv = _mm_loadl_epi64((const __m128i *)(const void *)m8);
        *sc = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(sv, sv));
        *mn = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mv, mv));
        __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(const void *)b5->qh) : _mm256_setzero_si256();
KQ_UNROLL
        for (int c = 0; c < 4; c++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(const void *)(qs + 32 * c));
            __m256i lo = _mm256_and_si256(raw, m15), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m15);
            if (five) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
            }
            q[2 * c] = lo;
            q[2 * c + 1] = hi;
        }
    } else if (t == LLMEM_DTYPE_Q6_K) {
        const llmem__q6_k *b6 = (const void *)blk;
        *sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)b6->scales));
KQ_UNROLL
        for (int h = 0; h < 2; h++) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(const void *)(b6->ql + 64 * h));
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(const void *)(b6->ql + 64 * h + 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(const void *)(b6->qh + 32 * h));
            q[4 * h] = _mm256_or_si256(_mm256_and_si256(l0, m15), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
            q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m15),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
            q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m15),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
            q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m15),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
        }
    } else if (t == LLMEM_DTYPE_Q3_K) {
        const llmem__q3_k *b3 = (const void *)blk;
        uint8_t su[16];
        llmem__k3_scales(b3->scales, su);
        *sc = _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)su)),
                               _mm256_set1_epi16(32));
        __m256i hm = _mm256_loadu_si256((const __m256i *)(const void *)b3->hmask);
KQ_UNROLL
        for (int h = 0; h < 2; h++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(const void *)(b3->qs + 32 * h));
KQ_UNROLL
            for (int j = 0; j < 4; j++)
                q[4 * h + j] = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(raw, 2 * j), m3),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + j), one), 2));
        }
    } else { /* q2_k */
        const llmem__q2_k *b2 = (const void *)blk;
        __m128i sb = _mm_loadu_si128((const __m128i *)(const void *)b2->scales);
        *sc = _mm256_cvtepu8_epi16(_mm_and_si128(sb, _mm_set1_epi8(15)));
        *mn = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sb, 4), _mm_set1_epi8(15)));
KQ_UNROLL
        for (int h = 0; h < 2; h++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(const void *)(b2->qs + 32 * h));
KQ_UNROLL
            for (int j = 0; j < 4; j++) q[4 * h + j] = _mm256_and_si256(_mm256_srli_epi16(raw, 2 * j), m3);
        }
    }
}

/* Chunk c's two group scales (16-groups 2c, 2c+1) as int16 lanes 0..7
 * and 8..15, from lo, hi = unpacklo/hi_epi16(sc, sc) (dwords: lo = s0..s3,
 * s8..s11; hi = s4..s7, s12..s15). */
KQ_INLINE __m256i k_chunk_scales(__m256i lo, __m256i hi, const int c)
{
    const int base = (c / 4) * 4 + (c % 2) * 2;
    const __m256i idx = _mm256_setr_epi32(base, base, base, base, base + 1, base + 1, base + 1, base + 1);
    return _mm256_permutevar8x32_epi32((c / 2) % 2 ? hi : lo, idx);
}

/* Decode: row w of y (one float), super-blocks in groups of 8 read
 * linearly (one stream a row: a row-interleaved tile made yi-coder's
 * q4_k decode slower, by the memory streams); each super-block's exact
 * sums in 8 lanes, then one reduction for 8 super-blocks puts block k's
 * sums in lane k, and the float epilogue runs per lane, then the adds in
 * increasing k: the tile path's and the reference's operations. */
/* Bytes ahead of the super-block being read that k_row_decode fetches:
 * one sequence's decode streams the rows of a tile one after another,
 * one linear stream, and on a Zen 3 the hardware prefetcher alone left
 * yi-coder-1.5b q6_k decoding at 0.89-0.93x of llama.cpp. 2 KiB ahead
 * (ten q6_K super-blocks) gave 1.06-1.15x of that in two paired A/Bs;
 * 1 KiB 1.09-1.10x; 4 KiB 0.93x (docs/BENCHMARKS.md, 2026-12-06). Past
 * the matrix's end the fetches touch nothing they could fault on. */
#define K_DECODE_AHEAD 2048
KQ_INLINE float k_row_decode(const uint32_t t, const a8k a, const uint8_t *wr, size_t n)
{
    const size_t bb = k_bb(t), nb = n / 256;
    const int sh = k_off_shift(t);
    const bool mins = k_has_min(t);
    float acc = 0;
    for (size_t k0 = 0; k0 < nb; k0 += 8) {
        const int cnt = nb - k0 < 8 ? (int)(nb - k0) : 8;
        __m256i P[8], M[8];
KQ_UNROLL
        for (int j = 0; j < 8; j++) {
            P[j] = M[j] = _mm256_setzero_si256();
            if (j >= cnt) continue;
            const size_t k = k0 + (size_t)j;
            fetch_lines(wr + k * bb + K_DECODE_AHEAD, bb);
            const __m256i bsv = _mm256_loadu_si256((const __m256i *)(const void *)(a.bs + 16 * k));
            const int8_t *xk = a.qs + 256 * k;
            __m256i q[8], sc, mn;
            k_unpack(t, wr + k * bb, q, &sc, &mn);
            const __m256i lo = _mm256_unpacklo_epi16(sc, sc), hi = _mm256_unpackhi_epi16(sc, sc);
            __m256i s = _mm256_setzero_si256();
KQ_UNROLL
            for (int c = 0; c < 8; c++) {
                __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(xk + 32 * c));
                s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(q[c], x), k_chunk_scales(lo, hi, c)));
            }
            if (sh) s = _mm256_sub_epi32(s, _mm256_slli_epi32(_mm256_madd_epi16(bsv, sc), sh));
            P[j] = s;
            if (mins) M[j] = _mm256_madd_epi16(bsv, mn);
        }
        float dab[8] = {0}, f[8], m[8];
        memcpy(dab, a.d + k0, (size_t)cnt * sizeof(float));
        const __m256 da = _mm256_loadu_ps(dab);
        _mm256_storeu_ps(f, _mm256_mul_ps(_mm256_mul_ps(h8(wr, bb, k0 * bb, k_doff(t), cnt), da),
                                          _mm256_cvtepi32_ps(hsum8_epi32(P))));
        if (mins)
            _mm256_storeu_ps(m, _mm256_mul_ps(_mm256_mul_ps(h8(wr, bb, k0 * bb, k_moff(t), cnt), da),
                                              _mm256_cvtepi32_ps(hsum8_epi32(M))));
        for (int j = 0; j < cnt; j++) {
            acc += f[j];
            if (mins) acc -= m[j];
        }
    }
    return acc;
}

/* Decode of 2-4 sequences: k_row_decode for G activation rows at once,
 * each super-block of the row unpacked once for all of them (the tile
 * path unpacks as often but then transposes 8 rows for a pass that 2-4
 * activation rows cannot repay: yi-coder-1.5b q6_k decoded 4 sequences at
 * 0.92-0.95x of llama.cpp on it). Per activation row, the integers and
 * the float epilogue are k_row_decode's, in its order: the same bits.
 * Every x86 path: it beats the tile on AVX2 too (yi-coder-1.5b q6_k, 4
 * sequences, on a Zen 3: decode 1.30x, where the tile ran 0.77x of
 * llama.cpp), and more since its sums stopped spilling from AVX2's 16
 * registers (1.08-1.12x more; below). */
/* k_row_decode_g's epilogue: acc[g] += f[g][j] (less m[g][j] with mins)
 * for j < cnt, j outer, so each row's adds keep their order and the G
 * rows' chains overlap. Inlined with a constant cnt where it can be. */
KQ_INLINE void k_sums_g(const int G, const bool mins, const int cnt, float f[MAXB][8], float m[MAXB][8],
                        float acc[MAXB])
{
KQ_UNROLL
    for (int j = 0; j < cnt; j++)
KQ_UNROLL
        for (int g = 0; g < G; g++) {
            acc[g] += f[g][j];
            if (mins) acc[g] -= m[g][j];
        }
}

KQ_INLINE void k_row_decode_g(const uint32_t t, const int G, const a8k *a, const uint8_t *wr, size_t n, float *out)
{
    const size_t bb = k_bb(t), nb = n / 256;
    const int sh = k_off_shift(t);
    const bool mins = k_has_min(t);
    float acc[MAXB] = {0};
    for (size_t k0 = 0; k0 < nb; k0 += 8) {
        const int cnt = nb - k0 < 8 ? (int)(nb - k0) : 8;
        /* hsum8_epi32's first step as the super-blocks come: pairs (j - 1,
         * j) hadded at once, so 4 x 8 partial sums are never all live
         * (they spilled on AVX2's 16 registers); the integers are exact,
         * so the sums are the same. */
        __m256i PH[MAXB][4], MH[MAXB][4], Pe[MAXB], Me[MAXB];
KQ_UNROLL
        for (int j = 0; j < 8; j++) {
            __m256i P[MAXB], M[MAXB];
KQ_UNROLL
            for (int g = 0; g < G; g++) P[g] = M[g] = _mm256_setzero_si256();
            if (j < cnt) {
                const size_t k = k0 + (size_t)j;
                fetch_lines(wr + k * bb + K_DECODE_AHEAD, bb);
                __m256i q[8], sc, mn;
                k_unpack(t, wr + k * bb, q, &sc, &mn);
                const __m256i lo = _mm256_unpacklo_epi16(sc, sc), hi = _mm256_unpackhi_epi16(sc, sc);
                /* chunk outer, activation row inner: one chunk scale live,
                 * not eight; each row's sum adds its chunks in order */
KQ_UNROLL
                for (int c = 0; c < 8; c++) {
                    const __m256i cs = k_chunk_scales(lo, hi, c);
KQ_UNROLL
                    for (int g = 0; g < G; g++) {
                        const int8_t *xc = a[g].qs + 256 * k + 32 * (size_t)c;
                        const __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)xc);
                        P[g] = _mm256_add_epi32(P[g], _mm256_madd_epi16(_mm256_maddubs_epi16(q[c], x), cs));
                    }
                }
KQ_UNROLL
                for (int g = 0; g < G; g++) {
                    const __m256i bsv = _mm256_loadu_si256((const __m256i *)(const void *)(a[g].bs + 16 * k));
                    if (sh) P[g] = _mm256_sub_epi32(P[g], _mm256_slli_epi32(_mm256_madd_epi16(bsv, sc), sh));
                    if (mins) M[g] = _mm256_madd_epi16(bsv, mn);
                }
            }
KQ_UNROLL
            for (int g = 0; g < G; g++) {
                if (!(j & 1)) {
                    Pe[g] = P[g];
                    Me[g] = M[g];
                } else {
                    PH[g][j / 2] = _mm256_hadd_epi32(Pe[g], P[g]);
                    if (mins) MH[g][j / 2] = _mm256_hadd_epi32(Me[g], M[g]);
                }
            }
        }
        const __m256 dw = h8(wr, bb, k0 * bb, k_doff(t), cnt);
        const __m256 dm = mins ? h8(wr, bb, k0 * bb, k_moff(t), cnt) : _mm256_setzero_ps();
        /* The G rows' scalar sums interleaved, j outer: each row's adds
         * keep their order (the same bits), and the G chains of 8
         * dependent adds overlap instead of running one after another. */
        float f[MAXB][8], m[MAXB][8];
KQ_UNROLL
        for (int g = 0; g < G; g++) {
            float dab[8] = {0};
            memcpy(dab, a[g].d + k0, (size_t)cnt * sizeof(float));
            const __m256 da = _mm256_loadu_ps(dab);
            _mm256_storeu_ps(f[g], _mm256_mul_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(hsum8_pairs(PH[g]))));
            if (mins)
                _mm256_storeu_ps(m[g], _mm256_mul_ps(_mm256_mul_ps(dm, da), _mm256_cvtepi32_ps(hsum8_pairs(MH[g]))));
        }
        if (cnt == 8) k_sums_g(G, mins, 8, f, m, acc); /* constant: unrolled */
        else k_sums_g(G, mins, cnt, f, m, acc);
    }
KQ_UNROLL
    for (int g = 0; g < G; g++) out[g] = acc[g];
}

/* One super-block of a k-quant tile: T[j] lane i = dword j of row i's
 * levels; S[h] lane i = row i's scale of group h (int32 for VNNI's
 * vpmulld; int16 twice for AVX2's madd); SP[m], MP[m] lane i = row i's
 * scales, mins of groups 2m, 2m+1 as an int16 pair; d, dmin per row. */
typedef struct ktile {
    __m256i T[64], S[16], SP[8], MP[8];
    float d[8], dm[8];
} ktile;

/* Each row's super-block is fetched a tile ahead as it is unpacked: the
 * same block of the next 8 rows (TR * rb bytes on), which the next tile
 * fills next, as tile_rows fetches its next tile. A prefill of a few
 * tokens streams the weights from memory once, and 8 rows' strided
 * streams outran the hardware prefetcher: yi-coder-1.5b q6_k prefill of
 * 11 tokens 1.370x [1.211..1.849] (paired A/B, 7 rounds), of 99 tokens
 * 1.191x; 2 KiB ahead in the row instead, as k_row_decode fetches, 1.312x
 * [0.921..1.654] (docs/BENCHMARKS.md, 2026-12-07). Past the matrix's end
 * the fetches touch nothing they could fault on. */
KQ_INLINE void k_tile_fill(const uint32_t t, ktile *kt, const uint8_t *w0, size_t rb, size_t kb, int rows)
{
    __m256i sc[TR], mn[TR];
    const bool mins = k_has_min(t);
KQ_UNROLL
    for (int i = 0; i < TR; i++) {
        kt->d[i] = kt->dm[i] = 0;
        if (i < rows) {
            __m256i q[8];
            const uint8_t *blk = w0 + (size_t)i * rb + kb;
            fetch_lines(blk + TR * rb, k_bb(t));
            k_unpack(t, blk, q, &sc[i], &mn[i]);
KQ_UNROLL
            for (int c = 0; c < 8; c++) kt->T[8 * c + i] = q[c];
            uint16_t h;
            memcpy(&h, blk + k_doff(t), 2);
            kt->d[i] = kq_h2f(h);
            if (mins) {
                memcpy(&h, blk + k_moff(t), 2);
                kt->dm[i] = kq_h2f(h);
            }
        } else {
KQ_UNROLL
            for (int c = 0; c < 8; c++) kt->T[8 * c + i] = _mm256_setzero_si256();
            sc[i] = mn[i] = _mm256_setzero_si256();
        }
    }
KQ_UNROLL
    for (int c = 0; c < 8; c++) transpose8_epi32(&kt->T[8 * c]);
    __m256i A[TR], B[TR];
KQ_UNROLL
    for (int i = 0; i < TR; i++) {
        kt->SP[i] = sc[i];
        kt->MP[i] = mn[i];
        A[i] = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(sc[i]));
        B[i] = _mm256_cvtepi16_epi32(_mm256_extracti128_si256(sc[i], 1));
    }
    transpose8_epi32(kt->SP);
    if (mins) transpose8_epi32(kt->MP);
    transpose8_epi32(A);
    transpose8_epi32(B);
KQ_UNROLL
    for (int h = 0; h < 8; h++) {
#if KQ_VNNI
        kt->S[h] = A[h];
        kt->S[h + 8] = B[h];
#else
        kt->S[h] = _mm256_or_si256(_mm256_and_si256(A[h], _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(A[h], 16));
        kt->S[h + 8] = _mm256_or_si256(_mm256_and_si256(B[h], _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(B[h], 16));
#endif
    }
}

/* G activation rows over kn tile super-blocks from k0; running sums in y
 * as tile_pass keeps them. */
KQ_INLINE void k_tile_pass(const uint32_t t, const int G, float *y, size_t d, const uint8_t *act, size_t ab, size_t n,
                           size_t k0, size_t kn, int rows, const ktile *kt)
{
    const int sh = k_off_shift(t);
    const bool mins = k_has_min(t);
    __m256 acc[MAXB];
    a8k a[MAXB];
    float res[TR] = {0};
KQ_UNROLL
    for (int g = 0; g < G; g++) {
        a[g] = a8k_view(act + (size_t)g * ab, n);
        if (k0) memcpy(res, y + (size_t)g * d, (size_t)rows * sizeof(float));
        acc[g] = _mm256_loadu_ps(res);
    }
    for (size_t kk = 0; kk < kn; kk++) {
        const size_t k = k0 + kk;
        const ktile *tb = kt + kk;
        __m256i sumi[MAXB];
KQ_UNROLL
        for (int g = 0; g < G; g++) sumi[g] = _mm256_setzero_si256();
        for (int h = 0; h < 16; h++) {
#if KQ_VNNI
            __m256i p[MAXB];
KQ_UNROLL
            for (int g = 0; g < G; g++) p[g] = _mm256_setzero_si256();
KQ_UNROLL
            for (int jj = 0; jj < 4; jj++) {
                const __m256i T = tb->T[4 * h + jj];
KQ_UNROLL
                for (int g = 0; g < G; g++)
                    p[g] = kq_dpbusd256(p[g], T, bcast32(a[g].qs + 256 * k + 16 * (size_t)h + 4 * (size_t)jj));
            }
KQ_UNROLL
            for (int g = 0; g < G; g++) sumi[g] = _mm256_add_epi32(sumi[g], _mm256_mullo_epi32(p[g], tb->S[h]));
#else
            const __m256i S = tb->S[h];
KQ_UNROLL
            for (int jj = 0; jj < 4; jj++) {
                const __m256i T = tb->T[4 * h + jj];
KQ_UNROLL
                for (int g = 0; g < G; g++) {
                    __m256i xb = bcast32(a[g].qs + 256 * k + 16 * (size_t)h + 4 * (size_t)jj);
                    sumi[g] = _mm256_add_epi32(sumi[g], _mm256_madd_epi16(_mm256_maddubs_epi16(T, xb), S));
                }
            }
#endif
        }
        const __m256 dwv = _mm256_loadu_ps(tb->d), dmv = _mm256_loadu_ps(tb->dm);
KQ_UNROLL
        for (int g = 0; g < G; g++) {
            const int16_t *bs = a[g].bs + 16 * k;
            __m256i so = _mm256_setzero_si256(), sm = _mm256_setzero_si256();
KQ_UNROLL
            for (int m = 0; m < 8; m++) {
                int32_t v;
                memcpy(&v, bs + 2 * m, 4);
                const __m256i b2 = _mm256_set1_epi32(v);
                if (sh) so = _mm256_add_epi32(so, _mm256_madd_epi16(tb->SP[m], b2));
                if (mins) sm = _mm256_add_epi32(sm, _mm256_madd_epi16(tb->MP[m], b2));
            }
            __m256i si = sh ? _mm256_sub_epi32(sumi[g], _mm256_slli_epi32(so, sh)) : sumi[g];
            const __m256 da = _mm256_set1_ps(a[g].d[k]);
            acc[g] = _mm256_add_ps(acc[g], _mm256_mul_ps(_mm256_mul_ps(dwv, da), _mm256_cvtepi32_ps(si)));
            if (mins) acc[g] = _mm256_sub_ps(acc[g], _mm256_mul_ps(_mm256_mul_ps(dmv, da), _mm256_cvtepi32_ps(sm)));
        }
    }
KQ_UNROLL
    for (int g = 0; g < G; g++) {
        _mm256_storeu_ps(res, acc[g]);
        memcpy(y + (size_t)g * d, res, (size_t)rows * sizeof(float));
    }
}

/* Rows [r, r + rows) (rows <= 8) of y for activation rows [0, batch). */
KQ_INLINE void k_tile_rows(const uint32_t t, float *y, const uint8_t *act, size_t ab, const uint8_t *w, size_t rb,
                           size_t n, size_t d, size_t batch, size_t r, int rows)
{
    const size_t nb = n / 256, bb = k_bb(t);
    const uint8_t *w0 = w + r * rb;
    if (batch == 1) {
        const a8k a = a8k_view(act, n);
        for (int i = 0; i < rows; i++) y[r + (size_t)i] = k_row_decode(t, a, w0 + (size_t)i * rb, n);
        return;
    }
    if (batch <= MAXB) {
        a8k a[MAXB];
        for (size_t b = 0; b < batch; b++) a[b] = a8k_view(act + b * ab, n);
        for (int i = 0; i < rows; i++) {
            float o[MAXB];
            const uint8_t *wr = w0 + (size_t)i * rb;
            switch (batch) { /* constant G: one loop each */
            case MAXB: k_row_decode_g(t, MAXB, a, wr, n, o); break;
            case 3: k_row_decode_g(t, 3, a, wr, n, o); break;
            default: k_row_decode_g(t, 2, a, wr, n, o); break;
            }
            for (size_t b = 0; b < batch; b++) y[b * d + r + (size_t)i] = o[b];
        }
        return;
    }
    ktile kt[KCK];
    for (size_t k0 = 0; k0 < nb; k0 += KCK) {
        const size_t kn = nb - k0 < KCK ? nb - k0 : KCK;
        for (size_t kk = 0; kk < kn; kk++) k_tile_fill(t, &kt[kk], w0, rb, (k0 + kk) * bb, rows);
        for (size_t b = 0; b < batch;) {
            const bool four = batch - b >= MAXB;
            float *yb = y + b * d + r;
            const uint8_t *ax = act + b * ab;
            if (four && rows == TR) k_tile_pass(t, MAXB, yb, d, ax, ab, n, k0, kn, TR, kt);
            else if (four) k_tile_pass(t, MAXB, yb, d, ax, ab, n, k0, kn, rows, kt);
            else if (rows == TR) k_tile_pass(t, 1, yb, d, ax, ab, n, k0, kn, TR, kt);
            else k_tile_pass(t, 1, yb, d, ax, ab, n, k0, kn, rows, kt);
            b += four ? MAXB : 1;
        }
    }
}

KQ_INLINE void qrows_t(const uint32_t t, float *y, const uint8_t *act, const uint8_t *w, size_t n, size_t d,
                       size_t batch, size_t r0, size_t r1)
{
    const bool k = is_k(t);
    size_t rb = n / (k ? 256 : 32) * block_bytes(t), ab = llmem__act_row_bytes(t, n);
    if (!k) {
#if KQ_AVX512
        if (batch > MAXB) {
            for (size_t r = r0; r < r1; r += TR16)
                tile16_rows(t, y, act, ab, w, rb, n, d, batch, r, r1 - r < TR16 ? (int)(r1 - r) : TR16);
            return;
        }
#endif
        for (size_t r = r0; r < r1; r += TR) tile_rows(t, y, act, ab, w, rb, n, d, batch, r, r1 - r < TR ? (int)(r1 - r) : TR);
        return;
    }
    for (size_t r = r0; r < r1; r += TR) k_tile_rows(t, y, act, ab, w, rb, n, d, batch, r, r1 - r < TR ? (int)(r1 - r) : TR);
}

KQ_TARGET void KQ_EXPORT(float *y, const void *act, const void *w, uint32_t wtype, size_t n, size_t d,
                                 size_t batch, size_t r0, size_t r1)
{
    switch (wtype) {
    case LLMEM_DTYPE_Q4_0: qrows_t(LLMEM_DTYPE_Q4_0, y, act, w, n, d, batch, r0, r1); break;
    case LLMEM_DTYPE_Q4_1: qrows_t(LLMEM_DTYPE_Q4_1, y, act, w, n, d, batch, r0, r1); break;
    case LLMEM_DTYPE_Q5_0: qrows_t(LLMEM_DTYPE_Q5_0, y, act, w, n, d, batch, r0, r1); break;
    case LLMEM_DTYPE_Q5_1: qrows_t(LLMEM_DTYPE_Q5_1, y, act, w, n, d, batch, r0, r1); break;
    case LLMEM_DTYPE_Q8_0: qrows_t(LLMEM_DTYPE_Q8_0, y, act, w, n, d, batch, r0, r1); break;
    case LLMEM_DTYPE_Q2_K: qrows_t(LLMEM_DTYPE_Q2_K, y, act, w, n, d, batch, r0, r1); break;
    case LLMEM_DTYPE_Q3_K: qrows_t(LLMEM_DTYPE_Q3_K, y, act, w, n, d, batch, r0, r1); break;
    case LLMEM_DTYPE_Q4_K: qrows_t(LLMEM_DTYPE_Q4_K, y, act, w, n, d, batch, r0, r1); break;
    case LLMEM_DTYPE_Q5_K: qrows_t(LLMEM_DTYPE_Q5_K, y, act, w, n, d, batch, r0, r1); break;
    default: qrows_t(LLMEM_DTYPE_Q6_K, y, act, w, n, d, batch, r0, r1); break;
    }
}


/* ---- q4_K, 8 rows interleaved (kernels_q4k_x8.h) ----
 *
 * One 32-byte load is dword j of pair p of the 8 rows' levels (lane i =
 * row i); its low nibbles meet the broadcast activation bytes 64p + 4j..,
 * its high nibbles 64p + 32 + 4j..: one broadcast feeds 8 rows and the
 * levels stream from one contiguous region. Per 32-group the 4-product
 * sums add up in int16 (AVX2: 8 maddubs of at most 2 x 15 x 128 each, at
 * most 30720) or int32 (VNNI), then one multiply by the group's scale per
 * lane; the mins' term is one madd per pair of groups against the
 * activation's sums of 32. Exact integers, then the reference's float
 * epilogue per super-block, one row a lane: the bits of the q4_K path. */
#ifdef KQ_EXPORT_X8
#include "kernels_q4k_x8.h"

/* Group g's scales of the 8 rows (8 bytes at p) as VNNI's int32 lanes or
 * AVX2's int16 pairs (s, s) per lane. */
KQ_INLINE __m256i x8_scales(const uint8_t *p)
{
#if KQ_VNNI
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p));
#else
    uint64_t v;
    memcpy(&v, p, 8);
    const __m256i idx = _mm256_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1, 4, -1, 4, -1, 5, -1, 5,
                                         -1, 6, -1, 6, -1, 7, -1, 7, -1);
    return _mm256_shuffle_epi8(_mm256_set1_epi64x((long long)v), idx);
#endif
}

/* The q4_K group fetches X8_Q4K_AHEAD super-blocks (4.6 KiB) ahead, and
 * q5_0's (below) X8_Q5_0_AHEAD blocks (5.5 KiB), as the q4_0 and q8_0
 * groups do: a Zen 3 left yi-coder-1.5b q4_k (q5_0 ffn_down) decode
 * 1.14-1.20x slower without (three paired A/Bs, 1 and 4 sequences; 2 and
 * 16 ahead: 1.135x). Every group fetches only on its first activation
 * pass (`fetch`): a prefill passes over the group's blocks once per 2-4
 * activation rows, and from the second pass on they are in cache; fetched
 * at every pass the q4_k prefill lost 10% (0.89x), and q8_0's prefill
 * gained 1.18x from fetching once (docs/BENCHMARKS.md, 2026-12-07). */
enum { X8_Q4K_AHEAD = 4, X8_Q5_0_AHEAD = 32 };

/* acc[g] lane i: row i of the group (blocks wg) against activation row g
 * (stride ab), g < G. */
KQ_INLINE void x8_group(const int G, const bool fetch, const uint8_t *act, size_t ab, size_t n, const uint8_t *wg,
                        __m256 acc[MAXB])
{
    const size_t nb = n / 256;
    const __m256i m15 = _mm256_set1_epi8(15);
    a8k a[MAXB];
KQ_UNROLL
    for (int g = 0; g < G; g++) {
        a[g] = a8k_view(act + (size_t)g * ab, n);
        acc[g] = _mm256_setzero_ps();
    }
    for (size_t k = 0; k < nb; k++) {
        const uint8_t *blk = wg + k * LLMEM__X8_BLOCK;
        if (fetch) fetch_lines(blk + X8_Q4K_AHEAD * LLMEM__X8_BLOCK, LLMEM__X8_BLOCK);
        __m256i sumi[MAXB];
KQ_UNROLL
        for (int g = 0; g < G; g++) sumi[g] = _mm256_setzero_si256();
KQ_UNROLL
        for (int p = 0; p < 4; p++) {
            __m256i sl[MAXB], sh[MAXB];
KQ_UNROLL
            for (int g = 0; g < G; g++) sl[g] = sh[g] = _mm256_setzero_si256();
KQ_UNROLL
            for (int j = 0; j < 8; j++) {
                const __m256i raw = _mm256_loadu_si256((const __m256i *)(const void *)(blk + (size_t)(p * 8 + j) * 32));
                const __m256i lo = _mm256_and_si256(raw, m15), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m15);
KQ_UNROLL
                for (int g = 0; g < G; g++) {
                    const int8_t *xq = a[g].qs + 256 * k + (size_t)(64 * p + 4 * j);
#if KQ_VNNI
                    sl[g] = kq_dpbusd256(sl[g], lo, bcast32(xq));
                    sh[g] = kq_dpbusd256(sh[g], hi, bcast32(xq + 32));
#else
                    sl[g] = _mm256_add_epi16(sl[g], _mm256_maddubs_epi16(lo, bcast32(xq)));
                    sh[g] = _mm256_add_epi16(sh[g], _mm256_maddubs_epi16(hi, bcast32(xq + 32)));
#endif
                }
            }
            const __m256i s0 = x8_scales(blk + 1024 + 16 * (size_t)p), s1 = x8_scales(blk + 1024 + 16 * (size_t)p + 8);
KQ_UNROLL
            for (int g = 0; g < G; g++)
#if KQ_VNNI
                sumi[g] = _mm256_add_epi32(sumi[g], _mm256_add_epi32(_mm256_mullo_epi32(sl[g], s0),
                                                                     _mm256_mullo_epi32(sh[g], s1)));
#else
                sumi[g] = _mm256_add_epi32(sumi[g], _mm256_add_epi32(_mm256_madd_epi16(sl[g], s0),
                                                                     _mm256_madd_epi16(sh[g], s1)));
#endif
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(blk + 1152)));
        const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(blk + 1168)));
        const __m256i mp0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(blk + 1088)));
        const __m256i mp1 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(blk + 1104)));
        const __m256i mp2 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(blk + 1120)));
        const __m256i mp3 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(blk + 1136)));
KQ_UNROLL
        for (int g = 0; g < G; g++) {
            const int16_t *bs = a[g].bs + 16 * k;
            /* the activation's sums of 32: B_q = bs[2q] + bs[2q + 1], as int16 */
            const __m128i B = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)(const void *)bs),
                                             _mm_loadu_si128((const __m128i *)(const void *)(bs + 8)));
            __m256i sm = _mm256_madd_epi16(mp0, _mm256_broadcastd_epi32(B));
            sm = _mm256_add_epi32(sm, _mm256_madd_epi16(mp1, _mm256_broadcastd_epi32(_mm_srli_si128(B, 4))));
            sm = _mm256_add_epi32(sm, _mm256_madd_epi16(mp2, _mm256_broadcastd_epi32(_mm_srli_si128(B, 8))));
            sm = _mm256_add_epi32(sm, _mm256_madd_epi16(mp3, _mm256_broadcastd_epi32(_mm_srli_si128(B, 12))));
            const __m256 da = _mm256_set1_ps(a[g].d[k]);
            acc[g] = _mm256_add_ps(acc[g], _mm256_mul_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(sumi[g])));
            acc[g] = _mm256_sub_ps(acc[g], _mm256_mul_ps(_mm256_mul_ps(dm, da), _mm256_cvtepi32_ps(sm)));
        }
    }
}

#if KQ_AVX512
/* q8_0 repacked, 16 rows a pass for batches: groups g and g + 1 (blocks
 * at wg and wg2) side by side in a zmm, lanes 0..7 the first group's
 * rows, 8..15 the second's; dword j of the 16 rows is two 32-byte loads
 * joined, against the activation dword broadcast from memory. Each lane's
 * integers and float operations are x8_q8_0_group's for its row, in its
 * order: the same bits. */
KQ_INLINE void x8_q8_0_group16(const int G, const uint8_t *act, size_t ab, size_t n, const uint8_t *wg,
                               const uint8_t *wg2, __m512 acc[MAXB])
{
    const size_t nb = n / 32;
    const int bias = w_bias(LLMEM_DTYPE_Q8_0);
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    a8 a[MAXB];
KQ_UNROLL
    for (int g = 0; g < G; g++) {
        a[g] = a8_view(act + (size_t)g * ab, n);
        acc[g] = _mm512_setzero_ps();
    }
    for (size_t k = 0; k < nb; k++) {
        const uint8_t *blk = wg + k * LLMEM__X8_Q8_0_BLOCK, *blk2 = wg2 + k * LLMEM__X8_Q8_0_BLOCK;
        __m512i p[MAXB], p2[MAXB];
KQ_UNROLL
        for (int g = 0; g < G; g++) {
            p[g] = _mm512_set1_epi32(-bias * a[g].xs[k]);
            p2[g] = _mm512_setzero_si512();
        }
KQ_UNROLL
        for (int j = 0; j < 8; j++) {
            const __m256i q0 = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 32 * (size_t)j));
            const __m256i q1 = _mm256_loadu_si256((const __m256i *)(const void *)(blk2 + 32 * (size_t)j));
            const __m512i u = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1), flip);
KQ_UNROLL
            for (int g = 0; g < G; g++) {
                int32_t v;
                memcpy(&v, a[g].qs + 32 * k + 4 * (size_t)j, 4);
                __m512i *pg = j & 1 ? &p2[g] : &p[g];
                *pg = _mm512_dpbusd_epi32(*pg, u, _mm512_set1_epi32(v));
            }
        }
        const __m256i h = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(blk + 256))),
            _mm_loadu_si128((const __m128i *)(const void *)(blk2 + 256)), 1);
        const __m512 dw = _mm512_cvtph_ps(h);
KQ_UNROLL
        for (int g = 0; g < G; g++) {
            const __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(a[g].d[k]));
            acc[g] = _mm512_add_ps(acc[g], _mm512_mul_ps(sc, _mm512_cvtepi32_ps(_mm512_add_epi32(p[g], p2[g]))));
        }
    }
}

/* q4_0 repacked, 16 rows a pass for batches, as x8_q8_0_group16: groups
 * g and g + 1 side by side in a zmm (lanes 0..7 the first group's rows);
 * each 32-byte load of a block's nibbles is joined with its twin, and
 * both halves are unpacked at once. Each lane's integers and float
 * operations are x8_q4_0_group's (VNNI form) for its row, in its order:
 * the same bits. Half the unpacks and dot products of two passes of
 * x8_q4_0_group over the same rows. */
KQ_INLINE void x8_q4_0_group16(const int G, const uint8_t *act, size_t ab, size_t n, const uint8_t *wg,
                               const uint8_t *wg2, __m512 acc[MAXB])
{
    const size_t nb = n / 32;
    const __m512i m15 = _mm512_set1_epi8(15);
    a8 a[MAXB];
KQ_UNROLL
    for (int g = 0; g < G; g++) {
        a[g] = a8_view(act + (size_t)g * ab, n);
        acc[g] = _mm512_setzero_ps();
    }
    for (size_t k = 0; k < nb; k++) {
        const uint8_t *blk = wg + k * LLMEM__X8_Q4_0_BLOCK, *blk2 = wg2 + k * LLMEM__X8_Q4_0_BLOCK;
        __m512i s0[MAXB];
KQ_UNROLL
        for (int g = 0; g < G; g++) s0[g] = _mm512_setzero_si512();
KQ_UNROLL
        for (int j = 0; j < 4; j++) {
            const __m256i q0 = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 32 * (size_t)j));
            const __m256i q1 = _mm256_loadu_si256((const __m256i *)(const void *)(blk2 + 32 * (size_t)j));
            const __m512i raw = _mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1);
            const __m512i lo = _mm512_and_si512(raw, m15);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m15);
KQ_UNROLL
            for (int g = 0; g < G; g++) {
                int32_t v0, v1;
                memcpy(&v0, a[g].qs + 32 * k + 4 * (size_t)j, 4);
                memcpy(&v1, a[g].qs + 32 * k + 4 * (size_t)j + 16, 4);
                s0[g] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(s0[g], lo, _mm512_set1_epi32(v0)), hi,
                                            _mm512_set1_epi32(v1));
            }
        }
        const __m256i h = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(blk + 128))),
            _mm_loadu_si128((const __m128i *)(const void *)(blk2 + 128)), 1);
        const __m512 dw = _mm512_cvtph_ps(h);
KQ_UNROLL
        for (int g = 0; g < G; g++) {
            const __m512i sum = _mm512_sub_epi32(s0[g], _mm512_set1_epi32(8 * a[g].xs[k]));
            const __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(a[g].d[k]));
            acc[g] = _mm512_add_ps(acc[g], _mm512_mul_ps(sc, _mm512_cvtepi32_ps(sum)));
        }
    }
}

/* Rows 0..15 of y (stride d) for activation rows [0, batch) from the
 * groups at wg and wg2 through `group` (x8_q8_0_group16 or
 * x8_q4_0_group16), MAXB activation rows a pass, then the rest. Inlined
 * with a constant group, as x8_rows is. */
typedef void x8_group16_fn(const int G, const uint8_t *act, size_t ab, size_t n, const uint8_t *wg,
                           const uint8_t *wg2, __m512 acc[MAXB]);
KQ_INLINE void x8_rows16(x8_group16_fn *group, float *y, const uint8_t *act, size_t ab, size_t n, size_t d,
                         size_t batch, const uint8_t *wg, const uint8_t *wg2)
{
    for (size_t b = 0; b < batch;) {
        const int G = batch - b >= MAXB ? MAXB : (int)(batch - b);
        __m512 acc[MAXB];
        switch (G) {
        case MAXB: group(MAXB, act + b * ab, ab, n, wg, wg2, acc); break;
        case 3: group(3, act + b * ab, ab, n, wg, wg2, acc); break;
        case 2: group(2, act + b * ab, ab, n, wg, wg2, acc); break;
        default: group(1, act + b * ab, ab, n, wg, wg2, acc); break;
        }
        for (int gg = 0; gg < G; gg++) _mm512_storeu_ps(y + (b + (size_t)gg) * d, acc[gg]);
        b += (size_t)G;
    }
}
#endif

/* The row loop of the 8-row layouts: whole groups of 8 rows through
 * `group` (MAXB activation rows at a time, then the rest), the rows past the
 * last whole group in the source layout `t`. Inlined with constant
 * arguments, so each caller compiles to its own loop around its own
 * group kernel. Only the first pass over a group fetches ahead (`fetch`,
 * see X8_Q4K_AHEAD). */
typedef void x8_group_fn(const int G, const bool fetch, const uint8_t *act, size_t ab, size_t n, const uint8_t *wg,
                         __m256 acc[MAXB]);
KQ_INLINE void x8_rows(x8_group_fn *group, uint32_t t, size_t block_bytes, size_t block_elems, float *y,
                       const void *act, const void *w, size_t n, size_t d, size_t batch, size_t r0, size_t r1)
{
    const size_t nb = n / block_elems, ab = llmem__act_row_bytes(t, n), d8 = d / 8 * 8;
    const uint8_t *w8 = w, *a0 = act;
    size_t r = r0;
    while (r < r1 && r < d8) {
        const size_t g = r / 8, lo = r % 8, hi = r1 - 8 * g < 8 ? r1 - 8 * g : 8;
        const uint8_t *wg = w8 + g * nb * block_bytes;
#if KQ_AVX512
        /* q8_0 and q4_0 batches: two whole groups a pass (x8_rows16) */
        if ((t == LLMEM_DTYPE_Q8_0 || t == LLMEM_DTYPE_Q4_0) && batch > MAXB && lo == 0 && 8 * g + 16 <= r1 &&
            8 * g + 16 <= d8) {
            x8_rows16(t == LLMEM_DTYPE_Q8_0 ? x8_q8_0_group16 : x8_q4_0_group16, y + 8 * g, a0, ab, n, d, batch, wg,
                      wg + nb * block_bytes);
            r = 8 * g + 16;
            continue;
        }
#endif
        /* q4_K on AVX2 (no VNNI): 2 activation rows a pass. With 4 the 8
         * int16 sums and the broadcasts spilled (80 ymm of stack, vpaddw
         * from the stack among the hottest instructions of a prefill). */
        const int gmax = !KQ_VNNI && t == LLMEM_DTYPE_Q4_K ? 2 : MAXB;
        for (size_t b = 0; b < batch;) {
            const int G = batch - b >= (size_t)gmax ? gmax : (int)(batch - b);
            __m256 acc[MAXB];
            switch (G) { /* constant G: one loop each; 2-4 sequences stream the group once */
            case MAXB: group(MAXB, b == 0, a0 + b * ab, ab, n, wg, acc); break;
            case 3: group(3, b == 0, a0 + b * ab, ab, n, wg, acc); break;
            case 2: group(2, b == 0, a0 + b * ab, ab, n, wg, acc); break;
            default: group(1, b == 0, a0 + b * ab, ab, n, wg, acc); break;
            }
            for (int gg = 0; gg < G; gg++) {
                float res[8];
                _mm256_storeu_ps(res, acc[gg]);
                for (size_t i = lo; i < hi; i++) y[(b + (size_t)gg) * d + 8 * g + i] = res[i];
            }
            b += (size_t)G;
        }
        r = 8 * g + hi;
    }
    if (r < r1) qrows_t(t, y + d8, a0, w8 + d / 8 * nb * block_bytes, n, d, batch, r - d8, r1 - d8);
}

KQ_TARGET void KQ_EXPORT_X8(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch, size_t r0,
                            size_t r1)
{
    x8_rows(x8_group, LLMEM_DTYPE_Q4_K, LLMEM__X8_BLOCK, 256, y, act, w, n, d, batch, r0, r1);
}

/* q5_0, 8 rows interleaved: dword j of the 8 rows' nibbles is one load,
 * the fifth bits of the 8 rows one more (lane i = row i; byte b's bit j
 * for element 4j + b, bit 4 + j for 16 + 4j + b), moved to bit 4 by one
 * shift each. Per block the 8 products of each row sum in int16 four
 * maddubs at a time (at most 4 x 2 x 31 x 128 = 31744), then int32; the
 * levels are q + 16, so 16 x the activation block's sum comes off. */
KQ_INLINE void x8_q5_0_group(const int G, const bool fetch, const uint8_t *act, size_t ab, size_t n, const uint8_t *wg,
                             __m256 acc[MAXB])
{
    const size_t nb = n / 32;
    const __m256i m15 = _mm256_set1_epi8(15), m16 = _mm256_set1_epi8(16);
    a8 a[MAXB];
KQ_UNROLL
    for (int g = 0; g < G; g++) {
        a[g] = a8_view(act + (size_t)g * ab, n);
        acc[g] = _mm256_setzero_ps();
    }
    for (size_t k = 0; k < nb; k++) {
        const uint8_t *blk = wg + k * LLMEM__X8_Q5_0_BLOCK;
        if (fetch) fetch_lines(blk + X8_Q5_0_AHEAD * LLMEM__X8_Q5_0_BLOCK, LLMEM__X8_Q5_0_BLOCK + 64);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 128));
        __m256i s0[MAXB], s1[MAXB];
KQ_UNROLL
        for (int g = 0; g < G; g++) s0[g] = s1[g] = _mm256_setzero_si256();
KQ_UNROLL
        for (int j = 0; j < 4; j++) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 32 * (size_t)j));
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(raw, m15), _mm256_and_si256(_mm256_slli_epi16(qh, 4 - j), m16));
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m15),
                                               _mm256_and_si256(_mm256_srli_epi16(qh, j), m16));
KQ_UNROLL
            for (int g = 0; g < G; g++) {
                const int8_t *xq = a[g].qs + 32 * k + 4 * (size_t)j;
#if KQ_VNNI
                s0[g] = kq_dpbusd256(kq_dpbusd256(s0[g], lo, bcast32(xq)), hi, bcast32(xq + 16));
#else
                s0[g] = _mm256_add_epi16(s0[g], _mm256_maddubs_epi16(lo, bcast32(xq)));
                s1[g] = _mm256_add_epi16(s1[g], _mm256_maddubs_epi16(hi, bcast32(xq + 16)));
#endif
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(blk + 160)));
KQ_UNROLL
        for (int g = 0; g < G; g++) {
#if KQ_VNNI
            __m256i sum = s0[g];
#else
            const __m256i one = _mm256_set1_epi16(1);
            __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(s0[g], one), _mm256_madd_epi16(s1[g], one));
#endif
            sum = _mm256_sub_epi32(sum, _mm256_set1_epi32(16 * a[g].xs[k]));
            const __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(a[g].d[k]));
            acc[g] = _mm256_add_ps(acc[g], _mm256_mul_ps(sc, _mm256_cvtepi32_ps(sum)));
        }
    }
}

KQ_TARGET void KQ_EXPORT_X8_Q5_0(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch,
                                 size_t r0, size_t r1)
{
    x8_rows(x8_q5_0_group, LLMEM_DTYPE_Q5_0, LLMEM__X8_Q5_0_BLOCK, 32, y, act, w, n, d, batch, r0, r1);
}

/* q4_0, 8 rows interleaved: q5_0's group without the fifth bits; the
 * levels are q + 8, so 8 x the activation block's sum comes off. Per block
 * the int16 sums of the AVX2 form stay below 4 x 2 x 15 x 128 = 15360.
 * It fetches X8_Q4_0_AHEAD blocks (4.5 KiB) ahead, as q8_0's group does
 * (below): without it, yi-coder-1.5b q4_0 decode on the Intel VM ran at
 * 0.72x of the in-place rows it replaces; 8 ahead 0.90x of 16, 32 ahead
 * 1.06x of 16, 64 the same as 32 (bench/ab_runs.sh, 2026-12-06). */
enum { X8_Q4_0_AHEAD = 32 };
KQ_INLINE void x8_q4_0_group(const int G, const bool fetch, const uint8_t *act, size_t ab, size_t n, const uint8_t *wg,
                             __m256 acc[MAXB])
{
    const size_t nb = n / 32;
    const __m256i m15 = _mm256_set1_epi8(15);
    a8 a[MAXB];
KQ_UNROLL
    for (int g = 0; g < G; g++) {
        a[g] = a8_view(act + (size_t)g * ab, n);
        acc[g] = _mm256_setzero_ps();
    }
    for (size_t k = 0; k < nb; k++) {
        const uint8_t *blk = wg + k * LLMEM__X8_Q4_0_BLOCK;
        if (fetch) fetch_lines(blk + X8_Q4_0_AHEAD * LLMEM__X8_Q4_0_BLOCK, LLMEM__X8_Q4_0_BLOCK + 64);
        __m256i s0[MAXB], s1[MAXB];
KQ_UNROLL
        for (int g = 0; g < G; g++) s0[g] = s1[g] = _mm256_setzero_si256();
KQ_UNROLL
        for (int j = 0; j < 4; j++) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 32 * (size_t)j));
            const __m256i lo = _mm256_and_si256(raw, m15);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m15);
KQ_UNROLL
            for (int g = 0; g < G; g++) {
                const int8_t *xq = a[g].qs + 32 * k + 4 * (size_t)j;
#if KQ_VNNI
                s0[g] = kq_dpbusd256(kq_dpbusd256(s0[g], lo, bcast32(xq)), hi, bcast32(xq + 16));
#else
                s0[g] = _mm256_add_epi16(s0[g], _mm256_maddubs_epi16(lo, bcast32(xq)));
                s1[g] = _mm256_add_epi16(s1[g], _mm256_maddubs_epi16(hi, bcast32(xq + 16)));
#endif
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(blk + 128)));
KQ_UNROLL
        for (int g = 0; g < G; g++) {
#if KQ_VNNI
            __m256i sum = s0[g];
#else
            const __m256i one = _mm256_set1_epi16(1);
            __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(s0[g], one), _mm256_madd_epi16(s1[g], one));
#endif
            sum = _mm256_sub_epi32(sum, _mm256_set1_epi32(8 * a[g].xs[k]));
            const __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(a[g].d[k]));
            acc[g] = _mm256_add_ps(acc[g], _mm256_mul_ps(sc, _mm256_cvtepi32_ps(sum)));
        }
    }
}

KQ_TARGET void KQ_EXPORT_X8_Q4_0(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch,
                                 size_t r0, size_t r1)
{
    x8_rows(x8_q4_0_group, LLMEM_DTYPE_Q4_0, LLMEM__X8_Q4_0_BLOCK, 32, y, act, w, n, d, batch, r0, r1);
}

/* q8_0, 8 rows interleaved: dword j of the 8 rows' levels is one load
 * (lane i = row i) against the broadcast activation bytes 4j..4j+3, as
 * tile_pass does over its transposed buffer, so the integer sums and the
 * float epilogue are the tile path's and row8_decode's: the same bits.
 * AVX2 keeps the levels signed (|q| x sign-moved activation, pairs summed
 * to int32 at once: two maddubs pairs could pass int16); VNNI biases them
 * by 128 and takes 128 x the block's sum off. Two chains (even, odd j)
 * keep 2G sums in flight. The group is one linear stream, which Zen 4's
 * hardware prefetcher follows alone (a software fetch 8 or 16 blocks ahead
 * measured the same there: yi-coder-1.5b decode 1.028x and 1.020x); on
 * this project's Intel VMs (Emerald Rapids) fetching the block
 * X8_Q8_0_AHEAD blocks ahead took yi-coder-1.5b q8_0 decode from 0.75-0.86x
 * of llama.cpp up by 1.14-1.21x (24 ahead: the same), so every CPU gets it.
 * Past the group's end it fetches the next group's start, which the same
 * thread reads next. */
enum { X8_Q8_0_AHEAD = 8 };
KQ_INLINE void x8_q8_0_group(const int G, const bool fetch, const uint8_t *act, size_t ab, size_t n, const uint8_t *wg,
                             __m256 acc[MAXB])
{
    const size_t nb = n / 32;
    const int bias = w_bias(LLMEM_DTYPE_Q8_0);
    a8 a[MAXB];
KQ_UNROLL
    for (int g = 0; g < G; g++) {
        a[g] = a8_view(act + (size_t)g * ab, n);
        acc[g] = _mm256_setzero_ps();
    }
    for (size_t k = 0; k < nb; k++) {
        const uint8_t *blk = wg + k * LLMEM__X8_Q8_0_BLOCK;
        if (fetch) fetch_lines(blk + X8_Q8_0_AHEAD * LLMEM__X8_Q8_0_BLOCK, LLMEM__X8_Q8_0_BLOCK);
        __m256i p[MAXB], p2[MAXB];
KQ_UNROLL
        for (int g = 0; g < G; g++) {
            p[g] = bias ? _mm256_set1_epi32(-bias * a[g].xs[k]) : _mm256_setzero_si256();
            p2[g] = _mm256_setzero_si256();
        }
KQ_UNROLL
        for (int j = 0; j < 8; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 32 * (size_t)j));
            const __m256i u = bias ? _mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)) : _mm256_sign_epi8(q, q);
KQ_UNROLL
            for (int g = 0; g < G; g++) {
                const __m256i xb = bcast32(a[g].qs + 32 * k + 4 * (size_t)j);
                __m256i *pg = j & 1 ? &p2[g] : &p[g];
                *pg = bias ? dp_acc(*pg, u, xb) : dp_acc(*pg, u, _mm256_sign_epi8(xb, q));
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(blk + 256)));
KQ_UNROLL
        for (int g = 0; g < G; g++) {
            const __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(a[g].d[k]));
            acc[g] = _mm256_add_ps(acc[g], _mm256_mul_ps(sc, _mm256_cvtepi32_ps(_mm256_add_epi32(p[g], p2[g]))));
        }
    }
}

KQ_TARGET void KQ_EXPORT_X8_Q8_0(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch,
                                 size_t r0, size_t r1)
{
    x8_rows(x8_q8_0_group, LLMEM_DTYPE_Q8_0, LLMEM__X8_Q8_0_BLOCK, 32, y, act, w, n, d, batch, r0, r1);
}
#endif
