/*
 * test_shape.c - model shapes: presets, their sizes against published
 * parameter counts, config.json parsing (good and bad), and the tiny preset
 * against the real checkpoint's header in ../shared/models.
 */
#include "test_util.h"

static void presets_have_published_sizes(void **state)
{
    (void)state;
    llmem_shape s;
    assert_ok(llmem_shape_preset("llama-2-7b", &s));
    assert_int_equal(s.layers, 32);
    assert_int_equal(s.hidden, 4096);
    assert_int_equal(s.kv_heads, 32);
    assert_int_equal(s.head_dim, 128);
    assert_int_equal(s.max_ctx, 4096);
    /* 6,738,415,616 parameters (the published count of Llama-2-7B). */
    assert_int_equal(llmem_shape_params(&s), 6738415616ull);
    /* f16 KV: 2 (K,V) * 32 layers * 32 heads * 128 dims * 2 bytes = 512 KiB per token. */
    assert_int_equal(llmem_shape_kv_bytes_per_token(&s, 2), 512 * 1024);

    assert_ok(llmem_shape_preset("llama-2-13b", &s));
    assert_int_equal(llmem_shape_params(&s), 13015864320ull);
    assert_int_equal(llmem_shape_kv_bytes_per_token(&s, 2), 2ull * 40 * 40 * 128 * 2);

    assert_ok(llmem_shape_preset("yi-coder-1.5b", &s));
    uint64_t p = llmem_shape_params(&s);
    assert_true(p > 1400000000ull && p < 1600000000ull); /* "1.5B" */
    assert_int_equal(s.max_ctx, 131072);

    assert_ok(llmem_shape_preset("stories260k", &s));
    assert_int_equal(s.kv_heads, 4);
    assert_int_equal(s.heads, 8);
    assert_int_equal(s.head_dim, 8);
    assert_true(s.tied_embeddings);
    /* GQA: KV per token is kv_heads * head_dim, not hidden. */
    assert_int_equal(llmem_shape_kv_bytes_per_token(&s, 4), 2ull * 5 * 4 * 8 * 4);

    /* llama-2-tiny-random.gguf's metadata: context 4096, embedding 8, one
     * block, ffn 32, 2 heads, an untied output matrix (its tensors hold
     * 513,048 parameters). */
    assert_ok(llmem_shape_preset("tiny-random", &s));
    assert_int_equal(s.max_ctx, 4096);
    assert_false(s.tied_embeddings);
    assert_int_equal(llmem_shape_params(&s), 513048);

    /* Every listed name loads and is self-consistent. */
    const char *const *names = llmem_shape_preset_names();
    size_t n = 0;
    for (; names[n]; n++) {
        assert_ok(llmem_shape_preset(names[n], &s));
        assert_string_equal(s.name, names[n]);
        assert_true(s.layers > 0 && s.heads > 0 && s.kv_heads > 0 && s.heads % s.kv_heads == 0);
        assert_true(s.head_dim > 0 && s.vocab > 0 && s.max_ctx > 0 && s.ffn > 0);
        assert_true(llmem_shape_params(&s) > 0);
    }
    assert_true(n >= 6);
}

static void unknown_preset_and_nulls(void **state)
{
    (void)state;
    llmem_shape s;
    assert_status(llmem_shape_preset("gpt-5", &s), LLMEM_ENOTFOUND);
    assert_error_mentions("llama-2-7b"); /* the message lists what exists */
    assert_status(llmem_shape_preset(NULL, &s), LLMEM_EINVAL);
    assert_status(llmem_shape_preset("llama-2-7b", NULL), LLMEM_EINVAL);
    assert_status(llmem_shape_from_json(NULL, 0, &s), LLMEM_EINVAL);
    assert_status(llmem_shape_load(NULL, &s), LLMEM_EINVAL);
    assert_status(llmem_shape_load("/no/such/dir/config.json", &s), LLMEM_EIO);
    assert_int_equal(llmem_shape_params(NULL), 0);
    assert_int_equal(llmem_shape_kv_bytes_per_token(NULL, 2), 0);
}

/* A Mistral-7B-style config: grouped-query attention, explicit theta. */
static const char mistral_json[] =
    "{\"_name_or_path\": \"mistral-7b\", \"architectures\": [\"MistralForCausalLM\"],"
    " \"hidden_size\": 4096, \"intermediate_size\": 14336, \"num_attention_heads\": 32,"
    " \"num_hidden_layers\": 32, \"num_key_value_heads\": 8, \"vocab_size\": 32000,"
    " \"max_position_embeddings\": 32768, \"rope_theta\": 1000000.0, \"tie_word_embeddings\": false,"
    " \"torch_dtype\": \"bfloat16\"}";

