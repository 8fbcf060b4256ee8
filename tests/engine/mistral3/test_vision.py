"""engine/mistral3/vision.py against HF transformers' PixtralVisionModel + Mistral3 multi_modal_projector.

References: the tiny random HF models in tests/fixtures (mistral3_tiny: SiLU tower,
mistral3_tiny_gelu: GELU tower) and their mmproj GGUFs made by llama.cpp's converter. The
Ollama-layout files are made here from the llama.cpp ones with gguf-py (renamed tensors, Q/K
rows in HF's order).

Tolerances (per merged image token, cosine similarity with HF's output):
  f32 file vs HF f32, both layouts, both activations .. ≥ 0.99999 (measured min 1 - 1e-12)
  f16 file vs HF running the file's f16 weights ....... ≥ 0.99999 (measured min 1 - 1e-12)
  f16 file vs HF f32 (adds the rounding of weights) ... ≥ 0.999   (measured min 0.9999994)
  negative control, Q/K rows in the wrong order ........ min 0.70 (must fail the 0.9999 bar)
"""
from __future__ import annotations

import io
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from tramontane.engine.api import EngineError, ImagePart
from tramontane.engine.mistral3.image import image_grid
from tramontane.engine.mistral3.vision import LAYOUTS, VisionTower, unpermute_rows

from support import FIXTURES
from support.gguf_edit import rewrite_gguf


# float references at float32 tolerances: the CPU's float32 path (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("float32_cpu_path")


transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

MODELS = ("mistral3_tiny", "mistral3_tiny_gelu")
# (width, height): landscape, portrait above image_size, one tile, a 1-pixel column, a big one
SIZES = [(100, 60), (50, 120), (28, 28), (1, 300), (640, 480)]


def mmproj(name: str, kind: str = "f32") -> str:
    return os.path.join(FIXTURES, f"mmproj-{name}-{kind}.gguf")


def png(w: int, h: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


_HF: dict = {}


def hf_model(name: str, weights_dtype: torch.dtype | None = None):
    """HF Mistral3 model in float32; `weights_dtype` rounds every weight through that dtype
    (to run HF on exactly the numbers an f16 file holds)."""
    key = (name, weights_dtype)
    if key not in _HF:
        model = transformers.Mistral3ForConditionalGeneration.from_pretrained(
            os.path.join(FIXTURES, name), dtype=torch.float32
        ).eval()
        if weights_dtype is not None:
            with torch.no_grad():
                for pname, param in model.named_parameters():
                    # the converter keeps 1-D norm weights in f32, rounds matrices and the conv
                    if param.dim() >= 2:
                        param.copy_(param.to(weights_dtype).float())
        _HF[key] = model
    return _HF[key]


def hf_features(model, pixel_list: list[torch.Tensor]) -> list[torch.Tensor]:
    """HF's multi-image path: padded batch + image_sizes (block-diagonal attention inside)."""
    hmax = max(p.shape[1] for p in pixel_list)
    wmax = max(p.shape[2] for p in pixel_list)
    batch = torch.zeros(len(pixel_list), 3, hmax, wmax)
    for i, p in enumerate(pixel_list):
        batch[i, :, : p.shape[1], : p.shape[2]] = p
    sizes = torch.tensor([list(p.shape[1:]) for p in pixel_list])
    with torch.no_grad():
        out = model.model.get_image_features(pixel_values=batch, image_sizes=sizes, vision_feature_layer=-1)
    return list(out.pooler_output)


def hf_param_to_gguf(hf_name: str) -> str | None:
    """HF Mistral3 parameter name → llama.cpp mmproj tensor name (None: not a vision weight)."""
    table = {
        "vision_tower.patch_conv": "v.patch_embd", "vision_tower.ln_pre": "v.pre_ln",
        "multi_modal_projector.norm": "mm.input_norm",
        "multi_modal_projector.patch_merger.merging_layer": "mm.patch_merger",
        "multi_modal_projector.linear_1": "mm.1", "multi_modal_projector.linear_2": "mm.2",
    }
    block = {
        "attention_norm": "ln1", "attention.q_proj": "attn_q", "attention.k_proj": "attn_k",
        "attention.v_proj": "attn_v", "attention.o_proj": "attn_out", "ffn_norm": "ln2",
        "feed_forward.gate_proj": "ffn_gate", "feed_forward.up_proj": "ffn_up",
        "feed_forward.down_proj": "ffn_down",
    }
    name = hf_name.removeprefix("model.").removesuffix(".weight")
    if name in table:
        return table[name] + ".weight"
    prefix = "vision_tower.transformer.layers."
    if name.startswith(prefix):
        i, rest = name[len(prefix):].split(".", 1)
        return f"v.blk.{i}.{block[rest]}.weight"
    return None


def hf_model_from_file(name: str, path: str):
    """A fresh HF model whose vision weights are the file's, dequantized by gguf-py (Q/K rows
    un-permuted): HF then runs exactly the numbers a quantized or half file holds."""
    model = transformers.Mistral3ForConditionalGeneration.from_pretrained(
        os.path.join(FIXTURES, name), dtype=torch.float32).eval()
    reader = gguf.GGUFReader(path)
    n_head = model.config.vision_config.num_attention_heads
    tensors = {t.name: t for t in reader.tensors}
    seen = 0
    with torch.no_grad():
        for pname, param in model.named_parameters():
            gname = hf_param_to_gguf(pname)
            if gname is None:
                continue
            t = tensors[gname]
            values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(param.shape)
            if gname.endswith(("attn_q.weight", "attn_k.weight")):  # file = permute(HF): invert
                values = values.reshape(n_head, values.shape[0] // n_head // 2, 2, -1).swapaxes(1, 2).reshape(param.shape)
            param.copy_(torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)))
            seen += 1
    assert seen == len(tensors)
    return model


