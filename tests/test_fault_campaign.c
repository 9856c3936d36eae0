/*
 * test_fault_campaign.c - fault campaigns over whole scenarios (issue 8):
 * count the resource calls a scenario makes, then rerun it failing call k,
 * for every k, and check that each run ends clean.
 *
 * Engine: a small synthetic llama (dim 64, 3 layers, 4 KV heads, vocab 128,
 * context 256; written to a temporary GGUF) serves three requests (prompts
 * of 100, 120 and 60 tokens; 24 + 24 + 16 = 64 tokens generated greedily;
 * the third arrives at step 6, after the first decode step gave the
 * prefill's workspace pages back). The engine's pool runs over
 * fault(tracking(os)), and so does everything else the engine takes through
 * llmem: KV slabs (the pool), the KV manager's tables (its metadata pool,
 * kv options.meta_resource) and the activation workspace (mapped from the
 * pool's resource). The driver is a scheduler with a documented recovery
 * for each call that can fail:
 *  - pool create, llmem_engine_create, llmem_engine_seq_create: LLMEM_ENOMEM,
 *    nothing was made; try again;
 *  - llmem_engine_step: LLMEM_ENOMEM, no sequence changed (lengths, and
 *    every KV byte of every sequence in the batch, checksummed); policy
 *    RETRY runs the same step again; policy PREEMPT first frees the most
 *    recently admitted sequence of a batch of two or more (readmitted the
 *    next step and recomputed: one prefill of its prompt and every token it
 *    had generated) and runs the rest again;
 *  - llmem_kv_check (the test's own check) borrows scratch from the
 *    metadata pool: LLMEM_ENOMEM there is retried.
 * With one injected failure (fail_nth = k): every run produces exactly the
 * tokens of the run without faults; the KV of every sequence in a step is
 * checksummed before and after each step from the one that makes call k
 * (known from the run without faults) to the step after the failure (a
 * failed step changes no byte, a good one none of the old positions);
 * every request that was not preempted ends with KV bytes identical to the
 * run without faults; llmem_kv_check after every step; after teardown the
 * tracking resource holds nothing and refused nothing. Each k is classed:
 * absorbed (a call failed, no API call did), surfaced+retried, or
 * preempted+recomputed. Failing forever from k (fail_count = UINT64_MAX),
 * the run ends in a clean LLMEM_ENOMEM, with no leak. Counted calls: map and
 * commit (the default); a second campaign counts the others (unmap,
 * decommit, copy). Those made by a destroy cannot report a failure (destroy
 * returns nothing; a refused unmap can only leak), so that campaign
 * disarms the fault before teardown and covers the calls before it.
 *
 * Replay: the first 200 requests of the Azure code trace
 * (the shared folder's traces/: the group --shared, CTest's
 * test_fault_campaign_shared, skipped when absent) through the replay
 * (llmem/replay.h: the library's scheduler over a simulated engine; PAGED,
 * llama-2-7b shape, 3 GiB of KV so it preempts and rejects what never
 * fits, slabs of 8 blocks), without and with the controller, its KV pool
 * over fault(tracking(sim-device)). The scheduler's recovery is documented
 * in llmem/replay.h (a refused step preempts, a refused admission leaves
 * the request queued, a request alone is tried twice). With one failure,
 * every run completes and rejects exactly the requests the run without
 * faults does; failing forever, it still finishes cleanly with every
 * request completed or
 * rejected; no leak, llmem_kv_check after every step. k: every k up to
 * REPLAY_DENSE, then a stride covering the rest in about REPLAY_STRIDED runs
 * (LLMEM_FAULT_FULL=1: every k).
 *
 * The figures (calls, runs, outcomes, time) are printed for
 * docs/RELIABILITY.md.
 */

#include "test_util.h"
#include "support/cases.h"
#include "support/synth_model.h"
#include "support/tmpdir.h"

#define KiB ((size_t)1 << 10)

static bool full_campaign(void)
{
    const char *v = getenv("LLMEM_FAULT_FULL");
    return v && *v && strcmp(v, "0") != 0;
}

static double secs_since(uint64_t t0_ms) { return (double)(test_now_ms() - t0_ms) / 1000.0; }

/* ---- the resource stack ------------------------------------------------------------ */

typedef struct stack {
    test_fault_stack r; /* fault(tracking(os or sim)) */
    bool device;
} stack;

