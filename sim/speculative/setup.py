"""From a policy entry's ``speculative`` section to what a run needs: the policy switched to
speculative scheduling, the latency model with the drafter's cost, and the acceptance draws.

Why a module of its own: the runner builds replicas for many kinds of runs (sweeps, capacity
search, plans); keeping the one place that reads the section here leaves the runner a single call.

KV memory: vLLM loads the drafter's weights before it profiles memory and gives its attention
layers KV blocks beside the target's (an EAGLE head's layer joins the KV cache groups, so one
block holds every layer's keys and values). :meth:`Speculation.limits` takes both out of the
pool: ``(available - draft weights) // (target block + draft block)`` blocks, less the null
block, where ``available`` is what the target's pool was computed from. A pinned
``engine.num_gpu_blocks`` is kept as given.

SGLang and TensorRT-LLM size their pools their own way (``sim.hardware.engine_memory``,
``sim.hardware.trtllm_kv``); the drafter comes out of that pool: ``(pool bytes - draft weights)
// (target block + draft block)``. SGLang loads the draft model inside ``mem_fraction_static`` and
gives it a KV pool of the target's size (the draft worker shares the target's token-to-KV
allocator); TensorRT-LLM loads it before measuring the free memory, of which the KV cache takes
``free_gpu_memory_fraction`` (so that fraction of the draft's weights), and the one-model
EAGLE-3/MTP layers sit in the target's KV cache. SGLang also resets an unset
``max_running_requests`` to 48 when speculating (``server_args.py`` ``_handle_speculative_decoding``):
applied here when neither the ``max_running_requests`` knob nor ``engine.max_num_seqs`` is given.
"""


from __future__ import annotations

from dataclasses import dataclass, replace

from sim.speculative.acceptance import Acceptance, conditional_rates
from sim.speculative.draft_cost import DraftCost, SpeculativeLatency

SGLANG_SPEC_MAX_RUNNING = 48  # server_args.py _handle_speculative_decoding

# vLLM Scheduler.__init__ (vllm/v1/core/sched/scheduler.py): num_lookahead_tokens = num_spec_tokens
# when speculative_config.use_eagle() (eagle, eagle3, mtp) or uses_draft_model(); 0 for n-gram
LOOKAHEAD_METHODS = ("eagle", "eagle3", "mtp", "draft")


