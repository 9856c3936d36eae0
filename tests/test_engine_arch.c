/*
 * test_engine_arch.c - the architectures beyond plain llama against a
 * scalar reference written here: Qwen2 (Q/K/V biases, NEOX rope, rope
 * theta from the file) and sliding-window attention (Mistral's
 * ARCH.attention.sliding_window), plus qwen2 files that are wrong.
 *
 * The reference (ref_logits) is the forward pass done the plainest way,
 * one position at a time over f32 tensors read from the model: RMSNorm,
 * Q/K/V plus bias, rope in either style with double-precision
 * frequencies, causal attention over the last `window` positions (all
 * when 0) from a cache of every position, SwiGLU, the classifier. It
 * shares no code with the engine (no kernels, no KV manager, no block
 * tables), so a wrong rope pairing, a missing bias, a window off by one
 * or a table entry of a dropped block shows as a logit difference.
 *
 * Why windows are checked here and not against llama.cpp: llama.cpp reads
 * ARCH.attention.sliding_window only for the archs that have one in their
 * graph (gemma2/3, cohere2, mellum, ...; phi3 reads it and turns it off);
 * for "llama" and "qwen2" files it ignores the key and attends to
 * everything. tests/test_oracle.c checks the same files with full
 * attention against llama.cpp.
 */
#include <math.h>

#include "test_util.h"
#include "support/tmpdir.h"

enum { N_POS = 120, WINDOW = 8, BLOCK = 4 };

static int setup(void **state)
{
    (void)state;
    return test_tmpdir_make("arch");
}

/* 2 layers, hidden 64, 4 heads of 16, 2 KV heads, FFN 128, vocabulary
 * 300 (enough for the made-up BPE one), context 256. */
static llmem_shape arch_shape(void)
{
    llmem_shape s = {"arch-test", 2, 64, 4, 2, 16, 128, 300, 256, 1000000.0, 1};
    return s;
}

static void synth(const char *name, const char *arch, uint32_t window, char *path, size_t cap)
{
    llmem_shape s = arch_shape();
    snprintf(path, cap, "%s/%s.gguf", test_tmpdir(), name);
    llmem_synth_options so = {5, LLMEM_DTYPE_F32, NULL, false, NULL, arch, window};
    assert_ok(llmem_synth_gguf(&s, &so, path));
}

/* The synthetic model `name` of arch (window: its attention window), opened. */
static llmem_model *open_synth(const char *name, const char *arch, uint32_t window)
{
    char path[256];
    synth(name, arch, window, path, sizeof path);
    llmem_model *m;
    assert_ok(llmem_model_open(path, NULL, &m));
    return m;
}

/* An engine of one thread over m: max_seqs sequences, KV blocks of BLOCK
 * tokens, attention window attn_window (0: the model's). */
static llmem_engine *small_engine(llmem_model *m, uint32_t max_seqs, uint32_t attn_window)
{
    llmem_engine_options o = llmem_engine_options_default();
    o.threads = 1;
    o.max_seqs = max_seqs;
    o.kv_block_tokens = BLOCK;
    o.attn_window = attn_window;
    llmem_engine *e;
    assert_ok(llmem_engine_create(m, &o, &e));
    return e;
}

/* ---- the scalar reference ------------------------------------------------------------ */

static const float *tensor_f32(const llmem_model *m, const char *name)
{
    const llmem_tensor *t;
    if (llmem_model_tensor(m, name, &t) != LLMEM_OK) return NULL;
    assert_int_equal(t->type, LLMEM_DTYPE_F32);
    return t->data;
}

static const float *layer_tensor(const llmem_model *m, uint32_t l, const char *suffix)
{
    char name[96];
    snprintf(name, sizeof name, "blk.%u.%s", l, suffix);
    return tensor_f32(m, name);
}

/* y[d] = W x for W of d rows of n. */
static void matvec(float *y, const float *w, const float *x, size_t n, size_t d)
{
    for (size_t r = 0; r < d; r++) {
        double acc = 0;
        for (size_t j = 0; j < n; j++) acc += (double)w[r * n + j] * x[j];
        y[r] = (float)acc;
    }
}

static void rmsnorm(float *o, const float *x, const float *w, size_t n, float eps)
{
    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    double scale = 1.0 / sqrt(ss / (double)n + eps);
    for (size_t i = 0; i < n; i++) o[i] = (float)(x[i] * scale * w[i]);
}