static void stack_init(stack *s, bool device)
{
    memset(s, 0, sizeof *s);
    s->device = device;
    llmem_resource *base = NULL;
    if (device) {
        llmem_sim_options o = llmem_sim_options_default();
        o.name = "campaign-sim";
        o.capacity = (size_t)24 << 30;
        o.granularity = (size_t)2 << 20; /* a GPU's mapping granule; also keeps the simulator's bitmaps short */
        o.discard_data = true;
        assert_ok(llmem_sim_resource_create(&o, &base));
    }
    test_fault_stack_open(&s->r, base);
}

static void stack_fini(stack *s)
{
    test_fault_stack_close(&s->r);
}

static void arm(stack *s, uint64_t k, bool forever, unsigned ops)
{
    test_fault_arm(s->r.fault, k, forever ? UINT64_MAX : 1, ops);
}

static llmem_fault_stats fstats(const stack *s)
{
    llmem_fault_stats f;
    memset(&f, 0, sizeof f);
    f.struct_size = sizeof f;
    assert_ok(llmem_fault_resource_get_stats(s->r.fault, &f));
    return f;
}

/* After teardown: nothing mapped, nothing refused. */
static void assert_no_leak(const stack *s, const char *what, uint64_t k)
{
    llmem_tracking_stats ts;
    memset(&ts, 0, sizeof ts);
    ts.struct_size = sizeof ts;
    assert_ok(llmem_tracking_resource_get_stats(s->r.track, &ts));
    if (ts.live_mappings || ts.live_bytes) {
        llmem_tracking_resource_report(s->r.track, stderr, NULL);
        fail_msg("%s, k = %llu: %llu mappings (%llu bytes) leaked", what, (unsigned long long)k,
                 (unsigned long long)ts.live_mappings, (unsigned long long)ts.live_bytes);
    }
    if (ts.refused_total)
        fail_msg("%s, k = %llu: %llu invalid resource calls refused by tracking", what, (unsigned long long)k,
                 (unsigned long long)ts.refused_total);
    llmem_resource_stats rs;
    memset(&rs, 0, sizeof rs);
    assert_ok(llmem_resource_get_stats(s->r.base, &rs));
    assert_int_equal(rs.mappings, 0);
    assert_int_equal(rs.mapped_bytes, 0);
    assert_int_equal(rs.committed_bytes, 0);
}

/* A call failed: it must be the injected failure. */
static void assert_injected(llmem_status st, const char *what)
{
    if (st != LLMEM_ENOMEM)
        fail_msg("%s failed with %s, expected the injected LLMEM_ENOMEM (%s)", what, llmem_status_name(st),
                 llmem_error_message());
}

/* ---- the synthetic model ------------------------------------------------------------ */

enum { M_DIM = 64, M_FFN = 128, M_HEADS = 4, M_KVH = 4, M_LAYERS = 3, M_VOCAB = 128, M_CTX = 256 };

static void write_model(const char *path)
{
    const test_synth_model sm = {M_DIM, M_FFN, M_HEADS, M_KVH, M_LAYERS, M_VOCAB, M_CTX,
                                 LLMEM_DTYPE_F32, 10000.0f, M_DIM / M_HEADS, false};
    test_synth_write(&sm, path);
}

/* ---- the engine scenario ------------------------------------------------------------ */

enum { NREQ = 3, MAXTOK = 256 };

typedef struct req_spec {
    uint32_t prompt, gen, arrive_step;
} req_spec;

/* 100 + 120 prompt tokens in the first step (a workspace large enough that
 * the first decode step gives pages back), the third request arrives at
 * step 6: its prefill commits some again. 24 + 24 + 16 = 64 tokens
 * generated. */
static const req_spec REQS[NREQ] = {{100, 24, 0}, {120, 24, 0}, {60, 16, 6}};

typedef enum policy { POLICY_RETRY, POLICY_PREEMPT } policy;

typedef enum outcome {
    OUT_CLEAN,     /* no failure injected (never for k <= n) */
    OUT_ABSORBED,  /* a call failed, no API call did */
    OUT_RETRIED,   /* an API call failed with LLMEM_ENOMEM and the same call succeeded again */
    OUT_PREEMPTED, /* a step failed, a sequence was preempted and recomputed */
    OUT_ENDED,     /* (failing forever) the run stopped at a clean LLMEM_ENOMEM */
    OUT_COUNT_
} outcome;

