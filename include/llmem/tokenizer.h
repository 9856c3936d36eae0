/*
 * llmem/tokenizer.h - the SentencePiece-style BPE tokenizer of llama models.
 *
 * Vocabularies come from a llama2.c tokenizer.bin (max_token_length, then
 * per token a float score, an int32 length and the bytes) or from a GGUF
 * model's metadata (tokenizer.ggml.tokens, .scores, .token_type,
 * .bos_token_id, .eos_token_id; model "llama"). Encoding is llama2.c's
 * run.c algorithm, so ids match the reference outputs token for token:
 * optional BOS; a dummy-prefix space before non-empty text; each UTF-8
 * code point looked up whole, else byte fallback (<0xXX> tokens); then the
 * adjacent pair whose merge is a vocabulary token of highest score is merged,
 * until none is. In GGUF vocabularies a space is written U+2581 ("▁");
 * encode and decode translate.
 *
 * Decoding a token gives its piece: <0xXX> becomes that byte, the leading
 * space after BOS is dropped (as run.c does), U+2581 becomes a space.
 * Pieces are valid until the tokenizer is freed.
 *
 * GGUF models with tokenizer.ggml.model "gpt2" (Qwen2, Llama 3, GPT-2) get
 * GPT-2 byte-level BPE instead, as llama.cpp runs it: special tokens split
 * out, the pre-tokenizer of tokenizer.ggml.pre (gpt-2, qwen2,
 * llama-bpe), then the ranked merges of tokenizer.ggml.merges; no dummy
 * prefix, no byte-fallback tokens (every byte is a token). Their BOS and
 * EOS ids are -1 when the metadata names none, and BOS is added only when
 * asked for and present. See src/model/tokenizer_bpe.c.
 */
#ifndef LLMEM_TOKENIZER_H
#define LLMEM_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/model.h"
#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_tokenizer llmem_tokenizer;

/* A llama2.c tokenizer.bin for a model of vocab_size tokens. Every length
 * and score is checked (LLMEM_EFORMAT naming the token and offset). */
LLMEM_API llmem_status llmem_tokenizer_load(const char *path, uint32_t vocab_size, llmem_tokenizer **out);

/* The same from a tokenizer.bin image in memory (copied; for tests and
 * fuzzing). */
LLMEM_API llmem_status llmem_tokenizer_load_memory(const void *data, size_t size, uint32_t vocab_size,
                                                   llmem_tokenizer **out);

/* The vocabulary in a GGUF model's metadata. LLMEM_ENOTFOUND if it has none
 * (llama2.c checkpoints: load their tokenizer.bin), LLMEM_ENOTSUP for a
 * tokenizer model other than "llama" and "gpt2", or a gpt2 pre-tokenizer
 * (tokenizer.ggml.pre) not listed above. */
LLMEM_API llmem_status llmem_tokenizer_from_model(const llmem_model *m, llmem_tokenizer **out);

LLMEM_API void llmem_tokenizer_destroy(llmem_tokenizer *t);

LLMEM_API uint32_t llmem_tokenizer_vocab_size(const llmem_tokenizer *t);
LLMEM_API int32_t llmem_tokenizer_bos(const llmem_tokenizer *t); /* 1 in llama vocabularies */
LLMEM_API int32_t llmem_tokenizer_eos(const llmem_tokenizer *t); /* 2 */
/* Whether the model wants BOS before a prompt: tokenizer.ggml.add_bos_token
 * when the file says, else true for SentencePiece vocabularies and false
 * for gpt2 ones; false whenever there is no BOS token. */
LLMEM_API bool llmem_tokenizer_add_bos(const llmem_tokenizer *t);
/* Whether this is a GPT-2 byte-level BPE vocabulary. */
LLMEM_API bool llmem_tokenizer_is_bpe(const llmem_tokenizer *t);

/* Encode NUL-terminated UTF-8 text into out[0..cap); *n gets the count.
 * LLMEM_ERANGE if cap is too small (strlen(text) + 3 is always enough), with
 * *n the count needed. */
LLMEM_API llmem_status llmem_tokenizer_encode(const llmem_tokenizer *t, const char *text, bool bos, bool eos,
                                              int32_t *out, size_t cap, size_t *n);

/* The same for a fragment that continues a prompt (the text between two
 * special tokens of a chat template): no BOS, no dummy-prefix space, so
 * "<|im_start|>" + fragment("user") encodes "user" as a model trained on
 * such prompts saw it. Same errors. */
LLMEM_API llmem_status llmem_tokenizer_encode_fragment(const llmem_tokenizer *t, const char *text, int32_t *out,
                                                       size_t cap, size_t *n);

/* The same, and control tokens written in the text ("<|im_start|>") become
 * those tokens (llama.cpp's parse_special), as chat templates need. For
 * SentencePiece vocabularies, the same as llmem_tokenizer_encode. */
LLMEM_API llmem_status llmem_tokenizer_encode_special(const llmem_tokenizer *t, const char *text, bool bos, bool eos,
                                                      int32_t *out, size_t cap, size_t *n);

/* The text of `token` following `prev` (see above), with its length (a
 * <0x00> piece is one NUL byte). NULL for an id out of range. */
LLMEM_API const char *llmem_tokenizer_decode(const llmem_tokenizer *t, int32_t prev, int32_t token, size_t *len);

/* The vocabulary entry itself (as stored), for tests and tools. */
LLMEM_API const char *llmem_tokenizer_token(const llmem_tokenizer *t, int32_t token, size_t *len, float *score);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_TOKENIZER_H */
