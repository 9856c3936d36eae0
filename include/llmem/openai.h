/*
 * llmem/openai.h - the OpenAI-compatible request format, without HTTP:
 * request bodies parsed and checked, chat templates, and the incremental
 * detokeniser a streaming server needs. llmem/server.h serves these over
 * HTTP; an embedder with an HTTP stack of its own can use them directly.
 *
 * Requests (llmem_oai_request_parse). A body of POST /v1/completions or
 * /v1/chat/completions is parsed with cJSON and every field the server acts
 * on is checked for type and range; the first problem becomes an
 * llmem_oai_error carrying the HTTP status (400), the OpenAI error type
 * ("invalid_request_error"), the offending parameter and a message. Fields
 * an OpenAI client may send that change nothing here (user, logit_bias
 * empty, presence/frequency penalty 0, logprobs false/null, echo false,
 * best_of 1) are accepted; a value that would ask for something this
 * server does not do is refused by name, never silently ignored.
 * Unknown fields are ignored, as OpenAI's own server does.
 *
 * Chat templates. Two families are rendered, straight to token ids (their
 * special tokens are ids, never text a user could forge):
 *  - LLAMA2: BOS "[INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST]" " answer " EOS
 *    BOS "[INST] user [/INST]" ... (Meta's chat format; a system message
 *    folds into the first user turn; turns must alternate user/assistant
 *    and end with a user turn);
 *  - CHATML: "<|im_start|>role\ncontent<|im_end|>\n" per message, then
 *    "<|im_start|>assistant\n"; <|im_start|> and <|im_end|> must be tokens
 *    of the vocabulary, and <|im_end|> ends the answer.
 * llmem_chat_template_detect recognises a family from a GGUF
 * tokenizer.chat_template (a Jinja text: "[INST]" means LLAMA2,
 * "<|im_start|>" CHATML); anything else is NONE, and a server then refuses
 * chat requests with a clear error while it still serves completions.
 *
 * Text streams (llmem_textstream). Tokens come one at a time; their pieces
 * are bytes (a <0xXX> byte token may be half of a UTF-8 character). A text
 * stream turns them into text that is always whole, valid UTF-8 (an
 * invalid byte becomes U+FFFD), so no SSE chunk ever splits a character,
 * and it matches stop strings across token boundaries: text that could be
 * the beginning of a stop string is held back until it cannot; when one
 * appears, the text before it is the last emitted and the stream says
 * stop. Not thread-safe: one stream per sample, one thread at a time.
 */
#ifndef LLMEM_OPENAI_H
#define LLMEM_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/model.h"
#include "llmem/status.h"
#include "llmem/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum llmem_oai_kind {
    LLMEM_OAI_COMPLETION = 0, /* POST /v1/completions */
    LLMEM_OAI_CHAT = 1        /* POST /v1/chat/completions */
} llmem_oai_kind;

typedef enum llmem_chat_role {
    LLMEM_CHAT_SYSTEM = 0,    /* "system" or "developer" */
    LLMEM_CHAT_USER = 1,
    LLMEM_CHAT_ASSISTANT = 2
} llmem_chat_role;

typedef struct llmem_oai_message {
    llmem_chat_role role;
    char *content;            /* UTF-8, NUL-terminated (text parts joined) */
} llmem_oai_message;

#define LLMEM_OAI_MAX_STOP 16u       /* stop strings a request may give */
#define LLMEM_OAI_MAX_STOP_BYTES 256u /* bytes of one stop string */
#define LLMEM_OAI_MAX_N 64u          /* samples a request may ask for */
#define LLMEM_OAI_MAX_MESSAGES 4096u

/* A parsed request; every pointer is owned by it (llmem_oai_request_free). */
typedef struct llmem_oai_request {
    llmem_oai_kind kind;
    char *model;                  /* NULL when absent */
    char *prompt;                 /* COMPLETION: the prompt text; NULL when given as token ids */
    int32_t *prompt_ids;          /* COMPLETION: the prompt as token ids (not checked against a vocabulary) */
    uint32_t prompt_id_count;
    llmem_oai_message *messages;  /* CHAT */
    uint32_t message_count;
    uint32_t max_tokens;          /* 0 when absent (the caller's default) */
    float temperature;            /* default 1 */
    float top_p;                  /* default 1 */
    uint64_t seed;
    bool seed_set;                /* false: the caller picks one */
    uint32_t n;                   /* default 1 */
    char **stop;                  /* stop strings, non-empty, valid UTF-8 */
    uint32_t stop_count;
    bool stream;
    bool include_usage;           /* stream_options.include_usage */
    bool return_token_ids;        /* extension (as vLLM's): token ids in the response: each choice's
                                     token_ids, and prompt_token_ids (the prompt as the model got it,
                                     a chat rendered; streams: in the usage chunk) */
} llmem_oai_request;

