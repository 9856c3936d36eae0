/*
 * stats.c - render stats structs through their schemas.
 *
 * The exporter keeps snapshots (a copy of each struct and its labels) and
 * renders them on demand. Prometheus text groups samples by family: for
 * each schema name in order of first appearance, each field gets its HELP
 * and TYPE lines once, followed by one sample per snapshot of that schema.
 * Histograms (llmem_exporter_add_histogram) are snapshots without a
 * schema, grouped the same way by their name. A schema with a prefix
 * names its metrics prefix + field (vLLM's "vllm:..." names).
 * Output is built in a growable buffer and then copied out, so the
 * caller-buffer contract (length needed, LLMEM_ERANGE, truncated prefix) is
 * the same for every entry point.
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "llmem/stats.h"
#include "sbuf.h"

size_t llmem_stats_fill_size(size_t caller_struct_size, size_t current_size)
{
    if (caller_struct_size == 0 || caller_struct_size > current_size) return current_size;
    return caller_struct_size;
}

llmem_status llmem__stats_out_locked(void *out, const void *guarded, size_t size, pthread_mutex_t *lock)
{
    size_t caller, n;
    memcpy(&caller, out, sizeof caller);
    n = llmem_stats_fill_size(caller, size);
    pthread_mutex_lock(lock);
    memcpy(out, guarded, n);
    pthread_mutex_unlock(lock);
    memcpy(out, &n, sizeof n);
    return LLMEM_OK;
}

/* ---- validation -------------------------------------------------------- */

static bool valid_key(const char *k)
{
    if (!k || !*k) return false;
    for (const char *c = k; *c; c++) {
        bool alpha = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || *c == '_';
        bool digit = *c >= '0' && *c <= '9';
        if (!(alpha || (digit && c != k))) return false;
    }
    return true;
}

/* A Prometheus metric name (or its start): [a-zA-Z_:][a-zA-Z0-9_:]*. */
static bool valid_metric(const char *k)
{
    if (!k || !*k) return false;
    for (const char *c = k; *c; c++) {
        bool alpha = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || *c == '_' || *c == ':';
        bool digit = *c >= '0' && *c <= '9';
        if (!(alpha || (digit && c != k))) return false;
    }
    return true;
}

static llmem_status check_labels(const llmem_label *labels, size_t label_count)
{
    if (label_count && !labels) return llmem__fail(LLMEM_EINVAL, "stats export: null labels with count %zu", label_count);
    for (size_t i = 0; i < label_count; i++) {
        if (!valid_key(labels[i].key))
            return llmem__fail(LLMEM_EINVAL, "stats export: label key '%s' is not [a-zA-Z_][a-zA-Z0-9_]*",
                               labels[i].key ? labels[i].key : "(null)");
        if (!labels[i].value) return llmem__fail(LLMEM_EINVAL, "stats export: label '%s' has a null value", labels[i].key);
    }
    return LLMEM_OK;
}

static llmem_status check_args(const llmem_stats_schema *schema, const void *stats,
                               const llmem_label *labels, size_t label_count)
{
    if (!schema || !stats) return llmem__fail(LLMEM_EINVAL, "stats export: null schema or stats");
    if (!valid_key(schema->name) || !schema->fields || schema->struct_size < sizeof(size_t) ||
        (schema->prefix && !valid_metric(schema->prefix)))
        return llmem__fail(LLMEM_EINVAL, "stats export: malformed schema");
    return check_labels(labels, label_count);
}

static llmem_status check_histogram(const llmem_histogram_export *h)
{
    if (!h || !valid_metric(h->name) || (h->buckets && (!h->le || !h->cumulative)) || h->buckets > 4096)
        return llmem__fail(LLMEM_EINVAL, "stats export: malformed histogram");
    for (size_t i = 0; i < h->buckets; i++) {
        if (!isfinite(h->le[i]) || (i && !(h->le[i] > h->le[i - 1])))
            return llmem__fail(LLMEM_EINVAL, "histogram %s: bound %zu is not finite and above the one before", h->name, i);
        if (h->cumulative[i] > h->count || (i && h->cumulative[i] < h->cumulative[i - 1]))
            return llmem__fail(LLMEM_EINVAL, "histogram %s: bucket %zu is not cumulative", h->name, i);
    }
    return LLMEM_OK;
}

/* ---- formatting -------------------------------------------------------- */

