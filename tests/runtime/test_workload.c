/* Tests of runtime/workload: the Mooncake reader (20-line arXiv sample, malformed lines), the synthetic
 * generators (determinism, the sharing structure each one promises), bad specs, allocation failures, random
 * edits of the Mooncake and Azure traces. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "model_testutil.h"
#include "runtime/workload/workload.h"
#include "runtime/workload/workload_synth.h"

#define ARXIV "../shared/data/traces/mooncake/arxiv_trace_first20.jsonl"

typedef struct {
    long long ts, in, out, ids[512];
    int nids;
} raw_line;

/* An independent, naive parse of a Mooncake line (fixed key order as in the files). */
static void raw_parse(const char *line, raw_line *r)
{
    const char *p = strstr(line, "\"timestamp\":");
    cr_assert(p);
    r->ts = strtoll(p + 12, NULL, 10);
    p = strstr(line, "\"input_length\":");
    r->in = strtoll(p + 15, NULL, 10);
    p = strstr(line, "\"output_length\":");
    r->out = strtoll(p + 16, NULL, 10);
    p = strchr(strstr(line, "\"hash_ids\":"), '[') + 1;
    r->nids = 0;
    while (*p && *p != ']') {
        char *end;
        r->ids[r->nids++] = strtoll(p, &end, 10);
        p = end;
        while (*p == ',' || *p == ' ') p++;
    }
}

