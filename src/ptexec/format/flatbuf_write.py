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

import struct
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from .flatbuf import SCALARS

__all__ = ["KINDS", "MAX_ALIGN", "String", "Table", "TableVector", "Vector", "finish"]

MAX_ALIGN = 16  # the largest alignment :func:`finish` gives anything (force_align 16 data)

# scalar kind -> (struct format letter, size): the reader's kinds, and 32-bit floats
KINDS: dict[str, tuple[str, int]] = {**SCALARS, "f32": ("f", 4)}

_MAX_SLOTS = (0xFFFF - 4) // 2  # as many as a vtable (its size a u16) can describe

_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")

Scalar = int | float | bool


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
        """Set scalar field ``slot``, unless ``value`` is written as ``default`` is (a
        reader reads the default for an absent field); ``default=None`` always sets it."""
        if default is not None:
            letter = "<" + KINDS[kind][0]
            if struct.pack(letter, value) == struct.pack(letter, default):  # -0.0 is not 0.0
                self.scalars.pop(slot, None)
                return self
        self.scalars[slot] = (kind, value)
        return self

    def ref(self, slot: int, child: Table | Vector | TableVector | String | None) -> Table:
        """Set field ``slot`` to a child object (None: leave it out)."""
        if child is not None:
            self.refs[slot] = child
        return self


class _Writer:
    def __init__(self, header: int) -> None:
        self.buf = bytearray(header)
        self.pending: deque[tuple[int, Table | Vector | TableVector | String]] = deque()
        self.vtables: dict[bytes, int] = {}  # vtable bytes -> position of its one copy

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
        if t.scalars.keys() & t.refs.keys():
            raise ValueError(f"field {min(t.scalars.keys() & t.refs.keys())} set twice")
        slots = t.scalars.keys() | t.refs.keys()
        if slots and (min(slots) < 0 or max(slots) >= _MAX_SLOTS):
            raise ValueError(f"field slots {sorted(slots)} out of range 0..{_MAX_SLOTS - 1}")
        # the body, laid out from a start aligned to its largest scalar: the soffset to
        # the vtable, the scalars largest first (less padding), then the offsets
        align = 4
        body = bytearray(4)
        offsets: dict[int, int] = {}
        for slot, (kind, value) in sorted(t.scalars.items(), key=lambda kv: -KINDS[kv[1][0]][1]):
            letter, size = KINDS[kind]
            align = max(align, size)
            body += bytes(-len(body) % size)
            offsets[slot] = len(body)
            body += struct.pack("<" + letter, value)
        body += bytes(-len(body) % 4)
        refs = sorted(t.refs.items())
        for slot, _ in refs:
            offsets[slot] = len(body)
            body += bytes(4)
        if len(body) > 0xFFFF:
            raise ValueError(f"a table of {len(body)} bytes is too large for its vtable")
        nslots = max(slots) + 1 if slots else 0
        entries = [offsets.get(slot, 0) for slot in range(nslots)]
        vtable = struct.pack(f"<{2 + nslots}H", 4 + 2 * nslots, len(body), *entries)
        vt_at = self.vtables.get(vtable)
        if vt_at is None:
            self.pad_to(2)
            vt_at = self.vtables[vtable] = len(self.buf)
            self.buf += vtable
        self.pad_to(align)
        start = len(self.buf)
        _I32.pack_into(body, 0, start - vt_at)
        self.buf += body
        for slot, child in refs:
            self.pending.append((start + offsets[slot], child))
        return start


def finish(
    root: Table, identifier: bytes, reserve: int = 0, size_prefixed: bool = False
) -> bytearray:
    """The buffer holding ``root``: the root offset, the file ``identifier``, then
    ``reserve`` zero bytes for a header the caller fills in, then the tables, padded to a
    multiple of :data:`MAX_ALIGN`. ``size_prefixed`` puts the size of the rest in front,
    as a ``u32``."""
    if len(identifier) != 4:
        raise ValueError("a file identifier has 4 bytes")
    base = 4 if size_prefixed else 0
    w = _Writer(base + 8 + reserve)
    w.buf[base + 4 : base + 8] = identifier
    w.pending.append((base, root))
    while w.pending:
        at, obj = w.pending.popleft()
        pos = w.place(obj)
        _U32.pack_into(w.buf, at, pos - at)
    w.pad_to(MAX_ALIGN)
    if size_prefixed:
        _U32.pack_into(w.buf, 0, len(w.buf) - 4)
    return w.buf
