/*
 * tokenizer.c - the SentencePiece-style BPE tokenizer of llama models, with
 * llama2.c run.c's encode and decode, so token ids match its outputs.
 *
 * Vocabulary. Per id: its piece (bytes, NUL-terminated in one blob) and its
 * score. A piece ends at its first NUL byte, as run.c's C strings do. GGUF
 * vocabularies write a space as U+2581 ("▁"); it is turned into ' ' at load,
 * exactly as llama2.c's exporter does when it writes tokenizer.bin, so both
 * sources hold the same pieces and everything downstream is uniform.
 * llmem_tokenizer_token returns the piece as held here (spaces, not "▁").
 * Besides, a table of (piece, id) entries sorted by piece bytes (memcmp
 * order, i.e. strcmp's), then by id, is built once at load; a lookup is a
 * lower-bound binary search, so among equal pieces the lowest id wins
 * (run.c's bsearch picks an unspecified one; real vocabularies have none).
 * In GGUF vocabularies the BOS and EOS tokens ("<s>", "</s>") are left out
 * of that table: tokenizer.bin renames them "\n<s>\n" and "\n</s>\n", which
 * no text or merge can produce, and GGUF must encode the same.
 *
 * Encode (run.c): optional BOS; when the text is not empty, the dummy prefix
 * (the token " "); then the text split into code points the way run.c does
 * (a byte that is not a continuation byte starts a new buffer; continuation
 * bytes are appended while the buffer holds fewer than 4 bytes) and each
 * buffer looked up whole, else one byte-fallback token per byte; then,
 * repeatedly, among the adjacent pairs whose concatenation is a vocabulary
 * piece with score > -1e10 (run.c's initial best score; a NaN score never
 * compares greater, so never merges), the one of highest score, the leftmost
 * on ties (run.c scans left to right with a strict >), is replaced by that
 * piece's id; until no pair merges; then optional EOS. BOS takes part in the
 * merges, as in run.c; EOS is appended after them.
 *
 * run.c rescans every pair after each merge: O(n^2) lookups, minutes for a
 * 100 KB text. Here the symbols are a doubly linked list over their initial
 * positions and the candidate pairs sit in a binary max-heap ordered by
 * (score descending, left position ascending), with lazy deletion: an entry
 * records the two token ids it was computed from and is dropped when popped
 * if its left symbol no longer holds that id or its right neighbour no longer
 * holds the other (a dead symbol holds -1). Merging never reorders symbols,
 * so the smallest initial position is the leftmost current one, and every
 * current eligible pair has an entry (the pairs a merge creates are pushed
 * right after it); so the top valid entry is exactly the pair run.c's scan
 * picks and the results are identical. O(n log n) lookups. Pairs are looked
 * up without building the concatenated string (the comparison walks both
 * halves), so no scratch buffer of max_token_length is needed.
 *
 * Memory: encode keeps its symbols and heap on the stack for texts of up to
 * LLMEM__TOK_SMALL symbols (prompts), else takes one malloc per call. It
 * touches nothing in the tokenizer, which is immutable after load, so any
 * number of threads may encode and decode at once.
 *
 * Byte fallback: tokenizer.bin follows run.c, byte b is id b + 3 (<0x00> is
 * 3); GGUF looks the "<0xXX>" tokens up by name. When that id does not exist
 * (tiny or odd vocabularies, where run.c would index out of bounds) the
 * other rule is tried, then <unk> (id 0). Likewise a vocabulary without " "
 * gets the byte fallback of ' ' as its dummy prefix (run.c would emit -1).
 *
 * Decode (run.c): after BOS a leading space is dropped; then a piece that is
 * exactly "<0x" two hex digits ">" is that one byte (run.c's sscanf would
 * also accept a few malformed forms such as "<0x4>" that no real vocabulary
 * has). Bytes come from a 256-entry table inside the tokenizer.
 *
 * Checks at load (tokenizer.bin): max_token_length in [1, 65536], every
 * entry's header and bytes inside the image, each length in
 * [0, max_token_length]; failures are LLMEM_EFORMAT naming the token and the
 * byte offset. Scores may be any float: NaN and -inf simply never merge.
 * vocab_size must be at least 3 (<unk>, BOS 1 and EOS 2 are fixed ids).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "llmem/tokenizer.h"
#include "tokenizer_internal.h"

/* Texts of up to this many symbols (bytes + BOS + dummy prefix) encode on
 * the stack: 12 bytes of list and 72 of heap per symbol, about 11 KiB. */
