/*
 * quant.c - rows of f32 to the GGUF block types and back (llmem/quant.h).
 *
 * Decoding is the format's definition, evaluated in one fixed order per
 * element (the scale product first, then times the integer value, then the
 * minimum subtracted), so it is bitwise what llama.cpp's to_float gives:
 * the oracle test checks that block by block.
 *
 * Encoding is ours. The 32-element types take the textbook scale per block:
 * symmetric types map the value of largest magnitude to the most negative
 * level (q4_0: -8, q5_0: -16; that extreme is then exact) and round the rest;
 * types with a minimum spread [min, max] over the levels; q8_0 uses
 * amax / 127. The k-quants fit each group (16 or 32 elements) by a short
 * search: a dozen candidate inverse scales around the obvious one, each
 * rounding the group and then refitting scale (and minimum) by least
 * squares to the rounded levels; the fit with the least squared error
 * wins. The group scales (and minima) are then quantised to the format's
 * 4, 6 or 8 bits against the super-block's f16 d (and dmin), and the
 * values are rounded once more against those final scales, so the stored
 * levels are the best for the scales actually stored.
 *
 * Invariants: an all-zero input encodes to zero scales and decodes to
 * zeros; encoding never reads or writes past n elements / the row's bytes;
 * nothing allocates (group buffers are on the stack).
 */
#include <ctype.h>
#include <math.h>
#include <string.h>

#include "llmem/quant.h"
#include "half.h"
#include "model_internal.h"
#include "quant_internal.h"

static inline float h2f(uint16_t h) { return llmem__f16_to_f32(h); }
static inline uint16_t f2h(float f) { return llmem__f32_to_f16(f); }

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Round half away from zero, as a C int (|v| is small here). */
static inline int rnd(float v) { return (int)lroundf(v); }

uint32_t llmem_dtype_block_size(uint32_t type) { return llmem__dtype_block(type); }

bool llmem_dtype_is_quantizable(uint32_t type) { return llmem__dtype_block(type) != 0; }

uint32_t llmem_quant_row_type(uint32_t want, uint64_t n)
{
    uint32_t block = llmem__dtype_block(want);
    if (!block || n % block == 0) return want;
    uint32_t alt;
    switch (want) {
    case LLMEM_DTYPE_Q2_K: case LLMEM_DTYPE_Q3_K: alt = LLMEM_DTYPE_Q4_0; break;
    case LLMEM_DTYPE_Q4_K: alt = LLMEM_DTYPE_Q5_0; break;
    case LLMEM_DTYPE_Q5_K: alt = LLMEM_DTYPE_Q5_1; break;
    case LLMEM_DTYPE_Q6_K: alt = LLMEM_DTYPE_Q8_0; break;
    default: alt = LLMEM_DTYPE_F16; break;
    }
    return n % llmem__dtype_block(alt) == 0 ? alt : LLMEM_DTYPE_F16;
}

llmem_status llmem_dtype_parse(const char *name, uint32_t *out)
{
    if (!name || !out) return llmem__fail(LLMEM_EINVAL, "dtype: null argument");
    char low[16];
    size_t n = strlen(name);
    if (n >= sizeof low) return llmem__fail(LLMEM_EINVAL, "dtype: unknown type '%s'", name);
    for (size_t i = 0; i <= n; i++) low[i] = (char)tolower((unsigned char)name[i]);
    /* llama.cpp's mixes name the main type; llmem writes it throughout. */
    if (n == 6 && low[0] == 'q' && low[2] == '_' && low[3] == 'k' && low[4] == '_' && (low[5] == 'm' || low[5] == 's'))
        low[4] = 0;
    static const uint32_t all[] = {LLMEM_DTYPE_F32,  LLMEM_DTYPE_F16,  LLMEM_DTYPE_BF16, LLMEM_DTYPE_Q4_0,
                                   LLMEM_DTYPE_Q4_1, LLMEM_DTYPE_Q5_0, LLMEM_DTYPE_Q5_1, LLMEM_DTYPE_Q8_0,
                                   LLMEM_DTYPE_Q2_K, LLMEM_DTYPE_Q3_K, LLMEM_DTYPE_Q4_K, LLMEM_DTYPE_Q5_K,
                                   LLMEM_DTYPE_Q6_K};
    for (size_t i = 0; i < LLMEM_ARRAY_LEN(all); i++)
        if (!strcmp(low, llmem_dtype_name(all[i]))) {
            *out = all[i];
            return LLMEM_OK;
        }
    return llmem__fail(LLMEM_EINVAL, "dtype: unknown type '%s' (f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, "
                       "q2_k, q3_k, q4_k, q5_k, q6_k)", name);
}

