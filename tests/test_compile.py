"""The compiled tier (``load_method(..., compile=True)``): AOTInductor-compiled regions
behind the interpreter's call envelope.

AOTInductor compiles take seconds each, so the default run compiles a handful of small
fixtures, chosen to cover what the tier must get right (plain graphs, state across calls
and methods, dynamic shapes, control flow, integer ops, LLM and quantized custom ops, an
XNNPACK delegate); every fixture runs compiled in ``test_compile_fixtures.py`` (marked
``slow``). Each compiled method is checked call by call against the interpreter on its
own copy of the program. The cache is one temporary directory per test session
(``compile_util.session_cache_dir``): a second load in the session is a cache hit, and a
test never sees an entry left by another run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import types
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import ptexec
from compile_util import (
    assert_report_partitions,
    load_pair,
    replay_both,
    replay_xnnpack,
    session_cache_dir,
    skip_slow_unless_asked,
    state_values,
    xnnpack_pair,
)
from fixture_data import fixture_calls, fixture_paths
from ptexec.compile import CompileOptions, CompileReport, CompileWarning
from ptexec.compile.aoti import inductor_options, runs_delegates
from ptexec.compile.cache import cache_dir, cache_key, content_digest
from ptexec.errors import ExecutionError, InstructionLimitError
from ptexec.format import program as p

ROOT = Path(__file__).resolve().parent.parent

# the fixtures compiled in the default run (about ten small programs)
COMPILED = [
    "mlp",
    "stateful",
    "two_method_state",
    "dynamic_mlp",
    "int_ops",
    "cond",
    "llama_sdpa",
    "quant_embedding",
]


@pytest.fixture(autouse=True)
def _session_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(session_cache_dir()))


@pytest.mark.parametrize("name", COMPILED)
def test_compiled_matches_the_interpreter(name: str) -> None:
    interpreted, compiled = load_pair(name)
    for m in compiled.values():
        report = m.compile_report
        assert isinstance(report, CompileReport)
        assert report.compiled_instructions > 0, report.summary()
        assert_report_partitions(report)
    replay_both(name, interpreted, compiled)


def test_xnnpack_delegate_compiled_with_its_neighbours() -> None:
    plain, compiled = xnnpack_pair("mlp")
    report = compiled.compile_report
    assert report is not None and report.fully_compiled, report
    replay_xnnpack("mlp", plain, compiled)


def test_second_load_compiles_nothing() -> None:
    _, first = load_pair("mlp")
    _, again = load_pair("mlp")
    report = again["forward"].compile_report
    assert report is not None and report.cache_hit and report.compile_seconds == 0.0
    assert report.cache_path is not None and Path(report.cache_path).parent == session_cache_dir()
    assert report.regions == first["forward"].compile_report.regions  # type: ignore[union-attr]


def test_a_compile_leaves_the_hosts_inductor_options_as_they_were() -> None:
    """AOTInductor's metadata option is a dict torch fills in place as it compiles (the
    device, the CPU's instruction set): a compile gives it one of its own, so the host's
    later AOTInductor compiles do not inherit what one of ptexec's wrote (the session's
    compiles run in this process: the cache is new with it)."""
    load_pair("mlp")
    assert torch._inductor.config.aot_inductor.metadata == {}


def test_the_cache_works_across_processes() -> None:
    """Another process with the same cache directory loads the compiled code (no compile)."""
    load_pair("mlp")
    pte = fixture_paths("mlp")[0]
    code = (
        "import sys, torch, ptexec\n"
        # the same thread count: CPU code is compiled for one (it is part of the key)
        f"torch.set_num_threads({torch.get_num_threads()})\n"
        f"m = ptexec.load({str(pte)!r}).load_method('forward', compile=True)\n"
        "r = m.compile_report\n"
        "x = torch.ones(2, 8)\n"
        "i = ptexec.load(sys.argv[1]).load_method('forward')\n"
        "assert torch.allclose(m(x)[0], i(x)[0], atol=1e-5), 'outputs differ'\n"
        "print(r.cache_hit, r.compile_seconds, r.compiled_instructions)\n"
    )
    child = _child(code, pte)
    assert child.returncode == 0, child.stderr[-4000:]  # (what failed, when it does)
    assert child.stdout.split() == ["True", "0.0", "5"]


def test_outputs_views_out_and_records_as_the_interpreter() -> None:
    interpreted, compiled = load_pair("mlp")
    x = fixture_calls("mlp")[0]["inputs"][0]
    i, c = interpreted["forward"], compiled["forward"]
    (vi,) = i.execute([x], outputs="view")
    (vc,) = c.execute([x], outputs="view")
    assert torch.allclose(vi, vc, atol=1e-5)
    out_i, out_c = torch.empty(2, 4), torch.empty(2, 4)
    (ri,) = i.execute([x], out=[out_i])
    (rc,) = c.execute([x], out=[out_c])
    assert ri is out_i and rc is out_c and torch.allclose(out_i, out_c, atol=1e-5)
    assert list(i.last_call.outputs) == list(c.last_call.outputs) == ["copy"]
    # numpy input through the general path; then the fast path again
    (yn,) = c.execute([x.numpy()])
    (yf,) = c.execute([x])
    assert torch.allclose(yn, yf) and torch.allclose(yf, i.execute([x])[0], atol=1e-5)


def test_bad_input_is_refused_before_anything_runs() -> None:
    _, compiled = load_pair("mlp")
    m = compiled["forward"]
    with pytest.raises(ptexec.InputError):
        m.execute([torch.ones(3, 8)])
    with pytest.raises(ptexec.InputError):
        m.execute([torch.ones(2, 8, dtype=torch.float64)])
    x = fixture_calls("mlp")[0]["inputs"][0]
    assert torch.equal(m(x)[0], m(x)[0])


def test_inputs_only_compiled_code_reads_are_read_in_place() -> None:
    """A planned input that only compiled code reads (and whose bytes nothing else reads
    first) is passed to it as the caller's tensor when that is dense: no copy into
    planned memory, recorded as shared; the planned view is back in the table after the
    call; any other layout is copied as before, with the same result."""
    interpreted, compiled = load_pair("mlp")
    i, c = interpreted["forward"], compiled["forward"]
    report = c.compile_report
    assert report is not None and report.read_in_place == (0,)
    assert "read in place" in report.summary()
    slot = c.state.inputs[0].slot
    view = c.state.values[slot]
    torch.manual_seed(0)
    x = torch.randn(2, 8)
    (got,) = c(x)
    assert torch.allclose(got, i(x)[0], atol=1e-5)
    assert list(c.last_call.inputs) == ["share"] and c.last_call.copies == 0
    assert c.state.values[slot] is view  # the caller's tensor is not kept
    x.add_(1.0)  # the returned output is the caller's own
    assert torch.allclose(got, i(x - 1.0)[0], atol=1e-5)
    strided = torch.randn(8, 2).t()  # not dense: copied into the planned view
    assert torch.allclose(c(strided)[0], i(strided)[0], atol=1e-5)
    assert list(c.last_call.inputs) == ["copy"] and c.last_call.h2h == 64
    assert list(i.last_call.inputs) == ["copy"]


def test_an_input_in_the_methods_own_memory_is_copied_not_read_in_place() -> None:
    """A caller's tensor over the method's planned memory (made from the output's planned
    view) is copied in first, as the interpreter does: read in place, the run would
    overwrite it while reading it. The result is the interpreter's on the same values."""
    interpreted, compiled = load_pair("mlp")
    i, c = interpreted["forward"], compiled["forward"]
    torch.manual_seed(1)
    c.execute([torch.randn(2, 8)])
    storage = c.state.values[c.state.outputs[0].slot].untyped_storage()
    tried = 0
    for offset in range(0, storage.nbytes() // 4 - 16 + 1):  # its own planned view too
        tried += 1
        alias = torch.empty(0).set_(storage, offset, (2, 8), (8, 1))
        alias.copy_(torch.randn(2, 8))
        want = i(alias.clone())[0]
        (got,) = c(alias)
        assert list(c.last_call.inputs) == ["copy"], offset
        assert torch.allclose(got, want, atol=1e-5), offset
    assert tried
    x = torch.randn(2, 8)  # a tensor of its own is still read in place
    assert torch.allclose(c(x)[0], i(x)[0], atol=1e-5)
    assert list(c.last_call.inputs) == ["share"]


def test_read_in_place_refuses_what_the_general_path_refuses() -> None:
    """Inputs the fast call does not take go to the general path, which refuses them with
    the interpreter's own errors; the method works for the next good call."""
    interpreted, compiled = load_pair("mlp")
    i, c = interpreted["forward"], compiled["forward"]
    x = torch.randn(2, 8)
    bad: list[Any] = [
        torch.ones(3, 8),
        torch.ones(2, 8, dtype=torch.float64),
        torch.ones(2, 8, dtype=torch.int64),
        torch.ones(2, 8, 1),
        torch.ones(2, 8, device="meta"),
    ]
    for b in bad:
        with pytest.raises(Exception) as want:
            i.execute([b])
        with pytest.raises(Exception) as got:
            c.execute([b])
        assert type(got.value) is type(want.value) and str(got.value) == str(want.value)
        assert torch.allclose(c(x)[0], i(x)[0], atol=1e-5)
    with pytest.raises(ptexec.InputError):
        c.execute([x, x])
    grad = torch.randn(2, 8, requires_grad=True)  # the general path: no autograd, same values
    (out,) = c(grad)
    assert not out.requires_grad and torch.allclose(out, i(grad.detach())[0], atol=1e-5)
    assert list(c.last_call.inputs) == ["copy"]


@pytest.mark.parametrize("name", ["mlp", "mlp_unplanned"])
def test_a_lazily_negated_input_is_read_by_its_values(name: str) -> None:
    """A tensor with a lazy negation (``conj().imag`` of a complex tensor is one) may be
    dense, but its memory holds the negated values: compiled code, which reads memory, is
    given a copy with the values (planned: copied in, never read in place; unplanned:
    converted), and answers as the interpreter and eager PyTorch."""
    interpreted, compiled = load_pair(name)
    i, c = interpreted["forward"], compiled["forward"]
    torch.manual_seed(2)
    lazy = torch._neg_view(torch.randn(2, 8))
    assert lazy.is_neg() and lazy.is_contiguous()
    plain = lazy.resolve_neg()
    want = i(plain)[0]
    for _ in range(2):  # the general path, then the fast call's own test
        assert torch.allclose(c(lazy)[0], want, atol=1e-5)
        assert list(c.last_call.inputs) == (["copy"] if name == "mlp" else ["convert"])
        assert torch.allclose(i(lazy)[0], want, atol=1e-5)
    assert torch.allclose(c(plain)[0], want, atol=1e-5)
    assert list(c.last_call.inputs) == ["share"]


_ZERO_TENSOR_CHILD = """
import sys, torch, ptexec
torch.set_num_threads(int(sys.argv[2]))
i = ptexec.load(sys.argv[1]).load_method("forward")
c = ptexec.load(sys.argv[1]).load_method("forward", compile=True)
assert c.compile_report.cache_hit, c.compile_report
zero = torch._efficientzerotensor((2, 8))
assert zero.is_contiguous() and zero.data_ptr() == 0
want = i(torch.zeros(2, 8))[0]
for _ in range(2):  # the general path, then the fast call's own test
    torch.testing.assert_close(i(zero)[0], want)
    torch.testing.assert_close(c(zero)[0], want)
x = torch.randn(2, 8)
torch.testing.assert_close(c(x)[0], i(x)[0])
print("ok")
"""


@pytest.mark.parametrize("name", ["mlp", "mlp_unplanned"])
def test_a_zero_tensor_input_is_read_by_its_values(name: str) -> None:
    """A ZeroTensor (autograd's efficient zeros) is dense but has no memory at all (its
    address is 0): compiled code given it read address 0 and the process died. Like a
    lazy negation, it is copied (planned) or converted (unplanned), and the method
    answers as the interpreter does, with zeros (in a process of its own: it may die)."""
    load_pair(name)  # compiled into the session's cache
    pte = fixture_paths(name)[0]
    _child_says_ok(
        _ZERO_TENSOR_CHILD.replace("sys.argv[2]", repr(str(torch.get_num_threads()))), pte
    )


def test_read_in_place_with_control_flow_and_reused_input_bytes() -> None:
    """With jumps, inputs whose bytes no other value shares are read in place; where the
    memory plan reuses an input's bytes for a later value, the input still is when that
    value is written before it is read (checked against the interpreter, call by call).
    A dynamic output the caller alone reads takes the compiled code's result (and is
    copied for the caller): the input still is read in place."""
    for name, want in (("cond", (0, 1)), ("int_ops", (0, 1, 2)), ("dynamic_mlp", (0,))):
        interpreted, compiled = load_pair(name)
        report = compiled["forward"].compile_report
        assert report is not None and report.read_in_place == want, name
        replay_both(name, interpreted, compiled)
        assert set(compiled["forward"].last_call.inputs) == {"share"}, name


def test_outputs_only_the_caller_reads_are_handed_over(tmp_path: Path) -> None:
    """Traced (the ``graph`` backend): outputs only the caller reads are the compiled
    code's new tensors, handed to the caller as its copies; where the region runs its
    interpreted statements instead (a broadcast batch of 1, outside the sizes the code
    was made for) the caller gets copies of the planned tensors. On both paths: the
    interpreter's values, tensors of their own (no byte of the method's planned memory,
    none of another call's), untouched by later calls, and the table holds the tensors
    loading put there after every call."""
    from export_util import export_program

    class Two(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return (x + y).relu() * 2, (x * 3).sum(0)

    batch = torch.export.Dim("batch", min=1, max=8)
    path = tmp_path / "two.pte"
    path.write_bytes(
        export_program(
            Two(),
            (torch.randn(3, 4), torch.randn(3, 4)),
            dynamic_shapes={"x": {0: batch}, "y": {0: batch}},
        )
    )
    i = ptexec.load(path).load_method("forward")
    c = ptexec.load(path).load_method("forward", compile=CompileOptions(backend="graph"))
    report = c.compile_report
    assert report is not None and report.fully_compiled, report
    slots = [o.slot for o in c.state.outputs]
    loaded = [c.state.values[j] for j in slots]
    planned = [(b.data.data_ptr(), b.data.data_ptr() + b.data.nbytes) for b in c.state.buffers]
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []
    torch.manual_seed(0)
    for n, m in ((3, 3), (3, 1), (5, 5), (2, 1), (2, 2), (8, 8)):
        xs = [torch.randn(n, 4), torch.randn(m, 4)]
        want = i.execute([x.clone() for x in xs])
        got = c.execute(xs)
        assert len(got) == len(want) == 2
        for a, b in zip(want, got, strict=True):
            assert a.shape == b.shape and torch.equal(a, b), (n, m)
        for t in got:
            start = t.untyped_storage().data_ptr()
            end = start + t.untyped_storage().nbytes()
            assert all(end <= lo or start >= hi for lo, hi in planned), (n, m)
            assert all(
                t.untyped_storage().data_ptr() != u.untyped_storage().data_ptr() for u, _ in kept
            ), (n, m)
        assert all(c.state.values[j] is t for j, t in zip(slots, loaded, strict=True))
        kept.extend((t, t.clone()) for t in got)
    for t, copy in kept:  # later calls wrote none of them
        assert torch.equal(t, copy)
    for t, _ in kept:  # nor does the method read them: the caller may write its copies
        t.fill_(float("nan"))
    xs = [torch.randn(4, 4), torch.randn(4, 4)]
    for a, b in zip(i.execute([x.clone() for x in xs]), c.execute(xs), strict=True):
        assert torch.equal(a, b)


def test_handed_and_copied_outputs_together(tmp_path: Path) -> None:
    """An output named twice is copied for the caller (two tensors of their own), the
    others handed over; in the caller's order, as the interpreter's."""
    from export_util import export_program

    class Four(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            a = x * 2
            return a, a + 1, a, (x - 1).abs()

    path = tmp_path / "four.pte"
    path.write_bytes(export_program(Four(), (torch.randn(3, 4),)))
    i = ptexec.load(path).load_method("forward")
    c = ptexec.load(path).load_method("forward", compile=CompileOptions(backend="graph"))
    report = c.compile_report
    assert report is not None and report.fully_compiled, report
    for _ in range(3):
        x = torch.randn(3, 4)
        want, got = i.execute([x]), c.execute([x])
        assert len(want) == len(got) == 4
        assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
        assert len({t.untyped_storage().data_ptr() for t in got}) == 4


@pytest.mark.parametrize("xnnpack", ["torch", "auto"])
def test_a_guarded_delegate_call_reads_its_input_in_place(xnnpack: str) -> None:
    """An XNNPACK delegate call compiled with sizes to check (a dynamic batch): its
    interpreted statement (ptexec's torch runner, or ExecuTorch's backend where it is
    installed) reads the table's slot when it runs, so the caller's input is read in
    place, as for kernel calls; values as the interpreter's."""
    plain, compiled = xnnpack_pair("dynamic_mlp", CompileOptions(backend="graph"), xnnpack)
    report = compiled.compile_report
    assert report is not None and report.fully_compiled, report
    assert report.read_in_place == (0,)
    replay_xnnpack("dynamic_mlp", plain, compiled)
    assert list(compiled.last_call.inputs) == ["share"]


def test_dynamic_shapes_compiled_and_outside_the_compiled_sizes() -> None:
    """Every batch the program takes runs compiled (1 included: sizes are traced
    size-obliviously); a size the compiled code was not made for (the program bounds its
    feature dimension by 8, the graph needs exactly 8) runs the region's interpreted
    statements, and so fails exactly as the interpreter does."""
    interpreted, compiled = load_pair("dynamic_mlp")
    i, c = interpreted["forward"], compiled["forward"]
    torch.manual_seed(0)
    for batch in (1, 2, 7, 16, 1, 3):
        x = torch.randn(batch, 8)
        assert torch.allclose(i(x)[0], c(x)[0], atol=1e-5), batch
    with pytest.raises(ptexec.InputError):
        c(torch.randn(17, 8))
    narrow = torch.randn(3, 5)
    with pytest.raises(ExecutionError) as want:
        i(narrow)
    with pytest.raises(ExecutionError) as got:
        c(narrow)
    assert (got.value.instruction, got.value.operator) == (
        want.value.instruction,
        want.value.operator,
    )
    assert torch.allclose(i(torch.ones(4, 8))[0], c(torch.ones(4, 8))[0], atol=1e-5)


def _child(code: str, program: Path) -> subprocess.CompletedProcess[str]:
    """``code`` run on ``program`` (its ``sys.argv[1]``) in a process of its own (a
    compiled kernel may kill it), with this checkout's ptexec and the session's compile
    cache."""
    env = {**os.environ, "PTEXEC_CACHE_DIR": str(session_cache_dir())}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", code, str(program)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _child_says_ok(code: str, program: Path) -> None:
    """:func:`_child` of ``code``, which prints "ok"."""
    child = _child(code, program)
    assert child.returncode == 0 and child.stdout.split() == ["ok"], (
        child.returncode,
        child.stderr[-4000:],
    )


class _MaxOverBatch(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 2).amax(0) + 1


def test_an_empty_batch_runs_interpreted() -> None:
    """AOTInductor's kernels are not made for a dimension of size 0: a maximum over none
    gave -inf where ATen raises, and a CPU matrix product divided by the row count (the
    process died of a floating point exception). Such a call runs the region's
    interpreted statements: the interpreter's result or error."""
    from export_util import export_program

    batch = torch.export.Dim("batch", min=1, max=8)
    pte = export_program(_MaxOverBatch(), (torch.ones(3, 4),), dynamic_shapes=({0: batch},))
    i = ptexec.load(pte).load_method("forward")
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileWarning)
        c = ptexec.load(pte).load_method("forward", compile=CompileOptions(progress=False))
    report = c.compile_report
    assert report is not None and report.fully_compiled, report
    x = torch.randn(3, 4)
    torch.testing.assert_close(c(x)[0], _MaxOverBatch()(x))
    for m in (i, c):
        with pytest.raises(ExecutionError, match="non-zero size"):
            m(torch.randn(0, 4))
    torch.testing.assert_close(c(x)[0], _MaxOverBatch()(x))

    # a linear layer of a dynamic batch, in a process of its own (it may die)
    load_pair("dynamic_mlp")
    code = (
        "import sys, torch, ptexec\n"
        f"torch.set_num_threads({torch.get_num_threads()})\n"
        "i = ptexec.load(sys.argv[1]).load_method('forward')\n"
        "c = ptexec.load(sys.argv[1]).load_method('forward', compile=True)\n"
        "assert c.compile_report.compiled_instructions > 0, c.compile_report\n"
        "for b in (0, 2, 0):\n"
        "    x = torch.randn(b, 8)\n"
        "    want, got = i(x)[0], c(x)[0]\n"
        "    assert got.shape == want.shape == (b, 4) and torch.allclose(got, want, atol=1e-5)\n"
        "print('ok')\n"
    )
    _child_says_ok(code, fixture_paths("dynamic_mlp")[0])


class _AfterFirst(torch.nn.Module):
    """A linear layer on every row but the first: its input has one row less than ``x``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x[1:]) * 2


_AFTER_FIRST_CHILD = """
import sys, torch, ptexec
from ptexec.compile import CompileOptions
torch.manual_seed(0)
i = ptexec.load(sys.argv[1]).load_method("forward")
c = ptexec.load(sys.argv[1]).load_method("forward", compile=CompileOptions(progress=False))
assert c.compile_report.fully_compiled, c.compile_report
for b in (4, 1, 2, 1, 8):
    x = torch.randn(b, 4)
    want, got = i(x)[0], c(x)[0]
    assert got.shape == want.shape == (b - 1, 3), (b, got.shape, want.shape)
    torch.testing.assert_close(got, want)
print("ok")
"""


def test_a_size_of_the_graph_that_may_be_empty_runs_interpreted(tmp_path: Path) -> None:
    """A ``.pte`` keeps only upper bounds: a program exported for 3 rows or more takes 1,
    and ``x[1:]`` is then empty inside the graph, where AOTInductor's CPU matrix product
    divides by the row count (the process died of a floating point exception). A size of
    the graph that may be 0 is guarded, so such a call runs the interpreted statements
    (the interpreter's result, of no rows)."""
    from export_util import export_program

    batch = torch.export.Dim("batch", min=3, max=8)
    pte = export_program(_AfterFirst(), (torch.ones(4, 4),), dynamic_shapes=({0: batch},))
    path = tmp_path / "after_first.pte"
    path.write_bytes(pte)
    _child_says_ok(_AFTER_FIRST_CHILD, path)


class _HalfBatch(torch.nn.Module):
    """A float scalar made at run time (the batch / 2) read by a later region: dropout
    draws random numbers, so it runs interpreted between two compiled regions."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.shape[0] / 2
        y = x * 2 + 1
        r = torch.ops.aten.native_dropout(y, 0.5, True)[0] * 0
        return ((y + r) * s).relu() - 1


def test_a_scalar_of_another_kind_than_declared_is_not_cut_between_regions() -> None:
    """The program declares the batch / 2 an Int (its placeholder); at run time truediv
    writes a float there. The second region took it as the declared kind and cut 1.5 to
    1 (batch 3: 2.0 where the answer is 3.5). A scalar input of another kind than the
    region was traced with runs the region's interpreted statements."""
    from export_util import export_program

    batch = torch.export.Dim("batch", min=1, max=16)
    pte = export_program(_HalfBatch(), (torch.ones(4, 4),), dynamic_shapes={"x": {0: batch}})
    interpreted = ptexec.load(pte).load_method("forward")
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileWarning)
        compiled = ptexec.load(pte).load_method("forward", compile=True)
    report = compiled.compile_report
    assert report is not None and len(report.regions) >= 2, report
    for b in (3, 4, 5, 1, 4):
        x = torch.ones(b, 4)
        want = _HalfBatch()(x)
        torch.testing.assert_close(interpreted(x)[0], want)
        torch.testing.assert_close(compiled(x)[0], want)


class _DividesByConstants(torch.nn.Module):
    """Integer divisions by numbers: the exporter stores each divisor as a 0-d tensor."""

    def forward(self, a: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            a // 3,
            torch.div(a, -3, rounding_mode="floor"),
            torch.div(a, -3, rounding_mode="trunc"),
            a * 2 + 1,
        )


def test_integer_division_by_a_constant_rounds_as_eager() -> None:
    """AOTInductor inlines a 0-d constant as a number that its ``div`` lowering takes for
    a float: ``a // 3`` truncated (-7 // 3 gave -2, not -3) and a truncating division
    came back as float32. The compiled code keeps constants as tensors."""
    from export_util import export_program

    a = torch.tensor([7, -7, 7, -7, 0, 13, -13, 9, -1, 1])
    pte = export_program(_DividesByConstants(), (a,))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileWarning)
        compiled = ptexec.load(pte).load_method("forward", compile=CompileOptions(progress=False))
    report = compiled.compile_report
    assert report is not None and report.fully_compiled, report
    for x in (a, -a, a * 5 - 2):
        for got, want in zip(compiled(x), _DividesByConstants()(x), strict=True):
            assert got.dtype == want.dtype and torch.equal(got, want), (x, got, want)


def test_state_carries_over_and_is_shared_between_methods() -> None:
    """The fixture's calls three times over on the same methods: state keeps advancing in
    both, and stays equal."""
    interpreted, compiled = load_pair("two_method_state")
    for _ in range(3):
        replay_both("two_method_state", interpreted, compiled)


def test_a_failure_inside_a_region_names_its_instructions() -> None:
    """An index out of range inside compiled code is an ExecutionError naming the region's
    instruction range; the method works for the next call."""
    interpreted, compiled = load_pair("quant_embedding")
    i, c = interpreted["forward"], compiled["forward"]
    call = fixture_calls("quant_embedding")[0]
    bad = [x.clone() if isinstance(x, torch.Tensor) else x for x in call["inputs"]]
    bad[0] = torch.full_like(bad[0], 10_000)
    with pytest.raises(ExecutionError):
        i.execute(bad)
    with pytest.raises(ExecutionError) as caught:
        c.execute(bad)
    report = c.compile_report
    assert report is not None
    first, last = report.regions[0]
    assert caught.value.instruction == first
    assert f"instructions {first}-{last}" in str(caught.value) or f"instruction {first}" in str(
        caught.value
    )
    good = [x.clone() if isinstance(x, torch.Tensor) else x for x in call["inputs"]]
    assert torch.allclose(i.execute(good)[0], c.execute(good)[0], atol=1e-5)


class _CountsThenDivides(torch.nn.Module):
    """State written in place, and an integer division that fails on a zero divisor."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.count.add_(x)
        return self.count * 1.0, (x * 0 + 7).to(torch.int32) // d


def test_a_failure_inside_a_region_that_writes_state_says_so() -> None:
    """Compiled code may write state before the instruction that fails (its own order):
    the error names what may be partly updated; the interpreter leaves it as it was, and
    both methods work for the next call."""
    from export_util import export_program

    x = torch.ones(4)
    good, zero = torch.tensor([1, 2, 3, 4], dtype=torch.int32), torch.tensor([1, 0, 3, 4])
    pte = export_program(_CountsThenDivides(), (x, good))
    i = ptexec.load(pte).load_method()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileWarning)
        c = ptexec.load(pte).load_method(compile=True)
    zero = zero.to(torch.int32)
    for m in (i, c):
        assert torch.equal(m(x, good)[0], torch.ones(4))
    with pytest.raises(ExecutionError) as interpreted:
        i(x, zero)
    assert "partly updated" not in str(interpreted.value)
    assert torch.equal(i(x, good)[0], torch.full((4,), 2.0))  # untouched by the failure
    with pytest.raises(ExecutionError, match=r"in place, which may be left partly updated"):
        c(x, zero)
    state = c(x, good)[0]  # 2 or 3: the error said it may be either
    assert torch.equal(state, torch.full((4,), 2.0)) or torch.equal(state, torch.full((4,), 3.0))
    assert torch.equal(c(x, good)[0], state + 1.0)


class _HalfChain(torch.nn.Module):
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return (h * 2 + h.sum()).sin() * 3 - h


def test_half_precision_intermediates_are_rounded_as_the_interpreter_rounds_them() -> None:
    """Fused into one kernel, a float16 chain would keep its intermediates in float32; the
    compiled code rounds each one to float16 as the interpreter's (and ExecuTorch's)
    kernels do, so both give the same bits."""
    from export_util import export_program

    g = torch.Generator().manual_seed(5)
    h = (torch.randn(3, 4, generator=g) * 4).half()
    pte = export_program(_HalfChain(), (h,))
    i = ptexec.load(pte).load_method()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileWarning)
        c = ptexec.load(pte).load_method(compile=True)
    for _ in range(10):
        x = (torch.randn(3, 4, generator=g) * 4).half()
        assert torch.equal(c(x)[0], i(x)[0])


def test_instruction_limit_as_the_interpreter() -> None:
    pte = fixture_paths("cond")[0]
    interpreted = ptexec.load(pte).load_method("forward", max_instructions=3)
    compiled = ptexec.load(pte).load_method("forward", max_instructions=3, compile=True)
    x = fixture_calls("cond")[0]["inputs"]
    with pytest.raises(InstructionLimitError) as a:
        interpreted.execute(x)
    with pytest.raises(InstructionLimitError) as b:
        compiled.execute(x)
    assert a.value.instruction == b.value.instruction


def test_calls_from_threads_serialize() -> None:
    interpreted, compiled = load_pair("stateful")
    i, c = interpreted["forward"], compiled["forward"]
    x = fixture_calls("stateful")[0]["inputs"]
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(20):
                c.execute(x)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for _ in range(80):
        i.execute(x)
    slots = state_values(i)
    assert slots
    for j in slots:
        assert torch.allclose(i.state.values[j], c.state.values[j], atol=1e-4), j


def test_tools_still_run_on_a_compiled_method() -> None:
    """Traces and profiles are instrumented interpreted calls through the same envelope."""
    interpreted, compiled = load_pair("mlp")
    x = fixture_calls("mlp")[0]["inputs"]
    trace = compiled["forward"].trace(x)
    assert trace.outputs is not None
    assert torch.allclose(trace.outputs[0], interpreted["forward"].execute(x)[0], atol=1e-5)


def _cond_eager(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The ``cond`` fixture's computation in eager PyTorch."""
    return torch.sin(x) + y if x.sum() > 0 else torch.cos(x) * y - 1


