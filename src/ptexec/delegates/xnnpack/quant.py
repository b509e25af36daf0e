"""XNNPACK's int8 arithmetic, static and dynamic, reproduced with torch.

XNNPACK runs a statically quantized graph in integers: a convolution or fully connected
node accumulates ``(q - zero_point) * w`` exactly in int32, adds its int32 bias and
requantizes once, ``round(float(acc) * scale) + zero_point``, with one float32 scale per
output channel; additions use 20-bit fixed-point multipliers and a rounding shift; a mean
sums its int8 inputs in int32; unary functions are 256-entry tables computed in float.
Running the same graph as float math on dequantized values rounds differently near half
steps, and a real network compounds those one-step differences into visibly different
outputs. This module computes every parameter at load exactly as XNNPACK computes it (its
float32 arithmetic, emulated with correctly rounded Python floats) and provides the
helpers the generated code calls at run time.

Representation. A static quantized value is carried as a float32 tensor holding the
centered integers ``q - zero_point`` (so a convolution reads them as they are: zero
padding is the zero point, as in XNNPACK). Integer accumulation runs as a float32
convolution or matrix product on those integers and the integer weights: exact whenever
every partial sum stays below 2**24, which :func:`exact_in_float32` proves at load from
the weights (else the node computes in float64, exact to 2**53).

Dynamic quantization. An input quantized at run time (per token for a fully connected
node, per batch element for a convolution) gets XNNPACK's asymmetric per-row parameters
(:func:`quantize_rows`, the small per-row arithmetic done in numpy float32), and is carried
as its centered integers with the rows' zero points and scales, computed once for each
distinct input.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "AddParams",
    "Mean",
    "MeanParams",
    "Rows",
    "add_params",
    "exact_in_float32",
    "f32",
    "mean_params",
    "mul_scale",
    "quantize_bound",
    "requant_scales",
    "requantize_params",
    "unary_table",
]

_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")

# the largest integer below which every float32 partial sum of integers is exact
EXACT_F32 = 1 << 24


def f32(x: float) -> float:
    """``x`` rounded to float32 (to nearest, ties to even). An operation on float32
    values computed in float64 and rounded once gives the float32 result."""
    if math.isnan(x) or math.isinf(x):
        return x
    try:
        return float(_F32.unpack(_F32.pack(x))[0])
    except OverflowError:
        return math.copysign(math.inf, x)


def _bits(x: float) -> int:
    return int(_U32.unpack(_F32.pack(x))[0])


def _from_bits(b: int) -> float:
    return float(_F32.unpack(_U32.pack(b & 0xFFFFFFFF))[0])


def _lrint(x: float) -> int:
    """C's ``lrintf`` in the default rounding mode: to nearest, ties to even."""
    return round(x)


def quantize_bound(value: float, scale: float, zero_point: int, qmin: int, qmax: int) -> int:
    """An activation bound (a clamp's min or max) in the output's integers, as XNNPACK
    quantizes it: ``lrintf(clamp(value / scale + zero_point, qmin, qmax))`` in float32."""
    if math.isnan(value):
        return qmin
    v = f32(f32(f32(value) / f32(scale)) + zero_point)
    v = min(max(v, float(qmin)), float(qmax))
    return _lrint(v)


def requant_scales(in_scale: float, w_scales: torch.Tensor, out_scale: float) -> torch.Tensor:
    """Per output channel ``input_scale * kernel_scale / output_scale`` in float32,
    left to right, as XNNPACK's convolution and fully connected operators compute it."""
    a = torch.tensor(in_scale, dtype=torch.float32)
    b = torch.tensor(out_scale, dtype=torch.float32)
    return (a * w_scales.to(torch.float32)) / b


def exact_in_float32(w_abs_sum: float, in_abs_max: int, bias_abs_max: float) -> bool:
    """Whether a float32 accumulation of ``bias + sum((q - zp) * w)`` is exact in any
    order: every partial sum is an integer below 2**24 when ``|bias| + max|q - zp| *
    sum|w|`` is (the largest over output channels)."""
    return bias_abs_max + in_abs_max * w_abs_sum < EXACT_F32


