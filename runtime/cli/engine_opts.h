/* runtime/cli/engine_opts.h — the engine options that `simulate`, `generate` and `serve` share, parsed by one
 * piece of code into a kvp_engine_config (runtime/engine/engine.h).
 *
 *   --block-size N  --cache radix|hash|none  --evict POLICY  --sched fcfs|lpm|priority
 *   --preempt recompute|swap  --swap-space BYTES  --watermark-blocks N  --max-num-seqs N
 *   --max-batched-tokens N  --no-chunked-prefill  --speculative-config JSON
 *   --kv-offloading-size BYTES  --kv-offloading-policy P  --kv-events FILE
 *
 * A command builds its getopt table from its own options and the engine's (kvp_engine_opts_table), passes
 * every option id to kvp_engine_opt first, and prints kvp_engine_opts_usage in its --help. The defaults are
 * the command's: whatever *cfg holds before parsing. Byte sizes stay bytes here; the command turns them into
 * blocks of its model (or cost model).
 */
#ifndef KVP_RUNTIME_CLI_ENGINE_OPTS_H
#define KVP_RUNTIME_CLI_ENGINE_OPTS_H

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/status.h"
#include "runtime/engine/engine.h"
#include "runtime/executor/cuda_executor.h"

/* Option ids (getopt_long's val), above every command's own. */
enum {
    KVP_EO_BLOCK = 0x1000, KVP_EO_CACHE, KVP_EO_EVICT, KVP_EO_SCHED, KVP_EO_PREEMPT, KVP_EO_SWAP, KVP_EO_WATERMARK,
    KVP_EO_SEQS, KVP_EO_BATCH, KVP_EO_NOCHUNK, KVP_EO_SPEC, KVP_EO_OFFLOAD, KVP_EO_OFFPOL, KVP_EO_KVEVENTS, KVP_EO_END
};

typedef struct {
    kvp_engine_config *cfg;   /* borrowed: filled in place */
    int64_t swap_bytes;       /* --swap-space, -1: not given */
    int64_t offload_bytes;    /* --kv-offloading-size, 0: none */
    bool batch_given, watermark_given, offload_policy_given;
} kvp_engine_opts;

/* Opts over cfg, nothing given yet. */
void kvp_engine_opts_init(kvp_engine_opts *o, kvp_engine_config *cfg);

/* Appends the engine's long options to a command's own own[0..n_own) (without its terminator) into out,
 * terminated; cap must be at least n_own + KVP_EO_END - KVP_EO_BLOCK + 1. Returns the entries written. */
int kvp_engine_opts_table(const struct option *own, int n_own, struct option *out, int cap);

/* Handles option id c with value arg when it is an engine option: returns 1 (and *st, KVP_EINVAL naming the
 * problem for a bad value, cfg unchanged then), else 0. */
int kvp_engine_opt(kvp_engine_opts *o, int c, const char *arg, kvp_status *st);

/* The checks across options, after parsing: KVP_EINVAL naming them (an offloading policy without a tier). */
kvp_status kvp_engine_opts_check(const kvp_engine_opts *o);

/* The engine options' part of a --help, with the command's defaults (those of o->cfg before parsing). */
void kvp_engine_opts_usage(FILE *f, const kvp_engine_config *defaults);

/* ---- the device options of generate and simulate (serve may adopt them):
 *   --device cpu|cuda[:N]  --gpu-memory-utilization F  --kv-cache-memory BYTES  --enforce-eager  --deterministic
 *   --cuda-attention paged|rowwise
 * All but --device apply to the cuda executor only (kvp_device_opts_check says so otherwise). */
enum { KVP_DO_DEVICE = 0x1100, KVP_DO_GPU_UTIL, KVP_DO_KV_MEM, KVP_DO_EAGER, KVP_DO_CUDA_ATTN, KVP_DO_DETERMINISTIC,
       KVP_DO_END };

typedef struct {
    int cuda;              /* 1: --device cuda[:N] */
    kvp_cuda_options cu;   /* index, utilization, KV memory, eager */
    const char *cuda_only; /* a cuda-only option given, for the error without --device cuda */
} kvp_device_opts;

void kvp_device_opts_init(kvp_device_opts *o);
/* Appends the device options to a table of n entries (terminated after them); cap as kvp_engine_opts_table's
 * (KVP_DO_END - KVP_DO_DEVICE more). Returns the entries written, 0 when cap is too small. */
int kvp_device_opts_append(struct option *table, int n, int cap);
/* As kvp_engine_opt, for the device options. */
int kvp_device_opt(kvp_device_opts *o, int c, const char *arg, kvp_status *st);
/* KVP_EINVAL naming a cuda-only option given without --device cuda. */
kvp_status kvp_device_opts_check(const kvp_device_opts *o);
void kvp_device_opts_usage(FILE *f);

#endif
