"""The XNNPACK delegate payload: bytes -> frozen dataclasses, validated. Imports no torch.

A payload is an optional 30-byte header (``XH00`` at bytes 4..8: flatbuffer offset and size,
constant data offset and size), a flatbuffer ``XNNGraph`` (identifier ``XN00`` or ``XN01``)
and a constant data region. The graph holds tensor values (``XValue``: plain or quantized,
each with an ``id_out``), nodes (``XNode``: one of the ``XNodeUnion`` tables, a debug handle
and an optional fused output clamp) and a table of constant data: each entry either an
offset/size into the constant region or a key into the program's named data.

External values carry an ``external_id``: the position of their tensor in the
``DelegateCall``'s arguments.

Every read is bounds-checked (:mod:`ptexec.format.flatbuf`); :func:`validate_payload`
checks every id, offset and size, so that a payload that passes can be prepared without
further checks. Failures are :class:`~ptexec.errors.PteFormatError` whose path starts with
the caller's prefix (``...delegates[0].payload``) and continues into the graph.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Collection, Mapping, Sequence, Sized
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ...errors import PteFormatError
from ...format.flatbuf import Buffer, Table
from ...format.lru import Lru
from . import forms

__all__ = [
    "DATATYPES",
    "INVALID_ID",
    "NODE_TYPES",
    "ConstantEntry",
    "PerChannelGroupQuant",
    "PerChannelQuant",
    "PerTensorQuant",
    "PerTokenDynamicQuant",
    "XnnGraph",
    "XnnHeader",
    "XnnNode",
    "XnnPayload",
    "XnnValue",
    "clear_decoded_graphs",
    "decode_payload",
    "describe_payload",
    "validate_payload",
]

INVALID_ID = 0xFFFFFFFF
UINT64_MAX = 0xFFFFFFFFFFFFFFFF
MAX_DIMS = 6  # XNN_MAX_TENSOR_DIMS
MAX_EXTERNS = 4096  # what ExecuTorch's runtime accepts

FLAG_EXTERNAL_INPUT = 0x1
FLAG_EXTERNAL_OUTPUT = 0x2

# node flags
FLAG_TRANSPOSE_WEIGHTS = 0x1  # fully connected: filter is [in, out]; bmm: transpose B
FLAG_ALIGN_CORNERS = 0x8
FLAG_TENSORFLOW_LEGACY_MODE = 0x4
FLAG_KEEP_DIMS = 0x40

HEADER_MAGIC = b"XH00"
HEADER_MIN_LENGTH = 30
IDENTIFIERS = (b"XN00", b"XN01")

# XNNDatatype -> (name, bytes per element; 0.5 for packed 4-bit)
DATATYPES: dict[int, tuple[str, float]] = {
    1: ("fp32", 4),
    2: ("fp16", 2),
    3: ("qint8", 1),
    4: ("quint8", 1),
    5: ("qint32", 4),
    6: ("qcint8", 1),
    7: ("qcint32", 4),
    8: ("qcint4", 0.5),
    9: ("qdint8", 1),
    10: ("qbint4", 0.5),
    11: ("qpint8", 1),
    12: ("int32", 4),
    13: ("pfp32", 4),
    14: ("bf16", 2),
}

# -- node tables ------------------------------------------------------------------------
# Field kinds: "in" value id read by the node, "opt" optional value id (INVALID_ID = none),
# "out" value id written by the node, "u32"/"i32"/"f32" scalars, "u32[]" vectors.
_F = tuple[tuple[str, str], ...]
_N2X1: _F = (("input1_id", "in"), ("input2_id", "in"), ("output_id", "out"), ("flags", "u32"))
_N1X1: _F = (("input_id", "in"), ("output_id", "out"), ("flags", "u32"))
_PAD4: _F = (
    ("padding_top", "u32"),
    ("padding_right", "u32"),
    ("padding_bottom", "u32"),
    ("padding_left", "u32"),
)
_CONV: _F = (
    *_PAD4,
    ("kernel_height", "u32"),
    ("kernel_width", "u32"),
    ("subsampling_height", "u32"),
    ("subsampling_width", "u32"),
    ("dilation_height", "u32"),
    ("dilation_width", "u32"),
    ("group_input_channels", "u32"),
    ("group_output_channels", "u32"),
    ("groups", "u32"),
    ("adjustment_height", "u32"),
    ("adjustment_width", "u32"),
    ("input1_id", "in"),
    ("filter_id", "in"),
    ("bias_id", "opt"),
    ("output_id", "out"),
    ("flags", "u32"),
)
_POOL: _F = (
    *_PAD4,
    ("pooling_height", "u32"),
    ("pooling_width", "u32"),
    ("stride_height", "u32"),
    ("stride_width", "u32"),
    ("dilation_height", "u32"),
    ("dilation_width", "u32"),
    ("input_id", "in"),
    ("output_id", "out"),
    ("flags", "u32"),
)


def _cat(n: int) -> _F:
    ids = [("input1_id", "in"), ("input2_id", "in")]
    ids += [(f"input{k}_id", "in" if k <= n else "skip") for k in (3, 4)]
    return (
        ("axis", "u32"),
        *tuple(ids),
        ("output_id", "out"),
        ("flags", "u32"),
        ("input5_id", "in" if n == 5 else "skip"),
    )


# XNodeUnion type code -> (name, fields), in schema order
NODE_TABLES: dict[int, tuple[str, _F]] = {
    1: ("Add", _N2X1),
    2: (
        "FullyConnected",
        (
            ("input1_id", "in"),
            ("filter_id", "in"),
            ("bias_id", "opt"),
            ("output_id", "out"),
            ("flags", "u32"),
        ),
    ),
    3: ("Softmax", _N1X1),
    4: ("Sigmoid", _N1X1),
    5: (
        "StaticTranspose",
        (
            ("num_dims", "u32"),
            ("perm", "u32[]"),
            ("input_id", "in"),
            ("output_id", "out"),
            ("flags", "u32"),
        ),
    ),
    6: ("Clamp", _N1X1),
    7: ("Conv2d", _CONV),
    8: ("Div", _N2X1),
    9: (
        "StaticResizeBilinear2D",
        (
            ("new_height", "u32"),
            ("new_width", "u32"),
            ("input_id", "in"),
            ("output_id", "out"),
            ("flags", "u32"),
        ),
    ),
    10: (
        "StaticConstantPad",
        (
            ("pre_paddings", "u32[]"),
            ("post_paddings", "u32[]"),
            ("padding_value", "f32"),
            ("input_id", "in"),
            ("output_id", "out"),
            ("flags", "u32"),
        ),
    ),
    11: ("AvgPooling2d", _POOL),
    12: ("Minimum", _N2X1),
    13: ("DepthwiseConv2d", _CONV),
    14: ("MaxPooling2d", _POOL),
    15: ("Multiply", _N2X1),
    16: ("Subtract", _N2X1),
    17: ("Floor", _N1X1),
    18: ("Convert", _N1X1),
    19: ("GlobalAvgPooling2d", _N1X1),
    20: (
        "StaticReshape",
        (
            ("num_dims", "u32"),
            ("new_shape", "u32[]"),
            ("input_id", "in"),
            ("output_id", "out"),
            ("flags", "u32"),
        ),
    ),
    21: (
        "ArgMaxPooling2d",
        (
            *_PAD4,
            ("pooling_height", "u32"),
            ("pooling_width", "u32"),
            ("input_id", "in"),
            ("output_value_id", "out"),
            ("output_index_id", "out"),
            ("flags", "u32"),
        ),
    ),
    22: ("SquareRoot", _N1X1),
    23: ("Ceiling", _N1X1),
    24: ("Hardswish", _N1X1),
    25: ("LeakyReLU", (("negative_slope", "f32"), *_N1X1)),
    26: ("Maximum", _N2X1),
    27: ("Negate", _N1X1),
    28: ("Square", _N1X1),
    29: ("ELU", (("alpha", "f32"), *_N1X1)),
    30: ("Abs", _N1X1),
    31: ("PReLU", _N2X1),
    32: ("Concatenate2", _cat(2)),
    33: ("Concatenate3", _cat(3)),
    34: ("Concatenate4", _cat(4)),
    35: (
        "StaticSlice",
        (
            ("num_dims", "u32"),
            ("offsets", "u32[]"),
            ("sizes", "u32[]"),
            ("input_id", "in"),
            ("output_id", "out"),
            ("flags", "u32"),
        ),
    ),
    36: (
        "ScaledDotProductAttention",
        (
            ("query_id", "in"),
            ("key_id", "in"),
            ("value_id", "in"),
            ("scale_id", "in"),
            ("mask_id", "in"),
            ("output_id", "out"),
            ("flags", "u32"),
        ),
    ),
    37: ("BatchMatrixMultiply", _N2X1),
    38: ("Concatenate5", _cat(5)),
    39: ("ConvTranspose2d", _CONV),
    40: ("ReciprocalSquareRoot", _N1X1),
    41: ("Log", _N1X1),
    42: ("Gelu", _N1X1),
    43: ("Tanh", _N1X1),
    44: ("Exp", _N1X1),
    45: ("Sin", _N1X1),
    46: ("Copy", _N1X1),
    47: ("Cos", _N1X1),
}
NODE_TYPES: dict[int, str] = {code: name for code, (name, _) in NODE_TABLES.items()}

_QUANT_KINDS = {
    1: "PerChannelQuant",
    2: "PerTensorQuant",
    3: "PerTokenDynamicQuant",
    4: "PerChannelGroupQuant",
}

_F32 = struct.Struct("<f")


# -- dataclasses ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class XnnHeader:
    """The optional payload header: where the flatbuffer and the constant data lie."""

    length: int
    flatbuffer_offset: int
    flatbuffer_size: int
    constant_data_offset: int
    constant_data_size: int


@dataclass(frozen=True, slots=True)
class PerTensorQuant:
    scale: float
    zero_point: int


@dataclass(frozen=True, slots=True)
class PerChannelQuant:
    """Per-channel scales (zero point 0, or 8 for 4-bit values): inline, or constant data
    entry ``scale_buffer_idx`` holding ``num_scales`` float32 values."""

    scales: tuple[float, ...]
    channel_dim: int
    scale_buffer_idx: int
    num_scales: int


@dataclass(frozen=True, slots=True)
class PerTokenDynamicQuant:
    """Quantized at run time, one scale and zero point per row of the trailing dims."""

    num_nonbatch_dims: int


@dataclass(frozen=True, slots=True)
class PerChannelGroupQuant:
    """Block-wise scales over ``[channels, in / group_size]``: inline float32 values, or
    constant data entry ``scale_buffer_idx`` holding ``num_scales`` bfloat16 values."""

    scales: tuple[float, ...]
    channel_dim: int
    group_size: int
    scale_buffer_idx: int
    num_scales: int


Quant = PerTensorQuant | PerChannelQuant | PerTokenDynamicQuant | PerChannelGroupQuant


@dataclass(frozen=True, slots=True)
class XnnValue:
    """One tensor value of the graph (``index``: its place in ``xvalues``)."""

    index: int
    id: int
    datatype: int
    dims: tuple[int, ...]
    constant_buffer_idx: int
    external_id: int
    flags: int
    quant: Quant | None = None
    dq_datatype: int = 0  # older payloads: quantize this external input dynamically

    @property
    def dtype_name(self) -> str:
        return DATATYPES.get(self.datatype, (f"datatype {self.datatype}", 0))[0]

    @property
    def is_input(self) -> bool:
        return bool(self.flags & FLAG_EXTERNAL_INPUT)

    @property
    def is_output(self) -> bool:
        return bool(self.flags & FLAG_EXTERNAL_OUTPUT)

    @property
    def is_constant(self) -> bool:
        return self.constant_buffer_idx != 0

    @property
    def numel(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n


@dataclass(frozen=True, slots=True)
class XnnNode:
    """One node: its type, its fields (``attrs``, by schema name), the ids it reads and writes."""

    index: int
    type: str
    code: int
    attrs: Mapping[str, Any] = field(hash=False)
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    debug_handle: int = 0
    output_min: float = -math.inf
    output_max: float = math.inf

    def __getitem__(self, name: str) -> Any:
        return self.attrs[name]

    @property
    def flags(self) -> int:
        return int(self.attrs.get("flags", 0))

    @property
    def has_clamp(self) -> bool:
        return self.output_min != -math.inf or self.output_max != math.inf


@dataclass(frozen=True, slots=True)
class ConstantEntry:
    """Where constant ``index`` lives: ``offset``/``size`` in the constant region, or a
    ``named_key`` into the program's named data."""

    offset: int
    size: int
    named_key: str | None


