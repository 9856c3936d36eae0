/*
 * chat_template.c - the llama-2 and ChatML chat formats, rendered straight
 * to token ids (llmem/openai.h).
 *
 * Special tokens (BOS, EOS, <|im_start|>, <|im_end|>) are ids put in by the
 * renderer; message text is encoded as text, so a user who writes
 * "<|im_end|>" or "</s>" in a message gets those characters, never the
 * control token. The first text of a prompt gets the tokenizer's dummy
 * prefix as SentencePiece gives every sentence; text that follows a
 * special token is a fragment (llmem_tokenizer_encode_fragment), as the
 * model saw it in training.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/openai.h"

#include "internal.h"

const char *llmem_chat_template_name(llmem_chat_template t)
{
    switch (t) {
    case LLMEM_CHAT_TEMPLATE_NONE: return "none";
    case LLMEM_CHAT_TEMPLATE_LLAMA2: return "llama2";
    case LLMEM_CHAT_TEMPLATE_CHATML: return "chatml";
    }
    return "?";
}

static bool contains(const char *s, size_t len, const char *what)
{
    return memmem(s, len, what, strlen(what)) != NULL;
}

llmem_chat_template llmem_chat_template_detect(const char *text, size_t len)
{
    if (!text) return LLMEM_CHAT_TEMPLATE_NONE;
    /* ChatML first: some ChatML templates mention [INST] in comments, no
     * llama-2 template uses <|im_start|>. */
    if (contains(text, len, "<|im_start|>")) return LLMEM_CHAT_TEMPLATE_CHATML;
    if (contains(text, len, "[INST]") && contains(text, len, "[/INST]")) return LLMEM_CHAT_TEMPLATE_LLAMA2;
    return LLMEM_CHAT_TEMPLATE_NONE;
}

llmem_chat_template llmem_chat_template_of_model(const llmem_model *m)
{
    const char *s;
    size_t len;
    if (!m || llmem_model_meta_str(m, "tokenizer.chat_template", &s, &len)) return LLMEM_CHAT_TEMPLATE_NONE;
    return llmem_chat_template_detect(s, len);
}

static int32_t find_token(const llmem_tokenizer *tok, const char *piece)
{
    uint32_t V = llmem_tokenizer_vocab_size(tok);
    size_t want = strlen(piece);
    for (uint32_t i = 0; i < V; i++) {
        size_t len;
        const char *p = llmem_tokenizer_token(tok, (int32_t)i, &len, NULL);
        if (p && len == want && !memcmp(p, piece, len)) return (int32_t)i;
    }
    return -1;
}

llmem_status llmem_chat_format_init(llmem_chat_template t, const llmem_tokenizer *tok, llmem_chat_format *out)
{
    if (!tok || !out) return llmem__fail(LLMEM_EINVAL, "chat template: null argument");
    memset(out, 0, sizeof *out);
    out->t = t;
    out->bos = llmem_tokenizer_bos(tok);
    out->eos = llmem_tokenizer_eos(tok);
    out->im_start = out->im_end = -1;
    switch (t) {
    case LLMEM_CHAT_TEMPLATE_LLAMA2:
        if (out->bos < 0 || out->eos < 0)
            return llmem__fail(LLMEM_ENOTSUP, "chat template llama2: the vocabulary has no BOS/EOS tokens");
        return LLMEM_OK;
    case LLMEM_CHAT_TEMPLATE_CHATML:
        out->im_start = find_token(tok, "<|im_start|>");
        out->im_end = find_token(tok, "<|im_end|>");
        if (out->im_start < 0 || out->im_end < 0)
            return llmem__fail(LLMEM_ENOTSUP, "chat template chatml: the vocabulary has no %s token",
                               out->im_start < 0 ? "<|im_start|>" : "<|im_end|>");
        return LLMEM_OK;
    default: return llmem__fail(LLMEM_EINVAL, "chat template: none to bind");
    }
}

typedef struct ids {
    int32_t *v;
    size_t n, cap;
    bool failed;
} ids;

static void put(ids *d, int32_t t)
{
    if (d->failed) return;
    if (d->n == d->cap) {
        size_t c = d->cap ? d->cap * 2 : 256;
        int32_t *nv = realloc(d->v, c * sizeof *nv);
        if (!nv) {
            d->failed = true;
            return;
        }
        d->v = nv;
        d->cap = c;
    }
    d->v[d->n++] = t;
}

/* Encode text (whole prompt start: with the dummy prefix; else a fragment). */
static void put_text(ids *d, const llmem_tokenizer *tok, const char *text, bool fragment)
{
    if (d->failed || !text[0]) return;
    size_t cap = strlen(text) + 3, n = 0;
    int32_t *tmp = malloc(cap * sizeof *tmp);
    if (!tmp) {
        d->failed = true;
        return;
    }
    llmem_status st = fragment ? llmem_tokenizer_encode_fragment(tok, text, tmp, cap, &n)
                               : llmem_tokenizer_encode(tok, text, false, false, tmp, cap, &n);
    if (st) d->failed = true;
    for (size_t i = 0; !st && i < n; i++) put(d, tmp[i]);
    free(tmp);
}

/* Whitespace trimmed at both ends into a new string (Meta's format strips
 * every message). */
