/*
 * test_sched.c - the continuous-batching scheduler (llmem/sched.h) over the
 * real engine on stories260K (../shared/models; skipped when absent) and
 * over the simulated engine.
 *
 * The oracle for every engine test is the same request run alone, with no
 * memory pressure (or, for the first test, a plain llmem_engine_step loop
 * written here): batching, chunked prefill, preemption by recomputation or
 * swap, prefix-cache reuse and forks must all give the same tokens, token
 * for token. Each test also asserts that the mechanism it covers really
 * happened (preemptions counted, swaps counted, cache hits, shared blocks),
 * so none passes by not exercising it.
 */
#include <math.h>

#include "test_util.h"
#include "support/cases.h"
#include "support/rng.h"

/* The real model of the shared folder (test_sched_shared runs the cases
 * that need it; see test_util.h). */
#define MODEL test_shared_path("models/stories260K.bin")

static llmem_model *g_model;

/* Prompts of distinct lengths over the 512-token vocabulary. */
static void make_prompt(int32_t *p, uint32_t n, uint32_t seed)
{
    p[0] = 1;
    uint64_t x = test_rng_seed(seed);
    for (uint32_t i = 1; i < n; i++) p[i] = 3 + (int32_t)((test_rng_next(&x) >> 33) % 500);
}

static llmem_engine *engine(uint32_t max_seqs, uint32_t step_tokens, size_t kv_budget, bool prefix,
                            llmem_resource *swap)
{
    llmem_engine_options eo = llmem_engine_options_default();
    eo.threads = 1;
    eo.max_seqs = max_seqs;
    eo.max_step_tokens = step_tokens;
    eo.kv_budget_bytes = kv_budget;
    eo.kv_prefix_cache = prefix;
    eo.kv_swap_resource = swap;
    llmem_engine *e;
    assert_ok(llmem_engine_create(g_model, &eo, &e));
    return e;
}

typedef struct job {
    uint32_t prompt_len, max_tokens, seed;
    float temperature;
    int32_t prompt[512];
    int32_t out[4][512];
    size_t nout[4];
    llmem_sched_finish finish[4];
    llmem_sched_req id;
} job;

static void jobs_init(job *j, size_t n, uint32_t base_len)
{
    for (size_t i = 0; i < n; i++) {
        memset(&j[i], 0, sizeof j[i]);
        j[i].prompt_len = base_len + (uint32_t)(i * 37 % 90);
        j[i].max_tokens = 20 + (uint32_t)(i * 13 % 40);
        j[i].seed = 100 + (uint32_t)i;
        j[i].temperature = i % 3 == 0 ? 0.0f : 0.9f;
        make_prompt(j[i].prompt, j[i].prompt_len, (uint32_t)i + 1);
    }
}

static llmem_sched_params params_of(const job *j, uint32_t n)
{
    llmem_sched_params p = llmem_sched_params_default();
    p.prompt = j->prompt;
    p.prompt_len = j->prompt_len;
    p.max_tokens = j->max_tokens;
    p.temperature = j->temperature;
    p.top_p = 0.9f;
    p.seed = j->seed;
    p.n = n;
    return p;
}

static void collect(llmem_sched *s, job *j, uint32_t n)
{
    for (uint32_t k = 0; k < n; k++) {
        llmem_sched_info info;
        assert_ok(llmem_sched_get_info(s, j->id, k, &info));
        assert_int_equal(info.state, LLMEM_SCHED_FINISHED);
        j->finish[k] = info.finish;
        assert_ok(llmem_sched_read(s, j->id, k, 0, j->out[k], 512, &j->nout[k]));
        assert_int_equal(j->nout[k], info.visible);
    }
    assert_ok(llmem_sched_release(s, j->id));
}

static void run_all(llmem_sched *s)
{
    for (int guard = 0; llmem_sched_pending(s); guard++) {
        assert_true(guard < 200000);
        assert_ok(llmem_sched_step(s, NULL));
    }
}

/* Each job alone: the reference. */
static void reference(job *ref, size_t n, uint32_t samples)
{
    llmem_engine *e = engine(8, 512, 0, false, NULL);
    llmem_sched *s;
    assert_ok(llmem_sched_create_engine(e, NULL, &s));
    for (size_t i = 0; i < n; i++) {
        llmem_sched_params p = params_of(&ref[i], samples);
        assert_ok(llmem_sched_submit(s, &p, &ref[i].id));
        run_all(s);
        collect(s, &ref[i], samples);
    }
    llmem_sched_destroy(s);
    llmem_engine_destroy(e);
}

static void assert_same(const job *a, const job *b, size_t n, uint32_t samples)
{
    for (size_t i = 0; i < n; i++)
        for (uint32_t k = 0; k < samples; k++) {
            if (a[i].nout[k] != b[i].nout[k] || memcmp(a[i].out[k], b[i].out[k], a[i].nout[k] * sizeof(int32_t)))
                fail_msg("job %zu sample %u: %zu tokens vs %zu, or different tokens", i, k, a[i].nout[k], b[i].nout[k]);
            assert_int_equal(a[i].finish[k], b[i].finish[k]);
        }
}

static size_t kv_used_blocks(llmem_engine *e)
{
    llmem_kv_stats ks = {sizeof ks};
    assert_ok(llmem_kv_get_stats(llmem_engine_kv(e), &ks));
    return ks.blocks_used;
}

/* ---- the engine ------------------------------------------------------------------- */

