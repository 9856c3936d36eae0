/*
 * serve_http.c - the HTTP side of the server (llmem/server.h): GNU
 * libmicrohttpd, one thread per connection, routing, authentication, body
 * limits, request admission, and the two ways a generation is answered.
 *
 * A request's body is gathered into its connection context (413 at once
 * when Content-Length says it is over the limit; a chunked body is read
 * and dropped past the limit, then answered 413). The final call of the
 * access handler routes it.
 *
 * Generation (POST /v1/completions, /v1/chat/completions): parse and check
 * (llmem/openai.h), check the model name, tokenise (completions: BOS and
 * the text, as `llmem run` does; chat: the template), check the context
 * (400 with both numbers), submit to the scheduler (429 with Retry-After
 * when the queue is full), then
 *  - not streaming: the handler thread waits on the request's condition
 *    until its samples finish, polling the client's socket every 50 ms:
 *    a client that went away cancels the request (its KV is freed at once);
 *  - streaming: a response whose reader blocks until the step thread has
 *    appended SSE bytes (server.c), polling the socket likewise; the
 *    response's free callback (the connection ended, however) cancels a
 *    request that has not finished and frees its record.
 * A request is in the server's in-flight list from submission to the end
 * of its response; the shutdown waits on that list.
 *
 * Disconnects: a peek at the socket (recv MSG_PEEK | MSG_DONTWAIT) that
 * reads end-of-file or a reset means the client closed; bytes waiting
 * (a pipelined request) or EAGAIN mean it is still there.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "internal.h"
#include "serve_internal.h"
#include "server_impl.h"

#define SRV_POLL_NS (50ull * 1000 * 1000)

typedef struct http_ctx {
    char *body;
    size_t len, cap;
    bool too_big;
    size_t dropped;
} http_ctx;

/* ---- counting ------------------------------------------------------------ */

void llmem__srv_count(llmem_server *s, unsigned code)
{
    pthread_mutex_lock(&s->mu);
    s->st.http_requests_total++;
    if (code >= 200 && code < 300) s->st.http_2xx_total++;
    else if (code >= 400 && code < 500) s->st.http_4xx_total++;
    else if (code >= 500) s->st.http_5xx_total++;
    if (code == 413) s->st.http_413_total++;
    if (code == 429) s->st.http_429_total++;
    if (code == 401) s->st.http_401_total++;
    pthread_mutex_unlock(&s->mu);
}

/* ---- responses ------------------------------------------------------------- */

static enum MHD_Result send_buf(llmem_server *s, struct MHD_Connection *c, unsigned code, const char *type,
                                const char *data, size_t len, unsigned retry_after, bool auth_challenge)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (retry_after) {
        char ra[16];
        snprintf(ra, sizeof ra, "%u", retry_after);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, ra);
    }
    if (auth_challenge) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (code >= 400 && code != 429 && code != 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ret = MHD_queue_response(c, code, resp);
    MHD_destroy_response(resp);
    llmem__srv_count(s, code);
    if (s->o.access_log) fprintf(stderr, "llmem serve: answered %u (%zu bytes)\n", code, len);
    return ret;
}

static enum MHD_Result send_sbuf(llmem_server *s, struct MHD_Connection *c, unsigned code, const char *type,
                                 llmem__sbuf *b)
{
    if (b->failed) {
        llmem__sbuf_free(b);
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
                                  "\"code\":null}}";
        return send_buf(s, c, 500, "application/json", oom, sizeof oom - 1, 0, false);
    }
    enum MHD_Result r = send_buf(s, c, code, type, b->len ? b->data : "", b->len, 0, false);
    llmem__sbuf_free(b);
    return r;
}

/* An OpenAI error object. */
static enum MHD_Result send_error(llmem_server *s, struct MHD_Connection *c, unsigned code, const char *type,
                                  const char *param, const char *ecode, const char *msg, unsigned retry_after)
{
    llmem__sbuf b;
    llmem__sbuf_init(&b);
    llmem__sbuf_puts(&b, "{\"error\":{\"message\":");
    llmem__json_str(&b, msg, strlen(msg));
    llmem__sbuf_printf(&b, ",\"type\":\"%s\",\"param\":", type);
    if (param && param[0]) llmem__json_str(&b, param, strlen(param));
    else llmem__sbuf_puts(&b, "null");
    llmem__sbuf_puts(&b, ",\"code\":");
    if (ecode) llmem__sbuf_printf(&b, "\"%s\"", ecode);
    else llmem__sbuf_puts(&b, "null");
    llmem__sbuf_puts(&b, "}}");
    enum MHD_Result r;
    if (b.failed) r = send_sbuf(s, c, 500, "application/json", &b);
    else {
        r = send_buf(s, c, code, "application/json", b.data, b.len, retry_after, code == 401);
        llmem__sbuf_free(&b);
    }
    return r;
}

