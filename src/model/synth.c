/*
 * synth.c - model files with synthetic weights (llmem/synth.h).
 *
 * A plan of tensors (GGUF's llama names and dims, in the order llmem_model
 * documents), each filled row by row while the GGUF writer writes it: the
 * row's values from a counter-based generator seeded by (seed, tensor
 * index, row), then encoded to the tensor's type by llmem_quantize_row. So
 * a tensor's bytes depend only on the seed, the shape and the type, and
 * memory use is one row of f32 plus the writer's one tensor buffer.
 *
 * The llama2.c checkpoint is the same values in run.c's layout: all layers
 * of one kind together, then run.c's (unused) rope tables as zeros.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "llmem/outfile.h"
#include "llmem/quant.h"
#include "llmem/synth.h"
#include "llmem/tokenizer.h"
#include "model_internal.h"

typedef struct synth_tensor {
    char name[64];
    uint32_t n_dims;
    uint64_t dims[2];
    bool norm;                /* a norm's weights: all 1 */
    bool bias;                /* a Q/K/V bias: f32 like a norm, seeded values in [-0.5, 0.5] */
} synth_tensor;

typedef struct synth {
    llmem_shape s;
    uint64_t seed;
    uint32_t type;            /* the matrices' requested type */
    bool qwen2;               /* general.architecture "qwen2": Q/K/V biases */
    synth_tensor *t;
    size_t n;
    float *scratch;           /* one row of f32 values */
} synth;

/* The type tensor t is written in. */
static uint32_t tensor_type(const synth *sy, const synth_tensor *t)
{
    return t->norm || t->bias ? LLMEM_DTYPE_F32 : llmem_quant_row_type(sy->type, t->dims[0]);
}

/* Values of row r of tensor i into out[0..n). */
static void row_values(const synth *sy, size_t i, uint64_t r, float *out, uint64_t n)
{
    const synth_tensor *t = &sy->t[i];
    if (t->norm) {
        for (uint64_t j = 0; j < n; j++) out[j] = 1.0f;
        return;
    }
    float scale = t->bias ? 0.5f : strcmp(t->name, "token_embd.weight") ? 1.0f / sqrtf((float)n) : 1.0f;
    uint64_t state = llmem__splitmix64(sy->seed ^ llmem__splitmix64(i * 0x100000001b3ull + r));
    for (uint64_t j = 0; j < n; j++) {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        uint32_t u = (uint32_t)((state * 0x2545F4914F6CDD1Dull) >> 40); /* 24 bits */
        out[j] = scale * ((float)u / 8388608.0f - 1.0f);
    }
}

static llmem_status fill(void *ctx, size_t index, void *buf, size_t bytes)
{
    synth *sy = ctx;
    const synth_tensor *t = &sy->t[index];
    uint64_t n = t->dims[0], rows = t->n_dims == 2 ? t->dims[1] : 1;
    uint32_t type = tensor_type(sy, t);
    uint64_t row_bytes = llmem_dtype_bytes(type, n);
    if (row_bytes * rows != bytes) return llmem__fail(LLMEM_EINVAL, "synth: tensor '%s' is not %llu bytes", t->name,
                                                      (unsigned long long)bytes);
    for (uint64_t r = 0; r < rows; r++) {
        row_values(sy, index, r, sy->scratch, n);
        llmem_status st = llmem_quantize_row(type, sy->scratch, (unsigned char *)buf + r * row_bytes, (size_t)n);
        if (st) return st;
    }
    return LLMEM_OK;
}

