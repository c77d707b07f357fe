/* prefix_cache/prefix_cache_internal.h — private parts shared by the radix and hash caches and the eviction
 * policies (policies/policy.h): the eviction heaps and the multimap from 64-bit keys to unit indices (pc_util.c),
 * the cache struct, the generic side of the policies (pc_unit.c) and the kinds' halves (radix.c, hash.c), which
 * the dispatcher (prefix_cache.c) calls. Not for use outside prefix_cache/. */
#ifndef KVP_PREFIX_CACHE_PREFIX_CACHE_INTERNAL_H
#define KVP_PREFIX_CACHE_PREFIX_CACHE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "prefix_cache/prefix_cache.h"

/* ---- eviction heap: a binary min-heap of units (radix nodes or hash entries) keyed by (a, b, c, unit),
 * keys stored inline next to the unit so that a sift reads contiguous memory. pos[unit] is the unit's heap
 * position or -1. Capacity is reserved before any change (pc_heap_reserve), so push/remove/update never
 * allocate.
 *
 * The heap is LAZY: a unit's key in the heap may be lower than its true policy key (policy keys only grow
 * on access, lock and trim, except belady's, which the callers lower eagerly), and a unit that stopped
 * being evictable (locked, or a radix node that gained a child) may stay in the heap. Eviction pops such
 * units (dropping them, or re-keying them with their true key) until the top is evictable with an exact
 * key, which is then the true policy minimum. Invariant: every evictable unit is in the heap with a key
 * <= its true key. This keeps lock/unlock and LRU touches free of heap work.
 *
 * A policy with segments (ARC's T1 and T2) has one heap per segment; a unit sits in the heap of its segment
 * (pc_meta.seg), and a unit that changed segment may stay in the other heap until a settle drops it there. */
typedef struct {
    int64_t a, b, c;
} pc_key;

typedef struct {
    pc_key k;
    int32_t unit;
} pc_hitem;

typedef struct {
    pc_hitem *heap; /* [n] */
    int32_t *pos;   /* [cap] by unit id, -1 when not in the heap */
    int32_t n;
    size_t cap;     /* units addressable */
} pc_heap;

kvp_status pc_heap_reserve(pc_heap *h, size_t units);
void pc_heap_fini(pc_heap *h);
void pc_heap_push(pc_heap *h, int32_t unit, pc_key k);
void pc_heap_remove(pc_heap *h, int32_t unit);
void pc_heap_update(pc_heap *h, int32_t unit, pc_key k); /* unit must be in the heap */
static inline int pc_heap_has(const pc_heap *h, int32_t unit) { return h->pos[unit] >= 0; }
static inline int32_t pc_heap_top(const pc_heap *h) { return h->n ? h->heap[0].unit : -1; }
static inline pc_key pc_heap_key(const pc_heap *h, int32_t unit) { return h->heap[h->pos[unit]].k; }
int pc_key_cmp(pc_key x, pc_key y); /* -1, 0, 1 (lexicographic) */
/* Heap order holds and pos[] agrees with heap[]; returns 0 if fine. */
int pc_heap_broken(const pc_heap *h);

/* ---- multimap uint64 key -> int32 value, open addressing with linear probing and backward-shift
 * deletion; several values may share a key (the caller checks candidates). val == -1 marks empty. */
typedef struct {
    uint64_t key;
    int32_t val;
} pc_slot;

typedef struct {
    pc_slot *slots; /* [cap], cap a power of two */
    size_t cap, n;
} pc_map;

/* Makes room for `extra` more entries at load <= 1/2 (rehash). */
kvp_status pc_map_reserve(pc_map *m, size_t extra);
void pc_map_fini(pc_map *m);
void pc_map_put(pc_map *m, uint64_t key, int32_t val); /* room must be reserved */
void pc_map_del(pc_map *m, uint64_t key, int32_t val); /* the pair must be present */
/* Iteration over the values stored under key: slot = pc_map_first(m, key); while (slot >= 0) { ...
 * m->slots[slot].val ...; slot = pc_map_next(m, key, slot); } */
int64_t pc_map_first(const pc_map *m, uint64_t key);
int64_t pc_map_next(const pc_map *m, uint64_t key, int64_t slot);
void pc_map_set(pc_map *m, uint64_t key, int32_t old_val, int32_t new_val);
/* Prefetches the home slot of key (lookups of many independent keys overlap their memory latency). */
void pc_map_prefetch(const pc_map *m, uint64_t key);

