/*
 * controller.c - the stage-aware memory controller (see llmem/controller.h).
 *
 * State, all under one mutex: the current stage; when IDLE began and
 * whether this idle period has been housekept; the grow step and its
 * hysteresis (armed: a grow may happen; used_at_grow and last_step: where
 * the last grow left usage); the event ring and the counters.
 *
 * The ring holds the last `cap` events: event number n (from 0) lives in
 * slot n % cap, so the kept ones are numbers [total - count, total). A
 * reader copies by number in small batches and writes them out unlocked;
 * events pushed out meanwhile are skipped, never torn.
 *
 * Lock order: controller, then pool (the pool never calls back). Nothing
 * here allocates after create: events go into the ring, reasons are static
 * text, figures come from llmem_pool_get_stats into stack structs.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "llmem/controller.h"

#define MIB ((size_t)1 << 20)

struct llmem_controller {
    llmem_controller_options o;
    pthread_mutex_t lock;
    uint64_t created_ns;         /* the clock at creation: t_ms counts from it */
    llmem_stage stage;
    bool have_stage;             /* an event has been seen */
    uint64_t idle_since_ns;      /* when the current IDLE began */
    bool idle_done;              /* this idle period has been housekept */
    size_t grow_step;            /* the next grow */
    size_t last_step;            /* the last grow's size */
    uint64_t used_at_grow;       /* used bytes when it happened */
    bool armed;                  /* a grow may happen */
    llmem_controller_event *ring;
    size_t cap;
    llmem_controller_stats st;   /* events_total counts the ring's writes */
};

const char *llmem_controller_action_name(llmem_controller_action a)
{
    static const char *const names[] = {"stage", "reserve", "grow", "shrink", "compact", "fail"};
    return (unsigned)a < LLMEM_CONTROLLER_ACTION_COUNT_ ? names[a] : "?";
}

static uint64_t default_clock(void *ctx)
{
    (void)ctx;
    return llmem__now_ns();
}

llmem_controller_options llmem_controller_options_default(void)
{
    llmem_controller_options o;
    memset(&o, 0, sizeof o);
    o.safety_factor = 1.2;
    o.high_watermark = 0.85;
    o.low_watermark = 0.30;
    o.idle_decay_ms = 1000;
    o.grow_min_bytes = 4 * MIB;
    o.grow_factor = 2.0;
    o.grow_max_bytes = 256 * MIB;
    o.compact_threshold = 0.40;
    o.compact_budget_bytes = 64 * MIB;
    o.event_capacity = 4096;
    o.clock = default_clock;
    return o;
}

/* ---- creation --------------------------------------------------------------- */

static llmem_status check_options(llmem_controller_options *o)
{
    llmem_controller_options d = llmem_controller_options_default();
    if (o->safety_factor == 0) o->safety_factor = d.safety_factor;
    if (o->high_watermark == 0) o->high_watermark = d.high_watermark;
    if (o->low_watermark == 0) o->low_watermark = d.low_watermark;
    if (!o->idle_decay_ms) o->idle_decay_ms = d.idle_decay_ms;
    if (!o->grow_min_bytes) o->grow_min_bytes = d.grow_min_bytes;
    if (o->grow_factor == 0) o->grow_factor = d.grow_factor;
    if (!o->grow_max_bytes) o->grow_max_bytes = o->grow_min_bytes > d.grow_max_bytes ? o->grow_min_bytes
                                                                                       : d.grow_max_bytes;
    if (o->compact_threshold == 0) o->compact_threshold = d.compact_threshold;
    if (!o->compact_budget_bytes) o->compact_budget_bytes = d.compact_budget_bytes;
    if (!o->event_capacity) o->event_capacity = d.event_capacity;
    if (!o->clock) {
        o->clock = d.clock;
        o->clock_ctx = NULL;
    }
    /* Written so that NaN fails every test. */
    if (!(o->safety_factor >= 1.0 && isfinite(o->safety_factor)))
        return llmem__fail(LLMEM_EINVAL, "controller: safety_factor %g is below 1 (or not a number)",
                           o->safety_factor);
    if (!(o->high_watermark > 0.0 && o->high_watermark <= 1.0))
        return llmem__fail(LLMEM_EINVAL, "controller: high_watermark %g is outside (0, 1]", o->high_watermark);
    if (!(o->low_watermark > 0.0 && o->low_watermark < o->high_watermark))
        return llmem__fail(LLMEM_EINVAL, "controller: low_watermark %g is outside (0, high_watermark %g)",
                           o->low_watermark, o->high_watermark);
    if (!(o->grow_factor >= 1.0 && isfinite(o->grow_factor)))
        return llmem__fail(LLMEM_EINVAL, "controller: grow_factor %g is below 1 (or not a number)", o->grow_factor);
    if (o->grow_max_bytes < o->grow_min_bytes)
        return llmem__fail(LLMEM_EINVAL, "controller: grow_max_bytes %zu is below grow_min_bytes %zu",
                           o->grow_max_bytes, o->grow_min_bytes);
    if (!(o->compact_threshold > 0.0 && o->compact_threshold <= 1.0))
        return llmem__fail(LLMEM_EINVAL, "controller: compact_threshold %g is outside (0, 1]",
                           o->compact_threshold);
    return LLMEM_OK;
}

