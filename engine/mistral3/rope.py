"""RoPE / YaRN tables of a Mistral 3 decoder: inverse frequencies, the attention factor and the
query scale, as per-position cos / sin tables in the file's interleaved-pair layout.

Facts this module relies on (see docs/mistral3.md of the shared notes):
- YaRN follows transformers' `_compute_yarn_parameters` (truncated correction range, linear
  ramp between beta_fast and beta_slow, attention factor applied to cos and sin). GGUF keeps
  HF's `mscale_all_dim` in `rope.scaling.yarn_log_multiplier` and has no `mscale` (llama.cpp
  takes it as 1): attention factor = get_mscale(f, 1) / get_mscale(f, log_mul), or
  get_mscale(f) when log_mul is 0, unless the file states `yarn_attn_factor` explicitly.
- Ministral 3's query scale `1 + beta * ln(1 + floor(pos / original_context))` multiplies q
  after RoPE; being one number per position it is folded into the query's cos/sin tables.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .config import TextConfig


def _yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_inv_freq(cfg: TextConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (rope_dim/2,) float32 and the attention factor for cos/sin.

    Plain RoPE: theta^(-2i/d), factor 1. YaRN: transformers' `_compute_yarn_parameters`."""
    dim, base = cfg.rope_dim, cfg.rope_theta
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim)
    if cfg.rope_scaling != "yarn":
        return 1.0 / pos_freqs, 1.0
    factor = cfg.yarn_factor
    if cfg.yarn_attn_factor is not None:
        attention_factor = cfg.yarn_attn_factor
    elif cfg.yarn_log_multiplier:
        attention_factor = _yarn_get_mscale(factor, 1.0) / _yarn_get_mscale(factor, cfg.yarn_log_multiplier)
    else:
        attention_factor = _yarn_get_mscale(factor)
    beta_fast = cfg.yarn_beta_fast or 32.0
    beta_slow = cfg.yarn_beta_slow or 1.0
    original = cfg.yarn_original_context

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation_weight = 1 - ramp
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    inv_freq = (inv_freq_interpolation * (1 - extrapolation_weight)
                + inv_freq_extrapolation * extrapolation_weight)
    return inv_freq, float(attention_factor)


def query_scale(cfg: TextConfig, positions: torch.Tensor) -> torch.Tensor | None:
    """Ministral 3 / Llama 4 position-dependent query scale, or None when the file has none."""
    beta, original = cfg.attn_temperature_scale, cfg.yarn_original_context
    if not beta or original <= 0:
        return None
    return 1 + beta * torch.log(1 + torch.floor(positions.to(torch.float32) / original))


@dataclass
class RopeTables:
    """Per-position tables (n, rope_dim) in the file's interleaved-pair layout: cos repeated
    for both members of a pair, sin with the sign of its member (-s for x[2i], +s for x[2i+1]).
    Keys use them as is; queries have the query scale folded in. Built in float32 like
    transformers, then cast to the compute dtype."""

    cos_k: torch.Tensor
    sin_k: torch.Tensor
    cos_q: torch.Tensor
    sin_q: torch.Tensor

    @property
    def length(self) -> int:
        return self.cos_k.shape[0]


def build_rope_tables(cfg: TextConfig, n_positions: int, dtype: torch.dtype,
                      device: torch.device) -> RopeTables:
    inv_freq, attention_factor = rope_inv_freq(cfg)
    positions = torch.arange(n_positions, dtype=torch.int64).to(torch.float32)
    angles = positions[:, None] * inv_freq[None, :]  # one f32 product each, as HF's outer matmul
    cos = angles.cos() * attention_factor
    sin = angles.sin() * attention_factor
    cos_full = cos.repeat_interleave(2, dim=-1)
    sin_signed = torch.stack((-sin, sin), dim=-1).flatten(-2)
    scale = query_scale(cfg, torch.arange(n_positions))
    if scale is None:
        cos_q, sin_q = cos_full, sin_signed
    else:
        cos_q, sin_q = cos_full * scale[:, None], sin_signed * scale[:, None]

    def put(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=dtype).contiguous()

    return RopeTables(put(cos_full), put(sin_signed), put(cos_q), put(sin_q))
