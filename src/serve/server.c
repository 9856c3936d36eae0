/*
 * server.c - the server's life (llmem/server.h): what create builds, the
 * step loop, the scheduler's events turned into response bytes, and the
 * shutdown.
 *
 * Memory: os resource -> fault-injecting resource (disarmed until serving,
 * then armed with fault_probability on commits when asked) -> tracking
 * resource -> the memctl pool the engine takes KV, converted weights and
 * its activation arena from; swap memory (swap_bytes) is a second pool
 * path over the same tracking resource. After teardown the tracking
 * resource must hold nothing: that is the leak check of the shutdown.
 *
 * The step loop (one thread) runs llmem_sched_step while work is pending
 * and otherwise sleeps in llmem_sched_wait_work for 20 ms at a time, then
 * steps anyway: an idle step reports IDLE once and ticks the controller,
 * which gives memory back after its decay. After each step it takes the
 * dashboard sample (at most one per 50 ms) and the engine's and KV's stats
 * snapshots (those two are the step thread's to read).
 *
 * Events (on the step thread): TOKEN feeds the sample's text stream; its
 * text goes to the request's SSE buffer (streaming) or its text (not), and
 * a stop string returns true so the scheduler stops the sample there.
 * FINISH flushes the stream and, with the request's last sample, appends
 * the final chunks and "data: [DONE]" and marks the request done; a
 * waiting handler or stream reader wakes on the request's condition.
 * Cancellation's events are not delivered (llmem/sched.h): whoever cancels
 * marks the request done itself.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hash.h"
#include "internal.h"
#include "serve_internal.h"
#include "server_impl.h"

llmem_server_options llmem_server_options_default(void)
{
    llmem_server_options o;
    memset(&o, 0, sizeof o);
    o.kv_dtype = LLMEM_KV_F32; /* as documented and as llmem run: exact (the zero value is F16) */
    return o;
}

const char *llmem__srv_finish_reason(llmem_sched_finish f)
{
    switch (f) {
    case LLMEM_SCHED_FINISH_STOP: return "stop";
    case LLMEM_SCHED_FINISH_LENGTH:
    case LLMEM_SCHED_FINISH_CONTEXT:
    case LLMEM_SCHED_FINISH_MEMORY: return "length";
    case LLMEM_SCHED_FINISH_CANCELLED: return "abort";
    default: return "error";
    }
}

/* ---- response bytes ------------------------------------------------------ */

void llmem__srv_chunk_prefix(srv_req *r, llmem__sbuf *b)
{
    bool chat = r->q->kind == LLMEM_OAI_CHAT;
    llmem__sbuf_printf(b, "data: {\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":", r->id_str,
                      chat ? "chat.completion.chunk" : "text_completion", (long long)r->created);
    llmem__json_str(b, r->srv->model_name, strlen(r->srv->model_name));
}

/* ,"token_ids":[...] of sample i: its readable output. */
static void token_ids_json(srv_req *r, uint32_t i, llmem__sbuf *b)
{
    size_t got = 0, from = 0;
    int32_t buf[256];
    llmem__sbuf_puts(b, ",\"token_ids\":[");
    bool first = true;
    while (!llmem_sched_read(r->srv->sched, r->id, i, from, buf, 256, &got) && got) {
        for (size_t k = 0; k < got; k++) {
            llmem__sbuf_printf(b, first ? "%d" : ",%d", buf[k]);
            first = false;
        }
        from += got;
    }
    llmem__sbuf_putc(b, ']');
}

/* ,"prompt_token_ids":[...]: what the model was given (as vLLM's
 * return_token_ids answers), so a client can check a chat template's
 * rendering token by token. */
static void prompt_ids_json(srv_req *r, llmem__sbuf *b)
{
    llmem__sbuf_puts(b, ",\"prompt_token_ids\":[");
    for (uint32_t k = 0; k < r->prompt_len; k++) llmem__sbuf_printf(b, k ? ",%d" : "%d", r->prompt_ids[k]);
    llmem__sbuf_putc(b, ']');
}