static enum MHD_Result send_oai_error(llmem_server *s, struct MHD_Connection *c, const llmem_oai_error *e)
{
    unsigned code = e->http_status ? (unsigned)e->http_status : 400;
    return send_error(s, c, code, e->type ? e->type : "invalid_request_error", e->param, NULL,
                      e->message[0] ? e->message : "bad request", code == 429 ? 1 : 0);
}

/* ---- disconnects ------------------------------------------------------------ */

static bool client_gone(int fd)
{
    if (fd < 0) return false;
    char ch;
    ssize_t n = recv(fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) return false;
    if (n == 0) return true;
    return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

static void abs_deadline(struct timespec *ts, uint64_t ns)
{
    clock_gettime(CLOCK_REALTIME, ts);
    uint64_t t = (uint64_t)ts->tv_nsec + ns;
    ts->tv_sec += (time_t)(t / 1000000000ull);
    ts->tv_nsec = (long)(t % 1000000000ull);
}

/* Cancel a request that has not finished (the client went away, or the
 * shutdown), and mark it done. Not with r->mu held. */
static void cancel_req(srv_req *r, bool disconnect)
{
    llmem_server *s = r->srv;
    pthread_mutex_lock(&r->mu);
    bool was_done = r->done;
    pthread_mutex_unlock(&r->mu);
    if (was_done) return;
    llmem_sched_cancel(s->sched, r->id);
    pthread_mutex_lock(&r->mu);
    if (!r->done) {
        r->done = true;
        r->cancelled = true;
        if (disconnect) {
            pthread_mutex_lock(&s->mu);
            s->st.client_disconnects_total++;
            pthread_mutex_unlock(&s->mu);
        }
    }
    pthread_mutex_unlock(&r->mu);
}

static void end_req(srv_req *r)
{
    llmem_server *s = r->srv;
    cancel_req(r, !atomic_load(&s->cancel_all) && !atomic_load(&s->draining));
    llmem__srv_inflight_remove(s, r);
    llmem__srv_req_free(r);
}

/* ---- streaming -------------------------------------------------------------- */

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    srv_req *r = cls;
    llmem_server *s = r->srv;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        size_t avail = r->out.len - r->sent;
        if (avail) {
            size_t n = avail < max ? avail : max;
            memcpy(buf, r->out.data + r->sent, n);
            r->sent += n;
            if (r->sent == r->out.len) r->out.len = r->sent = 0;
            pthread_mutex_unlock(&r->mu);
            return (ssize_t)n;
        }
        if (r->done) {
            bool cancelled = r->cancelled;
            pthread_mutex_unlock(&r->mu);
            return cancelled ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (atomic_load(&s->cancel_all)) {
            /* The shutdown deadline: say so in the stream and end it. */
            pthread_mutex_unlock(&r->mu);
            llmem_sched_cancel(s->sched, r->id);
            pthread_mutex_lock(&r->mu);
            if (!r->done) {
                llmem__srv_stream_error(r, "server_error", "the server is shutting down; the request was cancelled");
                r->done = true;
                r->shutdown_error = true;
            }
            continue;
        }
        struct timespec ts;
        abs_deadline(&ts, SRV_POLL_NS);
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
        if (r->out.len == r->sent && !r->done && client_gone(r->fd)) {
            pthread_mutex_unlock(&r->mu);
            cancel_req(r, true);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void stream_free(void *cls) { end_req(cls); }

/* ---- generation ------------------------------------------------------------- */

static bool model_matches(llmem_server *s, const char *want)
{
    return !want || !strcmp(want, s->model_name);
}

/* What to answer instead of generating: the OpenAI error object's fields. */
typedef struct refusal {
    llmem_oai_error e;
    const char *code; /* "code" of the error object; NULL = null */
} refusal;

static bool refuse(refusal *f, int status, const char *type, const char *param, const char *code, const char *fmt,
                   ...) __attribute__((format(printf, 6, 7)));
static bool refuse(refusal *f, int status, const char *type, const char *param, const char *code, const char *fmt, ...)
{
    f->e.http_status = status;
    f->e.type = type;
    snprintf(f->e.param, sizeof f->e.param, "%s", param ? param : "");
    f->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->e.message, sizeof f->e.message, fmt, ap);
    va_end(ap);
    return false;
}

/* The request's prompt as token ids: the chat rendered with the server's
 * template, the text encoded (BOS as the model asks), or the ids checked
 * against the vocabulary. false with *f filled (nothing to free). */
static bool prompt_ids(llmem_server *s, const llmem_oai_request *q, int32_t **ids_out, size_t *n_out,
                       int32_t *extra_stop, refusal *f)
{
    int32_t *ids = NULL;
    size_t n = 0;
    if (q->kind == LLMEM_OAI_CHAT) {
        if (!s->chat_ok)
            return refuse(f, 400, "invalid_request_error", "messages", "chat_template_unavailable", "%s", s->chat_why);
        llmem_status st = llmem_chat_render(&s->chat, s->tok, q->messages, q->message_count, &ids, &n, extra_stop, &f->e);
        if (st == LLMEM_ENOMEM) return refuse(f, 500, "server_error", NULL, NULL, "out of memory");
        if (st) return false; /* f->e says why (the order of roles) */
    } else if (q->prompt) {
        size_t cap = strlen(q->prompt) + 3;
        ids = malloc(cap * sizeof *ids);
        bool bos = llmem_tokenizer_add_bos(s->tok); /* as the model asks: gpt2 vocabularies add none */
        if (!ids || llmem_tokenizer_encode(s->tok, q->prompt, bos, false, ids, cap, &n)) {
            free(ids);
            return refuse(f, 500, "server_error", NULL, NULL, "the prompt could not be tokenised");
        }
    } else {
        n = q->prompt_id_count;
        if (!(ids = malloc((n ? n : 1) * sizeof *ids))) return refuse(f, 500, "server_error", NULL, NULL, "out of memory");
        for (size_t i = 0; i < n; i++) {
            if ((uint32_t)q->prompt_ids[i] >= s->vocab) {
                free(ids);
                return refuse(f, 400, "invalid_request_error", "prompt", NULL,
                              "token id %d at prompt position %zu is outside the vocabulary (%u tokens)",
                              q->prompt_ids[i], i, s->vocab);
            }
            ids[i] = q->prompt_ids[i];
        }
    }
    if (!n) {
        free(ids);
        return refuse(f, 400, "invalid_request_error", "prompt", NULL, "the prompt is empty");
    }
    *ids_out = ids;
    *n_out = n;
    return true;
}

/* The prompt of n tokens against the context; *max_tokens gets what the
 * request may generate (its own, or the default clipped to the room). */
static bool fit_context(llmem_server *s, const llmem_oai_request *q, size_t n, uint32_t *max_tokens, refusal *f)
{
    if (n >= s->ctx)
        return refuse(f, 400, "invalid_request_error", q->kind == LLMEM_OAI_CHAT ? "messages" : "prompt",
                      "context_length_exceeded",
                      "This model's maximum context length is %u tokens. However, your prompt has %zu tokens "
                      "(it must leave room for at least one generated token).",
                      s->ctx, n);
    if (q->max_tokens && n + q->max_tokens > s->ctx)
        return refuse(f, 400, "invalid_request_error", "max_tokens", "context_length_exceeded",
                      "This model's maximum context length is %u tokens. However, you requested %zu tokens "
                      "(%zu in the prompt, %u for the completion). Please reduce the prompt or max_tokens.",
                      s->ctx, n + q->max_tokens, n, q->max_tokens);
    uint32_t room = s->ctx - (uint32_t)n;
    *max_tokens = q->max_tokens;
    if (!*max_tokens) {
        *max_tokens = q->kind == LLMEM_OAI_CHAT ? room : (s->o.default_max_tokens ? s->o.default_max_tokens : 16);
        if (*max_tokens > room) *max_tokens = room;
    }
    return true;
}

/* A streamed answer: the connection reads the request's SSE bytes
 * (stream_read) and ends the request when it is done with it. */
static enum MHD_Result answer_stream(llmem_server *s, struct MHD_Connection *c, srv_req *r)
{
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, r, stream_free);
    if (!resp) {
        end_req(r);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp); /* the connection holds it; stream_free ends the request */
    llmem__srv_count(s, 200);
    return ret;
}

/* A whole answer: wait here for the request (or the client going away, or
 * the shutdown), answer, end it. */
static enum MHD_Result answer_whole(llmem_server *s, struct MHD_Connection *c, srv_req *r)
{
    bool gone = false, shutdown = false;
    pthread_mutex_lock(&r->mu);
    while (!r->done) {
        if (atomic_load(&s->cancel_all)) {
            shutdown = true;
            break;
        }
        struct timespec ts;
        abs_deadline(&ts, SRV_POLL_NS);
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
        if (!r->done && client_gone(r->fd)) {
            gone = true;
            break;
        }
    }
    pthread_mutex_unlock(&r->mu);
    enum MHD_Result ret;
    if (gone || shutdown) {
        cancel_req(r, gone);
        ret = gone ? MHD_NO
                   : send_error(s, c, 503, "server_error", NULL, NULL,
                                "the server is shutting down; the request was cancelled", 1);
    } else if (r->error) {
        bool rejected = false;
        for (uint32_t i = 0; i < r->n; i++) rejected = rejected || r->s[i].finish == LLMEM_SCHED_FINISH_REJECTED;
        ret = send_error(s, c, rejected ? 400 : 500, rejected ? "invalid_request_error" : "server_error", NULL, NULL,
                         r->error_msg, 0);
    } else {
        llmem__sbuf b;
        llmem__sbuf_init(&b);
        llmem__srv_response_json(r, &b);
        ret = send_sbuf(s, c, 200, "application/json", &b);
    }
    end_req(r);
    return ret;
}

/* POST /v1/completions and /v1/chat/completions: parse, check, tokenise,
 * submit, answer (streamed or whole). Every refusal is an OpenAI error
 * object; nothing is submitted unless every check passed. */
static enum MHD_Result generate(llmem_server *s, struct MHD_Connection *c, llmem_oai_kind kind, const char *body,
                                size_t len)
{
    refusal f;
    memset(&f, 0, sizeof f);
    llmem_oai_request *q;
    if (llmem_oai_request_parse(kind, body, len, &q, &f.e)) return send_oai_error(s, c, &f.e);
    int32_t *ids = NULL;
    size_t n = 0;
    int32_t extra_stop = -1;
    uint32_t max_tokens = 0;
    bool ok = true;
    if (!model_matches(s, q->model))
        ok = refuse(&f, 400, "invalid_request_error", "model", "model_not_found",
                    "The model '%.200s' does not exist; this server serves '%.120s' (GET /v1/models)", q->model,
                    s->model_name);
    else if (q->n > s->max_batch)
        ok = refuse(&f, 400, "invalid_request_error", "n", NULL,
                    "'n' is %u; this server runs at most %u sequences at once (--max-batch)", q->n, s->max_batch);
    ok = ok && prompt_ids(s, q, &ids, &n, &extra_stop, &f) && fit_context(s, q, n, &max_tokens, &f);
    srv_req *r = ok ? calloc(1, sizeof *r) : NULL;
    if (ok && !r) refuse(&f, 500, "server_error", NULL, NULL, "out of memory");
    if (!r) {
        free(ids);
        llmem_oai_request_free(q);
        return send_error(s, c, f.e.http_status ? (unsigned)f.e.http_status : 400,
                          f.e.type ? f.e.type : "invalid_request_error", f.e.param, f.code,
                          f.e.message[0] ? f.e.message : "bad request", 0);
    }
    r->srv = s;
    r->q = q;
    r->fd = -1;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    llmem__sbuf_init(&r->out);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci) r->fd = ci->connect_fd;
    llmem_status st = llmem__srv_submit(s, r, ids, (uint32_t)n, max_tokens, extra_stop, &f.e);
    free(ids);
    if (st) {
        llmem__srv_req_free(r);
        if (!f.e.http_status) {
            f.e.http_status = 500;
            f.e.type = "server_error";
        }
        return send_oai_error(s, c, &f.e);
    }
    llmem__srv_inflight_add(s, r);
    if (s->o.access_log)
        fprintf(stderr, "llmem serve: %s %s: prompt %zu tokens, max_tokens %u, n %u%s\n", r->id_str,
                kind == LLMEM_OAI_CHAT ? "chat" : "completion", n, max_tokens, q->n, q->stream ? ", stream" : "");
    return q->stream ? answer_stream(s, c, r) : answer_whole(s, c, r);
}

