"""Tables whose all-reduces are NCCL's rather than the engine's custom kernel
(calib/sources/kernel_db_comm.py, ``allreduce="nccl"``).

The re-priced operator is AIConfigurator's custom-kernel time times the two kernels' measured ratio at
that message size, so at a message size both tables measure, one all-reduce costs exactly NCCL's row;
nothing else in the step changes, and TP 1 has no all-reduce to change.
"""

from __future__ import annotations

import importlib.resources as res
from pathlib import Path

import pytest

from tests.helpers import require_aic

HIDDEN, LAYERS = 5120, 64  # Qwen3-32B


def _rows():
    import pandas as pd

    comm = Path(str(res.files("aiconfigurator_core"))) / "systems" / "data" / "h100_sxm" / "comm"
    nccl = pd.read_parquet(comm / "nccl" / "2.27.3" / "nccl_perf.parquet")
    custom = pd.read_parquet(comm / "trtllm" / "1.3.0rc20" / "custom_allreduce_perf.parquet")
    return nccl[(nccl.op_name == "all_reduce") & (nccl.nccl_dtype == "half")], custom


def test_ratio_at_a_measured_size_is_the_rows_own():
    require_aic()
    from calib.sources.kernel_db_comm import AllReduceRows

    nccl, custom = _rows()
    data = Path(str(res.files("aiconfigurator_core"))) / "systems" / "data" / "h100_sxm"
    rows = AllReduceRows(data, "trtllm", "1.3.0rc20", "2.27.3")
    for gpus in (2, 4, 8):
        size = 65536
        want = (
            nccl[(nccl.num_gpus == gpus) & (nccl.message_size == size)].latency.mean()
            / custom[(custom.num_gpus == gpus) & (custom.message_size == size)].latency.mean()
        )
        assert rows.ratio(gpus, size) == pytest.approx(want, rel=1e-9)
        assert rows.ratio(gpus, size) > 1.5  # NCCL's small messages: 2-3x the one-shot kernel on H100
    # between rows: between the two neighbours' ratios' latencies (log-size interpolation)
    assert rows.ratio(8, 98304) > 1.0


def test_nccl_table_changes_only_the_all_reduces():
    """Qwen3-32B fp8 on 8 H100s in TensorRT-LLM at 8 tokens: the step's linear operators are the custom
    table's, except the all-reduces, each now about NCCL's row at 8 x 5,120 values x its call count."""
    require_aic()
    from calib.sources.kernel_db import KernelDb, resolve_model
    from calib.sources.kernel_db_comm import is_allreduce_op

    src = resolve_model("Qwen/Qwen3-32B")
    custom = KernelDb(src, "h100-sxm", tp=8, dtype="fp8", engine="trtllm", fp8_scaling="tensor")
    nccl = KernelDb(
        src, "h100-sxm", tp=8, dtype="fp8", engine="trtllm", fp8_scaling="tensor", allreduce="nccl"
    )
    a, b = custom.linear_ops(8), nccl.linear_ops(8)
    assert set(a) == set(b)
    ars = [k for k in a if is_allreduce_op(k)]
    assert sorted(ars) == ["ar_1", "ar_2", "embedding_ar"]
    for k in a:
        if k not in ars:
            assert b[k].seconds == a[k].seconds
    nccl_rows, _ = _rows()
    r = nccl_rows[nccl_rows.num_gpus == 8].groupby("message_size").latency.mean()
    lo, hi = r[32768], r[65536]  # 40,960 values lie between these rows
    per_call = b["ar_1"].seconds / LAYERS * 1e3
    # AIConfigurator interpolates its custom rows its own way, so the call lands near, not exactly on,
    # NCCL's rows there
    assert per_call == pytest.approx((lo + hi) / 2, rel=0.05)
    # 2 x 64 calls of ~19 us instead of ~5 us: ~1.8 ms more per decode step of 8 sequences
    extra = sum(b[k].seconds - a[k].seconds for k in ars)
    assert 1.4e-3 < extra < 2.2e-3
    assert "nccl" in nccl.allreduce and nccl._nccl is not None
    one = KernelDb(
        src, "h100-sxm", tp=1, dtype="fp8", engine="trtllm", fp8_scaling="tensor", allreduce="nccl"
    )
    assert one._nccl is None  # TP 1: nothing to all-reduce


def test_unknown_kind_names_the_choices():
    from calib.sources.kernel_db_comm import check_kind
    from sim.errors import CbsimError

    with pytest.raises(CbsimError, match="allreduce 'ncl' is not one of custom, nccl"):
        check_kind("ncl")


def test_calibrate_writes_an_nccl_table_and_refuses_the_flag_elsewhere(tmp_path, capsys):
    """``cbsim calibrate --from-kernel-db --allreduce nccl``: the table's metadata says which kernel it
    priced; the flag without --from-kernel-db, or with a kind that does not exist, is one error line."""
    import json

    from tests.helpers import run_cli

    require_aic()
    out = tmp_path / "t"
    code, stdout, err = run_cli(
        capsys,
        "calibrate",
        "--from-kernel-db",
        "--gpu",
        "h100-sxm",
        "--model",
        "Qwen/Qwen3-32B",
        "--engine",
        "trtllm",
        "--dtype",
        "fp8",
        "--tp",
        "8",
        "--allreduce",
        "nccl",
        "--max-num-batched-tokens",
        "2048",
        "--max-model-len",
        "4096",
        "--max-num-seqs",
        "64",
        "--out",
        out,
    )
    assert code == 0, err
    modelled = json.loads((out / "metadata.json").read_text())["provenance"]["modelled"]
    assert "priced as NCCL's all_reduce" in modelled["all-reduce"]
    code, _, err = run_cli(
        capsys, "calibrate", "--model", "tiny", "--allreduce", "nccl", "--out", tmp_path / "x"
    )
    assert code == 2 and "--allreduce goes with --from-kernel-db" in err and "Traceback" not in err
    code, _, err = run_cli(
        capsys,
        "calibrate",
        "--from-kernel-db",
        "--gpu",
        "h100-sxm",
        "--model",
        "llama-3-8b",
        "--allreduce",
        "ncl",
        "--out",
        tmp_path / "y",
    )
    assert code == 2 and "allreduce 'ncl' is not one of custom, nccl" in err
