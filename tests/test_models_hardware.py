"""Model and GPU specs, and the KV block count computed the way vLLM computes it."""

from __future__ import annotations

import pytest

from sim.errors import CbsimError
from sim.hardware.gpus import GPUS, get_gpu
from sim.hardware.kv_capacity import num_cpu_blocks, num_gpu_blocks
from sim.hardware.models import MODELS, ModelSpec, get_model
from sim.scenario.resolved import resolve
from sim.scenario.schema import Hardware, load_scenario


# --- models --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,params", [
    # parameter counts the checkpoints publish (safetensors metadata / model cards)
    ("llama-3-8b", 8_030_261_248),
    ("llama-3-70b", 70_553_706_496),
    ("llama-2-7b", 6_738_415_616),
    ("mistral-7b", 7_241_732_096),
    ("qwen2.5-7b", 7_615_616_512 - 28 * 4608),  # published count minus its q/k/v biases
])
def test_parameter_counts_match_the_published_checkpoints(name, params):
    assert MODELS[name].num_params() == params


def test_tiny_is_the_reference_runs_model():
    m = get_model("tiny")
    assert (m.hidden_size, m.intermediate_size, m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim,
            m.vocab_size, m.dtype, m.tied_embeddings) == (256, 688, 4, 4, 4, 64, 1000, "fp32", False)
    assert m.dtype_bytes == 4
    assert m.kv_bytes_per_token() == 2 * 4 * 64 * 4 * 4


def test_kv_bytes_and_weights_per_gpu():
    m = get_model("llama-3-8b")
    assert m.kv_bytes_per_token() == 2 * 8 * 128 * 2 * 32 == 131_072
    assert m.kv_bytes_per_token(2) == 65_536 and m.kv_bytes_per_token(8) == 16_384
    assert m.weight_bytes() == 2 * 8_030_261_248
    # TP shards everything but the norms: 2 ranks hold just over half each
    norms = (2 * 32 + 1) * 4096 * 2
    assert m.weight_bytes(2) == (m.weight_bytes() - norms) // 2 + norms


def test_kv_heads_are_replicated_when_fewer_than_gpus():
    m = get_model("llama-3-70b")  # 8 KV heads
    assert m.kv_heads_per_rank(8) == 1 and m.kv_heads_per_rank(16) == 1
    assert m.kv_bytes_per_token(16) == m.kv_bytes_per_token(8) == 2 * 1 * 128 * 2 * 80
    with pytest.raises(CbsimError, match="does not divide its 64 attention heads"):
        m.kv_heads_per_rank(3)
    q = get_model("qwen2.5-7b")  # 28 heads, 4 KV heads
    assert q.kv_heads_per_rank(4) == 1
    with pytest.raises(CbsimError, match="neither a divisor nor a multiple of its 4 KV heads"):
        q.kv_heads_per_rank(14)


def test_flops_per_token():
    m = get_model("llama-3-8b")
    # decoder linear weights x 2, plus the LM head (hidden x vocab x 2)
    layers = 32 * (4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336)
    assert m.layer_flops_per_token() == 2 * layers
    assert m.flops_per_token() == 2 * layers + 2 * 4096 * 128256
    assert m.flops_per_token(4) == pytest.approx(m.flops_per_token() / 4)
    assert m.attention_flops_per_pair() == 4 * 32 * 128 * 32


def test_inline_and_unknown_models():
    spec = {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "intermediate_size": 128, "vocab_size": 100}
    m = get_model(spec)
    assert (m.name, m.num_kv_heads, m.head_dim, m.dtype) == ("inline", 4, 16, "bf16")
    assert get_model(m) is m
    with pytest.raises(CbsimError, match=r"unknown model 'llama3-8b' \(did you mean 'llama-3-8b'\?\)"):
        get_model("llama3-8b")
    with pytest.raises(CbsimError, match=r"unknown key 'num_layer' \(did you mean 'num_layers'\?\)"):
        get_model({**spec, "num_layer": 3})
    with pytest.raises(CbsimError, match="dtype 'int8' is not one of bf16, fp16, fp32"):
        ModelSpec("x", 1, 8, 1, 1, 8, 8, 8, "int8")
    with pytest.raises(CbsimError, match="num_layers must be a positive integer"):
        ModelSpec("x", 0, 8, 1, 1, 8, 8, 8)


