/*
 * predictor.c - memory of a stage from per-op memory functions, with an
 * online least-squares corrector (see llmem/predictor.h).
 *
 * The default op functions describe the llama engine's step as it lays it
 * out (src/engine/engine.c's graph): what lives through the whole step is
 * the token rows and the residual stream; each op adds the tensors alive
 * while it runs. The activation peak is their largest sum, which is what
 * the engine's planner reaches (its plans equal this lower bound), so the
 * formula tracks the engine's measured workspace closely.
 *
 * Attention is flagged data-dependent: the engine sizes its scores and
 * block tables for max_seq_len, whatever the context, so the formula uses
 * max_seq_len there too, and a reserve multiplies that part by the safety
 * factor.
 *
 * Corrector: y ~ a + b * (batch * tokens) + c * batch, solved from running
 * sums (3 x 3 normal equations, Gaussian elimination with pivoting); each
 * observation first scores the formula and the current fit, so both
 * errors are honest (prequential) estimates.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "llmem/model.h"
#include "llmem/predictor.h"

typedef struct op_entry {
    llmem_op_memory_fn fn;
    void *ctx;
    bool data_dependent;
} op_entry;

struct llmem_predictor {
    llmem_predictor_options o;
    op_entry ops[LLMEM_OP_KIND_COUNT];
    /* corrector: sums over observations of f f^T and f y, f = (1, bt, b) */
    double xtx[3][3], xty[3];
    uint64_t n;
    double formula_err_sum, corrector_err_sum;
    uint64_t corrector_scored;
};

#define F4(q) ((uint64_t)(q)->act_elem_bytes)
#define ROWS(q) ((uint64_t)(q)->batch * (q)->tokens)

static uint64_t blocks_max(const llmem_op_query *q)
{
    return (uint64_t)(q->max_seq_len + q->block_tokens - 1) / q->block_tokens + 1;
}

static llmem_op_memory op_embed(void *ctx, const llmem_op_query *q)
{
    (void)ctx;
    (void)q;
    return (llmem_op_memory){0, 0}; /* writes the residual stream itself */
}

static llmem_op_memory op_norm(void *ctx, const llmem_op_query *q)
{
    (void)ctx;
    return (llmem_op_memory){ROWS(q) * q->shape->hidden * F4(q), 0};
}

static llmem_op_memory op_qkv(void *ctx, const llmem_op_query *q)
{
    (void)ctx;
    const llmem_shape *s = q->shape;
    uint64_t qd = (uint64_t)s->heads * s->head_dim, kvd = (uint64_t)s->kv_heads * s->head_dim;
    return (llmem_op_memory){ROWS(q) * (s->hidden + qd + 2 * kvd) * F4(q), 0};
}

static llmem_op_memory op_attention(void *ctx, const llmem_op_query *q)
{
    (void)ctx;
    const llmem_shape *s = q->shape;
    uint64_t qd = (uint64_t)s->heads * s->head_dim, kvd = (uint64_t)s->kv_heads * s->head_dim;
    uint64_t tables = (uint64_t)q->batch * (2 * blocks_max(q) * sizeof(void *) + sizeof(size_t));
    uint64_t store = ROWS(q) * (qd + 2 * kvd) * F4(q) + tables;                   /* rope, K/V stored */
    uint64_t attend = ROWS(q) * 2 * qd * F4(q) + tables + (uint64_t)q->threads * q->max_seq_len * F4(q);
    uint64_t kv_token = 2ull * s->layers * kvd * q->kv_elem_bytes;
    return (llmem_op_memory){store > attend ? store : attend, ROWS(q) * kv_token};
}

static llmem_op_memory op_attn_out(void *ctx, const llmem_op_query *q)
{
    (void)ctx;
    const llmem_shape *s = q->shape;
    return (llmem_op_memory){ROWS(q) * ((uint64_t)s->heads * s->head_dim + s->hidden) * F4(q), 0};
}

static llmem_op_memory op_ffn(void *ctx, const llmem_op_query *q)
{
    (void)ctx;
    const llmem_shape *s = q->shape;
    return (llmem_op_memory){ROWS(q) * ((uint64_t)s->hidden + 2ull * s->ffn) * F4(q), 0};
}

