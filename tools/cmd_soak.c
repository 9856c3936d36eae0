/*
 * cmd_soak.c - `llmem soak`: serve random bursts of requests for a long
 * time, on the wall clock, and watch resident memory for drift and leaks.
 *
 * The setup an engine would have, with host memory standing in for the
 * device so that resident memory (RSS) shows what the pool holds: an os
 * resource under a tracking resource, one pool over it driven by the
 * stage-aware controller (purge MANUAL: memory goes back only when the
 * controller says so), and a PAGED KV manager with the prefix cache over
 * that pool. Every token slot appended is written, K and V of every layer,
 * as an engine writes KV; every movable scratch buffer is written when
 * taken. Geometry: 4 layers, 2 KV heads of 64, f16 (2 KiB of KV a token),
 * 16-token blocks, contexts up to 8192 tokens, a 96 MiB KV budget.
 *
 * The load, a loop of cycles until the deadline:
 *  - a burst of 4..32 requests arriving over up to 2 s; prompt and output
 *    lengths drawn from the Azure code trace (--trace, by default
 *    ../shared/traces/AzureLLMInferenceTrace_code.csv when present, else its
 *    quantiles built in), outputs capped at 512 tokens. Every prompt starts
 *    with one of 4 shared system prompts (128..1024 tokens) appended with
 *    its tokens, so the prefix cache holds and shares them; the rest of the
 *    prompt and the output are appended without tokens (never cached).
 *    Continuous batching: up to 12 sequences run; admitted prompts are a
 *    PREFILL step, the others DECODE; 1 in 8 admitted requests forks a
 *    second sequence (parallel sampling, copy-on-write). When an append
 *    finds no memory the most recently admitted sequence is preempted (its
 *    request goes back to the head of the queue). Each request also holds a
 *    movable scratch buffer (a pool handle, 256 B a prompt token) and a small
 *    raw block; 8 long-lived handles (adapters, 64 KiB..2 MiB) are replaced
 *    one per burst, so that freed holes make the pool fragment and the
 *    controller compact.
 *  - an idle gap: 80% of them long (1.5..5 decay delays: the controller
 *    shrinks), 20% short (under the decay: nothing goes back). The engine
 *    ticks the controller every 20 ms. Every 10th long gap, llmem_pool_check
 *    and llmem_kv_check; every 20th, an explicit llmem_pool_compact.
 *
 * Every KV token slot holds a pattern derived from its position's prefix
 * hash (so forks and prefix matches share it), layer and K/V; every handle
 * and raw block holds a pattern too. Patterns are verified before every
 * free (sampled positions for KV, every byte for handles) and after every
 * compaction: a mismatch is a corruption, counted and fatal.
 *
 * Measured: a sampler thread records, each second, RSS (/proc/self/statm),
 * the pool's committed, used and reserved bytes, KV bytes held and live
 * sequences (--samples FILE: CSV, or JSON when FILE ends in .json). At the
 * end of each long idle gap, once the controller has shrunk, the engine
 * records the trough: RSS at that moment.
 *
 * Drift: over the troughs after the warm-up (--warmup, default a tenth of
 * the run, 2 s..300 s), the least-squares slope of trough RSS over time,
 * times the post-warm-up duration, divided by the mean trough RSS: the
 * relative growth of idle memory across the run that a straight line
 * explains. It must not exceed --max-drift (default 2%). The same figure
 * over the per-minute RSS maxima is reported for information. Why a
 * warm-up: the controller keeps committed = used / low watermark at every
 * trough, but which free pages stay committed varies, and pages committed
 * ahead and never written are not resident; trough RSS rises towards
 * committed + the process's own pages over the first minutes (about 8 in
 * the 30-minute run), then stays flat. Runs of seconds (the CTest) are all
 * warm-up: their drift figure means little.
 * Leaks: after teardown (sequences, handles, blocks freed; controller, KV
 * manager and pool destroyed), the tracking resource's live mappings, and
 * the pool's live allocations just before it was destroyed.
 *
 * Output: one JSON summary line on stdout; exit status 0 when drift and
 * leaks pass and nothing was corrupted, 1 otherwise, 2 for bad options.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "tool_util.h"
#include "llmem/llmem.h"

#define MIB ((size_t)1 << 20)

enum {
    SOAK_LAYERS = 4,
    SOAK_KV_HEADS = 2,
    SOAK_HEAD_DIM = 64,
    SOAK_BLOCK = 16,
    SOAK_MAX_SEQ = 8192,
    SOAK_MAX_GEN = 512,
    SOAK_RUN = 12,          /* sequences running at most */
    SOAK_PREFIXES = 4,      /* shared system prompts */
    SOAK_ADAPTERS = 8,      /* long-lived handles */
    SOAK_MAX_BURST = 32,
    SOAK_SCRATCH_PER_TOKEN = 256,
    SOAK_KV_BUDGET = 96 << 20,
    SOAK_TOKEN_WORDS = SOAK_KV_HEADS * SOAK_HEAD_DIM * 2 / 8, /* uint64 words in one token's K (f16) */
};

/* The Azure LLM inference trace (code): the 0/16 .. 16/16 quantiles of
 * prompt and generated tokens, for when the trace file is absent. */
static const uint32_t builtin_prompt_q[17] = {3,    90,   185,  348,  578,  825,  1016, 1196, 1469,
                                              1734, 2048, 2375, 2745, 3330, 4434, 6499, 7437};
static const uint32_t builtin_gen_q[17] = {6, 6, 7, 8, 9, 10, 11, 12, 13, 15, 16, 19, 24, 31, 46, 77, 1899};

/* ---- randomness and patterns ---------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) / 9007199254740992.0; }

static uint64_t mix(uint64_t x)
{
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ull;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dull;
    return x ^ (x >> 33);
}

/* The prefix hash of position pos given the one before it. */
static uint64_t prefix_step(uint64_t prev, int32_t tok, size_t pos)
{
    return mix(prev * 0x100000001b3ull + (uint64_t)(uint32_t)tok * 0x9e3779b97f4a7c15ull + pos + 1);
}

