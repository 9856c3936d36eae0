/*
 * test_kernels.c - the engine's numeric kernels (src/engine/kernels.c).
 *
 * Every kernel against a plain double-precision reference written here,
 * with its own decoding of f16 and bf16, on both paths (the one this
 * machine dispatches to, and the portable one forced), for odd sizes,
 * batches 1..9 and teams of 1..4 threads. Then the invariants the engine
 * relies on, bitwise: a batched matmul row equals the batch-1 matmul of
 * that row whatever the team; an F16/BF16 matmul equals the F32 matmul of
 * the dequantised rows; llmem__dot equals the F32 matmul.
 *
 * The block types (q4_0 .. q8_0, q2_k .. q6_k): on both paths, for rows
 * made by llmem_quantize_row from values of every magnitude and rows of
 * random bytes with random finite scales, the activation rows are the
 * same bits on both paths and decode to within half a step of x; every
 * matmul output equals, within float rounding, the double sum of the
 * dequantised weights (llmem_dequantize_row, itself checked against
 * llama.cpp by the oracle test) times the dequantised activations, and
 * the scalar reference kernel; batched equals batch-1 bitwise for every
 * team. Also f16 conversion for all 65536 halves and chosen roundings,
 * Q8_0 dequant of hand-built blocks, rope against run.c's formula, softmax
 * edge cases.
 * The speed of these kernels is a benchmark, not a test: `llmem bench
 * kernels` (bench/bench_kernels.c).
 */
#include <math.h>

#include "test_util.h"
#include "support/cases.h"
#include "support/rng.h"

#include "llmem/model.h"

#include "../src/engine/kernels.h"
#include "../src/engine/kernels_q.h"
#include "../src/engine/kernels_q4k_x8.h"
#include "../src/engine/engine_internal.h"

#define F32 LLMEM_DTYPE_F32
#define F16 LLMEM_DTYPE_F16
#define BF16 LLMEM_DTYPE_BF16
#define Q8_0 LLMEM_DTYPE_Q8_0

static const size_t sizes[] = {1, 7, 31, 32, 33, 64, 100, 257, 288, 768};
#define NSIZES (sizeof sizes / sizeof sizes[0])
static const uint32_t wtypes[] = {F32, F16, BF16};
#define NWTYPES (sizeof wtypes / sizeof wtypes[0])
static const uint32_t qtypes[] = {LLMEM_DTYPE_Q4_0, LLMEM_DTYPE_Q4_1, LLMEM_DTYPE_Q5_0, LLMEM_DTYPE_Q5_1,
                                  LLMEM_DTYPE_Q8_0, LLMEM_DTYPE_Q2_K, LLMEM_DTYPE_Q3_K, LLMEM_DTYPE_Q4_K,
                                  LLMEM_DTYPE_Q5_K, LLMEM_DTYPE_Q6_K};
#define NQTYPES (sizeof qtypes / sizeof qtypes[0])

/* ---- test-side helpers --------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

/* Uniform in [-1, 1). */
static float rng_f(void) { return (float)((double)(test_rng_next(&rng_state) >> 11) * 0x1p-52 - 1.0); }

