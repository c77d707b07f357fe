#include "runtime/loader/model_config.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/json.h"

/* Hugging Face defaults differ per family; this table is the one place that knows them. */
static const struct {
    const char *model_type;
    kvp_model_family family;
    int tie_default;    /* PretrainedConfig subclasses' default for tie_word_embeddings */
    int qkv_bias;       /* q/k/v projections always carry a bias */
    int qk_norm;
} families[] = {
    {"llama", KVP_FAMILY_LLAMA, 0, 0, 0},      {"mistral", KVP_FAMILY_LLAMA, 0, 0, 0},
    {"qwen2", KVP_FAMILY_LLAMA, 0, 1, 0},      {"qwen3", KVP_FAMILY_LLAMA, 0, 0, 1},
    {"mixtral", KVP_FAMILY_MIXTRAL, 0, 0, 0},  {"qwen3_moe", KVP_FAMILY_MIXTRAL, 0, 0, 1},
    {"gemma", KVP_FAMILY_GEMMA2, 1, 0, 0},     {"gemma2", KVP_FAMILY_GEMMA2, 1, 0, 0},
    {"gemma3_text", KVP_FAMILY_GEMMA2, 1, 0, 1},
    {"phi3", KVP_FAMILY_PHI3, 0, 0, 0},        {"opt", KVP_FAMILY_OPT, 1, 1, 0},
    {"deepseek_v2", KVP_FAMILY_DEEPSEEK, 0, 0, 0}, {"deepseek_v3", KVP_FAMILY_DEEPSEEK, 0, 0, 0},
};

/* Largest integer a JSON number holds exactly (kvp_json_int's limit). */
#define JSON_INT_MAX 9007199254740992.0

/* Field limits, far above every published model (Llama-3.1-405B: hidden 16384, FFN 53248; Gemma-2: vocab
 * 256000; DeepSeek-V3: 256 experts, kv_lora_rank 512) and low enough that the KV sizes stay far from
 * int64_t; the parameter count is bounded on its own (KVP_MODEL_MAX_PARAMS, checked at the end). */
#define MAX_HIDDEN (1LL << 20)   /* hidden_size */
#define MAX_HEADS (1LL << 16)    /* num_attention_heads */
#define MAX_DIM (1LL << 16)      /* head_dim, MLA ranks and head dims */
#define MAX_FFN (1LL << 24)      /* intermediate_size, ffn_dim, moe_intermediate_size */
#define MAX_VOCAB (1LL << 24)    /* vocab_size */
#define MAX_EXPERTS (1LL << 16)  /* routed and shared experts */
#define MAX_TOKENS (1LL << 40)   /* max_position_embeddings, sliding windows (as `plan --seq-len`) */

static kvp_status check_param_count(const kvp_model_config *c, const char *what); /* at the end */

/* kvp_json_int refused o's `key`: a number too large to be an integer there (2^62, 1e999) is out of range,
 * anything else is not an integer. */
static kvp_status int_error(const cJSON *o, const char *what, const char *key, int64_t min, int64_t max)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsNumber(v) && fabs(v->valuedouble) > JSON_INT_MAX)
        return KVP_ERR(KVP_EINVAL, "%s: \"%s\": %g is out of range [%lld, %lld]", what, key, v->valuedouble,
                       (long long)min, (long long)max);
    return KVP_ERR(KVP_EPARSE, "%s: \"%s\" must be an integer", what, key);
}

static kvp_status check_range(const char *what, const char *key, int64_t v, int64_t min, int64_t max)
{
    if (v < min || v > max)
        return KVP_ERR(KVP_EINVAL, "%s: \"%s\": %lld is out of range [%lld, %lld]", what, key, (long long)v,
                       (long long)min, (long long)max);
    return KVP_OK;
}

/* Reads an integer field that must be present and in [min, max]. */
static kvp_status need_int(const cJSON *o, const char *what, const char *key, int64_t min, int64_t max,
                           int64_t *out)
{
    int present = 0;
    if (kvp_json_int(o, key, out, &present) != KVP_OK) return int_error(o, what, key, min, max);
    if (!present) return KVP_ERR(KVP_EPARSE, "%s: missing \"%s\"", what, key);
    return check_range(what, key, *out, min, max);
}

/* Optional integer in [min, max]: *out keeps `dflt` when absent. */
static kvp_status opt_int(const cJSON *o, const char *what, const char *key, int64_t min, int64_t max,
                          int64_t dflt, int64_t *out)
{
    int present = 0;
    *out = dflt;
    if (kvp_json_int(o, key, out, &present) != KVP_OK) return int_error(o, what, key, min, max);
    return present ? check_range(what, key, *out, min, max) : KVP_OK;
}

