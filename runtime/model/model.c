/* runtime/model/model.c — loading a model, its getters and setters (the parts: model_internal.h). */
#include "runtime/model/model_internal.h"

#include <cblas.h>
#include <dirent.h>
#if defined(__FMA__) || defined(__F16C__)
#include <immintrin.h>
#endif
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "attention/attention.h"
#include "common/alloc.h"
#include "common/cpu.h"
#include "common/json.h"
#include "common/timer.h"
#include "parallel/comm.h"
#include "parallel/shard.h"
#include "runtime/loader/gguf.h"
#include "runtime/loader/safetensors.h"

static kvp_status init_positions(kvp_model *m)
{
    m->rot = kvp_rotary_dim(&m->cfg);
    m->inv_freq = kvp_malloc((size_t)(m->rot / 2) * sizeof(double));
    if (!m->inv_freq) return KVP_ERR(KVP_ENOMEM, "out of memory");
    if (m->cfg.rope_local_theta > 0) {
        m->inv_freq_local = kvp_malloc((size_t)(m->rot / 2) * sizeof(double));
        if (!m->inv_freq_local) return KVP_ERR(KVP_ENOMEM, "out of memory");
        for (int32_t i = 0; i < m->rot / 2; i++)
            m->inv_freq_local[i] = 1.0 / pow(m->cfg.rope_local_theta, 2.0 * i / m->rot);
    }
    const int64_t ctx = kvp_model_config_context(&m->cfg);
    m->context = ctx > 0 && ctx < INT32_MAX ? (int32_t)ctx : INT32_MAX;
    mdl_set_rope(m);
    return KVP_OK;
}

/* This rank's shard of the model (all of it without a communicator). */
kvp_status mdl_shard(kvp_model *m, kvp_comm *comm, const char *what)
{
    const kvp_model_config *c = &m->cfg;
    const int tp = comm ? kvp_comm_size(comm) : 1, rank = comm ? kvp_comm_rank(comm) : 0;
    if (kvp_tp_shard_of(tp, rank, c->num_q_heads, c->num_kv_heads, c->intermediate_size, c->vocab_size, &m->tp) !=
        KVP_OK)
        return KVP_ERR(KVP_EINVAL, "%s: cannot split the model over %d ranks: %s", what, tp, kvp_error_message());
    if (m->tp.nv < 1)
        return KVP_ERR(KVP_EINVAL, "%s: the %lld-token vocabulary leaves rank %d of %d no rows", what,
                       (long long)c->vocab_size, rank, tp);
    m->mff0 = m->tp.ff0, m->mnff = m->tp.nff;
    kvp_tp_shard e;
    if (c->num_experts > 0) { /* each expert's units split as a dense FFN's (vLLM's tensor-parallel experts) */
        if (kvp_tp_shard_of(tp, rank, c->num_q_heads, c->num_kv_heads, c->moe_intermediate_size, c->vocab_size,
                            &e) != KVP_OK)
            return KVP_ERR(KVP_EINVAL, "%s: cannot split the experts over %d ranks: %s", what, tp,
                           kvp_error_message());
        m->mff0 = e.ff0, m->mnff = e.nff;
    }
    m->comm = comm;
    return KVP_OK;
}