static void alone_matches_a_plain_engine_loop(void **state)
{
    (void)state;
    job j[1];
    jobs_init(j, 1, 40);
    j[0].temperature = 0;
    reference(j, 1, 1);
    assert_int_equal(j[0].finish[0], LLMEM_SCHED_FINISH_LENGTH);
    assert_int_equal(j[0].nout[0], j[0].max_tokens);
    /* The same greedy run by hand. */
    llmem_engine *e = engine(1, 512, 0, false, NULL);
    llmem_engine_seq q;
    assert_ok(llmem_engine_seq_create(e, &q));
    llmem_engine_batch_item it = {q, j[0].prompt, j[0].prompt_len, 0};
    assert_ok(llmem_engine_step(e, &it, 1));
    for (uint32_t i = 0; i < j[0].max_tokens; i++) {
        int32_t t = llmem_logits_argmax(llmem_engine_logits(e, 0), 512);
        assert_int_equal(t, j[0].out[0][i]);
        it = (llmem_engine_batch_item){q, &t, 1, 0};
        if (i + 1 < j[0].max_tokens) assert_ok(llmem_engine_step(e, &it, 1));
    }
    llmem_engine_destroy(e);
}

static void batched_chunked_equals_alone(void **state)
{
    (void)state;
    enum { N = 10 };
    static job ref[N], got[N];
    jobs_init(ref, N, 60);
    memcpy(got, ref, sizeof got);
    reference(ref, N, 1);
    /* All at once; 48 tokens a step: prompts take several steps, mixed
     * with the others' decodes. */
    llmem_engine *e = engine(8, 48, 0, false, NULL);
    llmem_sched_options so = llmem_sched_options_default();
    llmem_sched *s;
    assert_ok(llmem_sched_create_engine(e, &so, &s));
    for (size_t i = 0; i < N; i++) {
        llmem_sched_params p = params_of(&got[i], 1);
        assert_ok(llmem_sched_submit(s, &p, &got[i].id));
    }
    bool mixed = false;
    uint32_t most = 0;
    while (llmem_sched_pending(s)) {
        llmem_sched_step_report rep;
        assert_ok(llmem_sched_step(s, &rep));
        assert_true(rep.prefill_tokens + rep.decode_tokens <= 48);
        if (rep.prefill_tokens && rep.decode_tokens) mixed = true;
        if (rep.sequences > most) most = rep.sequences;
    }
    assert_true(mixed);
    assert_true(most > 1 && most <= 8);
    for (size_t i = 0; i < N; i++) collect(s, &got[i], 1);
    assert_same(ref, got, N, 1);
    llmem_sched_stats st = {sizeof st};
    assert_ok(llmem_sched_get_stats(s, &st));
    assert_int_equal(st.requests_finished_total, N);
    assert_int_equal(st.preemptions_total, 0);
    llmem_sched_destroy(s);
    assert_int_equal(kv_used_blocks(e), 0);
    llmem_engine_destroy(e);
}

/* A tight KV budget: preemption, by recomputation or by swap. */
static void preempted(bool swap, bool prefix)
{
    enum { N = 8 };
    static job ref[N], got[N];
    jobs_init(ref, N, 80);
    for (size_t i = 0; i < N; i++) ref[i].max_tokens = 60 + (uint32_t)i * 7;
    memcpy(got, ref, sizeof got);
    reference(ref, N, 1);
    llmem_resource *host = NULL;
    if (swap) assert_ok(llmem_os_resource_create(NULL, &host));
    /* stories260K: 5 layers x 4 KV heads x 8 dims x f32 x K,V = 1280 B a
     * token; 48 KiB holds 38 tokens... far less than 8 requests need. */
    size_t budget = (size_t)1280 * 16 * 24; /* 24 blocks: about 3 requests */
    llmem_engine *e = engine(8, 512, budget, prefix, host);
    llmem_sched_options so = llmem_sched_options_default();
    so.preempt = swap ? LLMEM_SCHED_PREEMPT_SWAP : LLMEM_SCHED_PREEMPT_RECOMPUTE;
    /* no headroom (the default): admission is greedy, decodes run out */
    llmem_sched *s;
    assert_ok(llmem_sched_create_engine(e, &so, &s));
    for (size_t i = 0; i < N; i++) {
        llmem_sched_params p = params_of(&got[i], 1);
        assert_ok(llmem_sched_submit(s, &p, &got[i].id));
    }
    run_all(s);
    for (size_t i = 0; i < N; i++) collect(s, &got[i], 1);
    llmem_sched_stats st = {sizeof st};
    assert_ok(llmem_sched_get_stats(s, &st));
    print_message("%s%s: %llu preemptions (%llu swapped), %llu swap-ins, %llu tokens computed, %llu cached\n",
                  swap ? "swap" : "recompute", prefix ? " with the prefix cache" : "", (unsigned long long)st.preemptions_total,
                  (unsigned long long)st.preemptions_swap_total, (unsigned long long)st.swap_ins_total,
                  (unsigned long long)st.computed_tokens_total, (unsigned long long)st.prefix_cache_hits_total);
    assert_true(st.preemptions_total > 0);
    if (prefix) assert_true(st.prefix_cache_hits_total > 0); /* a recomputation finds its own blocks */
    if (swap) {
        assert_true(st.preemptions_swap_total > 0);
        assert_true(st.swap_ins_total > 0);
    } else {
        assert_int_equal(st.preemptions_swap_total, 0);
    }
    assert_int_equal(st.samples_memory_total, 0);
    assert_same(ref, got, N, 1);
    llmem_sched_destroy(s);
    assert_int_equal(kv_used_blocks(e), 0);
    llmem_engine_destroy(e);
    llmem_resource_destroy(host);
}