/* One streamed choice: text (may be empty), finish (NULL while going on). */
static void stream_choice(srv_req *r, uint32_t i, const char *text, size_t len, const char *finish)
{
    llmem__sbuf *b = &r->out;
    bool chat = r->q->kind == LLMEM_OAI_CHAT;
    llmem__srv_chunk_prefix(r, b);
    llmem__sbuf_printf(b, ",\"choices\":[{\"index\":%u,", i);
    if (chat) {
        llmem__sbuf_puts(b, "\"delta\":{");
        bool any = false;
        if (!r->s[i].role_sent) {
            llmem__sbuf_puts(b, "\"role\":\"assistant\"");
            r->s[i].role_sent = true;
            any = true;
        }
        if (len || (!finish && any)) {
            llmem__sbuf_puts(b, any ? ",\"content\":" : "\"content\":");
            llmem__json_str(b, text, len);
        }
        llmem__sbuf_puts(b, "},");
    } else {
        llmem__sbuf_puts(b, "\"text\":");
        llmem__json_str(b, text, len);
        llmem__sbuf_putc(b, ',');
    }
    llmem__sbuf_puts(b, "\"logprobs\":null,\"finish_reason\":");
    if (finish) llmem__sbuf_printf(b, "\"%s\"", finish);
    else llmem__sbuf_puts(b, "null");
    /* The sample's whole output, once, with its last chunk. */
    if (finish && r->q->return_token_ids) token_ids_json(r, i, b);
    llmem__sbuf_puts(b, "}]}\n\n");
}

static void usage_json(srv_req *r, llmem__sbuf *b)
{
    uint64_t gen = 0;
    for (uint32_t i = 0; i < r->n; i++) {
        llmem_sched_info info;
        if (!llmem_sched_get_info(r->srv->sched, r->id, i, &info)) gen += info.generated;
    }
    llmem__sbuf_printf(b, "{\"prompt_tokens\":%u,\"completion_tokens\":%llu,\"total_tokens\":%llu}", r->prompt_len,
                      (unsigned long long)gen, (unsigned long long)(gen + r->prompt_len));
}

void llmem__srv_response_json(srv_req *r, llmem__sbuf *b)
{
    bool chat = r->q->kind == LLMEM_OAI_CHAT;
    llmem__sbuf_printf(b, "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":", r->id_str,
                      chat ? "chat.completion" : "text_completion", (long long)r->created);
    llmem__json_str(b, r->srv->model_name, strlen(r->srv->model_name));
    llmem__sbuf_puts(b, ",\"choices\":[");
    for (uint32_t i = 0; i < r->n; i++) {
        const llmem__sbuf *t = &r->s[i].text;
        llmem__sbuf_printf(b, "%s{\"index\":%u,", i ? "," : "", i);
        if (chat) llmem__sbuf_puts(b, "\"message\":{\"role\":\"assistant\",\"content\":");
        else llmem__sbuf_puts(b, "\"text\":");
        llmem__json_str(b, t->len ? t->data : "", t->len);
        if (chat) llmem__sbuf_putc(b, '}');
        llmem__sbuf_printf(b, ",\"logprobs\":null,\"finish_reason\":\"%s\"",
                          llmem__srv_finish_reason(r->s[i].finish));
        if (r->q->return_token_ids) token_ids_json(r, i, b);
        llmem__sbuf_putc(b, '}');
    }
    llmem__sbuf_puts(b, "],\"usage\":");
    usage_json(r, b);
    if (r->prompt_ids) prompt_ids_json(r, b);
    llmem__sbuf_putc(b, '}');
}

void llmem__srv_stream_error(srv_req *r, const char *type, const char *msg)
{
    llmem__sbuf *b = &r->out;
    llmem__sbuf_puts(b, "data: {\"error\":{\"message\":");
    llmem__json_str(b, msg, strlen(msg));
    llmem__sbuf_printf(b, ",\"type\":\"%s\",\"param\":null,\"code\":null}}\n\ndata: [DONE]\n\n", type);
}

