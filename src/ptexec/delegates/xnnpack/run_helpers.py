"""The functions the generated code calls, and the namespace it runs in (:data:`HELPERS`)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ...memory import resize_to
from . import quant as qa
from .values import ArgInfo

__all__ = ["HELPERS", "OutputShapeError"]


def _fq(t: torch.Tensor, inv: float, lo: int, hi: int) -> torch.Tensor:
    """Float values -> centered int8 as XNNPACK's float-to-int8 Convert computes them:
    ``round(t * inv)`` (to nearest even, by the float32 reciprocal of the scale) clamped
    to ``[lo, hi]`` (the bounds less the zero point); NaN saturates to ``hi``, as +inf
    does (its x86 kernels clamp with a minimum that gives the bound for NaN)."""
    return torch.round(t * inv).clamp_(lo, hi).nan_to_num_(nan=float(hi))


def _fq_(t: torch.Tensor, inv: float, lo: int, hi: int) -> torch.Tensor:
    """:func:`_fq` in place, for a tensor nothing else refers to."""
    return t.mul_(inv).round_().clamp_(lo, hi).nan_to_num_(nan=float(hi))


class OutputShapeError(RuntimeError):
    """The graph computed an output the program's output tensor cannot hold (the method
    reports it as an :class:`~ptexec.errors.ExecutionError` of the delegate call)."""


def _resize(
    x: torch.Tensor,
    phys: Sequence[int],
    order: tuple[int, ...],
    arg: ArgInfo | None = None,
    k: int = -1,
) -> None:
    """Resize output ``x`` (delegate argument ``k``) to the shape XNNPACK computed
    (``phys``, in dim order), if its declaration ``arg`` allows that shape: a static
    output keeps its sizes, a bounded one stays within its bound in every dim, and the
    rank is fixed."""
    if len(phys) != len(order):
        raise OutputShapeError(
            f"delegate argument {k}: the graph computed {len(phys)} dims {list(phys)} for a "
            f"{len(order)}-d output"
        )
    logical = [0] * len(order)
    for j, d in enumerate(order):
        logical[d] = phys[j]
    if arg is not None and arg.sizes is not None and (arg.static or arg.bounded):
        declared = f"{str(arg.dtype).removeprefix('torch.')}{list(arg.sizes)}"
        if arg.static:
            raise OutputShapeError(
                f"delegate argument {k}: the graph computed {logical}, the program declares {declared}"
            )
        if any(a > b for a, b in zip(logical, arg.sizes, strict=True)):
            raise OutputShapeError(
                f"delegate argument {k}: the graph computed {logical}, beyond the bound "
                f"{declared} the program declares"
            )
    try:
        resize_to(x, logical, order)
    except RuntimeError:
        n = 1
        for d in logical:
            n *= d
        x.resize_(n)
        resize_to(x, logical, order)


def _argmax_pool(
    x: torch.Tensor, kh: int, kw: int, pads: tuple[int, int, int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """XNNPACK argmax pooling on NHWC ``x``: stride = window; the index is the position
    of the (first) maximum inside its window."""
    top, right, bottom, left = pads
    xc = x.permute(0, 3, 1, 2)
    if any(pads):
        xc = F.pad(xc, (left, right, top, bottom), value=-math.inf)
    n, c, h, w = xc.shape
    oh, ow = h // kh, w // kw
    win = xc[:, :, : oh * kh, : ow * kw].reshape(n, c, oh, kh, ow, kw)
    win = win.permute(0, 2, 4, 1, 3, 5).reshape(n, oh, ow, c, kh * kw)
    values, index = win.max(dim=-1)
    return values, index.to(torch.int32)


def _max_pool(
    x: torch.Tensor,
    k: tuple[int, int],
    st: tuple[int, int],
    pads: tuple[int, int, int, int],
    dil: tuple[int, int],
) -> torch.Tensor:
    top, right, bottom, left = pads
    xc = x.permute(0, 3, 1, 2)
    xc = F.pad(xc, (left, right, top, bottom), value=-math.inf)
    return F.max_pool2d(xc, k, st, 0, dil).permute(0, 2, 3, 1)


def _avg_pool(
    x: torch.Tensor, k: tuple[int, int], st: tuple[int, int], pads: tuple[int, int, int, int]
) -> torch.Tensor:
    """Average over the valid (unpadded) elements of each window."""
    top, right, bottom, left = pads
    xc = F.pad(x.permute(0, 3, 1, 2), (left, right, top, bottom))
    ones = F.pad(torch.ones_like(x[:1, :, :, :1]).permute(0, 3, 1, 2), (left, right, top, bottom))
    total = F.avg_pool2d(xc, k, st, 0, divisor_override=1)
    count = F.avg_pool2d(ones, k, st, 0, divisor_override=1)
    return (total / count).permute(0, 2, 3, 1)


HELPERS: dict[str, Any] = {
    # the repr of every float is a name here: a parameter may be infinite or NaN
    "inf": math.inf,
    "nan": math.nan,
    "torch": torch,
    "F": F,
    "_fq": _fq,
    "_fq_": _fq_,
    "_qd8": qa.quantize_rows,
    "_qd_values": qa.rows_values,
    "_qd_linear": qa.rows_linear_int,
    "_qd_linear_f": qa.rows_linear_float,
    "_qd_scale": qa.rows_conv_scale,
    "_rq": qa.requantize_,
    "_qadd": qa.add,
    "_qmul": qa.mul,
    "_qcvt": qa.convert,
    "_lut": qa.lookup,
    "_slow_conv2d": torch.ops.aten._slow_conv2d_forward,
    "_slow_deconv2d": torch.ops.aten.slow_conv_transpose2d,
    "_resize": _resize,
    "_argmax_pool": _argmax_pool,
    "_max_pool": _max_pool,
    "_avg_pool": _avg_pool,
    "_now": time.perf_counter_ns,  # the timed variant's clock (run_nodes)
}
