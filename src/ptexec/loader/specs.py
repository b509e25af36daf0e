"""How a method's inputs are bound and its outputs collected: one spec per input/output."""

from __future__ import annotations

from typing import Any

from ..engine.state import InputSpec, OutputSpec
from ..errors import PteFormatError
from ..format import program as p
from .devices import DeviceMap
from .meta import ScalarInfo, scalar_kind, tensor_info

__all__ = ["io_specs"]


def io_specs(
    plan: p.ExecutionPlan, path: str, values: list[Any], dmap: DeviceMap
) -> tuple[list[InputSpec], list[OutputSpec]]:
    """The input and output specs of ``plan``, over its values table ``values``."""
    inputs = []
    for i, slot in enumerate(plan.inputs):
        value = plan.values[slot]
        spec = InputSpec(i, slot)
        if isinstance(value, p.Tensor):
            info = tensor_info(value, dmap)
            spec.info = info
            spec.dtype = info.dtype
            spec.device = info.device
            spec.torch_device = info.device.to_torch()
            spec.dim_order = value.dim_order
            # the fast path binds exact static shapes with elements (EMPTY goes the slow way)
            spec.fast_shape = (
                value.sizes if value.shape_dynamism == p.STATIC and value.numel else None
            )
            if value.allocation_info is not None:
                spec.view = values[slot]
            elif value.is_constant:
                raise PteFormatError(
                    f"{path}.inputs[{i}]", f"input {i} (value {slot}) is a constant"
                )
        else:
            spec.kind = scalar_kind(value)
            if spec.kind not in ("int", "float", "bool", "str", "none"):
                raise PteFormatError(
                    f"{path}.inputs[{i}]", f"an input of kind {spec.kind} is not supported"
                )
            spec.scalar = values[slot]
        inputs.append(spec)
    input_slots = set(plan.inputs)
    outputs = []
    for k, slot in enumerate(plan.outputs):
        value = plan.values[slot]
        out = OutputSpec(k, slot)
        if isinstance(value, p.Tensor):
            out.info = tensor_info(value, dmap)
            out.planned = value.is_memory_planned or slot in input_slots
            if not out.planned:
                out.default = values[slot]
        else:
            out.kind = scalar_kind(value)
            out.info = ScalarInfo(
                out.kind, values[slot] if not isinstance(value, p.IntList) else None
            )
        outputs.append(out)
    return inputs, outputs