/* The first word of a KV token slot's pattern; word i is seed + i. */
static uint64_t kv_seed(uint64_t ph, uint32_t layer, int which)
{
    return mix(ph ^ ((uint64_t)layer * 2 + (uint64_t)which + 1) * 0x2545f4914f6cdd1dull);
}

static void fill_words(void *dst, size_t bytes, uint64_t seed)
{
    uint64_t *w = dst;
    for (size_t i = 0; i < bytes / 8; i++) w[i] = seed + i;
}

static bool check_words(const void *src, size_t bytes, uint64_t seed)
{
    const uint64_t *w = src;
    for (size_t i = 0; i < bytes / 8; i++)
        if (w[i] != seed + i) return false;
    return true;
}

/* Resident bytes (/proc/self/statm), read without stdio so that measuring
 * allocates nothing. */
static size_t rss_bytes(void)
{
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char buf[128];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    unsigned long size = 0, resident = 0;
    if (sscanf(buf, "%lu %lu", &size, &resident) != 2) return 0;
    return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
}

static void touch_pages(void *p, size_t bytes)
{
    for (size_t i = 0; i < bytes; i += 4096) ((volatile char *)p)[i] = 0;
}

/* ---- state ----------------------------------------------------------------- */

typedef struct request {
    uint32_t prompt, gen; /* tokens; prompt includes the shared prefix */
    uint32_t prefix;      /* which system prompt */
    double arrival_s;     /* after the burst began */
    uint64_t id;
    bool fork;            /* run a second sequence from its prompt */
} request;

typedef struct seq_slot {
    bool live;
    llmem_kv_seq s;
    request req;
    bool is_child;          /* a fork's second sequence (dropped if preempted) */
    uint64_t admitted;      /* admission order, for preemption */
    uint32_t generated;
    size_t length;          /* tokens held */
    uint64_t *ph;           /* [SOAK_MAX_SEQ] prefix hash per position */
    llmem_handle scratch;   /* movable scratch (roots only) */
    size_t scratch_bytes;
    uint64_t scratch_seed;
    unsigned char *obj;     /* a small raw block (request object) */
    size_t obj_bytes;
    uint64_t obj_seed;
    bool fresh;             /* admitted in this step (its prefill makes its first token) */
} seq_slot;

typedef struct adapter {
    llmem_handle h;
    size_t bytes;
    uint64_t seed;
} adapter;

typedef struct trough {
    double t;
    size_t rss;
} trough;

typedef struct soak_sample {
    double t;
    size_t rss;
    uint64_t committed, used, reserved, kv_bytes, seqs;
    int phase;
} soak_sample;

typedef struct soak {
    /* options */
    double seconds, warmup_s, max_drift;
    uint32_t decay_ms;
    uint64_t seed;
    const char *samples_path;
    bool samples_json, progress;
    /* the trace's lengths, or NULL: the built-in quantiles */
    uint32_t *trace_prompt, *trace_gen;
    size_t trace_n;
    /* memory */
    llmem_resource *os, *track;
    llmem_pool *pool;
    llmem_kv *kv;
    llmem_controller *ctl;
    int32_t prefix_tok[SOAK_PREFIXES][1024];
    uint32_t prefix_len[SOAK_PREFIXES];
    seq_slot slot[SOAK_RUN];
    adapter ad[SOAK_ADAPTERS];
    request queue[SOAK_MAX_BURST + SOAK_RUN];
    size_t queued;
    uint64_t rng, admitted_seq, next_id;
    int32_t tok_buf[1024];
    /* figures */
    uint64_t requests_done, requests_admitted, forks, preemptions, tokens, steps, bursts, gaps_long, gaps_short;
    uint64_t corruptions, checks, manual_compactions, manual_moved;
    uint64_t t0_ns;
    trough *troughs;
    size_t ntroughs, troughs_cap;
    /* the sampler */
    pthread_t sampler;
    bool sampler_started;
    atomic_int stop;
    atomic_int phase; /* 0 idle, 1 burst */
    FILE *samples_file;         /* the stream of samples_out */
    llmem_outfile *samples_out; /* --samples, renamed into place at the end */
    soak_sample *samples;
    size_t nsamples, samples_cap;
    size_t rss_peak;
    int error; /* a fatal error was reported */
} soak;

static double elapsed(const soak *k) { return (double)(tool_now_ns() - k->t0_ns) * 1e-9; }

static void fatal(soak *k, const char *what)
{
    if (!k->error) fprintf(stderr, "llmem soak: %s: %s\n", what, llmem_last_error());
    k->error = 1;
}

static void corrupt(soak *k, const char *what, uint64_t id)
{
    k->corruptions++;
    if (k->corruptions <= 10) fprintf(stderr, "llmem soak: corruption: %s (request %llu)\n", what, (unsigned long long)id);
    k->error = 1;
}

/* ---- the sampler thread ---------------------------------------------------- */

static void sample_once(soak *k)
{
    soak_sample s = {0};
    s.t = elapsed(k);
    s.rss = rss_bytes();
    llmem_pool_stats ps = {sizeof ps};
    llmem_kv_stats ks = {sizeof ks};
    llmem_pool_get_stats(k->pool, &ps);
    llmem_kv_get_stats(k->kv, &ks);
    s.committed = ps.committed_bytes;
    s.used = ps.used_bytes;
    s.reserved = ps.reserved_bytes;
    s.kv_bytes = ks.bytes_reserved;
    s.seqs = ks.sequences;
    s.phase = atomic_load(&k->phase);
    if (s.rss > k->rss_peak) k->rss_peak = s.rss;
    if (k->nsamples < k->samples_cap) k->samples[k->nsamples++] = s;
    if (k->samples_file) {
        if (k->samples_json)
            fprintf(k->samples_file,
                    "%s{\"t_s\":%.3f,\"rss_bytes\":%zu,\"committed_bytes\":%llu,\"used_bytes\":%llu,"
                    "\"reserved_bytes\":%llu,\"kv_bytes\":%llu,\"sequences\":%llu,\"phase\":\"%s\"}",
                    k->nsamples > 1 ? ",\n" : "", s.t, s.rss, (unsigned long long)s.committed,
                    (unsigned long long)s.used, (unsigned long long)s.reserved, (unsigned long long)s.kv_bytes,
                    (unsigned long long)s.seqs, s.phase ? "burst" : "idle");
        else
            fprintf(k->samples_file, "%.3f,%zu,%llu,%llu,%llu,%llu,%llu,%s\n", s.t, s.rss,
                    (unsigned long long)s.committed, (unsigned long long)s.used, (unsigned long long)s.reserved,
                    (unsigned long long)s.kv_bytes, (unsigned long long)s.seqs, s.phase ? "burst" : "idle");
        fflush(k->samples_file);
    }
}

