"""ptexec's device model (the schema's ``DeviceType``: CPU=0, CUDA=1) and its translators.

Every tensor ptexec describes carries a :class:`Device`. Memory on anything else (mps,
xpu, meta, ROCm, ...) is never reported as host memory: the translators raise
:class:`~ptexec.errors.UnsupportedDeviceError` naming the device.

DLPack device codes map as follows:

- ``kDLCPU`` (1) and ``kDLCUDAHost`` (3, pinned host memory) -> ``cpu``;
- ``kDLCUDA`` (2) -> ``cuda:<id>``;
- ``kDLCUDAManaged`` (13) -> ``cuda:<id>``: managed memory is allocated by the CUDA driver
  for that device, and kernels on that device use it without a copy, while host reads of it
  may migrate pages; treating it as the device's memory keeps every access cheap and any
  move explicit (and counted);
- every other code raises, naming it (``kDLROCM (10)``).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import TYPE_CHECKING, Any

from .errors import UnsupportedDeviceError

if TYPE_CHECKING:
    import torch

__all__ = [
    "CPU",
    "DLPACK_DEVICE_NAMES",
    "Device",
    "DeviceType",
    "dlpack_device_pair",
    "from_dlpack_device",
    "from_torch_device",
    "parse_device",
]


class DeviceType(IntEnum):
    """Device types of the ExecuTorch schema (``program.fbs`` ``DeviceType``)."""

    CPU = 0
    CUDA = 1


@dataclass(frozen=True, slots=True)
class Device:
    """Where memory lives: a device type and index (ExecuTorch's ``Device``; index 0 default)."""

    type: DeviceType
    index: int = 0

    def __str__(self) -> str:
        return "cpu" if self.type == DeviceType.CPU else f"cuda:{self.index}"

    def __repr__(self) -> str:
        return f"Device('{self}')"

    @property
    def is_cpu(self) -> bool:
        return self.type == DeviceType.CPU

    def to_torch(self) -> torch.device:
        """The matching ``torch.device`` (``cpu`` or ``cuda:i``)."""
        import torch

        return torch.device("cpu") if self.is_cpu else torch.device("cuda", self.index)


CPU = Device(DeviceType.CPU, 0)

DLPACK_DEVICE_NAMES = {
    1: "kDLCPU",
    2: "kDLCUDA",
    3: "kDLCUDAHost",
    4: "kDLOpenCL",
    7: "kDLVulkan",
    8: "kDLMetal",
    9: "kDLVPI",
    10: "kDLROCM",
    11: "kDLROCMHost",
    12: "kDLExtDev",
    13: "kDLCUDAManaged",
    14: "kDLOneAPI",
    15: "kDLWebGPU",
    16: "kDLHexagon",
    17: "kDLMAIA",
    18: "kDLTrn",
}

SUPPORTED = "ptexec runs tensors on cpu and cuda"


def _current_cuda_index() -> int:
    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.current_device())
    return 0


def from_torch_device(device: torch.device | str, what: str = "tensor") -> Device:
    """Translate a torch device: ``cpu`` -> CPU:0, ``cuda:i`` -> CUDA:i, bare ``cuda`` -> the
    current CUDA device; anything else raises :class:`UnsupportedDeviceError`."""
    import torch

    dev = torch.device(device) if isinstance(device, str) else device
    if dev.type == "cpu":
        return CPU
    if dev.type == "cuda":
        if dev.index is not None and dev.index < 0:  # (torch wraps cuda:128 to -128)
            raise UnsupportedDeviceError(f"{what} is on {dev}: a negative CUDA index")
        return Device(DeviceType.CUDA, _current_cuda_index() if dev.index is None else dev.index)
    raise UnsupportedDeviceError(f"{what} is on {dev}; {SUPPORTED}")


def from_dlpack_device(code: int, device_id: int, what: str = "array") -> Device:
    """Translate a DLPack ``(device_type, device_id)`` pair (see the module docstring)."""
    code = int(code)
    if code in (1, 3):
        return CPU
    if code in (2, 13):
        return Device(DeviceType.CUDA, int(device_id))
    name = DLPACK_DEVICE_NAMES.get(code, "unknown DLPack device")
    raise UnsupportedDeviceError(f"{what} is on {name} ({code}), device {device_id}; {SUPPORTED}")


def dlpack_device_pair(value: Any, what: str = "array") -> tuple[int, int]:
    """The (type code, device id) a producer's ``__dlpack_device__`` returned: by the
    protocol a pair of a type code (an integer or an enum member of one) and a device id
    (an integer, not negative). Anything else raises :class:`UnsupportedDeviceError`
    naming what came."""
    if isinstance(value, tuple | list) and len(value) == 2:
        code, index = value
        code = code.value if isinstance(code, Enum) else code
        # (floats, strings and bools are no codes; numpy's integers are)
        if not isinstance(code, bool | float | str) and not isinstance(index, bool | float | str):
            try:
                pair = operator.index(code), operator.index(index)
            except TypeError:
                pass
            else:
                if pair[1] >= 0:
                    return pair
    raise UnsupportedDeviceError(
        f"{what}'s __dlpack_device__ returned {value!r}; expected a (device type, "
        "device id) pair of integers, the id not negative"
    )


def parse_device(spec: Any) -> Device:
    """A :class:`Device` from ``"cpu"``, ``"cuda"``, ``"cuda:1"``, a ``torch.device`` or a Device."""
    if isinstance(spec, Device):
        return spec
    if isinstance(spec, str):
        text = spec.strip().lower()
        if text == "cpu":
            return CPU
        if text == "cuda":
            return Device(DeviceType.CUDA, _current_cuda_index())
        index = text[5:] if text.startswith("cuda:") else text
        if index.isascii() and index.isdigit():  # str.isdigit takes other scripts' digits
            return Device(DeviceType.CUDA, int(index))
        raise UnsupportedDeviceError(f"device '{spec}' is not modeled; {SUPPORTED}")
    import torch

    if isinstance(spec, torch.device):
        return from_torch_device(spec, "device")
    if isinstance(spec, int) and not isinstance(spec, bool):
        if spec < 0:
            raise UnsupportedDeviceError(f"device {spec}: a CUDA device index is not negative")
        return Device(DeviceType.CUDA, spec)
    raise TypeError(f"cannot read a device from {type(spec).__name__}")


def schema_device(device_type: int, device_index: int) -> Device:
    """The Device of a program's (device_type, device_index) pair (validated by the format)."""
    if device_type == DeviceType.CPU:
        return CPU
    return Device(DeviceType(device_type), device_index)