#define LLMEM__TOK_SMALL 128
/* Longest max_token_length a tokenizer.bin may declare. */
#define LLMEM__TOK_MAX_LEN 65536
/* run.c's initial best score: only pairs scoring above it merge. */
#define LLMEM__TOK_MIN_SCORE (-1e10f)


static inline const char *piece_s(const llmem_tokenizer *t, int32_t id) { return llmem__tok_piece(t, id); }
static inline uint32_t piece_len(const llmem_tokenizer *t, int32_t id) { return llmem__tok_piece_len(t, id); }

/* ---- lookup -------------------------------------------------------------- */

/* memcmp-order comparison of p[0..plen) with the concatenation a||b. */
static int cmp_concat(const char *p, size_t plen, const char *a, size_t alen, const char *b, size_t blen)
{
    size_t n = plen < alen ? plen : alen;
    int c = n ? memcmp(p, a, n) : 0;
    if (c) return c;
    if (plen < alen) return -1;
    size_t rest = plen - alen;
    n = rest < blen ? rest : blen;
    c = n ? memcmp(p + alen, b, n) : 0;
    if (c) return c;
    return (rest > blen) - (rest < blen);
}

/* The id whose piece is a||b (the lowest such id), or -1. */
int32_t llmem__tok_lookup2(const llmem_tokenizer *t, const char *a, size_t alen, const char *b, size_t blen)
{
    size_t lo = 0, hi = t->n_sorted;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int32_t e = t->sorted[mid];
        if (cmp_concat(piece_s(t, e), piece_len(t, e), a, alen, b, blen) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < t->n_sorted) {
        int32_t e = t->sorted[lo];
        if (cmp_concat(piece_s(t, e), piece_len(t, e), a, alen, b, blen) == 0) return e;
    }
    return -1;
}

#define lookup2 llmem__tok_lookup2

/* The tokenizer being sorted, for qsort's comparator (one per thread). */
static _Thread_local const llmem_tokenizer *sorting;

static int entry_cmp(const void *x, const void *y)
{
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    int c = cmp_concat(piece_s(sorting, a), piece_len(sorting, a), piece_s(sorting, b), piece_len(sorting, b), "", 0);
    if (c) return c;
    return (a > b) - (a < b);
}

/* ---- building ------------------------------------------------------------ */

/* The stored form of a raw piece (see llmem__tok_store). Writes it to dst
 * when dst is not NULL; returns its length. */
static size_t store_piece(char *dst, const char *s, size_t len, llmem__tok_store how)
{
    if (how == LLMEM__STORE_RAW) {
        if (dst && len) memcpy(dst, s, len);
        return len;
    }
    bool gguf = how == LLMEM__STORE_SPM_GGUF;
    size_t o = 0;
    for (size_t i = 0; i < len && s[i]; i++) {
        if (gguf && i + 2 < len && (unsigned char)s[i] == 0xE2 && (unsigned char)s[i + 1] == 0x96 &&
            (unsigned char)s[i + 2] == 0x81) {
            if (dst) dst[o] = ' ';
            o++;
            i += 2;
            continue;
        }
        if (dst) dst[o] = s[i];
        o++;
    }
    return o;
}

static const char hex_upper[] = "0123456789ABCDEF";

/* One vocabulary entry as a builder's getter gives it. */
typedef struct tok_entry {
    const char *s;
    size_t len;
    float score;
    bool unlisted;
} tok_entry;

static llmem_status get_entry(llmem__tok_get_fn get, void *ctx, uint32_t i, tok_entry *e)
{
    return get(ctx, i, &e->s, &e->len, &e->score, &e->unlisted);
}

