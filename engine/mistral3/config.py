"""What a GGUF file is: a Mistral 3 text model (mistral3 or llama-labelled), a Pixtral
projector, or something we refuse — decided from the file's own evidence."""
from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..api import EngineError
from ..gguf import GGUFError, GGUFFile

MISTRAL3_ARCHS = ("mistral3",)
REQUIRED_CONTROL_TOKENS = ("[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]")
BLOCK0_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                  "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
ACCEPTED = ("general.architecture 'mistral3', or 'llama' with the Mistral 3 evidence "
            "(tokenizer.ggml.pre 'tekken', [INST]/[SYSTEM_PROMPT] control tokens, dense SwiGLU "
            "blocks, no experts, no rope_freqs, no Q/K norms)")


@dataclass(frozen=True)
class TextConfig:
    """Hyper-parameters of a Mistral 3 decoder, read under the file's own key prefix."""

    arch: str  # key prefix in the file: "mistral3" or "llama"
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int  # key length; q width = n_heads * head_dim may differ from hidden
    v_head_dim: int
    ffn: int
    vocab_size: int
    norm_eps: float
    rope_theta: float
    rope_dim: int
    context_length: int
    tied_embeddings: bool  # no `output.weight`: the head reuses token_embd
    # YaRN (rope.scaling.type == "yarn"); None when the file has no scaling.
    rope_scaling: str | None = None
    yarn_factor: float = 1.0
    yarn_original_context: int = 0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_log_multiplier: float = 0.0  # converter writes HF's mscale_all_dim here for mistral3
    yarn_attn_factor: float | None = None  # explicit attention factor, when the file has one
    yarn_ext_factor: float | None = None
    # Position-dependent query scale (Ministral 3 / llama 4 scaling): beta; 0 → off.
    attn_temperature_scale: float = 0.0

    @property
    def q_width(self) -> int:
        return self.n_heads * self.head_dim


def _refuse(gf: GGUFFile, why: str) -> GGUFError:
    return GGUFError(f"{gf.path}: not a Mistral 3 model: {why}. Accepted: {ACCEPTED}.")


def check_mistral3(gf: GGUFFile) -> None:
    """Raise GGUFError unless the file is a Mistral 3 text model (mistral3, or llama by evidence)."""
    arch = gf.architecture
    if arch == "clip":
        raise GGUFError(f"{gf.path}: this is a vision projector (general.architecture 'clip'), "
                        f"not a text model; open the model file and pass this one as --mmproj")
    if arch in MISTRAL3_ARCHS:
        return
    if arch != "llama":
        raise _refuse(gf, f"general.architecture is '{arch}'")
    pre = gf.get("tokenizer.ggml.pre")
    if pre != "tekken":
        raise _refuse(gf, f"architecture 'llama' with tokenizer.ggml.pre {pre!r}, not 'tekken' "
                          f"(a Llama model, not a llama-labelled Mistral 3)")
    vocab = set(gf.get("tokenizer.ggml.tokens") or [])
    missing = [t for t in REQUIRED_CONTROL_TOKENS if t not in vocab]
    if missing:
        raise _refuse(gf, f"architecture 'llama' whose vocabulary lacks {', '.join(missing)}")
    if (gf.arch("expert_count") or 0) > 0 or "blk.0.ffn_gate_inp.weight" in gf.tensors:
        raise _refuse(gf, "architecture 'llama' with mixture-of-experts layers (a Mixtral-style model)")
    if "rope_freqs.weight" in gf.tensors:
        raise _refuse(gf, "architecture 'llama' with a rope_freqs tensor (Llama 3.1-style RoPE)")
    scaling = gf.arch("rope.scaling.type")
    if scaling not in (None, "none", "yarn"):
        raise _refuse(gf, f"architecture 'llama' with rope.scaling.type {scaling!r}")
    if "blk.0.attn_q_norm.weight" in gf.tensors or "blk.0.attn_k_norm.weight" in gf.tensors:
        raise _refuse(gf, "architecture 'llama' with Q/K norms")
    absent = [t for t in BLOCK0_TENSORS if f"blk.0.{t}.weight" not in gf.tensors]
    if absent:
        raise _refuse(gf, f"architecture 'llama' without the dense block tensors {', '.join(absent)}")


