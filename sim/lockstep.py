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

**Unequal ranks.** A kernel-db table made for attention DP prices ``linear(T)`` as if every rank
ran T tokens (its experts see T × D). When the ranks ran unequal counts -- one rank prefilling a
prompt beside the others' decodes -- the experts see the group's tokens, Σ T_r, not D × max T_r:
TensorRT-LLM's ``DeepseekV3MoE.compute_routed_output`` leaves ``use_dp_padding`` off on Hopper
(the CUTLASS backend all-gathers and reduce-scatters each rank's own count,
``sizes=all_rank_num_tokens``; tensorrt_llm/_torch/models/modeling_deepseekv3.py), and its CUDA
graphs, which would pad, run only when every rank is generation-only at the same batch size
(``_maybe_get_cuda_graph``: ``is_all_gen_only`` and ``all_batch_size_equal``,
tensorrt_llm/_torch/pyexecutor/model_engine.py). So when the ranks' latency has a ``moe_group``
term (table_format), each rank's price has its own ``moe_group(T_r)`` replaced by the group's,
``moe_group(Σ T_r / D)``, and the step is the slowest of those: the ranks' attention and dense
layers on their own tokens, the experts once over everyone's. Equal ranks are priced as before.

**Balance.** When the ranks' policy has a balance rule (``adp_balance()``: TensorRT-LLM's
``attention_dp_config.enable_balance``, :class:`policies.trtllm.AdpBalance`), each iteration runs
as ``PyExecutor._schedule`` does: every rank with work proposes its scheduler's output
(``propose()``: its context and generation requests, nothing allocated), a rank with none counts
one generation request (``_pad_attention_dp_dummy_request``), the rule decides from all of them
whether the contexts run, and if not every rank drops its contexts for this iteration
(``hold_contexts()``) before it schedules. Without a rule nothing changes.

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
        self.balance = ranks[0].policy.adp_balance()  # the module docstring, "Balance"
        for rank in ranks:
            rank.policy.join_lockstep([r.policy for r in ranks])
        self.process = env.process(self.loop())

    def balance_contexts(self) -> None:
        """Every rank's proposal to the balance rule; the contexts held on every rank if it says so."""
        counts, proposed = [], []
        for rank in self.ranks:
            policy = rank.policy
            if policy.has_work():
                counts.append(policy.propose())
                proposed.append(policy)
            else:
                counts.append((0, 1))  # an idle rank's dummy generation request
        if not self.balance.release(counts):
            for policy in proposed:
                policy.hold_contexts()

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
            if self.balance is not None:
                self.balance_contexts()
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
            stepping = {id(rank) for rank, _ in planned}
            for rank in ranks:
                if id(rank) not in stepping:
                    rank.policy.idle_iteration()
            dt = self.step_seconds(planned)
            for rank, _ in planned:
                rank.busy_until = start + dt
            yield env.timeout(dt)
            now = env.now
            for rank, item in planned:
                rank.finish_planned(item, start, now, dt)

    def step_seconds(self, planned: list) -> float:
        """The group's step: the slowest rank's price, each with the experts over the group's tokens
        (the module docstring, "Unequal ranks") when its latency separates them (``moe_group``)."""
        moe = getattr(getattr(planned[0][0], "latency", None), "moe_group", None)
        if moe is None:
            return max(item[0] for _, item in planned)
        tokens = [item[2].num_tokens for _, item in planned]
        mean = sum(tokens) / len(self.ranks)
        group = moe(mean) if mean > 0 else 0.0
        slowest = 0.0
        for (_, item), t in zip(planned, tokens):
            dt = item[0]
            if t != mean:
                dt += group - (moe(t) if t > 0 else 0.0)
            if dt > slowest:
                slowest = dt
        return slowest