static void put_prom_escaped(llmem__sbuf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\') llmem__sbuf_puts(b, "\\\\");
        else if (*s == '"') llmem__sbuf_puts(b, "\\\"");
        else if (*s == '\n') llmem__sbuf_puts(b, "\\n");
        else llmem__sbuf_putc(b, *s);
    }
}

static void put_json_string(llmem__sbuf *b, const char *s) { llmem__json_str(b, s, strlen(s)); }

static bool field_present(const llmem_stat_field *f, size_t have)
{
    size_t w = f->type == LLMEM_VALUE_DOUBLE ? sizeof(double) : sizeof(uint64_t);
    return f->offset + w <= have;
}

static void put_value(llmem__sbuf *b, const llmem_stat_field *f, const unsigned char *base, bool json)
{
    if (f->type == LLMEM_VALUE_DOUBLE) {
        double v;
        memcpy(&v, base + f->offset, sizeof v);
        if (isnan(v)) llmem__sbuf_puts(b, json ? "null" : "NaN");
        else if (isinf(v)) llmem__sbuf_puts(b, json ? "null" : (v > 0 ? "+Inf" : "-Inf"));
        else llmem__sbuf_printf(b, "%.17g", v);
    } else {
        uint64_t v;
        memcpy(&v, base + f->offset, sizeof v);
        llmem__sbuf_printf(b, "%llu", (unsigned long long)v);
    }
}

static void put_json_object(llmem__sbuf *b, const llmem_stats_schema *s, const unsigned char *stats, size_t have,
                            const llmem_label *labels, size_t nl)
{
    llmem__sbuf_puts(b, "{\"type\":");
    put_json_string(b, s->name);
    llmem__sbuf_puts(b, ",\"labels\":{");
    for (size_t i = 0; i < nl; i++) {
        if (i) llmem__sbuf_putc(b, ',');
        put_json_string(b, labels[i].key);
        llmem__sbuf_putc(b, ':');
        put_json_string(b, labels[i].value);
    }
    llmem__sbuf_putc(b, '}');
    for (size_t i = 0; i < s->field_count; i++) {
        const llmem_stat_field *f = &s->fields[i];
        if (!field_present(f, have)) continue;
        llmem__sbuf_putc(b, ',');
        put_json_string(b, f->name);
        llmem__sbuf_putc(b, ':');
        put_value(b, f, stats, true);
    }
    llmem__sbuf_putc(b, '}');
}

/* Bytes of `stats` the schema may read: what the caller's struct_size says. */
static size_t stats_have(const llmem_stats_schema *s, const void *stats)
{
    size_t declared;
    memcpy(&declared, stats, sizeof declared);
    return llmem_stats_fill_size(declared, s->struct_size);
}

static llmem_status copy_out(llmem__sbuf *b, char *buf, size_t cap, size_t *len)
{
    if (b->failed) {
        llmem__sbuf_free(b);
        return llmem__fail(LLMEM_ENOMEM, "stats export: out of memory building the document");
    }
    size_t need = b->len;
    if (len) *len = need;
    if (buf && cap > 0) {
        size_t n = need < cap ? need : cap - 1;
        memcpy(buf, b->data ? b->data : "", n);
        buf[n] = '\0';
    }
    llmem__sbuf_free(b);
    if (need >= cap || !buf)
        return llmem__fail(LLMEM_ERANGE, "stats export: buffer of %zu bytes too small, %zu needed", buf ? cap : 0,
                           need + 1);
    return LLMEM_OK;
}

llmem_status llmem_stats_to_json(const llmem_stats_schema *schema, const void *stats, const llmem_label *labels,
                                 size_t label_count, char *buf, size_t cap, size_t *len)
{
    llmem_status st = check_args(schema, stats, labels, label_count);
    if (st) return st;
    llmem__sbuf b;
    llmem__sbuf_init(&b);
    put_json_object(&b, schema, stats, stats_have(schema, stats), labels, label_count);
    return copy_out(&b, buf, cap, len);
}

/* ---- the exporter -------------------------------------------------------- */

typedef struct snapshot {
    const llmem_stats_schema *schema; /* NULL: a histogram (hist) */
    llmem_histogram_export hist;      /* name, help, le and cumulative are copies owned here */
    unsigned char *stats; /* schema->struct_size bytes, zero-padded */
    size_t have;          /* bytes valid in stats */
    llmem_label *labels;  /* keys and values point into label_text */
    size_t label_count;
    char *label_text;
} snapshot;

