"""AOTInductor's code calls the native library's C entry for its opaque delegate calls.

Where :mod:`ptexec.compile.native`'s library is loaded, a method compiled by AOTInductor
calls ``ptexec::external_call`` through the library's C entry (``aoti_torch_cpu_external_
call``) instead of the proxy executor and torch's dispatcher. Checked on a program of two
XNNPACK linears with a dynamic batch around portable cumulative sums: the calls come in
through the entry and give eager PyTorch's results at every batch size (a call of two
outputs too); without the library's table the entry hands the calls to the Python path;
a call that fails raises, and the method goes on; and code made with the entry is kept
under its own cache key, so a process without the library compiles its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ptexec
from compile_util import dynamic_batch_program
from ptexec.compile import CompileOptions, external, native, runner
from ptexec.compile.aoti import missing_compiler
from ptexec.delegates.xnnpack.executorch_runner import executorch_unavailable
from ptexec.errors import ExecutionError

pytestmark = pytest.mark.skipif(
    executorch_unavailable() is not None
    or native.unavailable() is not None
    or missing_compiler() is not None,
    reason="needs ExecuTorch's XNNPACK backend, its headers and a C++ compiler",
)

BATCHES = [3, 1, 1, 16, 3, 7]


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    return dynamic_batch_program(tmp_path_factory.mktemp("entry"))


@pytest.fixture
def cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """One cache for the module's compiles (the first test compiles, later ones hit);
    both linears opaque calls, small as they are."""
    path = tmp_path_factory.getbasetemp() / "entry-cache"
    path.mkdir(exist_ok=True)
    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(path))
    monkeypatch.setattr(external, "MIN_WEIGHT_BYTES", 0)
    return path


def _load(path: Path) -> ptexec.Method:
    return ptexec.load(path).load_method("forward", xnnpack="auto", compile=CompileOptions())


def _check(model: torch.nn.Module, method: ptexec.Method) -> None:
    """Calls of every batch size, through the same memory: eager PyTorch's results."""
    memory = torch.empty(16, 8)
    for r, n in enumerate(BATCHES):
        x = memory[:n]
        x.normal_()
        (got,) = method.execute([x])
        assert got.shape == (n, 4), f"call {r} (batch {n})"
        torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("cache")
def test_compiled_code_calls_the_entry(program: tuple[torch.nn.Module, Path]) -> None:
    model, path = program
    method = _load(path)
    report = method.compile_report
    assert report is not None and report.fully_compiled and len(report.xnnpack_calls) == 2
    assert report.native_calls == 2
    entered, ran = native.entry_runs(), native.runs()
    _check(model, method)
    assert native.entry_runs() - entered == 2 * len(BATCHES)  # every call came in there
    assert native.runs() - ran == 2 * len(BATCHES)  # and the library ran it


@pytest.mark.usefixtures("cache")
def test_without_the_table_the_entry_takes_the_python_path(
    program: tuple[torch.nn.Module, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, path = program
    monkeypatch.setattr(runner, "native_table", lambda calls: None)
    method = _load(path)
    report = method.compile_report
    assert report is not None and report.fully_compiled and report.native_calls == 0
    entered, ran = native.entry_runs(), native.runs()
    _check(model, method)
    assert native.entry_runs() - entered == 2 * len(BATCHES)
    assert native.runs() == ran  # Python ran them


@pytest.mark.usefixtures("cache")
def test_a_failed_call_raises_and_the_method_goes_on(
    program: tuple[torch.nn.Module, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, path = program
    monkeypatch.setattr(runner, "native_table", lambda calls: None)  # the Python path
    method = _load(path)
    x = torch.randn(5, 8)
    method.execute([x])
    run = external.ExternalCall.run

    def failing(self: external.ExternalCall, inputs: list[torch.Tensor]) -> object:
        raise RuntimeError("the delegate's library failed")

    monkeypatch.setattr(external.ExternalCall, "run", failing)
    entered = native.entry_runs()
    with pytest.raises(ExecutionError, match="the delegate's library failed"):
        method.execute([x])
    assert native.entry_runs() > entered  # it failed in there
    monkeypatch.setattr(external.ExternalCall, "run", run)
    _check(model, method)


def test_code_made_with_the_entry_has_its_own_key(
    program: tuple[torch.nn.Module, Path], cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process without the library (``PTEXEC_NATIVE_CALLS=0``) does not load code that
    calls the entry: it compiles its own, through the proxy executor, into the same
    cache."""
    model, path = program
    _load(path)  # with the entry, in the cache
    monkeypatch.setenv("PTEXEC_NATIVE_CALLS", "0")
    method = _load(path)
    report = method.compile_report
    assert report is not None and report.fully_compiled and not report.cache_hit
    assert report.native_calls == 0
    entered, ran = native.entry_runs(), native.runs()
    _check(model, method)
    assert native.entry_runs() == entered and native.runs() == ran
    again = _load(path)  # its own entry, now hit
    assert again.compile_report is not None and again.compile_report.cache_hit


@pytest.mark.usefixtures("cache")
def test_two_methods_of_one_program_on_one_thread(program: tuple[torch.nn.Module, Path]) -> None:
    """Two loads of one program run the same compiled code, whose call sites pass the same
    keys (at the same addresses), each with its own table of calls: alternating on one
    thread, each runs its own calls (what the entry found for one is not taken for the
    other), and one freed leaves the other working."""
    import gc

    model, path = program
    first, second = _load(path), _load(path)
    for method in (first, second):
        report = method.compile_report
        assert report is not None and report.native_calls == 2
    ran = native.runs()
    for n in BATCHES:
        for method in (first, second):
            x = torch.randn(n, 8)
            (got,) = method.execute([x])
            torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)
    assert native.runs() - ran == 2 * 2 * len(BATCHES)
    del first
    gc.collect()  # its table and calls freed: the second still finds its own
    _check(model, second)


class _TwoOutputs(torch.nn.Module):
    """Two linears of one input: one XNNPACK delegate with two outputs, dynamic batch."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cumsum(self.a(x), 0), torch.cumsum(self.b(x), 0)


@pytest.mark.usefixtures("cache")
def test_a_call_of_two_outputs(tmp_path: Path) -> None:
    """Each output's handle comes back through its own pointer, at its own shape."""
    torch.manual_seed(0)
    model, path = dynamic_batch_program(tmp_path, _TwoOutputs(), "two_outputs")
    method = _load(path)
    report = method.compile_report
    assert report is not None and report.fully_compiled and len(report.xnnpack_calls) == 1
    assert report.native_calls == 1
    entered = native.entry_runs()
    for n in BATCHES:
        x = torch.randn(n, 8)
        got = method.execute([x])
        want = model(x)
        assert [tuple(g.shape) for g in got] == [(n, 16), (n, 4)]
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert native.entry_runs() - entered == len(BATCHES)


@pytest.mark.parametrize(
    ("version", "supported"),
    [("2.13.0+cpu", True), ("2.13.1", True), ("2.14.0", False), ("2.12.0", False), ("x", False)],
)
def test_the_entry_only_with_a_torch_whose_calls_were_checked(
    version: str, supported: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another torch release may pass a C shim's arguments otherwise: its code goes
    through the proxy executor."""
    from ptexec.compile import aoti

    monkeypatch.setattr(torch, "__version__", version)
    assert aoti.native_entry_supported() is supported
