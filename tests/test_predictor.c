/*
 * test_predictor.c - the memory predictor: sizes against published and
 * computed figures, activation peaks against what the engine measures on
 * real and synthetic models (within 10%), the corrector learning a
 * relation the formulas get wrong, reserves, bad input.
 */
#include <math.h>

#include "test_util.h"
#include "support/synth_model.h"
#include "support/tmpdir.h"

/* A file in the shared folder's models/ (test_util.h: test_shared_path). */
#define MODEL(rel) test_shared_path("models/" rel)

static llmem_predictor *make(const char *shape, size_t kv_elem, uint32_t max_seq_len)
{
    llmem_predictor_options o = llmem_predictor_options_default();
    assert_ok(llmem_shape_preset(shape, &o.shape));
    o.kv_elem_bytes = kv_elem;
    o.max_seq_len = max_seq_len;
    llmem_predictor *p;
    assert_ok(llmem_predictor_create(&o, &p));
    return p;
}

static void sizes_of_llama_2_7b(void **state)
{
    (void)state;
    llmem_predictor *p = make("llama-2-7b", 2, 4096);
    llmem_prediction r;
    assert_ok(llmem_predictor_predict(p, LLMEM_STAGE_LOAD, 0, 0, 0, &r));
    /* f16 matrices, f32 norms (65 vectors of 4096). */
    assert_int_equal(r.weights_bytes, (6738415616ull - 65 * 4096) * 2 + 65 * 4096 * 4);
    assert_int_equal(r.kv_bytes_per_token, 512 * 1024);
    assert_int_equal(r.activation_bytes, 0);
    /* A prefill of 8 x 1000 tokens: KV for 8 x 1008 tokens (16-token blocks). */
    assert_ok(llmem_predictor_predict(p, LLMEM_STAGE_PREFILL, 8, 1000, 0, &r));
    assert_int_equal(r.kv_bytes, 8ull * 1008 * 512 * 1024);
    assert_int_equal(r.peak_op, LLMEM_OP_FFN);
    /* FFN at the peak: rows x (4096 + 2 x 11008) floats, plus the residual
     * stream and token rows. */
    assert_int_equal(r.activation_bytes, 8000ull * (4096 + 2 * 11008) * 4 + 8000ull * (8 + 4096 * 4));
    assert_true(r.reserve_bytes >= r.kv_bytes + r.activation_bytes);
    /* Decode: one token each, a small step dominated by attention's
     * worst-case scores and the logits. */
    llmem_prediction d;
    assert_ok(llmem_predictor_predict(p, LLMEM_STAGE_DECODE, 8, 99, 1000, &d));
    assert_true(d.activation_bytes < r.activation_bytes / 100);
    assert_int_equal(d.kv_bytes, 8ull * 1008 * 512 * 1024);
    assert_true(d.reserve_bytes >= d.activation_bytes); /* no new block: no KV to add */
    llmem_predictor_destroy(p);
}

