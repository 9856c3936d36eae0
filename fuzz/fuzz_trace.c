/*
 * fuzz_trace.c - the request-trace CSV parser on arbitrary bytes: it either
 * fails with LLMEM_EFORMAT (and hands nothing out) or returns requests that
 * satisfy the trace contract (sorted, relative arrivals, bounded fields).
 */
#include <stdint.h>
#include <stdlib.h>

#include "llmem/llmem.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    if (!quiet++) llmem_log_set(NULL, NULL, LLMEM_LOG_OFF);
    llmem_trace t;
    llmem_status st = llmem_trace_parse((const char *)data, size, &t);
    if (st) {
        if (st != LLMEM_EFORMAT && st != LLMEM_ENOMEM) abort();
        if (t.req || t.count) abort();
        return 0;
    }
    for (size_t i = 0; i < t.count; i++) {
        const llmem_trace_request *r = &t.req[i];
        if (!(r->arrival_s >= 0) || (i && r->arrival_s < t.req[i - 1].arrival_s)) abort();
        if (r->prompt_tokens > (1u << 24) || r->output_tokens > (1u << 24)) abort();
        if (r->prefix_tokens > r->prompt_tokens) abort();
    }
    if (t.count && (t.req[0].arrival_s != 0 || t.duration_s != t.req[t.count - 1].arrival_s)) abort();
    llmem_trace_free(&t);
    return 0;
}
