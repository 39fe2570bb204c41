"""Data-parallel ranks of one MoE engine stepping together (``hardware.data_parallel`` > 1 on an MoE model).

Why: with data-parallel attention each rank has its own scheduler and KV cache, but the experts
are one layer over every rank: in each MoE layer the ranks' tokens are dispatched to the experts
and combined back (all-to-all under expert parallelism, one tensor-parallel group over all ranks
without it), so no rank can start its next step before every rank has finished this one. vLLM:
"For MoE models, when any requests are in progress in any rank, we must ensure that empty
'dummy' forward passes are performed in all ranks which don't currently have any requests
scheduled", and the ranks synchronize every step (docs/serving/data_parallel_deployment.md;
``DPEngineCoreProc``, vllm/v1/engine/core.py, runs a dummy batch when its rank is idle while the
group's wave is running). SGLang's DP attention does the same (a ``dp_attention`` idle batch).

So a group's step: every rank with work schedules its own plan; the step lasts as long as the
slowest rank's (each rank priced on its own tokens: the latency backends already count every
rank's tokens in the experts); every rank emits its tokens when the step ends. A rank with
nothing to run idles that step (its dummy forward is not recorded: it emits nothing). Dense
models' data-parallel ranks stay independent engines (no collective between them).

Fast-forward is off for the ranks of a group (a stretch of one rank would run ahead of the
others); each rank records its own steps, with the group's step time.
"""

from __future__ import annotations


class LockstepGroup:
    """Runs the step loop of ``ranks`` (``sim.engine.Replica`` objects built with ``start=False``)."""

    def __init__(self, env, ranks: list) -> None:
        self.env, self.ranks = env, ranks
        self.wake = env.event()
        for rank in ranks:
            rank.group = self
            rank.fast_forward = False
        self.process = env.process(self.loop())

    def kick(self) -> None:
        if not self.wake.triggered:
            self.wake.succeed()

    def loop(self):
        env, ranks = self.env, self.ranks
        while True:
            if not any(r.policy.has_work() for r in ranks):
                if all(r.arrivals_done for r in ranks):
                    return
                self.wake = env.event()
                yield self.wake
                continue
            start = env.now
            planned, retry = [], False
            for rank in ranks:
                item, again = rank.plan_step(start)
                retry = retry or again
                if item is not None:
                    planned.append((rank, item))
            if not planned:
                if retry:
                    continue  # a policy freed memory without running anything: schedule again
                if all(r.arrivals_done for r in ranks):
                    return
                self.wake = env.event()
                yield self.wake
                continue
            dt = max(item[0] for _, item in planned)
            for rank, _ in planned:
                rank.busy_until = start + dt
            yield env.timeout(dt)
            now = env.now
            for rank, item in planned:
                rank.finish_planned(item, start, now, dt)
