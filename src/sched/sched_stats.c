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

LLMEM__STATS_SCHEMA_OF(llmem_sched_stats_schema, "sched", llmem_sched_stats, LLMEM_SCHED_STATS_FIELDS)
