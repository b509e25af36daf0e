"""Flatbuffer tables of ``program.fbs`` -> the dataclasses of :mod:`.program`.

Field slots follow the schema's declaration order (a union takes two slots: its type,
then its value). Decoding checks only that the bytes can be read; cross references are
checked by :mod:`.validate`.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Callable

from ..errors import PteFormatError
from . import program as p
from .flatbuf import Buffer, Table

_VALUE_PATHS = {code: name[0].lower() + name[1:] for code, name in p.KERNEL_TYPE_NAMES.items()}
_VALUE_PATHS[5] = "tensor"
_INSTRUCTION_PATHS = {
    1: "kernel_call",
    2: "delegate_call",
    3: "move_call",
    4: "jump_false_call",
    5: "free_call",
}


def _str(t: Table, slot: int, name: str) -> str:
    s = t.string(slot, name)
    return "" if s is None else s


def _ints(t: Table, slot: int, kind: str, name: str) -> tuple[int, ...]:
    v = t.scalars(slot, kind, name)
    return () if v is None else v


def _allocation(t: Table) -> p.AllocationDetails:
    low = t.int_(1, "u32", "memory_offset_low")
    high = t.int_(2, "u32", "memory_offset_high")
    return p.AllocationDetails(t.int_(0, "u32", "memory_id"), low | (high << 32))


def _extra(t: Table) -> p.ExtraTensorInfo:
    return p.ExtraTensorInfo(
        mutable_data_segments_idx=t.int_(0, "u64", "mutable_data_segments_idx"),
        fully_qualified_name=t.string(1, "fully_qualified_name"),
        location=t.int_(2, "i8", "location"),
        device_type=t.int_(3, "i8", "device_type"),
        device_index=t.int_(4, "i8", "device_index"),
    )


def _tensor(t: Table) -> p.Tensor:
    alloc = t.table(6, "allocation_info")
    extra = t.table(9, "extra_tensor_info")
    return p.Tensor(
        scalar_type=t.int_(0, "i8", "scalar_type"),
        storage_offset=t.int_(1, "i32", "storage_offset"),
        sizes=_ints(t, 2, "i32", "sizes"),
        dim_order=_ints(t, 3, "u8", "dim_order"),
        requires_grad=t.bool_(4, "requires_grad"),
        data_buffer_idx=t.int_(5, "u32", "data_buffer_idx"),
        allocation_info=None if alloc is None else _allocation(alloc),
        layout=t.int_(7, "i8", "layout"),
        shape_dynamism=t.int_(8, "i8", "shape_dynamism"),
        extra_tensor_info=None if extra is None else _extra(extra),
    )


def _evalue(t: Table) -> p.EValue:
    code, v = t.union(0, "val", _VALUE_PATHS)
    if code == 0 or code == 1:
        return p.Null()
    if v is None:
        raise PteFormatError(t.path + ".val", f"union type {code} has no value")
    if code == 2:
        return p.Int(v.int_(0, "i64", "int_val"))
    if code == 3:
        return p.Bool(v.bool_(0, "bool_val"))
    if code == 4:
        return p.Double(v.f64(0, "double_val"))
    if code == 5:
        return _tensor(v)
    if code == 6:
        return p.String(_str(v, 0, "string_val"))
    if code == 7:
        return p.IntList(_ints(v, 0, "i64", "items"))
    if code == 8:
        items = v.scalars(0, "f64", "items")
        return p.DoubleList(() if items is None else tuple(float(x) for x in items))
    if code == 9:
        items = v.scalars(0, "bool", "items")
        return p.BoolList(() if items is None else tuple(bool(x) for x in items))
    if code == 10:
        return p.TensorList(_ints(v, 0, "i32", "items"))
    if code == 11:
        return p.OptionalTensorList(_ints(v, 0, "i32", "items"))
    raise PteFormatError(t.path + ".val", f"unknown value kind {code} (KernelTypes has 1..11)")


# Fast paths for the tables a plan has most of (values, tensors, kernel calls): the same
# reads as the decoders above, through Buffer's field helpers, without a Table per table.
# Each returns None for anything it does not handle or cannot read, and the decoder above
# reads that item (and raises the error, with its path).


_ListKind = type[p.IntList] | type[p.TensorList] | type[p.OptionalTensorList]
_FAST_LISTS: dict[int, tuple[str, _ListKind]] = {
    7: ("i64", p.IntList),
    10: ("i32", p.TensorList),
    11: ("i32", p.OptionalTensorList),
}


def _fast_evalue(buf: Buffer, pos: int) -> p.EValue | None:
    offsets = buf.field_offsets(pos)
    if offsets is None:
        return None
    code = buf.scalar_at(pos, offsets, 0, "u8")
    if code != 1 and code != 2 and code != 3 and code != 5 and code not in _FAST_LISTS:
        return None
    at = buf.table_at(pos, offsets, 1)
    if code == 1:  # (a value given all the same must be readable, as for the decoder above)
        return p.Null() if at == 0 or (at > 0 and buf.field_offsets(at) is not None) else None
    if at <= 0:
        return None
    if code == 5:
        return _fast_tensor(buf, at)
    inner = buf.field_offsets(at)
    if inner is None:
        return None
    if code == 2:
        value = buf.scalar_at(at, inner, 0, "i64")
        return None if value is None else p.Int(int(value))
    if code == 3:
        flag = buf.scalar_at(at, inner, 0, "bool", False)
        return None if flag is None else p.Bool(bool(flag))
    kind, make = _FAST_LISTS[code]
    items = buf.scalars_at(at, inner, 0, kind)
    return None if items is None else make(items)


# A tensor table's inline fields, by slot: struct letter, size, value when absent. Slots
# 2, 3 and 6 hold the offsets of its sizes, its dim order and its allocation info.
_TENSOR_FIELDS = (
    (0, "b", 1, 0),  # scalar_type
    (1, "i", 4, 0),  # storage_offset
    (2, "I", 4, 0),  # -> sizes
    (3, "I", 4, 0),  # -> dim_order
    (4, "?", 1, False),  # requires_grad
    (5, "I", 4, 0),  # data_buffer_idx
    (6, "I", 4, 0),  # -> allocation_info
    (7, "b", 1, 0),  # layout
    (8, "b", 1, 0),  # shape_dynamism
)
_TENSOR_DEFAULTS = tuple(f[3] for f in _TENSOR_FIELDS)
_TensorReader = Callable[[Buffer, int], "p.Tensor | None"]
# readers by field layout (a program has a handful; a file made to have many only empties
# this now and then)
_tensor_readers: dict[tuple[int, ...], _TensorReader | None] = {}
_TENSOR_READERS = 256


def _tensor_reader(offsets: tuple[int, ...]) -> _TensorReader | None:
    """A reader of the tensor tables whose vtable gives ``offsets``: every inline field in
    one unpacking, the table's extent checked once; None for a layout it does not handle
    (extra tensor info, fields sharing bytes: the table decoder reads those)."""
    if len(offsets) > 9 and offsets[9]:
        return None
    present = sorted(
        (offsets[slot], slot, letter, size)
        for slot, letter, size, _ in _TENSOR_FIELDS
        if slot < len(offsets) and offsets[slot]
    )
    fmt, end = "<", 0
    for off, _, letter, size in present:
        if off < end:
            return None
        fmt += f"{off - end}x{letter}"
        end = off + size
    unpack = struct.Struct(fmt).unpack_from
    index = {slot: k for k, (_, slot, _, _) in enumerate(present)}
    get = operator.itemgetter(*(index.get(slot, len(present) + slot) for slot in range(9)))
    o_sizes, o_order, o_alloc = (offsets[k] if k < len(offsets) else 0 for k in (2, 3, 6))

    def read(buf: Buffer, pos: int) -> p.Tensor | None:
        if pos + end > buf.size:
            return None
        (scalar_type, storage_offset, r_sizes, r_order, grad, idx, r_alloc, layout, dyn) = get(
            unpack(buf.data, pos) + _TENSOR_DEFAULTS
        )
        sizes: tuple[int, ...] | None = ()
        if o_sizes:
            sizes = buf.scalars_from(pos + o_sizes + r_sizes, "i32") if r_sizes else None
        dim_order: tuple[int, ...] | None = ()
        if o_order:
            dim_order = buf.scalars_from(pos + o_order + r_order, "u8") if r_order else None
        if sizes is None or dim_order is None:
            return None
        alloc = None
        if o_alloc:
            if not r_alloc:
                return None
            alloc = _fast_allocation(buf, pos + o_alloc + r_alloc)
            if alloc is None:
                return None
        return p.Tensor(
            scalar_type, storage_offset, sizes, dim_order, grad, idx, alloc, layout, dyn, None
        )

    return read


def _fast_allocation(buf: Buffer, at: int) -> p.AllocationDetails | None:
    inner = buf.field_offsets(at)
    if inner is None:
        return None
    memory_id = buf.scalar_at(at, inner, 0, "u32")
    low = buf.scalar_at(at, inner, 1, "u32")
    high = buf.scalar_at(at, inner, 2, "u32")
    if memory_id is None or low is None or high is None:
        return None
    return p.AllocationDetails(int(memory_id), int(low) | (int(high) << 32))


def _fast_tensor(buf: Buffer, pos: int) -> p.Tensor | None:
    offsets = buf.field_offsets(pos)
    if offsets is None:
        return None
    try:
        reader = _tensor_readers[offsets]
    except KeyError:
        if len(_tensor_readers) >= _TENSOR_READERS:
            _tensor_readers.clear()
        reader = _tensor_readers[offsets] = _tensor_reader(offsets)
    # (a layout the reader does not handle: the decoder above)
    return None if reader is None else reader(buf, pos)


def _fast_instruction(buf: Buffer, pos: int) -> p.Instruction | None:
    offsets = buf.field_offsets(pos)
    if offsets is None:
        return None
    code = buf.scalar_at(pos, offsets, 0, "u8")
    if code != 1 and code != 2:
        return None  # (other instructions: the decoder above)
    at = buf.table_at(pos, offsets, 1)
    if at <= 0:
        return None
    inner = buf.field_offsets(at)
    if inner is None:
        return None
    index = buf.scalar_at(at, inner, 0, "i32")  # the operator's, or the delegate's
    args = buf.scalars_at(at, inner, 1, "i32")
    if index is None or args is None:
        return None
    return p.KernelCall(int(index), args) if code == 1 else p.DelegateCall(int(index), args)


def _instruction(t: Table) -> p.Instruction:
    code, v = t.union(0, "instr_args", _INSTRUCTION_PATHS)
    if v is None:
        raise PteFormatError(t.path + ".instr_args", "instruction has no arguments")
    if code == 1:
        return p.KernelCall(v.int_(0, "i32", "op_index"), _ints(v, 1, "i32", "args"))
    if code == 2:
        return p.DelegateCall(v.int_(0, "i32", "delegate_index"), _ints(v, 1, "i32", "args"))
    if code == 3:
        return p.MoveCall(v.int_(0, "i32", "move_from"), v.int_(1, "i32", "move_to"))
    if code == 4:
        return p.JumpFalseCall(
            v.int_(0, "i32", "cond_value_index"), v.int_(1, "i32", "destination_instruction")
        )
    if code == 5:
        return p.FreeCall(v.int_(0, "i32", "value_index"))
    raise PteFormatError(t.path + ".instr_args", f"unknown instruction kind {code} (1..5)")


def _frame(t: Table) -> p.Frame:
    return p.Frame(
        filename=t.string(0, "filename"),
        lineno=t.int_(1, "i32", "lineno"),
        name=t.string(2, "name"),
        context=t.string(3, "context"),
    )


def _frame_list(t: Table) -> tuple[p.Frame, ...] | None:
    return t.tables(0, "items", _frame)


def _chain(t: Table) -> p.Chain:
    return p.Chain(
        inputs=_ints(t, 0, "i32", "inputs"),
        outputs=_ints(t, 1, "i32", "outputs"),
        instructions=t.tables(2, "instructions", _instruction, fast=_fast_instruction) or (),
        stacktrace=t.tables(3, "stacktrace", _frame_list),
    )


def _operator(t: Table) -> p.Operator:
    return p.Operator(_str(t, 0, "name"), _str(t, 1, "overload"))


def _compile_spec(t: Table) -> p.CompileSpec:
    span = t.bytes_span(1, "value")
    value = b"" if span is None else bytes(t.buf.data[span[0] : span[0] + span[1]])
    return p.CompileSpec(_str(t, 0, "key"), value)


def _delegate(t: Table) -> p.BackendDelegate:
    ref = t.table(1, "processed")
    if ref is None:
        raise PteFormatError(t.path + ".processed", "delegate has no data reference")
    return p.BackendDelegate(
        id=_str(t, 0, "id"),
        processed=p.BackendDelegateDataReference(
            ref.int_(0, "i8", "location"), ref.int_(1, "u32", "index")
        ),
        compile_specs=t.tables(2, "compile_specs", _compile_spec) or (),
    )


def _buffer_device(t: Table) -> p.NonConstBufferDevice:
    return p.NonConstBufferDevice(
        t.int_(0, "i32", "buffer_idx"),
        t.int_(1, "i8", "device_type"),
        t.int_(2, "i8", "device_index"),
    )


def _container(t: Table) -> p.ContainerMetadata:
    return p.ContainerMetadata(t.string(0, "encoded_inp_str"), t.string(1, "encoded_out_str"))


def _plan(t: Table) -> p.ExecutionPlan:
    meta = t.table(1, "container_meta_type")
    return p.ExecutionPlan(
        name=_str(t, 0, "name"),
        container_meta_type=None if meta is None else _container(meta),
        values=t.tables(2, "values", _evalue, fast=_fast_evalue) or (),
        inputs=_ints(t, 3, "i32", "inputs"),
        outputs=_ints(t, 4, "i32", "outputs"),
        chains=t.tables(5, "chains", _chain) or (),
        operators=t.tables(6, "operators", _operator) or (),
        delegates=t.tables(7, "delegates", _delegate) or (),
        non_const_buffer_sizes=_ints(t, 8, "i64", "non_const_buffer_sizes"),
        non_const_buffer_device=t.tables(9, "non_const_buffer_device", _buffer_device),
    )


def _data_ref(t: Table, slot: int, name: str) -> p.DataRef:
    span = t.bytes_span(slot, name)
    return p.DataRef(0, 0) if span is None else p.DataRef(span[0], span[1])


def _segment(t: Table) -> p.DataSegment:
    return p.DataSegment(t.int_(0, "u64", "offset"), t.int_(1, "u64", "size"))


def _subsegments(t: Table) -> p.SubsegmentOffsets:
    return p.SubsegmentOffsets(t.int_(0, "u32", "segment_index"), _ints(t, 1, "u64", "offsets"))


def _named(t: Table) -> p.NamedData:
    return p.NamedData(_str(t, 0, "key"), t.int_(1, "u32", "segment_index"))


def decode_program(buf: Buffer) -> p.Program:
    """Decode the root ``Program`` table of a ``.pte`` flatbuffer."""
    root = buf.root("")
    const_seg = root.table(5, "constant_segment")
    return p.Program(
        version=root.int_(0, "u32", "version"),
        execution_plan=root.tables(1, "execution_plan", _plan) or (),
        constant_buffer=root.tables(2, "constant_buffer", lambda b: _data_ref(b, 0, "storage"))
        or (),
        backend_delegate_data=root.tables(
            3, "backend_delegate_data", lambda b: _data_ref(b, 0, "data")
        )
        or (),
        segments=root.tables(4, "segments", _segment) or (),
        constant_segment=None if const_seg is None else _subsegments(const_seg),
        mutable_data_segments=root.tables(6, "mutable_data_segments", _subsegments) or (),
        named_data=root.tables(7, "named_data", _named) or (),
    )
