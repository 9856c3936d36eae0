/*
 * kernels_q4k_x8.c - the 8-row interleaved q4_K, q5_0 and q8_0 layouts
 * (kernels_q4k_x8.h): the repacks and the scalar references over them.
 * Each reference reads a row's block back to the source type's values and
 * sums as llmem__qdot_ref does, so it gives that function's bits.
 */
#include "kernels_q4k_x8.h"

#include <string.h>

#include "llmem/model.h"

#include "../core/half.h"
#include "../model/quant_internal.h"
#include "kernels_q.h"
#include "kernels_q_layout.h"

#define QK 256
#define QB sizeof(llmem__q4_k)

size_t llmem__q4k_x8_bytes(size_t n, size_t d)
{
    const size_t nb = n / QK;
    return d / 8 * nb * LLMEM__X8_BLOCK + d % 8 * nb * QB;
}

void llmem__q4k_x8_pack(void *dst, const void *src, size_t n, size_t d)
{
    const size_t nb = n / QK, rb = nb * QB;
    const uint8_t *s = src;
    uint8_t *o = dst;
    for (size_t g = 0; g < d / 8; g++)
        for (size_t k = 0; k < nb; k++, o += LLMEM__X8_BLOCK) {
            uint8_t *qs = o, *sc = o + 1024, *mn = o + 1088;
            uint16_t *dd = (uint16_t *)(void *)(o + 1152);
            for (size_t i = 0; i < 8; i++) {
                const llmem__q4_k *b = (const void *)(s + (8 * g + i) * rb + k * QB);
                for (size_t p = 0; p < 4; p++)
                    for (size_t j = 0; j < 8; j++) memcpy(qs + ((p * 8 + j) * 8 + i) * 4, b->qs + 32 * p + 4 * j, 4);
                uint8_t s8[8], m8[8];
                llmem__k4_scales_mins(b->scales, s8, m8);
                for (size_t q = 0; q < 8; q++) {
                    sc[q * 8 + i] = s8[q];
                    mn[(q / 2) * 16 + i * 2 + q % 2] = m8[q];
                }
                dd[i] = b->d;
                dd[8 + i] = b->dmin;
            }
        }
    memcpy(o, s + d / 8 * 8 * rb, d % 8 * rb);
}

/* Row i (< 8) of block blk: its levels (element order), scales, mins, d, dmin. */
static void x8_read(const uint8_t *blk, size_t i, int q[256], int sc[8], int mn[8], float *d, float *dmin)
{
    for (size_t p = 0; p < 4; p++)
        for (size_t j = 0; j < 8; j++)
            for (size_t b = 0; b < 4; b++) {
                uint8_t v = blk[((p * 8 + j) * 8 + i) * 4 + b];
                q[64 * p + 4 * j + b] = v & 15;
                q[64 * p + 32 + 4 * j + b] = v >> 4;
            }
    for (size_t g = 0; g < 8; g++) {
        sc[g] = blk[1024 + g * 8 + i];
        mn[g] = blk[1088 + (g / 2) * 16 + i * 2 + g % 2];
    }
    uint16_t h[2];
    memcpy(&h[0], blk + 1152 + 2 * i, 2);
    memcpy(&h[1], blk + 1168 + 2 * i, 2);
    *d = llmem__f16_to_f32(h[0]);
    *dmin = llmem__f16_to_f32(h[1]);
}

void llmem__q4k_x8_rows_ref(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch, size_t r0,
                            size_t r1)
{
    const size_t nb = n / QK, ab = llmem__act_row_bytes(LLMEM_DTYPE_Q4_K, n), d8 = d / 8 * 8;
    const uint8_t *w8 = w, *tail = w8 + d / 8 * nb * LLMEM__X8_BLOCK;
    for (size_t r = r0; r < r1; r++) {
        if (r >= d8) { /* a tail row, as q4_K */
            for (size_t b = 0; b < batch; b++)
                y[b * d + r] = llmem__qdot_ref(LLMEM_DTYPE_Q4_K, tail + (r - d8) * nb * QB, (const uint8_t *)act + b * ab, n);
            continue;
        }
        for (size_t b = 0; b < batch; b++) {
            a8k a = a8k_view((const uint8_t *)act + b * ab, n);
            float acc = 0;
            for (size_t k = 0; k < nb; k++) {
                int q[256], sc[8], mn[8];
                float dw, dm;
                x8_read(w8 + (r / 8 * nb + k) * LLMEM__X8_BLOCK, r % 8, q, sc, mn, &dw, &dm);
                const int8_t *qa = a.qs + 256 * k;
                const int16_t *bs = a.bs + 16 * k;
                int sumi = 0, summ = 0;
                for (int g = 0; g < 8; g++) {
                    int s = 0, sa = bs[2 * g] + bs[2 * g + 1];
                    for (int j = 0; j < 32; j++) s += q[32 * g + j] * qa[32 * g + j];
                    sumi += sc[g] * s;
                    summ += mn[g] * sa;
                }
                acc += (dw * a.d[k]) * (float)sumi;
                acc -= (dm * a.d[k]) * (float)summ;
            }
            y[b * d + r] = acc;
        }
    }
}