def requantize_params(
    in_scale: float, in_zp: int, out_scale: float, out_zp: int
) -> tuple[int, int]:
    """XNNPACK's int8 -> int8 conversion (a Convert between two quantizations): a Q8
    fixed-point multiplier ``lrintf(256 * in_scale / out_scale)`` and rounding shift 8:
    ``out = (m * (q - in_zp) + 128) >> 8`` plus the output zero point, saturated.
    Returns (multiplier, out_zp)."""
    ratio = f32(f32(in_scale) / f32(out_scale))
    return _lrint(f32(256.0 * ratio)), out_zp


@dataclass(frozen=True, slots=True)
class AddParams:
    """XNNPACK's int8 addition: ``out = (a_c * a_mult + b_c * b_mult + rounding) >>
    shift`` on centered inputs (``q - zero_point``), then the output zero point and a
    clamp to the int8 range."""

    a_mult: int
    b_mult: int
    shift: int

    @property
    def rounding(self) -> int:
        return 1 << (self.shift - 1)


def add_params(a_scale: float, b_scale: float, out_scale: float, sign_b: int = 1) -> AddParams:
    """Multipliers of XNNPACK's int8 add (``sign_b=-1``: subtract): both input/output
    scale ratios in float32, scaled by the power of two that puts the larger one in
    [2**20, 2**21), rounded to integers."""
    a_os = f32(f32(a_scale) / f32(out_scale))
    b_os = f32(f32(f32(b_scale) * sign_b) / f32(out_scale))
    top = max(abs(a_os), abs(b_os))
    exponent = (_bits(top) >> 23) - 127
    shift = 20 - exponent

    def mult(x: float) -> int:
        m = _lrint(_from_bits(_bits(abs(x)) + (shift << 23)))
        return -m if math.copysign(1.0, x) < 0 else m

    if not 1 <= shift <= 31:  # XNNPACK asserts [12, 30]; keep the arithmetic defined
        raise ValueError(f"add scales {a_scale}, {b_scale} -> {out_scale} out of range")
    return AddParams(mult(a_os), mult(b_os), shift)


def mul_scale(a_scale: float, b_scale: float, out_scale: float) -> float:
    """XNNPACK's int8 multiply: ``round(float(a_c * b_c) * scale)``, this scale."""
    return f32(f32(f32(a_scale) * f32(b_scale)) / f32(out_scale))


@dataclass(frozen=True, slots=True)
class MeanParams:
    """XNNPACK's int8 mean over ``count`` elements: the int32 sum of the inputs ``q``,
    then ``round(float(sum) * scale + zero_point)`` in float32, saturated to int8."""

    count: int
    scale: float
    zero_point: float


def mean_params(
    in_scale: float, in_zp: int, out_scale: float, out_zp: int, count: int
) -> MeanParams:
    """The conversion parameters of XNNPACK's int8 mean: ``scale = (in_scale /
    out_scale) * (1 / count)`` and the output zero point less ``count * in_zp * scale``,
    all in float32."""
    s = f32(f32(f32(in_scale) / f32(out_scale)) * f32(1.0 / count))
    zp = f32(out_zp - f32(f32(count * in_zp) * s))
    return MeanParams(count, s, zp)


# unary functions XNNPACK evaluates in float on the 256 dequantized inputs of an int8
# node (its reference kernels, made into a lookup table at setup)


def _hardswish(x: torch.Tensor) -> torch.Tensor:
    return torch.div(x, 6.0) * torch.clamp(x + 3.0, 0.0, 6.0)


def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    e = torch.exp(x.double())
    y = (e / (1 + e)).float()
    return torch.where(x > 100, 1.0, torch.where(x < -100, 0.0, y))


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return ((x / 2).double() * (1 + torch.erf(x.double() * math.sqrt(2) / 2))).float()


