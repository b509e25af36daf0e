"""Run a validated XNNPACK graph with torch: the node list becomes one compiled function.

At load, every node becomes one or two lines of Python calling torch, every constant is
prepared once (zero-copy views of the file where torch can use XNNPACK's layout as is,
repacked otherwise), and the lines are compiled into one function ``run(x0, x1, ...)``
whose arguments are the delegate's tensors in external-id order. The method calls it with
one statement per ``DelegateCall``.

Layout. Each value is a torch tensor whose shape is the value's XNNPACK dims (XNNPACK's
own layout: channels last for 4-d activations). An external tensor enters as
``x.permute(dim_order)`` (how XNNPACK reads its memory) and leaves through
``out.permute(dim_order).copy_(...)``, after the output is resized as ExecuTorch's
runtime resizes it. The transposes the partitioner inserts between NCHW and NHWC become
torch permutations (views); convolutions and pools run on ``permute(0, 3, 1, 2)`` views,
so a channels-first model runs channels first with no copies.

Quantized values are carried as floats that hold their dequantized value
(``(q - zero_point) * scale``): every node computes in float from dequantized inputs and
quantizes its output again when the output is a static int8 value, as XNNPACK's integer
kernels do up to rounding. Dynamically quantized values (per token) are quantized at run
time with XNNPACK's choice of scale and zero point. Weights are dequantized once, at load.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ...codegen import Sources
from ...errors import BackendUnavailableError, PteFormatError
from ...memory import resize_to
from . import schema as s

__all__ = ["ArgInfo", "OutputShapeError", "XnnRunner", "build_runner", "unsupported_node_types"]

_FLOAT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_QSTATIC = {"qint8": (-128, 127), "quint8": (0, 255)}
_QCONST = ("qint8", "quint8", "qint32", "qcint8", "qcint32", "qcint4", "qbint4")
_UNSUPPORTED_TYPES = frozenset({"qpint8", "pfp32"})

# unary nodes: type -> template over the input expression {x}
_UNARY: dict[str, str] = {
    "Abs": "torch.abs({x})",
    "Negate": "torch.neg({x})",
    "Floor": "torch.floor({x})",
    "Ceiling": "torch.ceil({x})",
    "SquareRoot": "torch.sqrt({x})",
    "ReciprocalSquareRoot": "torch.rsqrt({x})",
    "Square": "torch.square({x})",
    "Log": "torch.log({x})",
    "Exp": "torch.exp({x})",
    "Sin": "torch.sin({x})",
    "Cos": "torch.cos({x})",
    "Tanh": "torch.tanh({x})",
    "Sigmoid": "torch.sigmoid({x})",
    "Gelu": "F.gelu({x})",
    "Hardswish": "F.hardswish({x})",
    "Softmax": "torch.softmax({x}, -1)",
}
_BINARY: dict[str, str] = {
    "Add": "torch.add({a}, {b})",
    "Subtract": "torch.sub({a}, {b})",
    "Multiply": "torch.mul({a}, {b})",
    "Div": "torch.div({a}, {b})",
    "Minimum": "torch.minimum({a}, {b})",
    "Maximum": "torch.maximum({a}, {b})",
}
_OTHER = frozenset(
    {
        "Clamp",
        "LeakyReLU",
        "ELU",
        "PReLU",
        "FullyConnected",
        "BatchMatrixMultiply",
        "Conv2d",
        "DepthwiseConv2d",
        "ConvTranspose2d",
        "MaxPooling2d",
        "AvgPooling2d",
        "GlobalAvgPooling2d",
        "ArgMaxPooling2d",
        "StaticTranspose",
        "StaticReshape",
        "StaticSlice",
        "StaticConstantPad",
        "StaticResizeBilinear2D",
        "Concatenate2",
        "Concatenate3",
        "Concatenate4",
        "Concatenate5",
        "Copy",
        "Convert",
    }
)
SUPPORTED_NODE_TYPES = frozenset(_UNARY) | frozenset(_BINARY) | _OTHER

# Below this many flops (per call, at the serialized shape) a CPU convolution runs with
# torch's direct kernel instead of oneDNN's, whose fixed cost per call is larger.
_TINY_CONV_FLOPS = 1_000_000


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
class _Rep:
    """How a value is carried at run time: a float tensor (``dtype``), dequantized when
    ``kind`` is ``q`` (static, per tensor: ``scale``, ``zp``, ``qmin``, ``qmax``) or ``qd``
    (quantized per token at run time), or an integer tensor (``int``)."""

    kind: str
    dtype: torch.dtype
    scale: float = 1.0
    zp: int = 0
    qmin: int = 0
    qmax: int = 0


def unsupported_node_types(payload: s.XnnPayload) -> list[str]:
    """Node types (and unknown type codes) of a payload that this runtime cannot run."""
    bad = sorted({n.type for n in payload.graph.nodes if n.type not in SUPPORTED_NODE_TYPES})
    bad += sorted({f"unknown node type {code}" for _, code in payload.graph.unknown_nodes})
    return bad


# ---------------------------------------------------------------------------------------
# run-time helpers (called from the generated code)


def _fq(t: torch.Tensor, inv: float, scale: float, lo: int, hi: int) -> torch.Tensor:
    """Quantize to ``round(t * inv)`` (XNNPACK's rounding: to nearest even, by the float32
    reciprocal of the scale) clamped to ``[lo, hi]`` (zero point subtracted), and return
    the dequantized values. The same result as ``fake_quantize_per_tensor_affine``, which is
    several times slower on the CPU."""
    return torch.round(t * inv).clamp_(lo, hi).mul_(scale)


def _fq_(t: torch.Tensor, inv: float, scale: float, lo: int, hi: int) -> torch.Tensor:
    """:func:`_fq` in place, for a tensor nothing else refers to."""
    return t.mul_(inv).round_().clamp_(lo, hi).mul_(scale)


def _inv32(scale: float) -> float:
    """1 / scale, computed in float32 as XNNPACK and PyTorch's quantizers compute it."""
    return float(torch.tensor(1.0, dtype=torch.float32) / torch.tensor(scale, dtype=torch.float32))


