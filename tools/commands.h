/*
 * commands.h - the subcommands of the llmem tool. Each takes the arguments
 * after its name (argv[0] is the subcommand) and returns the exit status.
 */
#ifndef LLMEM_TOOLS_COMMANDS_H
#define LLMEM_TOOLS_COMMANDS_H

int llmem_cmd_info(int argc, char **argv);
int llmem_cmd_demo(int argc, char **argv);
int llmem_cmd_bench(int argc, char **argv);
int llmem_cmd_replay(int argc, char **argv);
int llmem_cmd_run(int argc, char **argv);
int llmem_cmd_synth(int argc, char **argv);
int llmem_cmd_plan(int argc, char **argv);
int llmem_bench_alloc(int argc, char **argv);
int llmem_bench_waste(int argc, char **argv);

#endif
