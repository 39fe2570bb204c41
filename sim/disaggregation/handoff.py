"""What one request carries from the prefill pool to the decode pool, and how each pool's policy
takes part without learning that it is disaggregated.

The hand-off, as a real engine pair does it (vLLM's KV connectors, DistServe, Splitwise):

* **Prefill side.** The request is submitted with ``max_tokens = 1`` (what vLLM's disaggregation
  proxy sends to the prefill instance), so the engine ends it after its first token. Its KV blocks
  must outlive that end: they are the data to transfer. A KV connector delays freeing them
  (vLLM: ``delay_free_blocks`` until ``finished_sending``); here :class:`HandOffPolicy` takes one
  extra reference on each of the request's blocks in the policy's own block pool just before the
  policy frees them (:func:`pin_blocks`), and the topology drops it when the transfer has landed
  (:func:`unpin_blocks`). The policy frees the request exactly as it always does; the blocks stay
  in use (and count in ``kv_blocks_used``, so the prefill instance's admission feels a slow link)
  until the transfer ends.
* **Decode side.** The request arrives with its prompt's KV already computed: it is handed to the
  decode policy's ordinary ``add_request`` with ``num_computed_tokens = prompt_tokens`` and one
  output token emitted (:class:`HandedOffRecord`), which is how a KV connector's *external computed
  tokens* enter vLLM's scheduler (``num_external_computed_tokens``). The policy admits it through
  its normal admission: it allocates blocks for the prompt plus the next token (the transferred KV
  and room for decoding) before its first decode step, may keep it waiting when memory is short,
  and rejects it if it can never fit. Its first step on the decode instance is a one-token decode
  over the transferred context. A decode-side preemption recomputes locally, as in vLLM.

The policy side therefore needs one thing: a paged KV manager whose pool can take an extra
reference on a block (``policy.kv.pool``, as vllm-v1 has); the scenario refuses other policies
for a pool.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from sim.metrics.requests import RequestRecord


def pin_blocks(policy, req) -> list[int]:
    """Take one extra reference on every KV block ``req`` holds in ``policy``'s pool (head first);
    the blocks stay allocated after the policy frees the request, until :func:`unpin_blocks`."""
    kv = policy.kv
    blocks = kv.blocks_of(req)
    kv.pool.touch(blocks)
    return blocks


def unpin_blocks(policy, blocks: list[int]) -> None:
    """Drop the references :func:`pin_blocks` took, tail first (the order a request frees them)."""
    policy.kv.pool.free_blocks(reversed(blocks))


class HandOffPolicy:
    """A pool instance's policy as the engine loop sees it: the policy itself, plus two hooks in
    ``finish_step``. ``on_finished(finished)`` runs before the policy frees the finished requests
    (the prefill pool pins their blocks there); ``after_step(finished)`` after every step's
    ``finish_step`` (the decode pool re-checks room for waiting transfers there). Everything else
    is the wrapped policy's own attribute."""

    def __init__(self, inner, on_finished: Callable | None = None, after_step: Callable | None = None):
        self.inner = inner
        self.on_finished = on_finished
        self.after_step = after_step
        # the engine's hot path calls these every step: bound once, not looked up through __getattr__
        for name in ("schedule", "has_work", "add_request", "kv_blocks_used", "kv_blocks_total",
                     "kv_tokens_reserved_and_used", "cpu_blocks_used", "drain", "decode_stretch_limit",
                     "advance_decodes"):
            setattr(self, name, getattr(inner, name))

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def decode_stretch(self):
        # defined on the class: the engine checks type(policy).decode_stretch for fast-forward
        return self.inner.decode_stretch()

    def finish_step(self, plan, finished) -> None:
        if finished and self.on_finished is not None:
            self.on_finished(finished)
        self.inner.finish_step(plan, finished)
        if self.after_step is not None:
            self.after_step(finished)


class Handoff:
    """One request's journey: its record on the prefill instance, its record on the decode
    instance, and the times in between (NaN: did not happen)."""

    __slots__ = ("spec", "prefill", "decode", "prefill_replica", "decode_replica", "blocks", "decode_blocks",
                 "bytes", "prefilled_s", "room_s", "transfer_start_s", "landed_s", "promised", "finish_at")

    def __init__(self, spec, prefill_spec, decode_max_model_len: int) -> None:
        self.spec = spec
        self.prefill = RequestRecord(prefill_spec)
        self.decode = HandedOffRecord(spec, self)
        self.prefill_replica = -1
        self.decode_replica = -1  # index within the decode pool
        self.blocks: list[int] | None = None  # pinned on the prefill instance until the transfer lands
        self.decode_blocks = 0  # blocks the decode instance allocates when it admits the request
        self.bytes = 0
        nan = math.nan
        self.prefilled_s = nan  # first token emitted on the prefill instance
        self.room_s = nan  # the decode instance had room for it
        self.transfer_start_s = nan  # the link was free
        self.landed_s = nan  # the KV is on the decode instance, the prefill blocks are freed
        self.promised = False  # its decode blocks are counted as promised on the decode instance
        # tokens that end the request on the decode side (the engine's end test, RequestRecord.open)
        self.finish_at = min(spec.output_tokens, spec.max_tokens, decode_max_model_len - spec.prompt_tokens)

    @property
    def handed_off(self) -> bool:
        return self.blocks is not None


class HandedOffRecord(RequestRecord):
    """The decode-side record of a request whose prompt KV arrived from a prefill instance.

    :meth:`open` gives the decode policy a request with the prompt computed and the first token
    emitted; this record's token-time runs then hold the decode-side tokens only (token 1 on), the
    first token's time being the prefill record's. ``on_admitted`` tells the topology when the
    decode policy has allocated the request's blocks."""

    __slots__ = ("handoff", "on_admitted")

    def __init__(self, spec, handoff: Handoff) -> None:
        super().__init__(spec)
        self.handoff = handoff
        self.on_admitted: Callable | None = None

    def open(self, seq, max_model_len, replica=0, steps=None):
        req = super().open(seq, max_model_len, replica, steps)
        req.num_computed_tokens = req.prompt_tokens  # the transferred KV: external computed tokens
        req.num_output_tokens = 1  # emitted by the prefill instance
        self.run_tok = 1  # this record's runs start at token 1 ...
        self.run_step = -1  # ... at a step not known yet (see break_run)
        return req

    def break_run(self, step: int, token: int) -> None:
        if token == self.run_tok:  # the first decode-side token opens the first run: nothing to close
            self.run_step = step
            return
        super().break_run(step, token)

    def mark_admitted(self, now: float) -> None:
        first = self.admitted_s != self.admitted_s
        super().mark_admitted(now)
        if first and self.on_admitted is not None:
            self.on_admitted(self)
