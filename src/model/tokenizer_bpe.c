/*
 * tokenizer_bpe.c - GPT-2 byte-level BPE, the vocabulary of GGUF models with
 * tokenizer.ggml.model = "gpt2" (Qwen2, Llama 3, GPT-2, most code models).
 *
 * Vocabulary. GGUF stores normal tokens in GPT-2's byte-level text: each
 * byte is one code point (the printable Latin-1 bytes stand for themselves,
 * the other 68 bytes for U+0100.. in byte order, so a space is "Ġ",
 * U+0120). At load such a piece is turned back into its bytes (NULs
 * included) and the tokenizer holds bytes only, as the SentencePiece path
 * does: lookups, merges and decode all work on bytes and decode needs no
 * scratch. Control and user-defined tokens ("<|im_start|>") are text as
 * written and stay out of the lookup table: only the special-token split
 * below produces them.
 *
 * Merges (tokenizer.ggml.merges, "A B" in byte-level text, in rank order)
 * become a hash table from the pair of token ids (A, B) to (rank, id of
 * A||B). A merge whose halves or result are not tokens cannot apply in
 * id space and is dropped (real vocabularies have none; the count is
 * kept for the load message in the log).
 *
 * Encode, as llama.cpp's BPE tokenizer does it:
 *  1. Special tokens are split out first: for each special token, longest
 *     first (ties by id), every occurrence lying wholly in text not yet
 *     claimed becomes that token (left to right, non-overlapping).
 *     User-defined tokens always; control tokens only through
 *     llmem_tokenizer_encode_special (llama.cpp's parse_special).
 *  2. Each stretch of remaining text is split by the pre-tokenizer regular
 *     expression of tokenizer.ggml.pre ("gpt-2", "qwen2", "llama-bpe", as
 *     llama.cpp names and writes them), run by PCRE2 with Unicode properties;
 *     bytes no match covers (invalid UTF-8) form words of their own.
 *  3. Each word starts as one token per byte; then, repeatedly, the
 *     adjacent pair of lowest merge rank (the leftmost on ties) merges,
 *     until no pair has a merge. As in tokenizer.c, the symbols are a linked
 *     list and candidates sit in a heap with lazy deletion: O(n log n). With
 *     "llama-bpe" a word that is itself a token is emitted whole
 *     (llama.cpp's ignore_merges).
 *  BOS is prepended when asked for and the vocabulary has one; likewise EOS.
 *
 * Decode gives a token's bytes; a control token gives nothing (llama.cpp's
 * token_to_piece without `special`).
 *
 * Memory: encode takes one malloc per call (the marks of step 1 and the
 * work arrays of step 3, sized by the text) and PCRE2's match data; the
 * tokenizer is immutable after load, so threads may encode at once (PCRE2
 * compiled patterns are shareable).
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "tokenizer_internal.h"

/* The pre-tokenizers, as their models' tokenizer.json define them. */
static const char re_gpt2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
static const char re_qwen2[] = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
                               "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char re_llama3[] = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
                                "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

typedef struct merge_slot {
    uint64_t key;  /* (a << 32 | b) + 1; 0 is empty */
    uint32_t rank;
    int32_t id;
} merge_slot;

struct llmem__tok_bpe {
    pcre2_code *re;
    bool ignore_merges;
    int32_t byte_tok[256];  /* the token of each single byte */
    merge_slot *slots;
    size_t mask;            /* slots - 1, a power of two minus one */
    uint32_t n_merges, n_dropped;
    uint32_t n_special;
    int32_t *special;       /* control and user-defined ids, longest piece first, then by id */
};

/* ---- GPT-2's byte-level text --------------------------------------------------- */

typedef struct byte_map {
    int16_t of_cp[256 + 68]; /* byte of code point c, or -1 */
} byte_map;

