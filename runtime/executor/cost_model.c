/* runtime/executor/cost_model.c — roofline step time (formulas and assumptions in cost_model.h). */
#include "runtime/executor/cost_model.h"

#include <math.h>
#include <strings.h>

/* The all-reduce term's bandwidth: the bus bandwidth NCCL reaches over each GPU's interconnect.
 *
 * Convention (nccl-tests, doc/PERFORMANCE.md): for an all-reduce of S bytes over n ranks taking t seconds,
 * algbw = S / t and busbw = algbw x 2(n-1)/n, the speed of the slowest link independent of n. So
 * t = 2(n-1)/n x S / busbw: the cost model's ring term, with link_bw = busbw.
 *
 * Figures: NCCL's own topology model (src/graph/topo.h), which predicts the ring bandwidth it picks from
 * per-link speeds: SM80_NVLINK_BW 20.0 GB/s per NVLink 3 link, 12 links on an A100 (240 GB/s);
 * SM90_NVLINK_BW 20.6 GB/s per NVLink 4 link, 18 links on an H100/H200 (370.8 GB/s); PCI_BW 12.0 GB/s for
 * PCIe Gen3 x16, doubled per generation (Gen4 x16 24 GB/s, Gen5 x16 48 GB/s). Measured busbw agrees:
 * 8x H200 NVSwitch, all-reduce at 16 GiB with NVLink SHARP disabled (ring): 367.6 GB/s, with it (NVLS,
 * NCCL 2.27): 482 GB/s (stas00/ml-engineering, network/benchmarks/results/all-reduce-8xH200.md);
 * 8x A100 SXM4: 232.5 GB/s (NVIDIA/nccl-tests issue 175), about 200 (issue 149). The ring figure is used:
 * it is what the formula describes, and NVLS only pays at large messages (the same H200 measure reaches
 * 40 GB/s at 1 MiB, where allreduce_latency_s dominates instead). Profiles not listed keep their
 * datasheet NVLink figure (one direction). */
static const struct {
    const char *gpu;
    double busbw;
} nccl_busbw[] = {
    {"A100-40G", 12 * 20.0e9},    /* NVLink 3, NVSwitch */
    {"A100-80G", 12 * 20.0e9},
    {"H100-SXM", 18 * 20.6e9},    /* NVLink 4, NVSwitch */
    {"H200", 18 * 20.6e9},
    {"A100-80G-PCIe", 24e9},      /* PCIe Gen4 x16 */
    {"H100-PCIe", 48e9},          /* PCIe Gen5 x16 */
};

static double link_busbw(const kvp_gpu_profile *gpu)
{
    for (size_t i = 0; i < sizeof nccl_busbw / sizeof nccl_busbw[0]; i++)
        if (strcasecmp(gpu->name, nccl_busbw[i].gpu) == 0) return nccl_busbw[i].busbw;
    return gpu->nvlink_bw_bytes_s;
}

static double kv_share_per_rank(const kvp_cost_model *cm)
{
    /* Heads split evenly; when tp > kv_heads each rank still holds one whole KV head (replication). */
    int32_t per_rank = (cm->num_kv_heads + cm->tp - 1) / cm->tp;
    if (per_rank < 1) per_rank = 1;
    return (double)per_rank / (double)cm->num_kv_heads;
}

