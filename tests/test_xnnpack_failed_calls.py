"""A delegate call that ExecuTorch's XNNPACK backend fails leaves no state behind that
fails a later good call, of the same method or of another program.

XNNPACK's runtimes share one workspace in ExecuTorch's backend. When a runtime's memory
plan grows it, XNNPACK sets up again every other runtime that was set up before; one whose
last reshape failed (a batch matrix product of an empty dimension: XNNPACK refuses it)
fails that setup, and the growing call fails with it (``xnn_status_invalid_state``),
though nothing is wrong with its own inputs. Compiled code's calls that ExecuTorch's C++
runtime runs directly (:mod:`ptexec.compile.native`) hold runtimes of their own, in the
same workspace.

An empty batch that XNNPACK does take gives an empty output, not an error.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from export_util import xnnpack_program

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "xnnpack"


class _Bmm(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b)


@pytest.fixture(scope="module")
def bmm_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A batch matrix product lowered to XNNPACK, ``[1, 8, 1] @ [1, 1, n]`` for n in
    1-16 (n = 0 also passes the program's bounds, which keep only the upper one)."""
    from ptexec.delegates.xnnpack.executorch_runner import executorch_unavailable

    if executorch_unavailable():
        pytest.skip("ExecuTorch's XNNPACK backend is not installed")
    n = torch.export.Dim("n", min=1, max=16)
    data = xnnpack_program(_Bmm(), (torch.randn(1, 8, 1), torch.randn(1, 1, 5)), ({}, {2: n}))
    path = tmp_path_factory.mktemp("xnnpack_failed") / "bmm.pte"
    path.write_bytes(data)
    return path


# In a process of its own: the workspace starts empty, so the two-linear program's first
# call grows it (in this process, earlier tests' runtimes may have grown it already).
_CHILD = """
import sys, torch, ptexec
from ptexec.errors import ExecutionError
bmm = ptexec.load(sys.argv[1]).load_method("forward", xnnpack="executorch")
mlp = ptexec.load(sys.argv[2]).load_method("forward", xnnpack="executorch")
call = torch.load(sys.argv[3])["calls"][0]
a, b = torch.randn(1, 8, 1), torch.randn(1, 1, 3)
assert torch.equal(bmm(a, b)[0], torch.bmm(a, b))
try:
    bmm(a, torch.randn(1, 1, 0))
except ExecutionError:
    pass
got = mlp(*call["inputs"])[0]
assert torch.allclose(got, call["eager"][0], atol=1e-5), (got, call["eager"][0])
assert torch.equal(bmm(a, b)[0], torch.bmm(a, b))
print("ok")
"""


def _run_alone(script: str, program: Path) -> None:
    """Run ``script`` in a new process on ``program`` and the two-linear fixture (its
    program and stored calls); it must print ``ok``."""
    env = {**os.environ}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            str(program),
            str(FIXTURES / "dynamic_mlp.pte"),
            str(FIXTURES / "dynamic_mlp.io.pt"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0 and child.stdout.split() == ["ok"], child.stderr[-3000:]


def test_a_failed_call_fails_no_later_good_call(bmm_program: Path) -> None:
    _run_alone(_CHILD, bmm_program)


def test_an_empty_batch_gives_an_empty_output() -> None:
    """XNNPACK's linears take an empty batch (ExecuTorch's runtime returns a ``[0, 4]``
    output, as eager PyTorch does); the empty output has no address to compare."""
    import ptexec
    from ptexec.delegates.xnnpack.executorch_runner import executorch_unavailable

    if executorch_unavailable():
        pytest.skip("ExecuTorch's XNNPACK backend is not installed")
    m = ptexec.load(FIXTURES / "dynamic_mlp.pte").load_method("forward", xnnpack="executorch")
    calls = torch.load(FIXTURES / "dynamic_mlp.io.pt")["calls"]
    for call in calls:  # batches of 3, 1, 16 and 3 rows, each after an empty one
        (empty,) = m(torch.randn(0, 8))
        assert empty.shape == (0, 4) and empty.dtype == torch.float32
        (got,) = m(*call["inputs"])
        assert torch.allclose(got, call["eager"][0], atol=1e-5)


class _SlicedBmm(torch.nn.Module):
    """A portable slice (traced into compiled code) feeding XNNPACK's batch matrix
    product: a ``b`` of 2 columns or fewer gives the product an empty dimension."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b[:, :, 2:]).cumsum(-1).cumsum(-1)


# the sliced product compiled (the graph backend: traced, nothing for a C++ compiler), its
# delegate an opaque call that ExecuTorch's C++ runtime runs directly
_COMPILED_CHILD = """
import sys, torch, ptexec
from ptexec.compile import CompileOptions, external, graph, native
from ptexec.errors import ExecutionError
external.MIN_WEIGHT_BYTES = 0  # every delegate an opaque call
# the compiled code gives a call whose slice is empty to the interpreter (a "positive"
# guard on the slice's width); without those guards it reaches the native call, where
# ExecuTorch's XNNPACK fails, as any failure there would
graph._positive_sizes = lambda *args: []
sliced = ptexec.load(sys.argv[1]).load_method(
    "forward", xnnpack="auto", compile=CompileOptions(backend="graph")
)
assert sliced.compile_report.native_calls == 1, sliced.compile_report.summary()
mlp = ptexec.load(sys.argv[2]).load_method("forward", xnnpack="executorch")
call = torch.load(sys.argv[3])["calls"][0]
def eager(a, b):
    return torch.bmm(a, b[:, :, 2:]).cumsum(-1).cumsum(-1)
a = torch.randn(1, 8, 1)
b = torch.randn(1, 1, 5)
assert torch.equal(sliced(a, b)[0], eager(a, b))
start = native.runs()
empty = torch.randn(1, 1, 2)
try:
    got = sliced(a, empty)[0]
    assert got.shape == eager(a, empty).shape, got.shape
except ExecutionError:
    pass
assert native.runs() == start + 1  # the call reached ExecuTorch's C++ runtime
got = mlp(*call["inputs"])[0]
assert torch.allclose(got, call["eager"][0], atol=1e-5), (got, call["eager"][0])
for n in (5, 16, 3):
    b = torch.randn(1, 1, n)
    assert torch.equal(sliced(a, b)[0], eager(a, b)), n
print("ok")
"""


def test_a_failed_native_call_fails_no_later_good_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiled call ExecuTorch's C++ runtime fails (an empty product, let through by
    dropping the guards that send it to the interpreter) drops its delegate's runtime: a
    later good call of another program, and of the same method, computes what eager
    PyTorch does."""
    from compile_util import session_cache_dir
    from ptexec.compile import native
    from ptexec.delegates.xnnpack.executorch_runner import executorch_unavailable

    # the library of native calls, built once per test session (the child finds it there)
    monkeypatch.setenv("PTEXEC_CACHE_DIR", str(session_cache_dir()))
    if executorch_unavailable() is not None or native.unavailable() is not None:
        pytest.skip("needs ExecuTorch's XNNPACK backend, its headers and a C++ compiler")
    n = torch.export.Dim("n", min=4, max=16)
    data = xnnpack_program(_SlicedBmm(), (torch.randn(1, 8, 1), torch.randn(1, 1, 5)), ({}, {2: n}))
    path = tmp_path / "sliced_bmm.pte"
    path.write_bytes(data)
    _run_alone(_COMPILED_CHILD, path)