static void *sampler_main(void *arg)
{
    soak *k = arg;
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    while (!atomic_load(&k->stop)) {
        sample_once(k);
        if (k->progress && k->nsamples && k->nsamples % 60 == 0) {
            const soak_sample *s = &k->samples[k->nsamples - 1];
            fprintf(stderr, "llmem soak: %4.0f s  rss %.1f MiB  committed %.1f MiB  used %.1f MiB  %llu seqs\n", s->t,
                    (double)s->rss / MIB, (double)s->committed / MIB, (double)s->used / MIB,
                    (unsigned long long)s->seqs);
        }
        next.tv_sec += 1;
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL) == EINTR) {}
    }
    return NULL;
}

/* ---- requests --------------------------------------------------------------- */

static uint32_t from_quantiles(const uint32_t q[17], double u)
{
    double x = u * 16;
    int i = (int)x;
    if (i >= 16) return q[16];
    return (uint32_t)lround(q[i] + (x - i) * (q[i + 1] - q[i]));
}

static request make_request(soak *k, double window_s)
{
    request r = {0};
    uint32_t p, g;
    if (k->trace_n) {
        size_t i = (size_t)(rng_next(&k->rng) % k->trace_n);
        p = k->trace_prompt[i];
        g = k->trace_gen[i];
    } else {
        p = from_quantiles(builtin_prompt_q, rng_unit(&k->rng));
        g = from_quantiles(builtin_gen_q, rng_unit(&k->rng));
    }
    r.prefix = (uint32_t)(rng_next(&k->rng) % SOAK_PREFIXES);
    uint32_t lp = k->prefix_len[r.prefix];
    if (g < 1) g = 1;
    if (g > SOAK_MAX_GEN) g = SOAK_MAX_GEN;
    if (p > SOAK_MAX_SEQ - g - 1) p = SOAK_MAX_SEQ - g - 1;
    r.prompt = lp + 1 + p; /* the system prompt, then the user's */
    if (r.prompt + g > SOAK_MAX_SEQ) r.prompt = SOAK_MAX_SEQ - g;
    r.gen = g;
    r.arrival_s = rng_unit(&k->rng) * window_s;
    r.id = ++k->next_id;
    r.fork = rng_next(&k->rng) % 8 == 0;
    return r;
}

static int by_arrival(const void *a, const void *b)
{
    const request *x = a, *y = b;
    return x->arrival_s < y->arrival_s ? -1 : x->arrival_s > y->arrival_s;
}

/* The token at position pos of a sequence: the system prompt's, then ones
 * of its own (a function of the request, the position and, for a fork's
 * output, which side). */
static int32_t token_at(const soak *k, const seq_slot *sl, size_t pos)
{
    uint32_t lp = k->prefix_len[sl->req.prefix];
    if (pos < lp) return k->prefix_tok[sl->req.prefix][pos];
    uint64_t side = pos >= sl->req.prompt && sl->is_child ? 0x5bd1e995u : 0;
    return (int32_t)(mix(sl->req.id * 0x9e3779b97f4a7c15ull + pos + side) % 32000u);
}

/* Write K and V of positions [from, to) of every layer. */
static bool write_kv(soak *k, seq_slot *sl, size_t from, size_t to)
{
    for (size_t p = from; p < to; p++)
        for (uint32_t l = 0; l < SOAK_LAYERS; l++) {
            void *kp, *vp;
            if (llmem_kv_seq_token(k->kv, sl->s, l, p, &kp, &vp)) {
                fatal(k, "kv token");
                return false;
            }
            fill_words(kp, SOAK_TOKEN_WORDS * 8, kv_seed(sl->ph[p], l, 0));
            fill_words(vp, SOAK_TOKEN_WORDS * 8, kv_seed(sl->ph[p], l, 1));
        }
    return true;
}

static void verify_pos(soak *k, seq_slot *sl, size_t p)
{
    for (uint32_t l = 0; l < SOAK_LAYERS; l++) {
        void *kp, *vp;
        if (llmem_kv_seq_token(k->kv, sl->s, l, p, &kp, &vp)) {
            fatal(k, "kv token");
            return;
        }
        if (!check_words(kp, SOAK_TOKEN_WORDS * 8, kv_seed(sl->ph[p], l, 0)) ||
            !check_words(vp, SOAK_TOKEN_WORDS * 8, kv_seed(sl->ph[p], l, 1)))
            corrupt(k, "KV token slot changed", sl->req.id);
    }
}

/* Check a sample of positions: the first, the last, the prompt's end and 5
 * random ones. */
static void verify_kv(soak *k, seq_slot *sl)
{
    if (!sl->length) return;
    verify_pos(k, sl, 0);
    verify_pos(k, sl, sl->length - 1);
    if (sl->req.prompt - 1 < sl->length) verify_pos(k, sl, sl->req.prompt - 1);
    for (int i = 0; i < 5; i++) verify_pos(k, sl, (size_t)(rng_next(&k->rng) % sl->length));
    k->checks++;
}

static bool handle_write(soak *k, llmem_handle h, size_t bytes, uint64_t seed)
{
    void *p = llmem_pool_pin(k->pool, h, NULL);
    if (!p) {
        fatal(k, "pin");
        return false;
    }
    fill_words(p, bytes, seed);
    llmem_pool_unpin(k->pool, h);
    return true;
}

static void handle_verify(soak *k, llmem_handle h, size_t bytes, uint64_t seed, uint64_t id)
{
    void *p = llmem_pool_pin(k->pool, h, NULL);
    if (!p) {
        fatal(k, "pin");
        return;
    }
    if (!check_words(p, bytes, seed)) corrupt(k, "handle block changed", id);
    llmem_pool_unpin(k->pool, h);
}

