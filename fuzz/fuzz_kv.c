/*
 * fuzz_kv.c - API sequences on the KV cache manager against a shadow model.
 *
 * The input is a program: each op byte picks create (with or without a
 * window), append with tokens, append without, fork, truncate, free, match
 * a prefix (of another sequence's tokens, so hits happen), trim, swap
 * out / swap in (PAGED: through the os resource as swap memory, under a
 * small swap budget), or an append rolled back (llmem_kv_seq_rollback, as
 * an engine undoes a step that failed after its appends: the slots are
 * never written, and no block the append registered may be matched
 * later), and the following bytes are its arguments. The manager is PAGED with a prefix
 * cache, or STATIC (or CONTIGUOUS), or BUCKETS (the first byte), with a small budget so
 * that refusals and evictions happen.
 *
 * The shadow keeps every sequence's token ids. Every token slot holds, in
 * each layer's K and V, a value that is a hash of the tokens up to and
 * including it, so a block shared through the prefix cache, a fork or a
 * copy-on-write reads back the same value in every holder, and a block
 * reused under the wrong prefix does not. Appends without tokens get
 * token ids of their own that no input produces. After every op: the
 * manager's own check, and every live sequence's every held position read
 * back through llmem_kv_seq_token and llmem_kv_seq_table. A failed op must
 * leave everything as it was.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/llmem.h"

#include "support.h"

enum { MAXSEQ = 12, MAXLEN = 192, LAYERS = 2, BT = 4 };

typedef struct shadow {
    bool live, swapped;
    llmem_kv_seq h;
    size_t window, first, length;
    uint32_t tok[MAXLEN];
    uint32_t val[MAXLEN]; /* hash of tok[0..i] */
} shadow;

static uint32_t chain(uint32_t prev, uint32_t tok)
{
    uint64_t x = ((uint64_t)prev << 32 | tok) * 0x9e3779b97f4a7c15ull;
    x ^= x >> 29;
    return (uint32_t)(x * 0xbf58476d1ce4e5b9ull >> 32) | 1u; /* never 0: a zeroed slot is wrong */
}

static void write_slot(llmem_kv *kv, const shadow *s, size_t pos)
{
    for (uint32_t l = 0; l < LAYERS; l++) {
        void *k, *v;
        FZ_CHECK(!llmem_kv_seq_token(kv, s->h, l, pos, &k, &v));
        uint32_t a = s->val[pos] + l, b = ~s->val[pos] - l;
        memcpy(k, &a, sizeof a);
        memcpy(v, &b, sizeof b);
    }
}

static void verify(llmem_kv *kv, shadow *seqs)
{
    FZ_CHECK(!llmem_kv_check(kv));
    void *kt[MAXLEN / BT + 2], *vt[MAXLEN / BT + 2];
    for (int i = 0; i < MAXSEQ; i++) {
        const shadow *s = &seqs[i];
        if (!s->live) continue;
        llmem_kv_seq_info info;
        FZ_CHECK(!llmem_kv_seq_get_info(kv, s->h, &info));
        FZ_CHECK(!(info.length != s->length || info.first != s->first || info.window != s->window));
        FZ_CHECK(info.swapped == s->swapped);
        if (s->swapped) {
            void *k;
            FZ_CHECK(!(info.blocks || llmem_kv_seq_token(kv, s->h, 0, s->first, &k, NULL) != LLMEM_ESTATE));
            continue;
        }
        for (uint32_t l = 0; l < LAYERS; l++) {
            size_t nb = 0;
            FZ_CHECK(!llmem_kv_seq_table(kv, s->h, l, kt, vt, MAXLEN / BT + 2, &nb));
            for (size_t pos = s->first; pos < s->length; pos++) {
                void *k, *v;
                FZ_CHECK(!llmem_kv_seq_token(kv, s->h, l, pos, &k, &v));
                uint32_t a, b;
                memcpy(&a, k, sizeof a);
                memcpy(&b, v, sizeof b);
                FZ_CHECK(!(a != s->val[pos] + l || b != ~s->val[pos] - l));
                /* The table agrees: block j covers positions from the first held block on. */
                size_t j = pos / BT - s->first / BT;
                FZ_CHECK(!(j >= nb));
                size_t off = (pos % BT) * (size_t)llmem_kv_token_layer_bytes(kv);
                FZ_CHECK(!((char *)kt[j] + off != (char *)k || (char *)vt[j] + off != (char *)v));
            }
        }
    }
}

