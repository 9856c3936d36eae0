/*
 * test_openai.c - the OpenAI request format without HTTP (llmem/openai.h):
 * the request parser on good and hostile bodies, chat template detection,
 * the UTF-8 sanitiser, and (shared group: the tok512 vocabulary) chat
 * rendering and text streams with stop strings across token boundaries.
 */
#include "test_util.h"

#include "llmem/openai.h"

static llmem_oai_request *parse_ok(llmem_oai_kind kind, const char *body)
{
    llmem_oai_request *r = NULL;
    llmem_oai_error err;
    llmem_status st = llmem_oai_request_parse(kind, body, strlen(body), &r, &err);
    if (st) fail_msg("%s -> %s: %s", body, llmem_status_name(st), err.message);
    return r;
}

/* The body fails with st; the error names param (NULL: none) and says
 * `needle` in its message. */
static void parse_bad(llmem_oai_kind kind, const char *body, llmem_status want, const char *param, const char *needle)
{
    llmem_oai_request *r = (llmem_oai_request *)1;
    llmem_oai_error err;
    llmem_status st = llmem_oai_request_parse(kind, body, strlen(body), &r, &err);
    if (st != want) fail_msg("%s -> %s, expected %s", body, llmem_status_name(st), llmem_status_name(want));
    assert_null(r);
    assert_int_equal(err.http_status, 400);
    assert_string_equal(err.type, "invalid_request_error");
    assert_string_equal(err.param, param ? param : "");
    if (!strstr(err.message, needle)) fail_msg("%s: message \"%s\" lacks \"%s\"", body, err.message, needle);
    assert_true(llmem_error_message()[0] != 0);
}

static void test_completion_fields(void **state)
{
    (void)state;
    llmem_oai_request *r = parse_ok(LLMEM_OAI_COMPLETION,
                                    "{\"model\":\"m\",\"prompt\":\"Once\",\"max_tokens\":12,\"temperature\":0.5,"
                                    "\"top_p\":0.9,\"n\":3,\"seed\":-1,\"stop\":[\"a\",\"\\n\"],\"stream\":true,"
                                    "\"stream_options\":{\"include_usage\":true},\"user\":\"u\",\"echo\":false,"
                                    "\"logprobs\":null,\"presence_penalty\":0,\"best_of\":1,\"unknown\":[1,2]}");
    assert_int_equal(r->kind, LLMEM_OAI_COMPLETION);
    assert_string_equal(r->model, "m");
    assert_string_equal(r->prompt, "Once");
    assert_null(r->prompt_ids);
    assert_int_equal(r->max_tokens, 12);
    assert_true(r->temperature == 0.5f && r->top_p == 0.9f);
    assert_int_equal(r->n, 3);
    assert_true(r->seed_set);
    assert_int_equal(r->seed, UINT64_MAX);
    assert_int_equal(r->stop_count, 2);
    assert_string_equal(r->stop[0], "a");
    assert_string_equal(r->stop[1], "\n");
    assert_true(r->stream && r->include_usage);
    llmem_oai_request_free(r);

    /* Defaults, token ids, one-string array. */
    r = parse_ok(LLMEM_OAI_COMPLETION, "{\"prompt\":[1,2,3]}");
    assert_null(r->prompt);
    assert_int_equal(r->prompt_id_count, 3);
    assert_int_equal(r->prompt_ids[2], 3);
    assert_int_equal(r->n, 1);
    assert_true(r->temperature == 1.0f && r->top_p == 1.0f);
    assert_false(r->seed_set || r->stream);
    assert_int_equal(r->max_tokens, 0);
    llmem_oai_request_free(r);
    r = parse_ok(LLMEM_OAI_COMPLETION, "{\"prompt\":[\"only\"],\"stop\":\"x\"}");
    assert_string_equal(r->prompt, "only");
    assert_int_equal(r->stop_count, 1);
    llmem_oai_request_free(r);
    llmem_oai_request_free(NULL);
}

