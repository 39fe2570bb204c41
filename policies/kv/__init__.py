"""KV memory managers a policy owns (as in vLLM, the scheduler owns its KV cache manager).

* :mod:`policies.kv.block_pool`: the GPU pool of fixed-size blocks, with vLLM V1's free queue
  (its insertion and pop order is what decides prefix-cache eviction) and the registry of
  hashed (cached) blocks.
* :mod:`policies.kv.paged`: per-request block tables on top of the pool: admission checks,
  slot allocation, prefix-cache lookup and freeing, as vLLM 0.32's ``KVCacheManager`` does.
"""

from policies.kv.block_pool import NULL_BLOCK, BlockPool
from policies.kv.paged import PagedKVManager

__all__ = ["NULL_BLOCK", "BlockPool", "PagedKVManager"]
