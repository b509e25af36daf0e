"""The Vulkan delegate payload: bytes -> frozen dataclasses, validated. Imports no torch.

A payload is a 30-byte header (``VH00`` at bytes 4..8; header length, flatbuffer offset and
size, constant bytes offset and size), a flatbuffer ``VkGraph`` (identifier ``VK00``) and a
constant bytes region. A payload without the header is a bare flatbuffer with no constant
region, as ExecuTorch's Vulkan runtime also accepts.

The graph is a list of values (``VkValue``: a tensor, a scalar, a list, a string, a
symbolic integer or null), a chain of operator calls (``OperatorCall``: an op name from
ExecuTorch's Vulkan op registry and the value ids of its arguments, the op's schema
arguments in order followed by its output), the ids of its inputs and outputs (the
positions of the ``DelegateCall``'s arguments: inputs first, then outputs), and a table of
constants, each an offset/length into the constant region or a key into the program's
named data.

Every read is bounds-checked (:mod:`ptexec.format.flatbuf`); :func:`validate_payload`
checks every id, kind, offset and size, the op names, and the order of definitions, so
that a payload that passes can be prepared without further structural checks. Failures are
:class:`~ptexec.errors.PteFormatError` whose path starts with the caller's prefix
(``...delegates[0].payload``) and continues into the graph; an op ptexec does not know is
:class:`~ptexec.errors.BackendUnavailableError` naming it.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sized
from dataclasses import dataclass

from ...errors import BackendUnavailableError, PteFormatError
from ...format.flatbuf import Buffer, Table
from .ops import OPS, UNSUPPORTED

__all__ = [
    "DATATYPES",
    "VALUE_KINDS",
    "VkBytes",
    "VkGraph",
    "VkHeader",
    "VkOp",
    "VkPayload",
    "VkTensor",
    "VkValue",
    "decode_payload",
    "describe_payload",
    "validate_payload",
]

HEADER_MAGIC = b"VH00"
HEADER_LENGTH = 30
IDENTIFIER = b"VK00"
NAMED_OFFSET = 0xFFFFFFFFFFFFFFFF  # a constant held in the program's named data
MAX_DIMS = 8
MAX_NUMEL = 1 << 40
MAX_ITEMS = 1 << 20

# VkDataType -> (name, bytes per element)
DATATYPES: dict[int, tuple[str, int]] = {
    0: ("bool", 1),
    1: ("uint8", 1),
    2: ("int8", 1),
    3: ("int32", 4),
    4: ("float16", 2),
    5: ("float32", 4),
    6: ("float64", 8),
    7: ("int64", 8),
}
UNSET_DATATYPE = 127

# GraphTypes union code -> value kind
VALUE_KINDS: dict[int, str] = {
    1: "null",
    2: "int",
    3: "double",
    4: "bool",
    5: "tensor",
    6: "int_list",
    7: "double_list",
    8: "bool_list",
    9: "value_list",
    10: "string",
    11: "symint",
}

STORAGE_TYPES = {0: "buffer", 1: "texture_3d", 2: "texture_2d", 255: "default"}
MEMORY_LAYOUTS = {
    0: "width_packed",
    1: "height_packed",
    2: "channels_packed",
    3: "int8_4w4c",
    4: "int8_4h4w",
    5: "int8_4w",
    6: "int8_4c",
    8: "int8_4c1w",
    9: "int8_conv2d",
    255: "default",
}


@dataclass(frozen=True, slots=True)
class VkHeader:
    """Where the flatbuffer and the constant bytes lie in the payload."""

    flatbuffer_offset: int
    flatbuffer_size: int
    bytes_offset: int
    bytes_size: int


@dataclass(frozen=True, slots=True)
class VkTensor:
    """A tensor value: datatype, dims (the exporter's sizes: exact for static shapes, the
    upper bounds for dynamic ones), constant (``constant_id >= 0``) or not, and the GPU
    representation the exporter chose (memory sharing, storage, packing)."""

    datatype: int
    dims: tuple[int, ...]
    constant_id: int
    mem_obj_id: int
    storage_type: int
    memory_layout: int
    staging_datatype: int

    @property
    def dtype_name(self) -> str:
        return DATATYPES[self.datatype][0] if self.datatype in DATATYPES else "?"

    @property
    def numel(self) -> int:
        return math.prod(self.dims)


@dataclass(frozen=True, slots=True)
class VkValue:
    """One value. ``kind`` is one of :data:`VALUE_KINDS`; ``scalar`` holds an int, double,
    bool or string value, ``items`` a list's items (value ids for a ``value_list``)."""

    index: int
    kind: str
    scalar: int | float | bool | str | None = None
    items: tuple[int | float | bool, ...] = ()
    tensor: VkTensor | None = None


