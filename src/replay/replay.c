/*
 * replay.c - a request trace through the scheduler over a simulated engine
 * (llmem/replay.h).
 *
 * Set-up: a sim-device resource (or the caller's), a pool over it (with the
 * controller and its predictor when asked: llmem_memctl), a llmem_kv over
 * the pool, a simulated scheduler over the KV with the step model. The
 * loop: submit what has arrived by the simulated clock, step, account the
 * step (on_step: KV utilisation, concurrency and committed device bytes
 * while the step ran, before its finished sequences free their KV), collect
 * what finished (FINISH events name the requests; their figures are read
 * and the records released at once, so memory stays bounded by the
 * requests in flight). With nothing to run the clock jumps to the next
 * arrival; with the controller the jump stops once at the end of the idle
 * decay so the shrink lands where it would.
 *
 * Percentiles are nearest-rank over every completed request's TTFT, TPOT
 * ((finish - first token) / (generated - 1), for two tokens or more) and
 * E2E; utilisation and concurrency are weighted by step time.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llmem/memctl.h"
#include "llmem/pool.h"
#include "llmem/replay.h"
#include "llmem/sched.h"
#include "llmem/sim_resource.h"

#include "../core/internal.h"

llmem_replay_options llmem_replay_options_default(void)
{
    llmem_replay_options o;
    memset(&o, 0, sizeof o);
    o.strategy = LLMEM_KV_PAGED;
    o.kv_elem_bytes = 2;
    o.weight_elem_bytes = 2;
    o.block_tokens = 16;
    o.slab_blocks = 2;
    o.speedup = 1.0;
    o.idle_decay_ms = 1000;
    o.max_batch = 256;
    o.max_prefill_tokens = 8192;
    /* The roofline's own defaults (an H100), so the two never disagree. */
    const llmem_step_model rf = llmem_step_model_roofline(NULL, o.weight_elem_bytes, o.kv_elem_bytes);
    o.bandwidth = rf.bandwidth;
    o.peak_flops = rf.peak_flops;
    o.mfu = rf.mfu;
    o.step_overhead_s = rf.overhead_s;
    o.prompt_scale = 1.0;
    o.output_scale = 1.0;
    return o;
}

typedef struct rp {
    const llmem_replay_options *o;
    llmem_replay_result *r;
    llmem_resource *dev;
    llmem_pool *pool;
    llmem_kv *kv;
    llmem_controller *ctl;
    llmem_sched *s;
    double kv_tok;
    /* finished requests, from FINISH events */
    llmem_sched_req *done;
    size_t ndone, done_cap;
    bool oom;
    llmem_step_shape *shapes;   /* fit_steps: every step's shape and time */
    double *secs;
    size_t nshapes, shapes_cap;
    uint64_t t0_ns;             /* the trace's zero on the scheduler's clock (0 simulated; the start on an engine) */
    /* figures */
    double *ttft, *tpot, *e2e;
    size_t nttft, ntpot, ne2e;
    double busy_t, util_acc, conc_acc, committed_acc;
    uint64_t peak_committed;
} rp;

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of a sorted array. */
static double pct(const double *v, size_t n, double p)
{
    if (!n) return 0;
    size_t k = (size_t)ceil(p * (double)n);
    return v[k ? k - 1 : 0];
}

/* The controller's clock: the scheduler's (0 until it exists). */
static uint64_t rp_clock(void *ctx)
{
    const rp *x = ctx;
    return x->s ? llmem_sched_now_ns(x->s) : 0;
}

static uint64_t committed(const rp *x)
{
    llmem_resource_stats rs = {sizeof rs};
    llmem_resource_get_stats(x->dev, &rs);
    return rs.committed_bytes;
}

static void sample(rp *x, llmem_stage st, uint64_t t_ns)
{
    if (!x->o->timeline) return;
    llmem_pool_stats ps = {sizeof ps};
    llmem_kv_stats ks = {sizeof ks};
    llmem_pool_get_stats(x->pool, &ps);
    llmem_kv_get_stats(x->kv, &ks);
    llmem_timeline_sample smp = {t_ns, st, ps.reserved_bytes, ps.committed_bytes, ps.used_bytes,
                                 ks.bytes_reserved ? (double)ks.tokens_written * x->kv_tok / (double)ks.bytes_reserved : -1};
    llmem_timeline_record(x->o->timeline, &smp);
}

