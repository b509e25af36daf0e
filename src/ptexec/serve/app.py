"""The OpenAI-compatible HTTP application (Starlette): routes, streaming, errors.

Routes (the LLM ones when an :class:`~ptexec.serve.engine.Engine` is served, the program
one when a :class:`~ptexec.serve.programs.ProgramService` is): ``POST /v1/chat/completions``, ``POST /v1/completions`` (a JSON answer, or with
``"stream": true`` server-sent events of OpenAI's chunks ending with ``data: [DONE]``),
``GET /v1/models``, ``GET /health`` (200 ready, 503 draining), ``GET /metrics``
(Prometheus text), ``POST /v1/programs/{method}`` (any method, micro-batched),
``POST /v1/audio/transcriptions`` and ``/v1/audio/translations`` (when a
:class:`~ptexec.serve.speech.SpeechService` is served). With an API key every route but ``/health`` needs ``Authorization:
Bearer KEY``. Bodies past ``max_body_bytes`` are refused (413) before they are parsed.

Errors are OpenAI's error object; an unexpected failure is logged here and answered as a
bare 500, never with its message, a path or a traceback.
"""

from __future__ import annotations

import asyncio
import codecs
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from ..llm.constrained import GrammarError
from .engine import Engine, Job, Logprob, Result
from .metrics import Metrics
from .programs import ProgramService, decode_inputs, encode_outputs
from .protocol import ApiError, Request, parse_request
from .speech import SpeechService, parse_form

__all__ = ["create_app"]

log = logging.getLogger("ptexec.serve")

DEFAULT_MAX_BODY = 1 << 20


class _Disconnected(Exception):
    """The client went away before its answer."""


