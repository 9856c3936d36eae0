/*
 * test_tokenizer.c - the llama tokenizer against llama2.c's run.c:
 *  - hand-made tokenizer.bin images: merge order (highest score, leftmost on
 *    ties), run.c's -1e10 threshold, NaN scores, code points, byte fallback,
 *    a missing " ", decode rules;
 *  - hostile images (every truncation, bad lengths, bad max_token_length)
 *    -> LLMEM_EFORMAT naming token and byte offset; bad arguments;
 *  - the real vocabularies in the shared folder's models/ (the group
 *    test_tokenizer --shared, CTest's test_tokenizer_shared; skipped when
 *    absent, see test_util.h): the
 *    reference prompts' ids, "Hello world" on the 32k vocabulary, byte
 *    fallback, the reference texts rebuilt by decoding the reference ids;
 *  - an independent transcription of run.c's encode (qsort + bsearch +
 *    rescan after every merge) agreeing with the library on random texts;
 *  - a 100 KB text in well under a second, several threads at once;
 *  - GGUF vocabularies (from_model) encoding exactly as their tokenizer.bin.
 *
 * `LLMEM_WRITE_TOKENIZER_SEEDS=DIR test_tokenizer` writes fuzz_tokenizer's
 * seed built on the shared tok512.bin into DIR and exits (77, nothing
 * written, when the file is absent): CTest (fixture fuzz_tokenizer_seeds)
 * and `make fuzz` make it this way instead of keeping a copy of a model
 * file here.
 */
#include <ctype.h>
#include <math.h>
#include <pthread.h>

#include "test_util.h"
#include "support/cases.h"
#include "support/ref_tokenizer.h"
#include "support/rng.h"
#include "support/synth_model.h"

/* A file in the shared folder's models/ (test_util.h: test_shared_path). */
#define MODEL(rel) test_shared_path("models/" rel)

/* ---- helpers ----------------------------------------------------------- */

static bool file_exists(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    fclose(f);
    return true;
}

/* In the shared group every file was required up front (main): one missing
 * here is a list in main() that forgot it, a failure, not a skip. */
#define REQUIRE_FILE(path)                                                                    \
    do {                                                                                      \
        if (!file_exists(path)) fail_msg("%s is absent: add it to main()'s test_require_shared", \
                                         (const char *)(path));                               \
    } while (0)

static char *read_all(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    assert_non_null(buf);
    for (;;) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        cap *= 2;
        buf = realloc(buf, cap + 1);
        assert_non_null(buf);
    }
    fclose(f);
    buf[n] = '\0';
    if (size) *size = n;
    return buf;
}

/* Space-separated ids of a reference file. */
static size_t read_ids(const char *path, int32_t *ids, size_t cap)
{
    char *s = read_all(path, NULL);
    if (!s) fail_msg("cannot read %s", path);
    size_t n = 0;
    char *p = s, *end;
    for (;;) {
        long v = strtol(p, &end, 10);
        if (end == p) break;
        assert_true(n < cap);
        ids[n++] = (int32_t)v;
        p = end;
    }
    free(s);
    return n;
}

static llmem_tokenizer *load_shared(const char *path, uint32_t vocab)
{
    REQUIRE_FILE(path);
    llmem_tokenizer *t;
    assert_ok(llmem_tokenizer_load(path, vocab, &t));
    return t;
}

static size_t enc(const llmem_tokenizer *t, const char *text, bool bos, bool eos, int32_t *out, size_t cap)
{
    size_t n = 0;
    assert_ok(llmem_tokenizer_encode(t, text, bos, eos, out, cap, &n));
    return n;
}

static void assert_ids(const int32_t *got, size_t n, const int32_t *want, size_t wn)
{
    if (n != wn) {
        char buf[512] = "";
        for (size_t i = 0; i < n && strlen(buf) < 480; i++) snprintf(buf + strlen(buf), 12, " %d", got[i]);
        fail_msg("%zu tokens (%s), expected %zu", n, buf, wn);
    }
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i]) fail_msg("token %zu is %d, expected %d", i, got[i], want[i]);
}

/* A tokenizer.bin image: max_token_length, then {score, len, bytes}. A len
 * of -1 in a spec means strlen(s). */
typedef struct img_tok {
    const char *s;
    float score;
    int32_t len;
} img_tok;

typedef struct img {
    unsigned char *data;
    size_t size, cap;
} img;

static void img_put(img *m, const void *p, size_t n)
{
    if (m->size + n > m->cap) {
        m->cap = (m->size + n) * 2 + 64;
        m->data = realloc(m->data, m->cap);
        assert_non_null(m->data);
    }
    memcpy(m->data + m->size, p, n);
    m->size += n;
}

static void img_i32(img *m, int32_t v) { img_put(m, &v, 4); }
static void img_tok_put(img *m, const char *s, int32_t len, float score)
{
    img_put(m, &score, 4);
    img_i32(m, len);
    img_put(m, s, (size_t)len);
}

/* The 259 tokens every llama vocabulary starts with (<unk>, BOS, EOS, the
 * 256 byte tokens), then `extra`. */
static img img_llama(int32_t maxlen, const img_tok *extra, size_t n)
{
    img m = {0};
    img_i32(&m, maxlen);
    img_tok_put(&m, "<unk>", 5, 0);
    img_tok_put(&m, "\n<s>\n", 5, 0);
    img_tok_put(&m, "\n</s>\n", 6, 0);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        img_tok_put(&m, name, 6, 0);
    }
    for (size_t i = 0; i < n; i++)
        img_tok_put(&m, extra[i].s, extra[i].len < 0 ? (int32_t)strlen(extra[i].s) : extra[i].len, extra[i].score);
    return m;
}

static llmem_tokenizer *tok_llama(const img_tok *extra, size_t n)
{
    img m = img_llama(16, extra, n);
    llmem_tokenizer *t;
    assert_ok(llmem_tokenizer_load_memory(m.data, m.size, (uint32_t)(259 + n), &t));
    free(m.data);
    return t;
}

/* Random text: words, punctuation, whitespace runs, multi-byte code points
 * (some not in small vocabularies), broken UTF-8, literal "<0x41>". */
static void random_text(uint64_t *rng, char *out, size_t len)
{
    static const char *const parts[] = {
        "Once", " upon", " a", " time", "the", " little", "Lily", " liked", "dog", "s", ",", ".", "!", "?", " ",
        "  ", "   ", "\n", "\n\n", "\t", "'", "\"", "Hello", " world", "ing", "ed", "x", "q", "Z", "0", "42",
        "é", "中文", "😀", "▁", "ß", "\xC3", "\x80", "\xFF", "\xE2\x96", "<0x41>", "<s>", "</s>", "<unk>",
        "unbelievable", " antidisestablishment", "-", "(", ")", "&", "#", "@", "e\xCC\x81", "\xF0\x9F\x98\x80\x80\x80"};
    size_t n = 0;
    while (n < len) {
        const char *p = parts[test_rng_next(rng) % (sizeof parts / sizeof *parts)];
        size_t pl = strlen(p);
        if (n + pl > len) pl = len - n;
        memcpy(out + n, p, pl);
        n += pl;
    }
    out[n] = '\0';
}

/* ---- arguments and hostile images -------------------------------------- */

