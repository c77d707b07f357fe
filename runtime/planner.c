#include "runtime/planner.h"

#include <math.h>
#include <string.h>

kvp_status kvp_dtype_bytes(const char *name, double *bytes)
{
    static const struct { const char *name; double bytes; } dtypes[] = {
        {"fp32", 4}, {"f32", 4}, {"bf16", 2}, {"fp16", 2}, {"f16", 2}, {"fp8", 1}, {"int8", 1},
    };
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (strcmp(name, dtypes[i].name) == 0) {
            *bytes = dtypes[i].bytes;
            return KVP_OK;
        }
    return KVP_ERR(KVP_EINVAL, "unknown dtype '%s' (use fp32, bf16, fp16, fp8 or int8)", name);
}

void kvp_plan_params_default(const kvp_model_config *cfg, kvp_plan_params *p)
{
    memset(p, 0, sizeof *p);
    p->gpu_util = 0.9;
    p->weight_bytes = 2;
    p->kv_bytes = 2;
    p->block_size = 16;
    p->seq_len = cfg->max_position_embeddings > 0 ? cfg->max_position_embeddings : 4096;
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

/* KV elements per token of layer l on one rank (tp = 1: the whole model). */
static int64_t kv_elems(const kvp_model_config *c, int32_t l, int32_t tp)
{
    if (c->kv_lora_rank > 0) return kvp_model_kv_elems_per_token_layer(c, l); /* latent: replicated */
    return 2 * kv_heads_per_rank(c, tp) * c->head_dim;
}

/* Tokens layer l keeps of an n-token sequence; `round` rounds up to whole blocks of that size. */
static int64_t layer_tokens(const kvp_model_config *c, int32_t l, int64_t n, int64_t round)
{
    int64_t t = n;
    if (c->sliding_window > 0 && c->layer_is_sliding[l] && t > c->sliding_window) t = c->sliding_window;
    if (round > 1) t = (t + round - 1) / round * round;
    return t;
}

static int64_t kv_bytes_for(const kvp_model_config *c, int64_t n, double b, int32_t tp, int64_t round)
{
    double sum = 0;
    for (int32_t l = 0; l < c->num_layers; l++) sum += (double)layer_tokens(c, l, n, round) * kv_elems(c, l, tp) * b;
    return (int64_t)llround(sum);
}

int64_t kvp_plan_kv_bytes_for_tokens(const kvp_model_config *cfg, int64_t n, double kv_bytes)
{
    return kv_bytes_for(cfg, n, kv_bytes, 1, 1);
}

/* Activation reserve of one rank, an estimate (vLLM measures it with a profiling run; we cannot):
 *  - the widest per-token live set within one layer for max_batched_tokens tokens in 16-bit:
 *    residual + normed input (2 x hidden), q/k/v and attention output ((2 q heads + 2 kv heads) x head_dim),
 *    FFN gate, up and activation (3 x FFN width; MoE: top-k experts), all divided by tp where sharded;
 *  - fp32 logits of up to 256 sequences over the rank's vocab shard;
 *  - 512 MiB for the CUDA context, cuBLAS workspace and NCCL buffers. */
static int64_t activation_estimate(const kvp_model_config *c, const kvp_plan_params *p)
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
    return (int64_t)(acts + logits) + (512LL << 20);
}

/* LoRA adapters of rank r on q, k, v and o of every layer: r x (in + out) each. */
static int64_t lora_params(const kvp_model_config *c, int32_t r)
{
    int64_t h = c->hidden_size, q = (int64_t)c->num_q_heads * c->head_dim, kv = (int64_t)c->num_kv_heads * c->head_dim;
    int64_t o = (int64_t)c->num_q_heads * c->v_head_dim;
    return (int64_t)c->num_layers * r * ((h + q) + 2 * (h + kv) + (o + h));
}

static void budget(const kvp_model_config *c, const kvp_plan_params *p, kvp_plan_figures *f, int32_t tp)
{
    f->kv_budget_bytes = (int64_t)((double)p->gpu_mem_bytes * p->gpu_util) - f->weights_bytes - f->activation_bytes;
    if (f->kv_budget_bytes <= 0) {
        f->num_blocks = f->max_concurrent_seqs = 0;
        return;
    }
    f->num_blocks = f->kv_budget_bytes / f->block_bytes;
    int64_t paged_seq = kv_bytes_for(c, p->seq_len, p->kv_bytes, tp, p->block_size);
    f->max_concurrent_seqs = paged_seq > 0 ? f->kv_budget_bytes / paged_seq : 0;
}