static void preemption_recompute_same_tokens(void **state)
{
    (void)state;
    preempted(false, false);
    /* With the prefix cache a recomputation reuses its cached blocks; a
     * step refused after some appends must not leave unwritten blocks
     * registered (llmem_kv_seq_rollback), or the tokens would differ. */
    preempted(false, true);
}

TEST_CASE(preemption_swap_same_tokens, preempted(true, false))

static bool cancel_on_third_token(void *ctx, const llmem_sched_event *ev)
{
    llmem_sched *s = *(llmem_sched **)ctx;
    if (ev->kind == LLMEM_SCHED_EV_TOKEN && ev->index == 2 && ev->sample == 0) {
        size_t before = llmem_sched_pending(s);
        assert_ok(llmem_sched_cancel(s, ev->req)); /* from inside the step loop: no deadlock */
        assert_int_equal(llmem_sched_pending(s), before - 1);
    }
    return false;
}

static void cancellation_frees_kv_at_once(void **state)
{
    (void)state;
    job j[3];
    jobs_init(j, 3, 100);
    llmem_engine *e = engine(4, 64, 0, false, NULL);
    llmem_sched *s;
    llmem_sched_options so = llmem_sched_options_default();
    so.on_event = cancel_on_third_token;
    so.event_ctx = &s;
    assert_ok(llmem_sched_create_engine(e, &so, &s));
    llmem_sched_params p = params_of(&j[0], 1);
    assert_ok(llmem_sched_submit(s, &p, &j[0].id));
    /* Mid-prefill: the prompt (100+ tokens) takes two steps of 64. */
    assert_ok(llmem_sched_step(s, NULL));
    llmem_sched_info info;
    assert_ok(llmem_sched_get_info(s, j[0].id, 0, &info));
    assert_int_equal(info.state, LLMEM_SCHED_PREFILL);
    assert_true(kv_used_blocks(e) > 0);
    assert_ok(llmem_sched_cancel(s, j[0].id));
    assert_int_equal(kv_used_blocks(e), 0); /* at once */
    assert_ok(llmem_sched_get_info(s, j[0].id, 0, &info));
    assert_int_equal(info.finish, LLMEM_SCHED_FINISH_CANCELLED);
    assert_ok(llmem_sched_cancel(s, j[0].id)); /* finished: a no-op */
    /* Waiting, never admitted. */
    p = params_of(&j[1], 1);
    assert_ok(llmem_sched_submit(s, &p, &j[1].id));
    assert_ok(llmem_sched_release(s, j[1].id));
    assert_status(llmem_sched_get_info(s, j[1].id, 0, &info), LLMEM_EINVAL);
    assert_int_equal(llmem_sched_pending(s), 0);
    /* Decoding, cancelled by the event callback on its third token. */
    p = params_of(&j[2], 1);
    p.max_tokens = 50;
    assert_ok(llmem_sched_submit(s, &p, &j[2].id));
    run_all(s);
    assert_ok(llmem_sched_get_info(s, j[2].id, 0, &info));
    assert_int_equal(info.finish, LLMEM_SCHED_FINISH_CANCELLED);
    assert_int_equal(info.generated, 3);
    assert_int_equal(kv_used_blocks(e), 0);
    llmem_sched_stats st = {sizeof st};
    assert_ok(llmem_sched_get_stats(s, &st));
    assert_int_equal(st.requests_cancelled_total, 3);
    assert_int_equal(st.sequences_running, 0);
    assert_status(llmem_sched_cancel(s, 12345), LLMEM_EINVAL);
    llmem_sched_destroy(s);
    llmem_engine_destroy(e);
}

static void prefix_cache_skips_prefill(void **state)
{
    (void)state;
    /* Four requests share a 96-token system prompt, then differ. */
    enum { N = 4 };
    static job ref[N], got[N];
    jobs_init(ref, N, 130);
    for (size_t i = 1; i < N; i++) memcpy(ref[i].prompt, ref[0].prompt, 96 * sizeof(int32_t));
    memcpy(got, ref, sizeof got);
    reference(ref, N, 1);
    llmem_engine *e = engine(8, 512, 0, true, NULL);
    llmem_sched *s;
    assert_ok(llmem_sched_create_engine(e, NULL, &s));
    uint32_t computed[N];
    for (size_t i = 0; i < N; i++) { /* one after the other: each finds the last one's blocks */
        llmem_sched_params p = params_of(&got[i], 1);
        assert_ok(llmem_sched_submit(s, &p, &got[i].id));
        run_all(s);
        llmem_sched_info info;
        assert_ok(llmem_sched_get_info(s, got[i].id, 0, &info));
        computed[i] = info.computed_tokens;
        if (i) assert_int_equal(info.cached_tokens, 96); /* 6 whole blocks of 16 */
        else assert_int_equal(info.cached_tokens, 0);
        collect(s, &got[i], 1);
    }
    assert_same(ref, got, N, 1);
    llmem_sched_stats st = {sizeof st};
    assert_ok(llmem_sched_get_stats(s, &st));
    assert_int_equal(st.prefix_cache_hits_total, 96 * (N - 1));
    assert_int_equal(st.prefix_cache_requests_hit_total, N - 1);
    assert_true(st.prefix_cache_queries_total >= st.prefix_cache_hits_total);
    /* Skipped, not recomputed. */
    assert_int_equal(computed[1] + 96, got[1].prompt_len + got[1].max_tokens - 1);
    assert_int_equal(computed[0], got[0].prompt_len + got[0].max_tokens - 1);
    llmem_sched_destroy(s);
    llmem_engine_destroy(e);
}

/* The engine's all-or-nothing step with the prefix cache: item 0's append
 * fills (and registers) a block, item 1's is refused; the step is rolled
 * back, and the block it never wrote must not be found by the next match. */
