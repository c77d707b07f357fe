/* prefix_cache/policies/list.h — every eviction policy, once, as KVP_PC_POLICY(ID, name): ID names the enum
 * value KVP_EVICT_<ID> (prefix_cache.h), name is the policy's file (policies/<name>.c, which defines
 * `const pc_policy pc_policy_<name>`) and the word --evict takes. The order is the enum's: a new policy goes at
 * the end. No include guard: the file is included several times with different KVP_PC_POLICY definitions. */
KVP_PC_POLICY(LRU, lru)
KVP_PC_POLICY(LFU, lfu)
KVP_PC_POLICY(FIFO, fifo)
KVP_PC_POLICY(PRIORITY, priority)
KVP_PC_POLICY(BELADY, belady)
KVP_PC_POLICY(SLRU, slru)
KVP_PC_POLICY(ARC, arc)
KVP_PC_POLICY(COST, cost)
KVP_PC_POLICY(SIZE, size)
