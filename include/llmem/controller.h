/*
 * llmem/controller.h - the stage-aware memory controller.
 *
 * The controller listens to an engine's stage events (llmem/stage.h) and
 * sizes a pool (llmem/pool.h) ahead of the work instead of behind it:
 *
 *   PREFILL (batch b, tokens t): reserve what the step will need before it
 *     runs - the predictor's reserve for b sequences of ceil(t / b) tokens,
 *     which carries the predictor's own safety factor (its corrected
 *     reserve once its corrector, fed by llmem_controller_on_step_done,
 *     predicts better), or without a predictor t x bytes_per_token_hint x
 *     safety_factor - through llmem_pool_reserve, so the step's
 *     allocations make no resource call.
 *   DECODE: grow only when used / committed passes high_watermark and the
 *     pool's largest free run is smaller than the grow step; the step starts
 *     at grow_min_bytes and is grow_factor times larger after each grow, up
 *     to grow_max_bytes (the pool maps it in whole superblocks). Hysteresis:
 *     after a grow, no other grow until usage has dropped back under the
 *     high watermark or a whole step has been used up, and the step's room
 *     must itself be spent first; so a load that hovers around the
 *     watermark grows a few times and then not at all. Nothing shrinks
 *     outside IDLE.
 *   IDLE: once IDLE has lasted idle_decay_ms (checked by llmem_controller_tick
 *     and on every event), shrink the pool so that used / committed is at
 *     least low_watermark (llmem_pool_shrink: empty superblocks unmapped,
 *     then free pages decommitted); then, if fragmentation
 *     (1 - largest free run / free bytes) passes compact_threshold and the
 *     pool holds handles, compact up to compact_budget_bytes and shrink
 *     again. Once per idle period; a shrink resets the grow step.
 *
 * "Committed" is the pool's committed_bytes: mapped bytes less decommitted
 * pages, the memory the pool really holds. Every ratio and every event's
 * before/after figures use it (a decommit lowers it where reserved_bytes,
 * the address space mapped, would not move).
 *
 * Every decision is an event - time, stage, action, committed bytes before
 * and after, a reason, a detail figure - kept in a ring allocated at
 * creation: after llmem_controller_create the controller calls no malloc
 * itself, so an engine's decode steps stay malloc-free with it attached
 * (the pool may allocate metadata when it maps a superblock for a grow).
 *
 *     llmem_controller_options co = llmem_controller_options_default();
 *     co.pool = pool;
 *     co.predictor = predictor;                // optional
 *     llmem_controller *ctl;
 *     llmem_controller_create(&co, &ctl);
 *     eo.pool = pool;                          // the engine's options
 *     eo.on_stage = llmem_controller_on_stage;
 *     eo.stage_ctx = ctl;
 *     ...                                      // steps; a server loop calls
 *     llmem_controller_tick(ctl);              // tick() now and then when idle
 *     llmem_controller_write_events(ctl, f);   // the decisions, JSON lines
 *
 * Threads: every function is safe to call from any thread (a mutex guards
 * the controller's state; the pool is called with it held, never the other
 * way round). The controller does not own the pool or the predictor; both
 * must outlive it.
 */
#ifndef LLMEM_CONTROLLER_H
#define LLMEM_CONTROLLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "llmem/pool.h"
#include "llmem/predictor.h"
#include "llmem/stage.h"
#include "llmem/stats.h"
#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_controller llmem_controller;

typedef enum llmem_controller_action {
    LLMEM_CONTROLLER_STAGE = 0,   /* the stage changed; detail: the event's tokens (bytes mapped for LOAD) */
    LLMEM_CONTROLLER_RESERVE = 1, /* reserved before a prefill; detail: bytes asked */
    LLMEM_CONTROLLER_GROW = 2,    /* grew during decode; detail: bytes asked (the grow step) */
    LLMEM_CONTROLLER_SHRINK = 3,  /* gave memory back when idle; detail: the committed-bytes target */
    LLMEM_CONTROLLER_COMPACT = 4, /* compacted handle blocks when idle; detail: bytes moved */
    LLMEM_CONTROLLER_FAIL = 5,    /* a reserve, grow or compaction the pool refused; detail: bytes asked */
    LLMEM_CONTROLLER_ACTION_COUNT_
} llmem_controller_action;