static void refused_step_leaves_nothing_cached(void **state)
{
    (void)state;
    size_t block = 16 * 1280; /* one block, all layers */
    llmem_engine *e = engine(4, 512, 4 * block, true, NULL);
    int32_t a[17], b[100];
    make_prompt(a, 17, 21);
    make_prompt(b, 100, 22);
    llmem_engine_seq qa, qb, qc;
    assert_ok(llmem_engine_seq_create(e, &qa));
    assert_ok(llmem_engine_seq_create(e, &qb));
    llmem_engine_batch_item it[2] = {{qa, a, 16, 0}, {qb, b, 100, 0}};
    assert_status(llmem_engine_step(e, it, 2), LLMEM_ENOMEM);
    assert_int_equal(llmem_engine_seq_length(e, qa), 0);
    assert_ok(llmem_engine_seq_create(e, &qc));
    size_t matched = 99;
    assert_ok(llmem_engine_seq_match_prefix(e, qc, a, 17, &matched));
    assert_int_equal(matched, 0);
    /* Written, the block is found. */
    assert_ok(llmem_engine_step(e, it, 1));
    llmem_engine_seq qd;
    assert_ok(llmem_engine_seq_free(e, qc));
    assert_ok(llmem_engine_seq_create(e, &qd));
    assert_ok(llmem_engine_seq_match_prefix(e, qd, a, 17, &matched));
    assert_int_equal(matched, 16);
    assert_int_equal(llmem_engine_seq_length(e, qd), 16);
    assert_status(llmem_engine_seq_match_prefix(e, qd, a, 17, &matched), LLMEM_ESTATE);
    /* A block the refused step completes is registered full; rolled back to
     * partial it must leave the cache too. */
    int32_t c[17];
    make_prompt(c, 17, 23);
    llmem_engine_seq qe, qf;
    assert_ok(llmem_engine_seq_free(e, qd));
    assert_ok(llmem_engine_seq_free(e, qa));
    assert_ok(llmem_engine_seq_create(e, &qe));
    llmem_engine_batch_item first = {qe, c, 10, 0};
    assert_ok(llmem_engine_step(e, &first, 1));
    llmem_engine_batch_item two[2] = {{qe, c + 10, 6, 0}, {qb, b, 100, 0}};
    assert_status(llmem_engine_step(e, two, 2), LLMEM_ENOMEM);
    assert_int_equal(llmem_engine_seq_length(e, qe), 10);
    assert_ok(llmem_engine_seq_create(e, &qf));
    assert_ok(llmem_engine_seq_match_prefix(e, qf, c, 17, &matched));
    assert_int_equal(matched, 0);
    llmem_engine_destroy(e);
}

typedef struct share_probe {
    llmem_engine *e;
    size_t most_blocks_used;
    size_t prompt_blocks;
} share_probe;

static void on_step_blocks(void *ctx, const llmem_sched_step_report *rep)
{
    (void)rep;
    share_probe *p = ctx;
    size_t used = kv_used_blocks(p->e);
    if (used > p->most_blocks_used) p->most_blocks_used = used;
}

static void forks_share_blocks(void **state)
{
    (void)state;
    /* n = 3, sampled: sample k is what a request of one sample seeded
     * seed + k gives. */
    static job ref[3], got[1];
    jobs_init(ref, 3, 160);
    for (int k = 0; k < 3; k++) {
        memcpy(ref[k].prompt, ref[0].prompt, sizeof ref[0].prompt);
        ref[k].prompt_len = ref[0].prompt_len;
        ref[k].max_tokens = 24;
        ref[k].temperature = 0.8f;
        ref[k].seed = ref[0].seed + (uint32_t)k;
    }
    got[0] = ref[0];
    reference(ref, 3, 1);
    llmem_engine *e = engine(8, 512, 0, false, NULL);
    share_probe probe = {e, 0, (ref[0].prompt_len + 15) / 16};
    llmem_sched_options so = llmem_sched_options_default();
    so.on_step = on_step_blocks;
    so.step_ctx = &probe;
    llmem_sched *s;
    assert_ok(llmem_sched_create_engine(e, &so, &s));
    llmem_sched_params p = params_of(&got[0], 3);
    assert_ok(llmem_sched_submit(s, &p, &got[0].id));
    run_all(s);
    collect(s, &got[0], 3);
    for (int k = 0; k < 3; k++) {
        if (ref[k].nout[0] != got[0].nout[k] || memcmp(ref[k].out[0], got[0].out[k], ref[k].nout[0] * sizeof(int32_t)))
            fail_msg("sample %d differs from the same seed alone", k);
    }
    assert_true(memcmp(got[0].out[0], got[0].out[1], 24 * sizeof(int32_t)) != 0); /* really sampled */
    llmem_sched_stats st = {sizeof st};
    assert_ok(llmem_sched_get_stats(s, &st));
    assert_int_equal(st.forks_total, 2);
    assert_int_equal(st.fork_fallbacks_total, 0);
    /* Shared: three copies of the prompt would be 3 x prompt_blocks. */
    print_message("most blocks used %zu; prompt %zu blocks\n", probe.most_blocks_used, probe.prompt_blocks);
    assert_true(probe.most_blocks_used < 2 * probe.prompt_blocks + 6);
    llmem_sched_destroy(s);
    llmem_engine_destroy(e);
}