def test_an_if_else_runs_as_one_compiled_region() -> None:
    """torch.cond's program (a JumpFalseCall over the true branch, a jump over the false
    one, each branch moving its result into the output) is one region whose graph holds
    the if/else: calls alternating between the branches give what eager PyTorch, the
    interpreter and ExecuTorch's runtime give, through the fast call and the general
    path; the output the caller gets is its own (a later call does not change it)."""
    interpreted, compiled = load_pair("cond")
    i, c = interpreted["forward"], compiled["forward"]
    report = c.compile_report
    assert report is not None and report.regions == ((0, 10),) and report.fully_compiled
    runtime = pytest.importorskip("executorch.runtime").Runtime.get()
    et = runtime.load_program(fixture_paths("cond")[0]).load_method("forward")
    torch.manual_seed(0)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    kept = []
    for sign in (1, -1, -1, 1, 1, -1, 1):
        a = x.abs() * sign
        want = _cond_eager(a, y)
        got = c.execute([a, y])[0]
        assert torch.allclose(got, want, atol=1e-6), sign
        assert torch.allclose(got, i.execute([a, y])[0], atol=1e-6), sign
        assert torch.allclose(got, et.execute([a, y])[0], atol=1e-6), sign
        general = c.execute([a.clone().requires_grad_(), y])[0]  # not the fast call's
        assert torch.allclose(general, want, atol=1e-6), sign
        kept.append((got, got.clone()))
    for got, copy in kept:
        assert torch.equal(got, copy)
    assert len({id(got) for got, _ in kept}) == len(kept)


