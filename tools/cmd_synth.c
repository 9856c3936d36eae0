/*
 * cmd_synth.c - `llmem synth`: a model file of a given shape with
 * synthetic weights (llmem/synth.h does the writing; this parses the
 * arguments and reports).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "tool_util.h"
#include "llmem/llmem.h"

llmem_status llmem_tool_synth_gguf(const llmem_shape *shape, uint32_t type, uint64_t seed, const char *path)
{
    llmem_synth_options o = {seed, type, NULL, true, NULL, NULL, 0};
    return llmem_synth_gguf(shape, &o, path);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: llmem synth --shape NAME|config.json -o FILE [--seed N] [--type T]\n"
            "                   [--format gguf|llama2c] [--vocab tokenizer.bin | --bpe PRE] [--ctx N]\n"
            "                   [--arch llama|qwen2] [--window N]\n"
            "                   [--chat-template chatml|llama2]\n"
            "\n"
            "Writes a model of that shape with synthetic (seeded random) weights: the output\n"
            "text is meaningless; speed and memory are real. Shapes: ");
    for (const char *const *n = llmem_shape_preset_names(); *n; n++) fprintf(f, "%s%s", *n, n[1] ? ", " : "\n");
    fprintf(f,
            "  --type T        matrix type: f32 (default), f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0,\n"
            "                  q2_k, q3_k, q4_k, q5_k, q6_k (norms stay f32; a matrix whose rows are not\n"
            "                  whole blocks of T takes llama.cpp's fallback type, as llmem quantize does)\n"
            "  --format F      gguf (default) or llama2c (f32 only; for llama2.c's run.c)\n"
            "  --vocab PATH    put this llama2.c tokenizer's vocabulary in the GGUF metadata\n"
            "                  (default: a made-up vocabulary of the shape's size)\n"
            "  --bpe PRE       a made-up GPT-2 byte-level BPE vocabulary instead (as Qwen2 and\n"
            "                  Llama 3 files have), with pre-tokenizer PRE: gpt-2, qwen2, llama-bpe\n"
            "  --ctx N         context length to record (default: the shape's)\n"
            "  --arch A        llama (default) or qwen2: a Qwen2 file (qwen2.* keys, Q/K/V biases,\n"
            "                  NEOX rope in llama.cpp; the qwen2 BPE vocabulary unless --vocab or\n"
            "                  --bpe says otherwise)\n"
            "  --window N      record an N-token sliding attention window (ARCH.attention.sliding_window,\n"
            "                  Mistral's key; llmem honours it, llama.cpp does not for llama or qwen2)\n"
            "  --chat-template F  write a tokenizer.chat_template of family F (chatml: the made-up\n"
            "                  vocabulary's last two tokens become <|im_start|> and <|im_end|>)\n");
}

int llmem_cmd_synth(int argc, char **argv)
{
    const char *shape = NULL, *out = NULL;
    llmem_synth_options so = {1, LLMEM_DTYPE_F32, NULL, true, NULL, NULL, 0};
    llmem_shape s;
    bool llama2c = false;
    uint32_t ctx = 0;
    tool_args cl = {"synth", usage, argc, argv};
    while (tool_args_next(&cl)) {
        bool ok = true;
        if (tool_args_help(&cl)) return 0;
        else if (tool_args_take(&cl, "--shape")) shape = cl.val;
        else if (tool_args_take(&cl, "-o")) out = cl.val;
        else if (tool_args_take(&cl, "--vocab")) so.vocab_path = cl.val;
        else if (tool_args_take(&cl, "--chat-template")) {
            ok = !strcmp(cl.val, "chatml") || !strcmp(cl.val, "llama2");
            so.chat_template = cl.val;
        } else if (tool_args_take(&cl, "--bpe")) {
            ok = !strcmp(cl.val, "gpt-2") || !strcmp(cl.val, "qwen2") || !strcmp(cl.val, "llama-bpe");
            so.bpe_pre = cl.val;
        }
        else if (tool_args_take(&cl, "--arch")) {
            ok = !strcmp(cl.val, "llama") || !strcmp(cl.val, "qwen2");
            so.arch = cl.val;
        } else if (tool_args_take(&cl, "--window")) ok = tool_parse_u32(cl.val, 1, 1u << 24, &so.sliding_window);
        else if (tool_args_take(&cl, "--seed")) ok = tool_parse_u64(cl.val, &so.seed);
        else if (tool_args_take(&cl, "--ctx")) ok = tool_parse_u32(cl.val, 1, 1u << 24, &ctx);
        else if (tool_args_take(&cl, "--type")) ok = llmem_dtype_parse(cl.val, &so.type) == LLMEM_OK;
        else if (tool_args_take(&cl, "--format")) {
            if (!strcmp(cl.val, "gguf")) llama2c = false;
            else if (!strcmp(cl.val, "llama2c")) llama2c = true;
            else ok = false;
        } else return tool_args_unknown(&cl);
        if (!ok) return tool_args_bad_value(&cl);
    }
    if (!shape || !out) {
        usage(stderr);
        return 2;
    }
    llmem_status st = llmem_shape_load(shape, &s);
    if (st) {
        fprintf(stderr, "llmem synth: %s: %s\n", shape, llmem_error_message());
        return 1;
    }
    if (ctx) s.max_ctx = ctx;
    if (llama2c && so.type != LLMEM_DTYPE_F32) {
        fprintf(stderr, "llmem synth: llama2.c checkpoints are f32 only\n");
        return 2;
    }
    if (llama2c && ((so.arch && strcmp(so.arch, "llama")) || so.sliding_window)) {
        fprintf(stderr, "llmem synth: llama2.c checkpoints are llama, without a window\n");
        return 2;
    }
    st = llama2c ? llmem_synth_llama2c(&s, so.seed, out) : llmem_synth_gguf(&s, &so, out);
    if (st) {
        fprintf(stderr, "llmem synth: %s: %s\n", out, llmem_error_message()[0] ? llmem_error_message() : llmem_status_str(st));
        return 1;
    }
    fprintf(stderr, "llmem synth: wrote %s (%s, %s, %s weights, synthetic: the output text is meaningless)\n", out,
            so.arch ? so.arch : "llama", s.name, llama2c ? "f32" : llmem_dtype_name(so.type));
    return 0;
}
