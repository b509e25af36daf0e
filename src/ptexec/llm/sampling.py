"""Choosing the next token from a row of logits.

:class:`Sampler` does greedy decoding (temperature 0), or samples from
``softmax(logits / temperature)`` restricted to the ``top_k`` most likely tokens and to the
smallest set whose probability reaches ``top_p`` (nucleus sampling), with its own seeded
generator so a seed reproduces a generation. Before that, logits processors
(:mod:`ptexec.llm.logits`: penalties, grammar constraints, your own) change the raw logits,
and min-p sampling drops tokens far less likely than the likeliest, as transformers orders
them.

The rule for devices: every step runs on the logits' device, and only the chosen id (one
integer) leaves it. On CUDA the logits are never copied to the host.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import GenerationError
from .config import check_setting
from .logits import LogitsProcessor, min_p_filter

__all__ = ["GREEDY_BELOW", "Sampler"]

GREEDY_BELOW = 1e-5
"""Temperatures below this are greedy decoding (vLLM's rule): dividing the scores by a
tinier one overflows float32 (the limit of the distribution is the likeliest token)."""


class Sampler:
    """Greedy or temperature / top-k / top-p sampling with a seed.

    ``temperature == 0`` is greedy (the first maximum), as is any temperature below
    :data:`GREEDY_BELOW`. ``top_k == 0`` and ``top_p == 1``
    disable those filters; ``min_p`` in [0, 1] (0: off) applies after them. ``processors``
    run on the raw logits first (see :mod:`ptexec.llm.logits`); they see the context given
    to :meth:`begin` and every token sampled since. ``seed=None`` draws from a
    nondeterministic seed. The settings follow :class:`~ptexec.llm.GenerationConfig`'s
    rules (a NaN, infinite or negative temperature, a ``top_p`` outside (0, 1], a
    ``min_p`` outside [0, 1], a negative ``top_k`` or a seed outside [0, 2**64) raise
    :class:`~ptexec.errors.ConfigValueError`; a wrong type
    :class:`~ptexec.errors.ConfigTypeError`).
    """

    def __init__(
        self,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        *,
        min_p: float = 0.0,
        processors: Sequence[LogitsProcessor] = (),
    ) -> None:
        self.temperature: float = check_setting("temperature", temperature)
        self.top_p: float = check_setting("top_p", top_p)
        self.top_k: int = check_setting("top_k", top_k)
        self.seed: int | None = check_setting("seed", seed)
        self.min_p: float = check_setting("min_p", min_p)
        self.processors = tuple(processors)
        self._context: list[int] = []
        self._generators: dict[torch.device, torch.Generator] = {}
        self.scores: torch.Tensor | None = None
        """The row of scores the last :meth:`sample` drew from (the processors' output,
        before temperature and the filters)."""

    @property
    def greedy(self) -> bool:
        """Whether the likeliest token is taken: a temperature below
        :data:`GREEDY_BELOW` (0 included), whose division would overflow the scores."""
        return self.temperature < GREEDY_BELOW

    def begin(self, context: Sequence[int]) -> None:
        """A generation starts after ``context`` (the ids in the model's context, prompt
        included): processors see them, and those with a ``begin`` method are told."""
        self._context = [int(t) for t in context]
        for p in self.processors:
            hook = getattr(p, "begin", None)
            if callable(hook):
                hook(list(self._context))

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """The processors' scores for one row of logits (``[vocab]``, float32)."""
        scores = logits.reshape(1, -1).float()
        ids = torch.tensor([self._context], dtype=torch.int64, device=scores.device)
        for p in self.processors:
            scores = p(ids, scores)
        return scores.reshape(-1)

    def _generator(self, device: torch.device) -> torch.Generator:
        g = self._generators.get(device)
        if g is None:
            g = torch.Generator(device=device)
            if self.seed is None:
                g.seed()
            else:
                g.manual_seed(self.seed if device.type != "cpu" else cpu_seed(self.seed))
            self._generators[device] = g
        return g

    def distribution(self, logits: torch.Tensor) -> torch.Tensor:
        """The probabilities sampling draws from (float32, on the logits' device)."""
        x = logits.reshape(-1).float()
        if self.greedy:
            p = torch.zeros_like(x)
            p[x.argmax()] = 1.0
            return p
        x = x / self.temperature
        vocab = x.numel()
        if 0 < self.top_k < vocab:
            kth = torch.topk(x, self.top_k).values[-1]
            x = x.masked_fill(x < kth, float("-inf"))
        if self.top_p < 1.0:
            # as transformers' TopPLogitsWarper computes it (the same operations, so the
            # same tokens at the boundary and among ties): drop the least likely tokens
            # whose mass stays within 1 - top_p, keeping the likeliest
            row = x.reshape(1, -1)
            sorted_x, order = torch.sort(row, descending=False)
            mass = sorted_x.softmax(dim=-1).cumsum(dim=-1)
            drop = mass <= (1 - self.top_p)
            drop[..., -1:] = False
            x = row.masked_fill(drop.scatter(1, order, drop), float("-inf")).reshape(-1)
        probs = torch.softmax(x, dim=0)
        return min_p_filter(probs, self.min_p)

    def sample(self, logits: torch.Tensor) -> int:
        """The next token for ``logits`` (one row ``[vocab]``, or any shape with one row of
        the vocabulary last: the last row is used)."""
        row = logits.reshape(-1, logits.shape[-1])[-1]
        if self.processors:
            row = self.process(row)
        self.scores = row
        # a row holding NaN (its maximum then) or -inf everywhere has no token to give:
        # found on the device and read back with the token (-1), one integer as ever
        best, at = row.max(0)  # the first maximum
        unusable = ~(best > float("-inf"))
        if self.greedy:
            choice = at
        else:
            # on CUDA a draw from NaN probabilities stops the device (a kernel assertion):
            # such a row is replaced by a usable one there; torch's CPU draw refuses it
            usable = row if row.is_cpu else torch.where(unusable, torch.zeros_like(row), row)
            try:
                probs = self.distribution(usable)
                drawn = torch.multinomial(probs, 1, generator=self._generator(probs.device))
            except RuntimeError:
                if not bool(row.max() > float("-inf")):
                    raise GenerationError(_unusable(row)) from None
                raise
            choice = drawn.reshape(())
        token = int(torch.where(unusable, -1, choice))
        if token < 0:
            raise GenerationError(_unusable(row))
        if self.processors:
            self._context.append(token)
        return token


_MASK64 = (1 << 64) - 1


def cpu_seed(seed: int) -> int:
    """The seed a CPU generator is given for ``seed`` (in [0, 2**64)). torch's CPU generator
    keeps only the low 32 bits of a seed, so seeds that differ above them would draw the
    same numbers: those (every seed from 2**32 up) are mixed down to 32 bits (SplitMix64's
    finaliser) instead. Seeds below 2**32 are used as they are."""
    if seed < 1 << 32:
        return seed
    z = (seed + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    z ^= z >> 31
    return (z ^ (z >> 32)) & 0xFFFFFFFF


def _unusable(row: torch.Tensor) -> str:
    """Why no token can be chosen from ``row`` (it holds NaN, or only -inf)."""
    bad = int(torch.isnan(row).sum())
    if bad:
        return (
            f"the scores to choose the next token from hold {bad} NaN value(s) of "
            f"{row.numel()} (the program's logits, or a logits processor, computed NaN)"
        )
    return (
        f"every one of the {row.numel()} tokens has a score of -inf (the logits processors "
        "masked the whole vocabulary): no token can be chosen"
    )