def test_an_if_else_with_dynamic_shapes_and_weights_is_one_region(tmp_path: Path) -> None:
    """Traced (the ``graph`` backend): an if/else over inputs of a dynamic batch, and one
    whose branches read the program's weights and give two results, each one region
    with the instructions before and after it. Both branches, every batch, as the
    interpreter."""
    from export_util import export_program

    class Batch(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            def t(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
                return torch.sin(x) + y

            def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
                return torch.cos(x) * y - 1

            return torch.cond(x.sum() > 0, t, f, (x, y)) * 2

    class Weights(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 4))
            self.register_buffer("b", torch.randn(4))

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            def t(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                return x @ self.w, x + self.b

            def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                return x - self.b, (x * 3) @ self.w.t()

            a, b = torch.cond(x.mean() > 0, t, f, (x,))
            return a + 1, b

    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=1, max=8)
    cases = [
        (
            export_program(
                Batch(),
                (torch.randn(3, 4), torch.randn(3, 4)),
                dynamic_shapes={"x": {0: batch}, "y": {0: batch}},
            ),
            (3, 1, 8, 5),
        ),
        (export_program(Weights().eval(), (torch.randn(3, 4),)), (3,)),
    ]
    for k, (data, sizes) in enumerate(cases):
        path = tmp_path / f"p{k}.pte"
        path.write_bytes(data)
        i = ptexec.load(path).load_method("forward")
        c = ptexec.load(path).load_method("forward", compile=CompileOptions(backend="graph"))
        report = c.compile_report
        assert report is not None and report.fully_compiled, report
        jumps = [
            n
            for n, ins in enumerate(c.state.plan.chains[0].instructions)
            if isinstance(ins, p.JumpFalseCall)
        ]
        assert len(report.regions) == 1 and report.regions[0][0] < jumps[0], report.regions
        for n in sizes:
            for sign in (1, -1, -1, 1):
                xs = [torch.randn(n, 4).abs() * sign, torch.randn(n, 4)][: len(i.state.inputs)]
                want, got = i.execute(xs), c.execute(xs)
                assert len(want) == len(got)
                for a, b in zip(want, got, strict=True):
                    assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5), (k, n, sign)


