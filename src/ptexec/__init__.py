"""ptexec: a device-aware Python runtime for ExecuTorch programs (``.pte``).

    import ptexec
    prog = ptexec.load("model.pte")
    fwd = prog.load_method("forward")
    y, = fwd(x)

Importing ``ptexec`` is cheap: torch is imported when a name that needs it is first used,
so the format layer (``ptexec.format``) works without torch.
"""

from __future__ import annotations

import importlib
import os as _os
from typing import TYPE_CHECKING, Any

from . import errors
from .errors import (
    BackendUnavailableError,
    DeviceUnavailableError,
    ExecutionError,
    ExportError,
    InputError,
    LimitExceededError,
    MethodNotFoundError,
    OperatorMissingError,
    PteFormatError,
    PtexecError,
    UnsupportedDeviceError,
)
from .version import __version__ as __version__

if TYPE_CHECKING:
    from .accounting import CallRecord
    from .binding import Action, Policy
    from .device import CPU, Device, DeviceType
    from .hf.switch import use_as_executorch
    from .loader import MethodMeta, ScalarInfo
    from .memory import BufferInfo
    from .method import Method
    from .program import Program, load
    from .tensor import TensorInfo, describe
    from .threads import get_num_threads, set_num_threads


_LAZY = {
    "CallRecord": "accounting",
    "Action": "binding",
    "Policy": "binding",
    "CPU": "device",
    "Device": "device",
    "DeviceType": "device",
    "BufferInfo": "memory",
    "Method": "method",
    "MethodMeta": "loader",
    "ScalarInfo": "loader",
    "Program": "program",
    "load": "program",
    "TensorInfo": "tensor",
    "describe": "tensor",
    "get_num_threads": "threads",
    "set_num_threads": "threads",
    "use_as_executorch": "hf.switch",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ptexec' has no attribute '{name}'")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "CPU",
    "Action",
    "BackendUnavailableError",
    "BufferInfo",
    "CallRecord",
    "Device",
    "DeviceType",
    "DeviceUnavailableError",
    "ExecutionError",
    "ExportError",
    "InputError",
    "LimitExceededError",
    "Method",
    "MethodMeta",
    "MethodNotFoundError",
    "OperatorMissingError",
    "Policy",
    "Program",
    "PteFormatError",
    "PtexecError",
    "ScalarInfo",
    "TensorInfo",
    "UnsupportedDeviceError",
    "describe",
    "errors",
    "get_num_threads",
    "load",
    "set_num_threads",
    "use_as_executorch",
]

# ``PTEXEC_AS_EXECUTORCH=1``: ExecuTorch's runtime names resolve to ptexec's (ptexec.hf.switch)
if _os.environ.get("PTEXEC_AS_EXECUTORCH"):
    from .hf.switch import from_environment as _from_environment

    _from_environment()
