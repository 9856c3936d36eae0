/*
 * timeline_internal.h - what the timeline's recording (timeline.c) and its
 * page writer (timeline_html.c) share: the timeline itself and the two
 * rings' accessors. Not installed.
 */
#ifndef LLMEM_TIMELINE_INTERNAL_H
#define LLMEM_TIMELINE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "llmem/timeline.h"

#define MAX_ACTIONS 16       /* distinct action names counted apart; the rest are "other" */
#define MAX_CHANGES 8192     /* stage changes kept (a ring) */

typedef struct tl_event {
    uint64_t time_ns;
    uint64_t before, after;
    llmem_stage stage;
    uint8_t action; /* index in actions[], MAX_ACTIONS for one past the table */
    char action_name[LLMEM_TIMELINE_ACTION_LEN];
    char text[LLMEM_TIMELINE_TEXT_LEN];
} tl_event;

typedef struct tl_change {
    uint64_t time_ns;
    llmem_stage stage;
} tl_change;

typedef struct tl_action {
    char name[LLMEM_TIMELINE_ACTION_LEN];
    uint64_t count;
} tl_action;

struct llmem_timeline {
    size_t cap;                /* max_samples */
    size_t n;                  /* samples kept, <= cap */
    uint64_t seen;             /* samples recorded in all */
    uint64_t stride;           /* grid step, in samples recorded */
    uint64_t peak_reserved, peak_committed, peak_used;
    llmem_timeline_sample *s;  /* [cap] */

    tl_change *changes;        /* ring [MAX_CHANGES] */
    size_t ch_head, ch_n;      /* next slot, entries held */
    uint64_t ch_dropped;

    tl_event *ev;              /* ring [LLMEM_TIMELINE_MAX_EVENTS] */
    size_t ev_head, ev_n;
    uint64_t ev_total;
    tl_action actions[MAX_ACTIONS];
    size_t n_actions;
    uint64_t other_actions;    /* events whose action did not fit the table */
};

/* The i-th oldest event, and stage change, held. */
static inline const tl_event *llmem__timeline_event_at(const llmem_timeline *t, size_t i)
{
    size_t first = (t->ev_head + LLMEM_TIMELINE_MAX_EVENTS - t->ev_n) % LLMEM_TIMELINE_MAX_EVENTS;
    return &t->ev[(first + i) % LLMEM_TIMELINE_MAX_EVENTS];
}

static inline const tl_change *llmem__timeline_change_at(const llmem_timeline *t, size_t i)
{
    size_t first = (t->ch_head + MAX_CHANGES - t->ch_n) % MAX_CHANGES;
    return &t->changes[(first + i) % MAX_CHANGES];
}

#endif