static kvp_status opt_num(const cJSON *o, const char *what, const char *key, double dflt, double *out)
{
    *out = dflt;
    if (kvp_json_num(o, key, out, NULL) != KVP_OK)
        return KVP_ERR(KVP_EPARSE, "%s: \"%s\" must be a number", what, key);
    return KVP_OK;
}

static kvp_status opt_bool(const cJSON *o, const char *what, const char *key, int dflt, int *out)
{
    *out = dflt;
    if (kvp_json_bool(o, key, out, NULL) != KVP_OK)
        return KVP_ERR(KVP_EPARSE, "%s: \"%s\" must be true or false", what, key);
    return KVP_OK;
}

/* bos/eos ids: an integer or a list of integers (the first one is kept). */
void kvp_model_config_add_eos(kvp_model_config *c, int64_t id)
{
    if (id < 0 || c->n_eos >= KVP_MAX_EOS_IDS) return;
    for (int32_t i = 0; i < c->n_eos; i++)
        if (c->eos_token_ids[i] == id) return;
    c->eos_token_ids[c->n_eos++] = id;
    c->eos_token_id = c->eos_token_ids[0];
}

/* One token id (v may be NULL or null: -1). */
static kvp_status token_value(const cJSON *v, const char *what, const char *key, int64_t *out)
{
    *out = -1;
    if (v == NULL || cJSON_IsNull(v)) return KVP_OK;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0)
        return KVP_ERR(KVP_EPARSE, "%s: \"%s\" must be a token id or a list of them", what, key);
    if (v->valuedouble > JSON_INT_MAX)
        return KVP_ERR(KVP_EINVAL, "%s: \"%s\": %g is out of range [0, %.0f]", what, key, v->valuedouble, JSON_INT_MAX);
    *out = (int64_t)v->valuedouble;
    return KVP_OK;
}

/* A token id, or the first of a list. */
static kvp_status token_id(const cJSON *o, const char *what, const char *key, int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return token_value(cJSON_IsArray(v) ? cJSON_GetArrayItem(v, 0) : v, what, key, out);
}

int64_t kvp_model_config_context(const kvp_model_config *c)
{
    const char *t = c->rope_scaling_type;
    double n = (double)c->max_position_embeddings;
    if (!strcmp(t, "linear") || !strcmp(t, "dynamic")) n *= c->rope_scaling_factor;
    if (!strcmp(t, "yarn"))
        n = (double)(c->rope_original_max_position > 0 ? c->rope_original_max_position : n) * c->rope_scaling_factor;
    return n >= 1 && n < 9e18 ? (int64_t)n : 0;
}

double kvp_yarn_mscale(double s, double mscale) { return s <= 1 ? 1.0 : 0.1 * mscale * log(s) + 1.0; }

kvp_status kvp_sampling_set(kvp_sampling_defaults *d, unsigned bit, double v, const char *what, const char *key)
{
    static const struct {
        unsigned bit;
        double lo, hi;
        int lo_open, integer;
    } r[] = {
        {KVP_SAMPLING_TEMPERATURE, 0, 1e6, 0, 0}, {KVP_SAMPLING_TOP_P, 0, 1, 1, 0},
        {KVP_SAMPLING_TOP_K, -1, INT32_MAX, 0, 1}, {KVP_SAMPLING_MIN_P, 0, 1, 0, 0},
        {KVP_SAMPLING_REPETITION, 0, 10, 1, 0},   {KVP_SAMPLING_MAX_TOKENS, 1, 1 << 24, 0, 1},
    };
    size_t i = 0;
    while (i < sizeof r / sizeof r[0] - 1 && r[i].bit != bit) i++;
    if (!(v <= r[i].hi && (r[i].lo_open ? v > r[i].lo : v >= r[i].lo)) || (r[i].integer && v != floor(v)))
        return KVP_ERR(KVP_EPARSE, "%s: \"%s\": %g is out of range %s%g, %g]%s", what, key, v, r[i].lo_open ? "(" : "[",
                       r[i].lo, r[i].hi, r[i].integer ? ", an integer" : "");
    switch (bit) {
    case KVP_SAMPLING_TEMPERATURE: d->temperature = v; break;
    case KVP_SAMPLING_TOP_P: d->top_p = v; break;
    case KVP_SAMPLING_TOP_K: d->top_k = (int64_t)v; break;
    case KVP_SAMPLING_MIN_P: d->min_p = v; break;
    case KVP_SAMPLING_REPETITION: d->repetition_penalty = v; break;
    default: d->max_tokens = (int64_t)v; break;
    }
    d->given |= bit;
    return KVP_OK;
}