static llmem_op_memory op_classifier(void *ctx, const llmem_op_query *q)
{
    (void)ctx;
    const llmem_shape *s = q->shape;
    return (llmem_op_memory){(uint64_t)q->batch * ((uint64_t)s->hidden + s->vocab) * F4(q), 0};
}

llmem_predictor_options llmem_predictor_options_default(void)
{
    llmem_predictor_options o;
    memset(&o, 0, sizeof o);
    o.weight_type = LLMEM_DTYPE_F16;
    o.kv_elem_bytes = 2;
    o.threads = 2;
    o.block_tokens = 16;
    o.safety_factor = 1.2;
    return o;
}

llmem_status llmem_predictor_create(const llmem_predictor_options *opts, llmem_predictor **out)
{
    if (!opts || !out) return llmem__fail(LLMEM_EINVAL, "predictor: null argument");
    *out = NULL;
    llmem_predictor_options o = *opts;
    const llmem_shape *s = &o.shape;
    if (!s->layers || !s->hidden || !s->heads || !s->kv_heads || !s->head_dim || !s->ffn || !s->vocab || !s->max_ctx)
        return llmem__fail(LLMEM_EINVAL, "predictor: incomplete shape '%s'", s->name);
    if (!o.kv_elem_bytes) o.kv_elem_bytes = 2;
    if (!o.threads) o.threads = 2;
    if (!o.block_tokens) o.block_tokens = 16;
    if (!o.max_seq_len) o.max_seq_len = s->max_ctx;
    if (o.safety_factor == 0) o.safety_factor = 1.2;
    if (!(o.safety_factor >= 1.0) || o.safety_factor > 100)
        return llmem__fail(LLMEM_EINVAL, "predictor: safety factor %g (at least 1)", o.safety_factor);
    if (!llmem_dtype_bytes(o.weight_type, 32))
        return llmem__fail(LLMEM_EINVAL, "predictor: unknown weight type %u", o.weight_type);
    llmem_predictor *p = calloc(1, sizeof *p);
    if (!p) return llmem__fail(LLMEM_ENOMEM, "predictor: out of memory");
    p->o = o;
    p->ops[LLMEM_OP_EMBED] = (op_entry){op_embed, NULL, false};
    p->ops[LLMEM_OP_NORM] = (op_entry){op_norm, NULL, false};
    p->ops[LLMEM_OP_QKV] = (op_entry){op_qkv, NULL, false};
    p->ops[LLMEM_OP_ATTENTION] = (op_entry){op_attention, NULL, true};
    p->ops[LLMEM_OP_ATTN_OUT] = (op_entry){op_attn_out, NULL, false};
    p->ops[LLMEM_OP_FFN] = (op_entry){op_ffn, NULL, false};
    p->ops[LLMEM_OP_CLASSIFIER] = (op_entry){op_classifier, NULL, false};
    *out = p;
    return LLMEM_OK;
}

void llmem_predictor_destroy(llmem_predictor *p) { free(p); }

llmem_status llmem_predictor_register(llmem_predictor *p, llmem_op_kind kind, llmem_op_memory_fn fn, void *ctx,
                                      bool data_dependent)
{
    if (!p || !fn) return llmem__fail(LLMEM_EINVAL, "predictor register: null argument");
    if ((unsigned)kind >= LLMEM_OP_KIND_COUNT) return llmem__fail(LLMEM_EINVAL, "predictor: op kind %d", (int)kind);
    p->ops[kind] = (op_entry){fn, ctx, data_dependent};
    return LLMEM_OK;
}

static uint64_t weights_bytes(const llmem_predictor *p)
{
    const llmem_shape *s = &p->o.shape;
    uint64_t params = llmem_shape_params(s);
    uint64_t norms = (2ull * s->layers + 1) * s->hidden; /* stay f32 */
    uint64_t mats = params > norms ? params - norms : 0;
    uint64_t per32 = llmem_dtype_bytes(p->o.weight_type, 32);
    return mats / 32 * per32 + (mats % 32) * per32 / 32 + norms * 4;
}

/* Activation peak at a query, and the data-dependent share of the op at
 * the peak. */