def token_cosines(ours: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    assert ours.shape == ref.shape
    return F.cosine_similarity(ours.double(), ref.double(), dim=-1)


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's converter does to HF's q_proj/k_proj rows (LlamaModel.permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def make_ollama_copy(src: str, dst, hf_name: str, permuted_qk: bool = False) -> str:
    """The llama.cpp-layout mmproj `src` renamed to Ollama's tensor names, with Q/K rows in HF's
    order (taken from the HF model, after checking they are the file's rows un-permuted)."""
    reader = gguf.GGUFReader(src)
    n_head = int(reader.fields["clip.vision.attention.head_count"].parts[-1][0])
    model = hf_model(hf_name)
    layers = model.model.vision_tower.transformer.layers
    renames, replace = {}, {}
    ollama = LAYOUTS["Ollama"]
    for role, old in LAYOUTS["llama.cpp"].items():
        new = ollama[role]
        for t in reader.tensors:
            for i in range(len(layers)):
                for suffix in (".weight", ".bias"):
                    if t.name == old.format(i=i) + suffix and old != new:
                        renames[t.name] = new.format(i=i) + suffix
    for t in reader.tensors:
        for proj in ("q", "k"):
            for i, layer in enumerate(layers):
                if t.name == f"v.blk.{i}.attn_{proj}.weight":
                    file_rows = np.array(t.data).reshape(tuple(reversed([int(d) for d in t.shape])))
                    hf_rows = getattr(layer.attention, f"{proj}_proj").weight.detach().numpy()
                    # The fact the llama.cpp layout rests on: file = permute(HF).
                    assert np.allclose(llama_cpp_permute(hf_rows.astype(file_rows.dtype), n_head), file_rows, atol=1e-3)
                    if not permuted_qk:
                        replace[t.name] = hf_rows.astype(file_rows.dtype)
    rewrite_gguf(src, dst, rename_tensors=renames, replace_tensors=replace)
    return str(dst)


@pytest.fixture(scope="module")
def ollama_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ollama")
    files = {}
    for name in MODELS:
        files[(name, "f32")] = make_ollama_copy(mmproj(name), folder / f"ollama-{name}-f32.gguf", name)
    files[("mistral3_tiny", "f16")] = make_ollama_copy(
        mmproj("mistral3_tiny", "f16"), folder / "ollama-mistral3_tiny-f16.gguf", "mistral3_tiny")
    return files


def encode_and_compare(tower: VisionTower, model, min_cos: float) -> float:
    images = [png(w, h, seed=i) for i, (w, h) in enumerate(SIZES)]
    pre = [tower.preprocess(d, source=f"img{i}.png") for i, d in enumerate(images)]
    ours = tower.encode_images([p for p, _, _ in pre])  # all images in one call
    refs = hf_features(model, [p for p, _, _ in pre])
    worst = 1.0
    for (pixels, rows, cols), out, ref in zip(pre, ours, refs):
        assert out.shape == (rows * cols, tower.text_hidden)
        cos = token_cosines(out.float(), ref)
        worst = min(worst, cos.min().item())
    assert worst >= min_cos, worst
    return worst


@pytest.mark.parametrize("name", MODELS)
def test_f32_llama_cpp_layout_matches_hf(name):
    tower = VisionTower.load(mmproj(name))
    assert tower.cfg.layout == "llama.cpp"
    assert tower.cfg.activation == ("silu" if name == "mistral3_tiny" else "gelu")
    encode_and_compare(tower, hf_model(name), 0.99999)


@pytest.mark.parametrize("name", MODELS)
def test_f32_ollama_layout_matches_hf(name, ollama_files):
    tower = VisionTower.load(ollama_files[(name, "f32")])
    assert tower.cfg.layout == "Ollama"
    encode_and_compare(tower, hf_model(name), 0.99999)


@pytest.mark.parametrize("layout", ["llama.cpp", "Ollama"])
def test_f16_file(layout, ollama_files):
    path = mmproj("mistral3_tiny", "f16") if layout == "llama.cpp" else ollama_files[("mistral3_tiny", "f16")]
    tower = VisionTower.load(path)
    assert tower.blocks[0].q.data.dtype == torch.float16  # the file's dtype is kept
    encode_and_compare(tower, hf_model("mistral3_tiny", torch.float16), 0.99999)
    encode_and_compare(tower, hf_model("mistral3_tiny"), 0.999)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "BF16"])
