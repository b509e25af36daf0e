"""OpenAI's request fields and error format: parsing a request body into :class:`Request`.

Every field is checked for type and range before anything runs; a problem is an
:class:`ApiError` with OpenAI's status, ``type``, ``param`` and ``code``. Fields OpenAI
defines that this server does not implement (``n`` and ``best_of`` other than 1, tools
and a ``tool_choice`` that demands a call, spoken answers, moderation, web search, a
completion's ``suffix``) are refused rather than ignored, so a client never gets less than it asked for without
knowing; so is a field neither OpenAI's API nor this server's extensions define. A completion's ``prompt`` is a string, a list of token ids, or a list of either
(several prompts, one choice each, not streamed); ``logprobs`` (completions: the number of
alternatives, up to :data:`MAX_LOGPROBS`; chat: ``logprobs: true`` and ``top_logprobs``)
asks for each token's log-probability, and with ``echo`` a completion's prompt tokens are
scored too. ``logit_bias`` (token id -> a bias in [-100, 100]) is added to the logits before
sampling. A chat's user messages may hold images (``image_url`` parts with a base64
``data:`` URL; the server fetches nothing) and audio (``input_audio`` parts), kept in
:attr:`Request.media`.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_COMPLETION_TOKENS",
    "MAX_LOGPROBS",
    "MAX_PROMPTS",
    "ApiError",
    "Prompt",
    "Request",
    "parse_request",
]

MAX_LOGPROBS = 20
"""The most alternatives a token's log-probabilities list (OpenAI: 5 for completions, 20
for chat)."""
MAX_PROMPTS = 256
"""The most prompts one completion request takes."""
DEFAULT_COMPLETION_TOKENS = 16
"""The most tokens a completion without ``max_tokens`` generates (OpenAI's default; a chat
completion without it may fill the context). Fewer where the context ends sooner."""

Prompt = str | list[int]
"""A completion prompt: text, or token ids."""


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
    prompt: Prompt = ""
    prompts: list[Prompt] = field(default_factory=list)
    """A completion's prompts (``prompt`` is the first): one choice each."""
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
    logprobs: int | None = None
    """Each token's log-probability and this many likeliest alternatives (None: off)."""
    logit_bias: dict[int, float] = field(default_factory=dict)
    """Token id -> a value added to its logit before sampling."""
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    """A chat's ``chat_template_kwargs`` (vLLM's extension): further variables of the chat
    template (``enable_thinking``, ...), ``add_generation_prompt`` and
    ``continue_final_message``."""
    media: list[tuple[str, bytes]] = field(default_factory=list)
    """A chat's images and audio, in the order of its messages' parts: (``"image"`` or
    ``"audio"``, the file's bytes); each is an ``{"type": "image"}`` (``"audio"``) part of
    its message's content."""


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