/* An independent f16 decoder: the value by definition. */
static double ref_f16(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v;
    if (e == 0x1f) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp(m, -24);
    else v = ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static double ref_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* A weight matrix of d rows by n in type t, and its values as doubles. */
typedef struct wmat {
    uint32_t type;
    size_t n, d, row_bytes;
    uint8_t *data;  /* d * row_bytes */
    double *val;    /* d * n: what the encoded weights mean */
} wmat;

static void wmat_make(wmat *m, uint32_t type, size_t n, size_t d)
{
    m->type = type;
    m->n = n;
    m->d = d;
    m->row_bytes = type == F32 ? n * 4 : n * 2;
    m->data = malloc(d * m->row_bytes + 1);
    m->val = malloc(d * n * sizeof(double) + 1);
    assert_non_null(m->data);
    assert_non_null(m->val);
    for (size_t r = 0; r < d; r++) {
        uint8_t *row = m->data + r * m->row_bytes;
        double *v = m->val + r * n;
        if (type == F32) {
            for (size_t c = 0; c < n; c++) {
                float f = rng_f();
                memcpy(row + 4 * c, &f, 4);
                v[c] = f;
            }
        } else {
            for (size_t c = 0; c < n; c++) {
                uint16_t h;
                if (type == F16) {
                    h = (uint16_t)(test_rng_next(&rng_state) & 0x3bff); /* |x| < 1, sign from bit 15 below */
                    h |= (uint16_t)(test_rng_next(&rng_state) & 0x8000);
                    v[c] = ref_f16(h);
                } else {
                    h = (uint16_t)(test_rng_next(&rng_state) & 0x3f7f) | (uint16_t)(test_rng_next(&rng_state) & 0x8000);
                    v[c] = ref_bf16(h);
                }
                memcpy(row + 2 * c, &h, 2);
            }
        }
    }
}

static void wmat_free(wmat *m)
{
    free(m->data);
    free(m->val);
}

static const char *type_name(uint32_t t) { return llmem_dtype_name(t); }

/* |got - ref| within rel of the sum of |terms| (a dot can cancel: relative
 * to the result itself would be meaningless). */
static void check_close(double got, double ref, double scale, double rel, const char *what, size_t i)
{
    double tol = rel * scale + 1e-30;
    if (!(fabs(got - ref) <= tol))
        fail_msg("%s [%zu]: got %.9g, want %.9g (tolerance %.3g)", what, i, got, ref, tol);
}

static llmem__threads *teams[5]; /* teams[k]: k threads; teams[0] unused (NULL = no team) */

static int setup_teams(void **state)
{
    (void)state;
    for (unsigned k = 1; k <= 4; k++)
        if (llmem__threads_create(k, &teams[k]) != LLMEM_OK) return -1;
    return 0;
}

static int teardown_teams(void **state)
{
    (void)state;
    for (unsigned k = 1; k <= 4; k++) llmem__threads_destroy(teams[k]);
    return 0;
}

/* ---- matmul ------------------------------------------------------------- */

/* For one path, type and shape: every (batch, team) against the double
 * reference, and bitwise against the batch-1 results of the same path. */
/* Every batch of 1..maxb rows, with no team and with teams of 1-4 threads,
 * gives the bits of the batch-1 run y1 (maxb x d) and writes nothing past
 * its batch in y (maxb x d floats, overwritten). */
static void check_batches(float *y, const float *y1, const float *x, const void *w, uint32_t type, size_t n, size_t d,
                          size_t maxb, void *scratch)
{
    for (size_t batch = 1; batch <= maxb; batch++)
        for (unsigned k = 0; k <= 4; k++) {
            memset(y, 0xff, maxb * d * sizeof(float));
            llmem__matmul(k ? teams[k] : NULL, y, x, w, type, n, d, batch, scratch);
            if (memcmp(y, y1, batch * d * sizeof(float)) != 0) {
                size_t i = 0;
                while (memcmp(&y[i], &y1[i], sizeof(float)) == 0) i++;
                fail_msg("%s matmul n=%zu d=%zu batch=%zu threads=%u (%s): y[%zu][%zu] = %.9g, batch-1 gave %.9g",
                         type_name(type), n, d, batch, k, llmem__kernels_isa(), i / d, i % d, y[i], y1[i]);
            }
            /* Nothing written past the batch. */
            for (size_t i = batch * d; i < maxb * d; i++) {
                uint32_t u;
                memcpy(&u, &y[i], 4);
                if (u != 0xffffffffu) fail_msg("matmul wrote past batch %zu at %zu", batch, i);
            }
        }
}

/* One path, type and shape, on batches of 1..maxb rows. */
static void matmul_case(uint32_t type, size_t n, size_t d, size_t maxb)
{
    wmat m;
    wmat_make(&m, type, n, d);
    float *x = malloc(maxb * n * sizeof(float));
    float *y = malloc(maxb * d * sizeof(float));
    float *y1 = malloc(maxb * d * sizeof(float)); /* batch-1, no team */
    float *yf = malloc(maxb * d * sizeof(float)); /* F32 matmul of the dequantised rows */
    float *wf = malloc(d * n * sizeof(float));
    assert_true(x && y && y1 && yf && wf);
    for (size_t i = 0; i < maxb * n; i++) x[i] = rng_f();

    for (size_t b = 0; b < maxb; b++) llmem__matmul(NULL, y1 + b * d, x + b * n, m.data, type, n, d, 1, NULL);
    for (size_t b = 0; b < maxb; b++)
        for (size_t r = 0; r < d; r++) {
            double ref = 0, scale = 0;
            for (size_t c = 0; c < n; c++) {
                ref += m.val[r * n + c] * x[b * n + c];
                scale += fabs(m.val[r * n + c] * x[b * n + c]);
            }
            char what[96];
            snprintf(what, sizeof what, "%s matmul n=%zu d=%zu (%s) b=%zu row", type_name(type), n, d,
                     llmem__kernels_isa(), b);
            check_close(y1[b * d + r], ref, scale, 1e-5, what, r);
        }

    /* Dequantised rows: exactly the values above; the F32 matmul on them
     * gives the same bits, and so does llmem__dot. */
    for (size_t r = 0; r < d; r++) {
        llmem__dequant_row(type, m.data, r, n, wf + r * n);
        for (size_t c = 0; c < n; c++)
            if ((double)wf[r * n + c] != m.val[r * n + c])
                fail_msg("%s dequant row %zu [%zu]: %g, want %g", type_name(type), r, c, wf[r * n + c],
                         m.val[r * n + c]);
    }
    llmem__matmul(NULL, yf, x, wf, F32, n, d, maxb, NULL);
    if (memcmp(yf, y1, maxb * d * sizeof(float)) != 0)
        fail_msg("%s matmul n=%zu d=%zu differs from the F32 matmul of its dequantised rows", type_name(type), n, d);
    for (size_t b = 0; b < maxb; b++)
        for (size_t r = 0; r < d; r++) {
            float dt = llmem__dot(x + b * n, wf + r * n, n);
            if (memcmp(&dt, &y1[b * d + r], sizeof dt) != 0)
                fail_msg("dot n=%zu: %.9g but matmul %.9g", n, dt, y1[b * d + r]);
        }

    check_batches(y, y1, x, m.data, type, n, d, maxb, NULL);
    free(x);
    free(y);
    free(y1);
    free(yf);
    free(wf);
    wmat_free(&m);
}

static void matmul_all(void)
{
    static const size_t ds[] = {1, 7, 17, 100};
    for (size_t t = 0; t < NWTYPES; t++)
        for (size_t i = 0; i < NSIZES; i++) {
            size_t n = sizes[i];
            for (size_t j = 0; j < sizeof ds / sizeof ds[0]; j++) matmul_case(wtypes[t], n, ds[j], 9);
        }
}

static void test_matmul(void **state)
{
    (void)state;
    printf("  dispatched path: %s\n", llmem__kernels_isa());
    matmul_all();
}

/* Batches past the x86 path's 16-row block of widened f16/bf16 tiles, on
 * rows of two 512-element chunks and a zero-padded tail (n = 1100): every
 * batch of 1..20 gives the batch-1 bits, on both paths, with every team
 * (and matmul_case's other checks hold). */
static void test_matmul_wide_batches(void **state)
{
    (void)state;
    for (int portable = 0; portable <= 1; portable++) {
        llmem__kernels_force_portable(portable);
        for (size_t t = 0; t < NWTYPES; t++) matmul_case(wtypes[t], 1100, 9, 20);
    }
    llmem__kernels_force_portable(false);
}

static void test_matmul_portable(void **state)
{
    (void)state;
    llmem__kernels_force_portable(true);
    assert_string_equal(llmem__kernels_isa(), "portable");
    matmul_all();
    llmem__kernels_force_portable(false);
}

/* The two paths agree within rounding on a realistic shape. */
static void test_paths_agree(void **state)
{
    (void)state;
    size_t n = 768, d = 64, batch = 5;
    for (size_t t = 0; t < NWTYPES; t++) {
        wmat m;
        wmat_make(&m, wtypes[t], n, d);
        float *x = malloc(batch * n * sizeof(float)), *ya = malloc(batch * d * sizeof(float)),
              *yp = malloc(batch * d * sizeof(float));
        assert_true(x && ya && yp);
        for (size_t i = 0; i < batch * n; i++) x[i] = rng_f();
        llmem__matmul(teams[2], ya, x, m.data, m.type, n, d, batch, NULL);
        llmem__kernels_force_portable(true);
        llmem__matmul(teams[2], yp, x, m.data, m.type, n, d, batch, NULL);
        llmem__kernels_force_portable(false);
        for (size_t i = 0; i < batch * d; i++) {
            double scale = 0;
            for (size_t c = 0; c < n; c++) scale += fabs(m.val[(i % d) * n + c] * x[(i / d) * n + c]);
            check_close(ya[i], yp[i], scale, 2e-5, "dispatched vs portable", i);
        }
        free(x);
        free(ya);
        free(yp);
        wmat_free(&m);
    }
}

static void test_matmul_supports(void **state)
{
    (void)state;
    assert_true(llmem__matmul_supports(F32));
    assert_true(llmem__matmul_supports(F16));
    assert_true(llmem__matmul_supports(BF16));
    for (size_t t = 0; t < NQTYPES; t++) assert_true(llmem__matmul_supports(qtypes[t]));
    assert_false(llmem__matmul_supports(9));  /* q8_1: a type for activations, not stored weights */
    assert_false(llmem__matmul_supports(15)); /* q8_k, the same */
    assert_false(llmem__matmul_supports(99));
    assert_int_equal(llmem__matmul_scratch_bytes(F32, 256, 4), 0);
    assert_true(llmem__matmul_scratch_bytes(LLMEM_DTYPE_Q4_K, 256, 4) >= 4 * (256 + 32 + 4));
    assert_int_equal(llmem__matmul_scratch_bytes(LLMEM_DTYPE_Q4_K, 256, 4) % 64, 0);
}

/* ---- block-type matmul ------------------------------------------------------ */

/* Where a type's f16 scale fields lie in its block (a fact of the format):
 * offsets, -1 after the last. */
static void scale_fields(uint32_t t, int off[3])
{
    off[1] = off[2] = -1;
    switch (t) {
    case LLMEM_DTYPE_Q4_1: case LLMEM_DTYPE_Q5_1: case LLMEM_DTYPE_Q4_K: case LLMEM_DTYPE_Q5_K:
        off[0] = 0;
        off[1] = 2;
        break;
    case LLMEM_DTYPE_Q2_K: off[0] = 80; off[1] = 82; break;
    case LLMEM_DTYPE_Q3_K: off[0] = 108; break;
    case LLMEM_DTYPE_Q6_K: off[0] = 208; break;
    default: off[0] = 0; break;
    }
}

/* d rows of n of block type t: rows from llmem_quantize_row over values of
 * magnitude 2^-12 .. 2^8 (a different one per row), and every third row
 * random bytes with random finite scales of either sign. */
static uint8_t *qmat_make(uint32_t t, size_t n, size_t d, size_t *row_bytes)
{
    size_t rb = (size_t)llmem_dtype_bytes(t, n), bs = llmem_dtype_bytes(t, llmem_dtype_block_size(t));
    uint8_t *w = malloc(d * rb + 1);
    float *v = malloc(n * sizeof(float));
    assert_true(w && v && rb);
    for (size_t r = 0; r < d; r++) {
        uint8_t *row = w + r * rb;
        if (r % 3 == 2) {
            for (size_t i = 0; i < rb; i++) row[i] = (uint8_t)test_rng_next(&rng_state);
            int off[3];
            scale_fields(t, off);
            for (size_t b = 0; b < rb / bs; b++)
                for (int k = 0; k < 3 && off[k] >= 0; k++) {
                    uint16_t h = (uint16_t)(0x1400 + test_rng_next(&rng_state) % 0x3000) | (uint16_t)(test_rng_next(&rng_state) & 0x8000);
                    memcpy(row + b * bs + (size_t)off[k], &h, 2);
                }
        } else {
            float mag = ldexpf(1.0f, (int)(r % 21) - 12);
            for (size_t c = 0; c < n; c++) v[c] = mag * rng_f() + (r % 5 == 1 ? mag * 0.5f : 0.0f);
            assert_ok(llmem_quantize_row(t, v, row, n));
        }
    }
    free(v);
    *row_bytes = rb;
    return w;
}

/* The activation row's values as doubles (its layout: kernels_q.h). */
static void act_decode(uint32_t t, const uint8_t *row, size_t n, double *out, const float **s_out)
{
    const int8_t *qs = (const int8_t *)row;
    bool k = t >= LLMEM_DTYPE_Q2_K;
    const float *d = (const float *)(row + n + (k ? 2 * (n / 16) : 0));
    for (size_t i = 0; i < n; i++) out[i] = (double)d[i / (k ? 256 : 32)] * qs[i];
    *s_out = k ? NULL : d + n / 32;
    if (k) {
        const int16_t *bs = (const int16_t *)(row + n);
        for (size_t g = 0; g < n / 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++) sum += qs[16 * g + (size_t)j];
            if (sum != bs[g]) fail_msg("%s activation bsum %zu = %d, the values sum to %d", type_name(t), g, bs[g], sum);
        }
    }
}

/* The vector paths' kernels over the block types (kernels_q.h), by the
 * names llmem__kernels_path_available knows. */
typedef void (*qrows_fn)(float *, const void *, const void *, uint32_t, size_t, size_t, size_t, size_t, size_t);
static const struct {
    const char *name;
    qrows_fn f;
} qpaths[] = {{"avx2", llmem__qrows_avx2}, {"avx2+vnni", llmem__qrows_vnni}, {"avx2+avx512vnni", llmem__qrows_avx512}};
#define NQPATHS (sizeof qpaths / sizeof qpaths[0])

/* Which vector paths the block-type tests run here, printed so that a
 * path this CPU lacks shows as skipped, not as passed. */
static void qpaths_print(void)
{
    for (size_t p = 0; p < NQPATHS; p++)
        printf("  path %s: %s\n", qpaths[p].name,
               llmem__kernels_path_available(qpaths[p].name) ? "tested against the reference"
                                                             : "SKIPPED (not on this CPU or not built)");
    printf("  path avx2+avx512vnni+amx (its x8 batches, test_q4k_x8): %s\n",
           llmem__kernels_path_available("avx2+avx512vnni+amx") ? "tested against the reference"
                                                               : "SKIPPED (no AMX-INT8 here, not granted, or not built)");
}

/* Each vector path this CPU runs, called directly on row ranges that start
 * and end inside its tiles (8 and 16 rows) and on batches of 1, 4 (decode)
 * and 5-7, 9 (the tile paths, 1-3 rows past the passes of 4), must give yr's bits (the reference kernel's,
 * batch maxb) in its rows and leave the other rows alone. */
