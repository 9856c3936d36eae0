/*
 * cmd_soak.c - `llmem soak`: serve random bursts of requests for a long
 * time, on the wall clock, and watch resident memory for drift and leaks.
 *
 * The setup an engine would have, with host memory standing in for the
 * device so that resident memory (RSS) shows what the pool holds: an os
 * resource under a tracking resource, one pool over it driven by the
 * stage-aware controller (llmem_memctl; purge MANUAL: memory goes back only
 * when the controller says so), a PAGED KV manager with the prefix cache
 * over that pool, and the library's scheduler (llmem/sched.h) over a
 * simulated engine on the wall clock: each step sleeps its modelled time
 * (1 ms, plus 1 ms per 2048 prompt tokens), and every KV slot a step
 * appends is written, K and V of every layer, with a pattern of its
 * position's prefix hash that is checked before the sequence is freed and
 * after a swap-in (the simulation's write_kv). Geometry: 4 layers, 2 KV
 * heads of 64, f16 (2 KiB of KV a token), 16-token blocks, contexts up to
 * 8192 tokens, a 96 MiB KV budget.
 *
 * The load, a loop of cycles until the deadline:
 *  - a burst of 4..32 requests arriving over up to 2 s; prompt and output
 *    lengths drawn from the Azure code trace (--trace, by default
 *    ../shared/traces/AzureLLMInferenceTrace_code.csv when present, else its
 *    quantiles built in), outputs capped at 512 tokens. Every prompt starts
 *    with one of 4 shared system prompts (128..1024 tokens), the only part
 *    offered to the prefix cache (cache_limit), so the cache holds and
 *    shares them. The scheduler runs up to 12 sequences, 4096 prompt tokens
 *    a step; 1 in 8 requests asks for two samples (n = 2: a fork sharing
 *    the prompt's blocks); when a step finds no memory the most recently
 *    admitted sequence is preempted and recomputed. Each admitted request
 *    also holds a movable scratch buffer (a pool handle, 256 B a prompt
 *    token) and a small raw block, taken when the scheduler admits it and
 *    verified and freed when it finishes or is preempted (its events); 8
 *    long-lived handles (adapters, 64 KiB..2 MiB) are replaced one per
 *    burst, so that freed holes make the pool fragment and the controller
 *    compact.
 *  - an idle gap: 80% of them long (1.5..5 decay delays: the controller
 *    shrinks), 20% short (under the decay: nothing goes back). The
 *    scheduler ticks the controller every 20 ms. Every 10th long gap,
 *    llmem_pool_check and llmem_kv_check; every 20th, an explicit
 *    llmem_pool_compact.
 *
 * Handles and raw blocks hold patterns too, verified before every free and
 * after every compaction: a mismatch, like a KV one, is a corruption,
 * counted and fatal.
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
    SOAK_LIVE = 2 * SOAK_MAX_BURST, /* request records: a burst, and what a cut-short one left */
    SOAK_SCRATCH_PER_TOKEN = 256,
    SOAK_KV_BUDGET = 96 << 20,
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
    bool fork;            /* two samples */
} request;

/* What the soak keeps for a request the scheduler runs. */
typedef struct live_req {
    bool used;
    request req;
    llmem_sched_req sid;
    bool admitted_once;
    llmem_handle scratch;   /* movable scratch, while admitted */
    size_t scratch_bytes;
    uint64_t scratch_seed;
    unsigned char *obj;     /* a small raw block (request object), while admitted */
    size_t obj_bytes;
    uint64_t obj_seed;
} live_req;

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
    llmem_memctl *mc;
    llmem_pool *pool;
    llmem_kv *kv;
    llmem_controller *ctl;
    llmem_sched *sched;
    int32_t prefix_tok[SOAK_PREFIXES][1024];
    uint32_t prefix_len[SOAK_PREFIXES];
    live_req live[SOAK_LIVE];
    adapter ad[SOAK_ADAPTERS];
    request queue[SOAK_MAX_BURST];
    size_t queued, qhead;
    uint64_t rng, next_id;
    int32_t tok_buf[SOAK_MAX_SEQ];
    /* figures */
    uint64_t requests_done, requests_admitted, bursts, gaps_long, gaps_short;
    uint64_t corruptions, manual_compactions, manual_moved;
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

static double elapsed(const soak *k) { return (double)(llmem_time_now_ns() - k->t0_ns) * 1e-9; }