static void on_step(void *ctx, const llmem_sched_step_report *rep)
{
    rp *x = ctx;
    double dt = rep->seconds;
    llmem_kv_stats ks = {sizeof ks};
    llmem_kv_get_stats(x->kv, &ks);
    if (ks.bytes_reserved) x->util_acc += dt * (double)ks.tokens_written * x->kv_tok / (double)ks.bytes_reserved;
    x->conc_acc += dt * (double)rep->running;
    x->busy_t += dt;
    uint64_t c = committed(x);
    x->committed_acc += (double)c * dt;
    if (c > x->peak_committed) x->peak_committed = c;
    if (rep->running > x->r->max_concurrency) x->r->max_concurrency = rep->running;
    sample(x, rep->prefill_tokens ? LLMEM_STAGE_PREFILL : LLMEM_STAGE_DECODE, rep->start_ns);
    if (x->o->fit_steps) {
        if (x->nshapes == x->shapes_cap) {
            size_t ncap = x->shapes_cap ? 2 * x->shapes_cap : 1024;
            llmem_step_shape *ns = realloc(x->shapes, ncap * sizeof *ns);
            if (ns) x->shapes = ns;
            double *nt = ns ? realloc(x->secs, ncap * sizeof *nt) : NULL;
            if (nt) x->secs = nt;
            if (!ns || !nt) {
                x->oom = true;
                return;
            }
            x->shapes_cap = ncap;
        }
        llmem_step_shape sh = {rep->sequences, rep->prefill_tokens, rep->decode_tokens, rep->attn_pairs,
                               rep->decode_kv_tokens, 0};
        x->shapes[x->nshapes] = sh;
        x->secs[x->nshapes++] = rep->seconds;
    }
}

static bool on_event(void *ctx, const llmem_sched_event *ev)
{
    rp *x = ctx;
    if (ev->kind != LLMEM_SCHED_EV_FINISH) return false;
    if (x->ndone == x->done_cap) {
        size_t ncap = x->done_cap ? 2 * x->done_cap : 256;
        llmem_sched_req *n = realloc(x->done, ncap * sizeof *n);
        if (!n) {
            x->oom = true;
            return false;
        }
        x->done = n;
        x->done_cap = ncap;
    }
    x->done[x->ndone++] = ev->req;
    return false;
}

/* Read and release what finished. */
static llmem_status collect(rp *x)
{
    for (size_t i = 0; i < x->ndone; i++) {
        llmem_sched_info info;
        llmem_status st = llmem_sched_get_info(x->s, x->done[i], 0, &info);
        if (st) return st;
        llmem_replay_result *r = x->r;
        r->tokens_generated += info.generated;
        if (info.finish == LLMEM_SCHED_FINISH_REJECTED) {
            r->requests_rejected++;
        } else if (info.finish == LLMEM_SCHED_FINISH_ERROR || info.finish == LLMEM_SCHED_FINISH_CANCELLED) {
            return llmem__fail(LLMEM_ESTATE, "replay: a request ended %s", llmem_sched_finish_name(info.finish));
        } else {
            r->requests_completed++;
            if (info.finish != LLMEM_SCHED_FINISH_LENGTH) r->requests_truncated++;
            double fin = (double)info.finish_ns * 1e-9, arr = (double)info.arrival_ns * 1e-9;
            x->e2e[x->ne2e++] = fin - arr;
            if (info.first_token_ns) x->ttft[x->nttft++] = (double)info.first_token_ns * 1e-9 - arr;
            if (info.generated > 1)
                x->tpot[x->ntpot++] = (fin - (double)info.first_token_ns * 1e-9) / (double)(info.generated - 1);
        }
        if ((st = llmem_sched_release(x->s, x->done[i]))) return st;
    }
    x->ndone = 0;
    return LLMEM_OK;
}

/* Nothing to run until `until`: IDLE; with the controller, the clock stops
 * once where the idle decay ends (the controller shrinks there). */
