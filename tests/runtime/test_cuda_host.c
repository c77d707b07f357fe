/* The cuda executor's host side (runtime/executor/cuda_executor.h) on the CPU, no device needed: --device
 * parsing, the memory split, CUDA-graph buckets, the step pack, and the command line's errors without a
 * device (a one-line message and a non-zero exit, never a crash). */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>
#include <sys/wait.h>

#include "cli_testutil.h"
#include "runtime/executor/cuda_executor.h"
#include "runtime/model/model_export.h"

Test(cuda_host, device_parse)
{
    int cuda = -1, idx = -1;
    cr_assert_eq(kvp_device_parse("cpu", &cuda, &idx), KVP_OK);
    cr_assert_eq(cuda, 0);
    cr_assert_eq(kvp_device_parse("cuda", &cuda, &idx), KVP_OK);
    cr_assert(cuda == 1 && idx == 0);
    cr_assert_eq(kvp_device_parse("cuda:3", &cuda, &idx), KVP_OK);
    cr_assert(cuda == 1 && idx == 3);
    const char *bad[] = {"cuda:", "cuda:x", "cuda:-1", "gpu", "", "CUDA", "cuda:1:2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cuda = 7;
        cr_assert_eq(kvp_device_parse(bad[i], &cuda, &idx), KVP_EINVAL, "'%s' was accepted", bad[i]);
        cr_assert_eq(cuda, 7, "a rejected device changed the output");
        cr_assert(strstr(kvp_error_message(), "use cpu, cuda or cuda:N"), "%s", kvp_error_message());
    }
}

/* An H200-sized device: 0.9 of it, less the weights of an 8B model in bf16 and a measured activation peak,
 * in blocks of 16 tokens of 32 layers x 8 KV heads x 128 dims x 2 bytes x (K, V). */
Test(cuda_host, memory_split_as_vllm)
{
    const int64_t total = 150754820096LL, weights = 16060522496LL, act = 2147483648LL;
    const int64_t block = 16LL * 32 * 8 * 128 * 2 * 2; /* 2 MiB */
    kvp_cuda_mem_split s;
    cr_assert_eq(kvp_cuda_split(total, total - 500000000, 0.9, weights, act, block, -1, &s), KVP_OK, "%s",
                 kvp_error_message());
    cr_assert_eq(s.budget, (int64_t)floor(total * 0.9));
    cr_assert_eq(s.kv, s.budget - weights - act);
    cr_assert_eq(s.num_blocks, s.kv / block);
    cr_assert_eq(s.kv_given, 0);
    cr_assert_leq(s.weights + s.activations + (int64_t)s.num_blocks * block, s.budget);
    /* --kv-cache-memory replaces the budget's rest */
    cr_assert_eq(kvp_cuda_split(total, total, 0.9, weights, act, block, 10LL << 30, &s), KVP_OK);
    cr_assert(s.kv_given && s.kv == 10LL << 30 && s.num_blocks == 5120);
    /* errors name the option */
    cr_assert_eq(kvp_cuda_split(total, total, 0.0, weights, act, block, -1, &s), KVP_EINVAL);
    cr_assert_eq(kvp_cuda_split(total, total, 1.5, weights, act, block, -1, &s), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "--gpu-memory-utilization"));
    cr_assert_eq(kvp_cuda_split(total, total / 2, 0.9, weights, act, block, -1, &s), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "another process"), "%s", kvp_error_message());
    cr_assert_eq(kvp_cuda_split(total, total, 0.12, weights, act, block, -1, &s), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "no room for a KV block"), "%s", kvp_error_message());
    cr_assert_eq(kvp_cuda_split(total, total, 0.9, weights, act, block, total, &s), KVP_EINVAL);
    cr_assert(strstr(kvp_error_message(), "--kv-cache-memory"), "%s", kvp_error_message());
    cr_assert_eq(kvp_cuda_split(total, total, 0.9, weights, act, block, block - 1, &s), KVP_EINVAL);
}

