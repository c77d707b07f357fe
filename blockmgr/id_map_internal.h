/* blockmgr/id_map_internal.h — open-addressing hash map int64_t key -> int32_t value (>= 0), for blockmgr/.
 *
 * Linear probing in a power-of-two table kept at most half full; deletion by backward shift (no
 * tombstones), so lookups stay short under any churn. Growth is the only allocation and happens in
 * kvp_idmap_reserve, so a caller can reserve first (may fail) and put later (cannot fail).
 *
 *   slots: [ (k=17,v=0) | empty | (k=4,v=2) | (k=90,v=1) | empty | ... ]      empty: val == -1
 */
#ifndef KVP_BLOCKMGR_ID_MAP_INTERNAL_H
#define KVP_BLOCKMGR_ID_MAP_INTERNAL_H

#include <stdint.h>

#include "common/status.h"

typedef struct {
    int64_t key;
    int32_t val; /* -1: empty */
} kvp_idmap_slot;

typedef struct {
    kvp_idmap_slot *slots; /* [mask + 1], owned */
    uint64_t mask;
    int32_t count;
    int bits;
} kvp_idmap;

kvp_status kvp_idmap_init(kvp_idmap *m);
void kvp_idmap_fini(kvp_idmap *m);
/* Room for `n` entries in total without growing. KVP_ENOMEM leaves the map as it was. */
kvp_status kvp_idmap_reserve(kvp_idmap *m, int32_t n);
/* Inserts or overwrites; the caller reserved room for count + 1 entries. */
void kvp_idmap_put(kvp_idmap *m, int64_t key, int32_t val);
/* Removes key if present. */
void kvp_idmap_del(kvp_idmap *m, int64_t key);

static inline uint64_t kvp_idmap_hash_(const kvp_idmap *m, int64_t key)
{
    return ((uint64_t)key * 0x9E3779B97F4A7C15ull) >> (64 - m->bits);
}

/* Value for key, or -1. */
static inline int32_t kvp_idmap_get(const kvp_idmap *m, int64_t key)
{
    for (uint64_t i = kvp_idmap_hash_(m, key);; i = (i + 1) & m->mask) {
        const kvp_idmap_slot *s = &m->slots[i];
        if (s->val < 0) return -1;
        if (s->key == key) return s->val;
    }
}

#endif
