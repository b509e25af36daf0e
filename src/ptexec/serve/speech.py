"""Speech to text over OpenAI's audio API: ``POST /v1/audio/transcriptions`` and
``POST /v1/audio/translations`` served by a :class:`~ptexec.llm.Seq2SeqRunner` (Whisper).

A request is OpenAI's ``multipart/form-data`` form: ``file`` (the audio: WAV, or any format
``soundfile`` reads), ``model`` (the served model's id), and optionally ``language`` (a
code such as ``en``; absent, Whisper detects it), ``temperature`` (0, the default, is
greedy), ``response_format`` (``json``, ``text``, ``srt``, ``verbose_json``, ``vtt``) and
``timestamp_granularities[]`` (``segment``). ``prompt`` (Whisper's previous-text
conditioning), word timestamps and streaming are refused with a 400 rather than ignored; so
is any other field. Translations are the same with Whisper's ``translate`` task (no
``language``).

The audio is transcribed as :meth:`~ptexec.llm.Seq2SeqRunner.transcribe` does (windows of
the extractor's span, the language detected on the first); ``verbose_json``, ``srt`` and
``vtt`` ask the model for timestamps and give its segments (a window whose text carries no
timestamp is one segment) with Whisper's scores (``avg_logprob``, ``compression_ratio``,
``no_speech_prob``) and ``seek``. ``verbose_json``'s ``language`` is the language's name
(``english``), as OpenAI's: always ``english`` for a translation. Sampling above
temperature 0 is Whisper's (temperature alone, no top-p); 0 is greedy, without Whisper's
fallback to higher temperatures.
One transcription runs at a time, on a worker thread; ``max_queue`` more may wait (429
beyond).
"""

from __future__ import annotations

import asyncio
import email.parser
import email.policy
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import PtexecError
from .protocol import ApiError

__all__ = ["RESPONSE_FORMATS", "Form", "SpeechService", "parse_form"]

RESPONSE_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
DEFAULT_MAX_AUDIO = 25 << 20  # OpenAI's limit on an uploaded file
_FIELDS = {"model", "language", "temperature", "response_format", "timestamp_granularities[]"}
_REFUSED = {
    "prompt": "conditioning on a prompt is not supported",
    "stream": "streamed transcriptions are not supported",
    "include[]": "log-probabilities of transcriptions are not supported",
    "chunking_strategy": "chunking strategies are not supported (windows of the model's span)",
}


@dataclass
class Form:
    """A ``multipart/form-data`` body: text fields (each name's values in order) and files
    (name -> (file name, bytes))."""

    fields: dict[str, list[str]] = field(default_factory=dict)
    files: dict[str, tuple[str, bytes]] = field(default_factory=dict)

    def one(self, name: str) -> str | None:
        values = self.fields.get(name)
        if not values:
            return None
        if len(values) > 1 and not name.endswith("[]"):
            raise ApiError(400, f"'{name}' is given {len(values)} times", param=name)
        return values[0]


def parse_form(content_type: str, body: bytes) -> Form:
    """The form in a ``multipart/form-data`` body (the standard library's MIME parser);
    raises :class:`ApiError` 400 for anything else or a malformed body."""
    if content_type.split(";")[0].strip().lower() != "multipart/form-data":
        raise ApiError(
            400,
            f"an audio request is a multipart/form-data form, not '{content_type or 'nothing'}'",
            param="file",
        )
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    if not message.is_multipart() or message.defects:
        raise ApiError(400, "the multipart/form-data body is malformed", param="file")
    form = Form()
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str):
            raise ApiError(400, "a form part has no name", param="file")
        payload = part.get_payload(decode=True)
        data = payload if isinstance(payload, bytes) else b""
        filename = part.get_filename()
        if filename is not None:
            if name in form.files:
                raise ApiError(400, f"file field '{name}' is given twice", param=name)
            form.files[name] = (filename, data)
        else:
            try:
                form.fields.setdefault(name, []).append(data.decode("utf-8"))
            except UnicodeDecodeError:
                raise ApiError(400, f"form field '{name}' is not UTF-8", param=name) from None
    return form


@dataclass(frozen=True)
class _Ask:
    """One request, checked."""

    audio: bytes
    suffix: str
    language: str | None
    temperature: float
    response_format: str
    task: str


def _format_time(seconds: float, comma: bool) -> str:
    ms = max(0, round(seconds * 1000))
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{',' if comma else '.'}{ms:03d}"


def subtitles(segments: Sequence[dict[str, Any]], vtt: bool) -> str:
    """SubRip (``srt``) or WebVTT (``vtt``) text of timed segments."""
    blocks = ["WEBVTT\n"] if vtt else []
    for i, seg in enumerate(segments, 1):
        start = _format_time(seg["start"], not vtt)
        end = _format_time(seg["end"], not vtt)
        text = seg["text"].strip()
        blocks.append(
            f"{start} --> {end}\n{text}\n" if vtt else f"{i}\n{start} --> {end}\n{text}\n"
        )
    return "\n".join(blocks)


