"""``dim_order_ops::``: copies that convert dtype and dim order, and empty outputs.

``_to_dim_order_copy`` / ``_clone_dim_order`` copy ``self`` into ``out`` converting the
dtype and the layout: ``out`` is a view with the program's dim order, and ``copy_`` respects
both sides' strides. ``_empty_dim_order`` only sizes its output.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..format import program as p
from ..memory import resize_to
from .registry import Alias, KernelContext, Statement, UnsupportedKernel, register

__all__: list[str] = []


def _is_static(value: p.EValue) -> bool:
    return isinstance(value, p.Tensor) and value.shape_dynamism == p.STATIC


def _copy_resizing(src: torch.Tensor, out: torch.Tensor, dim_order: Sequence[int]) -> None:
    if out.shape != src.shape:
        resize_to(out, src.shape, dim_order)
    out.copy_(src)


def _copy_statement(ctx: KernelContext, src: int, out: int) -> Statement:
    out_value = ctx.values[out]
    if not isinstance(out_value, p.Tensor):
        raise UnsupportedKernel(f"{ctx.op_name}: output value {out} is not a tensor")
    src_value = ctx.values[src]
    alias = None
    if isinstance(src_value, p.Tensor) and src_value.scalar_type == out_value.scalar_type:
        alias = Alias(f"v[{out}] = v[{src}]", {}, src, (out,), (src,))  # same dtype: a clone
    # the copy has its source's sizes
    if _is_static(out_value) and _is_static(src_value):
        return ctx.emit(
            f"v[{out}].copy_(v[{src}])",
            mutates=(out,),
            alias=alias,
            outs=(out,),
            pure=True,
            sized=True,
        )
    f = ctx.bind(_copy_resizing, "f")
    order = ctx.bind(tuple(out_value.dim_order), "order")
    return ctx.emit(
        f"{f}(v[{src}], v[{out}], {order})",
        mutates=(out,),
        alias=alias,
        outs=(out,),
        pure=True,
        sized=True,
    )


@register("dim_order_ops::_to_dim_order_copy.out", "dim_order_ops::_clone_dim_order.out")
def _to_dim_order_copy(ctx: KernelContext) -> Statement:
    # (self, *, non_blocking=False, dim_order=None, out) -> out
    if len(ctx.args) not in (4, 5):
        raise UnsupportedKernel(
            f"{ctx.op_name}: expected 5 values, the program passes {len(ctx.args)}"
        )
    return _copy_statement(ctx, ctx.args[0], ctx.args[3])


@register("dim_order_ops::_empty_dim_order.out")
def _empty_dim_order(ctx: KernelContext) -> Statement:
    # (int[] size, *, int[]? dim_order=None, Tensor(a!) out) -> out
    if len(ctx.args) not in (3, 4):
        raise UnsupportedKernel(
            f"{ctx.op_name}: expected 4 values, the program passes {len(ctx.args)}"
        )
    size, _, out = ctx.args[:3]
    out_value = ctx.values[out]
    if not isinstance(out_value, p.Tensor):
        raise UnsupportedKernel(f"{ctx.op_name}: output value {out} is not a tensor")
    if _is_static(out_value):
        return ctx.emit("pass", mutates=())
    f = ctx.bind(resize_to, "f")
    order = ctx.bind(tuple(out_value.dim_order), "order")
    # sized by the size list
    return ctx.emit(
        f"{f}(v[{out}], {ctx.expr(size)}, {order})", mutates=(out,), outs=(out,), sized=True
    )
