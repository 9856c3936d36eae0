/*
 * fuzz_tokenizer.c - the tokenizer loaders, encode and decode on arbitrary
 * bytes.
 *
 * Input format (little-endian):
 *
 *     byte 0       flags: bit 0 BOS, bit 1 EOS, bit 2 the image is a model
 *                  file (GGUF or llama2.c: llmem_model_open_memory, then
 *                  llmem_tokenizer_from_model) instead of a tokenizer.bin
 *     bytes 1-2    vocab_size for tokenizer.bin (uint16)
 *     bytes 3-4    L, the image's length (uint16; clipped to what is left)
 *     L bytes      the image
 *     the rest     the text to encode (up to its first NUL)
 *
 * A load either fails with LLMEM_EFORMAT, LLMEM_EINVAL, LLMEM_ENOTFOUND,
 * LLMEM_ENOTSUP or LLMEM_ENOMEM, a message and no tokenizer, or returns one
 * that encodes the text into at most strlen + 3 ids, all in range, EOS
 * where asked, the same twice, LLMEM_ERANGE (with the count) one short;
 * every id decodes. For small inputs the ids are also checked against the
 * tests' transcription of run.c's quadratic encode, with llmem's documented
 * rules where run.c has none (tests/support/ref_tokenizer.h). A gpt2
 * (byte-level BPE) vocabulary instead gives the text back exactly when its
 * tokens are decoded.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/llmem.h"

#include "support.h"
#include "support/ref_tokenizer.h"

static volatile uint8_t sink;

/* ---- the target ---------------------------------------------------------- */

static void exercise(const llmem_tokenizer *t, const char *text, bool bos, bool eos, bool gguf)
{
    uint32_t V = llmem_tokenizer_vocab_size(t);
    FZ_CHECK(V >= 3);
    size_t tl = strlen(text), cap = tl + 3, n = 0, n2 = 0, need = 0;
    int32_t *a = malloc(cap * sizeof *a), *b = malloc(cap * sizeof *b);
    FZ_CHECK(a && b);
    llmem_status st = llmem_tokenizer_encode(t, text, bos, eos, a, cap, &n);
    if (st == LLMEM_ENOMEM) goto out;
    FZ_CHECK(st == LLMEM_OK && n <= cap);
    for (size_t i = 0; i < n; i++) FZ_CHECK(a[i] >= 0 && (uint32_t)a[i] < V);
    /* BOS takes part in the merges as in run.c, so it need not survive as
     * out[0] in an odd vocabulary; EOS is appended after them. */
    bool bpe = llmem_tokenizer_is_bpe(t);
    /* gpt2 vocabularies may have no BOS or EOS (-1): nothing is added. */
    if (eos && llmem_tokenizer_eos(t) >= 0) FZ_CHECK(n >= 1 && a[n - 1] == llmem_tokenizer_eos(t));
    if (!bpe) FZ_CHECK(n >= (size_t)eos + (bos || tl ? 1 : 0));
    FZ_CHECK(llmem_tokenizer_encode(t, text, bos, eos, b, cap, &n2) == LLMEM_OK && n2 == n);
    FZ_CHECK(memcmp(a, b, n * sizeof *a) == 0);
    if (n) {
        FZ_CHECK(llmem_tokenizer_encode(t, text, bos, eos, b, n - 1, &need) == LLMEM_ERANGE && need == n);
        FZ_CHECK(llmem_error_message()[0] != '\0');
    }
    for (size_t i = 0; i < n; i++) {
        size_t len = 99;
        const char *p = llmem_tokenizer_decode(t, i ? a[i - 1] : -1, a[i], &len);
        FZ_CHECK(p != NULL);
        for (size_t k = 0; k < len; k++) sink ^= (uint8_t)p[k]; /* readable (ASan) */
    }
    size_t len;
    FZ_CHECK(llmem_tokenizer_decode(t, 1, (int32_t)V, &len) == NULL && len == 0);
    FZ_CHECK(llmem_tokenizer_decode(t, 1, -1, &len) == NULL);
    if (bpe) {
        /* Byte-level BPE loses nothing: the pieces of the text's tokens,
         * end to end, are the text (control tokens are not parsed here). */
        size_t m = 0;
        FZ_CHECK(llmem_tokenizer_encode(t, text, false, false, b, cap, &m) == LLMEM_OK);
        size_t o = 0;
        for (size_t i = 0; i < m; i++) {
            size_t pl;
            const char *p = llmem_tokenizer_decode(t, i ? b[i - 1] : -1, b[i], &pl);
            FZ_CHECK(p != NULL && o + pl <= tl && memcmp(text + o, p, pl) == 0);
            o += pl;
        }
        FZ_CHECK(o == tl);
    } else if (tl <= 200 && V <= 4096) {
        test_ref_tok r;
        if (test_ref_tok_make(&r, t, gguf)) {
            size_t m = test_ref_tok_encode(&r, text, bos, eos, b);
            FZ_CHECK(m == n && memcmp(a, b, n * sizeof *a) == 0);
        }
        FZ_CHECK(r.bad_piece < 0);
        test_ref_tok_free(&r);
    }
out:
    free(a);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_begin();
    if (size < 5) return 0;
    uint8_t flags = data[0];
    uint32_t vocab = (uint32_t)data[1] | (uint32_t)data[2] << 8;
    size_t L = (size_t)data[3] | (size_t)data[4] << 8;
    if (L > size - 5) L = size - 5;
    const uint8_t *image = data + 5;
    size_t tn = size - 5 - L;
    char *text = malloc(tn + 1);
    if (!text) return 0;
    memcpy(text, image + L, tn);
    text[tn] = '\0';
    bool bos = flags & 1, eos = flags & 2, model = flags & 4;

    llmem_tokenizer *t = (llmem_tokenizer *)1;
    llmem_model *m = NULL;
    llmem_status st;
    if (model) {
        /* The model keeps pointers into its bytes: give it its own copy. */
        void *copy = malloc(L ? L : 1);
        FZ_CHECK(copy);
        memcpy(copy, image, L);
        st = llmem_model_open_memory(copy, L, &m);
        if (st == LLMEM_OK) {
            st = llmem_tokenizer_from_model(m, &t);
            FZ_CHECK(st == LLMEM_OK || st == LLMEM_EFORMAT || st == LLMEM_ENOTFOUND || st == LLMEM_ENOTSUP ||
                  st == LLMEM_ENOMEM);
            if (st) FZ_CHECK(t == NULL && llmem_error_message()[0] != '\0');
            if (!st) exercise(t, text, bos, eos, true);
            llmem_tokenizer_destroy(st ? NULL : t);
            llmem_model_close(m);
        }
        free(copy);
    } else {
        st = llmem_tokenizer_load_memory(image, L, vocab, &t);
        FZ_CHECK(st == LLMEM_OK || st == LLMEM_EFORMAT || st == LLMEM_EINVAL || st == LLMEM_ENOMEM);
        if (st) {
            FZ_CHECK(t == NULL && llmem_error_message()[0] != '\0');
        } else {
            FZ_CHECK(llmem_tokenizer_vocab_size(t) == vocab);
            exercise(t, text, bos, eos, false);
            llmem_tokenizer_destroy(t);
        }
    }
    free(text);
    return 0;
}
