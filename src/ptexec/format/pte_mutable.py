"""A program's file with some planned tensors' initial values in entries of their own.

ExecuTorch's exporter stores equal initial values of planned tensors once: tensors whose
values were equal at export (the LayerNorm weights of several layers) share one entry of
the mutable data segment (``data_buffer_idx``). When they must start from different
values (parameters that training made differ), :func:`with_new_entries` gives each
distinct value its own entry without re-serialising the program: the new entries are
appended to the mutable data segment (the file's last, as ExecuTorch's serializer writes
it; another layout is refused), the entry offsets (``mutable_data_segments[0]
.offsets``) are written again after the flatbuffer's end (the field that points to them
is moved there: a flatbuffer offset points forward), each moved tensor's
``data_buffer_idx`` is set in place, and the extended header says where the flatbuffer
and the segments now end and start. Everything else is the original, byte for byte.
Nothing here imports torch.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from ..errors import PteFormatError
from .flatbuf import Buffer
from .header import HEADER_OFFSET
from .pte import PteFile

__all__ = ["ENTRY_ALIGN", "with_new_entries"]

ENTRY_ALIGN = 16  # where a new entry starts in the mutable data segment
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
# field slots of program.fbs's tables
_PROGRAM_PLANS, _PROGRAM_SEGMENTS, _PROGRAM_MUTABLE = 1, 4, 6
_PLAN_VALUES, _EVALUE_VAL, _TENSOR_BUFFER = 2, 1, 5
_SUB_OFFSETS, _SEGMENT_SIZE = 1, 1


def _align(n: int, to: int) -> int:
    return -(-n // to) * to


def _fail(what: str) -> PteFormatError:
    return PteFormatError(
        "mutable_data_segments", f"cannot give values entries of their own: {what}"
    )


class _Reader:
    """Positions of fields in a program's flatbuffer (its decode already validated it)."""

    def __init__(self, flat: memoryview) -> None:
        self.buf = Buffer(flat)

    def fields(self, pos: int) -> tuple[int, ...]:
        found = self.buf.field_offsets(pos)
        if found is None:
            raise _fail(f"no table at {pos}")
        return found

    def field(self, pos: int, slot: int) -> int:
        """Where scalar or offset field ``slot`` of table ``pos`` is (it must be present)."""
        offsets = self.fields(pos)
        if slot >= len(offsets) or not offsets[slot]:
            raise _fail(f"field {slot} of the table at {pos} is not written")
        return pos + offsets[slot]

    def u32(self, at: int) -> int:
        value: int = _U32.unpack_from(self.buf.data, at)[0]
        return value

    def ref(self, pos: int, slot: int) -> int:
        at = self.field(pos, slot)
        return at + self.u32(at)

    def item(self, vector: int, k: int) -> int:
        """Table ``k`` of the vector of tables at ``vector``."""
        n = self.u32(vector)
        if not 0 <= k < n:
            raise _fail(f"item {k} of a vector of {n}")
        at = vector + 4 + 4 * k
        return at + self.u32(at)


def with_new_entries(
    pte: PteFile, moves: Sequence[tuple[int, int, bytes]], keep: Sequence[tuple[int, bytes]]
) -> bytes:
    """The file of ``pte`` in which each ``(plan index, value slot, bytes)`` of ``moves``
    starts from ``bytes`` in a new entry of the mutable data segment (moves with equal
    bytes share one) and each ``(entry index, bytes)`` of ``keep`` is written over that
    entry's bytes in place."""
    header = pte.header
    if header is None or not header.segment_base_offset:
        raise _fail("the file has no extended header or no segments")
    data = pte.data
    flat_end = header.program_size
    r = _Reader(data[:flat_end])
    root = r.u32(0)
    sub = r.item(r.ref(root, _PROGRAM_MUTABLE), 0)
    offsets_field = r.field(sub, _SUB_OFFSETS)
    index = pte.program.mutable_data_segments[0].segment_index
    old_offsets = list(pte.program.mutable_data_segments[0].offsets)
    segment = r.item(r.ref(root, _PROGRAM_SEGMENTS), index)
    size_field = r.field(segment, _SEGMENT_SIZE)
    seg = pte.program.segments[index]
    base = header.segment_base_offset
    ends = [s.offset + s.size for s in pte.program.segments]
    if seg.offset + seg.size != max(ends):  # (ExecuTorch's serializer writes it last)
        raise _fail("the mutable data segment is not the file's last segment")
    # the mutable segment, with the kept values written and the new entries after it
    body = bytearray(data[base + seg.offset : base + seg.offset + seg.size])
    for entry, raw in keep:
        at = old_offsets[entry]
        body[at : at + len(raw)] = raw
    placed: dict[bytes, int] = {}  # bytes -> their new entry
    fields: list[tuple[int, int]] = []  # (position of a data_buffer_idx field, new entry)
    offsets = list(old_offsets)
    for plan, slot, raw in moves:
        if raw not in placed:
            body.extend(bytes(_align(len(body), ENTRY_ALIGN) - len(body)))
            placed[raw] = len(offsets)
            offsets.append(len(body))
            body.extend(raw)
        new_entry = placed[raw]
        value = r.item(r.ref(r.item(r.ref(root, _PROGRAM_PLANS), plan), _PLAN_VALUES), slot)
        fields.append((r.field(r.ref(value, _EVALUE_VAL), _TENSOR_BUFFER), new_entry))
    # the flatbuffer, then the offsets written again after its end (u64s: 8-aligned)
    flat = bytearray(data[:flat_end])
    vector = _align(len(flat) + 4, 8) - 4
    flat.extend(bytes(vector - len(flat)))
    flat.extend(_U32.pack(len(offsets)))
    flat.extend(b"".join(_U64.pack(o) for o in offsets))
    _U32.pack_into(flat, offsets_field, vector - offsets_field)
    for at, entry in fields:
        _U32.pack_into(flat, at, entry)
    segments = bytearray(data[base : base + max(ends)])
    segments[seg.offset :] = body
    _U64.pack_into(flat, size_field, len(body))
    new_base = _align(len(flat), _base_alignment(base))
    _U64.pack_into(flat, HEADER_OFFSET + 8, len(flat))
    _U64.pack_into(flat, HEADER_OFFSET + 16, new_base)
    if header.length >= 32:
        _U64.pack_into(flat, HEADER_OFFSET + 24, len(segments))
    tail = data[base + max(ends) :]  # (whatever followed the segments)
    return b"".join((flat, bytes(new_base - len(flat)), segments, tail))


def _base_alignment(base: int) -> int:
    """The alignment the original segment base had (a power of two, 16 to 4096)."""
    align = 16
    while align < 4096 and base % (align * 2) == 0:
        align *= 2
    return align
