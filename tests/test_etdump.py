"""ETDump of ptexec's calls, read by ExecuTorch's Inspector.

References: ptexec's own trace (the same instructions, names and values), ExecuTorch's
runtime writing an ETDump of the same file (the Inspector's view of both must agree:
operator types from the ETRecord, numeric gaps against the exported graph), and eager
PyTorch (the fixtures' outputs).
"""

from __future__ import annotations

import itertools
import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch

import ptexec
from export_util import one_op_program
from fixture_data import FIXTURES_DIR, compare_outputs, fixture_calls, fixture_paths, tolerance
from ptexec.dtypes import CODE_TO_DTYPE
from ptexec.engine.hooks import steps_of
from ptexec.errors import LimitExceededError, StateError
from ptexec.etdump import DEBUG_ALIGNMENT, DebugBuffer, ETDumpRecorder
from ptexec.format.etdump import RUN_OUTPUT_CHAIN, DebugEvent, ProfileEvent, decode_etdump
from ptexec.runtime import Runtime

COMPAT = FIXTURES_DIR / "compat"


def _io(name: str) -> dict[str, Any]:
    return torch.load(COMPAT / "compat.io.pt", weights_only=True)[name]  # type: ignore[no-any-return]


def _inspector():  # type: ignore[no-untyped-def]
    return pytest.importorskip("executorch.devtools").Inspector


def _dump(runtime: Any, pte: Path, inputs: list[Any], tmp: Path, tag: str, calls: int = 2):  # type: ignore[no-untyped-def]
    program = runtime.load_program(pte, enable_etdump=True, debug_buffer_size=1 << 20)
    method = program.load_method("forward")
    outputs = [method.execute(inputs) for _ in range(calls)]
    etdp, dbg = tmp / f"{tag}.etdp", tmp / f"{tag}.bin"
    program.write_etdump_result_to_file(str(etdp), str(dbg))
    return etdp, dbg, outputs


def _execute_block(inspector: Any) -> Any:
    (block,) = [b for b in inspector.event_blocks if b.name == "Execute"]
    return block


def _by_instruction(block: Any, skip: set[str]) -> dict[int, Any]:
    """The instructions' own rows (a delegate's per-node rows left out)."""
    return {
        e._instruction_id: e for e in block.events if e.name not in skip and not e.is_delegated_op
    }


_FRAMEWORK = {"Method::execute", "OPERATOR_CALL", "Method::init", "Program::load_method"}


def _same_debug_data(got: list[Any], expected: list[Any]) -> None:
    """One instruction's logged values, as the Inspector reads them, against ExecuTorch's:
    as many, each of the same kind, dtype, shape and value."""
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        if isinstance(b, list):
            assert isinstance(a, list)
            _same_debug_data(a, b)
        elif isinstance(b, torch.Tensor):
            assert isinstance(a, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
            if b.is_floating_point():
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)
            else:
                assert torch.equal(a, b)
        else:
            assert a == b


@pytest.mark.parametrize("name", ["ops", "xnnpack"])
def test_inspector_reads_ptexec_etdump_like_executorchs(name: str, tmp_path: Path) -> None:
    inspector_cls = _inspector()
    from executorch.runtime import Runtime as ETRuntime

    pte, etrecord = COMPAT / f"{name}.pte", str(COMPAT / f"{name}.etrecord")
    io = _io(name)
    etdp, dbg, outs = _dump(Runtime.get(), pte, io["inputs"], tmp_path, "ptexec")
    for got in outs:
        assert compare_outputs(list(got), io["outputs"], 1e-5, 1e-5) is None
    et_etdp, et_dbg, _ = _dump(ETRuntime.get(), pte, io["inputs"], tmp_path, "executorch")

    ours = inspector_cls(etdump_path=str(etdp), debug_buffer_path=str(dbg), etrecord=etrecord)
    theirs = inspector_cls(
        etdump_path=str(et_etdp), debug_buffer_path=str(et_dbg), etrecord=etrecord
    )
    block = _execute_block(ours)
    assert [b.name for b in ours.event_blocks] == ["Default", "Execute"]

    # the per-operator table is ExecuTorch's, row for row, and its instructions' rows are
    # the trace's: each executed instruction, in order
    their_rows = _execute_block(theirs).events
    assert [e.name for e in block.events] == [e.name for e in their_rows]
    method = ptexec.load(pte).load_method("forward")
    trace = method.trace(io["inputs"], tensors=True)
    ran = [e for e in block.events if e.name not in _FRAMEWORK and not e.is_delegated_op]
    assert [e._instruction_id for e in ran] == [r.index for r in trace.records]
    # under the default runner ExecuTorch's XNNPACK backend runs the delegates, and its own
    # per-node events are taken: the same delegated rows as in ExecuTorch's ETDump
    delegated = [(e.name, e._instruction_id) for e in block.events if e.is_delegated_op]
    assert delegated == [(e.name, e._instruction_id) for e in their_rows if e.is_delegated_op]
    assert bool(delegated) == (name == "xnnpack")
    assert all(len(e.perf_data.raw) == 2 for e in block.events)  # both calls, one event

    # intermediate values: what ExecuTorch's runtime logs for each instruction (every out
    # argument of a kernel, every argument of a delegate call), the same values
    events = _by_instruction(block, _FRAMEWORK)
    reference = _by_instruction(_execute_block(theirs), _FRAMEWORK | {"OPERATOR_CALL"})
    assert set(events) == set(reference)
    for index, event in events.items():
        _same_debug_data(event.debug_data, reference[index].debug_data)

    # what the ETRecord attaches, and the run's outputs, as for ExecuTorch's own ETDump
    for index, event in events.items():
        assert event.op_types == reference[index].op_types
        assert event.delegate_backend_name == reference[index].delegate_backend_name
    if name == "xnnpack":
        delegates = [e for e in block.events if e.name == "DELEGATE_CALL"]
        assert delegates and {e.delegate_backend_name for e in delegates} == {"XnnpackBackend"}
    for a, b in zip(block.run_output, io["outputs"], strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)

    # the numeric debugger pairs the same graph nodes, with the same (zero) gaps
    gap, ref_gap = ours.calculate_numeric_gap("MSE"), theirs.calculate_numeric_gap("MSE")
    assert list(gap["aot_ops"]) == list(ref_gap["aot_ops"])
    for a, b in zip(gap["gap"], ref_gap["gap"], strict=True):
        assert a == pytest.approx(b, abs=1e-6)


