/*
 * timeline.c - memory over time, drawn as one HTML page (see
 * llmem/timeline.h).
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
 *
 * Writing: through an outfile (llmem/outfile.h: a temporary file created
 * exclusively beside PATH, a PATH that is not a regular file refused,
 * fsync and rename), every write checked (the first errno is kept). Every number a browser
 * parses (coordinates, script data) is printed from integers, so the page
 * is the same whatever LC_NUMERIC the process runs with.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "internal.h"
#include "llmem/outfile.h"
#include "llmem/timeline.h"
#include "llmem/version.h"

#define MAX_ACTIONS 16       /* distinct action names counted apart; the rest are "other" */
#define MAX_CHANGES 8192     /* stage changes kept (a ring) */
#define HOVER_POINTS 1200    /* at most this many samples in the hover readout's data */

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

static const tl_event *event_at(const llmem_timeline *t, size_t i) /* i-th oldest */
{
    size_t first = (t->ev_head + LLMEM_TIMELINE_MAX_EVENTS - t->ev_n) % LLMEM_TIMELINE_MAX_EVENTS;
    return &t->ev[(first + i) % LLMEM_TIMELINE_MAX_EVENTS];
}

static const tl_change *change_at(const llmem_timeline *t, size_t i)
{
    size_t first = (t->ch_head + MAX_CHANGES - t->ch_n) % MAX_CHANGES;
    return &t->changes[(first + i) % MAX_CHANGES];
}

/* ---- the look ------------------------------------------------------------ */

/* Soft band colours and the stronger strip along the time axis, per stage. */
static const char *const stage_band[LLMEM_STAGE_COUNT_] = {"#f1f3f6", "#fdf1d8", "#fbe3e8", "#e2f3ea"};
static const char *const stage_strip[LLMEM_STAGE_COUNT_] = {"#b6bfcc", "#e0a526", "#e05a78", "#3aa872"};

static const char *stage_label(llmem_stage s)
{
    static const char *const names[] = {"idle", "load", "prefill", "decode"};
    return (unsigned)s < LLMEM_STAGE_COUNT_ ? names[s] : "?";
}

/* Actions the controller takes get fixed colours; any other name takes the
 * next colour of a second palette, in order of first appearance. */
static const struct {
    const char *name;
    const char *color;
} known_actions[] = {
    {"stage", "#7b8592"},   {"reserve", "#3b6fd8"}, {"grow", "#2f9e5b"},    {"shrink", "#e07a1f"}, {"decommit", "#c9a000"},
    {"release", "#b5651d"}, {"trim", "#8a9a16"},    {"compact", "#8b5cd6"}, {"purge", "#b0890a"},
    {"fail", "#d63a3a"},    {"failure", "#d63a3a"}, {"oom", "#d63a3a"},     {"error", "#d63a3a"},
};
static const char *const other_palette[] = {"#1f9bb5", "#d6458f", "#5a7d0c", "#0f766e",
                                            "#7c4dbd", "#a35a12", "#4a5a70", "#c2410c"};

static void action_colors(const llmem_timeline *t, const char *colors[MAX_ACTIONS + 1])
{
    size_t next = 0;
    for (size_t i = 0; i < t->n_actions; i++) {
        colors[i] = NULL;
        for (size_t k = 0; k < LLMEM_ARRAY_LEN(known_actions); k++)
            if (strcasecmp(t->actions[i].name, known_actions[k].name) == 0) colors[i] = known_actions[k].color;
        if (!colors[i] && (strcasestr(t->actions[i].name, "fail") || strcasestr(t->actions[i].name, "oom")))
            colors[i] = "#d63a3a";
        if (!colors[i]) colors[i] = other_palette[next++ % LLMEM_ARRAY_LEN(other_palette)];
    }
    colors[MAX_ACTIONS] = "#6b7280";
}

/* ---- output -------------------------------------------------------------- */

typedef struct writer {
    FILE *f;
    int err; /* first errno seen, 0 while all is well */
} writer;

static void w_puts(writer *w, const char *s)
{
    if (w->err) return;
    errno = 0;
    if (fputs(s, w->f) == EOF) w->err = errno ? errno : EIO;
}

