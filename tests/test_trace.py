"""Method.trace: records per instruction, control flow, the float64 reference, NaN hunting."""

from __future__ import annotations

import json
import math
from pathlib import Path
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
from ptexec.format import program as p
from ptexec.trace import Trace, summarize

MANIFEST = load_manifest()
RUNNABLE = [name for name, entry in MANIFEST.items() if entry.get("runs", True)]


def _clone(xs: list[Any]) -> list[Any]:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]


def _methods(name: str, **options: Any) -> dict[str, ptexec.Method]:
    pte, ptd = fixture_paths(name)
    prog = ptexec.load(pte, data_path=ptd)
    return {m: prog.load_method(m, **load_options(name), **options) for m in prog.method_names}


def _same(a: list[Any], b: list[Any]) -> str | None:
    """None when the two output lists are identical (NaN equal to NaN)."""
    return compare_outputs(a, b, 0.0, 0.0)


# ---- the trace computes what execute computes -------------------------------------------


@pytest.mark.parametrize("name", RUNNABLE)
def test_trace_outputs_equal_execute(name: str) -> None:
    """Call by call, a traced method and an executed one (separate loads) give identical
    outputs and keep identical state; every instruction of a jump-free chain is recorded."""
    traced, executed = _methods(name), _methods(name)
    for i, call in enumerate(fixture_calls(name)):
        m = traced[call["method"]]
        tr = m.trace(_clone(call["inputs"]), reference=i % 2 == 1)
        want = executed[call["method"]].execute(_clone(call["inputs"]))
        assert tr.outputs is not None
        assert _same(tr.outputs, want) is None, f"{name} call {i}: {_same(tr.outputs, want)}"
        problem = compare_outputs(tr.outputs, call["outputs"], *tolerance(name))
        assert problem is None, f"{name} call {i}: {problem}"
        plan = m.state.plan
        for c, chain in enumerate(plan.chains):
            if not any(isinstance(ins, p.JumpFalseCall) for ins in chain.instructions):
                got = [r.index for r in tr.records if r.chain == c]
                assert got == list(range(len(chain.instructions)))
        assert [r.step for r in tr.records] == list(range(len(tr.records)))


@pytest.mark.parametrize("name", ["mlp", "transformer", "cond", "scan", "llama_sdpa", "int_ops"])
def test_trace_of_an_unoptimized_load(name: str) -> None:
    """optimize=False: nothing is folded or a view, and the outputs are the same."""
    call = fixture_calls(name)[0]
    tr = _methods(name, optimize=False)[call["method"]].trace(_clone(call["inputs"]))
    assert all(r.note is None for r in tr.records)
    assert compare_outputs(tr.outputs or [], call["outputs"], *tolerance(name)) is None


def test_folded_instructions_are_marked_and_summarised() -> None:
    """The transformer's constant work (causal mask, weight transposes) is done at load;
    the trace still lists those instructions, with the values an unoptimized run writes."""
    x = fixture_calls("transformer")[0]["inputs"]
    opt = _methods("transformer")["forward"].trace(_clone(x))
    plain = _methods("transformer", optimize=False)["forward"].trace(_clone(x))
    notes = {r.note for r in opt.records}
    assert {"folded at load", "view made at load", "skips outputs nothing reads"} <= notes
    assert [r.name for r in opt.records] == [r.name for r in plain.records]
    for a, b in zip(opt.records, plain.records, strict=True):
        if a.note in ("folded at load", "view made at load"):
            assert [w.index for w in a.writes] == [w.index for w in b.writes]
            for wa, wb in zip(a.writes, b.writes, strict=True):
                assert wa.stats == wb.stats, (a.index, wa, wb)


def test_fused_instructions_are_marked_and_write_nothing() -> None:
    """The transformer's mask chain (``logical_not``, ``any``, ``logical_not``) runs as one
    ``all``: the first instruction says so and writes the last one's value, which equals
    an unoptimized run's; the two after it write nothing (their values are never made)."""
    x = fixture_calls("transformer")[0]["inputs"]
    opt = _methods("transformer")["forward"].trace(_clone(x))
    plain = _methods("transformer", optimize=False)["forward"].trace(_clone(x))
    heads = [k for k, r in enumerate(opt.records) if r.note == "runs with the next ones as one"]
    assert heads
    for k in heads:
        head, *away = opt.records[k : k + 3]
        assert [r.note for r in away] == ["done by a fused instruction before it"] * 2
        assert all(r.writes == [] for r in away)
        (written,) = head.writes
        (want,) = plain.records[k + 2].writes
        assert written.index == want.index and written.stats == want.stats


