"""ptexec's FlatBuffers writer: the inverse of :mod:`ptexec.format.flatbuf`.

It writes what ExecuTorch's schemas (``.pte`` programs, ETDump) use: tables of scalars,
strings, vectors of scalars, vectors of tables, unions, and a root with a file identifier,
optionally size-prefixed. A buffer is described as a tree of :class:`Table`,
:class:`Vector`, :class:`TableVector` and :class:`String` objects and written by
:func:`finish` front to back: every child is placed after the object that refers to it
(breadth first), so every offset points forward, as the reader requires. Every scalar is
aligned to its size from the start of the buffer (size prefix included), so the result is
valid for any FlatBuffers verifier when loaded at an address aligned to
:data:`MAX_ALIGN`. A scalar equal to its default is left out and identical vtables are
written once, as FlatBuffers' own builders do.

    root = Table().scalar(0, "u32", 1).ref(1, TableVector([Table().ref(0, String("a"))]))
    data = finish(root, b"ED00", size_prefixed=True)

Nothing here imports torch.
"""

from __future__ import annotations

import functools
import math
import struct
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from .flatbuf import SCALARS

__all__ = [
    "KINDS",
    "MAX_ALIGN",
    "String",
    "Table",
    "TableVector",
    "Vector",
    "finish",
    "finish_placed",
]

MAX_ALIGN = 16  # the largest alignment :func:`finish` gives anything (force_align 16 data)

# scalar kind -> (struct format letter, size): the reader's kinds, and 32-bit floats
KINDS: dict[str, tuple[str, int]] = {**SCALARS, "f32": ("f", 4)}

_MAX_SLOTS = (0xFFFF - 4) // 2  # as many as a vtable (its size a u16) can describe

_U32 = struct.Struct("<I")

Scalar = int | float | bool


def _signed_zero(value: Scalar, default: Scalar) -> bool:
    """Whether equal ``value`` and ``default`` are zeros of different signs (not the same
    bits: -0.0 must be written)."""
    return value == 0 and math.copysign(1.0, value) != math.copysign(1.0, default)


@dataclass(frozen=True)
class String:
    """A string, written UTF-8 and NUL-terminated."""

    text: str


@dataclass(frozen=True)
class Vector:
    """A vector of scalars of one kind (:data:`KINDS`); ``align`` is the alignment of
    its first item (at least the item size; 16 for ``force_align: 16`` byte data).
    ``raw``, when given, holds the items' bytes (little-endian) instead of ``items``."""

    kind: str
    items: Sequence[Scalar] = ()
    raw: bytes | bytearray | memoryview | None = None
    align: int = 0


@dataclass(frozen=True)
class TableVector:
    """A vector of tables."""

    tables: Sequence[Table]


@dataclass
class Table:
    """A table: ``scalars`` maps slot -> (kind, value), ``refs`` slot -> child object.

    A union is two slots: its type code (a ``u8`` scalar) and then its value (a ref)."""

    scalars: dict[int, tuple[str, Scalar]] = field(default_factory=dict)
    refs: dict[int, Table | Vector | TableVector | String] = field(default_factory=dict)

    def scalar(self, slot: int, kind: str, value: Scalar, default: Scalar | None = 0) -> Table:
        """Set scalar field ``slot`` to ``value`` (a :data:`KINDS` kind). A value equal to
        ``default`` (a zero of its sign) is left out: readers read the default for an
        absent field. ``default=None`` always writes it."""
        if default is not None and value == default and not _signed_zero(value, default):
            self.scalars.pop(slot, None)
            return self
        self.scalars[slot] = (kind, value)
        return self

    def ref(self, slot: int, child: Table | Vector | TableVector | String | None) -> Table:
        """Set field ``slot`` to a child object (None: leave it out)."""
        if child is not None:
            self.refs[slot] = child
        return self


class _Layout(NamedTuple):
    """How every table of one shape (its scalar slots and kinds, its ref slots) is laid
    out: its body from a start at ``phase`` modulo ``align``: the soffset to its vtable,
    the scalars (largest first, so that only the end pads), then the offsets to its
    children."""

    body: struct.Struct  # packs (soffset, *scalar values in `scalars` order)
    scalars: tuple[int, ...]  # scalar slots, in body order
    refs: tuple[tuple[int, int], ...]  # (slot, offset in the body) of each child
    vtable: bytes
    align: int
    phase: int