def test_quantized_and_bf16_files(tmp_path, qtype):
    """Every linear of the f32 file re-encoded (gguf-py's quantizer); HF runs the file's numbers."""
    src = mmproj("mistral3_tiny")
    reader = gguf.GGUFReader(src)
    kind = gguf.GGMLQuantizationType[qtype]
    replace = {}
    for t in reader.tensors:
        if len(t.shape) == 2:  # the linears; the conv (4-D) and norms (1-D) stay f32
            rows = np.array(t.data).reshape(int(t.shape[1]), int(t.shape[0]))
            replace[t.name] = (gguf.quants.quantize(rows, kind), kind)
    path = str(rewrite_gguf(src, tmp_path / f"mmproj-{qtype}.gguf", replace_tensors=replace))
    tower = VisionTower.load(path)
    assert tower.blocks[0].up.ggml_type == int(kind)
    encode_and_compare(tower, hf_model_from_file("mistral3_tiny", path), 0.99999)


def test_hf_from_file_loader_is_faithful():
    """The helper above, on the f32 file, must give back HF's own model (it maps every tensor)."""
    a = hf_model("mistral3_tiny").state_dict()
    b = hf_model_from_file("mistral3_tiny", mmproj("mistral3_tiny")).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("dtype, min_cos", [(torch.float16, 0.9999), (torch.bfloat16, 0.999)])
def test_half_precision_matmuls(dtype, min_cos):
    """The GPU's dtype handling (half matmuls, float32 residual and norms), run on CPU.
    Measured: f16 0.9999986, bf16 0.99993."""
    tower = VisionTower.load(mmproj("mistral3_tiny", "f16"), dtype=dtype)
    assert tower.dtype == dtype
    encode_and_compare(tower, hf_model("mistral3_tiny", torch.float16), min_cos)


def test_one_call_equals_separate_calls():
    tower = VisionTower.load(mmproj("mistral3_tiny"))
    pixels = [tower.preprocess(png(w, h, seed=9))[0] for w, h in [(90, 90), (30, 110)]]
    together = tower.encode_images(pixels)
    for p, t in zip(pixels, together):
        assert torch.allclose(tower.encode(p), t, atol=1e-5)


