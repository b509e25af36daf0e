"""``executorch_prim::`` scalar ops, symbolic size ops, ``et_view`` and ``et_copy_index``.

Prim ops take their operands first and write their result into the last slot, replacing
that value (as ExecuTorch's prim ops overwrite their output EValue). Arithmetic follows
ExecuTorch's kernels: int op int -> int, anything with a float -> float, ``truediv``
always float, ``floordiv.Scalar`` floors (Python semantics) while ``floordiv.int`` and
``mod.int`` truncate toward zero (C++ semantics), float division by zero gives +-inf (nan
for 0/0), and ``round`` rounds half to even.

Each op has one body (:data:`PRIM_OPS`): the interpreter runs it (or, for an operator
expression, writes it inline), the compiled tier traces it, with ``traced=True`` where a
symbolic operand needs torch's ``sym_*`` helpers.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from types import MappingProxyType
from typing import Any

import torch

from ..format import program as p
from .aten import spread
from .registry import KernelContext, Statement, UnsupportedKernel, register

__all__ = ["PRIM_OPS", "PrimOp"]

_torch: Any = torch  # symbolic-value helpers torch does not annotate


def _arity(ctx: KernelContext, n: int) -> None:
    if len(ctx.args) != n:
        raise UnsupportedKernel(
            f"{ctx.op_name}: expected {n} values, the program passes {len(ctx.args)}"
        )


# ---------------------------------------------------------------------------------------
# the scalar ops: one body each, for the interpreter and for a traced program

_FLOATS = (float, torch.SymFloat)
_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _ieee_div(a: Any, b: Any) -> Any:
    """``a / b`` as IEEE 754 doubles: division by a zero gives +-inf, or nan for 0/0 and
    nan/0 (``a / +-0.0`` equals ``a * +-inf`` for every ``a``)."""
    if isinstance(b, float) and b == 0.0:
        return a * math.copysign(math.inf, b)
    return a / b


def _truediv(a: Any, b: Any, traced: bool = False) -> Any:
    if traced:
        return _ieee_div(_torch.sym_float(a), _torch.sym_float(b))
    return _ieee_div(float(a), float(b))


def _floordiv(a: Any, b: Any, traced: bool = False) -> Any:
    if isinstance(a, _FLOATS) or isinstance(b, _FLOATS):
        q = _truediv(a, b, traced)
        if isinstance(q, torch.SymFloat):
            return _torch.sym_float(math.floor(q))
        if not math.isfinite(q):
            return q
        r = float(math.floor(q))
        return math.copysign(r, q) if r == 0.0 else r  # -0.0 stays -0.0, as floor keeps it
    return a // b


def _trunc_div(a: Any, b: Any) -> Any:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _trunc_mod(a: Any, b: Any) -> Any:
    return a - b * _trunc_div(a, b)


def _sym_max(a: Any, b: Any, traced: bool = False) -> Any:
    if traced and (isinstance(a, _SYMBOLIC) or isinstance(b, _SYMBOLIC)):
        return _torch.sym_max(a, b)
    return max(a, b)


def _sym_min(a: Any, b: Any, traced: bool = False) -> Any:
    if traced and (isinstance(a, _SYMBOLIC) or isinstance(b, _SYMBOLIC)):
        return _torch.sym_min(a, b)
    return min(a, b)


def _sym_int(a: Any, traced: bool = False) -> Any:
    if traced and isinstance(a, _SYMBOLIC):
        return _torch.sym_int(a)
    return int(a)  # truncates floats, bool -> 0/1


def _sym_float(a: Any, traced: bool = False) -> Any:
    if traced and isinstance(a, _SYMBOLIC):
        return _torch.sym_float(a)
    return float(a)


def _round_even(a: Any) -> Any:
    return round(a)  # Python rounds half to even


def _sym_not(a: Any, traced: bool = False) -> Any:
    if traced and isinstance(a, torch.SymBool):
        return _torch.sym_not(a)
    return not a


def _ite(cond: Any, a: Any, b: Any, traced: bool = False) -> Any:
    if traced and isinstance(cond, torch.SymBool):
        return _torch.sym_ite(cond, a, b)
    return a if cond else b


def _size(t: torch.Tensor, dim: Any) -> Any:
    return t.size(dim)


def _numel(t: torch.Tensor) -> Any:
    return t.numel()


def _storage_offset(t: torch.Tensor) -> int:
    return 0  # every program tensor starts its own memory


def _item(t: torch.Tensor) -> Any:
    return t.item()


# the interpreter writes these bodies as Python source in its generated code (a call
# costs more than the expression); each spelling is exactly its body
_SPELLED: dict[Callable[..., Any], str] = {
    operator.add: "{0} + {1}",
    operator.sub: "{0} - {1}",
    operator.mul: "{0} * {1}",
    operator.eq: "{0} == {1}",
    operator.gt: "{0} > {1}",
    operator.lt: "{0} < {1}",
    operator.ge: "{0} >= {1}",
    operator.le: "{0} <= {1}",
    operator.neg: "-{0}",
    _ite: "({1} if {0} else {2})",
    _size: "{0}.size({1})",
    _numel: "{0}.numel()",
    _storage_offset: "0",
    _item: "{0}.item()",
}


@dataclass(frozen=True, slots=True)
class PrimOp:
    """A scalar op of ``arity`` operands: ``compute`` is its body on Python values (the
    interpreter's), ``traced`` the same body on the values of a program being traced,
    which may be torch's symbolic integers, floats and bools. On Python values the two
    give the same result: the traced form takes torch's ``sym_*`` helpers only for a
    symbolic operand."""

    arity: int
    compute: Callable[..., Any]
    traced: Callable[..., Any]


def _op(arity: int, body: Callable[..., Any], flagged: bool = False) -> PrimOp:
    """``body`` as an op; ``flagged``: it takes ``traced=True`` for a traced program."""
    return PrimOp(arity, body, partial(body, traced=True) if flagged else body)


PRIM_OPS: Mapping[str, PrimOp] = MappingProxyType(
    {
        "executorch_prim::add.Scalar": _op(2, operator.add),
        "executorch_prim::sub.Scalar": _op(2, operator.sub),
        "executorch_prim::mul.Scalar": _op(2, operator.mul),
        "executorch_prim::floordiv.Scalar": _op(2, _floordiv, flagged=True),
        "executorch_prim::truediv.Scalar": _op(2, _truediv, flagged=True),
        "executorch_prim::floordiv.int": _op(2, _trunc_div),
        "executorch_prim::mod.int": _op(2, _trunc_mod),
        "executorch_prim::mod.Scalar": _op(2, _trunc_mod),
        "executorch_prim::sym_max.Scalar": _op(2, _sym_max, flagged=True),
        "executorch_prim::sym_min.Scalar": _op(2, _sym_min, flagged=True),
        "executorch_prim::eq.Scalar": _op(2, operator.eq),
        "executorch_prim::gt.Scalar": _op(2, operator.gt),
        "executorch_prim::lt.Scalar": _op(2, operator.lt),
        "executorch_prim::ge.Scalar": _op(2, operator.ge),
        "executorch_prim::le.Scalar": _op(2, operator.le),
        "executorch_prim::neg.Scalar": _op(1, operator.neg),
        "executorch_prim::sym_not.Scalar": _op(1, _sym_not, flagged=True),
        "executorch_prim::sym_float.Scalar": _op(1, _sym_float, flagged=True),
        "executorch_prim::sym_int.Scalar": _op(1, _sym_int, flagged=True),
        "executorch_prim::ceil.Scalar": _op(1, math.ceil),
        "executorch_prim::trunc.Scalar": _op(1, math.trunc),
        "executorch_prim::round.Scalar": _op(1, _round_even),
        "executorch_prim::sym_ite.Scalar": _op(3, _ite, flagged=True),
        # symbolic size ops (ExecuTorch registers them as prim ops; no dispatcher call)
        "aten::sym_size.int": _op(2, _size),
        "aten::sym_numel": _op(1, _numel),
        "aten::sym_numel.default": _op(1, _numel),
        "aten::sym_storage_offset": _op(1, _storage_offset),
        "aten::sym_storage_offset.default": _op(1, _storage_offset),
        "aten::_local_scalar_dense": _op(1, _item),
        "aten::_local_scalar_dense.default": _op(1, _item),
    }
)
"""Every scalar op by name (operands first, the result into the last slot); the
compiled tier traces ``traced``."""


def _kernel(op: PrimOp) -> Callable[[KernelContext], Statement]:
    def factory(ctx: KernelContext) -> Statement:
        _arity(ctx, op.arity + 1)
        out = ctx.args[op.arity]
        # a scalar from sizes and other scalars (a tensor's element: from its contents)
        sized = op.compute is not _item
        spelled = _SPELLED.get(op.compute)
        if spelled is not None:
            # parenthesized: a literal operand must not merge with the template ("0.size(1)")
            operands = [f"({ctx.expr(i)})" for i in ctx.args[: op.arity]]
            return ctx.emit(
                f"v[{out}] = " + spelled.format(*operands), writes=(out,), mutates=(), sized=sized
            )
        f = ctx.bind(op.compute, "f")
        call = ", ".join(ctx.expr(i) for i in ctx.args[: op.arity])
        return ctx.emit(f"v[{out}] = {f}({call})", writes=(out,), mutates=(), sized=sized)

    return factory


for _name, _prim in PRIM_OPS.items():
    register(_name)(_kernel(_prim))
del _name, _prim


def _stride(ctx: KernelContext) -> Statement:
    """``sym_stride.int``: the memory's stride (a traced program reads it from the
    program's dim order instead, which only the program knows)."""
    _arity(ctx, 3)
    t, dim, out = ctx.args
    return ctx.emit(
        f"v[{out}] = ({ctx.expr(t)}).stride(({ctx.expr(dim)}))",
        writes=(out,),
        mutates=(),
        sized=True,
    )


register("aten::sym_stride.int")(_stride)


@register("executorch_prim::et_view.default", "executorch_prim::et_view")
def _et_view(ctx: KernelContext) -> Statement:
    """``out`` aliases ``self`` with new sizes (one -1 inferred), no copy; a copy only when
    its strides cannot be viewed that way (what ``reshape`` does), the sizes passed as
    separate ints (parsed faster than a list)."""
    _arity(ctx, 3)
    src, sizes, out = ctx.args
    if ctx.is_literal(sizes) and isinstance(ctx.values[sizes], p.IntList):
        shape = ", ".join(map(repr, ctx.literal(sizes))) or "()"
    else:
        shape = spread(ctx.expr(sizes))
    return ctx.emit(
        f"v[{out}] = {ctx.expr(src)}.reshape({shape})", writes=(out,), mutates=(), sized=True
    )


def _copy_index(copy_to: torch.Tensor, copy_from: torch.Tensor, index: int) -> None:
    if copy_to.dim() != copy_from.dim() + 1 or tuple(copy_to.shape[1:]) != tuple(copy_from.shape):
        raise RuntimeError(
            f"et_copy_index: cannot copy a {list(copy_from.shape)} tensor into row {index} of "
            f"a {list(copy_to.shape)} tensor"
        )
    if index < 0:
        raise IndexError(f"et_copy_index: negative index {index}")
    rows = index + 1
    if copy_to.shape[0] != rows:
        copy_to.resize_((rows, *copy_from.shape))
    copy_to[index].copy_(copy_from)


@register("executorch_prim::et_copy_index.tensor", "executorch_prim::et_copy_index")
def _et_copy_index(ctx: KernelContext) -> Statement:
    """Row ``index`` of ``copy_to`` (resized to ``index + 1`` rows) gets ``copy_from``
    (used by ``map`` and ``scan`` to stack per-iteration results)."""
    if len(ctx.args) not in (3, 4):
        raise UnsupportedKernel(
            f"{ctx.op_name}: expected 3 values, the program passes {len(ctx.args)}"
        )
    to, frm, idx = ctx.args[:3]
    f = ctx.bind(_copy_index, "f")
    return ctx.emit(f"{f}({ctx.expr(to)}, {ctx.expr(frm)}, {ctx.expr(idx)})", mutates=(to,))


def is_scalar_value(value: p.EValue) -> bool:
    return isinstance(value, p.Int | p.Double | p.Bool)
