/* prefix_cache/pc_util.c — the eviction heap and the key multimap (see pc_internal.h). */
#include <string.h>

#include "common/alloc.h"
#include "prefix_cache/pc_internal.h"

/* ---- heap ---------------------------------------------------------------------------------------- */

static int key_less(const pc_key *x, int32_t ux, const pc_key *y, int32_t uy)
{
    if (x->a != y->a) return x->a < y->a;
    if (x->b != y->b) return x->b < y->b;
    if (x->c != y->c) return x->c < y->c;
    return ux < uy;
}

kvp_status pc_heap_reserve(pc_heap *h, size_t units)
{
    if (units <= h->cap) return KVP_OK;
    size_t cap = h->cap ? h->cap : 16;
    while (cap < units) cap *= 2;
    int32_t *heap = kvp_malloc(cap * sizeof *heap);
    pc_key *key = kvp_malloc(cap * sizeof *key);
    int32_t *pos = kvp_malloc(cap * sizeof *pos);
    if (heap == NULL || key == NULL || pos == NULL) {
        kvp_free(heap);
        kvp_free(key);
        kvp_free(pos);
        return KVP_ERR(KVP_ENOMEM, "out of memory growing the eviction heap to %zu units", cap);
    }
    if (h->n) memcpy(heap, h->heap, (size_t)h->n * sizeof *heap);
    if (h->cap) {
        memcpy(key, h->key, h->cap * sizeof *key);
        memcpy(pos, h->pos, h->cap * sizeof *pos);
    }
    for (size_t i = h->cap; i < cap; i++) pos[i] = -1;
    kvp_free(h->heap);
    kvp_free(h->key);
    kvp_free(h->pos);
    h->heap = heap;
    h->key = key;
    h->pos = pos;
    h->cap = cap;
    return KVP_OK;
}

void pc_heap_fini(pc_heap *h)
{
    kvp_free(h->heap);
    kvp_free(h->key);
    kvp_free(h->pos);
    memset(h, 0, sizeof *h);
}

static void place(pc_heap *h, int32_t i, int32_t u)
{
    h->heap[i] = u;
    h->pos[u] = i;
}

static void sift_up(pc_heap *h, int32_t i)
{
    int32_t u = h->heap[i];
    while (i > 0) {
        int32_t p = (i - 1) / 2, pu = h->heap[p];
        if (!key_less(&h->key[u], u, &h->key[pu], pu)) break;
        place(h, i, pu);
        i = p;
    }
    place(h, i, u);
}

static void sift_down(pc_heap *h, int32_t i)
{
    int32_t u = h->heap[i];
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, m = i, mu = u;
        if (l < h->n && key_less(&h->key[h->heap[l]], h->heap[l], &h->key[mu], mu)) m = l, mu = h->heap[l];
        if (r < h->n && key_less(&h->key[h->heap[r]], h->heap[r], &h->key[mu], mu)) m = r, mu = h->heap[r];
        if (m == i) break;
        place(h, i, mu);
        i = m;
    }
    place(h, i, u);
}

void pc_heap_push(pc_heap *h, int32_t unit, pc_key k)
{
    h->key[unit] = k;
    place(h, h->n++, unit);
    sift_up(h, h->n - 1);
}

void pc_heap_remove(pc_heap *h, int32_t unit)
{
    int32_t i = h->pos[unit];
    h->pos[unit] = -1;
    int32_t last = h->heap[--h->n];
    if (i == h->n) return;
    place(h, i, last);
    sift_up(h, i);
    sift_down(h, h->pos[last]);
}

void pc_heap_update(pc_heap *h, int32_t unit, pc_key k)
{
    h->key[unit] = k;
    sift_up(h, h->pos[unit]);
    sift_down(h, h->pos[unit]);
}