/* Engine steps measured against the formulas. */
static void check_against_engine(const char *path, uint32_t kv_elem)
{
    llmem_model *m;
    assert_ok(llmem_model_open(path, NULL, &m));
    const llmem_model_config *c = llmem_model_get_config(m);
    llmem_predictor_options po = llmem_predictor_options_default();
    po.shape = c->shape;
    po.weight_type = c->weight_type;
    po.kv_elem_bytes = kv_elem;
    po.threads = 2;
    po.max_seq_len = c->shape.max_ctx;
    llmem_predictor *p;
    assert_ok(llmem_predictor_create(&po, &p));
    static const uint32_t batches[] = {1, 2, 4}, lens[] = {1, 5, 40};
    int32_t toks[200];
    for (int i = 0; i < 200; i++) toks[i] = 1 + (i * 17) % ((int32_t)c->shape.vocab - 1);
    for (size_t bi = 0; bi < 3; bi++)
        for (size_t li = 0; li < 3; li++) {
            llmem_engine_options eo = llmem_engine_options_default();
            eo.threads = 2;
            eo.kv_dtype = kv_elem == 2 ? LLMEM_KV_F16 : LLMEM_KV_F32;
            llmem_engine *e;
            assert_ok(llmem_engine_create(m, &eo, &e));
            llmem_engine_batch_item items[4];
            for (uint32_t b = 0; b < batches[bi]; b++) {
                llmem_engine_seq s;
                assert_ok(llmem_engine_seq_create(e, &s));
                items[b] = (llmem_engine_batch_item){s, toks + b * 40, lens[li]};
            }
            assert_ok(llmem_engine_step(e, items, batches[bi]));
            llmem_engine_stats es = {sizeof es};
            assert_ok(llmem_engine_get_stats(e, &es));
            llmem_prediction r;
            assert_ok(llmem_predictor_predict(p, LLMEM_STAGE_PREFILL, batches[bi], lens[li], 0, &r));
            double err = fabs((double)r.activation_bytes - (double)es.workspace_peak_bytes) /
                         (double)es.workspace_peak_bytes;
            if (err > 0.10)
                fail_msg("%s, %u x %u tokens: predicted %llu, the engine used %llu", path, batches[bi], lens[li],
                         (unsigned long long)r.activation_bytes, (unsigned long long)es.workspace_peak_bytes);
            /* KV written: exactly the tokens. */
            assert_int_equal(es.kv_used_bytes, (uint64_t)batches[bi] * lens[li] * r.kv_bytes_per_token);
            assert_ok(llmem_predictor_observe(p, batches[bi], lens[li], 0, es.workspace_peak_bytes));
            llmem_engine_destroy(e);
        }
    llmem_predictor_stats st = {sizeof st};
    assert_ok(llmem_predictor_get_stats(p, &st));
    print_message("%s: formula error %.2f%%, corrector %.2f%% over %llu steps\n", path, 100 * st.formula_error,
                  100 * st.corrector_error, (unsigned long long)st.observations);
    assert_true(st.formula_error < 0.10);
    llmem_predictor_destroy(p);
    llmem_model_close(m);
}

static void engine_peaks_real_models(void **state)
{
    (void)state;
    check_against_engine(MODEL("stories260K.bin"), 4);
    check_against_engine(MODEL("llama-2-tiny-random.gguf"), 2);
}

static llmem_status synth_fill(void *ctx, size_t index, void *buf, size_t bytes)
{
    (void)ctx;
    float *f = buf;
    for (size_t i = 0; i < bytes / 4; i++) f[i] = (float)((index * 131 + i * 7) % 97) / 970.0f - 0.05f;
    return LLMEM_OK;
}

static void engine_peaks_synthetic_model(void **state)
{
    (void)state;
    /* A llama of 2 layers, 128 wide, GQA 8/2, vocab 300, f32, written here. */
    char path[512];
    test_tmp_file(path, sizeof path, "test-predictor");
    llmem_gguf_writer *w;
    assert_ok(llmem_gguf_writer_create(&w));
    test_gguf_llama_keys(w, 256, 128, 2, 352, 8, 2);
    const uint64_t D = 128, KV = 32, F = 352, V = 300;
    uint64_t d[2];
#define T(name, a, b)                                                                                              \
    do {                                                                                                           \
        d[0] = a;                                                                                                  \
        d[1] = b;                                                                                                  \
        assert_ok(llmem_gguf_add_tensor(w, name, LLMEM_DTYPE_F32, (b) > 1 ? 2 : 1, d, synth_fill, NULL));          \
    } while (0)
    T("token_embd.weight", D, V);
    for (int l = 0; l < 2; l++) {
        char n[64];
#define L(suffix, a, b)                                                                                            \
    do {                                                                                                           \
        snprintf(n, sizeof n, "blk.%d." suffix ".weight", l);                                                      \
        T(n, a, b);                                                                                                \
    } while (0)
        L("attn_norm", D, 1);
        L("attn_q", D, D);
        L("attn_k", D, KV);
        L("attn_v", D, KV);
        L("attn_output", D, D);
        L("ffn_norm", D, 1);
        L("ffn_gate", D, F);
        L("ffn_down", F, D);
        L("ffn_up", D, F);
#undef L
    }
    T("output_norm.weight", D, 1);
#undef T
    assert_ok(llmem_gguf_write(w, path, false));
    llmem_gguf_writer_destroy(w);
    check_against_engine(path, 4);
    unlink(path);
}

