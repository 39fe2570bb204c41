"""The model names people type, matched to a local config.json of the same architecture.

Why: a user writes the id the Hugging Face Hub shows (``meta-llama/Llama-3.1-70B-Instruct``,
``Qwen/Qwen3-30B-A3B-Instruct-2507``), while the configs found locally are often the base
checkpoint of the same network under another spelling (``meta-llama/Meta-Llama-3.1-70B``,
``Qwen/Qwen3-30B-A3B``). An instruction-tuned or dated release shares its base model's
config.json field for field (layers, widths, heads, experts); only the weights differ, and cbsim
prices shapes, not weights. So a name is reduced to a *key* that drops exactly those variant words
(``Instruct``, ``Chat``, ``Base``, ``-it``, ``-hf``, a 4-digit release date such as ``2507``, the
``Meta-`` prefix, the ``FP8`` suffix, case), and a config with the same key serves it.

FP8 is a variant of the weights' storage, not of the architecture: a request for ``...-FP8`` served
by an unquantized config is priced with ``quantization: fp8`` (and the reverse keeps the config's
own), and the caller says so.

Suggestions (when no key matches) stay inside the family (``llama``, ``qwen``, ``mixtral``...)
and prefer the same size: a Llama is never offered for a Qwen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Words that name a release of the same network, not a different one.
_VARIANT_WORDS = frozenset({"instruct", "chat", "base", "it", "hf", "fp8"})
_DATE = re.compile(r"^\d{4}$")  # Qwen's 2507, Mistral's 2501: release dates
_SIZE = re.compile(r"^(\d+x)?\d+(\.\d+)?[bm]$")  # 70b, 0.6b, 8x7b
_FAMILY = re.compile(r"^[a-z]+")


@dataclass(frozen=True, slots=True)
class NameKey:
    """What of a model name identifies its architecture."""

    org: str  # lower-case organisation ("meta-llama")
    key: str  # the name without variant words ("llama-3.1-70b")
    family: str  # leading letters of the name ("llama", "qwen", "mixtral")
    size: str | None  # the parameter-count word ("70b", "30b"), None when the name has none
    fp8: bool  # the name says FP8


def name_key(name: str) -> NameKey:
    """The :class:`NameKey` of ``ORG/NAME`` (or a bare ``NAME``)."""
    org, _, rest = name.rpartition("/")
    words = [w for w in re.split(r"[-_]", rest.lower()) if w]
    if words[:1] == ["meta"] and len(words) > 1:  # Meta-Llama-3.1-70B is Llama-3.1-70B
        words = words[1:]
    fp8 = "fp8" in words
    kept = [w for w in words if w not in _VARIANT_WORDS and not _DATE.match(w)]
    size = next((w for w in kept if _SIZE.match(w)), None)
    family = _FAMILY.match(kept[0]).group(0) if kept and _FAMILY.match(kept[0]) else (kept[0] if kept else "")
    return NameKey(org=org.lower(), key="-".join(kept), family=family, size=size, fp8=fp8)


def same_architecture(name: str, candidates: list[str]) -> str | None:
    """The candidate that is ``name`` under another spelling or release (same key), or None.

    Among several: the exact name ignoring case first, then the same FP8-ness, then the same
    organisation, then the shortest name (the plainest release), then alphabetical order: one
    answer for one set of files, whatever order they were listed in."""
    want = name_key(name)
    exact = [c for c in candidates if c.lower() == name.lower()]
    if exact:
        return sorted(exact)[0]
    same = [c for c in candidates if name_key(c).key == want.key and want.key]
    if not same:
        return None

    def rank(c: str) -> tuple:
        k = name_key(c)
        return (k.fp8 != want.fp8, k.org != want.org, len(c), c)

    return min(same, key=rank)


def family_suggestions(name: str, candidates: list[str], limit: int = 3) -> list[str]:
    """Up to ``limit`` candidates of the same family, the same size first; never another family."""
    want = name_key(name)
    if not want.family:
        return []
    family = [c for c in candidates if name_key(c).family == want.family]

    def rank(c: str) -> tuple:
        k = name_key(c)
        return (k.size != want.size, k.org != want.org, _size_distance(k.size, want.size), c)

    return sorted(family, key=rank)[:limit]


def _size_distance(a: str | None, b: str | None) -> float:
    """How far apart two parameter counts are (log-free: a ratio), so 70B suggests 72B before 8B."""
    va, vb = _size_value(a), _size_value(b)
    if va is None or vb is None:
        return float("inf")
    return max(va, vb) / min(va, vb)


def _size_value(size: str | None) -> float | None:
    if not size:
        return None
    m = re.match(r"^(?:(\d+)x)?(\d+(?:\.\d+)?)([bm])$", size)
    if not m:
        return None
    n = float(m.group(2)) * (int(m.group(1)) if m.group(1) else 1)
    return max(n * (1e-3 if m.group(3) == "m" else 1.0), 1e-6)