/* ---- scheduler events (step thread) ------------------------------------- */

static void record_latency(llmem_server *s, srv_req *r)
{
    llmem_sched_info info;
    if (llmem_sched_get_info(s->sched, r->id, 0, &info) || !info.first_token_ns || !info.finish_ns) return;
    srv_latency l;
    l.ttft = (double)(info.first_token_ns - info.arrival_ns) * 1e-9;
    l.e2e = (double)(info.finish_ns - info.arrival_ns) * 1e-9;
    l.queue = info.scheduled_ns ? (double)(info.scheduled_ns - info.arrival_ns) * 1e-9 : 0;
    l.tpot = info.generated > 1 ? (double)(info.finish_ns - info.first_token_ns) * 1e-9 / (info.generated - 1) : -1;
    pthread_mutex_lock(&s->lat_mu);
    s->lat[s->nlat++ % SRV_LATENCIES] = l;
    pthread_mutex_unlock(&s->lat_mu);
}

static void sample_text(srv_req *r, uint32_t i, const char *text, size_t len, const char *finish)
{
    if (r->q->stream) {
        if (len || finish) stream_choice(r, i, text, len, finish);
    } else {
        for (size_t k = 0; k < len; k++) llmem__sbuf_putc(&r->s[i].text, text[k]);
    }
}

static bool on_event(void *ctx, const llmem_sched_event *ev)
{
    llmem_server *s = ctx;
    srv_req *r = ev->user;
    if (!r || ev->sample >= r->n) return false;
    bool stop = false;
    const char *text;
    size_t len;
    switch (ev->kind) {
    case LLMEM_SCHED_EV_TOKEN:
        pthread_mutex_lock(&r->mu);
        r->id = ev->req; /* before llmem__srv_submit has stored it, maybe */
        if (!r->done) {
            stop = llmem_textstream_push(r->s[ev->sample].ts, ev->token, &text, &len);
            sample_text(r, ev->sample, text, len, NULL);
            pthread_cond_broadcast(&r->cv);
        }
        pthread_mutex_unlock(&r->mu);
        return stop;
    case LLMEM_SCHED_EV_FINISH: {
        pthread_mutex_lock(&r->mu);
        r->id = ev->req;
        srv_sample_out *so = &r->s[ev->sample];
        if (!r->done && !so->finished) {
            so->finished = true;
            so->finish = ev->finish;
            r->finished++;
            if (ev->finish == LLMEM_SCHED_FINISH_ERROR || ev->finish == LLMEM_SCHED_FINISH_REJECTED) {
                r->error = true;
                snprintf(r->error_msg, sizeof r->error_msg, "%s",
                         ev->finish == LLMEM_SCHED_FINISH_REJECTED
                             ? "the request cannot fit in the KV cache budget of this server"
                             : "the engine failed while running this request");
            }
            llmem_textstream_finish(so->ts, &text, &len);
            if (!r->q->stream || !r->error) sample_text(r, ev->sample, text, len, llmem__srv_finish_reason(ev->finish));
            if (r->finished == r->n) {
                /* Here, under r->mu: once done is set the handler may
                 * answer and free r at any moment. */
                record_latency(s, r);
                if (r->q->stream) {
                    if (r->error) {
                        llmem__srv_stream_error(r, "server_error", r->error_msg);
                    } else {
                        if (r->q->include_usage) {
                            llmem__srv_chunk_prefix(r, &r->out);
                            llmem__sbuf_puts(&r->out, ",\"choices\":[],\"usage\":");
                            usage_json(r, &r->out);
                            if (r->prompt_ids) prompt_ids_json(r, &r->out);
                            llmem__sbuf_puts(&r->out, "}\n\n");
                        }
                        llmem__sbuf_puts(&r->out, "data: [DONE]\n\n");
                    }
                }
                r->done = true;
            }
            pthread_cond_broadcast(&r->cv);
        }
        pthread_mutex_unlock(&r->mu);
        return false;
    }
    default: return false;
    }
}

/* ---- the step loop -------------------------------------------------------- */