static const char *const outcome_names[OUT_COUNT_] = {"clean", "absorbed", "surfaced+retried",
                                                      "preempted+recomputed", "ended with ENOMEM"};

typedef struct req_state {
    llmem_engine_seq seq;   /* 0: not admitted (waiting, preempted, or done) */
    bool admitted_once, done;
    int32_t toks[MAXTOK];   /* prompt, then generated */
    uint32_t ntok;          /* prompt + generated */
    uint32_t fed;           /* tokens of toks the sequence holds */
    uint64_t sum;           /* checksum of its KV before the step */
} req_state;

enum { MAXSTEPS = 400 };

typedef struct eng_run {
    int32_t out[NREQ][MAXTOK];
    uint32_t nout[NREQ];
    uint64_t final_sum[NREQ]; /* checksum of each request's whole KV when it ended (0: never ended) */
    bool was_preempted[NREQ];
    uint64_t calls_after[MAXSTEPS]; /* counted calls when step i returned (the reference run's) */
    unsigned surfaced, retried, preempted, recomputed;
    unsigned check_refused; /* of surfaced: llmem_kv_check's scratch table refused */
    unsigned steps;
    llmem_status end;       /* LLMEM_OK, or the error that ended the run */
    llmem_engine *e;        /* left for engine_teardown */
    llmem_pool *pool;
} eng_run;

static llmem_model *g_model;

static int32_t prompt_tok(uint32_t r, uint32_t i) { return (int32_t)(1 + (r * 37u + i * 11u) % (M_VOCAB - 1)); }

static uint64_t mix_words(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
    }
    return h;
}

/* Checksum of the KV bytes of the first `n` positions of a sequence, all
 * layers, K and V, read through its block tables. */
static uint64_t kv_sum(llmem_engine *e, llmem_engine_seq s, size_t n)
{
    enum { CAP = MAXTOK / 16 + 2 };
    llmem_kv *kv = llmem_engine_kv(e);
    llmem_kv_seq ks = llmem_engine_seq_kv(e, s);
    assert_true(ks != 0);
    size_t tb = llmem_kv_token_layer_bytes(kv), B = 16;
    assert_int_equal(tb % 8, 0);
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t l = 0; l < M_LAYERS; l++) {
        void *kt[CAP], *vt[CAP];
        size_t nb = 0;
        assert_ok(llmem_kv_seq_table(kv, ks, l, kt, vt, CAP, &nb));
        assert_true(nb <= CAP && nb * B >= n);
        for (size_t b = 0; b * B < n; b++) {
            size_t rows = n - b * B < B ? n - b * B : B;
            h = mix_words(h, kt[b], rows * tb);
            h = mix_words(h, vt[b], rows * tb);
        }
    }
    return h;
}

static llmem_status make_pool(stack *s, llmem_pool **out)
{
    llmem_pool_options po = llmem_pool_options_default();
    po.name = "campaign-engine";
    po.resource = s->r.fault;
    po.first_superblock_bytes = 64 * KiB; /* small superblocks: the KV grows through several */
    po.max_superblock_bytes = 64 * KiB;
    po.purge = LLMEM_POOL_PURGE_MANUAL;    /* no background thread: the calls are deterministic */
    po.decay_ms = UINT32_MAX;              /* nor a clock */
    return llmem_pool_create(&po, out);
}

static llmem_status make_engine(llmem_pool *pool, llmem_engine **out)
{
    llmem_engine_options o = llmem_engine_options_default();
    o.threads = 1;
    o.max_seqs = 4;
    o.max_step_tokens = 256;
    o.pool = pool;
    return llmem_engine_create(g_model, &o, out);
}

/* A call failed: with one injected failure, the first try of the same call
 * again must succeed; failing forever, a second refusal ends the run.
 * Returns true to try again. */
static bool again(eng_run *run, llmem_status st, const char *what, int *fails, bool forever)
{
    assert_injected(st, what);
    run->surfaced++;
    if ((*fails)++ > 0) {
        if (!forever) fail_msg("%s failed twice with one injected failure: %s", what, llmem_error_message());
        run->end = st;
        return false;
    }
    run->retried++;
    return true;
}

/* llmem_kv_check borrows a scratch table from the manager's metadata pool,
 * so it makes counted calls of its own: LLMEM_ENOMEM there is a refusal,
 * not a violation; try again (failing forever, the check is skipped). */