static void config_json_good(void **state)
{
    (void)state;
    llmem_shape s;
    /* Not NUL-terminated: the length bounds the parse. */
    char buf[sizeof mistral_json + 8];
    memcpy(buf, mistral_json, sizeof mistral_json - 1);
    memset(buf + sizeof mistral_json - 1, '}', 9);
    assert_ok(llmem_shape_from_json(buf, sizeof mistral_json - 1, &s));
    assert_string_equal(s.name, "mistral-7b");
    assert_int_equal(s.layers, 32);
    assert_int_equal(s.kv_heads, 8);
    assert_int_equal(s.head_dim, 128);
    assert_int_equal(s.ffn, 14336);
    assert_int_equal(s.max_ctx, 32768);
    assert_true(s.rope_theta == 1e6);
    assert_false(s.tied_embeddings);
    assert_int_equal(llmem_shape_kv_bytes_per_token(&s, 2), 2ull * 32 * 8 * 128 * 2);
    /* 7,241,732,096: Mistral-7B's published count. */
    assert_int_equal(llmem_shape_params(&s), 7241732096ull);

    /* Optional fields default: kv_heads = heads, head_dim = hidden/heads. */
    const char *minimal = "{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
                          " \"intermediate_size\": 128, \"vocab_size\": 100}";
    assert_ok(llmem_shape_from_json(minimal, strlen(minimal), &s));
    assert_int_equal(s.kv_heads, 4);
    assert_int_equal(s.head_dim, 16);
    assert_true(s.max_ctx > 0);

    /* From a file, by path. */
    char path[] = "/tmp/llmem-shape-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, mistral_json, sizeof mistral_json - 1), (ssize_t)(sizeof mistral_json - 1));
    close(fd);
    llmem_shape f;
    assert_ok(llmem_shape_load(path, &f));
    assert_int_equal(f.kv_heads, 8);
    unlink(path);
    /* A preset by name through the same call. */
    assert_ok(llmem_shape_load("llama-2-13b", &f));
    assert_int_equal(f.layers, 40);
}

