"""The generation engine behind the server: one loaded program, a pool of sessions.

The program is loaded once (its constants are memory-mapped once and shared); each session
is a runner over it with its own loaded method, so its own planned memory and KV cache. A
request takes a free session, or waits in a bounded queue (full: 429 with ``Retry-After``);
it runs on the session's own thread, never on the event loop, and its text pieces come back
to the loop through an ``asyncio.Queue``. Before each generation the session is reset (its
position goes back to 0), so nothing of one request is in the context of the next.

A job that is cancelled (its client went away, or its deadline passed) stops its runner
after the current token, and its session goes back to the pool as soon as the runner
returns.

A chat with images or audio (a program with a vision or audio encoder) is checked when
prepared: the rendered prompt holds the media's placeholders (one token each, or as many
as a medium's embedding rows: :func:`~ptexec.llm.multimodal.media_slots`), and the context
is counted with each image's rows; :meth:`Engine.read_media` then decodes and preprocesses
the media (off the event loop, any problem a 400), counts the audio's rows, and the
session's runner puts their rows at the placeholders.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import AudioFormatError, GenerationError, TokenizerError
from ..llm import (
    GenerationConfig,
    MultimodalRunner,
    load_tokenizer,
    make_audio_input,
    make_image_input,
    make_raw_audio_input,
    make_token_input,
    read_image,
)
from ..llm.chat import ChatTemplate, ChatTemplateError
from ..llm.logits import (
    LogitBias,
    LogitsProcessor,
    PresenceFrequencyPenalty,
    RepetitionPenalty,
    token_logprobs,
)
from ..llm.multimodal import media_slots, placeholder_runs
from ..llm.tokenizer import Tokenizer
from .metrics import Metrics
from .protocol import DEFAULT_COMPLETION_TOKENS, ApiError, Request

__all__ = ["MAX_IMAGE_PIXELS", "Engine", "Job", "Logprob", "Result"]

MAX_IMAGE_PIXELS = 50_000_000
"""The largest image (width x height) a request may hold, checked before its pixels are
decoded."""


@dataclass
class Result:
    """How a generation ended. ``tokens_per_second``: its decode rate
    (:attr:`ptexec.llm.Stats.tokens_per_second`: the tokens after the first over the time
    after the first; 0 with fewer than two tokens); ``first_token``: when its first token
    was sampled (``time.perf_counter()``; None: none was), whether or not that token makes
    text."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    tokens_per_second: float = 0.0
    first_token: float | None = None


@dataclass(frozen=True)
class Logprob:
    """A token's name, its log-probability under the model (None: the prompt's first
    token, which nothing predicts) and the likeliest alternatives' (name, log-probability,
    bytes), likeliest first. ``data`` is the token's UTF-8 bytes (:func:`token_name`);
    ``text``: whether the token is part of the text (a control token is not)."""

    token: str
    logprob: float | None
    top: tuple[tuple[str, float, bytes], ...] = ()
    data: bytes = b""
    text: bool = True


