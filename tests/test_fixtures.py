"""Every fixture, replayed call by call, against eager PyTorch and ExecuTorch's runtime."""

from __future__ import annotations

import importlib

import pytest
import torch

import ptexec
from conftest import executorch_runtime
from fixture_data import (
    compare_outputs,
    fixture_calls,
    fixture_paths,
    load_manifest,
    load_options,
    tolerance,
)

MANIFEST = load_manifest()
RUNNABLE = [name for name, entry in MANIFEST.items() if entry.get("runs", True)]


def _replay(name: str, **options: object) -> list[list[object]]:
    options = {**load_options(name), **options}
    pte, ptd = fixture_paths(name)
    prog = ptexec.load(pte, data_path=ptd)
    methods: dict[str, ptexec.Method] = {}
    results = []
    for call in fixture_calls(name):
        method = methods.get(call["method"])
        if method is None:
            method = methods[call["method"]] = prog.load_method(call["method"], **options)
        results.append(method.execute(call["inputs"]))
    return results


@pytest.mark.parametrize("name", RUNNABLE)
def test_matches_eager(name: str) -> None:
    calls = fixture_calls(name)
    for i, (got, call) in enumerate(zip(_replay(name), calls, strict=True)):
        problem = compare_outputs(got, call["outputs"], *tolerance(name))
        assert problem is None, f"{name} call {i} ({call['method']}): {problem}"


@pytest.mark.parametrize("name", RUNNABLE)
def test_view_outputs_match_copies(name: str) -> None:
    """outputs='view' gives the same values (read before the next call)."""
    pte, ptd = fixture_paths(name)
    prog = ptexec.load(pte, data_path=ptd)
    methods: dict[str, ptexec.Method] = {}
    for call in fixture_calls(name):
        method = methods.get(call["method"]) or methods.setdefault(
            call["method"], prog.load_method(call["method"], outputs="view", **load_options(name))
        )
        got = [
            x.clone() if isinstance(x, torch.Tensor) else x for x in method.execute(call["inputs"])
        ]
        assert compare_outputs(got, call["outputs"], *tolerance(name)) is None


@pytest.mark.parametrize(
    "name", [n for n in RUNNABLE if MANIFEST[n].get("executorch_runtime") == "ok"]
)
def test_matches_executorch_runtime(name: str) -> None:
    """ptexec and ExecuTorch's own runtime agree on the same file, call by call."""
    runtime = executorch_runtime()
    for module in MANIFEST[name].get("executorch_imports", []):  # its kernel libraries
        importlib.import_module(module)
    pte, ptd = fixture_paths(name)
    et_prog = runtime.load_program(pte, data_path=ptd) if ptd else runtime.load_program(pte)
    et_methods = {}
    rtol, atol = tolerance(name)
    for i, (got, call) in enumerate(zip(_replay(name), fixture_calls(name), strict=True)):
        m = et_methods.get(call["method"]) or et_methods.setdefault(
            call["method"], et_prog.load_method(call["method"])
        )
        want = list(m.execute(call["inputs"]))
        problem = compare_outputs(got, want, rtol, atol)
        assert problem is None, f"{name} call {i}: ptexec vs ExecuTorch: {problem}"


def test_two_methods_keep_separate_state() -> None:
    """step, step, other, step: the counter survives the stateless method (ExecuTorch's
    executorch.runtime corrupts it by sharing host arenas between methods)."""
    prog = ptexec.load(fixture_paths("two_method_state")[0])
    step, other = prog.load_method("step"), prog.load_method("other")
    x = torch.ones(8)
    counts = []
    for name in ["step", "step", "other", "step", "other", "step"]:
        out = (step if name == "step" else other)(x)
        if name == "step":
            counts.append(int(out[0].reshape(-1)[0]))
    assert counts == [1, 2, 3, 4]


def test_shared_state_is_shared_between_methods() -> None:
    prog = ptexec.load(fixture_paths("shared_state")[0])
    assert prog.shared_buffer_indices == frozenset({2})
    calls = fixture_calls("shared_state")
    inc, read = prog.load_method("inc"), prog.load_method("read")
    for call in calls:
        m = inc if call["method"] == "inc" else read
        assert (
            compare_outputs(m.execute(call["inputs"]), call["outputs"], *tolerance("shared_state"))
            is None
        )
    meta = prog.method_meta("read")
    assert [b.shared for b in meta.buffers] == [False, True]


def test_mutable_initial_state_comes_from_the_file() -> None:
    prog = ptexec.load(fixture_paths("mutable_init")[0])
    assert prog.pte.program.mutable_data_segments, "fixture must carry a mutable data segment"
    call = fixture_calls("mutable_init")[0]
    got = prog.load_method(call["method"]).execute(call["inputs"])
    assert compare_outputs(got, call["outputs"], *tolerance("mutable_init")) is None


def test_dynamic_batch_within_and_past_its_bound() -> None:
    prog = ptexec.load(fixture_paths("dynamic_mlp")[0])
    fwd = prog.load_method("forward")
    bound = fwd.meta.inputs[0]
    assert isinstance(bound, ptexec.TensorInfo) and bound.dynamism == "dynamic_bound"
    for batch in (1, 5, bound.sizes[0]):
        x = torch.randn(batch, *bound.sizes[1:])
        (y,) = fwd(x)
        assert y.shape[0] == batch
    with pytest.raises(ptexec.InputError, match="upper bound"):
        fwd(torch.randn(bound.sizes[0] + 1, *bound.sizes[1:]))
    (y,) = fwd(torch.randn(2, *bound.sizes[1:]))
    assert y.shape[0] == 2
