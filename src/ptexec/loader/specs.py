"""How a method's inputs are bound and its outputs collected: one spec per input/output."""

from __future__ import annotations

from typing import Any

import torch

from ..device import CPU, Device
from ..errors import PteFormatError
from ..format import program as p
from ..format.lru import Key, Lru
from ..tensor import TensorInfo
from .devices import DeviceMap
from .meta import ScalarInfo, ValueInfo, scalar_kind, tensor_info

__all__ = ["InputSpec", "OutputSpec", "clear_specs", "io_specs"]


class InputSpec:
    """How input ``index`` (value ``slot``) is bound: its description, and for a tensor the
    planned view it is copied into (None: the caller's memory is used in place)."""

    __slots__ = (
        "device",
        "dim_order",
        "dtype",
        "fast_shape",
        "index",
        "info",
        "kind",
        "planned",
        "scalar",
        "scratch",
        "slot",
        "torch_device",
        "view",
        "written",
    )

    def __init__(self, index: int, slot: int) -> None:
        self.index = index
        self.slot = slot
        self.kind = "tensor"  # or the scalar kind: int, float, bool, str, none
        self.written = False  # an instruction writes the input's memory in place
        self.info: TensorInfo | None = None
        self.scalar: Any = None  # the traced value of a scalar input
        self.view: torch.Tensor | None = None  # planned view (planned inputs)
        self.planned = False  # a planned input (its view is the planned tensor)
        self.scratch: torch.Tensor | None = None  # reused copy target (unplanned, converted)
        self.dtype: torch.dtype | None = None
        self.fast_shape: tuple[int, ...] | None = None  # exact static shape, if any
        self.torch_device: torch.device | None = None
        self.device: Device = CPU
        self.dim_order: tuple[int, ...] = ()


class OutputSpec:
    """Output ``index`` (value ``slot``): its description, whether the program plans its
    memory, and the memory the method gives an unplanned one between calls."""

    __slots__ = ("default", "index", "info", "kind", "planned", "slot")

    def __init__(self, index: int, slot: int) -> None:
        self.index = index
        self.slot = slot
        self.kind = "tensor"
        self.info: ValueInfo | None = None
        self.planned = False
        self.default: torch.Tensor | None = None


# the specs of a plan under a device map, as made over no values table (the decoded plan
# is shared by the loads of the same bytes): each load copies them over its own table
_kept: Lru[tuple[p.ExecutionPlan, tuple[InputSpec, ...], tuple[OutputSpec, ...]]] = Lru(256, 0)


def clear_specs() -> None:
    """Forget the kept specs."""
    _kept.clear()


def io_specs(
    plan: p.ExecutionPlan, path: str, values: list[Any], dmap: DeviceMap
) -> tuple[list[InputSpec], list[OutputSpec]]:
    """The input and output specs of ``plan``, over its values table ``values`` (new
    objects every call: a method writes its own)."""
    key = Key(id(plan), dmap.key)
    hit = _kept.get(key)
    if hit is not None and hit[0] is plan:
        return [_input_over(s, values) for s in hit[1]], [_output_over(o, values) for o in hit[2]]
    inputs, outputs = _io_specs(plan, path, values, dmap)
    kept_inputs = tuple(_input_over(s, None) for s in inputs)
    kept_outputs = tuple(_output_over(o, None) for o in outputs)
    _kept.put(key, (plan, kept_inputs, kept_outputs))  # the plan kept alive: its id its own
    return inputs, outputs


def _input_over(spec: InputSpec, values: list[Any] | None) -> InputSpec:
    """A new spec as ``spec``, over ``values`` (None: over none: no view, no scalar)."""
    new = InputSpec(spec.index, spec.slot)
    new.kind = spec.kind
    new.info = spec.info
    new.dtype = spec.dtype
    new.fast_shape = spec.fast_shape
    new.torch_device = spec.torch_device
    new.device = spec.device
    new.dim_order = spec.dim_order
    if values is not None:
        if spec.kind != "tensor":
            new.scalar = values[spec.slot]
        elif spec.planned:
            new.view = values[spec.slot]
    new.planned = spec.planned
    return new


def _output_over(spec: OutputSpec, values: list[Any] | None) -> OutputSpec:
    """A new spec as ``spec``, over ``values`` (None: over none: no default memory)."""
    new = OutputSpec(spec.index, spec.slot)
    new.kind = spec.kind
    new.info = spec.info
    new.planned = spec.planned
    if values is not None and spec.kind == "tensor" and not spec.planned:
        new.default = values[spec.slot]
    return new


def _io_specs(
    plan: p.ExecutionPlan, path: str, values: list[Any], dmap: DeviceMap
) -> tuple[list[InputSpec], list[OutputSpec]]:
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
                spec.planned = True
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
