"""A cbsim latency table from an LLMServingSim profile bundle (``cbsim calibrate --from-llmservingsim``).

LLMServingSim (casys-kaist/LLMServingSim, MIT) profiles a model inside a real vLLM on a GPU, one
decoder layer at a time, and publishes the result as a *bundle*::

    BUNDLE/meta.yaml                 how it was measured (vLLM and CUDA versions, GPU, engine
                                     settings of the profiling run, grids)
    BUNDLE/tp<N>/dense.csv           layer,tokens,time_us: one decoder layer's operators by the
                                     number of tokens in the step
    BUNDLE/tp<N>/per_sequence.csv    layer,sequences,time_us: lm_head and sampler by the number of
                                     sequences in the step
    BUNDLE/tp<N>/attention.csv       prefill_chunk,kv_prefill,n_decode,kv_decode,time_us: one
                                     layer's attention for a step holding one prefill chunk over
                                     earlier context plus n_decode decodes at kv_decode context

Why a bundle maps onto cbsim's table almost one to one: both price a step as a sum over the same
pieces. The composition (per step, ``L`` = the model's decoder layers, as LLMServingSim's own
``profiler/models/llama.yaml`` sequence lists them):

- ``linear(T)`` = ``embedding(T) + final_layernorm(T) + L × (2 × layernorm + qkv_proj +
  rotary_emb + o_proj + gate_up_proj + act_fn + down_proj)(T)``: a Llama layer has two RMSNorms
  (before attention and before the MLP), the bundle times one.
- ``per_seq(S)`` = ``lm_head(S) + sampler(S)``: vLLM V1 computes logits and samples one position
  per scheduled sequence (partial prefill chunks included), not per token.
- ``prefill_attn(n, c)`` = ``L × attention(n, c, 0, 0)``; a 1-token chunk (a prompt remainder) is
  priced as one decode, ``L × attention(0, 0, 1, max(c, 16))``.
- ``decode_attn(b, c̄)`` = ``L × attention(0, 0, b, c̄)``, for steps of decodes only.
- ``decode_attn_mixed(b, c̄)`` = ``L × median over (n, c) of [attention(n, c, b, c̄) −
  attention(n, c, 0, 0)]``: the decodes of a step that also holds a prefill chunk. They run in the
  same varlen attention launch as the chunk and measure up to 2.5× slower than alone (RTX 4090,
  b = 128 at 1k context: 606 µs alone, about 1,490 µs beside a chunk), almost independently of
  the chunk; a sum of the two pure grids would miss that.

Where the bundle is silent, the table says so in ``metadata.json`` (``fit.modelled``):

- the engine's own CPU time per step (``engine_cpu``) is not a kernel: it comes from
  :mod:`sim.latency.engine_cpu`'s defaults for the bundle's engine version;
- tensor parallelism's all-reduces are not in a bundle (it shards one GPU's layer and times it
  alone): for ``--tp`` > 1 they are modelled as two ring all-reduces of ``T × hidden`` activations
  per layer (:func:`allreduce_seconds`);
- the bundles were measured with ``enforce_eager`` (every kernel launched from Python, no
  ``torch.compile`` fusions) while served runs use CUDA graphs; the CSVs are kernel times from
  vLLM's layerwise profiler, which excludes launch gaps, so they stand for graph-mode GPU time
  as they are (no correction is applied; the unfused RMSNorm/SiLU/rotary kernels make them a few
  per cent slow for large steps);
- grid points off the bundle's complete sub-grids (e.g. the RTX PRO 6000 bundle's extra chunk
  sizes that were profiled at some contexts only) are dropped: cbsim's grids are full products.

Reading never needs torch; the module only needs numpy and yaml.
"""

from __future__ import annotations

import csv
import datetime as _dt
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import CbsimError
from sim.recorded.llmservingsim_bench import KNOWN_MODELS  # HF ids -> cbsim ids of the same shape

# the operators of one decoder layer, with how many times a layer runs each (LLMServingSim's
# profiler/models/llama.yaml: pre_attn [layernorm, qkv_proj, rotary_emb, attention],
# post_attn [o_proj, layernorm], mlp_dense [gate_up_proj, act_fn, down_proj])
LAYER_OPS: dict[str, int] = {"layernorm": 2, "qkv_proj": 1, "rotary_emb": 1, "o_proj": 1,
                             "gate_up_proj": 1, "act_fn": 1, "down_proj": 1}