def test_control_flow_records_what_ran(tmp_path: Path) -> None:
    """torch.cond: the branch not taken has no events; the jump has one."""
    inspector_cls = _inspector()
    pte = fixture_paths("cond")[0]
    call = fixture_calls("cond")[0]
    etdp, dbg, _ = _dump(Runtime.get(), pte, call["inputs"], tmp_path, "cond", calls=1)
    trace = ptexec.load(pte).load_method("forward").trace(call["inputs"])
    block = _execute_block(inspector_cls(etdump_path=str(etdp), debug_buffer_path=str(dbg)))
    rows = [e for e in block.events if e.name not in ("Method::execute", "OPERATOR_CALL")]
    assert [e._instruction_id for e in rows] == [r.index for r in trace.records]
    assert "JF_CALL" in [e.name for e in block.events]  # as ExecuTorch names a jump
    assert trace.skipped[0]  # the other branch did not run: nothing recorded for it


def test_events_and_debug_buffer(tmp_path: Path) -> None:
    pte = fixture_paths("transformer")[0]
    call = fixture_calls("transformer")[0]
    method = ptexec.load(pte).load_method("forward")
    rec = ETDumpRecorder(debug_buffer_size=1 << 20)
    outputs = rec.execute(method, call["inputs"])
    assert compare_outputs(outputs, call["outputs"], *tolerance("transformer")) is None
    (run,) = rec.runs
    profile = [e for e in run.events if isinstance(e, ProfileEvent)]
    debug = [e for e in run.events if isinstance(e, DebugEvent)]
    top = profile[-1]
    assert top.name == "Method::execute" and top.chain_index == -1
    for e in profile[:-1]:  # within the call, each start <= end
        assert top.start_time <= e.start_time <= e.end_time <= top.end_time
    # per instruction, in order: the kernel's event inside the OPERATOR_CALL closing it
    by_instruction = itertools.groupby(profile[:-1], lambda e: (e.chain_index, e.instruction_id))
    outer = []
    for _, group in by_instruction:
        *inner, last = group
        assert last.name == "OPERATOR_CALL" and len(inner) == 1
        assert inner[0].name is not None and inner[0].name.startswith("native_call_")
        for e in inner:
            assert last.start_time <= e.start_time <= e.end_time <= last.end_time
        outer.append(last)
    assert all(a.end_time <= b.start_time for a, b in itertools.pairwise(outer))
    data = rec.debug_buffer()
    outs = [e for e in debug if e.chain_index == RUN_OUTPUT_CHAIN]
    assert len(outs) == len(outputs) and all(e.debug_entry.output for e in outs)
    for e, expected in zip(outs, outputs, strict=True):
        t = e.debug_entry.data
        assert t.offset % DEBUG_ALIGNMENT == 0
        n = expected.numel() * expected.element_size()
        got = torch.frombuffer(bytearray(data[t.offset : t.offset + n]), dtype=expected.dtype)
        assert torch.equal(got.view(t.sizes), expected)
    # the file: what was recorded, then nothing
    rec.write(tmp_path / "t.etdp", tmp_path / "t.bin")
    assert decode_etdump((tmp_path / "t.etdp").read_bytes()).run_data == (run,)
    assert (tmp_path / "t.bin").read_bytes() == data
    assert rec.runs == () and rec.debug_buffer() == b""


def test_a_full_debug_buffer_fails_the_call_and_records_nothing() -> None:
    pte = fixture_paths("mlp")[0]
    call = fixture_calls("mlp")[0]
    method = ptexec.load(pte).load_method("forward")
    rec = ETDumpRecorder(debug_buffer_size=100)  # one [2, 16] float tensor is 128 bytes
    with pytest.raises(LimitExceededError, match="debug_buffer_size=100") as e:
        rec.execute(method, call["inputs"])
    assert isinstance(e.value, RuntimeError)
    assert rec.runs == () and rec.debug_buffer() == b""
    assert (
        compare_outputs(method.execute(call["inputs"]), call["outputs"], *tolerance("mlp")) is None
    )
    big = ETDumpRecorder(debug_buffer_size=1 << 16)
    assert (
        compare_outputs(big.execute(method, call["inputs"]), call["outputs"], *tolerance("mlp"))
        is None
    )