kvp_status kvp_model_config_sampling(const cJSON *o, const char *what, kvp_model_config *c)
{
    static const struct {
        const char *key;
        unsigned bit;
    } f[] = {{"temperature", KVP_SAMPLING_TEMPERATURE}, {"top_p", KVP_SAMPLING_TOP_P},
             {"top_k", KVP_SAMPLING_TOP_K},             {"min_p", KVP_SAMPLING_MIN_P},
             {"repetition_penalty", KVP_SAMPLING_REPETITION}, {"max_new_tokens", KVP_SAMPLING_MAX_TOKENS}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        double v = 0;
        int present = 0;
        if (kvp_json_num(o, f[i].key, &v, &present) != KVP_OK)
            return KVP_ERR(KVP_EPARSE, "%s: \"%s\" must be a number", what, f[i].key);
        if (present) KVP_TRY(kvp_sampling_set(&c->sampling, f[i].bit, v, what, f[i].key));
    }
    return KVP_OK;
}

kvp_status kvp_model_config_eos(const cJSON *o, const char *what, kvp_model_config *c)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "eos_token_id"), *x;
    if (!cJSON_IsArray(v)) {
        int64_t id;
        KVP_TRY(token_value(v, what, "eos_token_id", &id));
        kvp_model_config_add_eos(c, id);
        return KVP_OK;
    }
    if (cJSON_GetArraySize(v) > KVP_MAX_EOS_IDS)
        return KVP_ERR(KVP_EUNSUPPORTED, "%s: \"eos_token_id\" lists %d ids (at most %d are read)", what,
                       cJSON_GetArraySize(v), KVP_MAX_EOS_IDS);
    cJSON_ArrayForEach(x, v)
    {
        int64_t id;
        KVP_TRY(token_value(x, what, "eos_token_id", &id));
        kvp_model_config_add_eos(c, id);
    }
    return KVP_OK;
}

/* longrope's long_factor or short_factor: an array of numbers (checked against the rotary pairs by the model). */
static kvp_status rope_factors(const cJSON *rs, const char *what, const char *key, double *out, int32_t *n)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(rs, key);
    if (!cJSON_IsArray(a)) return KVP_ERR(KVP_EPARSE, "%s: rope_scaling \"%s\" must be an array of numbers", what, key);
    const int len = cJSON_GetArraySize(a);
    if (len > KVP_MAX_ROPE_PAIRS)
        return KVP_ERR(KVP_EPARSE, "%s: rope_scaling \"%s\" has %d entries, more than %d", what, key, len,
                       KVP_MAX_ROPE_PAIRS);
    int i = 0;
    for (const cJSON *x = a->child; x; x = x->next, i++) {
        if (!cJSON_IsNumber(x)) return KVP_ERR(KVP_EPARSE, "%s: rope_scaling \"%s\"[%d] is not a number", what, key, i);
        out[i] = x->valuedouble;
    }
    if (*n >= 0 && *n != len)
        return KVP_ERR(KVP_EPARSE, "%s: rope_scaling \"long_factor\" has %d entries and \"short_factor\" %d", what,
                       *n, len);
    *n = len;
    return KVP_OK;
}

static kvp_status read_rope_scaling(const cJSON *o, const char *what, kvp_model_config *c)
{
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(o, "rope_scaling");
    if (rs == NULL || cJSON_IsNull(rs)) return KVP_OK;
    if (!cJSON_IsObject(rs)) return KVP_ERR(KVP_EPARSE, "%s: \"rope_scaling\" must be an object", what);
    const char *type = NULL;
    int present = 0;
    if (kvp_json_str(rs, "rope_type", &type, &present) != KVP_OK ||
        (!present && kvp_json_str(rs, "type", &type, NULL) != KVP_OK))
        return KVP_ERR(KVP_EPARSE, "%s: rope_scaling \"rope_type\" must be a string", what);
    snprintf(c->rope_scaling_type, sizeof c->rope_scaling_type, "%s", type ? type : "");
    KVP_TRY(opt_num(rs, what, "factor", 1.0, &c->rope_scaling_factor));
    KVP_TRY(opt_num(rs, what, "low_freq_factor", 1.0, &c->rope_low_freq_factor));
    KVP_TRY(opt_num(rs, what, "high_freq_factor", 4.0, &c->rope_high_freq_factor));
    KVP_TRY(opt_int(rs, what, "original_max_position_embeddings", 1, MAX_TOKENS, 0, &c->rope_original_max_position));
    KVP_TRY(opt_num(rs, what, "beta_fast", 32.0, &c->rope_beta_fast));
    KVP_TRY(opt_num(rs, what, "beta_slow", 1.0, &c->rope_beta_slow));
    KVP_TRY(opt_bool(rs, what, "truncate", 1, &c->rope_truncate));
    KVP_TRY(opt_num(rs, what, "attention_factor", 0.0, &c->rope_attention_factor));
    KVP_TRY(opt_num(rs, what, "mscale", 0.0, &c->rope_mscale));
    KVP_TRY(opt_num(rs, what, "mscale_all_dim", 0.0, &c->rope_mscale_all_dim));
    if (!strcmp(c->rope_scaling_type, "su")) strcpy(c->rope_scaling_type, "longrope"); /* its older name */
    if (!strcmp(c->rope_scaling_type, "longrope")) {
        c->rope_n_factors = -1;
        KVP_TRY(rope_factors(rs, what, "long_factor", c->rope_long_factor, &c->rope_n_factors));
        KVP_TRY(rope_factors(rs, what, "short_factor", c->rope_short_factor, &c->rope_n_factors));
        KVP_TRY(opt_num(rs, what, "long_mscale", 0.0, &c->rope_long_mscale));
        KVP_TRY(opt_num(rs, what, "short_mscale", 0.0, &c->rope_short_mscale));
        /* phi3 keeps its original context beside max_position_embeddings, which transformers reads first */
        int64_t top = 0;
        KVP_TRY(opt_int(o, what, "original_max_position_embeddings", 1, MAX_TOKENS, 0, &top));
        if (top > 0) c->rope_original_max_position = top;
    }
    return KVP_OK;
}