/* An op function that is off by half: the corrector, fed what really
 * happens, takes over and predicts within 2%. */
static llmem_op_memory half_ffn(void *ctx, const llmem_op_query *q)
{
    (void)ctx;
    uint64_t rows = (uint64_t)q->batch * q->tokens;
    return (llmem_op_memory){rows * ((uint64_t)q->shape->hidden + 2ull * q->shape->ffn) * 2, 0};
}

static void corrector_learns_what_formulas_miss(void **state)
{
    (void)state;
    llmem_predictor *p = make("tiny-15m", 2, 256);
    assert_ok(llmem_predictor_register(p, LLMEM_OP_FFN, half_ffn, NULL, false));
    /* The truth: 5,000 bytes a step, 14,000 a token row, 3,000 a sequence. */
    uint32_t bs[] = {1, 2, 3, 4, 6, 8}, ts[] = {1, 3, 16, 64, 100};
    for (size_t i = 0; i < 6; i++)
        for (size_t j = 0; j < 5; j++) {
            uint64_t truth = 5000 + 14000ull * bs[i] * ts[j] + 3000ull * bs[i];
            assert_ok(llmem_predictor_observe(p, bs[i], ts[j], 0, truth));
        }
    llmem_predictor_stats st = {sizeof st};
    assert_ok(llmem_predictor_get_stats(p, &st));
    assert_int_equal(st.observations, 30);
    assert_int_equal(st.corrector_in_use, 1);
    assert_true(st.corrector_error < st.formula_error);
    llmem_prediction r;
    assert_ok(llmem_predictor_predict(p, LLMEM_STAGE_PREFILL, 5, 50, 0, &r));
    double truth = 5000 + 14000.0 * 250 + 3000.0 * 5;
    assert_true(fabs((double)r.corrected_activation_bytes - truth) / truth < 0.02);
    assert_true(fabs((double)r.activation_bytes - truth) / truth > 0.02); /* the formula alone misses */
    print_message("corrector: formula error %.1f%%, corrector %.2f%%\n", 100 * st.formula_error,
                  100 * st.corrector_error);
    llmem_predictor_destroy(p);
}

static void reserve_scales_data_dependent_part(void **state)
{
    (void)state;
    llmem_predictor_options o = llmem_predictor_options_default();
    assert_ok(llmem_shape_preset("tiny-15m", &o.shape));
    o.safety_factor = 1.0;
    llmem_predictor *a, *b;
    assert_ok(llmem_predictor_create(&o, &a));
    o.safety_factor = 2.0;
    assert_ok(llmem_predictor_create(&o, &b));
    llmem_prediction ra, rb;
    /* Decode: attention (scores at max_seq_len) is the peak op. */
    assert_ok(llmem_predictor_predict(a, LLMEM_STAGE_DECODE, 1, 1, 10, &ra));
    assert_ok(llmem_predictor_predict(b, LLMEM_STAGE_DECODE, 1, 1, 10, &rb));
    assert_int_equal(ra.peak_op, LLMEM_OP_CLASSIFIER); /* 32k logits outweigh 256 scores */
    assert_int_equal(ra.reserve_bytes, rb.reserve_bytes); /* so no data-dependent share */
    o.shape.vocab = 100;
    o.max_seq_len = 4096; /* scores of 2 threads x 4096 outweigh the FFN's 7 KB */
    llmem_predictor *c;
    assert_ok(llmem_predictor_create(&o, &c));
    llmem_prediction rc;
    assert_ok(llmem_predictor_predict(c, LLMEM_STAGE_DECODE, 1, 1, 10, &rc));
    assert_int_equal(rc.peak_op, LLMEM_OP_ATTENTION);
    assert_true(rc.reserve_bytes > rc.activation_bytes); /* x2 on attention */
    llmem_predictor_destroy(a);
    llmem_predictor_destroy(b);
    llmem_predictor_destroy(c);
}