def test_an_empty_tensor_fits_a_full_debug_buffer() -> None:
    """An empty tensor writes no bytes, so it fits however full the buffer is (as in
    ExecuTorch's): a full buffer refuses only a tensor with bytes to write."""
    buf = DebugBuffer(DEBUG_ALIGNMENT - 1)
    buf.store(torch.ones(1), "first")  # the next aligned offset is past the capacity
    ref = buf.store(torch.empty(0, 3), "empty")
    assert ref.sizes == (0, 3) and buf.used == 4
    with pytest.raises(LimitExceededError, match="debug buffer full"):
        buf.store(torch.ones(1), "second")


def test_timings_only_without_a_debug_buffer(tmp_path: Path) -> None:
    program = Runtime.get().load_program(fixture_paths("mlp")[0], enable_etdump=True)
    program.load_method("forward").execute(fixture_calls("mlp")[0]["inputs"])
    # as ExecuTorch: no buffer, no file; unlike it, not silently
    with pytest.warns(UserWarning, match=r"no debug buffer written to .*debug_buffer_size=0"):
        program.write_etdump_result_to_file(tmp_path / "m.etdp", tmp_path / "m.bin")
    dump = decode_etdump((tmp_path / "m.etdp").read_bytes())
    assert [r.name for r in dump.run_data] == ["Default", "Execute"]
    assert all(isinstance(e, ProfileEvent) for r in dump.run_data for e in r.events)
    assert not (tmp_path / "m.bin").exists()


def test_a_debug_buffer_size_is_a_whole_number_of_bytes() -> None:
    """NaN, 1.5, 1.0 and True are refused (ExecuTorch's bindings refuse floats too), by
    every loader, with or without ETDump; numpy integers are sizes."""
    import numpy as np

    from ptexec import portable_lib as pl

    pte = fixture_paths("mlp")[0]
    data = pte.read_bytes()
    loaders = [
        lambda size, on: Runtime.get().load_program(pte, enable_etdump=on, debug_buffer_size=size),
        lambda size, on: pl._load_program(pte, enable_etdump=on, debug_buffer_size=size),
        lambda size, on: pl._load_program_from_buffer(data, on, size),
        lambda size, on: pl._load_for_executorch(pte, enable_etdump=on, debug_buffer_size=size),
        lambda size, on: pl._load_for_executorch_from_buffer(data, None, on, size),
        lambda size, on: ETDumpRecorder(size),
    ]
    for load, size, on in itertools.product(loaders, [float("nan"), 1.5, 1.0, True], [True, False]):
        with pytest.raises(TypeError, match="debug_buffer_size must be an int"):
            load(size, on)
    for load in loaders:
        with pytest.raises(ValueError, match=">= 0"):
            load(-1, True)
        load(np.int64(4096), True)
    assert ETDumpRecorder(np.int32(64)).debug_buffer_size == 64


def test_etdump_needs_enabling() -> None:
    program = Runtime.get().load_program(fixture_paths("mlp")[0])
    with pytest.raises(StateError, match="enable_etdump=True") as e:
        program.write_etdump_result_to_file("x.etdp", "x.bin")
    assert isinstance(e.value, RuntimeError)


def test_stateful_runs_record_each_calls_values() -> None:
    name = "stateful"
    program = ptexec.load(fixture_paths(name)[0])
    method = program.load_method("forward")
    rec = ETDumpRecorder(debug_buffer_size=1 << 20)
    calls = fixture_calls(name)
    for call in calls:
        assert (
            compare_outputs(rec.execute(method, call["inputs"]), call["outputs"], *tolerance(name))
            is None
        )
    assert len(rec.runs) == len(calls)
    data = rec.debug_buffer()
    firsts = []
    for run in rec.runs:
        out = next(e for e in run.events if isinstance(e, DebugEvent) and e.debug_entry.output)
        t = out.debug_entry.data
        firsts.append(bytes(data[t.offset : t.offset + 16]))
    assert len(set(firsts)) == len(calls)  # the state advanced, each run has its own values


def test_bfloat16_values_are_written_with_their_scalar_type(tmp_path: Path) -> None:
    """bfloat16 (code 15) is in the schema; ExecuTorch's flatc reads it (its Inspector
    itself cannot turn bfloat16 bytes into tensors, a limit of the Inspector)."""
    serialize = pytest.importorskip("executorch.devtools.etdump.serialize")
    name = "bf16_mlp"
    method = ptexec.load(fixture_paths(name)[0]).load_method("forward")
    rec = ETDumpRecorder(debug_buffer_size=1 << 16)
    rec.execute(method, fixture_calls(name)[0]["inputs"])
    rec.write(tmp_path / "b.etdp", tmp_path / "b.bin")
    theirs = serialize.deserialize_from_etdump_flatcc((tmp_path / "b.etdp").read_bytes())
    types = {
        e.debug_event.debug_entry.tensor.scalar_type
        for e in theirs.run_data[0].events
        if e.debug_event is not None and e.debug_event.debug_entry.tensor is not None
    }
    assert 15 in {int(t) for t in types}