static void w_printf(writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void w_printf(writer *w, const char *fmt, ...)
{
    if (w->err) return;
    va_list ap;
    va_start(ap, fmt);
    errno = 0;
    if (vfprintf(w->f, fmt, ap) < 0) w->err = errno ? errno : EIO;
    va_end(ap);
}

/* Text for HTML content and attribute values; control characters become
 * spaces. */
static void w_esc(writer *w, const char *s)
{
    char run[256];
    size_t n = 0;
    for (; *s; s++) {
        const char *rep = NULL;
        unsigned char c = (unsigned char)*s;
        switch (c) {
        case '&': rep = "&amp;"; break;
        case '<': rep = "&lt;"; break;
        case '>': rep = "&gt;"; break;
        case '"': rep = "&quot;"; break;
        case '\'': rep = "&#39;"; break;
        default: break;
        }
        if (rep || n + 1 >= sizeof run) {
            run[n] = '\0';
            w_puts(w, run);
            n = 0;
        }
        if (rep)
            w_puts(w, rep);
        else
            run[n++] = (c < 0x20 || c == 0x7f) ? ' ' : (char)c;
    }
    run[n] = '\0';
    w_puts(w, run);
}

/* A coordinate with one decimal, from integers (no locale). */
static void w_coord(writer *w, double v)
{
    if (!(v == v)) v = 0; /* NaN */
    if (v > 1e9) v = 1e9;
    if (v < -1e9) v = -1e9;
    long long tenths = llround(v * 10.0);
    const char *sign = tenths < 0 ? "-" : "";
    if (tenths < 0) tenths = -tenths;
    if (tenths % 10)
        w_printf(w, "%s%lld.%lld", sign, tenths / 10, tenths % 10);
    else
        w_printf(w, "%s%lld", sign, tenths / 10);
}

/* A number for people: `decimals` decimals (trailing zeros dropped when
 * trim), '.' whatever the locale. */
static void fmt_fixed(char *buf, size_t cap, double v, int decimals, bool trim)
{
    if (decimals < 0) decimals = 0;
    if (decimals > 6) decimals = 6;
    double scale = 1;
    for (int i = 0; i < decimals; i++) scale *= 10;
    bool neg = v < 0;
    if (neg) v = -v;
    double r = floor(v * scale + 0.5);
    if (r > 9e18) { /* beyond integers: no decimals needed */
        snprintf(buf, cap, "%s%.0e", neg ? "-" : "", v);
        return;
    }
    unsigned long long q = (unsigned long long)r, s = (unsigned long long)scale;
    unsigned long long ip = q / s, fp = q % s;
    int used = snprintf(buf, cap, "%s%llu", neg && q ? "-" : "", ip);
    if (decimals > 0 && (fp || !trim) && used > 0 && (size_t)used < cap) {
        char frac[24];
        snprintf(frac, sizeof frac, "%0*llu", decimals, fp);
        size_t fl = strlen(frac);
        while (trim && fl > 0 && frac[fl - 1] == '0') frac[--fl] = '\0';
        snprintf(buf + used, cap - (size_t)used, ".%s", frac);
    }
}

static const char *const byte_units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};

/* The binary unit (index) that shows v as 1 <= v / unit < 1024. */
static int byte_unit(double v)
{
    int u = 0;
    while (u < 6 && v >= 1024.0) {
        v /= 1024.0;
        u++;
    }
    return u;
}

/* Bytes with three significant digits: "0 B", "512 MiB", "1.25 GiB". */
static void fmt_bytes(char *buf, size_t cap, double v)
{
    int u = byte_unit(v);
    double x = v / pow(1024.0, u);
    char num[32];
    fmt_fixed(num, sizeof num, x, u == 0 ? 0 : x < 10 ? 2 : x < 100 ? 1 : 0, true);
    snprintf(buf, cap, "%s %s", num, byte_units[u]);
}

static void fmt_delta(char *buf, size_t cap, uint64_t before, uint64_t after)
{
    char b[32];
    if (after >= before) {
        fmt_bytes(b, sizeof b, (double)(after - before));
        snprintf(buf, cap, "+%s", b);
    } else {
        fmt_bytes(b, sizeof b, (double)(before - after));
        snprintf(buf, cap, "\xe2\x88\x92%s", b); /* U+2212 minus */
    }
}

/* 1, 2 or 5 times a power of ten, the smallest >= x. */
static double nice_step(double x)
{
    if (!(x > 0)) return 1;
    double p = pow(10.0, floor(log10(x)));
    double m = x / p;
    return (m <= 1.0 + 1e-9 ? 1 : m <= 2.0 + 1e-9 ? 2 : m <= 5.0 + 1e-9 ? 5 : 10) * p;
}

/* Decimals that show multiples of step exactly (step is nice). */
static int step_decimals(double step)
{
    int d = 0;
    while (d < 6 && fabs(step - floor(step + 0.5)) > 1e-9 * (step > 1 ? step : 1)) {
        step *= 10;
        d++;
    }
    return d;
}

typedef struct time_axis {
    double unit_ns;   /* ns per display unit */
    const char *name; /* "µs", "ms", "s", "min", "h" */
    double step;      /* tick step, in display units */
    int decimals;
} time_axis;

static time_axis time_axis_for(double span_ns)
{
    time_axis a;
    if (span_ns < 1e6) {
        a.unit_ns = 1e3;
        a.name = "\xc2\xb5s";
    } else if (span_ns < 1e9) {
        a.unit_ns = 1e6;
        a.name = "ms";
    } else if (span_ns < 600e9) {
        a.unit_ns = 1e9;
        a.name = "s";
    } else if (span_ns < 3 * 3600e9) {
        a.unit_ns = 60e9;
        a.name = "min";
    } else {
        a.unit_ns = 3600e9;
        a.name = "h";
    }
    a.step = nice_step(span_ns / a.unit_ns / 8.0);
    a.decimals = step_decimals(a.step);
    return a;
}

/* A duration with three significant digits in the unit that suits it
 * ("850 ms", "1.76 s", "8.33 h"). */
static void fmt_duration(char *buf, size_t cap, double ns)
{
    static const struct {
        double ns;
        const char *name;
    } units[] = {{3600e9, "h"}, {60e9, "min"}, {1e9, "s"}, {1e6, "ms"}, {1e3, "\xc2\xb5s"}, {1, "ns"}};
    size_t u = 0;
    while (u + 1 < LLMEM_ARRAY_LEN(units) && ns < units[u].ns * (units[u].ns >= 60e9 ? 2 : 1)) u++;
    double x = ns / units[u].ns;
    char num[32];
    fmt_fixed(num, sizeof num, x, x < 10 ? 2 : x < 100 ? 1 : 0, true);
    snprintf(buf, cap, "%s %s", num, units[u].name);
}

/* A relative time in the axis unit, with a little more precision than the
 * ticks ("-3.5 ms" for an event before the first sample). */
