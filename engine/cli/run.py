"""`tramontane-cli run | perplexity | bench` on a local GGUF (or, for run, a server)."""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from ..api import ChatMessage, EngineError, ImagePart, SamplingParams
from ..mistral3.config import find_mmproj


def add_parsers(sub) -> None:
    from .remote import add_remote_arguments

    p = sub.add_parser("run", help="answer a prompt (streams to stdout)")
    p.add_argument("--model", required=True, help="GGUF file (or the model name on --server)")
    p.add_argument("--mmproj", help="Pixtral projector GGUF (default: found beside the model)")
    p.add_argument("--image", action="append", default=[], metavar="IMG")
    p.add_argument("--system", help="system prompt")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto")
    p.add_argument("--context-length", type=int)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    add_remote_arguments(p)
    p.set_defaults(func=run_main)

    p = sub.add_parser("perplexity", help="perplexity of a text file")
    p.add_argument("--model", required=True)
    p.add_argument("--file", required=True)
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto")
    p.add_argument("--context-length", type=int,
                   help="window size (default: the context that fits in memory, at most the model's)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=perplexity_main)

    p = sub.add_parser("bench", help="prefill/decode speed, TTFT, memory")
    p.add_argument("--model", help="GGUF file (not needed with --kernels)")
    p.add_argument("--mmproj")
    p.add_argument("--image", action="append", default=[], help="also time an image prompt")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--gen-tokens", type=int, default=64)
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=bench_main)


def _mmproj_for(args, needed: bool) -> Path | None:
    if args.mmproj:
        return Path(args.mmproj)
    found = find_mmproj(args.model)
    if found is not None:
        print(f"using projector {found}", file=sys.stderr)
        return found
    if needed:
        raise EngineError(f"{args.model}: this model has no vision projector (none given with --mmproj "
                          f"and none found beside it: mistral3-mmproj.gguf or *mmproj*istral*.gguf)")
    return None


def _check_context_length(args, least: int) -> None:
    n = getattr(args, "context_length", None)
    if n is not None and n < least:
        raise EngineError(f"--context-length must be at least {least}, got {n}")


def _load(args, images: bool):
    from ..runtime.local import LocalEngine

    if not Path(args.model).is_file():
        raise EngineError(f"{args.model}: no such model file")
    _check_context_length(args, 1)
    # A text-only prompt never needs a projector: one found beside the model (maybe of another
    # model) is only loaded for images; an explicit --mmproj is always loaded (and checked).
    mmproj = _mmproj_for(args, needed=images) if (images or args.mmproj) else None
    try:
        return LocalEngine(args.model, mmproj, device=args.device,
                           context_length=getattr(args, "context_length", None))
    except EngineError as exc:
        if mmproj is not None and not args.mmproj and str(mmproj) in str(exc):
            raise EngineError(f"{exc} (that projector was found beside the model: "
                              f"give the right one with --mmproj)") from None
        raise


