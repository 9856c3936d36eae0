/*
 * serve_report.c - what the server says about itself: GET /metrics
 * (Prometheus text), GET /llmem/timeline (JSON for the dashboard), the
 * samples behind it, and the dashboard page (llmem/server.h).
 *
 * Metrics: vLLM's names where one exists, with its label model_name:
 * vllm:num_requests_running / _waiting / _swapped, vllm:kv_cache_usage_perc
 * (and the older vllm:gpu_cache_usage_perc, the same value), prefix cache
 * queries and hits, preemptions, prompt and generation token counters,
 * request_success by finished_reason, and the latency histograms the
 * scheduler keeps in vLLM's buckets (time_to_first_token_seconds,
 * time_per_output_token_seconds, e2e_request_latency_seconds,
 * request_queue_time_seconds). Then every llmem component's stats through
 * the exporter: server, scheduler, engine, KV, pool, controller, tracking
 * and fault-injecting resources. The engine's stats are read by the step thread only (its
 * snapshot, under snap_mu); the others are safe from any thread.
 *
 * The step model: every step the scheduler runs is recorded (its shape
 * and measured time, a ring of SRV_STEPS); llmem_server_step_model fits
 * the LINEAR step model to them on demand, and /metrics exports the fit as
 * llmem_step_model_* gauges: the server's cost per step, per prefill
 * token, per decoding sequence and per attention pair on this machine,
 * now (a loaded machine shows as a larger fixed cost).
 *
 * Samples: after every step (and at creation) the step thread records one
 * sample at most every 50 ms into a ring of SRV_SAMPLES: the pool's
 * reserved, committed and used bytes, KV utilisation, the stage, requests
 * running and waiting, tokens generated, RSS. GET /llmem/timeline?since=K
 * returns the samples recorded from K on (the newest SRV_SAMPLES), the
 * controller's latest events, and P50/P99 of the latest requests'
 * latencies.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "serve_internal.h"
#include "server_impl.h"

static uint64_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long long size = 0, res = 0;
    int n = fscanf(f, "%llu %llu", &size, &res);
    fclose(f);
    return n == 2 ? res * (uint64_t)sysconf(_SC_PAGESIZE) : 0;
}

typedef struct engine_read {
    llmem_engine *engine;
    llmem_engine_stats es;
    bool ok;
} engine_read;

static void read_engine(void *arg)
{
    engine_read *r = arg;
    r->ok = !llmem_engine_get_stats(r->engine, &r->es);
}

void llmem__srv_sample(llmem_server *s, bool force)
{
    uint64_t now = llmem__now_ns();
    if (!force && now - s->last_sample_ns < 50ull * 1000 * 1000) return;
    s->last_sample_ns = now;
    srv_sample x;
    memset(&x, 0, sizeof x);
    x.t = (double)(now - s->start_ns) * 1e-9;
    llmem_pool_stats ps;
    memset(&ps, 0, sizeof ps);
    ps.struct_size = sizeof ps;
    llmem_pool *pool = s->mc ? llmem_memctl_pool(s->mc) : NULL;
    if (pool && !llmem_pool_get_stats(pool, &ps)) {
        x.reserved = ps.reserved_bytes;
        x.committed = ps.committed_bytes;
        x.used = ps.used_bytes;
    }
    llmem_controller_stats cs;
    memset(&cs, 0, sizeof cs);
    cs.struct_size = sizeof cs;
    llmem_controller *ctl = s->mc ? llmem_memctl_controller(s->mc) : NULL;
    if (ctl && !llmem_controller_get_stats(ctl, &cs)) x.stage = (uint32_t)cs.stage;
    llmem_sched_stats ss;
    memset(&ss, 0, sizeof ss);
    ss.struct_size = sizeof ss;
    if (s->sched && !llmem_sched_get_stats(s->sched, &ss)) {
        x.running = (uint32_t)ss.requests_running;
        x.waiting = (uint32_t)ss.requests_waiting;
        x.swapped = (uint32_t)ss.sequences_swapped;
        x.generated = ss.generation_tokens_total;
        x.kv_usage = ss.kv_usage;
    }
    /* Between steps: the engine's stats walk its sequences, and an HTTP
     * thread's cancellation (a client gone mid-stream) frees one. */
    engine_read er = {.engine = s->engine, .es = {.struct_size = sizeof(llmem_engine_stats)}};
    if (s->engine && s->sched) llmem_sched_while_still(s->sched, read_engine, &er);
    llmem_kv_stats ks;
    memset(&ks, 0, sizeof ks);
    ks.struct_size = sizeof ks;
    llmem_kv *kv = s->engine ? llmem_engine_kv(s->engine) : NULL;
    bool have_ks = kv && !llmem_kv_get_stats(kv, &ks);
    x.kv_util = have_ks && ks.tokens_reserved ? (double)ks.tokens_written / (double)ks.tokens_reserved : -1;
    x.rss = rss_bytes();
    pthread_mutex_lock(&s->snap_mu);
    s->samples[s->nsamples++ % SRV_SAMPLES] = x;
    if (er.ok) s->es = er.es;
    if (have_ks) {
        s->ks = ks;
        s->have_ks = true;
    }
    pthread_mutex_unlock(&s->snap_mu);
}

