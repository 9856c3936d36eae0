/*
 * kernels_q.c - quantised weights times quantised activations: the
 * integer dot products of the engine's matmul over q4_0, q4_1, q5_0, q5_1,
 * q8_0 and the k-quants q2_k..q6_k (block layouts: llmem/quant.h,
 * model/quant_internal.h).
 *
 * Why integers. A weight block is small integers times a scale (plus a
 * minimum); so is an activation block once x is quantised to int8 (once
 * per matmul, not per weight row). Their product is then an exact integer
 * sum per block times a product of scales: one int8 multiply-add per
 * weight instead of a dequantise and an f32 FMA, and no f32 copy of the
 * weights. This is the scheme of the format (llama.cpp computes the same
 * products); rounding x to int8 costs ~0.4% relative error per block,
 * below the weights' own quantisation error.
 *
 * The products, per weight block (dw, mw its scale and minimum; da, sa the
 * activation block's scale and scaled sum; Σ over the block):
 *   q8_0, q4_0, q5_0:   dw da Σ qw qa                (qw signed: q - 8, q - 16)
 *   q4_1, q5_1:         dw da Σ qw qa + mw sa
 *   q2_k, q4_k, q5_k:   d da Σ_g sc_g Σ_g qw qa - dmin da Σ_g m_g Σ_g qa
 *   q3_k, q6_k:         d da Σ_g sc_g (Σ_g qw qa - o Σ_g qa)   (o = 4, 32: qw is stored + o)
 * where the group sums Σ_g qa are the activation row's bsums. Every
 * integer sum is exact in int32 (the largest, q6_k: 16 groups x 127 x 63 x
 * 127 x 16 < 2^31).
 *
 * Order. Per (weight row, activation row) the float result is summed in
 * one order that depends on n only, so batched and batch-1 calls agree
 * bitwise on each path. The 32-element types: blocks in increasing order
 * into one float, acc += (dw da) Σ, then (q4_1, q5_1) acc += mw sa, on
 * both paths (the vector path computes 8 weight rows in the 8 lanes, one
 * row a lane), so the two paths give the same bits. The k-quants: blocks
 * in increasing order into one float, acc += (d da) Σ, then (q2_k, q4_k,
 * q5_k) acc -= (dmin da) Σ_m, on both paths (the vector path again one row
 * a lane), so the two paths give the same bits here too.
 *
 * Nothing here allocates.
 */
#include "kernels_q.h"

#include <math.h>
#include <string.h>

#include "llmem/model.h"

#include "../core/half.h"
#include "../model/quant_internal.h"
#include "kernels_q_layout.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define KQ_X86 1
#include <immintrin.h>
#endif

static inline float h2f(uint16_t h) { return llmem__f16_to_f32(h); }

bool llmem__is_qtype(uint32_t t)
{
    switch (t) {
    case LLMEM_DTYPE_Q4_0: case LLMEM_DTYPE_Q4_1: case LLMEM_DTYPE_Q5_0: case LLMEM_DTYPE_Q5_1:
    case LLMEM_DTYPE_Q8_0: case LLMEM_DTYPE_Q2_K: case LLMEM_DTYPE_Q3_K: case LLMEM_DTYPE_Q4_K:
    case LLMEM_DTYPE_Q5_K: case LLMEM_DTYPE_Q6_K: return true;
    default: return false;
    }
}

size_t llmem__act_row_bytes(uint32_t wtype, size_t n)
{
    if (!llmem__is_qtype(wtype)) return 0;
    if (is_k(wtype)) return round64(n + 2 * (n / 16) + 4 * (n / 256));
    return round64(n + 12 * (n / 32));
}

/* ---- activation rows ------------------------------------------------------ */

static inline int rne(float v) { return (int)lrintf(v); } /* the default rounding mode: half to even */

/* One 256-element block of a k-quant activation row: q = x * (-127 / mx)
 * rounded half to even (at most 127), mx the first element of the largest
 * magnitude; bs the 16 sums of 16 q; *d = 1 / (-127 / mx), or all zero
 * when x is. */
