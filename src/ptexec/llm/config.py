"""``GenerationConfig`` and ``Stats``, with the names and rules of ExecuTorch's runner.

ExecuTorch's fields keep their names, defaults and meaning (``echo``, ``max_new_tokens``,
``warming``, ``seq_len``, ``temperature``, ``num_bos``, ``num_eos``, ``ignore_eos``).
ptexec adds sampling and stopping controls ExecuTorch's runner does not have: ``top_p``
(ExecuTorch samples with a fixed 0.9), ``top_k``, ``seed`` and ``stop`` (stop strings).

Stats times are milliseconds since an arbitrary origin (a monotonic clock), as floats: one
step of a small program takes well under a millisecond, so whole milliseconds would make
the rates meaningless.
"""

from __future__ import annotations

import json
import math
import numbers
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import ConfigTypeError, ConfigValueError

__all__ = ["GenerationConfig", "Stats", "check_setting"]

_SEED_END = 1 << 64  # torch's generators take seeds in [0, 2**64)


def _kind(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


def _flag(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigTypeError(field, f"{field} must be True or False, got {_kind(value)}")
    return value


def _int(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigTypeError(field, f"{field} must be an int, got {_kind(value)}")
    return int(value)


def _real(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigTypeError(field, f"{field} must be a number, got {_kind(value)}")
    x = float(value)
    if not math.isfinite(x):
        raise ConfigValueError(field, f"{field} must be finite, got {x}")
    return x


def _limit(field: str, value: Any) -> int:
    n = _int(field, value)
    if n != -1 and n < 1:
        raise ConfigValueError(field, f"{field} must be -1 (no limit) or at least 1, got {n}")
    return n


def _count(field: str, value: Any) -> int:
    n = _int(field, value)
    if n < 0:
        raise ConfigValueError(field, f"{field} must be >= 0, got {n}")
    return n


def _temperature(field: str, value: Any) -> float:
    x = _real(field, value)
    if x < 0:
        raise ConfigValueError(field, f"{field} must be >= 0 (0 is greedy), got {x:g}")
    return x


def _top_p(field: str, value: Any) -> float:
    x = _real(field, value)
    if not 0.0 < x <= 1.0:
        raise ConfigValueError(field, f"{field} must be in (0, 1] (1: off), got {x:g}")
    return x


def _seed(field: str, value: Any) -> int | None:
    if value is None:
        return None
    n = _int(field, value)
    if not 0 <= n < _SEED_END:
        raise ConfigValueError(
            field, f"{field} must be None (random) or an int in [0, 2**64), got {n}"
        )
    return n


def _stop(field: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):  # one stop string, not its characters
        value = (value,)
    elif not isinstance(value, Iterable) or isinstance(value, bytes | bytearray):
        raise ConfigTypeError(
            field, f"{field} must be a string or a list of strings, got {_kind(value)}"
        )
    stops = tuple(value)
    for s in stops:
        if not isinstance(s, str):
            raise ConfigTypeError(field, f"{field} strings must be str, got {_kind(s)}")
        if not s:
            raise ConfigValueError(field, f"{field} strings must not be empty")
    return stops


def _min_p(field: str, value: Any) -> float:
    x = _real(field, value)
    if not 0.0 <= x <= 1.0:
        raise ConfigValueError(field, f"{field} must be in [0, 1] (0: off), got {x:g}")
    return x


def _processors(field: str, value: Any) -> Any:
    if value is None or callable(value):
        return value
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ConfigTypeError(
            field, f"{field} must be a callable (input_ids, scores) -> scores or a list of them"
        )
    items = tuple(value)
    for i, item in enumerate(items):
        if not callable(item):
            raise ConfigTypeError(field, f"{field}[{i}] must be callable, got {_kind(item)}")
    return items


# Every field's rule, in one place: the setters, the runner and the sampler use these.
_RULES: dict[str, Callable[[str, Any], Any]] = {
    "echo": _flag,
    "max_new_tokens": _limit,
    "warming": _flag,
    "seq_len": _limit,
    "temperature": _temperature,
    "num_bos": _count,
    "num_eos": _count,
    "ignore_eos": _flag,
    "top_p": _top_p,
    "top_k": _count,
    "seed": _seed,
    "stop": _stop,
    "min_p": _min_p,
    "logits_processor": _processors,
}


def check_setting(field: str, value: Any) -> Any:
    """``value`` as the :class:`GenerationConfig` field ``field`` holds it (a str ``stop``
    becomes a one-string tuple, numpy numbers become Python's); raises
    :class:`~ptexec.errors.ConfigTypeError` or :class:`~ptexec.errors.ConfigValueError`
    naming the field."""
    return _RULES[field](field, value)


class GenerationConfig:
    """How one ``generate`` call runs. ExecuTorch's seven fields may come by position too,
    in its bindings' order (``echo, max_new_tokens, warming, seq_len, temperature, num_bos,
    num_eos``); ptexec's additions by keyword only.

    Every field is checked when it is set, in the constructor or later
    (``config.temperature = 0.5``): a wrong type raises
    :class:`~ptexec.errors.ConfigTypeError` (a ``TypeError``), a value out of range
    :class:`~ptexec.errors.ConfigValueError` (a ``ValueError``), each naming the field.
    """

    __slots__ = tuple(_RULES)

    echo: bool
    """Pass the prompt to the token callback before the generated text."""
    max_new_tokens: int
    """Most tokens to generate (-1: as many as the context allows; else at least 1)."""
    warming: bool
    """A warm-up run: nothing is printed."""
    seq_len: int
    """Most tokens in the context, prompt included (-1: the program's context)."""
    temperature: float
    """Sampling temperature, finite and >= 0; 0 is greedy."""
    num_bos: int
    """BOS tokens to put before the prompt."""
    num_eos: int
    """EOS tokens to put after the prompt."""
    ignore_eos: bool
    """Keep generating past an EOS token."""
    top_p: float
    """Nucleus sampling, in (0, 1]: sample from the most likely tokens holding this mass."""
    top_k: int
    """Sample from the ``top_k`` most likely tokens only (0: all)."""
    seed: int | None
    """Seed of the sampler's generator, in [0, 2**64) (None: a fresh random seed per call)."""
    stop: tuple[str, ...]
    """Stop strings: generation ends when the text contains one (it is not emitted). A
    string is one stop string; a list or tuple holds several."""
    min_p: float
    """Min-p sampling, in [0, 1]: drop tokens less likely than ``min_p`` times the
    likeliest (0: off)."""
    logits_processor: Any
    """A processor or a list of them (:mod:`ptexec.llm.logits`), run on the raw logits
    (None: none)."""

    def __init__(
        self,
        echo: bool = True,
        max_new_tokens: int = -1,
        warming: bool = False,
        seq_len: int = -1,
        temperature: float = 0.8,
        num_bos: int = 0,
        num_eos: int = 0,
        *,
        ignore_eos: bool = False,
        top_p: float = 0.9,
        top_k: int = 0,
        seed: int | None = None,
        stop: str | Iterable[str] | None = (),
        min_p: float = 0.0,
        logits_processor: Any = None,
    ) -> None:
        self.echo = echo
        self.max_new_tokens = max_new_tokens
        self.warming = warming
        self.seq_len = seq_len
        self.temperature = temperature
        self.num_bos = num_bos
        self.num_eos = num_eos
        self.ignore_eos = ignore_eos
        self.top_p = top_p
        self.top_k = top_k
        self.seed = seed
        self.stop = stop  # type: ignore[assignment]  # normalised to a tuple by the rule
        self.min_p = min_p
        self.logits_processor = logits_processor

    def __setattr__(self, name: str, value: Any) -> None:
        rule = _RULES.get(name)
        object.__setattr__(self, name, value if rule is None else rule(name, value))

    def resolve_max_new_tokens(self, max_context_len: int, num_tokens_occupied: int) -> int:
        """Tokens to generate when ``num_tokens_occupied`` context positions are in use:
        bounded by ``max_new_tokens``, by ``seq_len`` and by the context; never negative."""
        if self.seq_len == -1 and self.max_new_tokens == -1:
            result = max_context_len - num_tokens_occupied
        elif self.seq_len == -1:
            result = min(self.max_new_tokens, max_context_len - num_tokens_occupied)
        elif self.max_new_tokens == -1:
            result = min(self.seq_len, max_context_len) - num_tokens_occupied
        else:
            result = min(
                min(self.seq_len, max_context_len) - num_tokens_occupied, self.max_new_tokens
            )
        return max(0, result)

    def __repr__(self) -> str:
        fields = (
            f"max_new_tokens={self.max_new_tokens}, seq_len={self.seq_len}, "
            f"temperature={self.temperature:g}, echo={self.echo}, warming={self.warming}, "
            f"num_bos={self.num_bos}, num_eos={self.num_eos}"
        )
        extra = []
        if self.ignore_eos:
            extra.append("ignore_eos=True")
        if self.top_p != 0.9:
            extra.append(f"top_p={self.top_p:g}")
        if self.top_k:
            extra.append(f"top_k={self.top_k}")
        if self.seed is not None:
            extra.append(f"seed={self.seed}")
        if self.stop:
            extra.append(f"stop={list(self.stop)!r}")
        return f"GenerationConfig({', '.join([fields, *extra])})"


def _now_ms() -> float:
    return time.perf_counter_ns() / 1e6


class Stats:
    """Timings and counts of the last generation (milliseconds; see the module docstring)."""

    SCALING_FACTOR_UNITS_PER_SECOND = 1000

    def __init__(self) -> None:
        self.model_load_start_ms = 0.0
        self.model_load_end_ms = 0.0
        self.reset(all_stats=False)
        self._sampling_start = 0.0

    def reset(self, all_stats: bool = False) -> None:
        """Zero the generation's figures (and the load times too with ``all_stats``)."""
        if all_stats:
            self.model_load_start_ms = 0.0
            self.model_load_end_ms = 0.0
        self.inference_start_ms = 0.0
        self.token_encode_end_ms = 0.0
        self.model_execution_start_ms = 0.0
        self.model_execution_end_ms = 0.0
        self.prompt_eval_end_ms = 0.0
        self.first_token_ms = 0.0
        self.inference_end_ms = 0.0
        self.aggregate_sampling_time_ms = 0.0
        self.aggregate_model_execution_time_ms = 0.0
        self.num_prompt_tokens = 0
        self.num_generated_tokens = 0

    def on_sampling_begin(self) -> None:
        self._sampling_start = _now_ms()

    def on_sampling_end(self) -> None:
        self.aggregate_sampling_time_ms += _now_ms() - self._sampling_start

    # -- derived figures (ptexec) ----------------------------------------------------------
    @property
    def prefill_ms(self) -> float:
        """Time to evaluate the prompt (encoding excluded)."""
        start = self.token_encode_end_ms or self.inference_start_ms
        return max(0.0, self.prompt_eval_end_ms - start)

    @property
    def time_to_first_token_ms(self) -> float:
        """From the start of the call to the first generated token."""
        return max(0.0, self.first_token_ms - self.inference_start_ms)

    @property
    def decode_ms(self) -> float:
        """Time generating after the first token."""
        return max(0.0, self.inference_end_ms - self.prompt_eval_end_ms)

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens after the first, per second of decoding (0 when none)."""
        decoded = self.num_generated_tokens - 1
        return decoded * 1000.0 / self.decode_ms if decoded > 0 and self.decode_ms > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.num_prompt_tokens,
            "generated_tokens": self.num_generated_tokens,
            "model_load_start_ms": self.model_load_start_ms,
            "model_load_end_ms": self.model_load_end_ms,
            "inference_start_ms": self.inference_start_ms,
            "token_encode_end_ms": self.token_encode_end_ms,
            "model_execution_start_ms": self.model_execution_start_ms,
            "model_execution_end_ms": self.model_execution_end_ms,
            "inference_end_ms": self.inference_end_ms,
            "prompt_eval_end_ms": self.prompt_eval_end_ms,
            "first_token_ms": self.first_token_ms,
            "aggregate_sampling_time_ms": self.aggregate_sampling_time_ms,
            "aggregate_model_execution_time_ms": self.aggregate_model_execution_time_ms,
            "SCALING_FACTOR_UNITS_PER_SECOND": self.SCALING_FACTOR_UNITS_PER_SECOND,
        }

    def to_json_string(self) -> str:
        """The figures as one JSON object (ExecuTorch's keys, with its rates where their
        spans are not empty: ``prefill_token_per_sec``, the prompt's tokens per second
        from the start of the call to the prompt's end, and ``decode_token_per_sec``,
        the tokens after the first per second of decoding)."""
        figures = self.as_dict()
        per_second = self.SCALING_FACTOR_UNITS_PER_SECOND
        prefill = self.prompt_eval_end_ms - self.inference_start_ms
        if prefill > 0:
            figures["prefill_token_per_sec"] = self.num_prompt_tokens / prefill * per_second
        if self.decode_ms > 0:
            figures["decode_token_per_sec"] = self.tokens_per_second
        return json.dumps(figures)

    def report(self) -> str:
        """A short human summary: prompt and generated tokens, prefill, first token, rate."""
        return (
            f"prompt {self.num_prompt_tokens} tokens, generated {self.num_generated_tokens}; "
            f"prefill {self.prefill_ms:.2f} ms, first token after "
            f"{self.time_to_first_token_ms:.2f} ms, {self.tokens_per_second:.1f} tokens/s"
        )

    def __repr__(self) -> str:
        return (
            f"Stats(num_prompt_tokens={self.num_prompt_tokens}, "
            f"num_generated_tokens={self.num_generated_tokens}, "
            f"prefill_ms={self.prefill_ms:.3f}, tokens_per_second={self.tokens_per_second:.1f})"
        )