/* ---- q5_0, q4_0 and q8_0: 32-element blocks, 8 rows to a block ---- */

#define QB5 sizeof(llmem__q5_0)
#define QB4 sizeof(llmem__q4_0)
#define QB8 sizeof(llmem__q8_0)

/* The bytes of a d x n matrix of 32-element blocks in an x8 layout whose
 * blocks are xb bytes, the d % 8 tail rows kept as the source's sb-byte
 * blocks. */
static size_t x8_32_bytes(size_t n, size_t d, size_t xb, size_t sb)
{
    const size_t nb = n / 32;
    return d / 8 * nb * xb + d % 8 * nb * sb;
}

/* The integer sum of row i (< 8) of an x8 block against 32 activation
 * levels: the one thing the layouts' references do differently. */
typedef int (*x8_32_sum)(const uint8_t *blk, size_t i, const int8_t *qa);

/* The shape of an x8 layout of 32-element blocks: the source type (for the
 * tail rows and the activation row), its block's bytes, the x8 block's
 * bytes, where in it the 8 rows' f16 scales start, and its sum. */
typedef struct {
    uint32_t dtype;
    size_t src_bytes, blk_bytes, scale_off;
    x8_32_sum sum;
} x8_32_kind;

/* Rows r0..r1 of y = W act for an x8 layout of kind k, summed as
 * llmem__qdot_ref sums the source type (a reference: the indirect call
 * per block costs nothing that matters here). */
static void x8_32_rows_ref(const x8_32_kind *k, float *y, const void *act, const void *w, size_t n, size_t d,
                           size_t batch, size_t r0, size_t r1)
{
    const size_t nb = n / 32, ab = llmem__act_row_bytes(k->dtype, n), d8 = d / 8 * 8;
    const uint8_t *w8 = w, *tail = w8 + d / 8 * nb * k->blk_bytes;
    for (size_t r = r0; r < r1; r++) {
        if (r >= d8) { /* a tail row, as the source type */
            for (size_t b = 0; b < batch; b++)
                y[b * d + r] =
                    llmem__qdot_ref(k->dtype, tail + (r - d8) * nb * k->src_bytes, (const uint8_t *)act + b * ab, n);
            continue;
        }
        const size_t i = r % 8;
        for (size_t b = 0; b < batch; b++) {
            a8 a = a8_view((const uint8_t *)act + b * ab, n);
            float acc = 0;
            for (size_t kb = 0; kb < nb; kb++) {
                const uint8_t *blk = w8 + (r / 8 * nb + kb) * k->blk_bytes;
                const int sum = k->sum(blk, i, a.qs + 32 * kb);
                uint16_t h;
                memcpy(&h, blk + k->scale_off + 2 * i, 2);
                acc += (llmem__f16_to_f32(h) * a.d[kb]) * (float)sum;
            }
            y[b * d + r] = acc;
        }
    }
}

size_t llmem__q5_0_x8_bytes(size_t n, size_t d) { return x8_32_bytes(n, d, LLMEM__X8_Q5_0_BLOCK, QB5); }

void llmem__q5_0_x8_pack(void *dst, const void *src, size_t n, size_t d)
{
    const size_t nb = n / 32, rb = nb * QB5;
    const uint8_t *s = src;
    uint8_t *o = dst;
    for (size_t g = 0; g < d / 8; g++)
        for (size_t k = 0; k < nb; k++, o += LLMEM__X8_Q5_0_BLOCK) {
            uint16_t *dd = (uint16_t *)(void *)(o + 160);
            for (size_t i = 0; i < 8; i++) {
                const llmem__q5_0 *b = (const void *)(s + (8 * g + i) * rb + k * QB5);
                uint32_t qh;
                memcpy(&qh, b->qh, 4);
                for (size_t j = 0; j < 4; j++) memcpy(o + (j * 8 + i) * 4, b->qs + 4 * j, 4);
                for (size_t bb = 0; bb < 4; bb++) {
                    uint8_t v = 0;
                    for (size_t j = 0; j < 4; j++) {
                        v |= (uint8_t)(((qh >> (4 * j + bb)) & 1) << j);
                        v |= (uint8_t)(((qh >> (16 + 4 * j + bb)) & 1) << (4 + j));
                    }
                    o[128 + i * 4 + bb] = v;
                }
                dd[i] = b->d;
            }
        }
    memcpy(o, s + d / 8 * 8 * rb, d % 8 * rb);
}

/* q5_0 x8: low nibbles of elements 4j..4j+3 and high nibbles of 16+4j..,
 * their fifth bits in the row's 4 bytes at 128 (bit j, bit 4 + j). */