static void act_block_k_ref(const float *xb, int8_t *q, int16_t *bs, float *d)
{
    float amax = 0, mx = 0;
    for (int j = 0; j < 256; j++)
        if (fabsf(xb[j]) > amax) {
            amax = fabsf(xb[j]);
            mx = xb[j];
        }
    if (amax == 0) {
        memset(q, 0, 256);
        memset(bs, 0, 32);
        *d = 0;
        return;
    }
    float iscale = -127.0f / mx;
    for (int j = 0; j < 256; j++) {
        int v = rne(iscale * xb[j]);
        q[j] = (int8_t)(v > 127 ? 127 : v);
    }
    for (int g = 0; g < 16; g++) {
        int sum = 0;
        for (int j = 0; j < 16; j++) sum += q[16 * g + j];
        bs[g] = (int16_t)sum;
    }
    *d = 1.0f / iscale;
}

void llmem__act_quantize_ref(uint32_t wtype, const float *x, size_t n, void *row)
{
    uint8_t *p = row;
    int8_t *qs = (int8_t *)p;
    if (!is_k(wtype)) {
        float *d = (float *)(p + n), *s = d + n / 32;
        int32_t *xs = (int32_t *)(void *)(s + n / 32);
        for (size_t b = 0; b < n / 32; b++) {
            const float *xb = x + 32 * b;
            float amax = 0;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
            float db = amax / 127.0f, id = amax != 0 ? 127.0f / amax : 0.0f;
            int sum = 0;
            for (int j = 0; j < 32; j++) {
                int q = rne(xb[j] * id);
                qs[32 * b + (size_t)j] = (int8_t)q;
                sum += q;
            }
            d[b] = h2f(llmem__f32_to_f16(db));
            s[b] = h2f(llmem__f32_to_f16(db * (float)sum));
            xs[b] = sum;
        }
        return;
    }
    int16_t *bs = (int16_t *)(p + n);
    float *d = (float *)(p + n + 2 * (n / 16));
    for (size_t b = 0; b < n / 256; b++) act_block_k_ref(x + 256 * b, qs + 256 * b, bs + 16 * b, d + b);
}

/* ---- the reference dot products -------------------------------------------- */

static inline uint32_t ld32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The 32 levels of a 32-element block (signed for q4_0/q5_0/q8_0). */
static void levels32(uint32_t t, const uint8_t *blk, int q[32], float *dw, float *mw)
{
    *mw = 0;
    switch (t) {
    case LLMEM_DTYPE_Q8_0: {
        const llmem__q8_0 *b = (const void *)blk;
        *dw = h2f(b->d);
        for (int j = 0; j < 32; j++) q[j] = b->qs[j];
        break;
    }
    case LLMEM_DTYPE_Q4_0: case LLMEM_DTYPE_Q4_1: {
        const uint8_t *qs = t == LLMEM_DTYPE_Q4_0 ? ((const llmem__q4_0 *)(const void *)blk)->qs
                                                  : ((const llmem__q4_1 *)(const void *)blk)->qs;
        int off = t == LLMEM_DTYPE_Q4_0 ? 8 : 0;
        for (int j = 0; j < 16; j++) {
            q[j] = (qs[j] & 15) - off;
            q[j + 16] = (qs[j] >> 4) - off;
        }
        if (t == LLMEM_DTYPE_Q4_0) *dw = h2f(((const llmem__q4_0 *)(const void *)blk)->d);
        else {
            *dw = h2f(((const llmem__q4_1 *)(const void *)blk)->d);
            *mw = h2f(((const llmem__q4_1 *)(const void *)blk)->m);
        }
        break;
    }
    default: { /* q5_0, q5_1 */
        bool one = t == LLMEM_DTYPE_Q5_1;
        const uint8_t *qs = one ? ((const llmem__q5_1 *)(const void *)blk)->qs : ((const llmem__q5_0 *)(const void *)blk)->qs;
        uint32_t qh = ld32(one ? ((const llmem__q5_1 *)(const void *)blk)->qh : ((const llmem__q5_0 *)(const void *)blk)->qh);
        int off = one ? 0 : 16;
        for (int j = 0; j < 16; j++) {
            q[j] = ((qs[j] & 15) | (int)(((qh >> j) & 1) << 4)) - off;
            q[j + 16] = ((qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4)) - off;
        }
        if (one) {
            *dw = h2f(((const llmem__q5_1 *)(const void *)blk)->d);
            *mw = h2f(((const llmem__q5_1 *)(const void *)blk)->m);
        } else {
            *dw = h2f(((const llmem__q5_0 *)(const void *)blk)->d);
        }
        break;
    }
    }
}