llmem_status llmem__tok_build(uint32_t V, llmem__tok_get_fn get, void *ctx, llmem__tok_store how, int32_t bos,
                              int32_t eos, llmem_tokenizer **out)
{
    /* Pass 1: sizes. */
    size_t blob = 0;
    uint32_t maxlen = 0;
    for (uint32_t i = 0; i < V; i++) {
        tok_entry e;
        llmem_status st = get_entry(get, ctx, i, &e);
        if (st) return st;
        size_t n = store_piece(NULL, e.s, e.len, how);
        if (n > UINT32_MAX) return llmem__fail(LLMEM_EFORMAT, "tokenizer: token %u is over 4 GiB", i);
        if (n > maxlen) maxlen = (uint32_t)n;
        if (!llmem__add_ok(blob, n + 1, &blob)) return llmem__fail(LLMEM_EOVERFLOW, "tokenizer: vocabulary too large");
    }
    if (blob > UINT32_MAX) return llmem__fail(LLMEM_EOVERFLOW, "tokenizer: vocabulary text over 4 GiB");
    size_t bytes = sizeof(llmem_tokenizer), off_off, score_off, sorted_off, blob_off, tmp;
    bool ok = llmem__align_up(bytes, 16, &off_off) && llmem__mul_ok((size_t)V + 1, sizeof(uint32_t), &tmp) &&
              llmem__add_ok(off_off, tmp, &score_off) && llmem__mul_ok(V, sizeof(float), &tmp) &&
              llmem__add_ok(score_off, tmp, &sorted_off) && llmem__mul_ok(V, sizeof(int32_t), &tmp) &&
              llmem__add_ok(sorted_off, tmp, &blob_off) && llmem__add_ok(blob_off, blob, &bytes);
    if (!ok) return llmem__fail(LLMEM_EOVERFLOW, "tokenizer: %u tokens overflow the size arithmetic", V);
    char *mem = malloc(bytes);
    if (!mem) return llmem__fail(LLMEM_ENOMEM, "tokenizer: out of memory for %u tokens (%zu bytes)", V, bytes);
    llmem_tokenizer *t = (llmem_tokenizer *)mem;
    memset(t, 0, sizeof *t);
    t->vocab_size = V;
    t->max_token_length = maxlen;
    t->bos = bos;
    t->eos = eos;
    t->add_bos = bos >= 0;
    t->off = (uint32_t *)(void *)(mem + off_off);
    t->score = (float *)(void *)(mem + score_off);
    t->sorted = (int32_t *)(void *)(mem + sorted_off);
    t->blob = mem + blob_off;

    /* Pass 2: copy. */
    size_t o = 0;
    uint32_t ns = 0;
    for (uint32_t i = 0; i < V; i++) {
        tok_entry e;
        llmem_status st = get_entry(get, ctx, i, &e);
        if (st) {
            free(mem);
            return st;
        }
        char *dst = t->blob + o;
        size_t n = store_piece(dst, e.s, e.len, how);
        /* Both passes read the same immutable bytes (the caller's image, a
         * read-only mapping), so pass 1's sizes hold. */
        dst[n] = '\0';
        t->off[i] = (uint32_t)o;
        t->score[i] = e.score;
        o += n + 1;
        if (e.unlisted) continue;
        t->sorted[ns++] = (int32_t)i;
    }
    t->off[V] = (uint32_t)o;
    t->n_sorted = ns;
    sorting = t;
    qsort(t->sorted, ns, sizeof *t->sorted, entry_cmp);
    sorting = NULL;

    t->space_id = lookup2(t, " ", 1, "", 0);
    for (int b = 0; b < 256; b++) {
        char name[7] = {'<', '0', 'x', hex_upper[b >> 4], hex_upper[b & 15], '>', 0};
        int32_t by_name = lookup2(t, name, 6, "", 0);
        int32_t plus3 = (uint32_t)b + 3 < V ? b + 3 : -1;
        int32_t id = how != LLMEM__STORE_BIN ? (by_name >= 0 ? by_name : plus3) : (plus3 >= 0 ? plus3 : by_name);
        t->byte_id[b] = id >= 0 ? id : 0;
        t->byte_piece[b][0] = (char)b;
        t->byte_piece[b][1] = '\0';
    }
    *out = t;
    return LLMEM_OK;
}