/* ---- decoding ------------------------------------------------------------ */

static void dq_q4_0(const llmem__q4_0 *b, float *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, y += 32) {
        float d = h2f(b[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((b[i].qs[j] & 15) - 8) * d;
            y[j + 16] = (float)((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void dq_q4_1(const llmem__q4_1 *b, float *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, y += 32) {
        float d = h2f(b[i].d), m = h2f(b[i].m);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(b[i].qs[j] & 15) * d + m;
            y[j + 16] = (float)(b[i].qs[j] >> 4) * d + m;
        }
    }
}

static inline uint32_t ld_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static void dq_q5_0(const llmem__q5_0 *b, float *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, y += 32) {
        float d = h2f(b[i].d);
        uint32_t qh = ld_u32(b[i].qh);
        for (int j = 0; j < 16; j++) {
            int lo = (b[i].qs[j] & 15) | (int)(((qh >> j) & 1) << 4);
            int hi = (b[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            y[j] = (float)(lo - 16) * d;
            y[j + 16] = (float)(hi - 16) * d;
        }
    }
}

static void dq_q5_1(const llmem__q5_1 *b, float *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, y += 32) {
        float d = h2f(b[i].d), m = h2f(b[i].m);
        uint32_t qh = ld_u32(b[i].qh);
        for (int j = 0; j < 16; j++) {
            int lo = (b[i].qs[j] & 15) | (int)(((qh >> j) & 1) << 4);
            int hi = (b[i].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            y[j] = (float)lo * d + m;
            y[j + 16] = (float)hi * d + m;
        }
    }
}

static void dq_q8_0(const llmem__q8_0 *b, float *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, y += 32) {
        float d = h2f(b[i].d);
        for (int j = 0; j < 32; j++) y[j] = (float)b[i].qs[j] * d;
    }
}

static void dq_q2_k(const llmem__q2_k *b, float *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, y += 256) {
        float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        for (int e = 0; e < 256; e++) {
            int h = e / 128, j = (e % 128) / 32, l = e % 32;
            int q = (b[i].qs[32 * h + l] >> (2 * j)) & 3;
            uint8_t s = b[i].scales[e / 16];
            float dl = d * (float)(s & 15), ml = dmin * (float)(s >> 4);
            y[e] = dl * (float)q - ml;
        }
    }
}

static void dq_q3_k(const llmem__q3_k *b, float *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, y += 256) {
        float d = h2f(b[i].d);
        uint8_t sc[16];
        llmem__k3_scales(b[i].scales, sc);
        for (int e = 0; e < 256; e++) {
            int h = e / 128, j = (e % 128) / 32, l = e % 32;
            int q = (b[i].qs[32 * h + l] >> (2 * j)) & 3;
            int hb = (b[i].hmask[l] >> (4 * h + j)) & 1;
            float dl = d * (float)(sc[e / 16] - 32);
            y[e] = dl * (float)(q - (hb ? 0 : 4));
        }
    }
}

/* q4_k and q5_k (qh: the fifth bits, NULL for q4_k): one super-block. */
static void dq_k45(uint16_t dh, uint16_t mh, const uint8_t *scales, const uint8_t *qs, const uint8_t *qh, float *y)
{
    float d = h2f(dh), dmin = h2f(mh);
    uint8_t sc[8], m[8];
    llmem__k4_scales_mins(scales, sc, m);
    for (int g = 0; g < 8; g++) {
        float d1 = d * (float)sc[g], m1 = dmin * (float)m[g];
        const uint8_t *q = qs + 32 * (g / 2);
        int shift = 4 * (g % 2);
        for (int l = 0; l < 32; l++) {
            int v = (q[l] >> shift) & 15;
            if (qh) v |= ((qh[l] >> g) & 1) << 4;
            y[32 * g + l] = d1 * (float)v - m1;
        }
    }
}

static void dq_q4_k(const llmem__q4_k *b, float *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, y += 256) dq_k45(b[i].d, b[i].dmin, b[i].scales, b[i].qs, NULL, y);
}