static void null_and_bad_arguments(void **state)
{
    (void)state;
    llmem_tokenizer *t = (llmem_tokenizer *)1;
    assert_status(llmem_tokenizer_load(NULL, 512, &t), LLMEM_EINVAL);
    assert_null(t);
    assert_status(llmem_tokenizer_load("x", 512, NULL), LLMEM_EINVAL);
    assert_status(llmem_tokenizer_load_memory(NULL, 10, 512, &t), LLMEM_EINVAL);
    assert_status(llmem_tokenizer_from_model(NULL, &t), LLMEM_EINVAL);
    assert_status(llmem_tokenizer_load("/nonexistent/tokenizer.bin", 512, &t), LLMEM_EIO);
    assert_error_mentions("/nonexistent/tokenizer.bin");

    t = tok_llama(NULL, 0);
    img m = img_llama(16, NULL, 0);
    llmem_tokenizer *u;
    assert_status(llmem_tokenizer_load_memory(m.data, m.size, 0, &u), LLMEM_EINVAL);
    assert_status(llmem_tokenizer_load_memory(m.data, m.size, 2, &u), LLMEM_EINVAL);
    assert_status(llmem_tokenizer_load_memory(m.data, m.size, 0x80000000u, &u), LLMEM_EINVAL);
    free(m.data);

    int32_t out[8];
    size_t n = 99;
    assert_status(llmem_tokenizer_encode(NULL, "a", true, false, out, 8, &n), LLMEM_EINVAL);
    assert_int_equal(n, 0);
    assert_status(llmem_tokenizer_encode(t, NULL, true, false, out, 8, &n), LLMEM_EINVAL);
    assert_status(llmem_tokenizer_encode(t, "a", true, false, out, 8, NULL), LLMEM_EINVAL);
    assert_status(llmem_tokenizer_encode(t, "a", true, false, NULL, 8, &n), LLMEM_EINVAL);
    size_t len = 99;
    assert_null(llmem_tokenizer_decode(NULL, 1, 5, &len));
    assert_null(llmem_tokenizer_decode(t, 1, -1, &len));
    assert_null(llmem_tokenizer_decode(t, 1, 259, &len));
    assert_int_equal(len, 0);
    assert_null(llmem_tokenizer_token(t, 259, &len, NULL));
    assert_null(llmem_tokenizer_token(NULL, 0, &len, NULL));
    assert_int_equal(llmem_tokenizer_vocab_size(NULL), 0);
    assert_int_equal(llmem_tokenizer_vocab_size(t), 259);
    assert_int_equal(llmem_tokenizer_bos(t), 1);
    assert_int_equal(llmem_tokenizer_eos(t), 2);
    llmem_tokenizer_destroy(t);
    llmem_tokenizer_destroy(NULL);
}

static void every_truncation_is_eformat(void **state)
{
    (void)state;
    static const img_tok extra[] = {{" ", -1, -1}, {"a", -2, -1}, {" a", -3, -1}, {"", -4, -1}};
    img m = img_llama(6, extra, 4);
    uint32_t V = 259 + 4;
    for (size_t cut = 0; cut < m.size; cut++) {
        /* A copy of exactly `cut` bytes, so ASan sees any read past it. */
        unsigned char *d = malloc(cut ? cut : 1);
        memcpy(d, m.data, cut);
        llmem_tokenizer *t = (llmem_tokenizer *)1;
        llmem_status st = llmem_tokenizer_load_memory(d, cut, V, &t);
        if (st != LLMEM_EFORMAT) fail_msg("cut at %zu: %s, expected EFORMAT", cut, llmem_status_name(st));
        assert_null(t);
        if (cut >= 4) {
            assert_error_mentions("truncated");
            assert_error_mentions("token ");
            assert_error_mentions("byte ");
        }
        free(d);
    }
    /* Whole, and with trailing bytes (ignored, as run.c does). */
    llmem_tokenizer *t;
    assert_ok(llmem_tokenizer_load_memory(m.data, m.size, V, &t));
    llmem_tokenizer_destroy(t);
    img_i32(&m, 12345);
    assert_ok(llmem_tokenizer_load_memory(m.data, m.size, V, &t));
    llmem_tokenizer_destroy(t);
    /* A vocab_size larger than the image holds. */
    assert_status(llmem_tokenizer_load_memory(m.data, m.size, V + 1, &t), LLMEM_EFORMAT);
    assert_error_mentions("token 263");
    assert_status(llmem_tokenizer_load_memory(m.data, m.size, 0x7fffffffu, &t), LLMEM_EFORMAT);
    free(m.data);
}