@dataclass(frozen=True, slots=True)
class XnnGraph:
    version: str
    identifier: str
    nodes: tuple[XnnNode, ...]
    values: tuple[XnnValue, ...]
    num_externs: int
    input_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    constant_data: tuple[ConstantEntry, ...]
    constant_buffers: tuple[
        tuple[int, int], ...
    ]  # legacy inline buffers: (start, size) in the flatbuffer
    unknown_nodes: tuple[tuple[int, int], ...] = ()  # (node index, type code) outside the schema
    by_id: Mapping[int, XnnValue] = field(
        default_factory=dict, hash=False, compare=False, repr=False
    )

    def value(self, vid: int) -> XnnValue:
        return self.by_id[vid]


@dataclass(frozen=True)
class XnnPayload:
    """A decoded payload and its bytes (``data``, zero-copy)."""

    data: memoryview
    header: XnnHeader | None
    graph: XnnGraph
    flatbuffer_offset: int
    path: str
    # SHA-256 of the graph's flatbuffer (None: too large to hash at load); what the graph,
    # its constant buffers included, is
    digest: bytes | None = None
    # the digest of the flatbuffer's form (:mod:`.forms`): what the graph is but for its
    # debug handles and named keys (None: not known)
    form: bytes | None = None

    def constant_region(self) -> memoryview:
        h = self.header
        if h is None:
            return self.data[0:0]
        return self.data[h.constant_data_offset : h.constant_data_offset + h.constant_data_size]

    def constant_bytes(self, idx: int, named_data: Mapping[str, memoryview]) -> memoryview:
        """The bytes of constant entry ``idx`` (validated by :func:`validate_payload`)."""
        g = self.graph
        if g.constant_data:
            e = g.constant_data[idx]
            if e.named_key is not None:
                return named_data[e.named_key][: e.size]
            return self.constant_region()[e.offset : e.offset + e.size]
        start, size = g.constant_buffers[idx]
        base = self.flatbuffer_offset + start
        return self.data[base : base + size]

    def constant_size(self, idx: int, named_data: Mapping[str, Sized] | None = None) -> int:
        g = self.graph
        if g.constant_data:
            e = g.constant_data[idx]
            if e.named_key is not None and named_data is not None and e.named_key in named_data:
                return min(e.size, len(named_data[e.named_key]))
            return e.size
        return g.constant_buffers[idx][1]

    def constant_where(self, idx: int) -> str:
        if self.graph.constant_data:
            return f"{self.path}.constant_data[{idx}]"
        return f"{self.path}.constant_buffer[{idx}]"


