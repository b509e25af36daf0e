"""ptexec's FlatBuffers writer, read back with ptexec's reader (and, for whole files, with
ExecuTorch's readers: its runtime in tests/test_xnnpack_executorch.py, its flatc-based
ETDump reader in tests/test_etdump_format.py)."""

from __future__ import annotations

import itertools
import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ptexec.format.flatbuf import Buffer
from ptexec.format.flatbuf import Table as RTable
from ptexec.format.flatbuf_write import (
    KINDS,
    MAX_ALIGN,
    String,
    Table,
    TableVector,
    Vector,
    finish,
)

_KINDS = ["u8", "i8", "bool", "u16", "i32", "u32", "i64", "u64", "f32", "f64"]
_VECTOR_KINDS = [k for k in _KINDS if k not in ("f32", "f64")]  # the reader's scalars()


def _value(kind: str, draw: st.DrawFn) -> int | float | bool:
    if kind == "bool":
        return draw(st.booleans())
    if kind == "f64":
        return draw(st.floats(allow_nan=False))
    if kind == "f32":
        return draw(st.floats(allow_nan=False, width=32))
    letter, size = KINDS[kind]
    signed = letter.islower()
    bits = 8 * size
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    return draw(st.integers(lo, hi))


def _read(t: RTable, slot: int, kind: str) -> int | float | bool:
    if kind == "f64":
        return t.f64(slot, "x")
    if kind == "f32":
        return t.f32(slot, "x")
    if kind == "bool":
        return t.bool_(slot, "x")
    return t.int_(slot, kind, "x")


def _packed(kind: str, v: int | float | bool) -> bytes:
    return struct.pack("<" + KINDS[kind][0], v)


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
            v = 0 if draw(st.booleans()) else _value(kind, draw)
            always = draw(st.booleans())
            t.scalar(slot, kind, v, default=None if always else 0)
            want[slot] = ("scalar", kind, v, always or _packed(kind, v) != _packed(kind, 0))
        elif what == "str":
            text = draw(st.text(max_size=12))
            t.ref(slot, String(text))
            want[slot] = ("str", text)
        elif what == "vec":
            kind = draw(st.sampled_from(_VECTOR_KINDS))
            n = draw(st.integers(0, 5))
            items = [_value(kind, draw) for _ in range(n)]
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


def _check(t: RTable, want: dict[int, object], base: int) -> None:
    """``base``: where the reader's buffer starts in the written one (the size prefix)."""
    for slot, spec in want.items():
        assert isinstance(spec, tuple)
        what = spec[0]
        if what == "scalar":
            _, kind, v, present = spec
            assert t.has(slot) == present  # left out when it equals the default
            if present:
                assert (base + t._field(slot)) % KINDS[kind][1] == 0  # aligned to its size
            assert _packed(kind, _read(t, slot, kind)) == _packed(kind, v)
        elif what == "str":
            assert t.string(slot, "x") == spec[1]
        elif what == "vec":
            _, kind, items, align = spec
            span = t.vector_span(slot, "x", KINDS[kind][1])
            assert span is not None
            start, n = span
            assert n == len(items)
            assert (base + start) % max(align, KINDS[kind][1]) == 0
            assert list(t.scalars(slot, kind, "x") or ()) == items
        elif what == "table":
            child = t.table(slot, "x")
            assert child is not None
            _check(child, spec[1], base)
        else:
            got = t.tables(slot, "x", lambda c: c) or ()
            assert len(got) == len(spec[1])
            for c, w in zip(got, spec[1], strict=True):
                _check(c, w, base)


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(_tables(), st.booleans())
def test_written_buffers_read_back(tree: tuple[Table, dict[int, object]], prefixed: bool) -> None:
    root, want = tree
    data = finish(root, b"TEST", reserve=32, size_prefixed=prefixed)
    assert len(data) % MAX_ALIGN == 0
    base = 4 if prefixed else 0
    if prefixed:
        assert struct.unpack_from("<I", data)[0] == len(data) - 4
    assert bytes(data[base + 4 : base + 8]) == b"TEST"
    assert bytes(data[base + 8 : base + 40]) == bytes(32)
    _check(Buffer(bytes(data[base:])).root(), want, base)


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


@pytest.mark.parametrize("prefixed", [False, True])
def test_identical_vtables_are_shared_and_scalars_stay_aligned(prefixed: bool) -> None:
    items = [Table().scalar(0, "u64", k + 1).scalar(1, "u8", 3) for k in range(50)]
    items.append(Table().scalar(1, "u8", 3))  # another layout: its own vtable
    data = bytes(finish(Table().ref(0, TableVector(items)), b"TEST", size_prefixed=prefixed))
    base = 4 if prefixed else 0
    tables = Buffer(data[base:]).root().tables(0, "items", lambda t: t)
    assert tables is not None and len(tables) == 51
    assert [t.int_(0, "u64", "a") for t in tables] == [*range(1, 51), 0]
    assert all(t.int_(1, "u8", "b") == 3 for t in tables)
    assert len({t.vtable for t in tables[:50]}) == 1  # one vtable for the 50 alike
    assert tables[50].vtable != tables[0].vtable
    for t in tables[:50]:  # every u64 on an 8-byte boundary of the whole buffer
        assert (base + t._field(0)) % 8 == 0
    # and no padding inside: soffset, u64, u8, then 3 bytes to the next table's soffset
    assert {b.pos - a.pos for a, b in itertools.pairwise(tables[:50])} == {16}


def test_defaults_are_left_out() -> None:
    t = (
        Table()
        .scalar(0, "i32", -1, default=-1)
        .scalar(1, "f64", 0.0)
        .scalar(2, "f64", -0.0)  # not the default 0.0: written
        .scalar(3, "u8", 0, default=None)
        .scalar(4, "i32", 5)
        .scalar(4, "i32", 0)  # set back to the default: left out again
        .scalar(5, "f32", 1.5)
    )
    r = Buffer(bytes(finish(t, b"TEST"))).root()
    assert [r.has(s) for s in range(6)] == [False, False, True, True, False, True]
    assert r.int_(0, "i32", "a", -1) == -1
    assert math.copysign(1.0, r.f64(2, "c")) == -1.0
    assert r.f32(5, "f") == 1.5


def test_misuse_is_refused() -> None:
    with pytest.raises(ValueError, match="set twice"):
        finish(Table().scalar(0, "i32", 1).ref(0, String("x")), b"TEST")
    with pytest.raises(ValueError, match="out of range"):
        finish(Table().scalar(-1, "i32", 1), b"TEST")
    with pytest.raises(ValueError, match="4 bytes"):
        finish(Table(), b"TOOLONG")