static void fmt_time(char *buf, size_t cap, const time_axis *a, double rel_ns, bool trim)
{
    fmt_fixed(buf, cap, rel_ns / a->unit_ns, a->decimals + 2, trim);
    size_t len = strlen(buf), nl = strlen(a->name);
    if (len + 1 + nl < cap) {
        buf[len] = ' ';
        memcpy(buf + len + 1, a->name, nl + 1);
    }
}

/* ---- the chart ----------------------------------------------------------- */

/* Chart geometry, in SVG user units. */
enum { W = 1100, H = 420, PX0 = 78, PX1 = 1032, PY0 = 46, PY1 = 360, STRIP = 8 };

typedef struct chart {
    const llmem_timeline *t;
    uint64_t t0;         /* time of the first sample */
    double span_ns;      /* > 0 */
    double top_bytes;    /* byte axis top, > 0 */
    double byte_step;    /* tick step in bytes */
    int byte_u;          /* unit of the byte labels */
    int byte_dec;
    bool has_kv;
    time_axis ta;
    const char *colors[MAX_ACTIONS + 1];
} chart;

static double cx(const chart *c, double rel_ns)
{
    double x = PX0 + (PX1 - PX0) * (rel_ns / c->span_ns);
    return x < PX0 ? PX0 : x > PX1 ? PX1 : x;
}
static double cx_at(const chart *c, uint64_t time_ns)
{
    return cx(c, time_ns >= c->t0 ? (double)(time_ns - c->t0) : -(double)(c->t0 - time_ns));
}
static double cy(const chart *c, uint64_t bytes) { return PY1 - (PY1 - PY0) * ((double)bytes / c->top_bytes); }
static double cy_kv(double kv)
{
    if (kv > 1) kv = 1;
    return PY1 - (PY1 - PY0) * kv;
}

static uint64_t field(const llmem_timeline_sample *s, int which)
{
    return which == 0 ? s->reserved_bytes : which == 1 ? s->committed_bytes : s->used_bytes;
}

static void w_point(writer *w, double x, double y)
{
    w_coord(w, x);
    w_puts(w, ",");
    w_coord(w, y);
    w_puts(w, " ");
}

/* The polyline of one byte series; its area (down to the axis) first when
 * area_class is given. */
static void w_series(writer *w, const chart *c, int which, const char *area_class, const char *line_class)
{
    const llmem_timeline *t = c->t;
    if (area_class) {
        w_printf(w, "<polygon class=\"%s\" points=\"", area_class);
        w_point(w, cx_at(c, t->s[0].time_ns), PY1);
        for (size_t i = 0; i < t->n; i++) w_point(w, cx_at(c, t->s[i].time_ns), cy(c, field(&t->s[i], which)));
        w_point(w, cx_at(c, t->s[t->n - 1].time_ns), PY1);
        w_puts(w, "\"/>\n");
    }
    w_printf(w, "<polyline class=\"%s\" points=\"", line_class);
    for (size_t i = 0; i < t->n; i++) w_point(w, cx_at(c, t->s[i].time_ns), cy(c, field(&t->s[i], which)));
    w_puts(w, "\"/>\n");
}

/* KV utilisation: one polyline per run of samples where it is known. */
static void w_kv(writer *w, const chart *c)
{
    const llmem_timeline *t = c->t;
    bool open = false;
    for (size_t i = 0; i < t->n; i++) {
        double kv = t->s[i].kv_utilization;
        if (kv >= 0 && kv == kv) {
            if (!open) w_puts(w, "<polyline class=\"line-kv\" points=\"");
            open = true;
            w_point(w, cx_at(c, t->s[i].time_ns), cy_kv(kv));
        } else if (open) {
            w_puts(w, "\"/>\n");
            open = false;
        }
    }
    if (open) w_puts(w, "\"/>\n");
}

/* A band from..to, in ns since the first sample. */
static void w_band(writer *w, const chart *c, double from, double to, llmem_stage st)
{
    double x0 = cx(c, from), x1 = cx(c, to);
    if (x1 <= x0) return;
    char a[48], b[48];
    fmt_time(a, sizeof a, &c->ta, from, true);
    fmt_time(b, sizeof b, &c->ta, to, true);
    w_printf(w, "<g class=\"band\"><title>%s: %s \xe2\x80\x93 %s</title><rect x=\"", stage_label(st), a, b);
    w_coord(w, x0);
    w_printf(w, "\" y=\"%d\" width=\"", PY0);
    w_coord(w, x1 - x0);
    w_printf(w, "\" height=\"%d\" fill=\"%s\"/><rect x=\"", PY1 - PY0, stage_band[st]);
    w_coord(w, x0);
    w_printf(w, "\" y=\"%d\" width=\"", PY1 + 1);
    w_coord(w, x1 - x0);
    w_printf(w, "\" height=\"%d\" fill=\"%s\"/></g>\n", STRIP, stage_strip[st]);
}

/* Stage bands: from the ring of stage changes; the stretch before its
 * oldest entry (when older ones were dropped) from the kept samples. The
 * last band runs to the last sample, or over the nominal span when all
 * samples share one instant. */