def create_app(
    engine: Engine | None,
    *,
    programs: ProgramService | None = None,
    metrics: Metrics | None = None,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY,
    extra_routes: list[Any] | None = None,
    speech: SpeechService | None = None,
) -> Any:
    """The Starlette application serving ``engine`` (the LLM routes; None: none),
    ``programs`` (``/v1/programs/{method}``; None: none) and ``speech`` (the audio routes;
    None: none)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request as HttpRequest
    from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
    from starlette.routing import Route

    if api_key is not None and not api_key.strip():
        # (an empty key would let in any client sending "Bearer" with nothing after it)
        raise ValueError("the API key is empty: give a key, or none for an open server")
    if metrics is None:
        metrics = engine.metrics if engine is not None else Metrics()
    services: list[Any] = [s for s in (engine, programs, speech) if s is not None]

    def draining() -> bool:
        return any(s.draining for s in services)

    def llm() -> Engine:
        if engine is None:
            raise ApiError(404, "this server serves no LLM (it was started without a tokenizer)")
        return engine

    def error(e: ApiError) -> Response:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    def authorize(request: HttpRequest) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), api_key.encode()
        ):
            raise ApiError(
                401,
                "Incorrect or missing API key (send 'Authorization: Bearer <key>')",
                code="invalid_api_key",
            )

    async def read_json(request: HttpRequest) -> Any:
        body = await read_body(request)
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the request body is not valid JSON ({e})", param="body") from None
        except RecursionError:
            raise ApiError(400, "the request body is JSON nested too deep", param="body") from None
        if b"\\ud" in body.lower():  # an escaped surrogate: paired, or text no one can encode
            try:
                json.dumps(doc, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError:
                raise ApiError(
                    400,
                    "the request body holds a lone surrogate (\\ud800-\\udfff) in a string",
                    param="body",
                ) from None
        return doc

    async def read_body(request: HttpRequest, limit: int = max_body_bytes) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"the request body is over {limit} bytes", code="too_large")
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"the request body is over {limit} bytes", code="too_large")
            chunks.append(chunk)
        return b"".join(chunks)

    def endpoint(
        name: str, handler: Callable[[HttpRequest], Awaitable[Response]], open_route: bool = False
    ) -> Callable[[HttpRequest], Awaitable[Response]]:
        async def run(request: HttpRequest) -> Response:
            try:
                if not open_route:
                    authorize(request)
                response = await handler(request)
            except ApiError as e:
                response = error(e)
            except _Disconnected:
                response = Response(status_code=499)
            except Exception:
                log.exception("ptexec serve: %s failed", name)
                response = error(ApiError(500, "internal server error", "server_error"))
            metrics.request(name, response.status_code)
            return response

        return run

    # -- completions -------------------------------------------------------------------
    async def completions(request: HttpRequest, chat: bool) -> Response:
        engine = llm()
        if engine.draining:
            raise ApiError(503, "the server is shutting down", "server_error", code="draining")
        doc = await read_json(request)

        def prepared() -> tuple[Request, list[Job]]:
            """The request and its jobs: every prompt checked before any runs (rendering,
            tokenizing and grammars take long for large prompts: off the event loop)."""
            req = parse_request(doc, chat)
            return req, [
                engine.prepare(replace(req, prompt=x, prompts=[x])) for x in req.prompts
            ] or [engine.prepare(req)]

        req, jobs = await asyncio.to_thread(prepared)
        for job in jobs:  # images decoded and resized off the event loop
            if job.request.media:
                await asyncio.to_thread(engine.read_media, job)
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        if req.stream:
            job = jobs[0]
            await _start(engine, job, request)
            return StreamingResponse(
                _events(engine, job, ident, created),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        choices: list[dict[str, Any]] = []
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        for index, job in enumerate(jobs):  # one after another: one session at a time
            await _start(engine, job, request)
            pieces, result = await _collect(job, request)
            if job.timed_out:
                raise ApiError(
                    504, "the request timed out while generating", "timeout", code="timeout"
                )
            text = "".join(pieces)
            for k, v in _usage(result).items():
                usage[k] += v
            if chat:
                choices.append(
                    {
                        "index": index,
                        "message": {"role": "assistant", "content": text},
                        "logprobs": _chat_logprobs(job.logprobs)
                        if req.logprobs is not None
                        else None,
                        "finish_reason": result.finish_reason,
                    }
                )
                continue
            logprobs = None
            if req.logprobs is not None:
                entries = job.logprobs[: result.completion_tokens]
                logprobs = (
                    _completion_logprobs(
                        [*job.prompt_logprobs, *entries],
                        _Offsets.echoing(job.prompt, job.prompt_logprobs),
                    )
                    if req.echo
                    else _completion_logprobs(entries)
                )
            choices.append(
                {
                    "index": index,
                    "text": job.prompt + text if req.echo else text,
                    "logprobs": logprobs,
                    "finish_reason": result.finish_reason,
                }
            )
        return JSONResponse(
            {
                "id": ident,
                "object": "chat.completion" if chat else "text_completion",
                "created": created,
                "model": engine.model_name,
                "choices": choices,
                "usage": usage,
            }
        )

    async def chat_completions(request: HttpRequest) -> Response:
        return await completions(request, True)

    async def text_completions(request: HttpRequest) -> Response:
        return await completions(request, False)

    def model_objects() -> list[dict[str, Any]]:
        out = []
        if engine is not None:
            out.append(
                {
                    "id": engine.model_name,
                    "object": "model",
                    "created": engine.created,
                    "owned_by": "ptexec",
                    "max_model_len": engine.context,
                }
            )
        if speech is not None:
            out.append(
                {
                    "id": speech.model_name,
                    "object": "model",
                    "created": speech.created,
                    "owned_by": "ptexec",
                }
            )
        return out

    async def models(request: HttpRequest) -> Response:
        return JSONResponse({"object": "list", "data": model_objects()})

    async def model(request: HttpRequest) -> Response:
        name = request.path_params["model"]
        for item in model_objects():
            if item["id"] == name:
                return JSONResponse(item)
        raise ApiError(
            404, f"The model '{name}' does not exist", param="model", code="model_not_found"
        )

    async def audio(request: HttpRequest, task: str) -> Response:
        if speech is None:
            raise ApiError(404, "this server serves no speech model")
        # the form's framing on top of the largest audio file
        body = await read_body(request, speech.max_audio_bytes + max_body_bytes)
        # (parsing a large form takes seconds: off the event loop, which serves every route)
        form = await asyncio.to_thread(parse_form, request.headers.get("content-type", ""), body)
        answer, media = await speech.transcribe(form, task)
        if isinstance(answer, str):
            return Response(answer, media_type=media)
        return JSONResponse(answer)

    async def transcriptions(request: HttpRequest) -> Response:
        return await audio(request, "transcribe")

    async def translations(request: HttpRequest) -> Response:
        return await audio(request, "translate")

    async def health(request: HttpRequest) -> Response:
        if draining():
            return JSONResponse({"status": "draining"}, status_code=503)
        state: dict[str, Any] = {"status": "ready"}
        if engine is not None:
            state.update(
                active_sessions=engine.active,
                queued=engine.waiting,
                compile=engine.compile_status,
            )
        return JSONResponse(state)

    async def run_program(request: HttpRequest) -> Response:
        if programs is None:
            raise ApiError(404, "this server serves no program methods")
        name = request.path_params["method"]
        infos = programs.infos(name)
        body = await read_body(request)
        kind = request.headers.get("content-type", "application/json")
        arrays = decode_inputs(body, kind, infos)
        outputs = await programs.call(name, arrays)
        data, media = encode_outputs(outputs, kind.split(";")[0].strip().lower())
        return Response(data, media_type=media)

    async def metrics_text(request: HttpRequest) -> Response:
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    async def http_error(request: HttpRequest, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        message = {404: "no such route", 405: "method not allowed"}.get(status, "error")
        # answered as every request is counted, under one label (never the client's path)
        metrics.request("unmatched", status)
        return error(ApiError(status, f"{message}: {request.method} {request.url.path}"))

    routes = [
        Route(
            "/v1/chat/completions",
            endpoint("chat_completions", chat_completions),
            methods=["POST"],
        ),
        Route("/v1/completions", endpoint("completions", text_completions), methods=["POST"]),
        Route("/v1/models", endpoint("models", models), methods=["GET"]),
        Route("/v1/models/{model:path}", endpoint("models", model), methods=["GET"]),
        Route("/health", endpoint("health", health, open_route=True), methods=["GET"]),
        Route("/metrics", endpoint("metrics", metrics_text), methods=["GET"]),
        Route("/v1/programs/{method:path}", endpoint("programs", run_program), methods=["POST"]),
        Route(
            "/v1/audio/transcriptions",
            endpoint("transcriptions", transcriptions),
            methods=["POST"],
        ),
        Route("/v1/audio/translations", endpoint("translations", translations), methods=["POST"]),
        *(extra_routes or []),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})


async def _start(engine: Engine, job: Job, request: Any) -> None:
    """Get the job a session, giving up when the client leaves while it waits."""
    start = asyncio.ensure_future(engine.start(job))
    while True:
        done, _ = await asyncio.wait({start}, timeout=0.25)
        if done:
            start.result()
            return
        if await request.is_disconnected():
            start.cancel()
            job.cancel()
            raise _Disconnected


async def _collect(job: Job, request: Any) -> tuple[list[str], Result]:
    pieces: list[str] = []
    loop = asyncio.get_running_loop()
    checked = loop.time()
    while True:
        try:
            item = await asyncio.wait_for(job.queue.get(), 0.25)
        except asyncio.TimeoutError:
            item = None
        if isinstance(item, Result):  # done: answered, whoever is still listening
            return pieces, item
        if loop.time() - checked >= 0.25:  # also while pieces keep coming
            checked = loop.time()
            if await request.is_disconnected():
                job.cancel()
                raise _Disconnected from None
        if item is None:
            continue
        if isinstance(item, str):
            pieces.append(item)
        elif isinstance(item, Result):
            return pieces, item
        elif isinstance(item, GrammarError):  # the request's grammar, not the server
            raise ApiError(400, str(item), param="response_format") from item
        else:
            raise item


def _usage(result: Result) -> dict[str, int]:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }


class _Offsets:
    """Where each token starts in a completion's text: the characters that begin in the
    bytes of the text's tokens before it (decoded as the text is: a character split over
    tokens begins in the token holding its first byte, an invalid sequence is one U+FFFD;
    generated control tokens are no text, an echoed prompt's are their names, as the
    prompt's text has them). ``start``: where the first token starts, negative when the
    tokens' bytes begin with characters the text does not have (the space a SentencePiece
    vocabulary puts before a prompt's first word, which the echoed prompt has not):
    offsets inside those are 0. ``named``: how many of the first tokens are the echoed
    prompt's."""

    def __init__(self, start: int = 0, named: int = 0) -> None:
        self._chars = start  # characters decoded so far
        self._named = named  # tokens still to take whose control tokens are named
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    @classmethod
    def echoing(cls, prompt: str, entries: Sequence[Logprob]) -> _Offsets:
        """Offsets for a text that begins with ``prompt``, whose tokens are ``entries``."""
        text = b"".join(e.data for e in entries).decode("utf-8", "replace")
        extra = len(text) - len(prompt) if text.endswith(prompt) else 0
        return cls(-extra, len(entries))

    def take(self, e: Logprob) -> int:
        # bytes begun, not yet decoded: what they make if the text ended here
        pending = self._decoder.getstate()[0]
        at = self._chars + (len(pending.decode("utf-8", "replace")) if pending else 0)
        if e.text or self._named > 0:
            self._chars += len(self._decoder.decode(e.data))
        self._named = max(self._named - 1, 0)
        return max(at, 0)