static void dq_q5_k(const llmem__q5_k *b, float *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, y += 256) dq_k45(b[i].d, b[i].dmin, b[i].scales, b[i].qs, b[i].qh, y);
}

static void dq_q6_k(const llmem__q6_k *b, float *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, y += 256) {
        float d = h2f(b[i].d);
        for (int e = 0; e < 256; e++) {
            int h = e / 128, k = (e % 128) / 32, l = e % 32;
            int lo = (b[i].ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 15;
            int hi = (b[i].qh[32 * h + l] >> (2 * k)) & 3;
            y[e] = d * (float)b[i].scales[e / 16] * (float)((lo | (hi << 4)) - 32);
        }
    }
}

static inline float bf16_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

llmem_status llmem_dequantize_row(uint32_t type, const void *src, float *dst, size_t n)
{
    uint32_t block = llmem__dtype_block(type);
    if (!block || n % block) return llmem__fail(LLMEM_EINVAL, "dequantize: %zu elements of type %u", n, type);
    if (n && (!src || !dst)) return llmem__fail(LLMEM_EINVAL, "dequantize: null buffer");
    size_t nb = n / block;
    switch (type) {
    case LLMEM_DTYPE_F32: memcpy(dst, src, n * sizeof(float)); break;
    case LLMEM_DTYPE_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, (const uint8_t *)src + 2 * i, 2);
            dst[i] = h2f(h);
        }
        break;
    case LLMEM_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, (const uint8_t *)src + 2 * i, 2);
            dst[i] = bf16_f32(h);
        }
        break;
    case LLMEM_DTYPE_Q4_0: dq_q4_0(src, dst, nb); break;
    case LLMEM_DTYPE_Q4_1: dq_q4_1(src, dst, nb); break;
    case LLMEM_DTYPE_Q5_0: dq_q5_0(src, dst, nb); break;
    case LLMEM_DTYPE_Q5_1: dq_q5_1(src, dst, nb); break;
    case LLMEM_DTYPE_Q8_0: dq_q8_0(src, dst, nb); break;
    case LLMEM_DTYPE_Q2_K: dq_q2_k(src, dst, nb); break;
    case LLMEM_DTYPE_Q3_K: dq_q3_k(src, dst, nb); break;
    case LLMEM_DTYPE_Q4_K: dq_q4_k(src, dst, nb); break;
    case LLMEM_DTYPE_Q5_K: dq_q5_k(src, dst, nb); break;
    case LLMEM_DTYPE_Q6_K: dq_q6_k(src, dst, nb); break;
    default: return llmem__fail(LLMEM_EINVAL, "dequantize: type %u", type);
    }
    return LLMEM_OK;
}

/* ---- encoding: the 32-element types ------------------------------------- */

/* The value of largest magnitude (the first of equals), signed. */
static float signed_max(const float *x, int n)
{
    float amax = 0, mx = 0;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            mx = x[j];
        }
    return mx;
}

static void minmax(const float *x, int n, float *lo, float *hi)
{
    *lo = *hi = x[0];
    for (int j = 1; j < n; j++) {
        if (x[j] < *lo) *lo = x[j];
        if (x[j] > *hi) *hi = x[j];
    }
}