/* Rotate each head's pairs: NORM (2i, 2i+1), NEOX (i, i + dim/2). */
static void rope(float *v, size_t heads, size_t hd, size_t pos, double theta, bool neox)
{
    for (size_t h = 0; h < heads; h++)
        for (size_t i = 0; i < hd / 2; i++) {
            double ang = (double)pos * pow(theta, -2.0 * (double)i / (double)hd);
            size_t a = neox ? i : 2 * i, b = neox ? i + hd / 2 : 2 * i + 1;
            double x0 = v[h * hd + a], x1 = v[h * hd + b];
            v[h * hd + a] = (float)(x0 * cos(ang) - x1 * sin(ang));
            v[h * hd + b] = (float)(x0 * sin(ang) + x1 * cos(ang));
        }
}

/* The logits after each of ids[0..n) (n x vocab), attending to the last
 * `window` positions (0: all), rope NEOX or NORM, biases when the model
 * has them. */
static void ref_logits(const llmem_model *m, const int32_t *ids, size_t n, uint32_t window, bool neox, float *out)
{
    const llmem_model_config *c = llmem_model_get_config(m);
    const llmem_shape *s = &c->shape;
    size_t D = s->hidden, H = s->heads, KH = s->kv_heads, hd = s->head_dim, F = s->ffn, V = s->vocab;
    size_t qd = H * hd, kd = KH * hd, L = s->layers;
    float *kc = malloc(L * n * kd * sizeof(float)), *vc = malloc(L * n * kd * sizeof(float));
    float x[64], xb[64], q[64], k[64], v[64], att[64], o[64], h1[128], h3[128], sc[N_POS + 1];
    assert_true(kc && vc && D <= 64 && qd <= 64 && F <= 128 && n <= N_POS);
    const float *emb = tensor_f32(m, "token_embd.weight");
    const float *cls = tensor_f32(m, "output.weight");
    if (!cls) cls = emb;
    for (size_t p = 0; p < n; p++) {
        memcpy(x, emb + (size_t)ids[p] * D, D * sizeof(float));
        for (uint32_t l = 0; l < L; l++) {
            rmsnorm(xb, x, layer_tensor(m, l, "attn_norm.weight"), D, c->norm_eps);
            matvec(q, layer_tensor(m, l, "attn_q.weight"), xb, D, qd);
            matvec(k, layer_tensor(m, l, "attn_k.weight"), xb, D, kd);
            matvec(v, layer_tensor(m, l, "attn_v.weight"), xb, D, kd);
            const float *bq = layer_tensor(m, l, "attn_q.bias"), *bk = layer_tensor(m, l, "attn_k.bias"),
                        *bv = layer_tensor(m, l, "attn_v.bias");
            for (size_t i = 0; bq && i < qd; i++) q[i] += bq[i];
            for (size_t i = 0; bk && i < kd; i++) k[i] += bk[i];
            for (size_t i = 0; bv && i < kd; i++) v[i] += bv[i];
            rope(q, H, hd, p, s->rope_theta, neox);
            rope(k, KH, hd, p, s->rope_theta, neox);
            memcpy(kc + (l * n + p) * kd, k, kd * sizeof(float));
            memcpy(vc + (l * n + p) * kd, v, kd * sizeof(float));
            size_t p0 = window && p + 1 > window ? p + 1 - window : 0;
            for (size_t h = 0; h < H; h++) {
                size_t kh = h / (H / KH);
                double mx = -INFINITY, sum = 0;
                for (size_t t = p0; t <= p; t++) {
                    double d = 0;
                    for (size_t i = 0; i < hd; i++) d += (double)q[h * hd + i] * kc[(l * n + t) * kd + kh * hd + i];
                    sc[t - p0] = (float)(d / sqrt((double)hd));
                    if (sc[t - p0] > mx) mx = sc[t - p0];
                }
                for (size_t t = p0; t <= p; t++) sum += exp(sc[t - p0] - mx);
                for (size_t i = 0; i < hd; i++) {
                    double acc = 0;
                    for (size_t t = p0; t <= p; t++)
                        acc += exp(sc[t - p0] - mx) / sum * vc[(l * n + t) * kd + kh * hd + i];
                    att[h * hd + i] = (float)acc;
                }
            }
            matvec(o, layer_tensor(m, l, "attn_output.weight"), att, qd, D);
            for (size_t i = 0; i < D; i++) x[i] += o[i];
            rmsnorm(xb, x, layer_tensor(m, l, "ffn_norm.weight"), D, c->norm_eps);
            matvec(h1, layer_tensor(m, l, "ffn_gate.weight"), xb, D, F);
            matvec(h3, layer_tensor(m, l, "ffn_up.weight"), xb, D, F);
            for (size_t i = 0; i < F; i++) h1[i] = (float)(h1[i] / (1.0 + exp(-(double)h1[i])) * h3[i]);
            matvec(o, layer_tensor(m, l, "ffn_down.weight"), h1, F, D);
            for (size_t i = 0; i < D; i++) x[i] += o[i];
        }
        rmsnorm(xb, x, tensor_f32(m, "output_norm.weight"), D, c->norm_eps);
        matvec(out + p * V, cls, xb, D, V);
    }
    free(kc);
    free(vc);
}

