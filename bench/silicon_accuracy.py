"""cbsim's kernel-db clock against AIConfigurator's public serving measurements (silicon_sample.csv).

What it answers: on the GPUs people buy (H100, H200, B200), how far are cbsim's TTFT and TPOT from
real vLLM / SGLang / TRT-LLM servers, when the latency table is composed from published kernel
measurements only (``calib/sources/kernel_db.py``)? ``aiconfigurator-core`` 0.12.0 ships 5,221 real
serving measurements (Apache-2.0): each row is one engine version, model, GPU, precision and
TP/EP/DP layout, served closed-loop (a benchmark client keeps ``concurrency`` requests in flight,
sending the next as soon as one finishes) with fixed input and output lengths, and the measured
mean TTFT and TPOT. The corpus is a judge: nothing in cbsim is fitted to it.

For every row cbsim can price (:func:`classify` says why the others are skipped), the bench builds
(and caches under ``bench/.cache/silicon/``, gitignored) one kernel-db table per (GPU, model, TP,
precision, engine, kernel-database version) -- and, for the MLA and MoE models of issue #30
(DeepSeek-V3/R1, Kimi-K2.5, gpt-oss-120b) and every row with expert parallelism or attention data
parallelism, per parallel layout, composed by ``calib.sources.kernel_db_moe`` as ``cbsim calibrate
--from-kernel-db --data-parallel D --expert-parallel`` does (:func:`_layout_skip` says which layouts
are one replica) -- simulates the row closed-loop
(``workload.arrival: {process: closed, concurrency: N}``) at its ISL/OSL with the engine's default
limits, ``--rounds`` requests per client, the clients' phases as ``--phase`` says (default: each
client's first send a seeded uniform draw over one cycle, the steady state of a long benchmark whose
clients jitter; :data:`PHASE`), and reports the signed error of mean TTFT and mean TPOT per row, and
per (GPU, engine, model) group, and per group and parallel layout (``tp8``, ``tp8 ep8``, ``tp1 dp8
ep8``: issue #29's bounds are per TP degree, issue #30's per layout; also in ``--json`` as
``groups_by_layout``), the median and p90 of |error| and the median signed error.

    .venv/bin/python bench/silicon_accuracy.py [--only h200] [--only Llama] [--json out.json] [--workers 2]

The rows InferenceMAX measured (:func:`is_inferencemax`: 954 of the priced rows) are replayed as its
client and launch scripts ran them (:func:`inferencemax_scenario`): which client measured a row is a
fact about the row, so that is each such row's result by default (``--client inferencemax``), with
the fixed-length ``--phase`` result of the same row run beside it for comparison (``extra.phases``);
``--client fixed`` runs every row as a fixed-length closed loop under ``--phase``, as before. Their
servers' MoE kernel is a fact about the rows too (:func:`moe_kernel_of`): InferenceMAX's vLLM gpt-oss
rows on H100/H200 ran the Marlin MXFP4 kernel (``VLLM_MXFP4_USE_MARLIN=1``), those on the B200
FlashInfer's MXFP4 kernel with MXFP8 activations (``VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1``), and
their tables price them (``--moe-kernel database``: the database's rows, the comparison).

``--only`` keeps rows whose id, GPU, engine or model contains every given text (case-insensitive).
The whole priceable set runs in a process pool over rows (``--workers``, default: every core), the
longest first by the CPU time each row took last time (:func:`longest_first`), so the workers end
together; with ``--json`` every finished row is appended to ``OUT.json.partial`` as it lands and
``--resume`` takes the rows of an earlier run of the same code and settings (:class:`Partial`), so
a crash or a time limit loses no finished row.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import shutil
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CACHE = ROOT / "bench" / ".cache" / "silicon"

# engine in the corpus -> cbsim policy that schedules as it does; a row whose policy is not registered
# (policies/registry.py) is skipped with that reason, so a new policy (trtllm) is picked up by name
ENGINE_POLICIES = {"vllm": "vllm-v1", "sglang": "sglang", "trtllm": "trtllm"}

# corpus model names -> the ORG/NAME whose config.json describes the same architecture (shapes only:
# the table prices kernels by shape). Hugging Face renamed meta-llama's 3.1 repositories from
# "Meta-Llama-3.1-*" to "Llama-3.1-*"; an Instruct fine-tune keeps the base model's shapes (the
# precision comes from the row). NVIDIA's FP8 checkpoint nvidia/Llama-3.1-8B-Instruct-FP8 is not
# aliased: its config (sim/hardware/configs/, the base shapes with ModelOpt's hf_quant_config.json)
# carries the ModelOpt quantization, whose static input scales the table prices (fp8_static).
MODEL_ALIASES = {
    "meta-llama/Llama-3.1-8B": "meta-llama/Meta-Llama-3.1-8B",
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
    "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.1-70B-Instruct": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.1-405B": "meta-llama/Meta-Llama-3.1-405B",
    "deepseek-ai/DeepSeek-R1": "deepseek-ai/DeepSeek-V3",  # R1 is V3's architecture retrained: one table
}
# The corpus names the experts' format in ``precision`` (fp4, int4) for checkpoints that ship their
# experts 4-bit: gpt-oss's MXFP4 experts (the corpus says fp4 / nvfp4 for every gpt-oss row, of a
# checkpoint that ships only MXFP4) and Kimi-K2.5's INT4 group-32 experts. Such a row is priced as the
# checkpoint ships (cbsim's ``expert_quantization``, the rest of the weights in the checkpoint's own
# dtype); another 4-bit model (DeepSeek-R1-NVFP4) stays refused.
SHIPPED_EXPERTS = {"mxfp4": "fp4", "int4": "int4"}
PRECISIONS = ("bf16", "fp8")
ROUNDS = 4  # requests per client: the opening wave plus three rounds of the loop it settles into
# The clients' first requests reach the engine one after another, not at one instant: a benchmark
# client opens its N streams from one event loop, and the engine's API server takes each request
# through its own asyncio loop (parse, tokenize, hand to the engine core) one at a time. The engine
# starts a step as soon as one request is there, so the first request is prefilled alone and the
# rest wait for the next step: the opening wave splits. 1 ms per request is the order of tokenizing
# a 1k-token prompt; any gap much shorter than a prefill step splits the wave the same way
# (docs/accuracy-corpus.md shows 0.1 and 5 ms).
SEND_GAP_MS = 1.0
# How the clients' phases are set up, and which requests the means count (issue 26). The corpus' TTFTs
# are below what any wave of N prompts can take at the GPU's peak (70B fp8 TP 2 on H200, 4 x 1,024
# tokens: 121 ms measured, 145 ms at 100 % of FP8 peak), so the real clients were NOT in lockstep
# waves, and above what evenly spaced phases give (57 of 60 rows, H200 70B), so their prefills did
# collide. cbsim's loop is deterministic and keeps fixed-length clients in the phase they start in, so:
# * ``random`` (default): the steady state of a long benchmark whose clients jitter. Each real
#   request's end-to-end time varies by a few ms (response handling, tokenization, the API server's
#   event loop), so each client's phase does a random walk around the cycle, and the stationary
#   distribution of independent random walks on a circle is independent uniform phases: where they
#   sit once the clients have drifted apart, whatever they started as. A pilot ``wave`` run gives a
#   request's mean E2E after the opening wave (the simulation's own, never the row's numbers); each
#   client's first send is then a seeded uniform draw over that one cycle (``workload.arrival:
#   {ramp_s: E2E, start: random}``), and the means are over the requests sent after the ramp. That
#   draw is a steady state of cbsim's loop too: H200 70B fp8 TP 2, 64 clients, 13 rounds: mean TTFT
#   104 ms in the first round, then 127 ms in every later one; with a 0-5 ms uniform think time
#   (a per-request send jitter) 124-125 ms, so the bench sends with no jitter. The measured window is
#   a steady state by the tools' own conventions: NVIDIA's Dynamo benchmark scripts
#   (ai-dynamo/dynamo benchmarks/llm/perf.sh) run aiperf/genai-perf at ``--concurrency N
#   --request-count 10N --warmup-request-count 2N``; whether the corpus' collector did the same is
#   not in the CSV (its ``silicon_data_source`` names a db dump and a workflow run only).
# * ``spread``: the same with first sends evenly spaced (``start: even``): the fewest collisions
#   any phases can have, the low end;
# * ``wave``: first sends SEND_GAP_MS apart, all requests counted (aiperf without
#   ``--warmup-request-count``; ``vllm bench serve --max-concurrency``, which averages every request
#   after its one test prompt) -- but the simulated clients stay in waves: the high end;
# * ``warm``: the ``wave`` run without the opening wave -- still waves (the loop keeps them).
# * ``opening``: what the tools measure when they count every request (no warm-up) and the clients'
#   phases diffuse after the opening wave: the mean over ``OPENING_ROUNDS`` requests per client of
#   the opening wave's first round (the pilot ``wave`` run's first N requests) and ``OPENING_ROUNDS
#   - 1`` rounds at the ``random`` steady state (:func:`opening_means`). Why (docs/accuracy-corpus.md,
#   limits): the corpus' mean TTFT grows with the clients as an opening wave shared over ~10 rounds
#   does, and lies far below any steady state of clusters that persist (H200 70B TP 2, 64 clients:
#   929 ms in cbsim's cluster-locked loop against 417 ms measured over the whole run).
PHASES = ("random", "spread", "wave", "warm", "opening")
PHASE = "random"
# Which all-reduce kernel a row's table prices (calib/sources/kernel_db_comm.py). AIConfigurator prices
# its custom rows; TensorRT-LLM falls back to NCCL when its topology check fails
# (cpp/tensorrt_llm/thop/allreduceOp.cpp, ifFallbackToNCCL). The corpus' TensorRT-LLM 1.0.0rc3
# collection (H100: Qwen3-32B and Llama-3.1-8B, TP 1-8) measures decode steps whose excess over the
# custom-kernel tables grows with the TP degree as NCCL's rows do, on both models: chosen on either
# one, NCCL also cuts the other's TP 2-8 TPOT error (docs/trtllm.md, "--allreduce"). The newer
# TensorRT-LLM rows were not judged this way and keep the custom kernel.
ALLREDUCE = "auto"  # auto: NCCL for TensorRT-LLM 1.0 rows, the custom kernel otherwise
NCCL_VERSIONS = {"trtllm": ("1.0",)}
# Which kernel a row's table prices the routed experts with (moe_kernel_of): auto, the kernel the row's
# launch script ran (Marlin for InferenceMAX's vLLM gpt-oss rows on H100/H200, FlashInfer MXFP4 x MXFP8 on
# the B200), else the database's rows
MOE_KERNEL = "auto"


def allreduce_of(row: Row, choice: str = ALLREDUCE) -> str:
    """The all-reduce kernel a row's table prices under ``--allreduce choice``."""
    if choice != "auto":
        return choice
    prefixes = NCCL_VERSIONS.get(row.engine, ())
    return "nccl" if row.tp > 1 and any(row.version.startswith(v + ".") for v in prefixes) else "custom"