static void qz_q4_0(const float *x, llmem__q4_0 *b, size_t nb)
{
    for (size_t i = 0; i < nb; i++, x += 32) {
        float d = signed_max(x, 32) / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
        b[i].d = f2h(d);
        for (int j = 0; j < 16; j++) {
            int lo = clampi(rnd(x[j] * id) + 8, 0, 15), hi = clampi(rnd(x[j + 16] * id) + 8, 0, 15);
            b[i].qs[j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

static void qz_q4_1(const float *x, llmem__q4_1 *b, size_t nb)
{
    for (size_t i = 0; i < nb; i++, x += 32) {
        float lo, hi;
        minmax(x, 32, &lo, &hi);
        float d = (hi - lo) / 15.0f, id = d != 0 ? 1.0f / d : 0.0f;
        b[i].d = f2h(d);
        b[i].m = f2h(lo);
        for (int j = 0; j < 16; j++) {
            int a = clampi(rnd((x[j] - lo) * id), 0, 15), c = clampi(rnd((x[j + 16] - lo) * id), 0, 15);
            b[i].qs[j] = (uint8_t)(a | (c << 4));
        }
    }
}

static void put_q5(const int *q, uint8_t qs[16], uint8_t qh[4])
{
    uint32_t h = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 15) | ((q[j + 16] & 15) << 4));
        h |= (uint32_t)((q[j] >> 4) & 1) << j;
        h |= (uint32_t)((q[j + 16] >> 4) & 1) << (j + 16);
    }
    memcpy(qh, &h, 4);
}

static void qz_q5_0(const float *x, llmem__q5_0 *b, size_t nb)
{
    for (size_t i = 0; i < nb; i++, x += 32) {
        float d = signed_max(x, 32) / -16.0f, id = d != 0 ? 1.0f / d : 0.0f;
        b[i].d = f2h(d);
        int q[32];
        for (int j = 0; j < 32; j++) q[j] = clampi(rnd(x[j] * id) + 16, 0, 31);
        put_q5(q, b[i].qs, b[i].qh);
    }
}

static void qz_q5_1(const float *x, llmem__q5_1 *b, size_t nb)
{
    for (size_t i = 0; i < nb; i++, x += 32) {
        float lo, hi;
        minmax(x, 32, &lo, &hi);
        float d = (hi - lo) / 31.0f, id = d != 0 ? 1.0f / d : 0.0f;
        b[i].d = f2h(d);
        b[i].m = f2h(lo);
        int q[32];
        for (int j = 0; j < 32; j++) q[j] = clampi(rnd((x[j] - lo) * id), 0, 31);
        put_q5(q, b[i].qs, b[i].qh);
    }
}

static void qz_q8_0(const float *x, llmem__q8_0 *b, size_t nb)
{
    for (size_t i = 0; i < nb; i++, x += 32) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        b[i].d = f2h(d);
        for (int j = 0; j < 32; j++) b[i].qs[j] = (int8_t)clampi(rnd(x[j] * id), -127, 127);
    }
}

/* ---- encoding: k-quant groups -------------------------------------------- */

#define SEARCH 12 /* candidate scales per group, besides the plain one */

/* x[0..n) ~ s * q + m with q in 0..nmax and m <= 0 (the formats store -m
 * as a non-negative minimum): the least-squares fit over the candidates. */