/* ---- tokenizer.bin ------------------------------------------------------- */

static int32_t rd_i32(const unsigned char *p)
{
    uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    int32_t r;
    memcpy(&r, &v, sizeof r);
    return r;
}

static float rd_f32(const unsigned char *p)
{
    uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    float r;
    memcpy(&r, &v, sizeof r);
    return r;
}

typedef struct bin_ctx {
    const unsigned char *data;
    size_t *offset; /* [V]: where entry i's header starts (validated) */
} bin_ctx;

static llmem_status bin_get(void *ctx, uint32_t i, const char **s, size_t *len, float *score, bool *unlisted)
{
    const bin_ctx *c = ctx;
    *unlisted = false;
    const unsigned char *p = c->data + c->offset[i];
    *score = rd_f32(p);
    *len = (size_t)rd_i32(p + 4);
    *s = (const char *)p + 8;
    return LLMEM_OK;
}

llmem_status llmem_tokenizer_load_memory(const void *data, size_t size, uint32_t vocab_size, llmem_tokenizer **out)
{
    if (out) *out = NULL;
    if (!data || !out) return llmem__fail(LLMEM_EINVAL, "tokenizer: null argument");
    if (vocab_size < 3 || vocab_size > INT32_MAX)
        return llmem__fail(LLMEM_EINVAL, "tokenizer: vocab_size %u is not in [3, 2^31) (<unk>, BOS 1, EOS 2)",
                           vocab_size);
    const unsigned char *d = data;
    if (size < 4) return llmem__fail(LLMEM_EFORMAT, "tokenizer.bin: %zu bytes, too short for max_token_length", size);
    int32_t maxlen = rd_i32(d);
    if (maxlen < 1 || maxlen > LLMEM__TOK_MAX_LEN)
        return llmem__fail(LLMEM_EFORMAT, "tokenizer.bin: max_token_length %d at byte 0 is not in [1, %d]", maxlen,
                           LLMEM__TOK_MAX_LEN);
    /* Every entry takes at least 8 bytes: an image too short for
     * vocab_size allocates nothing; the walk below, without offsets, finds
     * the token where it runs out, for the message. */
    size_t *offset = NULL;
    size_t off = 4;
    uint32_t i = 0;
    llmem_status st = LLMEM_OK;
    if ((size - 4) / 8 >= vocab_size) {
        offset = malloc((size_t)vocab_size * sizeof *offset);
        if (!offset) return llmem__fail(LLMEM_ENOMEM, "tokenizer.bin: out of memory for %u offsets", vocab_size);
    }
    for (; i < vocab_size; i++) {
        if (size - off < 8) {
            st = llmem__fail(LLMEM_EFORMAT,
                             "tokenizer.bin: truncated: token %u of %u at byte %zu needs an 8-byte header, %zu bytes left",
                             i, vocab_size, off, size - off);
            break;
        }
        int32_t len = rd_i32(d + off + 4);
        if (len < 0 || len > maxlen) {
            st = llmem__fail(LLMEM_EFORMAT,
                             "tokenizer.bin: token %u at byte %zu: length %d is not in [0, max_token_length %d]", i,
                             off, len, maxlen);
            break;
        }
        if ((size_t)len > size - off - 8) {
            st = llmem__fail(LLMEM_EFORMAT,
                             "tokenizer.bin: truncated: token %u at byte %zu has length %d, %zu bytes left", i, off,
                             len, size - off - 8);
            break;
        }
        if (offset) offset[i] = off;
        off += 8 + (size_t)len;
    }
    if (!st && !offset) /* unreachable: a short image fails in the walk */
        st = llmem__fail(LLMEM_EFORMAT, "tokenizer.bin: %zu bytes cannot hold %u tokens", size, vocab_size);
    if (!st) {
        bin_ctx c = {d, offset};
        st = llmem__tok_build(vocab_size, bin_get, &c, LLMEM__STORE_BIN, 1, 2, out);
    }
    free(offset);
    return st;
}