struct llmem_exporter {
    llmem_export_format format;
    snapshot *snaps;
    size_t count, cap;
};

llmem_status llmem_exporter_create(llmem_export_format format, llmem_exporter **out)
{
    if (!out) return llmem__fail(LLMEM_EINVAL, "exporter: null out");
    *out = NULL;
    if (format != LLMEM_EXPORT_PROMETHEUS && format != LLMEM_EXPORT_JSON)
        return llmem__fail(LLMEM_EINVAL, "exporter: unknown format %d", (int)format);
    llmem_exporter *ex = calloc(1, sizeof *ex);
    if (!ex) return llmem__fail(LLMEM_ENOMEM, "exporter: out of memory");
    ex->format = format;
    *out = ex;
    return LLMEM_OK;
}

static void snapshot_free(snapshot *s)
{
    free((void *)(uintptr_t)s->hist.name);
    free((void *)(uintptr_t)s->hist.help);
    free((void *)(uintptr_t)s->hist.le);
    free((void *)(uintptr_t)s->hist.cumulative);
    free(s->stats);
    free(s->labels);
    free(s->label_text);
}

void llmem_exporter_clear(llmem_exporter *ex)
{
    if (!ex) return;
    for (size_t i = 0; i < ex->count; i++) snapshot_free(&ex->snaps[i]);
    ex->count = 0;
}

void llmem_exporter_destroy(llmem_exporter *ex)
{
    if (!ex) return;
    llmem_exporter_clear(ex);
    free(ex->snaps);
    free(ex);
}

/* Room for one more snapshot. */
static llmem_status grow(llmem_exporter *ex)
{
    if (ex->count < ex->cap) return LLMEM_OK;
    size_t ncap = ex->cap ? ex->cap * 2 : 8;
    snapshot *n = realloc(ex->snaps, ncap * sizeof *n);
    if (!n) return llmem__fail(LLMEM_ENOMEM, "exporter: out of memory");
    ex->snaps = n;
    ex->cap = ncap;
    return LLMEM_OK;
}

/* The labels copied into s (one block of text). */
static bool copy_labels(snapshot *s, const llmem_label *labels, size_t label_count)
{
    s->label_count = label_count;
    size_t text = 1;
    for (size_t i = 0; i < label_count; i++) text += strlen(labels[i].key) + strlen(labels[i].value) + 2;
    s->label_text = malloc(text);
    s->labels = label_count ? calloc(label_count, sizeof *s->labels) : NULL;
    if (!s->label_text || (label_count && !s->labels)) return false;
    char *p = s->label_text;
    for (size_t i = 0; i < label_count; i++) {
        size_t kl = strlen(labels[i].key) + 1, vl = strlen(labels[i].value) + 1;
        memcpy(p, labels[i].key, kl);
        s->labels[i].key = p;
        p += kl;
        memcpy(p, labels[i].value, vl);
        s->labels[i].value = p;
        p += vl;
    }
    return true;
}

llmem_status llmem_exporter_add(llmem_exporter *ex, const llmem_stats_schema *schema, const void *stats,
                                const llmem_label *labels, size_t label_count)
{
    if (!ex) return llmem__fail(LLMEM_EINVAL, "exporter: null exporter");
    llmem_status st = check_args(schema, stats, labels, label_count);
    if (st || (st = grow(ex))) return st;
    snapshot s = {.schema = schema};
    s.have = stats_have(schema, stats);
    s.stats = calloc(1, schema->struct_size);
    if (!s.stats || !copy_labels(&s, labels, label_count)) {
        snapshot_free(&s);
        return llmem__fail(LLMEM_ENOMEM, "exporter: out of memory");
    }
    memcpy(s.stats, stats, s.have);
    ex->snaps[ex->count++] = s;
    return LLMEM_OK;
}

