"""The format layer: headers, segments, validation errors with paths, zero-copy constants."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ptexec
from fixture_data import fixture_paths
from ptexec.errors import PteFormatError
from ptexec.format import program as p
from ptexec.format import read_ptd, read_pte
from ptexec.format.flatbuf import Buffer, Table

MLP = fixture_paths("mlp")[0].read_bytes()


def test_reads_every_fixture_without_torch() -> None:
    code = (
        "import sys, pathlib\n"
        "from ptexec.format import read_pte, read_ptd\n"
        "d = pathlib.Path(sys.argv[1])\n"
        "for f in sorted(d.glob('*.pte')): read_pte(f.read_bytes())\n"
        "for f in sorted(d.glob('*.ptd')): read_ptd(f.read_bytes())\n"
        "assert 'torch' not in sys.modules, 'the format layer imported torch'\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(fixture_paths("mlp")[0].parent)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "ok"


def test_mlp_structure() -> None:
    pte = read_pte(MLP)
    assert pte.header is not None and pte.header.segment_base_offset % 128 == 0
    plan = pte.program.execution_plan[0]
    assert plan.name == "forward"
    assert plan.non_const_buffer_sizes[0] == 0
    kinds = {type(v).__name__ for v in plan.values}
    assert "Tensor" in kinds and "IntList" in kinds
    ops = [op.qualified_name for op in plan.operators]
    assert "aten::addmm.out" in ops
    assert all(isinstance(i, p.KernelCall) for i in plan.chains[0].instructions)


def test_agrees_with_executorch_deserializer() -> None:
    """Every value, instruction and operator as ExecuTorch's own Python reader sees it."""
    serialize = pytest.importorskip("executorch.exir._serialize._program")
    from fixture_data import load_manifest

    for name in load_manifest():
        data = fixture_paths(name)[0].read_bytes()
        ours = read_pte(data).program
        theirs = serialize.deserialize_pte_binary(data).program
        assert len(ours.execution_plan) == len(theirs.execution_plan)
        for a, b in zip(ours.execution_plan, theirs.execution_plan, strict=True):
            assert a.name == b.name
            assert list(a.inputs) == list(b.inputs) and list(a.outputs) == list(b.outputs)
            assert list(a.non_const_buffer_sizes) == list(b.non_const_buffer_sizes)
            assert [o.qualified_name for o in a.operators] == [
                f"{o.name}.{o.overload}" if o.overload else o.name for o in b.operators
            ]
            assert len(a.values) == len(b.values)
            for va, vb in zip(a.values, b.values, strict=True):
                kind = type(vb.val).__name__
                assert type(va).__name__ == kind, (name, va, vb)
                if kind == "Tensor":
                    t = vb.val
                    assert va.sizes == tuple(t.sizes) and va.dim_order == tuple(t.dim_order)
                    assert va.scalar_type == int(t.scalar_type)
                    assert va.data_buffer_idx == t.data_buffer_idx
                    assert va.shape_dynamism == int(t.shape_dynamism)
                    if t.allocation_info is None:
                        assert va.allocation_info is None
                    else:
                        assert va.allocation_info is not None
                        assert va.allocation_info.memory_id == t.allocation_info.memory_id
                        assert va.allocation_info.memory_offset == (
                            t.allocation_info.memory_offset_low
                            | (t.allocation_info.memory_offset_high << 32)
                        )
                elif kind in ("Int", "Bool"):
                    assert va.value == next(iter(vars(vb.val).values()))
                elif kind == "Double":  # ExecuTorch's reader keeps inf/nan as strings
                    want = float(vb.val.double_val)
                    assert va.value == want or (want != want and va.value != va.value)
                elif kind in (
                    "IntList",
                    "TensorList",
                    "OptionalTensorList",
                    "BoolList",
                    "DoubleList",
                ):
                    assert list(va.items) == list(vb.val.items)
            ia, ib = a.chains[0].instructions, b.chains[0].instructions
            assert [type(x).__name__ for x in ia] == [type(y.instr_args).__name__ for y in ib]