/* Append n tokens (from the small alphabet, or fresh ones) and undo the
 * append before any slot is written: back to the old length, or, where a
 * window slid past it, to the first position still held (the positions
 * before it are gone either way; the shadow records their tokens). A later
 * match of these tokens must not find the unwritten blocks (verify reads
 * every matched slot back). */
static llmem_status append_rolled_back(llmem_kv *kv, shadow *s, fz_in *in, uint32_t *fresh_tok)
{
    unsigned a = fz_u8(in);
    size_t n = 1 + a % 24, old = s->length;
    if (old + n > MAXLEN) return LLMEM_OK;
    uint32_t toks[24];
    int32_t ids[24];
    for (size_t i = 0; i < n; i++) {
        toks[i] = a & 0x80 ? (*fresh_tok)++ : fz_u8(in) % 3;
        ids[i] = (int32_t)toks[i];
    }
    llmem_status st = llmem_kv_seq_append(kv, s->h, n, ids, NULL);
    if (st) return st;
    llmem_kv_seq_info info;
    FZ_CHECK(!llmem_kv_seq_get_info(kv, s->h, &info));
    size_t back = info.first > old ? info.first : old;
    FZ_CHECK(!llmem_kv_seq_rollback(kv, s->h, back)); /* undoing an append always may */
    FZ_CHECK(!(llmem_kv_seq_get_info(kv, s->h, &info) || info.length != back));
    for (size_t pos = old; pos < back; pos++) {
        s->tok[pos] = toks[pos - old];
        s->val[pos] = chain(pos ? s->val[pos - 1] : 0, toks[pos - old]);
    }
    s->length = back;
    s->first = info.first;
    return LLMEM_OK;
}

