"""Constrained decoding: JSON schemas, regular expressions and grammars as token masks.

A :class:`Grammar` is a logits processor (see :mod:`ptexec.llm.logits`) that lets through
only the tokens that keep the text a prefix of something the grammar accepts, and EOS only
once the text is complete; so every generation that ends by EOS matches. It is made for one
tokenizer's vocabulary (:class:`Vocabulary`, built once and shared), from a JSON schema, any
JSON object, a regular expression or a Lark grammar::

    vocab = Vocabulary.of(runner.tokenizer, runner.vocab_size, runner.eos_ids)
    config = GenerationConfig(logits_processor=Grammar.json_schema(vocab, schema))

The masks come from llguidance (``pip install 'ptexec[serve]'``), given the tokenizer's own
``tokenizer.json``; only Hugging Face tokenizers are supported. A grammar is state for one
generation at a time: :meth:`Grammar.begin` (called by the sampler when a generation starts)
starts matching afresh.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from ..errors import GenerationError
from .tokenizer import HuggingFaceTokenizer, Tokenizer

__all__ = ["Grammar", "GrammarError", "Vocabulary"]


class GrammarError(GenerationError, ValueError):
    """A schema, regular expression or grammar that cannot be compiled (a ``ValueError``)."""


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise GenerationError(
            "constrained decoding needs the 'llguidance' package (pip install 'ptexec[serve]')"
        ) from e
    return llguidance


class Vocabulary:
    """A tokenizer's tokens as the mask library sees them (building it reads the whole
    vocabulary once; share it between grammars). ``size`` is the logits' width."""

    def __init__(
        self, impl: Any, size: int, text: torch.Tensor | None = None, eos: Iterable[int] = ()
    ) -> None:
        self._impl = impl
        self.size = size
        self.text = text if text is not None else torch.ones(size, dtype=torch.bool)
        """Which ids are text (not control tokens), a bool vector of ``size``."""
        self.eos = frozenset(int(i) for i in eos)
        """The ids that end a generation."""

    @classmethod
    def of(cls, tokenizer: Tokenizer, size: int, eos_ids: Iterable[int]) -> Vocabulary:
        """The vocabulary of ``tokenizer`` for logits of width ``size``, ending at ``eos_ids``."""
        if not isinstance(tokenizer, HuggingFaceTokenizer):
            raise GenerationError(
                f"constrained decoding needs a Hugging Face tokenizer.json; this is a "
                f"{tokenizer.kind} tokenizer"
            )
        eos = sorted(int(i) for i in eos_ids if 0 <= int(i) < size)
        if not eos:
            raise GenerationError("constrained decoding needs an EOS token in the vocabulary")
        ll = _llguidance()
        try:
            impl = ll.LLTokenizer(tokenizer.to_json(), n_vocab=size, eos_token=eos)
        except Exception as e:
            raise GenerationError(f"the mask library cannot read this tokenizer ({e})") from e
        text = torch.tensor([not tokenizer.is_special(i) for i in range(size)], dtype=torch.bool)
        return cls(impl, size, text, eos)


def _first_line(text: str | None) -> str:
    """The first line of the matcher's error (the rest is its state: long, and of no use
    to a client)."""
    return (text or "").strip().splitlines()[0][:300] if text and text.strip() else ""