def test_the_facade_records_loads_and_calls_of_every_method(tmp_path: Path) -> None:
    name = "two_method_state"
    pte = fixture_paths(name)[0]
    program = Runtime.get().load_program(pte, enable_etdump=True, debug_buffer_size=1 << 16)
    for call in fixture_calls(name):
        program.load_method(call["method"]).execute(call["inputs"])
    dump = program.etdump.etdump()  # type: ignore[union-attr]
    loads = [r for r in dump.run_data if r.name == "Default"]
    assert len(loads) == len(program.method_names)
    assert sum(r.name == "Execute" for r in dump.run_data) == len(fixture_calls(name))


@pytest.mark.cuda
def test_cuda_values_reach_the_debug_buffer() -> None:
    name = "gpu_mlp"
    method = ptexec.load(fixture_paths(name)[0]).load_method("forward")
    x = [t.cuda() for t in fixture_calls(name)[0]["inputs"]]
    rec = ETDumpRecorder(debug_buffer_size=1 << 16)
    (y,) = rec.execute(method, x)
    assert y.is_cuda
    out = next(e for e in rec.runs[0].events if isinstance(e, DebugEvent) and e.debug_entry.output)
    t = out.debug_entry.data
    n = y.numel() * y.element_size()
    got = torch.frombuffer(bytearray(rec.debug_buffer()[t.offset : t.offset + n]), dtype=y.dtype)
    assert torch.equal(got.view(t.sizes), y.cpu())


def _node_events(dump: Any) -> dict[int, list[ProfileEvent]]:
    """Per instruction of the Execute run, its delegate's per-node events (no name, the
    node in delegate_debug_id_str), in order."""
    (run,) = [r for r in dump.run_data if r.name == "Execute"]
    found: dict[int, list[ProfileEvent]] = {}
    for e in run.events:
        if isinstance(e, ProfileEvent) and e.name is None:
            found.setdefault(e.instruction_id, []).append(e)
    return found


def test_xnnpack_nodes_are_delegate_events_the_inspector_shows(tmp_path: Path) -> None:
    """ptexec's XNNPACK runner reports each node it runs, as ExecuTorch's XNNPACK backend
    does: an event per node inside its DELEGATE_CALL (same chain and instruction, named by
    delegate_debug_id_str), as many per call and numbered as in ExecuTorch's own ETDump of
    the same file, and the Inspector shows each as a delegated row."""
    inspector_cls = _inspector()
    from executorch.runtime import Runtime as ETRuntime

    pte, etrecord = COMPAT / "xnnpack.pte", str(COMPAT / "xnnpack.etrecord")
    io = _io("xnnpack")
    method = ptexec.load(pte).load_method(xnnpack="torch")
    rec = ETDumpRecorder(1 << 20)
    got = rec.execute(method, io["inputs"])
    assert compare_outputs(list(got), io["outputs"], 1e-5, 1e-5) is None
    etdp, dbg = tmp_path / "ours.etdp", tmp_path / "ours.bin"
    rec.write(etdp, dbg)
    ours = _node_events(decode_etdump(etdp.read_bytes()))
    et_etdp, _, _ = _dump(ETRuntime.get(), pte, io["inputs"], tmp_path, "executorch", calls=1)
    theirs = _node_events(decode_etdump(et_etdp.read_bytes()))

    assert sorted(ours) == sorted(theirs) and ours
    for index, nodes in ours.items():
        ordinals = [e.delegate_debug_id_str.rsplit("#", 1)[1] for e in nodes]  # type: ignore[union-attr]
        assert ordinals == [e.delegate_debug_id_str.rsplit("#", 1)[1] for e in theirs[index]]  # type: ignore[union-attr]
    assert [e.delegate_debug_id_str for e in ours[5]] == [
        "Multiply #1",
        "FullyConnected #1",
        "Add #1",
    ]  # XNNPACK's own names: "Multiply (ND) #1", "Fully Connected (NC, F32) GEMM #1", ...
    (run,) = [r for r in decode_etdump(etdp.read_bytes()).run_data if r.name == "Execute"]
    calls = {e.instruction_id: e for e in run.events if getattr(e, "name", 0) == "DELEGATE_CALL"}
    for index, nodes in ours.items():
        call = calls[index]
        assert all(e.chain_index == call.chain_index == 0 for e in nodes)
        assert all(call.start_time <= e.start_time <= e.end_time <= call.end_time for e in nodes)
        assert all(
            e.delegate_debug_id_int == -1 and e.delegate_debug_metadata == b"" for e in nodes
        )

    inspector = inspector_cls(etdump_path=str(etdp), debug_buffer_path=str(dbg), etrecord=etrecord)
    rows = [e for e in _execute_block(inspector).events if e.is_delegated_op]
    assert [r.name for r in rows] == [
        e.delegate_debug_id_str for i in sorted(ours) for e in ours[i]
    ]
    assert {r.delegate_backend_name for r in rows} == {"XnnpackBackend"}
    names = [e.name for e in _execute_block(inspector).events]
    assert names.count("DELEGATE_CALL") == len(ours)  # the call's own row stays