/* Free a sequence and what its request holds; verify first. */
static void release(soak *k, seq_slot *sl)
{
    verify_kv(k, sl);
    if (llmem_kv_seq_free(k->kv, sl->s)) fatal(k, "kv free");
    if (sl->scratch) {
        handle_verify(k, sl->scratch, sl->scratch_bytes, sl->scratch_seed, sl->req.id);
        if (llmem_pool_hfree(k->pool, sl->scratch)) fatal(k, "hfree");
    }
    if (sl->obj) {
        if (!check_words(sl->obj, sl->obj_bytes, sl->obj_seed)) corrupt(k, "request object changed", sl->req.id);
        if (llmem_pool_free(k->pool, sl->obj)) fatal(k, "free");
    }
    sl->live = false;
    sl->s = 0;
    sl->scratch = LLMEM_HANDLE_NULL;
    sl->obj = NULL;
    sl->length = 0;
}

/* Make room: preempt the most recently admitted sequence other than
 * `keep` (a root's request goes back to the head of the queue, a fork's
 * second sequence is dropped). False if there is none. */
static bool preempt(soak *k, const seq_slot *keep)
{
    seq_slot *victim = NULL;
    for (int i = 0; i < SOAK_RUN; i++)
        if (k->slot[i].live && &k->slot[i] != keep && (!victim || k->slot[i].admitted > victim->admitted))
            victim = &k->slot[i];
    if (!victim) return false;
    k->preemptions++;
    if (!victim->is_child && k->queued < sizeof k->queue / sizeof k->queue[0]) {
        memmove(&k->queue[1], &k->queue[0], k->queued * sizeof k->queue[0]);
        k->queue[0] = victim->req;
        k->queue[0].arrival_s = 0;
        k->queue[0].fork = false;
        k->queued++;
    }
    release(k, victim);
    return true;
}

/* Append n token slots (with tokens when `tokens`), preempting others when
 * the budget is full; then write them. False: this sequence itself was
 * given up (nothing to preempt). */
static bool append(soak *k, seq_slot *sl, size_t n, bool tokens)
{
    const int32_t *tk = NULL;
    if (tokens) {
        for (size_t i = 0; i < n; i++) k->tok_buf[i] = token_at(k, sl, sl->length + i);
        tk = k->tok_buf;
    }
    for (;;) {
        llmem_status st = llmem_kv_seq_append(k->kv, sl->s, n, tk, NULL);
        if (st == LLMEM_OK) break;
        if (st != LLMEM_ENOMEM) {
            fatal(k, "kv append");
            return false;
        }
        if (!preempt(k, sl)) {
            fatal(k, "kv append (nothing left to preempt)");
            return false;
        }
    }
    for (size_t i = 0; i < n; i++) {
        size_t p = sl->length + i;
        sl->ph[p] = prefix_step(p ? sl->ph[p - 1] : 0, token_at(k, sl, p), p);
    }
    size_t from = sl->length;
    sl->length += n;
    return write_kv(k, sl, from, sl->length);
}

static seq_slot *free_slot(soak *k)
{
    for (int i = 0; i < SOAK_RUN; i++)
        if (!k->slot[i].live) return &k->slot[i];
    return NULL;
}

static void stage(soak *k, llmem_stage st, uint32_t batch, uint64_t tokens)
{
    llmem_stage_event ev = {st, batch, tokens, tool_now_ns()};
    llmem_controller_on_stage(k->ctl, &ev);
}

/* Admit a request into sl: create, match the system prompt, append the rest
 * of the prompt; take its scratch handle and request object. Returns the
 * prompt tokens computed (0 if it could not be admitted). */
static size_t admit(soak *k, seq_slot *sl, const request *r)
{
    memset(&sl->req, 0, sizeof sl->req);
    sl->req = *r;
    sl->is_child = false;
    sl->generated = 0;
    sl->length = 0;
    if (llmem_kv_seq_create(k->kv, 0, &sl->s)) {
        fatal(k, "kv create");
        return 0;
    }
    sl->live = true;
    sl->admitted = ++k->admitted_seq;
    uint32_t lp = k->prefix_len[r->prefix];
    size_t matched = 0;
    if (llmem_kv_seq_match_prefix(k->kv, sl->s, k->prefix_tok[r->prefix], lp, &matched)) {
        fatal(k, "match prefix");
        return 0;
    }
    for (size_t p = 0; p < matched; p++) sl->ph[p] = prefix_step(p ? sl->ph[p - 1] : 0, token_at(k, sl, p), p);
    sl->length = matched;
    /* The system prompt's unmatched part with its tokens (registered in the
     * prefix cache), the user's part without. */
    if (lp > matched && !append(k, sl, lp - matched, true)) return 0;
    if (!append(k, sl, r->prompt - lp, false)) return 0;
    sl->scratch_bytes = ((size_t)r->prompt * SOAK_SCRATCH_PER_TOKEN + 4095) & ~(size_t)4095;
    sl->scratch_seed = mix(r->id ^ 0xabcdefull);
    if (llmem_pool_halloc(k->pool, sl->scratch_bytes, &sl->scratch)) {
        fatal(k, "halloc");
        return 0;
    }
    if (!handle_write(k, sl->scratch, sl->scratch_bytes, sl->scratch_seed)) return 0;
    sl->obj_bytes = 64 + (size_t)(rng_next(&k->rng) % 4000) / 8 * 8;
    sl->obj_seed = mix(r->id ^ 0x1234ull);
    sl->obj = llmem_pool_alloc(k->pool, sl->obj_bytes, NULL);
    if (!sl->obj) {
        fatal(k, "alloc");
        return 0;
    }
    fill_words(sl->obj, sl->obj_bytes, sl->obj_seed);
    k->requests_admitted++;
    return r->prompt - matched;
}