/* Levels (as stored: unsigned, before any offset), group scales (signed
 * integers), group minimum integers and the super-block's d, dmin, for one
 * k-quant super-block; groups of gsize. The value of element e is
 * d * sc[g] * (q[e] - off) - dmin * m[g], g = e / gsize. */
typedef struct kblock {
    int q[256];
    int sc[16], m[16];
    int gsize, off;
    float d, dmin;
} kblock;

static void kblock_read(uint32_t t, const uint8_t *blk, kblock *k)
{
    memset(k->m, 0, sizeof k->m);
    k->dmin = 0;
    k->off = 0;
    switch (t) {
    case LLMEM_DTYPE_Q2_K: {
        const llmem__q2_k *b = (const void *)blk;
        k->gsize = 16;
        k->d = h2f(b->d);
        k->dmin = h2f(b->dmin);
        for (int g = 0; g < 16; g++) {
            k->sc[g] = b->scales[g] & 15;
            k->m[g] = b->scales[g] >> 4;
        }
        for (int e = 0; e < 256; e++) k->q[e] = (b->qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
        break;
    }
    case LLMEM_DTYPE_Q3_K: {
        const llmem__q3_k *b = (const void *)blk;
        uint8_t sc[16];
        llmem__k3_scales(b->scales, sc);
        k->gsize = 16;
        k->off = 4;
        k->d = h2f(b->d);
        for (int g = 0; g < 16; g++) k->sc[g] = sc[g] - 32;
        for (int e = 0; e < 256; e++) {
            int h = e / 128, j = (e % 128) / 32, l = e % 32;
            k->q[e] = ((b->qs[32 * h + l] >> (2 * j)) & 3) | (((b->hmask[l] >> (4 * h + j)) & 1) << 2);
        }
        break;
    }
    case LLMEM_DTYPE_Q4_K: case LLMEM_DTYPE_Q5_K: {
        bool five = t == LLMEM_DTYPE_Q5_K;
        const uint8_t *scales = five ? ((const llmem__q5_k *)(const void *)blk)->scales : ((const llmem__q4_k *)(const void *)blk)->scales;
        const uint8_t *qs = five ? ((const llmem__q5_k *)(const void *)blk)->qs : ((const llmem__q4_k *)(const void *)blk)->qs;
        uint16_t dh = five ? ((const llmem__q5_k *)(const void *)blk)->d : ((const llmem__q4_k *)(const void *)blk)->d;
        uint16_t mh = five ? ((const llmem__q5_k *)(const void *)blk)->dmin : ((const llmem__q4_k *)(const void *)blk)->dmin;
        k->gsize = 32;
        k->d = h2f(dh);
        k->dmin = h2f(mh);
        uint8_t s[8], m[8];
        llmem__k4_scales_mins(scales, s, m);
        for (int g = 0; g < 8; g++) {
            k->sc[g] = s[g];
            k->m[g] = m[g];
        }
        for (int e = 0; e < 256; e++) {
            int g = e / 32, l = e % 32;
            k->q[e] = (qs[32 * (g / 2) + l] >> (4 * (g % 2))) & 15;
            if (five) k->q[e] |= ((((const llmem__q5_k *)(const void *)blk)->qh[l] >> g) & 1) << 4;
        }
        break;
    }
    default: { /* q6_k */
        const llmem__q6_k *b = (const void *)blk;
        k->gsize = 16;
        k->off = 32;
        k->d = h2f(b->d);
        for (int g = 0; g < 16; g++) k->sc[g] = b->scales[g];
        for (int e = 0; e < 256; e++) {
            int h = e / 128, kk = (e % 128) / 32, l = e % 32;
            int lo = (b->ql[64 * h + 32 * (kk % 2) + l] >> (4 * (kk / 2))) & 15;
            int hi = (b->qh[32 * h + l] >> (2 * kk)) & 3;
            k->q[e] = lo | (hi << 4);
        }
        break;
    }
    }
}

float llmem__qdot_ref(uint32_t t, const void *w, const void *act, size_t n)
{
    const uint8_t *wb = w;
    size_t bb = block_bytes(t);
    float acc = 0;
    const bool mins = t == LLMEM_DTYPE_Q2_K || t == LLMEM_DTYPE_Q4_K || t == LLMEM_DTYPE_Q5_K;
    if (!is_k(t)) {
        a8 a = a8_view(act, n);
        for (size_t b = 0; b < n / 32; b++) {
            int q[32];
            float dw, mw;
            levels32(t, wb + b * bb, q, &dw, &mw);
            int sum = 0;
            for (int j = 0; j < 32; j++) sum += q[j] * a.qs[32 * b + (size_t)j];
            acc += (dw * a.d[b]) * (float)sum;
            if (t == LLMEM_DTYPE_Q4_1 || t == LLMEM_DTYPE_Q5_1) acc += mw * a.s[b];
        }
        return acc;
    }
    a8k a = a8k_view(act, n);
    for (size_t b = 0; b < n / 256; b++) {
        kblock k;
        kblock_read(t, wb + b * bb, &k);
        const int8_t *qa = a.qs + 256 * b;
        const int16_t *bs = a.bs + 16 * b;
        int sumi = 0, summ = 0;
        for (int g = 0; g < 256 / k.gsize; g++) {
            int s = 0, sa = 0;
            for (int j = 0; j < k.gsize; j++) s += k.q[g * k.gsize + j] * qa[g * k.gsize + j];
            for (int h = 0; h < k.gsize / 16; h++) sa += bs[g * (k.gsize / 16) + h];
            sumi += k.sc[g] * (s - k.off * sa);
            summ += k.m[g] * sa;
        }
        acc += (k.d * a.d[b]) * (float)sumi;
        if (mins) acc -= (k.dmin * a.d[b]) * (float)summ;
    }
    return acc;
}

void llmem__qrows_ref(float *y, const void *act, const void *w, uint32_t wtype, size_t n, size_t d, size_t batch,
                      size_t r0, size_t r1)
{
    size_t rb = n / (is_k(wtype) ? 256 : 32) * block_bytes(wtype), ab = llmem__act_row_bytes(wtype, n);
    for (size_t r = r0; r < r1; r++)
        for (size_t b = 0; b < batch; b++)
            y[b * d + r] = llmem__qdot_ref(wtype, (const uint8_t *)w + r * rb, (const uint8_t *)act + b * ab, n);
}

/* ---- the vector path ------------------------------------------------------------
 * The dot products are kernels_q_x86.h, compiled twice: kernels_q_avx2.c
 * (AVX2 + FMA + F16C) and kernels_q_vnni.c (the same with AVX-VNNI's
 * vpdpbusd for the u8 x s8 sums: one instruction for maddubs + madd, exact
 * where maddubs is, so both give the same bits). The activation rows need
 * AVX2 only. */

#ifdef KQ_X86
#define KQ_TARGET __attribute__((target("avx2,fma,f16c")))

static inline __attribute__((always_inline, target("avx2,fma,f16c"))) float act_h2f(uint16_t h)
{
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

/* act_block_k_ref, vectorised, the same bits: the same amax (a max is
 * exact in any order; NaNs are skipped by both, as max_ps returns its
 * second operand for them), mx the first element of that magnitude, the
 * same products rounded by the same mode, the clamp at 127, and exact
 * integer sums. A block with an infinite or NaN maximum goes to the
 * reference (lrintf of a NaN product is not the vector conversion's). */
KQ_TARGET static void act_block_k_avx2(const float *xb, int8_t *q, int16_t *bs, float *d)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < 32; i++) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(xb + 8 * i)), m);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float amax = _mm_cvtss_f32(h);
    if (amax == 0 || !(amax <= 0x1.fffffep127f)) {
        act_block_k_ref(xb, q, bs, d);
        return;
    }
    int j = 0;
    while (fabsf(xb[j]) != amax) j++;
    float iscale = -127.0f / xb[j];
    const __m256 is = _mm256_set1_ps(iscale);
    const __m256i top = _mm256_set1_epi32(127), order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int g4 = 0; g4 < 4; g4++) { /* 64 elements: 4 groups of 16 */
        __m256i v[8];
        for (int i = 0; i < 8; i++)
            v[i] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 64 * g4 + 8 * i), is)), top);
        for (int i = 0; i < 8; i += 4) { /* 32 int8 in order: packs interleave the 128-bit lanes */
            __m256i p8 = _mm256_packs_epi16(_mm256_packs_epi32(v[i], v[i + 1]), _mm256_packs_epi32(v[i + 2], v[i + 3]));
            _mm256_storeu_si256((__m256i *)(void *)(q + 64 * g4 + 8 * i), _mm256_permutevar8x32_epi32(p8, order));
        }
        /* The 4 group sums: hadd folds pairs, the two 128-bit halves add. */
        __m256i s01 = _mm256_hadd_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3]));
        __m256i s23 = _mm256_hadd_epi32(_mm256_add_epi32(v[4], v[5]), _mm256_add_epi32(v[6], v[7]));
        __m256i s = _mm256_hadd_epi32(s01, s23); /* lanes: g0 g1 g2 g3 of each half */
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        _mm_storel_epi64((__m128i *)(void *)(bs + 4 * g4), _mm_packs_epi32(s4, s4));
    }
    *d = 1.0f / iscale;
}

