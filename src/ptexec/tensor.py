"""Tensor descriptions: :class:`TensorInfo` and :func:`describe` for anything array-like.

A description carries sizes, dtype, strides (in elements), dim order and device. The dim
order is derived from the strides:

- a layout is *dense* when some permutation of the dimensions gives it row-major strides;
  that permutation is its dim order (outermost dimension first);
- dimensions of size 1 carry no layout information (their stride is never used), so they
  do not decide the order; where more than one order fits, ptexec picks the first of: the
  identity ``(0, 1, ..., n-1)``, channels-last (``(0, 2, 3, 1)`` for 4-D, ``(0, 2, 3, 4, 1)``
  for 5-D), then the order by decreasing stride with size-1 dimensions kept in their
  natural place;
- a layout with overlapping, negative or gapped strides has no dim order (``None``), and
  :attr:`TensorInfo.layout` names it ``"strided"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

import torch
import torch.utils.dlpack

from .device import (
    CPU,
    DLPACK_DEVICE_NAMES,
    Device,
    dlpack_device_pair,
    from_dlpack_device,
    from_torch_device,
)
from .dtypes import dtype_name
from .errors import DeviceUnavailableError, UnsupportedDeviceError
from .readonly import from_numpy

__all__ = [
    "DLPACK_IS_COPIED",
    "DLPACK_READ_ONLY",
    "TensorInfo",
    "describe",
    "dim_order_from_strides",
    "dim_order_strides",
    "subclass_hook",
    "to_torch",
    "to_torch_flagged",
]

DLPACK_READ_ONLY = 1  # DLPack 1.x's DLPACK_FLAG_BITMASK_READ_ONLY
DLPACK_IS_COPIED = 2  # DLPACK_FLAG_BITMASK_IS_COPIED: the producer handed a copy


def dim_order_strides(sizes: Sequence[int], dim_order: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a dense tensor laid out in ``dim_order`` (a size-0 dim counts as 1)."""
    n = len(sizes)
    strides = [0] * n
    acc = 1
    for i in range(n - 1, -1, -1):
        d = dim_order[i]
        strides[d] = acc
        acc *= max(sizes[d], 1)
    return tuple(strides)


def _matches(sizes: Sequence[int], strides: Sequence[int], dim_order: Sequence[int]) -> bool:
    want = dim_order_strides(sizes, dim_order)
    return all(s == w or n == 1 for s, w, n in zip(strides, want, sizes, strict=True))


def channels_last_order(rank: int) -> tuple[int, ...] | None:
    if rank == 4:
        return (0, 2, 3, 1)
    if rank == 5:
        return (0, 2, 3, 4, 1)
    return None


def dim_order_from_strides(sizes: Sequence[int], strides: Sequence[int]) -> tuple[int, ...] | None:
    """The dim order of a dense layout (rule in the module docstring), or None."""
    rank = len(sizes)
    identity = tuple(range(rank))
    if _matches(sizes, strides, identity):
        return identity
    cl = channels_last_order(rank)
    if cl is not None and _matches(sizes, strides, cl):
        return cl
    if 0 in sizes:
        return identity  # no elements: every order describes it
    big = sorted((d for d in range(rank) if sizes[d] != 1), key=lambda d: (-strides[d], d))
    order: list[int] = []
    pending = [d for d in range(rank) if sizes[d] == 1]
    for d in big:
        while pending and pending[0] < d:
            order.append(pending.pop(0))
        order.append(d)
    order.extend(pending)
    result = tuple(order)
    return result if _matches(sizes, strides, result) else None


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """What a tensor is and where it lives.

    ``sizes`` are the current sizes (for a program's dynamic tensor: its upper bound),
    ``strides`` are in elements, ``dim_order`` is None for a layout that has none.
    ``is_memory_planned`` and ``dynamism`` describe a program's tensor; for a caller's
    tensor they are False and ``"static"``.
    """

    sizes: tuple[int, ...]
    dtype: torch.dtype
    dim_order: tuple[int, ...] | None
    device: Device
    strides: tuple[int, ...] | None = None
    is_memory_planned: bool = False
    dynamism: str = "static"

    @property
    def rank(self) -> int:
        return len(self.sizes)

    @property
    def numel(self) -> int:
        return prod(self.sizes)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    @property
    def layout(self) -> str:
        """``contiguous``, ``channels_last``, ``dim_order(...)`` or ``strided`` (no dim order)."""
        return layout_name(self.dim_order)

    @property
    def shape_text(self) -> str:
        """Dtype and sizes as messages write them: ``float32[2, 8]``; a program's tensor of
        bounded dynamic shape ``float32[<=4, <=8]`` (each size an upper bound), of
        unbounded dynamic shape ``float32[rank 2]``."""
        name = dtype_name(self.dtype)
        if self.dynamism == "dynamic_unbound":
            return f"{name}[rank {self.rank}]"
        bound = "<=" if self.dynamism == "dynamic_bound" else ""
        return f"{name}[{', '.join(f'{bound}{s}' for s in self.sizes)}]"

    def __str__(self) -> str:
        text = self.shape_text
        if self.dim_order is None or self.dim_order != tuple(range(self.rank)):
            text += f" ({self.layout})"
        return f"{text} on {self.device}"


