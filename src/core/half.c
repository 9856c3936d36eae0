/*
 * half.c - IEEE binary16 <-> binary32, exactly: f16 to f32 is exact (every
 * half is a float), f32 to f16 rounds to nearest even, with overflow to
 * infinity, subnormal halves, and NaN kept NaN (quiet, payload's top bits).
 * The model layer (quantised blocks carry f16 scales) and the engine
 * (f16 weights and KV) both use these; the engine's vector paths convert
 * with F16C, which gives the same values.
 */
#include "half.h"

#include <string.h>

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float llmem__f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13)); /* inf, NaN (payload kept) */
    if (exp != 0) return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
    /* Zero or subnormal: man * 2^-24, exact in f32. */
    return bits_f32(sign | f32_bits((float)man * 0x1p-24f));
}

uint16_t llmem__f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu)); /* NaN stays NaN (quiet) */
    if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 (or inf): rounds to inf */
    if (x >= 0x38800000u) {                                   /* normal half: rebias, round to nearest even */
        uint32_t h = (x >> 13) - (112u << 10), rem = x & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* a carry into the exponent is right */
        return (uint16_t)(sign | h);
    }
    if (x <= 0x33000000u) return sign; /* <= 2^-25: the tie at 2^-25 goes to even, zero */
    /* Subnormal half: count units of 2^-24, rounding to nearest even; 1024
     * units is the smallest normal, which the encoding gives for free. */
    uint32_t e = x >> 23, m = (x & 0x7fffffu) | 0x800000u, shift = 126 - e; /* 14..24 */
    uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