kvp_status kvp_plan_compute(const kvp_model_config *c, const kvp_plan_params *p, kvp_plan *out)
{
    if (p->gpu_mem_bytes <= 0) return KVP_ERR(KVP_EINVAL, "GPU memory must be positive");
    if (!(p->gpu_util > 0 && p->gpu_util <= 1)) return KVP_ERR(KVP_EINVAL, "--gpu-util %g is outside (0, 1]", p->gpu_util);
    if (p->block_size <= 0) return KVP_ERR(KVP_EINVAL, "block size %d must be positive", p->block_size);
    if (p->seq_len <= 0) return KVP_ERR(KVP_EINVAL, "sequence length %lld must be positive", (long long)p->seq_len);
    if (p->num_seqs <= 0) return KVP_ERR(KVP_EINVAL, "number of sequences %lld must be positive", (long long)p->num_seqs);
    if (p->shared_prefix < 0 || p->shared_prefix > p->seq_len)
        return KVP_ERR(KVP_EINVAL, "shared prefix of %lld tokens is longer than the %lld-token sequences",
                       (long long)p->shared_prefix, (long long)p->seq_len);
    if (p->tp <= 0) return KVP_ERR(KVP_EINVAL, "--tp %d must be positive", p->tp);
    if (c->num_q_heads % p->tp != 0)
        return KVP_ERR(KVP_EINVAL, "--tp %d does not divide the %d attention heads", p->tp, c->num_q_heads);
    if (c->kv_lora_rank == 0 && (p->tp <= c->num_kv_heads ? c->num_kv_heads % p->tp : p->tp % c->num_kv_heads) != 0)
        return KVP_ERR(KVP_EINVAL, "--tp %d does not divide the %d KV heads (nor is it a multiple of them)", p->tp,
                       c->num_kv_heads);

    kvp_plan r;
    memset(&r, 0, sizeof r);
    r.params = kvp_model_num_params(c);
    kvp_plan_figures *t = &r.total, *k = &r.per_rank;

    t->weights_bytes = (int64_t)llround((double)r.params * p->weight_bytes);
    /* all layers, full attention: the seed article's 2 x layers x kv_heads x head_dim x bytes */
    t->kv_bytes_per_token = (int64_t)llround((double)kvp_model_kv_elems_per_token(c) * p->kv_bytes);
    t->kv_bytes_per_seq = kv_bytes_for(c, p->seq_len, p->kv_bytes, 1, 1);
    t->kv_bytes_total = p->num_seqs * t->kv_bytes_per_seq -
                        (p->num_seqs - 1) * kv_bytes_for(c, p->shared_prefix, p->kv_bytes, 1, 1);
    t->block_bytes = p->block_size * t->kv_bytes_per_token;

    /* One rank: weights split (norms are small enough to ignore in the split), its own KV heads. */
    k->weights_bytes = t->weights_bytes / p->tp;
    double per_rank_elems = 0;
    for (int32_t l = 0; l < c->num_layers; l++) per_rank_elems += (double)kv_elems(c, l, p->tp);
    k->kv_bytes_per_token = (int64_t)llround(per_rank_elems * p->kv_bytes);
    k->kv_bytes_per_seq = kv_bytes_for(c, p->seq_len, p->kv_bytes, p->tp, 1);
    k->kv_bytes_total = p->num_seqs * k->kv_bytes_per_seq -
                        (p->num_seqs - 1) * kv_bytes_for(c, p->shared_prefix, p->kv_bytes, p->tp, 1);
    k->block_bytes = p->block_size * k->kv_bytes_per_token;
    k->activation_bytes = p->activation_reserve >= 0 ? p->activation_reserve : activation_estimate(c, p);
    budget(c, p, k, p->tp);

    /* The pool has the same block ids on every rank: blocks and sequences are what one rank allows. */
    t->activation_bytes = k->activation_bytes * p->tp;
    t->kv_budget_bytes = k->kv_budget_bytes * p->tp;
    t->num_blocks = k->num_blocks;
    t->max_concurrent_seqs = k->max_concurrent_seqs;

    r.train_bytes = 16 * r.params;
    r.lora_params = lora_params(c, p->lora_rank);
    r.lora_train_bytes = t->weights_bytes + 16 * r.lora_params;
    *out = r;
    return KVP_OK;
}
