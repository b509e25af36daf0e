"""ptexec: a device-aware Python runtime for ExecuTorch programs (``.pte``).

    import ptexec
    prog = ptexec.load("model.pte")
    fwd = prog.load_method("forward")
    y, = fwd(x)
"""

from . import errors
from .accounting import CallRecord
from .binding import Action, Policy
from .device import CPU, Device, DeviceType
from .errors import (
    BackendUnavailableError,
    DeviceUnavailableError,
    ExecutionError,
    InputError,
    LimitExceededError,
    MethodNotFoundError,
    OperatorMissingError,
    PteFormatError,
    PtexecError,
    UnsupportedDeviceError,
)
from .memory import BufferInfo
from .method import Method, MethodMeta, ScalarInfo
from .program import Program, load
from .tensor import TensorInfo, describe

__version__ = "0.1.0"

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
    "InputError",
    "LimitExceededError",
    "Method",
    "MethodMeta",
    "MethodNotFoundError",
    "OperatorMissingError",
    "Policy",
    "Program",
    "PtexecError",
    "PteFormatError",
    "ScalarInfo",
    "TensorInfo",
    "UnsupportedDeviceError",
    "describe",
    "errors",
    "load",
]
