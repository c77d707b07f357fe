#include "blockmgr/accounting.h"

void kvp_kv_accounting_bytes(const kvp_kv_accounting *slots, int64_t bytes_per_slot, kvp_kv_accounting *bytes)
{
    kvp_kv_accounting a = *slots;
    a.capacity *= bytes_per_slot;
    a.token_states *= bytes_per_slot;
    a.reserved *= bytes_per_slot;
    a.internal_frag *= bytes_per_slot;
    a.external_frag *= bytes_per_slot;
    a.cached *= bytes_per_slot;
    a.free *= bytes_per_slot;
    a.logical_tokens *= bytes_per_slot;
    a.shared_savings *= bytes_per_slot;
    *bytes = a;
}

int64_t kvp_kv_accounting_residual(const kvp_kv_accounting *a)
{
    return a->token_states + a->reserved + a->internal_frag + a->external_frag + a->cached + a->free - a->capacity;
}
