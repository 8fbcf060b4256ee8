"""The local GGUF engine: model + optional Pixtral projector + tokenizer + the one scheduler.

Owned by one thread (the GUI's worker, or the CLI). `chat()` encodes the conversation with the
official v7 format and hands it to the engine's `BatchScheduler` (runtime/batch.py), which every
reply goes through: alone it is a batch of one, its steps run in the caller's thread; while the
API server is on (`serve`) the same scheduler runs many sequences on a loop thread of its own,
the window's replies on its priority lane. Every sequence's KV is blocks of the engine's one
pool (runtime/kv_cache.py). KV reuse is the scheduler's one rule: the longest run of known blocks
(any chat's, a known system prompt, and after a restart the blocks on disk).
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable

import torch

from .. import host
from ..api import ChatMessage, EngineError, GenerationResult, SamplingParams
from ..mistral3.chat_format import EncodedPrompt, encode_chat
from .batch import BatchScheduler
from .generate import InvalidLogitsError, check_params
from ..gguf import GGUFError, open_gguf
from ..mistral3.text import Mistral3Text, torch_device
from ..mistral3.config import check_pair, text_config
from .decoder import cpu_kv_dtype, new_pool
from .kv_cache import KVCache
from .device_map import Budget, plan_for_files
from .memory import release_freed_heap
from .prefix_cache import BLOCK_TOKENS, PrefixCache, ReplyMemory, block_hashes, encode_reusing_replies, prefix_names
from .prompts import check_prompt_ids, image_features, prompt_rows
from .prefix_disk import DEFAULT_DISK_BYTES, PrefixDisk, block_layout, model_identity, usable_folder
from .prefix_keys import position_keys
from .threads import settle_torch_threads
from ..mistral3.tokenizer import Tokenizer

log = logging.getLogger(__name__)

LoadProgress = Callable[[float, str], None]  # fraction 0..1, what is loading
PromptProgress = Callable[[int, int], None]  # prompt tokens read so far, tokens to read


class LocalEngine:
    def __init__(self, model_path: str | Path, mmproj_path: str | Path | None = None, *,
                 device: str = "auto", context_length: int | None = None,
                 kv_host_budget_mb: int = 2048, progress: LoadProgress | None = None,
                 device_map: str | None = None, kv_disk_dir: str | Path | None = None,
                 kv_disk_budget_mb: int = DEFAULT_DISK_BYTES >> 20, kv_type: str = "f32",
                 draft_model: str | Path | None = None):
        """device: auto / cuda (GPUs, with layers spilled to the CPU when the model does not
        fit: planned before loading), or cpu. device_map: a manual map, e.g. "cuda:0=30,cpu=10".
        context_length: None for the plan's default; a larger one is planned the same way
        (layers move to the CPU, or a PlanError says it does not fit).
        kv_host_budget_mb: host memory for KV blocks no sequence holds (chats kept for their next
        turn): on the CPU more blocks of the pool, beside a GPU the tier its blocks spill to. kv_disk_dir: a folder for the prefix cache's disk tier (blocks
        of recent chats survive a restart), at most kv_disk_budget_mb there; None: memory only.
        kv_type: the KV cache of the layers on the CPU, "f32" or "f16" (half the memory and the
        bytes a long context's decode step reads; keys and values rounded to float16, the
        attention math float32). GPU layers keep the model's dtype.
        draft_model: a smaller GGUF of the same vocabulary (runtime/draft.py) that drafts for
        requests with speculation "draft", where the plan puts it (beside the model's output head
        when it fits, else the CPU: its weights and KV are part of the plan); refused with the
        reason when its vocabulary differs or the two do not fit together."""
        self.model_path = Path(model_path)
        self.mmproj_path = Path(mmproj_path) if mmproj_path else None
        settle_torch_threads()  # torch out of the native pool's way (runtime/threads.py)
        cpu_kv_dtype(kv_type)  # a kv_type that cannot run is said before minutes of loading
        if kv_disk_dir is not None:
            usable_folder(kv_disk_dir)  # a folder that cannot be used is said before minutes of loading
        try:
            gf = open_gguf(self.model_path)
            cfg = text_config(gf)  # refuse a projector or another architecture before anything else
            if self.mmproj_path is not None:  # a foreign projector: refused from the headers
                check_pair(self.model_path, self.mmproj_path, cfg.hidden)  # the model's header read once
            self.tokenizer = Tokenizer.from_gguf(gf)
            if draft_model is not None:  # a draft of another vocabulary is refused before minutes of loading
                from .speculative import check_draft_vocabulary

                check_draft_vocabulary(self.model_path, draft_model)
            budget = Budget(kv_type=kv_type) if not context_length else \
                Budget(max_seq_len=int(context_length), kv_type=kv_type)
            # the draft's weights and KV are planned with the model's: together they fit, or are refused
            self.plan = plan_for_files(gf, self.mmproj_path, device, device_map, budget, draft_path=draft_model)
            self.model = Mistral3Text.load(gf, plan=self.plan, progress=_scaled(progress, 0.0, 0.85))
        except GGUFError as exc:
            raise EngineError(str(exc)) from None
        self.vision = None
        if self.mmproj_path is not None:
            self.vision = self._load_vision(self.mmproj_path)
        if progress:
            progress(0.95, "allocating the KV cache, capturing the decode graphs")
        self.kv_type = kv_type
        context = self.plan.context_length
        positions, host_budget = self._pool_positions(context, self._host_kv_budget(kv_host_budget_mb << 20))
        # the KV the plan counted: every sequence's blocks (decode graphs captured now)
        self.pool = new_pool(self.model, positions, kv_type=kv_type, context_length=context)
        disk = None
        if kv_disk_dir is not None:
            identity = model_identity(self.model_path, gf.data_offset, self.mmproj_path)
            disk = PrefixDisk(kv_disk_dir, identity, block_layout(self.pool), max(0, int(kv_disk_budget_mb)) << 20)
        self.prefix_cache = PrefixCache(host_budget, BLOCK_TOKENS, disk)
        # replies generated here, put back with their exact ids (after a restart too, from disk)
        self.replies = ReplyMemory(disk=disk, check=self._decodes_to)
        # every reply goes through it: one sequence at a time until serve() allows more
        self.scheduler = BatchScheduler(self.model, self.tokenizer, self.vision, slots=1, priority_slots=0,
                                        pool=self.pool, context_length=context, prefix_cache=self.prefix_cache,
                                        replies=self.replies, source=self.model_path)
        if draft_model is not None:
            if progress:
                progress(0.97, "loading the draft model")
            self.scheduler.draft_model = self._load_draft(draft_model, self.pool.positions, context)
        release_freed_heap()  # the tokenizer's and the loader's temporaries
        if progress:
            progress(1.0, "ready")

    def _pool_positions(self, context: int, host_budget: int) -> tuple[int, int]:
        """(positions of the KV pool, bytes of host memory for blocks beside it). On the CPU the
        pool is host memory, committed as blocks are written: the host budget is more blocks of
        it (chats kept in the pool), not copies beside it, and never more than half of what is
        free beside the context's own KV."""
        if self.model.on_gpu:
            return context, host_budget
        per_token = self.model.kv_bytes_per_token(dtype=cpu_kv_dtype(self.kv_type))
        free = host.available_ram()
        if free:
            host_budget = min(host_budget, max(0, free - context * per_token) // 2)
        return context + host_budget // max(1, per_token), 0

    def _load_draft(self, draft_model: str | Path, positions: int, context: int):
        """The draft model (runtime/draft.py) where the plan put it: a pool of the target pool's
        `positions` (every sequence decoding at once, and ended ones kept for their next turn; on
        the CPU a pool is committed as it is written), sequences of up to `context` positions."""
        from .draft import DraftModel

        try:
            return DraftModel.load(draft_model, self.model_path, device=torch_device(self.plan.draft_device),
                                   positions=positions, context_length=context)
        except GGUFError as exc:
            raise EngineError(str(exc)) from None

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer: Tokenizer) -> None:
        """One tokenizer for the engine and its scheduler (a test gives a renamed one)."""
        self._tokenizer = tokenizer
        if getattr(self, "scheduler", None) is not None:
            self.scheduler.tokenizer = tokenizer

    @property
    def placement(self) -> dict:
        """Where the model runs, as data (model bar, Settings): "summary" ("34 of 40 layers on
        GPU, 6 on CPU"), "gpu_layers" / "cpu_layers" / "n_layers", per-device "devices" (layer
        ranges, bytes planned), where the "embedding", "head" and "vision" tower are, "fit"
        (gpu / partial / cpu) and the planner's "warnings" (DevicePlan.as_dict)."""
        info = self.plan.as_dict()
        if self.vision is None:
            info["vision"] = None
        info["warnings"] = self.warnings
        return info

    def _host_kv_budget(self, asked: int) -> int:
        """The prefix cache's host memory: what was asked, but never more than the plan leaves
        free on the CPU when the CPU holds part of the model (the plan's arithmetic adds up)."""
        cpu = next((p for p in self.plan.placements if p.device.kind == "cpu"), None)
        return asked if cpu is None else min(asked, max(cpu.device.usable - cpu.total, 0))

    @property
    def warnings(self) -> list[str]:
        """What the model bar's tooltip can show: the planner's warnings, and each decode bucket
        whose CUDA graph capture failed at load (bucket, layers, reason; that bucket runs eagerly)."""
        graphs = self.model.graph_failures if self.model is not None else []
        return list(self.plan.warnings) + list(graphs)

    def _load_vision(self, path: Path):
        from ..mistral3.vision import VisionTower

        where = torch_device(self.plan.vision_device) if self.plan.vision_device else self.model.device
        # its width was checked against the model from the headers (check_pair) before loading
        return VisionTower.load(path, device=where)  # its dtype: tower_dtype (never fp16)

    # -- Engine protocol ---------------------------------------------------------------------
    @property
    def description(self) -> str:
        vision = f" + {self.mmproj_path.name}" if self.vision else ""
        kinds = sorted({seg.device.type for seg in self.model.segments})
        if len(self.model.segments) == 1:
            return f"{self.model_path.name}{vision} on {kinds[0]}"
        return f"{self.model_path.name}{vision} on {' + '.join(kinds)} ({self.plan.summary()})"

    @property
    def has_vision(self) -> bool:
        return self.vision is not None

    @property
    def context_size(self) -> int:
        """The longest conversation of the window's lane (a kept slot while serving)."""
        return self.scheduler.lane_context(True)

    @property
    def context_limit(self) -> int:
        return self.model.cfg.context_length

    @property
    def device_kind(self) -> str:
        return self.model.device.type

    @property
    def writes_tool_calls(self) -> bool:
        return True

    @property
    def image_geometry(self) -> tuple[int, int, int] | None:
        v = self.vision
        return (int(v.image_size), int(v.patch_size), int(v.merge)) if v is not None else None

    @property
    def think_ids(self) -> tuple[int, int] | None:
        return self.tokenizer.think_ids

    @property
    def chat_version(self) -> int:
        return int(self.tokenizer.version)

    def count_tokens(self, messages: list[ChatMessage]) -> int:
        return len(self.encode(messages).ids)

    def run_together(self, fn, n: int) -> list:
        """One at a time: this engine has one KV cache (BatchedEngine batches them)."""
        return [fn(self, i) for i in range(n)]

    # -- serving: the same scheduler, more sequences, its own loop thread ------------------------
    def serve(self, slots: int, priority_slots: int = 1, **options) -> BatchScheduler:
        """Turn the scheduler to `slots` sequences at once (+ `priority_slots` more for the
        window's replies) on a loop thread; `stop_serving` turns it back. Every sequence takes
        blocks from the engine's one pool, the KV the plan counted (llama-server's -np divides -c
        into fixed slots; here a short conversation holds only its blocks). `options`: the
        scheduler's step_rows / gather_s / context_length (each sequence's bound)."""
        self.scheduler.use_slots(slots, priority_slots, options.get("step_rows"), options.get("gather_s"),
                                 options.get("context_length"))
        return self.scheduler.start()

    def stop_serving(self, error: EngineError | None = None) -> None:
        """Back to one sequence at a time, steps in the caller's thread; what runs or waits fails
        with `error`. The pool keeps what it holds."""
        if self.scheduler is None:  # closed first
            return
        self.scheduler.halt(error)
        self.scheduler.use_slots(1, 0)

    def new_sequence(self) -> KVCache:
        """An empty sequence over the engine's pool, of the engine's context (a benchmark's or a
        check's own decoding; `release()` it after)."""
        return KVCache(self.pool, self.context_size)

    def close(self) -> None:
        """Give the memory back now: the weights (and their repacked copies), the KV cache, the
        prefix cache's blocks, and glibc's freed heap to the system. (No gc.collect() here: close runs on the
        window's worker thread, and a collection there could free Qt objects off the GUI thread.)"""
        if self.scheduler.draft_model is not None:
            self.scheduler.draft_model.close()
        self.scheduler.close()
        self.scheduler = None
        self.pool = None
        self.model = None
        self.vision = None
        self.prefix_cache.close()  # the blocks still queued for disk are written first
        self.prefix_cache = PrefixCache(0)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        release_freed_heap()

    def encode(self, messages: list[ChatMessage], tools=None, replies: ReplyMemory | None = None) -> EncodedPrompt:
        """The chat format's ids, with the replies this engine generated as the ids it sampled
        (`replies`: another memory of them, a scheduler's of its own)."""
        grid = self.vision.grid if self.vision is not None else None
        if tools:
            return encode_chat(self.tokenizer, messages, grid, tools=tools)
        return encode_reusing_replies(self.tokenizer, messages, grid, self.replies if replies is None else replies)

    def chat(self, messages: list[ChatMessage], params: SamplingParams, on_piece=None,
             cancel: threading.Event | None = None, session_key: str | None = None,
             tools=None, on_prompt_progress: PromptProgress | None = None) -> GenerationResult:
        """`tools`: the ToolSpecs the model may call (shown in the prompt). `on_prompt_progress`:
        (tokens read, tokens to read) after each prefill chunk, (0, total) first when the
        prompt takes more than one."""
        self._check_ready(params)
        return self.generate_from(self.encode(messages, tools), params, on_piece, cancel, session_key,
                                  on_prompt_progress)

    def complete(self, prompt_ids: list[int], params: SamplingParams, on_piece=None,
                 cancel: threading.Event | None = None, session_key: str | None = None) -> GenerationResult:
        """Continue raw prompt ids (no chat format; the caller adds BOS if it wants one)."""
        self._check_ready(params)
        check_prompt_ids(prompt_ids, self.tokenizer.vocab_size)
        return self.generate_from(EncodedPrompt(list(prompt_ids)), params, on_piece, cancel, session_key)

    def generate_from(self, prompt: EncodedPrompt, params: SamplingParams, on_piece=None,
                      cancel: threading.Event | None = None, session_key: str | None = None,
                      on_prompt_progress: PromptProgress | None = None) -> GenerationResult:
        """Reply to an encoded prompt (what `chat` and `complete` share), on the scheduler's
        priority lane. `session_key` is accepted for the Engine protocol: the scheduler finds any
        conversation's KV by its tokens, whatever it is called."""
        try:
            return self.scheduler.generate(prompt, params, on_piece, cancel, priority=True,
                                           on_prompt_progress=on_prompt_progress)
        except InvalidLogitsError as exc:
            raise InvalidLogitsError(f"{self.model_path}: {exc}") from None

    # -- internals ---------------------------------------------------------------------------
    def _check_ready(self, params: SamplingParams) -> None:
        if self.model is None:
            raise EngineError(f"{self.model_path}: this engine was closed: load the model again")
        check_params(params)  # before anything changes: a bad setting must not cost the active chat its KV

    def _decodes_to(self, text: str, ids: list[int]) -> bool:
        vocab = self.tokenizer.vocab_size
        return all(0 <= t < vocab for t in ids) and self.tokenizer.decode(ids) == text

    def prompt_rows(self, prompt: EncodedPrompt, start: int = 0) -> torch.Tensor:
        """Input rows for prompt positions [start, end), image features spliced in (the
        scheduler's own rule, prompts.prompt_rows): a scoring pass's input (perplexity)."""
        image_token = self.tokenizer.token_id("[IMG]") if prompt.image_spans else None
        return prompt_rows(self.model, image_token, prompt, start, image_features(self.vision, prompt, start))

    def forget_chat(self, messages: list[ChatMessage]) -> None:
        """A deleted chat's content leaves the prefix cache, in memory and on disk: the blocks of
        its prompt (blocks it shared with other chats go too: a later cache miss, nothing worse)
        and the sampled ids of its replies."""
        if not messages:
            return
        try:
            prompt = self.encode(messages)
        except EngineError:  # e.g. an image the tower cannot read: nothing of it was cached either
            return
        keys = position_keys(prompt.ids, prompt.image_spans)
        hashes = block_hashes(keys, self.pool.block)
        names = hashes + [name for _, name in prefix_names(hashes, keys, self.pool.block)]
        self.pool.forget(names)
        self.prefix_cache.forget(names)
        self.replies.forget([m.text_content for m in messages if m.role == "assistant"])

    def encode_images(self, messages: list[ChatMessage], last: int, progress=None) -> None:
        """See Engine.encode_images: the scheduler's tower, under its lock."""
        self.scheduler.encode_images(self.encode(messages), last, progress)

    def forget_session(self, session_key: str) -> None:
        """Nothing to do: KV is found by content, not by chat (forget_chat drops a chat's blocks)."""


def _scaled(progress: LoadProgress | None, lo: float, hi: float) -> LoadProgress | None:
    if progress is None:
        return None
    return lambda frac, what: progress(lo + (hi - lo) * frac, what)