static void bad_lengths_are_eformat(void **state)
{
    (void)state;
    static const struct {
        int32_t maxlen, len; /* of token 259 */
        const char *mentions;
    } cases[] = {
        {8, -1, "token 259 at byte"},
        {8, INT32_MIN, "length -2147483648"},
        {8, 9, "length 9 is not in [0, max_token_length 8]"},
        {8, INT32_MAX, "length 2147483647"},
        {65536, 65536, "truncated: token 259"},
        {-1, 1, "max_token_length -1"},
        {0, 0, "max_token_length 0"},
        {65537, 1, "max_token_length 65537"},
        {INT32_MAX, 1, "max_token_length 2147483647"},
        {INT32_MIN, 1, "byte 0"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        img m = img_llama(cases[c].maxlen, NULL, 0);
        /* Token 259: a header whose length is the case's, then 8 bytes. */
        float score = 0;
        img_put(&m, &score, 4);
        img_i32(&m, cases[c].len);
        img_put(&m, "abcdefgh", 8);
        llmem_tokenizer *t = (llmem_tokenizer *)1;
        llmem_status st = llmem_tokenizer_load_memory(m.data, m.size, 260, &t);
        if (st != LLMEM_EFORMAT) fail_msg("case %zu: %s, expected EFORMAT", c, llmem_status_name(st));
        assert_null(t);
        if (!strstr(llmem_error_message(), cases[c].mentions))
            fail_msg("case %zu: \"%s\" does not mention \"%s\"", c, llmem_error_message(), cases[c].mentions);
        free(m.data);
    }
    /* The byte offset named is the token's: 4 + 259 headers + their bytes. */
    img m = img_llama(8, NULL, 0);
    size_t at = m.size;
    float score = 0;
    img_put(&m, &score, 4);
    img_i32(&m, -7);
    llmem_tokenizer *t;
    assert_status(llmem_tokenizer_load_memory(m.data, m.size, 260, &t), LLMEM_EFORMAT);
    char want[64];
    snprintf(want, sizeof want, "token 259 at byte %zu", at);
    assert_error_mentions(want);
    free(m.data);
}

static void cap_too_small_is_erange(void **state)
{
    (void)state;
    static const img_tok extra[] = {{" ", -1, -1}, {"a", -2, -1}, {"b", -2, -1}};
    llmem_tokenizer *t = tok_llama(extra, 3);
    int32_t out[16];
    size_t n = enc(t, "abab", true, true, out, 16); /* BOS " " a b a b EOS */
    assert_int_equal(n, 7);
    size_t m = 0;
    assert_status(llmem_tokenizer_encode(t, "abab", true, true, out, 6, &m), LLMEM_ERANGE);
    assert_int_equal(m, 7); /* the count it needs */
    /* A size query: no buffer, no capacity. */
    assert_status(llmem_tokenizer_encode(t, "abab", true, true, NULL, 0, &m), LLMEM_ERANGE);
    assert_int_equal(m, 7);
    assert_ok(llmem_tokenizer_encode(t, "abab", true, true, out, 7, &m));
    assert_int_equal(m, 7);
    /* strlen + 3 is always enough: every byte unknown. */
    const char *text = "\xF0\x9F\x98\x80zz";
    n = enc(t, text, true, true, out, strlen(text) + 3);
    assert_int_equal(n, strlen(text) + 3);
    /* Empty text: BOS and EOS alone; nothing at all. */
    assert_int_equal(enc(t, "", true, true, out, 2), 2);
    assert_int_equal(out[0], 1);
    assert_int_equal(out[1], 2);
    assert_int_equal(enc(t, "", false, false, NULL, 0), 0);
    llmem_tokenizer_destroy(t);
}

/* ---- the algorithm on hand-made vocabularies ---------------------------- */

static void merges_follow_run_c(void **state)
{
    (void)state;
    static const img_tok extra[] = {
        {" ", -1, -1},        /* 259 */
        {"a", -1, -1},        /* 260 */
        {"b", -1, -1},        /* 261 */
        {"ab", -1, -1},       /* 262 */
        {" a", -2, -1},       /* 263 */
        {"x", -1, -1},        /* 264 */
        {"y", -1, -1},        /* 265 */
        {"xy", -5, -1},       /* 266 */
        {"yx", -5, -1},       /* 267 */
        {"c", -1, -1},        /* 268 */
        {"cc", -1e10f, -1},   /* 269: not above run.c's -1e10 start: never merges */
        {"d", -1, -1},        /* 270 */
        {"dd", -9.9e9f, -1},  /* 271: just above: merges */
        {"e", -1, -1},        /* 272 */
        {"ee", NAN, -1},      /* 273: NaN never compares greater */
        {"f", -1, -1},        /* 274 */
        {"ff", -INFINITY, -1},/* 275 */
        {"é", -3, -1},        /* 276: a whole code point */
        {"abab", -0.5f, -1},  /* 277 */
        {"g", -1, -1},        /* 278 */
        {"gg", 0.0f, -1},     /* 279 */
        {"gg ", -0.0f, -1},   /* 280: unused */
        {"ggg", -0.0f, -1},   /* 281: -0 == +0: a tie, leftmost wins */
        {"\xF0\x9F\x98\x80", -1, -1}, /* 282: 😀 */
    };
    llmem_tokenizer *t = tok_llama(extra, sizeof extra / sizeof *extra);
    int32_t out[64];
    size_t n;

    /* "ab" (-1) beats " a" (-2): [" ", "ab"]. */
    n = enc(t, "ab", true, false, out, 64);
    assert_ids(out, n, (const int32_t[]){1, 259, 262}, 3);
    /* Then "ab"+"ab" -> "abab". */
    n = enc(t, "abab", false, false, out, 64);
    assert_ids(out, n, (const int32_t[]){259, 277}, 2);
    /* A tie between "xy" and "yx": the leftmost pair merges. */
    n = enc(t, "xyx", false, false, out, 64);
    assert_ids(out, n, (const int32_t[]){259, 266, 264}, 3);
    n = enc(t, "yxy", false, false, out, 64);
    assert_ids(out, n, (const int32_t[]){259, 267, 265}, 3);
    /* The threshold, NaN and -inf. */
    n = enc(t, "cc", false, false, out, 64);
    assert_ids(out, n, (const int32_t[]){259, 268, 268}, 3);
    n = enc(t, "dd", false, false, out, 64);
    assert_ids(out, n, (const int32_t[]){259, 271}, 2);
    n = enc(t, "ee", false, false, out, 64);
    assert_ids(out, n, (const int32_t[]){259, 272, 272}, 3);
    n = enc(t, "ff", false, true, out, 64);
    assert_ids(out, n, (const int32_t[]){259, 274, 274, 2}, 4);
    /* "gg" (0) at positions 1 and 2 tie; leftmost first, then "gg"+"g" ->
     * "ggg" (-0). */
    n = enc(t, "ggg", false, false, out, 64);
    assert_ids(out, n, (const int32_t[]){259, 281}, 2);
    /* A known code point, then unknown ones as bytes (id = byte + 3). */
    n = enc(t, "é", false, false, out, 64);
    assert_ids(out, n, (const int32_t[]){259, 276}, 2);
    n = enc(t, "ü!", false, false, out, 64);
    assert_ids(out, n, (const int32_t[]){259, 0xC3 + 3, 0xBC + 3, '!' + 3}, 4);
    /* More than 4 bytes of continuation: run.c cuts the buffer at 4, and a
     * stray continuation byte stands alone. */
    n = enc(t, "\xF0\x9F\x98\x80\x80\x80", false, false, out, 64);
    assert_ids(out, n, (const int32_t[]){259, 282, 0x83, 0x83}, 4);
    n = enc(t, "\x9F\x98\x80\x80\x80", false, false, out, 64);
    assert_ids(out, n, (const int32_t[]){259, 0xA2, 0x9B, 0x83, 0x83, 0x83}, 6);

    /* Decode: after BOS the leading space goes; <0xXX> is its byte. */
    size_t len;
    const char *p = llmem_tokenizer_decode(t, 1, 263, &len);
    assert_int_equal(len, 1);
    assert_memory_equal(p, "a", 1);
    p = llmem_tokenizer_decode(t, 260, 263, &len);
    assert_int_equal(len, 2);
    assert_memory_equal(p, " a", 2);
    p = llmem_tokenizer_decode(t, 1, 259, &len);
    assert_int_equal(len, 0);
    p = llmem_tokenizer_decode(t, 5, 3 + 'A', &len);
    assert_int_equal(len, 1);
    assert_int_equal(p[0], 'A');
    p = llmem_tokenizer_decode(t, 5, 3, &len); /* <0x00>: one NUL byte */
    assert_int_equal(len, 1);
    assert_int_equal(p[0], 0);
    p = llmem_tokenizer_decode(t, 5, 0, &len);
    assert_int_equal(len, 5);
    assert_memory_equal(p, "<unk>", 5);
    float score;
    p = llmem_tokenizer_token(t, 3 + 'A', &len, &score);
    assert_int_equal(len, 6);
    assert_string_equal(p, "<0x41>");
    p = llmem_tokenizer_token(t, 271, &len, &score);
    assert_true(score == -9.9e9f);
    llmem_tokenizer_destroy(t);
}

static void odd_vocabularies(void **state)
{
    (void)state;
    /* No " ": the dummy prefix is the byte fallback of ' '. */
    static const img_tok extra[] = {{"a", -1, -1}};
    llmem_tokenizer *t = tok_llama(extra, 1);
    int32_t out[16];
    size_t n = enc(t, "a", true, false, out, 16);
    assert_ids(out, n, (const int32_t[]){1, ' ' + 3, 259}, 3);
    llmem_tokenizer_destroy(t);

    /* Three tokens, no byte tokens at all: unknown bytes become <unk> (0),
     * never an id out of range; pieces end at a NUL. */
    img m = {0};
    img_i32(&m, 8);
    img_tok_put(&m, "<unk>", 5, 0);
    img_tok_put(&m, "a\0bc", 4, -1);
    img_tok_put(&m, " ", 1, -1);
    assert_ok(llmem_tokenizer_load_memory(m.data, m.size, 3, &t));
    free(m.data);
    size_t len;
    assert_string_equal(llmem_tokenizer_token(t, 1, &len, NULL), "a");
    assert_int_equal(len, 1);
    n = enc(t, "zaz", true, true, out, 16);
    /* BOS (1, whose piece is "a"), " " (2), z -> 0, "a" -> 1, z -> 0, EOS. */
    assert_ids(out, n, (const int32_t[]){1, 2, 0, 1, 0, 2}, 6);
    llmem_tokenizer_destroy(t);

    /* Duplicate pieces: the lowest id wins, every time. */
    static const img_tok dup[] = {{" ", -1, -1}, {"q", -1, -1}, {"q", -1, -1}, {" q", -1, -1}, {" q", -1, -1}};
    t = tok_llama(dup, 5);
    n = enc(t, "q", false, false, out, 16);
    assert_ids(out, n, (const int32_t[]){262}, 1);
    llmem_tokenizer_destroy(t);
}

/* ---- the real vocabularies ----------------------------------------------- */

#define TOK512 MODEL("tok512.bin")
#define TOK32K MODEL("tokenizer-llama2-32k.bin")

/* encode(prompt) is a prefix of the reference ids, decodes back to the
 * prompt, and the next reference id is generated text, not prompt. */
static void check_prompt(const llmem_tokenizer *t, const char *prompt, const char *ids_path)
{
    REQUIRE_FILE(ids_path);
    int32_t ref[1024], got[64];
    size_t nref = read_ids(ids_path, ref, 1024);
    size_t n = enc(t, prompt, true, false, got, 64);
    assert_true(n >= 2 && n < nref);
    assert_ids(got, n, ref, n);
    char text[256] = "";
    size_t tl = 0;
    for (size_t i = 1; i < n; i++) {
        size_t len;
        const char *p = llmem_tokenizer_decode(t, got[i - 1], got[i], &len);
        assert_non_null(p);
        memcpy(text + tl, p, len);
        tl += len;
    }
    text[tl] = '\0';
    assert_string_equal(text, prompt);
    /* The prompt's tokens decode to the prompt exactly, so the next
     * reference id, a non-empty piece, is generated text. */
    size_t len;
    const char *next = llmem_tokenizer_decode(t, ref[n - 1], ref[n], &len);
    assert_non_null(next);
    assert_true(len > 0);
}

static void tok512_reference_prompts(void **state)
{
    (void)state;
    llmem_tokenizer *t = load_shared(TOK512, 512);
    assert_int_equal(llmem_tokenizer_vocab_size(t), 512);
    check_prompt(t, "Once upon a time", MODEL("reference/stories260K.once.256.ids"));
    check_prompt(t, "Lily liked", MODEL("reference/stories260K.lily.128.ids"));
    /* The empty prompt is BOS alone, as the reference starts. */
    int32_t out[4];
    size_t n = enc(t, "", true, false, out, 4);
    assert_ids(out, n, (const int32_t[]){1}, 1);
    llmem_tokenizer_destroy(t);
}

static void tok512_byte_fallback(void **state)
{
    (void)state;
    llmem_tokenizer *t = load_shared(TOK512, 512);
    int32_t out[16];
    size_t n = enc(t, "\xF0\x9F\x98\x80", true, false, out, 16); /* 😀 */
    /* BOS, the dummy prefix " ", then the emoji's 4 bytes as <0xXX>. */
    assert_int_equal(n, 6);
    assert_int_equal(out[0], 1);
    size_t len;
    const char *p = llmem_tokenizer_decode(t, out[0], out[1], &len);
    assert_int_equal(len, 0); /* " " after BOS */
    static const unsigned char bytes[4] = {0xF0, 0x9F, 0x98, 0x80};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(out[2 + i], bytes[i] + 3);
        p = llmem_tokenizer_decode(t, out[1 + i], out[2 + i], &len);
        assert_int_equal(len, 1);
        assert_int_equal((unsigned char)p[0], bytes[i]);
    }
    llmem_tokenizer_destroy(t);
}