static void byte_map_init(byte_map *m)
{
    for (size_t c = 0; c < sizeof m->of_cp / sizeof m->of_cp[0]; c++) m->of_cp[c] = -1;
    for (unsigned b = 0; b < 256; b++) m->of_cp[llmem__gpt2_byte_cp(b)] = (int16_t)b;
}

/* One UTF-8 code point at s[0..len): its value and length, or length 0 when
 * the bytes are not a well-formed sequence. */
static size_t utf8_next(const unsigned char *s, size_t len, uint32_t *cp)
{
    unsigned c = s[0];
    size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (!n || n > len) return 0;
    uint32_t v = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3F);
    }
    *cp = v;
    return n;
}

/* Byte-level text to bytes; code points that stand for no byte (and
 * malformed UTF-8) are kept as they are. dst holds at least len bytes. */
static size_t from_byte_level(const byte_map *m, const char *s, size_t len, char *dst)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t n = utf8_next(u + i, len - i, &cp);
        if (n && cp < 256 + 68 && m->of_cp[cp] >= 0) {
            dst[o++] = (char)m->of_cp[cp];
            i += n;
        } else {
            size_t k = n ? n : 1;
            memcpy(dst + o, s + i, k);
            o += k;
            i += k;
        }
    }
    return o;
}

/* ---- the merge table ------------------------------------------------------------ */

static size_t slot_of(const llmem__tok_bpe *b, uint64_t key)
{
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    return (size_t)(h ^ (h >> 29)) & b->mask;
}

static const merge_slot *merge_find(const llmem__tok_bpe *b, int32_t l, int32_t r)
{
    uint64_t key = ((uint64_t)(uint32_t)l << 32 | (uint32_t)r) + 1;
    for (size_t i = slot_of(b, key);; i = (i + 1) & b->mask) {
        if (b->slots[i].key == key) return &b->slots[i];
        if (!b->slots[i].key) return NULL;
    }
}

/* First come, first kept: the lowest rank of a pair wins. */
static void merge_add(llmem__tok_bpe *b, int32_t l, int32_t r, uint32_t rank, int32_t id)
{
    uint64_t key = ((uint64_t)(uint32_t)l << 32 | (uint32_t)r) + 1;
    for (size_t i = slot_of(b, key);; i = (i + 1) & b->mask) {
        if (b->slots[i].key == key) return;
        if (!b->slots[i].key) {
            b->slots[i] = (merge_slot){key, rank, id};
            b->n_merges++;
            return;
        }
    }
}

/* ---- loading -------------------------------------------------------------------- */

typedef struct load_ctx {
    const llmem_model *m;
    const byte_map *map;
    bool has_scores;
    const uint8_t *types; /* [V] GGUF token types, read once before the build */
    char *buf; /* scratch for one decoded piece */
    size_t cap;
} load_ctx;

/* Every token's type (LLMEM__TOK_NORMAL for all when the file has none),
 * into a new array of V bytes. */
static llmem_status token_types_read(const llmem_model *m, bool has, uint32_t V, uint8_t **out)
{
    uint8_t *types = malloc(V ? V : 1);
    if (!types) return llmem__fail(LLMEM_ENOMEM, "tokenizer: out of memory for %u token types", V);
    for (uint32_t i = 0; i < V; i++) {
        double v = LLMEM__TOK_NORMAL;
        llmem_status st = has ? llmem_model_meta_array_num(m, "tokenizer.ggml.token_type", i, &v) : LLMEM_OK;
        if (st) {
            free(types);
            return llmem__fail(LLMEM_EFORMAT, "tokenizer: tokenizer.ggml.token_type[%u]: %s", i,
                               llmem_status_name(st));
        }
        if (!(v >= 0 && v <= 6)) {
            free(types);
            return llmem__fail(LLMEM_EFORMAT, "tokenizer: tokenizer.ggml.token_type[%u] = %g is not a token type (0-6)",
                               i, v);
        }
        types[i] = (uint8_t)v;
    }
    *out = types;
    return LLMEM_OK;
}

static bool is_special_type(int type) { return type == LLMEM__TOK_CONTROL || type == LLMEM__TOK_USER_DEFINED; }