@dataclass(frozen=True, slots=True)
class VkOp:
    """One operator call: the op's name and its argument value ids (outputs last)."""

    index: int
    node_id: int
    name: str
    args: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class VkBytes:
    """A constant's bytes: ``offset``/``length`` into the constant region, or the key of a
    named data entry (``offset`` is then :data:`NAMED_OFFSET`)."""

    offset: int
    length: int
    named_key: str | None


@dataclass(frozen=True, slots=True)
class VkGraph:
    version: str
    chain: tuple[VkOp, ...]
    values: tuple[VkValue, ...]
    input_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    constants: tuple[VkBytes, ...]
    shaders: tuple[VkBytes, ...]
    storage_type_override: int
    memory_layout_override: int


@dataclass(frozen=True, slots=True)
class VkPayload:
    """A decoded payload: the bytes (a view of the program), its header, its graph, and
    the path errors name it by."""

    data: memoryview
    header: VkHeader | None
    graph: VkGraph
    path: str

    def constant_region(self) -> memoryview:
        h = self.header
        if h is None:
            return self.data[0:0]
        return self.data[h.bytes_offset : h.bytes_offset + h.bytes_size]


# -- decoding ---------------------------------------------------------------------------
def read_header(data: memoryview, path: str) -> VkHeader | None:
    """The payload header, or None when the payload is a bare flatbuffer."""
    if len(data) < 8 or bytes(data[4:8]) != HEADER_MAGIC:
        return None
    where = f"{path}.header"
    if len(data) < HEADER_LENGTH:
        raise PteFormatError(where, f"{len(data)} bytes is too short for the header")
    length, fb_off, fb_size, b_off, b_size = struct.unpack_from("<HIIIQ", data, 8)
    if length != HEADER_LENGTH:
        raise PteFormatError(where, f"header length {length}, expected {HEADER_LENGTH}")
    size = len(data)
    if fb_size < 8:
        raise PteFormatError(where, f"flatbuffer size {fb_size} is too small")
    if fb_off < length or fb_off + fb_size > size:
        raise PteFormatError(
            where,
            f"flatbuffer bytes {fb_off}..{fb_off + fb_size} do not fit the payload ({size} bytes)",
        )
    if b_off < fb_off + fb_size or b_off + b_size > size:
        raise PteFormatError(
            where,
            f"constant bytes {b_off}..{b_off + b_size} overlap the flatbuffer "
            f"(bytes {fb_off}..{fb_off + fb_size}) or exceed the payload ({size} bytes)",
        )
    return VkHeader(fb_off, fb_size, b_off, b_size)


def _list(t: Table, kind: str, name: str) -> tuple[int | float | bool, ...]:
    got = t.scalars(0, kind, name)
    if got is not None and len(got) > MAX_ITEMS:
        raise PteFormatError(f"{t.path}.{name}", f"{len(got)} items exceed {MAX_ITEMS}")
    return tuple(got or ())


def _decode_tensor(t: Table) -> VkTensor:
    dims = t.scalars(1, "u32", "dims") or ()
    return VkTensor(
        datatype=t.int_(0, "i8", "datatype"),
        dims=tuple(dims),
        constant_id=t.int_(2, "i32", "constant_id"),
        mem_obj_id=t.int_(3, "i32", "mem_obj_id"),
        storage_type=t.int_(4, "u8", "storage_type", 255),
        memory_layout=t.int_(5, "u8", "memory_layout", 255),
        staging_datatype=t.int_(6, "i8", "staging_datatype", UNSET_DATATYPE),
    )


