"""BlockPool and PagedKVManager driven directly: vLLM V1's free-queue order, ref counts, eviction."""

from __future__ import annotations

import random

import pytest

from policies.base import Request, Status
from policies.kv import NULL_BLOCK, BlockPool, PagedKVManager
from policies.prefix_hash import BlockHasher


def test_initial_queue_excludes_the_null_block_and_pops_from_the_front():
    pool = BlockPool(5)
    assert pool.free_queue() == [1, 2, 3, 4, 5]
    assert pool.get_new_blocks(2) == [1, 2]
    assert pool.get_new_blocks(3) == [3, 4, 5]
    assert pool.num_free == 0 and pool.num_used == 5
    with pytest.raises(ValueError, match="only 0 free"):
        pool.get_new_blocks(1)
    pool.check_invariants()


def test_null_block_is_never_allocated():
    pool = BlockPool(8)
    got = pool.get_new_blocks(8)
    assert NULL_BLOCK not in got and sorted(got) == list(range(1, 9))


def test_unhashed_blocks_go_to_the_front_hashed_ones_to_the_back():
    pool = BlockPool(6, enable_caching=True)
    a = pool.get_new_blocks(3)  # [1, 2, 3]
    pool.cache_block(a[0], 101)
    pool.cache_block(a[1], 102)  # block 3 stays unhashed (a partial tail block)
    pool.free_blocks(reversed(a))  # tail first, as a request frees
    # 3 (unhashed) jumps the queue; 2 then 1 (hashed) queue up behind the never-used blocks
    assert pool.free_queue() == [3, 4, 5, 6, 2, 1]
    pool.check_invariants()


def test_without_caching_freed_blocks_are_reused_first():
    pool = BlockPool(4)
    a = pool.get_new_blocks(2)
    pool.free_blocks(reversed(a))
    assert pool.free_queue() == [2, 1, 3, 4]  # both to the front, in the order given
    assert pool.get_new_blocks(1) == [2]


def test_eviction_takes_the_least_recently_freed_tail_block_first():
    pool = BlockPool(4, enable_caching=True)
    a = pool.get_new_blocks(2)
    b = pool.get_new_blocks(2)
    for blk, h in zip(a + b, (11, 12, 21, 22)):
        pool.cache_block(blk, h)
    pool.free_blocks(reversed(a))  # freed first: tail (2) before head (1)
    pool.free_blocks(reversed(b))
    assert pool.free_queue() == [2, 1, 4, 3]
    assert pool.get_new_blocks(1) == [2]  # evicts hash 12
    assert pool.get_cached_block(12) is None
    assert pool.get_cached_block(11) == 1 and pool.block_hash[2] is None
    pool.check_invariants()


def test_touch_removes_a_cached_block_from_the_middle_and_counts_references():
    pool = BlockPool(4, enable_caching=True)
    a = pool.get_new_blocks(2)
    pool.cache_block(a[0], 7)
    pool.free_blocks(reversed(a))
    assert pool.free_queue() == [2, 3, 4, 1]
    pool.touch([1])
    pool.touch([1])  # a second request shares it
    assert pool.ref_cnt[1] == 2 and pool.free_queue() == [2, 3, 4]
    pool.free_blocks([1])
    assert pool.ref_cnt[1] == 1 and 1 not in pool.free_queue()
    pool.free_blocks([1])
    assert pool.free_queue() == [2, 3, 4, 1]
    pool.check_invariants()


def test_identical_blocks_are_not_deduplicated():
    pool = BlockPool(4, enable_caching=True)
    x, y = pool.get_new_blocks(2)
    pool.cache_block(x, 5)
    pool.cache_block(y, 5)
    assert pool.get_cached_block(5) == x  # the first registered copy
    pool.free_blocks([x])
    pool.free_blocks([y])
    assert pool.get_new_blocks(2) == [3, 4]
    assert pool.get_new_blocks(1) == [x]  # evicts only x
    assert pool.get_cached_block(5) == y
    assert pool.num_cached_blocks == 1
    pool.check_invariants()


def test_random_operations_agree_with_a_list_model():
    """A plain list is the free queue; a dict of lists the registry. Compare after every op."""
    rng = random.Random(3)
    n = 12
    pool = BlockPool(n, enable_caching=True)
    queue = list(range(1, n + 1))
    ref = [0] * (n + 1)
    hashes: dict[int, int | None] = {b: None for b in range(1, n + 1)}
    held: list[int] = []
    for _ in range(3000):
        op = rng.random()
        if op < 0.4 and queue:
            k = rng.randint(1, len(queue))
            got = pool.get_new_blocks(k)
            exp, queue = queue[:k], queue[k:]
            assert got == exp
            for b in got:
                hashes[b] = None
                ref[b] = 1
            held += got
        elif op < 0.55 and held:
            b = rng.choice(held)
            if hashes[b] is None:
                h = rng.randint(1, 6)
                pool.cache_block(b, h)
                hashes[b] = h
        elif op < 0.7:
            cached = [b for b in range(1, n + 1) if hashes[b] is not None]
            if cached:
                b = rng.choice(cached)
                pool.touch([b])
                if ref[b] == 0:
                    queue.remove(b)
                ref[b] += 1
                held.append(b)
        elif held:
            rng.shuffle(held)
            k = rng.randint(1, len(held))
            batch, held = held[:k], held[k:]
            pool.free_blocks(batch)
            front = []
            for b in batch:
                ref[b] -= 1
                if ref[b] == 0:
                    if hashes[b] is None:
                        front.append(b)
                    else:
                        queue.append(b)
            queue = front + queue
        assert pool.free_queue() == queue
        assert pool.ref_cnt[1:] == ref[1:]
        for b in range(1, n + 1):
            assert pool.block_hash[b] == hashes[b]
        pool.check_invariants()


