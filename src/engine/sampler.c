/*
 * sampler.c - the next token from logits, as llama2.c's run.c picks it, so a
 * seeded run reproduces run.c's tokens.
 *
 * temperature 0: argmax, the first of equal maxima (strict >).
 * Otherwise, in this order and in float arithmetic as run.c: each logit
 * divided by the temperature (a division, not a multiplication by the
 * reciprocal: the roundings differ); softmax (subtract the max, expf, sum,
 * divide each by the sum); one coin = random_f32 (xorshift64*: state ^=
 * state >> 12, ^= state << 25, ^= state >> 27; u32 = (state *
 * 0x2545F4914F6CDD1D) >> 32; coin = (u32 >> 8) / 2^24); then
 *  - 0 < top_p < 1: the candidates are the tokens with p >= (1 - top_p) /
 *    (n - 1), in index order, sorted by p descending; the prefix is cut at
 *    the first index where the running sum exceeds top_p (else all); r =
 *    coin * that sum; the first candidate whose running cdf exceeds r, else
 *    the last of the prefix;
 *  - else the first token whose running cdf over all tokens exceeds coin,
 *    else the last token.
 *
 * The sort. run.c calls qsort with a comparator that orders by p descending
 * and calls equal p equal. glibc's qsort is a stable merge sort (when it
 * can allocate its buffer, which it may do on every call), so ties keep
 * index order. Here a stable bottom-up merge sort with a buffer taken at
 * create gives the same permutation (candidates are never NaN, so the order
 * is total and every stable sort agrees) and sampling allocates nothing.
 * The tests check the result against qsort itself.
 *
 * Where run.c has undefined behaviour this picks something sane: no
 * candidate passes the cutoff (top_p < 1/n, or NaN logits) -> the argmax of
 * the probabilities; a vocabulary of one -> token 0 (run.c divides by
 * n - 1 = 0).
 *
 * A sampler is not thread-safe (it carries its RNG state and buffers): one
 * per sequence or per thread.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "llmem/sampler.h"

typedef struct prob_index {
    float prob;
    int32_t index;
} prob_index;

struct llmem_sampler {
    uint32_t vocab_size;
    float temperature;
    float top_p;
    uint64_t state;        /* xorshift64* state, never 0 */
    prob_index *cand;      /* [vocab_size]: top-p candidates */
    prob_index *tmp;       /* [vocab_size]: merge-sort buffer */
};

llmem_sampler_options llmem_sampler_options_default(void)
{
    return (llmem_sampler_options){.vocab_size = 0, .temperature = 0.0f, .top_p = 0.9f, .seed = 0};
}

llmem_status llmem_sampler_create(const llmem_sampler_options *o, llmem_sampler **out)
{
    if (out) *out = NULL;
    if (!o || !out) return llmem__fail(LLMEM_EINVAL, "sampler: null argument");
    if (o->vocab_size == 0 || o->vocab_size > INT32_MAX)
        return llmem__fail(LLMEM_EINVAL, "sampler: vocab_size %u is not in [1, 2^31)", o->vocab_size);
    if (!(o->temperature >= 0.0f))
        return llmem__fail(LLMEM_EINVAL, "sampler: temperature %g is negative or NaN", (double)o->temperature);
    if (!(o->top_p >= 0.0f && o->top_p <= 1.0f))
        return llmem__fail(LLMEM_EINVAL, "sampler: top_p %g is not in [0, 1]", (double)o->top_p);
    llmem_sampler *s = calloc(1, sizeof *s);
    if (!s) return llmem__fail(LLMEM_ENOMEM, "sampler: out of memory");
    s->cand = malloc((size_t)o->vocab_size * sizeof *s->cand);
    s->tmp = malloc((size_t)o->vocab_size * sizeof *s->tmp);
    if (!s->cand || !s->tmp) {
        llmem_sampler_destroy(s);
        return llmem__fail(LLMEM_ENOMEM, "sampler: out of memory for a vocabulary of %u", o->vocab_size);
    }
    s->vocab_size = o->vocab_size;
    s->temperature = o->temperature;
    s->top_p = o->top_p;
    s->state = o->seed ? o->seed : 1; /* xorshift stays at 0 forever */
    *out = s;
    return LLMEM_OK;
}

void llmem_sampler_destroy(llmem_sampler *s)
{
    if (!s) return;
    free(s->cand);
    free(s->tmp);
    free(s);
}

int32_t llmem_logits_argmax(const float *v, size_t n)
{
    if (!v || n == 0 || n > INT32_MAX) return -1;
    size_t best = 0;
    float max = v[0];
    for (size_t i = 1; i < n; i++) {
        if (v[i] > max) {
            max = v[i];
            best = i;
        }
    }
    return (int32_t)best;
}

static uint32_t random_u32(uint64_t *state)
{
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (uint32_t)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}

static float random_f32(uint64_t *state) { return (float)(random_u32(state) >> 8) / 16777216.0f; }

static void softmax(float *x, size_t n)
{
    float max = x[0];
    for (size_t i = 1; i < n; i++)
        if (x[i] > max) max = x[i];
    float sum = 0.0f;
    for (size_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    for (size_t i = 0; i < n; i++) x[i] /= sum;
}

static size_t sample_mult(const float *p, size_t n, float coin)
{
    float cdf = 0.0f;
    for (size_t i = 0; i < n; i++) {
        cdf += p[i];
        if (coin < cdf) return i;
    }
    return n - 1;
}

/* Stable sort of a[0..n) by prob descending (tmp holds n). */
static void sort_desc(prob_index *a, prob_index *tmp, size_t n)
{
    prob_index *src = a, *dst = tmp;
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, k = lo;
            /* Take from the right run only when strictly greater: ties keep
             * their order. */
            while (i < mid && j < hi) dst[k++] = src[j].prob > src[i].prob ? src[j++] : src[i++];
            while (i < mid) dst[k++] = src[i++];
            while (j < hi) dst[k++] = src[j++];
        }
        prob_index *t = src;
        src = dst;
        dst = t;
    }
    if (src != a) memcpy(a, src, n * sizeof *a);
}

static size_t sample_topp(llmem_sampler *s, const float *p, size_t n, float coin)
{
    const float cutoff = (1.0f - s->top_p) / (float)(n - 1);
    size_t n0 = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] >= cutoff) s->cand[n0++] = (prob_index){p[i], (int32_t)i};
    }
    if (n0 == 0) return (size_t)llmem_logits_argmax(p, n);
    sort_desc(s->cand, s->tmp, n0);
    float cum = 0.0f;
    size_t last = n0 - 1;
    for (size_t i = 0; i < n0; i++) {
        cum += s->cand[i].prob;
        if (cum > s->top_p) {
            last = i;
            break;
        }
    }
    float r = coin * cum;
    float cdf = 0.0f;
    for (size_t i = 0; i <= last; i++) {
        cdf += s->cand[i].prob;
        if (r < cdf) return (size_t)s->cand[i].index;
    }
    return (size_t)s->cand[last].index;
}

int32_t llmem_sampler_sample(llmem_sampler *s, float *logits)
{
    if (!s || !logits) return -1;
    size_t n = s->vocab_size;
    if (s->temperature == 0.0f) return llmem_logits_argmax(logits, n);
    for (size_t i = 0; i < n; i++) logits[i] /= s->temperature;
    softmax(logits, n);
    float coin = random_f32(&s->state);
    if (s->top_p <= 0.0f || s->top_p >= 1.0f) return (int32_t)sample_mult(logits, n, coin);
    if (n == 1) return 0;
    return (int32_t)sample_topp(s, logits, n, coin);
}
