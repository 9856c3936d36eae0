/*
 * step_model.c - step-time models (llmem/step_model.h): the roofline, the
 * linear model, its least-squares fit and its calibration on a real engine.
 *
 * The fit solves the 4 x 4 normal equations (X^T W X) c = X^T W y over the
 * columns [1, prefill tokens, decode sequences, attention pairs]: W = 1
 * (plain least squares, for the steps of a real run: the fit keeps their
 * total time, which is what a simulated clock adds up) or W = 1 / time^2
 * (relative, for a calibration grid whose points span a token to a full
 * prompt). Each column is scaled to unit range first so the system is well
 * conditioned; a column that is constant over the points (besides the
 * intercept), or whose coefficient comes out negative, is dropped and
 * gets coefficient 0. Calibration measures each point `repeats` times and
 * keeps the median, which shrugs off a step that another process slowed.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/engine.h"
#include "llmem/step_model.h"

#include "../core/internal.h"

llmem_step_model llmem_step_model_roofline(const llmem_shape *shape, size_t weight_elem_bytes, size_t kv_elem_bytes)
{
    llmem_step_model m;
    memset(&m, 0, sizeof m);
    m.kind = LLMEM_STEP_ROOFLINE;
    m.bandwidth = 3.35e12;
    m.peak_flops = 989e12;
    m.mfu = 0.5;
    m.overhead_s = 0.0003;
    if (shape) {
        m.params = (double)llmem_shape_params(shape);
        m.weights_bytes = m.params * (double)weight_elem_bytes;
        m.kv_bytes_per_token = (double)llmem_shape_kv_bytes_per_token(shape, kv_elem_bytes);
        m.attn_flops_per_pair = 4.0 * shape->layers * (double)shape->heads * shape->head_dim;
    }
    return m;
}

llmem_step_model llmem_step_model_linear(double c0, double c_prefill_token, double c_decode_seq, double c_attn_pair)
{
    llmem_step_model m;
    memset(&m, 0, sizeof m);
    m.kind = LLMEM_STEP_LINEAR;
    m.c0 = c0;
    m.c_prefill_token = c_prefill_token;
    m.c_decode_seq = c_decode_seq;
    m.c_attn_pair = c_attn_pair;
    return m;
}

llmem_status llmem_step_model_check(const llmem_step_model *m)
{
    if (!m) return llmem__fail(LLMEM_EINVAL, "step model: null");
    if (m->kind == LLMEM_STEP_ROOFLINE) {
        if (!(m->bandwidth > 0) || !(m->peak_flops > 0) || !(m->mfu > 0 && m->mfu <= 1) || !(m->overhead_s >= 0) ||
            !isfinite(m->bandwidth) || !isfinite(m->peak_flops) || !(m->params >= 0) || !(m->weights_bytes >= 0) ||
            !(m->kv_bytes_per_token >= 0) || !(m->attn_flops_per_pair >= 0))
            return llmem__fail(LLMEM_EINVAL, "step model: roofline figures must be finite and positive, mfu in (0, 1]");
        return LLMEM_OK;
    }
    if (m->kind == LLMEM_STEP_LINEAR) {
        if (!isfinite(m->c0) || !isfinite(m->c_prefill_token) || !isfinite(m->c_decode_seq) || !isfinite(m->c_attn_pair))
            return llmem__fail(LLMEM_EINVAL, "step model: linear coefficients must be finite");
        return LLMEM_OK;
    }
    return llmem__fail(LLMEM_EINVAL, "step model: unknown kind %d", (int)m->kind);
}

double llmem_step_model_time(const llmem_step_model *m, const llmem_step_shape *s)
{
    if (!m || !s) return 0;
    double t;
    if (m->kind == LLMEM_STEP_LINEAR) {
        t = m->c0 + m->c_prefill_token * (double)s->prefill_tokens + m->c_decode_seq * (double)s->decode_seqs +
            m->c_attn_pair * s->attn_pairs;
    } else {
        double tokens = (double)s->prefill_tokens + (double)s->decode_seqs;
        double flops = 2.0 * m->params * tokens + m->attn_flops_per_pair * s->attn_pairs;
        double bytes = m->weights_bytes + s->decode_kv_tokens * m->kv_bytes_per_token +
                       (double)s->prefill_tokens * m->kv_bytes_per_token + 2.0 * (double)s->copy_bytes;
        t = m->overhead_s + fmax(flops / (m->peak_flops * m->mfu), bytes / m->bandwidth);
    }
    return t > 0 ? t : 0;
}

static void columns(const llmem_step_shape *s, double x[4])
{
    x[0] = 1;
    x[1] = (double)s->prefill_tokens;
    x[2] = (double)s->decode_seqs;
    x[3] = s->attn_pairs;
}

/* Weighted least squares over the columns in use; false if singular. */
static bool solve(const llmem_step_shape *shapes, const double *seconds, size_t n, bool relative, const bool use[4],
                  const double scale[4], double coef[4])
{
    double A[4][5];
    memset(A, 0, sizeof A);
    for (size_t i = 0; i < n; i++) {
        double x[4];
        columns(&shapes[i], x);
        for (int j = 0; j < 4; j++) x[j] = use[j] ? x[j] / scale[j] : 0;
        /* relative: each point weighs 1 / time^2, so a one-token step
         * counts as much as a full prompt (a grid of shapes); else plain
         * least squares, whose fit keeps the sum of the times (a clock). */
        double w = !relative ? 1.0 : seconds[i] > 0 ? 1.0 / (seconds[i] * seconds[i]) : 0;
        for (int r = 0; r < 4; r++) {
            for (int c = 0; c < 4; c++) A[r][c] += w * x[r] * x[c];
            A[r][4] += w * x[r] * seconds[i];
        }
    }
    for (int j = 0; j < 4; j++)
        if (!use[j]) {
            memset(A[j], 0, sizeof A[j]);
            A[j][j] = 1; /* coefficient 0 */
        }
    /* Gaussian elimination with partial pivoting. */
    for (int c = 0; c < 4; c++) {
        int p = c;
        for (int r = c + 1; r < 4; r++)
            if (fabs(A[r][c]) > fabs(A[p][c])) p = r;
        if (fabs(A[p][c]) < 1e-300) return false;
        if (p != c)
            for (int k = 0; k < 5; k++) {
                double t = A[c][k];
                A[c][k] = A[p][k];
                A[p][k] = t;
            }
        for (int r = 0; r < 4; r++) {
            if (r == c) continue;
            double f = A[r][c] / A[c][c];
            for (int k = c; k < 5; k++) A[r][k] -= f * A[c][k];
        }
    }
    for (int j = 0; j < 4; j++) coef[j] = use[j] ? A[j][4] / A[j][j] / scale[j] : 0;
    return true;
}

