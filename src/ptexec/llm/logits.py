"""Logits processors: penalties and the hook for your own, on transformers' contract.

A logits processor is any callable ``processor(input_ids, scores) -> scores``, the contract
of transformers' ``LogitsProcessor``: ``input_ids`` is the context so far (``int64[1, seq]``,
the prompt and every token generated since, on the logits' device) and ``scores`` the next
token's raw logits (``float32[1, vocab]``); it returns the scores to sample from (it may
change them in place). A transformers ``LogitsProcessor`` works as it is.

Processors run in the order given, on the raw logits, before temperature, top-k, top-p and
min-p (the order of transformers' processors and warpers). A processor that needs to know
where the prompt ends (OpenAI's presence and frequency penalties count generated tokens only;
a grammar starts matching after the prompt) has a ``begin(prompt)`` method, called with the
context's ids when a generation starts.

Greedy decoding takes the maximum of the processed scores, so penalties and constraints
apply to it too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

import torch

__all__ = [
    "BadWords",
    "ForceToken",
    "LogitBias",
    "LogitsProcessor",
    "MinLength",
    "NoRepeatNGram",
    "PresenceFrequencyPenalty",
    "RepetitionPenalty",
    "SuppressTokens",
    "SuppressTokensAtBegin",
    "TimestampRules",
    "as_processors",
    "min_p_filter",
    "token_logprobs",
]

LogitsProcessor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``(input_ids int64[1, seq], scores float32[1, vocab]) -> scores``."""

Processors = Union[LogitsProcessor, Sequence[LogitsProcessor], None]  # noqa: UP007


def as_processors(value: Processors) -> tuple[LogitsProcessor, ...]:
    """``value`` as a tuple of processors (one callable, a sequence of them, or None).
    Raises ``TypeError`` for anything that is not callable."""
    if value is None:
        return ()
    items: Sequence[Any] = (value,) if callable(value) else value
    out = tuple(items)
    for i, p in enumerate(out):
        if not callable(p):
            raise TypeError(
                f"logits_processor[{i}] must be callable (input_ids, scores) -> scores, "
                f"got {type(p).__name__}"
            )
    return out


class RepetitionPenalty:
    """The CTRL repetition penalty (transformers' ``RepetitionPenaltyLogitsProcessor``):
    every token already in the context has its logit divided by ``penalty`` when positive
    and multiplied by it when negative. ``penalty`` > 1 discourages repetition; 1 is off."""

    def __init__(self, penalty: float) -> None:
        if not penalty > 0:  # also refuses NaN
            raise ValueError(f"repetition penalty must be > 0, got {penalty}")
        self.penalty = float(penalty)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.numel() == 0:
            return scores
        seen = torch.gather(scores, 1, input_ids)
        seen = torch.where(seen < 0, seen * self.penalty, seen / self.penalty)
        return scores.scatter(1, input_ids, seen)

    def __repr__(self) -> str:
        return f"RepetitionPenalty({self.penalty:g})"


class PresenceFrequencyPenalty:
    """OpenAI's presence and frequency penalties: the logit of each token generated ``c``
    times so far drops by ``c * frequency + (c > 0) * presence``. Only generated tokens
    count (not the prompt), as in OpenAI's API; both in [-2, 2] there, any float here."""

    def __init__(self, presence: float = 0.0, frequency: float = 0.0) -> None:
        for name, v in (("presence", presence), ("frequency", frequency)):
            if v != v:
                raise ValueError(f"{name} penalty must be a number, got {v}")
        self.presence = float(presence)
        self.frequency = float(frequency)
        self._prompt_len = 0

    def begin(self, prompt: Sequence[int]) -> None:
        """A generation starts after ``prompt``: those tokens are not counted."""
        self._prompt_len = len(prompt)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        generated = input_ids[:, self._prompt_len :]
        if generated.numel() == 0:
            return scores
        counts = torch.zeros_like(scores).scatter_add_(
            1, generated, torch.ones_like(generated, dtype=scores.dtype)
        )
        return scores - counts * self.frequency - (counts > 0).to(scores.dtype) * self.presence

    def __repr__(self) -> str:
        return f"PresenceFrequencyPenalty(presence={self.presence:g}, frequency={self.frequency:g})"