static synth_tensor *add(synth *sy, const char *name, uint32_t n_dims, uint64_t d0, uint64_t d1, bool norm)
{
    synth_tensor *t = &sy->t[sy->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = n_dims;
    t->dims[0] = d0;
    t->dims[1] = d1;
    t->norm = norm;
    t->bias = false;
    return t;
}

static void plan(synth *sy)
{
    const llmem_shape *s = &sy->s;
    uint64_t q = (uint64_t)s->heads * s->head_dim, kv = (uint64_t)s->kv_heads * s->head_dim;
    char name[64];
    add(sy, "token_embd.weight", 2, s->hidden, s->vocab, false);
    for (uint32_t l = 0; l < s->layers; l++) {
#define T(suffix, nd, a, b, norm) snprintf(name, sizeof name, "blk.%u." suffix ".weight", l), add(sy, name, nd, a, b, norm)
        T("attn_norm", 1, s->hidden, 1, true);
        T("attn_q", 2, s->hidden, q, false);
        T("attn_k", 2, s->hidden, kv, false);
        T("attn_v", 2, s->hidden, kv, false);
        if (sy->qwen2) {
            snprintf(name, sizeof name, "blk.%u.attn_q.bias", l), add(sy, name, 1, q, 1, false)->bias = true;
            snprintf(name, sizeof name, "blk.%u.attn_k.bias", l), add(sy, name, 1, kv, 1, false)->bias = true;
            snprintf(name, sizeof name, "blk.%u.attn_v.bias", l), add(sy, name, 1, kv, 1, false)->bias = true;
        }
        T("attn_output", 2, q, s->hidden, false);
        T("ffn_norm", 1, s->hidden, 1, true);
        T("ffn_gate", 2, s->hidden, s->ffn, false);
        T("ffn_down", 2, s->ffn, s->hidden, false);
        T("ffn_up", 2, s->hidden, s->ffn, false);
#undef T
    }
    add(sy, "output_norm.weight", 1, s->hidden, 1, true);
    if (!s->tied_embeddings) add(sy, "output.weight", 2, s->hidden, s->vocab, false);
}

static llmem_status add_vocab(llmem_gguf_writer *w, const char *path, uint32_t vocab)
{
    llmem_tokenizer *tok;
    llmem_status st = llmem_tokenizer_load(path, vocab, &tok);
    if (st) return st;
    char **pieces = calloc(vocab, sizeof *pieces);
    float *scores = calloc(vocab, sizeof *scores);
    int32_t *types = calloc(vocab, sizeof *types);
    if (!pieces || !scores || !types) st = LLMEM_ENOMEM;
    for (uint32_t i = 0; !st && i < vocab; i++) {
        size_t len;
        const char *p = llmem_tokenizer_token(tok, (int32_t)i, &len, &scores[i]);
        /* GGUF's SentencePiece vocabularies write a space as U+2581. */
        char *q = malloc(3 * len + 1);
        if (!q) {
            st = LLMEM_ENOMEM;
            break;
        }
        size_t k = 0;
        for (size_t j = 0; j < len; j++) {
            if (p[j] == ' ') {
                memcpy(q + k, "\xe2\x96\x81", 3);
                k += 3;
            } else {
                q[k++] = p[j];
            }
        }
        q[k] = 0;
        pieces[i] = q;
        bool byte = len == 6 && !strncmp(p, "<0x", 3) && p[5] == '>';
        types[i] = (int32_t)i == llmem_tokenizer_bos(tok) || (int32_t)i == llmem_tokenizer_eos(tok) ? 3
                   : i == 0                                                                        ? 2
                   : byte                                                                          ? 6
                                                                                                   : 1;
    }
    if (!st) st = llmem_gguf_add_str(w, "tokenizer.ggml.model", "llama");
    if (!st) st = llmem_gguf_add_str_array(w, "tokenizer.ggml.tokens", (const char *const *)pieces, vocab);
    if (!st) st = llmem_gguf_add_f32_array(w, "tokenizer.ggml.scores", scores, vocab);
    if (!st) st = llmem_gguf_add_i32_array(w, "tokenizer.ggml.token_type", types, vocab);
    if (!st) st = llmem_gguf_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)llmem_tokenizer_bos(tok));
    if (!st) st = llmem_gguf_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)llmem_tokenizer_eos(tok));
    for (uint32_t i = 0; pieces && i < vocab; i++) free(pieces[i]);
    free(pieces);
    free(scores);
    free(types);
    llmem_tokenizer_destroy(tok);
    return st;
}

