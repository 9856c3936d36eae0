/*
 * llmem/stats.h - stats schemas and the one exporter (Prometheus text, JSON).
 *
 * Every llmem component reports its figures in a plain stats struct that
 * starts with `size_t struct_size` (so the struct can grow without breaking
 * old callers) and whose other fields are uint64_t counters and gauges or
 * double ratios. Each component also publishes a schema: a static table that
 * names every field, its type, unit and help text. The exporter walks a
 * schema over a struct, so any stats struct - today's and those later
 * modules add - renders as Prometheus text or JSON without per-type code.
 *
 * Usage:
 *
 *     llmem_arena_stats st = {0};              // struct_size 0 = whole struct
 *     llmem_arena_get_stats(arena, &st);
 *     llmem_label lb[] = {{"arena", "request"}};
 *     llmem_exporter *ex;
 *     llmem_exporter_create(LLMEM_EXPORT_PROMETHEUS, &ex);
 *     llmem_exporter_add(ex, llmem_arena_stats_schema(), &st, lb, 1);
 *     llmem_exporter_write(ex, stdout);       // or _render into a buffer
 *     llmem_exporter_destroy(ex);
 *
 * Prometheus output groups samples by metric family (one HELP and TYPE line
 * per family, however many objects were added), names metrics
 * `llmem_<schema>_<field>`, and ends counters in `_total`. JSON output is an
 * array of objects {"type": schema, "labels": {...}, "<field>": value...}.
 */
#ifndef LLMEM_STATS_H
#define LLMEM_STATS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum llmem_metric_kind {
    LLMEM_METRIC_GAUGE = 0,   /* a level that goes up and down */
    LLMEM_METRIC_COUNTER = 1  /* a monotonic total since creation */
} llmem_metric_kind;

typedef enum llmem_value_type {
    LLMEM_VALUE_U64 = 0,      /* uint64_t field */
    LLMEM_VALUE_DOUBLE = 1    /* double field */
} llmem_value_type;

/* One field of a stats struct. */
typedef struct llmem_stat_field {
    const char *name;         /* metric suffix, snake_case, e.g. "used_bytes" */
    const char *help;         /* one line for Prometheus HELP */
    llmem_metric_kind kind;
    llmem_value_type type;
    size_t offset;            /* offsetof(struct, field) */
} llmem_stat_field;

/* A stats struct's fields are spelled once, as a list
 * LLMEM_<THING>_STATS_FIELDS(X) of X(kind, value type, name, help) entries
 * (kind GAUGE or COUNTER, value type U64 or DOUBLE, help the one line for
 * Prometheus HELP). The public struct is `size_t struct_size;` followed by
 * the list with X = LLMEM_STATS_MEMBER, a plain uint64_t or double field per
 * entry, in list order; the library makes the schema's rows from the same
 * list, so the two cannot drift apart. */
#define LLMEM_STATS_CTYPE_U64 uint64_t
#define LLMEM_STATS_CTYPE_DOUBLE double
#define LLMEM_STATS_MEMBER(kind, vtype, name, help) LLMEM_STATS_CTYPE_##vtype name;

/* A stats struct's description. */
typedef struct llmem_stats_schema {
    const char *name;         /* component name: "arena", "fixed", "resource"... */
    size_t struct_size;       /* sizeof the struct this schema describes */
    size_t field_count;
    const llmem_stat_field *fields;
    const char *prefix;       /* Prometheus: metric names are prefix + field instead of
                                 llmem_<name>_<field> (e.g. "vllm:", names dashboards already
                                 graph); [a-zA-Z_:][a-zA-Z0-9_:]*. NULL = llmem_<name>_ */
} llmem_stats_schema;

/* A label attached to every sample of one exported object. Keys must match
 * [a-zA-Z_][a-zA-Z0-9_]*; values are escaped as each format requires. */
typedef struct llmem_label {
    const char *key;
    const char *value;
} llmem_label;

typedef enum llmem_export_format {
    LLMEM_EXPORT_PROMETHEUS = 0, /* text exposition format 0.0.4 */
    LLMEM_EXPORT_JSON = 1
} llmem_export_format;

/* The size a stats function may fill for a caller's struct: struct_size 0
 * means "all of it" (a caller compiled against the current header);
 * otherwise min(struct_size, current size). Components use this; callers
 * normally just zero-initialise their struct. */
LLMEM_API size_t llmem_stats_fill_size(size_t caller_struct_size, size_t current_size);

/* Render one stats struct as a single JSON object into buf (NUL-terminated).
 * Writes at most cap bytes; *len (optional) receives the length needed
 * without the NUL. LLMEM_ERANGE when cap is too small (buf then holds a
 * truncated, NUL-terminated prefix if cap > 0). Fields beyond the struct's
 * struct_size are omitted. */
LLMEM_API llmem_status llmem_stats_to_json(const llmem_stats_schema *schema, const void *stats,
                                           const llmem_label *labels, size_t label_count,
                                           char *buf, size_t cap, size_t *len);

/* ---- the exporter: many objects, one document --------------------------- */

typedef struct llmem_exporter llmem_exporter;

LLMEM_API llmem_status llmem_exporter_create(llmem_export_format format, llmem_exporter **out);

/* Destroys the exporter; NULL is a no-op. */
LLMEM_API void llmem_exporter_destroy(llmem_exporter *ex);

/* Snapshot one stats struct (copied now) with its labels (copied now). */
LLMEM_API llmem_status llmem_exporter_add(llmem_exporter *ex, const llmem_stats_schema *schema,
                                          const void *stats, const llmem_label *labels,
                                          size_t label_count);

/* A histogram in Prometheus's shape: cumulative counts at increasing
 * finite upper bounds, then every observation (the +Inf bucket) and their
 * sum. Prometheus renders name_bucket{...,le="B"}, name_sum, name_count
 * (one HELP and TYPE per name however many are added); JSON an object
 * {"type":"histogram","name":...,"labels":{...},"le":[...],
 * "cumulative":[...],"count":N,"sum":S}. */
typedef struct llmem_histogram_export {
    const char *name;             /* the whole metric name, [a-zA-Z_:][a-zA-Z0-9_:]* */
    const char *help;             /* NULL = none */
    size_t buckets;               /* finite bounds, at most 4096 */
    const double *le;             /* [buckets], strictly increasing, finite */
    const uint64_t *cumulative;   /* [buckets], non-decreasing, each <= count */
    uint64_t count;
    double sum;
} llmem_histogram_export;

/* Snapshot one histogram (its arrays and labels copied now). LLMEM_EINVAL
 * for a bad name, bounds out of order, counts that are not cumulative. */
LLMEM_API llmem_status llmem_exporter_add_histogram(llmem_exporter *ex, const llmem_histogram_export *h,
                                                    const llmem_label *labels, size_t label_count);

/* Drop every snapshot, keeping the format, to reuse the exporter. */
LLMEM_API void llmem_exporter_clear(llmem_exporter *ex);

/* Render everything added so far. Same buffer contract as
 * llmem_stats_to_json. */
LLMEM_API llmem_status llmem_exporter_render(const llmem_exporter *ex, char *buf, size_t cap,
                                             size_t *len);

/* Render to a stream. LLMEM_EIO if the stream reports an error. */
LLMEM_API llmem_status llmem_exporter_write(const llmem_exporter *ex, FILE *f);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_STATS_H */
