"""What a GGUF file is: a Mistral 3 text model (mistral3 or llama-labelled), a Pixtral
projector, or something we refuse — decided from the file's own evidence."""
from __future__ import annotations

import math
from dataclasses import dataclass

import os
from pathlib import Path

from ..api import EngineError
from ..gguf import GGUFError, GGUFFile, open_gguf

MISTRAL3_ARCHS = ("mistral3",)
REQUIRED_CONTROL_TOKENS = ("[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]")
BLOCK0_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                  "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
# Generous ceilings for metadata numbers that are not tied to a tensor's shape; the ones that
# are (every dimension, the block count, the vocabulary) are checked against the file itself.
MAX_DIM = 1 << 32
MAX_CONTEXT = 1 << 24
# The encoder's cost grows with (image_size / patch)^2 tokens, and image_size is tied to no
# tensor: 4096 is 2.7x the largest in use (Mistral Small 3.1's 1540).
MAX_IMAGE_SIDE = 1 << 12
# Prompt rows per forward pass (Mistral3Text.forward runs a longer prompt in chunks of them):
# bounds activation memory on a GPU; the CPU is ~100x slower, smaller passes keep a cancel
# responsive. runtime/memory.py counts a chunk's memory from these.
PREFILL_CHUNK = 2048
CPU_PREFILL_CHUNK = 512
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
    pre = gf.string("tokenizer.ggml.pre", default=None)
    if pre != "tekken":
        raise _refuse(gf, f"architecture 'llama' with tokenizer.ggml.pre {pre!r}, not 'tekken' "
                          f"(a Llama model, not a llama-labelled Mistral 3)")
    vocab = set(gf.array_of("tokenizer.ggml.tokens", "string", default=[]))
    missing = [t for t in REQUIRED_CONTROL_TOKENS if t not in vocab]
    if missing:
        raise _refuse(gf, f"architecture 'llama' whose vocabulary lacks {', '.join(missing)}")
    if gf.uint(gf.arch_key("expert_count"), default=0) > 0 or "blk.0.ffn_gate_inp.weight" in gf.tensors:
        raise _refuse(gf, "architecture 'llama' with mixture-of-experts layers (a Mixtral-style model)")
    if "rope_freqs.weight" in gf.tensors:
        raise _refuse(gf, "architecture 'llama' with a rope_freqs tensor (Llama 3.1-style RoPE)")
    scaling = gf.string(gf.arch_key("rope.scaling.type"), default=None)
    if scaling not in (None, "none", "yarn"):
        raise _refuse(gf, f"architecture 'llama' with rope.scaling.type {scaling!r}")
    if "blk.0.attn_q_norm.weight" in gf.tensors or "blk.0.attn_k_norm.weight" in gf.tensors:
        raise _refuse(gf, "architecture 'llama' with Q/K norms")
    absent = [t for t in BLOCK0_TENSORS if f"blk.0.{t}.weight" not in gf.tensors]
    if absent:
        raise _refuse(gf, f"architecture 'llama' without the dense block tensors {', '.join(absent)}")


