"""``et_copy::_h2d_copy.out`` / ``_d2h_copy.out``: copies between the host and a device.

The copy goes to the device of ``out`` (a view on the program's device, or on the device
``device_map`` chose), and its bytes are counted in the method's
:class:`~ptexec.accounting.CallRecord`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..format import program as p
from ..memory import resize_to
from .registry import KernelContext, Statement, UnsupportedKernel, register

__all__: list[str] = []


def _device_copy(
    src: torch.Tensor, out: torch.Tensor, dim_order: Sequence[int], record: object
) -> None:
    if out.shape != src.shape:
        resize_to(out, src.shape, dim_order)
    out.copy_(src)
    record.count(src, out, src.nbytes)  # type: ignore[attr-defined]


@register("et_copy::_h2d_copy.out", "et_copy::_d2h_copy.out")
def _et_copy(ctx: KernelContext) -> Statement:
    # (Tensor self, *, Tensor(a!) out) -> out
    if len(ctx.args) not in (2, 3):
        raise UnsupportedKernel(
            f"{ctx.op_name}: expected 3 values, the program passes {len(ctx.args)}"
        )
    src, out = ctx.args[:2]
    out_value = ctx.values[out]
    if not isinstance(out_value, p.Tensor):
        raise UnsupportedKernel(f"{ctx.op_name}: output value {out} is not a tensor")
    f = ctx.bind(_device_copy, "f")
    order = ctx.bind(tuple(out_value.dim_order), "order")
    rec = ctx.bind(ctx.record if ctx.record is not None else _NullRecord(), "rec")
    return ctx.emit(f"{f}(v[{src}], v[{out}], {order}, {rec})", mutates=(out,), outs=(out,))


class _NullRecord:
    def count(self, src: torch.Tensor, dst: torch.Tensor, nbytes: int) -> None:
        pass