/* Statuses an op may fail with; anything else is a bug. */
static bool acceptable(llmem_status st)
{
    return st == LLMEM_OK || st == LLMEM_ENOMEM || st == LLMEM_ERANGE || st == LLMEM_ESTATE ||
           st == LLMEM_EINVAL || st == LLMEM_ENOTSUP;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_begin();
    fz_in in = {data, size};
    unsigned first = fz_u8(&in), mode = first % 4;
    llmem_kv_options o = llmem_kv_options_default();
    o.strategy = mode == 2 ? LLMEM_KV_STATIC : mode == 3 ? LLMEM_KV_BUCKETS : LLMEM_KV_PAGED;
    if (mode == 2 && first & 0x80) o.strategy = LLMEM_KV_CONTIGUOUS; /* STATIC's layout, committed as it grows */
    o.prefix_cache = o.strategy == LLMEM_KV_PAGED;
    o.layers = LAYERS;
    o.kv_heads = 1;
    o.head_dim = 4;
    o.dtype = LLMEM_KV_F32;
    o.block_tokens = BT;
    o.max_seq_len = 128;
    size_t token_bytes = 2 * 4 * 4; /* K and V of one token, one layer */
    o.slab_bytes = (mode == 1 ? 1 : 4) * BT * token_bytes;
    o.budget_bytes = (size_t)(64 + 64 * (fz_u8(&in) % 8)) * token_bytes * LAYERS;
    o.swap_resource = llmem_resource_default();
    o.swap_budget_bytes = 16 << 10; /* two to four swapped sequences */
    llmem_kv *kv;
    FZ_CHECK(!llmem_kv_create(&o, &kv));
    static shadow seqs[MAXSEQ];
    memset(seqs, 0, sizeof seqs);
    uint32_t fresh_tok = 0x40000000u;
    for (int steps = 0; in.n && steps < 400; steps++) {
        unsigned op = fz_u8(&in) % 8, who = fz_u8(&in) % MAXSEQ;
        shadow *s = &seqs[who];
        llmem_status st = LLMEM_OK;
        switch (op) {
        case 0: { /* create */
            if (s->live) break;
            size_t window = 0;
            unsigned w = fz_u8(&in);
            if (o.strategy == LLMEM_KV_PAGED && w % 3 == 0) window = BT * (1 + w / 3 % 6);
            memset(s, 0, sizeof *s);
            st = llmem_kv_seq_create(kv, window, &s->h);
            if (!st) {
                s->live = true;
                s->window = window;
            }
            break;
        }
        case 1:   /* append with tokens (from a small alphabet, so prefixes repeat) */
        case 2: { /* append without */
            if (!s->live) break;
            size_t n = 1 + fz_u8(&in) % 24;
            if (s->length + n > MAXLEN) break;
            uint32_t toks[24];
            int32_t ids[24];
            for (size_t i = 0; i < n; i++) {
                toks[i] = op == 1 ? fz_u8(&in) % 3 : fresh_tok++;
                ids[i] = (int32_t)toks[i];
            }
            st = llmem_kv_seq_append(kv, s->h, n, op == 1 ? ids : NULL, NULL);
            if (st) break;
            llmem_kv_seq_info info;
            FZ_CHECK(!llmem_kv_seq_get_info(kv, s->h, &info));
            for (size_t i = 0; i < n; i++) {
                size_t pos = s->length + i;
                s->tok[pos] = toks[i];
                s->val[pos] = chain(pos ? s->val[pos - 1] : 0, toks[i]);
            }
            s->length += n;
            s->first = info.first;
            for (size_t pos = s->first > s->length - n ? s->first : s->length - n; pos < s->length; pos++)
                write_slot(kv, s, pos);
            break;
        }
        case 3: { /* fork into the first free slot */
            if (!s->live) break;
            int c = 0;
            while (c < MAXSEQ && seqs[c].live) c++;
            if (c == MAXSEQ) break;
            llmem_kv_seq child;
            st = llmem_kv_seq_fork(kv, s->h, &child);
            if (!st) {
                seqs[c] = *s;
                seqs[c].h = child;
            }
            break;
        }
        case 4: { /* truncate */
            if (!s->live) break;
            size_t len = s->length ? fz_u8(&in) % (s->length + 1) : 0;
            st = llmem_kv_seq_truncate(kv, s->h, len);
            if (!st) {
                s->length = len;
                if (s->first > len) s->first = len;
                llmem_kv_seq_info info;
                FZ_CHECK(!llmem_kv_seq_get_info(kv, s->h, &info));
                s->first = info.first;
            }
            break;
        }
        case 5: /* free */
            if (!s->live) break;
            st = llmem_kv_seq_free(kv, s->h);
            FZ_CHECK(!st);
            s->live = false;
            break;
        case 6: { /* a new sequence matching another's tokens, then appending the rest */
            const shadow *src = &seqs[fz_u8(&in) % MAXSEQ];
            if (s->live || !src->live || src->first || !src->length) break;
            memset(s, 0, sizeof *s);
            if (llmem_kv_seq_create(kv, 0, &s->h)) break;
            s->live = true;
            int32_t ids[MAXLEN];
            for (size_t i = 0; i < src->length; i++) ids[i] = (int32_t)src->tok[i];
            size_t matched = 0;
            st = llmem_kv_seq_match_prefix(kv, s->h, ids, src->length, &matched);
            FZ_CHECK(!st); /* an empty sequence always may */
            FZ_CHECK(!(matched % BT || matched > src->length));
            memcpy(s->tok, src->tok, matched * sizeof *s->tok);
            memcpy(s->val, src->val, matched * sizeof *s->val);
            s->length = matched;
            llmem_kv_seq_info info;
            FZ_CHECK(!llmem_kv_seq_get_info(kv, s->h, &info));
            s->first = info.first;
            break;
        }
        default: { /* trim, swap a sequence out or in, or an append rolled back */
            unsigned x = fz_u8(&in);
            if (!(x & 2)) {
                llmem_kv_trim(kv, x & 1);
                break;
            }
            if (!s->live) break;
            if ((x & 12) == 12 && !s->swapped) {
                st = append_rolled_back(kv, s, &in, &fresh_tok);
                break;
            }
            st = s->swapped ? llmem_kv_seq_swap_in(kv, s->h) : llmem_kv_seq_swap_out(kv, s->h);
            if (!st) s->swapped = !s->swapped;
            break;
        }
        }
        FZ_CHECK(acceptable(st));
        verify(kv, seqs);
    }
    for (int i = 0; i < MAXSEQ; i++)
        FZ_CHECK(!(seqs[i].live && llmem_kv_seq_free(kv, seqs[i].h)));
    llmem_kv_stats ks = {0};
    FZ_CHECK(!(llmem_kv_get_stats(kv, &ks) || ks.sequences || ks.blocks_used));
    llmem_kv_trim(kv, true);
    FZ_CHECK(!(llmem_kv_get_stats(kv, &ks) || ks.bytes_reserved));
    llmem_kv_destroy(kv);
    return 0;
}