def layout_name(dim_order: tuple[int, ...] | None) -> str:
    if dim_order is None:
        return "strided"
    rank = len(dim_order)
    if dim_order == tuple(range(rank)):
        return "contiguous"
    if dim_order == channels_last_order(rank):
        return "channels_last"
    return f"dim_order{list(dim_order)}"


def _info_from_torch(t: torch.Tensor, device: Device) -> TensorInfo:
    sizes = tuple(t.shape)
    strides = tuple(t.stride())
    return TensorInfo(sizes, t.dtype, dim_order_from_strides(sizes, strides), device, strides)


def _is_dlpack(x: Any) -> bool:
    return hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__")


def _dlpack_to_torch(x: Any, device: Device, what: str = "array") -> tuple[torch.Tensor, int]:
    """Consume ``x`` through DLPack (versioned protocol first, then the old one); zero copy.
    Also the flags of the capsule consumed (DLPack 1.x's; 0 for the old protocol), read
    from that capsule itself: another export may say otherwise, or be refused."""
    kwargs: dict[str, Any] = {}
    if not device.is_cpu and not torch.cuda.is_available():
        raise DeviceUnavailableError(f"{what} is on {device}, but torch has no CUDA device here")
    if not device.is_cpu:
        stream = torch.cuda.current_stream(device.index).cuda_stream
        kwargs["stream"] = 1 if stream == 0 else stream
    try:
        capsule = x.__dlpack__(max_version=(1, 0), **kwargs)
    except TypeError:
        capsule = x.__dlpack__(**kwargs)
    flags = _capsule_flags(capsule)
    # the capsule's own device, not the producer's word for it, says where the memory is:
    # read from its header before torch imports it (torch's import of some device types
    # corrupts memory, or raises what it does not say it raises)
    held = _capsule_device(capsule)
    if held is not None:
        code, index = held
        holder: Device | str
        try:
            holder = from_dlpack_device(code, index)
        except UnsupportedDeviceError:
            holder = f"{DLPACK_DEVICE_NAMES.get(code, 'an unknown DLPack device')} ({code})"
        if holder != device:
            raise UnsupportedDeviceError(
                f"{what}'s __dlpack_device__ says {device}, but its DLPack memory is on "
                f"{holder}: a producer must name the device its memory lives on"
            )
    try:
        t = torch.utils.dlpack.from_dlpack(capsule)
    except (BufferError, AssertionError, RuntimeError) as e:  # a device torch cannot import
        raise UnsupportedDeviceError(
            f"{what} is on {device} (its __dlpack_device__), but torch cannot take its "
            f"DLPack memory: {e}"
        ) from e
    # and where torch put it
    on = t.device
    if on.type != ("cpu" if device.is_cpu else "cuda") or (
        on.type == "cuda" and on.index != device.index
    ):
        raise UnsupportedDeviceError(
            f"{what}'s __dlpack_device__ says {device}, but its DLPack memory is on {on}: "
            "a producer must name the device its memory lives on"
        )
    return t, flags


def _capsule_flags(capsule: Any) -> int:
    """The flags of an unconsumed versioned DLPack capsule; 0 for the old protocol's
    capsule, which has none."""
    import ctypes

    found = _capsule_struct(capsule)
    if found is None or not found[1]:
        return 0
    # DLManagedTensorVersioned: version (2 x uint32), manager_ctx, deleter, then flags
    return ctypes.c_uint64.from_address(found[0] + 24).value


def _capsule_device(capsule: Any) -> tuple[int, int] | None:
    """The DLPack (device type, device id) in an unconsumed capsule's DLTensor (None for
    any other object)."""
    import ctypes

    tensor = _capsule_tensor(capsule)
    if tensor is None:
        return None
    # DLTensor: data, then device (int32 type, int32 id)
    return ctypes.c_int32.from_address(tensor + 8).value, ctypes.c_int32.from_address(
        tensor + 12
    ).value


def _capsule_tensor(capsule: Any) -> int | None:
    """The address of the DLTensor an unconsumed DLPack capsule holds: the managed
    tensor's first member, or in a versioned one after version, manager_ctx, deleter and
    flags."""
    found = _capsule_struct(capsule)
    if found is None:
        return None
    return found[0] + (32 if found[1] else 0)