class SpeechService:
    """Transcriptions and translations with ``runner`` and its ``features`` extractor,
    as the model ``model_name``. ``max_audio_bytes`` bounds an uploaded file (25 MiB, as
    OpenAI's); ``timeout`` (seconds) bounds a request's wait for its turn."""

    def __init__(
        self,
        runner: Any,
        features: Any,
        model_name: str,
        *,
        max_queue: int = 16,
        max_audio_bytes: int = DEFAULT_MAX_AUDIO,
        timeout: float | None = None,
    ) -> None:
        import time

        self.runner = runner
        self.features = features
        self.model_name = model_name
        self.max_queue = int(max_queue)
        self.max_audio_bytes = int(max_audio_bytes)
        self.timeout = timeout
        self.created = int(time.time())
        self.draining = False
        self.translates = "translate" in (runner.generation_config.get("task_to_id") or {})
        self._turn = asyncio.Lock()
        self._waiting = 0
        self._running = 0
        self._idle: asyncio.Event | None = None

    # -- the request ------------------------------------------------------------------------
    def check(self, form: Form, task: str) -> _Ask:
        """The request's settings, every field checked before any audio is read."""
        for name in form.fields:
            if name in _REFUSED:
                raise ApiError(400, _REFUSED[name], param=name)
            if name not in _FIELDS:
                raise ApiError(400, f"unknown field '{name}'", param=name)
        extra = sorted(set(form.files) - {"file"})
        if extra:
            raise ApiError(400, f"unknown file field '{extra[0]}'", param=extra[0])
        if "file" not in form.files:
            raise ApiError(400, "'file' (the audio) is required", param="file")
        model = form.one("model")
        if not model:
            raise ApiError(400, "'model' is required", param="model")
        if model != self.model_name:
            raise ApiError(
                404,
                f"The model '{model}' does not exist (this server serves '{self.model_name}')",
                param="model",
                code="model_not_found",
            )
        language = form.one("language") or None
        if language is not None and task == "translate":
            raise ApiError(400, "translations take no 'language'", param="language")
        if task == "translate" and not self.translates:
            raise ApiError(400, "this model does not translate (no 'translate' task)")
        fmt = form.one("response_format") or "json"
        if fmt not in RESPONSE_FORMATS:
            raise ApiError(
                400,
                f"'response_format' must be one of {', '.join(RESPONSE_FORMATS)}",
                param="response_format",
            )
        grains = form.fields.get("timestamp_granularities[]", [])
        if any(g not in ("segment", "word") for g in grains):
            raise ApiError(
                400,
                "timestamp granularities are 'segment' or 'word'",
                param="timestamp_granularities[]",
            )
        if "word" in grains:
            raise ApiError(
                400, "word timestamps are not supported", param="timestamp_granularities[]"
            )
        if grains and fmt != "verbose_json":
            raise ApiError(
                400,
                "timestamp granularities need response_format 'verbose_json'",
                param="timestamp_granularities[]",
            )
        raw = form.one("temperature")
        try:
            temperature = 0.0 if raw in (None, "") else float(raw)
        except ValueError:
            raise ApiError(400, "'temperature' must be a number", param="temperature") from None
        if not 0.0 <= temperature <= 1.0:
            raise ApiError(400, "'temperature' must be in [0, 1]", param="temperature")
        filename, audio = form.files["file"]
        if not audio:
            raise ApiError(400, "the audio file is empty", param="file")
        if len(audio) > self.max_audio_bytes:
            raise ApiError(
                413, f"the audio file is over {self.max_audio_bytes} bytes", code="too_large"
            )
        suffix = Path(filename).suffix.lower()
        if not re.fullmatch(r"\.[a-z0-9]{1,8}", suffix):  # (a name of the client's: a kind only)
            suffix = ".wav"
        return _Ask(audio, suffix, language, temperature, fmt, task)

    def prompt(self, ask: _Ask) -> Any:
        try:
            return self.runner.decoder_prompt(
                ask.language, ask.task if self.translates else None, self._timed(ask)
            )
        except PtexecError as e:
            raise ApiError(400, str(e), param="language") from None

    @staticmethod
    def _timed(ask: _Ask) -> bool:
        return ask.response_format in ("verbose_json", "srt", "vtt")

    # -- running ----------------------------------------------------------------------------
    async def transcribe(self, form: Form, task: str) -> tuple[Any, str]:
        """The answer to one request: (a JSON object or text, its media type)."""
        if self.draining:
            raise ApiError(503, "the server is shutting down", "server_error", code="draining")
        ask = self.check(form, task)
        prompt = self.prompt(ask)
        if self._waiting >= self.max_queue:
            raise ApiError(
                429, "too many requests are waiting", "rate_limit_error",
                headers={"Retry-After": "1"},
            )  # fmt: skip
        self._waiting += 1
        self._running += 1
        try:
            try:
                await asyncio.wait_for(self._turn.acquire(), self.timeout)
            except asyncio.TimeoutError:
                raise ApiError(504, "the request timed out waiting", "timeout") from None
            finally:
                self._waiting -= 1
            try:
                result, seconds = await asyncio.to_thread(self._run, ask, prompt)
            finally:
                self._turn.release()
        finally:
            self._running -= 1
            if self._running == 0 and self._idle is not None:
                self._idle.set()
        return self._answer(ask, result, seconds)

    def _run(self, ask: _Ask, prompt: Any) -> tuple[Any, float]:
        from ..errors import AudioFormatError
        from ..llm import GenerationConfig
        from ..llm.audio import load_audio

        rate = self.features.sampling_rate
        with tempfile.TemporaryDirectory(prefix="ptexec-audio-") as tmp:
            path = os.path.join(tmp, "audio" + ask.suffix)
            with open(path, "wb") as f:
                f.write(ask.audio)
            try:
                samples, _ = load_audio(path, rate)
            except (AudioFormatError, OSError) as e:
                why = str(e).replace(path, "the file")  # (the server's own path: not the client's)
                raise ApiError(400, f"the audio could not be read: {why}", param="file") from None
        # Whisper's sampling: the temperature alone (no top-p or top-k cut)
        config = GenerationConfig(temperature=ask.temperature, top_p=1.0, top_k=0)
        result = self.runner.transcribe(samples, self.features, config, prompt=prompt)
        return result, samples.shape[-1] / rate

    def _answer(self, ask: _Ask, result: Any, duration: float) -> tuple[Any, str]:
        from ..llm.languages import language_name

        text = result.text
        if ask.response_format == "json":
            return {"text": text}, "application/json"
        if ask.response_format == "text":
            return text + "\n", "text/plain; charset=utf-8"
        windows = result.windows
        segments = []
        for i, seg in enumerate(self._segments(result, duration)):
            window = windows[seg.window] if seg.window < len(windows) else None
            segments.append(
                {
                    "id": i,
                    # the window's offset in Whisper's feature frames (10 ms each)
                    "seek": round(window.start * 100) if window is not None else 0,
                    "start": round(seg.start, 3),
                    "end": round(seg.end, 3),
                    "text": seg.text,
                    "tokens": seg.tokens,
                    "temperature": ask.temperature,
                    "avg_logprob": window.avg_logprob if window is not None else 0.0,
                    "compression_ratio": window.compression_ratio if window else 1.0,
                    "no_speech_prob": (window.no_speech_prob or 0.0) if window else 0.0,
                }
            )
        if ask.response_format == "verbose_json":
            # OpenAI names the language ("english"); a translation's is always English,
            # and so is an English-only model's (no language table)
            code = result.language if ask.task != "translate" else None
            body = {
                "task": ask.task,
                "language": language_name(code) if code else "english",
                "duration": round(duration, 3),
                "text": text,
                "segments": segments,
            }
            return body, "application/json"
        vtt = ask.response_format == "vtt"
        media = "text/vtt; charset=utf-8" if vtt else "application/x-subrip; charset=utf-8"
        return subtitles(segments, vtt), media

    def _segments(self, result: Any, duration: float) -> list[Any]:
        """The model's timed segments, and, for a window without any, the window whole
        (one window may be timed and the next not: each window's text is in a segment)."""
        from ..llm import Segment

        span = self.features_span()
        eos = self.runner.eos_ids
        begin = getattr(self.runner, "timestamp_begin", None)  # (a timestamp is no text)
        timed: dict[int, list[Any]] = {}
        for seg in result.segments:
            timed.setdefault(seg.window, []).append(seg)
        out: list[Any] = []
        for i, ids in enumerate(result.tokens):
            if i in timed:
                out += timed.pop(i)
                continue
            kept = [t for t in ids if t not in eos and (begin is None or t < begin)]
            body = self.runner.decode(kept)
            if body.strip():
                start = i * span
                out.append(Segment(start, min(duration, start + span), body, kept, i))
        for rest in timed.values():  # (segments of no window in the tokens: kept as given)
            out += rest
        return out

    def features_span(self) -> float:
        most = getattr(self.features, "window_samples", None)
        return most / self.features.sampling_rate if most else 30.0

    # -- the server's contract ---------------------------------------------------------------
    @property
    def idle(self) -> bool:
        return self._running == 0

    async def wait_idle(self) -> None:
        while not self.idle:
            self._idle = asyncio.Event()
            await self._idle.wait()

    def close(self) -> None:
        """Nothing to release (the runner's methods go with it)."""
