"""OpenAI's request fields and error format: parsing a request body into :class:`Request`.

Every field is checked for type and range before anything runs; a problem is an
:class:`ApiError` with OpenAI's status, ``type``, ``param`` and ``code``. Fields OpenAI
defines that this server does not implement (``n`` other than 1, ``logprobs``, tools) are
refused rather than ignored, so a client never gets less than it asked for without knowing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ApiError", "Request", "parse_request"]


class ApiError(Exception):
    """An error answer: HTTP ``status`` and OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass
class Request:
    """A validated completion or chat request."""

    chat: bool
    model: str
    prompt: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    response_format: dict[str, Any] | None = None
    echo: bool = False
    ignore_eos: bool = False


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value")


def _number(body: dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or v != v:
        raise _bad(f"'{name}' must be a number, got {json.dumps(v)[:40]}", name)
    if not lo <= v <= hi:
        raise _bad(f"'{name}' must be in [{lo:g}, {hi:g}], got {v}", name)
    return float(v)


def _integer(body: dict[str, Any], name: str, lo: int, hi: int) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(f"'{name}' must be an integer, got {json.dumps(v)[:40]}", name)
    if not lo <= v <= hi:
        raise _bad(f"'{name}' must be in [{lo}, {hi}], got {v}", name)
    return v


def _flag(body: dict[str, Any], name: str) -> bool:
    v = body.get(name, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise _bad(f"'{name}' must be a boolean", name)
    return v


def _text_content(content: Any, where: str) -> str:
    """A message's content: a string, or a list of ``{"type": "text", "text": ...}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise _bad(f"{where}[{i}]: only text content parts are supported", "messages")
            text = part.get("text")
            if not isinstance(text, str):
                raise _bad(f"{where}[{i}].text must be a string", "messages")
            parts.append(text)
        return "".join(parts)
    raise _bad(f"{where} must be a string or a list of text parts", "messages")


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise _bad("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise _bad(f"messages[{i}] must be an object", "messages")
        role = m.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise _bad(
                f"messages[{i}].role {json.dumps(role)[:40]} is not a known role", "messages"
            )
        content = m.get("content")
        text = "" if content is None and role == "assistant" else _text_content(
            content, f"messages[{i}].content"
        )  # fmt: skip
        out.append({"role": "system" if role == "developer" else role, "content": text})
    return out


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    v = body.get("stop")
    if v is None:
        return ()
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise _bad("'stop' must be a string or a list of strings", "stop")
    if len(items) > 4:
        raise _bad("'stop' takes at most 4 sequences", "stop")
    return tuple(s for s in items if s)


def _response_format(body: dict[str, Any]) -> dict[str, Any] | None:
    v = body.get("response_format")
    if v is None:
        return None
    if not isinstance(v, dict) or v.get("type") not in ("text", "json_object", "json_schema"):
        raise _bad(
            "'response_format.type' must be 'text', 'json_object' or 'json_schema'",
            "response_format",
        )
    if v["type"] == "text":
        return None
    if v["type"] == "json_schema":
        spec = v.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise _bad(
                "'response_format.json_schema' must be an object with a 'schema' object",
                "response_format",
            )
    return v


def parse_request(body: Any, chat: bool) -> Request:
    """The validated request of a ``/v1/chat/completions`` (``chat``) or ``/v1/completions``
    body (already decoded JSON). Raises :class:`ApiError` (400)."""
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", "body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' must be a non-empty string", "model")
    req = Request(chat=chat, model=model)
    if chat:
        req.messages = _messages(body)
        if body.get("tools") or body.get("functions"):
            raise _bad("tools and functions are not supported", "tools")
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise _bad("'prompt' must be a string (one prompt per request)", "prompt")
        req.prompt = prompt
        req.echo = _flag(body, "echo")
    n = _integer(body, "n", 1, 1_000_000)
    if n is not None and n != 1:
        raise _bad("only n=1 is supported", "n")
    if body.get("logprobs") or body.get("top_logprobs"):
        raise _bad("logprobs are not supported", "logprobs")
    best_of = _integer(body, "best_of", 1, 1_000_000)
    if best_of is not None and best_of != 1:
        raise _bad("only best_of=1 is supported", "best_of")
    max_tokens = _integer(body, "max_completion_tokens", 1, 1 << 30)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", 1, 1 << 30)
    req.max_tokens = max_tokens
    req.temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    req.top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if req.top_p == 0.0:
        req.top_p = 1e-9  # the likeliest token only
    req.top_k = int(_integer(body, "top_k", -1, 1 << 30) or 0)
    req.min_p = _number(body, "min_p", 0.0, 0.0, 1.0)
    req.seed = _integer(body, "seed", -(1 << 63), (1 << 63) - 1)
    req.stop = _stop(body)
    req.stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise _bad("'stream_options' must be an object", "stream_options")
        req.include_usage = _flag(options, "include_usage")
    req.presence_penalty = _number(body, "presence_penalty", 0.0, -2.0, 2.0)
    req.frequency_penalty = _number(body, "frequency_penalty", 0.0, -2.0, 2.0)
    req.repetition_penalty = _number(body, "repetition_penalty", 1.0, 1e-3, 100.0)
    req.response_format = _response_format(body)
    req.ignore_eos = _flag(body, "ignore_eos")
    return req