def _decode_value(t: Table, index: int) -> VkValue:
    code, v = t.union(0, "value", VALUE_KINDS)
    kind = VALUE_KINDS.get(code)
    if kind is None:
        raise PteFormatError(f"{t.path}.value_type", f"unknown value type {code}")
    if v is None:
        if kind == "null":
            return VkValue(index, kind)
        raise PteFormatError(f"{t.path}.value", f"missing {kind} table")
    if kind == "null":
        return VkValue(index, kind)
    if kind == "int":
        return VkValue(index, kind, v.int_(0, "i64", "int_val"))
    if kind == "double":
        return VkValue(index, kind, v.f64(0, "double_val"))
    if kind == "bool":
        return VkValue(index, kind, v.bool_(0, "bool_val"))
    if kind == "symint":
        return VkValue(index, kind, v.int_(0, "i32", "value"))
    if kind == "string":
        return VkValue(index, kind, v.string(0, "string_val") or "")
    if kind == "tensor":
        return VkValue(index, kind, tensor=_decode_tensor(v))
    letter = {"int_list": "i64", "double_list": "f64", "bool_list": "bool", "value_list": "i32"}
    return VkValue(index, kind, items=_list(v, letter[kind], "items"))


def _decode_op(t: Table, index: int) -> VkOp:
    args = t.scalars(2, "i32", "args") or ()
    if len(args) > MAX_ITEMS:
        raise PteFormatError(f"{t.path}.args", f"{len(args)} items exceed {MAX_ITEMS}")
    return VkOp(index, t.int_(0, "u32", "node_id"), t.string(1, "name") or "", tuple(args))


def _decode_bytes(t: Table) -> VkBytes:
    key = t.string(2, "named_key")
    return VkBytes(t.int_(0, "u64", "offset"), t.int_(1, "u64", "length"), key or None)


def decode_payload(data: bytes | bytearray | memoryview, path: str = "payload") -> VkPayload:
    """Decode a payload (header, graph); bounds-checked but not validated."""
    view = memoryview(data).cast("B")
    header = read_header(view, path)
    fb = (
        view
        if header is None
        else view[header.flatbuffer_offset : header.flatbuffer_offset + header.flatbuffer_size]
    )
    if len(fb) < 8:
        raise PteFormatError(path, f"{len(fb)} bytes is too short for a Vulkan graph")
    ident = bytes(fb[4:8])
    if ident != IDENTIFIER:
        raise PteFormatError(
            f"{path}.identifier", f"{ident!r} is not a Vulkan graph identifier (expected VK00)"
        )
    root = Buffer(fb).root(path)
    values = root.tables(2, "values", lambda t: t, limit=MAX_ITEMS) or ()
    chain = root.tables(1, "chain", lambda t: t, limit=MAX_ITEMS) or ()
    graph = VkGraph(
        version=root.string(0, "version") or "",
        chain=tuple(_decode_op(t, i) for i, t in enumerate(chain)),
        values=tuple(_decode_value(t, i) for i, t in enumerate(values)),
        input_ids=tuple(root.scalars(3, "u32", "input_ids") or ()),
        output_ids=tuple(root.scalars(4, "u32", "output_ids") or ()),
        constants=root.tables(5, "constants", _decode_bytes, limit=MAX_ITEMS) or (),
        shaders=root.tables(6, "shaders", _decode_bytes, limit=MAX_ITEMS) or (),
        storage_type_override=root.int_(7, "u8", "storage_type_override", 255),
        memory_layout_override=root.int_(8, "u8", "memory_layout_override", 255),
    )
    return VkPayload(view, header, graph, path)