@dataclass
class Speculation:
    cfg: object  # sim.scenario.schema.Speculative
    acceptance: Acceptance
    draft: DraftCost | None
    policy: str = "vllm-v1"  # the entry's policy name
    knobs: dict | None = None  # the entry's knobs

    @property
    def k(self) -> int:
        return self.cfg.num_speculative_tokens

    @property
    def lookahead(self) -> int:
        return self.k if self.cfg.method in LOOKAHEAD_METHODS else 0

    def enable(self, policy) -> None:
        policy.enable_speculation(self.k, self.lookahead)

    def wrap(self, latency):
        return SpeculativeLatency(latency, self.draft)

    def limits(self, limits, dep):
        """``limits`` with the drafter's weights and KV taken out of the GPU block pool."""
        from sim.hardware.kv_capacity import block_bytes, expert_parallel, moe_tensor_parallel, reserve_bytes

        scn = dep.scenario
        from policies.registry import POLICIES

        sizing = getattr(POLICIES.get(self.policy), "kv_sizing", "vllm")
        knobs = self.knobs or {}
        if (self.policy == "sglang" and scn.engine.max_num_seqs is None
                and knobs.get("max_running_requests") is None):
            limits = replace(limits, max_num_seqs=SGLANG_SPEC_MAX_RUNNING)
        if self.draft is None or self.draft.roof is None or scn.engine.num_gpu_blocks is not None:
            return limits
        if sizing in ("sglang", "trtllm"):
            return self._own_pool_limits(limits, dep, sizing, knobs)
        hw, eng, tp, model = scn.hardware, scn.engine, dep.tensor_parallel, dep.model
        available = (
            dep.gpu.memory_bytes * hw.gpu_memory_utilization
            - model.weight_bytes(tp, expert_parallel(hw), moe_tensor_parallel(hw))
            - reserve_bytes(model, hw, tp, limits.max_num_batched_tokens, limits.max_num_seqs)
        )
        draft = self.draft
        per_block = block_bytes(model, eng.block_size, tp, eng.max_model_len) + block_bytes(
            draft.spec, eng.block_size, tp, eng.max_model_len
        )
        blocks = int((available - draft.weight_bytes) // per_block) - 1
        if blocks * eng.block_size < eng.max_model_len:
            from sim.errors import CbsimError

            raise CbsimError(
                f"with the {self.cfg.method} drafter's weights and KV, the KV cache holds {blocks} "
                f"blocks, fewer than engine.max_model_len ({eng.max_model_len}) needs: lower "
                f"engine.max_model_len or pin engine.num_gpu_blocks"
            )
        return replace(limits, num_gpu_blocks=min(blocks, limits.num_gpu_blocks))

    def _own_pool_limits(self, limits, dep, sizing: str, knobs: dict):
        """SGLang's / TensorRT-LLM's pool less the drafter's weights, shared with the draft's KV."""
        from sim.hardware.kv_capacity import block_bytes

        tp, bs, mml = dep.tensor_parallel, limits.block_size, limits.max_model_len
        target = block_bytes(dep.model, bs, tp, mml)
        share = float(knobs.get("free_gpu_memory_fraction", 0.9)) if sizing == "trtllm" else 1.0
        pool = limits.num_gpu_blocks * target - share * self.draft.weight_bytes
        blocks = int(pool // (target + block_bytes(self.draft.spec, bs, tp, mml)))
        if blocks * bs < mml:
            from sim.errors import CbsimError

            raise CbsimError(
                f"with the {self.cfg.method} drafter's weights and KV, the {self.policy} KV pool holds "
                f"{max(blocks, 0) * bs} tokens, fewer than engine.max_model_len ({mml}) needs: lower "
                f"engine.max_model_len or pin engine.num_gpu_blocks"
            )
        return replace(limits, num_gpu_blocks=min(blocks, limits.num_gpu_blocks))


def speculation_for(dep, entry) -> Speculation | None:
    """The entry's speculation on this deployment, or None when it has no ``speculative`` section."""
    cfg = getattr(entry, "speculative", None)
    if cfg is None:
        return None
    from sim.hardware.models import get_model

    if cfg.method == "mtp" and getattr(dep.model, "is_mla", False) and not dep.model.mtp_layers:
        from sim.errors import CbsimError

        raise CbsimError(f"speculative.method: mtp, but {dep.model.name!r} ships no multi-token-prediction layer "
                         f"(its config.json's num_nextn_predict_layers is 0); use eagle, eagle3, ngram or a draft model")
    acc = cfg.acceptance
    k = cfg.num_speculative_tokens
    rates = conditional_rates(k, acc.rate, acc.per_position, acc.mean_length)
    scn = dep.scenario
    draft = None
    if scn.latency.backend != "constant":  # a constant step_s is the whole step, drafting included
        lat = scn.latency
        draft = DraftCost(
            cfg.method,
            k,
            dep.model,
            dep.gpu,
            dep.tensor_parallel,
            dep.block_size,
            draft_model=get_model(cfg.draft_model) if cfg.draft_model is not None else None,
            draft_vocab_size=cfg.draft_vocab_size,
            propose_s_per_request=cfg.propose_s_per_request,
            compute_efficiency=getattr(lat, "compute_efficiency", None),
            memory_efficiency=getattr(lat, "memory_efficiency", None),
        )
    if cfg.draft_table is not None:
        if scn.latency.backend != "table":
            from sim.errors import CbsimError

            raise CbsimError(f"speculative.draft_table prices the drafter on latency.backend table, not "
                             f"{scn.latency.backend!r}; drop draft_table (the {scn.latency.backend} backend prices "
                             f"the drafter from its spec) or use latency.backend: table")
        from pathlib import Path

        from sim.latency.shipped import shipped_table_names, shipped_table_path
        from sim.latency.table import TableLatency

        path = cfg.draft_table
        if not Path(path).exists() and path in shipped_table_names():  # a shipped table by name
            path = shipped_table_path(path, "speculative.draft_table")
        from sim.hardware.kv_capacity import expert_parallel

        # an MTP layer is an MoE layer: its table is made for the scenario's layout, as the target's
        draft.use_table(TableLatency.from_path(path, draft.spec, dep.gpu, dep.tensor_parallel, dep.block_size,
                                               data_parallel=dep.data_parallel,
                                               expert_parallel=expert_parallel(scn.hardware)))
    return Speculation(cfg, Acceptance(rates, scn.seed), draft, entry.name,
                       entry.knobs() if hasattr(entry, "knobs") else {})
