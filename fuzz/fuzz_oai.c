/*
 * fuzz_oai.c - the OpenAI request parser (llmem_oai_request_parse) and
 * the UTF-8 sanitiser on arbitrary bytes.
 *
 * Input: byte 0 chooses the kind (bit 0: chat, else completion); the rest
 * is the body, not NUL-terminated (the parser must not read past it).
 * A parse either fails with LLMEM_EFORMAT, LLMEM_EINVAL or LLMEM_ENOTSUP
 * and an error object (HTTP status 400, a type, a non-empty message), or
 * LLMEM_ENOMEM (500), or succeeds with a request whose every field is in
 * range: n in [1, 64], temperature in [0, 2], top_p in (0, 1], stop
 * strings non-empty, at most 16, each valid UTF-8 of at most 256 bytes,
 * a prompt (text or ids) for a completion, 1..4096 messages with content
 * for chat, include_usage only when streaming. The sanitiser's output is
 * always valid UTF-8 (checked by sanitising it again: nothing changes).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/llmem.h"

#include "support.h"

static bool valid_utf8(const char *s, size_t len)
{
    char *out = malloc(3 * len + 4);
    FZ_CHECK(out);
    size_t used;
    size_t w = llmem_utf8_sanitize(s, len, true, out, &used);
    bool same = used == len && w == len && !memcmp(out, s, len);
    free(out);
    return same;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_begin();
    if (!size) return 0;
    llmem_oai_kind kind = (data[0] & 1) ? LLMEM_OAI_CHAT : LLMEM_OAI_COMPLETION;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    /* An exact-size copy: ASan sees any read past the body. */
    char *copy = malloc(len ? len : 1);
    FZ_CHECK(copy);
    memcpy(copy, body, len);
    llmem_oai_request *r = NULL;
    llmem_oai_error err;
    llmem_status st = llmem_oai_request_parse(kind, copy, len, &r, &err);
    if (st) {
        FZ_CHECK(!r);
        FZ_CHECK(st == LLMEM_EFORMAT || st == LLMEM_EINVAL || st == LLMEM_ENOTSUP || st == LLMEM_ENOMEM);
        FZ_CHECK(err.http_status == (st == LLMEM_ENOMEM ? 500 : 400));
        FZ_CHECK(err.type && err.type[0]);
        FZ_CHECK(err.message[0]);
        FZ_CHECK(llmem_error_message()[0]);
    } else {
        FZ_CHECK(r && r->kind == kind);
        FZ_CHECK(r->n >= 1 && r->n <= LLMEM_OAI_MAX_N);
        FZ_CHECK(r->temperature >= 0 && r->temperature <= 2);
        FZ_CHECK(r->top_p > 0 && r->top_p <= 1);
        FZ_CHECK(r->stop_count <= LLMEM_OAI_MAX_STOP);
        for (uint32_t i = 0; i < r->stop_count; i++) {
            size_t l = strlen(r->stop[i]);
            FZ_CHECK(l > 0 && l <= LLMEM_OAI_MAX_STOP_BYTES);
            FZ_CHECK(valid_utf8(r->stop[i], l));
        }
        FZ_CHECK(!r->include_usage || r->stream);
        if (kind == LLMEM_OAI_COMPLETION) {
            FZ_CHECK((r->prompt != NULL) != (r->prompt_ids != NULL));
            if (r->prompt) FZ_CHECK(valid_utf8(r->prompt, strlen(r->prompt)));
            if (r->prompt_ids) FZ_CHECK(r->prompt_id_count > 0);
            for (uint32_t i = 0; i < r->prompt_id_count; i++) FZ_CHECK(r->prompt_ids[i] >= 0);
        } else {
            FZ_CHECK(r->message_count >= 1 && r->message_count <= LLMEM_OAI_MAX_MESSAGES);
            for (uint32_t i = 0; i < r->message_count; i++) {
                FZ_CHECK(r->messages[i].content);
                FZ_CHECK(r->messages[i].role <= LLMEM_CHAT_ASSISTANT);
                FZ_CHECK(valid_utf8(r->messages[i].content, strlen(r->messages[i].content)));
            }
        }
        if (r->model) FZ_CHECK(valid_utf8(r->model, strlen(r->model)));
    }
    llmem_oai_request_free(r);
    /* The sanitiser on the raw bytes, in two pieces (the streaming case). */
    char *out = malloc(3 * len + 4);
    FZ_CHECK(out);
    size_t used = 0;
    size_t w = llmem_utf8_sanitize(copy, len / 2, false, out, &used);
    FZ_CHECK(used <= len / 2 && len / 2 - used < 4);
    size_t used2;
    size_t w2 = llmem_utf8_sanitize(copy + used, len - used, true, out + w, &used2);
    FZ_CHECK(used2 == len - used);
    FZ_CHECK(valid_utf8(out, w + w2));
    free(out);
    free(copy);
    return 0;
}
