/*
 * bench_waste.c - `llmem bench waste`: internal waste on the tensor mix
 * with the pool's default classes, with classes refined from a profile of
 * the mix, and with the multi-size pool built from the same profile.
 *
 * Waste = (bytes handed out - bytes asked for) / bytes asked for, summed
 * over every allocation of the run; reported for all allocations and for
 * the small and medium ones (up to the largest size class, 32 KiB), where
 * classes matter - larger ones are page runs in every configuration.
 * The profile comes from a first run of the same mix with every allocation
 * recorded; the measured run uses another seed, so it is not scored on the
 * exact sequence it was fitted to.
 */
#include <stdio.h>
#include <string.h>

#include "bench_util.h"
#include "commands.h"
#include "llmem/llmem.h"
#include "tensor_mix.h"

#define SMALL_MAX ((size_t)32 << 10)

typedef struct tally {
    llmem_pool *pool;
    llmem_multipool *mp;
    uint64_t asked, given, asked_small, given_small, allocs;
} tally;

static void *t_alloc(void *ctx, size_t n)
{
    tally *t = ctx;
    void *p;
    size_t got;
    if (t->mp) {
        p = llmem_multipool_alloc(t->mp, n, NULL);
        uint32_t sizes[LLMEM_MULTIPOOL_MAX_SIZES];
        size_t k = llmem_multipool_sizes(t->mp, sizes, LLMEM_MULTIPOOL_MAX_SIZES);
        size_t r = (n + 15) & ~(size_t)15;
        got = 0;
        for (size_t i = 0; i < k; i++)
            if (sizes[i] == r) got = r;
        if (!got && p) got = llmem_pool_usable_size(llmem_multipool_fallback(t->mp), p);
    } else {
        p = llmem_pool_alloc(t->pool, n, NULL);
        got = p ? llmem_pool_usable_size(t->pool, p) : 0;
    }
    if (!p) {
        fprintf(stderr, "bench waste: allocation of %zu bytes failed: %s\n", n, llmem_error_message());
        return NULL;
    }
    t->asked += n;
    t->given += got;
    t->allocs++;
    if (n <= SMALL_MAX) {
        t->asked_small += n;
        t->given_small += got;
    }
    return p;
}

static void t_free(void *ctx, void *p, size_t n)
{
    tally *t = ctx;
    if (t->mp) llmem_multipool_free_sized(t->mp, p, n);
    else llmem_pool_free(t->pool, p);
}

static double pct(uint64_t given, uint64_t asked) { return asked ? 100.0 * (double)(given - asked) / (double)asked : 0; }

typedef struct workload {
    const char *name;
    const tensor_mix_shape *shape; /* NULL: the object mix */
} workload;

static uint64_t run(const workload *w, int steps, uint64_t seed, tensor_mix_ops *ops)
{
    return w->shape ? tensor_mix_run(steps, seed, w->shape, ops) : object_mix_run(steps * 4, seed, ops);
}

typedef struct outcome {
    tally t[3]; /* default, refined, multipool */
    size_t nextra, nmulti;
} outcome;

