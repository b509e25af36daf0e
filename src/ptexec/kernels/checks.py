"""Load-time checks of kernel arguments that torch's kernels trust.

ExecuTorch's kernels check their arguments against their tensors on every call; torch's
out variants, called with a program's tensors, mostly do too, but a few read or allocate
by arguments alone: batch norm reads ``C`` elements of each statistic whatever its size,
and a generated convolution allocates its full result from the strides and paddings
before anything compares it with ``out``. A hostile file can set those freely, so for
these operators the arguments are checked against the tensors' sizes (their upper
bounds) when the method loads, and a mismatch is a :class:`PteFormatError` at the
instruction's path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from math import prod

from ..errors import PteFormatError
from ..format import program as p
from .registry import KernelContext

__all__ = ["check_arguments"]

Check = Callable[[KernelContext], None]
_CHECKS: dict[str, Check] = {}


def check_arguments(ctx: KernelContext) -> None:
    """Raise :class:`PteFormatError` when ``ctx``'s arguments cannot fit its tensors."""
    check = _CHECKS.get(ctx.op_name)
    if check is not None:
        check(ctx)


def _fail(ctx: KernelContext, message: str) -> None:
    raise PteFormatError(ctx.where, f"{ctx.op_name}: {message}")


def _tensor(ctx: KernelContext, k: int) -> p.Tensor | None:
    v = ctx.values[ctx.args[k]]
    return v if isinstance(v, p.Tensor) else None


def _ints(ctx: KernelContext, k: int) -> tuple[int, ...] | None:
    """A literal int list argument (None when it is computed at run time)."""
    index = ctx.args[k]
    if not isinstance(ctx.values[index], p.IntList) or not ctx.is_literal(index):
        return None
    return tuple(int(x) for x in ctx.literal(index))


def _int(ctx: KernelContext, k: int) -> int | None:
    index = ctx.args[k]
    if not isinstance(ctx.values[index], p.Int) or not ctx.is_literal(index):
        return None
    return int(ctx.literal(index))


def _register(*names: str) -> Callable[[Check], Check]:
    def deco(fn: Check) -> Check:
        for name in names:
            _CHECKS[name] = fn
        return fn

    return deco


def _per_channel(ctx: KernelContext, channels: int, positions: Sequence[int], what: str) -> None:
    for k in positions:
        t = _tensor(ctx, k)
        if t is not None and t.numel != channels:
            _fail(
                ctx,
                f"{what} argument {k} has {t.numel} elements, the input has {channels} channels",
            )


@_register(
    "aten::_native_batch_norm_legit_no_training.out",
    "aten::_native_batch_norm_legit.out",
    "aten::native_batch_norm.out",
)
def _batch_norm(ctx: KernelContext) -> None:
    x = _tensor(ctx, 0)
    if x is None or len(x.sizes) < 2:
        _fail(ctx, "the input must be a tensor of rank 2 or more")
        return
    # (input, weight?, bias?, running_mean, running_var, ...): statistics are per channel
    _per_channel(ctx, x.sizes[1], (1, 2, 3, 4), "a per-channel")


@_register("aten::_native_batch_norm_legit.no_stats_out")
def _batch_norm_no_stats(ctx: KernelContext) -> None:
    x = _tensor(ctx, 0)
    if x is None or len(x.sizes) < 2:
        _fail(ctx, "the input must be a tensor of rank 2 or more")
        return
    _per_channel(ctx, x.sizes[1], (1, 2), "a per-channel")


@_register("aten::native_layer_norm.out")
def _layer_norm(ctx: KernelContext) -> None:
    x = _tensor(ctx, 0)
    shape = _ints(ctx, 1)
    if x is None or shape is None:
        return
    n = len(shape)
    if n > len(x.sizes) or tuple(x.sizes[len(x.sizes) - n :]) != shape:
        _fail(ctx, f"normalized shape {list(shape)} does not end the input's sizes {list(x.sizes)}")
    _per_channel(ctx, prod(shape), (2, 3), "an affine")


