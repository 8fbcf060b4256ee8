"""`tramontane-cli serve`: the model behind an OpenAI-compatible server until Ctrl-C."""
from __future__ import annotations

from pathlib import Path

import sys
import threading

from ..api import EngineError


def add_parsers(sub) -> None:
    from ..server.openai_api import ConnectionLimits, RequestLimits
    from .run import add_kv_disk_argument, add_local_model_arguments, add_speculation_arguments

    limits = RequestLimits()
    conn = ConnectionLimits()
    p = sub.add_parser("serve", help="serve a GGUF model over an OpenAI-compatible HTTP API (localhost)")
    p.add_argument("--model", required=True, help="GGUF file")
    p.add_argument("--mmproj", help="vision projector GGUF (default: the one beside the model that fits it)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; another needs --allow-network and a key)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--ollama-port", type=int, metavar="PORT",
                   help="also listen on PORT (Ollama's is 11434) for clients that only speak to Ollama's "
                        "port; every port serves every API (OpenAI's, Anthropic's /v1/messages, Ollama's /api)")
    p.add_argument("--api", action="append", choices=("openai", "anthropic", "ollama"), metavar="FAMILY",
                   help="serve only this API family (repeatable): openai (chat, completions, responses), "
                        "anthropic (/v1/messages), ollama (/api); default all three")
    key = p.add_mutually_exclusive_group()
    key.add_argument("--api-key", metavar="K", help="require 'Authorization: Bearer K' "
                                                    "(visible to other users in the process list: "
                                                    "prefer --api-key-env)")
    key.add_argument("--api-key-env", metavar="VAR", help="environment variable that holds the API key")
    p.add_argument("--allow-network", action="store_true",
                   help="allow binding an address other machines can reach (needs an API key)")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="let web pages from ORIGIN (e.g. http://localhost:3000, or *) call the server")
    add_local_model_arguments(p)
    add_kv_disk_argument(p)
    add_speculation_arguments(p)  # requests may choose their own (speculation, speculative.n_max)
    p.add_argument("--max-body-mb", type=int, default=limits.max_body_bytes >> 20)
    p.add_argument("--max-image-mb", type=int, default=limits.max_image_bytes >> 20)
    p.add_argument("--max-queue", type=int, default=limits.max_queue,
                   help="requests waiting or running before the next one gets 503")
    p.add_argument("--parallel", "-np", type=int, default=8, metavar="N",
                   help="replies generated at once (continuous batching); more wait for a slot. On a GPU "
                        "they share the planned context (--context-length), each gets 1/N of it")
    p.add_argument("--alias", action="append", default=[], metavar="NAME",
                   help="another model id for /v1/models (repeatable); any name gets the loaded model")
    p.add_argument("--strict-model", action="store_true",
                   help="answer 404 to a model name that is not the model's id or an alias")
    p.add_argument("--max-connections", type=int, default=conn.max_connections,
                   help="connections open at once; more wait until one closes")
    p.add_argument("--header-timeout", type=float, default=conn.header_timeout_s, metavar="S",
                   help="seconds a client has to send a request's headers")
    p.add_argument("--body-timeout", type=float, default=conn.body_timeout_s, metavar="S",
                   help="seconds a client has to send a request's body")
    p.add_argument("--idle-timeout", type=float, default=conn.idle_timeout_s, metavar="S",
                   help="seconds an idle connection is kept open")
    p.set_defaults(func=serve_main)


def serve_main(args, stop: threading.Event | None = None) -> int:
    """Serve until Ctrl-C (or `stop` is set, for tests)."""
    from ..runtime.local import LocalEngine
    from ..server.executor import BatchExecutor
    from ..server.http import FAMILY_NAMES, OpenAIServer, check_bind
    from ..server.openai_api import ConnectionLimits, RequestLimits
    from .run import api_key_of, check_context_length, note_capped_context, projector_for

    api_key = api_key_of(args)
    check_bind(args.host, args.allow_network, api_key)  # before the minutes of loading
    if not 0 <= args.port <= 65535:
        raise EngineError(f"--port must be 0-65535, got {args.port}")
    if args.ollama_port is not None and not 0 <= args.ollama_port <= 65535:
        raise EngineError(f"--ollama-port must be 0-65535, got {args.ollama_port}")
    for name in ("max_body_mb", "max_image_mb", "max_queue", "max_connections", "parallel"):
        if getattr(args, name) < 1:
            raise EngineError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    for name in ("header_timeout", "body_timeout", "idle_timeout"):
        if not getattr(args, name) > 0:
            raise EngineError(f"--{name.replace('_', '-')} must be more than 0 seconds, got {getattr(args, name)}")
    from ..server.openai_api import MAX_SPEC_TOKENS

    if not 1 <= args.spec_tokens <= MAX_SPEC_TOKENS:
        raise EngineError(f"--spec-tokens must be 1..{MAX_SPEC_TOKENS}, got {args.spec_tokens}")
    aliases = tuple(a.strip() for a in args.alias)
    if any(not a for a in aliases):
        raise EngineError("--alias needs a name, got an empty one")
    check_context_length(args, 1)
    if args.spec == "draft" and not args.draft_model:
        raise EngineError("--spec draft needs --draft-model FILE (a smaller model of the same vocabulary)")
    if args.draft_model and not Path(args.draft_model).is_file():
        raise EngineError(f"{args.draft_model}: no such draft model file")
    engine = LocalEngine(args.model, projector_for(args, needed=False), device=args.device,
                         context_length=args.context_length, device_map=args.device_map,
                         kv_disk_dir=args.kv_disk, kv_type=args.kv_type, draft_model=args.draft_model)
    note_capped_context(args, engine)
    executor = BatchExecutor(engine, slots=args.parallel, priority_slots=0)  # no window here to keep a slot for
    limits = RequestLimits(max_body_bytes=args.max_body_mb << 20, max_image_bytes=args.max_image_mb << 20,
                           max_queue=args.max_queue)
    connection_limits = ConnectionLimits(header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout,
                                         idle_timeout_s=args.idle_timeout, max_connections=args.max_connections)
    server = OpenAIServer(executor, host=args.host, port=args.port, api_key=api_key,
                          allow_network=args.allow_network, cors_origins=tuple(args.cors_origin),
                          limits=limits, aliases=aliases, strict_model=args.strict_model,
                          connection_limits=connection_limits, ollama_port=args.ollama_port,
                          speculation=(args.spec, args.spec_tokens),
                          apis=tuple(args.api or ("openai", "anthropic", "ollama")))
    try:
        server.start()
        also = "".join(f"; {FAMILY_NAMES[family]} clients: {url}" for family, url in server.client_urls().items())
        print(f"serving {executor.served_model().id} ({executor.engine.description}) at {server.url}{also}"
              f"{' (API key required)' if api_key else ''}; Ctrl-C stops", file=sys.stderr, flush=True)
        stop = stop or threading.Event()
        while not stop.wait(1.0):  # a timed wait, so Ctrl-C is seen on every platform
            pass
    finally:
        server.stop()
        executor.shutdown()
        engine.close()
    return 0

