"""A small, bounds-checked FlatBuffers reader.

Only what ExecuTorch's schemas use: tables, scalars, strings, vectors of scalars, vectors
of tables and unions. Every offset is checked against the buffer before it is followed, so
a hostile file raises :class:`~ptexec.errors.PteFormatError` (with the path of the field
being read) instead of reading out of bounds, and a cycle cannot make it loop: every
offset must point forward or the depth is bounded by the schema.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TypeVar

from ..errors import PteFormatError

T = TypeVar("T")

_U8 = struct.Struct("<B")
_I8 = struct.Struct("<b")
_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_F32 = struct.Struct("<f")
_F64 = struct.Struct("<d")
_BOOL = struct.Struct("<?")

# struct format letter and item size for each scalar kind
SCALARS: dict[str, tuple[str, int]] = {
    "u8": ("B", 1),
    "i8": ("b", 1),
    "bool": ("?", 1),
    "u16": ("H", 2),
    "i32": ("i", 4),
    "u32": ("I", 4),
    "i64": ("q", 8),
    "u64": ("Q", 8),
    "f64": ("d", 8),
}
_STRUCTS = {
    "u8": _U8,
    "i8": _I8,
    "bool": _BOOL,
    "u16": _U16,
    "i32": _I32,
    "u32": _U32,
    "i64": _I64,
    "u64": _U64,
    "f64": _F64,
}


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


class Buffer:
    """The bytes of one flatbuffer, with checked primitive reads."""

    __slots__ = ("data", "size")

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self.data = data
        self.size = len(data)

    def check(self, pos: int, nbytes: int, path: str) -> None:
        if pos < 0 or nbytes < 0 or pos + nbytes > self.size:
            raise PteFormatError(
                path, f"bytes {pos}..{pos + nbytes} lie outside the buffer ({self.size} bytes)"
            )

    def u32(self, pos: int, path: str) -> int:
        self.check(pos, 4, path)
        return int(_U32.unpack_from(self.data, pos)[0])

    def i32(self, pos: int, path: str) -> int:
        self.check(pos, 4, path)
        return int(_I32.unpack_from(self.data, pos)[0])

    def u16(self, pos: int, path: str) -> int:
        self.check(pos, 2, path)
        return int(_U16.unpack_from(self.data, pos)[0])

    def root(self, path: str = "") -> Table:
        """The root table (the first four bytes hold its offset)."""
        offset = self.u32(0, path or "root offset")
        if offset < 8:
            raise PteFormatError(path or "root offset", f"root table offset {offset} < 8")
        return Table.at(self, offset, path)


class Table:
    """One table: its position and vtable, read lazily field by field."""

    __slots__ = ("buf", "nfields", "path", "pos", "vtable")

    def __init__(self, buf: Buffer, pos: int, vtable: int, nfields: int, path: str) -> None:
        self.buf = buf
        self.pos = pos
        self.vtable = vtable
        self.nfields = nfields
        self.path = path

    @classmethod
    def at(cls, buf: Buffer, pos: int, path: str) -> Table:
        soffset = buf.i32(pos, path)
        vtable = pos - soffset
        vt_size = buf.u16(vtable, path + " (vtable)")
        buf.u16(vtable + 2, path + " (vtable)")
        if vt_size < 4 or vt_size % 2:
            raise PteFormatError(path, f"invalid vtable size {vt_size}")
        buf.check(vtable, vt_size, path + " (vtable)")
        return cls(buf, pos, vtable, (vt_size - 4) // 2, path)

    def _field(self, slot: int) -> int:
        """Absolute position of field ``slot`` or 0 when it is absent."""
        if slot >= self.nfields:
            return 0
        off = int(_U16.unpack_from(self.buf.data, self.vtable + 4 + 2 * slot)[0])
        return self.pos + off if off else 0

    def has(self, slot: int) -> bool:
        return self._field(slot) != 0

    def _scalar(self, slot: int, st: struct.Struct, name: str) -> object:
        at = self._field(slot)
        if not at:
            return None
        self.buf.check(at, st.size, _join(self.path, name))
        return st.unpack_from(self.buf.data, at)[0]

    def int_(self, slot: int, kind: str, name: str, default: int = 0) -> int:
        """An integer scalar field (``kind`` as in :data:`SCALARS`)."""
        v = self._scalar(slot, _STRUCTS[kind], name)
        return default if v is None else int(v)  # type: ignore[call-overload]

    def bool_(self, slot: int, name: str, default: bool = False) -> bool:
        v = self._scalar(slot, _BOOL, name)
        return default if v is None else bool(v)

    def f64(self, slot: int, name: str, default: float = 0.0) -> float:
        v = self._scalar(slot, _F64, name)
        return default if v is None else float(v)  # type: ignore[arg-type]

    def f32(self, slot: int, name: str, default: float = 0.0) -> float:
        v = self._scalar(slot, _F32, name)
        return default if v is None else float(v)  # type: ignore[arg-type]

    def _indirect(self, slot: int, name: str) -> int:
        at = self._field(slot)
        if not at:
            return 0
        rel = self.buf.u32(at, _join(self.path, name))
        if rel == 0:
            raise PteFormatError(_join(self.path, name), "zero offset")
        return at + rel

    def string(self, slot: int, name: str) -> str | None:
        at = self._indirect(slot, name)
        if not at:
            return None
        path = _join(self.path, name)
        n = self.buf.u32(at, path)
        self.buf.check(at + 4, n, path)
        raw = bytes(self.buf.data[at + 4 : at + 4 + n])
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise PteFormatError(path, f"string is not UTF-8 ({e.reason})") from None

    def table(self, slot: int, name: str) -> Table | None:
        at = self._indirect(slot, name)
        if not at:
            return None
        return Table.at(self.buf, at, _join(self.path, name))

    def vector_span(self, slot: int, name: str, item_size: int) -> tuple[int, int] | None:
        """(start, length) of a vector's items, bounds-checked, or None when absent."""
        at = self._indirect(slot, name)
        if not at:
            return None
        path = _join(self.path, name)
        n = self.buf.u32(at, path)
        self.buf.check(at + 4, n * item_size, path)
        return at + 4, n

    def scalars(self, slot: int, kind: str, name: str) -> tuple[int, ...] | None:
        """A vector of scalars as a tuple (None when the field is absent)."""
        letter, size = SCALARS[kind]
        span = self.vector_span(slot, name, size)
        if span is None:
            return None
        start, n = span
        return struct.unpack_from(f"<{n}{letter}", self.buf.data, start)

    def bytes_span(self, slot: int, name: str) -> tuple[int, int] | None:
        """(start, length) of a ``[ubyte]`` field, for zero-copy access to its data."""
        return self.vector_span(slot, name, 1)

    def tables(
        self, slot: int, name: str, decode: Callable[[Table], T], limit: int | None = None
    ) -> tuple[T, ...] | None:
        """A vector of tables, each decoded with ``decode``; None when absent."""
        span = self.vector_span(slot, name, 4)
        if span is None:
            return None
        start, n = span
        if limit is not None and n > limit:
            raise PteFormatError(_join(self.path, name), f"{n} items exceed the limit of {limit}")
        out = []
        buf = self.buf
        for i in range(n):
            item = start + 4 * i
            rel = int(_U32.unpack_from(buf.data, item)[0])
            if rel == 0:
                raise PteFormatError(_join(self.path, f"{name}[{i}]"), "zero offset")
            out.append(decode(Table.at(buf, item + rel, _join(self.path, f"{name}[{i}]"))))
        return tuple(out)

    def union(
        self, slot: int, name: str, kinds: dict[int, str] | None = None
    ) -> tuple[int, Table | None]:
        """A union field: (type code, table). ``slot`` is the type's; the value follows it.

        ``kinds`` names the value's path by its type (``values[3].tensor``) instead of by
        the field (``values[3].val``).
        """
        code = self.int_(slot, "u8", f"{name}_type")
        if code == 0:
            return 0, None
        at = self._indirect(slot + 1, name)
        if not at:
            return code, None
        label = kinds.get(code, name) if kinds else name
        return code, Table.at(self.buf, at, _join(self.path, label))