static void fit_asym(const float *x, int n, int nmax, float *s_out, float *m_out)
{
    float lo, hi;
    minmax(x, n, &lo, &hi);
    if (lo > 0) lo = 0;
    if (hi <= lo) {
        *s_out = 0;
        *m_out = lo;
        return;
    }
    float best_s = (hi - lo) / (float)nmax, best_m = lo, best_err = INFINITY;
    for (int k = -1; k < SEARCH; k++) {
        float iscale = k < 0 ? (float)nmax / (hi - lo) : ((float)nmax + 0.1f * (float)(k - SEARCH / 2)) / (hi - lo);
        if (!(iscale > 0)) continue;
        double sq = 0, sqq = 0, sx = 0, sqx = 0;
        int q[32];
        for (int j = 0; j < n; j++) {
            q[j] = clampi(rnd((x[j] - lo) * iscale), 0, nmax);
            sq += q[j];
            sqq += (double)q[j] * q[j];
            sx += x[j];
            sqx += (double)q[j] * x[j];
        }
        double den = n * sqq - sq * sq, s, m;
        if (den > 0) {
            s = (n * sqx - sq * sx) / den;
            m = (sqq * sx - sq * sqx) / den;
        } else {
            s = 1.0 / iscale;
            m = lo;
        }
        if (m > 0) { /* the format cannot add: refit the scale alone */
            m = 0;
            s = sqq > 0 ? sqx / sqq : 0;
        }
        if (s < 0) s = 0;
        double err = 0;
        for (int j = 0; j < n; j++) {
            double e = s * q[j] + m - x[j];
            err += e * e;
        }
        if (err < best_err) {
            best_err = (float)err;
            best_s = (float)s;
            best_m = (float)m;
        }
    }
    *s_out = best_s;
    *m_out = best_m;
}

/* x[0..n) ~ s * q with q in -lev..lev-1: the least-squares fit over the
 * candidates (s may be negative: the extreme then lands on -lev). */
static float fit_sym(const float *x, int n, int lev)
{
    float mx = signed_max(x, n);
    if (mx == 0) return 0;
    float best_s = mx / (float)-lev, best_err = INFINITY;
    for (int k = -1; k < SEARCH; k++) {
        float iscale = k < 0 ? (float)-lev / mx : -((float)lev + 0.1f * (float)(k - SEARCH / 2)) / mx;
        double sqq = 0, sqx = 0;
        int q[32];
        for (int j = 0; j < n; j++) {
            q[j] = clampi(rnd(x[j] * iscale), -lev, lev - 1);
            sqq += (double)q[j] * q[j];
            sqx += (double)q[j] * x[j];
        }
        if (sqq <= 0) continue;
        double s = sqx / sqq, err = 0;
        for (int j = 0; j < n; j++) {
            double e = s * q[j] - x[j];
            err += e * e;
        }
        if (err < best_err) {
            best_err = (float)err;
            best_s = (float)s;
        }
    }
    return best_s;
}

/* Group scales s[0..ng) >= 0 to bits-bit integers against an f16 d: d is
 * written, the integers to out. */
static uint16_t quant_scales_u(const float *s, int ng, int maxq, uint8_t *out)
{
    float mx = 0;
    for (int g = 0; g < ng; g++) mx = fmaxf(mx, s[g]);
    uint16_t dh = f2h(mx / (float)maxq);
    float d = h2f(dh);
    for (int g = 0; g < ng; g++) out[g] = (uint8_t)(d > 0 ? clampi(rnd(s[g] / d), 0, maxq) : 0);
    return dh;
}

/* Round x against the final scale and minimum: q in 0..nmax. */
static inline int requant_asym(float x, float scale, float min, int nmax)
{
    return scale > 0 ? clampi(rnd((x + min) / scale), 0, nmax) : 0;
}

static void qz_q2_k(const float *x, llmem__q2_k *b, size_t nb)
{
    for (size_t i = 0; i < nb; i++, x += 256) {
        float s[16], m[16];
        uint8_t sq[16], mq[16];
        for (int g = 0; g < 16; g++) {
            fit_asym(x + 16 * g, 16, 3, &s[g], &m[g]);
            m[g] = -m[g];
        }
        b[i].d = quant_scales_u(s, 16, 15, sq);
        b[i].dmin = quant_scales_u(m, 16, 15, mq);
        float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        memset(b[i].qs, 0, sizeof b[i].qs);
        for (int g = 0; g < 16; g++) b[i].scales[g] = (uint8_t)(sq[g] | (mq[g] << 4));
        for (int e = 0; e < 256; e++) {
            int g = e / 16, h = e / 128, j = (e % 128) / 32, l = e % 32;
            int q = requant_asym(x[e], d * (float)sq[g], dmin * (float)mq[g], 3);
            b[i].qs[32 * h + l] |= (uint8_t)(q << (2 * j));
        }
    }
}