llmem_status llmem_tokenizer_load(const char *path, uint32_t vocab_size, llmem_tokenizer **out)
{
    if (out) *out = NULL;
    if (!path || !out) return llmem__fail(LLMEM_EINVAL, "tokenizer: null argument");
    void *buf;
    size_t n;
    llmem_status st = llmem__read_file(path, (size_t)1 << 31, "tokenizer", &buf, &n);
    if (!st) {
        uint64_t seq = llmem__error_seq();
        st = llmem_tokenizer_load_memory(buf, n, vocab_size, out);
        if (st && llmem__error_seq() != seq) {
            /* Say which file: prefix the message the parser left. */
            char msg[512];
            snprintf(msg, sizeof msg, "%s", llmem_error_message());
            llmem__fail(st, "'%s': %s", path, msg);
        }
    }
    free(buf);
    return st;
}

/* ---- GGUF metadata ------------------------------------------------------- */

typedef struct gguf_ctx {
    const llmem_model *m;
    int32_t bos, eos;
} gguf_ctx;

static llmem_status gguf_get(void *ctx, uint32_t i, const char **s, size_t *len, float *score, bool *unlisted)
{
    const gguf_ctx *c = ctx;
    /* tokenizer.bin renames BOS and EOS "\n<s>\n" and "\n</s>\n", which no
     * text or merge can produce: GGUF must encode the same. */
    *unlisted = (int32_t)i == c->bos || (int32_t)i == c->eos;
    llmem_status st = llmem_model_meta_array_str(c->m, "tokenizer.ggml.tokens", i, s, len);
    if (st) return llmem__fail(LLMEM_EFORMAT, "tokenizer: tokenizer.ggml.tokens[%u]: %s", i, llmem_status_name(st));
    double v;
    st = llmem_model_meta_array_num(c->m, "tokenizer.ggml.scores", i, &v);
    if (st) return llmem__fail(LLMEM_EFORMAT, "tokenizer: tokenizer.ggml.scores[%u]: %s", i, llmem_status_name(st));
    *score = (float)v;
    return LLMEM_OK;
}

/* A special-token id from the metadata, or the default when absent. */
static llmem_status gguf_token_id(const llmem_model *m, const char *key, uint32_t def, uint32_t V, int32_t *out)
{
    uint32_t v = def;
    llmem_status st = llmem_model_meta_u32(m, key, &v);
    if (st == LLMEM_ENOTFOUND)
        v = def;
    else if (st)
        return llmem__fail(LLMEM_EFORMAT, "tokenizer: %s is not an unsigned integer", key);
    if (v >= V) return llmem__fail(LLMEM_EFORMAT, "tokenizer: %s = %u is not below the vocabulary size %u", key, v, V);
    *out = (int32_t)v;
    return LLMEM_OK;
}

