/*
 * kv_content.c - the KV content model of the tests (kv_content.h).
 *
 * The bytes of one token: a seed from (ph, pos, layer, which) through two
 * rounds of the mixer, then each 8-byte word a further mix of the seed and
 * the word's offset. Every word differs from every other token's (up to
 * 64-bit collisions), so a shift by any whole number of words shows too.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "kv_content.h"
#include "rng.h"

#include "llmem/status.h"

enum { TOKEN_MAX = 4096 }; /* bytes of one token's K in one layer, at most */

void test_kv_content(uint64_t ph, size_t pos, uint32_t layer, int which, unsigned char *out, size_t n)
{
    uint64_t x = test_mix64(ph ^ test_mix64((uint64_t)pos * 0x2545f4914f6cdd1dull + (uint64_t)layer * 131u +
                                            (uint64_t)which + 7));
    for (size_t i = 0; i < n; i++) {
        if (i % 8 == 0) x = test_mix64(x + i + 1);
        out[i] = (unsigned char)(x >> (8 * (i % 8)));
    }
}

void test_kv_chain(uint64_t *ph, size_t at, const int32_t *tok, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t p = at + i;
        ph[p] = test_prefix_step(p ? ph[p - 1] : 0, tok[i], p);
    }
}

void test_kv_copy(llmem_resource *dev, void *dst, const void *src, size_t n)
{
    if (!dev) {
        memcpy(dst, src, n);
        return;
    }
    llmem_status st = llmem_resource_copy(dev, dst, src, n);
    if (st != LLMEM_OK) fail_msg("llmem_resource_copy(%zu B): %s: %s", n, llmem_status_name(st), llmem_error_message());
}

static size_t token_bytes(const llmem_kv *kv)
{
    size_t tb = llmem_kv_token_layer_bytes(kv);
    if (!tb || tb > TOKEN_MAX) fail_msg("token bytes %zu: the content model takes 1..%d", tb, (int)TOKEN_MAX);
    return tb;
}

static void *token_at(llmem_kv *kv, llmem_kv_seq h, uint32_t layer, size_t pos, int which)
{
    void *k = NULL, *v = NULL;
    llmem_status st = llmem_kv_seq_token(kv, h, layer, pos, &k, &v);
    if (st != LLMEM_OK)
        fail_msg("llmem_kv_seq_token(0x%llx, layer %u, position %zu): %s: %s", (unsigned long long)h, layer, pos,
                 llmem_status_name(st), llmem_error_message());
    return which ? v : k;
}

void test_kv_write(llmem_kv *kv, llmem_resource *dev, llmem_kv_seq h, const uint64_t *ph, size_t from, size_t to,
                   uint32_t layers)
{
    unsigned char buf[TOKEN_MAX];
    size_t tb = token_bytes(kv);
    for (size_t p = from; p < to; p++)
        for (uint32_t l = 0; l < layers; l++)
            for (int which = 0; which < 2; which++) {
                test_kv_content(ph[p], p, l, which, buf, tb);
                test_kv_copy(dev, token_at(kv, h, l, p, which), buf, tb);
            }
}

void test_kv_expect(const unsigned char *got, size_t n, uint64_t ph, size_t pos, uint32_t layer, int which,
                    const char *what, ...)
{
    unsigned char want[TOKEN_MAX];
    if (n > sizeof want) fail_msg("token bytes %zu: the content model takes 1..%d", n, (int)TOKEN_MAX);
    test_kv_content(ph, pos, layer, which, want, n);
    if (!memcmp(got, want, n)) return;
    size_t i = 0;
    while (got[i] == want[i]) i++;
    char ctx[256];
    va_list ap;
    va_start(ap, what);
    vsnprintf(ctx, sizeof ctx, what, ap);
    va_end(ap);
    fail_msg("%s: position %zu layer %u %s: byte %zu is %u, expected %u", ctx, pos, layer, which ? "V" : "K", i,
             got[i], want[i]);
}

void test_kv_expect_token(llmem_kv *kv, llmem_resource *dev, llmem_kv_seq h, uint64_t ph, size_t pos,
                          uint32_t layer)
{
    unsigned char got[TOKEN_MAX];
    size_t tb = token_bytes(kv);
    for (int which = 0; which < 2; which++) {
        test_kv_copy(dev, got, token_at(kv, h, layer, pos, which), tb);
        test_kv_expect(got, tb, ph, pos, layer, which, "sequence 0x%llx", (unsigned long long)h);
    }
}