/* A gemma2 or gemma3 number: dflt when absent, 0 when null; in (0, 1e30], or [0, 1e30] when may_be_0 (a cap: 0 is
 * off). */
static kvp_status gemma_num(const cJSON *o, const char *what, const char *key, double dflt, int may_be_0,
                             double *out)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    KVP_TRY(opt_num(o, what, key, x && cJSON_IsNull(x) ? 0.0 : dflt, out));
    if (!(may_be_0 ? *out >= 0 : *out > 0) || *out > 1e30)
        return KVP_ERR(KVP_EINVAL, "%s: \"%s\": %g is out of range (%s, 1e30]", what, key, *out,
                       may_be_0 ? "[0" : "(0");
    return KVP_OK;
}

/* gemma's, gemma2's and gemma3's fields, with transformers' defaults (Gemma2Config: query_pre_attn_scalar 256,
 * soft caps 50 and 30, null turning a cap off as None does; Gemma3TextConfig: query_pre_attn_scalar 256, no
 * caps, rope_theta 1e6 and rope_local_base_freq 1e4). The activation is hidden_activation: gelu_pytorch_tanh,
 * also when it is absent (transformers' Gemma then ignores the older hidden_act), or gelu. */
static kvp_status read_gemma(const cJSON *o, const char *what, kvp_model_config *c)
{
    const char *act = NULL;
    if (kvp_json_str(o, "hidden_activation", &act, NULL) != KVP_OK)
        return KVP_ERR(KVP_EPARSE, "%s: \"hidden_activation\" must be a string", what);
    if (act == NULL || !strcmp(act, "gelu_pytorch_tanh")) c->ffn_act = KVP_ACT_GELU_TANH;
    else if (!strcmp(act, "gelu")) c->ffn_act = KVP_ACT_GELU;
    else
        return KVP_ERR(KVP_EUNSUPPORTED, "%s: \"hidden_activation\": \"%s\" is not supported (gelu_pytorch_tanh, "
                       "gelu)", what, act);
    const int g3 = !strcmp(c->model_type, "gemma3_text");
    if (strcmp(c->model_type, "gemma2") != 0 && !g3) return KVP_OK;
    c->post_norms = 1;
    KVP_TRY(gemma_num(o, what, "query_pre_attn_scalar", 256.0, 0, &c->query_pre_attn_scalar));
    KVP_TRY(gemma_num(o, what, "attn_logit_softcapping", g3 ? 0.0 : 50.0, 1, &c->attn_logit_softcapping));
    KVP_TRY(gemma_num(o, what, "final_logit_softcapping", g3 ? 0.0 : 30.0, 1, &c->final_logit_softcapping));
    if (!g3) return KVP_OK;
    if (!cJSON_HasObjectItem(o, "rope_theta")) c->rope_theta = 1e6;
    return gemma_num(o, what, "rope_local_base_freq", 1e4, 0, &c->rope_local_theta);
}

