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

Quantized values. A static int8 value is carried as a float32 tensor holding its centered
integers ``q - zero_point`` and computed with XNNPACK's own integer arithmetic
(:mod:`.quant`): convolutions and fully connected nodes accumulate exactly and requantize
once, additions use XNNPACK's fixed-point multipliers, means sum in integers, unary
functions are XNNPACK's 256-entry tables. A node XNNPACK has no integer kernel for reads
dequantized values (``(q - zero_point) * scale``, as XNNPACK's Convert computes them) and
quantizes its result as XNNPACK's float-to-int8 Convert does. Dynamically quantized
values (per token, or per batch element for a convolution) are quantized at run time with
XNNPACK's choice of scale and zero point, once per distinct input however many nodes read
it. Weights are prepared once, at load.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
import torch.nn.functional as F

from ...codegen import Sources
from ...errors import BackendUnavailableError, PteFormatError
from ...memory import resize_to
from . import quant as qa
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
# From this many input elements a pool on NCHW memory copies its input to channels-last
# memory first: copy and pool take 1.5-9x less than the pool on NCHW memory from 16x48x48
# on; up to a few thousand elements the copy costs as much as it saves, or more
# (benchmarks/xnnpack_kernels.py --only pool)
_CL_POOL_ELEMENTS = 8192
# From this many weights a dynamically quantized linear on the CPU multiplies in int8
# (torch._int_mm, VNNI) rather than in float32: about as fast for one 128x384 row, twice
# as fast for 64 rows of 256x768 (benchmarks/xnnpack_kernels.py --only linear).
_INT_MM_WEIGHTS = 65536


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


def unsupported_node_types(payload: s.XnnPayload) -> list[str]:
    """Node types (and unknown type codes) of a payload that this runtime cannot run."""
    bad = sorted({n.type for n in payload.graph.nodes if n.type not in SUPPORTED_NODE_TYPES})
    bad += sorted({f"unknown node type {code}" for _, code in payload.graph.unknown_nodes})
    return bad


# ---------------------------------------------------------------------------------------
# run-time helpers (called from the generated code)


def _fq(t: torch.Tensor, inv: float, lo: int, hi: int) -> torch.Tensor:
    """Float values -> centered int8 as XNNPACK's float-to-int8 Convert computes them:
    ``round(t * inv)`` (to nearest even, by the float32 reciprocal of the scale) clamped
    to ``[lo, hi]`` (the bounds less the zero point)."""
    return torch.round(t * inv).clamp_(lo, hi)


def _fq_(t: torch.Tensor, inv: float, lo: int, hi: int) -> torch.Tensor:
    """:func:`_fq` in place, for a tensor nothing else refers to."""
    return t.mul_(inv).round_().clamp_(lo, hi)


def _inv32(scale: float) -> float:
    """1 / scale, computed in float32 as XNNPACK and PyTorch's quantizers compute it."""
    return qa.f32(1.0 / qa.f32(scale))


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
    # the repr of every float is a name here: a parameter may be infinite or NaN
    "inf": math.inf,
    "nan": math.nan,
    "torch": torch,
    "F": F,
    "_fq": _fq,
    "_fq_": _fq_,
    "_qd8": qa.quantize_rows,
    "_qd_values": qa.rows_values,
    "_qd_linear": qa.rows_linear_int,
    "_qd_linear_f": qa.rows_linear_float,
    "_qd_scale": qa.rows_conv_scale,
    "_rq": qa.requantize_,
    "_qadd": qa.add,
    "_qmul": qa.mul,
    "_qcvt": qa.convert,
    "_lut": qa.lookup,
    "_slow_conv2d": torch.ops.aten._slow_conv2d_forward,
    "_slow_deconv2d": torch.ops.aten.slow_conv_transpose2d,
    "_resize": _resize,
    "_argmax_pool": _argmax_pool,
    "_max_pool": _max_pool,
    "_avg_pool": _avg_pool,
    "_now": time.perf_counter_ns,  # the timed variant's clock (run_nodes)
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
    (in external-id order, inputs and outputs together) and writes the outputs in place.
    :meth:`run_nodes` runs the same statements and reports each node's time."""

    def __init__(
        self,
        fn: Callable[..., None],
        source: str,
        ext_ids: tuple[int, ...],
        node_types: dict[str, int],
        output_ids: tuple[int, ...] = (),
        timed: Callable[[], Callable[..., None]] | None = None,
    ) -> None:
        self.fn = fn
        self.source = source
        self.ext_ids = ext_ids  # the delegate call arguments it takes, in order
        self.output_ids = output_ids  # those of them it writes
        self.node_types = node_types
        self._make_timed = timed
        self._timed: Callable[..., None] | None = None

    def run_nodes(self, report: Callable[[str, int, int], None], *tensors: torch.Tensor) -> None:
        """Run the graph as ``runner(*tensors)`` does, the same statements, calling
        ``report(name, start, end)`` after each node (``FullyConnected #1``; a region of
        int8 elementwise nodes run as one table lookup is one ``Lookup table (...)``).
        The timed variant is generated on first use."""
        fn = self._timed
        if fn is None:
            if self._make_timed is None:
                self.fn(*tensors)
                return
            fn = self._timed = self._make_timed()
        fn(report, *tensors)

    def __call__(self, *tensors: torch.Tensor) -> None:
        self.fn(*tensors)

    def __repr__(self) -> str:
        return f"XnnRunner({sum(self.node_types.values())} nodes, externals {list(self.ext_ids)})"


def _timed_source(lines: Sequence[str], spans: Sequence[tuple[str, int, int]], params: str) -> str:
    """The graph's statements again, each node's between two clock readings and followed
    by ``_report(name, start, end)``; statements outside nodes (inputs, outputs) as they
    are. A name (made of ptexec's own node type names) enters the code as its repr."""
    out = [f"def _xnnpack_nodes(_report, {params}):" if params else "def _xnnpack_nodes(_report):"]
    at = 0
    for name, first, last in spans:
        out += [f"    {line}" for line in lines[at:first]]
        if first == last:  # a node that made no statement of its own (an alias)
            out += ["    _t0 = _now()", f"    _report({name!r}, _t0, _t0)"]
        else:
            out.append("    _t0 = _now()")
            out += [f"    {line}" for line in lines[first:last]]
            out.append(f"    _report({name!r}, _t0, _now())")
        at = last
    out += [f"    {line}" for line in lines[at:]]
    if len(out) == 1:
        out.append("    pass")
    return "\n".join(out) + "\n"


@dataclass(frozen=True, slots=True)
class _Conv:
    """A convolution's operands as its node runs: the input expression (NHWC), the compute
    dtype, the bias expression, the paddings, the filter in XNNPACK's dims, and
    ``finish(code, nchw)``, which turns the NHWC result ``code`` into the node's output
    (``nchw``: the same result as the NCHW tensor it is a view of, for a result in NCHW
    memory; a per-channel requantization scales it along its contiguous dims)."""

    x: str
    dtype: torch.dtype
    b: str
    pads: tuple[int, int, int, int]
    w: torch.Tensor
    finish: Callable[..., None]


class _Gen:
    def __init__(
        self,
        payload: s.XnnPayload,
        named_data: Mapping[str, memoryview],
        args: Sequence[ArgInfo | None],
        device: torch.device,
        traced: bool = False,
    ) -> None:
        self.payload = payload
        self.traced = traced
        self.g = payload.graph
        self.path = payload.path
        self.args = args
        self.device = device
        self.consts = Constants(payload, named_data, device)
        self.lines: list[str] = []
        self.env: dict[str, Any] = dict(_HELPERS)
        self.expr: dict[int, str] = {}
        self.reps: dict[int, _Rep] = {}
        # per-token quantized values not computed yet: value -> (float source, nonbatch dims)
        self.pending_qd: dict[int, tuple[str, int]] = {}
        self.qd_done: dict[tuple[str, int], str] = {}  # (float source, nonbatch) -> rows
        self.qd_vals: dict[tuple[str, int], str] = {}  # ... -> their dequantized values
        self.deq: dict[int, str] = {}  # static quantized value -> its dequantized values
        self.shapes: dict[int, tuple[int, ...]] = {}  # dims computed from the input's
        # expressions of NHWC values whose memory is NCHW (the partitioner's transpose of a
        # channels-first input, the result of a direct convolution), and the
        # channels-last copies made of them for the nodes that want one
        self.nchw: set[str] = set()
        self.contig: dict[str, str] = {}
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
            if not (q.scale > 0 and math.isfinite(q.scale)):
                raise PteFormatError(
                    f"{self.path}.xvalues[{v.index}].quant_params.scale",
                    f"{q.scale} is not a positive finite scale",
                )
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
        """A float expression for value ``vid``: constants bound at load (cast to
        ``dtype``), static quantized values dequantized (once), per-token quantized ones
        quantized and dequantized (once)."""
        v = self.value(vid)
        if v.is_constant:
            return self.bind(self.consts.value(v, dtype), "c")
        r = self.rep(vid)
        if r.kind == "q":
            d = self.deq.get(vid)
            if d is None:
                d = self.deq[vid] = f"d{vid}"
                src = self.xr(vid)
                self.emit(f"{d} = {src} * {qa.f32(r.scale)!r}")
                if src in self.nchw:
                    self.nchw.add(d)
            return d
        e = self.expr.get(vid)
        if e is None and vid in self.pending_qd:
            src = self.pending_qd[vid][0]
            e = self.qd_vals.get(self.pending_qd[vid])
            if e is None:  # once per source, whichever Convert made the value
                e = self.qd_vals[self.pending_qd[vid]] = f"t{vid}"
                self.emit(f"{e} = _qd_values({self.qd_rows(vid)}, {src}.shape, {src}.dtype)")
            self.expr[vid] = e
        if e is None:  # validation guarantees order; this is a defect of ours
            raise AssertionError(f"value {vid} used before it is computed")
        return e

    def xr(self, vid: int) -> str:
        """The value as carried: centered integers for a static quantized value (constants
        too), else as :meth:`x`."""
        v = self.value(vid)
        if self.rep(vid).kind != "q":
            return self.x(vid)
        if v.is_constant:
            return self.bind(self.consts.centered(v), "c")
        e = self.expr.get(vid)
        if e is None:
            raise AssertionError(f"value {vid} used before it is computed")
        return e

    def qd_rows(self, vid: int) -> str:
        """The per-row quantization (q, zero point, scale) of a per-token quantized value,
        computed once for each distinct float source, whichever Convert made it."""
        src, k = self.pending_qd[vid]
        name = self.qd_done.get((src, k))
        if name is None:
            name = self.qd_done[(src, k)] = f"qr{len(self.qd_done)}"
            self.emit(f"{name} = _qd8({src}, {k})")
        return name

    def compute_dtype(self, node: s.XnnNode) -> torch.dtype:
        for vid in node.inputs:
            v = self.value(vid)
            if not v.is_constant:
                r = self.rep(vid)
                if r.kind != "int":
                    return r.dtype
        return self.rep(node.outputs[0]).dtype

    def dims(self, vid: int) -> tuple[int, ...]:
        """A value's dims as the graph computes them: a Convert's output has its input's
        (the serialized dims of a per-batch quantized convolution input are those of the
        NCHW tensor it was made from; XNNPACK recomputes them from the input)."""
        return self.shapes.get(vid) or self.value(vid).dims

    # -- outputs of nodes ----------------------------------------------------------------
    def qbounds(self, r: _Rep, lo: float, hi: float) -> tuple[int, int]:
        """A node's output bounds in centered integers: the type's range narrowed by its
        activation bounds, quantized as XNNPACK quantizes them."""
        qlo, qhi = r.qmin, r.qmax
        if lo != -math.inf:
            qlo = qa.quantize_bound(lo, r.scale, r.zp, r.qmin, r.qmax)
        if hi != math.inf:
            qhi = qa.quantize_bound(hi, r.scale, r.zp, r.qmin, r.qmax)
        if qhi < qlo:
            qhi = qlo
        return qlo - r.zp, qhi - r.zp

    def node_qbounds(self, node: s.XnnNode, vid: int | None = None) -> tuple[int, int]:
        r = self.rep(node.outputs[0] if vid is None else vid)
        return self.qbounds(r, node.output_min, node.output_max)

    def out(
        self, node: s.XnnNode, code: str, fresh: bool, vid: int | None = None, clamp: bool = True
    ) -> None:
        """Assign the float result ``code`` to the node's output, apply its output clamp,
        and quantize it when the output is static int8 (as XNNPACK's Convert does)."""
        vid = node.outputs[0] if vid is None else vid
        name = f"t{vid}"
        r = self.rep(vid)
        lo, hi = (node.output_min, node.output_max) if clamp else (-math.inf, math.inf)
        if r.kind == "q":
            qlo, qhi = self.qbounds(r, lo, hi)
            fq = "_fq_" if fresh else "_fq"
            self.emit(f"{name} = {fq}({code}, {_inv32(r.scale)!r}, {qlo}, {qhi})")
        else:
            self.emit(f"{name} = {code}")
            bounds = []
            if lo != -math.inf:
                bounds.append(f"min={lo!r}")
            if hi != math.inf:
                bounds.append(f"max={hi!r}")
            if bounds:
                if fresh:
                    self.emit(f"{name}.clamp_({', '.join(bounds)})")
                else:
                    self.emit(f"{name} = {name}.clamp({', '.join(bounds)})")
        self.expr[vid] = name

    def out_raw(self, node: s.XnnNode, code: str, fresh: bool, vid: int | None = None) -> None:
        """Assign ``code``, already in the output's representation (centered integers for
        a static quantized output), and apply the node's output clamp in it."""
        vid = node.outputs[0] if vid is None else vid
        r = self.rep(vid)
        if r.kind != "q":
            self.out(node, code, fresh, vid)
            return
        name = f"t{vid}"
        self.emit(f"{name} = {code}")
        if node.has_clamp:
            qlo, qhi = self.node_qbounds(node, vid)
            if fresh:
                self.emit(f"{name}.clamp_({qlo}, {qhi})")
            else:
                self.emit(f"{name} = {name}.clamp({qlo}, {qhi})")
        self.expr[vid] = name

    def same_q(self, a: int, b: int) -> bool:
        """Both values carried alike: float, or static quantized with equal parameters."""
        ra, rb = self.rep(a), self.rep(b)
        if ra.kind == "q" or rb.kind == "q":
            return (ra.kind, ra.scale, ra.zp, ra.qmin) == (rb.kind, rb.scale, rb.zp, rb.qmin)
        return True

    def alias(self, node: s.XnnNode, make: Callable[[str], str]) -> None:
        """An output that only moves data (``make`` builds it from the input expression):
        the values as they are, requantized only when the parameters differ."""
        src, vid = node.inputs[0], node.outputs[0]
        if self.same_q(src, vid):
            self.out_raw(node, make(self.xr(src)), fresh=False)
        else:
            self.out(node, make(self.x(src)), fresh=False)

    # -- regions of int8 elementwise nodes -------------------------------------------------
    def table(self, region: tuple[int, int, list[s.XnnNode]]) -> None:
        """Nodes whose result depends only on one int8 value, element by element (a
        dequantize, a float function, a requantize, a product with the input itself, ...):
        their own code is run once at load on the 256 possible inputs, and the region
        becomes one lookup in that table. The same float operations, so the same result."""
        root, exit_, nodes = region
        r = self.rep(root)
        saved = (self.lines, dict(self.expr), dict(self.deq))
        self.lines = []
        self.expr[root] = "_lut_x"
        self.deq.pop(root, None)
        for n in nodes:
            self.node(n)
        result = self.xr(exit_)
        body = self.lines
        self.lines, self.expr, self.deq = saved
        source = "def _lut_fn(_lut_x):\n" + "".join(f"    {line}\n" for line in body)
        source += f"    return {result}\n"
        namespace = dict(self.env)
        exec(compile(source, f"<xnnpack table {self.path}>", "exec"), namespace)
        inputs = torch.arange(r.qmin, r.qmax + 1, dtype=torch.float32) - float(r.zp)
        with torch.no_grad():
            table = namespace["_lut_fn"](inputs.to(self.device))
        table = table.reshape(-1).to(torch.float32).contiguous()
        name = self.bind(table, "lut")
        self.emit(f"t{exit_} = _lut({self.xr(root)}, {name}, {float(r.zp - r.qmin)!r})")
        self.expr[exit_] = f"t{exit_}"

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
            self.emit(f"{name} = {x}.to(torch.float32) - {r.zp}")
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
            src = f"({src} + {r.zp})"
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
        nodes = _fuse_clamps(self.g)
        tables = _table_regions(self.g, nodes, self.rep)
        spans: list[tuple[str, int, int]] = []  # (node name, its first line, past its last)
        seen: dict[str, int] = {}

        def named(kind: str) -> str:
            seen[kind] = seen.get(kind, 0) + 1
            return f"{kind} #{seen[kind]}"

        for i, node in enumerate(nodes):
            first = len(self.lines)
            if i not in tables:
                self.node(node)
                spans.append((named(node.type), first, len(self.lines)))
                continue
            region = tables[i]
            if region is not None:  # the last node of a region: one table lookup
                self.table(region)
                kinds = "+".join(n.type for n in region[2])
                spans.append((named(f"Lookup table ({kinds})"), first, len(self.lines)))
        for v in outs:
            self.store_output(v)
        params = ", ".join(f"x{k}" for k in ext_ids)
        body = self.lines or ["pass"]
        source = f"def _xnnpack_run({params}):\n" + "".join(f"    {line}\n" for line in body)
        sources = Sources(f"xnnpack {self.path}")
        namespace = sources.compile(source, "graph", self.env)
        out_ids = tuple(sorted(v.external_id for v in outs))
        timed = _timed_source(self.lines, spans, params)
        return XnnRunner(
            namespace["_xnnpack_run"],
            source,
            ext_ids,
            counts,
            out_ids,
            lambda: sources.compile(timed, "graph, timed per node", self.env)["_xnnpack_nodes"],
        )

    def node(self, n: s.XnnNode) -> None:
        self._node(n)
        if n.type in _ELEMENTWISE and n.outputs[0] in self.expr:
            # an elementwise result keeps the memory layout of its (first) input
            first = next((v for v in n.inputs if not self.value(v).is_constant), None)
            if first is not None and self.expr.get(first) in self.nchw:
                self.nchw.add(self.expr[n.outputs[0]])

    def channels_last(self, x: str) -> str:
        """``x`` (an NHWC expression) in channels-last (contiguous NHWC) memory: itself, or
        one copy made where it is first needed."""
        if x not in self.nchw:
            return x
        name = self.contig.get(x)
        if name is None:
            name = self.contig[x] = f"cl{len(self.contig)}"
            self.emit(f"{name} = {x}.contiguous()")
        return name

    def _mark_nchw(self, vid: int) -> None:
        e = self.expr.get(vid)
        if e is not None:
            self.nchw.add(e)

    def _node(self, n: s.XnnNode) -> None:
        t = n.type
        if t in _BINARY:
            if t in ("Add", "Subtract", "Multiply") and self._q_binary(n):
                return
            dt = self.compute_dtype(n)
            a, b = self.x(n.inputs[0], dt), self.x(n.inputs[1], dt)
            self.out(n, _BINARY[t].format(a=a, b=b), fresh=True)
        elif t in _UNARY:
            self.check_flags(n, 0)
            if self._q_table(n):
                return
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
        dims = self.dims(vid)
        if len(dims) != want:
            raise self.fail(n, f"value {vid} has {len(dims)} dims {list(dims)}, expected {want}")

    # -- static int8 arithmetic ----------------------------------------------------------
    def all_qs8(self, vids: Sequence[int]) -> bool:
        return all(self.rep(v).is_qs8 for v in vids)

    def _q_binary(self, n: s.XnnNode) -> bool:
        """Add, subtract and multiply on int8 values, as XNNPACK's integer kernels."""
        a, b, o = n.inputs[0], n.inputs[1], n.outputs[0]
        if not self.all_qs8((a, b, o)):
            return False
        ra, rb, ro = self.rep(a), self.rep(b), self.rep(o)
        lo, hi = self.node_qbounds(n)
        xa, xb = self.xr(a), self.xr(b)
        if n.type == "Multiply":
            scale = qa.mul_scale(ra.scale, rb.scale, ro.scale)
            self.out_raw_bounded(n, f"_qmul({xa}, {xb}, {scale!r}, {lo}, {hi})")
            return True
        try:
            p = qa.add_params(ra.scale, rb.scale, ro.scale, -1 if n.type == "Subtract" else 1)
        except ValueError as e:
            raise BackendUnavailableError(f"XNNPACK {n.type} node {n.index}: {e}") from None
        self.out_raw_bounded(
            n, f"_qadd({xa}, {xb}, {p.a_mult}, {p.b_mult}, {p.rounding}, {p.shift}, {lo}, {hi})"
        )
        return True

    def out_raw_bounded(self, n: s.XnnNode, code: str) -> None:
        """A centered result that already carries the node's output bounds."""
        vid = n.outputs[0]
        self.emit(f"t{vid} = {code}")
        self.expr[vid] = f"t{vid}"

    def _q_table(self, n: s.XnnNode, fn: Any = None) -> bool:
        """A unary function on int8 values: XNNPACK's 256-entry table of the function of
        the dequantized inputs, quantized."""
        src, o = n.inputs[0], n.outputs[0]
        if not self.all_qs8((src, o)) or self.value(src).is_constant:
            return False
        ri, ro = self.rep(src), self.rep(o)
        table = qa.unary_table(n.type, ri.scale, ri.zp, ro.scale, ro.zp, fn=fn)
        if table is None:
            return False
        lo, hi = self.node_qbounds(n)
        table = table.clamp_(lo, hi).to(self.device)
        name = self.bind(table, "lut")
        self.out_raw_bounded(n, f"_lut({self.xr(src)}, {name}, {float(ri.zp + 128)!r})")
        return True

    def _q_weights(
        self, n: s.XnnNode, channel_dim: int, channels: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
        """For a node whose input and output are static int8 and whose filter is int8
        (per tensor, or per channel along ``channel_dim``): (integer weights as float32
        in XNNPACK's dims, one float32 requantization scale per output channel, the int32
        bias as float32 or None). None when the node is not of that kind."""
        src, o = n["input1_id"], n.outputs[0]
        if not self.all_qs8((src, o)) or self.value(src).is_constant:
            return None
        fv = self.value(n["filter_id"])
        q = fv.quant
        if not fv.is_constant:
            return None
        if not 0 <= channel_dim < len(fv.dims) or fv.dims[channel_dim] != channels:
            raise self.fail(n, f"filter dims {list(fv.dims)} for {channels} output channels")
        if fv.dtype_name == "qint8" and isinstance(q, s.PerTensorQuant):
            w = self.consts.ints(fv).to(torch.float32) - float(q.zero_point)
            wscale = torch.full((channels,), q.scale, dtype=torch.float32)
        elif (
            fv.dtype_name == "qcint8"
            and isinstance(q, s.PerChannelQuant)
            and q.channel_dim == channel_dim
            and q.num_scales in (channels, 0)
        ):
            w = self.consts.ints(fv).to(torch.float32)
            wscale = self.consts.scales(q).reshape(-1)
            if wscale.numel() != channels:
                raise self.fail(n, f"{wscale.numel()} filter scales for {channels} channels")
        else:
            return None
        bias = None
        bid = n["bias_id"]
        if bid is not None:
            bv = self.value(bid)
            if not bv.is_constant or bv.dtype_name not in ("qint32", "qcint32"):
                return None
            bias = self.consts.ints(bv).reshape(-1)  # int32: exact in float64
            if bias.numel() != channels:
                raise self.fail(n, f"bias of {bias.numel()} values for {channels} channels")
        scale = qa.requant_scales(self.rep(src).scale, wscale, self.rep(o).scale)
        return w, scale, bias

    def _q_exact32(
        self, n: s.XnnNode, w: torch.Tensor, channel_dim: int, bias: torch.Tensor | None
    ) -> bool:
        """Whether float32 accumulation is exact for this node (see :mod:`.quant`). Off the
        CPU never: cuDNN may convolve by FFT or Winograd transforms, which are not exact
        on integers; float64 keeps their error far below a rounding step."""
        if self.device.type != "cpu":
            return False
        r = self.rep(n["input1_id"])
        amax = max(r.zp - r.qmin, r.qmax - r.zp)
        other = [d for d in range(w.dim()) if d != channel_dim]
        wsum = float(w.abs().sum(dim=other).max()) if w.numel() else 0.0
        bmax = float(bias.double().abs().max()) if bias is not None and bias.numel() else 0.0
        return qa.exact_in_float32(wsum, amax, bmax)

    def _q_finish(
        self, n: s.XnnNode, acc: str, scale: torch.Tensor, nchw: str | None = None
    ) -> None:
        """Requantize an exact accumulator (NHWC, or [..., channels]) into the output; with
        ``nchw``, the same accumulator as an NCHW tensor, requantized in that layout."""
        lo, hi = self.node_qbounds(n)
        if nchw is not None:
            sname = self.bind(scale.reshape(-1, 1, 1).to(self.device), "s")
            self.out_raw_bounded(n, f"_rq({nchw}, {sname}, {lo}, {hi}).permute(0, 2, 3, 1)")
            return
        sname = self.bind(scale.to(self.device), "s")
        self.out_raw_bounded(n, f"_rq({acc}, {sname}, {lo}, {hi})")

    # -- elementwise -------------------------------------------------------------------
    def n_Clamp(self, n: s.XnnNode) -> None:
        src, o = n.inputs[0], n.outputs[0]
        if self.rep(o).kind == "q" and not self.same_q(src, o):
            lo, hi = n.output_min, n.output_max
            if self._q_table(n, fn=lambda x: x.clamp(lo, hi)):
                return
        self.alias(n, lambda e: e)

    def n_LeakyReLU(self, n: s.XnnNode) -> None:
        self.out(n, f"F.leaky_relu({self.x(n.inputs[0])}, {n['negative_slope']!r})", fresh=True)

    def n_ELU(self, n: s.XnnNode) -> None:
        alpha = float(n["alpha"])
        if self._q_table(n, fn=lambda x: torch.where(x < 0, torch.expm1(x) * alpha, x)):
            return
        self.out(n, f"F.elu({self.x(n.inputs[0])}, {alpha!r})", fresh=True)

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
        out_ch = fv.dims[1] if transposed else fv.dims[0]
        qw = self._q_weights(n, 1 if transposed else 0, out_ch) if fv.is_constant else None
        if qw is not None:
            w, scale, bias = qw
            wt = w.t() if transposed else w
            exact = self._q_exact32(n, wt, 0, bias)
            cast = "" if exact else ".double()"
            wdt = torch.float32 if exact else torch.float64
            wname = self.bind(wt.contiguous().to(self.device, wdt), "w")
            b = self.bind(bias.to(self.device, wdt), "b") if bias is not None else "None"
            acc = f"F.linear({self.xr(n['input1_id'])}{cast}, {wname}, {b})"
            self._q_finish(n, acc, scale)
            return
        x = self.x(n.inputs[0], dt)
        bias_id = n["bias_id"]
        b = self.x(bias_id, dt) if bias_id is not None else "None"
        if fv.is_constant:
            wt_ = self.consts.value(fv, dt)
            if transposed:
                wt_ = wt_.t().contiguous()
            wname = self.bind(wt_, "w")
            self.out(n, f"F.linear({x}, {wname}, {b})", fresh=True)
        else:
            we = self.x(fv.id, dt)
            wexpr = we if transposed else f"{we}.t()"
            code = (
                f"torch.matmul({x}, {wexpr})"
                if bias_id is None
                else f"torch.add(torch.matmul({x}, {wexpr}), {b})"
            )
            self.out(n, code, fresh=True)

    def _qd_int_linear(self, n: s.XnnNode, fv: s.XnnValue, transposed: bool) -> bool:
        """A per-token quantized input times int8/int4 weights with one scale per output
        channel accumulates exactly, as XNNPACK's kernels: as a float32 product of the
        integers when the weights prove every partial sum exact, else (on the CPU) as an
        int8 matrix product. Block-wise weights with several blocks per row stay in float."""
        src = n["input1_id"]
        q = fv.quant
        per_channel = (
            isinstance(q, s.PerChannelQuant) and fv.dtype_name in ("qcint8", "qcint4")
        ) or (isinstance(q, s.PerChannelGroupQuant) and q.group_size == fv.dims[1])
        if (
            src not in self.pending_qd
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
        exact = qa.exact_in_float32(float(ints.abs().sum(dim=1, dtype=torch.int64).max()), 255, 0)
        if not exact and self.device.type != "cpu":
            return False
        wscale = self.bind(self.consts.scales(q).to(torch.float32).contiguous().to(self.device))
        bias = n["bias_id"]
        b = self.x(bias, torch.float32) if bias is not None else "None"
        x = self.pending_qd[src][0]
        dt = _dtype_expr(self.rep(src).dtype)
        rows = self.qd_rows(src)
        if exact and (self.device.type != "cpu" or ints.numel() < _INT_MM_WEIGHTS):
            w = self.bind(ints.to(torch.float32).contiguous().to(self.device), "w")
            code = f"_qd_linear_f({rows}, {x}.shape[:-1], {w}, {wscale}, {b}, {dt})"
        else:
            wt = self.bind(ints.t().contiguous(), "w")
            colsum = self.bind(ints.sum(dim=1, dtype=torch.int32).to(torch.float32), "w")
            code = f"_qd_linear({rows}, {x}.shape[:-1], {wt}, {colsum}, {wscale}, {b}, {dt})"
        self.out(n, code, fresh=True)
        return True

    def n_BatchMatrixMultiply(self, n: s.XnnNode) -> None:
        self.check_flags(n, s.FLAG_TRANSPOSE_WEIGHTS)
        dt = self.compute_dtype(n)
        a, b = self.x(n.inputs[0], dt), self.x(n.inputs[1], dt)
        if n.flags & s.FLAG_TRANSPOSE_WEIGHTS:
            b = f"{b}.transpose(-1, -2)"
        self.out(n, f"torch.matmul({a}, {b})", fresh=True)

    # -- convolutions --------------------------------------------------------------------
    def _conv_common(self, n: s.XnnNode, channel_dim: int, channels: int) -> _Conv:
        """What every convolution needs: its input expression, compute dtype, bias,
        paddings and filter (dequantized float, or integers when the node runs in int8),
        and how the result becomes the output. Half-precision convolutions on the CPU
        compute in float32 (torch's half convolutions there are slow; XNNPACK's half
        kernels accumulate in float32 too) and round the result to half."""
        self.check_flags(n, 0)
        self.rank(n, n["input1_id"], 4)
        self.rank(n, n["filter_id"], 4)
        fv = self.value(n["filter_id"])
        if not fv.is_constant:
            raise BackendUnavailableError(
                f"XNNPACK {n.type} node {n.index} with a non-constant filter is not supported"
            )
        pads = (n["padding_top"], n["padding_right"], n["padding_bottom"], n["padding_left"])
        src = n["input1_id"]
        qw = self._q_weights(n, channel_dim, channels)
        if qw is not None:  # static int8: exact integer accumulation, then requantization
            w, scale, bias = qw
            exact = self._q_exact32(n, w, channel_dim, bias)
            dt = torch.float32 if exact else torch.float64
            x = self.xr(src) + ("" if exact else ".double()")
            b = self.bind(bias.to(self.device, dt), "b") if bias is not None else "None"
            return _Conv(
                x,
                dt,
                b,
                pads,
                w.to(dt),
                lambda code, nchw=None: self._q_finish(n, code, scale, nchw),
            )
        if src in self.pending_qd and self.pending_qd[src][1] == 3:
            qd = self._qd_conv(n, channel_dim, channels, src)
            if qd is not None:
                return _Conv(qd[0], torch.float32, "None", pads, qd[1], qd[2])
        dt = self.compute_dtype(n)
        x = self.x(src, dt)
        post = ""
        if self.device.type == "cpu" and dt in (torch.float16, torch.bfloat16):
            x, post, dt = f"{x}.float()", f".to({_dtype_expr(dt)})", torch.float32
        bias_id = n["bias_id"]
        b = self.x(bias_id, dt) if bias_id is not None else "None"
        w = self.consts.value(fv, dt)
        return _Conv(
            x, dt, b, pads, w, lambda code, nchw=None: self.out(n, f"{code}{post}", fresh=True)
        )

    def _qd_conv(
        self, n: s.XnnNode, channel_dim: int, channels: int, src: int
    ) -> tuple[str, torch.Tensor, Callable[[str], None]] | None:
        """A convolution of an input quantized per batch element (XNNPACK's dynamically
        quantized convolution): the centered integers convolved with the integer weights,
        then scaled by the input's and the filter's scales, plus the float bias."""
        fv = self.value(n["filter_id"])
        q = fv.quant
        if not (
            fv.dtype_name == "qcint8"
            and isinstance(q, s.PerChannelQuant)
            and q.channel_dim == channel_dim
            and self.rep(n.outputs[0]).kind == "float"
        ):
            return None
        w = self.consts.ints(fv).to(torch.float32)
        wscale = self.consts.scales(q).reshape(-1).contiguous()
        if wscale.numel() != channels:
            raise self.fail(n, f"{wscale.numel()} filter scales for {channels} channels")
        other = [d for d in range(w.dim()) if d != channel_dim]
        if not qa.exact_in_float32(float(w.abs().sum(dim=other).max()), 255, 0.0):
            return None
        rows = self.qd_rows(src)
        fsrc = self.pending_qd[src][0]
        x = f"{rows}.centered.reshape({fsrc}.shape)"
        bias_id = n["bias_id"]
        b = self.x(bias_id, torch.float32) if bias_id is not None else "None"
        ws = self.bind(wscale.to(self.device), "s")
        dt = self.rep(n.outputs[0]).dtype
        cast = "" if dt == torch.float32 else f".to({_dtype_expr(dt)})"

        def finish(code: str, nchw: str | None = None) -> None:
            self.out(n, f"_qd_scale({code}, {rows}, {ws}, {b}){cast}", fresh=True)

        return x, w, finish

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
        dims = self.dims(n["input1_id"])
        top, right, bottom, left = pads
        k = (n["kernel_height"], n["kernel_width"])
        st = self._two(n["subsampling_height"], n["subsampling_width"])
        dil = self._two(n["dilation_height"], n["dilation_width"])
        h = (dims[1] + top + bottom - dil[0] * (k[0] - 1) - 1) // st[0] + 1
        w = (dims[2] + left + right - dil[1] * (k[1] - 1) - 1) // st[1] + 1
        self._expect_dims(n, {1: h, 2: w, 3: out_ch})

    def _conv_input(self, x: str, pads: tuple[int, int, int, int]) -> tuple[str, tuple[int, int]]:
        """The NHWC input as the NCHW view torch convolves (channels-last memory), and the
        symmetric padding left to the convolution (asymmetric padding is applied in NHWC,
        which keeps the memory channels last)."""
        top, right, bottom, left = pads
        if top == bottom and left == right:
            return f"{x}.permute(0, 3, 1, 2)", (top, left)
        return f"F.pad({x}, (0, 0, {left}, {right}, {top}, {bottom})).permute(0, 3, 1, 2)", (0, 0)

    def n_Conv2d(self, n: s.XnnNode) -> None:
        groups = n["groups"]
        if groups < 1:
            raise self.fail(n, "groups must be at least 1")
        out_ch = groups * n["group_output_channels"]
        c = self._conv_common(n, 0, out_ch)
        raw = c.w  # [OC, KH, KW, IC/g]
        w = raw.permute(0, 3, 1, 2)
        self._check_conv_shape(n, w, out_ch, n["group_input_channels"])
        self._conv_out(n, c.pads, out_ch)
        stride = self._two(n["subsampling_height"], n["subsampling_width"])
        dil = self._two(n["dilation_height"], n["dilation_width"])
        x, b = c.x, c.b
        if groups == 1 and w.shape[2:] == (1, 1) and not any(c.pads):
            # a 1x1 convolution of NHWC values is a linear layer over channels
            x = self.channels_last(x)
            xs = x if stride == (1, 1) else f"{x}[:, ::{stride[0]}, ::{stride[1]}]"
            wn = self.bind(raw.reshape(raw.shape[0], raw.shape[3]).to(self.device), "w")
            c.finish(f"F.linear({xs}, {wn}, {b})")
            return
        if self._tiny_conv(n, groups, dil, c.dtype):
            # torch's direct (im2col) kernel: far less fixed cost than oneDNN's for tiny
            # work; it convolves NCHW memory and gives NCHW memory
            xc, pad = self._conv_input(x, c.pads)
            wn = self.bind(w.contiguous().to(self.device), "w")
            k = tuple(w.shape[2:])
            code = f"_slow_conv2d({xc}, {wn}, {k}, {b}, {stride}, {pad})"
            c.finish(f"{code}.permute(0, 2, 3, 1)", code)
            self._mark_nchw(n.outputs[0])
            return
        xc, pad = self._conv_input(self.channels_last(x), c.pads)
        wn = self.bind(_channels_last(w).to(self.device), "w")
        code = f"F.conv2d({xc}, {wn}, {b}, {stride}, {pad}, {dil}, {groups})"
        c.finish(f"{code}.permute(0, 2, 3, 1)")

    def _tiny_conv(self, n: s.XnnNode, groups: int, dil: tuple[int, int], dt: torch.dtype) -> bool:
        # traced code takes conv2d: the direct kernel's shape function gives its output
        # channels-last strides where the kernel writes NCHW memory
        if self.traced or self.device.type != "cpu" or groups != 1 or dil != (1, 1):
            return False
        if dt != torch.float32:
            return False
        out = self.value(n.outputs[0]).dims
        k = int(n["kernel_height"] * n["kernel_width"] * n["group_input_channels"])
        return math.prod(out) * k * 2 < _TINY_CONV_FLOPS

    def n_DepthwiseConv2d(self, n: s.XnnNode) -> None:
        channels = n["groups"]
        gi = n["group_input_channels"]
        if channels < 1 or gi < 1 or n["group_output_channels"] % gi:
            raise self.fail(n, "depthwise channels and multiplier must be positive")
        out_ch = channels * (n["group_output_channels"] // gi)
        c = self._conv_common(n, 3, out_ch)
        w = c.w.permute(3, 0, 1, 2).contiguous()  # [1, KH, KW, C * mult] -> [C * mult, 1, KH, KW]
        self._check_conv_shape(n, w, out_ch, 1)
        self._conv_out(n, c.pads, out_ch)
        xc, pad = self._conv_input(self.channels_last(c.x), c.pads)
        stride = self._two(n["subsampling_height"], n["subsampling_width"])
        dil = self._two(n["dilation_height"], n["dilation_width"])
        wn = self.bind(_channels_last(w).to(self.device), "w")
        c.finish(
            f"F.conv2d({xc}, {wn}, {c.b}, {stride}, {pad}, {dil}, {channels}).permute(0, 2, 3, 1)"
        )

    def n_ConvTranspose2d(self, n: s.XnnNode) -> None:
        groups = n["groups"]
        gi, go = n["group_input_channels"], n["group_output_channels"]
        if groups < 1:
            raise self.fail(n, "groups must be at least 1")
        c = self._conv_common(n, 0, groups * go)
        oihw = c.w.permute(0, 3, 1, 2)  # [OC, KH, KW, IC/g] -> [OC, IC/g, KH, KW]
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
        top, right, bottom, left = c.pads
        dims = self.dims(n["input1_id"])
        h = stride[0] * (dims[1] - 1) + adj[0] + dil[0] * (kh - 1) + 1 - top - bottom
        wd = stride[1] * (dims[2] - 1) + adj[1] + dil[1] * (kw - 1) + 1 - left - right
        self._expect_dims(n, {1: h, 2: wd, 3: groups * go})
        wn = self.bind(w.to(self.device), "w")
        sym = top == bottom and left == right
        pad = (top, left) if sym else (0, 0)
        direct = self.device.type == "cpu" and groups == 1
        if direct:
            # torch's direct kernel: 1.7-2.7x faster than oneDNN's on these shapes
            # (benchmarks/xnnpack_kernels.py --only deconv); NCHW memory in and out
            xc = f"{c.x}.permute(0, 3, 1, 2)"
            call = f"_slow_deconv2d({xc}, {wn}, {(kh, kw)}, {c.b}, {stride}, {pad}, {adj}, {dil})"
        else:
            xc = f"{self.channels_last(c.x)}.permute(0, 3, 1, 2)"
            call = f"F.conv_transpose2d({xc}, {wn}, {c.b}, {stride}, {pad}, {adj}, {groups}, {dil})"
        if sym:
            code = call
        else:  # asymmetric padding: run unpadded, then crop
            full = f"_full{n.index}"
            self.emit(f"{full} = {call}")
            code = (
                f"{full}[:, :, {top}:{full}.shape[2] - {bottom}, {left}:{full}.shape[3] - {right}]"
            )
        c.finish(f"{code}.permute(0, 2, 3, 1)", code if direct else None)
        if direct:
            self._mark_nchw(n.outputs[0])

    # -- pooling -------------------------------------------------------------------------
    def _pool_args(
        self, n: s.XnnNode, raw: bool = False
    ) -> tuple[str, tuple[int, int], tuple[int, int], tuple[int, int, int, int]]:
        self.check_flags(n, s.FLAG_KEEP_DIMS)
        self.rank(n, n["input_id"], 4)
        k = (n["pooling_height"], n["pooling_width"])
        if k[0] < 1 or k[1] < 1:
            raise self.fail(n, f"pooling window {k}")
        st = self._two(n["stride_height"], n["stride_width"])
        pads = (n["padding_top"], n["padding_right"], n["padding_bottom"], n["padding_left"])
        x = self.xr(n["input_id"]) if raw else self.x(n["input_id"])
        if math.prod(self.dims(n["input_id"])) >= _CL_POOL_ELEMENTS:
            x = self.channels_last(x)
        return x, k, st, pads

    def n_MaxPooling2d(self, n: s.XnnNode) -> None:
        same = self.same_q(n["input_id"], n["output_id"])
        x, k, st, pads = self._pool_args(n, raw=same)
        dil = self._two(n["dilation_height"], n["dilation_width"])
        top, right, bottom, left = pads
        eff = ((k[0] - 1) * dil[0] + 1, (k[1] - 1) * dil[1] + 1)
        if top == bottom and left == right and 2 * top <= eff[0] and 2 * left <= eff[1]:
            code = f"F.max_pool2d({x}.permute(0, 3, 1, 2), {k}, {st}, {(top, left)}, {dil}).permute(0, 2, 3, 1)"
        else:
            code = f"_max_pool({x}, {k}, {st}, {pads}, {dil})"
        if same:  # the maximum of integers is the integer of the maximum
            self.out_raw(n, code, fresh=True)
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
        src, o = n.inputs[0], n.outputs[0]
        rank = len(self.dims(src))
        if rank < 3:
            raise self.fail(n, f"input has {rank} dims, expected at least 3")
        dims = tuple(range(1, rank - 1))
        keep = bool(n.flags & s.FLAG_KEEP_DIMS)
        if self.all_qs8((src, o)) and not self.value(src).is_constant:
            ri, ro = self.rep(src), self.rep(o)
            mean = self.bind(qa.Mean(ri.scale, ri.zp, ro.scale, ro.zp), "mean")
            self.out_raw(n, f"{mean}({self.xr(src)}, {dims}, {keep})", fresh=True)
            return
        self.out(n, f"{self.x(src)}.mean(dim={dims}, keepdim={keep})", fresh=True)

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
        rank = len(self.dims(n.inputs[0]))
        if sorted(perm) != list(range(rank)) or n["num_dims"] != rank:
            raise self.fail(n, f"perm {list(perm)} is not a permutation of {rank} dims")
        src = self.expr.get(n.inputs[0])
        self.alias(n, lambda e: f"{e}.permute({perm})")
        if perm == (0, 2, 3, 1) and rank == 4 and src not in self.nchw:
            # into XNNPACK's NHWC: a view of NCHW memory, copied to channels-last memory
            # where a node wants it (oneDNN convolutions and pools), once
            self._mark_nchw(n.outputs[0])

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
        self.alias(n, lambda e: f"{e}.reshape({shape})")

    def n_StaticSlice(self, n: s.XnnNode) -> None:
        self.check_flags(n, 0)
        offsets, sizes = n["offsets"], n["sizes"]
        rank = len(self.dims(n.inputs[0]))
        if len(offsets) != rank or len(sizes) != rank or n["num_dims"] != rank:
            raise self.fail(n, f"offsets {list(offsets)} and sizes {list(sizes)} for {rank} dims")
        parts = []
        for o, z in zip(offsets, sizes, strict=True):
            end = o + z
            parts.append(f"{o}:{end}" if end > 0 else f"{o}:")
        self.alias(n, lambda e: f"{e}[{', '.join(parts)}]")

    def n_StaticConstantPad(self, n: s.XnnNode) -> None:
        self.check_flags(n, 0)
        pre, post = n["pre_paddings"], n["post_paddings"]
        in_dims = self.dims(n.inputs[0])
        rank = len(in_dims)
        if len(pre) != rank or len(post) != rank:
            raise self.fail(n, f"paddings {list(pre)}, {list(post)} for {rank} dims")
        self._expect_dims(n, {d: in_dims[d] + pre[d] + post[d] for d in range(rank)})
        pads: list[int] = []
        for d in reversed(range(rank)):
            pads += [pre[d], post[d]]
        value = float(n["padding_value"])
        src, o = n.inputs[0], n.outputs[0]
        r = self.rep(o)
        if r.kind == "q":  # the padding value, as XNNPACK stores it: quantized
            q = qa.quantize_bound(value, r.scale, r.zp, r.qmin, r.qmax)
            if self.same_q(src, o):
                code = f"F.pad({self.xr(src)}, {tuple(pads)}, value={float(q - r.zp)!r})"
                self.out_raw(n, code, fresh=True)
                return
            value = (q - r.zp) * r.scale
        self.out(n, f"F.pad({self.x(src)}, {tuple(pads)}, value={value!r})", fresh=True)

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
        rank = len(self.dims(n.inputs[0]))
        axis = n["axis"]
        if axis >= rank:
            raise self.fail(n, f"axis {axis} for {rank} dims")
        for vid in n.inputs:
            if len(self.dims(vid)) != rank:
                raise self.fail(n, "inputs of different ranks")
        if all(self.same_q(v, n.outputs[0]) for v in n.inputs):
            parts = ", ".join(self.xr(v) for v in n.inputs)
            self.out_raw(n, f"torch.cat(({parts}), {axis})", fresh=True)
            return
        dt = self.compute_dtype(n)
        parts = ", ".join(self.x(v, dt) for v in n.inputs)
        self.out(n, f"torch.cat(({parts}), {axis})", fresh=True)

    n_Concatenate2 = _cat
    n_Concatenate3 = _cat
    n_Concatenate4 = _cat
    n_Concatenate5 = _cat

    def n_Copy(self, n: s.XnnNode) -> None:
        self.check_flags(n, 0)
        self.alias(n, lambda e: e)

    def n_Convert(self, n: s.XnnNode) -> None:
        src, dst = self.value(n.inputs[0]), self.value(n.outputs[0])
        self.shapes[dst.id] = self.dims(src.id)
        ri = self.rep(src.id)
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
            # quantized where it is first needed, once per source: a linear with int8
            # weights or a convolution reads the integers and never the float values
            self.pending_qd[dst.id] = (self.x(src.id), q.num_nonbatch_dims)
            return
        ro = self.rep(dst.id)
        if ro.kind == "q" and ri.kind == "q":
            if self.same_q(src.id, dst.id):
                self.out_raw(n, self.xr(src.id), fresh=False)
                return
            if self.all_qs8((src.id, dst.id)):
                mult, _ = qa.requantize_params(ri.scale, ri.zp, ro.scale, ro.zp)
                lo, hi = self.node_qbounds(n)
                self.out_raw_bounded(n, f"_qcvt({self.xr(src.id)}, {mult}, {lo}, {hi})")
                return
        if ro.kind == "q":
            x = self.x(src.id)
            code = x if ri.dtype == torch.float32 else f"{x}.to(torch.float32)"
            self.out(n, code, fresh=False)
            return
        if ro.kind == "float" and ri.kind in ("float", "q", "qd"):
            x = self.x(src.id)
            dt = self.rep(src.id).dtype
            code = x if dt == ro.dtype else f"{x}.to({_dtype_expr(ro.dtype)})"
            self.emit(f"t{dst.id} = {code}")
            self.expr[dst.id] = f"t{dst.id}"
            return
        raise BackendUnavailableError(
            f"XNNPACK Convert from {src.dtype_name} to {out} is not supported"
        )


# nodes whose handlers apply the node's output bounds (min/max) to their result
_CLAMPED = frozenset(
    {
        "Conv2d",
        "DepthwiseConv2d",
        "ConvTranspose2d",
        "FullyConnected",
        "Add",
        "Subtract",
        "Multiply",
        "MaxPooling2d",
        "AvgPooling2d",
        "GlobalAvgPooling2d",
    }
)


def _fuse_clamps(g: s.XnnGraph) -> list[s.XnnNode]:
    """The graph's nodes with each Clamp folded into the node that produces its input
    when nothing else reads that value and both values are carried alike (as XNNPACK's
    own subgraph optimizer fuses them): the producer writes the Clamp's output, bounded
    by both. One node less to run, and for int8 values the bounds join the
    requantization."""
    readers: dict[int, int] = {}
    for n in g.nodes:
        for vid in n.inputs:
            readers[vid] = readers.get(vid, 0) + 1
    producer = {vid: i for i, n in enumerate(g.nodes) for vid in n.outputs}
    nodes: list[s.XnnNode | None] = list(g.nodes)
    for i, c in enumerate(g.nodes):
        if c.type != "Clamp" or c.flags or len(c.inputs) != 1:
            continue
        src, dst = c.inputs[0], c.outputs[0]
        j = producer.get(src, i)
        p = nodes[j] if j < i else None
        vs, vd = g.by_id[src], g.by_id[dst]
        if (
            p is None
            or p.type not in _CLAMPED
            or len(p.outputs) != 1
            or readers.get(src) != 1
            or vs.is_output
            or (vs.datatype, vs.quant) != (vd.datatype, vd.quant)
        ):
            continue
        attrs = dict(p.attrs)
        attrs["output_id"] = dst
        nodes[j] = dataclasses.replace(
            p,
            attrs=MappingProxyType(attrs),
            outputs=(dst,),
            output_min=max(p.output_min, c.output_min),
            output_max=min(p.output_max, c.output_max),
        )
        nodes[i] = None
    return [n for n in nodes if n is not None]


# element-by-element nodes a table region may contain (Softmax reads whole rows)
_ELEMENTWISE = (
    (frozenset(_UNARY) - {"Softmax"})
    | frozenset(_BINARY)
    | {
        "Convert",
        "Clamp",
        "LeakyReLU",
        "ELU",
    }
)


def _table_regions(
    g: s.XnnGraph, nodes: Sequence[s.XnnNode], rep: Callable[[int], _Rep]
) -> dict[int, tuple[int, int, list[s.XnnNode]] | None]:
    """Regions of elementwise nodes whose every non-constant input derives from one
    int8 value (the root; constants must be scalars) and whose one result read elsewhere
    is int8, with two nodes or more. Returns node position -> the region (root, result,
    nodes) at its last node, None at its other nodes."""
    root_of: dict[int, int] = {}  # value -> the int8 value it derives from
    members: dict[int, list[int]] = {}  # root -> node positions
    for i, n in enumerate(nodes):
        if n.type not in _ELEMENTWISE or len(n.outputs) != 1:
            continue
        roots = set()
        ok = True
        for vid in n.inputs:
            v = g.by_id[vid]
            if v.is_constant:
                ok = ok and v.numel <= 1
            elif vid in root_of:
                roots.add(root_of[vid])
            elif rep(vid).is_qs8:
                roots.add(vid)
            else:
                ok = False
        out = g.by_id[n.outputs[0]]
        if not ok or len(roots) != 1 or out.dtype_name == "qdint8":
            continue
        root = roots.pop()
        root_of[n.outputs[0]] = root
        members.setdefault(root, []).append(i)
    readers: dict[int, set[int]] = {}
    for i, n in enumerate(nodes):
        for vid in n.inputs:
            readers.setdefault(vid, set()).add(i)
    regions: dict[int, tuple[int, int, list[s.XnnNode]] | None] = {}
    for root, pos in members.items():
        if len(pos) < 2:
            continue
        inside = set(pos)
        made = {nodes[i].outputs[0] for i in pos}
        exits = [v for v in made if g.by_id[v].is_output or not readers.get(v, set()) <= inside]
        last = max(pos)
        if len(exits) != 1 or exits[0] != nodes[last].outputs[0] or not rep(exits[0]).is_qs8:
            continue
        for i in pos:
            regions[i] = None
        regions[last] = (root, exits[0], [nodes[i] for i in sorted(pos)])
    return regions


def _channels_last(w: torch.Tensor) -> torch.Tensor:
    """A 4-d filter in channels-last memory (oneDNN then convolves channels-last
    activations without reordering them)."""
    return w.contiguous(memory_format=torch.channels_last)


def _dtype_expr(dt: torch.dtype) -> str:
    return f"torch.{str(dt).removeprefix('torch.')}"


def build_runner(
    payload: s.XnnPayload,
    named_data: Mapping[str, memoryview],
    args: Sequence[ArgInfo | None],
    device: torch.device | str = "cpu",
    traced: bool = False,
) -> XnnRunner:
    """Check that every node and datatype is supported, validate the payload and compile its
    node list; ``args`` describes the delegate call's arguments (None: not a tensor).
    ``traced``: the code is to be traced (the compiled tier), so it uses only operations
    whose shape functions give the strides their kernels produce."""
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
    return _Gen(payload, named_data, args, torch.device(device), traced).build()