class LogitBias:
    """OpenAI's ``logit_bias``: a fixed value added to the logits of some tokens before
    sampling (token id -> bias; OpenAI takes biases in [-100, 100], where -100 bans a token
    and 100 all but forces it). Raises ``ValueError`` for a bias that is not a finite
    number or a negative id; an id beyond the vocabulary raises when the scores come."""

    def __init__(self, bias: Mapping[int, float]) -> None:
        for token, value in bias.items():
            if not isinstance(token, int) or token < 0:
                raise ValueError(f"logit bias token ids must be ints >= 0, got {token!r}")
            if not math.isfinite(value):
                raise ValueError(f"logit bias of token {token} must be finite, got {value}")
        self.bias = {int(t): float(v) for t, v in bias.items()}
        self._ids = torch.tensor(sorted(self.bias), dtype=torch.int64)
        self._values = torch.tensor([self.bias[t] for t in sorted(self.bias)])

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if not self.bias:
            return scores
        vocab = scores.shape[-1]
        if int(self._ids[-1]) >= vocab:
            raise ValueError(
                f"logit bias names token {int(self._ids[-1])}, beyond the vocabulary ({vocab})"
            )
        ids = self._ids.to(scores.device)
        values = self._values.to(device=scores.device, dtype=scores.dtype)
        out = scores.clone()
        out[..., ids] += values
        return out

    def __repr__(self) -> str:
        return f"LogitBias({self.bias})"


def _ids_list(ids: Sequence[int], what: str) -> list[int]:
    if isinstance(ids, str | bytes) or not hasattr(ids, "__iter__"):
        raise ValueError(f"{what} must be a list of token ids, got {ids!r}")
    out = []
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ValueError(f"{what} must be token ids >= 0, got {t!r}")
        out.append(int(t))
    return out


def _ids_tuple(ids: Sequence[int], what: str) -> tuple[int, ...]:
    return tuple(sorted(set(_ids_list(ids, what))))


class NoRepeatNGram:
    """No n-gram of ``size`` tokens twice in the context (a generation config's
    ``no_repeat_ngram_size``, as transformers' ``NoRepeatNGramLogitsProcessor``): a token
    that would end an n-gram the context holds already is never sampled."""

    def __init__(self, size: int) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"no_repeat_ngram_size must be an integer >= 1, got {size!r}")
        self.size = size

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        n = self.size
        ids = input_ids[0].tolist()
        if len(ids) + 1 < n:
            return scores
        head = tuple(ids[len(ids) - n + 1 :])
        banned = [
            ids[i + n - 1] for i in range(len(ids) - n + 1) if tuple(ids[i : i + n - 1]) == head
        ]
        if not banned:
            return scores
        out = scores.clone()
        out[..., [t for t in banned if t < scores.shape[-1]]] = float("-inf")
        return out

    def __repr__(self) -> str:
        return f"NoRepeatNGram({self.size})"


class BadWords:
    """Token sequences never generated (a generation config's ``bad_words_ids``, as
    transformers' ``NoBadWordsLogitsProcessor``): the last token of a sequence is not
    sampled where the context ends with the rest of it (a one-token sequence: never; a
    sequence longer than the context: not yet). A sequence that is an EOS id alone is left
    out, as transformers leaves it out."""

    def __init__(self, sequences: Sequence[Sequence[int]], eos_ids: Sequence[int] = ()) -> None:
        seqs = []
        for s in sequences:
            seq = _ids_list(s, "bad_words_ids")
            if not seq:
                raise ValueError("bad_words_ids holds an empty sequence")
            if len(seq) == 1 and seq[0] in set(eos_ids):
                continue
            seqs.append(tuple(seq))
        self.sequences = tuple(seqs)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        width = scores.shape[-1]
        n = input_ids.shape[-1]
        longest = max((len(s) for s in self.sequences), default=1)
        tail = tuple(input_ids[0, max(0, n - longest + 1) :].tolist())
        # a sequence longer than the context is not looked for (transformers skips it)
        banned = [
            s[-1]
            for s in self.sequences
            if s[-1] < width
            and len(s) <= n
            and (len(s) == 1 or tail[len(tail) - len(s) + 1 :] == s[:-1])
        ]
        if not banned:
            return scores
        out = scores.clone()
        out[..., banned] = float("-inf")
        return out

    def __repr__(self) -> str:
        return f"BadWords({[list(s) for s in self.sequences]})"


