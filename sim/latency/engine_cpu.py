"""The engine's own CPU time per step, and how asynchronous scheduling adds it to the GPU's.

Kernel measurements (a profile bundle, a kernel database, calib's forward passes) see only the
GPU. A serving engine also spends CPU time on every step that no kernel shows: the scheduler
(which requests run, KV blocks), input preparation (block tables, slot mapping, positions, the
host-to-device copy), launching the step, and output processing (appending sampled tokens,
stop checks, handing outputs to the frontend). A table carries this as the ``engine_cpu``
component, by the number of sequences the step schedules (the work is per request).

How it adds up depends on the engine (``engine.async_scheduling``):

- **synchronous** (vLLM before 0.14 without ``--async-scheduling``, or ``--no-async-scheduling``;
  :func:`async_scheduling_default`): the CPU work and the
  GPU work of a step run one after the other: ``step = gpu + engine_cpu``.
- **asynchronous** (vLLM's ``--async-scheduling``, on by default since vLLM 0.14): the engine
  schedules and prepares step n+1 while the GPU runs step n and processes step n's outputs while
  the GPU runs step n+1, so a step takes as long as the slower of the two:
  ``step = max(gpu, engine_cpu)``. The GPU idles only when the CPU cannot keep up (small models,
  large batches).

Defaults per engine version (:data:`DEFAULTS`) are figures we hold fixed for every run, never
fitted to a run being predicted. vLLM's are engineering estimates bracketed by published
measurements (cited per entry); SGLang's per-sequence figure is bracketed by published
measurements and fitted as one global term on the public serving corpus with leave-one-model-out
checking (its entry says how). With asynchronous scheduling (SGLang's overlap scheduler) and
steps of tens of milliseconds they are hidden entirely, so predictions of such runs do not depend
on them.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.errors import CbsimError


@dataclass(frozen=True, slots=True)
class EngineCpu:
    """``fixed_s + per_seq_s × sequences`` of CPU time per step."""

    engine: str
    versions: str  # the engine versions this entry is for, in words
    fixed_s: float
    per_seq_s: float
    source: str

    def seconds(self, num_seqs: int) -> float:
        return self.fixed_s + self.per_seq_s * max(int(num_seqs), 0)

    def describe(self) -> dict:
        return {"engine": self.engine, "versions": self.versions, "fixed_s": self.fixed_s,
                "per_seq_s": self.per_seq_s, "source": self.source}


# (engine, first version) -> default; an engine version takes the entry of the newest first
# version at or below it
# (Each entry's ``source`` is recorded in the tables built with it: changing the text changes every
# shipped table's provenance. Which form a corpus row adds the term in, asynchronous or synchronous,
# is its server's, not a fit: :func:`async_scheduling_default` and docs/accuracy-corpus.md.)
DEFAULTS: dict[tuple[str, tuple[int, ...]], EngineCpu] = {
    ("vllm", (0, 6)): EngineCpu(
        "vllm", "0.6 to 0.7 (V0 engine)", 4e-3, 20e-6,
        "vLLM RFC #6854 (V0, multi-step scheduling): 5-13 ms of GPU bubble per decode step from input and "
        "output processing and the scheduler; RFC #6913: output processing alone 3.4 ms at batch 32 "
        "(Llama-3-70B, 4xH100). 4 ms + 20 us per sequence: 4.6 ms at 32, 9 ms at 256."),
    ("vllm", (0, 8)): EngineCpu(
        "vllm", "0.8 and later (V1 engine)", 1.5e-3, 10e-6,
        "vLLM issue #10634 (early V1, Llama-2-7B, batch 256, ShareGPT): 5-6 ms between two decode steps "
        "(the scheduler contending for the GIL with the frontend's IPC); later V1 releases run the "
        "engine core in its own process with a persistent input batch. "
        "1.5 ms + 10 us per sequence: 4.1 ms at 256 sequences, below that early-V1 gap. Checked on the "
        "corpus' 311 vLLM rows (AIConfigurator's silicon_sample.csv) leave-one-model-out, "
        "bench/engine_cpu_lomo.py --engine vllm: asynchronous it is never longer than those rows' GPU steps "
        "(no row's TPOT moves); a global term chosen on the other models, asynchronous or synchronous, "
        "made 3 of 4 held-out models worse (Llama-3.1-70B 7.1 % -> 14.5 % median |TPOT err|), and the "
        "same figure synchronous helps Qwen3-32B (17.6 % -> 7.2 %) but not Llama-3.1-70B (7.1 % -> "
        "10.8 %), so it stays as it is (docs/accuracy-corpus.md)."),
    ("sglang", (0, 4)): EngineCpu(
        "sglang", "0.4 and later (overlap scheduler on by default)", 0.0, 40e-6,
        "Per request and step: the scheduler's process_batch_result_decode (append each request's token, "
        "check its stop conditions, stream it to the detokenizer), then the detokenizer's and the tokenizer "
        "manager's work on every request's token in their own processes. The overlap scheduler hides all "
        "of it under the GPU step until it is the longer (lmsys.org/blog/2024-12-04-sglang-v0-4), so a "
        "step is max(gpu, cpu) (engine.async_scheduling). sgl-project/sglang #23393 brackets the "
        "per-request cost: the client-side ITL equals the scheduler's at 128 running requests and is 4.6x "
        "it at 1,024 (180 vs 39 ms; a slow tokenizer: up to ~176 us per request); #29367: the tokenizer "
        "manager is the bottleneck at high concurrency. 40 us per sequence is a global term fitted on "
        "the corpus' SGLang rows (AIConfigurator's silicon_sample.csv) with leave-one-model-out checking, "
        "bench/engine_cpu_lomo.py: chosen on Llama-3.1-8B H200 (median |TPOT err| 19.7 % -> 13.3 %), "
        "held-out Qwen3-32B H100 13.6 % -> 13.6 % (its GPU steps are longer than 40 us x its <= 128 "
        "sequences, so it neither confirms nor refutes the figure). No per-step fixed part: the "
        "Qwen3-32B H100 TP 8 rows measure 7.6-8.8 ms TPOT at 16 clients, and a fixed part fitted on the "
        "8B rows (12 ms) made the held-out Qwen3-32B rows worse (13.6 % -> 26.4 %)."),
}


def parse_version(version: str) -> tuple[int, ...]:
    parts = []
    for piece in str(version).lstrip("v").split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) != len(piece):
            break
    return tuple(parts)


def engine_cpu_default(engine: str, version: str) -> EngineCpu:
    """The default engine CPU time of an engine version (see :data:`DEFAULTS`)."""
    v = parse_version(version)
    entries = sorted((first, e) for (name, first), e in DEFAULTS.items() if name == engine)
    if not entries:
        known = sorted({name for name, _ in DEFAULTS})
        raise CbsimError(f"no engine CPU default for engine {engine!r}; known engines: {', '.join(known)}")
    if not v:
        raise CbsimError(f"engine version {version!r} of {engine} is not a version number (e.g. 0.19.0)")
    chosen = [e for first, e in entries if first <= v]
    if not chosen:
        raise CbsimError(f"no engine CPU default for {engine} {version}: the oldest covered is "
                         f"{'.'.join(map(str, entries[0][0]))}")
    return chosen[-1]


# The first version of an engine whose server schedules asynchronously when no flag says otherwise.
# vLLM: async scheduling came in as an opt-in ``--async-scheduling`` (PR #19970, 2025-07) and became
# the default in v0.14.0 (PR #27614; v0.14.0 release notes, "Breaking Changes: Async scheduling is now
# enabled by default ... disable with --no-async-scheduling"; v0.11.1's notes: "We expect
# --async-scheduling to be enabled by default in the next release"; vllm-project/recipes #131, 2025-12-01,
# still calls the flag something to enable). A vLLM 0.8-0.13 server without the flag ran synchronously.
# SGLang's overlap scheduler, the same overlap, has been on by default since 0.4.
ASYNC_SCHEDULING_SINCE: dict[str, tuple[int, ...]] = {"vllm": (0, 14), "sglang": (0, 4)}


def async_scheduling_default(engine: str, version: str) -> bool:
    """Whether ``engine`` at ``version`` schedules asynchronously by default (a server launched
    without ``--async-scheduling`` / ``--no-async-scheduling``): what a scenario of that server sets
    as ``engine.async_scheduling``. An unknown engine or an unparsable version raises: the caller
    decides what an unknown version means."""
    first = ASYNC_SCHEDULING_SINCE.get(engine)
    if first is None:
        known = ", ".join(sorted(ASYNC_SCHEDULING_SINCE))
        raise CbsimError(f"no async scheduling default for engine {engine!r}; known engines: {known}")
    v = parse_version(version)
    if not v:
        raise CbsimError(f"engine version {version!r} of {engine} is not a version number (e.g. 0.19.0)")
    return v >= first


def combine(gpu_s: float, cpu_s: float, async_scheduling: bool) -> float:
    """A step's wall time from its GPU time and the engine's CPU time (module docstring)."""
    return (gpu_s if gpu_s > cpu_s else cpu_s) if async_scheduling else gpu_s + cpu_s
