"""Every way of running a method goes through one envelope and one block compiler, so they
agree: the fast path, the general path (with and without the load-time rewrites), traces,
profiles and CUDA graphs give the same outputs, records and state."""

from __future__ import annotations

import gc
import linecache
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

import ptexec
from export_util import export_program
from fixture_data import (
    compare_outputs,
    fixture_calls,
    fixture_paths,
    load_manifest,
    load_options,
    tolerance,
)
from ptexec.effects import byte_range
from ptexec.format import program as p

MANIFEST = load_manifest()
RUNNABLE = [name for name, entry in MANIFEST.items() if entry.get("runs", True)]


def _clone(xs: list[Any]) -> list[Any]:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]


def _methods(name: str, **options: Any) -> dict[str, ptexec.Method]:
    pte, ptd = fixture_paths(name)
    prog = ptexec.load(pte, data_path=ptd)
    return {m: prog.load_method(m, **load_options(name), **options) for m in prog.method_names}


def _record(m: ptexec.Method) -> tuple[Any, ...]:
    r = m.last_call
    return (list(r.inputs), list(r.outputs), r.bytes_copied)


def _handed(ms: dict[str, ptexec.Method]) -> dict[str, list[tuple[int, int, int]]]:
    """Per method, (buffer, first byte, end) of each output the fast call hands over as a
    new tensor, leaving its planned memory as it was (outputs of dynamic shape only: see
    ``Method.values``)."""
    out: dict[str, list[tuple[int, int, int]]] = {}
    for name, m in ms.items():
        made = {int(s) for s in re.findall(r"^\s*_f(\d+) = ", m.source(), re.MULTILINE)}
        ranges = [byte_range(m.state.plan.values[slot]) for slot in made]
        out[name] = [r for r in ranges if r is not None]
    return out


def _buffers(
    ms: dict[str, ptexec.Method], skip: dict[str, list[tuple[int, int, int]]] | None = None
) -> list[torch.Tensor]:
    """A copy of every planned buffer, the bytes of ``skip``'s ranges zeroed."""
    found = []
    for name, m in ms.items():
        for b in m.state.buffers:
            data = b.data.clone()
            for index, start, end in (skip or {}).get(name, []):
                if index == b.info.index:
                    data.view(torch.uint8)[start:end] = 0
            found.append(data)
    return found


Way = Callable[[ptexec.Method, list[Any]], list[Any]]
WAYS: dict[str, tuple[dict[str, Any], Way]] = {
    "fast": ({}, lambda m, x: m.execute(x)),
    "general": ({"fast_path": False}, lambda m, x: m.execute(x)),
    "general, no rewrites": ({"fast_path": False, "optimize": False}, lambda m, x: m.execute(x)),
    "trace": ({}, lambda m, x: m.trace(x).outputs or []),
    "profile": ({}, lambda m, x: m.profile(x, repeat=1, warmup=0, compare=False).outputs),
}


@pytest.mark.parametrize("name", RUNNABLE)
def test_every_path_computes_the_same(name: str) -> None:
    """Call by call on separately loaded methods: identical outputs and `last_call` records,
    and the same planned memory afterwards, on every path with the rewrites on (but for the
    outputs of dynamic shape the fast call hands over without writing them there). Without
    them, a copy is made where a view was taken, and a kernel reading other strides may
    round differently: that path agrees within the fixture's tolerance."""
    loaded = {way: _methods(name, **options) for way, (options, _) in WAYS.items()}
    for k, call in enumerate(fixture_calls(name)):
        results = {}
        for way, (_, run) in WAYS.items():
            m = loaded[way][call["method"]]
            results[way] = (run(m, _clone(call["inputs"])), _record(m))
        want, want_record = results["fast"]
        problem = compare_outputs(want, call["outputs"], *tolerance(name))
        assert problem is None, f"{name} call {k}: {problem}"
        for way, (got, record) in results.items():
            exact = (0.0, 0.0) if way != "general, no rewrites" else tolerance(name)
            problem = compare_outputs(got, want, *exact)
            assert problem is None, f"{name} call {k}: {way}: {problem}"
            assert record == want_record, f"{name} call {k}: {way} records {record}"
    handed = _handed(loaded["fast"])
    reference = _buffers(loaded["fast"], handed)
    for way in ("general", "trace", "profile"):
        for a, b in zip(_buffers(loaded[way], handed), reference, strict=True):
            assert torch.equal(a, b), f"{name}: planned memory after the calls differs ({way})"


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "stateful"])
def test_the_cuda_graph_runner_agrees(name: str) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    graph = _methods(name, device_map="cuda:0", cuda_graph=True)
    plain = _methods(name, device_map="cuda:0")
    for call in fixture_calls(name):
        x = [t.cuda() if isinstance(t, torch.Tensor) else t for t in call["inputs"]]
        got = graph[call["method"]].execute(_clone(x))
        want = plain[call["method"]].execute(_clone(x))
        assert compare_outputs([t.cpu() for t in got], [t.cpu() for t in want], 0, 0) is None


# ---- the six disagreements the tools used to have --------------------------------------


def test_trace_takes_inputs_that_require_grad() -> None:
    x = fixture_calls("mlp")[0]["inputs"][0].clone().requires_grad_()
    m = _methods("mlp")["forward"]
    want = m.execute([x])
    tr = m.trace([x])
    assert tr.outputs is not None and torch.equal(tr.outputs[0], want[0])
    assert not tr.outputs[0].requires_grad


