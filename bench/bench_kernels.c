/*
 * bench_kernels.c - `llmem bench kernels`: the engine's matmul and its
 * thread team, measured (figures only; the unit tests check what the
 * kernels compute, tests/test_kernels.c and tests/test_threads.c).
 *
 *   matmul   d = n = 768 (a stories15M-sized projection), GFLOPS (2 flops
 *            per multiply-add), best of --rounds timed runs of at least
 *            --seconds each: the dispatched path (llmem__kernels_isa) and
 *            the portable one forced, each weight type (f32, f16, bf16,
 *            and the block types q4_0 .. q8_0, q2_k .. q6_k, made by
 *            llmem_quantize_row from random floats), batch 1 and 32, teams
 *            of 1 and 2 threads; and run.c's
 *            naive f32 loop compiled here at the tool's optimisation, the
 *            baseline of the ratio column (dispatched f32, one thread,
 *            over naive).
 *   q4_k x8  a yi-coder-1.5b FFN projection (n = 2048, d = 5504) in q4_k,
 *            read in place and repacked 8 rows interleaved as the engine
 *            does at load (kernels_q4k_x8.h), batch 1 and 32, 1 and 2
 *            threads, on the dispatched path.
 *   threads  the latency of one empty llmem__threads_run: back to back
 *            (workers spinning) and after a 2 ms idle gap (workers asleep:
 *            one wake-up round trip), teams of 1, 2, 3 and 8.
 *
 * Moved here from the unit tests, which printed these figures and asserted
 * nothing (issue 12): timing belongs in benchmarks, side by side in one run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "commands.h"
#include "llmem/llmem.h"

#include "../src/engine/kernels.h"
#include "../src/engine/kernels_q4k_x8.h"
#include "../src/engine/threads.h"

#define F32 LLMEM_DTYPE_F32
#define F16 LLMEM_DTYPE_F16
#define BF16 LLMEM_DTYPE_BF16
#define Q8_0 LLMEM_DTYPE_Q8_0

static const uint32_t wtypes[] = {F32,
                                   F16,
                                   BF16,
                                   Q8_0,
                                   LLMEM_DTYPE_Q4_0,
                                   LLMEM_DTYPE_Q4_1,
                                   LLMEM_DTYPE_Q5_0,
                                   LLMEM_DTYPE_Q5_1,
                                   LLMEM_DTYPE_Q2_K,
                                   LLMEM_DTYPE_Q3_K,
                                   LLMEM_DTYPE_Q4_K,
                                   LLMEM_DTYPE_Q5_K,
                                   LLMEM_DTYPE_Q6_K};
#define NW (sizeof wtypes / sizeof wtypes[0])
static const char *type_name(uint32_t t) { return llmem_dtype_name(t); }
static void *scratch; /* the block types' quantised activation rows */

static double now_s(void) { return (double)llmem_time_now_ns() * 1e-9; }

static float rnd_f(uint64_t *s) { return (float)((double)(bench_rand(s) >> 11) * 0x1p-52 - 1.0); }

/* d rows of n weights of type t, small random values (|x| < 1). */
static void *make_weights(uint32_t t, size_t n, size_t d, uint64_t *rng)
{
    size_t row = (size_t)llmem_dtype_bytes(t, n);
    uint8_t *w = malloc(d * row);
    if (!w) return NULL;
    for (size_t r = 0; r < d; r++) {
        uint8_t *p = w + r * row;
        if (t == F32) {
            for (size_t c = 0; c < n; c++) {
                float f = rnd_f(rng);
                memcpy(p + 4 * c, &f, 4);
            }
        } else if (t == F16 || t == BF16) {
            for (size_t c = 0; c < n; c++) {
                uint16_t h = (uint16_t)(bench_rand(rng) & (t == F16 ? 0x3bff : 0x3f7f));
                h |= (uint16_t)(bench_rand(rng) & 0x8000);
                memcpy(p + 2 * c, &h, 2);
            }
        } else if (t != Q8_0) {
            float *v = malloc(n * sizeof(float));
            if (!v) {
                free(w);
                return NULL;
            }
            for (size_t c = 0; c < n; c++) v[c] = rnd_f(rng);
            llmem_status st = llmem_quantize_row(t, v, p, n);
            free(v);
            if (st) {
                free(w);
                return NULL;
            }
        } else {
            for (size_t b = 0; b < n / 32; b++) {
                uint16_t dh = (uint16_t)(0x1c00 + (bench_rand(rng) & 0x3ff));
                memcpy(p + b * 34, &dh, 2);
                for (size_t i = 0; i < 32; i++) p[b * 34 + 2 + i] = (uint8_t)bench_rand(rng);
            }
        }
    }
    return w;
}

/* run.c's matmul. */
static void naive_matmul(float *xout, const float *x, const float *w, int n, int d)
{
    for (int i = 0; i < d; i++) {
        float val = 0.0f;
        for (int j = 0; j < n; j++) val += w[i * n + j] * x[j];
        xout[i] = val;
    }
}

