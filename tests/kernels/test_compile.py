"""Every Triton kernel compiles for Hopper (sm_90) - checked without a GPU, through Triton's own
compiler and its bundled ptxas, with the argument specialisations a real launch gets (16-byte
aligned pointers and row strides). Runs in a subprocess: in this process the kernels were
decorated for the interpreter."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

SCRIPT = r'''
import json, sys, traceback
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tramontane.kernels import ggml_types as gt, qmatmul

class Dev:  # decode_config only asks for .type
    type = "cpu"

def compile_(kernel, sig, constexprs, warps, **opts):
    names = list(sig)
    aligned = [n for n in names if sig[n].startswith("*")] + [n for n in ("K", "row_bytes", "stride_xm") if n in names]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    src = ASTSource(kernel, sig, constexprs=constexprs, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, **opts})
    assert k.asm["cubin"]

deq = {"w_ptr": "*u8", "out_ptr": "*bf16", "table_ptr": "*fp32", "N": "i32", "K": "i32",
       "row_bytes": "i32", "n_blocks": "i32", "QTYPE": "constexpr", "BLOCK_N": "constexpr"}
dec = {"x_ptr": "*bf16", "w_ptr": "*u8", "part_ptr": "*fp32", "table_ptr": "*fp32", "M": "i32",
       "N": "i32", "K": "i32", "row_bytes": "i32", "n_blocks": "i32", "n_units": "i32",
       "units_per_split": "i32", "stride_xm": "i32", "QTYPE": "constexpr", "BLOCK_N": "constexpr",
       "BLOCK_M": "constexpr"}
result = {}
for t in qmatmul.TRITON_TYPES:
    try:
        compile_(qmatmul._dequant_kernel, deq, {"QTYPE": t, "BLOCK_N": 8}, 4, enable_fp_fusion=False)
        for m, out_type in ((1, "*bf16"), (1, "*fp32"), (8, "*fp32")):  # direct output / split-K partials
            bn, bm, _, warps = qmatmul.decode_config(4096, 5120, m, Dev(), t)
            compile_(qmatmul._decode_kernel, {**dec, "part_ptr": out_type},
                     {"QTYPE": t, "BLOCK_N": bn, "BLOCK_M": bm}, warps)
            if m == 1 and t in qmatmul.DOT_TYPES:  # scale-after-dot kernel: packed bf16 / f32 x
                for x_type, packed in ((("*bf16", True),) if out_type == "*bf16" else (("*fp32", False),)):
                    dot = {**dec, "x_ptr": x_type, "part_ptr": out_type, "f2p23": "i32"}
                    for name in ("QTYPE", "BLOCK_N", "BLOCK_M"):  # constexprs last, as in the kernel
                        dot[name] = dot.pop(name)
                    dot["X_BF16"] = "constexpr"
                    compile_(qmatmul._decode_dot_kernel, dot,
                             {"QTYPE": t, "BLOCK_N": bn, "BLOCK_M": 1, "X_BF16": packed}, warps)
        result[gt.type_name(t)] = "ok"
    except Exception:
        result[gt.type_name(t)] = traceback.format_exc()[-2000:]
print("RESULT " + json.dumps(result))
'''


def _nvidia_backend() -> bool:
    spec = importlib.util.find_spec("triton")
    if spec is None:
        return False
    bin_dir = os.path.join(os.path.dirname(spec.origin), "backends", "nvidia", "bin")
    return os.path.exists(os.path.join(bin_dir, "ptxas"))


@pytest.mark.skipif(not _nvidia_backend(), reason="Triton with its NVIDIA backend (bundled ptxas) not installed")
def test_all_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, proc.stderr[-3000:]
    result = json.loads(line[len("RESULT "):])
    failed = {k: v for k, v in result.items() if v != "ok"}
    assert not failed, "\n\n".join(f"{k}:\n{v}" for k, v in failed.items())
    assert len(result) == 12
