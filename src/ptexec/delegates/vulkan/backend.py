"""The ``VulkanBackend`` factory: one ``DelegateCall`` -> one statement calling its runner.

The payload is decoded and validated against the call at load (:mod:`.schema`: every id,
kind, constant range and op name; :mod:`.runtime`: every argument against its op's schema,
every value's dims against what the graph computes from the program's input shapes, and
the external values against the call's tensors), then compiled to one generated function
(:func:`.runtime.build_runner`) that runs on the device of the call's tensors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ...dtypes import CODE_TO_DTYPE
from ...errors import BackendUnavailableError, PteFormatError
from ...format import program as p
from ...kernels.registry import Statement
from ..registry import DelegateContext
from .runtime import ArgInfo, VulkanRunner, build_runner
from .schema import decode_payload

__all__ = ["arg_infos", "prepare", "runner_for"]


def _device(ctx: DelegateContext) -> torch.device:
    """The device of the call's first tensor argument (the CPU when it has none)."""
    for slot in ctx.args:
        device = ctx.device_of(slot)
        if device is not None:
            return device.to_torch()
    return torch.device("cpu")


def arg_infos(values: Sequence[object], args: Sequence[int], where: str) -> list[ArgInfo | None]:
    """The program's description of each argument of a call (None: neither a tensor nor
    an integer)."""
    infos: list[ArgInfo | None] = []
    for k, slot in enumerate(args):
        if not 0 <= slot < len(values):
            raise PteFormatError(f"{where}.args[{k}]", f"value index {slot} out of range")
        value = values[slot]
        if isinstance(value, p.Tensor):
            dtype = CODE_TO_DTYPE.get(value.scalar_type)
            if dtype is None:
                raise BackendUnavailableError(
                    f"{where}: argument {k} has scalar type {value.scalar_type}"
                )
            infos.append(
                ArgInfo(
                    dtype,
                    tuple(value.sizes),
                    value.shape_dynamism == p.STATIC,
                    value.shape_dynamism == p.DYNAMIC_BOUND,
                    dim_order=tuple(value.dim_order),
                )
            )
        elif isinstance(value, p.Int):
            infos.append(ArgInfo(torch.int64, (value.value,), scalar=True))
        else:
            infos.append(None)
    return infos


def runner_for(
    data: memoryview,
    named_data: Mapping[str, memoryview],
    values: Sequence[object],
    args: Sequence[int],
    where: str,
    device: torch.device,
    traced: bool = False,
) -> VulkanRunner:
    """Decode, validate and compile one delegate's payload (``traced``: for the compiled
    tier, :func:`.runtime.build_runner`)."""
    payload = decode_payload(data, f"{where}.payload")
    return build_runner(payload, named_data, arg_infos(values, args, where), device, traced)


def _where(ctx: DelegateContext) -> str:
    method = ctx.method_name.replace("\0", "\\x00") if ctx.method_name else ""
    return (
        f"{method}.delegates[{ctx.delegate_index}]"
        if method
        else f"delegates[{ctx.delegate_index}]"
    )


def prepare(ctx: DelegateContext) -> Statement:
    """Decode, validate and compile the payload; emit ``_run(v[a], v[b], ...)``."""
    where = _where(ctx)
    runner = runner_for(ctx.processed, ctx.named_data, ctx.values, ctx.args, where, _device(ctx))
    name = ctx.bind(runner.fn, "vulkan")
    timed = ctx.bind(runner.run_nodes, "vulkan_ops")
    args = ", ".join(f"v[{slot}]" for slot in ctx.args)
    outs = tuple(ctx.args[k] for k in runner.output_ids)
    return ctx.emit(
        f"{name}({args})",
        mutates=outs,
        outs=outs,
        instrumented=ctx.node_timed(name, timed, args),
    )
