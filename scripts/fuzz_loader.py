#!/usr/bin/env python
"""Fuzz ptexec's loader: mutate real ``.pte``/``.ptd`` fixtures, load, load a method, call it.

Every case takes one fixture (tests/fixtures, and tests/fixtures/xnnpack as seeds named
``xnnpack-NAME``), applies one to four mutations and runs ``ptexec.load`` +
``Program.load_method`` (``max_planned_bytes`` = the cap, 64 MiB) + one call of every method
(the fixture's inputs, or inputs made from the method's own description when those do not
fit); a call that raises :class:`ptexec.ExecutionError` is made again, since a failed call
must leave the method usable. Half the XNNPACK fixtures' cases load with
``xnnpack="torch"`` (ptexec's runner), half with the default (ExecuTorch's XNNPACK backend
where it is installed); fixtures that name a device this machine lacks load with
``device_map="cpu"``. Only :class:`ptexec.PtexecError` subclasses may escape. A case fails
("finding") when:

- ``escape``: another exception escapes (a gap in ptexec's checks);
- ``output``: a call returns an output that contradicts its method's declaration (another
  dtype or rank, other sizes than static ones, sizes beyond a dynamic bound);
- ``alloc``: loading allocated more than allowed: an allocator error while loading, or a
  peak resident growth above ``2 * cap + slack`` (planned memory and unplanned tensors are
  each held to the cap; see *Measuring memory*);
- ``hang``: the case ran longer than ``--timeout`` seconds (2 s by default);
- ``crash``: the worker process died (a signal, e.g. a segfault in a kernel).

``kernel_alloc`` cases are reported but are not findings: a ptexec error came from a kernel
that asked the allocator for more than the cap because the program's arguments (a padding of
2^32, say) ask for a huge result. ptexec cannot see inside a kernel; planned memory cannot
grow (its storage is fixed), but a kernel's own temporaries can.

Mutations (all concrete, so a finding replays and minimizes exactly):

- *bytes*: bit flips, interesting bytes, random overwrites, truncation, insertion and
  deletion of chunks (which shifts every offset behind them), copies of one chunk over another;
- *fields*: the seed is decoded with ``ptexec.format.flatbuf`` and every integer the schema
  names is located: root and child offsets, vtable entries, vector and string lengths, union
  tags, scalars (indices, sizes, counts, offsets, enums) and the ``eh00``/``FH01`` header
  fields. A field mutation rewrites one of them with a value valid for another field of the
  same kind (another value index, say), or a value chosen for its width: 0, 1, -1,
  boundaries (2^7, 2^15, 2^31, 2^32 +- 1 ...), the old value +- small deltas, doubled, a
  power of two, or the value of another field of the same width. Fields a file leaves at
  their default are absent from it and cannot be rewritten in place.
- *delegate payloads*: every XNNPACK payload's ``XH00`` header and ``XNNGraph`` flatbuffer
  (its node tables from ptexec's own decoder) is walked the same way, its kinds prefixed
  ``x``: node parameters, value dims, datatypes, external ids, flags, quantization
  parameters, the constant table; float fields (clamps, scales, slopes) get NaN, infinities,
  -0, extreme and subnormal values.
- *device annotations*: ``device_type``/``device_index`` of tensors and planned buffers get
  device codes (CPU, CUDA, codes ptexec does not model, -1).
- *constant data*: sampled elements of the program's constants, of each payload's constants
  and of the named data they use, and of a ``.ptd``'s tensors, rewritten by element type:
  NaN, infinities, -0, the largest and smallest values, an integer type's extremes.

Measuring memory: torch's CPU allocations are invisible to ``tracemalloc``, so the harness
measures the process itself. Before each case it resets the kernel's peak-RSS counter
(``/proc/self/clear_refs`` <- ``5``) and after it reads ``VmHWM`` from ``/proc/self/status``:
the difference is the case's peak resident growth, which counts every page torch or Python
touched. Untouched allocations (``torch.empty``) do not show up in RSS, so during each case
the address space is also capped (``RLIMIT_AS`` = size on entry + 2 x the peak limit): a
larger allocation fails, and the allocator error in the exception chain tells which
allocation it was. Both measures are Linux-only; elsewhere they are skipped.

Usage::

    python scripts/fuzz_loader.py --cases 100000 --workers 2 --out fuzz-findings
    python scripts/fuzz_loader.py --replay tests/fuzz_corpus/NAME.pte
    python scripts/fuzz_loader.py --case 1234 --seed 0 --show   # reproduce one case
    python scripts/fuzz_loader.py --focus payload --fixtures xnnpack-mlp ...  # payloads only

``--focus payload`` makes every edit a field edit inside a delegate payload (its graph,
header and constant data), so that more cases pass the program's own checks and reach the
backend; ``--focus ptd`` edits only ``.ptd`` files (fixtures without one are not drawn).
``--case`` takes the same ``--focus`` as the run that drew the case.

Case ``i`` of seed ``s`` is fully determined by ``(s, i)``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import random
import re
import struct
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

from ptexec.format.flatbuf import Buffer, Table  # noqa: E402  (no torch import)

DEFAULT_CAP = 64 << 20  # max_planned_bytes for fuzzed methods
DEFAULT_SLACK = 96 << 20  # resident growth allowed above the cap (kernels' temporaries)
# a fuzzed jump loop stops quickly; the fixtures execute at most ~100 instructions a call
DEFAULT_MAX_INSTRUCTIONS = 300
DEFAULT_TIMEOUT = 2.0
MAX_INPUT_ELEMENTS = 1 << 20  # largest synthesized input tensor (elements)

# --------------------------------------------------------------------------------------
# schema: table name -> (slot, field name, kind); kinds:
#   scalar kinds of flatbuf.SCALARS, "str", ("table", T), ("vec", scalar kind),
#   ("tables", T), ("union", {code: T}) (occupies the slot and the next one)

_KERNEL_TYPES = {
    1: "Null",
    2: "Int",
    3: "Bool",
    4: "Double",
    5: "Tensor",
    6: "String",
    7: "IntList",
    8: "DoubleList",
    9: "BoolList",
    10: "TensorList",
    11: "OptionalTensorList",
}
_INSTRUCTIONS = {
    1: "KernelCall",
    2: "DelegateCall",
    3: "MoveCall",
    4: "JumpFalseCall",
    5: "FreeCall",
}

SCHEMA: dict[str, list[tuple[int, str, Any]]] = {
    "Program": [
        (0, "version", "u32"),
        (1, "execution_plan", ("tables", "ExecutionPlan")),
        (2, "constant_buffer", ("tables", "Buffer")),
        (3, "backend_delegate_data", ("tables", "Buffer")),
        (4, "segments", ("tables", "DataSegment")),
        (5, "constant_segment", ("table", "SubsegmentOffsets")),
        (6, "mutable_data_segments", ("tables", "SubsegmentOffsets")),
        (7, "named_data", ("tables", "NamedData")),
    ],
    "ExecutionPlan": [
        (0, "name", "str"),
        (1, "container_meta_type", ("table", "ContainerMetadata")),
        (2, "values", ("tables", "EValue")),
        (3, "inputs", ("vec", "i32")),
        (4, "outputs", ("vec", "i32")),
        (5, "chains", ("tables", "Chain")),
        (6, "operators", ("tables", "Operator")),
        (7, "delegates", ("tables", "BackendDelegate")),
        (8, "non_const_buffer_sizes", ("vec", "i64")),
        (9, "non_const_buffer_device", ("tables", "NonConstBufferDevice")),
    ],
    "ContainerMetadata": [(0, "encoded_inp_str", "str"), (1, "encoded_out_str", "str")],
    "EValue": [(0, "val", ("union", _KERNEL_TYPES))],
    "Null": [],
    "Int": [(0, "int_val", "i64")],
    "Bool": [(0, "bool_val", "bool")],
    "Double": [(0, "double_val", "f64")],
    "String": [(0, "string_val", "str")],
    "IntList": [(0, "items", ("vec", "i64"))],
    "DoubleList": [(0, "items", ("vec", "f64"))],
    "BoolList": [(0, "items", ("vec", "bool"))],
    "TensorList": [(0, "items", ("vec", "i32"))],
    "OptionalTensorList": [(0, "items", ("vec", "i32"))],
    "Tensor": [
        (0, "scalar_type", "i8"),
        (1, "storage_offset", "i32"),
        (2, "sizes", ("vec", "i32")),
        (3, "dim_order", ("vec", "u8")),
        (4, "requires_grad", "bool"),
        (5, "data_buffer_idx", "u32"),
        (6, "allocation_info", ("table", "AllocationDetails")),
        (7, "layout", "i8"),
        (8, "shape_dynamism", "i8"),
        (9, "extra_tensor_info", ("table", "ExtraTensorInfo")),
    ],
    "AllocationDetails": [
        (0, "memory_id", "u32"),
        (1, "memory_offset_low", "u32"),
        (2, "memory_offset_high", "u32"),
    ],
    "ExtraTensorInfo": [
        (0, "mutable_data_segments_idx", "u64"),
        (1, "fully_qualified_name", "str"),
        (2, "location", "i8"),
        (3, "device_type", "i8"),
        (4, "device_index", "i8"),
    ],
    "Chain": [
        (0, "inputs", ("vec", "i32")),
        (1, "outputs", ("vec", "i32")),
        (2, "instructions", ("tables", "Instruction")),
        (3, "stacktrace", ("tables", "FrameList")),
    ],
    "Instruction": [(0, "instr_args", ("union", _INSTRUCTIONS))],
    "KernelCall": [(0, "op_index", "i32"), (1, "args", ("vec", "i32"))],
    "DelegateCall": [(0, "delegate_index", "i32"), (1, "args", ("vec", "i32"))],
    "MoveCall": [(0, "move_from", "i32"), (1, "move_to", "i32")],
    "JumpFalseCall": [(0, "cond_value_index", "i32"), (1, "destination_instruction", "i32")],
    "FreeCall": [(0, "value_index", "i32")],
    "FrameList": [(0, "items", ("tables", "Frame"))],
    "Frame": [
        (0, "filename", "str"),
        (1, "lineno", "i32"),
        (2, "name", "str"),
        (3, "context", "str"),
    ],
    "Operator": [(0, "name", "str"), (1, "overload", "str")],
    "BackendDelegate": [
        (0, "id", "str"),
        (1, "processed", ("table", "BackendDelegateDataReference")),
        (2, "compile_specs", ("tables", "CompileSpec")),
    ],
    "BackendDelegateDataReference": [(0, "location", "i8"), (1, "index", "u32")],
    "CompileSpec": [(0, "key", "str"), (1, "value", ("vec", "u8"))],
    "NonConstBufferDevice": [
        (0, "buffer_idx", "i32"),
        (1, "device_type", "i8"),
        (2, "device_index", "i8"),
    ],
    "Buffer": [(0, "storage", ("vec", "u8"))],
    "DataSegment": [(0, "offset", "u64"), (1, "size", "u64")],
    "SubsegmentOffsets": [(0, "segment_index", "u32"), (1, "offsets", ("vec", "u64"))],
    "NamedData": [(0, "key", "str"), (1, "segment_index", "u32")],
    # flat_tensor.fbs (.ptd)
    "FlatTensor": [
        (0, "version", "u32"),
        (1, "segments", ("tables", "DataSegment")),
        (2, "named_data", ("tables", "PtdNamedData")),
    ],
    "PtdNamedData": [
        (0, "key", "str"),
        (1, "segment_index", "u32"),
        (2, "tensor_layout", ("table", "TensorLayout")),
    ],
    "TensorLayout": [
        (0, "scalar_type", "i8"),
        (1, "sizes", ("vec", "i32")),
        (2, "dim_order", ("vec", "u8")),
    ],
}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


_WIDTH = {
    "u8": 1,
    "i8": 1,
    "bool": 1,
    "u16": 2,
    "i32": 4,
    "u32": 4,
    "f32": 4,
    "i64": 8,
    "u64": 8,
    "f64": 8,
}


@dataclasses.dataclass(frozen=True, slots=True)
class Field:
    """One integer of a seed file that the schema gives a meaning to."""

    pos: int
    size: int  # bytes: 1, 2, 4 or 8
    kind: str  # offset | soffset | vtable | len | tag | scalar | item | header
    path: str


# union members named as ptexec's decoders name them
_LABELS = {"XNNTensorValue": "tensor_value", "XNNQuantizedTensorValue": "quantized_tensor_value"}
# fields that say where a tensor or a buffer lives: mutated with device codes
_DEVICE_FIELDS = frozenset({"device_type", "device_index"})
MAX_VECTOR_ITEMS = 64  # item fields per payload vector (the first and last ones)


@dataclasses.dataclass
class _Walk:
    """How one flatbuffer is walked: its schema, where it lies in the file, what its
    fields' kinds are called (payload kinds carry an ``x`` prefix)."""

    schema: dict[str, list[tuple[int, str, Any]]]
    base: int = 0
    prefix: str = ""
    cap: int | None = None
    tables: list[tuple[str, Table]] = dataclasses.field(default_factory=list)

    def field(self, pos: int, size: int, kind: str, path: str) -> Field:
        return Field(self.base + pos, size, self.prefix + kind, path)


