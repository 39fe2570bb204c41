"""Step times from a latency table: measured (``calib``) or fitted from an engine's step log.

The table (format: :mod:`sim.latency.table_format`) holds five components on grids; a step's time
is their sum: ``overhead + linear(T) + Σ prefill_attn(n, c) + decode_attn(b, c̄) + step_gap``, plus
the optional ones when present: ``per_seq(S)`` (S = sequences in the step), ``decode_attn_mixed``
in place of ``decode_attn`` when the step also holds a prefill chunk, the decode-skew term of
``decode_skew_alpha``, less ``prefill_attn_launch_s`` for every prefill chunk after the first (one
attention launch holds them all), and the engine's CPU time ``engine_cpu(S)``, combined with that GPU time
as the engine schedules (``async_scheduling``: the larger of the two; otherwise their sum;
:mod:`sim.latency.engine_cpu`).
Per-request prefill chunks come from the :class:`StepPlan` (``num_new_tokens``, ``context``; a
decode is n == 1 on a non-empty context), the token count from :class:`StepShape`. Grids are
interpolated linearly (bilinearly), never in log space; outside a grid the nearest two points
extrapolate linearly and a warning names the dimension and how far outside, once per dimension.

Interpolation is plain Python on small lists (bisect), not numpy: the engine prices every step of
a run, and numpy's per-call overhead would dominate on arrays of ten points.
"""

from __future__ import annotations

import warnings
from bisect import bisect_right
from pathlib import Path

from sim.errors import CbsimError
from sim.latency.base import LatencyModel
from sim.latency.table_format import ALL_COMPONENTS, LatencyTable, read_table


class TableExtrapolationWarning(UserWarning):
    """A step lies outside a latency table's grid; its time was extrapolated linearly."""


