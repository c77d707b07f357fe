/* Tests of `kvpage bench prefix` and its replay: radix == hash when unbounded, the Mooncake synthetic trace's
 * hit rate against the trace's own repeat rate, belady >= every online policy at bounded capacities, none = 0,
 * requests larger than the cache, and the command line (exit codes, --json keys, bad trace lines); the one-pass
 * LRU curve against replays on every workload, the miss classes' sums and brute-force cold counts, the KV events
 * against the replay's cache, the regret, --curve and --health columns. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench_prefix.h"
#include "common/json.h"

#include "cli_testutil.h"
#include "prefix_testutil.h"

#define SYNTH "../shared/data/traces/mooncake/synthetic_trace.jsonl"

static kvp_prefix_replay_result replay(const kvp_workload *w, kvp_pc_kind k, kvp_evict_policy p, int32_t bs, int64_t cap)
{
    kvp_prefix_replay_cfg c = {k, p, bs, cap, 0, KVP_HC_WRITE_THROUGH};
    kvp_prefix_replay_result r;
    cr_assert_eq(kvp_prefix_replay(w, &c, &r), KVP_OK, "%s", kvp_error_detail());
    return r;
}

/* The trace's own statistics from its hash ids, parsed naively (independent of the reader): block
 * occurrences, those whose id was seen before, and those among them that are a request's last block. */
static void trace_repeats(const char *path, long long *blocks, long long *repeated, long long *repeated_last)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "test data %s is missing", path);
    size_t cap = 1 << 20;
    unsigned char *seen = calloc(cap, 1);
    char *line = NULL;
    size_t lcap = 0;
    *blocks = *repeated = *repeated_last = 0;
    while (getline(&line, &lcap, f) > 0) {
        char *p = strchr(strstr(line, "\"hash_ids\""), '[') + 1;
        long long ids[4096];
        int n = 0;
        while (*p && *p != ']') {
            char *end;
            ids[n++] = strtoll(p, &end, 10);
            p = end;
            while (*p == ',' || *p == ' ') p++;
        }
        for (int i = 0; i < n; i++) {
            cr_assert_lt((size_t)ids[i], cap);
            (*blocks)++;
            if (seen[ids[i]]) {
                (*repeated)++;
                if (i == n - 1) (*repeated_last)++;
            }
        }
        for (int i = 0; i < n; i++) seen[ids[i]] = 1;
    }
    free(line);
    free(seen);
    fclose(f);
}

Test(bench_prefix, mooncake_unbounded_equals_repeat_rate)
{
    long long blocks, repeated, repeated_last;
    trace_repeats(SYNTH, &blocks, &repeated, &repeated_last);
    cr_assert_eq(blocks, 121877, "the traces README counts 121,877 blocks");
    cr_assert(llabs(repeated * 1000 - 640 * blocks) < blocks / 2, "README: 64.0 %% repeated blocks");

    kvp_workload *w;
    cr_assert_eq(kvp_workload_read_mooncake(SYNTH, NULL, &w), KVP_OK, "%s", kvp_error_detail());
    kvp_prefix_replay_result r = replay(w, KVP_PC_RADIX, KVP_EVICT_LRU, 512, 0);
    kvp_prefix_replay_result h = replay(w, KVP_PC_HASH, KVP_EVICT_LRU, 512, 0);
    cr_assert_eq(r.hit_tokens, h.hit_tokens);
    cr_assert_eq(r.prompt_blocks, blocks);
    /* Every repeated block hits except a request's last one: it holds the last token (never covered by a
     * hit), and when partial it is never cached. The trace's ids are prefix-consistent, so nothing else
     * differs. */
    cr_assert_eq(r.hit_blocks, repeated - repeated_last, "hit %lld blocks, repeats %lld - last %lld",
                 (long long)r.hit_blocks, repeated, repeated_last);
    cr_assert_eq(r.hit_tokens, 512 * r.hit_blocks);
    cr_assert_eq(r.evicted_blocks, 0);
    kvp_prefix_replay_result n = replay(w, KVP_PC_NONE, KVP_EVICT_LRU, 512, 0);
    cr_assert_eq(n.hit_tokens, 0);
    kvp_workload_destroy(w);
}

