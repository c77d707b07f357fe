#include "bench/bench.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cli.h"
#include "common/json.h"

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

const char *kvp_bench_default_out(void)
{
    static char dir[PATH_MAX + 16];
    if (dir[0]) return dir;
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char *slash = len > 0 ? (exe[len] = '\0', strrchr(exe, '/')) : NULL;
    if (slash == NULL) snprintf(dir, sizeof dir, "results");
    else {
        *slash = '\0';
        snprintf(dir, sizeof dir, "%s/results", exe);
    }
    return dir;
}

void kvp_bench_model_name(const char *config_path, char *out, size_t n)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", config_path);
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) snprintf(path, sizeof path, "%s/config.json", config_path);
    cJSON *cfg = NULL;
    const char *name = NULL;
    if (kvp_json_parse_file(path, &cfg) == KVP_OK && cJSON_IsObject(cfg)) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, "_name_or_path");
        if (cJSON_IsString(v) && v->valuestring[0]) name = v->valuestring;
    }
    if (name) snprintf(out, n, "%s", name);
    else { /* .../NAME.json, or .../NAME/config.json */
        char *end = path + strlen(path);
        while (end > path && end[-1] == '/') *--end = '\0';
        if (end - path > 12 && strcmp(end - 12, "/config.json") == 0) *(end -= 12) = '\0';
        else if (end - path > 5 && strcmp(end - 5, ".json") == 0) *(end -= 5) = '\0';
        else if (end - path > 5 && strcmp(end - 5, ".gguf") == 0) *(end -= 5) = '\0';
        const char *slash = strrchr(path, '/');
        snprintf(out, n, "%s", slash ? slash + 1 : path);
    }
    cJSON_Delete(cfg);
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
