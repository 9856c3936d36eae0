/*
 * fuzz_shape.c - the config.json shape parser on arbitrary bytes: it either
 * fails with LLMEM_EFORMAT or returns a self-consistent shape whose sizes
 * can be computed.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/llmem.h"

#include "support.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_begin();
    llmem_shape s;
    llmem_status st = llmem_shape_from_json((const char *)data, size, &s);
    if (fz_parse_refused(st)) return 0;
    FZ_CHECK(!(!s.layers || !s.heads || !s.kv_heads || !s.head_dim || s.heads % s.kv_heads));
    FZ_CHECK(!(!s.hidden || !s.vocab || !s.ffn || !s.max_ctx || !(s.rope_theta > 0)));
    FZ_CHECK(!(!llmem_shape_params(&s) || !llmem_shape_kv_bytes_per_token(&s, 2)));
    FZ_CHECK(memchr(s.name, 0, sizeof s.name));
    return 0;
}