Test(bench_prefix, belady_bounds_online_policies)
{
    const char *specs[] = {"system:n=150,prefix=512,suffix=128,share=0.7", "chat:conversations=20,turns=5",
                           "fewshot:n=150,tasks=6,examples=4,example=96", "branch:n=150,depth=3,fanout=3,segment=64",
                           "mooncake:../shared/data/traces/mooncake/arxiv_trace_first20.jsonl"};
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        kvp_workload *w;
        cr_assert_eq(kvp_workload_load(specs[s], 0, &w), KVP_OK, "%s", kvp_error_detail());
        int32_t bs = s == 4 ? 64 : 16;
        kvp_prefix_replay_result ur = replay(w, KVP_PC_RADIX, KVP_EVICT_LRU, bs, 0);
        kvp_prefix_replay_result uh = replay(w, KVP_PC_HASH, KVP_EVICT_LRU, bs, 0);
        cr_assert_eq(ur.hit_tokens, uh.hit_tokens, "%s: radix and hash agree when unbounded", specs[s]);
        cr_assert_gt(ur.hit_tokens, 0, "%s shares prefixes", specs[s]);
        int64_t peak = ur.peak_cached_blocks;
        for (int kind = KVP_PC_RADIX; kind <= KVP_PC_HASH; kind++)
            for (int f = 1; f <= 3; f++) {
                int64_t cap = peak * f / 5;
                int64_t best = replay(w, (kvp_pc_kind)kind, KVP_EVICT_BELADY, bs, cap).hit_tokens;
                cr_assert_leq(best, ur.hit_tokens, "a bounded cache cannot beat the unbounded one");
                for (int p = KVP_EVICT_LRU; p < KVP_EVICT_BELADY; p++) {
                    kvp_prefix_replay_result o = replay(w, (kvp_pc_kind)kind, (kvp_evict_policy)p, bs, cap);
                    cr_assert_geq(best, o.hit_tokens, "%s %s cap %lld: belady %lld < %s %lld", specs[s],
                                  kvp_pc_kind_name((kvp_pc_kind)kind), (long long)cap, (long long)best,
                                  kvp_evict_policy_name((kvp_evict_policy)p), (long long)o.hit_tokens);
                }
                cr_assert_eq(replay(w, KVP_PC_NONE, KVP_EVICT_LRU, bs, cap).hit_tokens, 0);
            }
        kvp_workload_destroy(w);
    }
}

Test(bench_prefix, requests_larger_than_the_cache)
{
    kvp_workload *w;
    cr_assert_eq(kvp_workload_generate("system:n=20,prefix=256,suffix=256", &w), KVP_OK);
    kvp_prefix_replay_result r = replay(w, KVP_PC_RADIX, KVP_EVICT_LRU, 16, 8);
    cr_assert_eq(r.requests, 20);
    cr_assert_eq(r.short_requests, 20, "every prompt needs more than 8 blocks");
    cr_assert_leq(r.peak_cached_blocks, 8);
    kvp_prefix_replay_cfg bad = {KVP_PC_RADIX, KVP_EVICT_LRU, 16, -1, 0, KVP_HC_WRITE_THROUGH};
    cr_assert_eq(kvp_prefix_replay(w, &bad, &r), KVP_EINVAL);
    kvp_prefix_replay_cfg bad_host = {KVP_PC_RADIX, KVP_EVICT_LRU, 16, 8, -1, KVP_HC_WRITE_THROUGH};
    cr_assert_eq(kvp_prefix_replay(w, &bad_host, &r), KVP_EINVAL);
    /* a pool too large for int32 block ids: an error, with nothing leaked (the sanitizer build checks) */
    kvp_prefix_replay_cfg huge = {KVP_PC_RADIX, KVP_EVICT_LRU, 16, INT32_MAX, 0, KVP_HC_WRITE_THROUGH};
    cr_assert_eq(kvp_prefix_replay(w, &huge, &r), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "too large"), "%s", kvp_error_message());
    kvp_workload_destroy(w);
}

/* A host tier that never evicts holds every block ever cached (write-through), so a small device cache in
 * front of it finds, device and host hits together, exactly what an unbounded device cache finds; the
 * device cache's own hits do not change (loaded blocks are inserted as computed ones are). A bounded host
 * tier finds less, and no host tier finds nothing there. */