# --- GPUs ----------------------------------------------------------------------------------------
def test_gpu_datasheet_figures():
    h200 = get_gpu("h200")
    # memory as the device reports it (issue #16): an H200 shows 139.81 GiB, an H100 79.19 GiB
    assert (h200.memory_bytes, h200.peak_flops, h200.hbm_bandwidth, h200.pcie_bandwidth) == (
        round(139.81 * 2**30), 989e12, 4.8e12, 64e9)
    assert get_gpu("h100-sxm").memory_bytes == round(79.19 * 2**30)
    assert get_gpu("h100-sxm").hbm_bandwidth == 3.35e12 and get_gpu("a100-80gb").peak_flops == 312e12
    assert get_gpu("l40s").memory_bytes == (46068 - 470) * 2**20  # nvidia-smi total less the driver's share
    assert get_gpu("rtx-4090").memory_bytes == 25_250_627_584  # the reference run's device
    assert set(GPUS) == {"h100-sxm", "h200", "h100-pcie", "a100-80gb", "a100-40gb", "l40s", "b200",
                         "rtx-pro-6000", "rtx-4090", "cpu"}
    with pytest.raises(CbsimError, match=r"unknown gpu 'h100' \(did you mean 'h100-sxm' or 'h100-pcie'\?\); known gpus: h100-sxm"):
        get_gpu("h100")
    with pytest.raises(CbsimError, match=r"unknown gpu 'h300' \(did you mean 'h200'\?\)"):
        get_gpu("h300")


# --- KV capacity ---------------------------------------------------------------------------------
def test_llama3_8b_on_h200_block_count_by_hand():
    # memory x utilization      150,119,844,413 B (139.81 GiB) x 0.92           = 138,110,256,859 B
    # weights                   8,030,261,248 params x 2 B (bf16)              =  16,060,522,496 B
    # activation reserve        1 GiB (pinned)                                 =   1,073,741,824 B
    # left for KV               138,110,256,859 - 16,060,522,496 - 1,073,741,824 = 120,975,992,539 B
    # one block                 16 tokens x 2 (K,V) x 8 KV heads x 128 x 2 B x 32 layers = 2,097,152 B
    # blocks                    120,975,992,539 // 2,097,152                   = 57,685
    hw = Hardware(gpu="h200", gpu_memory_utilization=0.92, activation_reserve_gib=1.0)
    assert num_gpu_blocks(get_model("llama-3-8b"), get_gpu("h200"), hw, 16, 1) == 57_685
    assert 120_975_992_539 // 2_097_152 == 57_685
    # unpinned, the reserve is vLLM's profiling pass at 8192 tokens: forward 8192 x (2 x 4096 + 3 x
    # 14336) x 2 B = 838,860,800 B (> the sampler's 256 x 128,256 x 22 B + hidden states) plus 551 MiB
    # non-torch = 1,416,626,176 B, so (138,110,256,859 - 16,060,522,496 - 1,416,626,176) // 2,097,152
    # = 57,522 blocks; the usable count leaves out vLLM V1's null block; the CPU pool is 4 GiB / 2 MiB
    scn = load_scenario({"workload": {"num_requests": 1, "arrival": {"rate": 1.0}}, "policies": [{"name": "orca"}]})
    limits = resolve(scn).limits
    assert (limits.num_gpu_blocks, limits.num_cpu_blocks) == (57_521, 4 * 2**30 // 2_097_152)


def test_tensor_parallel_blocks():
    hw = Hardware(gpu="h200", tensor_parallel=2, activation_reserve_gib=1.0)
    m = get_model("llama-3-8b")
    expected = int((round(139.81 * 2**30) * 0.92 - m.weight_bytes(2) - 2**30) // (16 * 65_536))
    assert num_gpu_blocks(m, get_gpu("h200"), hw, 16, 2) == expected
    assert num_cpu_blocks(4.0, m, 16, 2) == 4 * 2**30 // (16 * 65_536)


def test_a_model_that_does_not_fit_states_bytes():
    hw = Hardware(gpu="l40s")
    with pytest.raises(CbsimError) as info:
        num_gpu_blocks(get_model("llama-3-70b"), get_gpu("l40s"), hw, 16, 1)
    msg = str(info.value)
    assert "does not fit on l40s with tensor_parallel=1" in msg
    # needed: 141,107,412,992 B weights + reserve (forward at 8192 tokens: 8192 x (2 x 8192 + 3 x 28672)
    # x 2 B, plus 551 MiB non-torch) + one 5,242,880 B block
    assert f"= {141_107_412_992 + 8192 * (2 * 8192 + 3 * 28672) * 2 + 551 * 2**20 + 16 * 327_680:,} bytes" in msg
    assert "47,812,968,448 bytes × gpu_memory_utilization 0.92 = 43,987,930,972 bytes" in msg
    assert "Raise hardware.tensor_parallel" in msg


def test_pinned_blocks_and_max_model_len_check():
    base = {"workload": {"num_requests": 1, "arrival": {"rate": 1.0}}, "policies": [{"name": "orca"}]}
    scn = load_scenario({**base, "model": "tiny", "hardware": {"gpu": "cpu"}, "engine": {"num_gpu_blocks": 64}})
    assert resolve(scn).limits.num_gpu_blocks == 64
    tight = load_scenario({**base, "hardware": {"gpu": "l40s", "gpu_memory_utilization": 0.375},
                           "engine": {"max_model_len": 8192}})
    with pytest.raises(CbsimError, match="fewer than engine.max_model_len"):
        resolve(tight)
