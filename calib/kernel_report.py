"""What the paged-attention kernel compiles to for a GPU, read without a GPU.

Triton ships its own LLVM, ``ptxas`` and ``cuobjdump``, so the kernel can be compiled for a
Hopper target (sm_90) on any Linux machine and its resource usage and machine code read back:
registers, local memory (stack: register spills), and which instructions it uses (HGMMA/HMMA
matrix instructions; LDGSTS, the asynchronous 16-byte global-to-shared copies that fetch K/V
tiles). Device time is scarce; this catches a kernel change that spills or falls off the matrix
units before any GPU is involved. It compiles with the same :func:`kernel_config` the launcher
uses, and marks pointer and stride arguments 16-byte divisible as Triton's JIT does for
contiguous tensors with 16-bit head sizes that are multiples of 8.

    python -m calib.kernel_report          # Llama-3-8B-shaped configurations, sm_90

Needs ``triton`` and must run without ``TRITON_INTERPRET=1`` (the interpreter compiles nothing).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

TRITON_TYPES = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}
ITEMSIZE = {"bf16": 2, "fp16": 2, "fp32": 4}
SASS_OPS = ("HGMMA", "HMMA", "LDGSTS", "LDL", "STL")


def compile_report(
    dtype: str = "bf16",
    *,
    max_query_len: int,
    num_heads: int = 32,
    num_kv_heads: int = 8,
    head_dim: int = 128,
    block_size: int = 16,
    num_segments: int = 1,
    arch: int = 90,
) -> dict:
    """Compile the kernel for ``sm_<arch>`` and report its resource usage and instruction mix."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from calib import paged_triton

    kernel = paged_triton._paged_attention_kernel
    if paged_triton.interpreted():
        raise RuntimeError("compile_report needs the compiled kernel: run it without TRITON_INTERPRET=1")
    config = paged_triton.kernel_config(
        max_query_len=max_query_len, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
        block_size=block_size, itemsize=ITEMSIZE[dtype], num_segments=num_segments,
    )
    options = {"num_warps": config.pop("num_warps"), "num_stages": config.pop("num_stages")}
    signature, aligned = {}, []
    for name in kernel.arg_names:
        if name in config:
            signature[name] = "constexpr"
        elif name in ("q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr"):
            signature[name] = "*" + TRITON_TYPES[dtype]
        elif name.startswith("seg_"):
            signature[name] = "*fp32"
        elif name.endswith("_ptr"):
            signature[name] = "*i32"
        elif name == "scale_log2e":
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
        if name.endswith("_ptr") or (name.startswith("stride_") and name != "stride_bt") or name == "num_q_heads":
            aligned.append(name)
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    source = ASTSource(kernel, signature, constexprs=config, attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "kernel.cubin")
        with open(cubin, "wb") as f:
            f.write(compiled.asm["cubin"])
        usage = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", cubin],
                               capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", cubin],
                              capture_output=True, text=True, check=True).stdout

    def field(key: str) -> int:
        match = re.search(rf"{key}:(\d+)", usage)
        if not match:
            raise RuntimeError(f"no {key} in cuobjdump's resource usage:\n{usage}")
        return int(match.group(1))

    mnemonics = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", sass)
    return {
        "dtype": dtype,
        "max_query_len": max_query_len,
        "config": {**config, **options},
        "registers": field("REG"),
        "stack_bytes": field("STACK"),
        "shared_bytes": compiled.metadata.shared,
        "sass": {op: sum(1 for m in mnemonics if m == op) for op in SASS_OPS},
    }


# Llama-3-8B shapes (32 query heads over 8 KV heads, head_dim 128), decodes and a prefill chunk.
CASES = [
    dict(dtype="bf16", max_query_len=1),
    dict(dtype="bf16", max_query_len=1, num_segments=8),
    dict(dtype="bf16", max_query_len=512),
    dict(dtype="fp16", max_query_len=512),
    dict(dtype="fp32", max_query_len=1),
    dict(dtype="fp32", max_query_len=512),
]


def main() -> int:
    failures = 0
    for case in CASES:
        r = compile_report(**case)
        c = r["config"]
        matrix = r["sass"]["HGMMA"] + r["sass"]["HMMA"]
        ok = r["stack_bytes"] == 0 and (case["dtype"] == "fp32" or (matrix > 0 and r["sass"]["LDGSTS"] > 0))
        failures += not ok
        print(
            f"{r['dtype']:5s} q<={r['max_query_len']:<4d} M{c['BLOCK_M']:<4d}N{c['BLOCK_N']:<3d}seg{c['NUM_SEGMENTS']:<3d}"
            f"warps{c['num_warps']}  regs {r['registers']:3d}  stack {r['stack_bytes']:4d} B  "
            f"shared {r['shared_bytes'] // 1024:3d} KiB  {r['sass']}  {'ok' if ok else 'CHECK'}"
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