static llmem_status bpe_get(void *ctx, uint32_t i, const char **s, size_t *len, float *score, bool *unlisted)
{
    load_ctx *c = ctx;
    const char *raw;
    size_t n;
    llmem_status st = llmem_model_meta_array_str(c->m, "tokenizer.ggml.tokens", i, &raw, &n);
    if (st) return llmem__fail(LLMEM_EFORMAT, "tokenizer: tokenizer.ggml.tokens[%u]: %s", i, llmem_status_name(st));
    *score = 0;
    if (c->has_scores) {
        double v;
        st = llmem_model_meta_array_num(c->m, "tokenizer.ggml.scores", i, &v);
        if (st) return llmem__fail(LLMEM_EFORMAT, "tokenizer: tokenizer.ggml.scores[%u]: %s", i, llmem_status_name(st));
        *score = (float)v;
    }
    *unlisted = is_special_type(c->types[i]);
    if (*unlisted) { /* written as text, not byte-level */
        *s = raw;
        *len = n;
        return LLMEM_OK;
    }
    if (n > c->cap) {
        size_t want = n > 2 * c->cap ? n : 2 * c->cap;
        char *nb = realloc(c->buf, want);
        if (!nb) return llmem__fail(LLMEM_ENOMEM, "tokenizer: out of memory for token %u (%zu bytes)", i, n);
        c->buf = nb;
        c->cap = want;
    }
    *s = c->buf;
    *len = from_byte_level(c->map, raw, n, c->buf);
    return LLMEM_OK;
}

/* A special-token id from the metadata, -1 when absent. */
static llmem_status opt_token_id(const llmem_model *m, const char *key, uint32_t V, int32_t *out)
{
    uint32_t v;
    llmem_status st = llmem_model_meta_u32(m, key, &v);
    *out = -1;
    if (st == LLMEM_ENOTFOUND) return LLMEM_OK;
    if (st) return llmem__fail(LLMEM_EFORMAT, "tokenizer: %s is not an unsigned integer", key);
    if (v >= V) return llmem__fail(LLMEM_EFORMAT, "tokenizer: %s = %u is not below the vocabulary size %u", key, v, V);
    *out = (int32_t)v;
    return LLMEM_OK;
}

static _Thread_local const llmem_tokenizer *special_sorting; /* for qsort's comparator */

static int special_cmp(const void *x, const void *y)
{
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    uint32_t la = llmem__tok_piece_len(special_sorting, a), lb = llmem__tok_piece_len(special_sorting, b);
    if (la != lb) return la > lb ? -1 : 1;
    return (a > b) - (a < b);
}

static llmem_status compile_pre(const char *pre, size_t plen, llmem__tok_bpe *b)
{
    const char *pattern;
    /* The names llama.cpp gives them (llama-vocab.cpp), so a file reads
     * the same in both. Without the key llama.cpp falls back to its own
     * "default" split (four patterns in turn), which is not done here. */
    if (!pre)
        return llmem__fail(LLMEM_ENOTSUP, "tokenizer: the gpt2 vocabulary has no tokenizer.ggml.pre (an older "
                                          "file?); supported: gpt-2, qwen2, llama-bpe");
    if (plen == 5 && !memcmp(pre, "gpt-2", 5))
        pattern = re_gpt2;
    else if (plen == 5 && !memcmp(pre, "qwen2", 5))
        pattern = re_qwen2;
    else if ((plen == 9 && !memcmp(pre, "llama-bpe", 9)) || (plen == 6 && !memcmp(pre, "llama3", 6)) ||
             (plen == 8 && !memcmp(pre, "llama-v3", 8))) {
        pattern = re_llama3;
        b->ignore_merges = true;
    } else
        return llmem__fail(LLMEM_ENOTSUP,
                           "tokenizer: tokenizer.ggml.pre '%.*s' is not supported (gpt-2, qwen2, llama-bpe)",
                           (int)(plen > 64 ? 64 : plen), pre);
    int err;
    PCRE2_SIZE at;
    b->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF,
                          &err, &at, NULL);
    if (!b->re) {
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(err, msg, sizeof msg);
        return llmem__fail(LLMEM_ENOTSUP, "tokenizer: the pre-tokenizer pattern does not compile: %s at %zu",
                           (const char *)msg, (size_t)at);
    }
    (void)pcre2_jit_compile(b->re, PCRE2_JIT_COMPLETE); /* faster where PCRE2 has a JIT; fine without */
    return LLMEM_OK;
}

