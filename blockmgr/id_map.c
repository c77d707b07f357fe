#include "blockmgr/id_map_internal.h"

#include "common/alloc.h"

enum { MIN_BITS = 4 };

static kvp_idmap_slot *alloc_slots(int bits)
{
    size_t n = (size_t)1 << bits;
    kvp_idmap_slot *s = kvp_malloc(n * sizeof *s);
    if (s == NULL) return NULL;
    for (size_t i = 0; i < n; i++) {
        s[i].key = 0;
        s[i].val = -1;
    }
    return s;
}

kvp_status kvp_idmap_init(kvp_idmap *m)
{
    m->slots = alloc_slots(MIN_BITS);
    if (m->slots == NULL) return KVP_ERR(KVP_ENOMEM, "id map: out of memory");
    m->bits = MIN_BITS;
    m->mask = ((uint64_t)1 << MIN_BITS) - 1;
    m->count = 0;
    return KVP_OK;
}

void kvp_idmap_fini(kvp_idmap *m)
{
    kvp_free(m->slots);
    m->slots = NULL;
    m->count = 0;
}

static void insert_raw(kvp_idmap *m, int64_t key, int32_t val)
{
    uint64_t i = kvp_idmap_hash_(m, key);
    while (m->slots[i].val >= 0 && m->slots[i].key != key) i = (i + 1) & m->mask;
    if (m->slots[i].val < 0) m->count++;
    m->slots[i].key = key;
    m->slots[i].val = val;
}

kvp_status kvp_idmap_reserve(kvp_idmap *m, int32_t n)
{
    int bits = m->bits;
    while (((uint64_t)n * 2) > ((uint64_t)1 << bits)) bits++;
    if (bits == m->bits) return KVP_OK;
    if (bits > 40) return KVP_ERR(KVP_ENOMEM, "id map: %d entries is too many", (int)n);
    kvp_idmap_slot *ns = alloc_slots(bits);
    if (ns == NULL) return KVP_ERR(KVP_ENOMEM, "id map: out of memory growing to %d entries", (int)n);
    kvp_idmap old = *m;
    m->slots = ns;
    m->bits = bits;
    m->mask = ((uint64_t)1 << bits) - 1;
    m->count = 0;
    for (uint64_t i = 0; i <= old.mask; i++)
        if (old.slots[i].val >= 0) insert_raw(m, old.slots[i].key, old.slots[i].val);
    kvp_free(old.slots);
    return KVP_OK;
}

void kvp_idmap_put(kvp_idmap *m, int64_t key, int32_t val) { insert_raw(m, key, val); }

void kvp_idmap_del(kvp_idmap *m, int64_t key)
{
    uint64_t i = kvp_idmap_hash_(m, key);
    for (;; i = (i + 1) & m->mask) {
        if (m->slots[i].val < 0) return;
        if (m->slots[i].key == key) break;
    }
    /* Backward shift: pull later entries of the probe run into the hole when their home allows it. */
    uint64_t hole = i;
    for (uint64_t j = (i + 1) & m->mask; m->slots[j].val >= 0; j = (j + 1) & m->mask) {
        uint64_t home = kvp_idmap_hash_(m, m->slots[j].key);
        /* j may move to hole iff home is not in the cyclic range (hole, j]. */
        int in_range = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!in_range) {
            m->slots[hole] = m->slots[j];
            hole = j;
        }
    }
    m->slots[hole].val = -1;
    m->count--;
}