# -- validation -------------------------------------------------------------------------
def _check_tensor(t: VkTensor, where: str, n_constants: int) -> None:
    if t.datatype not in DATATYPES:
        raise PteFormatError(f"{where}.datatype", f"unknown datatype {t.datatype}")
    if t.staging_datatype != UNSET_DATATYPE and t.staging_datatype not in DATATYPES:
        raise PteFormatError(f"{where}.staging_datatype", f"unknown datatype {t.staging_datatype}")
    if len(t.dims) > MAX_DIMS:
        raise PteFormatError(f"{where}.dims", f"{len(t.dims)} dims exceed {MAX_DIMS}")
    if t.numel > MAX_NUMEL:
        raise PteFormatError(f"{where}.dims", f"{list(t.dims)} hold more than 2**40 elements")
    if t.storage_type not in STORAGE_TYPES:
        raise PteFormatError(f"{where}.storage_type", f"unknown storage type {t.storage_type}")
    if t.memory_layout not in MEMORY_LAYOUTS:
        raise PteFormatError(f"{where}.memory_layout", f"unknown layout {t.memory_layout}")
    if t.constant_id >= n_constants:
        raise PteFormatError(
            f"{where}.constant_id", f"{t.constant_id} out of range ({n_constants} constants)"
        )


def _check_constant(
    payload: VkPayload, t: VkTensor, where: str, named_data: Mapping[str, Sized]
) -> None:
    entry = payload.graph.constants[t.constant_id]
    at = f"{payload.path}.constants[{t.constant_id}]"
    want = t.numel * DATATYPES[t.datatype][1]
    if entry.length != want:
        raise PteFormatError(
            at,
            f"{entry.length} bytes for {where}, a {t.dtype_name}{list(t.dims)} tensor "
            f"({want} bytes)",
        )
    if entry.offset == NAMED_OFFSET:
        if entry.named_key is None:
            raise PteFormatError(at, "named data constant without a key")
        blob = named_data.get(entry.named_key)
        if blob is None:
            raise PteFormatError(at, f"named data key {entry.named_key!r} not in the program")
        if len(blob) < want:
            raise PteFormatError(
                at, f"named data {entry.named_key!r} holds {len(blob)} bytes, {want} needed"
            )
        return
    region = len(payload.constant_region())
    if entry.offset + entry.length > region:
        raise PteFormatError(
            at,
            f"bytes {entry.offset}..{entry.offset + entry.length} exceed the constant region "
            f"({region} bytes)",
        )