/* tokenizer.ggml.merges into b's table (see the file comment); t is the
 * built vocabulary. On failure the caller destroys t. */
static llmem_status load_merges(const llmem_model *m, const llmem_tokenizer *t, llmem__tok_bpe *b,
                                const byte_map *map, uint64_t count)
{
    size_t nslots = 16;
    while (nslots < 2 * (size_t)count + 16) nslots *= 2;
    b->slots = calloc(nslots, sizeof *b->slots);
    if (!b->slots) return llmem__fail(LLMEM_ENOMEM, "tokenizer: out of memory for %llu merges", (unsigned long long)count);
    b->mask = nslots - 1;
    char *scratch = NULL;
    size_t scap = 0;
    llmem_status st = LLMEM_OK;
    for (uint32_t r = 0; r < count && !st; r++) {
        const char *s;
        size_t n;
        if ((st = llmem_model_meta_array_str(m, "tokenizer.ggml.merges", r, &s, &n))) {
            st = llmem__fail(LLMEM_EFORMAT, "tokenizer: tokenizer.ggml.merges[%u]: %s", r, llmem_status_name(st));
            break;
        }
        /* "A B": the first space after the first byte (a half may itself be
         * a space in odd vocabularies, never empty). */
        const char *sp = n > 1 ? memchr(s + 1, ' ', n - 1) : NULL;
        if (!sp || sp + 1 == s + n) {
            st = llmem__fail(LLMEM_EFORMAT, "tokenizer: tokenizer.ggml.merges[%u] '%.*s' is not 'A B'", r,
                             (int)(n > 64 ? 64 : n), s);
            break;
        }
        if (n > scap) {
            char *ns = realloc(scratch, n);
            if (!ns) {
                st = llmem__fail(LLMEM_ENOMEM, "tokenizer: out of memory for merge %u", r);
                break;
            }
            scratch = ns;
            scap = n;
        }
        size_t la = from_byte_level(map, s, (size_t)(sp - s), scratch);
        size_t lb = from_byte_level(map, sp + 1, n - (size_t)(sp - s) - 1, scratch + la);
        int32_t ia = llmem__tok_lookup2(t, scratch, la, "", 0), ib = llmem__tok_lookup2(t, scratch + la, lb, "", 0);
        int32_t ir = llmem__tok_lookup2(t, scratch, la, scratch + la, lb);
        if (ia < 0 || ib < 0 || ir < 0)
            b->n_dropped++;
        else
            merge_add(b, ia, ib, r, ir);
    }
    free(scratch);
    return st;
}

