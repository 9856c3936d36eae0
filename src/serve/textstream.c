/*
 * textstream.c - incremental detokenisation with stop strings
 * (llmem/openai.h).
 *
 * A stream keeps `pend`: bytes decoded but not yet emitted. On each token
 * its piece is appended; then
 *  1. the earliest occurrence of any stop string in pend ends the stream:
 *     the bytes before it are emitted (sanitised), the rest dropped;
 *  2. otherwise the stream emits pend up to the longer of two holds: the
 *     longest suffix of pend that is a proper prefix of a stop string (it
 *     may still become one), and an unfinished UTF-8 character at the end.
 * Invariant: emitted text never contains a stop string, nor the first
 * bytes of one that later completed (they were held), and is valid UTF-8.
 * Why searching pend alone suffices: everything emitted was outside any
 * possible stop prefix at the time, so a match cannot begin in it.
 */
#include <stdlib.h>
#include <string.h>

#include "llmem/openai.h"

#include "internal.h"
#include "serve_internal.h"

struct llmem_textstream {
    const llmem_tokenizer *tok;
    int32_t prev;
    char **stops;
    size_t *stop_len;
    size_t nstops;
    char *pend;
    size_t plen, pcap;
    char *out;
    size_t ocap;
    bool done;
    int stopped;
};

size_t llmem__utf8_char(const unsigned char *p, size_t avail, bool *incomplete)
{
    *incomplete = false;
    unsigned c = p[0];
    size_t n;
    unsigned lo = 0x80, hi = 0xBF; /* the second byte's range */
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;      /* no overlong */
        else if (c == 0xED) hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        else if (c == 0xF4) hi = 0x8F; /* at most U+10FFFF */
    } else {
        return 0;
    }
    for (size_t i = 1; i < n; i++) {
        if (i >= avail) {
            *incomplete = true;
            return 0;
        }
        unsigned b = p[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
    }
    return n;
}

size_t llmem_utf8_sanitize(const char *s, size_t len, bool final, char *out, size_t *consumed)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, o = 0;
    while (i < len) {
        bool incomplete;
        size_t c = llmem__utf8_char(p + i, len - i, &incomplete);
        if (c) {
            memcpy(out + o, p + i, c);
            o += c;
            i += c;
            continue;
        }
        if (incomplete && !final) break;
        /* One U+FFFD for the invalid byte (or the unfinished character). */
        memcpy(out + o, "\xEF\xBF\xBD", 3);
        o += 3;
        i += incomplete ? len - i : 1;
    }
    if (consumed) *consumed = i;
    return o;
}

llmem_status llmem_textstream_create(const llmem_tokenizer *tok, int32_t prev, const char *const *stops,
                                     size_t nstops, llmem_textstream **out)
{
    if (out) *out = NULL;
    if (!tok || !out || (nstops && !stops)) return llmem__fail(LLMEM_EINVAL, "textstream: null argument");
    llmem_textstream *ts = calloc(1, sizeof *ts);
    if (!ts) return llmem__fail(LLMEM_ENOMEM, "textstream: out of memory");
    ts->tok = tok;
    ts->prev = prev;
    ts->stopped = -1;
    if (nstops) {
        ts->stops = calloc(nstops, sizeof *ts->stops);
        ts->stop_len = calloc(nstops, sizeof *ts->stop_len);
        if (!ts->stops || !ts->stop_len) goto nomem;
        for (size_t i = 0; i < nstops; i++) {
            if (!stops[i] || !stops[i][0]) {
                llmem_textstream_destroy(ts);
                return llmem__fail(LLMEM_EINVAL, "textstream: stop string %zu is empty", i);
            }
            if (!(ts->stops[i] = strdup(stops[i]))) goto nomem;
            ts->stop_len[i] = strlen(stops[i]);
            ts->nstops++;
        }
    }
    *out = ts;
    return LLMEM_OK;
nomem:
    llmem_textstream_destroy(ts);
    return llmem__fail(LLMEM_ENOMEM, "textstream: out of memory");
}

void llmem_textstream_destroy(llmem_textstream *ts)
{
    if (!ts) return;
    for (size_t i = 0; ts->stops && i < ts->nstops; i++) free(ts->stops[i]);
    free(ts->stops);
    free(ts->stop_len);
    free(ts->pend);
    free(ts->out);
    free(ts);
}

static bool reserve(char **buf, size_t *cap, size_t need)
{
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    char *n = realloc(*buf, c);
    if (!n) return false;
    *buf = n;
    *cap = c;
    return true;
}

/* Emit pend[0..k) (sanitised; final: an unfinished character becomes
 * U+FFFD) and keep the rest. */
static void emit(llmem_textstream *ts, size_t k, bool final, const char **text, size_t *len)
{
    *text = "";
    *len = 0;
    if (!k) return;
    if (!reserve(&ts->out, &ts->ocap, 3 * k + 4)) { /* keep it for later */
        return;
    }
    size_t used;
    size_t w = llmem_utf8_sanitize(ts->pend, k, final, ts->out, &used);
    memmove(ts->pend, ts->pend + used, ts->plen - used);
    ts->plen -= used;
    ts->out[w] = 0;
    *text = ts->out;
    *len = w;
}

bool llmem_textstream_push(llmem_textstream *ts, int32_t token, const char **text, size_t *len)
{
    *text = "";
    *len = 0;
    if (!ts || ts->done) return true;
    size_t plen;
    const char *piece = llmem_tokenizer_decode(ts->tok, ts->prev, token, &plen);
    if (!piece) {
        piece = "\xEF\xBF\xBD";
        plen = 3;
    }
    ts->prev = token;
    if (!reserve(&ts->pend, &ts->pcap, ts->plen + plen + 1)) return false;
    memcpy(ts->pend + ts->plen, piece, plen);
    ts->plen += plen;

    /* 1. A stop string, earliest first (memmem from each position would be
     * quadratic in pend; pend is short: stop prefixes and a character). */
    size_t best = SIZE_MAX;
    int which = -1;
    for (size_t i = 0; i < ts->nstops; i++) {
        const char *f = memmem(ts->pend, ts->plen, ts->stops[i], ts->stop_len[i]);
        if (f && (size_t)(f - ts->pend) < best) {
            best = (size_t)(f - ts->pend);
            which = (int)i;
        }
    }
    if (which >= 0) {
        ts->plen = best;
        emit(ts, best, true, text, len);
        ts->plen = 0;
        ts->done = true;
        ts->stopped = which;
        return true;
    }
    /* 2. Hold a possible stop beginning and an unfinished character. */
    size_t hold = 0;
    for (size_t i = 0; i < ts->nstops; i++) {
        size_t max = ts->stop_len[i] - 1 < ts->plen ? ts->stop_len[i] - 1 : ts->plen;
        for (size_t k = max; k > hold; k--)
            if (!memcmp(ts->pend + ts->plen - k, ts->stops[i], k)) {
                hold = k;
                break;
            }
    }
    emit(ts, ts->plen - hold, false, text, len);
    return false;
}

void llmem_textstream_finish(llmem_textstream *ts, const char **text, size_t *len)
{
    *text = "";
    *len = 0;
    if (!ts || ts->done) return;
    ts->done = true;
    emit(ts, ts->plen, true, text, len);
}

int llmem_textstream_stopped(const llmem_textstream *ts) { return ts ? ts->stopped : -1; }