def _qd8(x: torch.Tensor, nonbatch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize rows (the trailing ``nonbatch`` dims of ``x``) to int8 with XNNPACK's
    asymmetric per-row parameters: (q int8 [rows, row], zero point [rows, 1], scale
    [rows, 1]), the last two float32. The scale is the reciprocal of the multiplier the
    values are quantized with, and the zero point is nudged into [-128, 127] and rounded,
    both as XNNPACK computes them (a row of zeros gets multiplier 2.55e32 instead of 1:
    the same zero point and the same zero values)."""
    n = x.dim() - nonbatch
    xf = x.reshape(-1, math.prod(x.shape[n:]) if n >= 0 else 1)
    if xf.dtype != torch.float32:
        xf = xf.float()
    mn, mx = torch.aminmax(xf, dim=1, keepdim=True)
    mn = mn.clamp_(max=0.0)
    mx = mx.clamp_(min=0.0)
    mult = torch.div(255.0, (mx - mn).clamp_(min=1e-30))
    dmin = mn.mul_(mult)
    dmax = mx.mul_(mult)
    from_min = torch.sub(-128.0, dmin)  # the zero point from the minimum, and from the maximum
    from_max = torch.sub(127.0, dmax)
    use_min = (dmin - 128.0).add_(dmax + 127.0) > 0  # XNNPACK's choice between the two
    zp = torch.where(use_min, from_min, from_max).clamp_(-128.0, 127.0).round_()
    q = torch.mul(xf, mult).round_().add_(zp).clamp_(-128.0, 127.0).to(torch.int8)
    return q, zp, mult.reciprocal_()


def _per_token(x: torch.Tensor, nonbatch: int) -> torch.Tensor:
    """``x`` quantized per row as XNNPACK does (see :func:`_qd8`), then dequantized."""
    if x.numel() == 0:
        return x
    q, zp, scale = _qd8(x, nonbatch)
    return q.float().sub_(zp).mul_(scale).to(x.dtype).reshape(x.shape)


def _qd_linear(
    x: torch.Tensor,
    nonbatch: int,
    wt: torch.Tensor,
    colsum: torch.Tensor,
    wscale: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """A fully connected node on a per-row quantized input and int8 weights, with integer
    accumulation as XNNPACK's kernels do: ``(q @ w - zp * sum(w)) * scale * wscale + b``.
    ``wt``: the int8 weights [in, out]; ``colsum``: their sums over ``in`` (float32)."""
    if x.numel() == 0:
        return x.new_empty((*x.shape[:-1], wt.shape[1]))
    q, zp, scale = _qd8(x, nonbatch)
    acc = torch._int_mm(q, wt).float()
    out = acc.sub_(zp * colsum).mul_(scale).mul_(wscale)
    if bias is not None:
        out = out.add_(bias)
    return out.to(x.dtype).reshape(*x.shape[:-1], wt.shape[1])


class OutputShapeError(RuntimeError):
    """The graph computed an output the program's output tensor cannot hold (the method
    reports it as an :class:`~ptexec.errors.ExecutionError` of the delegate call)."""


def _resize(
    x: torch.Tensor,
    phys: Sequence[int],
    order: tuple[int, ...],
    arg: ArgInfo | None = None,
    k: int = -1,
) -> None:
    """Resize output ``x`` (delegate argument ``k``) to the shape XNNPACK computed
    (``phys``, in dim order), if its declaration ``arg`` allows that shape: a static
    output keeps its sizes, a bounded one stays within its bound in every dim, and the
    rank is fixed."""
    if len(phys) != len(order):
        raise OutputShapeError(
            f"delegate argument {k}: the graph computed {len(phys)} dims {list(phys)} for a "
            f"{len(order)}-d output"
        )
    logical = [0] * len(order)
    for j, d in enumerate(order):
        logical[d] = phys[j]
    if arg is not None and arg.sizes is not None and (arg.static or arg.bounded):
        declared = f"{str(arg.dtype).removeprefix('torch.')}{list(arg.sizes)}"
        if arg.static:
            raise OutputShapeError(
                f"delegate argument {k}: the graph computed {logical}, the program declares {declared}"
            )
        if any(a > b for a, b in zip(logical, arg.sizes, strict=True)):
            raise OutputShapeError(
                f"delegate argument {k}: the graph computed {logical}, beyond the bound "
                f"{declared} the program declares"
            )
    try:
        resize_to(x, logical, order)
    except RuntimeError:
        n = 1
        for d in logical:
            n *= d
        x.resize_(n)
        resize_to(x, logical, order)


def _argmax_pool(
    x: torch.Tensor, kh: int, kw: int, pads: tuple[int, int, int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """XNNPACK argmax pooling on NHWC ``x``: stride = window; the index is the position
    of the (first) maximum inside its window."""
    top, right, bottom, left = pads
    xc = x.permute(0, 3, 1, 2)
    if any(pads):
        xc = F.pad(xc, (left, right, top, bottom), value=-math.inf)
    n, c, h, w = xc.shape
    oh, ow = h // kh, w // kw
    win = xc[:, :, : oh * kh, : ow * kw].reshape(n, c, oh, kh, ow, kw)
    win = win.permute(0, 2, 4, 1, 3, 5).reshape(n, oh, ow, c, kh * kw)
    values, index = win.max(dim=-1)
    return values, index.to(torch.int32)


def _max_pool(
    x: torch.Tensor,
    k: tuple[int, int],
    st: tuple[int, int],
    pads: tuple[int, int, int, int],
    dil: tuple[int, int],
) -> torch.Tensor:
    top, right, bottom, left = pads
    xc = x.permute(0, 3, 1, 2)
    xc = F.pad(xc, (left, right, top, bottom), value=-math.inf)
    return F.max_pool2d(xc, k, st, 0, dil).permute(0, 2, 3, 1)


def _avg_pool(
    x: torch.Tensor, k: tuple[int, int], st: tuple[int, int], pads: tuple[int, int, int, int]
) -> torch.Tensor:
    """Average over the valid (unpadded) elements of each window."""
    top, right, bottom, left = pads
    xc = F.pad(x.permute(0, 3, 1, 2), (left, right, top, bottom))
    ones = F.pad(torch.ones_like(x[:1, :, :, :1]).permute(0, 3, 1, 2), (left, right, top, bottom))
    total = F.avg_pool2d(xc, k, st, 0, divisor_override=1)
    count = F.avg_pool2d(ones, k, st, 0, divisor_override=1)
    return (total / count).permute(0, 2, 3, 1)


_HELPERS: dict[str, Any] = {
    "torch": torch,
    "F": F,
    "_fq": _fq,
    "_fq_": _fq_,
    "_per_token": _per_token,
    "_qd_linear": _qd_linear,
    "_slow_conv2d": torch.ops.aten._slow_conv2d_forward,
    "_resize": _resize,
    "_argmax_pool": _argmax_pool,
    "_max_pool": _max_pool,
    "_avg_pool": _avg_pool,
}


# ---------------------------------------------------------------------------------------
# constants


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


class _Constants:
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
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only buffers: never written
            return torch.frombuffer(mv, dtype=torch.uint8)

    def _typed(self, idx: int, dtype: torch.dtype, count: int) -> torch.Tensor:
        raw = self._bytes(idx)[: count * dtype.itemsize]
        if raw.data_ptr() % dtype.itemsize:
            raw = raw.clone()
        return raw.view(dtype)

    def scales(self, q: s.PerChannelQuant | s.PerChannelGroupQuant) -> torch.Tensor:
        if isinstance(q, s.PerChannelGroupQuant):
            if q.scale_buffer_idx:
                return self._typed(q.scale_buffer_idx, torch.bfloat16, q.num_scales).float()
            return _bf16_truncating(q.scales)
        if q.scale_buffer_idx:
            return self._typed(q.scale_buffer_idx, torch.float32, q.num_scales)
        return torch.tensor(q.scales, dtype=torch.float32)

    def ints(self, v: s.XnnValue) -> torch.Tensor:
        """The integer values of a quantized weight (qcint8; qcint4 and qbint4 with their
        zero point 8 removed) as int8, in XNNPACK's dims, on the host."""
        if v.dtype_name == "qcint8":
            return self._typed(v.constant_buffer_idx, torch.int8, v.numel).reshape(v.dims)
        if v.dtype_name in ("qcint4", "qbint4"):
            return (_unpack4(self._bytes(v.constant_buffer_idx), v.dims) - 8).to(torch.int8)
        raise ValueError(f"no integer form for {v.dtype_name}")

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
        if name in _FLOAT:
            return self._typed(idx, _FLOAT[name], n).reshape(dims)
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