kvp_status kvp_cost_model_validate(const kvp_cost_model *cm)
{
    if (cm == NULL) return KVP_ERR(KVP_EINVAL, "cost model: NULL");
#define POS(f)                                                                                             \
    if (!(cm->f > 0)) return KVP_ERR(KVP_EINVAL, "cost model: " #f " must be > 0")
#define NONNEG(f)                                                                                          \
    if (!(cm->f >= 0) || !isfinite((double)cm->f)) return KVP_ERR(KVP_EINVAL, "cost model: " #f " must be >= 0")
    POS(num_layers);
    POS(hidden_size);
    POS(num_kv_heads);
    POS(matmul_flops_per_token);
    NONNEG(lm_head_flops_per_seq);
    NONNEG(attn_flops_per_pair);
    POS(dense_weight_bytes);
    NONNEG(expert_weight_bytes);
    NONNEG(num_experts);
    NONNEG(experts_per_tok);
    POS(kv_bytes_per_token);
    POS(act_bytes);
    POS(peak_flops);
    POS(mem_bw);
    POS(tp);
    NONNEG(step_overhead_s);
    NONNEG(allreduce_latency_s);
    NONNEG(window);
    NONNEG(window_share);
#undef POS
#undef NONNEG
    if (cm->tp > 1 && !(cm->link_bw > 0)) return KVP_ERR(KVP_EINVAL, "cost model: link_bw must be > 0 when tp > 1");
    if (!(cm->flops_efficiency > 0 && cm->flops_efficiency <= 1))
        return KVP_ERR(KVP_EINVAL, "cost model: flops_efficiency must be in (0, 1]");
    if (!(cm->bw_efficiency > 0 && cm->bw_efficiency <= 1))
        return KVP_ERR(KVP_EINVAL, "cost model: bw_efficiency must be in (0, 1]");
    if (cm->window_share > 1) return KVP_ERR(KVP_EINVAL, "cost model: window_share must be in [0, 1]");
    if (cm->experts_per_tok > cm->num_experts)
        return KVP_ERR(KVP_EINVAL, "cost model: experts_per_tok > num_experts");
    return KVP_OK;
}

static int32_t count_moe_layers(const kvp_model_config *cfg)
{
    if (cfg->num_experts <= 0) return 0;
    int32_t n = 0;
    for (int32_t i = 0; i < cfg->num_layers && i < KVP_MAX_LAYERS; i++) n += cfg->layer_is_moe[i] ? 1 : 0;
    return n;
}

kvp_status kvp_cost_model_from_config(const kvp_model_config *cfg, const kvp_gpu_profile *gpu, int32_t tp,
                                      int32_t dtype_bytes, kvp_cost_model *out)
{
    if (cfg == NULL || gpu == NULL || out == NULL) return KVP_ERR(KVP_EINVAL, "cost model: NULL argument");
    if (tp < 1) return KVP_ERR(KVP_EINVAL, "tensor parallelism must be >= 1 (got %d)", (int)tp);
    if (dtype_bytes < 1) return KVP_ERR(KVP_EINVAL, "bytes per element must be >= 1 (got %d)", (int)dtype_bytes);
    if (cfg->num_layers <= 0 || cfg->hidden_size <= 0 || cfg->num_q_heads <= 0 || cfg->num_kv_heads <= 0)
        return KVP_ERR(KVP_EINVAL, "model config has zero layers, hidden size or heads");
    if (cfg->num_q_heads % tp != 0)
        return KVP_ERR(KVP_EINVAL, "tensor parallelism %d does not divide the %d attention heads", (int)tp,
                       (int)cfg->num_q_heads);

    kvp_cost_model cm = {0};
    const double vocab_h = (double)cfg->vocab_size * (double)cfg->hidden_size;
    const double total = (double)kvp_model_num_params(cfg);
    const double active = (double)kvp_model_active_params(cfg);
    const int32_t moe_layers = count_moe_layers(cfg);

    cm.num_layers = cfg->num_layers;
    cm.hidden_size = cfg->hidden_size;
    cm.num_kv_heads = cfg->kv_lora_rank > 0 ? 1 : cfg->num_kv_heads; /* MLA: one latent "head" */
    /* active params include the embedding table (a lookup, not a matmul) and the LM head (counted per
     * sampled sequence instead); tied models count that matrix once. */
    double non_matmul = vocab_h + (cfg->tie_word_embeddings ? 0.0 : vocab_h);
    cm.matmul_flops_per_token = 2.0 * fmax(active - non_matmul, 1.0);
    cm.lm_head_flops_per_seq = 2.0 * vocab_h;
    int32_t v_dim = cfg->v_head_dim > 0 ? cfg->v_head_dim : cfg->head_dim;
    cm.attn_flops_per_pair = 2.0 * cfg->num_layers * (double)cfg->num_q_heads * (double)(cfg->head_dim + v_dim);
    if (moe_layers > 0) {
        cm.num_experts = cfg->num_experts;
        cm.experts_per_tok = cfg->num_experts_per_tok > 0 ? cfg->num_experts_per_tok : 1;
        /* SwiGLU expert: gate, up, down */
        cm.expert_weight_bytes = 3.0 * cfg->hidden_size * (double)cfg->moe_intermediate_size * moe_layers * dtype_bytes;
    }
    /* The untied embedding table is not streamed each step (only the rows of the batch's tokens). */
    double streamed = total - (cfg->tie_word_embeddings ? 0.0 : vocab_h);
    cm.dense_weight_bytes = streamed * dtype_bytes - cm.num_experts * cm.expert_weight_bytes;
    if (cm.dense_weight_bytes <= 0) cm.dense_weight_bytes = streamed * dtype_bytes;
    cm.kv_bytes_per_token = (double)kvp_model_kv_elems_per_token(cfg) * dtype_bytes;
    if (cfg->sliding_window > 0) {
        int32_t sliding = 0;
        for (int32_t i = 0; i < cfg->num_layers && i < KVP_MAX_LAYERS; i++) sliding += cfg->layer_is_sliding[i] ? 1 : 0;
        cm.window = cfg->sliding_window;
        cm.window_share = (double)sliding / cfg->num_layers;
    }
    cm.act_bytes = dtype_bytes;
    cm.peak_flops = gpu->bf16_flops;
    cm.mem_bw = gpu->mem_bw_bytes_s;
    cm.link_bw = link_busbw(gpu);
    cm.tp = tp;
    cm.flops_efficiency = 1.0;
    cm.bw_efficiency = 1.0;
    cm.step_overhead_s = KVP_COST_DEFAULT_OVERHEAD_S;
    cm.allreduce_latency_s = KVP_COST_DEFAULT_ALLREDUCE_LATENCY_S;
    KVP_TRY(kvp_cost_model_validate(&cm));
    *out = cm;
    return KVP_OK;
}

double kvp_cost_weight_bytes_per_rank(const kvp_cost_model *cm)
{
    double all = cm->dense_weight_bytes + cm->num_experts * cm->expert_weight_bytes;
    return all / cm->tp;
}

double kvp_cost_kv_bytes_per_token_per_rank(const kvp_cost_model *cm)
{
    return cm->kv_bytes_per_token * kv_share_per_rank(cm);
}

double kvp_cost_step_time(const kvp_cost_model *cm, const kvp_step_shape *s, kvp_step_cost *detail)
{
    kvp_step_cost c = {0};
    c.overhead_s = cm->step_overhead_s;
    if (s->num_seqs > 0 && s->new_tokens > 0) {
        const double tp = cm->tp;
        /* layers with a window see the capped sums (equal to the full ones without a window) */
        const double ws = cm->window > 0 && s->window == cm->window ? cm->window_share : 0.0;
        const double pairs = (1 - ws) * s->attn_pairs + ws * s->attn_pairs_win;
        const double kv_read = (1 - ws) * (double)s->kv_read_tokens + ws * (double)s->kv_read_win;
        c.flops = cm->matmul_flops_per_token * (double)s->new_tokens +
                  cm->lm_head_flops_per_seq * (double)s->sampled_seqs + cm->attn_flops_per_pair * pairs;
        double experts = 0;
        if (cm->num_experts > 0) experts = fmin((double)cm->num_experts, (double)s->new_tokens * cm->experts_per_tok);
        double weights = cm->dense_weight_bytes + experts * cm->expert_weight_bytes;
        double kv = cm->kv_bytes_per_token * (kv_read + (double)s->new_tokens);
        c.bytes = weights + kv;
        c.compute_s = c.flops / tp / (cm->peak_flops * cm->flops_efficiency);
        c.memory_s = (weights / tp + kv * kv_share_per_rank(cm)) / (cm->mem_bw * cm->bw_efficiency);
        if (cm->tp > 1) {
            double msg = (double)s->new_tokens * cm->hidden_size * cm->act_bytes;
            double one = 2.0 * (tp - 1.0) / tp * msg / cm->link_bw + cm->allreduce_latency_s;
            c.comm_s = 2.0 * cm->num_layers * one;
        }
    }
    c.total_s = fmax(c.compute_s, c.memory_s) + c.comm_s + c.overhead_s;
    if (detail) *detail = c;
    return c.total_s;
}