/* Best GFLOPS over `rounds` timed runs of at least min_s each. */
static double gflops(llmem__threads *th, bool naive, const float *x, const void *w, uint32_t type, size_t n, size_t d,
                     size_t batch, float *y, double min_s, int rounds)
{
    double best = 0;
    for (int rep = 0; rep < rounds; rep++) {
        size_t iters = 0;
        double t0 = now_s(), t;
        do {
            if (naive)
                for (size_t b = 0; b < batch; b++) naive_matmul(y + b * d, x + b * n, w, (int)n, (int)d);
            else llmem__matmul(th, y, x, w, type, n, d, batch, scratch);
            iters++;
            t = now_s() - t0;
        } while (t < min_s);
        double g = 2.0 * (double)n * (double)d * (double)batch * (double)iters / t * 1e-9;
        if (g > best) best = g;
    }
    bench_sink += (uint64_t)(y[0] != 0);
    return best;
}

static void noop_fn(void *ctx, unsigned index, unsigned count)
{
    (void)ctx;
    (void)index;
    (void)count;
}

static double elapsed_ns(const struct timespec *a, const struct timespec *b)
{
    return (double)(b->tv_sec - a->tv_sec) * 1e9 + (double)(b->tv_nsec - a->tv_nsec);
}

static int bench_threads(bool json)
{
    static const unsigned teams[] = {1, 2, 3, 8};
    if (!json) printf("\nthread team: one empty run (ns)\n  %-6s %14s %14s %14s\n", "team", "back to back", "woken mean",
                      "woken worst");
    for (size_t i = 0; i < sizeof teams / sizeof teams[0]; i++) {
        llmem__threads *t;
        if (llmem__threads_create(teams[i], &t)) {
            fprintf(stderr, "llmem bench kernels: %s\n", llmem_error_message());
            return 1;
        }
        for (unsigned r = 0; r < 100; r++) llmem__threads_run(t, noop_fn, NULL); /* warm */
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        uint64_t t0 = llmem_time_now_ns();
        unsigned done = 0;
        /* At most 50000 runs, and at most half a second on a busy machine. */
        while (done < 50000 && (done % 256 || llmem_time_now_ns() - t0 < 500000000ull)) {
            llmem__threads_run(t, noop_fn, NULL);
            done++;
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        double back = elapsed_ns(&a, &b) / done;
        double worst = 0, sum = 0;
        for (unsigned r = 0; r < 20; r++) {
            struct timespec gap = {0, 2 * 1000000L};
            nanosleep(&gap, NULL);
            clock_gettime(CLOCK_MONOTONIC, &a);
            llmem__threads_run(t, noop_fn, NULL);
            clock_gettime(CLOCK_MONOTONIC, &b);
            double one = elapsed_ns(&a, &b);
            sum += one;
            if (one > worst) worst = one;
        }
        llmem__threads_destroy(t);
        if (json)
            printf("{\"bench\":\"threads\",\"team\":%u,\"back_to_back_ns\":%.0f,\"woken_mean_ns\":%.0f,"
                   "\"woken_worst_ns\":%.0f}\n",
                   teams[i], back, sum / 20, worst);
        else printf("  %-6u %14.0f %14.0f %14.0f\n", teams[i], back, sum / 20, worst);
    }
    return 0;
}

int llmem_bench_kernels(int argc, char **argv)
{
    double min_s = 0.05;
    int rounds = 3;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: llmem bench kernels [--seconds S] [--rounds N] [--json]\n\n"
                   "GFLOPS of the engine's matmul (d = n = 768; each path, weight type, batch 1 and 32,\n"
                   "1 and 2 threads) against run.c's naive loop, best of N runs of at least S seconds\n"
                   "(default 3 of 0.05 s); then the latency of the thread team's empty run.\n");
            return 0;
        } else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) {
            min_s = atof(argv[++i]);
            if (!(min_s > 0 && min_s <= 60)) {
                fprintf(stderr, "llmem bench kernels: --seconds takes 0 < S <= 60\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) {
            rounds = atoi(argv[++i]);
            if (rounds < 1 || rounds > 1000) {
                fprintf(stderr, "llmem bench kernels: --rounds takes 1..1000\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--json")) {
            json = true;
        } else {
            fprintf(stderr, "llmem bench kernels: unknown or incomplete option '%s'\n", argv[i]);
            return 2;
        }
    }
    const size_t n = 768, d = 768, maxb = 32;
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    void *w[NW] = {0};
    float *x = malloc(maxb * n * sizeof(float)), *y = malloc(maxb * d * sizeof(float));
    llmem__threads *team[3] = {NULL, NULL, NULL};
    int rc = 1;
    if (!x || !y) goto oom;
    for (size_t i = 0; i < maxb * n; i++) x[i] = rnd_f(&rng);
    size_t sb = 64;
    for (size_t t = 0; t < NW; t++) {
        if (!(w[t] = make_weights(wtypes[t], n, d, &rng))) goto oom;
        if (llmem__matmul_scratch_bytes(wtypes[t], n, maxb) > sb) sb = llmem__matmul_scratch_bytes(wtypes[t], n, maxb);
    }
    if (!(scratch = aligned_alloc(64, (sb + 63) / 64 * 64))) goto oom;
    for (unsigned k = 1; k <= 2; k++)
        if (llmem__threads_create(k, &team[k])) {
            fprintf(stderr, "llmem bench kernels: %s\n", llmem_error_message());
            goto out;
        }
    double naive1 = gflops(NULL, true, x, w[0], F32, n, d, 1, y, min_s, rounds);
    double naive32 = gflops(NULL, true, x, w[0], F32, n, d, maxb, y, min_s, rounds);
    if (!json) {
        printf("llmem %s bench kernels: matmul d=n=768, GFLOPS, best of %d runs of %.2f s\n\n", llmem_version(), rounds,
               min_s);
        printf("  %-10s %-6s %8s %8s %8s %8s %12s\n", "path", "weight", "b1 t1", "b1 t2", "b32 t1", "b32 t2",
               "b1 t1/naive");
    }
    for (int path = 0; path < 2; path++) {
        llmem__kernels_force_portable(path == 1);
        for (size_t t = 0; t < NW; t++) {
            double g[4];
            int k = 0;
            for (size_t batch = 1; batch <= maxb; batch += maxb - 1)
                for (unsigned th = 1; th <= 2; th++)
                    g[k++] = gflops(team[th], false, x, w[t], wtypes[t], n, d, batch, y, min_s, rounds);
            if (json)
                printf("{\"bench\":\"matmul\",\"path\":\"%s\",\"weight\":\"%s\",\"b1_t1\":%.3f,\"b1_t2\":%.3f,"
                       "\"b32_t1\":%.3f,\"b32_t2\":%.3f,\"naive_b1\":%.3f,\"naive_b32\":%.3f}\n",
                       llmem__kernels_isa(), type_name(wtypes[t]), g[0], g[1], g[2], g[3], naive1, naive32);
            else
                printf("  %-10s %-6s %8.2f %8.2f %8.2f %8.2f %12.2f\n", llmem__kernels_isa(), type_name(wtypes[t]),
                       g[0], g[1], g[2], g[3], naive1 > 0 ? g[0] / naive1 : 0);
        }
    }
    llmem__kernels_force_portable(false);
    if (!json) printf("  %-10s %-6s %8.2f %8s %8.2f %8s\n", "naive", "f32", naive1, "-", naive32, "-");
    {
        /* q4_k at a yi-coder-1.5b FFN shape, in place and repacked. */
        const size_t qn = 2048, qd = 5504, qb = 32;
        void *wq = make_weights(LLMEM_DTYPE_Q4_K, qn, qd, &rng), *w8 = malloc(llmem__q4k_x8_bytes(qn, qd));
        float *qx = malloc(qb * qn * sizeof(float)), *qy = malloc(qb * qd * sizeof(float));
        void *old = scratch;
        scratch = aligned_alloc(64, llmem__matmul_scratch_bytes(LLMEM_DTYPE_Q4_K, qn, qb));
        bool have = wq && w8 && qx && qy && scratch;
        if (have) {
            for (size_t i = 0; i < qb * qn; i++) qx[i] = rnd_f(&rng);
            llmem__q4k_x8_pack(w8, wq, qn, qd);
            if (!json)
                printf("\nq4_k n=2048 d=5504 (%s), GFLOPS\n  %-10s %8s %8s %8s %8s\n", llmem__kernels_isa(), "layout", "b1 t1",
                       "b1 t2", "b32 t1", "b32 t2");
            for (int lay = 0; lay < 2; lay++) {
                double g[4];
                int k = 0;
                for (size_t batch = 1; batch <= qb; batch += qb - 1)
                    for (unsigned th = 1; th <= 2; th++)
                        g[k++] = gflops(team[th], false, qx, lay ? w8 : wq, lay ? LLMEM__WTYPE_Q4K_X8 : LLMEM_DTYPE_Q4_K,
                                        qn, qd, batch, qy, min_s, rounds);
                if (json)
                    printf("{\"bench\":\"q4k_x8\",\"path\":\"%s\",\"layout\":\"%s\",\"b1_t1\":%.3f,\"b1_t2\":%.3f,"
                           "\"b32_t1\":%.3f,\"b32_t2\":%.3f}\n",
                           llmem__kernels_isa(), lay ? "x8" : "in place", g[0], g[1], g[2], g[3]);
                else printf("  %-10s %8.2f %8.2f %8.2f %8.2f\n", lay ? "x8" : "in place", g[0], g[1], g[2], g[3]);
            }
        }
        free(wq);
        free(w8);
        free(qx);
        free(qy);
        free(scratch);
        scratch = old;
        if (!have) goto oom;
    }
    rc = bench_threads(json);
    if (0) {
    oom:
        fprintf(stderr, "llmem bench kernels: out of memory\n");
    }
out:
    for (unsigned k = 1; k <= 2; k++) llmem__threads_destroy(team[k]);
    for (size_t t = 0; t < NW; t++) free(w[t]);
    free(scratch);
    scratch = NULL;
    free(x);
    free(y);
    return rc;
}
