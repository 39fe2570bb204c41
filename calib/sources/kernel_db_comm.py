"""Which all-reduce kernel a kernel-db table prices: the engine's custom one or NCCL's.

AIConfigurator prices every tensor-parallel all-reduce from its ``custom_allreduce`` rows (the
engine's own one- or two-shot kernel over NVLink peer memory, ``comm/<engine>/<version>/
custom_allreduce_perf.parquet``). TensorRT-LLM runs that kernel only when it may: its
``AllreduceOp::selectImplementation`` (cpp/tensorrt_llm/thop/allreduceOp.cpp) falls back to NCCL
whenever ``ifFallbackToNCCL`` holds -- the message exceeds the custom kernel's workspace, or the
topology check found no peer-to-peer access or no NVLink between the ranks -- and
``allreduce_strategy: NCCL`` forces it. The database measures NCCL's ``all_reduce`` too
(``comm/nccl/<nccl_version>/nccl_perf.parquet``, the NCCL version the system yaml names), so a
table can price either from measured rows.

``allreduce="nccl"`` re-prices each all-reduce operator of ``m`` elements (tokens x hidden) as
``AIConfigurator's time x nccl(m) / custom(m)``: the two kernels' measured ratio at that message
size and GPU count (log-size interpolation between rows, the nearest row beyond the ends), so the
operator keeps AIConfigurator's own count of calls per step. Which one a served TensorRT-LLM ran is
not in the serving corpus; docs/trtllm.md says what its rows show.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from pathlib import Path

from sim.errors import CbsimError, nearest

ALLREDUCE_KINDS = ("custom", "nccl")


class AllReduceRows:
    """The database's custom and NCCL all-reduce rows of one system and engine version."""

    def __init__(self, data_dir: Path, engine: str, engine_version: str, nccl_version: str | None) -> None:
        import pyarrow.parquet as pq

        custom = data_dir / "comm" / engine / engine_version / "custom_allreduce_perf.parquet"
        nccl = data_dir / "comm" / "nccl" / str(nccl_version) / "nccl_perf.parquet"
        for path, what in (
            (custom, f"{engine} {engine_version}'s custom all-reduce"),
            (nccl, "NCCL's all-reduce"),
        ):
            if not path.is_file():
                raise CbsimError(
                    f"allreduce: the kernel database has no rows of {what} ({path.name} under "
                    f"{path.parent}); price the table with allreduce 'custom' or another version"
                )
        self.custom = _curves(
            pq.read_table(custom).to_pylist(), dtype_key="allreduce_dtype", dtype="bfloat16"
        )
        self.nccl = _curves(
            [r for r in pq.read_table(nccl).to_pylist() if r["op_name"] == "all_reduce"],
            dtype_key="nccl_dtype",
            dtype="half",
        )
        self.source = (
            f"{nccl.parent.name} (nccl_perf.parquet) over {engine} {engine_version} custom_allreduce rows"
        )

    def ratio(self, num_gpus: int, elements: float) -> float:
        """NCCL's time over the custom kernel's for one all-reduce of ``elements`` 16-bit values."""
        for name, curves in (("custom", self.custom), ("NCCL", self.nccl)):
            if num_gpus not in curves:
                raise CbsimError(
                    f"allreduce: the database's {name} all-reduce rows have no {num_gpus}-GPU "
                    f"measurements (it has {sorted(curves)})"
                )
        return _at(self.nccl[num_gpus], elements) / _at(self.custom[num_gpus], elements)


def check_kind(kind: str) -> str:
    if kind not in ALLREDUCE_KINDS:
        raise CbsimError(
            f"allreduce {kind!r} is not one of {', '.join(ALLREDUCE_KINDS)}{nearest(kind, ALLREDUCE_KINDS)}"
        )
    return kind


def is_allreduce_op(short_name: str) -> bool:
    """AIConfigurator's tensor-parallel all-reduce operators (``ar_1``, ``ar_2``, ``embedding_ar``)."""
    return short_name.startswith("ar_") or short_name.endswith("_ar")


def _curves(rows: list[dict], *, dtype_key: str, dtype: str) -> dict[int, tuple[list[float], list[float]]]:
    """{GPU count: (message sizes ascending, mean latency at each)} for one 16-bit dtype."""
    by: dict[int, dict[float, list[float]]] = {}
    for r in rows:
        if r.get(dtype_key) != dtype:
            continue
        by.setdefault(int(r["num_gpus"]), {}).setdefault(float(r["message_size"]), []).append(
            float(r["latency"])
        )
    out = {}
    for n, sizes in by.items():
        xs = sorted(sizes)
        out[n] = (xs, [sum(sizes[x]) / len(sizes[x]) for x in xs])
    return out


def _at(curve: tuple[list[float], list[float]], size: float) -> float:
    xs, ys = curve
    if size <= xs[0]:
        return ys[0]
    if size >= xs[-1]:
        return ys[-1] * size / xs[-1]  # bandwidth-bound beyond the largest row
    i = bisect_left(xs, size)
    f = (math.log(size) - math.log(xs[i - 1])) / (math.log(xs[i]) - math.log(xs[i - 1]))
    return ys[i - 1] + f * (ys[i] - ys[i - 1])