def _via64(fn: str) -> object:
    return lambda x: getattr(torch, fn)(x.double()).float()


_TABLES: dict[str, object] = {
    "Hardswish": _hardswish,
    "Sigmoid": _sigmoid,
    "Gelu": _gelu,
    "Tanh": _via64("tanh"),
    "Exp": _via64("exp"),
    "Log": _via64("log"),
    "Sin": _via64("sin"),
    "Cos": _via64("cos"),
    "SquareRoot": _via64("sqrt"),
    "ReciprocalSquareRoot": lambda x: (1 / torch.sqrt(x.double())).float(),
    "Abs": torch.abs,
    "Negate": torch.neg,
    "Square": lambda x: x * x,
    "Floor": torch.floor,
    "Ceiling": torch.ceil,
}


def unary_table(
    node_type: str,
    in_scale: float,
    in_zp: int,
    out_scale: float,
    out_zp: int,
    qmin: int = -128,
    qmax: int = 127,
    fn: object | None = None,
) -> torch.Tensor | None:
    """The lookup table XNNPACK builds for an int8 unary node: for every input ``q`` in
    [qmin, qmax], ``round(f((q - in_zp) * in_scale) * (1 / out_scale) + out_zp)``
    saturated, in float32; returned centered (``- out_zp``) as float32, indexed by
    ``q - qmin``. None for a function without a table here."""
    f = fn if fn is not None else _TABLES.get(node_type)
    if f is None:
        return None
    q = torch.arange(qmin, qmax + 1, dtype=torch.float32)
    x = (q - float(in_zp)) * torch.tensor(in_scale, dtype=torch.float32)
    y = f(x)  # type: ignore[operator]
    assert isinstance(y, torch.Tensor)
    inv = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(out_scale, dtype=torch.float32)
    z = y.to(torch.float32) * inv + float(out_zp)
    z = torch.nan_to_num(z, nan=0.0).round_().clamp_(qmin, qmax)
    return z - float(out_zp)


# ---------------------------------------------------------------------------------------
# run-time helpers (called from the generated code; centered float32 values in and out)


def requantize_(
    acc: torch.Tensor, scale: torch.Tensor | float, lo: float, hi: float
) -> torch.Tensor:
    """In place: an exact integer accumulator (bias included) -> centered output integers,
    ``clamp(round(acc * scale), lo, hi)`` in float32 (``lo``/``hi``: the output bounds less
    the zero point). ``acc`` may be float64 (converted to float32 first, as XNNPACK
    converts its int32 accumulator)."""
    if acc.dtype != torch.float32:
        acc = acc.to(torch.float32)
    return acc.mul_(scale).round_().clamp_(lo, hi)


def add(
    a: torch.Tensor, b: torch.Tensor, a_mult: int, b_mult: int, rounding: int, shift: int,
    lo: float, hi: float,
) -> torch.Tensor:  # fmt: skip
    """XNNPACK's int8 addition on centered inputs: ``(a * a_mult + b * b_mult + rounding)
    >> shift`` (an arithmetic shift: the floor of the quotient), clamped. Computed in
    float64 as ``floor(a * (a_mult / 2**shift) + b * (b_mult / 2**shift) + rounding /
    2**shift)``: the multipliers scaled by a power of two are exact, and every partial
    sum is an integer below 2**31 scaled by the same power, so exact too."""
    scale = 2.0**-shift
    acc = torch.add(
        a.to(torch.float64).mul_(a_mult * scale), b.to(torch.float64), alpha=b_mult * scale
    )
    return acc.add_(rounding * scale).floor_().clamp_(lo, hi).to(torch.float32)


def mul(a: torch.Tensor, b: torch.Tensor, scale: float, lo: float, hi: float) -> torch.Tensor:
    """XNNPACK's int8 multiplication on centered inputs: ``round(a * b * scale)`` (the
    product is an exact integer in float32), clamped."""
    return torch.mul(a, b).mul_(scale).round_().clamp_(lo, hi)