static void w_bands(writer *w, const chart *c)
{
    const llmem_timeline *t = c->t;
#define REL(time) ((double)((time) - c->t0)) /* every time here is >= t0 */
    double end = REL(t->s[t->n - 1].time_ns);
    if (end <= 0) end = c->span_ns;
    uint64_t covered = t->ch_dropped && t->ch_n ? change_at(t, 0)->time_ns : t->s[0].time_ns;
    if (t->ch_dropped) {
        size_t i = 0;
        while (i < t->n && t->s[i].time_ns < covered) {
            size_t j = i + 1;
            while (j < t->n && t->s[j].stage == t->s[i].stage && t->s[j].time_ns < covered) j++;
            uint64_t to = j < t->n && t->s[j].time_ns < covered ? t->s[j].time_ns : covered;
            w_band(w, c, REL(t->s[i].time_ns), REL(to), t->s[i].stage);
            i = j;
        }
    }
    for (size_t i = 0; i < t->ch_n; i++) {
        const tl_change *ch = change_at(t, i);
        double to = i + 1 < t->ch_n ? REL(change_at(t, i + 1)->time_ns) : end;
        w_band(w, c, REL(ch->time_ns), to, ch->stage);
    }
#undef REL
}

static void w_axes(writer *w, const chart *c)
{
    char lab[48];
    /* byte grid and labels */
    w_puts(w, "<g class=\"grid\">\n");
    int nticks = (int)floor(c->top_bytes / c->byte_step + 0.5);
    for (int i = 0; i <= nticks; i++) {
        double v = i * c->byte_step, y = PY1 - (PY1 - PY0) * (v / c->top_bytes);
        w_printf(w, "<line x1=\"%d\" x2=\"%d\" y1=\"", PX0, PX1);
        w_coord(w, y);
        w_puts(w, "\" y2=\"");
        w_coord(w, y);
        w_puts(w, "\"/>\n");
    }
    w_puts(w, "</g>\n<g class=\"tick-y\">\n");
    for (int i = 0; i <= nticks; i++) {
        double v = i * c->byte_step, y = PY1 - (PY1 - PY0) * (v / c->top_bytes);
        fmt_fixed(lab, sizeof lab, v / pow(1024.0, c->byte_u), c->byte_dec, true);
        w_printf(w, "<text x=\"%d\" y=\"", PX0 - 8);
        w_coord(w, y + 4);
        w_printf(w, "\">%s%s%s</text>\n", lab, i == 0 ? "" : " ", i == 0 ? "" : byte_units[c->byte_u]);
    }
    w_puts(w, "</g>\n");
    if (c->has_kv) {
        w_puts(w, "<g class=\"tick-kv\">\n");
        for (int p = 0; p <= 100; p += 25) {
            w_printf(w, "<text x=\"%d\" y=\"", PX1 + 8);
            w_coord(w, cy_kv(p / 100.0) + 4);
            w_printf(w, "\">%d%%</text>\n", p);
        }
        w_printf(w, "<text class=\"axis-title\" transform=\"translate(%d %d) rotate(90)\" text-anchor=\"middle\">"
                    "KV utilisation</text>\n</g>\n",
                 W - 14, (PY0 + PY1) / 2);
    }
    /* time ticks */
    w_puts(w, "<g class=\"tick-x\">\n");
    double span_u = c->span_ns / c->ta.unit_ns;
    int nt = (int)floor(span_u / c->ta.step + 1e-9);
    for (int i = 0; i <= nt; i++) {
        double v = i * c->ta.step, x = cx(c, v * c->ta.unit_ns);
        fmt_fixed(lab, sizeof lab, v, c->ta.decimals, true);
        w_puts(w, "<line x1=\"");
        w_coord(w, x);
        w_puts(w, "\" x2=\"");
        w_coord(w, x);
        w_printf(w, "\" y1=\"%d\" y2=\"%d\"/><text x=\"", PY1 + 1 + STRIP, PY1 + 6 + STRIP);
        w_coord(w, x);
        w_printf(w, "\" y=\"%d\">%s</text>\n", PY1 + STRIP + 21, lab);
    }
    w_printf(w, "<text class=\"axis-title\" x=\"%d\" y=\"%d\">time (%s)</text>\n</g>\n", (PX0 + PX1) / 2, H - 8,
             c->ta.name);
    w_printf(w, "<line class=\"axis\" x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\"/>\n", PX0, PX1, PY1, PY1);
    w_printf(w, "<text class=\"axis-title\" transform=\"translate(16 %d) rotate(-90)\" text-anchor=\"middle\">"
                "memory</text>\n",
             (PY0 + PY1) / 2);
}

static void w_event_markers(writer *w, const chart *c)
{
    const llmem_timeline *t = c->t;
    if (t->ev_n == 0) return;
    char when[48], b[32], a[32];
    w_printf(w, "<line class=\"lane\" x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\"/>\n", PX0, PX1, PY0 - 4, PY0 - 4);
    /* Triangles and dotted guides while they can be told apart; past
     * that, thin ticks that show where decisions cluster. */
    bool sparse = t->ev_n <= 160;
    w_puts(w, "<g class=\"events\">\n");
    for (size_t i = 0; i < t->ev_n; i++) {
        const tl_event *e = event_at(t, i);
        double x = cx_at(c, e->time_ns);
        const char *col = c->colors[e->action];
        fmt_time(when, sizeof when, &c->ta,
                 e->time_ns >= c->t0 ? (double)(e->time_ns - c->t0) : -(double)(c->t0 - e->time_ns), true);
        fmt_bytes(b, sizeof b, (double)e->before);
        fmt_bytes(a, sizeof a, (double)e->after);
        w_printf(w, "<g class=\"ev\"><title>%s \xc2\xb7 %s \xc2\xb7 ", when, stage_label(e->stage));
        w_esc(w, e->action_name);
        w_printf(w, ": %s \xe2\x86\x92 %s", b, a);
        if (e->text[0]) {
            w_puts(w, " \xe2\x80\x94 ");
            w_esc(w, e->text);
        }
        w_puts(w, "</title>");
        if (sparse) {
            w_puts(w, "<line class=\"guide\" x1=\"");
            w_coord(w, x);
            w_puts(w, "\" x2=\"");
            w_coord(w, x);
            w_printf(w, "\" y1=\"%d\" y2=\"%d\" stroke=\"%s\"/>", PY0, PY1, col);
        }
        if (sparse) {
            w_puts(w, "<path d=\"M");
            w_coord(w, x - 5.5);
            w_printf(w, " %dH", PY0 - 20);
            w_coord(w, x + 5.5);
            w_puts(w, "L");
            w_coord(w, x);
            w_printf(w, " %dZ\" fill=\"%s\"/></g>\n", PY0 - 9, col);
        } else {
            w_puts(w, "<rect x=\"");
            w_coord(w, x - 0.6);
            w_printf(w, "\" y=\"%d\" width=\"1.2\" height=\"12\" fill=\"%s\"/></g>\n", PY0 - 20, col);
        }
    }
    w_puts(w, "</g>\n");
}