/* Without --vocab, a made-up vocabulary of the shape's size so the file
 * runs on its own: <unk>, <s>, </s>, the 256 byte tokens, then printable
 * ASCII characters and "▁" + letter strings, scored so that shorter pieces
 * merge first. Text encodes (bytes fall back), ids decode; the words mean
 * nothing, like the weights. */
static llmem_status add_synthetic_vocab(llmem_gguf_writer *w, uint32_t vocab, bool chatml)
{
    if (vocab < 259 + 95) return LLMEM_OK; /* too small for one: run it with -z */
    char **pieces = calloc(vocab, sizeof *pieces);
    float *scores = calloc(vocab, sizeof *scores);
    int32_t *types = calloc(vocab, sizeof *types);
    llmem_status st = pieces && scores && types ? LLMEM_OK : LLMEM_ENOMEM;
    for (uint32_t i = 0; !st && i < vocab; i++) {
        char buf[48];
        bool im = chatml && i + 2 >= vocab; /* ChatML's two control tokens, last */
        if (im) snprintf(buf, sizeof buf, i + 2 == vocab ? "<|im_start|>" : "<|im_end|>");
        else if (i == 0) snprintf(buf, sizeof buf, "<unk>");
        else if (i == 1) snprintf(buf, sizeof buf, "<s>");
        else if (i == 2) snprintf(buf, sizeof buf, "</s>");
        else if (i < 259) snprintf(buf, sizeof buf, "<0x%02X>", i - 3);
        else if (i == 259) snprintf(buf, sizeof buf, "\xe2\x96\x81"); /* the space, as SentencePiece writes it */
        else if (i < 259 + 95) snprintf(buf, sizeof buf, "%c", (char)(32 + i - 259));
        else {
            /* "▁" then the index in base 26, letters. */
            uint32_t k = i - (259 + 95);
            size_t n = 3;
            memcpy(buf, "\xe2\x96\x81", 3);
            do {
                buf[n++] = (char)('a' + k % 26);
                k /= 26;
            } while (k && n < sizeof buf - 1);
            buf[n] = 0;
        }
        if (!(pieces[i] = strdup(buf))) st = LLMEM_ENOMEM;
        scores[i] = i < 259 ? 0.0f : -(float)i;
        types[i] = im ? 3 : i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1;
    }
    if (!st) st = llmem_gguf_add_str(w, "tokenizer.ggml.model", "llama");
    if (!st) st = llmem_gguf_add_str_array(w, "tokenizer.ggml.tokens", (const char *const *)pieces, vocab);
    if (!st) st = llmem_gguf_add_f32_array(w, "tokenizer.ggml.scores", scores, vocab);
    if (!st) st = llmem_gguf_add_i32_array(w, "tokenizer.ggml.token_type", types, vocab);
    if (!st) st = llmem_gguf_add_u32(w, "tokenizer.ggml.bos_token_id", 1);
    if (!st) st = llmem_gguf_add_u32(w, "tokenizer.ggml.eos_token_id", 2);
    for (uint32_t i = 0; pieces && i < vocab; i++) free(pieces[i]);
    free(pieces);
    free(scores);
    free(types);
    return st;
}