def mean(
    x: torch.Tensor, dims: tuple[int, ...], keepdim: bool, in_zp_sum: float, scale: float,
    zero_point: float, out_zp: int,
) -> torch.Tensor:  # fmt: skip
    """XNNPACK's int8 mean: the exact sum of the inputs (centered sum plus ``count *
    in_zp``), ``round(sum * scale + zero_point)`` in float32, saturated to int8, centered."""
    s = x.sum(dim=dims, keepdim=keepdim).add_(in_zp_sum)
    return s.mul_(scale).add_(zero_point).round_().clamp_(-128.0, 127.0).sub_(out_zp)


def convert(x: torch.Tensor, mult: int, lo: float, hi: float) -> torch.Tensor:
    """XNNPACK's int8 -> int8 conversion on centered values: ``(x * mult + 128) >> 8``,
    clamped (exact in float32: every value is an integer below 2**24)."""
    return torch.mul(x, float(mult)).add_(128.0).mul_(1.0 / 256.0).floor_().clamp_(lo, hi)


def lookup(x: torch.Tensor, table: torch.Tensor, offset: float) -> torch.Tensor:
    """A 256-entry table indexed by the input integers: ``table[x + offset]`` (for
    contiguous indices one ``index_select`` over them, 1.5x faster than advanced
    indexing; traced, always that: advanced indexing's shape function says contiguous
    where its kernel follows the indices' layout)."""
    idx = torch.add(x, offset).to(torch.int64)
    if idx.is_contiguous() or torch.compiler.is_compiling():
        return torch.index_select(table, 0, idx.reshape(-1)).view(idx.shape)
    return table[idx]


class Mean:
    """XNNPACK's int8 mean over some dims (see :func:`mean_params`), its parameters
    computed for each reduction size met (a dynamic shape changes it)."""

    def __init__(self, in_scale: float, in_zp: int, out_scale: float, out_zp: int) -> None:
        self.q = (in_scale, in_zp, out_scale, out_zp)
        self._params: dict[int, MeanParams] = {}

    def __call__(self, x: torch.Tensor, dims: tuple[int, ...], keepdim: bool) -> torch.Tensor:
        count = math.prod(x.shape[d] for d in dims)
        p = self._params.get(count)
        if p is None:
            in_s, in_zp, out_s, out_zp = self.q
            p = self._params[count] = mean_params(in_s, in_zp, out_s, out_zp, max(count, 1))
        in_zp, out_zp = self.q[1], self.q[3]
        return mean(x, dims, keepdim, float(count * in_zp), p.scale, p.zero_point, out_zp)


# ---------------------------------------------------------------------------------------
# dynamic (per-row) quantization


@dataclass(frozen=True, slots=True)
class Rows:
    """An input quantized per row: its centered integers ``q - zp`` (float32, [rows,
    row]), and per row the zero point and scale: [rows, 1] float32 tensors, or Python
    floats (exact float32 values) for a single row."""

    centered: torch.Tensor
    zp: torch.Tensor | float
    scale: torch.Tensor | float


def _row_params(mn: float, mx: float) -> tuple[float, float, float]:
    """(multiplier, zero point, scale) of one row from its minimum and maximum, in float32
    as XNNPACK computes them, with correctly rounded Python floats."""
    lo = min(mn, 0.0)
    hi = max(mx, 0.0)
    d = max(f32(hi - lo), _TINY)
    mult = f32(255.0 / d)
    dmin = f32(lo * mult)
    dmax = f32(hi * mult)
    use_min = f32(f32(dmin - 128.0) + f32(dmax + 127.0)) > 0
    zp = f32(-128.0 - dmin) if use_min else f32(127.0 - dmax)
    return mult, float(round(min(max(zp, -128.0), 127.0))), f32(1.0 / mult)


