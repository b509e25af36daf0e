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
from typing import Any, TypeVar

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


_VTABLES: dict[int, struct.Struct] = {}


def _vtable_struct(nfields: int) -> struct.Struct:
    st = _VTABLES.get(nfields)
    if st is None:
        st = _VTABLES[nfields] = struct.Struct(f"<{nfields}H")
    return st


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def decode_budget(size: int) -> int:
    """How many vector items a flatbuffer of ``size`` bytes may decode to. Each item of a
    vector takes at least a byte, so a file whose tables are not shared decodes to fewer
    than ``size``; tables are shared only by a file made to be expanded (thousands of
    references to one large vector), which would otherwise take memory and time far
    beyond its size before anything is validated."""
    return 4 * size + (1 << 20)


class Buffer:
    """The bytes of one flatbuffer, with checked primitive reads."""

    __slots__ = ("_left", "_vtables", "data", "size")

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self.data = data
        self.size = len(data)
        self._vtables: dict[int, tuple[int, ...]] = {}  # vtable position -> field offsets
        self._left = decode_budget(self.size)  # vector items still to decode (above)

    def spend(self, items: int, path: str | Callable[[], str]) -> None:
        """Count ``items`` decoded vector items against the buffer's budget
        (:func:`decode_budget`); over it is a :class:`PteFormatError` at ``path``."""
        self._left -= items
        if self._left < 0:
            where = path() if callable(path) else path
            raise PteFormatError(
                where,
                f"the file's vectors decode to more than {decode_budget(self.size)} items, "
                f"4 per byte of its {self.size}: its tables are shared to expand it",
            )

    def field_offsets(self, pos: int) -> tuple[int, ...] | None:
        """Each field's offset from table ``pos`` (0: absent), when the table's start and
        its vtable lie inside the buffer; None otherwise (read it as a :class:`Table` to
        learn why). For decoders' fast paths: a vtable shared by many tables is read once.
        """
        data, size = self.data, self.size
        if pos < 0 or pos + 4 > size:
            return None
        vtable = pos - _I32.unpack_from(data, pos)[0]
        found = self._vtables.get(vtable)
        if found is not None:
            return found
        if vtable < 0 or vtable + 4 > size:
            return None
        vt_size = _U16.unpack_from(data, vtable)[0]
        if vt_size < 4 or vt_size % 2 or vtable + vt_size > size:
            return None
        nfields = (vt_size - 4) // 2
        found = _vtable_struct(nfields).unpack_from(data, vtable + 4) if nfields else ()
        self._vtables[vtable] = found
        return found

    def table_at(self, pos: int, offsets: tuple[int, ...], slot: int) -> int:
        """The position of the table that field ``slot`` of table ``pos`` (with field
        ``offsets``) refers to: 0 when the field is absent, -1 when its offset cannot be
        read or is zero (read it as a :class:`Table` to learn why)."""
        if slot >= len(offsets) or not offsets[slot]:
            return 0
        at = pos + offsets[slot]
        if at + 4 > self.size:
            return -1
        rel = _U32.unpack_from(self.data, at)[0]
        return at + rel if rel else -1

    def scalars_at(
        self, pos: int, offsets: tuple[int, ...], slot: int, kind: str
    ) -> tuple[Any, ...] | None:
        """Vector of scalars field ``slot`` of table ``pos``: () when absent, None when it
        does not lie inside the buffer (read it as a :class:`Table` to learn why)."""
        at = self.table_at(pos, offsets, slot)
        if at <= 0:
            return () if at == 0 else None
        return self.scalars_from(at, kind)

    def scalars_from(self, at: int, kind: str) -> tuple[Any, ...] | None:
        """The vector of scalars at ``at`` (where its length is): None when it does not
        lie inside the buffer, or when the buffer's budget of items is spent (read it as a
        :class:`Table` to learn why)."""
        size = self.size
        if at + 4 > size:
            return None
        n = _U32.unpack_from(self.data, at)[0]
        letter, item = SCALARS[kind]
        if at + 4 + n * item > size:
            return None
        self._left -= n
        if self._left < 0:
            return None  # the decoder's reading of it as a Table raises
        return struct.unpack_from(f"<{n}{letter}", self.data, at + 4)

    def scalar_at(
        self, pos: int, offsets: tuple[int, ...], slot: int, kind: str, default: Any = 0
    ) -> Any:
        """Scalar field ``slot`` of table ``pos`` (``default`` when absent); None when it
        does not lie inside the buffer."""
        if slot >= len(offsets) or not offsets[slot]:
            return default
        at = pos + offsets[slot]
        st = _STRUCTS[kind]
        if at + st.size > self.size:
            return None
        return st.unpack_from(self.data, at)[0]

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
        if offset + 4 > self.size:  # a file cut short, most likely
            raise PteFormatError(
                path or "root table",
                f"the file is truncated: needs {offset + 4} bytes, has {self.size}",
            )
        return Table.at(self, offset, path)


