/* runtime/loader/safetensors.h — Hugging Face safetensors reader, memory-mapped: a file, or a folder with
 * model.safetensors.index.json (shards) or model.safetensors.
 *
 *   file: u64 header_len | JSON header | data
 *   header: {"NAME": {"dtype": "F32"|"F16"|"BF16", "shape": [...], "data_offsets": [begin, end]}, ...,
 *            "__metadata__": {...}}  (offsets relative to the data section)
 *
 * Every header field is checked before it is trusted (lengths, offsets inside the data, end - begin = numel
 * x element size, no overlap; holes are tolerated). Errors name file and tensor: KVP_EPARSE, KVP_ENOTFOUND,
 * KVP_EUNSUPPORTED (dtype), KVP_EIO (a missing file or shard). Views borrow from the handle until close. */
#ifndef KVP_RUNTIME_SAFETENSORS_H
#define KVP_RUNTIME_SAFETENSORS_H

#include <stdint.h>

#include "common/status.h"
#include "runtime/loader/tensor.h"

typedef struct kvp_st kvp_st;

/* A folder prefers the index json. *out is the caller's. */
kvp_status kvp_st_open(const char *path, kvp_st **out);
void kvp_st_close(kvp_st *s); /* NULL: no-op */

int64_t kvp_st_num_tensors(const kvp_st *s);
void kvp_st_tensor_at(const kvp_st *s, int64_t i, kvp_tensor_view *out);
kvp_status kvp_st_tensor(const kvp_st *s, const char *name, kvp_tensor_view *out); /* KVP_ENOTFOUND */
int kvp_st_has(const kvp_st *s, const char *name);

#endif
