"""Continuous batching over paged KV: many sequences decoded together, one pass over the
weights per step.

A `BatchScheduler` runs every generation of one model, a lone reply as a batch of one. Each
sequence's KV is a block table into the scheduler's `KVPool` (runtime/kv_cache.py). Every step
runs one row for each sequence that is decoding plus chunks of the prompts being read (at most
`step_rows` prompt rows), through `Mistral3Text.forward_batch` (the matmuls on all rows at once,
attention per sequence through its table); new requests join at step boundaries and finished
ones leave, so a long prompt is read a chunk per step while the other streams keep getting a
token every step; among prompts being read the oldest always advances and the rest of a step
goes to those closest to their first token (a short one behind a long one is read at once).
Decode is bound by reading the weights: eight rows cost about what one does.

A priority request (the window's own reply) has room kept for it (`priority_slots`) and its
prompt is read before anyone else's, with the other streams paused for those steps, so it never
queues behind API streams. Image features are encoded in the submitting thread, outside the
step. Requests with the same prompt (a request's `n` choices, admitted together through a
`Gate`) read it once: the later ones wait while the first reads it, then share its blocks and
its last row's logits, and all decode as rows of the same steps.

One reuse rule: a new sequence takes the longest run of known blocks of its prompt (named by
content: runtime/prefix_cache.block_hashes), from the pool (shared, reference-counted: a system
prompt of 32 conversations is held once; a chat that ended is its blocks left in the pool) or
read back from the tier below (host memory, then the disk). A sequence that needs a block when
the pool has none preempts the youngest API sequence, which goes back to the queue and later
goes on where it stopped (vLLM's recompute preemption). Sampling, stop strings and stats are the
same for every sequence; a step draws its new requests' first tokens before the streams' next
ones.

Time to first token under a burst of clients: requests the server has taken but not yet queued
(their prompt being encoded) are announced (`arrival`); a step that starts reading a new prompt
waits for them a little (at most `gather_s`), so the burst is read in one step instead of the
first prompt alone and the others a whole step later; those queued while a step is being set up
join it too.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence, TypeVar

import torch

from ..api import (ChatMessage, EngineError, FinishReason, GenerationResult, GenerationStats, LoggedPiece,
                   ReasoningPiece, SamplingParams, TokenLogprob)
from ..mistral3.chat_format import EncodedPrompt
from .decoder import decode_rows, default_context_length, new_pool
from .kv_cache import KVCache, KVPool, KVPoolFull
from .generate import StopStringFilter, check_params, draw_token, make_generator, reply_stats, seen_mask, stop_reason
from .prefix_cache import PrefixCache, ReplyMemory, block_hashes, prefix_names, tail_hash
from .reasoning import ReasoningSplitter
from .speculative import AdaptiveDraftLength, PromptLookup, SpeculationCost, StepTimes
from .prompts import check_fits, check_prompt_ids, image_features, prompt_rows
from .prefix_keys import Key, position_keys, reusable_prefix

log = logging.getLogger(__name__)

# Prompt rows per step while other sequences decode beside it: a quarter of the model's own
# prefill chunk (mistral3/config.py, the one setting: 128 of 512 on the CPU, ~0.5 s of prefill;
# 512 of 2048 on a GPU), so their streams keep getting a token a step. A prompt read while nothing
# decodes takes whole chunks, as a forward pass would.
STEP_SHARE = 4
# How long a new prompt's step waits for announced requests (a fraction of a short prompt's step:
# ~70 ms on 2 CPU threads for the bench model); 0 turns gathering off.
GATHER_S_CPU = 0.02
GATHER_S_GPU = 0.005
GATHER_QUIET_S = 0.003  # a burst has ended when no request came for this long (the server takes them one by one)
DEFAULT_SLOTS = 8
# What verifying k drafted tokens costs against a one-row step until this machine's steps are
# measured (StepTimes): decode reads the weights once for all rows (the yardstick: 5 rows
# at most 1.3x one row)
SPEC_COST = SpeculationCost(tuple(1.0 + 0.06 * k for k in range(17)))
PREFIX_CACHE_BYTES = 1 << 30

T = TypeVar("T")
PromptProgress = Callable[[int, int], None]  # prompt rows read so far, rows to read (reused ones not counted)


@dataclass
class _Request:
    prompt: EncodedPrompt
    keys: list[Key]
    params: SamplingParams
    on_piece: Callable[[str], None] | None
    cancel: threading.Event | None
    priority: bool
    features: list[torch.Tensor]  # one per image span, encoded before the request was queued
    future: Future
    t0: float
    order: int
    on_prompt_progress: PromptProgress | None = None
    # waiting requests with this very prompt: they start from its KV once it is read
    followers: list["_Request"] = field(default_factory=list)
    gate: "Gate | None" = None  # admitted only once it is open (see Gate)
    rows: torch.Tensor | None = None  # input rows of the positions after the reused ones, given by the caller
    history: Sequence[int] | None = None  # the repetition penalty's tokens, when not the prompt's ids
    kv: KVCache | None = None  # the caller's sequence KV (generate()): used as it is, kept afterwards
    hashes: list[bytes] = field(default_factory=list)  # its prompt's block names, made when it was submitted
    resume: "_Sequence | None" = None  # a preempted sequence going on where it stopped


class Arrival:
    """A request on its way to the scheduler's queue (taken by the server, its prompt still being
    encoded): while it is, a step that starts reading a new prompt may wait for it (gather_s).
    `done()` once it is queued or has given up (idempotent)."""

    def __init__(self, scheduler: "BatchScheduler"):
        self._scheduler = scheduler
        self._open = True

    def done(self) -> None:
        with self._scheduler._cond:
            if self._open:
                self._open = False
                self._scheduler._arriving -= 1
                self._scheduler._cond.notify_all()


class Gate:
    """Requests submitted together (a request's `n` choices, from threads of their own): none is
    admitted before each has been submitted or has given up, so they join the same step, the
    first reads their prompt and the others start from its KV."""

    def __init__(self, n: int, cond: threading.Condition):
        self.left = n
        self._cond = cond

    @property
    def open(self) -> bool:
        return self.left <= 0

    def pass_one(self) -> None:
        """One of them was submitted, or ended without being submitted (it failed before)."""
        with self._cond:
            self.left -= 1
            self._cond.notify()


class _Sequence:
    """One request while it runs: its prompt rows still to read, then one token a step."""

    def __init__(self, req: _Request, cache: KVCache, reused: int, embeds: torch.Tensor, tokenizer):
        self.req = req
        self.cache = cache  # its block table into the scheduler's pool
        self.reused = reused
        self.embeds = embeds  # input rows for prompt positions [reused, len(prompt))
        self.read = 0  # of those rows
        self.pending: int | None = None  # the sampled token the next step feeds
        self.generated: list[int] = []
        self.cached: list[int] = []  # generated ids whose K/V are in the cache
        self.decoder = tokenizer.stream(skip_special=False) if req.params.control_text else tokenizer.stream()
        self.thought = ReasoningSplitter.for_tokenizer(tokenizer)  # None: a model that does not think
        self.lookup = PromptLookup(req.prompt.ids) if req.params.speculation == "ngram" else None
        self.drafting = req.params.speculation == "draft"  # the scheduler's draft model proposes (if it has one)
        self.draft_length = AdaptiveDraftLength(SPEC_COST, req.params.spec_tokens) \
            if self.lookup or self.drafting else None
        self.drafted = self.accepted = 0
        self.logprobs = [] if req.params.logprobs is not None else None
        self.logprobs_streamed = 0  # of those, the ones a streamed piece has carried
        self.prompt_logprobs = [] if req.params.prompt_logprobs else None
        self.prompt_top = [] if req.params.prompt_logprobs and req.params.logprobs else None
        self.stop = StopStringFilter(req.params.stop)
        self.generator = None
        self.seen = None
        self.t_first: float | None = None
        self.t_last: float | None = None
        self.n_sampled = 0

    @property
    def reading(self) -> bool:
        return self.read < self.embeds.shape[0]


@dataclass
class _StepPlan:
    """One step's rows: the input parts (the decode rows' ids first, then prompt chunks), one
    group per sequence, the rows whose logits are wanted, and who is sampled from which row."""

    parts: list = field(default_factory=list)
    groups: list = field(default_factory=list)
    logit_rows: list[int] = field(default_factory=list)
    sampled: list = field(default_factory=list)  # (sequence, its first logits row, drafts)
    stepped: list = field(default_factory=list)  # in row order, blocks reserved for each
    decoded: list = field(default_factory=list)  # the decoding ones among them
    read_now: list = field(default_factory=list)  # those reading their prompt
    scored: list = field(default_factory=list)  # (sequence, its first row, rows) of prompts scored
    row: int = 0

    def add(self, s: "_Sequence", n: int, drafts: list[int] | None) -> None:
        """n rows of `s` at the end of the step; drafts None: prompt rows (sampled from the last
        one when they end its prompt), else a decode row and its drafts (each row's logits)."""
        self.groups.append((s.cache, s.cache.length, n))
        if drafts is not None:
            self.sampled.append((s, len(self.logit_rows), drafts))
            self.logit_rows.extend(range(self.row, self.row + n))
        self.row += n
        self.stepped.append(s)
        if drafts is None and not s.reading:
            self.sampled.append((s, len(self.logit_rows), []))
            self.logit_rows.append(self.row - 1)


class BatchScheduler:
    """Runs many generations on one model at once (see the module's docstring).

    `submit` (any thread) queues a request and answers a Future of its GenerationResult;
    `start()` runs the steps on a thread of its own, or a caller drives them with `step()`."""

    def __init__(self, model, tokenizer, vision=None, *, slots: int = DEFAULT_SLOTS, priority_slots: int = 1,
                 context_length: int | None = None, step_rows: int | None = None,
                 prefix_cache_bytes: int = PREFIX_CACHE_BYTES, prefix_cache: PrefixCache | None = None,
                 pool: KVPool | None = None, gather_s: float | None = None,
                 replies: ReplyMemory | None = None, source=None):
        """`pool`: the KV blocks every sequence takes from (the engine's, sized by its plan); by
        default one of `slots + priority_slots` contexts of `context_length` (each sequence's
        bound; by default the pool's positions). `prefix_cache`: the tier below the pool (host
        memory, the disk), shared with the engine; by default one of `prefix_cache_bytes` of its
        own. `replies`: the reply ids the engine keeps (shared with it, on disk with its blocks); by
        default its own. `source`: the model file, named in the errors a request gets."""
        self.model = model
        self.tokenizer = tokenizer
        self.vision = vision
        self.source = source
        self._running: list[_Sequence] = []
        self._waiting: list[_Request] = []
        if pool is None:
            n = default_context_length(model) if context_length is None else int(context_length)
            pool = new_pool(model, n * (slots + priority_slots), capture_graphs=False, context_length=n)
        self.pool = pool
        self.context = min(int(context_length or pool.positions), pool.positions, model.cfg.context_length)
        self.use_slots(slots, priority_slots, step_rows, gather_s)
        self.prefix = prefix_cache if prefix_cache is not None else PrefixCache(prefix_cache_bytes)
        pool.spill = self.prefix.put  # a block the pool must reuse goes to host memory / the disk
        self.replies = replies if replies is not None else ReplyMemory()
        self._img_id = tokenizer.token_id("[IMG]") if vision is not None else None
        self._cond = threading.Condition()
        self._order = itertools.count()
        self._vision_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._closed_error = EngineError("the engine was closed: load the model again")
        self._arriving = 0  # announced requests not yet queued (Arrival)
        self._last_news = -1.0  # when the last request was announced or queued (perf_counter)
        self.step_times = StepTimes()  # decode steps by their rows: what a drafted row costs here
        self.acceptance_seen: dict[str, tuple[float, float]] = {}  # mode: the last reply's (accepted, tried)
        self.steps = 0  # forward passes run (a clock in steps, for tests and measurements)
        self.preempted = 0  # sequences sent back to the queue for want of blocks
        self.draft_model = None  # a DraftModel (runtime/draft.py) for requests with speculation "draft"

    def use_slots(self, slots: int, priority_slots: int = 0, step_rows: int | None = None,
                  gather_s: float | None = None, context_length: int | None = None) -> None:
        """How many sequences run at once: `slots` of any lane and `priority_slots` more for the
        priority lane (the engine's one, or the API server's many), each of at most
        `context_length` positions (default: as before). Only between steps with nothing running
        or queued (its owner's thread: the loop is not running). What the pool holds stays."""
        if slots < 1 or priority_slots < 0:
            raise EngineError(f"a batch needs at least one slot, got {slots} (+{priority_slots} for priority)")
        if self._running or self._waiting:
            raise EngineError("the scheduler's slots cannot change while sequences run")
        self.max_seqs, self.priority_seqs = slots, priority_slots
        if context_length:
            self.context = min(int(context_length), self.pool.positions, self.model.cfg.context_length)
        on_gpu = self.model.on_gpu
        # prompt rows a step reads beside other sequences, and for a lone request (a forward's
        # whole prefill chunk: it reads as fast as a pass of its own); a given step_rows is both
        self.step_rows = step_rows or max(1, self.model.prefill_chunk // STEP_SHARE)
        self._given_rows = step_rows
        self.gather_s = gather_s if gather_s is not None else (GATHER_S_GPU if on_gpu else GATHER_S_CPU)

    @property
    def context_size(self) -> int:
        """The longest conversation (prompt and reply) a request can have."""
        return self.lane_context(False)

    def lane_context(self, priority: bool) -> int:
        """The longest sequence a request of this lane may be (the same for both lanes: every
        sequence takes blocks from one pool)."""
        return self.context

    # -- any thread -----------------------------------------------------------------------------
    def submit(self, prompt: EncodedPrompt, params: SamplingParams, on_piece=None,
               cancel: threading.Event | None = None, priority: bool = False,
               on_prompt_progress: PromptProgress | None = None, gate: Gate | None = None,
               rows: torch.Tensor | None = None, history: Sequence[int] | None = None,
               kv: KVCache | None = None) -> Future:
        """Queue one generation; image features are encoded here, in the caller's thread.
        `rows`: the input rows after the positions `kv` holds, made by the caller (generate()
        on a sequence KV of its own, `kv`, used as it is and kept); `history`: the repetition penalty's tokens, if not the prompt's.
        `on_prompt_progress(read, total)` is called (on the loop's thread) when its prompt starts
        being read and after each chunk. `gate`: it waits for the others of its group (the
        caller passes the gate once it is in the queue or has failed: `Gate.pass_one`)."""
        check_params(params)
        t0 = time.perf_counter()
        n = len(prompt.ids)
        if n == 0:
            raise EngineError("the prompt is empty: give at least one token")
        check_fits(n, params.max_tokens, self.lane_context(priority), self.model.cfg.context_length, self.source)
        features = [] if rows is not None else image_features(self.vision, prompt, lock=self._vision_lock)
        future: Future = Future()
        keys = position_keys(prompt.ids, prompt.image_spans)
        # named here, in the caller's thread: admission asks them every step it waits
        req = _Request(prompt, keys, params, on_piece, cancel, priority, features, future, t0, next(self._order),
                       on_prompt_progress, gate=gate, rows=rows, history=history, kv=kv,
                       hashes=block_hashes(keys, self.pool.block))
        with self._cond:
            if self._closed:
                raise self._closed_error
            self._waiting.append(req)
            self._last_news = time.perf_counter()
            self._cond.notify_all()
        return future

    def generate(self, prompt: EncodedPrompt, params: SamplingParams, on_piece=None,
                 cancel: threading.Event | None = None, priority: bool = False,
                 on_prompt_progress: PromptProgress | None = None, gate: Gate | None = None,
                 arrival: Arrival | None = None) -> GenerationResult:
        """submit() and wait: on the loop's thread once started, else steps run here, in the
        caller's thread, until this one ends (a lone request is a batch of one)."""
        try:
            future = self.submit(prompt, params, on_piece, cancel, priority, on_prompt_progress, gate)
        finally:
            if gate is not None:
                gate.pass_one()  # in the queue, or refused
            if arrival is not None:
                arrival.done()
        return self.wait(future)

    def wait(self, future: Future):
        """The result of a submitted request, running the steps here while no loop thread does."""
        while self._thread is None and not future.done():
            if not self.step() and not future.done():
                raise EngineError("the request could not be admitted: the KV pool cannot hold its context")
        return future.result()

    def encode_images(self, prompt: EncodedPrompt, last: int, progress=None) -> None:
        """The prompt's last `last` images through the tower now (one at a time with `progress`),
        under the lock the requests' encoding takes; the tower keeps them by content."""
        spans = prompt.image_spans
        if last > 0 and spans and self.vision is not None:
            image_features(self.vision, prompt, spans[-min(last, len(spans))].start, self._vision_lock, progress)

    def arrival(self) -> Arrival:
        """Announce a request on its way (see Arrival); call its done() once it is queued."""
        with self._cond:
            self._arriving += 1
            self._last_news = time.perf_counter()
        return Arrival(self)

    def gate(self, n: int) -> Gate:
        """A gate for `n` requests submitted together."""
        return Gate(n, self._cond)

    def start(self) -> "BatchScheduler":
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="tramontane-batch", daemon=True)
            self._thread.start()
        return self

    def close(self, error: EngineError | None = None) -> None:
        """Stop the loop for good; what is queued or running fails with `error` (by default an
        EngineError saying the engine was closed)."""
        self.halt(error, final=True)

    def halt(self, error: EngineError | None = None, final: bool = False) -> None:
        """Stop the loop thread; what is queued or running fails with `error`. Unless `final`,
        callers may submit again afterwards (steps then run in their threads, or `start()` again)."""
        with self._cond:
            self._closed = True
            failure = error or self._closed_error
            if final:
                self._closed_error = failure
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        for seq in list(self._running):
            self._fail(seq, failure)
        with self._cond:
            waiting, self._waiting = self._waiting, []
            self._closed = final
        for req in waiting:
            req.future.set_exception(failure)

    @property
    def arriving(self) -> int:
        """Requests announced (`arrival`) and not yet queued."""
        return self._arriving

    @property
    def active(self) -> int:
        """Sequences running now (reading their prompt or decoding)."""
        return len(self._running)

    # -- the loop -----------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._running and not self._admissible():
                    self._cond.wait()
                if self._closed:
                    return
            try:
                self.step()
            except Exception as exc:  # noqa: BLE001 - a bug must not leave the clients waiting forever
                log.error("a batch step failed", exc_info=exc)
                for seq in list(self._running):
                    self._fail(seq, exc)

    def _admissible(self) -> bool:
        """A waiting request may be admitted (not held by its gate); under self._cond."""
        return any(r.gate is None or r.gate.open for r in self._waiting)

    def step(self) -> bool:
        """Admit what fits, then one forward pass for every running sequence; False when idle."""
        for seq in list(self._running):
            if seq.req.cancel is not None and seq.req.cancel.is_set():
                self._finish(seq, "cancelled")  # first: those that waited for its prompt are admitted now
        # nothing queued (a lone reply's every step): no lock, no admission pass; a request queued
        # meanwhile is seen by the next step
        taken = self._admit_arrived() if self._waiting else 0
        if taken and self._gathering(taken):
            self._gather()
            self._admit_arrived()
        if not self._running:
            return False
        decoding = [s for s in self._running if not s.reading]
        reading = sorted((s for s in self._running if s.reading), key=lambda s: (not s.req.priority, s.req.order))
        if reading and reading[0].req.priority:
            # The window's prompt is read alone (the streams wait these few steps): its first
            # token comes as fast as on an idle engine.
            decoding = [s for s in decoding if s.req.priority]
        plan = _StepPlan()
        self._plan_decode(plan, decoding)
        self._plan_prompts(plan, reading)
        if not plan.groups:  # every sequence was preempted for another's blocks
            return True
        n_sampled = len(plan.logit_rows)
        for _, first, n in plan.scored:  # every row of a scored prompt: its logits score the next token
            plan.logit_rows.extend(range(first, first + n))
        t0 = time.perf_counter()
        try:
            logits = self._forward(plan.parts, plan.groups, plan.logit_rows)
            self._score(plan.scored, logits[n_sampled:])
        except BaseException as exc:  # noqa: BLE001 - every sequence of the step hears it
            for s in plan.stepped:
                self._fail(s, exc)
            if not isinstance(exc, Exception):
                raise
            return True
        self.steps += 1
        self._after_step(plan, logits)
        if not plan.read_now:  # a decode step: its pass and its draws, by its rows
            self.step_times.record(plan.row, time.perf_counter() - t0)
        return True

    def _plan_decode(self, plan: "_StepPlan", decoding: list[_Sequence]) -> None:
        """The step's decode rows: each decoding sequence's pending token and its drafts (the
        draft model's for all its sequences in one call, or prompt lookup's), blocks reserved."""
        ids = []  # the decode rows' tokens, embedded in _forward
        self._retune_drafts(decoding)
        proposed = self._model_drafts(decoding)
        for s in decoding:
            if s.req.resume is s:  # preempted for the blocks of one before it
                continue
            # speculation: extra rows after its last token, verified after the pass
            drafts = proposed[s] if s in proposed else self._drafts(s)
            n = 1 + len(drafts)
            if not self._make_room(s, n, plan.stepped):
                continue
            ids += [s.pending, *drafts]
            plan.add(s, n, drafts)
        plan.decoded = list(plan.stepped)
        if ids:
            plan.parts.append(ids)

    def _plan_prompts(self, plan: "_StepPlan", reading: list[_Sequence]) -> None:
        """The step's prompt rows: each reading sequence's share (a whole chunk while its one
        caller drives the steps: nobody else can join or wait), blocks reserved; a prompt read
        to its end is sampled after the pass."""
        for s, n in zip(reading, self._prompt_shares(reading, self._thread is None) if reading else ()):
            if n == 0 or s.req.resume is s or not self._make_room(s, n, plan.stepped):
                continue
            plan.parts.append(s.embeds[s.read:s.read + n])
            if s.prompt_logprobs is not None:
                plan.scored.append((s, plan.row, n))
            s.read += n
            plan.add(s, n, None)
            plan.read_now.append(s)

    def _after_step(self, plan: "_StepPlan", logits: torch.Tensor) -> None:
        """After the pass: the fed tokens are in the KV, the prompt blocks read so far are named,
        progress is told, and every sampled row draws its token (first tokens first: a draw with
        temperature costs 3-15 ms of CPU on a 131072-token vocabulary, so a new request's first
        token must not wait for every stream's draw of this step)."""
        for s in plan.decoded:
            s.cached.append(s.pending)
            s.pending = None
        for s in plan.stepped:
            if s.n_sampled == 0:  # the blocks of the prompt read so far: later arrivals share them
                s.cache.publish(s.hashes)
        for s in plan.read_now:
            self._report_reading(s)
        for s, at, drafts in sorted(plan.sampled, key=lambda entry: entry[0].n_sampled > 0):
            if s.n_sampled == 0 and s.req.followers:
                self._start_followers(s, logits[at])
            try:
                if drafts:
                    self._verify(s, logits, at, drafts)
                else:
                    self._sample_next(s, logits[at])
            except BaseException as exc:  # noqa: BLE001 - a callback or NaN fails its own sequence
                self._fail(s, exc)

    # -- speculation -------------------------------------------------------------------------------
    def _drafts(self, s: _Sequence) -> list[int]:
        """The tokens to verify after `s`'s last one this step (prompt lookup), as many as its
        adaptive draft length says, within its context and token budget; [] for a plain step."""
        if s.lookup is None:
            return []
        s.lookup.extend(s.generated[len(s.lookup.ids) - len(s.req.prompt.ids):])
        room = self._room(s)
        drafts = s.lookup.draft(room) if room > 0 else []
        if not drafts:
            s.draft_length.record(0, 0)
        return drafts

    def _carry_acceptance(self, s: _Sequence) -> None:
        """A new reply starts from the acceptance the last one of its mode ended with (a chat's
        next reply drafts about as well as its last): with measured costs where a drafted row
        is dear, the prior's even odds would keep it from ever trying."""
        seen = self.acceptance_seen.get(s.req.params.speculation)
        if s.draft_length is not None and seen is not None:
            s.draft_length.start_from(*seen)

    def _retune_drafts(self, decoding: list[_Sequence]) -> None:
        """Each speculating sequence's draft length weighed with this machine's measured step
        costs beside the rows decoding now (a drafted row that costs nearly a step switches
        drafting off, one that costs nearly nothing keeps it)."""
        tuned = [s for s in decoding if s.draft_length is not None and s.req.resume is not s]
        if not tuned:
            return
        batch = sum(1 for s in decoding if s.req.resume is not s)
        costs: dict[SpeculationCost, SpeculationCost] = {}  # one table per prior (mode) a step
        for s in tuned:
            prior = s.draft_length.prior
            if prior not in costs:
                costs[prior] = self.step_times.cost(batch, prior)
            s.draft_length.retune(costs[prior], batch)

    def _room(self, s: _Sequence) -> int:
        """How many tokens `s` may have drafted this step: its adaptive length, within its context
        and its token budget."""
        cache = s.cache
        return min(s.draft_length.length(), cache.capacity - cache.length - 1,
                   s.req.params.max_tokens - len(s.generated))

    def _draft_cost(self) -> SpeculationCost:
        """SPEC_COST with a drafted token costing the draft model's decode step, by the bytes each
        model's step reads (decode is bound by reading the weights)."""
        share = self.draft_model.model.weight_bytes / max(1, self.model.weight_bytes)
        return SpeculationCost(SPEC_COST.verify, draft_token=share)

    def _model_drafts(self, decoding: list[_Sequence]) -> dict:
        """{sequence: drafts} from the draft model for the decoding sequences that asked for it,
        drafted together (one pass a token for all of them); {} without a draft model."""
        if self.draft_model is None:
            return {}
        who = [s for s in decoding if s.drafting and s.req.resume is not s]
        rooms = [self._room(s) for s in who]
        # each one's confirmed tokens, then the token this step feeds: the drafts follow it; a
        # sequence with no draft wanted is not named (its draft KV waits for its next probe)
        asked = [(s, room) for s, room in zip(who, rooms) if room > 0]
        drafts = self.draft_model.draft([(s.req.order, s.req.prompt.ids + s.cached + [s.pending], room)
                                         for s, room in asked]) if asked else []
        proposed = dict.fromkeys(who, [])
        proposed.update(zip((s for s, _ in asked), drafts))
        for s in who:
            if not proposed[s]:
                s.draft_length.record(0, 0)
        return proposed

    def _verify(self, s: _Sequence, logits: torch.Tensor, at: int, drafts: list[int]) -> None:
        """Rows at, at+1, ... of `logits` follow `s`'s last token and then each draft: each row's
        token is drawn exactly as a plain step draws it (processors, grammar, logprobs, stop rules:
        `_sample_next`), and the next row counts only while the drawn token is the draft it was
        fed. Lossless: greedy output is the plain output token for token, and sampled output is
        drawn from the same rows in the same order. The cache keeps the rows that were confirmed."""
        cache = s.cache
        start = cache.length - len(drafts) - 1  # the position of the token this step fed first
        accepted = 0
        # counted as they happen: a reply that ends in this step has its result made inside _sample_next
        s.drafted += len(drafts)
        for j in range(len(drafts) + 1):
            cache.length = start + j + 1  # valid through the input of row j
            self._sample_next(s, logits[at + j])
            if s.pending is None:  # the reply ended (EOS, stop, length, cancel)
                break
            if j < len(drafts) and s.pending == drafts[j]:
                s.cached.append(s.pending)
                s.pending = None
                accepted += 1
                s.accepted += 1
                continue
            break
        s.draft_length.record(len(drafts), accepted)

    @staticmethod
    def _score(scored: list, logits: torch.Tensor) -> None:
        """Each scored prompt row's log-probability of the prompt token after it (the rows of
        `logits` in the order of `scored`); the prompt's last row predicts nothing of it."""
        lo = 0
        for s, _, n in scored:
            first = s.reused + s.read - n  # the position of its first row in this step
            ids = s.req.prompt.ids
            rows = min(n, len(ids) - 1 - first)
            if rows > 0:
                targets = torch.tensor(ids[first + 1:first + 1 + rows], device=logits.device)
                logp = torch.log_softmax(logits[lo:lo + rows].float(), dim=-1)
                s.prompt_logprobs.extend(logp.gather(1, targets[:, None]).squeeze(1).tolist())
                if s.prompt_top is not None:  # the alternatives at each position (echo with logprobs N)
                    values, ids = torch.topk(logp, min(s.req.params.logprobs, logp.shape[-1]))
                    s.prompt_top.extend(tuple(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist()))
            lo += n

    def _forward(self, parts: list, groups: list, logit_rows: list[int]) -> torch.Tensor:
        """The step's one pass: `parts` the decode rows' ids first (a list), then prompt rows. A
        step of decode rows only on a pool with decode graphs replays them (runtime/decoder.decode_rows)."""
        if len(parts) == 1 and isinstance(parts[0], list) and len(parts[0]) == len(groups) \
                and self.pool.decode_graphs is not None:
            return decode_rows(self.model, parts[0], [g[0] for g in groups])
        rows = [self.model.embed(p) if isinstance(p, list) else p for p in parts]
        embeds = rows[0] if len(rows) == 1 else torch.cat([r.to(rows[0].device) for r in rows])
        return self.model.forward_batch(embeds, groups, logit_rows)

    def _prompt_shares(self, reading: list[_Sequence], alone: bool = False) -> list[int]:
        """The prompt rows each reading sequence (in lane order) gets this step: step_rows in all,
        on top of the decode rows (a prompt reads as fast as alone), or, while the caller drives the
        steps (`alone`: nobody else can join), the model's prefill chunk, a forward call's passes. The window's prompts take
        what they need first. Of the others, the oldest is sure of an equal share (it always
        advances: nobody starves) and the rest goes to those with the fewest rows left first (the
        most first tokens soonest): a short question behind a long document is read in the next
        step, not after the whole document, and a burst of prompts that does not fit in one step
        leaves one for the next, not every one a last row short."""
        budget = (self._given_rows or self.model.prefill_chunk) if alone else self.step_rows
        left = [s.embeds.shape[0] - s.read for s in reading]
        shares = [0] * len(reading)
        others = []
        for i, s in enumerate(reading):
            if s.req.priority:
                shares[i] = min(budget, left[i])
                budget -= shares[i]
            else:
                others.append(i)
        if others:
            oldest = others[0]
            shares[oldest] = min(left[oldest], budget // len(others))
            budget -= shares[oldest]
            for i in sorted(others, key=lambda i: left[i]):  # stable: in order on ties
                more = min(budget, left[i] - shares[i])
                shares[i] += more
                budget -= more
        return shares

    # -- admission ------------------------------------------------------------------------------------
    def _admit_arrived(self) -> int:
        """Admit what fits, again while requests came meanwhile (a burst of clients: those queued
        while the first were being set up join this step instead of waiting a whole step for the
        next); how many left the queue. Every pass but the last takes a slot or a follower."""
        taken = 0
        for _ in range(self.max_seqs + self.priority_seqs + 1):
            n = self._admit()
            taken += n
            if not n or not self._waiting:
                break
        return taken

    def _gathering(self, taken: int) -> bool:
        """This step starts new prompts while others could join it (announced ones, or more of a
        burst when it took several): not the window's prompt (read alone), and only while a slot
        is free for them. A lone request never waits."""
        if self.gather_s <= 0 or not (self._arriving or taken > 1):
            return False
        if any(s.req.priority and s.reading for s in self._running):
            return False
        return self._lane_open(False)

    def _gather(self) -> None:
        """Wait (at most gather_s) until the announced requests are queued and no other has come
        for GATHER_QUIET_S (the server takes a burst's requests one by one)."""
        deadline = time.perf_counter() + self.gather_s
        with self._cond:
            while not self._closed:
                now = time.perf_counter()
                until = deadline if self._arriving > 0 else min(deadline, self._last_news + GATHER_QUIET_S)
                if now >= until:
                    break
                self._cond.wait(until - now)

    def _admit(self) -> int:
        """Start what fits from the queue; how many requests left it."""
        with self._cond:
            queue = sorted(self._waiting, key=lambda r: (not r.priority, r.order))
            admitted = []
            before = len(self._waiting)
            for req in queue:
                if req.cancel is not None and req.cancel.is_set():  # its client left while it waited
                    self._waiting.remove(req)
                    self._cancelled(req)
                    continue
                if req.gate is not None and not req.gate.open:
                    continue  # the others of its group are not all here yet
                leader = self._reading_the_same(req, admitted)
                if leader is not None:  # read once: it starts from the leader's KV (_start_followers)
                    leader.followers.append(req)
                    self._waiting.remove(req)
                    continue
                if not self._fits_now(req, len(admitted)):
                    continue
                admitted.append(req)
                self._waiting.remove(req)
            taken = before - len(self._waiting)
        for req in admitted:
            try:
                self._start(req)
            except BaseException as exc:  # noqa: BLE001 - e.g. a bad image: that request fails
                self._requeue(req)
                req.future.set_exception(exc)
        return taken

    def _cancelled(self, req: _Request) -> None:
        seq = req.resume
        if seq is not None:  # preempted: what it generated before stands
            req.resume = None
            seq.cache = KVCache(self.pool, self.context)
            self._finish(seq, "cancelled", running=False)
            return
        req.future.set_result(self._result(req, [], "", 0, KVCache(self.pool, self.context), "cancelled",
                                           None, None, 0))

    def _lane_open(self, priority: bool, admitted: int = 0) -> bool:
        """A sequence of this lane may start now (counting `admitted` ones starting this round)."""
        running = len(self._running) + admitted
        if running >= self.max_seqs + self.priority_seqs:
            return False
        return priority or sum(not s.req.priority for s in self._running) + admitted < self.max_seqs

    def _fits_now(self, req: _Request, admitted: int) -> bool:
        """The request may start: its lane has room, and the pool has blocks for its prompt's
        unknown part and its first token beside what the running sequences will soon need (one
        block each), counting published blocks it would share as free. A lone request always
        starts (the pool is its own)."""
        if not self._lane_open(req.priority, admitted):
            return False
        if req.kv is not None or (not self._running and not admitted):
            return True
        b = self.pool.block
        n = len(req.keys) + (len(req.resume.cached) + 1 if req.resume is not None else 1)
        known = 0
        for digest in req.hashes[:n // b]:
            if not self.pool.holds(digest):
                break
            known += 1
        need = -(-n // b) - known
        return self.pool.available() - need >= len(self._running) + admitted

    def _reading_the_same(self, req: _Request, admitted: list[_Request]) -> _Request | None:
        """A request of the same lane with this very prompt whose prompt is still to be read
        (running, or admitted in this round), or None."""
        candidates = [s.req for s in self._running if s.n_sampled == 0] + admitted
        if req.params.prompt_logprobs or req.kv is not None or req.resume is not None:
            return None  # scored (its own pass), a caller's KV, or going on from its own output
        return next((r for r in candidates if r.priority == req.priority and r.keys == req.keys), None)

    def _requeue(self, req: _Request) -> None:
        """The requests that waited for `req`'s prompt go back to the queue (it failed or ended
        before it was read, or there was no slot to copy it into)."""
        followers, req.followers = req.followers, []
        if followers:
            with self._cond:
                self._waiting.extend(followers)
                self._cond.notify()

    def _match(self, hashes: Sequence[bytes], keys: Sequence[Key]) -> tuple[list[int], int]:
        """The longest run of known blocks for these hashes, each now held once more for the
        caller, and the positions they hold: the pool's own, then blocks read back from the tier
        below (host memory, the disk) into blocks of the pool (never evicting one of this run:
        those are held); after every full block, the longest known tail block (a chat that ended
        there)."""
        pool, blocks, b = self.pool, [], self.pool.block
        with pool.lock:
            for digest in hashes:
                if (found := self._known_block(digest)) is None:
                    break
                blocks.append(found)
            full = hashes[:len(blocks)]
            for end in range(min(len(keys), (len(blocks) + 1) * b - 1), len(blocks) * b, -1):
                if (found := self._known_block(tail_hash(full, keys[:end], b))) is not None:
                    blocks.append(found)
                    return blocks, end
        return blocks, len(blocks) * b

    def _known_block(self, digest: bytes) -> int | None:
        """The block of that name, held once more (read back from the tier below if need be), or None."""
        pool = self.pool
        with pool.lock:
            b = pool.find(digest)
            if b is not None:
                pool.share(b)
                return b
            item = self.prefix.get(digest)
            if item is None:
                return None
            try:
                b = pool.take()
            except KVPoolFull:
                return None
            pool.write_block(b, *item)
            pool.publish(digest, b)
            return b

    def _start(self, req: _Request) -> None:
        if req.cancel is not None and req.cancel.is_set():
            self._requeue(req)
            self._cancelled(req)
            return
        seq, req.resume = req.resume, None
        keys = req.keys + (seq.cached + ([seq.pending] if seq.pending is not None else []) if seq else [])
        # a preempted sequence's output goes on the prompt's chain of names
        hashes = block_hashes(keys, self.pool.block, req.hashes) if len(keys) > len(req.keys) else req.hashes
        if req.kv is not None:  # the caller's sequence, holding keys[:length] (generate())
            cache = req.kv
            reused = cache.length
        else:
            cache = KVCache(self.pool, self.context)
            # a scored prompt is read whole: every token's log-probability comes from this pass
            blocks, held = ([], 0) if req.params.prompt_logprobs else self._match(hashes, keys)
            reused = reusable_prefix(keys[:held], keys, req.prompt.image_spans) if blocks else 0
            used = -(-reused // self.pool.block)
            for b in blocks[used:]:
                self.pool.drop(b)
            cache.adopt(blocks[:used], reused)
        try:
            if req.rows is not None and reused + req.rows.shape[0] != len(keys):
                raise EngineError(f"{req.rows.shape[0]} input rows after {reused} reused positions for a prompt of "
                                  f"{len(keys)}")
            n_prompt = len(req.keys)
            rows = req.rows if req.rows is not None else self._embeddings(req, min(reused, n_prompt))
            if len(keys) > n_prompt:  # a preempted sequence: its output after the prompt is read again
                own = torch.tensor(keys[max(reused, n_prompt):], dtype=torch.long)
                own_rows = self.model.embed(own).to(rows.device, rows.dtype)
                rows = torch.cat([rows if reused < n_prompt else rows[:0], own_rows])
        except BaseException:
            if req.kv is None:
                cache.release()
            raise
        if seq is None:
            seq = _Sequence(req, cache, reused, rows, self.tokenizer)
            if seq.drafting and self.draft_model is not None:  # a draft token costs a draft model's step
                seq.draft_length = AdaptiveDraftLength(self._draft_cost(), req.params.spec_tokens)
            self._carry_acceptance(seq)
        else:  # it goes on: the token it had drawn is read with the rest, the next one drawn after
            seq.cache, seq.embeds, seq.read = cache, rows, 0
            seq.cached, seq.pending = keys[n_prompt:], None
        seq.hashes = hashes
        self._running.append(seq)
        if seq.reading:
            self._report_reading(seq)

    def _start_followers(self, leader: _Sequence, logits: torch.Tensor) -> None:
        """The requests that waited for `leader`'s prompt: each shares its blocks (the last one is
        copied when written), sampling its first token from the same logits (so they decode in
        the leader's steps from the next one on). Without room one goes back to the queue."""
        followers, leader.req.followers = leader.req.followers, []
        n = leader.cache.length
        for req in followers:
            if req.cancel is not None and req.cancel.is_set():
                self._cancelled(req)
                continue
            if not self._lane_open(req.priority):
                with self._cond:
                    self._waiting.append(req)
                continue
            cache = KVCache(self.pool, self.context)
            for b in leader.cache.blocks:
                self.pool.share(b)
            cache.adopt(leader.cache.blocks, n)
            seq = _Sequence(req, cache, n, leader.embeds[:0], self.tokenizer)
            self._carry_acceptance(seq)
            seq.hashes = leader.hashes
            self._running.append(seq)
            try:
                self._sample_next(seq, logits)
            except BaseException as exc:  # noqa: BLE001 - as a sequence of the step would
                self._fail(seq, exc)

    @staticmethod
    def _report_reading(s: _Sequence) -> None:
        if s.req.on_prompt_progress is None:
            return
        try:
            s.req.on_prompt_progress(s.read, s.embeds.shape[0])
        except Exception:  # noqa: BLE001 - a display must not stop the reply
            log.exception("the prompt progress callback failed")

    def _embeddings(self, req: _Request, start: int) -> torch.Tensor:
        """Input rows for prompt positions [start, end), image features spliced in (prompts.prompt_rows)."""
        return prompt_rows(self.model, self._img_id, req.prompt, start, req.features)

    # -- sampling and the end of a sequence -------------------------------------------------------
    def _sample_next(self, s: _Sequence, logits: torch.Tensor) -> None:
        """The token after this step's last row, as generate() does after a forward."""
        params = s.req.params
        if params.max_tokens == 0:
            return self._finish(s, "length")
        if s.n_sampled == 0:
            if not params.greedy:
                s.generator = make_generator(params.seed, logits.device)
            if params.repetition_penalty != 1.0:
                history = s.req.history if s.req.history is not None else s.req.prompt.ids
                s.seen = seen_mask(history, logits.shape[-1], logits.device)
        token = draw_token(logits, params, self.tokenizer, s.generated, s.generator, s.seen, s.logprobs)
        s.n_sampled += 1
        s.t_last = time.perf_counter()
        if s.t_first is None:
            s.t_first = s.t_last
        if token is not None:
            self._emit_text(s, token, s.decoder.push(token))
        reason = stop_reason(token, s.stop, len(s.generated), params, s.req.cancel, s.cache)
        if reason is not None:
            return self._finish(s, reason)
        s.pending = token

    def _emit_text(self, s: _Sequence, token: int | None, piece: str) -> None:
        """A token's decoded text (token None: the decoder's flushed end): a reasoning model's
        thought streams as ReasoningPiece and stays out of the answer, which alone meets the stop
        strings and becomes the result's text."""
        if s.thought is not None:
            delta = s.thought.push(token, piece) if token is not None else s.thought.tail(piece)
            if delta.reasoning:
                self._emit(s, ReasoningPiece(delta.reasoning))
            piece = delta.content
        self._emit(s, s.stop.feed(piece, final=token is None))

    @staticmethod
    def _emit(s: _Sequence, piece: str) -> None:
        if piece and s.req.on_piece is not None:
            if s.logprobs is not None and not isinstance(piece, ReasoningPiece):
                # the tokens drawn since the last piece (a stop string's held text waits with its entries)
                piece = LoggedPiece(piece, s.logprobs[s.logprobs_streamed:])
                s.logprobs_streamed = len(s.logprobs)
            s.req.on_piece(piece)

    def _publish(self, s: _Sequence, keys: Sequence[Key] | None = None) -> None:
        """Name the sequence's full blocks in the pool (later sequences with the same prefix share
        them), and queue the new ones for the disk tier (a chat survives a restart)."""
        hashes = s.hashes
        if keys is not None and len(keys) // self.pool.block > len(hashes):
            hashes = s.hashes = block_hashes(keys, self.pool.block, s.hashes)
        s.cache.publish(hashes)
        names = list(zip(hashes, s.cache.blocks[:s.cache.length // self.pool.block]))
        if keys is not None:  # it ended: its blocks by every leading part (the next turn, a regenerate, an edit)
            parts = prefix_names(hashes, keys[:s.cache.length], self.pool.block, s.reused // self.pool.block)
            s.cache.publish_prefixes(parts)
            last = len(s.cache.blocks) - 1
            tail = next((name for i, name in parts if i == last), None)  # its longest name comes first
            if s.cache.length % self.pool.block and tail is not None:  # the last block, partly filled: to disk too
                names.append((tail, s.cache.blocks[last]))
        if self.prefix.disk is not None:
            for digest, b in names:
                if digest not in self.prefix.disk:
                    self.prefix.persist(digest, *self.pool.read_block(b))

    def _release(self, s: _Sequence, running: bool = True) -> None:
        if running:
            self._running.remove(s)
        if s.drafting and self.draft_model is not None:  # its draft KV serves a next turn or the same prompt again
            self.draft_model.retire(s.req.order)
        if s.req.kv is None:  # a caller's KV stays theirs (generate())
            s.cache.release()
        self._requeue(s.req)  # it ended before its prompt was read: those waiting for it read it

    def _preempt(self, s: _Sequence) -> None:
        """Out of blocks: `s` leaves the step and goes back to the queue, its full blocks named
        (it shares them again on its return unless they were reused meanwhile), to go on where it
        stopped: prompt and output read again, the token it had drawn fed with them."""
        self._publish(s, s.req.keys + s.cached)
        self._running.remove(s)
        s.cache.release()
        self.preempted += 1
        s.req.resume = s
        with self._cond:
            self._waiting.append(s.req)

    def _make_room(self, s: _Sequence, n: int, stepping: list[_Sequence]) -> bool:
        """Blocks for `s`'s next n rows, preempting the youngest running sequence of the API lane
        that is not in this step yet while the pool has none; False when `s` itself must go
        (nothing else to preempt: it was preempted)."""
        while True:
            try:
                s.cache.reserve(n)
                return True
            except KVPoolFull:
                victims = [v for v in self._running if v is not s and v not in stepping and not v.req.priority
                           and v.req.kv is None and v.prompt_logprobs is None]
                if not victims:
                    if s.req.kv is not None or s.prompt_logprobs is not None or len(self._running) == 1:
                        raise
                    self._preempt(s)
                    return False
                self._preempt(max(victims, key=lambda v: v.req.order))

    def _finish(self, s: _Sequence, reason: FinishReason, running: bool = True) -> None:
        if s.draft_length is not None and s.drafted:
            self.acceptance_seen[s.req.params.speculation] = s.draft_length.counts
        if not s.stop.stopped:
            self._emit_text(s, None, s.decoder.flush())
        cache = s.cache
        if reason != "cancelled" or not s.reading:
            self._publish(s, s.req.keys + s.cached)
        self.replies.remember_reply(s.stop.text, s.generated, reason, lambda ids: self.tokenizer.decode(ids))
        result = self._result(s.req, s.generated, s.stop.text, s.reused, cache, reason, s.t_first, s.t_last,
                              s.n_sampled)
        self._release(s, running)
        result.logprobs = s.logprobs
        result.prompt_logprobs = s.prompt_logprobs
        result.prompt_top_logprobs = s.prompt_top
        if s.thought is not None:
            result.reasoning = s.thought.reasoning
        result.stats.drafted_tokens, result.stats.accepted_tokens = s.drafted, s.accepted
        s.req.future.set_result(result)

    def _fail(self, s: _Sequence, exc: BaseException) -> None:
        # The cache's length counts only rows whose forward pass completed (a prefix of the
        # prompt and of what was fed back): those are named for the next try (a retry after a
        # failed callback reuses them), and a caller's KV is left holding just those.
        self._publish(s, s.req.keys + s.cached)
        self._release(s)
        s.req.future.set_exception(exc)

    @staticmethod
    def _result(req: _Request, generated, text, reused, cache, reason, t_first, t_last, n_sampled) -> GenerationResult:
        stats = reply_stats(len(req.prompt.ids), reused, len(generated), cache, reason, req.t0, t_first, t_last,
                            n_sampled)
        return GenerationResult(text, list(generated), list(req.prompt.ids), stats)


@dataclass
class GenerationOutput:
    token_ids: list[int]  # generated ids, without a final EOS
    text: str  # decoded, stop string (and what followed it) cut off
    stats: GenerationStats
    # The generated ids whose K/V are in the cache (all but the last sampled one, which was
    # never fed back): the cache holds prompt + cached_ids.
    cached_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None  # per generated token, when params.logprobs is set


def generate(model, cache, prompt, params: SamplingParams, tokenizer, on_piece: Callable[[str], None] | None = None,
             cancel: threading.Event | None = None, start_pos: int | None = None,
             history_ids: Sequence[int] | None = None,
             on_prompt_progress: PromptProgress | None = None) -> GenerationOutput:
    """One sequence on a model and a KV cache of the caller's, as a batch of one of the scheduler
    (the one loop; the steps run in this thread): prefill `prompt` (token ids, or (T, hidden)
    input rows with image features spliced in) at `start_pos` (default: the cache's length; a
    smaller value truncates the cache first), then sample until EOS (unless params.ignore_eos), a
    stop string, max_tokens, a full context, or `cancel` (checked before every step, so another
    thread stops it within one prompt chunk or token). Text pieces stream through `on_piece`.

    `history_ids`: every token id of the sequence so far (the repetition penalty's); by default
    the prompt's ids when the prompt is ids."""
    check_params(params)
    start_pos = cache.length if start_pos is None else start_pos
    if start_pos > cache.length:
        raise EngineError(f"cannot start at position {start_pos}: the KV cache holds {cache.length}")
    cache.truncate(start_pos)
    if isinstance(prompt, torch.Tensor) and prompt.is_floating_point():
        rows, ids = (prompt[0] if prompt.dim() == 3 else prompt), None
    else:
        ids = prompt.tolist() if isinstance(prompt, torch.Tensor) else [int(t) for t in prompt]
        rows = model.embed(ids) if ids else None
    if rows is None or rows.shape[0] == 0:
        raise EngineError("the prompt is empty: give at least one token")
    n = start_pos + rows.shape[0]
    history = list(history_ids) if history_ids is not None else ids
    # positions the caller's cache holds are reused as they are (the request's keys say so)
    known = list(history) if history is not None and len(history) == n else [0] * start_pos + (ids or [0] * rows.shape[0])
    scheduler = BatchScheduler(model, tokenizer, slots=1, priority_slots=0, pool=cache.pool, context_length=cache.capacity,
                               prefix_cache=PrefixCache(0), gather_s=0.0, replies=ReplyMemory(capacity=0))
    future = scheduler.submit(EncodedPrompt(known), params, on_piece, cancel, on_prompt_progress=on_prompt_progress,
                              rows=rows, history=history or [], kv=cache)
    result = scheduler.wait(future)
    fed = max(0, cache.length - n)
    return GenerationOutput(result.token_ids, result.text, result.stats, result.token_ids[:fed], result.logprobs)


class BatchedEngine:
    """What a server job gets from a BatchExecutor: LocalEngine's `chat` / `complete`, callable
    from many threads at once, each call one sequence of the scheduler (it blocks until done).
    `priority`: the lane of its calls (`prioritized()`: the window's own replies). `arrival`: the
    announcement of a server job's request (`for_job`), done once its first generation is queued."""

    def __init__(self, engine, scheduler: BatchScheduler, priority: bool = False, gate: Gate | None = None,
                 arrival: Arrival | None = None):
        self.engine = engine
        self.scheduler = scheduler
        self.priority = priority
        self._gate = gate  # its first generation is one of a group (run_together)
        self.arrival = arrival
        self.model_path = engine.model_path
        self.tokenizer = engine.tokenizer

    def for_job(self) -> "BatchedEngine":
        """The same engine for one server job, its request announced to the scheduler from now
        on (call `arrival.done()` when the job ends: a job that never generates must not be
        waited for)."""
        return BatchedEngine(self.engine, self.scheduler, self.priority, arrival=self.scheduler.arrival())

    def prioritized(self) -> "BatchedEngine":
        """The same engine whose calls go on the priority lane (a kept slot, prompt read first)."""
        return BatchedEngine(self.engine, self.scheduler, priority=True)

    @property
    def model(self):
        return self.engine.model

    @property
    def has_vision(self) -> bool:
        return self.engine.vision is not None

    @property
    def context_size(self) -> int:
        return self.scheduler.lane_context(self.priority)

    @property
    def mmproj_path(self):
        return self.engine.mmproj_path

    @property
    def context_limit(self) -> int:
        return self.engine.context_limit

    @property
    def device_kind(self) -> str:
        return self.engine.device_kind

    @property
    def placement(self) -> dict:
        return self.engine.placement

    @property
    def writes_tool_calls(self) -> bool:
        return True

    def count_tokens(self, messages: list[ChatMessage]) -> int:
        return len(self.encode(messages).ids)

    @property
    def image_geometry(self):
        return self.engine.image_geometry

    @property
    def think_ids(self):
        return self.engine.think_ids

    @property
    def chat_version(self) -> int:
        return self.engine.chat_version

    def forget_chat(self, messages: list[ChatMessage]) -> None:
        self.engine.forget_chat(messages)  # the prefix cache and reply ids are the engine's, shared

    def encode_images(self, messages: list[ChatMessage], last: int, progress=None) -> None:
        self.scheduler.encode_images(self.encode(messages), last, progress)

    def forget_session(self, session_key: str) -> None:
        """Nothing of its own: the scheduler finds KV by content (forget_chat drops it)."""

    def close(self) -> None:
        """The scheduler and the engine belong to their owner (BatchExecutor.shutdown)."""

    @property
    def description(self) -> str:
        n = self.scheduler.max_seqs
        return f"{self.engine.description}, {n} sequences at once of {self.context_size} tokens each"

    def encode(self, messages: list[ChatMessage], tools=None) -> EncodedPrompt:
        return self.engine.encode(messages, tools, self.scheduler.replies)  # the engine's, when it built the scheduler

    def generate_from(self, prompt: EncodedPrompt, params: SamplingParams, on_piece=None,
                      cancel: threading.Event | None = None, session_key: str | None = None,
                      priority: bool | None = None,
                      on_prompt_progress: PromptProgress | None = None) -> GenerationResult:
        """Reply to an encoded prompt (from `encode`)."""
        return self.scheduler.generate(prompt, params, on_piece, cancel, self._lane(priority), on_prompt_progress,
                                       self._take_gate(), self.arrival)

    def chat(self, messages: list[ChatMessage], params: SamplingParams, on_piece=None,
             cancel: threading.Event | None = None, session_key: str | None = None, tools=None,
             priority: bool | None = None, on_prompt_progress: PromptProgress | None = None) -> GenerationResult:
        """session_key is accepted for the Engine protocol: the prefix cache finds any
        conversation's KV by its tokens, whatever it is called."""
        gate = self._take_gate()
        try:
            check_params(params)
            prompt = self.encode(messages, tools)
        except BaseException:
            if gate is not None:
                gate.pass_one()
            raise
        return self.scheduler.generate(prompt, params, on_piece, cancel, self._lane(priority), on_prompt_progress,
                                       gate, self.arrival)

    def complete(self, prompt_ids: list[int], params: SamplingParams, on_piece=None,
                 cancel: threading.Event | None = None, session_key: str | None = None,
                 priority: bool | None = None, on_prompt_progress: PromptProgress | None = None) -> GenerationResult:
        gate = self._take_gate()
        try:
            check_params(params)
            check_prompt_ids(prompt_ids, self.tokenizer.vocab_size)
        except BaseException:
            if gate is not None:
                gate.pass_one()
            raise
        return self.scheduler.generate(EncodedPrompt(list(prompt_ids)), params, on_piece, cancel,
                                       self._lane(priority), on_prompt_progress, gate, self.arrival)

    def run_together(self, fn: Callable[["BatchedEngine", int], T], n: int) -> list[T]:
        """fn(engine, i) for i in range(n) at once, each on a thread of its own with an engine
        whose first generation waits for the others' (a request's `n` choices): they are
        admitted in the same step, the scheduler reads their common prompt once and they decode
        as rows of the same steps. Their results in order, or the first failure in that order."""
        if n <= 1:
            return [fn(self, i) for i in range(n)]
        if self.arrival is not None:
            self.arrival.done()  # the gate holds its choices until all are queued
        gate = self.scheduler.gate(n)
        views = [BatchedEngine(self.engine, self.scheduler, self.priority, gate) for _ in range(n)]

        def run(i: int) -> T:
            try:
                return fn(views[i], i)
            finally:
                if views[i]._take_gate() is not None:
                    gate.pass_one()  # it ended before generating: the others need not wait for it

        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="tramontane-choice") as pool:
            futures = [pool.submit(run, i) for i in range(n)]
            return [f.result() for f in futures]

    def _lane(self, priority: bool | None) -> bool:
        return self.priority if priority is None else priority

    def _take_gate(self) -> Gate | None:
        """The gate for this engine's first generation, once (later ones are not grouped)."""
        gate, self._gate = self._gate, None
        return gate


__all__ = ["Arrival", "BatchScheduler", "BatchedEngine", "DEFAULT_SLOTS", "Gate", "STEP_SHARE", "GenerationOutput",
           "generate"]
