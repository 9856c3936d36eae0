/*
 * sched_requests.c - the scheduler's requests from the caller's side
 * (llmem/sched.h): submission (checked, copied, queued), cancellation and
 * release (KV freed before they return: they take the step lock unless the
 * caller is the stepping thread, inside an event callback), and reads and
 * waits for streaming. Every function here may be called from any thread.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/internal.h"
#include "sched_internal.h"

void llmem__sched_free_req(sreq *r)
{
    if (!r) return;
    for (uint32_t i = 0; r->u && i < r->n; i++) {
        free(r->u[i].tok);
        llmem_sampler_destroy(r->u[i].sampler);
    }
    free(r->u);
    free(r);
}

/* ---- submission --------------------------------------------------------------------- */

static llmem_status check_params(const llmem_sched *s, const llmem_sched_params *p, uint32_t n)
{
    if (!p->prompt || !p->prompt_len) return llmem__fail(LLMEM_EINVAL, "sched submit: no prompt");
    if (p->prompt_len > s->max_len)
        return llmem__fail(LLMEM_ERANGE, "sched submit: the prompt has %u tokens, the context holds %u",
                           p->prompt_len, s->max_len);
    for (uint32_t i = 0; i < p->prompt_len; i++)
        if (p->prompt[i] < 0 || (uint32_t)p->prompt[i] >= s->b.vocab)
            return llmem__fail(LLMEM_EINVAL, "sched submit: prompt token %u is %d, outside the vocabulary (%u)", i,
                               p->prompt[i], s->b.vocab);
    if (n > s->max_batch)
        return llmem__fail(LLMEM_ECAPACITY, "sched submit: n = %u samples, at most %u sequences run at once", n,
                           s->max_batch);
    if (!(p->temperature >= 0) || !isfinite(p->temperature) || !(p->top_p >= 0 && p->top_p <= 1))
        return llmem__fail(LLMEM_EINVAL, "sched submit: temperature %g or top_p %g out of range", p->temperature,
                           p->top_p);
    if (p->stop_token_count > MAX_STOPS || p->stop_seq_count > MAX_STOPS)
        return llmem__fail(LLMEM_EINVAL, "sched submit: at most %u stop tokens and %u stop sequences", MAX_STOPS,
                           MAX_STOPS);
    if ((p->stop_token_count && !p->stop_tokens) || (p->stop_seq_count && (!p->stop_seqs || !p->stop_seq_lens)))
        return llmem__fail(LLMEM_EINVAL, "sched submit: stop counts without their arrays");
    for (uint32_t j = 0; j < p->stop_seq_count; j++)
        if (!p->stop_seqs[j] || !p->stop_seq_lens[j] || p->stop_seq_lens[j] > MAX_STOP_LEN)
            return llmem__fail(LLMEM_EINVAL, "sched submit: stop sequence %u is empty or longer than %u tokens", j,
                               MAX_STOP_LEN);
    return LLMEM_OK;
}

