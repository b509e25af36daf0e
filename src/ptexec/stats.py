"""Tensors in numbers: summaries (shape, range, mean, NaN/Inf counts) and errors against a
reference, as traces and their tables report them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from .dtypes import dtype_name

__all__ = ["RefError", "TensorStats", "compare", "short_number", "summarize"]


@dataclass(frozen=True, slots=True)
class TensorStats:
    """A tensor in numbers: shape, dtype, device, and min/max/mean over its finite
    elements (None when it has none), with its NaN and Inf counts."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: str
    min: float | None
    max: float | None
    mean: float | None
    nan: int = 0
    inf: int = 0

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def finite(self) -> bool:
        return not self.nan and not self.inf

    def describe(self) -> str:
        return f"{dtype_name(self.dtype)}[{', '.join(str(s) for s in self.shape)}]"

    def __str__(self) -> str:
        text = f"{self.describe()} on {self.device}"
        if self.min is not None:
            text += f"  min {short_number(self.min)}  max {short_number(self.max)}  mean {short_number(self.mean)}"
        if self.nan:
            text += f"  NaN {self.nan}"
        if self.inf:
            text += f"  Inf {self.inf}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "shape": list(self.shape),
            "dtype": dtype_name(self.dtype),
            "device": self.device,
            "min": self.min,
            "max": self.max,
            "mean": self.mean,
            "nan": self.nan,
            "inf": self.inf,
        }


def short_number(x: float | None) -> str:
    """``x`` for a table: an integer (an integer tensor's min or max) in full, a float
    to four significant digits, None as ``-``."""
    if x is None:
        return "-"
    if isinstance(x, int):  # 128000 and 128001 are two token ids, not 1.28e+05 twice
        return str(x)
    return f"{x:.4g}"


_FLOAT8 = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu")
_EXACTLY_IN: dict[torch.dtype, torch.dtype] = {
    **{getattr(torch, n): torch.float32 for n in _FLOAT8 if hasattr(torch, n)},
    torch.uint16: torch.int64,
    torch.uint32: torch.int64,
}
"""Dtypes torch has no min, max or mean of, and one that holds each of their values."""


def summarize(x: torch.Tensor) -> TensorStats:
    """The :class:`TensorStats` of ``x`` (complex tensors by magnitude, bools as 0/1;
    float8, uint16 and uint32, which torch does not reduce, through a dtype holding each
    of their values)."""
    t = x.detach()
    shape = tuple(t.shape)
    device = str(t.device)
    dtype = t.dtype
    if t.numel() == 0:
        return TensorStats(shape, dtype, device, None, None, None)
    if t.is_complex():
        t = t.abs()
    elif dtype == torch.bool:
        t = t.to(torch.uint8)
    elif dtype in _EXACTLY_IN:  # torch cannot reduce these: their values, widened exactly
        t = t.to(_EXACTLY_IN[dtype])
    nan = inf = 0
    try:
        if t.is_floating_point():
            nan, inf = (int(c) for c in torch.stack([t.isnan().sum(), t.isinf().sum()]).tolist())
            if nan or inf:
                t = t[t.isfinite()]
                if t.numel() == 0:
                    return TensorStats(shape, dtype, device, None, None, None, nan, inf)
            lo, hi, mean = torch.stack(
                [t.min().double(), t.max().double(), t.mean(dtype=torch.float64)]
            ).tolist()
        else:
            lo, hi = torch.stack([t.min(), t.max()]).tolist()
            mean = t.mean(dtype=torch.float64).item()
    except (RuntimeError, TypeError):  # a dtype torch cannot reduce (float8, uint16, ...)
        return TensorStats(shape, dtype, device, None, None, None)
    return TensorStats(shape, dtype, device, lo, hi, mean, nan, inf)


@dataclass(frozen=True, slots=True)
class RefError:
    """How far a program value is from its float64 reference.

    ``max_abs``: the largest absolute difference over elements finite in both;
    ``max_rel``: ``max_abs`` over the largest finite magnitude of the reference (a
    normwise relative error); ``eps``: the machine epsilon of the program's dtype (so
    ``max_rel / eps`` is the error in units of its precision); ``mismatched``: elements
    where the two disagree outright (a NaN or Inf on one side only; any difference for
    integers and bools). A mismatched element is an error no finite one reaches: it
    ranks first (:attr:`rank`), and says so before the finite elements' error.
    """

    max_abs: float
    max_rel: float
    eps: float | None
    mismatched: int = 0
    note: str | None = None

    @property
    def in_eps(self) -> float | None:
        return None if not self.eps else self.max_rel / self.eps

    @property
    def rank(self) -> tuple[bool, int, float]:
        """How bad it is, for ordering (larger is worse): any mismatched element first,
        more of them before fewer, then the relative error."""
        return (self.mismatched > 0, self.mismatched, self.max_rel)

    @property
    def is_error(self) -> bool:
        """Whether the value differs from its reference at all."""
        return self.mismatched > 0 or self.max_rel > 0

    def __str__(self) -> str:
        if self.note:
            return self.note
        text = f"abs {self.max_abs:.3g}  rel {self.max_rel:.3g}"
        if self.eps:
            text += f" ({self.max_rel / self.eps:.3g} eps)"
        if self.mismatched:
            head = f"{self.mismatched} mismatched"
            text = f"{head}; elsewhere {text}" if self.max_abs > 0 else head
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_abs": self.max_abs,
            "max_rel": self.max_rel,
            "eps": self.eps,
            "mismatched": self.mismatched,
            "note": self.note,
        }


def compare(x: Any, ref: Any) -> RefError | None:
    """The :class:`RefError` of program value ``x`` against reference ``ref`` (None when
    there is nothing to compare)."""
    if isinstance(x, torch.Tensor) and isinstance(ref, torch.Tensor):
        if tuple(x.shape) != tuple(ref.shape):
            return RefError(
                math.inf, math.inf, None, x.numel(), f"shape {list(x.shape)} vs {list(ref.shape)}"
            )
        if x.numel() == 0:
            return RefError(0.0, 0.0, None)
        a = x.detach()
        r = ref.detach().to(a.device)
        if not (a.is_floating_point() or a.is_complex()):
            return RefError(0.0, 0.0, None, int((a != r.to(a.dtype)).sum()))
        eps = torch.finfo(a.dtype).eps if a.is_floating_point() else None
        a64 = a.to(torch.complex128 if a.is_complex() else torch.float64)
        r64 = r.to(a64.dtype)
        both = a64.isfinite() & r64.isfinite()
        same = (a64 == r64) | (a64.isnan() & r64.isnan())
        mismatched = int((~both & ~same).sum())
        diff = torch.where(both, (a64 - r64).abs(), 0.0)
        mag = torch.where(r64.isfinite(), r64.abs(), 0.0)
        max_abs, scale = torch.stack([diff.max().double(), mag.max().double()]).tolist()
        rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
        return RefError(max_abs, rel, eps, mismatched)
    if isinstance(x, bool | int | float) and isinstance(ref, bool | int | float):
        if not isinstance(x, float):  # integers and bools: any difference is a mismatch
            gap = abs(float(x) - float(ref))
            return RefError(gap, gap / abs(float(ref)) if ref else gap, None, int(x != ref))
        got, want = x, float(ref)
        if not (math.isfinite(got) and math.isfinite(want)):
            # a NaN or Inf on one side only, as for a tensor's elements: no finite error
            agree = got == want or (math.isnan(got) and math.isnan(want))
            return RefError(0.0, 0.0, None, int(not agree))
        dist = abs(got - want)
        return RefError(dist, dist / abs(want) if want else dist, None)
    return None
