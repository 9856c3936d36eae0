/*
 * test_model.c - model files: the GGUF writer round trip (every tensor type
 * and metadata getter), every scalar metadata type from a hand-built v2
 * file, the llama2.c layout against run.c's, the real models in
 * ../shared/models (.bin and .gguf agree byte for byte), truncation at
 * every length, every bit of a header flipped, hand-made hostile files,
 * mapping options, descriptor and mapping leaks, and the stats schema.
 *
 * `LLMEM_WRITE_MODEL_SEEDS=DIR test_model` writes the fuzz seeds into DIR
 * and exits: CTest (fixture fuzz_model_seeds) and `make fuzz` make the GGUF
 * seeds this way instead of keeping model files in the repository.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "test_util.h"
#include "support/tmpdir.h"

/* A file in the shared folder's models/ (test_util.h: test_shared_path). */
#define MODEL(rel) test_shared_path("models/" rel)
#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static char tmpdir[64];

static int make_tmpdir(void **state)
{
    test_quiet_logs(state);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/llmem_test_model.XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int remove_tmpdir(void **state)
{
    (void)state;
    DIR *d = opendir(tmpdir);
    if (!d) return 0;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(tmpdir);
    return 0;
}

/* A path in the test's folder; valid until four more calls. */
static const char *tmp_path(const char *name)
{
    static char p[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", tmpdir, name);
    return p[k];
}

static uint8_t *read_all(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(n > 0 ? (size_t)n : 1);
    assert_non_null(p);
    assert_int_equal(fread(p, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *size = (size_t)n;
    return p;
}

static void write_all(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* open_memory on an exact-size copy, so ASan sees any read past the end. */
static llmem_status open_copy(const uint8_t *p, size_t n, llmem_model **m, uint8_t **copy)
{
    *copy = malloc(n ? n : 1);
    assert_non_null(*copy);
    if (n) memcpy(*copy, p, n);
    llmem_error_clear();
    return llmem_model_open_memory(*copy, n, m);
}

/* Every invariant an open model promises. */
static void check_model(const llmem_model *m, const uint8_t *base, size_t size)
{
    size_t n = llmem_model_tensor_count(m);
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        const llmem_tensor *t = llmem_model_tensor_at(m, i), *u;
        assert_non_null(t);
        assert_true(t->n_dims >= 1 && t->n_dims <= 4);
        uint64_t prod = 1;
        for (int d = 0; d < 4; d++) prod *= t->dims[d];
        assert_true(prod == t->n_elements);
        assert_true(t->bytes == llmem_dtype_bytes(t->type, t->n_elements) && t->bytes > 0);
        assert_true((const uint8_t *)t->data >= base && (const uint8_t *)t->data + t->bytes <= base + size);
        assert_true((const uint8_t *)t->data == base + t->offset);
        assert_ok(llmem_model_tensor(m, t->name, &u));
        assert_ptr_equal(u, t);
        sum += t->bytes;
    }
    assert_null(llmem_model_tensor_at(m, n));
    const llmem_model_config *c = llmem_model_get_config(m);
    assert_true(c->shape.hidden == c->shape.heads * c->shape.head_dim);
    assert_true(c->shape.kv_heads && c->shape.heads % c->shape.kv_heads == 0);
    assert_true(c->rope_dim <= c->shape.head_dim && c->rope_dim % 2 == 0);
    assert_non_null(memchr(c->shape.name, 0, sizeof c->shape.name));
    llmem_model_stats st = {0};
    assert_ok(llmem_model_get_stats(m, &st));
    assert_true(st.tensor_bytes == sum && st.tensors == n && st.file_bytes == size);
}

/* ---- a model made by the writer ----------------------------------------- */

enum { H = 32, HEADS = 4, KVH = 2, HD = 8, FFN = 64 };

typedef struct spec {
    uint32_t vocab, layers, ffn;
    bool tied;
    uint32_t types[10]; /* embd, q, k, v, o, gate, down, up, output, (norms use f32 / ffn_norm f16) */
} spec;

static const spec mixed = {8, 1, FFN, false,
                           {LLMEM_DTYPE_F32, LLMEM_DTYPE_F16, LLMEM_DTYPE_Q8_0, LLMEM_DTYPE_BF16, LLMEM_DTYPE_Q8_0,
                            LLMEM_DTYPE_F16, LLMEM_DTYPE_Q8_0, LLMEM_DTYPE_BF16, LLMEM_DTYPE_Q8_0}};

/* Byte j of tensor i: a pattern that differs between tensors. */
static uint8_t pattern(size_t i, size_t j) { return (uint8_t)(i * 31 + j * 7 + (j >> 8) + 1); }

static llmem_status fill_pattern(void *ctx, size_t index, void *buf, size_t bytes)
{
    (void)ctx;
    for (size_t j = 0; j < bytes; j++) ((uint8_t *)buf)[j] = pattern(index, j);
    return LLMEM_OK;
}

static llmem_status fill_fails(void *ctx, size_t index, void *buf, size_t bytes)
{
    (void)ctx;
    (void)buf;
    (void)bytes;
    return index == 3 ? LLMEM_ENOMEM : LLMEM_OK;
}

static const char *const tokens[] = {"<unk>", "<s>", "</s>", "a", "\xe2\x96\x81the", "b", "", "zz"};
static const float scores[] = {0, 0, 0, -1.5f, -2.25f, -3, -4, 1e30f};
static const int32_t token_types[] = {2, 3, 3, 1, 1, 1, -7, 6};

/* Write the spec'd llama model with the writer; names[i] gets tensor i. */
static void write_model(const spec *s, const char *path, char names[][48], size_t *count)
{
    llmem_gguf_writer *w;
    assert_ok(llmem_gguf_writer_create(&w));
    assert_ok(llmem_gguf_add_str(w, "general.architecture", "llama"));
    assert_ok(llmem_gguf_add_str(w, "general.name", "tiny test model"));
    assert_ok(llmem_gguf_add_u32(w, "llama.context_length", 128));
    assert_ok(llmem_gguf_add_u32(w, "llama.embedding_length", H));
    assert_ok(llmem_gguf_add_u32(w, "llama.block_count", s->layers));
    assert_ok(llmem_gguf_add_u32(w, "llama.feed_forward_length", s->ffn));
    assert_ok(llmem_gguf_add_u32(w, "llama.attention.head_count", HEADS));
    assert_ok(llmem_gguf_add_u32(w, "llama.attention.head_count_kv", KVH));
    assert_ok(llmem_gguf_add_u32(w, "llama.rope.dimension_count", 4));
    assert_ok(llmem_gguf_add_f32(w, "llama.rope.freq_base", 500000.0f));
    assert_ok(llmem_gguf_add_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-6f));
    assert_ok(llmem_gguf_add_str(w, "tokenizer.ggml.model", "llama"));
    size_t nv = s->vocab < 8 ? s->vocab : 8;
    assert_ok(llmem_gguf_add_str_array(w, "tokenizer.ggml.tokens", tokens, nv));
    assert_ok(llmem_gguf_add_f32_array(w, "tokenizer.ggml.scores", scores, nv));
    assert_ok(llmem_gguf_add_i32_array(w, "tokenizer.ggml.token_type", token_types, nv));
    size_t n = 0;
#define T(nm, ty, nd, a, b)                                                                 \
    do {                                                                                    \
        uint64_t dims_[2] = {(a), (b)};                                                     \
        if (names) snprintf(names[n], 48, "%s", nm);                                        \
        assert_ok(llmem_gguf_add_tensor(w, nm, ty, nd, dims_, fill_pattern, NULL));         \
        n++;                                                                                \
    } while (0)
    T("token_embd.weight", s->types[0], 2, H, s->vocab);
    char nm[48];
    for (uint32_t l = 0; l < s->layers; l++) {
        snprintf(nm, sizeof nm, "blk.%u.attn_norm.weight", l); T(nm, LLMEM_DTYPE_F32, 1, H, 1);
        snprintf(nm, sizeof nm, "blk.%u.attn_q.weight", l); T(nm, s->types[1], 2, H, HEADS * HD);
        snprintf(nm, sizeof nm, "blk.%u.attn_k.weight", l); T(nm, s->types[2], 2, H, KVH * HD);
        snprintf(nm, sizeof nm, "blk.%u.attn_v.weight", l); T(nm, s->types[3], 2, H, KVH * HD);
        snprintf(nm, sizeof nm, "blk.%u.attn_output.weight", l); T(nm, s->types[4], 2, HEADS * HD, H);
        snprintf(nm, sizeof nm, "blk.%u.ffn_norm.weight", l); T(nm, LLMEM_DTYPE_F16, 1, H, 1);
        snprintf(nm, sizeof nm, "blk.%u.ffn_gate.weight", l); T(nm, s->types[5], 2, H, s->ffn);
        snprintf(nm, sizeof nm, "blk.%u.ffn_down.weight", l); T(nm, s->types[6], 2, s->ffn, H);
        snprintf(nm, sizeof nm, "blk.%u.ffn_up.weight", l); T(nm, s->types[7], 2, H, s->ffn);
    }
    T("output_norm.weight", LLMEM_DTYPE_F32, 1, H, 1);
    if (!s->tied) T("output.weight", s->types[8], 2, H, s->vocab);
#undef T
    if (count) *count = n;
    assert_ok(llmem_gguf_write(w, path, false));
    llmem_gguf_writer_destroy(w);
}

static void dtypes(void **state)
{
    (void)state;
    assert_string_equal(llmem_dtype_name(LLMEM_DTYPE_F32), "f32");
    assert_string_equal(llmem_dtype_name(LLMEM_DTYPE_F16), "f16");
    assert_string_equal(llmem_dtype_name(LLMEM_DTYPE_Q4_0), "q4_0");
    assert_string_equal(llmem_dtype_name(LLMEM_DTYPE_Q8_0), "q8_0");
    assert_string_equal(llmem_dtype_name(LLMEM_DTYPE_BF16), "bf16");
    assert_string_equal(llmem_dtype_name(99), "?");
    assert_int_equal(llmem_dtype_bytes(LLMEM_DTYPE_F32, 10), 40);
    assert_int_equal(llmem_dtype_bytes(LLMEM_DTYPE_F16, 10), 20);
    assert_int_equal(llmem_dtype_bytes(LLMEM_DTYPE_BF16, 10), 20);
    assert_int_equal(llmem_dtype_bytes(LLMEM_DTYPE_Q8_0, 64), 68);
    assert_int_equal(llmem_dtype_bytes(LLMEM_DTYPE_Q4_0, 64), 36);
    assert_int_equal(llmem_dtype_bytes(LLMEM_DTYPE_Q8_0, 33), 0);
    assert_int_equal(llmem_dtype_bytes(99, 32), 0);
    assert_int_equal(llmem_dtype_bytes(LLMEM_DTYPE_F32, UINT64_MAX / 2), 0); /* overflow */
}

/* Every block type loads with each tensor's size checked: synth writes a
 * model of rows of 256 and 512 in the type; every matrix keeps it, with
 * the format's byte count; a file one byte short is refused. */
static void block_types_load(void **state)
{
    (void)state;
    static const uint32_t bt[] = {LLMEM_DTYPE_Q4_0, LLMEM_DTYPE_Q4_1, LLMEM_DTYPE_Q5_0, LLMEM_DTYPE_Q5_1,
                                  LLMEM_DTYPE_Q8_0, LLMEM_DTYPE_Q2_K, LLMEM_DTYPE_Q3_K, LLMEM_DTYPE_Q4_K,
                                  LLMEM_DTYPE_Q5_K, LLMEM_DTYPE_Q6_K};
    char path[512];
    test_tmp_file(path, sizeof path, "test-model");
    llmem_shape sh = {"blocks", 1, 256, 4, 4, 64, 512, 400, 64, 10000.0, 0};
    for (size_t i = 0; i < sizeof bt / sizeof bt[0]; i++) {
        llmem_synth_options so = {1, bt[i], NULL, false, NULL, NULL, 0};
        assert_ok(llmem_synth_gguf(&sh, &so, path));
        llmem_model *m;
        assert_ok(llmem_model_open(path, NULL, &m));
        assert_int_equal(llmem_model_get_config(m)->weight_type, bt[i]);
        for (size_t k = 0; k < llmem_model_tensor_count(m); k++) {
            const llmem_tensor *t = llmem_model_tensor_at(m, k);
            assert_int_equal(t->type, t->n_dims == 2 ? bt[i] : LLMEM_DTYPE_F32);
            assert_int_equal(t->bytes, llmem_dtype_bytes(t->type, t->n_elements));
        }
        llmem_model_close(m);
        struct stat sb;
        assert_int_equal(stat(path, &sb), 0);
        assert_int_equal(truncate(path, sb.st_size - 1), 0);
        assert_status(llmem_model_open(path, NULL, &m), LLMEM_EFORMAT);
        assert_true(strstr(llmem_error_message(), "output.weight") != NULL); /* the last tensor runs past the end */
    }
    unlink(path);
}

static void writer_round_trip(void **state)
{
    (void)state;
    char names[16][48];
    size_t n;
    const char *path = tmp_path("mixed.gguf");
    write_model(&mixed, path, names, &n);
    llmem_model *m;
    assert_ok(llmem_model_open(path, NULL, &m));
    const llmem_model_config *c = llmem_model_get_config(m);
    assert_int_equal(c->format, LLMEM_MODEL_GGUF);
    assert_int_equal(c->version, 3);
    assert_int_equal(c->shape.layers, 1);
    assert_int_equal(c->shape.hidden, H);
    assert_int_equal(c->shape.heads, HEADS);
    assert_int_equal(c->shape.kv_heads, KVH);
    assert_int_equal(c->shape.head_dim, HD);
    assert_int_equal(c->shape.ffn, FFN);
    assert_int_equal(c->shape.vocab, 8);
    assert_int_equal(c->shape.max_ctx, 128);
    assert_true(c->shape.rope_theta == 500000.0);
    assert_false(c->shape.tied_embeddings);
    assert_int_equal(c->rope_dim, 4);
    assert_true(c->norm_eps == 1e-6f);
    assert_int_equal(c->weight_type, LLMEM_DTYPE_Q8_0); /* 4 of the 9 matrices */
    assert_string_equal(c->shape.name, "tiny test model");

    /* Every tensor as written: name, order, dims, type, bytes, data. */
    assert_int_equal(llmem_model_tensor_count(m), n);
    static const uint32_t want_type[12] = {LLMEM_DTYPE_F32, LLMEM_DTYPE_F32, LLMEM_DTYPE_F16, LLMEM_DTYPE_Q8_0,
                                           LLMEM_DTYPE_BF16, LLMEM_DTYPE_Q8_0, LLMEM_DTYPE_F16, LLMEM_DTYPE_F16,
                                           LLMEM_DTYPE_Q8_0, LLMEM_DTYPE_BF16, LLMEM_DTYPE_F32, LLMEM_DTYPE_Q8_0};
    assert_int_equal(n, 12);
    uint8_t *want = malloc(1 << 16);
    for (size_t i = 0; i < n; i++) {
        const llmem_tensor *t = llmem_model_tensor_at(m, i), *u;
        assert_string_equal(t->name, names[i]);
        assert_ok(llmem_model_tensor(m, names[i], &u));
        assert_ptr_equal(t, u);
        assert_int_equal(t->type, want_type[i]);
        assert_int_equal(t->bytes, llmem_dtype_bytes(t->type, t->n_elements));
        assert_int_equal(t->offset % 32, 0);
        assert_int_equal((uintptr_t)t->data % 32, 0);
        fill_pattern(NULL, i, want, (size_t)t->bytes);
        assert_memory_equal(t->data, want, t->bytes);
    }
    free(want);
    const llmem_tensor *t;
    assert_ok(llmem_model_tensor(m, "blk.0.ffn_down.weight", &t));
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->dims[0], FFN);
    assert_int_equal(t->dims[1], H);
    assert_int_equal(t->dims[2], 1);
    assert_int_equal(t->n_elements, FFN * H);
    assert_int_equal(t->bytes, FFN * H / 32 * 34);
    assert_ok(llmem_model_tensor(m, "blk.0.attn_norm.weight", &t));
    assert_int_equal(t->n_dims, 1);
    assert_int_equal(t->dims[1], 1);
    assert_status(llmem_model_tensor(m, "blk.1.attn_q.weight", &t), LLMEM_ENOTFOUND);
    assert_error_mentions("blk.1.attn_q.weight");
    assert_null(t);

    /* Getters. */
    uint32_t u;
    float f;
    const char *s;
    size_t len;
    llmem_meta_array a;
    double d;
    assert_ok(llmem_model_meta_u32(m, "llama.block_count", &u));
    assert_int_equal(u, 1);
    assert_ok(llmem_model_meta_f32(m, "llama.rope.freq_base", &f));
    assert_true(f == 500000.0f);
    assert_ok(llmem_model_meta_str(m, "general.architecture", &s, &len));
    assert_int_equal(len, 5);
    assert_memory_equal(s, "llama", 5);
    assert_ok(llmem_model_meta_array(m, "tokenizer.ggml.tokens", &a));
    assert_int_equal(a.type, LLMEM_META_STRING);
    assert_int_equal(a.count, 8);
    for (uint64_t i = 0; i < 8; i++) {
        assert_ok(llmem_model_meta_array_str(m, "tokenizer.ggml.tokens", i, &s, &len));
        assert_int_equal(len, strlen(tokens[i]));
        assert_memory_equal(s, tokens[i], len);
        assert_ok(llmem_model_meta_array_num(m, "tokenizer.ggml.scores", i, &d));
        assert_true(d == (double)scores[i]);
        assert_ok(llmem_model_meta_array_num(m, "tokenizer.ggml.token_type", i, &d));
        assert_true(d == token_types[i]);
    }
    assert_ok(llmem_model_meta_array(m, "tokenizer.ggml.scores", &a));
    assert_int_equal(a.type, LLMEM_META_F32);
    assert_ok(llmem_model_meta_array(m, "tokenizer.ggml.token_type", &a));
    assert_int_equal(a.type, LLMEM_META_I32);
    /* Type mismatches, absent keys, ranges. */
    assert_status(llmem_model_meta_u32(m, "general.name", &u), LLMEM_EFORMAT);
    assert_error_mentions("general.name");
    assert_status(llmem_model_meta_f32(m, "llama.block_count", &f), LLMEM_EFORMAT);
    assert_status(llmem_model_meta_str(m, "llama.block_count", &s, &len), LLMEM_EFORMAT);
    assert_status(llmem_model_meta_array(m, "general.name", &a), LLMEM_EFORMAT);
    assert_status(llmem_model_meta_array_str(m, "tokenizer.ggml.scores", 0, &s, &len), LLMEM_EFORMAT);
    assert_status(llmem_model_meta_array_num(m, "tokenizer.ggml.tokens", 0, &d), LLMEM_EFORMAT);
    assert_status(llmem_model_meta_array_num(m, "general.name", 0, &d), LLMEM_EFORMAT);
    assert_status(llmem_model_meta_array_str(m, "tokenizer.ggml.tokens", 8, &s, &len), LLMEM_ERANGE);
    assert_status(llmem_model_meta_array_num(m, "tokenizer.ggml.scores", UINT64_MAX, &d), LLMEM_ERANGE);
    assert_status(llmem_model_meta_u32(m, "no.such.key", &u), LLMEM_ENOTFOUND);
    assert_error_mentions("no.such.key");
    assert_status(llmem_model_meta_f32(m, "no.such.key", &f), LLMEM_ENOTFOUND);
    assert_status(llmem_model_meta_str(m, "no.such.key", &s, &len), LLMEM_ENOTFOUND);
    assert_status(llmem_model_meta_array(m, "no.such.key", &a), LLMEM_ENOTFOUND);
    assert_status(llmem_model_meta_array_str(m, "no.such.key", 0, &s, &len), LLMEM_ENOTFOUND);
    assert_status(llmem_model_meta_array_num(m, "no.such.key", 0, &d), LLMEM_ENOTFOUND);
    assert_status(llmem_model_meta_u32(NULL, "llama.block_count", &u), LLMEM_EINVAL);
    assert_status(llmem_model_meta_u32(m, NULL, &u), LLMEM_EINVAL);
    assert_status(llmem_model_meta_u32(m, "llama.block_count", NULL), LLMEM_EINVAL);
    llmem_model_close(m);

    /* The same bytes through open_memory; and a tied variant. */
    size_t size;
    uint8_t *bytes = read_all(path, &size);
    assert_ok(llmem_model_open_memory(bytes, size, &m));
    check_model(m, bytes, size);
    assert_int_equal(llmem_model_tensor_count(m), n);
    llmem_model_close(m);
    free(bytes);
    spec tied = mixed;
    tied.tied = true;
    tied.layers = 3;
    write_model(&tied, tmp_path("tied.gguf"), NULL, &n);
    assert_ok(llmem_model_open(tmp_path("tied.gguf"), NULL, &m));
    assert_true(llmem_model_get_config(m)->shape.tied_embeddings);
    assert_int_equal(llmem_model_get_config(m)->shape.layers, 3);
    assert_int_equal(llmem_model_tensor_count(m), 2 + 9 * 3);
    assert_int_equal(llmem_model_get_config(m)->weight_type, LLMEM_DTYPE_Q8_0); /* 3 per layer */
    assert_status(llmem_model_tensor(m, "output.weight", &t), LLMEM_ENOTFOUND);
    llmem_model_close(m);
}

static void writer_refuses_bad_input(void **state)
{
    (void)state;
    llmem_gguf_writer *w;
    assert_status(llmem_gguf_writer_create(NULL), LLMEM_EINVAL);
    assert_ok(llmem_gguf_writer_create(&w));
    uint64_t dims[4] = {32, 2, 1, 1}, zero[2] = {32, 0}, big[2] = {1ull << 40, 1ull << 40}, odd[2] = {33, 1};
    assert_status(llmem_gguf_add_u32(NULL, "k", 1), LLMEM_EINVAL);
    assert_status(llmem_gguf_add_u32(w, NULL, 1), LLMEM_EINVAL);
    assert_status(llmem_gguf_add_u32(w, "", 1), LLMEM_EINVAL);
    assert_status(llmem_gguf_add_str(w, "k", NULL), LLMEM_EINVAL);
    assert_ok(llmem_gguf_add_u32(w, "k", 1));
    assert_status(llmem_gguf_add_f32(w, "k", 1), LLMEM_EINVAL);
    assert_error_mentions("duplicate");
    const char *with_null[2] = {"a", NULL};
    assert_status(llmem_gguf_add_str_array(w, "arr", with_null, 2), LLMEM_EINVAL);
    assert_status(llmem_gguf_add_f32_array(w, "arr", NULL, 2), LLMEM_EINVAL);
    assert_ok(llmem_gguf_add_i32_array(w, "empty", NULL, 0));
    assert_status(llmem_gguf_add_tensor(w, NULL, 0, 1, dims, fill_pattern, NULL), LLMEM_EINVAL);
    assert_status(llmem_gguf_add_tensor(w, "t", 0, 1, NULL, fill_pattern, NULL), LLMEM_EINVAL);
    assert_status(llmem_gguf_add_tensor(w, "t", 0, 1, dims, NULL, NULL), LLMEM_EINVAL);
    assert_status(llmem_gguf_add_tensor(w, "t", 0, 0, dims, fill_pattern, NULL), LLMEM_EINVAL);
    assert_error_mentions("n_dims");
    assert_status(llmem_gguf_add_tensor(w, "t", 0, 5, dims, fill_pattern, NULL), LLMEM_EINVAL);
    assert_status(llmem_gguf_add_tensor(w, "t", 0, 2, zero, fill_pattern, NULL), LLMEM_EINVAL);
    assert_error_mentions("dim 1 is 0");
    assert_status(llmem_gguf_add_tensor(w, "t", 99, 2, dims, fill_pattern, NULL), LLMEM_EINVAL);
    assert_error_mentions("99");
    assert_status(llmem_gguf_add_tensor(w, "t", LLMEM_DTYPE_Q8_0, 2, odd, fill_pattern, NULL), LLMEM_EINVAL);
    assert_status(llmem_gguf_add_tensor(w, "t", LLMEM_DTYPE_F32, 2, big, fill_pattern, NULL), LLMEM_EOVERFLOW);
    char longname[80];
    memset(longname, 'x', sizeof longname - 1);
    longname[79] = 0;
    assert_status(llmem_gguf_add_tensor(w, longname, 0, 1, dims, fill_pattern, NULL), LLMEM_EINVAL);
    assert_ok(llmem_gguf_add_tensor(w, "t", 0, 2, dims, fill_pattern, NULL));
    assert_status(llmem_gguf_add_tensor(w, "t", 0, 2, dims, fill_pattern, NULL), LLMEM_EINVAL);
    assert_error_mentions("duplicate");
    assert_status(llmem_gguf_write(w, NULL, false), LLMEM_EINVAL);
    assert_status(llmem_gguf_write(w, "/no/such/dir/x.gguf", false), LLMEM_EIO);
    assert_error_mentions("/no/such/dir/x.gguf");
    assert_error_mentions("No such file or directory");
    /* It writes after all those refusals: they left nothing behind. */
    assert_ok(llmem_gguf_write(w, tmp_path("refusals.gguf"), false));
    llmem_model *m;
    assert_status(llmem_model_open(tmp_path("refusals.gguf"), NULL, &m), LLMEM_EFORMAT); /* not llama */
    assert_error_mentions("general.architecture");
    size_t size;
    uint8_t *bytes = read_all(tmp_path("refusals.gguf"), &size);
    /* 24 header + 17 "k" + 29 "empty" + 41 info = 111, padded to 128; 256 of data. */
    assert_int_equal(size, 128 + 256);
    free(bytes);
    llmem_gguf_writer_destroy(w);
    llmem_gguf_writer_destroy(NULL);

    /* A failing fill leaves neither the file nor its temporary file. */
    assert_ok(llmem_gguf_writer_create(&w));
    for (int i = 0; i < 5; i++) {
        char nm[16];
        snprintf(nm, sizeof nm, "t%d", i);
        assert_ok(llmem_gguf_add_tensor(w, nm, 0, 1, dims, fill_fails, NULL));
    }
    assert_status(llmem_gguf_write(w, tmp_path("failed.gguf"), false), LLMEM_ENOMEM);
    assert_error_mentions("t3");
    struct stat sb;
    assert_int_equal(stat(tmp_path("failed.gguf"), &sb), -1);
    DIR *d = opendir(tmpdir); /* the temporary file, whatever its random name: gone */
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));)
        if (strstr(e->d_name, "failed.gguf")) fail_msg("left behind: %s", e->d_name);
    closedir(d);
    llmem_gguf_writer_destroy(w);
}

