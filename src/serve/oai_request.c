/*
 * oai_request.c - OpenAI request bodies parsed and checked (llmem/openai.h).
 *
 * The body is parsed by cJSON (cJSON_ParseWithLength: no NUL needed, no
 * read past len); then each field is taken by name from the object, its
 * type checked (a number where a number belongs, an integer where a count
 * belongs, in range), and the first problem is reported with its parameter
 * name. Everything the request keeps is copied out of the cJSON tree, which
 * is freed before returning. Strings are checked to be valid UTF-8 (a
 * response must never echo invalid text) and free of NUL bytes (cJSON's
 * strings are NUL-terminated: "\u0000" inside would cut them short).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "llmem/openai.h"

#include "internal.h"
#include "serve_internal.h"

static llmem_status bad(llmem_oai_error *err, llmem_status st, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static llmem_status bad(llmem_oai_error *err, llmem_status st, const char *param, const char *fmt, ...)
{
    if (err) {
        err->http_status = 400;
        err->type = "invalid_request_error";
        snprintf(err->param, sizeof err->param, "%s", param ? param : "");
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        return llmem__fail(st, "openai: %s", err->message);
    }
    return llmem__fail(st, "openai: bad request (%s)", param ? param : "body");
}

void llmem_oai_request_free(llmem_oai_request *r)
{
    if (!r) return;
    free(r->model);
    free(r->prompt);
    free(r->prompt_ids);
    for (uint32_t i = 0; r->messages && i < r->message_count; i++) free(r->messages[i].content);
    free(r->messages);
    for (uint32_t i = 0; r->stop && i < r->stop_count; i++) free(r->stop[i]);
    free(r->stop);
    free(r);
}

/* Valid UTF-8 (no overlong forms, no surrogates, at most U+10FFFF). */
static bool utf8_valid(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t len = strlen(s);
    for (size_t i = 0; i < len;) {
        bool incomplete;
        size_t c = llmem__utf8_char(p + i, len - i, &incomplete);
        if (!c) return false;
        i += c;
    }
    return true;
}

static llmem_status take_string(const cJSON *v, const char *param, llmem_oai_error *err, char **out)
{
    if (!cJSON_IsString(v) || !v->valuestring) return bad(err, LLMEM_EINVAL, param, "'%s' must be a string", param);
    if (!utf8_valid(v->valuestring)) return bad(err, LLMEM_EINVAL, param, "'%s' is not valid UTF-8", param);
    *out = strdup(v->valuestring);
    if (!*out) return llmem__fail(LLMEM_ENOMEM, "openai: out of memory");
    return LLMEM_OK;
}

/* A JSON number that is a whole number in [lo, hi]. */
static llmem_status take_int(const cJSON *v, const char *param, double lo, double hi, llmem_oai_error *err,
                             double *out)
{
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble != floor(v->valuedouble))
        return bad(err, LLMEM_EINVAL, param, "'%s' must be an integer", param);
    if (v->valuedouble < lo || v->valuedouble > hi)
        return bad(err, LLMEM_EINVAL, param, "'%s' is %.17g; it must be in [%.17g, %.17g]", param, v->valuedouble,
                   lo, hi);
    *out = v->valuedouble;
    return LLMEM_OK;
}

static llmem_status take_num(const cJSON *v, const char *param, double lo, double hi, llmem_oai_error *err,
                             double *out)
{
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return bad(err, LLMEM_EINVAL, param, "'%s' must be a number", param);
    if (v->valuedouble < lo || v->valuedouble > hi)
        return bad(err, LLMEM_EINVAL, param, "'%s' is %g; it must be in [%g, %g]", param, v->valuedouble, lo, hi);
    *out = v->valuedouble;
    return LLMEM_OK;
}