llmem_status llmem_step_model_fit(const llmem_step_shape *shapes, const double *seconds, size_t n, bool relative,
                                  llmem_step_model *out, double *rel_error)
{
    if (!shapes || !seconds || !out) return llmem__fail(LLMEM_EINVAL, "step model fit: null argument");
    if (n < 4) return llmem__fail(LLMEM_EINVAL, "step model fit: %zu points, at least 4 needed", n);
    /* Scale each column to [0, 1] by its largest value; drop constant ones. */
    double scale[4] = {1, 0, 0, 0}, lo[4] = {1, INFINITY, INFINITY, INFINITY};
    for (size_t i = 0; i < n; i++) {
        double x[4];
        columns(&shapes[i], x);
        for (int j = 1; j < 4; j++) {
            if (fabs(x[j]) > scale[j]) scale[j] = fabs(x[j]);
            if (x[j] < lo[j]) lo[j] = x[j];
        }
        if (!isfinite(seconds[i]) || seconds[i] < 0)
            return llmem__fail(LLMEM_EINVAL, "step model fit: point %zu has time %g", i, seconds[i]);
    }
    bool use[4] = {true, false, false, false};
    for (int j = 1; j < 4; j++) {
        use[j] = scale[j] > 0 && scale[j] > lo[j];
        if (!scale[j]) scale[j] = 1;
    }
    /* A step cannot take less time for more work: a coefficient that comes
     * out negative (correlated columns) is dropped and the rest refitted
     * (an active-set non-negative least squares, at most 4 rounds). */
    double coef[4];
    for (int round = 0; round < 4; round++) {
        if (!solve(shapes, seconds, n, relative, use, scale, coef))
            return llmem__fail(LLMEM_EINVAL, "step model fit: singular system");
        int worst = -1;
        for (int j = 0; j < 4; j++)
            if (use[j] && coef[j] < 0 && (worst < 0 || coef[j] * scale[j] < coef[worst] * scale[worst])) worst = j;
        if (worst < 0) break;
        use[worst] = false;
        coef[worst] = 0;
    }
    for (int j = 0; j < 4; j++)
        if (coef[j] < 0) coef[j] = 0;
    *out = llmem_step_model_linear(coef[0], coef[1], coef[2], coef[3]);
    if (rel_error) {
        double e = 0;
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (seconds[i] > 0) {
                e += fabs(llmem_step_model_time(out, &shapes[i]) - seconds[i]) / seconds[i];
                m++;
            }
        *rel_error = m ? e / (double)m : 0;
    }
    return LLMEM_OK;
}

/* ---- calibration on a real engine ------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct calib {
    llmem_engine *e;
    uint32_t vocab;
    int32_t *tok;          /* [max_step_tokens] */
    llmem_engine_seq *seqs;
    llmem_engine_batch_item *items;
} calib;

/* Fill `count` sequences with ctx tokens each (untimed), then time one step
 * of `chunk` new tokens each (decode: chunk 1). */
