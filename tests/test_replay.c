/*
 * test_replay.c - the trace replay (llmem/replay.h: the library's scheduler
 * over a simulated engine) on synthetic traces whose answers are known: accounting closes, paged beats
 * static on utilisation and concurrency, rejection and truncation at the
 * context length, preemption under a tight budget loses no request, the
 * prefix cache hits only where the trace declares a prefix, and a replay is
 * deterministic.
 */
#include "test_util.h"


/* A trace of n requests arriving `rate` per second, prompts and outputs
 * drawn uniformly from [pmin, pmax] and [omin, omax] (deterministic). */
static llmem_trace synth(size_t n, double rate, uint32_t pmin, uint32_t pmax, uint32_t omin, uint32_t omax,
                         uint32_t seed)
{
    llmem_trace t = {0};
    t.req = calloc(n, sizeof *t.req);
    assert_non_null(t.req);
    t.count = n;
    uint64_t x = 0x9e3779b97f4a7c15ull ^ seed;
    for (size_t i = 0; i < n; i++) {
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        uint64_t r = x * 0x2545f4914f6cdd1dull;
        t.req[i].arrival_s = (double)i / rate;
        t.req[i].prompt_tokens = pmin + (uint32_t)(r % (pmax - pmin + 1));
        t.req[i].output_tokens = omin + (uint32_t)((r >> 32) % (omax - omin + 1));
    }
    t.duration_s = t.req[n - 1].arrival_s;
    return t;
}

static llmem_replay_options opts(llmem_kv_strategy st, size_t budget, uint32_t max_seq_len)
{
    llmem_replay_options o;
    o = llmem_replay_options_default();
    assert_ok(llmem_shape_preset("llama-2-7b", &o.shape));
    o.strategy = st;
    o.kv_budget = budget;
    o.max_seq_len = max_seq_len;
    return o;
}

static void check_invariants(const llmem_trace *t, const llmem_replay_options *o, const llmem_replay_result *r)
{
    assert_int_equal(r->requests_total, t->count);
    assert_int_equal(r->requests_completed + r->requests_rejected, t->count);
    assert_true(r->requests_truncated <= r->requests_completed);
    assert_true(r->peak_reserved_bytes <= o->kv_budget);
    assert_true(r->kv_utilization > 0 && r->kv_utilization <= 1.0);
    assert_true(r->mean_concurrency > 0 && r->mean_concurrency <= r->max_concurrency);
    assert_true(r->max_concurrency <= o->max_batch);
    assert_true(r->ttft_p50_s > 0 && r->ttft_p50_s <= r->ttft_p99_s);
    assert_true(r->tpot_p50_s > 0 && r->tpot_p50_s <= r->tpot_p99_s);
    assert_true(r->e2e_p50_s >= r->ttft_p50_s && r->e2e_p50_s <= r->e2e_p99_s);
    /* Nothing finishes before the last request arrives. */
    assert_true(r->sim_time_s >= t->duration_s);
    assert_true(r->steps > 0 && r->tokens_generated > 0);
}

static void paged_beats_static(void **state)
{
    (void)state;
    /* 300 requests at 40/s; prompts 100..600, outputs 20..200 tokens; a
     * 1024-token context. 2 GiB of f16 KV holds 4096 tokens of llama-2-7b:
     * static fits 4 sequences, paged as many as their real lengths allow. */
    llmem_trace t = synth(300, 40, 100, 600, 20, 200, 1);
    uint64_t want_tokens = 0;
    for (size_t i = 0; i < t.count; i++) want_tokens += t.req[i].output_tokens;
    llmem_replay_result r[3];
    const llmem_kv_strategy st[3] = {LLMEM_KV_STATIC, LLMEM_KV_BUCKETS, LLMEM_KV_PAGED};
    for (int i = 0; i < 3; i++) {
        llmem_replay_options o = opts(st[i], (size_t)2 << 30, 1024);
        assert_ok(llmem_replay_run(&t, &o, &r[i]));
        check_invariants(&t, &o, &r[i]);
        /* Every prompt + output fits the context: all complete, in full. */
        assert_int_equal(r[i].requests_completed, t.count);
        assert_int_equal(r[i].requests_truncated, 0);
        assert_int_equal(r[i].tokens_generated, want_tokens);
        print_message("%-8s util %.3f max conc %u mean %.1f preempt %llu ttft p99 %.3f s\n", r[i].strategy,
                      r[i].kv_utilization, r[i].max_concurrency, r[i].mean_concurrency,
                      (unsigned long long)r[i].preemptions, r[i].ttft_p99_s);
    }
    assert_string_equal(r[0].strategy, "static");
    assert_string_equal(r[2].strategy, "paged");
    assert_true(r[0].max_concurrency <= 4);
    assert_true(r[2].max_concurrency >= 2 * r[0].max_concurrency);
    assert_true(r[2].kv_utilization > 0.9);
    assert_true(r[2].kv_utilization > r[0].kv_utilization + 0.3);
    assert_true(r[2].kv_utilization > r[1].kv_utilization);
    /* More sequences at once: requests wait less for their first token. */
    assert_true(r[2].ttft_p99_s < r[0].ttft_p99_s);
    free(t.req);
}