/* ---- the other endpoints ---------------------------------------------------- */

static enum MHD_Result models(llmem_server *s, struct MHD_Connection *c)
{
    llmem__sbuf b;
    llmem__sbuf_init(&b);
    llmem__sbuf_puts(&b, "{\"object\":\"list\",\"data\":[{\"id\":");
    llmem__json_str(&b, s->model_name, strlen(s->model_name));
    llmem__sbuf_printf(&b, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"llmem\",\"max_model_len\":%u,"
                          "\"chat_template\":\"%s\"}]}",
                      (long long)s->created, s->ctx, llmem_server_chat_template(s));
    return send_sbuf(s, c, 200, "application/json", &b);
}

static bool authorised(llmem_server *s, struct MHD_Connection *c)
{
    if (!s->api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7)) return false;
    h += 7;
    while (*h == ' ') h++;
    size_t a = strlen(h), k = strlen(s->api_key);
    /* Constant time in the key's bytes. */
    unsigned diff = (unsigned)(a ^ k);
    for (size_t i = 0; i < k; i++) diff |= (unsigned)(unsigned char)s->api_key[i] ^ (unsigned char)(i < a ? h[i] : 0);
    return diff == 0;
}

static enum MHD_Result route(llmem_server *s, struct MHD_Connection *c, const char *url, const char *method,
                             const char *body, size_t len)
{
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    bool post = !strcmp(method, "POST");
    if (!strcmp(url, "/health")) {
        if (!get) return send_error(s, c, 405, "invalid_request_error", NULL, NULL, "use GET /health", 0);
        if (atomic_load(&s->draining)) return send_buf(s, c, 503, "application/json", "{\"status\":\"draining\"}", 21, 1, false);
        return send_buf(s, c, 200, "application/json", "{\"status\":\"ok\"}", 15, 0, false);
    }
    if (!strcmp(url, "/metrics")) {
        if (!get) return send_error(s, c, 405, "invalid_request_error", NULL, NULL, "use GET /metrics", 0);
        llmem__sbuf b;
        llmem__sbuf_init(&b);
        llmem__srv_metrics(s, &b);
        return send_sbuf(s, c, 200, "text/plain; version=0.0.4; charset=utf-8", &b);
    }
    if (!strcmp(url, "/") || !strcmp(url, "/llmem/timeline")) {
        if (!get) return send_error(s, c, 405, "invalid_request_error", NULL, NULL, "use GET", 0);
        if (url[1] == 0)
            return send_buf(s, c, 200, "text/html; charset=utf-8", llmem__dashboard_html, llmem__dashboard_html_len,
                            0, false);
        const char *since = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "since");
        llmem__sbuf b;
        llmem__sbuf_init(&b);
        llmem__srv_timeline_json(s, since ? strtoull(since, NULL, 10) : 0, &b);
        return send_sbuf(s, c, 200, "application/json", &b);
    }
    bool v1 = !strncmp(url, "/v1/", 4);
    if (!v1) return send_error(s, c, 404, "invalid_request_error", NULL, NULL, "no such path", 0);
    if (!authorised(s, c))
        return send_error(s, c, 401, "invalid_request_error", NULL, "invalid_api_key",
                          "a valid API key is required: send 'Authorization: Bearer KEY'", 0);
    if (!strcmp(url, "/v1/models")) {
        if (!get) return send_error(s, c, 405, "invalid_request_error", NULL, NULL, "use GET /v1/models", 0);
        return models(s, c);
    }
    llmem_oai_kind kind;
    if (!strcmp(url, "/v1/completions")) kind = LLMEM_OAI_COMPLETION;
    else if (!strcmp(url, "/v1/chat/completions")) kind = LLMEM_OAI_CHAT;
    else return send_error(s, c, 404, "invalid_request_error", NULL, NULL, "no such path", 0);
    if (!post) return send_error(s, c, 405, "invalid_request_error", NULL, NULL, "use POST", 0);
    if (atomic_load(&s->draining))
        return send_error(s, c, 503, "server_error", NULL, NULL, "the server is shutting down", 1);
    return generate(s, c, kind, body, len);
}

