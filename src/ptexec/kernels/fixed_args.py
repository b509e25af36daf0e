"""Factories for custom operators whose argument layout ptexec knows without torch.

ATen operators are mapped through torch's schema (:mod:`.aten`). Custom namespaces
(``quantized_decomposed::``, ``llama::``) are only known to torch when ExecuTorch's
libraries are loaded, which ptexec never does, so their kernels declare the layout
themselves: one :class:`Param` per schema argument before the ``out`` tensor(s), in
schema order. The emitter writes a KernelCall's ``args`` as every schema argument, then
the return slot (the single ``out`` again, or a TensorList of several outs).

A kernel function takes the rendered arguments and returns its result tensor(s); the
statement stores each result into its ``out`` tensor, resizing it first when the program
allows (see :func:`store`). Kernels that only mutate an argument return nothing.

Each such operator's :class:`Signature` (its function and argument layout) is in one table,
:data:`SIGNATURES`: the interpreter's statement is made from it, and the compiled tier calls
the same function on traced values (``traced=True`` for a kernel whose run-time checks read
tensor data, which a traced program cannot).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import Any

import torch

from ..dtypes import CODE_TO_DTYPE
from ..format import program as p
from ..format.scalar_type import scalar_type_name
from ..memory import resize_to
from ..tensor import dim_order_from_strides
from .registry import KernelContext, KernelFactory, Statement, UnsupportedKernel, register

__all__ = [
    "SIGNATURES",
    "Param",
    "Signature",
    "fixed_kernel",
    "register_signature",
    "store",
    "to_dtype",
    "traced_indices",
]

# Argument kinds: a tensor, an optional tensor, int, float, optional float, bool,
# ScalarType, optional ScalarType.
KINDS = frozenset({"T", "T?", "int", "float", "float?", "bool", "dtype", "dtype?"})


@dataclass(frozen=True)
class Param:
    """One schema argument: its name (for messages) and kind (one of :data:`KINDS`)."""

    name: str
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown argument kind {self.kind!r} for {self.name}")


def to_dtype(code: int) -> torch.dtype:
    """The torch dtype of an ExecuTorch ScalarType code passed as an argument."""
    dtype = CODE_TO_DTYPE.get(int(code))
    if dtype is None:
        raise ValueError(f"ScalarType {scalar_type_name(int(code))} has no torch dtype")
    return dtype


def _resize(
    out: torch.Tensor, shape: Sequence[int], order: Sequence[int] | None, grow: bool
) -> None:
    if order is None or len(order) != len(shape):
        order = dim_order_from_strides(out.shape, out.stride()) if out.dim() == len(shape) else None
        if order is None:
            order = tuple(range(len(shape)))
    try:
        resize_to(out, shape, order)
    except RuntimeError:
        if not grow:
            raise RuntimeError(
                f"output of {list(out.shape)} cannot hold a {list(shape)} result "
                "(beyond the size the program planned for it)"
            ) from None
        out.resize_(math.prod(shape))  # an unbound tensor owns its storage: let it grow
        resize_to(out, shape, order)


def store(out: torch.Tensor, result: torch.Tensor, order: Sequence[int] | None, grow: bool) -> None:
    """Write ``result`` into ``out`` (converting the dtype), resizing ``out`` when its sizes
    differ; ``order`` is the program's dim order for ``out``, ``grow`` allows storage to grow
    (DYNAMIC_UNBOUND outputs)."""
    if out.shape != result.shape:
        _resize(out, result.shape, order, grow)
    out.copy_(result)


def _store_pair(
    outs: tuple[torch.Tensor, torch.Tensor],
    results: tuple[torch.Tensor, torch.Tensor],
    orders: tuple[Sequence[int] | None, Sequence[int] | None],
    grows: tuple[bool, bool],
) -> None:
    for out, result, order, grow in zip(outs, results, orders, grows, strict=True):
        store(out, result, order, grow)


def _kind_name(value: p.EValue) -> str:
    return type(value).__name__


def _render(ctx: KernelContext, param: Param, index: int) -> str:
    value = ctx.values[index]
    kind = param.kind
    optional = kind.endswith("?")
    if optional and isinstance(value, p.Null):
        return "None"
    base = kind.rstrip("?")
    if base == "T":
        if not isinstance(value, p.Tensor):
            raise UnsupportedKernel(
                f"{ctx.op_name}: argument '{param.name}' (value {index}) should be a tensor, "
                f"the program passes {_kind_name(value)}"
            )
        return f"v[{index}]"
    if base == "dtype":
        if not isinstance(value, p.Int):
            raise UnsupportedKernel(
                f"{ctx.op_name}: argument '{param.name}' (value {index}) should be a "
                f"ScalarType, the program passes {_kind_name(value)}"
            )
        if ctx.is_literal(index):
            code = ctx.literal(index)
            if code not in CODE_TO_DTYPE:
                raise UnsupportedKernel(
                    f"{ctx.op_name}: argument '{param.name}' is ScalarType "
                    f"{scalar_type_name(code)}, which has no torch dtype"
                )
            return ctx.bind(CODE_TO_DTYPE[code], "dt")
        return f"{ctx.bind(to_dtype, 'to_dtype')}({ctx.expr(index)})"
    expected: tuple[type, ...] = {
        "int": (p.Int,),
        "float": (p.Double, p.Int),
        "bool": (p.Bool,),
    }[base]
    if not isinstance(value, expected) and index not in ctx.dynamic:
        raise UnsupportedKernel(
            f"{ctx.op_name}: argument '{param.name}' (value {index}) should be {base}, the "
            f"program passes {_kind_name(value)}"
        )
    return ctx.expr(index)


def _out_info(ctx: KernelContext, index: int) -> tuple[tuple[int, ...], bool]:
    value = ctx.values[index]
    if not isinstance(value, p.Tensor):
        raise UnsupportedKernel(
            f"{ctx.op_name}: output value {index} should be a tensor, the program passes "
            f"{_kind_name(value)}"
        )
    return value.dim_order, value.shape_dynamism == p.DYNAMIC_UNBOUND


def fixed_kernel(
    fn: Callable[..., Any], params: Sequence[Param], outs: int = 1, mutates: Sequence[str] = ()
) -> KernelFactory:
    """A factory calling ``fn(*params)`` and storing its result(s) into the ``outs`` out
    tensors that follow the parameters (``outs=0``: ``fn`` works in place, the single out
    tensor is left as it is). ``mutates`` names the tensor parameters ``fn`` writes in place
    (a cache); the statement declares them and the outs, for the method's dataflow rewrites,
    and marks the kernel pure (foldable at load on fixed arguments) when it writes only its
    outs."""
    params = tuple(params)
    stored = max(outs, 1)
    names = [prm.name for prm in params]
    unknown = [m for m in mutates if m not in names]
    if unknown:
        raise ValueError(f"fixed_kernel: mutated parameters {unknown} are not among {names}")
    mutated_positions = [names.index(m) for m in mutates]
    pure = outs > 0 and not mutates

    def factory(ctx: KernelContext) -> Statement:
        expected = len(params) + stored + 1
        if len(ctx.args) != expected:
            raise UnsupportedKernel(
                f"{ctx.op_name}: expected {expected} values ({len(params)} arguments, "
                f"{stored} out, 1 return), the program passes {len(ctx.args)}"
            )
        rendered = [_render(ctx, prm, i) for prm, i in zip(params, ctx.args, strict=False)]
        out_slots = ctx.args[len(params) : len(params) + stored]
        infos = [_out_info(ctx, i) for i in out_slots]
        call = f"{ctx.bind(fn, 'f')}({', '.join(rendered)})"
        in_place = tuple(i for k in mutated_positions for i in ctx.tensors_of(ctx.args[k]))
        if outs == 0:
            return ctx.emit(call, mutates=in_place)
        written = tuple(out_slots)
        only_written = ctx.only_written(written, ctx.args[: len(params)])
        foldable = pure and only_written == written  # no out is also read
        if outs == 1:
            (order, grow), slot = infos[0], out_slots[0]
            s = ctx.bind(store, "store")
            code = f"{s}(v[{slot}], {call}, {ctx.bind(order, 'order')}, {grow})"
            return ctx.emit(code, mutates=in_place + written, outs=only_written, pure=foldable)
        if outs == 2:
            s = ctx.bind(_store_pair, "store")
            targets = f"(v[{out_slots[0]}], v[{out_slots[1]}])"
            orders = ctx.bind(tuple(info[0] for info in infos), "orders")
            grows = repr(tuple(info[1] for info in infos))
            code = f"{s}({targets}, {call}, {orders}, {grows})"
            return ctx.emit(code, mutates=in_place + written, outs=only_written, pure=foldable)
        raise ValueError(f"fixed_kernel supports at most 2 outs, not {outs}")

    return factory


@dataclass(frozen=True)
class Signature:
    """A custom operator's kernel function and its argument layout (outs excluded).

    ``fn`` takes the ``params`` in order (a ``dtype`` kind as a torch dtype) and returns
    its ``outs`` results (``outs=0``: it only updates the ``mutates`` parameters in place).
    ``flagged``: ``fn`` also takes ``traced=True``, for a program being traced: it then
    leaves out the checks that read tensor data (a traced tensor has none) and computes
    what it would have sliced on the host with shapes that do not depend on data."""

    fn: Callable[..., Any]
    params: tuple[Param, ...]
    outs: int = 1
    mutates: tuple[str, ...] = ()
    flagged: bool = False
    traced: Callable[..., Any] = field(init=False, repr=False, compare=False)
    dtype_positions: tuple[int, ...] = field(init=False, repr=False, compare=False)
    mutated_positions: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [prm.name for prm in self.params]
        unknown = [m for m in self.mutates if m not in names]
        if unknown:
            raise ValueError(f"Signature: mutated parameters {unknown} are not among {names}")
        traced = partial(self.fn, traced=True) if self.flagged else self.fn
        object.__setattr__(self, "traced", traced)
        dtypes = tuple(k for k, prm in enumerate(self.params) if prm.kind.startswith("dtype"))
        object.__setattr__(self, "dtype_positions", dtypes)
        mutated = tuple(names.index(m) for m in self.mutates)
        object.__setattr__(self, "mutated_positions", mutated)

    def factory(self) -> KernelFactory:
        """The interpreter's factory: a statement calling :attr:`fn` (see :func:`fixed_kernel`)."""
        return fixed_kernel(self.fn, self.params, self.outs, self.mutates)


_SIGNATURES: dict[str, Signature] = {}
SIGNATURES: Mapping[str, Signature] = MappingProxyType(_SIGNATURES)
"""Every custom operator with a fixed argument layout, by qualified name (filled as the
kernel modules register them)."""


def register_signature(
    name: str, signature: Signature, factory: KernelFactory | None = None
) -> None:
    """Register operator ``name``: its signature, and its interpreter factory (``factory``,
    e.g. one preparing constant weights at load, else :meth:`Signature.factory`)."""
    _SIGNATURES[name] = signature
    register(name)(factory if factory is not None else signature.factory())


def traced_indices(indices: torch.Tensor, size: int) -> torch.Tensor:
    """``indices`` with each negative one replaced by ``size``, for a traced kernel that
    cannot check them on the host: indexing wraps a negative index where a kernel refuses
    it, and refuses one past the end (in eager torch and in compiled code alike)."""
    return torch.where(indices < 0, size, indices)