def test_unsupported_program_version() -> None:
    data = bytearray(MLP)
    data[4:8] = b"ET13"
    with pytest.raises(PteFormatError, match="unsupported ExecuTorch program version 'ET13'"):
        read_pte(bytes(data))


def test_a_program_of_a_newer_schema_version_is_refused() -> None:
    """The ``version`` field of the program table: ExecuTorch's runtime reads schema
    version 0 and refuses a later one; a program of version 1 was loaded and run as if it
    were of version 0."""
    serialize = pytest.importorskip("executorch.exir._serialize._program")
    pte = serialize.deserialize_pte_binary(MLP)
    pte.program.version = 1
    data = bytes(serialize.serialize_pte_binary(pte))
    rt = pytest.importorskip("executorch.runtime").Runtime.get()
    with pytest.raises(RuntimeError):
        rt.load_program(data)
    with pytest.raises(PteFormatError, match=r"^version: schema version 1 is newer than 0"):
        read_pte(data)
    pte.program.version = 0
    read_pte(bytes(serialize.serialize_pte_binary(pte)))


def test_not_a_program() -> None:
    with pytest.raises(PteFormatError, match="not an ExecuTorch program"):
        read_pte(b"PK\x03\x04" + bytes(100))
    with pytest.raises(PteFormatError, match="too short"):
        read_pte(b"ET")


def _plan_table(data: bytes) -> Table:
    root = Buffer(data).root()
    plans = root.tables(1, "execution_plan", lambda t: t)
    assert plans
    return plans[0]


def _tensor_tables(data: bytes) -> list[tuple[int, Table]]:
    plan = _plan_table(data)
    values = plan.tables(2, "values", lambda t: t) or ()
    out = []
    for j, ev in enumerate(values):
        code, table = ev.union(0, "val")
        if code == 5 and table is not None:
            out.append((j, table))
    return out


def test_planned_tensor_outside_its_buffer_names_its_path() -> None:
    data = bytearray(MLP)
    for j, tensor in _tensor_tables(bytes(data)):
        alloc = tensor.table(6, "allocation_info")
        if alloc is None:
            continue
        pos = alloc._field(1)  # memory_offset_low
        struct.pack_into("<I", data, pos, 4096)
        with pytest.raises(PteFormatError) as err:
            read_pte(bytes(data))
        assert err.value.path == f"execution_plan[0].values[{j}].tensor.allocation_info"
        assert "exceed buffer 1" in str(err.value)
        return
    pytest.fail("no planned tensor found")


def test_a_planned_tensor_off_its_element_boundary_names_its_path() -> None:
    """Inside its buffer but two bytes off a 4-byte element: the method's load refuses it
    (checked when the values table's recipe is made), naming the tensor."""
    for j, tensor in _tensor_tables(MLP):
        alloc = tensor.table(6, "allocation_info")
        if alloc is None or tensor.int_(0, "i8", "scalar_type") != 6:  # float32
            continue
        data = bytearray(MLP)
        pos = alloc._field(1)  # memory_offset_low
        struct.pack_into("<I", data, pos, struct.unpack_from("<I", data, pos)[0] + 2)
        try:
            prog = ptexec.load(bytes(data))
        except PteFormatError:
            continue  # (past its buffer: refused by the file's checks)
        with pytest.raises(PteFormatError, match="not a multiple of the element size") as err:
            prog.load_method("forward")
        assert err.value.path == f"execution_plan[0].values[{j}].tensor.allocation_info"
        return
    pytest.fail("no float planned tensor with room to move")


def test_dim_order_must_be_a_permutation() -> None:
    data = bytearray(MLP)
    for j, tensor in _tensor_tables(bytes(data)):
        span = tensor.vector_span(3, "dim_order", 1)
        if span and span[1] >= 2:
            data[span[0]] = data[span[0] + 1]
            with pytest.raises(
                PteFormatError, match=rf"values\[{j}\]\.tensor\.dim_order: .* not a permutation"
            ):
                read_pte(bytes(data))
            return
    pytest.fail("no rank-2 tensor")


