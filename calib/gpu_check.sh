#!/usr/bin/env bash
# calib's GPU checks in one go, for the device machine (or any CUDA box).
#
#   bash calib/gpu_check.sh            # from the repository root
#
# Python: $PYTHON if set, else `python3`. On the device machine that is the image's own venv
# (/opt/torch/.venv), which already holds torch, triton, numpy and pytest; a fresh venv would not
# see them, so the script uses that one and adds what it lacks from carried wheels:
#   wheels: put them in .whl/ at the repository root (ignored by git: `echo /.whl/ >>
#   .git/info/exclude`), fetched where pip works with `pip download --no-deps --only-binary=:all:
#   --python-version 3.12 --platform manylinux2014_x86_64 -d .whl NAME==VERSION`, and name `.whl`
#   in the run's `carry`. They install with --no-index into /tmp/cbsim-site (on PYTHONPATH).
#   calib's GPU tests need nothing beyond torch, triton and pytest.
# Logs: $OUT if set (the device machine's folder that comes back), else ./gpu_check_out:
#   gpu_env.txt (GPU, driver, versions), gpu_tests.log (pytest), gpu_junit.xml, gpu_bench.txt.
# Exit status: pytest's.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOG=${OUT:-$PWD/gpu_check_out}
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1

if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/cbsim-site .whl/*.whl || { echo "installing carried wheels failed"; exit 3; }
  export PYTHONPATH=/tmp/cbsim-site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1
  "$PY" - <<'EOF' 2>&1
import platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "available", torch.cuda.is_available())
try:
    import triton
    print("triton", triton.__version__)
except ImportError as exc:
    print("triton missing:", exc)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, "SMs", p.multi_processor_count, "memory GiB", round(p.total_memory / 2**30, 1))
EOF
} | tee "$LOG/gpu_env.txt"

# GPU-marked tests, then the CPU-side calib tests (the Triton file runs compiled on CUDA here).
"$PY" -m pytest -q -rs -p no:cacheprovider --junitxml="$LOG/gpu_junit.xml" \
  tests/test_calib_gpu.py tests/test_calib_paged_triton.py tests/test_calib_paged.py tests/test_calib_model.py \
  2>&1 | tee "$LOG/gpu_tests.log"
status=${PIPESTATUS[0]}

# A first look at speed (not a calibration): decode attention, Llama-3-8B heads, bf16.
"$PY" - <<'EOF' 2>&1 | tee "$LOG/gpu_bench.txt"
import sys, torch
if not torch.cuda.is_available():
    sys.exit("no CUDA device: no benchmark")
import triton
from calib.paged import PagedKVCache, build_metadata, paged_attention_reference
from calib.paged_triton import paged_attention_triton
from calib.step import BlockAllocator
for batch, ctx in ((1, 8192), (8, 4096), (64, 2048), (256, 1024)):
    bs, kvh, d = 16, 8, 128
    nblk = batch * (-(-(ctx + 1) // bs)) + 1
    cache = PagedKVCache(1, nblk, bs, kvh, d, dtype=torch.bfloat16, device="cuda")
    alloc = BlockAllocator(nblk, shuffle_seed=0)
    tables = [alloc.allocate(-(-(ctx + 1) // bs)) for _ in range(batch)]
    meta = build_metadata([1] * batch, [ctx] * batch, tables, bs, device="cuda")
    q = torch.randn(batch, 32, d, device="cuda", dtype=torch.bfloat16)
    k, v = cache.layer(0)
    ms = triton.testing.do_bench(lambda: paged_attention_triton(q, k, v, meta, d ** -0.5), return_mode="median")
    ref = triton.testing.do_bench(lambda: paged_attention_reference(q, k, v, meta, d ** -0.5), return_mode="median")
    gbs = 2 * batch * (ctx + 1) * kvh * d * 2 / (ms * 1e-3) / 1e9
    print(f"decode batch {batch:4d} ctx {ctx:5d}: triton {ms * 1e3:8.1f} us ({gbs:6.0f} GB/s of K/V)  reference {ref * 1e3:9.1f} us")
EOF

echo "gpu_check: pytest exit status $status (logs in $LOG)"
exit "$status"
