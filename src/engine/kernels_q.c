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
 * one order that depends on n only: blocks in increasing order into one
 * 8-lane accumulator (vector path) or one float (reference), the minimum
 * terms into a separate float, lanes reduced as kernels.c reduces them;
 * so batched and batch-1 calls agree bitwise on each path. The two paths
 * agree with each other within float rounding (their integer sums are
 * identical; their float sums differ in order).
 *
 * Nothing here allocates.
 */
#include "kernels_q.h"

#include <math.h>
#include <string.h>

#include "llmem/model.h"

#include "../core/half.h"
#include "../model/quant_internal.h"

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

static inline bool is_k(uint32_t t) { return t >= LLMEM_DTYPE_Q2_K && t <= LLMEM_DTYPE_Q6_K; }

static inline size_t round64(size_t b) { return (b + 63) & ~(size_t)63; }

size_t llmem__act_row_bytes(uint32_t wtype, size_t n)
{
    if (!llmem__is_qtype(wtype)) return 0;
    if (is_k(wtype)) return round64(n + 2 * (n / 16) + 4 * (n / 256));
    return round64(n + 8 * (n / 32));
}

/* ---- activation rows ------------------------------------------------------ */

typedef struct a8 {
    const int8_t *qs;
    const float *d, *s;
} a8;

typedef struct a8k {
    const int8_t *qs;
    const int16_t *bs;
    const float *d;
} a8k;

static inline a8 a8_view(const void *row, size_t n)
{
    const uint8_t *p = row;
    a8 v = {(const int8_t *)p, (const float *)(p + n), (const float *)(p + n) + n / 32};
    return v;
}

static inline a8k a8k_view(const void *row, size_t n)
{
    const uint8_t *p = row;
    a8k v = {(const int8_t *)p, (const int16_t *)(p + n), (const float *)(p + n + 2 * (n / 16))};
    return v;
}

static inline int rne(float v) { return (int)lrintf(v); } /* the default rounding mode: half to even */

void llmem__act_quantize_ref(uint32_t wtype, const float *x, size_t n, void *row)
{
    uint8_t *p = row;
    int8_t *qs = (int8_t *)p;
    if (!is_k(wtype)) {
        float *d = (float *)(p + n), *s = d + n / 32;
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
        }
        return;
    }
    int16_t *bs = (int16_t *)(p + n);
    float *d = (float *)(p + n + 2 * (n / 16));
    for (size_t b = 0; b < n / 256; b++) {
        const float *xb = x + 256 * b;
        float amax = 0, mx = 0;
        for (int j = 0; j < 256; j++)
            if (fabsf(xb[j]) > amax) {
                amax = fabsf(xb[j]);
                mx = xb[j];
            }
        int8_t *q = qs + 256 * b;
        if (amax == 0) {
            memset(q, 0, 256);
            memset(bs + 16 * b, 0, 32);
            d[b] = 0;
            continue;
        }
        float iscale = -127.0f / mx;
        for (int j = 0; j < 256; j++) {
            int v = rne(iscale * xb[j]);
            q[j] = (int8_t)(v > 127 ? 127 : v);
        }
        for (int g = 0; g < 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++) sum += q[16 * g + j];
            bs[16 * b + (size_t)g] = (int16_t)sum;
        }
        d[b] = 1.0f / iscale;
    }
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

