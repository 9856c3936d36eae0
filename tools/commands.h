/*
 * commands.h - the subcommands of the llmem tool. Each takes the arguments
 * after its name (argv[0] is the subcommand) and returns the exit status.
 */
#ifndef LLMEM_TOOLS_COMMANDS_H
#define LLMEM_TOOLS_COMMANDS_H

#include <stdbool.h>

int llmem_cmd_info(int argc, char **argv);
int llmem_cmd_demo(int argc, char **argv);
int llmem_cmd_bench(int argc, char **argv);
int llmem_cmd_replay(int argc, char **argv);
int llmem_cmd_run(int argc, char **argv);
int llmem_cmd_synth(int argc, char **argv);
int llmem_cmd_quantize(int argc, char **argv);
int llmem_cmd_plan(int argc, char **argv);
int llmem_cmd_soak(int argc, char **argv);
int llmem_cmd_serve(int argc, char **argv);

/* The foundation tour (demo_tour.c), behind llmem demo --tour. */
int llmem_demo_tour(bool json);
int llmem_bench_alloc(int argc, char **argv);
int llmem_bench_waste(int argc, char **argv);
int llmem_bench_checked(int argc, char **argv);
int llmem_bench_kernels(int argc, char **argv);
int llmem_bench_device(int argc, char **argv);
int llmem_bench_serve(int argc, char **argv);

#include "llmem/llmem.h"

/* Write a GGUF of this shape with synthetic weights (cmd_synth.c). */
llmem_status llmem_tool_synth_gguf(const llmem_shape *shape, uint32_t type, uint64_t seed, const char *path);

#endif