Test(workload, mooncake_arxiv_sample)
{
    FILE *f = fopen(ARXIV, "r");
    cr_assert_not_null(f, "test data %s is missing (run from the project root)", ARXIV);
    static raw_line raw[20];
    char line[8192];
    int nl = 0;
    while (fgets(line, sizeof line, f)) raw_parse(line, &raw[nl++]);
    fclose(f);
    cr_assert_eq(nl, 20);

    kvp_workload *w;
    cr_assert_eq(kvp_workload_read_mooncake(ARXIV, NULL, &w), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(w->n, 20);
    cr_assert_eq(w->skipped_lines, 0);
    cr_assert_str_eq(w->name, "mooncake:arxiv_trace_first20.jsonl");
    long long blocks = 0, total = 0;
    for (int i = 0; i < 20; i++) {
        const kvp_request *r = &w->reqs[i];
        cr_assert_eq(r->id, i);
        cr_assert_eq(r->prompt_len, raw[i].in);
        cr_assert_eq(r->output_len, raw[i].out);
        cr_assert_float_eq(r->arrival_s, raw[i].ts / 1000.0, 1e-9);
        cr_assert_eq(raw[i].nids, (raw[i].in + 511) / 512);
        for (int32_t t = 0; t < r->prompt_len; t++)
            cr_assert_eq(r->tokens[t], raw[i].ids[t / 512] * 512 + t % 512, "request %d token %d", i, t);
        blocks += raw[i].nids;
        total += raw[i].in;
    }
    cr_assert_eq(w->total_prompt_tokens, total);
    /* The traces README: 514 blocks, 449 unique ids. */
    cr_assert_eq(blocks, 514);
    int unique = 0;
    for (int i = 0; i < 20; i++)
        for (int b = 0; b < raw[i].nids; b++) {
            int seen = 0;
            for (int j = 0; j <= i && !seen; j++)
                for (int c = 0; c < (j == i ? b : raw[j].nids); c++)
                    if (raw[j].ids[c] == raw[i].ids[b]) seen = 1;
            unique += !seen;
        }
    cr_assert_eq(unique, 449);
    /* Shared token prefixes follow shared leading hash ids. */
    for (int i = 0; i < 20; i++)
        for (int j = 0; j < i; j++) {
            int sb = 0;
            while (sb < raw[i].nids && sb < raw[j].nids && raw[i].ids[sb] == raw[j].ids[sb]) sb++;
            long long lim = raw[i].in < raw[j].in ? raw[i].in : raw[j].in, want = (long long)sb * 512 < lim ? sb * 512 : lim;
            long long k = 0;
            while (k < lim && w->reqs[i].tokens[k] == w->reqs[j].tokens[k]) k++;
            cr_assert_eq(k, want, "requests %d and %d share %lld tokens, expected %lld", i, j, k, want);
        }
    kvp_workload_destroy(w);
}

static char *write_tmp(const char *text)
{
    static char path[64];
    strcpy(path, "/tmp/kvp_wl_XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

Test(workload, mooncake_bad_lines)
{
    const char *good = "{\"timestamp\": 5, \"input_length\": 600, \"output_length\": 3, \"hash_ids\": [1, 2]}\n";
    const char *bad[] = {
        "{\"timestamp\": 5, \"input_length\": 600,\n",                                            /* bad JSON */
        "{\"timestamp\": 5, \"input_length\": 600, \"output_length\": 3, \"hash_ids\": [1]}\n",    /* count */
        "{\"timestamp\": 5, \"output_length\": 3, \"hash_ids\": [1]}\n",                           /* missing */
        "{\"timestamp\": 5, \"input_length\": 600, \"output_length\": 3, \"hash_ids\": [1, -2]}\n", /* negative id */
        "{\"timestamp\": 5, \"input_length\": 0, \"output_length\": 3, \"hash_ids\": []}\n",       /* empty */
        "{\"timestamp\": 5, \"input_length\": 600, \"output_length\": \"x\", \"hash_ids\": [1, 2]}\n",
        "[1, 2, 3]\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[1024];
        snprintf(text, sizeof text, "%s\n%s%s", good, bad[i], good); /* blank line 2, bad line 3 */
        char *path = write_tmp(text);
        kvp_workload *w = (kvp_workload *)0x1;
        cr_assert_eq(kvp_workload_read_mooncake(path, NULL, &w), KVP_EPARSE, "case %zu", i);
        cr_assert_eq(w, (kvp_workload *)0x1);
        cr_assert(strstr(kvp_error_detail(), path) && strstr(kvp_error_detail(), "line 3"), "case %zu: %s", i,
                  kvp_error_detail());
        kvp_mooncake_opts o = {.skip_bad = 1};
        cr_assert_eq(kvp_workload_read_mooncake(path, &o, &w), KVP_OK, "%s", kvp_error_detail());
        cr_assert_eq(w->n, 2);
        cr_assert_eq(w->skipped_lines, 1);
        cr_assert_eq(w->reqs[1].prompt_len, 600);
        kvp_workload_destroy(w);
        unlink(path);
    }
    kvp_workload *w;
    cr_assert_eq(kvp_workload_read_mooncake("/nonexistent/trace.jsonl", NULL, &w), KVP_EIO);
    cr_assert(strstr(kvp_error_detail(), "/nonexistent/trace.jsonl"));
}

Test(workload, mooncake_tokens_distinct)
{
    cr_assert_eq(kvp_mooncake_token(0, 0), 0);
    cr_assert_eq(kvp_mooncake_token(3, 5), 3 * 512 + 5);
    int32_t base = (INT32_MAX / 512) * 512;
    for (int64_t h = 4194303; h < 4194310; h++)
        for (int32_t j = 0; j < 512; j += 37) {
            int32_t t = kvp_mooncake_token(h, j);
            cr_assert_geq(t, 0);
            if (h >= INT32_MAX / 512) cr_assert_geq(t, base, "mixed tokens lie above the exact range");
            cr_assert_eq(t, kvp_mooncake_token(h, j), "deterministic");
        }
    cr_assert_neq(kvp_mooncake_token(5000000, 0), kvp_mooncake_token(5000001, 0));
}

static int is_prefix(const kvp_request *a, const kvp_request *b) /* a is a prefix of b */
{
    return a->prompt_len <= b->prompt_len && memcmp(a->tokens, b->tokens, (size_t)a->prompt_len * sizeof(int32_t)) == 0;
}

static int same_workload(const kvp_workload *a, const kvp_workload *b)
{
    if (a->n != b->n) return 0;
    for (int64_t i = 0; i < a->n; i++)
        if (a->reqs[i].prompt_len != b->reqs[i].prompt_len || a->reqs[i].output_len != b->reqs[i].output_len ||
            a->reqs[i].arrival_s != b->reqs[i].arrival_s || !is_prefix(&a->reqs[i], &b->reqs[i]))
            return 0;
    return 1;
}

Test(workload, generators_are_seeded)
{
    const char *specs[][2] = {{"system", "system:seed=2"}, {"chat", "chat:seed=2"}, {"fewshot", "fewshot:seed=2"},
                              {"branch", "branch:seed=2"}};
    for (int i = 0; i < 4; i++) {
        kvp_workload *a, *b, *c;
        cr_assert_eq(kvp_workload_generate(specs[i][0], &a), KVP_OK, "%s", kvp_error_detail());
        cr_assert_eq(kvp_workload_generate(specs[i][0], &b), KVP_OK);
        cr_assert_eq(kvp_workload_generate(specs[i][1], &c), KVP_OK);
        cr_assert(same_workload(a, b), "%s is deterministic", specs[i][0]);
        cr_assert(!same_workload(a, c), "%s depends on the seed", specs[i][0]);
        cr_assert_gt(a->n, 0);
        for (int64_t k = 1; k < a->n; k++) cr_assert_geq(a->reqs[k].arrival_s, a->reqs[k - 1].arrival_s);
        kvp_workload_destroy(a);
        kvp_workload_destroy(b);
        kvp_workload_destroy(c);
    }
}

Test(workload, system_prompt)
{
    kvp_workload *w;
    cr_assert_eq(kvp_workload_generate("system:n=50,prefix=300,suffix=40,share=1", &w), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(w->n, 50);
    cr_assert_eq(w->n_pins, 1);
    cr_assert_eq(w->pins[0].prompt_len, 300);
    cr_assert_eq(w->pins[0].priority, 1);
    for (int64_t i = 0; i < w->n; i++) {
        cr_assert(is_prefix(&w->pins[0], &w->reqs[i]), "request %lld starts with the system prompt", (long long)i);
        cr_assert_geq(w->reqs[i].prompt_len, 300 + 20);
        cr_assert_leq(w->reqs[i].prompt_len, 300 + 60);
        if (i) cr_assert_neq(memcmp(w->reqs[i].tokens + 300, w->reqs[0].tokens + 300, 20 * sizeof(int32_t)), 0);
    }
    kvp_workload_destroy(w);
    cr_assert_eq(kvp_workload_generate("system:n=400,prefix=100,share=0.5", &w), KVP_OK);
    int64_t shared = 0;
    for (int64_t i = 0; i < w->n; i++) shared += is_prefix(&w->pins[0], &w->reqs[i]);
    cr_assert(shared > 150 && shared < 250, "about half share the prompt: %lld", (long long)shared);
    kvp_workload_destroy(w);
}

Test(workload, chat_turns_extend_history)
{
    kvp_workload *w;
    cr_assert_eq(kvp_workload_generate("chat:conversations=7,turns=5,system=64", &w), KVP_OK, "%s", kvp_error_detail());
    cr_assert_eq(w->n, 35);
    int64_t extends = 0;
    for (int64_t i = 0; i < w->n; i++) {
        cr_assert_eq(memcmp(w->reqs[i].tokens, w->reqs[0].tokens, 64 * sizeof(int32_t)), 0, "shared system prompt");
        for (int64_t j = i - 1; j >= 0; j--)
            if (is_prefix(&w->reqs[j], &w->reqs[i]) && w->reqs[j].prompt_len < w->reqs[i].prompt_len) {
                /* the earlier turn's answer (output_len tokens) and a new user message follow it */
                cr_assert_gt(w->reqs[i].prompt_len, w->reqs[j].prompt_len + w->reqs[j].output_len);
                /* and the earlier turn carries that answer as its output tokens */
                cr_assert_not_null(w->reqs[j].output_tokens, "turn %lld has no answer", (long long)j);
                cr_assert_eq(memcmp(w->reqs[j].output_tokens, w->reqs[i].tokens + w->reqs[j].prompt_len,
                                    (size_t)w->reqs[j].output_len * sizeof(int32_t)), 0);
                extends++;
                break;
            }
    }
    cr_assert_eq(extends, 7 * 4, "every turn after the first extends an earlier prompt");
    int64_t unknown = 0;
    for (int64_t i = 0; i < w->n; i++) unknown += w->reqs[i].output_tokens == NULL;
    cr_assert_eq(unknown, 7, "only each conversation's last turn has no known answer");
    /* every later turn waits for the previous turn's answer: its prompt continues that prompt and answer */
    int64_t waits = 0;
    for (int64_t i = 0; i < w->n; i++) {
        const kvp_request *r = &w->reqs[i];
        if (r->after == 0) continue;
        cr_assert(r->after >= 1 && r->after <= i, "request %lld: after %lld", (long long)i, (long long)r->after);
        const kvp_request *q = &w->reqs[r->after - 1];
        cr_assert(is_prefix(q, r));
        cr_assert_eq(memcmp(r->tokens + q->prompt_len, q->output_tokens, (size_t)q->output_len * sizeof(int32_t)), 0);
        cr_assert_eq(r->think_s, 0.0);
        waits++;
    }
    cr_assert_eq(waits, 7 * 4);
    /* a cut copies the answers (no shared ownership: the sanitizer build catches a double free) */
    kvp_workload *c = NULL;
    cr_assert_eq(kvp_workload_cut(w, 20, 0, &c), KVP_OK);
    for (int64_t i = 0; i < c->n; i++) {
        cr_assert_eq(c->reqs[i].output_tokens == NULL, w->reqs[i].output_tokens == NULL);
        if (c->reqs[i].output_tokens == NULL) continue;
        cr_assert_neq(c->reqs[i].output_tokens, w->reqs[i].output_tokens);
        cr_assert_eq(memcmp(c->reqs[i].output_tokens, w->reqs[i].output_tokens,
                            (size_t)w->reqs[i].output_len * sizeof(int32_t)), 0);
    }
    /* a cut renumbers `after`; a request whose awaited one was dropped waits for none */
    kvp_workload *d = NULL, *e = NULL;
    cr_assert_eq(kvp_workload_create("deps", &d), KVP_OK);
    const int32_t tok[2] = {1, 2};
    const double arr[] = {9.0, 1.0, 2.0, 3.0}; /* request 0 arrives after the cut */
    const int64_t after[] = {0, 1, 0, 3};      /* 1 waits for 0 (dropped), 3 for 2 */
    for (int i = 0; i < 4; i++) {
        kvp_request r = {.id = i, .arrival_s = arr[i], .prompt_len = 2, .output_len = 1, .after = after[i]};
        cr_assert_eq(kvp_workload_add(d, &r, tok), KVP_OK);
    }
    cr_assert_eq(kvp_workload_cut(d, 0, 5.0, &e), KVP_OK);
    cr_assert_eq(e->n, 3);
    cr_assert_eq(e->reqs[0].after, 0, "its awaited request was cut");
    cr_assert_eq(e->reqs[1].after, 0);
    cr_assert_eq(e->reqs[2].after, 2, "request 2 of the original is now request 1");
    kvp_workload_destroy(e);
    kvp_workload_destroy(d);
    cr_assert_eq(kvp_workload_set_output(c, c->n, c->reqs[0].tokens), KVP_EINVAL, "no such request");
    cr_assert_eq(kvp_workload_set_output(c, 0, NULL), KVP_EINVAL);
    kvp_workload_destroy(c);
    kvp_workload_destroy(w);
}

/* kvp_workload_fork: each request followed by n - 1 samples of it (same prompt copied, arrival, lengths,
 * priority; after = the request, after_prompt; no known answer), ids = indices, a chat turn's `after` moved to
 * the awaited turn's first sample, pins copied; a cut that drops a sample's request makes it a request. */
Test(workload, fork_makes_parallel_samples)
{
    kvp_workload *w = NULL, *f = NULL;
    cr_assert_eq(kvp_workload_generate("system:n=3,prefix=32,suffix=8", &w), KVP_OK);
    cr_assert_eq(kvp_workload_fork(w, 0, &f), KVP_EINVAL);
    cr_assert_eq(kvp_workload_fork(w, 4, &f), KVP_OK);
    cr_assert_eq(f->n, 12);
    cr_assert_eq(f->n_pins, w->n_pins);
    cr_assert_eq(f->total_prompt_tokens, 4 * w->total_prompt_tokens);
    for (int64_t i = 0; i < f->n; i++) {
        const kvp_request *q = &f->reqs[i], *r = &w->reqs[i / 4];
        cr_assert_eq(q->id, i);
        cr_assert(q->arrival_s == r->arrival_s && q->prompt_len == r->prompt_len && q->output_len == r->output_len);
        cr_assert_neq(q->tokens, r->tokens, "a copy: each workload owns its tokens");
        cr_assert_eq(memcmp(q->tokens, r->tokens, (size_t)r->prompt_len * sizeof(int32_t)), 0);
        cr_assert_eq(q->after_prompt, i % 4 != 0);
        cr_assert_eq(q->after, i % 4 ? i / 4 * 4 + 1 : 0);
    }
    kvp_workload_destroy(f);
    kvp_workload_destroy(w);

    cr_assert_eq(kvp_workload_generate("chat:conversations=2,turns=3", &w), KVP_OK);
    cr_assert_eq(kvp_workload_fork(w, 2, &f), KVP_OK);
    for (int64_t i = 0; i < w->n; i++) {
        const kvp_request *first = &f->reqs[2 * i], *second = &f->reqs[2 * i + 1];
        cr_assert_eq(first->after, w->reqs[i].after ? 2 * (w->reqs[i].after - 1) + 1 : 0, "turn %lld", (long long)i);
        cr_assert_eq(first->after_prompt, false);
        cr_assert_eq(first->output_tokens == NULL, w->reqs[i].output_tokens == NULL, "the answer stays with sample 0");
        cr_assert(second->after == 2 * i + 1 && second->after_prompt && second->output_tokens == NULL);
        cr_assert_eq(second->think_s, 0.0);
    }
    kvp_workload *c = NULL;
    cr_assert_eq(kvp_workload_cut(f, 0, 0, &c), KVP_OK);
    cr_assert(c->reqs[1].after_prompt && c->reqs[1].after == 1, "a whole copy keeps the samples");
    kvp_workload_destroy(c);
    f->reqs[0].arrival_s = 1e9; /* the cut below drops request 0, not its sample */
    cr_assert_eq(kvp_workload_cut(f, 0, 1e8, &c), KVP_OK);
    cr_assert(c->reqs[0].after == 0 && !c->reqs[0].after_prompt, "its request cut: a request of its own");
    kvp_workload_destroy(c);
    kvp_workload_destroy(f);
    kvp_workload_destroy(w);
}

Test(workload, fewshot_and_branch)
{
    kvp_workload *w;
    cr_assert_eq(kvp_workload_generate("fewshot:n=60,tasks=3,examples=4,example=50,question=20", &w), KVP_OK);
    int64_t distinct = 0;
    for (int64_t i = 0; i < w->n; i++) {
        int seen = 0;
        for (int64_t j = 0; j < i && !seen; j++)
            seen = memcmp(w->reqs[i].tokens, w->reqs[j].tokens, 100 * sizeof(int32_t)) == 0;
        distinct += !seen;
    }
    cr_assert_eq(distinct, 3, "one shared example block per task");
    kvp_workload_destroy(w);

    cr_assert_eq(kvp_workload_generate("branch:n=200,depth=3,fanout=2,segment=32,suffix=8", &w), KVP_OK);
    for (int d = 1; d <= 3; d++) {
        int64_t distinct_d = 0;
        for (int64_t i = 0; i < w->n; i++) {
            int seen = 0;
            for (int64_t j = 0; j < i && !seen; j++)
                seen = memcmp(w->reqs[i].tokens, w->reqs[j].tokens, (size_t)(32 * d) * sizeof(int32_t)) == 0;
            distinct_d += !seen;
        }
        cr_assert_eq(distinct_d, 1 << d, "depth %d has fanout^depth distinct prefixes", d);
    }
    kvp_workload_destroy(w);
}

Test(workload, bad_specs)
{
    kvp_workload *w = (kvp_workload *)0x1;
    const char *bad[] = {"nosuch", "system:n=0", "system:bogus=1", "system:n", "chat:turns=x", "system:share=2",
                         "fewshot:rate=0", "branch:depth=100", "chat:think=-1", "chat:think=x", "system:think=1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(kvp_workload_generate(bad[i], &w), KVP_EINVAL, "%s", bad[i]);
        cr_assert_gt(strlen(kvp_error_message()), 0);
    }
    cr_assert_eq(w, (kvp_workload *)0x1);
    cr_assert_eq(kvp_workload_load("mooncake:" ARXIV, 0, &w), KVP_OK);
    cr_assert_eq(w->n, 20);
    kvp_workload_destroy(w);
}

Test(workload, allocation_failures)
{
    for (int64_t n = 1;; n++) {
        kvp_workload *w = NULL;
        kvp_alloc_fail_at(n);
        kvp_status st = kvp_workload_generate("chat:conversations=3,turns=3", &w);
        int64_t made = kvp_alloc_count();
        kvp_alloc_fail_at(0);
        if (st != KVP_OK) {
            cr_assert_eq(st, KVP_ENOMEM, "%s", kvp_error_detail());
            cr_assert_null(w);
        }
        kvp_workload_destroy(w);
        if (made < n) break;
    }
    int64_t failures = 0;
    for (int64_t n = 1;; n++) {
        kvp_workload *w = NULL;
        kvp_alloc_fail_at(n);
        kvp_status st = kvp_workload_read_mooncake(ARXIV, NULL, &w);
        int64_t made = kvp_alloc_count();
        kvp_alloc_fail_at(0);
        if (st != KVP_OK) {
            cr_assert_eq(st, KVP_ENOMEM, "%s", kvp_error_detail());
            cr_assert_null(w);
            failures++;
        } else {
            cr_assert_eq(w->n, 20);
        }
        kvp_workload_destroy(w);
        if (made < n) break;
    }
    cr_assert_gt(failures, 20, "the reader allocates per request");
    kvp_workload *w;
    cr_assert_eq(kvp_workload_create("x", &w), KVP_OK);
    int32_t t[3] = {1, 2, 3};
    kvp_request r = {.id = 0, .prompt_len = 3};
    cr_assert_eq(kvp_workload_add(w, &r, t), KVP_OK);
    kvp_alloc_fail_at(1);
    cr_assert_eq(kvp_workload_add(w, &r, t), KVP_ENOMEM);
    kvp_alloc_fail_at(0);
    cr_assert_eq(w->n, 1);
    cr_assert_eq(w->total_prompt_tokens, 3);
    r.prompt_len = 0;
    cr_assert_eq(kvp_workload_add(w, &r, t), KVP_EINVAL);
    kvp_workload_destroy(w);
}

/* Seeded random edits of the Mooncake sample and of the first 100 rows of an Azure trace: each mutant
 * either reads (and can be cut and rescaled), or fails with an error naming the file. A Mooncake mutant
 * read with skip_bad keeps the lines that still parse. */
Test(workload, random_corruption_of_traces_reads_or_fails_cleanly)
{
    static const char *const src[] = {ARXIV, "../shared/data/traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv"};
    const char *name[] = {"mutant.jsonl", "mutant.csv"};
    uint64_t rng = 0x3c6ef372fe94f82bull;
    for (int k = 0; k < 2; k++) {
        size_t len;
        unsigned char *orig = tu_read_all(src[k], &len);
        if (k == 1) /* the header and 100 rows */
            for (size_t at = 0, rows = 0; at < len; at++)
                if (orig[at] == '\n' && ++rows == 101) len = at + 1;
        unsigned char *c = malloc(len);
        char path[300];
        snprintf(path, sizeof path, "%s/%s", tu_tmpdir(), name[k]);
        int read_ok = 0;
        const int trials = 1500;
        for (int i = 0; i < trials; i++) {
            tu_write_mutant(path, orig, c, len, 0, len, 0, &rng);
            for (int skip = 0; skip <= (k == 0); skip++) {
                kvp_workload *w = NULL;
                kvp_mooncake_opts o = {.skip_bad = skip};
                kvp_status st = k == 0 ? kvp_workload_read_mooncake(path, &o, &w) : kvp_workload_read_azure(path, 0, &w);
                if (st != KVP_OK) {
                    FZ_FAILED_CLEANLY(st, w, name[k], i);
                    continue;
                }
                read_ok += !skip;
                for (int64_t r = 0; r < w->n; r++) {
                    cr_assert(w->reqs[r].prompt_len >= 1 && w->reqs[r].prompt_len <= KVP_MAX_PROMPT_TOKENS,
                              "trial %d: request %lld has %lld prompt tokens", i, (long long)r,
                              (long long)w->reqs[r].prompt_len);
                    cr_assert(w->reqs[r].output_len >= 0 && isfinite(w->reqs[r].arrival_s), "trial %d", i);
                }
                kvp_workload *cut = NULL;
                cr_assert_eq(kvp_workload_cut(w, 10, 0, &cut), KVP_OK, "trial %d", i);
                cr_assert_eq(kvp_workload_set_rate(cut, 2.0), KVP_OK, "trial %d", i);
                kvp_workload_destroy(cut);
                kvp_workload_destroy(w);
            }
        }
        cr_assert(read_ok > 0 && read_ok < trials, "%s: %d of %d mutants read", name[k], read_ok, trials);
        free(c);
        free(orig);
    }
}
