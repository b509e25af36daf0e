"""Bounded planned tensors whose size a call computes from data, and the check that keeps
them within their bound.

A planned tensor of bounded dynamic shape has room for its upper bound's elements and no
more: the plan puts other tensors right after it. ExecuTorch refuses to resize such a
tensor past that capacity. ptexec's planned tensors are views of their buffer's one
storage, so torch only refuses a size past the end of the whole buffer: a larger one
would be written over the tensors planned beside it.

Sizes that follow from the inputs' sizes stay within their bounds: the exporter computed
the bounds from the inputs' ranges, and ptexec refuses an input past its bound in any
dimension. A size computed from data does not: a scalar read out of a tensor
(``item()``), a value a call is given, an op whose result's size depends on what it reads
(``nonzero``). Each statement that is sized by data (not ``sized``), or that reads a
scalar such a statement computed (or a tensor one put in its slot), is followed by a check
of every bounded planned tensor it writes, as an input is checked: more elements than its
capacity raise, as ExecuTorch's resize does (the kernel has written them by then; the
call stops there), and so does a dimension past its bound (a [4, 8] resized to [2, 16]
fits its 32 elements, but a sum of it over dimension 0 would not fit its 8). What is
sized from tensors checked so then stays within its bounds, as what is sized from the
inputs does, and needs no check of its own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

from ..format import program as p
from ..format.lru import Lru
from ..kernels.registry import Statement

__all__ = ["CHECK", "Checks", "bounded_by_data", "capacity", "check_capacity", "guard_capacity"]

Checks = tuple[tuple[int, tuple[tuple[int, tuple[int, ...]], ...]], ...]
"""Per statement checked, its index and the (slot, bound) of each tensor it checks."""

CHECK = "_beyond_capacity"
"""The name the checks call (:func:`check_capacity`), in each checked statement's env."""


def check_capacity(t: torch.Tensor, slot: int, bound: tuple[int, ...]) -> None:
    """Refuse ``t``, the value of ``slot`` (or what is to be stored there), when it holds
    more elements than its plan's ``bound`` (sizes) holds, or is past it in a dimension."""
    shape = t.shape
    if shape == bound:
        return
    n, most = t.numel(), math.prod(bound)
    if n > most:
        raise RuntimeError(
            f"value {slot}: a bounded tensor with a maximum capacity of {most} elements "
            f"cannot hold {n} elements ({list(shape)}): a size computed from data is past "
            "the bound the program was exported with"
        )
    if len(shape) != len(bound) or any(a > b for a, b in zip(shape, bound, strict=True)):
        raise RuntimeError(
            f"value {slot}: sizes {list(shape)} are past the bound {list(bound)} the program "
            "was exported with (a size computed from data)"
        )


def capacity(value: p.EValue) -> tuple[int, ...] | None:
    """The bound (sizes) of a bounded dynamic tensor in planned memory; None for any
    other."""
    if (
        isinstance(value, p.Tensor)
        and value.allocation_info is not None
        and value.shape_dynamism == p.DYNAMIC_BOUND
    ):
        return tuple(value.sizes)
    return None


def bounded_by_data(plan: p.ExecutionPlan, statements: Sequence[Statement]) -> Checks:
    """``(instruction, ((slot, bound), ...))`` for each statement of a chain that may
    size a bounded planned tensor from data (see the module docstring). A chain with
    jumps is followed until nothing more is found (a loop may carry a scalar back)."""
    values = plan.values
    tainted = {i for i in plan.inputs if not isinstance(values[i], p.Tensor)}
    found: dict[int, tuple[tuple[int, tuple[int, ...]], ...]] = {}
    while True:
        before = len(tainted)
        for i, st in enumerate(statements):
            reads = st.reads
            by_data = not st.sized or reads is None or any(r in tainted for r in reads)
            if not by_data:
                continue
            tainted.update(st.writes)
            written = st.outs if st.mutates is None else st.mutates
            checks = tuple((o, cap) for o in written if (cap := capacity(values[o])) is not None)
            if checks:
                found[i] = checks
        if len(tainted) == before:
            break
    return tuple(sorted(found.items()))


# the checks of a chain, by its plan (the facts they follow from are the plan's: its
# kernels' statements are functions of it), and the checked statement made for each
# statement checked (a repeated load's kept statements are the same objects): (plan,
# the checks, {instruction: (statement, checked statement)})
_kept: Lru[tuple[p.ExecutionPlan, Checks, dict[int, tuple[Statement, Statement]]]] = Lru(1024, 0)


def guard_capacity(
    plan: p.ExecutionPlan, c: int, statements: Sequence[Statement]
) -> list[Statement]:
    """``statements`` (chain ``c`` of ``plan``), each one that may size a bounded planned
    tensor from data followed by the check of its capacity (:func:`bounded_by_data`)."""
    key = (id(plan), c)
    hit = _kept.get(key)
    if hit is None or hit[0] is not plan:
        hit = (plan, bounded_by_data(plan, statements), {})
        _kept.put(key, hit, 0)
    _, checks, made = hit
    if not checks:
        return list(statements) if not isinstance(statements, list) else statements
    out = list(statements)
    for i, pairs in checks:
        st = out[i]
        kept = made.get(i)
        if kept is not None and kept[0] is st:
            out[i] = kept[1]
            continue
        lines = "".join(f"\n{CHECK}(v[{o}], {o}, {bound})" for o, bound in pairs)
        out[i] = dataclasses.replace(
            st,
            code=st.code + lines,
            env={**st.env, CHECK: check_capacity},
            # the native step and the form without some outs would not check
            native=None,
            prune=None,
        )
        made[i] = (st, out[i])
    return out
