/*
 * llmem.c - the llmem command-line tool: one binary, many subcommands.
 */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "llmem/llmem.h"

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static int cmd_version(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    printf("llmem %s\n%s\n", llmem_version(), llmem_build_info());
    return 0;
}

static int cmd_help(int argc, char **argv);

static const command commands[] = {
    {"version", cmd_version, "print the version and how the library was built"},
    {"info", llmem_cmd_info, "what this machine offers: page sizes, huge pages, NUMA, resources"},
    {"demo", llmem_cmd_demo, "llmem serving bursts of requests, and the story of its memory (--tour: the layers one by one)"},
    {"bench", llmem_cmd_bench, "benchmarks against glibc (llmem bench --help)"},
    {"run", llmem_cmd_run, "generate text with a llama model (llama2.c .bin or GGUF), memory from llmem"},
    {"plan", llmem_cmd_plan, "the memory a workload needs: weights, KV, activations, reserve, what fits"},
    {"synth", llmem_cmd_synth, "write a model of a given shape with synthetic weights"},
    {"quantize", llmem_cmd_quantize, "convert a GGUF model's matrices to another type (q4_0 .. q8_0, q2_k .. q6_k)"},
    {"replay", llmem_cmd_replay, "replay a request trace through the KV cache strategies"},
    {"serve", llmem_cmd_serve, "an OpenAI-compatible HTTP server over the engine (llmem serve --help)"},
    {"soak", llmem_cmd_soak, "serve random bursts for a long time; check resident memory for drift and leaks"},
    {"help", cmd_help, "this text"},
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: llmem <command> [options]\n"
            "\n"
            "llmem manages the memory of LLM inference: weights, KV cache, activations.\n"
            "\n"
            "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n'llmem <command> --help' describes a command's options.\n");
}

static int cmd_help(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    usage(stdout);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *name = argv[1];
    if (!strcmp(name, "--help") || !strcmp(name, "-h")) return cmd_help(0, NULL);
    if (!strcmp(name, "--version") || !strcmp(name, "-V")) return cmd_version(0, NULL);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(name, commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "llmem: unknown command '%s'\n\n", name);
    usage(stderr);
    return 2;
}