static llmem_status build_req(llmem_sched *s, const llmem_sched_params *p, uint32_t n, sreq **out)
{
    sreq *r = calloc(1, sizeof *r);
    if (!r) return llmem__fail(LLMEM_ENOMEM, "sched submit: no memory");
    r->n = n;
    r->prompt_len = p->prompt_len;
    uint32_t left = s->max_len > p->prompt_len ? s->max_len - p->prompt_len : 1;
    r->max_tokens = p->max_tokens && p->max_tokens < left ? p->max_tokens : left; /* the output's room */
    r->want = p->max_tokens;
    r->cache_limit = p->cache_limit;
    r->nstop_tok = p->stop_token_count;
    if (r->nstop_tok) memcpy(r->stop_tok, p->stop_tokens, r->nstop_tok * sizeof *r->stop_tok);
    r->nstop_seq = p->stop_seq_count;
    for (uint32_t j = 0; j < r->nstop_seq; j++) {
        r->stop_len[j] = p->stop_seq_lens[j];
        memcpy(r->stop_seq[j], p->stop_seqs[j], r->stop_len[j] * sizeof(int32_t));
    }
    r->user = p->user;
    r->unfinished = n;
    r->u = calloc(n, sizeof *r->u);
    if (!r->u) goto nomem;
    for (uint32_t i = 0; i < n; i++) {
        unit *u = &r->u[i];
        u->r = r;
        u->idx = i;
        u->cap = r->prompt_len + r->max_tokens;
        u->tok = malloc((size_t)u->cap * sizeof *u->tok);
        if (!u->tok) goto nomem;
        memcpy(u->tok, p->prompt, (size_t)r->prompt_len * sizeof *u->tok);
        u->total = r->prompt_len;
        if (p->temperature > 0 && s->b.ops->logits) {
            llmem_sampler_options so = llmem_sampler_options_default();
            so.vocab_size = s->b.vocab;
            so.temperature = p->temperature;
            so.top_p = p->top_p;
            so.seed = p->seed + i;
            llmem_status st = llmem_sampler_create(&so, &u->sampler);
            if (st) {
                llmem__sched_free_req(r);
                return st;
            }
        }
    }
    *out = r;
    return LLMEM_OK;
nomem:
    llmem__sched_free_req(r);
    return llmem__fail(LLMEM_ENOMEM, "sched submit: no memory for a request of %u samples", n);
}

/* A slot in the request table (mu held). */
static llmem_status table_slot(llmem_sched *s, uint32_t *idx)
{
    if (!s->nfree) {
        uint32_t ncap = s->nreq_cap ? s->nreq_cap * 2 : 64;
        sreq **nr = realloc(s->reqs, ncap * sizeof *nr);
        if (!nr) return llmem__fail(LLMEM_ENOMEM, "sched: no memory for the request table");
        s->reqs = nr;
        uint32_t *ng = realloc(s->req_gen, ncap * sizeof *ng);
        if (!ng) return llmem__fail(LLMEM_ENOMEM, "sched: no memory for the request table");
        s->req_gen = ng;
        uint32_t *nf = realloc(s->free_slots, ncap * sizeof *nf);
        if (!nf) return llmem__fail(LLMEM_ENOMEM, "sched: no memory for the request table");
        s->free_slots = nf;
        for (uint32_t i = ncap; i > s->nreq_cap; i--) {
            s->reqs[i - 1] = NULL;
            s->req_gen[i - 1] = 0;
            s->free_slots[s->nfree++] = i - 1;
        }
        s->nreq_cap = ncap;
    }
    *idx = s->free_slots[--s->nfree];
    return LLMEM_OK;
}

llmem_status llmem_sched_submit(llmem_sched *s, const llmem_sched_params *p, llmem_sched_req *out)
{
    if (out) *out = 0;
    if (!s || !p || !out) return llmem__fail(LLMEM_EINVAL, "sched submit: null argument");
    uint32_t n = p->n ? p->n : 1;
    llmem_status st = check_params(s, p, n);
    if (st) return st;
    sreq *r = NULL;
    if ((st = build_req(s, p, n, &r))) return st;
    pthread_mutex_lock(&s->mu);
    if (s->o.max_waiting && s->waiting_reqs >= s->o.max_waiting) {
        pthread_mutex_unlock(&s->mu);
        llmem__sched_free_req(r);
        return llmem__fail(LLMEM_ECAPACITY, "sched submit: %zu requests are waiting already (max_waiting %u)",
                           s->waiting_reqs, s->o.max_waiting);
    }
    bool ok;
    llmem__sched_wq_grow(s, s->live_units + n, &ok);
    uint32_t idx = 0;
    if (!ok || (st = table_slot(s, &idx))) {
        pthread_mutex_unlock(&s->mu);
        llmem__sched_free_req(r);
        return st ? st : llmem__fail(LLMEM_ENOMEM, "sched submit: no memory for the queue");
    }
    r->id = ((uint64_t)(++s->req_gen[idx]) << 32) | (idx + 1);
    r->serial = ++s->serial;
    uint64_t now = llmem__sched_now(s);
    r->arrival_ns = p->arrival_ns && p->arrival_ns <= now ? p->arrival_ns : now; /* not in the future */
    s->reqs[idx] = r;
    for (uint32_t i = 1; i < n; i++) r->u[i].fork_wait = true;
    r->followers_waiting = n - 1;
    llmem__sched_wq_push_back(s, &r->u[0]);
    s->waiting_reqs++;
    s->live_units += n;
    s->pending++;
    s->st.requests_submitted_total++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    *out = r->id;
    return LLMEM_OK;
}