/* A second sequence from sl's prompt (sharing its blocks). */
static void fork_seq(soak *k, seq_slot *sl)
{
    seq_slot *c = free_slot(k);
    if (!c) return;
    if (llmem_kv_seq_fork(k->kv, sl->s, &c->s)) {
        fatal(k, "kv fork");
        return;
    }
    c->live = true;
    c->req = sl->req;
    c->req.fork = false;
    c->is_child = true;
    c->admitted = ++k->admitted_seq;
    c->generated = 0;
    c->length = sl->length;
    memcpy(c->ph, sl->ph, sl->length * sizeof *c->ph);
    c->scratch = LLMEM_HANDLE_NULL;
    c->obj = NULL;
    k->forks++;
}

static size_t live_count(const soak *k)
{
    size_t n = 0;
    for (int i = 0; i < SOAK_RUN; i++) n += k->slot[i].live;
    return n;
}

static void sleep_ms(double ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(fmod(ms, 1000.0) * 1e6)};
    while (nanosleep(&ts, &ts) == EINTR) {}
}

/* Replace one long-lived handle by a new one of the same size. */
static void churn_adapter(soak *k, adapter *a)
{
    if (a->h) {
        handle_verify(k, a->h, a->bytes, a->seed, 0);
        if (llmem_pool_hfree(k->pool, a->h)) fatal(k, "hfree");
        a->h = LLMEM_HANDLE_NULL;
    }
    a->seed = rng_next(&k->rng);
    if (llmem_pool_halloc(k->pool, a->bytes, &a->h)) {
        fatal(k, "halloc");
        return;
    }
    handle_write(k, a->h, a->bytes, a->seed);
}

/* Whether a prompt of this many tokens fits in the KV budget with room to
 * decode (admission control; a preemption remains possible). */
static bool fits(soak *k, uint32_t prompt)
{
    llmem_kv_stats ks = {sizeof ks};
    llmem_kv_get_stats(k->kv, &ks);
    uint64_t need = (uint64_t)(prompt + SOAK_MAX_GEN) * llmem_kv_bytes_per_token(k->kv);
    uint64_t held = ks.bytes_reserved > ks.blocks_cached * llmem_kv_block_bytes(k->kv) * SOAK_LAYERS
                        ? ks.bytes_reserved - ks.blocks_cached * llmem_kv_block_bytes(k->kv) * SOAK_LAYERS
                        : 0;
    return held + need <= SOAK_KV_BUDGET / 10 * 9;
}

/* One burst, served to the end (or to the deadline). */
static void burst(soak *k, double deadline)
{
    atomic_store(&k->phase, 1);
    k->bursts++;
    size_t n = 4 + (size_t)(rng_next(&k->rng) % (SOAK_MAX_BURST - 3));
    double window = 2.0 * rng_unit(&k->rng);
    k->queued = 0;
    for (size_t i = 0; i < n; i++) k->queue[k->queued++] = make_request(k, window);
    qsort(k->queue, k->queued, sizeof k->queue[0], by_arrival);
    churn_adapter(k, &k->ad[rng_next(&k->rng) % SOAK_ADAPTERS]);
    double start = elapsed(k);
    while (!k->error && (k->queued || live_count(k))) {
        double now = elapsed(k);
        if (now >= deadline) break;
        /* This step's prompts: what has arrived, while a slot is free, up
         * to 4096 prompt tokens and while the KV budget has room. */
        size_t free_slots = SOAK_RUN - live_count(k), batch = 0;
        uint64_t step_prompt = 0;
        while (batch < k->queued && batch < free_slots && step_prompt < 4096 &&
               k->queue[batch].arrival_s <= now - start &&
               (live_count(k) + batch == 0 || fits(k, (uint32_t)step_prompt + k->queue[batch].prompt)))
            step_prompt += k->queue[batch++].prompt;
        if (batch) stage(k, LLMEM_STAGE_PREFILL, (uint32_t)batch, step_prompt);
        for (int i = 0; i < SOAK_RUN; i++) k->slot[i].fresh = false;
        size_t prompt_tokens = 0;
        uint64_t preempted = k->preemptions;
        for (size_t b = 0; b < batch && k->queued && k->preemptions == preempted; b++) {
            seq_slot *sl = free_slot(k);
            if (!sl) break;
            request r = k->queue[0];
            memmove(&k->queue[0], &k->queue[1], (k->queued - 1) * sizeof k->queue[0]);
            k->queued--;
            prompt_tokens += admit(k, sl, &r);
            if (k->error) return;
            sl->fresh = true;
            if (r.fork) fork_seq(k, sl);
        }
        /* Decode one token for every running sequence not admitted now. */
        size_t decoding = 0;
        for (int i = 0; i < SOAK_RUN && !k->error; i++) {
            seq_slot *sl = &k->slot[i];
            if (!sl->live || sl->fresh) continue;
            if (!append(k, sl, 1, false)) return;
            sl->generated++;
            decoding++;
            if (sl->generated >= sl->req.gen) {
                release(k, sl);
                if (!sl->is_child) k->requests_done++;
            }
        }
        if (!batch) stage(k, LLMEM_STAGE_DECODE, (uint32_t)decoding, decoding);
        k->tokens += prompt_tokens + decoding;
        k->steps++;
        /* The step's compute: 1 ms, plus 1 ms per 2048 prompt tokens. */
        sleep_ms(1.0 + (double)prompt_tokens / 2048.0);
        if (!batch && !decoding && k->queued) sleep_ms(5); /* waiting for arrivals */
    }
}

/* An idle gap: tick the controller; at the end of a long one, record the
 * trough. */