static llmem_status idle_until(rp *x, uint64_t until)
{
    uint64_t start = llmem_sched_now_ns(x->s);
    sample(x, LLMEM_STAGE_IDLE, start);
    uint64_t decay = x->ctl ? (uint64_t)x->o->idle_decay_ms * 1000000ull : 0;
    uint64_t c0 = committed(x);
    llmem_status st;
    if (x->ctl && until - start > decay) {
        uint64_t mid = start + decay + 1000;
        if ((st = llmem_sched_advance(x->s, mid))) return st;
        x->committed_acc += (double)c0 * (double)decay * 1e-9;
        sample(x, LLMEM_STAGE_IDLE, mid);
        uint64_t c1 = committed(x);
        if ((st = llmem_sched_advance(x->s, until))) return st;
        x->committed_acc += (double)c1 * (double)(until - mid) * 1e-9;
    } else {
        if ((st = llmem_sched_advance(x->s, until))) return st;
        x->committed_acc += (double)c0 * (double)(until - start) * 1e-9;
    }
    sample(x, LLMEM_STAGE_IDLE, until); /* the flat stretch, not a ramp to the next step */
    return LLMEM_OK;
}

/* On the engine, nothing to run until `until` (wall clock): sleep, the
 * scheduler told of it (IDLE) by an empty step. */
static llmem_status wait_until(rp *x, uint64_t until)
{
    llmem_status st = llmem_sched_step(x->s, NULL);
    uint64_t now = llmem_sched_now_ns(x->s);
    if (!st && until > now) {
        struct timespec ts = {(time_t)((until - now) / 1000000000ull), (long)((until - now) % 1000000000ull)};
        while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {}
    }
    return st;
}

/* Synthetic token ids (below 2^31): a declared shared prefix gets the same
 * ids in every request naming it; everything else is unique to its request. */
static void tokens_of(const llmem_trace_request *tr, uint32_t index, uint32_t n, uint32_t prefix, uint32_t vocab,
                      int32_t *out)
{
    for (uint32_t pos = 0; pos < n; pos++) {
        uint32_t t = tr->prefix_id && pos < prefix ? (tr->prefix_id * 2654435761u + pos) & 0x7fffffff
                                                   : ((index + 1u) * 40503u + pos * 97u + 0x40000000u) & 0x7fffffff;
        out[pos] = (int32_t)(t % vocab);
    }
}

/* A length under the scale, at least 1 (0 stays 0: rejected as before). */
static uint32_t scaled(uint32_t n, double scale)
{
    if (!n || scale == 1.0) return n;
    double v = floor((double)n * scale + 0.5);
    return v < 1 ? 1 : v > 4e9 ? 4000000000u : (uint32_t)v;
}

/* The scheduler's options, the same for both backends. */
static llmem_sched_options sched_options(rp *x)
{
    llmem_sched_options sco = llmem_sched_options_default();
    sco.max_batch = x->o->max_batch;
    sco.max_step_tokens = x->o->max_prefill_tokens;
    sco.controller = x->ctl;
    sco.on_event = on_event;
    sco.event_ctx = x;
    sco.on_step = on_step;
    sco.step_ctx = x;
    sco.check = x->o->check;
    return sco;
}

/* On a real engine: its KV, its pool's resource for the committed bytes. */
static llmem_status setup_engine(rp *x)
{
    x->kv = llmem_engine_kv(x->o->engine);
    x->pool = llmem_engine_pool(x->o->engine);
    if (!x->kv || !x->pool) return llmem__fail(LLMEM_ENOTSUP, "replay: the engine must use llmem's KV (not ALLOC_MALLOC)");
    x->dev = llmem_pool_get_resource(x->pool);
    x->kv_tok = (double)llmem_kv_token_total_bytes(x->kv);
    llmem_sched_options sco = sched_options(x);
    return llmem_sched_create_engine(x->o->engine, &sco, &x->s);
}

