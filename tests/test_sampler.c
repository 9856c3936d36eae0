/*
 * test_sampler.c - the sampler against llama2.c's run.c: option checks,
 * argmax ties, seeded determinism, empirical distributions (whole and
 * nucleus), the corner cases run.c leaves undefined, and an independent
 * transcription of run.c's sample() (qsort and all) picking the same ids
 * for hundreds of random logit vectors, seeds and settings.
 */
#include <math.h>

#include "test_util.h"
#include "support/rng.h"

/* ---- an independent run.c sample() --------------------------------------- */

typedef struct ref_pi {
    float prob;
    int index;
} ref_pi;

static int ref_cmp(const void *a, const void *b)
{
    const ref_pi *x = a, *y = b;
    if (x->prob > y->prob) return -1;
    if (x->prob < y->prob) return 1;
    return 0;
}

static unsigned int ref_u32(unsigned long long *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (unsigned int)((*s * 0x2545F4914F6CDD1Dull) >> 32);
}

static float ref_f32(unsigned long long *s) { return (ref_u32(s) >> 8) / 16777216.0f; }

static int ref_sample(float *x, int n, float temp, float topp, unsigned long long *rng, ref_pi *pi)
{
    if (temp == 0.0f) {
        int best = 0;
        for (int i = 1; i < n; i++)
            if (x[i] > x[best]) best = i;
        return best;
    }
    for (int i = 0; i < n; i++) x[i] /= temp;
    float max = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > max) max = x[i];
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    for (int i = 0; i < n; i++) x[i] /= sum;
    float coin = ref_f32(rng);
    if (topp <= 0 || topp >= 1) {
        float cdf = 0.0f;
        for (int i = 0; i < n; i++) {
            cdf += x[i];
            if (coin < cdf) return i;
        }
        return n - 1;
    }
    int n0 = 0;
    const float cutoff = (1.0f - topp) / (n - 1);
    for (int i = 0; i < n; i++) {
        if (x[i] >= cutoff) {
            pi[n0].index = i;
            pi[n0].prob = x[i];
            n0++;
        }
    }
    if (n0 == 0) { /* run.c reads pi[-1]; llmem takes the argmax */
        int best = 0;
        for (int i = 1; i < n; i++)
            if (x[i] > x[best]) best = i;
        return best;
    }
    qsort(pi, (size_t)n0, sizeof *pi, ref_cmp);
    float cum = 0.0f;
    int last = n0 - 1;
    for (int i = 0; i < n0; i++) {
        cum += pi[i].prob;
        if (cum > topp) {
            last = i;
            break;
        }
    }
    float r = coin * cum;
    float cdf = 0.0f;
    for (int i = 0; i <= last; i++) {
        cdf += pi[i].prob;
        if (r < cdf) return pi[i].index;
    }
    return pi[last].index;
}

/* ---- helpers -------------------------------------------------------------- */

static llmem_sampler *make(uint32_t V, float temp, float topp, uint64_t seed)
{
    llmem_sampler_options o = llmem_sampler_options_default();
    o.vocab_size = V;
    o.temperature = temp;
    o.top_p = topp;
    o.seed = seed;
    llmem_sampler *s;
    assert_ok(llmem_sampler_create(&o, &s));
    return s;
}

static float rng_unit(uint64_t *s) { return (float)(test_rng_next(s) >> 40) / 16777216.0f; }

/* ---- tests ---------------------------------------------------------------- */

