/*
 * hash.h - the 64-bit mixers, and the prefix chain built on one. Not
 * installed; the tests include it too (tests/support/rng.h), so the KV
 * content models of the scheduler's simulation and of the tests are one.
 *
 * llmem__mix64 is a bijective finaliser (xor-shift, multiply, twice more):
 * every input bit moves about half the output bits, so consecutive inputs
 * (a counter, a position) give unrelated words. Not a cryptographic hash.
 *
 * llmem__splitmix64 is SplitMix64's output function, for seeded streams.
 *
 * llmem__prefix_step is the rolling hash of a token sequence: the value at
 * position pos depends on every token up to and including it and on pos,
 * so two sequences agree at pos exactly when their prefixes agree (up to
 * 64-bit collisions), which is what a prefix cache shares blocks by.
 */
#ifndef LLMEM_HASH_H
#define LLMEM_HASH_H

#include <stddef.h>
#include <stdint.h>

/* The finaliser both mixers below are: xor-shift by a, multiply by the
 * odd m1, xor-shift by b, multiply by the odd m2, xor-shift by c. */
static inline uint64_t llmem__xmx(uint64_t x, unsigned a, uint64_t m1, unsigned b, uint64_t m2, unsigned c)
{
    x ^= x >> a;
    x *= m1;
    x ^= x >> b;
    x *= m2;
    return x ^ (x >> c);
}

static inline uint64_t llmem__mix64(uint64_t x)
{
    return llmem__xmx(x, 31, 0x7fb5d329728ea185ull, 27, 0x81dadef4bc2dd44dull, 33);
}

/* MurmurHash3's 64-bit finaliser, the same shape with other constants: the
 * prefix cache's block hashes and hash-table slots (kv_prefix.c) and the
 * allocation profiler's tables (profile.c) use it. Kept apart from
 * llmem__mix64 so neither's values change. */
static inline uint64_t llmem__fmix64(uint64_t x)
{
    return llmem__xmx(x, 33, 0xff51afd7ed558ccdull, 33, 0xc4ceb9fe1a85ec53ull, 33);
}

/* SplitMix64's output function (Steele, Lea and Flood): the golden-ratio
 * increment, then the same finaliser shape with Stafford's "Mix13"
 * constants. Seeds and streams that must not change (the synthetic
 * weights of every model llmem synth wrote, the fault adaptor's seeded
 * draws, the server's request ids) are made with it. */
static inline uint64_t llmem__splitmix64(uint64_t x)
{
    return llmem__xmx(x + 0x9e3779b97f4a7c15ull, 30, 0xbf58476d1ce4e5b9ull, 27, 0x94d049bb133111ebull, 31);
}

/* The prefix hash through position pos, from the one before it (0 before
 * position 0). */
static inline uint64_t llmem__prefix_step(uint64_t prev, int32_t tok, size_t pos)
{
    return llmem__mix64(prev * 0x100000001b3ull + (uint64_t)(uint32_t)tok * 0x9e3779b97f4a7c15ull + pos + 1);
}

#endif