/* Activation rows, vectorised; the same values as the reference (the
 * same float operations per element: amax, 127 / amax, x * that rounded
 * half to even, amax / 127). */
KQ_TARGET void llmem__act_quantize_avx2(uint32_t wtype, const float *x, size_t n, void *row)
{
    if (is_k(wtype)) {
        int16_t *bs = (int16_t *)(void *)((uint8_t *)row + n);
        float *d = (float *)(void *)((uint8_t *)row + n + 2 * (n / 16));
        for (size_t b = 0; b < n / 256; b++) act_block_k_avx2(x + 256 * b, (int8_t *)row + 256 * b, bs + 16 * b, d + b);
        return;
    }
    uint8_t *p = row;
    int8_t *qs = (int8_t *)p;
    float *dd = (float *)(p + n), *ss = dd + n / 32;
    int32_t *xs = (int32_t *)(void *)(ss + n / 32);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (size_t b = 0; b < n / 32; b++) {
        const float *xb = x + 32 * b;
        __m256 v[4], m = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(xb + 8 * i);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        float amax = _mm_cvtss_f32(h);
        float db = amax / 127.0f, id = amax != 0 ? 127.0f / amax : 0.0f;
        __m256 idv = _mm256_set1_ps(id);
        __m256i q[4];
        for (int i = 0; i < 4; i++)
            q[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], idv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        /* Pack 4 x 8 int32 to 32 int8 in order: packs interleave the
         * 128-bit lanes, a permute restores the order. */
        __m256i p16a = _mm256_packs_epi32(q[0], q[1]), p16b = _mm256_packs_epi32(q[2], q[3]);
        __m256i p8 = _mm256_packs_epi16(p16a, p16b);
        p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(void *)(qs + 32 * b), p8);
        __m256i s32 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        int sum = _mm_cvtsi128_si32(s4);
        dd[b] = act_h2f((uint16_t)_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(db), _MM_FROUND_TO_NEAREST_INT), 0));
        ss[b] = act_h2f((uint16_t)_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(db * (float)sum), _MM_FROUND_TO_NEAREST_INT), 0));
        xs[b] = sum;
    }
}
#else
void llmem__act_quantize_avx2(uint32_t wtype, const float *x, size_t n, void *row)
{
    llmem__act_quantize_ref(wtype, x, n, row);
}
#endif
