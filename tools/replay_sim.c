/*
 * replay_sim.c - the replay scheduler and its simulated clock (see
 * replay_sim.h for the policy and the step-time model).
 *
 * Requests wait in a deque (preempted ones return to its head) and run in
 * an array kept in admission order, so the victim of a preemption is the
 * last element. KV memory is a llmem_kv over a pool over a sim-device
 * resource sized to the budget plus room for rounding (or the caller's
 * resource): every KV byte is really allocated and freed, none is touched.
 */
#include "replay_sim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "llmem/llmem.h"
#include "tool_util.h"

typedef struct rq {
    const llmem_trace_request *tr;
    double arrival;        /* simulated seconds: the trace's, divided by speedup */
    uint32_t index;
    uint32_t prefill;      /* tokens to prefill at (re)admission */
    uint32_t generated;
    bool started, admitted_now;
    double first_t;
    llmem_kv_seq seq;
} rq;

void replay_options_default(replay_options *o)
{
    memset(o, 0, sizeof *o);
    o->strategy = LLMEM_KV_PAGED;
    o->kv_elem_bytes = 2;
    o->weight_elem_bytes = 2;
    o->block_tokens = 16;
    o->slab_blocks = 2;
    o->speedup = 1.0;
    o->idle_decay_ms = 1000;
    o->max_batch = 256;
    o->max_prefill_tokens = 8192;
    o->bandwidth = 3.35e12;
    o->peak_flops = 989e12;
    o->mfu = 0.5;
    o->step_overhead_s = 0.0003;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

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

/* Synthetic token ids: a declared shared prefix gets the same ids in every
 * request that names it; everything else is unique to the request. */
static int32_t token_at(const rq *r, uint32_t pos)
{
    if (r->tr->prefix_id && pos < r->tr->prefix_tokens) return (int32_t)((r->tr->prefix_id * 2654435761u + pos) & 0x7fffffff);
    return (int32_t)(((r->index + 1u) * 40503u + pos * 97u + 0x40000000u) & 0x7fffffff);
}

typedef struct sim {
    const replay_options *o;
    llmem_kv *kv;
    rq *reqs;
    size_t n;
    uint32_t *waitq; /* deque of request indexes */
    size_t wq_head, wq_len, wq_cap;
    uint32_t *run;
    size_t nrun;
    int32_t *tokbuf;
    size_t tokcap;
    double t;
    replay_result *r;
    double *ttft, *tpot, *e2e;
    size_t nttft, ntpot, ne2e;
    double busy_t, util_acc, conc_acc;
    llmem_pool *pool;
    llmem_resource *dev;            /* the KV's device memory: under the pool, and CONTIGUOUS's own */
    llmem_controller *ctl;
    llmem_timeline *tl;
    double committed_acc;           /* committed bytes x simulated seconds */
    uint64_t peak_committed;
    uint64_t hits, lookups;
    bool oom; /* host memory for the simulation itself ran out */
} sim;

static void wq_push_front(sim *s, uint32_t i)
{
    s->wq_head = (s->wq_head + s->wq_cap - 1) % s->wq_cap;
    s->waitq[s->wq_head] = i;
    s->wq_len++;
}

static void wq_push_back(sim *s, uint32_t i)
{
    s->waitq[(s->wq_head + s->wq_len) % s->wq_cap] = i;
    s->wq_len++;
}

static uint32_t wq_pop(sim *s)
{
    uint32_t i = s->waitq[s->wq_head];
    s->wq_head = (s->wq_head + 1) % s->wq_cap;
    s->wq_len--;
    return i;
}

static const int32_t *tokens_for(sim *s, const rq *r, uint32_t n)
{
    if (n > s->tokcap) {
        free(s->tokbuf);
        s->tokcap = n;
        s->tokbuf = malloc(n * sizeof *s->tokbuf);
        if (!s->tokbuf) {
            s->tokcap = 0;
            s->oom = true;
            return NULL;
        }
    }
    for (uint32_t p = 0; p < n; p++) s->tokbuf[p] = token_at(r, p);
    return s->tokbuf;
}

static void finish(sim *s, rq *q, bool truncated)
{
    llmem_kv_seq_free(s->kv, q->seq);
    q->seq = 0;
    if (truncated) s->r->requests_truncated++;
    s->r->requests_completed++;
    s->e2e[s->ne2e++] = s->t - q->arrival;
    if (q->generated > 1) s->tpot[s->ntpot++] = (s->t - q->first_t) / (double)(q->generated - 1);
}

/* Try to admit request q: a sequence with its prompt (prefix-matched when
 * the cache is on). False if KV memory is short now. */
static bool admit(sim *s, rq *q, uint32_t *new_tokens)
{
    llmem_kv_seq seq;
    if (llmem_kv_seq_create(s->kv, 0, &seq)) return false;
    const int32_t *tok = NULL;
    if (s->o->prefix_cache && !(tok = tokens_for(s, q, q->prefill))) {
        llmem_kv_seq_free(s->kv, seq);
        return false;
    }
    size_t matched = 0;
    if (tok && q->tr->prefix_id) {
        llmem_kv_seq_match_prefix(s->kv, seq, tok, q->prefill, &matched);
    }
    if (llmem_kv_seq_append(s->kv, seq, q->prefill - matched, tok ? tok + matched : NULL, NULL)) {
        llmem_kv_seq_free(s->kv, seq);
        return false;
    }
    if (tok) { /* counted once the request is in: a refused admission is looked up again */
        s->hits += matched;
        s->lookups += q->prefill;
    }
    q->seq = seq;
    *new_tokens = (uint32_t)(q->prefill - matched);
    return true;
}

static void preempt(sim *s, size_t run_index)
{
    rq *v = &s->reqs[s->run[run_index]];
    llmem_kv_seq_free(s->kv, v->seq);
    v->seq = 0;
    v->prefill = v->tr->prompt_tokens + v->generated; /* recomputed at readmission */
    memmove(&s->run[run_index], &s->run[run_index + 1], (s->nrun - run_index - 1) * sizeof *s->run);
    s->nrun--;
    wq_push_front(s, v->index);
    s->r->preemptions++;
}

/* The controller's clock: the simulation's. */
static uint64_t sim_clock(void *ctx)
{
    const sim *s = ctx;
    return (uint64_t)llround(s->t * 1e9);
}

/* Committed device bytes: the resource's figure, which is the pool's for
 * the strategies that allocate from it, and counts CONTIGUOUS's direct
 * reservations too. */
static uint64_t dev_committed(const sim *s)
{
    llmem_resource_stats rs = {sizeof rs};
    llmem_resource_get_stats(s->dev, &rs);
    return rs.committed_bytes;
}

/* Account the committed device bytes over dt simulated seconds (from now). */
static void account(sim *s, double dt)
{
    uint64_t c = dev_committed(s);
    s->committed_acc += (double)c * dt;
    if (c > s->peak_committed) s->peak_committed = c;
}

static void stage(sim *s, llmem_stage st, uint32_t batch, uint64_t tokens)
{
    if (!s->ctl) return;
    llmem_stage_event ev = {st, batch, tokens, sim_clock(s)};
    llmem_controller_on_stage(s->ctl, &ev);
}

static void timeline_sample(sim *s, llmem_stage st)
{
    if (!s->tl) return;
    llmem_pool_stats ps = {sizeof ps};
    llmem_kv_stats ks = {sizeof ks};
    llmem_pool_get_stats(s->pool, &ps);
    llmem_kv_get_stats(s->kv, &ks);
    double kv_tok = (double)llmem_kv_bytes_per_token(s->kv);
    llmem_timeline_sample smp = {sim_clock(s), st, ps.reserved_bytes, ps.committed_bytes, ps.used_bytes,
                                 ks.bytes_reserved ? (double)ks.tokens_written * kv_tok / (double)ks.bytes_reserved : -1};
    llmem_timeline_record(s->tl, &smp);
}

/* Nothing to run until `until`: IDLE from now; with a controller, its
 * housekeeping runs once the decay has passed (the shrink lands then). */
static void idle_until(sim *s, double until)
{
    double start = s->t;
    stage(s, LLMEM_STAGE_IDLE, 0, 0);
    timeline_sample(s, LLMEM_STAGE_IDLE);
    double decay = s->ctl ? s->o->idle_decay_ms / 1000.0 : 0;
    if (s->ctl && until - start > decay) {
        account(s, decay);
        s->t = start + decay + 1e-6;
        llmem_controller_tick(s->ctl);
        timeline_sample(s, LLMEM_STAGE_IDLE);
        account(s, until - s->t);
    } else {
        account(s, until - start);
    }
    s->t = until;
    timeline_sample(s, LLMEM_STAGE_IDLE); /* the flat stretch, not a ramp to the next step */
}

int replay_run(const llmem_trace *trace, const replay_options *o, replay_result *r)
{
    memset(r, 0, sizeof *r);
    static const char *names[] = {"paged", "static", "buckets", "contiguous"};
    r->strategy = names[o->strategy];
    if (!o->kv_budget) {
        fprintf(stderr, "llmem replay: --kv-budget is required\n");
        return 1;
    }
    size_t n = trace->count;
    if (o->max_requests && o->max_requests < n) n = o->max_requests;
    const llmem_shape *sh = &o->shape;
    uint32_t ctx = o->max_seq_len ? o->max_seq_len : sh->max_ctx;
    double weights = (double)llmem_shape_params(sh) * (double)o->weight_elem_bytes;
    double kv_tok = (double)llmem_shape_kv_bytes_per_token(sh, o->kv_elem_bytes);
    double params2 = 2.0 * (double)llmem_shape_params(sh);
    double att = 4.0 * sh->layers * (double)sh->heads * sh->head_dim; /* flops per (query, key) pair */

    /* Device memory for the KV cache: the budget, plus room for superblock rounding. */
    llmem_sim_options so = llmem_sim_options_default();
    so.name = "replay-kv";
    so.capacity = o->kv_budget + o->kv_budget / 8 + ((size_t)1 << 30);
    so.discard_data = true; /* bucket growth copies are counted, not performed */
    llmem_resource *dev = o->resource, *own_dev = NULL;
    if (!dev) {
        if (llmem_sim_resource_create(&so, &own_dev)) {
            fprintf(stderr, "llmem replay: %s\n", llmem_last_error());
            return 1;
        }
        dev = own_dev;
    }
    llmem_pool_options po = llmem_pool_options_default();
    po.name = "replay-kv";
    po.resource = dev;
    po.purge = LLMEM_POOL_PURGE_MANUAL;
    po.decay_ms = o->pool_decay_ms;
    llmem_pool *pool;
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
    sim s = {.o = o, .n = n, .r = r};
    if (llmem_pool_create(&po, &pool)) {
        fprintf(stderr, "llmem replay: %s\n", llmem_last_error());
        llmem_resource_destroy(own_dev);
        return 1;
    }
    s.pool = pool;
    s.dev = dev;
    llmem_predictor *pred = NULL;
    if (o->controller) {
        llmem_predictor_options pro = llmem_predictor_options_default();
        pro.shape = *sh;
        pro.shape.max_ctx = ctx;
        pro.kv_elem_bytes = o->kv_elem_bytes;
        pro.block_tokens = o->block_tokens;
        pro.kv_slab_bytes = block_bytes * o->slab_blocks;
        pro.activations_apart = true; /* only KV lives in this pool */
        llmem_controller_options co = llmem_controller_options_default();
        co.pool = pool;
        co.idle_decay_ms = o->idle_decay_ms;
        co.clock = sim_clock;
        co.clock_ctx = &s;
        if (llmem_predictor_create(&pro, &pred) || (co.predictor = pred, llmem_controller_create(&co, &s.ctl)) ||
            (o->timeline && llmem_timeline_create(0, &s.tl))) {
            fprintf(stderr, "llmem replay: controller: %s\n", llmem_last_error());
            llmem_controller_destroy(s.ctl);
            llmem_predictor_destroy(pred);
            llmem_pool_destroy(pool);
            llmem_resource_destroy(own_dev);
            return 1;
        }
    }
    ko.pool = pool;
    if (llmem_kv_create(&ko, &s.kv)) {
        fprintf(stderr, "llmem replay: %s\n", llmem_last_error());
        llmem_controller_destroy(s.ctl);
        llmem_predictor_destroy(pred);
        llmem_timeline_destroy(s.tl);
        llmem_pool_destroy(pool);
        llmem_resource_destroy(own_dev);
        return 1;
    }
    s.reqs = calloc(n ? n : 1, sizeof *s.reqs);
    s.wq_cap = n + 1;
    s.waitq = malloc(s.wq_cap * sizeof *s.waitq);
    s.run = malloc((o->max_batch + 1) * sizeof *s.run);
    s.ttft = malloc((n + 1) * sizeof(double));
    s.tpot = malloc((n + 1) * sizeof(double));
    s.e2e = malloc((n + 1) * sizeof(double));
    if (!s.reqs || !s.waitq || !s.run || !s.ttft || !s.tpot || !s.e2e) {
        fprintf(stderr, "llmem replay: out of memory\n");
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        s.reqs[i] = (rq){.tr = &trace->req[i],
                         .arrival = trace->req[i].arrival_s / o->speedup,
                         .index = (uint32_t)i,
                         .prefill = trace->req[i].prompt_tokens};
    }
    r->requests_total = n;
    double wall0 = now_s(), last_progress = 0;
    uint64_t copied_before = 0;
    size_t next_arrival = 0, done = 0;
    while (done < n) {
        if (!s.nrun && !s.wq_len && next_arrival < n && s.reqs[next_arrival].arrival > s.t)
            idle_until(&s, s.reqs[next_arrival].arrival); /* idle until the next arrival */
        while (next_arrival < n && s.reqs[next_arrival].arrival <= s.t) wq_push_back(&s, (uint32_t)next_arrival++);
        /* Decode first: every running request gets the slot for its newest
         * token. When none is left the most recently admitted request is
         * preempted (it alone, if it is the only one left, stops there:
         * truncated by memory). */
        uint64_t decodes = 0;
        double kv_read = 0, decode_att = 0;
        bool preempted = false;
        if (s.ctl) {
            /* The step's stage as an engine would report it, before its KV
             * is taken: prompts waiting (up to the step's prefill budget)
             * make it a prefill. */
            uint64_t want = 0;
            uint32_t admit = 0;
            for (size_t w = 0; w < s.wq_len && s.nrun + admit < o->max_batch; w++) {
                const rq *q = &s.reqs[s.waitq[(s.wq_head + w) % s.wq_cap]];
                if (want + q->prefill > o->max_prefill_tokens && admit) break;
                want += q->prefill;
                admit++;
            }
            if (admit) stage(&s, LLMEM_STAGE_PREFILL, (uint32_t)s.nrun + admit, want + s.nrun);
            else stage(&s, LLMEM_STAGE_DECODE, (uint32_t)s.nrun, s.nrun);
        }
        for (size_t k = 0; k < s.nrun;) {
            rq *q = &s.reqs[s.run[k]];
            llmem_status st = llmem_kv_seq_append(s.kv, q->seq, 1, NULL, NULL);
            /* Alone: once more before truncating (a transient refusal passes). */
            if (st == LLMEM_ENOMEM && s.nrun == 1) st = llmem_kv_seq_append(s.kv, q->seq, 1, NULL, NULL);
            if (st == LLMEM_ENOMEM && s.nrun == 1) {
                finish(&s, q, true);
                s.nrun = 0;
                done++;
                break;
            }
            if (st == LLMEM_ENOMEM) {
                preempt(&s, s.nrun - 1);
                preempted = true;
                continue; /* retry q, unless q was the one preempted (then k == nrun) */
            }
            if (st) {
                fprintf(stderr, "llmem replay: %s\n", llmem_last_error());
                goto fail;
            }
            llmem_kv_seq_info info;
            llmem_kv_seq_get_info(s.kv, q->seq, &info);
            decodes++;
            kv_read += (double)info.length * kv_tok;
            decode_att += (double)info.length;
            k++;
        }
        /* Then admit waiting requests while their prompts fit (not in a step
         * that had to preempt: memory is short). */
        uint64_t prefill_tokens = 0;
        double prefill_att = 0;
        while (!preempted && s.wq_len && s.nrun < o->max_batch) {
            rq *q = &s.reqs[s.waitq[s.wq_head]];
            if (q->tr->prompt_tokens > ctx || q->tr->prompt_tokens == 0) { /* never fits the context */
                wq_pop(&s);
                r->requests_rejected++;
                done++;
                continue;
            }
            if (prefill_tokens && prefill_tokens + q->prefill > o->max_prefill_tokens) break;
            uint32_t fresh;
            /* Nothing running: once more before rejecting (a transient refusal passes). */
            if (!admit(&s, q, &fresh) && (s.oom || s.nrun || !admit(&s, q, &fresh))) {
                if (s.oom) goto fail;
                if (s.nrun == 0) { /* cannot fit even alone: it never will */
                    wq_pop(&s);
                    r->requests_rejected++;
                    done++;
                    continue;
                }
                break;
            }
            wq_pop(&s);
            q->admitted_now = true;
            s.run[s.nrun++] = q->index;
            prefill_tokens += fresh;
            prefill_att += (double)fresh * (double)q->prefill / 2.0;
            r->prompt_tokens += fresh;
        }
        if (o->check && llmem_kv_check(s.kv)) {
            fprintf(stderr, "llmem replay: %s\n", llmem_last_error());
            goto fail;
        }
        if (!s.nrun) {
            if (next_arrival >= n && !s.wq_len) break;
            continue;
        }
        double flops = params2 * (double)(prefill_tokens + decodes) + att * (prefill_att + decode_att);
        /* Device copies this step (BUCKETS outgrowing a buffer, copy-on-write) read and write. */
        llmem_resource_stats rst = {0};
        llmem_resource_get_stats(dev, &rst);
        double copied = (double)(rst.copy_bytes_total - copied_before);
        copied_before = rst.copy_bytes_total;
        double bytes = weights + kv_read + (double)prefill_tokens * kv_tok + 2 * copied;
        double dt = o->step_overhead_s + fmax(flops / (o->peak_flops * o->mfu), bytes / o->bandwidth);
        llmem_kv_stats ks = {0};
        llmem_kv_get_stats(s.kv, &ks);
        if (ks.bytes_reserved) s.util_acc += dt * (double)ks.tokens_written * kv_tok / (double)ks.bytes_reserved;
        s.conc_acc += dt * (double)s.nrun;
        s.busy_t += dt;
        account(&s, dt);
        timeline_sample(&s, prefill_tokens ? LLMEM_STAGE_PREFILL : LLMEM_STAGE_DECODE);
        if (s.nrun > r->max_concurrency) r->max_concurrency = (uint32_t)s.nrun;
        s.t += dt;
        r->steps++;
        /* Tokens produced at the end of the step. */
        for (size_t k = 0; k < s.nrun;) {
            rq *q = &s.reqs[s.run[k]];
            q->generated++;
            r->tokens_generated++;
            if (!q->started) {
                q->started = true;
                q->first_t = s.t;
                s.ttft[s.nttft++] = s.t - q->arrival;
            }
            q->admitted_now = false;
            bool out_done = q->generated >= q->tr->output_tokens;
            bool ctx_done = q->tr->prompt_tokens + q->generated >= ctx;
            if (out_done || ctx_done) {
                finish(&s, q, !out_done);
                memmove(&s.run[k], &s.run[k + 1], (s.nrun - k - 1) * sizeof *s.run);
                s.nrun--;
                done++;
            } else {
                k++;
            }
        }
        if (o->progress && r->steps % 512 == 0 && now_s() - last_progress > 0.2) {
            last_progress = now_s();
            fprintf(stderr, "\r\033[Kreplay %s: %zu/%zu requests, %.0f s simulated", r->strategy, done, n, s.t);
        }
    }
    if (o->progress) fprintf(stderr, "\r\033[K");
    llmem_kv_stats ks = {0};
    llmem_kv_get_stats(s.kv, &ks);
    r->peak_reserved_bytes = ks.bytes_reserved_peak;
    r->kv_utilization = s.busy_t > 0 ? s.util_acc / s.busy_t : 0;
    r->mean_concurrency = s.busy_t > 0 ? s.conc_acc / s.busy_t : 0;
    r->prefix_hit_rate = s.lookups ? (double)s.hits / (double)s.lookups : 0;
    qsort(s.ttft, s.nttft, sizeof(double), cmp_d);
    qsort(s.tpot, s.ntpot, sizeof(double), cmp_d);
    qsort(s.e2e, s.ne2e, sizeof(double), cmp_d);
    r->ttft_p50_s = pct(s.ttft, s.nttft, 0.50);
    r->ttft_p99_s = pct(s.ttft, s.nttft, 0.99);
    r->tpot_p50_s = pct(s.tpot, s.ntpot, 0.50);
    r->tpot_p99_s = pct(s.tpot, s.ntpot, 0.99);
    r->e2e_p50_s = pct(s.e2e, s.ne2e, 0.50);
    r->e2e_p99_s = pct(s.e2e, s.ne2e, 0.99);
    r->sim_time_s = s.t;
    r->wall_time_s = now_s() - wall0;
    r->throughput_tokens_per_s = s.t > 0 ? (double)r->tokens_generated / s.t : 0;
    llmem_resource_stats rst = {sizeof rst};
    llmem_resource_get_stats(dev, &rst);
    r->resource_calls = rst.map_calls_total + rst.unmap_calls_total + rst.commit_calls_total + rst.decommit_calls_total;
    r->peak_committed_bytes = s.peak_committed;
    r->mean_committed_bytes = s.t > 0 ? s.committed_acc / s.t : 0;
    if (s.ctl) {
        llmem_controller_stats cs = {sizeof cs};
        llmem_controller_get_stats(s.ctl, &cs);
        r->controller_reserves = cs.reserves_total;
        r->controller_grows = cs.grows_total;
        r->controller_shrinks = cs.shrinks_total;
    }
    int rc = 0;
    if (s.tl) {
        tool_timeline_add_decisions(s.tl, s.ctl);
        if (llmem_timeline_write_html(s.tl, o->timeline, "llmem replay: KV pool under the controller")) {
            fprintf(stderr, "llmem replay: %s\n", llmem_last_error()); /* "timeline: cannot write ..." */
            rc = 1;
        }
    }
    if (0) {
    fail:
        if (s.oom) fprintf(stderr, "llmem replay: out of host memory\n");
        rc = 1;
    }
    llmem_kv_destroy(s.kv);
    llmem_controller_destroy(s.ctl);
    llmem_predictor_destroy(pred);
    llmem_timeline_destroy(s.tl);
    llmem_pool_destroy(pool);
    llmem_resource_destroy(own_dev);
    free(s.reqs);
    free(s.waitq);
    free(s.run);
    free(s.ttft);
    free(s.tpot);
    free(s.e2e);
    free(s.tokbuf);
    return rc;
}