class Table:
    """One table: its position and vtable, read lazily field by field.

    Its path in the file (``execution_plan[0].values[17]``) is put together only when an
    error needs it: a table knows its parent and its name in it."""

    __slots__ = ("_label", "_parent", "_path", "buf", "nfields", "offsets", "pos", "vtable")

    def __init__(
        self,
        buf: Buffer,
        pos: int,
        vtable: int,
        nfields: int,
        path: str,
        parent: Table | None = None,
        label: str | tuple[str, int] = "",
    ) -> None:
        self.buf = buf
        self.pos = pos
        self.vtable = vtable
        self.nfields = nfields
        # each field's offset from the table (0: absent), read from the vtable at once
        self.offsets: tuple[int, ...] = (
            _vtable_struct(nfields).unpack_from(buf.data, vtable + 4) if nfields else ()
        )
        self._path: str | None = path if parent is None else None
        self._parent = parent
        self._label = label

    @property
    def path(self) -> str:
        path = self._path
        if path is None:
            label = self._label
            name = label if isinstance(label, str) else f"{label[0]}[{label[1]}]"
            assert self._parent is not None
            path = self._path = _join(self._parent.path, name)
        return path

    @classmethod
    def at(cls, buf: Buffer, pos: int, path: str) -> Table:
        return cls._read(buf, pos, path, None, "")

    @classmethod
    def _read(
        cls, buf: Buffer, pos: int, path: str, parent: Table | None, label: str | tuple[str, int]
    ) -> Table:
        data, size = buf.data, buf.size
        if pos < 0 or pos + 4 > size:
            cls._fail(path, parent, label, f"bytes {pos}..{pos + 4}", size)
        vtable = pos - int(_I32.unpack_from(data, pos)[0])
        if vtable < 0 or vtable + 4 > size:
            cls._fail(path, parent, label, f"bytes {vtable}..{vtable + 4}", size, " (vtable)")
        vt_size = int(_U16.unpack_from(data, vtable)[0])
        if vt_size < 4 or vt_size % 2:
            raise PteFormatError(
                cls(buf, pos, 0, 0, path, parent, label).path, f"invalid vtable size {vt_size}"
            )
        if vtable + vt_size > size:
            cls._fail(path, parent, label, f"bytes {vtable}..{vtable + vt_size}", size, " (vtable)")
        return cls(buf, pos, vtable, (vt_size - 4) // 2, path, parent, label)

    @classmethod
    def _fail(
        cls,
        path: str,
        parent: Table | None,
        label: str | tuple[str, int],
        where: str,
        size: int,
        suffix: str = "",
    ) -> None:
        at = cls.__new__(cls)
        at._path, at._parent, at._label = (path if parent is None else None), parent, label
        raise PteFormatError(at.path + suffix, f"{where} lie outside the buffer ({size} bytes)")

    def _where(self, name: str) -> str:
        return _join(self.path, name)

    def _field(self, slot: int) -> int:
        """Absolute position of field ``slot`` or 0 when it is absent."""
        offsets = self.offsets
        if slot >= len(offsets):
            return 0
        off = offsets[slot]
        return self.pos + off if off else 0

    def has(self, slot: int) -> bool:
        return self._field(slot) != 0

    def _scalar(self, slot: int, st: struct.Struct, name: str) -> object:
        at = self._field(slot)
        if not at:
            return None
        if at + st.size > self.buf.size:
            self.buf.check(at, st.size, self._where(name))
        return st.unpack_from(self.buf.data, at)[0]

    def int_(self, slot: int, kind: str, name: str, default: int = 0) -> int:
        """An integer scalar field (``kind`` as in :data:`SCALARS`)."""
        offsets = self.offsets
        if slot >= len(offsets) or not offsets[slot]:
            return default
        at = self.pos + offsets[slot]
        st = _STRUCTS[kind]
        if at + st.size > self.buf.size:
            self.buf.check(at, st.size, self._where(name))
        return int(st.unpack_from(self.buf.data, at)[0])

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
        buf = self.buf
        if at + 4 > buf.size:
            buf.check(at, 4, self._where(name))
        rel = int(_U32.unpack_from(buf.data, at)[0])
        if rel == 0:
            raise PteFormatError(self._where(name), "zero offset")
        return at + rel

    def string(self, slot: int, name: str) -> str | None:
        span = self.vector_span(slot, name, 1)
        if span is None:
            return None
        start, n = span
        self.buf.spend(n, lambda: self._where(name))
        raw = bytes(self.buf.data[start : start + n])
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise PteFormatError(self._where(name), f"string is not UTF-8 ({e.reason})") from None

    def table(self, slot: int, name: str) -> Table | None:
        at = self._indirect(slot, name)
        if not at:
            return None
        return Table._read(self.buf, at, "", self, name)

    def vector_span(self, slot: int, name: str, item_size: int) -> tuple[int, int] | None:
        """(start, length) of a vector's items, bounds-checked, or None when absent."""
        at = self._indirect(slot, name)
        if not at:
            return None
        buf = self.buf
        if at + 4 > buf.size:
            buf.check(at, 4, self._where(name))
        n = int(_U32.unpack_from(buf.data, at)[0])
        if at + 4 + n * item_size > buf.size:
            buf.check(at + 4, n * item_size, self._where(name))
        return at + 4, n

    def scalars(self, slot: int, kind: str, name: str) -> tuple[int, ...] | None:
        """A vector of scalars as a tuple (None when the field is absent)."""
        letter, size = SCALARS[kind]
        span = self.vector_span(slot, name, size)
        if span is None:
            return None
        start, n = span
        self.buf.spend(n, lambda: self._where(name))
        return struct.unpack_from(f"<{n}{letter}", self.buf.data, start)

    def bytes_span(self, slot: int, name: str) -> tuple[int, int] | None:
        """(start, length) of a ``[ubyte]`` field, for zero-copy access to its data."""
        return self.vector_span(slot, name, 1)

    def tables(
        self,
        slot: int,
        name: str,
        decode: Callable[[Table], T],
        limit: int | None = None,
        fast: Callable[..., T | None] | None = None,
        indexed: bool = False,
    ) -> tuple[T, ...] | None:
        """A vector of tables, each decoded with ``decode``; None when absent. ``fast``,
        when given, is tried first on each item (the buffer and the item's position, and
        with ``indexed`` its index in the vector): it returns what ``decode`` would, or
        None for ``decode`` to read the item (anything it does not handle, or cannot read:
        ``decode`` then raises the error)."""
        span = self.vector_span(slot, name, 4)
        if span is None:
            return None
        start, n = span
        if limit is not None and n > limit:
            raise PteFormatError(self._where(name), f"{n} items exceed the limit of {limit}")
        self.buf.spend(n, lambda: self._where(name))
        out = []
        buf = self.buf
        read = Table._read
        rels = struct.unpack_from(f"<{n}I", buf.data, start)
        for i, rel in enumerate(rels):
            if rel == 0:
                raise PteFormatError(self._where(f"{name}[{i}]"), "zero offset")
            at = start + 4 * i + rel
            if fast is not None:
                item = fast(buf, at, i) if indexed else fast(buf, at)
                if item is not None:
                    out.append(item)
                    continue
            out.append(decode(read(buf, at, "", self, (name, i))))
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
        return code, Table._read(self.buf, at, "", self, label)