static llmem_status measure(calib *c, uint32_t count, uint32_t ctx, uint32_t chunk, uint32_t max_step, double *secs,
                            llmem_step_shape *shape)
{
    llmem_status st = LLMEM_OK;
    uint32_t made = 0;
    for (; made < count; made++)
        if ((st = llmem_engine_seq_create(c->e, &c->seqs[made]))) goto out;
    for (uint32_t i = 0; i < count; i++)
        for (uint32_t off = 0; off < ctx;) {
            uint32_t take = ctx - off < max_step ? ctx - off : max_step;
            llmem_engine_batch_item it = {c->seqs[i], c->tok + (off % 7), take, 0};
            if ((st = llmem_engine_step(c->e, &it, 1))) goto out;
            off += take;
        }
    for (uint32_t i = 0; i < count; i++) c->items[i] = (llmem_engine_batch_item){c->seqs[i], c->tok + i % 5, chunk, 0};
    uint64_t t0 = llmem__now_ns();
    st = llmem_engine_step(c->e, c->items, count);
    *secs = (double)(llmem__now_ns() - t0) * 1e-9;
    memset(shape, 0, sizeof *shape);
    shape->sequences = count;
    bool decode = chunk == 1 && ctx > 0;
    if (decode) {
        shape->decode_seqs = count;
        shape->decode_kv_tokens = (double)count * (ctx + 1);
    } else {
        shape->prefill_tokens = (uint64_t)count * chunk;
    }
    shape->attn_pairs = (double)count * ((double)chunk * ctx + (double)chunk * (chunk + 1) / 2.0);
out:
    while (made) llmem_engine_seq_free(c->e, c->seqs[--made]);
    return st;
}

llmem_status llmem_step_model_calibrate(llmem_engine *e, uint32_t repeats, llmem_step_model *out,
                                        llmem_step_calibration *report)
{
    if (!e || !out) return llmem__fail(LLMEM_EINVAL, "step model calibrate: null argument");
    llmem_engine_info info;
    llmem_status st = llmem_engine_get_info(e, &info);
    if (st) return st;
    if (info.live_seqs) return llmem__fail(LLMEM_ESTATE, "step model calibrate: the engine has live sequences");
    if (!repeats) repeats = 3;
    uint64_t t_start = llmem__now_ns();
    uint32_t max_step = info.max_step_tokens, max_seqs = info.max_seqs, max_len = info.max_seq_len;
    enum { MAXPTS = 64 };
    llmem_step_shape shapes[MAXPTS];
    double secs[MAXPTS];
    uint32_t npts = 0;
    calib c = {e, info.vocab, NULL, NULL, NULL};
    c.tok = malloc(((size_t)max_step + 8) * sizeof *c.tok);
    c.seqs = calloc(max_seqs, sizeof *c.seqs);
    c.items = calloc(max_seqs, sizeof *c.items);
    double *rep = malloc(repeats * sizeof *rep);
    if (!c.tok || !c.seqs || !c.items || !rep) {
        st = llmem__fail(LLMEM_ENOMEM, "step model calibrate: no memory");
        goto out;
    }
    for (uint32_t i = 0; i < max_step + 8; i++) c.tok[i] = (int32_t)(1 + (i * 7919u) % (info.vocab - 1));
    /* The grid: prefill chunks after short and long contexts, decode
     * batches at several contexts. */
    uint32_t chunks[] = {2, 16, 64, 128, 256, 512, 1024};
    uint32_t batches[] = {1, 2, 4, 8, 16, 32};
    uint32_t ctxs[] = {16, 128, 512};
    for (size_t ci = 0; ci < LLMEM_ARRAY_LEN(chunks); ci++)
        for (uint32_t pre = 0; pre < 2; pre++) {
            uint32_t chunk = chunks[ci], ctx = pre ? max_len / 4 : 0;
            if (chunk > max_step || ctx + chunk > max_len || npts >= MAXPTS) continue;
            for (uint32_t r = 0; r < repeats && !st; r++) st = measure(&c, 1, ctx, chunk, max_step, &rep[r], &shapes[npts]);
            if (st) goto out;
            qsort(rep, repeats, sizeof *rep, cmp_double);
            secs[npts++] = rep[repeats / 2];
        }
    for (size_t bi = 0; bi < LLMEM_ARRAY_LEN(batches); bi++)
        for (size_t xi = 0; xi < LLMEM_ARRAY_LEN(ctxs); xi++) {
            uint32_t b = batches[bi], ctx = ctxs[xi];
            if (b > max_seqs || b > max_step || ctx + 1 > max_len || npts >= MAXPTS) continue;
            for (uint32_t r = 0; r < repeats && !st; r++) st = measure(&c, b, ctx, 1, max_step, &rep[r], &shapes[npts]);
            if (st) goto out;
            qsort(rep, repeats, sizeof *rep, cmp_double);
            secs[npts++] = rep[repeats / 2];
        }
    double err = 0;
    if ((st = llmem_step_model_fit(shapes, secs, npts, true, out, &err))) goto out;
    if (report) {
        llmem_step_calibration r = {sizeof r, npts, repeats, err, (double)(llmem__now_ns() - t_start) * 1e-9};
        size_t n = llmem_stats_fill_size(report->struct_size, sizeof r);
        r.struct_size = n;
        memcpy(report, &r, n);
    }
out:
    free(c.tok);
    free(c.seqs);
    free(c.items);
    free(rep);
    return st;
}
