"""The radix-tree prefix cache (policies/kv/radix.py), rule by rule (reference/schedulers.md §6, §7.6)."""

from __future__ import annotations

import pytest

from policies.base import Request
from policies.kv.radix import RadixCache, request_tokens


def seq(*runs):
    """Segments from (key, length) runs, each starting at index 0."""
    return [(k, 0, n) for k, n in runs]


def put(cache: RadixCache, s, n=None):
    """Compute ``n`` tokens privately and insert them (what a finished request does)."""
    n = sum(x[2] for x in s) if n is None else n
    assert cache.alloc(n)
    return cache.insert(s, n, 0)


def test_match_is_token_granular_and_splits_the_edge_it_ends_in():
    c = RadixCache(1000)
    put(c, seq(("sys", 100), ("q1", 20)))
    n, node = c.match_prefix(seq(("sys", 100), ("q2", 20)), 120)
    assert n == 100 and node.length == 100  # the edge sys+q1 was split after sys
    n, node = c.match_prefix(seq(("sys", 37)), 37)
    assert n == 37  # any token, not only block multiples
    assert c.tree_size == 120 and c.private == 0
    c.check_invariants()


def test_match_never_exceeds_its_limit_and_page_size_matches_whole_pages():
    c = RadixCache(1000)
    put(c, seq(("a", 50)))
    assert c.match_prefix(seq(("a", 50)), 49)[0] == 49  # SGLang matches at most len - 1 tokens
    p = RadixCache(1000, page_size=16)
    put(p, seq(("a", 50)))
    assert p.tree_size == 48  # only whole pages are cached
    assert p.match_prefix(seq(("a", 40), ("b", 9)), 49)[0] == 32
    p.check_invariants()


def test_insert_of_a_prefix_already_cached_frees_the_duplicate():
    c = RadixCache(1000)
    put(c, seq(("sys", 100), ("q1", 20)))
    assert c.alloc(120)  # a second request computed sys + q2 meanwhile
    already = c.insert(seq(("sys", 100), ("q2", 20)), 120, 0)
    assert already == 100  # SGLang's new_prefix_len
    assert c.tree_size == 140 and c.private == 0 and c.duplicate_tokens == 100


def test_eviction_takes_least_recently_used_leaves_first_and_whole():
    c = RadixCache(1000)
    put(c, seq(("a", 100)))
    put(c, seq(("b", 100)))
    put(c, seq(("c", 100)))
    c.match_prefix(seq(("a", 100)), 100)  # a is now the most recently used
    assert c.evict(1) == 100  # one whole leaf (b, the oldest), though 1 token was asked
    assert c.match_prefix(seq(("b", 100)), 100)[0] == 0
    assert c.match_prefix(seq(("c", 100)), 100)[0] == 100
    assert c.evict(150) == 200  # then a (older than the c just touched), then c
    assert c.tree_size == 0 and c.evicted_tokens == 300
    c.check_invariants()


def test_a_parent_left_childless_becomes_an_evictable_leaf_in_turn():
    c = RadixCache(1000)
    put(c, seq(("sys", 100), ("q1", 10)))
    put(c, seq(("sys", 100), ("q2", 10)))
    assert c.evict(20) == 20  # both question leaves
    assert c.tree_size == 100 and len(c.root.children) == 1
    assert c.evict(1) == 100  # the system prompt, now a leaf itself
    c.check_invariants()


def test_eviction_never_touches_a_node_a_running_request_holds():
    c = RadixCache(1000)
    put(c, seq(("sys", 100), ("q1", 10)))
    put(c, seq(("other", 300)))
    n, node = c.match_prefix(seq(("sys", 100), ("q9", 10)), 110)  # a running request locks sys
    c.inc_lock(node)
    assert c.protected_size == 100 and c.evictable_size == 310
    assert c.evict(10_000) == 310  # everything but the locked path
    assert c.match_prefix(seq(("sys", 100)), 100)[0] == 100
    assert c.evictable_size == 0
    c.dec_lock(node)
    assert c.evictable_size == 100 and c.evict(1) == 100
    c.check_invariants()


def test_alloc_evicts_when_the_free_pool_is_short_and_fails_only_past_evictable():
    c = RadixCache(300)
    put(c, seq(("a", 200)))
    assert c.free == 100
    assert c.alloc(150)  # evicts the cached 200 to make room
    assert c.tree_size == 0 and c.private == 150
    assert not c.alloc(151) and c.private == 150  # nothing left to evict: nothing taken


def test_truncate_mode_cuts_the_oldest_leaf_by_just_what_is_needed():
    """TGI's radix.rs::evict: a leaf with more blocks than needed loses only its tail."""
    c = RadixCache(300, evict_mode="truncate")
    put(c, seq(("a", 200)))
    assert c.alloc(150)  # 100 free, 50 short
    assert c.tree_size == 150 and c.match_prefix(seq(("a", 200)), 200)[0] == 150


def test_request_tokens_are_prompt_runs_then_outputs():
    r = Request("x", 0.0, 30, 10, prompt_runs=((("sys", 0), 20), (("u", 1), 10)))
    r.num_output_tokens = 3
    assert request_tokens(r) == [(("sys", 0), 0, 20), (("u", 1), 0, 10), (("out", "x"), 0, 3)]
    assert request_tokens(r, 25) == [(("sys", 0), 0, 20), (("u", 1), 0, 5)]


def test_disabled_cache_keeps_nothing():
    c = RadixCache(100, enabled=False)
    assert c.alloc(50)
    assert c.insert(seq(("a", 50)), 50, 0) == 0 and c.tree_size == 0
    assert c.match_prefix(seq(("a", 50)), 50)[0] == 0


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="page_size"):
        RadixCache(100, page_size=0)
    with pytest.raises(ValueError, match="evict_mode"):
        RadixCache(100, evict_mode="lfu")
