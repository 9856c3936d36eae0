/*
 * timeline.c - memory over time, recorded (see llmem/timeline.h); the
 * page is drawn by timeline_html.c.
 *
 * Samples: an array of max_samples allocated at create. Sample number k
 * (counting every sample recorded, from 0) is on the grid when k is a
 * multiple of `stride` (1 at first). The latest sample always sits in
 * s[n - 1], the tail; when the next one arrives the tail stays if it is on
 * the grid and is overwritten otherwise. A tail that stays and fills the
 * array (n == max_samples) halves it first: the samples at odd positions
 * go - exactly the multiples of stride that are not multiples of
 * 2 * stride - and the stride doubles. So n <= max_samples, s[0] is the
 * first sample ever, s[n - 1] the latest, the others are evenly spaced in
 * sample count, and nothing is dropped before max_samples have arrived.
 *
 * Stage changes are kept apart from the samples, in a ring of their own,
 * so a prefill of a few milliseconds still shows as a band after the
 * samples around it were decimated away. Events are a ring of
 * LLMEM_TIMELINE_MAX_EVENTS; per-action counts cover every event.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "timeline_internal.h"

/* ---- recording ----------------------------------------------------------- */

llmem_status llmem_timeline_create(size_t max_samples, llmem_timeline **out)
{
    if (!out) return llmem__fail(LLMEM_EINVAL, "timeline: null out");
    *out = NULL;
    if (max_samples == 0) max_samples = LLMEM_TIMELINE_DEFAULT_SAMPLES;
    if (max_samples < 2) return llmem__fail(LLMEM_EINVAL, "timeline: max_samples %zu (at least 2)", max_samples);
    size_t bytes;
    if (!llmem__mul_ok(max_samples, sizeof(llmem_timeline_sample), &bytes))
        return llmem__fail(LLMEM_EOVERFLOW, "timeline: %zu samples overflow", max_samples);
    llmem_timeline *t = calloc(1, sizeof *t);
    if (!t) return llmem__fail(LLMEM_ENOMEM, "timeline: out of memory");
    t->cap = max_samples;
    t->stride = 1;
    t->s = malloc(bytes);
    t->changes = malloc(MAX_CHANGES * sizeof *t->changes);
    t->ev = malloc(LLMEM_TIMELINE_MAX_EVENTS * sizeof *t->ev);
    if (!t->s || !t->changes || !t->ev) {
        llmem_timeline_destroy(t);
        return llmem__fail(LLMEM_ENOMEM, "timeline: out of memory for %zu samples (%zu bytes)", max_samples,
                           bytes);
    }
    *out = t;
    return LLMEM_OK;
}

void llmem_timeline_destroy(llmem_timeline *t)
{
    if (!t) return;
    free(t->s);
    free(t->changes);
    free(t->ev);
    free(t);
}

/* Drop the samples at odd positions (all on the grid: the tail was
 * promoted); the stride doubles. */
static void halve(llmem_timeline *t)
{
    size_t k = 0;
    for (size_t j = 0; j < t->n; j += 2) t->s[k++] = t->s[j];
    t->n = k;
    if (t->stride <= UINT64_MAX / 2) t->stride *= 2;
}

static void note_change(llmem_timeline *t, uint64_t time_ns, llmem_stage stage)
{
    if (t->ch_n == MAX_CHANGES) {
        t->ch_n--;
        t->ch_dropped++;
    }
    t->changes[t->ch_head] = (tl_change){time_ns, stage};
    t->ch_head = (t->ch_head + 1) % MAX_CHANGES;
    t->ch_n++;
}

