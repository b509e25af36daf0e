"""Gradients of a training program against eager autograd on its source module."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..errors import InputError

if TYPE_CHECKING:
    from ..method import Method
    from .layout import Layout

__all__ = ["GradientCheck", "check_gradients"]


@dataclass(frozen=True)
class GradientCheck:
    """The result of :func:`check_gradients`: the program's loss and eager PyTorch's, and
    per parameter name the largest absolute difference of the gradients and whether it
    is within ``atol + rtol * |eager|`` everywhere."""

    loss: float
    reference_loss: float
    errors: dict[str, float]
    within: dict[str, bool]
    loss_within: bool

    @property
    def ok(self) -> bool:
        return self.loss_within and all(self.within.values())

    def __str__(self) -> str:
        lines = [f"loss {self.loss:.6g} (eager {self.reference_loss:.6g})"]
        for name, err in self.errors.items():
            mark = "ok" if self.within[name] else "DIFFERS"
            lines.append(f"  {name}: max |diff| {err:.3g} {mark}")
        return "\n".join(lines)


def _loss(out: Any) -> torch.Tensor:
    loss = out[0] if isinstance(out, list | tuple) else out
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise InputError("the module's first output must be the loss (a one-element tensor)")
    return loss


def check_gradients(
    method: Method,
    layout: Layout,
    module: torch.nn.Module,
    inputs: Sequence[Any],
    rtol: float = 1e-4,
    atol: float = 1e-5,
) -> GradientCheck:
    """Run ``method`` on ``inputs`` and a copy of ``module`` (given the method's current
    parameters by name) under autograd, and compare loss and gradients. The method's
    gradient memory is put back as it was, so a check between a step's backward and its
    optimizer step changes nothing."""
    reference = copy.deepcopy(module)
    named = dict(reference.named_parameters())
    missing = [n for n in layout.names if n not in named]
    if missing:
        raise InputError(f"the module has no parameters named {missing}")
    with torch.no_grad():
        for name, p in zip(layout.names, layout.parameters, strict=True):
            named[name].copy_(p.to(named[name].device))
    reference.zero_grad(set_to_none=True)
    device = next(iter(named.values())).device if named else torch.device("cpu")
    ref_inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
    # both runs draw from the generators as they are now (a dropout mask is the same in
    # each), and leave them so: the check moves no later step's random numbers
    cuda = sorted({t.device.index or 0 for t in (*layout.gradients, *named.values()) if t.is_cuda})
    with torch.random.fork_rng(devices=cuda):
        ref_loss = _loss(reference(*ref_inputs))
        ref_loss.backward()  # type: ignore[no-untyped-call]

    kept = [g.clone() for g in layout.gradients]
    try:
        with torch.random.fork_rng(devices=cuda):
            out = method.execute(inputs)
        loss = float(out[0])
        errors: dict[str, float] = {}
        within: dict[str, bool] = {}
        for name, g in zip(layout.names, layout.gradients, strict=True):
            expected = named[name].grad
            want = torch.zeros_like(g) if expected is None else expected.to(g.device, g.dtype)
            diff = (g - want).abs()
            errors[name] = float(diff.max()) if diff.numel() else 0.0
            within[name] = bool(torch.all(diff <= atol + rtol * want.abs()))
    finally:
        with torch.no_grad():
            for g, k in zip(layout.gradients, kept, strict=True):
                g.copy_(k)
    ref = float(ref_loss.detach())
    return GradientCheck(loss, ref, errors, within, abs(loss - ref) <= atol + rtol * abs(ref))
