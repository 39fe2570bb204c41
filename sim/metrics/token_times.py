"""Token times from runs: every token's time, and exact inter-token-latency statistics.

Why a module of its own: a request's token times are stored as runs of consecutive steps
(``sim.metrics.requests``), not per token, so a million-request run does not hold a float per
token. Expanding runs into times, and computing the ITL mean and percentiles straight from the
runs as a weighted multiset (identical to ``numpy.percentile`` on the full list), is numerics
apart from recording.
"""

from __future__ import annotations

import math

import numpy as np


def token_run_arrays(replicas, records):
    """Arrays over every run of the given records, in order: its first step (an index into
    every replica's steps laid end to end, as :func:`all_end_times`), its length, and per record
    the number of runs."""
    offsets, total = [], 0
    for s in replicas:
        offsets.append(total)
        total += len(s)
    starts, lengths, counts = [], [], []
    for r in records:
        n_runs = 0
        base = offsets[r.replica] if r.steps is not None else 0
        for first, n in r.token_runs():
            starts.append(base + first)
            lengths.append(n)
            n_runs += 1
        counts.append(n_runs)
    return (np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64),
            np.asarray(counts, dtype=np.int64))


def all_end_times(replicas) -> np.ndarray:
    """Every replica's step end times, laid end to end in replica order."""
    if not replicas:
        return np.zeros(0)
    if len(replicas) == 1:
        return replicas[0].end_times()  # a view of the buffer: callers only read it
    return np.concatenate([s.end_times() for s in replicas])


def flat_token_times(replicas, records) -> tuple[np.ndarray, np.ndarray]:
    """Every token time of ``records``, flattened, and each record's token count."""
    starts, lengths, _ = token_run_arrays(replicas, records)
    return flat_times_of_runs(replicas, starts, lengths), np.asarray([r.generated for r in records], dtype=np.int64)


def flat_times_of_runs(replicas, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Every token time of the runs (``token_run_arrays``' first two), flattened in run order."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0)
    # each run's times are one slice of the end times, copied into place: the output is the only
    # token-sized array (an index array laid out by arange + repeat took three more, and fresh
    # pages cost more than the copy: 0.4-0.9 s of the Azure replay's frame on a VM, against
    # about 20 ms for 19k slices)
    ends = all_end_times(replicas)
    out = np.empty(total, dtype=ends.dtype)
    at = 0
    for first, n in zip(starts.tolist(), lengths.tolist()):
        out[at:at + n] = ends[first:first + n]
        at += n
    return out


def times_per_request(replicas, starts: np.ndarray, lengths: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Each request's token times (``token_run_arrays``' three arrays), as an object array: a
    request of one run (nearly all) gets a slice of one read-only copy of the step end times, the
    others their runs joined. Why views: a flattened copy of every token time (4.1 M on the Azure
    replay, 33 MB) cost more in fresh pages than the rest of the frame; the end times are one
    float per step. Read-only because requests decoding in the same steps share those views."""
    ends = all_end_times(replicas)
    if len(replicas) == 1:
        ends = ends.copy()  # the replica's own buffer stays free to grow (a recorder may go on)
    ends.flags.writeable = False
    out = np.empty(len(counts), dtype=object)
    empty = ends[:0]
    run = 0
    first, n = starts.tolist(), lengths.tolist()
    for i, c in enumerate(counts.tolist()):
        if c == 1:
            s = first[run]
            out[i] = ends[s:s + n[run]]
        elif c == 0:
            out[i] = empty
        else:
            joined = np.concatenate([ends[first[j]:first[j] + n[j]] for j in range(run, run + c)])
            joined.flags.writeable = False
            out[i] = joined
        run += c
    return out


def itl_stats_from_runs(replicas, records) -> dict:
    """Mean and percentiles of every gap between consecutive tokens of a request, over
    ``records``, computed from the runs without building the per-token list.

    Within a run, a gap is the difference of two consecutive step end times, so each
    step's gap is counted once per request decoding across it (a weighted multiset);
    gaps across runs are added one by one. Percentiles are order statistics of that
    multiset, interpolated as ``numpy.percentile`` does (its default, linear method), so
    they equal what ``numpy.percentile`` gives on the full list."""
    return itl_stats_of_runs(replicas, *token_run_arrays(replicas, records))


def itl_stats_of_runs(replicas, starts: np.ndarray, lengths: np.ndarray, counts: np.ndarray) -> dict:
    """:func:`itl_stats_from_runs` from the run arrays (``token_run_arrays``, or the request
    table's :meth:`sim.metrics.request_table.RequestTable.token_run_arrays`)."""
    from sim.metrics.summary import PERCENTILES

    ends = all_end_times(replicas)
    n_steps = len(ends)
    weight = np.zeros(n_steps + 1, dtype=np.int64)
    long_runs = lengths > 1
    np.add.at(weight, starts[long_runs], 1)
    np.add.at(weight, starts[long_runs] + lengths[long_runs] - 1, -1)
    weight = np.cumsum(weight, out=weight)[: max(n_steps - 1, 0)]  # in place: one step-sized array fewer
    gaps = np.diff(ends) if n_steps > 1 else np.zeros(0)
    # gaps between the runs of one request: previous run's last token to next run's first (in
    # record order, then run order; zero between the tokens of a speculative step's burst)
    cross = np.zeros(0)
    if (counts > 1).any():
        has_next = np.ones(len(starts), dtype=bool)
        has_next[(np.cumsum(counts) - 1)[counts > 0]] = False  # each record's last run
        j = np.flatnonzero(has_next)
        cross = ends[starts[j + 1]] - ends[starts[j] + lengths[j] - 1]
    keep = weight > 0
    values, weights = gaps[keep], weight[keep]
    if len(cross):  # else no copy of both (fresh pages cost more than the copy)
        values = np.concatenate([values, np.asarray(cross, dtype=np.float64)])
        weights = np.concatenate([weights, np.ones(len(cross), dtype=np.int64)])
    # step-sized temporaries go before the sort's own: a long run's peak memory is here
    del starts, lengths, counts, ends, weight, gaps, cross, keep, long_runs
    return weighted_stats(values, weights, PERCENTILES)


def weighted_stats(values: np.ndarray, weights: np.ndarray, percentiles) -> dict:
    """``sim.metrics.summary.stats`` of a multiset given as distinct-or-not values with integer counts."""
    n = int(weights.sum()) if len(weights) else 0
    if n == 0:
        return {"mean": None, **{f"p{p}": None for p in percentiles}}
    out = {"mean": float(np.dot(values, weights.astype(np.float64)) / n)}
    # any sort will do: equal values are interchangeable, so the k-th smallest element is the
    # same whichever order ties take (the default sort took 17 ms for 500k gaps, "stable" 72)
    order = np.argsort(values)
    v = values[order]
    cum = weights[order]
    del order
    np.cumsum(cum, out=cum)  # in place: one step-sized array fewer at a long run's peak

    def nth(i: int) -> np.float64:  # the i-th smallest element (0-based) of the multiset
        return v[int(np.searchsorted(cum, i, side="right"))]

    for p in percentiles:
        # numpy.percentile, method "linear": virtual index (n - 1) * q, then its _lerp
        q = np.true_divide(p, 100)
        virtual = (n - 1) * q
        lo = math.floor(virtual)
        if virtual >= n - 1:
            out[f"p{p}"] = float(nth(n - 1))
            continue
        a, b = nth(lo), nth(lo + 1)
        gamma = np.float64(virtual - lo)
        diff = b - a
        value = b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma
        out[f"p{p}"] = float(value)
    return out
