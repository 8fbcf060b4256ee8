"""Decoder speed vs the memory-bandwidth bound, on a random model with real shapes.

    python bench/model.py                 # CUDA: Mistral-Small-3.1 shapes, Q4_K_M mix (~14 GB)
    python bench/model.py --device cpu    # CPU: a small shape (the full one would take hours)

The weights are random but valid GGUF blocks generated straight on the device, tensor by
tensor, through the same loading code as a file (fusing, type mix), so no 14 GB file is needed.
Decoding one token reads every weight once: the bound is
    tok/s_max = device copy bandwidth / (weight bytes + KV bytes per token),
with the copy bandwidth measured here (read + write bytes of a large device copy).
Not a test: nothing under tests/ imports it.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' support helpers
from support.empty_gguf import q4_k_m_type  # noqa: E402
from tramontane.engine.api import SamplingParams
from tramontane.engine.cli.bench import copy_bandwidth
from tramontane.engine.runtime.decoder import new_cache
from tramontane.engine.runtime.batch import generate
from tramontane.engine.runtime.generate import make_generator, sample
from tramontane.engine.mistral3.text import Mistral3Text, default_dtype, resolve_device
from tramontane.engine.mistral3.weights import load_weights, want_dense
from tramontane.engine.mistral3.config import TextConfig
from tramontane.kernels import ggml_types as gt
from tramontane.kernels.linear import dequantize

SHAPES = {
    # Mistral-Small-3.1-24B: 40 layers, hidden 5120, 32/8 heads of 128, ffn 32768, vocab 131072
    "mistral-small": dict(n_layers=40, hidden=5120, n_heads=32, n_kv_heads=8, head_dim=128,
                          ffn=32768, vocab_size=131072, rope_theta=1e9, context_length=131072),
    # Ministral-3-3B-like
    "ministral-3b": dict(n_layers=26, hidden=3072, n_heads=32, n_kv_heads=8, head_dim=128,
                         ffn=9216, vocab_size=131072, rope_theta=1e6, context_length=262144),
    "small": dict(n_layers=4, hidden=512, n_heads=8, n_kv_heads=2, head_dim=64, ffn=1536,
                  vocab_size=4096, rope_theta=1e6, context_length=4096),
}

# Byte offsets of the f16 block scale `d` (and `dmin`) inside one block.
D_OFFSET = {gt.Q4_0: 0, gt.Q8_0: 0, gt.Q4_K: 0, gt.Q5_K: 0, gt.Q6_K: 208}
DMIN_OFFSET = {gt.Q4_K: 2, gt.Q5_K: 2}
DMIN_OVER_D = {gt.Q4_K: 7.5, gt.Q5_K: 15.5}  # centres d*sc*q - dmin*m


MIXES = {
    "q4_k_m": q4_k_m_type,
    "q4_k": lambda name, n: gt.Q4_K,
    "q6_k": lambda name, n: gt.Q6_K,
    "q8_0": lambda name, n: gt.Q8_0,
    "q4_0": lambda name, n: gt.Q4_0,
}


@dataclass
class _Info:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    nbytes: int


class RandomSource:
    """Looks like a GGUFFile to the loader (`tensors`, `raw`, `array`), but makes each tensor's
    bytes on the device when asked: random quants, f16 scales set so weights have std
    ~ 1/sqrt(fan_in) (embeddings ~ 1), norms ~ 1."""

    def __init__(self, cfg: TextConfig, mix: str, device: torch.device, seed: int = 0):
        self.cfg, self.device = cfg, device
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.path = Path(f"<random {mix}>")
        choose = MIXES[mix]
        shapes = {"token_embd.weight": (cfg.vocab_size, cfg.hidden), "output_norm.weight": (cfg.hidden,),
                  "output.weight": (cfg.vocab_size, cfg.hidden)}
        kv = cfg.n_kv_heads * cfg.head_dim
        for i in range(cfg.n_layers):
            b = f"blk.{i}."
            shapes.update({b + "attn_norm.weight": (cfg.hidden,), b + "ffn_norm.weight": (cfg.hidden,),
                           b + "attn_q.weight": (cfg.n_heads * cfg.head_dim, cfg.hidden),
                           b + "attn_k.weight": (kv, cfg.hidden), b + "attn_v.weight": (kv, cfg.hidden),
                           b + "attn_output.weight": (cfg.hidden, cfg.n_heads * cfg.head_dim),
                           b + "ffn_gate.weight": (cfg.ffn, cfg.hidden), b + "ffn_up.weight": (cfg.ffn, cfg.hidden),
                           b + "ffn_down.weight": (cfg.hidden, cfg.ffn)})
        self.tensors = {}
        for name, shape in shapes.items():
            t = gt.F32 if len(shape) == 1 else choose(name, cfg.n_layers)
            nbytes = 4 * shape[0] if t == gt.F32 else shape[0] * gt.row_bytes(t, shape[1])
            self.tensors[name] = _Info(name, shape, t, nbytes)
        self._unit_std = {}

    def array(self, name: str) -> np.ndarray:
        n = self.tensors[name].shape[0]
        return (1.0 + 0.1 * np.random.default_rng(len(name)).standard_normal(n)).astype(np.float32)

    def _blocks(self, n_blocks: int, qtype: int) -> torch.Tensor:
        size = gt.type_info(qtype).type_size
        return torch.randint(0, 256, (n_blocks, size), dtype=torch.uint8, device=self.device, generator=self.gen)

    def _set_scales(self, raw: torch.Tensor, qtype: int, d: torch.Tensor) -> None:
        off = D_OFFSET[qtype]
        raw[:, off:off + 2] = d.to(torch.float16).view(torch.uint8).reshape(-1, 2)
        if qtype in DMIN_OFFSET:
            off = DMIN_OFFSET[qtype]
            raw[:, off:off + 2] = (d * DMIN_OVER_D[qtype]).to(torch.float16).view(torch.uint8).reshape(-1, 2)

    def unit_std(self, qtype: int) -> float:
        if qtype not in self._unit_std:
            info = gt.type_info(qtype)
            sample = self._blocks(256, qtype)
            self._set_scales(sample, qtype, torch.ones(256, device=self.device))
            w = dequantize(sample.reshape(-1), qtype, (256, info.block_size))
            self._unit_std[qtype] = float(w.std())
        return self._unit_std[qtype]

    def raw(self, name: str) -> torch.Tensor:
        info = self.tensors[name]
        rows, cols = info.shape
        qtype = info.ggml_type
        block = gt.type_info(qtype).block_size
        n_blocks = rows * cols // block
        raw = self._blocks(n_blocks, qtype)
        target = 1.0 if name == "token_embd.weight" else cols ** -0.5
        jitter = torch.empty(n_blocks, device=self.device).uniform_(0.5, 1.5, generator=self.gen)
        self._set_scales(raw, qtype, jitter * (target / self.unit_std(qtype)))
        return raw.reshape(-1)


def build_random_model(shape: str, mix: str, device: torch.device, dtype: torch.dtype,
                       dense: bool | None = None) -> Mistral3Text:
    s = SHAPES[shape]
    cfg = TextConfig(arch="mistral3", n_layers=s["n_layers"], hidden=s["hidden"], n_heads=s["n_heads"],
                     n_kv_heads=s["n_kv_heads"], head_dim=s["head_dim"], v_head_dim=s["head_dim"],
                     ffn=s["ffn"], vocab_size=s["vocab_size"], norm_eps=1e-5, rope_theta=s["rope_theta"],
                     rope_dim=s["head_dim"], context_length=s["context_length"], tied_embeddings=False)
    source = RandomSource(cfg, mix, device)
    model = Mistral3Text(cfg, device, dtype)
    model.dense_weights = want_dense(source, cfg, device, dense)
    load_weights(model, source)
    return model


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _NullTokenizer:
    eos_id = None

    class _Stream:
        def push(self, _id):
            return ""

        def flush(self):
            return ""

    def stream(self):
        return self._Stream()


def linear_weight_bytes(model: Mistral3Text) -> int:
    total = 0
    for layer in model.layers:
        for w in (layer.wqkv, layer.wq, layer.wk, layer.wv, layer.wo, layer.w_gate_up, layer.w_gate,
                  layer.w_up, layer.w_down):
            if w is not None:
                total += w.nbytes
        total += (layer.attn_norm.numel() + layer.ffn_norm.numel()) * 4
    return total + model.head.nbytes


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--shape", choices=sorted(SHAPES), default=None,
                    help="default: mistral-small on CUDA, small on CPU")
    ap.add_argument("--mix", choices=sorted(MIXES), default="q4_k_m")
    ap.add_argument("--prompts", default=None, help="prefill lengths, comma separated")
    ap.add_argument("--decode", type=int, default=None, help="tokens to decode")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--quantized-cpu", action="store_true",
                    help="CPU: keep weights quantized (reference matmul) instead of dense float32")
    ap.add_argument("--no-eager", action="store_true", help="skip the eager (no CUDA graph) decode run")
    args = ap.parse_args(argv)

    device = resolve_device(args.device)
    cuda = device.type == "cuda"
    shape = args.shape or ("mistral-small" if cuda else "small")
    if shape != "small" and not cuda:
        print(f"warning: shape {shape} on CPU dequantizes every weight on every call: very slow")
    prompts = [int(x) for x in (args.prompts or ("512,2048" if cuda else "64,256")).split(",")]
    n_decode = args.decode or (128 if cuda else 16)
    dtype = default_dtype(device)
    print(f"device {device}" + (f" ({torch.cuda.get_device_name(device)})" if cuda else "")
          + f", torch {torch.__version__}, compute {dtype}, shape {shape}, mix {args.mix}")

    bw = copy_bandwidth(device, (2 << 30) if cuda else (256 << 20))
    print(f"device copy bandwidth: {bw:.0f} GB/s (read + write)")

    t = time.perf_counter()
    model = build_random_model(shape, args.mix, device, dtype, dense=False if args.quantized_cpu else None)
    sync(device)
    wbytes = linear_weight_bytes(model)
    print(f"built {model.cfg.n_layers}-layer model in {time.perf_counter() - t:.1f}s: "
          f"{model.weight_bytes / 1e9:.2f} GB of weights as stored ({wbytes / 1e9:.2f} GB read per token"
          f"{', dense float32 on CPU' if model.dense_weights else ''})")
    if cuda:
        print(f"GPU memory allocated: {torch.cuda.memory_allocated(device) / 2**30:.2f} GiB")

    context = min(args.context, model.cfg.context_length)
    cache = new_cache(model, context)
    vocab = model.cfg.vocab_size
    gen = torch.Generator().manual_seed(0)

    # -- prefill / TTFT ----------------------------------------------------------------------
    warm = torch.randint(1000, vocab, (min(prompts),), generator=gen)
    model.logits(warm, 0, cache)  # compile / autotune
    cache.truncate(0)
    sync(device)
    for n in prompts:
        if n + n_decode > context:
            print(f"prompt {n}: skipped (context {context})")
            continue
        ids = torch.randint(1000, vocab, (n,), generator=gen)
        cache.truncate(0)
        sync(device)
        t = time.perf_counter()
        first = int(model.logits(ids, 0, cache).argmax())
        dt = time.perf_counter() - t
        print(f"prefill {n:5d} tokens: TTFT {dt * 1000:8.1f} ms, {n / dt:9.1f} tok/s (first token {first})")

    # -- decode ----------------------------------------------------------------------------------
    prompt = torch.randint(1000, vocab, (min(prompts),), generator=gen).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=n_decode, ignore_eos=True)
    kv_per_pos = model.kv_bytes_per_token()

    def run_decode(label: str) -> None:
        cache.truncate(0)
        generate(model, cache, prompt, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                 _NullTokenizer())  # warm-up (captures the CUDA graph of this bucket)
        cache.truncate(0)
        out = generate(model, cache, prompt, params, _NullTokenizer())
        s = out.stats
        mean_ctx = len(prompt) + len(out.token_ids) / 2
        per_token = wbytes + kv_per_pos * mean_ctx
        bound = bw * 1e9 / per_token
        print(f"decode [{label}] {len(out.token_ids)} tokens after a {len(prompt)}-token prompt: "
              f"{s.decode_tok_s:7.1f} tok/s, bound {bound:7.1f} tok/s "
              f"({per_token / 1e9:.2f} GB/token) -> {s.decode_tok_s / bound:6.1%} of the bound; "
              f"{1000 / max(s.decode_tok_s, 1e-9):.2f} ms/token; TTFT {s.ttft_s * 1000:.1f} ms")

    graphs = cache.decode_graphs
    run_decode("CUDA graphs" if graphs is not None else "eager")
    if graphs is not None and not args.no_eager:
        cache.decode_graphs = None  # the same cache decoded eagerly
        run_decode("eager")
        cache.decode_graphs = graphs

    # -- sampling overhead -------------------------------------------------------------------------
    logits = torch.randn(vocab, device=device)
    g = make_generator(0, device)
    for p in (SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_p=0.95, top_k=40,
                                                               min_p=0.05, repetition_penalty=1.1)):
        seen = torch.zeros(vocab, dtype=torch.bool, device=device)
        sample(logits, p, g, seen)
        sync(device)
        t = time.perf_counter()
        for _ in range(20):
            sample(logits, p, g, seen)
        dt = (time.perf_counter() - t) / 20
        print(f"sampling ({'greedy' if p.greedy else 'temperature+top-k+top-p+min-p+penalty'}): "
              f"{dt * 1000:.2f} ms/token")


if __name__ == "__main__":
    main()