@pytest.mark.parametrize("tool", ["trace", "profile"])
def test_the_instruction_limit_is_the_same_error(tool: str) -> None:
    m = _methods("mlp", max_instructions=2)["forward"]
    x = fixture_calls("mlp")[0]["inputs"]
    with pytest.raises(ptexec.errors.InstructionLimitError) as plain:
        m.execute(x)
    with pytest.raises(ptexec.errors.InstructionLimitError) as watched:
        getattr(m, tool)(x)
    assert isinstance(watched.value, ptexec.ExecutionError)
    assert watched.value.instruction == plain.value.instruction >= 0
    assert watched.value.operator == plain.value.operator
    assert str(watched.value) == str(plain.value)


def _generated() -> set[str]:
    return {k for k in linecache.cache if k.startswith("<ptexec")}


def test_traced_methods_leave_nothing_in_linecache() -> None:
    gc.collect()
    before = _generated()
    pte, _ = fixture_paths("mlp")
    for _ in range(5):
        prog = ptexec.load(pte)
        m = prog.load_method("forward")
        m.trace(fixture_calls("mlp")[0]["inputs"], reference=True)
        m.profile(fixture_calls("mlp")[0]["inputs"], repeat=1)
        del m, prog
    gc.collect()
    assert _generated() - before == set()


def test_output_actions_are_cleared_on_every_path() -> None:
    m = _methods("mlp_unplanned")["forward"]
    x = fixture_calls("mlp_unplanned")[0]["inputs"]
    out = torch.empty_like(m.execute(x)[0])
    m.execute(x, out=[out])
    assert m.last_call.outputs == ["direct"]
    m.execute(x, outputs="view", layout="strict")  # the general path
    assert m.last_call.outputs == [""]
    m.execute(x, out=[out])
    m.trace(x)
    assert m.last_call.outputs == [""]


def _corrupt(m: ptexec.Method) -> tuple[torch.Tensor, tuple[Any, ...]]:
    """What a kernel's half-done resize leaves behind: sizes past the tensor's memory."""
    owned = [v for v in m.values() if isinstance(v, torch.Tensor) and v.numel()]
    victim = owned[-1]
    geometry = (victim.data_ptr(), tuple(victim.shape), tuple(victim.stride()))
    with pytest.raises(RuntimeError):
        torch.add(torch.zeros(1, dtype=victim.dtype).expand(1 << 40), 1, out=victim)
    return victim, geometry


@pytest.mark.parametrize("tool", ["trace", "profile"])
def test_a_failing_tool_call_restores_the_method(tool: str) -> None:
    m = _methods("int_ops")["forward"]
    calls = fixture_calls("int_ops")
    victim, geometry = _corrupt(m)
    ids, x, k = calls[0]["inputs"]
    bad = ids.clone()
    bad[0, 0] = -1000  # an index out of range: the gather fails
    with pytest.raises(ptexec.ExecutionError):
        getattr(m, tool)([bad, x, k])
    assert (victim.data_ptr(), tuple(victim.shape), tuple(victim.stride())) == geometry
    for call in calls:
        got = m.execute(_clone(call["inputs"]))
        assert compare_outputs(got, call["outputs"], *tolerance("int_ops")) is None


def test_a_failure_names_the_whole_exported_stack_everywhere() -> None:
    pytest.importorskip("executorch")
    from executorch.exir import ExecutorchBackendConfig, to_edge

    class Inner(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.fc(x))  # the inner line

    class Outer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Inner()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x) * 2.0  # the outer line

    x = torch.randn(2, 4)
    ep = torch.export.export(Outer(), (x,))
    pte = to_edge(ep).to_executorch(ExecutorchBackendConfig(emit_stacktrace=True)).buffer
    m = ptexec.load(bytes(pte)).load_method(optimize=False)
    weight = next(
        j
        for j, v in enumerate(m.state.plan.values)
        if isinstance(v, p.Tensor) and v.is_constant and len(v.sizes) == 2
    )
    m.values()[weight] = torch.zeros(1)  # a constant of the wrong shape
    errors = {}
    for way in ("execute", "trace", "profile"):
        with pytest.raises(ptexec.ExecutionError) as info:
            getattr(m, way)([x])
        errors[way] = info.value
    frame = errors["execute"].frame
    assert frame is not None and "the inner line" in frame and "the outer line" in frame
    for way, e in errors.items():
        assert (e.instruction, e.operator, e.frame) == (
            errors["execute"].instruction,
            errors["execute"].operator,
            frame,
        ), way


def test_limits_must_be_positive() -> None:
    pte, _ = fixture_paths("mlp")
    prog = ptexec.load(pte)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_instructions"):
            prog.load_method("forward", max_instructions=bad)
        with pytest.raises(ValueError, match="max_planned_bytes"):
            prog.load_method("forward", max_planned_bytes=bad)


def test_tools_see_the_statements_execute_runs() -> None:
    """A hook sees each step's statement: the very object the compiled blocks run."""
    from ptexec.engine.hooks import Hooks, Step

    seen: list[Step] = []

    class Spy(Hooks):
        def after(self, step: Step, v: list[Any], result: Any) -> None:
            seen.append(step)

    m = _methods("cond")["forward"]
    x = fixture_calls("cond")[0]["inputs"]
    assert compare_outputs(m.run_with(Spy(), x), m.execute(x), 0, 0) is None
    chain = m.state.chains[0]
    assert seen and all(s.statement is chain.statements[s.index] for s in seen)
    ran = {s.index for s in seen}
    assert len(ran) < len(chain.instructions)  # one branch of the cond did not run


def test_a_small_program_exported_here_agrees_on_every_path() -> None:
    class Net(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(x @ x.T) + x.sum()

    x = torch.randn(3, 3)
    pte = export_program(Net(), (x,))
    want = Net()(x)
    for options in ({}, {"fast_path": False}, {"optimize": False, "fast_path": False}):
        m = ptexec.load(pte).load_method(**options)
        for got in (m.execute([x])[0], (m.trace([x]).outputs or [None])[0]):
            torch.testing.assert_close(got, want)