def test_wrong_qk_order_is_detected():
    """Negative control: a file whose Q/K rows are in the wrong order for its layout (Ollama names,
    llama.cpp's permuted rows) gives visibly different output — so the cosine test can fail."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = make_ollama_copy(mmproj("mistral3_tiny"), os.path.join(tmp, "bad.gguf"), "mistral3_tiny", permuted_qk=True)
        tower = VisionTower.load(path)
        with pytest.raises(AssertionError):
            encode_and_compare(tower, hf_model("mistral3_tiny"), 0.9999)


def test_unpermute_inverts_the_converter():
    w = np.arange(64 * 3, dtype=np.float32).reshape(64, 3)
    for n_head in (1, 2, 4):
        assert np.array_equal(llama_cpp_permute(w, n_head)[unpermute_rows(64, n_head)], w)


def test_neither_activation_key_means_gelu(tmp_path):
    plain = rewrite_gguf(mmproj("mistral3_tiny_gelu"), tmp_path / "no-act.gguf", drop_kv=["clip.use_gelu"])
    tower = VisionTower.load(plain)
    assert tower.cfg.activation == "gelu"
    encode_and_compare(tower, hf_model("mistral3_tiny_gelu"), 0.99999)


def test_grid_and_properties():
    tower = VisionTower.load(mmproj("mistral3_tiny"))
    assert (tower.image_size, tower.patch_size, tower.merge) == (112, 14, 2)
    assert tower.text_hidden == 64
    assert np.allclose(tower.mean, [0.48145466, 0.4578275, 0.40821073]) and len(tower.std) == 3
    for w, h in SIZES:
        data = png(w, h, seed=1)
        _, rows, cols = tower.preprocess(data)
        assert tower.grid(data) == (rows, cols) == image_grid((w, h), 112, 14, 2)
        assert tower.grid(ImagePart(data, "x.png")) == (rows, cols)


def test_embedding_cache_by_content_hash(monkeypatch):
    tower = VisionTower.load(mmproj("mistral3_tiny"))
    calls = []
    real = tower.encode_images
    monkeypatch.setattr(tower, "encode_images", lambda px: calls.append(len(px)) or real(px))
    a, b = ImagePart(png(60, 60, 1), "a.png"), ImagePart(png(60, 60, 2), "b.png")
    first = tower.encode_image(a)
    again = tower.encode_image(ImagePart(a.data, "renamed.png"))  # same bytes, other name
    assert again is first and calls == [1]
    tower.encode_image(b)
    assert calls == [1, 1]
    both = tower.encode_image_parts([a, b, a])
    assert calls == [1, 1] and both[0] is first and both[2] is first
    assert tower.cache_hits == 4 and tower.cache_misses == 2


def test_cache_is_bounded():
    tower = VisionTower.load(mmproj("mistral3_tiny"), cache_bytes=2 * 12 * 64 * 4)  # two 3x4 images
    parts = [ImagePart(png(100, 60, s), f"{s}.png") for s in range(3)]
    for p in parts:
        tower.encode_image(p)
    assert len(tower._cache) == 2 and parts[0].sha256 not in tower._cache


def test_an_image_larger_than_the_cache_is_encoded_once(monkeypatch):
    """Not kept (it would not fit), yet returned from the one encode, like a hit that the call's
    new images evict: nothing is encoded twice."""
    tower = VisionTower.load(mmproj("mistral3_tiny"), cache_bytes=64 * 4)  # one 1x1 image
    calls = []
    real = tower.encode_images
    monkeypatch.setattr(tower, "encode_images", lambda px: calls.append(len(px)) or real(px))
    small, big, other = (ImagePart(png(w, h, s), f"{s}.png") for s, (w, h) in enumerate([(28, 28), (100, 60), (28, 28)]))
    assert tower.grid(small) == tower.grid(other) == (1, 1) and tower.grid(big) == (3, 4)
    kept = tower.encode_image(small)
    out = tower.encode_image_parts([small, big])
    assert calls == [1, 1] and out[0] is kept and list(tower._cache) == [small.sha256]
    assert torch.equal(out[1], real([tower.preprocess(big)[0]])[0])
    again = tower.encode_image_parts([other, small])  # other, new, evicts small
    assert calls == [1, 1, 1] and again[1] is kept and list(tower._cache) == [other.sha256]


def test_bad_image_error_names_the_file():
    tower = VisionTower.load(mmproj("mistral3_tiny"))
    with pytest.raises(EngineError, match="notes.txt.*not an image"):
        tower.encode_image(ImagePart(b"just some text", "notes.txt"))


# --- refusals ----------------------------------------------------------------------------


def refusal(tmp_path, **edits) -> str:
    path = rewrite_gguf(mmproj("mistral3_tiny"), tmp_path / "edited.gguf", **edits)
    with pytest.raises(EngineError) as err:
        VisionTower.load(path)
    message = str(err.value)
    assert str(path) in message
    return message


def test_refuses_missing_tensor(tmp_path):
    message = refusal(tmp_path, drop_tensors=["v.blk.1.ffn_up.weight"])
    assert "v.blk.1.ffn_up.weight" in message and "llama.cpp layout" in message and "Ollama layout" in message


def test_refuses_missing_patch_embedding(tmp_path):
    message = refusal(tmp_path, drop_tensors=["v.patch_embd.weight"])
    assert "v.patch_embd" in message and "v.patch_conv" in message


@pytest.mark.parametrize("bias", [("mm.1.bias", 64), ("mm.2.bias", 64), ("v.blk.0.attn_q.bias", 32)])
def test_refuses_linear_biases(tmp_path, bias):
    name, size = bias
    message = refusal(tmp_path, add_tensors={name: np.zeros(size, dtype=np.float32)})
    assert name in message and "bias" in message and "Ollama layout" in message


def test_refuses_unknown_projector_type(tmp_path):
    message = refusal(tmp_path, set_kv={"clip.projector_type": "ldp"})
    assert "'ldp'" in message and "pixtral" in message


def test_refuses_both_activations(tmp_path):
    message = refusal(tmp_path, set_kv={"clip.use_gelu": True})
    assert "use_gelu" in message and "use_silu" in message


def test_refuses_wrong_shape(tmp_path):
    message = refusal(tmp_path, replace_tensors={"mm.2.weight": np.zeros((64, 32), dtype=np.float32)})
    assert "mm.2.weight" in message and "(64, 32)" in message


def test_refuses_a_text_model():
    with pytest.raises(EngineError, match="general.architecture is 'mistral3'"):
        VisionTower.load(os.path.join(FIXTURES, "mistral3_tiny-f32.gguf"))


def test_refuses_a_missing_file(tmp_path):
    with pytest.raises(EngineError, match="nothere.gguf"):
        VisionTower.load(tmp_path / "nothere.gguf")
