"""The ETDump writer and reader (format layer): round trips, and ExecuTorch's flatc-based
reader as the independent reference for the bytes."""

from __future__ import annotations

import contextlib
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ptexec.errors import PteFormatError
from ptexec.format.etdump import (
    RUN_OUTPUT_CHAIN,
    AllocationEvent,
    DebugEvent,
    ETDump,
    ProfileEvent,
    RunData,
    TensorRef,
    Value,
    decode_etdump,
    encode_etdump,
)
from ptexec.format.flatbuf import Buffer
from ptexec.format.flatbuild import Builder

i32 = st.integers(-(2**31), 2**31 - 1)
u64 = st.integers(0, 2**64 - 1)
text = st.text(max_size=12)
tensors = st.builds(
    TensorRef,
    st.integers(0, 29),
    st.lists(st.integers(0, 2**40), max_size=4).map(tuple),
    st.lists(st.integers(-(2**40), 2**40), max_size=4).map(tuple),
    st.integers(0, 2**62),
)
values = st.one_of(
    st.builds(Value.of, tensors, st.none() | st.booleans()),
    st.builds(Value.of, st.lists(tensors, max_size=3).map(tuple), st.none() | st.booleans()),
    st.builds(Value.of, st.integers(-(2**63), 2**63 - 1)),
    st.builds(Value.of, st.booleans()),
    st.builds(Value.of, st.floats(allow_nan=False)),
    st.builds(Value.of, st.none()),
)
events = st.one_of(
    st.builds(
        ProfileEvent,
        st.none() | text,
        i32,
        i32,
        u64,
        u64,
        i32,
        st.none() | text,
        st.none() | st.binary(max_size=8),
    ),
    st.builds(DebugEvent, u64, i32, values, st.none() | text, i32, st.none() | text),
    st.builds(AllocationEvent, i32, u64),
)
runs = st.builds(
    RunData,
    st.none() | text,
    st.lists(events, max_size=6).map(tuple),
    i32,
    st.none() | st.lists(st.none() | text, max_size=2).map(tuple),
)
dumps = st.builds(ETDump, st.lists(runs, max_size=3).map(tuple), st.integers(0, 2**32 - 1))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dumps)
def test_round_trip(dump: ETDump) -> None:
    assert decode_etdump(encode_etdump(dump)) == dump


def _sample() -> ETDump:
    t = TensorRef(6, (2, 3), (3, 1), 64)
    return ETDump(
        (
            RunData("Default", (ProfileEvent("Method::init", -1, 0, 10, 25),)),
            RunData(
                "Execute",
                (
                    ProfileEvent("aten::add.out", 0, 0, 100, 180),
                    DebugEvent(0, 0, Value.of(t)),
                    DebugEvent(0, 1, Value.of((t, TensorRef(4, (), (), 128)))),
                    DebugEvent(0, 2, Value.of(7)),
                    DebugEvent(0, 3, Value.of(2.5)),
                    DebugEvent(0, 4, Value.of(True), name="flag"),
                    DebugEvent(0, 5, Value(3, 0.5)),  # a 32-bit float
                    ProfileEvent("DELEGATE_CALL", 0, 6, 200, 260, 3, "node", b"\x01\x02"),
                    AllocationEvent(1, 4096),
                    DebugEvent(RUN_OUTPUT_CHAIN, 0, Value.of(t, output=True)),
                ),
                bundled_input_index=2,
                allocators=("method",),
            ),
        )
    )


def test_executorch_reads_what_we_write() -> None:
    serialize = pytest.importorskip("executorch.devtools.etdump.serialize")
    dump = _sample()
    theirs = serialize.deserialize_from_etdump_flatcc(encode_etdump(dump))
    assert theirs.version == 0 and [r.name for r in theirs.run_data] == ["Default", "Execute"]
    run = theirs.run_data[1]
    assert run.bundled_input_index == 2 and [a.name for a in run.allocators] == ["method"]
    for ours, ev in zip(dump.run_data[1].events, run.events, strict=True):
        if isinstance(ours, ProfileEvent):
            p = ev.profile_event
            assert (p.name, p.chain_index, p.instruction_id, p.start_time, p.end_time) == (
                ours.name,
                ours.chain_index,
                ours.instruction_id,
                ours.start_time,
                ours.end_time,
            )
            assert p.delegate_debug_id_int == ours.delegate_debug_id_int
            if ours.delegate_debug_metadata:
                assert bytes(p.delegate_debug_metadata) == ours.delegate_debug_metadata
        elif isinstance(ours, AllocationEvent):
            a = ev.allocation_event
            assert (a.allocator_id, a.allocation_size) == (1, 4096)
        else:
            d = ev.debug_event
            assert (d.chain_index, d.instruction_id, d.name) == (
                ours.chain_index,
                ours.instruction_id,
                ours.name,
            )
            entry, want = d.debug_entry, ours.debug_entry
            names = ["Null", "Int", "Bool", "Float", "Double", "Tensor", "TensorList"]
            assert entry.val == names[want.kind]
            if want.kind == 5:
                t = entry.tensor
                assert (t.scalar_type, t.sizes, t.strides, t.offset) == (6, [2, 3], [3, 1], 64)
            elif want.kind == 6:
                assert [t.offset for t in entry.tensor_list.tensors] == [64, 128]
            elif want.kind == 1:
                assert entry.int_value.int_val == 7
            elif want.kind == 4:
                assert entry.double_value.double_val == 2.5
            elif want.kind == 3:
                assert entry.float_value.float_val == 0.5
            elif want.kind == 2:
                assert entry.bool_value.bool_val is True
            assert (entry.output is not None and entry.output.bool_val) == bool(want.output)


