"""The table of a DeepSeek-style model's multi-token-prediction layer, composed from the kernel
database (``cbsim calibrate --from-kernel-db --draft mtp``), for ``speculative.draft_table``.

What the MTP drafter runs (DeepSeek-V3 technical report, section 2.2; the engines load it as a
one-layer draft model: SGLang ``python/sglang/srt/models/deepseek_nextn.py``
``DeepseekModelNextN``, vLLM ``vllm/model_executor/models/deepseek_mtp.py``
``DeepSeekMultiTokenPredictorLayer``, TensorRT-LLM ``tensorrt_llm/_torch/models/
modeling_deepseekv3.py`` ``DeepseekV3MTP``): the token's embedding and the target's last hidden
state, each RMS-normed (``enorm``, ``hnorm``), concatenated and projected back to the model's width
(``eh_proj``, ``2·hidden -> hidden``), then **one decoder layer of the target's own architecture**
(MLA attention and the MoE with its shared and routed experts: the layer at index
``num_hidden_layers`` in the checkpoint, an MoE layer since it is past ``first_k_dense_replace``),
then the target's final norm and LM head (``shared_head``).

So the table is the target's composition (:func:`calib.sources.kernel_db_moe.compose_source`, the
same ``mla``/``mla_bmm``/``moe`` rows, quantization, layout and communication rows) for a config.json
that is the target's with one hidden layer, no dense first layers and no MTP layer of its own: its
spec is ``sim.speculative.draft_cost.draft_spec("mtp", target)``, which is what the scenario's
drafter checks the table against. ``eh_proj`` is no layer of such a config: the drafter prices it
on the roofline, as it does the input projection of an EAGLE head (``DraftCost``).
"""

from __future__ import annotations

from calib.sources.kernel_db import ModelSource
from sim.errors import CbsimError


def mtp_source(target: ModelSource) -> ModelSource:
    """The MTP layer of ``target`` as a model AIConfigurator compiles: the target's config.json with
    one MoE decoder layer (``num_hidden_layers`` 1, ``first_k_dense_replace`` 0) and no MTP layer."""
    from sim.speculative.draft_cost import draft_spec

    spec = target.spec
    if not getattr(spec, "mtp_layers", 0):
        raise CbsimError(
            f"--draft mtp: {spec.name!r} ships no multi-token-prediction layer (its config.json's "
            f"num_nextn_predict_layers is 0); use --draft eagle or eagle3, or a draft model's own table"
        )
    if not getattr(spec, "is_mla", False):
        raise CbsimError(
            f"--draft mtp composes DeepSeek-style MTP layers (MLA + MoE); {spec.name!r} is not an MLA "
            f"model, so its drafter stays on the roofline (drop speculative.draft_table)"
        )
    config = dict(target.config)
    config.update(num_hidden_layers=1, first_k_dense_replace=0, num_nextn_predict_layers=0)
    return ModelSource(draft_spec("mtp", spec), config, f"the MTP layer of {target.origin}")


def build_table(
    model: str,
    gpu: str,
    layout,
    *,
    dtype: str | None = None,
    engine: str = "vllm",
    engine_version: str | None = None,
    block_size: int = 64,
    max_num_batched_tokens: int = 16384,
    max_model_len: int = 32768,
    max_num_seqs: int = 1024,
):
    """The MTP layer's table for ``layout`` (a :class:`calib.sources.kernel_db_moe.Layout`)."""
    from calib.sources import kernel_db_moe
    from calib.sources.kernel_db import require_aiconfigurator, resolve_model

    require_aiconfigurator()
    target = resolve_model(model)
    if dtype is None:  # the checkpoint's own, as the target's table
        dtype = "fp8" if getattr(target.spec, "quantization", None) == "fp8" else "bf16"
    comp = kernel_db_moe.compose_source(
        mtp_source(target),
        gpu,
        layout,
        dtype=dtype,
        engine=engine,
        engine_version=engine_version,
        block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
    )
    prov = comp.table.metadata.setdefault("provenance", {})
    prov["draft"] = (
        "mtp: one MLA + MoE decoder layer of the target and its LM head (the checkpoint's "
        "num_nextn_predict_layers layer); eh_proj (2·hidden -> hidden) is priced by the drafter on "
        "the roofline"
    )
    return comp