/* ---- metrics ------------------------------------------------------------------ */

/* vLLM's gauges and counters, named as vLLM names them (schema prefix
 * "vllm:"), and its success counter by finished_reason. */
#define VLLM_STATS_FIELDS(X) \
    X(GAUGE, U64, num_requests_running, "Number of requests in model execution batches.") \
    X(GAUGE, U64, num_requests_waiting, "Number of requests waiting to be processed.") \
    X(GAUGE, U64, num_requests_swapped, "Number of sequences swapped out to host memory.") \
    X(GAUGE, DOUBLE, kv_cache_usage_perc, "KV-cache usage. 1 means 100 percent usage.") \
    X(GAUGE, DOUBLE, gpu_cache_usage_perc, "KV-cache usage (the older name). 1 means 100 percent usage.") \
    X(COUNTER, U64, prefix_cache_queries_total, "Prefix cache queries, in tokens.") \
    X(COUNTER, U64, prefix_cache_hits_total, "Prefix cache hits, in tokens.") \
    X(COUNTER, U64, num_preemptions_total, "Cumulative number of preemptions.") \
    X(COUNTER, U64, prompt_tokens_total, "Number of prefill tokens processed.") \
    X(COUNTER, U64, generation_tokens_total, "Number of generation tokens processed.")
typedef struct vllm_stats {
    size_t struct_size;
    VLLM_STATS_FIELDS(LLMEM_STATS_MEMBER)
} vllm_stats;

#define F(kind, vtype, name, help) LLMEM__STAT_FIELD(vllm_stats, kind, vtype, name, help),
static const llmem_stat_field vllm_fields[] = {VLLM_STATS_FIELDS(F)};
#undef F
LLMEM__SCHEMA(vllm_schema, "vllm", vllm_stats, vllm_fields, "vllm:");

typedef struct vllm_success {
    size_t struct_size;
    uint64_t request_success_total;
} vllm_success;
static const llmem_stat_field success_fields[] = {
    LLMEM__STAT_FIELD(vllm_success, COUNTER, U64, request_success_total,
                      "Count of successfully processed samples, by reason."),
};
LLMEM__SCHEMA(success_schema, "vllm_success", vllm_success, success_fields, "vllm:");

typedef struct process_stats {
    size_t struct_size;
    uint64_t resident_bytes;
} process_stats;
static const llmem_stat_field process_fields[] = {
    LLMEM__STAT_FIELD(process_stats, GAUGE, U64, resident_bytes, "Resident memory of the server process."),
};
LLMEM__SCHEMA(process_schema, "process", process_stats, process_fields, NULL);

#define STEP_MODEL_STATS_FIELDS(X) \
    X(GAUGE, DOUBLE, c0_seconds, "Fitted fixed cost of a scheduler step (the server's latest 4096 steps).") \
    X(GAUGE, DOUBLE, prefill_token_seconds, "Fitted cost of a step per prefilled token.") \
    X(GAUGE, DOUBLE, decode_seq_seconds, "Fitted cost of a step per decoding sequence.") \
    X(GAUGE, DOUBLE, attn_pair_seconds, "Fitted cost of a step per attention query-key pair.") \
    X(GAUGE, DOUBLE, fit_error, "Mean relative error of the fitted step model over its steps.") \
    X(GAUGE, U64, fit_steps, "Steps the step model was fitted on.")
typedef struct step_model_stats {
    size_t struct_size;
    STEP_MODEL_STATS_FIELDS(LLMEM_STATS_MEMBER)
} step_model_stats;
#define F(kind, vtype, name, help) LLMEM__STAT_FIELD(step_model_stats, kind, vtype, name, help),
static const llmem_stat_field step_model_fields[] = {STEP_MODEL_STATS_FIELDS(F)};
#undef F
LLMEM__SCHEMA(step_model_schema, "step_model", step_model_stats, step_model_fields, NULL);

