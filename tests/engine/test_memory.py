"""Memory hygiene of a CPU run: what importing and loading must not pull in or build eagerly."""
import json
import os
import subprocess
import sys

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from tramontane.engine.gguf import GGML_TYPES


def test_ggml_type_table_matches_gguf_package():
    ours = {i: (name, block, size) for i, (name, block, size) in GGML_TYPES.items()}
    theirs = {int(t): (t.name, *GGML_QUANT_SIZES[t]) for t in GGMLQuantizationType if t in GGML_QUANT_SIZES}
    assert ours == theirs


# A fresh interpreter without the test suite's TRITON_INTERPRET, as a CPU user starts one.
_IMPORTS = r'''
import json, sys
import tramontane.engine.runtime.local, tramontane.engine.cli.main
print(json.dumps(sorted(m.split(".")[0] for m in sys.modules)))
'''


def _modules_after(script: str) -> set[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU-only machine, even on a GPU runner
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_cpu_engine_imports_leave_out_heavy_optional_packages():
    # gguf pulls in mistral-common, pydantic, cv2 and yaml (~47 MB); Triton's library is ~70 MB
    # and cannot run on a CPU; transformers is a test reference only.
    loaded = _modules_after(_IMPORTS)
    assert "tramontane" in loaded
    heavy = {"gguf", "triton", "mistral_common", "cv2", "pydantic", "transformers", "yaml"} & loaded
    assert not heavy, f"a CPU engine import pulled in {sorted(heavy)}"
