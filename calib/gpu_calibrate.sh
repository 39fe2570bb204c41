#!/usr/bin/env bash
# Issue 6 on one H200, in ONE call of the device tool: check the GPU path, calibrate Llama-3-8B
# bf16, validate a scenario against the table, and print a short summary.
#
#   bash calib/gpu_calibrate.sh            # from the repository root, on the device machine
#
# Before the call, where pip works (the device machine reaches no registry; its image holds
# torch, triton, numpy, pandas, pyarrow, typer, rich, pyyaml and matplotlib, but not simpy and
# pydantic, which `cbsim validate` needs; `cbsim calibrate` needs neither):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl simpy==4.1.2 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
# then call the device tool: run(command="bash calib/gpu_calibrate.sh", carry=[".whl"], timeout_s=600).
# (Without the wheels the script still calibrates, and says that validation was skipped.)
#
# Time plan: the call may run 10 minutes and the session has 15 device-minutes in all, machine
# start (1-2 min) included. Here: gpu_check.sh <= 120 s (killed past that: its logs stay), this
# issue's GPU tests (tests/test_calib_engine_gpu.py) <= 60 s, calibration <= 290 s (the sweep
# fits --time-budget 220 s: fewer rounds if needed), validation <= 100 s (the scenario runs in
# well under a minute). Worst case 570 s, typical ~6 min.
#
# Output under $OUT (the device tool brings back at most 8 files, two folders deep):
#   table/table.csv, table/metadata.json   the latency table: commit as calib/tables/h200-llama-3-8b-bf16/
#   validate/validation.json                {real, sim, error, diagnostics} of scenarios/validate_h200.yaml
#   validate/real_run.json                  the real run as a step log (sim/recorded/steplog.py's format)
#   log.txt                                 every phase's output, with times
#   check.tgz                               calib/gpu_check.sh's logs (GPU, versions, pytest, kernel bench)
# Exit status: 0 when the table was written; the summary's last lines say what passed.
#
# The same flow runs anywhere for a dry run of the script itself, e.g. on a CPU:
#   DEVICE=cpu MODEL=tiny DTYPE=fp32 SCENARIO=scenarios/validate_cpu.yaml \
#   CAL_ARGS="--max-num-batched-tokens 256 --max-model-len 1024 --max-num-seqs 16" bash calib/gpu_calibrate.sh
set -uo pipefail
DEVICE=${DEVICE:-cuda}
MODEL=${MODEL:-llama-3-8b}
DTYPE=${DTYPE:-bf16}
SCENARIO=${SCENARIO:-scenarios/validate_h200.yaml}
CAL_ARGS=${CAL_ARGS:-}
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-$PWD/gpu_calibrate_out}
mkdir -p "$OUT"
LOG=$OUT/log.txt
: >"$LOG"
export PYTHONUNBUFFERED=1
T0=$SECONDS
phase() { echo "=== $1 (t = $((SECONDS - T0)) s)" | tee -a "$LOG"; }

if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/cbsim-site .whl/*.whl >>"$LOG" 2>&1 || echo "installing carried wheels failed" | tee -a "$LOG"
  export PYTHONPATH=/tmp/cbsim-site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
CBSIM=("$PY" -c "from sim.cli.main import main; main()")

phase "environment"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv >>"$LOG" 2>&1
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)" >>"$LOG" 2>&1

phase "gpu_check.sh (<= 120 s)"
CHECK=$(mktemp -d)
OUT=$CHECK timeout 120 bash calib/gpu_check.sh >>"$LOG" 2>&1
CHECK_RC=$?
tar -czf "$OUT/check.tgz" -C "$CHECK" . 2>>"$LOG"

phase "tests/test_calib_engine_gpu.py (<= 60 s)"
timeout 60 "$PY" -m pytest -q -rs -p no:cacheprovider tests/test_calib_engine_gpu.py >>"$LOG" 2>&1
ENGINE_RC=$?

phase "calibrate $MODEL $DTYPE on $DEVICE (<= 290 s)"
# shellcheck disable=SC2086  # CAL_ARGS is a list of options
timeout 290 "${CBSIM[@]}" calibrate --model "$MODEL" --device "$DEVICE" --dtype "$DTYPE" --out "$OUT/table" \
  --time-budget 220 --quiet $CAL_ARGS >>"$LOG" 2>&1
CAL_RC=$?

VAL_RC=skipped
if [ "$CAL_RC" -eq 0 ] && "$PY" -c "import simpy, pydantic" 2>>"$LOG"; then
  phase "validate $SCENARIO (<= 100 s)"
  timeout 100 "${CBSIM[@]}" validate "$SCENARIO" --device "$DEVICE" --table "$OUT/table" \
    --out "$OUT/validate" --quiet >>"$LOG" 2>&1
  VAL_RC=$?
elif [ "$CAL_RC" -eq 0 ]; then
  echo "validation skipped: simpy/pydantic missing (carry .whl, see this script's header)" | tee -a "$LOG"
fi
phase "done"

"$PY" - "$OUT" "$CHECK_RC" "$ENGINE_RC" "$CAL_RC" "$VAL_RC" <<'EOF' 2>&1 | tee -a "$LOG"
import json, sys
from pathlib import Path
out, check_rc, engine_rc, cal_rc, val_rc = Path(sys.argv[1]), *sys.argv[2:]
print(f"gpu_check.sh exit {check_rc}; engine GPU tests exit {engine_rc}; calibrate exit {cal_rc}; "
      f"validate exit {val_rc}")
meta_path = out / "table" / "metadata.json"
if meta_path.is_file():
    m = json.loads(meta_path.read_text())
    e, f = m["heldout_error"], m["fit"]
    print(f"table: {m['device']}, driver {m['driver_version']}, torch {m['torch_version']}, {m['model']['name']} "
          f"{m['dtype']}, block {m['block_size']}, KV capacity {m['num_gpu_blocks']} blocks at "
          f"{m['gpu_memory_utilization']}; {f['profile_seconds']} s, rounds cap {f.get('rounds_cap')}, "
          f"CUDA graphs {f.get('cuda_graphs')} {f.get('cuda_graphs_note') or ''}")
    print(f"  swap {m['bandwidth']['h2d_bytes_per_s'] / 1e9:.1f} GB/s in, {m['bandwidth']['d2h_bytes_per_s'] / 1e9:.1f} "
          f"GB/s out; held-out mixed batches: mean |rel| {e['mean_abs_rel']:.1%}, p90 {e['p90_abs_rel']:.1%}, "
          f"sum {e['sum_rel']:+.1%} (n {e['n']})")
val_path = out / "validate" / "validation.json"
if val_path.is_file():
    v = json.loads(val_path.read_text())
    errs = ", ".join(f"{k} {x:+.1%}" if x is not None else f"{k} -" for k, x in v["error"].items())
    print(f"validate {v['scenario']} ({v['policy']}): {errs}; step-time bias "
          f"{v['diagnostics']['step_time_bias']:+.1%}")
    print(f"  real: TPOT {v['real']['tpot_mean'] * 1e3:.2f} ms, throughput {v['real']['throughput']:.2f} req/s, "
          f"{v['real']['preemptions']} preemptions; sim: TPOT {v['sim']['tpot_mean'] * 1e3:.2f} ms, throughput "
          f"{v['sim']['throughput']:.2f} req/s, {v['sim']['preemptions']} preemptions")
EOF
exit "$CAL_RC"