def test_truncated_file() -> None:
    """A file cut anywhere after its header says how long it should have been."""
    pte = read_pte(MLP)
    assert pte.header is not None
    for cut in (pte.segments[0].offset + 4, pte.header.program_size - 1, len(MLP) - 1, 20):
        need = len(MLP) if cut >= 40 else 40  # the eh00 header itself ends at byte 40
        with pytest.raises(
            PteFormatError, match=rf"the file is truncated: needs {need} bytes, has {cut}$"
        ):
            read_pte(MLP[:cut])
    root = struct.unpack_from("<I", MLP)[0]
    for cut in (8, 11):  # the file identifier, not yet the extended header: the root table
        with pytest.raises(
            PteFormatError, match=rf"^root table: the file is truncated: needs {root + 4} bytes"
        ):
            read_pte(MLP[:cut])


def test_truncated_file_without_segment_data_size() -> None:
    """A 24-byte eh00 header (ExecuTorch reads those too) does not give the segment data's
    size: the segments do."""
    data = bytearray(MLP)
    struct.pack_into("<I", data, 12, 24)  # the header length; the size field is ignored
    read_pte(bytes(data))
    end = max(s.offset + s.size for s in read_pte(MLP).segments)
    with pytest.raises(PteFormatError, match=rf"truncated: needs {end} bytes, has {end - 3}$"):
        read_pte(bytes(data[: end - 3]))


def test_segment_past_the_end_of_a_complete_file() -> None:
    """The header says the file is complete, a segment says otherwise: the segment is
    named and the file is not called truncated."""
    data = bytearray(MLP)
    root = Buffer(bytes(data)).root()
    segments = root.tables(4, "segments", lambda t: t) or ()
    struct.pack_into("<Q", data, segments[0]._field(1), len(MLP))  # its size
    with pytest.raises(PteFormatError, match=r"^segments\[0\]: bytes .* lie past the end"):
        read_pte(bytes(data))


def test_truncated_data_file() -> None:
    _, ptd = fixture_paths("external")
    assert ptd is not None
    data = ptd.read_bytes()
    for cut in (len(data) - 1, 30):
        need = len(data) if cut >= 48 else 48
        with pytest.raises(PteFormatError, match=rf"truncated: needs {need} bytes, has {cut}$"):
            read_ptd(data[:cut])


def test_operator_index_out_of_range() -> None:
    data = bytearray(MLP)
    plan = _plan_table(bytes(data))
    chains = plan.tables(5, "chains", lambda t: t)
    assert chains
    instructions = chains[0].tables(2, "instructions", lambda t: t) or ()
    for i, ins in enumerate(instructions):
        _, call = ins.union(0, "instr_args")
        assert call is not None
        if call.has(0):  # op_index 0 is the default and is not stored
            struct.pack_into("<i", data, call._field(0), 99)
            with pytest.raises(
                PteFormatError,
                match=rf"chains\[0\]\.instructions\[{i}\]\.kernel_call\.op_index: operator 99 out of range",
            ):
                read_pte(bytes(data))
            return
    pytest.fail("no instruction with a stored op_index")


def test_constants_are_views_of_the_mapped_file() -> None:
    path = fixture_paths("mlp")[0]
    prog = ptexec.load(path)
    method = prog.load_method("forward")
    mapped = prog.pte.data
    import ctypes

    base = ctypes.addressof(ctypes.c_char.from_buffer(mapped))
    constants = [
        method.values()[j]
        for j, v in enumerate(prog.pte.program.execution_plan[0].values)
        if isinstance(v, p.Tensor) and v.is_constant
    ]
    assert constants
    for t in constants:
        assert base <= t.data_ptr() < base + len(mapped), "constant was copied"


