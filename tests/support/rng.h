/*
 * rng.h - the one seeded random number generator of the tests and fuzz
 * drivers, and the library's mixer for the values derived from it.
 *
 * xorshift64 (Marsaglia's 13, 7, 17 triple): full period 2^64 - 1 over
 * nonzero states, a state of one word that a test prints and replays, fast
 * enough for inner loops. A zero state stays zero: every seed is made
 * nonzero (test_rng_seed). Quality is ample for choosing operations and
 * sizes; anything that must look unrelated to a counter goes through
 * test_mix64 (llmem__mix64, src/core/hash.h), which is also the prefix
 * chain the KV content models share (test_prefix_step).
 */
#ifndef LLMEM_TEST_RNG_H
#define LLMEM_TEST_RNG_H

#include <stddef.h>
#include <stdint.h>

#include "../../src/core/hash.h"

/* A usable state from any seed: nonzero, and seeds 1, 2, 3... unrelated. */
static inline uint64_t test_rng_seed(uint64_t seed) { return llmem__mix64(seed + 0x9e3779b97f4a7c15ull) | 1; }

/* The next word; *s must be nonzero. */
static inline uint64_t test_rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Uniform-enough in [0, n), n > 0 (modulo bias below 2^-40 for n < 2^24). */
static inline uint64_t test_rng_below(uint64_t *s, uint64_t n) { return test_rng_next(s) % n; }

/* Uniform in [0, 1), 53 bits. */
static inline double test_rng_unit(uint64_t *s) { return (double)(test_rng_next(s) >> 11) * 0x1p-53; }

static inline uint64_t test_mix64(uint64_t x) { return llmem__mix64(x); }

static inline uint64_t test_prefix_step(uint64_t prev, int32_t tok, size_t pos)
{
    return llmem__prefix_step(prev, tok, pos);
}

#endif