static void idle_gap(soak *k, double deadline)
{
    atomic_store(&k->phase, 0);
    stage(k, LLMEM_STAGE_IDLE, 0, 0);
    llmem_kv_trim(k->kv, false);
    double decay = k->decay_ms / 1000.0;
    bool is_long = rng_next(&k->rng) % 5 != 0;
    double gap = is_long ? decay * (1.5 + 3.5 * rng_unit(&k->rng)) : decay * (0.2 + 0.6 * rng_unit(&k->rng));
    double start = elapsed(k), end = start + gap;
    if (end > deadline) end = deadline;
    bool housekept = false;
    while (elapsed(k) < end) {
        sleep_ms(20);
        llmem_controller_tick(k->ctl);
        if (is_long && !housekept && elapsed(k) - start > decay + 0.05) {
            housekept = true;
            k->gaps_long++;
            if (k->gaps_long % 10 == 0) {
                if (llmem_pool_check(k->pool)) fatal(k, "pool check");
                if (llmem_kv_check(k->kv)) fatal(k, "kv check");
            }
            if (k->gaps_long % 20 == 0) {
                llmem_pool_compact_report rep = {sizeof rep, 0, 0, 0, 0, 0, 0};
                if (llmem_pool_compact(k->pool, 0, &rep)) fatal(k, "compact");
                k->manual_compactions++;
                k->manual_moved += rep.bytes_moved;
                for (int i = 0; i < SOAK_ADAPTERS; i++) handle_verify(k, k->ad[i].h, k->ad[i].bytes, k->ad[i].seed, 0);
            }
        }
    }
    if (!is_long) k->gaps_short++;
    if (is_long && housekept && elapsed(k) < deadline && k->ntroughs < k->troughs_cap)
        k->troughs[k->ntroughs++] = (trough){elapsed(k), rss_bytes()};
}

/* ---- set-up, teardown, figures ---------------------------------------------- */

static int load_trace(soak *k, const char *path, bool required)
{
    if (!path) return 0;
    if (access(path, R_OK) != 0) {
        if (!required) return 0;
        fprintf(stderr, "llmem soak: %s: %s\n", path, strerror(errno));
        return 2;
    }
    llmem_trace t = {0};
    if (llmem_trace_load(path, &t)) {
        fprintf(stderr, "llmem soak: %s: %s\n", path, llmem_last_error());
        return 2;
    }
    k->trace_prompt = malloc(t.count * sizeof *k->trace_prompt);
    k->trace_gen = malloc(t.count * sizeof *k->trace_gen);
    if (!k->trace_prompt || !k->trace_gen) {
        llmem_trace_free(&t);
        return 1;
    }
    for (size_t i = 0; i < t.count; i++) {
        k->trace_prompt[i] = t.req[i].prompt_tokens;
        k->trace_gen[i] = t.req[i].output_tokens;
    }
    k->trace_n = t.count;
    llmem_trace_free(&t);
    return 0;
}

static int setup(soak *k)
{
    if (llmem_os_resource_create(NULL, &k->os) || llmem_tracking_resource_create(k->os, &k->track)) {
        fatal(k, "resources");
        return 1;
    }
    llmem_pool_options po = llmem_pool_options_default();
    po.name = "soak";
    po.resource = k->track;
    po.first_superblock_bytes = 4 * MIB;
    po.max_superblock_bytes = 32 * MIB;
    po.purge = LLMEM_POOL_PURGE_MANUAL; /* the controller decides */
    if (llmem_pool_create(&po, &k->pool)) {
        fatal(k, "pool");
        return 1;
    }
    llmem_kv_options ko = llmem_kv_options_default();
    ko.name = "soak-kv";
    ko.layers = SOAK_LAYERS;
    ko.kv_heads = SOAK_KV_HEADS;
    ko.head_dim = SOAK_HEAD_DIM;
    ko.dtype = LLMEM_KV_F16;
    ko.block_tokens = SOAK_BLOCK;
    ko.max_seq_len = SOAK_MAX_SEQ;
    ko.budget_bytes = SOAK_KV_BUDGET;
    ko.pool = k->pool;
    ko.prefix_cache = true;
    if (llmem_kv_create(&ko, &k->kv)) {
        fatal(k, "kv");
        return 1;
    }
    llmem_controller_options co = llmem_controller_options_default();
    co.pool = k->pool;
    co.bytes_per_token_hint = llmem_kv_bytes_per_token(k->kv) + SOAK_SCRATCH_PER_TOKEN;
    co.idle_decay_ms = k->decay_ms;
    if (llmem_controller_create(&co, &k->ctl)) {
        fatal(k, "controller");
        return 1;
    }
    for (int i = 0; i < SOAK_RUN; i++) {
        k->slot[i].ph = malloc(SOAK_MAX_SEQ * sizeof *k->slot[i].ph);
        if (!k->slot[i].ph) return 1;
    }
    for (int i = 0; i < SOAK_PREFIXES; i++) {
        k->prefix_len[i] = 128u << i; /* 128, 256, 512, 1024 */
        for (uint32_t t = 0; t < k->prefix_len[i]; t++) k->prefix_tok[i][t] = (int32_t)(mix((uint64_t)i * 7919 + t) % 32000u);
    }
    static const size_t adapter_kib[SOAK_ADAPTERS] = {64, 128, 256, 512, 1024, 1024, 2048, 256};
    for (int i = 0; i < SOAK_ADAPTERS; i++) {
        k->ad[i].bytes = adapter_kib[i] << 10;
        churn_adapter(k, &k->ad[i]);
    }
    return k->error;
}

/* Free everything, destroy in order; leaks: the pool's live allocations
 * before destroy, then the tracking resource's live mappings. */
static void teardown(soak *k, uint64_t *pool_live, size_t *mappings, uint64_t *pool_check_failed)
{
    for (int i = 0; i < SOAK_RUN; i++)
        if (k->slot[i].live) release(k, &k->slot[i]);
    for (int i = 0; i < SOAK_ADAPTERS; i++)
        if (k->ad[i].h) {
            handle_verify(k, k->ad[i].h, k->ad[i].bytes, k->ad[i].seed, 0);
            llmem_pool_hfree(k->pool, k->ad[i].h);
            k->ad[i].h = LLMEM_HANDLE_NULL;
        }
    if (k->kv && llmem_kv_check(k->kv)) (*pool_check_failed)++;
    llmem_controller_destroy(k->ctl);
    k->ctl = NULL;
    llmem_kv_destroy(k->kv);
    k->kv = NULL;
    if (k->pool) {
        llmem_pool_flush_thread_cache(k->pool);
        llmem_pool_stats ps = {sizeof ps};
        llmem_pool_get_stats(k->pool, &ps);
        *pool_live = ps.live_allocations + ps.handles;
        if (llmem_pool_check(k->pool)) (*pool_check_failed)++;
    }
    llmem_pool_destroy(k->pool);
    k->pool = NULL;
    *mappings = 0;
    if (k->track) {
        llmem_tracking_resource_report(k->track, stderr, mappings);
        llmem_resource_destroy(k->track);
    }
    llmem_resource_destroy(k->os);
    for (int i = 0; i < SOAK_RUN; i++) free(k->slot[i].ph);
    free(k->trace_prompt);
    free(k->trace_gen);
}