static llmem_status parse_stop(const cJSON *v, llmem_oai_request *r, llmem_oai_error *err)
{
    if (!v || cJSON_IsNull(v)) return LLMEM_OK;
    size_t n = cJSON_IsString(v) ? 1 : cJSON_IsArray(v) ? (size_t)cJSON_GetArraySize(v) : 0;
    if (!cJSON_IsString(v) && !cJSON_IsArray(v))
        return bad(err, LLMEM_EINVAL, "stop", "'stop' must be a string or an array of strings");
    if (n > LLMEM_OAI_MAX_STOP)
        return bad(err, LLMEM_EINVAL, "stop", "'stop' has %zu strings; at most %u are taken", n, LLMEM_OAI_MAX_STOP);
    if (!n) return LLMEM_OK;
    r->stop = calloc(n, sizeof *r->stop);
    if (!r->stop) return llmem__fail(LLMEM_ENOMEM, "openai: out of memory");
    const cJSON *it = cJSON_IsString(v) ? v : v->child;
    for (size_t i = 0; i < n; i++, it = it->next) {
        llmem_status st = take_string(it, "stop", err, &r->stop[i]);
        if (st) return st;
        r->stop_count++;
        size_t len = strlen(r->stop[i]);
        if (!len) return bad(err, LLMEM_EINVAL, "stop", "a stop string is empty");
        if (len > LLMEM_OAI_MAX_STOP_BYTES)
            return bad(err, LLMEM_EINVAL, "stop", "a stop string has %zu bytes; at most %u are taken", len,
                       LLMEM_OAI_MAX_STOP_BYTES);
    }
    return LLMEM_OK;
}

static llmem_status parse_prompt(const cJSON *v, llmem_oai_request *r, llmem_oai_error *err)
{
    if (!v) return bad(err, LLMEM_EINVAL, "prompt", "'prompt' is required");
    if (cJSON_IsString(v)) return take_string(v, "prompt", err, &r->prompt);
    if (!cJSON_IsArray(v))
        return bad(err, LLMEM_EINVAL, "prompt", "'prompt' must be a string, an array of one string or of token ids");
    int n = cJSON_GetArraySize(v);
    if (n == 0) return bad(err, LLMEM_EINVAL, "prompt", "'prompt' is an empty array");
    if (cJSON_IsString(v->child)) {
        if (n > 1)
            return bad(err, LLMEM_ENOTSUP, "prompt",
                       "'prompt' has %d strings; this server takes one prompt per request", n);
        return take_string(v->child, "prompt", err, &r->prompt);
    }
    if (cJSON_IsArray(v->child))
        return bad(err, LLMEM_ENOTSUP, "prompt", "'prompt' as arrays of token arrays: one prompt per request");
    r->prompt_ids = malloc((size_t)n * sizeof *r->prompt_ids);
    if (!r->prompt_ids) return llmem__fail(LLMEM_ENOMEM, "openai: out of memory");
    const cJSON *it = v->child;
    for (int i = 0; i < n; i++, it = it->next) {
        double d;
        llmem_status st = take_int(it, "prompt", 0, INT32_MAX, err, &d);
        if (st) return st;
        r->prompt_ids[i] = (int32_t)d;
    }
    r->prompt_id_count = (uint32_t)n;
    return LLMEM_OK;
}

/* A message's content: a string, or an array of {"type":"text","text":...}
 * parts, joined. */
static llmem_status parse_content(const cJSON *c, llmem_oai_error *err, char **out)
{
    if (cJSON_IsString(c)) return take_string(c, "messages", err, out);
    if (!cJSON_IsArray(c))
        return bad(err, LLMEM_EINVAL, "messages", "a message's 'content' must be a string or an array of text parts");
    size_t total = 0;
    for (const cJSON *p = c->child; p; p = p->next) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsObject(p) || !cJSON_IsString(type) || strcmp(type->valuestring, "text"))
            return bad(err, LLMEM_ENOTSUP, "messages", "only content parts of type 'text' are taken");
        if (!cJSON_IsString(text)) return bad(err, LLMEM_EINVAL, "messages", "a text part needs a string 'text'");
        if (!utf8_valid(text->valuestring)) return bad(err, LLMEM_EINVAL, "messages", "'text' is not valid UTF-8");
        total += strlen(text->valuestring);
    }
    char *s = malloc(total + 1);
    if (!s) return llmem__fail(LLMEM_ENOMEM, "openai: out of memory");
    size_t o = 0;
    for (const cJSON *p = c->child; p; p = p->next) {
        const char *t = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        size_t l = strlen(t);
        memcpy(s + o, t, l);
        o += l;
    }
    s[o] = 0;
    *out = s;
    return LLMEM_OK;
}

