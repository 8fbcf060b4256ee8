"""mistral3/weights.py: the token table looked up as stored (rows = gguf.quants' dequantization of
the same bytes, on every CPU variant and on torch's exact path), which weights are fused into one
matmul, when float32 copies are made, and a loaded model's weights against the file (gguf.quants)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from support import FIXTURES
from support.cpu_kernels import restore_cpu_kernel_settings  # noqa: F401 - a fixture
from support.quant_bytes import gguf_dequantized, random_quant_bytes
from tramontane.engine.gguf import open_gguf
from tramontane.engine.mistral3 import weights
from tramontane.engine.mistral3.text import Mistral3Text
from tramontane.kernels import cpu_native, ggml_types as gt
from tramontane.kernels.linear import QWeight
from support.cpu_kernels import cpu_exact

F32_MODEL = FIXTURES / "mistral3_tiny-f32.gguf"
Q4_K_M_MODEL = FIXTURES / "mistral3_q256-Q4_K_M.gguf"
TABLE_TYPES = [gt.F32, gt.F16, gt.Q8_0, gt.Q4_K, gt.Q6_K]
PATHS = [*(f"native-{v}" for v in (cpu_native.variants() if cpu_native.AVAILABLE else [])), "exact"]


@pytest.fixture
def cpu_path(request, restore_cpu_kernel_settings):
    """The CPU path a test runs on: a native variant, or torch's float32 path (exact)."""
    path = request.param
    if path == "exact":
        with cpu_exact():
            yield path
        return
    cpu_native.use_variant(path.removeprefix("native-"))
    yield path


@pytest.mark.parametrize("cpu_path", PATHS, indirect=True)
@pytest.mark.parametrize("ggml_type", TABLE_TYPES, ids=gt.type_name)
def test_token_rows_are_the_files_rows_dequantized(ggml_type, cpu_path):
    rng = np.random.default_rng(ggml_type)
    shape = (40, 512)
    if ggml_type in (gt.F32, gt.F16):
        values = rng.standard_normal(shape).astype(np.float32 if ggml_type == gt.F32 else np.float16)
        raw = values.view(np.uint8).reshape(shape[0], -1)
    else:
        raw = random_quant_bytes(ggml_type, shape, rng)
    table = weights.TokenEmbedding(QWeight.from_raw(torch.from_numpy(raw), ggml_type, shape), torch.float32)
    ids = torch.tensor([7, 0, 39, 7, 12])
    want = torch.from_numpy(gguf_dequantized(raw, ggml_type, shape))[ids]
    torch.testing.assert_close(table(ids), want, rtol=1e-6, atol=1e-7)
    assert table(ids).dtype == torch.float32
    half = weights.TokenEmbedding(table.weight, torch.bfloat16)(ids)
    assert half.dtype == torch.bfloat16 and torch.equal(half, want.to(torch.bfloat16))


def test_fusion_needs_one_type_and_is_off_on_the_native_cpu_path():
    with open_gguf(Q4_K_M_MODEL) as gf, open_gguf(F32_MODEL) as f32:
        qkv = ["blk.1.attn_q.weight", "blk.1.attn_k.weight", "blk.1.attn_v.weight"]
        types = {gf.tensors[n].ggml_type for n in qkv}
        assert len(types) > 1  # Q4_K_M: attn_v is Q6_K
        assert not weights._fusable(gf, qkv)
        assert weights._fusable(f32, [n.replace("blk.1", "blk.0") for n in qkv])
        with cpu_exact():
            assert weights._fusable(f32, qkv, torch.device("cpu"))
        if cpu_native.AVAILABLE:  # separate calls on the mapped bytes, no concatenated copy
            with cpu_exact(False):
                assert not weights._fusable(f32, qkv, torch.device("cpu"))


def test_float32_copies_only_on_the_cpu_and_as_asked(monkeypatch):
    with open_gguf(Q4_K_M_MODEL) as gf:
        cfg = Mistral3Text.load(Q4_K_M_MODEL, device="cpu").cfg
        assert not weights.want_dense(gf, cfg, torch.device("cuda"), True)
        assert weights.want_dense(gf, cfg, torch.device("cpu"), True)
        assert not weights.want_dense(gf, cfg, torch.device("cpu"), False)
        monkeypatch.setattr(weights, "native_cpu", lambda: False)
        monkeypatch.setattr(weights, "available_ram", lambda: 1 << 40)
        assert weights.want_dense(gf, cfg, torch.device("cpu"), None)  # torch's path, room enough
        monkeypatch.setattr(weights, "available_ram", lambda: 1 << 10)
        assert not weights.want_dense(gf, cfg, torch.device("cpu"), None)
        monkeypatch.setattr(weights, "native_cpu", lambda: True)
        monkeypatch.setattr(weights, "available_ram", lambda: 1 << 40)
        assert not weights.want_dense(gf, cfg, torch.device("cpu"), None)  # the kernels read the blocks


@pytest.mark.parametrize("exact", [False, True], ids=["native", "exact"])
def test_loaded_weights_are_the_files(exact):
    if not exact and not cpu_native.AVAILABLE:
        pytest.skip("native CPU kernels not built")
    with cpu_exact(exact):
        model = Mistral3Text.load(Q4_K_M_MODEL, device="cpu")
    with open_gguf(Q4_K_M_MODEL) as gf:
        assert len(model.layers) == model.cfg.n_layers
        layer = model.layers[1]  # attn_v is Q6_K, q and k Q4_K: never fused; gate and up may be

        def want(*names: str) -> torch.Tensor:
            rows = []
            for name in names:
                info = gf.tensors[f"blk.1.{name}.weight"]
                rows.append(gguf_dequantized(np.asarray(gf.raw(f"blk.1.{name}.weight")), info.ggml_type,
                                             tuple(info.shape)))
            return torch.from_numpy(np.concatenate(rows))

        gate_up = ((layer.w_gate_up, ("ffn_gate", "ffn_up")),) if layer.w_gate_up is not None else (
            (layer.w_gate, ("ffn_gate",)), (layer.w_up, ("ffn_up",)))
        assert (layer.w_gate_up is not None) == exact  # fused only off the native CPU path
        for w, names in ((layer.wq, ("attn_q",)), (layer.wv, ("attn_v",)), (layer.wo, ("attn_output",)),
                         (layer.w_down, ("ffn_down",)), *gate_up):
            torch.testing.assert_close(w.dequantize(torch.float32), want(*names), rtol=1e-6, atol=1e-7)
        norm = np.array(gf.array("blk.1.attn_norm.weight"), dtype=np.float32)
        assert torch.equal(layer.attn_norm, torch.from_numpy(norm))
        assert model.weight_bytes >= sum(t.nbytes for n, t in gf.tensors.items() if n.startswith("blk."))
        if model.cfg.tied_embeddings and not model.dense_weights:
            assert model.head is model.embedding.weight  # the very same bytes