/* ---- hand-built GGUF ------------------------------------------------------ */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void b_put(buf *b, const void *p, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 256;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}
static void b_u8(buf *b, uint8_t v) { b_put(b, &v, 1); }
static void b_u16(buf *b, uint16_t v) { b_put(b, &v, 2); }
static void b_u32(buf *b, uint32_t v) { b_put(b, &v, 4); }
static void b_u64(buf *b, uint64_t v) { b_put(b, &v, 8); }
static void b_str(buf *b, const char *s)
{
    b_u64(b, strlen(s));
    b_put(b, s, strlen(s));
}

typedef struct rtensor {
    char name[64];
    uint32_t n_dims, type;
    uint64_t dims[4];
    uint64_t offset;
    bool fixed; /* offset given, not laid out */
} rtensor;

typedef struct raw {
    uint32_t version;
    buf kv;
    uint64_t n_kv;
    rtensor t[32];
    size_t nt;
} raw;

static void r_key(raw *r, const char *k, uint32_t type)
{
    b_str(&r->kv, k);
    b_u32(&r->kv, type);
    r->n_kv++;
}
static void r_u32(raw *r, const char *k, uint32_t v) { r_key(r, k, LLMEM_META_U32), b_u32(&r->kv, v); }
static void r_s(raw *r, const char *k, const char *v) { r_key(r, k, LLMEM_META_STRING), b_str(&r->kv, v); }

