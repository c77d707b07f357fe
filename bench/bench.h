/* bench/bench.h — `kvpage bench KIND`: each kind is one function with the subcommand calling convention
 * (argv[0] is the kind's name; returns a process exit code, see common/cli.h). */
#ifndef KVP_BENCH_BENCH_H
#define KVP_BENCH_BENCH_H

#include <stddef.h>

#include "common/status.h"

int kvp_cmd_bench(int argc, char **argv);
/* Makes directory dir if it is missing and checks that files can be written in it, before a benchmark runs
 * (not after: its results would be lost). KVP_EINVAL naming option opt. */
kvp_status kvp_bench_out_dir(const char *opt, const char *dir);
/* Where result files go without --out: "results" beside the kvpage program (build/results for build/kvpage),
 * so a benchmark never writes into the source tree unless asked (--out bench/results). Static storage. */
const char *kvp_bench_default_out(void);
/* The model's name as its config names it, for plot titles: config.json's "_name_or_path" (e.g.
 * "facebook/opt-13b"), else the file's name without ".json" (the folder's name for .../config.json or a folder). */
void kvp_bench_model_name(const char *config_path, char *out, size_t n);
int kvp_bench_prefix(int argc, char **argv); /* bench/bench_prefix.c */
int kvp_bench_blockmgr(int argc, char **argv); /* bench/bench_blockmgr.c */
int kvp_bench_memory(int argc, char **argv);    /* bench/bench_memory.c */
int kvp_bench_attention(int argc, char **argv); /* bench/bench_attention.c */
int kvp_bench_generate(int argc, char **argv);  /* bench/bench_generate.c */
int kvp_bench_serve(int argc, char **argv);     /* bench/bench_serve.c */
int kvp_bench_attention_cuda(int argc, char **argv); /* bench/bench_attention_cuda.c */

#endif
