"""``executorch_prim::`` scalar ops, symbolic size ops, ``et_view`` and ``et_copy_index``.

Prim ops take their operands first and write their result into the last slot, replacing
that value (as ExecuTorch's prim ops overwrite their output EValue). Arithmetic follows
ExecuTorch's kernels: int op int -> int, anything with a float -> float, ``truediv``
always float, ``floordiv.Scalar`` floors (Python semantics) while ``floordiv.int`` and
``mod.int`` truncate toward zero (C++ semantics), float division by zero gives +-inf (nan
for 0/0), and ``round`` rounds half to even.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ..format import program as p
from .registry import Emission, KernelContext, UnsupportedKernel, register

__all__: list[str] = []


def _arity(ctx: KernelContext, n: int) -> None:
    if len(ctx.args) != n:
        raise UnsupportedKernel(
            f"{ctx.op_name}: expected {n} values, the program passes {len(ctx.args)}"
        )


def _binary(fn: Callable[[Any, Any], Any]) -> Callable[[KernelContext], Emission]:
    def factory(ctx: KernelContext) -> Emission:
        _arity(ctx, 3)
        a, b, out = ctx.args
        f = ctx.bind(fn, "f")
        return ctx.emit(f"v[{out}] = {f}({ctx.expr(a)}, {ctx.expr(b)})", writes=(out,), mutates=())

    return factory


def _unary(fn: Callable[[Any], Any]) -> Callable[[KernelContext], Emission]:
    def factory(ctx: KernelContext) -> Emission:
        _arity(ctx, 2)
        a, out = ctx.args
        f = ctx.bind(fn, "f")
        return ctx.emit(f"v[{out}] = {f}({ctx.expr(a)})", writes=(out,), mutates=())

    return factory


def _inline(template: str, n: int) -> Callable[[KernelContext], Emission]:
    """A prim op whose result is a Python expression of its operands ({0}, {1}, ...)."""

    def factory(ctx: KernelContext) -> Emission:
        _arity(ctx, n + 1)
        # parenthesized: a literal operand must not merge with the template ("0.size(1)")
        operands = [f"({ctx.expr(i)})" for i in ctx.args[:n]]
        out = ctx.args[n]
        return ctx.emit(f"v[{out}] = " + template.format(*operands), writes=(out,), mutates=())

    return factory


def _ieee_div(a: float, b: float) -> float:
    """``a / b`` as IEEE 754 doubles: division by zero gives +-inf, or nan for 0/0."""
    if b == 0.0:
        if a == 0.0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def _floordiv(a: Any, b: Any) -> Any:
    if isinstance(a, float) or isinstance(b, float):
        q = _ieee_div(float(a), float(b))
        return float(math.floor(q)) if math.isfinite(q) else q
    return a // b


def _truediv(a: Any, b: Any) -> float:
    return _ieee_div(float(a), float(b))


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _trunc_mod(a: int, b: int) -> int:
    return a - b * _trunc_div(a, b)


def _sym_int(a: Any) -> int:
    return int(a)  # truncates floats, bool -> 0/1


def _sym_float(a: Any) -> float:
    return float(a)


def _round_even(a: float) -> int:
    return round(a)  # Python rounds half to even


def _sym_not(a: Any) -> bool:
    return not a


register("executorch_prim::add.Scalar")(_inline("{0} + {1}", 2))
register("executorch_prim::sub.Scalar")(_inline("{0} - {1}", 2))
register("executorch_prim::mul.Scalar")(_inline("{0} * {1}", 2))
register("executorch_prim::floordiv.Scalar")(_binary(_floordiv))
register("executorch_prim::truediv.Scalar")(_binary(_truediv))
register("executorch_prim::floordiv.int")(_binary(_trunc_div))
register("executorch_prim::mod.int", "executorch_prim::mod.Scalar")(_binary(_trunc_mod))
register("executorch_prim::sym_max.Scalar")(_binary(max))
register("executorch_prim::sym_min.Scalar")(_binary(min))
register("executorch_prim::eq.Scalar")(_inline("{0} == {1}", 2))
register("executorch_prim::gt.Scalar")(_inline("{0} > {1}", 2))
register("executorch_prim::lt.Scalar")(_inline("{0} < {1}", 2))
register("executorch_prim::ge.Scalar")(_inline("{0} >= {1}", 2))
register("executorch_prim::le.Scalar")(_inline("{0} <= {1}", 2))
register("executorch_prim::neg.Scalar")(_inline("-{0}", 1))
register("executorch_prim::sym_not.Scalar")(_unary(_sym_not))
register("executorch_prim::sym_float.Scalar")(_unary(_sym_float))
register("executorch_prim::sym_int.Scalar")(_unary(_sym_int))
register("executorch_prim::ceil.Scalar")(_unary(math.ceil))
register("executorch_prim::trunc.Scalar")(_unary(math.trunc))
register("executorch_prim::round.Scalar")(_unary(_round_even))
register("executorch_prim::sym_ite.Scalar")(_inline("({1} if {0} else {2})", 3))

# Symbolic size ops (ExecuTorch registers them as prim ops; these avoid a dispatcher call).
register("aten::sym_size.int")(_inline("{0}.size({1})", 2))
register("aten::sym_numel", "aten::sym_numel.default")(_inline("{0}.numel()", 1))
register("aten::sym_stride.int")(_inline("{0}.stride({1})", 2))
register("aten::sym_storage_offset", "aten::sym_storage_offset.default")(_inline("0", 1))
register("aten::_local_scalar_dense", "aten::_local_scalar_dense.default")(_inline("{0}.item()", 1))


def _view(src: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """``src`` with new sizes; a copy only when its strides cannot be viewed that way."""
    try:
        return src.view(sizes)
    except RuntimeError:
        return src.reshape(sizes)


@register("executorch_prim::et_view.default", "executorch_prim::et_view")
def _et_view(ctx: KernelContext) -> Emission:
    """``out`` aliases ``self`` with new sizes (one -1 inferred), no copy."""
    _arity(ctx, 3)
    src, sizes, out = ctx.args
    f = ctx.bind(_view, "f")
    return ctx.emit(
        f"v[{out}] = {f}({ctx.expr(src)}, {ctx.expr(sizes)})", writes=(out,), mutates=()
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
def _et_copy_index(ctx: KernelContext) -> Emission:
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