def test_loads_from_bytes_bytearray_and_file_objects() -> None:
    import io

    x = torch.randn(2, 8)
    results = []
    for source in (MLP, bytearray(MLP), io.BytesIO(MLP), memoryview(MLP), fixture_paths("mlp")[0]):
        results.append(ptexec.load(source).load_method("forward")(x)[0])
    for r in results[1:]:
        torch.testing.assert_close(r, results[0])


def test_program_from_bytes_outlives_the_callers_buffer() -> None:
    data = bytearray(MLP)
    method = ptexec.load(bytes(data)).load_method("forward")
    data[:] = b"\x00" * len(data)
    del data
    x = torch.randn(2, 8)
    reference = ptexec.load(fixture_paths("mlp")[0]).load_method("forward")(x)[0]
    torch.testing.assert_close(method(x)[0], reference)


@pytest.mark.parametrize("kind", ["bytearray", "memoryview", "data_path"])
def test_a_writable_buffer_filled_again_does_not_reach_the_program(kind: str) -> None:
    """A ``bytearray`` or writable ``memoryview`` is read into the program's own memory (a
    caller reusing its read buffer changed the weights of the program loaded from it)."""
    x = torch.randn(2, 8)
    if kind == "data_path":
        pte, ptd = fixture_paths("external")
        assert ptd is not None
        buffer = bytearray(ptd.read_bytes())
        method = ptexec.load(pte, data_path=buffer).load_method("forward")
        reference = ptexec.load(pte, data_path=ptd).load_method("forward")(x)[0]
        buffer[:] = b"\x00" * len(buffer)
    else:
        buffer = bytearray(MLP)
        method = ptexec.load(buffer if kind == "bytearray" else memoryview(buffer)).load_method()
        reference = ptexec.load(MLP).load_method("forward")(x)[0]
        buffer[:] = b"\x00" * len(buffer)
    torch.testing.assert_close(method(x)[0], reference)


def test_external_data_file() -> None:
    pte, ptd = fixture_paths("external")
    assert ptd is not None
    data = read_ptd(ptd.read_bytes())
    assert data.entries and all(e.layout is not None for e in data.entries.values())
    with pytest.raises(PteFormatError, match="data_path"):
        ptexec.load(pte.read_bytes()).load_method("forward")  # bytes: no folder to look in
    with pytest.raises(PteFormatError, match="not an ExecuTorch data file"):
        read_ptd(MLP)