/* Least-squares slope of y over x. */
static double slope(const double *x, const double *y, size_t n, double *mean_y)
{
    double mx = 0, my = 0;
    for (size_t i = 0; i < n; i++) {
        mx += x[i];
        my += y[i];
    }
    mx /= (double)n;
    my /= (double)n;
    double sxy = 0, sxx = 0;
    for (size_t i = 0; i < n; i++) {
        sxy += (x[i] - mx) * (y[i] - my);
        sxx += (x[i] - mx) * (x[i] - mx);
    }
    *mean_y = my;
    return sxx > 0 ? sxy / sxx : 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: llmem soak [--minutes M | --seconds S] [--samples FILE.csv|FILE.json] [--seed N]\n"
            "                  [--trace FILE] [--warmup S] [--idle-decay-ms MS] [--max-drift PCT] [--progress]\n"
            "\n"
            "Serves random bursts of requests (lengths from the Azure code trace) through a paged KV\n"
            "cache and a pool under the stage-aware controller, on real host memory, for the given wall\n"
            "time (default 30 minutes), with idle gaps in which the controller shrinks the pool. Records\n"
            "resident memory each second and at every idle trough; prints a JSON summary. Fails (exit 1)\n"
            "when the trough RSS drifts up by more than --max-drift (default 2%%) over the run after the\n"
            "warm-up, when anything is still mapped or allocated after teardown, or when any block's\n"
            "contents changed.\n");
}