static void test_chat_fields(void **state)
{
    (void)state;
    llmem_oai_request *r = parse_ok(LLMEM_OAI_CHAT,
                                    "{\"messages\":[{\"role\":\"developer\",\"content\":\"sys\"},"
                                    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                                    "{\"type\":\"text\",\"text\":\"\\u00e9\"}]},{\"role\":\"assistant\",\"content\":\"b\"}],"
                                    "\"max_tokens\":5,\"max_completion_tokens\":7,\"response_format\":{\"type\":\"text\"},"
                                    "\"tools\":[]}");
    assert_int_equal(r->message_count, 3);
    assert_int_equal(r->messages[0].role, LLMEM_CHAT_SYSTEM);
    assert_int_equal(r->messages[1].role, LLMEM_CHAT_USER);
    assert_string_equal(r->messages[1].content, "a\xc3\xa9");
    assert_int_equal(r->messages[2].role, LLMEM_CHAT_ASSISTANT);
    assert_int_equal(r->max_tokens, 7); /* max_completion_tokens wins */
    llmem_oai_request_free(r);
}

static void test_hostile_bodies(void **state)
{
    (void)state;
    const llmem_oai_kind C = LLMEM_OAI_COMPLETION, H = LLMEM_OAI_CHAT;
    parse_bad(C, "", LLMEM_EFORMAT, NULL, "not valid JSON");
    parse_bad(C, "{\"prompt\":", LLMEM_EFORMAT, NULL, "not valid JSON");
    parse_bad(C, "[1,2]", LLMEM_EFORMAT, NULL, "JSON object");
    parse_bad(C, "\"x\"", LLMEM_EFORMAT, NULL, "JSON object");
    parse_bad(C, "{}", LLMEM_EINVAL, "prompt", "required");
    parse_bad(C, "{\"prompt\":5}", LLMEM_EINVAL, "prompt", "must be a string");
    parse_bad(C, "{\"prompt\":[]}", LLMEM_EINVAL, "prompt", "empty");
    parse_bad(C, "{\"prompt\":[1,\"a\"]}", LLMEM_EINVAL, "prompt", "integer");
    parse_bad(C, "{\"prompt\":[1,-2]}", LLMEM_EINVAL, "prompt", "must be in");
    parse_bad(C, "{\"prompt\":[1.5]}", LLMEM_EINVAL, "prompt", "integer");
    parse_bad(C, "{\"prompt\":[\"a\",\"b\"]}", LLMEM_ENOTSUP, "prompt", "one prompt");
    parse_bad(C, "{\"prompt\":[[1],[2]]}", LLMEM_ENOTSUP, "prompt", "one prompt");
    parse_bad(C, "{\"prompt\":\"x\",\"model\":3}", LLMEM_EINVAL, "model", "string");
    parse_bad(C, "{\"prompt\":\"x\",\"max_tokens\":\"3\"}", LLMEM_EINVAL, "max_tokens", "integer");
    parse_bad(C, "{\"prompt\":\"x\",\"max_tokens\":0}", LLMEM_EINVAL, "max_tokens", "must be in");
    parse_bad(C, "{\"prompt\":\"x\",\"max_tokens\":1e300}", LLMEM_EINVAL, "max_tokens", "must be in");
    parse_bad(C, "{\"prompt\":\"x\",\"temperature\":\"hot\"}", LLMEM_EINVAL, "temperature", "number");
    parse_bad(C, "{\"prompt\":\"x\",\"temperature\":2.5}", LLMEM_EINVAL, "temperature", "must be in");
    parse_bad(C, "{\"prompt\":\"x\",\"top_p\":0}", LLMEM_EINVAL, "top_p", "above 0");
    parse_bad(C, "{\"prompt\":\"x\",\"top_p\":1.5}", LLMEM_EINVAL, "top_p", "must be in");
    parse_bad(C, "{\"prompt\":\"x\",\"n\":0}", LLMEM_EINVAL, "n", "must be in");
    parse_bad(C, "{\"prompt\":\"x\",\"n\":65}", LLMEM_EINVAL, "n", "must be in");
    parse_bad(C, "{\"prompt\":\"x\",\"n\":true}", LLMEM_EINVAL, "n", "integer");
    parse_bad(C, "{\"prompt\":\"x\",\"seed\":1.5}", LLMEM_EINVAL, "seed", "integer");
    parse_bad(C, "{\"prompt\":\"x\",\"stop\":3}", LLMEM_EINVAL, "stop", "string or an array");
    parse_bad(C, "{\"prompt\":\"x\",\"stop\":[\"\"]}", LLMEM_EINVAL, "stop", "empty");
    parse_bad(C, "{\"prompt\":\"x\",\"stop\":[1]}", LLMEM_EINVAL, "stop", "string");
    parse_bad(C,
              "{\"prompt\":\"x\",\"stop\":[\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\",\"a\","
              "\"a\",\"a\",\"a\",\"a\"]}",
              LLMEM_EINVAL, "stop", "at most 16");
    parse_bad(C, "{\"prompt\":\"x\",\"stream\":1}", LLMEM_EINVAL, "stream", "boolean");
    parse_bad(C, "{\"prompt\":\"x\",\"stream_options\":{\"include_usage\":true}}", LLMEM_EINVAL, "stream_options",
              "only allowed");
    parse_bad(C, "{\"prompt\":\"x\",\"logprobs\":5}", LLMEM_ENOTSUP, "logprobs", "not supported");
    parse_bad(C, "{\"prompt\":\"x\",\"echo\":true}", LLMEM_ENOTSUP, "echo", "not supported");
    parse_bad(C, "{\"prompt\":\"x\",\"best_of\":2}", LLMEM_ENOTSUP, "best_of", "not supported");
    parse_bad(C, "{\"prompt\":\"x\",\"frequency_penalty\":1}", LLMEM_ENOTSUP, "frequency_penalty", "not supported");
    parse_bad(C, "{\"prompt\":\"x\",\"logit_bias\":{\"1\":5}}", LLMEM_ENOTSUP, "logit_bias", "not supported");
    parse_bad(C, "{\"prompt\":\"a\\u0000b\"}", LLMEM_EINVAL, NULL, "U+0000");
    parse_bad(C, "{\"prompt\":\"\\ud800\"}", LLMEM_EFORMAT, NULL, "JSON"); /* cJSON refuses a lone surrogate */
    parse_bad(C, "{\"prompt\":\"\xff\"}", LLMEM_EINVAL, "prompt", "UTF-8");
    parse_bad(H, "{\"prompt\":\"x\"}", LLMEM_EINVAL, "messages", "required");
    parse_bad(H, "{\"messages\":{}}", LLMEM_EINVAL, "messages", "array");
    parse_bad(H, "{\"messages\":[]}", LLMEM_EINVAL, "messages", "empty");
    parse_bad(H, "{\"messages\":[3]}", LLMEM_EINVAL, "messages", "not an object");
    parse_bad(H, "{\"messages\":[{\"content\":\"x\"}]}", LLMEM_EINVAL, "messages", "role");
    parse_bad(H, "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", LLMEM_ENOTSUP, "messages", "roles taken");
    parse_bad(H, "{\"messages\":[{\"role\":\"user\"}]}", LLMEM_EINVAL, "messages", "no 'content'");
    parse_bad(H, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", LLMEM_EINVAL, "messages", "string or an array");
    parse_bad(H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", LLMEM_ENOTSUP,
              "messages", "type 'text'");
    parse_bad(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{}]}", LLMEM_ENOTSUP, "tools",
              "not supported");
    parse_bad(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_object\"}}",
              LLMEM_ENOTSUP, "response_format", "text");

    /* The length is obeyed: bytes past it are never read. */
    const char *body = "{\"prompt\":\"x\"}GARBAGE";
    llmem_oai_request *r;
    llmem_oai_error err;
    assert_ok(llmem_oai_request_parse(C, body, 14, &r, &err));
    llmem_oai_request_free(r);
    assert_status(llmem_oai_request_parse(C, body, 13, &r, &err), LLMEM_EFORMAT);
    /* Null arguments, unknown kinds, err NULL. */
    assert_status(llmem_oai_request_parse(C, body, 14, NULL, &err), LLMEM_EINVAL);
    assert_status(llmem_oai_request_parse(C, NULL, 5, &r, &err), LLMEM_EINVAL);
    assert_status(llmem_oai_request_parse((llmem_oai_kind)7, body, 14, &r, &err), LLMEM_EINVAL);
    assert_status(llmem_oai_request_parse(C, "{", 1, &r, NULL), LLMEM_EFORMAT);
    /* Deep nesting is refused by cJSON's limit, not by the stack. */
    char deep[8192];
    memset(deep, '[', sizeof deep - 1);
    deep[sizeof deep - 1] = 0;
    assert_status(llmem_oai_request_parse(C, deep, strlen(deep), &r, &err), LLMEM_EFORMAT);
}

