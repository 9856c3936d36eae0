/*
 * workload.c - the memory plan of a workload (llmem/workload.h): KV by
 * blocks, the engine's planned activations for the largest step, the
 * reserve, and what fits in a device.
 *
 * The fit: beside the weights and the largest step's activations (itself
 * planned for the whole batch; for fewer sequences it is smaller, so the
 * bound stays conservative), each sequence needs its KV x safety. The
 * quotient is at most device / 38 bytes (the smallest sequence's KV), so it
 * fits a long long; it is clamped anyway.
 */
#include <string.h>

#include "internal.h"
#include "llmem/engine.h"
#include "llmem/model.h"
#include "llmem/workload.h"

llmem_workload llmem_workload_default(void)
{
    llmem_workload w;
    memset(&w, 0, sizeof w);
    w.kv_elem_bytes = 2;
    w.batch = 1;
    w.prompt_tokens = 512;
    w.max_tokens = 256;
    w.threads = 2;
    w.block_tokens = 16;
    w.max_step_tokens = 512;
    w.safety = 1.2;
    return w;
}

llmem_status llmem_workload_weights_bytes(const llmem_shape *s, uint32_t dtype, uint64_t *out)
{
    if (!s || !out) return llmem__fail(LLMEM_EINVAL, "workload: null argument");
    uint64_t params;
    llmem_status st = llmem_shape_sizes(s, 1, &params, NULL);
    if (st) return st;
    bool ok;
    if (dtype == LLMEM_DTYPE_Q8_0)
        ok = !__builtin_mul_overflow(params / 32, 34, out);
    else if (dtype == LLMEM_DTYPE_F32 || dtype == LLMEM_DTYPE_F16)
        ok = !__builtin_mul_overflow(params, dtype == LLMEM_DTYPE_F32 ? 4 : 2, out);
    else
        return llmem__fail(LLMEM_ENOTSUP, "workload: weights in %s are not sized here (f32, f16, q8_0)",
                           llmem_dtype_name(dtype));
    if (!ok)
        return llmem__fail(LLMEM_EOVERFLOW, "the weights of %llu parameters in %s overflow 64 bits",
                           (unsigned long long)params, llmem_dtype_name(dtype));
    return LLMEM_OK;
}

llmem_status llmem_workload_plan_make(const llmem_workload *w, llmem_workload_plan *out)
{
    if (!w || !out) return llmem__fail(LLMEM_EINVAL, "workload: null argument");
    memset(out, 0, sizeof *out);
    if (!w->batch || !w->threads || !w->block_tokens || !w->max_step_tokens || !(w->safety >= 1) ||
        !(w->device_bytes >= 0) || !w->kv_elem_bytes)
        return llmem__fail(LLMEM_EINVAL,
                           "workload: batch, threads, block and step tokens, KV element size must be positive, "
                           "safety at least 1, device bytes not negative");
    const llmem_shape *s = &w->shape;
    out->seq_tokens = (uint64_t)w->prompt_tokens + w->max_tokens;
    if (!out->seq_tokens) return llmem__fail(LLMEM_EINVAL, "a sequence of no tokens");
    out->over_context = out->seq_tokens > s->max_ctx;
    llmem_status st = llmem_shape_sizes(s, w->kv_elem_bytes, NULL, &out->kv_bytes_per_token);
    if (st) return st;
    uint64_t seq_blocks = (out->seq_tokens + w->block_tokens - 1) / w->block_tokens;
    if (__builtin_mul_overflow(seq_blocks * w->block_tokens, out->kv_bytes_per_token, &out->kv_bytes_per_seq) ||
        __builtin_mul_overflow(out->kv_bytes_per_seq, (uint64_t)w->batch, &out->kv_bytes))
        return llmem__fail(LLMEM_EOVERFLOW,
                           "the KV cache is too large: %u sequences x %llu tokens x %llu bytes a token overflow 64 bits",
                           w->batch, (unsigned long long)(seq_blocks * w->block_tokens),
                           (unsigned long long)out->kv_bytes_per_token);

    /* The largest step: prefill in chunks of at most max_step_tokens (all
     * prompts together when they fit), or decode of one token each. */
    uint32_t ctx = out->seq_tokens < s->max_ctx ? (uint32_t)out->seq_tokens : s->max_ctx;
    uint64_t prefill_tokens = (uint64_t)w->batch * w->prompt_tokens;
    uint32_t step_tokens = prefill_tokens < w->max_step_tokens ? (uint32_t)prefill_tokens : w->max_step_tokens;
    uint32_t step_seqs = w->batch < step_tokens ? w->batch : step_tokens;
    if (step_tokens &&
        (st = llmem_engine_plan_step(s, step_tokens, step_seqs ? step_seqs : 1, ctx, w->threads, &out->prefill)))
        return st;
    if (w->max_tokens && (st = llmem_engine_plan_step(s, w->batch, w->batch, ctx, w->threads, &out->decode)))
        return st;
    out->prefill_is_peak = out->prefill.peak_bytes >= out->decode.peak_bytes;
    out->activation_peak_bytes = out->prefill_is_peak ? out->prefill.peak_bytes : out->decode.peak_bytes;
    /* (KV + activations) x safety, rounded up; 1.2 in integers exactly:
     * x + ceil(x / 5). */
    uint64_t need;
    bool ok = !__builtin_add_overflow(out->kv_bytes, out->activation_peak_bytes, &need);
    if (ok && w->safety == 1.2) {
        ok = !__builtin_add_overflow(need, need / 5 + (need % 5 != 0), &out->reserve_bytes);
    } else if (ok) {
        double r = (double)need * w->safety;
        ok = r < 1.8e19;
        if (ok) out->reserve_bytes = (uint64_t)r + ((double)(uint64_t)r < r);
    }
    if (!ok)
        return llmem__fail(LLMEM_EOVERFLOW,
                           "the reserve is too large: KV %llu + activations %llu bytes, x %.1f, overflow 64 bits",
                           (unsigned long long)out->kv_bytes, (unsigned long long)out->activation_peak_bytes,
                           w->safety);
    out->max_concurrent = -1;
    if (w->device_bytes > 0) {
        double room = w->device_bytes - (double)w->weights_bytes - (double)out->activation_peak_bytes * w->safety;
        double q = room > 0 ? room / ((double)out->kv_bytes_per_seq * w->safety) : 0;
        out->max_concurrent = q >= 9.2e18 ? 9200000000000000000ll : (long long)q;
    }
    return LLMEM_OK;
}
