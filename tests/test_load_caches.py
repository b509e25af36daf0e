"""Loading the same bytes again reuses work, never results that could differ.

- the validated program description is shared by loads of the same bytes; other bytes
  (one byte changed) are decoded afresh, and a defective file is refused every time;
- compiled generated code is reused by text, and each piece keeps its own file name (so a
  failure still names its instruction);
- a chain's dataflow decisions are replayed for the same plan: the same statements, the
  same outputs as a load that analysed it afresh, the folds run on the new method's own
  constants;
- a one-delegate program written from the cache is byte for byte the one written afresh;
- a method's fast call generated for one load is bound into the next load's own memory;
- a kernel's statement is kept for the same plan only when it owns nothing of a method
  (no tensor, no call record) and its factory read no tensor of the values table: two
  loads sharing statements still keep their own state.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import ptexec
from fixture_data import compare_outputs, fixture_calls, fixture_paths, load_manifest, tolerance
from ptexec import codegen, effects
from ptexec.engine import fastcall
from ptexec.errors import PteFormatError
from ptexec.format import program as p
from ptexec.format import pte as pte_module
from ptexec.format import pte_write
from ptexec.format.pte import read_pte
from ptexec.kernels.registry import is_literal_tensor
from ptexec.loader import dataflow
from ptexec.loader import devices as loader_devices
from ptexec.loader import instructions as loader_instructions
from ptexec.loader import meta as loader_meta
from ptexec.loader import specs as loader_specs
from ptexec.loader import values as loader_values

FIX = Path(__file__).parent / "fixtures"


def _forget() -> None:
    pte_module.clear_decoded()
    codegen.clear_compiled()
    dataflow.clear_recipes()
    loader_instructions.clear_kept_statements()
    loader_devices.clear_placements()
    loader_values.clear_recipes()
    effects.clear_dynamic_scalars()
    fastcall.clear_generated()
    loader_meta.clear_metas()
    loader_specs.clear_specs()


def _asking(asked: list[str], read: bool = False) -> Callable[[str], object]:
    """The kernel registry's lookup, each factory wrapped to note its operator in ``asked``
    when it is asked for a statement (``read``: and to read every tensor argument of the
    values table first, as a factory that depends on a constant's bytes does)."""
    find = loader_instructions.find_kernel

    def lookup(name: str) -> object:
        factory = find(name)
        if factory is None:
            return None

        def wrapped(ctx: object) -> object:
            asked.append(name)
            if read:
                for a in ctx.args:  # type: ignore[attr-defined]
                    ctx.initial[a]  # type: ignore[attr-defined]  # a tensor read, for the test
            return factory(ctx)  # type: ignore[arg-type]

        return wrapped

    return lookup


def _statements(m: ptexec.Method) -> list[tuple[object, ...]]:
    return [
        (st.code, st.writes, st.outs, st.reads, st.mutates)
        for chain in m.state.chains
        for st in chain.statements
    ]


def _assert_forward_calls(name: str, *methods: ptexec.Method) -> None:
    """Each method gives the fixture's recorded outputs for its forward calls."""
    rtol, atol = tolerance(name)
    for call in fixture_calls(name):
        if call.get("method", "forward") != "forward":
            continue
        for m in methods:
            problem = compare_outputs(m.execute(list(call["inputs"])), call["outputs"], rtol, atol)
            assert problem is None, problem


def test_the_same_bytes_share_one_validated_description() -> None:
    data = (FIX / "mlp.pte").read_bytes()
    _forget()
    first = read_pte(data)
    again = read_pte(bytearray(data))
    assert again.program is first.program
    # another file with the same layout but one byte of the flatbuffer changed (the method
    # name) is decoded on its own
    name = data.index(b"forward")
    other = bytearray(data)
    other[name] = ord("g")
    changed = read_pte(other)
    assert changed.program is not first.program
    assert changed.program.execution_plan[0].name == "gorward"


def test_a_description_that_fails_validation_is_not_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = (FIX / "mlp.pte").read_bytes()
    _forget()

    def refuse(*args: object) -> None:
        raise PteFormatError("execution_plan[0]", "refused for the test")

    with monkeypatch.context() as patch:
        patch.setattr(pte_module, "validate_program", refuse)
        for _ in range(2):  # checked, and refused, each time
            with pytest.raises(PteFormatError):
                read_pte(data)
    assert len(pte_module._decoded) == 0
    first = read_pte(data)
    assert read_pte(data).program is first.program


def test_cached_code_keeps_each_piece_its_own_file_name() -> None:
    _forget()
    source = "def f(x):\n    def g():\n        return 1 / x\n    return g()\n"
    a = codegen.Sources("a").compile(source, "piece", {}, lines={3: 7})
    b = codegen.Sources("b").compile(source, "piece", {}, lines={3: 7})
    fa, fb = a["f"], b["f"]
    assert fa.__code__.co_filename != fb.__code__.co_filename
    assert fa(2) == fb(2) == 0.5
    inner = [c for c in fb.__code__.co_consts if hasattr(c, "co_filename")]
    assert inner and inner[0].co_filename == fb.__code__.co_filename
    with pytest.raises(ZeroDivisionError) as info:
        fb(0)
    assert b["__ptexec_sources__"].locate(info.tb) == (0, 7)


@pytest.mark.parametrize("name", ["transformer", "mlp", "cnn", "llama_sdpa_kv"])
def test_a_chain_loaded_again_gets_the_same_statements_and_outputs(name: str) -> None:
    pte, data = fixture_paths(name)
    _forget()
    fresh = ptexec.load(pte, data_path=data).load_method()
    replays = []
    replay = dataflow._replay

    def counted(*args: object) -> object:
        out = replay(*args)  # type: ignore[arg-type]
        replays.append(out is not None)
        return out

    dataflow._replay = counted  # type: ignore[assignment]
    try:
        again = ptexec.load(pte, data_path=data).load_method()
    finally:
        dataflow._replay = replay
    assert replays and all(replays)
    assert _statements(again) == _statements(fresh)
    _assert_forward_calls(name, fresh, again)


def test_a_replayed_fold_runs_on_the_new_constants() -> None:
    """Two loads of one file from different bytes objects share the decisions, each
    method its own values: a folded result of one is not the other's tensor."""
    pte, _ = fixture_paths("transformer")
    data = pte.read_bytes()
    _forget()
    a = ptexec.load(data).load_method()
    b = ptexec.load(bytearray(data)).load_method()
    shared = [
        k
        for k, (x, y) in enumerate(zip(a.state.values, b.state.values, strict=True))
        if isinstance(x, torch.Tensor) and x is y
    ]
    assert shared == []


def test_results_of_the_plan_alone_are_shared_by_its_loads() -> None:
    """What the transformer's folds compute from no tensor (its causal mask) is made by
    the first load and aliased by the next, from other bytes: the same memory in tensors
    of each method's own; nothing that reads the program's constants is shared; the
    results are the fixture's. Forgetting the recipes makes them afresh."""
    pte, _ = fixture_paths("transformer")
    data = pte.read_bytes()
    _forget()
    a = ptexec.load(data).load_method()
    b = ptexec.load(bytearray(data)).load_method()
    constants = {
        t.untyped_storage().data_ptr()
        for m in (a, b)
        for t, v in zip(m.state.values, m.state.plan.values, strict=True)
        if isinstance(v, p.Tensor) and v.is_constant and isinstance(t, torch.Tensor)
    }

    def storage(t: object) -> int | None:
        if not isinstance(t, torch.Tensor) or not t.numel():
            return None
        return t.untyped_storage().data_ptr()

    shared = [
        k
        for k, (x, y) in enumerate(zip(a.state.values, b.state.values, strict=True))
        if storage(x) is not None and storage(x) == storage(y)
    ]
    assert shared, "the mask should be made once"
    assert set(shared) <= set(b.state.fixed_slots)
    assert not {storage(b.state.values[k]) for k in shared} & constants
    assert all(a.state.values[k] is not b.state.values[k] for k in shared)
    _assert_forward_calls("transformer", a, b)
    dataflow.clear_recipes()
    c = ptexec.load(data).load_method()
    assert all(storage(c.state.values[k]) != storage(a.state.values[k]) for k in shared)
    _assert_forward_calls("transformer", c)


def test_kept_results_on_another_device_are_not_aliased() -> None:
    """A load whose tensors are on another device than the kept results (a device map
    the recipe's key does not hold) makes its own: nothing in its table changes."""
    planned = torch.empty(2)
    values: list[object] = [planned]
    saved: list[tuple[int, object]] = []
    kept = dataflow._Kept((0,), (torch.empty(2, device="meta"),))
    assert not dataflow._alias_kept(kept, values, saved)
    assert values[0] is planned and saved == []
    same = dataflow._Kept((0,), (torch.zeros(2),))
    assert dataflow._alias_kept(same, values, saved)
    assert values[0] is not same.tensors[0] and saved == [(0, planned)]
    assert values[0].data_ptr() == same.tensors[0].data_ptr()  # type: ignore[attr-defined]


def test_a_cached_one_delegate_flatbuffer_is_the_same_bytes() -> None:
    t = p.Tensor(6, 0, (2, 3), (0, 1), False, 0, None, 0, p.STATIC, None)
    specs = (p.CompileSpec("k", b"\x01"),)
    args = ([t, t], "SomeBackend", b"payload bytes", specs, {"w": b"1234"}, {1: "out"})
    pte_write._written.clear()
    first = pte_write.one_delegate_program(*args)
    assert len(pte_write._written) == 1
    again = pte_write.one_delegate_program(*args)
    assert again == first
    # other payload bytes of the same length: the same flatbuffer, the new payload
    other = pte_write.one_delegate_program(
        [t, t], "SomeBackend", b"PAYLOAD BYTES", specs, {"w": b"1234"}, {1: "out"}
    )
    assert len(pte_write._written) == 1 and other != first
    assert other.replace(b"PAYLOAD BYTES", b"payload bytes") == first
    back = read_pte(other)
    assert bytes(back.segment(1)) == b"PAYLOAD BYTES"
    # other named data keys of the same lengths (a layer's weights, another layer's
    # names): the same flatbuffer with the keys written in, byte for byte what a fresh
    # write gives, and the first keys' program unchanged
    named = {"wa": b"1234", "vb": b"56"}
    renamed = {"x1": b"1234", "\u00e9": b"56"}  # (two bytes in UTF-8)
    pte_write._written.clear()
    kept = pte_write.one_delegate_program([t, t], "SomeBackend", b"payload", specs, named)
    patched = pte_write.one_delegate_program([t, t], "SomeBackend", b"payload", specs, renamed)
    assert len(pte_write._written) == 1
    pte_write._written.clear()
    fresh = pte_write.one_delegate_program([t, t], "SomeBackend", b"payload", specs, renamed)
    assert patched == fresh != kept
    back = read_pte(patched)
    assert {k: bytes(v) for k, v in back.named_data().items()} == renamed
    again = pte_write.one_delegate_program([t, t], "SomeBackend", b"payload", specs, named)
    assert again == kept and len(pte_write._written) == 1
    longer = pte_write.one_delegate_program(
        [t, t], "SomeBackend", b"payload", specs, {"wa3": b"1234", "vb": b"56"}
    )
    assert len(pte_write._written) == 2
    assert {k: bytes(v) for k, v in read_pte(longer).named_data().items()} == {
        "wa3": b"1234",
        "vb": b"56",
    }
    # tensors planned elsewhere (a later layer's): no part of the written program, the
    # same flatbuffer, byte for byte a fresh write; other sizes: another flatbuffer
    planned = p.Tensor(
        6, 0, (2, 3), (0, 1), False, 0, p.AllocationDetails(1, 64), 0, p.STATIC, None
    )
    pte_write._written.clear()
    plain = pte_write.one_delegate_program(*args)
    moved = pte_write.one_delegate_program([planned, t], *args[1:])
    assert moved == plain and len(pte_write._written) == 1
    pte_write._written.clear()
    assert pte_write.one_delegate_program([planned, t], *args[1:]) == moved
    wider = p.Tensor(6, 0, (2, 4), (0, 1), False, 0, None, 0, p.STATIC, None)
    other_sizes = pte_write.one_delegate_program([wider, t], *args[1:])
    assert len(pte_write._written) == 2
    assert read_pte(other_sizes).program.execution_plan[0].values[0].sizes == (2, 4)


def test_kept_statements_own_nothing_of_a_method() -> None:
    pte, data = fixture_paths("transformer")
    _forget()
    first = ptexec.load(pte, data_path=data).load_method()
    kept = [st for _, _, st in loader_instructions._kept.values()]  # (plan, factory, statement)
    assert kept
    for st in kept:  # no tensor but the read-only ones a factory made from literals
        tensors = [o for o in st.env.values() if isinstance(o, torch.Tensor)]
        assert all(is_literal_tensor(t) and t.dim() == 0 for t in tensors), st.code
    assert any(isinstance(o, torch.Tensor) for st in kept for o in st.env.values())
    again = ptexec.load(pte, data_path=data).load_method()
    shared = {id(st) for chain in again.state.chains for st in chain.loaded} & {
        id(st) for chain in first.state.chains for st in chain.loaded
    }
    assert len(shared) == len(kept)


def test_a_statement_whose_factory_read_a_tensor_is_made_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A factory that reads a tensor of the values table (a constant's bytes may differ
    under the same plan) is asked again on the next load."""
    pte, data = fixture_paths("mlp")
    asked: list[str] = []
    _forget()
    monkeypatch.setattr(loader_instructions, "find_kernel", _asking(asked, read=True))
    ptexec.load(pte, data_path=data).load_method()
    n = len(asked)
    assert n and len(loader_instructions._kept) == 0
    ptexec.load(pte, data_path=data).load_method()
    assert len(asked) == 2 * n


def test_two_loads_sharing_statements_keep_their_own_state() -> None:
    """A program with a KV cache: the second load's first call gives what the first load's
    first call gave, however often the first was called in between."""
    pte, data = fixture_paths("llama_sdpa_kv")
    _forget()
    a = ptexec.load(pte, data_path=data).load_method()
    calls = [c for c in fixture_calls("llama_sdpa_kv") if c.get("method", "forward") == "forward"]
    first = [t.clone() for t in a.execute(list(calls[0]["inputs"]))]
    for call in calls[1:]:
        a.execute(list(call["inputs"]))
    b = ptexec.load(pte, data_path=data).load_method()
    assert len(loader_instructions._kept) > 0
    again = b.execute(list(calls[0]["inputs"]))
    for x, y in zip(first, again, strict=True):
        assert torch.equal(x, y)


def _geometry(m: ptexec.Method) -> list[object]:
    return [
        (
            k,
            x.dtype,
            x.device,
            tuple(x.shape),
            x.stride(),
            x.storage_offset(),
            x.untyped_storage().nbytes(),
        )
        if isinstance(x, torch.Tensor)
        else (k, x)
        for k, x in enumerate(m.state.values)
    ]


@pytest.mark.parametrize("name", ["mutable_init", "transformer", "stateful", "external"])
def test_a_values_table_made_again_is_the_one_made_afresh(name: str) -> None:
    """The second load of a plan makes its values table from what the first recorded: the
    same tensors over memory of its own, the initial state copied in, its own constants."""
    pte, data = fixture_paths(name)
    _forget()
    fresh = ptexec.load(pte, data_path=data).load_method()
    assert len(loader_values._recipes) == 1
    again = ptexec.load(pte, data_path=data).load_method()
    assert _geometry(again) == _geometry(fresh)
    for x, y in zip(fresh.state.buffers, again.state.buffers, strict=True):
        assert x.data.data_ptr() != y.data.data_ptr()
        assert torch.equal(x.data, y.data)  # initial state included
    # every planned tensor is a view of the new load's own buffer
    mine = {
        b.data.data_ptr(): a.data.data_ptr()
        for b, a in zip(fresh.state.buffers, again.state.buffers, strict=True)
    }
    views = 0
    for x, y in zip(fresh.state.values, again.state.values, strict=True):
        if isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() in mine:
            assert y.untyped_storage().data_ptr() == mine[x.untyped_storage().data_ptr()]
            views += 1
    assert views
    _assert_forward_calls(name, fresh, again)


def _loadable_fixtures() -> list[str]:
    names = []
    for name, entry in load_manifest().items():
        if entry.get("load_options") or entry.get("device") or "gpu" in name:
            continue
        names.append(name)
    return names + [f"xnnpack/{f.stem}" for f in sorted((FIX / "xnnpack").glob("*.pte"))]


def _described(t: torch.Tensor) -> tuple[object, ...]:
    return (
        type(t),
        t.dtype,
        t.device,
        tuple(t.shape),
        t.stride(),
        t.storage_offset(),
        t.untyped_storage().nbytes(),
        t.is_contiguous(),
        t.requires_grad,
        t.is_inference(),
        t._version,
    )


@pytest.mark.parametrize("name", _loadable_fixtures())
def test_planned_views_made_in_one_native_call_are_the_ones_python_makes(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A repeated load makes its planned views with the native library (one call) where
    it can: each is the tensor the Python replay makes (dtype, device, geometry, flags,
    version), and the snapshot takes the same entries."""
    from ptexec import native

    if native.wait() is None:
        pytest.skip(f"no native library: {native.unavailable()}")
    pte, data = (FIX / f"{name}.pte", None) if "/" in name else fixture_paths(name)
    try:
        ptexec.load(pte, data_path=data).load_method()
    except ptexec.PtexecError as e:  # (fixtures of refused programs, other methods)
        pytest.skip(f"{name} does not load with default options: {e}")
    made = ptexec.load(pte, data_path=data).load_method()
    recipe = next(r for r in loader_values._recipes.values() if r.plan is made.state.plan)
    if any(isinstance(t, loader_values._Planned) for t in recipe.tensors):
        assert recipe.native[0] is not None  # (made natively)
    monkeypatch.setattr(loader_values, "_native_views", lambda recipe: None)
    python = ptexec.load(pte, data_path=data).load_method()
    assert [type(v) for v in made.state.values] == [type(v) for v in python.state.values]
    for a, b in zip(made.state.values, python.state.values, strict=True):
        if isinstance(a, torch.Tensor):
            assert _described(a) == _described(b)
    native_owned, python_owned = _owned_by_slot(made), _owned_by_slot(python)
    assert native_owned.keys() == python_owned.keys()
    for k, (t, storage, offset, sizes, strides) in native_owned.items():
        geometry = python_owned[k][1:]
        assert (offset, tuple(sizes), tuple(strides)) == (geometry[1], *map(tuple, geometry[2:]))
        assert storage.data_ptr() == t.untyped_storage().data_ptr()
    if "/" not in name:
        _assert_forward_calls(name, made, python)


def _owned_by_slot(m: ptexec.Method) -> dict[int, tuple[Any, ...]]:
    """``m``'s snapshot entries by the slot of the values table holding their tensor."""
    slots = {id(t): k for k, t in enumerate(m.state.values) if isinstance(t, torch.Tensor)}
    return {slots[id(e[0])]: e for e in m.state.owned}


def _native_recipe(name: str) -> tuple[Any, Any, Any, tuple[Any, ...]]:
    """The fixture ``name`` loaded once into emptied caches: its paths, its plan's recipe and
    the recipe's native views (skips without the library)."""
    from ptexec import native

    if native.wait() is None:
        pytest.skip(f"no native library: {native.unavailable()}")
    pte, data = fixture_paths(name)
    _forget()
    ptexec.load(pte, data_path=data).load_method()
    (recipe,) = loader_values._recipes.values()
    split = recipe.native[0]
    assert isinstance(split, tuple)
    return pte, data, recipe, split


def test_native_views_that_fail_leave_the_python_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """A native ``Views.make`` that raises (half-way through the table) is not the load's
    failure: the Python replay makes the table, as a load without the library does."""
    pte, data, recipe, split = _native_recipe("stateful")

    class _Failing:
        def make(self, bases: object, values: list[object], made: list[object]) -> None:
            values[0] = made.append("half-way")  # type: ignore[func-returns-value]
            raise IndexError("a view reaching past its buffer")

    recipe.native[0] = (_Failing(), *split[1:])
    try:
        again = ptexec.load(pte, data_path=data).load_method()
    finally:
        recipe.native[0] = split
    monkeypatch.setattr(loader_values, "_native_views", lambda recipe: None)
    python = ptexec.load(pte, data_path=data).load_method()
    for a, b in zip(again.state.values, python.state.values, strict=True):
        assert type(a) is type(b)
        if isinstance(a, torch.Tensor):
            assert _described(a) == _described(b)
    assert all(isinstance(e[0], torch.Tensor) for e in again.state.owned)
    _assert_forward_calls("stateful", again, python)


def test_native_views_refuse_a_buffer_too_small_or_missing() -> None:
    from ptexec import native

    lib = native.wait()
    if lib is None:
        pytest.skip(f"no native library: {native.unavailable()}")
    views = lib.Views([(0, 1, 2, torch.float32, (2, 3), (3, 1))])  # 8 floats: 32 bytes
    small = torch.empty(31, dtype=torch.uint8)
    values: list[object] = [None]
    with pytest.raises(IndexError):
        views.make([None, (small, small.untyped_storage())], values, [])
    with pytest.raises(IndexError):
        views.make([None], values, [])
    big = torch.arange(8, dtype=torch.float32).view(torch.uint8)
    made: list[object] = []
    views.make([None, (big, big.untyped_storage())], values, made)
    assert isinstance(values[0], torch.Tensor)
    assert values[0].tolist() == [[2.0, 3.0, 4.0], [5.0, 6.0, 7.0]]
    assert made[0][0] is values[0] and made[0][2:] == (2, (2, 3), (3, 1))
    for sizes, strides, offset in (
        ((2,), (1,), -1),  # a negative offset
        ((), (), -1),  # ... of a 0-d view
        ((2, 3), (3,), 0),  # fewer strides than sizes
        ((2,), (-1,), 0),  # a negative stride
        ((2**62 + 1,), (4,), 0),  # an extent past int64
        ((2**61, 2), (1, 2**62), 0),
    ):
        with pytest.raises(ValueError):
            lib.Views([(0, 1, offset, torch.float32, sizes, strides)])
    empty = lib.Views([(0, 1, 0, torch.float32, (0, 2**62), (2**62, 1))])  # no elements
    empty.make([None, (small, small.untyped_storage())], values, [])
    assert isinstance(values[0], torch.Tensor) and values[0].numel() == 0


def test_native_views_are_not_used_once_the_library_is_turned_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``PTEXEC_NATIVE_STEPS=0`` set while the process runs: later loads make their planned
    views in Python, though the plan's recipe holds the library's object."""
    pte, data, recipe, split = _native_recipe("mlp")
    calls: list[int] = []

    class _Counted:
        def make(self, bases: object, values: object, made: object) -> None:
            calls.append(1)
            split[0].make(bases, values, made)

    recipe.native[0] = (_Counted(), *split[1:])
    try:
        ptexec.load(pte, data_path=data).load_method()
        assert calls == [1]
        monkeypatch.setenv("PTEXEC_NATIVE_STEPS", "0")
        m = ptexec.load(pte, data_path=data).load_method()
        assert calls == [1]
    finally:
        recipe.native[0] = split
    _assert_forward_calls("mlp", m)


@pytest.mark.parametrize("name", _loadable_fixtures())
def test_a_snapshot_from_what_loading_made_is_the_one_read_back(name: str) -> None:
    """A repeated load's snapshot (what a failed call restores) takes the geometry of the
    tensors the values table was made with as they were made, and reads back only the
    slots the load-time rewrites replaced: on every fixture, with and without the
    rewrites, it has one entry per slot holding a tensor (in any order), each what
    reading that tensor back after loading gives."""
    pte, data = (FIX / f"{name}.pte", None) if "/" in name else fixture_paths(name)
    try:
        ptexec.load(pte, data_path=data).load_method()
    except ptexec.PtexecError as e:  # (fixtures of refused programs, other methods)
        pytest.skip(f"{name} does not load with default options: {e}")
    for optimize in (True, False):
        m = ptexec.load(pte, data_path=data).load_method(optimize=optimize)  # from the recipe
        _assert_snapshot_read_back(m)


def _assert_snapshot_read_back(m: ptexec.Method) -> None:
    tensors = [t for t in m.state.values if isinstance(t, torch.Tensor)]
    assert sorted(id(t) for t in tensors) == sorted(id(e[0]) for e in m.state.owned)
    for t, storage, offset, sizes, strides in m.state.owned:
        assert storage.data_ptr() == t.untyped_storage().data_ptr()
        assert storage.nbytes() == t.untyped_storage().nbytes()
        assert (offset, tuple(sizes), tuple(strides)) == (
            t.storage_offset(),
            tuple(t.shape),
            t.stride(),
        )


def test_a_kept_chain_is_the_chain_prepared_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain whose every statement is kept is taken whole on the next load: the same
    statements and effects as preparing it afresh; a kernel registered since (another
    factory for one of its operators) has the chain prepared afresh."""
    pte, data = fixture_paths("mlp")
    _forget()
    first = ptexec.load(pte, data_path=data).load_method()
    assert len(loader_instructions._chains) == 1
    again = ptexec.load(pte, data_path=data).load_method()
    assert _statements(again) == _statements(first)
    assert [id(st) for st in again.state.chains[0].loaded] == [
        id(st) for st in first.state.chains[0].loaded
    ]
    loader_instructions.clear_kept_statements()
    afresh = ptexec.load(pte, data_path=data).load_method()
    assert _statements(afresh) == _statements(first)

    asked: list[str] = []
    monkeypatch.setattr(loader_instructions, "find_kernel", _asking(asked))
    replaced = ptexec.load(pte, data_path=data).load_method()
    assert asked and _statements(replaced) == _statements(first)
    call = fixture_calls("mlp")[0]
    rtol, atol = tolerance("mlp")
    for m in (first, again, replaced):
        problem = compare_outputs(m.execute(list(call["inputs"])), call["outputs"], rtol, atol)
        assert problem is None, problem


@pytest.mark.parametrize("name", ["quant_mixed"])  # (its quantized kernels read weights)
def test_a_partly_kept_chain_prepares_only_what_was_not_kept(name: str) -> None:
    """A chain with statements that are not kept (their factory read a constant) takes
    the kept ones and the effects from the kept chain and prepares the others again: the
    same statements and outputs as a load that prepared it all."""
    pte, data = fixture_paths(name)
    _forget()
    first = ptexec.load(pte, data_path=data).load_method()
    held = [st for *_, statements, _ in loader_instructions._chains.values() for st in statements]
    assert None in held and any(st is not None for st in held)
    prepared: list[int] = []
    prepare = loader_instructions.InstructionPreparer.prepare

    def counted(self: object, ins: object, i: int, c: int) -> object:
        prepared.append(i)
        return prepare(self, ins, i, c)  # type: ignore[arg-type]

    loader_instructions.InstructionPreparer.prepare = counted  # type: ignore[assignment,method-assign]
    try:
        again = ptexec.load(pte, data_path=data).load_method()
    finally:
        loader_instructions.InstructionPreparer.prepare = prepare  # type: ignore[method-assign]
    assert len(prepared) == held.count(None)
    assert _statements(again) == _statements(first)
    for a, b in zip(first.state.chains, again.state.chains, strict=True):
        assert a.names == b.names
    _assert_forward_calls(name, first, again)


def test_a_chain_of_the_same_statements_reuses_its_recipe_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Statements taken again as the same objects (kept) have the same facts: their key is
    not computed again; new statement objects have their facts read afresh."""
    pte, data = fixture_paths("mlp")
    _forget()
    signed: list[object] = []
    signature = dataflow._signature

    def counted(st: object) -> object:
        signed.append(st)
        return signature(st)  # type: ignore[arg-type]

    monkeypatch.setattr(dataflow, "_signature", counted)
    first = ptexec.load(pte, data_path=data).load_method()
    n = len(signed)
    assert n == len(first.state.chains[0].loaded)
    again = ptexec.load(pte, data_path=data).load_method()
    assert len(signed) == n  # the same statements: the key kept
    assert _statements(again) == _statements(first)
    loader_instructions.clear_kept_statements()  # new statement objects, same facts
    afresh = ptexec.load(pte, data_path=data).load_method()
    assert len(signed) == 2 * n
    assert _statements(afresh) == _statements(first)
    call = fixture_calls("mlp")[0]
    rtol, atol = tolerance("mlp")
    for m in (first, again, afresh):
        problem = compare_outputs(m.execute(list(call["inputs"])), call["outputs"], rtol, atol)
        assert problem is None, problem


def _shifted(inputs: list[object]) -> list[object]:
    """Other inputs of the same kind: floating tensors plus one (others as they are)."""
    return [x + 1 if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]


@pytest.mark.parametrize("name", ["mlp", "transformer", "cnn", "stateful", "cond"])
def test_a_fast_call_made_again_runs_in_its_own_method(name: str) -> None:
    """The second load of a method binds the fast call generated for the first into its
    own memory: the same code, and two methods called in turn with different inputs
    each give what the general path gives on a load of its own; the first method,
    dropped, is freed (nothing kept for later loads holds it)."""
    pte, data = fixture_paths(name)
    _forget()
    first = ptexec.load(pte, data_path=data).load_method()
    assert len(fastcall._generated) == 1
    again = ptexec.load(pte, data_path=data).load_method()
    assert again.source() == first.source()
    # (a general path of its own for each: a stateful method's state moves on per call)
    general = [ptexec.load(pte, data_path=data).load_method(fast_path=False) for _ in "ab"]
    rtol, atol = tolerance(name)
    for call in fixture_calls(name):
        if call.get("method", "forward") != "forward":
            continue
        one, two = list(call["inputs"]), _shifted(list(call["inputs"]))
        for m, g, inputs in ((first, 0, one), (again, 1, two)) * 2:
            expected = general[g].execute(inputs)
            problem = compare_outputs(m.execute(inputs), expected, rtol, atol)
            assert problem is None, problem
    gone = weakref.ref(first)
    del first
    assert gone() is None
    assert again.execute(list(fixture_calls(name)[0]["inputs"])) is not None


@pytest.mark.parametrize("name", ["mlp", "transformer", "stateful"])
def test_loads_of_one_plan_share_the_description_never_the_specs(name: str) -> None:
    """Two loads of one plan share its (frozen) description; each has specs of its own
    over its own values table."""
    pte, data = fixture_paths(name)
    _forget()
    first = ptexec.load(pte, data_path=data).load_method()
    again = ptexec.load(pte, data_path=data).load_method()
    assert again.meta is first.meta
    for mine, theirs in zip(again.state.inputs, first.state.inputs, strict=True):
        assert mine is not theirs
        assert (mine.index, mine.slot, mine.kind, mine.info, mine.written) == (
            theirs.index,
            theirs.slot,
            theirs.kind,
            theirs.info,
            theirs.written,
        )
        if theirs.view is not None:
            assert mine.view is again.state.values[mine.slot]
            assert mine.view.data_ptr() != theirs.view.data_ptr()
    for mine, theirs in zip(again.state.outputs, first.state.outputs, strict=True):
        assert mine is not theirs
        assert (mine.index, mine.slot, mine.kind, mine.planned) == (
            theirs.index,
            theirs.slot,
            theirs.kind,
            theirs.planned,
        )
        if theirs.default is not None:
            assert mine.default is again.state.values[mine.slot]
    _assert_forward_calls(name, first, again)


def test_an_lru_lists_its_values_while_other_threads_look_up() -> None:
    """``Lru.get`` takes no lock (each dictionary operation is atomic); ``values`` and
    ``put`` from other threads meanwhile neither fail nor lose an entry's cost."""
    import threading

    from ptexec.format.lru import Lru

    cache: Lru[int] = Lru(64, 1 << 20)
    for k in range(64):
        cache.put(k, k, 3)
    stop = threading.Event()
    errors: list[BaseException] = []

    def looking() -> None:
        while not stop.is_set():
            for k in range(64):
                cache.get(k)

    def listing() -> None:
        try:
            for _ in range(3000):
                assert len(cache.values()) <= 64
                cache.put(7, 7, 3)
        except BaseException as e:
            errors.append(e)

    lookers = [threading.Thread(target=looking) for _ in range(2)]
    for t in lookers:
        t.start()
    try:
        listing()
    finally:
        stop.set()
        for t in lookers:
            t.join()
    assert not errors
    assert sorted(cache.values()) == list(range(64)) and cache._cost == 64 * 3


def test_a_flatbuffer_differing_between_its_sampled_bytes_is_decoded_afresh() -> None:
    """A kept description is taken only for the very bytes it was decoded from: a file of
    the same length whose flatbuffer differs in one byte between the ones its key samples
    gets its own description, equal to the one decoded with nothing kept."""
    data = (FIX / "transformer.pte").read_bytes()
    _forget()
    first = read_pte(data)
    name = data.index(b"forward")
    assert first.header is not None
    step = max(1, first.header.program_size // pte_module.SAMPLED)
    at = next(k for k in range(name, name + 7) if k % step)  # (a byte the key skips)
    other = bytearray(data)
    other[at] ^= 0x20  # "forward" -> a name differing in one letter's case
    changed = read_pte(bytes(other))
    assert changed.program is not first.program
    _forget()
    assert changed.program == read_pte(bytes(other)).program
    assert changed.program.execution_plan[0].name != "forward"