Test(bench_prefix, a_host_tier_restores_the_unbounded_hit_rate)
{
    const char *specs[] = {"chat:conversations=60", "fewshot:n=200,tasks=16", "fewshot:n=200", "branch:n=200"};
    for (int i = 0; i < 4; i++) {
        kvp_workload *w;
        cr_assert_eq(kvp_workload_generate(specs[i], &w), KVP_OK);
        for (int k = KVP_PC_RADIX; k <= KVP_PC_HASH; k++) {
            kvp_prefix_replay_result unb = replay(w, (kvp_pc_kind)k, KVP_EVICT_LRU, 16, 0);
            int64_t cap = unb.peak_cached_blocks / 10 > 64 ? unb.peak_cached_blocks / 10 : 64;
            kvp_prefix_replay_result dev = replay(w, (kvp_pc_kind)k, KVP_EVICT_LRU, 16, cap);
            cr_assert_eq(dev.short_requests, 0);
            cr_assert_lt(dev.hit_tokens, unb.hit_tokens, "%s: the device cache of %lld blocks must lose hits", specs[i],
                         (long long)cap);
            cr_assert_eq(dev.host_hit_tokens, 0);
            cr_assert_eq(dev.total_hit_rate, dev.hit_rate);
            int64_t hosts[2] = {unb.peak_cached_blocks + 1, cap};
            kvp_prefix_replay_result two[2];
            for (int h = 0; h < 2; h++) {
                kvp_prefix_replay_cfg c = {(kvp_pc_kind)k, KVP_EVICT_LRU, 16, cap, hosts[h], KVP_HC_WRITE_THROUGH};
                cr_assert_eq(kvp_prefix_replay(w, &c, &two[h]), KVP_OK, "%s", kvp_error_detail());
                cr_assert_eq(two[h].hit_tokens, dev.hit_tokens, "%s: host loads changed the device hits", specs[i]);
                cr_assert_leq(two[h].host_stored_blocks, two[h].inserted_blocks);
            }
            cr_assert_eq(two[0].hit_tokens + two[0].host_hit_tokens, unb.hit_tokens,
                         "%s/%s: device %lld + host %lld != unbounded %lld", specs[i], kvp_pc_kind_name((kvp_pc_kind)k),
                         (long long)two[0].hit_tokens, (long long)two[0].host_hit_tokens, (long long)unb.hit_tokens);
            cr_assert_gt(two[0].host_hit_tokens, 0);
            cr_assert_leq(two[1].host_hit_tokens, two[0].host_hit_tokens);
            /* write_back: only evicted blocks are stored. Radix evicts leaves, so the device keeps a prefix-closed
             * set and every block past a device hit that was ever cached is in the unbounded tier: the
             * unbounded hits again. Hash may evict a middle block before its successors, which the device
             * then keeps out of reach while the tier never got them: at most the unbounded hits. */
            kvp_prefix_replay_cfg cb = {(kvp_pc_kind)k, KVP_EVICT_LRU, 16, cap, hosts[0], KVP_HC_WRITE_BACK};
            kvp_prefix_replay_result wb;
            cr_assert_eq(kvp_prefix_replay(w, &cb, &wb), KVP_OK, "%s", kvp_error_detail());
            cr_assert_eq(wb.hit_tokens, dev.hit_tokens, "%s: write-back changed the device hits", specs[i]);
            cr_assert_leq(wb.host_stored_blocks, wb.evicted_blocks, "%s: a write-back store without an eviction", specs[i]);
            cr_assert_gt(wb.host_hit_tokens, 0);
            if (k == KVP_PC_RADIX)
                cr_assert_eq(wb.hit_tokens + wb.host_hit_tokens, unb.hit_tokens, "%s: write-back device %lld + host %lld != %lld",
                             specs[i], (long long)wb.hit_tokens, (long long)wb.host_hit_tokens, (long long)unb.hit_tokens);
            else
                cr_assert_leq(wb.hit_tokens + wb.host_hit_tokens, unb.hit_tokens);
            /* write_through_selective: a block is stored once a request hit it in the device cache. Behind a
             * device cache that never evicts, the tier then holds exactly the distinct blocks ever hit (a brute
             * force count, for workloads without pinned prefixes); behind the small one, it stores fewer blocks
             * than write-through and still brings some back. */
            kvp_prefix_replay_cfg cs = {(kvp_pc_kind)k, KVP_EVICT_LRU, 16, 0, hosts[0], KVP_HC_WRITE_THROUGH_SELECTIVE};
            kvp_prefix_replay_result sel;
            cr_assert_eq(kvp_prefix_replay(w, &cs, &sel), KVP_OK, "%s", kvp_error_detail());
            cr_assert_eq(sel.hit_tokens, unb.hit_tokens);
            if (w->n_pins == 0)
                cr_assert_eq(sel.host_stored_blocks, kvp_test_bruteforce_hit_blocks(w, 16), "%s: %lld stored", specs[i],
                             (long long)sel.host_stored_blocks);
            cs.capacity = cap;
            cr_assert_eq(kvp_prefix_replay(w, &cs, &sel), KVP_OK, "%s", kvp_error_detail());
            cr_assert_eq(sel.hit_tokens, dev.hit_tokens, "%s: selective stores changed the device hits", specs[i]);
            cr_assert_lt(sel.host_stored_blocks, two[0].host_stored_blocks, "%s", specs[i]);
            cr_assert_gt(sel.host_hit_tokens, 0, "%s", specs[i]);
            cr_assert_leq(sel.hit_tokens + sel.host_hit_tokens, unb.hit_tokens);
        }
        kvp_workload_destroy(w);
    }
}

/* ---- command line ---------------------------------------------------------------------------------- */

static int run(const char *args, char *out, size_t cap, char *err, size_t ecap)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "bench prefix %s", args);
    return kvp_test_cli(cmd, out, cap, err, ecap);
}

