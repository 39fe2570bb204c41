"""Content identity of full KV blocks, for prefix caching.

vLLM hashes each full block as ``hash((parent_hash, block_token_ids, extra_keys))``: a block's
identity is its own tokens *and* everything before it, so two requests share block ``i`` exactly
when their first ``(i + 1) * block_size`` tokens agree. We have no token ids; a request describes
its prompt as runs (``Request.prompt_runs``: token ``i`` of run ``(key, n)`` is ``(key, i)``) and
its generated token ``j`` as ``(output_key, j)``. A block's content is therefore a short tuple of
segments ``(key, first_index, length)`` (adjacent segments that continue one another are merged,
so equal token sequences always give equal tuples), and its identity is the pair
``(parent_id, content)``.

Identities are *interned*: each new ``(parent_id, content)`` pair gets the next small integer. So
block hashes are exact (no collisions), cheap to compare and store, and the same in every process
(Python's ``hash`` of a ``str`` is salted per process; we never use it as an identity).

Hashing is lazy: a request's hashes are computed only as far as a lookup or a registration needs,
and only when prefix caching is on.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

NONE_HASH = 0  # the parent of a request's first block


class RequestBlockHashes:
    """One request's block hashes so far, plus what is needed to compute the next ones."""

    __slots__ = ("hashes", "_starts", "_runs", "_prompt_len", "_output_key")

    def __init__(self, prompt_runs: tuple[tuple[Any, int], ...], prompt_len: int, output_key: Any) -> None:
        total = sum(n for _, n in prompt_runs)
        if total != prompt_len:
            raise ValueError(f"prompt_runs cover {total} tokens but the prompt has {prompt_len}")
        self.hashes: list[int] = []
        self._runs = [(k, n) for k, n in prompt_runs if n > 0]
        starts, t = [], 0
        for _, n in self._runs:
            starts.append(t)
            t += n
        self._starts = starts
        self._prompt_len = prompt_len
        self._output_key = output_key

    def content(self, s: int, e: int) -> Any:
        """Canonical description of tokens ``[s, e)``."""
        segs: list[tuple[Any, int, int]] = []
        t = s
        if t < self._prompt_len:
            k = bisect_right(self._starts, t) - 1
            key, n = self._runs[k]
            off = t - self._starts[k]
            if off + (e - t) <= n:  # the common case: the block lies inside one run
                return (key, off, e - t)
            while t < e and t < self._prompt_len:
                key, n = self._runs[k]
                off = t - self._starts[k]
                take = min(n - off, e - t)
                segs.append((key, off, take))
                t += take
                k += 1
        if t < e:
            segs.append((self._output_key, t - self._prompt_len, e - t))
        if len(segs) == 1:
            return segs[0]
        merged = [segs[0]]
        for key, off, n in segs[1:]:
            pk, poff, pn = merged[-1]
            if pk == key and poff + pn == off:
                merged[-1] = (pk, poff, pn + n)
            else:
                merged.append((key, off, n))
        return merged[0] if len(merged) == 1 else tuple(merged)


class BlockHasher:
    """Interns ``(parent_id, content)`` pairs into small integers (ids start at 1)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._ids: dict[tuple[int, Any], int] = {}

    def __len__(self) -> int:
        return len(self._ids)

    def new_request(self, prompt_runs, prompt_len: int, output_key: Any) -> RequestBlockHashes:
        return RequestBlockHashes(prompt_runs, prompt_len, output_key)

    def extend(self, rh: RequestBlockHashes, num_blocks: int) -> list[int]:
        """Make sure ``rh.hashes`` holds the first ``num_blocks`` block hashes; return the list.

        The caller guarantees those blocks are full of known tokens.
        """
        hashes = rh.hashes
        B = self.block_size
        ids = self._ids
        while len(hashes) < num_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else NONE_HASH
            key = (parent, rh.content(i * B, (i + 1) * B))
            h = ids.get(key)
            if h is None:
                h = len(ids) + 1
                ids[key] = h
            hashes.append(h)
        return hashes

    def hash_at(self, rh: RequestBlockHashes, i: int) -> int:
        """Hash of block ``i`` (computing the ones before it if needed)."""
        if i < len(rh.hashes):
            return rh.hashes[i]
        return self.extend(rh, i + 1)[i]
