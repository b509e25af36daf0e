"""Loading XNNPACK programs again reuses checks, never results that could differ.

What the checks before ExecuTorch's backend found is kept per graph, sizes, call tensors
and scale bytes (ptexec.delegates.xnnpack.checked); the runner's source per call
signature; decoded graphs and written one-delegate programs in caches larger than a
many-delegate program; the one-delegate program of each call by its place in the plan,
used where the payload and named data are the same bytes. Here: a second load skips the
checks and still matches ExecuTorch's runtime, two loads share no mutable state, a payload
whose scales alone differ is checked again (and refused), a weight edited outside the
program's flatbuffer is loaded as edited, a freed method's ExecuTorch methods serve the
next load (and only once it is freed), and the caches' bounds.
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
from ptexec.format import pte, pte_write
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
    xnn_backend.clear_kept_programs()


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
    # once per graph form, sizes and call tensors (delegates alike share one check)
    checks = validations[0]
    assert 0 < checks <= delegates
    again = ptexec.load(bytearray(data)).load_method("forward")
    assert validations[0] == checks  # every verdict was kept
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
    # (each load copies the bytes: constants are not shared either); only what folds
    # compute from the plan alone (a causal mask) is, read-only memory both loads alias
    fixed = set(a.state.fixed_slots) & set(b.state.fixed_slots)
    assert [k for k in shared if k not in fixed] == []
    x = _inputs(name)
    before = [t.clone() for t in a.execute([t.clone() for t in x])]
    b.execute([torch.randn_like(t) if t.is_floating_point() else t.clone() for t in x])
    after = a.execute([t.clone() for t in x])
    for u, w in zip(before, after, strict=True):
        assert torch.equal(u, w)


def _runners(m: ptexec.Method) -> list[Any]:
    return [st.external for chain in m.state.chains for st in chain.statements if st.external]


@pytest.mark.parametrize("name", MANY)
def test_a_freed_methods_executorch_methods_serve_the_next_load(name: str, et: None) -> None:
    """Once a method is freed, its ExecuTorch methods (no longer called by anyone) are
    taken over by the next load of the program: none loaded again, nothing of the freed
    method's memory kept, ExecuTorch's results on other inputs and on the same ones. A
    method loaded while another is alive gets its own; forgetting the kept programs
    forgets them too."""
    import gc
    import weakref

    data = (DIR / MANIFEST[name]["pte"]).read_bytes()
    _forget()
    inputs = _inputs(name)
    other = [torch.randn_like(t) if t.is_floating_point() else t.clone() for t in inputs]
    rtol, atol = MANIFEST[name]["tol_executorch"]
    a = ptexec.load(data).load_method("forward")
    a.execute([t.clone() for t in inputs])  # (its runners hold its tensors now)
    methods = [r._binder.method for r in _runners(a)]
    planned = [
        weakref.ref(t)
        for t, v in zip(a.state.values, a.state.plan.values, strict=True)
        if isinstance(t, torch.Tensor) and getattr(v, "allocation_info", None) is not None
    ]
    assert planned
    del a
    gc.collect()
    assert all(r() is None for r in planned)  # nothing kept holds its planned tensors
    b = ptexec.load(data).load_method("forward")
    assert [r._binder.method for r in _runners(b)] == methods  # (the same objects)
    c = ptexec.load(data).load_method("forward")
    assert not {id(r._binder.method) for r in _runners(c)} & {id(m) for m in methods}
    for x in (other, inputs, other):
        want = _executorch_outputs(data, [t.clone() for t in x])
        for m in (b, c):
            problem = compare_outputs(m.execute([t.clone() for t in x]), want, rtol, atol)
            assert problem is None, problem
    del b, c
    gc.collect()
    assert len(executorch_runner._idle) == len(methods)  # one kept a program
    xnn_backend.clear_kept_programs()
    assert len(executorch_runner._idle) == 0


def _delegate_statements(m: ptexec.Method) -> list[tuple[Any, Any]]:
    return [
        (ins, st)
        for chain in m.state.chains
        for ins, st in zip(chain.instructions, chain.loaded, strict=True)
        if st.external is not None
    ]


@pytest.mark.parametrize("name", MANY)
def test_a_later_loads_delegate_statements_are_the_first_loads_on_its_runners(
    name: str, et: None
) -> None:
    """A later load of a call whose program was kept makes its statement from the form
    the first load's took (its code, what it reads and writes), bound to its own runner;
    the effects it is given are those of its statement."""
    from ptexec.effects import effects
    from ptexec.loader import instructions

    data = (DIR / MANIFEST[name]["pte"]).read_bytes()
    _forget()
    instructions.clear_kept_statements()
    first = ptexec.load(data).load_method("forward")
    again = ptexec.load(data).load_method("forward")  # (while the first is alive)
    made, reused = _delegate_statements(first), _delegate_statements(again)
    assert len(made) == len(reused) == len(MANIFEST[name]["delegates"]) > 1
    values = first.state.plan.values
    for (ins, st), (ins2, st2) in zip(made, reused, strict=True):
        assert ins2 is ins and st2 is not st and st2.external is not st.external
        for field in ("code", "instrumented", "writes", "mutates", "outs", "reads", "sized"):
            assert getattr(st2, field) == getattr(st, field), field
        assert st2.env.keys() == st.env.keys()
        runner = st2.external
        assert set(st2.env.values()) == {runner.fn, runner.run_nodes}
        assert runner.fn is not st.external.fn
        kept = [e for e in instructions._made_effects.values() if e[1] is ins]
        assert [e[2] for e in kept] == [effects(values, ins, st2)]
    inputs = _inputs(name)
    rtol, atol = MANIFEST[name]["tol_executorch"]
    want = _executorch_outputs(data, [t.clone() for t in inputs])
    for m in (first, again):
        problem = compare_outputs(m.execute([t.clone() for t in inputs]), want, rtol, atol)
        assert problem is None, problem


def test_a_payload_whose_scales_alone_differ_is_checked_again(
    et: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filter scale made huge (the fuzzer's edit of the fixture: the same graph, the same
    sizes, other scale bytes) after the fixture's checks were kept: ExecuTorch's backend
    must not get it (XNNPACK would refuse it and ExecuTorch's runtime abort). (The
    fixture's scales are more than a verdict is kept for: kept here all the same.)"""
    good = (DIR / "mobilenet_v3_small_int8_static_pc.pte").read_bytes()
    bad_path = ROOT / "tests" / "fuzz_corpus"
    bad = (bad_path / "crash-xnnpack-mobilenet_v3_small_int8_static_pc-244932a057.pte").read_bytes()
    _forget()
    monkeypatch.setattr(checked, "SCALE_BYTES_HASHED", 1 << 30)
    ptexec.load(good).load_method("forward", xnnpack="executorch")
    assert len(checked.scales) == 1

    def refuse(*args: Any, **kwargs: Any) -> Any:
        pytest.fail("the edited payload reached ExecuTorch's backend")

    monkeypatch.setattr(executorch_runner, "runner_of", refuse)
    with pytest.raises(ptexec.BackendUnavailableError, match="requantizes by"):
        ptexec.load(bad).load_method("forward", xnnpack="executorch")
    m = ptexec.load(bad).load_method("forward", xnnpack="auto")  # ptexec's runner
    x = torch.randn(*m.meta.inputs[0].sizes)  # type: ignore[union-attr]
    (out,) = m.execute([x])
    assert out.shape == tuple(m.meta.outputs[0].sizes)  # type: ignore[union-attr]