@pytest.mark.parametrize(
    "name", ["cnn_int8_static_pc", "dwnet_int8_static_pt", "dynamic_mlp_int8_dynamic_pc"]
)
def test_xnnpack_nodes_timed_compute_what_execute_computes(name: str) -> None:
    """The timed variant runs the very statements of the plain one (int8 graphs: table
    lookups, per-token quantization): the same outputs, bit for bit, with an event per
    node."""
    pte = FIXTURES_DIR / "xnnpack" / f"{name}.pte"
    call = torch.load(pte.with_suffix(".io.pt"), weights_only=True)["calls"][0]
    method = ptexec.load(pte).load_method(xnnpack="torch")
    plain = method.execute(call["inputs"])
    rec = ETDumpRecorder()
    recorded = rec.execute(method, call["inputs"])
    assert all(torch.equal(a, b) for a, b in zip(plain, recorded, strict=True))
    # and ExecuTorch's own runtime computes exactly these (recorded with the fixture)
    assert all(torch.equal(a, b) for a, b in zip(recorded, call["executorch"], strict=True))
    nodes = _node_events(rec.etdump())
    assert nodes and all(all(e.delegate_debug_id_str for e in es) for es in nodes.values())


@pytest.mark.parametrize("runner", ["torch", "executorch"])
def test_delegate_nodes_are_reported_only_to_tools_that_take_them(runner: str) -> None:
    """A delegate runner reports its nodes (ExecuTorch's only by writing an ETDump on every
    call, far slower than the call) to hooks whose ``nodes`` is set, as ETDumps' are; a
    profile's or a trace's hooks get the plain call, and the same outputs."""
    from ptexec.engine.hooks import Hooks

    if runner == "executorch":
        pytest.importorskip("executorch.runtime")

    class Counting(Hooks):
        def __init__(self, nodes: bool) -> None:
            self.nodes = nodes
            self.seen: list[str] = []

        def node(self, name: str, start: int, end: int) -> None:
            self.seen.append(name)

    io = _io("xnnpack")
    method = ptexec.load(COMPAT / "xnnpack.pte").load_method(xnnpack=runner)
    quiet, told = Counting(False), Counting(True)
    for hooks in (quiet, told):
        got = method.run_with(hooks, io["inputs"])
        assert compare_outputs(list(got), io["outputs"], 1e-5, 1e-5) is None
    assert quiet.seen == [] and any(name.endswith("#1") for name in told.seen), told.seen


# -- each instruction logs what ExecuTorch's runtime logs for it ------------------------------


def _logged_by_instruction(runtime: Any, pte: Path, inputs: list[Any], tmp: Path, tag: str):  # type: ignore[no-untyped-def]
    """{(chain, instruction): [value, ...]} of one call's debug events (outputs: chain -1)."""
    etdp, dbg, _ = _dump(runtime, pte, inputs, tmp, tag, calls=1)
    data = dbg.read_bytes()

    def tensor(ref: Any) -> torch.Tensor:
        dtype = CODE_TO_DTYPE[ref.scalar_type]
        n = math.prod(ref.sizes) * torch.empty((), dtype=dtype).element_size()
        raw = bytearray(data[ref.offset : ref.offset + n])
        return torch.frombuffer(raw, dtype=dtype).reshape(ref.sizes) if n else torch.empty(0)

    (run,) = [r for r in decode_etdump(etdp.read_bytes()).run_data if r.name == "Execute"]
    logged: dict[tuple[int, int], list[Any]] = {}
    for e in run.events:
        if isinstance(e, DebugEvent):
            d = e.debug_entry.data
            value = [tensor(t) for t in d] if isinstance(d, tuple) else d
            value = tensor(d) if hasattr(d, "offset") else value
            logged.setdefault((e.chain_index, e.instruction_id), []).append(value)
    return logged


def _logs_like_executorch(module: torch.nn.Module, inputs: tuple[Any, ...], tmp: Path) -> Any:
    from executorch.runtime import Runtime as ETRuntime

    from export_util import export_program

    pte = tmp / "m.pte"
    pte.write_bytes(export_program(module.eval(), inputs))
    ours = _logged_by_instruction(Runtime.get(), pte, list(inputs), tmp, "ptexec")
    theirs = _logged_by_instruction(ETRuntime.get(), pte, list(inputs), tmp, "executorch")
    assert list(ours) == list(theirs)
    for key, values in theirs.items():
        _same_debug_data(ours[key], values)
    return ptexec.load(pte).load_method("forward")