/* ---- per-unit policy metadata (generic fields kept by pc_touch; seg by the policy) */
typedef struct {
    int64_t last_access, freq, insert_time;
    int32_t priority;
    int32_t seg; /* the policy's segment, 0 for single-segment policies */
} pc_meta;

#define PC_MAX_SEGS 2
struct pc_policy;


/* ---- radix node: a run of nblocks full blocks under its parent. */
typedef struct {
    int32_t parent, first_child, next_sib, prev_sib; /* node indices, -1 for none; node 0 is the root */
    int32_t nblocks, nchildren, lock, depth_end;     /* depth_end: blocks from the root to this node's end */
    int32_t *blocks;                                 /* [nblocks] block ids */
    int32_t *tokens;                                 /* [nblocks * block_size] */
    uint64_t *hashes;                                /* [nblocks] chain hash of the prefix each block ends */
    int64_t *next_use;                               /* [nblocks], belady only (else NULL) */
    uint64_t extra_key;                              /* of the first block under the root */
    uint64_t mapkey;                                 /* this node's key in pc->map */
    pc_meta m;
    int32_t free_next; /* free-list link of unused node slots; -2 while in use */
} pc_node;

/* ---- hash entry: one cached block. */
typedef struct {
    uint64_t hash;
    int32_t block, lock, depth; /* depth: block index in its chain */
    int32_t free_next;          /* -2 while in use */
    int64_t next_use;
    pc_meta m;
} pc_entry;

struct kvp_prefix_cache {
    kvp_pc_kind kind;
    kvp_evict_policy policy;
    const struct pc_policy *pol; /* policies/<name>.c */
    void *pol_state;             /* the policy's own state (owned by it: init / fini) */
    int nseg;                    /* pol->nseg */
    int64_t seg_blocks[PC_MAX_SEGS]; /* cached blocks per segment */
    int flushing;                /* inside kvp_pc_flush: no eviction hooks, no ghosts */
    kvp_block_pool *pool; /* borrowed */
    int32_t bs;
    int64_t clock;        /* one tick per access */
    kvp_pc_evict_fn on_evict; /* eviction hook, or NULL */
    void *on_evict_ctx;
    struct {
        kvp_pc_event_fn fn;
        void *ctx;
    } listeners[KVP_PC_MAX_LISTENERS];
    int nlisteners;
    kvp_pc_stats st;
    int32_t *block_unit;  /* [num_blocks of the pool]: node (radix) / entry (hash) caching the block, or -1 */
    int32_t nblock_ids;
    pc_heap heaps[PC_MAX_SEGS]; /* one per segment; [0] only for single-segment policies */
    pc_map map;           /* radix: (parent, first block) -> child; hash: chain hash -> entry */
    /* radix */
    pc_node *nodes;
    size_t nodes_cap;
    int32_t nodes_used, node_free;
    /* hash */
    pc_entry *ents;
    size_t ents_cap;
    int32_t ents_used, ent_free;
    uint64_t *scr_h; /* insert scratch: chain hashes and entries of the positions */
    int32_t *scr_e;
    uint8_t *scr_new; /* insert scratch: which positions were not cached */
    size_t scr_h_cap, scr_e_cap, scr_new_cap;
};

/* pc_unit.c (the generic side of the policies, shared by prefix_cache.c, radix.c and hash.c) */
struct pc_unit_s;
/* The unit's true policy key. */
pc_key pc_unit_key(const kvp_prefix_cache *pc, const pc_meta *m, const struct pc_unit_s *u);
/* Records an access on a unit (clock, frequency, sticky priority, then the policy's access hook) and keeps the
 * per-segment block counts; returns the unit's segment before the access (the caller re-queues the unit when
 * it changed and the unit is evictable: pc_requeue). */
int pc_touch(kvp_prefix_cache *pc, pc_meta *m, const struct pc_unit_s *u, const kvp_pc_hint *hint);
/* Puts an evictable unit into its segment's heap if it is not there. */
void pc_requeue(kvp_prefix_cache *pc, int32_t unit, const pc_meta *m, pc_key k);
/* The heap of a unit's segment. */
static inline pc_heap *pc_heap_of(kvp_prefix_cache *pc, const pc_meta *m) { return &pc->heaps[m->seg]; }
/* After a unit's true key became `k`: lowers its heap key when k is lower (lazy heap); no-op if absent. */
void pc_heap_lower(pc_heap *h, int32_t unit, pc_key k);
/* The kind's view of a unit for the lazy heaps: its true key, whether it is evictable, its segment. */
typedef pc_key (*pc_unit_key_fn)(const kvp_prefix_cache *pc, int32_t unit, int *evictable, int *seg);
/* Lazy heap of segment `seg`: drops top units that stopped being evictable or left the segment and re-keys
 * stale ones until the top is exact; returns it (still in the heap), or -1 when the heap empties. Each unit is
 * dropped or re-keyed once, so this ends. */