static int measure(const workload *w, int steps, outcome *out)
{
    memset(out, 0, sizeof *out);
    /* 1. Profile a run. */
    llmem_profile_options po = llmem_profile_options_default();
    po.sample_every = 1;
    llmem_profile *prof;
    if (llmem_profile_create(&po, &prof)) return 1;
    llmem_pool_options o = llmem_pool_options_default();
    o.profile = prof;
    tally t0 = {0};
    if (llmem_pool_create(&o, &t0.pool)) return 1;
    tensor_mix_ops ops = {t_alloc, t_free, &t0};
    run(w, steps, 7, &ops);
    llmem_pool_destroy(t0.pool);
    /* 2. Default classes, measured on another seed. */
    o = llmem_pool_options_default();
    if (llmem_pool_create(&o, &out->t[0].pool)) return 1;
    ops.ctx = &out->t[0];
    run(w, steps, 99, &ops);
    llmem_pool_destroy(out->t[0].pool);
    /* 3. Classes refined from the profile. */
    uint32_t extra[LLMEM_POOL_MAX_EXTRA_CLASSES];
    llmem_profile_suggest_classes(prof, LLMEM_POOL_MAX_EXTRA_CLASSES, SMALL_MAX, 16, 0.001, extra, &out->nextra);
    o.extra_classes = extra;
    o.extra_class_count = out->nextra;
    if (llmem_pool_create(&o, &out->t[1].pool)) return 1;
    ops.ctx = &out->t[1];
    run(w, steps, 99, &ops);
    llmem_pool_destroy(out->t[1].pool);
    /* 4. The multi-size pool from the same profile. */
    llmem_multipool_options mo = llmem_multipool_options_default();
    mo.max_size = SMALL_MAX;
    mo.min_share = 0.001;
    mo.k = 16;
    if (llmem_multipool_create(&mo, prof, &out->t[2].mp)) return 1;
    ops.ctx = &out->t[2];
    run(w, steps, 99, &ops);
    out->nmulti = llmem_multipool_sizes(out->t[2].mp, NULL, 0);
    llmem_multipool_destroy(out->t[2].mp);
    llmem_profile_destroy(prof);
    return 0;
}

int llmem_bench_waste(int argc, char **argv)
{
    bool json = false;
    int steps = 200;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--quick")) steps = 40;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: llmem bench waste [--json] [--quick]\n\nInternal waste: default classes, classes "
                   "refined from a profile, and the multi-size pool,\non the llama-2-7b and yi-coder-1.5b tensor "
                   "mixes and a mix of odd-sized objects.\n");
            return 0;
        } else {
            fprintf(stderr, "llmem bench waste: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    const workload ws[] = {{"tensor_mix", &tensor_mix_llama2_7b},
                           {"tensor_mix_yi", &tensor_mix_yi_coder_1_5b},
                           {"object_mix", NULL}};
    const char *cfg[] = {"default", "refined", "multipool"};
    outcome out[3];
    for (size_t i = 0; i < 3; i++) {
        bench_progress("bench waste: %s", ws[i].name);
        if (measure(&ws[i], steps, &out[i])) {
            bench_progress_done();
            fprintf(stderr, "llmem bench waste: %s\n", llmem_error_message());
            return 1;
        }
    }
    bench_progress_done();
    if (json) {
        printf("[");
        for (size_t i = 0; i < 3; i++)
            for (size_t c = 0; c < 3; c++)
                printf("%s{\"workload\":\"%s\",\"config\":\"%s\",\"allocations\":%llu,\"waste_pct\":%.3f,"
                       "\"waste_small_pct\":%.3f}",
                       i || c ? "," : "", ws[i].name, cfg[c], (unsigned long long)out[i].t[c].allocs,
                       pct(out[i].t[c].given, out[i].t[c].asked), pct(out[i].t[c].given_small, out[i].t[c].asked_small));
        printf("]\n");
        return 0;
    }
    printf("llmem %s bench waste: internal waste = (bytes handed out - bytes asked) / bytes asked\n"
           "profile from one run (seed 7), measured on another (seed 99)\n\n", llmem_version());
    printf("%-14s %-10s %12s %16s\n", "workload", "config", "waste (all)", "waste (<=32KiB)");
    for (size_t i = 0; i < 3; i++)
        for (size_t c = 0; c < 3; c++)
            printf("%-14s %-10s %11.2f%% %15.2f%%\n", c ? "" : ws[i].name, cfg[c],
                   pct(out[i].t[c].given, out[i].t[c].asked), pct(out[i].t[c].given_small, out[i].t[c].asked_small));
    printf("\nrefined classes added: %zu / %zu / %zu; multi-size pool dedicated sizes: %zu / %zu / %zu\n",
           out[0].nextra, out[1].nextra, out[2].nextra, out[0].nmulti, out[1].nmulti, out[2].nmulti);
    return 0;
}