class TableLatency(LatencyModel):
    name = "table"

    def __init__(self, table: LatencyTable, model, gpu, tensor_parallel: int, block_size: int,
                 overhead_s: float | None = None, async_scheduling: bool = True) -> None:
        super().__init__(model, gpu, tensor_parallel, block_size)
        self.table = table
        self.label = str(table.path) if table.path is not None else "latency table"
        self.overhead_s = table.scalar("overhead") if overhead_s is None else float(overhead_s)
        self.step_gap_s = table.scalar("step_gap")
        self._fixed = self.overhead_s + self.step_gap_s
        comps = table.components
        self._lin = _Grid1(comps["linear"], self)
        self._pre = _Grid2(comps["prefill_attn"], self)
        self._dec = _Grid2(comps["decode_attn"], self)
        self._seq = _Grid1(comps["per_seq"], self) if "per_seq" in comps else None
        self._mix = _Grid2(comps["decode_attn_mixed"], self) if "decode_attn_mixed" in comps else self._dec
        self._cpu = _Grid1(comps["engine_cpu"], self) if "engine_cpu" in comps else None
        # attention DP: the routed experts' share of linear(T), re-priced by sim.lockstep over the
        # group's tokens (table_format: moe_group); None keeps a group step at its slowest rank's price
        self.moe_group = _Grid1(comps["moe_group"], self) if "moe_group" in comps else None
        self.async_scheduling = bool(async_scheduling)
        self.skew = float(table.metadata.get("decode_skew_alpha") or 0.0)
        # the engines run every prefill chunk of a step in one varlen attention launch: its fixed
        # cost is paid once per step, not once per chunk (table_format: prefill_attn_launch_s)
        self._launch = float(table.metadata.get("prefill_attn_launch_s") or 0.0)
        if self.skew:
            # the skew term needs each step's longest context, which price_decodes is not given:
            # shadowing it makes the engine's fast-forward price decode stretches step by step
            # through price() (same times, slower)
            self.price_decodes = None
        self._warned: set[str] = set()
        bw = table.metadata.get("bandwidth") or {}
        h2d, d2h = bw.get("h2d_bytes_per_s"), bw.get("d2h_bytes_per_s")
        if h2d and d2h:
            # swap_time(blocks) is one-way and does not say which way: charge the mean time per
            # byte of the two directions (a swap out is later swapped back in)
            self._swap_s_per_byte = (1.0 / h2d + 1.0 / d2h) / 2
        elif h2d or d2h:
            self._swap_s_per_byte = 1.0 / (h2d or d2h)
        else:
            self._swap_s_per_byte = 1.0 / gpu.pcie_bandwidth

    @classmethod
    def from_path(cls, path: str | Path, model, gpu, tensor_parallel: int, block_size: int,
                  overhead_s: float | None = None, async_scheduling: bool = True, data_parallel: int = 1,
                  expert_parallel: int = 1) -> TableLatency:
        table = read_table_once(path)
        check_compatible(table, model, tensor_parallel, block_size, data_parallel, expert_parallel)
        return cls(table, model, gpu, tensor_parallel, block_size, overhead_s, async_scheduling)

    # --- pricing -----------------------------------------------------------------------------
    def price(self, shape, plan=None):
        t = self._fixed
        if shape.num_tokens > 0:
            t += self._lin(shape.num_tokens)
        if self._seq is not None and shape.num_seqs > 0:
            t += self._seq(shape.num_seqs)
        pre = self._pre
        longest = 0
        if plan is not None:
            # static batching's finished members still decode a dummy token each (padding_tokens
            # rows attending to padding_context keys): they are decode rows of the batch
            b = plan.padding_tokens if plan.padding_context else 0
            chunks = 0
            ctx = plan.padding_context
            # speculative verification (1 + drafts tokens on a context): priced as a decode row of
            # that context, each request's KV read once by one batched kernel (the drafts' query
            # rows go through the linear layers above); the table measured no such chunks
            news = plan.num_new_tokens
            contexts = plan.context
            if plan.spec_tokens is not None:
                news = [1 if d and c > 0 else n for n, c, d in zip(news, contexts, plan.spec_tokens)]
            elif plan.num_decodes:
                # the leading decodes (one new token on a non-empty context: StepPlan.num_decodes)
                # summed by builtins, the same integers the loop below adds one at a time
                nd = plan.num_decodes
                head = contexts if nd == len(contexts) else contexts[:nd]
                b += nd
                ctx += sum(head)
                longest = max(head)
                if nd == len(contexts):
                    news = contexts = ()
                else:
                    news, contexts = news[nd:], contexts[nd:]
            for n, c in zip(news, contexts):
                if n == 1 and c > 0:
                    b += 1
                    ctx += c
                    if c > longest:
                        longest = c
                elif n > 0:
                    t += pre(n, c)
                    chunks += 1
            if chunks > 1 and self._launch:
                t -= self._launch * (chunks - 1)
        else:  # shape only: one chunk holding every prefill token, its context recovered from the pairs
            b = shape.decode_tokens
            ctx = shape.decode_ctx - b  # decode_ctx counts c + 1 keys per decode
            n = chunks = shape.prefill_tokens
            if n > 0:
                t += pre(n, max(shape.prefill_attn / n - (n + 1) / 2, 0.0))
        if b:
            dec = self._mix if chunks else self._dec
            mean = ctx / b
            d = dec(b, mean)
            if self.skew and longest > mean:
                d += self.skew * (dec(b, longest) - d)
            t += d
        if self._cpu is not None:
            cpu = self._cpu(shape.num_seqs)
            t = (t if t > cpu else cpu) if self.async_scheduling else t + cpu
        flops, bytes_ = self.step_flops_bytes(shape)
        return t, self.useful_flops(shape, flops), bytes_

    def price_decodes(self, num_seqs: int, context: int, k: int):
        """(seconds, FLOPs, bytes) arrays of ``k`` consecutive pure-decode steps of ``num_seqs``
        sequences whose contexts sum to ``context`` before the first (each step adds one token per
        sequence), each equal to what :meth:`price` gives that step alone (the engine's
        fast-forward through decode stretches calls this)."""
        import numpy as np

        b = num_seqs
        ctx = context + b * np.arange(k, dtype=np.int64)  # contexts' sum before step j
        mean = ctx / b
        dec = self._dec
        if b < dec.ax[0] or b > dec.ax[-1]:
            self._outside(dec.comp, dec.dx, b, dec.ax[0], dec.ax[-1])
        if k and (mean[0] < dec.ay[0] or mean[-1] > dec.ay[-1]):
            x = float(mean[0] if mean[0] < dec.ay[0] else mean[-1])
            self._outside(dec.comp, dec.dy, x, dec.ay[0], dec.ay[-1])
        i, tx = _locate(dec.ax, dec.nx, b)
        v = np.asarray(dec.vals)
        if dec.ny == 1:
            col = v[:, 0]
            along = np.full(k, col[0] if tx is None else col[i] + tx * (col[i + 1] - col[i]))
        else:
            ay = np.asarray(dec.ay)
            j = np.clip(np.searchsorted(ay, mean, side="right") - 1, 0, dec.ny - 2)
            ty = (mean - ay[j]) / (ay[j + 1] - ay[j])
            row_i = v[i]
            a = row_i[j] + ty * (row_i[j + 1] - row_i[j])
            if tx is None:
                along = a
            else:
                row_n = v[i + 1]
                bb = row_n[j] + ty * (row_n[j + 1] - row_n[j])
                along = a + tx * (bb - a)
        fixed = self._fixed + self._lin(b)
        if self._seq is not None:
            fixed += self._seq(b)
        seconds = fixed + np.maximum(along, 0.0)
        if self._cpu is not None:  # as price() combines it (a pure-decode step schedules b sequences)
            cpu = self._cpu(b)
            seconds = np.maximum(seconds, cpu) if self.async_scheduling else seconds + cpu
        d = ctx + b  # keys read: each context plus the new token
        flops = self._flops_per_token * b + self._attn_flops_per_pair * (0.0 + d)
        bytes_ = self._weight_bytes + self.kv_bytes_per_token * (d + b) + self._act_bytes_per_token * b
        return seconds, flops, bytes_

    def swap_time(self, blocks: int) -> float:
        if blocks <= 0:
            return 0.0
        return blocks * self.kv_bytes_per_block * self._swap_s_per_byte

    def _outside(self, component: str, dim: str, x: float, lo: float, hi: float) -> None:
        key = f"{component}.{dim}"
        if key in self._warned:
            return
        self._warned.add(key)
        far = f"{lo - x:g} below its first point {lo:g}" if x < lo else f"{x - hi:g} above its last point {hi:g}"
        span = hi - lo
        rel = f", {abs(x - (lo if x < lo else hi)) / span:.0%} of the grid's span" if span > 0 else ""
        warnings.warn(
            f"{self.label}: {key} = {x:g} is outside the grid [{lo:g}, {hi:g}] ({far}{rel}); extrapolating "
            f"linearly (warned once per dimension); recalibrate over a wider grid to cover it",
            TableExtrapolationWarning, stacklevel=4)


