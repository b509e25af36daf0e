"""ETDump, ExecuTorch's record of what a run did, as frozen dataclasses: written and read.

The schema is ExecuTorch's ``etdump_schema_flatcc.fbs`` (file identifier ``ED00``, files
size-prefixed): an :class:`ETDump` holds one :class:`RunData` per run (a method load, an
execute), each a list of events: :class:`ProfileEvent` (a named span with start and end
times, in nanoseconds here), :class:`DebugEvent` (a value an instruction produced, a
:class:`Value`) and :class:`AllocationEvent`. A tensor in a debug event is described by a
:class:`TensorRef`; its bytes live in a separate *debug buffer* at ``offset``.

:func:`encode_etdump` writes the bytes ExecuTorch's ``ETDumpGen`` writes (ExecuTorch's
``Inspector`` reads them); :func:`decode_etdump` reads them back (any ETDump, ExecuTorch's
included), raising :class:`~ptexec.errors.PteFormatError` with the field's path for a
malformed one. Fields keep the schema's names and defaults (``-1`` for an unset
instruction or delegate id). Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PteFormatError
from .flatbuf import Buffer, Table
from .flatbuild import Builder

__all__ = [
    "FILE_IDENTIFIER",
    "RUN_OUTPUT_CHAIN",
    "VALUE_TYPE_NAMES",
    "AllocationEvent",
    "DebugEvent",
    "ETDump",
    "Event",
    "ProfileEvent",
    "RunData",
    "TensorRef",
    "Value",
    "decode_etdump",
    "encode_etdump",
]

FILE_IDENTIFIER = b"ED00"

# enum ValueType : byte
NULL, INT, BOOL, FLOAT, DOUBLE, TENSOR, TENSOR_LIST, STRING = range(8)
VALUE_TYPE_NAMES = {
    NULL: "null",
    INT: "int",
    BOOL: "bool",
    FLOAT: "float",
    DOUBLE: "double",
    TENSOR: "tensor",
    TENSOR_LIST: "tensor_list",
    STRING: "string",
}

# the chain index ExecuTorch gives the debug events of a run's outputs (-1 as a ulong)
RUN_OUTPUT_CHAIN = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class TensorRef:
    """A tensor in a debug event: scalar type code, sizes, strides (in elements) and the
    byte offset of its data in the debug buffer."""

    scalar_type: int
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int


ValueData = int | float | bool | str | TensorRef | tuple[TensorRef, ...] | None


@dataclass(frozen=True, slots=True)
class Value:
    """One logged value: ``kind`` (a ValueType code: :data:`TENSOR`, :data:`INT`, ...)
    and its ``data`` (a :class:`TensorRef`, a tuple of them, a number, a string or None).
    ``output`` marks the values of a run's outputs (None: not said)."""

    kind: int
    data: ValueData = None
    output: bool | None = None

    @classmethod
    def of(cls, data: ValueData, output: bool | None = None) -> Value:
        """The value holding ``data``; a Python float is a double (``FLOAT`` is 32-bit)."""
        if data is None:
            return cls(NULL, None, output)
        if isinstance(data, TensorRef):
            return cls(TENSOR, data, output)
        if isinstance(data, tuple):
            return cls(TENSOR_LIST, data, output)
        if isinstance(data, bool):
            return cls(BOOL, data, output)
        if isinstance(data, int):
            return cls(INT, data, output)
        if isinstance(data, float):
            return cls(DOUBLE, data, output)
        if isinstance(data, str):
            return cls(STRING, data, output)
        raise TypeError(f"an ETDump value cannot hold a {type(data).__name__}")

    @property
    def kind_name(self) -> str:
        return VALUE_TYPE_NAMES.get(self.kind, f"type {self.kind}")


@dataclass(frozen=True, slots=True)
class ProfileEvent:
    """A timed span: an instruction (``instruction_id`` in chain ``chain_index``), a
    delegate's own event (``delegate_debug_id_*``) or a framework step (chain -1)."""

    name: str | None
    chain_index: int
    instruction_id: int
    start_time: int
    end_time: int
    delegate_debug_id_int: int = -1
    delegate_debug_id_str: str | None = None
    delegate_debug_metadata: bytes | None = None


@dataclass(frozen=True, slots=True)
class DebugEvent:
    """A value produced by instruction ``instruction_id`` (or a run output, chain
    :data:`RUN_OUTPUT_CHAIN`)."""

    chain_index: int
    instruction_id: int
    debug_entry: Value
    name: str | None = None
    delegate_debug_id_int: int = -1
    delegate_debug_id_str: str | None = None


@dataclass(frozen=True, slots=True)
class AllocationEvent:
    """``allocation_size`` bytes taken from allocator ``allocator_id`` of the run."""

    allocator_id: int
    allocation_size: int


Event = ProfileEvent | DebugEvent | AllocationEvent


@dataclass(frozen=True, slots=True)
class RunData:
    """The events of one run, in the order they happened."""

    name: str | None
    events: tuple[Event, ...]
    bundled_input_index: int = -1
    allocators: tuple[str | None, ...] | None = None


