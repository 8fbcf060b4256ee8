"""Memory hygiene of a CPU run: what importing and loading must not pull in or build eagerly."""
import json
import os
import subprocess
import sys

import pytest

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from tramontane.engine.gguf import StringArray, open_gguf
from tramontane.kernels.ggml_types import GGML_TYPES


def test_ggml_type_table_matches_gguf_package():
    ours = {i: (t.name, t.block_size, t.type_size) for i, t in GGML_TYPES.items()}
    theirs = {int(t): (t.name, *GGML_QUANT_SIZES[t]) for t in GGMLQuantizationType if t in GGML_QUANT_SIZES}
    assert ours == theirs


def test_metadata_string_arrays_stay_in_the_file_and_read_as_written(tmp_path):
    from gguf import GGUFWriter

    strings = ["<unk>", "", "Ġ Ġ", "é", "监督", "🙂x", "a" * 300] + [f"t{i}" for i in range(1000)]
    path = tmp_path / "strings.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_array("test.strings", strings)
    w.add_array("test.nested", [["x", "ÿ"], ["", "yz"]])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open_gguf(path) as gf:
        ours = gf.kv["test.strings"]
        assert isinstance(ours, StringArray)  # offsets into the file, not one str object each
        assert len(ours) == len(strings) and list(ours) == strings and ours == strings
        assert ours[3] == "é" and ours[-1] == "t999" and ours[4:6] == ["监督", "🙂x"]
        assert gf.array_of("test.strings", "string", len(strings)) is ours
        assert [list(a) for a in gf.kv["test.nested"]] == [["x", "ÿ"], ["", "yz"]]


# A fresh interpreter without the test suite's TRITON_INTERPRET, as a CPU user starts one.
_IMPORTS = r'''
import json, sys
import tramontane.engine.runtime.local, tramontane.engine.cli.main, tramontane.app.window, tramontane.app.worker
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


def _rss_bytes() -> int:
    with open("/proc/self/smaps_rollup", encoding="ascii") as fh:
        return next(int(ln.split()[1]) for ln in fh if ln.startswith("Rss:")) * 1024


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="Linux RSS accounting")
def test_cpu_kv_cache_is_resident_only_where_written():
    import torch

    from tramontane.engine.mistral3.text import scatter_positions
    from tramontane.engine.runtime.kv_cache import KVCache, KVPool

    before = _rss_bytes()
    pool = KVPool(8, 128, 128, 256, [(8, torch.float32, torch.device("cpu"))])  # 8192 positions: 512 MiB of K/V
    assert float(pool.ks[0].sum()) == 0.0 and float(pool.vs[0].max()) == float(pool.vs[0].min()) == 0.0  # reads too
    cache = KVCache(pool, pool.positions)
    cache.reserve(100)
    table = cache.table("cpu")
    scatter_positions(pool.layer_k[3], table, 0, torch.ones(100, 8, 128), pool.block)
    scatter_positions(pool.layer_v[3], table, 0, torch.full((100, 8, 128), 2.0), pool.block)
    cache.length = 100
    grown = _rss_bytes() - before
    assert grown < 64 << 20, f"an unfilled 512 MiB pool made {grown >> 20} MiB resident"
    k, v = cache.read_positions(3)
    assert float(k.sum()) == 8 * 100 * 128 and float(v.sum()) == 2 * 8 * 100 * 128
    assert float(pool.ks[0].abs().sum()) == 8 * 100 * 128  # nothing written past those positions