class MinLength:
    """No EOS before the context holds ``length`` tokens (a generation config's
    ``min_length``, as transformers' ``MinLengthLogitsProcessor``, whose length counts an
    encoder-decoder's decoder prompt), or before ``new`` tokens were generated after the
    prompt :meth:`begin` is told of (``min_new_tokens``)."""

    def __init__(self, eos_ids: Sequence[int], length: int = 0, new: int = 0) -> None:
        self.eos = _ids_tuple(eos_ids, "EOS ids")
        self.length = length
        self.new = new
        self._prompt = 0

    def begin(self, prompt: Sequence[int]) -> None:
        """A generation starts after ``prompt``."""
        self._prompt = len(prompt)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        n = input_ids.shape[-1]
        if n >= self.length and n - self._prompt >= self.new:
            return scores
        out = scores.clone()
        out[..., [t for t in self.eos if t < scores.shape[-1]]] = float("-inf")
        return out

    def __repr__(self) -> str:
        return f"MinLength({list(self.eos)}, length={self.length}, new={self.new})"


class ForceToken:
    """Only ``tokens`` (an id, or several) may come when the context holds ``at`` tokens
    (a generation config's ``forced_bos_token_id`` after an encoder-decoder's start token,
    or its ``forced_eos_token_id``, one id or a list, at the last step of the budget, as
    transformers forces them: each listed id's score 0, every other -inf)."""

    def __init__(self, tokens: int | Sequence[int], at: int) -> None:
        self.tokens = _ids_tuple([tokens] if isinstance(tokens, int) else tokens, "forced tokens")
        if not self.tokens:
            raise ValueError("a forced token needs at least one id")
        self.at = at

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        kept = [t for t in self.tokens if t < scores.shape[-1]]
        if input_ids.shape[-1] != self.at or not kept:
            return scores
        out = torch.full_like(scores, float("-inf"))
        out[..., kept] = 0.0
        return out

    def __repr__(self) -> str:
        return f"ForceToken({list(self.tokens)}, at={self.at})"


class SuppressTokens:
    """Tokens that are never sampled (a generation config's ``suppress_tokens``, as
    transformers' ``SuppressTokensLogitsProcessor``): their logits become -inf. Ids beyond
    the scores' width are ignored."""

    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = _ids_tuple(ids, "suppressed tokens")
        self._index: dict[tuple[torch.device, int], torch.Tensor] = {}

    def _mask(self, scores: torch.Tensor) -> torch.Tensor:
        key = (scores.device, scores.shape[-1])
        index = self._index.get(key)
        if index is None:
            kept = [t for t in self.ids if t < key[1]]
            index = self._index[key] = torch.tensor(kept, dtype=torch.int64, device=key[0])
        return index

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = scores.clone()
        out[..., self._mask(scores)] = float("-inf")
        return out

    def __repr__(self) -> str:
        return f"SuppressTokens({list(self.ids)})"


class SuppressTokensAtBegin(SuppressTokens):
    """Tokens that cannot be the first generated one (``begin_suppress_tokens``, as
    transformers' ``SuppressTokensAtBeginLogitsProcessor``; Whisper's blank and EOS). The
    first generated token is the one after the prompt :meth:`begin` is told of; with
    ``after_forced`` (a forced first token, ``forced_bos_token_id``) and a prompt of one
    token, the one after that, as transformers counts it."""

    def __init__(self, ids: Sequence[int], after_forced: bool = False) -> None:
        super().__init__(ids)
        self.after_forced = after_forced
        self._begin = -1

    def begin(self, prompt: Sequence[int]) -> None:
        """A generation starts after ``prompt``."""
        self._begin = len(prompt) + int(self.after_forced and len(prompt) == 1)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[-1] != self._begin:
            return scores
        return super().__call__(input_ids, scores)

    def __repr__(self) -> str:
        return f"SuppressTokensAtBegin({list(self.ids)})"


