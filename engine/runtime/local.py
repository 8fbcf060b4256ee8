"""The local GGUF engine: model + optional Pixtral projector + tokenizer + KV reuse across turns.

Owned by one thread (the GUI's worker, or the CLI). `chat()` encodes the conversation with the
official v7 format, keeps the longest reusable prefix of the active chat's KV cache, or copies a
longer one from the shared prefix cache (`prefix_cache`: any chat's blocks, a known system
prompt, and after a restart the blocks on disk), splices image features into the new rows and
streams the reply; its prompt and reply blocks are published to the prefix cache afterwards.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable

import torch

from ..api import ChatMessage, EngineError, GenerationResult, SamplingParams
from ..mistral3.chat_format import EncodedPrompt, encode_chat
from .generate import InvalidLogitsError, check_params, generate
from ..gguf import GGUFError, open_gguf
from ..mistral3.text import Mistral3Text, torch_device
from ..mistral3.config import check_pair, text_config
from .decoder import cpu_kv_dtype, new_cache
from .device_map import Budget, plan_for_files
from .memory import release_freed_heap
from .prefix_cache import BLOCK_TOKENS, PrefixCache, ReplyMemory, block_hashes, encode_reusing_replies
from .prompts import check_fits, check_prompt_ids, image_features, prompt_rows
from .prefix_disk import DEFAULT_DISK_BYTES, PrefixDisk, block_layout, model_identity, usable_folder
from .session import HostKVStore, Session, position_keys, reusable_prefix
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
                 kv_disk_budget_mb: int = DEFAULT_DISK_BYTES >> 20, kv_type: str = "f32"):
        """device: auto / cuda (GPUs, with layers spilled to the CPU when the model does not
        fit: planned before loading), or cpu. device_map: a manual map, e.g. "cuda:0=30,cpu=10".
        context_length: None for the plan's default; a larger one is planned the same way
        (layers move to the CPU, or a PlanError says it does not fit).
        kv_host_budget_mb: host memory for KV outside the cache, half for parked chats, half for
        the shared prefix cache. kv_disk_dir: a folder for the prefix cache's disk tier (blocks
        of recent chats survive a restart), at most kv_disk_budget_mb there; None: memory only.
        kv_type: the KV cache of the layers on the CPU, "f32" or "f16" (half the memory and the
        bytes a long context's decode step reads; keys and values rounded to float16, the
        attention math float32). GPU layers keep the model's dtype."""
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
            budget = Budget(kv_type=kv_type) if not context_length else \
                Budget(max_seq_len=int(context_length), kv_type=kv_type)
            self.plan = plan_for_files(gf, self.mmproj_path, device, device_map, budget)
            self.model = Mistral3Text.load(gf, plan=self.plan, progress=_scaled(progress, 0.0, 0.85))
        except GGUFError as exc:
            raise EngineError(str(exc)) from None
        self.vision = None
        if self.mmproj_path is not None:
            self.vision = self._load_vision(self.mmproj_path)
        if progress:
            progress(0.95, "allocating the KV cache, capturing the decode graphs")
        self.cache = new_cache(self.model, self.plan.context_length, kv_type=kv_type)  # the KV the plan counted
        self.session = Session()
        self.session_key: str | None = None
        host_budget = self._host_kv_budget(kv_host_budget_mb << 20)  # one bound for both below
        self.host_kv = HostKVStore(host_budget - host_budget // 2)
        disk = None
        if kv_disk_dir is not None:
            identity = model_identity(self.model_path, gf.data_offset, self.mmproj_path)
            disk = PrefixDisk(kv_disk_dir, identity, block_layout(self.cache, BLOCK_TOKENS),
                              max(0, int(kv_disk_budget_mb)) << 20)
        # Shared with a BatchScheduler built on this engine (serve): one cache, one bound.
        self.prefix_cache = PrefixCache(host_budget // 2, BLOCK_TOKENS, disk)
        # replies generated here, put back with their exact ids (after a restart too, from disk)
        self.replies = ReplyMemory(disk=disk, check=self._decodes_to)
        release_freed_heap()  # the tokenizer's and the loader's temporaries
        if progress:
            progress(1.0, "ready")

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
        """Parked chats' KV in host memory: what was asked, but never more than the plan leaves
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
        return self.cache.capacity

    @property
    def context_limit(self) -> int:
        return self.model.cfg.context_length

    @property
    def device_kind(self) -> str:
        return self.model.device.type

    @property
    def writes_tool_calls(self) -> bool:
        return True

    def count_tokens(self, messages: list[ChatMessage]) -> int:
        return len(self.encode(messages).ids)

    def run_together(self, fn, n: int) -> list:
        """One at a time: this engine has one KV cache (BatchedEngine batches them)."""
        return [fn(self, i) for i in range(n)]

    def close(self) -> None:
        """Give the memory back now: the weights (and their repacked copies), the KV cache, parked
        chats, and glibc's freed heap to the system. (No gc.collect() here: close runs on the
        window's worker thread, and a collection there could free Qt objects off the GUI thread.)"""
        self.cache = None
        self.model = None
        self.vision = None
        self.host_kv = HostKVStore(0)
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
        """Reply to an encoded prompt in `session_key`'s KV (what `chat` and `complete` share)."""
        n_prompt = len(prompt.ids)
        check_fits(n_prompt, params.max_tokens, self.cache.capacity, self.context_limit, self.model_path)
        self._activate(session_key)
        t0 = time.perf_counter()
        keys = position_keys(prompt.ids, prompt.image_spans)
        hashes = block_hashes(keys, self.prefix_cache.block)
        reused = self._reuse(keys, hashes, prompt.image_spans)
        self.session.keys = keys[:reused]
        embeds = self._embeddings(prompt, reused)
        before_prefill = time.perf_counter() - t0  # blocks read from disk, images encoded: part of TTFT
        try:
            out = generate(self.model, self.cache, embeds, params, self.tokenizer, on_piece=on_piece,
                           cancel=cancel, start_pos=reused, history_ids=prompt.ids,
                           on_prompt_progress=on_prompt_progress)
        except BaseException as exc:
            # Keep only what is known to be in the cache: a prefix of this prompt.
            kept = min(self.cache.length, len(keys))
            self.cache.truncate(kept)
            self.session.keys = keys[:kept]
            if isinstance(exc, InvalidLogitsError):
                raise InvalidLogitsError(f"{self.model_path}: {exc}") from None
            raise
        # The cache holds the prompt (unless cancelled before prefill) and all but the last token.
        self.session.keys = (keys + list(out.cached_ids))[: self.cache.length]
        self._publish(self.session.keys, hashes)
        self.replies.remember_reply(out.text, out.token_ids, out.stats.finish_reason, self.tokenizer.decode)
        result = GenerationResult(out.text, out.token_ids, prompt.ids, out.stats, out.logprobs)
        if result.stats.ttft_s:
            result.stats.ttft_s += before_prefill
        stats = result.stats
        stats.prompt_tokens = n_prompt
        stats.reused_tokens = reused
        stats.prefilled_tokens = n_prompt - reused
        stats.context_used = self.cache.length
        stats.context_size = self.cache.capacity
        return result

    # -- internals ---------------------------------------------------------------------------
    def _check_ready(self, params: SamplingParams) -> None:
        if self.model is None:
            raise EngineError(f"{self.model_path}: this engine was closed: load the model again")
        check_params(params)  # before anything changes: a bad setting must not cost the active chat its KV

    def _activate(self, session_key: str | None) -> None:
        """Make `session_key`'s KV the resident one, parking the previous chat's in host RAM."""
        if session_key == self.session_key:
            return
        if self.session_key is not None and self.cache.length:
            snap = self.cache.to_host(self.host_kv.pool)  # a reused (pinned) buffer, not a new one
            self.host_kv.put(self.session_key, self.session.keys[: self.cache.length], snap, snap.nbytes)
        self.session_key = session_key
        restored = self.host_kv.take(session_key) if session_key is not None else None
        if restored is None:
            self.cache.truncate(0)
            self.session = Session()
            return
        keys, snap = restored
        self.cache.from_host(snap)
        self.host_kv.recycle(snap)  # copied into the cache: its buffer serves the next switch
        self.session = Session(list(keys))

    def _reuse(self, keys: list, hashes: list[bytes], image_spans) -> int:
        """Truncate the cache to the longest reusable prefix of this prompt: the active chat's
        own, or a longer run of the prefix cache's blocks copied in. Returns its length."""
        own = self.session.plan(keys, image_spans)
        b = self.prefix_cache.block
        with self.prefix_cache.lock:  # a batch scheduler on this engine shares it
            held = self.prefix_cache.match(hashes, start=own // b)
            from_blocks = reusable_prefix(keys[:held * b], keys, image_spans) if held * b > own else 0
            if from_blocks <= own:
                self.cache.truncate(own)
                return own
            first = own // b
            self.cache.truncate(first * b)
            self.prefix_cache.load(hashes[:-(-from_blocks // b)], self.cache, first)
        self.cache.truncate(from_blocks)
        return from_blocks

    def _decodes_to(self, text: str, ids: list[int]) -> bool:
        vocab = self.tokenizer.vocab_size
        return all(0 <= t < vocab for t in ids) and self.tokenizer.decode(ids) == text

    def _publish(self, keys: list, prompt_hashes: list[bytes]) -> None:
        """The full blocks the cache holds (prompt, and the reply's exact ids) to the prefix
        cache, once the reply has ended; the disk tier writes them on its own thread."""
        b = self.prefix_cache.block
        known = prompt_hashes[:len(keys) // b]
        self.prefix_cache.store(block_hashes(keys, b, known), self.cache)

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
        hashes = block_hashes(position_keys(prompt.ids, prompt.image_spans), self.prefix_cache.block)
        self.prefix_cache.forget(hashes)
        self.replies.forget([m.text_content for m in messages if m.role == "assistant"])

    def forget_session(self, session_key: str) -> None:
        """Drop a chat's cached KV (the chat was deleted)."""
        self.host_kv.drop(session_key)
        if session_key == self.session_key and self.cache is not None:
            self.cache.truncate(0)
            self.session = Session()

    def _embeddings(self, prompt: EncodedPrompt, start: int) -> torch.Tensor:
        """Input rows for prompt positions [start, end), image features spliced in (prompts.prompt_rows)."""
        image_token = self.tokenizer.token_id("[IMG]") if prompt.image_spans else None
        return prompt_rows(self.model, image_token, prompt, start, image_features(self.vision, prompt, start))


def _scaled(progress: LoadProgress | None, lo: float, hi: float) -> LoadProgress | None:
    if progress is None:
        return None
    return lambda frac, what: progress(lo + (hi - lo) * frac, what)
