"""``quantized_decomposed::`` kernels, with the arithmetic of ExecuTorch's quantized library.

The numbers follow ExecuTorch's CPU kernels, step for step where rounding can differ
(for finite values within int64's range: ExecuTorch converts a NaN, an infinity or a larger
value to int64 before clamping, which C++ leaves undefined; here infinities and large
values clamp to the range's nearer end, and NaN is what torch's conversion makes of it, 0
on x86):

- quantize: ``q = clamp(zero_point + round(x * inv_scale), quant_min, quant_max)`` where
  ``inv_scale = 1.0f / (float)scale`` and the product is a float32 (a double input
  multiplies in double, then rounds to float32); ``round`` is round-half-to-even;
- dequantize: ``(q - zero_point) * (float)scale`` in float32, then converted to the output
  dtype (``out``'s dtype; ``out_dtype`` only has to agree with it);
- ``choose_qparams`` / ``choose_qparams_per_token_asymmetric``: the range widened to
  include 0, ``scale = (max - min) / (quant_max - quant_min)`` in double, 0.1 when the
  float32 scale is 0 or its reciprocal overflows, a floor of 6.1e-5 (with the range
  rescaled), and the zero point from whichever end has the smaller error, nudged into
  ``[quant_min, quant_max]`` and rounded as a float32 (``eps`` is ignored, as ExecuTorch
  ignores it). Scales are float64, zero points int64. The per-token variant uses int8's
  range, one pair per row of the last dimension;
- per-token ops are per-channel ops over ``input.view(-1, input.size(-1))``, axis 0;
- ``embedding_byte`` / ``_4bit`` / ``_2bit``: ``(w - zero_point) * scale`` in float32, per
  row or per group of columns; 4-bit weights hold two values a byte (high nibble first,
  stored + 8), 2-bit weights four (lowest bits first, stored + 2);
- ``mixed_mm`` / ``mixed_linear``: int8 weights times per-row (or per-group) scales; sums
  are float32 here (ExecuTorch accumulates in the activation dtype, so half activations may
  differ in the last bits);
- ``add``: both operands dequantized to float32, added, requantized with the output's
  parameters (quant ranges within [0, 255], as ExecuTorch requires).

Every kernel works on the tensors' device.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import torch

from ..format import program as p
from .fixed_args import Param, Signature, fixed_kernel, register_signature, traced_indices
from .registry import KernelContext, KernelFactory, Statement

__all__ = [
    "choose_qparams",
    "choose_qparams_per_token_asymmetric",
    "dequantize_per_channel",
    "dequantize_per_tensor",
    "dequantize_per_token",
    "embedding_xbit",
    "mixed_linear",
    "mixed_mm",
    "quantize_per_channel",
    "quantize_per_tensor",
    "quantize_per_token",
    "quantized_add",
]

_QUANT_DTYPES: dict[torch.dtype, tuple[int, int]] = {
    torch.uint8: (0, 255),
    torch.int8: (-128, 127),
    torch.int16: (-(1 << 15), (1 << 15) - 1),
    torch.uint16: (0, (1 << 16) - 1),
    torch.int32: (-(1 << 31), (1 << 31) - 1),
}
_INT_INPUTS = frozenset(_QUANT_DTYPES)
_FLOATS = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16})


@lru_cache(maxsize=4096)
def _round_to_float32(x: float) -> float:
    """``x`` rounded to float32 (as a C++ ``static_cast<float>`` does; overflow gives inf)."""
    try:
        return float(struct.unpack("f", struct.pack("f", x))[0])
    except OverflowError:
        return math.copysign(math.inf, x)


_SMALL_SCALE = _round_to_float32(6.1e-5)  # ExecuTorch's SMALL_SCALE_THRESHOLD (a float)


@lru_cache(maxsize=4096)
def _inv_scale(scale: float) -> float:
    """``1.0f / (float)scale``: exactly a float32 value, returned as a Python float."""
    s = torch.tensor(scale, dtype=torch.float64).to(torch.float32)
    return float(torch.reciprocal(s))


# --------------------------------------------------------------------------------------
# checks


def _check_quant_args(what: str, quant_min: int, quant_max: int, dtype: torch.dtype) -> None:
    bounds = _QUANT_DTYPES.get(dtype)
    if bounds is None:
        raise ValueError(
            f"{what}: quantized dtype {dtype} is not supported (expected one of "
            f"{', '.join(str(d) for d in _QUANT_DTYPES)})"
        )
    lo, hi = bounds
    if quant_min < lo or quant_max > hi:
        raise ValueError(
            f"{what}: quant range [{quant_min}, {quant_max}] is outside {dtype}'s [{lo}, {hi}]"
        )


def _check_float_input(what: str, x: torch.Tensor) -> None:
    if x.dtype not in _FLOATS:
        raise ValueError(f"{what}: input has dtype {x.dtype}, expected a floating dtype")


def _check_int_input(what: str, q: torch.Tensor, dtype: torch.dtype) -> None:
    if q.dtype not in _INT_INPUTS:
        raise ValueError(f"{what}: input has dtype {q.dtype}, expected a quantized integer dtype")
    if q.dtype != dtype:
        raise ValueError(f"{what}: input has dtype {q.dtype}, but the dtype argument says {dtype}")


def _axis(what: str, x: torch.Tensor, axis: int) -> int:
    rank = max(x.dim(), 1)
    if not -rank <= axis < rank:
        raise ValueError(f"{what}: axis {axis} is out of range for a {x.dim()}-d input")
    return axis % rank


def _channel_view(
    t: torch.Tensor, x: torch.Tensor, axis: int, what: str, name: str
) -> torch.Tensor:
    """``t`` (one value per channel along ``axis`` of ``x``) shaped to broadcast over ``x``."""
    channels = x.shape[axis] if x.dim() else 1
    if t.numel() != channels:
        raise ValueError(
            f"{what}: {name} has {t.numel()} values, input has {channels} channels on axis {axis}"
        )
    shape = [1] * x.dim()
    if shape:
        shape[axis] = channels
    return t.reshape(shape)


# --------------------------------------------------------------------------------------
# quantize / dequantize


def _product(x: torch.Tensor, inv: torch.Tensor | float) -> torch.Tensor:
    """``(float)(inv_scale * x)``: float32 product (a double input multiplies in double)."""
    if x.dtype == torch.float64:
        if isinstance(inv, torch.Tensor):
            inv = inv.to(torch.float64)
        return (x * inv).to(torch.float32)
    return x.to(torch.float32) * inv


def _requantize(
    prod: torch.Tensor,
    zero_point: torch.Tensor | int,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """``clamp(zero_point + round(prod))`` as ``dtype`` (``prod`` a float32 tensor)."""
    q = torch.round(prod)
    if dtype == torch.int32:  # beyond float32's exact integers: finish in double
        q = q.to(torch.float64)
    q = q + zero_point
    return q.clamp_(quant_min, quant_max).to(dtype)


def quantize_per_tensor(
    x: torch.Tensor,
    scale: float | torch.Tensor,
    zero_point: int | torch.Tensor,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Affine per-tensor quantization (``scale``/``zero_point`` numbers or 1-element tensors)."""
    what = "quantize_per_tensor"
    _check_float_input(what, x)
    _check_quant_args(what, quant_min, quant_max, dtype)
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1 or zero_point.numel() != 1:  # type: ignore[union-attr]
            raise ValueError(f"{what}: scale and zero_point must have one element each")
        inv: torch.Tensor | float = torch.reciprocal(scale.reshape(()).to(x.device, torch.float32))
        zp: torch.Tensor | int = zero_point.reshape(()).to(x.device)  # type: ignore[union-attr]
    else:
        inv = _inv_scale(float(scale))
        zp = int(zero_point)
    return _requantize(_product(x, inv), zp, quant_min, quant_max, dtype)


