/*
 * sched.c - the continuous-batching scheduler (llmem/sched.h): queue,
 * admission, chunked prefill, preemption, sampling, stop conditions,
 * stepping. Submission, cancellation and reads are in sched_requests.c,
 * the figures in sched_stats.c, the records below in sched_internal.h.
 * What it steps is a backend (sched_backend.h).
 *
 * Records. A request (sreq) holds n units, one per sample; a unit is what
 * is scheduled: one sequence of the backend. A unit knows `total` tokens
 * (prompt, then what it generated) of which `computed` are in its KV. A
 * step gives a running unit min(total - computed, budget left) tokens;
 * when computed reaches total the step's logits give it its next token
 * (total grows by one). Decode is the case total - computed = 1; a
 * recomputation after preemption is a prefill of every known token; both
 * produce the next token exactly as an unbroken run would.
 *
 * Lists. `run` holds admitted units in admission order (the victim of a
 * preemption is the last). `wq` is a deque of waiting units: new requests
 * at the back, preempted units (swapped or to recompute) at the front. A
 * request with n > 1 queues its leader only; the followers wait for the
 * leader's prompt (fork_wait) with their slots reserved from its admission.
 * A unit is in at most one of run, wq or neither (followers, finished).
 *
 * Slots: run + swapped units + reserved follower slots <= max_batch (an
 * engine's swapped sequence keeps its slot).
 *
 * Locks: step_mu serialises everything that drives the backend (steps,
 * advance, cancellation and release of admitted units); mu guards every
 * record, list and counter. Order: step_mu, then mu. The backend's step
 * runs with step_mu alone, so submissions, reads and waits go on meanwhile.
 * Events are queued under mu and delivered after it is released (step_mu
 * still held, `owner` = the stepping thread, so a callback's cancel does not
 * wait for itself).
 *
 * Invariants (checked in tests through the public figures): a unit holds a
 * backend sequence iff it is in run or SWAPPED; computed <= total <= cap;
 * visible <= out_len <= generated; a finished request's units are all
 * FINISHED and hold nothing.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llmem/sampler.h"
#include "llmem/sched.h"

#include "../core/hash.h"
#include "../core/internal.h"
#include "sched_internal.h"

/* vLLM's bucket bounds (so dashboards built for it read ours), with finer
 * ones below where a small CPU model lives. */
