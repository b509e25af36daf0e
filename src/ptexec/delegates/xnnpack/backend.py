"""The ``XnnpackBackend`` factory: one ``DelegateCall`` -> one statement calling a runner."""

from __future__ import annotations

import torch

from ...dtypes import CODE_TO_DTYPE
from ...errors import BackendUnavailableError, PteFormatError
from ...format import program as p
from ...kernels.registry import Emission
from .. import DelegateContext
from .runtime import ArgInfo, build_runner
from .schema import decode_payload

__all__ = ["prepare"]


def _device(ctx: DelegateContext) -> torch.device:
    """Where the delegate's tensors live: the device of its first tensor argument (planned,
    preallocated, or an unplanned input the caller passes on the method's device)."""
    for slot in ctx.args:
        device = ctx.device_of(slot)
        if device is not None:
            return device.to_torch()
    return torch.device("cpu")


def _arg_infos(ctx: DelegateContext, where: str) -> list[ArgInfo | None]:
    infos: list[ArgInfo | None] = []
    for k, slot in enumerate(ctx.args):
        if not 0 <= slot < len(ctx.values):
            raise PteFormatError(f"{where}.args[{k}]", f"value index {slot} out of range")
        value = ctx.values[slot]
        if isinstance(value, p.Tensor):
            dtype = CODE_TO_DTYPE.get(value.scalar_type)
            if dtype is None:
                raise BackendUnavailableError(
                    f"{where}: argument {k} has scalar type {value.scalar_type}"
                )
            infos.append(ArgInfo(dtype, tuple(value.dim_order)))
        else:
            infos.append(None)
    return infos


def prepare(ctx: DelegateContext) -> Emission:
    """Decode, validate and compile the payload; emit ``_run(v[a], v[b], ...)``."""
    method = ctx.method_name
    where = (
        f"{method}.delegates[{ctx.delegate_index}]"
        if method
        else f"delegates[{ctx.delegate_index}]"
    )
    payload = decode_payload(ctx.processed, f"{where}.payload")
    runner = build_runner(payload, ctx.named_data, _arg_infos(ctx, where), _device(ctx))
    name = ctx.bind(runner.fn, "xnnpack")
    args = ", ".join(f"v[{ctx.args[k]}]" for k in runner.ext_ids)
    outs = tuple(ctx.args[k] for k in runner.output_ids)
    # the outputs are written in place (resized first) and never read
    return ctx.emit(f"{name}({args})", mutates=outs, outs=outs)
