/*
 * kv_content.h - the KV content model every KV test writes and checks
 * (test_kv, test_kv_threads, test_stress_threads).
 *
 * A token's K (or V) bytes in one layer are a function of its prefix hash
 * (test_prefix_step over every token up to and including it: the chain the
 * scheduler's simulation, and so `llmem soak`, seeds its own pattern with),
 * its position, the layer and K-or-V. So, as in a real model, identical
 * prefixes have identical KV, and a block handed out under the wrong
 * prefix, or a token written at the wrong offset, reads back wrong. A test
 * without tokens (the stress test) passes any per-position words as the
 * "prefix hashes"; a fork copies them as it copies the blocks.
 *
 * Memory on a device is only ever touched through llmem_resource_copy
 * (dev non-NULL); host memory directly.
 */
#ifndef LLMEM_TEST_KV_CONTENT_H
#define LLMEM_TEST_KV_CONTENT_H

#include <stddef.h>
#include <stdint.h>

#include "llmem/kv.h"
#include "llmem/resource.h"

/* K (which 0) or V (which 1) of the token at pos in layer: n bytes. */
void test_kv_content(uint64_t ph, size_t pos, uint32_t layer, int which, unsigned char *out, size_t n);

/* ph[at + i] for the n tokens tok[i] that follow position at - 1 (whose
 * hash is ph[at - 1]; 0 before position 0). */
void test_kv_chain(uint64_t *ph, size_t at, const int32_t *tok, size_t n);

/* n bytes between host and KV memory: llmem_resource_copy on a device. */
void test_kv_copy(llmem_resource *dev, void *dst, const void *src, size_t n);

/* Write K and V of positions [from, to) of every one of `layers` layers
 * through llmem_kv_seq_token, as an engine does right after the append;
 * ph is indexed by position. Fails the test on any error. */
void test_kv_write(llmem_kv *kv, llmem_resource *dev, llmem_kv_seq h, const uint64_t *ph, size_t from, size_t to,
                   uint32_t layers);

/* The n bytes at got (host memory) are the model's for (ph, pos, layer,
 * which); otherwise fail, naming `what` (printf-style: the sequence, the
 * path it was read through), the first byte that differs and both values. */
void test_kv_expect(const unsigned char *got, size_t n, uint64_t ph, size_t pos, uint32_t layer, int which,
                    const char *what, ...) __attribute__((format(printf, 7, 8)));

/* Read the token's K and V back through llmem_kv_seq_token and check both. */
void test_kv_expect_token(llmem_kv *kv, llmem_resource *dev, llmem_kv_seq h, uint64_t ph, size_t pos,
                          uint32_t layer);

#endif