static bool parse_double(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

int llmem_cmd_soak(int argc, char **argv)
{
    soak *k = calloc(1, sizeof *k);
    if (!k) return 1;
    k->seconds = 30 * 60;
    k->warmup_s = -1;
    k->max_drift = 0.02;
    k->decay_ms = 1000;
    k->seed = 0x50a4;
    const char *trace = NULL;
    int rc = 0;
    for (int i = 1; i < argc && !rc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double d;
        uint32_t u;
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            usage(stdout);
            free(k);
            return 0;
        } else if (!strcmp(o, "--minutes") && v && parse_double(v, 0.01, 1e6, &d)) {
            k->seconds = d * 60;
            i++;
        } else if (!strcmp(o, "--seconds") && v && parse_double(v, 1, 1e8, &d)) {
            k->seconds = d;
            i++;
        } else if (!strcmp(o, "--warmup") && v && parse_double(v, 0, 1e8, &d)) {
            k->warmup_s = d;
            i++;
        } else if (!strcmp(o, "--max-drift") && v && parse_double(v, 0, 100, &d)) {
            k->max_drift = d / 100;
            i++;
        } else if (!strcmp(o, "--idle-decay-ms") && v && tool_parse_u32(v, 10, 600000, &u)) {
            k->decay_ms = u;
            i++;
        } else if (!strcmp(o, "--seed") && v && tool_parse_u32(v, 0, UINT32_MAX, &u)) {
            k->seed = u;
            i++;
        } else if (!strcmp(o, "--samples") && v) {
            k->samples_path = argv[++i];
        } else if (!strcmp(o, "--trace") && v) {
            trace = argv[++i];
        } else if (!strcmp(o, "--progress")) {
            k->progress = true;
        } else {
            fprintf(stderr, "llmem soak: unknown, incomplete or out-of-range option '%s'\n", o);
            usage(stderr);
            rc = 2;
        }
    }
    if (rc) {
        free(k);
        return rc;
    }
    if (k->warmup_s < 0) k->warmup_s = fmin(300, fmax(2, k->seconds / 10));
    if (k->warmup_s >= k->seconds) {
        fprintf(stderr, "llmem soak: the warm-up must be shorter than the run\n");
        free(k);
        return 2;
    }
    k->rng = mix(k->seed + 1) | 1;
    llmem_log_set(NULL, NULL, LLMEM_LOG_OFF);
    const char *trace_used = "built-in quantiles";
    if (trace) {
        rc = load_trace(k, trace, true);
        trace_used = trace;
    } else {
        static const char *defaults[] = {"../shared/traces/AzureLLMInferenceTrace_code.csv",
                                         "shared/traces/AzureLLMInferenceTrace_code.csv"};
        for (size_t i = 0; i < 2 && !rc && !k->trace_n; i++) {
            rc = load_trace(k, defaults[i], false);
            if (k->trace_n) trace_used = defaults[i];
        }
    }
    if (rc) {
        free(k->trace_prompt);
        free(k->trace_gen);
        free(k);
        return rc;
    }
    k->samples_cap = (size_t)k->seconds + 120;
    k->troughs_cap = (size_t)(k->seconds / (1.5 * k->decay_ms / 1000.0)) + 16;
    k->samples = calloc(k->samples_cap, sizeof *k->samples);
    k->troughs = calloc(k->troughs_cap, sizeof *k->troughs);
    if (!k->samples || !k->troughs) {
        free(k->samples);
        free(k->troughs);
        free(k);
        return 1;
    }
    /* Make the sample arrays resident now, so that filling them over the
     * run does not count as drift. */
    touch_pages(k->samples, k->samples_cap * sizeof *k->samples);
    touch_pages(k->troughs, k->troughs_cap * sizeof *k->troughs);
    if (k->samples_path) {
        size_t n = strlen(k->samples_path);
        k->samples_json = n > 5 && !strcmp(k->samples_path + n - 5, ".json");
        if (llmem_outfile_open(k->samples_path, &k->samples_out)) {
            fprintf(stderr, "llmem soak: --samples: %s\n", llmem_last_error());
            return 2;
        }
        k->samples_file = llmem_outfile_stream(k->samples_out);
        fputs(k->samples_json ? "[\n" : "t_s,rss_bytes,committed_bytes,used_bytes,reserved_bytes,kv_bytes,sequences,phase\n",
              k->samples_file);
    }

    k->t0_ns = tool_now_ns();
    if (!setup(k)) {
        if (pthread_create(&k->sampler, NULL, sampler_main, k) == 0) k->sampler_started = true;
        while (!k->error && elapsed(k) < k->seconds) {
            burst(k, k->seconds);
            if (!k->error && elapsed(k) < k->seconds) idle_gap(k, k->seconds);
        }
    }
    double duration = elapsed(k);
    atomic_store(&k->stop, 1);
    if (k->sampler_started) pthread_join(k->sampler, NULL);
    llmem_controller_stats cs = {sizeof cs};
    if (k->ctl) llmem_controller_get_stats(k->ctl, &cs);
    llmem_pool_stats ps = {sizeof ps};
    if (k->pool) llmem_pool_get_stats(k->pool, &ps);
    uint64_t pool_live = 0, check_failed = 0;
    size_t mappings = 0;
    teardown(k, &pool_live, &mappings, &check_failed);
    bool samples_failed = false;
    if (k->samples_file) {
        if (k->samples_json) fputs("\n]\n", k->samples_file);
        k->samples_file = NULL;
        if (llmem_outfile_commit(k->samples_out)) {
            fprintf(stderr, "llmem soak: --samples: %s\n", llmem_last_error());
            samples_failed = true;
        }
    }

    /* Drift over the troughs after the warm-up. */
    double *x = calloc(k->ntroughs + k->nsamples / 60 + 2, sizeof *x);
    double *y = calloc(k->ntroughs + k->nsamples / 60 + 2, sizeof *y);
    size_t n = 0;
    for (size_t i = 0; x && y && i < k->ntroughs; i++)
        if (k->troughs[i].t >= k->warmup_s) {
            x[n] = k->troughs[i].t;
            y[n++] = (double)k->troughs[i].rss;
        }
    double post = duration - k->warmup_s, mean = 0, drift = 0, trough_min = 0, trough_max = 0;
    bool drift_valid = n >= 3;
    if (drift_valid) drift = slope(x, y, n, &mean) * post / mean;
    for (size_t i = 0; i < n; i++) {
        if (!i || y[i] < trough_min) trough_min = y[i];
        if (y[i] > trough_max) trough_max = y[i];
    }
    size_t ntr = n;
    /* For information: the same over the per-minute maxima. */
    n = 0;
    double peak_mean = 0, peak_drift = 0;
    for (size_t m = 0; x && y && (double)(m + 1) * 60 <= duration; m++) {
        double t0 = (double)m * 60;
        if (t0 < k->warmup_s) continue;
        size_t mx = 0;
        for (size_t i = 0; i < k->nsamples; i++)
            if (k->samples[i].t >= t0 && k->samples[i].t < t0 + 60 && k->samples[i].rss > mx) mx = k->samples[i].rss;
        x[n] = t0 + 30;
        y[n++] = (double)mx;
    }
    if (n >= 3) peak_drift = slope(x, y, n, &peak_mean) * post / peak_mean;
    free(x);
    free(y);

    bool drift_ok = !drift_valid || drift <= k->max_drift;
    bool leak_ok = mappings == 0 && pool_live == 0 && check_failed == 0;
    const char *status = k->error ? (k->corruptions ? "corruption" : "error") : !leak_ok ? "leak" : !drift_ok ? "drift" : "ok";
    printf("{\"command\":\"soak\",\"duration_s\":%.1f,\"seed\":%llu,\"trace\":\"%s\",\"samples\":%zu,\"warmup_s\":%.1f,"
           "\"troughs\":%zu,\"trough_rss_mean_bytes\":%.0f,\"trough_rss_min_bytes\":%.0f,\"trough_rss_max_bytes\":%.0f,"
           "\"drift\":%.5f,\"drift_pct\":%.3f,\"drift_valid\":%s,\"max_drift_pct\":%.2f,\"peak_drift_pct\":%.3f,"
           "\"rss_peak_bytes\":%zu,\"bursts\":%llu,\"idle_gaps_long\":%llu,\"idle_gaps_short\":%llu,"
           "\"requests_completed\":%llu,\"requests_admitted\":%llu,\"forks\":%llu,\"preemptions\":%llu,"
           "\"tokens\":%llu,\"steps\":%llu,\"kv_checks\":%llu,\"controller_reserves\":%llu,\"controller_grows\":%llu,"
           "\"controller_shrinks\":%llu,\"controller_compactions\":%llu,\"controller_failures\":%llu,"
           "\"bytes_released\":%llu,\"manual_compactions\":%llu,\"bytes_moved\":%llu,\"pool_resource_calls\":%llu,"
           "\"corruptions\":%llu,\"pool_live_blocks\":%llu,\"leaked_mappings\":%zu,\"checks_failed\":%llu,"
           "\"status\":\"%s\"}\n",
           duration, (unsigned long long)k->seed, trace_used, k->nsamples, k->warmup_s, ntr, mean, trough_min,
           trough_max, drift, 100 * drift, drift_valid ? "true" : "false", 100 * k->max_drift, 100 * peak_drift,
           k->rss_peak, (unsigned long long)k->bursts, (unsigned long long)k->gaps_long,
           (unsigned long long)k->gaps_short, (unsigned long long)k->requests_done,
           (unsigned long long)k->requests_admitted, (unsigned long long)k->forks,
           (unsigned long long)k->preemptions, (unsigned long long)k->tokens, (unsigned long long)k->steps,
           (unsigned long long)k->checks, (unsigned long long)cs.reserves_total, (unsigned long long)cs.grows_total,
           (unsigned long long)cs.shrinks_total, (unsigned long long)cs.compactions_total,
           (unsigned long long)cs.failures_total, (unsigned long long)cs.bytes_released_total,
           (unsigned long long)k->manual_compactions, (unsigned long long)(k->manual_moved + cs.bytes_compacted_total),
           (unsigned long long)ps.resource_calls_total, (unsigned long long)k->corruptions,
           (unsigned long long)pool_live, mappings, (unsigned long long)check_failed, status);
    rc = strcmp(status, "ok") || samples_failed ? 1 : 0;
    free(k->samples);
    free(k->troughs);
    free(k);
    return rc;
}