llmem_status llmem__tok_bpe_from_model(const llmem_model *m, llmem_tokenizer **out)
{
    *out = NULL;
    llmem_meta_array tokens, a;
    llmem_status st = llmem_model_meta_array(m, "tokenizer.ggml.tokens", &tokens);
    if (st) return llmem__fail(LLMEM_EFORMAT, "tokenizer: tokenizer.ggml.tokens: %s", llmem_status_name(st));
    if (tokens.type != LLMEM_META_STRING)
        return llmem__fail(LLMEM_EFORMAT, "tokenizer: tokenizer.ggml.tokens is an array of type %d, not strings",
                           (int)tokens.type);
    if (tokens.count < 256 || tokens.count > INT32_MAX)
        return llmem__fail(LLMEM_EFORMAT,
                           "tokenizer: a gpt2 vocabulary of %llu tokens is not in [256, 2^31) (one per byte at least)",
                           (unsigned long long)tokens.count);
    uint32_t V = (uint32_t)tokens.count;
    load_ctx c = {m, NULL, false, NULL, NULL, 0};
    bool has_types = false;
    st = llmem_model_meta_array(m, "tokenizer.ggml.scores", &a);
    if (st == LLMEM_OK) {
        if ((a.type != LLMEM_META_F32 && a.type != LLMEM_META_F64) || a.count != V)
            return llmem__fail(LLMEM_EFORMAT, "tokenizer: tokenizer.ggml.scores: %llu entries of type %d for %u tokens",
                               (unsigned long long)a.count, (int)a.type, V);
        c.has_scores = true;
    } else if (st != LLMEM_ENOTFOUND) {
        return llmem__fail(LLMEM_EFORMAT, "tokenizer: tokenizer.ggml.scores: %s", llmem_status_name(st));
    }
    st = llmem_model_meta_array(m, "tokenizer.ggml.token_type", &a);
    if (st == LLMEM_OK) {
        if (a.type == LLMEM_META_STRING || a.type == LLMEM_META_ARRAY || a.count != V)
            return llmem__fail(LLMEM_EFORMAT,
                               "tokenizer: tokenizer.ggml.token_type: %llu entries of type %d for %u tokens",
                               (unsigned long long)a.count, (int)a.type, V);
        has_types = true;
    } else if (st != LLMEM_ENOTFOUND) {
        return llmem__fail(LLMEM_EFORMAT, "tokenizer: tokenizer.ggml.token_type: %s", llmem_status_name(st));
    }
    llmem_meta_array merges;
    st = llmem_model_meta_array(m, "tokenizer.ggml.merges", &merges);
    if (st == LLMEM_ENOTFOUND)
        return llmem__fail(LLMEM_EFORMAT, "tokenizer: a gpt2 vocabulary needs tokenizer.ggml.merges; the model has none");
    if (st) return llmem__fail(LLMEM_EFORMAT, "tokenizer: tokenizer.ggml.merges: %s", llmem_status_name(st));
    if (merges.type != LLMEM_META_STRING || merges.count > INT32_MAX)
        return llmem__fail(LLMEM_EFORMAT, "tokenizer: tokenizer.ggml.merges is not an array of strings");
    int32_t bos, eos;
    if ((st = opt_token_id(m, "tokenizer.ggml.bos_token_id", V, &bos))) return st;
    if ((st = opt_token_id(m, "tokenizer.ggml.eos_token_id", V, &eos))) return st;
    const char *pre = NULL;
    size_t plen = 0;
    st = llmem_model_meta_str(m, "tokenizer.ggml.pre", &pre, &plen);
    if (st && st != LLMEM_ENOTFOUND) return llmem__fail(LLMEM_EFORMAT, "tokenizer: tokenizer.ggml.pre is not a string");
    if (st) pre = NULL;

    uint8_t *types = NULL;
    if ((st = token_types_read(m, has_types, V, &types))) return st;
    llmem__tok_bpe *b = calloc(1, sizeof *b);
    if (!b) {
        free(types);
        return llmem__fail(LLMEM_ENOMEM, "tokenizer: out of memory");
    }
    if ((st = compile_pre(pre, plen, b))) {
        free(types);
        llmem__tok_bpe_free(b);
        return st;
    }
    c.types = types;
    byte_map map;
    byte_map_init(&map);
    c.map = &map;
    llmem_tokenizer *t = NULL;
    st = llmem__tok_build(V, bpe_get, &c, LLMEM__STORE_RAW, bos, eos, &t);
    free(c.buf);
    if (st) {
        free(types);
        llmem__tok_bpe_free(b);
        return st;
    }
    t->bpe = b;
    t->type = types; /* the tokenizer owns it now */
    t->add_bos = false; /* gpt2 vocabularies add no BOS unless they say so */
    bool add_bos;
    if (llmem_model_meta_bool(m, "tokenizer.ggml.add_bos_token", &add_bos) == LLMEM_OK) t->add_bos = add_bos;
    uint32_t n_special = 0;
    for (uint32_t i = 0; i < V; i++)
        if (is_special_type(t->type[i]) && llmem__tok_piece_len(t, (int32_t)i)) n_special++;
    for (unsigned by = 0; by < 256; by++) {
        char ch = (char)by;
        b->byte_tok[by] = llmem__tok_lookup2(t, &ch, 1, "", 0);
        if (b->byte_tok[by] < 0) {
            llmem_tokenizer_destroy(t);
            return llmem__fail(LLMEM_EFORMAT,
                               "tokenizer: the gpt2 vocabulary has no token for byte 0x%02X (not byte-level)", by);
        }
    }
    b->special = malloc((size_t)(n_special ? n_special : 1) * sizeof *b->special);
    if (!b->special) {
        llmem_tokenizer_destroy(t);
        return llmem__fail(LLMEM_ENOMEM, "tokenizer: out of memory for %u special tokens", n_special);
    }
    for (uint32_t i = 0; i < V; i++)
        if (is_special_type(t->type[i]) && llmem__tok_piece_len(t, (int32_t)i)) b->special[b->n_special++] = (int32_t)i;
    special_sorting = t;
    qsort(b->special, b->n_special, sizeof *b->special, special_cmp);
    special_sorting = NULL;

    if ((st = load_merges(m, t, b, &map, merges.count))) {
        llmem_tokenizer_destroy(t);
        return st;
    }
    if (b->n_dropped)
        llmem__log(LLMEM_LOG_INFO, "tokenizer: %u of %llu merges name no token and are left out", b->n_dropped,
                   (unsigned long long)merges.count);
    *out = t;
    return LLMEM_OK;
}