# ---------------------------------------------------------------------------------------
# code generation


class XnnRunner:
    """A prepared XNNPACK graph: ``runner(*tensors)`` runs it on the delegate's tensors
    (in external-id order, inputs and outputs together) and writes the outputs in place."""

    def __init__(
        self,
        fn: Callable[..., None],
        source: str,
        ext_ids: tuple[int, ...],
        node_types: dict[str, int],
        output_ids: tuple[int, ...] = (),
    ) -> None:
        self.fn = fn
        self.source = source
        self.ext_ids = ext_ids  # the delegate call arguments it takes, in order
        self.output_ids = output_ids  # those of them it writes
        self.node_types = node_types

    def __call__(self, *tensors: torch.Tensor) -> None:
        self.fn(*tensors)

    def __repr__(self) -> str:
        return f"XnnRunner({sum(self.node_types.values())} nodes, externals {list(self.ext_ids)})"


class _Gen:
    def __init__(
        self,
        payload: s.XnnPayload,
        named_data: Mapping[str, memoryview],
        args: Sequence[ArgInfo | None],
        device: torch.device,
    ) -> None:
        self.payload = payload
        self.g = payload.graph
        self.path = payload.path
        self.args = args
        self.device = device
        self.consts = _Constants(payload, named_data, device)
        self.lines: list[str] = []
        self.env: dict[str, Any] = dict(_HELPERS)
        self.expr: dict[int, str] = {}
        self.reps: dict[int, _Rep] = {}
        # per-token quantized values not computed yet: value -> (float source, nonbatch dims)
        self.pending_qd: dict[int, tuple[str, int]] = {}
        self._n = 0

    # -- names -------------------------------------------------------------------------
    def bind(self, obj: Any, hint: str = "k") -> str:
        self._n += 1
        name = f"_{hint}{self._n}"
        self.env[name] = obj
        return name

    def emit(self, code: str) -> None:
        self.lines.append(code)

    def fail(self, node: s.XnnNode, msg: str) -> PteFormatError:
        return PteFormatError(f"{self.path}.xnodes[{node.index}].{node.type}", msg)

    def value(self, vid: int) -> s.XnnValue:
        return self.g.by_id[vid]

    # -- representations ---------------------------------------------------------------
    def rep_of_value(self, v: s.XnnValue) -> _Rep:
        name = v.dtype_name
        if name in _FLOAT:
            return _Rep("float", _FLOAT[name])
        if name in _QSTATIC:
            q = v.quant
            if not isinstance(q, s.PerTensorQuant):
                raise PteFormatError(
                    f"{self.path}.xvalues[{v.index}]", f"{name} value without per-tensor parameters"
                )
            lo, hi = _QSTATIC[name]
            if not lo <= q.zero_point <= hi:
                raise PteFormatError(
                    f"{self.path}.xvalues[{v.index}].quant_params.zero_point",
                    f"{q.zero_point} outside [{lo}, {hi}]",
                )
            return _Rep("q", torch.float32, q.scale, q.zero_point, lo, hi)
        if name == "qdint8":
            return _Rep("qd", torch.float32)
        if name == "int32":
            return _Rep("int", torch.int32)
        if name in _QCONST:  # weights and biases: constants, dequantized at load
            return _Rep("float", torch.float32)
        raise BackendUnavailableError(f"XNNPACK values of datatype {name} are not supported")

    def rep(self, vid: int) -> _Rep:
        r = self.reps.get(vid)
        if r is None:
            r = self.rep_of_value(self.value(vid))
            self.reps[vid] = r
        return r

    def x(self, vid: int, dtype: torch.dtype | None = None) -> str:
        """An expression for value ``vid`` (constants bound at load, cast to ``dtype``)."""
        v = self.value(vid)
        if v.is_constant:
            return self.bind(self.consts.value(v, dtype), "c")
        e = self.expr.get(vid)
        if e is None and vid in self.pending_qd:
            src, k = self.pending_qd[vid]
            self.emit(f"t{vid} = _per_token({src}, {k})")
            e = self.expr[vid] = f"t{vid}"
        if e is None:  # validation guarantees order; this is a defect of ours
            raise AssertionError(f"value {vid} used before it is computed")
        return e

    def compute_dtype(self, node: s.XnnNode) -> torch.dtype:
        for vid in node.inputs:
            v = self.value(vid)
            if not v.is_constant:
                r = self.rep(vid)
                if r.kind != "int":
                    return r.dtype
        return self.rep(node.outputs[0]).dtype

    # -- outputs of nodes ----------------------------------------------------------------
    def out(
        self, node: s.XnnNode, code: str, fresh: bool, vid: int | None = None, clamp: bool = True
    ) -> None:
        """Assign ``code`` to the node's output, apply its output clamp and requantize a
        static int8 output."""
        vid = node.outputs[0] if vid is None else vid
        name = f"t{vid}"
        r = self.rep(vid)
        lo, hi = (node.output_min, node.output_max) if clamp else (-math.inf, math.inf)
        if r.kind == "q":
            qlo, qhi = r.qmin, r.qmax
            if lo != -math.inf:
                qlo = min(max(qlo, round(lo / r.scale) + r.zp), r.qmax)
            if hi != math.inf:
                qhi = max(min(qhi, round(hi / r.scale) + r.zp), r.qmin)
            if qhi < qlo:
                qhi = qlo
            fq = "_fq_" if fresh else "_fq"
            inv = _inv32(r.scale)
            code = f"{fq}({code}, {inv!r}, {r.scale!r}, {qlo - r.zp}, {qhi - r.zp})"
            self.emit(f"{name} = {code}")
        else:
            self.emit(f"{name} = {code}")
            bounds = []
            if lo != -math.inf:
                bounds.append(f"min={lo!r}")
            if hi != math.inf:
                bounds.append(f"max={hi!r}")
            if bounds:
                op = "clamp_" if fresh else "clamp"
                if fresh:
                    self.emit(f"{name}.{op}({', '.join(bounds)})")
                else:
                    self.emit(f"{name} = {name}.{op}({', '.join(bounds)})")
        self.expr[vid] = name

    def same_q(self, a: int, b: int) -> bool:
        ra, rb = self.rep(a), self.rep(b)
        return ra.kind != "q" or (ra.kind == rb.kind and ra.scale == rb.scale and ra.zp == rb.zp)

    def alias(self, node: s.XnnNode, code: str) -> None:
        """An output that only moves data: requantize only when parameters change."""
        vid = node.outputs[0]
        if self.rep(vid).kind == "q" and (not self.same_q(node.inputs[0], vid) or node.has_clamp):
            self.out(node, code, fresh=False)
            return
        self.emit(f"t{vid} = {code}")
        if node.has_clamp:
            self.out(node, f"t{vid}", fresh=False)
        self.expr[vid] = f"t{vid}"

    # -- externals -----------------------------------------------------------------------
    def externals(self) -> tuple[list[s.XnnValue], list[s.XnnValue]]:
        ins = sorted((v for v in self.g.values if v.is_input), key=lambda v: v.external_id)
        outs = sorted((v for v in self.g.values if v.is_output), key=lambda v: v.external_id)
        for v in ins + outs:
            where = f"{self.path}.xvalues[{v.index}].external_id"
            if v.external_id >= len(self.args) or self.args[v.external_id] is None:
                raise PteFormatError(
                    where,
                    f"external id {v.external_id} is not a tensor argument of the delegate call ({len(self.args)} arguments)",
                )
            a = self.args[v.external_id]
            assert a is not None
            rank = len(a.dim_order)
            if rank != len(v.dims) and not (rank == 0 and v.dims in ((), (1,))):
                raise PteFormatError(
                    where, f"the value has {len(v.dims)} dims {list(v.dims)}, its tensor has {rank}"
                )
            self._check_dtype(v, a, where)
        return ins, outs

    def _check_dtype(self, v: s.XnnValue, a: ArgInfo, where: str) -> None:
        name = v.dtype_name
        if name not in ("fp32", "fp16", "bf16", "qint8", "quint8", "int32"):
            raise BackendUnavailableError(f"{where}: an external {name} value is not supported")
        ok: tuple[torch.dtype, ...] = {
            "fp32": (torch.float32,),
            "fp16": (torch.float16,),
            "bf16": (torch.bfloat16,),
            "qint8": (torch.int8,),
            "quint8": (torch.uint8,),
            "int32": (torch.int32,),
        }[name]
        if name == "fp32" and v.is_output and not v.is_input:
            ok = (torch.float32, torch.int64)  # argmax indices: int64 tensors in ExecuTorch
        if a.dtype not in ok:
            raise PteFormatError(
                where, f"a {name} value bound to a {str(a.dtype).removeprefix('torch.')} tensor"
            )

    def load_input(self, v: s.XnnValue) -> None:
        k = v.external_id
        a = self.args[k]
        assert a is not None
        x = f"x{k}"
        order = a.dim_order
        if order != tuple(range(len(order))):
            x = f"{x}.permute{order}"
        name = f"t{v.id}"
        if v.dq_datatype:
            if s.DATATYPES.get(v.dq_datatype, ("",))[0] != "qint8":
                raise BackendUnavailableError(
                    f"dynamic quantization of an input to {s.DATATYPES.get(v.dq_datatype)} is not supported"
                )
            # an older payload's input quantized per token as it enters: like a Convert
            self.reps[v.id] = _Rep("qd", _FLOAT.get(v.dtype_name, torch.float32))
            self.emit(f"f{v.id} = {x}")
            self.pending_qd[v.id] = (f"f{v.id}", 1)
            return
        r = self.rep(v.id)
        if r.kind == "q":
            self.emit(f"{name} = ({x}.to(torch.float32) - {r.zp}) * {r.scale!r}")
        else:
            self.emit(f"{name} = {x}")
        if len(v.dims) and a.dim_order == ():
            self.emit(f"{name} = {name}.reshape({tuple(v.dims)!r})")
        self.expr[v.id] = name

    def store_output(self, v: s.XnnValue) -> None:
        k = v.external_id
        a = self.args[k]
        assert a is not None
        src = self.expr.get(v.id)
        if src is None:
            if v.is_input:
                src = self.expr[v.id]
            else:  # validated: every output is written
                raise AssertionError(f"output value {v.id} never computed")
        r = self.rep(v.id)
        if r.kind == "q" and not a.dtype.is_floating_point:
            src = f"(torch.round({src} * {_inv32(r.scale)!r}) + {r.zp}).clamp_({r.qmin}, {r.qmax})"
        x = f"x{k}"
        order = a.dim_order
        if len(order) == 0:
            self.emit(f"{x}.copy_({src}.reshape(()))")
            return
        tmp = f"y{k}"
        info = self.bind(a, "a")  # what the program declares: checked before resizing
        self.emit(f"{tmp} = {src}")
        if order == tuple(range(len(order))):
            self.emit(f"if {x}.shape != {tmp}.shape:")
            self.emit(f"    _resize({x}, {tmp}.shape, {order!r}, {info}, {k})")
            self.emit(f"{x}.copy_({tmp})")
        else:
            self.emit(f"{x}p = {x}.permute{order}")
            self.emit(f"if {x}p.shape != {tmp}.shape:")
            self.emit(f"    _resize({x}, {tmp}.shape, {order!r}, {info}, {k})")
            self.emit(f"    {x}p = {x}.permute{order}")
            self.emit(f"{x}p.copy_({tmp})")

    # -- the graph -----------------------------------------------------------------------
    def build(self) -> XnnRunner:
        ins, outs = self.externals()
        ext_ids = tuple(sorted({v.external_id for v in ins + outs}))
        for v in ins:
            self.load_input(v)
        counts: dict[str, int] = {}
        for node in self.g.nodes:
            counts[node.type] = counts.get(node.type, 0) + 1
            self.node(node)
        for v in outs:
            self.store_output(v)
        params = ", ".join(f"x{k}" for k in ext_ids)
        body = self.lines or ["pass"]
        source = f"def _xnnpack_run({params}):\n" + "".join(f"    {line}\n" for line in body)
        namespace = Sources(f"xnnpack {self.path}").compile(source, "graph", self.env)
        out_ids = tuple(sorted(v.external_id for v in outs))
        return XnnRunner(namespace["_xnnpack_run"], source, ext_ids, counts, out_ids)

    def node(self, n: s.XnnNode) -> None:
        t = n.type
        if t in _BINARY:
            dt = self.compute_dtype(n)
            a, b = self.x(n.inputs[0], dt), self.x(n.inputs[1], dt)
            self.out(n, _BINARY[t].format(a=a, b=b), fresh=True)
        elif t in _UNARY:
            self.check_flags(n, 0)
            dt = self.compute_dtype(n)
            self.out(n, _UNARY[t].format(x=self.x(n.inputs[0], dt)), fresh=True)
        else:
            getattr(self, f"n_{t}")(n)

    def check_flags(self, n: s.XnnNode, allowed: int) -> None:
        if n.flags & ~allowed:
            raise BackendUnavailableError(
                f"XNNPACK {n.type} node {n.index} has flags {n.flags:#x} that ptexec does not support"
            )

    def rank(self, n: s.XnnNode, vid: int, want: int) -> None:
        dims = self.value(vid).dims
        if len(dims) != want:
            raise self.fail(n, f"value {vid} has {len(dims)} dims {list(dims)}, expected {want}")

    # -- elementwise -------------------------------------------------------------------
    def n_Clamp(self, n: s.XnnNode) -> None:
        self.alias(n, self.x(n.inputs[0])) if not n.has_clamp else self.out(
            n, self.x(n.inputs[0]), fresh=False
        )

    def n_LeakyReLU(self, n: s.XnnNode) -> None:
        self.out(n, f"F.leaky_relu({self.x(n.inputs[0])}, {n['negative_slope']!r})", fresh=True)

    def n_ELU(self, n: s.XnnNode) -> None:
        self.out(n, f"F.elu({self.x(n.inputs[0])}, {n['alpha']!r})", fresh=True)

    def n_PReLU(self, n: s.XnnNode) -> None:
        dt = self.compute_dtype(n)
        x, w = self.x(n.inputs[0], dt), self.x(n.inputs[1], dt)
        self.out(n, f"torch.where({x} >= 0, {x}, {x} * {w})", fresh=True)

    # -- matrix products ---------------------------------------------------------------
    def n_FullyConnected(self, n: s.XnnNode) -> None:
        self.check_flags(n, s.FLAG_TRANSPOSE_WEIGHTS)
        dt = self.compute_dtype(n)
        fv = self.value(n["filter_id"])
        transposed = bool(n.flags & s.FLAG_TRANSPOSE_WEIGHTS)
        if len(fv.dims) != 2:
            raise self.fail(n, f"filter has dims {list(fv.dims)}, expected 2")
        if self._qd_int_linear(n, fv, transposed):
            return
        x = self.x(n.inputs[0], dt)
        bias = n["bias_id"]
        b = self.x(bias, dt) if bias is not None else "None"
        if fv.is_constant:
            wt_ = self.consts.value(fv, dt)
            if transposed:
                wt_ = wt_.t().contiguous()
            wname = self.bind(wt_, "w")
            self.out(n, f"F.linear({x}, {wname}, {b})", fresh=True)
        else:
            we = self.x(fv.id, dt)
            wt = we if transposed else f"{we}.t()"
            code = (
                f"torch.matmul({x}, {wt})"
                if bias is None
                else f"torch.add(torch.matmul({x}, {wt}), {b})"
            )
            self.out(n, code, fresh=True)

    def _qd_int_linear(self, n: s.XnnNode, fv: s.XnnValue, transposed: bool) -> bool:
        """On the CPU, a per-token quantized input times int8/int4 weights with one scale
        per output channel runs as an integer matrix product (exact accumulation, as
        XNNPACK's kernels). Block-wise weights with several blocks per row stay in float."""
        src = n["input1_id"]
        q = fv.quant
        per_channel = (
            isinstance(q, s.PerChannelQuant) and fv.dtype_name in ("qcint8", "qcint4")
        ) or (isinstance(q, s.PerChannelGroupQuant) and q.group_size == fv.dims[1])
        if (
            self.device.type != "cpu"
            or src not in self.pending_qd
            or self.pending_qd[src][1] != 1
            or transposed
            or not fv.is_constant
            or not per_channel
            or q is None
            or q.channel_dim != 0  # type: ignore[union-attr]
            or self.rep(n.outputs[0]).kind != "float"
        ):
            return False
        assert isinstance(q, s.PerChannelQuant | s.PerChannelGroupQuant)
        ints = self.consts.ints(fv)  # [out, in]
        wt = ints.t().contiguous()
        colsum = ints.sum(dim=1, dtype=torch.int32).to(torch.float32)
        wscale = self.consts.scales(q).to(torch.float32).contiguous()
        bias = n["bias_id"]
        b = self.x(bias, torch.float32) if bias is not None else "None"
        x = self.pending_qd[src][0]
        names = [self.bind(t, "w") for t in (wt, colsum, wscale)]
        self.out(n, f"_qd_linear({x}, 1, {', '.join(names)}, {b})", fresh=True)
        return True

    def n_BatchMatrixMultiply(self, n: s.XnnNode) -> None:
        self.check_flags(n, s.FLAG_TRANSPOSE_WEIGHTS)
        dt = self.compute_dtype(n)
        a, b = self.x(n.inputs[0], dt), self.x(n.inputs[1], dt)
        if n.flags & s.FLAG_TRANSPOSE_WEIGHTS:
            b = f"{b}.transpose(-1, -2)"
        self.out(n, f"torch.matmul({a}, {b})", fresh=True)

    # -- convolutions --------------------------------------------------------------------
    def _conv_common(
        self, n: s.XnnNode
    ) -> tuple[str, torch.dtype, str, tuple[int, int, int, int], str]:
        """(input, compute dtype, bias, paddings, cast back): half-precision convolutions
        on the CPU compute in float32 (torch's half convolutions there are slow; XNNPACK's
        half kernels accumulate in float32 too) and round the result to half."""
        self.check_flags(n, 0)
        self.rank(n, n["input1_id"], 4)
        self.rank(n, n["filter_id"], 4)
        if not self.value(n["filter_id"]).is_constant:
            raise BackendUnavailableError(
                f"XNNPACK {n.type} node {n.index} with a non-constant filter is not supported"
            )
        dt = self.compute_dtype(n)
        x = self.x(n["input1_id"], dt)
        post = ""
        if self.device.type == "cpu" and dt in (torch.float16, torch.bfloat16):
            x, post, dt = f"{x}.float()", f".to({_dtype_expr(dt)})", torch.float32
        bias = n["bias_id"]
        b = self.x(bias, dt) if bias is not None else "None"
        pads = (n["padding_top"], n["padding_right"], n["padding_bottom"], n["padding_left"])
        return x, dt, b, pads, post

    @staticmethod
    def _two(a: int, b: int) -> tuple[int, int]:
        return (max(a, 1), max(b, 1))

    def _check_conv_shape(
        self, n: s.XnnNode, w: torch.Tensor, out_ch: int, in_per_group: int
    ) -> None:
        kh, kw = n["kernel_height"], n["kernel_width"]
        if tuple(w.shape[2:]) != (kh, kw) or w.shape[0] != out_ch or w.shape[1] != in_per_group:
            raise self.fail(
                n,
                f"filter {list(self.value(n['filter_id']).dims)} does not match kernel {kh}x{kw}, "
                f"{n['groups']} groups of {n['group_input_channels']} -> {n['group_output_channels']} channels",
            )

    def _expect_dims(self, n: s.XnnNode, expected: dict[int, int]) -> None:
        """The output's serialized dims agree with what the node computes from its input's
        (XNNPACK checks the same when it defines the node)."""
        dims = self.value(n.outputs[0]).dims
        for i, want in expected.items():
            if i >= len(dims) or dims[i] != want:
                raise self.fail(
                    n, f"output dims {list(dims)}, the node computes {want} for dim {i}"
                )

    def _conv_out(self, n: s.XnnNode, pads: tuple[int, int, int, int], out_ch: int) -> None:
        dims = self.value(n["input1_id"]).dims
        top, right, bottom, left = pads
        k = (n["kernel_height"], n["kernel_width"])
        st = self._two(n["subsampling_height"], n["subsampling_width"])
        dil = self._two(n["dilation_height"], n["dilation_width"])
        h = (dims[1] + top + bottom - dil[0] * (k[0] - 1) - 1) // st[0] + 1
        w = (dims[2] + left + right - dil[1] * (k[1] - 1) - 1) // st[1] + 1
        self._expect_dims(n, {1: h, 2: w, 3: out_ch})

    def _conv_input(self, x: str, pads: tuple[int, int, int, int]) -> tuple[str, tuple[int, int]]:
        top, right, bottom, left = pads
        xc = f"{x}.permute(0, 3, 1, 2)"
        if top == bottom and left == right:
            return xc, (top, left)
        return f"F.pad({xc}, ({left}, {right}, {top}, {bottom}))", (0, 0)

    def n_Conv2d(self, n: s.XnnNode) -> None:
        x, dt, b, pads, post = self._conv_common(n)
        groups = n["groups"]
        if groups < 1:
            raise self.fail(n, "groups must be at least 1")
        raw = self.consts.value(self.value(n["filter_id"]), dt)  # [OC, KH, KW, IC/g]
        w = raw.permute(0, 3, 1, 2)
        self._check_conv_shape(n, w, groups * n["group_output_channels"], n["group_input_channels"])
        self._conv_out(n, pads, groups * n["group_output_channels"])
        stride = self._two(n["subsampling_height"], n["subsampling_width"])
        dil = self._two(n["dilation_height"], n["dilation_width"])
        if groups == 1 and w.shape[2:] == (1, 1) and not any(pads):
            # a 1x1 convolution of NHWC values is a linear layer over channels
            xs = x if stride == (1, 1) else f"{x}[:, ::{stride[0]}, ::{stride[1]}]"
            wn = self.bind(raw.reshape(raw.shape[0], raw.shape[3]), "w")
            self.out(n, f"F.linear({xs}, {wn}, {b}){post}", fresh=True)
            return
        xc, pad = self._conv_input(x, pads)
        wn = self.bind(w.contiguous(), "w")
        if self._tiny_conv(n, groups, dil, dt):
            # torch's direct (im2col) kernel: far less fixed cost than oneDNN's for tiny work
            k = tuple(w.shape[2:])
            code = f"_slow_conv2d({xc}, {wn}, {k}, {b}, {stride}, {pad})"
        else:
            code = f"F.conv2d({xc}, {wn}, {b}, {stride}, {pad}, {dil}, {groups})"
        self.out(n, f"{code}.permute(0, 2, 3, 1){post}", fresh=True)

    def _tiny_conv(self, n: s.XnnNode, groups: int, dil: tuple[int, int], dt: torch.dtype) -> bool:
        if self.device.type != "cpu" or groups != 1 or dil != (1, 1) or dt != torch.float32:
            return False
        out = self.value(n.outputs[0]).dims
        k = int(n["kernel_height"] * n["kernel_width"] * n["group_input_channels"])
        return math.prod(out) * k * 2 < _TINY_CONV_FLOPS

    def n_DepthwiseConv2d(self, n: s.XnnNode) -> None:
        x, dt, b, pads, post = self._conv_common(n)
        channels = n["groups"]
        gi = n["group_input_channels"]
        if channels < 1 or gi < 1 or n["group_output_channels"] % gi:
            raise self.fail(n, "depthwise channels and multiplier must be positive")
        raw = self.consts.value(self.value(n["filter_id"]), dt)  # [1, KH, KW, C * mult]
        w = raw.permute(3, 0, 1, 2).contiguous()
        self._check_conv_shape(n, w, channels * (n["group_output_channels"] // gi), 1)
        self._conv_out(n, pads, channels * (n["group_output_channels"] // gi))
        xc, pad = self._conv_input(x, pads)
        stride = self._two(n["subsampling_height"], n["subsampling_width"])
        dil = self._two(n["dilation_height"], n["dilation_width"])
        wn = self.bind(w, "w")
        self.out(
            n,
            f"F.conv2d({xc}, {wn}, {b}, {stride}, {pad}, {dil}, {channels}).permute(0, 2, 3, 1){post}",
            fresh=True,
        )

    def n_ConvTranspose2d(self, n: s.XnnNode) -> None:
        x, dt, b, pads, post = self._conv_common(n)
        groups = n["groups"]
        gi, go = n["group_input_channels"], n["group_output_channels"]
        if groups < 1:
            raise self.fail(n, "groups must be at least 1")
        raw = self.consts.value(self.value(n["filter_id"]), dt)  # [OC, KH, KW, IC/g]
        oihw = raw.permute(0, 3, 1, 2)
        self._check_conv_shape(n, oihw, groups * go, gi)
        kh, kw = oihw.shape[2:]
        # torch's layout: [IC, OC/g, KH, KW]
        w = (
            oihw.reshape(groups, go, gi, kh, kw)
            .permute(0, 2, 1, 3, 4)
            .reshape(groups * gi, go, kh, kw)
            .contiguous()
        )
        stride = self._two(n["subsampling_height"], n["subsampling_width"])
        dil = self._two(n["dilation_height"], n["dilation_width"])
        adj = (n["adjustment_height"], n["adjustment_width"])
        if adj[0] >= max(stride[0], dil[0]) or adj[1] >= max(stride[1], dil[1]):
            raise self.fail(
                n, f"adjustment {adj} must be smaller than the stride {stride} or dilation {dil}"
            )
        top, right, bottom, left = pads
        dims = self.value(n["input1_id"]).dims
        h = stride[0] * (dims[1] - 1) + adj[0] + dil[0] * (kh - 1) + 1 - top - bottom
        wd = stride[1] * (dims[2] - 1) + adj[1] + dil[1] * (kw - 1) + 1 - left - right
        self._expect_dims(n, {1: h, 2: wd, 3: groups * go})
        wn = self.bind(w, "w")
        xc = f"{x}.permute(0, 3, 1, 2)"
        if top == bottom and left == right:
            code = f"F.conv_transpose2d({xc}, {wn}, {b}, {stride}, {(top, left)}, {adj}, {groups}, {dil})"
        else:  # asymmetric padding: run unpadded, then crop
            full = f"_full{n.index}"
            self.emit(
                f"{full} = F.conv_transpose2d({xc}, {wn}, {b}, {stride}, 0, {adj}, {groups}, {dil})"
            )
            code = (
                f"{full}[:, :, {top}:{full}.shape[2] - {bottom}, {left}:{full}.shape[3] - {right}]"
            )
        self.out(n, f"{code}.permute(0, 2, 3, 1){post}", fresh=True)

    # -- pooling -------------------------------------------------------------------------
    def _pool_args(
        self, n: s.XnnNode
    ) -> tuple[str, tuple[int, int], tuple[int, int], tuple[int, int, int, int]]:
        self.check_flags(n, s.FLAG_KEEP_DIMS)
        self.rank(n, n["input_id"], 4)
        k = (n["pooling_height"], n["pooling_width"])
        if k[0] < 1 or k[1] < 1:
            raise self.fail(n, f"pooling window {k}")
        st = self._two(n["stride_height"], n["stride_width"])
        pads = (n["padding_top"], n["padding_right"], n["padding_bottom"], n["padding_left"])
        return self.x(n["input_id"]), k, st, pads

    def n_MaxPooling2d(self, n: s.XnnNode) -> None:
        x, k, st, pads = self._pool_args(n)
        dil = self._two(n["dilation_height"], n["dilation_width"])
        top, right, bottom, left = pads
        eff = ((k[0] - 1) * dil[0] + 1, (k[1] - 1) * dil[1] + 1)
        if top == bottom and left == right and 2 * top <= eff[0] and 2 * left <= eff[1]:
            code = f"F.max_pool2d({x}.permute(0, 3, 1, 2), {k}, {st}, {(top, left)}, {dil}).permute(0, 2, 3, 1)"
        else:
            code = f"_max_pool({x}, {k}, {st}, {pads}, {dil})"
        if self.same_q(n["input_id"], n["output_id"]) and not n.has_clamp:
            self.emit(f"t{n['output_id']} = {code}")
            self.expr[n["output_id"]] = f"t{n['output_id']}"
        else:
            self.out(n, code, fresh=True)

    def n_AvgPooling2d(self, n: s.XnnNode) -> None:
        x, k, st, pads = self._pool_args(n)
        top, right, bottom, left = pads
        if top == bottom and left == right and 2 * top <= k[0] and 2 * left <= k[1]:
            code = f"F.avg_pool2d({x}.permute(0, 3, 1, 2), {k}, {st}, {(top, left)}, False, False).permute(0, 2, 3, 1)"
        else:
            code = f"_avg_pool({x}, {k}, {st}, {pads})"
        self.out(n, code, fresh=True)

    def n_GlobalAvgPooling2d(self, n: s.XnnNode) -> None:
        self.check_flags(n, s.FLAG_KEEP_DIMS)
        rank = len(self.value(n.inputs[0]).dims)
        if rank < 3:
            raise self.fail(n, f"input has {rank} dims, expected at least 3")
        dims = tuple(range(1, rank - 1))
        keep = bool(n.flags & s.FLAG_KEEP_DIMS)
        self.out(n, f"{self.x(n.inputs[0])}.mean(dim={dims}, keepdim={keep})", fresh=True)

    def n_ArgMaxPooling2d(self, n: s.XnnNode) -> None:
        self.check_flags(n, 0)
        self.rank(n, n["input_id"], 4)
        k = (n["pooling_height"], n["pooling_width"])
        if k[0] < 1 or k[1] < 1:
            raise self.fail(n, f"pooling window {k}")
        pads = (n["padding_top"], n["padding_right"], n["padding_bottom"], n["padding_left"])
        vo, io = n["output_value_id"], n["output_index_id"]
        self.emit(f"t{vo}, t{io} = _argmax_pool({self.x(n['input_id'])}, {k[0]}, {k[1]}, {pads})")
        self.expr[vo] = f"t{vo}"
        self.expr[io] = f"t{io}"

    # -- data movement -------------------------------------------------------------------
    def n_StaticTranspose(self, n: s.XnnNode) -> None:
        self.check_flags(n, 0)
        perm = tuple(n["perm"])
        rank = len(self.value(n.inputs[0]).dims)
        if sorted(perm) != list(range(rank)) or n["num_dims"] != rank:
            raise self.fail(n, f"perm {list(perm)} is not a permutation of {rank} dims")
        self.alias(n, f"{self.x(n.inputs[0])}.permute({perm})")

    def n_StaticReshape(self, n: s.XnnNode) -> None:
        self.check_flags(n, 0)
        shape = tuple(d if d != 0 else -1 for d in n["new_shape"])
        if n["num_dims"] != len(shape) or shape.count(-1) > 1 or len(shape) > s.MAX_DIMS:
            raise self.fail(n, f"new shape {list(n['new_shape'])} (num_dims {n['num_dims']})")
        out_dims = self.value(n.outputs[0]).dims
        if len(out_dims) != len(shape):
            raise self.fail(
                n,
                f"new shape {list(n['new_shape'])} does not match the output dims {list(out_dims)}",
            )
        self.alias(n, f"{self.x(n.inputs[0])}.reshape({shape})")

    def n_StaticSlice(self, n: s.XnnNode) -> None:
        self.check_flags(n, 0)
        offsets, sizes = n["offsets"], n["sizes"]
        rank = len(self.value(n.inputs[0]).dims)
        if len(offsets) != rank or len(sizes) != rank or n["num_dims"] != rank:
            raise self.fail(n, f"offsets {list(offsets)} and sizes {list(sizes)} for {rank} dims")
        parts = []
        for o, z in zip(offsets, sizes, strict=True):
            end = o + z
            parts.append(f"{o}:{end}" if end > 0 else f"{o}:")
        self.alias(n, f"{self.x(n.inputs[0])}[{', '.join(parts)}]")

    def n_StaticConstantPad(self, n: s.XnnNode) -> None:
        self.check_flags(n, 0)
        pre, post = n["pre_paddings"], n["post_paddings"]
        rank = len(self.value(n.inputs[0]).dims)
        if len(pre) != rank or len(post) != rank:
            raise self.fail(n, f"paddings {list(pre)}, {list(post)} for {rank} dims")
        in_dims = self.value(n.inputs[0]).dims
        self._expect_dims(n, {d: in_dims[d] + pre[d] + post[d] for d in range(rank)})
        pads: list[int] = []
        for d in reversed(range(rank)):
            pads += [pre[d], post[d]]
        value = float(n["padding_value"])
        r = self.rep(n.outputs[0])
        if r.kind == "q":  # the padding value, as XNNPACK stores it: quantized
            q = min(max(round(value / r.scale) + r.zp, r.qmin), r.qmax)
            value = (q - r.zp) * r.scale
        code = f"F.pad({self.x(n.inputs[0])}, {tuple(pads)}, value={value!r})"
        if self.same_q(n.inputs[0], n.outputs[0]) and not n.has_clamp:
            self.emit(f"t{n.outputs[0]} = {code}")
            self.expr[n.outputs[0]] = f"t{n.outputs[0]}"
        else:
            self.out(n, code, fresh=True)

    def n_StaticResizeBilinear2D(self, n: s.XnnNode) -> None:
        self.check_flags(n, s.FLAG_ALIGN_CORNERS)
        self.rank(n, n.inputs[0], 4)
        size = (n["new_height"], n["new_width"])
        if size[0] < 1 or size[1] < 1:
            raise self.fail(n, f"new size {size}")
        self._expect_dims(n, {1: size[0], 2: size[1]})
        ac = bool(n.flags & s.FLAG_ALIGN_CORNERS)
        x = self.x(n.inputs[0])
        self.out(
            n,
            f"F.interpolate({x}.permute(0, 3, 1, 2), size={size}, mode='bilinear', align_corners={ac}).permute(0, 2, 3, 1)",
            fresh=True,
        )

    def _cat(self, n: s.XnnNode) -> None:
        self.check_flags(n, 0)
        rank = len(self.value(n.inputs[0]).dims)
        axis = n["axis"]
        if axis >= rank:
            raise self.fail(n, f"axis {axis} for {rank} dims")
        for vid in n.inputs:
            if len(self.value(vid).dims) != rank:
                raise self.fail(n, "inputs of different ranks")
        dt = self.compute_dtype(n)
        parts = ", ".join(self.x(v, dt) for v in n.inputs)
        code = f"torch.cat(({parts}), {axis})"
        if all(self.same_q(v, n.outputs[0]) for v in n.inputs) and not n.has_clamp:
            self.emit(f"t{n.outputs[0]} = {code}")
            self.expr[n.outputs[0]] = f"t{n.outputs[0]}"
        else:
            self.out(n, code, fresh=True)

    n_Concatenate2 = _cat
    n_Concatenate3 = _cat
    n_Concatenate4 = _cat
    n_Concatenate5 = _cat

    def n_Copy(self, n: s.XnnNode) -> None:
        self.check_flags(n, 0)
        self.alias(n, self.x(n.inputs[0]))

    def n_Convert(self, n: s.XnnNode) -> None:
        src, dst = self.value(n.inputs[0]), self.value(n.outputs[0])
        ri = self.rep(src.id)
        x = self.x(src.id)
        out = dst.dtype_name
        if out == "qdint8":
            q = dst.quant
            if not isinstance(q, s.PerTokenDynamicQuant):
                raise self.fail(n, "a qdint8 output without per-token parameters")
            if ri.kind != "float":
                raise BackendUnavailableError(
                    f"XNNPACK Convert from {src.dtype_name} to qdint8 is not supported"
                )
            self.reps[dst.id] = _Rep("qd", ri.dtype)
            # computed where it is first needed: a linear with int8 weights quantizes
            # its input itself and never needs the dequantized values
            self.pending_qd[dst.id] = (x, q.num_nonbatch_dims)
            return
        ro = self.rep(dst.id)
        if ro.kind == "q":
            code = x if ri.dtype == torch.float32 else f"{x}.to(torch.float32)"
            if ri.kind == "q" and self.same_q(src.id, dst.id) and not n.has_clamp:
                self.emit(f"t{dst.id} = {code}")
                self.expr[dst.id] = f"t{dst.id}"
            else:
                self.out(n, code, fresh=False)
            return
        if ro.kind == "float" and ri.kind in ("float", "q", "qd"):
            code = x if ri.dtype == ro.dtype else f"{x}.to({_dtype_expr(ro.dtype)})"
            self.emit(f"t{dst.id} = {code}")
            self.expr[dst.id] = f"t{dst.id}"
            return
        raise BackendUnavailableError(
            f"XNNPACK Convert from {src.dtype_name} to {out} is not supported"
        )


def _dtype_expr(dt: torch.dtype) -> str:
    return f"torch.{str(dt).removeprefix('torch.')}"


def build_runner(
    payload: s.XnnPayload,
    named_data: Mapping[str, memoryview],
    args: Sequence[ArgInfo | None],
    device: torch.device | str = "cpu",
) -> XnnRunner:
    """Check that every node and datatype is supported, validate the payload and compile its
    node list; ``args`` describes the delegate call's arguments (None: not a tensor)."""
    bad = unsupported_node_types(payload)
    if bad:
        raise BackendUnavailableError(
            f"XNNPACK payload {payload.path} uses node type(s) ptexec cannot run: {', '.join(bad)}"
        )
    kinds = sorted(
        {v.dtype_name for v in payload.graph.values if v.dtype_name in _UNSUPPORTED_TYPES}
    )
    s.validate_payload(payload, named_data)
    if kinds:
        raise BackendUnavailableError(
            f"XNNPACK payload {payload.path} uses datatype(s) ptexec cannot run: {', '.join(kinds)}"
        )
    return _Gen(payload, named_data, args, torch.device(device)).build()