/* "stage", "reserve", "grow", "shrink", "compact", "fail"; "?" otherwise. */
LLMEM_API const char *llmem_controller_action_name(llmem_controller_action a);

/* One decision. */
typedef struct llmem_controller_event {
    uint64_t time_ns;      /* the controller's clock */
    llmem_stage stage;     /* the stage it was taken in */
    llmem_controller_action action;
    uint64_t bytes_before; /* the pool's committed bytes before the action */
    uint64_t bytes_after;  /* and after it */
    const char *reason;    /* static text */
    uint64_t detail;       /* see llmem_controller_action */
} llmem_controller_event;

/* A clock in nanoseconds (monotonic); tests pass a fake one. */
typedef uint64_t (*llmem_clock_fn)(void *ctx);

/* Zero fields mean the default. */
typedef struct llmem_controller_options {
    llmem_pool *pool;            /* required, borrowed */
    llmem_predictor *predictor;  /* optional, borrowed: sizes the reserve before a prefill */
    size_t bytes_per_token_hint; /* without a predictor: a prefill reserves tokens x this (x safety);
                                    0 = no prefill reserve */
    double safety_factor;        /* on a prefill reserve from bytes_per_token_hint, >= 1; default 1.2 (a
                                    predictor's reserve carries its own, applied once) */
    double high_watermark;       /* DECODE: used / committed above it -> grow; in (0, 1], default 0.85 */
    double low_watermark;        /* IDLE: shrink until used / committed >= it; in (0, high), default 0.30 */
    uint32_t idle_decay_ms;      /* how long IDLE must last before shrinking; default 1000 */
    size_t grow_min_bytes;       /* the first grow step; default 4 MiB */
    double grow_factor;          /* each grow step this much larger than the last, >= 1; default 2 */
    size_t grow_max_bytes;       /* cap on one grow step, >= grow_min_bytes; default 256 MiB */
    double compact_threshold;    /* IDLE: fragmentation above it -> compact; in (0, 1], default 0.40
                                    (1 disables compaction) */
    size_t compact_budget_bytes; /* bytes one compaction may move; default 64 MiB */
    size_t event_capacity;       /* events kept (a ring: the oldest are dropped and counted); default 4096 */
    llmem_clock_fn clock;        /* default: the monotonic clock */
    void *clock_ctx;
} llmem_controller_options;

LLMEM_API llmem_controller_options llmem_controller_options_default(void);

/* LLMEM_EINVAL: null o, out or pool; safety_factor below 1; watermarks not
 * 0 < low < high <= 1; grow_factor below 1; grow_max_bytes below
 * grow_min_bytes; compact_threshold outside (0, 1]; NaN anywhere.
 * LLMEM_EOVERFLOW, LLMEM_ENOMEM for the event ring. */
LLMEM_API llmem_status llmem_controller_create(const llmem_controller_options *o, llmem_controller **out);

/* NULL is a no-op. The pool keeps whatever the controller reserved. */
LLMEM_API void llmem_controller_destroy(llmem_controller *c);

/* An engine's on_step_done (with stage_ctx = the controller): a step's
 * measured activation peak goes to the predictor's online corrector
 * (llmem_predictor_observe), whose corrected reserve the next prefills use
 * once it predicts better than the formulas. Without a predictor, or for
 * figures the predictor refuses, nothing happens. */
LLMEM_API void llmem_controller_on_step_done(void *controller, uint32_t batch, uint32_t tokens, uint32_t context,
                                             uint64_t measured_bytes);

