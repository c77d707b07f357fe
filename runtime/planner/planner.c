/* runtime/planner/planner.c — the memory planner (planner.h).
 *
 * Why the whole-model KV figures are tp x the per-rank ones, replicas counted: that is the GPU memory the
 * KV cache takes, and it keeps the two columns consistent (whole-model budget / whole-model KV per sequence
 * = per-rank budget / per-rank KV per sequence = the concurrent sequences). For example
 *
 *     Llama-3.1-8B (8 KV heads), tp 16:  rank r holds KV head r/2   ->  kv_replicas = 2
 *     per rank: 16 KiB per token          whole model: 16 x 16 KiB = 256 KiB = 2 x the 128 KiB of one copy
 */
#include "runtime/planner/planner.h"

#include "parallel/shard.h"

#include <math.h>
#include <string.h>

kvp_status kvp_plan_dtype_parse(const char *name, const char **canonical, double *bytes)
{
    /* the spellings of generate and the KV cache (attention/paged_kv.h) first: those are the canonical ones */
    static const struct { const char *name, *canonical; double bytes; } dtypes[] = {
        {"f32", "f32", 4},  {"fp32", "f32", 4}, {"float32", "f32", 4}, {"f16", "f16", 2},
        {"fp16", "f16", 2}, {"float16", "f16", 2}, {"bf16", "bf16", 2}, {"bfloat16", "bf16", 2},
        {"fp8", "fp8", 1},  {"fp8_e4m3", "fp8", 1}, {"int8", "int8", 1},
    };
    for (size_t i = 0; name && i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (strcmp(name, dtypes[i].name) == 0) {
            if (canonical) *canonical = dtypes[i].canonical;
            *bytes = dtypes[i].bytes;
            return KVP_OK;
        }
    return KVP_ERR(KVP_EINVAL, "unknown dtype '%s' (use f32, f16, bf16, fp8 or int8; fp32 and fp16 also)",
                   name ? name : "(null)");
}

kvp_status kvp_dtype_bytes(const char *name, double *bytes) { return kvp_plan_dtype_parse(name, NULL, bytes); }

void kvp_plan_params_default(const kvp_model_config *cfg, kvp_plan_params *p)
{
    memset(p, 0, sizeof *p);
    p->gpu_util = 0.9;
    p->weight_bytes = 2;
    p->kv_bytes = 2;
    p->block_size = 16;
    const int64_t ctx = kvp_model_config_context(cfg);
    p->seq_len = ctx > 0 ? ctx : 4096;
    p->num_seqs = 1;
    p->tp = 1;
    p->activation_reserve = -1;
    p->max_batched_tokens = 2048;
    p->lora_rank = 16;
}

/* KV heads one rank holds: heads split across ranks, replicated when tp > kv_heads. */
static int64_t kv_heads_per_rank(const kvp_model_config *c, int32_t tp)
{
    return c->num_kv_heads >= tp ? c->num_kv_heads / tp : 1;
}

/* Ranks holding a copy of each KV head (MLA: of the latent cache). */
static int32_t kv_replicas(const kvp_model_config *c, int32_t tp)
{
    if (c->kv_lora_rank > 0) return tp;
    return tp > c->num_kv_heads ? tp / c->num_kv_heads : 1;
}

/* KV elements per token of layer l on one rank (tp = 1: the whole model). */
static int64_t kv_elems(const kvp_model_config *c, int32_t l, int32_t tp)
{
    if (c->kv_lora_rank > 0) return kvp_model_kv_elems_per_token_layer(c, l); /* latent: replicated */
    return 2 * kv_heads_per_rank(c, tp) * c->head_dim;
}

/* Tokens layer l keeps of an n-token sequence; `round` rounds up to whole blocks of that size. In double so
 * that rounding a huge n cannot wrap. */
static double layer_tokens(const kvp_model_config *c, int32_t l, int64_t n, int64_t round)
{
    int64_t t = n;
    if (c->sliding_window > 0 && c->layer_is_sliding[l] && t > c->sliding_window) t = c->sliding_window;
    double blocks = (double)(t / round) + (t % round != 0);
    return blocks * (double)round;
}

/* Byte figures are sums in double, exact below 2^53; a figure is accepted when it is below BYTES_MAX (a
 * double under it converts to int64_t without overflow), otherwise it is an error naming the option that
 * made it that large. */
#define BYTES_MAX 9.2e18

static double kv_bytes_for(const kvp_model_config *c, int64_t n, double b, int32_t tp, int64_t round)
{
    double sum = 0;
    for (int32_t l = 0; l < c->num_layers; l++) sum += layer_tokens(c, l, n, round) * (double)kv_elems(c, l, tp) * b;
    return sum;
}

int64_t kvp_plan_kv_bytes_for_tokens(const kvp_model_config *cfg, int64_t n, double kv_bytes)
{
    double v = kv_bytes_for(cfg, n, kv_bytes, 1, 1);
    return v < BYTES_MAX ? (int64_t)llround(v) : INT64_MAX;
}

/* v into *out, or KVP_EINVAL: "OPT VAL: WHAT is out of range (over 2^63 bytes)". */
static kvp_status f64_bytes(double v, const char *opt, long long val, const char *what, int64_t *out)
{
    if (!(v < BYTES_MAX))
        return KVP_ERR(KVP_EINVAL, "%s %lld: %s is out of range (over 2^63 bytes)", opt, val, what);
    *out = (int64_t)llround(v);
    return KVP_OK;
}

/* a x b into *out, or the same error. */
static kvp_status mul_bytes(int64_t a, int64_t b, const char *opt, long long val, const char *what, int64_t *out)
{
    if (__builtin_mul_overflow(a, b, out))
        return KVP_ERR(KVP_EINVAL, "%s %lld: %s is out of range (over 2^63 bytes)", opt, val, what);
    return KVP_OK;
}

/* Activation reserve of one rank, an estimate (vLLM measures it with a profiling run; we cannot):
 *  - the widest per-token live set within one layer for max_batched_tokens tokens in 16-bit:
 *    residual + normed input (2 x hidden), q/k/v and attention output ((2 q heads + 2 kv heads) x head_dim),
 *    FFN gate, up and activation (3 x FFN width; MoE: top-k experts), all divided by tp where sharded;
 *  - fp32 logits of up to 256 sequences over the rank's vocab shard;
 *  - 512 MiB for the CUDA context, cuBLAS workspace and NCCL buffers. */
static double activation_estimate(const kvp_model_config *c, const kvp_plan_params *p)
{
    double tp = p->tp;
    double ffn = c->num_experts > 0 ? (double)c->moe_intermediate_size * (c->num_experts_per_tok + c->num_shared_experts)
                                    : (double)c->intermediate_size;
    if (ffn < (double)c->intermediate_size) ffn = (double)c->intermediate_size; /* dense layers of MoE models */
    double per_token = 2.0 * c->hidden_size +
                       (2.0 * c->num_q_heads * c->head_dim + 2.0 * kv_heads_per_rank(c, p->tp) * c->head_dim * tp) / tp +
                       3.0 * ffn / tp;
    double acts = per_token * 2.0 * p->max_batched_tokens;
    double logits = 256.0 * (double)c->vocab_size / tp * 4.0;
    return floor(acts + logits) + (double)(512LL << 20);
}

/* LoRA adapters of rank r on q, k, v and o of every layer: r x (in + out) each. */
static double lora_params(const kvp_model_config *c, int32_t r)
{
    double h = c->hidden_size, q = (double)c->num_q_heads * c->head_dim, kv = (double)c->num_kv_heads * c->head_dim;
    double o = (double)c->num_q_heads * c->v_head_dim;
    return (double)c->num_layers * r * ((h + q) + 2 * (h + kv) + (o + h));
}

/* Bytes of the blocks one sequence shares with the others (one rank): the shared prefix's full blocks (a
 * partial last block is each sequence's own, as vLLM's prefix caching and copy-on-write keep it) in every layer
 * that still holds them at seq_len tokens (a sliding layer keeps those its window reaches). */
static double shared_bytes(const kvp_model_config *c, const kvp_plan_params *p, int32_t tp)
{
    const int64_t bs = p->block_size, full = p->shared_prefix / bs * bs;
    double sum = 0;
    for (int32_t l = 0; full > 0 && l < c->num_layers; l++) {
        int64_t kept = full;
        if (c->sliding_window > 0 && c->layer_is_sliding[l] && p->seq_len > c->sliding_window) {
            const int64_t start = (p->seq_len - c->sliding_window) / bs * bs; /* the window's first block */
            kept = full > start ? full - start : 0;
        }
        sum += (double)kept * (double)kv_elems(c, l, tp) * p->kv_bytes;
    }
    return sum;
}

static kvp_status budget(const kvp_model_config *c, const kvp_plan_params *p, kvp_plan_figures *f, int32_t tp)
{
    int64_t usable = (int64_t)((double)p->gpu_mem_bytes * p->gpu_util);
    if (__builtin_sub_overflow(usable, f->weights_bytes, &f->kv_budget_bytes) ||
        __builtin_sub_overflow(f->kv_budget_bytes, f->activation_bytes, &f->kv_budget_bytes))
        return KVP_ERR(KVP_EINVAL, "--reserve %lld: the KV budget is out of range (over 2^63 bytes)",
                       (long long)f->activation_bytes);
    if (f->kv_budget_bytes <= 0) {
        f->num_blocks = f->max_concurrent_seqs = 0;
        return KVP_OK;
    }
    f->num_blocks = f->block_bytes > 0 ? f->kv_budget_bytes / f->block_bytes : 0;
    int64_t paged_seq = 0;
    KVP_TRY(f64_bytes(kv_bytes_for(c, p->seq_len, p->kv_bytes, tp, p->block_size), "--seq-len", p->seq_len,
                      "the KV cache of one sequence in whole blocks", &paged_seq));
    /* the first sequence takes its whole blocks; each further one all but the shared ones, and at least a
     * block of its own (the token it writes next) */
    int64_t own = paged_seq - (int64_t)llround(shared_bytes(c, p, tp)); /* shared <= paged_seq */
    if (own < f->block_bytes) own = f->block_bytes;
    f->max_concurrent_seqs = paged_seq <= 0 || own <= 0 || f->kv_budget_bytes < paged_seq
                                 ? 0 : 1 + (f->kv_budget_bytes - paged_seq) / own;
    return KVP_OK;
}

kvp_status kvp_plan_compute(const kvp_model_config *c, const kvp_plan_params *p, kvp_plan *out)
{
    if (p->gpu_mem_bytes <= 0) return KVP_ERR(KVP_EINVAL, "GPU memory must be positive");
    if (!(p->gpu_util > 0 && p->gpu_util <= 1)) return KVP_ERR(KVP_EINVAL, "--gpu-util %g is outside (0, 1]", p->gpu_util);
    if (!(p->weight_bytes > 0 && p->weight_bytes <= 8) || !(p->kv_bytes > 0 && p->kv_bytes <= 8))
        return KVP_ERR(KVP_EINVAL, "bytes per weight (%g) and per KV element (%g) must be in (0, 8]", p->weight_bytes,
                       p->kv_bytes);
    if (p->block_size <= 0) return KVP_ERR(KVP_EINVAL, "block size %d must be positive", p->block_size);
    if (p->seq_len <= 0) return KVP_ERR(KVP_EINVAL, "sequence length %lld must be positive", (long long)p->seq_len);
    if (p->num_seqs <= 0) return KVP_ERR(KVP_EINVAL, "number of sequences %lld must be positive", (long long)p->num_seqs);
    if (p->shared_prefix < 0 || p->shared_prefix > p->seq_len)
        return KVP_ERR(KVP_EINVAL, "shared prefix of %lld tokens is longer than the %lld-token sequences",
                       (long long)p->shared_prefix, (long long)p->seq_len);
    /* MLA's latent cache is replicated: only the query heads are split */
    KVP_TRY(kvp_tp_check(p->tp, c->num_q_heads, c->kv_lora_rank > 0 ? 1 : c->num_kv_heads));
    if (p->lora_rank < 0) return KVP_ERR(KVP_EINVAL, "LoRA rank %d must be >= 0", p->lora_rank);

    kvp_plan r;
    memset(&r, 0, sizeof r);
    r.params = kvp_model_num_params(c);
    r.kv_replicas = kv_replicas(c, p->tp);
    kvp_plan_figures *t = &r.total, *k = &r.per_rank;
    const int32_t tp = p->tp;

    if (!((double)r.params * p->weight_bytes < BYTES_MAX) || __builtin_mul_overflow(r.params, 16, &r.train_bytes))
        return KVP_ERR(KVP_EINVAL, "the model's %lld parameters are out of range (their bytes exceed 2^63)",
                       (long long)r.params);
    t->weights_bytes = (int64_t)llround((double)r.params * p->weight_bytes);

    /* One rank: weights split (norms are small enough to ignore in the split), its own KV heads. */
    k->weights_bytes = t->weights_bytes / tp;
    double per_rank_elems = 0;
    for (int32_t l = 0; l < c->num_layers; l++) per_rank_elems += (double)kv_elems(c, l, tp);
    KVP_TRY(f64_bytes(per_rank_elems * p->kv_bytes, "--tp", tp, "the KV cache of one token", &k->kv_bytes_per_token));
    KVP_TRY(f64_bytes(kv_bytes_for(c, p->seq_len, p->kv_bytes, tp, 1), "--seq-len", p->seq_len,
                      "the KV cache of one sequence", &k->kv_bytes_per_seq));
    /* n sequences store the prefix once: seq + (n - 1) x (seq - prefix) */
    int64_t prefix = (int64_t)llround(kv_bytes_for(c, p->shared_prefix, p->kv_bytes, tp, 1)); /* <= seq */
    KVP_TRY(mul_bytes(p->num_seqs - 1, k->kv_bytes_per_seq - prefix, "--num-seqs", p->num_seqs,
                      "the KV cache of all sequences", &k->kv_bytes_total));
    if (__builtin_add_overflow(k->kv_bytes_total, k->kv_bytes_per_seq, &k->kv_bytes_total))
        return KVP_ERR(KVP_EINVAL, "--num-seqs %lld: the KV cache of all sequences is out of range (over 2^63 bytes)",
                       (long long)p->num_seqs);
    KVP_TRY(mul_bytes(p->block_size, k->kv_bytes_per_token, "--block-size", p->block_size, "one KV block",
                      &k->block_bytes));
    if (p->activation_reserve >= 0) k->activation_bytes = p->activation_reserve;
    else KVP_TRY(f64_bytes(activation_estimate(c, p), "--max-batched-tokens", p->max_batched_tokens,
                           "the activation estimate", &k->activation_bytes));
    KVP_TRY(budget(c, p, k, tp));

    /* The whole model is every rank together: each rank's KV, copies of replicated KV heads (or of the MLA
     * latent cache) included, so the whole-model KV figures are tp x the per-rank ones and the whole-model
     * budget divided by the whole-model sequence size gives the same sequences as one rank does. Without
     * replication this is the seed article's 2 x layers x kv_heads x head_dim x bytes per token. */
    KVP_TRY(mul_bytes(k->kv_bytes_per_token, tp, "--tp", tp, "the whole model's KV cache of one token",
                      &t->kv_bytes_per_token));
    KVP_TRY(mul_bytes(k->kv_bytes_per_seq, tp, "--tp", tp, "the whole model's KV cache of one sequence",
                      &t->kv_bytes_per_seq));
    KVP_TRY(mul_bytes(k->kv_bytes_total, tp, "--tp", tp, "the whole model's KV cache of all sequences",
                      &t->kv_bytes_total));
    KVP_TRY(mul_bytes(k->block_bytes, tp, "--tp", tp, "the whole model's KV block", &t->block_bytes));
    KVP_TRY(mul_bytes(k->activation_bytes, tp, "--tp", tp, "the activation reserve of all ranks",
                      &t->activation_bytes));
    KVP_TRY(mul_bytes(k->kv_budget_bytes, tp, "--tp", tp, "the KV budget of all ranks", &t->kv_budget_bytes));
    /* The pool has the same block ids on every rank: blocks and sequences are what one rank allows. */
    t->num_blocks = k->num_blocks;
    t->max_concurrent_seqs = k->max_concurrent_seqs;

    double lora = lora_params(c, p->lora_rank);
    if (!(16.0 * lora + (double)t->weights_bytes < BYTES_MAX))
        return KVP_ERR(KVP_EINVAL, "--lora-rank %d: the LoRA training memory is out of range (over 2^63 bytes)",
                       p->lora_rank);
    r.lora_params = (int64_t)lora;
    r.lora_train_bytes = t->weights_bytes + 16 * r.lora_params;
    *out = r;
    return KVP_OK;
}