static int q5_0_x8_sum(const uint8_t *blk, size_t i, const int8_t *qa)
{
    int sum = 0;
    for (size_t j = 0; j < 4; j++)
        for (size_t bb = 0; bb < 4; bb++) {
            const uint8_t v = blk[(j * 8 + i) * 4 + bb], h = blk[128 + i * 4 + bb];
            const int lo = ((v & 15) | (((h >> j) & 1) << 4)) - 16;
            const int hi = ((v >> 4) | (((h >> (4 + j)) & 1) << 4)) - 16;
            sum += lo * qa[4 * j + bb] + hi * qa[16 + 4 * j + bb];
        }
    return sum;
}

static const x8_32_kind kind_q5_0 = {LLMEM_DTYPE_Q5_0, QB5, LLMEM__X8_Q5_0_BLOCK, 160, q5_0_x8_sum};

void llmem__q5_0_x8_rows_ref(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch, size_t r0,
                             size_t r1)
{
    x8_32_rows_ref(&kind_q5_0, y, act, w, n, d, batch, r0, r1);
}

size_t llmem__q4_0_x8_bytes(size_t n, size_t d) { return x8_32_bytes(n, d, LLMEM__X8_Q4_0_BLOCK, QB4); }

void llmem__q4_0_x8_pack(void *dst, const void *src, size_t n, size_t d)
{
    const size_t nb = n / 32, rb = nb * QB4;
    const uint8_t *s = src;
    uint8_t *o = dst;
    for (size_t g = 0; g < d / 8; g++)
        for (size_t k = 0; k < nb; k++, o += LLMEM__X8_Q4_0_BLOCK) {
            uint16_t *dd = (uint16_t *)(void *)(o + 128);
            for (size_t i = 0; i < 8; i++) {
                const llmem__q4_0 *b = (const void *)(s + (8 * g + i) * rb + k * QB4);
                for (size_t j = 0; j < 4; j++) memcpy(o + (j * 8 + i) * 4, b->qs + 4 * j, 4);
                dd[i] = b->d;
            }
        }
    memcpy(o, s + d / 8 * 8 * rb, d % 8 * rb);
}

/* q4_0 x8: low nibbles of elements 4j..4j+3 and high nibbles of 16+4j.. */
static int q4_0_x8_sum(const uint8_t *blk, size_t i, const int8_t *qa)
{
    int sum = 0;
    for (size_t j = 0; j < 4; j++)
        for (size_t bb = 0; bb < 4; bb++) {
            const uint8_t v = blk[(j * 8 + i) * 4 + bb];
            sum += ((v & 15) - 8) * qa[4 * j + bb] + ((v >> 4) - 8) * qa[16 + 4 * j + bb];
        }
    return sum;
}

static const x8_32_kind kind_q4_0 = {LLMEM_DTYPE_Q4_0, QB4, LLMEM__X8_Q4_0_BLOCK, 128, q4_0_x8_sum};

void llmem__q4_0_x8_rows_ref(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch, size_t r0,
                             size_t r1)
{
    x8_32_rows_ref(&kind_q4_0, y, act, w, n, d, batch, r0, r1);
}

size_t llmem__q8_0_x8_bytes(size_t n, size_t d) { return x8_32_bytes(n, d, LLMEM__X8_Q8_0_BLOCK, QB8); }

void llmem__q8_0_x8_pack(void *dst, const void *src, size_t n, size_t d)
{
    const size_t nb = n / 32, rb = nb * QB8;
    const uint8_t *s = src;
    uint8_t *o = dst;
    for (size_t g = 0; g < d / 8; g++)
        for (size_t k = 0; k < nb; k++, o += LLMEM__X8_Q8_0_BLOCK) {
            uint16_t *dd = (uint16_t *)(void *)(o + 256);
            for (size_t i = 0; i < 8; i++) {
                const llmem__q8_0 *b = (const void *)(s + (8 * g + i) * rb + k * QB8);
                for (size_t j = 0; j < 8; j++) memcpy(o + (j * 8 + i) * 4, b->qs + 4 * j, 4);
                dd[i] = b->d;
            }
        }
    memcpy(o, s + d / 8 * 8 * rb, d % 8 * rb);
}

/* q8_0 x8: elements 4j..4j+3 of row i at dword j * 8 + i. */
static int q8_0_x8_sum(const uint8_t *blk, size_t i, const int8_t *qa)
{
    int sum = 0;
    for (size_t j = 0; j < 8; j++)
        for (size_t bb = 0; bb < 4; bb++) sum += (int8_t)blk[(j * 8 + i) * 4 + bb] * qa[4 * j + bb];
    return sum;
}

static const x8_32_kind kind_q8_0 = {LLMEM_DTYPE_Q8_0, QB8, LLMEM__X8_Q8_0_BLOCK, 256, q8_0_x8_sum};

void llmem__q8_0_x8_rows_ref(float *y, const void *act, const void *w, size_t n, size_t d, size_t batch, size_t r0,
                             size_t r1)
{
    x8_32_rows_ref(&kind_q8_0, y, act, w, n, d, batch, r0, r1);
}