/* An llmem_stage_fn: pass it as an engine's on_stage with stage_ctx = the
 * controller. Records a STAGE event when the stage changes, counts the
 * event in the controller's stats, acts as the policy above says and
 * runs tick()'s housekeeping. NULL arguments and unknown stages do nothing.
 * Never fails: what the pool refuses becomes a FAIL event. */
LLMEM_API void llmem_controller_on_stage(void *controller, const llmem_stage_event *ev);

/* Idle housekeeping (shrink, compact) when IDLE has lasted the decay delay;
 * nothing otherwise. A server loop calls it periodically, from any thread.
 * NULL is a no-op. */
LLMEM_API void llmem_controller_tick(llmem_controller *c);

/* Copy up to cap of the kept events, oldest first; returns how many were
 * copied (0 for NULL c, or NULL out with cap > 0). */
LLMEM_API size_t llmem_controller_events(const llmem_controller *c, llmem_controller_event *out, size_t cap);

/* The kept events as JSON lines, oldest first:
 *   {"t_ms":12.345,"stage":"prefill","action":"reserve","before":0,"after":41943040,
 *    "reason":"...","detail":40265318}
 * t_ms counts from the controller's creation. LLMEM_EINVAL for null
 * arguments, LLMEM_EIO if the stream reports an error. The controller is
 * not locked while the stream is written. */
LLMEM_API llmem_status llmem_controller_write_events(const llmem_controller *c, FILE *f);

/* The fields of llmem_controller_stats after struct_size, in order: X(kind, value type,
 * name, help) for each; the struct and its schema are both made from it. */
#define LLMEM_CONTROLLER_STATS_FIELDS(X) \
    /* the current llmem_stage */ \
    X(GAUGE, U64, stage, "The current stage (0 idle, 1 load, 2 prefill, 3 decode).") \
    /* events recorded */ \
    X(COUNTER, U64, events_total, "Decisions recorded.") \
    /* of those, pushed out of the ring */ \
    X(COUNTER, U64, events_dropped, "Events pushed out of the ring.") \
    /* prefill reserves made */ \
    X(COUNTER, U64, reserves_total, "Reserves taken before a prefill.") \
    /* decode grows made */ \
    X(COUNTER, U64, grows_total, "Grows past the high watermark in decode.") \
    /* idle shrinks made */ \
    X(COUNTER, U64, shrinks_total, "Shrinks to the low watermark after the idle decay.") \
    /* idle compactions made */ \
    X(COUNTER, U64, compactions_total, "Compactions of handle blocks when idle.") \
    X(COUNTER, U64, failures_total, "Reserves, grows and compactions the pool refused.") \
    X(COUNTER, U64, bytes_reserved_ahead_total, "Committed bytes added by prefill reserves.") \
    X(COUNTER, U64, bytes_grown_total, "Committed bytes added by decode grows.") \
    X(COUNTER, U64, bytes_released_total, "Bytes given back by shrinks and compactions.") \
    X(COUNTER, U64, bytes_compacted_total, "Bytes moved by compactions.") \
    X(GAUGE, U64, grow_step_bytes, "The next grow step.") \
    /* stage events that changed the stage (from IDLE at create) */ \
    X(COUNTER, U64, stage_changes_total, "Stage events that changed the stage.") \
    /* PREFILL events */ \
    X(COUNTER, U64, prefill_steps_total, "Prefill stage events.") \
    /* DECODE events */ \
    X(COUNTER, U64, decode_steps_total, "Decode stage events.")

typedef struct llmem_controller_stats {
    size_t struct_size;
    LLMEM_CONTROLLER_STATS_FIELDS(LLMEM_STATS_MEMBER)
} llmem_controller_stats;

/* LLMEM_EINVAL for null arguments. struct_size as for every stats struct. */
LLMEM_API llmem_status llmem_controller_get_stats(const llmem_controller *c, llmem_controller_stats *out);
LLMEM_API const llmem_stats_schema *llmem_controller_stats_schema(void);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_CONTROLLER_H */
