/* attention/attn_ref.c — dense references: contiguous f32 K/V, float64 accumulation, one thread, no
 * tricks (two passes: max, then sum of exp). The CPU and CUDA kernels are tested against these. */
#include <math.h>

#include "attention/attention.h"
#include "common/alloc.h"

kvp_status kvp_attn_prefill_ref(const float *k, const float *v, const int32_t *kv_seq_indptr, int32_t num_seqs,
                                int32_t num_kv_heads, int32_t head_dim, const float *q, const int32_t *qo_indptr,
                                float *out, const kvp_attn_params *p)
{
    if (k == NULL || v == NULL || kv_seq_indptr == NULL || q == NULL || qo_indptr == NULL || out == NULL || p == NULL)
        return KVP_ERR(KVP_EINVAL, "prefill_ref: a pointer argument is NULL");
    if (num_seqs < 0 || num_kv_heads < 1 || head_dim < 1 || p->num_q_heads < 1 || p->num_q_heads % num_kv_heads)
        return KVP_ERR(KVP_EINVAL, "prefill_ref: bad sizes (num_seqs %d, num_kv_heads %d, head_dim %d, num_q_heads %d)",
                       num_seqs, num_kv_heads, head_dim, p->num_q_heads);
    for (int32_t s = 0; s < num_seqs; s++) {
        int32_t L = kv_seq_indptr[s + 1] - kv_seq_indptr[s], nq = qo_indptr[s + 1] - qo_indptr[s];
        if (L < 0 || nq < 0 || nq > L)
            return KVP_ERR(KVP_EINVAL, "prefill_ref: sequence %d has %d query tokens and %d keys", s, nq, L);
    }
    const int32_t H = p->num_q_heads, G = H / num_kv_heads, D = head_dim;
    const double scale = p->sm_scale > 0.0f ? (double)p->sm_scale : 1.0 / sqrt((double)D);
    const double cap = (double)p->logits_soft_cap;
    double *w = kvp_malloc(sizeof(double) * (size_t)(kv_seq_indptr[num_seqs] - kv_seq_indptr[0] + 1));
    double *acc = kvp_malloc(sizeof(double) * (size_t)D);
    if (w == NULL || acc == NULL) {
        kvp_free(w);
        kvp_free(acc);
        return KVP_ERR(KVP_ENOMEM, "prefill_ref: out of memory");
    }
    for (int32_t s = 0; s < num_seqs; s++) {
        int32_t L = kv_seq_indptr[s + 1] - kv_seq_indptr[s], nq = qo_indptr[s + 1] - qo_indptr[s];
        for (int32_t i = 0; i < nq; i++)
            for (int32_t h = 0; h < H; h++) {
                int64_t row = ((int64_t)qo_indptr[s] + i) * H + h;
                const float *qr = q + row * D;
                int32_t pos = L - nq + i, lo = 0;
                if (p->window_left >= 0 && pos - p->window_left > 0) lo = pos - p->window_left;
                double mx = -INFINITY;
                for (int32_t j = lo; j <= pos; j++) {
                    const float *kr = k + (((int64_t)kv_seq_indptr[s] + j) * num_kv_heads + h / G) * D;
                    double dot = 0.0;
                    for (int32_t d = 0; d < D; d++) dot += (double)qr[d] * (double)kr[d];
                    w[j] = cap > 0 ? cap * tanh(dot * scale / cap) : dot * scale;
                    if (w[j] > mx) mx = w[j];
                }
                double sum = 0.0;
                for (int32_t d = 0; d < D; d++) acc[d] = 0.0;
                for (int32_t j = lo; j <= pos; j++) {
                    double e = exp(w[j] - mx);
                    sum += e;
                    const float *vr = v + (((int64_t)kv_seq_indptr[s] + j) * num_kv_heads + h / G) * D;
                    for (int32_t d = 0; d < D; d++) acc[d] += e * (double)vr[d];
                }
                for (int32_t d = 0; d < D; d++) out[row * D + d] = (float)(acc[d] / sum);
                if (p->lse) p->lse[row] = (float)(mx + log(sum));
            }
    }
    kvp_free(w);
    kvp_free(acc);
    return KVP_OK;
}

kvp_status kvp_attn_decode_ref(const float *k, const float *v, const int32_t *kv_seq_indptr, int32_t num_seqs,
                               int32_t num_kv_heads, int32_t head_dim, const float *q, float *out,
                               const kvp_attn_params *p)
{
    if (num_seqs < 0) return KVP_ERR(KVP_EINVAL, "decode_ref: num_seqs %d < 0", num_seqs);
    int32_t *qo = kvp_malloc(sizeof(int32_t) * ((size_t)num_seqs + 1));
    if (qo == NULL) return KVP_ERR(KVP_ENOMEM, "decode_ref: out of memory");
    for (int32_t s = 0; s <= num_seqs; s++) qo[s] = s;
    kvp_status st = kvp_attn_prefill_ref(k, v, kv_seq_indptr, num_seqs, num_kv_heads, head_dim, q, qo, out, p);
    kvp_free(qo);
    return st;
}