llmem_status llmem_server_step_model(llmem_server *s, llmem_step_model *out, llmem_server_step_fit *fit)
{
    if (!s || !out) return llmem__fail(LLMEM_EINVAL, "serve: step model: null argument");
    if (!s->steps) return llmem__fail(LLMEM_ESTATE, "serve: step model: the server was not built");
    /* Copied out under the lock (at most 230 KiB), fitted outside it: the
     * step thread records under the same lock after every step. */
    llmem_step_shape *sh = malloc(SRV_STEPS * sizeof *sh);
    double *sec = malloc(SRV_STEPS * sizeof *sec);
    if (!sh || !sec) {
        free(sh);
        free(sec);
        return llmem__fail(LLMEM_ENOMEM, "serve: step model: out of memory");
    }
    pthread_mutex_lock(&s->snap_mu);
    uint64_t total = s->nsteps;
    size_t n = total < SRV_STEPS ? (size_t)total : SRV_STEPS;
    for (size_t i = 0; i < n; i++) {
        sh[i] = s->steps[i].shape;
        sec[i] = s->steps[i].seconds;
    }
    pthread_mutex_unlock(&s->snap_mu);
    double measured = 0, err = 0;
    for (size_t i = 0; i < n; i++) measured += sec[i];
    llmem_status st = n < 4 ? llmem__fail(LLMEM_ESTATE, "serve: step model: %zu steps ran, at least 4 needed", n)
                            : llmem_step_model_fit(sh, sec, n, false, out, &err);
    if (st == LLMEM_EINVAL)
        st = llmem__fail(LLMEM_ESTATE, "serve: step model: its %zu steps cannot tell the terms apart (%s)", n,
                         llmem_error_message());
    free(sh);
    free(sec);
    if (!st && fit) {
        llmem_server_step_fit f = {sizeof f, n, total, measured, err};
        size_t fs = llmem_stats_fill_size(fit->struct_size, sizeof f);
        f.struct_size = fs;
        memcpy(fit, &f, fs);
    }
    return st;
}