/* Set the u32 value of an existing key. */
static void r_patch(raw *r, const char *k, uint32_t v)
{
    size_t n = strlen(k);
    for (size_t i = 8; i + n + 8 <= r->kv.n; i++)
        if (memcmp(r->kv.p + i, k, n) == 0) {
            uint64_t len;
            memcpy(&len, r->kv.p + i - 8, 8);
            if (len != n) continue;
            memcpy(r->kv.p + i + n + 4, &v, 4);
            return;
        }
    fail_msg("no key %s", k);
}

static rtensor *r_tensor(raw *r, const char *name, uint32_t type, uint32_t nd, uint64_t d0, uint64_t d1)
{
    rtensor *t = &r->t[r->nt++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->type = type;
    t->n_dims = nd;
    t->dims[0] = d0;
    t->dims[1] = d1;
    t->dims[2] = t->dims[3] = 1;
    return t;
}

/* A minimal llama (hidden 8, 2 heads, 1 KV head, ffn 16, vocab 4, one
 * block; all f32) with its keys. */
static void r_llama(raw *r, uint32_t version, bool tied)
{
    memset(r, 0, sizeof *r);
    r->version = version;
    r_s(r, "general.architecture", "llama");
    r_u32(r, "llama.context_length", 64);
    r_u32(r, "llama.embedding_length", 8);
    r_u32(r, "llama.block_count", 1);
    r_u32(r, "llama.feed_forward_length", 16);
    r_u32(r, "llama.attention.head_count", 2);
    r_u32(r, "llama.attention.head_count_kv", 1);
    r_tensor(r, "token_embd.weight", 0, 2, 8, 4);
    r_tensor(r, "blk.0.attn_norm.weight", 0, 1, 8, 1);
    r_tensor(r, "blk.0.attn_q.weight", 0, 2, 8, 8);
    r_tensor(r, "blk.0.attn_k.weight", 0, 2, 8, 4);
    r_tensor(r, "blk.0.attn_v.weight", 0, 2, 8, 4);
    r_tensor(r, "blk.0.attn_output.weight", 0, 2, 8, 8);
    r_tensor(r, "blk.0.ffn_norm.weight", 0, 1, 8, 1);
    r_tensor(r, "blk.0.ffn_gate.weight", 0, 2, 8, 16);
    r_tensor(r, "blk.0.ffn_down.weight", 0, 2, 16, 8);
    r_tensor(r, "blk.0.ffn_up.weight", 0, 2, 8, 16);
    r_tensor(r, "output_norm.weight", 0, 1, 8, 1);
    if (!tied) r_tensor(r, "output.weight", 0, 2, 8, 4);
}

/* Header, metadata, infos (offsets laid out at 32 unless fixed), padding to
 * 32, data (each byte its offset's low bits). */
static buf r_build(const raw *r)
{
    buf b = {0};
    uint64_t at = 0, end = 0;
    uint64_t offs[32];
    for (size_t i = 0; i < r->nt; i++) {
        const rtensor *t = &r->t[i];
        uint64_t n = 1;
        for (uint32_t d = 0; d < t->n_dims && d < 4; d++) n *= t->dims[d];
        uint64_t bytes = llmem_dtype_bytes(t->type, n);
        if (bytes > (1u << 20)) bytes = 0; /* hostile dims: no data for them */
        offs[i] = t->fixed ? t->offset : at;
        if (!t->fixed) {
            at = (at + bytes + 31) & ~31ull;
            if (at > end) end = at;
        }
    }
    b_u32(&b, 0x46554747u);
    b_u32(&b, r->version);
    b_u64(&b, r->nt);
    b_u64(&b, r->n_kv);
    b_put(&b, r->kv.p, r->kv.n);
    for (size_t i = 0; i < r->nt; i++) {
        const rtensor *t = &r->t[i];
        b_str(&b, t->name);
        b_u32(&b, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims && d < 4; d++) b_u64(&b, t->dims[d]);
        b_u32(&b, t->type);
        b_u64(&b, offs[i]);
    }
    while (b.n % 32) b_u8(&b, 0);
    for (uint64_t i = 0; i < end; i++) b_u8(&b, (uint8_t)(i * 13 + 5));
    return b;
}

/* Build r and open it in memory; the expected status, and on failure a
 * message that mentions `mentions`. */
static void expect_raw(const raw *r, llmem_status want, const char *mentions)
{
    buf b = r_build(r);
    llmem_model *m;
    uint8_t *copy;
    llmem_status st = open_copy(b.p, b.n, &m, &copy);
    if (st != want) fail_msg("%s, expected %s (%s)", llmem_status_name(st), llmem_status_name(want), llmem_error_message());
    if (st) {
        assert_null(m);
        if (mentions && !strstr(llmem_error_message(), mentions))
            fail_msg("\"%s\" does not mention \"%s\"", llmem_error_message(), mentions);
    } else {
        check_model(m, copy, b.n);
        llmem_model_close(m);
    }
    free(copy);
    free(b.p);
}

/* Every scalar type, arrays of several kinds, nested arrays, in a v2 file. */
static void add_all_types(raw *r)
{
    r_key(r, "t.u8", LLMEM_META_U8), b_u8(&r->kv, 200);
    r_key(r, "t.i8", LLMEM_META_I8), b_u8(&r->kv, (uint8_t)-5);
    r_key(r, "t.u16", LLMEM_META_U16), b_u16(&r->kv, 60000);
    r_key(r, "t.i16", LLMEM_META_I16), b_u16(&r->kv, (uint16_t)-300);
    r_key(r, "t.u32", LLMEM_META_U32), b_u32(&r->kv, 4000000000u);
    r_key(r, "t.i32", LLMEM_META_I32), b_u32(&r->kv, (uint32_t)-7);
    float f = 2.5f;
    r_key(r, "t.f32", LLMEM_META_F32), b_put(&r->kv, &f, 4);
    r_key(r, "t.bool", LLMEM_META_BOOL), b_u8(&r->kv, 1);
    r_key(r, "t.u64", LLMEM_META_U64), b_u64(&r->kv, 123);
    r_key(r, "t.u64big", LLMEM_META_U64), b_u64(&r->kv, 1ull << 40);
    r_key(r, "t.i64", LLMEM_META_I64), b_u64(&r->kv, (uint64_t)-1);
    double dv = 0.125, dbig = 1e300;
    r_key(r, "t.f64", LLMEM_META_F64), b_put(&r->kv, &dv, 8);
    r_key(r, "t.f64big", LLMEM_META_F64), b_put(&r->kv, &dbig, 8);
    r_s(r, "t.str", "hello");
    r_key(r, "t.arr_u8", LLMEM_META_ARRAY), b_u32(&r->kv, LLMEM_META_U8), b_u64(&r->kv, 3);
    b_u8(&r->kv, 1), b_u8(&r->kv, 2), b_u8(&r->kv, 255);
    r_key(r, "t.arr_i64", LLMEM_META_ARRAY), b_u32(&r->kv, LLMEM_META_I64), b_u64(&r->kv, 2);
    b_u64(&r->kv, (uint64_t)-9), b_u64(&r->kv, 1ull << 53);
    r_key(r, "t.arr_f64", LLMEM_META_ARRAY), b_u32(&r->kv, LLMEM_META_F64), b_u64(&r->kv, 1);
    b_put(&r->kv, &dv, 8);
    r_key(r, "t.arr_bool", LLMEM_META_ARRAY), b_u32(&r->kv, LLMEM_META_BOOL), b_u64(&r->kv, 2);
    b_u8(&r->kv, 0), b_u8(&r->kv, 1);
    r_key(r, "t.arr_empty", LLMEM_META_ARRAY), b_u32(&r->kv, LLMEM_META_STRING), b_u64(&r->kv, 0);
    /* [[1, 2], [["x", "yy"]]]: arrays of arrays, nested twice. */
    r_key(r, "t.nested", LLMEM_META_ARRAY), b_u32(&r->kv, LLMEM_META_ARRAY), b_u64(&r->kv, 2);
    b_u32(&r->kv, LLMEM_META_U16), b_u64(&r->kv, 2), b_u16(&r->kv, 1), b_u16(&r->kv, 2);
    b_u32(&r->kv, LLMEM_META_ARRAY), b_u64(&r->kv, 1);
    b_u32(&r->kv, LLMEM_META_STRING), b_u64(&r->kv, 2), b_str(&r->kv, "x"), b_str(&r->kv, "yy");
    r_u32(r, "general.alignment", 32);
}

static void every_metadata_type(void **state)
{
    (void)state;
    raw r;
    r_llama(&r, 2, true);
    add_all_types(&r);
    buf b = r_build(&r);
    llmem_model *m;
    assert_ok(llmem_model_open_memory(b.p, b.n, &m));
    check_model(m, b.p, b.n);
    const llmem_model_config *c = llmem_model_get_config(m);
    assert_int_equal(c->version, 2);
    assert_string_equal(c->shape.name, "gguf"); /* no general.name */
    assert_int_equal(c->shape.head_dim, 4);
    assert_int_equal(c->rope_dim, 4);           /* default: head_dim */
    assert_true(c->shape.rope_theta == 10000.0);
    assert_true(c->norm_eps == 1e-5f);
    assert_int_equal(c->shape.vocab, 4);        /* from token_embd */
    assert_true(c->shape.tied_embeddings);
    assert_int_equal(c->weight_type, LLMEM_DTYPE_F32);
    uint32_t u;
    float f;
    double d;
    const char *s;
    size_t len;
    llmem_meta_array a;
    assert_ok(llmem_model_meta_u32(m, "t.u8", &u)); assert_int_equal(u, 200);
    assert_status(llmem_model_meta_u32(m, "t.i8", &u), LLMEM_EFORMAT); /* -5 does not fit */
    assert_error_mentions("-5");
    assert_ok(llmem_model_meta_u32(m, "t.u16", &u)); assert_int_equal(u, 60000);
    assert_status(llmem_model_meta_u32(m, "t.i16", &u), LLMEM_EFORMAT);
    assert_ok(llmem_model_meta_u32(m, "t.u32", &u)); assert_int_equal(u, 4000000000u);
    assert_status(llmem_model_meta_u32(m, "t.i32", &u), LLMEM_EFORMAT);
    assert_ok(llmem_model_meta_u32(m, "t.u64", &u)); assert_int_equal(u, 123);
    assert_status(llmem_model_meta_u32(m, "t.u64big", &u), LLMEM_EFORMAT);
    assert_error_mentions("1099511627776");
    assert_status(llmem_model_meta_u32(m, "t.i64", &u), LLMEM_EFORMAT);
    assert_status(llmem_model_meta_u32(m, "t.bool", &u), LLMEM_EFORMAT);
    assert_error_mentions("bool");
    assert_status(llmem_model_meta_u32(m, "t.f32", &u), LLMEM_EFORMAT);
    assert_ok(llmem_model_meta_f32(m, "t.f32", &f)); assert_true(f == 2.5f);
    assert_ok(llmem_model_meta_f32(m, "t.f64", &f)); assert_true(f == 0.125f);
    assert_status(llmem_model_meta_f32(m, "t.f64big", &f), LLMEM_EFORMAT);
    assert_status(llmem_model_meta_f32(m, "t.u8", &f), LLMEM_EFORMAT);
    assert_ok(llmem_model_meta_str(m, "t.str", &s, &len));
    assert_int_equal(len, 5);
    assert_memory_equal(s, "hello", 5);
    assert_ok(llmem_model_meta_u32(m, "general.alignment", &u)); assert_int_equal(u, 32);
    assert_ok(llmem_model_meta_array(m, "t.arr_u8", &a));
    assert_int_equal(a.type, LLMEM_META_U8);
    assert_int_equal(a.count, 3);
    assert_ok(llmem_model_meta_array_num(m, "t.arr_u8", 2, &d)); assert_true(d == 255);
    assert_ok(llmem_model_meta_array_num(m, "t.arr_i64", 0, &d)); assert_true(d == -9);
    assert_ok(llmem_model_meta_array_num(m, "t.arr_i64", 1, &d)); assert_true(d == 9007199254740992.0);
    assert_ok(llmem_model_meta_array_num(m, "t.arr_f64", 0, &d)); assert_true(d == 0.125);
    assert_ok(llmem_model_meta_array_num(m, "t.arr_bool", 1, &d)); assert_true(d == 1);
    assert_ok(llmem_model_meta_array(m, "t.arr_empty", &a));
    assert_int_equal(a.count, 0);
    assert_status(llmem_model_meta_array_str(m, "t.arr_empty", 0, &s, &len), LLMEM_ERANGE);
    assert_ok(llmem_model_meta_array(m, "t.nested", &a));
    assert_int_equal(a.type, LLMEM_META_ARRAY);
    assert_int_equal(a.count, 2);
    assert_status(llmem_model_meta_array_num(m, "t.nested", 0, &d), LLMEM_EFORMAT);
    assert_status(llmem_model_meta_array_str(m, "t.nested", 0, &s, &len), LLMEM_EFORMAT);
    llmem_model_close(m);
    free(b.p);
    free(r.kv.p);
}

/* ---- llama2.c ------------------------------------------------------------- */

/* A llama2.c file whose float k (from the first after the header) is k. */
static uint8_t *make_llama2c(int32_t dim, int32_t hidden, int32_t layers, int32_t heads, int32_t kv_heads,
                             int32_t vocab, int32_t seq, size_t *size)
{
    int64_t hs = dim / heads, v = vocab < 0 ? -vocab : vocab, kvd = kv_heads * hs;
    int64_t floats = v * dim + layers * (2 * dim + 2 * dim * dim + 2 * dim * kvd + 3 * dim * hidden) + dim +
                     seq * hs + (vocab < 0 ? v * dim : 0);
    *size = 28 + 4 * (size_t)floats;
    uint8_t *p = malloc(*size);
    assert_non_null(p);
    int32_t h[7] = {dim, hidden, layers, heads, kv_heads, vocab, seq};
    memcpy(p, h, 28);
    for (int64_t k = 0; k < floats; k++) {
        float f = (float)k;
        memcpy(p + 28 + 4 * k, &f, 4);
    }
    return p;
}

/* The first float of a tensor: its index in the file's float array. */
static float first(const llmem_model *m, const char *name)
{
    const llmem_tensor *t;
    assert_ok(llmem_model_tensor(m, name, &t));
    float f;
    memcpy(&f, t->data, 4);
    return f;
}

static void llama2c_layout(void **state)
{
    (void)state;
    /* dim 16, hidden 24, 2 layers, 4 heads (hs 4), 2 kv heads (kvd 8),
     * vocab 10, seq 6; floats laid out as run.c's memory_map_weights. */
    const int D = 16, F = 24, L = 2, V = 10, S = 6, KVD = 8;
    for (int untied = 0; untied < 2; untied++) {
        size_t size;
        uint8_t *p = make_llama2c(D, F, L, 4, 2, untied ? -V : V, S, &size);
        llmem_model *m;
        assert_ok(llmem_model_open_memory(p, size, &m));
        check_model(m, p, size);
        const llmem_model_config *c = llmem_model_get_config(m);
        assert_int_equal(c->format, LLMEM_MODEL_LLAMA2C);
        assert_int_equal(c->version, 0);
        assert_int_equal(c->shape.hidden, D);
        assert_int_equal(c->shape.ffn, F);
        assert_int_equal(c->shape.layers, L);
        assert_int_equal(c->shape.heads, 4);
        assert_int_equal(c->shape.kv_heads, 2);
        assert_int_equal(c->shape.head_dim, 4);
        assert_int_equal(c->shape.vocab, V);
        assert_int_equal(c->shape.max_ctx, S);
        assert_int_equal(c->shape.tied_embeddings, !untied);
        assert_int_equal(c->rope_dim, 4);
        assert_true(c->norm_eps == 1e-5f);
        assert_true(c->shape.rope_theta == 10000.0);
        assert_int_equal(c->weight_type, LLMEM_DTYPE_F32);
        assert_string_equal(c->shape.name, "llama2c");
        assert_int_equal(llmem_model_tensor_count(m), 2 + 9 * L + untied);
        /* run.c: each array follows the previous one. */
        float at = 0;
        assert_true(first(m, "token_embd.weight") == at), at += V * D;
        assert_true(first(m, "blk.0.attn_norm.weight") == at), assert_true(first(m, "blk.1.attn_norm.weight") == at + D);
        at += L * D;
        assert_true(first(m, "blk.0.attn_q.weight") == at), assert_true(first(m, "blk.1.attn_q.weight") == at + D * D);
        at += L * D * D;
        assert_true(first(m, "blk.1.attn_k.weight") == at + D * KVD), at += L * D * KVD;
        assert_true(first(m, "blk.1.attn_v.weight") == at + D * KVD), at += L * D * KVD;
        assert_true(first(m, "blk.1.attn_output.weight") == at + D * D), at += L * D * D;
        assert_true(first(m, "blk.1.ffn_norm.weight") == at + D), at += L * D;
        assert_true(first(m, "blk.1.ffn_gate.weight") == at + D * F), at += L * D * F;
        assert_true(first(m, "blk.1.ffn_down.weight") == at + D * F), at += L * D * F;
        assert_true(first(m, "blk.1.ffn_up.weight") == at + D * F), at += L * D * F;
        assert_true(first(m, "output_norm.weight") == at), at += D;
        at += S * 4; /* freq_cis_real, freq_cis_imag: seq * head_size / 2 each */
        const llmem_tensor *t;
        if (untied) {
            assert_true(first(m, "output.weight") == at);
            assert_ok(llmem_model_tensor(m, "output.weight", &t));
            assert_ptr_equal((const uint8_t *)t->data + t->bytes, p + size);
        } else {
            assert_status(llmem_model_tensor(m, "output.weight", &t), LLMEM_ENOTFOUND);
        }
        /* GGUF dims order. */
        assert_ok(llmem_model_tensor(m, "token_embd.weight", &t));
        assert_true(t->n_dims == 2 && t->dims[0] == (uint64_t)D && t->dims[1] == (uint64_t)V);
        assert_ok(llmem_model_tensor(m, "blk.0.attn_k.weight", &t));
        assert_true(t->dims[0] == (uint64_t)D && t->dims[1] == (uint64_t)KVD);
        assert_ok(llmem_model_tensor(m, "blk.0.attn_output.weight", &t));
        assert_true(t->dims[0] == (uint64_t)D && t->dims[1] == (uint64_t)D);
        assert_ok(llmem_model_tensor(m, "blk.0.ffn_gate.weight", &t));
        assert_true(t->dims[0] == (uint64_t)D && t->dims[1] == (uint64_t)F);
        assert_ok(llmem_model_tensor(m, "blk.0.ffn_down.weight", &t));
        assert_true(t->dims[0] == (uint64_t)F && t->dims[1] == (uint64_t)D && t->bytes == (uint64_t)F * D * 4);
        assert_ok(llmem_model_tensor(m, "blk.1.ffn_norm.weight", &t));
        assert_true(t->n_dims == 1 && t->dims[0] == (uint64_t)D && t->dims[1] == 1);
        uint32_t u;
        assert_status(llmem_model_meta_u32(m, "llama.block_count", &u), LLMEM_ENOTFOUND);
        assert_error_mentions("llama2.c");
        llmem_model_close(m);
        free(p);
    }
}

static void hostile_llama2c(void **state)
{
    (void)state;
    size_t size;
    uint8_t *good = make_llama2c(16, 24, 2, 4, 2, 10, 6, &size);
    static const struct {
        int field;
        int32_t value;
        const char *mentions;
    } bad[] = {
        {0, -16, "dim"}, {1, 0, "hidden_dim"}, {2, -1, "n_layers"}, {3, 0, "n_heads"}, {4, -2, "n_kv_heads"},
        {5, 0, "vocab_size"}, {5, INT32_MIN, "vocab_size"}, {6, -6, "seq_len"},
        {3, 3, "does not divide dim"},    /* 16 % 3 */
        {4, 3, "does not divide n_heads"}, /* 4 % 3 */
        {4, 8, "does not divide n_heads"}, /* more KV heads than heads */
        {3, 16, "even"},                   /* head size 1 */
        {2, INT32_MAX, "implies"},         /* size overflow or mismatch */
        {0, INT32_MAX, "n_heads"},
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        uint8_t *p = malloc(size);
        memcpy(p, good, size);
        memcpy(p + 4 * bad[i].field, &bad[i].value, 4);
        llmem_model *m;
        llmem_status st = llmem_model_open_memory(p, size, &m);
        if (st != LLMEM_EFORMAT || !strstr(llmem_error_message(), bad[i].mentions))
            fail_msg("case %zu: %s \"%s\", expected EFORMAT mentioning \"%s\"", i, llmem_status_name(st),
                     llmem_error_message(), bad[i].mentions);
        free(p);
    }
    /* One byte more or less than the header implies. */
    uint8_t *p = malloc(size + 1);
    memcpy(p, good, size);
    p[size] = 0;
    llmem_model *m;
    char want[64];
    snprintf(want, sizeof want, "expected %zu bytes", size);
    assert_status(llmem_model_open_memory(p, size + 1, &m), LLMEM_EFORMAT);
    assert_error_mentions(want);
    assert_status(llmem_model_open_memory(p, size - 1, &m), LLMEM_EFORMAT);
    assert_error_mentions(want);
    assert_status(llmem_model_open_memory(p, 27, &m), LLMEM_EFORMAT);
    assert_error_mentions("too short");
    assert_ok(llmem_model_open_memory(p, size, &m));
    llmem_model_close(m);
    free(p);
    free(good);
}

/* ---- hostile GGUF --------------------------------------------------------- */

static void hostile_gguf(void **state)
{
    (void)state;
    raw r;
    /* The baseline opens. */
    r_llama(&r, 3, false);
    expect_raw(&r, LLMEM_OK, NULL);
    free(r.kv.p);

#define CASE(setup, want, mentions)   \
    do {                              \
        r_llama(&r, 3, false);        \
        setup;                        \
        expect_raw(&r, want, mentions); \
        free(r.kv.p);                 \
    } while (0)
    CASE(r.version = 1, LLMEM_EFORMAT, "version 1 not supported");
    CASE(r.version = 4, LLMEM_EFORMAT, "version 4");
    CASE(r.t[2].n_dims = 0, LLMEM_EFORMAT, "n_dims 0");
    CASE((r.t[2].n_dims = 5, r.t[2].dims[2] = 1), LLMEM_EFORMAT, "n_dims 5");
    CASE(r.t[2].dims[1] = 0, LLMEM_EFORMAT, "dim 1 is 0");
    CASE((r.t[2].n_dims = 4, r.t[2].dims[0] = 1ull << 32, r.t[2].dims[1] = 1ull << 32, r.t[2].dims[2] = 2),
         LLMEM_EFORMAT, "overflows");
    CASE((r.t[2].fixed = true, r.t[2].offset = 36), LLMEM_EFORMAT, "not a multiple of the alignment");
    CASE((r.t[2].fixed = true, r.t[2].offset = 1u << 20), LLMEM_EFORMAT, "runs past the end");
    CASE((r.t[2].fixed = true, r.t[2].offset = UINT64_MAX & ~31ull), LLMEM_EFORMAT, "blk.0.attn_q.weight");
    CASE((r.t[3].fixed = true, r.t[3].offset = 128), LLMEM_EFORMAT, "overlap"); /* inside token_embd */
    CASE(snprintf(r.t[3].name, sizeof r.t[3].name, "blk.0.attn_q.weight"), LLMEM_EFORMAT, "duplicate tensor name");
    CASE(r.t[2].type = 99, LLMEM_EFORMAT, "unknown type 99");
    CASE(r.t[2].type = LLMEM_DTYPE_Q8_0, LLMEM_EFORMAT, "q8_0 blocks"); /* rows of 8 */
    CASE(r_u32(&r, "general.alignment", 0), LLMEM_EFORMAT, "alignment 0");
    CASE(r_u32(&r, "general.alignment", 3), LLMEM_EFORMAT, "alignment 3");
    /* Powers of two below 8: the specification wants a multiple of 8 (the
     * kernels would load misaligned floats at alignment 1, 2 or 4). */
    CASE(r_u32(&r, "general.alignment", 1), LLMEM_EFORMAT, "alignment 1 (offset");
    CASE(r_u32(&r, "general.alignment", 2), LLMEM_EFORMAT, "alignment 2 (offset");
    CASE(r_u32(&r, "general.alignment", 4), LLMEM_EFORMAT, "not a power of two of at least 8");
    CASE(r_s(&r, "general.alignment", "32"), LLMEM_EFORMAT, "general.alignment");
    CASE(r_u32(&r, "llama.context_length", 9), LLMEM_EFORMAT, "duplicate metadata key 'llama.context_length'");
    CASE(r_key(&r, "bad.type", 13), LLMEM_EFORMAT, "unknown value type 13");
    CASE((r_key(&r, "bad.arr", LLMEM_META_ARRAY), b_u32(&r.kv, 77), b_u64(&r.kv, 1)), LLMEM_EFORMAT,
         "unknown array element type 77");
    CASE(r.nt = 0, LLMEM_EFORMAT, "token_embd.weight");
    CASE(snprintf(r.t[3].name, sizeof r.t[3].name, "blk.0.attn_kk.weight"), LLMEM_EFORMAT, "blk.0.attn_k.weight");
    CASE(r.t[2].dims[1] = 4, LLMEM_EFORMAT, "blk.0.attn_q.weight");
    CASE(r.t[1].n_dims = 2, LLMEM_EFORMAT, "blk.0.attn_norm.weight");
    CASE(r.t[2].type = LLMEM_DTYPE_Q4_0, LLMEM_EFORMAT, "q4_0"); /* rows of 8 are not whole q4_0 blocks */
    CASE(r.t[2].type = LLMEM_DTYPE_Q5_1, LLMEM_EFORMAT, "q5_1 blocks of 32");
    CASE(r.t[2].type = LLMEM_DTYPE_Q4_K, LLMEM_EFORMAT, "q4_k blocks of 256");
    CASE(r.t[2].type = LLMEM_DTYPE_Q6_K, LLMEM_EFORMAT, "q6_k blocks of 256");
    CASE(r.t[2].type = 9, LLMEM_EFORMAT, "unknown type 9");  /* q8_1: an activation type, not in files */
    CASE(r.t[2].type = 15, LLMEM_EFORMAT, "unknown type 15"); /* q8_k, the same */
    CASE(r.t[1].type = LLMEM_DTYPE_BF16, LLMEM_ENOTSUP, "norm vectors");
    CASE(r_u32(&r, "llama.rope.dimension_count", 3), LLMEM_EFORMAT, "even");
    CASE(r_u32(&r, "llama.rope.dimension_count", 8), LLMEM_EFORMAT, "llama.rope.dimension_count");
    CASE(r_u32(&r, "llama.vocab_size", 5), LLMEM_EFORMAT, "token_embd.weight");
    CASE(r_s(&r, "general.name", "\x01\x02"), LLMEM_OK, NULL);
    CASE(r_s(&r, "general.name", ""), LLMEM_OK, NULL);
    CASE(r.n_kv = 4, LLMEM_EFORMAT, NULL); /* keys run into tensor infos */
    /* Architecture and llama keys. */
    CASE(memcpy(r.kv.p + 8 + strlen("general.architecture") + 4 + 8, "gpt2x", 5), LLMEM_ENOTSUP, "gpt2x");
    CASE(memcpy(r.kv.p + 8, "xeneral", 7), LLMEM_EFORMAT, "general.architecture");
    CASE(memcpy(r.kv.p + 8 + 20 + 4 + 8 + 5 + 8, "xxxxx", 5), LLMEM_EFORMAT, "llama.context_length");
    CASE(r_patch(&r, "llama.attention.head_count", 3), LLMEM_EFORMAT, "head_count 3 does not divide");
    CASE(r_patch(&r, "llama.attention.head_count_kv", 3), LLMEM_EFORMAT, "head_count_kv 3 does not divide");
    CASE(r_patch(&r, "llama.block_count", 2), LLMEM_EFORMAT, "blk.1.attn_norm.weight");
    CASE(r_patch(&r, "llama.block_count", 0), LLMEM_EFORMAT, "llama.block_count");
    CASE(r_patch(&r, "llama.embedding_length", 16), LLMEM_EFORMAT, "token_embd.weight");
#undef CASE

    /* Patched bytes in a built file. */
    r_llama(&r, 3, false);
    buf good = r_build(&r);
    free(r.kv.p);
    struct {
        size_t at;
        uint64_t value;
        int width;
        const char *mentions;
    } patch[] = {
        {8, 1ull << 63, 8, "tensor count"},
        {8, UINT64_MAX, 8, "tensor count"},
        {16, 1ull << 62, 8, "metadata count"},
        {24, UINT64_MAX, 8, "string length 18446744073709551615 exceeds the file"},
        {24, 1u << 30, 8, "offset 24"},
        {24 + 8 + 20 + 4, UINT64_MAX, 8, "string length 18446744073709551615 at offset 56"},
        {24 + 8 + 20, 9, 4, "array of"}, /* "llama" read as an array header: i32, a huge count */
        {24 + 8 + 20, 12, 4, "metadata key at offset 64"}, /* the string read as an f64, then "llama" as a key */
    };
    for (size_t i = 0; i < ARRAY_LEN(patch); i++) {
        uint8_t *p = malloc(good.n);
        memcpy(p, good.p, good.n);
        memcpy(p + patch[i].at, &patch[i].value, (size_t)patch[i].width);
        llmem_model *m;
        llmem_error_clear();
        llmem_status st = llmem_model_open_memory(p, good.n, &m);
        if (st == LLMEM_OK) fail_msg("patch %zu opened", i);
        if (st != LLMEM_EFORMAT || !strstr(llmem_error_message(), patch[i].mentions))
            fail_msg("patch %zu: %s \"%s\", expected EFORMAT mentioning \"%s\"", i, llmem_status_name(st),
                     llmem_error_message(), patch[i].mentions);
        free(p);
    }
    free(good.p);

    /* A huge array count and nesting beyond the bound. */
    memset(&r, 0, sizeof r);
    r.version = 3;
    r_key(&r, "huge", LLMEM_META_ARRAY), b_u32(&r.kv, LLMEM_META_U64), b_u64(&r.kv, 1ull << 61);
    expect_raw(&r, LLMEM_EFORMAT, "array of 2305843009213693952 u64");
    free(r.kv.p);
    memset(&r, 0, sizeof r);
    r.version = 3;
    r_key(&r, "huge", LLMEM_META_ARRAY), b_u32(&r.kv, LLMEM_META_STRING), b_u64(&r.kv, UINT64_MAX / 2);
    expect_raw(&r, LLMEM_EFORMAT, "array count 9223372036854775807");
    free(r.kv.p);
    memset(&r, 0, sizeof r);
    r.version = 3;
    r_key(&r, "deep", LLMEM_META_ARRAY);
    for (int i = 0; i < 20; i++) b_u32(&r.kv, LLMEM_META_ARRAY), b_u64(&r.kv, 1);
    b_u32(&r.kv, LLMEM_META_U8), b_u64(&r.kv, 0);
    expect_raw(&r, LLMEM_EFORMAT, "nested deeper");
    free(r.kv.p);

    /* Files too short for anything. */
    llmem_model *m;
    assert_status(llmem_model_open_memory("GGU", 3, &m), LLMEM_EFORMAT);
    assert_error_mentions("too short");
    assert_error_mentions("3 bytes");
    assert_status(llmem_model_open_memory("GGUF\3\0\0\0", 8, &m), LLMEM_EFORMAT);
    assert_error_mentions("too short");
    assert_status(llmem_model_open_memory("", 0, &m), LLMEM_EFORMAT);
    assert_error_mentions("0 bytes");
}

/* ---- truncation and bit flips ------------------------------------------- */

/* The end of the last tensor's data: a file cut anywhere before it is bad
 * (after it only padding goes). */
static size_t data_end(const uint8_t *p, size_t size)
{
    llmem_model *m;
    assert_ok(llmem_model_open_memory(p, size, &m));
    size_t end = 0;
    for (size_t i = 0; i < llmem_model_tensor_count(m); i++) {
        const llmem_tensor *t = llmem_model_tensor_at(m, i);
        if (t->offset + t->bytes > end) end = (size_t)(t->offset + t->bytes);
    }
    llmem_model_close(m);
    return end;
}

/* Every prefix (all below `dense`, then every stride-th) shorter than the
 * data's end fails cleanly with a message. */
static void truncate_all(const uint8_t *p, size_t whole, size_t stride, size_t dense)
{
    size_t size = memcmp(p, "GGUF", 4) == 0 ? data_end(p, whole) : whole;
    assert_true(size + 32 > whole);
    for (size_t n = 0; n < size; n += n < dense ? 1 : stride) {
        llmem_model *m;
        uint8_t *copy;
        llmem_status st = open_copy(p, n, &m, &copy);
        if (st != LLMEM_EFORMAT || !llmem_error_message()[0])
            fail_msg("truncated to %zu of %zu: %s \"%s\"", n, size, llmem_status_name(st), llmem_error_message());
        assert_null(m);
        free(copy);
    }
}

static void truncation(void **state)
{
    (void)state;
    const char *path = tmp_path("trunc.gguf");
    write_model(&mixed, path, NULL, NULL);
    size_t size;
    uint8_t *p = read_all(path, &size);
    truncate_all(p, size, 1, size);
    free(p);
    p = make_llama2c(16, 24, 2, 4, 2, -10, 6, &size);
    truncate_all(p, size, 1, size);
    free(p);
    raw r;
    r_llama(&r, 2, false);
    add_all_types(&r);
    buf b = r_build(&r);
    truncate_all(b.p, b.n, 1, b.n);
    free(b.p);
    free(r.kv.p);
    /* Through files too. */
    int fd = open(path, O_WRONLY | O_TRUNC);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "GG", 2), 2);
    close(fd);
    llmem_model *m;
    assert_status(llmem_model_open(path, NULL, &m), LLMEM_EFORMAT);
    assert_error_mentions("too short");
    assert_error_mentions("(2 bytes)");
    fd = open(path, O_WRONLY | O_TRUNC);
    close(fd);
    assert_status(llmem_model_open(path, NULL, &m), LLMEM_EFORMAT);
    assert_error_mentions("(0 bytes)");
}