Test(bench_prefix, cli)
{
    static char out[1 << 16], err[4096];
    cr_assert_eq(run("--help", out, sizeof out, err, sizeof err), 0);
    cr_assert(strstr(out, "--capacity"));
    cr_assert_eq(run("", out, sizeof out, err, sizeof err), 2, "a workload is required");
    cr_assert_eq(run("--workload system --cache trie", out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "trie"), "%s", err);
    cr_assert_eq(run("--workload system --evict random", out, sizeof out, err, sizeof err), 2);
    cr_assert_eq(run("--workload system --block-size 0", out, sizeof out, err, sizeof err), 2);
    cr_assert_eq(run("--workload nosuch", out, sizeof out, err, sizeof err), 2);
    cr_assert_eq(run("--workload system --bogus", out, sizeof out, err, sizeof err), 2);
    static const kvp_cli_case lists[] = {
        {"--capacity-tokens abc", "--capacity-tokens: 'abc'"}, /* the option given, not --capacity */
        {"--capacity 1,,2", "--capacity: '1,,2' has an empty item"},
        {"--block-size 16,", "--block-size"},
        {"--evict lru,,fifo", "--evict"},
        {"--capacity 5 --capacity-tokens 100", "not both"},
        {"--host-capacity -4", "--host-capacity: -4 is out of range"},
        {"--host-capacity 10,x", "--host-capacity"},
        {"--host-capacity 10 --host-write-policy write_around", "'write_around'"},
        {"--host-capacity 10 --host-write-policy write_back,", "--host-write-policy"},
        {"--capacity 1,2 --no-plot --out /tmp --name a/b", "--name: 'a/b' is not a file name"},
        {"--capacity 1,2 --no-plot --out /dev/null/x", "--out: cannot create"},
    };
    kvp_test_cli_rejects("bench prefix --workload system:n=5", lists, sizeof lists / sizeof lists[0]);

    cr_assert_eq(run("--workload system:n=40 --cache hash --evict lfu --capacity 100 --json", out, sizeof out, err,
                     sizeof err),
                 0, "%s", err);
    cJSON *j;
    cr_assert_eq(kvp_json_parse(out, strlen(out), "stdout", &j), KVP_OK, "%s", out);
    cJSON *row = cJSON_GetArrayItem(j, 0);
    const char *keys[] = {"requests", "prompt_tokens", "hit_tokens", "hit_rate", "evicted_blocks", "peak_cached_blocks", "wall_s",
                          "host_capacity", "host_hit_tokens", "host_hit_rate", "total_hit_rate", "host_stored_blocks"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(row, keys[i])), "--json lacks %s", keys[i]);
    cr_assert_eq(cJSON_GetObjectItem(row, "requests")->valuedouble, 40);
    cr_assert_str_eq(cJSON_GetObjectItem(row, "cache")->valuestring, "hash");
    cJSON_Delete(j);

    char path[] = "/tmp/kvp_bp_trace_XXXXXX";
    int fd = mkstemp(path);
    const char *text = "{\"timestamp\": 0, \"input_length\": 700, \"output_length\": 1, \"hash_ids\": [1, 2]}\n"
                       "{\"timestamp\": 1, \"input_length\": 700, \"output_length\": 1, \"hash_ids\": [1]}\n"
                       "{\"timestamp\": 2, \"input_length\": 700, \"output_length\": 1, \"hash_ids\": [1, 3]}\n";
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    char args[256];
    snprintf(args, sizeof args, "--trace mooncake:%s --block-size 512 --format csv", path);
    cr_assert_eq(run(args, out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, path) && strstr(err, "line 2"), "%s", err);
    snprintf(args, sizeof args, "--trace mooncake:%s --block-size 512 --json --skip-bad", path);
    cr_assert_eq(run(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_json_parse(out, strlen(out), "stdout", &j), KVP_OK, "%s", out);
    row = cJSON_GetArrayItem(j, 0);
    cr_assert_eq(cJSON_GetObjectItem(row, "requests")->valuedouble, 2, "the bad line is skipped");
    cr_assert_eq(cJSON_GetObjectItem(row, "hit_tokens")->valuedouble, 512, "the 3rd line hits block 1");
    cJSON_Delete(j);
    /* every line skipped: an error, not a row of zeros */
    const char *bad = "{\"timestamp\": 1, \"input_length\": 700, \"output_length\": 1, \"hash_ids\": [1]}\n";
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(bad, f);
    fclose(f);
    cr_assert_eq(run(args, out, sizeof out, err, sizeof err), 2, "%s", out);
    cr_assert(strstr(err, "no requests (every line skipped)"), "%s", err);
    unlink(path);
}