/* Which layers slide: "layer_types" when present, else the family's rule. */
static kvp_status read_sliding(const cJSON *o, const char *what, kvp_model_config *c)
{
    int64_t w = 0, pattern = 6;
    const int g3 = !strcmp(c->model_type, "gemma3_text");
    KVP_TRY(opt_int(o, what, "sliding_window", 0, MAX_TOKENS, g3 ? 4096 : 0, &w)); /* Gemma3TextConfig's default */
    KVP_TRY(opt_int(o, what, "sliding_window_pattern", 1, KVP_MAX_LAYERS, 6, &pattern));
    if (w == 0) KVP_TRY(opt_int(o, what, "sliding_window_size", 0, MAX_TOKENS, 0, &w)); /* MLC's name, gemma2 has both */
    int use = 1;
    KVP_TRY(opt_bool(o, what, "use_sliding_window", 1, &use));
    int64_t max_window_layers = 0;
    KVP_TRY(opt_int(o, what, "max_window_layers", 0, INT32_MAX, 0, &max_window_layers));
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(o, "layer_types");
    if (cJSON_IsArray(types)) {
        if (cJSON_GetArraySize(types) != c->num_layers)
            return KVP_ERR(KVP_EPARSE, "%s: \"layer_types\" has %d entries for %d layers", what,
                           cJSON_GetArraySize(types), c->num_layers);
        int i = 0, any = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, types)
        {
            if (!cJSON_IsString(t)) return KVP_ERR(KVP_EPARSE, "%s: \"layer_types\" must hold strings", what);
            c->layer_is_sliding[i] = strcmp(t->valuestring, "sliding_attention") == 0;
            any |= c->layer_is_sliding[i++];
        }
        if (any && w == 0) return KVP_ERR(KVP_EPARSE, "%s: sliding layers but no \"sliding_window\"", what);
        c->sliding_window = any ? w : 0;
        return KVP_OK;
    }
    if (w == 0 || !use) return KVP_OK;
    c->sliding_window = w;
    for (int i = 0; i < c->num_layers; i++) {
        if (g3) c->layer_is_sliding[i] = (i + 1) % pattern != 0; /* every pattern-th layer attends to all */
        else if (c->family == KVP_FAMILY_GEMMA2) c->layer_is_sliding[i] = (i % 2) == 0;
        else if (strcmp(c->model_type, "qwen2") == 0 || strncmp(c->model_type, "qwen3", 5) == 0)
            c->layer_is_sliding[i] = i >= max_window_layers; /* Qwen: SWA from max_window_layers on */
        else c->layer_is_sliding[i] = 1;
    }
    return KVP_OK;
}

static kvp_status read_moe(const cJSON *o, const char *what, kvp_model_config *c)
{
    int64_t e = 0, k = 0, shared = 0, moe_i = 0, first_dense = 0, step = 1;
    KVP_TRY(opt_int(o, what, "num_local_experts", 0, MAX_EXPERTS, 0, &e));
    if (e == 0) KVP_TRY(opt_int(o, what, "num_experts", 0, MAX_EXPERTS, 0, &e));
    if (e == 0) KVP_TRY(opt_int(o, what, "n_routed_experts", 0, MAX_EXPERTS, 0, &e));
    if (e == 0) return KVP_OK;
    KVP_TRY(need_int(o, what, "num_experts_per_tok", 1, MAX_EXPERTS, &k));
    if (k > e) return KVP_ERR(KVP_EINVAL, "%s: num_experts_per_tok %lld exceeds %lld experts", what,
                              (long long)k, (long long)e);
    KVP_TRY(opt_int(o, what, "n_shared_experts", 0, MAX_EXPERTS, 0, &shared));
    KVP_TRY(opt_int(o, what, "moe_intermediate_size", 1, MAX_FFN, c->intermediate_size, &moe_i));
    KVP_TRY(opt_int(o, what, "first_k_dense_replace", 0, INT32_MAX, 0, &first_dense));
    KVP_TRY(opt_int(o, what, "moe_layer_freq", 1, INT32_MAX, 1, &step));
    if (step == 1) KVP_TRY(opt_int(o, what, "decoder_sparse_step", 1, INT32_MAX, 1, &step));
    KVP_TRY(opt_bool(o, what, "norm_topk_prob", 0, &c->moe_norm_topk));
    if (!strcmp(c->model_type, "mixtral")) c->moe_norm_topk = 1; /* MixtralSparseMoeBlock always renormalizes */
    c->num_experts = (int32_t)e;
    c->num_experts_per_tok = (int32_t)k;
    c->num_shared_experts = (int32_t)shared;
    c->moe_intermediate_size = moe_i;
    c->first_dense_layers = (int32_t)first_dense;
    c->moe_layer_step = (int32_t)step;
    for (int i = 0; i < c->num_layers; i++) {
        if (c->family == KVP_FAMILY_DEEPSEEK) c->layer_is_moe[i] = i >= first_dense && i % step == 0;
        else c->layer_is_moe[i] = (i + 1) % step == 0;
    }
    const cJSON *only = cJSON_GetObjectItemCaseSensitive(o, "mlp_only_layers");
    const cJSON *l;
    cJSON_ArrayForEach(l, only)
    {
        if (!cJSON_IsNumber(l) || l->valuedouble < 0 || l->valuedouble >= c->num_layers)
            return KVP_ERR(KVP_EPARSE, "%s: \"mlp_only_layers\" holds an invalid layer index", what);
        c->layer_is_moe[(int)l->valuedouble] = 0;
    }
    return KVP_OK;
}