static void qz_q3_k(const float *x, llmem__q3_k *b, size_t nb)
{
    for (size_t i = 0; i < nb; i++, x += 256) {
        float s[16], amax = 0, smax = 0;
        for (int g = 0; g < 16; g++) {
            s[g] = fit_sym(x + 16 * g, 16, 4);
            if (fabsf(s[g]) > amax) {
                amax = fabsf(s[g]);
                smax = s[g];
            }
        }
        /* 6-bit signed scales, -32..31: the largest maps to -32. */
        b[i].d = f2h(smax / -32.0f);
        float d = h2f(b[i].d);
        int sc[16];
        for (int g = 0; g < 16; g++) sc[g] = d != 0 ? clampi(rnd(s[g] / d), -32, 31) : 0;
        memset(b[i].scales, 0, sizeof b[i].scales);
        memset(b[i].qs, 0, sizeof b[i].qs);
        memset(b[i].hmask, 0, sizeof b[i].hmask);
        for (int g = 0; g < 16; g++) {
            int u = sc[g] + 32;
            b[i].scales[g % 8] |= (uint8_t)((u & 15) << (4 * (g / 8)));
            b[i].scales[8 + g % 4] |= (uint8_t)((u >> 4) << (2 * (g / 4)));
        }
        for (int e = 0; e < 256; e++) {
            int g = e / 16, h = e / 128, j = (e % 128) / 32, l = e % 32;
            float dl = d * (float)sc[g];
            int q = dl != 0 ? clampi(rnd(x[e] / dl), -4, 3) + 4 : 4;
            b[i].qs[32 * h + l] |= (uint8_t)((q & 3) << (2 * j));
            if (q & 4) b[i].hmask[l] |= (uint8_t)(1u << (4 * h + j));
        }
    }
}

/* The 6-bit scales and mins of q4_k / q5_k into the 12 bytes. */
static void put_k4_scales(const uint8_t *sc, const uint8_t *m, uint8_t s[12])
{
    for (int g = 0; g < 4; g++) {
        s[g] = (uint8_t)(sc[g] | ((sc[g + 4] >> 4) << 6));
        s[g + 4] = (uint8_t)(m[g] | ((m[g + 4] >> 4) << 6));
        s[g + 8] = (uint8_t)((sc[g + 4] & 15) | ((m[g + 4] & 15) << 4));
    }
}

/* q4_k (nmax 15) and q5_k (nmax 31): the levels of one super-block. */
static void k45_levels(const float *x, int nmax, uint16_t *dh, uint16_t *dminh, uint8_t scales[12], int q[256])
{
    float s[8], m[8];
    uint8_t sq[8], mq[8];
    for (int g = 0; g < 8; g++) {
        fit_asym(x + 32 * g, 32, nmax, &s[g], &m[g]);
        m[g] = -m[g];
    }
    *dh = quant_scales_u(s, 8, 63, sq);
    *dminh = quant_scales_u(m, 8, 63, mq);
    put_k4_scales(sq, mq, scales);
    float d = h2f(*dh), dmin = h2f(*dminh);
    for (int e = 0; e < 256; e++) q[e] = requant_asym(x[e], d * (float)sq[e / 32], dmin * (float)mq[e / 32], nmax);
}

static void qz_q4_k(const float *x, llmem__q4_k *b, size_t nb)
{
    for (size_t i = 0; i < nb; i++, x += 256) {
        int q[256];
        k45_levels(x, 15, &b[i].d, &b[i].dmin, b[i].scales, q);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) b[i].qs[32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
    }
}