llmem_status llmem_controller_create(const llmem_controller_options *opts, llmem_controller **out)
{
    if (out) *out = NULL;
    if (!opts || !out) return llmem__fail(LLMEM_EINVAL, "controller: null %s", opts ? "out" : "options");
    if (!opts->pool) return llmem__fail(LLMEM_EINVAL, "controller: options name no pool");
    llmem_controller_options o = *opts;
    llmem_status st = check_options(&o);
    if (st) return st;
    size_t ring_bytes;
    if (!llmem__mul_ok(o.event_capacity, sizeof(llmem_controller_event), &ring_bytes))
        return llmem__fail(LLMEM_EOVERFLOW, "controller: an event ring of %zu events overflows", o.event_capacity);
    llmem_controller *c = calloc(1, sizeof *c);
    llmem_controller_event *ring = c ? malloc(ring_bytes) : NULL;
    if (!c || !ring) {
        free(c);
        return llmem__fail(LLMEM_ENOMEM, "controller: out of memory for %zu events", o.event_capacity);
    }
    if (pthread_mutex_init(&c->lock, NULL)) {
        free(ring);
        free(c);
        return llmem__fail(LLMEM_EOS, "controller: pthread_mutex_init failed");
    }
    c->o = o;
    c->ring = ring;
    c->cap = o.event_capacity;
    c->created_ns = o.clock(o.clock_ctx);
    c->stage = LLMEM_STAGE_IDLE;
    c->idle_since_ns = c->created_ns;
    c->idle_done = true; /* nothing to give back before any work */
    c->grow_step = o.grow_min_bytes;
    c->armed = true;
    c->st.struct_size = sizeof c->st;
    c->st.stage = LLMEM_STAGE_IDLE;
    c->st.grow_step_bytes = c->grow_step;
    *out = c;
    return LLMEM_OK;
}

void llmem_controller_destroy(llmem_controller *c)
{
    if (!c) return;
    pthread_mutex_destroy(&c->lock);
    free(c->ring);
    free(c);
}

/* ---- events ------------------------------------------------------------------ */

/* Lock held. */
static void record(llmem_controller *c, uint64_t now, llmem_controller_action a, uint64_t before, uint64_t after,
                   const char *reason, uint64_t detail)
{
    c->ring[c->st.events_total % c->cap] = (llmem_controller_event){now, c->stage, a, before, after, reason, detail};
    c->st.events_total++;
    if (c->st.events_total > c->cap) c->st.events_dropped = c->st.events_total - c->cap;
}

/* Copy up to cap events numbered from *from on (moved forward past any that
 * were dropped); returns how many. Takes the lock. */