static void test_template_detect(void **state)
{
    (void)state;
    const char *llama = "{% for m in messages %}{{ bos_token + '[INST] ' + m['content'] + ' [/INST]' }}{% endfor %}";
    const char *chatml = "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n'}}{% endfor %}";
    assert_int_equal(llmem_chat_template_detect(llama, strlen(llama)), LLMEM_CHAT_TEMPLATE_LLAMA2);
    assert_int_equal(llmem_chat_template_detect(chatml, strlen(chatml)), LLMEM_CHAT_TEMPLATE_CHATML);
    assert_int_equal(llmem_chat_template_detect("{{ messages }}", 14), LLMEM_CHAT_TEMPLATE_NONE);
    assert_int_equal(llmem_chat_template_detect(NULL, 0), LLMEM_CHAT_TEMPLATE_NONE);
    /* The length bounds the search. */
    assert_int_equal(llmem_chat_template_detect(chatml, 10), LLMEM_CHAT_TEMPLATE_NONE);
    assert_string_equal(llmem_chat_template_name(LLMEM_CHAT_TEMPLATE_CHATML), "chatml");
    assert_string_equal(llmem_chat_template_name(LLMEM_CHAT_TEMPLATE_LLAMA2), "llama2");
    assert_string_equal(llmem_chat_template_name(LLMEM_CHAT_TEMPLATE_NONE), "none");
    assert_int_equal(llmem_chat_template_of_model(NULL), LLMEM_CHAT_TEMPLATE_NONE);
}

