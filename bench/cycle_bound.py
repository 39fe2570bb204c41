"""Can a corpus row's measured cycle hold its own prompts' prefill? (issue 26)

What it answers: a closed-loop client of ``bench/silicon_accuracy.py``'s corpus sends a request of
ISL prompt tokens, waits for its OSL output tokens, and sends the next, so one client's cycle is
``C = TTFT + (OSL - 1) x TPOT`` (the row's measured means) and in one cycle the engine prefills
``concurrency`` prompts. Whatever else the engine does, those prefills must fit in ``C``. This prints,
per row, the fraction of the measured cycle the prefills alone need (``share``), at three rates:

- ``peak``: the prompt's FLOPs on one GPU (the linear layers at TP shard shapes, the causal
  attention, one LM head; ``LatencyModel.step_flops_bytes``) at the GPU's dense FP8 (fp8 rows) or
  BF16 Tensor Core peak (``sim/hardware/gpus.py``), attention included at that peak: a lower
  bound no kernel beats;
- ``+ar``: the same plus the two all-reduces per layer of ``ISL x hidden`` bf16 values at TP > 1,
  each at least its bytes over one GPU's NVLink (``link_bandwidth``, one direction): a lower bound
  even for an in-switch (NVLS) reduction, without overlap (vLLM runs them in the layer's stream);
- ``db``: the prompt's chunks alone (no decodes beside them) priced by the row's kernel-db table,
  the database's measured GEMM, attention and all-reduce rows.

A share above 1 says the measured cycle cannot hold the row's prompts at that rate: the work the
row describes was not the work served (prompts partly served from vLLM's prefix cache, which V1
turns on by default, or shorter prompts than ISL, or fewer requests in flight than the
concurrency), and no change of kernel or engine term can reach its TPOT.

    .venv/bin/python bench/cycle_bound.py --only h200_sxm_vllm --only llama_3_1_8b
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BF16_BYTES = 2


@dataclass
class Bound:
    cycle_s: float  # the measured cycle of one client: TTFT + (OSL - 1) x TPOT
    peak_s: float  # one prompt's FLOPs at the dense Tensor Core peak
    allreduce_s: float  # its all-reduce bytes over one GPU's link (0 at TP 1)
    db_s: float  # its chunks alone, priced by the kernel-db table

    def share(self, per_prompt_s: float, concurrency: int) -> float:
        return concurrency * per_prompt_s / self.cycle_s


def allreduce_bound(spec, isl: int, tp: int, link_bandwidth: float) -> float:
    """Two all-reduces per layer of ``isl x hidden`` bf16 values, each at least its bytes over the
    link: a ring sends ``2 (tp - 1) / tp`` of it, an in-switch reduction all of it once."""
    if tp <= 1:
        return 0.0
    return 2 * spec.num_layers * isl * spec.hidden_size * BF16_BYTES / link_bandwidth


def prompt_alone_s(latency, isl: int, budget: int) -> float:
    """The steps of one prompt's chunks with nothing beside them (vLLM's chunked prefill at the
    token budget), priced by the table."""
    from bench.ttft_parts import _plan
    from sim.latency.base import step_shape

    total, done = 0.0, 0
    while done < isl:
        n = min(isl - done, budget)
        plan = _plan([n], [done])
        total += latency.price(step_shape(plan), plan)[0]
        done += n
    return total


def row_bound(row, table: str) -> Bound:
    from bench.silicon_accuracy import scenario_of
    from bench.ttft_parts import _plan, latency_of
    from sim.latency.base import step_shape

    latency, limits, dep = latency_of(scenario_of(row, table, 1))
    peak = dep.gpu.fp8_flops if row.precision == "fp8" and dep.gpu.fp8_flops else dep.gpu.peak_flops
    flops = latency.step_flops_bytes(step_shape(_plan([row.isl], [0])))[0]
    cycle = (row.ttft_ms + (row.osl - 1) * row.tpot_ms) * 1e-3
    return Bound(cycle, flops / peak, allreduce_bound(dep.model, row.isl, row.tp, dep.gpu.gpu_link_bandwidth),
                 prompt_alone_s(latency, row.isl, limits.max_num_batched_tokens))


def main(argv=None) -> int:
    import bench.silicon_accuracy as sa

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], help="keep rows whose id/GPU/engine/model contain this")
    args = ap.parse_args(argv)
    rows = sa.select(sa.read_rows(), args.only)
    sa.classify(rows)
    priced = sorted((r for r in rows if not r.skip and not r.moe_path),
                    key=lambda r: (r.group, r.tp, r.isl, r.osl, r.concurrency))
    digest = sa.code_hash()
    tables = {key: sa.build_one((key, digest))[1] for key in sorted({r.table_key for r in priced})}
    print(f"{'row':52s} {'cycle':>7s} {'peak':>6s} {'+ar':>6s} {'db':>6s}   share: {'peak':>5s} {'+ar':>5s} {'db':>5s}")
    over = {"peak": 0, "+ar": 0, "db": 0}
    n = 0
    for r in priced:
        if not tables.get(r.table_key):
            continue
        b = row_bound(r, tables[r.table_key])
        shares = (b.share(b.peak_s, r.concurrency), b.share(b.peak_s + b.allreduce_s, r.concurrency),
                  b.share(b.db_s, r.concurrency))
        for k, s in zip(over, shares):
            over[k] += s > 1
        n += 1
        name = f"{r.system} {r.engine} {r.model.split('/')[-1][:16]} {r.isl}x{r.osl} c{r.concurrency} tp{r.tp}"
        print(f"{name[:52]:52s} {b.cycle_s * 1e3:7.0f} {b.peak_s * 1e3:6.1f} {(b.peak_s + b.allreduce_s) * 1e3:6.1f} "
              f"{b.db_s * 1e3:6.1f}          {shares[0]:5.2f} {shares[1]:5.2f} {shares[2]:5.2f}")
    print(f"\nms per client cycle (measured) and per prompt; share = concurrency x per-prompt time / cycle\n"
          f"rows whose measured cycle cannot hold their prompts' prefill: peak {over['peak']}, +ar {over['+ar']}, "
          f"db {over['db']} of {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