static void stop_tokens_and_sequences(void **state)
{
    (void)state;
    job j[1];
    jobs_init(j, 1, 30);
    j[0].temperature = 0;
    j[0].max_tokens = 40;
    reference(j, 1, 1);
    const int32_t *out = j[0].out[0];
    /* The first position whose token did not come before (a stop token
     * there stops there and nowhere earlier). */
    uint32_t at = 4;
    for (;; at++) {
        assert_true(at < 40);
        bool seen = false;
        for (uint32_t k = 0; k < at; k++) seen |= out[k] == out[at];
        if (!seen) break;
    }
    llmem_engine *e = engine(4, 512, 0, false, NULL);
    llmem_sched *s;
    assert_ok(llmem_sched_create_engine(e, NULL, &s));
    llmem_sched_params p = params_of(&j[0], 1);
    p.stop_tokens = &out[at];
    p.stop_token_count = 1;
    llmem_sched_req r;
    assert_ok(llmem_sched_submit(s, &p, &r));
    run_all(s);
    int32_t got[64];
    size_t n;
    assert_ok(llmem_sched_read(s, r, 0, 0, got, 64, &n));
    assert_int_equal(n, at);
    assert_memory_equal(got, out, at * sizeof *got);
    llmem_sched_info info;
    assert_ok(llmem_sched_get_info(s, r, 0, &info));
    assert_int_equal(info.finish, LLMEM_SCHED_FINISH_STOP);
    assert_ok(llmem_sched_release(s, r));
    /* A stop sequence of three tokens starting at position 10: the output
     * ends before it, and no reader ever saw its tokens. */
    const int32_t *seq = &out[10];
    uint32_t len = 3;
    p = params_of(&j[0], 1);
    p.stop_seqs = &seq;
    p.stop_seq_lens = &len;
    p.stop_seq_count = 1;
    assert_ok(llmem_sched_submit(s, &p, &r));
    size_t most = 0;
    while (llmem_sched_pending(s)) {
        assert_ok(llmem_sched_step(s, NULL));
        assert_ok(llmem_sched_get_info(s, r, 0, &info));
        if (info.visible > most) most = info.visible;
    }
    assert_ok(llmem_sched_read(s, r, 0, 0, got, 64, &n));
    /* The sequence may occur earlier in the output: it stops at its first. */
    uint32_t first = 10;
    for (uint32_t k = 0; k + 3 <= 10; k++)
        if (!memcmp(&out[k], seq, 3 * sizeof *seq)) {
            first = k;
            break;
        }
    assert_int_equal(n, first);
    assert_true(most <= first);
    assert_memory_equal(got, out, first * sizeof *got);
    assert_ok(llmem_sched_get_info(s, r, 0, &info));
    assert_int_equal(info.finish, LLMEM_SCHED_FINISH_STOP);
    assert_ok(llmem_sched_release(s, r));
    llmem_sched_destroy(s);
    llmem_engine_destroy(e);
}

static bool stop_at_five(void *ctx, const llmem_sched_event *ev)
{
    (void)ctx;
    return ev->kind == LLMEM_SCHED_EV_TOKEN && ev->index == 4;
}

static void admission_and_bad_input(void **state)
{
    (void)state;
    llmem_engine *e = engine(4, 512, 0, false, NULL);
    llmem_sched_options so = llmem_sched_options_default();
    so.max_waiting = 2;
    so.on_event = stop_at_five;
    llmem_sched *s;
    assert_ok(llmem_sched_create_engine(e, &so, &s));
    int32_t prompt[600];
    make_prompt(prompt, 600, 9);
    llmem_sched_params p = llmem_sched_params_default();
    llmem_sched_req r, r2, r3;
    assert_status(llmem_sched_submit(s, &p, &r), LLMEM_EINVAL); /* no prompt */
    p.prompt = prompt;
    p.prompt_len = 513;
    assert_status(llmem_sched_submit(s, &p, &r), LLMEM_ERANGE);
    assert_error_mentions("513");
    p.prompt_len = 20;
    prompt[3] = 512;
    assert_status(llmem_sched_submit(s, &p, &r), LLMEM_EINVAL);
    prompt[3] = 7;
    p.temperature = -1;
    assert_status(llmem_sched_submit(s, &p, &r), LLMEM_EINVAL);
    p.temperature = 0;
    p.n = 5; /* above max_batch (4) */
    assert_status(llmem_sched_submit(s, &p, &r), LLMEM_ECAPACITY);
    p.n = 1;
    assert_ok(llmem_sched_submit(s, &p, &r));
    assert_ok(llmem_sched_submit(s, &p, &r2));
    assert_status(llmem_sched_submit(s, &p, &r3), LLMEM_ECAPACITY); /* max_waiting */
    assert_ok(llmem_sched_step(s, NULL));                            /* both admitted */
    assert_ok(llmem_sched_submit(s, &p, &r3));
    run_all(s);
    llmem_sched_info info;
    assert_ok(llmem_sched_get_info(s, r, 0, &info));
    assert_int_equal(info.finish, LLMEM_SCHED_FINISH_STOP); /* the callback's stop */
    assert_int_equal(info.visible, 5);
    assert_true(info.first_token_ns >= info.arrival_ns && info.finish_ns >= info.first_token_ns);
    assert_status(llmem_sched_get_info(s, r, 1, &info), LLMEM_ERANGE);
    /* A prompt that fills the context: one token, finished at the context. */
    p.prompt_len = 512;
    so.on_event = NULL;
    llmem_sched_req full;
    assert_ok(llmem_sched_submit(s, &p, &full));
    run_all(s);
    llmem_sched_histogram h;
    assert_ok(llmem_sched_get_histogram(s, LLMEM_SCHED_HIST_TTFT, &h));
    assert_int_equal(h.count, 4);
    assert_true(h.cumulative[h.buckets - 1] <= h.count && h.sum > 0);
    assert_status(llmem_sched_get_histogram(s, (llmem_sched_hist_kind)9, &h), LLMEM_EINVAL);
    llmem_sched_destroy(s);
    llmem_engine_destroy(e);
}