def _capsule_struct(capsule: Any) -> tuple[int, bool] | None:
    """The address of the managed tensor an unconsumed DLPack capsule holds and whether it
    is the versioned struct (None for any other object)."""
    import ctypes

    api = ctypes.pythonapi
    api.PyCapsule_GetName.restype = ctypes.c_char_p
    api.PyCapsule_GetName.argtypes = [ctypes.py_object]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    try:
        name = api.PyCapsule_GetName(capsule)
    except Exception:  # not a capsule
        return None
    if name not in (b"dltensor", b"dltensor_versioned"):
        return None
    address = api.PyCapsule_GetPointer(capsule, name)
    return (address, name == b"dltensor_versioned") if address else None


# DLPack's (type code, bits) of one-lane element types torch has
_DLPACK_DTYPES = {
    (0, 8): torch.int8,
    (0, 16): torch.int16,
    (0, 32): torch.int32,
    (0, 64): torch.int64,
    (1, 8): torch.uint8,
    (1, 16): torch.uint16,
    (1, 32): torch.uint32,
    (1, 64): torch.uint64,
    (2, 16): torch.float16,
    (2, 32): torch.float32,
    (2, 64): torch.float64,
    (4, 16): torch.bfloat16,
    (5, 64): torch.complex64,
    (5, 128): torch.complex128,
    (6, 8): torch.bool,
}


def _dlpack_empty(x: Any) -> torch.Tensor | None:
    """An empty CPU tensor of the sizes and dtype that the DLPack producer ``x`` declares,
    when its capsule describes no elements; read from the capsule's header, never its
    memory (which lives on a device torch may not reach). None otherwise, or when the
    producer exports nothing readable."""
    import ctypes

    try:
        capsule = x.__dlpack__(max_version=(1, 0))
    except TypeError:  # the old protocol
        try:
            capsule = x.__dlpack__()
        except Exception:
            return None
    except Exception:
        return None
    tensor = _capsule_tensor(capsule)
    if tensor is None:
        return None
    # DLTensor: data, device (2 x int32), ndim (int32), dtype (uint8 code, uint8 bits,
    # uint16 lanes), shape
    ndim = ctypes.c_int32.from_address(tensor + 16).value
    code = ctypes.c_uint8.from_address(tensor + 20).value
    bits = ctypes.c_uint8.from_address(tensor + 21).value
    lanes = ctypes.c_uint16.from_address(tensor + 22).value
    shape_at = ctypes.c_void_p.from_address(tensor + 24).value
    dtype = _DLPACK_DTYPES.get((code, bits)) if lanes == 1 else None
    if dtype is None or not 0 < ndim <= 64 or not shape_at:
        return None
    sizes = tuple(ctypes.c_int64.from_address(shape_at + 8 * d).value for d in range(ndim))
    if 0 not in sizes or min(sizes) < 0:
        return None
    return torch.empty(sizes, dtype=dtype)


def subclass_hook(t: torch.Tensor) -> str | None:
    """The Python hook that ``t``'s tensor subclass adds to torch's ops:
    ``"__torch_dispatch__"`` (a wrapper, whose values are not its memory),
    ``"__torch_function__"``, or None (a plain tensor, or a subclass that overrides
    neither, as a Parameter)."""
    kind = type(t)
    if kind is torch.Tensor:
        return None
    if kind.__torch_dispatch__ is not torch.Tensor.__torch_dispatch__:
        return "__torch_dispatch__"
    function = getattr(kind.__torch_function__, "__func__", kind.__torch_function__)
    if function not in (_TENSOR_FUNCTION, torch._C._disabled_torch_function_impl):
        return "__torch_function__"
    return None


_TENSOR_FUNCTION = torch.Tensor.__torch_function__.__func__  # type: ignore[attr-defined]


def to_torch(x: Any, what: str = "input") -> tuple[torch.Tensor, Device]:
    """A torch view of ``x`` (a torch tensor, numpy array or DLPack producer) and its device.

    Never copies; raises :class:`UnsupportedDeviceError` for memory ptexec does not model
    (an empty tensor is exempt and counts as cpu) and ``TypeError`` for non-arrays.
    A tensor subclass is a plain tensor over the same memory (its Python hooks are no
    part of a program, whose kernels read memory), unless it has its own
    ``__torch_dispatch__``: such a subclass (a wrapper: DTensor, a fake tensor) keeps its
    values elsewhere than its memory, a ``TypeError``.
    """
    t, device, _ = to_torch_flagged(x, what)
    return t, device