static void add_vllm(llmem_exporter *ex, llmem_sched *sched, const llmem_sched_stats *ss, const char *model)
{
    llmem_label lab = {"model_name", model};
    vllm_stats v = {sizeof v,
                    ss->requests_running,
                    ss->requests_waiting,
                    ss->sequences_swapped,
                    ss->kv_usage,
                    ss->kv_usage,
                    ss->prefix_cache_queries_total,
                    ss->prefix_cache_hits_total,
                    ss->preemptions_total,
                    ss->prompt_tokens_total,
                    ss->generation_tokens_total};
    llmem_exporter_add(ex, &vllm_schema, &v, &lab, 1);
    const struct { const char *reason; uint64_t n; } why[] = {
        {"stop", ss->samples_stop_total},
        {"length", ss->samples_length_total + ss->samples_context_total + ss->samples_memory_total},
        {"abort", ss->requests_cancelled_total},
    };
    for (size_t i = 0; i < LLMEM_ARRAY_LEN(why); i++) {
        llmem_label l2[] = {{"model_name", model}, {"finished_reason", why[i].reason}};
        vllm_success x = {sizeof x, why[i].n};
        llmem_exporter_add(ex, &success_schema, &x, l2, 2);
    }
    static const struct { llmem_sched_hist_kind k; const char *name, *help; } hists[] = {
        {LLMEM_SCHED_HIST_TTFT, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds."},
        {LLMEM_SCHED_HIST_TPOT, "vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds."},
        {LLMEM_SCHED_HIST_E2E, "vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds."},
        {LLMEM_SCHED_HIST_QUEUE, "vllm:request_queue_time_seconds",
         "Histogram of time spent waiting in the queue in seconds."},
    };
    for (size_t i = 0; i < LLMEM_ARRAY_LEN(hists); i++) {
        llmem_sched_histogram h;
        if (llmem_sched_get_histogram(sched, hists[i].k, &h)) continue;
        llmem_histogram_export e = {hists[i].name, hists[i].help, h.buckets, h.le, h.cumulative, h.count, h.sum};
        llmem_exporter_add_histogram(ex, &e, &lab, 1);
    }
}

/* Everything through the library's exporter (llmem/stats.h): vLLM's
 * names first, then every llmem component, then the process. */
void llmem__srv_metrics(llmem_server *s, llmem__sbuf *b)
{
    llmem_sched_stats ss;
    memset(&ss, 0, sizeof ss);
    ss.struct_size = sizeof ss;
    llmem_sched_get_stats(s->sched, &ss);
    llmem_exporter *ex;
    if (llmem_exporter_create(LLMEM_EXPORT_PROMETHEUS, &ex)) {
        b->failed = true;
        return;
    }
    add_vllm(ex, s->sched, &ss, s->model_name);
    llmem_label lab = {"model_name", s->model_name};
    llmem_server_stats sv;
    memset(&sv, 0, sizeof sv);
    sv.struct_size = sizeof sv;
    llmem_server_get_stats(s, &sv);
    llmem_exporter_add(ex, llmem_server_stats_schema(), &sv, &lab, 1);
    llmem_exporter_add(ex, llmem_sched_stats_schema(), &ss, &lab, 1);
    pthread_mutex_lock(&s->snap_mu);
    llmem_engine_stats es = s->es;
    pthread_mutex_unlock(&s->snap_mu);
    if (es.struct_size) llmem_exporter_add(ex, llmem_engine_stats_schema(), &es, &lab, 1);
    llmem_kv *kv = llmem_engine_kv(s->engine);
    llmem_kv_stats ks;
    memset(&ks, 0, sizeof ks);
    ks.struct_size = sizeof ks;
    if (kv && !llmem_kv_get_stats(kv, &ks)) llmem_exporter_add(ex, llmem_kv_stats_schema(), &ks, &lab, 1);
    llmem_pool_stats ps;
    memset(&ps, 0, sizeof ps);
    ps.struct_size = sizeof ps;
    if (!llmem_pool_get_stats(llmem_memctl_pool(s->mc), &ps))
        llmem_exporter_add(ex, llmem_pool_stats_schema(), &ps, &lab, 1);
    llmem_controller_stats cs;
    memset(&cs, 0, sizeof cs);
    cs.struct_size = sizeof cs;
    if (!llmem_controller_get_stats(llmem_memctl_controller(s->mc), &cs))
        llmem_exporter_add(ex, llmem_controller_stats_schema(), &cs, &lab, 1);
    llmem_tracking_stats ts;
    memset(&ts, 0, sizeof ts);
    ts.struct_size = sizeof ts;
    if (!llmem_tracking_resource_get_stats(s->track, &ts))
        llmem_exporter_add(ex, llmem_tracking_stats_schema(), &ts, &lab, 1);
    /* The fault-injecting resource under the pool (--fault-probability):
     * how many of its commits it failed, so a soak can tell that faults
     * fired. */
    llmem_fault_stats fs;
    memset(&fs, 0, sizeof fs);
    fs.struct_size = sizeof fs;
    if (!llmem_fault_resource_get_stats(s->fault, &fs)) llmem_exporter_add(ex, llmem_fault_stats_schema(), &fs, &lab, 1);
    llmem_step_model sm;
    llmem_server_step_fit sf = {sizeof sf};
    if (!llmem_server_step_model(s, &sm, &sf)) {
        step_model_stats x = {sizeof x, sm.c0, sm.c_prefill_token, sm.c_decode_seq, sm.c_attn_pair, sf.rel_error,
                              sf.steps};
        llmem_exporter_add(ex, &step_model_schema, &x, &lab, 1);
    }
    process_stats pr = {sizeof pr, rss_bytes()};
    llmem_exporter_add(ex, &process_schema, &pr, NULL, 0);
    size_t len = 0;
    llmem_status st = llmem_exporter_render(ex, NULL, 0, &len);
    char *buf = st == LLMEM_OK || st == LLMEM_ERANGE ? malloc(len + 1) : NULL;
    if (buf && !llmem_exporter_render(ex, buf, len + 1, &len)) llmem__sbuf_puts(b, buf);
    else b->failed = true;
    free(buf);
    llmem_exporter_destroy(ex);
}

/* ---- timeline JSON --------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p)
{
    if (!n) return -1;
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

void llmem__srv_timeline_json(llmem_server *s, uint64_t since, llmem__sbuf *b)
{
    pthread_mutex_lock(&s->snap_mu);
    uint64_t total = s->nsamples;
    uint64_t from = total > SRV_SAMPLES ? total - SRV_SAMPLES : 0;
    if (since > from) from = since < total ? since : total;
    llmem__sbuf_printf(b, "{\"model\":");
    llmem__json_str(b, s->model_name, strlen(s->model_name));
    llmem__sbuf_printf(b, ",\"next\":%llu,\"samples\":[", (unsigned long long)total);
    for (uint64_t i = from; i < total; i++) {
        const srv_sample *x = &s->samples[i % SRV_SAMPLES];
        llmem__sbuf_printf(b,
                          "%s{\"t\":%.3f,\"stage\":\"%s\",\"reserved\":%llu,\"committed\":%llu,\"used\":%llu,"
                          "\"kv_util\":%.4f,\"kv_usage\":%.4f,\"running\":%u,\"waiting\":%u,\"swapped\":%u,"
                          "\"generated\":%llu,\"rss\":%llu}",
                          i > from ? "," : "", x->t, llmem_stage_name((llmem_stage)x->stage),
                          (unsigned long long)x->reserved, (unsigned long long)x->committed,
                          (unsigned long long)x->used, x->kv_util, x->kv_usage, x->running, x->waiting, x->swapped,
                          (unsigned long long)x->generated, (unsigned long long)x->rss);
    }
    pthread_mutex_unlock(&s->snap_mu);
    llmem__sbuf_puts(b, "],\"events\":[");
    /* The controller's latest decisions (its ring holds kept = total -
     * dropped, oldest first). */
    llmem_controller *ctl = llmem_memctl_controller(s->mc);
    llmem_controller_stats cs;
    memset(&cs, 0, sizeof cs);
    cs.struct_size = sizeof cs;
    if (ctl && !llmem_controller_get_stats(ctl, &cs)) {
        size_t kept = (size_t)(cs.events_total - cs.events_dropped) + 8;
        llmem_controller_event *ev = malloc(kept * sizeof *ev);
        size_t nev = ev ? llmem_controller_events(ctl, ev, kept) : 0;
        size_t first = nev > 64 ? nev - 64 : 0;
        for (size_t i = first; i < nev; i++)
            llmem__sbuf_printf(b, "%s{\"t\":%.3f,\"action\":\"%s\",\"stage\":\"%s\",\"before\":%llu,\"after\":%llu}",
                              i > first ? "," : "",
                              ev[i].time_ns > s->start_ns ? (double)(ev[i].time_ns - s->start_ns) * 1e-9 : 0.0,
                              llmem_controller_action_name(ev[i].action), llmem_stage_name(ev[i].stage),
                              (unsigned long long)ev[i].bytes_before, (unsigned long long)ev[i].bytes_after);
        free(ev);
    }
    llmem__sbuf_puts(b, "]");
    /* Latency percentiles over the latest requests. */
    pthread_mutex_lock(&s->lat_mu);
    size_t n = s->nlat < SRV_LATENCIES ? (size_t)s->nlat : SRV_LATENCIES;
    double *v = n ? malloc(4 * n * sizeof *v) : NULL;
    size_t nt = 0;
    if (v) {
        for (size_t i = 0; i < n; i++) {
            v[i] = s->lat[i].ttft;
            v[n + i] = s->lat[i].e2e;
            v[2 * n + i] = s->lat[i].queue;
            if (s->lat[i].tpot >= 0) v[3 * n + nt++] = s->lat[i].tpot;
        }
    }
    pthread_mutex_unlock(&s->lat_mu);
    if (v) {
        qsort(v, n, sizeof *v, cmp_double);
        qsort(v + n, n, sizeof *v, cmp_double);
        qsort(v + 2 * n, n, sizeof *v, cmp_double);
        qsort(v + 3 * n, nt, sizeof *v, cmp_double);
    }
    llmem__sbuf_printf(b,
                      ",\"latency\":{\"requests\":%zu,\"ttft_p50\":%.6f,\"ttft_p99\":%.6f,\"tpot_p50\":%.6f,"
                      "\"tpot_p99\":%.6f,\"e2e_p50\":%.6f,\"e2e_p99\":%.6f,\"queue_p50\":%.6f,\"queue_p99\":%.6f}",
                      n, v ? pct(v, n, .5) : -1, v ? pct(v, n, .99) : -1, v ? pct(v + 3 * n, nt, .5) : -1,
                      v ? pct(v + 3 * n, nt, .99) : -1, v ? pct(v + n, n, .5) : -1, v ? pct(v + n, n, .99) : -1,
                      v ? pct(v + 2 * n, n, .5) : -1, v ? pct(v + 2 * n, n, .99) : -1);
    free(v);
    pthread_mutex_lock(&s->mu);
    llmem__sbuf_printf(b, ",\"in_flight\":%u}", s->ninflight);
    pthread_mutex_unlock(&s->mu);
}