/* ---- the engine, teacher-forced ------------------------------------------------------- */

typedef struct run_opts {
    bool one_step;              /* all of ids in one step (only the last logits kept), else one a step */
    llmem_engine_alloc alloc;
    uint32_t attn_window;       /* llmem_engine_options.attn_window */
    unsigned threads;
} run_opts;

/* The engine's logits after each of ids[0..n) into out (n x vocab); with
 * one_step only row n - 1 is written. */
static void engine_logits(const llmem_model *m, const int32_t *ids, size_t n, const run_opts *ro, float *out)
{
    llmem_engine_options o = llmem_engine_options_default();
    o.threads = ro->threads ? ro->threads : 1;
    o.max_seqs = 2;
    o.max_seq_len = 256;
    o.kv_block_tokens = BLOCK;
    o.alloc = ro->alloc;
    o.attn_window = ro->attn_window;
    llmem_engine *e;
    assert_ok(llmem_engine_create(m, &o, &e));
    uint32_t V = llmem_model_get_config(m)->shape.vocab;
    llmem_engine_seq s;
    assert_ok(llmem_engine_seq_create(e, &s));
    if (ro->one_step) {
        llmem_engine_batch_item it = {s, ids, (uint32_t)n};
        assert_ok(llmem_engine_step(e, &it, 1));
        memcpy(out + (n - 1) * V, llmem_engine_logits(e, 0), V * sizeof(float));
    } else {
        for (size_t i = 0; i < n; i++) {
            llmem_engine_batch_item it = {s, &ids[i], 1};
            assert_ok(llmem_engine_step(e, &it, 1));
            memcpy(out + i * V, llmem_engine_logits(e, 0), V * sizeof(float));
        }
    }
    assert_int_equal(llmem_engine_seq_length(e, s), n);
    llmem_engine_destroy(e);
}

/* max |a - b| over max |b| over rows [from, to) of V. */
static double rel_diff(const float *a, const float *b, size_t from, size_t to, uint32_t V)
{
    double d = 0, scale = 0;
    for (size_t i = from * V; i < to * V; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    return d / fmax(scale, 1e-30);
}

static void random_ids(int32_t *ids, size_t n, uint32_t vocab, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((seed >> 33) % vocab);
    }
}

/* Float rounding of 2-layer logits in different orders (the engine's
 * vector kernels against double sums): measured at most 2e-7 here. */
#define TOL 1e-5

/* ---- Qwen2 -------------------------------------------------------------------------------- */

static void qwen2_matches_reference(void **state)
{
    (void)state;
    llmem_model *m = open_synth("qwen2", "qwen2", 0);
    const llmem_model_config *c = llmem_model_get_config(m);
    assert_int_equal(c->arch, LLMEM_ARCH_QWEN2);
    assert_int_equal(c->rope_style, LLMEM_ROPE_NEOX);
    assert_true(c->qkv_bias);
    assert_true(fabs(c->shape.rope_theta - 1e6) < 1);
    assert_true(c->norm_eps < 2e-6f);
    const uint32_t V = c->shape.vocab;
    const size_t n = 48;
    int32_t ids[N_POS];
    random_ids(ids, n, V, 3);
    float *ref = malloc(n * V * sizeof(float)), *wrong = malloc(n * V * sizeof(float)),
          *got = malloc(n * V * sizeof(float));
    assert_true(ref && wrong && got);
    ref_logits(m, ids, n, 0, true, ref);
    run_opts ro = {false, LLMEM_ENGINE_ALLOC_LLMEM, 0, 1};
    engine_logits(m, ids, n, &ro, got);
    double d = rel_diff(got, ref, 0, n, V);
    print_message("qwen2 f32, %zu positions one a step: within %.2e of the reference\n", n, d);
    assert_true(d < TOL);
    /* One prefill of all 48, two threads: the last logits the same. */
    ro = (run_opts){true, LLMEM_ENGINE_ALLOC_LLMEM, 0, 2};
    engine_logits(m, ids, n, &ro, got);
    assert_true(rel_diff(got, ref, n - 1, n, V) < TOL);
    /* The check tells the rope styles apart: the reference with llama's
     * pairing is far from it. */
    ref_logits(m, ids, n, 0, false, wrong);
    double far = rel_diff(wrong, ref, 1, n, V);
    print_message("qwen2 f32: the reference with NORM rope is %.2e away\n", far);
    assert_true(far > 100 * TOL);
    free(ref);
    free(wrong);
    free(got);
    llmem_model_close(m);
}