int32_t pc_heap_settle(kvp_prefix_cache *pc, int seg, pc_unit_key_fn key);
/* The next victim in policy order: settles the policy's victim segment (victim_seg), else the others; returns
 * the unit, still in heap *seg_out. -1 only when nothing is evictable. */
int32_t pc_pick_victim(kvp_prefix_cache *pc, pc_unit_key_fn key, int *seg_out);
/* Reserves room in every heap for `units` units. */
kvp_status pc_heaps_reserve(kvp_prefix_cache *pc, size_t units);
/* A block of a unit with metadata m leaves by eviction or flush: the policy's hook (not during a flush). */
void pc_policy_evicted(kvp_prefix_cache *pc, const pc_meta *m, uint64_t hash);
/* An insert may add n_new blocks: the policy's reserve hook (KVP_ENOMEM, nothing changed). */
kvp_status pc_policy_reserve(kvp_prefix_cache *pc, int64_t n_new);
/* A follower's attach (kv_events.c, ledger.c): adds fn(ctx) as pc's listener and sets *followed = pc, when
 * *followed is NULL (one cache at a time) and pc's block size is bs. KVP_EINVAL naming `what` otherwise. */
kvp_status pc_follow(kvp_prefix_cache **followed, kvp_prefix_cache *pc, int32_t bs, kvp_pc_event_fn fn, void *ctx,
                     const char *what);
/* Its detach: removes the listener from *followed, if any, and clears *followed. */
void pc_unfollow(kvp_prefix_cache **followed, kvp_pc_event_fn fn, void *ctx);
/* Whether accesses carry next-use hints (belady): arrays kept per block, keys lowered eagerly. */
int pc_uses_next_use(const kvp_prefix_cache *pc);
/* Calls every listener (kvp_pc_add_listener) with ev. */
void pc_emit(const kvp_prefix_cache *pc, const kvp_pc_event *ev);
static inline int pc_listening(const kvp_prefix_cache *pc) { return pc->nlisteners > 0; }
kvp_status pc_check_blocks(const kvp_prefix_cache *pc, const int32_t *blocks, int32_t n);

/* radix.c / hash.c: the kind-specific halves of the public calls (arguments already validated). */
kvp_status pc_radix_init(kvp_prefix_cache *pc);
void pc_radix_fini(kvp_prefix_cache *pc);
kvp_status pc_radix_match(kvp_prefix_cache *pc, const int32_t *tokens, int32_t maxb, const kvp_pc_hint *hint, int lock,
                          int32_t *blocks_out, int32_t *n_hit);
kvp_status pc_radix_insert(kvp_prefix_cache *pc, const int32_t *tokens, const int32_t *blocks, int32_t n_blocks,
                           const kvp_pc_hint *hint, int lock, int32_t *cached_out);
kvp_status pc_radix_unlock(kvp_prefix_cache *pc, const int32_t *blocks, int32_t n);
void pc_radix_evict_one(kvp_prefix_cache *pc, int32_t *freed);
kvp_status pc_radix_check(const kvp_prefix_cache *pc);
kvp_status pc_radix_visit(const kvp_prefix_cache *pc, kvp_pc_visit_fn fn, void *ctx);

kvp_status pc_hash_init(kvp_prefix_cache *pc);
void pc_hash_fini(kvp_prefix_cache *pc);
kvp_status pc_hash_match(kvp_prefix_cache *pc, const int32_t *tokens, int32_t maxb, const kvp_pc_hint *hint, int lock,
                         int32_t *blocks_out, int32_t *n_hit);
kvp_status pc_hash_insert(kvp_prefix_cache *pc, const int32_t *tokens, const int32_t *blocks, int32_t n_blocks,
                          const kvp_pc_hint *hint, int lock, int32_t *cached_out);
kvp_status pc_hash_unlock(kvp_prefix_cache *pc, const int32_t *blocks, int32_t n);
void pc_hash_evict_one(kvp_prefix_cache *pc, int32_t *freed);
kvp_status pc_hash_check(const kvp_prefix_cache *pc);
kvp_status pc_hash_visit(const kvp_prefix_cache *pc, kvp_pc_visit_fn fn, void *ctx);

#endif