static void reject_and_truncate_at_context(void **state)
{
    (void)state;
    llmem_trace t = synth(4, 10, 10, 10, 5, 5, 2);
    t.req[1].prompt_tokens = 513; /* over the context: rejected */
    t.req[2].prompt_tokens = 500; /* 500 + 40 > 512: stops at 12 tokens */
    t.req[2].output_tokens = 40;
    for (int s = 0; s < 3; s++) {
        llmem_replay_options o = opts((llmem_kv_strategy)s, (size_t)1 << 30, 512);
        llmem_replay_result r;
        assert_ok(llmem_replay_run(&t, &o, &r));
        assert_int_equal(r.requests_rejected, 1);
        assert_int_equal(r.requests_completed, 3);
        assert_int_equal(r.requests_truncated, 1);
        assert_int_equal(r.tokens_generated, 5 + 12 + 5);
    }
    free(t.req);
}

static void preemption_loses_nothing(void **state)
{
    (void)state;
    /* Everything arrives at once and grows long: a 256 MiB budget (512
     * tokens) cannot hold the batch it admits, so decodes preempt and
     * recompute, and every request still completes with all its tokens. */
    llmem_trace t = synth(40, 1e6, 60, 120, 100, 250, 3);
    uint64_t want_tokens = 0;
    for (size_t i = 0; i < t.count; i++) want_tokens += t.req[i].output_tokens;
    llmem_replay_options o = opts(LLMEM_KV_PAGED, (size_t)256 << 20, 512);
    llmem_replay_result r;
    assert_ok(llmem_replay_run(&t, &o, &r));
    check_invariants(&t, &o, &r);
    assert_true(r.preemptions > 0);
    assert_int_equal(r.requests_completed, t.count);
    assert_int_equal(r.requests_truncated, 0);
    assert_int_equal(r.tokens_generated, want_tokens);
    /* Recomputed prompts are prefilled again. */
    uint64_t prompts = 0;
    for (size_t i = 0; i < t.count; i++) prompts += t.req[i].prompt_tokens;
    assert_true(r.prompt_tokens > prompts);
    free(t.req);
}

static void prefix_cache_hits_declared_prefixes(void **state)
{
    (void)state;
    /* Half the requests share a 256-token system prompt (prefix id 1). */
    llmem_trace t = synth(100, 20, 300, 400, 10, 30, 4);
    uint64_t shared = 0, total = 0;
    for (size_t i = 0; i < t.count; i++) {
        if (i % 2 == 0) {
            t.req[i].prefix_id = 1;
            t.req[i].prefix_tokens = 256;
            shared += 256;
        }
        total += t.req[i].prompt_tokens;
    }
    llmem_replay_options o = opts(LLMEM_KV_PAGED, (size_t)4 << 30, 1024);
    llmem_replay_result off, on;
    assert_ok(llmem_replay_run(&t, &o, &off));
    assert_true(off.prefix_hit_rate == 0);
    o.prefix_cache = true;
    assert_ok(llmem_replay_run(&t, &o, &on));
    check_invariants(&t, &o, &on);
    /* All but the first sharer find the 16 full blocks of the prefix. */
    double best = (double)(shared - 256) / (double)total;
    print_message("prefix hit rate %.3f (at most %.3f)\n", on.prefix_hit_rate, best);
    assert_true(on.prefix_hit_rate > 0.8 * best && on.prefix_hit_rate <= best + 1e-9);
    assert_true(on.prompt_tokens < off.prompt_tokens);
    assert_int_equal(on.tokens_generated, off.tokens_generated);
    free(t.req);
}

static void deterministic_and_bad_options(void **state)
{
    (void)state;
    llmem_trace t = synth(120, 30, 50, 700, 1, 300, 5);
    llmem_replay_options o = opts(LLMEM_KV_BUCKETS, (size_t)1 << 30, 1024);
    llmem_replay_result a, b;
    assert_ok(llmem_replay_run(&t, &o, &a));
    assert_ok(llmem_replay_run(&t, &o, &b));
    assert_true(a.sim_time_s == b.sim_time_s);
    assert_true(a.kv_utilization == b.kv_utilization);
    assert_int_equal(a.steps, b.steps);
    assert_int_equal(a.preemptions, b.preemptions);
    assert_true(a.ttft_p99_s == b.ttft_p99_s && a.e2e_p99_s == b.e2e_p99_s);
    /* No budget: refused with a message, nothing leaks (ASan checks). */
    o.kv_budget = 0;
    assert_status(llmem_replay_run(&t, &o, &a), LLMEM_EINVAL);
    /* A budget smaller than one static reservation rejects every request. */
    o = opts(LLMEM_KV_STATIC, (size_t)64 << 20, 1024);
    assert_ok(llmem_replay_run(&t, &o, &a));
    assert_int_equal(a.requests_rejected, t.count);
    free(t.req);
}

int main(void)
{
    llmem_log_set(NULL, NULL, LLMEM_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(paged_beats_static),
        cmocka_unit_test(reject_and_truncate_at_context),
        cmocka_unit_test(preemption_loses_nothing),
        cmocka_unit_test(prefix_cache_hits_declared_prefixes),
        cmocka_unit_test(deterministic_and_bad_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
