/* prefix_cache/host_cache.c — the host tier of the prefix cache: chain hash -> slot map and an LRU list
 * over the slots (contract in host_cache.h). */
#include "prefix_cache/host_cache.h"

#include <string.h>

#include "common/alloc.h"
#include "prefix_cache/prefix_cache_internal.h"

/* Slots are linked into one list: held slots from the least (head) to the most (tail) recently used, or
 * the free stack (free_head, through next[]). */
struct kvp_host_cache {
    int32_t cap;
    uint64_t *hash; /* [cap] the block each held slot holds */
    int32_t *prev, *next; /* [cap] LRU links (-1: none); next[] also links the free stack */
    uint8_t *held;  /* [cap] */
    int32_t head, tail, free_head;
    pc_map map;     /* hash -> slot */
    kvp_hc_stats st;
};

static void reset_lists(kvp_host_cache *hc)
{
    for (int32_t s = 0; s < hc->cap; s++) {
        hc->prev[s] = -1;
        hc->next[s] = s + 1 < hc->cap ? s + 1 : -1;
        hc->held[s] = 0;
    }
    hc->free_head = 0;
    hc->head = hc->tail = -1;
    hc->st.held_blocks = 0;
}

kvp_status kvp_hc_create(int32_t capacity, kvp_host_cache **out)
{
    if (out == NULL) return KVP_ERR(KVP_EINVAL, "kvp_hc_create: NULL out");
    if (capacity < 1) return KVP_ERR(KVP_EINVAL, "host cache capacity %d < 1 block", capacity);
    kvp_host_cache *hc = kvp_calloc(1, sizeof *hc);
    if (hc == NULL) return KVP_ERR(KVP_ENOMEM, "out of memory creating a host cache");
    hc->cap = capacity;
    hc->hash = kvp_malloc((size_t)capacity * sizeof *hc->hash);
    hc->prev = kvp_malloc((size_t)capacity * sizeof *hc->prev);
    hc->next = kvp_malloc((size_t)capacity * sizeof *hc->next);
    hc->held = kvp_calloc((size_t)capacity, 1);
    kvp_status st = hc->hash && hc->prev && hc->next && hc->held
                        ? pc_map_reserve(&hc->map, (size_t)capacity)
                        : KVP_ERR(KVP_ENOMEM, "out of memory for a host cache of %d blocks", capacity);
    if (st != KVP_OK) {
        kvp_hc_destroy(hc);
        return st;
    }
    reset_lists(hc);
    *out = hc;
    return KVP_OK;
}

void kvp_hc_destroy(kvp_host_cache *hc)
{
    if (hc == NULL) return;
    pc_map_fini(&hc->map);
    kvp_free(hc->hash);
    kvp_free(hc->prev);
    kvp_free(hc->next);
    kvp_free(hc->held);
    kvp_free(hc);
}

int32_t kvp_hc_capacity(const kvp_host_cache *hc)
{
    return hc->cap;
}

static int32_t find(const kvp_host_cache *hc, uint64_t h)
{
    for (int64_t s = pc_map_first(&hc->map, h); s >= 0; s = pc_map_next(&hc->map, h, s))
        return hc->map.slots[s].val; /* keys are unique */
    return -1;
}

static void unlink_slot(kvp_host_cache *hc, int32_t s)
{
    if (hc->prev[s] >= 0) hc->next[hc->prev[s]] = hc->next[s];
    else hc->head = hc->next[s];
    if (hc->next[s] >= 0) hc->prev[hc->next[s]] = hc->prev[s];
    else hc->tail = hc->prev[s];
}

static void push_mru(kvp_host_cache *hc, int32_t s)
{
    hc->prev[s] = hc->tail;
    hc->next[s] = -1;
    if (hc->tail >= 0) hc->next[hc->tail] = s;
    else hc->head = s;
    hc->tail = s;
}

static void touch(kvp_host_cache *hc, int32_t s)
{
    if (hc->tail == s) return;
    unlink_slot(hc, s);
    push_mru(hc, s);
}

/* A slot for block h: a free one, else the least recently used block's. */
static int32_t take_slot(kvp_host_cache *hc, uint64_t h)
{
    int32_t s = hc->free_head;
    if (s >= 0) {
        hc->free_head = hc->next[s];
        hc->held[s] = 1;
        hc->st.held_blocks++;
    } else {
        s = hc->head;
        unlink_slot(hc, s);
        pc_map_del(&hc->map, hc->hash[s], s);
        hc->st.evicted_blocks++;
    }
    hc->hash[s] = h;
    pc_map_put(&hc->map, h, s);
    push_mru(hc, s);
    hc->st.stored_blocks++;
    return s;
}

int32_t kvp_hc_match(kvp_host_cache *hc, const uint64_t *hashes, int32_t n, int32_t *slots_out)
{
    if (n <= 0) return 0;
    hc->st.lookups++;
    hc->st.queried_blocks += n;
    int32_t k = 0;
    while (k < n && (slots_out[k] = find(hc, hashes[k])) >= 0) k++;
    for (int32_t i = k - 1; i >= 0; i--) touch(hc, slots_out[i]);
    hc->st.hit_blocks += k;
    return k;
}