static uint64_t activation(const llmem_predictor *p, const llmem_op_query *q, llmem_op_kind *peak_op, uint64_t *state,
                           uint64_t *dependent)
{
    uint64_t resident = ROWS(q) * (2 * sizeof(uint32_t) + (uint64_t)q->shape->hidden * q->act_elem_bytes);
    uint64_t best = 0;
    *state = 0;
    *dependent = 0;
    for (int k = 0; k < LLMEM_OP_KIND_COUNT; k++) {
        llmem_op_memory m = p->ops[k].fn(p->ops[k].ctx, q);
        *state += m.state_bytes;
        if (m.workspace_bytes >= best) {
            best = m.workspace_bytes;
            *peak_op = (llmem_op_kind)k;
            *dependent = p->ops[k].data_dependent ? m.workspace_bytes : 0;
        }
    }
    return resident + best;
}

static void corrector_solve(const llmem_predictor *p, double beta[3], bool *ok)
{
    double a[3][4];
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 3; j++) a[i][j] = p->xtx[i][j];
        a[i][3] = p->xty[i];
    }
    /* A touch of ridge keeps a fit over too few distinct points solvable. */
    for (int i = 0; i < 3; i++) a[i][i] += 1e-9 * (a[i][i] + 1);
    *ok = false;
    for (int c = 0; c < 3; c++) {
        int piv = c;
        for (int r = c + 1; r < 3; r++)
            if (fabs(a[r][c]) > fabs(a[piv][c])) piv = r;
        if (fabs(a[piv][c]) < 1e-12) return;
        if (piv != c)
            for (int j = 0; j < 4; j++) {
                double t = a[c][j];
                a[c][j] = a[piv][j];
                a[piv][j] = t;
            }
        for (int r = 0; r < 3; r++) {
            if (r == c) continue;
            double f = a[r][c] / a[c][c];
            for (int j = c; j < 4; j++) a[r][j] -= f * a[c][j];
        }
    }
    for (int i = 0; i < 3; i++) beta[i] = a[i][3] / a[i][i];
    *ok = true;
}

static bool corrector_predict(const llmem_predictor *p, uint32_t batch, uint32_t tokens, double *y)
{
    if (p->n < 4) return false;
    double beta[3];
    bool ok;
    corrector_solve(p, beta, &ok);
    if (!ok) return false;
    *y = beta[0] + beta[1] * (double)batch * tokens + beta[2] * batch;
    return *y > 0;
}

static bool corrector_better(const llmem_predictor *p)
{
    return p->corrector_scored >= 2 && p->corrector_err_sum / (double)p->corrector_scored <
                                           p->formula_err_sum / (double)(p->n ? p->n : 1);
}

static llmem_op_query make_query(const llmem_predictor *p, uint32_t batch, uint32_t tokens, uint32_t context)
{
    return (llmem_op_query){&p->o.shape, batch, tokens, context, p->o.max_seq_len, p->o.block_tokens,
                            p->o.kv_elem_bytes, 4, p->o.threads};
}