def _walk_table(
    buf: Buffer, t: Table, tname: str, out: list[Field], depth: int, w: _Walk | None = None
) -> None:
    if depth > 32:
        return
    w = w or _Walk(SCHEMA)
    w.tables.append((tname, t))
    out.append(w.field(t.pos, 4, "soffset", f"{t.path}(soffset)"))
    out.append(w.field(t.vtable, 2, "vtable", f"{t.path}(vtable size)"))
    out.append(w.field(t.vtable + 2, 2, "vtable", f"{t.path}(table size)"))
    for k in range(t.nfields):
        out.append(w.field(t.vtable + 4 + 2 * k, 2, "vtable", f"{t.path}(vtable[{k}])"))
    for slot, name, kind in w.schema[tname]:
        path = f"{t.path}.{name}" if t.path else name
        if isinstance(kind, str) and kind != "str":
            at = t._field(slot)
            if at:
                what = "float" if kind == "f32" else "scalar"
                if name in _DEVICE_FIELDS:
                    what = "device"
                out.append(w.field(at, _WIDTH[kind], what, path))
            continue
        if kind == "str":
            at = t._field(slot)
            if at:
                out.append(w.field(at, 4, "offset", path))
                target = at + buf.u32(at, path)
                out.append(w.field(target, 4, "len", f"{path}(len)"))
            continue
        what = kind[0]
        if what == "union":
            at = t._field(slot)
            if at:
                out.append(w.field(at, 1, "tag", f"{path}_type"))
            # the value is named by its type (values[3].tensor), as validation names it
            code, child = t.union(
                slot, name, {c: _LABELS.get(n) or _snake(n) for c, n in kind[1].items()}
            )
            vat = t._field(slot + 1)
            if vat:
                out.append(w.field(vat, 4, "offset", path))
            if child is not None and code in kind[1]:
                _walk_table(buf, child, kind[1][code], out, depth + 1, w)
            continue
        at = t._field(slot)
        if not at:
            continue
        out.append(w.field(at, 4, "offset", path))
        if what == "table":
            child = t.table(slot, name)
            assert child is not None
            _walk_table(buf, child, kind[1], out, depth + 1, w)
        elif what == "vec":
            width = _WIDTH[kind[1]]
            span = t.vector_span(slot, name, width)
            assert span is not None
            start, n = span
            out.append(w.field(start - 4, 4, "len", f"{path}(len)"))
            items = range(n)
            if w.cap is not None and n > w.cap:
                items = [*range(w.cap // 2), *range(n - w.cap // 2, n)]
            item_kind = "float" if kind[1] == "f32" else "item"
            for i in items:
                out.append(w.field(start + i * width, width, item_kind, f"{path}[{i}]"))
        elif what == "tables":
            span = t.vector_span(slot, name, 4)
            assert span is not None
            start, n = span
            out.append(w.field(start - 4, 4, "len", f"{path}(len)"))
            for i in range(n):
                item = start + 4 * i
                out.append(w.field(item, 4, "offset", f"{path}[{i}]"))
                child = Table.at(buf, item + buf.u32(item, path), f"{path}[{i}]")
                _walk_table(buf, child, kind[1], out, depth + 1, w)


@functools.cache
def xnnpack_schema() -> dict[str, list[tuple[int, str, Any]]]:
    """The XNNPACK payload's flatbuffer schema (``XNNGraph``), in :data:`SCHEMA`'s form;
    node tables come from ptexec's decoder (one source of truth for slots and kinds)."""
    from ptexec.delegates.xnnpack import schema as xs

    quant = {
        1: "PerChannelQuant",
        2: "PerTensorQuant",
        3: "PerTokenDynamicQuant",
        4: "PerChannelGroupQuant",
    }
    out: dict[str, list[tuple[int, str, Any]]] = {
        "XNNGraph": [
            (0, "version", "str"),
            (1, "xnodes", ("tables", "XNode")),
            (2, "xvalues", ("tables", "XValue")),
            (3, "num_externs", "u32"),
            (4, "input_ids", ("vec", "u32")),
            (5, "output_ids", ("vec", "u32")),
            (6, "constant_buffer", ("tables", "XBuffer")),
            (7, "mem_buffer_sizes", ("vec", "u32")),
            (8, "constant_data", ("tables", "ConstantDataOffset")),
        ],
        "XNode": [
            (
                0,
                "xnode_union",
                ("union", {code: name for code, (name, _) in xs.NODE_TABLES.items()}),
            ),
            (2, "debug_handle", "u32"),
            (3, "output_min_max", ("table", "OutputMinMax")),
        ],
        "OutputMinMax": [(0, "output_min", "f32"), (1, "output_max", "f32")],
        "XValue": [
            (0, "xvalue_union", ("union", {1: "XNNTensorValue", 2: "XNNQuantizedTensorValue"}))
        ],
        "XNNTensorValue": [
            (0, "datatype", "u16"),
            (1, "num_dims", "u32"),
            (2, "dims", ("vec", "u32")),
            (3, "constant_buffer_idx", "u32"),
            (4, "external_id", "u32"),
            (5, "flags", "u32"),
            (6, "id_out", "u32"),
            (7, "dq_datatype", "u16"),
        ],
        "XNNQuantizedTensorValue": [
            (0, "tensor_value", ("table", "XNNTensorValue")),
            (1, "quant_params", ("union", quant)),
        ],
        "PerChannelQuant": [
            (0, "scale", ("vec", "f32")),
            (1, "channel_dim", "i32"),
            (2, "scale_buffer_idx", "u32"),
            (3, "num_scales", "u32"),
        ],
        "PerTensorQuant": [(0, "scale", "f32"), (1, "zero_point", "i32")],
        "PerTokenDynamicQuant": [(0, "num_nonbatch_dims", "i32")],
        "PerChannelGroupQuant": [
            (0, "scale", ("vec", "f32")),
            (1, "channel_dim", "i32"),
            (2, "group_size", "i32"),
            (3, "scale_bf16", ("vec", "u16")),
            (4, "scale_buffer_idx", "u32"),
            (5, "num_scales", "u32"),
        ],
        "XBuffer": [(0, "storage", ("vec", "u8"))],
        "ConstantDataOffset": [(0, "offset", "u64"), (1, "size", "u64"), (2, "named_key", "str")],
    }
    kinds = {"f32": "f32", "i32": "i32", "u32[]": ("vec", "u32")}
    for name, fields in xs.NODE_TABLES.values():
        out[name] = [(slot, f, kinds.get(k, "u32")) for slot, (f, k) in enumerate(fields)]
    return out


def field_map(data: bytes, kind: str = "pte") -> list[Field]:
    """Every schema-named integer of a valid ``.pte`` (``kind="pte"``) or ``.ptd``: the
    program's (or data file's) flatbuffer and headers, every XNNPACK delegate payload's
    header and graph (kinds with an ``x`` prefix), and sampled elements of constant data
    (the program's constants, the payloads' constants and named data, a ``.ptd``'s tensors:
    kinds ``fdata``, ``hdata``, ``idata`` by element type)."""
    out: list[Field] = [Field(0, 4, "offset", "root offset")]
    view = memoryview(data)
    if kind == "pte":
        end = len(data)
        if data[8:12] == b"eh00":
            out += [
                Field(12, 4, "header", "eh00.length"),
                Field(16, 8, "header", "eh00.program_size"),
                Field(24, 8, "header", "eh00.segment_base_offset"),
                Field(32, 8, "header", "eh00.segment_data_size"),
            ]
            end = struct.unpack_from("<Q", data, 16)[0]
        buf = Buffer(view[:end])
        _walk_table(buf, buf.root(""), "Program", out, 0)
        out += _pte_data_fields(data)
    else:
        out += [
            Field(12, 4, "header", "FH01.length"),
            Field(16, 8, "header", "FH01.flatbuffer_offset"),
            Field(24, 8, "header", "FH01.flatbuffer_size"),
            Field(32, 8, "header", "FH01.segment_base_offset"),
            Field(40, 8, "header", "FH01.segment_data_size"),
        ]
        fb_off, fb_size = struct.unpack_from("<QQ", data, 16)
        buf = Buffer(view[: fb_off + fb_size])
        _walk_table(buf, buf.root("ptd"), "FlatTensor", out, 0)
        from ptexec.format.ptd import read_ptd

        for key, e in read_ptd(data).entries.items():
            if e.layout is not None:
                out += _data_fields(
                    e.offset, e.size, _scalar_data(e.layout.scalar_type), f"ptd[{key}]"
                )
    return out


DATA_SAMPLES = 16  # element fields per constant


def _data_fields(start: int, size: int, what: tuple[str, int] | None, path: str) -> list[Field]:
    """Up to :data:`DATA_SAMPLES` elements of a constant's bytes, spread over it."""
    if what is None:
        return []
    kind, width = what
    n = size // width
    picks = (
        sorted({i * (n - 1) // (DATA_SAMPLES - 1) for i in range(DATA_SAMPLES)}) if n > 0 else []
    )
    return [Field(start + i * width, width, kind, f"{path}[{i}]") for i in picks]


def _scalar_data(code: int) -> tuple[str, int] | None:
    """The data kind and element size of a program scalar type."""
    from ptexec.format.scalar_type import SCALAR_TYPES

    if code in (6,):
        return ("fdata", 4)
    if code in (5, 15):
        return ("hdata", 2)
    entry = SCALAR_TYPES.get(code)
    return None if entry is None else ("idata", entry[1])


_XNN_DATA = {
    "fp32": ("fdata", 4),
    "fp16": ("hdata", 2),
    "bf16": ("hdata", 2),
    "int32": ("idata", 4),
    "qint32": ("idata", 4),
    "qcint32": ("idata", 4),
}


def _pte_data_fields(data: bytes) -> list[Field]:
    """Fields of a valid program's constants and of its XNNPACK payloads."""
    from ptexec.format import program as p
    from ptexec.format.pte import read_pte

    pte = read_pte(data)
    prog = pte.program
    out: list[Field] = []
    const = prog.constant_segment
    seen: set[int] = set()
    for i, plan in enumerate(prog.execution_plan):
        for v in plan.values:
            if isinstance(v, p.Tensor) and v.data_buffer_idx > 0 and v.data_buffer_idx not in seen:
                seen.add(v.data_buffer_idx)
                if const is not None and len(const.offsets) > v.data_buffer_idx:
                    start = (
                        pte.segments[const.segment_index].offset + const.offsets[v.data_buffer_idx]
                    )
                elif v.data_buffer_idx < len(prog.constant_buffer):
                    start = prog.constant_buffer[v.data_buffer_idx].offset
                else:
                    continue
                out += _data_fields(
                    start, v.nbytes, _scalar_data(v.scalar_type), f"constant[{v.data_buffer_idx}]"
                )
        for j, d in enumerate(plan.delegates):
            if d.id != "XnnpackBackend":
                continue
            ref = d.processed
            if ref.location == p.DATA_INLINE:
                start = prog.backend_delegate_data[ref.index].offset
            else:
                start = pte.segments[ref.index].offset
            out += _payload_fields(
                pte, start, pte.delegate_data(ref), f"execution_plan[{i}].delegates[{j}].payload"
            )
    return out


def _payload_fields(pte: Any, start: int, view: memoryview, path: str) -> list[Field]:
    """An XNNPACK payload's header, graph and constant data, as fields of the file."""
    from ptexec.delegates.xnnpack import schema as xs

    out: list[Field] = []
    header = xs.read_header(view, path)
    fb_off = 0
    if header is not None:
        out += [
            Field(start + 8, 2, "xheader", f"{path}.header.length"),
            Field(start + 10, 4, "xheader", f"{path}.header.flatbuffer_offset"),
            Field(start + 14, 4, "xheader", f"{path}.header.flatbuffer_size"),
            Field(start + 18, 4, "xheader", f"{path}.header.constant_data_offset"),
            Field(start + 22, 8, "xheader", f"{path}.header.constant_data_size"),
        ]
        fb_off = header.flatbuffer_offset
        fb = view[fb_off : fb_off + header.flatbuffer_size]
    else:
        fb = view
    out.append(Field(start + fb_off, 4, "xoffset", f"{path}.root offset"))
    buf = Buffer(fb)
    _walk_table(
        buf,
        buf.root(path),
        "XNNGraph",
        out,
        0,
        _Walk(xnnpack_schema(), start + fb_off, "x", MAX_VECTOR_ITEMS),
    )
    payload = xs.decode_payload(view, path)
    g = payload.graph
    kinds: dict[int, tuple[str, int]] = {}
    for v in g.values:
        if v.is_constant:
            kinds.setdefault(v.constant_buffer_idx, _XNN_DATA.get(v.dtype_name, ("idata", 1)))
        q = v.quant
        idx = getattr(q, "scale_buffer_idx", 0)
        if idx:
            kinds.setdefault(
                idx, ("hdata", 2) if isinstance(q, xs.PerChannelGroupQuant) else ("fdata", 4)
            )
    named = {n.key: pte.segments[n.segment_index] for n in pte.program.named_data}
    for idx, what in sorted(kinds.items()):
        if g.constant_data:
            if idx >= len(g.constant_data):
                continue
            e = g.constant_data[idx]
            if e.named_key is not None:
                seg = named.get(e.named_key)
                if seg is None:
                    continue  # in a .ptd
                at, size = seg.offset, min(e.size, seg.size)
            else:
                at = start + (header.constant_data_offset if header is not None else 0) + e.offset
                size = e.size
        elif idx < len(g.constant_buffers):
            b0, size = g.constant_buffers[idx]
            at = start + fb_off + b0
        else:
            continue
        out += _data_fields(at, size, what, f"{path}.constant_data[{idx}]")
    return out


# --------------------------------------------------------------------------------------
# mutations: each is a concrete edit, replayable on the seed

Edit = tuple[
    Any, ...
]  # ("set", pos, hex) | ("trunc", n) | ("insert", pos, hex) | ("delete", pos, n)


def apply_edits(data: bytes, edits: Iterable[Edit]) -> bytes:
    """Apply edits in order (each sees the result of the previous ones)."""
    b = bytearray(data)
    for e in edits:
        op = e[0]
        if op == "set":
            pos, raw = e[1], bytes.fromhex(e[2])
            if pos < len(b):
                b[pos : pos + len(raw)] = raw[: max(0, len(b) - pos)]
        elif op == "trunc":
            del b[e[1] :]
        elif op == "insert":
            b[e[1] : e[1]] = bytes.fromhex(e[2])
        elif op == "delete":
            del b[e[1] : e[1] + e[2]]
        else:
            raise ValueError(f"unknown edit {op!r}")
    return bytes(b)


_BOUNDARIES = [
    0,
    1,
    2,
    3,
    4,
    7,
    8,
    15,
    16,
    17,
    31,
    32,
    63,
    64,
    100,
    127,
    128,
    255,
    256,
    1023,
    1024,
    4095,
    4096,
    0x7FFF,
    0x8000,
    0xFFFF,
    0x10000,
    1 << 20,
    1 << 24,
    (1 << 31) - 1,
    1 << 31,
    (1 << 32) - 1,
    1 << 32,
    (1 << 40),
    (1 << 62),
    (1 << 63) - 1,
    1 << 63,
    (1 << 64) - 1,
]


def _pick_value(rng: random.Random, old: int, width: int, peers: Sequence[int]) -> int:
    bits = 8 * width
    mask = (1 << bits) - 1
    r = rng.random()
    if r < 0.30:
        v = rng.choice(_BOUNDARIES)
    elif r < 0.50:
        v = old + rng.choice([-2, -1, 1, 2, rng.randint(-64, 64)])
    elif r < 0.58:
        v = -1
    elif r < 0.66:
        v = old * 2 if rng.random() < 0.5 else old // 2
    elif r < 0.76:
        v = 1 << rng.randrange(bits)
    elif r < 0.88 and peers:
        v = rng.choice(peers)
    else:
        v = rng.getrandbits(bits)
    return v & mask


def _read_int(data: bytes, f: Field) -> int:
    return int.from_bytes(data[f.pos : f.pos + f.size], "little")


# weight of each field kind when a field mutation picks its target (then a field of that
# kind, uniformly): semantic fields first, structure (offsets, vtables) less often
_KIND_WEIGHT = {
    "scalar": 6,
    "item": 6,
    "offset": 2,
    "len": 2,
    "tag": 2,
    "soffset": 0.5,
    "vtable": 1,
    "header": 1,
    "device": 4,
    "float": 1.5,
    # inside XNNPACK payloads
    "xscalar": 6,
    "xitem": 5,
    "xoffset": 1.5,
    "xlen": 1.5,
    "xtag": 2,
    "xsoffset": 0.3,
    "xvtable": 0.7,
    "xheader": 0.7,
    "xfloat": 2.5,
    "xdevice": 1,
    # elements of constant data (the program's, the payloads', a .ptd's)
    "fdata": 2,
    "hdata": 1.5,
    "idata": 1.5,
}

# float32 and 16-bit float bit patterns worth writing: NaN, infinities, -0, the largest and
# smallest magnitudes, 1, -1, a large ordinary value
_F32_PATTERNS = [
    0x7FC00000,
    0x7F800000,
    0xFF800000,
    0x80000000,
    0x7F7FFFFF,
    0x00000001,
    0x3F800000,
    0xBF800000,
    0x501502F9,
    0x00800000,
]
_F16_PATTERNS = [0x7E00, 0x7C00, 0xFC00, 0x8000, 0x7BFF, 0x0001, 0x3C00, 0xBC00, 0x7F80, 0xFF80]
_DEVICE_CODES = [0, 1, 2, 3, 12, 0x7F, 0x80, 0xFF]


def _pick_float(rng: random.Random, old: int, width: int) -> int:
    if rng.random() < 0.7:
        return rng.choice(_F32_PATTERNS if width == 4 else _F16_PATTERNS)
    if rng.random() < 0.5:
        return old ^ (1 << rng.randrange(8 * width))  # one bit of the value
    return rng.getrandbits(8 * width)


def _group(path: str) -> str:
    """A field's path without indices: fields of one group hold comparable values."""
    return re.sub(r"\[\d+\]", "[]", path)


class Mutator:
    """Draws concrete edits for one seed file (``rng`` decides everything)."""

    def __init__(self, data: bytes, fields: Sequence[Field]) -> None:
        self.data = data
        self.by_kind: dict[str, list[Field]] = {}
        self.by_width: dict[int, list[int]] = {}
        self.by_group: dict[str, list[int]] = {}
        for f in fields:
            self.by_kind.setdefault(f.kind, []).append(f)
            value = _read_int(data, f)
            self.by_width.setdefault(f.size, []).append(value)
            self.by_group.setdefault(_group(f.path), []).append(value)
        self.kinds = sorted(self.by_kind)
        self.kind_weights = [_KIND_WEIGHT[k] for k in self.kinds]
        # fields of a delegate payload (its graph, header and constant data): --focus payload
        self.payload_kinds: dict[str, list[Field]] = {}
        for f in fields:
            if f.kind.startswith("x") or ".payload." in f.path:
                self.payload_kinds.setdefault(f.kind, []).append(f)

    def field_edit(
        self, rng: random.Random, current: bytes, by_kind: dict[str, list[Field]] | None = None
    ) -> Edit:
        """Rewrite one field (of ``by_kind``'s fields when given, else of any)."""
        by_kind = self.by_kind if by_kind is None else by_kind
        kinds = sorted(by_kind)
        kind = rng.choices(kinds, [_KIND_WEIGHT[k] for k in kinds])[0]
        f = rng.choice(by_kind[kind])
        old = _read_int(current, f) if f.pos + f.size <= len(current) else 0
        if f.kind == "tag":
            v = rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 255])
        elif f.kind == "xtag":  # XNNPACK node and value union codes
            v = rng.choice(
                [0, 1, 2, 3, 4, 5, 7, 11, 13, 14, 18, 20, 32, 36, 38, 39, 47, 48, 120, 255]
            )
        elif f.kind in ("device", "xdevice"):
            v = rng.choice(_DEVICE_CODES) if rng.random() < 0.8 else rng.getrandbits(8 * f.size)
        elif f.kind in ("float", "xfloat", "fdata", "hdata") and f.size in (2, 4):
            v = _pick_float(rng, old, f.size)
        elif f.kind == "idata":  # an integer element: its type's extremes, or near its value
            bits = 8 * f.size
            v = rng.choice(
                [0, 1, (1 << bits) - 1, 1 << (bits - 1), (1 << (bits - 1)) - 1, old + 1, old - 1]
            )
            v &= (1 << bits) - 1
        else:
            group = self.by_group.get(_group(f.path), [])
            if len(set(group)) > 1 and rng.random() < 0.35:
                v = rng.choice(group)  # a value that is valid for a field like this one
                v &= (1 << (8 * f.size)) - 1
            else:
                v = _pick_value(rng, old, f.size, self.by_width.get(f.size, ()))
        return ("set", f.pos, v.to_bytes(f.size, "little").hex())

    def byte_edit(self, rng: random.Random, current: bytes) -> Edit:
        n = len(current)
        if n == 0:
            return ("insert", 0, rng.randbytes(rng.randint(1, 16)).hex())
        r = rng.random()
        pos = rng.randrange(n)
        if r < 0.30:  # bit flip
            return ("set", pos, bytes([current[pos] ^ (1 << rng.randrange(8))]).hex())
        if r < 0.45:  # interesting byte
            return ("set", pos, bytes([rng.choice([0, 1, 0x7F, 0x80, 0xFF, 0x10, 0x40])]).hex())
        if r < 0.55:  # random run
            k = min(rng.randint(1, 16), n - pos)
            return ("set", pos, rng.randbytes(k).hex())
        if r < 0.70:  # truncation
            return ("trunc", rng.randrange(n) if rng.random() < 0.7 else rng.randrange(min(n, 64)))
        if r < 0.80:  # insert
            k = rng.choice([1, 2, 4, 8, rng.randint(1, 64)])
            return ("insert", pos, (bytes(k) if rng.random() < 0.5 else rng.randbytes(k)).hex())
        if r < 0.90:  # delete
            return ("delete", pos, rng.choice([1, 2, 4, 8, rng.randint(1, 64)]))
        # copy a chunk of the file over another place
        k = rng.randint(1, 32)
        src = rng.randrange(n)
        return ("set", pos, current[src : src + k].hex())

    def draw(self, rng: random.Random, focus: str | None = None) -> list[Edit]:
        """One to four edits, mostly field-aware; ``focus="payload"``: field edits of
        delegate payloads only (where the file has any)."""
        edits: list[Edit] = []
        current = self.data
        count = rng.choices([1, 2, 3, 4], [55, 25, 12, 8])[0]
        only = self.payload_kinds if focus == "payload" and self.payload_kinds else None
        for _ in range(count):
            e = (
                self.field_edit(rng, current, only)
                if only is not None or rng.random() < 0.7
                else self.byte_edit(rng, current)
            )
            edits.append(e)
            current = apply_edits(current, [e])
        return edits


# --------------------------------------------------------------------------------------
# seeds


@dataclasses.dataclass
class Seed:
    name: str
    pte: bytes
    ptd: bytes | None
    methods: tuple[str, ...]
    inputs: dict[str, list[Any]]  # first fixture call of each method
    pte_mutator: Mutator
    ptd_mutator: Mutator | None
    # load options that let this machine run the fixture (device programs without their
    # device run with device_map="cpu"), added to every case's own options
    options: dict[str, Any] = dataclasses.field(default_factory=dict)


XNNPACK_PREFIX = "xnnpack-"  # seed names of the XNNPACK fixtures (tests/fixtures/xnnpack)


def load_seeds(names: Sequence[str] | None = None) -> dict[str, Seed]:
    """The fixtures as fuzz seeds (bytes, field maps, and one call's inputs per method):
    tests/fixtures and, named ``xnnpack-NAME``, tests/fixtures/xnnpack."""
    import torch

    seeds: dict[str, Seed] = {}
    for folder, prefix in ((FIXTURES, ""), (FIXTURES / "xnnpack", XNNPACK_PREFIX)):
        manifest = json.loads((folder / "manifest.json").read_text())
        for base in sorted(manifest):
            name = prefix + base
            if names and name not in names:
                continue
            entry = manifest[base]
            pte = (folder / entry["pte"]).read_bytes()
            ptd = (folder / entry["ptd"]).read_bytes() if entry.get("ptd") else None
            calls = torch.load(folder / f"{base}.io.pt", weights_only=True)["calls"]
            inputs: dict[str, list[Any]] = {}
            for call in calls:
                inputs.setdefault(call.get("method", "forward"), list(call["inputs"]))
            seeds[name] = Seed(
                name,
                pte,
                ptd,
                tuple(entry.get("methods", ("forward",))),
                inputs,
                Mutator(pte, field_map(pte, "pte")),
                Mutator(ptd, field_map(ptd, "ptd")) if ptd is not None else None,
                _machine_options(entry),
            )
    return seeds


def _machine_options(entry: dict[str, Any]) -> dict[str, Any]:
    """Load options for a fixture that names devices (its stored inputs are CPU tensors):
    ``device_map="cpu"`` where one of its devices is missing, else ``transfers="allow"``."""
    devices = entry.get("devices") or []
    if not devices:
        return {}
    import torch

    have = torch.cuda.device_count()
    missing = [d for d in devices if d.startswith("cuda") and int(d.partition(":")[2] or 0) >= have]
    return {"device_map": "cpu"} if missing else {"transfers": "allow"}


@dataclasses.dataclass
class Case:
    """A concrete case: the seed, the edits to its .pte and to its .ptd, and the load
    options (``xnnpack``: which runner runs XNNPACK payloads; absent: the default)."""

    seed: str
    pte_edits: list[Edit]
    ptd_edits: list[Edit]
    options: dict[str, Any] = dataclasses.field(default_factory=dict)

    def files(self, seeds: dict[str, Seed]) -> tuple[bytes, bytes | None]:
        s = seeds[self.seed]
        pte = apply_edits(s.pte, self.pte_edits)
        ptd = None if s.ptd is None else apply_edits(s.ptd, self.ptd_edits)
        return pte, ptd

    def to_json(self) -> dict[str, Any]:
        out = {"seed": self.seed, "pte_edits": self.pte_edits, "ptd_edits": self.ptd_edits}
        if self.options:
            out["options"] = self.options
        return out


FOCUSES = ("payload", "ptd")


def draw_case(seeds: dict[str, Seed], rng: random.Random, focus: str | None = None) -> Case:
    """One case: a fixture chosen by ``rng``, then edits to its .pte (or, sometimes, its
    .ptd). Half the XNNPACK fixtures' cases run with ``xnnpack="torch"`` (ptexec's own
    runner), half with the default (ExecuTorch's backend where it is installed).

    ``focus`` narrows the edits: ``"payload"`` rewrites fields of delegate payloads only,
    ``"ptd"`` edits the .ptd of a fixture that has one (fixtures without are not drawn)."""
    names = sorted(seeds)
    if focus == "ptd":
        names = [n for n in names if seeds[n].ptd_mutator is not None] or names
    s = seeds[rng.choice(names)]
    options: dict[str, Any] = {}
    if s.name.startswith(XNNPACK_PREFIX) and rng.random() < 0.5:
        options = {"xnnpack": "torch"}
    if s.ptd_mutator is not None and (focus == "ptd" or rng.random() < 0.3):
        return Case(s.name, [], s.ptd_mutator.draw(rng), options)
    return Case(s.name, s.pte_mutator.draw(rng, focus), [], options)


def case_rng(seed: int, index: int) -> random.Random:
    return random.Random(f"ptexec-fuzz:{seed}:{index}")


# --------------------------------------------------------------------------------------
# running one case


@dataclasses.dataclass
class Outcome:
    """What a case did: ``status`` is ``ok`` (ran), ``error`` (a PtexecError),
    ``kernel_alloc`` (a PtexecError from a kernel whose hostile arguments made it ask the
    allocator for more than the cap: recorded and reported, not a failure of ptexec's
    checks) or a finding kind (``escape``, ``alloc``, ``hang``, ``crash``, ``output``)."""

    status: str
    stage: str  # load | load_method | call
    detail: str = ""
    seconds: float = 0.0
    peak_growth: int | None = None  # bytes of peak-RSS growth during the case

    @property
    def is_finding(self) -> bool:
        return self.status in ("escape", "alloc", "hang", "crash", "output")


_ALLOC_RE = re.compile(r"tried to allocate (\d+) bytes|can't allocate memory|out of memory", re.I)
_SIZE_RE = re.compile(r"tried to allocate (\d+) bytes", re.I)


def _allocation_failure(e: BaseException, cap: int) -> str | None:
    """An allocator failure anywhere in ``e``'s chain for more than ``cap`` bytes."""
    seen = 0
    cur: BaseException | None = e
    while cur is not None and seen < 16:
        if isinstance(cur, MemoryError):
            return f"MemoryError: {cur}"
        text = str(cur)
        if _ALLOC_RE.search(text):
            m = _SIZE_RE.search(text)
            if m is None or int(m.group(1)) > cap:
                return f"{type(cur).__name__}: {text.splitlines()[0][:300]}"
        cur = cur.__cause__ or cur.__context__
        seen += 1
    return None


def _scrub(text: str) -> str:
    """Paths relative to the repository (or to site-packages), never this machine's."""
    text = text.replace(str(ROOT) + os.sep, "")
    return re.sub(r"\"[^\"]*?(site-packages|lib/python[0-9.]+)/", '"', text)


def _describe(e: BaseException) -> str:
    """The exception's type and first message line, then the innermost frames."""
    first = (str(e).splitlines() or [""])[0][:300]
    frames = traceback.format_tb(e.__traceback__)[-4:]
    return _scrub(f"{type(e).__name__}: {first}\n" + "".join(frames))


def synth_inputs(meta: Any) -> list[Any] | None:
    """Inputs built from a method's own description (None when one would be too large, or
    torch cannot make one of its dtype)."""
    try:
        return _synth_inputs(meta)
    except Exception:
        return None


def _synth_inputs(meta: Any) -> list[Any] | None:
    import torch

    from ptexec.tensor import TensorInfo

    out: list[Any] = []
    for info in meta.inputs:
        if isinstance(info, TensorInfo):
            if info.numel > MAX_INPUT_ELEMENTS or info.device.type != 0:
                return None
            if info.dtype.is_floating_point:
                t = torch.randn(info.sizes, generator=torch.Generator().manual_seed(0)).to(
                    info.dtype
                )
            else:
                t = torch.zeros(info.sizes, dtype=info.dtype)
            if info.dim_order is not None and info.dim_order != tuple(range(info.rank)):
                t = (
                    t.permute(info.dim_order)
                    .contiguous()
                    .permute([info.dim_order.index(d) for d in range(info.rank)])
                )
            out.append(t)
        else:
            out.append(info.value)
    return out


class OutputMismatch(Exception):
    """A call returned an output that contradicts its method's declared output."""


def check_outputs(meta: Any, outputs: Sequence[Any]) -> None:
    """Every tensor output has its declared dtype and rank, the declared sizes when they
    are static, and sizes within the declared bounds when they are dynamic."""
    import torch

    from ptexec.tensor import TensorInfo

    if len(outputs) != len(meta.outputs):
        raise OutputMismatch(f"{len(outputs)} outputs, the method declares {len(meta.outputs)}")
    for i, (got, info) in enumerate(zip(outputs, meta.outputs, strict=True)):
        if not isinstance(info, TensorInfo):
            continue
        want = f"{str(info.dtype).removeprefix('torch.')}{list(info.sizes)} ({info.dynamism})"
        if not isinstance(got, torch.Tensor):
            raise OutputMismatch(f"output {i} is a {type(got).__name__}, declared {want}")
        shape = tuple(got.shape)
        what = (
            f"output {i} is {str(got.dtype).removeprefix('torch.')}{list(shape)}, declared {want}"
        )
        if got.dtype != info.dtype or len(shape) != info.rank:
            raise OutputMismatch(what)
        if info.dynamism == "static" and shape != tuple(info.sizes):
            raise OutputMismatch(what)
        if info.dynamism == "dynamic_bound" and any(
            a > b for a, b in zip(shape, info.sizes, strict=True)
        ):
            raise OutputMismatch(what)


def run_files(
    pte: bytes,
    ptd: bytes | None,
    inputs: dict[str, list[Any]],
    cap: int = DEFAULT_CAP,
    max_instructions: int = DEFAULT_MAX_INSTRUCTIONS,
    options: dict[str, Any] | None = None,
) -> Outcome:
    """Load ``pte`` (with ``ptd``), load every method (with load ``options``), call each
    once and check what it returns against its declaration; classify the result (an output
    that contradicts its declaration is an ``output`` finding)."""
    import torch

    import ptexec

    options = options or {}

    # a program may write into the inputs it reads in place: every case gets its own copies
    inputs = {
        k: [a.clone() if isinstance(a, torch.Tensor) else a for a in v] for k, v in inputs.items()
    }
    stage = "load"
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prog = ptexec.load(pte, data_path=ptd)
            for name in prog.method_names:
                stage = "load_method"
                m = prog.load_method(
                    name, max_planned_bytes=cap, max_instructions=max_instructions, **options
                )
                stage = "call"
                args = inputs.get(name)
                try:
                    if args is None:
                        raise ptexec.InputError("no fixture inputs")
                    check_outputs(m.meta, m.execute(args))
                except ptexec.InputError:
                    args = synth_inputs(m.meta)
                    if args is None:
                        raise
                    try:
                        check_outputs(m.meta, m.execute(args))
                    except ptexec.ExecutionError:
                        # a failed call must leave the method sound: call it again
                        stage = "call again"
                        with contextlib.suppress(ptexec.PtexecError):
                            m.execute(args)
                        stage = "call"
                        raise
                except ptexec.ExecutionError:
                    stage = "call again"
                    with contextlib.suppress(ptexec.PtexecError):
                        m.execute(args)
                    stage = "call"
                    raise
        return Outcome("ok", stage, seconds=time.perf_counter() - start)
    except ptexec.PtexecError as e:
        elapsed = time.perf_counter() - start
        alloc = _allocation_failure(e, cap)
        if alloc is not None and stage == "call":
            # a kernel asked for it (its arguments are hostile); ptexec has no hook there
            return Outcome("kernel_alloc", stage, f"{type(e).__name__} after {alloc}", elapsed)
        if alloc is not None:
            return Outcome("alloc", stage, f"{type(e).__name__} after {alloc}", elapsed)
        return Outcome("error", stage, f"{type(e).__name__}: {str(e)[:200]}", elapsed)
    except OutputMismatch as e:
        return Outcome("output", stage, str(e), time.perf_counter() - start)
    except Exception as e:
        return Outcome("escape", stage, _describe(e), time.perf_counter() - start)


# --------------------------------------------------------------------------------------
# memory measures (Linux)


def _status_kib(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class PeakMeter:
    """Per-case peak resident growth, from ``VmHWM`` after resetting it (Linux only)."""

    def __init__(self) -> None:
        self.available = self._reset() and _status_kib("VmHWM") is not None

    @staticmethod
    def _reset() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def start(self) -> int:
        if not self.available:
            return 0
        self._reset()
        return (_status_kib("VmRSS") or 0) * 1024

    def growth(self, rss0: int) -> int | None:
        if not self.available:
            return None
        return (_status_kib("VmHWM") or 0) * 1024 - rss0


def peak_limit(cap: int, slack: int) -> int:
    """The peak resident growth a case may show: planned memory and unplanned tensors are
    each held to ``cap`` (``max_planned_bytes``), plus ``slack`` for kernels' temporaries."""
    return 2 * cap + slack


def measured(fn: Callable[[], Outcome], meter: PeakMeter, cap: int, slack: int) -> Outcome:
    """Run ``fn``; a peak resident growth above :func:`peak_limit` is an ``alloc`` finding."""
    rss0 = meter.start()
    outcome = fn()
    growth = meter.growth(rss0)
    outcome.peak_growth = growth
    if growth is not None and growth > peak_limit(cap, slack) and not outcome.is_finding:
        outcome = dataclasses.replace(
            outcome,
            status="alloc",
            detail=f"peak resident memory grew by {growth} bytes (limit {peak_limit(cap, slack)}); "
            f"the case ended with: {outcome.status} {outcome.detail[:200]}",
        )
    return outcome


@contextlib.contextmanager
def address_space_limit(budget: int) -> Iterator[int | None]:
    """Within the block, this process's address space may grow by at most ``budget`` bytes
    beyond its size on entry (Linux; elsewhere no limit). The previous limit comes back on
    exit, so fragmentation left by earlier cases is not counted against later ones."""
    try:
        import resource
    except ImportError:
        yield None
        return
    size = _status_kib("VmSize")
    if size is None:
        yield None
        return
    old = resource.getrlimit(resource.RLIMIT_AS)
    limit = size * 1024 + budget
    if old[1] != resource.RLIM_INFINITY:
        limit = min(limit, old[1])
    resource.setrlimit(resource.RLIMIT_AS, (limit, old[1]))
    try:
        yield limit
    finally:
        resource.setrlimit(resource.RLIMIT_AS, old)


def guarded(
    pte: bytes,
    ptd: bytes | None,
    inputs: dict[str, list[Any]],
    meter: PeakMeter,
    cap: int = DEFAULT_CAP,
    slack: int = DEFAULT_SLACK,
    options: dict[str, Any] | None = None,
) -> Outcome:
    """:func:`run_files` under both memory measures (peak growth and address-space cap)."""
    run = functools.partial(run_files, pte, ptd, inputs, cap, options=options)
    with address_space_limit(2 * peak_limit(cap, slack)):
        return measured(run, meter, cap, slack)


# --------------------------------------------------------------------------------------
# workers and the watchdog


def _worker(
    wid: int,
    seed: int,
    indices: list[int],
    fixtures: list[str] | None,
    cap: int,
    slack: int,
    progress: Any,
    results: Any,
    focus: str | None = None,
) -> None:
    """Run cases ``indices`` in order; report progress (index, start time) and outcomes."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)  # torch's and ExecuTorch's C++ messages
    index = -1
    try:
        import torch

        torch.set_num_threads(1)
        seeds = load_seeds(fixtures)
        meter = PeakMeter()
        # warm up every seed once so imports and kernel caches are not counted
        for s in seeds.values():
            run_files(s.pte, s.ptd, s.inputs, cap, options=s.options)
        counts: Counter[str] = Counter()
        for index in indices:
            case = draw_case(seeds, case_rng(seed, index), focus)
            pte, ptd = case.files(seeds)
            s = seeds[case.seed]
            progress[2 * wid] = index
            progress[2 * wid + 1] = time.time()
            outcome = guarded(pte, ptd, s.inputs, meter, cap, slack, {**s.options, **case.options})
            counts[f"{outcome.status}:{outcome.stage}"] += 1
            if outcome.is_finding or outcome.status == "kernel_alloc":
                results.put(("finding", wid, index, case.to_json(), dataclasses.asdict(outcome)))
            if sum(counts.values()) >= 50:  # a crash loses at most the last 50 counts
                results.put(("counts", wid, index, dict(counts), None))
                counts.clear()
    except BaseException:
        # the harness itself failed (not a case): say why before the process ends
        results.put(("died", wid, index, _scrub(traceback.format_exc())[-3000:], None))
        raise
    progress[2 * wid + 1] = 0.0
    results.put(("counts", wid, -1, dict(counts), None))
    results.put(("done", wid, -1, None, None))


def fuzz(
    cases: int,
    workers: int = 2,
    seed: int = 0,
    start: int = 0,
    out: Path | None = None,
    fixtures: list[str] | None = None,
    cap: int = DEFAULT_CAP,
    slack: int = DEFAULT_SLACK,
    timeout: float = DEFAULT_TIMEOUT,
    time_budget: float | None = None,
    quiet: bool = False,
    focus: str | None = None,
) -> dict[str, Any]:
    """Run cases ``start .. start + cases - 1`` of ``seed`` on ``workers`` processes
    (``focus``: see :func:`draw_case`)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    progress = ctx.Array("d", 2 * workers, lock=False)
    results = ctx.Queue()
    todo = {w: list(range(start + w, start + cases, workers)) for w in range(workers)}
    procs: dict[int, Any] = {}
    findings: list[dict[str, Any]] = []
    kernel_allocs: list[dict[str, Any]] = []
    counts: Counter[str] = Counter()
    done: set[int] = set()
    t0 = time.time()
    last_report = t0

    def launch(w: int) -> None:
        progress[2 * w] = -1
        progress[2 * w + 1] = 0.0
        p = ctx.Process(
            target=_worker,
            args=(w, seed, todo[w], fixtures, cap, slack, progress, results, focus),
            daemon=True,
        )
        p.start()
        procs[w] = p

    def record(kind: str, index: int, case: dict[str, Any] | None, outcome: dict[str, Any]) -> None:
        if kind in ("hang", "crash"):  # the worker counted every other outcome itself
            counts[f"{kind}:{outcome.get('stage', '?')}"] += 1
        entry = {"index": index, "seed": seed, "case": case, "outcome": outcome}
        if kind == "kernel_alloc":
            kernel_allocs.append(entry)
            if out is not None and case is not None:
                save_finding(out, entry)
            return
        findings.append(entry)
        if out is not None and case is not None:
            save_finding(out, entry)
        if not quiet:
            print(f"FINDING {kind} case {index}: {outcome.get('detail', '')[:300]}", flush=True)

    def resume_after(w: int, index: int) -> None:
        rest = [i for i in todo[w] if i > index]
        todo[w] = rest
        if rest:
            launch(w)
        else:
            done.add(w)

    for w in range(workers):
        if todo[w]:
            launch(w)
        else:
            done.add(w)
    stopped = False
    seeds_for_cases: dict[str, Seed] | None = None
    while len(done) < workers:
        with contextlib.suppress(Exception):
            while True:
                kind, w, index, payload, outcome = results.get(timeout=0.1)
                if kind == "counts":
                    counts.update(payload)
                elif kind == "finding":
                    record(outcome["status"], index, payload, outcome)
                elif kind == "done":
                    done.add(w)
                elif kind == "died":
                    print(f"worker {w} failed at case {index}:\n{payload}", flush=True)
        now = time.time()
        for w, p in list(procs.items()):
            if w in done:
                continue
            index = int(progress[2 * w])
            began = progress[2 * w + 1]
            if began and now - began > timeout and p.is_alive():
                p.kill()
                p.join()
                if seeds_for_cases is None:
                    seeds_for_cases = load_seeds(fixtures)
                case = draw_case(seeds_for_cases, case_rng(seed, index), focus).to_json()
                record(
                    "hang",
                    index,
                    case,
                    {"status": "hang", "stage": "?", "detail": f"over {timeout} s"},
                )
                resume_after(w, index)
            elif not p.is_alive() and w not in done:
                # the worker died without saying done: the case it was running crashed it
                with contextlib.suppress(Exception):
                    while True:
                        kind, w2, i2, payload, outcome = results.get(timeout=0.2)
                        if kind == "counts":
                            counts.update(payload)
                        elif kind == "finding":
                            record(outcome["status"], i2, payload, outcome)
                        elif kind == "done":
                            done.add(w2)
                if w in done:
                    continue
                if index < 0:
                    raise RuntimeError(f"worker {w} died during warm-up (exit code {p.exitcode})")
                if seeds_for_cases is None:
                    seeds_for_cases = load_seeds(fixtures)
                case = draw_case(seeds_for_cases, case_rng(seed, index), focus).to_json()
                record(
                    "crash",
                    index,
                    case,
                    {"status": "crash", "stage": "?", "detail": f"exit code {p.exitcode}"},
                )
                resume_after(w, index)
        if time_budget is not None and now - t0 > time_budget and not stopped:
            stopped = True
            for w, p in procs.items():
                if w not in done:
                    p.kill()
                    p.join()
                    done.add(w)
        if not quiet and now - last_report > 30:
            last_report = now
            total = sum(counts.values())
            print(f"[{now - t0:7.0f} s] {total} cases, {len(findings)} findings", flush=True)
    for p in procs.values():
        p.join(timeout=5)
    total = sum(v for k, v in counts.items())
    return {
        "seed": seed,
        "requested": cases,
        "cases": total,  # outcomes received (a crash loses up to 50 of its worker's counts)
        "seconds": round(time.time() - t0, 1),
        "findings": findings,
        "kernel_allocs": kernel_allocs,
        "outcomes": dict(sorted(counts.items())),
        "stopped_by_time": stopped,
        **({"focus": focus} if focus else {}),
    }


def save_finding(out: Path, entry: dict[str, Any]) -> Path:
    """Write a finding as a corpus entry: ``NAME.pte`` (the mutated file), ``NAME.ptd`` when
    the edits touched the data file, and ``NAME.json`` (fixture, edits, what happened)."""
    seeds = _seed_cache()
    case = Case(**entry["case"])
    pte, ptd = case.files(seeds)
    outcome = entry["outcome"]
    digest = hashlib.sha256(pte + (ptd or b"")).hexdigest()[:10]
    stem = out / f"{outcome['status']}-{case.seed}-{digest}"
    out.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".pte").write_bytes(pte)
    if ptd is not None and case.ptd_edits:
        stem.with_suffix(".ptd").write_bytes(ptd)
    first = (outcome.get("detail") or "").splitlines()[:1]
    meta = {
        "fixture": case.seed,
        "pte_edits": case.pte_edits,
        "ptd_edits": case.ptd_edits,
        **({"options": case.options} if case.options else {}),
        "found": f"{outcome['status']} at {outcome.get('stage', '?')}: {first[0] if first else ''}",
        "case": entry.get("index"),
        "seed": entry.get("seed"),
        "detail": outcome.get("detail", ""),
    }
    stem.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    return stem


_SEEDS: dict[str, Seed] | None = None


def _seed_cache() -> dict[str, Seed]:
    global _SEEDS
    if _SEEDS is None:
        _SEEDS = load_seeds()
    return _SEEDS


# --------------------------------------------------------------------------------------
# corpus entries


def corpus_files(path: Path) -> tuple[bytes, bytes | None, dict[str, list[Any]], dict[str, Any]]:
    """A corpus entry ``NAME.pte`` (+ ``NAME.ptd``, ``NAME.json``): its files and inputs.

    The JSON names the fixture whose inputs (and ``.ptd`` when the entry has none) it uses.
    """
    meta = json.loads(path.with_suffix(".json").read_text())
    seeds = _seed_cache()
    s = seeds[meta["fixture"]]
    pte = path.read_bytes()
    ptd_path = path.with_suffix(".ptd")
    ptd = ptd_path.read_bytes() if ptd_path.exists() else s.ptd
    return pte, ptd, s.inputs, meta


def replay(path: Path, cap: int = DEFAULT_CAP, meter: PeakMeter | None = None) -> Outcome:
    """Run one corpus entry (with the load options it names) under the memory measures."""
    pte, ptd, inputs, meta = corpus_files(path)
    options = {**_seed_cache()[meta["fixture"]].options, **meta.get("options", {})}
    return guarded(pte, ptd, inputs, meter or PeakMeter(), cap, options=options)


def minimize(case: Case, status: str, seeds: dict[str, Seed], cap: int = DEFAULT_CAP) -> Case:
    """Drop edits one at a time while the case still gives a finding of kind ``status``."""
    s = seeds[case.seed]
    for attr in ("pte_edits", "ptd_edits"):
        i = 0
        while i < len(getattr(case, attr)):
            edits = list(getattr(case, attr))
            trial = dataclasses.replace(case, **{attr: edits[:i] + edits[i + 1 :]})
            pte, ptd = trial.files(seeds)
            if (
                run_files(pte, ptd, s.inputs, cap, options={**s.options, **case.options}).status
                == status
            ):
                case = trial
            else:
                i += 1
    return case


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--start", type=int, default=0, help="first case index")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2)))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fixtures", nargs="*", help="only these fixtures (default: all)")
    ap.add_argument(
        "--focus",
        choices=FOCUSES,
        default=None,
        help="payload: edit only fields of delegate payloads; ptd: edit only .ptd files",
    )
    ap.add_argument("--cap", type=int, default=DEFAULT_CAP, help="max_planned_bytes (bytes)")
    ap.add_argument("--slack", type=int, default=DEFAULT_SLACK)
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT)
    ap.add_argument("--time-budget", type=float, default=None, help="stop after this many seconds")
    ap.add_argument("--out", type=Path, default=None, help="write findings here")
    ap.add_argument("--json", type=Path, default=None, help="write the summary here")
    ap.add_argument("--replay", type=Path, nargs="*", help="run corpus entries (NAME.pte)")
    ap.add_argument("--case", type=int, default=None, help="run (and show) one case in-process")
    ap.add_argument("--show", action="store_true")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)

    if args.replay:
        bad = 0
        for path in args.replay:
            o = replay(path, args.cap)
            bad += o.is_finding
            print(f"{path.name}: {o.status} at {o.stage} ({o.seconds:.3f} s) {o.detail[:300]}")
        return 1 if bad else 0
    if args.case is not None:
        seeds = load_seeds(args.fixtures)
        case = draw_case(seeds, case_rng(args.seed, args.case), args.focus)
        if args.show:
            print(json.dumps(case.to_json(), indent=1))
        pte, ptd = case.files(seeds)
        s = seeds[case.seed]
        o = run_files(pte, ptd, s.inputs, args.cap, options={**s.options, **case.options})
        print(f"{o.status} at {o.stage} ({o.seconds:.3f} s): {o.detail}")
        if o.is_finding:
            small = minimize(case, o.status, seeds, args.cap)
            print("minimized:", json.dumps(small.to_json()))
            if args.out is not None:
                path = save_finding(
                    args.out,
                    {
                        "index": args.case,
                        "seed": args.seed,
                        "case": small.to_json(),
                        "outcome": dataclasses.asdict(o),
                    },
                )
                print("saved", path)
        return 1 if o.is_finding else 0
    summary = fuzz(
        args.cases,
        args.workers,
        args.seed,
        args.start,
        args.out,
        args.fixtures,
        args.cap,
        args.slack,
        args.timeout,
        args.time_budget,
        args.quiet,
        args.focus,
    )
    nf = len(summary["findings"])
    brief = {k: v for k, v in summary.items() if k not in ("findings", "kernel_allocs")}
    print(json.dumps(brief, indent=1))
    print(
        f"{summary['cases']} cases, {nf} findings, {len(summary['kernel_allocs'])} kernel allocations"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    return 1 if nf else 0


if __name__ == "__main__":
    sys.exit(main())