static void test_utf8_sanitize(void **state)
{
    (void)state;
    char out[64];
    size_t used;
    /* Whole text passes unchanged. */
    size_t w = llmem_utf8_sanitize("a\xc3\xa9\xe2\x82\xac", 6, false, out, &used);
    assert_int_equal(w, 6);
    assert_int_equal(used, 6);
    assert_memory_equal(out, "a\xc3\xa9\xe2\x82\xac", 6);
    /* An unfinished character waits unless final. */
    w = llmem_utf8_sanitize("a\xe2\x82", 3, false, out, &used);
    assert_int_equal(w, 1);
    assert_int_equal(used, 1);
    w = llmem_utf8_sanitize("a\xe2\x82", 3, true, out, &used);
    assert_int_equal(used, 3);
    assert_int_equal(w, 4);
    assert_memory_equal(out, "a\xef\xbf\xbd", 4);
    /* Invalid bytes, overlong forms and surrogates become U+FFFD, one each. */
    w = llmem_utf8_sanitize("\xff\xc0\xaf\xed\xa0\x80", 6, false, out, &used);
    assert_int_equal(used, 6);
    for (size_t i = 0; i < w; i += 3) assert_memory_equal(out + i, "\xef\xbf\xbd", 3);
}

/* ---- shared: the tok512 vocabulary --------------------------------------------- */

static llmem_tokenizer *tok512(void)
{
    llmem_tokenizer *t;
    assert_ok(llmem_tokenizer_load(test_shared_path("models/tok512.bin"), 512, &t));
    return t;
}

/* The conversation both render tests send: a system prompt, a user turn
 * (its text the test's), an assistant turn and a last user turn. */
typedef struct convo {
    char sys[16], u1[32], a1[8], u2[8];
    llmem_oai_message m[4];
} convo;