/* The byte-level text of byte b, NUL-terminated, in out[0..3). */
static void byte_level(unsigned b, char out[3])
{
    uint32_t cp = llmem__gpt2_byte_cp(b);
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

static char *concat3(const char *a, const char *sep, const char *b)
{
    size_t la = strlen(a), ls = strlen(sep), lb = strlen(b);
    char *r = malloc(la + ls + lb + 1);
    if (r) {
        memcpy(r, a, la);
        memcpy(r + la, sep, ls);
        memcpy(r + la + ls, b, lb + 1);
    }
    return r;
}

/* Qwen2's chat template (ChatML), as its GGUF files carry it. */
static const char chatml_template[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/* With bpe_pre: a made-up GPT-2 byte-level BPE vocabulary of exactly
 * `vocab` tokens (llmem/synth.h). Breadth first from the space and the
 * letters, each new token is an earlier one + a letter, so every merge's
 * halves are tokens ranked before it, as in a trained vocabulary. The
 * control tokens come last: "<|endoftext|>" (BOS and EOS), and with chatml
 * "<|im_start|>" and "<|im_end|>" (then EOS, as Qwen2 instruct files say)
 * and the ChatML chat template. */
static llmem_status add_bpe_vocab(llmem_gguf_writer *w, uint32_t vocab, const char *pre, bool chatml)
{
    static const char letters[] = "etaoinshrdlcumwfgypbvkjxqz";
    static const char *const control[3] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    uint32_t nc = chatml ? 3 : 1;
    if (vocab < 256 + nc)
        return llmem__fail(LLMEM_EINVAL, "synth: a gpt2 vocabulary needs at least %u tokens (256 bytes and "
                                         "%u control tokens), the shape has %u", 256 + nc, nc, vocab);
    uint32_t nm = vocab - 256 - nc, merged_end = vocab - nc;
    char **tok = calloc(vocab, sizeof *tok), **merges = calloc(nm ? nm : 1, sizeof *merges);
    int32_t *types = calloc(vocab, sizeof *types);
    uint32_t *queue = calloc(vocab, sizeof *queue);
    llmem_status st = tok && merges && types && queue ? LLMEM_OK : LLMEM_ENOMEM;
    char ch[3];
    for (uint32_t b = 0; !st && b < 256; b++) {
        byte_level(b, ch);
        if (!(tok[b] = strdup(ch))) st = LLMEM_ENOMEM;
        types[b] = 1;
    }
    uint32_t n = 256, qh = 0, qt = 0;
    queue[qt++] = ' ';
    for (const char *l = letters; *l; l++) queue[qt++] = (uint32_t)(unsigned char)*l;
    while (!st && n < merged_end && qh < qt) {
        uint32_t left = queue[qh++];
        for (const char *l = letters; !st && *l && n < merged_end; l++) {
            const char *right = tok[(unsigned char)*l];
            tok[n] = concat3(tok[left], "", right);
            merges[n - 256] = concat3(tok[left], " ", right);
            if (!tok[n] || !merges[n - 256]) st = LLMEM_ENOMEM;
            types[n] = 1;
            queue[qt++] = n++;
        }
    }
    if (!st && n != merged_end) st = llmem__fail(LLMEM_EINVAL, "synth: the made-up gpt2 vocabulary ran short");
    for (uint32_t c = 0; !st && c < nc; c++) {
        if (!(tok[merged_end + c] = strdup(control[c]))) st = LLMEM_ENOMEM;
        types[merged_end + c] = 3; /* control */
    }
    if (st == LLMEM_ENOMEM) st = llmem__fail(LLMEM_ENOMEM, "synth: out of memory for a %u-token vocabulary", vocab);
    if (!st) st = llmem_gguf_add_str(w, "tokenizer.ggml.model", "gpt2");
    if (!st) st = llmem_gguf_add_str(w, "tokenizer.ggml.pre", pre);
    if (!st) st = llmem_gguf_add_str_array(w, "tokenizer.ggml.tokens", (const char *const *)tok, vocab);
    if (!st) st = llmem_gguf_add_i32_array(w, "tokenizer.ggml.token_type", types, vocab);
    if (!st) st = llmem_gguf_add_str_array(w, "tokenizer.ggml.merges", (const char *const *)merges, nm);
    if (!st) st = llmem_gguf_add_u32(w, "tokenizer.ggml.bos_token_id", merged_end);
    if (!st) st = llmem_gguf_add_u32(w, "tokenizer.ggml.eos_token_id", vocab - 1);
    if (!st) st = llmem_gguf_add_bool(w, "tokenizer.ggml.add_bos_token", false);
    if (!st && chatml) st = llmem_gguf_add_str(w, "tokenizer.chat_template", chatml_template);
    for (uint32_t i = 0; tok && i < vocab; i++) free(tok[i]);
    for (uint32_t i = 0; merges && i < nm; i++) free(merges[i]);
    free(tok);
    free(merges);
    free(types);
    free(queue);
    return st;
}

/* A Jinja chat template of the family, as real files carry (llmem and
 * llama.cpp recognise the family from its markers). */
static const char *chat_template_text(const char *family)
{
    if (!strcmp(family, "chatml")) return chatml_template;
    if (!strcmp(family, "llama2"))
        return "{% for message in messages %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + "
               "message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' ' + "
               "message['content'] + eos_token }}{% endif %}{% endfor %}";
    return NULL;
}

static llmem_status write_gguf(synth *sy, const char *path, const llmem_synth_options *o)
{
    const llmem_shape *s = &sy->s;
    const char *arch = sy->qwen2 ? "qwen2" : "llama";
    llmem_gguf_writer *w;
    llmem_status st = llmem_gguf_writer_create(&w);
    if (st) return st;
    char desc[160], key[96];
    snprintf(desc, sizeof desc, "synthetic weights (llmem synth, seed %llu): the output text is meaningless",
             (unsigned long long)sy->seed);
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, arch), key)
    if (!st) st = llmem_gguf_add_str(w, "general.architecture", arch);
    if (!st) st = llmem_gguf_add_str(w, "general.name", s->name);
    if (!st) st = llmem_gguf_add_str(w, "general.description", desc);
    if (!st) st = llmem_gguf_add_u32(w, KEY("context_length"), s->max_ctx);
    if (!st) st = llmem_gguf_add_u32(w, KEY("embedding_length"), s->hidden);
    if (!st) st = llmem_gguf_add_u32(w, KEY("block_count"), s->layers);
    if (!st) st = llmem_gguf_add_u32(w, KEY("feed_forward_length"), s->ffn);
    if (!st) st = llmem_gguf_add_u32(w, KEY("attention.head_count"), s->heads);
    if (!st) st = llmem_gguf_add_u32(w, KEY("attention.head_count_kv"), s->kv_heads);
    if (!st) st = llmem_gguf_add_u32(w, KEY("rope.dimension_count"), s->head_dim);
    if (!st) st = llmem_gguf_add_f32(w, KEY("rope.freq_base"), (float)s->rope_theta);
    if (!st) st = llmem_gguf_add_f32(w, KEY("attention.layer_norm_rms_epsilon"), sy->qwen2 ? 1e-6f : 1e-5f);
    if (!st) st = llmem_gguf_add_u32(w, KEY("vocab_size"), s->vocab);
    if (!st && o->sliding_window) st = llmem_gguf_add_u32(w, KEY("attention.sliding_window"), o->sliding_window);
#undef KEY
    const char *bpe = o->bpe_pre ? o->bpe_pre : sy->qwen2 && !o->vocab_path ? "qwen2" : NULL;
    const char *chat = o->chat_template;
    /* A qwen2 BPE vocabulary carries ChatML unless another template is asked for. */
    if (!st) st = bpe           ? add_bpe_vocab(w, s->vocab, bpe, sy->qwen2 && !chat)
                  : o->vocab_path ? add_vocab(w, o->vocab_path, s->vocab)
                                  : add_synthetic_vocab(w, s->vocab, chat && !strcmp(chat, "chatml"));
    if (!st && chat) st = llmem_gguf_add_str(w, "tokenizer.chat_template", chat_template_text(chat));
    for (size_t i = 0; !st && i < sy->n; i++) {
        const synth_tensor *t = &sy->t[i];
        st = llmem_gguf_add_tensor(w, t->name, tensor_type(sy, t), t->n_dims, t->dims, fill, sy);
    }
    if (!st) st = llmem_gguf_write(w, path, o->progress);
    llmem_gguf_writer_destroy(w);
    return st;
}

