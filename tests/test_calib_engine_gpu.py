"""calib's engine, executor and profiler on a CUDA device (issue 6; skipped without one).

Run by ``calib/gpu_calibrate.sh`` on the device machine before it calibrates. What they establish
beyond the CPU tests: decode steps captured in CUDA graphs (padded to a captured size) give the
tokens an eager step gives; a swap through pinned staging restores K/V exactly; the real engine
makes the simulator's decisions on the GPU too; a small profile on the GPU writes a valid table
with CUDA-graph decode steps and event timing.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CUDA = "cuda"


def test_captured_decode_graphs_give_the_eager_tokens():
    from calib.executor import StepExecutor
    from calib.step import BlockAllocator, SeqInput, make_runner, synthetic_batch

    runner = make_runner("tiny", num_blocks=600, block_size=16, device=CUDA)
    executor = StepExecutor(runner, max_model_len=512, max_batch=16)
    assert executor.uses_graphs
    allocator = BlockAllocator(600, shuffle_seed=1)
    for b in (1, 3, 8, 13):
        batch = synthetic_batch([(1, 5 + 37 * i) for i in range(b)], allocator, 16)
        batch = [SeqInput(1, s.context_len, s.block_table, [17 + i]) for i, s in enumerate(batch)]
        assert executor.graphs.fits(batch)
        eager = runner.step(batch)
        assert executor.run(batch) == eager
    prefill = synthetic_batch([(40, 0), (1, 30)], allocator, 16)
    assert not executor.graphs.fits(prefill) and len(executor.run(prefill)) == 2


def test_swap_through_pinned_staging_restores_kv():
    from calib.executor import HostKVPool
    from calib.step import make_runner

    runner = make_runner("tiny", num_blocks=64, block_size=16, device=CUDA)
    cache = runner.cache
    pool = HostKVPool(cache, max_blocks=32, initial_blocks=2)
    blocks = [5, 17, 9, 40]
    before = cache.data[:, :, blocks].clone()
    host = pool.swap_out(blocks)
    cache.data[:, :, blocks] = 0
    pool.swap_in(host, [50, 51, 52, 60])
    torch.cuda.synchronize()
    assert torch.equal(cache.data[:, :, [50, 51, 52, 60]], before)


def test_real_engine_on_cuda_makes_the_simulators_decisions():
    from calib.engine import RealEngine
    from calib.executor import StepExecutor
    from calib.step import make_runner
    from policies.base import EngineLimits
    from policies.registry import make_policy
    from sim.engine import Simulation
    from sim.hardware.gpus import get_gpu
    from sim.hardware.models import get_model
    from sim.latency.constant import ConstantLatency
    from tests.test_calib_engine import LIMITS, recording, workload

    limits = EngineLimits(**LIMITS)
    specs = workload(seed=11)
    sim_policy = make_policy("vllm-v1", limits)
    sim_log = recording(sim_policy)
    latency = ConstantLatency(0.01, get_model("tiny"), get_gpu("h200"), 1, limits.block_size)
    Simulation(specs, [(sim_policy, latency)], limits.max_model_len, fast_forward=False).run()
    runner = make_runner("tiny", num_blocks=limits.num_gpu_blocks + 1, block_size=16, device=CUDA)
    executor = StepExecutor(runner, max_model_len=limits.max_model_len, max_batch=limits.max_num_seqs)
    run = RealEngine(make_policy("vllm-v1", limits), executor, max_model_len=limits.max_model_len, check=True).run(specs)
    assert [(s.batch, s.preempted) for s in run.steps] == sim_log
    assert run.info["graphs"] and run.info["clock"] == "wall"


def test_a_small_profile_on_cuda(tmp_path):
    from calib.profile.calibrate import ProfileSpec, calibrate
    from sim.latency.table_format import read_table

    spec = ProfileSpec(model="tiny", device=CUDA, max_num_batched_tokens=64, max_model_len=256, max_num_seqs=8,
                       repeats=3, heldout=6, cache_gib=0.25)
    calibrate(spec, tmp_path / "t")
    meta = read_table(tmp_path / "t").metadata
    assert meta["fit"]["cuda_graphs"] and meta["fit"]["timing"]["clock"] == "cuda-events"
    assert meta["device"] == torch.cuda.get_device_name() and meta["num_gpu_blocks"] > 0
    assert meta["bandwidth"]["h2d_bytes_per_s"] > 1e9 and meta["heldout_error"]["n"] == 6
