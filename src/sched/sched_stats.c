/*
 * sched_stats.c - the scheduler's figures (llmem/sched.h): counters and
 * gauges with vLLM's meanings, the latency histograms, the simulation's
 * KV checks, and the stats schema for the exporter. Counters are kept
 * under the scheduler's lock as it works; the gauges are counted here.
 */
#include <stdlib.h>
#include <string.h>

#include "../core/internal.h"
#include "sched_internal.h"

llmem_status llmem_sched_get_stats(llmem_sched *s, llmem_sched_stats *out)
{
    if (!s || !out) return llmem__fail(LLMEM_EINVAL, "sched stats: null argument");
    pthread_mutex_lock(&s->mu);
    llmem_sched_stats st = s->st;
    st.requests_waiting = st.requests_running = 0;
    for (uint32_t i = 0; i < s->nreq_cap; i++) {
        const sreq *r = s->reqs[i];
        if (!r || !r->unfinished) continue;
        bool admitted = false;
        for (uint32_t k = 0; k < r->n; k++)
            if (r->u[k].in_run) admitted = true;
        if (admitted) st.requests_running++;
        else st.requests_waiting++;
    }
    st.sequences_running = s->nrun;
    st.sequences_swapped = s->nswapped;
    st.clock_seconds = (double)llmem__sched_now(s) * 1e-9;
    pthread_mutex_unlock(&s->mu);
    st.kv_usage = 0;
    llmem_kv_room kr;
    if (s->b.kv && !llmem_kv_get_room(s->b.kv, &kr)) {
        if (kr.strategy == LLMEM_KV_PAGED) {
            size_t cap = kr.budget_bytes ? kr.budget_bytes / (kr.block_bytes_all_layers ? kr.block_bytes_all_layers : 1)
                                         : kr.used_blocks + kr.free_blocks + kr.cached_blocks;
            st.kv_usage = cap ? (double)kr.used_blocks / (double)cap : 0;
        } else {
            st.kv_usage = kr.budget_bytes ? (double)kr.reserved_bytes / (double)kr.budget_bytes : 0;
        }
        if (st.kv_usage > 1) st.kv_usage = 1;
    }
    size_t n = llmem_stats_fill_size(out->struct_size, sizeof st);
    st.struct_size = n;
    memcpy(out, &st, n);
    return LLMEM_OK;
}

llmem_status llmem_sched_get_histogram(llmem_sched *s, llmem_sched_hist_kind kind, llmem_sched_histogram *out)
{
    if (!s || !out) return llmem__fail(LLMEM_EINVAL, "sched histogram: null argument");
    if ((unsigned)kind >= LLMEM_SCHED_HIST_COUNT_)
        return llmem__fail(LLMEM_EINVAL, "sched histogram: unknown kind %d", (int)kind);
    pthread_mutex_lock(&s->mu);
    const hist *h = &s->h[kind];
    memset(out, 0, sizeof *out);
    out->buckets = h->nb;
    uint64_t c = 0;
    for (uint32_t i = 0; i < h->nb; i++) {
        out->le[i] = h->le[i];
        c += h->counts[i];
        out->cumulative[i] = c;
    }
    out->count = h->count;
    out->sum = h->sum;
    pthread_mutex_unlock(&s->mu);
    return LLMEM_OK;
}

llmem_status llmem_sched_get_sim_stats(llmem_sched *s, llmem_sched_sim_stats *out)
{
    if (!s || !out) return llmem__fail(LLMEM_EINVAL, "sched sim stats: null argument");
    if (!s->sim) return llmem__fail(LLMEM_ENOTSUP, "sched sim stats: not a simulation");
    pthread_mutex_lock(&s->step_mu);
    llmem_status st = llmem__sched_sim_stats(s->b.self, out);
    pthread_mutex_unlock(&s->step_mu);
    return st;
}

#define F(kind, name, help) LLMEM__STAT_FIELD(llmem_sched_stats, kind, U64, name, help)
#define D(kind, name, help) LLMEM__STAT_FIELD(llmem_sched_stats, kind, DOUBLE, name, help)
static const llmem_stat_field sched_fields[] = {
    F(GAUGE, requests_waiting, "Requests none of whose samples is admitted."),
    F(GAUGE, requests_running, "Requests with a sample admitted."),
    F(GAUGE, sequences_running, "Sequences admitted (holding KV)."),
    F(GAUGE, sequences_swapped, "Sequences swapped out to host memory."),
    D(GAUGE, kv_usage, "KV held by sequences over KV capacity (0..1)."),
    F(COUNTER, requests_submitted_total, "Requests submitted."),
    F(COUNTER, requests_finished_total, "Requests whose every sample finished."),
    F(COUNTER, requests_cancelled_total, "Requests cancelled."),
    F(COUNTER, requests_rejected_total, "Requests whose prompt could never fit in the KV."),
    F(COUNTER, samples_length_total, "Samples that generated max_tokens."),
    F(COUNTER, samples_stop_total, "Samples ended by a stop token or sequence."),
    F(COUNTER, samples_context_total, "Samples that reached the context length."),
    F(COUNTER, samples_memory_total, "Samples truncated: alone, and refused KV."),
    F(COUNTER, prompt_tokens_total, "Prompt tokens of admitted requests."),
    F(COUNTER, generation_tokens_total, "Tokens generated."),
    F(COUNTER, computed_tokens_total, "Prompt tokens computed, recomputation included."),
    F(COUNTER, prefix_cache_queries_total, "Prompt tokens looked up in the prefix cache."),
    F(COUNTER, prefix_cache_hits_total, "Prompt tokens found in the prefix cache (prefill skipped)."),
    F(COUNTER, prefix_cache_requests_hit_total, "Admissions that found cached blocks."),
    F(COUNTER, preemptions_total, "Sequences preempted."),
    F(COUNTER, preemptions_swap_total, "Sequences preempted by swapping their KV out."),
    F(COUNTER, swap_ins_total, "Swapped sequences swapped back in."),
    F(COUNTER, forks_total, "Samples forked from their prompt's sequence."),
    F(COUNTER, fork_fallbacks_total, "Samples that prefilled their prompt themselves."),
    F(COUNTER, admissions_refused_total, "Admissions the KV refused at sequence creation."),
    F(COUNTER, steps_total, "Steps run."),
    F(COUNTER, step_prefill_tokens_total, "Prefill tokens in steps."),
    F(COUNTER, step_decode_tokens_total, "Decode tokens in steps."),
    D(COUNTER, step_seconds_total, "Seconds of steps (measured or modelled)."),
    D(COUNTER, busy_seconds_total, "Clock seconds spent in steps."),
    D(GAUGE, clock_seconds, "The scheduler's clock."),
};
#undef F
#undef D
LLMEM__STATS_SCHEMA_GETTER(llmem_sched_stats_schema, "sched", llmem_sched_stats, sched_fields)
