"""Steady-state figures: a run's latencies and rates with its warm-up and drain left out.

Why: a finite run starts empty and ends draining. Its first requests find an idle server (short
queues, small batches, fast steps) and its last ones a server that is emptying, so whole-run
percentiles flatter the server, and a short run at a rate the server cannot sustain ends before
its backlog shows. A planner needs the figures of the server *while it carries the load*.

The rule (documented in docs/capacity.md, "Steady state"): with ``first`` and ``last`` the first and
last arrival and ``service`` the median time a finished request spent from admission to its last
token (how long the batch takes to turn over), the **steady window** is

    [first + cut, last − cut),   cut = max(WARMUP_FRACTION × (last − first), service)

and its figures are those of the requests that *arrive* in it: by then the batch has turned over
at least once since the first arrival, and each of them is served while arrivals continue. A
window shorter than ``MIN_WINDOW_TURNOVERS`` turnovers (``service``) or holding fewer than
``MIN_WINDOW_REQUESTS`` requests is *too short* to tell a steady server from one whose queue is
still building: no steady figures (``too_short``; ``requests_in_window`` says how many), and the
planners grow the run (:func:`needed_scale` says by how much).

**Sessions.** A workload of sessions (``workload.sessions``) carries a load set by how many
sessions are alive at once, the session rate times a session's *lifetime* (first turn's arrival to
last turn's end): a run whose sessions all start within one lifetime never reaches that load, and
at a high enough rate it is one burst of ``count`` sessions whatever the rate. So a session run is
also too short while its sessions' starts span fewer than ``MIN_SESSION_LIFETIMES`` median
lifetimes (:func:`session_scale`), and the planners grow the session count until they do.

``offered_rps`` is the arrival rate in the window; ``achieved_rps`` the rate at which requests
(any of them) finished in it. A server that keeps up achieves what is offered; one that cannot
falls behind and achieves its saturated throughput, whatever the offered rate.

:func:`saturated_throughput` is that ceiling, measured on a run where every request arrives at
once: the finish rate over the middle of the finishes (10th to 90th percentile), i.e. without the
first batch's fill and the last one's drain.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

WARMUP_FRACTION = 0.1
MIN_WINDOW_REQUESTS = 200
MIN_WINDOW_TURNOVERS = 10
MIN_SESSION_LIFETIMES = 2.0


def turnover_s(requests: pd.DataFrame) -> float:
    """Median seconds from admission to last token of the finished requests (0 without any)."""
    fin = requests.loc[requests["state"] == "finished", ["finish_s", "admitted_s"]]  # not every column
    service = fin["finish_s"].to_numpy(dtype=float) - fin["admitted_s"].to_numpy(dtype=float)
    service = service[~np.isnan(service)]
    return float(np.median(service)) if service.size else 0.0


def sent_arrivals(requests: pd.DataFrame) -> np.ndarray:
    """The arrival times of the requests that arrived: a closed loop's or a session's request that
    was never sent (the run stopped first) has none (NaN)."""
    arrivals = requests["arrival_s"].to_numpy(dtype=float)
    return arrivals[~np.isnan(arrivals)]


def session_scale(requests: pd.DataFrame) -> float:
    """By how much a run of sessions must grow (its session count, at the same session rate) for its
    sessions' starts to span ``MIN_SESSION_LIFETIMES`` median session lifetimes (module doc); 1.0
    when they do or without sessions."""
    if "session" not in requests:
        return 1.0
    r = requests.loc[requests["session"] >= 0, ["session", "arrival_s", "finish_s"]]
    if r.empty:
        return 1.0
    arrival = r["arrival_s"].to_numpy(dtype=float)
    end = np.fmax(r["finish_s"].to_numpy(dtype=float), arrival)
    frame = pd.DataFrame({"s": r["session"].to_numpy(), "a": arrival, "e": end})
    g = frame.groupby("s")
    starts, ends = g["a"].min().to_numpy(), g["e"].max().to_numpy()
    ok = ~np.isnan(starts)
    if ok.sum() < 2:
        return 2.0
    lifetime = float(np.nanmedian(ends[ok] - starts[ok]))
    span = float(starts[ok].max() - starts[ok].min())
    need = MIN_SESSION_LIFETIMES * lifetime
    return 1.0 if span >= need else (need / span if span > 0 else 2.0)


def needed_scale(requests: pd.DataFrame) -> float:
    """By how much the run (its request count, at the same rate) must grow for its steady window
    to be long enough (1.0 when it is)."""
    if requests.empty:
        return 2.0
    arrivals = sent_arrivals(requests)
    span = float(arrivals.max() - arrivals.min()) if arrivals.size else 0.0
    turnover = turnover_s(requests)
    need_span = (MIN_WINDOW_TURNOVERS + 2) * turnover / (1 - 2 * WARMUP_FRACTION)
    need = max(need_span / span if span > 0 else 2.0,
               (MIN_WINDOW_REQUESTS / (1 - 2 * WARMUP_FRACTION)) / len(requests), session_scale(requests))
    return max(1.0, need)


def steady_window(requests: pd.DataFrame) -> tuple[float, float] | None:
    """``(start_s, end_s)`` of the steady window (module doc); None when it is empty."""
    if requests.empty:
        return None
    arrivals = sent_arrivals(requests)
    if not arrivals.size:
        return None
    first, last = float(arrivals.min()), float(arrivals.max())
    cut = max(WARMUP_FRACTION * (last - first), turnover_s(requests))
    start, end = first + cut, last - cut
    return (start, end) if end > start else None


def saturated_throughput(requests: pd.DataFrame) -> float | None:
    """Finished requests per second between the 10th- and 90th-percentile finish times of a run
    whose requests all arrived at once (module doc); None with too few finishes to tell."""
    finish = np.sort(requests.loc[requests["state"] == "finished", "finish_s"].to_numpy(dtype=float))
    if finish.size < 10:
        return None
    lo, hi = int(0.1 * finish.size), int(0.9 * finish.size)
    span = finish[hi] - finish[lo]
    return float((hi - lo) / span) if span > 0 else None