llmem_status llmem_tokenizer_from_model(const llmem_model *m, llmem_tokenizer **out)
{
    if (out) *out = NULL;
    if (!m || !out) return llmem__fail(LLMEM_EINVAL, "tokenizer: null argument");
    const char *name;
    size_t nlen;
    llmem_status st = llmem_model_meta_str(m, "tokenizer.ggml.model", &name, &nlen);
    if (st == LLMEM_ENOTFOUND)
        return llmem__fail(LLMEM_ENOTFOUND, "tokenizer: the model has no tokenizer.ggml.model (a llama2.c "
                                            "checkpoint? load its tokenizer.bin)");
    if (st) return llmem__fail(LLMEM_EFORMAT, "tokenizer: tokenizer.ggml.model is not a string");
    if (nlen == 4 && memcmp(name, "gpt2", 4) == 0) return llmem__tok_bpe_from_model(m, out);
    if (nlen != 5 || memcmp(name, "llama", 5) != 0)
        return llmem__fail(LLMEM_ENOTSUP,
                           "tokenizer: tokenizer.ggml.model '%.*s' is not supported (only 'llama' and 'gpt2')",
                           (int)(nlen > 64 ? 64 : nlen), name);
    llmem_meta_array tokens, scores;
    st = llmem_model_meta_array(m, "tokenizer.ggml.tokens", &tokens);
    if (st) return llmem__fail(LLMEM_EFORMAT, "tokenizer: tokenizer.ggml.tokens: %s", llmem_status_name(st));
    if (tokens.type != LLMEM_META_STRING)
        return llmem__fail(LLMEM_EFORMAT, "tokenizer: tokenizer.ggml.tokens is an array of type %d, not strings",
                           (int)tokens.type);
    if (tokens.count < 3 || tokens.count > INT32_MAX)
        return llmem__fail(LLMEM_EFORMAT, "tokenizer: tokenizer.ggml.tokens has %llu entries, not in [3, 2^31)",
                           (unsigned long long)tokens.count);
    st = llmem_model_meta_array(m, "tokenizer.ggml.scores", &scores);
    if (st)
        return llmem__fail(LLMEM_EFORMAT, "tokenizer: tokenizer.ggml.scores: %s (the merges need scores)",
                           llmem_status_name(st));
    if (scores.type != LLMEM_META_F32 && scores.type != LLMEM_META_F64)
        return llmem__fail(LLMEM_EFORMAT, "tokenizer: tokenizer.ggml.scores is an array of type %d, not floats",
                           (int)scores.type);
    if (scores.count != tokens.count)
        return llmem__fail(LLMEM_EFORMAT, "tokenizer: %llu scores for %llu tokens",
                           (unsigned long long)scores.count, (unsigned long long)tokens.count);
    uint32_t V = (uint32_t)tokens.count;
    int32_t bos, eos;
    if ((st = gguf_token_id(m, "tokenizer.ggml.bos_token_id", 1, V, &bos))) return st;
    if ((st = gguf_token_id(m, "tokenizer.ggml.eos_token_id", 2, V, &eos))) return st;
    gguf_ctx c = {m, bos, eos};
    st = llmem__tok_build(V, gguf_get, &c, LLMEM__STORE_SPM_GGUF, bos, eos, out);
    bool add_bos;
    if (!st && llmem_model_meta_bool(m, "tokenizer.ggml.add_bos_token", &add_bos) == LLMEM_OK)
        (*out)->add_bos = add_bos;
    return st;
}

void llmem_tokenizer_destroy(llmem_tokenizer *t)
{
    if (!t) return;
    llmem__tok_bpe_free(t->bpe);
    free(t->type);
    free(t);
}

bool llmem_tokenizer_add_bos(const llmem_tokenizer *t) { return t && t->add_bos && t->bos >= 0; }
bool llmem_tokenizer_is_bpe(const llmem_tokenizer *t) { return t && t->bpe; }

uint32_t llmem_tokenizer_vocab_size(const llmem_tokenizer *t) { return t ? t->vocab_size : 0; }
int32_t llmem_tokenizer_bos(const llmem_tokenizer *t) { return t ? t->bos : -1; }
int32_t llmem_tokenizer_eos(const llmem_tokenizer *t) { return t ? t->eos : -1; }

/* ---- encode -------------------------------------------------------------- */

/* ---- the merge loop (tokenizer_internal.h) ------------------------------------- */

static void heap_push(llmem__tok_merges *w, llmem__tok_cand c)
{
    size_t i = w->nheap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (c.key >= w->heap[p].key) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = c;
}

static llmem__tok_cand heap_pop(llmem__tok_merges *w)
{
    llmem__tok_cand top = w->heap[0], last = w->heap[--w->nheap];
    size_t n = w->nheap, i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && w->heap[c + 1].key < w->heap[c].key) c++;
        if (w->heap[c].key >= last.key) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
}