static size_t copy_events(const llmem_controller *cc, uint64_t *from, llmem_controller_event *out, size_t cap)
{
    llmem_controller *c = (llmem_controller *)(uintptr_t)cc;
    pthread_mutex_lock(&c->lock);
    uint64_t total = c->st.events_total, first = c->st.events_dropped;
    if (*from < first) *from = first;
    size_t n = 0;
    for (uint64_t i = *from; i < total && n < cap; i++) out[n++] = c->ring[i % c->cap];
    pthread_mutex_unlock(&c->lock);
    return n;
}

size_t llmem_controller_events(const llmem_controller *c, llmem_controller_event *out, size_t cap)
{
    if (!c || (cap && !out)) return 0;
    uint64_t from = 0;
    return copy_events(c, &from, out, cap);
}

llmem_status llmem_controller_write_events(const llmem_controller *c, FILE *f)
{
    if (!c || !f) return llmem__fail(LLMEM_EINVAL, "controller write events: null %s", c ? "stream" : "controller");
    llmem_controller_event batch[64];
    uint64_t from = 0;
    for (size_t n; (n = copy_events(c, &from, batch, LLMEM_ARRAY_LEN(batch))) > 0; from += n) {
        for (size_t i = 0; i < n; i++) {
            const llmem_controller_event *e = &batch[i];
            double t_ms = e->time_ns > c->created_ns ? (double)(e->time_ns - c->created_ns) / 1e6 : 0.0;
            fprintf(f,
                    "{\"t_ms\":%.3f,\"stage\":\"%s\",\"action\":\"%s\",\"before\":%llu,\"after\":%llu,"
                    "\"reason\":\"%s\",\"detail\":%llu}\n",
                    t_ms, llmem_stage_name(e->stage), llmem_controller_action_name(e->action),
                    (unsigned long long)e->bytes_before, (unsigned long long)e->bytes_after,
                    e->reason ? e->reason : "", (unsigned long long)e->detail);
        }
    }
    if (fflush(f) != 0 || ferror(f)) return llmem__fail(LLMEM_EIO, "controller write events: the stream failed");
    return LLMEM_OK;
}

/* ---- policy ------------------------------------------------------------------- */

static bool pool_figures(llmem_controller *c, llmem_pool_stats *s)
{
    memset(s, 0, sizeof *s);
    return llmem_pool_get_stats(c->o.pool, s) == LLMEM_OK;
}

/* Doubles to bytes, saturating; NaN and negatives give 0. */
static uint64_t to_bytes(double x)
{
    if (!(x > 0)) return 0;
    if (x >= 18446744073709551615.0) return UINT64_MAX;
    return (uint64_t)ceil(x);
}

/* After a reserve the controller asked the pool for (st its answer,
 * `before` the committed bytes before it, s the figures after it): an
 * event of `action` with reason, counted in *count with the bytes it added
 * in *added, or a FAIL with fail_reason. False when it failed. Lock held. */
static bool reserve_done(llmem_controller *c, uint64_t now, llmem_status st, uint64_t before,
                         const llmem_pool_stats *s, llmem_controller_action action, uint64_t *count, uint64_t *added,
                         const char *fail_reason, const char *reason, uint64_t bytes)
{
    if (st) {
        c->st.failures_total++;
        record(c, now, LLMEM_CONTROLLER_FAIL, before, s->committed_bytes, fail_reason, bytes);
        return false;
    }
    (*count)++;
    if (s->committed_bytes > before) *added += s->committed_bytes - before;
    record(c, now, action, before, s->committed_bytes, reason, bytes);
    return true;
}

