/* ref_tokenizer.c - run.c's encode, transcribed (ref_tokenizer.h). */
#include "support/ref_tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* qsort has no context argument: the vocabulary being sorted. */
static const test_ref_tok *sorting;

static int by_piece(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    int c = strcmp(sorting->piece[x], sorting->piece[y]);
    return c ? c : (x > y) - (x < y);
}

int32_t test_ref_tok_lookup(const test_ref_tok *r, const char *s)
{
    size_t lo = 0, hi = r->ns;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (strcmp(r->piece[r->sorted[mid]], s) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < r->ns && strcmp(r->piece[r->sorted[lo]], s) == 0 ? r->sorted[lo] : -1;
}

bool test_ref_tok_make(test_ref_tok *r, const llmem_tokenizer *t, bool gguf)
{
    memset(r, 0, sizeof *r);
    r->t = t;
    r->bad_piece = -1;
    r->V = llmem_tokenizer_vocab_size(t);
    r->piece = malloc(r->V * sizeof *r->piece);
    r->score = malloc(r->V * sizeof *r->score);
    r->sorted = malloc(r->V * sizeof *r->sorted);
    size_t maxlen = 0;
    if (!r->piece || !r->score || !r->sorted) return false;
    for (uint32_t i = 0; i < r->V; i++) {
        size_t len;
        r->piece[i] = llmem_tokenizer_token(t, (int32_t)i, &len, &r->score[i]);
        if (!r->piece[i] || strlen(r->piece[i]) != len) {
            r->bad_piece = (int32_t)i;
            return false;
        }
        if (len > maxlen) maxlen = len;
        if (gguf && ((int32_t)i == llmem_tokenizer_bos(t) || (int32_t)i == llmem_tokenizer_eos(t))) continue;
        r->sorted[r->ns++] = (int32_t)i;
    }
    sorting = r;
    qsort(r->sorted, r->ns, sizeof *r->sorted, by_piece);
    sorting = NULL;
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        int32_t by_name = test_ref_tok_lookup(r, name), plus3 = (uint32_t)b + 3 < r->V ? b + 3 : -1;
        int32_t id = gguf ? (by_name >= 0 ? by_name : plus3) : (plus3 >= 0 ? plus3 : by_name);
        r->byte_id[b] = id >= 0 ? id : 0;
    }
    r->buf = malloc(2 * maxlen + 8);
    return r->buf != NULL;
}

void test_ref_tok_free(test_ref_tok *r)
{
    free(r->piece);
    free(r->score);
    free(r->sorted);
    free(r->buf);
}

/* The text's code points as ids, each looked up, else its bytes'
 * fallback ids; after BOS and a leading space, as run.c does. */
static size_t initial_ids(const test_ref_tok *r, const char *text, bool bos, int32_t *tok)
{
    size_t n = 0;
    if (bos) tok[n++] = llmem_tokenizer_bos(r->t);
    if (text[0]) {
        int32_t sp = test_ref_tok_lookup(r, " ");
        tok[n++] = sp >= 0 ? sp : r->byte_id[' '];
    }
    char cp[8];
    size_t cl = 0;
    for (const char *c = text; *c; c++) {
        if ((*c & 0xC0) != 0x80) cl = 0;
        cp[cl++] = *c;
        cp[cl] = '\0';
        if ((c[1] & 0xC0) == 0x80 && cl < 4) continue;
        int32_t id = test_ref_tok_lookup(r, cp);
        if (id >= 0) {
            tok[n++] = id;
        } else {
            for (size_t i = 0; i < cl; i++) tok[n++] = r->byte_id[(unsigned char)cp[i]];
        }
        cl = 0;
    }
    return n;
}

size_t test_ref_tok_encode(const test_ref_tok *r, const char *text, bool bos, bool eos, int32_t *tok)
{
    size_t n = initial_ids(r, text, bos, tok);
    for (;;) {
        float best = -1e10f;
        int32_t best_id = -1;
        size_t best_i = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            strcpy(r->buf, r->piece[tok[i]]);
            strcat(r->buf, r->piece[tok[i + 1]]);
            int32_t id = test_ref_tok_lookup(r, r->buf);
            if (id != -1 && r->score[id] > best) {
                best = r->score[id];
                best_id = id;
                best_i = i;
            }
        }
        if (best_id == -1) break;
        tok[best_i] = best_id;
        memmove(tok + best_i + 1, tok + best_i + 2, (n - best_i - 2) * sizeof *tok);
        n--;
    }
    if (eos) tok[n++] = llmem_tokenizer_eos(r->t);
    return n;
}