def check_compatible(table: LatencyTable, model, tensor_parallel: int, block_size: int, data_parallel: int = 1,
                     expert_parallel: int = 1) -> None:
    """A table priced for another model, TP degree or MoE layout gives meaningless times: refuse it.
    A different block size changes attention cost only slightly: warn.

    The MoE layout (issue #27 item 6): a table without ``parallel`` metadata prices TP-sharded
    experts with no all-to-all and one engine's tokens; an MoE scenario with expert parallelism or
    data-parallel attention must use a table made for that layout (its dispatch/combine and its
    DP ranks' tokens in the MoE), and is told the command that makes one."""
    meta, where = table.metadata, table.path
    spec = meta["model"]
    mine = model.to_dict() if hasattr(model, "to_dict") else None
    if mine is not None:
        diff = [k for k in mine if k != "name" and k in spec and spec[k] != mine[k]]
        if diff:
            k = diff[0]
            raise CbsimError(f"latency table {where}: measured for model {spec.get('name')!r} ({k} = {spec[k]!r}) "
                             f"but the scenario's model {mine['name']!r} has {k} = {mine[k]!r}; use a table "
                             f"calibrated for this model (`cbsim calibrate`) or set `model` to the table's")
    if meta["tensor_parallel"] != tensor_parallel:
        raise CbsimError(f"latency table {where}: measured at tensor_parallel {meta['tensor_parallel']} but the "
                         f"scenario has hardware.tensor_parallel {tensor_parallel}; calibrate at that degree")
    _check_layout(meta, where, model, tensor_parallel, data_parallel, expert_parallel)
    if meta["block_size"] != block_size:
        warnings.warn(f"latency table {where}: measured with block_size {meta['block_size']}, used with "
                      f"engine.block_size {block_size}; attention times may be off slightly",
                      UserWarning, stacklevel=3)


def _check_layout(meta: dict, where, model, tp: int, dp: int, ep: int) -> None:
    if not getattr(model, "is_moe", False):
        return  # a dense model's data-parallel ranks are independent engines: the TP table prices each
    par = meta.get("parallel") or {}
    made = (par.get("data_parallel", 1), par.get("expert_parallel", 1))
    if made == (dp, ep):
        return

    def words(d: int, e: int) -> str:
        experts = f"experts over {e} expert-parallel GPUs" if e > 1 else "experts TP-sharded, no all-to-all"
        return f"data_parallel {d}, {experts}"

    flags = f" --data-parallel {dp}" if dp > 1 else ""
    flags += " --expert-parallel" if ep > 1 else ""
    raise CbsimError(f"latency table {where}: made for {words(*made)}, but the scenario runs "
                     f"{words(dp, ep)} (hardware.data_parallel, hardware.expert_parallel); make a table for that "
                     f"layout: cbsim calibrate --from-kernel-db --gpu GPU --model {getattr(model, 'name', 'MODEL')} "
                     f"--tp {tp}{flags} --out DIR")