/* Data for the hover readout: [x in tenths, t_ns, reserved, committed,
 * used, kv per mille or -1, stage], numbers as integers, at most
 * HOVER_POINTS rows. */
static void w_hover_data(writer *w, const chart *c)
{
    const llmem_timeline *t = c->t;
    size_t step = (t->n + HOVER_POINTS - 1) / HOVER_POINTS;
    if (step == 0) step = 1;
    w_puts(w, "[");
    for (size_t i = 0; i < t->n; i += step) {
        if (i + step >= t->n) i = t->n - 1; /* the last row is the latest sample */
        const llmem_timeline_sample *s = &t->s[i];
        double kv = s->kv_utilization;
        long long kvm = kv >= 0 && kv == kv ? llround((kv > 1 ? 1 : kv) * 1000) : -1;
        w_printf(w, "%s[%lld,%llu,%llu,%llu,%llu,%lld,\"%s\"]", i ? "," : "", llround(cx_at(c, s->time_ns) * 10),
                 (unsigned long long)(s->time_ns - c->t0), (unsigned long long)s->reserved_bytes,
                 (unsigned long long)s->committed_bytes, (unsigned long long)s->used_bytes, kvm,
                 stage_label(s->stage));
    }
    w_puts(w, "]");
}

/* ---- the page ------------------------------------------------------------ */

static const char page_css[] =
    "*{box-sizing:border-box}\n"
    "body{margin:0;background:#f4f5f7;color:#1f2733;"
    "font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,'Helvetica Neue',Arial,'Liberation Sans',"
    "'DejaVu Sans',sans-serif}\n"
    "main{max-width:1160px;margin:24px auto;padding:0 16px}\n"
    "h1{font-size:21px;font-weight:650;margin:0 0 4px;letter-spacing:-.01em}\n"
    ".summary{color:#4a5564;margin:0 0 16px}\n"
    ".summary b{color:#1f2733;font-weight:600}\n"
    ".card{background:#fff;border:1px solid #e3e6eb;border-radius:10px;padding:14px 16px 8px;"
    "box-shadow:0 1px 2px rgba(16,24,40,.05);margin-bottom:18px}\n"
    ".legend{display:flex;flex-wrap:wrap;gap:6px 18px;font-size:12.5px;color:#3d4755;margin:0 0 6px 4px}\n"
    ".legend .group{display:flex;flex-wrap:wrap;gap:6px 14px;align-items:center}\n"
    ".legend .head{color:#8a93a0;text-transform:uppercase;font-size:10.5px;letter-spacing:.06em}\n"
    ".key{display:inline-flex;align-items:center;gap:6px;white-space:nowrap}\n"
    ".sw{display:inline-block;width:18px;height:11px;border-radius:2px}\n"
    ".sw.line{height:0;border-top:2.5px solid}\n"
    ".sw.dash{height:2.5px;border-radius:0;background:repeating-linear-gradient(90deg,#d08a1a 0 6px,transparent 6px 9px)}\n"
    ".tri{display:inline-block;width:0;height:0;border-left:6px solid transparent;"
    "border-right:6px solid transparent;border-top:9px solid}\n"
    "svg.chart{display:block;width:100%;height:auto;font-size:12px}\n"
    "svg.chart text{fill:#5b6572;font-family:inherit}\n"
    ".grid line{stroke:#e6e9ee;stroke-width:1}\n"
    ".axis{stroke:#9aa3ae;stroke-width:1}\n"
    ".tick-y text{text-anchor:end}\n"
    ".tick-kv text{text-anchor:start;fill:#b87414!important}\n"
    ".tick-x line{stroke:#9aa3ae}\n"
    ".tick-x text{text-anchor:middle}\n"
    ".axis-title{fill:#7b8592!important;font-size:11.5px;text-anchor:middle;letter-spacing:.03em}\n"
    ".area-reserved{fill:#c9d3f5;fill-opacity:.7}\n"
    ".line-reserved{fill:none;stroke:#8c9ee6;stroke-width:1.2;stroke-linejoin:round}\n"
    ".line-committed{fill:none;stroke:#3949ab;stroke-width:2;stroke-linejoin:round}\n"
    ".area-used{fill:#2bb3a3;fill-opacity:.5}\n"
    ".line-used{fill:none;stroke:#0e7f73;stroke-width:1.6;stroke-linejoin:round}\n"
    ".line-kv{fill:none;stroke:#d08a1a;stroke-width:2;stroke-dasharray:7 4;stroke-linejoin:round}\n"
    ".dot-reserved{fill:#8c9ee6}.dot-committed{fill:#3949ab}.dot-used{fill:#0e7f73}.dot-kv{fill:#d08a1a}\n"
    ".lane{stroke:#e3e6eb}\n"
    ".guide{stroke-width:1;stroke-opacity:.28;stroke-dasharray:2 3}\n"
    ".ev:hover path{stroke:#1f2733;stroke-width:1}\n"
    ".cursor{stroke:#1f2733;stroke-opacity:.45;stroke-width:1;visibility:hidden}\n"
    "#tip{position:absolute;pointer-events:none;background:rgba(31,39,51,.92);color:#fff;font-size:12px;"
    "padding:6px 9px;border-radius:6px;line-height:1.5;display:none;white-space:nowrap}\n"
    ".wrap{position:relative}\n"
    ".empty{padding:36px;text-align:center;color:#6b7480;font-size:15px}\n"
    "h2{font-size:15px;font-weight:620;margin:4px 0 10px}\n"
    "h2 .n{color:#8a93a0;font-weight:400}\n"
    "table{border-collapse:collapse;width:100%;font-size:12.5px}\n"
    "th{text-align:left;font-weight:600;color:#5b6572;border-bottom:1.5px solid #dfe3e8;padding:6px 10px}\n"
    "td{padding:5px 10px;border-bottom:1px solid #eef0f3;vertical-align:top}\n"
    "tr.ev:nth-child(even) td{background:#fafbfc}\n"
    "td.num{font-variant-numeric:tabular-nums;white-space:nowrap}\n"
    "td.t{text-align:right;color:#4a5564}\n"
    ".chip{display:inline-block;padding:0 8px;border-radius:9px;color:#fff;font-size:11.5px;font-weight:600;"
    "line-height:18px}\n"
    ".stage{display:inline-block;padding:0 7px;border-radius:4px;font-size:11.5px;line-height:18px;"
    "color:#2b3440}\n"
    ".up{color:#b45309}.down{color:#15803d}.same{color:#8a93a0}\n"
    ".note{color:#6b7480;font-size:12.5px;margin:8px 0 0}\n"
    "footer{color:#9aa3ae;font-size:11.5px;margin:0 0 24px;text-align:right}\n";