class _Mask(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(6)
        self.register_buffer("mask", torch.tril(torch.ones(4, 6, dtype=torch.bool)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.mask & (x[0] > -10)  # computed: the not-any-not below is fused, not folded
        keep = torch.logical_not(torch.any(torch.logical_not(m), dim=-1, keepdim=True))
        return self.ln(x) * keep.to(x.dtype) + 1


def test_a_fused_instruction_logs_each_instruction_its_own_value(tmp_path: Path) -> None:
    """logical_not, any, logical_not run as one ``all`` and layer norm's statistics are
    never written, yet each instruction logs the values ExecuTorch's runtime logs for it:
    the fused ones their own intermediates, the last one the fused result."""
    pytest.importorskip("executorch.runtime")
    method = _logs_like_executorch(_Mask(), (torch.randn(4, 6),), tmp_path)
    notes = {s.name: s.note for chain in steps_of(method.state) for s in chain}
    assert notes["aten::any.out"] == "done by a fused instruction before it"
    assert notes["aten::native_layer_norm.out"] == "skips outputs nothing reads"


class _Multi(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        p = torch.nn.functional.max_pool2d(x, 2)  # out and indices: two tensors
        # a Tensor[] out, its items read only through views (made at load)
        q, k = torch.split(p.reshape(1, 4, 8), [4, 4], dim=2)
        q4, k4 = q.view(1, 4, 2, 2).transpose(1, 2), k.view(1, 4, 2, 2).transpose(1, 2)
        return q4 @ k4.transpose(2, 3), q4 + 1


def test_outputs_are_logged_as_their_schema_types_and_views_made_at_load_are_not(
    tmp_path: Path,
) -> None:
    """max_pool2d_with_indices logs its two tensors apart, split its Tensor[] out as one
    list; the views of split's results made at load are not logged as split's."""
    pytest.importorskip("executorch.runtime")
    method = _logs_like_executorch(_Multi(), (torch.randn(1, 2, 8, 8),), tmp_path)
    (split,) = [s for s in steps_of(method.state)[0] if "split" in s.name]
    assert set(split.writes) > set(split.loaded.outs)  # load-time views written by it


class _Dropout(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.nn.functional.dropout(x, 0.5, training=True)
        return y, torch.rand(2, 4)


def test_a_recorded_random_kernel_logs_what_it_drew() -> None:
    """A random kernel's outputs are logged as the call drew them: dropout's mask (which
    nothing reads) is kept at load, not computed again by the recorder (a second draw: a
    mask that is not the output's, and the call's later random values moved on)."""
    from export_util import export_program

    x = torch.ones(2, 4)
    method = ptexec.load(export_program(_Dropout().train(), (x,))).load_method()
    torch.manual_seed(0)
    want = method.execute([x])
    rec = ETDumpRecorder(debug_buffer_size=1 << 16)
    torch.manual_seed(0)
    got = rec.execute(method, [x])
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    (run,) = rec.runs
    data = rec.debug_buffer()

    def logged(e: DebugEvent) -> torch.Tensor:
        t = e.debug_entry.data
        dtype = CODE_TO_DTYPE[t.scalar_type]
        n = math.prod(t.sizes) * torch.empty((), dtype=dtype).element_size()
        raw = bytearray(data[t.offset : t.offset + n])
        return torch.frombuffer(raw, dtype=dtype).view(t.sizes)

    first = [
        logged(e)
        for e in run.events
        if isinstance(e, DebugEvent) and e.chain_index == 0 and e.instruction_id == 0
    ]
    y, mask = first
    assert torch.equal(y, want[0]) and torch.equal(mask, y != 0)


# -- instructions ExecuTorch times without a kernel wrapper of their own ----------------------


def _profile_names(etdp: Path) -> dict[tuple[int, int], list[str]]:
    """{(chain, instruction): [name, ...]} of the first Execute run's profile events."""
    run = next(r for r in decode_etdump(etdp.read_bytes()).run_data if r.name == "Execute")
    names: dict[tuple[int, int], list[str]] = {}
    for e in run.events:
        if isinstance(e, ProfileEvent) and e.chain_index >= 0 and e.name is not None:
            names.setdefault((e.chain_index, e.instruction_id), []).append(e.name)
    return names


@pytest.mark.parametrize("name", ["cond", "map"])
def test_prim_ops_moves_and_jumps_are_named_as_executorch_names_them(
    name: str, tmp_path: Path
) -> None:
    """An operator ExecuTorch registers as a prim op (``aten::sym_size.int``,
    ``executorch_prim::*``) has one event there, ``OPERATOR_CALL``, which the Inspector
    leaves out of module totals and numeric gaps; a jump is ``JF_CALL``, a move
    ``MOVE_CALL``; a kernel its wrapper's ``native_call_*`` and ``OPERATOR_CALL``."""
    from executorch.runtime import Runtime as ETRuntime

    pte = fixture_paths(name)[0]
    inputs = fixture_calls(name)[0]["inputs"]
    ours = _profile_names(_dump(Runtime.get(), pte, inputs, tmp_path, "ptexec", calls=1)[0])
    etdp = _dump(ETRuntime.get(), pte, inputs, tmp_path, "executorch", calls=1)[0]
    theirs = _profile_names(etdp)
    assert ours == theirs
    assert sum("native_call_" not in names[0] for names in theirs.values()) >= 2


class _Reshaped(torch.nn.Module):
    """Dynamic sizes: ``sym_size`` and the prim ops that compute with it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = x.shape[0]
        y = self.fc(x).relu()
        return y.reshape(n * 2, 2) * 2.0 + 1, y.view(-1)[: n + 1]


def test_numeric_gap_of_a_program_with_prim_ops_is_executorchs(tmp_path: Path) -> None:
    """The Inspector's numeric debugger pairs the same graph nodes, with the same gaps, on
    ptexec's ETDump as on ExecuTorch's, where prim ops (which log no values) run."""
    inspector_cls = _inspector()
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime as ETRuntime

    torch.manual_seed(0)
    model = _Reshaped().eval()
    x = torch.randn(3, 4)
    n = torch.export.Dim("n", min=1, max=8)
    exported = torch.export.export(model, (x,), dynamic_shapes={"x": {0: n}})
    program = to_edge_transform_and_lower(exported, generate_etrecord=True).to_executorch()
    record = program.get_etrecord()
    record.update_representative_inputs([(x,)])
    pte, etrecord = tmp_path / "m.pte", str(tmp_path / "m.etrecord")
    pte.write_bytes(program.buffer)
    record.save(etrecord)

    gaps = []
    for runtime, tag in ((ETRuntime.get(), "executorch"), (Runtime.get(), "ptexec")):
        etdp, dbg, _ = _dump(runtime, pte, [x], tmp_path, tag)
        inspector = inspector_cls(
            etdump_path=str(etdp), debug_buffer_path=str(dbg), etrecord=etrecord
        )
        gaps.append(inspector.calculate_numeric_gap("MSE"))
    theirs, ours = gaps
    assert len(theirs) == 5
    assert list(ours["aot_ops"]) == list(theirs["aot_ops"])
    for a, b in zip(ours["gap"], theirs["gap"], strict=True):
        assert a == pytest.approx(b, abs=1e-6)


# -- the events ExecuTorch's runtime writes, event for event ----------------------------------


def _fixture(name: str) -> tuple[Path, list[Any]]:
    """A fixture's program and its first call's inputs (``xnnpack/NAME``: the XNNPACK set)."""
    if name.startswith("xnnpack/"):
        pte = FIXTURES_DIR / f"{name}.pte"
        calls = torch.load(pte.with_suffix(".io.pt"), weights_only=True)["calls"]
        return pte, calls[0]["inputs"]
    return fixture_paths(name)[0], fixture_calls(name)[0]["inputs"]


def _event_sequence(etdp: Path) -> list[list[tuple[Any, ...]]]:
    """Per run, its events without their times or buffer offsets: a profile event's name,
    place and delegate ids; a debug event's place and what it holds (types and shapes)."""

    def held(v: Any) -> Any:
        d = v.data
        if isinstance(d, tuple):
            return tuple((t.scalar_type, t.sizes) for t in d)
        return (d.scalar_type, d.sizes) if hasattr(d, "offset") else d

    runs = []
    for run in decode_etdump(etdp.read_bytes()).run_data:
        events: list[tuple[Any, ...]] = [("run", run.name)]
        for e in run.events:
            if isinstance(e, ProfileEvent):
                ids = (e.delegate_debug_id_int, e.delegate_debug_id_str)
                events.append(("profile", e.name, e.chain_index, e.instruction_id, *ids))
            elif isinstance(e, DebugEvent):
                value = (e.debug_entry.kind, held(e.debug_entry), e.debug_entry.output)
                events.append(("debug", e.chain_index, e.instruction_id, *value))
        runs.append(events)
    return runs


def _rows(inspector: Any) -> list[tuple[Any, ...]]:
    """The Inspector's event blocks, row by row: name, instruction, delegated or not, how
    many runs timed it and how many values it holds (no times)."""
    rows = []
    for block in inspector.event_blocks:
        for e in block.events:
            timed, held = len(e.perf_data.raw), len(e.debug_data)
            rows.append((block.name, e.name, e._instruction_id, e.is_delegated_op, timed, held))
    return rows


@pytest.mark.parametrize(
    ("name", "calls"),
    [
        ("mlp", 2),
        ("transformer", 2),
        ("int_ops", 2),
        ("cond", 2),
        ("map", 2),
        ("dynamic_mlp", 2),
        ("quant_static", 2),
        ("llama_sdpa_kv", 1),  # stateful: the Inspector wants the same outputs every run
        ("llama_quant_kv", 1),
        ("xnnpack/mlp", 2),
        ("xnnpack/transformer_int8_dynamic_pc", 1),
    ],
)
def test_events_are_executorchs_event_for_event(name: str, calls: int, tmp_path: Path) -> None:
    """Every run of ptexec's ETDump holds the events ExecuTorch's runtime writes for the
    same program and inputs, in its order: per kernel its values, its wrapper's event
    (``native_call_addmm.out``, ``llama::update_cache.out``) and ``OPERATOR_CALL``; prim
    ops, jumps, moves, frees and delegate calls as ExecuTorch names them; and the
    Inspector shows the same rows."""
    inspector_cls = _inspector()
    pytest.importorskip("executorch.kernels.quantized")  # quantized_decomposed:: kernels
    pytest.importorskip("executorch.extension.llm.custom_ops.custom_ops")  # llama:: kernels
    from executorch.runtime import Runtime as ETRuntime

    pte, inputs = _fixture(name)
    dumps = {
        tag: _dump(runtime, pte, inputs, tmp_path, tag, calls)
        for tag, runtime in (("executorch", ETRuntime.get()), ("ptexec", Runtime.get()))
    }
    ours, theirs = (_event_sequence(dumps[t][0]) for t in ("ptexec", "executorch"))
    assert len(ours) == len(theirs) == 1 + calls
    for got, want in zip(ours, theirs, strict=True):
        assert got == want
    rows = {
        tag: _rows(inspector_cls(etdump_path=str(etdp), debug_buffer_path=str(dbg)))
        for tag, (etdp, dbg, _) in dumps.items()
    }
    assert rows["ptexec"] == rows["executorch"]


@pytest.mark.parametrize("name", ["gated_delta_rule", "channelwise_gated_delta_rule"])
def test_gated_delta_rule_events_are_executorchs(name: str, tmp_path: Path) -> None:
    """ExecuTorch registers its gated delta rule (either name) by hand, not through
    EXECUTORCH_LIBRARY: it is timed as ``native_call_llama::gated_delta_rule.out`` and logs
    no value; ptexec's ETDump holds the same events and the Inspector the same rows."""
    inspector_cls = _inspector()
    pytest.importorskip("executorch.extension.llm.custom_ops.custom_ops")
    from executorch.runtime import Runtime as ETRuntime

    g = torch.Generator().manual_seed(7)
    q, k = (
        torch.nn.functional.normalize(torch.randn(1, 2, 3, 4, generator=g), dim=-1) for _ in "qk"
    )
    v = torch.randn(1, 2, 3, 5, generator=g)
    decay = -torch.rand(1, 2, 3, 4, generator=g)
    beta = torch.rand(1, 2, 3, generator=g)
    state = torch.randn(1, 2, 4, 5, generator=g)
    inputs = [q, k, v, decay, beta, state]
    pte = tmp_path / "gated.pte"
    pte.write_bytes(one_op_program(getattr(torch.ops.llama, name), tuple(inputs)))
    dumps = {
        tag: _dump(runtime, pte, inputs, tmp_path, tag, 1)
        for tag, runtime in (("executorch", ETRuntime.get()), ("ptexec", Runtime.get()))
    }
    ours, theirs = (_event_sequence(dumps[t][0]) for t in ("ptexec", "executorch"))
    assert ours == theirs
    assert ("profile", "native_call_llama::gated_delta_rule.out", 0, 0, -1, None) in ours[1]
    rows = {
        tag: _rows(inspector_cls(etdump_path=str(etdp), debug_buffer_path=str(dbg)))
        for tag, (etdp, dbg, _) in dumps.items()
    }
    assert rows["ptexec"] == rows["executorch"]


def _recorded(calls: int) -> ETDumpRecorder:
    method = ptexec.load(fixture_paths("mlp")[0]).load_method("forward")
    rec = ETDumpRecorder(debug_buffer_size=1 << 16)
    for _ in range(calls):
        rec.execute(method, fixture_calls("mlp")[0]["inputs"])
    return rec


@pytest.mark.parametrize("failing", ["debug buffer", "etdump", "rename"])
def test_a_failed_write_leaves_the_files_as_they_were(
    failing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ETDump and its debug buffer are a pair (the ETDump's offsets point into the
    buffer): a write that fails part way leaves the old pair whole, no partial file and
    no temporary file beside them, and keeps what was recorded, so the next write gives
    the new pair (a failure after the ETDump was written left it beside an old or an
    empty debug buffer)."""
    import ptexec.etdump as etdump_module

    etdp, dbg = tmp_path / "run.etdp", tmp_path / "run.bin"
    _recorded(1).write(etdp, dbg)
    old = etdp.read_bytes(), dbg.read_bytes()
    rec = _recorded(2)
    runs, data = rec.runs, rec.debug_buffer()

    def fail(*args: object) -> bytes:
        raise OSError(28, "No space left on device")

    if failing == "debug buffer":
        monkeypatch.setattr(DebugBuffer, "getvalue", fail)
    elif failing == "etdump":
        monkeypatch.setattr(etdump_module, "encode_etdump", fail)
    else:  # the second file's rename, after the first file is in place
        real, renames = os.replace, []

        def second_fails(src: Any, dst: Any) -> None:
            renames.append(dst)
            if len(renames) == 2:
                fail()
            real(src, dst)

        monkeypatch.setattr(os, "replace", second_fails)
    with pytest.raises(OSError, match="No space left"):
        rec.write(etdp, dbg)
    monkeypatch.undo()
    if failing != "rename":
        assert (etdp.read_bytes(), dbg.read_bytes()) == old
    else:  # the buffer, renamed first, is new; its ETDump never names the old buffer
        assert etdp.read_bytes() == old[0]
    assert sorted(f.name for f in tmp_path.iterdir()) == ["run.bin", "run.etdp"]
    assert rec.runs == runs and rec.debug_buffer() == data
    rec.write(etdp, dbg)
    assert decode_etdump(etdp.read_bytes()).run_data == runs and dbg.read_bytes() == data


def test_an_etdump_is_written_as_open_writes_a_file(tmp_path: Path) -> None:
    """Through a symbolic link to the file it names (the link kept), an existing file's
    mode kept, a new one's from the umask, a folder refused as ``open`` refuses it."""
    rec = _recorded(1)
    runs, data = rec.runs, rec.debug_buffer()
    named = tmp_path / "v1.etdp"
    named.write_bytes(b"old")
    os.chmod(named, 0o640)
    link = tmp_path / "latest.etdp"
    link.symlink_to(named.name)
    old = os.umask(0o022)
    try:
        rec.write(link, tmp_path / "new.bin")
    finally:
        os.umask(old)
    assert link.is_symlink() and decode_etdump(named.read_bytes()).run_data == runs
    assert (tmp_path / "new.bin").read_bytes() == data
    assert os.stat(named).st_mode & 0o777 == 0o640
    assert os.stat(tmp_path / "new.bin").st_mode & 0o777 == 0o644
    rec = _recorded(1)
    (tmp_path / "folder").mkdir()
    with pytest.raises(IsADirectoryError):
        rec.write(tmp_path / "folder", tmp_path / "new.bin")
    assert (tmp_path / "new.bin").read_bytes() == data and rec.runs != ()