static enum MHD_Result access_handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                      const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    llmem_server *s = cls;
    http_ctx *x = *con_cls;
    if (!x) {
        x = calloc(1, sizeof *x);
        if (!x) return MHD_NO;
        *con_cls = x;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(cl, &end, 10);
            if (errno || end == cl || v > s->o.max_body_bytes) {
                char msg[160];
                snprintf(msg, sizeof msg, "the request body has %s bytes; this server takes at most %zu", cl,
                         s->o.max_body_bytes);
                return send_error(s, c, 413, "invalid_request_error", NULL, NULL, msg, 0);
            }
        }
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (x->too_big || x->len + n > s->o.max_body_bytes) {
            x->too_big = true;
            x->dropped += n;
            /* A body that never ends is not read forever. */
            return x->dropped > 4 * s->o.max_body_bytes + (1u << 20) ? MHD_NO : MHD_YES;
        }
        if (x->len + n > x->cap) {
            size_t cap = x->cap ? x->cap : 4096;
            while (cap < x->len + n) cap *= 2;
            char *nb = realloc(x->body, cap);
            if (!nb) return MHD_NO;
            x->body = nb;
            x->cap = cap;
        }
        memcpy(x->body + x->len, upload, n);
        x->len += n;
        return MHD_YES;
    }
    if (x->too_big) {
        char msg[160];
        snprintf(msg, sizeof msg, "the request body is over %zu bytes, this server's limit", s->o.max_body_bytes);
        return send_error(s, c, 413, "invalid_request_error", NULL, NULL, msg, 0);
    }
    return route(s, c, url, method, x->body, x->len);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)c;
    (void)toe;
    http_ctx *x = *con_cls;
    if (x) {
        free(x->body);
        free(x);
        *con_cls = NULL;
    }
}