/* What the step ran and how long it took, for llmem_server_step_model. */
static void record_step(llmem_server *s, const llmem_sched_step_report *rep)
{
    srv_step x = {{rep->sequences, rep->prefill_tokens, rep->decode_tokens, rep->attn_pairs, rep->decode_kv_tokens,
                   0},
                  rep->seconds};
    pthread_mutex_lock(&s->snap_mu);
    s->steps[s->nsteps++ % SRV_STEPS] = x;
    pthread_mutex_unlock(&s->snap_mu);
}

static void *step_loop(void *arg)
{
    llmem_server *s = arg;
    while (!atomic_load(&s->stop)) {
        if (!llmem_sched_pending(s->sched)) llmem_sched_wait_work(s->sched, 20ull * 1000 * 1000);
        if (atomic_load(&s->stop)) break;
        llmem_sched_step_report rep;
        llmem_status st = llmem_sched_step(s->sched, &rep);
        if (st) {
            pthread_mutex_lock(&s->mu);
            s->st.step_errors_total++;
            pthread_mutex_unlock(&s->mu);
            llmem__log(LLMEM_LOG_WARN, "serve: a step failed: %s", llmem_error_message());
        }
        if (!st && rep.sequences) record_step(s, &rep);
        llmem__srv_sample(s, false);
    }
    return NULL;
}

/* ---- requests --------------------------------------------------------------- */

void llmem__srv_inflight_add(llmem_server *s, srv_req *r)
{
    pthread_mutex_lock(&s->mu);
    r->next = s->inflight;
    r->prev = NULL;
    if (s->inflight) s->inflight->prev = r;
    s->inflight = r;
    s->ninflight++;
    s->st.requests_in_flight = s->ninflight;
    pthread_mutex_unlock(&s->mu);
}

