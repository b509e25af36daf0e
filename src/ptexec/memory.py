"""Planned memory: one byte buffer per planned buffer, on its device, and views into it.

A planned tensor is a strided view of ``buffer[offset : offset + nbytes]``: its dtype, its
sizes and the strides of its dim order. Views of one buffer overlap where the plan reuses
memory across lifetimes; that is the point of the plan.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.utils.dlpack

from .device import Device
from .errors import LimitExceededError, PteFormatError
from .tensor import dim_order_strides

__all__ = [
    "BufferInfo",
    "PlannedBuffer",
    "allocate",
    "check_aligned",
    "empty_maker",
    "fixed_empty",
    "fixed_storage",
    "resize_to",
    "strided_view",
]

# (dtype, device) -> the ``new`` of an empty tensor of them: calling it makes another empty
# tensor of that dtype on that device in one call, where ``torch.empty`` parses its options
_MAKERS: dict[tuple[torch.dtype, torch.device], Callable[[], torch.Tensor]] = {}


def empty_maker(dtype: torch.dtype, device: torch.device) -> Callable[[], torch.Tensor]:
    """A function returning a new empty tensor of ``dtype`` on ``device`` each call (as
    ``torch.empty(0, dtype=dtype, device=device)`` does, for less): what a view made
    with ``set_`` starts from."""
    found = _MAKERS.get((dtype, device))
    if found is None:
        found = _MAKERS.setdefault((dtype, device), torch.empty(0, dtype=dtype, device=device).new)
    return found


@dataclass(frozen=True, slots=True)
class BufferInfo:
    """One planned buffer of a method: its index (1-based, as in the file), size and device.

    ``device_source`` says where the device came from: ``"program"`` (its
    ``non_const_buffer_device`` entry, or the CPU when it has none), ``"tensors"`` (a buffer
    with no entry whose tensors all name another device: programs exported with
    ``enable_non_cpu_memory_planning=False``), or ``"device_map"``. ``shared`` marks state
    shared by all methods of the program.
    """

    index: int
    size: int
    device: Device
    device_source: str = "program"
    shared: bool = False

    def __str__(self) -> str:
        text = f"buffer {self.index}: {self.size} bytes on {self.device}"
        if self.device_source != "program":
            text += f" (device from {self.device_source})"
        if self.shared:
            text += " (shared by all methods)"
        return text


class PlannedBuffer:
    """The memory of one planned buffer."""

    __slots__ = ("data", "info")

    def __init__(self, info: BufferInfo, data: torch.Tensor) -> None:
        self.info = info
        self.data = data


_ALIGN = 64
# host buffers of this many bytes or more are memory maps (see allocate)
MAPPED_FROM = 64 << 10


def _fixed_bytes(nbytes: int, zeros: bool = False) -> torch.Tensor:
    """``nbytes`` of uninitialized (``zeros``: zero-filled) CPU memory whose storage cannot
    grow: an out= kernel asked to write more than the tensor holds raises instead of
    reallocating (a hostile shape would otherwise allocate without bound), as ExecuTorch
    refuses to resize past capacity."""
    import numpy as np

    try:
        raw = (np.zeros if zeros else np.empty)(nbytes + _ALIGN - 1, dtype=np.uint8)
    except MemoryError as e:
        raise _no_memory(nbytes, "host", e) from None
    start = -raw.ctypes.data % _ALIGN  # torch's own CPU allocations are 64-byte aligned
    return torch.from_numpy(raw[start : start + nbytes])


def allocate(info: BufferInfo) -> PlannedBuffer:
    """Allocate zero-filled memory for a planned buffer on its device, whose storage cannot
    be resized (on every device).

    Host buffers are anonymous memory maps: zero by definition, and a page costs resident
    memory only once something writes it (the parts of a plan that the dataflow rewrites
    made unnecessary never do); a small one (under :data:`MAPPED_FROM` bytes: a map
    costs more than filling it) is zero-filled memory of the heap. Their storage cannot
    be resized, so a kernel can never move planned memory.
    """
    size = max(info.size, 1)
    if info.device.is_cpu and size < MAPPED_FROM:
        data = _fixed_bytes(size, zeros=True)
    elif info.device.is_cpu:
        try:  # (a writable map: torch.frombuffer has no warning to give)
            mapped = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
        except (MemoryError, OSError) as e:
            raise _no_memory(size, "host", e) from None
        data = torch.frombuffer(mapped, dtype=torch.uint8)
    else:
        try:
            data = fixed_storage(
                torch.zeros(size, dtype=torch.uint8, device=info.device.to_torch())
            )
        except torch.OutOfMemoryError as e:
            raise _no_memory(size, str(info.device), e) from None
    return PlannedBuffer(info, data)


def fixed_storage(t: torch.Tensor) -> torch.Tensor:
    """``t``'s memory (any device) as a tensor whose storage cannot be resized, ``t`` kept
    alive with it: a kernel asked to write a planned view past its buffer raises instead
    of moving the whole buffer to new memory (where every view made of it would follow,
    but addresses taken before, a CUDA graph's say, would not). A DLPack capsule's memory
    is the caller's, so torch makes its storage of a fixed size."""
    return torch.utils.dlpack.from_dlpack(t.__dlpack__())


def _no_memory(nbytes: int, where: str, error: BaseException) -> LimitExceededError:
    """The error for memory the machine would not give (a program's sizes within
    ``max_planned_bytes``, which bounds what a program may ask for, but beyond it)."""
    return LimitExceededError(
        f"cannot allocate {nbytes} bytes of {where} memory ({type(error).__name__}: {error}); "
        "load_method's max_planned_bytes bounds what a program may ask for"
    )


def fixed_empty(
    sizes: Sequence[int], strides: Sequence[int], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """An uninitialized tensor like ``torch.empty_strided`` whose CPU storage cannot grow."""
    if device.type != "cpu":
        return torch.empty_strided(tuple(sizes), tuple(strides), dtype=dtype, device=device)
    extent = 1 + sum((n - 1) * s for n, s in zip(sizes, strides, strict=True)) if all(sizes) else 0
    raw = _fixed_bytes(max(extent, 1) * dtype.itemsize)
    return raw.view(dtype).as_strided(tuple(sizes), tuple(strides))


def check_aligned(byte_offset: int, itemsize: int, where: str) -> None:
    """A planned tensor at ``byte_offset`` of its buffer starts on an element boundary."""
    if byte_offset % itemsize:
        raise PteFormatError(
            where,
            f"byte offset {byte_offset} is not a multiple of the element size ({itemsize}); "
            "ptexec needs element-aligned tensors",
        )


def strided_view(
    storage: torch.Tensor,
    byte_offset: int,
    dtype: torch.dtype,
    sizes: Sequence[int],
    dim_order: Sequence[int],
    where: str,
) -> torch.Tensor:
    """A tensor over ``storage`` (a flat uint8 tensor) at ``byte_offset`` with the given
    dtype, sizes and the strides of ``dim_order``."""
    itemsize = dtype.itemsize
    check_aligned(byte_offset, itemsize, where)
    if storage.storage_offset():
        raise ValueError("planned storage must start at offset 0")
    base = empty_maker(dtype, storage.device)()
    base.set_(
        storage.untyped_storage(),
        byte_offset // itemsize,
        tuple(sizes),
        dim_order_strides(sizes, dim_order),
    )
    return base


def resize_to(t: torch.Tensor, sizes: Sequence[int], dim_order: Sequence[int]) -> None:
    """Resize ``t`` in place (same storage and offset) to ``sizes`` with ``dim_order`` strides.

    Raises RuntimeError when the new shape does not fit the storage behind ``t``.
    """
    t.as_strided_(tuple(sizes), dim_order_strides(sizes, dim_order))
