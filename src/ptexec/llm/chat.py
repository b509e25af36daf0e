"""Chat templates: a conversation as the prompt text the model was trained on.

A Hugging Face checkpoint keeps its chat template (a Jinja template) in
``chat_template.jinja`` (named others in ``additional_chat_templates/*.jinja``), or, where
no such file is, in ``tokenizer_config.json`` (``chat_template``: one template, or a list of
named ones): the files first, as transformers reads them. ``default`` is the template used,
``tool_use`` where there are tools and the checkpoint has one. :class:`ChatTemplate` renders
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

# the special tokens every transformers tokenizer passes to a template (its special_tokens_map;
# a model's own, such as image_token, come with them)
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

    ``source`` is the Jinja text of the default template (None: there is none, only named
    ones); ``special_tokens`` maps ``bos_token``, ``eos_token``, ... to their text;
    ``named`` holds a checkpoint's other templates by name (``tool_use`` renders a
    conversation given tools). Raises :class:`ChatTemplateError` when a template does not
    compile (a named one when first used).
    """

    def __init__(
        self,
        source: str | None,
        special_tokens: Mapping[str, str] | None = None,
        named: Mapping[str, str] | None = None,
    ) -> None:
        named = {k: v for k, v in (named or {}).items() if k != "default"}
        if source is None and not named:
            raise ChatTemplateError("a chat template is non-empty text")
        for text in (source, *named.values()):
            if text is not None and (not isinstance(text, str) or not text):
                raise ChatTemplateError("a chat template is non-empty text")
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        self.named = named
        self._template = _compile(source) if source is not None else None
        self._compiled: dict[str, Any] = {}

    # -- finding one ---------------------------------------------------------------------
    @classmethod
    def for_tokenizer(
        cls,
        tokenizer_path: str | os.PathLike[str],
        template_path: str | os.PathLike[str] | None = None,
    ) -> ChatTemplate | None:
        """The templates beside a tokenizer (``chat_template.jinja`` and
        ``additional_chat_templates/*.jinja``, else ``tokenizer_config.json``'s
        ``chat_template``, else a processor's ``chat_template.json``), or the one in
        ``template_path`` (a Jinja file); None when there is none. The special tokens
        come from ``tokenizer_config.json`` (and, for a checkpoint that lists no added
        tokens there, ``special_tokens_map.json``), as transformers reads them
        (:func:`_named_tokens`); BOS and EOS that neither names are a SentencePiece
        model's own pieces (:func:`_model_names`)."""
        p = Path(tokenizer_path)
        folder = p if p.is_dir() else p.parent
        config = _json_object(folder / "tokenizer_config.json")
        named = _named_tokens(config)
        if "added_tokens_decoder" not in config:  # transformers' older layout
            named.update(_named_tokens(_json_object(folder / "special_tokens_map.json")))
        special = {k: t for k, t in named.items() if t is not None}
        if not {"bos_token", "eos_token"} <= named.keys():
            special = {**_model_names(p), **special}
        if template_path is not None:
            return cls(_read(Path(template_path)), special)
        templates = (
            _template_files(folder)
            or _pick(config.get("chat_template"))
            # a processor's (multimodal checkpoints): read where the tokenizer has none
            or _pick(_json_object(folder / "chat_template.json").get("chat_template"))
        )
        if not templates:
            return None
        return cls(templates.get("default"), special, templates)

    # -- rendering -----------------------------------------------------------------------
    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool | None = None,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """The prompt text of ``messages`` (``[{"role": ..., "content": ...}, ...]``), ending
        with the assistant's turn opened when ``add_generation_prompt`` (None: unless
        ``continue_final_message``), or, with ``continue_final_message``, inside the last
        message, right after its text (its last text part), so that the model goes on with
        it. ``tools`` and ``documents`` (a retrieval template's) are the template's
        variables of those names; ``kwargs`` are further ones (they override the special
        tokens)."""
        if add_generation_prompt is None:
            add_generation_prompt = not continue_final_message
        if add_generation_prompt and continue_final_message:
            raise ChatTemplateError(
                "continue_final_message and add_generation_prompt exclude each other: the "
                "prompt ends either inside the last message or in a new assistant turn"
            )
        copied = [dict(m) for m in messages]
        ending = _mark_the_end(copied) if continue_final_message else None
        rendered = self._render(copied, add_generation_prompt, tools, documents, kwargs)
        return rendered if ending is None else _cut_at_the_mark(rendered, ending)

    def _render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        tools: Sequence[Mapping[str, Any]] | None,
        documents: Sequence[Mapping[str, Any]] | None,
        kwargs: dict[str, Any],
    ) -> str:
        import jinja2

        template = self._chosen(tools)
        variables: dict[str, Any] = {**self.special_tokens, **kwargs}
        try:
            return str(
                template.render(
                    messages=messages,
                    tools=list(tools) if tools is not None else None,
                    documents=list(documents) if documents is not None else None,
                    add_generation_prompt=add_generation_prompt,
                    **variables,
                )
            )
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the chat template refused the conversation: {e}") from None
        except MemoryError:  # the machine's, not the conversation's
            raise
        except Exception as e:  # the template is the checkpoint's code: any failure is its
            raise ChatTemplateError(f"the chat template failed: {type(e).__name__}: {e}") from None

    def _chosen(self, tools: Sequence[Mapping[str, Any]] | None) -> Any:
        """The compiled template for a conversation with ``tools`` (``tool_use`` when the
        checkpoint has one, else the default)."""
        name = "tool_use" if tools is not None and "tool_use" in self.named else None
        if name is None:
            if self._template is not None:
                return self._template
            raise ChatTemplateError(
                "the checkpoint has several chat templates and no default one "
                f"(named: {', '.join(sorted(self.named))})"
            )
        found = self._compiled.get(name)
        if found is None:
            found = self._compiled[name] = _compile(self.named[name])
        return found

    def __repr__(self) -> str:
        size = len(self.source) if self.source is not None else 0
        others = f", named {sorted(self.named)}" if self.named else ""
        return f"<ptexec.llm.ChatTemplate {size} chars{others}>"