class _Grid1:
    __slots__ = ("axis", "vals", "n", "owner", "comp", "dim", "lo", "hi")

    def __init__(self, comp, owner: TableLatency) -> None:
        self.axis = list(comp.axes[0])
        self.vals = [float(v) for v in comp.values]
        self.n = len(self.axis)
        self.owner, self.comp, self.dim = owner, comp.name, ALL_COMPONENTS[comp.name][0]
        self.lo, self.hi = self.axis[0], self.axis[-1]

    def __call__(self, x: float) -> float:
        if (x < self.lo or x > self.hi):
            self.owner._outside(self.comp, self.dim, x, self.lo, self.hi)
        i, t = _locate(self.axis, self.n, x)
        if t is None:
            return self.vals[0]
        v0 = self.vals[i]
        return max(v0 + t * (self.vals[i + 1] - v0), 0.0)


class _Grid2:
    __slots__ = ("ax", "ay", "nx", "ny", "vals", "owner", "comp", "dx", "dy")

    def __init__(self, comp, owner: TableLatency) -> None:
        self.ax, self.ay = list(comp.axes[0]), list(comp.axes[1])
        self.nx, self.ny = len(self.ax), len(self.ay)
        self.vals = [[float(v) for v in row] for row in comp.values]
        self.owner, self.comp = owner, comp.name
        self.dx, self.dy = ALL_COMPONENTS[comp.name]

    def __call__(self, x: float, y: float) -> float:
        ax, ay = self.ax, self.ay
        if x < ax[0] or x > ax[-1]:
            self.owner._outside(self.comp, self.dx, x, ax[0], ax[-1])
        if y < ay[0] or y > ay[-1]:
            self.owner._outside(self.comp, self.dy, y, ay[0], ay[-1])
        i, tx = _locate(ax, self.nx, x)
        j, ty = _locate(ay, self.ny, y)
        v = self.vals
        if tx is None and ty is None:
            out = v[0][0]
        elif tx is None:
            out = v[0][j] + ty * (v[0][j + 1] - v[0][j])
        elif ty is None:
            out = v[i][0] + tx * (v[i + 1][0] - v[i][0])
        else:
            a = v[i][j] + ty * (v[i][j + 1] - v[i][j])
            b = v[i + 1][j] + ty * (v[i + 1][j + 1] - v[i + 1][j])
            out = a + tx * (b - a)
        return max(out, 0.0)


def _locate(axis: list[float], n: int, x: float) -> tuple[int, float | None]:
    """(i, t): x = axis[i] + t * (axis[i+1] - axis[i]), with i clamped to the first or last cell so
    that t < 0 or t > 1 extrapolates; t None when the axis has one point (constant)."""
    if n == 1:
        return 0, None
    i = bisect_right(axis, x) - 1
    if i < 0:
        i = 0
    elif i > n - 2:
        i = n - 2
    x0 = axis[i]
    return i, (x - x0) / (axis[i + 1] - x0)


_READ: dict[tuple, LatencyTable] = {}


def read_table_once(path: str | Path) -> LatencyTable:
    """:func:`read_table`, once per table folder as its files stand: a search builds a latency
    model per replica per probe (hundreds of reads of the same folder), and a table is read-only
    once built (its interpolators are made by each :class:`TableLatency`). Keyed by the folder
    and the size and modification time of both files, so a table rewritten meanwhile (a fresh
    ``cbsim calibrate``) is read again."""
    from sim.latency.table_format import METADATA_FILE, TABLE_FILE

    folder = Path(path).resolve()
    try:
        stamp = tuple((f.stat().st_size, f.stat().st_mtime_ns) for f in (folder / TABLE_FILE, folder / METADATA_FILE))
    except OSError:  # missing files: read_table says which, in one line
        return read_table(path)
    key = (str(folder), stamp)
    table = _READ.get(key)
    if table is None:
        table = _READ[key] = read_table(path)
    return table