/* ---- cancellation, release ------------------------------------------------------------ */

static bool lock_step(llmem_sched *s)
{
    pthread_mutex_lock(&s->mu);
    bool mine = s->owned && pthread_equal(s->owner, pthread_self());
    pthread_mutex_unlock(&s->mu);
    if (!mine) pthread_mutex_lock(&s->step_mu);
    return !mine;
}

llmem_status llmem_sched_while_still(llmem_sched *s, void (*fn)(void *arg), void *arg)
{
    if (!s || !fn) return llmem__fail(LLMEM_EINVAL, "sched while_still: null argument");
    bool locked = lock_step(s);
    fn(arg);
    if (locked) pthread_mutex_unlock(&s->step_mu);
    return LLMEM_OK;
}

static void cancel_locked(llmem_sched *s, sreq *r)
{
    bool any = false;
    for (uint32_t i = 0; i < r->n; i++) {
        unit *u = &r->u[i];
        if (u->state == LLMEM_SCHED_FINISHED) continue;
        any = true;
        llmem__sched_finish_unit(s, u, LLMEM_SCHED_FINISH_CANCELLED);
    }
    if (any && !r->cancelled_counted) {
        r->cancelled_counted = true;
        s->st.requests_cancelled_total++;
    }
}

/* Request id into *r, or LLMEM_EINVAL "sched <what>: unknown request".
 * mu held. */
static llmem_status find_req(const llmem_sched *s, llmem_sched_req id, const char *what, sreq **r)
{
    *r = llmem__sched_lookup(s, id);
    if (!*r) return llmem__fail(LLMEM_EINVAL, "sched %s: unknown request %llx", what, (unsigned long long)id);
    return LLMEM_OK;
}

/* find_req, and sample one of its samples (else LLMEM_ERANGE). mu held. */
static llmem_status find_sample(const llmem_sched *s, llmem_sched_req id, uint32_t sample, const char *what,
                                sreq **r)
{
    llmem_status st = find_req(s, id, what, r);
    if (!st && sample >= (*r)->n)
        st = llmem__fail(LLMEM_ERANGE, "sched %s: sample %u of %u", what, sample, (*r)->n);
    return st;
}

/* Cancel request id (what is unfinished ends CANCELLED, its KV freed at
 * once) and, with release, free its record and table slot too. Both under
 * step_mu (unless the caller is the stepping thread's own callback) and mu;
 * a cancellation's events are dropped: the caller knows. */
