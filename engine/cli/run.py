"""`tramontane-cli run | perplexity`: a chat turn on a local GGUF or an OpenAI-compatible server
(both through the Engine protocol, with one set of defaults: the app's), and a file's perplexity."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
from pathlib import Path

from ..api import ChatMessage, EngineError, ImagePart, SamplingParams

DEVICES = ("cpu", "cuda", "auto")


class CommandFailed(EngineError):
    """The command ran and failed part-way (a reply cut off, a server error mid-run), not a usage
    error: the CLI exits with 1 instead of 2."""


def add_parsers(sub) -> None:
    from ..remote.transport import DEFAULT_READ_TIMEOUT_S

    defaults = SamplingParams()  # the window's defaults too
    p = sub.add_parser("run", help="answer a prompt (streams to stdout), locally or on --server")
    p.add_argument("--model", required=True, help="GGUF file, or the model name on --server")
    p.add_argument("--mmproj", help="vision projector GGUF (default: the one beside the model that fits it)")
    p.add_argument("--image", action="append", default=[], metavar="IMG")
    p.add_argument("--document", action="append", default=[], metavar="FILE",
                   help="a document (PDF, Word, HTML, CSV, text, source) attached to the message, read whole "
                        "when it fits the context and searched when not, as the window does; its scanned pages "
                        "are read with --mmproj (repeatable)")
    p.add_argument("--system", help="system prompt")
    p.add_argument("--prompt", help="the user's message (after --messages when both are given)")
    p.add_argument("--messages", metavar="M.json",
                   help="an OpenAI messages list: a whole conversation, with tool calls and results")
    p.add_argument("--tools", metavar="T.json", help="an OpenAI tools list: functions the model may call")
    p.add_argument("--tool-choice", default="auto", metavar="CHOICE",
                   help="auto (default), none, required, or a tool's name")
    p.add_argument("--response-format", metavar="S.json",
                   help="constrain the reply: a JSON Schema, or an OpenAI response_format object")
    p.add_argument("--max-tokens", type=int, default=defaults.max_tokens)
    p.add_argument("--temperature", type=float, default=defaults.temperature)
    p.add_argument("--top-k", type=int, default=defaults.top_k)
    p.add_argument("--top-p", type=float, default=defaults.top_p)
    p.add_argument("--min-p", type=float, default=defaults.min_p)
    p.add_argument("--repetition-penalty", type=float, default=defaults.repetition_penalty)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true")
    add_speculation_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    local = p.add_argument_group("local model")
    add_local_model_arguments(local)
    add_kv_disk_argument(local)
    remote = p.add_argument_group("server (OpenAI-compatible)")
    remote.add_argument("--server", metavar="URL", help="e.g. http://127.0.0.1:8000/v1")
    remote.add_argument("--api-key-env", metavar="VAR", help="environment variable that holds the server's API key")
    remote.add_argument("--timeout", type=float, default=DEFAULT_READ_TIMEOUT_S, metavar="S",
                        help="longest silence accepted from the server (seconds)")
    p.set_defaults(func=run_main)

    p = sub.add_parser("perplexity", help="perplexity of a text file")
    p.add_argument("--model", required=True)
    p.add_argument("--file", required=True)
    add_local_model_arguments(p, context_help="window size (default: the context that fits in memory, "
                                              "at most the model's)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=perplexity_main)


def projector_for(args, needed: bool) -> Path | None:
    """--mmproj, else the projector beside the model that belongs to it (library rule)."""
    from ..library.projector import find_projector, projector_candidates

    if args.mmproj:
        return Path(args.mmproj)
    found = find_projector(args.model)
    if found is not None:
        print(f"using projector {found}", file=sys.stderr)
        return found
    if needed:
        others = [p.name for p in projector_candidates(args.model)]
        beside = (f"; it and {', '.join(others)} beside it are from different models: their output "
                  f"width is not its hidden size") if others else ""
        raise EngineError(f"{args.model}: this model has no vision projector (none given with --mmproj, "
                          f"and none beside it whose output width fits the model{beside})")
    return None


def check_images(images: list[ImagePart], paths: list[str]) -> None:
    """A file that is not an image is refused before any model loads (its header is read, the
    way the encoder will read it), naming the file."""
    from ..mistral3.image import image_size_of

    for image, path in zip(images, paths):
        image_size_of(image.data, str(path))


def check_context_length(args, least: int) -> None:
    n = getattr(args, "context_length", None)
    if n is not None and n < least:
        raise EngineError(f"--context-length must be at least {least}, got {n}")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return value


def add_local_model_arguments(parser, context_help: str | None = None) -> None:
    """Where and how a local model runs: the same options for run, perplexity, bench and serve."""
    parser.add_argument("--device", choices=DEVICES, default="auto")
    parser.add_argument("--context-length", type=int,
                        help=context_help or "tokens of context (default: what fits in memory, at most "
                                             "the file's)")
    parser.add_argument("--device-map", metavar="MAP",
                        help="layers per device in layer order, e.g. cpu=10,cuda:0=30 "
                             "(default: planned from free memory; see `info --plan`)")
    parser.add_argument("--threads", type=positive_int, metavar="N",
                        help="CPU threads for the layers on the CPU (default: the physical cores)")
    parser.add_argument("--kv-type", choices=("f32", "f16"), default="f32",
                        help="the KV cache's elements for the layers on the CPU: f16 halves its memory and "
                             "the bytes a long context's decode reads, rounding keys and values to float16 "
                             "(GPU layers keep their own type) (default: %(default)s)")


def add_speculation_arguments(parser) -> None:
    """`run`'s and `serve`'s --spec and --spec-tokens (serve: every request's default)."""
    defaults = SamplingParams()
    parser.add_argument("--spec", choices=("off", "ngram", "draft"), default=defaults.speculation,
                        help="speculative decoding (lossless): ngram drafts from the conversation's own tokens, "
                             "draft from --draft-model")
    parser.add_argument("--draft-model", metavar="FILE",
                        help="a smaller GGUF of the same vocabulary (e.g. Ministral 3 3B for Mistral Small 3.x) "
                             "that drafts tokens for --spec draft")
    parser.add_argument("--spec-tokens", type=int, default=defaults.spec_tokens, metavar="K",
                        help="at most K drafted tokens verified a step (default %(default)s)")


def add_kv_disk_argument(parser) -> None:
    parser.add_argument("--kv-disk", metavar="DIR",
                        help="keep the KV prefix cache's blocks in DIR too (at most 4 GiB), so a "
                             "conversation resent after a restart is not read again")


def load_local(args, images: bool):
    from ..runtime.local import LocalEngine

    if not Path(args.model).is_file():
        raise EngineError(f"{args.model}: no such model file")
    check_context_length(args, 1)
    draft = getattr(args, "draft_model", None)
    if getattr(args, "spec", "off") == "draft" and not draft:
        raise EngineError("--spec draft needs --draft-model FILE (a smaller model of the same vocabulary)")
    if draft and not Path(draft).is_file():
        raise EngineError(f"{draft}: no such draft model file")
    # A text-only prompt never needs a projector: one found beside the model is only loaded for
    # images; an explicit --mmproj is always loaded (and checked).
    mmproj = projector_for(args, needed=images) if (images or args.mmproj) else None
    engine = LocalEngine(args.model, mmproj, device=args.device, context_length=args.context_length,
                         device_map=args.device_map, kv_disk_dir=getattr(args, "kv_disk", None),
                         kv_type=getattr(args, "kv_type", "f32"), draft_model=draft)
    note_capped_context(args, engine)
    return engine


def note_capped_context(args, engine) -> None:
    """Say so when --context-length asked for more than the model file allows (it is capped)."""
    asked, used = getattr(args, "context_length", None), engine.context_size
    if asked and asked > used:
        print(f"note: --context-length {asked} is more than {Path(args.model).name} allows: "
              f"using {used} tokens", file=sys.stderr)


def api_key_of(args) -> str | None:
    """The API key from --api-key-env (refused when that variable is unset), else --api-key
    where the command has one."""
    if args.api_key_env:
        value = os.environ.get(args.api_key_env)
        if not value:
            raise EngineError(f"--api-key-env: the environment variable {args.api_key_env} is not set")
        return value
    return getattr(args, "api_key", None) or None


def connect_remote(args):
    from ..remote.client import RemoteEngine
    from ..remote.transport import DEFAULT_CONNECT_TIMEOUT_S

    return RemoteEngine(args.server, args.model, api_key_of(args),
                        connect_timeout=min(DEFAULT_CONNECT_TIMEOUT_S, args.timeout),
                        read_timeout=args.timeout)


def _json_file(path: str, what: str):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise EngineError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EngineError(f"{path}: {what} is not valid JSON: {exc}") from None


def _from_file(path: str, parse):
    """A request field from a file, checked by the server's own parser; its complaint names the file."""
    from ..server.openai_api import ApiError

    try:
        return parse()
    except ApiError as exc:
        raise EngineError(f"{path}: {exc.message}") from None


def conversation(args) -> tuple[list[ChatMessage], bool]:
    """--system, --messages, then --image/--prompt as one user message; and whether an image is in it."""
    from ..server.openai_api import RequestLimits, parse_messages

    if args.prompt is None and not args.messages:
        raise EngineError("run: give --prompt or --messages")
    messages = []
    if args.system:
        messages.append(ChatMessage.text("system", args.system))
    if args.messages:
        raw = _json_file(args.messages, "the messages")
        messages += _from_file(args.messages, lambda: parse_messages(raw, RequestLimits()))
    images = [ImagePart.from_path(p) for p in args.image]
    check_images(images, args.image)
    documents = read_documents(getattr(args, "document", []))
    if args.prompt is not None or images or documents:
        # images, documents, then the prompt: what the window sends for a message with attachments
        messages.append(ChatMessage("user", [*images, *documents, *([args.prompt] if args.prompt is not None else [])]))
    if messages[-1].role == "assistant":
        raise EngineError(f"{args.messages}: the last message is the assistant's: end with a user or "
                          "tool message (the model writes the reply)")
    return messages, any(m.images for m in messages)


def read_documents(paths: list[str]) -> list:
    """--document files read (engine/documents) before any model loads: a file that does not
    read is its one sentence, naming it."""
    from ..api import DocumentPart
    from ..documents.prompt import read_document

    parts = []
    for path in paths:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise EngineError(f"{path}: cannot read: {exc.strerror or exc}") from None
        parts.append(read_document(DocumentPart(data, Path(path).name)))
    return parts


def documents_in_prompt(engine, messages: list[ChatMessage], max_tokens: int):
    """The conversation with its documents placed by the window's rule (engine_documents_prompt:
    whole, or the excerpts the question finds), and that DocumentPrompt; (messages, None) without."""
    if not any(m.documents for m in messages):
        return messages, None
    from ..documents.prompt import engine_documents_prompt

    placed = engine_documents_prompt(engine, messages, max_tokens)
    for placement in placed.placements.values():
        print(f"[{placement.document.name}: {'read whole' if placement.mode == 'whole' else 'searched'}, "
              f"{placement.tokens} tokens whole]", file=sys.stderr)
    for note in placed.notes:
        print(f"[{note}]", file=sys.stderr)
    return placed.messages, placed


def tool_request(args):
    """--tools, --tool-choice and --response-format as the server reads them (None: none given)."""
    from ..server.tools_api import parse_tool_request

    if not (args.tools or args.response_format or args.tool_choice != "auto"):
        return None
    body = {}
    if args.tools:
        body["tools"] = _json_file(args.tools, "the tools")
    choice = args.tool_choice
    body["tool_choice"] = choice if choice in ("auto", "none", "required") else {
        "type": "function", "function": {"name": choice}}
    if args.response_format:
        spec = _json_file(args.response_format, "the response format")
        if not (isinstance(spec, dict) and spec.get("type") in ("text", "json_object", "json_schema")
                and ("json_schema" in spec or spec["type"] != "json_schema")):
            spec = {"type": "json_schema", "json_schema": {"name": "reply", "schema": spec, "strict": True}}
        body["response_format"] = spec
    from ..server.openai_api import ApiError

    try:
        return parse_tool_request(body)
    except ApiError as exc:
        field = exc.param or ""
        where = (args.response_format if field.startswith("response_format") else
                 "--tool-choice" if field.startswith("tool_choice") else args.tools or "--tools")
        raise EngineError(f"{where}: {exc.message}") from None


def run_sampling(args) -> SamplingParams:
    """The reply's sampling as `run`'s options give it."""
    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                          top_p=args.top_p, min_p=args.min_p,
                          repetition_penalty=args.repetition_penalty, seed=args.seed,
                          stop=list(args.stop), ignore_eos=args.ignore_eos, speculation=args.spec,
                          spec_tokens=args.spec_tokens)