static void qrows_paths_check(uint32_t t, const uint8_t *act, const uint8_t *w, const float *yr, size_t n, size_t d,
                              size_t maxb)
{
    const size_t cuts[][2] = {{0, d}, {d > 3 ? 3 : 0, d}, {d > 1 ? 1 : 0, d > 13 ? 13 : d}, {d > 16 ? 16 : 0, d},
                              {d > 5 ? 5 : 0, d > 35 ? 35 : d}};
    const size_t batches[] = {1, 4, 5, 6, 7, maxb};
    float *y = malloc(maxb * d * sizeof(float));
    assert_non_null(y);
    for (size_t p = 0; p < NQPATHS; p++) {
        if (!llmem__kernels_path_available(qpaths[p].name)) continue;
        for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++)
            for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
                const size_t r0 = cuts[c][0], r1 = cuts[c][1], batch = batches[bi];
                memset(y, 0xff, maxb * d * sizeof(float));
                qpaths[p].f(y, act, w, t, n, d, batch, r0, r1);
                for (size_t b = 0; b < maxb; b++)
                    for (size_t r = 0; r < d; r++) {
                        uint32_t u;
                        memcpy(&u, &y[b * d + r], 4);
                        if (b >= batch || r < r0 || r >= r1) {
                            if (u != 0xffffffffu)
                                fail_msg("%s %s rows [%zu, %zu) batch %zu wrote y[%zu][%zu]", qpaths[p].name,
                                         type_name(t), r0, r1, batch, b, r);
                        } else if (memcmp(&y[b * d + r], &yr[b * d + r], 4) != 0) {
                            fail_msg("%s %s n=%zu d=%zu rows [%zu, %zu) batch %zu: y[%zu][%zu] = %.9g, the reference "
                                     "kernel gave %.9g", qpaths[p].name, type_name(t), n, d, r0, r1, batch, b, r,
                                     y[b * d + r], yr[b * d + r]);
                        }
                    }
            }
    }
    free(y);
}

static void qmatmul_case(uint32_t t, size_t n, size_t d)
{
    const size_t maxb = 9;
    size_t rb, ab = llmem__act_row_bytes(t, n);
    uint8_t *w = qmat_make(t, n, d, &rb);
    float *x = malloc(maxb * n * sizeof(float)), *y = malloc(maxb * d * sizeof(float));
    float *y1 = malloc(maxb * d * sizeof(float)), *yr = malloc(maxb * d * sizeof(float));
    float *wd = malloc(n * sizeof(float));
    double *xd = malloc(maxb * n * sizeof(double));
    uint8_t *act = aligned_alloc(64, maxb * ab), *act2 = aligned_alloc(64, maxb * ab);
    void *scratch = aligned_alloc(64, llmem__matmul_scratch_bytes(t, n, maxb));
    assert_true(x && y && y1 && yr && wd && xd && act && act2 && scratch);
    assert_int_equal(llmem__matmul_scratch_bytes(t, n, maxb), maxb * ab);
    for (size_t i = 0; i < maxb * n; i++) x[i] = rng_f() * (i % 97 == 0 ? 30.0f : 1.0f);
    memset(x, 0, n / 2 * sizeof(float)); /* zero blocks in the first row */

    /* Activation rows: the same bits on both paths, within half a step of x
     * (plus, for the 32-element rows, the f16 rounding of the step times at
     * most 127 steps). */
    const float *s[9];
    memset(act, 0, maxb * ab);
    memset(act2, 0, maxb * ab);
    for (size_t b = 0; b < maxb; b++) {
        llmem__act_quantize_ref(t, x + b * n, n, act + b * ab);
        if (!strncmp(llmem__kernels_isa(), "avx2", 4)) llmem__act_quantize_avx2(t, x + b * n, n, act2 + b * ab);
        else llmem__act_quantize_ref(t, x + b * n, n, act2 + b * ab);
        act_decode(t, act + b * ab, n, xd + b * n, &s[b]);
        size_t blk = t >= LLMEM_DTYPE_Q2_K ? 256 : 32;
        for (size_t i = 0; i < n; i += blk) {
            double amax = 0;
            for (size_t j = 0; j < blk; j++) amax = fmax(amax, fabs(x[b * n + i + j]));
            for (size_t j = 0; j < blk; j++)
                if (fabs(xd[b * n + i + j] - x[b * n + i + j]) > amax / 127 * (blk == 32 ? 0.5 + 127 * 0x1p-11 : 0.5) * 1.001 + 1e-30)
                    fail_msg("%s activation %zu: %g for %g (block amax %g)", type_name(t), i + j, xd[b * n + i + j],
                             x[b * n + i + j], amax);
        }
    }
    if (memcmp(act, act2, maxb * ab) != 0) fail_msg("%s activation rows differ between the paths (n=%zu)", type_name(t), n);

    for (size_t b = 0; b < maxb; b++) llmem__matmul(NULL, y1 + b * d, x + b * n, w, t, n, d, 1, scratch);
    llmem__qrows_ref(yr, act, w, t, n, d, maxb, 0, d);
    bool with_min = t == LLMEM_DTYPE_Q4_1 || t == LLMEM_DTYPE_Q5_1;
    size_t bs = llmem_dtype_bytes(t, llmem_dtype_block_size(t));
    for (size_t r = 0; r < d; r++) {
        assert_ok(llmem_dequantize_row(t, w + r * rb, wd, n));
        for (size_t b = 0; b < maxb; b++) {
            double ref = 0, scale = 0;
            for (size_t c = 0; c < n; c++) {
                double wc = wd[c];
                if (with_min) { /* the minimum's term uses the activation's scaled sum */
                    uint16_t mh;
                    memcpy(&mh, w + r * rb + c / 32 * bs + 2, 2);
                    wc -= ref_f16(mh);
                    if (c % 32 == 0) {
                        ref += ref_f16(mh) * s[b][c / 32];
                        scale += fabs(ref_f16(mh) * s[b][c / 32]);
                    }
                }
                ref += wc * xd[b * n + c];
                scale += fabs(wc * xd[b * n + c]);
            }
            char what[96];
            snprintf(what, sizeof what, "%s matmul n=%zu d=%zu (%s) b=%zu row", type_name(t), n, d,
                     llmem__kernels_isa(), b);
            check_close(y1[b * d + r], ref, scale, 2e-6, what, r);
            snprintf(what, sizeof what, "%s reference kernel n=%zu d=%zu b=%zu row", type_name(t), n, d, b);
            check_close(yr[b * d + r], ref, scale, 2e-6, what, r);
        }
    }
    /* Every path computes the reference's operations in its order (the
     * integer sums exact, the floats one row a lane): the same bits. */
    if (memcmp(y1, yr, maxb * d * sizeof(float)) != 0) {
        size_t i = 0;
        while (memcmp(&y1[i], &yr[i], sizeof(float)) == 0) i++;
        fail_msg("%s n=%zu d=%zu (%s): y[%zu][%zu] = %.9g, the reference kernel gave %.9g", type_name(t), n, d,
                 llmem__kernels_isa(), i / d, i % d, y1[i], yr[i]);
    }
    /* Every vector path this CPU runs gives the reference's bits too. */
    qrows_paths_check(t, act, w, yr, n, d, maxb);
    check_batches(y, y1, x, w, t, n, d, maxb, scratch);
    free(w);
    free(x);
    free(y);
    free(y1);
    free(yr);
    free(wd);
    free(xd);
    free(act);
    free(act2);
    free(scratch);
}

static void qmatmul_all(void)
{
    /* d: one row, tails of the 8-row tiles (7, 17) and whole tiles plus
     * none (40). n: one block, two, a model's width, and (fewer rows)
     * more blocks than a tile buffer holds (32 blocks; 4 super-blocks)
     * and than the k-quant decode's group of 8 super-blocks, with a tail. */
    static const size_t ds[] = {1, 7, 17, 40};
    for (size_t t = 0; t < NQTYPES; t++) {
        size_t blk = llmem_dtype_block_size(qtypes[t]);
        const size_t ns[] = {blk, 2 * blk, blk == 32 ? 288 : 768};
        for (size_t i = 0; i < 3; i++)
            for (size_t j = 0; j < sizeof ds / sizeof ds[0]; j++) qmatmul_case(qtypes[t], ns[i], ds[j]);
        qmatmul_case(qtypes[t], blk == 32 ? 32 * 41 : 256 * 9, 7);
        qmatmul_case(qtypes[t], blk == 32 ? 32 * 65 : 256 * 17, 17);
    }
}

TEST_CASE(test_qmatmul, qpaths_print(); qmatmul_all())

static void test_qmatmul_portable(void **state)
{
    (void)state;
    llmem__kernels_force_portable(true);
    qmatmul_all();
    llmem__kernels_force_portable(false);
}


/* ---- q4_K and q5_0 repacked 8 rows interleaved (kernels_q4k_x8.h) -------------
 *
 * The repacked matrix must give the q4_K (q5_0) reference kernel's bits through
 * every kernel over it (the scalar one of the layout, AVX2, AVX-VNNI and
 * AVX-512 VNNI where the machine has them, llmem__matmul on every team), for every row range,
 * including ranges that start or end inside a group of 8. Weights: the
 * quantised and random-byte rows of qmat_make, and (extreme) every level
 * 15, every scale and min 63, large d and dmin, against activations of
 * all -127 or +-127 and rows of random bytes (-128 included). */

typedef void (*x8_rows_fn)(float *, const void *, const void *, size_t, size_t, size_t, size_t, size_t);