Test(cuda_host, graph_buckets_as_vllm_capture_sizes)
{
    int32_t b[KVP_CUDA_MAX_BUCKETS];
    int32_t n = kvp_cuda_graph_buckets(256, b);
    cr_assert_eq(n, 3 + 32);
    cr_assert(b[0] == 1 && b[1] == 2 && b[2] == 4 && b[3] == 8 && b[n - 1] == 256);
    for (int32_t i = 1; i < n; i++) cr_assert_gt(b[i], b[i - 1]);
    cr_assert_eq(kvp_cuda_graph_bucket(b, n, 1), 1);
    cr_assert_eq(kvp_cuda_graph_bucket(b, n, 3), 4);
    cr_assert_eq(kvp_cuda_graph_bucket(b, n, 5), 8);
    cr_assert_eq(kvp_cuda_graph_bucket(b, n, 17), 24);
    cr_assert_eq(kvp_cuda_graph_bucket(b, n, 256), 256);
    cr_assert_eq(kvp_cuda_graph_bucket(b, n, 257), -1);
    n = kvp_cuda_graph_buckets(3, b);
    cr_assert(n == 3 && b[2] == 4, "max_num_seqs 3: buckets up to 4 cover it");
    n = kvp_cuda_graph_buckets(1, b);
    cr_assert(n == 1 && b[0] == 1);
    n = kvp_cuda_graph_buckets(20, b);
    cr_assert(n == 6 && b[5] == 24, "20 sequences: ..., 16, 24");
    n = kvp_cuda_graph_buckets(100000, b);
    cr_assert(n == 3 + 64 && b[n - 1] == 512);
    cr_assert_eq(kvp_cuda_graph_bucket(b, 0, 1), -1);
}

/* Two sequences: a 3-token prefill chunk at context 2 (all logits) and a decode at context 5; block size 4. */
typedef struct {
    kvp_exec_seq seqs[2];
    int32_t tok[4], pos[4], qo[3], kvi[3], idx[4], last[2];
    int64_t slot[4];
    uint8_t all[2];
    kvp_block_copy cp[1];
    kvp_exec_batch b;
} batch2;

static void batch2_make(batch2 *x)
{
    memset(x, 0, sizeof *x);
    const int32_t tok[4] = {11, 12, 13, 40}, pos[4] = {2, 3, 4, 5}, idx[4] = {6, 3, 2, 1};
    const int64_t slot[4] = {6 * 4 + 2, 6 * 4 + 3, 3 * 4 + 0, 1 * 4 + 1};
    memcpy(x->tok, tok, sizeof tok), memcpy(x->pos, pos, sizeof pos), memcpy(x->idx, idx, sizeof idx);
    memcpy(x->slot, slot, sizeof slot);
    x->qo[1] = 3, x->qo[2] = 4;
    x->kvi[1] = 2, x->kvi[2] = 4;
    x->last[0] = 1, x->last[1] = 2; /* seq 0: 5 tokens over pages 6, 3; seq 1: 6 tokens over 2, 1 */
    x->all[0] = 1;
    x->cp[0] = (kvp_block_copy){.src = 3, .dst = 7};
    x->seqs[0] = (kvp_exec_seq){.context_len = 2, .num_new = 3, .sample = 1, .all_logits = 1, .tokens = x->tok};
    x->seqs[1] = (kvp_exec_seq){.context_len = 5, .num_new = 1, .sample = 1, .tokens = x->tok + 3};
    x->b = (kvp_exec_batch){.seqs = x->seqs, .n = 2, .block_size = 4,
                            .ops = {.copies = x->cp, .n_copies = 1},
                            .flat = {.num_tokens = 4, .tokens = x->tok, .positions = x->pos, .slot_mapping = x->slot,
                                     .qo_indptr = x->qo, .kv_indptr = x->kvi, .kv_indices = x->idx,
                                     .kv_last_page_len = x->last, .all_logits = x->all, .num_rows = 4}};
}