def test_a_fused_instruction_is_compared_with_the_reference_of_its_own_value() -> None:
    """The reference computes what a fused ``logical_not(any(logical_not(m)))`` wrote
    before comparing it: the mask eager PyTorch gives, no element mismatched."""

    class Mask(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("mask", torch.ones(4, 6, dtype=torch.bool).tril(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            m = self.mask & (x[0] > -10)  # computed: fused at load, not folded
            keep = torch.logical_not(torch.any(torch.logical_not(m), dim=-1, keepdim=True))
            return x * keep.to(x.dtype)

    net = Mask().eval()
    x = torch.randn(4, 6)
    want = torch.logical_not(torch.any(torch.logical_not(net.mask), dim=-1, keepdim=True))
    assert want.any() and not want.all()
    tr = (
        ptexec.load(export_program(net, (x,)))
        .load_method()
        .trace([x], reference=True, tensors=True)
    )
    (head,) = [r for r in tr.records if r.note == "runs with the next ones as one"]
    (w,) = head.writes
    assert torch.equal(w.value, want) and torch.equal(w.reference, want)
    assert w.error is not None and w.error.mismatched == 0
    assert all(e.mismatched == 0 for r in tr.records for e in [x.error for x in r.writes] if e)


def test_records_match_eager_intermediates() -> None:
    """A chain of elementwise ops: each instruction wrote exactly eager's intermediate."""

    class Chain(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a = torch.sin(x)
            b = a * 3.0
            c = b + x
            d = torch.relu(c)
            e = torch.exp(-d)
            return e.tanh()

    x = torch.randn(4, 5)
    prog = ptexec.load(export_program(Chain(), (x,)))
    tr = prog.load_method().trace([x], tensors=True)
    a = torch.sin(x)
    b = a * 3.0
    c = b + x
    d = torch.relu(c)
    e = torch.exp(-d)
    eager = [a, b, c, d, -d, e, e.tanh()]
    names = ["sin", "mul", "add", "relu", "neg", "exp", "tanh"]
    assert [r.name.split("::")[1].split(".")[0] for r in tr.records] == names
    for r, want in zip(tr.records, eager, strict=True):
        (w,) = r.writes
        torch.testing.assert_close(w.value, want, rtol=1e-6, atol=1e-7)
        s = w.stats
        assert s is not None and s.shape == (4, 5) and s.dtype == torch.float32
        assert s.device == "cpu" and s.nan == 0 and s.inf == 0
        assert math.isclose(s.min, want.min().item(), rel_tol=1e-6, abs_tol=1e-7)  # type: ignore[arg-type]
        assert math.isclose(s.max, want.max().item(), rel_tol=1e-6, abs_tol=1e-7)  # type: ignore[arg-type]
        assert math.isclose(s.mean, want.double().mean().item(), rel_tol=1e-5, abs_tol=1e-6)  # type: ignore[arg-type]
    tensors = tr.tensors()
    assert len(tensors) == len(names)
    torch.testing.assert_close(tr.outputs[0], eager[-1])  # type: ignore[index]


def test_source_frames_when_the_program_carries_stack_traces() -> None:
    pytest.importorskip("executorch")
    from executorch.exir import ExecutorchBackendConfig, to_edge

    class Two(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.cos(x)  # the cosine line
            return y * y

    x = torch.randn(3)
    ep = torch.export.export(Two(), (x,))
    pte = to_edge(ep).to_executorch(ExecutorchBackendConfig(emit_stacktrace=True)).buffer
    tr = ptexec.load(bytes(pte)).load_method().trace([x])
    frames = [r.frame for r in tr.records]
    assert all(f is not None and "test_trace.py" in f for f in frames), frames
    assert "the cosine line" in (frames[0] or "")
    assert "the cosine line" in tr.table()


def test_summaries() -> None:
    x = torch.tensor([[1.0, float("nan"), -3.0], [float("inf"), 2.0, float("-inf")]])
    s = summarize(x)
    assert (s.min, s.max, s.mean, s.nan, s.inf) == (-3.0, 2.0, 0.0, 1, 2)
    assert summarize(torch.tensor([True, False, True])).mean == pytest.approx(2 / 3)
    i = summarize(torch.tensor([3, -7, 10], dtype=torch.int64))
    assert (i.min, i.max, i.mean) == (-7, 10, 2.0)
    e = summarize(torch.empty(0, 3))
    assert (e.min, e.shape) == (None, (0, 3))
    assert summarize(torch.full((2,), float("nan"))).min is None
    h = summarize(torch.tensor([1.5, -2.25], dtype=torch.bfloat16))
    assert (h.min, h.max, h.dtype) == (-2.25, 1.5, torch.bfloat16)


def test_integer_values_are_shown_in_full() -> None:
    """Token ids 128000 and 128001: the table and the summary show eager's min and max,
    not one rounded number for both."""

    class Shift(torch.nn.Module):
        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return ids + 127999

    ids = torch.tensor([1, 2])
    want = Shift()(ids)
    low, high = int(want.min()), int(want.max())
    assert (low, high) == (128000, 128001)
    tr = ptexec.load(export_program(Shift(), (ids,))).load_method().trace([ids])
    (w,) = tr.records[-1].writes
    assert w.stats is not None and (w.stats.min, w.stats.max) == (low, high)
    assert f"min {low}  max {high}" in str(w.stats)
    row = tr.table().splitlines()[tr.records[-1].step + 1].split()
    assert str(low) in row and str(high) in row


def _to_float8(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float8_e5m2)


def test_summaries_of_dtypes_torch_cannot_reduce() -> None:
    """float8 has no min in torch: its NaNs are still counted (a NaN hunt stops at the
    cast that wrote one) and its range read exactly; uint16 and uint32 likewise."""
    from export_util import one_op_program

    x = torch.tensor([1.0, float("nan"), -2.0, 3.0])
    eager = _to_float8(x)
    assert int(eager.float().isnan().sum()) == 1
    s = summarize(eager)
    assert (s.min, s.max, s.nan, s.inf) == (-2.0, 3.0, 1, 0)
    u = torch.tensor([7, 65535]).to(torch.uint16)
    assert (summarize(u).min, summarize(u).max) == (7, 65535)
    m = ptexec.load(one_op_program(_to_float8, (x,))).load_method()
    tr = m.trace([x], stop_on="nan")
    assert tr.stopped is not None and tr.stopped.name.startswith("dim_order_ops::")
    (w,) = tr.stopped.writes
    assert w.stats is not None and w.stats.nan == 1


# ---- control flow ------------------------------------------------------------------------


def test_cond_shows_which_branch_ran() -> None:
    m = _methods("cond")["forward"]
    plan = m.state.plan
    jumps = [
        i for i, ins in enumerate(plan.chains[0].instructions) if isinstance(ins, p.JumpFalseCall)
    ]
    first_jump = jumps[0]
    x, y = torch.ones(3, 4), torch.randn(3, 4)
    taken = m.trace([x, y])  # sum > 0: the true branch
    other = m.trace([-x, y])
    torch.testing.assert_close(taken.outputs[0], torch.sin(x) + y)  # type: ignore[index]
    ran_a, ran_b = taken.executed[0], other.executed[0]
    assert ran_a != ran_b and ran_a | ran_b == set(range(len(plan.chains[0].instructions)))
    assert set(taken.skipped[0]) == set(range(len(plan.chains[0].instructions))) - ran_a
    (jump_a,) = [r for r in taken.records if r.index == first_jump]
    (jump_b,) = [r for r in other.records if r.index == first_jump]
    assert jump_a.jumped is False and jump_b.jumped is True
    assert jump_b.destination == plan.chains[0].instructions[first_jump].destination_instruction  # type: ignore[union-attr]
    assert min(taken.skipped[0]) > first_jump and "not run" in taken.table()
    # both agree with execute
    assert _same(taken.outputs or [], m.execute([x, y])) is None
    assert _same(other.outputs or [], m.execute([-x, y])) is None


def test_loops_record_every_iteration() -> None:
    """scan over 5 rows: the loop body's instructions appear once per iteration."""
    m = _methods("scan")["forward"]
    call = fixture_calls("scan")[0]
    tr = m.trace(_clone(call["inputs"]))
    chain = m.state.plan.chains[0].instructions
    (jump,) = [i for i, ins in enumerate(chain) if isinstance(ins, p.JumpFalseCall)]
    start = chain[jump].destination_instruction  # type: ignore[union-attr]
    rows = call["inputs"][1].shape[0]
    counts = {i: sum(1 for r in tr.records if r.index == i) for i in range(len(chain))}
    assert all(counts[i] == rows for i in range(start, jump + 1))
    assert all(counts[i] == 1 for i in range(len(chain)) if not start <= i <= jump)
    assert [r.jumped for r in tr.records if r.index == jump] == [True] * (rows - 1) + [False]


def test_instruction_cap_applies() -> None:
    m = _methods("scan", max_instructions=20)["forward"]
    call = fixture_calls("scan")[0]
    with pytest.raises(ptexec.LimitExceededError):
        m.execute(_clone(call["inputs"]))
    with pytest.raises(ptexec.LimitExceededError, match="more than 20 instructions"):
        m.trace(_clone(call["inputs"]))


def test_a_failing_instruction_is_named_as_execute_names_it() -> None:
    m = _methods("mlp", optimize=False)["forward"]
    plan = m.state.plan
    weight = next(
        j
        for j, v in enumerate(plan.values)
        if isinstance(v, p.Tensor) and v.is_constant and len(v.sizes) == 2
    )
    m.values()[weight] = torch.zeros(1)  # a constant of the wrong shape
    x = fixture_calls("mlp")[0]["inputs"]
    with pytest.raises(ptexec.ExecutionError) as plain:
        m.execute(x)
    with pytest.raises(ptexec.ExecutionError) as traced:
        m.trace(x)
    assert traced.value.instruction == plain.value.instruction
    assert traced.value.operator == plain.value.operator


# ---- NaN hunting -------------------------------------------------------------------------


def test_nan_hunt_stops_where_the_nan_is_made() -> None:
    class Sqrt(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a = x * 2.0
            b = a - 5.0  # negative for x in [0, 1)
            c = torch.sqrt(b)
            return c + 1.0

    x = torch.rand(3, 4)
    m = ptexec.load(export_program(Sqrt(), (x,))).load_method()
    tr = m.trace([x], stop_on="nan")
    assert tr.outputs is None and tr.stopped is not None
    assert tr.stopped.name == "aten::sqrt.default" or tr.stopped.name.startswith("aten::sqrt")
    assert tr.records[-1] is tr.stopped and len(tr.records) == tr.stopped.step + 1
    assert tr.stopped.index == 2 and tr.skipped[0] == [3]
    (w,) = tr.stopped.writes
    assert w.stats is not None and w.stats.nan == 12
    (r,) = tr.stopped.reads or []
    assert r.stats is not None and r.stats.nan == 0 and r.stats.max < 0  # type: ignore[operator]
    torch.testing.assert_close(r.stats.max, (x * 2 - 5).max().item())
    assert "NaN" in (tr.reason or "") and "sqrt" in tr.table()
    # no stop without a NaN
    ok = m.trace([x + 3.0], stop_on="nonfinite")
    assert ok.stopped is None and ok.outputs is not None


def _first_reader(m: ptexec.Method, value: int) -> int:
    for i, ins in enumerate(m.state.plan.chains[0].instructions):
        if isinstance(ins, p.KernelCall) and value in ins.args:
            return i
    raise AssertionError(f"nothing reads value {value}")


def test_nan_hunt_finds_an_injected_input_nan() -> None:
    m = _methods("mlp")["forward"]
    x = fixture_calls("mlp")[0]["inputs"][0].clone()
    x[1, 3] = float("nan")
    tr = m.trace([x], stop_on="nan")
    assert tr.stopped is not None
    assert tr.stopped.index == _first_reader(m, m.state.plan.inputs[0])
    assert any(r.stats is not None and r.stats.nan == 1 for r in tr.stopped.reads or [])


def test_nan_hunt_finds_an_injected_weight_nan() -> None:
    """A NaN in a constant (unoptimized load): the first instruction reading it stops."""
    m = _methods("mlp", optimize=False)["forward"]
    plan = m.state.plan
    const = [j for j, v in enumerate(plan.values) if isinstance(v, p.Tensor) and v.is_constant]
    second = max(const, key=lambda j: _first_reader(m, j))  # the weight read last
    m.values()[second].view(-1)[0] = float("nan")
    tr = m.trace(fixture_calls("mlp")[0]["inputs"], stop_on="nonfinite")
    assert tr.stopped is not None and tr.stopped.index == _first_reader(m, second)
    assert [r.index for r in tr.stopped.reads or [] if r.stats and r.stats.nan] == [second]


def test_inf_hunt() -> None:
    """The transformer's causal mask holds -inf: an Inf hunt stops at the first writer."""
    m = _methods("transformer", optimize=False)["forward"]
    tr = m.trace(fixture_calls("transformer")[0]["inputs"], stop_on="inf")
    assert tr.stopped is not None
    assert all(w.stats is None or w.stats.inf == 0 for r in tr.records[:-1] for w in r.writes)
    assert any(w.stats is not None and w.stats.inf for w in tr.stopped.writes)
    with pytest.raises(ValueError, match="stop_on"):
        m.trace(fixture_calls("transformer")[0]["inputs"], stop_on="zero")  # type: ignore[arg-type]


# ---- the float64 reference ---------------------------------------------------------------


def _worst(tr: Trace) -> float:
    return max((r.error.max_rel for r in tr.records if r.error is not None), default=0.0)


def test_reference_of_a_float64_program_is_exact() -> None:
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(8, 16)
            self.b = torch.nn.Linear(16, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.softmax(self.b(torch.nn.functional.gelu(self.a(x))), -1)

    net = Net().double().eval()
    x = torch.randn(3, 8, dtype=torch.float64)
    prog = ptexec.load(export_program(net, (x,)))
    # as the file says, the reference runs the very same kernels: no error at all
    tr = prog.load_method(optimize=False).trace([x], reference=True)
    errors = [w.error for r in tr.records for w in r.writes if w.error is not None]
    assert errors and all(e.max_abs == 0.0 and e.mismatched == 0 for e in errors)
    torch.testing.assert_close(tr.reference_outputs[0], tr.outputs[0], rtol=0, atol=0)  # type: ignore[index]
    # optimized, a transpose runs as a view (another summation order): a few ulps at most
    tr = prog.load_method().trace([x], reference=True)
    assert 0 <= _worst(tr) <= 4 * torch.finfo(torch.float64).eps
    torch.testing.assert_close(tr.reference_outputs[0], net(x), rtol=1e-14, atol=1e-15)  # type: ignore[index]


@pytest.mark.parametrize("name", ["bf16_mlp", "half_mlp", "bf16_mlp_unplanned"])
def test_reference_shows_half_precision_error(name: str) -> None:
    call = fixture_calls(name)[0]
    tr = _methods(name)["forward"].trace(_clone(call["inputs"]), reference=True)
    dtype = call["outputs"][0].dtype
    eps = torch.finfo(dtype).eps
    worst = _worst(tr)
    assert eps / 50 < worst < 10 * eps, (name, worst, eps)
    out = tr.records[-1].writes[0]
    assert out.error is not None and out.error.eps == eps
    # the reported error is the distance to the reference outputs
    ref = tr.reference_outputs[0]  # type: ignore[index]
    assert ref.dtype == torch.float64
    diff = (tr.outputs[0].double() - ref).abs().max().item()  # type: ignore[index]
    assert diff == pytest.approx(out.error.max_abs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_reference_equals_eager_in_float64(dtype: torch.dtype) -> None:
    """Views, splits and transposes (planned at shared offsets) in a narrow dtype: the
    reference outputs are eager's float64 outputs of the same weights and inputs."""

    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = torch.nn.Linear(16, 48)
            self.out = torch.nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = self.qkv(x).split(16, -1)
            q = q.view(b, t, 2, 8).transpose(1, 2)
            k = k.view(b, t, 2, 8).transpose(1, 2)
            v = v.view(b, t, 2, 8).transpose(1, 2)
            w = torch.softmax(q @ k.transpose(-1, -2) / 3.0, -1)
            y = (w @ v).transpose(1, 2).reshape(b, t, 16)
            return torch.nn.functional.layer_norm(self.out(y) + x, (16,))

    torch.manual_seed(0)
    net = Attention().eval().to(dtype)
    x = torch.randn(2, 5, 16).to(dtype)
    m = ptexec.load(export_program(net, (x,))).load_method()
    tr = m.trace([x], reference=True)
    want = net.double()(x.double())
    tol = 1e-6 if dtype == torch.float32 else 1e-9  # float32 programs round scalar operands
    torch.testing.assert_close(tr.reference_outputs[0], want, rtol=tol, atol=tol)  # type: ignore[index]
    assert all(r.reference_note is None for r in tr.records)
    assert _worst(tr) > (1e-4 if dtype != torch.float32 else 1e-8)


@pytest.mark.parametrize("name", RUNNABLE)
def test_reference_on_every_fixture(name: str) -> None:
    """The reference runs beside every fixture and lands within the fixture's tolerance of
    the program; float32 programs stay within a few float32 ulps of it."""
    methods = _methods(name)
    rtol, atol = tolerance(name)
    for call in fixture_calls(name):
        m = methods[call["method"]]
        tr = m.trace(_clone(call["inputs"]), reference=True)
        assert tr.reference_outputs is not None
        ref = [
            r.to(o.dtype) if isinstance(r, torch.Tensor) else r
            for r, o in zip(tr.reference_outputs, call["outputs"], strict=True)
        ]
        assert compare_outputs(ref, call["outputs"], rtol, atol) is None
        if "half" not in MANIFEST[name]["tags"]:
            assert _worst(tr) < 1e-5, [(r.index, r.name, str(r.error)) for r in tr.worst(3)]


def test_an_inf_where_the_reference_is_finite_is_the_worst_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """float16 overflows to Inf where eager float64 stays finite: those values are
    mismatched, not 0 error, and rank first, in the trace, its JSON and the command's text."""
    from ptexec.cli import main

    class Overflow(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x * 300.0
            z = y * y  # past float16's 65504 for |x| > 0.85
            return z - z.mean()

    net = Overflow()
    x = torch.tensor([[0.5, 1.0, 2.0, -1.5]], dtype=torch.float16)
    pte = tmp_path / "overflow.pte"
    pte.write_bytes(export_program(net, (x,)))
    eager16, eager64 = net(x), net(x.double())
    assert not eager16.isfinite().any() and eager64.isfinite().all()

    tr = ptexec.load(pte).load_method().trace([x], reference=True)
    torch.testing.assert_close(tr.reference_outputs[0], eager64, rtol=1e-12, atol=0)  # type: ignore[index]
    out = tr.records[-1]
    assert out.error is not None and out.error.mismatched == eager16.numel()
    worst = tr.worst()
    assert worst and all(r.error is not None and r.error.mismatched for r in worst)
    assert worst[0] is out and str(out.error) == f"{eager16.numel()} mismatched"
    (square,) = [r for r in tr.records if r.writes and r.writes[0].stats.inf == 3]  # type: ignore[union-attr]
    assert square in worst and square.error.mismatched == 3  # type: ignore[union-attr]
    assert tr.to_dict()["worst"][0] == out.step
    assert f"{eager16.numel()} mismatched" in tr.table().splitlines()[out.step + 1]

    torch.save([x], tmp_path / "x.pt")
    args = [str(pte), "--input", str(tmp_path / "x.pt"), "--reference"]
    assert main(["trace", *args, "--json", str(tmp_path / "t.json")]) == 0
    text = capsys.readouterr().out
    listed = text.split("largest errors against the float64 reference:")[1].splitlines()
    assert listed[1].strip() == f"instruction {out.index} {out.name}: {out.error}"
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["worst"][0] == out.step
    assert data["records"][out.step]["writes"][0]["error"]["mismatched"] == eager16.numel()


def test_a_nan_scalar_where_the_reference_is_finite_is_mismatched() -> None:
    """``.item()`` of a float32 sum that overflowed: NaN in the program, 0 in eager float64.
    The scalar is mismatched and ranks among the worst, as a tensor element would."""

    class Item(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            t = x.sum()
            return x * (t - t).item()

    net = Item()
    x = torch.tensor([3e38, 3e38])
    eager32 = (x.sum() - x.sum()).item()
    eager64 = (x.double().sum() - x.double().sum()).item()
    assert math.isnan(eager32) and eager64 == 0.0
    tr = ptexec.load(export_program(net, (x,))).load_method().trace([x], reference=True)
    (item,) = [r for r in tr.records if r.name == "aten::_local_scalar_dense"]
    (w,) = item.writes
    assert math.isnan(w.value) and w.error is not None
    assert w.error.mismatched == 1 and w.error.is_error and str(w.error) == "1 mismatched"
    assert item in tr.worst(len(tr.records))


def test_reference_keeps_the_call_record() -> None:
    """Device copies run twice under a reference; the call's byte counts stay the call's."""
    methods = _methods("h2d_copy")
    call = fixture_calls("h2d_copy")[0]
    m = methods["forward"]
    m.execute(_clone(call["inputs"]))
    plain = dict(m.last_call.bytes_copied)
    m.trace(_clone(call["inputs"]), reference=True)
    assert m.last_call.bytes_copied == plain


def test_reference_notes_what_float64_cannot_run() -> None:
    """choose_qparams wants float32: that instruction runs on the reference's values in
    float32, and the reference goes on in float64."""
    call = fixture_calls("quant_dynamic")[0]
    tr = _methods("quant_dynamic")["forward"].trace(_clone(call["inputs"]), reference=True)
    noted = [r for r in tr.records if r.reference_note]
    assert noted and all("choose_qparams" in r.name for r in noted)
    assert "ran in the program's precision" in tr.table()
    assert tr.reference_outputs is not None and tr.reference_outputs[0].dtype == torch.float64


XNNPACK = Path(__file__).resolve().parent / "fixtures" / "xnnpack"


@pytest.mark.parametrize("name", ["transformer", "op_linear", "qops_int8_static_pt", "op_add"])
def test_delegated_programs(name: str) -> None:
    """An XNNPACK delegate is one instruction: traced like any other, and run narrow by the
    reference (its weights are its own)."""
    manifest = json.loads((XNNPACK / "manifest.json").read_text())
    if name not in manifest:
        pytest.skip(f"no XNNPACK fixture {name}")
    prog = ptexec.load(XNNPACK / manifest[name]["pte"])
    traced, executed = prog.load_method(), prog.load_method()
    for call in torch.load(XNNPACK / f"{name}.io.pt", weights_only=True)["calls"]:
        tr = traced.trace(_clone(call["inputs"]), reference=True)
        assert _same(tr.outputs or [], executed.execute(_clone(call["inputs"]))) is None
        assert any(r.kind == "delegate" and r.name == "delegate:XnnpackBackend" for r in tr.records)
        ref = [
            r.to(o.dtype) for r, o in zip(tr.reference_outputs or [], tr.outputs or [], strict=True)
        ]
        assert compare_outputs(ref, tr.outputs or [], 1e-2, 1e-2) is None


def test_trace_as_dict_and_text() -> None:
    call = fixture_calls("transformer")[0]
    tr = _methods("transformer")["forward"].trace(call["inputs"], reference=True)
    d = tr.to_dict()
    assert d["executed"] == len(tr.records) == 55 and d["skipped"] == [[]]
    assert d["records"][0]["writes"][0]["tensor"]["shape"] == [2, 6, 16]
    assert "error" in d["records"][0]["writes"][0]
    text = str(tr)
    assert "aten::native_layer_norm.out" in text and "folded at load" in text
    assert len(tr.table(limit=5).splitlines()) < 20


# ---- the command ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", RUNNABLE)
def test_cli_trace(name: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from fixture_data import missing_devices
    from ptexec.cli import main

    pte, ptd = fixture_paths(name)
    args = [str(pte)] + (["--data", str(ptd)] if ptd else [])
    if missing_devices(name):
        args += ["--device-map", "cpu"]
    out = tmp_path / "trace.json"
    for method in MANIFEST[name]["methods"]:
        assert main(["trace", *args, "--method", method, "--reference", "--json", str(out)]) == 0
        text = capsys.readouterr().out
        assert "instruction(s) executed" in text and "output 0" in text
        data = json.loads(out.read_text())
        assert data["method"] == method and data["executed"] == len(data["records"]) > 0


def test_cli_trace_nan_hunt_and_tensors(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from ptexec.cli import main

    pte = str(fixture_paths("mlp")[0])
    x = fixture_calls("mlp")[0]["inputs"][0].clone()
    torch.save([x], tmp_path / "ok.pt")
    assert (
        main(
            [
                "trace",
                pte,
                "--input",
                str(tmp_path / "ok.pt"),
                "--save-tensors",
                str(tmp_path / "t.pt"),
                "--no-optimize",
                "--reads",
            ]
        )
        == 0
    )
    saved = torch.load(tmp_path / "t.pt")
    assert len(saved) == 5 and all(isinstance(t, torch.Tensor) for t in saved.values())
    assert "read" not in capsys.readouterr().err
    x[0, 0] = float("nan")
    torch.save([x], tmp_path / "bad.pt")
    assert main(["trace", pte, "--input", str(tmp_path / "bad.pt"), "--stop-on", "nan"]) == 2
    text = capsys.readouterr().out
    assert "stopped: instruction" in text and "NaN" in text and "read  v" in text


def test_cli_progress(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from ptexec.cli import common as cli

    clock = iter([0.0, 0.5, 1.2, 1.3, 2.0, 2.1])
    monkeypatch.setattr(cli.time, "perf_counter", lambda: next(clock))
    progress = cli.Progress("{done} of {total}")
    for done in range(1, 6):
        progress(done, 10)
    progress.close()
    err = capsys.readouterr().err
    assert err.splitlines() == ["2 of 10 (1 s)", "4 of 10 (2 s)"]


class _Random(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.nn.functional.dropout(x, 0.5, training=True)
        return y, torch.rand(2, 4) + x


def test_a_reference_trace_draws_no_random_numbers_of_its_own() -> None:
    """``trace(reference=True)`` takes a random kernel's values from the program (run again
    in float64 it drew other numbers: an error against nothing, and the program's later
    draws moved on), so the traced call computes what ``execute`` computes."""
    x = torch.ones(2, 4)
    method = ptexec.load(export_program(_Random().train(), (x,))).load_method()
    torch.manual_seed(0)
    want = method.execute([x])
    torch.manual_seed(0)
    tr = method.trace([x], reference=True, tensors=True)
    for got, expected in zip(tr.outputs, want, strict=True):
        assert torch.equal(got, expected)
    random = [r for r in tr.records if "draws random numbers" in (r.reference_note or "")]
    assert {r.name for r in random} == {"aten::native_dropout.out", "aten::rand.out"}
    errors = [w.error for r in tr.records for w in r.writes if w.error is not None]
    assert errors and all(e.mismatched == 0 for e in errors)


def test_a_random_kernels_values_taken_from_the_program_have_no_error() -> None:
    """Dropout after an exp: eager float64 with the program's own mask gives other values
    than the program's float32 ones, so the values the reference took from the program
    are marked as having no reference, never reported as exact."""

    class Drop(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.dropout(torch.exp(x) * 1.7, 0.5, training=True) * 3.3

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    method = ptexec.load(export_program(Drop().train(), (x,))).load_method()
    tr = method.trace([x], reference=True, tensors=True)
    (drop,) = [r for r in tr.records if r.name == "aten::native_dropout.out"]
    out, mask = drop.writes
    eager64 = torch.exp(x.double()) * 1.7 * mask.value / 0.5
    assert (out.value.double() - eager64).abs().max() > 0  # the program's value is not exact
    for w in drop.writes:
        assert w.error is not None and w.error.note is not None
        assert "no reference" in str(w.error)
    assert drop.error is None and drop not in tr.worst(len(tr.records))
    line = tr.table().splitlines()[drop.step + 1]
    assert "no reference" in line and "0.00e+00" not in line