/* run.c's output: pieces after the first id, unprintable single bytes
 * skipped (safe_printf), then a newline. */
static void check_reference_text(const llmem_tokenizer *t, const char *name)
{
    char ids_path[512], txt_path[512];
    snprintf(ids_path, sizeof ids_path, "%s/models/reference/%s.ids", test_shared_dir(), name);
    snprintf(txt_path, sizeof txt_path, "%s/models/reference/%s.txt", test_shared_dir(), name);
    REQUIRE_FILE(ids_path);
    int32_t ids[1024];
    size_t n = read_ids(ids_path, ids, 1024), tsize;
    assert_true(n > 10);
    assert_int_equal(ids[0], 1);
    char *want = read_all(txt_path, &tsize);
    assert_non_null(want);
    char *got = malloc(n * 32 + 2);
    size_t gl = 0;
    for (size_t i = 1; i < n; i++) {
        size_t len;
        const char *p = llmem_tokenizer_decode(t, ids[i - 1], ids[i], &len);
        assert_non_null(p);
        if (len == 0) continue;
        if (len == 1 && !(isprint((unsigned char)p[0]) || isspace((unsigned char)p[0]))) continue;
        memcpy(got + gl, p, len);
        gl += len;
    }
    got[gl++] = '\n';
    got[gl] = '\0';
    assert_int_equal(gl, tsize);
    assert_string_equal(got, want);
    free(got);
    free(want);
}

static void tok512_decodes_reference_text(void **state)
{
    (void)state;
    llmem_tokenizer *t = load_shared(TOK512, 512);
    check_reference_text(t, "stories260K.once.256");
    check_reference_text(t, "stories260K.lily.128");
    check_reference_text(t, "stories260K.empty.256");
    llmem_tokenizer_destroy(t);
}

static void llama32k_hello_world(void **state)
{
    (void)state;
    llmem_tokenizer *t = load_shared(TOK32K, 32000);
    int32_t out[32];
    size_t n = enc(t, "Hello world", true, false, out, 32);
    assert_ids(out, n, (const int32_t[]){1, 15043, 3186}, 3);
    n = enc(t, "Hello world", true, true, out, 32);
    assert_ids(out, n, (const int32_t[]){1, 15043, 3186, 2}, 4);
    size_t len;
    const char *p = llmem_tokenizer_decode(t, 1, 15043, &len);
    assert_int_equal(len, 5);
    assert_memory_equal(p, "Hello", 5);
    p = llmem_tokenizer_decode(t, 15043, 3186, &len);
    assert_int_equal(len, 6);
    assert_memory_equal(p, " world", 6);
    llmem_tokenizer_destroy(t);
}

/* The library and the transcription of run.c agree on random texts (some
 * longer than the stack path's 128 symbols). */
static void agree_with_reference(const char *path, uint32_t V, int texts, size_t maxlen)
{
    llmem_tokenizer *t = load_shared(path, V);
    test_ref_tok r;
    assert_true(test_ref_tok_make(&r, t, false));
    uint64_t rng = 0x9E3779B97F4A7C15ull ^ V;
    char *text = malloc(maxlen + 1);
    int32_t *a = malloc((maxlen + 3) * sizeof *a), *b = malloc((maxlen + 3) * sizeof *b);
    for (int i = 0; i < texts; i++) {
        size_t len = (size_t)(test_rng_next(&rng) % (maxlen + 1));
        random_text(&rng, text, len);
        bool bos = i % 3 != 0, eos = i % 4 == 0;
        size_t na = enc(t, text, bos, eos, a, strlen(text) + 3);
        size_t nb = test_ref_tok_encode(&r, text, bos, eos, b);
        if (na != nb || memcmp(a, b, na * sizeof *a) != 0) {
            size_t k = 0;
            while (k < na && k < nb && a[k] == b[k]) k++;
            fail_msg("text %d (%zu bytes): %zu tokens vs run.c's %zu, first difference at %zu", i, strlen(text),
                     na, nb, k);
        }
    }
    free(text);
    free(a);
    free(b);
    test_ref_tok_free(&r);
    llmem_tokenizer_destroy(t);
}

TEST_CASE(tok512_agrees_with_run_c, agree_with_reference(TOK512, 512, 400, 400))
TEST_CASE(llama32k_agrees_with_run_c, agree_with_reference(TOK32K, 32000, 200, 300))

/* Hand-made vocabularies with many ties and chains of merges. */
static void random_vocabularies_agree_with_run_c(void **state)
{
    (void)state;
    uint64_t rng = 12345;
    for (int v = 0; v < 30; v++) {
        /* Pieces over a 3-letter alphabet, unique, with few distinct scores. */
        img_tok extra[120];
        char pieces[120][6];
        size_t n = 0;
        strcpy(pieces[n], " ");
        extra[n] = (img_tok){pieces[n], 0, -1};
        n++;
        while (n < 120) {
            size_t len = 1 + test_rng_next(&rng) % 4;
            for (size_t i = 0; i < len; i++) pieces[n][i] = " abc"[test_rng_next(&rng) % 4];
            pieces[n][len] = '\0';
            bool dup = false;
            for (size_t j = 0; j < n; j++) dup |= strcmp(pieces[j], pieces[n]) == 0;
            if (dup) continue;
            extra[n] = (img_tok){pieces[n], -(float)(test_rng_next(&rng) % 4), -1};
            n++;
        }
        llmem_tokenizer *t = tok_llama(extra, n);
        test_ref_tok r;
        assert_true(test_ref_tok_make(&r, t, false));
        char text[300];
        int32_t a[310], b[310];
        for (int i = 0; i < 40; i++) {
            size_t len = test_rng_next(&rng) % 299;
            for (size_t k = 0; k < len; k++) text[k] = "abc d"[test_rng_next(&rng) % 5];
            text[len] = '\0';
            size_t na = enc(t, text, true, false, a, 310);
            size_t nb = test_ref_tok_encode(&r, text, true, false, b);
            assert_int_equal(na, nb);
            assert_memory_equal(a, b, na * sizeof *a);
        }
        test_ref_tok_free(&r);
        llmem_tokenizer_destroy(t);
    }
}

/* 100 KB: far from run.c's quadratic minutes; decoding gives it back. */
static void long_text_is_fast_and_round_trips(void **state)
{
    (void)state;
    llmem_tokenizer *t = load_shared(TOK32K, 32000);
    size_t len = 100 * 1000;
    char *text = malloc(len + 1);
    uint64_t rng = 7;
    random_text(&rng, text, len);
    /* No literal "<0x41>": it would merge into the byte token and decode
     * as "A". */
    for (char *p = text; (p = strstr(p, "<0x41>"));) p[1] = '(';
    int32_t *out = malloc((len + 3) * sizeof *out);
    uint64_t t0 = test_now_ms();
    size_t n = enc(t, text, true, false, out, len + 3);
    uint64_t ms = test_now_ms() - t0;
    print_message("100 KB of text: %zu tokens in %llu ms\n", n, (unsigned long long)ms);
    assert_true(ms < 5000);
    assert_true(n > 1000 && n < len);
    char *back = malloc(len + 1);
    size_t bl = 0;
    for (size_t i = 1; i < n; i++) {
        size_t pl;
        const char *p = llmem_tokenizer_decode(t, out[i - 1], out[i], &pl);
        assert_non_null(p);
        assert_true(bl + pl <= len);
        memcpy(back + bl, p, pl);
        bl += pl;
    }
    back[bl] = '\0';
    assert_int_equal(bl, len);
    assert_memory_equal(back, text, len);
    free(back);
    free(out);
    free(text);
    llmem_tokenizer_destroy(t);
}

