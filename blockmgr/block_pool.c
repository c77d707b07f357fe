#include "blockmgr/block_pool.h"

#include "blockmgr/block_pool_internal.h"
#include "common/alloc.h"

kvp_status kvp_pool_create(int32_t num_blocks, int32_t block_size, kvp_block_pool **out)
{
    if (out == NULL) return KVP_ERR(KVP_EINVAL, "kvp_pool_create: out is NULL");
    if (num_blocks < 1 || num_blocks > INT32_MAX - 1)
        return KVP_ERR(KVP_EINVAL, "block pool: num_blocks must be in [1, %d], got %d", INT32_MAX - 1,
                       (int)num_blocks);
    if (block_size < 1) return KVP_ERR(KVP_EINVAL, "block pool: block_size must be >= 1, got %d", (int)block_size);
    kvp_block_pool *p = kvp_calloc(1, sizeof *p);
    if (p == NULL) return KVP_ERR(KVP_ENOMEM, "block pool: out of memory");
    p->refcnt = kvp_calloc((size_t)num_blocks, sizeof(int32_t));
    p->next = kvp_malloc(((size_t)num_blocks + 1) * sizeof(int32_t));
    p->prev = kvp_malloc(((size_t)num_blocks + 1) * sizeof(int32_t));
    if (p->refcnt == NULL || p->next == NULL || p->prev == NULL) {
        kvp_pool_destroy(p);
        return KVP_ERR(KVP_ENOMEM, "block pool: out of memory for %d blocks", (int)num_blocks);
    }
    p->num_blocks = num_blocks;
    p->block_size = block_size;
    const int32_t s = num_blocks;
    for (int32_t b = 0; b <= s; b++) {
        p->next[b] = b + 1 > s ? 0 : b + 1;
        p->prev[b] = b - 1 < 0 ? s : b - 1;
    }
    p->num_free = num_blocks;
    *out = p;
    return KVP_OK;
}

void kvp_pool_destroy(kvp_block_pool *pool)
{
    if (pool == NULL) return;
    kvp_free(pool->refcnt);
    kvp_free(pool->next);
    kvp_free(pool->prev);
    kvp_free(pool);
}

int32_t kvp_pool_num_blocks(const kvp_block_pool *pool) { return pool->num_blocks; }
int32_t kvp_pool_block_size(const kvp_block_pool *pool) { return pool->block_size; }
int32_t kvp_pool_num_free(const kvp_block_pool *pool) { return pool->num_free; }

/* The public entry points keep their error reporting in cold functions so that the common case compiles to
 * a few instructions without a stack frame. */
static __attribute__((noinline, cold)) kvp_status alloc_slow(kvp_block_pool *pool, int32_t n, int32_t *ids_out);

kvp_status kvp_pool_alloc(kvp_block_pool *pool, int32_t n, int32_t *ids_out)
{
    if (__builtin_expect(n == 1 && pool->num_free > 0 && ids_out != NULL, 1)) {
        ids_out[0] = kvp_pool_pop_(pool);
        return KVP_OK;
    }
    return alloc_slow(pool, n, ids_out);
}

static kvp_status alloc_slow(kvp_block_pool *pool, int32_t n, int32_t *ids_out)
{
    if (n < 0) return KVP_ERR(KVP_EINVAL, "block pool: cannot allocate %d blocks", (int)n);
    if (n > pool->num_free)
        return KVP_ERR(KVP_ENOBLOCKS, "block pool: %d blocks requested, %d free", (int)n, (int)pool->num_free);
    if (n > 0 && ids_out == NULL) return KVP_ERR(KVP_EINVAL, "block pool: ids_out is NULL");
    for (int32_t i = 0; i < n; i++) ids_out[i] = kvp_pool_pop_(pool);
    return KVP_OK;
}

static kvp_status check_id(const kvp_block_pool *pool, int32_t id, const char *op)
{
    if (id < 0 || id >= pool->num_blocks)
        return KVP_ERR(KVP_EINVAL, "block pool %s: block id %d out of range [0, %d)", op, (int)id,
                       (int)pool->num_blocks);
    return KVP_OK;
}

kvp_status kvp_pool_take(kvp_block_pool *pool, int32_t id)
{
    KVP_TRY(check_id(pool, id, "take"));
    if (pool->refcnt[id] != 0)
        return KVP_ERR(KVP_ESTATE, "block pool take: block %d is not free (refcount %d)", (int)id,
                       (int)pool->refcnt[id]);
    kvp_pool_unlink_(pool, id);
    pool->refcnt[id] = 1;
    return KVP_OK;
}

