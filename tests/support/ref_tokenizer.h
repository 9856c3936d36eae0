/*
 * ref_tokenizer.h - an independent transcription of run.c's encode, the
 * oracle test_tokenizer and fuzz_tokenizer hold llmem's encode against.
 *
 * Written from run.c's description: the vocabulary sorted by strcmp and
 * binary-searched, each code point looked up (else its bytes), then every
 * pair rescanned after each merge, the best score winning (quadratic, but
 * obviously right). Where run.c has no rule it follows llmem's documented
 * ones: the lowest id among equal pieces; byte fallback at byte + 3 for a
 * tokenizer.bin vocabulary, "<0xXX>" by name for GGUF, else the other,
 * else id 0; a GGUF vocabulary's BOS and EOS pieces are never looked up.
 *
 *     test_ref_tok r;
 *     if (test_ref_tok_make(&r, t, false)) n = test_ref_tok_encode(&r, text, bos, eos, ids);
 *     test_ref_tok_free(&r);
 *
 * Needs no test framework (the fuzz targets link it too).
 */
#ifndef LLMEM_TEST_REF_TOKENIZER_H
#define LLMEM_TEST_REF_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/tokenizer.h"

typedef struct test_ref_tok {
    const llmem_tokenizer *t;
    uint32_t V;            /* vocabulary size */
    const char **piece;    /* [V] each id's piece, llmem_tokenizer_token's */
    float *score;          /* [V] each id's merge score */
    int32_t *sorted;       /* [ns] the ids looked up, by (strcmp, id) */
    uint32_t ns;
    int32_t byte_id[256];  /* the byte-fallback id of each byte */
    int32_t bad_piece;     /* the first id without a piece of its length, or -1 */
    char *buf;             /* room for two pieces end to end */
} test_ref_tok;

/* Read t's vocabulary (gguf: t came from a GGUF model). False when out
 * of memory or when an id has no piece of the length it reports
 * (bad_piece says which); test_ref_tok_free either way. */
bool test_ref_tok_make(test_ref_tok *r, const llmem_tokenizer *t, bool gguf);

void test_ref_tok_free(test_ref_tok *r);

/* The id whose piece is s (the lowest of equal ones), or -1. */
int32_t test_ref_tok_lookup(const test_ref_tok *r, const char *s);

/* run.c's encode of text into tok (room for strlen(text) + 3 ids): the
 * number of ids. */
size_t test_ref_tok_encode(const test_ref_tok *r, const char *text, bool bos, bool eos, int32_t *tok);

#endif