static llmem_status parse_messages(const cJSON *v, llmem_oai_request *r, llmem_oai_error *err)
{
    if (!v) return bad(err, LLMEM_EINVAL, "messages", "'messages' is required");
    if (!cJSON_IsArray(v)) return bad(err, LLMEM_EINVAL, "messages", "'messages' must be an array");
    int n = cJSON_GetArraySize(v);
    if (n == 0) return bad(err, LLMEM_EINVAL, "messages", "'messages' is empty");
    if ((unsigned)n > LLMEM_OAI_MAX_MESSAGES)
        return bad(err, LLMEM_EINVAL, "messages", "'messages' has %d entries; at most %u are taken", n,
                   LLMEM_OAI_MAX_MESSAGES);
    r->messages = calloc((size_t)n, sizeof *r->messages);
    if (!r->messages) return llmem__fail(LLMEM_ENOMEM, "openai: out of memory");
    const cJSON *m = v->child;
    for (int i = 0; i < n; i++, m = m->next) {
        if (!cJSON_IsObject(m)) return bad(err, LLMEM_EINVAL, "messages", "message %d is not an object", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsString(role)) return bad(err, LLMEM_EINVAL, "messages", "message %d has no string 'role'", i);
        llmem_chat_role rl;
        if (!strcmp(role->valuestring, "system") || !strcmp(role->valuestring, "developer")) rl = LLMEM_CHAT_SYSTEM;
        else if (!strcmp(role->valuestring, "user")) rl = LLMEM_CHAT_USER;
        else if (!strcmp(role->valuestring, "assistant")) rl = LLMEM_CHAT_ASSISTANT;
        else
            return bad(err, LLMEM_ENOTSUP, "messages",
                       "message %d has role '%.40s'; the roles taken are system, user and assistant", i,
                       role->valuestring);
        if (!content || cJSON_IsNull(content))
            return bad(err, LLMEM_EINVAL, "messages", "message %d has no 'content'", i);
        r->messages[i].role = rl;
        llmem_status st = parse_content(content, err, &r->messages[i].content);
        if (st) return st;
        r->message_count++;
    }
    return LLMEM_OK;
}

/* Fields that an OpenAI client may send and that change nothing at their
 * neutral value; anything else is refused by name. */
