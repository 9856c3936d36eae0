/*
 * test_quant.c - the block formats (llmem/quant.h) and the model quantiser.
 *
 *  - every type: quantise-dequantise round trips of values of every
 *    magnitude stay within the type's error bound (relative RMS per row),
 *    zero rows stay zero, a constant row comes back within its step;
 *  - the sizes (llmem_dtype_bytes, block sizes) are the format's;
 *  - bad calls: unknown type, partial block, NULL, non-finite input;
 *  - llmem_dtype_parse and llama.cpp's fallback rule for rows that are not
 *    whole blocks;
 *  - llmem_model_quantize on a model written here: every matrix converted
 *    (or fallen back), 1-D tensors and metadata copied, general.file_type
 *    set, the output opens and runs; a llama2.c input and a missing file
 *    are refused and leave no output.
 * (Decoding against llama.cpp's own: test_oracle.)
 */
#include <math.h>

#include "test_util.h"
#include "support/rng.h"

static const struct {
    uint32_t type;
    uint32_t block, bytes;
    double max_rel_rms;  /* round-trip error bound on uniform values */
} types[] = {
    {LLMEM_DTYPE_Q4_0, 32, 18, 0.09},  {LLMEM_DTYPE_Q4_1, 32, 20, 0.08},  {LLMEM_DTYPE_Q5_0, 32, 22, 0.045},
    {LLMEM_DTYPE_Q5_1, 32, 24, 0.04},  {LLMEM_DTYPE_Q8_0, 32, 34, 0.006}, {LLMEM_DTYPE_Q2_K, 256, 84, 0.30},
    {LLMEM_DTYPE_Q3_K, 256, 110, 0.16}, {LLMEM_DTYPE_Q4_K, 256, 144, 0.08}, {LLMEM_DTYPE_Q5_K, 256, 176, 0.04},
    {LLMEM_DTYPE_Q6_K, 256, 210, 0.02}, {LLMEM_DTYPE_F16, 1, 2, 0.001},   {LLMEM_DTYPE_BF16, 1, 2, 0.005},
};
#define NT (sizeof types / sizeof types[0])

/* The tests' one generator (support/rng.h), one stream for the whole run. */
static uint64_t rs = 88172645463325252ull;
static double runif(void) { return test_rng_unit(&rs); }

static void test_sizes(void **state)
{
    (void)state;
    for (size_t i = 0; i < NT; i++) {
        assert_int_equal(llmem_dtype_block_size(types[i].type), types[i].block);
        assert_int_equal(llmem_dtype_bytes(types[i].type, types[i].block), types[i].bytes);
        assert_int_equal(llmem_dtype_bytes(types[i].type, 4096), 4096 / types[i].block * types[i].bytes);
        if (types[i].block > 1) assert_int_equal(llmem_dtype_bytes(types[i].type, types[i].block + 1), 0);
        assert_true(llmem_dtype_is_quantizable(types[i].type));
    }
    assert_false(llmem_dtype_is_quantizable(9));  /* q8_1: ggml's activation type */
    assert_false(llmem_dtype_is_quantizable(15)); /* q8_k, the same */
    assert_int_equal(llmem_dtype_block_size(99), 0);
}

static void test_round_trip(void **state)
{
    (void)state;
    enum { N = 4096 };
    static float x[N], y[N];
    static uint8_t q[N * 4];
    for (size_t i = 0; i < NT; i++) {
        uint32_t t = types[i].type;
        /* Magnitudes 2^-8 .. 2^12: below that the f16 scales go subnormal and
         * lose precision, a limit of the formats, not of the encoder. */
        for (int mag = -8; mag <= 12; mag += 4) {
            double scale = ldexp(1.0, mag), err = 0, ss = 0;
            for (int j = 0; j < N; j++) x[j] = (float)(scale * (2 * runif() - 1));
            assert_ok(llmem_quantize_row(t, x, q, N));
            assert_ok(llmem_dequantize_row(t, q, y, N));
            for (int j = 0; j < N; j++) {
                err += ((double)y[j] - x[j]) * ((double)y[j] - x[j]);
                ss += (double)x[j] * x[j];
            }
            double rel = sqrt(err / ss);
            if (!(rel <= types[i].max_rel_rms))
                fail_msg("%s at magnitude 2^%d: relative RMS error %.4f above %.4f", llmem_dtype_name(t), mag, rel,
                         types[i].max_rel_rms);
        }
        /* Zeros stay zeros; a constant comes back within a step of itself. */
        memset(x, 0, sizeof x);
        assert_ok(llmem_quantize_row(t, x, q, N));
        assert_ok(llmem_dequantize_row(t, q, y, N));
        for (int j = 0; j < N; j++) assert_true(y[j] == 0.0f);
        for (int j = 0; j < N; j++) x[j] = 0.75f;
        assert_ok(llmem_quantize_row(t, x, q, N));
        assert_ok(llmem_dequantize_row(t, q, y, N));
        for (int j = 0; j < N; j++)
            if (fabsf(y[j] - 0.75f) > 0.75f * 0.2f) fail_msg("%s constant 0.75 came back as %g", llmem_dtype_name(t), y[j]);
        printf("  %s: round trip within its bound at every magnitude\n", llmem_dtype_name(t));
    }
}

