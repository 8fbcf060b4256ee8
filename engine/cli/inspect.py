"""`tramontane-cli info | tokenize`: what a GGUF file holds, and how its tokenizer splits text."""
from __future__ import annotations

import json

from ..gguf import open_gguf
from ..runtime.memory import KV_TYPE_BYTES

KV_TYPES = tuple(KV_TYPE_BYTES)  # f32, f16: the choices of run's --kv-type


def add_parsers(sub) -> None:
    p = sub.add_parser("info", help="describe a GGUF file (architecture, sizes, quant types, tokenizer)")
    p.add_argument("model")
    p.add_argument("--json", action="store_true")
    plan = p.add_argument_group("device plan (--plan): where each layer would run on this machine")
    plan.add_argument("--plan", action="store_true", help="print the plan with its arithmetic")
    plan.add_argument("--mmproj", help="projector to count (default: the one beside the model that fits it)")
    plan.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto")
    plan.add_argument("--device-map", metavar="MAP", help="a manual map to check, e.g. cpu=10,cuda:0=30")
    plan.add_argument("--draft-model", metavar="FILE", help="a draft model for speculative decoding, planned beside the model")
    for name, default in (("max-seq-len", 4096), ("max-batch-size", 1), ("max-num-images", 1),
                          ("max-image-length", 1024)):
        plan.add_argument(f"--{name}", type=int, default=default, metavar="N",
                          help=f"budget estimate, not a limit (default {default})")
    plan.add_argument("--kv-type", choices=KV_TYPES, default="f32",
                      help="the KV cache's elements for the layers on the CPU, as run/serve/bench take it: "
                           "f16 plans half the KV bytes (GPU layers keep their own type) (default: %(default)s)")
    p.set_defaults(func=info_main)

    p = sub.add_parser("tokenize", help="token ids of TEXT (without BOS)")
    p.add_argument("--model", required=True)
    p.add_argument("--json", action="store_true")
    p.add_argument("text")
    p.set_defaults(func=lambda a: tokenize_main(a.model, a.text, a.json))


def info_main(args) -> int:
    from ..library.projector import find_projector
    from ..mistral3.config import describe

    with open_gguf(args.model) as gf:
        info = describe(gf)
        plan = None
        if getattr(args, "plan", False) and info.get("architecture") != "clip":
            plan = _plan(args, gf)
            info["plan"] = plan.as_dict()
    if info.get("architecture") != "clip":
        mmproj = find_projector(args.model)
        info["projector_found"] = str(mmproj) if mmproj else None
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    if plan is not None:
        print(plan.explain())
        return 0
    width = max(len(k) for k in info)
    for key, value in info.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for k, v in value.items():
                print(f"  {k}: {v}")
        else:
            print(f"{key.ljust(width)}  {value}")
    return 0 if info.get("kind") != "unsupported" else 1


def _plan(args, gf):
    from ..library.projector import find_projector
    from ..runtime.device_map import Budget, PlanError, plan_for_files

    for name in ("max_seq_len", "max_batch_size", "max_num_images", "max_image_length"):
        if getattr(args, name) < 1:
            raise PlanError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    budget = Budget(args.max_seq_len, args.max_batch_size, args.max_num_images, args.max_image_length,
                    kv_type=args.kv_type)
    mmproj = args.mmproj or find_projector(args.model)
    return plan_for_files(gf, mmproj, args.device, args.device_map, budget, draft_path=args.draft_model)


def tokenize_main(model_path: str, text: str, as_json: bool = False) -> int:
    """Print the ids of `text` (space-separated, or a JSON list). GGUFError / EngineError
    (file unreadable, no usable tokenizer) propagate for the CLI to report in one line."""
    from ..mistral3.tokenizer import Tokenizer

    with open_gguf(model_path) as gf:
        tok = Tokenizer.from_gguf(gf)
    ids = tok.encode(text)
    print(json.dumps(ids) if as_json else " ".join(map(str, ids)))
    return 0
