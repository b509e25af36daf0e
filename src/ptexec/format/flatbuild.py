"""A small FlatBuffers builder: the writing side of :mod:`.flatbuf`.

It writes what ExecuTorch's output schemas use: tables with scalar, string, vector and
table fields, vectors of scalars, of tables and strings, and a root with a file
identifier, optionally size-prefixed. Like every FlatBuffers builder it works back to
front: children are written before their parents, so every offset a parent stores
points forward, as readers require. An object is named by its *reference*: its distance
from the end of the buffer, which stays fixed while the buffer grows at the front.

    b = Builder()
    name = b.string("Execute")
    b.start_table()
    b.add_offset(0, name)
    b.add_scalar(1, "i32", -1, default=-1)   # equal to the default: left out
    root = b.end_table()
    data = b.finish(root, identifier=b"ED00", size_prefixed=True)

Identical vtables are written once and shared. Nothing here imports torch.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

__all__ = ["Builder"]

# scalar kind -> (struct format, size); the kinds are those of flatbuf.SCALARS plus f32
_FORMATS: dict[str, tuple[str, int]] = {
    "u8": ("<B", 1),
    "i8": ("<b", 1),
    "bool": ("<?", 1),
    "u16": ("<H", 2),
    "i16": ("<h", 2),
    "i32": ("<i", 4),
    "u32": ("<I", 4),
    "i64": ("<q", 8),
    "u64": ("<Q", 8),
    "f32": ("<f", 4),
    "f64": ("<d", 8),
}


class Builder:
    """Builds one flatbuffer, back to front (see the module docstring)."""

    def __init__(self, initial_size: int = 1024) -> None:
        self._buf = bytearray(max(initial_size, 16))
        self._head = len(self._buf)  # the data lives in _buf[_head:]
        self._minalign = 1
        self._fields: list[int] | None = None  # reference of each field of the open table
        self._table_start = 0
        self._vtables: dict[bytes, int] = {}  # vtable bytes -> reference of its first copy
        self._finished = False

    # ---- raw writing -----------------------------------------------------------------
    def reference(self) -> int:
        """The reference of whatever is written next's end: bytes written so far."""
        return len(self._buf) - self._head

    def _reserve(self, nbytes: int) -> None:
        if self._head >= nbytes:
            return
        used = len(self._buf) - self._head
        size = len(self._buf)
        while size - used < nbytes:
            size *= 2
        grown = bytearray(size)
        grown[size - used :] = self._buf[self._head :]
        self._buf = grown
        self._head = size - used

    def _pad(self, n: int) -> None:
        self._reserve(n)
        self._head -= n
        self._buf[self._head : self._head + n] = bytes(n)

    def _align(self, size: int, additional: int) -> None:
        """Pad so that after ``additional`` more bytes the data is aligned to ``size``."""
        if size > self._minalign:
            self._minalign = size
        pad = (-(self.reference() + additional)) % size
        self._reserve(pad + size + additional)
        self._pad(pad)

    def _put(self, fmt: str, size: int, value: object) -> None:
        self._reserve(size)
        self._head -= size
        struct.pack_into(fmt, self._buf, self._head, value)

    def _scalar(self, kind: str, value: object) -> None:
        fmt, size = _FORMATS[kind]
        self._align(size, 0)
        self._put(fmt, size, value)

    def _uoffset(self, ref: int) -> None:
        """An offset to the object at reference ``ref`` (written before, so ahead of it)."""
        self._align(4, 0)
        if ref > self.reference():
            raise ValueError("an offset must point at an object written before it")
        self._put("<I", 4, self.reference() + 4 - ref)

    # ---- objects ---------------------------------------------------------------------
    def string(self, text: str | bytes) -> int:
        """A string (UTF-8, NUL-terminated); returns its reference."""
        self._check_open(False)
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        self._align(4, len(data) + 1)
        self._pad(1)
        self._reserve(len(data))
        self._head -= len(data)
        self._buf[self._head : self._head + len(data)] = data
        self._put("<I", 4, len(data))
        return self.reference()

    def scalars(self, kind: str, values: Sequence[int | float | bool]) -> int:
        """A vector of scalars of ``kind`` (``"i64"``, ``"u8"``, ...); returns its reference."""
        self._check_open(False)
        fmt, size = _FORMATS[kind]
        n = len(values)
        self._align(4, size * n)
        self._align(size, size * n)
        self._reserve(size * n)
        self._head -= size * n
        if n:
            struct.pack_into(f"<{n}{fmt[1]}", self._buf, self._head, *values)
        self._put("<I", 4, n)
        return self.reference()

    def bytes_vector(self, data: bytes | bytearray | memoryview, alignment: int = 1) -> int:
        """A ``[ubyte]`` vector holding ``data``, its first byte aligned to ``alignment``."""
        self._check_open(False)
        n = len(data)
        self._align(4, n)
        self._align(alignment, n)
        self._reserve(n)
        self._head -= n
        self._buf[self._head : self._head + n] = data
        self._put("<I", 4, n)
        return self.reference()

    def offsets(self, refs: Sequence[int]) -> int:
        """A vector of tables or strings, given their references; returns its reference."""
        self._check_open(False)
        self._align(4, 4 * len(refs))
        for ref in reversed(refs):
            self._uoffset(ref)
        self._put("<I", 4, len(refs))
        return self.reference()

    # ---- tables ----------------------------------------------------------------------
    def _check_open(self, want: bool) -> None:
        if self._finished:
            raise ValueError("the buffer is finished")
        if (self._fields is not None) != want:
            raise ValueError("inside a table" if self._fields is not None else "no open table")

    def start_table(self) -> None:
        """Open a table; add its fields, then :meth:`end_table`. Tables do not nest:
        write a table's children (strings, vectors, tables) before starting it."""
        self._check_open(False)
        self._fields = []
        self._table_start = self.reference()

    def _slot(self, slot: int) -> None:
        assert self._fields is not None
        if slot < 0 or slot > 0xFFFF:
            raise ValueError(f"field slot {slot} out of range")
        while len(self._fields) <= slot:
            self._fields.append(0)
        if self._fields[slot]:
            raise ValueError(f"field {slot} set twice")
        self._fields[slot] = self.reference()

    def add_scalar(
        self,
        slot: int,
        kind: str,
        value: int | float | bool,
        default: int | float | bool | None = 0,
    ) -> None:
        """Scalar field ``slot``; left out when it equals ``default`` (readers use the
        default then); ``default=None`` always writes it."""
        self._check_open(True)
        if default is not None and value == default:
            return
        self._scalar(kind, value)
        self._slot(slot)

    def add_offset(self, slot: int, ref: int | None) -> None:
        """Field ``slot`` referring to a string, vector or table (None: left out)."""
        self._check_open(True)
        if ref is None:
            return
        self._uoffset(ref)
        self._slot(slot)

    def end_table(self) -> int:
        """Close the open table; returns its reference."""
        self._check_open(True)
        fields = self._fields
        assert fields is not None
        self._scalar("i32", 0)  # the vtable offset, filled in below
        table = self.reference()
        while fields and not fields[-1]:
            fields.pop()
        entries = [table - f if f else 0 for f in fields]
        if any(e > 0xFFFF for e in entries) or table - self._table_start > 0xFFFF:
            raise ValueError("a table larger than 64 KiB cannot be described by its vtable")
        vtable = struct.pack(
            f"<{2 + len(entries)}H", 4 + 2 * len(entries), table - self._table_start, *entries
        )
        seen = self._vtables.get(vtable)
        if seen is None:
            self._reserve(len(vtable))
            self._head -= len(vtable)
            self._buf[self._head : self._head + len(vtable)] = vtable
            seen = self.reference()
            self._vtables[vtable] = seen
        # the table's first word: its position minus its vtable's position (signed)
        struct.pack_into("<i", self._buf, len(self._buf) - table, seen - table)
        self._fields = None
        return table

    # ---- the whole buffer ------------------------------------------------------------
    def finish(
        self, root: int, identifier: bytes | None = None, size_prefixed: bool = False
    ) -> bytes:
        """Write the root offset (and a 4-byte file identifier, and the size prefix) and
        return the finished buffer."""
        self._check_open(False)
        if identifier is not None and len(identifier) != 4:
            raise ValueError("a file identifier has 4 bytes")
        extra = 4 + (4 if identifier is not None else 0) + (4 if size_prefixed else 0)
        self._align(max(self._minalign, 4), extra)
        if identifier is not None:
            self._reserve(4)
            self._head -= 4
            self._buf[self._head : self._head + 4] = identifier
        self._uoffset(root)
        if size_prefixed:
            self._put("<I", 4, self.reference())
        self._finished = True
        return bytes(self._buf[self._head :])
