"""The values table of a method: every value of its plan as what runs on it.

Planned tensors become views of their buffer (initialised from the file's mutable data
segment or the external data file when the buffer is new), constants views of the
program's bytes (moved to their device when it is not the CPU), unplanned tensors that are
not inputs get memory of their own on their device, scalars their value, and int lists
tuples of their items. Unplanned inputs and the lists a kernel renders per use are None.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..dtypes import CODE_TO_DTYPE
from ..errors import LimitExceededError, PteFormatError
from ..format import program as p
from ..format.scalar_type import scalar_type_name
from ..memory import PlannedBuffer, fixed_empty, strided_view
from ..tensor import dim_order_strides
from .devices import DeviceMap, check_device_available

if TYPE_CHECKING:
    from ..program import Program

__all__ = ["build_values", "tensor_dtype"]

# torch's quantized dtypes: a tensor of one needs quantizer parameters a program lacks
_QUANTIZED = frozenset({torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4})


def tensor_dtype(t: p.Tensor, path: str) -> torch.dtype:
    """The torch dtype of program tensor ``t``; a :class:`PteFormatError` for scalar types
    ptexec cannot hold."""
    dtype = CODE_TO_DTYPE.get(t.scalar_type)
    if dtype is None:
        raise PteFormatError(
            f"{path}.scalar_type", f"{scalar_type_name(t.scalar_type)} has no torch dtype"
        )
    if dtype in _QUANTIZED:
        raise PteFormatError(
            f"{path}.scalar_type",
            f"{scalar_type_name(t.scalar_type)} is a quantized type whose scale and zero "
            "point a program does not carry; ptexec does not run such tensors",
        )
    return dtype


def _from_bytes(
    program: Program, data: memoryview, t: p.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    strides = dim_order_strides(t.sizes, t.dim_order)
    if t.nbytes == 0:
        return torch.empty_strided(t.sizes, strides, dtype=dtype)
    raw = program.tensor_from_memory(data)
    if raw.data_ptr() % dtype.itemsize:
        raw = raw.clone()  # misaligned in the file: one copy, rather than a bad view
    return raw.view(dtype).as_strided(t.sizes, strides)


def build_values(
    program: Program,
    plan: p.ExecutionPlan,
    path: str,
    dmap: DeviceMap,
    buffers: list[PlannedBuffer],
    fresh: set[int],
    max_unplanned_bytes: int,
) -> list[Any]:
    """The values table of ``plan`` (module docstring). ``fresh``: buffers allocated for
    this method (their state is initialised); unplanned tensors of bounded shape may take
    at most ``max_unplanned_bytes`` together."""
    pte = program.pte
    name = plan.name
    by_id = {b.info.index: b for b in buffers}
    inputs = set(plan.inputs)
    values: list[Any] = []
    unplanned_bytes = 0
    for j, value in enumerate(plan.values):
        if not isinstance(value, p.Tensor):
            if isinstance(value, p.Int | p.Bool | p.Double | p.String):
                values.append(value.value)
            elif isinstance(value, p.DoubleList | p.BoolList):
                values.append(value.items)
            else:  # None, and IntList, TensorList, OptionalTensorList: rendered per use
                values.append(None)
            continue
        tpath = f"{path}.values[{j}].tensor"
        dtype = tensor_dtype(value, tpath)
        device = dmap.label(value)
        alloc = value.allocation_info
        if alloc is not None:
            buf = by_id[alloc.memory_id]
            view = strided_view(
                buf.data,
                alloc.memory_offset,
                dtype,
                value.sizes,
                value.dim_order,
                f"{tpath}.allocation_info",
            )
            if alloc.memory_id in fresh:
                if value.is_external:
                    init = program.external_bytes(value, tpath)
                    view.copy_(_from_bytes(program, init, value, dtype))
                elif value.data_buffer_idx > 0:
                    init = pte.mutable_initial_value(value.data_buffer_idx, value.nbytes)
                    view.copy_(_from_bytes(program, init, value, dtype))
            values.append(view)
        elif value.is_constant:
            if value.is_external:
                data = program.external_bytes(value, tpath)
            else:
                data = pte.constant(value.data_buffer_idx, value.nbytes)
            const = _from_bytes(program, data, value, dtype)
            if not device.is_cpu:
                check_device_available(device, name, f"constant {j}")
                const = const.to(device.to_torch())
            values.append(const)
        elif j in inputs:
            values.append(None)
        else:
            # unplanned, not an input: the runtime provides memory on its device
            check_device_available(device, name, f"unplanned tensor {j}")
            unbound = value.shape_dynamism == p.DYNAMIC_UNBOUND
            if unbound:
                sizes = tuple(0 for _ in value.sizes)
            else:
                sizes = value.sizes
                unplanned_bytes += value.nbytes
            if unplanned_bytes > max_unplanned_bytes:
                raise LimitExceededError(
                    f"method '{name}' needs more than max_planned_bytes="
                    f"{max_unplanned_bytes} for its unplanned tensors"
                )
            # bounded shapes get memory that cannot grow; unbound ones must grow
            empty = torch.empty_strided if unbound else fixed_empty
            values.append(
                empty(
                    sizes,
                    dim_order_strides(sizes, value.dim_order),
                    dtype=dtype,
                    device=device.to_torch(),
                )
            )
    for j, value in enumerate(plan.values):
        if isinstance(value, p.IntList):
            values[j] = tuple(values[i] for i in value.items)
    return values