def _content(content: Any, where: str, media: list[tuple[str, bytes]] | None) -> Any:
    """A message's content: a string, or a list of content parts. Text parts are joined
    into one string; a list holding an image (``image_url`` with a ``data:`` URL) or audio
    (``input_audio``), in a user message (``media`` not None), stays a list of
    ``{"type": "text", "text": ...}``, ``{"type": "image"}`` and ``{"type": "audio"}``
    parts, as chat templates take them, the media's bytes appended to ``media``."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where} must be a string or a list of content parts", "messages")
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise _bad(f"{where}[{i}].text must be a string", "messages")
            parts.append({"type": "text", "text": text})
        elif kind == "image_url" and media is not None:
            media.append(("image", _data_url(part.get("image_url"), f"{where}[{i}].image_url")))
            parts.append({"type": "image"})
        elif kind == "input_audio" and media is not None:
            media.append(("audio", _audio_data(part.get("input_audio"), f"{where}[{i}]")))
            parts.append({"type": "audio"})
        elif kind in ("image_url", "input_audio", "file"):
            what = "user messages" if kind != "file" else "text, image_url and input_audio parts"
            raise _bad(f"{where}[{i}]: {kind} content parts are not taken here ({what} "
                       "only)", "messages")  # fmt: skip
        else:
            raise _bad(f"{where}[{i}]: unknown content part type {json.dumps(kind)[:40]}",
                       "messages")  # fmt: skip
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


MAX_IMAGE_BYTES = 20 << 20
"""The largest image one content part holds (OpenAI's limit)."""
IMAGE_DETAILS = ("auto", "low", "high")
"""``image_url.detail`` values taken (OpenAI's). Each gives the same answer: the image is
preprocessed to the one size the model's vision encoder takes."""


def _data_url(value: Any, where: str) -> bytes:
    """The bytes of an ``image_url`` part's ``data:`` URL (``{"url": ...}``, or the URL
    itself). The server fetches nothing: any other URL is refused."""
    url = value.get("url") if isinstance(value, dict) else value
    detail = value.get("detail") if isinstance(value, dict) else None
    if detail is not None and detail not in IMAGE_DETAILS:
        raise _bad(f"{where}.detail must be one of {', '.join(IMAGE_DETAILS)}, not "
                   f"{json.dumps(detail)[:40]}", "messages")  # fmt: skip
    if not isinstance(url, str):
        raise _bad(f"{where}.url must be a string", "messages")
    if not url.startswith("data:"):
        raise _bad(
            f"{where}.url: this server fetches no URLs; send the image inline as a "
            "'data:image/...;base64,...' URL",
            "messages",
        )
    head, comma, payload = url.partition(",")
    if not comma or not head.endswith(";base64"):
        raise _bad(f"{where}.url must be a base64 data URL ('data:image/png;base64,...')",
                   "messages")  # fmt: skip
    mime = head[5 : -len(";base64")].split(";")[0].strip().lower()
    if mime and not mime.startswith("image/"):
        raise _bad(f"{where}.url holds {mime!r}, not an image", "messages")
    if len(payload) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise _bad(f"{where}: the image is over {MAX_IMAGE_BYTES} bytes", "messages")
    try:
        data = base64.b64decode(payload, validate=True)
    except ValueError:
        raise _bad(f"{where}.url: the data is not valid base64", "messages") from None
    if not data:
        raise _bad(f"{where}.url holds no data", "messages")
    return data


MAX_AUDIO_BYTES = 25 << 20
"""The largest audio one content part holds (OpenAI's upload limit)."""
AUDIO_FORMATS = ("wav", "mp3", "flac", "ogg")
"""``input_audio.format`` values taken (WAV is read as is; the others need soundfile)."""


def _audio_data(value: Any, where: str) -> bytes:
    """The bytes of an ``input_audio`` part (``{"data": base64, "format": "wav"}``)."""
    if not isinstance(value, dict):
        raise _bad(f"{where}.input_audio must be an object with 'data' and 'format'", "messages")
    fmt, data = value.get("format"), value.get("data")
    if fmt not in AUDIO_FORMATS:
        raise _bad(f"{where}.input_audio.format must be one of {', '.join(AUDIO_FORMATS)}, "
                   f"not {json.dumps(fmt)[:40]}", "messages")  # fmt: skip
    if not isinstance(data, str) or not data:
        raise _bad(f"{where}.input_audio.data must be a base64 string", "messages")
    if len(data) > MAX_AUDIO_BYTES * 4 // 3 + 4:
        raise _bad(f"{where}: the audio is over {MAX_AUDIO_BYTES} bytes", "messages")
    try:
        return base64.b64decode(data, validate=True)
    except ValueError:
        raise _bad(f"{where}.input_audio.data is not valid base64", "messages") from None


def _messages(body: dict[str, Any], media: list[tuple[str, bytes]]) -> list[dict[str, Any]]:
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
        value = "" if content is None and role == "assistant" else _content(
            content, f"messages[{i}].content", media if role == "user" else None
        )  # fmt: skip
        message: dict[str, Any] = {"role": "system" if role == "developer" else role,
                                   "content": value}  # fmt: skip
        name = m.get("name")
        if name is not None:
            if not isinstance(name, str):
                raise _bad(f"messages[{i}].name must be a string", "messages")
            message["name"] = name
        if role == "assistant" and m.get("tool_calls") is not None:
            calls = _tool_calls(m["tool_calls"], f"messages[{i}].tool_calls")
            if calls:  # an empty list: the template's plain assistant turn
                message["tool_calls"] = calls
        if role == "tool" and m.get("tool_call_id") is not None:
            if not isinstance(m["tool_call_id"], str):
                raise _bad(f"messages[{i}].tool_call_id must be a string", "messages")
            message["tool_call_id"] = m["tool_call_id"]
        out.append(message)
    return out


def _tool_calls(value: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` (a conversation's history of calls), as chat
    templates take them: each call's ``function.arguments``, a JSON text in OpenAI's
    format, parsed into its object (transformers' templates write it with ``tojson``; vLLM
    passes it on so too); missing or empty arguments are ``{}``."""
    if not isinstance(value, list):
        raise _bad(f"{where} must be a list", "messages")
    calls = []
    for k, call in enumerate(value):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise _bad(f"{where}[{k}] must be an object with a 'function' object that has "
                       "a 'name' string", "messages")  # fmt: skip
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            try:
                arguments = json.loads(arguments)
            except (ValueError, RecursionError):  # (nested too deep to read)
                raise _bad(f"{where}[{k}].function.arguments is not valid JSON",
                           "messages") from None  # fmt: skip
        elif not arguments:
            arguments = {}
        if not isinstance(arguments, (dict, list)):
            raise _bad(f"{where}[{k}].function.arguments must be a JSON object", "messages")
        calls.append({**call, "function": {**function, "arguments": arguments}})
    return calls


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


def _text_answer(body: dict[str, Any]) -> None:
    """Refuses what a chat's text answer cannot give: a tool call demanded by
    ``tool_choice`` or ``function_call`` (no tools are served; ``"none"`` and ``"auto"``
    demand none), spoken output (``modalities`` other than ``["text"]``, ``audio``), and
    services around the model this server does not run: ``moderation`` (screening, maybe
    blocking, the prompt and the answer) and ``web_search_options`` (a web search)."""
    for name in ("tool_choice", "function_call"):
        v = body.get(name)
        if v is not None and v not in ("none", "auto"):
            raise _bad(f"'{name}' asks for a tool call; tools are not supported", name)
    modalities = body.get("modalities")
    if modalities is not None and (
        not isinstance(modalities, list) or any(m != "text" for m in modalities)
    ):
        raise _bad("'modalities' must be a list holding 'text' only (text answers)", "modalities")
    if body.get("audio") is not None:
        raise _bad("spoken answers ('audio') are not supported", "audio")
    if body.get("moderation") is not None:
        raise _bad("moderation is not supported: nothing would be screened", "moderation")
    if body.get("web_search_options") is not None:
        raise _bad("web search is not supported", "web_search_options")


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


def _logit_bias(body: dict[str, Any]) -> dict[int, float]:
    """``logit_bias``: token ids (JSON object keys, so strings of digits) to a bias in
    [-100, 100]."""
    v = body.get("logit_bias")
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise _bad("'logit_bias' must be an object of token ids to numbers", "logit_bias")
    out: dict[int, float] = {}
    for key, value in v.items():
        if not (
            isinstance(key, str) and key.isascii() and key.isdigit() and len(key.lstrip("0")) <= 18
        ):
            raise _bad(
                f"'logit_bias' keys must be token ids, got {json.dumps(key)[:40]}", "logit_bias"
            )
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not -100 <= value <= 100
        ):
            raise _bad(
                f"'logit_bias' of token {key} must be a number in [-100, 100], "
                f"got {json.dumps(value)[:40]}",
                "logit_bias",
            )
        out[int(key)] = float(value)
    return out


# The fields a request may hold: OpenAI's (read above and below, or hints that change no
# text) and the extensions this server honours. Any other field is refused, as OpenAI
# refuses an argument it does not recognize: vLLM's extensions (min_tokens, stop_token_ids,
# guided_json, ...) would change the answer where they are honoured.
_BOTH_FIELDS = frozenset({
    "model", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
    "presence_penalty", "seed", "stop", "stream", "stream_options", "temperature", "top_p",
    "user", "best_of", "max_completion_tokens", "response_format",
    # honoured extensions (vLLM's names)
    "top_k", "min_p", "repetition_penalty", "ignore_eos", "chat_template_kwargs",
})  # fmt: skip
_COMPLETION_FIELDS = _BOTH_FIELDS | {"prompt", "echo", "suffix"}
_CHAT_FIELDS = _BOTH_FIELDS | {
    "messages", "audio", "function_call", "functions", "metadata", "modalities", "moderation",
    "parallel_tool_calls", "prediction", "prompt_cache_key", "prompt_cache_options",
    "prompt_cache_retention", "reasoning_effort", "safety_identifier", "service_tier", "store",
    "tool_choice", "tools", "top_logprobs", "verbosity", "web_search_options",
}  # fmt: skip


_STREAM_OPTIONS = ("include_usage", "include_obfuscation")


def _known_fields(body: dict[str, Any], chat: bool) -> None:
    """Refuses a field the route does not take (one set to null asks for nothing)."""
    known = _CHAT_FIELDS if chat else _COMPLETION_FIELDS
    for name, value in body.items():
        if name not in known and value is not None:
            route = "/v1/chat/completions" if chat else "/v1/completions"
            raise ApiError(
                400,
                f"unknown field {json.dumps(name)[:60]}: {route} does not take it (it would "
                "be ignored)",
                param=str(name)[:60],
                code="unknown_parameter",
            )


def parse_request(body: Any, chat: bool) -> Request:
    """The validated request of a ``/v1/chat/completions`` (``chat``) or ``/v1/completions``
    body (already decoded JSON). Raises :class:`ApiError` (400)."""
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", "body")
    _known_fields(body, chat)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' must be a non-empty string", "model")
    req = Request(chat=chat, model=model)
    if chat:
        req.messages = _messages(body, req.media)
        if body.get("tools") or body.get("functions"):
            raise _bad("tools and functions are not supported", "tools")
        _text_answer(body)
        req.template_kwargs = _template_kwargs(body)
        if _flag(body, "logprobs"):
            req.logprobs = _integer(body, "top_logprobs", 0, MAX_LOGPROBS) or 0
        elif body.get("top_logprobs") is not None:
            raise _bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    else:
        req.prompts = _prompts(body.get("prompt"))
        req.prompt = req.prompts[0]
        req.echo = _flag(body, "echo")
        req.logprobs = _integer(body, "logprobs", 0, MAX_LOGPROBS)
        if body.get("suffix"):  # (None and "" ask for nothing)
            raise _bad("'suffix' (text after the insertion) is not supported", "suffix")
        if body.get("chat_template_kwargs"):
            raise _bad(
                "'chat_template_kwargs' is for chats: a completion has no template",
                "chat_template_kwargs",
            )
    n = _integer(body, "n", 1, 1_000_000)
    if n is not None and n != 1:
        raise _bad("only n=1 is supported", "n")
    best_of = _integer(body, "best_of", 1, 1_000_000)
    if best_of is not None and best_of != 1:
        raise _bad("only best_of=1 is supported", "best_of")
    least = 1 if chat else 0  # a completion of 0 tokens scores its prompt (with echo)
    # both are checked; the newer name wins when both are given (OpenAI's rule)
    newer = _integer(body, "max_completion_tokens", least, 1 << 30)
    older = _integer(body, "max_tokens", least, 1 << 30)
    req.max_tokens = newer if newer is not None else older
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
        if not req.stream:
            raise _bad("'stream_options' is only allowed with 'stream': true", "stream_options")
        # OpenAI's options (obfuscation pads chunks: no text); another, such as vLLM's
        # continuous_usage_stats, would be ignored
        other = sorted(k for k, v in options.items() if k not in _STREAM_OPTIONS and v is not None)
        if other:
            raise _bad(
                f"'stream_options' takes {' and '.join(_STREAM_OPTIONS)}, not "
                f"{json.dumps(other[0])[:40]}",
                "stream_options",
            )
        req.include_usage = _flag(options, "include_usage")
    req.presence_penalty = _number(body, "presence_penalty", 0.0, -2.0, 2.0)
    req.frequency_penalty = _number(body, "frequency_penalty", 0.0, -2.0, 2.0)
    req.repetition_penalty = _number(body, "repetition_penalty", 1.0, 1e-3, 100.0)
    req.response_format = _response_format(body)
    req.ignore_eos = _flag(body, "ignore_eos")
    req.logit_bias = _logit_bias(body)
    if req.stream and len(req.prompts) > 1:
        raise _bad("several prompts are answered in one response, not streamed", "stream")
    return req


# the chat template's variables a request does not set through chat_template_kwargs: the
# conversation is its messages (tools are refused above)
_TEMPLATE_OWN = frozenset({"messages", "tools", "documents"})


def _template_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    """A chat's ``chat_template_kwargs``, as vLLM takes them: an object of further template
    variables (``{"enable_thinking": false}`` for Qwen3's), ``add_generation_prompt`` and
    ``continue_final_message`` among them (bools, taken as ``apply_chat_template`` takes
    them); never the conversation's own variables."""
    name = "chat_template_kwargs"
    kwargs = body.get(name)
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise _bad(f"'{name}' must be an object", name)
    own = sorted(_TEMPLATE_OWN.intersection(kwargs))
    if own:
        raise _bad(f"'{name}' may not set {', '.join(own)}: the request gives them", name)
    for flag in ("add_generation_prompt", "continue_final_message"):
        if not isinstance(kwargs.get(flag, True), bool):
            raise _bad(f"'{name}.{flag}' must be a boolean", name)
    return dict(kwargs)


def _token_ids(v: list[Any]) -> list[int] | None:
    """``v`` as token ids, or None when it is not a list of integers."""
    if v and all(isinstance(t, int) and not isinstance(t, bool) for t in v):
        return [int(t) for t in v]
    return None


def _prompts(v: Any) -> list[Prompt]:
    """A completion's ``prompt``: a string, token ids, or a non-empty list of either."""
    what = "'prompt' must be a string, a list of token ids, or a list of those"
    if isinstance(v, str):
        return [v]
    if not isinstance(v, list) or not v:
        raise _bad(what, "prompt")
    ids = _token_ids(v)
    if ids is not None:
        return [ids]
    if len(v) > MAX_PROMPTS:
        raise _bad(f"'prompt' holds {len(v)} prompts; at most {MAX_PROMPTS} a request", "prompt")
    out: list[Prompt] = []
    for item in v:
        if isinstance(item, str):
            out.append(item)
            continue
        ids = _token_ids(item) if isinstance(item, list) else None
        if ids is None:
            raise _bad(what, "prompt")
        out.append(ids)
    return out