def _completion_logprobs(entries: list[Logprob], offsets: _Offsets | None = None) -> dict[str, Any]:
    """A completion choice's ``logprobs``: the tokens, their log-probabilities, each
    token's alternatives with the token itself (as OpenAI-compatible servers list them;
    None for a first prompt token) and each token's offset in the text (``offsets``: where
    the text so far ends; None: these are the text's first tokens)."""
    offsets = offsets or _Offsets()
    tokens: list[str] = []
    values: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    starts: list[int] = []
    for e in entries:
        tokens.append(e.token)
        values.append(e.logprob)
        if e.logprob is None:
            tops.append(None)
        else:
            # likeliest first: a name two tokens share (a byte-fallback vocabulary's "a"
            # and "<0x61>") keeps the likelier one's log-probability
            top: dict[str, float] = {}
            for name, lp, _ in e.top:
                top.setdefault(name, lp)
            top.setdefault(e.token, e.logprob)
            tops.append(top)
        starts.append(offsets.take(e))
    return {
        "tokens": tokens,
        "token_logprobs": values,
        "top_logprobs": tops,
        "text_offset": starts,
    }


def _chat_logprobs(entries: list[Logprob]) -> dict[str, Any]:
    """A chat choice's ``logprobs``: ``content``, one object per token (its text, bytes,
    log-probability and the likeliest alternatives)."""

    def item(token: str, logprob: float, data: bytes) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(data)}

    content = []
    for e in entries:
        assert e.logprob is not None  # generated tokens all have one
        content.append(
            {**item(e.token, e.logprob, e.data), "top_logprobs": [item(*t) for t in e.top]}
        )
    return {"content": content, "refusal": None}


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


