/*
 * engine_internal.h - what engine.c, weights.c and attention.c share. Not
 * installed.
 *
 * engine.c owns the engine: creation, sequences, the workspace and the
 * step's outline. weights.c binds, checks, converts and repacks the
 * weights at creation (weights.h). attention.c does the per-token part of a layer
 * on the buffers engine.c carved for the step: the Q/K/V biases and the
 * rotary embedding, the block tables, storing K/V, and (windowed) causal
 * attention through the tables.
 */
#ifndef LLMEM_ENGINE_INTERNAL_H
#define LLMEM_ENGINE_INTERNAL_H

#include "llmem/arena.h"
#include "llmem/engine.h"

#include "threads.h"

#define SEQ_INDEX_BITS 12
#define SEQ_INDEX_MASK ((1u << SEQ_INDEX_BITS) - 1)
#define MAX_SEQS SEQ_INDEX_MASK

typedef struct eng_layer {
    /* Weights as GGUF stores them, (input, output): each output row is
     * `input` elements of its llmem_dtype (t*), read in place. */
    const void *wq;                               /* (dim, qdim): query projection */
    const void *wk;                               /* (dim, kvdim): key projection */
    const void *wv;                               /* (dim, kvdim): value projection */
    const void *wo;                               /* (qdim, dim): attention output */
    const void *w1;                               /* (dim, ffn): FFN gate */
    const void *w2;                               /* (ffn, dim): FFN down */
    const void *w3;                               /* (dim, ffn): FFN up */
    uint32_t tq, tk, tv, to, t1, t2, t3;          /* their llmem_dtype */
    const float *attn_norm, *ffn_norm;            /* (dim) */
    const float *bq, *bk, *bv;                    /* (qdim) (kvdim) (kvdim); NULL: no bias */
} eng_layer;

typedef struct eng_seq {
    bool live;
    bool broken;            /* a windowed step failed after some of its chunks ran: only free it */
    uint32_t gen;           /* bumped on free, so a stale id is refused */
    llmem_kv_seq kvs;       /* ALLOC_LLMEM */
    size_t len;             /* tokens held */
    size_t step_start;      /* len when the windowed step now running began */
    char *kbuf, *vbuf;      /* ALLOC_MALLOC: layers x max_seq_len tokens */
} eng_seq;

struct llmem_engine {
    const llmem_model *model;
    llmem_engine_options o;
    bool use_malloc;
    uint32_t L, dim, heads, kvh, hd, qdim, kvdim, ffn, vocab, rope_dim;
    float theta, eps;
    llmem_rope_style rope_style;
    uint32_t window;         /* attention window in positions (itself included); 0 = full */
    uint32_t kv_window;      /* window_tokens of each KV sequence: window + chunk; 0 = the KV keeps all */
    uint32_t chunk;          /* with kv_window: an item past the window runs at most chunk + 1 tokens a pass */
    const void *embd;        /* (dim, vocab): token embeddings, one row per token */
    const void *wcls;        /* (dim, vocab): the classifier (embd when tied) */
    uint32_t embd_type, wcls_type;
    const float *out_norm;   /* (dim) */
    eng_layer *layers;
    float *converted;       /* 1-D tensors converted to f32, one block */
    size_t converted_bytes;
    void *repacked;         /* q4_K matrices repacked 8 rows interleaved (kernels_q4k_x8.h): one mapping
                               from res, tagged "engine-weights"; NULL when none */
    size_t repacked_map;    /* its mapped size */
    size_t repacked_bytes;  /* the repacked copies' bytes; the source tensors' pages were given back */
    size_t xq_row;          /* bytes per token of the widest matmul or group's activation rows (0: no block types) */
    llmem_engine_batch_item *sub_items; /* max_seqs: a windowed step's passes */

    llmem__threads *th;
    llmem_pool *pool;
    bool own_pool;
    llmem_kv *kv;
    llmem_arena *arena;
    llmem_resource *res;     /* host memory of the workspace and the KV manager's tables: the pool's
                                resource (the default one for a pool over device memory) */
    char *ws_base;           /* the workspace mapping, from res, that the arena hands out */
    size_t ws_map;           /* its mapped size (rounded to res's granularity) */
    size_t ws_bytes;
    size_t ws_touched;       /* bytes of the workspace the steps since the last release used */
    size_t ws_commit_end;    /* the committed prefix of the mapping: [0, ws_commit_end) is committed,
                                the rest not (page multiple) */
    size_t kv_elem, tok_bytes; /* bytes per element, per token's K (or V) in a layer */
    size_t blocks_max;       /* table entries per sequence */