int32_t kvp_hc_store(kvp_host_cache *hc, const uint64_t *hashes, int32_t n, int32_t *slots_out)
{
    int32_t m = n < hc->cap ? n : hc->cap, fresh = 0;
    for (int32_t i = m; i < n; i++) slots_out[i] = -1;
    /* the blocks held already are touched first, so that the new ones never evict them */
    for (int32_t i = m - 1; i >= 0; i--) {
        int32_t s = find(hc, hashes[i]);
        if (s >= 0) touch(hc, s);
        slots_out[i] = s >= 0 ? -1 - s : -1; /* -1 - slot while deciding: held */
    }
    for (int32_t i = m - 1; i >= 0; i--)
        if (slots_out[i] == -1) {
            int32_t s = find(hc, hashes[i]); /* a hash given twice (a collision) is stored once */
            slots_out[i] = s >= 0 ? -1 - s : take_slot(hc, hashes[i]);
            fresh += s < 0;
        }
    /* final order: the last block least recently used, the first block most */
    for (int32_t i = m - 1; i >= 0; i--) {
        int32_t s = slots_out[i] >= 0 ? slots_out[i] : -1 - slots_out[i];
        touch(hc, s);
        if (slots_out[i] < 0) slots_out[i] = -1;
    }
    return fresh;
}

int32_t kvp_hc_victim(const kvp_host_cache *hc)
{
    return hc->free_head >= 0 ? -1 : hc->head;
}

static const char *const k_write_policies[KVP_HC_WRITE_POLICIES] = {"write_through", "write_back",
                                                                    "write_through_selective"};

kvp_status kvp_hc_write_policy_parse(const char *s, kvp_hc_write_policy *out)
{
    for (int i = 0; s != NULL && i < KVP_HC_WRITE_POLICIES; i++)
        if (strcmp(s, k_write_policies[i]) == 0) return *out = (kvp_hc_write_policy)i, KVP_OK;
    return KVP_ERR(KVP_EINVAL, "unknown host-tier write policy '%s' (expected write_through, write_back or "
                   "write_through_selective)", s ? s : "(null)");
}

const char *kvp_hc_write_policy_name(kvp_hc_write_policy p)
{
    return (unsigned)p < KVP_HC_WRITE_POLICIES ? k_write_policies[p] : "?";
}

int32_t kvp_hc_blocks_to_store(kvp_hc_write_policy p, int32_t n_full, int32_t n_hit)
{
    if (p == KVP_HC_WRITE_THROUGH) return n_full;
    if (p == KVP_HC_WRITE_THROUGH_SELECTIVE) return n_hit < n_full ? n_hit : n_full;
    return 0;
}

void kvp_hc_clear(kvp_host_cache *hc)
{
    for (int32_t s = hc->head; s >= 0; s = hc->next[s]) pc_map_del(&hc->map, hc->hash[s], s);
    reset_lists(hc);
}

void kvp_hc_get_stats(const kvp_host_cache *hc, kvp_hc_stats *out)
{
    *out = hc->st;
}

kvp_status kvp_hc_check(const kvp_host_cache *hc)
{
    int64_t listed = 0, freed = 0;
    for (int32_t s = hc->head, p = -1; s >= 0; p = s, s = hc->next[s]) {
        if (s >= hc->cap || !hc->held[s]) return KVP_ERR(KVP_ESTATE, "host cache: slot %d in the LRU list is not held", s);
        if (hc->prev[s] != p) return KVP_ERR(KVP_ESTATE, "host cache: slot %d's prev is %d, not %d", s, hc->prev[s], p);
        if (find(hc, hc->hash[s]) != s) return KVP_ERR(KVP_ESTATE, "host cache: slot %d is not in the map", s);
        if (++listed > hc->cap) return KVP_ERR(KVP_ESTATE, "host cache: cycle in the LRU list");
        if (hc->next[s] < 0 && hc->tail != s) return KVP_ERR(KVP_ESTATE, "host cache: the tail is %d, not %d", hc->tail, s);
    }
    if (listed == 0 && hc->tail != -1) return KVP_ERR(KVP_ESTATE, "host cache: empty list with tail %d", hc->tail);
    for (int32_t s = hc->free_head; s >= 0; s = hc->next[s]) {
        if (s >= hc->cap || hc->held[s]) return KVP_ERR(KVP_ESTATE, "host cache: free slot %d is held", s);
        if (++freed > hc->cap) return KVP_ERR(KVP_ESTATE, "host cache: cycle in the free list");
    }
    if (listed + freed != hc->cap)
        return KVP_ERR(KVP_ESTATE, "host cache: %lld listed + %lld free != %d slots", (long long)listed,
                       (long long)freed, hc->cap);
    if (listed != hc->st.held_blocks || (int64_t)hc->map.n != listed)
        return KVP_ERR(KVP_ESTATE, "host cache: %lld listed, %lld counted, %zu in the map", (long long)listed,
                       (long long)hc->st.held_blocks, hc->map.n);
    return KVP_OK;
}