static void check_kv(eng_run *run, llmem_kv *kv, bool forever)
{
    llmem_status st = llmem_kv_check(kv);
    if (st == LLMEM_ENOMEM) {
        run->surfaced++;
        run->check_refused++;
        st = llmem_kv_check(kv);
        if (st == LLMEM_ENOMEM && forever) return;
        run->retried++;
    }
    if (st) fail_msg("llmem_kv_check: %s: %s", llmem_status_name(st), llmem_error_message());
}

/* Run the scenario up to its teardown (engine_teardown). Failing forever
 * it may end early (run->end). ref: the run without faults, whose
 * calls_after says in which step call k comes; every KV byte is then
 * checksummed before and after each step from that one until the step
 * after the failure (NULL: every step). */
static void engine_scenario(stack *s, policy pol, bool forever, uint64_t k, const eng_run *ref, eng_run *run)
{
    memset(run, 0, sizeof *run);
    unsigned inj_step = UINT32_MAX;
    req_state rq[NREQ];
    memset(rq, 0, sizeof rq);
    for (uint32_t r = 0; r < NREQ; r++) {
        for (uint32_t i = 0; i < REQS[r].prompt; i++) rq[r].toks[i] = prompt_tok(r, i);
        rq[r].ntok = REQS[r].prompt;
    }
    llmem_status st;
    int fails = 0;
    while ((st = make_pool(s, &run->pool)) != LLMEM_OK)
        if (!again(run, st, "pool create", &fails, forever)) goto teardown;
    fails = 0;
    while ((st = make_engine(run->pool, &run->e)) != LLMEM_OK)
        if (!again(run, st, "engine create", &fails, forever)) goto teardown;
    llmem_engine *e = run->e;
    llmem_kv *kv = llmem_engine_kv(e);
    for (unsigned step = 0;; step++) {
        bool all_done = true;
        for (uint32_t r = 0; r < NREQ; r++) all_done &= rq[r].done;
        if (all_done) break;
        assert_true(step < MAXSTEPS);
        if (inj_step == UINT32_MAX && fstats(s).injected_total) inj_step = step;
        bool checking = !ref || forever || (ref->calls_after[step] >= k && (inj_step == UINT32_MAX || step <= inj_step + 1));
        /* Admission (arrivals, and preempted requests coming back). */
        for (uint32_t r = 0; r < NREQ; r++) {
            if (rq[r].done || rq[r].seq || REQS[r].arrive_step > step) continue;
            fails = 0;
            while ((st = llmem_engine_seq_create(e, &rq[r].seq)) != LLMEM_OK)
                if (!again(run, st, "seq create", &fails, forever)) goto teardown;
            if (rq[r].admitted_once) run->recomputed++;
            rq[r].admitted_once = true;
            rq[r].fed = 0;
        }
        /* The batch: every admitted request, in admission order (request
         * order here); a fresh or readmitted one brings all its tokens. */
        llmem_engine_batch_item items[NREQ];
        uint32_t who[NREQ];
        size_t count = 0;
        for (uint32_t r = 0; r < NREQ; r++) {
            if (!rq[r].seq) continue;
            assert_int_equal(llmem_engine_seq_length(e, rq[r].seq), rq[r].fed);
            if (checking) rq[r].sum = kv_sum(e, rq[r].seq, rq[r].fed);
            items[count] = (llmem_engine_batch_item){rq[r].seq, rq[r].toks + rq[r].fed, rq[r].ntok - rq[r].fed};
            who[count++] = r;
        }
        assert_true(count > 0);
        fails = 0;
        while ((st = llmem_engine_step(e, items, count)) != LLMEM_OK) {
            if (inj_step == UINT32_MAX) inj_step = step;
            /* All or nothing: no sequence moved, no KV byte changed. */
            assert_true(checking);
            for (size_t i = 0; i < count; i++) {
                req_state *q = &rq[who[i]];
                assert_int_equal(llmem_engine_seq_length(e, q->seq), q->fed);
                if (kv_sum(e, q->seq, q->fed) != q->sum) fail_msg("request %u: KV changed by a failed step", who[i]);
            }
            check_kv(run, kv, forever);
            if (pol == POLICY_PREEMPT && count > 1) {
                assert_injected(st, "step");
                run->surfaced++;
                /* Free the most recently admitted: recomputed when readmitted. */
                req_state *v = &rq[who[count - 1]];
                run->was_preempted[who[count - 1]] = true;
                assert_ok(llmem_engine_seq_free(e, v->seq));
                v->seq = 0;
                v->fed = 0;
                count--;
                run->preempted++;
                continue;
            }
            if (!again(run, st, "step", &fails, forever)) goto teardown;
        }
        run->steps++;
        run->calls_after[step] = fstats(s).calls_total;
        for (size_t i = 0; i < count; i++) {
            req_state *q = &rq[who[i]];
            /* The old positions kept their bytes. */
            if (checking && kv_sum(e, q->seq, q->fed) != q->sum)
                fail_msg("request %u: KV of old positions changed", who[i]);
            q->fed = q->ntok;
            assert_true(q->ntok < MAXTOK);
            q->toks[q->ntok++] = llmem_logits_argmax(llmem_engine_logits(e, i), M_VOCAB);
            if (q->ntok - REQS[who[i]].prompt == REQS[who[i]].gen) {
                run->final_sum[who[i]] = kv_sum(e, q->seq, q->fed);
                assert_ok(llmem_engine_seq_free(e, q->seq));
                q->seq = 0;
                q->done = true;
            }
        }
        check_kv(run, kv, forever);
    }
teardown:
    for (uint32_t r = 0; r < NREQ; r++) {
        if (rq[r].seq) assert_ok(llmem_engine_seq_free(run->e, rq[r].seq));
        run->nout[r] = rq[r].ntok - REQS[r].prompt;
        memcpy(run->out[r], rq[r].toks + REQS[r].prompt, run->nout[r] * sizeof(int32_t));
    }
    if (run->e) check_kv(run, llmem_engine_kv(run->e), forever);
}