def text_config(gf: GGUFFile) -> TextConfig:
    """Recognise the file and read its decoder hyper-parameters (GGUFError otherwise).

    Every count is checked against what the file holds before anything loops over it: the
    block count against the `blk.N.` tensors present, the vocabulary against the tokens array,
    and every dimension against the tensor shapes (`_check_tensor_shapes`)."""
    check_mistral3(gf)
    key = gf.arch_key

    def dim(suffix: str, **default) -> int:
        return gf.uint(key(suffix), 1, MAX_DIM, **default)

    hidden = dim("embedding_length")
    n_heads = dim("attention.head_count")
    n_kv = dim("attention.head_count_kv", default=n_heads)
    if n_heads % n_kv:
        raise GGUFError(f"{gf.path}: {n_heads} query heads are not a multiple of {n_kv} KV heads")
    head_dim = dim("attention.key_length", default=max(hidden // n_heads, 1))
    v_head_dim = dim("attention.value_length", default=head_dim)
    if "token_embd.weight" not in gf.tensors:
        raise GGUFError(f"{gf.path}: tensor 'token_embd.weight' is missing")
    tokens = gf.array_of("tokenizer.ggml.tokens", "string", default=None)
    vocab = dim("vocab_size", default=None)
    if tokens is not None and vocab is not None and vocab != len(tokens):
        raise GGUFError(f"{gf.path}: metadata '{key('vocab_size')}' is {vocab} but "
                        f"tokenizer.ggml.tokens holds {len(tokens)} tokens")
    if vocab is None:
        vocab = len(tokens) if tokens else gf.tensors["token_embd.weight"].shape[0]
    n_layers = _block_count(gf, key("block_count"), "blk.")
    scaling = gf.string(key("rope.scaling.type"), default=None)
    cfg = TextConfig(
        arch=gf.architecture,
        n_layers=n_layers,
        hidden=hidden,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        ffn=dim("feed_forward_length"),
        vocab_size=vocab,
        norm_eps=gf.float(key("attention.layer_norm_rms_epsilon"), 0, 1, above=0, default=1e-5),
        rope_theta=gf.float(key("rope.freq_base"), above=1, default=1e6),
        rope_dim=dim("rope.dimension_count", default=head_dim),
        context_length=gf.uint(key("context_length"), 1, MAX_CONTEXT, default=32768),
        tied_embeddings="output.weight" not in gf.tensors,
        rope_scaling=scaling if scaling != "none" else None,
        yarn_factor=gf.float(key("rope.scaling.factor"), above=0, default=1.0),
        yarn_original_context=gf.uint(key("rope.scaling.original_context_length"), 0, MAX_CONTEXT, default=0),
        # 0 means "the default" for both betas (see rope.rope_inv_freq); below 0 has no meaning.
        yarn_beta_fast=gf.float(key("rope.scaling.yarn_beta_fast"), 0, default=32.0),
        yarn_beta_slow=gf.float(key("rope.scaling.yarn_beta_slow"), 0, default=1.0),
        yarn_log_multiplier=gf.float(key("rope.scaling.yarn_log_multiplier"), 0, default=0.0),
        yarn_attn_factor=gf.float(key("rope.scaling.yarn_attn_factor"), above=0, default=None),
        yarn_ext_factor=gf.float(key("rope.scaling.yarn_ext_factor"), default=None),
        attn_temperature_scale=gf.float(key("attention.temperature_scale"), 0, default=0.0),
    )
    _check_tensor_shapes(gf, cfg)
    return cfg


def _block_count(gf: GGUFFile, key: str, prefix: str) -> int:
    """The block count at `key`, refused when the file holds tensors for fewer `prefix`N.
    blocks: every loop over the blocks is bounded by what the file really holds."""
    n_layers = gf.uint(key, 1)
    present = len(gf.block_indices(prefix))
    if n_layers > present:
        raise GGUFError(f"{gf.path}: metadata '{key}' is {n_layers} but the file holds tensors "
                        f"for {present} blocks")
    return n_layers


def _check_tensor_shapes(gf: GGUFFile, cfg: TextConfig) -> None:
    """Every tensor the decoder needs is present with the shape the metadata implies.
    Loops over cfg.n_layers, which text_config bounded by the blocks the file holds."""
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


def projector_type(gf: GGUFFile) -> str | None:
    return gf.string("clip.projector_type", default=None)


def is_pixtral_projector(gf: GGUFFile) -> bool:
    return gf.architecture == "clip" and projector_type(gf) == "pixtral"


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
BLOCK_MATRICES = ("q", "k", "v", "o", "gate", "up", "down")  # a tower block's matmul weights
LINEAR_ROLES = BLOCK_MATRICES + ("merger", "mm1", "mm2")
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


def _fail(path, what: str) -> GGUFError:
    return GGUFError(f"{path}: {what}")


def read_config(gf: GGUFFile) -> VisionConfig:
    """Check that `gf` is a Pixtral mmproj we can run and read its hyper-parameters.
    The block count is checked against the `v.blk.N.` tensors present before any loop;
    every dimension is checked against the tensor shapes when the tower loads."""
    path = gf.path
    if gf.architecture != "clip":
        raise _fail(path, f"not a vision projector: general.architecture is '{gf.architecture}', "
                          "expected 'clip' with clip.projector_type 'pixtral'")
    ptype = projector_type(gf)
    if ptype != "pixtral":
        raise _fail(path, f"clip.projector_type {ptype!r} is not supported; only 'pixtral' "
                          f"(Mistral 3 / Pixtral projectors) is. Accepted: {_layouts_text()}")
    if not gf.bool("clip.has_vision_encoder", default=True):
        raise _fail(path, "clip.has_vision_encoder is false: this projector has no image encoder")
    use_gelu = gf.bool("clip.use_gelu", default=False)
    use_silu = gf.bool("clip.use_silu", default=False)
    if use_gelu and use_silu:
        raise _fail(path, "clip.use_gelu and clip.use_silu are both set; the vision activation is ambiguous")
    activation = "silu" if use_silu else "gelu"

    hidden = gf.uint("clip.vision.embedding_length", 1, MAX_DIM)
    n_heads = gf.uint("clip.vision.attention.head_count", 1, MAX_DIM)
    if hidden % n_heads or (hidden // n_heads) % 4:
        raise _fail(path, f"clip.vision.embedding_length {hidden} / attention.head_count {n_heads} "
                          "must give a head size divisible by 4 (2D RoPE)")
    eps = gf.float("clip.vision.attention.layer_norm_epsilon", 0, 1, default=1e-5)
    theta_key = next((k for k in ("clip.vision.rope.freq_base", "clip.rope.freq_base") if gf.has(k)), None)
    theta = gf.float(theta_key, above=1) if theta_key else ROPE_THETA
    mean = tuple(gf.array_of("clip.vision.image_mean", "float", 3).tolist())
    std = tuple(gf.array_of("clip.vision.image_std", "float", 3).tolist())
    if any(v == 0 for v in std):
        raise _fail(path, f"clip.vision.image_std has a zero: {std}")
    n_layers = _block_count(gf, "clip.vision.block_count", "v.blk.")

    layout = _detect_layout(gf, n_layers)
    names = LAYOUTS[layout]
    merger_shape = gf.tensors[names["merger"] + ".weight"].shape
    merge_sq = merger_shape[1] // hidden if len(merger_shape) == 2 else 0
    merge = math.isqrt(merge_sq)
    if merge < 1 or merge * merge * hidden != (merger_shape[1] if len(merger_shape) == 2 else -1):
        raise _fail(path, f"{names['merger']}.weight has shape {merger_shape}; expected "
                          f"({hidden}, {hidden}·merge²)")
    key_merge = gf.uint("clip.vision.spatial_merge_size", 1, MAX_DIM, default=merge)
    if key_merge != merge:
        raise _fail(path, f"clip.vision.spatial_merge_size {key_merge} disagrees with "
                          f"{names['merger']}.weight shape {merger_shape} (merge {merge})")
    text_hidden = gf.tensors[names["mm2"] + ".weight"].shape[0]
    return VisionConfig(
        image_size=gf.uint("clip.vision.image_size", 1, MAX_IMAGE_SIDE),
        patch_size=gf.uint("clip.vision.patch_size", 1, MAX_IMAGE_SIDE),
        merge=merge,
        hidden=hidden,
        ffn=gf.uint("clip.vision.feed_forward_length", 1, MAX_DIM),
        n_layers=n_layers,
        n_heads=n_heads,
        eps=eps,
        mean=mean,
        std=std,
        activation=activation,
        rope_theta=theta,
        text_hidden=text_hidden,
        layout=layout,
    )


def _detect_layout(gf: GGUFFile, n_layers: int) -> str:
    """Which tensor naming the projector uses; all of its tensors for `n_layers` blocks present
    (`n_layers` is already bounded by the blocks the file holds)."""
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
    required = [names[r] + ".weight" for r in ("patch", "pre_norm", "mm_norm", "merger", "mm1", "mm2")]
    required += [names[r].format(i=i) + ".weight" for i in range(n_layers) for r in BLOCK_ROLES]
    missing = [n for n in required if n not in gf.tensors]
    if missing:
        raise _fail(gf.path, f"{layout}-layout projector is missing {len(missing)} tensor(s): "
                             f"{', '.join(missing[:6])}{'…' if len(missing) > 6 else ''}. "
                             f"Accepted: {_layouts_text()}")
    return layout


def describe(gf: GGUFFile) -> dict:
    """A summary for `tramontane-cli info` and the model manager. A file of another kind is
    described as "unsupported" with the reason; a Mistral 3 model or Pixtral projector whose
    metadata is broken raises GGUFError (naming the key), like loading it would."""
    from collections import Counter

    types = Counter(t.type_name for t in gf.tensors.values() if len(t.shape) >= 2)
    info = {
        "file": str(gf.path),
        "architecture": gf.architecture,
        "name": gf.string("general.name", default=None),
        "gguf_version": gf.version,
        "tensors": len(gf.tensors),
        "tensor_bytes": gf.tensor_bytes,
        "file_type": gf.uint("general.file_type", default=None),
        "quant_types": dict(types.most_common()),
        "main_quant": types.most_common(1)[0][0] if types else None,
    }
    if gf.architecture == "clip":
        if not is_pixtral_projector(gf):
            info["kind"] = f"clip projector ({projector_type(gf)})"
            return info
        info["kind"] = "pixtral projector"
        info["config"] = dict(read_config(gf).__dict__)
        return info
    try:
        check_mistral3(gf)
    except GGUFError as exc:
        info["kind"] = "unsupported"
        info["error"] = str(exc)
        return info
    cfg = text_config(gf)
    info["kind"] = "mistral3 text model" + (" (llama-labelled)" if cfg.arch == "llama" else "")
    info["config"] = dict(cfg.__dict__)
    template = gf.string("tokenizer.chat_template", default="")
    info["tokenizer"] = {
        "model": gf.string("tokenizer.ggml.model", default=None),
        "pre": gf.string("tokenizer.ggml.pre", default=None),
        "tokens": len(gf.array_of("tokenizer.ggml.tokens", "string", default=[])),
        "bos": gf.uint("tokenizer.ggml.bos_token_id", default=None),
        "eos": gf.uint("tokenizer.ggml.eos_token_id", default=None),
        "chat_template": template[:60] or None,
    }
    return info


# -- which projector fits which model (library/projector.py picks among those that fit) --------
class ProjectorMismatchError(EngineError):
    """A projector whose output width is not the model's hidden size."""


def model_hidden_size(model_path: str | os.PathLike) -> int:
    with open_gguf(model_path) as gf:
        return text_config(gf).hidden


def projector_output_width(projector_path: str | os.PathLike) -> int:
    with open_gguf(projector_path) as gf:
        return read_config(gf).text_hidden


def check_pair(model_path: str | os.PathLike, projector_path: str | os.PathLike,
               hidden: int | None = None) -> None:
    """Raise ProjectorMismatchError (naming both files) unless the projector fits the model.
    `hidden`: the model's hidden size when the caller has read its header already."""
    if hidden is None:
        hidden = model_hidden_size(model_path)
    width = projector_output_width(projector_path)
    if width != hidden:
        raise ProjectorMismatchError(
            f"{projector_path}: this projector outputs {width} features but {Path(model_path).name} "
            f"has hidden size {hidden}: it belongs to another model (choose that model's own "
            f"projector, or none for text only)")