def test_an_if_else_on_a_callers_flag_keeps_its_branches_apart(tmp_path: Path) -> None:
    """An if/else on an input (no instruction before the jump to hold it with) stays as
    today: each branch a region of its own, the jump interpreted; both branches as the
    interpreter."""
    from export_util import export_program

    class Flag(torch.nn.Module):
        def forward(self, flag: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            def t(x: torch.Tensor) -> torch.Tensor:
                return torch.sin(x) * 2 + 1

            def f(x: torch.Tensor) -> torch.Tensor:
                return torch.cos(x) * 3 - 1

            return torch.cond(flag, t, f, (x,))

    path = tmp_path / "flag.pte"
    path.write_bytes(export_program(Flag(), (torch.tensor(True), torch.randn(3, 4))))
    i = ptexec.load(path).load_method("forward")
    c = ptexec.load(path).load_method("forward", compile=CompileOptions(backend="graph"))
    report = c.compile_report
    assert report is not None and len(report.regions) == 2, report
    assert any(reason == "control flow" for _, _, reason in report.fallbacks)
    x = torch.randn(3, 4)
    for flag in (True, False, False, True):
        want = torch.sin(x) * 2 + 1 if flag else torch.cos(x) * 3 - 1
        got = c.execute([torch.tensor(flag), x])[0]
        assert torch.allclose(got, want, atol=1e-6)
        assert torch.allclose(got, i.execute([torch.tensor(flag), x])[0], atol=1e-6)


def test_report_says_what_runs_where() -> None:
    _, compiled = load_pair("map", CompileOptions(backend="graph"))
    report = compiled["forward"].compile_report
    assert report is not None
    assert_report_partitions(report)
    reasons = {reason for _, _, reason in report.fallbacks}
    assert "control flow" in reasons
    assert report.compiled_instructions < report.total_instructions
    text = report.summary()
    assert "interpreted" in text and "compiled" in text


# ---- without compiling ----------------------------------------------------------------


def test_no_cpp_compiler_runs_interpreted_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(tmp_path))  # nothing cached: it must compile
    monkeypatch.setenv("CXX", "ptexec-no-such-compiler")
    pte = fixture_paths("mlp")[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = ptexec.load(pte).load_method("forward", compile=True)
    ours = [w for w in caught if issubclass(w.category, CompileWarning)]
    assert len(ours) == 1 and "C++ compiler" in str(ours[0].message)
    report = m.compile_report
    assert report is not None and report.compiled_instructions == 0 and report.warning
    assert_report_partitions(report)
    x = fixture_calls("mlp")[0]["inputs"]
    want = ptexec.load(pte).load_method("forward").execute(x)
    assert torch.equal(m.execute(x)[0], want[0])
    assert not list(tmp_path.iterdir())  # a missing compiler is not cached


def test_a_failing_compile_runs_interpreted_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import ptexec.compile.aoti as aoti

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the C++ compiler failed")

    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(aoti, "compile_models", broken)
    pte = fixture_paths("mlp")[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = ptexec.load(pte).load_method("forward", compile=True)
    ours = [w for w in caught if issubclass(w.category, CompileWarning)]
    assert len(ours) == 1 and "failed to compile" in str(ours[0].message)
    report = m.compile_report
    assert report is not None and report.compiled_instructions == 0
    assert report.fallbacks and "the C++ compiler failed" in report.fallbacks[0][2]
    assert not list(tmp_path.iterdir())  # not cached: the next load tries again
    x = fixture_calls("mlp")[0]["inputs"]
    want = ptexec.load(pte).load_method("forward").execute(x)
    assert torch.equal(m.execute(x)[0], want[0])


def test_options_are_checked() -> None:
    with pytest.raises(ValueError):
        CompileOptions(backend="jit")
    pte = fixture_paths("mlp")[0]
    with pytest.raises(ValueError):
        ptexec.load(pte).load_method("forward", compile=True, cuda_graph=True)
    assert ptexec.load(pte).load_method("forward").compile_report is None


# ---- the cache ----------------------------------------------------------------------


def test_cache_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("PTEXEC_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform.startswith("linux"):
        assert cache_dir() == tmp_path / "xdg" / "ptexec"


def test_cache_key_depends_on_what_the_code_depends_on() -> None:
    base = cache_key(content_digest([b"program"]), "forward", "cpu", {"a": 1})
    assert base == cache_key(content_digest([b"program"]), "forward", "cpu", {"a": 1})
    assert base != cache_key(content_digest([b"programme"]), "forward", "cpu", {"a": 1})
    assert base != cache_key(content_digest([b"program"]), "decode", "cpu", {"a": 1})
    assert base != cache_key(content_digest([b"program"]), "forward", "cpu", {"a": 2})
    assert base != cache_key(content_digest([b"prog", b"ram"]), "forward", "cpu", {"a": 1})


def test_generated_matrix_kernels_are_preferred_only_where_rows_vary() -> None:
    """The autotuner's choices for a matrix product: where a size varies (a prompt traced
    at its bound, a decode step of one row, attention over a growing cache) only the
    generated kernels; where every size is fixed, all of them, the autotuner's timing at
    the one size deciding; outside a compile, or with no generated kernel, as they are."""
    import sympy
    from torch._inductor.select_algorithm import ExternKernelCaller

    from ptexec.compile import aoti

    class _Layout:
        def __init__(self, *size: object) -> None:
            self.size = list(size)

    def choices(*size: object) -> list[Any]:
        library = object.__new__(ExternKernelCaller)
        generated = types.SimpleNamespace()
        library.layout = generated.layout = _Layout(*size)
        return [library, generated]

    rows = sympy.Symbol("s0", positive=True, integer=True)
    with aoti._templates_preferred(True):
        varying = choices(rows, 64)
        assert aoti._templates_first(varying) == varying[1:]
        batch = choices(2, rows, 64)
        assert aoti._templates_first(batch) == batch[1:]
        columns = choices(8, 4, 1, rows)  # (scores over a cache that grows)
        assert aoti._templates_first(columns) == columns[1:]
        for fixed in (choices(64, 256), choices(sympy.Integer(1), 256), choices(4, 64, 32)):
            assert aoti._templates_first(fixed) == fixed
        library_only = choices(rows, 64)[:1]
        assert aoti._templates_first(library_only) == library_only
    outside = choices(rows, 64)
    assert aoti._templates_first(outside) == outside


# ---- the CUDA path: its rules on the CPU, the real thing where there is a GPU --------------


def test_cuda_regions_are_compiled_without_cpu_autotuning() -> None:
    cpu = inductor_options(torch.device("cpu"), True)
    cuda = inductor_options(torch.device("cuda", 0), True)
    assert cpu["max_autotune"] and cpu["freezing"]
    assert "max_autotune" not in cuda and cuda["freezing"]


def test_kernels_beside_delegate_calls_run_on_the_calling_thread() -> None:
    """A graph that calls delegates (XNNPACK's pool has the threads) is compiled with
    serial kernels, on the CPU only; other graphs keep the method's threads (named in
    the code: see tests/test_threads.py)."""
    cpu = torch.device("cpu")
    assert inductor_options(cpu, True, serial=True)["cpp.threads"] == 1
    n = torch.get_num_threads()  # the method's threads, named in the code
    assert inductor_options(cpu, True)["cpp.threads"] == n
    assert inductor_options(torch.device("cuda", 0), True, serial=True)["cpp.threads"] == n

    from ptexec.compile.external import external_call

    def graph(call: bool) -> torch.fx.GraphModule:
        g = torch.fx.Graph()
        x = g.placeholder("x")
        y = g.call_function(external_call, ("key", [x])) if call else x
        g.output(y)
        return torch.fx.GraphModule(torch.nn.Module(), g)

    assert runs_delegates(graph(True))
    assert not runs_delegates(graph(False))
    # a call inside a branch of a condition (a graph the outer one holds)
    outer = graph(False)
    outer.add_submodule("true_graph_0", graph(True))
    assert runs_delegates(outer)


def test_regions_follow_the_device_of_their_tensors() -> None:
    """A CUDA program mapped to the CPU compiles for the CPU; its device copies stay
    interpreted (they cross devices where the program runs on a GPU)."""
    pte = fixture_paths("h2d_copy")[0]
    m = ptexec.load(pte).load_method(
        "forward", device_map="cpu", compile=CompileOptions(backend="graph")
    )
    report = m.compile_report
    assert report is not None and report.device == "cpu"
    assert any("devices" in reason for _, _, reason in report.fallbacks)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["gpu_mlp", "gpu_stateful", "gpu_dynamic_mlp"])
def test_cuda_program_compiled_for_its_gpu(name: str) -> None:
    interpreted, compiled = load_pair(name)
    for m in compiled.values():
        assert m.compile_report is not None and m.compile_report.device.startswith("cuda")
    replay_both(name, interpreted, compiled)


# ---- the command line ---------------------------------------------------------------------


def test_cli_compile_inspect_and_run(capsys: pytest.CaptureFixture[str]) -> None:
    from ptexec.cli import main

    pte = str(fixture_paths("mlp")[0])
    assert main(["compile", pte]) == 0
    out = capsys.readouterr().out
    assert "method 'forward'" in out and "compiled 5 of 5 instructions" in out
    assert main(["inspect", pte, "--compile"]) == 0
    out = capsys.readouterr().out
    assert "memory plan" in out and "(from the cache)" in out
    assert main(["run", pte, "--compile", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "compiled 5 of 5 instructions" in out and "latency" in out


def test_cli_compile_without_a_compiler_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ptexec.cli import main

    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "ptexec-no-such-compiler")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CompileWarning)
        assert main(["compile", str(fixture_paths("mlp")[0])]) == 1
    assert "C++ compiler" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["mlp", "stateful", "int_ops"])
def test_static_outputs_are_in_planned_memory_after_a_compiled_call(name: str) -> None:
    """A compiled call leaves each static output's planned memory as the interpreter
    leaves it (what training's gradients and ``Method.values`` read there), whichever
    path the call takes: the fast call, or the general one (``outputs="copy"``)."""
    path = fixture_paths(name)[0]
    plain = ptexec.load(path).load_method("forward")
    compiled = ptexec.load(path).load_method("forward", compile=CompileOptions(backend="graph"))
    for options in ({}, {"outputs": "copy"}):
        for call in fixture_calls(name):
            want = plain.execute(call["inputs"], **options)
            got = compiled.execute(call["inputs"], **options)
            for k, out in enumerate(compiled.state.outputs):
                value = compiled.program.pte.program.execution_plan[0].values[out.slot]
                if not isinstance(value, p.Tensor) or value.shape_dynamism != p.STATIC:
                    continue
                planned = compiled.state.values[out.slot]
                reference = plain.state.values[plain.state.outputs[k].slot]
                torch.testing.assert_close(planned, reference, rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6)


class _CountsCalls(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls.add_(1.0)
        return x * 2 + self.calls, self.calls * 1.0


def test_an_out_tensor_smaller_than_a_dynamic_output_is_filled_as_the_interpreter_fills_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An ``out=`` tensor too small for an unplanned output of bounded dynamic shape is
    copied into after the call (compiled code writes such an output in place without
    growing it): the compiled call gives the interpreter's answer and counts once (it
    failed, after the state had counted)."""
    pytest.importorskip("executorch")
    from executorch.exir import ExecutorchBackendConfig, to_edge
    from executorch.exir.passes import MemoryPlanningPass

    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(session_cache_dir()))
    n = torch.export.Dim("n", min=1, max=8)
    ep = torch.export.export(_CountsCalls(), (torch.randn(3, 4),), dynamic_shapes=({0: n},))
    unplanned = MemoryPlanningPass(alloc_graph_input=False, alloc_graph_output=False)
    pte = to_edge(ep).to_executorch(ExecutorchBackendConfig(memory_planning_pass=unplanned))
    x = torch.randn(8, 4)
    for options in ({}, {"compile": CompileOptions(progress=False)}):
        m = ptexec.load(pte.buffer).load_method("forward", **options)
        out = torch.empty(2, 4)
        y, calls = m.execute([x], out=[out, None])
        assert y is out and calls.item() == 1.0
        torch.testing.assert_close(out, x * 2 + 1)
        assert m.last_call.outputs[0] == "copy"
        y, calls = m.execute([x], out=[torch.empty(8, 4), None])  # holds the bound's rows
        torch.testing.assert_close(y, x * 2 + 2)
        assert calls.item() == 2.0 and m.last_call.outputs[0] == "direct"


class _MaxAfterTwo(torch.nn.Module):
    """A maximum over the columns after the first two: a slice's length, which the graph
    writes with ``Max`` and ``Min``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, 2:].amax(-1)