/* llama2.c's layout: all layers of one kind together, in run.c's order. */
static llmem_status write_llama2c(synth *sy, const char *path)
{
    const llmem_shape *s = &sy->s;
    if (s->head_dim * s->heads != s->hidden) {
        return llmem__fail(LLMEM_ENOTSUP, "synth: llama2.c checkpoints need head_dim x heads = hidden");
    }
    llmem_outfile *of; /* a temporary file beside path, renamed over it at the end */
    if (llmem_outfile_open(path, &of)) return llmem__fail_prefix("synth");
    FILE *f = llmem_outfile_stream(of);
    int32_t hdr[7] = {(int32_t)s->hidden, (int32_t)s->ffn, (int32_t)s->layers, (int32_t)s->heads,
                      (int32_t)s->kv_heads, (int32_t)s->vocab, (int32_t)s->max_ctx};
    if (!s->tied_embeddings) hdr[5] = -hdr[5];
    bool ok = fwrite(hdr, sizeof hdr, 1, f) == 1;
    /* Tensor index in plan(): 0 embedding, then 9 per layer, then the norm and output. */
    static const int order[] = {-1, 0, 1, 2, 3, 4, 5, 6, 7, 8, -2, -3, -4};
    size_t max_bytes = 0;
    for (size_t i = 0; i < sy->n; i++) {
        size_t b = (size_t)(sy->t[i].dims[0] * (sy->t[i].n_dims == 2 ? sy->t[i].dims[1] : 1) * 4);
        if (b > max_bytes) max_bytes = b;
    }
    void *buf = malloc(max_bytes ? max_bytes : 1);
    if (!buf) ok = false;
    for (size_t k = 0; ok && k < sizeof order / sizeof order[0]; k++) {
        size_t first, count = 1, stride = 0;
        if (order[k] == -1) first = 0;
        else if (order[k] == -2) first = 1 + 9 * (size_t)s->layers; /* output_norm */
        else if (order[k] == -3) {
            /* freq_cis_real and _imag: run.c skips them. */
            size_t zeros = (size_t)s->max_ctx * s->head_dim; /* two halves */
            float z = 0;
            for (size_t j = 0; ok && j < zeros; j++) ok = fwrite(&z, 4, 1, f) == 1;
            continue;
        } else if (order[k] == -4) {
            if (s->tied_embeddings) continue;
            first = 2 + 9 * (size_t)s->layers;
        } else {
            first = 1 + (size_t)order[k];
            count = s->layers;
            stride = 9;
        }
        for (size_t l = 0; ok && l < count; l++) {
            size_t i = first + l * stride;
            const synth_tensor *t = &sy->t[i];
            size_t bytes = (size_t)(t->dims[0] * (t->n_dims == 2 ? t->dims[1] : 1) * 4);
            uint32_t saved = sy->type;
            sy->type = LLMEM_DTYPE_F32;
            ok = fill(sy, i, buf, bytes) == LLMEM_OK && fwrite(buf, bytes, 1, f) == 1;
            sy->type = saved;
        }
    }
    free(buf);
    if (!ok) {
        llmem_outfile_abort(of);
        return llmem__fail(LLMEM_EIO, "synth: writing '%s' failed", path);
    }
    if (llmem_outfile_commit(of)) return llmem__fail_prefix("synth");
    return LLMEM_OK;
}