static size_t block_bytes(uint32_t t)
{
    switch (t) {
    case LLMEM_DTYPE_Q4_0: return sizeof(llmem__q4_0);
    case LLMEM_DTYPE_Q4_1: return sizeof(llmem__q4_1);
    case LLMEM_DTYPE_Q5_0: return sizeof(llmem__q5_0);
    case LLMEM_DTYPE_Q5_1: return sizeof(llmem__q5_1);
    case LLMEM_DTYPE_Q8_0: return sizeof(llmem__q8_0);
    case LLMEM_DTYPE_Q2_K: return sizeof(llmem__q2_k);
    case LLMEM_DTYPE_Q3_K: return sizeof(llmem__q3_k);
    case LLMEM_DTYPE_Q4_K: return sizeof(llmem__q4_k);
    case LLMEM_DTYPE_Q5_K: return sizeof(llmem__q5_k);
    default: return sizeof(llmem__q6_k);
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
        for (int g = 0; g < 8; g++) {
            uint8_t s, m;
            llmem__k4_scale_min(scales, g, &s, &m);
            k->sc[g] = s;
            k->m[g] = m;
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
    float acc = 0, macc = 0;
    if (!is_k(t)) {
        a8 a = a8_view(act, n);
        for (size_t b = 0; b < n / 32; b++) {
            int q[32];
            float dw, mw;
            levels32(t, wb + b * bb, q, &dw, &mw);
            int sum = 0;
            for (int j = 0; j < 32; j++) sum += q[j] * a.qs[32 * b + (size_t)j];
            acc += (dw * a.d[b]) * (float)sum;
            macc += mw * a.s[b];
        }
        return acc + macc;
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
        macc -= (k.dmin * a.d[b]) * (float)summ;
    }
    return acc + macc;
}

void llmem__qrows_ref(float *y, const void *act, const void *w, uint32_t wtype, size_t n, size_t d, size_t batch,
                      size_t r0, size_t r1)
{
    size_t rb = n / (is_k(wtype) ? 256 : 32) * block_bytes(wtype), ab = llmem__act_row_bytes(wtype, n);
    for (size_t r = r0; r < r1; r++)
        for (size_t b = 0; b < batch; b++)
            y[b * d + r] = llmem__qdot_ref(wtype, (const uint8_t *)w + r * rb, (const uint8_t *)act + b * ab, n);
}

/* ---- the AVX2 + FMA + F16C path ---------------------------------------------- */

#ifdef KQ_X86
#define KQ_TARGET __attribute__((target("avx2,fma,f16c")))
#define KQ_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))
#if defined(__clang__)
#define KQ_UNROLL _Pragma("unroll")
#else
#define KQ_UNROLL _Pragma("GCC unroll 8")
#endif
#define MAXB 4 /* activation rows per pass over a weight row */

KQ_INLINE float kq_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

KQ_INLINE float kq_h2f(uint16_t h) { return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h))); }

/* Σ of 4 adjacent products of signed x and y, as 8 int32 (|x| <= 127 or x = -128 with y != -128 only). */
KQ_INLINE __m256i mul_i8(__m256i x, __m256i y)
{
    __m256i ax = _mm256_sign_epi8(x, x), sy = _mm256_sign_epi8(y, x);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
}

/* The same with x unsigned (0..127). */
KQ_INLINE __m256i mul_u8(__m256i u, __m256i s)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
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

/* The 32 weight levels of a 32-element block as int8 (signed types) or
 * uint8 (q4_1, q5_1), and its scale and minimum. */
KQ_INLINE __m256i w_levels32(const uint32_t t, const uint8_t *blk, float *dw, float *mw)
{
    switch (t) {
    case LLMEM_DTYPE_Q8_0:
        *dw = kq_h2f(((const llmem__q8_0 *)(const void *)blk)->d);
        return _mm256_loadu_si256((const __m256i *)(const void *)(blk + 2));
    case LLMEM_DTYPE_Q4_0:
        *dw = kq_h2f(((const llmem__q4_0 *)(const void *)blk)->d);
        return _mm256_sub_epi8(nibbles16(blk + 2), _mm256_set1_epi8(8));
    case LLMEM_DTYPE_Q4_1:
        *dw = kq_h2f(((const llmem__q4_1 *)(const void *)blk)->d);
        *mw = kq_h2f(((const llmem__q4_1 *)(const void *)blk)->m);
        return nibbles16(blk + 4);
    case LLMEM_DTYPE_Q5_0: {
        *dw = kq_h2f(((const llmem__q5_0 *)(const void *)blk)->d);
        /* q | 0xF0 where bit 4 is clear is q - 16 as int8; q where it is set. */
        __m256i hb = _mm256_andnot_si256(bits32(blk + 2), _mm256_set1_epi8((char)0xF0));
        return _mm256_or_si256(nibbles16(blk + 6), hb);
    }
    default: { /* q5_1 */
        *dw = kq_h2f(((const llmem__q5_1 *)(const void *)blk)->d);
        *mw = kq_h2f(((const llmem__q5_1 *)(const void *)blk)->m);
        __m256i hb = _mm256_and_si256(bits32(blk + 4), _mm256_set1_epi8(16));
        return _mm256_or_si256(nibbles16(blk + 8), hb);
    }
    }
}