def validate_payload(payload: VkPayload, named_data: Mapping[str, Sized]) -> None:
    """Check every id, kind, constant range and op name, and that every value an op reads
    is defined before it (an input, a constant, a non-tensor value, or an earlier op's
    output) and every value is written at most once, never an input or a constant."""
    g = payload.graph
    path = payload.path
    n = len(g.values)
    for v in g.values:
        where = f"{path}.values[{v.index}]"
        if v.kind == "tensor":
            assert v.tensor is not None
            _check_tensor(v.tensor, where, len(g.constants))
            if v.tensor.constant_id >= 0:
                _check_constant(payload, v.tensor, where, named_data)
        elif v.kind == "value_list":
            for j, item in enumerate(v.items):
                if not 0 <= int(item) < n:
                    raise PteFormatError(f"{where}.items[{j}]", f"value id {item} out of range")
                found = g.values[int(item)]
                if found.kind not in ("tensor", "int", "symint", "null"):
                    what = f"the {found.kind} {found.scalar!r}" if found.kind == "double" else None
                    raise PteFormatError(
                        f"{where}.items[{j}]",
                        f"value {item} is {what or f'a {found.kind} value'}, where a value "
                        "list holds tensors, ints, symints or nulls (ExecuTorch's Vulkan "
                        "runtime reads no other item; its exporter keeps one value per "
                        "number, 2 and 2.0 alike, so a size equal to an earlier double "
                        "argument names that double)",
                    )
    if g.shaders:
        raise BackendUnavailableError(f"Vulkan payload {path} carries custom shaders")
    defined = [False] * n
    for v in g.values:
        constant = v.tensor is not None and v.tensor.constant_id >= 0
        if constant or v.kind not in ("tensor", "symint", "value_list"):
            defined[v.index] = True
    for label, ids in (("input_ids", g.input_ids), ("output_ids", g.output_ids)):
        for j, vid in enumerate(ids):
            if vid >= n:
                raise PteFormatError(f"{path}.{label}[{j}]", f"value id {vid} out of range")
            kind = g.values[vid].kind
            ok = ("tensor", "symint") if label == "input_ids" else ("tensor",)
            if kind not in ok:
                raise PteFormatError(f"{path}.{label}[{j}]", f"value {vid} is a {kind}")
            t = g.values[vid].tensor
            if t is not None and t.constant_id >= 0:
                raise PteFormatError(f"{path}.{label}[{j}]", f"value {vid} is a constant")
    if len(set(g.input_ids)) != len(g.input_ids):
        raise PteFormatError(f"{path}.input_ids", "a value is named twice")
    inputs = set(g.input_ids)
    for vid in g.input_ids:
        defined[vid] = True
    written: set[int] = set()
    for op in g.chain:
        where = f"{path}.chain[{op.index}]"
        spec = OPS.get(op.name)
        if spec is None:
            raise BackendUnavailableError(
                f"Vulkan payload {path} uses op {op.name!r} (chain[{op.index}]), which ptexec "
                "does not know"
            )
        if not op.args:
            raise PteFormatError(f"{where}.args", f"{op.name} without an output")
        for j, vid in enumerate(op.args):
            if not 0 <= vid < n:
                raise PteFormatError(f"{where}.args[{j}]", f"value id {vid} out of range")
        *reads, out = op.args
        for j, vid in enumerate(reads):
            _check_defined(g, vid, defined, f"{where}.args[{j}]")
        outs = [out]
        if g.values[out].kind == "value_list":
            outs = [int(i) for i in g.values[out].items]
        for vid in outs:
            value = g.values[vid]
            if value.kind not in ("tensor", "symint"):
                if spec.kind == "none" and value.kind == "null":
                    continue
                raise PteFormatError(f"{where}.args[{len(op.args) - 1}]", f"writes a {value.kind}")
            if vid in inputs or (value.tensor is not None and value.tensor.constant_id >= 0):
                raise PteFormatError(
                    f"{where}.args[{len(op.args) - 1}]", f"writes input or constant value {vid}"
                )
            if vid in written:
                raise BackendUnavailableError(
                    f"Vulkan payload {path}: value {vid} is written twice (chain[{op.index}]); "
                    "aliased buffer mutation is not supported"
                )
            written.add(vid)
            defined[vid] = True
        defined[out] = True
    for j, vid in enumerate(g.output_ids):
        if not defined[vid]:
            raise PteFormatError(f"{path}.output_ids[{j}]", f"value {vid} is never written")


def _check_defined(g: VkGraph, vid: int, defined: list[bool], where: str) -> None:
    value = g.values[vid]
    if value.kind == "value_list":
        for item in value.items:
            if not defined[int(item)]:
                raise PteFormatError(where, f"list value {vid} holds {item}, read before written")
        return
    if not defined[vid]:
        raise PteFormatError(where, f"value {vid} is read before it is written")


def describe_payload(data: bytes | bytearray | memoryview) -> dict[str, int]:
    """Op name -> count for a Vulkan payload (ops ptexec does not know as ``unknown(name)``)."""
    payload = decode_payload(data)
    counts: dict[str, int] = {}
    for op in payload.graph.chain:
        key = op.name if op.name in OPS else f"unknown({op.name})"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def payload_gaps(data: bytes | bytearray | memoryview) -> list[str]:
    """The ops of a Vulkan payload that ptexec does not run, each once, with what it is
    where ExecuTorch's op registry says ([]: ptexec runs every op)."""
    payload = decode_payload(data)
    missing = sorted({op.name for op in payload.graph.chain if op.name not in OPS})
    return [f"{name} ({UNSUPPORTED[name]})" if name in UNSUPPORTED else name for name in missing]