def _foreign_files() -> dict[str, bytes]:
    """The files people give a runtime instead of a program, made by their own writers."""
    import io

    class Add(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    def saved(write) -> bytes:
        buf = io.BytesIO()
        write(buf)
        return buf.getvalue()

    x = torch.ones(2)
    _, ptd = fixture_paths("external")
    assert ptd is not None
    return {
        "checkpoint": saved(lambda f: torch.save({"w": x}, f)),
        "legacy checkpoint": saved(
            lambda f: torch.save({"w": x}, f, _use_new_zipfile_serialization=False)
        ),
        "torch.export": saved(lambda f: torch.export.save(torch.export.export(Add(), (x,)), f)),
        "torchscript": saved(lambda f: torch.jit.save(torch.jit.trace(Add(), x), f)),
        "ptd": ptd.read_bytes(),
        "empty": b"",
        "text": b"name,value\nw,1.0\n",
        "lfs": b"version https://git-lfs.github.com/spec/v1\noid sha256:0f\nsize 3024\n",
        "html": b"<!DOCTYPE html>\n<html><head><title>model.pte</title></head></html>\n",
    }


FOREIGN = {
    "checkpoint": r"a PyTorch checkpoint \(torch.save, a zip archive\); export the model with "
    r"torch.export and ExecuTorch",
    "legacy checkpoint": r"a PyTorch checkpoint \(torch.save, legacy format\); export",
    "torch.export": r"a torch.export archive \(.pt2, torch.export.save\).* lower it with "
    r"to_edge_transform_and_lower",
    "torchscript": r"a TorchScript module \(torch.jit.save, a zip archive\); export",
    "ptd": r"an ExecuTorch data file \(.ptd\).* give this file as its data \(data_path=",
    "empty": r"the file is empty \(0 bytes\)",
    "text": r"a text file \(it starts with 'name,value'\)",
    "lfs": r"a Git LFS pointer.* \(git lfs pull",
    "html": r"a web page \(HTML\)",
}


def test_foreign_files_are_named(tmp_path) -> None:
    """Each is a PteFormatError that says what the file is and what to do, from bytes and
    from a path alike."""
    files = _foreign_files()
    assert set(files) == set(FOREIGN)
    for kind, data in files.items():
        with pytest.raises(
            PteFormatError, match=r"^header: not an ExecuTorch program: (it is|the file is) "
        ):
            read_pte(data)
        with pytest.raises(PteFormatError, match=FOREIGN[kind]):
            read_pte(data)
        if data:
            path = tmp_path / "model.pte"
            path.write_bytes(data)
            with pytest.raises(PteFormatError, match=FOREIGN[kind]):
                ptexec.load(path)


def test_a_program_given_as_data_file_is_named() -> None:
    with pytest.raises(
        PteFormatError, match=r"not an ExecuTorch data file \(.ptd\): it is an ExecuTorch program"
    ):
        read_ptd(MLP)


def test_identify_never_raises() -> None:
    from ptexec.format.identify import describe

    for data in (b"PK\x03\x04", b"\x80", b"\x80\x02", b"\xff" * 600, b"\xe2\x82" * 300, b"\n\n"):
        describe(data)  # returns a phrase or None, whatever the bytes
    assert describe(b"\xff\xfe\x00\x01" * 10) is None
    assert describe("é".encode() * 300) is not None  # a window that ends inside a character


def _decoded_both_ways(flat: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[object, object]:
    """(decoded with the fast paths, decoded by the table decoders alone): each the
    program, or the error's type and message."""
    from ptexec.format import decode

    def run() -> object:
        try:
            return decode.decode_program(Buffer(flat))
        except PteFormatError as e:
            return (type(e), str(e))

    fast = run()
    with monkeypatch.context() as m:
        m.setattr(decode, "_fast_evalue", lambda buf, pos: None)
        m.setattr(decode, "_fast_instruction", lambda buf, pos: None)
        slow = run()
    return fast, slow


@pytest.mark.parametrize(
    "name",
    ["mlp", "transformer", "llama_sdpa_kv", "dynamic_unbound", "xnnpack/transformer_int4_group"],
)
def test_fast_decoding_agrees_with_the_table_decoders(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast paths for values (ints, bools, tensors, lists of ints and of tensors) and
    kernel and delegate calls give what the table decoders give, on the fixture and on
    copies with bytes changed (the same program, or the same error with the same path)."""
    import random

    if name.startswith("xnnpack/"):
        data = (Path(__file__).parent / "fixtures" / f"{name}.pte").read_bytes()
    else:
        data = fixture_paths(name)[0].read_bytes()
    flat_end = read_pte(data).header.program_size if read_pte(data).header else len(data)
    flat = data[:flat_end]
    fast, slow = _decoded_both_ways(flat, monkeypatch)
    assert isinstance(fast, p.Program) and fast == slow
    rng = random.Random(0)
    errors = 0
    for _ in range(300):
        mutated = bytearray(flat)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(mutated))
            mutated[at] = rng.choice((0, 1, 2, 5, 0x7F, 0xFF, rng.randrange(256)))
        fast, slow = _decoded_both_ways(bytes(mutated), monkeypatch)
        assert fast == slow or repr(fast) == repr(slow)  # (a changed double may be NaN)
        errors += not isinstance(fast, p.Program)
    assert errors  # some of the changes were defects


def test_a_tensor_layout_whose_fields_share_bytes_decodes_as_the_table_decoders_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tensor fast path reads a vtable layout's fields in one unpacking; a layout whose
    fields share bytes (``scalar_type`` read from the offset of ``sizes``) is left to the
    table decoder, and the program is what the table decoders make of it."""
    data = fixture_paths("mlp")[0].read_bytes()
    flat = bytearray(data[: read_pte(data).header.program_size])
    buf = Buffer(bytes(flat))
    root = buf.root()
    plans = root.vector_span(1, "execution_plan", 4)
    assert plans is not None
    first_plan = plans[0] + struct.unpack_from("<I", flat, plans[0])[0]
    plan_t = Table.at(buf, first_plan, "plan")
    values = plan_t.vector_span(2, "values", 4)
    assert values is not None
    changed = 0
    for k in range(values[1]):
        at = values[0] + 4 * k
        ev = at + struct.unpack_from("<I", flat, at)[0]
        ev_t = Table.at(buf, ev, "value")
        if ev_t.int_(0, "u8", "val_type") != 5:
            continue
        tensor = ev_t.table(1, "val")
        assert tensor is not None
        if tensor.nfields > 2 and tensor.offsets[0] and tensor.offsets[2]:
            # scalar_type read from the first byte of the offset of the sizes
            struct.pack_into("<H", flat, tensor.vtable + 4, tensor.offsets[2])
            changed += 1
            break
    assert changed
    fast, slow = _decoded_both_ways(bytes(flat), monkeypatch)
    assert isinstance(fast, p.Program) and fast == slow
    before, _ = _decoded_both_ways(bytes(data[: len(flat)]), monkeypatch)
    assert isinstance(before, p.Program) and before != fast


def test_a_written_ptd_reads_back_with_each_key_in_its_own_segment() -> None:
    from ptexec.format.ptd import TensorLayout, read_ptd
    from ptexec.format.ptd_write import SEGMENT_ALIGN, ptd_bytes

    w = bytes(range(24))
    entries = [
        ("w", TensorLayout(6, (2, 3), (1, 0)), w),
        ("b", TensorLayout(6, (3,), (0,)), w[:12]),
        ("raw", None, b"xyz"),
        ("empty", TensorLayout(6, (0,), (0,)), b""),
    ]
    f = read_ptd(ptd_bytes(entries))
    assert f.version == 0 and list(f.entries) == ["w", "b", "raw", "empty"]
    for key, layout, data in entries:
        e = f.entries[key]
        assert e.layout == layout and bytes(f.bytes_of(key)) == data
        assert (e.offset - f.header.segment_base_offset) % SEGMENT_ALIGN == 0
    offsets = [f.entries[k].offset for k in ("w", "b", "raw")]
    assert len(set(offsets)) == 3
    serialize = pytest.importorskip("executorch.extension.flat_tensor.serialize.serialize")
    cord = pytest.importorskip("executorch.exir._serialize._cord")
    theirs = serialize.FlatTensorSerializer().deserialize(cord.Cord(ptd_bytes(entries)))
    assert [bytes(theirs.buffers[theirs.named_data[k].buffer_index]) for k, *_ in entries] == [
        d for *_, d in entries
    ]


def test_a_data_file_of_a_newer_schema_version_is_refused() -> None:
    """ExecuTorch reads ``FlatTensor`` schema version 0 and refuses a later one (its
    runtime's data map and its serializer alike); a ``.ptd`` of version 1 was read as if
    it were of version 0."""
    from ptexec.format.ptd import TensorLayout
    from ptexec.format.ptd_write import ptd_bytes

    data = ptd_bytes([("w", TensorLayout(6, (2,), (0,)), bytes(8))], version=1)
    serialize = pytest.importorskip("executorch.extension.flat_tensor.serialize.serialize")
    cord = pytest.importorskip("executorch.exir._serialize._cord")
    with pytest.raises(NotImplementedError, match="version 1"):
        serialize.FlatTensorSerializer().deserialize(cord.Cord(data))
    with pytest.raises(PteFormatError, match=r"^ptd.version: schema version 1 is newer than 0"):
        read_ptd(data)