kvp_status kvp_model_config_from_json(const cJSON *root, const char *what, kvp_model_config *out)
{
    if (!cJSON_IsObject(root)) return KVP_ERR(KVP_EPARSE, "%s: not a JSON object", what);
    const cJSON *o = root;
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (cJSON_IsObject(text)) o = text; /* multimodal wrappers keep the language model here */

    kvp_model_config c;
    memset(&c, 0, sizeof c);
    const char *type = NULL;
    if (kvp_json_str(o, "model_type", &type, NULL) != KVP_OK ||
        (type == NULL && kvp_json_str(root, "model_type", &type, NULL) != KVP_OK))
        return KVP_ERR(KVP_EPARSE, "%s: \"model_type\" must be a string", what);
    snprintf(c.model_type, sizeof c.model_type, "%s", type ? type : "");
    int known = -1;
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (strcmp(c.model_type, families[i].model_type) == 0) known = (int)i;
    c.family = known >= 0 ? families[known].family : KVP_FAMILY_GENERIC;
    if (known < 0 && !cJSON_HasObjectItem(o, "num_key_value_heads") && !cJSON_HasObjectItem(o, "head_dim"))
        return KVP_ERR(KVP_EUNSUPPORTED,
                       "%s: unknown model_type \"%s\" and no num_key_value_heads/head_dim to compute the KV size",
                       what, c.model_type[0] ? c.model_type : "(none)");

    int64_t v;
    KVP_TRY(need_int(o, what, "num_hidden_layers", 1, KVP_MAX_LAYERS, &v));
    c.num_layers = (int32_t)v;
    KVP_TRY(need_int(o, what, "hidden_size", 1, MAX_HIDDEN, &v));
    c.hidden_size = (int32_t)v;
    KVP_TRY(need_int(o, what, "num_attention_heads", 1, MAX_HEADS, &v));
    c.num_q_heads = (int32_t)v;
    KVP_TRY(opt_int(o, what, "num_key_value_heads", 1, MAX_HEADS, c.num_q_heads, &v));
    if (v > c.num_q_heads || c.num_q_heads % v != 0)
        return KVP_ERR(KVP_EINVAL, "%s: num_key_value_heads %lld does not divide num_attention_heads %d", what,
                       (long long)v, c.num_q_heads);
    c.num_kv_heads = (int32_t)v;
    int has_head_dim = cJSON_HasObjectItem(o, "head_dim") && !cJSON_IsNull(cJSON_GetObjectItem(o, "head_dim"));
    if (!has_head_dim && c.hidden_size % c.num_q_heads != 0)
        return KVP_ERR(KVP_EINVAL, "%s: hidden_size %d is not a multiple of num_attention_heads %d and no head_dim",
                       what, c.hidden_size, c.num_q_heads);
    KVP_TRY(opt_int(o, what, "head_dim", 1, MAX_DIM, c.hidden_size / c.num_q_heads, &v));
    c.head_dim = c.v_head_dim = (int32_t)v;

    int64_t ffn = 0;
    KVP_TRY(opt_int(o, what, "intermediate_size", 1, MAX_FFN, 0, &ffn));
    if (ffn == 0) KVP_TRY(opt_int(o, what, "ffn_dim", 1, MAX_FFN, 0, &ffn)); /* OPT */
    if (ffn == 0 && c.family != KVP_FAMILY_GENERIC)
        return KVP_ERR(KVP_EPARSE, "%s: missing \"intermediate_size\"", what);
    c.intermediate_size = ffn;
    KVP_TRY(opt_int(o, what, "vocab_size", 1, MAX_VOCAB, 0, &c.vocab_size));
    if (c.vocab_size == 0 && c.family != KVP_FAMILY_GENERIC)
        return KVP_ERR(KVP_EPARSE, "%s: missing \"vocab_size\"", what);
    KVP_TRY(opt_int(o, what, "max_position_embeddings", 1, MAX_TOKENS, 0, &c.max_position_embeddings));

    KVP_TRY(opt_num(o, what, "rms_norm_eps", 1e-5, &c.rms_norm_eps));
    if (!cJSON_HasObjectItem(o, "rms_norm_eps")) KVP_TRY(opt_num(o, what, "layer_norm_eps", 1e-5, &c.rms_norm_eps));
    KVP_TRY(opt_num(o, what, "rope_theta", 10000.0, &c.rope_theta));
    KVP_TRY(read_rope_scaling(o, what, &c));

    int tie_default = known >= 0 ? families[known].tie_default : 0;
    KVP_TRY(opt_bool(o, what, "tie_word_embeddings", tie_default, &c.tie_word_embeddings));
    if (!cJSON_HasObjectItem(o, "tie_word_embeddings") && o != root)
        KVP_TRY(opt_bool(root, what, "tie_word_embeddings", tie_default, &c.tie_word_embeddings));
    KVP_TRY(opt_bool(o, what, "attention_bias", known >= 0 ? families[known].qkv_bias : 0, &c.attention_bias));
    c.qk_norm = known >= 0 ? families[known].qk_norm : 0;
    if (c.family == KVP_FAMILY_GEMMA2) KVP_TRY(read_gemma(o, what, &c));

    if (c.family == KVP_FAMILY_DEEPSEEK) {
        int64_t lora = 0, qlora = 0, rope = 0, nope = 0, vhd = 0;
        KVP_TRY(need_int(o, what, "kv_lora_rank", 1, MAX_DIM, &lora));
        KVP_TRY(need_int(o, what, "qk_rope_head_dim", 1, MAX_DIM, &rope));
        KVP_TRY(need_int(o, what, "qk_nope_head_dim", 1, MAX_DIM, &nope));
        KVP_TRY(need_int(o, what, "v_head_dim", 1, MAX_DIM, &vhd));
        KVP_TRY(opt_int(o, what, "q_lora_rank", 0, MAX_DIM, 0, &qlora));
        c.kv_lora_rank = (int32_t)lora;
        c.q_lora_rank = (int32_t)qlora;
        c.qk_rope_head_dim = (int32_t)rope;
        c.qk_nope_head_dim = (int32_t)nope;
        c.head_dim = (int32_t)(nope + rope);
        c.v_head_dim = (int32_t)vhd;
    }
    double partial;
    KVP_TRY(opt_num(o, what, "partial_rotary_factor", 1.0, &partial));
    if (!(partial > 0 && partial <= 1))
        return KVP_ERR(KVP_EPARSE, "%s: \"partial_rotary_factor\": %g is out of range (0, 1]", what, partial);
    c.rotary_dim = (int32_t)(c.head_dim * partial); /* as transformers and vLLM round it */
    if (c.rotary_dim < 1)
        return KVP_ERR(KVP_EPARSE, "%s: \"partial_rotary_factor\": %g leaves no rotary dimension of %d", what,
                       partial, c.head_dim);
    KVP_TRY(read_sliding(o, what, &c));
    KVP_TRY(read_moe(o, what, &c));
    KVP_TRY(token_id(o, what, "bos_token_id", &c.bos_token_id));
    c.eos_token_id = -1;
    c.n_eos = 0;
    KVP_TRY(kvp_model_config_eos(o, what, &c));
    KVP_TRY(check_param_count(&c, what));
    *out = c;
    return KVP_OK;
}