# -- decoding ---------------------------------------------------------------------------
def _read_float32(t: Table, slot: int, name: str, default: float = 0.0) -> float:
    at = t._field(slot)
    if not at:
        return default
    t.buf.check(at, 4, f"{t.path}.{name}")
    return float(_F32.unpack_from(t.buf.data, at)[0])


def _read_float32_vector(t: Table, slot: int, name: str) -> tuple[float, ...]:
    span = t.vector_span(slot, name, 4)
    if span is None:
        return ()
    start, n = span
    return struct.unpack_from(f"<{n}f", t.buf.data, start)


def _u32s(t: Table, slot: int, name: str) -> tuple[int, ...] | None:
    return t.scalars(slot, "u32", name)


def read_header(data: memoryview, path: str) -> XnnHeader | None:
    """The payload header, or None when the payload is a bare flatbuffer."""
    if len(data) < 8 or bytes(data[4:8]) != HEADER_MAGIC:
        return None
    if len(data) < HEADER_MIN_LENGTH:
        raise PteFormatError(f"{path}.header", f"{len(data)} bytes is too short for the header")
    length, fb_off, fb_size, cd_off, cd_size = struct.unpack_from("<HIIIQ", data, 8)
    where = f"{path}.header"
    if length < HEADER_MIN_LENGTH:
        raise PteFormatError(where, f"header length {length} < {HEADER_MIN_LENGTH}")
    size = len(data)
    if fb_size < 8:
        raise PteFormatError(where, f"flatbuffer size {fb_size} is too small")
    if fb_off < length or fb_off + fb_size > size:
        raise PteFormatError(
            where,
            f"flatbuffer bytes {fb_off}..{fb_off + fb_size} do not fit the payload ({size} bytes)",
        )
    if cd_off < fb_off + fb_size or cd_off + cd_size > size:
        raise PteFormatError(
            where,
            f"constant data bytes {cd_off}..{cd_off + cd_size} overlap the flatbuffer "
            f"(bytes {fb_off}..{fb_off + fb_size}) or exceed the payload ({size} bytes)",
        )
    return XnnHeader(length, fb_off, fb_size, cd_off, cd_size)