/* One weight row of a 32-element type against B activation rows. */
KQ_INLINE void dot32_rows(const uint32_t t, const int B, const uint8_t *w, const uint8_t *act, size_t astride,
                          size_t n, float *out)
{
    const size_t bb = t == LLMEM_DTYPE_Q8_0 ? 34 : t == LLMEM_DTYPE_Q4_0 ? 18 : t == LLMEM_DTYPE_Q4_1 ? 20
                    : t == LLMEM_DTYPE_Q5_0 ? 22 : 24;
    const bool with_min = t == LLMEM_DTYPE_Q4_1 || t == LLMEM_DTYPE_Q5_1;
    __m256 acc[MAXB];
    float macc[MAXB];
    a8 a[MAXB];
KQ_UNROLL
    for (int b = 0; b < B; b++) {
        acc[b] = _mm256_setzero_ps();
        macc[b] = 0;
        a[b] = a8_view(act + (size_t)b * astride, n);
    }
    for (size_t k = 0; k < n / 32; k++) {
        float dw, mw = 0;
        __m256i q = w_levels32(t, w + k * bb, &dw, &mw);
        __m256i aq = with_min ? q : _mm256_sign_epi8(q, q);
KQ_UNROLL
        for (int b = 0; b < B; b++) {
            __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(a[b].qs + 32 * k));
            __m256i p = with_min ? mul_u8(q, x)
                                 : _mm256_madd_epi16(_mm256_maddubs_epi16(aq, _mm256_sign_epi8(x, q)),
                                                     _mm256_set1_epi16(1));
            acc[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * a[b].d[k]), acc[b]);
            if (with_min) macc[b] += mw * a[b].s[k];
        }
    }
KQ_UNROLL
    for (int b = 0; b < B; b++) out[b] = kq_hsum(acc[b]) + macc[b];
}

/* Two int16 scales as a vector: s0 for lanes 0..7 (elements 0..15 of a
 * 32-chunk after maddubs), s1 for lanes 8..15. */
KQ_INLINE __m256i scales2(int s0, int s1)
{
    return _mm256_set_m128i(_mm_set1_epi16((short)s1), _mm_set1_epi16((short)s0));
}

/* Σ_g sc_g * bsum_g over the 16 groups of 16 (sc as int16 in a vector of 16). */
KQ_INLINE int bsum_dot16(const int16_t *bs, __m256i sc16)
{
    __m256i p = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(const void *)bs), sc16);
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* One weight row of a k-quant type against B activation rows. */
KQ_INLINE void dotk_rows(const uint32_t t, const int B, const uint8_t *w, const uint8_t *act, size_t astride,
                         size_t n, float *out)
{
    const size_t bb = t == LLMEM_DTYPE_Q2_K ? 84 : t == LLMEM_DTYPE_Q3_K ? 110 : t == LLMEM_DTYPE_Q4_K ? 144
                    : t == LLMEM_DTYPE_Q5_K ? 176 : 210;
    __m256 acc[MAXB];
    float macc[MAXB];
    a8k a[MAXB];
    const __m256i m3 = _mm256_set1_epi8(3), m15 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
KQ_UNROLL
    for (int b = 0; b < B; b++) {
        acc[b] = _mm256_setzero_ps();
        macc[b] = 0;
        a[b] = a8k_view(act + (size_t)b * astride, n);
    }
    for (size_t k = 0; k < n / 256; k++) {
        const uint8_t *blk = w + k * bb;
        __m256i sumi[MAXB];
        int summ[MAXB], soff[MAXB];
KQ_UNROLL
        for (int b = 0; b < B; b++) {
            sumi[b] = _mm256_setzero_si256();
            summ[b] = 0;
            soff[b] = 0;
        }
        float d, dmin = 0;
        if (t == LLMEM_DTYPE_Q4_K || t == LLMEM_DTYPE_Q5_K) {
            const bool five = t == LLMEM_DTYPE_Q5_K;
            const llmem__q4_k *b4 = (const void *)blk;
            const llmem__q5_k *b5 = (const void *)blk;
            const uint8_t *scales = five ? b5->scales : b4->scales, *qs = five ? b5->qs : b4->qs;
            d = kq_h2f(five ? b5->d : b4->d);
            dmin = kq_h2f(five ? b5->dmin : b4->dmin);
            uint8_t sc[8], mn[8];
KQ_UNROLL
            for (int g = 0; g < 8; g++) llmem__k4_scale_min(scales, g, &sc[g], &mn[g]);
            __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(const void *)b5->qh) : _mm256_setzero_si256();
KQ_UNROLL
            for (int c = 0; c < 4; c++) {
                __m256i raw = _mm256_loadu_si256((const __m256i *)(const void *)(qs + 32 * c));
                __m256i lo = _mm256_and_si256(raw, m15), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m15);
                if (five) {
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
                    hi = _mm256_or_si256(hi,
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
                }
                __m256i slo = _mm256_set1_epi16((short)sc[2 * c]), shi = _mm256_set1_epi16((short)sc[2 * c + 1]);
KQ_UNROLL
                for (int b = 0; b < B; b++) {
                    const int8_t *x = a[b].qs + 256 * k + 64 * c;
                    __m256i x0 = _mm256_loadu_si256((const __m256i *)(const void *)x);
                    __m256i x1 = _mm256_loadu_si256((const __m256i *)(const void *)(x + 32));
                    __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), slo);
                    __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), shi);
                    sumi[b] = _mm256_add_epi32(sumi[b], _mm256_add_epi32(p0, p1));
                }
            }
            short mn16[16];