def _row_fits(mn: float, mx: float, mult: float, zp: float) -> bool:
    """Whether every ``round(x * mult)`` of a row in [mn, mx] already lies in [-128 - zp,
    127 - zp] (the products are monotonic in x), so the clamp can be skipped."""
    return round(f32(mn * mult)) >= -128.0 - zp and round(f32(mx * mult)) <= 127.0 - zp


_TINY = f32(1e-30)


def _c32(x: float) -> np.ndarray:
    return np.array(x, dtype=np.float32)  # a 0-d array: no scalar conversion per use


_NP = {k: _c32(v) for k, v in (("0", 0.0), ("tiny", _TINY), ("255", 255.0), ("128", 128.0),
                                ("127", 127.0), ("-128", -128.0), ("1", 1.0))}  # fmt: skip


def _row_params_np(mn: np.ndarray, mx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_row_params` for many rows, in numpy float32 (IEEE single precision):
    (multiplier, zero point)."""
    c = _NP
    lo = np.minimum(mn, c["0"])
    hi = np.maximum(mx, c["0"])
    mult = np.divide(c["255"], np.maximum(hi - lo, c["tiny"]))
    dmin = lo * mult
    dmax = hi * mult
    use_min = (dmin - c["128"]) + (dmax + c["127"]) > c["0"]
    zp = np.where(use_min, c["-128"] - dmin, c["127"] - dmax)
    zp = np.rint(np.minimum(np.maximum(zp, c["-128"]), c["127"]))
    return mult, zp


def _row_params_torch(mn: torch.Tensor, mx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_row_params_np` with torch ops (for tensors off the CPU)."""
    lo = mn.clamp(max=0.0)
    hi = mx.clamp(min=0.0)
    mult = torch.div(torch.full_like(lo, 255.0), (hi - lo).clamp_(min=_TINY))
    dmin = lo.mul_(mult)
    dmax = hi.mul_(mult)
    use_min = (dmin - 128.0).add_(dmax + 127.0) > 0
    zp = torch.where(use_min, dmin.neg().sub_(128.0), dmax.neg().add_(127.0))
    return mult, zp.clamp_(-128.0, 127.0).round_()


def quantize_rows(x: torch.Tensor, nonbatch: int) -> Rows:
    """Quantize rows (the trailing ``nonbatch`` dims of ``x``) to int8 as XNNPACK's
    dynamic quantization does: per row, a multiplier ``255 / (max - min)`` (the range
    widened to include 0) and a zero point nudged into [-128, 127] and rounded, then
    ``q = clamp(round(x * multiplier) + zp, -128, 127)``; the scale is the multiplier's
    float32 reciprocal. A row of zeros gets multiplier 2.55e32 instead of XNNPACK's 1: the
    same zero point and the same values. The per-row arithmetic runs in Python floats for
    one row (a token being decoded) and in numpy float32 for more (cheaper than a dozen
    torch operations on [rows, 1] tensors, and than a Python loop from two rows on); off
    the CPU, and when traced, in torch float32 operations. A row with a NaN or an
    infinity takes the float32 path: NaN parameters, NaN values."""
    n = x.dim() - nonbatch
    xf = x.reshape(-1, math.prod(x.shape[n:]) if n >= 0 else 1)
    if xf.dtype != torch.float32:
        xf = xf.float()
    rows = xf.shape[0]
    if xf.numel() == 0:
        zeros = xf.new_zeros((rows, 1))
        return Rows(xf, zeros, zeros)
    mn, mx = torch.aminmax(xf, dim=1, keepdim=True)
    # host scalars and numpy only when running: a traced call (the compiled tier) takes
    # the torch formulation, the same float32 arithmetic
    on_cpu = xf.device.type == "cpu" and not torch.compiler.is_compiling()
    if rows == 1 and on_cpu:
        lo, hi = mn.item(), mx.item()
        if math.isfinite(lo) and math.isfinite(hi):
            mult, zp, scale = _row_params(lo, hi)
            c = torch.mul(xf, mult).round_()
            if not _row_fits(lo, hi, mult, zp):
                c = c.clamp_(-128.0 - zp, 127.0 - zp)
            return Rows(c, zp, scale)
    if on_cpu:
        # a row with a NaN or an infinity gets NaN parameters, and NaN values (IEEE
        # arithmetic, as torch's off the CPU: no warnings)
        with np.errstate(all="ignore"):
            m, z = _row_params_np(mn.numpy(), mx.numpy())
            scale_t = torch.from_numpy(np.divide(_NP["1"], m))
        mult_t, zp_t = torch.from_numpy(m), torch.from_numpy(z)
        low = torch.from_numpy(_NP["-128"] - z)
    else:
        mult_t, zp_t = _row_params_torch(mn, mx)
        scale_t = mult_t.reciprocal()
        low = zp_t.neg().sub_(128.0)
    # centered: round(x * mult) within [-128 - zp, 127 - zp], i.e. q - zp
    c = torch.mul(xf, mult_t).round_()
    c = torch.clamp(c, min=low, max=low.add(255.0), out=c)
    return Rows(c, zp_t, scale_t)


def rows_values(r: Rows, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """The dequantized values ``(q - zp) * scale``, in ``shape`` and ``dtype``."""
    return torch.mul(r.centered, r.scale).to(dtype).reshape(shape)


def rows_linear_int(
    r: Rows,
    lead: Sequence[int],
    wt: torch.Tensor,
    colsum: torch.Tensor,
    wscale: torch.Tensor,
    bias: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """A fully connected node on per-row quantized input and int8 weights, accumulated
    exactly in int32 as XNNPACK does: ``(q @ w - zp * sum(w)) * scale * wscale + b``.
    ``wt``: the int8 weights [in, out]; ``colsum``: their sums over ``in`` (int32);
    ``lead``: the input's leading dims. The zero point's share is subtracted in int32:
    ``q @ w`` and ``zp * sum(w)`` may pass 2**24 where their difference does not, and
    XNNPACK rounds only that difference to float32."""
    c, zp = r.centered, r.zp
    if c.numel() == 0:
        out = c.new_zeros((c.shape[0], wt.shape[1]))
    else:
        q = torch.add(c, zp).to(torch.int8)
        acc = torch._int_mm(q, wt)
        if isinstance(zp, float):
            acc = acc.sub_(colsum, alpha=int(zp))
        else:
            acc = acc.sub_(zp.to(torch.int32) * colsum)
        out = acc.to(torch.float32).mul_(r.scale).mul_(wscale)
    if bias is not None:
        out = out.add_(bias)
    return out.to(dtype).reshape(*lead, wt.shape[1])


def rows_linear_float(
    r: Rows,
    lead: Sequence[int],
    w: torch.Tensor,
    wscale: torch.Tensor,
    bias: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """:func:`rows_linear_int` as a float32 product of the centered integers and the
    integer weights ``w`` [out, in] (float32): the same exact accumulator when every
    partial sum stays below 2**24, which the caller proved from the weights."""
    out = torch.nn.functional.linear(r.centered, w).mul_(r.scale)
    out = out.mul_(wscale) if bias is None else torch.addcmul(bias, out, wscale)
    return out.to(dtype).reshape(*lead, w.shape[0])


def rows_conv_scale(
    acc: torch.Tensor, r: Rows, wscale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """A dynamically quantized convolution's integer accumulator (NHWC) -> float:
    ``acc * input_scale[n] * weight_scale[c] + bias[c]`` (``input_scale[n, h, w]`` for an
    input quantized per pixel), in place."""
    s = r.scale
    if not isinstance(s, float):
        per_image = s.numel() == acc.shape[0]
        s = s.reshape(-1, *([1] * (acc.dim() - 1))) if per_image else s.reshape(*acc.shape[:-1], 1)
    out = acc.mul_(s)
    out = out.mul_(wscale)
    return out.add_(bias) if bias is not None else out