static void options_are_checked(void **state)
{
    (void)state;
    llmem_sampler_options d = llmem_sampler_options_default();
    assert_int_equal(d.vocab_size, 0);
    assert_true(d.temperature == 0.0f);
    assert_true(d.top_p == 0.9f);
    llmem_sampler *s = (llmem_sampler *)1;
    assert_status(llmem_sampler_create(NULL, &s), LLMEM_EINVAL);
    assert_null(s);
    d.vocab_size = 8;
    assert_status(llmem_sampler_create(&d, NULL), LLMEM_EINVAL);
    static const struct {
        uint32_t V;
        float temp, topp;
        const char *mentions;
    } bad[] = {
        {0, 1, 0.9f, "vocab_size"},       {8, -1, 0.9f, "temperature"},    {8, NAN, 0.9f, "temperature"},
        {8, -0.001f, 0, "temperature"},   {8, 1, -0.1f, "top_p"},          {8, 1, 1.01f, "top_p"},
        {8, 1, NAN, "top_p"},             {8, 1, INFINITY, "top_p"},       {0x80000000u, 1, 0.9f, "vocab_size"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        llmem_sampler_options o = {bad[i].V, bad[i].temp, bad[i].topp, 1};
        s = (llmem_sampler *)1;
        llmem_status st = llmem_sampler_create(&o, &s);
        if (st != LLMEM_EINVAL) fail_msg("case %zu: %s, expected EINVAL", i, llmem_status_name(st));
        assert_null(s);
        assert_error_mentions(bad[i].mentions);
    }
    /* The edges are fine: top_p 0 and 1 (off), temperature 0. */
    llmem_sampler_destroy(make(8, 0, 0, 0));
    llmem_sampler_destroy(make(8, 1, 1, 0));
    llmem_sampler_destroy(make(1, 2, 0.5f, 0));
    llmem_sampler_destroy(NULL);
    assert_int_equal(llmem_sampler_sample(NULL, (float[1]){0}), -1);
    s = make(8, 1, 0.9f, 1);
    assert_int_equal(llmem_sampler_sample(s, NULL), -1);
    llmem_sampler_destroy(s);
}

static void argmax_takes_the_first_maximum(void **state)
{
    (void)state;
    float v[] = {1, 3, -INFINITY, 3, 2, 3};
    assert_int_equal(llmem_logits_argmax(v, 6), 1);
    assert_int_equal(llmem_logits_argmax(v, 1), 0);
    assert_int_equal(llmem_logits_argmax(v + 2, 1), 0);
    assert_int_equal(llmem_logits_argmax(v + 2, 2), 1);
    assert_int_equal(llmem_logits_argmax(NULL, 3), -1);
    assert_int_equal(llmem_logits_argmax(v, 0), -1);
    /* Temperature 0: the argmax, logits untouched. */
    llmem_sampler *s = make(6, 0, 0.9f, 1);
    float w[] = {1, 3, -INFINITY, 3, 2, 3};
    for (int i = 0; i < 10; i++) assert_int_equal(llmem_sampler_sample(s, w), 1);
    assert_memory_equal(w, v, sizeof v);
    llmem_sampler_destroy(s);
}

static void seeded_runs_repeat(void **state)
{
    (void)state;
    enum { V = 50, DRAWS = 2000 };
    int32_t a[DRAWS], b[DRAWS], c[DRAWS], z[DRAWS];
    uint64_t seeds[4] = {42, 42, 43, 0};
    int32_t *outs[4] = {a, b, c, z};
    for (int k = 0; k < 4; k++) {
        llmem_sampler *s = make(V, 1.0f, 0.9f, seeds[k]);
        uint64_t rng = 5;
        for (int i = 0; i < DRAWS; i++) {
            float logits[V];
            for (int j = 0; j < V; j++) logits[j] = rng_unit(&rng) * 4;
            outs[k][i] = llmem_sampler_sample(s, logits);
            assert_true(outs[k][i] >= 0 && outs[k][i] < V);
        }
        llmem_sampler_destroy(s);
    }
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, c, sizeof a);
    /* Seed 0 is seed 1, not a stuck generator: the draws vary. */
    llmem_sampler *s1 = make(V, 1.0f, 0.9f, 1);
    uint64_t rng = 5;
    int distinct = 0;
    for (int i = 0; i < DRAWS; i++) {
        float logits[V];
        for (int j = 0; j < V; j++) logits[j] = rng_unit(&rng) * 4;
        assert_int_equal(llmem_sampler_sample(s1, logits), z[i]);
        distinct += i > 0 && z[i] != z[i - 1];
    }
    assert_true(distinct > DRAWS / 2);
    llmem_sampler_destroy(s1);
}

/* Counts within 5 sigma of N p for each token. */
static void check_counts(const int *counts, const double *p, int n, int N)
{
    for (int i = 0; i < n; i++) {
        double mean = N * p[i], sigma = sqrt(N * p[i] * (1 - p[i]));
        if (p[i] == 0) {
            if (counts[i]) fail_msg("token %d drawn %d times, probability 0", i, counts[i]);
            continue;
        }
        if (fabs(counts[i] - mean) > 5 * sigma + 1)
            fail_msg("token %d: %d draws, expected %.0f +- %.0f", i, counts[i], mean, 5 * sigma);
    }
}