llmem_status llmem_exporter_add_histogram(llmem_exporter *ex, const llmem_histogram_export *h,
                                          const llmem_label *labels, size_t label_count)
{
    if (!ex) return llmem__fail(LLMEM_EINVAL, "exporter: null exporter");
    llmem_status st = check_histogram(h);
    if (st || (st = check_labels(labels, label_count)) || (st = grow(ex))) return st;
    snapshot s = {.schema = NULL};
    s.hist = *h;
    s.hist.name = strdup(h->name);
    s.hist.help = h->help ? strdup(h->help) : NULL;
    double *le = malloc((h->buckets ? h->buckets : 1) * sizeof *le);
    uint64_t *cum = malloc((h->buckets ? h->buckets : 1) * sizeof *cum);
    s.hist.le = le;
    s.hist.cumulative = cum;
    if (!s.hist.name || (h->help && !s.hist.help) || !le || !cum || !copy_labels(&s, labels, label_count)) {
        snapshot_free(&s);
        return llmem__fail(LLMEM_ENOMEM, "exporter: out of memory");
    }
    if (h->buckets) {
        memcpy(le, h->le, h->buckets * sizeof *le);
        memcpy(cum, h->cumulative, h->buckets * sizeof *cum);
    }
    ex->snaps[ex->count++] = s;
    return LLMEM_OK;
}

/* The shortest %g that reads back as v, without an exponent where plain
 * digits do (bucket bounds: "0.005" and "10", not "0.0050000000000000001"
 * or "1e+01"). */
static void put_bound(llmem__sbuf *b, double v)
{
    char t[40];
    bool plain_ok = fabs(v) >= 1e-4 && fabs(v) < 1e16;
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(t, sizeof t, "%.*g", prec, v);
        if (strtod(t, NULL) == v && (!plain_ok || !strchr(t, 'e'))) break;
    }
    llmem__sbuf_puts(b, t);
}

/* {k="v",...} plus an extra pair (le) when extra_key is not NULL; nothing
 * when there is nothing to say. */
static void put_prom_labels(llmem__sbuf *b, const snapshot *s, const char *extra_key, double extra, bool inf)
{
    if (!s->label_count && !extra_key) return;
    llmem__sbuf_putc(b, '{');
    for (size_t l = 0; l < s->label_count; l++) {
        llmem__sbuf_printf(b, "%s%s=\"", l ? "," : "", s->labels[l].key);
        put_prom_escaped(b, s->labels[l].value);
        llmem__sbuf_putc(b, '"');
    }
    if (extra_key) {
        llmem__sbuf_printf(b, "%s%s=\"", s->label_count ? "," : "", extra_key);
        if (inf) llmem__sbuf_puts(b, "+Inf");
        else put_bound(b, extra);
        llmem__sbuf_putc(b, '"');
    }
    llmem__sbuf_putc(b, '}');
}

static void render_histograms(const llmem_exporter *ex, size_t first, llmem__sbuf *b)
{
    const char *name = ex->snaps[first].hist.name;
    const char *help = ex->snaps[first].hist.help;
    llmem__sbuf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help ? help : "", name);
    for (size_t j = first; j < ex->count; j++) {
        const snapshot *s = &ex->snaps[j];
        if (s->schema || strcmp(s->hist.name, name)) continue;
        for (size_t i = 0; i < s->hist.buckets; i++) {
            llmem__sbuf_printf(b, "%s_bucket", name);
            put_prom_labels(b, s, "le", s->hist.le[i], false);
            llmem__sbuf_printf(b, " %llu\n", (unsigned long long)s->hist.cumulative[i]);
        }
        llmem__sbuf_printf(b, "%s_bucket", name);
        put_prom_labels(b, s, "le", 0, true);
        llmem__sbuf_printf(b, " %llu\n%s_sum", (unsigned long long)s->hist.count, name);
        put_prom_labels(b, s, NULL, 0, false);
        if (isfinite(s->hist.sum)) llmem__sbuf_printf(b, " %.17g\n%s_count", s->hist.sum, name);
        else llmem__sbuf_printf(b, " NaN\n%s_count", name);
        put_prom_labels(b, s, NULL, 0, false);
        llmem__sbuf_printf(b, " %llu\n", (unsigned long long)s->hist.count);
    }
}

static void put_json_histogram(llmem__sbuf *b, const snapshot *s)
{
    llmem__sbuf_puts(b, "{\"type\":\"histogram\",\"name\":");
    put_json_string(b, s->hist.name);
    llmem__sbuf_puts(b, ",\"labels\":{");
    for (size_t i = 0; i < s->label_count; i++) {
        if (i) llmem__sbuf_putc(b, ',');
        put_json_string(b, s->labels[i].key);
        llmem__sbuf_putc(b, ':');
        put_json_string(b, s->labels[i].value);
    }
    llmem__sbuf_puts(b, "},\"le\":[");
    for (size_t i = 0; i < s->hist.buckets; i++) {
        if (i) llmem__sbuf_putc(b, ',');
        put_bound(b, s->hist.le[i]);
    }
    llmem__sbuf_puts(b, "],\"cumulative\":[");
    for (size_t i = 0; i < s->hist.buckets; i++)
        llmem__sbuf_printf(b, i ? ",%llu" : "%llu", (unsigned long long)s->hist.cumulative[i]);
    llmem__sbuf_printf(b, "],\"count\":%llu,\"sum\":", (unsigned long long)s->hist.count);
    if (isfinite(s->hist.sum)) llmem__sbuf_printf(b, "%.17g}", s->hist.sum);
    else llmem__sbuf_puts(b, "null}");
}