def _decode_quant(t: Table, path: str) -> Quant:
    code, q = t.union(1, "quant_params", _QUANT_KINDS)
    if q is None:
        raise PteFormatError(
            f"{path}.quant_params", f"missing quantization parameters (type {code})"
        )
    if code == 1:
        return PerChannelQuant(
            scales=_read_float32_vector(q, 0, "scale"),
            channel_dim=q.int_(1, "i32", "channel_dim"),
            scale_buffer_idx=q.int_(2, "u32", "scale_buffer_idx"),
            num_scales=q.int_(3, "u32", "num_scales"),
        )
    if code == 2:
        return PerTensorQuant(
            scale=_read_float32(q, 0, "scale"), zero_point=q.int_(1, "i32", "zero_point")
        )
    if code == 3:
        return PerTokenDynamicQuant(num_nonbatch_dims=q.int_(0, "i32", "num_nonbatch_dims"))
    if code == 4:
        return PerChannelGroupQuant(
            scales=_read_float32_vector(q, 0, "scale"),
            channel_dim=q.int_(1, "i32", "channel_dim"),
            group_size=q.int_(2, "i32", "group_size"),
            scale_buffer_idx=q.int_(4, "u32", "scale_buffer_idx"),
            num_scales=q.int_(5, "u32", "num_scales"),
        )
    raise PteFormatError(f"{path}.quant_params_type", f"unknown quantization kind {code}")


def _decode_tensor_value(t: Table, index: int, quant: Quant | None) -> XnnValue:
    dims = _u32s(t, 2, "dims") or ()
    num_dims = t.int_(1, "u32", "num_dims")
    if num_dims != len(dims):
        raise PteFormatError(f"{t.path}.num_dims", f"num_dims {num_dims} but {len(dims)} dims")
    return XnnValue(
        index=index,
        id=t.int_(6, "u32", "id_out"),
        datatype=t.int_(0, "u16", "datatype"),
        dims=tuple(dims),
        constant_buffer_idx=t.int_(3, "u32", "constant_buffer_idx"),
        external_id=t.int_(4, "u32", "external_id"),
        flags=t.int_(5, "u32", "flags"),
        quant=quant,
        dq_datatype=t.int_(7, "u16", "dq_datatype"),
    )


def _decode_value(t: Table, index: int) -> XnnValue:
    code, v = t.union(0, "xvalue_union", {1: "tensor_value", 2: "quantized_tensor_value"})
    if v is None:
        raise PteFormatError(f"{t.path}.xvalue_union", f"missing value (type {code})")
    if code == 1:
        return _decode_tensor_value(v, index, None)
    if code == 2:
        inner = v.table(0, "tensor_value")
        if inner is None:
            raise PteFormatError(f"{v.path}.tensor_value", "missing")
        return _decode_tensor_value(inner, index, _decode_quant(v, v.path))
    raise PteFormatError(f"{t.path}.xvalue_union_type", f"unknown value type {code}")


def _decode_node(t: Table, index: int, unknown: list[tuple[int, int]]) -> XnnNode | None:
    code, body = t.union(0, "xnode_union", NODE_TYPES)
    debug_handle = t.int_(2, "u32", "debug_handle")
    mm = t.table(3, "output_min_max")
    lo, hi = -math.inf, math.inf
    if mm is not None:
        lo = _read_float32(mm, 0, "output_min", 0.0)
        hi = _read_float32(mm, 1, "output_max", 0.0)
    spec = NODE_TABLES.get(code)
    if spec is None:
        unknown.append((index, code))
        return None
    name, fields = spec
    if body is None:
        raise PteFormatError(f"{t.path}.xnode_union", f"{name} node without its table")
    raw: list[Any] = []
    for slot, (fname, kind) in enumerate(fields):
        if kind == "f32":
            raw.append(_read_float32(body, slot, fname))
        elif kind == "u32[]":
            raw.append(_u32s(body, slot, fname) or ())
        else:
            raw.append(body.int_(slot, "i32" if kind == "i32" else "u32", fname))
    return _node(index, code, raw, debug_handle, lo, hi)


def _node(
    index: int, code: int, raw: Sequence[Any], debug_handle: int, lo: float, hi: float
) -> XnnNode:
    """Node ``index`` of type ``code`` from the values of its table's fields (``raw``, in
    the order of :data:`NODE_TABLES`): its attributes by name, the ids it reads (an
    optional input absent when :data:`INVALID_ID`) and writes."""
    name, fields = NODE_TABLES[code]
    attrs: dict[str, Any] = {}
    inputs: list[int] = []
    outputs: list[int] = []
    for (fname, kind), val in zip(fields, raw, strict=True):
        if kind == "skip":
            continue
        attrs[fname] = val
        if kind == "in":
            inputs.append(val)
        elif kind == "opt":
            if val == INVALID_ID:
                attrs[fname] = None
            else:
                inputs.append(val)
        elif kind == "out":
            outputs.append(val)
    return XnnNode(
        index=index,
        type=name,
        code=code,
        attrs=MappingProxyType(attrs),
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        debug_handle=debug_handle,
        output_min=lo,
        output_max=hi,
    )