kvp_status kvp_model_config_load(const char *path, kvp_model_config *cfg)
{
    cJSON *root = NULL;
    KVP_TRY(kvp_json_parse_file(path, &root));
    kvp_status st = kvp_model_config_from_json(root, path, cfg);
    cJSON_Delete(root);
    return st;
}

int64_t kvp_model_kv_elems_per_token_layer(const kvp_model_config *c, int32_t layer)
{
    (void)layer; /* every layer caches the same width; sliding layers cache fewer tokens, not narrower ones */
    if (c->kv_lora_rank > 0) return (int64_t)c->kv_lora_rank + c->qk_rope_head_dim;
    return 2LL * c->num_kv_heads * c->head_dim;
}

int64_t kvp_model_kv_elems_per_token(const kvp_model_config *c)
{
    int64_t sum = 0;
    for (int32_t l = 0; l < c->num_layers; l++) sum += kvp_model_kv_elems_per_token_layer(c, l);
    return sum;
}

/* Parameter counts are summed in double: exact while the total stays below 2^53, since every term is a
 * product of non-negative integers no larger than the total; the loader rejects configs above
 * KVP_MODEL_MAX_PARAMS = 2^53, so the counts of loaded configs are exact. */

/* Attention parameters of one layer (projections, biases, q/k norms). */
static double attn_params(const kvp_model_config *c)
{
    double h = c->hidden_size, nq = c->num_q_heads, nkv = c->num_kv_heads, hd = c->head_dim;
    if (c->kv_lora_rank > 0) { /* MLA */
        double qk = (double)c->qk_nope_head_dim + c->qk_rope_head_dim, ql = c->q_lora_rank, kl = c->kv_lora_rank;
        double q = ql > 0 ? h * ql + ql + ql * nq * qk : h * nq * qk;
        double kv = h * (kl + c->qk_rope_head_dim) + kl + kl * nq * ((double)c->qk_nope_head_dim + c->v_head_dim);
        return q + kv + nq * c->v_head_dim * h;
    }
    double p = h * nq * hd + 2 * h * nkv * hd + nq * hd * h;
    if (c->attention_bias) p += nq * hd + 2 * nkv * hd;
    if (c->family == KVP_FAMILY_OPT || (c->attention_bias && strcmp(c->model_type, "llama") == 0)) p += h;
    if (c->qk_norm) p += 2 * hd;
    return p;
}