static void test_bad_calls(void **state)
{
    (void)state;
    float x[512] = {0};
    uint8_t q[2048];
    assert_status(llmem_quantize_row(99, x, q, 32), LLMEM_EINVAL);
    assert_status(llmem_quantize_row(LLMEM_DTYPE_Q4_K, x, q, 255), LLMEM_EINVAL);
    assert_status(llmem_quantize_row(LLMEM_DTYPE_Q4_0, NULL, q, 32), LLMEM_EINVAL);
    assert_status(llmem_dequantize_row(LLMEM_DTYPE_Q4_0, q, NULL, 32), LLMEM_EINVAL);
    assert_status(llmem_dequantize_row(LLMEM_DTYPE_Q6_K, q, x, 100), LLMEM_EINVAL);
    x[7] = NAN;
    assert_status(llmem_quantize_row(LLMEM_DTYPE_Q8_0, x, q, 32), LLMEM_ERANGE);
    x[7] = INFINITY;
    assert_status(llmem_quantize_row(LLMEM_DTYPE_Q2_K, x, q, 256), LLMEM_ERANGE);
    assert_ok(llmem_quantize_row(LLMEM_DTYPE_Q4_0, x, q, 0)); /* nothing to do */
}

static void test_parse_and_fallback(void **state)
{
    (void)state;
    uint32_t t;
    assert_ok(llmem_dtype_parse("q4_k", &t));
    assert_int_equal(t, LLMEM_DTYPE_Q4_K);
    assert_ok(llmem_dtype_parse("Q4_K_M", &t));
    assert_int_equal(t, LLMEM_DTYPE_Q4_K);
    assert_ok(llmem_dtype_parse("q5_k_s", &t));
    assert_int_equal(t, LLMEM_DTYPE_Q5_K);
    assert_ok(llmem_dtype_parse("BF16", &t));
    assert_int_equal(t, LLMEM_DTYPE_BF16);
    assert_status(llmem_dtype_parse("q7_0", &t), LLMEM_EINVAL);
    assert_status(llmem_dtype_parse("q4_k_xl", &t), LLMEM_EINVAL);
    assert_status(llmem_dtype_parse("a-very-long-type-name", &t), LLMEM_EINVAL);
    assert_status(llmem_dtype_parse(NULL, &t), LLMEM_EINVAL);
    /* Whole blocks: the type itself. */
    assert_int_equal(llmem_quant_row_type(LLMEM_DTYPE_Q4_K, 512), LLMEM_DTYPE_Q4_K);
    assert_int_equal(llmem_quant_row_type(LLMEM_DTYPE_Q4_0, 64), LLMEM_DTYPE_Q4_0);
    /* k-quants on rows of 288 (tiny-15m): llama.cpp's fallbacks. */
    assert_int_equal(llmem_quant_row_type(LLMEM_DTYPE_Q2_K, 288), LLMEM_DTYPE_Q4_0);
    assert_int_equal(llmem_quant_row_type(LLMEM_DTYPE_Q3_K, 288), LLMEM_DTYPE_Q4_0);
    assert_int_equal(llmem_quant_row_type(LLMEM_DTYPE_Q4_K, 288), LLMEM_DTYPE_Q5_0);
    assert_int_equal(llmem_quant_row_type(LLMEM_DTYPE_Q5_K, 288), LLMEM_DTYPE_Q5_1);
    assert_int_equal(llmem_quant_row_type(LLMEM_DTYPE_Q6_K, 288), LLMEM_DTYPE_Q8_0);
    /* Not even 32 (stories260K's 172): f16. */
    assert_int_equal(llmem_quant_row_type(LLMEM_DTYPE_Q4_K, 172), LLMEM_DTYPE_F16);
    assert_int_equal(llmem_quant_row_type(LLMEM_DTYPE_Q8_0, 172), LLMEM_DTYPE_F16);
    assert_int_equal(llmem_quant_row_type(LLMEM_DTYPE_F32, 7), LLMEM_DTYPE_F32);
}

/* ---- llmem_model_quantize ------------------------------------------------------------ */