static void qz_q5_k(const float *x, llmem__q5_k *b, size_t nb)
{
    for (size_t i = 0; i < nb; i++, x += 256) {
        int q[256];
        k45_levels(x, 31, &b[i].d, &b[i].dmin, b[i].scales, q);
        memset(b[i].qh, 0, sizeof b[i].qh);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                int a = q[64 * c + l], h = q[64 * c + 32 + l];
                b[i].qs[32 * c + l] = (uint8_t)((a & 15) | ((h & 15) << 4));
                b[i].qh[l] |= (uint8_t)(((a >> 4) << (2 * c)) | ((h >> 4) << (2 * c + 1)));
            }
    }
}

static void qz_q6_k(const float *x, llmem__q6_k *b, size_t nb)
{
    for (size_t i = 0; i < nb; i++, x += 256) {
        float s[16], amax = 0, smax = 0;
        for (int g = 0; g < 16; g++) {
            s[g] = fit_sym(x + 16 * g, 16, 32);
            if (fabsf(s[g]) > amax) {
                amax = fabsf(s[g]);
                smax = s[g];
            }
        }
        b[i].d = f2h(smax / -128.0f);
        float d = h2f(b[i].d);
        for (int g = 0; g < 16; g++) b[i].scales[g] = (int8_t)(d != 0 ? clampi(rnd(s[g] / d), -128, 127) : 0);
        memset(b[i].ql, 0, sizeof b[i].ql);
        memset(b[i].qh, 0, sizeof b[i].qh);
        for (int e = 0; e < 256; e++) {
            int h = e / 128, k = (e % 128) / 32, l = e % 32;
            float dl = d * (float)b[i].scales[e / 16];
            int q = dl != 0 ? clampi(rnd(x[e] / dl), -32, 31) + 32 : 32;
            b[i].ql[64 * h + 32 * (k % 2) + l] |= (uint8_t)((q & 15) << (4 * (k / 2)));
            b[i].qh[32 * h + l] |= (uint8_t)((q >> 4) << (2 * k));
        }
    }
}

llmem_status llmem_quantize_row(uint32_t type, const float *src, void *dst, size_t n)
{
    uint32_t block = llmem__dtype_block(type);
    if (!block || n % block) return llmem__fail(LLMEM_EINVAL, "quantize: %zu elements of type %u", n, type);
    if (n && (!src || !dst)) return llmem__fail(LLMEM_EINVAL, "quantize: null buffer");
    for (size_t i = 0; i < n; i++)
        if (!isfinite(src[i])) return llmem__fail(LLMEM_ERANGE, "quantize: element %zu is not finite", i);
    size_t nb = n / block;
    uint8_t *o = dst;
    switch (type) {
    case LLMEM_DTYPE_F32: memcpy(dst, src, n * sizeof(float)); break;
    case LLMEM_DTYPE_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = f2h(src[i]);
            memcpy(o + 2 * i, &h, 2);
        }
        break;
    case LLMEM_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &src[i], 4);
            uint16_t h = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16); /* nearest even */
            memcpy(o + 2 * i, &h, 2);
        }
        break;
    case LLMEM_DTYPE_Q4_0: qz_q4_0(src, dst, nb); break;
    case LLMEM_DTYPE_Q4_1: qz_q4_1(src, dst, nb); break;
    case LLMEM_DTYPE_Q5_0: qz_q5_0(src, dst, nb); break;
    case LLMEM_DTYPE_Q5_1: qz_q5_1(src, dst, nb); break;
    case LLMEM_DTYPE_Q8_0: qz_q8_0(src, dst, nb); break;
    case LLMEM_DTYPE_Q2_K: qz_q2_k(src, dst, nb); break;
    case LLMEM_DTYPE_Q3_K: qz_q3_k(src, dst, nb); break;
    case LLMEM_DTYPE_Q4_K: qz_q4_k(src, dst, nb); break;
    case LLMEM_DTYPE_Q5_K: qz_q5_k(src, dst, nb); break;
    case LLMEM_DTYPE_Q6_K: qz_q6_k(src, dst, nb); break;
    default: return llmem__fail(LLMEM_EINVAL, "quantize: type %u", type);
    }
    return LLMEM_OK;
}
