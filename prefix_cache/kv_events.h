/* prefix_cache/kv_events.h — KV cache events in vLLM's schema (vllm/distributed/kv_events.py), as JSON lines,
 * so that a KV-aware router (Dynamo's, llm-d's) can be driven by kvpage's replays without GPUs.
 *
 *   prefix cache --listener (kvp_pc_add_listener)--> kvp_kv_events --kvp_kve_flush(ts)--> one line per batch:
 *
 *   {"seq":0,"ts":3,"events":[
 *     {"type":"BlockStored","block_hashes":[h1,h2],"parent_block_hash":h0,"token_ids":[...2 x block_size...],
 *      "block_size":16,"lora_id":null,"medium":"GPU","lora_name":null},
 *     {"type":"BlockRemoved","block_hashes":[h7,h9],"medium":"GPU"},
 *     {"type":"AllBlocksCleared"}]}
 *
 * - A line is one vLLM KVEventBatch (its msgspec tag field "type" names each event, as msgspec's JSON encoding
 *   of the tagged structs does) plus "seq", the batch's sequence number: 0, 1, 2, ... with no gap, as vLLM's
 *   publisher numbers its batches. ts is the caller's clock (bench prefix: the replay position; an engine:
 *   seconds). Batches with no event are not written and take no sequence number.
 * - block_hashes are the cache's 64-bit chain hashes (kvp_pc_chain_hashes; radix and hash caches compute the
 *   same ones), written as unsigned decimal integers: exact for Python and Rust consumers, not for JavaScript
 *   doubles. parent_block_hash is null for a chain's first block. token_ids hold block_size tokens per block.
 *   lora_id and lora_name are null (the cache knows only an opaque extra key).
 * - BlockStored: one per run of consecutive blocks an insert adds (prefix_cache.h, KVP_PC_EV_STORED).
 *   BlockRemoved: consecutive removals within a batch are merged into one event. AllBlocksCleared: a flush that
 *   emptied the cache (vLLM's reset_prefix_cache).
 *
 * Replaying the lines in order (store adds, remove deletes, clear empties) gives exactly the set of chain hashes
 * the cache holds after the last flushed batch (tests/prefix_cache/test_kv_events.c).
 *
 * Errors: an event cannot fail inside the cache, so a failure while recording one (out of memory) or writing a
 * batch (the file) is kept and returned by the next kvp_kve_flush / kvp_kve_close (KVP_ENOMEM, KVP_EIO naming
 * the file); events after it are dropped. Not thread-safe: one owner with its cache.
 */
#ifndef KVP_PREFIX_CACHE_KV_EVENTS_H
#define KVP_PREFIX_CACHE_KV_EVENTS_H

#include <stdint.h>
#include <stdio.h>

#include "common/status.h"
#include "prefix_cache/prefix_cache.h"

typedef struct kvp_kv_events kvp_kv_events;

/* Opens (truncates) path for writing; block_size >= 1 is written in every BlockStored. KVP_EIO naming the file,
 * KVP_EINVAL, KVP_ENOMEM. *out is owned by the caller (kvp_kve_close). */
kvp_status kvp_kve_open(const char *path, int32_t block_size, kvp_kv_events **out);
/* The same on an open stream f, which stays the caller's (not closed by kvp_kve_close). */
kvp_status kvp_kve_create(FILE *f, int32_t block_size, kvp_kv_events **out);

/* Listens to pc (kvp_pc_add_listener; the cache's block size must be the emitter's: KVP_EINVAL). One emitter
 * listens to one cache at a time; kvp_kve_detach stops. The cache is borrowed until detach (close detaches: close
 * or detach before destroying the cache). */
kvp_status kvp_kve_attach(kvp_kv_events *ev, kvp_prefix_cache *pc);
void kvp_kve_detach(kvp_kv_events *ev);

/* Writes the events recorded since the last flush as one batch at time ts (nothing when there are none) and
 * flushes the stream. Returns the first error kept so far (see above). */
kvp_status kvp_kve_flush(kvp_kv_events *ev, double ts);

/* Flushes (at the last ts given, 0 if none), detaches, closes the file kvp_kve_open opened, frees ev. Returns
 * the first error. NULL: KVP_OK. */
kvp_status kvp_kve_close(kvp_kv_events *ev);

/* Batches and events written so far. */
int64_t kvp_kve_batches(const kvp_kv_events *ev);
int64_t kvp_kve_events(const kvp_kv_events *ev);

#endif