static llmem_status check_neutral(const cJSON *o, llmem_oai_kind kind, llmem_oai_error *err)
{
    static const char *const zero[] = {"presence_penalty", "frequency_penalty"};
    for (size_t i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, zero[i]);
        if (!v || cJSON_IsNull(v)) continue;
        if (!cJSON_IsNumber(v)) return bad(err, LLMEM_EINVAL, zero[i], "'%s' must be a number", zero[i]);
        if (v->valuedouble != 0) return bad(err, LLMEM_ENOTSUP, zero[i], "'%s' is not supported (only 0)", zero[i]);
    }
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(o, "logprobs");
    if (lp && !cJSON_IsNull(lp) && !cJSON_IsFalse(lp) && !(cJSON_IsNumber(lp) && lp->valuedouble == 0))
        return bad(err, LLMEM_ENOTSUP, "logprobs", "'logprobs' is not supported");
    const cJSON *tl = cJSON_GetObjectItemCaseSensitive(o, "top_logprobs");
    if (tl && !cJSON_IsNull(tl) && !(cJSON_IsNumber(tl) && tl->valuedouble == 0))
        return bad(err, LLMEM_ENOTSUP, "top_logprobs", "'top_logprobs' is not supported");
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(o, "logit_bias");
    if (lb && !cJSON_IsNull(lb) && !(cJSON_IsObject(lb) && !lb->child))
        return bad(err, LLMEM_ENOTSUP, "logit_bias", "'logit_bias' is not supported");
    if (kind == LLMEM_OAI_COMPLETION) {
        const cJSON *echo = cJSON_GetObjectItemCaseSensitive(o, "echo");
        if (echo && !cJSON_IsNull(echo) && !cJSON_IsFalse(echo))
            return bad(err, LLMEM_ENOTSUP, "echo", "'echo' is not supported");
        const cJSON *suffix = cJSON_GetObjectItemCaseSensitive(o, "suffix");
        if (suffix && !cJSON_IsNull(suffix) && !(cJSON_IsString(suffix) && !suffix->valuestring[0]))
            return bad(err, LLMEM_ENOTSUP, "suffix", "'suffix' is not supported");
        const cJSON *bo = cJSON_GetObjectItemCaseSensitive(o, "best_of");
        if (bo && !cJSON_IsNull(bo) && !(cJSON_IsNumber(bo) && bo->valuedouble == 1))
            return bad(err, LLMEM_ENOTSUP, "best_of", "'best_of' is not supported (only 1)");
    } else {
        const cJSON *tools = cJSON_GetObjectItemCaseSensitive(o, "tools");
        if (tools && !cJSON_IsNull(tools) && !(cJSON_IsArray(tools) && !tools->child))
            return bad(err, LLMEM_ENOTSUP, "tools", "'tools' is not supported");
        const cJSON *rf = cJSON_GetObjectItemCaseSensitive(o, "response_format");
        if (rf && !cJSON_IsNull(rf)) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(rf, "type");
            if (!cJSON_IsString(t) || strcmp(t->valuestring, "text"))
                return bad(err, LLMEM_ENOTSUP, "response_format", "only 'response_format' {\"type\":\"text\"}");
        }
    }
    return LLMEM_OK;
}

static llmem_status parse_object(llmem_oai_kind kind, const cJSON *o, llmem_oai_request *r, llmem_oai_error *err)
{
    llmem_status st;
    const cJSON *v;
    double d;
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "model")) && !cJSON_IsNull(v) &&
        (st = take_string(v, "model", err, &r->model)))
        return st;
    if (kind == LLMEM_OAI_COMPLETION) st = parse_prompt(cJSON_GetObjectItemCaseSensitive(o, "prompt"), r, err);
    else st = parse_messages(cJSON_GetObjectItemCaseSensitive(o, "messages"), r, err);
    if (st) return st;
    /* max_completion_tokens is the chat API's newer name; it wins. */
    const char *mt = "max_tokens";
    v = cJSON_GetObjectItemCaseSensitive(o, mt);
    const cJSON *mct = cJSON_GetObjectItemCaseSensitive(o, "max_completion_tokens");
    if (mct && !cJSON_IsNull(mct)) {
        v = mct;
        mt = "max_completion_tokens";
    }
    if (v && !cJSON_IsNull(v)) {
        if ((st = take_int(v, mt, 1, 1u << 24, err, &d))) return st;
        r->max_tokens = (uint32_t)d;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "temperature")) && !cJSON_IsNull(v)) {
        if ((st = take_num(v, "temperature", 0, 2, err, &d))) return st;
        r->temperature = (float)d;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "top_p")) && !cJSON_IsNull(v)) {
        if ((st = take_num(v, "top_p", 0, 1, err, &d))) return st;
        if (d <= 0) return bad(err, LLMEM_EINVAL, "top_p", "'top_p' must be above 0");
        r->top_p = (float)d;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "n")) && !cJSON_IsNull(v)) {
        if ((st = take_int(v, "n", 1, LLMEM_OAI_MAX_N, err, &d))) return st;
        r->n = (uint32_t)d;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "seed")) && !cJSON_IsNull(v)) {
        /* JSON numbers are doubles here: integers up to 2^53 are exact. */
        if ((st = take_int(v, "seed", -9007199254740992.0, 9007199254740992.0, err, &d))) return st;
        r->seed = (uint64_t)(int64_t)d;
        r->seed_set = true;
    }
    if ((st = parse_stop(cJSON_GetObjectItemCaseSensitive(o, "stop"), r, err))) return st;
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "stream")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsBool(v)) return bad(err, LLMEM_EINVAL, "stream", "'stream' must be a boolean");
        r->stream = cJSON_IsTrue(v);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "stream_options")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsObject(v)) return bad(err, LLMEM_EINVAL, "stream_options", "'stream_options' must be an object");
        if (!r->stream)
            return bad(err, LLMEM_EINVAL, "stream_options", "'stream_options' is only allowed with 'stream': true");
        const cJSON *iu = cJSON_GetObjectItemCaseSensitive(v, "include_usage");
        if (iu && !cJSON_IsNull(iu)) {
            if (!cJSON_IsBool(iu))
                return bad(err, LLMEM_EINVAL, "stream_options", "'include_usage' must be a boolean");
            r->include_usage = cJSON_IsTrue(iu);
        }
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "return_token_ids")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsBool(v)) return bad(err, LLMEM_EINVAL, "return_token_ids", "'return_token_ids' must be a boolean");
        r->return_token_ids = cJSON_IsTrue(v);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "user")) && !cJSON_IsNull(v) && !cJSON_IsString(v))
        return bad(err, LLMEM_EINVAL, "user", "'user' must be a string");
    return check_neutral(o, kind, err);
}