def text_config(gf: GGUFFile) -> TextConfig:
    """Recognise the file and read its decoder hyper-parameters (GGUFError otherwise)."""
    check_mistral3(gf)

    def need(suffix: str):
        value = gf.arch(suffix)
        if value is None:
            raise GGUFError(f"{gf.path}: metadata '{gf.architecture}.{suffix}' is missing")
        return value

    def positive_int(suffix: str, value=None) -> int:
        value = need(suffix) if value is None else value
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise GGUFError(f"{gf.path}: metadata '{gf.architecture}.{suffix}' = {value!r} is not a positive integer")
        return int(value)

    hidden = positive_int("embedding_length")
    n_heads = positive_int("attention.head_count")
    n_kv = gf.arch("attention.head_count_kv", n_heads)
    if isinstance(n_kv, (list, tuple)) or hasattr(n_kv, "shape"):
        raise GGUFError(f"{gf.path}: per-layer '{gf.architecture}.attention.head_count_kv' is not supported")
    n_kv = positive_int("attention.head_count_kv", n_kv)
    if n_heads % n_kv:
        raise GGUFError(f"{gf.path}: {n_heads} query heads are not a multiple of {n_kv} KV heads")
    head_dim = positive_int("attention.key_length", gf.arch("attention.key_length", hidden // n_heads))
    v_head_dim = positive_int("attention.value_length", gf.arch("attention.value_length", head_dim))
    tokens = gf.get("tokenizer.ggml.tokens")
    vocab = gf.arch("vocab_size", len(tokens) if tokens else None)
    if "token_embd.weight" not in gf.tensors:
        raise GGUFError(f"{gf.path}: tensor 'token_embd.weight' is missing")
    vocab = positive_int("vocab_size", vocab if vocab is not None else gf.tensors["token_embd.weight"].shape[0])
    n_layers = positive_int("block_count")
    scaling = gf.arch("rope.scaling.type")
    cfg = TextConfig(
        arch=gf.architecture,
        n_layers=n_layers,
        hidden=hidden,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        ffn=positive_int("feed_forward_length"),
        vocab_size=vocab,
        norm_eps=float(gf.arch("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(gf.arch("rope.freq_base", 1e6)),
        rope_dim=int(gf.arch("rope.dimension_count", head_dim)),
        context_length=positive_int("context_length", gf.arch("context_length", 32768)),
        tied_embeddings="output.weight" not in gf.tensors,
        rope_scaling=scaling if scaling not in (None, "none") else None,
        yarn_factor=float(gf.arch("rope.scaling.factor", 1.0)),
        yarn_original_context=int(gf.arch("rope.scaling.original_context_length", 0)),
        yarn_beta_fast=float(gf.arch("rope.scaling.yarn_beta_fast", 32.0)),
        yarn_beta_slow=float(gf.arch("rope.scaling.yarn_beta_slow", 1.0)),
        yarn_log_multiplier=float(gf.arch("rope.scaling.yarn_log_multiplier", 0.0)),
        yarn_attn_factor=_opt_float(gf.arch("rope.scaling.yarn_attn_factor")),
        yarn_ext_factor=_opt_float(gf.arch("rope.scaling.yarn_ext_factor")),
        attn_temperature_scale=float(gf.arch("attention.temperature_scale", 0.0)),
    )
    _check_tensor_shapes(gf, cfg)
    return cfg


def _opt_float(value) -> float | None:
    return None if value is None else float(value)


def _check_tensor_shapes(gf: GGUFFile, cfg: TextConfig) -> None:
    """Every tensor the decoder needs is present with the shape the metadata implies."""
    kv_width = cfg.n_kv_heads * cfg.head_dim
    expected = {"token_embd.weight": (cfg.vocab_size, cfg.hidden), "output_norm.weight": (cfg.hidden,)}
    if not cfg.tied_embeddings:
        expected["output.weight"] = (cfg.vocab_size, cfg.hidden)
    for i in range(cfg.n_layers):
        b = f"blk.{i}."
        expected.update({
            b + "attn_norm.weight": (cfg.hidden,),
            b + "attn_q.weight": (cfg.q_width, cfg.hidden),
            b + "attn_k.weight": (kv_width, cfg.hidden),
            b + "attn_v.weight": (cfg.n_kv_heads * cfg.v_head_dim, cfg.hidden),
            b + "attn_output.weight": (cfg.hidden, cfg.n_heads * cfg.v_head_dim),
            b + "ffn_norm.weight": (cfg.hidden,),
            b + "ffn_gate.weight": (cfg.ffn, cfg.hidden),
            b + "ffn_up.weight": (cfg.ffn, cfg.hidden),
            b + "ffn_down.weight": (cfg.hidden, cfg.ffn),
        })
    for name, shape in expected.items():
        info = gf.tensors.get(name)
        if info is None:
            raise GGUFError(f"{gf.path}: tensor '{name}' is missing")
        if tuple(info.shape) != shape:
            raise GGUFError(f"{gf.path}: tensor '{name}' has shape {tuple(info.shape)}, "
                            f"the metadata implies {shape}")


def is_pixtral_projector(gf: GGUFFile) -> bool:
    return gf.architecture == "clip" and gf.get("clip.projector_type") == "pixtral"


def check_pixtral_projector(gf: GGUFFile) -> None:
    if gf.architecture != "clip":
        raise GGUFError(f"{gf.path}: not a vision projector: general.architecture is "
                        f"'{gf.architecture}', expected 'clip' with clip.projector_type 'pixtral'")
    ptype = gf.get("clip.projector_type")
    if ptype != "pixtral":
        raise GGUFError(f"{gf.path}: projector type {ptype!r} is not supported; "
                        f"expected clip.projector_type 'pixtral' (Mistral 3 / Pixtral)")


# -- Pixtral projector (mmproj) ------------------------------------------------------------

ROPE_THETA = 10000.0  # Pixtral's; the mmproj has no key for it unless a converter adds one

# Per-layout tensor names. "{i}" is the block index.
LAYOUTS: dict[str, dict[str, str]] = {
    "llama.cpp": {
        "patch": "v.patch_embd",
        "pre_norm": "v.pre_ln",
        "attn_norm": "v.blk.{i}.ln1",
        "q": "v.blk.{i}.attn_q",
        "k": "v.blk.{i}.attn_k",
        "v": "v.blk.{i}.attn_v",
        "o": "v.blk.{i}.attn_out",
        "ffn_norm": "v.blk.{i}.ln2",
        "gate": "v.blk.{i}.ffn_gate",
        "up": "v.blk.{i}.ffn_up",
        "down": "v.blk.{i}.ffn_down",
        "mm_norm": "mm.input_norm",
        "merger": "mm.patch_merger",
        "mm1": "mm.1",
        "mm2": "mm.2",
    },
    "Ollama": {
        "patch": "v.patch_conv",
        "pre_norm": "v.encoder_norm",
        "attn_norm": "v.blk.{i}.attn_norm",
        "q": "v.blk.{i}.attn_q",
        "k": "v.blk.{i}.attn_k",
        "v": "v.blk.{i}.attn_v",
        "o": "v.blk.{i}.attn_output",
        "ffn_norm": "v.blk.{i}.ffn_norm",
        "gate": "v.blk.{i}.ffn_gate",
        "up": "v.blk.{i}.ffn_up",
        "down": "v.blk.{i}.ffn_down",
        "mm_norm": "mm.norm",
        "merger": "mm.patch_merger.merging_layer",
        "mm1": "mm.linear_1",
        "mm2": "mm.linear_2",
    },
}
LINEAR_ROLES = ("q", "k", "v", "o", "gate", "up", "down", "merger", "mm1", "mm2")
BLOCK_ROLES = ("attn_norm", "q", "k", "v", "o", "ffn_norm", "gate", "up", "down")


def _layouts_text() -> str:
    return "; ".join(
        f"{name} layout ({names['patch']}, {names['pre_norm']}, {names['attn_norm'].format(i='N')}, "
        f"{names['o'].format(i='N')}, {names['mm_norm']}, {names['merger']}, {names['mm1']}/{names['mm2']})"
        for name, names in LAYOUTS.items()
    )


@dataclass(frozen=True)
class VisionConfig:
    image_size: int
    patch_size: int
    merge: int
    hidden: int
    ffn: int
    n_layers: int
    n_heads: int
    eps: float
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    activation: str  # "gelu" (erf) or "silu"
    rope_theta: float
    text_hidden: int
    layout: str

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads


def _fail(path, what: str) -> EngineError:
    return EngineError(f"{path}: {what}")


def read_config(gf: GGUFFile) -> VisionConfig:
    """Check that `gf` is a Pixtral mmproj we can run and read its hyper-parameters."""
    path = gf.path
    if gf.architecture != "clip":
        raise _fail(path, f"not a vision projector: general.architecture is '{gf.architecture}', "
                          "expected 'clip' with clip.projector_type 'pixtral'")
    ptype = gf.get("clip.projector_type")
    if ptype != "pixtral":
        raise _fail(path, f"clip.projector_type {ptype!r} is not supported; only 'pixtral' "
                          f"(Mistral 3 / Pixtral projectors) is. Accepted: {_layouts_text()}")
    if gf.get("clip.has_vision_encoder") is False:
        raise _fail(path, "clip.has_vision_encoder is false: this projector has no image encoder")
    use_gelu, use_silu = bool(gf.get("clip.use_gelu", False)), bool(gf.get("clip.use_silu", False))
    if use_gelu and use_silu:
        raise _fail(path, "clip.use_gelu and clip.use_silu are both set; the vision activation is ambiguous")
    activation = "silu" if use_silu else "gelu"

    def need_int(key: str) -> int:
        value = gf.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise _fail(path, f"{key} is {'missing' if value is None else repr(value)}; "
                              "a positive integer is required")
        return int(value)

    def triple(key: str) -> tuple[float, float, float]:
        value = gf.get(key)
        try:
            out = tuple(float(v) for v in value)
        except TypeError:
            out = ()
        if len(out) != 3 or not all(math.isfinite(v) for v in out):
            raise _fail(path, f"{key} must be 3 finite numbers (RGB), got {value!r}")
        return out  # type: ignore[return-value]

    hidden = need_int("clip.vision.embedding_length")
    n_heads = need_int("clip.vision.attention.head_count")
    if hidden % n_heads or (hidden // n_heads) % 4:
        raise _fail(path, f"clip.vision.embedding_length {hidden} / attention.head_count {n_heads} "
                          "must give a head size divisible by 4 (2D RoPE)")
    eps = gf.get("clip.vision.attention.layer_norm_epsilon", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.number)) or not 0 <= float(eps) < 1:
        raise _fail(path, f"clip.vision.attention.layer_norm_epsilon is {eps!r}; expected a small positive number")
    theta = gf.get("clip.vision.rope.freq_base", gf.get("clip.rope.freq_base", ROPE_THETA))
    if isinstance(theta, bool) or not isinstance(theta, (int, float, np.number)) or not float(theta) > 1:
        raise _fail(path, f"vision rope.freq_base is {theta!r}; expected a number > 1 (Pixtral: 10000)")
    std = triple("clip.vision.image_std")
    if any(v == 0 for v in std):
        raise _fail(path, f"clip.vision.image_std has a zero: {std}")

    layout = _detect_layout(gf)
    names = LAYOUTS[layout]
    merger_shape = gf.tensors[names["merger"] + ".weight"].shape
    merge_sq = merger_shape[1] // hidden if len(merger_shape) == 2 else 0
    merge = int(round(math.sqrt(merge_sq))) if merge_sq > 0 else 0
    if merge * merge * hidden != (merger_shape[1] if len(merger_shape) == 2 else -1):
        raise _fail(path, f"{names['merger']}.weight has shape {merger_shape}; expected "
                          f"({hidden}, {hidden}·merge²)")
    key_merge = gf.get("clip.vision.spatial_merge_size")
    if key_merge is not None and int(key_merge) != merge:
        raise _fail(path, f"clip.vision.spatial_merge_size {key_merge} disagrees with "
                          f"{names['merger']}.weight shape {merger_shape} (merge {merge})")
    text_hidden = gf.tensors[names["mm2"] + ".weight"].shape[0]
    return VisionConfig(
        image_size=need_int("clip.vision.image_size"),
        patch_size=need_int("clip.vision.patch_size"),
        merge=merge,
        hidden=hidden,
        ffn=need_int("clip.vision.feed_forward_length"),
        n_layers=need_int("clip.vision.block_count"),
        n_heads=n_heads,
        eps=float(eps),
        mean=triple("clip.vision.image_mean"),
        std=std,
        activation=activation,
        rope_theta=float(theta),
        text_hidden=int(text_hidden),
        layout=layout,
    )


def _detect_layout(gf: GGUFFile) -> str:
    found = [name for name, names in LAYOUTS.items() if names["patch"] + ".weight" in gf.tensors]
    if len(found) != 1:
        what = "tensors of both layouts" if found else "no patch embedding tensor"
        raise _fail(gf.path, f"{what}; a Pixtral projector uses one of: {_layouts_text()}")
    layout = found[0]
    names = LAYOUTS[layout]
    biases = sorted(
        n for n in gf.tensors
        if n.endswith(".bias") and n != names["patch"] + ".bias" and (n.startswith("mm.") or n.startswith("v.blk."))
    )
    if biases:
        raise _fail(gf.path, f"linear biases present ({', '.join(biases[:4])}{'…' if len(biases) > 4 else ''}); "
                             "Mistral 3's Pixtral projector has none (is this a Pixtral-12B or other "
                             f"LLaVA projector?). Accepted: {_layouts_text()}")
    n_layers = gf.get("clip.vision.block_count")
    if not isinstance(n_layers, (int, np.integer)) or n_layers <= 0:
        raise _fail(gf.path, f"clip.vision.block_count is {n_layers!r}; a positive integer is required")
    required = [names[r] + ".weight" for r in ("patch", "pre_norm", "mm_norm", "merger", "mm1", "mm2")]
    required += [names[r].format(i=i) + ".weight" for i in range(int(n_layers)) for r in BLOCK_ROLES]
    missing = [n for n in required if n not in gf.tensors]
    if missing:
        raise _fail(gf.path, f"{layout}-layout projector is missing {len(missing)} tensor(s): "
                             f"{', '.join(missing[:6])}{'…' if len(missing) > 6 else ''}. "
                             f"Accepted: {_layouts_text()}")
    return layout


MMPROJ_NAMES = ("mistral3-mmproj.gguf",)
MMPROJ_PATTERNS = ("*mmproj*istral*.gguf",)


def find_mmproj(model_path: str | Path) -> Path | None:
    """The Pixtral projector beside a model: `mistral3-mmproj.gguf`, then `*mmproj*istral*.gguf`."""
    folder = Path(model_path).resolve().parent
    for name in MMPROJ_NAMES:
        if (folder / name).is_file():
            return folder / name
    try:
        names = sorted(p.name for p in folder.iterdir() if p.is_file())
    except OSError:
        return None
    for pattern in MMPROJ_PATTERNS:
        hits = [n for n in names if fnmatch.fnmatch(n, pattern)]
        if hits:
            return folder / hits[0]
    return None


def describe(gf: GGUFFile) -> dict:
    """A summary for `tramontane-cli info` and the model manager."""
    from collections import Counter

    types = Counter(t.type_name for t in gf.tensors.values() if len(t.shape) >= 2)
    info = {
        "file": str(gf.path),
        "architecture": gf.architecture,
        "name": gf.get("general.name"),
        "gguf_version": gf.version,
        "tensors": len(gf.tensors),
        "tensor_bytes": gf.tensor_bytes,
        "file_type": gf.get("general.file_type"),
        "quant_types": dict(types.most_common()),
        "main_quant": types.most_common(1)[0][0] if types else None,
    }
    if gf.architecture == "clip":
        info["kind"] = "pixtral projector" if is_pixtral_projector(gf) else f"clip projector ({gf.get('clip.projector_type')})"
        return info
    try:
        cfg = text_config(gf)
    except GGUFError as exc:
        info["kind"] = "unsupported"
        info["error"] = str(exc)
        return info
    info["kind"] = "mistral3 text model" + (" (llama-labelled)" if cfg.arch == "llama" else "")
    info["config"] = {k: v for k, v in cfg.__dict__.items()}
    tokens = gf.get("tokenizer.ggml.tokens") or []
    info["tokenizer"] = {
        "model": gf.get("tokenizer.ggml.model"),
        "pre": gf.get("tokenizer.ggml.pre"),
        "tokens": len(tokens),
        "bos": gf.get("tokenizer.ggml.bos_token_id"),
        "eos": gf.get("tokenizer.ggml.eos_token_id"),
        "chat_template": (gf.get("tokenizer.chat_template") or "")[:60] or None,
    }
    return info