static void fatal(soak *k, const char *what)
{
    if (!k->error) fprintf(stderr, "llmem soak: %s: %s\n", what, llmem_error_message());
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

/* What an admitted request holds besides its KV: taken at its admission. */
static void take_extras(soak *k, live_req *l)
{
    l->scratch_bytes = ((size_t)l->req.prompt * SOAK_SCRATCH_PER_TOKEN + 4095) & ~(size_t)4095;
    l->scratch_seed = mix(l->req.id ^ 0xabcdefull);
    if (llmem_pool_handle_alloc(k->pool, l->scratch_bytes, &l->scratch)) {
        fatal(k, "handle_alloc");
        return;
    }
    if (!handle_write(k, l->scratch, l->scratch_bytes, l->scratch_seed)) return;
    l->obj_bytes = 64 + (size_t)(rng_next(&k->rng) % 4000) / 8 * 8;
    l->obj_seed = mix(l->req.id ^ 0x1234ull);
    l->obj = llmem_pool_alloc(k->pool, l->obj_bytes, NULL);
    if (!l->obj) {
        fatal(k, "alloc");
        return;
    }
    fill_words(l->obj, l->obj_bytes, l->obj_seed);
}

/* ...verified and given back when it finishes or is preempted. */
static void drop_extras(soak *k, live_req *l)
{
    if (l->scratch) {
        handle_verify(k, l->scratch, l->scratch_bytes, l->scratch_seed, l->req.id);
        if (llmem_pool_handle_free(k->pool, l->scratch)) fatal(k, "handle_free");
        l->scratch = LLMEM_HANDLE_NULL;
    }
    if (l->obj) {
        if (!check_words(l->obj, l->obj_bytes, l->obj_seed)) corrupt(k, "request object changed", l->req.id);
        if (llmem_pool_free(k->pool, l->obj)) fatal(k, "free");
        l->obj = NULL;
    }
}

/* The scheduler's events, on its stepping thread (this one). */
static bool on_event(void *ctx, const llmem_sched_event *ev)
{
    soak *k = ctx;
    live_req *l = ev->user;
    if (!l || ev->sample != 0) return false;
    switch (ev->kind) {
    case LLMEM_SCHED_EV_ADMIT:
        if (!l->admitted_once) k->requests_admitted++;
        l->admitted_once = true;
        if (!l->scratch) take_extras(k, l);
        break;
    case LLMEM_SCHED_EV_PREEMPT:
        drop_extras(k, l);
        break;
    case LLMEM_SCHED_EV_FINISH:
        drop_extras(k, l);
        if (ev->finish != LLMEM_SCHED_FINISH_CANCELLED && ev->finish != LLMEM_SCHED_FINISH_REJECTED) k->requests_done++;
        break;
    default: break;
    }
    return false;
}

/* Release the records of requests whose every sample finished. */
static void reap(soak *k, bool all)
{
    for (int i = 0; i < SOAK_LIVE; i++) {
        live_req *l = &k->live[i];
        if (!l->used) continue;
        llmem_sched_info info;
        bool done = true;
        for (uint32_t smp = 0; smp < (l->req.fork ? 2u : 1u); smp++)
            if (llmem_sched_get_info(k->sched, l->sid, smp, &info) || info.state != LLMEM_SCHED_FINISHED) done = false;
        if (!done && !all) continue;
        if (llmem_sched_release(k->sched, l->sid)) fatal(k, "release");
        drop_extras(k, l); /* a cancellation delivers no event */
        l->used = false;
    }
}

/* Submit one request (its system prompt, then tokens of its own). */
static void submit(soak *k, const request *r)
{
    live_req *l = NULL;
    for (int i = 0; i < SOAK_LIVE && !l; i++)
        if (!k->live[i].used) l = &k->live[i];
    if (!l) {
        fatal(k, "no free request record");
        return;
    }
    memset(l, 0, sizeof *l);
    l->used = true;
    l->req = *r;
    uint32_t lp = k->prefix_len[r->prefix];
    memcpy(k->tok_buf, k->prefix_tok[r->prefix], lp * sizeof *k->tok_buf);
    for (uint32_t p = lp; p < r->prompt; p++) k->tok_buf[p] = (int32_t)(mix(r->id * 0x9e3779b97f4a7c15ull + p) % 32000u);
    llmem_sched_params p = llmem_sched_params_default();
    p.prompt = k->tok_buf;
    p.prompt_len = r->prompt;
    p.max_tokens = r->gen;
    p.n = r->fork ? 2 : 1;
    p.temperature = 0;
    p.cache_limit = lp; /* only the system prompt is shared */
    p.user = l;
    if (llmem_sched_submit(k->sched, &p, &l->sid)) {
        fatal(k, "submit");
        l->used = false;
    }
}

/* Replace one long-lived handle by a new one of the same size. */
static void churn_adapter(soak *k, adapter *a)
{
    if (a->h) {
        handle_verify(k, a->h, a->bytes, a->seed, 0);
        if (llmem_pool_handle_free(k->pool, a->h)) fatal(k, "handle_free");
        a->h = LLMEM_HANDLE_NULL;
    }
    a->seed = rng_next(&k->rng);
    if (llmem_pool_handle_alloc(k->pool, a->bytes, &a->h)) {
        fatal(k, "handle_alloc");
        return;
    }
    handle_write(k, a->h, a->bytes, a->seed);
}

static uint64_t ns_of(double secs) { return secs > 0 ? (uint64_t)llround(secs * 1e9) : 0; }

/* One burst, served to the end (or to the deadline): requests submitted as
 * they arrive, the scheduler stepped while any is pending. */
static void burst(soak *k, double deadline)
{
    atomic_store(&k->phase, 1);
    k->bursts++;
    size_t n = 4 + (size_t)(rng_next(&k->rng) % (SOAK_MAX_BURST - 3));
    double window = 2.0 * rng_unit(&k->rng);
    k->queued = k->qhead = 0;
    for (size_t i = 0; i < n; i++) k->queue[k->queued++] = make_request(k, window);
    qsort(k->queue, k->queued, sizeof k->queue[0], by_arrival);
    churn_adapter(k, &k->ad[rng_next(&k->rng) % SOAK_ADAPTERS]);
    double start = elapsed(k);
    while (!k->error && (k->qhead < k->queued || llmem_sched_pending(k->sched))) {
        double now = elapsed(k);
        if (now >= deadline) break;
        while (k->qhead < k->queued && k->queue[k->qhead].arrival_s <= now - start) submit(k, &k->queue[k->qhead++]);
        if (!llmem_sched_pending(k->sched)) {
            /* Waiting for the next arrival: idle on the scheduler's clock. */
            double at = start + k->queue[k->qhead].arrival_s;
            if (llmem_sched_advance(k->sched, llmem_sched_now_ns(k->sched) + ns_of(at - now))) fatal(k, "advance");
            continue;
        }
        if (llmem_sched_step(k->sched, NULL)) fatal(k, "step");
        reap(k, false);
    }
}

/* An idle gap: the scheduler's clock runs on (IDLE; the controller ticked
 * every 20 ms); at the end of a long one, record the trough. */
static void idle_gap(soak *k, double deadline)
{
    atomic_store(&k->phase, 0);
    llmem_kv_trim(k->kv, false);
    double decay = k->decay_ms / 1000.0;
    bool is_long = rng_next(&k->rng) % 5 != 0;
    double gap = is_long ? decay * (1.5 + 3.5 * rng_unit(&k->rng)) : decay * (0.2 + 0.6 * rng_unit(&k->rng));
    double start = elapsed(k), end = start + gap;
    if (end > deadline) end = deadline;
    bool housekept = false;
    if (is_long && start + decay + 0.05 < end) {
        if (llmem_sched_advance(k->sched, llmem_sched_now_ns(k->sched) + ns_of(decay + 0.05))) fatal(k, "advance");
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
    double now = elapsed(k);
    if (end > now && llmem_sched_advance(k->sched, llmem_sched_now_ns(k->sched) + ns_of(end - now)))
        fatal(k, "advance");
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
        fprintf(stderr, "llmem soak: %s: %s\n", path, llmem_error_message());
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
    /* Pool and controller (no predictor: a prefill reserves its tokens x
     * the KV and scratch bytes a token takes). */
    llmem_memctl_options mo = llmem_memctl_options_default();
    mo.name = "soak";
    mo.resource = k->track;
    mo.first_superblock_bytes = 4 * MIB;
    mo.max_superblock_bytes = 32 * MIB;
    mo.no_predictor = true;
    mo.controller.bytes_per_token_hint = 2u * SOAK_LAYERS * SOAK_KV_HEADS * SOAK_HEAD_DIM * 2 + SOAK_SCRATCH_PER_TOKEN;
    mo.controller.idle_decay_ms = k->decay_ms;
    if (llmem_memctl_create(&mo, &k->mc)) {
        fatal(k, "pool and controller");
        return 1;
    }
    k->pool = llmem_memctl_pool(k->mc);
    k->ctl = llmem_memctl_controller(k->mc);
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
    llmem_sched_sim_options sim = llmem_sched_sim_options_default();
    sim.kv = k->kv;
    sim.realtime = true;
    sim.write_kv = true;
    sim.seed = k->seed + 1;
    sim.model = llmem_step_model_linear(0.001, 0.001 / 2048, 0, 0);
    llmem_sched_options so = llmem_sched_options_default();
    so.max_batch = SOAK_RUN;
    so.max_step_tokens = 4096 + SOAK_RUN;
    so.headroom_blocks = 4;
    so.controller = k->ctl;
    so.on_event = on_event;
    so.event_ctx = k;
    if (llmem_sched_create_sim(&sim, &so, &k->sched)) {
        fatal(k, "scheduler");
        return 1;
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
static void teardown(soak *k, uint64_t *pool_live, size_t *mappings, uint64_t *pool_check_failed,
                     llmem_sched_stats *ss, llmem_sched_sim_stats *sims)
{
    if (k->sched) {
        reap(k, true); /* cancels what the deadline cut short: its KV is verified and freed */
        ss->struct_size = sizeof *ss;
        llmem_sched_get_stats(k->sched, ss);
        sims->struct_size = sizeof *sims;
        llmem_sched_get_sim_stats(k->sched, sims);
        if (sims->kv_corruptions_total) corrupt(k, "KV token slot changed", 0);
        k->corruptions += sims->kv_corruptions_total ? sims->kv_corruptions_total - 1 : 0;
    }
    llmem_sched_destroy(k->sched);
    k->sched = NULL;
    for (int i = 0; i < SOAK_ADAPTERS; i++)
        if (k->ad[i].h) {
            handle_verify(k, k->ad[i].h, k->ad[i].bytes, k->ad[i].seed, 0);
            llmem_pool_handle_free(k->pool, k->ad[i].h);
            k->ad[i].h = LLMEM_HANDLE_NULL;
        }
    if (k->kv && llmem_kv_check(k->kv)) (*pool_check_failed)++;
    llmem_kv_destroy(k->kv);
    k->kv = NULL;
    if (k->pool) {
        llmem_pool_flush_thread_cache(k->pool);
        llmem_pool_stats ps = {sizeof ps};
        llmem_pool_get_stats(k->pool, &ps);
        *pool_live = ps.live_allocations + ps.handles;
        if (llmem_pool_check(k->pool)) (*pool_check_failed)++;
    }
    llmem_memctl_destroy(k->mc);
    k->mc = NULL;
    k->pool = NULL;
    k->ctl = NULL;
    *mappings = 0;
    if (k->track) {
        llmem_tracking_resource_report(k->track, stderr, mappings);
        llmem_resource_destroy(k->track);
    }
    llmem_resource_destroy(k->os);
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

/* The options into k (*trace: --trace). 0, 2 for a bad option, -1 after
 * --help. */
static int parse_args(soak *k, int argc, char **argv, const char **trace)
{
    k->seconds = 30 * 60;
    k->warmup_s = -1;
    k->max_drift = 0.02;
    k->decay_ms = 1000;
    k->seed = 0x50a4;
    tool_args cl = {"soak", usage, argc, argv};
    while (tool_args_next(&cl)) {
        double d;
        uint32_t u;
        /* A value out of range falls through to the message below. */
        if (tool_args_help(&cl)) return -1;
        else if (tool_args_take(&cl, "--minutes") && tool_parse_double(cl.val, 0.01, 1e6, &d)) k->seconds = d * 60;
        else if (tool_args_take(&cl, "--seconds") && tool_parse_double(cl.val, 1, 1e8, &d)) k->seconds = d;
        else if (tool_args_take(&cl, "--warmup") && tool_parse_double(cl.val, 0, 1e8, &d)) k->warmup_s = d;
        else if (tool_args_take(&cl, "--max-drift") && tool_parse_double(cl.val, 0, 100, &d)) k->max_drift = d / 100;
        else if (tool_args_take(&cl, "--idle-decay-ms") && tool_parse_u32(cl.val, 10, 600000, &u)) k->decay_ms = u;
        else if (tool_args_take(&cl, "--seed") && tool_parse_u32(cl.val, 0, UINT32_MAX, &u)) k->seed = u;
        else if (tool_args_take(&cl, "--samples")) k->samples_path = cl.val;
        else if (tool_args_take(&cl, "--trace")) *trace = cl.val;
        else if (tool_args_is(&cl, "--progress")) k->progress = true;
        else {
            fprintf(stderr, "llmem soak: unknown, incomplete or out-of-range option '%s'\n", cl.opt);
            usage(stderr);
            return 2;
        }
    }
    if (k->warmup_s < 0) k->warmup_s = fmin(300, fmax(2, k->seconds / 10));
    if (k->warmup_s >= k->seconds) {
        fprintf(stderr, "llmem soak: the warm-up must be shorter than the run\n");
        return 2;
    }
    return 0;
}

/* The trace (given, or the shared one when present), the sample arrays
 * (resident from the start) and the samples file. 0 or the exit code
 * (the caller frees what was made either way); *trace_used names the
 * lengths' source. */
static int prepare(soak *k, const char *trace, const char **trace_used)
{
    int rc = 0;
    k->rng = mix(k->seed + 1) | 1;
    llmem_log_set(NULL, NULL, LLMEM_LOG_OFF);
    *trace_used = "built-in quantiles";
    if (trace) {
        rc = load_trace(k, trace, true);
        *trace_used = trace;
    } else {
        static const char *defaults[] = {"../shared/traces/AzureLLMInferenceTrace_code.csv",
                                         "shared/traces/AzureLLMInferenceTrace_code.csv"};
        for (size_t i = 0; i < 2 && !rc && !k->trace_n; i++) {
            rc = load_trace(k, defaults[i], false);
            if (k->trace_n) *trace_used = defaults[i];
        }
    }
    if (rc) return rc; /* the caller frees what was loaded */
    k->samples_cap = (size_t)k->seconds + 120;
    k->troughs_cap = (size_t)(k->seconds / (1.5 * k->decay_ms / 1000.0)) + 16;
    k->samples = calloc(k->samples_cap, sizeof *k->samples);
    k->troughs = calloc(k->troughs_cap, sizeof *k->troughs);
    if (!k->samples || !k->troughs) return 1;
    /* Make the sample arrays resident now, so that filling them over the
     * run does not count as drift. */
    touch_pages(k->samples, k->samples_cap * sizeof *k->samples);
    touch_pages(k->troughs, k->troughs_cap * sizeof *k->troughs);
    if (k->samples_path) {
        size_t n = strlen(k->samples_path);
        k->samples_json = n > 5 && !strcmp(k->samples_path + n - 5, ".json");
        if (llmem_outfile_open(k->samples_path, &k->samples_out)) {
            fprintf(stderr, "llmem soak: --samples: %s\n", llmem_error_message());
            return 2;
        }
        k->samples_file = llmem_outfile_stream(k->samples_out);
        fputs(k->samples_json ? "[\n" : "t_s,rss_bytes,committed_bytes,used_bytes,reserved_bytes,kv_bytes,sequences,phase\n",
              k->samples_file);
    }
    return 0;
}

/* RSS drift after the warm-up: the slope over the idle troughs (what the
 * verdict uses) and, for information, over the per-minute maxima. */
typedef struct drift_result {
    double mean, drift, trough_min, trough_max, peak_drift;
    bool valid;
    size_t troughs;
} drift_result;

static drift_result measure_drift(const soak *k, double duration)
{
    drift_result d;
    memset(&d, 0, sizeof d);
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

    d.mean = mean;
    d.drift = drift;
    d.trough_min = trough_min;
    d.trough_max = trough_max;
    d.peak_drift = peak_drift;
    d.valid = drift_valid;
    d.troughs = ntr;
    return d;
}

static void print_summary(const soak *k, double duration, const char *trace_used, const drift_result *d,
                          const llmem_sched_stats *ss, const llmem_sched_sim_stats *sims,
                          const llmem_controller_stats *cs, const llmem_pool_stats *ps, uint64_t pool_live,
                          size_t mappings, uint64_t check_failed, const char *status)
{
    printf("{\"command\":\"soak\",\"duration_s\":%.1f,\"seed\":%llu,\"trace\":\"%s\",\"samples\":%zu,\"warmup_s\":%.1f,"
           "\"troughs\":%zu,\"trough_rss_mean_bytes\":%.0f,\"trough_rss_min_bytes\":%.0f,\"trough_rss_max_bytes\":%.0f,"
           "\"drift\":%.5f,\"drift_pct\":%.3f,\"drift_valid\":%s,\"max_drift_pct\":%.2f,\"peak_drift_pct\":%.3f,"
           "\"rss_peak_bytes\":%zu,\"bursts\":%llu,\"idle_gaps_long\":%llu,\"idle_gaps_short\":%llu,"
           "\"requests_completed\":%llu,\"requests_admitted\":%llu,\"forks\":%llu,\"preemptions\":%llu,"
           "\"tokens\":%llu,\"steps\":%llu,\"kv_positions_verified\":%llu,\"controller_reserves\":%llu,\"controller_grows\":%llu,"
           "\"controller_shrinks\":%llu,\"controller_compactions\":%llu,\"controller_failures\":%llu,"
           "\"bytes_released\":%llu,\"manual_compactions\":%llu,\"bytes_moved\":%llu,\"pool_resource_calls\":%llu,"
           "\"corruptions\":%llu,\"pool_live_blocks\":%llu,\"leaked_mappings\":%zu,\"checks_failed\":%llu,"
           "\"status\":\"%s\"}\n",
           duration, (unsigned long long)k->seed, trace_used, k->nsamples, k->warmup_s, d->troughs, d->mean, d->trough_min,
           d->trough_max, d->drift, 100 * d->drift, d->valid ? "true" : "false", 100 * k->max_drift, 100 * d->peak_drift,
           k->rss_peak, (unsigned long long)k->bursts, (unsigned long long)k->gaps_long,
           (unsigned long long)k->gaps_short, (unsigned long long)k->requests_done,
           (unsigned long long)k->requests_admitted, (unsigned long long)ss->forks_total,
           (unsigned long long)ss->preemptions_total,
           (unsigned long long)(ss->step_prefill_tokens_total + ss->step_decode_tokens_total),
           (unsigned long long)ss->steps_total, (unsigned long long)sims->kv_positions_verified_total, (unsigned long long)cs->reserves_total, (unsigned long long)cs->grows_total,
           (unsigned long long)cs->shrinks_total, (unsigned long long)cs->compactions_total,
           (unsigned long long)cs->failures_total, (unsigned long long)cs->bytes_released_total,
           (unsigned long long)k->manual_compactions, (unsigned long long)(k->manual_moved + cs->bytes_compacted_total),
           (unsigned long long)ps->resource_calls_total, (unsigned long long)k->corruptions,
           (unsigned long long)pool_live, mappings, (unsigned long long)check_failed, status);
}

int llmem_cmd_soak(int argc, char **argv)
{
    soak *k = calloc(1, sizeof *k);
    if (!k) return 1;
    const char *trace = NULL, *trace_used = NULL;
    int rc = parse_args(k, argc, argv, &trace);
    if (!rc) rc = prepare(k, trace, &trace_used);
    if (rc) {
        free(k->trace_prompt);
        free(k->trace_gen);
        free(k->samples);
        free(k->troughs);
        free(k);
        return rc < 0 ? 0 : rc;
    }
    k->t0_ns = llmem_time_now_ns();
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
    llmem_sched_stats ss;
    llmem_sched_sim_stats sims;
    memset(&ss, 0, sizeof ss);
    memset(&sims, 0, sizeof sims);
    teardown(k, &pool_live, &mappings, &check_failed, &ss, &sims);
    bool samples_failed = false;
    if (k->samples_file) {
        if (k->samples_json) fputs("\n]\n", k->samples_file);
        k->samples_file = NULL;
        if (llmem_outfile_commit(k->samples_out)) {
            fprintf(stderr, "llmem soak: --samples: %s\n", llmem_error_message());
            samples_failed = true;
        }
    }
    drift_result d = measure_drift(k, duration);
    bool drift_ok = !d.valid || d.drift <= k->max_drift;
    bool leak_ok = mappings == 0 && pool_live == 0 && check_failed == 0;
    const char *status = k->error ? (k->corruptions ? "corruption" : "error") : !leak_ok ? "leak" : !drift_ok ? "drift" : "ok";
    print_summary(k, duration, trace_used, &d, &ss, &sims, &cs, &ps, pool_live, mappings, check_failed, status);
    rc = strcmp(status, "ok") || samples_failed ? 1 : 0;
    free(k->samples);
    free(k->troughs);
    free(k);
    return rc;
}