/* ---- sliding window ----------------------------------------------------------------------- */

static void window_matches_reference(void **state)
{
    (void)state;
    static const char *const archs[] = {"llama", "qwen2"};
    for (size_t a = 0; a < 2; a++) {
        char path[256], name[32];
        snprintf(name, sizeof name, "window-%s", archs[a]);
        synth(name, archs[a], WINDOW, path, sizeof path);
        llmem_model *m;
        assert_ok(llmem_model_open(path, NULL, &m));
        const llmem_model_config *c = llmem_model_get_config(m);
        assert_int_equal(c->sliding_window, WINDOW);
        bool neox = c->rope_style == LLMEM_ROPE_NEOX;
        const uint32_t V = c->shape.vocab;
        const size_t n = N_POS;
        int32_t ids[N_POS];
        random_ids(ids, n, V, 11 + a);
        float *ref = malloc(n * V * sizeof(float)), *full = malloc(n * V * sizeof(float)),
              *got = malloc(n * V * sizeof(float));
        assert_true(ref && full && got);
        ref_logits(m, ids, n, WINDOW, neox, ref);
        ref_logits(m, ids, n, 0, neox, full);
        /* The window changes the answer once positions leave it. */
        assert_true(rel_diff(ref, full, 0, WINDOW, V) < 1e-6);
        assert_true(rel_diff(ref, full, WINDOW, n, V) > 100 * TOL);
        /* PAGED one a step (the KV drops blocks), one 120-token step (run in
         * passes: the KV keeps 8 + 16 positions), two threads, the malloc
         * baseline (masking only): all the reference. */
        const run_opts runs[] = {
            {false, LLMEM_ENGINE_ALLOC_LLMEM, 0, 1},
            {true, LLMEM_ENGINE_ALLOC_LLMEM, 0, 1},
            {true, LLMEM_ENGINE_ALLOC_LLMEM, 0, 2},
            {false, LLMEM_ENGINE_ALLOC_MALLOC, 0, 1},
        };
        for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
            engine_logits(m, ids, n, &runs[r], got);
            double d = runs[r].one_step ? rel_diff(got, ref, n - 1, n, V) : rel_diff(got, ref, 0, n, V);
            print_message("%s window %d, run %zu: within %.2e of the reference\n", archs[a], WINDOW, r, d);
            assert_true(d < TOL);
        }
        /* attn_window = FULL: what llama.cpp does with these files. */
        run_opts ro = {false, LLMEM_ENGINE_ALLOC_LLMEM, LLMEM_ENGINE_FULL_ATTENTION, 1};
        engine_logits(m, ids, n, &ro, got);
        assert_true(rel_diff(got, full, 0, n, V) < TOL);
        free(ref);
        free(full);
        free(got);
        llmem_model_close(m);
    }
}

/* A long generation's KV stops growing once the window is full; without
 * the window it grows with every block. */