/* Push the pair (l, next[l]) if it merges. */
static void push_pair(llmem__tok_merges *w, int32_t l)
{
    if (l < 0) return;
    int32_t r = w->next[l], id;
    uint32_t prio;
    if (r < 0 || !w->pair(w->ctx, w->tok[l], w->tok[r], &id, &prio)) return;
    heap_push(w, (llmem__tok_cand){(uint64_t)prio << 32 | (uint32_t)l, l, w->tok[l], w->tok[r], id});
}

int32_t llmem__tok_merge(llmem__tok_merges *w, int32_t k)
{
    for (int32_t i = 0; i < k; i++) {
        w->prev[i] = i - 1;
        w->next[i] = i + 1 < k ? i + 1 : -1;
    }
    w->nheap = 0;
    for (int32_t i = 0; i + 1 < k; i++) push_pair(w, i);
    int32_t count = k;
    while (w->nheap) {
        llmem__tok_cand e = heap_pop(w);
        int32_t l = e.left, r = w->next[l];
        if (w->tok[l] != e.ltok || r < 0 || w->tok[r] != e.rtok) continue; /* stale */
        w->tok[l] = e.id;
        w->tok[r] = -1;
        w->next[l] = w->next[r];
        if (w->next[r] >= 0) w->prev[w->next[r]] = l;
        count--;
        push_pair(w, w->prev[l]);
        push_pair(w, l);
    }
    return count;
}

/* SentencePiece's pairs: the piece a||b if it is listed and its score can
 * merge (run.c's scan: highest score first, then leftmost). */
static bool spm_pair(const void *ctx, int32_t a, int32_t b, int32_t *id, uint32_t *prio)
{
    const llmem_tokenizer *t = ctx;
    *id = lookup2(t, piece_s(t, a), piece_len(t, a), piece_s(t, b), piece_len(t, b));
    if (*id < 0 || !(t->score[*id] > LLMEM__TOK_MIN_SCORE)) return false;
    *prio = llmem__tok_score_prio(t->score[*id]);
    return true;
}

/* On LLMEM_ERANGE *n still gets the count needed, so (out NULL, cap 0) is a
 * size query. Allocates only for texts over LLMEM__TOK_SMALL symbols. */
static llmem_status encode(const llmem_tokenizer *t, const char *text, bool bos, bool eos, bool prefix, int32_t *out,
                           size_t cap, size_t *n)
{
    if (n) *n = 0;
    if (!t || !text || !n || (!out && cap)) return llmem__fail(LLMEM_EINVAL, "tokenizer: encode: null argument");
    size_t tlen = strlen(text);
    if (t->bpe) return llmem__tok_bpe_encode(t, text, tlen, false, bos, eos, out, cap, n);
    /* Symbols: BOS, the dummy prefix, at most one per byte. */
    size_t m;
    if (tlen > (size_t)INT32_MAX - 2)
        return llmem__fail(LLMEM_EOVERFLOW, "tokenizer: encode: a text of %zu bytes is too long", tlen);
    m = tlen + 2;

    int32_t s_tok[LLMEM__TOK_SMALL], s_prev[LLMEM__TOK_SMALL], s_next[LLMEM__TOK_SMALL];
    llmem__tok_cand s_heap[3 * LLMEM__TOK_SMALL];
    llmem__tok_merges w = {s_tok, s_prev, s_next, s_heap, 0, spm_pair, t};
    void *mem = NULL;
    if (m > LLMEM__TOK_SMALL) {
        /* Heap entries: the initial pairs plus two per merge, < 3m. */
        size_t bytes = m * (3 * sizeof(int32_t) + 3 * sizeof(llmem__tok_cand));
        if (bytes / m != 3 * sizeof(int32_t) + 3 * sizeof(llmem__tok_cand))
            return llmem__fail(LLMEM_EOVERFLOW, "tokenizer: encode: a text of %zu bytes is too long", tlen);
        mem = malloc(bytes);
        if (!mem) return llmem__fail(LLMEM_ENOMEM, "tokenizer: encode: out of memory for %zu bytes of text", tlen);
        w.heap = mem;
        w.tok = (int32_t *)(w.heap + 3 * m);
        w.prev = w.tok + m;
        w.next = w.prev + m;
    }

    /* The initial symbols, as run.c makes them. */
    int32_t k = 0;
    if (bos) w.tok[k++] = t->bos;
    if (tlen && prefix) w.tok[k++] = t->space_id >= 0 ? t->space_id : t->byte_id[' '];
    const unsigned char *c = (const unsigned char *)text;
    for (size_t i = 0; i < tlen;) {
        /* One buffer: a byte, then the continuation bytes that follow while
         * it holds fewer than 4 (a stray continuation byte starts its own). */
        size_t len = 1;
        while (len < 4 && (c[i + len] & 0xC0) == 0x80) len++;
        int32_t id = lookup2(t, (const char *)c + i, len, "", 0);
        if (id >= 0) {
            w.tok[k++] = id;
        } else {
            for (size_t j = 0; j < len; j++) w.tok[k++] = t->byte_id[c[i + j]];
        }
        i += len;
    }
    int32_t count = llmem__tok_merge(&w, k);

    size_t need = (size_t)count + (eos ? 1 : 0);
    *n = need;
    llmem_status st = LLMEM_OK;
    if (need > cap) {
        st = llmem__fail(LLMEM_ERANGE, "tokenizer: encode: %zu tokens do not fit in %zu", need, cap);
    } else {
        size_t o = 0;
        for (int32_t i = k ? 0 : -1; i >= 0; i = w.next[i]) out[o++] = w.tok[i];
        if (eos) out[o++] = t->eos;
    }
    free(mem);
    return st;
}