static int is_dir(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* KVP_EINVAL for a folder without config.json: what --model takes, and the folder's GGUF file if it has one. */
static kvp_status check_hf_folder(const char *dir, const char *cfgpath)
{
    struct stat sb;
    if (stat(cfgpath, &sb) == 0) return KVP_OK;
    char gguf[256] = "";
    DIR *d = opendir(dir);
    for (struct dirent *e; d && !gguf[0] && (e = readdir(d)) != NULL;)
        if (ends_with(e->d_name, ".gguf")) snprintf(gguf, sizeof gguf, "%s", e->d_name);
    if (d) closedir(d);
    if (gguf[0])
        return KVP_ERR(KVP_EINVAL, "%s: a model folder needs config.json beside its *.safetensors; this one holds "
                       "%s, a GGUF file: pass that file", dir, gguf);
    return KVP_ERR(KVP_EINVAL, "%s: no config.json here: a model is a GGUF file, or a Hugging Face folder with "
                   "config.json and *.safetensors", dir);
}

kvp_status kvp_model_load(const char *path, kvp_model **out) { return kvp_model_load_tp(path, NULL, out); }

kvp_status kvp_model_load_tp(const char *path, kvp_comm *comm, kvp_model **out)
{
    return kvp_model_load_ex(path, comm, KVP_WEIGHT_F32, out);
}

static const char *const k_weight_names[] = {"f32", "f16", "bf16", "q8_0", "auto"};

kvp_status kvp_weight_type_parse(const char *s, kvp_weight_type *out)
{
    for (int i = 0; i < (int)(sizeof k_weight_names / sizeof *k_weight_names); i++)
        if (strcmp(s, k_weight_names[i]) == 0) {
            *out = (kvp_weight_type)i;
            return KVP_OK;
        }
    /* the planner's spellings (and PyTorch's) of the same types */
    if (strcmp(s, "fp32") == 0 || strcmp(s, "float32") == 0) return *out = KVP_WEIGHT_F32, KVP_OK;
    if (strcmp(s, "fp16") == 0 || strcmp(s, "float16") == 0) return *out = KVP_WEIGHT_F16, KVP_OK;
    if (strcmp(s, "bfloat16") == 0) return *out = KVP_WEIGHT_BF16, KVP_OK;
    return KVP_ERR(KVP_EINVAL, "unknown weight type '%s' (f32, f16, bf16, q8_0 or auto; fp32 and fp16 also)", s);
}

const char *kvp_weight_type_name(kvp_weight_type t)
{
    return (unsigned)t < sizeof k_weight_names / sizeof *k_weight_names ? k_weight_names[t] : "?";
}

/* OpenBLAS's pthread build: stops its server threads, which it starts again for its next threaded product
 * (OpenBLAS does the same before a fork). Weak: other builds lack it. */
extern int blas_thread_shutdown_(void) __attribute__((weak));

kvp_status kvp_model_load_ex(const char *path, kvp_comm *comm, kvp_weight_type weights, kvp_model **out)
{
    if (!path || !out) return KVP_ERR(KVP_EINVAL, "kvp_model_load: NULL argument");
    if (strlen(path) >= 900) return KVP_ERR(KVP_EINVAL, "model path too long");
    if ((unsigned)weights > KVP_WEIGHT_AUTO) return KVP_ERR(KVP_EINVAL, "kvp_model_load_ex: weight type %d", (int)weights);
    kvp_model *m = kvp_calloc(1, sizeof *m);
    if (!m) return KVP_ERR(KVP_ENOMEM, "%s: out of memory", path);
    snprintf(m->path, sizeof m->path, "%s", path);
    m->threads = 1;
    m->lanes = kvp_cpu_max_lanes();
    m->wtype = weights;
    kvp_status st = KVP_OK;
    kvp_gguf *g = NULL;
    kvp_st *s = NULL;
    source src = {0};
    src.what = path;
    char cfgpath[1100] = "";
    if (!is_dir(path) && !ends_with(path, ".safetensors")) {
        m->is_gguf = 1;
        if ((st = kvp_gguf_open(path, &g)) != KVP_OK) goto fail;
        if ((st = kvp_gguf_model_config(g, &m->cfg)) != KVP_OK) goto fail;
        /* llama.cpp permutes llama/mistral Q/K rows for paired RoPE; qwen, phi3 and gemma GGUFs keep HF's
         * rotate-half. */
        const kvp_model_family fam = m->cfg.family;
        m->rope = strncmp(m->cfg.model_type, "qwen", 4) == 0 || fam == KVP_FAMILY_PHI3 || fam == KVP_FAMILY_GEMMA2
                      ? KVP_ROPE_HALF
                      : KVP_ROPE_PAIRS;
        src.g = g;
    } else {
        if (is_dir(path)) {
            size_t n = strlen(path);
            while (n > 1 && path[n - 1] == '/') n--; /* "dir/" names dir/config.json, not dir//config.json */
            snprintf(cfgpath, sizeof cfgpath, "%.*s/config.json", (int)n, path);
            if ((st = check_hf_folder(path, cfgpath)) != KVP_OK) goto fail;
        } else {
            const char *slash = strrchr(path, '/');
            int dl = slash ? (int)(slash - path) : 1;
            snprintf(cfgpath, sizeof cfgpath, "%.*s/config.json", dl, slash ? path : ".");
        }
        if ((st = kvp_model_config_load(cfgpath, &m->cfg)) != KVP_OK) goto fail;
        if ((st = mdl_generation_config(cfgpath, &m->cfg)) != KVP_OK) goto fail;
        m->rope = KVP_ROPE_HALF;
        if ((st = kvp_st_open(path, &s)) != KVP_OK) goto fail;
        src.s = s;
        if (!kvp_st_has(s, "model.embed_tokens.weight"))
            src.wrap = kvp_st_has(s, "language_model.model.embed_tokens.weight")   ? 1
                       : kvp_st_has(s, "model.language_model.embed_tokens.weight") ? 2
                                                                                   : 0;
    }
    if ((st = mdl_check_config(&m->cfg, m->is_gguf ? path : cfgpath, m->is_gguf)) != KVP_OK) goto fail;
    if ((st = mdl_shard(m, comm, path)) != KVP_OK) goto fail;
    if ((st = init_positions(m)) != KVP_OK) goto fail;
    if ((st = mdl_load_weights(m, &src)) != KVP_OK) goto fail;
    if (weights == KVP_WEIGHT_AUTO) m->wtype = mdl_held_type(m);
    kvp_gguf_close(g);
    kvp_st_close(s);
    /* One thread by default: OpenMP threads spinning on an oversubscribed machine cost far more than they
     * bring to small batches. */
    kvp_model_set_threads(m, 1);
    /* The invariant matmul (the default) never calls BLAS, but OpenBLAS's threads, started as it loads,
     * spin-yield for ~100 ms: on 2 cores they took one from the forward pass's threads (the first 64-sequence
     * stories260K decode of a process took 137-145 ms instead of 77 in 4 runs of 6; now 77-92). */
    if (blas_thread_shutdown_) blas_thread_shutdown_();
    *out = m;
    return KVP_OK;
fail:
    kvp_gguf_close(g);
    kvp_st_close(s);
    kvp_model_destroy(m);
    return st;
}

const kvp_model_config *kvp_model_cfg(const kvp_model *m) { return &m->cfg; }
kvp_comm *kvp_model_comm(const kvp_model *m) { return m->comm; }
kvp_rope_style kvp_model_rope_style(const kvp_model *m) { return m->rope; }
const char *kvp_model_path(const kvp_model *m) { return m->path; }
int kvp_model_is_gguf(const kvp_model *m) { return m->is_gguf; }
kvp_weight_type kvp_model_weight_type(const kvp_model *m) { return m->wtype; }

kvp_dtype kvp_model_kv_dtype_auto(const kvp_model *m)
{
    switch (m->wtype) {
    case KVP_WEIGHT_F32: return KVP_DTYPE_F32;
    case KVP_WEIGHT_BF16: return KVP_DTYPE_BF16;
    default: return KVP_DTYPE_F16;
    }
}

kvp_status kvp_kv_dtype_parse(const char *s, kvp_dtype *out, int *is_auto)
{
    *is_auto = strcmp(s, "auto") == 0;
    if (*is_auto) return KVP_OK;
    if (kvp_dtype_parse(s, out) == KVP_OK) return KVP_OK;
    return KVP_ERR(KVP_EINVAL, "unknown KV cache dtype '%s' (use auto, f32, f16, bf16 or fp8; fp32 and fp16 also)", s);
}

int kvp_model_is_eos(const kvp_model *m, int32_t id)
{
    for (int32_t i = 0; i < m->cfg.n_eos; i++)
        if (m->cfg.eos_token_ids[i] == id) return 1;
    return 0;
}
int32_t kvp_model_max_len(const kvp_model *m)
{
    return m->max_len_cap > 0 && m->max_len_cap < m->context ? m->max_len_cap : m->context;
}

kvp_status kvp_model_set_max_len(kvp_model *m, int32_t n)
{
    kvp_status st = KVP_OK;
    m->max_len_cap = 0;
    if (n > m->context)
        st = KVP_ERR(KVP_EINVAL, "max_model_len %d exceeds the context of %s (%d tokens)", n, m->path, m->context);
    else m->max_len_cap = n > 0 ? n : 0;
    mdl_set_rope(m);
    return st;
}

int kvp_model_get_threads(const kvp_model *m) { return m->threads; }

void kvp_model_set_threads(kvp_model *m, int n)
{
    if (n < 1) n = 1;
    m->threads = n;
    kvp_attn_set_threads(n); /* OpenBLAS's count is set where a BLAS product runs (matmul) */
}

void kvp_model_set_matmul(kvp_model *m, kvp_matmul_kind k) { m->matmul = k; }

void kvp_model_set_skip_attention(kvp_model *m, int on) { m->skip_attention = on != 0; }

kvp_status kvp_model_set_lanes(kvp_model *m, int lanes)
{
    if (lanes != 8 && lanes != 16)
        return KVP_ERR(KVP_EINVAL, "matmul lanes must be 8 or 16, not %d", lanes);
    if (lanes > kvp_cpu_max_lanes())
        return KVP_ERR(KVP_EUNSUPPORTED,
                       "16-lane matmul needs AVX-512 (F, BW and VL), which this CPU (or build) lacks");
    m->lanes = lanes;
    return KVP_OK;
}

int kvp_model_lanes(const kvp_model *m) { return m->lanes; }

kvp_status kvp_matmul_kind_parse(const char *s, kvp_matmul_kind *out)
{
    if (strcmp(s, "invariant") == 0) *out = KVP_MATMUL_INVARIANT;
    else if (strcmp(s, "blas") == 0) *out = KVP_MATMUL_BLAS;
    else return KVP_ERR(KVP_EINVAL, "unknown matmul '%s' (use invariant or blas)", s);
    return KVP_OK;
}

const char *kvp_matmul_kind_name(kvp_matmul_kind k) { return k == KVP_MATMUL_BLAS ? "blas" : "invariant"; }