    eng_seq *seqs;
    uint32_t live_seqs;

    /* the last step */
    float *logits;           /* count x vocab */
    size_t logits_count;
    void *step_malloc[24];   /* ALLOC_MALLOC: buffers of the last step (21 now) */
    size_t step_malloc_n;

    llmem_engine_stats st;
    uint64_t malloc_bytes;
};

typedef struct step_bufs {
    uint32_t *tok_item, *tok_pos;  /* per token row */
    float *x;                      /* the residual stream, T x dim */
    float *xb, *q, *k, *v;         /* attention: normed input, projections */
    float *att_out, *xo;           /* attention output (T x qdim), its projection (T x dim) */
    float *xf, *hb, *hb2, *xd;     /* FFN: normed input, gate (then SwiGLU in place), up, down */
    float *scores;                 /* threads x max_seq_len */
    void **ktab, **vtab;           /* items x blocks_max */
    size_t *tab_len;               /* items: tokens per block */
    size_t *tab_first;             /* items: the block (position / tab_len) the table's entry 0 holds */
    float *xlast, *logits;         /* items x dim, items x vocab */
    float *rope;                   /* T x 2 * llmem__rope_pairs: (cos, sin) of each row's angles, set in layer 0 */
    void *xq;                      /* block-type weights: one matmul's or group's quantised activation rows */
} step_bufs;

/* ---- engine.c ---- */

/* Memory the engine keeps for its life, zeroed: from its pool, or calloc'd
 * (and counted in malloc_bytes) for the malloc baseline. NULL when out of
 * memory. */
void *llmem__engine_keep_alloc(llmem_engine *e, size_t bytes);

/* ---- attention.c ---- */

/* Rotate halves: the pairs (i, i + rope_dim/2) of the first rope_dim dims
 * of each of n_heads heads (head_dim apart) by pos * theta^(-2i/rope_dim),
 * the angle built by one float multiplication per pair from pos, as ggml
 * defines its rope (ggml's NEOX mode, qwen2's rope). */
void llmem__rope_neox(float *v, size_t n_heads, size_t head_dim, size_t rope_dim, size_t pos, float theta);

/* Rotated pairs per head: rope_dim (at most head_dim) / 2. */
size_t llmem__rope_pairs(size_t head_dim, size_t rope_dim);

/* The (cos, sin) of each of the pairs' angles at pos into cs (2 * pairs
 * floats), computed as llmem__rope (NORM) or llmem__rope_neox compute
 * them, so that llmem__rope_apply with them gives their bits: a step
 * computes them once per row for all layers and both of Q and K (the
 * cos/sin per layer were ~5% of a prefill). */
void llmem__rope_angles(float *cs, llmem_rope_style style, size_t head_dim, size_t rope_dim, size_t pos,
                        float theta);

/* Rotate n_heads heads of v (head_dim apart) in style by the angles cs of
 * llmem__rope_angles. */
void llmem__rope_apply(float *v, llmem_rope_style style, size_t n_heads, size_t head_dim, size_t rope_dim,
                       const float *cs);

/* After a layer's Q/K/V projections of the step's T rows: add the layer's
 * biases (those it has), rotate Q and K in the model's rope style at each
 * row's position, and store the row's K and V into the cache, on the team
 * for a prefill (a serial store of K/V was a third of the main thread's
 * time in a 99-token prefill, with the other thread waiting). The tables
 * of every item must be filled for this layer. */
void llmem__engine_qkv_finish(const llmem_engine *e, const eng_layer *ly, step_bufs *b, size_t T);

/* Item `item`'s block table for a layer, of sequence q (tab_len and
 * tab_first set). LLMEM_ECORRUPT from a damaged KV manager. */
llmem_status llmem__engine_fill_table(llmem_engine *e, step_bufs *b, const eng_seq *q, uint32_t item,
                                      uint32_t layer);

/* Attention of each of the T rows' heads over its sequence's positions
 * (the last e->window of them with a window), into b->att_out, after
 * llmem__engine_qkv_finish stored the rows' K and V. */
void llmem__engine_attend(llmem_engine *e, step_bufs *b, size_t T);

#endif /* LLMEM_ENGINE_INTERNAL_H */