int pc_heap_broken(const pc_heap *h)
{
    for (int32_t i = 0; i < h->n; i++) {
        int32_t u = h->heap[i];
        if (u < 0 || (size_t)u >= h->cap || h->pos[u] != i) return 1;
        if (i > 0) {
            int32_t pu = h->heap[(i - 1) / 2];
            if (key_less(&h->key[u], u, &h->key[pu], pu)) return 1;
        }
    }
    int32_t in = 0;
    for (size_t u = 0; u < h->cap; u++)
        if (h->pos[u] >= 0) in++;
    return in != h->n;
}

/* ---- multimap ------------------------------------------------------------------------------------ */

static size_t slot_of(const pc_map *m, uint64_t key)
{
    uint64_t x = key * 0x9e3779b97f4a7c15ull;
    return (size_t)(x >> 17) & (m->cap - 1);
}

static void put_raw(pc_slot *slots, size_t cap, uint64_t key, int32_t val)
{
    pc_map tmp = {slots, cap, 0};
    size_t i = slot_of(&tmp, key);
    while (slots[i].val != -1) i = (i + 1) & (cap - 1);
    slots[i].key = key;
    slots[i].val = val;
}

kvp_status pc_map_reserve(pc_map *m, size_t extra)
{
    size_t need = m->n + extra;
    if (m->cap && need * 2 <= m->cap) return KVP_OK;
    size_t cap = m->cap ? m->cap : 64;
    while (need * 2 > cap) cap *= 2;
    pc_slot *s = kvp_malloc(cap * sizeof *s);
    if (s == NULL) return KVP_ERR(KVP_ENOMEM, "out of memory growing a hash map to %zu slots", cap);
    for (size_t i = 0; i < cap; i++) s[i].val = -1;
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].val != -1) put_raw(s, cap, m->slots[i].key, m->slots[i].val);
    kvp_free(m->slots);
    m->slots = s;
    m->cap = cap;
    return KVP_OK;
}

void pc_map_fini(pc_map *m)
{
    kvp_free(m->slots);
    memset(m, 0, sizeof *m);
}

void pc_map_put(pc_map *m, uint64_t key, int32_t val)
{
    put_raw(m->slots, m->cap, key, val);
    m->n++;
}

int64_t pc_map_first(const pc_map *m, uint64_t key)
{
    if (m->cap == 0) return -1;
    size_t i = slot_of(m, key);
    while (m->slots[i].val != -1) {
        if (m->slots[i].key == key) return (int64_t)i;
        i = (i + 1) & (m->cap - 1);
    }
    return -1;
}

int64_t pc_map_next(const pc_map *m, uint64_t key, int64_t slot)
{
    size_t i = ((size_t)slot + 1) & (m->cap - 1);
    while (m->slots[i].val != -1) {
        if (m->slots[i].key == key) return (int64_t)i;
        i = (i + 1) & (m->cap - 1);
    }
    return -1;
}

static int64_t find_pair(const pc_map *m, uint64_t key, int32_t val)
{
    for (int64_t s = pc_map_first(m, key); s >= 0; s = pc_map_next(m, key, s))
        if (m->slots[s].val == val) return s;
    return -1;
}

void pc_map_set(pc_map *m, uint64_t key, int32_t old_val, int32_t new_val)
{
    int64_t s = find_pair(m, key, old_val);
    if (s >= 0) m->slots[s].val = new_val;
}

void pc_map_del(pc_map *m, uint64_t key, int32_t val)
{
    int64_t s = find_pair(m, key, val);
    if (s < 0) return;
    size_t i = (size_t)s, mask = m->cap - 1;
    /* Backward-shift deletion: pull later members of the probe run into the hole when their home slot
     * does not lie cyclically in (hole, current]. */
    for (size_t j = (i + 1) & mask; m->slots[j].val != -1; j = (j + 1) & mask) {
        size_t home = slot_of(m, m->slots[j].key);
        int between = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
        if (!between) {
            m->slots[i] = m->slots[j];
            i = j;
        }
    }
    m->slots[i].val = -1;
    m->n--;
}
