/*
 * test_exp.c - llmem__expf and its 8-lane form (src/engine/exp.h), and the
 * kernels that use them (softmax, SwiGLU: src/engine/kernels.c).
 *
 * Accuracy: within 2 ulp of glibc's expf (correctly rounded in practice)
 * over [-110, 95] in steps of 2^-10, which crosses the underflow to zero,
 * the subnormal results, every binade and the overflow to +inf; the ulp
 * distance is the distance of the bit patterns (results are never
 * negative), so a subnormal is judged in units of the smallest one.
 * Edges exactly: -inf -> 0, +inf -> +inf, NaN -> NaN, +-0 -> 1, huge of
 * either sign -> 0 or +inf. Paths: the AVX2 rows, the portable rows and
 * the scalar function agree bitwise on the sweep, the edges and random
 * bit patterns; softmax and SwiGLU give the same bits on the portable and
 * the AVX2 path for every length 1..67 and a vocabulary-sized row. The
 * AVX2 checks do nothing where this machine has no AVX2 path.
 */
#include <float.h>
#include <math.h>

#include "test_util.h"
#include "support/rng.h"

#include "../src/engine/exp.h"
#include "../src/engine/kernels.h"

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Ulps between two non-negative floats (inf counts as the pattern after FLT_MAX). */
static uint32_t ulps(float a, float b)
{
    uint32_t x = bits(a), y = bits(b);
    return x > y ? x - y : y - x;
}

static bool have_avx2(void) { return strncmp(llmem__kernels_isa(), "avx2", 4) == 0; }

/* llmem__exp_rows on one path. */
static void exp_rows_path(bool portable, float *y, const float *x, size_t n)
{
    llmem__kernels_force_portable(portable);
    llmem__exp_rows(y, x, n);
    llmem__kernels_force_portable(false);
}

static void test_exp_accuracy(void **state)
{
    (void)state;
    const size_t n = (size_t)(205 * 1024) + 1;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    assert_true(x && y);
    for (size_t i = 0; i < n; i++) x[i] = -110.0f + (float)i * 0x1p-10f; /* exact: multiples of 2^-10 */
    llmem__exp_rows(y, x, n);
    uint32_t worst = 0;
    float worst_x = 0;
    for (size_t i = 0; i < n; i++) {
        float ref = expf(x[i]);
        uint32_t u = ulps(y[i], ref);
        if (u > worst) {
            worst = u;
            worst_x = x[i];
        }
        assert_true(bits(y[i]) == bits(llmem__expf(x[i]))); /* rows = scalar */
    }
    print_message("expf: worst %u ulp at x = %a (path %s)\n", worst, (double)worst_x, llmem__kernels_isa());
    if (worst > 2) fail_msg("expf: %u ulp at x = %a: %a for %a", worst, (double)worst_x, (double)llmem__expf(worst_x),
                            (double)expf(worst_x));
    free(x);
    free(y);
}

static void test_exp_edges(void **state)
{
    (void)state;
    const float in[] = {-INFINITY, INFINITY, NAN, -NAN, 0.0f, -0.0f, FLT_MAX, -FLT_MAX, 1e30f, -1e30f,
                        88.72283f, 88.72284f, 89.0f, 89.5f, -103.0f, -103.9f, -104.0f, -105.0f,
                        FLT_MIN, -FLT_MIN, 0x1p-149f, -0x1p-149f, 1.0f, -1.0f};
    const size_t n = sizeof in / sizeof in[0];
    float y[sizeof in / sizeof in[0]];
    for (int path = 0; path < 2; path++) {
        exp_rows_path(path == 1, y, in, n);
        assert_true(bits(y[0]) == bits(0.0f));
        assert_true(y[1] == INFINITY);
        assert_true(isnan(y[2]) && isnan(y[3]));
        assert_true(y[4] == 1.0f && y[5] == 1.0f);
        assert_true(y[6] == INFINITY && bits(y[7]) == bits(0.0f));
        assert_true(y[8] == INFINITY && bits(y[9]) == bits(0.0f));
        for (size_t i = 10; i < n; i++)
            if (ulps(y[i], expf(in[i])) > 2)
                fail_msg("expf(%a): %a for %a", (double)in[i], (double)y[i], (double)expf(in[i]));
        for (size_t i = 0; i < n; i++) assert_true(bits(y[i]) == bits(llmem__expf(in[i])));
    }
}