/* ---- the simulation ------------------------------------------------------------------ */

static llmem_kv *sim_kv(size_t budget, llmem_pool **pool, llmem_resource *swap)
{
    llmem_pool_options po = llmem_pool_options_default();
    po.resource = llmem_resource_default();
    assert_ok(llmem_pool_create(&po, pool));
    llmem_kv_options ko = llmem_kv_options_default();
    ko.layers = 2;
    ko.kv_heads = 2;
    ko.head_dim = 16;
    ko.max_seq_len = 1024;
    ko.budget_bytes = budget;
    ko.pool = *pool;
    ko.prefix_cache = true;
    ko.swap_resource = swap;
    llmem_kv *kv;
    assert_ok(llmem_kv_create(&ko, &kv));
    return kv;
}

static void sim_run(uint64_t seed, bool swap_on, llmem_sched_stats *st, llmem_sched_sim_stats *ss, uint64_t *digest)
{
    llmem_resource *host = NULL;
    if (swap_on) assert_ok(llmem_os_resource_create(NULL, &host));
    llmem_pool *pool;
    llmem_kv *kv = sim_kv(64 * 1024 * 8, &pool, host); /* 2 KiB a block of 16 tokens... 4096 tokens */
    llmem_sched_sim_options sim = llmem_sched_sim_options_default();
    sim.kv = kv;
    sim.write_kv = true;
    sim.model = llmem_step_model_linear(0.001, 1e-6, 1e-5, 0);
    llmem_sched_options so = llmem_sched_options_default();
    so.max_batch = 16;
    so.max_step_tokens = 256;
    so.check = true;
    llmem_sched *s;
    assert_ok(llmem_sched_create_sim(&sim, &so, &s));
    uint64_t x = seed | 1;
    int32_t prompt[900];
    llmem_sched_req ids[60];
    for (int i = 0; i < 60; i++) {
        test_rng_next(&x);
        uint32_t len = 10 + (uint32_t)(x % 700);
        make_prompt(prompt, len, (uint32_t)(i % 7)); /* shared beginnings: prefix hits */
        llmem_sched_params p = llmem_sched_params_default();
        p.prompt = prompt;
        p.prompt_len = len;
        p.max_tokens = 5 + (uint32_t)(x >> 40) % 200;
        p.n = i % 9 == 0 ? 2 : 1;
        p.arrival_ns = (uint64_t)i * 20000000ull;
        if (llmem_sched_now_ns(s) < p.arrival_ns && !llmem_sched_pending(s)) assert_ok(llmem_sched_advance(s, p.arrival_ns));
        while (llmem_sched_now_ns(s) < p.arrival_ns && llmem_sched_pending(s)) assert_ok(llmem_sched_step(s, NULL));
        if (llmem_sched_now_ns(s) < p.arrival_ns) assert_ok(llmem_sched_advance(s, p.arrival_ns));
        assert_ok(llmem_sched_submit(s, &p, &ids[i]));
    }
    run_all(s);
    *digest = 0;
    for (int i = 0; i < 60; i++) {
        llmem_sched_info info;
        assert_ok(llmem_sched_get_info(s, ids[i], 0, &info));
        assert_int_equal(info.state, LLMEM_SCHED_FINISHED);
        *digest = *digest * 31 + info.finish_ns + info.generated;
        assert_ok(llmem_sched_release(s, ids[i]));
    }
    st->struct_size = sizeof *st;
    assert_ok(llmem_sched_get_stats(s, st));
    ss->struct_size = sizeof *ss;
    assert_ok(llmem_sched_get_sim_stats(s, ss));
    llmem_kv_stats ks = {sizeof ks};
    assert_ok(llmem_kv_get_stats(kv, &ks));
    assert_int_equal(ks.sequences, 0);
    assert_int_equal(ks.blocks_used, 0);
    llmem_sched_destroy(s);
    llmem_kv_destroy(kv);
    llmem_pool_destroy(pool);
    llmem_resource_destroy(host);
}

static void sim_deterministic_and_checked(void **state)
{
    (void)state;
    llmem_sched_stats a, b;
    llmem_sched_sim_stats sa, sb;
    uint64_t da, db;
    sim_run(7, false, &a, &sa, &da);
    sim_run(7, false, &b, &sb, &db);
    assert_true(da == db);
    assert_int_equal(a.steps_total, b.steps_total);
    assert_int_equal(a.requests_finished_total, 60);
    assert_true(a.preemptions_total > 0);
    assert_true(a.prefix_cache_hits_total > 0);
    assert_true(a.forks_total > 0);
    assert_int_equal(sa.kv_corruptions_total, 0);
    assert_true(sa.kv_positions_verified_total > 100);
    print_message("sim: %llu steps, %llu preemptions, %llu prefix hits, %llu forks, %llu positions verified\n",
                  (unsigned long long)a.steps_total, (unsigned long long)a.preemptions_total,
                  (unsigned long long)a.prefix_cache_hits_total, (unsigned long long)a.forks_total,
                  (unsigned long long)sa.kv_positions_verified_total);
    /* With a swap resource the preemptions swap, and every byte comes back
     * (write_kv verifies each swapped-in sequence). */
    llmem_sched_stats c;
    llmem_sched_sim_stats sc;
    uint64_t dc;
    sim_run(7, true, &c, &sc, &dc);
    assert_true(c.preemptions_swap_total > 0 && c.swap_ins_total > 0);
    assert_int_equal(sc.kv_corruptions_total, 0);
    assert_int_equal(c.requests_finished_total, 60);
}