def with_tools(engine, request, params: SamplingParams) -> tuple[SamplingParams, dict]:
    """The params the tool request asks for (its grammar, tool choice) and the chat's extra
    arguments (its tools); the engine is closed if that fails."""
    if request is None:
        return params, {}
    from ..server.tools_api import engine_params

    try:
        params = engine_params(engine.tokenizer, request, params)
    except BaseException:
        engine.close()
        raise
    return params, ({"tools": request.tools} if request.tools else {})


def write_reply(args, engine, request, messages: list[ChatMessage], params: SamplingParams, extra: dict):
    """The reply, streamed to stdout unless --json, with its tool calls read; (result, placed
    documents). The engine is closed after, whatever happens; a --server's failure is
    CommandFailed (not a usage error)."""
    def show(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    cancel = threading.Event()
    try:
        try:
            messages, placed = documents_in_prompt(engine, messages, params.max_tokens)
            result = engine.chat(messages, params, on_piece=None if args.json else show, cancel=cancel, **extra)
            if request is not None:
                from ..server.tools_api import read_tool_calls

                result = read_tool_calls(engine.tokenizer, request, result)
        except KeyboardInterrupt:
            cancel.set()
            raise
        except EngineError as exc:
            if not args.json:
                sys.stdout.write("\n")
            if args.server:  # the server refused or failed mid-run: not a usage error
                raise CommandFailed(str(exc)) from None
            raise
    finally:
        engine.close()
    return result, placed


def reply_json(args, result, placed) -> dict:
    """--json's one object: the reply, its tokens and stats, its documents and tool calls."""
    s = result.stats
    out = {
        "text": result.text,
        "prompt_token_ids": list(result.prompt_token_ids),
        "token_ids": list(result.token_ids),
        "finish_reason": result.finish_reason,
        "prompt_tokens": s.prompt_tokens,
        "cached_tokens": s.reused_tokens,
        "generated_tokens": s.generated_tokens,
        "ttft_s": s.ttft_s,
        "prefill_tok_s": s.prefill_tok_s,
        "decode_tok_s": s.decode_tok_s,
        "drafted_tokens": s.drafted_tokens,
        "accepted_tokens": s.accepted_tokens,
    }
    if args.server:
        out.update(usage=getattr(result, "usage", None), error=getattr(result, "error", None))
    if placed is not None:
        out["documents"] = [{"name": p.document.name, "mode": p.mode, "tokens": p.tokens}
                            for p in placed.placements.values()]
        out["sources"] = [{"file": s.file, "page": s.page, "heading": s.heading} for s in placed.sources]
    if getattr(result, "tool_calls", None):
        from ..server.tools_api import tool_calls_json

        # cut by the token limit inside a call: "length", with the calls so far (as the server answers)
        out["finish_reason"] = "length" if result.finish_reason == "length" else "tool_calls"
        out["tool_calls"] = tool_calls_json(result.tool_calls)
    return out


def print_summary(result, description: str) -> None:
    """After the streamed text: its tool calls and a stats line, on stderr."""
    s = result.stats
    print()
    for call in getattr(result, "tool_calls", None) or []:
        print(f"[tool call {call.id}: {call.name}({call.arguments})]", file=sys.stderr)
    print(f"[{s.prompt_tokens} prompt tokens, {s.generated_tokens} generated, TTFT {s.ttft_s:.3f}s, "
          f"prefill {s.prefill_tok_s:.1f} tok/s, decode {s.decode_tok_s:.1f} tok/s, "
          f"{s.finish_reason}, {description}]", file=sys.stderr)


def run_main(args) -> int:
    messages, has_images = conversation(args)
    request = tool_request(args)
    if args.server and (request is not None or any(m.tool_calls or m.role == "tool" for m in messages)):
        raise EngineError("--tools, --tool-choice, --response-format and tool messages work with a local "
                          "model (not --server)")
    params = run_sampling(args)
    engine = connect_remote(args) if args.server else load_local(args, images=has_images)
    params, extra = with_tools(engine, request, params)
    description = engine.description  # for the summary line, after the engine is closed
    result, placed = write_reply(args, engine, request, messages, params, extra)
    if args.json:
        print(json.dumps(reply_json(args, result, placed), ensure_ascii=False))
    else:
        print_summary(result, description)
    if result.finish_reason == "interrupted":
        raise CommandFailed(f"the reply was interrupted: {getattr(result, 'error', None)}")
    return 0


def token_nll(model, tokenizer, ids: list[int], window: int, stride: int, kv_type: str = "f32") -> tuple[float, int]:
    """Sum of -log p(token | everything before it within the window) over ids[1:].

    One window when the text fits. Otherwise windows of `window` tokens start every `stride`
    tokens and each scores only the tokens the previous window did not (the standard strided
    evaluation): every token after the first is scored exactly once, with at least
    window - stride tokens of context except in the first window. Each window is a scored
    request of the one scheduler (SamplingParams.prompt_logprobs), read a prefill chunk a step,
    so only a chunk's logits are ever in memory."""
    from ..mistral3.chat_format import EncodedPrompt
    from ..runtime.batch import BatchScheduler
    from ..runtime.decoder import new_pool
    from ..runtime.prefix_cache import PrefixCache, ReplyMemory

    n = len(ids)
    pool = new_pool(model, min(window, n), capture_graphs=False, kv_type=kv_type)  # prefill only: no graphs
    scheduler = BatchScheduler(model, tokenizer, slots=1, priority_slots=0, pool=pool, context_length=min(window, n),
                               prefix_cache=PrefixCache(0), replies=ReplyMemory(capacity=0), gather_s=0.0)
    score = SamplingParams(max_tokens=0, temperature=0.0, prompt_logprobs=True)
    total, scored = 0.0, 0
    begin = 0
    prev_end = 1  # ids[0] (BOS) is never scored
    while prev_end < n:
        end = min(begin + window, n)
        first = prev_end - begin  # position in the window of the first unscored target
        logprobs = scheduler.generate(EncodedPrompt(ids[begin:end]), score).prompt_logprobs  # of window[1:]
        kept = logprobs[first - 1:]  # the targets the previous window did not score
        total -= math.fsum(kept)
        scored += len(kept)
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
    from ..runtime.decoder import default_context_length
    from ..runtime.device_map import plan_for_files

    path = Path(args.file)
    check_context_length(args, 2)  # a window scores tokens after its first
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EngineError(f"{path}: cannot read as UTF-8 text: {exc}") from None
    gf = open_gguf(args.model)
    text_config(gf)  # a projector or another architecture: say so, before the tokenizer complains
    tok = Tokenizer.from_gguf(gf)
    model = Mistral3Text.load(gf, plan=plan_for_files(gf, None, args.device, args.device_map))
    ids = [tok.bos_id] + tok.encode(text)
    if len(ids) < 2:
        raise EngineError(f"{path}: no text to score")
    # Default window: the context the engine would use (what fits in memory, capped by the
    # file's context_length), so a text that fits is scored in one window.
    window = min(args.context_length or default_context_length(model), model.cfg.context_length)
    window = max(window, 2)
    stride = max(window // 2, 1)
    nll, n = token_nll(model, tok, ids, window, stride, kv_type=args.kv_type)
    if not math.isfinite(nll):
        raise EngineError(f"{args.model}: the model produced invalid logits (NaN/inf) on {path}: "
                          f"the weights may be corrupt, or the compute dtype overflowed")
    ppl = math.exp(nll / n)
    if args.json:
        print(json.dumps({"perplexity": ppl, "tokens": n, "window": window, "stride": stride}))
    else:
        print(f"perplexity {ppl:.4f} over {n} tokens (window {window}, stride {stride})")
    return 0