def _check_max_after_two(tmp_path: Path, options: CompileOptions | bool) -> None:
    """Widths 2 and 1 make the slice empty, where eager raises: so must the compiled
    method, through the interpreted statements (the interpreter's error, instruction 1)."""
    from export_util import export_program

    width = torch.export.Dim("width", min=4, max=16)
    path = tmp_path / "max_after_two.pte"
    path.write_bytes(
        export_program(_MaxAfterTwo(), (torch.ones(3, 5),), dynamic_shapes=({1: width},))
    )
    interpreted = ptexec.load(path).load_method("forward")
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileWarning)
        compiled = ptexec.load(path).load_method("forward", compile=options)
    report = compiled.compile_report
    assert report is not None and report.fully_compiled, report
    for w in (5, 2, 1, 5):
        x = torch.arange(3 * w, dtype=torch.float32).reshape(3, w)
        if w > 2:
            want = _MaxAfterTwo()(x)
            torch.testing.assert_close(interpreted(x)[0], want)
            torch.testing.assert_close(compiled(x)[0], want)
            continue
        with pytest.raises(IndexError, match="non-zero size"):
            _MaxAfterTwo()(x)
        for method in (interpreted, compiled):
            with pytest.raises(ExecutionError, match=r"instruction 1 \(aten::amax\.out\)"):
                method(x)