def run_main(args) -> int:
    if getattr(args, "server", None):
        from .remote import run_remote

        return run_remote(args)
    images = [ImagePart.from_path(p) for p in args.image]
    engine = _load(args, images=bool(images))
    messages = []
    if args.system:
        messages.append(ChatMessage.text("system", args.system))
    messages.append(ChatMessage("user", [*images, args.prompt] if images else [args.prompt]))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, min_p=args.min_p,
                            repetition_penalty=args.repetition_penalty, seed=args.seed,
                            ignore_eos=args.ignore_eos)

    def show(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    result = engine.chat(messages, params, on_piece=None if args.json else show)
    s = result.stats
    if args.json:
        print(json.dumps({
            "text": result.text,
            "prompt_token_ids": result.prompt_token_ids,
            "token_ids": result.token_ids,
            "finish_reason": s.finish_reason,
            "prompt_tokens": s.prompt_tokens,
            "ttft_s": s.ttft_s,
            "prefill_tok_s": s.prefill_tok_s,
            "decode_tok_s": s.decode_tok_s,
        }))
    else:
        print()
        print(f"[{s.prompt_tokens} prompt tokens, {s.generated_tokens} generated, TTFT {s.ttft_s:.3f}s, "
              f"prefill {s.prefill_tok_s:.1f} tok/s, decode {s.decode_tok_s:.1f} tok/s, "
              f"{s.finish_reason}]", file=sys.stderr)
    return 0


NLL_SLICE = 512  # rows of logits alive at once: (slice, vocab) float32, not (window, vocab)


def token_nll(model, ids: list[int], window: int, stride: int) -> tuple[float, int]:
    """Sum of -log p(token | everything before it within the window) over ids[1:].

    One window when the text fits. Otherwise windows of `window` tokens start every `stride`
    tokens and each scores only the tokens the previous window did not (the standard strided
    evaluation): every token after the first is scored exactly once, with at least
    window - stride tokens of context except in the first window. A window runs through a KV
    cache in slices, so only a slice's logits are ever in memory."""
    total, scored = 0.0, 0
    n = len(ids)
    cache = model.new_cache(min(window, n))
    begin = 0
    prev_end = 1  # ids[0] (BOS) is never scored
    while prev_end < n:
        end = min(begin + window, n)
        chunk = ids[begin:end]
        first = prev_end - begin  # position in chunk of the first unscored target
        cache.truncate(0)
        for lo in range(0, len(chunk) - 1, NLL_SLICE):
            hi = min(lo + NLL_SLICE, len(chunk) - 1)  # rows lo..hi-1 predict chunk[lo+1..hi]
            logits = model.forward(model.embed(chunk[lo:hi]), lo, cache, all_logits=True)
            if hi <= first - 1:
                continue  # context only: these targets were scored by the previous window
            logp = torch.log_softmax(logits.float(), dim=-1)
            targets = torch.tensor(chunk[lo + 1:hi + 1], device=logp.device)
            per_token = -logp.gather(1, targets[:, None]).squeeze(1)
            skip = max(first - 1 - lo, 0)
            total += float(per_token[skip:].double().sum())
            scored += len(per_token) - skip
        prev_end = end
        if end == n:
            break
        begin += stride
    return total, scored


def perplexity_main(args) -> int:
    from ..gguf import open_gguf
    from ..mistral3.text import Mistral3Text
    from ..mistral3.config import text_config
    from ..mistral3.tokenizer import Tokenizer

    path = Path(args.file)
    _check_context_length(args, 2)  # a window scores tokens after its first
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EngineError(f"{path}: cannot read as UTF-8 text: {exc}") from None
    gf = open_gguf(args.model)
    text_config(gf)  # a projector or another architecture: say so, before the tokenizer complains
    tok = Tokenizer.from_gguf(gf)
    model = Mistral3Text.load(gf, device=args.device)
    ids = [tok.bos_id] + tok.encode(text)
    if len(ids) < 2:
        raise EngineError(f"{path}: no text to score")
    # Default window: the context the engine would use (what fits in memory, capped by the
    # file's context_length), so a text that fits is scored in one window.
    window = min(args.context_length or model.default_context_length(), model.cfg.context_length)
    window = max(window, 2)
    stride = max(window // 2, 1)
    nll, n = token_nll(model, ids, window, stride)
    if not math.isfinite(nll):
        raise EngineError(f"{args.model}: the model produced invalid logits (NaN/inf) on {path}: "
                          f"the weights may be corrupt, or the compute dtype overflowed")
    ppl = math.exp(nll / n)
    if args.json:
        print(json.dumps({"perplexity": ppl, "tokens": n, "window": window, "stride": stride}))
    else:
        print(f"perplexity {ppl:.4f} over {n} tokens (window {window}, stride {stride})")
    return 0


def copy_bandwidth(device: torch.device, nbytes: int | None = None, repeats: int = 10) -> float:
    """Measured device-to-device copy GB/s (read + write counted), the decode bound's yardstick."""
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
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_main(args) -> int:
    from ..runtime.local import LocalEngine

    if not args.model:
        raise EngineError("bench needs --model (kernel benchmarks: python bench/kernels.py)")
    if args.prompt_tokens < 1:
        raise EngineError(f"--prompt-tokens must be at least 1, got {args.prompt_tokens}")
    if args.gen_tokens < 0:
        raise EngineError(f"--gen-tokens must be >= 0, got {args.gen_tokens}")
    images = [ImagePart.from_path(p) for p in args.image]
    mmproj = _mmproj_for(args, needed=bool(images)) if (images or args.mmproj) else None
    engine = LocalEngine(args.model, mmproj, device=args.device,
                         context_length=args.prompt_tokens + args.gen_tokens + 64
                         + (4096 * len(images) if images else 0))
    device = engine.model.device
    # prompt + warm-up step + timed steps must fit the cache
    if args.prompt_tokens + 1 + args.gen_tokens > engine.cache.capacity:
        raise EngineError(f"{args.model}: --prompt-tokens {args.prompt_tokens} + --gen-tokens {args.gen_tokens} "
                          f"(+1 warm-up) exceed the context length of {engine.cache.capacity}")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    # A prompt of exactly prompt_tokens ids: ordinary text tokens, no chat template.
    vocab_lo = 1000 if engine.model.cfg.vocab_size > 2000 else 20
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(vocab_lo, engine.model.cfg.vocab_size, (args.prompt_tokens,), generator=gen).tolist()
    model, cache = engine.model, engine.cache
    cache.truncate(0)
    t0 = time.perf_counter()
    logits = model.forward(model.embed(prompt), 0, cache)
    _sync(device)
    ttft = time.perf_counter() - t0
    token = int(logits.argmax())
    model.decode(token, cache)  # warm-up (CUDA graph capture happens here)
    _sync(device)
    t1 = time.perf_counter()
    for _ in range(args.gen_tokens):
        token = int(model.decode(token, cache).argmax())
    _sync(device)
    decode_s = time.perf_counter() - t1
    out = {
        "model": str(args.model),
        "device": str(device),
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
