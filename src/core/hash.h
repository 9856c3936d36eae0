/*
 * hash.h - the one 64-bit mixer, and the prefix chain built on it. Not
 * installed; the tests include it too (tests/support/rng.h), so the KV
 * content models of the scheduler's simulation and of the tests are one.
 *
 * llmem__mix64 is a bijective finaliser (xor-shift, multiply, twice more):
 * every input bit moves about half the output bits, so consecutive inputs
 * (a counter, a position) give unrelated words. Not a cryptographic hash.
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

static inline uint64_t llmem__mix64(uint64_t x)
{
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ull;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dull;
    return x ^ (x >> 33);
}

/* The prefix hash through position pos, from the one before it (0 before
 * position 0). */
static inline uint64_t llmem__prefix_step(uint64_t prev, int32_t tok, size_t pos)
{
    return llmem__mix64(prev * 0x100000001b3ull + (uint64_t)(uint32_t)tok * 0x9e3779b97f4a7c15ull + pos + 1);
}

#endif