def dequantize_per_tensor(
    q: torch.Tensor,
    scale: float | torch.Tensor,
    zero_point: int | torch.Tensor,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``(q - zero_point) * scale`` in float32 (converted to ``out_dtype`` when given)."""
    what = "dequantize_per_tensor"
    _check_int_input(what, q, dtype)
    if quant_min > quant_max:
        raise ValueError(f"{what}: quant_min {quant_min} > quant_max {quant_max}")
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1 or zero_point.numel() != 1:  # type: ignore[union-attr]
            raise ValueError(f"{what}: scale and zero_point must have one element each")
        s: torch.Tensor | float = scale.reshape(()).to(q.device, torch.float32)
        zp: torch.Tensor | int = zero_point.reshape(()).to(q.device, torch.int32)  # type: ignore[union-attr]
    else:
        s = _round_to_float32(float(scale))
        zp = int(zero_point)
    result = _centered(q, zp) * s
    return result if out_dtype is None else result.to(out_dtype)


def _centered(q: torch.Tensor, zero_point: torch.Tensor | int) -> torch.Tensor:
    """``q - zero_point`` as float32 (int32 arithmetic first for 32-bit inputs)."""
    if q.dtype == torch.int32:
        return (q - zero_point).to(torch.float32)
    # 8/16-bit values and their differences are exact in float32
    if isinstance(zero_point, torch.Tensor):
        zero_point = zero_point.to(torch.float32)
    return q.to(torch.float32) - zero_point


def quantize_per_channel(
    x: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor,
    axis: int,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Affine quantization with one (scale, zero_point) per index of ``axis``."""
    what = "quantize_per_channel"
    _check_float_input(what, x)
    _check_quant_args(what, quant_min, quant_max, dtype)
    axis = _axis(what, x, axis)
    inv = torch.reciprocal(
        _channel_view(scales, x, axis, what, "scales").to(x.device, torch.float32)
    )
    zp = _channel_view(zero_points, x, axis, what, "zero_points").to(x.device)
    return _requantize(_product(x, inv), zp, quant_min, quant_max, dtype)


def dequantize_per_channel(
    q: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor | None,
    axis: int,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``(q - zero_points[c]) * scales[c]`` for channel ``c`` along ``axis``."""
    what = "dequantize_per_channel"
    _check_int_input(what, q, dtype)
    if quant_min > quant_max:
        raise ValueError(f"{what}: quant_min {quant_min} > quant_max {quant_max}")
    axis = _axis(what, q, axis)
    s = _channel_view(scales, q, axis, what, "scales").to(q.device, torch.float32)
    if zero_points is None:
        centered = _centered(q, 0)
    else:
        zp = _channel_view(zero_points, q, axis, what, "zero_points").to(q.device, torch.int32)
        centered = _centered(q, zp)
    result = centered * s
    return result if out_dtype is None else result.to(out_dtype)


def _tokens(x: torch.Tensor) -> torch.Tensor:
    if x.dim() == 0:
        raise ValueError("per-token quantization needs an input of at least one dimension")
    return x.reshape(-1, x.shape[-1])


def _per_row(t: torch.Tensor, rows: int) -> torch.Tensor | None:
    """``t`` as a column of ``rows`` values, or None if it does not hold one per row."""
    return t.reshape(rows, 1) if t.numel() == rows else None


def quantize_per_token(
    x: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Quantization with one (scale, zero_point) per row of the last dimension."""
    if x.dtype == torch.float32 and x.dim() > 0 and dtype != torch.int32:
        # the common case in four fused steps: product, round, shift, clamp (same rules)
        _check_quant_args("quantize_per_token", quant_min, quant_max, dtype)
        rows = _tokens(x)
        n = rows.shape[0]
        s, zp = _per_row(scales, n), _per_row(zero_points, n)
        if s is not None and zp is not None:
            inv = torch.reciprocal(s.to(x.device, torch.float32))
            q = torch.mul(rows, inv).round_().add_(zp.to(x.device)).clamp_(quant_min, quant_max)
            return q.to(dtype).reshape(x.shape)
    q = quantize_per_channel(
        _tokens(x), scales.reshape(-1), zero_points.reshape(-1), 0, quant_min, quant_max, dtype
    )
    return q.reshape(x.shape)


def dequantize_per_token(
    q: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor,
    quant_min: int,
    quant_max: int,
    dtype: torch.dtype,
    output_dtype: torch.dtype,
) -> torch.Tensor:
    """Dequantization with one (scale, zero_point) per row of the last dimension."""
    if q.dtype == dtype and q.dtype in _INT_INPUTS and q.dtype != torch.int32 and q.dim() > 0:
        if quant_min > quant_max:
            raise ValueError(f"dequantize_per_token: quant_min {quant_min} > quant_max {quant_max}")
        rows = _tokens(q)
        n = rows.shape[0]
        s, zp = _per_row(scales, n), _per_row(zero_points, n)
        if s is not None and zp is not None:
            # (q - zp) * (float)scale in float32, as the per-channel path computes it
            centered = rows.to(torch.float32).sub_(zp.to(q.device, torch.int32))
            x = centered.mul_(s.to(q.device, torch.float32))
            return x.reshape(q.shape).to(output_dtype)
    x = dequantize_per_channel(
        _tokens(q), scales.reshape(-1), zero_points.reshape(-1), 0, quant_min, quant_max, dtype
    )
    return x.reshape(q.shape).to(output_dtype)


# --------------------------------------------------------------------------------------
# choosing parameters


def scale_zero_point(
    lo: torch.Tensor, hi: torch.Tensor, quant_min: int, quant_max: int, *, traced: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale (float64) and zero point (int64) for float32 ranges ``[lo, hi]``, elementwise
    (``traced``: the branch for tiny scales is always taken, through ``where``)."""
    lo = lo.clamp(max=0.0)
    hi = hi.clamp(min=0.0)
    span = quant_max - quant_min
    lo_d = lo.to(torch.float64)
    hi_d = hi.to(torch.float64)
    scale = (hi_d - lo_d) / span
    s32 = scale.to(torch.float32)
    scale = scale.masked_fill((s32 == 0) | torch.isinf(torch.reciprocal(s32)), 0.1)
    small = scale < _SMALL_SCALE
    # rare on the host: skip the work there (not when traced: no test of the data)
    if traced or lo.device.type != "cpu" or bool(small.any()):
        # a scale under the floor becomes the floor, and the range is stretched to match
        # the float32 quotient, correctly rounded (through float64, a tensor division:
        # ``number / tensor`` multiplies by the reciprocal, one rounding too many)
        floor = torch.full_like(scale, _SMALL_SCALE)
        amplifier = (floor / scale.to(torch.float32).to(torch.float64)).to(torch.float32)
        lo_zero, hi_zero = lo == 0, hi == 0
        lo_small = torch.where(
            lo_zero,
            lo,
            torch.where(hi_zero, _round_to_float32(-_SMALL_SCALE * span), lo * amplifier),
        )
        hi_small = torch.where(
            lo_zero,
            _round_to_float32(_SMALL_SCALE * span),
            torch.where(hi_zero, hi, hi * amplifier),
        )
        lo_d = torch.where(small, lo_small, lo).to(torch.float64)
        hi_d = torch.where(small, hi_small, hi).to(torch.float64)
        scale = scale.masked_fill(small, _SMALL_SCALE)
    lo_s = lo_d / scale
    hi_s = hi_d / scale
    # the zero point from the end with the smaller error, nudged into range, rounded as a
    # float32 (clamping first is the same as nudging: the bounds are integers)
    from_min = (abs(quant_min) - lo_s.abs()) < (abs(quant_max) - hi_s.abs())
    initial = torch.where(from_min, quant_min - lo_s, quant_max - hi_s)
    zero_point = torch.round(initial.clamp(quant_min, quant_max).to(torch.float32))
    return scale, zero_point.to(torch.int64)


def _scale_zero_point_scalar(
    lo: float, hi: float, quant_min: int, quant_max: int
) -> tuple[float, int]:
    """:func:`scale_zero_point` for one float32 range, with Python floats (doubles).

    Each float32 step of the tensor version is a double operation rounded to float32
    (:func:`_round_to_float32`), which gives the same bits: a sum, product or quotient of two float32
    values rounded first to double then to float32 equals the correctly rounded float32
    result (double has more than twice float32's precision)."""
    lo = min(lo, 0.0)
    hi = max(hi, 0.0)
    span = quant_max - quant_min
    scale = (hi - lo) / span
    s32 = _round_to_float32(scale)
    if s32 == 0.0 or math.isinf(_round_to_float32(1.0 / s32)):
        scale = 0.1
    if scale < _SMALL_SCALE:
        amplifier = _round_to_float32(_SMALL_SCALE / _round_to_float32(scale))
        if lo == 0.0:
            hi = _round_to_float32(_SMALL_SCALE * span)
        elif hi == 0.0:
            lo = _round_to_float32(-_SMALL_SCALE * span)
        else:
            lo, hi = _round_to_float32(lo * amplifier), _round_to_float32(hi * amplifier)
        scale = _SMALL_SCALE
    lo_s = lo / scale
    hi_s = hi / scale
    if (abs(quant_min) - abs(lo_s)) < (abs(quant_max) - abs(hi_s)):
        initial = quant_min - lo_s
    else:
        initial = quant_max - hi_s
    return scale, round(_round_to_float32(min(max(initial, quant_min), quant_max)))


# Up to this many rows, parameters are chosen with Python floats on the host (a handful of
# scalar steps per row instead of about twenty tensor operations); more rows, or tensors on
# another device, take the vectorized path. Both give the same bits.
_SCALAR_ROWS = 64


def _choose_rows(
    rows: torch.Tensor, quant_min: int, quant_max: int, traced: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scales (float64) and zero points (int64) of each row of a 2-D float32 tensor
    (``traced``: always the vectorized path, which reads no data on the host). A NaN in
    a row is no part of its range, as ExecuTorch's kernels' comparisons leave it out."""
    host = not traced and rows.device.type == "cpu"
    if not host:
        lo, hi = _ranges_without_nan(rows)
        return scale_zero_point(lo, hi, quant_min, quant_max, traced=traced)
    lo, hi = torch.aminmax(rows, dim=-1)
    if rows.shape[0] > _SCALAR_ROWS:
        if bool(torch.isnan(lo).any()):
            lo, hi = _ranges_without_nan(rows)
        return scale_zero_point(lo, hi, quant_min, quant_max)
    low, high = lo.tolist(), hi.tolist()
    total = sum(low)  # NaN when a row's minimum is (or inf - inf: the same ranges again)
    if total != total:
        low, high = (t.tolist() for t in _ranges_without_nan(rows))
    pairs = [
        _scale_zero_point_scalar(a, b, quant_min, quant_max) for a, b in zip(low, high, strict=True)
    ]
    scale = torch.tensor([sc for sc, _ in pairs], dtype=torch.float64)
    zp = torch.tensor([z for _, z in pairs], dtype=torch.int64)
    return scale, zp


def _ranges_without_nan(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's smallest and largest value, NaN left out (a row of NaN: +inf, -inf,
    which the zero clamps of :func:`scale_zero_point` make an empty range)."""
    nan = torch.isnan(rows)
    return rows.masked_fill(nan, math.inf).amin(-1), rows.masked_fill(nan, -math.inf).amax(-1)


def choose_qparams(
    x: torch.Tensor,
    quant_min: int,
    quant_max: int,
    eps: float,
    dtype: torch.dtype,
    *,
    traced: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor (scale [1] float64, zero_point [1] int64) covering ``x``'s range."""
    what = "choose_qparams"
    if quant_min >= quant_max:
        raise ValueError(f"{what}: quant_min {quant_min} must be less than quant_max {quant_max}")
    if x.dtype != torch.float32:
        raise ValueError(f"{what}: input has dtype {x.dtype}, expected float32")
    if x.numel() == 0:
        raise ValueError(f"{what}: input is empty")
    return _choose_rows(x.reshape(1, -1), quant_min, quant_max, traced)


def choose_qparams_per_token_asymmetric(
    x: torch.Tensor, dtype: torch.dtype, *, traced: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (of the last dimension) scales and zero points for int8's range, each of
    shape ``x.shape[:-1] + (1,)``."""
    what = "choose_qparams_per_token_asymmetric"
    if x.dtype != torch.float32:
        raise ValueError(f"{what}: input has dtype {x.dtype}, expected float32")
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"{what}: input needs a non-empty last dimension")
    rows = _tokens(x)
    shape = (*x.shape[:-1], 1)
    if rows.shape[0] == 0:
        return torch.empty(shape, dtype=torch.float64, device=x.device), torch.empty(
            shape, dtype=torch.int64, device=x.device
        )
    scale, zp = _choose_rows(rows, -128, 127, traced)
    return scale.reshape(shape), zp.reshape(shape)


# --------------------------------------------------------------------------------------
# embeddings, matmuls, add


def unpack(weight: torch.Tensor, nbit: int) -> torch.Tensor:
    """Signed values of packed ``nbit`` weights, one int16 per value (traceable)."""
    w = weight.to(torch.int16)
    if nbit == 8:
        return w
    if nbit == 4:
        parts = [w >> 4, w & 0x0F]  # even columns in the high nibble
        offset = 8
    elif nbit == 2:
        parts = [w & 3, (w >> 2) & 3, (w >> 4) & 3, (w >> 6) & 3]  # lowest bits first
        offset = 2
    else:
        raise ValueError(f"embedding: unsupported bit width {nbit}")
    return torch.stack(parts, dim=-1).reshape(*w.shape[:-1], -1) - offset


def _embedding_name(nbit: int) -> str:
    return f"embedding_{'byte' if nbit == 8 else f'{nbit}bit'}"


def _check_embedding(
    weight: torch.Tensor,
    scales: torch.Tensor,
    quant_min: int,
    quant_max: int,
    indices: torch.Tensor,
    nbit: int,
) -> None:
    """The checks of :func:`embedding_xbit` that read no data (shapes, dtypes, the scale
    groups): a traced program makes them too."""
    what = _embedding_name(nbit)
    if nbit not in (8, 4, 2):
        raise ValueError(f"embedding: unsupported bit width {nbit}")
    if weight.dim() != 2:
        raise ValueError(f"{what}: weight must be 2-D, got {weight.dim()}-D")
    if scales.dim() not in (1, 2) or scales.shape[0] != weight.shape[0]:
        raise ValueError(
            f"{what}: scales must be [{weight.shape[0]}] or [{weight.shape[0]}, groups], got "
            f"{list(scales.shape)}"
        )
    if quant_min > quant_max:
        raise ValueError(f"{what}: quant_min {quant_min} > quant_max {quant_max}")
    if indices.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{what}: indices have dtype {indices.dtype}, expected int64 or int32")
    dim = weight.shape[1] * (8 // nbit)
    groups = scales.shape[1] if scales.dim() == 2 else 1
    if groups < 1 or dim % groups:
        raise ValueError(f"{what}: {groups} scale groups do not divide the embedding dim {dim}")


def _embedding_rows(
    weight: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor | None,
    indices: torch.Tensor,
    nbit: int,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The computation of :func:`embedding_xbit` on arguments :func:`_check_embedding`
    accepted and indices in range."""
    index = indices.to(torch.int64)
    values = unpack(weight[index], nbit)
    dim = values.shape[-1]
    groups = scales.shape[1] if scales.dim() == 2 else 1
    lead = tuple(indices.shape)
    grouped = values.reshape(*lead, groups, dim // groups).to(torch.float32)
    s = scales[index].reshape(*lead, groups, 1).to(torch.float32)
    if zero_points is not None:
        zp = zero_points[index].reshape(*lead, groups, 1).to(torch.float32)
        grouped = grouped - zp
    result = (grouped * s).reshape(*lead, dim)
    return result if out_dtype is None else result.to(out_dtype)


def embedding_xbit(
    weight: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor | None,
    quant_min: int,
    quant_max: int,
    indices: torch.Tensor,
    nbit: int,
    out_dtype: torch.dtype | None = None,
    *,
    traced: bool = False,
) -> torch.Tensor:
    """Rows ``indices`` of a quantized table, dequantized per row or per group of columns.

    ``weight`` is [rows, dim] (8-bit: uint8/int8 values) or [rows, dim * nbit / 8] (packed
    uint8); ``scales`` is [rows] or [rows, groups]; the result is ``indices.shape + [dim]``,
    float32 unless ``out_dtype`` is given (the caller stores it into ``out``). ``traced``:
    the indices' range is not checked on the host; the gather refuses them.
    """
    _check_embedding(weight, scales, quant_min, quant_max, indices, nbit)
    if traced:
        indices = traced_indices(indices, weight.shape[0])
    elif indices.numel():  # host side: reads the indices
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 0 or hi >= weight.shape[0]:
            raise IndexError(
                f"{_embedding_name(nbit)}: index out of range [0, {weight.shape[0]}): got "
                f"values in [{lo}, {hi}]"
            )
    return _embedding_rows(weight, scales, zero_points, indices, nbit, out_dtype)


def _mixed_mm_weight(
    weight: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None
) -> torch.Tensor:
    """``weight * scales[:, None]`` in float32 (int8 ``weight`` [n, p], ``scales`` [n])."""
    what = "mixed_mm"
    if zero_points is not None:
        raise ValueError(f"{what}: zero points are not supported (ExecuTorch rejects them too)")
    if weight.dim() != 2 or scales.dim() != 1:
        raise ValueError(f"{what}: expected 2-D input and weight and 1-D scales")
    if weight.dtype != torch.int8:
        raise ValueError(f"{what}: weight has dtype {weight.dtype}, expected int8")
    if scales.shape[0] != weight.shape[0]:
        raise ValueError(
            f"{what}: weight {list(weight.shape)} with {scales.shape[0]} scales does not fit"
        )
    return weight.to(torch.float32) * scales.to(torch.float32)[:, None]


def _mixed_mm_apply(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if x.dim() != 2:
        raise ValueError("mixed_mm: expected 2-D input and weight and 1-D scales")
    if x.shape[1] != w.shape[0]:
        raise ValueError(
            f"mixed_mm: shapes {list(x.shape)} @ {list(w.shape)} with {w.shape[0]} scales "
            "do not fit"
        )
    return (x.to(torch.float32) @ w).to(x.dtype)


def mixed_mm(
    x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None
) -> torch.Tensor:
    """``x @ (weight * scales[:, None])`` with int8 ``weight`` [n, p] and ``scales`` [n]."""
    return _mixed_mm_apply(x, _mixed_mm_weight(weight, scales, zero_points))


def _mixed_linear_weight(
    weight: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None
) -> torch.Tensor:
    """The dequantized weight [p, n] in float32 (per-row or per-group scales)."""
    what = "mixed_linear"
    if zero_points is not None:
        raise ValueError(f"{what}: zero points are not supported (ExecuTorch rejects them too)")
    if weight.dim() != 2 or scales.dim() not in (1, 2):
        raise ValueError(f"{what}: expected 2-D input and weight and 1-D or 2-D scales")
    if weight.dtype != torch.int8:
        raise ValueError(f"{what}: weight has dtype {weight.dtype}, expected int8")
    if scales.shape[0] != weight.shape[0]:
        raise ValueError(
            f"{what}: weight {list(weight.shape)} and scales {list(scales.shape)} do not fit"
        )
    n = weight.shape[1]
    s = scales.to(torch.float32)
    if s.dim() == 1:
        s = s[:, None]
    else:
        group = math.ceil(n / s.shape[1]) if n else 1
        cols = torch.arange(n, device=s.device) // group
        s = s[:, cols]
    return weight.to(torch.float32) * s


def _mixed_linear_apply(
    x: torch.Tensor, w: torch.Tensor, dtype: torch.dtype | None
) -> torch.Tensor:
    if x.dim() != 2:
        raise ValueError("mixed_linear: expected 2-D input and weight and 1-D or 2-D scales")
    if x.shape[1] != w.shape[1]:
        raise ValueError(
            f"mixed_linear: input {list(x.shape)} and weight {list(w.shape)} do not fit"
        )
    result = x.to(torch.float32) @ w.T
    return result.to(dtype if dtype is not None else x.dtype)


def mixed_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor | None,
    dtype: torch.dtype | None,
) -> torch.Tensor:
    """``x @ dequant(weight).T`` with int8 ``weight`` [p, n] and ``scales`` [p] or [p, groups]
    (groups of ``ceil(n / groups)`` columns, the last one possibly shorter)."""
    return _mixed_linear_apply(x, _mixed_linear_weight(weight, scales, zero_points), dtype)


def quantized_add(
    a: torch.Tensor,
    a_scale: float,
    a_zero_point: int,
    a_quant_min: int,
    a_quant_max: int,
    b: torch.Tensor,
    b_scale: float,
    b_zero_point: int,
    b_quant_min: int,
    b_quant_max: int,
    out_scale: float,
    out_zero_point: int,
    out_quant_min: int,
    out_quant_max: int,
) -> torch.Tensor:
    """Dequantize ``a`` and ``b``, add in float32, quantize with the output's parameters."""
    what = "quantized add"
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(
            f"{what}: operands must have the same shape and dtype, got {list(a.shape)} "
            f"{a.dtype} and {list(b.shape)} {b.dtype}"
        )
    if a.dtype not in _INT_INPUTS:
        raise ValueError(f"{what}: operands have dtype {a.dtype}, expected an integer dtype")
    for name, lo, hi in (
        ("a", a_quant_min, a_quant_max),
        ("b", b_quant_min, b_quant_max),
        ("out", out_quant_min, out_quant_max),
    ):
        if not 0 <= lo <= hi <= 255:
            raise ValueError(f"{what}: {name} quant range [{lo}, {hi}] must lie within [0, 255]")

    def dq(q: torch.Tensor, scale: float, zp: int) -> torch.Tensor:
        # (q - zp) * (double)(float)scale, rounded to float32
        return (
            (q.to(torch.int64) - int(zp)).to(torch.float64) * _round_to_float32(float(scale))
        ).to(torch.float32)

    total = dq(a, a_scale, a_zero_point) + dq(b, b_scale, b_zero_point)
    inv = _inv_scale(float(out_scale))
    q = torch.round(total * inv) + int(out_zero_point)
    return q.clamp_(out_quant_min, out_quant_max).to(a.dtype)


# --------------------------------------------------------------------------------------
# registration (argument layouts of ExecuTorch's quantized.yaml, outs excluded)

_T = Param
_QPT = (
    _T("input", "T"),
    _T("scale", "float"),
    _T("zero_point", "int"),
    _T("quant_min", "int"),
    _T("quant_max", "int"),
    _T("dtype", "dtype"),
)
_QPT_TENSOR = (
    _T("input", "T"),
    _T("scale", "T"),
    _T("zero_point", "T"),
    _T("quant_min", "int"),
    _T("quant_max", "int"),
    _T("dtype", "dtype"),
)
_EMB = (
    _T("weight", "T"),
    _T("weight_scales", "T"),
    _T("weight_zero_points", "T?"),
    _T("weight_quant_min", "int"),
    _T("weight_quant_max", "int"),
    _T("indices", "T"),
)

_Q = "quantized_decomposed::"
register_signature(f"{_Q}quantize_per_tensor.out", Signature(quantize_per_tensor, _QPT))
register_signature(
    f"{_Q}quantize_per_tensor.Tensor_out", Signature(quantize_per_tensor, _QPT_TENSOR)
)
register_signature(
    f"{_Q}dequantize_per_tensor.out",
    Signature(dequantize_per_tensor, (*_QPT, _T("out_dtype", "dtype?"))),
)
register_signature(
    f"{_Q}dequantize_per_tensor.Tensor_out",
    Signature(dequantize_per_tensor, (*_QPT_TENSOR, _T("out_dtype", "dtype?"))),
)
register_signature(
    f"{_Q}quantize_per_channel.out",
    Signature(
        quantize_per_channel,
        (
            _T("input", "T"),
            _T("scales", "T"),
            _T("zero_points", "T"),
            _T("axis", "int"),
            _T("quant_min", "int"),
            _T("quant_max", "int"),
            _T("dtype", "dtype"),
        ),
    ),
)
register_signature(
    f"{_Q}dequantize_per_channel.out",
    Signature(
        dequantize_per_channel,
        (
            _T("input", "T"),
            _T("scales", "T"),
            _T("zero_points", "T?"),
            _T("axis", "int"),
            _T("quant_min", "int"),
            _T("quant_max", "int"),
            _T("dtype", "dtype"),
            _T("out_dtype", "dtype?"),
        ),
    ),
)
_PER_TOKEN = (
    _T("input", "T"),
    _T("scales", "T"),
    _T("zero_points", "T"),
    _T("quant_min", "int"),
    _T("quant_max", "int"),
    _T("dtype", "dtype"),
)
register_signature(f"{_Q}quantize_per_token.out", Signature(quantize_per_token, _PER_TOKEN))
register_signature(
    f"{_Q}dequantize_per_token.out",
    Signature(dequantize_per_token, (*_PER_TOKEN, _T("output_dtype", "dtype"))),
)
register_signature(
    f"{_Q}choose_qparams.Tensor_out",
    Signature(
        choose_qparams,
        (
            _T("input", "T"),
            _T("quant_min", "int"),
            _T("quant_max", "int"),
            _T("eps", "float"),
            _T("dtype", "dtype"),
        ),
        outs=2,
        flagged=True,
    ),
)
register_signature(
    f"{_Q}choose_qparams_per_token_asymmetric.out",
    Signature(
        choose_qparams_per_token_asymmetric,
        (_T("input", "T"), _T("dtype", "dtype")),
        outs=2,
        flagged=True,
    ),
)

# A table whose dequantized form is at most this many bytes is dequantized once at load, so
# a lookup is one row gather; larger tables (a real LLM's vocabulary) stay packed.
_PREPARED_TABLE_BYTES = 64 << 20


def _gather(
    table: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype | None, what: str
) -> torch.Tensor:
    """Rows ``indices`` of a dequantized table (float32), as ``dtype``."""
    if indices.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{what}: indices have dtype {indices.dtype}, expected int64 or int32")
    if table.device.type != "cpu" and indices.numel():  # CUDA would assert on the device
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 0 or hi >= table.shape[0]:
            raise IndexError(
                f"{what}: index out of range [0, {table.shape[0]}): got values in [{lo}, {hi}]"
            )
    try:
        rows = torch.nn.functional.embedding(indices, table)
    except IndexError:
        lo, hi = int(indices.min()), int(indices.max())
        raise IndexError(
            f"{what}: index out of range [0, {table.shape[0]}): got values in [{lo}, {hi}]"
        ) from None
    return rows if dtype is None else rows.to(dtype)


def _prepared_table(ctx: KernelContext, nbit: int) -> torch.Tensor | None:
    """The whole table dequantized (float32), when the weight, scales and zero points are
    constants of the program and the result is small; else None."""
    weight_i, scales_i, zp_i, qmin_i, qmax_i = ctx.args[:5]
    for i in (weight_i, scales_i, zp_i):
        v = ctx.values[i]
        if isinstance(v, p.Null) and i == zp_i:
            continue
        if not isinstance(v, p.Tensor) or not v.is_constant:
            return None
    if not (ctx.is_literal(qmin_i) and ctx.is_literal(qmax_i)):
        return None
    qmin, qmax = ctx.literal(qmin_i), ctx.literal(qmax_i)
    if type(qmin) is not int or type(qmax) is not int:
        return None  # not ints: the per-call kernel's argument checks report it
    weight = ctx.initial[weight_i]
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        return None
    if weight.shape[0] * weight.shape[1] * (8 // nbit) * 4 > _PREPARED_TABLE_BYTES:
        return None
    zp = None if isinstance(ctx.values[zp_i], p.Null) else ctx.initial[zp_i]
    every = torch.arange(weight.shape[0], device=weight.device)
    try:  # the per-call kernel on every row: the same numbers, and the same checks
        table = embedding_xbit(
            weight,
            ctx.initial[scales_i],
            zp,
            qmin,
            qmax,
            every,
            nbit,
        )
    except (ValueError, IndexError, RuntimeError):
        return None  # bad arguments: the per-call kernel reports them when it runs
    return table.contiguous()


def _embedding_signature(nbit: int, with_dtype: bool) -> Signature:
    """``embedding_{byte,4bit,2bit}`` (``.dtype_out`` with the output dtype argument)."""

    def kernel(
        weight: torch.Tensor,
        scales: torch.Tensor,
        zero_points: torch.Tensor | None,
        quant_min: int,
        quant_max: int,
        indices: torch.Tensor,
        dtype: torch.dtype | None = None,
        *,
        traced: bool = False,
    ) -> torch.Tensor:
        return embedding_xbit(
            weight, scales, zero_points, quant_min, quant_max, indices, nbit, dtype, traced=traced
        )

    params = (*_EMB, _T("dtype", "dtype?")) if with_dtype else _EMB
    return Signature(kernel, params, flagged=True)


def _embedding_factory(signature: Signature, nbit: int) -> KernelFactory:
    """The interpreter's factory: one row gather from the table dequantized at load
    (:func:`_prepared_table`), else the kernel on every call."""
    what = _embedding_name(nbit)
    params = signature.params
    per_call = signature.factory()

    def factory(ctx: KernelContext) -> Statement:
        table = _prepared_table(ctx, nbit) if len(ctx.args) == len(params) + 2 else None
        if table is None:
            return per_call(ctx)
        prepared = table

        def lookup(
            weight: torch.Tensor,
            scales: torch.Tensor,
            zero_points: torch.Tensor | None,
            quant_min: int,
            quant_max: int,
            indices: torch.Tensor,
            dtype: torch.dtype | None = None,
        ) -> torch.Tensor:
            return _gather(prepared, indices, dtype, what)

        return fixed_kernel(lookup, params)(ctx)

    return factory


for _name, _nbit in (("embedding_byte", 8), ("embedding_4bit", 4), ("embedding_2bit", 2)):
    for _suffix, _with_dtype in ((".out", False), (".dtype_out", True)):
        _sig = _embedding_signature(_nbit, _with_dtype)
        register_signature(f"{_Q}{_name}{_suffix}", _sig, _embedding_factory(_sig, _nbit))


def _constant_tensors(
    ctx: KernelContext, positions: tuple[int, ...]
) -> list[torch.Tensor | None] | None:
    """The load-time tensors of the arguments at ``positions`` when each is a constant of
    the program (an absent optional argument gives None); else None."""
    found: list[torch.Tensor | None] = []
    for k in positions:
        v = ctx.values[ctx.args[k]]
        if isinstance(v, p.Null):
            found.append(None)
        elif isinstance(v, p.Tensor) and v.is_constant:
            found.append(ctx.initial[ctx.args[k]])
        else:
            return None
    return found


def _weight_prepared_at_load(
    signature: Signature,
    prepare: Callable[..., torch.Tensor],
    apply: Callable[[torch.Tensor, torch.Tensor, tuple[Any, ...]], torch.Tensor],
) -> KernelFactory:
    """A factory for a matmul whose weight arguments (params 1..3: weight, scales, zero
    points) are dequantized once at load when they are constants; ``apply(x, w, rest)``
    then runs each call. Otherwise (or when the weight is invalid: the call reports it)
    the signature's function runs every call."""
    params = signature.params
    per_call = signature.factory()

    def factory(ctx: KernelContext) -> Statement:
        consts = _constant_tensors(ctx, (1, 2, 3)) if len(ctx.args) == len(params) + 2 else None
        if consts is None or consts[0] is None or consts[1] is None:
            return per_call(ctx)
        try:
            w = prepare(*consts).contiguous()
        except (ValueError, RuntimeError):
            return per_call(ctx)

        def run(x: torch.Tensor, *rest: Any) -> torch.Tensor:
            return apply(x, w, rest[3:])

        return fixed_kernel(run, params)(ctx)

    return factory


_MIXED_MM = Signature(
    mixed_mm,
    (_T("input", "T"), _T("weight", "T"), _T("weight_scales", "T"), _T("weight_zero_points", "T?")),
)
register_signature(
    f"{_Q}mixed_mm.out",
    _MIXED_MM,
    _weight_prepared_at_load(_MIXED_MM, _mixed_mm_weight, lambda x, w, rest: _mixed_mm_apply(x, w)),
)
_MIXED_LINEAR = Signature(
    mixed_linear,
    (
        _T("input", "T"),
        _T("weight", "T"),
        _T("weight_scales", "T"),
        _T("weight_zero_points", "T?"),
        _T("dtype", "dtype?"),
    ),
)
register_signature(
    f"{_Q}mixed_linear.out",
    _MIXED_LINEAR,
    _weight_prepared_at_load(
        _MIXED_LINEAR, _mixed_linear_weight, lambda x, w, rest: _mixed_linear_apply(x, w, rest[0])
    ),
)
_ADD_SIDE = ("scale", "float"), ("zero_point", "int"), ("quant_min", "int"), ("quant_max", "int")
register_signature(
    f"{_Q}add.out",
    Signature(
        quantized_add,
        (
            _T("a", "T"),
            *(_T(f"a_{n}", k) for n, k in _ADD_SIDE),
            _T("b", "T"),
            *(_T(f"b_{n}", k) for n, k in _ADD_SIDE),
            *(_T(f"out_{n}", k) for n, k in _ADD_SIDE),
        ),
    ),
)