@functools.lru_cache(maxsize=1024)
def _layout(scalars: tuple[tuple[int, str], ...], refs: tuple[int, ...]) -> _Layout:
    """The layout of every table of one shape (a pure function of it: kept for all
    buffers, as writing one-delegate programs writes the same few shapes again and again)."""
    slots = [s for s, _ in scalars] + list(refs)
    if len(set(slots)) != len(slots):
        raise ValueError(f"a field set twice in slots {sorted(slots)}")
    if slots and (min(slots) < 0 or max(slots) >= _MAX_SLOTS):
        raise ValueError(f"field slots {sorted(slots)} out of range 0..{_MAX_SLOTS - 1}")
    ordered = sorted(scalars, key=lambda sk: (-KINDS[sk[1]][1], sk[0]))
    align = max([4] + [KINDS[k][1] for _, k in ordered])
    phase = 4 % align  # a start 4 past an 8-byte boundary: the first u64 follows the soffset
    fmt = ["<i"]
    size = 4
    offsets: dict[int, int] = {}
    for slot, kind in ordered:
        letter, n = KINDS[kind]
        pad = -(phase + size) % n
        fmt.append(f"{pad}x{letter}")
        offsets[slot] = size + pad
        size += pad + n
    pad = -(phase + size) % 4
    fmt.append(f"{pad + 4 * len(refs)}x")
    size += pad
    placed = []
    for slot in refs:
        offsets[slot] = size
        placed.append((slot, size))
        size += 4
    if size > 0xFFFF:
        raise ValueError(f"a table of {size} bytes is too large for its vtable")
    nslots = max(slots) + 1 if slots else 0
    entries = [offsets.get(slot, 0) for slot in range(nslots)]
    vtable = struct.pack(f"<{2 + nslots}H", 4 + 2 * nslots, size, *entries)
    return _Layout(
        struct.Struct("".join(fmt)),
        tuple(s for s, _ in ordered),
        tuple(placed),
        vtable,
        align,
        phase,
    )


class _Writer:
    def __init__(self, header: int, where: dict[int, int]) -> None:
        self.buf = bytearray(header)
        self.pending: deque[tuple[int, Table | Vector | TableVector | String]] = deque()
        self.vtables: dict[bytes, int] = {}  # vtable bytes -> position of its one copy
        self.where = where  # id of a String -> where it was placed (the strings asked for)

    def pad_to(self, align: int, ahead: int = 0) -> None:
        """Pad so that position ``len + ahead`` is a multiple of ``align``."""
        over = (len(self.buf) + ahead) % align
        if over:
            self.buf += bytes(align - over)

    def place(self, obj: Table | Vector | TableVector | String) -> int:
        if isinstance(obj, Table):
            return self._table(obj)
        if isinstance(obj, String):
            raw = obj.text.encode("utf-8")
            self.pad_to(4)
            at = len(self.buf)
            self.buf += _U32.pack(len(raw)) + raw + b"\0"
            if id(obj) in self.where:
                self.where[id(obj)] = at + 4
            return at
        if isinstance(obj, TableVector):
            self.pad_to(4)
            at = len(self.buf)
            self.buf += _U32.pack(len(obj.tables))
            for t in obj.tables:
                self.pending.append((len(self.buf), t))
                self.buf += bytes(4)
            return at
        letter, size = KINDS[obj.kind]
        data = (
            obj.raw
            if obj.raw is not None
            else struct.pack(f"<{len(obj.items)}{letter}", *obj.items)
        )
        self.pad_to(max(obj.align, size, 4), ahead=4)
        at = len(self.buf)
        self.buf += _U32.pack(len(data) // size)
        self.buf += data
        return at

    def _table(self, t: Table) -> int:
        scalars, refs = t.scalars, t.refs
        shape = (tuple([(slot, kv[0]) for slot, kv in scalars.items()]), tuple(refs))
        layout = _layout(*shape)
        buf = self.buf
        vt_at = self.vtables.get(layout.vtable)
        if vt_at is None:
            self.pad_to(2)
            vt_at = self.vtables[layout.vtable] = len(buf)
            buf += layout.vtable
        self.pad_to(layout.align, ahead=-layout.phase % layout.align)
        start = len(buf)
        buf += layout.body.pack(start - vt_at, *[scalars[slot][1] for slot in layout.scalars])
        for slot, offset in layout.refs:
            self.pending.append((start + offset, refs[slot]))
        return start


def finish(
    root: Table, identifier: bytes, reserve: int = 0, size_prefixed: bool = False
) -> bytearray:
    """The buffer holding ``root``: the root offset, the file ``identifier``, then
    ``reserve`` zero bytes for a header the caller fills in, then the tables, padded to a
    multiple of :data:`MAX_ALIGN`. ``size_prefixed`` puts the size of the rest in front,
    as a ``u32``."""
    return finish_placed(root, identifier, (), reserve, size_prefixed)[0]


def finish_placed(
    root: Table,
    identifier: bytes,
    strings: Sequence[String],
    reserve: int = 0,
    size_prefixed: bool = False,
) -> tuple[bytearray, tuple[int, ...]]:
    """:func:`finish`'s buffer, and where the first byte of each of ``strings`` (objects
    of the tree) lies in it. A string's place depends only on the lengths of the strings
    placed before it, so a buffer written again with other strings of the same lengths
    differs only there."""
    if len(identifier) != 4:
        raise ValueError("a file identifier has 4 bytes")
    base = 4 if size_prefixed else 0
    w = _Writer(base + 8 + reserve, {id(s): -1 for s in strings})
    w.buf[base + 4 : base + 8] = identifier
    w.pending.append((base, root))
    while w.pending:
        at, obj = w.pending.popleft()
        pos = w.place(obj)
        _U32.pack_into(w.buf, at, pos - at)
    w.pad_to(MAX_ALIGN)
    if size_prefixed:
        _U32.pack_into(w.buf, 0, len(w.buf) - 4)
    placed = tuple(w.where[id(s)] for s in strings)
    if any(at < 0 for at in placed):
        raise ValueError("a string asked about is not part of the tree")
    return w.buf, placed