/* Take the synthesiser's buffers for a shape; false if out of memory. */
static bool synth_init(synth *sy)
{
    sy->t = calloc(3 + 12 * (size_t)sy->s.layers, sizeof *sy->t);
    uint32_t widest = sy->s.hidden > sy->s.ffn ? sy->s.hidden : sy->s.ffn;
    if (sy->s.heads * sy->s.head_dim > widest) widest = sy->s.heads * sy->s.head_dim;
    sy->scratch = malloc((size_t)widest * sizeof *sy->scratch);
    if (!sy->t || !sy->scratch) {
        free(sy->t);
        free(sy->scratch);
        sy->t = NULL;
        sy->scratch = NULL;
        return false;
    }
    plan(sy);
    return true;
}

static llmem_status check_shape(const llmem_shape *s)
{
    if (!s) return llmem__fail(LLMEM_EINVAL, "synth: null shape");
    if (!s->layers || !s->hidden || !s->heads || !s->kv_heads || !s->head_dim || !s->ffn || !s->vocab || !s->max_ctx)
        return llmem__fail(LLMEM_EINVAL, "synth: incomplete shape '%s'", s->name);
    if (s->layers > 4096)
        return llmem__fail(LLMEM_EINVAL, "synth: %u layers is absurd", s->layers);
    return LLMEM_OK;
}