/* Hover readout: a vertical cursor and a box with the nearest sample's
 * figures. The chart is complete without it. */
static const char page_js[] =
    "(function(){var svg=document.querySelector('svg.chart'),tip=document.getElementById('tip'),"
    "cur=document.getElementById('cursor');if(!svg||!tip||!cur)return;\n"
    "var d=JSON.parse(document.getElementById('tl-data').textContent),u=document.body.dataset.tunit,"
    "un=+document.body.dataset.tns;\n"
    "function b(v){var k=['B','KiB','MiB','GiB','TiB','PiB','EiB'],i=0;while(v>=1024&&i<6){v/=1024;i++}"
    "return (i?v.toPrecision(3):v)+' '+k[i]}\n"
    "svg.addEventListener('mousemove',function(e){var p=svg.createSVGPoint();p.x=e.clientX;p.y=e.clientY;"
    "var q=p.matrixTransform(svg.getScreenCTM().inverse()),x=q.x*10,lo=0,hi=d.length-1;"
    "if(x<d[0][0]-100||x>d[hi][0]+100){tip.style.display='none';cur.style.visibility='hidden';return}"
    "while(hi-lo>1){var m=(lo+hi)>>1;if(d[m][0]<x)lo=m;else hi=m}"
    "var r=(Math.abs(d[hi][0]-x)<Math.abs(d[lo][0]-x))?d[hi]:d[lo];"
    "cur.setAttribute('x1',r[0]/10);cur.setAttribute('x2',r[0]/10);cur.style.visibility='visible';"
    "tip.innerHTML='<b>'+(r[1]/un).toPrecision(4)+' '+u+'</b> \\u00b7 '+r[6]+'<br>reserved '+b(r[2])+'<br>committed '+b(r[3])"
    "+'<br>used '+b(r[4])+(r[5]>=0?'<br>KV '+(r[5]/10).toFixed(1)+'%':'');"
    "var w=svg.parentNode.getBoundingClientRect();tip.style.display='block';"
    "var lx=e.clientX-w.left+14;if(lx>w.width-170)lx=e.clientX-w.left-170;"
    "tip.style.left=lx+'px';tip.style.top=(e.clientY-w.top+12)+'px'});\n"
    "svg.addEventListener('mouseleave',function(){tip.style.display='none';cur.style.visibility='hidden'});"
    "})();\n";

static void w_summary(writer *w, const llmem_timeline *t, double span_ns)
{
    char buf[64];
    w_puts(w, "<p class=\"summary\">");
    if (t->n > 0) {
        fmt_duration(buf, sizeof buf, span_ns);
        w_printf(w, "Duration <b>%s</b>", span_ns > 0 ? buf : "0");
        fmt_bytes(buf, sizeof buf, (double)t->peak_reserved);
        w_printf(w, " \xc2\xb7 peak reserved <b>%s</b>", buf);
        fmt_bytes(buf, sizeof buf, (double)t->peak_committed);
        w_printf(w, ", committed <b>%s</b>", buf);
        fmt_bytes(buf, sizeof buf, (double)t->peak_used);
        w_printf(w, ", used <b>%s</b>", buf);
        w_printf(w, " \xc2\xb7 %llu sample%s", (unsigned long long)t->seen, t->seen == 1 ? "" : "s");
        if (t->stride > 1) w_printf(w, " (%zu drawn, 1 in %llu)", t->n, (unsigned long long)t->stride);
        w_puts(w, " \xc2\xb7 ");
    }
    w_printf(w, "<b>%llu</b> event%s", (unsigned long long)t->ev_total, t->ev_total == 1 ? "" : "s");
    if (t->ev_total > 0) {
        w_puts(w, ": ");
        for (size_t i = 0; i < t->n_actions; i++) {
            w_printf(w, "%s%llu ", i ? ", " : "", (unsigned long long)t->actions[i].count);
            w_esc(w, t->actions[i].name);
        }
        if (t->other_actions) w_printf(w, ", %llu other", (unsigned long long)t->other_actions);
    }
    w_puts(w, "</p>\n");
}

