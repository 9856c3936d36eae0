/*
 * llmem/timeline.h - memory over time, written as a self-contained HTML page.
 *
 * A timeline records samples of a pool's figures (reserved, committed and
 * used bytes, KV utilisation, the stage of inference) and the decisions
 * taken about memory (events: time, stage, action, bytes before and after,
 * a line of text). llmem_timeline_write_html draws them: one HTML file with
 * inline CSS and an inline SVG chart - stage bands in the background,
 * reserved bytes as a light area, committed as a line, used as a stronger
 * area, KV utilisation dashed on a 0-100% axis, events as markers along the
 * top - a summary line above and the table of events below. The page needs
 * no network and no script (a few lines of inline JS add a hover readout).
 *
 * Memory: everything is allocated by llmem_timeline_create. Sampling and
 * events never allocate, so they may be called from an inference loop that
 * must not call malloc. Past max_samples the timeline decimates: it drops
 * every other sample kept so far and from then on keeps one sample in two
 * of those that arrive (one in four after the next halving, ...), so a run
 * of any length fits; the first sample and the latest one are always kept.
 * The summary's peaks cover every sample, kept or dropped. Events live in
 * a ring of LLMEM_TIMELINE_MAX_EVENTS: the oldest go first, and the page
 * says how many were dropped (the per-action counts cover them all).
 *
 * Not thread-safe: one thread samples, or the caller serialises.
 *
 *     llmem_timeline *tl;
 *     llmem_timeline_create(0, &tl);
 *     ...every step:
 *     llmem_timeline_sample s = {now_ns, stage, reserved, committed, used, kv_util};
 *     llmem_timeline_record(tl, &s);
 *     ...on a decision:
 *     llmem_timeline_event(tl, now_ns, stage, "grow", "used 87% > 85%", before, after);
 *     ...at the end:
 *     llmem_timeline_write_html(tl, "run.html", "llmem run: stories15M");
 *     llmem_timeline_destroy(tl);
 */
#ifndef LLMEM_TIMELINE_H
#define LLMEM_TIMELINE_H

#include <stddef.h>
#include <stdint.h>

#include "llmem/stage.h"
#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_timeline llmem_timeline;

#define LLMEM_TIMELINE_DEFAULT_SAMPLES 100000u /* max_samples when 0 is given */
#define LLMEM_TIMELINE_MAX_EVENTS 4096u         /* events kept (a ring: the newest) */
#define LLMEM_TIMELINE_ACTION_LEN 32u           /* bytes kept of an action name, NUL included */
#define LLMEM_TIMELINE_TEXT_LEN 160u            /* bytes kept of an event's text, NUL included */

typedef struct llmem_timeline_sample {
    uint64_t time_ns;         /* llmem_time_now_ns; the first sample is t = 0 on the chart; a time
                                 earlier than the previous sample's is taken as that one's */
    llmem_stage stage;        /* the stage the process is in at time_ns */
    uint64_t reserved_bytes;  /* address space the pool holds (mapped) */
    uint64_t committed_bytes; /* of which backed by memory */
    uint64_t used_bytes;      /* of which handed out */
    double kv_utilization;    /* KV cache slots in use / slots held, 0..1; negative when unknown */
} llmem_timeline_sample;

/* A timeline that keeps at most max_samples samples (0: 100000; at least
 * 2) and the newest LLMEM_TIMELINE_MAX_EVENTS events. All its memory is
 * allocated here (about 48 bytes a sample and 230 an event). LLMEM_EINVAL
 * for a null out or max_samples 1; LLMEM_EOVERFLOW / LLMEM_ENOMEM when
 * the arrays cannot be allocated. */
LLMEM_API llmem_status llmem_timeline_create(size_t max_samples, llmem_timeline **out);

/* Free the timeline; NULL does nothing. */
LLMEM_API void llmem_timeline_destroy(llmem_timeline *t);

/* Record a sample (copied). Never allocates; past max_samples it
 * decimates (see the top of this file). LLMEM_EINVAL for null arguments
 * or a stage out of range. (Not named llmem_timeline_sample: in C a
 * function and a type share one namespace, and the type has that name.) */
LLMEM_API llmem_status llmem_timeline_record(llmem_timeline *t, const llmem_timeline_sample *s);

/* Record an event: at time_ns (same clock as the samples), in stage, an
 * action ("reserve", "grow", "shrink", "compact", ...; copied, truncated
 * to LLMEM_TIMELINE_ACTION_LEN - 1 bytes; NULL or "" is "event"), a line
 * of text (copied, truncated at LLMEM_TIMELINE_TEXT_LEN - 1 bytes on a
 * UTF-8 character boundary; NULL is ""), and the bytes (reserved, say)
 * before and after. Never allocates. LLMEM_EINVAL for a null timeline or
 * a stage out of range. */
LLMEM_API llmem_status llmem_timeline_event(llmem_timeline *t, uint64_t time_ns, llmem_stage stage,
                                            const char *action, const char *text, uint64_t bytes_before,
                                            uint64_t bytes_after);

/* Samples kept now (at most max_samples), and the i-th of them (oldest
 * first; LLMEM_ERANGE past the end, LLMEM_EINVAL for null arguments). */
LLMEM_API size_t llmem_timeline_sample_count(const llmem_timeline *t);
LLMEM_API llmem_status llmem_timeline_get_sample(const llmem_timeline *t, size_t i, llmem_timeline_sample *out);

/* Events kept now (at most LLMEM_TIMELINE_MAX_EVENTS) and recorded in all. */
LLMEM_API size_t llmem_timeline_event_count(const llmem_timeline *t);
LLMEM_API uint64_t llmem_timeline_events_total(const llmem_timeline *t);

/* Write the page to path (through path.tmp, renamed over path when
 * complete, so a reader never sees half a page). title (NULL: "llmem
 * timeline") is escaped. With no samples the page says so and still lists
 * the events. LLMEM_EINVAL for a null timeline or path; LLMEM_EIO when the
 * file cannot be written (the message has the path and the system's
 * reason; no file is left behind); LLMEM_ENOMEM for a path too long to
 * copy. */
LLMEM_API llmem_status llmem_timeline_write_html(const llmem_timeline *t, const char *path, const char *title);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_TIMELINE_H */