def test_many_scales_are_checked_on_every_load_that_prepares_the_call(
    et: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scale buffers of more than SCALE_BYTES_HASHED bytes together are not hashed for a
    kept verdict (reading them to hash costs what checking them does): every load that
    prepares the call (here: the program decoded anew each time) checks them; fewer are
    hashed, and the second load finds their verdict."""
    data = (DIR / "mobilenet_v3_small_int8_static_pc.pte").read_bytes()
    calls = [0]
    check = xnn_backend.quantization_problem

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return check(*args, **kwargs)

    monkeypatch.setattr(xnn_backend, "quantization_problem", counted)
    for limit, checks, kept in ((0, 2, 0), (1 << 30, 1, 1)):
        monkeypatch.setattr(checked, "SCALE_BYTES_HASHED", limit)
        _forget()
        calls[0] = 0
        for _ in range(2):
            pte.clear_decoded()
            ptexec.load(data).load_method("forward", xnnpack="executorch")
        assert (calls[0], len(checked.scales)) == (checks, kept)


def test_a_kept_program_is_used_only_for_the_same_bytes(et: None) -> None:
    """A program's segments are not part of its flatbuffer, which is all a shared plan
    stands for: the same bytes loaded again share the one-delegate program written for
    the first load; a weight edited in a named data segment (same flatbuffer, so the
    same plan) is written and loaded afresh, and its results are the edited program's."""
    from ptexec.format.pte import read_pte

    data = (DIR / "cnn.pte").read_bytes()
    _forget()
    first = ptexec.load(data).load_method("forward")
    again = ptexec.load(bytes(bytearray(data))).load_method("forward")  # equal, not the same
    kept = [r.program_data() for r in _runners(first)]
    assert kept and [r.program_data() for r in _runners(again)] == kept
    assert all(
        a is b for a, b in zip(kept, [r.program_data() for r in _runners(again)], strict=True)
    )

    pte = read_pte(data)
    named = pte.program.named_data
    weights = max(named, key=lambda n: pte.segments[n.segment_index].size)
    at = pte.segments[weights.segment_index].offset + 2  # a float's third byte: a small change
    edited = bytearray(data)
    edited[at] ^= 0x40
    edited_bytes = bytes(edited)
    assert read_pte(edited_bytes).program is pte.program  # the plan is shared
    third = ptexec.load(edited_bytes).load_method("forward")
    assert all(r.program_data() is not k for r, k in zip(_runners(third), kept, strict=True))
    x = _inputs("cnn")
    want = _executorch_outputs(edited_bytes, [t.clone() for t in x])
    got = third.execute([t.clone() for t in x])
    rtol, atol = MANIFEST["cnn"]["tol_executorch"]
    problem = compare_outputs(got, want, rtol, atol)
    assert problem is None, problem
    unedited = first.execute([t.clone() for t in x])
    assert not torch.equal(unedited[0], got[0])  # the edit shows
    assert torch.equal(again.execute([t.clone() for t in x])[0], unedited[0])


def test_a_kept_program_checks_every_byte_it_was_written_with(et: None) -> None:
    """:meth:`EtProgram.same_bytes` compares the payload and each named blob in place."""
    data = (DIR / "cnn.pte").read_bytes()
    _forget()
    ptexec.load(data).load_method("forward")
    (kept,) = xnn_backend._programs.values()
    program = kept.program
    offset, length = program.spans[0]
    payload = memoryview(program.data)[offset : offset + length]
    named = {
        k: memoryview(program.data)[o : o + n]
        for k, (o, n) in zip(program.named, program.spans[1:], strict=True)
    }
    assert program.same_bytes(payload, named)
    for k in named:
        changed = bytearray(named[k])
        changed[-1] ^= 1
        assert not program.same_bytes(payload, {**named, k: memoryview(changed)})
        assert not program.same_bytes(payload, {j: v for j, v in named.items() if j != k})
    longer = memoryview(bytes(payload) + b"\0")
    assert not program.same_bytes(longer, named)
    changed = bytearray(payload)
    changed[len(changed) // 2] ^= 1
    assert not program.same_bytes(memoryview(changed), named)


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
    caches = (
        schema._graphs,
        pte_write._written,
        checked.structures,
        checked.scales,
        xnn_backend._programs,
    )
    for cache in caches:
        assert cache.entries >= 1024


def test_a_runner_text_is_shared_by_calls_on_tensors_planned_elsewhere() -> None:
    """The runner's text reads of each tensor its sizes, dim order, dynamism and whether
    it is planned: calls whose tensors differ only in where they are planned (a model's
    layers) share one text; one whose tensor is not planned gets its own."""
    from ptexec.format import program as p

    def tensor(offset: int | None, dynamism: int = p.STATIC) -> p.Tensor:
        alloc = None if offset is None else p.AllocationDetails(1, offset)
        return p.Tensor(6, 0, (2, 3), (0, 1), False, 0, alloc, 0, dynamism, None)

    executorch_runner.clear_sources()
    first = executorch_runner._runner_source([tensor(0), tensor(64)], [1], {})
    layer = executorch_runner._runner_source([tensor(128), tensor(192)], [1], {})
    assert layer is first
    assert first == executorch_runner._source([tensor(128), tensor(192)], [1], {})
    constant = executorch_runner._runner_source([tensor(None), tensor(64)], [1], {})
    assert constant != first
    assert constant == executorch_runner._source([tensor(None), tensor(64)], [1], {})
    names = {1: "ptexec_output_1"}
    dynamic = [tensor(0), tensor(64, p.DYNAMIC_BOUND)]
    assert executorch_runner._runner_source(dynamic, [1], names) == (
        executorch_runner._source(dynamic, [1], names)
    )


def test_a_later_load_renews_its_calls_without_preparing_them(
    et: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A later load of the same bytes makes each call's statement with what its first
    load left (DelegateContext.renew_with), the backend not asked; a weight edited outside
    the flatbuffer, a dropped kept program, or ptexec's runner chosen now has the call
    prepared afresh. Each gives the runner's results (ExecuTorch's, or ptexec's torch
    runner's)."""
    from ptexec.format.pte import read_pte
    from ptexec.loader import instructions

    name = "transformer_int4_group"
    data = (DIR / MANIFEST[name]["pte"]).read_bytes()
    inputs = _inputs(name)
    rtol, atol = MANIFEST[name]["tol_executorch"]
    n = len(MANIFEST[name]["delegates"])
    _forget()
    instructions.clear_kept_statements()
    first = ptexec.load(data).load_method("forward")
    prepared: list[str] = []
    full = xnn_backend.prepare

    def counted(ctx: Any) -> Any:
        prepared.append(ctx.where)
        return full(ctx)

    monkeypatch.setattr(xnn_backend, "prepare", counted)

    def check(m: ptexec.Method, program: bytes) -> None:
        want = _executorch_outputs(program, [t.clone() for t in inputs])
        problem = compare_outputs(m.execute([t.clone() for t in inputs]), want, rtol, atol)
        assert problem is None, problem

    again = ptexec.load(data).load_method("forward")  # (the first alive: runners of its own)
    assert prepared == []
    assert {id(r) for r in _runners(again)}.isdisjoint(id(r) for r in _runners(first))
    check(again, data)
    check(first, data)
    # the renewals forgotten, the kept programs not: the backend is asked, and renews
    # each call from its kept program (no program written again)
    prepared.clear()
    kept = {id(r.program_data()) for r in _runners(again)}
    instructions.clear_kept_statements()
    renewed = ptexec.load(data).load_method("forward")
    assert len(prepared) == n
    assert {id(r.program_data()) for r in _runners(renewed)} == kept
    check(renewed, data)
    prepared.clear()
    # a weight edited in a named data segment: the same plan, other bytes
    pte = read_pte(data)
    weights = max(pte.program.named_data, key=lambda d: pte.segments[d.segment_index].size)
    edited = bytearray(data)
    edited[pte.segments[weights.segment_index].offset + 2] ^= 0x40
    other = ptexec.load(bytes(edited)).load_method("forward")
    assert 1 <= len(prepared) < n  # (the calls reading other weights alone)
    check(other, bytes(edited))
    prepared.clear()
    xnn_backend.clear_kept_programs()
    dropped = ptexec.load(data).load_method("forward")
    assert len(prepared) == n
    check(dropped, data)
    prepared.clear()
    monkeypatch.setattr(xnn_backend, "AUTO_RUNNER", "torch")
    torch_runner = ptexec.load(data).load_method("forward")
    assert len(prepared) == n and not _runners(torch_runner)
    check(torch_runner, data)