static void w_legend(writer *w, const chart *c)
{
    const llmem_timeline *t = c->t;
    w_puts(w, "<div class=\"legend\"><div class=\"group\"><span class=\"head\">memory</span>"
              "<span class=\"key\"><span class=\"sw\" style=\"background:#c9d3f5;border:1px solid #8c9ee6\">"
              "</span>reserved</span>"
              "<span class=\"key\"><span class=\"sw line\" style=\"border-color:#3949ab\"></span>committed</span>"
              "<span class=\"key\"><span class=\"sw\" style=\"background:#95d9d1;border:1px solid #0e7f73\">"
              "</span>used</span>");
    if (c->has_kv)
        w_puts(w, "<span class=\"key\"><span class=\"sw dash\"></span>KV utilisation (right axis)</span>");
    w_puts(w, "</div><div class=\"group\"><span class=\"head\">stage</span>");
    for (int s = 0; s < LLMEM_STAGE_COUNT_; s++)
        w_printf(w, "<span class=\"key\"><span class=\"sw\" style=\"background:%s;border-bottom:3px solid %s\">"
                    "</span>%s</span>",
                 stage_band[s], stage_strip[s], stage_label((llmem_stage)s));
    w_puts(w, "</div>");
    if (t->n_actions) {
        w_puts(w, "<div class=\"group\"><span class=\"head\">events</span>");
        for (size_t i = 0; i < t->n_actions; i++) {
            w_printf(w, "<span class=\"key\"><span class=\"tri\" style=\"border-top-color:%s\"></span>",
                     c->colors[i]);
            w_esc(w, t->actions[i].name);
            w_puts(w, "</span>");
        }
        if (t->other_actions)
            w_printf(w, "<span class=\"key\"><span class=\"tri\" style=\"border-top-color:%s\"></span>other</span>",
                     c->colors[MAX_ACTIONS]);
        w_puts(w, "</div>");
    }
    w_puts(w, "</div>\n");
}

static void w_chart(writer *w, const chart *c)
{
    const llmem_timeline *t = c->t;
    w_puts(w, "<div class=\"wrap\">\n");
    w_printf(w, "<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 %d %d\" width=\"%d\" "
                "height=\"%d\" role=\"img\" aria-label=\"memory over time\">\n",
             W, H, W, H);
    w_printf(w, "<defs><clipPath id=\"plot\"><rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\"/></clipPath></defs>\n",
             PX0, PY0 - 2, PX1 - PX0, PY1 - PY0 + 2);
    w_puts(w, "<g shape-rendering=\"crispEdges\">\n");
    w_bands(w, c);
    w_puts(w, "</g>\n");
    w_axes(w, c);
    w_puts(w, "<g clip-path=\"url(#plot)\">\n");
    w_series(w, c, 0, "area-reserved", "line-reserved");
    w_series(w, c, 2, "area-used", "line-used");
    w_series(w, c, 1, NULL, "line-committed");
    if (c->has_kv) w_kv(w, c);
    w_puts(w, "</g>\n");
    if (t->n == 1) { /* no line to draw through one point: dots */
        double x = cx_at(c, t->s[0].time_ns);
        static const char *const cls[] = {"dot-reserved", "dot-committed", "dot-used"};
        for (int k = 0; k < 3; k++) {
            w_printf(w, "<circle class=\"%s\" r=\"4\" cx=\"", cls[k]);
            w_coord(w, x);
            w_puts(w, "\" cy=\"");
            w_coord(w, cy(c, field(&t->s[0], k)));
            w_puts(w, "\"/>\n");
        }
        if (c->has_kv) {
            w_puts(w, "<circle class=\"dot-kv\" r=\"4\" cx=\"");
            w_coord(w, x);
            w_puts(w, "\" cy=\"");
            w_coord(w, cy_kv(t->s[0].kv_utilization));
            w_puts(w, "\"/>\n");
        }
    }
    w_event_markers(w, c);
    w_printf(w, "<line id=\"cursor\" class=\"cursor\" x1=\"0\" x2=\"0\" y1=\"%d\" y2=\"%d\"/>\n", PY0, PY1);
    w_puts(w, "</svg>\n<div id=\"tip\"></div>\n</div>\n");
}