/* Lock held. */
static void prefill(llmem_controller *c, uint64_t now, const llmem_stage_event *ev)
{
    uint32_t batch = ev->batch ? ev->batch : 1;
    if (!ev->tokens) return;
    double want;
    const char *reason;
    if (c->o.predictor) {
        uint64_t per_seq = ev->tokens / batch + (ev->tokens % batch != 0);
        llmem_prediction pr;
        if (per_seq > UINT32_MAX ||
            llmem_predictor_predict(c->o.predictor, LLMEM_STAGE_PREFILL, batch, (uint32_t)per_seq, 0, &pr)) {
            c->st.failures_total++;
            record(c, now, LLMEM_CONTROLLER_FAIL, 0, 0, "prefill: the predictor refused the step", ev->tokens);
            return;
        }
        /* The predictor's reserve carries the safety factor already (on
         * its data-dependent part): applied once, not again here. When its
         * corrector predicts better than its formulas, the corrected
         * reserve (which equals the formula's until then). */
        want = (double)pr.corrected_reserve_bytes;
        reason = pr.corrected_reserve_bytes != pr.reserve_bytes ? "prefill: predicted reserve (corrected by measured peaks)"
                                                                : "prefill: predicted reserve";
    } else {
        if (!c->o.bytes_per_token_hint) return;
        want = (double)ev->tokens * (double)c->o.bytes_per_token_hint * c->o.safety_factor;
        reason = "prefill: tokens x bytes_per_token_hint x safety factor";
    }
    uint64_t bytes = to_bytes(want);
    if (!bytes) return;
    llmem_pool_stats s;
    pool_figures(c, &s);
    uint64_t before = s.committed_bytes;
    llmem_status st = bytes > SIZE_MAX ? LLMEM_EOVERFLOW : llmem_pool_reserve(c->o.pool, (size_t)bytes);
    pool_figures(c, &s);
    reserve_done(c, now, st, before, &s, LLMEM_CONTROLLER_RESERVE, &c->st.reserves_total,
                 &c->st.bytes_reserved_ahead_total, "prefill: the pool refused the reserve", reason, bytes);
}

/* Lock held. */
static void decode(llmem_controller *c, uint64_t now)
{
    llmem_pool_stats s;
    if (!pool_figures(c, &s)) return;
    if (!s.committed_bytes) { /* everything went back (a shrink): below any watermark */
        c->armed = true;
        return;
    }
    double ratio = (double)s.used_bytes / (double)s.committed_bytes;
    bool above = ratio > c->o.high_watermark;
    if (!above) c->armed = true;
    else if (!c->armed && s.used_bytes >= c->used_at_grow + c->last_step) c->armed = true;
    /* The room of a free run as large as the step is there already:
     * committed pages only (largest_free_bytes), so that a reserved
     * range's uncommitted tail does not count as room. */
    if (!above || !c->armed || s.largest_free_bytes >= c->grow_step) return;
    size_t step = c->grow_step;
    uint64_t before = s.committed_bytes;
    llmem_status st = llmem_pool_reserve(c->o.pool, step);
    pool_figures(c, &s);
    c->armed = false;
    c->used_at_grow = s.used_bytes;
    c->last_step = step;
    if (!reserve_done(c, now, st, before, &s, LLMEM_CONTROLLER_GROW, &c->st.grows_total, &c->st.bytes_grown_total,
                      "decode: the pool refused to grow", "decode: used/committed above the high watermark", step))
        return;
    double next = (double)step * c->o.grow_factor;
    c->grow_step = next >= (double)c->o.grow_max_bytes ? c->o.grow_max_bytes : (size_t)next;
    c->st.grow_step_bytes = c->grow_step;
}

/* Shrink so that used / committed >= low_watermark. Lock held. */
static void shrink(llmem_controller *c, uint64_t now, const char *reason)
{
    llmem_pool_stats s;
    if (!pool_figures(c, &s)) return;
    uint64_t target = to_bytes((double)s.used_bytes / c->o.low_watermark);
    if (s.committed_bytes <= target) return;
    uint64_t before = s.committed_bytes;
    size_t released = llmem_pool_shrink(c->o.pool, target > SIZE_MAX ? SIZE_MAX : (size_t)target);
    pool_figures(c, &s);
    c->st.shrinks_total++;
    c->st.bytes_released_total += released;
    record(c, now, LLMEM_CONTROLLER_SHRINK, before, s.committed_bytes, reason, target);
    c->grow_step = c->o.grow_min_bytes;
    c->st.grow_step_bytes = c->grow_step;
    c->armed = true;
}

