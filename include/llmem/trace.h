/*
 * llmem/trace.h - request traces for replay: when each request arrived,
 * how long its prompt was, how many tokens it generated.
 *
 * CSV with a header naming the columns (any order, case-insensitive):
 *   arrival   TIMESTAMP | arrival | arrival_s | time: "YYYY-MM-DD
 *             HH:MM:SS[.fraction]" (UTC) or seconds as a number
 *   prompt    ContextTokens | prompt_tokens | input_tokens
 *   output    GeneratedTokens | output_tokens
 *   optional  prefix_id | PrefixId (requests with the same id share a
 *             prefix) and prefix_tokens (its length)
 * Arrivals are made relative to the first and sorted. Every field is
 * checked: a malformed line is LLMEM_EFORMAT naming the line and column.
 * The Azure code trace in ../shared/traces reads as it is.
 */
#ifndef LLMEM_TRACE_H
#define LLMEM_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_trace_request {
    double arrival_s;        /* seconds after the first arrival */
    uint32_t prompt_tokens;
    uint32_t output_tokens;
    uint32_t prefix_id;      /* 0 = none */
    uint32_t prefix_tokens;  /* shared prefix length for prefix_id */
} llmem_trace_request;

typedef struct llmem_trace {
    llmem_trace_request *req;
    size_t count;
    double duration_s;       /* last arrival */
} llmem_trace;

/* Parse CSV text (len bytes). out is replaced; free it with
 * llmem_trace_free. */
LLMEM_API llmem_status llmem_trace_parse(const char *text, size_t len, llmem_trace *out);
LLMEM_API llmem_status llmem_trace_load(const char *path, llmem_trace *out);
LLMEM_API void llmem_trace_free(llmem_trace *t);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_TRACE_H */
