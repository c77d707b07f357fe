/* runtime/loader/safetensors.h — Hugging Face safetensors reader: one file, or a folder with
 * model.safetensors.index.json (sharded) or model.safetensors. Files are memory-mapped.
 *
 *   file: u64 header_len | JSON header (header_len bytes) | data
 *   header: {"NAME": {"dtype": "F32"|"F16"|"BF16", "shape": [...], "data_offsets": [begin, end]}, ...,
 *            "__metadata__": {...}}  (offsets relative to the data section)
 *
 * Every header field is checked before it is trusted: header length against the file size, each tensor's
 * offsets inside the data section, end - begin == numel x element size, no two tensors' bytes overlapping
 * (holes between tensors are tolerated). Errors name the file and the tensor (KVP_EPARSE; KVP_EUNSUPPORTED
 * for another dtype; KVP_EIO for a missing file or shard).
 *
 * Ownership: kvp_st_open returns an owned handle (kvp_st_close; NULL is a no-op). Views returned by
 * kvp_st_tensor borrow from the handle and stay valid until close.
 */
#ifndef KVP_RUNTIME_SAFETENSORS_H
#define KVP_RUNTIME_SAFETENSORS_H

#include <stdint.h>

#include "common/status.h"
#include "runtime/loader/tensor.h"

typedef struct kvp_st kvp_st;

/* path: a .safetensors file, or a folder (index json preferred, else model.safetensors). */
kvp_status kvp_st_open(const char *path, kvp_st **out);
void kvp_st_close(kvp_st *s);

int64_t kvp_st_num_tensors(const kvp_st *s);
void kvp_st_tensor_at(const kvp_st *s, int64_t i, kvp_tensor_view *out);
/* KVP_ENOTFOUND naming the path and the tensor when absent. */
kvp_status kvp_st_tensor(const kvp_st *s, const char *name, kvp_tensor_view *out);
int kvp_st_has(const kvp_st *s, const char *name);

#endif