static void window_kv_stays_bounded(void **state)
{
    (void)state;
    llmem_model *m = open_synth("window-bounded", "llama", WINDOW);
    uint64_t at[2][3];
    for (int full = 0; full < 2; full++) {
        llmem_engine *e = small_engine(m, 1, full ? LLMEM_ENGINE_FULL_ATTENTION : 0);
        llmem_engine_info info;
        assert_ok(llmem_engine_get_info(e, &info));
        assert_int_equal(info.attn_window, full ? 0 : WINDOW);
        assert_int_equal(info.kv_window, full ? 0 : WINDOW + 4 * BLOCK);
        llmem_engine_seq s;
        assert_ok(llmem_engine_seq_create(e, &s));
        int32_t tok = 7;
        for (size_t i = 0; i < 250; i++) {
            llmem_engine_batch_item it = {s, &tok, 1};
            assert_ok(llmem_engine_step(e, &it, 1));
            tok = llmem_logits_argmax(llmem_engine_logits(e, 0), llmem_model_get_config(m)->shape.vocab);
            if (i == 49 || i == 149 || i == 249) {
                llmem_engine_stats st = {sizeof st};
                assert_ok(llmem_engine_get_stats(e, &st));
                at[full][i / 100] = st.kv_bytes;
            }
        }
        if (!full) {
            llmem_kv_seq_info si;
            assert_ok(llmem_kv_seq_get_info(llmem_engine_kv(e), llmem_engine_seq_kv(e, s), &si));
            /* It holds the KV window (whole blocks) and at most a block more. */
            assert_true(si.first > 0);
            assert_true(si.length - si.first <= WINDOW + 4 * BLOCK + BLOCK);
        }
        llmem_engine_destroy(e);
    }
    print_message("KV bytes after 50, 150, 250 tokens: window %llu %llu %llu, full %llu %llu %llu\n",
                  (unsigned long long)at[0][0], (unsigned long long)at[0][1], (unsigned long long)at[0][2],
                  (unsigned long long)at[1][0], (unsigned long long)at[1][1], (unsigned long long)at[1][2]);
    assert_true(at[0][0] == at[0][1] && at[0][1] == at[0][2]);
    assert_true(at[1][2] > at[1][0]);
    assert_true(at[0][2] < at[1][2]);
    llmem_model_close(m);
}

/* ---- wrong qwen2 files ---------------------------------------------------------------------- */

static unsigned char *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

/* The byte after the tensor info's name `name` in b (its u32 n_dims). */
static unsigned char *after_name(unsigned char *b, size_t n, const char *name)
{
    size_t len = strlen(name);
    for (size_t i = 8; i + len < n; i++)
        if (!memcmp(b + i, name, len) && b[i - 8] == len && !memcmp(b + i - 7, "\0\0\0\0\0\0\0", 7))
            return b + i + len;
    fail_msg("no tensor info named %s", name);
    return NULL;
}

static void expect_refused(const unsigned char *b, size_t n, llmem_status want, const char *mention)
{
    llmem_model *m = NULL;
    assert_status(llmem_model_open_memory(b, n, &m), want);
    assert_null(m);
    assert_error_mentions(mention);
}

static void bad_qwen2_files(void **state)
{
    (void)state;
    char path[256];
    synth("qwen2-bad", "qwen2", 0, path, sizeof path);
    size_t n;
    unsigned char *orig = read_all(path, &n), *b = malloc(n);
    assert_non_null(b);
    llmem_model *m;
    assert_ok(llmem_model_open_memory(orig, n, &m));
    llmem_model_close(m);

    /* A bias missing (its name changed): EFORMAT naming it. */
    memcpy(b, orig, n);
    unsigned char *p = after_name(b, n, "blk.1.attn_k.bias");
    p[-1] = 'z';
    expect_refused(b, n, LLMEM_EFORMAT, "blk.1.attn_k.bias");
    assert_error_mentions("missing");

    /* A bias of the wrong shape (16 elements, the K rows are 32). */
    memcpy(b, orig, n);
    p = after_name(b, n, "blk.0.attn_k.bias");
    uint64_t d0;
    memcpy(&d0, p + 4, 8);
    assert_int_equal(d0, 32);
    d0 = 16;
    memcpy(p + 4, &d0, 8);
    expect_refused(b, n, LLMEM_EFORMAT, "blk.0.attn_k.bias");
    assert_error_mentions("dims (16)");

    /* A bias that is 2-D. */
    memcpy(b, orig, n);
    p = after_name(b, n, "blk.0.attn_q.bias");
    uint32_t nd = 2;
    memcpy(p, &nd, 4); /* n_dims 2: the next 8 bytes (the type and half the offset) read as dims[1] */
    llmem_model *bad = NULL;
    assert_true(llmem_model_open_memory(b, n, &bad) != LLMEM_OK);
    assert_null(bad);

    /* Another architecture name of the same length. */
    memcpy(b, orig, n);
    for (size_t i = 0; i + 5 < n; i++)
        if (!memcmp(b + i, "qwen2", 5) && b[i - 8] == 5) {
            memcpy(b + i, "qwen9", 5);
            break;
        }
    expect_refused(b, n, LLMEM_ENOTSUP, "qwen9");

    /* Cut short: every length is checked, nothing read past the end. */
    for (size_t cut = 16; cut < n; cut = cut * 3 + 1) {
        bad = NULL;
        assert_true(llmem_model_open_memory(orig, cut, &bad) != LLMEM_OK);
        assert_null(bad);
    }
    free(orig);
    free(b);
}