static llmem_status end_request(llmem_sched *s, llmem_sched_req id, bool release, const char *what)
{
    if (!s) return llmem__fail(LLMEM_EINVAL, "sched %s: null scheduler", what);
    bool locked = lock_step(s);
    pthread_mutex_lock(&s->mu);
    size_t events = s->eb.n;
    sreq *r;
    llmem_status st = find_req(s, id, what, &r);
    if (!st) {
        cancel_locked(s, r);
        s->eb.n = events;
        if (release) {
            uint32_t idx = (uint32_t)(id & 0xffffffffu) - 1;
            s->reqs[idx] = NULL;
            s->free_slots[s->nfree++] = idx;
            llmem__sched_free_req(r);
        }
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (locked) pthread_mutex_unlock(&s->step_mu);
    return st;
}

llmem_status llmem_sched_cancel(llmem_sched *s, llmem_sched_req id) { return end_request(s, id, false, "cancel"); }

llmem_status llmem_sched_release(llmem_sched *s, llmem_sched_req id) { return end_request(s, id, true, "release"); }

/* ---- reading ------------------------------------------------------------------------------ */

llmem_status llmem_sched_get_info(llmem_sched *s, llmem_sched_req id, uint32_t sample, llmem_sched_info *out)
{
    if (!s || !out) return llmem__fail(LLMEM_EINVAL, "sched info: null argument");
    pthread_mutex_lock(&s->mu);
    sreq *r;
    llmem_status st = find_sample(s, id, sample, "info", &r);
    if (!st) {
        const unit *u = &r->u[sample];
        memset(out, 0, sizeof *out);
        out->state = u->state;
        out->finish = u->finish;
        out->n = r->n;
        out->prompt_tokens = r->prompt_len;
        out->cached_tokens = r->cached_tokens;
        out->generated = u->generated;
        out->visible = u->visible;
        out->preemptions = u->preemptions;
        out->swaps = u->swaps;
        out->computed_tokens = r->computed_tokens;
        out->arrival_ns = r->arrival_ns;
        out->scheduled_ns = r->scheduled_ns;
        out->first_token_ns = u->first_token_ns;
        out->finish_ns = u->state == LLMEM_SCHED_FINISHED ? u->finish_ns : 0;
        out->user = r->user;
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

llmem_status llmem_sched_read(llmem_sched *s, llmem_sched_req id, uint32_t sample, size_t from, int32_t *out,
                              size_t cap, size_t *n)
{
    if (n) *n = 0;
    if (!s || !n || (cap && !out)) return llmem__fail(LLMEM_EINVAL, "sched read: null argument");
    pthread_mutex_lock(&s->mu);
    sreq *r;
    llmem_status st = find_sample(s, id, sample, "read", &r);
    if (!st) {
        const unit *u = &r->u[sample];
        size_t k = 0;
        for (size_t i = from; i < u->visible && k < cap; i++) out[k++] = u->tok[r->prompt_len + i];
        *n = k;
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

llmem_status llmem_sched_wait(llmem_sched *s, llmem_sched_req id, uint64_t *progress, uint64_t timeout_ns)
{
    if (!s || !progress) return llmem__fail(LLMEM_EINVAL, "sched wait: null argument");
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    uint64_t t = (uint64_t)dl.tv_nsec + timeout_ns;
    dl.tv_sec += (time_t)(t / 1000000000ull);
    dl.tv_nsec = (long)(t % 1000000000ull);
    pthread_mutex_lock(&s->mu);
    llmem_status st = LLMEM_OK;
    for (;;) {
        sreq *r;
        if ((st = find_req(s, id, "wait", &r)) != LLMEM_OK) break;
        if (r->progress != *progress || !r->unfinished) {
            *progress = r->progress;
            break;
        }
        if (pthread_cond_timedwait(&s->cv, &s->mu, &dl)) break;
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

size_t llmem_sched_pending(llmem_sched *s)
{
    if (!s) return 0;
    pthread_mutex_lock(&s->mu);
    size_t n = s->pending;
    pthread_mutex_unlock(&s->mu);
    return n;
}

bool llmem_sched_wait_work(llmem_sched *s, uint64_t timeout_ns)
{
    if (!s) return false;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    uint64_t t = (uint64_t)dl.tv_nsec + timeout_ns;
    dl.tv_sec += (time_t)(t / 1000000000ull);
    dl.tv_nsec = (long)(t % 1000000000ull);
    pthread_mutex_lock(&s->mu);
    while (!s->nrun && !s->wq_len)
        if (pthread_cond_timedwait(&s->cv, &s->mu, &dl)) break;
    bool work = s->nrun || s->wq_len;
    pthread_mutex_unlock(&s->mu);
    return work;
}

uint64_t llmem_sched_now_ns(const llmem_sched *s) { return s ? llmem__sched_now(s) : 0; }