@dataclass(frozen=True, slots=True)
class ETDump:
    """A whole ETDump: its runs, and the schema version (ExecuTorch writes 0)."""

    run_data: tuple[RunData, ...]
    version: int = 0


# ---- writing ---------------------------------------------------------------------------


def _tensor(b: Builder, t: TensorRef) -> int:
    sizes = b.scalars("i64", t.sizes)
    strides = b.scalars("i64", t.strides)
    b.start_table()
    b.add_scalar(0, "i8", t.scalar_type)
    b.add_offset(1, sizes)
    b.add_offset(2, strides)
    b.add_scalar(3, "i64", t.offset)
    return b.end_table()


def _one_field(b: Builder, kind: str, value: int | float | bool) -> int:
    b.start_table()
    b.add_scalar(0, kind, value)
    return b.end_table()


def _value(b: Builder, v: Value) -> int:
    tensor = tensor_list = int_value = float_value = double_value = bool_value = None
    data = v.data
    if v.kind == TENSOR:
        if not isinstance(data, TensorRef):
            raise TypeError("a tensor value needs a TensorRef")
        tensor = _tensor(b, data)
    elif v.kind == TENSOR_LIST:
        if not isinstance(data, tuple):
            raise TypeError("a tensor list value needs a tuple of TensorRefs")
        items = b.offsets([_tensor(b, t) for t in data])
        b.start_table()
        b.add_offset(0, items)
        tensor_list = b.end_table()
    elif v.kind == INT:
        int_value = _one_field(b, "i64", int(data))  # type: ignore[arg-type]
    elif v.kind == FLOAT:
        float_value = _one_field(b, "f32", float(data))  # type: ignore[arg-type]
    elif v.kind == DOUBLE:
        double_value = _one_field(b, "f64", float(data))  # type: ignore[arg-type]
    elif v.kind == BOOL:
        bool_value = _one_field(b, "bool", bool(data))
    elif v.kind not in (NULL, STRING):
        raise ValueError(f"unknown value type {v.kind}")
    # (the schema's Value has no field for a string: its String table is unused)
    output = None if v.output is None else _one_field(b, "bool", v.output)
    b.start_table()
    b.add_scalar(0, "i8", v.kind)
    b.add_offset(1, tensor)
    b.add_offset(2, tensor_list)
    b.add_offset(3, int_value)
    b.add_offset(4, float_value)
    b.add_offset(5, double_value)
    b.add_offset(6, bool_value)
    b.add_offset(7, output)
    return b.end_table()


def _string(b: Builder, text: str | None) -> int | None:
    return None if text is None else b.string(text)


def _event(b: Builder, e: Event) -> int:
    if isinstance(e, ProfileEvent):
        name = _string(b, e.name)
        delegate_str = _string(b, e.delegate_debug_id_str)
        metadata = (
            None if e.delegate_debug_metadata is None else b.bytes_vector(e.delegate_debug_metadata)
        )
        b.start_table()
        b.add_offset(0, name)
        b.add_scalar(1, "i32", e.chain_index)
        b.add_scalar(2, "i32", e.instruction_id, default=-1)
        b.add_scalar(3, "i32", e.delegate_debug_id_int, default=-1)
        b.add_offset(4, delegate_str)
        b.add_offset(5, metadata)
        b.add_scalar(6, "u64", e.start_time)
        b.add_scalar(7, "u64", e.end_time)
        inner, slot = b.end_table(), 0
    elif isinstance(e, DebugEvent):
        entry = _value(b, e.debug_entry)
        delegate_str = _string(b, e.delegate_debug_id_str)
        name = _string(b, e.name)
        b.start_table()
        b.add_scalar(0, "u64", e.chain_index)
        b.add_scalar(1, "i32", e.instruction_id, default=-1)
        b.add_offset(2, entry)
        b.add_scalar(3, "i32", e.delegate_debug_id_int, default=-1)
        b.add_offset(4, delegate_str)
        b.add_offset(5, name)
        inner, slot = b.end_table(), 2
    elif isinstance(e, AllocationEvent):
        b.start_table()
        b.add_scalar(0, "i32", e.allocator_id)
        b.add_scalar(1, "u64", e.allocation_size)
        inner, slot = b.end_table(), 1
    else:
        raise TypeError(f"not an ETDump event: {type(e).__name__}")
    b.start_table()
    b.add_offset(slot, inner)
    return b.end_table()


def _run(b: Builder, run: RunData) -> int:
    name = _string(b, run.name)
    allocators = None
    if run.allocators is not None:
        refs = []
        for a in run.allocators:
            a_name = _string(b, a)
            b.start_table()
            b.add_offset(0, a_name)
            refs.append(b.end_table())
        allocators = b.offsets(refs)
    events = b.offsets([_event(b, e) for e in run.events])
    b.start_table()
    b.add_offset(0, name)
    b.add_scalar(1, "i32", run.bundled_input_index, default=-1)
    b.add_offset(2, allocators)
    b.add_offset(3, events)
    return b.end_table()


