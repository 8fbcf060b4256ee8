"""`tramontane-cli bench`: prefill/decode speed, TTFT and memory of a local GGUF, with llama.cpp
on the same file in the same run when its Python binding is installed."""
from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

from ..api import ChatMessage, EngineError, ImagePart, SamplingParams
from .run import add_local_model_arguments, check_images, note_capped_context, projector_for


DEFAULT_PROMPT_TOKENS, DEFAULT_GEN_TOKENS = 512, 64


def default_sizes(capacity: int, prompt: int | None, gen: int | None) -> tuple[int, int]:
    """Prompt and generated tokens for a context of `capacity`: what was asked, else the
    defaults cut to fit (prompt + 1 warm-up step + the timed steps), at least one of each."""
    if gen is None:
        gen = max(1, min(DEFAULT_GEN_TOKENS, capacity // 8))
    if prompt is None:
        prompt = max(1, min(DEFAULT_PROMPT_TOKENS, capacity - 1 - gen))
    return prompt, gen


def add_parsers(sub) -> None:
    p = sub.add_parser("bench", help="prefill/decode speed, TTFT, memory")
    p.add_argument("--model", required=True, help="GGUF file")
    p.add_argument("--mmproj")
    p.add_argument("--image", action="append", default=[], help="also time an image prompt")
    p.add_argument("--prompt-tokens", type=int, default=None,
                   help=f"prompt length (default: {DEFAULT_PROMPT_TOKENS}, less on a model whose context is shorter)")
    p.add_argument("--gen-tokens", type=int, default=None,
                   help=f"tokens to generate (default: {DEFAULT_GEN_TOKENS}, less on a short context)")
    add_local_model_arguments(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=bench_main)


def copy_bandwidth(device: torch.device, nbytes: int | None = None, repeats: int = 10) -> float:
    """Measured device-to-device copy GB/s (read + write counted), the decode bound's yardstick."""
    import torch

    n = nbytes or (1 << 28 if device.type == "cuda" else 1 << 26)
    a = torch.ones(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    _sync(device)
    t = time.perf_counter()
    for _ in range(repeats):
        b.copy_(a)
    _sync(device)
    return 2 * n * repeats / (time.perf_counter() - t) / 1e9


def _sync(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_main(args) -> int:
    import torch

    from ..runtime.decoder import decode
    from ..runtime.local import LocalEngine

    if args.prompt_tokens is not None and args.prompt_tokens < 1:
        raise EngineError(f"--prompt-tokens must be at least 1, got {args.prompt_tokens}")
    if args.gen_tokens is not None and args.gen_tokens < 0:
        raise EngineError(f"--gen-tokens must be >= 0, got {args.gen_tokens}")
    images = [ImagePart.from_path(p) for p in args.image]
    check_images(images, args.image)
    mmproj = projector_for(args, needed=bool(images)) if (images or args.mmproj) else None
    engine = LocalEngine(args.model, mmproj, device=args.device,
                         context_length=args.context_length or ((args.prompt_tokens or DEFAULT_PROMPT_TOKENS)
                                                                + (args.gen_tokens or DEFAULT_GEN_TOKENS) + 64
                                                                + (4096 * len(images) if images else 0)),
                         device_map=args.device_map, kv_type=args.kv_type)
    note_capped_context(args, engine)
    args.prompt_tokens, args.gen_tokens = default_sizes(engine.context_size, args.prompt_tokens, args.gen_tokens)
    device = engine.model.device
    # prompt + warm-up step + timed steps must fit the cache
    if args.prompt_tokens + 1 + args.gen_tokens > engine.context_size:
        raise EngineError(f"{args.model}: --prompt-tokens {args.prompt_tokens} + --gen-tokens {args.gen_tokens} "
                          f"(+1 warm-up) exceed the context length of {engine.context_size}")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    # A prompt of exactly prompt_tokens ids: ordinary text tokens, no chat template.
    vocab_lo = 1000 if engine.model.cfg.vocab_size > 2000 else 20
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(vocab_lo, engine.model.cfg.vocab_size, (args.prompt_tokens,), generator=gen).tolist()
    model, cache = engine.model, engine.new_sequence()
    t0 = time.perf_counter()
    logits = model.forward(model.embed(prompt), 0, cache)
    _sync(device)
    ttft = time.perf_counter() - t0
    token = int(logits.argmax())
    decode(model, token, cache)  # warm-up (CUDA graph capture happens here)
    _sync(device)
    t1 = time.perf_counter()
    for _ in range(args.gen_tokens):
        token = int(decode(model, token, cache).argmax())
    _sync(device)
    decode_s = time.perf_counter() - t1
    out = {
        "model": str(args.model),
        "device": str(device),
        "placement": engine.placement["summary"],
        "prompt_tokens": args.prompt_tokens,
        "gen_tokens": args.gen_tokens,
        "ttft_s": ttft,
        "prefill_tok_s": args.prompt_tokens / ttft,
        "decode_tok_s": args.gen_tokens / decode_s,
    }
    if device.type == "cuda":
        out["peak_memory_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
        copy_gbs = copy_bandwidth(device)
        per_token_gb = model.weight_bytes / 1e9
        bound = copy_gbs / per_token_gb
        out.update(copy_gb_s=copy_gbs, weight_gb=per_token_gb, bound_tok_s=bound,
                   share_of_bound=out["decode_tok_s"] / bound)
    else:
        import resource

        out["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    if images:
        messages = [ChatMessage("user", [*images, "Describe the image."])]
        t = time.perf_counter()
        engine.chat(messages, SamplingParams(max_tokens=1, temperature=0.0), session_key="bench-image")
        out["image_prompt_ttft_s"] = time.perf_counter() - t
    out.update(_llama_cpp_reference(args, prompt))
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k:>20}: {v:.4g}" if isinstance(v, float) else f"{k:>20}: {v}")
    return 0


def _llama_cpp_reference(args, prompt: list[int]) -> dict:
    """llama.cpp on the same file in the same run, when llama-cpp-python is installed."""
    try:
        import llama_cpp
    except ImportError:
        return {}
    try:
        llm = llama_cpp.Llama(model_path=str(args.model), n_ctx=len(prompt) + args.gen_tokens + 8,
                              n_gpu_layers=-1 if args.device != "cpu" else 0, verbose=False,
                              logits_all=False)
        t = time.perf_counter()
        llm.eval(prompt)
        pre = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(args.gen_tokens):
            token = llm.sample(temp=0.0) if hasattr(llm, "sample") else 0
            llm.eval([token])
        dec = time.perf_counter() - t
        return {"llama_cpp_prefill_tok_s": len(prompt) / pre, "llama_cpp_decode_tok_s": args.gen_tokens / dec}
    except Exception as exc:  # noqa: BLE001 - the reference is optional
        return {"llama_cpp_error": str(exc)}