llmem_status llmem_timeline_record(llmem_timeline *t, const llmem_timeline_sample *s)
{
    if (!t || !s) return llmem__fail(LLMEM_EINVAL, "timeline: null %s", t ? "sample" : "timeline");
    if ((unsigned)s->stage >= LLMEM_STAGE_COUNT_)
        return llmem__fail(LLMEM_EINVAL, "timeline: stage %d out of range", (int)s->stage);
    llmem_timeline_sample x = *s;
    if (t->n > 0) {
        const llmem_timeline_sample *prev = &t->s[t->n - 1];
        if (x.time_ns < prev->time_ns) x.time_ns = prev->time_ns;
        if (x.stage != prev->stage) note_change(t, x.time_ns, x.stage);
    } else {
        note_change(t, x.time_ns, x.stage);
    }
    if (x.reserved_bytes > t->peak_reserved) t->peak_reserved = x.reserved_bytes;
    if (x.committed_bytes > t->peak_committed) t->peak_committed = x.committed_bytes;
    if (x.used_bytes > t->peak_used) t->peak_used = x.used_bytes;

    if (t->n > 0) {
        /* the previous sample, the tail: kept on the grid, or dropped */
        uint64_t k = t->seen - 1;
        if (k % t->stride != 0) t->n--;
        else if (t->n == t->cap) halve(t);
    }
    t->seen++;
    t->s[t->n++] = x;
    return LLMEM_OK;
}

/* Copy at most cap - 1 bytes of src, not cutting a UTF-8 character. */
static void copy_utf8(char *dst, size_t cap, const char *src)
{
    size_t n = strnlen(src, cap);
    if (n >= cap) {
        n = cap - 1;
        while (n > 0 && ((unsigned char)src[n] & 0xC0) == 0x80) n--;
    }
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static uint8_t action_index(llmem_timeline *t, const char *name)
{
    for (size_t i = 0; i < t->n_actions; i++)
        if (strcmp(t->actions[i].name, name) == 0) {
            t->actions[i].count++;
            return (uint8_t)i;
        }
    if (t->n_actions == MAX_ACTIONS) {
        t->other_actions++;
        return MAX_ACTIONS;
    }
    tl_action *a = &t->actions[t->n_actions];
    memcpy(a->name, name, sizeof a->name);
    a->count = 1;
    return (uint8_t)t->n_actions++;
}

llmem_status llmem_timeline_event(llmem_timeline *t, uint64_t time_ns, llmem_stage stage, const char *action,
                                  const char *text, uint64_t bytes_before, uint64_t bytes_after)
{
    if (!t) return llmem__fail(LLMEM_EINVAL, "timeline: null timeline");
    if ((unsigned)stage >= LLMEM_STAGE_COUNT_)
        return llmem__fail(LLMEM_EINVAL, "timeline: event stage %d out of range", (int)stage);
    tl_event *e = &t->ev[t->ev_head];
    e->time_ns = time_ns;
    e->stage = stage;
    e->before = bytes_before;
    e->after = bytes_after;
    copy_utf8(e->action_name, sizeof e->action_name, action && action[0] ? action : "event");
    copy_utf8(e->text, sizeof e->text, text ? text : "");
    e->action = action_index(t, e->action_name);
    t->ev_head = (t->ev_head + 1) % LLMEM_TIMELINE_MAX_EVENTS;
    if (t->ev_n < LLMEM_TIMELINE_MAX_EVENTS) t->ev_n++;
    t->ev_total++;
    return LLMEM_OK;
}

size_t llmem_timeline_sample_count(const llmem_timeline *t) { return t ? t->n : 0; }

llmem_status llmem_timeline_get_sample(const llmem_timeline *t, size_t i, llmem_timeline_sample *out)
{
    if (!t || !out) return llmem__fail(LLMEM_EINVAL, "timeline: null argument");
    if (i >= t->n) return llmem__fail(LLMEM_ERANGE, "timeline: sample %zu of %zu", i, t->n);
    *out = t->s[i];
    return LLMEM_OK;
}

size_t llmem_timeline_event_count(const llmem_timeline *t) { return t ? t->ev_n : 0; }
uint64_t llmem_timeline_events_total(const llmem_timeline *t) { return t ? t->ev_total : 0; }