static void w_event_table(writer *w, const llmem_timeline *t, const chart *c, const time_axis *ta)
{
    w_printf(w, "<section class=\"card\"><h2>Events <span class=\"n\">%zu</span></h2>\n", t->ev_n);
    if (t->ev_total > t->ev_n)
        w_printf(w, "<p class=\"note\">The oldest %llu events were dropped; the newest %zu are listed.</p>\n",
                 (unsigned long long)(t->ev_total - t->ev_n), t->ev_n);
    if (t->ev_n == 0) {
        w_puts(w, "<p class=\"note\">No events were recorded.</p></section>\n");
        return;
    }
    uint64_t t0 = t->n ? t->s[0].time_ns : event_at(t, 0)->time_ns;
    w_puts(w, "<table>\n<thead><tr><th style=\"text-align:right\">time</th><th>stage</th><th>action</th>"
              "<th>before \xe2\x86\x92 after</th><th>change</th><th>reason</th></tr></thead>\n<tbody>\n");
    char buf[64], b[32], a[32];
    for (size_t i = 0; i < t->ev_n; i++) {
        const tl_event *e = event_at(t, i);
        fmt_time(buf, sizeof buf, ta, e->time_ns >= t0 ? (double)(e->time_ns - t0) : -(double)(t0 - e->time_ns),
                 false);
        fmt_bytes(b, sizeof b, (double)e->before);
        fmt_bytes(a, sizeof a, (double)e->after);
        w_printf(w, "<tr class=\"ev\"><td class=\"num t\">%s</td><td><span class=\"stage\" style=\"background:%s\">"
                    "%s</span></td><td><span class=\"chip\" style=\"background:%s\">",
                 buf, stage_band[e->stage], stage_label(e->stage), c->colors[e->action]);
        w_esc(w, e->action_name);
        w_printf(w, "</span></td><td class=\"num\">%s \xe2\x86\x92 %s</td>", b, a);
        fmt_delta(buf, sizeof buf, e->before, e->after);
        w_printf(w, "<td class=\"num %s\">%s</td><td>", e->after > e->before ? "up" : e->after < e->before ? "down" : "same",
                 e->after == e->before ? "\xe2\x80\x94" : buf);
        w_esc(w, e->text);
        w_puts(w, "</td></tr>\n");
    }
    w_puts(w, "</tbody></table></section>\n");
}

static void w_page(writer *w, const llmem_timeline *t, const char *title)
{
    chart c;
    memset(&c, 0, sizeof c);
    c.t = t;
    action_colors(t, c.colors);
    c.t0 = t->n ? t->s[0].time_ns : 0;
    double span = t->n ? (double)(t->s[t->n - 1].time_ns - c.t0) : 0;
    /* one sample, or all at one instant: a nominal second */
    c.span_ns = span > 0 ? span : 1e9;
    c.ta = time_axis_for(c.span_ns);
    double peak = 0;
    for (size_t i = 0; i < t->n; i++) {
        for (int k = 0; k < 3; k++)
            if ((double)field(&t->s[i], k) > peak) peak = (double)field(&t->s[i], k);
        if (t->s[i].kv_utilization >= 0) c.has_kv = true;
    }
    if (peak <= 0) peak = 1024.0 * 1024.0; /* all zero: a nominal MiB */
    c.byte_u = byte_unit(peak);
    double unit = pow(1024.0, c.byte_u);
    double step_u = nice_step(peak / unit / 5.0);
    if (c.byte_u == 0 && step_u < 1) step_u = 1;
    c.byte_step = step_u * unit;
    c.top_bytes = ceil(peak / c.byte_step - 1e-9) * c.byte_step;
    if (c.top_bytes <= 0) c.top_bytes = c.byte_step;
    c.byte_dec = step_decimals(step_u);

    w_puts(w, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
              "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>");
    w_esc(w, title);
    w_printf(w, "</title>\n<style>\n%s</style>\n</head>\n", page_css);
    w_printf(w, "<body data-tunit=\"%s\" data-tns=\"%llu\">\n<main>\n<h1>", c.ta.name,
             (unsigned long long)c.ta.unit_ns);
    w_esc(w, title);
    w_puts(w, "</h1>\n");
    w_summary(w, t, span);
    w_puts(w, "<section class=\"card\">\n");
    if (t->n == 0) {
        w_puts(w, "<div class=\"empty\">No samples were recorded: there is no memory to chart.</div>\n");
    } else {
        w_legend(w, &c);
        w_chart(w, &c);
        if (t->ch_dropped)
            w_printf(w, "<p class=\"note\">Stage bands before the oldest %d stage changes are drawn from the kept "
                        "samples.</p>\n",
                     MAX_CHANGES);
    }
    w_puts(w, "</section>\n");
    w_event_table(w, t, &c, &c.ta);
    w_printf(w, "<footer>llmem %s \xc2\xb7 self-contained page: no network, scripts optional</footer>\n</main>\n",
             llmem_version());
    if (t->n > 0) {
        w_puts(w, "<script type=\"application/json\" id=\"tl-data\">");
        w_hover_data(w, &c);
        w_printf(w, "</script>\n<script>\n%s</script>\n", page_js);
    }
    w_puts(w, "</body>\n</html>\n");
}

llmem_status llmem_timeline_write_html(const llmem_timeline *t, const char *path, const char *title)
{
    if (!t || !path) return llmem__fail(LLMEM_EINVAL, "timeline: null %s", t ? "path" : "timeline");
    if (!path[0]) return llmem__fail(LLMEM_EINVAL, "timeline: empty path");
    if (!title) title = "llmem timeline";
    llmem_outfile *of;
    llmem_status st = llmem_outfile_open(path, &of);
    if (st) return llmem__fail_prefix("timeline");
    writer w = {llmem_outfile_stream(of), 0};
    w_page(&w, t, title);
    if (w.err) {
        llmem_outfile_abort(of);
        return llmem__fail(LLMEM_EIO, "timeline: cannot write '%s': %s", path, strerror(w.err));
    }
    if (llmem_outfile_commit(of)) return llmem__fail_prefix("timeline");
    return LLMEM_OK;
}