Test(cuda_host, step_pack_layout_and_contents)
{
    batch2 x;
    batch2_make(&x);
    double inv[4] = {1.0, 0.1, 0.01, 0.001};
    const kvp_cuda_pack_model pm = {.vocab = 64, .max_len = 100, .num_blocks = 8, .block_size = 4, .inv_freq = inv,
                                    .rope_scale = 1.0, .rot = 8};
    kvp_cuda_pack_layout l;
    cr_assert_eq(kvp_cuda_pack_plan(&x.b, &pm, 8, &l), KVP_OK, "%s", kvp_error_message());
    cr_assert(l.T == 8 && l.T_real == 4 && l.S == 4 && l.P == 8 && l.C == 1 && !l.local && l.N == 6 && !l.decode);
    const size_t offs[] = {l.off_slots, l.off_tokens, l.off_kv_begin, l.off_len, l.off_rows, l.off_cs,
                           l.off_seq_indptr, l.off_seq_last, l.off_seq_qo, l.off_indices, l.off_pairs};
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++) {
        cr_assert_eq(offs[i] % 16, 0, "section %zu is not 16-byte aligned", i);
        if (i) cr_assert_gt(offs[i], offs[i - 1]);
    }
    cr_assert_geq(l.bytes, l.off_pairs + 2 * sizeof(int32_t));
    unsigned char *buf = calloc(1, l.bytes);
    kvp_cuda_pack_fill(&x.b, &pm, &l, buf);
    const int64_t *slots = (const int64_t *)(buf + l.off_slots);
    const int32_t *tokens = (const int32_t *)(buf + l.off_tokens), *beg = (const int32_t *)(buf + l.off_kv_begin);
    const int32_t *len = (const int32_t *)(buf + l.off_len), *idx = (const int32_t *)(buf + l.off_indices);
    const int32_t *rows = (const int32_t *)(buf + l.off_rows), *pairs = (const int32_t *)(buf + l.off_pairs);
    const float *cs = (const float *)(buf + l.off_cs);
    const int32_t want_len[4] = {3, 4, 5, 6}, want_beg[4] = {0, 0, 0, 2}, want_rows[4] = {0, 1, 2, 3};
    for (int t = 0; t < 4; t++) {
        cr_assert_eq(slots[t], x.slot[t]);
        cr_assert_eq(tokens[t], x.tok[t]);
        cr_assert_eq(len[t], want_len[t], "row %d attends to %d keys, want %d", t, len[t], want_len[t]);
        cr_assert_eq(beg[t], want_beg[t]);
        cr_assert_eq(rows[t], want_rows[t]);
        for (int i = 0; i < 4; i++) {
            cr_assert_float_eq(cs[t * 8 + 2 * i], (float)cos(x.pos[t] * inv[i]), 1e-7);
            cr_assert_float_eq(cs[t * 8 + 2 * i + 1], (float)sin(x.pos[t] * inv[i]), 1e-7);
        }
    }
    for (int t = 4; t < 8; t++) { /* padding rows: no KV written, one key read from an extra page each */
        cr_assert_eq(rows[t], t, "row %d past the logits rows names itself", t);
        cr_assert_eq(slots[t], -1);
        cr_assert_eq(tokens[t], 0);
        cr_assert_eq(len[t], 1);
        cr_assert_eq(beg[t], t);
    }
    cr_assert(idx[0] == 6 && idx[1] == 3 && idx[2] == 2 && idx[3] == 1);
    for (int i = 4; i < 8; i++) cr_assert_eq(idx[i], 0);
    /* per sequence (attention/cuda's page table): the two sequences, then one one-row sequence per padding row */
    const int32_t *sp = (const int32_t *)(buf + l.off_seq_indptr), *sl = (const int32_t *)(buf + l.off_seq_last);
    const int32_t *sq = (const int32_t *)(buf + l.off_seq_qo);
    const int32_t want_sp[7] = {0, 2, 4, 5, 6, 7, 8}, want_sl[6] = {1, 2, 1, 1, 1, 1}, want_sq[7] = {0, 3, 4, 5, 6, 7, 8};
    for (int s = 0; s <= 6; s++) {
        cr_assert_eq(sp[s], want_sp[s], "seq_indptr[%d] %d, want %d", s, sp[s], want_sp[s]);
        cr_assert_eq(sq[s], want_sq[s], "seq_qo[%d] %d, want %d", s, sq[s], want_sq[s]);
        if (s < 6) cr_assert_eq(sl[s], want_sl[s], "seq_last[%d] %d, want %d", s, sl[s], want_sl[s]);
    }
    cr_assert(pairs[0] == 3 && pairs[1] == 7);
    free(buf);
    /* only the last row's logits without all_logits */
    x.all[0] = 0;
    cr_assert_eq(kvp_cuda_pack_plan(&x.b, &pm, 0, &l), KVP_OK);
    cr_assert(l.S == 2 && l.T == 4);
    buf = calloc(1, l.bytes);
    kvp_cuda_pack_fill(&x.b, &pm, &l, buf);
    rows = (const int32_t *)(buf + l.off_rows);
    cr_assert(rows[0] == 2 && rows[1] == 3);
    free(buf);
}