typedef struct enc_job {
    const llmem_tokenizer *t;
    int seed;
    int mismatches;
} enc_job;

static void *enc_worker(void *arg)
{
    enc_job *j = arg;
    uint64_t rng = (uint64_t)j->seed * 0x9E3779B97F4A7C15ull + 1;
    char text[600];
    int32_t a[610], b[610];
    for (int i = 0; i < 200; i++) {
        uint64_t save = rng;
        random_text(&rng, text, 1 + save % 599);
        size_t na = 0, nb = 0;
        llmem_status s1 = llmem_tokenizer_encode(j->t, text, true, false, a, 610, &na);
        llmem_status s2 = llmem_tokenizer_encode(j->t, text, true, false, b, 610, &nb);
        if (s1 || s2 || na != nb || memcmp(a, b, na * sizeof *a)) j->mismatches++;
    }
    return NULL;
}

static void threads_encode_at_once(void **state)
{
    (void)state;
    llmem_tokenizer *t = load_shared(TOK512, 512);
    pthread_t th[4];
    enc_job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (enc_job){t, i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, enc_worker, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(jobs[i].mismatches, 0);
    }
    llmem_tokenizer_destroy(t);
}

/* ---- GGUF vocabularies --------------------------------------------------- */

static llmem_tokenizer *gguf_shared(const char *path, llmem_model **mp)
{
    REQUIRE_FILE(path);
    llmem_model *m;
    assert_ok(llmem_model_open(path, NULL, &m));
    llmem_tokenizer *t;
    assert_ok(llmem_tokenizer_from_model(m, &t));
    *mp = m;
    return t;
}

/* The GGUF vocabulary holds the same pieces and scores as the
 * tokenizer.bin (BOS and EOS aside: the exporter renames them) and encodes
 * every text the same. */
static void gguf_matches_bin(const char *bin, uint32_t V, const char *gguf)
{
    llmem_tokenizer *tb = load_shared(bin, V);
    llmem_model *m;
    llmem_tokenizer *tg = gguf_shared(gguf, &m);
    assert_int_equal(llmem_tokenizer_vocab_size(tg), V);
    assert_int_equal(llmem_tokenizer_bos(tg), 1);
    assert_int_equal(llmem_tokenizer_eos(tg), 2);
    for (int32_t i = 0; i < (int32_t)V; i++) {
        if (i == 1 || i == 2) continue;
        size_t lb, lg;
        float sb, sg;
        const char *pb = llmem_tokenizer_token(tb, i, &lb, &sb);
        const char *pg = llmem_tokenizer_token(tg, i, &lg, &sg);
        if (lb != lg || memcmp(pb, pg, lb) != 0 || !(sb == sg))
            fail_msg("token %d: \"%s\" %g in %s, \"%s\" %g in %s", i, pb, (double)sb, bin, pg, (double)sg, gguf);
    }
    static const char *const texts[] = {
        "", "Hello world", "Once upon a time", "Lily liked", " leading space", "trailing space ",
        "two  spaces and\ttabs\nand\n\nnewlines", "<s> and </s> and <unk> are just text", "<0x41> <0x0A>",
        "\xF0\x9F\x98\x80 emoji, \xE4\xB8\xAD\xE6\x96\x87, caf\xC3\xA9, na\xC3\xAFve", "\xE2\x96\x81 is U+2581",
        "broken \xC3 utf-8 \x80\xFF", "1234567890 !@#$%^&*()", "The quick brown fox jumps over the lazy dog."};
    int32_t a[4096], b[4096];
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        size_t na = enc(tb, texts[i], true, true, a, 4096);
        size_t nb = enc(tg, texts[i], true, true, b, 4096);
        if (na != nb || memcmp(a, b, na * sizeof *a)) fail_msg("\"%s\" encodes differently", texts[i]);
        for (size_t k = 1; k + 1 < na; k++) {
            size_t l1, l2;
            const char *p1 = llmem_tokenizer_decode(tb, a[k - 1], a[k], &l1);
            const char *p2 = llmem_tokenizer_decode(tg, b[k - 1], b[k], &l2);
            assert_int_equal(l1, l2);
            assert_memory_equal(p1, p2, l1);
        }
    }
    uint64_t rng = 99;
    char text[1000];
    for (int i = 0; i < 100; i++) {
        random_text(&rng, text, test_rng_next(&rng) % 999);
        size_t na = enc(tb, text, true, false, a, 4096);
        size_t nb = enc(tg, text, true, false, b, 4096);
        assert_int_equal(na, nb);
        assert_memory_equal(a, b, na * sizeof *a);
    }
    llmem_tokenizer_destroy(tg);
    llmem_model_close(m);
    llmem_tokenizer_destroy(tb);
}

TEST_CASE(gguf_stories260k_matches_tok512, gguf_matches_bin(TOK512, 512, MODEL("stories260K.gguf")))

static void gguf_llama32k_matches_bin(void **state)
{
    (void)state;
    gguf_matches_bin(TOK32K, 32000, MODEL("llama-2-tiny-random.gguf"));
    /* And "Hello world" straight from the GGUF. */
    llmem_model *m;
    llmem_tokenizer *t = gguf_shared(MODEL("llama-2-tiny-random.gguf"), &m);
    int32_t out[8];
    size_t n = enc(t, "Hello world", true, false, out, 8);
    assert_ids(out, n, (const int32_t[]){1, 15043, 3186}, 3);
    /* The piece is held with a space, not U+2581. */
    size_t len;
    assert_string_equal(llmem_tokenizer_token(t, 3186, &len, NULL), " world");
    llmem_tokenizer_destroy(t);
    llmem_model_close(m);
}

static void llama2c_checkpoint_has_no_vocabulary(void **state)
{
    (void)state;
    REQUIRE_FILE(MODEL("stories260K.bin"));
    llmem_model *m;
    assert_ok(llmem_model_open(MODEL("stories260K.bin"), NULL, &m));
    llmem_tokenizer *t = (llmem_tokenizer *)1;
    assert_status(llmem_tokenizer_from_model(m, &t), LLMEM_ENOTFOUND);
    assert_null(t);
    llmem_model_close(m);
}

/* A minimal llama GGUF (one block of 2-wide f32 tensors) whose tokenizer
 * metadata the caller describes, opened as a model. */
typedef struct gguf_vocab {
    const char *model;               /* tokenizer.ggml.model; NULL: absent */
    const char *const *tokens;       /* NULL: absent */
    size_t ntokens;
    const float *scores;             /* NULL: absent */
    size_t nscores;
    bool scores_as_tokens;           /* tokenizer.ggml.tokens written as f32 instead */
    int64_t bos, eos;                /* -1: absent */
    /* gpt2 vocabularies (zero: absent) */
    const char *const *merges;
    size_t nmerges;
    const int32_t *types;
    size_t ntypes;
    const char *pre;
} gguf_vocab;

static llmem_status fill_zero(void *ctx, size_t index, void *buf, size_t bytes)
{
    (void)ctx;
    (void)index;
    memset(buf, 0, bytes);
    return LLMEM_OK;
}