static llmem_status setup(rp *x, llmem_resource **own_dev, llmem_memctl **mc)
{
    const llmem_replay_options *o = x->o;
    if (o->engine) return setup_engine(x);
    const llmem_shape *sh = &o->shape;
    uint32_t ctx = o->max_seq_len ? o->max_seq_len : sh->max_ctx;
    llmem_status st;
    x->dev = o->resource;
    if (!x->dev) {
        /* The budget, plus room for superblock rounding. */
        llmem_sim_options so = llmem_sim_options_default();
        so.name = "replay-kv";
        so.capacity = o->kv_budget + o->kv_budget / 8 + ((size_t)1 << 30);
        so.discard_data = true; /* bucket growth copies are counted, not performed */
        if ((st = llmem_sim_resource_create(&so, own_dev))) return st;
        x->dev = *own_dev;
    }
    llmem_kv_options ko = llmem_kv_options_default();
    ko.name = "replay";
    ko.strategy = o->strategy;
    ko.layers = sh->layers;
    ko.kv_heads = sh->kv_heads;
    ko.head_dim = sh->head_dim;
    ko.dtype = o->kv_elem_bytes == 4 ? LLMEM_KV_F32 : o->kv_elem_bytes == 1 ? LLMEM_KV_I8 : LLMEM_KV_F16;
    ko.block_tokens = o->block_tokens;
    ko.max_seq_len = ctx;
    ko.budget_bytes = o->kv_budget;
    ko.prefix_cache = o->prefix_cache && o->strategy == LLMEM_KV_PAGED;
    /* Every running sequence leaves its last slab half empty on average, so
     * the slab size bounds utilisation (see BENCHMARKS.md). */
    size_t block_bytes = 2ull * o->block_tokens * sh->kv_heads * sh->head_dim * o->kv_elem_bytes;
    ko.slab_bytes = block_bytes * o->slab_blocks;
    if (o->controller) {
        llmem_memctl_options mo = llmem_memctl_options_default();
        mo.name = "replay-kv";
        mo.resource = x->dev;
        mo.pool_decay_ms = o->pool_decay_ms;
        if ((st = llmem_memctl_kv_predictor_options(sh, &ko, &mo.predictor))) return st;
        mo.controller.idle_decay_ms = o->idle_decay_ms;
        mo.controller.clock = rp_clock;
        mo.controller.clock_ctx = x;
        if ((st = llmem_memctl_create(&mo, mc))) return st;
        x->pool = llmem_memctl_pool(*mc);
        x->ctl = llmem_memctl_controller(*mc);
    } else {
        llmem_pool_options po = llmem_pool_options_default();
        po.name = "replay-kv";
        po.resource = x->dev;
        po.purge = LLMEM_POOL_PURGE_MANUAL;
        po.decay_ms = o->pool_decay_ms;
        if ((st = llmem_pool_create(&po, &x->pool))) return st;
    }
    ko.pool = x->pool;
    if ((st = llmem_kv_create(&ko, &x->kv))) return st;
    x->kv_tok = (double)llmem_kv_token_total_bytes(x->kv);
    llmem_sched_sim_options so = llmem_sched_sim_options_default();
    so.kv = x->kv;
    so.device = x->dev;
    so.vocab = 0x7fffffff; /* the synthetic ids */
    if (o->model) {
        so.model = *o->model;
    } else {
        so.model = llmem_step_model_roofline(sh, o->weight_elem_bytes, o->kv_elem_bytes);
        so.model.bandwidth = o->bandwidth;
        so.model.peak_flops = o->peak_flops;
        so.model.mfu = o->mfu;
        so.model.overhead_s = o->step_overhead_s;
    }
    if (o->vocab) so.vocab = o->vocab;
    llmem_sched_options sco = sched_options(x);
    return llmem_sched_create_sim(&so, &sco, &x->s);
}

