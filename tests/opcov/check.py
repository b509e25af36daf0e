"""Comparison of a runtime's outputs with eager PyTorch's, per the rules of the coverage test.

Integer and bool outputs must be equal exactly; floating outputs must have the same dtype and
shape, NaN in the same places, infinities equal, and the rest within the case's tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .spec import Case


def _as_tensor(x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x
    return torch.tensor(x)


def mismatch(case: Case, actual: Sequence[Any], expected: Sequence[torch.Tensor]) -> str | None:
    """Describe how ``actual`` differs from ``expected``; None when they agree."""
    if len(actual) != len(expected):
        return f"{len(actual)} outputs, expected {len(expected)}"
    problems = []
    for i, (a_raw, e) in enumerate(zip(actual, expected, strict=True)):
        a = _as_tensor(a_raw).detach().cpu()
        if a.dtype != e.dtype:
            problems.append(f"output {i}: dtype {a.dtype}, expected {e.dtype}")
            continue
        if a.shape != e.shape:
            problems.append(f"output {i}: shape {tuple(a.shape)}, expected {tuple(e.shape)}")
            continue
        if not (e.dtype.is_floating_point or e.dtype.is_complex):
            if not torch.equal(a, e):
                bad = (a != e).sum().item()
                problems.append(f"output {i}: {bad} of {e.numel()} elements differ")
            continue
        rtol, atol = case.tolerance(e.dtype)
        a64, e64 = a.double(), e.double()
        nan_a, nan_e = torch.isnan(a64), torch.isnan(e64)
        if not torch.equal(nan_a, nan_e):
            problems.append(
                f"output {i}: NaN positions differ ({int(nan_a.sum())} vs {int(nan_e.sum())} NaNs)"
            )
            continue
        inf_e = torch.isinf(e64)
        if not torch.equal(torch.isinf(a64), inf_e) or not torch.equal(a64[inf_e], e64[inf_e]):
            problems.append(f"output {i}: infinities differ")
            continue
        finite = ~(nan_e | inf_e)
        diff = (a64 - e64).abs()[finite]
        allowed = atol + rtol * e64.abs()[finite]
        if bool((diff > allowed).any()):
            worst = int((diff - allowed).argmax())
            problems.append(
                f"output {i}: {int((diff > allowed).sum())} of {e.numel()} elements outside "
                f"rtol={rtol} atol={atol}; max abs diff {diff.max().item():.3g} "
                f"(got {a64[finite][worst].item():.6g}, expected {e64[finite][worst].item():.6g})"
            )
    return "; ".join(problems) if problems else None


__all__ = ["mismatch"]