static void x8_check_range(x8_rows_fn f, const char *name, const uint8_t *act, const uint8_t *w8, const float *yr,
                           size_t n, size_t d, size_t batch, size_t r0, size_t r1, const char *what)
{
    float *y = malloc(batch * d * sizeof(float) + 1);
    assert_non_null(y);
    memset(y, 0xff, batch * d * sizeof(float));
    f(y, act, w8, n, d, batch, r0, r1);
    for (size_t b = 0; b < batch; b++)
        for (size_t r = 0; r < d; r++) {
            uint32_t u;
            memcpy(&u, &y[b * d + r], 4);
            if (r < r0 || r >= r1) {
                if (u != 0xffffffffu) fail_msg("x8 %s (%s) rows [%zu, %zu) wrote row %zu", name, what, r0, r1, r);
            } else if (memcmp(&y[b * d + r], &yr[b * d + r], 4) != 0) {
                fail_msg("x8 %s (%s) n=%zu d=%zu batch=%zu rows [%zu, %zu): y[%zu][%zu] = %.9g, the in-place reference "
                         "gave %.9g", name, what, n, d, batch, r0, r1, b, r, y[b * d + r], yr[b * d + r]);
            }
        }
    free(y);
}

/* The repacked layouts (kernels_q4k_x8.h), one a source type: the wtype,
 * the size, the pack, and the reference, AVX2, VNNI and AVX-512 kernels
 * (and the AMX ones, for batches of 16 and more). */
typedef struct x8_kind {
    uint32_t type, wtype;
    const char *name;
    size_t (*bytes)(size_t n, size_t d);
    void (*pack)(void *dst, const void *src, size_t n, size_t d);
    x8_rows_fn fns[5];
} x8_kind;

static const x8_kind x8_kinds[] = {
    {LLMEM_DTYPE_Q4_K, LLMEM__WTYPE_Q4K_X8, "q4_K_x8", llmem__q4k_x8_bytes, llmem__q4k_x8_pack,
     {llmem__q4k_x8_rows_ref, llmem__q4k_x8_rows_avx2, llmem__q4k_x8_rows_vnni, llmem__q4k_x8_rows_avx512,
      llmem__q4k_x8_rows_amx}},
    {LLMEM_DTYPE_Q5_0, LLMEM__WTYPE_Q5_0_X8, "q5_0_x8", llmem__q5_0_x8_bytes, llmem__q5_0_x8_pack,
     {llmem__q5_0_x8_rows_ref, llmem__q5_0_x8_rows_avx2, llmem__q5_0_x8_rows_vnni, llmem__q5_0_x8_rows_avx512,
      llmem__q5_0_x8_rows_amx}},
    {LLMEM_DTYPE_Q4_0, LLMEM__WTYPE_Q4_0_X8, "q4_0_x8", llmem__q4_0_x8_bytes, llmem__q4_0_x8_pack,
     {llmem__q4_0_x8_rows_ref, llmem__q4_0_x8_rows_avx2, llmem__q4_0_x8_rows_vnni, llmem__q4_0_x8_rows_avx512,
      llmem__q4_0_x8_rows_amx}},
    {LLMEM_DTYPE_Q8_0, LLMEM__WTYPE_Q8_0_X8, "q8_0_x8", llmem__q8_0_x8_bytes, llmem__q8_0_x8_pack,
     {llmem__q8_0_x8_rows_ref, llmem__q8_0_x8_rows_avx2, llmem__q8_0_x8_rows_vnni, llmem__q8_0_x8_rows_avx512,
      llmem__q8_0_x8_rows_amx}},
};

/* The kind of a source type or of a repacked wtype. */
static const x8_kind *x8_kind_of(uint32_t t)
{
    for (size_t i = 0; i < sizeof x8_kinds / sizeof x8_kinds[0]; i++)
        if (x8_kinds[i].type == t || x8_kinds[i].wtype == t) return &x8_kinds[i];
    fail_msg("no x8 layout for type %u", (unsigned)t);
    return NULL;
}

/* The extreme levels of a mode-1 block: q4_K and q4_0 15, q5_0 31 (or 0 where
 * (r + k) % 4 == 3); q8_0 -128, +127 and -127 by turns (its magnitude's
 * largest, which the AVX2 sign trick takes as the unsigned 128). */
static void x8_extreme_levels(uint32_t t, uint8_t *blk, size_t bb, size_t r, size_t k)
{
    if (t == LLMEM_DTYPE_Q8_0) {
        memset(blk + 2, (r + k) % 3 == 0 ? 0x80 : (r + k) % 3 == 1 ? 0x7f : 0x81, bb - 2);
        return;
    }
    memset(blk + 2, (r + k) % 4 == 3 ? 0 : 0xff, bb - 2);
}

/* mode 0: qmat_make rows; 1: extreme weights. act_mode 0: quantised x; 1: all -127; 2: +-127; 3: random bytes. */
static void x8_case(uint32_t t, size_t n, size_t d, int mode, int act_mode)
{
    const bool k4 = t == LLMEM_DTYPE_Q4_K;
    const x8_kind *xk = x8_kind_of(t);
    const uint32_t wt = xk->wtype;
    /* up to 21 rows: a tile alone (9, 13), a whole AMX tile of 16
     * activation rows, then a last row on the AVX-512 kernel (17) or a
     * smaller tile (21) */
    const size_t maxb = 21, ab = llmem__act_row_bytes(t, n), nb = n / (k4 ? 256 : 32);
    const size_t bb = k4 ? 144 : t == LLMEM_DTYPE_Q8_0 ? 34 : t == LLMEM_DTYPE_Q4_0 ? 18 : 22;
    size_t rb;
    uint8_t *w = qmat_make(t, n, d, &rb);
    if (mode == 1)
        for (size_t r = 0; r < d; r++)
            for (size_t k = 0; k < nb; k++) {
                uint8_t *blk = w + r * rb + k * bb;
                x8_extreme_levels(t, blk, bb, r, k);
                uint16_t h = (uint16_t)(r % 2 ? 0x5bff : 0x3c00), hm = (uint16_t)(r % 3 ? 0x57ff : 0xbc00);
                memcpy(blk, &h, 2);
                if (k4) memcpy(blk + 2, &hm, 2);
            }
    const size_t xbytes = xk->bytes(n, d);
    uint8_t *w8 = malloc(xbytes + 1);
    float *x = malloc(maxb * n * sizeof(float)), *yr = malloc(maxb * d * sizeof(float)), *y = malloc(maxb * d * sizeof(float));
    uint8_t *act = aligned_alloc(64, maxb * ab);
    void *scratch = aligned_alloc(64, llmem__matmul_scratch_bytes(wt, n, maxb));
    assert_true(w8 && x && yr && y && act && scratch);
    if (k4) assert_int_equal(xbytes, d / 8 * nb * LLMEM__X8_BLOCK + d % 8 * rb);
    else assert_int_equal(xbytes, d * rb); /* exactly the source's size */
    assert_int_equal(llmem__matmul_scratch_bytes(wt, n, maxb), maxb * ab);
    xk->pack(w8, w, n, d);
    for (size_t i = 0; i < maxb * n; i++) {
        x[i] = act_mode == 1 ? 1.0f : act_mode == 2 ? (i % 3 ? 1.0f : -1.0f) : rng_f() * (i % 97 == 0 ? 30.0f : 1.0f);
    }
    if (act_mode == 0) memset(x, 0, n / 2 * sizeof(float)); /* zero blocks in the first row */
    memset(act, 0, maxb * ab);
    for (size_t b = 0; b < maxb; b++) {
        uint8_t *row = act + b * ab;
        llmem__act_quantize_ref(t, x + b * n, n, row);
        if (act_mode != 3) continue;
        int8_t *qs = (int8_t *)row;
        for (size_t i = 0; i < n; i++) qs[i] = (int8_t)(test_rng_next(&rng_state) & 0xff);
        /* q8_0's AVX2 kernels (in place and x8) move the weights' signs onto
         * the activation, so they take the quantiser's range, -127..127 */
        if (t == LLMEM_DTYPE_Q8_0)
            for (size_t i = 0; i < n; i++) qs[i] = qs[i] == -128 ? -127 : qs[i];
        if (k4) {
            int16_t *bs = (int16_t *)(void *)(row + n);
            float *dd = (float *)(void *)(row + n + 2 * (n / 16));
            for (size_t g = 0; g < n / 16; g++) {
                int sum = 0;
                for (int j = 0; j < 16; j++) sum += qs[16 * g + (size_t)j];
                bs[g] = (int16_t)sum;
            }
            for (size_t k = 0; k < nb; k++) dd[k] = rng_f() * 0.01f;
        } else { /* A8: d, s, then the exact sums xs */
            float *dd = (float *)(void *)(row + n);
            int32_t *xs = (int32_t *)(void *)(row + n + 8 * (n / 32));
            for (size_t k = 0; k < nb; k++) {
                int sum = 0;
                for (int j = 0; j < 32; j++) sum += qs[32 * k + (size_t)j];
                xs[k] = sum;
                dd[k] = rng_f() * 0.01f;
            }
        }
    }
    /* the extremes: all -127 (q4_K's scale is minus the largest; q5_0's all +127), or +-127 */
    if (act_mode == 1) assert_int_equal(((const int8_t *)act)[0], k4 ? -127 : 127);
    if (act_mode == 2) assert_int_equal(((const int8_t *)act)[0], -127);
    llmem__qrows_ref(yr, act, w, t, n, d, maxb, 0, d);
    char what[64];
    snprintf(what, sizeof what, "%s, weights %d, activations %d", type_name(t), mode, act_mode);
    const x8_rows_fn *fns = xk->fns;
    const char *names[5] = {"reference", "avx2", "avx2+vnni", "avx2+avx512vnni", "avx2+avx512vnni+amx"};
    const size_t cuts[][2] = {{0, d}, {d > 3 ? 3 : 0, d}, {d > 1 ? 1 : 0, d > 13 ? 13 : d}, {d > 5 ? 5 : 0, d > 6 ? 6 : d},
                              {d > 9 ? 9 : 0, d > 35 ? 35 : d}, {d > 8 ? 8 : 0, d > 16 ? 16 : d}};
    for (int f = 0; f < 5; f++) {
        if (!fns[f] || (f && !llmem__kernels_path_available(names[f]))) continue; /* qpaths_print lists the skipped */
        for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++)
            for (size_t batch = 1; batch <= maxb; batch += batch < 5 ? 1 : 4)
                x8_check_range(fns[f], names[f], act, w8, yr, n, d, batch, cuts[c][0], cuts[c][1], what);
    }
    /* Through the matmul, on every team and batch: the q4_K matmul's bits. */
    if (act_mode == 0)
        for (size_t batch = 1; batch <= maxb; batch++)
            for (unsigned k = 0; k <= 4; k++) {
                float *y1 = malloc(maxb * d * sizeof(float));
                assert_non_null(y1);
                llmem__matmul(k ? teams[k] : NULL, y1, x, w, t, n, d, batch, scratch);
                memset(y, 0xff, maxb * d * sizeof(float));
                llmem__matmul(k ? teams[k] : NULL, y, x, w8, wt, n, d, batch, scratch);
                if (memcmp(y, y1, batch * d * sizeof(float)) != 0)
                    fail_msg("%s x8 matmul n=%zu d=%zu batch=%zu threads=%u (%s): not the in-place matmul's bits",
                             type_name(t), n, d, batch, k, llmem__kernels_isa());
                if (memcmp(y, yr, batch * d * sizeof(float)) != 0)
                    fail_msg("%s x8 matmul n=%zu d=%zu batch=%zu threads=%u (%s): not the reference's bits",
                             type_name(t), n, d, batch, k, llmem__kernels_isa());
                for (size_t i = batch * d; i < maxb * d; i++) {
                    uint32_t u;
                    memcpy(&u, &y[i], 4);
                    if (u != 0xffffffffu) fail_msg("x8 matmul wrote past batch %zu at %zu", batch, i);
                }
                free(y1);
            }
    free(w);
    free(w8);
    free(x);
    free(yr);
    free(y);
    free(act);
    free(scratch);
}