void llmem__srv_inflight_remove(llmem_server *s, srv_req *r)
{
    pthread_mutex_lock(&s->mu);
    if (r->prev) r->prev->next = r->next;
    else if (s->inflight == r) s->inflight = r->next;
    if (r->next) r->next->prev = r->prev;
    r->prev = r->next = NULL;
    s->ninflight--;
    s->st.requests_in_flight = s->ninflight;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void llmem__srv_req_free(srv_req *r)
{
    if (!r) return;
    if (r->id && r->srv->sched) llmem_sched_release(r->srv->sched, r->id);
    for (uint32_t i = 0; r->s && i < r->n; i++) {
        llmem_textstream_destroy(r->s[i].ts);
        llmem__sbuf_free(&r->s[i].text);
    }
    free(r->s);
    free(r->prompt_ids);
    llmem__sbuf_free(&r->out);
    llmem_oai_request_free(r->q);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

llmem_status llmem__srv_submit(llmem_server *s, srv_req *r, const int32_t *prompt, uint32_t prompt_len,
                               uint32_t max_tokens, int32_t extra_stop, llmem_oai_error *err)
{
    llmem_oai_request *q = r->q;
    r->n = q->n;
    r->prompt_len = prompt_len;
    r->s = calloc(r->n, sizeof *r->s);
    if (!r->s) return llmem__fail(LLMEM_ENOMEM, "serve: out of memory");
    if (q->return_token_ids) {
        if (!(r->prompt_ids = malloc(prompt_len * sizeof *r->prompt_ids)))
            return llmem__fail(LLMEM_ENOMEM, "serve: out of memory");
        memcpy(r->prompt_ids, prompt, prompt_len * sizeof *prompt);
    }
    for (uint32_t i = 0; i < r->n; i++) {
        llmem__sbuf_init(&r->s[i].text);
        llmem_status st = llmem_textstream_create(s->tok, prompt[prompt_len - 1], (const char *const *)q->stop,
                                                  q->stop_count, &r->s[i].ts);
        if (st) return st;
    }
    pthread_mutex_lock(&s->mu);
    uint64_t serial = ++s->next_id;
    pthread_mutex_unlock(&s->mu);
    snprintf(r->id_str, sizeof r->id_str, "%s-%016llx", q->kind == LLMEM_OAI_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)llmem__splitmix64(serial ^ s->start_ns));
    r->created = time(NULL);

    int32_t stops[3];
    uint32_t nstops = 0;
    stops[nstops++] = s->eos;
    /* BOS too: a llama2.c model ends a text by starting the next one, and
     * `llmem run` (as run.c) stops there. */
    if (s->bos >= 0 && s->bos != s->eos) stops[nstops++] = s->bos;
    if (extra_stop >= 0 && extra_stop != s->eos && extra_stop != s->bos) stops[nstops++] = extra_stop;

    llmem_sched_params p = llmem_sched_params_default();
    p.prompt = prompt;
    p.prompt_len = prompt_len;
    p.max_tokens = max_tokens;
    p.n = q->n;
    p.temperature = q->temperature;
    p.top_p = q->top_p >= 1.0f ? 0 : q->top_p;
    p.seed = q->seed_set ? q->seed : llmem__splitmix64(serial + llmem__now_ns());
    p.stop_tokens = stops;
    p.stop_token_count = nstops;
    p.user = r;
    /* The step thread may run the request, and finish it, before submit
     * returns: it learns the id from its events too (on_event). */
    llmem_sched_req id = 0;
    llmem_status st = llmem_sched_submit(s->sched, &p, &id);
    if (!st) r->id = id;
    if (st) {
        if (err) {
            err->type = "invalid_request_error";
            err->param[0] = 0;
            snprintf(err->message, sizeof err->message, "%s", llmem_error_message());
            switch (st) {
            case LLMEM_ECAPACITY:
                err->http_status = 429;
                err->type = "rate_limit_error";
                snprintf(err->message, sizeof err->message,
                         "the server's queue is full (%u requests waiting); retry later", s->o.max_waiting);
                break;
            case LLMEM_ERANGE:
            case LLMEM_EINVAL: err->http_status = 400; break;
            default:
                err->http_status = 500;
                err->type = "server_error";
            }
        }
        return st;
    }
    pthread_mutex_lock(&s->mu);
    s->st.completions_total++;
    if (q->stream) s->st.streams_total++;
    pthread_mutex_unlock(&s->mu);
    return LLMEM_OK;
}

/* ---- create / shutdown / destroy ------------------------------------------ */

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

static char *base_name(const char *path)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    char *n = strdup(b);
    if (!n) return NULL;
    char *dot = strrchr(n, '.');
    if (dot && dot != n) *dot = 0;
    return n;
}

static llmem_status setup_chat(llmem_server *s)
{
    const char *want = s->o.chat_template;
    llmem_chat_template t;
    bool from_model = !want || !strcmp(want, "auto");
    if (from_model) t = llmem_chat_template_of_model(s->model);
    else if (!strcmp(want, "llama2")) t = LLMEM_CHAT_TEMPLATE_LLAMA2;
    else if (!strcmp(want, "chatml")) t = LLMEM_CHAT_TEMPLATE_CHATML;
    else if (!strcmp(want, "none")) t = LLMEM_CHAT_TEMPLATE_NONE;
    else return llmem__fail(LLMEM_EINVAL, "serve: chat template '%s': use llama2, chatml, none or auto", want);
    if (t == LLMEM_CHAT_TEMPLATE_NONE) {
        snprintf(s->chat_why, sizeof s->chat_why, "%s",
                 from_model ? "this model has no chat template this server can use (its GGUF metadata has no "
                              "llama-2 or ChatML tokenizer.chat_template); use /v1/completions, or start the "
                              "server with --chat-template llama2|chatml"
                            : "chat is turned off on this server (--chat-template none); use /v1/completions");
        return LLMEM_OK;
    }
    llmem_status st = llmem_chat_format_init(t, s->tok, &s->chat);
    if (st) {
        if (!from_model) return llmem__fail(LLMEM_EINVAL, "serve: %s", llmem_error_message());
        snprintf(s->chat_why, sizeof s->chat_why, "the model's chat template cannot be used: %s", llmem_error_message());
        return LLMEM_OK;
    }
    s->chat_ok = true;
    return LLMEM_OK;
}

