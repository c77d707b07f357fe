#include "bench/bench.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cli.h"

/* One row per `kvpage bench KIND`; each kind's function lives in bench/bench_KIND.c. */
static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} kinds[] = {
    {"memory", kvp_bench_memory, "KV memory use per allocation strategy and block size (paper Fig. 2)"},
    {"blockmgr", kvp_bench_blockmgr, "ns per block-manager operation (alloc, append, fork, free, mixed)"},
    {"prefix", kvp_bench_prefix, "prefix-cache hit rates: radix/hash/none x eviction policies x capacities"},
    {"attention", kvp_bench_attention, "paged vs contiguous CPU attention (decode, prefill) vs copy bandwidth"},
    {"generate", kvp_bench_generate, "CPU decode tokens/s of a real model: one sequence vs a batch"},
    {"serve", kvp_bench_serve, "load generator for a serving endpoint: TTFT, TPOT, ITL, throughput"},
    {"attention-cuda", kvp_bench_attention_cuda, "the CUDA decode kernel, paged vs contiguous vs device copy bandwidth"},
    {NULL, NULL, NULL},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: kvpage bench KIND [options]   (kvpage bench KIND --help for its options)\n\nkinds:\n");
    for (int i = 0; kinds[i].name; i++) fprintf(f, "  %-14s %s\n", kinds[i].name, kinds[i].summary);
}

kvp_status kvp_bench_out_dir(const char *opt, const char *dir)
{
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return KVP_ERR(KVP_EINVAL, "%s: cannot create '%s': %s", opt, dir, strerror(errno));
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return KVP_ERR(KVP_EINVAL, "%s: '%s' is not a directory", opt, dir);
    if (access(dir, W_OK) != 0) return KVP_ERR(KVP_EINVAL, "%s: '%s' is not writable: %s", opt, dir, strerror(errno));
    return KVP_OK;
}

int kvp_cmd_bench(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? KVP_EXIT_USAGE : KVP_EXIT_OK;
    }
    for (int i = 0; kinds[i].name; i++)
        if (strcmp(argv[1], kinds[i].name) == 0) return kinds[i].run(argc - 1, argv + 1);
    return kvp_cli_usage_error("bench", "unknown benchmark '%s'", argv[1]);
}