/* A schema's metric name for a field. */
static void put_metric_name(llmem__sbuf *b, const llmem_stats_schema *sc, const llmem_stat_field *fd)
{
    if (sc->prefix) llmem__sbuf_printf(b, "%s%s", sc->prefix, fd->name);
    else llmem__sbuf_printf(b, "llmem_%s_%s", sc->name, fd->name);
}

static void render_prometheus(const llmem_exporter *ex, llmem__sbuf *b)
{
    for (size_t i = 0; i < ex->count; i++) {
        const llmem_stats_schema *sc = ex->snaps[i].schema;
        bool seen = false; /* this schema (or histogram) name was rendered by an earlier snapshot */
        for (size_t j = 0; j < i && !seen; j++) {
            const snapshot *o = &ex->snaps[j];
            seen = sc ? o->schema && strcmp(o->schema->name, sc->name) == 0
                      : !o->schema && strcmp(o->hist.name, ex->snaps[i].hist.name) == 0;
        }
        if (seen) continue;
        if (!sc) {
            render_histograms(ex, i, b);
            continue;
        }
        for (size_t f = 0; f < sc->field_count; f++) {
            const llmem_stat_field *fd = &sc->fields[f];
            llmem__sbuf_puts(b, "# HELP ");
            put_metric_name(b, sc, fd);
            llmem__sbuf_printf(b, " %s\n# TYPE ", fd->help ? fd->help : "");
            put_metric_name(b, sc, fd);
            llmem__sbuf_printf(b, " %s\n", fd->kind == LLMEM_METRIC_COUNTER ? "counter" : "gauge");
            for (size_t j = i; j < ex->count; j++) {
                const snapshot *s = &ex->snaps[j];
                if (!s->schema || strcmp(s->schema->name, sc->name) != 0 || !field_present(fd, s->have)) continue;
                put_metric_name(b, sc, fd);
                put_prom_labels(b, s, NULL, 0, false);
                llmem__sbuf_putc(b, ' ');
                put_value(b, fd, s->stats, false);
                llmem__sbuf_putc(b, '\n');
            }
        }
    }
}

static void render(const llmem_exporter *ex, llmem__sbuf *b)
{
    if (ex->format == LLMEM_EXPORT_PROMETHEUS) {
        render_prometheus(ex, b);
        return;
    }
    llmem__sbuf_putc(b, '[');
    for (size_t i = 0; i < ex->count; i++) {
        const snapshot *s = &ex->snaps[i];
        if (i) llmem__sbuf_putc(b, ',');
        if (s->schema) put_json_object(b, s->schema, s->stats, s->have, s->labels, s->label_count);
        else put_json_histogram(b, s);
    }
    llmem__sbuf_puts(b, "]\n");
}

llmem_status llmem_exporter_render(const llmem_exporter *ex, char *buf, size_t cap, size_t *len)
{
    if (!ex) return llmem__fail(LLMEM_EINVAL, "exporter: null exporter");
    llmem__sbuf b;
    llmem__sbuf_init(&b);
    render(ex, &b);
    return copy_out(&b, buf, cap, len);
}

llmem_status llmem_exporter_write(const llmem_exporter *ex, FILE *f)
{
    if (!ex || !f) return llmem__fail(LLMEM_EINVAL, "exporter: null exporter or stream");
    llmem__sbuf b;
    llmem__sbuf_init(&b);
    render(ex, &b);
    if (b.failed) {
        llmem__sbuf_free(&b);
        return llmem__fail(LLMEM_ENOMEM, "exporter: out of memory building the document");
    }
    size_t want = b.len;
    size_t n = want ? fwrite(b.data, 1, want, f) : 0;
    llmem__sbuf_free(&b);
    if (n != want || ferror(f)) return llmem__fail(LLMEM_EIO, "exporter: write failed");
    return LLMEM_OK;
}