static void x8_all(void)
{
    static const size_t ds[] = {1, 7, 8, 17, 40};
    static const size_t ns[] = {256, 768, 256 * 9};
    static const size_t ns5[] = {32, 288, 32 * 43};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
        for (size_t j = 0; j < sizeof ds / sizeof ds[0]; j++)
            for (int a = 0; a < 4; a++) {
                x8_case(LLMEM_DTYPE_Q4_K, ns[i], ds[j], 0, a);
                x8_case(LLMEM_DTYPE_Q5_0, ns5[i], ds[j], 0, a);
                x8_case(LLMEM_DTYPE_Q4_0, ns5[i], ds[j], 0, a);
                x8_case(LLMEM_DTYPE_Q8_0, ns5[i], ds[j], 0, a);
            }
    for (size_t j = 0; j < sizeof ds / sizeof ds[0]; j++)
        for (int a = 0; a < 4; a++) {
            x8_case(LLMEM_DTYPE_Q4_K, 512, ds[j], 1, a);
            x8_case(LLMEM_DTYPE_Q5_0, 64, ds[j], 1, a);
            x8_case(LLMEM_DTYPE_Q4_0, 64, ds[j], 1, a);
            x8_case(LLMEM_DTYPE_Q8_0, 64, ds[j], 1, a);
        }
}

static void test_q4k_x8(void **state)
{
    (void)state;
    qpaths_print();
    x8_all();
}

static void test_q4k_x8_portable(void **state)
{
    (void)state;
    llmem__kernels_force_portable(true);
    x8_all();
    llmem__kernels_force_portable(false);
}

/* ---- grouped matmul (llmem__matmul_group) ---------------------------------------
 * A group over one x gives, bitwise, what separate llmem__matmul calls
 * give, for every weight type (the repacked x8 ones too), mixed types in
 * one group (both activation layouts at once), batches 1..9 (below and at
 * the size where the team quantises, which folds into the products' run)
 * and teams of 1-4 threads; it writes nothing past each matrix's batch
 * rows, and needs no more scratch than llmem__matmul_group_scratch_bytes
 * (the buffer is exactly that size, for ASan). */

#define GROUP_TYPES_MAX 6

/* d rows of n of wtype t (F32/F16/BF16, a block type or a repacked one),
 * malloc'd. */
static void *group_weights(uint32_t t, size_t n, size_t d)
{
    if (t == F32 || t == F16 || t == BF16) {
        wmat m;
        wmat_make(&m, t, n, d);
        free(m.val);
        return m.data;
    }
    uint32_t base = llmem__x8_base_type(t);
    size_t rb;
    uint8_t *w = qmat_make(base, n, d, &rb);
    if (base == t) return w;
    const x8_kind *xk = x8_kind_of(t);
    uint8_t *w8 = malloc(xk->bytes(n, d) + 1);
    assert_non_null(w8);
    xk->pack(w8, w, n, d);
    free(w);
    return w8;
}

static void group_case(const uint32_t *types, size_t count, size_t n, const size_t *ds)
{
    const size_t maxb = 9;
    void *w[GROUP_TYPES_MAX];
    float *yref[GROUP_TYPES_MAX], *y[GROUP_TYPES_MAX];
    llmem__mm mm[GROUP_TYPES_MAX];
    assert_true(count <= GROUP_TYPES_MAX);
    float *x = malloc(maxb * n * sizeof(float));
    assert_non_null(x);
    for (size_t i = 0; i < maxb * n; i++) x[i] = rng_f() * (i % 97 == 0 ? 30.0f : 1.0f);
    size_t sep = 0; /* the largest scratch of one separate matmul */
    for (size_t i = 0; i < count; i++) {
        w[i] = group_weights(types[i], n, ds[i]);
        yref[i] = malloc(maxb * ds[i] * sizeof(float) + 1);
        y[i] = malloc(maxb * ds[i] * sizeof(float) + 1);
        assert_true(yref[i] && y[i]);
        size_t b = llmem__matmul_scratch_bytes(types[i], n, maxb);
        if (b > sep) sep = b;
    }
    size_t gbytes = llmem__matmul_group_scratch_bytes(types, count, n, maxb);
    assert_true(gbytes >= sep);
    assert_int_equal(gbytes % 64, 0);
    void *sep_scratch = sep ? aligned_alloc(64, sep) : NULL;
    char what[160];
    int len = snprintf(what, sizeof what, "group n=%zu (%s):", n, llmem__kernels_isa());
    for (size_t i = 0; i < count && len > 0 && (size_t)len < sizeof what; i++)
        len += snprintf(what + len, sizeof what - (size_t)len, " %s x %zu", types[i] >= LLMEM__WTYPE_Q4K_X8
                        ? x8_kind_of(types[i])->name : type_name(types[i]), ds[i]);
    for (size_t batch = 1; batch <= maxb; batch++) {
        /* The separate calls: one thread (any team gives these bits: check_batches). */
        for (size_t i = 0; i < count; i++)
            llmem__matmul(NULL, yref[i], x, w[i], types[i], n, ds[i], batch, sep_scratch);
        /* Exactly the bytes this batch needs, so ASan sees any overrun. */
        size_t bytes = llmem__matmul_group_scratch_bytes(types, count, n, batch);
        void *scratch = bytes ? aligned_alloc(64, bytes) : NULL;
        assert_true(bytes == 0 || scratch);
        for (unsigned k = 0; k <= 4; k++) {
            for (size_t i = 0; i < count; i++) {
                memset(y[i], 0xff, maxb * ds[i] * sizeof(float));
                mm[i] = (llmem__mm){y[i], w[i], types[i], ds[i]};
            }
            if (scratch) memset(scratch, 0x5a, bytes); /* no rows left from the last call */
            llmem__matmul_group(k ? teams[k] : NULL, mm, count, x, n, batch, scratch);
            for (size_t i = 0; i < count; i++) {
                size_t d = ds[i];
                if (memcmp(y[i], yref[i], batch * d * sizeof(float)) != 0) {
                    size_t e = 0;
                    while (memcmp(&y[i][e], &yref[i][e], sizeof(float)) == 0) e++;
                    fail_msg("%s batch=%zu threads=%u: matrix %zu y[%zu][%zu] = %.9g, the separate matmul gave %.9g",
                             what, batch, k, i, e / d, e % d, y[i][e], yref[i][e]);
                }
                for (size_t e = batch * d; e < maxb * d; e++) {
                    uint32_t u;
                    memcpy(&u, &y[i][e], 4);
                    if (u != 0xffffffffu) fail_msg("%s batch=%zu: matrix %zu written past its batch at %zu", what, batch, i, e);
                }
            }
        }
        free(scratch);
    }
    for (size_t i = 0; i < count; i++) {
        free(w[i]);
        free(yref[i]);
        free(y[i]);
    }
    free(sep_scratch);
    free(x);
}