static void test_quantize_model(void **state)
{
    (void)state;
    char dir[] = "/tmp/llmem-test-quant-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char in[128], out[128], bin[128];
    snprintf(in, sizeof in, "%s/in.gguf", dir);
    snprintf(out, sizeof out, "%s/out.gguf", dir);
    snprintf(bin, sizeof bin, "%s/in.bin", dir);
    /* hidden 256 (whole super-blocks), ffn 288 (k-quants fall back there). */
    llmem_shape sh = {"quant-test", 2, 256, 4, 2, 64, 288, 512, 128, 10000.0, 0};
    llmem_synth_options so = {5, LLMEM_DTYPE_F16, NULL, false, NULL, NULL, 0};
    assert_ok(llmem_synth_gguf(&sh, &so, in));
    for (uint32_t k = 0; k < 3; k++) {
        uint32_t t = k == 0 ? LLMEM_DTYPE_Q4_K : k == 1 ? LLMEM_DTYPE_Q8_0 : LLMEM_DTYPE_Q6_K;
        llmem_quantize_options qo = {t, k == 2, false};
        llmem_quantize_report r = {sizeof r};
        assert_ok(llmem_model_quantize(in, out, &qo, &r));
        llmem_model *m;
        assert_ok(llmem_model_open(out, NULL, &m));
        size_t nt = llmem_model_tensor_count(m);
        assert_int_equal(r.tensors, nt);
        assert_int_equal(r.quantized + r.fallback + r.kept, nt);
        for (size_t i = 0; i < nt; i++) {
            const llmem_tensor *tt = llmem_model_tensor_at(m, i);
            if (tt->n_dims == 1) {
                assert_int_equal(tt->type, LLMEM_DTYPE_F32); /* norms: copied */
            } else if (k == 2 && !strcmp(tt->name, "output.weight")) {
                assert_int_equal(tt->type, LLMEM_DTYPE_F16); /* --keep-output */
            } else {
                assert_int_equal(tt->type, llmem_quant_row_type(t, tt->dims[0]));
            }
        }
        uint32_t ft, ctx;
        assert_ok(llmem_model_meta_u32(m, "general.file_type", &ft));
        assert_int_equal(ft, k == 0 ? 14 : k == 1 ? 7 : 18);
        assert_ok(llmem_model_meta_u32(m, "llama.context_length", &ctx)); /* metadata copied */
        assert_int_equal(ctx, 128);
        llmem_tokenizer *tok;
        assert_ok(llmem_tokenizer_from_model(m, &tok));
        assert_int_equal(llmem_tokenizer_vocab_size(tok), 512);
        llmem_tokenizer_destroy(tok);
        /* It runs. */
        llmem_engine_options eo = llmem_engine_options_default();
        eo.threads = 1;
        eo.max_seqs = 1;
        llmem_engine *e;
        assert_ok(llmem_engine_create(m, &eo, &e));
        llmem_engine_seq s;
        assert_ok(llmem_engine_seq_create(e, &s));
        int32_t ids[3] = {1, 300, 301};
        llmem_engine_batch_item it = {s, ids, 3};
        assert_ok(llmem_engine_step(e, &it, 1));
        const float *lg = llmem_engine_logits(e, 0);
        for (uint32_t v = 0; v < 512; v++) assert_true(isfinite(lg[v]));
        llmem_engine_destroy(e);
        llmem_model_close(m);
    }
    /* Refused: a llama2.c input, a missing file, a type it cannot write; no output left behind. */
    assert_ok(llmem_synth_llama2c(&(llmem_shape){"q2", 1, 64, 2, 2, 32, 96, 512, 64, 10000.0, 1}, 1, bin));
    unlink(out);
    llmem_quantize_options qo = {LLMEM_DTYPE_Q8_0, false, false};
    assert_status(llmem_model_quantize(bin, out, &qo, NULL), LLMEM_ENOTSUP);
    assert_int_equal(access(out, F_OK), -1);
    assert_true(llmem_model_quantize("/nonexistent/x.gguf", out, &qo, NULL) != LLMEM_OK);
    assert_int_equal(access(out, F_OK), -1);
    qo.type = 15;
    assert_status(llmem_model_quantize(in, out, &qo, NULL), LLMEM_EINVAL);
    assert_status(llmem_model_quantize(in, NULL, &qo, NULL), LLMEM_EINVAL);
    llmem_quantize_report small = {4};
    qo.type = LLMEM_DTYPE_Q8_0;
    assert_status(llmem_model_quantize(in, out, &qo, &small), LLMEM_EINVAL);
    assert_int_equal(access(out, F_OK), -1);
    unlink(in);
    unlink(bin);
    assert_int_equal(rmdir(dir), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_bad_calls),
        cmocka_unit_test(test_parse_and_fallback),
        cmocka_unit_test(test_quantize_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