llmem_status llmem_tokenizer_encode(const llmem_tokenizer *t, const char *text, bool bos, bool eos, int32_t *out,
                                    size_t cap, size_t *n)
{
    return encode(t, text, bos, eos, true, out, cap, n);
}

llmem_status llmem_tokenizer_encode_fragment(const llmem_tokenizer *t, const char *text, int32_t *out, size_t cap,
                                             size_t *n)
{
    return encode(t, text, false, false, false, out, cap, n);
}

/* ---- decode -------------------------------------------------------------- */

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    return -1;
}

llmem_status llmem_tokenizer_encode_special(const llmem_tokenizer *t, const char *text, bool bos, bool eos,
                                            int32_t *out, size_t cap, size_t *n)
{
    if (n) *n = 0;
    if (!t || !text || !n || (!out && cap)) return llmem__fail(LLMEM_EINVAL, "tokenizer: encode: null argument");
    if (!t->bpe) return llmem_tokenizer_encode(t, text, bos, eos, out, cap, n);
    return llmem__tok_bpe_encode(t, text, strlen(text), true, bos, eos, out, cap, n);
}

const char *llmem_tokenizer_decode(const llmem_tokenizer *t, int32_t prev, int32_t token, size_t *len)
{
    if (len) *len = 0;
    if (!t || token < 0 || (uint32_t)token >= t->vocab_size) return NULL;
    const char *s = piece_s(t, token);
    size_t n = piece_len(t, token);
    if (t->bpe) { /* pieces are stored as bytes already; control tokens print nothing (llama.cpp's default) */
        if (t->type && t->type[token] == LLMEM__TOK_CONTROL) return "";
        if (len) *len = n;
        return s;
    }
    /* SentencePiece's decoder drops the space that starts the text. */
    if (prev == t->bos && n && s[0] == ' ') {
        s++;
        n--;
    }
    if (n == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>') {
        int hi = hexval(s[3]), lo = hexval(s[4]);
        if (hi >= 0 && lo >= 0) {
            if (len) *len = 1;
            return t->byte_piece[hi * 16 + lo];
        }
    }
    if (len) *len = n;
    return s;
}

const char *llmem_tokenizer_token(const llmem_tokenizer *t, int32_t token, size_t *len, float *score)
{
    if (len) *len = 0;
    if (score) *score = 0;
    if (!t || token < 0 || (uint32_t)token >= t->vocab_size) return NULL;
    if (len) *len = piece_len(t, token);
    if (score) *score = t->score[token];
    return piece_s(t, token);
}