def _value_later(t: Table) -> Table | XnnValue:
    return t  # decoded with its index (:func:`_decode_value`)


def _node_later(t: Table) -> Table | XnnNode:
    return t  # decoded with its index (:func:`_decode_node`)


def _decode_constant(t: Table) -> ConstantEntry:
    key = t.string(2, "named_key")
    return ConstantEntry(
        offset=t.int_(0, "u64", "offset"),
        size=t.int_(1, "u64", "size"),
        named_key=key if key else None,
    )


def _decode_buffer(t: Table) -> tuple[int, int]:
    span = t.bytes_span(0, "storage")
    return (0, 0) if span is None else span


# A program's payloads are often alike (one per layer) and a program is often loaded again:
# decoded graphs (plain frozen data, no view of the bytes) are kept by the SHA-256 of their
# flatbuffer, with the digest of their form (:mod:`.forms`); only graphs that decoded
# without error are kept. The cache holds more graphs than a large program has delegates
# (an LLM has ten per layer), bounded by their flatbuffers' bytes. A graph not kept whose
# flatbuffer has the form of a kept one is that graph with its own debug handles and named
# keys read from it (a layer's payload once the first layer's is decoded), the form
# tested first if it was not (:mod:`.forms`).
DECODED_GRAPHS = 4096
DECODED_GRAPHS_BYTES = 32 << 20
DECODED_GRAPH_BYTES = 16 << 20  # a larger graph is decoded each time (hashing costs)
_graphs: Lru[tuple[XnnGraph, bytes | None]] = Lru(DECODED_GRAPHS, DECODED_GRAPHS_BYTES)
_forms: forms.Forms[XnnGraph] = forms.Forms()


def clear_decoded_graphs() -> None:
    """Forget the decoded graphs and their forms (the next load of any payload decodes it
    again)."""
    _graphs.clear()
    _forms.clear()


def _with_variables(graph: XnnGraph, variables: forms.Variables) -> XnnGraph:
    """``graph`` with the debug handles and named keys ``variables`` gives (per ``xnodes``
    item and per constant entry; None keeps the graph's, a field the flatbuffer lacks)."""
    handles, keys = variables
    nodes = tuple(
        n
        if (h := handles[n.index]) is None or h == n.debug_handle
        else XnnNode(
            n.index, n.type, n.code, n.attrs, n.inputs, n.outputs, h, n.output_min, n.output_max
        )
        for n in graph.nodes
    )
    constants = tuple(
        e if k is None or k == e.named_key else ConstantEntry(e.offset, e.size, k)
        for e, k in zip(graph.constant_data, keys, strict=True)
    )
    g = graph  # (dataclasses.replace, without its per-call look at the fields)
    return XnnGraph(
        version=g.version,
        identifier=g.identifier,
        nodes=nodes,
        values=g.values,
        num_externs=g.num_externs,
        input_ids=g.input_ids,
        output_ids=g.output_ids,
        constant_data=constants,
        constant_buffers=g.constant_buffers,
        unknown_nodes=g.unknown_nodes,
        by_id=g.by_id,
    )


def _note_form(fb: memoryview, graph: XnnGraph) -> None:
    """Keep the form of ``graph``'s flatbuffer ``fb``, untested (:func:`_tested`)."""
    spans = forms.find_spans(fb)
    if spans is None or len(spans.keys) != len(graph.constant_data):
        return
    if any(n.index >= len(spans.handles) for n in graph.nodes):
        return
    _forms.keep(len(fb), forms.Form(forms.masked_digest(fb, spans), spans, graph))


def _tested(fb: memoryview, ident: bytes, form: forms.Form[XnnGraph], path: str) -> bool:
    """Whether ``fb`` (of ``form``), with its handles and keys changed at random, decodes
    to the form's graph with those changes and nothing else (:mod:`.forms`)."""
    changed = forms.altered(fb, form.spans)
    variables = forms.read(changed, form.spans)
    if variables is None:
        return False
    try:
        decoded = _decode_graph(memoryview(changed), ident, path)
    except PteFormatError:
        return False
    return decoded == _with_variables(form.value, variables)


def decode_payload(data: bytes | bytearray | memoryview, path: str = "payload") -> XnnPayload:
    """Decode a payload (header, graph, constant table); bounds-checked but not validated."""
    view = memoryview(data).cast("B") if not isinstance(data, memoryview) else data.cast("B")
    header = read_header(view, path)
    if header is not None:
        fb_off, fb = (
            header.flatbuffer_offset,
            view[header.flatbuffer_offset : header.flatbuffer_offset + header.flatbuffer_size],
        )
    else:
        fb_off, fb = 0, view
    if len(fb) < 8:
        raise PteFormatError(path, f"{len(fb)} bytes is too short for an XNNPACK graph")
    ident = bytes(fb[4:8])
    if ident not in IDENTIFIERS:
        raise PteFormatError(
            f"{path}.identifier",
            f"{ident!r} is not an XNNPACK graph identifier (expected XN00 or XN01)",
        )
    if len(fb) > DECODED_GRAPH_BYTES:
        return XnnPayload(view, header, _decode_graph(fb, ident, path), fb_off, path)
    digest = hashlib.sha256(fb).digest()
    known = _graphs.get(digest)
    if known is not None:
        return XnnPayload(view, header, known[0], fb_off, path, digest, known[1])
    graph: XnnGraph | None = None
    form: bytes | None = None
    alike = _forms.match(fb)
    if alike is not None:
        kept, variables = alike
        if kept.verified or _tested(fb, ident, kept, path):
            kept.verified = True
            graph, form = _with_variables(kept.value, variables), kept.digest
        else:
            _forms.drop(len(fb), kept)
    if graph is None:
        graph = _decode_graph(fb, ident, path)
        if alike is None:
            _note_form(fb, graph)
    _graphs.put(digest, (graph, form), len(fb))
    return XnnPayload(view, header, graph, fb_off, path, digest, form)