static const double ttft_le[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                 0.75,   1.0,   2.5,    5.0,   7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double tpot_le[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
                                 0.15,   0.2,     0.3,    0.4,   0.5,    0.75,  1.0,  2.5,   5.0,  7.5,   10.0,
                                 20.0,   40.0,    80.0};
static const double e2e_le[] = {0.01, 0.025, 0.05, 0.1,  0.3,  0.5,  0.8,   1.0,   1.5,   2.0,   2.5,   5.0,
                                10.0, 15.0,  20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

/* ---- names, defaults ------------------------------------------------------------ */

const char *llmem_sched_state_name(llmem_sched_state s)
{
    static const char *const n[] = {"waiting", "prefill", "decode", "swapped", "finished"};
    return (unsigned)s < LLMEM_ARRAY_LEN(n) ? n[s] : "?";
}

const char *llmem_sched_finish_name(llmem_sched_finish f)
{
    static const char *const n[] = {"none", "length", "stop", "context", "memory", "cancelled", "rejected", "error"};
    return (unsigned)f < LLMEM_ARRAY_LEN(n) ? n[f] : "?";
}

llmem_sched_options llmem_sched_options_default(void)
{
    llmem_sched_options o;
    memset(&o, 0, sizeof o);
    return o;
}

llmem_sched_params llmem_sched_params_default(void)
{
    llmem_sched_params p;
    memset(&p, 0, sizeof p);
    p.n = 1;
    return p;
}

/* ---- small helpers (mu held) ---------------------------------------------------- */

static void emit(llmem_sched *s, llmem_sched_event_kind k, const unit *u, int32_t tok, uint32_t index)
{
    if (!s->o.on_event) return;
    if (s->eb.n == s->eb.cap) return; /* sized for the worst step at creation; never reached */
    llmem_sched_event *e = &s->eb.ev[s->eb.n++];
    memset(e, 0, sizeof *e);
    e->kind = k;
    e->req = u->r->id;
    e->sample = u->idx;
    e->token = tok;
    e->index = index;
    e->finish = u->finish;
    e->swapped = u->state == LLMEM_SCHED_SWAPPED;
    e->user = u->r->user;
}

static void hist_observe(hist *h, double v)
{
    uint32_t i = 0;
    while (i < h->nb && v > h->le[i]) i++;
    if (i < h->nb) h->counts[i]++;
    h->count++;
    h->sum += v;
}

/* Room in the deque for `units` units at once (every unit not finished
 * may be queued at the same time). */
void llmem__sched_wq_grow(llmem_sched *s, size_t units, bool *ok)
{
    *ok = true;
    if (units <= s->wq_cap) return;
    size_t ncap = s->wq_cap ? s->wq_cap * 2 : 64;
    while (ncap < units) ncap *= 2;
    unit **n = malloc(ncap * sizeof *n);
    if (!n) {
        *ok = false;
        return;
    }
    for (size_t i = 0; i < s->wq_len; i++) n[i] = s->wq[(s->wq_head + i) % s->wq_cap];
    free(s->wq);
    s->wq = n;
    s->wq_head = 0;
    s->wq_cap = ncap;
}

/* Room for the pushes is made at submission (a slot for every unit not
 * finished), so these never allocate. */
void llmem__sched_wq_push_back(llmem_sched *s, unit *u)
{
    s->wq[(s->wq_head + s->wq_len) % s->wq_cap] = u;
    s->wq_len++;
    u->queued = true;
}

static void wq_push_front(llmem_sched *s, unit *u)
{
    s->wq_head = (s->wq_head + s->wq_cap - 1) % s->wq_cap;
    s->wq[s->wq_head] = u;
    s->wq_len++;
    u->queued = true;
}

static unit *wq_front(const llmem_sched *s) { return s->wq_len ? s->wq[s->wq_head] : NULL; }

static void wq_pop_front(llmem_sched *s)
{
    s->wq[s->wq_head]->queued = false;
    s->wq_head = (s->wq_head + 1) % s->wq_cap;
    s->wq_len--;
}

static void wq_remove(llmem_sched *s, unit *u)
{
    size_t j = 0;
    for (size_t i = 0; i < s->wq_len; i++) {
        unit *x = s->wq[(s->wq_head + i) % s->wq_cap];
        if (x != u) s->wq[(s->wq_head + j++) % s->wq_cap] = x;
    }
    s->wq_len = j;
    u->queued = false;
}

static void run_remove(llmem_sched *s, unit *u)
{
    for (uint32_t i = 0; i < s->nrun; i++)
        if (s->run[i] == u) {
            memmove(&s->run[i], &s->run[i + 1], (s->nrun - i - 1) * sizeof *s->run);
            s->nrun--;
            break;
        }
    u->in_run = false;
}

static void run_add(llmem_sched *s, unit *u)
{
    s->run[s->nrun++] = u;
    u->in_run = true;
    u->admit_order = ++s->admit_seq;
}

sreq *llmem__sched_lookup(const llmem_sched *s, llmem_sched_req id)
{
    uint32_t idx = (uint32_t)(id & 0xffffffffu);
    if (!idx || idx > s->nreq_cap) return NULL;
    sreq *r = s->reqs[idx - 1];
    if (!r || r->id != id) return NULL;
    return r;
}

static void release_slots(llmem_sched *s, sreq *r)
{
    if (r->slots_reserved) {
        s->reserved -= r->followers_waiting;
        r->slots_reserved = false;
    }
}

/* Let go of a unit's sequence (backend; step_mu held). */
static void drop_seq(llmem_sched *s, unit *u)
{
    if (u->seq) s->b.ops->seq_free(s->b.self, u->seq);
    if (u->state == LLMEM_SCHED_SWAPPED && s->nswapped) s->nswapped--;
    u->seq = 0;
}

static void request_done(llmem_sched *s, sreq *r)
{
    r->finish_ns = llmem__sched_now(s);
    s->pending--;
    s->st.requests_finished_total++;
    hist_observe(&s->h[LLMEM_SCHED_HIST_E2E], (double)(r->finish_ns - r->arrival_ns) * 1e-9);
}

/* Readable tokens up to v: TOKEN events for the new ones. */
static void reveal(llmem_sched *s, unit *u, uint32_t v)
{
    while (u->visible < v) {
        emit(s, LLMEM_SCHED_EV_TOKEN, u, u->tok[u->r->prompt_len + u->visible], u->visible);
        u->visible++;
    }
    u->r->progress++;
}

/* End a unit (anywhere but in the middle of the backend's step): its
 * sequence goes, it leaves every list. */
void llmem__sched_finish_unit(llmem_sched *s, unit *u, llmem_sched_finish why)
{
    if (u->state == LLMEM_SCHED_FINISHED) return;
    sreq *r = u->r;
    if (u->in_run) run_remove(s, u);
    if (u->queued) {
        wq_remove(s, u);
        if (u->idx == 0 && !r->scheduled_ns && s->waiting_reqs) s->waiting_reqs--;
    }
    if (u->fork_wait) {
        u->fork_wait = false;
        r->followers_waiting--;
        if (r->slots_reserved) s->reserved--;
    }
    drop_seq(s, u);
    if (why != LLMEM_SCHED_FINISH_STOP && why != LLMEM_SCHED_FINISH_CANCELLED) u->out_len = u->generated;
    if (why == LLMEM_SCHED_FINISH_CANCELLED && u->out_len > u->visible) u->out_len = u->visible;
    if (why != LLMEM_SCHED_FINISH_CANCELLED) reveal(s, u, u->out_len);
    u->state = LLMEM_SCHED_FINISHED;
    s->live_units--;
    u->finish = why;
    u->finish_ns = llmem__sched_now(s);
    llmem_sampler_destroy(u->sampler);
    u->sampler = NULL;
    switch (why) {
    case LLMEM_SCHED_FINISH_LENGTH: s->st.samples_length_total++; break;
    case LLMEM_SCHED_FINISH_STOP: s->st.samples_stop_total++; break;
    case LLMEM_SCHED_FINISH_CONTEXT: s->st.samples_context_total++; break;
    case LLMEM_SCHED_FINISH_MEMORY: s->st.samples_memory_total++; break;
    default: break;
    }
    emit(s, LLMEM_SCHED_EV_FINISH, u, 0, 0);
    r->progress++;
    /* A leader that ends before its prompt is done takes its followers
     * along (they would have forked from it). */
    if (u->idx == 0 && r->followers_waiting)
        for (uint32_t i = 1; i < r->n; i++)
            if (r->u[i].fork_wait) llmem__sched_finish_unit(s, &r->u[i], why);
    if (--r->unfinished == 0) {
        release_slots(s, r);
        if (why == LLMEM_SCHED_FINISH_REJECTED) s->st.requests_rejected_total++;
        request_done(s, r);
    }
}

/* ---- stop conditions and sampling ------------------------------------------------ */

/* Does the output end with `seq`? */
static bool ends_with(const unit *u, const int32_t *seq, uint32_t len)
{
    if (len == 0 || len > u->generated) return false;
    const int32_t *out = u->tok + u->r->prompt_len;
    return memcmp(out + u->generated - len, seq, len * sizeof *seq) == 0;
}

/* The longest k < a stop sequence's length such that the output's last k
 * tokens begin it: those are held back. */
static uint32_t held_back(const unit *u)
{
    const sreq *r = u->r;
    const int32_t *out = u->tok + r->prompt_len;
    uint32_t best = 0;
    for (uint32_t j = 0; j < r->nstop_seq; j++)
        for (uint32_t k = r->stop_len[j] - 1; k > best; k--)
            if (k <= u->generated && !memcmp(out + u->generated - k, r->stop_seq[j], k * sizeof *out)) {
                best = k;
                break;
            }
    return best;
}

/* A new token for u (mu held; after its step). */
static void take_token(llmem_sched *s, unit *u, int32_t tok)
{
    sreq *r = u->r;
    uint64_t t = llmem__sched_now(s);
    u->tok[u->total++] = tok;
    u->generated++;
    s->st.generation_tokens_total++;
    if (u->generated == 1) {
        u->first_token_ns = t;
        hist_observe(&s->h[LLMEM_SCHED_HIST_TTFT], (double)(t - r->arrival_ns) * 1e-9);
    } else {
        hist_observe(&s->h[LLMEM_SCHED_HIST_TPOT], (double)(t - u->last_token_ns) * 1e-9);
    }
    u->last_token_ns = t;
    for (uint32_t i = 0; i < r->nstop_tok; i++)
        if (tok == r->stop_tok[i]) {
            u->out_len = u->generated - 1;
            llmem__sched_finish_unit(s, u, LLMEM_SCHED_FINISH_STOP);
            return;
        }
    for (uint32_t j = 0; j < r->nstop_seq; j++)
        if (ends_with(u, r->stop_seq[j], r->stop_len[j])) {
            u->out_len = u->generated - r->stop_len[j];
            llmem__sched_finish_unit(s, u, LLMEM_SCHED_FINISH_STOP);
            return;
        }
    u->out_len = u->generated;
    if (r->want && u->generated >= r->want) {
        llmem__sched_finish_unit(s, u, LLMEM_SCHED_FINISH_LENGTH);
        return;
    }
    if (u->total >= s->max_len || u->generated >= r->max_tokens) {
        llmem__sched_finish_unit(s, u, LLMEM_SCHED_FINISH_CONTEXT);
        return;
    }
    reveal(s, u, u->generated - held_back(u));
}

/* The next token from logits (modified), or a synthetic one. */
static int32_t pick(llmem_sched *s, unit *u, float *logits)
{
    if (!logits) {
        uint64_t h =
            llmem__mix64(u->r->serial * 0x9e3779b97f4a7c15ull + (uint64_t)u->idx * 0x100000001b3ull + u->total);
        return (int32_t)(h % s->b.vocab);
    }
    return u->sampler ? llmem_sampler_sample(u->sampler, logits) : llmem_logits_argmax(logits, s->b.vocab);
}

/* ---- admission ------------------------------------------------------------------- */

/* Tokens (non-PAGED) or blocks (PAGED) the KV can still give, and what a
 * unit that must hold `tokens` more (after `held`) needs, in the same unit. */
typedef struct room {
    bool unlimited, paged, prefix;
    size_t free;      /* blocks or tokens */
    size_t B;
    size_t unit_bytes; /* bytes per block (PAGED) or token */
} room;

static room kv_room(const llmem_sched *s)
{
    room rm = {true, false, false, 0, 1, 1};
    if (!s->b.kv) return rm;
    llmem_kv_room kr;
    if (llmem_kv_get_room(s->b.kv, &kr)) return rm;
    rm.paged = kr.strategy == LLMEM_KV_PAGED;
    rm.prefix = kr.prefix_cache;
    rm.B = kr.block_tokens ? kr.block_tokens : 1;
    rm.unit_bytes = rm.paged ? kr.block_bytes_all_layers : kr.block_bytes_all_layers / rm.B;
    /* STATIC reserves at creation (which refuses by itself) and BUCKETS
     * holds idle buffers it reuses, which its reserved bytes count: the
     * attempt itself is the only honest test there (a refused step lets the
     * fresh admissions go first, uncounted). */
    if (!kr.budget_bytes || kr.strategy == LLMEM_KV_STATIC || kr.strategy == LLMEM_KV_BUCKETS) return rm;
    rm.unlimited = false;
    size_t left = kr.budget_bytes > kr.reserved_bytes ? kr.budget_bytes - kr.reserved_bytes : 0;
    rm.free = left / (rm.unit_bytes ? rm.unit_bytes : 1);
    if (rm.paged) rm.free += kr.free_blocks + kr.cached_blocks;
    return rm;
}

static size_t need_of(const room *rm, size_t held, size_t target)
{
    if (target <= held) return 0;
    if (!rm->paged) return target - held;
    return (target + rm->B - 1) / rm->B - (held + rm->B - 1) / rm->B;
}

/* Would the KV hold `need` more, with the running units' pending prompt
 * chunks and the headroom? */
static bool fits(llmem_sched *s, const room *rm, size_t need, uint32_t prompt_tokens)
{
    if (rm->unlimited) return true;
    size_t pending = 0;
    for (uint32_t i = 0; i < s->nrun; i++) pending += need_of(rm, s->run[i]->computed, s->run[i]->total);
    size_t head = (size_t)s->o.headroom_blocks * (s->nrun + 1) * (rm->paged ? 1 : rm->B);
    if (pending + need + head > rm->free) return false;
    if (s->o.predictor) {
        llmem_prediction pr;
        uint32_t chunk = prompt_tokens < s->max_step ? prompt_tokens : s->max_step;
        if (!llmem_predictor_predict(s->o.predictor, LLMEM_STAGE_PREFILL, s->nrun + 1, chunk ? chunk : 1, 0, &pr) &&
            (double)(pending + need + head) * (double)rm->unit_bytes + (double)pr.reserve_bytes >
                (double)rm->free * (double)rm->unit_bytes)
            return false;
    }
    return true;
}

static void add_item(llmem_sched *s, size_t *ni, unit *u, uint32_t *budget)
{
    uint32_t need = u->total - u->computed;
    uint32_t take = need < *budget ? need : *budget;
    if (!take) return;
    llmem__sched_item *it = &s->items[*ni];
    it->seq = u->seq;
    it->tokens = u->tok + u->computed;
    it->n = take;
    it->cache_end = u->r->cache_limit;
    it->context = u->computed;
    s->item_unit[(*ni)++] = u;
    *budget -= take;
}

/* The first try, and when alone (nothing else holds KV, so nothing else
 * can be preempted) a second one at once: a transient refusal passes. */
static llmem_status swap_in_retry(llmem_sched *s, unit *u, bool alone)
{
    llmem_status st = s->b.ops->swap_in(s->b.self, u->seq);
    if (st == LLMEM_ENOMEM && alone) st = s->b.ops->swap_in(s->b.self, u->seq);
    return st;
}

static llmem_status create_retry(llmem_sched *s, bool alone, uint64_t *seq)
{
    llmem_status st = s->b.ops->seq_create(s->b.self, seq);
    if ((st == LLMEM_ENOMEM || st == LLMEM_ECAPACITY) && alone) st = s->b.ops->seq_create(s->b.self, seq);
    return st;
}

/* Try to admit the queue's head: swapped back in, or a new sequence with
 * its cached prefix. 1 admitted, 0 not now (stop admitting), -1 it was
 * finished (rejected: go on with the next). */
static int admit_head(llmem_sched *s, unit *u, bool alone)
{
    sreq *r = u->r;
    room rm = kv_room(s);
    if (u->state == LLMEM_SCHED_SWAPPED) {
        if (!alone && !fits(s, &rm, need_of(&rm, 0, u->computed), 0)) return 0;
        llmem_status st = swap_in_retry(s, u, alone);
        if (st == LLMEM_OK) {
            wq_pop_front(s);
            s->nswapped--;
            u->state = u->total - u->computed > 1 ? LLMEM_SCHED_PREFILL : LLMEM_SCHED_DECODE;
            run_add(s, u);
            s->st.swap_ins_total++;
            emit(s, LLMEM_SCHED_EV_RESUME, u, 0, 0);
            return 1;
        }
        if (!alone) return 0;
        /* Alone and refused twice: recompute it instead. */
        drop_seq(s, u);
        u->state = LLMEM_SCHED_WAITING;
        u->computed = 0;
    }
    uint32_t need_slots = 1 + (u->idx == 0 && !r->slots_reserved ? r->followers_waiting : 0);
    if (s->nrun + s->nswapped + s->reserved + need_slots > s->max_batch) return 0;
    /* Not even with the longest possible prefix match: do not create a
     * sequence only to free it. */
    size_t best = rm.prefix ? (u->total - 1) / rm.B * rm.B : 0;
    if (!alone && !fits(s, &rm, need_of(&rm, best, u->total), u->total - (uint32_t)best)) return 0;
    uint64_t seq = 0;
    llmem_status st = create_retry(s, alone, &seq);
    size_t matched = 0;
    if (!st && s->b.ops->match_prefix) {
        size_t look = u->total - 1; /* the last known token is always computed: its logits are needed */
        st = s->b.ops->match_prefix(s->b.self, seq, u->tok, look, &matched);
        if (st) s->b.ops->seq_free(s->b.self, seq);
    }
    if (!st && !alone && !fits(s, &rm, need_of(&rm, matched, u->total), u->total - (uint32_t)matched)) {
        s->b.ops->seq_free(s->b.self, seq);
        return 0;
    }
    if (st) {
        if (st != LLMEM_ENOMEM && st != LLMEM_ECAPACITY) return 0; /* not now; the step reports nothing */
        s->st.admissions_refused_total++;
        if (!alone) return 0;
        llmem__sched_finish_unit(s, u, u->generated ? LLMEM_SCHED_FINISH_MEMORY : LLMEM_SCHED_FINISH_REJECTED);
        return -1;
    }
    wq_pop_front(s);
    if (u->idx == 0 && !r->scheduled_ns && s->waiting_reqs) s->waiting_reqs--;
    u->seq = seq;
    u->computed = (uint32_t)matched;
    u->matched = (uint32_t)matched;
    u->fresh = true;
    u->state = LLMEM_SCHED_PREFILL;
    run_add(s, u);
    if (need_slots > 1) {
        s->reserved += r->followers_waiting;
        r->slots_reserved = true;
    }
    if (!r->scheduled_ns) {
        r->scheduled_ns = llmem__sched_now(s);
        hist_observe(&s->h[LLMEM_SCHED_HIST_QUEUE], (double)(r->scheduled_ns - r->arrival_ns) * 1e-9);
    }
    return 1;
}

/* A fresh unit's step ran: it is in (mu held). */
static void admitted(llmem_sched *s, unit *u)
{
    sreq *r = u->r;
    u->fresh = false;
    if (!r->prompt_counted && u->idx == 0) {
        r->prompt_counted = true;
        r->cached_tokens = u->matched;
        s->st.prompt_tokens_total += r->prompt_len;
    }
    if (s->b.ops->match_prefix) {
        s->st.prefix_cache_queries_total += u->total;
        s->st.prefix_cache_hits_total += u->matched;
        if (u->matched) s->st.prefix_cache_requests_hit_total++;
    }
    emit(s, LLMEM_SCHED_EV_ADMIT, u, 0, 0);
}

/* When nothing runs and the head cannot have a slot because swapped
 * sequences hold them, bring the first swapped one forward (it needs no
 * slot). True if one was moved. */
static bool promote_swapped(llmem_sched *s)
{
    for (size_t i = 1; i < s->wq_len; i++) {
        unit *x = s->wq[(s->wq_head + i) % s->wq_cap];
        if (x->state != LLMEM_SCHED_SWAPPED) continue;
        wq_remove(s, x);
        wq_push_front(s, x);
        return true;
    }
    return false;
}

/* Preempt the most recently admitted running unit: swap it out, or free it
 * for recomputation; it waits at the queue's head. */
static void preempt_last(llmem_sched *s)
{
    unit *v = s->run[s->nrun - 1];
    run_remove(s, v);
    if (v->fresh) {
        /* Admitted for this very step: not admitted after all (no event, no
         * preemption: it computed nothing). */
        drop_seq(s, v);
        v->fresh = false;
        v->state = LLMEM_SCHED_WAITING;
        v->computed = 0;
        release_slots(s, v->r);
        wq_push_front(s, v);
        return;
    }
    bool swapped = false;
    if (s->o.preempt != LLMEM_SCHED_PREEMPT_RECOMPUTE && s->b.can_swap && v->computed > 0 &&
        s->b.ops->swap_out(s->b.self, v->seq) == LLMEM_OK) {
        swapped = true;
        v->state = LLMEM_SCHED_SWAPPED;
        s->nswapped++;
        v->swaps++;
        s->st.preemptions_swap_total++;
    } else {
        drop_seq(s, v);
        v->state = LLMEM_SCHED_WAITING;
        v->computed = 0;
    }
    (void)swapped;
    v->preemptions++;
    s->st.preemptions_total++;
    release_slots(s, v->r);
    wq_push_front(s, v);
    emit(s, LLMEM_SCHED_EV_PREEMPT, v, 0, 0);
}

/* ---- creation ---------------------------------------------------------------------- */

llmem_status llmem__sched_create(const llmem__sched_backend *b, const llmem_sched_options *opts, llmem_sched **out)
{
    llmem_sched_options o = opts ? *opts : llmem_sched_options_default();
    if ((unsigned)o.preempt > LLMEM_SCHED_PREEMPT_SWAP) {
        b->ops->destroy(b->self);
        return llmem__fail(LLMEM_EINVAL, "sched: unknown preemption mode %d", (int)o.preempt);
    }
    llmem_sched *s = calloc(1, sizeof *s);
    if (!s) {
        b->ops->destroy(b->self);
        return llmem__fail(LLMEM_ENOMEM, "sched: no memory");
    }
    s->b = *b;
    s->o = o;
    s->sim = b->ops == &llmem__sched_sim_ops;
    s->max_batch = o.max_batch ? o.max_batch : b->max_seqs ? b->max_seqs : 256;
    if (b->max_seqs && s->max_batch > b->max_seqs) s->max_batch = b->max_seqs;
    s->max_step = o.max_step_tokens ? o.max_step_tokens : b->max_step_tokens ? b->max_step_tokens : 8192;
    if (b->max_step_tokens && s->max_step > b->max_step_tokens) s->max_step = b->max_step_tokens;
    if (s->max_step < s->max_batch && b->max_step_tokens) s->max_batch = s->max_step; /* a token each */
    s->max_len = b->max_seq_len;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->step_mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->run = calloc(s->max_batch, sizeof *s->run);
    s->items = calloc(s->max_batch, sizeof *s->items);
    s->item_unit = calloc(s->max_batch, sizeof *s->item_unit);
    s->eb.cap = (size_t)s->max_batch * (8 + MAX_STOP_LEN) + 64;
    s->eb.ev = o.on_event ? calloc(s->eb.cap, sizeof *s->eb.ev) : NULL;
    if (b->ops->logits) {
        s->keep = malloc((size_t)b->vocab * sizeof(float));
        s->tmp = malloc((size_t)b->vocab * sizeof(float));
    }
    bool ok = true;
    llmem__sched_wq_grow(s, 64, &ok);
    if (!s->run || !s->items || !s->item_unit || (o.on_event && !s->eb.ev) || (b->ops->logits && (!s->keep || !s->tmp)) ||
        !ok) {
        llmem_sched_destroy(s);
        return llmem__fail(LLMEM_ENOMEM, "sched: no memory for its tables");
    }
    const double *le[LLMEM_SCHED_HIST_COUNT_] = {ttft_le, tpot_le, e2e_le, ttft_le};
    uint32_t nb[LLMEM_SCHED_HIST_COUNT_] = {LLMEM_ARRAY_LEN(ttft_le), LLMEM_ARRAY_LEN(tpot_le), LLMEM_ARRAY_LEN(e2e_le),
                                            LLMEM_ARRAY_LEN(ttft_le)};
    for (int i = 0; i < LLMEM_SCHED_HIST_COUNT_; i++) {
        s->h[i].le = le[i];
        s->h[i].nb = nb[i];
    }
    *out = s;
    return LLMEM_OK;
}

llmem_status llmem_sched_create_engine(llmem_engine *e, const llmem_sched_options *o, llmem_sched **out)
{
    if (!e || !out) return llmem__fail(LLMEM_EINVAL, "sched create: null argument");
    *out = NULL;
    llmem__sched_backend b;
    llmem_status st = llmem__sched_engine_backend(e, &b);
    if (st) return st;
    return llmem__sched_create(&b, o, out);
}

llmem_status llmem_sched_create_sim(const llmem_sched_sim_options *so, const llmem_sched_options *o, llmem_sched **out)
{
    if (!so || !out) return llmem__fail(LLMEM_EINVAL, "sched create sim: null argument");
    *out = NULL;
    llmem__sched_backend b;
    llmem_status st = llmem__sched_sim_backend(so, &b);
    if (st) return st;
    return llmem__sched_create(&b, o, out);
}

void llmem_sched_destroy(llmem_sched *s)
{
    if (!s) return;
    for (uint32_t i = 0; i < s->nreq_cap; i++) {
        sreq *r = s->reqs[i];
        if (!r) continue;
        for (uint32_t k = 0; k < r->n; k++)
            if (r->u[k].seq) s->b.ops->seq_free(s->b.self, r->u[k].seq);
        llmem__sched_free_req(r);
    }
    s->b.ops->destroy(s->b.self);
    free(s->reqs);
    free(s->req_gen);
    free(s->free_slots);
    free(s->run);
    free(s->wq);
    free(s->items);
    free(s->item_unit);
    free(s->keep);
    free(s->tmp);
    free(s->eb.ev);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->step_mu);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* ---- stepping -------------------------------------------------------------------------------- */

static void deliver(llmem_sched *s)
{
    /* mu not held, step_mu held. A callback may cancel or release (we are
     * the owner); a TOKEN callback's true stops that sample: its FINISH is
     * queued behind and delivered in this loop, its later TOKEN events of
     * this step are not. */
    enum { STOPPED_MAX = 64 };
    struct { llmem_sched_req req; uint32_t sample; } stopped[STOPPED_MAX];
    size_t nstopped = 0;
    for (size_t i = 0; i < s->eb.n; i++) {
        llmem_sched_event ev = s->eb.ev[i];
        bool skip = false;
        if (ev.kind == LLMEM_SCHED_EV_TOKEN)
            for (size_t k = 0; k < nstopped; k++)
                if (stopped[k].req == ev.req && stopped[k].sample == ev.sample) skip = true;
        pthread_mutex_lock(&s->mu);
        if (!llmem__sched_lookup(s, ev.req)) skip = true; /* released by an earlier callback */
        pthread_mutex_unlock(&s->mu);
        if (skip) continue;
        bool stop = s->o.on_event(s->o.event_ctx, &ev);
        if (!stop || ev.kind != LLMEM_SCHED_EV_TOKEN) continue;
        pthread_mutex_lock(&s->mu);
        sreq *r = llmem__sched_lookup(s, ev.req);
        if (r && ev.sample < r->n && r->u[ev.sample].state != LLMEM_SCHED_FINISHED) {
            unit *u = &r->u[ev.sample];
            u->out_len = ev.index + 1;
            if (u->visible > u->out_len) u->visible = u->out_len;
            llmem__sched_finish_unit(s, u, LLMEM_SCHED_FINISH_STOP);
            pthread_cond_broadcast(&s->cv);
            if (nstopped < STOPPED_MAX) {
                stopped[nstopped].req = ev.req;
                stopped[nstopped++].sample = ev.sample;
            }
        }
        pthread_mutex_unlock(&s->mu);
    }
    s->eb.n = 0;
}

static void report_stage(llmem_sched *s, llmem_stage st, uint32_t batch, uint64_t tokens)
{
    if (!s->o.controller || s->b.ops->reports_stages) return;
    llmem_stage_event ev = {st, batch, tokens, llmem__sched_now(s)};
    llmem_controller_on_stage(s->o.controller, &ev);
}

static void go_idle(llmem_sched *s)
{
    if (!s->idle_reported) {
        s->idle_reported = true;
        if (s->b.ops->set_idle) s->b.ops->set_idle(s->b.self);
        report_stage(s, LLMEM_STAGE_IDLE, 0, 0);
    }
    if (s->o.controller) llmem_controller_tick(s->o.controller);
}

/* The step's plan: running units, then admissions (mu held). */
static size_t plan(llmem_sched *s, llmem_sched_step_report *rep)
{
    size_t ni = 0;
    uint32_t budget = s->max_step;
    for (uint32_t i = 0; i < s->nrun && budget; i++) add_item(s, &ni, s->run[i], &budget);
    uint32_t rejected = 0;
    bool promoted = false;
    while (budget && s->wq_len && rejected < s->max_batch) {
        unit *u = wq_front(s);
        bool alone = s->nrun == 0;
        int a = admit_head(s, u, alone);
        if (a < 0) {
            rejected++;
            continue;
        }
        if (a == 0) {
            if (alone && !promoted && s->nswapped && (promoted = promote_swapped(s))) continue;
            break;
        }
        rep->admitted++;
        add_item(s, &ni, u, &budget);
    }
    return ni;
}

/* Drop unit u's item from the plan. */
static void unplan(llmem_sched *s, size_t *ni, const unit *u)
{
    for (size_t i = 0; i < *ni; i++)
        if (s->item_unit[i] == u) {
            memmove(&s->items[i], &s->items[i + 1], (*ni - i - 1) * sizeof *s->items);
            memmove(&s->item_unit[i], &s->item_unit[i + 1], (*ni - i - 1) * sizeof *s->item_unit);
            (*ni)--;
            return;
        }
}

/* The followers of r's leader u, whose prompt is in: a fork each, the
 * first token from the prompt's logits (kept in s->keep). */
static void fork_followers(llmem_sched *s, unit *u, bool have_logits, llmem_sched_step_report *rep)
{
    sreq *r = u->r;
    release_slots(s, r);
    for (uint32_t k = 1; k < r->n; k++) {
        unit *f = &r->u[k];
        if (!f->fork_wait) continue;
        f->fork_wait = false;
        r->followers_waiting--;
        uint64_t child = 0;
        llmem_status st = LLMEM_ENOTSUP;
        if (s->nrun + s->nswapped + s->reserved < s->max_batch && s->b.ops->fork)
            st = s->b.ops->fork(s->b.self, u->seq, &child);
        if (st != LLMEM_OK) {
            /* No fork (no slot, no memory, the malloc engine): it prefills
             * the prompt itself, from the queue's head. */
            f->state = LLMEM_SCHED_WAITING;
            wq_push_front(s, f);
            s->st.fork_fallbacks_total++;
            continue;
        }
        f->seq = child;
        f->computed = r->prompt_len;
        f->state = LLMEM_SCHED_DECODE;
        run_add(s, f);
        s->st.forks_total++;
        emit(s, LLMEM_SCHED_EV_ADMIT, f, 0, 0);
        float *fl = NULL;
        if (have_logits) {
            memcpy(s->tmp, s->keep, (size_t)s->b.vocab * sizeof *s->tmp);
            fl = s->tmp;
        }
        take_token(s, f, pick(s, f, fl));
        if (f->state == LLMEM_SCHED_FINISHED) rep->finished++;
    }
}

/* After a good step (mu held): advance, sample, fork. */
static void bookkeep(llmem_sched *s, size_t ni, llmem_sched_step_report *rep)
{
    for (size_t i = 0; i < ni; i++) {
        unit *u = s->item_unit[i];
        sreq *r = u->r;
        if (u->fresh) admitted(s, u);
        u->computed += s->items[i].n;
        r->computed_tokens += s->items[i].n;
        if (u->computed < u->total) continue; /* a prompt chunk: no token yet */
        float *lg = s->b.ops->logits ? s->b.ops->logits(s->b.self, i) : NULL;
        if (u->idx == 0 && r->followers_waiting && u->computed == r->prompt_len) {
            if (lg) memcpy(s->keep, lg, (size_t)s->b.vocab * sizeof *lg);
            fork_followers(s, u, lg != NULL, rep); /* before the leader's token: its KV is the prompt's */
        }
        u->state = LLMEM_SCHED_DECODE;
        take_token(s, u, pick(s, u, lg));
        if (u->state == LLMEM_SCHED_FINISHED) rep->finished++;
    }
}

llmem_status llmem_sched_step(llmem_sched *s, llmem_sched_step_report *rep)
{
    llmem_sched_step_report dummy;
    if (!rep) rep = &dummy;
    memset(rep, 0, sizeof *rep);
    if (!s) return llmem__fail(LLMEM_EINVAL, "sched step: null scheduler");
    pthread_mutex_lock(&s->step_mu);
    pthread_mutex_lock(&s->mu);
    s->owner = pthread_self();
    s->owned = true;
    llmem_status ret = LLMEM_OK;
    if (!s->nrun && !s->wq_len) {
        go_idle(s);
        goto done;
    }
    s->idle_reported = false;
    rep->start_ns = llmem__sched_now(s);
    size_t ni = plan(s, rep);
    if (!ni) goto done;
    uint64_t prefill = 0;
    uint32_t decode = 0;
    for (size_t i = 0; i < ni; i++) {
        if (s->items[i].n == 1 && s->items[i].context > 0) decode++;
        else prefill += s->items[i].n;
    }
    if (prefill) report_stage(s, LLMEM_STAGE_PREFILL, (uint32_t)ni, prefill + decode);
    else report_stage(s, LLMEM_STAGE_DECODE, (uint32_t)ni, decode);
    bool retried = false;
    for (;;) {
        pthread_mutex_unlock(&s->mu);
        double secs = 0;
        llmem_status st = s->b.ops->step(s->b.self, s->items, ni, &secs);
        pthread_mutex_lock(&s->mu);
        if (st == LLMEM_OK && s->o.check && s->b.kv) st = llmem_kv_check(s->b.kv);
        if (st == LLMEM_OK) {
            rep->seconds = secs;
            break;
        }
        if (st != LLMEM_ENOMEM) {
            for (size_t i = 0; i < ni; i++) llmem__sched_finish_unit(s, s->item_unit[i], LLMEM_SCHED_FINISH_ERROR);
            ni = 0;
            ret = st;
            break;
        }
        if (s->nrun > 1) {
            unit *v = s->run[s->nrun - 1];
            unplan(s, &ni, v);
            preempt_last(s);
            rep->preempted++;
            if (!ni) break;
            continue;
        }
        /* One unit runs, and the KV refused it: once more (a transient
         * refusal passes), then it ends. */
        if (!retried) {
            retried = true;
            continue;
        }
        unit *u = s->item_unit[0];
        llmem__sched_finish_unit(s, u, u->generated ? LLMEM_SCHED_FINISH_MEMORY : LLMEM_SCHED_FINISH_REJECTED);
        rep->finished++;
        ni = 0;
        break;
    }
    if (ni) {
        for (size_t i = 0; i < ni; i++) {
            double c = (double)s->items[i].context, m = s->items[i].n;
            rep->attn_pairs += m * c + m * (m + 1) / 2;
            if (s->items[i].n == 1 && s->items[i].context > 0) {
                rep->decode_tokens++;
                rep->decode_kv_tokens += c + 1;
            } else {
                rep->prefill_tokens += s->items[i].n;
            }
        }
        rep->sequences = (uint32_t)ni;
        rep->running = s->nrun;
        s->st.steps_total++;
        s->st.step_prefill_tokens_total += rep->prefill_tokens;
        s->st.step_decode_tokens_total += rep->decode_tokens;
        s->st.computed_tokens_total += rep->prefill_tokens;
        s->st.step_seconds_total += rep->seconds;
        s->st.busy_seconds_total += rep->seconds;
        if (s->o.on_step) {
            pthread_mutex_unlock(&s->mu);
            s->o.on_step(s->o.step_ctx, rep);
            pthread_mutex_lock(&s->mu);
        }
        bookkeep(s, ni, rep);
    }
done:
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->eb.n) deliver(s);
    pthread_mutex_lock(&s->mu);
    s->owned = false;
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_unlock(&s->step_mu);
    return ret;
}

llmem_status llmem_sched_advance(llmem_sched *s, uint64_t t_ns)
{
    if (!s) return llmem__fail(LLMEM_EINVAL, "sched advance: null scheduler");
    if (!s->b.ops->advance) return llmem__fail(LLMEM_ESTATE, "sched advance: not a simulation");
    pthread_mutex_lock(&s->step_mu);
    pthread_mutex_lock(&s->mu);
    llmem_status st = LLMEM_OK;
    if (s->nrun) {
        st = llmem__fail(LLMEM_ESTATE, "sched advance: %u sequences are running", s->nrun);
    } else {
        if (!s->idle_reported) {
            s->idle_reported = true;
            report_stage(s, LLMEM_STAGE_IDLE, 0, 0);
        }
        pthread_mutex_unlock(&s->mu);
        if (s->b.realtime) {
            /* Sleep in slices, ticking the controller as a server loop would. */
            for (uint64_t now = llmem__sched_now(s); now < t_ns && !st; now = llmem__sched_now(s)) {
                uint64_t to = t_ns - now > 20000000ull ? now + 20000000ull : t_ns;
                st = s->b.ops->advance(s->b.self, to);
                if (s->o.controller) llmem_controller_tick(s->o.controller);
            }
        } else {
            st = s->b.ops->advance(s->b.self, t_ns);
        }
        pthread_mutex_lock(&s->mu);
        if (s->o.controller) llmem_controller_tick(s->o.controller);
    }
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_unlock(&s->step_mu);
    return st;
}

