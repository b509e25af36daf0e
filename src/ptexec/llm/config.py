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
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["GenerationConfig", "Stats"]


class GenerationConfig:
    """How one ``generate`` call runs (keyword arguments only, as in ExecuTorch)."""

    def __init__(
        self,
        *,
        echo: bool = True,
        max_new_tokens: int = -1,
        warming: bool = False,
        seq_len: int = -1,
        temperature: float = 0.8,
        num_bos: int = 0,
        num_eos: int = 0,
        ignore_eos: bool = False,
        top_p: float = 0.9,
        top_k: int = 0,
        seed: int | None = None,
        stop: Sequence[str] = (),
        min_p: float = 0.0,
        logits_processor: Any = None,
    ) -> None:
        self.echo = echo
        """Pass the prompt to the token callback before the generated text."""
        self.max_new_tokens = max_new_tokens
        """Most tokens to generate (-1: as many as the context allows)."""
        self.warming = warming
        """A warm-up run: nothing is printed."""
        self.seq_len = seq_len
        """Most tokens in the context, prompt included (-1: the program's context)."""
        self.temperature = temperature
        """Sampling temperature; 0 is greedy."""
        self.num_bos = num_bos
        """BOS tokens to put before the prompt."""
        self.num_eos = num_eos
        """EOS tokens to put after the prompt."""
        self.ignore_eos = ignore_eos
        """Keep generating past an EOS token."""
        self.top_p = top_p
        """Nucleus sampling: sample from the most likely tokens holding this much mass."""
        self.top_k = top_k
        """Sample from the ``top_k`` most likely tokens only (0: all)."""
        self.seed = seed
        """Seed of the sampler's generator (None: a fresh random seed per call)."""
        self.stop = tuple(stop)
        """Stop strings: generation ends when the text contains one (it is not emitted)."""
        self.min_p = min_p
        """Min-p sampling: drop tokens less likely than ``min_p`` times the likeliest (0: off)."""
        self.logits_processor = logits_processor
        """A processor or a list of them (:mod:`ptexec.llm.logits`), run on the raw logits."""

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
        """The figures as one JSON object (ExecuTorch's keys)."""
        return json.dumps(self.as_dict())

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