def test_a_slice_that_may_be_empty_runs_interpreted(tmp_path: Path) -> None:
    """A size the graph writes with ``Max``/``Min`` (``x[:, 2:]`` of a dynamic width) that
    may be 0 is guarded like any other computed size."""
    _check_max_after_two(tmp_path, CompileOptions(backend="graph"))


@pytest.mark.slow
def test_an_empty_slice_never_reaches_aoti_code(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """AOTInductor's maximum over no columns is -inf for every row where ATen raises:
    without the guard, widths 2 and 1 returned ``[-inf, -inf, -inf]``."""
    skip_slow_unless_asked(request)
    _check_max_after_two(tmp_path, True)


class _MaxOfAShare(torch.nn.Module):
    """A maximum over the first ``len(x) // len(a)`` rows: a size the graph writes as a
    division by another input's size, which no guard holds."""

    def forward(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        return x[: x.shape[0] // a.shape[0]].amax(0) + a.sum()


def _check_max_of_a_share(tmp_path: Path, options: CompileOptions | bool) -> None:
    """2 rows shared by 3 (or 3 by 5) is an empty slice, where eager raises: so must the
    compiled method (the interpreter's error, instruction 4)."""
    from export_util import export_program

    auto = torch.export.Dim.AUTO
    path = tmp_path / "max_of_a_share.pte"
    path.write_bytes(
        export_program(
            _MaxOfAShare(),
            (torch.ones(8, 2), torch.ones(3)),
            dynamic_shapes=({0: auto(min=1, max=20)}, {0: auto(min=1, max=8)}),
        )
    )
    interpreted = ptexec.load(path).load_method("forward")
    compiled = ptexec.load(path).load_method("forward", compile=options)
    torch.manual_seed(0)
    for rows, share in ((8, 3), (2, 3), (4, 4), (3, 5), (9, 2)):
        x, a = torch.randn(rows, 2), torch.randn(share)
        if rows >= share:
            want = _MaxOfAShare()(x, a)
            torch.testing.assert_close(interpreted(x, a)[0], want)
            torch.testing.assert_close(compiled(x, a)[0], want)
            continue
        with pytest.raises(IndexError, match="non-zero size"):
            _MaxOfAShare()(x, a)
        for method in (interpreted, compiled):
            with pytest.raises(ExecutionError, match=r"instruction 4 \(aten::amax\.out\)"):
                method(x, a)
    report = compiled.compile_report
    assert report is not None and report.compiled_instructions == 0, report
    assert "has no guard" in report.fallbacks[0][2], report


def test_an_empty_share_runs_interpreted(tmp_path: Path) -> None:
    """A size of the graph that may be 0 and that no guard can hold (a division by
    another input's size) keeps its region from being compiled."""
    _check_max_of_a_share(tmp_path, CompileOptions(backend="graph", progress=False))


@pytest.mark.slow
def test_an_empty_share_never_reaches_aoti_code(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """AOTInductor's maximum over no rows is -inf where ATen raises: without keeping the
    region from compiled code, 2 rows shared by 3 returned ``[-inf, -inf]``."""
    skip_slow_unless_asked(request)
    _check_max_of_a_share(tmp_path, CompileOptions(progress=False))


class _SqueezeRows(torch.nn.Module):
    """Squeezes the rows: a no-op for the 2 to 8 rows the program was exported for."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 2).squeeze(0) + 1


def _check_squeeze_of_one_row(tmp_path: Path, options: CompileOptions | bool) -> None:
    """A ``.pte`` keeps only the upper bound, so 1 row reaches the squeeze, which drops
    it where the program says the result has two dimensions: ExecuTorch's runtime and the
    interpreter fail the call, and so must the compiled method (the next region, made for
    two dimensions, then refuses the one left)."""
    from executorch.runtime import Runtime

    from export_util import export_program

    rows = torch.export.Dim("rows", min=2, max=8)
    path = tmp_path / "squeeze_rows.pte"
    path.write_bytes(
        export_program(_SqueezeRows(), (torch.ones(3, 4),), dynamic_shapes=({0: rows},))
    )
    interpreted = ptexec.load(path).load_method("forward")
    compiled = ptexec.load(path).load_method("forward", compile=options)
    reference = Runtime.get().load_program(path).load_method("forward")
    torch.manual_seed(0)
    for n in (3, 1, 2, 1, 8):
        x = torch.randn(n, 4)
        if n > 1:
            want = _SqueezeRows()(x)
            torch.testing.assert_close(reference.execute([x])[0], want)
            torch.testing.assert_close(interpreted(x)[0], want)
            torch.testing.assert_close(compiled(x)[0], want)
            continue
        assert _SqueezeRows()(x).shape == (4,)
        with pytest.raises(RuntimeError):
            reference.execute([x])
        for method in (interpreted, compiled):
            with pytest.raises(ExecutionError):
                method(x)
    report = compiled.compile_report
    assert report is not None and any("squeezes" in f[2] for f in report.fallbacks), report


def test_a_squeeze_of_a_dynamic_size_runs_interpreted(tmp_path: Path) -> None:
    """The squeeze of a dimension that may be 1 is left to the interpreter."""
    _check_squeeze_of_one_row(tmp_path, CompileOptions(backend="graph", progress=False))


@pytest.mark.slow
def test_a_squeeze_of_one_row_never_reaches_aoti_code(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """AOTInductor's code, traced for any number of rows, kept the row: 1 row returned a
    ``[1, 4]`` tensor where ExecuTorch's runtime and the interpreter fail the call."""
    skip_slow_unless_asked(request)
    _check_squeeze_of_one_row(tmp_path, CompileOptions(progress=False))


class _RowsOfAnother(torch.nn.Module):
    """``x`` doubled, as many rows as ``a`` has: the other size is a division by it."""

    def forward(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        return (x * 2).reshape(a.shape[0], -1)


def _check_rows_of_another(tmp_path: Path, options: CompileOptions | bool) -> None:
    """24 elements in 5 rows is no shape: eager, ExecuTorch's runtime and the interpreter
    fail the call, and so must the compiled method (the interpreter's error)."""
    from executorch.runtime import Runtime

    from export_util import export_program

    auto = torch.export.Dim.AUTO
    path = tmp_path / "rows_of_another.pte"
    path.write_bytes(
        export_program(
            _RowsOfAnother(),
            (torch.ones(6, 4), torch.ones(3)),
            dynamic_shapes=({0: auto(min=1, max=12)}, {0: auto(min=1, max=8)}),
            unplanned=True,
        )
    )
    interpreted = ptexec.load(path).load_method("forward")
    compiled = ptexec.load(path).load_method("forward", compile=options)
    reference = Runtime.get().load_program(path).load_method("forward")
    torch.manual_seed(0)
    for rows, share in ((6, 3), (6, 5), (5, 2), (3, 8), (6, 3)):
        x, a = torch.randn(rows, 4), torch.randn(share)
        if rows * 4 % share == 0:
            want = _RowsOfAnother()(x, a)
            torch.testing.assert_close(reference.execute([x, a])[0], want)
            torch.testing.assert_close(interpreted(x, a)[0], want)
            torch.testing.assert_close(compiled(x, a)[0], want)
            continue
        with pytest.raises(RuntimeError, match="is invalid for input"):
            _RowsOfAnother()(x, a)
        with pytest.raises(RuntimeError):
            reference.execute([x, a])
        for method in (interpreted, compiled):
            with pytest.raises(ExecutionError, match=r"instruction 3 \(aten::view_copy\.out\)"):
                method(x, a)
    report = compiled.compile_report
    assert report is not None and report.compiled_instructions == 0, report


def test_a_reshape_by_another_inputs_size_runs_interpreted(tmp_path: Path) -> None:
    """The size the reshape leaves, the elements divided by another input's size, may be
    0 and no guard holds it: the region is not compiled."""
    _check_rows_of_another(tmp_path, CompileOptions(backend="graph", progress=False))


@pytest.mark.slow
def test_a_reshape_by_another_inputs_size_never_reaches_aoti_code(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """AOTInductor's code took the other size as a floor division and did not check the
    product: 24 elements in 5 rows returned a ``[5, 4]`` tensor, 12 in 8 rows an
    ``[8, 1]`` one, where eager, ExecuTorch's runtime and the interpreter fail the call."""
    skip_slow_unless_asked(request)
    _check_rows_of_another(tmp_path, CompileOptions(progress=False))