/* Parts of the count, for naming the field that makes it too large. */
enum { PART_EMBED, PART_POS, PART_ATTN, PART_FFN, PART_MOE, PART_NORM, NPARTS };

/* FFN parameters of layer l, added to part[PART_FFN] (dense) or part[PART_MOE]; `active` counts only the
 * experts a token uses. */
static void ffn_params(const kvp_model_config *c, int32_t l, int active, double *part)
{
    double h = c->hidden_size, ffn = (double)c->intermediate_size;
    if (c->family == KVP_FAMILY_OPT) {
        part[PART_FFN] += 2 * h * ffn + ffn + h;
    } else if (c->num_experts == 0 || !c->layer_is_moe[l]) {
        part[PART_FFN] += 3 * h * ffn;
    } else {
        double expert = 3 * h * (double)c->moe_intermediate_size;
        double routed = active ? c->num_experts_per_tok : c->num_experts;
        double p = routed * expert + c->num_shared_experts * expert + h * c->num_experts; /* + router */
        if (strcmp(c->model_type, "deepseek_v3") == 0) p += c->num_experts; /* e_score_correction_bias */
        part[PART_MOE] += p;
    }
}

static double norm_params(const kvp_model_config *c)
{
    double h = c->hidden_size;
    if (c->family == KVP_FAMILY_OPT) return 4 * h;                                   /* 2 LayerNorms, w + b */
    if (c->post_norms) return 4 * h; /* gemma2, gemma3: pre and post */
    return 2 * h;
}

/* The count and its parts (part[NPARTS] zeroed here). */
static double count_params(const kvp_model_config *c, int active, double *part)
{
    double h = c->hidden_size, vocab = (double)c->vocab_size;
    memset(part, 0, NPARTS * sizeof *part);
    part[PART_EMBED] = vocab * h;                                   /* token embedding */
    if (!c->tie_word_embeddings) part[PART_EMBED] += vocab * h;     /* LM head */
    if (c->family == KVP_FAMILY_OPT) {
        part[PART_POS] = ((double)c->max_position_embeddings + 2) * h; /* learned positions */
        part[PART_NORM] = 2 * h;                                    /* final LayerNorm */
    } else {
        part[PART_NORM] = h;                                        /* final norm */
    }
    part[PART_ATTN] = attn_params(c) * c->num_layers;
    part[PART_NORM] += norm_params(c) * c->num_layers;
    for (int32_t l = 0; l < c->num_layers; l++) ffn_params(c, l, active, part);
    double p = 0;
    for (int i = 0; i < NPARTS; i++) p += part[i];
    return p;
}

/* Rejects a config whose parameter count exceeds KVP_MODEL_MAX_PARAMS, naming the field behind its largest
 * part. */
static kvp_status check_param_count(const kvp_model_config *c, const char *what)
{
    double part[NPARTS];
    double p = count_params(c, 0, part);
    if (p <= (double)KVP_MODEL_MAX_PARAMS) return KVP_OK;
    int big = 0;
    for (int i = 1; i < NPARTS; i++)
        if (part[i] > part[big]) big = i;
    const char *name = "the attention";
    char field[96];
    switch (big) {
    case PART_EMBED:
        name = "the embeddings";
        snprintf(field, sizeof field, "\"vocab_size\" %lld", (long long)c->vocab_size);
        break;
    case PART_POS:
        name = "the position embeddings";
        snprintf(field, sizeof field, "\"max_position_embeddings\" %lld", (long long)c->max_position_embeddings);
        break;
    case PART_FFN:
        name = "the FFN";
        snprintf(field, sizeof field, "\"intermediate_size\" %lld", (long long)c->intermediate_size);
        break;
    case PART_MOE:
        name = "the experts";
        snprintf(field, sizeof field, "%d experts x \"moe_intermediate_size\" %lld", c->num_experts,
                 (long long)c->moe_intermediate_size);
        break;
    default:
        snprintf(field, sizeof field, "\"num_attention_heads\" %d x \"head_dim\" %d", c->num_q_heads, c->head_dim);
        break;
    }
    return KVP_ERR(KVP_EINVAL,
                   "%s: the parameter count %.3g is out of range (over 2^53), most of it in %s (%s, hidden_size %d, "
                   "%d layers)", what, p, name, field, c->hidden_size, c->num_layers);
}

/* Saturates instead of wrapping for configs the loader did not check (filled by hand or from GGUF). */
static int64_t params_i64(double p) { return p < 0x1p63 ? (int64_t)p : INT64_MAX; }

int64_t kvp_model_num_params(const kvp_model_config *c)
{
    double part[NPARTS];
    return params_i64(count_params(c, 0, part));
}

int64_t kvp_model_active_params(const kvp_model_config *c)
{
    double part[NPARTS];
    return params_i64(count_params(c, 1, part));
}