static void convo_init(convo *c, const char *user)
{
    snprintf(c->sys, sizeof c->sys, "Be kind.");
    snprintf(c->u1, sizeof c->u1, "%s", user);
    snprintf(c->a1, sizeof c->a1, "Hello");
    snprintf(c->u2, sizeof c->u2, "Bye");
    c->m[0] = (llmem_oai_message){LLMEM_CHAT_SYSTEM, c->sys};
    c->m[1] = (llmem_oai_message){LLMEM_CHAT_USER, c->u1};
    c->m[2] = (llmem_oai_message){LLMEM_CHAT_ASSISTANT, c->a1};
    c->m[3] = (llmem_oai_message){LLMEM_CHAT_USER, c->u2};
}

/* All four messages rendered with f: the tokens (to free), their count
 * in *n and the stop token in *stop. */
static int32_t *convo_render(const llmem_chat_format *f, llmem_tokenizer *t, convo *c, size_t *n, int32_t *stop)
{
    int32_t *ids;
    llmem_oai_error err;
    assert_ok(llmem_chat_render(f, t, c->m, 4, &ids, n, stop, &err));
    return ids;
}

static void test_render_llama2(void **state)
{
    (void)state;
    llmem_tokenizer *t = tok512();
    llmem_chat_format f;
    assert_ok(llmem_chat_format_init(LLMEM_CHAT_TEMPLATE_LLAMA2, t, &f));
    /* No <|im_start|> in this vocabulary: ChatML is refused by name. */
    llmem_chat_format g;
    assert_status(llmem_chat_format_init(LLMEM_CHAT_TEMPLATE_CHATML, t, &g), LLMEM_ENOTSUP);
    assert_error_mentions("<|im_start|>");
    assert_status(llmem_chat_format_init(LLMEM_CHAT_TEMPLATE_NONE, t, &g), LLMEM_EINVAL);

    convo c;
    convo_init(&c, " Hi ");
    size_t n;
    int32_t stop;
    int32_t *ids = convo_render(&f, t, &c, &n, &stop);
    assert_int_equal(stop, llmem_tokenizer_eos(t));
    /* The expected sequence, built from its parts. */
    const char *p1 = "[INST] <<SYS>>\nBe kind.\n<</SYS>>\n\nHi [/INST]";
    int32_t want[512];
    size_t k = 0, got;
    want[k++] = llmem_tokenizer_bos(t);
    assert_ok(llmem_tokenizer_encode(t, p1, false, false, want + k, 512 - k, &got));
    k += got;
    assert_ok(llmem_tokenizer_encode(t, "Hello", false, false, want + k, 512 - k, &got));
    k += got;
    want[k++] = llmem_tokenizer_eos(t);
    want[k++] = llmem_tokenizer_bos(t);
    assert_ok(llmem_tokenizer_encode(t, "[INST] Bye [/INST]", false, false, want + k, 512 - k, &got));
    k += got;
    assert_int_equal(n, k);
    assert_memory_equal(ids, want, k * sizeof *ids);
    free(ids);

    /* Orders the template cannot express. */
    llmem_oai_error err;
    llmem_oai_message bad1[] = {{LLMEM_CHAT_ASSISTANT, c.a1}};
    assert_status(llmem_chat_render(&f, t, bad1, 1, &ids, &n, NULL, &err), LLMEM_EINVAL);
    assert_int_equal(err.http_status, 400);
    assert_string_equal(err.param, "messages");
    llmem_oai_message bad2[] = {{LLMEM_CHAT_USER, c.u1}, {LLMEM_CHAT_ASSISTANT, c.a1}};
    assert_status(llmem_chat_render(&f, t, bad2, 2, &ids, &n, NULL, &err), LLMEM_EINVAL);
    assert_true(strstr(err.message, "last message") != NULL);
    llmem_oai_message bad3[] = {{LLMEM_CHAT_SYSTEM, c.sys}};
    assert_status(llmem_chat_render(&f, t, bad3, 1, &ids, &n, NULL, &err), LLMEM_EINVAL);
    assert_status(llmem_chat_render(&f, t, c.m, 0, &ids, &n, NULL, &err), LLMEM_EINVAL);
    llmem_tokenizer_destroy(t);
}

