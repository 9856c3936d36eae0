/*
 * tokenizer_internal.h - what tokenizer.c (the vocabulary, SentencePiece
 * encode, decode) and tokenizer_bpe.c (GPT-2 byte-level BPE) share. Private
 * to src/model.
 */
#ifndef LLMEM_TOKENIZER_INTERNAL_H
#define LLMEM_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "llmem/tokenizer.h"

/* ---- tokenizer.c ------------------------------------------------------------------ */

typedef struct llmem__tok_bpe llmem__tok_bpe; /* tokenizer_bpe.c */

struct llmem_tokenizer {
    uint32_t vocab_size;
    uint32_t max_token_length; /* longest piece, bytes */
    int32_t bos, eos;          /* -1 when the vocabulary has none (BPE only) */
    bool add_bos;              /* the model's own default (llmem_tokenizer_add_bos) */
    int32_t space_id;          /* id of " ", or -1 */
    int32_t byte_id[256];      /* byte-fallback token of each byte (SentencePiece) */
    char byte_piece[256][2];   /* decode of <0xXX>: the byte, then NUL */
    uint32_t n_sorted;
    /* The vocabulary, packed (a 32k vocabulary takes 0.6 MB, not 1.2 MB
     * with a pointer and a length per entry and per sorted entry): */
    uint32_t *off;             /* [vocab_size + 1]: piece i is blob[off[i] .. off[i + 1] - 1), then NUL */
    float *score;              /* [vocab_size] */
    int32_t *sorted;           /* [n_sorted]: ids in memcmp order of their pieces, then by id */
    char *blob;                /* every piece, NUL-terminated, in id order */
    uint8_t *type;             /* [vocab_size] GGUF token types (LLMEM__TOK_*) or NULL (all normal) */
    llmem__tok_bpe *bpe;       /* NULL: SentencePiece (llama); else GPT-2 byte-level BPE */
};

/* GGUF's tokenizer.ggml.token_type values. */
enum {
    LLMEM__TOK_NORMAL = 1,
    LLMEM__TOK_UNKNOWN = 2,
    LLMEM__TOK_CONTROL = 3,
    LLMEM__TOK_USER_DEFINED = 4,
    LLMEM__TOK_UNUSED = 5,
    LLMEM__TOK_BYTE = 6
};

static inline const char *llmem__tok_piece(const llmem_tokenizer *t, int32_t id) { return t->blob + t->off[id]; }
static inline uint32_t llmem__tok_piece_len(const llmem_tokenizer *t, int32_t id)
{
    return t->off[id + 1] - t->off[id] - 1;
}

/* How build stores a raw piece: tokenizer.bin's (cut at the first NUL);
 * GGUF SentencePiece (also U+2581 becomes ' '); as given (the BPE loader
 * has already turned byte-level text into bytes, NULs included). */
typedef enum llmem__tok_store { LLMEM__STORE_BIN, LLMEM__STORE_SPM_GGUF, LLMEM__STORE_RAW } llmem__tok_store;

/* Where build gets piece i from: raw bytes (not NUL-terminated), its score,
 * and whether it stays out of the lookup table (text never produces it). A
 * failure has already recorded its message. The pointer need only live
 * until the next call. */
typedef llmem_status (*llmem__tok_get_fn)(void *ctx, uint32_t i, const char **s, size_t *len, float *score,
                                          bool *unlisted);

/* The vocabulary of V pieces, sorted table included; bos/eos may be -1. */
llmem_status llmem__tok_build(uint32_t V, llmem__tok_get_fn get, void *ctx, llmem__tok_store how, int32_t bos,
                              int32_t eos, llmem_tokenizer **out);

/* The id whose piece is a||b (the lowest such id among listed pieces), or -1. */
int32_t llmem__tok_lookup2(const llmem_tokenizer *t, const char *a, size_t alen, const char *b, size_t blen);

/* ---- the merge loop both encoders run (tokenizer.c) ------------------------------ */

/* A candidate merge: the pair starting at symbol `left`, computed from the
 * ids ltok and rtok, merging into id. key orders the heap, lowest first:
 * the pair's priority in the high half (SentencePiece: the score, higher
 * first; BPE: the merge rank), the left position in the low half, so
 * equal priorities merge leftmost first. */
typedef struct llmem__tok_cand {
    uint64_t key;
    int32_t left, ltok, rtok, id;
} llmem__tok_cand;

/* The merge of symbol ids a then b: *id and *prio (lower merges first), or
 * false when the pair does not merge. */
typedef bool (*llmem__tok_pair_fn)(const void *ctx, int32_t a, int32_t b, int32_t *id, uint32_t *prio);

/* The work of one merge run. The caller gives three arrays of at least k
 * int32 (k the symbols) and a heap of at least 3k entries (the initial
 * pairs plus two per merge). */
typedef struct llmem__tok_merges {
    int32_t *tok, *prev, *next; /* per symbol; tok -1 once merged away */
    llmem__tok_cand *heap;
    size_t nheap;
    llmem__tok_pair_fn pair;
    const void *ctx;
} llmem__tok_merges;

/* Links tok[0, k) as a list and merges the best pair until none merges
 * (lazy deletion: an entry whose symbols no longer hold its ids is
 * dropped when popped). Returns the symbols left; walk them from 0 by
 * next[] (next -1 ends). */
int32_t llmem__tok_merge(llmem__tok_merges *w, int32_t k);

/* A float score as a priority: higher scores get lower priorities, in the
 * float order (-0 and +0 equal). */
static inline uint32_t llmem__tok_score_prio(float score)
{
    if (score == 0.0f) score = 0.0f;
    uint32_t u;
    memcpy(&u, &score, sizeof u);
    u = u & 0x80000000u ? ~u : u | 0x80000000u; /* ascending with the float */
    return ~u;
}

/* ---- tokenizer_bpe.c -------------------------------------------------------------- */

/* The GGUF vocabulary of tokenizer.ggml.model "gpt2". */
llmem_status llmem__tok_bpe_from_model(const llmem_model *m, llmem_tokenizer **out);
void llmem__tok_bpe_free(llmem__tok_bpe *b);
llmem_status llmem__tok_bpe_encode(const llmem_tokenizer *t, const char *text, size_t tlen, bool special, bool bos,
                                   bool eos, int32_t *out, size_t cap, size_t *n);

#endif /* LLMEM_TOKENIZER_INTERNAL_H */