static void group_all(void)
{
    /* Rows not multiples of MM_GRAIN, so the team's cuts fall inside
     * matrices and at their bounds: 40 + 17 + 72 rows of 256 is enough
     * work (MM_SERIAL_MACS) for the team from batch 2. */
    static const size_t ds[] = {40, 17, 72, 9, 24, 33, 48}; /* GROUP_TYPES_MAX + 1: the cases start at ds + 1 too */
    static const uint32_t all[] = {F32, F16, BF16, LLMEM_DTYPE_Q4_0, LLMEM_DTYPE_Q4_1, LLMEM_DTYPE_Q5_0,
                                   LLMEM_DTYPE_Q5_1, LLMEM_DTYPE_Q8_0, LLMEM_DTYPE_Q2_K, LLMEM_DTYPE_Q3_K,
                                   LLMEM_DTYPE_Q4_K, LLMEM_DTYPE_Q5_K, LLMEM_DTYPE_Q6_K, LLMEM__WTYPE_Q4K_X8,
                                   LLMEM__WTYPE_Q5_0_X8, LLMEM__WTYPE_Q8_0_X8, LLMEM__WTYPE_Q4_0_X8};
    /* Each type alone: three matrices of it (QKV), and two (gate/up). */
    for (size_t t = 0; t < sizeof all / sizeof all[0]; t++) {
        uint32_t base = llmem__x8_base_type(all[t]);
        bool k = base >= LLMEM_DTYPE_Q2_K && base <= LLMEM_DTYPE_Q6_K;
        size_t n = k ? 256 : base == F32 || base == F16 || base == BF16 ? 257 : 288;
        uint32_t ts[3] = {all[t], all[t], all[t]};
        group_case(ts, 3, n, ds);
        group_case(ts, 2, n, ds + 3);
        group_case(ts, 1, n, ds + 2);
    }
    /* Mixed: both activation layouts, x8 beside in-place rows, float
     * beside block types, a q6_K among q4_K (a Q4_K_M's V); then more
     * matrices than one run takes (LLMEM__MM_GROUP_MAX). */
    static const uint32_t mix[][GROUP_TYPES_MAX] = {
        {LLMEM_DTYPE_Q4_K, LLMEM_DTYPE_Q4_K, LLMEM_DTYPE_Q6_K},
        {LLMEM__WTYPE_Q4K_X8, LLMEM_DTYPE_Q8_0, LLMEM_DTYPE_Q6_K},
        {LLMEM__WTYPE_Q5_0_X8, LLMEM__WTYPE_Q4_0_X8, F16, LLMEM_DTYPE_Q3_K},
        {F32, LLMEM_DTYPE_Q2_K, LLMEM_DTYPE_Q5_1, LLMEM__WTYPE_Q4K_X8},
        {LLMEM__WTYPE_Q8_0_X8, LLMEM__WTYPE_Q8_0_X8, LLMEM_DTYPE_Q8_0, LLMEM_DTYPE_Q6_K},
        {LLMEM_DTYPE_Q4_0, F32, LLMEM_DTYPE_Q4_K, BF16, LLMEM_DTYPE_Q6_K, LLMEM__WTYPE_Q5_0_X8},
    };
    static const size_t mix_count[] = {3, 3, 4, 4, 4, 6};
    for (size_t i = 0; i < sizeof mix_count / sizeof mix_count[0]; i++) {
        group_case(mix[i], mix_count[i], 256, ds);
        group_case(mix[i], mix_count[i], 512, ds + 1);
    }
    /* A matrix with no rows is skipped; a group with nothing to do writes nothing. */
    static const size_t ds0[] = {0, 40, 0};
    group_case(mix[1], 3, 256, ds0);
    group_case(mix[1], 1, 256, ds0);
}

static void test_matmul_group(void **state)
{
    (void)state;
    group_all();
}

static void test_matmul_group_portable(void **state)
{
    (void)state;
    llmem__kernels_force_portable(true);
    group_all();
    llmem__kernels_force_portable(false);
}

/* ---- f16 ------------------------------------------------------------------ */

static void test_f16_all_halves(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = llmem__f16_to_f32((uint16_t)h);
        double want = ref_f16((uint16_t)h);
        uint16_t back = llmem__f32_to_f16(f);
        if (isnan(want)) {
            if (!isnan(f)) fail_msg("half 0x%04x is NaN, decoded %g", h, f);
            if ((back & 0x7c00) != 0x7c00 || (back & 0x3ff) == 0) fail_msg("NaN 0x%04x came back as 0x%04x", h, back);
            if ((back ^ h) & 0x8000) fail_msg("NaN 0x%04x lost its sign: 0x%04x", h, back);
            continue;
        }
        if ((double)f != want) fail_msg("half 0x%04x: %.10g, want %.10g", h, f, want);
        if ((signbit(f) != 0) != ((h & 0x8000) != 0)) fail_msg("half 0x%04x: sign lost", h);
        if (back != h) fail_msg("half 0x%04x round trip gave 0x%04x", h, back);
    }
}

static void test_f16_rounding(void **state)
{
    (void)state;
    static const struct {
        float f;
        uint16_t h;
    } cases[] = {
        {0.0f, 0x0000},
        {-0.0f, 0x8000},
        {1.0f, 0x3c00},
        {-2.0f, 0xc000},
        {65504.0f, 0x7bff},
        {65519.99f, 0x7bff},
        {65520.0f, 0x7c00},      /* the tie above the largest half goes to even: inf */
        {1e10f, 0x7c00},
        {-1e10f, 0xfc00},
        {INFINITY, 0x7c00},
        {-INFINITY, 0xfc00},
        {0x1p-24f, 0x0001},      /* smallest subnormal */
        {0x1p-25f, 0x0000},      /* tie between 0 and 2^-24: even, 0 */
        {0x1.000002p-25f, 0x0001},
        {0x3p-25f, 0x0002},      /* tie between 1 and 2 units: even, 2 */
        {0x5p-25f, 0x0002},      /* tie between 2 and 3 units: even, 2 */
        {0x1p-14f, 0x0400},      /* smallest normal */
        {0x1p-14f - 0x1p-25f, 0x0400}, /* tie between 0x3ff and 0x400: even, 0x400 */
        {0x1p-14f - 0x3p-25f, 0x03fe}, /* tie between 0x3fe and 0x3ff: even, 0x3fe */
        {1.0f + 0x1p-11f, 0x3c00},      /* tie: even, down */
        {1.0f + 0x3p-11f, 0x3c02},      /* tie: even, up */
        {1.0f + 0x1p-11f + 0x1p-20f, 0x3c01},
        {0.1f, 0x2e66},
        {1e-8f, 0x0000},
        {0x1p-40f, 0x0000},
        {-0x1p-30f, 0x8000},
        {3.14159265f, 0x4248},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t h = llmem__f32_to_f16(cases[i].f);
        if (h != cases[i].h) fail_msg("f32_to_f16(%a) = 0x%04x, want 0x%04x", (double)cases[i].f, h, cases[i].h);
    }
    uint16_t nan = llmem__f32_to_f16(NAN);
    assert_true((nan & 0x7c00) == 0x7c00 && (nan & 0x3ff) != 0);
    /* A NaN whose payload lies only in the low bits must stay NaN. */
    uint32_t u = 0x7f800001u;
    float snan;
    memcpy(&snan, &u, 4);
    nan = llmem__f32_to_f16(snan);
    assert_true((nan & 0x7c00) == 0x7c00 && (nan & 0x3ff) != 0);

    /* Random floats: the result is a nearest half, ties to even. */
    for (int i = 0; i < 300000; i++) {
        uint32_t bits = (uint32_t)test_rng_next(&rng_state);
        /* Mostly in the half range: exponents 2^-30 .. 2^17. */
        bits = (bits & 0x807fffffu) | ((uint32_t)(97 + test_rng_next(&rng_state) % 48) << 23);
        float f;
        memcpy(&f, &bits, 4);
        uint16_t h = llmem__f32_to_f16(f);
        double got = ref_f16(h), err = fabs(got - (double)f);
        if (isinf(got)) {
            if (fabs(f) < 65520.0f) fail_msg("%a rounded to inf", (double)f);
            continue;
        }
        /* Neighbours in magnitude (same sign). */
        uint16_t mag = h & 0x7fff, sign = h & 0x8000;
        if (mag < 0x7bff) {
            double up = ref_f16((uint16_t)(sign | (mag + 1)));
            if (fabs(up - (double)f) < err || (fabs(up - (double)f) == err && (mag & 1)))
                fail_msg("%a -> 0x%04x, but 0x%04x is nearer or even", (double)f, h, sign | (mag + 1));
        }
        if (mag > 0) {
            double dn = ref_f16((uint16_t)(sign | (mag - 1)));
            if (fabs(dn - (double)f) < err || (fabs(dn - (double)f) == err && (mag & 1)))
                fail_msg("%a -> 0x%04x, but 0x%04x is nearer or even", (double)f, h, sign | (mag - 1));
        }
    }
}

/* ---- dequant ----------------------------------------------------------- */

static void test_dequant_q8_0(void **state)
{
    (void)state;
    /* Two rows of 64: row 1 has scales 0.5 and -2^-14 (a subnormal-free
     * small half), q = -128..127 patterns. */
    uint8_t w[2 * 2 * 34];
    memset(w, 0, sizeof w);
    const uint16_t scales[4] = {0x3c00 /* 1 */, 0x4500 /* 5 */, 0x3800 /* 0.5 */, 0x8400 /* -2^-14 */};
    for (int b = 0; b < 4; b++) {
        memcpy(w + b * 34, &scales[b], 2);
        for (int i = 0; i < 32; i++) w[b * 34 + 2 + i] = (uint8_t)(int8_t)(b % 2 ? 127 - 8 * i : -128 + i * 7);
    }
    float out[64];
    for (size_t row = 0; row < 2; row++) {
        llmem__dequant_row(Q8_0, w, row, 64, out);
        for (int c = 0; c < 64; c++) {
            int b = (int)row * 2 + c / 32, i = c % 32;
            int q = b % 2 ? 127 - 8 * i : -128 + i * 7;
            q = (int8_t)(uint8_t)q;
            double d = b == 0 ? 1.0 : b == 1 ? 5.0 : b == 2 ? 0.5 : -0x1p-14;
            if ((double)out[c] != d * q) fail_msg("q8_0 row %zu [%d] = %g, want %g", row, c, out[c], d * q);
        }
    }
}