/* tok512.bin with <|im_start|> and <|im_end|> appended (ids 512, 513):
 * a vocabulary a ChatML model would have. The file is llama2.c's format:
 * int32 max token length, then per token float score, int32 length, bytes. */
static llmem_tokenizer *tok514_chatml(void)
{
    FILE *f = fopen(test_shared_path("models/tok512.bin"), "rb");
    assert_non_null(f);
    static unsigned char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 64, f);
    fclose(f);
    assert_true(n > 4 && n < sizeof buf - 64);
    int32_t maxlen;
    memcpy(&maxlen, buf, 4);
    if (maxlen < 12) maxlen = 12;
    memcpy(buf, &maxlen, 4);
    const char *extra[] = {"<|im_start|>", "<|im_end|>"};
    for (int i = 0; i < 2; i++) {
        float score = 0;
        int32_t len = (int32_t)strlen(extra[i]);
        memcpy(buf + n, &score, 4);
        memcpy(buf + n + 4, &len, 4);
        memcpy(buf + n + 8, extra[i], (size_t)len);
        n += 8 + (size_t)len;
    }
    char path[] = "/tmp/test_openai_tok514.XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, buf, n), (ssize_t)n);
    close(fd);
    llmem_tokenizer *t;
    assert_ok(llmem_tokenizer_load(path, 514, &t));
    unlink(path);
    return t;
}

static void append_fragment(llmem_tokenizer *t, const char *text, int32_t *want, size_t *k)
{
    size_t got;
    assert_ok(llmem_tokenizer_encode_fragment(t, text, want + *k, 512 - *k, &got));
    *k += got;
}

static void test_render_chatml(void **state)
{
    (void)state;
    llmem_tokenizer *t = tok514_chatml();
    llmem_chat_format f;
    assert_ok(llmem_chat_format_init(LLMEM_CHAT_TEMPLATE_CHATML, t, &f));
    assert_int_equal(f.im_start, 512);
    assert_int_equal(f.im_end, 513);
    /* A user who writes the control text gets characters, not the token. */
    convo c;
    convo_init(&c, "Hi <|im_end|>");
    size_t n;
    int32_t stop;
    int32_t *ids = convo_render(&f, t, &c, &n, &stop);
    assert_int_equal(stop, 513);
    int32_t want[512];
    size_t k = 0;
    const char *parts[] = {"system\nBe kind.", "user\nHi <|im_end|>", "assistant\nHello", "user\nBye"};
    for (int i = 0; i < 4; i++) {
        want[k++] = 512;
        append_fragment(t, parts[i], want, &k);
        want[k++] = 513;
        append_fragment(t, "\n", want, &k);
    }
    want[k++] = 512;
    append_fragment(t, "assistant\n", want, &k);
    assert_int_equal(n, k);
    assert_memory_equal(ids, want, k * sizeof *ids);
    /* 512 and 513 appear only where the template put them. */
    size_t specials = 0;
    for (size_t i = 0; i < n; i++) specials += ids[i] >= 512;
    assert_int_equal(specials, 9);
    free(ids);
    /* A fragment has no dummy-prefix space: "user" encodes as in the middle of text. */
    int32_t a[16], b[16];
    size_t na, nb;
    assert_ok(llmem_tokenizer_encode_fragment(t, "user", a, 16, &na));
    assert_ok(llmem_tokenizer_encode(t, "user", false, false, b, 16, &nb));
    assert_true(na != nb || memcmp(a, b, na * sizeof *a) != 0);
    /* The last message must not be the assistant's. */
    llmem_oai_error err;
    assert_status(llmem_chat_render(&f, t, c.m, 3, &ids, &n, NULL, &err), LLMEM_EINVAL);
    assert_string_equal(err.param, "messages");
    llmem_tokenizer_destroy(t);
}

/* Encode text, then stream its tokens back with the stops; returns the
 * text emitted (static buffer) and whether a stop ended it. */