static void engine_teardown(eng_run *run)
{
    llmem_engine_destroy(run->e);
    llmem_pool_destroy(run->pool);
    run->e = NULL;
    run->pool = NULL;
}

static void same_tokens(const eng_run *got, const eng_run *want, uint64_t k)
{
    for (uint32_t r = 0; r < NREQ; r++) {
        if (got->nout[r] != want->nout[r])
            fail_msg("k = %llu: request %u generated %u tokens, %u without faults", (unsigned long long)k, r,
                     got->nout[r], want->nout[r]);
        for (uint32_t i = 0; i < got->nout[r]; i++)
            if (got->out[r][i] != want->out[r][i])
                fail_msg("k = %llu: request %u token %u is %d, %d without faults", (unsigned long long)k, r, i,
                         got->out[r][i], want->out[r][i]);
    }
}

/* Every request that was never preempted ends with the KV bytes it ends
 * with without faults; a recomputed one must only produce the same tokens
 * (its prefill computes the cache in one pass: the same values within
 * rounding). Returns how many recomputed caches differ in bits. */
static unsigned same_kv(const eng_run *got, const eng_run *want, uint64_t k)
{
    unsigned differ = 0;
    for (uint32_t r = 0; r < NREQ; r++) {
        if (!got->final_sum[r]) continue; /* it never ended (failing forever) */
        if (got->final_sum[r] == want->final_sum[r]) continue;
        if (!got->was_preempted[r])
            fail_msg("k = %llu: request %u ended with KV bytes that differ from the run without faults",
                     (unsigned long long)k, r);
        differ++;
    }
    return differ;
}

static void open_model(void)
{
    char path[512];
    test_tmp_file(path, sizeof path, "fault-campaign");
    write_model(path);
    assert_ok(llmem_model_open(path, NULL, &g_model));
    unlink(path); /* mapped: the bytes stay */
}

/* One campaign: count the calls (ops) without faults, then fail call k for
 * every k. Returns the number of calls counted. */
