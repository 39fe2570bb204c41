"""The drafter's time on the clock: what proposing the next step's draft tokens costs.

Why a module of its own: the target's step (verification included) is priced by the scenario's
latency backend; the drafter is another model (or a CPU search) that runs after the target's
forward pass in the same step, so its cost is added to that step. It is priced from the draft's
own spec with the roofline (the latency tables measure the target only), on every backend but
``constant``, whose ``step_s`` is the whole step by definition.

What runs, per step, for the requests the step completes (they sampled a token, so the drafter
proposes for them):

* ``eagle`` / ``eagle3`` / ``draft`` (vLLM ``vllm/v1/spec_decode/eagle.py`` ``EagleProposer.propose``,
  which the draft-model proposer shares): a first forward pass over every token of the step (the
  draft keeps its own KV of the same positions), then ``k - 1`` passes of one token per
  proposing request (``for _ in range(self.num_speculative_tokens - 1)``), each with its LM head.
  An EAGLE head is one decoder layer at the target's width with an input projection of the
  target's hidden states (``2·hidden -> hidden`` for EAGLE, ``3·hidden -> hidden`` for EAGLE-3,
  which fuses three of the target's layers) and an LM head (EAGLE shares the target's vocabulary;
  EAGLE-3 heads predict a reduced one, 32,000 tokens for the published Llama-3.1-8B head
  ``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B``, ``draft_vocab_size``). A draft model is its own spec.
* ``mtp``: one more layer of the target's own architecture (a MoE layer for a MoE model) with a
  ``2·hidden -> hidden`` projection and the target's LM head, run ``k`` times as EAGLE runs.
* ``ngram`` (vLLM ``vllm/v1/spec_decode/ngram_proposer.py``): a search of the request's own tokens
  on the CPU, ``propose_s_per_request`` seconds per proposing request, no GPU work.

Each draft pass is charged its operators' roofline time (no fixed per-step overhead of its own:
the step's overhead already covers the host work). With ``speculative.draft_table`` (a latency
table of the drafter's own shapes, e.g. composed from AIConfigurator's kernel database by
``cbsim calibrate --from-kernel-db --draft eagle3``) the passes are priced from that table instead:
the first pass as a step of the same rows (verifications as decode rows of their context, as the
target's table prices them), the ``k - 1`` one-token passes as decode steps, each the sum of the
table's components without its ``overhead``, ``step_gap`` and ``engine_cpu`` (the target's step
carries those). The input projection, which no Llama-shaped config has, stays on the roofline.
The draft's weights and KV come out of the KV pool (``sim.speculative.setup``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from sim.latency.base import StepShape, step_shape
from sim.latency.roofline import COMPUTE_EFFICIENCY, MEMORY_EFFICIENCY, RooflineLatency

EAGLE3_DRAFT_VOCAB = 32000  # yuhuili/EAGLE3-LLaMA3.1-Instruct-8B config.json draft_vocab_size
FC_INPUTS = {"eagle": 2, "eagle3": 3, "mtp": 2, "draft": 0}  # hidden states the input projection fuses
NGRAM_S_PER_REQUEST = 10e-6  # an assumption, not a measurement: override with propose_s_per_request


def draft_spec(method: str, target, draft_model=None, draft_vocab_size: int | None = None):
    """The model the drafter runs: an EAGLE/MTP head built from the target, or the draft model."""
    if method == "draft":
        return draft_model
    vocab = draft_vocab_size or (EAGLE3_DRAFT_VOCAB if method == "eagle3" else target.vocab_size)
    head = replace(
        target,
        name=f"{target.name}-{method}-head",
        num_layers=1,
        vocab_size=vocab,
        sliding_window=0,
        num_sliding_layers=0,
        tied_embeddings=False,
        first_k_dense_layers=0,  # DeepSeek's MTP layer is an MoE layer (MLA + experts)
        mtp_layers=0,
    )
    if method != "mtp" and head.num_experts:  # an EAGLE head is a dense layer
        head = replace(
            head,
            num_experts=0,
            num_experts_per_tok=0,
            moe_intermediate_size=0,
            shared_expert_intermediate_size=0,
            expert_quantization=None,
        )
    return head


class DraftCost:
    """Prices the drafter's work of one step: ``price(plan, shape) -> (seconds, FLOPs, bytes)``."""

    def __init__(
        self,
        method: str,
        k: int,
        target,
        gpu,
        tensor_parallel: int,
        block_size: int,
        draft_model=None,
        draft_vocab_size: int | None = None,
        propose_s_per_request: float | None = None,
        compute_efficiency: float | None = None,
        memory_efficiency: float | None = None,
    ) -> None:
        self.method, self.k = method, k
        self.cpu_s = (
            (propose_s_per_request if propose_s_per_request is not None else NGRAM_S_PER_REQUEST)
            if method == "ngram"
            else 0.0
        )
        self.roof = None
        if method == "ngram":
            return
        self.spec = draft_spec(method, target, draft_model, draft_vocab_size)
        self.roof = RooflineLatency(
            self.spec,
            gpu,
            tensor_parallel,
            block_size,
            compute_efficiency=compute_efficiency or COMPUTE_EFFICIENCY,
            memory_efficiency=memory_efficiency or MEMORY_EFFICIENCY,
            overhead_s=0.0,
        )
        fc = FC_INPUTS[method]
        h, a = target.hidden_size, target.dtype_bytes
        # the input projection (fc_in·hidden -> hidden, sharded by TP), once per token of the first pass
        self._fc_flops = 2.0 * fc * h * h / tensor_parallel
        self._fc_bytes = fc * h * h * a / tensor_parallel
        self._fc_act = (fc + 1) * h * a
        # what the drafter holds in GPU memory: its spec's weights and the input projection
        self.weight_bytes = self.spec.weight_bytes(tensor_parallel) + self._fc_bytes
        self.table = None

    def use_table(self, table) -> None:
        """Price the draft passes from ``table`` (a ``sim.latency.table.TableLatency`` of the
        drafter's shapes) instead of the roofline; the input projection stays on the roofline."""
        table._fixed = 0.0  # overhead and step_gap: the target's step has them
        table._cpu = None  # and the engine's CPU time
        self.table = table

    def price(self, plan, shape: StepShape | None = None) -> tuple[float, float, float]:
        proposing = [
            r for r in plan.scheduled if r.num_computed_tokens >= r.prompt_tokens + r.num_output_tokens
        ]
        b = len(proposing)
        if not b:
            return 0.0, 0.0, 0.0
        if self.roof is None:  # n-gram: CPU only
            return self.cpu_s * b, 0.0, 0.0
        roof = self.roof
        first = shape if shape is not None else step_shape(plan)
        first = replace(first, spec_tokens=0)  # the draft samples one position per sequence
        steps = self.table if self.table is not None else roof
        t, flops, bytes_ = steps.price(first, plan if self.table is not None else None)
        n = first.num_tokens
        if self._fc_flops:
            of, ob = self._fc_flops * n, self._fc_bytes + self._fc_act * n
            t += max(of / roof.linear_rate, ob / roof.memory_rate)
            flops += of
            bytes_ += ob
        if self.k > 1:
            context = sum(r.num_computed_tokens for r in proposing)
            if steps.price_decodes is not None:
                dts, fs, bs = steps.price_decodes(b, context, self.k - 1)
            else:
                rows = [
                    steps.price(
                        StepShape(
                            num_tokens=b,
                            num_seqs=b,
                            prefill_tokens=0,
                            decode_tokens=b,
                            prefill_attn=0.0,
                            decode_ctx=context + b * j,
                            kv_tokens_read=context + b * j,
                        ),
                        None,
                    )
                    for j in range(1, self.k)
                ]
                dts, fs, bs = (np.array(col) for col in zip(*rows))
            t += float(np.sum(dts))
            flops += float(np.sum(fs))
            bytes_ += float(np.sum(bs))
        return t + self.cpu_s * b, flops, bytes_


class SpeculativeLatency:
    """The scenario's latency model with the drafter's cost added to every speculative step.

    Everything else (``swap_time``, ``recompute_flops``, ``name``, ...) is the wrapped model's."""

    def __init__(self, inner, draft: DraftCost | None) -> None:
        self.inner = inner
        self.draft = draft
        self.name = inner.name

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def price(self, shape, plan=None):
        dt, flops, bytes_ = self.inner.price(shape, plan)
        if self.draft is None or plan is None or plan.spec_tokens is None:
            return dt, flops, bytes_
        ddt, dflops, dbytes = self.draft.price(plan, shape)
        return dt + ddt, flops + dflops, bytes_ + dbytes