static void test_dequant_other(void **state)
{
    (void)state;
    for (size_t t = 0; t < 3; t++) {
        wmat m;
        wmat_make(&m, wtypes[t], 37, 3);
        float out[37];
        for (size_t r = 0; r < 3; r++) {
            llmem__dequant_row(m.type, m.data, r, 37, out);
            for (size_t c = 0; c < 37; c++) assert_true((double)out[c] == m.val[r * 37 + c]);
        }
        wmat_free(&m);
    }
    /* bf16 specials. */
    uint16_t b[4] = {0x3f80, 0xbf80, 0x7f80, 0x7fc0};
    float o[4];
    llmem__dequant_row(BF16, b, 0, 4, o);
    assert_true(o[0] == 1.0f && o[1] == -1.0f && isinf(o[2]) && isnan(o[3]));
}

/* ---- the small kernels ------------------------------------------------------ */

static void test_rmsnorm(void **state)
{
    (void)state;
    for (size_t i = 0; i < NSIZES; i++) {
        size_t n = sizes[i];
        float *x = malloc(n * sizeof(float)), *w = malloc(n * sizeof(float)), *o = malloc(n * sizeof(float));
        assert_true(x && w && o);
        for (size_t j = 0; j < n; j++) {
            x[j] = rng_f() * 3.0f;
            w[j] = rng_f();
        }
        double ss = 0;
        for (size_t j = 0; j < n; j++) ss += (double)x[j] * x[j];
        double inv = 1.0 / sqrt(ss / (double)n + 1e-5);
        llmem__rmsnorm(o, x, w, n, 1e-5f);
        for (size_t j = 0; j < n; j++) {
            double ref = w[j] * (x[j] * inv);
            check_close(o[j], ref, fabs(ref), 1e-5, "rmsnorm", j);
        }
        /* In place gives the same bits. */
        llmem__rmsnorm(x, x, w, n, 1e-5f);
        assert_memory_equal(x, o, n * sizeof(float));
        free(x);
        free(w);
        free(o);
    }
    /* All zeros: eps keeps it finite. */
    float z[5] = {0}, w1[5] = {1, 1, 1, 1, 1}, o[5];
    llmem__rmsnorm(o, z, w1, 5, 1e-6f);
    for (int j = 0; j < 5; j++) assert_true(o[j] == 0.0f);
}

static void softmax_check(float *x, size_t n)
{
    double *ref = malloc(n * sizeof(double));
    assert_non_null(ref);
    double mx = -INFINITY, sum = 0;
    for (size_t i = 0; i < n; i++)
        if (x[i] > mx) mx = x[i];
    for (size_t i = 0; i < n; i++) sum += ref[i] = exp((double)x[i] - mx);
    llmem__softmax(x, n);
    double got_sum = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i]) || x[i] < 0) fail_msg("softmax [%zu] = %g", i, x[i]);
        check_close(x[i], ref[i] / sum, ref[i] / sum, 2e-6, "softmax", i);
        got_sum += x[i];
    }
    check_close(got_sum, 1.0, 1.0, 1e-5, "softmax sum", n);
    free(ref);
}

/* The k-quant activation rows, bitwise on both paths, on the blocks that
 * test the vector form's choices: the largest magnitude twice with both
 * signs (the first one sets the scale's sign), ties of the rounding
 * (x * scale exactly k + 0.5), a lone nonzero, values that round to 128
 * before the clamp, an infinity (the reference's block). */
static void test_act_quantize_k_paths(void **state)
{
    (void)state;
    if (strncmp(llmem__kernels_isa(), "avx2", 4) != 0) skip();
    const size_t n = 256 * 6;
    float *x = malloc(n * sizeof(float));
    size_t ab = llmem__act_row_bytes(LLMEM_DTYPE_Q6_K, n);
    uint8_t *a = aligned_alloc(64, ab), *b = aligned_alloc(64, ab);
    assert_true(x && a && b);
    for (size_t i = 0; i < n; i++) x[i] = rng_f();
    x[10] = 3.0f, x[200] = -3.0f;                                 /* block 0: +3 first */
    x[256 + 7] = -5.0f, x[256 + 100] = 5.0f;                      /* block 1: -5 first */
    for (size_t i = 512; i < 768; i++) x[i] = (float)((int)(i % 255) - 127) + 0.5f; /* ties */
    x[512] = -127.0f;
    memset(x + 768, 0, 256 * sizeof(float));
    x[768 + 31] = 1e-30f;                                         /* a lone subnormal-scale value */
    for (size_t i = 1024; i < 1280; i++) x[i] = i % 2 ? 1.0f : -1.0000001f;
    x[1280 + 9] = INFINITY;
    for (uint32_t t = LLMEM_DTYPE_Q2_K; t <= LLMEM_DTYPE_Q6_K; t++) {
        memset(a, 0, ab);
        memset(b, 0, ab);
        llmem__act_quantize_ref(t, x, n, a);
        llmem__act_quantize_avx2(t, x, n, b);
        if (memcmp(a, b, ab) != 0) fail_msg("%s: k-quant activation rows differ between the paths", type_name(t));
    }
    free(x);
    free(a);
    free(b);
}

static void test_softmax(void **state)
{
    (void)state;
    for (size_t i = 0; i < NSIZES; i++) {
        size_t n = sizes[i];
        float *x = malloc(n * sizeof(float));
        assert_non_null(x);
        for (size_t j = 0; j < n; j++) x[j] = rng_f() * 10.0f;
        softmax_check(x, n);
        /* Large values: max subtraction keeps expf from overflowing. */
        for (size_t j = 0; j < n; j++) x[j] = 1000.0f + rng_f() * 20.0f;
        softmax_check(x, n);
        for (size_t j = 0; j < n; j++) x[j] = -1e30f + (float)j * 1e24f;
        softmax_check(x, n);
        free(x);
    }
    /* A vocabulary-sized one. */
    size_t nv = 32000;
    float *v = malloc(nv * sizeof(float));
    assert_non_null(v);
    for (size_t j = 0; j < nv; j++) v[j] = rng_f() * 5.0f;
    softmax_check(v, nv);
    free(v);

    /* -inf entries (masked positions) get 0, the rest share the mass. */
    float m[6] = {1.0f, -INFINITY, 2.0f, -INFINITY, 3.0f, -INFINITY};
    llmem__softmax(m, 6);
    assert_true(m[1] == 0.0f && m[3] == 0.0f && m[5] == 0.0f);
    check_close(m[0] + m[2] + m[4], 1.0, 1.0, 1e-6, "masked softmax sum", 0);
    check_close(m[4], exp(0.0) / (exp(-2.0) + exp(-1.0) + 1.0), 1.0, 1e-6, "masked softmax", 4);
    /* All -inf: uniform rather than NaN. */
    float a[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    llmem__softmax(a, 4);
    for (int j = 0; j < 4; j++) assert_true(a[j] == 0.25f);
    /* +inf takes everything. */
    float p[3] = {1.0f, INFINITY, 5.0f};
    llmem__softmax(p, 3);
    assert_true(p[0] == 0.0f && p[1] == 1.0f && p[2] == 0.0f);
    /* One element, and FLT_MAX-sized values. */
    float one = 123.0f;
    llmem__softmax(&one, 1);
    assert_true(one == 1.0f);
    float big[2] = {3e38f, 3e38f};
    llmem__softmax(big, 2);
    assert_true(big[0] == 0.5f && big[1] == 0.5f);
    llmem__softmax(NULL, 0);
}

static void test_rope(void **state)
{
    (void)state;
    static const struct {
        size_t heads, head_dim, rope_dim, pos;
        float theta;
    } cases[] = {
        {1, 2, 2, 0, 10000.0f},     {1, 64, 64, 1, 10000.0f}, {4, 48, 48, 7, 10000.0f},
        {6, 128, 64, 300, 500000.0f}, {2, 32, 32, 4095, 10000.0f}, {3, 10, 6, 12, 10000.0f},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        size_t H = cases[ci].heads, hd = cases[ci].head_dim, rd = cases[ci].rope_dim, pos = cases[ci].pos;
        float theta = cases[ci].theta;
        size_t len = H * hd;
        float *v = malloc(len * sizeof(float)), *in = malloc(len * sizeof(float)), *exact = malloc(len * sizeof(float));
        assert_true(v && in && exact);
        for (size_t i = 0; i < len; i++) in[i] = v[i] = exact[i] = rng_f();
        llmem__rope(v, H, hd, rd, pos, theta);
        /* run.c's loop, per head, in float: the same bits. */
        for (size_t h = 0; h < H; h++)
            for (size_t i = 0; i < rd; i += 2) {
                float freq = 1.0f / powf(theta, (float)i / (float)rd);
                float val = (float)pos * freq;
                float fcr = cosf(val), fci = sinf(val);
                float *q = exact + h * hd + i;
                float v0 = q[0], v1 = q[1];
                q[0] = v0 * fcr - v1 * fci;
                q[1] = v0 * fci + v1 * fcr;
            }
        if (memcmp(v, exact, len * sizeof(float)) != 0) fail_msg("rope case %zu differs from run.c's loop", ci);
        /* The formula in double: close while the angle is small enough for
         * float's pos * freq to be accurate. */
        for (size_t h = 0; h < H; h++)
            for (size_t i = 0; i < hd; i++) {
                size_t at = h * hd + i;
                if (i >= rd) {
                    if (v[at] != in[at]) fail_msg("rope touched dim %zu beyond rope_dim %zu", i, rd);
                    continue;
                }
                size_t p0 = at - (i % 2);
                double ang = (double)pos * pow(theta, -(double)(i - i % 2) / (double)rd);
                double c = cos(ang), s = sin(ang);
                double ref = i % 2 ? in[p0] * s + in[p0 + 1] * c : in[p0] * c - in[p0 + 1] * s;
                double tol = 1e-5 + 6e-7 * (double)pos; /* float pos * freq: a few ulp of the angle */
                if (fabs(v[at] - ref) > tol) fail_msg("rope case %zu [%zu]: %.9g, want %.9g", ci, at, v[at], ref);
            }
        free(v);
        free(in);
        free(exact);
    }
}

/* The engine's step computes each row's rope angles once for every layer
 * (llmem__rope_angles) and rotates with them (llmem__rope_apply): the same
 * bits as llmem__rope and llmem__rope_neox, in both styles, odd rope_dim
 * and rope_dim above head_dim (clamped) included. */
static void test_rope_angles_reused(void **state)
{
    (void)state;
    static const struct {
        size_t heads, head_dim, rope_dim, pos;
        float theta;
    } cases[] = {
        {1, 2, 2, 0, 10000.0f},      {1, 64, 64, 1, 10000.0f},    {4, 48, 48, 7, 10000.0f},
        {6, 128, 64, 300, 500000.0f}, {2, 32, 32, 4095, 1e6f},    {3, 10, 6, 12, 10000.0f},
        {2, 10, 7, 33, 10000.0f},     {2, 8, 12, 5, 10000.0f},
    };
    for (int style = LLMEM_ROPE_NORM; style <= LLMEM_ROPE_NEOX; style++)
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            size_t H = cases[ci].heads, hd = cases[ci].head_dim, rd = cases[ci].rope_dim, pos = cases[ci].pos;
            float theta = cases[ci].theta, cs[2 * 64];
            size_t len = H * hd;
            assert_true(llmem__rope_pairs(hd, rd) == (rd > hd ? hd : rd) / 2);
            float *v = malloc(len * sizeof(float)), *want = malloc(len * sizeof(float));
            assert_true(v && want);
            for (size_t i = 0; i < len; i++) v[i] = want[i] = rng_f();
            if (style == LLMEM_ROPE_NEOX) llmem__rope_neox(want, H, hd, rd, pos, theta);
            else llmem__rope(want, H, hd, rd, pos, theta);
            llmem__rope_angles(cs, (llmem_rope_style)style, hd, rd, pos, theta);
            llmem__rope_apply(v, (llmem_rope_style)style, H, hd, rd, cs);
            if (memcmp(v, want, len * sizeof(float)) != 0)
                fail_msg("rope style %d case %zu: the reused angles differ from the direct rotation", style, ci);
            free(v);
            free(want);
        }
}