static void gguf_write_file(const gguf_vocab *v, const char *path)
{
    llmem_gguf_writer *w;
    assert_ok(llmem_gguf_writer_create(&w));
    test_gguf_llama_keys(w, 16, 2, 1, 2, 1, 0);
    if (v->model) assert_ok(llmem_gguf_add_str(w, "tokenizer.ggml.model", v->model));
    if (v->tokens && !v->scores_as_tokens)
        assert_ok(llmem_gguf_add_str_array(w, "tokenizer.ggml.tokens", v->tokens, v->ntokens));
    if (v->scores_as_tokens) assert_ok(llmem_gguf_add_f32_array(w, "tokenizer.ggml.tokens", v->scores, v->nscores));
    if (v->scores) assert_ok(llmem_gguf_add_f32_array(w, "tokenizer.ggml.scores", v->scores, v->nscores));
    if (v->bos >= 0) assert_ok(llmem_gguf_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos));
    if (v->eos >= 0) assert_ok(llmem_gguf_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos));
    if (v->merges) assert_ok(llmem_gguf_add_str_array(w, "tokenizer.ggml.merges", v->merges, v->nmerges));
    if (v->types) assert_ok(llmem_gguf_add_i32_array(w, "tokenizer.ggml.token_type", v->types, v->ntypes));
    if (v->pre) assert_ok(llmem_gguf_add_str(w, "tokenizer.ggml.pre", v->pre));
    uint64_t vocab = v->ntokens ? v->ntokens : 4;
    static const char *const names[] = {"blk.0.attn_norm.weight", "blk.0.attn_q.weight",      "blk.0.attn_k.weight",
                                        "blk.0.attn_v.weight",    "blk.0.attn_output.weight", "blk.0.ffn_norm.weight",
                                        "blk.0.ffn_gate.weight",  "blk.0.ffn_down.weight",    "blk.0.ffn_up.weight",
                                        "output_norm.weight"};
    uint64_t dims[2] = {2, vocab};
    assert_ok(llmem_gguf_add_tensor(w, "token_embd.weight", LLMEM_DTYPE_F32, 2, dims, fill_zero, NULL));
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        bool vec = strstr(names[i], "norm") != NULL;
        dims[1] = 2;
        assert_ok(llmem_gguf_add_tensor(w, names[i], LLMEM_DTYPE_F32, vec ? 1 : 2, dims, fill_zero, NULL));
    }
    assert_ok(llmem_gguf_write(w, path, false));
    llmem_gguf_writer_destroy(w);
}

static llmem_model *gguf_make(const gguf_vocab *v)
{
    char path[128];
    snprintf(path, sizeof path, "/tmp/llmem_test_tokenizer_%d.gguf", (int)getpid());
    gguf_write_file(v, path);
    llmem_model *m;
    assert_ok(llmem_model_open(path, NULL, &m));
    unlink(path);
    return m;
}

/* Case c of a hostile-metadata table: no tokenizer from m, the status
 * `want`, a message that mentions `mentions`; m is closed. */
static void expect_refused(llmem_model *m, size_t c, llmem_status want, const char *mentions)
{
    llmem_tokenizer *t = (llmem_tokenizer *)1;
    llmem_status st = llmem_tokenizer_from_model(m, &t);
    if (st != want)
        fail_msg("case %zu: %s, expected %s (%s)", c, llmem_status_name(st), llmem_status_name(want),
                 llmem_error_message());
    assert_null(t);
    if (!strstr(llmem_error_message(), mentions))
        fail_msg("case %zu: \"%s\" does not mention \"%s\"", c, llmem_error_message(), mentions);
    llmem_model_close(m);
}

static void gguf_hostile_metadata(void **state)
{
    (void)state;
    static const char *const toks[] = {"<unk>", "<s>", "</s>", "\xE2\x96\x81"};
    static const float sc[] = {0, 0, 0, -1, -2};
    static const struct {
        gguf_vocab v;
        llmem_status want;
        const char *mentions;
    } cases[] = {
        {{NULL, toks, 4, sc, 4, false, -1, -1}, LLMEM_ENOTFOUND, "tokenizer.ggml.model"},
        {{"bert", toks, 4, sc, 4, false, -1, -1}, LLMEM_ENOTSUP, "'bert' is not supported"},
        {{"gpt2", toks, 4, sc, 4, false, -1, -1}, LLMEM_EFORMAT, "gpt2 vocabulary of 4 tokens"},
        {{"llama", NULL, 0, sc, 4, false, -1, -1}, LLMEM_EFORMAT, "tokenizer.ggml.tokens"},
        {{"llama", toks, 4, NULL, 0, false, -1, -1}, LLMEM_EFORMAT, "tokenizer.ggml.scores"},
        {{"llama", toks, 4, sc, 5, false, -1, -1}, LLMEM_EFORMAT, "5 scores for 4 tokens"},
        {{"llama", toks, 4, sc, 4, true, -1, -1}, LLMEM_EFORMAT, "not strings"},
        {{"llama", toks, 2, sc, 2, false, -1, -1}, LLMEM_EFORMAT, "2 entries"},
        {{"llama", toks, 4, sc, 4, false, 4, -1}, LLMEM_EFORMAT, "bos_token_id = 4"},
        {{"llama", toks, 4, sc, 4, false, -1, 7}, LLMEM_EFORMAT, "eos_token_id = 7"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        llmem_model *m = gguf_make(&cases[c].v);
        expect_refused(m, c, cases[c].want, cases[c].mentions);
    }
}

/* A GGUF vocabulary of its own: "▁" held as ' ', byte tokens found by name
 * wherever they sit, custom BOS/EOS ids that text cannot reach. */
static void gguf_vocabulary_rules(void **state)
{
    (void)state;
    static const char *const toks[] = {
        "<unk>",  "</s>",  "<s>", "\xE2\x96\x81", "a", "\342\226\201a", "<", "s", ">", "<s",
        "<0x62>", "<0x0A>", "\xE2\x96\x81\xE2\x96\x81", "<0x05>"};
    static const float sc[] = {0, 0, 0, -1, -1, -2, -1, -1, -1, -1, 0, 0, -3, 0};
    gguf_vocab v = {"llama", toks, 14, sc, 14, false, 2, 1};
    llmem_model *m = gguf_make(&v);
    llmem_tokenizer *t;
    assert_ok(llmem_tokenizer_from_model(m, &t));
    assert_int_equal(llmem_tokenizer_vocab_size(t), 14);
    assert_int_equal(llmem_tokenizer_bos(t), 2);
    assert_int_equal(llmem_tokenizer_eos(t), 1);
    size_t len;
    assert_string_equal(llmem_tokenizer_token(t, 5, &len, NULL), " a");
    assert_int_equal(len, 2);
    assert_string_equal(llmem_tokenizer_token(t, 12, &len, NULL), "  ");
    int32_t out[32];
    /* '\n', 'b' and 5 are not pieces: their byte tokens by name are 11, 10
     * and 13 (not byte + 3: 13, 101, 8). */
    size_t n = enc(t, "a\nb\x05", true, true, out, 32);
    assert_ids(out, n, (const int32_t[]){2, 5, 11, 10, 13, 1}, 6);
    /* "<s>" merges to "<s" + ">", never to BOS. */
    n = enc(t, "<s>", false, false, out, 32);
    assert_ids(out, n, (const int32_t[]){3, 9, 8}, 3);
    /* Decode: the space after BOS (id 2) goes; byte tokens are bytes. */
    const char *p = llmem_tokenizer_decode(t, 2, 5, &len);
    assert_int_equal(len, 1);
    assert_memory_equal(p, "a", 1);
    p = llmem_tokenizer_decode(t, 1, 5, &len);
    assert_int_equal(len, 2);
    p = llmem_tokenizer_decode(t, 5, 10, &len);
    assert_int_equal(len, 1);
    assert_int_equal(p[0], 'b');
    llmem_tokenizer_destroy(t);
    llmem_model_close(m);
}

/* ---- GPT-2 byte-level BPE (tokenizer.ggml.model "gpt2") ------------------ */

/* GPT-2's byte-level alphabet, restated: printable Latin-1 bytes stand for
 * themselves, the other 68 for U+0100 onwards in byte order. */
static void byte_level_char(unsigned b, char out[3])
{
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    unsigned cp = b;
    if (!printable) {
        cp = 256;
        for (unsigned c = 0; c < b; c++)
            if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE))) cp++;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

enum { BPE_HE = 256, BPE_LL, BPE_HELL, BPE_HELLO, BPE_GW, BPE_OR, BPE_GWOR, BPE_GWORL, BPE_GWORLD, BPE_12, BPE_123,
       BPE_GG, BPE_GB, BPE_EACUTE, BPE_OG, BPE_EOT, BPE_IM_START, BPE_TOOL, BPE_AB, BPE_END, BPE_V };

typedef struct bpe_vocab {
    char bytes[256][3];
    const char *tokens[BPE_V];
    int32_t types[BPE_V];
} bpe_vocab;