static uint64_t engine_campaign(policy pol, unsigned ops, bool forever)
{
    uint64_t t0 = test_now_ms();
    stack s;
    stack_init(&s, false);
    bool all_ops = ops != 0; /* the calls that give memory back (and copies) */
    eng_run ref, run;
    arm(&s, 0, false, ops); /* counting only */
    engine_scenario(&s, POLICY_RETRY, false, 0, NULL, &ref);
    assert_int_equal(ref.surfaced, 0);
    assert_int_equal(ref.end, LLMEM_OK);
    uint64_t n_run = fstats(&s).calls_total; /* calls before teardown */
    engine_teardown(&ref);
    uint64_t n = fstats(&s).calls_total;
    assert_no_leak(&s, "engine, no faults", 0);
    uint32_t total = 0;
    for (uint32_t r = 0; r < NREQ; r++) {
        assert_int_equal(ref.nout[r], REQS[r].gen);
        total += ref.nout[r];
    }
    assert_int_equal(total, 64);
    /* The same again: the count does not depend on timing. */
    arm(&s, 0, false, ops);
    engine_scenario(&s, POLICY_RETRY, false, 0, NULL, &run);
    engine_teardown(&run);
    assert_int_equal(fstats(&s).calls_total, n);
    same_tokens(&run, &ref, 0);

    uint64_t n_all = 0;
    if (all_ops) {
        arm(&s, 0, false, LLMEM_FAULT_OP_ALL);
        engine_scenario(&s, POLICY_RETRY, false, 0, NULL, &run);
        engine_teardown(&run);
        n_all = fstats(&s).calls_total;
    }
    unsigned count[OUT_COUNT_] = {0}, kv_differ = 0;
    uint64_t kmax = all_ops ? n_run : n;
    char line[4096];
    size_t at = 0;
    for (uint64_t k = 1; k <= kmax; k++) {
        arm(&s, k, forever, ops);
        engine_scenario(&s, pol, forever, k, &ref, &run);
        llmem_fault_stats fs = fstats(&s);
        if (all_ops) arm(&s, 0, false, ops); /* destroy cannot report a refused unmap: see the top */
        engine_teardown(&run);
        assert_no_leak(&s, "engine", k);
        outcome oc;
        if (forever) {
            assert_true(fs.injected_total >= 1);
            if (run.end == LLMEM_OK) {
                same_tokens(&run, &ref, k);
                kv_differ += same_kv(&run, &ref, k);
                oc = run.surfaced ? (run.preempted ? OUT_PREEMPTED : OUT_RETRIED) : OUT_ABSORBED;
            } else {
                assert_int_equal(run.end, LLMEM_ENOMEM);
                oc = OUT_ENDED;
            }
        } else {
            assert_int_equal(fs.injected_total, 1);
            assert_int_equal(run.end, LLMEM_OK);
            same_tokens(&run, &ref, k);
            kv_differ += same_kv(&run, &ref, k);
            oc = run.preempted ? OUT_PREEMPTED : run.surfaced ? OUT_RETRIED : OUT_ABSORBED;
            if (run.preempted) assert_int_equal(run.recomputed, run.preempted);
        }
        count[oc]++;
        if (at < sizeof line - 64)
            at += (size_t)snprintf(line + at, sizeof line - at, " %llu:%c", (unsigned long long)k,
                                   oc == OUT_ABSORBED ? 'a' : oc == OUT_RETRIED ? 'r' : oc == OUT_PREEMPTED ? 'p' : 'e');
    }
    print_message("engine campaign, %s, %s, %s: %llu counted calls (%llu before teardown), %llu runs:",
                  all_ops ? "unmap+decommit+copy" : "map+commit", pol == POLICY_RETRY ? "retry" : "preempt",
                  forever ? "failing forever from k" : "call k fails once", (unsigned long long)n,
                  (unsigned long long)n_run, (unsigned long long)kmax);
    for (int c = 0; c < OUT_COUNT_; c++)
        if (count[c]) print_message(" %s %u;", outcome_names[c], count[c]);
    if (all_ops) print_message(" (all five ops: %llu calls);", (unsigned long long)n_all);
    print_message(" recomputed caches differing in bits %u; 0 leaks; %.2f s\n  per k:%s\n", kv_differ,
                  secs_since(t0), line);
    stack_fini(&s);
    return n;
}

TEST_CASE(engine_fail_once_retry, engine_campaign(POLICY_RETRY, 0, false))
TEST_CASE(engine_fail_once_preempt, engine_campaign(POLICY_PREEMPT, 0, false))
TEST_CASE(engine_fail_forever, engine_campaign(POLICY_PREEMPT, 0, true))
TEST_CASE(engine_fail_once_release_ops,
          engine_campaign(POLICY_RETRY, LLMEM_FAULT_OP_UNMAP | LLMEM_FAULT_OP_DECOMMIT | LLMEM_FAULT_OP_COPY, false))

/* ---- the replay campaign ------------------------------------------------------------ */

#define TRACE test_shared_path("traces/AzureLLMInferenceTrace_code.csv")

