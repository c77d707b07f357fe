/* blockmgr/block_pool_internal.h — the pool's layout and inline fast paths, for blockmgr/ only.
 *
 * next[]/prev[] have num_blocks + 1 entries: index S = num_blocks is a sentinel closing the ring, so
 * linking never branches on "empty list" or "first element":
 *
 *        +-> [S] <-> head <-> ... <-> tail <-+
 *        +-----------------------------------+
 *   next[S] = head, prev[S] = tail; empty list: next[S] = prev[S] = S.
 * A held block (refcount >= 1) has next = prev = -1 (used by the walker to check membership).
 */
#ifndef KVP_BLOCKMGR_BLOCK_POOL_INTERNAL_H
#define KVP_BLOCKMGR_BLOCK_POOL_INTERNAL_H

#include "blockmgr/block_pool.h"

struct kvp_block_pool {
    int32_t num_blocks;
    int32_t block_size;
    int32_t num_free;
    int32_t *refcnt; /* [num_blocks] */
    int32_t *next;   /* [num_blocks + 1] */
    int32_t *prev;   /* [num_blocks + 1] */
};

/* Pops the head; the caller has checked num_free >= 1. */
static inline int32_t kvp_pool_pop_(kvp_block_pool *p)
{
    const int32_t s = p->num_blocks;
    const int32_t b = p->next[s];
    const int32_t n = p->next[b];
    p->next[s] = n;
    p->prev[n] = s;
    p->next[b] = p->prev[b] = -1;
    p->refcnt[b] = 1;
    p->num_free--;
    return b;
}

/* Appends a block whose count just reached 0 at the tail. */
static inline void kvp_pool_push_(kvp_block_pool *p, int32_t b)
{
    const int32_t s = p->num_blocks;
    const int32_t t = p->prev[s];
    p->next[t] = b;
    p->prev[b] = t;
    p->next[b] = s;
    p->prev[s] = b;
    p->num_free++;
}

/* Unlinks a free block from anywhere in the list. */
static inline void kvp_pool_unlink_(kvp_block_pool *p, int32_t b)
{
    const int32_t pr = p->prev[b], nx = p->next[b];
    p->next[pr] = nx;
    p->prev[nx] = pr;
    p->next[b] = p->prev[b] = -1;
    p->num_free--;
}

/* Drops one reference of a held block (caller checked refcnt >= 1). */
static inline void kvp_pool_decref_(kvp_block_pool *p, int32_t b)
{
    if (--p->refcnt[b] == 0) kvp_pool_push_(p, b);
}

#endif