llmem_status llmem_predictor_predict(const llmem_predictor *p, llmem_stage stage, uint32_t batch, uint32_t tokens,
                                     uint32_t context, llmem_prediction *out)
{
    if (!p || !out) return llmem__fail(LLMEM_EINVAL, "predictor: null argument");
    if ((unsigned)stage >= LLMEM_STAGE_COUNT_) return llmem__fail(LLMEM_EINVAL, "predictor: stage %d", (int)stage);
    memset(out, 0, sizeof *out);
    const llmem_shape *s = &p->o.shape;
    out->weights_bytes = weights_bytes(p);
    out->kv_bytes_per_token = llmem_shape_kv_bytes_per_token(s, p->o.kv_elem_bytes);
    if (stage == LLMEM_STAGE_LOAD || stage == LLMEM_STAGE_IDLE) return LLMEM_OK;
    if (stage == LLMEM_STAGE_DECODE) tokens = 1;
    if (!batch || !tokens) return llmem__fail(LLMEM_EINVAL, "predictor: a step of %u x %u tokens", batch, tokens);
    if ((uint64_t)context + tokens > p->o.max_seq_len)
        return llmem__fail(LLMEM_ERANGE, "predictor: %u + %u tokens exceed max_seq_len %u", context, tokens,
                           p->o.max_seq_len);
    llmem_op_query q = make_query(p, batch, tokens, context);
    uint64_t state, dependent;
    out->activation_bytes = activation(p, &q, &out->peak_op, &state, &dependent);
    uint64_t B = p->o.block_tokens;
    uint64_t held = ((uint64_t)context + tokens + B - 1) / B * B;
    out->kv_bytes = (uint64_t)batch * held * out->kv_bytes_per_token;
    /* The KV manager takes blocks in slabs per layer, a sequence's own while
     * the budget allows: the step may start ceil(tokens / slab) + 1 slabs
     * per sequence and layer. */
    uint64_t kvd = (uint64_t)s->kv_heads * s->head_dim;
    uint64_t block_layer = 2 * B * kvd * p->o.kv_elem_bytes;
    uint64_t slab = p->o.kv_slab_bytes ? p->o.kv_slab_bytes : (2 * block_layer > 4096 ? 2 * block_layer : 4096);
    uint64_t slab_tokens = slab / block_layer * B;
    if (!slab_tokens) slab_tokens = B;
    uint64_t slabs = ((uint64_t)tokens + slab_tokens - 1) / slab_tokens + 1;
    double kv_new = (double)batch * (double)slabs * (double)slab * s->layers;
    double reserve = kv_new;
    if (!p->o.activations_apart)
        reserve += (double)(out->activation_bytes - dependent) + (double)dependent * p->o.safety_factor;
    out->reserve_bytes = (uint64_t)ceil(reserve);
    double y;
    bool corrected = corrector_better(p) && corrector_predict(p, batch, tokens, &y) && y > 0;
    out->corrected_activation_bytes = corrected ? (uint64_t)llround(y) : out->activation_bytes;
    out->corrected_reserve_bytes = out->reserve_bytes;
    if (corrected && !p->o.activations_apart && out->activation_bytes) {
        /* The measured peaks replace the formula's, scaled as the formula's
         * reserve share was (its data-dependent part times the factor). */
        double share = ((double)(out->activation_bytes - dependent) + (double)dependent * p->o.safety_factor) /
                       (double)out->activation_bytes;
        out->corrected_reserve_bytes = (uint64_t)ceil(kv_new + y * share);
    }
    return LLMEM_OK;
}

llmem_status llmem_predictor_observe(llmem_predictor *p, uint32_t batch, uint32_t tokens, uint32_t context,
                                     uint64_t measured)
{
    if (!p || !batch || !tokens || !measured)
        return llmem__fail(LLMEM_EINVAL, "predictor observe: null predictor or zero figures");
    llmem_op_query q = make_query(p, batch, tokens, context);
    llmem_op_kind k;
    uint64_t state, dependent;
    double f = (double)activation(p, &q, &k, &state, &dependent), m = (double)measured, y;
    p->formula_err_sum += fabs(f - m) / m;
    if (corrector_predict(p, batch, tokens, &y)) {
        p->corrector_err_sum += fabs(y - m) / m;
        p->corrector_scored++;
    }
    double x[3] = {1.0, (double)batch * tokens, (double)batch};
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 3; j++) p->xtx[i][j] += x[i] * x[j];
        p->xty[i] += x[i] * m;
    }
    p->n++;
    return LLMEM_OK;
}

llmem_status llmem_predictor_get_stats(const llmem_predictor *p, llmem_predictor_stats *out)
{
    if (!p || !out) return llmem__fail(LLMEM_EINVAL, "predictor stats: null argument");
    llmem_predictor_stats s = {sizeof s, p->n, p->n ? p->formula_err_sum / (double)p->n : 0,
                               p->corrector_scored ? p->corrector_err_sum / (double)p->corrector_scored : 0,
                               corrector_better(p)};
    return llmem__stats_out(out, &s, sizeof s);
}

LLMEM__STATS_SCHEMA_OF(llmem_predictor_stats_schema, "predictor", llmem_predictor_stats, LLMEM_PREDICTOR_STATS_FIELDS)
