/* kvpage — one program, one subcommand per job. Each subcommand takes (argc, argv) with argv[0] its name
 * and returns the process exit code (common/cli.h). */
#include <stdio.h>
#include <string.h>

#include "bench/bench.h"
#include "common/cli.h"
#include "common/report.h"
#include "runtime/cli/commands.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} commands[] = {
    {"plan", kvp_cmd_plan, "memory planner: weights, KV cache, blocks and sequences that fit on a GPU"},
    {"simulate", kvp_cmd_simulate, "serving simulator: a trace through scheduler + block manager on a cost model"},
    {"generate", kvp_cmd_generate, "run a real model on the CPU (GGUF or HF) over the paged KV cache"},
    {"serve", kvp_cmd_serve, "OpenAI-compatible HTTP server (completions, models, metrics) with continuous batching"},
    {"tokenize", kvp_cmd_tokenize, "a model's tokenizer: texts to token ids, or ids to text"},
    {"bench", kvp_cmd_bench, "benchmarks and sweeps: memory, blockmgr, prefix, attention, generate, attention-cuda"},
    {NULL, NULL, NULL},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: kvpage COMMAND [options]   (kvpage COMMAND --help for its options)\n\n"
               "kvpage is a PagedAttention KV-cache memory-manager research runtime.\n\ncommands:\n");
    for (int i = 0; commands[i].name; i++) fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return KVP_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return KVP_EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("kvpage 0.1 (commit %s)\n", kvp_git_commit());
        return KVP_EXIT_OK;
    }
    for (int i = 0; commands[i].name; i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kvpage: error: unknown command '%s' (see kvpage --help)\n", argv[1]);
    return KVP_EXIT_USAGE;
}