static llmem_status drive(rp *x, const llmem_trace *trace, size_t n)
{
    const llmem_replay_options *o = x->o;
    llmem_replay_result *r = x->r;
    int32_t *tok = NULL;
    size_t tokcap = 0;
    size_t next = 0;
    uint64_t steps = 0, idle_steps = 0;
    llmem_status st = LLMEM_OK;
    uint32_t vocab = o->vocab ? o->vocab : 0x7fffffff;
    if (o->engine) {
        llmem_engine_info info;
        if ((st = llmem_engine_get_info(o->engine, &info))) return st;
        if (!o->vocab || o->vocab > info.vocab) vocab = info.vocab;
    }
    uint64_t t0 = x->t0_ns; /* the trace's zero on the scheduler's clock */
    double base_s = n ? trace->req[0].arrival_s : 0; /* 0 unless first_request skipped some */
    while (!st && (next < n || llmem_sched_pending(x->s))) {
        uint64_t now = llmem_sched_now_ns(x->s);
        if (!llmem_sched_pending(x->s) && next < n) {
            uint64_t at = t0 + (uint64_t)llround((trace->req[next].arrival_s - base_s) / o->speedup * 1e9);
            if (at > now && (st = o->engine ? wait_until(x, at) : idle_until(x, at))) break;
            now = llmem_sched_now_ns(x->s);
        }
        for (; next < n; next++) {
            const llmem_trace_request *tr = &trace->req[next];
            uint64_t at = t0 + (uint64_t)llround((tr->arrival_s - base_s) / o->speedup * 1e9);
            if (at > now) break;
            uint32_t plen = scaled(tr->prompt_tokens, o->prompt_scale);
            uint32_t olen = scaled(tr->output_tokens, o->output_scale);
            if (plen > tokcap) {
                free(tok);
                tokcap = plen;
                if (!(tok = malloc(tokcap * sizeof *tok))) {
                    st = llmem__fail(LLMEM_ENOMEM, "replay: no memory for a %u-token prompt", plen);
                    break;
                }
            }
            tokens_of(tr, (uint32_t)next, plen, scaled(tr->prefix_tokens, o->prompt_scale), vocab, tok);
            llmem_sched_params p = llmem_sched_params_default();
            p.prompt = tok;
            p.prompt_len = plen;
            p.max_tokens = olen ? olen : 1;
            p.arrival_ns = at ? at : 1;
            llmem_sched_req id;
            llmem_status sst = llmem_sched_submit(x->s, &p, &id);
            if (sst == LLMEM_ERANGE || sst == LLMEM_EINVAL) r->requests_rejected++; /* never fits the context */
            else if (sst) st = sst;
        }
        if (st) break;
        llmem_sched_step_report rep;
        if ((st = llmem_sched_step(x->s, &rep))) break;
        if (x->oom) st = llmem__fail(LLMEM_ENOMEM, "replay: out of host memory");
        if (!st) st = collect(x);
        if (rep.sequences) steps++;
        idle_steps = rep.sequences || rep.finished ? 0 : idle_steps + 1;
        if (!st && idle_steps > 100000) st = llmem__fail(LLMEM_ESTATE, "replay: requests wait and nothing runs");
        if (o->progress && steps % 512 == 0 && rep.sequences)
            o->progress(o->progress_ctx, r->requests_completed + r->requests_rejected, n,
                        (double)llmem_sched_now_ns(x->s) * 1e-9);
    }
    free(tok);
    return st;
}

