"""Shared by the compiled-tier tests: one cache per test session, replaying fixtures
compiled and interpreted side by side.

The cache directory is a temporary one made once per test process (and removed at its
end): a test never reads an entry a previous run or the user left, and each program
compiles once per session however many tests load it. Tests that need a second process
pass the same directory on (``PTEXEC_CACHE_DIR``).
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import ptexec
from fixture_data import (
    compare_outputs,
    fixture_calls,
    fixture_paths,
    load_options,
    tolerance,
)
from ptexec.compile import CompileOptions, CompileWarning
from ptexec.compile.functional import FunctionalForms
from ptexec.effects import file_effects
from ptexec.format import program as p

XNNPACK_DIR = Path(__file__).resolve().parent / "fixtures" / "xnnpack"
XNNPACK: dict[str, Any] = json.loads((XNNPACK_DIR / "manifest.json").read_text())


@cache
def session_cache_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="ptexec-test-cache-"))
    atexit.register(shutil.rmtree, path, True)
    return path


def skip_slow_unless_asked(request: pytest.FixtureRequest) -> None:
    """Tests marked ``slow`` here compile many programs: run them with ``-m slow``."""
    if request.node.get_closest_marker("slow") and "slow" not in (
        request.config.getoption("markexpr") or ""
    ):
        pytest.skip("compiles many programs; run with -m slow")


def _clone(xs: list[Any]) -> list[Any]:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]


def load_pair(
    name: str, options: CompileOptions | None = None, **load: Any
) -> tuple[dict[str, ptexec.Method], dict[str, ptexec.Method]]:
    """(interpreted, compiled) methods of fixture ``name``, each set on its own program."""
    pte, ptd = fixture_paths(name)
    opts = {**load_options(name), **load}
    plain = ptexec.load(pte, data_path=ptd)
    interpreted = {m: plain.load_method(m, **opts) for m in plain.method_names}
    prog = ptexec.load(pte, data_path=ptd)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileWarning)  # nothing here may fail to compile
        compiled = {
            m: prog.load_method(m, compile=options or True, **opts) for m in prog.method_names
        }
    return interpreted, compiled


def replay_both(
    name: str, interpreted: dict[str, ptexec.Method], compiled: dict[str, ptexec.Method]
) -> None:
    """Every stored call on both: compiled outputs match the interpreter's (floats within
    the fixture's tolerance, everything else exactly), and so do the records and state."""
    rtol, atol = tolerance(name)
    for k, call in enumerate(fixture_calls(name)):
        m = call["method"]
        want = interpreted[m].execute(_clone(call["inputs"]))
        got = compiled[m].execute(_clone(call["inputs"]))
        problem = compare_outputs(got, want, rtol, atol)
        assert problem is None, f"{name} call {k}: {problem}"
        a, b = interpreted[m].last_call, compiled[m].last_call
        expected = (list(a.inputs), list(a.outputs), a.bytes_copied)
        report = compiled[m].compile_report
        assert report is not None
        for i in report.read_in_place:  # compiled code read the caller's tensor: no copy
            if a.inputs[i] == "copy" and b.inputs[i] == "share":
                expected[0][i] = "share"
                expected[2]["h2h"] -= call["inputs"][i].nbytes
        assert expected == (
            list(b.inputs),
            list(b.outputs),
            b.bytes_copied,
        ), f"{name} call {k}: records differ"
    for m in interpreted:
        a, b = interpreted[m].state.values, compiled[m].state.values
        for j in state_values(interpreted[m]):
            same = torch.equal(a[j], b[j]) or (
                a[j].is_floating_point() and torch.allclose(a[j], b[j], rtol, atol)
            )
            assert same, f"{name}: state value {j} of '{m}' differs after the calls"


def state_values(method: ptexec.Method) -> list[int]:
    """Planned tensors a call reads before it writes them (what carries over between
    calls); the rest of the planned memory is scratch, which compiled code does not write."""
    plan = method.state.plan
    inputs = set(plan.inputs)
    found: dict[int, None] = {}
    ever: set[int] = set()  # written by some instruction (a second name for bytes is not)
    for chain in plan.chains:
        seen: set[int] = set()
        for ins in chain.instructions:
            reads, writes = file_effects(plan, ins, seen)
            ever.update(writes)
            seen.update(reads)
            seen.update(writes)
    for chain in plan.chains:
        seen: set[int] = set()
        written: set[int] = set()
        for ins in chain.instructions:
            reads, writes = file_effects(plan, ins, seen)
            for r in reads:
                v = plan.values[r]
                if (
                    r not in written
                    and r in ever
                    and r not in inputs
                    and isinstance(v, p.Tensor)
                    and v.allocation_info is not None
                ):
                    found[r] = None
            written.update(writes)
            seen.update(reads)
            seen.update(writes)
    return list(found)