def test_reads_what_executorch_writes() -> None:
    """ExecuTorch's own ETDump of a small program, through our reader and writer: flatc
    reads our rewrite exactly as it reads the original."""
    serialize = pytest.importorskip("executorch.devtools.etdump.serialize")
    from executorch.extension.pybindings.test.make_test import ModuleAdd, create_program
    from executorch.runtime import Runtime

    ep, inputs = create_program(ModuleAdd())
    program = Runtime.get().load_program(ep.buffer, enable_etdump=True, debug_buffer_size=4096)
    program.load_method("forward").execute(inputs)
    with tempfile.TemporaryDirectory() as d:
        program.write_etdump_result_to_file(str(Path(d, "e.etdp")), str(Path(d, "e.bin")))
        raw = Path(d, "e.etdp").read_bytes()
    ours = decode_etdump(raw)
    names = [e.name for e in ours.run_data[1].events if isinstance(e, ProfileEvent)]
    assert "OPERATOR_CALL" in names and "Method::execute" in names
    outputs = [
        e for e in ours.run_data[1].events if isinstance(e, DebugEvent) and e.debug_entry.output
    ]
    assert len(outputs) == 1 and outputs[0].chain_index == RUN_OUTPUT_CHAIN
    rewritten = encode_etdump(ours)
    j = serialize._serialize_from_etdump_to_json
    assert j(serialize.deserialize_from_etdump_flatcc(rewritten)) == j(
        serialize.deserialize_from_etdump_flatcc(raw)
    )


def test_malformed_inputs_raise_the_format_error() -> None:
    good = encode_etdump(_sample())
    for bad in (b"", b"\x01\x00", good[:-9], good[:4] + b"XXXX" + good[8:], b"\xff" * 64):
        with pytest.raises(PteFormatError):
            decode_etdump(bad)
    with pytest.raises(PteFormatError, match="size prefix"):
        decode_etdump(struct.pack("<I", 1 << 20) + good[4:])


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_corrupt_bytes_load_or_raise_the_format_error(data: st.DataObject) -> None:
    raw = bytearray(encode_etdump(_sample()))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(4, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    with contextlib.suppress(PteFormatError):
        decode_etdump(bytes(raw))


def test_builder_shares_vtables_and_aligns_scalars() -> None:
    b = Builder(16)  # small, so it must grow
    refs = []
    for k in range(50):
        b.start_table()
        b.add_scalar(0, "u64", k + 1)
        b.add_scalar(1, "u8", 3)
        refs.append(b.end_table())
    vec = b.offsets(refs)
    b.start_table()
    b.add_offset(0, vec)
    data = b.finish(b.end_table(), b"TEST")
    assert data[4:8] == b"TEST" and len(data) % 8 == 0
    root = Buffer(data).root()
    tables = root.tables(0, "items", lambda t: t)
    assert tables is not None
    assert [t.int_(0, "u64", "a") for t in tables] == list(range(1, 51))
    assert all(t.int_(1, "u8", "b") == 3 for t in tables)
    assert len({t.vtable for t in tables}) == 1  # one vtable, shared by all 50 tables
    for t in tables:  # every u64 field on an 8-byte boundary of the buffer
        assert (t.pos + struct.unpack_from("<H", data, t.vtable + 4)[0]) % 8 == 0


def test_builder_refuses_misuse() -> None:
    b = Builder()
    b.start_table()
    with pytest.raises(ValueError, match="inside a table"):
        b.string("x")
    b.add_scalar(0, "i32", 5)
    with pytest.raises(ValueError, match="set twice"):
        b.add_scalar(0, "i32", 6)
    ref = b.end_table()
    b.finish(ref)
    with pytest.raises(ValueError, match="finished"):
        b.string("late")