def encode_etdump(dump: ETDump) -> bytes:
    """The size-prefixed flatbuffer of ``dump`` (what an ``.etdp`` file holds)."""
    b = Builder(4096)
    runs = b.offsets([_run(b, r) for r in dump.run_data])
    b.start_table()
    b.add_scalar(0, "u32", dump.version)
    b.add_offset(1, runs)
    return b.finish(b.end_table(), FILE_IDENTIFIER, size_prefixed=True)


# ---- reading ---------------------------------------------------------------------------


def _read_tensor(t: Table) -> TensorRef:
    return TensorRef(
        t.int_(0, "i8", "scalar_type"),
        t.scalars(1, "i64", "sizes") or (),
        t.scalars(2, "i64", "strides") or (),
        t.int_(3, "i64", "offset"),
    )


def _read_value(t: Table) -> Value:
    kind = t.int_(0, "i8", "val")
    data: ValueData = None

    def sub(slot: int, name: str) -> Table:
        inner = t.table(slot, name)
        if inner is None:
            raise PteFormatError(f"{t.path}.{name}", f"a {VALUE_TYPE_NAMES[kind]} value without it")
        return inner

    if kind == TENSOR:
        data = _read_tensor(sub(1, "tensor"))
    elif kind == TENSOR_LIST:
        data = sub(2, "tensor_list").tables(0, "tensors", _read_tensor) or ()
    elif kind == INT:
        data = sub(3, "int_value").int_(0, "i64", "int_val")
    elif kind == FLOAT:
        data = sub(4, "float_value").f32(0, "float_val")
    elif kind == DOUBLE:
        data = sub(5, "double_value").f64(0, "double_val")
    elif kind == BOOL:
        data = sub(6, "bool_value").bool_(0, "bool_val")
    elif kind not in (NULL, STRING):
        raise PteFormatError(f"{t.path}.val", f"unknown value type {kind}")
    out = t.table(7, "output")
    return Value(kind, data, None if out is None else out.bool_(0, "bool_val"))


def _read_bytes(t: Table, slot: int, name: str) -> bytes | None:
    span = t.bytes_span(slot, name)
    if span is None:
        return None
    start, n = span
    return bytes(t.buf.data[start : start + n])


def _read_event(t: Table) -> Event:
    p = t.table(0, "profile_event")
    if p is not None:
        return ProfileEvent(
            p.string(0, "name"),
            p.int_(1, "i32", "chain_index"),
            p.int_(2, "i32", "instruction_id", -1),
            p.int_(6, "u64", "start_time"),
            p.int_(7, "u64", "end_time"),
            p.int_(3, "i32", "delegate_debug_id_int", -1),
            p.string(4, "delegate_debug_id_str"),
            _read_bytes(p, 5, "delegate_debug_metadata"),
        )
    d = t.table(2, "debug_event")
    if d is not None:
        entry = d.table(2, "debug_entry")
        if entry is None:
            raise PteFormatError(f"{d.path}.debug_entry", "a debug event without its value")
        return DebugEvent(
            d.int_(0, "u64", "chain_index"),
            d.int_(1, "i32", "instruction_id", -1),
            _read_value(entry),
            d.string(5, "name"),
            d.int_(3, "i32", "delegate_debug_id_int", -1),
            d.string(4, "delegate_debug_id_str"),
        )
    a = t.table(1, "allocation_event")
    if a is not None:
        return AllocationEvent(
            a.int_(0, "i32", "allocator_id"), a.int_(1, "u64", "allocation_size")
        )
    raise PteFormatError(t.path, "an event with none of its three kinds")


def _read_run(t: Table) -> RunData:
    allocators = t.tables(2, "allocators", lambda a: a.string(0, "name"))
    return RunData(
        t.string(0, "name"),
        t.tables(3, "events", _read_event) or (),
        t.int_(1, "i32", "bundled_input_index", -1),
        allocators,
    )


def decode_etdump(data: bytes | bytearray | memoryview, size_prefixed: bool = True) -> ETDump:
    """Read an ETDump (size-prefixed, as files are, unless ``size_prefixed=False``)."""
    view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
    if size_prefixed:
        if len(view) < 4:
            raise PteFormatError("size prefix", f"{len(view)} bytes cannot hold an ETDump")
        size = int.from_bytes(view[:4], "little")
        if size > len(view) - 4:
            raise PteFormatError("size prefix", f"says {size} bytes, {len(view) - 4} follow it")
        view = view[4 : 4 + size]
    if len(view) < 8 or bytes(view[4:8]) != FILE_IDENTIFIER:
        got = bytes(view[4:8]) if len(view) >= 8 else b""
        raise PteFormatError("file identifier", f"expected {FILE_IDENTIFIER!r}, got {got!r}")
    root = Buffer(view).root("etdump")
    return ETDump(root.tables(1, "run_data", _read_run) or (), root.int_(0, "u32", "version"))
