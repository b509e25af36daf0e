"""A small FlatBuffers writer: the inverse of :mod:`ptexec.format.flatbuf`.

It writes what ExecuTorch's schemas use (tables of scalars, strings, vectors of scalars,
vectors of tables, unions) and nothing else. A buffer is described as a tree of
:class:`Table`, :class:`Vector`, :class:`TableVector` and :class:`String` objects and
written by :func:`finish` front to back: every child is placed after the object that
refers to it (breadth first), so every offset points forward, as the reader requires, and
every scalar is aligned to its size in the buffer. The result is a valid buffer for any
FlatBuffers verifier that is loaded at an address aligned to :data:`MAX_ALIGN`.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from .flatbuf import SCALARS

__all__ = ["MAX_ALIGN", "String", "Table", "TableVector", "Vector", "finish"]

MAX_ALIGN = 16  # the largest alignment :func:`finish` gives anything (force_align 16 data)

_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")


@dataclass(frozen=True)
class String:
    text: str


@dataclass(frozen=True)
class Vector:
    """A vector of scalars of one kind (``flatbuf.SCALARS``); ``align`` is the alignment of
    its first item (at least the item size; 16 for ``force_align: 16`` byte data).
    ``raw``, when given, holds the items' bytes (little-endian) instead of ``items``."""

    kind: str
    items: Sequence[int | float | bool] = ()
    raw: bytes | bytearray | memoryview | None = None
    align: int = 0


@dataclass(frozen=True)
class TableVector:
    tables: Sequence[Table]


@dataclass
class Table:
    """A table: ``scalars`` maps slot -> (kind, value), ``refs`` slot -> child object.

    A union is two slots: its type code (a ``u8`` scalar) and then its value (a ref)."""

    scalars: dict[int, tuple[str, int | float | bool]] = field(default_factory=dict)
    refs: dict[int, Table | Vector | TableVector | String] = field(default_factory=dict)

    def scalar(self, slot: int, kind: str, value: int | float | bool) -> Table:
        self.scalars[slot] = (kind, value)
        return self

    def ref(self, slot: int, child: Table | Vector | TableVector | String | None) -> Table:
        if child is not None:
            self.refs[slot] = child
        return self


class _Writer:
    def __init__(self, identifier: bytes, reserve: int) -> None:
        self.buf = bytearray(8 + reserve)
        self.buf[4:8] = identifier
        self.pending: deque[tuple[int, Table | Vector | TableVector | String]] = deque()

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
            return at
        if isinstance(obj, TableVector):
            self.pad_to(4)
            at = len(self.buf)
            self.buf += _U32.pack(len(obj.tables))
            for t in obj.tables:
                self.pending.append((len(self.buf), t))
                self.buf += bytes(4)
            return at
        letter, size = SCALARS[obj.kind]
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
        slots = set(t.scalars) | set(t.refs)
        nslots = max(slots) + 1 if slots else 0
        self.pad_to(2)
        vtable = len(self.buf)
        self.buf += bytes(4 + 2 * nslots)
        self.pad_to(4)
        start = len(self.buf)
        self.buf += _I32.pack(start - vtable)
        offsets: dict[int, int] = {}
        # largest scalars first: less padding
        items = sorted(t.scalars.items(), key=lambda kv: -SCALARS[kv[1][0]][1])
        for slot, (kind, value) in items:
            letter, size = SCALARS[kind]
            self.pad_to(size)
            offsets[slot] = len(self.buf) - start
            self.buf += struct.pack(f"<{letter}", value)
        for slot, child in sorted(t.refs.items()):
            self.pad_to(4)
            offsets[slot] = len(self.buf) - start
            self.pending.append((len(self.buf), child))
            self.buf += bytes(4)
        _U16.pack_into(self.buf, vtable, 4 + 2 * nslots)
        _U16.pack_into(self.buf, vtable + 2, len(self.buf) - start)
        for slot, off in offsets.items():
            _U16.pack_into(self.buf, vtable + 4 + 2 * slot, off)
        return start


def finish(root: Table, identifier: bytes, reserve: int = 0) -> bytearray:
    """The buffer holding ``root`` (the file identifier at bytes 4..8, then ``reserve``
    zero bytes for a header the caller fills in), padded to a multiple of
    :data:`MAX_ALIGN`."""
    if len(identifier) != 4:
        raise ValueError("a file identifier has 4 bytes")
    w = _Writer(identifier, reserve)
    w.pending.append((0, root))
    while w.pending:
        at, obj = w.pending.popleft()
        pos = w.place(obj)
        _U32.pack_into(w.buf, at, pos - at)
    w.pad_to(MAX_ALIGN)
    return w.buf
