/* prefix_cache/pc_util.c — the eviction heap and the key multimap (see prefix_cache_internal.h). */
#include <string.h>

#include "common/alloc.h"
#include "prefix_cache/prefix_cache_internal.h"

/* ---- heap ---------------------------------------------------------------------------------------- */

int pc_key_cmp(pc_key x, pc_key y)
{
    if (x.a != y.a) return x.a < y.a ? -1 : 1;
    if (x.b != y.b) return x.b < y.b ? -1 : 1;
    if (x.c != y.c) return x.c < y.c ? -1 : 1;
    return 0;
}

static int item_less(const pc_hitem *x, const pc_hitem *y)
{
    int c = pc_key_cmp(x->k, y->k);
    return c != 0 ? c < 0 : x->unit < y->unit;
}

kvp_status pc_heap_reserve(pc_heap *h, size_t units)
{
    if (units <= h->cap) return KVP_OK;
    size_t cap = h->cap ? h->cap : 16;
    while (cap < units) cap *= 2;
    pc_hitem *heap = kvp_malloc(cap * sizeof *heap);
    int32_t *pos = kvp_malloc(cap * sizeof *pos);
    if (heap == NULL || pos == NULL) {
        kvp_free(heap);
        kvp_free(pos);
        return KVP_ERR(KVP_ENOMEM, "out of memory growing the eviction heap to %zu units", cap);
    }
    if (h->n) memcpy(heap, h->heap, (size_t)h->n * sizeof *heap);
    if (h->cap) memcpy(pos, h->pos, h->cap * sizeof *pos);
    for (size_t i = h->cap; i < cap; i++) pos[i] = -1;
    kvp_free(h->heap);
    kvp_free(h->pos);
    h->heap = heap;
    h->pos = pos;
    h->cap = cap;
    return KVP_OK;
}

void pc_heap_fini(pc_heap *h)
{
    kvp_free(h->heap);
    kvp_free(h->pos);
    memset(h, 0, sizeof *h);
}

static void sift_up(pc_heap *h, int32_t i)
{
    pc_hitem it = h->heap[i];
    while (i > 0) {
        int32_t p = (i - 1) / 2;
        if (!item_less(&it, &h->heap[p])) break;
        h->heap[i] = h->heap[p];
        h->pos[h->heap[i].unit] = i;
        i = p;
    }
    h->heap[i] = it;
    h->pos[it.unit] = i;
}

static void sift_down(pc_heap *h, int32_t i)
{
    pc_hitem it = h->heap[i];
    for (;;) {
        int32_t l = 2 * i + 1, m = l;
        if (l >= h->n) break;
        if (l + 1 < h->n && item_less(&h->heap[l + 1], &h->heap[l])) m = l + 1;
        if (!item_less(&h->heap[m], &it)) break;
        h->heap[i] = h->heap[m];
        h->pos[h->heap[i].unit] = i;
        i = m;
    }
    h->heap[i] = it;
    h->pos[it.unit] = i;
}

void pc_heap_push(pc_heap *h, int32_t unit, pc_key k)
{
    h->heap[h->n] = (pc_hitem){k, unit};
    h->pos[unit] = h->n++;
    sift_up(h, h->n - 1);
}

void pc_heap_remove(pc_heap *h, int32_t unit)
{
    int32_t i = h->pos[unit];
    h->pos[unit] = -1;
    if (i == --h->n) return;
    int32_t moved = h->heap[h->n].unit;
    h->heap[i] = h->heap[h->n];
    h->pos[moved] = i;
    sift_up(h, i);
    sift_down(h, h->pos[moved]);
}

void pc_heap_update(pc_heap *h, int32_t unit, pc_key k)
{
    int32_t i = h->pos[unit];
    h->heap[i].k = k;
    sift_up(h, i);
    sift_down(h, h->pos[unit]);
}

void pc_heap_lower(pc_heap *h, int32_t unit, pc_key k)
{
    if (h->pos[unit] < 0) return;
    int32_t i = h->pos[unit];
    if (pc_key_cmp(k, h->heap[i].k) >= 0) return;
    h->heap[i].k = k;
    sift_up(h, i);
}

int32_t pc_heap_settle(kvp_prefix_cache *pc, int seg, pc_unit_key_fn key)
{
    pc_heap *h = &pc->heaps[seg];
    while (h->n > 0) {
        const int32_t u = pc_heap_top(h);
        int evictable, s;
        const pc_key k = key(pc, u, &evictable, &s);
        if (!evictable || s != seg) pc_heap_remove(h, u);
        else if (pc_key_cmp(pc_heap_key(h, u), k) < 0) pc_heap_update(h, u, k);
        else return u;
    }
    return -1;
}

int pc_heap_broken(const pc_heap *h)
{
    for (int32_t i = 0; i < h->n; i++) {
        int32_t u = h->heap[i].unit;
        if (u < 0 || (size_t)u >= h->cap || h->pos[u] != i) return 1;
        if (i > 0 && item_less(&h->heap[i], &h->heap[(i - 1) / 2])) return 1;
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

void pc_map_prefetch(const pc_map *m, uint64_t key)
{
    if (m->cap) __builtin_prefetch(&m->slots[slot_of(m, key)]);
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