def token_name(data: bytes) -> str:
    """How a token whose bytes are ``data`` is named in log-probabilities: its text, or
    ``bytes:\\xNN...`` when the bytes are part of a character (as OpenAI names them)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in data)


def _logprob(tokenizer: Tokenizer, logits: Any, token: int, top: int) -> Logprob:
    chosen, best = token_logprobs(logits, token, top)
    return _entry(tokenizer, token, chosen, best)


def _entry(tokenizer: Tokenizer, token: int, logprob: float | None, best: Any = ()) -> Logprob:
    data = tokenizer.token_bytes(token)
    top = []
    for i, lp in best:
        alt = tokenizer.token_bytes(i)
        top.append((token_name(alt), lp, alt))
    return Logprob(token_name(data), logprob, tuple(top), data, not tokenizer.is_special(token))


class Job:
    """One request's generation: its prompt ids, its config, and the pieces it produced
    (``queue`` holds ``str`` pieces, then one :class:`Result` or one exception). With
    ``logprobs`` asked for, :attr:`logprobs` gets one :class:`Logprob` per generated
    token as it is sampled (before its text reaches ``queue``), and an echoed
    completion's :attr:`prompt_logprobs` one per prompt token."""

    def __init__(
        self, req: Request, ids: list[int], config: GenerationConfig, prompt: str = ""
    ) -> None:
        self.request = req
        self.ids = ids
        self.config = config
        self.media: list[tuple[str, torch.Tensor]] = []
        """The request's images and audio as the encoders read them
        (:meth:`Engine.read_media`): (kind, input), in the order of their placeholders."""
        self.prompt_tokens = len(ids)
        """The prompt's positions in the context: ``ids`` with each medium's placeholder
        taken as its embedding rows."""
        self.prompt = prompt
        """The prompt's text (a completion's echo)."""
        self.logprobs: list[Logprob] = []
        self.marks: list[int] = []
        """Per text piece put in ``queue``: how many tokens were sampled when it was made
        (the tokens whose text it completes, with those before it)."""
        self.prompt_logprobs: list[Logprob] = []
        self.queue: asyncio.Queue[str | Result | BaseException] = asyncio.Queue()
        self.created = time.perf_counter()
        self.deadline: float | None = None
        self.timed_out = False
        self._cancelled = threading.Event()
        self._runner: MultimodalRunner | None = None
        self.done = False

    def cancel(self) -> None:
        """Stop the generation after the current token (any thread)."""
        self._cancelled.set()
        runner = self._runner
        if runner is not None and not self.done:  # a finished job's session is another's
            runner.stop()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()