static llmem_status build(llmem_server *s)
{
    const llmem_server_options *o = &s->o;
    llmem_status st;
    llmem_os_options oo = llmem_os_options_default();
    oo.name = "serve-os";
    if ((st = llmem_os_resource_create(&oo, &s->os)) || (st = llmem_fault_resource_create(s->os, NULL, &s->fault)) ||
        (st = llmem_tracking_resource_create(s->fault, &s->track)))
        return st;
    llmem_model_options mo = llmem_model_options_default();
    if ((st = llmem_model_open(s->model_path, &mo, &s->model))) return st;
    const llmem_model_config *c = llmem_model_get_config(s->model);
    if (s->tokenizer_path) st = llmem_tokenizer_load(s->tokenizer_path, c->shape.vocab, &s->tok);
    else if ((st = llmem_tokenizer_from_model(s->model, &s->tok)) == LLMEM_ENOTFOUND)
        return llmem__fail(LLMEM_EINVAL, "serve: %s has no vocabulary inside: give its tokenizer.bin", s->model_path);
    if (st) return st;
    if (llmem_tokenizer_vocab_size(s->tok) != c->shape.vocab)
        return llmem__fail(LLMEM_EINVAL, "serve: the tokenizer has %u tokens, the model %u",
                           llmem_tokenizer_vocab_size(s->tok), c->shape.vocab);
    s->bos = llmem_tokenizer_bos(s->tok);
    s->eos = llmem_tokenizer_eos(s->tok);
    if ((st = setup_chat(s))) return st;

    llmem_engine_options eo = llmem_engine_options_default();
    eo.threads = o->threads;
    eo.max_seqs = o->max_batch ? o->max_batch : 16;
    eo.max_step_tokens = o->max_step_tokens;
    eo.max_seq_len = o->max_seq_len;
    eo.kv_strategy = o->kv_strategy;
    eo.kv_dtype = o->kv_dtype;
    eo.kv_budget_bytes = o->kv_budget_bytes;
    eo.kv_prefix_cache = !o->no_prefix_cache && o->kv_strategy == LLMEM_KV_PAGED;
    if (o->swap_bytes && o->kv_strategy == LLMEM_KV_PAGED) {
        eo.kv_swap_resource = s->track;
        eo.kv_swap_budget_bytes = o->swap_bytes;
    }
    llmem_memctl_options mco = llmem_memctl_options_default();
    mco.name = "serve";
    mco.resource = s->track;
    if (o->idle_decay_ms) mco.controller.idle_decay_ms = o->idle_decay_ms;
    if ((st = llmem_memctl_create_for_engine(s->model, &eo, &mco, &s->mc))) return st;
    if ((st = llmem_engine_create(s->model, &eo, &s->engine))) return st;
    llmem_engine_info info;
    if ((st = llmem_engine_get_info(s->engine, &info))) return st;
    s->vocab = info.vocab;
    s->ctx = info.max_seq_len;
    s->max_batch = info.max_seqs;

    llmem_sched_options so = llmem_sched_options_default();
    so.max_batch = info.max_seqs;
    so.max_waiting = o->max_waiting ? o->max_waiting : 256;
    s->o.max_waiting = so.max_waiting;
    so.controller = llmem_memctl_controller(s->mc);
    so.on_event = on_event;
    so.event_ctx = s;
    if ((st = llmem_sched_create_engine(s->engine, &so, &s->sched))) return st;

    s->samples = calloc(SRV_SAMPLES, sizeof *s->samples);
    s->lat = calloc(SRV_LATENCIES, sizeof *s->lat);
    s->steps = calloc(SRV_STEPS, sizeof *s->steps);
    if (!s->samples || !s->lat || !s->steps) return llmem__fail(LLMEM_ENOMEM, "serve: out of memory");
    /* Written through now, so the rings (about 650 KiB) are resident from
     * the start: filling them as the server runs would read as slow
     * growth of its resident memory for the first minutes (the soak's
     * drift check). */
    for (size_t i = 0; i < SRV_SAMPLES; i++) s->samples[i].t = -1;
    for (size_t i = 0; i < SRV_LATENCIES; i++) s->lat[i].ttft = -1;
    for (size_t i = 0; i < SRV_STEPS; i++) s->steps[i].seconds = -1;
    return LLMEM_OK;
}