KQ_UNROLL
            for (int g = 0; g < 16; g++) mn16[g] = mn[g / 2];
            __m256i mv = _mm256_loadu_si256((const __m256i *)(const void *)mn16);
KQ_UNROLL
            for (int b = 0; b < B; b++) summ[b] = bsum_dot16(a[b].bs + 16 * k, mv);
        } else if (t == LLMEM_DTYPE_Q6_K) {
            const llmem__q6_k *b6 = (const void *)blk;
            d = kq_h2f(b6->d);
            __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)b6->scales));
KQ_UNROLL
            for (int h = 0; h < 2; h++) {
                __m256i l0 = _mm256_loadu_si256((const __m256i *)(const void *)(b6->ql + 64 * h));
                __m256i l1 = _mm256_loadu_si256((const __m256i *)(const void *)(b6->ql + 64 * h + 32));
                __m256i qh = _mm256_loadu_si256((const __m256i *)(const void *)(b6->qh + 32 * h));
                __m256i q[4];
                q[0] = _mm256_or_si256(_mm256_and_si256(l0, m15), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
                q[1] = _mm256_or_si256(_mm256_and_si256(l1, m15),
                                       _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
                q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m15),
                                       _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
                q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m15),
                                       _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
KQ_UNROLL
                for (int kk = 0; kk < 4; kk++) {
                    int g = 8 * h + 2 * kk;
                    __m256i s = scales2(b6->scales[g], b6->scales[g + 1]);
KQ_UNROLL
                    for (int b = 0; b < B; b++) {
                        __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(a[b].qs + 256 * k + 128 * h + 32 * kk));
                        sumi[b] = _mm256_add_epi32(sumi[b], _mm256_madd_epi16(_mm256_maddubs_epi16(q[kk], x), s));
                    }
                }
            }
KQ_UNROLL
            for (int b = 0; b < B; b++) soff[b] = 32 * bsum_dot16(a[b].bs + 16 * k, sc16);
        } else if (t == LLMEM_DTYPE_Q3_K) {
            const llmem__q3_k *b3 = (const void *)blk;
            d = kq_h2f(b3->d);
            uint8_t su[16];
            llmem__k3_scales(b3->scales, su);
            short s16[16];
KQ_UNROLL
            for (int g = 0; g < 16; g++) s16[g] = (short)(su[g] - 32);
            __m256i sc16 = _mm256_loadu_si256((const __m256i *)(const void *)s16);
            __m256i hm = _mm256_loadu_si256((const __m256i *)(const void *)b3->hmask);
KQ_UNROLL
            for (int h = 0; h < 2; h++) {
                __m256i raw = _mm256_loadu_si256((const __m256i *)(const void *)(b3->qs + 32 * h));
KQ_UNROLL
                for (int j = 0; j < 4; j++) {
                    __m256i q = _mm256_and_si256(_mm256_srli_epi16(raw, 2 * j), m3);
                    q = _mm256_or_si256(q, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + j), one), 2));
                    int g = 8 * h + 2 * j;
                    __m256i s = scales2(s16[g], s16[g + 1]);
KQ_UNROLL
                    for (int b = 0; b < B; b++) {
                        __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(a[b].qs + 256 * k + 128 * h + 32 * j));
                        sumi[b] = _mm256_add_epi32(sumi[b], _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), s));
                    }
                }
            }
