"""What the generator knows about a value: the delegate argument a value is bound to
(:class:`ArgInfo`), how a value is carried at run time (:class:`Carried`), and the
XNNPACK datatype names each form stands for."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "FLOAT_DTYPES",
    "QUANTIZED_CONSTANT_TYPES",
    "STATIC_QUANT_RANGES",
    "UNSUPPORTED_DATATYPES",
    "ArgInfo",
    "Carried",
    "dtype_expr",
]

FLOAT_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
STATIC_QUANT_RANGES = {"qint8": (-128, 127), "quint8": (0, 255)}
QUANTIZED_CONSTANT_TYPES = ("qint8", "quint8", "qint32", "qcint8", "qcint32", "qcint4", "qbint4")
UNSUPPORTED_DATATYPES = frozenset({"qpint8", "pfp32"})


@dataclass(frozen=True, slots=True)
class ArgInfo:
    """What the method says about one delegate argument tensor: its dtype, dim order and,
    when known, its declared sizes (``sizes``) and whether they are exact (``static``) or
    an upper bound on each dim (``bounded``)."""

    dtype: torch.dtype
    dim_order: tuple[int, ...]
    sizes: tuple[int, ...] | None = None
    static: bool = False
    bounded: bool = False


@dataclass(frozen=True, slots=True)
class Carried:
    """How a value is carried at run time: a float tensor (``float``, of ``dtype``); the
    centered integers ``q - zp`` of a static per-tensor quantized value as float32 (``q``:
    ``scale``, ``zp``, ``qmin``, ``qmax``); a value quantized per token at run time
    (``qd``: its producer's float values, quantized where it is read); or an integer
    tensor (``int``)."""

    kind: str
    dtype: torch.dtype
    scale: float = 1.0
    zp: int = 0
    qmin: int = 0
    qmax: int = 0

    @property
    def is_qs8(self) -> bool:
        return self.kind == "q" and (self.qmin, self.qmax) == (-128, 127)


def dtype_expr(dt: torch.dtype) -> str:
    return f"torch.{str(dt).removeprefix('torch.')}"
