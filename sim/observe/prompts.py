"""Prompts of the requested token counts, for a server that never saw cbsim's workload.

Why two kinds: a simulated request is only a length, a real server needs content. The exact way
is a prompt of token ids (vLLM's ``/v1/completions`` takes a list of ids as ``prompt``): its
length is exactly the workload's. Servers and APIs that take only text (``/v1/chat/completions``,
many OpenAI-compatible servers) get text fitted to the length with the server's own tokenizer
(vLLM's ``/tokenize``); where the server has none, the text is an estimate (one word per token)
and the run says so. Either way the server's usage counts are recorded per request, so what
was really served is known.

Content follows the workload's ``prompt_runs``: runs with the same key get the same tokens, so a
workload with shared prefixes shares them on the server (its prefix cache sees the real reuse),
and every other prompt is unique (random ids: no accidental cache hits).
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

# words for text prompts: short, common, each one token in most tokenizers
WORDS = ("the of and to in is it for on as at by be or an we are this that with from have not but all "
         "can one two new use may any day way see get out who now old man sea air ask run art sun sky red "
         "big low top end war law car dog cat job oil box key tea map law fan gas hat ice joy kit lip mix "
         "net pen pot rat row sit tie van web yes zoo").split()


def _stream(seed: int, key: Any) -> np.random.Generator:
    """A random stream for one prompt run, stable across processes (no ``hash()``)."""
    return np.random.default_rng([seed, zlib.crc32(repr(key).encode("utf-8"))])


def token_range(vocab_size: int) -> tuple[int, int]:
    """Ids to draw prompt tokens from: the middle of the vocabulary, clear of the special tokens
    that tokenizers put at either end (Llama-2's 0-2 at the bottom, Llama-3's and Qwen's at the top)."""
    lo = min(max(3, vocab_size // 100), vocab_size - 1)
    hi = max(lo + 1, int(vocab_size * 0.9))
    return lo, hi


def token_id_prompt(spec, vocab_size: int, seed: int = 0) -> list[int]:
    """The prompt of one :class:`sim.workload.request_spec.RequestSpec` as token ids."""
    lo, hi = token_range(vocab_size)
    runs = spec.prompt_runs or ((("req", spec.id), spec.prompt_tokens),)
    out: list[int] = []
    for key, length in runs:
        out.extend(_stream(seed, key).integers(lo, hi, size=length).tolist())
    return out[:spec.prompt_tokens]


def text_of_words(spec, words: int, seed: int = 0) -> str:
    """``words`` words of text for one request, shared runs first (as :func:`token_id_prompt`)."""
    runs = spec.prompt_runs or ((("req", spec.id), spec.prompt_tokens),)
    total = max(sum(length for _, length in runs), 1)
    words = max(words, 1)
    out: list[str] = []
    done = 0
    for key, length in runs:  # words split in proportion to the runs, summing to `words` exactly
        upto = round(words * (done + length) / total)
        n = upto - round(words * done / total)
        done += length
        out.extend(WORDS[i] for i in _stream(seed, key).integers(0, len(WORDS), size=n))
    return " ".join(out)


async def fit_text_prompt(spec, count_tokens, seed: int = 0, tries: int = 6) -> tuple[str, int | None]:
    """Text whose token count (by ``count_tokens(text)``, an async function giving the server's
    count, or None when the server cannot count) is the request's prompt length, found by
    adjusting the word count; returns the text and its count (None: not counted, an estimate)."""
    target = spec.prompt_tokens
    words = target
    best: tuple[int, str, int] | None = None
    for _ in range(tries):
        text = text_of_words(spec, words, seed)
        n = await count_tokens(text)
        if n is None:
            return text, None
        if best is None or abs(n - target) < best[0]:
            best = (abs(n - target), text, n)
        if n == target:
            break
        words = max(1, words + (target - n))
    assert best is not None
    return best[1], best[2]
