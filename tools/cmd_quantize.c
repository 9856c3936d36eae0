/*
 * cmd_quantize.c - `llmem quantize IN.gguf OUT.gguf --type T`: a GGUF
 * model's matrices converted to another type (llmem_model_quantize does
 * the work; this parses the arguments and reports).
 */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "tool_util.h"
#include "llmem/llmem.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: llmem quantize IN.gguf OUT.gguf --type T [--keep-output]\n"
            "\n"
            "Writes IN with every 2-D weight matrix converted to T: f32, f16, bf16, q4_0, q4_1,\n"
            "q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k (q4_k_m, q4_k_s... are taken as q4_k).\n"
            "Norms and other 1-D tensors and the metadata are copied; general.file_type is set.\n"
            "A matrix whose rows are not whole blocks of T falls back as llama.cpp's quantiser\n"
            "does (q2_k, q3_k -> q4_0, q4_k -> q5_0, q5_k -> q5_1, q6_k -> q8_0; f16 when not\n"
            "even 32 divides the rows).\n"
            "  --keep-output   leave output.weight (the classifier) as it is\n");
}

int llmem_cmd_quantize(int argc, char **argv)
{
    const char *in = NULL, *out = NULL, *type = NULL;
    llmem_quantize_options o = {0, false, true};
    tool_args cl = {"quantize", usage, argc, argv};
    while (tool_args_next(&cl)) {
        if (tool_args_help(&cl)) return 0;
        else if (tool_args_take(&cl, "--type")) type = cl.val;
        else if (tool_args_is(&cl, "--keep-output")) o.keep_output = true;
        else if (cl.opt[0] == '-' || (in && out)) return tool_args_unknown(&cl);
        else if (!in) in = cl.opt;
        else out = cl.opt;
    }
    if (!in || !out || !type) {
        usage(stderr);
        return 2;
    }
    if (llmem_dtype_parse(type, &o.type) != LLMEM_OK) {
        fprintf(stderr, "llmem quantize: %s\n", llmem_error_message());
        return 2;
    }
    llmem_quantize_report r = {sizeof r};
    llmem_status st = llmem_model_quantize(in, out, &o, &r);
    if (st) {
        fprintf(stderr, "llmem quantize: %s (%s)\n", llmem_error_message()[0] ? llmem_error_message() : llmem_status_str(st),
                llmem_status_name(st));
        return 1;
    }
    fprintf(stderr,
            "llmem quantize: wrote %s: %llu tensors, %llu to %s, %llu to a fallback type, %llu kept; "
            "%.2f MB -> %.2f MB of tensor data\n",
            out, (unsigned long long)r.tensors, (unsigned long long)r.quantized, llmem_dtype_name(o.type),
            (unsigned long long)r.fallback, (unsigned long long)r.kept, (double)r.bytes_in / 1e6,
            (double)r.bytes_out / 1e6);
    return 0;
}
