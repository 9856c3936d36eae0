/*
 * cmd_plan.c - `llmem plan`: the memory plan of a workload before it runs
 * (the plan itself is llmem_workload_plan_make, llmem/workload.h).
 *
 * For a model (a file, a preset shape or a Hugging Face config.json), a
 * batch of B sequences of P prompt tokens generating up to T tokens each:
 *  - weights: the file's tensor bytes, or parameters x the element size;
 *  - KV: bytes per token (all layers, K and V) and for the workload
 *    (B x (P + T) tokens, rounded up to 16-token blocks per sequence);
 *  - activations: the engine's planned workspace (llmem_engine_plan_step)
 *    for the largest step of the workload - the prefill of all prompts in
 *    steps of at most 512 tokens, or a decode step of B tokens - with the
 *    lower bound beside it;
 *  - the reserve to take before prefill: (KV + activations) x the safety
 *    factor (1.2), so the run makes no resource call;
 *  - with --device-memory, how many such sequences fit beside the weights
 *    and the activations.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "tool_util.h"
#include "llmem/llmem.h"


static void usage(FILE *f)
{
    fprintf(f,
            "usage: llmem plan (--model FILE | --shape NAME|config.json) [--batch B] [--prompt-tokens P]\n"
            "                  [--max-tokens T] [--dtype f32|f16|q8_0] [--device-memory BYTES] [--threads N] [--json]\n"
            "\n"
            "The memory a workload needs: weights, KV cache, activations, the reserve to take\n"
            "before prefill, and how many sequences fit in --device-memory.\n"
            "  --batch B            concurrent sequences (default 1)\n"
            "  --prompt-tokens P    prompt tokens per sequence (default 512)\n"
            "  --max-tokens T       generated tokens per sequence (default 256)\n"
            "  --dtype D            element type of weights and KV (default f16); with --model the\n"
            "                       weights are the file's own bytes\n"
            "  --device-memory M    bytes available (e.g. 80GiB, 24GB)\n"
            "  --threads N          kernel threads (each has a row of attention scores; default 2)\n");
}

int llmem_cmd_plan(int argc, char **argv)
{
    const char *model = NULL, *shape_name = NULL;
    uint32_t batch = 1, prompt = 512, gen = 256, threads = 2;
    double device = 0;
    bool json = false;
    uint32_t dtype = LLMEM_DTYPE_F16;
    tool_args cl = {"plan", usage, argc, argv};
    while (tool_args_next(&cl)) {
        bool ok = true;
        if (tool_args_help(&cl)) return 0;
        else if (tool_args_is(&cl, "--json")) json = true;
        else if (tool_args_take(&cl, "--model")) model = cl.val;
        else if (tool_args_take(&cl, "--shape")) shape_name = cl.val;
        else if (tool_args_take(&cl, "--batch")) ok = tool_parse_u32(cl.val, 1, 1u << 20, &batch);
        else if (tool_args_take(&cl, "--prompt-tokens")) ok = tool_parse_u32(cl.val, 0, 1u << 24, &prompt);
        else if (tool_args_take(&cl, "--max-tokens")) ok = tool_parse_u32(cl.val, 0, 1u << 24, &gen);
        else if (tool_args_take(&cl, "--threads")) ok = tool_parse_u32(cl.val, 1, 1024, &threads);
        else if (tool_args_take(&cl, "--device-memory")) {
            device = tool_parse_bytes(cl.val);
            if (device == TOOL_BYTES_TOO_LARGE) {
                fprintf(stderr, "llmem plan: --device-memory '%s' is too large (at most 9e18 bytes)\n", cl.val);
                return 2;
            }
            ok = device > 0;
        }
        else if (tool_args_take(&cl, "--dtype")) {
            if (!strcmp(cl.val, "f32")) dtype = LLMEM_DTYPE_F32;
            else if (!strcmp(cl.val, "f16")) dtype = LLMEM_DTYPE_F16;
            else if (!strcmp(cl.val, "q8_0")) dtype = LLMEM_DTYPE_Q8_0;
            else ok = false;
        } else return tool_args_unknown(&cl);
        if (!ok) return tool_args_bad_value(&cl);
    }
    if (!model == !shape_name) {
        fprintf(stderr, "llmem plan: give one of --model and --shape\n");
        usage(stderr);
        return 2;
    }
    if (prompt + (uint64_t)gen == 0) { /* the library says so too; a usage error here */
        fprintf(stderr, "llmem plan: a sequence of no tokens\n");
        return 2;
    }

    llmem_workload w = llmem_workload_default();
    w.batch = batch;
    w.prompt_tokens = prompt;
    w.max_tokens = gen;
    w.threads = threads;
    w.device_bytes = device;
    w.kv_elem_bytes = dtype == LLMEM_DTYPE_F32 ? 4 : dtype == LLMEM_DTYPE_F16 ? 2 : 1;
    const char *weights_from;
    if (model) {
        llmem_model *m;
        llmem_status st = llmem_model_open(model, NULL, &m);
        if (st) {
            fprintf(stderr, "llmem plan: %s: %s\n", model, llmem_error_message());
            return 1;
        }
        w.shape = llmem_model_get_config(m)->shape;
        llmem_model_stats ms = {sizeof ms};
        llmem_model_get_stats(m, &ms);
        w.weights_bytes = ms.tensor_bytes;
        weights_from = "the file's tensors";
        llmem_model_close(m);
    } else {
        if (llmem_shape_load(shape_name, &w.shape)) {
            fprintf(stderr, "llmem plan: %s: %s\n", shape_name, llmem_error_message());
            return 1;
        }
        if (llmem_workload_weights_bytes(&w.shape, dtype, &w.weights_bytes)) {
            fprintf(stderr, "llmem plan: %s\n", llmem_error_message());
            return 1;
        }
        weights_from = llmem_dtype_name(dtype);
    }
    llmem_workload_plan p;
    if (llmem_workload_plan_make(&w, &p)) {
        fprintf(stderr, "llmem plan: %s\n", llmem_error_message());
        return 1;
    }
    const llmem_shape s = w.shape;
    if (p.over_context)
        fprintf(stderr, "llmem plan: note: %llu tokens per sequence exceed the model's context (%u)\n",
                (unsigned long long)p.seq_tokens, s.max_ctx);
    const llmem_plan_result *act = p.prefill_is_peak ? &p.prefill : &p.decode;
    uint64_t weights = w.weights_bytes, kv_token = p.kv_bytes_per_token, kv = p.kv_bytes, reserve = p.reserve_bytes;
    uint64_t seq_tokens = p.seq_tokens;
    size_t kv_elem = w.kv_elem_bytes;
    long long fit = p.max_concurrent;

    if (json) {
        printf("{\"model\":\"%s\",\"weights_from\":\"%s\",\"batch\":%u,\"prompt_tokens\":%u,\"max_tokens\":%u,"
               "\"weights_bytes\":%llu,\"kv_bytes_per_token\":%llu,\"kv_bytes\":%llu,"
               "\"activation_peak_bytes\":%zu,\"activation_lower_bound_bytes\":%zu,"
               "\"activation_naive_bytes\":%zu,\"safety_factor\":%.2f,\"recommended_reserve_bytes\":%llu,"
               "\"max_concurrent_sequences\":%lld}\n",
               s.name, weights_from, batch, prompt, gen, (unsigned long long)weights, (unsigned long long)kv_token,
               (unsigned long long)kv, act->peak_bytes, act->lower_bound_bytes, act->naive_bytes, w.safety,
               (unsigned long long)reserve, fit);
        return 0;
    }
    printf("%s: %u sequence%s of %u prompt + %u generated tokens\n", s.name, batch, batch == 1 ? "" : "s", prompt,
           gen);
    printf("  weights              %10.1f MB   (%s)\n", (double)weights / 1e6, weights_from);
    printf("  KV per token         %10.1f KB   (%u layers, %u KV heads x %u, %zu-byte elements)\n",
           (double)kv_token / 1e3, s.layers, s.kv_heads, s.head_dim, kv_elem);
    printf("  KV for the workload  %10.1f MB   (%llu tokens a sequence, in %u-token blocks)\n", (double)kv / 1e6,
           (unsigned long long)seq_tokens, w.block_tokens);
    printf("  activations          %10.1f MB   (planned; lower bound %.1f MB, naive %.1f MB; %s step)\n",
           (double)act->peak_bytes / 1e6, (double)act->lower_bound_bytes / 1e6, (double)act->naive_bytes / 1e6,
           p.prefill_is_peak ? "a prefill" : "a decode");
    printf("  reserve before prefill %8.1f MB   ((KV + activations) x %.1f)\n", (double)reserve / 1e6, w.safety);
    if (fit >= 0)
        printf("  sequences that fit   %10lld      in %.1f GB beside the weights\n", fit, device / 1e9);
    return 0;
}