async def _events(engine: Engine, job: Job, ident: str, created: int) -> AsyncIterator[bytes]:
    """The job's pieces as OpenAI chunks; cancels the job when the client goes away."""
    req: Request = job.request
    chat = req.chat
    obj = "chat.completion.chunk" if chat else "text_completion"
    usage_field = {"usage": None} if req.include_usage else {}

    scored = req.logprobs is not None
    taken = 0  # the generated tokens' log-probabilities sent so far
    offsets = _Offsets()  # where the next token starts in the completion's text (echo too)
    pieces = 0  # the text pieces sent so far

    def logprobs(entries: list[Logprob] | None, end: int | None = None) -> dict[str, Any] | None:
        """The log-probabilities of ``entries`` (None: those sampled since the last chunk,
        up to ``end``, the count sampled when this chunk's text was made; None: all) in a
        chunk; None when they are not asked for."""
        nonlocal taken
        if not scored:
            return None
        if entries is None:
            end = len(job.logprobs) if end is None else end
            entries = job.logprobs[taken:end]
            taken = end
        if chat:
            return _chat_logprobs(entries)
        return _completion_logprobs(entries, offsets)

    def chunk(
        content: str | None,
        finish: str | None,
        role: bool = False,
        entries: list[Logprob] | None = None,
        end: int | None = None,
    ) -> bytes:
        if chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if content is not None:
                delta["content"] = content
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "logprobs": None if role else logprobs(entries, end),
                "finish_reason": finish,
            }
        else:
            choice = {
                "index": 0,
                "text": content or "",
                "logprobs": logprobs(entries, end),
                "finish_reason": finish,
            }
        return _sse(
            {
                "id": ident,
                "object": obj,
                "created": created,
                "model": engine.model_name,
                "choices": [choice],
                **usage_field,
            }
        )

    try:
        echo = not chat and req.echo
        if chat:
            yield chunk("", None, role=True)
        elif echo and not scored:
            yield chunk(job.prompt, None)
            echo = False
        while True:
            item = await job.queue.get()
            if echo:  # the prompt's scores are in before anything else comes
                offsets = _Offsets.echoing(job.prompt, job.prompt_logprobs)
                yield chunk(job.prompt, None, entries=job.prompt_logprobs)
                echo = False
            if isinstance(item, str):
                # the tokens sampled by the time this piece was made: its tokens
                end = job.marks[pieces]
                pieces += 1
                yield chunk(item, None, end=end)
                continue
            if isinstance(item, Result):
                if job.timed_out:
                    yield _sse(
                        ApiError(
                            504, "the request timed out while generating", "timeout", code="timeout"
                        ).body()
                    )
                else:
                    yield chunk(None if chat else "", item.finish_reason)
                    if req.include_usage:
                        yield _sse(
                            {
                                "id": ident,
                                "object": obj,
                                "created": created,
                                "model": engine.model_name,
                                "choices": [],
                                "usage": _usage(item),
                            }
                        )
            elif isinstance(item, GrammarError):  # the request's grammar, not the server
                yield _sse(ApiError(400, str(item), param="response_format").body())
            else:
                log.error("ptexec serve: a generation failed", exc_info=item)
                yield _sse(ApiError(500, "internal server error", "server_error").body())
            yield b"data: [DONE]\n\n"
            return
    finally:
        if not job.done:
            job.cancel()
