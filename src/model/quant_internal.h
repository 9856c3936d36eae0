/*
 * quant_internal.h - the block layouts of llmem/quant.h as C structs, for
 * quant.c and the engine's kernels. Private to llmem.
 *
 * Every struct has exactly the size of the format's block (checked below),
 * alignment 2 at most (blocks lie back to back in a row, rows at 32-byte
 * aligned tensor data), f16 fields as raw uint16_t.
 */
#ifndef LLMEM_MODEL_QUANT_INTERNAL_H
#define LLMEM_MODEL_QUANT_INTERNAL_H

#include <stdint.h>
#include <string.h>

#define LLMEM_QK 32    /* elements per block of the 32-element types */
#define LLMEM_QK_K 256 /* elements per k-quant super-block */

typedef struct llmem__q4_0 {
    uint16_t d;
    uint8_t qs[16];      /* element j: low nibble of qs[j % 16] (j < 16) or high nibble (j >= 16) */
} llmem__q4_0;

typedef struct llmem__q4_1 {
    uint16_t d, m;
    uint8_t qs[16];
} llmem__q4_1;

typedef struct llmem__q5_0 {
    uint16_t d;
    uint8_t qh[4];       /* bit j (as a little-endian u32): bit 4 of element j */
    uint8_t qs[16];
} llmem__q5_0;

typedef struct llmem__q5_1 {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[16];
} llmem__q5_1;

typedef struct llmem__q8_0 {
    uint16_t d;
    int8_t qs[32];
} llmem__q8_0;

/* Element e of a q2_k / q3_k super-block, e = 128 h + 32 j + l (h < 2, j <
 * 4, l < 32): its two low bits are bits 2j, 2j+1 of qs[32 h + l]; its group
 * (of 16) is e / 16. q3_k: its third bit is bit 4h + j of hmask[l]. */
typedef struct llmem__q2_k {
    uint8_t scales[16];  /* group g: scale in the low nibble, min in the high */
    uint8_t qs[64];
    uint16_t d, dmin;
} llmem__q2_k;

typedef struct llmem__q3_k {
    uint8_t hmask[32];
    uint8_t qs[64];
    uint8_t scales[12];  /* 16 6-bit scales: group g's low 4 bits are nibble g / 8 of byte g % 8,
                            its high 2 bits are bits 2 (g / 4) of byte 8 + g % 4 */
    uint16_t d;
} llmem__q3_k;

/* Element e of a q4_k / q5_k super-block, e = 64 c + 32 hi + l (c < 4, hi <
 * 2, l < 32): its four low bits are nibble hi of qs[32 c + l]; its group
 * (of 32) is 2c + hi. q5_k: its fifth bit is bit 2c + hi of qh[l]. */
typedef struct llmem__q4_k {
    uint16_t d, dmin;
    uint8_t scales[12];  /* 8 6-bit scales s_g and mins m_g: for g < 4, s_g and m_g are the low 6
                            bits of bytes g and g + 4; for g >= 4, their low 4 bits are the low
                            and high nibble of byte g + 4 and their high 2 bits the top 2 bits of
                            bytes g - 4 and g */
    uint8_t qs[128];
} llmem__q4_k;

typedef struct llmem__q5_k {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[32];
    uint8_t qs[128];
} llmem__q5_k;

/* Element e of a q6_k super-block, e = 128 h + 32 k + l (h < 2, k < 4, l <
 * 32): its four low bits are the low (k < 2) or high (k >= 2) nibble of
 * ql[64 h + 32 (k % 2) + l], its two high bits are bits 2k, 2k+1 of
 * qh[32 h + l]; its group (of 16) is e / 16. */
typedef struct llmem__q6_k {
    uint8_t ql[128];
    uint8_t qh[64];
    int8_t scales[16];
    uint16_t d;
} llmem__q6_k;

_Static_assert(sizeof(llmem__q4_0) == 18, "q4_0 block");
_Static_assert(sizeof(llmem__q4_1) == 20, "q4_1 block");
_Static_assert(sizeof(llmem__q5_0) == 22, "q5_0 block");
_Static_assert(sizeof(llmem__q5_1) == 24, "q5_1 block");
_Static_assert(sizeof(llmem__q8_0) == 34, "q8_0 block");
_Static_assert(sizeof(llmem__q2_k) == 84, "q2_k block");
_Static_assert(sizeof(llmem__q3_k) == 110, "q3_k block");
_Static_assert(sizeof(llmem__q4_k) == 144, "q4_k block");
_Static_assert(sizeof(llmem__q5_k) == 176, "q5_k block");
_Static_assert(sizeof(llmem__q6_k) == 210, "q6_k block");

/* The 8 6-bit scales and mins of a q4_k/q5_k block (the layout of
 * llmem__q4_k's scales), four per 32-bit word without a branch: the one
 * unpacking of them that the dequantiser and every kernel use. */
static inline void llmem__k4_scales_mins(const uint8_t *s, uint8_t sc[8], uint8_t m[8])
{
    uint32_t u0, u1, u2, lo, hi;
    memcpy(&u0, s, 4);
    memcpy(&u1, s + 4, 4);
    memcpy(&u2, s + 8, 4);
    lo = u0 & 0x3f3f3f3fu;
    hi = (u2 & 0x0f0f0f0fu) | (((u0 >> 6) & 0x03030303u) << 4);
    memcpy(sc, &lo, 4);
    memcpy(sc + 4, &hi, 4);
    lo = u1 & 0x3f3f3f3fu;
    hi = ((u2 >> 4) & 0x0f0f0f0fu) | (((u1 >> 6) & 0x03030303u) << 4);
    memcpy(m, &lo, 4);
    memcpy(m + 4, &hi, 4);
}

/* The 16 6-bit scales of a q3_k block, unsigned (0..63; the value is s - 32),
 * four per 32-bit word. */
static inline void llmem__k3_scales(const uint8_t *s, uint8_t out[16])
{
    uint32_t a0, a1, t, w;
    memcpy(&a0, s, 4);
    memcpy(&a1, s + 4, 4);
    memcpy(&t, s + 8, 4);
    w = (a0 & 0x0f0f0f0fu) | ((t & 0x03030303u) << 4);
    memcpy(out, &w, 4);
    w = (a1 & 0x0f0f0f0fu) | (((t >> 2) & 0x03030303u) << 4);
    memcpy(out + 4, &w, 4);
    w = ((a0 >> 4) & 0x0f0f0f0fu) | (((t >> 4) & 0x03030303u) << 4);
    memcpy(out + 8, &w, 4);
    w = ((a1 >> 4) & 0x0f0f0f0fu) | (((t >> 6) & 0x03030303u) << 4);
    memcpy(out + 12, &w, 4);
}

#endif