typedef struct most_running {
    uint32_t most;
} most_running;

static void on_step_running(void *ctx, const llmem_sched_step_report *rep)
{
    most_running *m = ctx;
    if (rep->running > m->most) m->most = rep->running;
}

/* Run 12 requests of 200 tokens at once over a 2-layer KV; the most
 * sequences that ran together. With a predictor whose reserve for a step
 * counts activations in the same pool, admission must also leave room for
 * that reserve: fewer run at once. */
static uint32_t most_at_once(bool with_predictor)
{
    llmem_pool *pool;
    llmem_kv *kv = sim_kv(64 * 1024 * 8, &pool, NULL);
    llmem_predictor *pred = NULL;
    if (with_predictor) {
        llmem_predictor_options po = llmem_predictor_options_default();
        llmem_shape sh = {"t", 2, 128, 8, 2, 16, 512, 32000, 1024, 10000.0, 0};
        po.shape = sh;
        po.kv_elem_bytes = 2;
        po.activations_apart = false; /* the workspace would come from this pool: a large reserve */
        assert_ok(llmem_predictor_create(&po, &pred));
    }
    llmem_sched_sim_options sim = llmem_sched_sim_options_default();
    sim.kv = kv;
    llmem_sched_options so = llmem_sched_options_default();
    most_running m = {0};
    so.predictor = pred;
    so.on_step = on_step_running;
    so.step_ctx = &m;
    llmem_sched *s;
    assert_ok(llmem_sched_create_sim(&sim, &so, &s));
    int32_t prompt[200];
    make_prompt(prompt, 200, 3);
    for (int i = 0; i < 12; i++) {
        llmem_sched_params p = llmem_sched_params_default();
        p.prompt = prompt;
        p.prompt_len = 200;
        p.max_tokens = 20;
        llmem_sched_req id;
        assert_ok(llmem_sched_submit(s, &p, &id));
    }
    run_all(s);
    llmem_sched_stats st = {sizeof st};
    assert_ok(llmem_sched_get_stats(s, &st));
    assert_int_equal(st.requests_finished_total, 12);
    assert_int_equal(st.samples_length_total, 12);
    llmem_sched_destroy(s);
    llmem_predictor_destroy(pred);
    llmem_kv_destroy(kv);
    llmem_pool_destroy(pool);
    return m.most;
}

static void predictor_reserve_limits_admission(void **state)
{
    (void)state;
    uint32_t free_run = most_at_once(false), reserved = most_at_once(true);
    print_message("most sequences at once: %u without the predictor, %u with its reserve\n", free_run, reserved);
    assert_int_equal(free_run, 12); /* 12 x 220 tokens fit the 4096 */
    assert_true(reserved >= 1 && reserved <= free_run / 2);
}

/* Cancelling a swapped-out request gives its swap memory back at once. */
static void cancel_swapped_frees_swap(void **state)
{
    (void)state;
    llmem_resource *host;
    assert_ok(llmem_os_resource_create(NULL, &host));
    llmem_pool *pool;
    llmem_kv *kv = sim_kv(64 * 1024 * 2, &pool, host); /* 1024 tokens */
    llmem_sched_sim_options sim = llmem_sched_sim_options_default();
    sim.kv = kv;
    sim.write_kv = true;
    llmem_sched *s;
    assert_ok(llmem_sched_create_sim(&sim, NULL, &s));
    int32_t prompt[300];
    llmem_sched_req ids[6];
    for (int i = 0; i < 6; i++) {
        make_prompt(prompt, 300, 40 + (uint32_t)i);
        llmem_sched_params p = llmem_sched_params_default();
        p.prompt = prompt;
        p.prompt_len = 60 + 30 * (uint32_t)i;
        p.max_tokens = 400;
        assert_ok(llmem_sched_submit(s, &p, &ids[i]));
    }
    llmem_kv_stats ks = {sizeof ks};
    for (int guard = 0; guard < 5000; guard++) {
        assert_ok(llmem_sched_step(s, NULL));
        assert_ok(llmem_kv_get_stats(kv, &ks));
        if (ks.swapped_sequences) break;
    }
    assert_true(ks.swapped_sequences > 0 && ks.swap_bytes_held > 0);
    for (int i = 0; i < 6; i++) {
        llmem_sched_info info;
        assert_ok(llmem_sched_get_info(s, ids[i], 0, &info));
        if (info.state == LLMEM_SCHED_SWAPPED) assert_ok(llmem_sched_cancel(s, ids[i]));
    }
    assert_ok(llmem_kv_get_stats(kv, &ks));
    assert_int_equal(ks.swapped_sequences, 0);
    assert_int_equal(ks.swap_bytes_held, 0);
    run_all(s);
    llmem_sched_sim_stats ss = {sizeof ss};
    assert_ok(llmem_sched_get_sim_stats(s, &ss));
    assert_int_equal(ss.kv_corruptions_total, 0);
    llmem_sched_destroy(s);
    llmem_kv_destroy(kv);
    llmem_pool_destroy(pool);
    llmem_resource_destroy(host);
}