class Grammar:
    """Masks the logits to what ``grammar`` (llguidance's grammar text) allows next.

    Make one with :meth:`json_schema`, :meth:`json_object`, :meth:`regex` or :meth:`lark`;
    an invalid one raises :class:`GrammarError`. As a processor it consumes the tokens
    sampled since its last call (the context past the prompt) and masks the next."""

    def __init__(self, vocabulary: Vocabulary, grammar: str, what: str = "grammar") -> None:
        ll = _llguidance()
        error = ll.LLMatcher.validate_grammar(grammar, vocabulary._impl)
        if error:
            raise GrammarError(f"invalid {what}: {error}")
        self.vocabulary = vocabulary
        self.grammar = grammar
        self._matcher = ll.LLMatcher(vocabulary._impl, grammar, log_level=0)
        self._prompt_len = 0
        self._consumed = 0
        first = self.allowed()
        if (
            not self._matcher.is_accepting()
            and not (first & vocabulary.text).any()
            and not self._a_way_on(first.nonzero().flatten().tolist())
        ):
            # (the mask library lets a control token stand for bytes no token holds)
            raise GrammarError(
                f"no token of the vocabulary can begin text of this {what}: the tokenizer "
                "cannot write its first characters"
            )

    # -- construction --------------------------------------------------------------------
    @classmethod
    def json_schema(cls, vocabulary: Vocabulary, schema: dict[str, Any] | str) -> Grammar:
        """Text that is JSON valid against ``schema`` (compact: no free whitespace)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise GrammarError(f"the JSON schema is not JSON ({e})") from None
        if not isinstance(schema, dict):
            raise GrammarError(f"a JSON schema is an object, got {type(schema).__name__}")
        ll = _llguidance()
        try:
            grammar = ll.LLMatcher.grammar_from_json_schema(
                schema, overrides={"whitespace_flexible": False}
            )
        except (ValueError, TypeError) as e:
            raise GrammarError(f"invalid JSON schema: {e}") from None
        return cls(vocabulary, grammar, "JSON schema")

    @classmethod
    def json_object(cls, vocabulary: Vocabulary) -> Grammar:
        """Any JSON object (OpenAI's ``response_format: {"type": "json_object"}``)."""
        return cls.json_schema(vocabulary, {"type": "object"})

    @classmethod
    def regex(cls, vocabulary: Vocabulary, pattern: str) -> Grammar:
        """Text that matches the regular expression ``pattern`` as a whole."""
        return cls(vocabulary, _llguidance().LLMatcher.grammar_from_regex(pattern), "regex")

    @classmethod
    def lark(cls, vocabulary: Vocabulary, grammar: str) -> Grammar:
        """Text of the Lark grammar ``grammar`` (its ``start`` rule)."""
        return cls(vocabulary, _llguidance().LLMatcher.grammar_from_lark(grammar), "grammar")

    # -- the processor -------------------------------------------------------------------
    def begin(self, prompt: Sequence[int]) -> None:
        """Start matching afresh after ``prompt``."""
        self._matcher.reset()
        self._prompt_len = len(prompt)
        self._consumed = 0

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        new = input_ids[0, self._prompt_len + self._consumed :].tolist()
        for token in new:
            if not self._matcher.consume_token(int(token)):
                raise GrammarError(
                    f"token {token} does not continue the grammar "
                    f"({_first_line(self._matcher.get_error()) or 'rejected'})"
                )
            self._consumed += 1
        if self._matcher.is_error():  # (a schema the matcher cannot follow, e.g. recursive)
            raise GrammarError(f"the grammar failed: {_first_line(self._matcher.get_error())}")
        allowed = self.allowed()
        if (
            not self._matcher.is_accepting()
            and not bool((allowed & self.vocabulary.text).any())
            and not self._a_way_on(allowed.nonzero().flatten().tolist())
        ):
            # the grammar needs text next that no token of this vocabulary writes (a
            # character it lacks): the mask lets through only tokens standing for the
            # missing bytes, which the grammar refuses once sampled (a special token the
            # grammar names, or EOS it takes, is a way on)
            raise GrammarError(
                "the tokenizer cannot write what the grammar needs next, after "
                f"{self._consumed} generated token(s): its vocabulary lacks the characters"
            )
        allowed = allowed.to(scores.device)
        width = scores.shape[-1]
        if width > allowed.numel():  # logits wider than the vocabulary: the rest is masked
            allowed = torch.cat([allowed, allowed.new_zeros(width - allowed.numel())])
        return scores.masked_fill(~allowed[:width].reshape(1, -1), float("-inf"))

    def _a_way_on(self, ids: Sequence[int]) -> bool:
        """Whether one of ``ids`` (control tokens the mask lets through) continues the
        grammar: EOS, or a special token the grammar names."""
        return any(t in self.vocabulary.eos or self._matcher.validate_tokens([t]) == 1 for t in ids)

    def allowed(self) -> torch.Tensor:
        """Which tokens may come next (a bool vector of the vocabulary's size, on the CPU)."""
        bits = torch.frombuffer(bytearray(self._matcher.compute_bitmask()), dtype=torch.uint8)
        shifts = torch.arange(8, dtype=torch.uint8)
        mask = ((bits.reshape(-1, 1) >> shifts) & 1).reshape(-1).bool()
        return mask[: self.vocabulary.size]

    @property
    def accepting(self) -> bool:
        """Whether the text so far is complete (the grammar accepts it)."""
        return bool(self._matcher.is_accepting())

    def __repr__(self) -> str:
        return f"<ptexec.llm.Grammar over {self.vocabulary.size} tokens>"