# Fast paths for the tables a graph is made of (tensor values, nodes): the same reads as
# the decoders above, through Buffer's field helpers, without a Table per table. Each
# returns None for anything it does not handle or cannot read (a quantized value, a node
# type ptexec does not know, a field outside the buffer), and the decoder above reads that
# item (and raises the error, with its path).


def _fast_value(buf: Buffer, pos: int, index: int) -> XnnValue | None:
    offsets = buf.field_offsets(pos)
    if offsets is None or buf.scalar_at(pos, offsets, 0, "u8") != 1:
        return None
    at = buf.table_at(pos, offsets, 1)
    inner = buf.field_offsets(at) if at > 0 else None
    if inner is None:
        return None
    dims = buf.scalars_at(at, inner, 2, "u32")
    num_dims = buf.scalar_at(at, inner, 1, "u32")
    ident = buf.scalar_at(at, inner, 6, "u32")
    datatype = buf.scalar_at(at, inner, 0, "u16")
    constant = buf.scalar_at(at, inner, 3, "u32")
    external = buf.scalar_at(at, inner, 4, "u32")
    flags = buf.scalar_at(at, inner, 5, "u32")
    dq_datatype = buf.scalar_at(at, inner, 7, "u16")
    if (
        dims is None
        or num_dims != len(dims)
        or ident is None
        or datatype is None
        or constant is None
        or external is None
        or flags is None
        or dq_datatype is None
    ):
        return None
    return XnnValue(index, ident, datatype, dims, constant, external, flags, None, dq_datatype)


def _fast_f32(buf: Buffer, pos: int, offsets: tuple[int, ...], slot: int) -> float | None:
    """Float field ``slot`` of table ``pos`` (0.0 when absent); None when it does not lie
    inside the buffer."""
    if slot >= len(offsets) or not offsets[slot]:
        return 0.0
    at = pos + offsets[slot]
    if at + 4 > buf.size:
        return None
    return float(_F32.unpack_from(buf.data, at)[0])


def _fast_node(buf: Buffer, pos: int, index: int) -> XnnNode | None:
    offsets = buf.field_offsets(pos)
    if offsets is None:
        return None
    code = buf.scalar_at(pos, offsets, 0, "u8")
    spec = NODE_TABLES.get(code) if code is not None else None
    body = buf.table_at(pos, offsets, 1)
    fields = buf.field_offsets(body) if body > 0 else None
    debug_handle = buf.scalar_at(pos, offsets, 2, "u32")
    if spec is None or fields is None or debug_handle is None:
        return None
    lo, hi = -math.inf, math.inf
    mm = buf.table_at(pos, offsets, 3)
    if mm:
        bounds = buf.field_offsets(mm) if mm > 0 else None
        if bounds is None:
            return None
        low, high = _fast_f32(buf, mm, bounds, 0), _fast_f32(buf, mm, bounds, 1)
        if low is None or high is None:
            return None
        lo, hi = low, high
    raw: list[Any] = []
    for slot, (_, kind) in enumerate(spec[1]):
        val: Any
        if kind == "f32":
            val = _fast_f32(buf, body, fields, slot)
        elif kind == "u32[]":
            val = buf.scalars_at(body, fields, slot, "u32")
        else:
            val = buf.scalar_at(body, fields, slot, "i32" if kind == "i32" else "u32")
        if val is None:
            return None
        raw.append(val)
    return _node(index, code, raw, debug_handle, lo, hi)


def _decode_graph(fb: memoryview, ident: bytes, path: str) -> XnnGraph:
    buf = Buffer(fb)
    root = buf.root(path)
    unknown: list[tuple[int, int]] = []
    values = root.tables(2, "xvalues", _value_later, limit=1 << 20, fast=_fast_value, indexed=True)
    decoded_values = tuple(
        v if isinstance(v, XnnValue) else _decode_value(v, i) for i, v in enumerate(values or ())
    )
    nodes_raw = root.tables(1, "xnodes", _node_later, limit=1 << 20, fast=_fast_node, indexed=True)
    nodes = []
    for i, t in enumerate(nodes_raw or ()):
        n = t if isinstance(t, XnnNode) else _decode_node(t, i, unknown)
        if n is not None:
            nodes.append(n)
    return XnnGraph(
        version=root.string(0, "version") or "",
        identifier=ident.decode("ascii"),
        nodes=tuple(nodes),
        values=decoded_values,
        num_externs=root.int_(3, "u32", "num_externs"),
        input_ids=tuple(_u32s(root, 4, "input_ids") or ()),
        output_ids=tuple(_u32s(root, 5, "output_ids") or ()),
        constant_data=root.tables(8, "constant_data", _decode_constant, limit=1 << 20) or (),
        constant_buffers=root.tables(6, "constant_buffer", _decode_buffer, limit=1 << 20) or (),
        unknown_nodes=tuple(unknown),
        by_id=MappingProxyType({v.id: v for v in decoded_values}),
    )