/* What is wrong with a request, as the OpenAI error object says it. */
typedef struct llmem_oai_error {
    int http_status;              /* 400 */
    const char *type;             /* "invalid_request_error" */
    char param[48];               /* the offending field ("" when none) */
    char message[320];
} llmem_oai_error;

/* Parse and check a request body (len bytes, need not be NUL-terminated).
 * LLMEM_OK with *out set; LLMEM_EFORMAT (malformed JSON, not an object),
 * LLMEM_EINVAL (a field of the wrong type or out of range, a required one
 * missing) or LLMEM_ENOTSUP (a feature not offered) with *err filled;
 * LLMEM_ENOMEM. err may be NULL. */
LLMEM_API llmem_status llmem_oai_request_parse(llmem_oai_kind kind, const char *body, size_t len,
                                               llmem_oai_request **out, llmem_oai_error *err);

/* NULL is a no-op. */
LLMEM_API void llmem_oai_request_free(llmem_oai_request *r);

/* ---- chat templates ----------------------------------------------------- */

typedef enum llmem_chat_template {
    LLMEM_CHAT_TEMPLATE_NONE = 0,   /* no usable template: chat refused */
    LLMEM_CHAT_TEMPLATE_LLAMA2 = 1,
    LLMEM_CHAT_TEMPLATE_CHATML = 2
} llmem_chat_template;

/* "none", "llama2", "chatml". */
LLMEM_API const char *llmem_chat_template_name(llmem_chat_template t);

/* The family of a Jinja chat template text (len bytes); NONE when neither
 * is recognised or text is NULL. */
LLMEM_API llmem_chat_template llmem_chat_template_detect(const char *text, size_t len);

/* The model's own: its GGUF tokenizer.chat_template detected; NONE when it
 * has none (llama2.c checkpoints never do). */
LLMEM_API llmem_chat_template llmem_chat_template_of_model(const llmem_model *m);

/* A template bound to a vocabulary: its special tokens looked up once. */
typedef struct llmem_chat_format {
    llmem_chat_template t;
    int32_t bos, eos;             /* LLAMA2 */
    int32_t im_start, im_end;     /* CHATML */
} llmem_chat_format;

/* Bind t to tok. LLMEM_ENOTSUP (with a message naming what is missing)
 * when the vocabulary lacks a special token the template needs;
 * LLMEM_EINVAL for NONE. */
LLMEM_API llmem_status llmem_chat_format_init(llmem_chat_template t, const llmem_tokenizer *tok, llmem_chat_format *out);

/* Render messages into prompt tokens: *ids (malloc'd, the caller frees)
 * gets *n tokens. The template's end-of-answer token goes to *stop_token
 * (optional). LLMEM_EINVAL (with err filled: 400, param "messages") for
 * an order of roles the template cannot express, LLMEM_ENOMEM. */
LLMEM_API llmem_status llmem_chat_render(const llmem_chat_format *f, const llmem_tokenizer *tok,
                                         const llmem_oai_message *msgs, size_t count, int32_t **ids, size_t *n,
                                         int32_t *stop_token, llmem_oai_error *err);

/* ---- text streams -------------------------------------------------------- */

typedef struct llmem_textstream llmem_textstream;

/* A stream whose first token follows prev (the prompt's last token: it
 * decides the leading space, see llmem_tokenizer_decode). stops (copied)
 * may be NULL with nstops 0. tok is borrowed. LLMEM_EINVAL, LLMEM_ENOMEM. */
LLMEM_API llmem_status llmem_textstream_create(const llmem_tokenizer *tok, int32_t prev, const char *const *stops,
                                               size_t nstops, llmem_textstream **out);
LLMEM_API void llmem_textstream_destroy(llmem_textstream *ts);

/* Feed a token. *text and *len get the text that became final (valid UTF-8,
 * possibly empty; valid until the next call). Returns true when a stop
 * string appeared: *text is what preceded it, and the stream takes no
 * more (later pushes give nothing and return true). An id out of the
 * vocabulary gives U+FFFD. */
LLMEM_API bool llmem_textstream_push(llmem_textstream *ts, int32_t token, const char **text, size_t *len);

/* The end of the sample: what was held back (a stop string's possible
 * beginning that never completed; an unfinished UTF-8 character as
 * U+FFFD). Nothing after a stop. */
LLMEM_API void llmem_textstream_finish(llmem_textstream *ts, const char **text, size_t *len);

/* Which stop string matched (index into stops), -1 when none did. */
LLMEM_API int llmem_textstream_stopped(const llmem_textstream *ts);

/* Bytes of s[0..len) that are whole, valid UTF-8 from the start, with
 * invalid bytes rewritten to U+FFFD into out (capacity 3 * len + 4);
 * *consumed gets how many input bytes were used (an unfinished character
 * at the end is left unless final). Returns the bytes written. */
LLMEM_API size_t llmem_utf8_sanitize(const char *s, size_t len, bool final, char *out, size_t *consumed);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_OPENAI_H */