/* Every k up to REPLAY_DENSE, then a stride that covers the rest in about
 * REPLAY_STRIDED runs (LLMEM_FAULT_FULL=1: every k). A replay run takes
 * about 0.05 s in a normal build, 0.3 s under ASan. */
#if defined(TEST_ASAN) || defined(TEST_TSAN)
enum { REPLAY_DENSE = 16, REPLAY_STRIDED = 16 };
#else
enum { REPLAY_DENSE = 150, REPLAY_STRIDED = 150 };
#endif

static void replay_setup(llmem_replay_options *o, stack *s, bool controller)
{
    *o = llmem_replay_options_default();
    o->strategy = LLMEM_KV_PAGED;
    assert_ok(llmem_shape_preset("llama-2-7b", &o->shape));
    o->kv_budget = (size_t)3 << 30; /* 6144 tokens: the first 200 requests preempt */
    o->max_seq_len = 8192;
    o->max_requests = 200;
    o->slab_blocks = 8; /* 4 MiB slabs per layer: a quarter of the pool calls of the default, same schedule */
    o->controller = controller;
    o->idle_decay_ms = 200;
    o->resource = s->r.fault;
    o->check = true;
    o->pool_decay_ms = UINT32_MAX; /* no wall clock: the same calls in every run */
}

typedef enum rp_outcome { RP_ABSORBED, RP_DELAYED, RP_PREEMPTED, RP_REJECTED, RP_COUNT_ } rp_outcome;
static const char *const rp_names[RP_COUNT_] = {"absorbed (same schedule)", "admission delayed (schedule changed)",
                                                "preempted+recomputed", "requests rejected (failing forever)"};