/* Two different batches padded to one bucket put every section the forward pass reads (up to and with the
 * page indices' start) at the same offsets, so one captured graph reads either; only the copy pairs (read
 * outside the graph) move with the page count. */
Test(cuda_host, step_pack_layout_is_the_buckets)
{
    batch2 x;
    batch2_make(&x);
    double inv[4] = {1.0, 0.1, 0.01, 0.001};
    const kvp_cuda_pack_model pm = {.vocab = 64, .max_len = 100, .num_blocks = 8, .block_size = 4, .inv_freq = inv,
                                    .rope_scale = 1.0, .rot = 8};
    kvp_cuda_pack_layout a, b;
    cr_assert_eq(kvp_cuda_pack_plan(&x.b, &pm, 8, &a), KVP_OK, "%s", kvp_error_message());
    /* three decode rows: 1, 3 and 2 pages (9, 12 and 5 cached tokens incl. the new one), no copies */
    const int32_t tok[3] = {5, 6, 7}, pos[3] = {3, 11, 4}, qo[4] = {0, 1, 2, 3}, kvi[4] = {0, 1, 4, 6};
    const int32_t idx[6] = {7, 0, 1, 2, 5, 6}, last[3] = {4, 4, 1};
    const int64_t slot[3] = {31, 11, 24};
    kvp_exec_seq seqs[3];
    for (int i = 0; i < 3; i++)
        seqs[i] = (kvp_exec_seq){.context_len = pos[i], .num_new = 1, .sample = 1, .tokens = tok + i};
    kvp_exec_batch d = {.seqs = seqs, .n = 3, .block_size = 4,
                        .flat = {.num_tokens = 3, .tokens = tok, .positions = pos, .slot_mapping = slot, .qo_indptr = qo,
                                 .kv_indptr = kvi, .kv_indices = idx, .kv_last_page_len = last, .num_rows = 3}};
    cr_assert_eq(kvp_cuda_pack_plan(&d, &pm, 8, &b), KVP_OK, "%s", kvp_error_message());
    cr_assert(a.P != b.P && a.S != b.S && a.C != b.C, "the two batches must differ in pages, logits rows, copies");
    cr_assert(a.T == b.T && a.off_slots == b.off_slots && a.off_tokens == b.off_tokens &&
              a.off_kv_begin == b.off_kv_begin && a.off_len == b.off_len && a.off_rows == b.off_rows &&
              a.off_cs == b.off_cs && a.off_csl == b.off_csl && a.off_seq_indptr == b.off_seq_indptr &&
              a.off_seq_last == b.off_seq_last && a.off_seq_qo == b.off_seq_qo && a.off_indices == b.off_indices);
    cr_assert(b.decode && b.N == 8, "a decode bucket: one sequence per row, padding included");
    /* and at another bucket, other offsets */
    cr_assert_eq(kvp_cuda_pack_plan(&d, &pm, 4, &b), KVP_OK);
    cr_assert_neq(a.off_indices, b.off_indices);
}

