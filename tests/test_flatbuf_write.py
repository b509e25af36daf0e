"""ptexec's FlatBuffers writer, read back with ptexec's reader (and, for whole programs,
with ExecuTorch's runtime in tests/test_xnnpack_executorch.py)."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from ptexec.format.flatbuf import SCALARS, Buffer
from ptexec.format.flatbuf import Table as RTable
from ptexec.format.flatbuf_write import MAX_ALIGN, String, Table, TableVector, Vector, finish

_KINDS = ["u8", "i8", "bool", "u16", "i32", "u32", "i64", "u64", "f64"]


def _value(kind: str, draw: st.DrawFn) -> int | float | bool:
    if kind == "bool":
        return draw(st.booleans())
    if kind == "f64":
        return draw(st.floats(allow_nan=False))
    letter, size = SCALARS[kind]
    signed = letter.islower()
    bits = 8 * size
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    return draw(st.integers(lo, hi))


@st.composite
def _tables(draw: st.DrawFn, depth: int = 0) -> tuple[Table, dict[int, object]]:
    """A table and what each slot should read back as."""
    t = Table()
    want: dict[int, object] = {}
    slots = draw(st.lists(st.integers(0, 12), unique=True, max_size=6))
    for slot in slots:
        what = draw(st.sampled_from(["scalar", "str", "vec", "table", "tables"]))
        if what == "scalar" or (depth >= 2 and what in ("table", "tables")):
            kind = draw(st.sampled_from(_KINDS))
            v = _value(kind, draw)
            t.scalar(slot, kind, v)
            want[slot] = ("scalar", kind, v)
        elif what == "str":
            text = draw(st.text(max_size=12))
            t.ref(slot, String(text))
            want[slot] = ("str", text)
        elif what == "vec":
            kind = draw(st.sampled_from([k for k in _KINDS if k != "f64"]))
            items = draw(st.lists(st.just(0), max_size=5))
            items = [_value(kind, draw) for _ in items]
            align = draw(st.sampled_from([0, 16]))
            t.ref(slot, Vector(kind, items, align=align))
            want[slot] = ("vec", kind, items, align)
        elif what == "table":
            child, cw = draw(_tables(depth + 1))
            t.ref(slot, child)
            want[slot] = ("table", cw)
        else:
            children = draw(st.lists(_tables(depth + 1), max_size=3))
            t.ref(slot, TableVector([c for c, _ in children]))
            want[slot] = ("tables", [w for _, w in children])
    return t, want


def _check(t: RTable, want: dict[int, object]) -> None:
    for slot, spec in want.items():
        assert isinstance(spec, tuple)
        what = spec[0]
        if what == "scalar":
            _, kind, v = spec
            at = t._field(slot)
            assert at % SCALARS[kind][1] == 0  # aligned to its size
            got = (
                t.f64(slot, "x")
                if kind == "f64"
                else (t.bool_(slot, "x") if kind == "bool" else t.int_(slot, kind, "x"))
            )
            assert got == v
        elif what == "str":
            assert t.string(slot, "x") == spec[1]
        elif what == "vec":
            _, kind, items, align = spec
            span = t.vector_span(slot, "x", SCALARS[kind][1])
            assert span is not None
            start, n = span
            assert n == len(items)
            assert start % max(align, SCALARS[kind][1]) == 0
            assert list(t.scalars(slot, kind, "x") or ()) == items
        elif what == "table":
            child = t.table(slot, "x")
            assert child is not None
            _check(child, spec[1])
        else:
            got = t.tables(slot, "x", lambda c: c) or ()
            assert len(got) == len(spec[1])
            for c, w in zip(got, spec[1], strict=True):
                _check(c, w)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(_tables())
def test_written_buffers_read_back(tree: tuple[Table, dict[int, object]]) -> None:
    root, want = tree
    data = finish(root, b"TEST", reserve=32)
    assert len(data) % MAX_ALIGN == 0
    assert bytes(data[4:8]) == b"TEST" and bytes(data[8:40]) == bytes(32)
    buf = Buffer(bytes(data))
    _check(buf.root(), want)


def test_every_offset_points_forward() -> None:
    """Children follow their parents, as the reader requires of a buffer it walks."""
    leaf = Table().scalar(0, "i32", 7)
    root = Table().ref(0, TableVector([leaf, Table().ref(0, String("x"))])).ref(1, leaf)
    data = finish(root, b"TEST")
    (root_at,) = struct.unpack_from("<I", data, 0)
    r = Buffer(bytes(data)).root()
    kids = r.tables(0, "k", lambda t: t) or ()
    assert all(k.pos > root_at for k in kids)
    one = r.table(1, "one")
    assert one is not None and one.pos > root_at and one.int_(0, "i32", "v") == 7