def xnnpack_pair(
    name: str, options: CompileOptions | None = None, xnnpack: str = "torch"
) -> tuple[ptexec.Method, ptexec.Method]:
    """An XNNPACK fixture interpreted (``xnnpack="auto"``) and compiled with ``xnnpack``:
    by default ptexec's torch runner, whose code is traced into the compiled graph
    (``"auto"`` keeps ExecuTorch's XNNPACK kernels as opaque calls)."""
    path = XNNPACK_DIR / XNNPACK[name]["pte"]
    plain = ptexec.load(path).load_method("forward")
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileWarning)
        compiled = ptexec.load(path).load_method(
            "forward", compile=options or True, xnnpack=xnnpack
        )
    return plain, compiled


def replay_xnnpack(name: str, plain: ptexec.Method, compiled: ptexec.Method) -> None:
    """An XNNPACK fixture's calls: compiled matches the torch runner within the fixture's
    tolerance plus two quantization steps (fused float math may round a value across one)."""
    entry = XNNPACK[name]
    rtol, atol = entry["tol_eager"]
    atol = max(atol, 1e-5) + 2 * entry.get("quant_step", 0.0)
    calls = torch.load(XNNPACK_DIR / f"{name}.io.pt", weights_only=True)["calls"]
    for k, call in enumerate(calls):
        want = plain.execute(_clone(call["inputs"]))
        got = compiled.execute(_clone(call["inputs"]))
        problem = compare_outputs(got, want, rtol, atol)
        assert problem is None, f"{name} call {k}: {problem}"


def assert_report_partitions(report: Any) -> None:
    """Compiled ranges and fallbacks together cover every instruction exactly once."""
    covered: list[int] = []
    for first, last in report.regions:
        covered.extend(range(first, last + 1))
    for first, last, reason in report.fallbacks:
        assert reason
        covered.extend(range(first, last + 1))
    assert report.compiled_instructions == sum(b - a + 1 for a, b in report.regions)
    if all(c == 0 for c in report.chains):  # one chain: indices are unique
        assert sorted(covered) == list(range(report.total_instructions))


def one_kernel_forms(values: Sequence[p.EValue], args: Sequence[int], name: str) -> FunctionalForms:
    """The compiled tier's functional forms of a method that is one kernel call ``name`` on
    value indices ``args`` (what :class:`FunctionalForms` reads of a loaded method: the
    instruction, its operator name, the values, and that no outside library runs it)."""
    chain = SimpleNamespace(
        instructions=[p.KernelCall(0, tuple(args))],
        names=[name],
        loaded=[SimpleNamespace(external=None)],
    )
    state: Any = SimpleNamespace(plan=SimpleNamespace(values=tuple(values)), chains=[chain])
    return FunctionalForms(state, None, torch.device("cpu"))  # type: ignore[arg-type]


class _DynamicBatch(torch.nn.Module):
    """Two linears (XNNPACK delegates) with portable cumulative sums between, whose batch
    is dynamic: compiled code with opaque calls of dynamic shape."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.cumsum(torch.cumsum(self.a(x), -1), 0))


def dynamic_batch_program(
    directory: Path, model: torch.nn.Module | None = None, name: str = "dynamic_batch"
) -> tuple[torch.nn.Module, Path]:
    """An eager model of inputs of 8 features (by default two XNNPACK linears around
    portable cumulative sums, made after seeding 0) and its XNNPACK-lowered program of
    batch 1-16, written into ``directory`` as ``name``.pte."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    torch.manual_seed(0)
    model = (model or _DynamicBatch()).eval()
    batch = torch.export.Dim("batch", min=1, max=16)
    exported = torch.export.export(model, (torch.randn(4, 8),), dynamic_shapes=({0: batch},))
    lowered = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()])
    path = directory / f"{name}.pte"
    path.write_bytes(lowered.to_executorch().buffer)
    return model, path
