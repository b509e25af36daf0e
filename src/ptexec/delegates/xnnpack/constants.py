"""Constant values of a payload, prepared once: views of the file, dequantized, cast and
moved to the device on request, each form cached."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ...errors import BackendUnavailableError
from ...readonly import from_buffer
from . import schema as s
from .values import FLOAT_DTYPES

__all__ = ["Constants"]


def _bf16_truncating(values: Sequence[float]) -> torch.Tensor:
    """float32 scales -> bfloat16 as ExecuTorch's runtime converts them (scaled by
    1.00389105, then truncated to the upper 16 bits), returned as float32."""
    f = torch.tensor(values, dtype=torch.float32) * 1.00389105
    bits = f.view(torch.int32) & ~0xFFFF
    return bits.view(torch.float32)


def _unpack4(raw: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """Two 4-bit values per byte (low nibble first) along the last dim -> int8 in [0, 15]."""
    rows = 1
    for d in dims[:-1]:
        rows *= d
    last = dims[-1]
    b = raw[: rows * ((last + 1) // 2)].reshape(rows, (last + 1) // 2)
    lo = b & 0x0F
    hi = b >> 4
    both = torch.stack((lo, hi), dim=-1).reshape(rows, -1)[:, :last]
    return both.reshape(dims).to(torch.int16)


class Constants:
    """Prepares constant values once: raw views of the payload or named data, dequantized
    when quantized, cast and moved to the device on request, each form cached."""

    def __init__(
        self, payload: s.XnnPayload, named_data: Mapping[str, memoryview], device: torch.device
    ) -> None:
        self.payload = payload
        self.named_data = named_data
        self.device = device
        self._cache: dict[tuple[int, str], torch.Tensor] = {}

    def _bytes(self, idx: int) -> torch.Tensor:
        mv = self.payload.constant_bytes(idx, self.named_data)
        if len(mv) == 0:
            return torch.empty(0, dtype=torch.uint8)
        return from_buffer(mv)  # read-only buffers: never written

    def _typed(self, idx: int, dtype: torch.dtype, count: int) -> torch.Tensor:
        raw = self._bytes(idx)[: count * dtype.itemsize]
        if raw.data_ptr() % dtype.itemsize:
            raw = raw.clone()
        return raw.view(dtype)

    def scales(self, q: s.PerChannelQuant | s.PerChannelGroupQuant) -> torch.Tensor:
        """The scales as XNNPACK's kernels take them, in float32."""
        return self.stored_scales(q).float()

    def stored_scales(self, q: s.PerChannelQuant | s.PerChannelGroupQuant) -> torch.Tensor:
        """The same values as :meth:`scales`, in the dtype they are stored in (a group
        quantization's bfloat16 scales are not converted: each is exactly a float32)."""
        if isinstance(q, s.PerChannelGroupQuant):
            if q.scale_buffer_idx:
                return self._typed(q.scale_buffer_idx, torch.bfloat16, q.num_scales)
            return _bf16_truncating(q.scales)
        if q.scale_buffer_idx:
            return self._typed(q.scale_buffer_idx, torch.float32, q.num_scales)
        return torch.tensor(q.scales, dtype=torch.float32)

    def ints(self, v: s.XnnValue) -> torch.Tensor:
        """The integer values of a quantized constant (qint8/qcint8 and qint32/qcint32 as
        stored; qcint4 and qbint4 with their zero point 8 removed), in XNNPACK's dims, on
        the host: int8, or int32 for the 32-bit kinds."""
        name = v.dtype_name
        if name in ("qint8", "qcint8"):
            return self._typed(v.constant_buffer_idx, torch.int8, v.numel).reshape(v.dims)
        if name in ("qint32", "qcint32"):
            return self._typed(v.constant_buffer_idx, torch.int32, v.numel).reshape(v.dims)
        if name in ("qcint4", "qbint4"):
            return (_unpack4(self._bytes(v.constant_buffer_idx), v.dims) - 8).to(torch.int8)
        raise ValueError(f"no integer form for {name}")

    def centered(self, v: s.XnnValue) -> torch.Tensor:
        """A static per-tensor quantized constant as the runtime carries it: ``q - zp`` in
        float32, on the device."""
        key = (v.id, "centered")
        hit = self._cache.get(key)
        if hit is None:
            q = v.quant
            zp = q.zero_point if isinstance(q, s.PerTensorQuant) else 0
            hit = (self.ints(v).to(torch.float32) - float(zp)).to(self.device)
            self._cache[key] = hit
        return hit

    def value(self, v: s.XnnValue, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The constant's value in XNNPACK's dims: floats as is, quantized ones dequantized
        (float32), cast to ``dtype`` when given, on the device."""
        key = (v.id, str(dtype))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        t = self._host(v)
        if dtype is not None and t.dtype != dtype:
            t = t.to(dtype)
        t = t.to(self.device)
        self._cache[key] = t
        return t

    def _host(self, v: s.XnnValue) -> torch.Tensor:
        name = v.dtype_name
        idx = v.constant_buffer_idx
        dims = v.dims
        n = v.numel
        if name in FLOAT_DTYPES:
            return self._typed(idx, FLOAT_DTYPES[name], n).reshape(dims)
        if name == "int32":
            return self._typed(idx, torch.int32, n).reshape(dims)
        q = v.quant
        if name in ("qint8", "qcint8"):
            ints = self._typed(idx, torch.int8, n).reshape(dims).to(torch.float32)
        elif name == "quint8":
            ints = self._typed(idx, torch.uint8, n).reshape(dims).to(torch.float32)
        elif name in ("qint32", "qcint32"):
            ints = self._typed(idx, torch.int32, n).reshape(dims).to(torch.float64)
        elif name in ("qcint4", "qbint4"):
            ints = (_unpack4(self._bytes(idx), dims) - 8).to(torch.float32)
        else:
            raise BackendUnavailableError(f"XNNPACK constant of datatype {name} is not supported")
        if isinstance(q, s.PerTensorQuant):
            return ((ints - q.zero_point) * q.scale).to(torch.float32)
        if isinstance(q, s.PerChannelQuant):
            shape = [1] * len(dims)
            shape[q.channel_dim] = dims[q.channel_dim]
            return (ints * self.scales(q).reshape(shape).to(ints.dtype)).to(torch.float32)
        if isinstance(q, s.PerChannelGroupQuant):
            oc, ic = dims
            sc = self.scales(q).reshape(oc, ic // q.group_size)
            return (ints.reshape(oc, -1, q.group_size) * sc[:, :, None]).reshape(oc, ic)
        raise BackendUnavailableError(f"XNNPACK constant {name} without quantization parameters")