/* The real ones: all of the GGUF header region, then a stride. */
static void truncation_real_models(void **state)
{
    (void)state;
    size_t size;
    uint8_t *p = read_all(MODEL("stories260K.gguf"), &size);
    assert_non_null(p);
    truncate_all(p, size, 4099, 16384);
    free(p);
    p = read_all(MODEL("stories260K.bin"), &size);
    assert_non_null(p);
    truncate_all(p, size, 4099, 512);
    free(p);
}

static size_t bit_flips_in(const uint8_t *good, size_t size, size_t region)
{
    size_t opened = 0;
    uint8_t *p = malloc(size);
    for (size_t bit = 0; bit < region * 8; bit++) {
        memcpy(p, good, size);
        p[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        llmem_model *m;
        llmem_error_clear();
        llmem_status st = llmem_model_open_memory(p, size, &m);
        if (st == LLMEM_OK) {
            check_model(m, p, size);
            llmem_model_close(m);
            opened++;
        } else if ((st != LLMEM_EFORMAT && st != LLMEM_ENOTSUP && st != LLMEM_ENOMEM) || !llmem_error_message()[0]) {
            fail_msg("bit %zu: %s \"%s\"", bit, llmem_status_name(st), llmem_error_message());
        }
    }
    free(p);
    return opened;
}

static void bit_flips(void **state)
{
    (void)state;
    raw r;
    r_llama(&r, 3, false);
    r_s(&r, "general.name", "flip");
    r_key(&r, "tokenizer.ggml.tokens", LLMEM_META_ARRAY), b_u32(&r.kv, LLMEM_META_STRING), b_u64(&r.kv, 4);
    for (int i = 0; i < 4; i++) b_str(&r.kv, "tok");
    buf b = r_build(&r);
    /* The header, metadata and tensor infos: everything before the data. */
    const llmem_tensor *t;
    llmem_model *m;
    assert_ok(llmem_model_open_memory(b.p, b.n, &m));
    assert_ok(llmem_model_tensor(m, "token_embd.weight", &t));
    size_t region = (size_t)t->offset;
    llmem_model_close(m);
    size_t opened = bit_flips_in(b.p, b.n, region);
    /* Flips in name bytes of general.name and the tokens keep it valid. */
    assert_true(opened > 0);
    free(b.p);
    free(r.kv.p);
    /* Every bit of a llama2.c header. */
    size_t size;
    uint8_t *p = make_llama2c(16, 24, 2, 4, 2, 10, 6, &size);
    bit_flips_in(p, size, 28);
    free(p);
}

/* A GGUF whose magic is one byte off is called a damaged GGUF, not read
 * as a llama2.c header (which complained about n_heads or hidden_dim). */
static void magic_one_byte_off(void **state)
{
    (void)state;
    const char *path = tmp_path("magic.gguf");
    write_model(&mixed, path, NULL, NULL);
    size_t size;
    uint8_t *p = read_all(path, &size);
    static const uint8_t repl[] = {0x00, 'g', 'X', 0xff};
    for (int i = 0; i < 4; i++)
        for (size_t k = 0; k < sizeof repl; k++) {
            uint8_t saved = p[i];
            p[i] = repl[k];
            llmem_model *m = (llmem_model *)1;
            assert_status(llmem_model_open_memory(p, size, &m), LLMEM_EFORMAT);
            assert_null(m);
            assert_error_mentions("one byte from GGUF's 'GGUF', a damaged GGUF file");
            assert_error_mentions("at offset 0");
            p[i] = saved;
        }
    free(p);
}

/* ---- the file under the mapping ------------------------------------------ */

typedef struct touch_arg {
    const volatile uint8_t *p;
    size_t n;
} touch_arg;

static void touch_all(void *arg)
{
    const touch_arg *a = arg;
    unsigned sum = 0;
    for (size_t i = 0; i < a->n; i++) sum += a->p[i];
    if (sum == 0xdeadbeef) printf("!");
}

/* The last tensor: its data ends nearest the end of the file. */
static const llmem_tensor *last_tensor(const llmem_model *m)
{
    const llmem_tensor *last = NULL;
    for (size_t i = 0; i < llmem_model_tensor_count(m); i++) {
        const llmem_tensor *t = llmem_model_tensor_at(m, i);
        if (!last || t->offset > last->offset) last = t;
    }
    assert_non_null(last);
    return last;
}

/* A mapped file truncated by someone else: check_file says so before a
 * touch would raise SIGBUS (shown in a child); the copy mode is immune. A
 * file rewritten in place, replaced or removed is told apart. */
static void file_changed_under_the_model(void **state)
{
    (void)state;
    const char *path = tmp_path("changing.gguf");
    write_model(&mixed, path, NULL, NULL);
    size_t size;
    uint8_t *orig = read_all(path, &size);
    llmem_model *mapped, *copied;
    llmem_model_options o = llmem_model_options_default();
    assert_false(o.copy);
    assert_ok(llmem_model_open(path, &o, &mapped));
    o.copy = true;
    assert_ok(llmem_model_open(path, &o, &copied));
    assert_ok(llmem_model_check_file(mapped));
    assert_ok(llmem_model_check_file(copied));
    const llmem_tensor *tm = last_tensor(mapped), *tc = last_tensor(copied);
    assert_memory_equal(tc->data, tm->data, tc->bytes); /* the same bytes either way */

    assert_int_equal(truncate(path, (off_t)(size / 2)), 0);
    assert_status(llmem_model_check_file(mapped), LLMEM_ECORRUPT);
    assert_error_mentions("truncated from");
    assert_error_mentions("SIGBUS");
    touch_arg ta = {tm->data, (size_t)tm->bytes};
    assert_true(test_child_faults(touch_all, &ta)); /* what check_file warned of */
    assert_ok(llmem_model_check_file(copied));       /* its own bytes */
    ta.p = tc->data;
    ta.n = (size_t)tc->bytes;
    assert_false(test_child_faults(touch_all, &ta));
    const uint8_t *want = NULL;
    for (size_t i = 0; i + tc->bytes <= size && !want; i++) /* the bytes at open, still */
        if (!memcmp(orig + i, tc->data, (size_t)tc->bytes)) want = orig + i;
    assert_non_null(want);
    llmem_model_close(mapped);

    /* Rewritten in place (same size, a new modification time). */
    write_all(path, orig, size);
    assert_ok(llmem_model_open(path, NULL, &mapped));
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    struct timespec later[2] = {{0, UTIME_OMIT}, {time(NULL) + 100, 0}};
    assert_int_equal(futimens(fd, later), 0);
    close(fd);
    assert_status(llmem_model_check_file(mapped), LLMEM_ECORRUPT);
    assert_error_mentions("modified in place");
    llmem_model_close(mapped);

    /* Replaced by a rename (how models should be deployed), then removed:
     * the old mapping is intact, the status says to reopen. */
    assert_ok(llmem_model_open(path, NULL, &mapped));
    const char *next = tmp_path("changing.next.gguf");
    write_all(next, orig, size);
    assert_int_equal(rename(next, path), 0);
    assert_status(llmem_model_check_file(mapped), LLMEM_ESTATE);
    assert_error_mentions("replaced");
    assert_int_equal(unlink(path), 0);
    assert_status(llmem_model_check_file(mapped), LLMEM_ESTATE);
    assert_error_mentions("removed");
    tm = last_tensor(mapped);
    ta.p = tm->data;
    ta.n = (size_t)tm->bytes;
    assert_false(test_child_faults(touch_all, &ta));
    llmem_model_close(mapped);
    llmem_model_close(copied);

    /* Memory models have no file; NULL is refused. */
    assert_ok(llmem_model_open_memory(orig, size, &mapped));
    assert_ok(llmem_model_check_file(mapped));
    llmem_model_close(mapped);
    assert_status(llmem_model_check_file(NULL), LLMEM_EINVAL);
    free(orig);
}

/* ---- the real models ------------------------------------------------------ */

static void shared_models(void **state)
{
    (void)state;
    llmem_model *bin, *gguf, *tiny;
    assert_ok(llmem_model_open(MODEL("stories260K.bin"), NULL, &bin));
    assert_ok(llmem_model_open(MODEL("stories260K.gguf"), NULL, &gguf));
    const llmem_model_config *a = llmem_model_get_config(bin), *b = llmem_model_get_config(gguf);
    assert_int_equal(a->shape.layers, 5);
    assert_int_equal(a->shape.hidden, 64);
    assert_int_equal(a->shape.heads, 8);
    assert_int_equal(a->shape.kv_heads, 4);
    assert_int_equal(a->shape.ffn, 172);
    assert_int_equal(a->shape.vocab, 512);
    assert_int_equal(a->shape.max_ctx, 512);
    assert_int_equal(b->shape.max_ctx, 2048);
    assert_int_equal(a->shape.layers, b->shape.layers);
    assert_int_equal(a->shape.hidden, b->shape.hidden);
    assert_int_equal(a->shape.heads, b->shape.heads);
    assert_int_equal(a->shape.kv_heads, b->shape.kv_heads);
    assert_int_equal(a->shape.head_dim, b->shape.head_dim);
    assert_int_equal(a->shape.ffn, b->shape.ffn);
    assert_int_equal(a->shape.vocab, b->shape.vocab);
    assert_true(a->shape.rope_theta == b->shape.rope_theta);
    assert_int_equal(a->rope_dim, b->rope_dim);
    assert_true(a->norm_eps == b->norm_eps);
    assert_int_equal(a->weight_type, b->weight_type);
    /* The .bin shares its classifier; the converter wrote output.weight
     * out as a copy of the embeddings, so the .gguf reads as untied. */
    assert_true(a->shape.tied_embeddings);
    assert_false(b->shape.tied_embeddings);
    assert_int_equal(llmem_model_tensor_count(gguf), 48);
    assert_int_equal(llmem_model_tensor_count(bin), 47);
    for (size_t i = 0; i < llmem_model_tensor_count(gguf); i++) {
        const llmem_tensor *g = llmem_model_tensor_at(gguf, i), *t;
        const char *name = strcmp(g->name, "output.weight") == 0 ? "token_embd.weight" : g->name;
        assert_ok(llmem_model_tensor(bin, name, &t));
        assert_int_equal(g->type, t->type);
        assert_int_equal(g->n_dims, t->n_dims);
        assert_memory_equal(g->dims, t->dims, sizeof g->dims);
        assert_int_equal(g->bytes, t->bytes);
        if (memcmp(g->data, t->data, g->bytes) != 0) fail_msg("tensor '%s' differs between .bin and .gguf", g->name);
    }
    size_t len;
    const char *s;
    assert_ok(llmem_model_meta_array_str(gguf, "tokenizer.ggml.tokens", 1, &s, &len));
    assert_int_equal(len, 3);
    assert_memory_equal(s, "<s>", 3);
    llmem_model_close(bin);
    llmem_model_close(gguf);

    assert_ok(llmem_model_open(MODEL("llama-2-tiny-random.gguf"), NULL, &tiny));
    const llmem_model_config *c = llmem_model_get_config(tiny);
    assert_int_equal(c->weight_type, LLMEM_DTYPE_F16);
    assert_int_equal(c->shape.hidden, 8);
    assert_int_equal(c->shape.layers, 1);
    assert_int_equal(c->shape.vocab, 32000);
    assert_int_equal(c->shape.max_ctx, 4096);
    assert_int_equal(c->shape.heads, 2);
    assert_int_equal(c->shape.head_dim, 4);
    assert_false(c->shape.tied_embeddings);
    assert_string_equal(c->shape.name, "LLaMA v2");
    /* All 32,000 tokens, O(1) each. */
    llmem_meta_array arr;
    assert_ok(llmem_model_meta_array(tiny, "tokenizer.ggml.tokens", &arr));
    assert_int_equal(arr.count, 32000);
    size_t total = 0;
    for (uint64_t i = 0; i < arr.count; i++) {
        assert_ok(llmem_model_meta_array_str(tiny, "tokenizer.ggml.tokens", i, &s, &len));
        total += len;
    }
    assert_true(total > 32000);
    llmem_model_stats st = {0};
    assert_ok(llmem_model_get_stats(tiny, &st));
    assert_int_equal(st.tensors, 12);
    assert_int_equal(st.file_bytes, 1750560);
    llmem_model_close(tiny);
}

/* ---- mapping ------------------------------------------------------------ */

static size_t count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    size_t n = 0;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

/* Whether /proc/self/maps names the file. */
static bool mapped(const char *path)
{
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[4096];
    bool found = false;
    while (fgets(line, sizeof line, f))
        if (strstr(line, path)) found = true;
    fclose(f);
    return found;
}

static void mapping_options(void **state)
{
    (void)state;
    spec big = mixed;
    big.vocab = 8192; /* a 1 MiB embedding, a 272 KiB q8_0 classifier */
    const char *path = tmp_path("big.gguf");
    write_model(&big, path, NULL, NULL);
    llmem_model_options o = llmem_model_options_default();
    assert_false(o.shared || o.populate || o.sequential || o.hugepage || o.mlock || o.progress);
    o.shared = o.populate = o.sequential = o.hugepage = true;
    llmem_model *m, *m2;
    assert_ok(llmem_model_open(path, &o, &m));
    llmem_model_stats st = {0};
    assert_ok(llmem_model_get_stats(m, &st));
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    assert_true(st.tensor_bytes > (1u << 20));
    assert_true(st.resident_bytes + page >= st.tensor_bytes);
    assert_true(st.mapped_bytes >= st.file_bytes && st.mapped_bytes % page == 0);
    assert_true(st.open_seconds >= 0 && st.open_seconds < 60);
    assert_ok(llmem_model_advise(m, MADV_WILLNEED));
    assert_ok(llmem_model_advise(m, MADV_SEQUENTIAL));
    assert_ok(llmem_model_advise(m, MADV_RANDOM));
    assert_ok(llmem_model_advise(m, MADV_DONTNEED));
    assert_status(llmem_model_advise(m, 12345), LLMEM_EINVAL);
    assert_status(llmem_model_advise(NULL, MADV_WILLNEED), LLMEM_EINVAL);
    /* Two shared opens read the same bytes. */
    assert_ok(llmem_model_open(path, &o, &m2));
    assert_int_equal(llmem_model_tensor_count(m), llmem_model_tensor_count(m2));
    for (size_t i = 0; i < llmem_model_tensor_count(m); i++) {
        const llmem_tensor *a = llmem_model_tensor_at(m, i), *b = llmem_model_tensor_at(m2, i);
        assert_string_equal(a->name, b->name);
        assert_ptr_not_equal(a->data, b->data);
        assert_memory_equal(a->data, b->data, a->bytes);
    }
    llmem_model_close(m2);
    llmem_model_close(m);
    assert_false(mapped(path));

    /* mlock: works, or the rlimit says no. */
    o = llmem_model_options_default();
    o.mlock = true;
    o.progress = true; /* under 100 MB: no progress line */
    llmem_status s = llmem_model_open(path, &o, &m);
    if (s == LLMEM_OK) {
        assert_ok(llmem_model_get_stats(m, &st));
        assert_true(st.resident_bytes + page >= st.file_bytes);
        llmem_model_close(m);
    } else {
        assert_status(s, LLMEM_EPERM);
        assert_error_mentions("RLIMIT_MEMLOCK");
        print_message("mlock refused here: %s\n", llmem_error_message());
    }
    assert_false(mapped(path));

    /* Memory models: no mapping, advise is a no-op. */
    size_t size;
    uint8_t *bytes = read_all(path, &size);
    assert_ok(llmem_model_open_memory(bytes, size, &m));
    assert_ok(llmem_model_advise(m, MADV_WILLNEED));
    assert_ok(llmem_model_get_stats(m, &st));
    assert_int_equal(st.mapped_bytes, 0);
    assert_int_equal(st.file_bytes, size);
    llmem_model_close(m);
    free(bytes);
    llmem_model_close(NULL);
}

static void no_leaks(void **state)
{
    (void)state;
    char good[256], bad[256], bin[256], absent[256];
    snprintf(good, sizeof good, "%s", tmp_path("leak.gguf"));
    snprintf(bad, sizeof bad, "%s", tmp_path("leak_bad.gguf"));
    snprintf(bin, sizeof bin, "%s", tmp_path("leak.bin"));
    snprintf(absent, sizeof absent, "%s", tmp_path("absent.gguf"));
    write_model(&mixed, good, NULL, NULL);
    size_t size;
    uint8_t *p = read_all(good, &size);
    write_all(bad, p, size - 64); /* into the last tensor's data */
    free(p);
    p = make_llama2c(16, 24, 2, 4, 2, 10, 6, &size);
    write_all(bin, p, size);
    free(p);
    size_t before = count_fds();
    llmem_model_options o = llmem_model_options_default();
    for (int i = 0; i < 50; i++) {
        llmem_model *m;
        o.shared = i & 1;
        o.populate = i & 2;
        assert_ok(llmem_model_open(good, &o, &m));
        llmem_model_close(m);
        assert_ok(llmem_model_open(bin, &o, &m));
        llmem_model_close(m);
        assert_status(llmem_model_open(bad, &o, &m), LLMEM_EFORMAT);
        assert_null(m);
        assert_status(llmem_model_open(absent, &o, &m), LLMEM_EIO);
        assert_status(llmem_model_open(tmpdir, &o, &m), LLMEM_EIO);
        assert_error_mentions("not a regular file");
    }
    assert_int_equal(count_fds(), before);
    assert_false(mapped(good));
    assert_false(mapped(bad));
    assert_false(mapped(bin));
    llmem_model *m = (llmem_model *)1;
    assert_status(llmem_model_open(NULL, NULL, &m), LLMEM_EINVAL);
    assert_status(llmem_model_open(good, NULL, NULL), LLMEM_EINVAL);
    assert_status(llmem_model_open_memory(NULL, 10, &m), LLMEM_EINVAL);
    assert_null(m);
    assert_status(llmem_model_tensor(NULL, "x", NULL), LLMEM_EINVAL);
    assert_status(llmem_model_get_stats(NULL, NULL), LLMEM_EINVAL);
    assert_null(llmem_model_get_config(NULL));
    assert_int_equal(llmem_model_tensor_count(NULL), 0);
    assert_null(llmem_model_tensor_at(NULL, 0));
}

static void stats_export(void **state)
{
    (void)state;
    const char *path = tmp_path("stats.gguf");
    write_model(&mixed, path, NULL, NULL);
    llmem_model *m;
    assert_ok(llmem_model_open(path, NULL, &m));
    llmem_model_stats st = {0};
    assert_ok(llmem_model_get_stats(m, &st));
    assert_int_equal(st.struct_size, sizeof st);
    assert_int_equal(st.tensors, 12);
    const llmem_stats_schema *schema = llmem_model_stats_schema();
    assert_string_equal(schema->name, "model");
    assert_int_equal(schema->struct_size, sizeof st);
    llmem_exporter *ex;
    assert_ok(llmem_exporter_create(LLMEM_EXPORT_PROMETHEUS, &ex));
    llmem_label lb[] = {{"model", "mixed"}};
    assert_ok(llmem_exporter_add(ex, schema, &st, lb, 1));
    char text[4096], want[128];
    assert_ok(llmem_exporter_render(ex, text, sizeof text, NULL));
    snprintf(want, sizeof want, "llmem_model_tensor_bytes{model=\"mixed\"} %llu\n", (unsigned long long)st.tensor_bytes);
    assert_non_null(strstr(text, want));
    assert_non_null(strstr(text, "llmem_model_tensors{model=\"mixed\"} 12\n"));
    assert_non_null(strstr(text, "# TYPE llmem_model_open_seconds gauge"));
    llmem_exporter_destroy(ex);
    assert_ok(llmem_stats_to_json(schema, &st, NULL, 0, text, sizeof text, NULL));
    snprintf(want, sizeof want, "\"file_bytes\":%llu", (unsigned long long)st.file_bytes);
    assert_non_null(strstr(text, want));
    /* An older caller's struct: only what fits is written. */
    struct {
        size_t struct_size;
        uint64_t file_bytes;
        uint64_t guard;
    } old = {sizeof(size_t) + sizeof(uint64_t), 0, 0xABABABABABABABABull};
    assert_ok(llmem_model_get_stats(m, (llmem_model_stats *)(void *)&old));
    assert_int_equal(old.file_bytes, st.file_bytes);
    assert_true(old.guard == 0xABABABABABABABABull);
    llmem_model_close(m);
}

/* ---- fuzz seeds ------------------------------------------------------------ */

static void write_seeds(const char *dir)
{
    snprintf(tmpdir, sizeof tmpdir, "%s", dir);
    spec s = mixed;
    s.ffn = 32; /* under 16 KiB */
    write_model(&s, tmp_path("llama_v3_mixed.gguf"), NULL, NULL);
    s.tied = true;
    write_model(&s, tmp_path("llama_v3_tied.gguf"), NULL, NULL);
    raw r;
    r_llama(&r, 2, false);
    add_all_types(&r);
    buf b = r_build(&r);
    write_all(tmp_path("llama_v2_all_types.gguf"), b.p, b.n);
    free(b.p);
    free(r.kv.p);
    size_t size;
    uint8_t *q = make_llama2c(16, 24, 1, 4, 2, 10, 6, &size);
    write_all(tmp_path("llama2c_tied.bin"), q, size);
    free(q);
    q = make_llama2c(8, 16, 1, 2, 1, -6, 4, &size);
    write_all(tmp_path("llama2c_untied.bin"), q, size);
    free(q);
    /* The qwen2 arch with its biases and a sliding window (16 KiB). */
    llmem_shape qs = {"seed-qwen2", 1, 8, 2, 1, 4, 16, 260, 16, 1000000.0, 1};
    llmem_synth_options so = {1, LLMEM_DTYPE_F32, NULL, false, NULL, "qwen2", 4};
    assert_ok(llmem_synth_gguf(&qs, &so, tmp_path("qwen2_window.gguf")));
    fprintf(stderr, "seeds written to %s\n", dir);
}

int main(int argc, char **argv)
{
    const char *seeds = getenv("LLMEM_WRITE_MODEL_SEEDS");
    if (seeds) {
        write_seeds(seeds);
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dtypes),
        cmocka_unit_test(block_types_load),
        cmocka_unit_test(writer_round_trip),
        cmocka_unit_test(writer_refuses_bad_input),
        cmocka_unit_test(every_metadata_type),
        cmocka_unit_test(llama2c_layout),
        cmocka_unit_test(hostile_llama2c),
        cmocka_unit_test(hostile_gguf),
        cmocka_unit_test(truncation),
        cmocka_unit_test(bit_flips),
        cmocka_unit_test(mapping_options),
        cmocka_unit_test(file_changed_under_the_model),
        cmocka_unit_test(magic_one_byte_off),
        cmocka_unit_test(no_leaks),
        cmocka_unit_test(stats_export),
    };
    /* The real models of the shared folder (test_model_shared). */
    const struct CMUnitTest shared_tests[] = {
        cmocka_unit_test(truncation_real_models),
        cmocka_unit_test(shared_models),
    };
    return test_main(argc, argv, "test_model", TEST_GROUP(tests, make_tmpdir, remove_tmpdir),
                     TEST_GROUP(shared_tests, make_tmpdir, remove_tmpdir),
                     (const char *const[]){"models/stories260K.bin", "models/stories260K.gguf",
                                           "models/llama-2-tiny-random.gguf", NULL});
}