static void bpe_vocab_init(bpe_vocab *v)
{
    for (unsigned b = 0; b < 256; b++) {
        byte_level_char(b, v->bytes[b]);
        v->tokens[b] = v->bytes[b];
        v->types[b] = 1;
    }
    static const char *const extra[] = {"he", "ll", "hell", "hello", "\xC4\xA0w", "or", "\xC4\xA0wor", "\xC4\xA0worl",
                                        "\xC4\xA0world", "12", "123", "\xC4\xA0\xC4\xA0", "\xC4\xA0\x62",
                                        "\xC3\x83\xC2\xA9", "o\xC4\xA0", "<|endoftext|>", "<|im_start|>", "<tool>",
                                        "ab", "<|end"};
    for (unsigned i = 0; i < BPE_V - 256; i++) {
        v->tokens[256 + i] = extra[i];
        v->types[256 + i] = 1;
    }
    v->types[BPE_EOT] = v->types[BPE_IM_START] = 3; /* control */
    v->types[BPE_TOOL] = v->types[BPE_END] = 4;     /* user-defined */
}

/* In rank order; the last two name no token and are left out. */
static const char *const bpe_merges[] = {
    "h e", "l l", "he ll", "hell o", "\xC4\xA0 w", "o r", "\xC4\xA0w or", "\xC4\xA0wor l", "\xC4\xA0worl d", "1 2",
    "12 3", "\xC4\xA0 \xC4\xA0", "\xC4\xA0 b", "\xC3\x83 \xC2\xA9", "o \xC4\xA0", "x yz", "e l"};

static llmem_tokenizer *bpe_make(const char *pre, llmem_model **mp)
{
    bpe_vocab v;
    bpe_vocab_init(&v);
    gguf_vocab g = {"gpt2", v.tokens, BPE_V, NULL, 0, false, -1, BPE_EOT,
                    bpe_merges, sizeof bpe_merges / sizeof *bpe_merges, v.types, BPE_V, pre};
    llmem_model *m = gguf_make(&g);
    llmem_tokenizer *t;
    assert_ok(llmem_tokenizer_from_model(m, &t));
    *mp = m;
    return t;
}

static void bpe_expect(const llmem_tokenizer *t, bool special, const char *text, const int32_t *want, size_t wn)
{
    int32_t out[256];
    size_t n;
    llmem_status st = special ? llmem_tokenizer_encode_special(t, text, false, false, out, 256, &n)
                              : llmem_tokenizer_encode(t, text, false, false, out, 256, &n);
    if (st) fail_msg("\"%s\": %s (%s)", text, llmem_status_name(st), llmem_error_message());
    bool same = n == wn && !memcmp(out, want, n * sizeof *out);
    if (!same) {
        char got[1024];
        size_t o = 0;
        for (size_t i = 0; i < n && o + 12 < sizeof got; i++) o += (size_t)snprintf(got + o, sizeof got - o, " %d", out[i]);
        fail_msg("\"%s\" encodes to%s", text, n ? got : " nothing");
    }
}

#define BPE_EXPECT(t, special, text, ...)                                                                         \
    bpe_expect(t, special, text, (const int32_t[]){__VA_ARGS__}, sizeof((const int32_t[]){__VA_ARGS__}) / sizeof(int32_t))

/* Ranked merges inside the words of GPT-2's pre-tokenizer. */
static void bpe_gpt2_merges_and_words(void **state)
{
    (void)state;
    llmem_model *m;
    llmem_tokenizer *t = bpe_make("gpt-2", &m);
    assert_true(llmem_tokenizer_is_bpe(t));
    assert_int_equal(llmem_tokenizer_vocab_size(t), BPE_V);
    assert_int_equal(llmem_tokenizer_bos(t), -1);
    assert_int_equal(llmem_tokenizer_eos(t), BPE_EOT);
    assert_false(llmem_tokenizer_add_bos(t));
    BPE_EXPECT(t, false, "hello world", BPE_HELLO, BPE_GWORLD);
    /* "\s+(?!\S)": the space before a word belongs to the word. */
    BPE_EXPECT(t, false, "hello  world", BPE_HELLO, ' ', BPE_GWORLD);
    BPE_EXPECT(t, false, "a   b", 'a', BPE_GG, BPE_GB);
    /* "o Ġ" is a merge but the space starts the next word. */
    BPE_EXPECT(t, false, "o w", 'o', BPE_GW);
    /* The leftmost of equal pairs first; a dropped merge ("e l") never applies. */
    BPE_EXPECT(t, false, "lll", BPE_LL, 'l');
    BPE_EXPECT(t, false, "yellow", 'y', 'e', BPE_LL, 'o', 'w');
    /* Digits: one word in GPT-2's pattern. */
    BPE_EXPECT(t, false, "12345", BPE_123, '4', '5');
    /* A letter in two bytes merges through the byte-level text ("Ã" "©"). */
    BPE_EXPECT(t, false, "caf\xC3\xA9", 'c', 'a', 'f', BPE_EACUTE);
    /* Bytes of malformed UTF-8 are tokens of their own. */
    BPE_EXPECT(t, false, "\xFF\xFE", 0xFF, 0xFE);
    BPE_EXPECT(t, false, "a\0", 'a');
    /* "ab" is a token but no merge makes it. */
    BPE_EXPECT(t, false, "ab", 'a', 'b');
    /* BOS: none in this vocabulary; EOS appended when asked. */
    int32_t out[8];
    size_t n;
    assert_ok(llmem_tokenizer_encode(t, "hello", true, true, out, 8, &n));
    assert_ids(out, n, (const int32_t[]){BPE_HELLO, BPE_EOT}, 2);
    /* Too small: ERANGE with the count needed. */
    assert_status(llmem_tokenizer_encode(t, "hello world", false, false, out, 1, &n), LLMEM_ERANGE);
    assert_int_equal(n, 2);
    assert_status(llmem_tokenizer_encode(t, "hello world", false, false, NULL, 0, &n), LLMEM_ERANGE);
    assert_int_equal(n, 2);
    /* Pieces are bytes; control tokens decode to nothing. */
    size_t len;
    const char *p = llmem_tokenizer_decode(t, -1, BPE_GWORLD, &len);
    assert_int_equal(len, 6);
    assert_memory_equal(p, " world", 6);
    p = llmem_tokenizer_decode(t, -1, 0, &len);
    assert_int_equal(len, 1);
    assert_int_equal(p[0], 0);
    p = llmem_tokenizer_decode(t, -1, BPE_EOT, &len);
    assert_non_null(p);
    assert_int_equal(len, 0);
    p = llmem_tokenizer_decode(t, -1, BPE_TOOL, &len);
    assert_int_equal(len, 6);
    assert_memory_equal(p, "<tool>", 6);
    assert_string_equal(llmem_tokenizer_token(t, BPE_GW, &len, NULL), " w");
    assert_null(llmem_tokenizer_decode(t, -1, BPE_V, &len));
    llmem_tokenizer_destroy(t);
    llmem_model_close(m);
}

/* Special tokens: user-defined ones always, control ones only through
 * encode_special; the longest first. */
static void bpe_special_tokens(void **state)
{
    (void)state;
    llmem_model *m;
    llmem_tokenizer *t = bpe_make("gpt-2", &m);
    BPE_EXPECT(t, false, "x<tool>y", 'x', BPE_TOOL, 'y');
    BPE_EXPECT(t, false, "<|im_start|>hello", '<', '|', 'i', 'm', '_', 's', 't', 'a', 'r', 't', '|', '>', BPE_HELLO);
    BPE_EXPECT(t, true, "<|im_start|>hello", BPE_IM_START, BPE_HELLO);
    BPE_EXPECT(t, true, "<|im_start|><|im_start|>", BPE_IM_START, BPE_IM_START);
    /* Without parse-special, only the user-defined "<|end" matches. */
    BPE_EXPECT(t, false, "<|endoftext|>", BPE_END, 'o', 'f', 't', 'e', 'x', 't', '|', '>');
    BPE_EXPECT(t, true, "<|endoftext|>", BPE_EOT);
    BPE_EXPECT(t, true, "hello<|endoftext|> world", BPE_HELLO, BPE_EOT, BPE_GWORLD);
    llmem_tokenizer_destroy(t);
    llmem_model_close(m);
}

