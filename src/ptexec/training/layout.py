"""Where a training method keeps its loss, outputs, gradients and parameters.

ExecuTorch's exporter (``_export_forward_backward``, then ``to_executorch``) emits, beside a
training method ``m``, three getter methods: ``__et_training_gradients_index_m`` (the index
of the first gradient output), ``__et_training_parameters_index_m`` (the index of the first
parameter output) and ``__et_training_fqn_m`` (the fully qualified name of each trainable
parameter, in output order). ``m`` itself returns ``[loss, outputs..., gradients...,
parameters...]``. The parameters are the method's own planned memory (mutable state,
initialised from the file or the ``.ptd``), so the parameter outputs are views of the very
tensors the next call reads; the gradients are planned outputs that every call rewrites.

:func:`read_layout` runs the getters once, checks everything they say against the method
(counts, names, and each gradient against its parameter) and returns the tensors as views
of the method's memory. A program that contradicts itself is a :class:`PteFormatError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..effects import byte_range
from ..errors import MethodNotFoundError, PteFormatError

if TYPE_CHECKING:
    from ..format.program import EValue
    from ..method import Method
    from ..program import Program

__all__ = ["FQN_PREFIX", "GRADIENTS_PREFIX", "PARAMETERS_PREFIX", "Layout", "read_layout"]

GRADIENTS_PREFIX = "__et_training_gradients_index_"
PARAMETERS_PREFIX = "__et_training_parameters_index_"
FQN_PREFIX = "__et_training_fqn_"


@dataclass(frozen=True, eq=False)
class Layout:
    """A training method's outputs, sliced: ``user`` outputs ``[0, gradient_start)`` (the
    loss first), then one gradient and one parameter per name in ``names``. ``parameters``
    and ``gradients`` are the method's planned tensors themselves (not copies)."""

    method: str
    gradient_start: int
    parameter_start: int
    names: tuple[str, ...]
    parameters: tuple[torch.Tensor, ...]
    gradients: tuple[torch.Tensor, ...]
    parameter_slots: tuple[int, ...]  # each parameter's value index in the plan
    # gradients whose planned memory overlaps an earlier gradient's (one value returned for
    # two parameters): in-place use of one ``.grad`` must not change the other's
    shared_gradients: frozenset[int] = frozenset()


def training_methods(program: Program) -> tuple[str, ...]:
    """The methods of ``program`` that have ExecuTorch's training getters."""
    names = set(program.method_names)
    return tuple(
        n
        for n in program.method_names
        if GRADIENTS_PREFIX + n in names
        and PARAMETERS_PREFIX + n in names
        and FQN_PREFIX + n in names
    )


def _index(program: Program, getter: str) -> int:
    out = program.load_method(getter)()
    if len(out) != 1 or isinstance(out[0], bool) or not isinstance(out[0], int):
        raise PteFormatError(f"method '{getter}'", f"returns {out!r}, expected one int")
    return int(out[0])


def read_layout(program: Program, name: str, method: Method) -> Layout:
    """The layout of training method ``name`` (loaded as ``method``); module docstring."""
    for prefix in (GRADIENTS_PREFIX, PARAMETERS_PREFIX, FQN_PREFIX):
        if prefix + name not in program.method_names:
            raise MethodNotFoundError(
                f"method '{name}' is not a training method: the program has no "
                f"'{prefix}{name}' (export it with torch.export.experimental."
                "_export_forward_backward)"
            )
    g = _index(program, GRADIENTS_PREFIX + name)
    p_ = _index(program, PARAMETERS_PREFIX + name)
    fqn_getter = FQN_PREFIX + name
    names = program.load_method(fqn_getter)()
    if not all(isinstance(n, str) for n in names):
        raise PteFormatError(f"method '{fqn_getter}'", f"returns {names!r}, expected strings")
    where = f"method '{name}'"
    n_out = len(method.meta.outputs)
    n = len(names)
    if not (1 <= g <= p_ <= n_out) or p_ - g != n or n_out - p_ != n:
        raise PteFormatError(
            where,
            f"has {n_out} outputs; its getters say gradients start at {g} and parameters "
            f"at {p_}, for {n} names: expected [loss, outputs..., {n} gradients, "
            f"{n} parameters]",
        )
    if len(set(names)) != n:
        raise PteFormatError(f"method '{fqn_getter}'", f"repeats a name: {list(names)}")
    state = method.state
    slots = tuple(state.plan.outputs)
    values = state.values
    params: list[torch.Tensor] = []
    grads: list[torch.Tensor] = []
    for i, fqn in enumerate(names):
        for kind, index, out in (("gradient", g + i, grads), ("parameter", p_ + i, params)):
            spec = state.outputs[index]
            t = values[slots[index]]
            if not isinstance(t, torch.Tensor) or not spec.planned:
                raise PteFormatError(
                    f"{where}, output {index}",
                    f"the {kind} of '{fqn}' is not a memory-planned tensor",
                )
            out.append(t)
        grad, param = grads[-1], params[-1]
        if (
            grad.shape != param.shape
            or grad.dtype != param.dtype
            or grad.device != param.device
            or not param.is_floating_point()
        ):
            raise PteFormatError(
                f"{where}, output {g + i}",
                f"gradient of '{fqn}' is {tuple(grad.shape)} {grad.dtype} on {grad.device}, "
                f"its parameter {tuple(param.shape)} {param.dtype} on {param.device} "
                "(expected the same floating-point shape, dtype and device)",
            )
    if len({t.data_ptr() for t in params if t.numel()}) != sum(1 for t in params if t.numel()):
        raise PteFormatError(where, "two parameters share memory")
    return Layout(
        name,
        g,
        p_,
        tuple(names),
        tuple(params),
        tuple(grads),
        tuple(slots[p_ + i] for i in range(n)),
        _shared(state.plan.values, slots[g:p_]),
    )


def _shared(values: Sequence[EValue], gradient_slots: Sequence[int]) -> frozenset[int]:
    """Indices of the gradients whose planned bytes overlap an earlier gradient's."""
    spans = [byte_range(values[s]) for s in gradient_slots]
    return frozenset(
        i
        for i, a in enumerate(spans)
        if a is not None
        and a[1] < a[2]
        and any(b is not None and b[0] == a[0] and a[1] < b[2] and b[1] < a[2] for b in spans[:i])
    )