# Requests per client the ``opening`` variant assumes the benchmark sent (the one global parameter; its
# leave-one-model-out check is bench/opening_lomo.py). 10 is the tools' own count where it is written
# down: AIConfigurator's own eval runs genai-perf at --request-count 10N --warmup-request-count 2N
# (ai-dynamo/aiconfigurator src/aiconfigurator/eval/benchmarks/genai_perf_runner.py) and SGLang's
# bench_serving at --num-prompts 10N with no warm-up (bench_serving_runner.py); ai-dynamo/dynamo
# benchmarks/llm/perf.sh and InferenceMAX use 10N too. A warm-up does not remove the opening wave:
# aiperf waits for every warm-up response before profiling starts (docs/tutorials/warmup.md, "Grace
# Period"), so the counted 10N requests open with all N clients together. Whether the corpus' rows
# came from that eval is not in the CSV. A fixed *duration* instead of a fixed count, and a one-off
# cost, are tested against the rows by bench/phase_lomo.py (docs/accuracy-corpus.md: refuted).
OPENING_ROUNDS = 10


def opening_means(first: tuple[float, float], steady: tuple[float, float],
                  rounds: int) -> tuple[float, float]:
    """Mean TTFT and TPOT over ``rounds`` requests per client: the opening wave's round (``first``)
    and ``rounds - 1`` rounds at ``steady``. Each client sends one request per round, so every round
    weighs the same."""
    return tuple((f + (rounds - 1) * s) / rounds for f, s in zip(first, steady))


def corpus_path() -> Path:
    """``aiconfigurator_core/systems/silicon_sample.csv`` of the installed package."""
    import importlib.util

    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("aiconfigurator-core is not installed: pip install 'cbsim[gpu-data]'")
    return Path(list(spec.submodule_search_locations)[0]) / "systems" / "silicon_sample.csv"


@dataclass
class Row:
    id: str
    engine: str
    version: str  # the row's engine version ("" when the corpus does not say)
    model: str  # as the corpus names it
    system: str  # AIConfigurator's system name
    precision: str
    tp: int
    isl: int
    osl: int
    concurrency: int
    ttft_ms: float
    tpot_ms: float
    gemm_quant: str = ""  # the corpus' gemm_quant_mode (fp8, fp8_block, ...)
    skip: str = ""  # why cbsim cannot price it ("" = priced)
    gpu: str = ""  # cbsim GPU id
    config: str = ""  # the config.json priced
    policy: str = ""

    fp8_scaling: str | None = None  # 'block' or 'tensor' for fp8 rows (classify)
    allreduce: str = "custom"  # the all-reduce kernel its table prices (allreduce_of)
    # the layout beyond TP as the row runs it: attention data-parallel ranks, experts expert-parallel
    # over tp x dp GPUs (the corpus' moe_ep_size) or tensor-parallel over them (:func:`_layout_skip`)
    data_parallel: int = 1
    expert_parallel: bool = False
    moe_path: bool = False  # composed by calib.sources.kernel_db_moe (MLA, 4-bit experts, DP or EP)
    mla: bool = False  # multi-head latent attention (FlashMLA's 64-token blocks)
    mtp: bool = False  # --mtp: this row runs speculative.method mtp (a sensitivity)
    slots_short: int = 0  # --slots-short: the engine runs at most clients - this many requests (a sensitivity)
    source: str = ""  # the corpus' silicon_data_source (which collection, and its tool)
    aic_config: bool = False  # --aic-config: AIConfigurator's generated TensorRT-LLM config (below)
    no_overlap: bool = False  # --no-overlap: TensorRT-LLM rows with disable_overlap_scheduler (a sensitivity)
    client: str = "inferencemax"  # --client: how the benchmark client is replayed (CLIENTS; default CLIENT)
    moe_kernel: str = "database"  # the routed experts' kernel its table prices (moe_kernel_of)
    vllm_async: str = "version"  # --vllm-async: how a vLLM row's async scheduling is chosen (vllm_async_scheduling)
    vllm_async_admission: bool = True  # --vllm-async-admission: async vLLM rows admit a step late, as vLLM does

    @property
    def table_key(self) -> tuple:
        """The dense path's (GPU, config, TP, precision, engine, fp8 scaling, all-reduce), and for the
        kernel_db_moe path ("moe", data_parallel, expert_parallel) after it (:func:`moe_part`), then
        the experts' kernel where it is not the database's (:func:`moe_kernel_of`: "marlin",
        "flashinfer-mxfp8"). An FP8 KV cache (:attr:`table_kv`) adds "kv-fp8" after the dense part."""
        key = (self.gpu, self.config_name, self.tp, self.precision, self.engine, self.fp8_scaling, self.allreduce)
        if self.table_kv == "fp8":
            key += ("kv-fp8",)
        if not self.moe_path:
            return key
        kernel = (self.moe_kernel,) if self.moe_kernel != "database" else ()
        return key + ("moe", self.data_parallel, self.expert_parallel) + kernel

    @property
    def table_kv(self) -> str | None:
        """The KV cache dtype the row's table prices: ``fp8`` where the launch script the bench
        replays set it (:func:`inferencemax_server`, with InferenceMAX's client), so that the table's
        attention rows are the kernels the server ran (:func:`calib.sources.kernel_db.with_kv_cache_dtype`);
        None otherwise."""
        if self.client != "inferencemax" or not is_inferencemax(self):
            return None
        return inferencemax_server(self)[0].get("kv_cache_dtype")

    @property
    def mtp_key(self) -> tuple:
        """The MTP layer's table (``--mtp``): the row's layout, ``kernel_db_mtp``."""
        return self.table_key[:7] + ("moe", self.data_parallel, self.expert_parallel, "mtp")

    @property
    def config_name(self) -> str:
        return MODEL_ALIASES.get(self.model, self.model)

    @property
    def group(self) -> str:
        return f"{self.system} {self.engine} {self.model}"

    @property
    def layout(self) -> str:
        """The row's parallel layout as issues #29 and #30 break the errors down: ``tp4``, and the
        attention data-parallel ranks and expert parallelism when the row has them (``tp1 dp8 ep8``:
        8 ranks of whole attention, the experts split over the 8 GPUs)."""
        parts = [f"tp{self.tp}"]
        if self.data_parallel > 1:
            parts.append(f"dp{self.data_parallel}")
        if self.expert_parallel:
            parts.append(f"ep{self.tp * self.data_parallel}")
        return " ".join(parts)


def read_rows(path: Path | None = None) -> list[Row]:
    import pandas as pd

    d = pd.read_csv(path or corpus_path())
    rows = []
    for r in d.itertuples(index=False):
        rows.append(_row(r))
    return rows


def _num(x, default=None):
    try:
        v = float(x)
    except (TypeError, ValueError):
        return default
    return default if math.isnan(v) else v


def _text(x) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else str(x)


def _row(r) -> Row:
    precision = _text(r.precision) or _text(r.gemm_quant_mode)
    row = Row(id=r.id, engine=r.backend, version=_text(r.backend_version), model=r.model_path, system=r.system,
              precision=precision, tp=int(_num(r.tp_size, 0) or 0), isl=int(r.isl), osl=int(r.osl),
              concurrency=_concurrency(r), ttft_ms=float(r.silicon_ttft_ms),
              tpot_ms=float(r.silicon_tpot_ms), gemm_quant=_text(r.gemm_quant_mode),
              source=_text(getattr(r, "silicon_data_source", "")))
    row.skip = _layout_skip(r, row)
    return row


def _concurrency(r) -> int:
    """The benchmark client's concurrency: ``silicon_concurrency`` where the row's data source names
    it, else ``batch_size`` x ``attention_dp_size``. Under attention DP the corpus' ``batch_size`` is
    per rank (H200 TRT-LLM DeepSeek-R1, tp 1 dp 8: batch_size 32 with silicon_concurrency=256; 168 of
    the 169 aggregated attention-DP rows have silicon_concurrency = batch_size x dp); on every
    priced row without attention DP the two are equal."""
    m = re.search(r"silicon_concurrency=(\d+)", _text(getattr(r, "silicon_data_source", "")))
    if m:
        return int(m.group(1))
    return int(_num(r.batch_size, 0) or 0) * int(_num(getattr(r, "attention_dp_size", 1), 1) or 1)