/* "\u0000" escaped in a JSON string (an odd run of backslashes before
 * it): cJSON would cut the string there, so it is refused instead. A raw
 * NUL byte is not valid JSON and cJSON refuses it. */
static bool has_nul_escape(const char *b, size_t len)
{
    for (size_t i = 0; b && i + 6 <= len; i++) {
        if (b[i] != '\\' || b[i + 1] != 'u' || memcmp(b + i + 2, "0000", 4)) continue;
        size_t k = 0;
        while (k < i && b[i - 1 - k] == '\\') k++;
        if (k % 2 == 0) return true;
    }
    return false;
}

llmem_status llmem_oai_request_parse(llmem_oai_kind kind, const char *body, size_t len, llmem_oai_request **out,
                                     llmem_oai_error *err)
{
    if (out) *out = NULL;
    if (err) memset(err, 0, sizeof *err);
    if (!out || (!body && len)) return llmem__fail(LLMEM_EINVAL, "openai: parse: null argument");
    if (kind != LLMEM_OAI_COMPLETION && kind != LLMEM_OAI_CHAT)
        return llmem__fail(LLMEM_EINVAL, "openai: parse: unknown request kind %d", (int)kind);
    if (has_nul_escape(body, len)) return bad(err, LLMEM_EINVAL, NULL, "strings must not contain U+0000");
    cJSON *o = cJSON_ParseWithLength(body ? body : "", len);
    if (!o) return bad(err, LLMEM_EFORMAT, NULL, "the body is not valid JSON");
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return bad(err, LLMEM_EFORMAT, NULL, "the body must be a JSON object");
    }
    llmem_oai_request *r = calloc(1, sizeof *r);
    if (!r) {
        cJSON_Delete(o);
        return llmem__fail(LLMEM_ENOMEM, "openai: out of memory");
    }
    r->kind = kind;
    r->temperature = 1.0f;
    r->top_p = 1.0f;
    r->n = 1;
    llmem_status st = parse_object(kind, o, r, err);
    cJSON_Delete(o);
    if (st) {
        if (st == LLMEM_ENOMEM && err) {
            err->http_status = 500;
            err->type = "server_error";
            snprintf(err->message, sizeof err->message, "out of memory");
        }
        llmem_oai_request_free(r);
        return st;
    }
    *out = r;
    return LLMEM_OK;
}