static void distribution_is_the_softmax(void **state)
{
    (void)state;
    enum { N = 100000 };
    const double p[5] = {0.05, 0.1, 0.2, 0.25, 0.4};
    const float topps[] = {1.0f, 0.0f};
    for (int k = 0; k < 2; k++) {
        llmem_sampler *s = make(5, 1.0f, topps[k], 2024 + (uint64_t)k);
        int counts[5] = {0};
        for (int i = 0; i < N; i++) {
            float logits[5];
            for (int j = 0; j < 5; j++) logits[j] = logf((float)p[j]) + 3.0f; /* a shift changes nothing */
            counts[llmem_sampler_sample(s, logits)]++;
        }
        check_counts(counts, p, 5, N);
        llmem_sampler_destroy(s);
    }
    /* Temperature 2 flattens: p^(1/2), renormalised. */
    double q[5], sum = 0;
    for (int j = 0; j < 5; j++) sum += q[j] = sqrt(p[j]);
    for (int j = 0; j < 5; j++) q[j] /= sum;
    llmem_sampler *s = make(5, 2.0f, 1.0f, 77);
    int counts[5] = {0};
    for (int i = 0; i < N; i++) {
        float logits[5];
        for (int j = 0; j < 5; j++) logits[j] = logf((float)p[j]);
        counts[llmem_sampler_sample(s, logits)]++;
    }
    check_counts(counts, q, 5, N);
    llmem_sampler_destroy(s);
}

static void top_p_keeps_the_nucleus(void **state)
{
    (void)state;
    enum { N = 100000 };
    /* Sorted: 0.4 (1), 0.3 (2): the sum passes 0.5 at the second, so only
     * tokens 1 and 2 appear, in proportion 4:3. */
    const double p[4] = {0.1, 0.4, 0.3, 0.2};
    const double want[4] = {0, 0.4 / 0.7, 0.3 / 0.7, 0};
    llmem_sampler *s = make(4, 1.0f, 0.5f, 9);
    int counts[4] = {0};
    for (int i = 0; i < N; i++) {
        float logits[4];
        for (int j = 0; j < 4; j++) logits[j] = logf((float)p[j]);
        counts[llmem_sampler_sample(s, logits)]++;
    }
    check_counts(counts, want, 4, N);
    llmem_sampler_destroy(s);
    /* top_p 0.95 over the same: 0.4 + 0.3 + 0.2 = 0.9, + 0.1 passes: all
     * four, with their own probabilities. */
    s = make(4, 1.0f, 0.95f, 10);
    memset(counts, 0, sizeof counts);
    for (int i = 0; i < N; i++) {
        float logits[4];
        for (int j = 0; j < 4; j++) logits[j] = logf((float)p[j]);
        counts[llmem_sampler_sample(s, logits)]++;
    }
    check_counts(counts, p, 4, N);
    llmem_sampler_destroy(s);
}