void llmem__tok_bpe_free(llmem__tok_bpe *b)
{
    if (!b) return;
    pcre2_code_free(b->re);
    free(b->slots);
    free(b->special);
    free(b);
}

/* ---- encoding ------------------------------------------------------------------- */

typedef struct emit {
    int32_t *out;
    size_t cap, n;
} emit;

static inline void put(emit *e, int32_t id)
{
    if (e->n < e->cap) e->out[e->n] = id;
    e->n++;
}

/* BPE's pairs: the merge of a then b if the merges list has it, by rank. */
static bool bpe_pair(const void *ctx, int32_t a, int32_t b, int32_t *id, uint32_t *prio)
{
    const merge_slot *s = merge_find(ctx, a, b);
    if (!s) return false;
    *id = s->id;
    *prio = s->rank;
    return true;
}

/* One pre-tokenized word. */
static void bpe_word(const llmem_tokenizer *t, llmem__tok_merges *w, const unsigned char *s, size_t len, emit *e)
{
    if (!len) return;
    const llmem__tok_bpe *b = t->bpe;
    if (b->ignore_merges) {
        int32_t whole = llmem__tok_lookup2(t, (const char *)s, len, "", 0);
        if (whole >= 0) {
            put(e, whole);
            return;
        }
    }
    int32_t k = (int32_t)len;
    for (int32_t i = 0; i < k; i++) w->tok[i] = b->byte_tok[s[i]];
    llmem__tok_merge(w, k);
    for (int32_t i = 0; i >= 0; i = w->next[i]) put(e, w->tok[i]);
}