/* What the kernels cannot read safely is refused before anything is written, naming the row or sequence. */
Test(cuda_host, step_pack_rejects_bad_batches)
{
    double inv[4] = {1, 1, 1, 1};
    const kvp_cuda_pack_model pm = {.vocab = 64, .max_len = 100, .num_blocks = 8, .block_size = 4, .inv_freq = inv,
                                    .rope_scale = 1.0, .rot = 8};
    kvp_cuda_pack_layout l;
    batch2 x;
    struct {
        const char *what;
        void (*edit)(batch2 *);
    } cases[] = {
        {"outside the vocabulary", NULL}, {"past the model's context", NULL}, {"outside the KV cache", NULL},
        {"outside the cache", NULL},      {"bad page table", NULL},           {"new tokens but", NULL},
        {"padding to", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        batch2_make(&x);
        int32_t pad = 0;
        switch (i) {
        case 0: x.tok[1] = 64; break;
        case 1: x.pos[2] = 100; break;
        case 2: x.slot[3] = 32; break;
        case 3: x.idx[2] = 8; break;
        case 4: x.last[1] = 5; break;
        case 5: x.kvi[1] = 1, x.last[0] = 2; break; /* 2 tokens cached for 3 new ones */
        case 6: pad = 3; break;
        }
        cr_assert_eq(kvp_cuda_pack_plan(&x.b, &pm, pad, &l), KVP_EINVAL, "case %zu accepted", i);
        cr_assert(strstr(kvp_error_message(), cases[i].what), "case %zu: %s", i, kvp_error_message());
    }
}

/* Without a device (this machine) the executor fails cleanly; with one (an emulated build) it runs. */
Test(cuda_host, executor_without_a_device_reports_it)
{
    kvp_model *m;
    cr_assert_eq(kvp_model_load("../shared/models/stories260K/stories260K.gguf", &m), KVP_OK, "%s (../shared?)",
                 kvp_error_detail());
    kvp_cuda_options o = kvp_cuda_options_default();
    o.kv_cache_memory = 1 << 20;
    kvp_executor ex = {0};
    kvp_cuda_info info;
    kvp_status st = kvp_cuda_executor_create(m, NULL, &o, 0, 16, 0, KVP_DTYPE_F32, 64, 4, &ex, &info);
    if (st == KVP_OK) {
        cr_assert(info.emulated || info.cublas);
        cr_assert_gt(info.split.num_blocks, 0);
        kvp_executor_destroy(&ex);
    } else {
        cr_assert_eq(st, KVP_ENODEVICE, "%s", kvp_error_message());
        cr_assert(strstr(kvp_error_message(), "cuda executor: no CUDA device"), "%s", kvp_error_message());
    }
    o.device = 9;
    st = kvp_cuda_executor_create(m, NULL, &o, 0, 16, 0, KVP_DTYPE_F32, 64, 4, &ex, &info);
    cr_assert_eq(st, KVP_ENODEVICE, "no cuda:9 here");
    o.device = 0;
    cr_assert_eq(kvp_cuda_executor_create(m, NULL, &o, 0, 16, 0, KVP_DTYPE_COUNT, 64, 4, &ex, &info), KVP_EINVAL,
                 "not a KV dtype");
    kvp_model_destroy(m);
}

Test(cuda_host, generate_command_line)
{
    char out[1 << 14], err[4096];
    const char *model = "--model ../shared/models/stories260K/stories260K.gguf";
    char cmd[512];
    snprintf(cmd, sizeof cmd, "generate %s --prompt Once --max-tokens 4 --device cuda", model);
    int rc = kvp_test_cli(cmd, out, sizeof out, err, sizeof err);
    cr_assert(rc >= 0, "kvpage crashed (%s)", err);
    if (rc != 0) cr_assert(strstr(err, "cuda executor: no CUDA device"), "%s", err);
    snprintf(cmd, sizeof cmd, "generate %s --prompt Once --enforce-eager", model);
    cr_assert_eq(kvp_test_cli(cmd, out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "--enforce-eager applies to --device cuda only"), "%s", err);
    snprintf(cmd, sizeof cmd, "generate %s --prompt Once --cuda-attention rowwise", model);
    cr_assert_eq(kvp_test_cli(cmd, out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "--cuda-attention applies to --device cuda only"), "%s", err);
    snprintf(cmd, sizeof cmd, "generate %s --prompt Once --deterministic", model);
    cr_assert_eq(kvp_test_cli(cmd, out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "--deterministic applies to --device cuda only"), "%s", err);
    snprintf(cmd, sizeof cmd, "generate %s --prompt Once --device cuda --cuda-attention flash", model);
    cr_assert_eq(kvp_test_cli(cmd, out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "'flash' is not paged or rowwise"), "%s", err);
    snprintf(cmd, sizeof cmd, "generate %s --prompt Once --device tpu", model);
    cr_assert_eq(kvp_test_cli(cmd, out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "unknown device 'tpu'"), "%s", err);
    snprintf(cmd, sizeof cmd, "generate %s --prompt Once --device cuda --gpu-memory-utilization 1.5", model);
    cr_assert_eq(kvp_test_cli(cmd, out, sizeof out, err, sizeof err), 2);
    /* tensor parallelism on the device: without a GPU (or outside mpirun) a clear refusal, exit 2 */
    snprintf(cmd, sizeof cmd, "generate %s --prompt Once --device cuda --tp 2", model);
    cr_assert_eq(kvp_test_cli(cmd, out, sizeof out, err, sizeof err), 2, "%s", err);
    cr_assert(strstr(err, "cuda executor: no CUDA device") || strstr(err, "tensor parallelism over 2 ranks, but this "
              "MPI job has 1"), "%s", err);
    snprintf(cmd, sizeof cmd, "generate %s --prompt Once --device cuda:1 --tp 2", model);
    cr_assert_eq(kvp_test_cli(cmd, out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "each rank takes the GPU of its index on its node"), "%s", err);
    cr_assert_eq(kvp_test_cli("generate --help", out, sizeof out, err, sizeof err), 0);
    cr_assert(strstr(out, "--gpu-memory-utilization") && strstr(out, "--kv-cache-memory") && strstr(out, "--device"));
}

/* serve --device cuda --tp N: one GPU per rank under mpirun; here (no device, or no N-rank job) exit 2 with the
 * reason, never a wait for ranks that do not exist. */
Test(cuda_host, serve_tensor_parallel_command_line)
{
    char out[1 << 14], err[4096];
    const char *model = "--model ../shared/models/stories260K/stories260K.gguf";
    char cmd[512];
    snprintf(cmd, sizeof cmd, "serve %s --port 0 --device cuda --tp 2", model);
    int rc = kvp_test_cli(cmd, out, sizeof out, err, sizeof err);
    cr_assert_eq(rc, 2, "exit %d: %s", rc, err);
    cr_assert(strstr(err, "no CUDA device") || strstr(err, "rank"), "%s", err);
    snprintf(cmd, sizeof cmd, "serve %s --port 0 --device cuda:1 --tp 2", model);
    cr_assert_eq(kvp_test_cli(cmd, out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "each rank takes the GPU of its index"), "%s", err);
}

Test(cuda_host, simulate_command_line)
{
    char out[1 << 14], err[4096];
    const char *cfg = "--model ../shared/models/stories260K/hf/config.json --workload sharegpt:n=2 --rate inf";
    char cmd[512];
    snprintf(cmd, sizeof cmd, "simulate --executor cuda --random-weights %s --kv-cache-memory 1MiB --json", cfg);
    int rc = kvp_test_cli(cmd, out, sizeof out, err, sizeof err);
    cr_assert(rc >= 0, "kvpage crashed (%s)", err);
    if (rc != 0) cr_assert(strstr(err, "cuda executor: no CUDA device"), "%s", err);
    else cr_assert(strstr(out, "\"executor\": \"cuda\"") || strstr(out, "\"executor\":\"cuda\""), "%s", out);
    snprintf(cmd, sizeof cmd, "simulate --executor cpu --random-weights %s", cfg);
    cr_assert_eq(kvp_test_cli(cmd, out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "--random-weights builds the model on the device"), "%s", err);
    snprintf(cmd, sizeof cmd, "simulate %s --kv-cache-memory 1GiB", cfg);
    cr_assert_eq(kvp_test_cli(cmd, out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "--kv-cache-memory applies to --device cuda only"), "%s", err);
    snprintf(cmd, sizeof cmd, "simulate --executor tpu %s", cfg);
    cr_assert_eq(kvp_test_cli(cmd, out, sizeof out, err, sizeof err), 2);
    cr_assert(strstr(err, "use sim, cpu or cuda"), "%s", err);
}