static void teardown(llmem_server *s)
{
    llmem_sched_destroy(s->sched);
    s->sched = NULL;
    llmem_engine_destroy(s->engine);
    s->engine = NULL;
    llmem_memctl_destroy(s->mc);
    s->mc = NULL;
    llmem_tokenizer_destroy(s->tok);
    s->tok = NULL;
    llmem_model_close(s->model);
    s->model = NULL;
}

llmem_status llmem_server_create(const llmem_server_options *o, llmem_server **out)
{
    if (out) *out = NULL;
    if (!o || !out || !o->model_path) return llmem__fail(LLMEM_EINVAL, "serve: no model");
    if (o->port > LLMEM_SERVER_PORT_ANY) return llmem__fail(LLMEM_EINVAL, "serve: port %u", o->port);
    if (!(o->fault_probability >= 0 && o->fault_probability <= 1))
        return llmem__fail(LLMEM_EINVAL, "serve: fault probability %g is not in [0, 1]", o->fault_probability);
    llmem_server *s = calloc(1, sizeof *s);
    if (!s) return llmem__fail(LLMEM_ENOMEM, "serve: out of memory");
    s->o = *o;
    s->model_path = strdup(o->model_path);
    s->tokenizer_path = dup_or_null(o->tokenizer_path);
    s->model_name = o->model_name ? strdup(o->model_name) : base_name(o->model_path);
    s->host = strdup(o->host ? o->host : "127.0.0.1");
    s->api_key = o->api_key && o->api_key[0] ? strdup(o->api_key) : NULL;
    s->o.chat_template = NULL; /* read in setup_chat only, from the caller's */
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_mutex_init(&s->snap_mu, NULL);
    pthread_mutex_init(&s->lat_mu, NULL);
    s->created = time(NULL);
    s->start_ns = llmem__now_ns();
    llmem_status st = LLMEM_OK;
    if (!s->model_path || !s->model_name || !s->host || (o->tokenizer_path && !s->tokenizer_path) ||
        (o->api_key && o->api_key[0] && !s->api_key))
        st = llmem__fail(LLMEM_ENOMEM, "serve: out of memory");
    if (!st) {
        s->o.chat_template = o->chat_template;
        st = build(s);
        s->o.chat_template = NULL;
    }
    /* The first sample before the step thread runs: the engine's stats
     * are the step thread's to read from then on. */
    if (!st) llmem__srv_sample(s, true);
    if (!st) st = llmem__srv_http_start(s);
    if (!st && pthread_create(&s->stepper, NULL, step_loop, s))
        st = llmem__fail(LLMEM_EOS, "serve: cannot start the step thread");
    else if (!st)
        s->stepper_started = true;
    if (st) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", llmem_error_message());
        llmem_server_destroy(s);
        return llmem__fail(st, "%s", msg);
    }
    if (o->fault_probability > 0) {
        /* Armed once everything is built: what fails is the serving's own
         * commits (KV blocks above all), never the start. */
        llmem_fault_options fo = llmem_fault_options_default();
        fo.probability = o->fault_probability;
        fo.seed = o->fault_seed ? o->fault_seed : 1;
        fo.ops = LLMEM_FAULT_OP_COMMIT;
        llmem_fault_resource_arm(s->fault, &fo);
    }
    *out = s;
    return LLMEM_OK;
}

uint16_t llmem_server_port(const llmem_server *s) { return s && !s->shut ? s->port : 0; }
const char *llmem_server_model_name(const llmem_server *s) { return s ? s->model_name : NULL; }
const char *llmem_server_chat_template(const llmem_server *s)
{
    return s && s->chat_ok ? llmem_chat_template_name(s->chat.t) : "none";
}

