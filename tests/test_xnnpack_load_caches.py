"""Loading XNNPACK programs again reuses checks, never results that could differ.

What the checks before ExecuTorch's backend found is kept per graph, sizes, call tensors
and scale bytes (ptexec.delegates.xnnpack.checked); the runner's source per call
signature; decoded graphs and written one-delegate programs in caches larger than a
many-delegate program. Here: a second load skips the checks and still matches ExecuTorch's
runtime, two loads share no mutable state, a payload whose scales alone differ is checked
again (and refused), and the caches' bounds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import ptexec
from fixture_data import compare_outputs
from ptexec.delegates.xnnpack import backend as xnn_backend
from ptexec.delegates.xnnpack import checked, executorch_runner, schema
from ptexec.format import pte_write
from ptexec.format.lru import Lru

ROOT = Path(__file__).resolve().parent.parent
DIR = ROOT / "tests" / "fixtures" / "xnnpack"
MANIFEST: dict[str, Any] = json.loads((DIR / "manifest.json").read_text())
MANY = ["transformer_int4_group", "deit_tiny_int8_static_pc"]  # 5 and 22 delegates


@pytest.fixture(scope="module")
def et() -> None:
    reason = executorch_runner.executorch_unavailable()
    if reason is not None:
        pytest.skip(reason)


def _forget() -> None:
    schema.clear_decoded_graphs()
    pte_write.clear_written()
    checked.clear_checked()
    executorch_runner.clear_sources()


def _inputs(name: str) -> list[Any]:
    calls = torch.load(DIR / f"{name}.io.pt", weights_only=True)["calls"]
    return list(calls[0]["inputs"])


def _executorch_outputs(data: bytes, inputs: list[Any]) -> list[Any]:
    from executorch.runtime import Runtime

    method = Runtime.get().load_program(data).load_method("forward")
    return list(method.execute(inputs))


def _count_validations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    validate = schema.validate_payload

    def counted(*args: Any, **kwargs: Any) -> None:
        calls[0] += 1
        validate(*args, **kwargs)

    monkeypatch.setattr(schema, "validate_payload", counted)
    return calls


@pytest.mark.parametrize("name", MANY)
def test_a_second_load_skips_the_checks_and_matches_executorch(
    name: str, et: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = (DIR / MANIFEST[name]["pte"]).read_bytes()
    delegates = len(MANIFEST[name]["delegates"])
    _forget()
    validations = _count_validations(monkeypatch)
    first = ptexec.load(data).load_method("forward")
    assert validations[0] == delegates
    again = ptexec.load(bytearray(data)).load_method("forward")
    assert validations[0] == delegates  # every verdict was kept
    inputs = _inputs(name)
    want = _executorch_outputs(data, [x.clone() for x in inputs])
    rtol, atol = MANIFEST[name]["tol_executorch"]
    for m in (first, again, first):
        got = m.execute([x.clone() for x in inputs])
        problem = compare_outputs(got, want, rtol, atol)
        assert problem is None, problem


@pytest.mark.parametrize("name", MANY)
def test_two_loads_share_no_mutable_state(name: str, et: None) -> None:
    """Each load has its own ExecuTorch methods and its own tensors; calling one with
    other inputs leaves the other's results as they were."""
    data = (DIR / MANIFEST[name]["pte"]).read_bytes()
    _forget()
    a = ptexec.load(data).load_method("forward")
    b = ptexec.load(data).load_method("forward")
    runners = [
        [st.external for chain in m.state.chains for st in chain.statements if st.external]
        for m in (a, b)
    ]
    assert runners[0] and len(runners[0]) == len(runners[1])
    for ra, rb in zip(*runners, strict=True):
        assert ra is not rb and ra.fn is not rb.fn
    shared = [
        k
        for k, (x, y) in enumerate(zip(a.state.values, b.state.values, strict=True))
        if isinstance(x, torch.Tensor)
        and isinstance(y, torch.Tensor)
        and x.numel() > 0
        and x.data_ptr() == y.data_ptr()
    ]
    assert shared == []  # (each load copies the bytes: constants are not shared either)
    x = _inputs(name)
    before = [t.clone() for t in a.execute([t.clone() for t in x])]
    b.execute([torch.randn_like(t) if t.is_floating_point() else t.clone() for t in x])
    after = a.execute([t.clone() for t in x])
    for u, w in zip(before, after, strict=True):
        assert torch.equal(u, w)


def test_a_payload_whose_scales_alone_differ_is_checked_again(
    et: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filter scale made huge (the fuzzer's edit of the fixture: the same graph, the same
    sizes, other scale bytes) after the fixture's checks were kept: ExecuTorch's backend
    must not get it (XNNPACK would refuse it and ExecuTorch's runtime abort)."""
    good = (DIR / "mobilenet_v3_small_int8_static_pc.pte").read_bytes()
    bad_path = ROOT / "tests" / "fuzz_corpus"
    bad = (bad_path / "crash-xnnpack-mobilenet_v3_small_int8_static_pc-244932a057.pte").read_bytes()
    _forget()
    ptexec.load(good).load_method("forward", xnnpack="executorch")
    assert len(checked.scales) == 1

    def refuse(*args: Any, **kwargs: Any) -> Any:
        pytest.fail("the edited payload reached ExecuTorch's backend")

    monkeypatch.setattr(executorch_runner, "build_executorch_runner", refuse)
    with pytest.raises(ptexec.BackendUnavailableError, match="requantizes by"):
        ptexec.load(bad).load_method("forward", xnnpack="executorch")
    m = ptexec.load(bad).load_method("forward", xnnpack="auto")  # ptexec's runner
    x = torch.randn(*m.meta.inputs[0].sizes)  # type: ignore[union-attr]
    (out,) = m.execute([x])
    assert out.shape == tuple(m.meta.outputs[0].sizes)  # type: ignore[union-attr]


def test_a_defect_is_found_on_every_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only checks that passed are kept: a payload refused once is checked, and refused,
    again."""
    data = (DIR / "transformer_int4_group.pte").read_bytes()
    _forget()
    validations = _count_validations(monkeypatch)

    def dims_problem(*args: Any) -> Any:
        return ptexec.PteFormatError("somewhere", "made up for the test")

    monkeypatch.setattr(xnn_backend, "serialized_dims_problem", dims_problem)
    for _ in range(2):
        with pytest.raises(ptexec.PteFormatError, match="made up"):
            ptexec.load(data).load_method("forward", xnnpack="executorch")
    assert validations[0] == 2 and len(checked.structures) == 0


def test_lru_bounds_entries_and_bytes() -> None:
    cache: Lru[str] = Lru(3, 10)
    for k in range(3):
        cache.put(k, str(k), 2)
    assert cache.get(0) == "0"  # 0 is now the most recently used
    cache.put(3, "3", 2)  # over 3 entries: 1 goes
    assert cache.get(1) is None and cache.get(0) == "0" and len(cache) == 3
    cache.put(4, "4", 9)  # over 10 bytes: all but the newest go
    assert len(cache) == 1 and cache.get(4) == "4"
    cache.put(5, "5", 11)  # larger than the budget: not kept
    assert cache.get(5) is None and cache.get(4) == "4"
    cache.clear()
    assert len(cache) == 0


def test_the_caches_hold_more_than_a_large_program_has_delegates() -> None:
    """An LLM of 30 layers has about 300 delegates; a cache of fewer entries, least
    recently used first out, would evict each before the next load asks for it."""
    for cache in (schema._graphs, pte_write._written, checked.structures, checked.scales):
        assert cache.entries >= 1024
