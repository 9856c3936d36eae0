/*
 * llmem/synth.h - model files of a given shape with synthetic weights, for
 * benchmarks and tests on shapes we ship no weights for (tiny-15m,
 * yi-coder-1.5b, llama-2-7b...). The weights are seeded noise: the file
 * runs through every code path at the real size and speed, and its output
 * text is meaningless. The file says so in general.description.
 *
 * GGUF (matrices of any type llmem/quant.h writes; norms f32) or a
 * llama2.c checkpoint (f32 only), so Karpathy's run.c can run the same
 * weights side by side. The GGUF carries a vocabulary in its metadata:
 * a llama2.c tokenizer's, or a made-up one of the shape's size (<unk>,
 * <s>, </s>, the 256 byte tokens, the printable ASCII characters with the
 * space written as SentencePiece writes it, U+2581 "▁", then "▁" + letter
 * strings), scored so that shorter pieces merge first. llama.cpp and
 * llmem tokenise text the same way with it. With bpe_pre, a GPT-2
 * byte-level BPE vocabulary instead (tokenizer.ggml.model "gpt2", as
 * Qwen2 and Llama 3 files have): the 256 byte tokens, then merged tokens
 * shortest first - "Ġ" + a letter, two letters, then each token so far +
 * a letter, letters in English frequency order - each with its merge, and
 * "<|endoftext|>" (control) last as BOS and EOS, add_bos_token false.
 *
 * With arch "qwen2" the file is a Qwen2 one (general.architecture qwen2,
 * qwen2.* keys, blk.N.attn_{q,k,v}.bias, RMSNorm epsilon 1e-6 as Qwen2's
 * config), which llama.cpp runs with its NEOX rope; its BPE vocabulary
 * ends "<|endoftext|>" (BOS), "<|im_start|>", "<|im_end|>" (EOS) and the
 * file carries the ChatML chat template, as Qwen2 instruct files do.
 *
 * Values: matrices uniform in [-1/sqrt(n), 1/sqrt(n)] for rows of n (so
 * activations keep their scale through the layers), norms 1, biases
 * uniform in [-0.5, 0.5], the embedding uniform in [-1, 1]. Each tensor's values depend only on the seed and the
 * tensor's index, and are made one row at a time while the file is
 * written: a 7B file never sits in memory whole.
 */
#ifndef LLMEM_SYNTH_H
#define LLMEM_SYNTH_H

#include <stdbool.h>
#include <stdint.h>

#include "llmem/shape.h"
#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmem_synth_options {
    uint64_t seed;           /* of the weights; default 0 (llmem synth passes 1) */
    uint32_t type;           /* llmem_dtype of the matrices; default f32 (0). A matrix whose rows
                                are not whole blocks of it takes llmem_quant_row_type's fallback */
    const char *vocab_path;  /* a llama2.c tokenizer.bin whose vocabulary the GGUF carries; NULL: the
                                made-up one (none when the vocabulary is under 354 tokens) */
    bool progress;           /* progress lines on stderr for files over 100 MB when stderr is a terminal */
    const char *bpe_pre;     /* not NULL: a made-up GPT-2 byte-level BPE vocabulary instead (see below),
                                with this tokenizer.ggml.pre ("gpt-2", "qwen2", "llama-bpe") */
    const char *arch;        /* general.architecture: "llama" (NULL, the default) or "qwen2" (its keys
                                qwen2.*, Q/K/V biases, and the qwen2 BPE vocabulary unless
                                vocab_path or bpe_pre say otherwise) */
    uint32_t sliding_window; /* > 0: ARCH.attention.sliding_window (Mistral's key); default 0: none */
    const char *chat_template; /* not NULL: a tokenizer.chat_template of this family, "chatml" or "llama2"
                                (Jinja text as real files carry). ChatML with the made-up SentencePiece
                                vocabulary: its last two tokens become <|im_start|> and <|im_end|>
                                (control). With another vocabulary the template is written as asked and
                                the tokens are not added: a file whose template a server cannot use */
} llmem_synth_options;

/* Write a GGUF v3 model of the shape to path (whole or not at all). */
LLMEM_API llmem_status llmem_synth_gguf(const llmem_shape *shape, const llmem_synth_options *opts, const char *path);

/* Write a llama2.c checkpoint (f32; needs heads x head_dim = hidden) with
 * the same values as the GGUF of the same seed. */
LLMEM_API llmem_status llmem_synth_llama2c(const llmem_shape *shape, uint64_t seed, const char *path);

#ifdef __cplusplus
}
#endif

#endif /* LLMEM_SYNTH_H */