def _layout_skip(r, row: Row) -> str:
    """Why the row's layout is not one cbsim replica, or "" (and ``row.data_parallel`` /
    ``row.expert_parallel`` set). One replica is ``tp`` attention GPUs per data-parallel rank,
    ``attention_dp`` ranks stepping in lockstep, and the MoE over the same tp x dp GPUs, either
    expert-parallel (``moe_ep`` = tp x dp, ``moe_tp`` 1) or tensor-parallel (``moe_tp`` = tp x dp);
    the corpus' blank ``moe_tp_size`` means the attention's own tp x dp."""
    if r.mode != "agg":
        return f"mode {r.mode}: disaggregated rows are not replayed yet"
    if row.tp < 1 or row.concurrency < 1:
        return "no tp_size or concurrency"
    if (_num(r.pp_size, 1) or 1) != 1:
        return f"pipeline parallel {r.pp_size:g}: cbsim has no pipeline parallelism"
    dp = int(_num(r.attention_dp_size, 1) or 1)
    ep = int(_num(r.moe_ep_size, 1) or 1)
    gpus = row.tp * dp
    # without expert parallelism the experts are tensor-parallel over the attention's GPUs; a dense
    # model's rows carry moe_tp 1 (or 0, or blank) at any tp, so only a moe_tp above 1 is checked
    given = int(_num(getattr(r, "moe_tp_size", None), 0) or 0)
    mtp = (given or gpus // ep) if ep > 1 else (given if given > 1 else gpus)
    if mtp * ep != gpus:
        return (f"moe_tp {mtp} x moe_ep {ep} != tp {row.tp} x attention_dp {dp}: the experts are not on "
                f"the attention's GPUs (not one replica)")
    if ep > 1 and mtp > 1:
        return f"experts both tensor- ({mtp}) and expert-parallel ({ep}): not modelled"
    row.data_parallel, row.expert_parallel = dp, ep > 1
    return ""


def classify(rows: list[Row], allreduce: str = ALLREDUCE, moe_kernel: str = MOE_KERNEL) -> None:
    """Fill ``skip`` (a reason in words) or ``gpu``, ``config``, ``policy``, ``allreduce`` and ``moe_kernel``
    on each row."""
    from calib.sources.kernel_db import GPU_SYSTEMS, fp8_quant_mode
    from policies.registry import POLICIES
    from sim.errors import CbsimError
    from sim.hardware.gpus import GPUS
    from sim.hardware.model_sources import find_config
    from sim.hardware.models import get_model

    gpu_of = {v: k for k, v in GPU_SYSTEMS.items()}
    models: dict[str, tuple[str, str]] = {}  # config name -> (path, error)
    for row in rows:
        if row.skip:
            continue
        policy = ENGINE_POLICIES.get(row.engine)
        if policy is None or policy not in POLICIES:
            row.skip = f"engine {row.engine}: no cbsim policy ({policy or 'none'} is not registered)"
            continue
        gpu = gpu_of.get(row.system)
        if gpu is None or gpu not in GPUS:
            row.skip = f"GPU {row.system}: not in cbsim's GPU list or the kernel database"
            continue
        name = row.config_name
        if name not in models:
            try:
                found = find_config(name)
                get_model(name)
                models[name] = (str(found.path), "")
            except CbsimError as exc:
                models[name] = ("", str(exc).split(";")[0][:160])
        path, err = models[name]
        if err:
            row.skip = f"model {row.model}: {err}"
            continue
        spec = get_model(name)
        shipped = SHIPPED_EXPERTS.get(spec.expert_quantization or "")
        if not row.precision or (shipped and row.precision == shipped):
            # blank: an unquantized checkpoint in its own dtype; the experts' 4-bit format the
            # checkpoint ships (SHIPPED_EXPERTS): the checkpoint as shipped
            row.precision = "fp8" if getattr(spec, "quantization", None) == "fp8" else "bf16"
        elif shipped:
            row.skip = (f"precision {row.precision}: {row.model} ships {spec.expert_quantization} experts "
                        f"(priced as shipped, precision {shipped})")
            continue
        if not row.expert_parallel and row.data_parallel > 1 and not spec.num_experts:
            row.skip = f"attention data parallel {row.data_parallel} on a dense model: independent engines"
            continue
        if row.expert_parallel and not spec.num_experts:
            row.skip = "expert parallel on a dense model"
            continue
        if row.precision not in PRECISIONS:
            row.skip = f"precision {row.precision}: cbsim prices bf16 and fp8"
            continue
        if row.precision == "fp8":
            # the checkpoint's own scales when its config names them (an engine cannot run per-tensor
            # kernels on block-scaled weights), else what the corpus says the collection ran
            config = json.loads(Path(path).read_text(encoding="utf-8"))
            block = fp8_quant_mode(config) == "fp8_block" or row.gemm_quant == "fp8_block"
            row.fp8_scaling = "block" if block else "tensor"
        row.gpu, row.config, row.policy = gpu, path, policy
        row.allreduce = allreduce_of(row, allreduce)
        row.moe_path, row.mla = moe_path(spec, row), bool(spec.is_mla)
        row.moe_kernel = moe_kernel_of(row, moe_kernel) if row.moe_path else "database"
        if row.moe_path and row.allreduce != "custom":
            row.skip = (f"all-reduce {row.allreduce}: the MLA / MoE composition (calib/sources/kernel_db_moe.py) "
                        f"prices the experts' dispatch and combine with the database's custom kernels only")


def moe_path(spec, row: Row) -> bool:
    """Whether the row's table is composed by ``calib.sources.kernel_db_moe`` (as ``cbsim calibrate
    --from-kernel-db`` chooses, ``kernel_db_moe.takes``): an MLA model, 4-bit experts, or a layout
    beyond tensor parallelism. Every other row keeps the dense path's table, key and cache."""
    return bool(spec.is_mla or spec.expert_quantization or row.data_parallel > 1 or row.expert_parallel)


def key_kv(key: tuple) -> str | None:
    """The KV cache dtype a table key prices (``Row.table_key``): "fp8", or None for the model's own."""
    return "fp8" if key[7:8] == ("kv-fp8",) else None


def _layout_part(key: tuple) -> tuple:
    """What follows a key's dense part and its KV dtype: ("moe", dp, ep[, kernel | "mtp"]), or ()."""
    return key[8:] if key_kv(key) else key[7:]


def moe_part(key: tuple) -> tuple[int, bool, bool] | None:
    """(data_parallel, expert_parallel, the MTP layer's table) of a kernel_db_moe key, None for a dense one."""
    part = _layout_part(key)
    if part[:1] == ("moe",):
        return part[1], part[2], part[3:] == ("mtp",)
    return None


def key_moe_kernel(key: tuple) -> str:
    """The routed experts' kernel a table key prices (``Row.table_key``): "database", "marlin" or
    "flashinfer-mxfp8"."""
    from calib.sources.kernel_db_marlin import MOE_KERNELS

    part = _layout_part(key)
    moe = len(part) == 4 and part[0] == "moe"
    return part[3] if moe and part[3] in MOE_KERNELS else "database"


# ------------------------------------------------------------------------------------------------
# tables: one per (GPU, model, TP, precision, engine), cached by the code that composes them
# ------------------------------------------------------------------------------------------------
def code_hash(moe: bool = False, mtp: bool = False) -> str:
    """Changes whenever the composition or the simulator's pricing could: the cache's key. The
    tables of ``kernel_db_moe`` (``moe``) hash that module too, so the dense tables' key stays put."""
    h = hashlib.sha256()
    for rel in ("calib/sources/kernel_db.py", "calib/sources/kernel_db_comm.py", "sim/latency/table.py",
                "sim/latency/engine_cpu.py"):
        h.update((ROOT / rel).read_bytes())
    if moe:
        h.update((ROOT / "calib/sources/kernel_db_moe.py").read_bytes())
        h.update((ROOT / "calib/sources/kernel_db_marlin.py").read_bytes())
        h.update((ROOT / "calib/sources/kernel_db_fi_mxfp8.py").read_bytes())
        h.update(repr(MLA_BLOCK_SIZE).encode())
    if mtp:
        h.update((ROOT / "calib/sources/kernel_db_mtp.py").read_bytes())
    return h.hexdigest()[:12]


# FlashMLA's paged KV cache has 64-token blocks (vLLM's MLA backends require 64; SGLang and TRT-LLM
# rows are run the same, as docs/models-2026.md's first replay did): the MLA tables and scenarios use it
MLA_BLOCK_SIZE = 64


def table_dir(key: tuple, digest: str) -> Path:
    gpu, config, tp, precision, engine, scaling, allreduce = key[:7]
    slug = (f"{engine}-{gpu}-{config.replace('/', '--')}-tp{tp}-{precision}" + (f"-{scaling}" if scaling else "")
            + ("-nccl" if allreduce == "nccl" else ""))
    moe = moe_part(key)
    if moe is not None:  # kernel_db_moe: the layout beyond TP
        dp, ep, mtp = moe
        slug += f"-dp{dp}" + ("-ep" if ep else "") + ("-mtp" if mtp else "")
        kernel = key_moe_kernel(key)
        slug += f"-{kernel}" if kernel != "database" else ""
    if key_kv(key):
        slug += "-kvfp8"
    return CACHE / digest / slug


def build_one(args) -> tuple[tuple, str, str]:
    """Build (or find cached) one table; (key, folder, error)."""
    key, digest = args
    out = table_dir(key, digest)
    if (out / "metadata.json").is_file():
        return key, str(out), ""
    from calib.sources import kernel_db_moe
    from calib.sources.kernel_db import build_table
    from sim.errors import CbsimError
    from sim.latency.table_format import write_table

    gpu, config, tp, precision, engine, scaling, allreduce = key[:7]
    moe = moe_part(key)
    try:
        if moe is not None:
            dp, ep, mtp = moe
            block = MLA_BLOCK_SIZE if _is_mla(config) else 16
            build = kernel_db_moe.build_table
            if mtp:  # --mtp: the MTP layer's own table, in the row's layout
                from calib.sources import kernel_db_mtp

                build = kernel_db_mtp.build_table
            extra = {"moe_kernel": key_moe_kernel(key), "kv_cache_dtype": key_kv(key)} if not mtp else {}
            comp = build(config, gpu, kernel_db_moe.Layout(tp, dp, ep), dtype=precision, engine=engine,
                         block_size=block, **extra)
        else:
            comp = build_table(config, gpu, tp=tp, dtype=precision, engine=engine, fp8_scaling=scaling,
                               allreduce=allreduce, kv_cache_dtype=key_kv(key))
    except Exception as exc:  # noqa: BLE001 - AIConfigurator's own errors: the row is skipped, with the reason
        kind = "" if isinstance(exc, CbsimError) else f"{type(exc).__name__}: "
        return key, "", (kind + str(exc).split(" at /")[0])[:240]
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    write_table(tmp, comp.table)
    try:
        tmp.rename(out)
    except OSError:  # another bench process built the same table first: the same key, the same table
        if not out.is_dir():
            raise
        shutil.rmtree(tmp)
    return key, str(out), ""


# policies whose speculative decoding runs an MTP layer (policies/sglang.py NEXTN, policies/trtllm.py
# MTPDecodingConfig, vLLM's deepseek_mtp)
MTP_POLICIES = ("sglang", "trtllm", "vllm-v1")


def mtp_section(text: str | None) -> dict | None:
    """``--mtp K:RATE`` as a policy's speculative section (the draft table added per row)."""
    if text is None:
        return None
    try:
        k, rate = text.split(":")
        k, rate = int(k), float(rate)
    except ValueError:
        raise SystemExit(f"--mtp {text!r}: give K:RATE, drafts per step and their acceptance, "
                         f"e.g. --mtp 1:0.85") from None
    if k < 1 or not 0.0 <= rate <= 1.0:
        raise SystemExit(f"--mtp {text!r}: K must be at least 1 and RATE within [0, 1]")
    return {"method": "mtp", "num_speculative_tokens": k, "acceptance": {"rate": rate}}


def _has_mtp(config: str) -> bool:
    from sim.hardware.models import get_model

    return bool(get_model({"hf_config": config}).mtp_layers)


def _digest(key: tuple) -> str:
    """The cache digest of a table key: the dense path's, kernel_db_moe's, or the MTP layer's."""
    moe = moe_part(key)
    return code_hash(moe=moe is not None, mtp=bool(moe and moe[2]))


def _is_mla(config: str) -> bool:
    from sim.hardware.models import get_model

    return bool(get_model(config).is_mla)


# ------------------------------------------------------------------------------------------------
# one row, closed-loop
# ------------------------------------------------------------------------------------------------
# TensorRT-LLM's attention-DP balance as the corpus' attention-DP rows ran it. Their provenance
# (`image=nvcr.io#nvidia/tensorrt-llm/release:1.1.0rc2.post2`, ISL/OSL 1k/1k, 1k/8k, 8k/1k, 4-256
# clients, `tp8 ep8` with `dp-attn`) is InferenceMAX's (SemiAnalysisAI/InferenceX) sweep, whose
# TensorRT-LLM launch scripts write, whenever DP_ATTENTION is true, `attention_dp_config:
# {batching_wait_iters: 0, enable_balance: true, timeout_iters: 60}` into the extra LLM-API options
# (benchmarks/dsr1_fp8_h200_trt.sh, dsr1_fp8_h200_trt_slurm.sh, and the B200 and gpt-oss scripts
# alike). TensorRT-LLM's own default is balance off (AttentionDpConfig, policies/trtllm.py AdpBalance);
# AIConfigurator's generator templates do not set attention_dp_config at all.
TRTLLM_ADP_BALANCE = {"attention_dp_enable_balance": True, "attention_dp_timeout_iters": 60,
                      "attention_dp_batching_wait_iters": 0}


# AIConfigurator's own TensorRT-LLM config for an aggregated worker, which its gap analysis
# (`aic-auto-gap-analysis`, the H100 Qwen3-32B and Llama-3.1-8B TensorRT-LLM rows) serves each point
# with: `aiconfigurator eval` renders `generator/config/backend_templates/trtllm/
# extra_engine_args.<version>.yaml.j2` through `generator/rule_plugin/trtllm.rule`
# (ai-dynamo/aiconfigurator; tools/automation/launch_eval.sh runs it). The rule sets, for `agg`:
# max_batch_size 512 below 512 (else twice it), max_num_tokens = max_batch_size + ISL + 1500
# rounded up to tokens_per_block (32), disable_overlap_scheduler false, CUDA graphs with padding;
# the 1.0.0rc3 template has enable_chunked_prefill false and kv_cache_config.enable_block_reuse
# false by default, and launch_eval.sh passes FREE_GPU_MEM_FRAC 0.7 as the agg worker's
# kv_cache_config.free_gpu_memory_fraction. docs/trtllm.md ("The corpus' server config") has the
# measurement; --aic-config applies it (a sensitivity: the CSV records the client's concurrency as
# batch_size, not the rendered file).
AIC_GAP_SOURCE = "aic-auto-gap-analysis"
AIC_TRTLLM_POLICY = {"enable_block_reuse": False, "enable_chunked_prefill": False,
                     "free_gpu_memory_fraction": 0.7}


def aic_trtllm_engine(row: Row, tokens_per_block: int = 32) -> dict:
    """``max_num_seqs`` / ``max_num_batched_tokens`` of AIConfigurator's agg rule for ``row``:
    max_batch_size = 512 if batch_size < 512 else 2 x batch_size (batch_size: the corpus' clients),
    max_num_tokens = max_batch_size + ISL + 1500 rounded up to ``tokens_per_block``."""
    mbs = 512 if row.concurrency < 512 else 2 * row.concurrency
    tokens = -(-(mbs + row.isl + 1500) // tokens_per_block) * tokens_per_block
    return {"max_num_seqs": mbs, "max_num_batched_tokens": tokens}
# ------------------------------------------------------------------------------------------------
# InferenceMAX's client and servers (--client inferencemax, the default)
# ------------------------------------------------------------------------------------------------
# The corpus' dated-CSV rows (silicon_data_source ``source_file=YYYY-MM-DD.csv``, ids
# ``YYYY_MM_DD_<model>_<gpu>_<engine>_<precision>_agg_<ISL>x<OSL>_c<N>_tp...``) at 1k/1k, 1k/8k and 8k/1k
# are InferenceMAX's sweeps (SemiAnalysisAI/InferenceX; docs/models-2026.md, "On the corpus"), whose
# client is not a fixed-length closed loop. Every launch script (benchmarks/70b_fp8_h100_slurm.sh,
# gptoss_fp4_h200.sh, dsr1_fp8_h200.sh, dsr1_fp8_h200_trt.sh, ...) runs its bench_serving copy
# (kimbochen/bench_serving, later utils/bench_serving/ in the repository) as ``benchmark_serving.py
# --dataset-name random --random-input-len ISL --random-output-len OSL --random-range-ratio 0.8
# --num-prompts CONC*10 --max-concurrency CONC --request-rate inf --ignore-eos`` (the ratio from
# .github/workflows/full-sweep-tmpl.yml). Its ``sample_random_requests`` draws, after ``np.random.seed(0)``
# (``--seed`` default 0), every prompt length and then every output length as
# ``np.random.randint(int(L * ratio), L + 1, size=num_prompts)``: uniform integers over [0.8 L, L],
# mean 0.9 L; the requests go out in that order behind an ``asyncio.Semaphore(CONC)``; every one of
# the CONC*10 is counted (a single test prompt, and in the later copy 2*CONC warm-up requests of that
# prompt, run first and are all answered before the counted run opens with CONC sends at once); mean
# TTFT over the requests, and TPOT per request ``(latency - ttft) / (output_len - 1)`` averaged over them.
# ``inferencemax`` (the default) replays these rows so and every other row as ``fixed`` does;
# ``fixed`` runs every row, these included, as a fixed-length closed loop under ``--phase``.
CLIENTS = ("fixed", "inferencemax")
CLIENT = "inferencemax"
INFERENCEMAX_LENGTHS = ((1024, 1024), (1024, 8192), (8192, 1024))
INFERENCEMAX_SOURCE = re.compile(r"(?:^|;)\s*source_file=\d{4}-\d{2}-\d{2}\.csv\s*(?:;|$)")
INFERENCEMAX_RANGE_RATIO = 0.8
INFERENCEMAX_PROMPTS_PER_CLIENT = 10
INFERENCEMAX_SEED = 0


def is_inferencemax(row: Row) -> bool:
    """The rule: a dated-CSV row (``source_file=YYYY-MM-DD.csv``) at one of InferenceMAX's three lengths."""
    return bool(INFERENCEMAX_SOURCE.search(row.source)) and (row.isl, row.osl) in INFERENCEMAX_LENGTHS


# InferenceMAX's vLLM gpt-oss launch scripts for the H100 and H200 (benchmarks/gptoss_fp4_h100.sh,
# gptoss_fp4_h100_slurm.sh, gptoss_fp4_h200.sh) export VLLM_MXFP4_USE_MARLIN=1, so vLLM ran gpt-oss's
# experts on its Marlin MXFP4 kernel (fused_moe/oracle/mxfp4.py, select_mxfp4_moe_backend: "explicit
# Marlin MXFP4 configuration") instead of the OpenAI Triton kernel the database times them with. The
# flag came with its PR #327 ("Update vLLM image from v0.11.2 to v0.13.0", "Add VLLM_MXFP4_USE_MARLIN=1
# to H100 and H200 benchmark scripts", perf-changelog.yaml), so rows of an older vLLM (the corpus' six
# H100 v0.11.2 rows, measured 2025-12-08, and the fourteen rows without a version, measured 2025-11-02
# and 2025-12-05) ran before it and keep the database's rows. Which kernel a row's server ran is a fact
# about the row, like the scripts' other flags: such rows' tables price the Marlin kernel
# (calib/sources/kernel_db_marlin.py) by default (MOE_KERNEL); --moe-kernel database prices the
# database's rows.
MARLIN_SYSTEMS = ("h100_sxm", "h200_sxm")
MARLIN_SINCE = (0, 13)  # the vLLM image InferenceMAX's PR #327 moved to with the flag
# InferenceMAX's vLLM gpt-oss scripts for the B200 export VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1 in every
# version read (InferenceMAX/InferenceMAX benchmarks/gptoss_fp4_b200_slurm.sh and _docker.sh of the first
# runs, SemiAnalysisAI/InferenceX benchmarks/gptoss_fp4_b200.sh and _docker.sh now): vLLM then runs the
# experts on FlashInfer's TRT-LLM-gen MXFP4 MoE with MXFP8 activations (quantization/mxfp4.py,
# get_mxfp4_backend: SM100_FI_MXFP4_MXFP8_TRTLLM) where the database times its bf16-activation default;
# such rows' tables price it (calib/sources/kernel_db_fi_mxfp8.py), every vLLM version the corpus has.
FI_MXFP8_SYSTEMS = ("b200_sxm",)


def moe_kernel_of(row: Row, choice: str = MOE_KERNEL) -> str:
    """The routed experts' kernel a row's table prices under ``--moe-kernel choice``."""
    from sim.latency.engine_cpu import parse_version

    if choice != "auto":
        return choice
    oss = is_inferencemax(row) and row.engine == "vllm" and "gpt-oss" in row.model.lower()
    if oss and row.system in MARLIN_SYSTEMS and parse_version(row.version) >= MARLIN_SINCE:
        return "marlin"
    return "flashinfer-mxfp8" if oss and row.system in FI_MXFP8_SYSTEMS else "database"


# A vLLM server schedules asynchronously only from vLLM 0.14 unless launched with --async-scheduling
# (sim.latency.engine_cpu.async_scheduling_default: PR #27614, the v0.14.0 release notes). Which rows
# say how their server was launched: InferenceMAX's vLLM scripts (70b_fp8_h100_slurm.sh,
# 70b_fp8_h200_slurm.sh, gptoss_fp4_h100_slurm.sh and gptoss_fp4_b200.sh write ``async-scheduling: true``
# into the server's config.yaml; 70b_b200_slurm.sh passes --async-scheduling), so its rows run
# asynchronously whatever the image (:func:`inferencemax_server` sets it). AIConfigurator's gap-analysis
# rows (vLLM 0.12.0: Qwen3-32B H100, Qwen3-235B-A22B-FP8 and Llama-3.1-8B-Instruct-FP8 H200) record no
# launch line; vLLM 0.12.0 schedules synchronously unless given the flag, and AIConfigurator's own
# generator for that version (generator/config/backend_templates/vllm/cli_args.0.12.0.j2) passes none,
# so they run the version's default. Rows without a version keep cbsim's default (async).
VLLM_ASYNC = "version"
# and such a server admits a request arriving during step k in step k + 2 (vllm-v1's async_admission,
# which cbsim's own default leaves off for the fast-forward's sake: docs/accuracy-corpus.md)
VLLM_ASYNC_ADMISSION = "on"


def vllm_async_scheduling(row: Row) -> bool:
    """Whether a vLLM row's server scheduled asynchronously (the block above); ``--vllm-async always``
    (``row.vllm_async``) gives every row cbsim's default, asynchronous (the comparison)."""
    from sim.latency.engine_cpu import async_scheduling_default

    if row.vllm_async == "always" or is_inferencemax(row) or not row.version:
        return True
    return async_scheduling_default("vllm", row.version)


def inferencemax_lengths(isl: int, osl: int, n: int, ratio: float = INFERENCEMAX_RANGE_RATIO,
                         seed: int = INFERENCEMAX_SEED):
    """(prompt lengths, output lengths) of the ``n`` requests bench_serving's random dataset draws:
    numpy's legacy generator seeded ``seed``, the prompts' ``randint(int(isl * ratio), isl + 1, n)``
    first, then the outputs' (its zero-length prefix draw before them takes nothing from the stream)."""
    import numpy as np

    rs = np.random.RandomState(seed)
    prompts = rs.randint(int(isl * ratio), isl + 1, size=n)
    outputs = rs.randint(int(osl * ratio), osl + 1, size=n)
    return prompts, outputs


def inferencemax_trace(row: Row) -> Path:
    """The row's CONC*10 requests as a csv trace (sent in order by the closed loop), cached by lengths."""
    n = row.concurrency * INFERENCEMAX_PROMPTS_PER_CLIENT
    out = CACHE / "inferencemax" / (f"{row.isl}x{row.osl}-n{n}-r{INFERENCEMAX_RANGE_RATIO}"
                                    f"-s{INFERENCEMAX_SEED}.csv")
    if not out.is_file():
        prompts, outputs = inferencemax_lengths(row.isl, row.osl, n)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        tmp.write_text("arrival_s,prompt_tokens,output_tokens\n"
                       + "".join(f"0,{p},{o}\n" for p, o in zip(prompts, outputs)), encoding="utf-8")
        tmp.rename(out)
    return out


def inferencemax_server(row: Row) -> tuple[dict, dict, dict]:
    """(engine keys, policy knobs, hardware keys) of InferenceMAX's launch script for the row, the
    flags cbsim has knobs for; rows of scripts not read here keep the bench's defaults.

    * vLLM (70b_fp8_h100_slurm.sh, 70b_fp8_h200_slurm.sh, gptoss_fp4_h100_slurm.sh, gptoss_fp4_h200.sh):
      ``--max-num-seqs CONC``, ``max-num-batched-tokens: 8192``, ``no-enable-prefix-caching``,
      ``--gpu-memory-utilization 0.9``, ``async-scheduling: true`` (:func:`vllm_async_scheduling`), and for Llama-3.1-70B
      ``kv-cache-dtype: fp8``; the B200 gpt-oss scripts (gptoss_fp4_b200.sh, _slurm.sh, _docker.sh) also
      ``kv-cache-dtype: fp8`` and ``--max-num-seqs 512``.
    * SGLang DeepSeek-R1 (dsr1_fp8_h200.sh): ``--disable-radix-cache --max-running-requests 512`` at
      1k/1k, 256 otherwise, ``--chunked-prefill-size 32768 --max-prefill-tokens 32768
      --mem-fraction-static 0.82``; on the B200 (dsr1_fp8_b200.sh, dsr1_fp8_b200_slurm.sh) also
      ``--kv-cache-dtype fp8_e4m3`` and ``--scheduler-recv-interval`` 30 from 16 clients, 10 below
      (policies/sglang.py, ``scheduler_recv_interval``), but not its TP 8 ``--max-running-requests
      128``, which the rows contradict (docs/models-2026.md); at TP 4 (8192 x 1024) ``--max-running-requests
      32 --chunked-prefill-size 8192 --max-prefill-tokens 8192 --mem-fraction-static 0.95`` and 10.
    * TensorRT-LLM DeepSeek-R1 (dsr1_fp8_h200_trt.sh): ``kv_cache_config: {dtype: fp8,
      free_gpu_memory_fraction: 0.75, enable_block_reuse: false}``, ``--max_num_tokens``
      max(8192, (CONC + ISL + 127) // 64 * 64); the attention-DP balance the bench already sets. The
      B200 rows of TensorRT-LLM 1.2 (dsr1_fp8_b200_trt.sh): the fraction by lengths and clients, and
      delay batching (``batch_wait_timeout_iters: 40, batch_wait_max_tokens_ratio: 0.8``) on 1k/1k
      at 64-255 clients; its MoE backend choice (TRTLLM or DEEPGEMM) and piecewise CUDA graphs are
      not modelled (docs/models-2026.md).
    * TensorRT-LLM Llama-3.1-70B (70b_fp8_h200_trt_slurm.sh, 70b_fp8_b200_trt_slurm.sh): ``kv_cache_config:
      {dtype: fp8, enable_block_reuse: false}``, on 1k/1k below TP 8 ``batch_wait_max_tokens_ratio: 0.9,
      batch_wait_timeout_iters: 20``, and on the B200 ``--max_num_tokens 16384``.
    * TensorRT-LLM gpt-oss on the H200 (gptoss_fp4_h200_trt.sh): ``--max_batch_size CONC --max_num_tokens
      20000``, ``kv_cache_config: {enable_block_reuse: false, free_gpu_memory_fraction: 0.85}``."""
    engine: dict = {}
    knobs: dict = {}
    hardware: dict = {}
    model = row.model.lower()
    if row.engine == "vllm" and ("llama-3.1-70b" in model or "gpt-oss" in model):
        engine = {"max_num_seqs": row.concurrency, "max_num_batched_tokens": 8192, "enable_prefix_caching": False,
                  "async_scheduling": True}
        hardware = {"gpu_memory_utilization": 0.9}
        if "llama-3.1-70b" in model or row.system == "b200_sxm":
            engine["kv_cache_dtype"] = "fp8"  # the 70B scripts, and every B200 gpt-oss script's config.yaml
        if "gpt-oss" in model and row.system == "b200_sxm":
            engine["max_num_seqs"] = 512  # gptoss_fp4_b200*.sh: --max-num-seqs 512, whatever CONC
    elif row.engine == "sglang" and "deepseek-r1" in model:
        knobs = {"disable_radix_cache": True,
                 "max_running_requests": 512 if (row.isl, row.osl) == (1024, 1024) else 256,
                 "chunked_prefill_size": 32768, "max_prefill_tokens": 32768, "mem_fraction_static": 0.82}
        if row.system == "b200_sxm":
            # dsr1_fp8_b200.sh (every version read): new requests polled every 30 decode iterations
            # from 16 clients, every 10 below; an FP8 KV cache. Its TP 8 "--max-running-requests 128"
            # is not applied: the rows ran more (TPOT still rising from 128 to 512 clients, 3.1 s TTFT
            # at 512 clients of 1k/1k, where a cap of 128 makes 3 of 4 requests wait a whole answer)
            knobs["scheduler_recv_interval"] = 30 if row.concurrency >= 16 and row.tp >= 8 else 10
            engine = {"kv_cache_dtype": "fp8"}
            if row.tp < 8:  # its TP 4 branch (8192 x 1024 only, 4-32 clients)
                knobs.update(max_running_requests=32, chunked_prefill_size=8192, max_prefill_tokens=8192,
                             mem_fraction_static=0.95)
    elif row.engine == "trtllm" and "llama-3.1-70b" in model:
        # 70b_fp8_h200_trt_slurm.sh, 70b_fp8_b200_trt_slurm.sh (InferenceMAX's 2025 versions; the rows were
        # measured 2025-10-29): an FP8 KV cache without block reuse, and on 1k/1k below TP 8 delay batching
        # (batch_wait_timeout_iters 20, batch_wait_max_tokens_ratio 0.9); --max_num_tokens 16384 on the
        # B200 (the H200's is the sweep's MAX_MODEL_LEN, not recorded: the bench's budget stays)
        engine = {"kv_cache_dtype": "fp8"}
        if row.system == "b200_sxm":
            engine["max_num_batched_tokens"] = 16384
        knobs = {"enable_block_reuse": False}
        if (row.isl, row.osl) == (1024, 1024) and row.tp < 8:
            knobs.update(batch_wait_timeout_iters=20, batch_wait_max_tokens_ratio=0.9)
    elif row.engine == "trtllm" and "gpt-oss" in model and row.system == "h200_sxm":
        # gptoss_fp4_h200_trt.sh: --max_batch_size CONC --max_num_tokens 20000, kv_cache_config {dtype:
        # auto, enable_block_reuse: false, free_gpu_memory_fraction: 0.85}. Its moe_config backend TRITON
        # (OpenAI's triton_kernels matmul_ogs) is what the database's TensorRT-LLM rows already time on
        # Hopper: AIConfigurator's collector sets moe_backend "triton" for GPT-OSS below SM100
        # (collector/trtllm/collect_moe.py), so the experts stay priced as they are
        engine = {"max_num_seqs": row.concurrency, "max_num_batched_tokens": 20000}
        knobs = {"free_gpu_memory_fraction": 0.85, "enable_block_reuse": False}
    elif row.engine == "trtllm" and "deepseek-r1" in model:
        engine = {"kv_cache_dtype": "fp8",
                  "max_num_batched_tokens": max(8192, (row.concurrency + row.isl + 64 + 63) // 64 * 64)}
        knobs = {"free_gpu_memory_fraction": 0.75, "enable_block_reuse": False}
        if row.system == "b200_sxm" and row.version.startswith("1.2"):
            # dsr1_fp8_b200_trt.sh since InferenceX PR #594 (TensorRT-LLM 1.2.0rc6.post2): KV fraction
            # 0.8, 0.7 at 256 clients and more on 1k/1k and 1k/8k, 0.75 at TP 4 on 8k/1k; delay batching
            # (batch_wait_timeout_iters 40, batch_wait_max_tokens_ratio 0.8) on 1k/1k at 64-255 clients
            lengths = (row.isl, row.osl)
            frac = 0.8
            if lengths in ((1024, 1024), (1024, 8192)) and row.concurrency >= 256:
                frac = 0.7
            elif lengths == (8192, 1024) and row.tp == 4:
                frac = 0.75
            knobs["free_gpu_memory_fraction"] = frac
            if lengths == (1024, 1024) and 64 <= row.concurrency < 256:
                knobs.update(batch_wait_timeout_iters=40, batch_wait_max_tokens_ratio=0.8)
    return engine, knobs, hardware


def inferencemax_scenario(row: Row, table: str, send_gap_s: float, spec: dict | None = None) -> dict:
    """The row as InferenceMAX ran it: its client's CONC*10 drawn lengths, in order, behind CONC
    clients whose first sends are ``send_gap_s`` apart (the opening wave), and its server's flags."""
    sc = scenario_of(row, table, INFERENCEMAX_PROMPTS_PER_CLIENT, send_gap_s, spec)
    wl = sc["workload"]
    wl.pop("prompt_tokens")
    wl.pop("output_tokens")
    wl["trace"] = {"path": str(inferencemax_trace(row)), "format": "csv"}
    engine, knobs, hardware = inferencemax_server(row)
    sc["engine"].update(engine)
    sc["policies"][0].update(knobs)
    sc["hardware"].update(hardware)
    if row.slots_short:  # --slots-short is a sensitivity over the server's own flags: applied after them
        sc["engine"]["max_num_seqs"] = max(1, row.concurrency - row.slots_short)
    return sc


def scenario_of(row: Row, table: str, rounds: int, send_gap_s: float = 0.0, spec: dict | None = None) -> dict:
    sc = _scenario(row, table, rounds, send_gap_s)
    if spec is not None:  # --mtp: a sensitivity, never the row's own result (the corpus does not say MTP)
        sc["policies"][0]["speculative"] = spec
    if row.moe_path:
        # the layout beyond TP, and FlashMLA's 64-token blocks for MLA
        hw = sc["hardware"]
        hw.update(data_parallel=row.data_parallel, expert_parallel=row.expert_parallel,
                  count=row.tp * row.data_parallel)
        if row.mla:
            sc["engine"]["block_size"] = MLA_BLOCK_SIZE
    if row.engine == "vllm" and not vllm_async_scheduling(row):
        sc["engine"]["async_scheduling"] = False  # the step is the GPU's time plus the engine's CPU time
    elif row.engine == "vllm" and row.vllm_async_admission:
        # step_with_batch_queue adds a request arriving during step k to step k + 2 (policies/vllm_v1.py,
        # async_admission), on the rows whose server scheduled asynchronously (--vllm-async-admission)
        sc["policies"][0]["async_admission"] = True
    if row.engine == "trtllm":
        # A TensorRT-LLM token budget of max(8192, prompt + clients), dense and MoE rows alike. At its
        # default 8192 with chunking off an 8192-token context enters only an empty step, which
        # serialises those rows (one sequence a step: 1,000-2,100 s simulated TTFT on the H200/B200
        # Llama-3.1-70B 8192-token rows against 1.7-47 s measured; attention DP 8 + EP 8 was 1009 %
        # off), so the runs cannot have used it; the corpus does not record what they set. Rows whose
        # prompt and clients fit 8192 keep the default.
        sc["engine"]["max_num_batched_tokens"] = max(8192, row.isl + row.concurrency)
        if row.data_parallel > 1:
            sc["policies"][0].update(TRTLLM_ADP_BALANCE)
    if row.aic_config and row.engine == "trtllm" and AIC_GAP_SOURCE in row.source:
        sc["engine"].update(aic_trtllm_engine(row))
        sc["policies"][0].update(AIC_TRTLLM_POLICY)
    if row.no_overlap and row.engine == "trtllm":
        sc["policies"][0]["disable_overlap_scheduler"] = True
    if row.slots_short:
        # --slots-short K: a closed loop whose engine runs K requests fewer than it has clients, each
        # request waiting (N / (N - K) - 1) x E2E; what the TensorRT-LLM Llama-3.1-8B rows' TTFT growth
        # with the output length implies for K = 1 (bench/prefill_bounds.py --left). Never the default:
        # the corpus does not record the server's max_batch_size or the client's connections.
        sc["engine"]["max_num_seqs"] = max(1, row.concurrency - row.slots_short)
    return sc


def _scenario(row: Row, table: str, rounds: int, send_gap_s: float = 0.0) -> dict:
    return {
        "name": f"silicon-{row.id}",
        "seed": 0,
        "model": {"hf_config": row.config, "quantization": "fp8" if row.precision == "fp8" else None},
        "hardware": {"gpu": row.gpu, "tensor_parallel": row.tp, "count": row.tp},
        "latency": {"backend": "table", "path": table},
        "workload": {
            "num_requests": row.concurrency * rounds,
            "arrival": {"process": "closed", "concurrency": row.concurrency,
                        "ramp_s": round(send_gap_s * row.concurrency, 9)},
            "prompt_tokens": {"dist": "fixed", "value": row.isl},
            "output_tokens": {"dist": "fixed", "value": row.osl},
            "max_tokens": row.osl,
        },
        "engine": {"max_model_len": row.isl + row.osl + 16},
        "policies": [{"name": row.policy}],
    }


@dataclass
class Result:
    id: str
    group: str
    ttft_ms: float
    tpot_ms: float
    layout: str = ""  # Row.layout: the per-TP breakdown's key beside the group
    sim_ttft_ms: float = float("nan")
    sim_tpot_ms: float = float("nan")
    ttft_err: float = float("nan")
    tpot_err: float = float("nan")
    error: str = ""
    wall_s: float = 0.0
    cpu_s: float = 0.0  # the worker's CPU time on the row (what a loaded machine does not inflate)
    extra: dict = field(default_factory=dict)


def _means(req, after_s: float = -1.0, skip_first: int = 0) -> tuple[float, float]:
    """Mean TTFT and TPOT (ms) of the requests sent at or after ``after_s`` and past the first ``skip_first``."""
    req = req.sort_values("arrival_s")
    req = req.iloc[skip_first:]
    req = req[req["arrival_s"] >= after_s]
    return float(req["ttft_s"].mean()) * 1e3, float(req["tpot_s"].mean()) * 1e3


def pilot_e2e(pilot, concurrency: int) -> float:
    """A request's mean end-to-end time after the opening wave (the first ``concurrency`` sends) of a
    ``wave`` run: the cycle over which ``random`` and ``spread`` place the clients' first sends."""
    return float(pilot.sort_values("arrival_s").iloc[concurrency:]["e2e_s"].mean())


def phased_scenario(row: Row, table: str, rounds: int, cycle_s: float, start: str, spec: dict | None = None) -> dict:
    """The row with its clients' first sends placed over one cycle (``start``: random or even), one
    round more than ``rounds`` (the first is the ramp, not measured)."""
    sc = scenario_of(row, table, rounds + 1, 0.0, spec)
    sc["workload"]["arrival"].update(ramp_s=round(cycle_s, 9), start=start)
    return sc


def random_phase_run(row: Row, table: str, rounds: int, send_gap_s: float):
    """The default phase's run of a row (its pilot first), and the send time from which its requests
    are measured: what bench/engine_cpu_lomo.py stretches."""
    import sim

    pilot = sim.run(scenario_of(row, table, rounds, send_gap_s)).requests
    e2e = pilot_e2e(pilot, row.concurrency)
    return sim.run(phased_scenario(row, table, rounds, e2e, "random")), e2e


def simulate(args) -> Result:
    """One row under every phase variant in ``phases``; the first is the row's reported result.

    ``wave``: first sends ``send_gap_s`` apart, mean over all requests (the opening wave included).
    ``warm``: the same run, mean over the requests after the opening wave (the first N sends).
    ``spread``: a pilot ``wave`` run gives the mean E2E of a request after the opening wave; the
    clients' first sends are then spread evenly over that one cycle (``ramp_s`` = E2E, ``start:
    even``) and the means are over the requests sent after the ramp. ``random``: the same, each
    client's first send a seeded uniform draw over the cycle (``start: random``; :data:`PHASE`).
    ``opening``: the pilot's first round (its first N sends) as one of :data:`OPENING_ROUNDS` rounds,
    the ``random`` run's means as the others (:func:`opening_means`). Every row's ``extra`` keeps the
    pieces (``first_round``, ``warm_steady``, ``random_steady`` when run) for bench/opening_lomo.py.
    """
    row, table, rounds, send_gap_s, phases = args[:5]
    spec = args[5] if len(args) > 5 else None  # --mtp: the policy's speculative section
    import warnings

    import sim
    from sim.errors import CbsimError

    t0, c0 = time.perf_counter(), time.process_time()
    res = Result(row.id, row.group, row.ttft_ms, row.tpot_ms, row.layout)
    replayed = row.client == "inferencemax" and is_inferencemax(row)
    out: dict = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                _fixed_phases(row, table, rounds, send_gap_s, phases, spec, out, res)
            except CbsimError as exc:
                if not replayed:
                    raise
                # the comparison at the bench's defaults cannot run (an engine the script's own flags
                # make fit, e.g. SGLang's memory fraction): the row is still priced as it ran
                res.extra["fixed_error"] = str(exc)[:200]
                phases = []
            if replayed:
                # the row as InferenceMAX's client and server ran it; the fixed-length phases stay in
                # ``extra["phases"]`` beside it (the "before" of docs/accuracy-corpus.md's table)
                req = sim.run(inferencemax_scenario(row, table, send_gap_s, spec)).requests
                out["inferencemax"] = _means(req)
                res.extra["client"] = "inferencemax"
                res.extra["lengths"] = {"prompt_mean": float(req["prompt_tokens"].mean()),
                                        "output_mean": float(req["output_tokens"].mean()), "requests": len(req)}
                phases = ["inferencemax", *phases]
        res.sim_ttft_ms, res.sim_tpot_ms = out[phases[0]]
        res.ttft_err = res.sim_ttft_ms / row.ttft_ms - 1
        res.tpot_err = res.sim_tpot_ms / row.tpot_ms - 1
        res.extra["phases"] = {k: {"ttft_err": v[0] / row.ttft_ms - 1, "tpot_err": v[1] / row.tpot_ms - 1}
                               for k, v in out.items() if k in phases}
    except CbsimError as exc:
        res.error = str(exc)[:200]
    res.wall_s, res.cpu_s = time.perf_counter() - t0, time.process_time() - c0
    return res


def _fixed_phases(row: Row, table: str, rounds: int, send_gap_s: float, phases: list[str], spec, out: dict,
                  res: Result) -> None:
    """The fixed-length closed loop under every phase variant in ``phases`` (into ``out``): the
    pilot ``wave`` run, then ``spread``, ``random`` and ``opening`` from it."""
    import sim

    pilot = sim.run(scenario_of(row, table, rounds, send_gap_s, spec)).requests
    out.update(wave=_means(pilot), warm=_means(pilot, skip_first=row.concurrency))
    e2e = pilot_e2e(pilot, row.concurrency)
    first = _means(pilot.sort_values("arrival_s").iloc[:row.concurrency])
    res.extra["first_round"] = {"ttft_ms": first[0], "tpot_ms": first[1]}
    res.extra["warm_steady"] = {"ttft_ms": out["warm"][0], "tpot_ms": out["warm"][1]}
    for phase in ("spread", "random"):
        if phase in phases or (phase == "random" and "opening" in phases):
            sc = phased_scenario(row, table, rounds, e2e, "even" if phase == "spread" else "random", spec)
            out[phase] = _means(sim.run(sc).requests, after_s=e2e)
            res.extra["ramp_s"] = e2e
    if "opening" in phases:
        res.extra["random_steady"] = {"ttft_ms": out["random"][0], "tpot_ms": out["random"][1]}
        out["opening"] = opening_means(first, out["random"], OPENING_ROUNDS)


# ------------------------------------------------------------------------------------------------
# running many rows: longest first, each result kept as it lands, resumable
# ------------------------------------------------------------------------------------------------
COSTS = CACHE / "row_cpu_s.json"  # row id -> the CPU seconds its last simulation took (any code version)


def cost_estimate(row: Row, rounds: int = ROUNDS, known: dict[str, float] | None = None) -> float:
    """Seconds a row is expected to take: its last measured CPU time when one is known, else one
    microsecond per decoded token (concurrency x rounds x output), the order of a vLLM row that
    fast-forwards little. Only the order of the work depends on it, never a result."""
    if known and row.id in known:
        return known[row.id] * rounds / ROUNDS
    return row.concurrency * rounds * (row.osl + 1) * 1e-6


def known_costs() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(COSTS.read_text(encoding="utf-8")).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def remember_costs(results: list[Result], rounds: int) -> None:
    """Fold the rows' measured CPU times into :data:`COSTS` (atomically: several runs share the cache)."""
    costs = known_costs()
    costs.update({r.id: round(r.cpu_s * ROUNDS / rounds, 3) for r in results if r.cpu_s > 0})
    try:
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = COSTS.with_name(COSTS.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(costs, sort_keys=True), encoding="utf-8")
        tmp.rename(COSTS)
    except OSError:
        pass  # an unwritable cache costs only the ordering of the next run


def longest_first(rows: list[Row], rounds: int = ROUNDS) -> list[Row]:
    """The rows in the order a pool should take them: the longest first, so that the last task a
    worker picks up is a short one and the workers end together."""
    known = known_costs()
    return sorted(rows, key=lambda r: (-cost_estimate(r, rounds, known), r.id))


def results_digest() -> str:
    """Changes whenever a row's result could: the code of the simulator, the policies, the composition
    and this bench, as Python sees it (the syntax tree without docstrings: a comment or a docstring
    edited between a run and its ``--resume`` changes nothing). A partial or finished ``--json``
    report is resumed only under the same digest."""
    import ast

    h = hashlib.sha256()
    files = [ROOT / "bench" / "silicon_accuracy.py"]
    for pkg in ("sim", "policies", "calib/sources"):
        files += sorted((ROOT / pkg).rglob("*.py"))
    for f in files:
        tree = ast.parse(f.read_bytes())
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
                node.body = body[1:] or [ast.Pass()]
        h.update(str(f.relative_to(ROOT)).encode())
        h.update(ast.dump(tree).encode())
    return h.hexdigest()[:12]


def partial_path(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


class Partial:
    """The ``--json`` report's rows as they land: one JSON line per row in ``OUT.partial`` after a
    header line with the settings and the code's digest, appended and flushed per row, so a crash
    or a kill loses no finished row. ``--resume`` takes the rows of an earlier partial or finished
    report written under the same settings and digest instead of simulating them again."""

    def __init__(self, out: Path, settings: dict, resume: bool) -> None:
        self.path = partial_path(out)
        self.header = {"settings": settings, "code": results_digest()}
        self.done: dict[str, Result] = {}
        if resume:
            self.done = self._earlier(out)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("w", encoding="utf-8") as f:
            f.write(json.dumps(self.header) + "\n")
            for r in self.done.values():
                f.write(json.dumps(asdict(r), default=str) + "\n")
        self._f = self.path.open("a", encoding="utf-8")

    def _earlier(self, out: Path) -> dict[str, Result]:
        done: dict[str, Result] = {}
        if out.is_file():  # a finished report
            try:
                report = json.loads(out.read_text(encoding="utf-8"))
            except ValueError:
                report = {}
            if report.get("resume") == self.header:
                done.update({d["id"]: Result(**d) for d in report.get("rows", [])})
        if self.path.is_file():
            lines = self.path.read_text(encoding="utf-8").splitlines()
            if lines and _json_or_none(lines[0]) == self.header:
                for line in lines[1:]:
                    d = _json_or_none(line)  # a line cut short by a crash is simulated again
                    if isinstance(d, dict) and "id" in d:
                        done[d["id"]] = Result(**d)
        return done

    def add(self, res: Result) -> None:
        self._f.write(json.dumps(asdict(res), default=str) + "\n")
        self._f.flush()

    def close(self, finished: bool) -> None:
        self._f.close()
        if finished:
            self.path.unlink(missing_ok=True)


def _json_or_none(line: str):
    try:
        return json.loads(line)
    except ValueError:
        return None


def run_rows(pool, work: list[tuple], on_result=None, show_progress: bool | None = None) -> list[Result]:
    """``simulate`` over ``work`` in the pool, in the order given (longest first), each result
    handed to ``on_result`` as it lands; a progress bar on a terminal names the last row done."""
    from concurrent.futures import as_completed

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    show = console.is_terminal if show_progress is None else show_progress
    results = []
    with Progress(TextColumn("rows"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=console, transient=True, disable=not show) as bar:
        task = bar.add_task("", total=len(work))
        futures = [pool.submit(simulate, w) for w in work]
        for fut in as_completed(futures):
            res = fut.result()
            results.append(res)
            if on_result is not None:
                on_result(res)
            bar.update(task, advance=1, description=f"last: {res.id} ({res.wall_s:.1f} s)")
    return results


# ------------------------------------------------------------------------------------------------
# report
# ------------------------------------------------------------------------------------------------
def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    pos = q * (len(xs) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (pos - lo) * (xs[hi] - xs[lo])


def groups(results: list[Result], by_layout: bool = False) -> dict[str, dict]:
    """Median and p90 of |error| and the median signed error per (GPU, engine, model) group, or per
    group and parallel layout (``by_layout``: "h100_sxm trtllm Qwen/Qwen3-32B tp4"), which is how
    issue #29 states its bounds (per TP degree)."""
    by: dict[str, list[Result]] = defaultdict(list)
    for r in results:
        if not r.error:
            by[f"{r.group} {r.layout}" if by_layout and r.layout else r.group].append(r)
    out = {}
    for g, rs in sorted(by.items()):
        entry = {"rows": len(rs)}
        for metric in ("ttft", "tpot"):
            errs = [getattr(r, f"{metric}_err") for r in rs]
            entry[metric] = {"median_abs": quantile([abs(e) for e in errs], 0.5),
                             "p90_abs": quantile([abs(e) for e in errs], 0.9),
                             "median_signed": quantile(errs, 0.5)}
        out[g] = entry
    return out


def print_report(rows: list[Row], results: list[Result], verbose: bool) -> None:
    skipped = defaultdict(int)
    for r in rows:
        if r.skip:
            skipped[r.skip] += 1
    print(f"corpus: {len(rows)} rows; priced {len(results)}; skipped {sum(skipped.values())}")
    for reason, n in sorted(skipped.items(), key=lambda kv: -kv[1])[:25 if not verbose else None]:
        print(f"  skipped {n:5d}: {reason}")
    if len(skipped) > 25 and not verbose:
        print(f"  ... {len(skipped) - 25} more reasons (--verbose lists them all)")
    if verbose:
        print("\nper row (signed error of the mean: sim / real - 1)")
        for r in sorted(results, key=lambda r: (r.group, r.id)):
            if r.error:
                print(f"  {r.id:70s} ERROR {r.error}")
            else:
                print(f"  {r.id:70s} TTFT {r.ttft_ms:9.1f} -> {r.sim_ttft_ms:9.1f} ms {r.ttft_err:+7.1%}   "
                      f"TPOT {r.tpot_ms:7.2f} -> {r.sim_tpot_ms:7.2f} ms {r.tpot_err:+7.1%}")
    failed = [r for r in results if r.error]
    if failed:
        reasons = defaultdict(int)
        for r in failed:
            reasons[r.error.split(":")[0] + ": " + r.error.split(":", 1)[-1][:90]] += 1
        print(f"\n{len(failed)} rows cbsim refused to simulate (left out of the groups):")
        for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
            print(f"  {n:5d}: {reason}")
    print(f"\n{'group (GPU engine model)':58s} {'rows':>4s}  {'TTFT |err| med':>14s} {'p90':>7s} {'signed':>7s}  "
          f"{'TPOT |err| med':>14s} {'p90':>7s} {'signed':>7s}")
    for g, e in groups(results).items():
        t, p = e["ttft"], e["tpot"]
        print(f"{g:58s} {e['rows']:4d}  {t['median_abs']:14.1%} {t['p90_abs']:7.1%} {t['median_signed']:+7.1%}  "
              f"{p['median_abs']:14.1%} {p['p90_abs']:7.1%} {p['median_signed']:+7.1%}")
    print(f"\n{'per parallel layout (group, TP/DP/EP)':58s} {'rows':>4s}  {'TTFT |err| med':>14s} {'p90':>7s} "
          f"{'signed':>7s}  {'TPOT |err| med':>14s} {'p90':>7s} {'signed':>7s}")
    for g, e in groups(results, by_layout=True).items():
        t, p = e["ttft"], e["tpot"]
        print(f"{g:58s} {e['rows']:4d}  {t['median_abs']:14.1%} {t['p90_abs']:7.1%} {t['median_signed']:+7.1%}  "
              f"{p['median_abs']:14.1%} {p['p90_abs']:7.1%} {p['median_signed']:+7.1%}")


GPU_NAMES = {"b200_sxm": "B200", "h100_sxm": "H100 SXM", "h200_sxm": "H200 SXM"}
ENGINE_NAMES = {"sglang": "SGLang", "trtllm": "TRT-LLM", "vllm": "vLLM"}


def markdown_table(group_stats: dict[str, dict]) -> str:
    """The README's corpus table (``--markdown``): one line per (GPU, engine, model) group of a
    report's ``groups``, in their order, errors of the mean in per cent."""
    lines = ["| GPU | engine | model | rows | TTFT \\|err\\| median (p90) | signed | TPOT \\|err\\| median (p90) | signed |",
             "|---|---|---|---|---|---|---|---|"]

    def pct(x: float, signed: bool = False) -> str:
        return (f"{x * 100:+.1f} %" if signed else f"{x * 100:.1f} %").replace("-", "\u2212")

    for g, e in group_stats.items():
        gpu, engine, model = g.split(" ", 2)
        t, o = e["ttft"], e["tpot"]
        lines.append(f"| {GPU_NAMES.get(gpu, gpu)} | {ENGINE_NAMES.get(engine, engine)} | {model.rsplit('/', 1)[-1]} | "
                     f"{e['rows']} | {pct(t['median_abs'])} ({pct(t['p90_abs'])}) | {pct(t['median_signed'], True)} | "
                     f"{pct(o['median_abs'])} ({pct(o['p90_abs'])}) | {pct(o['median_signed'], True)} |")
    return "\n".join(lines)


def print_phases(results: list[Result], phases: list[str]) -> None:
    print("\nper phase variant: median |err| of the mean, TTFT (its median signed error) and TPOT")
    by = defaultdict(list)
    for r in results:
        if not r.error:
            by[r.group].append(r)
    for g, rs in sorted(by.items()):
        cells = []
        for p in phases:  # rows whose comparison could not run (``fixed_error``) lack it
            t = [r.extra["phases"][p]["ttft_err"] for r in rs if p in r.extra["phases"]]
            o = [abs(r.extra["phases"][p]["tpot_err"]) for r in rs if p in r.extra["phases"]]
            cells.append(f"{p} {quantile([abs(e) for e in t], 0.5):6.1%} ({quantile(t, 0.5):+6.1%}) "
                         f"{quantile(o, 0.5):5.1%}")
        print(f"{g:40s} " + "   ".join(cells))


def print_clients(results: list[Result], phase: str) -> None:
    """Per group, the rows replayed as InferenceMAX ran them: median |err| (and TTFT's median signed
    error) under the fixed-length client (``--phase``) and under InferenceMAX's client."""
    print(f"\nInferenceMAX rows: median |err| of the mean, fixed-length client ({phase}) -> InferenceMAX's client; "
          "TTFT (median signed), TPOT")
    by = defaultdict(list)
    for r in results:
        if not r.error and r.extra.get("client") == "inferencemax":
            by[r.group].append(r)
    for g, rs in sorted(by.items()):
        cells = []
        for p in (phase, "inferencemax"):  # rows whose comparison could not run (``fixed_error``) lack it
            t = [r.extra["phases"][p]["ttft_err"] for r in rs if p in r.extra["phases"]]
            o = [abs(r.extra["phases"][p]["tpot_err"]) for r in rs if p in r.extra["phases"]]
            cells.append(f"{quantile([abs(e) for e in t], 0.5):6.1%} ({quantile(t, 0.5):+6.1%}) {quantile(o, 0.5):5.1%}")
        print(f"{g:52s} {len(rs):4d}   {cells[0]}   ->   {cells[1]}")


def _stats(rs: list[dict]) -> dict:
    out: dict = {"rows": len(rs)}
    for metric in ("ttft", "tpot"):
        errs = [r[f"{metric}_err"] for r in rs]
        out[metric] = {"median_abs": round(quantile([abs(e) for e in errs], 0.5), 4),
                       "p90_abs": round(quantile([abs(e) for e in errs], 0.9), 4),
                       "median_signed": round(quantile(errs, 0.5), 4)}
    return out


def stamp(table: Path, report: dict) -> dict:
    """Write into a table's metadata.json (key ``corpus_error``) its GPU's and engine's measured
    error on the corpus: every priced row of that GPU and engine, and per model."""
    from sim.latency.table_format import read_table, write_table

    t = read_table(table)
    prov = t.metadata.get("provenance") or {}
    system, engine = prov.get("gpu"), prov.get("engine")
    if not system or not engine:
        raise SystemExit(f"--stamp {table}: not a kernel-db table (metadata.provenance has no gpu/engine)")
    rs = [r for r in report["rows"] if not r["error"] and r["group"].startswith(f"{system} {engine} ")]
    if not rs:
        raise SystemExit(f"--stamp {table}: the report has no priced {engine} rows on {system}")
    by: dict[str, list[dict]] = defaultdict(list)
    for r in rs:
        by[r["group"].split(" ", 2)[2]].append(r)
    t.metadata["corpus_error"] = {
        "corpus": "aiconfigurator-core systems/silicon_sample.csv (real closed-loop serving runs)",
        "gpu": system, "engine": engine, **_stats(rs),
        "by_model": {m: _stats(v) for m, v in sorted(by.items())},
        "measured_by": f"bench/silicon_accuracy.py: closed loop at each row's concurrency, {report['rounds']} "
                       f"requests per client, phases {report.get('phase', 'wave')!r} (first sends "
                       f"{report.get('send_gap_ms', SEND_GAP_MS)} ms apart in 'wave' and 'warm'; 'random' and "
                       "'spread' place them over one cycle); "
                       + ("InferenceMAX's rows as its client ran them (lengths over [0.8 L, L], CONC x 10 requests "
                          "all counted); " if report.get("client", "fixed") == "inferencemax" else "") +
                       "errors are sim / real - 1 of mean TTFT and mean TPOT, on tables composed the same way "
                       "for each row's own model, TP and precision (docs/accuracy-corpus.md)",
    }
    write_table(table, t)
    return t.metadata["corpus_error"]


def select(rows: list[Row], only: list[str]) -> list[Row]:
    if not only:
        return rows
    keep = []
    for r in rows:
        hay = " ".join((r.id, r.system, r.engine, r.model, r.gpu)).lower()
        if all(o.lower() in hay for o in only):
            keep.append(r)
    return keep


def parser() -> argparse.ArgumentParser:
    """The command line (its defaults are the bench's: what a plain run replays)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], help="keep rows whose id/GPU/engine/model contain this")
    ap.add_argument("--json", type=Path, default=None, help="write every row's result and the groups here")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help=f"requests per client (default {ROUNDS})")
    ap.add_argument("--send-gap-ms", type=float, default=SEND_GAP_MS,
                    help=f"ms between the clients' first sends (default {SEND_GAP_MS}; 0: all at once)")
    ap.add_argument("--phase", choices=PHASES, default=PHASE,
                    help=f"how the clients' phases are set up and which requests the means count (default {PHASE})")
    ap.add_argument("--compare-phases", action="store_true",
                    help="also simulate every other --phase variant and print each one's group errors")
    ap.add_argument("--allreduce", choices=("auto", "custom", "nccl"), default=ALLREDUCE,
                    help="the all-reduce kernel the tables price (default auto: NCCL for TensorRT-LLM 1.0 rows, "
                         "the database's custom kernel otherwise)")
    ap.add_argument("--moe-kernel", choices=("auto", "database"), default=MOE_KERNEL,
                    help="the routed experts' kernel the tables price (default auto: vLLM's Marlin MXFP4 kernel for the "
                         "InferenceMAX vLLM gpt-oss rows on H100/H200, whose launch scripts set "
                         "VLLM_MXFP4_USE_MARLIN=1, FlashInfer's MXFP4 x MXFP8 kernel for those on the B200, whose "
                         "scripts set VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1; the database's own rows otherwise); "
                         "database: the database's rows for every row (the comparison)")
    ap.add_argument("--vllm-async", choices=("version", "always"), default=VLLM_ASYNC,
                    help="how a vLLM row's async scheduling is chosen (default version: as its server ran it, "
                         "asynchronous from vLLM 0.14 or where its launch script sets async-scheduling, "
                         "synchronous before; always: cbsim's default, asynchronous, for every row, the comparison)")
    ap.add_argument("--vllm-async-admission", choices=("on", "off"), default=VLLM_ASYNC_ADMISSION,
                    help="on (default): the vLLM rows whose server scheduled asynchronously (vllm_async_scheduling) "
                         "run vllm-v1's async_admission knob (a request arriving during step k enters step k + 2, "
                         "as vLLM's batch queue admits it); off: cbsim's default, the next step (the comparison)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--mtp", default=None, metavar="K:RATE",
                    help="a sensitivity: the rows of models that ship an MTP layer (DeepSeek-V3/R1) run "
                         "speculative.method mtp with K drafts accepted at RATE, the drafter on the MTP "
                         "layer's own kernel-db table (the corpus does not say which rows ran MTP)")
    ap.add_argument("--slots-short", type=int, default=0, metavar="K",
                    help="a sensitivity: every row's engine runs at most clients - K requests (engine.max_num_seqs); "
                         "K = 1 is what the TensorRT-LLM Llama-3.1-8B rows' TTFT growth with the output implies")
    ap.add_argument("--aic-config", action="store_true",
                    help="serve the aic-auto-gap-analysis TensorRT-LLM rows with AIConfigurator's generated config "
                         "(max_num_tokens = max_batch_size + ISL + 1500, block reuse off, free fraction 0.7)")
    ap.add_argument("--no-overlap", action="store_true",
                    help="run the TensorRT-LLM rows with disable_overlap_scheduler (TensorRT-LLM's default is "
                         "the overlap scheduler: policies/trtllm.py)")
    ap.add_argument("--client", choices=CLIENTS, default=CLIENT,
                    help="inferencemax (default): the rows InferenceMAX measured (dated-CSV rows at 1k/1k, 1k/8k, "
                         "8k/1k) replayed as its client and launch scripts ran them (lengths uniform over [0.8 L, L] "
                         "from seed 0, CONC x 10 requests all counted, the scripts' server flags), the --phase result "
                         "beside it, every other row under --phase; fixed: every row a fixed-length closed loop "
                         "under --phase (the comparison)")
    ap.add_argument("--resume", action="store_true",
                    help="with --json: take the rows an earlier run of the same code and settings wrote there "
                         "(finished, or its OUT.partial after a crash) instead of simulating them again")
    ap.add_argument("--verbose", action="store_true", help="every row and every skip reason")
    ap.add_argument("--stamp", type=Path, action="append", default=[],
                    help="a kernel-db table folder whose metadata.json gets its GPU's corpus error (repeatable)")
    ap.add_argument("--from-json", type=Path, default=None,
                    help="stamp (--stamp) or print (--markdown) from a report --json wrote, without a run")
    ap.add_argument("--markdown", action="store_true",
                    help="print the groups as the README's corpus table (markdown), after the run or from --from-json")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.slots_short < 0:
        raise SystemExit(f"--slots-short must be 0 or more, got {args.slots_short}")
    if args.resume and args.json is None:
        raise SystemExit("--resume takes the rows of an earlier --json report: give that --json OUT.json too")
    if args.from_json is not None:
        report = json.loads(args.from_json.read_text())
        for table in args.stamp:
            e = stamp(table, report)
            print(f"{table}: {e['rows']} rows, TTFT |err| median {e['ttft']['median_abs']:.1%}, TPOT |err| median "
                  f"{e['tpot']['median_abs']:.1%}")
        if args.markdown:
            print(markdown_table(report["groups"]))
        return 0

    t0 = time.perf_counter()
    rows = select(read_rows(), args.only)
    classify(rows, args.allreduce, args.moe_kernel)
    priced = [r for r in rows if not r.skip]
    for r in priced:
        r.slots_short = args.slots_short
        r.aic_config = args.aic_config
        r.no_overlap = args.no_overlap
        r.client = args.client
        r.vllm_async = args.vllm_async
        r.vllm_async_admission = args.vllm_async_admission == "on"
    spec = mtp_section(args.mtp)
    if spec is not None:
        for r in priced:
            r.mtp = r.mla and r.policy in MTP_POLICIES and _has_mtp(r.config)
    keys = sorted({k for r in priced for k in (r.table_key, *([r.mtp_key] if r.mtp else []))}, key=str)
    tables: dict[tuple, str] = {}
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        for key, folder, err in pool.map(build_one, [(k, _digest(k)) for k in keys]):
            if err:
                for r in priced:
                    if key in (r.table_key, r.mtp_key if r.mtp else None):
                        r.skip = f"kernel database: {err}"
            else:
                tables[key] = folder
        t_tables = time.perf_counter() - t0
        priced = [r for r in priced if not r.skip]
        phases = [args.phase] + [p for p in (PHASES if args.compare_phases else ()) if p != args.phase]
        settings = {"rounds": args.rounds, "send_gap_ms": args.send_gap_ms, "phases": phases, "mtp": args.mtp}
        if args.slots_short:
            settings["slots_short"] = args.slots_short
        if args.aic_config:
            settings["aic_config"] = True
        if args.no_overlap:
            settings["no_overlap"] = True
        if args.client != CLIENT:
            settings["client"] = args.client
        if args.moe_kernel != MOE_KERNEL:
            settings["moe_kernel"] = args.moe_kernel
        if args.vllm_async != VLLM_ASYNC:
            settings["vllm_async"] = args.vllm_async
        if args.vllm_async_admission != VLLM_ASYNC_ADMISSION:
            settings["vllm_async_admission"] = args.vllm_async_admission
        partial = Partial(args.json, settings, args.resume) if args.json is not None else None
        done = partial.done if partial is not None else {}
        todo = longest_first([r for r in priced if r.id not in done], args.rounds)
        work = [(r, tables[r.table_key], args.rounds, args.send_gap_ms * 1e-3, phases,
                 {**spec, "draft_table": tables[r.mtp_key]} if r.mtp else None) for r in todo]
        if done:
            print(f"resumed: {sum(r.id in done for r in priced)} rows from {args.json} (or its .partial)")
        def landed(res: Result) -> None:
            if partial is not None:
                partial.add(res)
            remember_costs([res], args.rounds)  # as it lands: a run cut short still orders the next

        new = run_rows(pool, work, landed)
        by_id = {**done, **{r.id: r for r in new}}
        results = [by_id[r.id] for r in priced]  # the corpus' order, whatever order they ran in
    wall = time.perf_counter() - t0
    cpu = sum(r.cpu_s for r in new)
    print_report(rows, results, args.verbose)
    if args.compare_phases:
        print_phases(results, phases)
    if args.client == "inferencemax":
        print_clients(results, args.phase)
    print(f"\n{len(keys)} tables ({t_tables:.0f} s), {len(new)} rows simulated ({cpu:.0f} s CPU), {wall:.0f} s "
          f"wall on {args.workers} workers" + (f", {len(results) - len(new)} resumed" if done else ""))
    report = {"corpus": str(corpus_path()), "rounds": args.rounds, "send_gap_ms": args.send_gap_ms,
              "phase": args.phase, "client": args.client, "wall_s": wall, "cpu_s": cpu, "mtp": args.mtp, "slots_short": args.slots_short,
              "aic_config": args.aic_config, "no_overlap": args.no_overlap, "moe_kernel": args.moe_kernel,
              "vllm_async": args.vllm_async, "vllm_async_admission": args.vllm_async_admission,
              "resume": partial.header if partial else None,
              "skipped": [{"id": r.id, "reason": r.skip} for r in rows if r.skip],
              "rows": [asdict(r) for r in results], "groups": groups(results),
              "groups_by_layout": groups(results, by_layout=True)}
    if args.json is not None:
        tmp = args.json.with_name(args.json.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(report, indent=1, default=str))
        tmp.rename(args.json)
        partial.close(finished=True)
    for table in args.stamp:
        stamp(table, json.loads(json.dumps(report, default=str)))
    if args.markdown:
        print("\n" + markdown_table(report["groups"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