/* A stretch of text with no special token: pre-tokenize, then BPE. */
static llmem_status bpe_stretch(const llmem_tokenizer *t, llmem__tok_merges *w, pcre2_match_data *md, const unsigned char *s,
                                size_t len, emit *e)
{
    size_t at = 0;
    while (at < len) {
        int rc = pcre2_match(t->bpe->re, (PCRE2_SPTR)s, len, at, 0, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return llmem__fail(LLMEM_EINVAL, "tokenizer: encode: pre-tokenizer: %s", (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t from = ov[0], to = ov[1];
        if (from > at) bpe_word(t, w, s + at, from - at, e); /* bytes no match covers */
        if (to == from) { /* an empty match (no pattern here has one): step on */
            at = from + 1;
            continue;
        }
        bpe_word(t, w, s + from, to - from, e);
        at = to;
    }
    if (at < len) bpe_word(t, w, s + at, len - at, e);
    return LLMEM_OK;
}

llmem_status llmem__tok_bpe_encode(const llmem_tokenizer *t, const char *text, size_t tlen, bool special, bool bos,
                                   bool eos, int32_t *out, size_t cap, size_t *n)
{
    const llmem__tok_bpe *b = t->bpe;
    if (tlen > (size_t)INT32_MAX / 2)
        return llmem__fail(LLMEM_EOVERFLOW, "tokenizer: encode: a text of %zu bytes is too long", tlen);
    /* One block: marks (int32 per byte), then symbols (3 int32 per byte),
     * then the heap (at most 3 entries per byte: the initial pairs and two
     * per merge). */
    size_t per = 4 * sizeof(int32_t) + 3 * sizeof(llmem__tok_cand), m = tlen ? tlen : 1;
    if (m > SIZE_MAX / per) return llmem__fail(LLMEM_EOVERFLOW, "tokenizer: encode: a text of %zu bytes is too long", tlen);
    char *mem = malloc(m * per);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(b->re, NULL);
    if (!mem || !md) {
        free(mem);
        pcre2_match_data_free(md);
        return llmem__fail(LLMEM_ENOMEM, "tokenizer: encode: out of memory for %zu bytes of text", tlen);
    }
    llmem__tok_merges w = {NULL, NULL, NULL, (llmem__tok_cand *)(void *)mem, 0, bpe_pair, b};
    int32_t *mark = (int32_t *)(void *)(mem + 3 * sizeof(llmem__tok_cand) * m);
    w.tok = mark + m;
    w.prev = w.tok + m;
    w.next = w.prev + m;
    for (size_t i = 0; i < tlen; i++) mark[i] = -1;

    /* 1. Special tokens, longest first. */
    for (uint32_t k = 0; k < b->n_special; k++) {
        int32_t id = b->special[k];
        if (t->type[id] == LLMEM__TOK_CONTROL && !special) continue;
        const char *p = llmem__tok_piece(t, id);
        size_t pl = llmem__tok_piece_len(t, id);
        size_t at = 0;
        while (at + pl <= tlen) {
            const char *hit = memmem(text + at, tlen - at, p, pl);
            if (!hit) break;
            size_t h = (size_t)(hit - text);
            bool free_run = true;
            for (size_t j = 0; j < pl; j++)
                if (mark[h + j] != -1) {
                    free_run = false;
                    break;
                }
            if (!free_run) {
                at = h + 1;
                continue;
            }
            mark[h] = id;
            for (size_t j = 1; j < pl; j++) mark[h + j] = -2;
            at = h + pl;
        }
    }

    emit e = {out, cap, 0};
    if (bos && t->bos >= 0) put(&e, t->bos);
    llmem_status st = LLMEM_OK;
    for (size_t i = 0; i < tlen && !st;) {
        if (mark[i] >= 0) {
            put(&e, mark[i]);
            i++;
            while (i < tlen && mark[i] == -2) i++;
            continue;
        }
        size_t j = i;
        while (j < tlen && mark[j] == -1) j++;
        st = bpe_stretch(t, &w, md, (const unsigned char *)text + i, j - i, &e);
        i = j;
    }
    if (!st && eos && t->eos >= 0) put(&e, t->eos);
    free(mem);
    pcre2_match_data_free(md);
    if (st) return st;
    *n = e.n;
    if (e.n > cap) return llmem__fail(LLMEM_ERANGE, "tokenizer: encode: %zu tokens do not fit in %zu", e.n, cap);
    return LLMEM_OK;
}