Test(bench_prefix, sweep_writes_csv)
{
    static char out[1 << 16], err[4096];
    char dir[] = "/tmp/kvp_bp_sweep_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char args[512];
    snprintf(args, sizeof args, "--workload chat:conversations=10,turns=3 --evict lru,belady --capacity 0,50 --out %s --name t --no-plot --format csv", dir);
    cr_assert_eq(run(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    char csv[600];
    snprintf(csv, sizeof csv, "%s/t.csv", dir);
    FILE *f = fopen(csv, "r");
    cr_assert_not_null(f, "the sweep writes %s", csv);
    int lines = 0;
    char buf[2048];
    while (fgets(buf, sizeof buf, f)) lines++;
    fclose(f);
    cr_assert_eq(lines, 1 + 4, "header + 2 policies x 2 capacities");
    /* write policies: one row without a tier, one per policy with it, each its own series */
    snprintf(args, sizeof args, "--workload chat:conversations=10,turns=3 --capacity 50 --host-capacity 0,40 "
                                "--host-write-policy write_through,write_back,write_through_selective --out %s --name t --no-plot "
                                "--format csv", dir);
    cr_assert_eq(run(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    f = fopen(csv, "r");
    cr_assert_not_null(f);
    lines = 0;
    int through = 0, back = 0, selective = 0;
    while (fgets(buf, sizeof buf, f)) {
        lines++;
        through += strstr(buf, "/host40/write_through,") != NULL;
        back += strstr(buf, "/host40/write_back,") != NULL;
        selective += strstr(buf, "/host40/write_through_selective,") != NULL;
    }
    fclose(f);
    cr_assert_eq(lines, 1 + 4, "header + no tier + 3 write policies");
    cr_assert(through == 1 && back == 1 && selective == 1, "series names the policy: %d %d %d", through, back,
              selective);
    unlink(csv);
    rmdir(dir);
}

/* A chat workload's replay caches each turn's answer too, as the engine does: unbounded, the hit tokens
 * equal a brute-force longest prefix over the earlier turns' prompt + answer (but its last token), in
 * whole blocks, never covering a prompt's last token; and belady, which must know that an answer is only
 * ever matched by the later turns, stays >= LRU at bounded capacities. */
Test(bench_prefix, chat_answers_are_cached_and_found_by_the_next_turn)
{
    kvp_workload *w = NULL;
    cr_assert_eq(kvp_workload_generate("chat:conversations=6,turns=4,system=40,user=16,assistant=32", &w), KVP_OK);
    const int32_t bs = 4;
    const int64_t want = kvp_test_bruteforce_hits(w, bs);
    for (int k = 0; k < 2; k++) {
        kvp_prefix_replay_result r = replay(w, k ? KVP_PC_HASH : KVP_PC_RADIX, KVP_EVICT_LRU, bs, 0);
        cr_assert_eq(r.hit_tokens, want, "cache %d: %lld hit tokens, brute force %lld", k, (long long)r.hit_tokens,
                     (long long)want);
    }
    for (int64_t cap = 16; cap <= 256; cap *= 2) {
        kvp_prefix_replay_result lru = replay(w, KVP_PC_RADIX, KVP_EVICT_LRU, bs, cap);
        kvp_prefix_replay_result opt = replay(w, KVP_PC_RADIX, KVP_EVICT_BELADY, bs, cap);
        cr_assert_geq(opt.hit_tokens, lru.hit_tokens, "capacity %lld", (long long)cap);
    }
    kvp_workload_destroy(w);
}

/* ---- the one-pass curve, the miss classes, KV events, regret ----------------------------------------------- */

#include "prefix_cache/kv_events_testutil.h"

static const char *const k_workloads[] = {"system:n=150,prefix=512,suffix=128,share=0.7", "chat:conversations=20,turns=5",
                                          "fewshot:n=150,tasks=6,examples=4,example=96",
                                          "branch:n=150,depth=3,fanout=3,segment=64",
                                          "mooncake:../shared/data/traces/mooncake/arxiv_trace_first20.jsonl", "mooncake:" SYNTH};
#define NWORK ((int)(sizeof k_workloads / sizeof k_workloads[0]))
static int32_t work_bs(int i) { return i == 5 ? 512 : i == 4 ? 64 : 16; }

/* The curve equals an lru replay of radix and of hash at every capacity tried: 12 per workload, from 1 block
 * (below the largest request, which then does not fit) to past the unbounded peak. */
Test(bench_prefix, the_one_pass_curve_equals_lru_replays_at_every_capacity)
{
    for (int wi = 0; wi < NWORK; wi++) {
        kvp_workload *w;
        cr_assert_eq(kvp_workload_load(k_workloads[wi], 0, &w), KVP_OK, "%s", kvp_error_detail());
        const int32_t bs = work_bs(wi);
        kvp_lru_curve *c;
        cr_assert_eq(kvp_prefix_curve(w, bs, &c), KVP_OK, "%s", kvp_error_detail());
        cr_assert(kvp_lruc_exact(c), "%s: its pins repeat nothing", k_workloads[wi]);
        kvp_prefix_replay_result u = replay(w, KVP_PC_RADIX, KVP_EVICT_LRU, bs, 0);
        cr_assert_eq(kvp_lruc_hit_tokens(c, 0), u.hit_tokens, "%s unbounded", k_workloads[wi]);
        cr_assert_eq(kvp_lruc_lookup_tokens(c), u.prompt_tokens);
        const int64_t peak = u.peak_cached_blocks, big = kvp_lruc_max_access_blocks(c);
        int64_t caps[12] = {1, 2, big / 2 > 0 ? big / 2 : 3, big, big + 1};
        for (int i = 5; i < 12; i++) caps[i] = 1 + (int64_t)((double)peak * (i - 4) / 7.0 * ((i % 2) ? 0.9 : 1.05));
        int short_seen = 0;
        for (int i = 0; i < 12; i++)
            for (int k = KVP_PC_RADIX; k <= KVP_PC_HASH; k++) {
                if (wi == 5 && k == KVP_PC_HASH && i % 4) continue; /* the large trace: hash at 3 of them */
                kvp_prefix_replay_result r = replay(w, (kvp_pc_kind)k, KVP_EVICT_LRU, bs, caps[i]);
                short_seen |= r.short_requests > 0;
                cr_assert_eq(kvp_lruc_hit_tokens(c, caps[i]), r.hit_tokens, "%s %s capacity %lld: curve %lld, replay %lld",
                             k_workloads[wi], kvp_pc_kind_name((kvp_pc_kind)k), (long long)caps[i],
                             (long long)kvp_lruc_hit_tokens(c, caps[i]), (long long)r.hit_tokens);
            }
        cr_assert(short_seen, "%s: the smallest capacities must not fit the largest request", k_workloads[wi]);
        kvp_lruc_destroy(c);
        kvp_workload_destroy(w);
    }
}

/* The longest prefix of request i's prompt that an earlier access (pins included) computed: its prompt and its
 * known answer but the last token, as the replay caches them. Brute force, sharing nothing with the ledger. */
static int32_t seen_before(const kvp_workload *w, int64_t i)
{
    const kvp_request *r = &w->reqs[i];
    int32_t best = 0;
    for (int64_t j = -w->n_pins; j < i; j++) {
        const kvp_request *q = j < 0 ? &w->pins[j + w->n_pins] : &w->reqs[j];
        const int32_t nk = q->prompt_len + (q->output_tokens && q->output_len > 1 ? q->output_len - 1 : 0);
        int32_t l = 0;
        while (l < r->prompt_len && l < nk && r->tokens[l] == (l < q->prompt_len ? q->tokens[l] : q->output_tokens[l - q->prompt_len]))
            l++;
        if (l > best) best = l;
    }
    return best;
}

static int64_t sum_classes(const kvp_prefix_replay_result *r)
{
    int64_t s = r->hit_tokens + r->host_hit_tokens;
    for (int c = 0; c < KVP_MISS_CLASSES; c++) s += r->miss.miss_tokens[c];
    return s;
}

/* Every missed token in exactly one class, on every workload, cache, several policies, capacities and host tiers:
 * the sums hold; cold and partial depend only on what was computed (equal everywhere, and cold equals the brute
 * force); an unbounded cache has no evicted or host misses; and what a bounded cache lost to evictions is what
 * the unbounded one hit. */
Test(bench_prefix, every_missed_token_is_in_exactly_one_class_on_every_workload)
{
    const kvp_evict_policy pols[] = {KVP_EVICT_LRU, KVP_EVICT_ARC, KVP_EVICT_COST, KVP_EVICT_BELADY};
    for (int wi = 0; wi < NWORK; wi++) {
        kvp_workload *w;
        cr_assert_eq(kvp_workload_load(k_workloads[wi], 0, &w), KVP_OK, "%s", kvp_error_detail());
        const int32_t bs = work_bs(wi);
        const kvp_prefix_replay_result u = replay(w, KVP_PC_RADIX, KVP_EVICT_LRU, bs, 0);
        const int64_t *um = u.miss.miss_tokens;
        cr_assert_eq(um[KVP_MISS_EVICTED] + um[KVP_MISS_HOST] + um[KVP_MISS_PREEMPTED], 0, "%s", k_workloads[wi]);
        cr_assert_eq(sum_classes(&u), u.prompt_tokens);
        cr_assert_gt(um[KVP_MISS_COLD], 0);
        if (wi < 5) { /* brute force on the small workloads */
            int64_t cold = 0;
            for (int64_t i = 0; i < w->n; i++) cold += w->reqs[i].prompt_len - seen_before(w, i);
            cr_assert_eq(um[KVP_MISS_COLD], cold, "%s: cold %lld, brute force %lld", k_workloads[wi],
                         (long long)um[KVP_MISS_COLD], (long long)cold);
        }
        const int64_t caps[2] = {u.peak_cached_blocks / 8 + 1, u.peak_cached_blocks / 3 + 1};
        for (int k = KVP_PC_RADIX; k <= KVP_PC_HASH; k++)
            for (size_t p = 0; p < sizeof pols / sizeof pols[0]; p++)
                for (int ci = 0; ci < 2; ci++)
                    for (int host = 0; host < 3; host++) {
                        if (wi == 5 && (p % 2 || host == 2 || (p > 0 && k == KVP_PC_HASH) || (host && ci == 0)))
                            continue; /* the large trace: fewer runs */
                        kvp_prefix_replay_cfg cfg = {(kvp_pc_kind)k, pols[p], bs, caps[ci], host ? caps[1] : 0,
                                                     host == 2 ? KVP_HC_WRITE_BACK : KVP_HC_WRITE_THROUGH};
                        kvp_prefix_replay_result r;
                        cr_assert_eq(kvp_prefix_replay(w, &cfg, &r), KVP_OK, "%s", kvp_error_detail());
                        const int64_t *m = r.miss.miss_tokens;
                        const char *what = k_workloads[wi];
                        cr_assert_eq(sum_classes(&r), r.prompt_tokens, "%s %s/%s cap %lld host %d: classes + hits != prompt",
                                     what, kvp_pc_kind_name(cfg.kind), kvp_evict_policy_name(cfg.policy),
                                     (long long)cfg.capacity, host);
                        cr_assert_eq(r.miss.hit_tokens, r.hit_tokens);
                        cr_assert_eq(r.miss.host_hit_tokens, r.host_hit_tokens);
                        cr_assert_eq(r.miss.prompt_tokens, r.prompt_tokens);
                        cr_assert_eq(m[KVP_MISS_PREEMPTED], 0, "a replay preempts nothing");
                        cr_assert_eq(m[KVP_MISS_COLD], um[KVP_MISS_COLD], "%s: cold depends on the capacity", what);
                        cr_assert_eq(m[KVP_MISS_PARTIAL], um[KVP_MISS_PARTIAL], "%s: partial depends on the capacity", what);
                        cr_assert_eq(r.hit_tokens + r.host_hit_tokens + m[KVP_MISS_EVICTED] + m[KVP_MISS_HOST] + m[KVP_MISS_LAST_TOKEN],
                                     u.hit_tokens + um[KVP_MISS_LAST_TOKEN], "%s: the lost hits are the evicted ones", what);
                        if (host == 0) cr_assert_eq(m[KVP_MISS_HOST], 0);
                        cr_assert_gt(r.evicted_blocks, 0, "%s: a bounded cache evicts", what);
                        cr_assert_eq(r.miss.lifetime.n, r.evicted_blocks, "one lifetime per evicted block");
                    }
        kvp_workload_destroy(w);
    }
}

/* --kv-events: the file rebuilds the cache the replay ends with (inserted - evicted blocks, by its row). */
Test(bench_prefix, kv_events_rebuild_the_replays_cache)
{
    static char out[1 << 16], err[4096];
    for (int k = 0; k < 2; k++) {
        char path[] = "/tmp/kvp_bp_kve_XXXXXX";
        int fd = mkstemp(path);
        cr_assert_geq(fd, 0);
        close(fd);
        char args[512];
        snprintf(args, sizeof args, "--workload chat:conversations=12,turns=4 --cache %s --evict arc --capacity 150 "
                                    "--kv-events %s --json", k ? "hash" : "radix", path);
        cr_assert_eq(run(args, out, sizeof out, err, sizeof err), 0, "%s", err);
        cJSON *j;
        cr_assert_eq(kvp_json_parse(out, strlen(out), "stdout", &j), KVP_OK, "%s", out);
        const cJSON *row = cJSON_GetArrayItem(j, 0);
        const int64_t held = (int64_t)kvp_test_num(row, "inserted_blocks") - (int64_t)kvp_test_num(row, "evicted_blocks");
        FILE *f = fopen(path, "r");
        cr_assert_not_null(f);
        kv_index ix = {.bs = 16};
        int lines = kv_ix_apply_file(&ix, f);
        fclose(f);
        cr_assert_gt(lines, 40);
        cr_assert_gt(ix.removed, 0);
        cr_assert_eq(ix.n, held, "the events rebuild %lld blocks, the replay ends with %lld", (long long)ix.n, (long long)held);
        free(ix.v);
        cJSON_Delete(j);
        unlink(path);
    }
    cr_assert_eq(run("--workload chat:conversations=4 --capacity 50,60 --kv-events /tmp/x.jsonl", out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "--kv-events follows one cache"), "%s", err);
    cr_assert_eq(run("--workload chat:conversations=4 --kv-events /nonexistent/dir/e.jsonl", out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "/nonexistent/dir/e.jsonl"), "%s", err);
}

/* The new fields and options on the command line: the miss classes and regret columns, --curve rows, --health. */
Test(bench_prefix, cli_curve_health_regret_and_miss_fields)
{
    static char out[1 << 20], err[4096];
    char health[] = "/tmp/kvp_bp_health_XXXXXX";
    int fd = mkstemp(health);
    close(fd);
    char args[512];
    snprintf(args, sizeof args, "--workload fewshot:n=120,tasks=8 --evict lru,slru,belady --capacity 200,0 --cache hash "
                                "--sweep --out /tmp --name kvp_bp_cli --no-plot --health %s --json", health);
    cr_assert_eq(run(args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cJSON *j;
    cr_assert_eq(kvp_json_parse(out, strlen(out), "stdout", &j), KVP_OK, "%s", out);
    cr_assert_eq(cJSON_GetArraySize(j), 6);
    double lru40 = -1, bel40 = -1; /* at 200 blocks */
    for (int i = 0; i < 6; i++) {
        const cJSON *row = cJSON_GetArrayItem(j, i);
        double sum = kvp_test_num(row, "hit_tokens") + kvp_test_num(row, "host_hit_tokens");
        for (int c = 0; c < KVP_MISS_CLASSES; c++) {
            char key[48];
            snprintf(key, sizeof key, "miss_%s_tokens", kvp_miss_class_name((kvp_miss_class)c));
            sum += kvp_test_num(row, key);
        }
        cr_assert_eq(sum, kvp_test_num(row, "prompt_tokens"), "row %d: classes + hits != prompt tokens", i);
        const char *ev = cJSON_GetObjectItem(row, "evict")->valuestring;
        const double cap = kvp_test_num(row, "capacity"), rb = kvp_test_num(row, "regret_belady");
        cr_assert_geq(rb, -1e-12, "row %d: an online policy above belady", i);
        cr_assert_float_eq(kvp_test_num(row, "regret_unbounded"), kvp_test_num(row, "unbounded_hit_rate") - kvp_test_num(row, "total_hit_rate"), 1e-12);
        if (strcmp(ev, "belady") == 0 || cap == 0) cr_assert_float_eq(rb, 0, 1e-12);
        if (cap == 200 && strcmp(ev, "lru") == 0) lru40 = kvp_test_num(row, "total_hit_rate");
        if (cap == 200 && strcmp(ev, "belady") == 0) bel40 = kvp_test_num(row, "total_hit_rate");
        cr_assert(cJSON_IsNumber(cJSON_GetObjectItem(row, "lifetime_p50")) && cJSON_IsNumber(cJSON_GetObjectItem(row, "reuse_gap_p50")));
    }
    cr_assert(lru40 >= 0 && bel40 > lru40, "belady beats lru at 200 blocks: %g vs %g", bel40, lru40);
    cJSON_Delete(j);
    FILE *f = fopen(health, "r");
    cr_assert_not_null(f);
    char *text = kvp_test_read_all(f);
    fclose(f);
    cr_assert_eq(kvp_json_parse(text, strlen(text), health, &j), KVP_OK, "%s", text);
    cr_assert_eq(cJSON_GetArraySize(j), 6);
    const cJSON *h = cJSON_GetObjectItem(cJSON_GetArrayItem(j, 0), "kv_block_lifetime");
    cr_assert(h && cJSON_GetArraySize(cJSON_GetObjectItem(h, "counts")) == KVP_HIST_BUCKETS && kvp_test_num(h, "count") > 0);
    cr_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(j, 0), "unit")->valuestring, "requests");
    cJSON_Delete(j);
    free(text);
    unlink(health);
    unlink("/tmp/kvp_bp_cli.csv");
    /* --curve: rows of capacity and hit_rate; --curve-points 0: every step, non-decreasing, then unbounded */
    cr_assert_eq(run("--workload chat:conversations=10,turns=3 --curve --curve-points 0 --json", out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_json_parse(out, strlen(out), "stdout", &j), KVP_OK, "%s", out);
    const int n = cJSON_GetArraySize(j);
    cr_assert_gt(n, 10);
    double prev = -1;
    for (int i = 0; i < n; i++) {
        const cJSON *row = cJSON_GetArrayItem(j, i);
        const double hr = kvp_test_num(row, "hit_rate"), cap = kvp_test_num(row, "capacity");
        cr_assert(i == n - 1 ? cap == 0 : cap >= 1, "row %d capacity %g", i, cap);
        cr_assert_gt(hr, prev - (i == n - 1 ? 1 : 0), "a step of the curve must rise");
        prev = hr;
        cr_assert_eq(kvp_test_num(row, "exact"), 1);
    }
    kvp_workload *w;
    cr_assert_eq(kvp_workload_generate("chat:conversations=10,turns=3", &w), KVP_OK);
    kvp_prefix_replay_result u = replay(w, KVP_PC_RADIX, KVP_EVICT_LRU, 16, 0);
    cr_assert_float_eq(kvp_test_num(cJSON_GetArrayItem(j, n - 1), "hit_rate"), u.hit_rate, 1e-12);
    kvp_workload_destroy(w);
    cJSON_Delete(j);
    cr_assert_eq(run("--workload chat --curve-points -3", out, sizeof out, err, sizeof err), 2);
}