# --- PagedKVManager ------------------------------------------------------------------------


def _req(rid: str, prompt: int, runs=None, max_tokens: int = 10) -> Request:
    return Request(rid, 0.0, prompt, max_tokens, prompt_runs=runs)


def test_full_sequence_gate_and_first_chunk():
    kv = PagedKVManager(num_usable_blocks=4, block_size=16, max_model_len=1024)
    r = _req("a", 80)  # 5 blocks: more than the pool
    assert kv.allocate_slots(r, 16, full_sequence_must_fit=True) is None
    assert kv.allocate_slots(r, 16) == [1]  # only the first chunk has to fit without the gate
    assert kv.num_free_blocks == 3


def test_watermark_counts_the_null_block():
    # 99 usable + null = 100 blocks; watermark 0.01 -> 1 block (int(0.01 * 99) would be 0)
    kv = PagedKVManager(num_usable_blocks=99, block_size=16, max_model_len=4096, watermark=0.01)
    assert kv.watermark_blocks == 1
    big = _req("big", 98 * 16)
    assert kv.allocate_slots(big, 98 * 16, has_scheduled_reqs=False) is not None
    assert kv.num_free_blocks == 1
    small = _req("small", 10)
    assert kv.allocate_slots(small, 10, has_scheduled_reqs=True) is None  # 1 + watermark 1 > 1 free
    preempted = _req("back", 10)
    preempted.status = Status.PREEMPTED  # a resumed request pays it too
    assert kv.allocate_slots(preempted, 10, has_scheduled_reqs=True) is None
    assert kv.allocate_slots(small, 10, has_scheduled_reqs=False) is not None  # nothing runs: no watermark
    kv.free(small)
    big.status = Status.RUNNING  # a running request growing never pays it
    big.num_computed_tokens = 98 * 16
    assert kv.allocate_slots(big, 1) == [99]
    assert kv.num_free_blocks == 0


def test_prefix_hit_is_whole_blocks_capped_below_the_last_token():
    kv = PagedKVManager(num_usable_blocks=20, block_size=16, max_model_len=1024, enable_caching=True)
    runs = (("doc", 48),)
    a = _req("a", 48, runs)
    assert kv.get_computed_blocks(a) == ([], 0)
    assert kv.allocate_slots(a, 48) is not None  # cached at once: 3 full blocks
    b = _req("b", 48, runs)  # the identical prompt: only 2 blocks, the last one is recomputed
    hits, n = kv.get_computed_blocks(b)
    assert n == 32 and hits == kv.blocks_of(a)[:2]
    c = _req("c", 40, (("doc", 40),))  # shares 2 full blocks and 8 tokens of the third
    assert kv.get_computed_blocks(c)[1] == 32
    d = _req("d", 60, (("doc", 33), ("other", 27)))
    assert kv.get_computed_blocks(d)[1] == 32
    e = _req("e", 60, (("other", 60),))
    assert kv.get_computed_blocks(e)[1] == 0


def test_cached_free_hits_count_against_free_blocks():
    kv = PagedKVManager(num_usable_blocks=4, block_size=16, max_model_len=1024, enable_caching=True)
    runs = (("p", 33),)
    a = _req("a", 33, runs)
    kv.allocate_slots(a, 33)  # blocks 1, 2 (cached), 3 (partial)
    kv.release(a)
    assert kv.num_free_blocks == 4
    b = _req("b", 64, (("p", 32), ("q", 32)))
    hits, n = kv.get_computed_blocks(b)
    assert n == 32
    # 4 blocks needed: 2 new + 2 evictable hits = 4 of 4 free -> fits; one more token would not
    assert kv.allocate_slots(b, 32, n, hits, full_sequence_must_fit=True) is not None
    assert kv.blocks_of(b)[:2] == hits and kv.num_free_blocks == 0


def test_every_block_comes_back_and_hashes_are_process_independent():
    kv = PagedKVManager(num_usable_blocks=30, block_size=8, max_model_len=4096, enable_caching=True)
    reqs = [_req(f"r{i}", 20 + 7 * i, ((("sys",), 16), (("u", i), 4 + 7 * i))) for i in range(5)]
    for r in reqs:
        hits, n = kv.get_computed_blocks(r)
        assert kv.allocate_slots(r, r.prompt_tokens - n, n, hits) is not None
        r.num_computed_tokens = r.prompt_tokens
    for r in reqs:
        kv.release(r)
    assert kv.num_free_blocks == 30 and kv.num_used_blocks == 0 and kv.held_token_slots == 0
    kv.pool.check_invariants()
    # interned ids: the same content gets the same small integer in every process
    h1, h2 = BlockHasher(8), BlockHasher(8)
    rh1 = h1.new_request((("x", 24),), 24, "o")
    rh2 = h2.new_request((("x", 24),), 24, "o")
    assert h1.extend(rh1, 3) == h2.extend(rh2, 3) == [1, 2, 3]


def test_block_content_is_canonical_across_run_layouts():
    h = BlockHasher(4)
    one = h.new_request((("k", 8),), 8, "o")
    # same tokens (k,0..7) can only come from one layout; a different layout gives other ids
    other = h.new_request((("k", 4), ("k", 4)), 8, "o")
    assert h.extend(one, 2)[0] == h.extend(other, 2)[0]  # first block (k,0..3) equal
    assert one.hashes[1] != other.hashes[1]  # (k,4..7) vs (k,0..3) after the same parent
    # a block straddling prompt and output tokens
    mixed = h.new_request((("k", 6),), 6, "o")
    assert mixed.content(4, 8) == (("k", 4, 2), ("o", 0, 2))
    with pytest.raises(ValueError, match="cover 5 tokens"):
        h.new_request((("k", 5),), 6, "o")
