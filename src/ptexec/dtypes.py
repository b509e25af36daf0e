"""ExecuTorch scalar type codes <-> torch dtypes (and numpy dtypes)."""

from __future__ import annotations

import torch

from .format.scalar_type import SCALAR_TYPES

_NAMES = {
    0: "uint8",
    1: "int8",
    2: "int16",
    3: "int32",
    4: "int64",
    5: "float16",
    6: "float32",
    7: "float64",
    8: "complex32",
    9: "complex64",
    10: "complex128",
    11: "bool",
    12: "qint8",
    13: "quint8",
    14: "qint32",
    15: "bfloat16",
    16: "quint4x2",
    17: "quint2x4",
    18: "bits1x8",
    19: "bits2x4",
    20: "bits4x2",
    21: "bits8",
    22: "bits16",
    23: "float8_e5m2",
    24: "float8_e4m3fn",
    25: "float8_e5m2fnuz",
    26: "float8_e4m3fnuz",
    27: "uint16",
    28: "uint32",
    29: "uint64",
}

CODE_TO_DTYPE: dict[int, torch.dtype] = {}
for _code, _name in _NAMES.items():
    _dt = getattr(torch, _name, None)
    if isinstance(_dt, torch.dtype):
        CODE_TO_DTYPE[_code] = _dt
DTYPE_TO_CODE: dict[torch.dtype, int] = {dt: code for code, dt in CODE_TO_DTYPE.items()}

assert set(CODE_TO_DTYPE) <= set(SCALAR_TYPES)


def to_torch_dtype(code: int) -> torch.dtype:
    """The torch dtype of an ExecuTorch scalar type code (KeyError if torch has none)."""
    return CODE_TO_DTYPE[code]


def dtype_name(dtype: torch.dtype) -> str:
    """Short name used in messages: ``float32``, ``int64``, ``bool``."""
    return str(dtype).removeprefix("torch.")


MEMORY_FORMATS: dict[int, torch.memory_format] = {
    0: torch.contiguous_format,
    1: torch.preserve_format,
    2: torch.channels_last,
    3: torch.channels_last_3d,
}
LAYOUTS: dict[int, torch.layout] = {0: torch.strided, 1: torch.sparse_coo}