static char *strip(const char *s)
{
    while (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\t' || s[n - 1] == '\r')) n--;
    char *o = malloc(n + 1);
    if (o) {
        memcpy(o, s, n);
        o[n] = 0;
    }
    return o;
}

static llmem_status role_error(llmem_oai_error *err, const char *fmt, size_t i)
{
    if (err) {
        err->http_status = 400;
        err->type = "invalid_request_error";
        snprintf(err->param, sizeof err->param, "messages");
        snprintf(err->message, sizeof err->message, fmt, i);
    }
    return llmem__fail(LLMEM_EINVAL, "chat template: bad order of roles at message %zu", i);
}

static llmem_status render_llama2(const llmem_chat_format *f, const llmem_tokenizer *tok, const llmem_oai_message *m,
                                  size_t count, ids *d, llmem_oai_error *err)
{
    size_t i = 0;
    const char *sys = NULL;
    if (m[0].role == LLMEM_CHAT_SYSTEM) {
        sys = m[0].content;
        i = 1;
    }
    if (i == count) return role_error(err, "the llama2 chat template needs a user message after the system one (%zu)", i);
    for (size_t turn = 0; i < count; turn++) {
        if (m[i].role != LLMEM_CHAT_USER)
            return role_error(err, "the llama2 chat template needs user and assistant turns to alternate, "
                                   "starting with user (message %zu)", i);
        char *u = strip(m[i].content);
        char *s = sys && turn == 0 ? strip(sys) : NULL;
        if (!u || (sys && turn == 0 && !s)) {
            free(u);
            free(s);
            return llmem__fail(LLMEM_ENOMEM, "chat template: out of memory");
        }
        size_t need = strlen(u) + (s ? strlen(s) : 0) + 64;
        char *text = malloc(need);
        if (!text) {
            free(u);
            free(s);
            return llmem__fail(LLMEM_ENOMEM, "chat template: out of memory");
        }
        if (s) snprintf(text, need, "[INST] <<SYS>>\n%s\n<</SYS>>\n\n%s [/INST]", s, u);
        else snprintf(text, need, "[INST] %s [/INST]", u);
        free(u);
        free(s);
        put(d, f->bos);
        put_text(d, tok, text, false);
        free(text);
        i++;
        if (i == count) break;
        if (m[i].role != LLMEM_CHAT_ASSISTANT)
            return role_error(err, "the llama2 chat template needs user and assistant turns to alternate "
                                   "(message %zu)", i);
        char *a = strip(m[i].content);
        if (!a) return llmem__fail(LLMEM_ENOMEM, "chat template: out of memory");
        put_text(d, tok, a, false); /* " answer": the tokenizer's dummy prefix is the space */
        free(a);
        put(d, f->eos);
        i++;
        if (i == count)
            return role_error(err, "the llama2 chat template needs the last message to be the user's (message %zu)",
                              i - 1);
    }
    return LLMEM_OK;
}

static llmem_status render_chatml(const llmem_chat_format *f, const llmem_tokenizer *tok, const llmem_oai_message *m,
                                  size_t count, ids *d, llmem_oai_error *err)
{
    static const char *const role_name[] = {"system", "user", "assistant"};
    if (m[count - 1].role == LLMEM_CHAT_ASSISTANT)
        return role_error(err, "the chatml chat template needs the last message to be the user's or system's "
                               "(message %zu)", count - 1);
    for (size_t i = 0; i < count; i++) {
        size_t need = strlen(m[i].content) + 16;
        char *text = malloc(need);
        if (!text) return llmem__fail(LLMEM_ENOMEM, "chat template: out of memory");
        snprintf(text, need, "%s\n%s", role_name[m[i].role], m[i].content);
        put(d, f->im_start);
        put_text(d, tok, text, true);
        free(text);
        put(d, f->im_end);
        put_text(d, tok, "\n", true);
    }
    put(d, f->im_start);
    put_text(d, tok, "assistant\n", true);
    return LLMEM_OK;
}

llmem_status llmem_chat_render(const llmem_chat_format *f, const llmem_tokenizer *tok, const llmem_oai_message *msgs,
                               size_t count, int32_t **out, size_t *n, int32_t *stop_token, llmem_oai_error *err)
{
    if (out) *out = NULL;
    if (n) *n = 0;
    if (!f || !tok || !out || !n || (count && !msgs)) return llmem__fail(LLMEM_EINVAL, "chat render: null argument");
    if (!count) return role_error(err, "no messages (%zu)", 0);
    ids d = {0};
    llmem_status st;
    switch (f->t) {
    case LLMEM_CHAT_TEMPLATE_LLAMA2: st = render_llama2(f, tok, msgs, count, &d, err); break;
    case LLMEM_CHAT_TEMPLATE_CHATML: st = render_chatml(f, tok, msgs, count, &d, err); break;
    default: st = llmem__fail(LLMEM_EINVAL, "chat render: no template");
    }
    if (!st && d.failed) st = llmem__fail(LLMEM_ENOMEM, "chat render: out of memory");
    if (st) {
        free(d.v);
        return st;
    }
    if (stop_token) *stop_token = f->t == LLMEM_CHAT_TEMPLATE_CHATML ? f->im_end : f->eos;
    *out = d.v;
    *n = d.n;
    return LLMEM_OK;
}