/* Idle housekeeping, once per idle period after the decay. Lock held. */
static void housekeep(llmem_controller *c, uint64_t now)
{
    if (c->stage != LLMEM_STAGE_IDLE || c->idle_done) return;
    if (now < c->idle_since_ns || now - c->idle_since_ns < (uint64_t)c->o.idle_decay_ms * 1000000u) return;
    c->idle_done = true;
    shrink(c, now, "idle past the decay delay: down to the low watermark");
    llmem_pool_stats s;
    if (!pool_figures(c, &s) || !s.handles || !(s.fragmentation > c->o.compact_threshold)) return;
    uint64_t before = s.committed_bytes;
    llmem_pool_compact_report r = {sizeof r, 0, 0, 0, 0, 0, 0};
    llmem_status st = llmem_pool_compact(c->o.pool, c->o.compact_budget_bytes, &r);
    pool_figures(c, &s);
    if (st) {
        c->st.failures_total++;
        record(c, now, LLMEM_CONTROLLER_FAIL, before, s.committed_bytes, "idle: the pool refused to compact",
               c->o.compact_budget_bytes);
        return;
    }
    c->st.compactions_total++;
    c->st.bytes_compacted_total += r.bytes_moved;
    c->st.bytes_released_total += r.bytes_released;
    record(c, now, LLMEM_CONTROLLER_COMPACT, before, s.committed_bytes, "idle: fragmentation above the threshold",
           r.bytes_moved);
    shrink(c, now, "after compaction: down to the low watermark");
}

void llmem_controller_on_step_done(void *controller, uint32_t batch, uint32_t tokens, uint32_t context,
                                   uint64_t measured_bytes)
{
    llmem_controller *c = controller;
    if (!c || !c->o.predictor || !batch || !tokens || !measured_bytes) return;
    pthread_mutex_lock(&c->lock); /* the predictor is the controller's to use under its lock */
    llmem_predictor_observe(c->o.predictor, batch, tokens, context, measured_bytes);
    pthread_mutex_unlock(&c->lock);
}

void llmem_controller_on_stage(void *controller, const llmem_stage_event *ev)
{
    llmem_controller *c = controller;
    if (!c || !ev || (unsigned)ev->stage >= LLMEM_STAGE_COUNT_) return;
    pthread_mutex_lock(&c->lock);
    uint64_t now = c->o.clock(c->o.clock_ctx);
    if (c->st.stage != (uint64_t)ev->stage) c->st.stage_changes_total++;
    if (ev->stage == LLMEM_STAGE_PREFILL) c->st.prefill_steps_total++;
    if (ev->stage == LLMEM_STAGE_DECODE) c->st.decode_steps_total++;
    if (!c->have_stage || ev->stage != c->stage) {
        c->have_stage = true;
        c->stage = ev->stage;
        c->st.stage = ev->stage;
        if (ev->stage == LLMEM_STAGE_IDLE) {
            c->idle_since_ns = now;
            c->idle_done = false;
        }
        llmem_pool_stats s;
        pool_figures(c, &s);
        record(c, now, LLMEM_CONTROLLER_STAGE, s.committed_bytes, s.committed_bytes, "stage reported", ev->tokens);
    }
    if (ev->stage == LLMEM_STAGE_PREFILL) prefill(c, now, ev);
    else if (ev->stage == LLMEM_STAGE_DECODE) decode(c, now);
    housekeep(c, now);
    pthread_mutex_unlock(&c->lock);
}

void llmem_controller_tick(llmem_controller *c)
{
    if (!c) return;
    pthread_mutex_lock(&c->lock);
    housekeep(c, c->o.clock(c->o.clock_ctx));
    pthread_mutex_unlock(&c->lock);
}

/* ---- stats --------------------------------------------------------------------- */

llmem_status llmem_controller_get_stats(const llmem_controller *cc, llmem_controller_stats *out)
{
    if (!cc || !out) return llmem__fail(LLMEM_EINVAL, "controller stats: null argument");
    llmem_controller *c = (llmem_controller *)(uintptr_t)cc;
    return llmem__stats_out_locked(out, &c->st, sizeof c->st, &c->lock);
}

LLMEM__STATS_SCHEMA_OF(llmem_controller_stats_schema, "controller", llmem_controller_stats, LLMEM_CONTROLLER_STATS_FIELDS)