class TimestampRules:
    """Whisper's rules for timestamp tokens (those from ``timestamp_begin``, one per 20 ms),
    as transformers' ``WhisperTimeStampLogitsProcessor`` applies them, so that the output
    splits into well-formed segments:

    - ``<|notimestamps|>`` is never sampled;
    - the first generated token is a timestamp, at most ``max_initial_index`` steps in;
    - timestamps come in pairs (a segment's end, then the next one's start): after two
      timestamps comes text, after one a timestamp or a token from ``eos`` on;
    - timestamps never decrease, and a pair's second one is later than the first;
    - when the timestamps together are likelier than any one text token, a timestamp is
      sampled (off with ``from_logprob=False``).

    The generated tokens are those after the prompt :meth:`begin` is told of."""

    def __init__(
        self,
        timestamp_begin: int,
        no_timestamps: int,
        eos: int,
        max_initial_index: int | None = None,
        *,
        from_logprob: bool = True,
    ) -> None:
        self.timestamp_begin = int(timestamp_begin)
        self.no_timestamps = int(no_timestamps)
        self.eos = int(eos)
        self.max_initial_index = None if max_initial_index is None else int(max_initial_index)
        self.from_logprob = bool(from_logprob)
        self._begin = 0

    def begin(self, prompt: Sequence[int]) -> None:
        """A generation starts after ``prompt``."""
        self._begin = len(prompt)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        ts = self.timestamp_begin
        banned = float("-inf")
        out = scores.clone()
        out[..., self.no_timestamps] = banned
        generated = input_ids[0, self._begin :].tolist()
        last = len(generated) >= 1 and generated[-1] >= ts
        before_last = len(generated) < 2 or generated[-2] >= ts
        if last:
            if before_last:
                out[..., ts:] = banned  # a pair is complete: text next
            else:
                out[..., : self.eos] = banned  # a segment's end: its pair, or the end
        stamps = [t for t in generated if t >= ts]
        if stamps:
            floor = stamps[-1] if last and not before_last else stamps[-1] + 1
            out[..., ts:floor] = banned
        if input_ids.shape[-1] == self._begin:
            out[..., :ts] = banned
            if self.max_initial_index is not None:
                out[..., ts + self.max_initial_index + 1 :] = banned
        if self.from_logprob:
            logprobs = torch.log_softmax(out.float(), dim=-1)
            if logprobs[..., ts:].logsumexp(dim=-1).max() > logprobs[..., :ts].max():
                out[..., :ts] = banned
        return out

    def __repr__(self) -> str:
        return (
            f"TimestampRules(timestamp_begin={self.timestamp_begin}, "
            f"no_timestamps={self.no_timestamps}, eos={self.eos}, "
            f"max_initial_index={self.max_initial_index})"
        )


def min_p_filter(probs: torch.Tensor, min_p: float) -> torch.Tensor:
    """Min-p sampling on a probability vector: tokens less likely than ``min_p`` times the
    likeliest are dropped and the rest renormalised (transformers' ``MinPLogitsWarper``,
    which applies after temperature, top-k and top-p; the likeliest token always stays)."""
    if min_p <= 0.0:
        return probs
    kept = probs.masked_fill(probs < min_p * probs.max(), 0.0)
    return kept / kept.sum()


def token_logprobs(
    logits: torch.Tensor, token: int, top: int = 0
) -> tuple[float, list[tuple[int, float]]]:
    """The log-probability of ``token`` under the model's distribution ``softmax(logits)``
    (one row of raw logits, any float dtype, computed in float32), and the ``top`` likeliest
    ids with theirs, likeliest first (ties: lower id first)."""
    row = torch.log_softmax(logits.reshape(-1).float(), dim=0)
    chosen = float(row[token])
    if top <= 0:
        return chosen, []
    k = min(int(top), row.numel())
    # every id scoring at least the k-th value (topk picks among ties at the cut as it
    # likes), then the k first by score and id
    kth = torch.topk(row, k).values[-1]
    ids = torch.nonzero(row >= kth).reshape(-1)
    pairs = zip(ids.tolist(), row[ids].tolist(), strict=True)
    ranked = sorted(pairs, key=lambda p: (-p[1], p[0]))[:k]
    return chosen, [(int(i), float(v)) for i, v in ranked]