static void edge_cases(void **state)
{
    (void)state;
    /* A vocabulary of one: always 0 (run.c divides by n - 1 = 0). */
    llmem_sampler *s = make(1, 1.0f, 0.9f, 3);
    for (int i = 0; i < 10; i++) assert_int_equal(llmem_sampler_sample(s, (float[1]){5.0f}), 0);
    llmem_sampler_destroy(s);
    /* No token passes the cutoff (top_p far below 1/n on a flat
     * distribution): the most probable, the first of them. */
    s = make(10, 1.0f, 0.001f, 3);
    for (int i = 0; i < 10; i++) {
        float logits[10] = {0};
        logits[7] = 1e-3f;
        assert_int_equal(llmem_sampler_sample(s, logits), 7);
        memset(logits, 0, sizeof logits);
        assert_int_equal(llmem_sampler_sample(s, logits), 0);
    }
    llmem_sampler_destroy(s);
    /* Seed 7767648's first coin is exactly 0.5: on two equal logits the
     * cdf after token 0 is 0.5 and run.c's strict < moves on to token 1,
     * whole distribution or nucleus (r = 0.5 * 1.0). */
    for (int k = 0; k < 2; k++) {
        s = make(2, 1.0f, k ? 0.6f : 1.0f, 7767648);
        assert_int_equal(llmem_sampler_sample(s, (float[2]){0.25f, 0.25f}), 1);
        llmem_sampler_destroy(s);
    }
    /* NaN and infinite logits: some id in range, no crash. */
    const float tp[] = {0.0f, 0.9f};
    for (int k = 0; k < 2; k++) {
        s = make(6, 1.0f, tp[k], 4);
        float a[6] = {NAN, 1, 2, 3, 4, 5}, b[6] = {INFINITY, 1, INFINITY, 0, 0, 0}, c[6] = {-INFINITY, -INFINITY,
                                                                                            -INFINITY, -INFINITY,
                                                                                            -INFINITY, -INFINITY};
        int32_t r = llmem_sampler_sample(s, a);
        assert_true(r >= 0 && r < 6);
        r = llmem_sampler_sample(s, b);
        assert_true(r >= 0 && r < 6);
        r = llmem_sampler_sample(s, c);
        assert_true(r >= 0 && r < 6);
        llmem_sampler_destroy(s);
    }
}

/* Same ids as the transcription of run.c, qsort and all, including tie
 * order among equal probabilities (quantised logits make many). */
static void matches_run_c(void **state)
{
    (void)state;
    static const uint32_t sizes[] = {2, 3, 5, 17, 100, 512, 4096};
    static const float temps[] = {0.0f, 0.25f, 0.7f, 1.0f, 1.5f};
    static const float topps[] = {0.0f, 0.3f, 0.5f, 0.9f, 0.95f, 0.999f, 1.0f};
    uint64_t rng = 0xC0FFEE;
    ref_pi *pi = malloc(32000 * sizeof *pi);
    float *x = malloc(32000 * sizeof *x), *y = malloc(32000 * sizeof *y);
    int vectors = 0, draws = 0;
    for (int v = 0; v < 400; v++) {
        uint32_t V = v % 50 == 49 ? 32000 : sizes[test_rng_next(&rng) % (sizeof sizes / sizeof *sizes)];
        float temp = temps[test_rng_next(&rng) % (sizeof temps / sizeof *temps)];
        float topp = topps[test_rng_next(&rng) % (sizeof topps / sizeof *topps)];
        uint64_t seed = test_rng_next(&rng);
        int style = (int)(test_rng_next(&rng) % 3);
        llmem_sampler *s = make(V, temp, topp, seed);
        unsigned long long ref_state = seed ? seed : 1;
        for (int d = 0; d < 8; d++) {
            for (uint32_t j = 0; j < V; j++) {
                float u = rng_unit(&rng);
                /* Continuous, quantised to a few levels (ties), or peaked. */
                x[j] = style == 0 ? u * 8 - 4 : style == 1 ? floorf(u * 4) : (u < 0.05f ? 6 + u : u);
            }
            memcpy(y, x, V * sizeof *x);
            int32_t got = llmem_sampler_sample(s, x);
            int want = ref_sample(y, (int)V, temp, topp, &ref_state, pi);
            if (got != want)
                fail_msg("vector %d draw %d (V %u, temperature %g, top_p %g, style %d): %d, run.c %d", v, d, V,
                         (double)temp, (double)topp, style, got, want);
            /* The probabilities left in place are run.c's too. */
            if (temp != 0.0f) assert_memory_equal(x, y, V * sizeof *x);
            draws++;
        }
        vectors++;
        llmem_sampler_destroy(s);
    }
    print_message("%d vectors, %d draws identical to run.c\n", vectors, draws);
    free(pi);
    free(x);
    free(y);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(options_are_checked),
        cmocka_unit_test(argmax_takes_the_first_maximum),
        cmocka_unit_test(seeded_runs_repeat),
        cmocka_unit_test(distribution_is_the_softmax),
        cmocka_unit_test(top_p_keeps_the_nucleus),
        cmocka_unit_test(edge_cases),
        cmocka_unit_test(matches_run_c),
    };
    return cmocka_run_group_tests(tests, test_quiet_logs, NULL);
}
