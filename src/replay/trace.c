/*
 * trace.c - CSV request traces (see llmem/trace.h).
 *
 * One pass over the text: the header picks column indexes, each data line
 * is split on commas (fields are plain: no quoting in these traces) and
 * every field is parsed with overflow and range checks.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "llmem/trace.h"

enum { C_ARRIVAL, C_PROMPT, C_OUTPUT, C_PREFIX_ID, C_PREFIX_TOKENS, C_COUNT };

static bool name_is(const char *s, size_t n, const char *const *names)
{
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\r')) n--;
    while (n && *s == ' ') s++, n--;
    for (; *names; names++) {
        size_t m = strlen(*names);
        if (m != n) continue;
        size_t i = 0;
        for (; i < n; i++) {
            char a = s[i] >= 'A' && s[i] <= 'Z' ? (char)(s[i] + 32) : s[i];
            if (a != (*names)[i]) break;
        }
        if (i == n) return true;
    }
    return false;
}

static const char *const names_arrival[] = {"timestamp", "arrival", "arrival_s", "time", NULL};
static const char *const names_prompt[] = {"contexttokens", "prompt_tokens", "input_tokens", NULL};
static const char *const names_output[] = {"generatedtokens", "output_tokens", NULL};
static const char *const names_prefix_id[] = {"prefix_id", "prefixid", NULL};
static const char *const names_prefix_tokens[] = {"prefix_tokens", "prefixtokens", NULL};

/* Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm). */
static int64_t days_from_civil(int64_t y, unsigned m, unsigned d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    unsigned yoe = (unsigned)(y - era * 400);
    unsigned doy = (153 * (m + (m > 2 ? (unsigned)-3 : 9)) + 2) / 5 + d - 1;
    unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (int64_t)doe - 719468;
}

static bool digits(const char *s, size_t n, unsigned *v)
{
    unsigned x = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        x = x * 10 + (unsigned)(s[i] - '0');
    }
    *v = x;
    return true;
}

/* "YYYY-MM-DD HH:MM:SS[.frac]" or a plain non-negative number of seconds. */
static bool parse_time(const char *s, size_t n, double *out)
{
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\r')) n--;
    while (n && *s == ' ') s++, n--;
    unsigned Y, M, D, h, mi, se;
    if (n >= 19 && s[4] == '-' && s[7] == '-' && (s[10] == ' ' || s[10] == 'T') && s[13] == ':' && s[16] == ':' &&
        digits(s, 4, &Y) && digits(s + 5, 2, &M) && digits(s + 8, 2, &D) && digits(s + 11, 2, &h) &&
        digits(s + 14, 2, &mi) && digits(s + 17, 2, &se)) {
        if (M < 1 || M > 12 || D < 1 || D > 31 || h > 23 || mi > 59 || se > 60) return false;
        double frac = 0, scale = 0.1;
        size_t i = 19;
        if (i < n && s[i] == '.') {
            for (i++; i < n && s[i] >= '0' && s[i] <= '9'; i++, scale /= 10) frac += (s[i] - '0') * scale;
        }
        if (i != n) return false;
        *out = (double)days_from_civil(Y, M, D) * 86400.0 + h * 3600.0 + mi * 60.0 + se + frac;
        return true;
    }
    if (!n || n > 63) return false;
    char buf[64];
    memcpy(buf, s, n);
    buf[n] = '\0';
    char *end;
    errno = 0;
    double v = strtod(buf, &end);
    if (errno || *end || !(v >= 0) || v > 1e12) return false;
    *out = v;
    return true;
}

static bool parse_u32(const char *s, size_t n, uint32_t max, uint32_t *out)
{
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\r')) n--;
    while (n && *s == ' ') s++, n--;
    if (!n || n > 10) return false;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        x = x * 10 + (uint64_t)(s[i] - '0');
    }
    if (x > max) return false;
    *out = (uint32_t)x;
    return true;
}

/* Sorting keys: arrival, then line order, so requests that arrive together
 * keep the order the file gives them (qsort alone is not stable). */
typedef struct order_key {
    double arrival;
    size_t index;
} order_key;