@_register("aten::native_group_norm.out")
def _group_norm(ctx: KernelContext) -> None:
    x = _tensor(ctx, 0)
    c = _int(ctx, 4)  # (input, weight?, bias?, N, C, HxW, group, eps)
    if x is None or c is None or len(x.sizes) < 2:
        return
    if c != x.sizes[1]:
        _fail(ctx, f"C = {c}, the input has {x.sizes[1]} channels")
    _per_channel(ctx, c, (1, 2), "an affine")


@_register("aten::convolution.out")
def _convolution(ctx: KernelContext) -> None:
    # (input, weight, bias?, stride, padding, dilation, transposed, output_padding, groups)
    x, w, out = _tensor(ctx, 0), _tensor(ctx, 1), _tensor(ctx, 9)
    stride, padding, dilation = _ints(ctx, 3), _ints(ctx, 4), _ints(ctx, 5)
    output_padding, groups = _ints(ctx, 7), _int(ctx, 8)
    index = ctx.args[6]
    transposed = bool(ctx.literal(index)) if ctx.is_literal(index) else None
    if x is None or w is None or out is None:
        return
    spatial = len(x.sizes) - 2
    if spatial < 1 or len(w.sizes) != len(x.sizes) or len(out.sizes) != len(x.sizes):
        _fail(
            ctx,
            f"input {list(x.sizes)}, weight {list(w.sizes)} and output {list(out.sizes)} do not fit a convolution",
        )
    if None in (stride, padding, dilation, output_padding, groups, transposed):
        return
    assert stride is not None and padding is not None and dilation is not None
    assert output_padding is not None and groups is not None
    for label, values in (
        ("stride", stride),
        ("padding", padding),
        ("dilation", dilation),
        ("output padding", output_padding),
    ):
        if len(values) not in (1, spatial) and not (label == "output padding" and not values):
            _fail(ctx, f"{label} {list(values)} has neither 1 nor {spatial} entries")
    if groups < 1 or any(s < 1 for s in stride) or any(d < 1 for d in dilation):
        _fail(
            ctx,
            f"stride {list(stride)}, dilation {list(dilation)} and groups {groups} must be positive",
        )
    if any(q < 0 for q in padding) or any(q < 0 for q in output_padding):
        _fail(
            ctx,
            f"padding {list(padding)} and output padding {list(output_padding)} must not be negative",
        )

    def arg(values: tuple[int, ...], d: int) -> int:
        return values[d] if len(values) > 1 else values[0]

    expected = [x.sizes[0], w.sizes[1] * groups if transposed else w.sizes[0]]
    for d in range(spatial):
        size, k = x.sizes[2 + d], w.sizes[2 + d]
        s, q, dil = arg(stride, d), arg(padding, d), arg(dilation, d)
        if transposed:
            extra = arg(output_padding, d) if output_padding else 0
            n = (size - 1) * s - 2 * q + dil * (k - 1) + extra + 1
        else:
            n = (size + 2 * q - dil * (k - 1) - 1) // s + 1
        expected.append(n)
    bound = tuple(out.sizes)
    if out.shape_dynamism == p.STATIC and x.shape_dynamism == p.STATIC:
        if tuple(expected) != bound:
            _fail(
                ctx,
                f"these arguments give an output of {expected}, the program plans {list(bound)}",
            )
    elif any(e > b for e, b in zip(expected, bound, strict=True)):
        _fail(
            ctx,
            f"these arguments give an output of {expected}, over the planned bound {list(bound)}",
        )


@_register("aten::expand_copy.out")
def _expand(ctx: KernelContext) -> None:
    size, out = _ints(ctx, 1), _tensor(ctx, 3)
    if size is None or out is None:
        return
    if len(size) != len(out.sizes) or any(
        s > b and s != -1 for s, b in zip(size, out.sizes, strict=True)
    ):
        _fail(ctx, f"expands to {list(size)}, the program plans {list(out.sizes)}")