static void sim_bad_options(void **state)
{
    (void)state;
    llmem_sched_sim_options sim = llmem_sched_sim_options_default();
    llmem_sched *s;
    assert_status(llmem_sched_create_sim(&sim, NULL, &s), LLMEM_EINVAL); /* no KV */
    llmem_pool *pool;
    sim.kv = sim_kv(0, &pool, NULL);
    sim.model = llmem_step_model_roofline(NULL, 2, 2);
    sim.model.mfu = 2;
    assert_status(llmem_sched_create_sim(&sim, NULL, &s), LLMEM_EINVAL);
    sim.model = llmem_step_model_linear(0.001, 0, 0, 0);
    llmem_sched_options so = llmem_sched_options_default();
    so.preempt = (llmem_sched_preempt)7;
    assert_status(llmem_sched_create_sim(&sim, &so, &s), LLMEM_EINVAL);
    assert_ok(llmem_sched_create_sim(&sim, NULL, &s));
    assert_status(llmem_sched_step(NULL, NULL), LLMEM_EINVAL);
    assert_ok(llmem_sched_step(s, NULL)); /* nothing to do: idle */
    assert_ok(llmem_sched_advance(s, 5000000000ull));
    assert_true(llmem_sched_now_ns(s) == 5000000000ull);
    llmem_sched_destroy(s);
    llmem_sched_destroy(NULL);
    llmem_kv_destroy(sim.kv);
    llmem_pool_destroy(pool);
}

static void step_model_fit_recovers_coefficients(void **state)
{
    (void)state;
    llmem_step_model truth = llmem_step_model_linear(0.002, 3e-5, 4e-4, 2e-9);
    llmem_step_shape sh[40];
    double t[40];
    for (int i = 0; i < 40; i++) {
        memset(&sh[i], 0, sizeof sh[i]);
        sh[i].prefill_tokens = (uint64_t)(i % 5) * 100;
        sh[i].decode_seqs = (uint32_t)(i / 5);
        sh[i].attn_pairs = (double)((i * 7919) % 13) * 1e5;
        t[i] = llmem_step_model_time(&truth, &sh[i]);
    }
    llmem_step_model fit;
    double err;
    assert_ok(llmem_step_model_fit(sh, t, 40, false, &fit, &err));
    assert_true(fabs(fit.c0 - truth.c0) < 1e-9 && fabs(fit.c_prefill_token - truth.c_prefill_token) < 1e-12);
    assert_true(fabs(fit.c_decode_seq - truth.c_decode_seq) < 1e-11 && fabs(fit.c_attn_pair - truth.c_attn_pair) < 1e-15);
    assert_true(err < 1e-6);
    assert_status(llmem_step_model_fit(sh, t, 3, false, &fit, &err), LLMEM_EINVAL);
    llmem_step_model rfit;
    assert_ok(llmem_step_model_fit(sh, t, 40, true, &rfit, &err)); /* exact data: both weightings agree */
    assert_true(fabs(rfit.c_prefill_token - truth.c_prefill_token) < 1e-12 && err < 1e-6);
    /* The roofline: decode of a 7B model is bandwidth-bound. */
    llmem_shape shape;
    assert_ok(llmem_shape_preset("llama-2-7b", &shape));
    llmem_step_model roof = llmem_step_model_roofline(&shape, 2, 2);
    llmem_step_shape one = {1, 0, 1, 1000, 1000, 0};
    double dt = llmem_step_model_time(&roof, &one);
    assert_true(dt > 13.4e9 / 3.35e12 && dt < 13.4e9 / 3.35e12 + 0.001);
}

static void calibration_on_the_engine(void **state)
{
    (void)state;
    llmem_engine *e = engine(8, 256, 0, false, NULL);
    llmem_step_model m;
    llmem_step_calibration rep = {sizeof rep};
    assert_ok(llmem_step_model_calibrate(e, 1, &m, &rep));
    print_message("calibrated: c0 %.3g s, %.3g s/prefill token, %.3g s/decode seq, %.3g s/attn pair; "
                  "%u points, error %.1f%%\n",
                  m.c0, m.c_prefill_token, m.c_decode_seq, m.c_attn_pair, rep.points, 100 * rep.rel_error);
    assert_int_equal(m.kind, LLMEM_STEP_LINEAR);
    assert_true(rep.points >= 10);
    assert_true(m.c_prefill_token > 0);
    llmem_engine_info info;
    assert_ok(llmem_engine_get_info(e, &info));
    assert_int_equal(info.live_seqs, 0);
    llmem_engine_destroy(e);
}

static int setup(void **state)
{
    (void)state;
    llmem_log_set(NULL, NULL, LLMEM_LOG_ERROR);
    if (!g_model) assert_ok(llmem_model_open(MODEL, NULL, &g_model));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    llmem_model_close(g_model);
    return 0;
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sim_deterministic_and_checked),
        cmocka_unit_test(sim_bad_options),
        cmocka_unit_test(predictor_reserve_limits_admission),
        cmocka_unit_test(cancel_swapped_frees_swap),
        cmocka_unit_test(step_model_fit_recovers_coefficients),
    };
    /* The real engine on stories260K (test_sched_shared). */
    const struct CMUnitTest shared_tests[] = {
        cmocka_unit_test(alone_matches_a_plain_engine_loop),
        cmocka_unit_test(batched_chunked_equals_alone),
        cmocka_unit_test(preemption_recompute_same_tokens),
        cmocka_unit_test(preemption_swap_same_tokens),
        cmocka_unit_test(cancellation_frees_kv_at_once),
        cmocka_unit_test(prefix_cache_skips_prefill),
        cmocka_unit_test(refused_step_leaves_nothing_cached),
        cmocka_unit_test(forks_share_blocks),
        cmocka_unit_test(stop_tokens_and_sequences),
        cmocka_unit_test(admission_and_bad_input),
        cmocka_unit_test(calibration_on_the_engine),
    };
    return test_main(argc, argv, "test_sched", TEST_GROUP(tests, NULL, NULL), TEST_GROUP(shared_tests, setup, teardown),
                     (const char *const[]){"models/stories260K.bin", NULL});
}