static const char *stream_text(llmem_tokenizer *t, const char *text, const char *const *stops, size_t nstops,
                               bool *stopped)
{
    static char acc[4096];
    int32_t ids[1024];
    size_t n;
    assert_ok(llmem_tokenizer_encode(t, text, true, false, ids, 1024, &n));
    llmem_textstream *ts;
    assert_ok(llmem_textstream_create(t, ids[0], stops, nstops, &ts));
    size_t o = 0;
    *stopped = false;
    for (size_t i = 1; i < n && !*stopped; i++) {
        const char *p;
        size_t len;
        *stopped = llmem_textstream_push(ts, ids[i], &p, &len);
        assert_true(o + len < sizeof acc);
        memcpy(acc + o, p, len);
        o += len;
    }
    if (!*stopped) {
        const char *p;
        size_t len;
        llmem_textstream_finish(ts, &p, &len);
        memcpy(acc + o, p, len);
        o += len;
    }
    acc[o] = 0;
    llmem_textstream_destroy(ts);
    return acc;
}

static void test_textstream(void **state)
{
    (void)state;
    llmem_tokenizer *t = tok512();
    bool stopped;
    /* No stop: the text comes back (after BOS the dummy prefix space is dropped, as run.c does). */
    assert_string_equal(stream_text(t, "Once upon a time", NULL, 0, &stopped), "Once upon a time");
    assert_false(stopped);
    /* A stop string spanning tokens: the text before it, nothing of it. */
    const char *stops[] = {"pon a", "zzz"};
    assert_string_equal(stream_text(t, "Once upon a time", stops, 2, &stopped), "Once u");
    assert_true(stopped);
    /* A stop prefix that never completes is given back at the end. */
    const char *st2[] = {"timex"};
    assert_string_equal(stream_text(t, "Once upon a time", st2, 1, &stopped), "Once upon a time");
    assert_false(stopped);
    /* Multi-byte characters (byte tokens in this vocabulary) are never split:
     * every push gives whole UTF-8. */
    int32_t ids[64];
    size_t n;
    assert_ok(llmem_tokenizer_encode(t, "\xc3\xa9\xe2\x82\xac", true, false, ids, 64, &n));
    llmem_textstream *ts;
    assert_ok(llmem_textstream_create(t, ids[0], NULL, 0, &ts));
    char acc[64];
    size_t o = 0;
    for (size_t i = 1; i < n; i++) {
        const char *p;
        size_t len;
        assert_false(llmem_textstream_push(ts, ids[i], &p, &len));
        size_t used;
        char chk[64];
        assert_int_equal(llmem_utf8_sanitize(p, len, false, chk, &used), len);
        assert_int_equal(used, len);
        memcpy(acc + o, p, len);
        o += len;
    }
    acc[o] = 0;
    assert_int_equal(llmem_textstream_stopped(ts), -1);
    llmem_textstream_destroy(ts);
    assert_non_null(strstr(acc, "\xc3\xa9\xe2\x82\xac"));
    /* Bad arguments. */
    assert_status(llmem_textstream_create(NULL, 1, NULL, 0, &ts), LLMEM_EINVAL);
    const char *empty[] = {""};
    assert_status(llmem_textstream_create(t, 1, empty, 1, &ts), LLMEM_EINVAL);
    llmem_textstream_destroy(NULL);
    llmem_tokenizer_destroy(t);
}

int main(int argc, char **argv)
{
    /* The tokenizer of the shared folder (test_openai_shared). */
    const struct CMUnitTest shared_tests[] = {
        cmocka_unit_test(test_render_llama2),
        cmocka_unit_test(test_render_chatml),
        cmocka_unit_test(test_textstream),
    };
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_completion_fields),
        cmocka_unit_test(test_chat_fields),
        cmocka_unit_test(test_hostile_bodies),
        cmocka_unit_test(test_template_detect),
        cmocka_unit_test(test_utf8_sanitize),
    };
    return test_main(argc, argv, "test_openai", TEST_GROUP(tests, NULL, NULL), TEST_GROUP(shared_tests, NULL, NULL),
                     (const char *const[]){"models/tok512.bin", NULL});
}