static void config_json_bad(void **state)
{
    (void)state;
    static const struct {
        const char *json, *mentions;
    } bad[] = {
        {"", "not valid JSON"},
        {"{\"hidden_size\": 4096", "not valid JSON"},
        {"[1, 2, 3]", "not an object"},
        {"{\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"intermediate_size\": 8, \"vocab_size\": 9}",
         "hidden_size"},
        {"{\"hidden_size\": -64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"intermediate_size\": 8,"
         " \"vocab_size\": 9}",
         "hidden_size"},
        {"{\"hidden_size\": \"64\", \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"intermediate_size\": 8,"
         " \"vocab_size\": 9}",
         "hidden_size"},
        {"{\"hidden_size\": 64.5, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"intermediate_size\": 8,"
         " \"vocab_size\": 9}",
         "hidden_size"},
        {"{\"hidden_size\": 64, \"num_hidden_layers\": 1e12, \"num_attention_heads\": 4, \"intermediate_size\": 8,"
         " \"vocab_size\": 9}",
         "num_hidden_layers"},
        {"{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 5, \"intermediate_size\": 8,"
         " \"vocab_size\": 9}",
         "divide"},
        {"{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 3,"
         " \"intermediate_size\": 8, \"vocab_size\": 9}",
         "num_key_value_heads"},
        {"{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"intermediate_size\": 8,"
         " \"vocab_size\": 9, \"rope_theta\": -1}",
         "rope_theta"},
        {"{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"intermediate_size\": 8,"
         " \"vocab_size\": 9, \"tie_word_embeddings\": 3}",
         "tie_word_embeddings"},
        {"{\"hidden_size\": 64, \"num_hidden_layers\": 0, \"num_attention_heads\": 4, \"intermediate_size\": 8,"
         " \"vocab_size\": 9}",
         "num_hidden_layers"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        llmem_shape s;
        memset(&s, 0x5a, sizeof s);
        llmem_status st = llmem_shape_from_json(bad[i].json, strlen(bad[i].json), &s);
        if (st != LLMEM_EFORMAT)
            fail_msg("case %zu: %s, expected EFORMAT (%s)", i, llmem_status_name(st), llmem_error_message());
        if (!strstr(llmem_error_message(), bad[i].mentions))
            fail_msg("case %zu: \"%s\" does not mention \"%s\"", i, llmem_error_message(), bad[i].mentions);
    }
}

/* Checked sizes: the same figures as the plain functions, and a shape
 * whose counts do not fit 64 bits is LLMEM_EOVERFLOW, not a wrapped number. */
static void sizes_are_overflow_checked(void **state)
{
    (void)state;
    llmem_shape s;
    uint64_t params = 0, kv = 0;
    static const char *const presets[] = {"llama-2-7b", "llama-2-13b", "yi-coder-1.5b", "tiny-15m", "stories260k"};
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        assert_ok(llmem_shape_preset(presets[i], &s));
        assert_ok(llmem_shape_sizes(&s, 2, &params, &kv));
        assert_int_equal(params, llmem_shape_params(&s));
        assert_int_equal(kv, llmem_shape_kv_bytes_per_token(&s, 2));
    }
    assert_ok(llmem_shape_sizes(&s, 2, NULL, NULL));
    assert_status(llmem_shape_sizes(NULL, 2, &params, &kv), LLMEM_EINVAL);
    /* The largest shape a config.json may give: 9.3e18 parameters still
     * fit (their bytes do not: cli_plan_overflow_weights); 2^32 - 1 such
     * layers do not. */
    static const char huge[] = "{\"hidden_size\": 1048576, \"num_hidden_layers\": 4096, \"num_attention_heads\": 8192,"
                               " \"head_dim\": 65536, \"intermediate_size\": 4194304, \"vocab_size\": 16777216}";
    assert_ok(llmem_shape_from_json(huge, sizeof huge - 1, &s));
    assert_ok(llmem_shape_sizes(&s, 2, &params, NULL));
    assert_int_equal(params, 9277450425346293760ull);
    s.layers = UINT32_MAX;
    params = kv = 7;
    assert_status(llmem_shape_sizes(&s, 2, &params, &kv), LLMEM_EOVERFLOW);
    assert_error_mentions("parameter count overflows 64 bits");
    assert_int_equal(params, 7); /* untouched */
    /* KV per token alone: 2 x 2^32 layers x 2^32 heads overflows. */
    memset(&s, 0, sizeof s);
    s.layers = s.kv_heads = s.heads = UINT32_MAX;
    s.head_dim = 2;
    s.hidden = s.ffn = s.vocab = 1;
    assert_status(llmem_shape_sizes(&s, 4, NULL, &kv), LLMEM_EOVERFLOW);
    /* The engine's step plan of such a shape says so too. */
    llmem_plan_result r;
    assert_ok(llmem_shape_preset("llama-2-7b", &s));
    s.hidden = s.ffn = UINT32_MAX;
    assert_status(llmem_engine_plan_step(&s, UINT32_MAX, 1, 4096, 2, &r), LLMEM_EOVERFLOW);
    assert_error_mentions("overflows the address space");
}

/* The stories260k preset matches the real checkpoint: llama2.c's header is
 * seven int32: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab, seq_len. */
static void tiny_preset_matches_checkpoint(void **state)
{
    (void)state;
    FILE *f = fopen(test_shared_path("models/stories260K.bin"), "rb");
    assert_non_null(f);
    int32_t h[7];
    assert_int_equal(fread(h, sizeof h, 1, f), 1);
    fclose(f);
    llmem_shape s;
    assert_ok(llmem_shape_preset("stories260k", &s));
    assert_int_equal(s.hidden, h[0]);
    assert_int_equal(s.ffn, h[1]);
    assert_int_equal(s.layers, h[2]);
    assert_int_equal(s.heads, h[3]);
    assert_int_equal(s.kv_heads, h[4]);
    assert_int_equal(s.vocab, h[5] < 0 ? -h[5] : h[5]);
    assert_int_equal(s.max_ctx, h[6]);
}

int main(int argc, char **argv)
{
    /* The real checkpoint of the shared folder (test_shape_shared). */
    const struct CMUnitTest shared_tests[] = {
        cmocka_unit_test(tiny_preset_matches_checkpoint),
    };
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(presets_have_published_sizes),
        cmocka_unit_test(unknown_preset_and_nulls),
        cmocka_unit_test(config_json_good),
        cmocka_unit_test(config_json_bad),
        cmocka_unit_test(sizes_are_overflow_checked),
    };
    return test_main(argc, argv, "test_shape", TEST_GROUP(tests, NULL, NULL), TEST_GROUP(shared_tests, NULL, NULL),
                     (const char *const[]){"models/stories260K.bin", NULL});
}