llmem_status llmem_replay_run(const llmem_trace *trace, const llmem_replay_options *o, llmem_replay_result *r)
{
    if (!trace || !o || !r) return llmem__fail(LLMEM_EINVAL, "replay: null argument");
    memset(r, 0, sizeof *r);
    static const char *names[] = {"paged", "static", "buckets", "contiguous"};
    if ((unsigned)o->strategy >= LLMEM_ARRAY_LEN(names))
        return llmem__fail(LLMEM_EINVAL, "replay: unknown KV strategy %d", (int)o->strategy);
    r->strategy = o->engine ? "engine" : names[o->strategy];
    if (!o->kv_budget && !o->engine) return llmem__fail(LLMEM_EINVAL, "replay: a KV budget is required");
    if ((!o->engine && (!o->shape.layers || !o->shape.kv_heads || !o->shape.head_dim || !o->block_tokens)) ||
        !(o->speedup > 0) || !(o->prompt_scale > 0) || !(o->output_scale > 0))
        return llmem__fail(LLMEM_EINVAL, "replay: incomplete shape or options");
    if (o->first_request >= trace->count && trace->count)
        return llmem__fail(LLMEM_EINVAL, "replay: first request %zu of %zu", o->first_request, trace->count);
    llmem_trace sub = *trace;
    sub.req += o->first_request;
    sub.count -= o->first_request;
    trace = &sub;
    size_t n = trace->count;
    if (o->max_requests && o->max_requests < n) n = o->max_requests;
    uint64_t wall0 = llmem__now_ns();
    rp x;
    memset(&x, 0, sizeof x);
    x.o = o;
    x.r = r;
    llmem_resource *own_dev = NULL;
    llmem_memctl *mc = NULL;
    llmem_status st = LLMEM_OK;
    x.ttft = malloc((n + 1) * sizeof(double));
    x.tpot = malloc((n + 1) * sizeof(double));
    x.e2e = malloc((n + 1) * sizeof(double));
    if (!x.ttft || !x.tpot || !x.e2e) st = llmem__fail(LLMEM_ENOMEM, "replay: no memory for %zu requests' figures", n);
    if (!st) st = setup(&x, &own_dev, &mc);
    if (!st && o->engine) x.t0_ns = llmem_sched_now_ns(x.s);
    r->requests_total = n;
    if (!st) st = drive(&x, trace, n);
    if (!st) {
        llmem_kv_stats ks = {sizeof ks};
        llmem_kv_get_stats(x.kv, &ks);
        llmem_sched_stats ss = {sizeof ss};
        llmem_sched_get_stats(x.s, &ss);
        r->peak_reserved_bytes = ks.bytes_reserved_peak;
        r->preemptions = ss.preemptions_total;
        r->steps = ss.steps_total;
        r->prompt_tokens = ss.computed_tokens_total;
        r->prefix_hit_rate = ss.prefix_cache_queries_total
                                 ? (double)ss.prefix_cache_hits_total / (double)ss.prefix_cache_queries_total
                                 : 0;
        r->kv_utilization = x.busy_t > 0 ? x.util_acc / x.busy_t : 0;
        r->mean_concurrency = x.busy_t > 0 ? x.conc_acc / x.busy_t : 0;
        qsort(x.ttft, x.nttft, sizeof(double), cmp_d);
        qsort(x.tpot, x.ntpot, sizeof(double), cmp_d);
        qsort(x.e2e, x.ne2e, sizeof(double), cmp_d);
        r->ttft_p50_s = pct(x.ttft, x.nttft, 0.50);
        r->ttft_p99_s = pct(x.ttft, x.nttft, 0.99);
        r->tpot_p50_s = pct(x.tpot, x.ntpot, 0.50);
        r->tpot_p99_s = pct(x.tpot, x.ntpot, 0.99);
        r->e2e_p50_s = pct(x.e2e, x.ne2e, 0.50);
        r->e2e_p99_s = pct(x.e2e, x.ne2e, 0.99);
        r->sim_time_s = (double)(llmem_sched_now_ns(x.s) - x.t0_ns) * 1e-9;
        r->throughput_tokens_per_s = r->sim_time_s > 0 ? (double)r->tokens_generated / r->sim_time_s : 0;
        llmem_resource_stats rst = {sizeof rst};
        llmem_resource_get_stats(x.dev, &rst);
        r->resource_calls =
            rst.map_calls_total + rst.unmap_calls_total + rst.commit_calls_total + rst.decommit_calls_total;
        r->peak_committed_bytes = x.peak_committed;
        r->mean_committed_bytes = r->sim_time_s > 0 ? x.committed_acc / r->sim_time_s : 0;
        if (x.ctl) {
            llmem_controller_stats cs = {sizeof cs};
            llmem_controller_get_stats(x.ctl, &cs);
            r->controller_reserves = cs.reserves_total;
            r->controller_grows = cs.grows_total;
            r->controller_shrinks = cs.shrinks_total;
            if (o->timeline) st = llmem_memctl_add_decisions(x.ctl, o->timeline);
        }
        if (o->fit_steps && !st) st = llmem_step_model_fit(x.shapes, x.secs, x.nshapes, false, &r->step_fit, &r->step_fit_error);
    }
    /* Keep the first error's message over what teardown may say. */
    char msg[256] = "";
    if (st) snprintf(msg, sizeof msg, "%s", llmem_error_message());
    llmem_sched_destroy(x.s);
    x.s = NULL;
    if (!o->engine) {
        llmem_kv_destroy(x.kv);
        if (mc) llmem_memctl_destroy(mc);
        else llmem_pool_destroy(x.pool);
    }
    llmem_resource_destroy(own_dev);
    free(x.ttft);
    free(x.tpot);
    free(x.e2e);
    free(x.done);
    free(x.shapes);
    free(x.secs);
    r->wall_time_s = (double)(llmem__now_ns() - wall0) * 1e-9;
    if (st) llmem__fail(st, "%s", msg);
    return st;
}