STEP_OPS: dict[str, int] = {"embedding": 1, "final_layernorm": 1}  # once per step (prologue, head)
PER_SEQUENCE_OPS = ("lm_head", "sampler")
ARCHITECTURES = ("llama",)  # dense Llama-style decoders: what cbsim's ModelSpec describes

VARIANT_DTYPES = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}

# tensor-parallel all-reduce model (only for --tp > 1; a bundle holds none)
ALLREDUCE_LATENCY_S = 10e-6  # per all-reduce call: NCCL's small-message latency on one node
ALLREDUCES_PER_LAYER = 2  # after o_proj and after down_proj (Megatron-style row-parallel layers)


@dataclass
class Bundle:
    """The measurements of one ``tp<N>/`` folder of a bundle, in seconds."""

    path: Path
    meta: dict[str, Any]
    tp: int
    dense: dict[str, dict[int, float]]  # operator -> tokens -> seconds (one layer)
    per_sequence: dict[str, dict[int, float]]  # operator -> sequences -> seconds
    attention: dict[tuple[int, int, int, int], float]  # (chunk, kv_prefill, n_decode, kv_decode) -> s
    dropped: dict[str, int] = field(default_factory=dict)  # grid points left out, per component

    @property
    def engine_version(self) -> str:
        return str(self.meta.get("vllm_version") or "unknown")

    @property
    def gpu(self) -> str:
        return str(self.meta.get("gpu") or self.meta.get("hardware") or "unknown GPU")


# ------------------------------------------------------------------------------------------------
# reading
# ------------------------------------------------------------------------------------------------
def read_bundle(path: str | Path, tp: int = 1) -> Bundle:
    """Read ``BUNDLE/meta.yaml`` and ``BUNDLE/tp<tp>/*.csv``; every problem is one CbsimError line
    naming the file and the fix."""
    import yaml

    root = Path(path)
    if not root.exists():
        raise CbsimError(f"--from-llmservingsim {str(path)!r} does not exist; give a profile bundle folder "
                         f"(holding meta.yaml and tp<N>/), e.g. ../shared/reference/gpu-runs/"
                         f"rtx4090-llama-3.1-8b/profile")
    if not root.is_dir():
        raise CbsimError(f"--from-llmservingsim {str(path)!r} is a file; give the bundle's folder (holding "
                         f"meta.yaml and tp<N>/)")
    meta_path = root / "meta.yaml"
    if not meta_path.is_file():
        raise CbsimError(f"{root}: no meta.yaml; an LLMServingSim bundle folder holds meta.yaml and one tp<N>/ "
                         f"folder per tensor-parallel degree")
    try:
        meta = yaml.safe_load(meta_path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise CbsimError(f"{meta_path}: YAML syntax error: {str(exc).splitlines()[0]}") from None
    except UnicodeDecodeError:
        raise CbsimError(f"{meta_path}: not a UTF-8 text file") from None
    if not isinstance(meta, dict):
        raise CbsimError(f"{meta_path}: must hold a mapping (vllm_version, gpu, model, variant, "
                         f"engine_effective, ...)")
    arch = meta.get("architecture")
    if arch is not None and arch not in ARCHITECTURES:
        raise CbsimError(f"{meta_path}: architecture {arch!r} is not supported; cbsim composes dense "
                         f"Llama-style decoders ({', '.join(ARCHITECTURES)}) from a bundle")
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise CbsimError(f"--tp must be a positive integer, got {tp!r}")
    folder = root / f"tp{tp}"
    if not folder.is_dir():
        have = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name.startswith("tp"))
        raise CbsimError(f"{root}: no tp{tp}/ folder; this bundle was profiled at "
                         f"{', '.join(have) or 'no tensor-parallel degree'}: pass --tp with one of those")
    dense = _read_by_count(folder / "dense.csv", "tokens")
    per_seq = _read_by_count(folder / "per_sequence.csv", "sequences")
    attention = _read_attention(folder / "attention.csv")
    for op in (*LAYER_OPS, *STEP_OPS):
        if op not in dense:
            raise CbsimError(f"{folder / 'dense.csv'}: no rows for operator {op!r}; a Llama bundle times "
                             f"{', '.join((*STEP_OPS, *LAYER_OPS))}")
    for op in PER_SEQUENCE_OPS:
        if op not in per_seq:
            raise CbsimError(f"{folder / 'per_sequence.csv'}: no rows for {op!r}; expected "
                             f"{', '.join(PER_SEQUENCE_OPS)}")
    return Bundle(root, meta, tp, dense, per_seq, attention)