# where the last message's text ends, found again in the rendering (continue_final_message);
# the space after it tells whether the template trims the end of a message's text
_END_MARK = "<|ptexec:end-of-the-final-message|>"


def _mark_the_end(messages: list[dict[str, Any]]) -> str:
    """Appends :data:`_END_MARK` and a space to the text of the last message (of its last
    text part; ``messages[-1]`` and its parts are replaced, not changed); returns that
    text. Raises :class:`ChatTemplateError` when there is no such text."""
    if messages:
        last = messages[-1]
        content = last.get("content")
        if isinstance(content, str):
            last["content"] = content + _END_MARK + " "
            return content
        if isinstance(content, list | tuple):
            parts = [dict(p) if isinstance(p, Mapping) else p for p in content]
            for part in reversed(parts):
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    text = str(part["text"])
                    part["text"] = text + _END_MARK + " "
                    last["content"] = parts
                    return text
    raise ChatTemplateError("continue_final_message: the last message has no text to continue")


def _cut_at_the_mark(rendered: str, text: str) -> str:
    """``rendered`` up to the end of the last message's ``text`` (:func:`_mark_the_end`):
    without what the template wrote after it; with the text's trailing whitespace trimmed
    where the template trims it (it took the space after the mark too)."""
    at = rendered.rfind(_END_MARK)
    if at < 0 or text.strip() not in rendered:
        raise ChatTemplateError(
            "continue_final_message: the chat template does not write the final message's "
            "text as given, so the prompt cannot end inside it"
        )
    kept = rendered[:at]
    return kept if rendered.startswith(" ", at + len(_END_MARK)) else kept.rstrip()


def _named_tokens(config: Mapping[str, Any]) -> dict[str, str | None]:
    """The special tokens a tokenizer config names, as transformers passes them to a
    template: its seven (None where one is null), a model's own (any other key ending in
    ``_token`` that names a token, e.g. ``image_token``), and those of an
    ``extra_special_tokens`` object, which win."""
    extra = config.get("extra_special_tokens")
    named: dict[str, str | None] = {}
    for entries in (config, extra if isinstance(extra, dict) else {}):
        for key, entry in entries.items():
            text = _token_text(entry)
            if key in _SPECIAL or (key.endswith("_token") and text is not None):
                named[key] = text
    return named


def _model_names(path: Path) -> dict[str, str]:
    """``bos_token`` and ``eos_token`` as a SentencePiece ``tokenizer.model`` names its BOS
    and EOS pieces ({} for any other tokenizer, or none that loads). transformers' tokenizer
    classes for such models default to those pieces when no config names them (Llama 2's
    ``<s>`` and ``</s>``, Gemma's ``<bos>`` and ``<eos>``; T5's, which has no BOS, none)."""
    from ..errors import TokenizerError
    from .tokenizer import load_tokenizer

    if path.is_dir():
        if (path / "tokenizer.json").is_file():  # the tokenizer a folder loads first
            return {}
        path = path / "tokenizer.model"
    if path.suffix == ".json" or not path.is_file():
        return {}
    try:
        tokenizer = load_tokenizer(path)
    except TokenizerError:
        return {}
    if tokenizer.kind != "SentencePiece":
        return {}
    return {
        key: tokenizer.token_bytes(token).decode("utf-8", errors="replace")
        for key, token in (("bos_token", tokenizer.bos_id), ("eos_token", tokenizer.eos_id))
        if 0 <= token < tokenizer.vocab_size
    }


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ChatTemplateError(f"cannot read the chat template {path.name} ({e})") from None


def _json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path`` ({} when there is no such file or it holds another
    kind of value)."""
    if not path.is_file():
        return {}
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ChatTemplateError(f"{path.name}: unreadable ({e})") from None
    return loaded if isinstance(loaded, dict) else {}


def _template_files(folder: Path) -> dict[str, str]:
    """The templates a checkpoint keeps in files, by name (``chat_template.jinja``:
    ``default``); transformers takes these over the config's."""
    found: dict[str, str] = {}
    main = folder / "chat_template.jinja"
    if main.is_file():
        found["default"] = _read(main)
    more = folder / "additional_chat_templates"
    if more.is_dir():
        for f in sorted(more.glob("*.jinja")):
            found[f.name.removesuffix(".jinja")] = _read(f)
    return found


def _pick(entry: Any) -> dict[str, str]:
    """``chat_template`` is one template (``default``), or a list of ``{"name",
    "template"}``."""
    if isinstance(entry, str):
        return {"default": entry}
    if isinstance(entry, list):
        return {
            e["name"]: e["template"]
            for e in entry
            if isinstance(e, dict)
            and isinstance(e.get("name"), str)
            and isinstance(e.get("template"), str)
        }
    return {}


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