def to_torch_flagged(x: Any, what: str = "input") -> tuple[torch.Tensor, Device, int]:
    """:func:`to_torch`, and the DLPack flags of the capsule a producer's view is made of
    (:data:`DLPACK_READ_ONLY`, :data:`DLPACK_IS_COPIED`); 0 for torch tensors, numpy arrays and the old protocol."""
    if isinstance(x, torch.Tensor) and type(x) is not torch.Tensor:
        if subclass_hook(x) == "__torch_dispatch__":
            raise TypeError(
                f"{what} is a {type(x).__name__}, a tensor subclass with its own "
                "__torch_dispatch__ (its values are not its memory); pass a plain tensor"
            )
        x = x.as_subclass(torch.Tensor)
    if isinstance(x, torch.Tensor):
        dev = x.device
        if dev.type == "cpu":
            return x, CPU, 0
        if dev.type == "cuda":
            return x, from_torch_device(dev), 0
        if x.numel() == 0:
            return x, CPU, 0
        raise UnsupportedDeviceError(f"{what} is on {dev}; ptexec runs tensors on cpu and cuda")
    np = _numpy()
    if np is not None and isinstance(x, np.ndarray | np.generic):
        return _numpy_to_torch(np.asarray(x)), CPU, 0
    if _is_dlpack(x):
        code, index = dlpack_device_pair(x.__dlpack_device__(), what)
        try:
            device = from_dlpack_device(code, index, what)
            t, flags = _dlpack_to_torch(x, device, what)
        except UnsupportedDeviceError as e:
            if type(e) is not UnsupportedDeviceError:
                raise
            # memory ptexec or torch cannot take (a device it does not model, CUDA's pinned
            # host memory) is exempt when empty, as an empty torch tensor is: its own sizes
            # and dtype
            empty = _dlpack_empty(x) if _dlpack_maybe_empty(x) else None
            if empty is not None:
                return empty, CPU, 0
            raise
        return t, device, flags
    raise TypeError(f"{what} is a {type(x).__name__}, not a tensor or array")


def _dlpack_maybe_empty(x: Any) -> bool:
    """False when ``x``'s ``shape`` (not part of the protocol) says it has elements."""
    shape = getattr(x, "shape", None)
    return shape is None or 0 in tuple(shape)


def _numpy() -> Any:
    import sys

    return sys.modules.get("numpy")


def _numpy_to_torch(a: Any) -> torch.Tensor:
    """A zero-copy torch view of a numpy array (read-only arrays included).

    Negative strides along an axis of more than one element are the one exception: torch
    cannot express them, so such an array is copied into a contiguous one.
    :func:`describe` reports those arrays as having no dim order, so the binding rules
    treat them as a layout conversion, which copies anyway. A negative stride along an
    axis of one element is never stepped: the view takes a stride of 0 there instead,
    over the same memory (a program that writes the input writes the caller's array).
    """
    np = _numpy()
    if a.ndim and any(s < 0 for s in a.strides):
        if all(s >= 0 or n == 1 for s, n in zip(a.strides, a.shape, strict=True)):
            strides = tuple(max(s, 0) for s in a.strides)
            a = np.lib.stride_tricks.as_strided(a, strides=strides, writeable=a.flags.writeable)
        else:
            # (a copy: numpy calls an array contiguous whose size-1 axis has a negative stride)
            a = np.array(a, order="C", copy=True)
    try:
        return from_numpy(a)  # (read-only arrays included)
    except TypeError as e:
        raise TypeError(f"numpy dtype {a.dtype} has no torch equivalent") from e


def describe(x: Any) -> TensorInfo:
    """Describe a torch tensor, numpy array or DLPack producer without copying it.

    Raises :class:`UnsupportedDeviceError` for memory on a device ptexec does not model
    (an empty one is exempt and counts as cpu, as :func:`to_torch` takes it) and for a
    producer whose ``__dlpack_device__`` is no (type code, device id) pair.
    """
    np = _numpy()
    if np is not None and isinstance(x, np.ndarray | np.generic):
        return _describe_numpy(np.asarray(x))
    t, device = to_torch(x, "tensor" if isinstance(x, torch.Tensor) else "array")
    return _info_from_torch(t, device)


def _describe_numpy(a: Any) -> TensorInfo:
    np = _numpy()
    itemsize = a.dtype.itemsize
    sizes = tuple(int(s) for s in a.shape)
    strides = tuple(int(s) // itemsize for s in a.strides)
    try:
        dtype = torch.from_numpy(np.empty(0, dtype=a.dtype)).dtype
    except TypeError as e:
        raise TypeError(f"numpy dtype {a.dtype} has no torch equivalent") from e
    # (a size-1 axis's stride is never stepped, its sign included)
    stepped = any(s < 0 and n != 1 for s, n in zip(strides, sizes, strict=True))
    order = None if stepped else dim_order_from_strides(sizes, strides)
    return TensorInfo(sizes, dtype, order, CPU, strides)