def _rows(path: Path, header: tuple[str, ...]) -> list[tuple[int, list[str]]]:
    if not path.is_file():
        raise CbsimError(f"{path}: missing; a bundle's tp<N>/ folder holds dense.csv, per_sequence.csv and "
                         f"attention.csv")
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
    except UnicodeDecodeError:
        raise CbsimError(f"{path}: not a UTF-8 text file") from None
    if not rows or tuple(c.strip() for c in rows[0]) != header:
        raise CbsimError(f"{path}: the first line must be the header {','.join(header)}")
    out = []
    for lineno, row in enumerate(rows[1:], start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise CbsimError(f"{path}:{lineno}: expected {len(header)} fields ({','.join(header)}), got {len(row)}")
        out.append((lineno, [c.strip() for c in row]))
    if not out:
        raise CbsimError(f"{path}: has a header but no rows")
    return out


def _int(text: str, path: Path, lineno: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise CbsimError(f"{path}:{lineno}: {what} must be an integer, got {text!r}") from None
    if value < 0:
        raise CbsimError(f"{path}:{lineno}: {what} must be >= 0, got {value}")
    return value


def _seconds(text: str, path: Path, lineno: int) -> float:
    try:
        value = float(text)
    except ValueError:
        raise CbsimError(f"{path}:{lineno}: time_us must be a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise CbsimError(f"{path}:{lineno}: time_us must be a finite number >= 0, got {text!r}")
    return value * 1e-6


def _read_by_count(path: Path, count: str) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for lineno, (layer, n, t) in _rows(path, ("layer", count, "time_us")):
        k = _int(n, path, lineno, count)
        bucket = out.setdefault(layer, {})
        if k in bucket:
            raise CbsimError(f"{path}:{lineno}: {layer} at {count} {k} appears twice; keep one row per point")
        bucket[k] = _seconds(t, path, lineno)
    return out


def _read_attention(path: Path) -> dict[tuple[int, int, int, int], float]:
    header = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us")
    out: dict[tuple[int, int, int, int], float] = {}
    for lineno, row in _rows(path, header):
        key = tuple(_int(v, path, lineno, name) for v, name in zip(row[:4], header))
        if key in out:
            raise CbsimError(f"{path}:{lineno}: the point {dict(zip(header, key))} appears twice")
        out[key] = _seconds(row[4], path, lineno)
    return out


# ------------------------------------------------------------------------------------------------
# composing the table
# ------------------------------------------------------------------------------------------------
def resolve_model(bundle: Bundle, model: str | None = None):
    """The cbsim ModelSpec the bundle measured: ``model`` when given (a cbsim id or anything
    ``sim.models.get_model`` resolves), else the bundle's ``model`` via :data:`KNOWN_MODELS`."""
    from sim.hardware.models import get_model

    if model is not None:
        spec = get_model(model)
    else:
        name = bundle.meta.get("model")
        try:
            spec = get_model(name)
        except CbsimError:
            if name not in KNOWN_MODELS:
                raise CbsimError(f"{bundle.path / 'meta.yaml'}: model {name!r} is not one cbsim knows; pass "
                                 f"--model with a cbsim model id or a Hugging Face config.json of the same "
                                 f"shape") from None
            spec = get_model(KNOWN_MODELS[name])
    variant = str(bundle.meta.get("variant") or spec.dtype)
    dtype = VARIANT_DTYPES.get(variant)
    if dtype is None:
        raise CbsimError(f"{bundle.path / 'meta.yaml'}: variant {variant!r} is not a dtype cbsim models "
                         f"({', '.join(VARIANT_DTYPES)}); quantized bundles are not supported")
    if dtype != spec.dtype:
        from dataclasses import replace

        spec = replace(spec, dtype=dtype)
    _check_shape(bundle, spec)
    return spec


def _check_shape(bundle: Bundle, spec) -> None:
    """The profiling run's ``hf_overrides`` name the shard it built: refuse a model of another
    shape (a bundle of one model would silently price another)."""
    over = (bundle.meta.get("engine_effective") or {}).get("hf_overrides") or {}
    degrees = bundle.meta.get("tp_degrees") or [1]
    if over.get("num_hidden_layers", 1) != 1:
        raise CbsimError(f"{bundle.path / 'meta.yaml'}: the bundle was profiled with num_hidden_layers "
                         f"{over.get('num_hidden_layers')}; cbsim reads per-layer bundles (1 layer)")
    # the overrides recorded are those of the last degree profiled (each shard is built unsharded)
    last = max(int(d) for d in degrees)
    checks = {"intermediate_size": spec.intermediate_size, "num_attention_heads": spec.num_heads,
              "num_key_value_heads": spec.num_kv_heads}
    for key, full in checks.items():
        got = over.get(key)
        if got is not None and got * last != full and got != full:
            raise CbsimError(f"{bundle.path / 'meta.yaml'}: the bundle's {key} is {got} (at tp {last}) but model "
                             f"{spec.name!r} has {full}; pass --model with the model the bundle measured")


def complete_subgrid(points: dict[tuple[int, int], float]) -> tuple[list[int], list[int], int]:
    """The largest full Cartesian grid (xs, ys) inside a set of measured (x, y) points, and how
    many points it leaves out. Greedy over the y-sets of the rows: each row's y-set, kept with
    every row that has all of it, scored by grid size."""
    rows: dict[int, set[int]] = {}
    for x, y in points:
        rows.setdefault(x, set()).add(y)
    best: tuple[int, list[int], list[int]] = (-1, [], [])
    for ys in {frozenset(v) for v in rows.values()}:
        xs = sorted(x for x, have in rows.items() if ys <= have)
        score = len(xs) * len(ys)
        if score > best[0]:
            best = (score, xs, sorted(ys))
    return best[1], best[2], len(points) - best[0]


def _grid1(values: dict[int, float], scale: float = 1.0) -> tuple[list[int], list[float]]:
    xs = sorted(values)
    return xs, [values[x] * scale for x in xs]


def dense_linear(bundle: Bundle, num_layers: int) -> tuple[list[int], list[float]]:
    """``linear(tokens)``: the per-layer operators × layers, plus the once-per-step ones, on the
    token counts every operator was measured at."""
    ops = {**{op: n * num_layers for op, n in LAYER_OPS.items()}, **STEP_OPS}
    tokens = sorted(set.intersection(*(set(bundle.dense[op]) for op in ops)))
    dropped = sum(len(bundle.dense[op]) for op in ops) - len(tokens) * len(ops)
    if dropped:
        bundle.dropped["linear"] = dropped
    values = [sum(bundle.dense[op][t] * k for op, k in ops.items()) for t in tokens]
    return tokens, values


def per_sequence(bundle: Bundle) -> tuple[list[int], list[float]]:
    seqs = sorted(set.intersection(*(set(bundle.per_sequence[op]) for op in PER_SEQUENCE_OPS)))
    return seqs, [sum(bundle.per_sequence[op][s] for op in PER_SEQUENCE_OPS) for s in seqs]


def attention_grids(bundle: Bundle, num_layers: int) -> dict[str, tuple[list[int], list[int], np.ndarray]]:
    """``prefill_attn``, ``decode_attn`` and ``decode_attn_mixed`` (see the module docstring),
    each (xs, ys, values[x][y]) in seconds for all layers."""
    att = bundle.attention
    L = num_layers
    where = bundle.path / f"tp{bundle.tp}" / "attention.csv"
    pre = {(c, k): t for (c, k, n, kd), t in att.items() if n == 0 and c > 0}
    dec = {(n, kd): t for (c, k, n, kd), t in att.items() if c == 0 and n > 0}
    if not pre or not dec:
        raise CbsimError(f"{where}: needs pure-prefill rows (n_decode 0) and pure-decode rows (prefill_chunk 0)")
    # decode_attn: full grid, plus a context-0 column equal to the first measured one (a
    # launch-bound kernel: flat below the first context the bundle measured)
    bs, kvs, drop = complete_subgrid(dec)
    bundle.dropped["decode_attn"] = drop
    dvals = np.array([[dec[(b, k)] for k in kvs] for b in bs]) * L
    d_ctx = ([0] + kvs) if kvs[0] > 0 else kvs
    if kvs[0] > 0:
        dvals = np.concatenate([dvals[:, :1], dvals], axis=1)
    # prefill_attn: full grid, plus a 1-token chunk = one decode at that context
    chunks, ctxs, drop = complete_subgrid(pre)
    bundle.dropped["prefill_attn"] = drop
    pvals = np.array([[pre[(c, k)] for k in ctxs] for c in chunks]) * L
    if chunks[0] > 1:
        one = np.array([_interp(d_ctx, dvals[0], max(k, d_ctx[1] if len(d_ctx) > 1 else k)) for k in ctxs])
        pvals = np.concatenate([one[None, :], pvals], axis=0)
        chunks = [1] + chunks
    # decode_attn_mixed: the decodes' share of mixed steps, median over the chunks they were
    # measured beside; batches never measured mixed keep the last measured row's ratio to pure
    extra: dict[tuple[int, int], list[float]] = {}
    for (c, k, n, kd), t in att.items():
        if c > 0 and n > 0 and (c, k) in pre:
            extra.setdefault((n, kd), []).append(t - pre[(c, k)])
    mixed = np.array(dvals, copy=True)
    measured_rows = []
    for i, b in enumerate(bs):
        row_ok = all((b, k) in extra for k in kvs)
        if not row_ok:
            continue
        measured_rows.append(i)
        vals = np.array([max(float(np.median(extra[(b, k)])), 0.0) for k in kvs]) * L
        mixed[i, -len(kvs):] = vals
        if kvs[0] > 0:
            mixed[i, 0] = vals[0]
    if not measured_rows:
        raise CbsimError(f"{where}: no mixed rows (prefill_chunk > 0 and n_decode > 0) cover a full context grid")
    for i in range(len(bs)):
        if i in measured_rows:
            continue
        ref = min(measured_rows, key=lambda j: abs(j - i))
        ratio = np.where(dvals[ref] > 0, mixed[ref] / np.where(dvals[ref] > 0, dvals[ref], 1.0), 1.0)
        mixed[i] = dvals[i] * ratio
    bundle.dropped["decode_attn_mixed_rows_by_ratio"] = len(bs) - len(measured_rows)
    return {
        "prefill_attn": (chunks, ctxs, pvals),
        "decode_attn": (bs, d_ctx, dvals),
        "decode_attn_mixed": (bs, d_ctx, mixed),
    }


def _interp(xs, ys, x) -> float:
    return float(np.interp(x, xs, ys))


def skew_alpha(bundle: Bundle) -> float:
    """The bundle's pooled decode-skew α for its TP degree (meta.yaml ``skew_fit.per_tp.<tp>.alpha_default``,
    LLMServingSim's ``t = t_mean + α (t_max − t_mean)``), 0 when the bundle did not profile skew. Only
    the pooled constant is used: the bucket table (``skew_fit.csv``) is not part of every bundle."""
    fit = bundle.meta.get("skew_fit") or {}
    if not fit.get("enabled"):
        return 0.0
    per_tp = fit.get("per_tp") or {}
    entry = per_tp.get(bundle.tp, per_tp.get(str(bundle.tp))) or {}
    alpha = entry.get("alpha_default")
    if alpha is None:
        return 0.0
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(alpha):
        raise CbsimError(f"{bundle.path / 'meta.yaml'}: skew_fit.per_tp.{bundle.tp}.alpha_default must be a "
                         f"number, got {alpha!r}")
    return float(min(max(alpha, 0.0), 1.0))


def allreduce_seconds(tokens: list[int], model, tp: int, bus_bytes_per_s: float) -> list[float]:
    """Two ring all-reduces per layer of the step's ``T × hidden`` activations: each moves
    ``2 (tp − 1) / tp`` of the message per GPU, plus a fixed latency per call."""
    if tp == 1:
        return [0.0] * len(tokens)
    per_call = [ALLREDUCE_LATENCY_S + 2 * (tp - 1) / tp * t * model.hidden_size * model.dtype_bytes
                / bus_bytes_per_s for t in tokens]
    return [ALLREDUCES_PER_LAYER * model.num_layers * s for s in per_call]


def bundle_table(bundle: Bundle, model=None, allreduce_bytes_per_s: float | None = None):
    """The latency table (``sim.latency.table_format.LatencyTable``) composed from a bundle."""
    from sim.latency.engine_cpu import engine_cpu_default
    from sim.latency.table_format import FORMAT_VERSION, LatencyTable, make_component

    spec = resolve_model(bundle, model)
    L = spec.num_layers
    tokens, lin = dense_linear(bundle, L)
    modelled = [
        "engine_cpu: not a kernel, not in the bundle; sim.latency.engine_cpu defaults for "
        f"vLLM {bundle.engine_version}",
        "the bundle was measured with enforce_eager; its kernel times (vLLM's layerwise profiler, launch gaps "
        "excluded) are used as they are for the CUDA-graph runs they predict (no fusion correction)",
        "prefill_attn at a 1-token chunk: one decode at that context (the bundle's smallest chunk is 16)",
        "decode_attn at context 0: equal to its first measured context (launch-bound)",
        "decode_attn_mixed: median over the measured chunks of (mixed step - pure prefill chunk); decode "
        "batches never measured beside a chunk keep the nearest measured batch's ratio to pure decode",
        "overhead and step_gap: 0 (kernel times only; the engine's CPU time is engine_cpu)",
    ]
    if bundle.tp > 1:
        bw = allreduce_bytes_per_s
        if bw is None:
            raise CbsimError(f"--tp {bundle.tp}: a bundle holds no all-reduce times; give "
                             f"--allreduce-gbps (the GPUs' all-reduce bus bandwidth, GB/s)")
        ar = allreduce_seconds(tokens, spec, bundle.tp, bw)
        lin = [a + b for a, b in zip(lin, ar)]
        modelled.append(f"tensor-parallel all-reduce: {ALLREDUCES_PER_LAYER} per layer, ring, "
                        f"{ALLREDUCE_LATENCY_S * 1e6:.0f} us + 2(tp-1)/tp x T x hidden x {spec.dtype_bytes} B "
                        f"/ {bw / 1e9:g} GB/s each")
    seqs, pseq = per_sequence(bundle)
    att = attention_grids(bundle, L)
    cpu = engine_cpu_default("vllm", bundle.engine_version)
    alpha = skew_alpha(bundle)
    if alpha:
        modelled.append(f"decode skew: alpha {alpha:g}, the bundle's own pooled skew fit (meta.yaml "
                        f"skew_fit.per_tp.{bundle.tp}.alpha_default), applied to every decode batch")
    else:
        modelled.append("decode skew: none (the bundle did not profile skew; decode attention at the batch's "
                        "mean context)")
    cpu_seqs = sorted(set([1] + seqs))
    comps = {
        "overhead": make_component("overhead", (), 0.0),
        "step_gap": make_component("step_gap", (), 0.0),
        "linear": make_component("linear", ([0] + tokens,), [0.0] + lin),
        "per_seq": make_component("per_seq", (seqs,), pseq),
        "prefill_attn": make_component("prefill_attn", att["prefill_attn"][:2], att["prefill_attn"][2]),
        "decode_attn": make_component("decode_attn", att["decode_attn"][:2], att["decode_attn"][2]),
        "decode_attn_mixed": make_component("decode_attn_mixed", att["decode_attn_mixed"][:2],
                                            att["decode_attn_mixed"][2]),
        "engine_cpu": make_component("engine_cpu", (cpu_seqs,), [cpu.seconds(s) for s in cpu_seqs]),
    }
    eng = bundle.meta.get("engine_effective") or {}
    date = bundle.meta.get("profiled_at") or _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    metadata = {
        "format_version": FORMAT_VERSION,
        "source": "llmservingsim",
        "device": bundle.gpu,
        "model": spec.to_dict(),
        "dtype": spec.dtype,
        "block_size": int(eng.get("block_size", 16)),
        "tensor_parallel": bundle.tp,
        "date": str(date),
        "engine": {"name": "vllm", "version": bundle.engine_version,
                   "measured_with": {k: eng.get(k) for k in ("enforce_eager", "enable_prefix_caching",
                                                               "max_num_batched_tokens", "max_num_seqs",
                                                               "gpu_memory_utilization") if k in eng}},
        "provenance": {
            "source": "LLMServingSim profile bundle (casys-kaist/LLMServingSim, MIT)",
            "bundle": str(bundle.path),
            "profiler_version": bundle.meta.get("profiler_version"),
            "hf_model": bundle.meta.get("model"),
            "cuda_version": bundle.meta.get("cuda_version"),
            "measurement_iterations": bundle.meta.get("measurement_iterations"),
            "files": [f"tp{bundle.tp}/dense.csv", f"tp{bundle.tp}/per_sequence.csv", f"tp{bundle.tp}/attention.csv"],
        },
        "decode_skew_alpha": alpha,
        "fit": {
            "method": "composed from per-layer kernel times x num_layers (calib/sources/llmservingsim.py)",
            "num_layers": L,
            "engine_cpu": cpu.describe(),
            "dropped_grid_points": dict(bundle.dropped),
            "modelled": modelled,
        },
    }
    return LatencyTable(comps, metadata)


def calibrate_from_bundle(path: str | Path, out: str | Path, tp: int = 1, model: str | None = None,
                          allreduce_gbps: float | None = None):
    """Read a bundle and write its table folder; returns the table."""
    from sim.latency.table_format import write_table

    bundle = read_bundle(path, tp)
    table = bundle_table(bundle, model, None if allreduce_gbps is None else allreduce_gbps * 1e9)
    write_table(out, table)
    return table