KQ_UNROLL
            for (int b = 0; b < B; b++) soff[b] = 4 * bsum_dot16(a[b].bs + 16 * k, sc16);
        } else { /* q2_k */
            const llmem__q2_k *b2 = (const void *)blk;
            d = kq_h2f(b2->d);
            dmin = kq_h2f(b2->dmin);
            __m128i sb = _mm_loadu_si128((const __m128i *)(const void *)b2->scales);
            __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sb, _mm_set1_epi8(15)));
            __m256i mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sb, 4), _mm_set1_epi8(15)));
KQ_UNROLL
            for (int h = 0; h < 2; h++) {
                __m256i raw = _mm256_loadu_si256((const __m256i *)(const void *)(b2->qs + 32 * h));
KQ_UNROLL
                for (int j = 0; j < 4; j++) {
                    __m256i q = _mm256_and_si256(_mm256_srli_epi16(raw, 2 * j), m3);
                    int g = 8 * h + 2 * j;
                    __m256i s = scales2(b2->scales[g] & 15, b2->scales[g + 1] & 15);
KQ_UNROLL
                    for (int b = 0; b < B; b++) {
                        __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(a[b].qs + 256 * k + 128 * h + 32 * j));
                        sumi[b] = _mm256_add_epi32(sumi[b], _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), s));
                    }
                }
            }
            (void)sc16;
KQ_UNROLL
            for (int b = 0; b < B; b++) summ[b] = bsum_dot16(a[b].bs + 16 * k, mn16);
        }
KQ_UNROLL
        for (int b = 0; b < B; b++) {
            __m256i si = soff[b] ? _mm256_sub_epi32(sumi[b], _mm256_setr_epi32(soff[b], 0, 0, 0, 0, 0, 0, 0)) : sumi[b];
            float da = a[b].d[k];
            acc[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_set1_ps(d * da), acc[b]);
            if (summ[b]) macc[b] -= (dmin * da) * (float)summ[b];
        }
    }
KQ_UNROLL
    for (int b = 0; b < B; b++) out[b] = kq_hsum(acc[b]) + macc[b];
}

KQ_INLINE void qrows_t(const uint32_t t, float *y, const uint8_t *act, const uint8_t *w, size_t n, size_t d,
                       size_t batch, size_t r0, size_t r1)
{
    const bool k = is_k(t);
    size_t rb = n / (k ? 256 : 32) * block_bytes(t), ab = llmem__act_row_bytes(t, n);
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *wr = w + r * rb;
        size_t b = 0;
        float out[MAXB];
        for (; b + MAXB <= batch; b += MAXB) {
            if (k) dotk_rows(t, MAXB, wr, act + b * ab, ab, n, out);
            else dot32_rows(t, MAXB, wr, act + b * ab, ab, n, out);
            for (int i = 0; i < MAXB; i++) y[(b + (size_t)i) * d + r] = out[i];
        }
        for (; b < batch; b++) {
            if (k) dotk_rows(t, 1, wr, act + b * ab, ab, n, out);
            else dot32_rows(t, 1, wr, act + b * ab, ab, n, out);
            y[b * d + r] = out[0];
        }
    }
}

KQ_TARGET void llmem__qrows_avx2(float *y, const void *act, const void *w, uint32_t wtype, size_t n, size_t d,
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

/* Activation rows, vectorised; the same values as the reference (the
 * same float operations per element: amax, 127 / amax, x * that rounded
 * half to even, amax / 127). */
KQ_TARGET void llmem__act_quantize_avx2(uint32_t wtype, const float *x, size_t n, void *row)
{
    if (is_k(wtype)) { /* per 256: few enough that the reference's cost is small next to the matmul */
        llmem__act_quantize_ref(wtype, x, n, row);
        return;
    }
    uint8_t *p = row;
    int8_t *qs = (int8_t *)p;
    float *dd = (float *)(p + n), *ss = dd + n / 32;
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
        dd[b] = kq_h2f((uint16_t)_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(db), _MM_FROUND_TO_NEAREST_INT), 0));
        ss[b] = kq_h2f((uint16_t)_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(db * (float)sum), _MM_FROUND_TO_NEAREST_INT), 0));
    }
}
#else
void llmem__qrows_avx2(float *y, const void *act, const void *w, uint32_t wtype, size_t n, size_t d, size_t batch,
                       size_t r0, size_t r1)
{
    llmem__qrows_ref(y, act, w, wtype, n, d, batch, r0, r1);
}

void llmem__act_quantize_avx2(uint32_t wtype, const float *x, size_t n, void *row)
{
    llmem__act_quantize_ref(wtype, x, n, row);
}
#endif