llmem_status llmem_synth_gguf(const llmem_shape *shape, const llmem_synth_options *opts, const char *path)
{
    llmem_status st = check_shape(shape);
    if (st) return st;
    if (!path) return llmem__fail(LLMEM_EINVAL, "synth: null path");
    llmem_synth_options o = opts ? *opts : (llmem_synth_options){0};
    if (!llmem_dtype_is_quantizable(o.type))
        return llmem__fail(LLMEM_EINVAL, "synth: type %u cannot be written", o.type);
    if (o.bpe_pre && o.vocab_path)
        return llmem__fail(LLMEM_EINVAL, "synth: give a vocabulary file or a made-up BPE vocabulary, not both");
    if (o.chat_template && !chat_template_text(o.chat_template))
        return llmem__fail(LLMEM_EINVAL, "synth: chat template '%s': use chatml or llama2", o.chat_template);
    bool qwen2 = o.arch && !strcmp(o.arch, "qwen2");
    if (o.arch && !qwen2 && strcmp(o.arch, "llama"))
        return llmem__fail(LLMEM_EINVAL, "synth: architecture '%s' unknown (llama or qwen2)", o.arch);
    if (qwen2 && shape->heads * shape->head_dim != shape->hidden)
        return llmem__fail(LLMEM_ENOTSUP, "synth: qwen2 files need heads x head_dim = hidden (%u x %u != %u)",
                           shape->heads, shape->head_dim, shape->hidden);
    if (o.sliding_window > shape->max_ctx)
        return llmem__fail(LLMEM_EINVAL, "synth: sliding window %u beyond the context %u", o.sliding_window,
                           shape->max_ctx);
    synth sy;
    memset(&sy, 0, sizeof sy);
    sy.s = *shape;
    sy.seed = o.seed;
    sy.type = o.type;
    sy.qwen2 = qwen2;
    if (!synth_init(&sy)) return llmem__fail(LLMEM_ENOMEM, "synth: out of memory");
    st = write_gguf(&sy, path, &o);
    free(sy.t);
    free(sy.scratch);
    return st;
}

llmem_status llmem_synth_llama2c(const llmem_shape *shape, uint64_t seed, const char *path)
{
    llmem_status st = check_shape(shape);
    if (st) return st;
    if (!path) return llmem__fail(LLMEM_EINVAL, "synth: null path");
    synth sy;
    memset(&sy, 0, sizeof sy);
    sy.s = *shape;
    sy.seed = seed;
    sy.type = LLMEM_DTYPE_F32;
    if (!synth_init(&sy)) return llmem__fail(LLMEM_ENOMEM, "synth: out of memory");
    st = write_llama2c(&sy, path);
    free(sy.t);
    free(sy.scratch);
    return st;
}