static void test_swiglu_dot_axpy(void **state)
{
    (void)state;
    for (size_t si = 0; si < NSIZES; si++) {
        size_t n = sizes[si];
        float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float)), *a0 = malloc(n * sizeof(float));
        assert_true(a && b && a0);
        for (size_t i = 0; i < n; i++) {
            a0[i] = a[i] = rng_f() * 8.0f;
            b[i] = rng_f();
        }
        llmem__swiglu(a, b, n);
        for (size_t i = 0; i < n; i++) {
            double ref = a0[i] / (1.0 + exp(-(double)a0[i])) * b[i];
            check_close(a[i], ref, fabs(ref) + 1e-30, 1e-5, "swiglu", i);
        }
        for (int path = 0; path < 2; path++) {
            llmem__kernels_force_portable(path == 1);
            double ref = 0, scale = 0;
            for (size_t i = 0; i < n; i++) {
                ref += (double)a0[i] * b[i];
                scale += fabs((double)a0[i] * b[i]);
            }
            check_close(llmem__dot(a0, b, n), ref, scale, 1e-5, "dot", n);
            memcpy(a, a0, n * sizeof(float));
            llmem__axpy(a, 0.37f, b, n);
            for (size_t i = 0; i < n; i++) {
                double r = a0[i] + 0.37 * b[i];
                check_close(a[i], r, fabs(a0[i]) + fabs(0.37 * b[i]), 1e-6, "axpy", i);
            }
        }
        llmem__kernels_force_portable(false);
        free(a);
        free(b);
        free(a0);
    }
    /* swiglu at the extremes: silu(-100) is -0, silu(100) is 100. */
    float e[2] = {-100.0f, 100.0f}, one[2] = {1.0f, 1.0f};
    llmem__swiglu(e, one, 2);
    assert_true(e[0] == 0.0f && e[1] == 100.0f);
    assert_true(llmem__dot(e, one, 0) == 0.0f);
}

/* Attention's run kernels: dot_rows and axpy_rows are the row-by-row
 * llmem__dot and llmem__axpy (kernels.h), bit for bit, and their f16 forms
 * are them on the rows converted to float; on every path, over head sizes
 * with and without a tail of 8 and runs with and without one of 4. */
static void test_attention_rows(void **state)
{
    (void)state;
    static const size_t ns[] = {1, 7, 8, 15, 64, 72, 100, 128, 130};
    static const size_t rowss[] = {1, 3, 4, 5, 9};
    for (int path = 0; path < 2; path++) {
        llmem__kernels_force_portable(path == 1);
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
            for (size_t ri = 0; ri < sizeof rowss / sizeof rowss[0]; ri++) {
                size_t n = ns[ni], rows = rowss[ri], stride = n + 3;
                float *q = malloc(n * sizeof(float)), *k = malloc(rows * stride * sizeof(float));
                uint16_t *k16 = malloc(rows * stride * sizeof(uint16_t));
                float out[9], out16[9], alpha[9], scale = 0.125f;
                float *y = malloc(n * sizeof(float)), *y16 = malloc(n * sizeof(float)), *yref = malloc(n * sizeof(float));
                assert_true(q && k && k16 && y && y16 && yref);
                for (size_t i = 0; i < n; i++) q[i] = rng_f() * 4.0f;
                for (size_t i = 0; i < rows * stride; i++) { /* values an f16 cache holds exactly */
                    k16[i] = llmem__f32_to_f16(rng_f() * 3.0f);
                    k[i] = llmem__f16_to_f32(k16[i]);
                }
                for (size_t j = 0; j < rows; j++) alpha[j] = rng_f();
                llmem__dot_rows(out, q, k, stride, rows, n, scale);
                llmem__dot_rows_f16(out16, q, k16, stride, rows, n, scale);
                for (size_t j = 0; j < rows; j++) {
                    float want = llmem__dot(q, k + j * stride, n) * scale;
                    if (memcmp(&out[j], &want, sizeof want))
                        fail_msg("path %d n %zu rows %zu: dot_rows row %zu %a, dot %a", path, n, rows, j,
                                 (double)out[j], (double)want);
                    if (memcmp(&out16[j], &want, sizeof want))
                        fail_msg("path %d n %zu rows %zu: dot_rows_f16 row %zu %a, dot %a", path, n, rows, j,
                                 (double)out16[j], (double)want);
                }
                for (size_t i = 0; i < n; i++) y[i] = y16[i] = yref[i] = rng_f();
                llmem__axpy_rows(y, alpha, k, stride, rows, n);
                llmem__axpy_rows_f16(y16, alpha, k16, stride, rows, n);
                for (size_t j = 0; j < rows; j++) llmem__axpy(yref, alpha[j], k + j * stride, n);
                if (memcmp(y, yref, n * sizeof(float)))
                    fail_msg("path %d n %zu rows %zu: axpy_rows differs from axpy row by row", path, n, rows);
                if (memcmp(y16, yref, n * sizeof(float)))
                    fail_msg("path %d n %zu rows %zu: axpy_rows_f16 differs from axpy row by row", path, n, rows);
                free(q);
                free(k);
                free(k16);
                free(y);
                free(y16);
                free(yref);
            }
        /* The f16 store: llmem__f32_to_f16's bits for any float, NaNs,
         * infinities, subnormals and overflow included, with and without a
         * tail of 8. */
        enum { N = 4099 };
        float *f = malloc(N * sizeof(float));
        uint16_t *h = malloc(N * sizeof(uint16_t));
        assert_true(f && h);
        for (int round = 0; round < 64; round++) {
            for (size_t i = 0; i < N; i++) {
                uint32_t bits = (uint32_t)test_rng_next(&rng_state);
                if (round % 2) /* half the rounds near the half range */
                    bits = (bits & 0x807fffffu) | ((uint32_t)(97 + test_rng_next(&rng_state) % 48) << 23);
                memcpy(&f[i], &bits, sizeof bits);
            }
            size_t n = N - (size_t)round % 9;
            llmem__f16_from_f32_row(h, f, n);
            for (size_t i = 0; i < n; i++)
                if (h[i] != llmem__f32_to_f16(f[i]))
                    fail_msg("path %d: f16_from_f32_row(%a) = 0x%04x, want 0x%04x", path, (double)f[i], h[i],
                             llmem__f32_to_f16(f[i]));
        }
        free(f);
        free(h);
    }
    llmem__kernels_force_portable(false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_matmul_wide_batches),
        cmocka_unit_test(test_matmul_portable),
        cmocka_unit_test(test_paths_agree),
        cmocka_unit_test(test_matmul_supports),
        cmocka_unit_test(test_qmatmul),
        cmocka_unit_test(test_qmatmul_portable),
        cmocka_unit_test(test_q4k_x8),
        cmocka_unit_test(test_q4k_x8_portable),
        cmocka_unit_test(test_matmul_group),
        cmocka_unit_test(test_matmul_group_portable),
        cmocka_unit_test(test_f16_all_halves),
        cmocka_unit_test(test_f16_rounding),
        cmocka_unit_test(test_dequant_q8_0),
        cmocka_unit_test(test_dequant_other),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_act_quantize_k_paths),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_rope_angles_reused),
        cmocka_unit_test(test_swiglu_dot_axpy),
        cmocka_unit_test(test_attention_rows),
    };
    return cmocka_run_group_tests(tests, setup_teams, teardown_teams);
}