static int by_arrival(const void *a, const void *b)
{
    const order_key *x = a, *y = b;
    if (x->arrival != y->arrival) return x->arrival < y->arrival ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* Sort req by arrival, stably. Traces are usually in order already: one
 * pass checks that before anything is allocated. */
static llmem_status sort_by_arrival(llmem_trace_request *req, size_t count)
{
    size_t i = 1;
    while (i < count && req[i - 1].arrival_s <= req[i].arrival_s) i++;
    if (i >= count) return LLMEM_OK;
    order_key *k = malloc(count * sizeof *k);
    llmem_trace_request *copy = malloc(count * sizeof *copy);
    if (!k || !copy) {
        free(k);
        free(copy);
        return llmem__fail(LLMEM_ENOMEM, "trace: out of memory sorting %zu requests", count);
    }
    for (i = 0; i < count; i++) k[i] = (order_key){req[i].arrival_s, i};
    qsort(k, count, sizeof *k, by_arrival);
    memcpy(copy, req, count * sizeof *copy);
    for (i = 0; i < count; i++) req[i] = copy[k[i].index];
    free(k);
    free(copy);
    return LLMEM_OK;
}

void llmem_trace_free(llmem_trace *t)
{
    if (!t) return;
    free(t->req);
    t->req = NULL;
    t->count = 0;
    t->duration_s = 0;
}

llmem_status llmem_trace_parse(const char *text, size_t len, llmem_trace *out)
{
    if (!out) return llmem__fail(LLMEM_EINVAL, "trace: null out");
    memset(out, 0, sizeof *out);
    if (!text) return llmem__fail(LLMEM_EINVAL, "trace: null text");
    int col[C_COUNT];
    for (int i = 0; i < C_COUNT; i++) col[i] = -1;
    size_t cap = 0, count = 0, lineno = 0, pos = 0;
    llmem_trace_request *req = NULL;
    llmem_status st = LLMEM_OK;
    bool header = true;
    double t0 = 0;
    while (pos < len && !st) {
        size_t end = pos;
        while (end < len && text[end] != '\n') end++;
        const char *line = text + pos;
        size_t ll = end - pos;
        pos = end + 1;
        lineno++;
        if (ll == 0 || (ll == 1 && line[0] == '\r')) continue;
        if (memchr(line, '\0', ll)) {
            st = llmem__fail(LLMEM_EFORMAT, "trace: line %zu holds a NUL byte", lineno);
            break;
        }
        /* split */
        const char *f[16];
        size_t fl[16], nf = 0, a = 0;
        for (size_t i = 0; i <= ll; i++) {
            if (i == ll || line[i] == ',') {
                if (nf == 16) {
                    st = llmem__fail(LLMEM_EFORMAT, "trace: line %zu has more than 16 fields", lineno);
                    break;
                }
                f[nf] = line + a;
                fl[nf++] = i - a;
                a = i + 1;
            }
        }
        if (st) break;
        if (header) {
            for (size_t i = 0; i < nf; i++) {
                if (name_is(f[i], fl[i], names_arrival)) col[C_ARRIVAL] = (int)i;
                else if (name_is(f[i], fl[i], names_prompt)) col[C_PROMPT] = (int)i;
                else if (name_is(f[i], fl[i], names_output)) col[C_OUTPUT] = (int)i;
                else if (name_is(f[i], fl[i], names_prefix_id)) col[C_PREFIX_ID] = (int)i;
                else if (name_is(f[i], fl[i], names_prefix_tokens)) col[C_PREFIX_TOKENS] = (int)i;
            }
            if (col[C_ARRIVAL] < 0 || col[C_PROMPT] < 0 || col[C_OUTPUT] < 0)
                st = llmem__fail(LLMEM_EFORMAT,
                                 "trace: the header (line %zu) must name an arrival column (TIMESTAMP or arrival_s), "
                                 "a prompt column (ContextTokens or prompt_tokens) and an output column "
                                 "(GeneratedTokens or output_tokens)",
                                 lineno);
            header = false;
            continue;
        }
        llmem_trace_request r = {0};
        int bad = -1;
        if ((size_t)col[C_ARRIVAL] >= nf || !parse_time(f[col[C_ARRIVAL]], fl[col[C_ARRIVAL]], &r.arrival_s))
            bad = C_ARRIVAL;
        else if ((size_t)col[C_PROMPT] >= nf || !parse_u32(f[col[C_PROMPT]], fl[col[C_PROMPT]], 1u << 24, &r.prompt_tokens))
            bad = C_PROMPT;
        else if ((size_t)col[C_OUTPUT] >= nf || !parse_u32(f[col[C_OUTPUT]], fl[col[C_OUTPUT]], 1u << 24, &r.output_tokens))
            bad = C_OUTPUT;
        else if (col[C_PREFIX_ID] >= 0 &&
                 ((size_t)col[C_PREFIX_ID] >= nf || !parse_u32(f[col[C_PREFIX_ID]], fl[col[C_PREFIX_ID]], UINT32_MAX - 1, &r.prefix_id)))
            bad = C_PREFIX_ID;
        else if (col[C_PREFIX_TOKENS] >= 0 &&
                 ((size_t)col[C_PREFIX_TOKENS] >= nf ||
                  !parse_u32(f[col[C_PREFIX_TOKENS]], fl[col[C_PREFIX_TOKENS]], 1u << 24, &r.prefix_tokens)))
            bad = C_PREFIX_TOKENS;
        if (bad >= 0) {
            static const char *what[] = {"arrival", "prompt tokens", "output tokens", "prefix id", "prefix tokens"};
            st = llmem__fail(LLMEM_EFORMAT, "trace: line %zu, column %d (%s) is missing or malformed", lineno,
                             col[bad] + 1, what[bad]);
            break;
        }
        if (r.prefix_tokens > r.prompt_tokens) r.prefix_tokens = r.prompt_tokens;
        if (count == cap) {
            size_t ncap = cap ? cap * 2 : 1024;
            llmem_trace_request *n = realloc(req, ncap * sizeof *n);
            if (!n) {
                st = llmem__fail(LLMEM_ENOMEM, "trace: out of memory at line %zu", lineno);
                break;
            }
            req = n;
            cap = ncap;
        }
        req[count++] = r;
    }
    if (!st && header) st = llmem__fail(LLMEM_EFORMAT, "trace: empty (no header line)");
    if (!st && count) st = sort_by_arrival(req, count);
    if (st) {
        free(req);
        return st;
    }
    if (count) {
        t0 = req[0].arrival_s;
        for (size_t i = 0; i < count; i++) req[i].arrival_s -= t0;
        out->duration_s = req[count - 1].arrival_s;
    }
    out->req = req;
    out->count = count;
    return LLMEM_OK;
}

llmem_status llmem_trace_load(const char *path, llmem_trace *out)
{
    if (!path || !out) return llmem__fail(LLMEM_EINVAL, "trace: null argument");
    memset(out, 0, sizeof *out);
    void *buf;
    size_t n;
    llmem_status st = llmem__read_file(path, (size_t)1 << 30, "trace", &buf, &n);
    if (!st) st = llmem_trace_parse(buf, n, out);
    free(buf);
    return st;
}