kvp_status kvp_pool_incref(kvp_block_pool *pool, int32_t id)
{
    KVP_TRY(check_id(pool, id, "incref"));
    if (pool->refcnt[id] < 1) return KVP_ERR(KVP_ESTATE, "block pool incref: block %d is free", (int)id);
    if (pool->refcnt[id] == INT32_MAX)
        return KVP_ERR(KVP_ESTATE, "block pool incref: block %d refcount would overflow", (int)id);
    pool->refcnt[id]++;
    return KVP_OK;
}

static __attribute__((noinline, cold)) kvp_status decref_error(const kvp_block_pool *pool, int32_t id)
{
    KVP_TRY(check_id(pool, id, "decref"));
    return KVP_ERR(KVP_ESTATE, "block pool decref: block %d is already free (double free)", (int)id);
}

kvp_status kvp_pool_decref(kvp_block_pool *pool, int32_t id)
{
    if (__builtin_expect((uint32_t)id < (uint32_t)pool->num_blocks && pool->refcnt[id] > 0, 1)) {
        kvp_pool_decref_(pool, id);
        return KVP_OK;
    }
    return decref_error(pool, id);
}

kvp_status kvp_pool_release(kvp_block_pool *pool, const int32_t *ids, int32_t n)
{
    if (n < 0 || (n > 0 && ids == NULL)) return KVP_ERR(KVP_EINVAL, "block pool release: bad list (n = %d)", (int)n);
    /* Check first, counting repeats: decrement tentatively, then restore. */
    kvp_status st = KVP_OK;
    int32_t i = 0;
    for (; i < n; i++) {
        st = check_id(pool, ids[i], "release");
        if (st != KVP_OK) break;
        if (pool->refcnt[ids[i]] < 1) {
            st = KVP_ERR(KVP_ESTATE, "block pool release: block %d (entry %d) is already free", (int)ids[i], (int)i);
            break;
        }
        pool->refcnt[ids[i]]--;
    }
    for (int32_t j = 0; j < i; j++) pool->refcnt[ids[j]]++;
    if (st != KVP_OK) return st;
    for (int32_t j = 0; j < n; j++) kvp_pool_decref_(pool, ids[j]);
    return KVP_OK;
}

int32_t kvp_pool_refcount(const kvp_block_pool *pool, int32_t id)
{
    if (id < 0 || id >= pool->num_blocks) return -1;
    return pool->refcnt[id];
}

bool kvp_pool_is_free(const kvp_block_pool *pool, int32_t id)
{
    return id >= 0 && id < pool->num_blocks && pool->refcnt[id] == 0;
}

int32_t kvp_pool_free_list(const kvp_block_pool *pool, int32_t *out, int32_t max)
{
    int32_t n = 0;
    for (int32_t b = pool->next[pool->num_blocks]; b != pool->num_blocks && n < max; b = pool->next[b]) out[n++] = b;
    return n;
}

kvp_status kvp_pool_check(const kvp_block_pool *pool)
{
    const int32_t s = pool->num_blocks;
    int32_t zero = 0;
    for (int32_t b = 0; b < s; b++) {
        if (pool->refcnt[b] < 0) return KVP_ERR(KVP_ESTATE, "pool: block %d has refcount %d", (int)b, (int)pool->refcnt[b]);
        if (pool->refcnt[b] == 0) zero++;
        else if (pool->next[b] != -1 || pool->prev[b] != -1)
            return KVP_ERR(KVP_ESTATE, "pool: held block %d (refcount %d) is linked in the free list", (int)b,
                           (int)pool->refcnt[b]);
    }
    if (zero != pool->num_free)
        return KVP_ERR(KVP_ESTATE, "pool: %d blocks have refcount 0 but num_free is %d", (int)zero, (int)pool->num_free);
    int32_t len = 0, prev = s;
    for (int32_t b = pool->next[s]; b != s; b = pool->next[b]) {
        if (b < 0 || b >= s) return KVP_ERR(KVP_ESTATE, "pool: free list holds bad id %d", (int)b);
        if (pool->refcnt[b] != 0)
            return KVP_ERR(KVP_ESTATE, "pool: block %d on the free list has refcount %d", (int)b, (int)pool->refcnt[b]);
        if (pool->prev[b] != prev)
            return KVP_ERR(KVP_ESTATE, "pool: prev[%d] = %d, expected %d", (int)b, (int)pool->prev[b], (int)prev);
        if (++len > s) return KVP_ERR(KVP_ESTATE, "pool: free list has a cycle");
        prev = b;
    }
    if (pool->prev[s] != prev) return KVP_ERR(KVP_ESTATE, "pool: tail pointer is %d, expected %d", (int)pool->prev[s], (int)prev);
    if (len != pool->num_free)
        return KVP_ERR(KVP_ESTATE, "pool: free list has %d blocks, num_free is %d", (int)len, (int)pool->num_free);
    return KVP_OK;
}