static void replay_campaign(bool controller, bool forever)
{
    uint64_t t0 = test_now_ms();
    llmem_trace tr;
    assert_ok(llmem_trace_load(TRACE, &tr));
    assert_true(tr.count >= 200);
    stack s;
    stack_init(&s, true);
    llmem_replay_options o;
    replay_setup(&o, &s, controller);
    llmem_replay_result ref, r;
    arm(&s, 0, false, 0);
    assert_ok(llmem_replay_run(&tr, &o, &ref));
    uint64_t n = fstats(&s).calls_total;
    assert_no_leak(&s, "replay, no faults", 0);
    assert_int_equal(ref.requests_total, 200);
    assert_int_equal(ref.requests_completed + ref.requests_rejected, 200);
    assert_true(ref.preemptions > 0);
    /* Deterministic: the same count again. */
    arm(&s, 0, false, 0);
    assert_ok(llmem_replay_run(&tr, &o, &r));
    assert_int_equal(fstats(&s).calls_total, n);
    assert_int_equal(r.steps, ref.steps);
    double t_ref = secs_since(t0) / 2;

    bool full = full_campaign();
    uint64_t stride = 1, dense = n;
    if (!full && n > REPLAY_DENSE + REPLAY_STRIDED) {
        dense = REPLAY_DENSE;
        stride = (n - REPLAY_DENSE + REPLAY_STRIDED - 1) / REPLAY_STRIDED;
    }
    unsigned count[RP_COUNT_] = {0}, runs = 0;
    uint64_t extra_preemptions = 0;
    size_t most_rejected = 0;
    for (uint64_t k = 1; k <= n; k = k < dense ? k + 1 : k + stride) {
        arm(&s, k, forever, 0);
        llmem_status rc = llmem_replay_run(&tr, &o, &r);
        if (rc) fail_msg("replay, k = %llu: did not finish cleanly (%s)", (unsigned long long)k, llmem_error_message());
        if (forever) assert_true(fstats(&s).injected_total >= 1);
        else assert_int_equal(fstats(&s).injected_total, 1);
        assert_no_leak(&s, "replay", k);
        assert_int_equal(r.requests_total, 200);
        assert_int_equal(r.requests_completed + r.requests_rejected, 200);
        if (forever) {
            /* Memory stopped growing at call k: what it holds serves what fits. */
            rp_outcome oc = r.requests_rejected > ref.requests_rejected ? RP_REJECTED
                            : r.preemptions > ref.preemptions              ? RP_PREEMPTED
                            : r.steps == ref.steps                         ? RP_ABSORBED
                                                                           : RP_DELAYED;
            if (r.requests_rejected > most_rejected) most_rejected = r.requests_rejected;
            count[oc]++;
            runs++;
            continue;
        }
        /* Every request completes, or is rejected as without faults. */
        if (r.requests_completed != ref.requests_completed || r.requests_rejected != ref.requests_rejected ||
            r.requests_truncated != ref.requests_truncated)
            fail_msg("replay, k = %llu: %zu completed (%zu truncated), %zu rejected; without faults %zu (%zu), %zu",
                     (unsigned long long)k, r.requests_completed, r.requests_truncated, r.requests_rejected,
                     ref.requests_completed, ref.requests_truncated, ref.requests_rejected);
        assert_true(r.tokens_generated >= ref.tokens_generated);
        rp_outcome oc = r.preemptions > ref.preemptions ? RP_PREEMPTED
                        : r.steps == ref.steps && r.prompt_tokens == ref.prompt_tokens && r.preemptions == ref.preemptions
                            ? RP_ABSORBED
                            : RP_DELAYED;
        if (r.preemptions > ref.preemptions) extra_preemptions += r.preemptions - ref.preemptions;
        count[oc]++;
        runs++;
        if (getenv("LLMEM_FAULT_VERBOSE"))
            print_message("  k = %llu: %s; steps %llu (%llu), preemptions %llu (%llu), prompt tokens %llu (%llu)\n",
                          (unsigned long long)k, rp_names[oc], (unsigned long long)r.steps,
                          (unsigned long long)ref.steps, (unsigned long long)r.preemptions,
                          (unsigned long long)ref.preemptions, (unsigned long long)r.prompt_tokens,
                          (unsigned long long)ref.prompt_tokens);
    }
    print_message("replay campaign, %s controller, %s: %llu counted calls (map+commit), %u runs (",
                  controller ? "with" : "without", forever ? "failing forever from k" : "call k fails once",
                  (unsigned long long)n, runs);
    if (stride == 1) print_message("every k%s): ", full ? ", LLMEM_FAULT_FULL" : "");
    else print_message("k = 1..%llu, then every %llu-th): ", (unsigned long long)dense, (unsigned long long)stride);
    if (forever) print_message("at most %zu requests rejected; ", most_rejected);
    for (int c = 0; c < RP_COUNT_; c++)
        if (count[c]) print_message("%s %u; ", rp_names[c], count[c]);
    if (!forever) print_message("%llu extra preemptions in all; every run completed and rejected what the run "
                                "without faults did; ", (unsigned long long)extra_preemptions);
    print_message("0 leaks; without faults %zu completed, %zu rejected, %llu preemptions, %llu steps; one run "
                  "%.2f s; %.1f s\n",
                  ref.requests_completed, ref.requests_rejected, (unsigned long long)ref.preemptions,
                  (unsigned long long)ref.steps, t_ref, secs_since(t0));
    stack_fini(&s);
    llmem_trace_free(&tr);
}

TEST_CASE(replay_without_controller, replay_campaign(false, false))
TEST_CASE(replay_with_controller, replay_campaign(true, false))
TEST_CASE(replay_without_controller_forever, replay_campaign(false, true))
TEST_CASE(replay_with_controller_forever, replay_campaign(true, true))

static int setup_model(void **state)
{
    (void)state;
    llmem_log_set(NULL, NULL, LLMEM_LOG_OFF); /* refused unmaps are logged as warnings */
    open_model();
    return 0;
}

static int teardown_model(void **state)
{
    (void)state;
    llmem_model_close(g_model);
    g_model = NULL;
    return 0;
}

int main(int argc, char **argv)
{
    /* The replay campaigns run on the Azure trace of the shared folder
     * (test_fault_campaign_shared). */
    const struct CMUnitTest shared_tests[] = {
        cmocka_unit_test(replay_without_controller),
        cmocka_unit_test(replay_with_controller),
        cmocka_unit_test(replay_without_controller_forever),
        cmocka_unit_test(replay_with_controller_forever),
    };
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(engine_fail_once_retry),
        cmocka_unit_test(engine_fail_once_preempt),
        cmocka_unit_test(engine_fail_forever),
        cmocka_unit_test(engine_fail_once_release_ops),
    };
    return test_main(argc, argv, "test_fault_campaign", TEST_GROUP(tests, setup_model, teardown_model),
                     TEST_GROUP(shared_tests, setup_model, teardown_model),
                     (const char *const[]){"traces/AzureLLMInferenceTrace_code.csv", NULL});
}
