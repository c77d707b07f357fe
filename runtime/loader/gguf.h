/* runtime/loader/gguf.h — GGUF (v2/v3) reader: metadata key/values, tensor directory, memory-mapped data.
 *
 *   file:  "GGUF" u32 version | u64 n_tensors | u64 n_kv | n_kv x (key, u32 type, value)
 *          | n_tensors x (name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset)
 *          | padding to general.alignment (default 32) | tensor data (offsets relative to here)
 *
 * Every count, length and offset is checked against the file's size before it is used, and no two tensors'
 * data may overlap: a truncated or corrupted file gives KVP_EPARSE (KVP_EUNSUPPORTED for a valid but
 * unsupported version or tensor type) with a message naming the file, the field and the byte offset.
 * Tensor types: F32, F16, BF16 and ggml's quantized Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K,
 * Q6_K (runtime/loader/tensor.h); a quantized tensor's rows must be whole blocks (KVP_EPARSE naming it otherwise).
 *
 * Ownership: kvp_gguf_open returns an owned handle (kvp_gguf_close; NULL is a no-op). Every pointer the
 * getters return (strings, tensor data, names) points into the handle and stays valid until close.
 * Strings from the file are NOT NUL-terminated: use kvp_gguf_str's len.
 */
#ifndef KVP_RUNTIME_GGUF_H
#define KVP_RUNTIME_GGUF_H

#include <stdint.h>

#include "common/status.h"
#include "runtime/loader/model_config.h"
#include "runtime/loader/tensor.h"

typedef enum {
    KVP_GGUF_UINT8 = 0,
    KVP_GGUF_INT8 = 1,
    KVP_GGUF_UINT16 = 2,
    KVP_GGUF_INT16 = 3,
    KVP_GGUF_UINT32 = 4,
    KVP_GGUF_INT32 = 5,
    KVP_GGUF_FLOAT32 = 6,
    KVP_GGUF_BOOL = 7,
    KVP_GGUF_STRING = 8,
    KVP_GGUF_ARRAY = 9,
    KVP_GGUF_UINT64 = 10,
    KVP_GGUF_INT64 = 11,
    KVP_GGUF_FLOAT64 = 12,
    KVP_GGUF_TYPE_COUNT
} kvp_gguf_type;

typedef struct {
    const char *ptr; /* into the map; not NUL-terminated */
    uint64_t len;
} kvp_gguf_str;

typedef struct kvp_gguf kvp_gguf;

kvp_status kvp_gguf_open(const char *path, kvp_gguf **out);
void kvp_gguf_close(kvp_gguf *g);

const char *kvp_gguf_path(const kvp_gguf *g);
uint32_t kvp_gguf_version(const kvp_gguf *g);

/* Tensors. kvp_gguf_tensor: KVP_ENOTFOUND naming the file and the tensor when absent. */
int64_t kvp_gguf_num_tensors(const kvp_gguf *g);
void kvp_gguf_tensor_at(const kvp_gguf *g, int64_t i, kvp_tensor_view *out); /* 0 <= i < num_tensors */
kvp_status kvp_gguf_tensor(const kvp_gguf *g, const char *name, kvp_tensor_view *out);

/* Metadata. Absent key: KVP_OK with *present = 0 and *out untouched (present may be NULL only when the
 * caller requires the key: then absence is KVP_ENOTFOUND naming it). Present with another type:
 * KVP_EPARSE naming the key and both types. */
kvp_status kvp_gguf_get_int(const kvp_gguf *g, const char *key, int64_t *out, int *present);  /* any int/bool */
kvp_status kvp_gguf_get_float(const kvp_gguf *g, const char *key, double *out, int *present); /* float or int */
kvp_status kvp_gguf_get_str(const kvp_gguf *g, const char *key, kvp_gguf_str *out, int *present);
/* Arrays: element type and length. */
kvp_status kvp_gguf_get_arr(const kvp_gguf *g, const char *key, kvp_gguf_type *elem, uint64_t *n, int *present);
/* A string array: *strs borrowed from g (n entries). KVP_EPARSE when the key is not a string array. */
kvp_status kvp_gguf_arr_str(const kvp_gguf *g, const char *key, const kvp_gguf_str **strs, uint64_t *n);
/* A numeric array converted into out[n] (caller-owned; n must equal the array's length). */
kvp_status kvp_gguf_arr_f32(const kvp_gguf *g, const char *key, float *out, uint64_t n);
kvp_status kvp_gguf_arr_i32(const kvp_gguf *g, const char *key, int32_t *out, uint64_t n);

/* A special token id (tokenizer.ggml.bos_token_id, ...): *id = the id, or -1 when the key is absent or holds
 * the "none" value -1 / 0xFFFFFFFF. Any other id outside [0, n_vocab) is KVP_EPARSE naming the file and the
 * key (a model whose BOS silently disappears would run on other inputs than it was trained on). */
kvp_status kvp_gguf_special_token(const kvp_gguf *g, const char *key, int64_t n_vocab, int64_t *id);

/* Fills a model config from the metadata of a "llama"/"mistral"/"qwen2"/"qwen3" GGUF
 * (ARCH.block_count, .embedding_length, .feed_forward_length, .attention.head_count(_kv),
 * .attention.key_length, .rope.freq_base, .attention.layer_norm_rms_epsilon, .context_length,
 * tokenizer.ggml.bos/eos_token_id, vocab from the token_embd tensor or the token list).
 * KVP_EUNSUPPORTED naming the architecture otherwise, or when ARCH.rope.dimension_count is not the head
 * dimension (partial rotary); KVP_EPARSE naming the key for a value out of range (rope.freq_base not a
 * positive finite number, layer_norm_rms_epsilon outside (0, 1], a BOS/EOS id outside the vocabulary).
 * *cfg written only on success. */
kvp_status kvp_gguf_model_config(const kvp_gguf *g, kvp_model_config *cfg);

#endif