static void connection_notify(void *cls, struct MHD_Connection *c, void **socket_ctx,
                              enum MHD_ConnectionNotificationCode toe)
{
    (void)c;
    (void)socket_ctx;
    llmem_server *s = cls;
    pthread_mutex_lock(&s->mu);
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) s->st.connections++;
    else if (s->st.connections) s->st.connections--;
    pthread_mutex_unlock(&s->mu);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[400];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t l = strlen(msg);
    while (l && msg[l - 1] == '\n') msg[--l] = 0;
    /* A client that went away mid-response is routine (its request is
     * cancelled); only the access log mentions it. */
    bool routine = strstr(msg, "no longer available") || strstr(msg, "Connection reset") ||
                   strstr(msg, "forcibly closed") || strstr(msg, "Broken pipe") ||
                   strstr(msg, "application error generating response");
    llmem_server *s = cls;
    if (!routine || s->o.access_log) fprintf(stderr, "llmem serve: http: %s\n", msg);
}

/* ---- start / stop ------------------------------------------------------------ */

llmem_status llmem__srv_http_start(llmem_server *s)
{
    if (!s->o.max_body_bytes) s->o.max_body_bytes = 4u << 20;
    unsigned conns = s->o.max_connections ? s->o.max_connections : 256;
    uint16_t port = s->o.port == LLMEM_SERVER_PORT_ANY ? 0 : s->o.port ? (uint16_t)s->o.port : 8080;
    struct sockaddr_in a4;
    struct sockaddr_in6 a6;
    struct sockaddr *sa;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG;
    memset(&a4, 0, sizeof a4);
    memset(&a6, 0, sizeof a6);
    if (inet_pton(AF_INET, s->host, &a4.sin_addr) == 1) {
        a4.sin_family = AF_INET;
        a4.sin_port = htons(port);
        sa = (struct sockaddr *)&a4;
    } else if (inet_pton(AF_INET6, s->host, &a6.sin6_addr) == 1) {
        a6.sin6_family = AF_INET6;
        a6.sin6_port = htons(port);
        sa = (struct sockaddr *)&a6;
        flags |= MHD_USE_IPv6;
    } else {
        return llmem__fail(LLMEM_EINVAL, "serve: host '%s' is not a numeric IPv4 or IPv6 address", s->host);
    }
    s->daemon = MHD_start_daemon(flags, port, NULL, NULL, access_handler, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                                 MHD_OPTION_SOCK_ADDR, sa, MHD_OPTION_CONNECTION_LIMIT, conns,
                                 MHD_OPTION_CONNECTION_TIMEOUT, 120u, MHD_OPTION_NOTIFY_COMPLETED, completed, s,
                                 MHD_OPTION_NOTIFY_CONNECTION, connection_notify, s, MHD_OPTION_END);
    if (!s->daemon)
        return llmem__fail(LLMEM_EOS, "serve: cannot listen on %s port %u (in use, or not an address of this "
                                      "machine)",
                           s->host, (unsigned)port);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : port;
    return LLMEM_OK;
}

void llmem__srv_http_quiesce(llmem_server *s)
{
    if (!s->daemon) return;
    MHD_socket fd = MHD_quiesce_daemon(s->daemon);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void llmem__srv_http_stop(llmem_server *s)
{
    if (!s->daemon) return;
    MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
}
