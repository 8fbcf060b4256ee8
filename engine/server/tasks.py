"""The one request model under every API (llama-server's server-task, vLLM's serving engine
call): each API module turns its body into a `ChatJob` and its events into its own wire
format; what runs on the engine (the prompt encoded and checked, tools and grammars, `n`
choices, the conversation's KV session, usage, failures in words) is here, once.

A `Generation` is one request's engine job, submitted at once: its events (text pieces per
choice, each choice's end) reach the event loop in batches (`_Relay`), and its outcomes are
`(GenerationResult, stop_reason)` per choice.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..api import EngineError, GenerationResult, LoggedPiece, ReasoningPiece, SamplingParams
from ..runtime.generate import InvalidLogitsError
from ..runtime.prompts import fits
from .errors import ApiError
from .executor import EngineExecutor, ModelUnavailable
from .openai_api import ChatJob, ConversationKeys, RequestLimits, ServedModel, context_exceeded, stop_reason
from .openai_api import reasoning_of  # noqa: F401 - the APIs read it from here, beside reply_events
from .tools_api import ToolStream, engine_params, prompt_token_logprobs, read_tool_calls, shown_pieces

log = logging.getLogger(__name__)

COMPLETIONS_SESSION = ConversationKeys.PREFIX + "completions"  # raw prompts share one KV entry
END = object()  # the job is done (after its last piece)
STREAMED = ("text", "reasoning")  # the kinds of event that carry a piece of the reply
STREAM_BATCH_S = 0.02  # streamed text after the first piece reaches the client at most this much later
# An absolute file path (POSIX or Windows) in an engine's message: shown as its last part only.
# Quoted (as OSError writes them), a path may hold spaces.
_QUOTED_PATH = re.compile(r"(['\"])(?:[A-Za-z]:)?[\\/](?:[^'\"\n]*[\\/])?([^'\"\\/\n]*)\1")
_FILE_PATH = re.compile(r"(?<![\w.:/\\])(?:[A-Za-z]:)?[\\/](?:[^\s'\"\\/]+[\\/])+([^\s'\"\\/]*)")


@dataclass(frozen=True)
class Finished:
    """What `on_finished` hears after each generation (on the server's thread)."""

    endpoint: str  # "chat" or "completions" (every chat-shaped API is "chat")
    result: GenerationResult
    session_key: str


def without_paths(message: str, known: tuple = ()) -> str:
    """An engine's message with every file path cut to its last part (a client never learns
    where the server keeps its files): the engine's own files first (their folders may hold
    spaces), then anything else shaped like an absolute path."""
    for path in known:
        if path:
            message = message.replace(str(path), os.path.basename(str(path)))
    message = _QUOTED_PATH.sub(lambda m: m.group(1) + m.group(2) + m.group(1), message)
    return _FILE_PATH.sub(lambda m: m.group(1), message)


def engine_failure(exc: BaseException, known_paths: tuple = ()) -> ApiError:
    """An exception from a job as the client should read it."""
    if isinstance(exc, ApiError):
        return exc
    words = without_paths(str(exc), known_paths)
    if isinstance(exc, ModelUnavailable):
        return ApiError(503, words, code="model_not_loaded")
    if isinstance(exc, InvalidLogitsError):
        return ApiError(500, words, code="invalid_logits")
    if isinstance(exc, EngineError):
        return ApiError(400, words)
    if isinstance(exc, MemoryError):
        return ApiError(503, "out of memory while generating: send a shorter prompt", code="out_of_memory")
    log.error("a server job failed", exc_info=exc)
    return ApiError(500, f"the engine failed: {type(exc).__name__}: {words}")


def surely_fits(messages, context_size: int) -> bool:
    """Whether a text-only conversation fits with room for a reply whatever its tokens: a token
    is at least one byte, the format adds at most 3 tokens a message (and BOS), and joins parts
    with 2 bytes. Longer ones are encoded and counted first, for OpenAI's over-context error."""
    tokens = 1
    for m in messages:
        tokens += 3
        for part in m.parts:
            if not isinstance(part, str):
                return False
            tokens += len(part.encode("utf-8", "surrogatepass")) + 2
    return fits(tokens, context_size)


def choice_params(params: SamplingParams, choice: int) -> SamplingParams:
    """The sampling of one of `n` choices: a given seed is moved by the choice's number, so the
    choices differ and the request stays reproducible."""
    if choice == 0 or params.seed is None:
        return params
    return dataclasses.replace(params, seed=params.seed + choice)


class _Relay:
    """Carries a job's events from the engine thread to the event loop: text pieces (with their
    choice's index), each choice's end, then the job's end.

    Events cross in batches: the first event of a batch wakes the loop, which takes the batch
    STREAM_BATCH_S later with whatever arrived meanwhile, so a fast engine is not slowed by a
    thread hand-over (and the GIL going back and forth) per token. The reply's first piece
    goes at once (time to first token)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, cancel: threading.Event):
        # ("text", i, str) / ("reasoning", i, str) / ("end", i, outcome), then END
        self.events: asyncio.Queue = asyncio.Queue()
        self._loop = loop
        self._cancel = cancel
        self._arrived: list[tuple] = []
        self._lock = threading.Lock()
        self._delay = 0.0

    def call(self, fn, *args) -> None:
        """Run fn on the loop (from any thread); a stopped server cancels the job instead."""
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self._cancel.set()

    def post(self, index: int, piece: str) -> None:  # engine thread
        # The one place a streamed thought (ReasoningPiece) becomes its own kind of event: the
        # merging below makes plain str of it, and every API reads the kind, not the type.
        # An answer's piece stays itself (a LoggedPiece keeps its tokens' logprobs).
        self._add(("reasoning", index, str(piece)) if isinstance(piece, ReasoningPiece) else ("text", index, piece))

    def choice_done(self, index: int, outcome) -> None:  # engine thread
        self._add(("end", index, outcome))

    def _add(self, event: tuple) -> None:
        with self._lock:
            self._arrived.append(event)
            if len(self._arrived) > 1:
                return  # a hand-over is already on its way and will take this event too
        self.call(self._loop.call_later, self._delay, self._hand_over)
        self._delay = STREAM_BATCH_S

    def end(self) -> None:  # on the loop, after the job's last event
        self._hand_over()  # the last batch now, not after its delay
        self.events.put_nowait(END)

    def _hand_over(self) -> None:  # on the loop: consecutive texts (or thoughts) of one choice as one event
        with self._lock:
            arrived, self._arrived = self._arrived, []
        merged: list[tuple] = []
        for event in arrived:
            if merged and event[0] in STREAMED and merged[-1][:2] == event[:2]:
                merged[-1] = (event[0], event[1], LoggedPiece.joined(merged[-1][2], event[2]))
            else:
                merged.append(event)
        for event in merged:
            if event[0] not in STREAMED or event[2]:
                self.events.put_nowait(event)


class Generation:
    """One request's engine job, submitted when made (on the event loop). Read its events with
    `batches()` (streaming) or wait for `outcomes()`; a client that goes away is `cancel()`ed."""

    def __init__(self, tasks: "Tasks", endpoint: str, job: ChatJob, prepare, run, key: str,
                 on_result: Callable[[GenerationResult], None] | None = None):
        if tasks.pending >= tasks.limits.max_queue:
            raise ApiError(503, f"the server is busy ({tasks.pending} requests waiting or running): "
                                "try again shortly", code="server_busy")
        job = tasks.with_speculation(job)
        self.job = job
        self.key = key
        self.prompt_tokens: int | None = None  # the first prompt's, once encoded (before its first event)
        self._cancel = threading.Event()
        relay = _Relay(asyncio.get_running_loop(), self._cancel)
        self.events = relay.events
        cancel = self._cancel

        def work(engine):
            if engine is None:
                raise ModelUnavailable("no local model is loaded: load one, then try again")
            try:
                return generate_all(engine)
            except BaseException as exc:  # in words, without the engine's file paths
                raise engine_failure(exc, (engine.model_path, engine.mmproj_path)) from None

        def choice(engine, i: int, p: int, prompt):
            index = p * job.n + i
            def on_piece(text: str) -> None:
                if isinstance(text, LoggedPiece):
                    text = LoggedPiece(text, shown_logprobs(engine.tokenizer, text.logprobs))
                relay.post(index, text)

            params = choice_params(job.params, i)
            result = run(engine, prompt, params, on_piece if job.stream else None, cancel)
            if result.logprobs:
                result.logprobs = shown_logprobs(engine.tokenizer, result.logprobs)
            full = engine.tokenizer.decode(result.token_ids) if result.finish_reason == "stop_string" else ""
            outcome = (result, stop_reason(result, params, full))
            if job.stream:
                relay.choice_done(index, outcome)
            return outcome

        def generate_all(engine):
            outcomes = []
            for p, prompt in enumerate(prepare(engine)):  # every prompt checked before any reply
                if cancel.is_set():
                    return outcomes
                if p == 0 and prompt is not None:  # None: the engine encodes it (prepare)
                    self.prompt_tokens = len(prompt if isinstance(prompt, list) else prompt.ids)  # raw ids or encoded
                if job.n > 1:  # a batching engine decodes a prompt's choices as rows of the same steps
                    outcomes += engine.run_together(functools.partial(choice, p=p, prompt=prompt), job.n)
                    continue
                outcomes.append(choice(engine, 0, p, prompt))
            return outcomes

        def done() -> None:  # on the loop, after every event the job posted
            tasks.pending -= 1
            relay.end()
            if not future.cancelled() and future.exception() is None:  # finished, even if cut
                for n, (result, _) in enumerate(future.result()):
                    if on_result is not None and n == 0:
                        on_result(result)
                    if tasks.on_finished is not None:
                        tasks.on_finished(Finished(endpoint, result, key))

        future = tasks.executor.submit(work)
        self.future = future
        tasks.pending += 1
        future.add_done_callback(lambda _: relay.call(done))  # on the engine thread (or here)

    def cancel(self) -> None:
        """The client went away: the reply stops within one token, or is dropped before it starts."""
        self._cancel.set()
        self.future.cancel()

    def result(self) -> list[tuple[GenerationResult, str | None]]:
        """The outcomes once the job ended; its failure as an ApiError."""
        try:
            return self.future.result()
        except BaseException as exc:  # noqa: BLE001 - every failure becomes an API error
            raise engine_failure(exc) from None

    async def outcomes(self) -> list[tuple[GenerationResult, str | None]]:
        while await self.events.get() is not END:
            pass
        return self.result()

    async def first_event(self):
        """The first event; a job that failed before any raises its error (before any byte is
        sent, so the client gets a proper HTTP error)."""
        first = await self.events.get()
        if first is END and self.future.exception() is not None:
            raise engine_failure(self.future.exception())
        return first

    async def batches(self, first):
        """After `first_event`: lists of the events that arrived together, until the end."""
        item = first
        while item is not END:
            batch = []
            while item is not None and item is not END:
                batch.append(item)
                item = self.events.get_nowait() if not self.events.empty() else None
            if batch:
                yield batch
            if item is None:
                item = await self.events.get()


def shown_logprobs(tokenizer, entries: list) -> list:
    """The entries of the tokens the content shows: no control token it leaves out."""
    return [e for e in entries if not tokenizer.is_control(e.token_id)]


def _without_logprobs(on_piece):
    return lambda text: on_piece(str(text) if isinstance(text, LoggedPiece) else text)


class Tasks:
    """The engine calls behind every API: chat-shaped requests (`chat`) and raw prompts
    (`completion`), with the queue bound and the conversations' KV sessions."""

    def __init__(self, executor: EngineExecutor, limits: RequestLimits,
                 on_finished: Callable[[Finished], None] | None = None,
                 speculation: tuple[str, int] | None = None):
        self.executor = executor
        self.limits = limits
        self.on_finished = on_finished
        # the server's speculative decoding (`serve --spec ngram --spec-tokens K`): every request
        # that does not choose its own (ChatJob.speculation)
        self.speculation = speculation
        self.conversations = ConversationKeys()
        self.pending = 0  # jobs waiting or running (touched on the loop thread only)

    def with_speculation(self, job: ChatJob) -> ChatJob:
        """The job's sampling with its speculation: the request's own, else the server's; the
        drafted tokens a step the request's, else the server's, else the engine's default."""
        mode, tokens = job.speculation or (None, None)
        default_mode, default_tokens = self.speculation or (None, None)
        mode = mode or default_mode
        if mode is None:
            return job
        tokens = tokens or default_tokens or job.params.spec_tokens
        return dataclasses.replace(job, params=dataclasses.replace(job.params, speculation=mode, spec_tokens=tokens))

    def chat(self, job: ChatJob, model: ServedModel) -> Generation:
        """A conversation's reply (`job.messages`; a last assistant message is continued)."""
        key = self.conversations.key_for(job.messages)
        tools = job.tools or None

        def prepare(engine):
            if not (job.continue_final or tools or job.count_prompt) and surely_fits(job.messages, model.context_size):
                return [None]  # the engine encodes it (once)
            prompt = engine.encode(job.messages, tools=tools)
            if job.continue_final and prompt.ids and prompt.ids[-1] == engine.tokenizer.eos_id:
                # mistral-common's prefix=True: the last assistant message without its </s>
                prompt.ids.pop()
            if not fits(len(prompt.ids), model.context_size):  # counted here: OpenAI's error code
                raise context_exceeded(job.param, len(prompt.ids), model)
            return [prompt]

        def run(engine, prompt, params, on_piece, cancel):
            if job.tool_request is not None:  # a grammar, tool calls read back, logprobs
                params = engine_params(engine.tokenizer, job.tool_request, params)
                if on_piece is not None and params.control_text:
                    on_piece = shown_pieces(engine.tokenizer, on_piece)
                result = reply(engine, prompt, params, on_piece, cancel)
                return read_tool_calls(engine.tokenizer, job.tool_request, result)
            return reply(engine, prompt, params, on_piece, cancel)

        def reply(engine, prompt, params, on_piece, cancel):
            if prompt is not None:  # as encoded above: not twice
                return engine.generate_from(prompt, params, on_piece, cancel, session_key=key)
            return engine.chat(job.messages, params, on_piece=on_piece, cancel=cancel, session_key=key,
                               tools=tools)

        def remember(result: GenerationResult) -> None:
            if result.finish_reason == "cancelled":
                return
            if job.continue_final:  # the conversation now ends with the whole assistant message
                head = job.messages[-1]
                prefix = "".join(p for p in head.parts if isinstance(p, str))
                self.conversations.remember(job.messages[:-1], prefix + result.text, key)
            else:
                self.conversations.remember(job.messages, result.text, key)

        return Generation(self, "chat", job, prepare, run, key, remember)

    def completion(self, job: ChatJob, model: ServedModel) -> Generation:
        """Raw prompts (`job.prompts`: text gets BOS, token lists are used as given)."""

        def prepare(engine):
            prompts = []
            for i, prompt in enumerate(job.prompts):
                if isinstance(prompt, str):
                    prompt = [engine.tokenizer.bos_id, *engine.tokenizer.encode(prompt)]
                if not fits(len(prompt), model.context_size):
                    raise context_exceeded("prompt" if len(job.prompts) == 1 else f"prompt[{i}]",
                                           len(prompt), model)
                prompts.append(prompt)
            return prompts

        scored = job.echo and job.tool_request is not None and job.tool_request.top_logprobs is not None

        def run(engine, prompt, params, on_piece, cancel):
            if job.tool_request is not None:  # a structured output's grammar, logprobs
                params = engine_params(engine.tokenizer, job.tool_request, params)
            if scored:  # echo with logprobs: every prompt token's too
                params = dataclasses.replace(params, prompt_logprobs=True)
            echoed = engine.tokenizer.decode(prompt[1:] if prompt[:1] == [engine.tokenizer.bos_id] else prompt) \
                if job.echo else ""
            if echoed and on_piece is not None:
                on_piece(echoed)
            if scored and on_piece is not None:  # the prompt's entries come first, with the result: all on the last chunk
                on_piece = _without_logprobs(on_piece)
            result = engine.complete(prompt, params, on_piece=on_piece, cancel=cancel,
                                     session_key=COMPLETIONS_SESSION)
            result.text = echoed + result.text
            if scored:  # the prompt's entries before the reply's (control tokens leave with them, below)
                result.logprobs = prompt_token_logprobs(engine.tokenizer, prompt, result.prompt_logprobs or [],
                                                        result.prompt_top_logprobs) \
                    + result.logprobs
            return result

        return Generation(self, "completions", job, prepare, run, COMPLETIONS_SESSION)


async def reply_events(generation: Generation, first):
    """One reply's stream as ("reasoning", thought) and ("text", piece) events, then ("end",
    (result, stop_reason)): in tool mode the call's wire format is held back (`ToolStream`), so
    only content is text and the calls come whole in the result. For the APIs that answer one
    choice (all but OpenAI's)."""
    job = generation.job
    held = ToolStream() if job.tool_request is not None and job.tool_request.calls_tools else None
    async for batch in generation.batches(first):
        for kind, _, data in batch:
            if kind == "reasoning":  # a thought: never a tool call's wire text
                yield "reasoning", data
                continue
            if kind == "text":
                for piece in ([d["content"] for d in held.feed(data)] if held else [data]):
                    yield "text", piece
                continue
            if held is not None:
                for delta in held.finish(data[0]):
                    if "content" in delta:
                        yield "text", delta["content"]
            yield "end", data