/* The other pre-tokenizers: Qwen2 splits digits one by one; Llama 3 groups
 * three and emits a word that is a token whole. */
static void bpe_pre_tokenizers(void **state)
{
    (void)state;
    llmem_model *m;
    llmem_tokenizer *t = bpe_make("qwen2", &m);
    BPE_EXPECT(t, false, "12345", '1', '2', '3', '4', '5');
    BPE_EXPECT(t, false, "hello world", BPE_HELLO, BPE_GWORLD);
    BPE_EXPECT(t, false, "ab", 'a', 'b');
    llmem_tokenizer_destroy(t);
    llmem_model_close(m);
    t = bpe_make("llama-bpe", &m);
    BPE_EXPECT(t, false, "12345", BPE_123, '4', '5');
    BPE_EXPECT(t, false, "ab", BPE_AB);
    BPE_EXPECT(t, false, "hello world", BPE_HELLO, BPE_GWORLD);
    llmem_tokenizer_destroy(t);
    llmem_model_close(m);
}

/* Any bytes round-trip: decode of the tokens gives the text back. */
static void bpe_round_trip(void **state)
{
    (void)state;
    static const char *const pres[] = {"gpt-2", "qwen2", "llama-bpe"};
    for (size_t k = 0; k < 3; k++) {
        llmem_model *m;
        llmem_tokenizer *t = bpe_make(pres[k], &m);
        uint64_t rng = 7 + k;
        static const char alphabet[] = "hello world 12345 ab\n\t  caf\xC3\xA9<tool><|end\xFF\x80!?'s'LL";
        char text[400], back[400 * 8];
        int32_t ids[1024];
        for (int i = 0; i < 300; i++) {
            size_t len = test_rng_next(&rng) % 300;
            for (size_t j = 0; j < len; j++) text[j] = alphabet[test_rng_next(&rng) % (sizeof alphabet - 1)];
            text[len] = 0;
            size_t n;
            assert_ok(llmem_tokenizer_encode(t, text, false, false, ids, 1024, &n));
            assert_true(n <= len);
            size_t o = 0;
            for (size_t j = 0; j < n; j++) {
                size_t pl;
                const char *p = llmem_tokenizer_decode(t, j ? ids[j - 1] : -1, ids[j], &pl);
                assert_non_null(p);
                memcpy(back + o, p, pl);
                o += pl;
            }
            if (o != len || memcmp(back, text, len)) fail_msg("%s: \"%s\" does not round-trip", pres[k], text);
        }
        llmem_tokenizer_destroy(t);
        llmem_model_close(m);
    }
}

/* Broken gpt2 metadata: a clear EFORMAT or ENOTSUP naming what is wrong. */
static void bpe_hostile_metadata(void **state)
{
    (void)state;
    bpe_vocab v;
    bpe_vocab_init(&v);
    static const char *const bad_merge[] = {"h e", "he"};
    int32_t bad_types[BPE_V];
    memcpy(bad_types, v.types, sizeof bad_types);
    bad_types[260] = 9;
    static const struct {
        int what;
        llmem_status want;
        const char *mentions;
    } cases[] = {
        {0, LLMEM_EFORMAT, "needs tokenizer.ggml.merges"},
        {1, LLMEM_EFORMAT, "merges[1] 'he' is not 'A B'"},
        {2, LLMEM_ENOTSUP, "tokenizer.ggml.pre 'foo' is not supported"},
        {6, LLMEM_ENOTSUP, "has no tokenizer.ggml.pre"},
        {3, LLMEM_EFORMAT, "no token for byte 0x41"},
        {4, LLMEM_EFORMAT, "token_type[260] = 9"},
        {5, LLMEM_EFORMAT, "token_type: 100 entries"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        gguf_vocab g = {"gpt2", v.tokens, BPE_V, NULL, 0, false, -1, -1,
                        bpe_merges, sizeof bpe_merges / sizeof *bpe_merges, v.types, BPE_V, "gpt-2"};
        const char *saved = v.tokens['A'];
        switch (cases[c].what) {
        case 0: g.merges = NULL; break;
        case 1: g.merges = bad_merge; g.nmerges = 2; break;
        case 2: g.pre = "foo"; break;
        case 3: v.tokens['A'] = "zz"; break;
        case 4: g.types = bad_types; break;
        case 5: g.ntypes = 100; break;
        default: g.pre = NULL; break;
        }
        llmem_model *m = gguf_make(&g);
        v.tokens['A'] = saved;
        expect_refused(m, c, cases[c].want, cases[c].mentions);
    }
}

/* fuzz_tokenizer's input format (fuzz/fuzz_tokenizer.c): flags (BOS), the
 * vocabulary size and the image's length (uint16 LE), the image, the text. */
static int write_seeds(const char *dir)
{
    size_t n = 0;
    char *vocab = read_all(TOK512, &n);
    if (!vocab) {
        printf("skipped: no tokenizer seed: %s is absent\n", TOK512);
        return 77;
    }
    static const char text[] = "Once upon a time, Lily liked the big dog. \xf0\x9f\x98\x80\n\"Hi!\"";
    char path[4096];
    snprintf(path, sizeof path, "%s/tok512_once", dir);
    FILE *f = fopen(path, "wb");
    unsigned char head[5] = {1, 512 & 0xff, 512 >> 8, (unsigned char)(n & 0xff), (unsigned char)(n >> 8)};
    bool ok = f && n <= 0xffff && fwrite(head, 1, sizeof head, f) == sizeof head && fwrite(vocab, 1, n, f) == n &&
              fwrite(text, 1, sizeof text - 1, f) == sizeof text - 1;
    if (f && fclose(f)) ok = false;
    free(vocab);
    if (!ok) {
        fprintf(stderr, "cannot write %s\n", path);
        return 1;
    }
    fprintf(stderr, "seeds written to %s\n", dir);
    return 0;
}

int main(int argc, char **argv)
{
    const char *seeds = getenv("LLMEM_WRITE_TOKENIZER_SEEDS");
    if (seeds) return write_seeds(seeds);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(null_and_bad_arguments),
        cmocka_unit_test(every_truncation_is_eformat),
        cmocka_unit_test(bad_lengths_are_eformat),
        cmocka_unit_test(cap_too_small_is_erange),
        cmocka_unit_test(merges_follow_run_c),
        cmocka_unit_test(odd_vocabularies),
        cmocka_unit_test(random_vocabularies_agree_with_run_c),
        cmocka_unit_test(gguf_hostile_metadata),
        cmocka_unit_test(gguf_vocabulary_rules),
        cmocka_unit_test(bpe_gpt2_merges_and_words),
        cmocka_unit_test(bpe_special_tokens),
        cmocka_unit_test(bpe_pre_tokenizers),
        cmocka_unit_test(bpe_round_trip),
        cmocka_unit_test(bpe_hostile_metadata),
    };
    /* The real vocabularies of the shared folder (test_tokenizer_shared). */
    const struct CMUnitTest shared_tests[] = {
        cmocka_unit_test(tok512_reference_prompts),
        cmocka_unit_test(tok512_byte_fallback),
        cmocka_unit_test(tok512_decodes_reference_text),
        cmocka_unit_test(llama32k_hello_world),
        cmocka_unit_test(tok512_agrees_with_run_c),
        cmocka_unit_test(llama32k_agrees_with_run_c),
        cmocka_unit_test(long_text_is_fast_and_round_trips),
        cmocka_unit_test(threads_encode_at_once),
        cmocka_unit_test(gguf_stories260k_matches_tok512),
        cmocka_unit_test(gguf_llama32k_matches_bin),
        cmocka_unit_test(llama2c_checkpoint_has_no_vocabulary),
    };
    return test_main(argc, argv, "test_tokenizer", TEST_GROUP(tests, test_quiet_logs, NULL),
                     TEST_GROUP(shared_tests, test_quiet_logs, NULL),
                     (const char *const[]){"models/tok512.bin", "models/tokenizer-llama2-32k.bin",
                                           "models/stories260K.bin", "models/stories260K.gguf",
                                           "models/llama-2-tiny-random.gguf",
                                           "models/reference/stories260K.once.256.ids",
                                           "models/reference/stories260K.lily.128.ids", NULL});
}