class Engine:
    """Sessions over one program; see the module docstring.

    ``sessions`` runners (each with its own memory); ``max_queue`` requests may wait beyond
    them; ``timeout`` (seconds, None: none) bounds a request from arrival to its last token.
    ``device_map``, ``compile`` and ``xnnpack`` are the runner's options (``compile="background"``:
    the sessions answer at once, interpreted, and run compiled once a compile in another
    process is done; sessions of one program share that compile).
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        tokenizer: str | os.PathLike[str],
        *,
        data_path: str | os.PathLike[str] | None = None,
        model_name: str | None = None,
        sessions: int = 1,
        max_queue: int = 16,
        timeout: float | None = None,
        device_map: Any = None,
        compile: bool | str = False,
        xnnpack: str = "auto",
        chat_template: str | os.PathLike[str] | None = None,
        metrics: Metrics | None = None,
        processor: str | os.PathLike[str] | None = None,
        max_image_pixels: int = MAX_IMAGE_PIXELS,
    ) -> None:
        import ptexec

        if sessions < 1:
            raise ValueError(f"sessions must be >= 1, got {sessions}")
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.model_name = model_name or Path(model).stem
        self.program = ptexec.load(model, data_path=data_path)
        self.tokenizer = load_tokenizer(tokenizer)
        self.template = ChatTemplate.for_tokenizer(tokenizer, chat_template)
        self.runners = [
            MultimodalRunner(
                self.program,
                self.tokenizer,
                processor=processor,
                device_map=device_map,
                compile=compile,
                xnnpack=xnnpack,
                print_output=False,
            )
            for _ in range(sessions)
        ]
        first = self.runners[0]
        self.tokenizer = first.tokenizer  # the runners' (with the program's BOS)
        self.context = first.max_context_len
        self.vocab_size = first.vocab_size
        self.sampled_ids = first.sampled_ids
        """Tokens are sampled from ids ``[0, sampled_ids)`` (the logits past the
        tokenizer's ids are padding)."""
        self.eos_ids = first.eos_ids
        self.max_queue = max_queue
        # the program's media placeholder ids: a prompt holding one (the text "<image>",
        # say) needs an image to put there
        decoder = first.decoder
        self.placeholders: dict[int, str] = (
            {t: kind for kind in ("image", "audio") if (t := decoder.placeholder(kind)) is not None}
            if first.multimodal
            else {}
        )
        self.media_kinds = frozenset(
            kind
            for kind in ("image", "audio")
            if first.multimodal and decoder.has(kind) and decoder.placeholder(kind) is not None
        )
        """What requests may hold besides text: ``"image"`` and ``"audio"`` for a program
        with that encoder and its placeholder token (audio: raw samples, through the
        processor's feature extractor)."""
        self.processor = processor
        self.max_image_pixels = max_image_pixels
        self.timeout = timeout
        self.metrics = metrics or Metrics()
        self.created = int(time.time())
        self.draining = False
        self._free: list[MultimodalRunner] = list(self.runners)
        self._waiters: deque[asyncio.Future[MultimodalRunner]] = deque()
        self._executor = ThreadPoolExecutor(sessions, thread_name_prefix="ptexec-session")
        self._vocabulary: Any = None
        self._vocab_lock = threading.Lock()
        self._idle = asyncio.Event()

    # -- state -----------------------------------------------------------------------------
    @property
    def compile_status(self) -> str:
        """How the sessions run (:attr:`ptexec.Method.compile_status`): ``"interpreted"``,
        ``"pending"``, ``"compiled"`` or ``"failed: ..."``; sessions that differ (some
        swapped already) show the least advanced."""
        statuses: list[str] = [r.decoder.method.compile_status for r in self.runners]
        for status in statuses:
            if status != "compiled":
                return status
        return statuses[0]

    @property
    def active(self) -> int:
        """Sessions generating now."""
        return len(self.runners) - len(self._free)

    @property
    def waiting(self) -> int:
        """Requests queued for a session."""
        return len(self._waiters)

    @property
    def idle(self) -> bool:
        return self.active == 0 and self.waiting == 0

    def close(self) -> None:
        """Stop every generation and the session threads."""
        for runner in self.runners:
            runner.stop()
        self._executor.shutdown(wait=True, cancel_futures=True)

    # -- preparing a request ---------------------------------------------------------------
    def prompt_text(self, req: Request) -> str:
        """The prompt of a request: the chat template's rendering of its messages, or the
        completion prompt as given (token ids: their text)."""
        if not req.chat:
            prompt = req.prompt
            return prompt if isinstance(prompt, str) else self.tokenizer.decode(prompt)
        if self.template is None:
            raise ApiError(
                400,
                "this model has no chat template (tokenizer_config.json's chat_template or "
                "the server's --chat-template); use /v1/completions",
                param="messages",
            )
        try:
            kwargs = dict(req.template_kwargs)
            opened = kwargs.pop("add_generation_prompt", None)  # None: unless continuing
            return self.template.render(req.messages, add_generation_prompt=opened, **kwargs)
        except ChatTemplateError as e:
            raise ApiError(400, str(e), param="messages") from None

    def prepare(self, req: Request) -> Job:
        """The job of a validated request: prompt ids checked against the context, the
        token budget, the sampler's settings and processors. Raises :class:`ApiError`."""
        if req.model != self.model_name:
            raise ApiError(
                404,
                f"The model '{req.model}' does not exist (this server serves '{self.model_name}')",
                param="model",
                code="model_not_found",
            )
        if isinstance(req.prompt, list):  # token ids
            ids = list(req.prompt)
            # (ids past the tokenizer's are the logits' padding: no text, never trained)
            bad = next((t for t in ids if not 0 <= t < self.sampled_ids), None)
            if bad is not None:
                raise ApiError(
                    400,
                    f"token id {bad} is outside the vocabulary [0, {self.sampled_ids})",
                    param="prompt",
                )
            text = self.tokenizer.decode(ids)
        else:
            text = self.prompt_text(req)
            try:
                ids = self.tokenizer.encode(text)
            except TokenizerError as e:  # a text the tokenizer cannot encode whole
                raise ApiError(400, str(e), param="messages" if req.chat else "prompt") from None
        if not ids:
            raise ApiError(400, "the prompt is empty", param="prompt")
        length = self._prompt_length(req, ids)
        audio = any(kind == "audio" for kind, _ in req.media)
        room = self._room(req, length, " before its audio's rows" if audio else "")
        # the bias first, then the penalties (transformers and vLLM order them so): the
        # repetition penalty scales the biased logit
        processors: list[LogitsProcessor] = []
        if req.logit_bias:
            beyond = max(req.logit_bias)
            if beyond >= self.sampled_ids:  # (the processor sees only those logits)
                raise ApiError(
                    400,
                    f"logit_bias names token {beyond}, outside the vocabulary "
                    f"[0, {self.sampled_ids})",
                    param="logit_bias",
                    code="invalid_value",
                )
            processors.append(LogitBias(req.logit_bias))
        if req.repetition_penalty != 1.0:
            processors.append(RepetitionPenalty(req.repetition_penalty))
        if req.presence_penalty or req.frequency_penalty:
            processors.append(PresenceFrequencyPenalty(req.presence_penalty, req.frequency_penalty))
        if req.response_format is not None:
            processors.append(self._grammar(req.response_format))
        if req.max_tokens is not None:
            most = max(req.max_tokens, 1)  # 0 tokens: the prompt is only scored (_generate)
        else:  # a completion: OpenAI's default; a chat completion: the context's end
            most = room if req.chat else min(DEFAULT_COMPLETION_TOKENS, room)
        config = GenerationConfig(
            echo=False,
            max_new_tokens=most,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=max(0, req.top_k),
            min_p=req.min_p,
            # OpenAI's seeds are signed 64-bit; the generator's are unsigned (same bits)
            seed=None if req.seed is None else req.seed % (1 << 64),
            stop=req.stop,
            ignore_eos=req.ignore_eos,
            logits_processor=processors or None,
        )
        job = Job(req, ids, config, text)
        job.prompt_tokens = length
        if self.timeout is not None:
            job.deadline = job.created + self.timeout
        return job

    def _room(self, req: Request, length: int, what: str) -> int:
        """The context positions left after a prompt of ``length``; :class:`ApiError`
        when none is, or fewer than the request's ``max_tokens``."""
        room = self.context - length
        if room < 1 or (req.max_tokens is not None and req.max_tokens > room):
            asked = f" and {req.max_tokens} tokens to generate" if req.max_tokens else ""
            raise ApiError(
                400,
                f"This model's maximum context length is {self.context} tokens; the prompt "
                f"has {length} tokens{what}{asked}",
                param="messages" if req.chat else "prompt",
                code="context_length_exceeded",
            )
        return room

    @property
    def takes_media(self) -> bool:
        """Whether requests may hold images or audio."""
        return bool(self.media_kinds)

    def _prompt_length(self, req: Request, ids: list[int]) -> int:
        """The context positions of prompt ``ids``: each image's placeholder (one token, or
        as many as its embedding rows) counts as the image's rows; audio's placeholders
        count as themselves until :meth:`read_media` knows its rows. Raises
        :class:`ApiError` when the placeholders and the request's media disagree."""
        where = "messages" if req.chat else "prompt"
        length = len(ids)
        for kind in ("image", "audio"):
            given = sum(1 for k, _ in req.media if k == kind)
            if given and kind not in self.media_kinds:
                raise ApiError(
                    400, f"the model '{self.model_name}' takes no {kind} input", param=where
                )
            if given and kind == "audio" and self.processor is None:
                raise ApiError(
                    400,
                    "audio needs the model's feature extractor: this server was started "
                    "without --processor",
                    param=where,
                )
            token = self.runners[0].decoder.placeholder(kind) if self.placeholders else None
            runs = placeholder_runs(ids, token) if token is not None else []
            if runs and not given:
                raise ApiError(
                    400,
                    f"the prompt holds the program's {kind} placeholder (token {token}), but "
                    f"the request has no {kind} to put there",
                    param=where,
                )
            if given and not runs:
                raise ApiError(
                    400,
                    f"the chat template wrote no {kind} placeholder for the request's "
                    f"{given} {kind} input(s); this model's template does not place {kind} "
                    "content parts (send them as the template expects)",
                    param=where,
                )
            if kind == "image" and runs:
                rows = [self.runners[0].decoder.media_rows(kind)] * given
                length += self._widened(kind, ids, token, rows, where)
        return length

    @staticmethod
    def _widened(kind: str, ids: list[int], token: int | None, rows: list[int], where: str) -> int:
        """How many positions the placeholders of ``ids`` gain holding media of ``rows``
        rows each (:func:`ptexec.llm.multimodal.media_slots`'s rule)."""
        slots = media_slots([ids], token, rows)
        if slots is None:
            raise ApiError(
                400,
                f"the prompt's {kind} placeholders do not hold the request's {len(rows)} "
                f"{kind} input(s): one placeholder each, or as many as its {rows[0]} "
                "embedding rows",
                param=where,
            )
        return sum(r - (end - start) for r, (_, start, end) in zip(rows, slots, strict=True))

    def read_media(self, job: Job) -> None:
        """Decode the request's images and audio into what the encoders read (run it off
        the event loop: it decodes, resizes and computes features), count the audio's rows
        in the context and bound the tokens to generate by what is left. Raises
        :class:`ApiError` (400) for media that cannot be read or that the encoders cannot
        take, and for a prompt that no longer fits."""
        req = job.request
        if not req.media:
            return
        runner = self.runners[0]
        decoder = runner.decoder
        length = job.prompt_tokens
        audio_rows: list[int] = []
        for k, (kind, data) in enumerate(req.media):
            try:
                if kind == "image":
                    pixels = read_image(data, max_pixels=self.max_image_pixels)
                    job.media.append((kind, runner.image_input(make_image_input(pixels))))
                    continue
                samples = _read_audio(data, runner.audio_rate)
                if samples.numel() == 0:
                    raise ApiError(400, f"audio {k} holds no samples", param="messages")
                feats = runner.audio_input(make_raw_audio_input(samples.reshape(1, 1, -1)))
            except (GenerationError, AudioFormatError) as e:
                raise ApiError(400, f"{kind} {k}: {e}", param="messages") from None
            audio_rows.append(decoder.media_rows("audio", int(feats.shape[0])))
            job.media.append((kind, feats))
        if audio_rows:
            token = decoder.placeholder("audio")
            length += self._widened("audio", job.ids, token, audio_rows, "messages")
        room = self._room(req, length, " with its media")
        job.prompt_tokens = length
        job.config.max_new_tokens = min(job.config.max_new_tokens, room)

    def _grammar(self, response_format: dict[str, Any]) -> LogitsProcessor:
        from ..llm.constrained import Grammar, GrammarError, Vocabulary

        try:
            with self._vocab_lock:
                if self._vocabulary is None:
                    self._vocabulary = Vocabulary.of(self.tokenizer, self.vocab_size, self.eos_ids)
            if response_format["type"] == "json_object":
                return Grammar.json_object(self._vocabulary)
            schema = response_format["json_schema"].get("schema", {"type": "object"})
            return Grammar.json_schema(self._vocabulary, schema)
        except GrammarError as e:
            raise ApiError(400, str(e), param="response_format") from None
        except GenerationError as e:
            raise ApiError(
                400,
                f"structured output is not available: {e}",
                "invalid_request_error",
                "response_format",
            ) from None

    # -- sessions --------------------------------------------------------------------------
    async def _acquire(self) -> MultimodalRunner:
        if self._free:
            return self._free.pop()
        if len(self._waiters) >= self.max_queue:
            raise ApiError(
                429,
                f"the server is busy: {len(self.runners)} sessions generating and "
                f"{len(self._waiters)} requests queued",
                type="rate_limit_error",
                code="server_busy",
                headers={"Retry-After": "1"},
            )
        fut: asyncio.Future[MultimodalRunner] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self.metrics.set_queue(self.waiting)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._release(fut.result())  # handed over just as the waiter left
            with contextlib.suppress(ValueError):
                self._waiters.remove(fut)
            raise
        finally:
            self.metrics.set_queue(self.waiting)

    def _release(self, runner: MultimodalRunner) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(runner)
                return
        self._free.append(runner)
        self.metrics.set_active(self.active)
        if self.idle:
            self._idle.set()

    async def start(self, job: Job) -> None:
        """Give ``job`` a session (waiting in the queue if need be) and start it on the
        session's thread. Raises :class:`ApiError` (429 queue full, 504 timed out)."""
        self._idle.clear()
        try:
            if job.deadline is not None:
                left = job.deadline - time.perf_counter()
                runner = await asyncio.wait_for(self._acquire(), max(left, 0.001))
            else:
                runner = await self._acquire()
        except asyncio.TimeoutError:
            if self.idle:
                self._idle.set()
            raise ApiError(
                504, "the request timed out waiting for a session", "timeout", code="timeout"
            ) from None
        except ApiError:
            if self.idle:
                self._idle.set()
            raise
        job._runner = runner
        self.metrics.set_active(self.active)
        loop = asyncio.get_running_loop()
        sink = _sink(loop, job)
        fut = loop.run_in_executor(self._executor, _generate, runner, job, sink)

        def finished(f: asyncio.Future[Result]) -> None:
            job.done = True
            try:
                result = f.result()
            except BaseException as e:  # the job's failure goes to its reader
                self._release(runner)
                job.queue.put_nowait(e)
                return
            # recorded here, not by the reader: a client that left had its tokens generated
            self._record(job, result)
            self._release(runner)
            job.queue.put_nowait(result)

        fut.add_done_callback(finished)

    def _record(self, job: Job, result: Result) -> None:
        """A finished generation in the metrics, whether or not its client still listens:
        its time to first token runs to the first token sampled (one that makes no text,
        EOS or a control token, or whose text a stop string holds back, included)."""
        first = result.first_token
        self.metrics.generation(
            None if first is None else first - job.created,
            result.completion_tokens,
            result.tokens_per_second,
        )

    async def wait_idle(self) -> None:
        """Return once no request is running or queued."""
        while not self.idle:
            self._idle.clear()
            await self._idle.wait()


def _read_audio(data: bytes, rate: int | None) -> torch.Tensor:
    """Mono samples of an audio file's bytes at ``rate`` (a WAV, or what soundfile reads)."""
    import tempfile

    from ..llm.audio import load_audio

    with tempfile.TemporaryDirectory(prefix="ptexec-audio-") as tmp:
        path = Path(tmp) / "audio"
        path.write_bytes(data)
        try:
            samples, _ = load_audio(path, rate)
        except AudioFormatError as e:  # (the server's own path: not the client's)
            raise AudioFormatError(str(e).replace(str(path), "the audio")) from None
    return samples


def _sink(loop: asyncio.AbstractEventLoop, job: Job) -> Callable[[str], None]:
    def sink(piece: str) -> None:
        if job.deadline is not None and time.perf_counter() > job.deadline:
            job.timed_out = True
            job.cancel()
        elif job.cancelled:
            job.cancel()
        job.marks.append(len(job.logprobs))  # (before the piece: the loop reads it with it)
        loop.call_soon_threadsafe(job.queue.put_nowait, piece)

    return sink


def _generate(runner: MultimodalRunner, job: Job, sink: Callable[[str], None]) -> Result:
    """Runs on the session's thread."""
    if job.cancelled:
        return Result("", "interrupted", job.prompt_tokens, 0)
    req = job.request
    top = req.logprobs
    tokenizer = runner.tokenizer
    if top is not None and req.echo:
        rows = runner.prompt_logits(job.ids)
        first = _entry(tokenizer, job.ids[0], None)
        job.prompt_logprobs = [first] + [
            _logprob(tokenizer, row, t, top) for row, t in zip(rows, job.ids[1:], strict=False)
        ]
    if req.max_tokens == 0:
        return Result("", "length", job.prompt_tokens, 0)
    runner.reset()
    deadline = job.deadline
    if top is not None or deadline is not None:
        entries = job.logprobs

        def observe(token: int, logits: Any) -> None:
            if top is not None:
                entries.append(_logprob(tokenizer, logits, token, top))
            # every token, text or not (a control token makes no piece for the sink)
            if deadline is not None and time.perf_counter() > deadline:
                job.timed_out = True
                job.cancel()

        runner.on_sample = observe
    try:
        inputs = [make_token_input(job.ids)]
        for kind, value in job.media:
            inputs.append(make_image_input(value) if kind == "image" else make_audio_input(value))
        text = runner.generate_text(inputs, job.config, token_callback=sink)
    finally:
        runner.on_sample = None
    reason = runner.finish_reason
    if job.cancelled and reason == "length":
        reason = "interrupted"
    stats = runner.stats
    n = stats.num_generated_tokens
    return Result(
        text,
        reason,
        job.prompt_tokens,
        n,
        stats.tokens_per_second,
        stats.first_token_ms / 1e3 if n else None,  # (the stats' clock is perf_counter's)
    )