static bool wait_inflight(llmem_server *s, uint64_t deadline_ns)
{
    pthread_mutex_lock(&s->mu);
    while (s->ninflight && llmem__now_ns() < deadline_ns) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    bool empty = !s->ninflight;
    pthread_mutex_unlock(&s->mu);
    return empty;
}

llmem_status llmem_server_shutdown(llmem_server *s, uint32_t deadline_ms, llmem_server_shutdown_report *out)
{
    if (out) memset(out, 0, sizeof *out);
    if (!s) return llmem__fail(LLMEM_EINVAL, "serve: shutdown: null server");
    if (s->shut) return LLMEM_OK;
    uint64_t t0 = llmem__now_ns();
    atomic_store(&s->draining, true);
    llmem__srv_http_quiesce(s);
    pthread_mutex_lock(&s->mu);
    uint32_t at_start = s->ninflight;
    pthread_mutex_unlock(&s->mu);
    wait_inflight(s, t0 + (uint64_t)deadline_ms * 1000000ull);
    /* The deadline: whatever still runs is cancelled here, then its
     * handler or stream reader sees cancel_all and ends its response
     * (in that order: a handler that saw cancel_all first would cancel
     * and free its request itself, and it would not be counted). A
     * request whose handler frees it meanwhile finished by itself: its
     * id is then unknown and not counted. */
    uint32_t cancelled = 0;
    pthread_mutex_lock(&s->mu);
    uint32_t left = s->ninflight;
    llmem_sched_req *ids = left ? calloc(left, sizeof *ids) : NULL;
    size_t nids = 0;
    for (srv_req *r = s->inflight; r && ids; r = r->next) ids[nids++] = r->id;
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i < nids; i++)
        if (ids[i] && !llmem_sched_cancel(s->sched, ids[i])) cancelled++;
    free(ids);
    atomic_store(&s->cancel_all, true);
    wait_inflight(s, llmem__now_ns() + 5000ull * 1000000ull);
    llmem__srv_http_stop(s);
    atomic_store(&s->stop, true);
    if (s->stepper_started) pthread_join(s->stepper, NULL);
    s->stepper_started = false;
    teardown(s);
    s->shut = true;
    if (out) {
        out->finished = at_start > left ? at_start - left : 0;
        out->cancelled = cancelled;
        out->seconds = (double)(llmem__now_ns() - t0) * 1e-9;
        llmem_tracking_stats ts;
        memset(&ts, 0, sizeof ts);
        ts.struct_size = sizeof ts;
        if (s->track && !llmem_tracking_resource_get_stats(s->track, &ts)) {
            out->leaked_mappings = ts.live_mappings;
            out->leaked_bytes = ts.live_bytes;
        }
    }
    return LLMEM_OK;
}

void llmem_server_destroy(llmem_server *s)
{
    if (!s) return;
    if (!s->shut) {
        if (s->daemon || s->stepper_started) {
            llmem_server_shutdown(s, 0, NULL);
        } else {
            teardown(s);
            s->shut = true;
        }
    }
    llmem_resource_destroy(s->track);
    llmem_resource_destroy(s->fault);
    llmem_resource_destroy(s->os);
    free(s->samples);
    free(s->lat);
    free(s->steps);
    free(s->model_path);
    free(s->tokenizer_path);
    free(s->model_name);
    free(s->host);
    free(s->api_key);
    pthread_mutex_destroy(&s->lat_mu);
    pthread_mutex_destroy(&s->snap_mu);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* ---- stats ------------------------------------------------------------------ */

llmem_status llmem_server_get_stats(llmem_server *s, llmem_server_stats *out)
{
    if (!s || !out) return llmem__fail(LLMEM_EINVAL, "serve: stats: null argument");
    return llmem__stats_out_locked(out, &s->st, sizeof s->st, &s->mu);
}

LLMEM__STATS_SCHEMA_OF(llmem_server_stats_schema, "server", llmem_server_stats, LLMEM_SERVER_STATS_FIELDS)