static void bad_input(void **state)
{
    (void)state;
    llmem_predictor_options o = llmem_predictor_options_default();
    llmem_predictor *p;
    assert_status(llmem_predictor_create(&o, &p), LLMEM_EINVAL); /* no shape */
    assert_ok(llmem_shape_preset("tiny-15m", &o.shape));
    o.safety_factor = 0.5;
    assert_status(llmem_predictor_create(&o, &p), LLMEM_EINVAL);
    o.safety_factor = 1.2;
    o.weight_type = 77;
    assert_status(llmem_predictor_create(&o, &p), LLMEM_EINVAL);
    o.weight_type = LLMEM_DTYPE_Q8_0;
    assert_ok(llmem_predictor_create(&o, &p));
    llmem_prediction r;
    assert_status(llmem_predictor_predict(p, LLMEM_STAGE_PREFILL, 0, 5, 0, &r), LLMEM_EINVAL);
    assert_status(llmem_predictor_predict(p, LLMEM_STAGE_PREFILL, 1, 200, 100, &r), LLMEM_ERANGE);
    assert_status(llmem_predictor_predict(p, (llmem_stage)9, 1, 1, 0, &r), LLMEM_EINVAL);
    assert_status(llmem_predictor_predict(NULL, LLMEM_STAGE_DECODE, 1, 1, 0, &r), LLMEM_EINVAL);
    assert_status(llmem_predictor_observe(p, 1, 1, 0, 0), LLMEM_EINVAL);
    assert_status(llmem_predictor_register(p, LLMEM_OP_KIND_COUNT, half_ffn, NULL, false), LLMEM_EINVAL);
    assert_status(llmem_predictor_register(p, LLMEM_OP_FFN, NULL, NULL, false), LLMEM_EINVAL);
    /* q8_0: 34 bytes per 32 weights. */
    assert_ok(llmem_predictor_predict(p, LLMEM_STAGE_IDLE, 0, 0, 0, &r));
    assert_true(r.weights_bytes < llmem_shape_params(&o.shape) * 11 / 10 && r.weights_bytes > llmem_shape_params(&o.shape));
    char buf[512];
    llmem_predictor_stats st = {sizeof st};
    assert_ok(llmem_predictor_get_stats(p, &st));
    assert_ok(llmem_stats_to_json(llmem_predictor_stats_schema(), &st, NULL, 0, buf, sizeof buf, NULL));
    assert_non_null(strstr(buf, "\"corrector_in_use\":0"));
    llmem_predictor_destroy(p);
    llmem_predictor_destroy(NULL);
}

int main(int argc, char **argv)
{
    /* The real models of the shared folder (test_predictor_shared). */
    const struct CMUnitTest shared_tests[] = {
        cmocka_unit_test(engine_peaks_real_models),
    };
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sizes_of_llama_2_7b),
        cmocka_unit_test(engine_peaks_synthetic_model),
        cmocka_unit_test(corrector_learns_what_formulas_miss),
        cmocka_unit_test(reserve_scales_data_dependent_part),
        cmocka_unit_test_setup(bad_input, test_quiet_logs),
    };
    return test_main(argc, argv, "test_predictor", TEST_GROUP(tests, NULL, NULL), TEST_GROUP(shared_tests, NULL, NULL),
                     (const char *const[]){"models/stories260K.bin", "models/llama-2-tiny-random.gguf", NULL});
}