/* A step item longer than one pass on a window runs in passes inside the
 * step: the sequence ends at its full length, every item gets its logits,
 * its KV stays within the window. */
static void window_long_prompt_is_passes(void **state)
{
    (void)state;
    llmem_model *m = open_synth("window-passes", "llama", WINDOW);
    llmem_engine *e = small_engine(m, 2, 0);
    llmem_engine_seq a, b;
    assert_ok(llmem_engine_seq_create(e, &a));
    assert_ok(llmem_engine_seq_create(e, &b));
    int32_t ids[200];
    random_ids(ids, 200, 300, 5);
    /* Two items, one long, in one step: both advance, the logits of both. */
    llmem_engine_batch_item it[2] = {{a, ids, 200}, {b, ids, 3}};
    llmem_engine_stats before = {sizeof before}, after = {sizeof after};
    assert_ok(llmem_engine_get_stats(e, &before));
    assert_ok(llmem_engine_step(e, it, 2));
    assert_ok(llmem_engine_get_stats(e, &after));
    assert_non_null(llmem_engine_logits(e, 0));
    assert_non_null(llmem_engine_logits(e, 1));
    assert_int_equal(llmem_engine_seq_length(e, a), 200);
    assert_int_equal(llmem_engine_seq_length(e, b), 3);
    assert_true(after.steps_total - before.steps_total > 2); /* passes before the last one */
    assert_int_equal(after.prefill_tokens_total - before.prefill_tokens_total, 203);
    llmem_kv_seq_info si;
    assert_ok(llmem_kv_seq_get_info(llmem_engine_kv(e), llmem_engine_seq_kv(e, a), &si));
    assert_true(si.length - si.first <= WINDOW + 4 * BLOCK + BLOCK);
    llmem_engine_destroy(e);
    llmem_model_close(m);
}

/* A fork of a windowed sequence shares its blocks (the KV manager's
 * copy-on-write): parent and child, continued alike past more window
 * slides, both give the reference's logits. */
static void window_fork_matches_reference(void **state)
{
    (void)state;
    llmem_model *m = open_synth("window-fork", "qwen2", WINDOW);
    const uint32_t V = llmem_model_get_config(m)->shape.vocab;
    const size_t n = 90, split = 61;
    int32_t ids[N_POS];
    random_ids(ids, n, V, 23);
    float *ref = malloc(n * V * sizeof(float));
    assert_non_null(ref);
    ref_logits(m, ids, n, WINDOW, true, ref);
    llmem_engine *e = small_engine(m, 2, 0);
    llmem_engine_seq a, b;
    assert_ok(llmem_engine_seq_create(e, &a));
    llmem_engine_batch_item it = {a, ids, (uint32_t)split};
    assert_ok(llmem_engine_step(e, &it, 1));
    assert_ok(llmem_engine_seq_fork(e, a, &b));
    for (size_t i = split; i < n; i++) {
        llmem_engine_batch_item two[2] = {{a, &ids[i], 1}, {b, &ids[i], 1}};
        assert_ok(llmem_engine_step(e, two, 2));
        for (int k = 0; k < 2; k++) {
            const float *lg = llmem_engine_logits(e, (size_t)k);
            double d = 0, scale = 0;
            for (uint32_t v = 0; v < V; v++) {
                d = fmax(d, fabs((double)lg[v] - ref[i * V + v]));
                scale = fmax(scale, fabs((double)ref[i * V + v]));
            }
            if (d / scale >= TOL) fail_msg("position %zu, %s: %.2e from the reference", i, k ? "child" : "parent",
                                           d / scale);
        }
    }
    free(ref);
    llmem_engine_destroy(e);
    llmem_model_close(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(qwen2_matches_reference),
        cmocka_unit_test(window_matches_reference),
        cmocka_unit_test(window_kv_stays_bounded),
        cmocka_unit_test(window_long_prompt_is_passes),
        cmocka_unit_test(window_fork_matches_reference),
        cmocka_unit_test_setup(bad_qwen2_files, test_quiet_logs),
    };
    return cmocka_run_group_tests(tests, setup, test_tmpdir_teardown);
}