# -- validation -------------------------------------------------------------------------
def _nbytes(v: XnnValue) -> int:
    """Bytes a constant of value ``v`` needs (4-bit values pack two per byte along the
    last dimension, padded to whole bytes)."""
    per = DATATYPES[v.datatype][1]
    if per == 0.5:
        if not v.dims:
            return 1
        rows = 1
        for d in v.dims[:-1]:
            rows *= d
        return rows * ((v.dims[-1] + 1) // 2)
    return v.numel * int(per)


def validate_payload(
    payload: XnnPayload, named_keys: Collection[str] | Mapping[str, Sized] | None = None
) -> None:
    """Check every id, offset and size of a decoded payload; raise PteFormatError on the first
    defect. ``named_keys``: the program's named data keys (None skips that check), or the
    named data itself (key -> bytes), whose sizes constants are then checked against too."""
    g = payload.graph
    path = payload.path
    named = named_keys if isinstance(named_keys, Mapping) else None
    if g.num_externs > MAX_EXTERNS:
        raise PteFormatError(f"{path}.num_externs", f"{g.num_externs} exceeds {MAX_EXTERNS}")
    nconst = len(g.constant_data) if g.constant_data else len(g.constant_buffers)
    region = payload.header.constant_data_size if payload.header is not None else 0
    for i, e in enumerate(g.constant_data):
        where = f"{path}.constant_data[{i}]"
        if e.named_key is not None:
            if named_keys is not None and e.named_key not in named_keys:
                raise PteFormatError(where, f"named data key '{e.named_key}' is not in the program")
        elif i > 0 and (e.offset > region or e.size > region - e.offset):
            raise PteFormatError(
                where,
                f"bytes {e.offset}..{e.offset + e.size} exceed the constant data ({region} bytes)",
            )
    seen: dict[int, int] = {}
    ext_in: dict[int, int] = {}
    ext_out: dict[int, int] = {}
    for v in g.values:
        where = f"{path}.xvalues[{v.index}]"
        if v.id == INVALID_ID:
            raise PteFormatError(f"{where}.id_out", "invalid value id")
        if v.id in seen:
            raise PteFormatError(f"{where}.id_out", f"id {v.id} is also xvalues[{seen[v.id]}]")
        seen[v.id] = v.index
        if v.datatype not in DATATYPES:
            raise PteFormatError(f"{where}.datatype", f"unknown datatype {v.datatype}")
        if v.dq_datatype not in (0,) and v.dq_datatype not in DATATYPES:
            raise PteFormatError(f"{where}.dq_datatype", f"unknown datatype {v.dq_datatype}")
        if len(v.dims) > MAX_DIMS:
            raise PteFormatError(f"{where}.dims", f"{len(v.dims)} dims exceed {MAX_DIMS}")
        if v.flags & ~(FLAG_EXTERNAL_INPUT | FLAG_EXTERNAL_OUTPUT):
            raise PteFormatError(f"{where}.flags", f"unsupported flag bits {v.flags:#x}")
        if not v.flags and v.external_id != INVALID_ID:
            # XNNPACK's compiler makes any value with an external id external
            raise PteFormatError(
                f"{where}.external_id",
                f"external id {v.external_id} on a value that is neither an input nor an output",
            )
        if v.flags:
            if v.external_id >= g.num_externs:
                raise PteFormatError(
                    f"{where}.external_id", f"{v.external_id} >= num_externs {g.num_externs}"
                )
            if v.is_constant:
                raise PteFormatError(where, "an external value cannot hold constant data")
            for flag, table in ((FLAG_EXTERNAL_INPUT, ext_in), (FLAG_EXTERNAL_OUTPUT, ext_out)):
                if v.flags & flag:
                    if v.external_id in table:
                        raise PteFormatError(
                            f"{where}.external_id",
                            f"external id {v.external_id} is also xvalues[{table[v.external_id]}]",
                        )
                    table[v.external_id] = v.index
        if v.is_constant:
            _check_constant(
                payload,
                v.constant_buffer_idx,
                _nbytes(v),
                nconst,
                f"{where}.constant_buffer_idx",
                named,
            )
        _check_quant(payload, v, nconst, where, named)
    both = set(ext_in) & set(ext_out)
    if both:
        k = min(both)
        raise PteFormatError(
            f"{path}.xvalues[{ext_out[k]}].external_id",
            f"external id {k} is both an input and an output",
        )
    for name, ids, flagged in (
        ("input_ids", g.input_ids, {g.values[i].id for i in ext_in.values()}),
        ("output_ids", g.output_ids, {g.values[i].id for i in ext_out.values()}),
    ):
        for k, vid in enumerate(ids):
            if vid not in seen:
                raise PteFormatError(f"{path}.{name}[{k}]", f"no value with id {vid}")
        # XNNPACK's compiler takes the graph's inputs and outputs from these lists, ptexec
        # from the values' flags: both must say the same
        if len(set(ids)) != len(ids) or set(ids) != flagged:
            raise PteFormatError(
                f"{path}.{name}",
                f"{sorted(ids)} are not the ids of the values flagged external "
                f"{name.removesuffix('_ids')}s ({sorted(flagged)})",
            )
    _check_nodes(payload, seen)


def _check_constant(
    payload: XnnPayload,
    idx: int,
    need: int,
    nconst: int,
    where: str,
    named: Mapping[str, Sized] | None = None,
) -> None:
    if idx >= nconst:
        raise PteFormatError(where, f"constant {idx} out of range ({nconst} constants)")
    have = payload.constant_size(idx, named)
    if have < need:
        raise PteFormatError(
            where,
            f"constant {idx} holds {have} bytes, the value needs {need} ({payload.constant_where(idx)})",
        )


def _check_quant(
    payload: XnnPayload,
    v: XnnValue,
    nconst: int,
    where: str,
    named: Mapping[str, Sized] | None = None,
) -> None:
    q = v.quant
    if q is None:
        return
    name = v.dtype_name
    qwhere = f"{where}.quant_params"
    if isinstance(q, PerTensorQuant):
        if not (math.isfinite(q.scale) and q.scale > 0):
            raise PteFormatError(f"{qwhere}.scale", f"scale {q.scale} is not a positive number")
        if name not in ("qint8", "quint8", "qint32"):
            raise PteFormatError(f"{where}.datatype", f"{name} with per-tensor parameters")
        return
    if isinstance(q, PerTokenDynamicQuant):
        if name != "qdint8":
            raise PteFormatError(f"{where}.datatype", f"{name} with dynamic parameters")
        if not 0 < q.num_nonbatch_dims <= max(len(v.dims), 1):
            raise PteFormatError(
                f"{qwhere}.num_nonbatch_dims", f"{q.num_nonbatch_dims} for a {len(v.dims)}-d value"
            )
        if v.is_constant:
            raise PteFormatError(where, "a dynamically quantized value cannot be a constant")
        return
    if not 0 <= q.channel_dim < len(v.dims):
        raise PteFormatError(
            f"{qwhere}.channel_dim", f"{q.channel_dim} for a {len(v.dims)}-d value"
        )
    if isinstance(q, PerChannelQuant):
        if name not in ("qcint8", "qcint32", "qcint4"):
            raise PteFormatError(f"{where}.datatype", f"{name} with per-channel parameters")
        want = v.dims[q.channel_dim]
        count = _scale_count(
            payload, q.scales, q.scale_buffer_idx, q.num_scales, 4, nconst, qwhere, named
        )
    else:
        if name != "qbint4":
            raise PteFormatError(f"{where}.datatype", f"{name} with block-wise parameters")
        if len(v.dims) != 2 or q.channel_dim != 0:
            raise PteFormatError(
                qwhere, f"block-wise scales need a 2-d value blocked along dim 1, got {v.dims}"
            )
        oc, ic = v.dims
        if q.group_size <= 0 or ic % q.group_size:
            raise PteFormatError(
                f"{qwhere}.group_size", f"{q.group_size} does not divide {ic} input channels"
            )
        want = oc * (ic // q.group_size)
        count = _scale_count(
            payload, q.scales, q.scale_buffer_idx, q.num_scales, 2, nconst, qwhere, named
        )
    if count != want:
        raise PteFormatError(qwhere, f"{count} scales, the value needs {want}")


def _scale_count(
    payload: XnnPayload,
    inline: tuple[float, ...],
    buffer_idx: int,
    num: int,
    itemsize: int,
    nconst: int,
    where: str,
    named: Mapping[str, Sized] | None = None,
) -> int:
    if buffer_idx:
        _check_constant(
            payload, buffer_idx, num * itemsize, nconst, f"{where}.scale_buffer_idx", named
        )
        return num
    return len(inline)


def _check_nodes(payload: XnnPayload, ids: Mapping[int, int]) -> None:
    """Every id a node names exists; every value is written once, after it is read nowhere
    earlier; nothing writes a constant or an external input."""
    g = payload.graph
    path = payload.path
    by_id = g.by_id
    ready = {v.id for v in g.values if v.is_input or v.is_constant}
    written: dict[int, int] = {}
    for n in g.nodes:
        where = f"{path}.xnodes[{n.index}]"
        for fname, val in n.attrs.items():
            if fname.endswith("_id") and val is not None and val not in ids:
                raise PteFormatError(f"{where}.{n.type}.{fname}", f"no value with id {val}")
        for vid in n.inputs:
            if vid not in ready:
                raise PteFormatError(
                    f"{where}.{n.type}", f"reads value {vid} before any node writes it"
                )
        for vid in n.outputs:
            v = by_id[vid]
            if v.is_input or v.is_constant:
                raise PteFormatError(
                    f"{where}.{n.type}", f"writes value {vid}, which is an input or a constant"
                )
            if vid in written:
                raise PteFormatError(
                    f"{where}.{n.type}",
                    f"writes value {vid}, already written by xnodes[{written[vid]}]",
                )
            written[vid] = n.index
            ready.add(vid)
        if not n.outputs:
            raise PteFormatError(f"{where}.{n.type}", "a node without an output")
        if math.isnan(n.output_min) or math.isnan(n.output_max) or n.output_min > n.output_max:
            raise PteFormatError(
                f"{where}.output_min_max",
                f"output clamp [{n.output_min}, {n.output_max}] is not an interval",
            )
    for v in g.values:
        if v.is_output and not v.is_input and v.id not in written:
            raise PteFormatError(
                f"{path}.xvalues[{v.index}]", f"output value {v.id} is never written"
            )


def describe_payload(data: bytes | bytearray | memoryview) -> dict[str, int]:
    """Node type -> count for an XNNPACK payload (unknown types as ``unknown(<code>)``)."""
    payload = decode_payload(data)
    counts: dict[str, int] = {}
    for n in payload.graph.nodes:
        counts[n.type] = counts.get(n.type, 0) + 1
    for _, code in payload.graph.unknown_nodes:
        key = f"unknown({code})"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))
