"""Chat templates: a conversation as the prompt text the model was trained on.

A Hugging Face checkpoint keeps its chat template (a Jinja template) in
``tokenizer_config.json`` (``chat_template``: one template, or a list of named ones of which
``default`` is used), or in ``chat_template.jinja`` beside it. :class:`ChatTemplate` renders
it the way transformers' ``apply_chat_template`` does: Jinja2's immutable sandbox with
``trim_blocks`` and ``lstrip_blocks``, the loop controls, a ``tojson`` that keeps non-ASCII
text and does not escape HTML, ``raise_exception`` and ``strftime_now``, the ``{% generation
%}`` tag (its body rendered as is), and the tokenizer's special tokens (``bos_token``,
``eos_token``, ...) as variables. The rendered text carries the special tokens as text; it is
encoded without adding any (the template put BOS where the model wants it).

A template read from disk is untrusted: the sandbox refuses attribute access to Python
internals, and the template can only produce text.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from ..errors import GenerationError

__all__ = ["ChatTemplate", "ChatTemplateError"]

# the special tokens transformers passes to a template (its special_tokens_map)
_SPECIAL = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


class ChatTemplateError(GenerationError, ValueError):
    """A template that does not compile or render, or a conversation it refuses."""


def _token_text(entry: Any) -> str | None:
    if isinstance(entry, dict):  # {"content": "<s>", ...}
        entry = entry.get("content")
    return entry if isinstance(entry, str) else None


class ChatTemplate:
    """A compiled chat template with the tokenizer's special tokens.

    ``source`` is the Jinja text; ``special_tokens`` maps ``bos_token``, ``eos_token``, ...
    to their text. Raises :class:`ChatTemplateError` when the template does not compile.
    """

    def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None) -> None:
        if not isinstance(source, str) or not source:
            raise ChatTemplateError("a chat template is non-empty text")
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        self._template = _compile(source)

    # -- finding one ---------------------------------------------------------------------
    @classmethod
    def for_tokenizer(
        cls,
        tokenizer_path: str | os.PathLike[str],
        template_path: str | os.PathLike[str] | None = None,
    ) -> ChatTemplate | None:
        """The template beside a tokenizer (``tokenizer_config.json``'s ``chat_template``,
        else ``chat_template.jinja``), or the one in ``template_path`` (a Jinja file); None
        when there is none. The special tokens come from ``tokenizer_config.json``."""
        p = Path(tokenizer_path)
        folder = p if p.is_dir() else p.parent
        config: dict[str, Any] = {}
        config_path = folder / "tokenizer_config.json"
        if config_path.is_file():
            try:
                loaded = json.loads(config_path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise ChatTemplateError(f"{config_path.name}: unreadable ({e})") from None
            if isinstance(loaded, dict):
                config = loaded
        special = {k: t for k in _SPECIAL if (t := _token_text(config.get(k))) is not None}
        if template_path is not None:
            return cls(_read(Path(template_path)), special)
        source = _pick(config.get("chat_template"))
        if source is None and (folder / "chat_template.jinja").is_file():
            source = _read(folder / "chat_template.jinja")
        return cls(source, special) if source else None

    # -- rendering -----------------------------------------------------------------------
    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """The prompt text of ``messages`` (``[{"role": ..., "content": ...}, ...]``), ending
        with the assistant's turn opened when ``add_generation_prompt``. ``kwargs`` are
        further template variables (they override the special tokens)."""
        import jinja2

        variables: dict[str, Any] = {**self.special_tokens, **kwargs}
        try:
            return str(
                self._template.render(
                    messages=[dict(m) for m in messages],
                    tools=list(tools) if tools is not None else None,
                    documents=None,
                    add_generation_prompt=add_generation_prompt,
                    **variables,
                )
            )
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the chat template refused the conversation: {e}") from None
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
            raise ChatTemplateError(f"the chat template failed: {type(e).__name__}: {e}") from None

    def __repr__(self) -> str:
        return f"<ptexec.llm.ChatTemplate {len(self.source)} chars>"


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ChatTemplateError(f"cannot read the chat template {path.name} ({e})") from None


def _pick(entry: Any) -> str | None:
    """``chat_template`` is one template, or a list of ``{"name", "template"}``."""
    if isinstance(entry, str):
        return entry
    if isinstance(entry, list):
        named = {
            e.get("name"): e.get("template")
            for e in entry
            if isinstance(e, dict) and isinstance(e.get("template"), str)
        }
        return named.get("default")
    return None


def _compile(source: str) -> Any:
    try:
        import jinja2
        import jinja2.ext
        import jinja2.nodes
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ChatTemplateError(
            "chat templates need the 'jinja2' package (pip install 'ptexec[serve]')"
        ) from e

    class _Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: marks the assistant's text for
        training masks; rendering keeps its body."""

        tags = {"generation"}  # noqa: RUF012 - Jinja's extension protocol

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(
                lineno
            )

        def _body(self, caller: Any) -> str:
            return str(caller())

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_Generation, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"the chat template does not compile: {e}") from None
