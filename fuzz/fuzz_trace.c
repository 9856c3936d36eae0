/*
 * fuzz_trace.c - the request-trace CSV parser on arbitrary bytes: it either
 * fails with LLMEM_EFORMAT (and hands nothing out) or returns requests that
 * satisfy the trace contract (sorted, relative arrivals, bounded fields).
 */
#include <stdint.h>
#include <stdlib.h>

#include "llmem/llmem.h"

#include "support.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_begin();
    llmem_trace t;
    llmem_status st = llmem_trace_parse((const char *)data, size, &t);
    if (fz_parse_refused(st)) {
        FZ_CHECK(!(t.req || t.count));
        return 0;
    }
    for (size_t i = 0; i < t.count; i++) {
        const llmem_trace_request *r = &t.req[i];
        FZ_CHECK(!(!(r->arrival_s >= 0) || (i && r->arrival_s < t.req[i - 1].arrival_s)));
        FZ_CHECK(!(r->prompt_tokens > (1u << 24) || r->output_tokens > (1u << 24)));
        FZ_CHECK(!(r->prefix_tokens > r->prompt_tokens));
    }
    FZ_CHECK(!(t.count && (t.req[0].arrival_s != 0 || t.duration_s != t.req[t.count - 1].arrival_s)));
    llmem_trace_free(&t);
    return 0;
}
