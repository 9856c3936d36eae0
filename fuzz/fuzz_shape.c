/*
 * fuzz_shape.c - the config.json shape parser on arbitrary bytes: it either
 * fails with LLMEM_EFORMAT or returns a self-consistent shape whose sizes
 * can be computed.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/llmem.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    if (!quiet++) llmem_log_set(NULL, NULL, LLMEM_LOG_OFF);
    llmem_shape s;
    llmem_status st = llmem_shape_from_json((const char *)data, size, &s);
    if (st) {
        if (st != LLMEM_EFORMAT && st != LLMEM_ENOMEM) abort();
        return 0;
    }
    if (!s.layers || !s.heads || !s.kv_heads || !s.head_dim || s.heads % s.kv_heads) abort();
    if (!s.hidden || !s.vocab || !s.ffn || !s.max_ctx || !(s.rope_theta > 0)) abort();
    if (!llmem_shape_params(&s) || !llmem_shape_kv_bytes_per_token(&s, 2)) abort();
    if (!memchr(s.name, 0, sizeof s.name)) abort();
    return 0;
}
