"""The Mistral 3 text decoder (mistral3 and llama-labelled GGUF files): the layers' math in order
(RoPE from mistral3/rope.py's tables), the segments of a split model, batched rows.

gpt-fast-like: a config dataclass (`TextConfig` from mistral3/config.py), weights uploaded
tensor by tensor from the memory-mapped file (mistral3/weights.py), small pure functions. Attention: Triton flash
attention on CUDA (kernels/attention.py), the native kernels on the CPU, torch's SDPA where
neither runs. The KV cache it writes into is the caller's (`KVRows`: runtime/kv_cache.py's, made
with the decode graphs by runtime/decoder.py, which also drives one-token decoding).

Facts this module relies on (see docs/mistral3.md of the shared notes):
- llama.cpp's converter permutes the rows of attn_q / attn_k of every head from HF's
  rotate-half layout into interleaved pairs. We keep the file's layout and rotate adjacent
  pairs (x[2i], x[2i+1]) with frequency i, which is exactly HF's rotate-half on (x[i], x[i+d/2]).
  Q·K dot products do not care about the (shared) permutation; V and O are not permuted.
- RoPE/YaRN tables and the query scale: mistral3/rope.py.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch
import torch.nn.functional as F
from ...kernels import attention as _attention_mod
from ...kernels import linear as _linear_mod
from ...kernels.linear import QWeight, linear, linear_add, linears
from ...kernels.triton_compat import triton_usable
from ..api import EngineError
from ..gguf import GGUFError, GGUFFile, open_gguf
from ..host import cuda_has_bf16
from .config import CPU_PREFILL_CHUNK, PREFILL_CHUNK, TextConfig, text_config
from .rope import RopeTables, build_rope_tables
from .weights import LayerWeights, TokenEmbedding, load_weights, native_cpu, want_dense


# ----------------------------------------------------------------------------- device

def resolve_device(device: str | torch.device = "auto") -> torch.device:
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        return torch.device("cpu")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise EngineError(f"device '{device}' was asked for but no CUDA GPU is available "
                              f"(use --device cpu or auto)")
        return torch.device(device)
    raise EngineError(f"unknown device '{device}': use cpu, cuda or auto")


def default_dtype(device: torch.device) -> torch.dtype:
    """f32 on CPU (exactness, and bf16 matmuls are slow there); bf16 on CUDA (what the
    checkpoints are trained in), f16 on GPUs older than Ampere, which have no bf16 units."""
    if device.type == "cpu":
        return torch.float32
    if device.type == "cuda" and not cuda_has_bf16(torch.cuda.get_device_capability(device)):
        return torch.float16
    return torch.bfloat16


# ----------------------------------------------------------------------------- the layers' ops

def _native_f32(*tensors: torch.Tensor) -> bool:
    """The native CPU kernels take these: float32 CPU tensors (and the module is built)."""
    if not _linear_mod.cpu_native.AVAILABLE:
        return False
    for t in tensors:  # a loop, not all(generator): this runs a few times per layer
        if t.dtype != torch.float32 or not t.is_cpu:
            return False
    return True


def _native_kv(q: torch.Tensor, pool_k: torch.Tensor) -> bool:
    """The native attention takes these: a float32 CPU query over a CPU KV pool of float32 or
    float16 (the engine's kv_type)."""
    return q.dtype == torch.float32 and _native_f32_kv(q.device, pool_k)


def _native_f32_kv(device: torch.device, pool_k: torch.Tensor) -> bool:
    """_native_kv for float32 rows on `device`, asked once per pass. Gated by _native_f32 (with
    no tensors: whether the module is built), so one switch turns every native step off."""
    return (device.type == "cpu" and _native_f32() and pool_k.is_cpu
            and pool_k.dtype in _linear_mod.cpu_native.KV_ELEM_SIZES)


def apply_rope_pairs(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs: x (T, H, d), tables (T, d) from RopeTables.
    (x0, x1) -> (x0·c - x1·s, x1·c + x0·s): x·cos + swap(x)·sin_signed, four kernels."""
    if _native_f32(x, cos):
        return _linear_mod.cpu_native.rope_pairs(x, cos, sin_signed)  # the same, bit for bit, one call
    swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return x * cos[:, None, :] + swapped * sin_signed[:, None, :]


def causal_mask_lower_right(rows: int, keys: int, device: torch.device) -> torch.Tensor:
    """Boolean mask (True = attend) for the last `rows` of `keys` positions. A plain tensor:
    torch.nn.attention.bias imports torch._dynamo (and sympy), which the frozen app leaves out."""
    return torch.ones(rows, keys, dtype=torch.bool, device=device).tril(keys - rows)


def flash_attention_on(device: torch.device) -> bool:
    """Attention through the Triton kernels (kernels/attention.py): on CUDA when Triton is there.
    sdpa on CUDA would need a float mask for cached-KV rows, and its only backend for that with
    GQA keeps (heads, T, S) float32 scores."""
    return device.type == "cuda" and triton_usable(device)  # False: no AOT build fits this GPU


def prefill_attention(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, start: int,
                      flash: bool) -> torch.Tensor:
    """Rows q (T, heads, d) at positions [start, start + T), their K/V already in one layer's
    cache (kv_heads, capacity, d): row t attends to [0, start + t]. Returns (T, heads * d_v).
    flash: the Triton kernel (no mask, K/V read in place); else sdpa."""
    T, n_heads, head_dim = q.shape
    if flash:
        return _attention_mod.attention(q, cache_k, cache_v, start).reshape(T, -1)
    n_kv = cache_k.shape[0]
    n_rep = n_heads // n_kv
    end = start + T
    keys = cache_k[:, :end].unsqueeze(0)  # (1, Hkv, S, d)
    values = cache_v[:, :end].unsqueeze(0)
    if T == 1:
        # One new row sees every cached position: no mask. The query heads of a KV group
        # become that group's "rows", so GQA needs no key/value expansion.
        o = F.scaled_dot_product_attention(q.reshape(1, n_kv, n_rep, head_dim), keys, values)
        return o.reshape(1, -1)
    qh = q.transpose(0, 1).unsqueeze(0)  # (1, H, T, d)
    if start == 0:
        o = F.scaled_dot_product_attention(qh, keys, values, is_causal=True, enable_gqa=n_rep > 1)
    else:
        # Rows are the last T of S positions: causal aligned to the bottom right.
        o = F.scaled_dot_product_attention(qh, keys, values, attn_mask=causal_mask_lower_right(T, end, q.device),
                                           enable_gqa=n_rep > 1)
    return o[0].transpose(0, 1).reshape(T, -1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF MistralRMSNorm: normalise in float32, cast back, then scale by the (f32) weight."""
    if _native_f32(x, weight):
        return _linear_mod.cpu_native.rms_norm(x, weight, eps)  # one call, not ~9 small ops
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (weight * xf.to(x.dtype)).to(x.dtype)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The MLP's activation: silu(gate) * up."""
    if gate.dim() == 2 and _native_f32(gate, up):
        return _linear_mod.cpu_native.swiglu(gate, up)  # one pass (rows on the pool), not two ops
    return F.silu(gate) * up


def norm_linears(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weights) -> list[torch.Tensor]:
    """linears(rms_norm(x, norm_weight, eps), weights): a block's norm and its input matmuls."""
    plans = _linear_mod.native_plans(weights, x)
    if plans is not None and _native_f32(norm_weight):
        return _linear_mod.cpu_native.norm_matmuls(x, norm_weight, eps, plans)  # one call for all
    return linears(rms_norm(x, norm_weight, eps), weights)


def norm_swiglu(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, w_gate: QWeight, w_up: QWeight) -> torch.Tensor:
    """swiglu of norm_linears(x, ..., (w_gate, w_up)): an MLP up to its down projection's input."""
    plans = _linear_mod.native_plans((w_gate, w_up), x)
    if plans is not None and _native_f32(norm_weight):
        return _linear_mod.cpu_native.norm_swiglu(x, norm_weight, eps, *plans)  # norm, gate, up, SwiGLU: one call
    return swiglu(*norm_linears(x, norm_weight, eps, (w_gate, w_up)))


# ----------------------------------------------------------------------------- the model

class KVRows(Protocol):
    """What the layers use of a sequence's KV (runtime/kv_cache.py's KVCache): layer i's pools
    `layer_k[i]` / `layer_v[i]` (n_blocks, kv_heads, block, d) on the layer's device, the
    sequence's block table into them, how many positions are valid, and `reserve(n)`, which
    makes the next n positions writable."""

    layer_k: list[torch.Tensor]
    layer_v: list[torch.Tensor]
    length: int
    block: int
    capacity: int
    native_steps: dict  # the native whole-step decode over the pools, per segment (Mistral3Text._native_decode)

    def table(self, device: torch.device) -> torch.Tensor: ...

    def reserve(self, n: int) -> None: ...


Group = tuple["KVRows", int, int]  # (cache, start, n): n rows of one sequence at positions [start, start + n)
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # layer i's attention(q, k, v)


class PassKV:
    """The K/V of one forward pass run without a cache (`forward(..., cache=None)`): per layer one
    block of every position of the pass, on its segment's device, dropped with the pass."""

    def __init__(self, model: "Mistral3Text", positions: int):
        cfg = model.cfg

        def zeros(width: int) -> list[torch.Tensor]:
            return [torch.zeros(1, cfg.n_kv_heads, positions, width, dtype=seg.dtype, device=seg.device)
                    for seg in model.segments for _ in seg.layers]

        self.layer_k, self.layer_v = zeros(cfg.head_dim), zeros(cfg.v_head_dim)
        self.capacity = self.block = positions
        self.length = 0
        self.native_steps = {}

    def table(self, device: torch.device) -> torch.Tensor:
        return torch.zeros(1, dtype=torch.int32, device=device)

    def reserve(self, n: int) -> None:
        if self.length + n > self.capacity:
            raise EngineError(f"context full: {self.length} + {n} tokens exceed {self.capacity}")


def gather_positions(pool: torch.Tensor, table: torch.Tensor, n: int, block: int) -> torch.Tensor:
    """Positions [0, n) of a sequence from one layer's pool (n_blocks, kv_heads, block, d) as a
    (kv_heads, n, d) tensor (a copy: for torch's sdpa, which reads contiguous keys)."""
    nb = -(-n // block)
    rows = pool.index_select(0, table[:nb].long())  # (nb, kv_heads, block, d)
    return rows.permute(1, 0, 2, 3).reshape(pool.shape[1], nb * block, pool.shape[3])[:, :n]


def scatter_positions(pool: torch.Tensor, table: torch.Tensor, start: int, rows: torch.Tensor, block: int) -> None:
    """Write rows (T, kv_heads, d) at positions [start, start + T) of a sequence into one layer's pool."""
    pos = torch.arange(start, start + rows.shape[0], device=pool.device)
    blocks = table.long().index_select(0, pos // block)
    pool[blocks, :, pos % block] = rows.to(pool.dtype)


@dataclass
class Segment:
    """Consecutive layers on one device: a model split across devices has several, and the
    hidden state is copied once at each boundary."""

    name: str  # the plan's device name: "cuda:0", "cpu", or a logical "cpu:1"
    device: torch.device
    dtype: torch.dtype  # compute dtype of these layers (and of their KV cache)
    layers: range
    rope: RopeTables | None = None


def torch_device(name: str) -> torch.device:
    """A plan's device name as a torch device (logical CPUs "cpu:N" are the one CPU)."""
    return torch.device("cpu") if name.startswith("cpu") else resolve_device(name)


class Mistral3Text:
    """Weights + forward of the decoder. One sequence at a time (batch 1).

    `embed(ids)` gives the input rows; image features may be spliced into them before
    `forward(embeds, start_pos, cache)`, which writes K/V at [start_pos, start_pos + T) and
    returns float32 logits of the last row (or all rows).

    `device` / `dtype` are the output head's (where logits come out); `segments` say where
    each layer runs (one segment unless loaded with a device plan), `embedding_device` where
    the token table is looked up."""

    def __init__(self, cfg: TextConfig, device: torch.device, dtype: torch.dtype):
        self.cfg = cfg
        self.device = device
        self.dtype = dtype
        self.segments = [Segment(str(device), device, dtype, range(cfg.n_layers))]
        self.embedding_device = device
        self.layers: list[LayerWeights] = []
        self.embedding: TokenEmbedding | None = None
        self.output_norm: torch.Tensor | None = None
        self.head: QWeight | None = None
        self.rope: RopeTables | None = None
        self.path = None
        self.weight_bytes = 0  # bytes of the file's tensors in use (as stored)
        self.dense_weights = False  # CPU: linear weights dequantized to float32 at load
        self.graph_failures: list[str] = []  # decode buckets whose capture failed (runtime/decoder.py)
        self.planned_context = 0  # the device plan's context (0: no plan; runtime.decoder's default)
        # Prompt rows per pass: bounds activation memory, and how often a cancel is seen.
        self.prefill_chunk = PREFILL_CHUNK if device.type == "cuda" else CPU_PREFILL_CHUNK

    @property
    def on_gpu(self) -> bool:
        """Whether any layer runs on a CUDA device (a model may be split across GPUs and the CPU)."""
        return any(seg.device.type == "cuda" for seg in self.segments)

    # -- loading ------------------------------------------------------------------------------
    @classmethod
    def load(cls, path_or_gf, device: str | torch.device = "auto", dtype: torch.dtype | None = None,
             progress=None, dense_on_cpu: bool | None = None, plan=None) -> "Mistral3Text":
        """Read a mistral3 / llama-labelled Mistral 3 GGUF. Raises GGUFError naming the file.

        progress(fraction, what): called after each layer (fraction in (0, 1]).
        dense_on_cpu: on CPU, dequantize the linear weights to float32 once at load (None:
        when that fits in half the available RAM). The CPU reference matmul otherwise
        dequantizes every weight on every call, ~100x slower per decoded token.
        plan: a runtime.device_map.DevicePlan (layer devices, embedding and head devices);
        overrides `device`. `dtype`, when given, is used on every device."""
        gf = path_or_gf if isinstance(path_or_gf, GGUFFile) else open_gguf(path_or_gf)
        cfg = text_config(gf)
        if cfg.rope_dim != cfg.head_dim:
            raise GGUFError(f"{gf.path}: rope.dimension_count {cfg.rope_dim} differs from the head "
                            f"size {cfg.head_dim}; partial RoPE is not a Mistral 3 layout")
        if cfg.head_dim % 2:
            raise GGUFError(f"{gf.path}: attention.key_length {cfg.head_dim} is odd")
        if cfg.rope_scaling not in (None, "yarn"):
            raise GGUFError(f"{gf.path}: rope.scaling.type {cfg.rope_scaling!r} is not supported "
                            f"(Mistral 3 uses none or yarn)")
        if cfg.rope_scaling == "yarn" and cfg.yarn_original_context <= 0:
            raise GGUFError(f"{gf.path}: rope.scaling.type is yarn but "
                            f"'{cfg.arch}.rope.scaling.original_context_length' is missing or 0")
        if plan is not None:
            device = torch_device(plan.head_device)
        device = resolve_device(device)
        model = cls(cfg, device, dtype or default_dtype(device))
        model.path = gf.path
        if plan is not None:
            model._apply_plan(plan, dtype)
        has_cpu = any(seg.device.type == "cpu" for seg in model.segments)
        model.dense_weights = want_dense(gf, cfg, torch.device("cpu") if has_cpu else device, dense_on_cpu)
        load_weights(model, gf, progress)
        return model

    def _apply_plan(self, plan, dtype: torch.dtype | None) -> None:
        """Segments from the plan's per-layer devices (runs of one device name)."""
        names = plan.layer_devices()
        if len(names) != self.cfg.n_layers:
            raise EngineError(f"device plan for {len(names)} layers, the model has {self.cfg.n_layers}")
        self.segments = []
        start = 0
        for i in range(1, len(names) + 1):
            if i == len(names) or names[i] != names[start]:
                dev = torch_device(names[start])
                self.segments.append(Segment(names[start], dev, dtype or default_dtype(dev), range(start, i)))
                start = i
        self.embedding_device = torch_device(plan.embedding_device)
        self.planned_context = int(getattr(plan, "context_length", 0) or 0)
        if any(seg.device.type == "cpu" for seg in self.segments):
            self.prefill_chunk = CPU_PREFILL_CHUNK

    def segment_of(self, layer: int) -> Segment:
        return next(seg for seg in self.segments if layer in seg.layers)

    # -- context ------------------------------------------------------------------------------
    def kv_bytes_per_token(self, dtype: torch.dtype | None = None, device: torch.device | None = None) -> int:
        """KV bytes one position costs (on `device` only, when given), in each segment's dtype."""
        cfg = self.cfg
        total = 0
        for seg in self.segments:
            if device is None or seg.device == device:
                size = torch.tensor([], dtype=dtype or seg.dtype).element_size()
                total += len(seg.layers) * cfg.n_kv_heads * (cfg.head_dim + cfg.v_head_dim) * size
        return total

    def ensure_rope(self, n: int) -> None:
        """Tables for n positions on every segment's (device, dtype); `rope` is the last one's."""
        if any(seg.rope is None or seg.rope.length < n for seg in self.segments):
            built: dict[tuple, RopeTables] = {}
            for seg in self.segments:
                key = (seg.device, seg.dtype)
                if key not in built:
                    built[key] = build_rope_tables(self.cfg, n, seg.dtype, seg.device)
                seg.rope = built[key]
            self.rope = self.segments[-1].rope

    # -- forward ------------------------------------------------------------------------------
    def embed(self, ids) -> torch.Tensor:
        """(T,) token ids -> (T, hidden) rows in the first layers' dtype, on embedding_device."""
        if not isinstance(ids, torch.Tensor):
            ids = torch.tensor(list(ids), dtype=torch.long)
        ids = ids.to(device=self.embedding_device, dtype=torch.long).reshape(-1)
        return self.embedding(ids)

    @torch.inference_mode()
    def forward(self, embeds, start_pos: int, cache: KVRows | None = None,
                all_logits: bool = False, cancel=None) -> torch.Tensor | None:
        """Run T rows at positions [start_pos, start_pos + T): `embeds` (T, hidden) input rows
        (image features spliced in), or token ids. Returns float32 logits (vocab,)
        for the last row, or (T, vocab) with all_logits.

        The cache must hold exactly start_pos valid positions before the call (truncate it
        first to rewind); afterwards it holds start_pos + T. Without one, the pass keeps its
        K/V in a `PassKV` of its own (positions before start_pos zero).

        `cancel` (a threading.Event) is checked between prefill chunks: when set, returns None
        with the cache holding the rows done so far (a valid prefix)."""
        if not (isinstance(embeds, torch.Tensor) and embeds.is_floating_point()):
            embeds = self.embed(embeds)  # token ids
        if embeds.dim() == 3:
            embeds = embeds.squeeze(0)
        T = embeds.shape[0]
        if T == 0:
            raise EngineError("nothing to run: the prompt is empty")
        if cache is None:
            cache = PassKV(self, min(start_pos + T, self.cfg.context_length))
            cache.length = start_pos
        if start_pos != cache.length:
            raise EngineError(f"forward at position {start_pos} but the KV cache holds {cache.length} "
                              f"positions (truncate it first)")
        if start_pos + T > cache.capacity:
            raise EngineError(f"context full: {start_pos} + {T} tokens exceed the context length "
                              f"{cache.capacity}")
        self.ensure_rope(cache.capacity)
        outs = []
        for lo in range(0, T, self.prefill_chunk):
            if lo and cancel is not None and cancel.is_set():
                return None
            chunk = embeds[lo:lo + self.prefill_chunk]
            n = chunk.shape[0]
            last = lo + n == T
            # Only the last row's logits wanted: the last layer finishes that row alone.
            keep = None if all_logits else ([n - 1] if last else [])
            cache.reserve(n)
            hidden = self._layers(chunk, [(cache, start_pos + lo, n)], keep)
            cache.length = start_pos + lo + n
            if all_logits:
                outs.append(self.output_logits(hidden))
            elif last:
                outs.append(self.output_logits(hidden)[0])
        return torch.cat(outs, 0) if all_logits else outs[0]

    def logits(self, ids, start_pos: int = 0, cache: KVRows | None = None,
               all_logits: bool = False) -> torch.Tensor:
        return self.forward(self.embed(ids), start_pos, cache, all_logits)

    def output_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and the output head: float32 logits of each hidden row (on the head's device)."""
        hidden = hidden.to(device=self.device, dtype=self.dtype)  # no-op unless the head sits apart
        with on_device(self.device):
            return norm_linears(hidden, self.output_norm, self.cfg.norm_eps, (self.head,))[0].float()

    # -- the layer loop -----------------------------------------------------------------------
    def _layers(self, x: torch.Tensor, groups: Sequence[Group], keep: Sequence[int] | None = None) -> torch.Tensor:
        """Every segment on rows x of `groups` (see forward_batch); `keep`: the rows the model's
        last layer finishes (None: all), the hidden state of those rows is returned."""
        first = self.segments[0]
        x = x.to(device=first.device, dtype=first.dtype)
        for k, seg in enumerate(self.segments):
            if k:
                x = _enter_segment(x, seg)
            with on_device(seg.device):
                x = self.run_segment(seg, x, groups, keep)
        return x

    def run_segment(self, seg: Segment, x: torch.Tensor, groups: Sequence[Group],
                    keep: Sequence[int] | None = None) -> torch.Tensor:
        """The segment's layers on rows x of `groups` (each (cache, start, n): n rows at positions
        [start, start + n) of its own cache). One decode row on the CPU runs as the native
        whole-step decode (the same math, bit for bit, in one call); every other shape through
        `layer_loop` with the eager attention of `rows_attention`."""
        if len(groups) == 1 and groups[0][2] == 1 and x.dtype == torch.float32:
            cache, start, _ = groups[0]
            if (step := self._native_decode(seg, cache)) is not None:
                rope = seg.rope
                return step.run(x, start, rope.cos_q, rope.sin_q, rope.cos_k, rope.sin_k, cache.table(seg.device))
        return self.layer_loop(seg, x, self.rows_attention(seg, groups, x.device), keep)

    def layer_loop(self, seg: Segment, x: torch.Tensor, attend: Attend,
                   keep: Sequence[int] | None = None) -> torch.Tensor:
        """THE layer loop (llama.cpp's mistral3.cpp): pre-norm residual blocks, x + W_o attention(norm(x)),
        x + W_down swiglu(norm(x)). `attend(i, q, k, v)` is layer i's attention before W_o (it
        writes the rows' K/V): eager over each sequence's cache, or the static body a CUDA graph
        captures. With `keep`, the model's last layer writes every row's K/V but finishes only
        those rows (its output projection and FFN), as llama.cpp's inp_out_ids does."""
        last = self.cfg.n_layers - 1
        for i in seg.layers:
            layer = self.layers[i]
            q, k, v = self._qkv(layer, x)
            attn = attend(i, q, k, v)
            if keep is not None and i == last:
                if not keep:  # prompt chunks that end no prompt: nothing after their K/V
                    return x[:0]
                rows = list(keep)
                attn, x = attn[rows], x[rows]
            x = linear_add(attn, layer.wo, x)
            x = linear_add(self._mlp_hidden(layer, x), layer.w_down, x)
        return x

    def rows_attention(self, seg: Segment, groups: Sequence[Group], device: torch.device) -> Attend:
        """Eager attention for rows of several sequences: RoPE, the K/V write and causal attention
        per group, each through its own block table. On the CPU the leading one-row groups (the
        decode rows of a step) run as one paged decode call."""
        rope = seg.rope
        spans, lo = [], 0
        for cache, start, n in groups:
            sl = slice(start, start + n)
            spans.append((lo, lo + n, cache, start, (rope.cos_q[sl], rope.sin_q[sl], rope.cos_k[sl], rope.sin_k[sl])))
            lo += n
        flash = flash_attention_on(device)  # once per pass, not per layer and sequence
        native = seg.dtype == torch.float32 and _native_f32_kv(device, groups[0][0].layer_k[seg.layers.start])
        n_decode = 0
        while native and n_decode < len(groups) and groups[n_decode][2] == 1 \
                and groups[n_decode][0].layer_k is groups[0][0].layer_k:  # one pool's sequences
            n_decode += 1
        decode = None
        if n_decode > 1:  # one call for the decode rows: tables (R, M), each row's RoPE row
            caches = [g[0] for g in groups[:n_decode]]
            width = max(len(c.blocks) for c in caches)
            tables = torch.zeros(n_decode, width, dtype=torch.int32)
            for r, c in enumerate(caches):
                tables[r, :len(c.blocks)] = c.table(device)
            positions = torch.tensor([g[1] for g in groups[:n_decode]], dtype=torch.int32)
            at = positions.long()
            decode = (tables, positions, rope.cos_q[at], rope.sin_q[at], rope.cos_k[at], rope.sin_k[at],
                      caches[0].block)
        first = n_decode

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            if len(spans) == 1:
                _, _, cache, start, tables = spans[0]
                return self._attend_rows(q, k, v, tables, cache, i, start, flash)
            outs = []
            rest = spans
            if decode is not None:
                tables_, positions, cq, sq, ck, sk, block = decode
                outs.append(_linear_mod.cpu_native.paged_rope_kv_attend_decode(
                    q[:first], k[:first], v[:first], cq, sq, ck, sk, groups[0][0].layer_k[i],
                    groups[0][0].layer_v[i], tables_, positions, block))
                rest = spans[n_decode:]
            outs += [self._attend_rows(q[a:b], k[a:b], v[a:b], tables, cache, i, start, flash)
                     for a, b, cache, start, tables in rest]
            return torch.cat(outs, 0)

        return attend

    def static_attention(self, seg: Segment, x: torch.Tensor, pos: torch.Tensor, tables: torch.Tensor,
                         cache: KVRows, bucket: int) -> Attend:
        """R rows, row r at the device position pos[r] of the sequence whose block table is
        tables[r] ((R, M) int32 on the device), shapes fixed by `bucket` keys: no host syncs, no
        data-dependent shapes (what a CUDA graph captures). Writes each row's K/V at its position
        through its table, attends over [0, bucket) hiding positions > pos[r]. A row at a
        negative position is padding: its K/V go to the pool's scratch block (no sequence holds
        it) and its output is finite and ignored."""
        cfg = self.cfg
        n_rep = cfg.n_heads // cfg.n_kv_heads
        rope = seg.rope
        block = cache.block
        real = pos.clamp(min=0)
        cos_q, sin_q = rope.cos_q.index_select(0, real), rope.sin_q.index_select(0, real)
        cos_k, sin_k = rope.cos_k.index_select(0, real), rope.sin_k.index_select(0, real)
        blocks = torch.where(pos >= 0, tables.gather(1, (real // block)[:, None])[:, 0].long(), cache.scratch_block)
        rows = torch.where(pos >= 0, real % block, 0)
        flash = flash_attention_on(x.device)
        R = x.shape[0]
        n_blocks = -(-bucket // block)
        visible = None if flash else torch.zeros(R, 1, 1, n_blocks * block, dtype=x.dtype, device=x.device).masked_fill_(
            (torch.arange(n_blocks * block, device=x.device)[None, :] > real[:, None])[:, None, None, :], float("-inf"))

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            q = apply_rope_pairs(q, cos_q, sin_q)
            k = apply_rope_pairs(k, cos_k, sin_k)
            pool_k, pool_v = cache.layer_k[i], cache.layer_v[i]
            pool_k[blocks, :, rows] = k.to(pool_k.dtype)
            pool_v[blocks, :, rows] = v.to(pool_v.dtype)
            if flash:
                o = _attention_mod.paged_decode_attention(q, pool_k, pool_v, tables, pos, block, bucket)
            else:
                # (R, kv_heads, keys, d) gathered through each row's table
                ids = tables[:, :n_blocks].long()
                keys = pool_k[ids].permute(0, 2, 1, 3, 4).reshape(R, cfg.n_kv_heads, n_blocks * block, -1)
                values = pool_v[ids].permute(0, 2, 1, 3, 4).reshape(R, cfg.n_kv_heads, n_blocks * block, -1)
                o = F.scaled_dot_product_attention(q.reshape(R, cfg.n_kv_heads, n_rep, cfg.head_dim).to(keys.dtype),
                                                   keys, values, attn_mask=visible)
            return o.reshape(R, cfg.n_heads * cfg.v_head_dim).to(x.dtype)

        return attend

    def _native_decode(self, seg: Segment, cache: KVRows):
        """The segment's decode step as one native call (kernels.linear.native_decode_layers), made
        once per pool and kernel variant (a pool's tensors are fixed for its life, and the steps are
        stored on it; each run takes the sequence's block table); None where the per-op path runs."""
        if seg.device.type != "cpu" or not native_cpu():
            return None
        key = _linear_mod.cpu_native.variant()
        made = cache.native_steps  # the segment's first layer -> (kernel variant, step)
        if made.get(seg.layers.start, (None,))[0] != key:
            cfg = self.cfg
            made[seg.layers.start] = (key, _linear_mod.native_decode_layers(
                [(ly.attn_norm, ly.ffn_norm, (ly.wq, ly.wk, ly.wv, ly.wo, ly.w_gate, ly.w_up, ly.w_down),
                  cache.layer_k[i], cache.layer_v[i]) for i in seg.layers for ly in (self.layers[i],)],
                cfg.hidden, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.v_head_dim, cfg.norm_eps,
                block_size=cache.block))
        return made[seg.layers.start][1]

    def _qkv(self, layer: LayerWeights, x: torch.Tensor):
        """q, k, v (T, heads, d) of attn_norm(x)."""
        cfg = self.cfg
        q_w, k_w = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        if layer.wqkv is not None:
            h = rms_norm(x, layer.attn_norm, cfg.norm_eps)
            q, k, v = linear(h, layer.wqkv).split([q_w, k_w, cfg.n_kv_heads * cfg.v_head_dim], dim=-1)
        else:
            q, k, v = norm_linears(x, layer.attn_norm, cfg.norm_eps, (layer.wq, layer.wk, layer.wv))
        T = x.shape[0]
        return (q.reshape(T, cfg.n_heads, cfg.head_dim), k.reshape(T, cfg.n_kv_heads, cfg.head_dim),
                v.reshape(T, cfg.n_kv_heads, cfg.v_head_dim))

    def _mlp_hidden(self, layer: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of ffn_norm(x): the down projection's input."""
        eps = self.cfg.norm_eps
        if layer.w_gate_up is not None:
            gate, up = linear(rms_norm(x, layer.ffn_norm, eps), layer.w_gate_up).chunk(2, dim=-1)
            return swiglu(gate, up)
        return norm_swiglu(x, layer.ffn_norm, eps, layer.w_gate, layer.w_up)

    # -- decode rows with static shapes (runtime/cuda_graphs.py captures it) ----------------------
    def decode_static(self, x: torch.Tensor, pos: torch.Tensor, tables: torch.Tensor, cache: KVRows, bucket: int,
                      segment: int | None = None) -> torch.Tensor:
        """R rows, row r at the device position pos[r] (R,) of the sequence with block table
        tables[r] ((R, M) int32), shapes fixed by R, M and `bucket` (the layer loop with
        `static_attention`): the body that a CUDA graph captures. `cache`: any sequence of the pool
        (its pools and block size are read).

        x: (R, hidden) input rows. Returns float32 logits (R, vocab) — or, for one `segment` that
        is not the last, its output rows (a graph per GPU segment). Touches no sequence's length."""
        segs = self.segments if segment is None else [self.segments[segment]]
        for n, seg in enumerate(segs):
            if n:
                x = _enter_segment(x, seg)
            with on_device(seg.device):
                x = self.layer_loop(seg, x, self.static_attention(seg, x, pos.to(seg.device), tables.to(seg.device),
                                                                  cache, bucket))
        if segs[-1] is not self.segments[-1]:
            return x
        return self.output_logits(x)

    # -- several sequences in one pass (continuous batching: runtime/batch.py) ------------------
    @torch.inference_mode()
    def forward_batch(self, embeds: torch.Tensor, groups: Sequence[Group],
                      logits_of: Sequence[int]) -> torch.Tensor:
        """Rows of several sequences in one pass over the weights.

        `embeds` (N, hidden) is the concatenation of every group's input rows; a group
        (cache, start, n) is n rows at positions [start, start + n) of its own cache (a decode
        step: n = 1; a prefill chunk: n > 1), start == cache.length. The matmuls run on all N
        rows at once (each weight read once for every sequence); RoPE, the KV write and the
        attention run per group, over that group's cache only. Returns float32 logits
        (len(logits_of), vocab) of the rows `logits_of` (indices into the N rows)."""
        n_rows = sum(n for _, _, n in groups)
        if embeds.dim() != 2 or embeds.shape[0] != n_rows or n_rows == 0:
            raise EngineError(f"forward_batch: {tuple(embeds.shape)} input rows for groups of {n_rows} rows")
        for cache, start, n in groups:
            if start != cache.length or n <= 0:
                raise EngineError(f"forward_batch: a group of {n} rows at position {start}, its KV cache "
                                  f"holds {cache.length} positions")
            if start + n > cache.capacity:
                raise EngineError(f"context full: {start} + {n} tokens exceed the context length {cache.capacity}")
        self.ensure_rope(max(cache.capacity for cache, _, _ in groups))
        for cache, _, n in groups:
            cache.reserve(n)
        x = self._layers(embeds, groups, list(logits_of))
        for cache, start, n in groups:
            cache.length = start + n
        if not logits_of:  # only prompt chunks that do not end their prompt
            return torch.empty(0, self.cfg.vocab_size, dtype=torch.float32, device=self.device)
        return self.output_logits(x)

    def _attend_rows(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tables, cache: KVRows, layer: int,
                     start: int, flash: bool) -> torch.Tensor:
        """One sequence's rows (of a batch, or a whole pass): RoPE, K/V written at [start, start + T)
        through its block table, causal attention over [0, start + t] for row t; (T, heads * dv)
        before W_o. flash: flash_attention_on(q.device), asked by the caller."""
        pool_k, pool_v = cache.layer_k[layer], cache.layer_v[layer]
        table = cache.table(q.device)
        if _native_kv(q, pool_k):
            # CPU: RoPE, the KV write and attention in one native call, (row, KV head) pairs on
            # the thread pool. sdpa's CPU kernel spends ~90 us a layer on setup at decode sizes,
            # and runs prefill on one thread (torch keeps one beside the pool).
            return _linear_mod.cpu_native.paged_rope_kv_attend(q, k, v, *tables, pool_k, pool_v, table, start,
                                                               cache.block)
        cos_q, sin_q, cos_k, sin_k = tables
        T = q.shape[0]
        scatter_positions(pool_k, table, start, apply_rope_pairs(k, cos_k, sin_k), cache.block)
        scatter_positions(pool_v, table, start, v, cache.block)
        q = apply_rope_pairs(q, cos_q, sin_q)
        if flash:
            return _attention_mod.paged_attention(q, pool_k, pool_v, table, start, cache.block).reshape(T, -1)
        end = start + T
        keys = gather_positions(pool_k, table, end, cache.block).to(q.dtype)
        values = gather_positions(pool_v, table, end, cache.block).to(q.dtype)
        return prefill_attention(q, keys, values, start, False)


def on_device(device: torch.device):
    """Make a GPU the current one while its segment runs: Triton launches on the current
    device, whatever device the tensors are on (a no-op for the CPU and for one GPU)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _enter_segment(x: torch.Tensor, seg: Segment) -> torch.Tensor:
    """The hidden state entering `seg` from the previous segment: one small copy (always a
    copy, so a split between two logical CPU devices costs what a real boundary costs)."""
    return x.to(device=seg.device, dtype=seg.dtype, copy=True)


__all__ = ["Mistral3Text", "KVRows", "PassKV", "gather_positions", "scatter_positions", "resolve_device", "default_dtype",
           "apply_rope_pairs", "rms_norm",
           "swiglu", "norm_linears", "norm_swiglu"]