/* The AVX2 rows and the portable ones, bitwise, over random bit patterns
 * (every magnitude, NaNs with payloads) and every tail length. */
static void test_exp_paths_bitwise(void **state)
{
    (void)state;
    if (!have_avx2()) skip();
    const size_t n = (size_t)1 << 20;
    float *x = malloc(n * sizeof(float)), *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    assert_true(x && a && b);
    uint64_t s = test_rng_seed(11);
    for (size_t i = 0; i < n; i++) {
        uint32_t r = (uint32_t)test_rng_next(&s);
        /* half of them in [-128, 128), where the results are not 0 or inf */
        x[i] = i % 2 ? from_bits(r) : (float)((int32_t)r >> 8) * 0x1p-16f;
    }
    exp_rows_path(false, a, x, n);
    exp_rows_path(true, b, x, n);
    for (size_t i = 0; i < n; i++)
        if (bits(a[i]) != bits(b[i]))
            fail_msg("expf(%a): avx2 %a, portable %a", (double)x[i], (double)a[i], (double)b[i]);
    for (size_t len = 0; len < 20; len++) { /* tails: the vector loop and the scalar one meet */
        exp_rows_path(false, a, x + 3, len);
        exp_rows_path(true, b, x + 3, len);
        assert_memory_equal(a, b, len * sizeof(float));
    }
    free(x);
    free(a);
    free(b);
}

/* Softmax and SwiGLU: the same bits on both paths. */
static void test_kernels_paths_bitwise(void **state)
{
    (void)state;
    if (!have_avx2()) skip();
    const size_t big = 32000;
    float *x = malloc(big * sizeof(float)), *a = malloc(big * sizeof(float)), *b = malloc(big * sizeof(float));
    float *g = malloc(big * sizeof(float));
    assert_true(x && a && b && g);
    uint64_t s = test_rng_seed(12);
    for (size_t i = 0; i < big; i++) {
        x[i] = (float)(test_rng_unit(&s) * 40.0 - 20.0);
        g[i] = (float)(test_rng_unit(&s) * 2.0 - 1.0);
    }
    x[5] = -INFINITY; /* a masked position */
    for (size_t len = 1; len <= big; len = len < 67 ? len + 1 : big + 1) {
        memcpy(a, x, len * sizeof(float));
        memcpy(b, x, len * sizeof(float));
        llmem__softmax(a, len);
        llmem__kernels_force_portable(true);
        llmem__softmax(b, len);
        llmem__kernels_force_portable(false);
        if (memcmp(a, b, len * sizeof(float)) != 0) fail_msg("softmax of %zu differs between the paths", len);
        memcpy(a, x, len * sizeof(float));
        memcpy(b, x, len * sizeof(float));
        llmem__swiglu(a, g, len);
        llmem__kernels_force_portable(true);
        llmem__swiglu(b, g, len);
        llmem__kernels_force_portable(false);
        if (memcmp(a, b, len * sizeof(float)) != 0) fail_msg("swiglu of %zu differs between the paths", len);
    }
    free(x);
    free(a);
    free(b);
    free(g);
}

/* SwiGLU at the ends of the range: silu(-huge) is -0 or 0, silu(+huge) the value. */
static void test_swiglu_edges(void **state)
{
    (void)state;
    for (int path = 0; path < 2; path++) {
        llmem__kernels_force_portable(path == 1);
        float a[10] = {-1e30f, 1e30f, -200.0f, 200.0f, 0.0f, -0.0f, 1.0f, -1.0f, 50.0f, -50.0f};
        float g[10] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
        llmem__swiglu(a, g, 10);
        assert_true(a[0] == 0.0f && a[1] == 1e30f && a[2] == 0.0f && a[3] == 200.0f && a[4] == 0.0f);
        assert_true(fabsf(a[6] - 0.7310586f) < 1e-6f && fabsf(a[7] + 0.2689414f) < 1e-6f);
        assert_true(a[8] == 50.0f && fabsf(a[9]) < 1e-19f);
        llmem__kernels_force_portable(false);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exp_accuracy),
        cmocka_unit_test(test_exp_edges),
        cmocka_unit_test(test_exp_paths_bitwise),
        cmocka_unit_test(test_kernels_paths_bitwise),
        cmocka_unit_test(test_swiglu_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
