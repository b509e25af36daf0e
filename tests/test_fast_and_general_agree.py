"""The fast call and the general path apply the same rules: same results, same errors.

The fast call (:mod:`ptexec.engine.fastcall`) takes its scalar rule, its copy-or-share
decision and its shape and output checks from :mod:`ptexec.binding` and
:mod:`ptexec.engine.arguments`. Here the same good, edge and bad inputs go through a
method with the fast path and one without, and the results, the call records and the
errors (type and message) must be the same; the rules' generated-code forms are checked
against their functions on grids of cases.
"""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ptexec
from ptexec import native
from ptexec.binding import Action, Policy, common_action, decide, shape_error, shape_test
from ptexec.codegen import Code, Sources
from ptexec.device import CPU
from ptexec.effects import effects
from ptexec.engine import arguments
from ptexec.tensor import TensorInfo, dim_order_strides

FIX = Path(__file__).parent / "fixtures"


def _inputs(name: str) -> list[Any]:
    calls = torch.load(FIX / f"{name}.io.pt", weights_only=False)["calls"]
    return list(calls[0]["inputs"])


def _outcome(m: ptexec.Method, inputs: Any) -> tuple[str, Any, Any]:
    try:
        result = m.execute(inputs)
    except Exception as e:
        return ("error", type(e), str(e))
    rec = m.last_call
    return ("ok", result, (list(rec.inputs), rec.h2h, rec.h2d, rec.d2h, rec.d2d))


def _same(a: tuple[str, Any, Any], b: tuple[str, Any, Any]) -> None:
    assert a[0] == b[0], (a, b)
    if a[0] == "error":
        assert a[1:] == b[1:]
        return
    assert a[2] == b[2]
    assert len(a[1]) == len(b[1])
    for x, y in zip(a[1], b[1], strict=True):
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y)
        else:
            assert type(x) is type(y) and x == y


def _run_both(
    name: str, inputs: list[Any], monkeypatch: pytest.MonkeyPatch, patch: Any = None
) -> tuple[tuple[str, Any, Any], bool]:
    """The outcome with the fast path and without (they must agree), and whether the fast
    path covered the call (the general path's validation did not run)."""
    general_ran = []
    check = arguments.check_inputs

    def watched(*args: Any, **kwargs: Any) -> Any:
        general_ran.append(True)
        return check(*args, **kwargs)

    monkeypatch.setattr(arguments, "check_inputs", watched)
    outcomes = []
    for fast in (True, False):
        m = ptexec.load(FIX / f"{name}.pte").load_method("forward", fast_path=fast)
        if patch is not None:
            patch(m)
        general_ran.clear()
        outcomes.append(_outcome(m, inputs))
        covered = not general_ran
        if fast:
            fast_covered = covered
        else:
            assert not covered
    _same(outcomes[0], outcomes[1])
    return outcomes[0], fast_covered


def test_planned_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    (x,) = _inputs("mlp")
    cases: list[tuple[list[Any], str, bool]] = [  # inputs, outcome, taken by the fast path
        ([x], "ok", True),
        ([x.t().contiguous().t()], "ok", True),  # another layout: copied into the plan's
        ([x.double()], "error", False),  # wrong dtype
        ([x[:1]], "error", False),  # wrong shape
        ([x.clone().requires_grad_()], "ok", False),
        ([x.numpy()], "ok", True),  # a plain numpy array: torch's view of it
        ([x.numpy().astype(">f4")], "error", False),  # another byte order
        ([np.asfortranarray(x.numpy())], "ok", False),  # another layout: the general path
        ([x, x], "error", False),
        ([], "error", False),
    ]
    for inputs, kind, fast in cases:
        outcome, covered = _run_both("mlp", inputs, monkeypatch)
        assert outcome[0] == kind, (inputs, outcome)
        assert covered is fast, inputs
        if kind == "ok":
            assert outcome[2][0] == ["copy"]


def test_planned_inputs_copied_as_bytes_or_by_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dense input of a plain dtype is copied into the plan as bytes; any other layout,
    a lazily negated tensor and a ZeroTensor (no memory of its own) through torch's copy:
    every one gives the general path's results. (The bytes are copied by the native
    library's ``Puts`` where it is loaded, else by ``memmove``.)"""
    (x,) = _inputs("mlp")
    m = ptexec.load(FIX / "mlp.pte").load_method("forward")
    assert ("_put(inputs)" if native.module() is not None else "_memmove(") in m.source()
    wide = torch.randn(3, *x.shape, generator=torch.Generator().manual_seed(2))
    cases = [
        x,
        wide[1],  # dense at an offset into its storage
        x.t().contiguous().t(),  # another layout
        torch._neg_view(x),  # negated when read
        torch._efficientzerotensor(x.shape),  # no memory: address 0
        x[:1].expand(x.shape),  # one row, read for every row
    ]
    for case in cases:
        outcome, covered = _run_both("mlp", [case], monkeypatch)
        assert outcome[0] == "ok" and covered and outcome[2][0] == ["copy"], case
        dense = torch.empty(case.shape).copy_(case)  # its values, materialized
        want = ptexec.load(FIX / "mlp.pte").load_method("forward").execute([dense])[0]
        assert torch.equal(outcome[1][0], want)


def test_shared_and_refused_unplanned_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    (x,) = _inputs("mlp_unplanned")
    outcome, covered = _run_both("mlp_unplanned", [x], monkeypatch)
    assert outcome[0] == "ok" and outcome[2][0] == ["share"] and outcome[2][1] == 0
    assert covered
    strided = x.t().contiguous().t()  # the right sizes in another layout: not shared
    outcome, covered = _run_both("mlp_unplanned", [strided], monkeypatch)
    assert outcome[0] == "error" and outcome[1] is ptexec.InputError
    assert "laid out" in outcome[2] and not covered
    outcome, covered = _run_both("mlp_unplanned", [x.to(torch.float16)], monkeypatch)
    assert outcome[0] == "error" and "(dtype)" in outcome[2] and not covered


def test_scalar_inputs_and_the_tolerance(monkeypatch: pytest.MonkeyPatch) -> None:
    x, f, i, b = _inputs("scalar_io")
    assert (f, i, b) == (0.5, 3, True)
    tol = 1e-4 + 1e-5 * 0.5
    cases: list[tuple[list[Any], str, bool]] = [
        ([x, f, i, b], "ok", True),
        ([x, f + 0.9 * tol, i, b], "ok", True),  # within the tolerance
        ([x, f - 0.9 * tol, i, b], "ok", True),
        ([x, f + 1.1 * tol, i, b], "error", False),  # outside it
        ([x, np.float32(f), i, b], "ok", False),  # numpy's scalars count as Python's
        ([x, f, np.int64(i), np.bool_(b)], "ok", False),
        ([x, f, 4, b], "error", False),
        ([x, f, True, b], "error", False),  # a bool is not an int
        ([x, f, float(i), b], "error", False),
        ([x, f, i, 1], "error", False),  # an int is not a bool
        ([x, 1, i, b], "error", False),
        ([x, None, i, b], "error", False),
        ([x[:0], f, i, b], "ok", False),  # no elements: bound as EMPTY
        ([torch.zeros(9, 3), f, i, b], "error", False),  # beyond the bound
    ]
    for inputs, kind, fast in cases:
        outcome, covered = _run_both("scalar_io", inputs, monkeypatch)
        assert outcome[0] == kind, (inputs[1:], outcome)
        assert covered is fast, inputs[1:]
        if kind == "error":
            assert outcome[1] is ptexec.InputError


def test_an_output_the_program_does_not_declare(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both branches of ``cond`` write their result with ``out=`` into a planned tensor
    that a ``move`` makes the output; given float64 tensors there instead, the kernels
    write float64 (ATen casts into ``out``), and both paths refuse the output alike."""

    def patch(m: ptexec.Method) -> None:
        v = m.state.values
        for slot in (10, 15):
            assert isinstance(v[slot], torch.Tensor) and v[slot].shape == (3, 4)
            v[slot] = torch.zeros(3, 4, dtype=torch.float64)

    outcome, covered = _run_both("cond", _inputs("cond"), monkeypatch, patch)
    assert outcome[0] == "error" and outcome[1] is ptexec.ExecutionError, outcome
    assert "output 0" in outcome[2] and "float64" in outcome[2]
    assert covered


def test_out_tensors_are_checked_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    (x,) = _inputs("mlp")
    for out in ([torch.empty(2, 4, dtype=torch.float64)], [torch.empty(3, 4)], [None, None]):
        results = []
        for fast in (True, False):
            m = ptexec.load(FIX / "mlp.pte").load_method("forward", fast_path=fast)
            with pytest.raises(ptexec.InputError) as info:
                m.execute([x], out=out)
            results.append(str(info.value))
        assert results[0] == results[1]


# --------------------------------------------------------------------------------------
# the rules' generated forms against their functions


def _infos() -> list[TensorInfo]:
    found = []
    for dynamism in ("static", "dynamic_bound", "dynamic_unbound"):
        for sizes in ((), (3,), (2, 3)):
            order = tuple(range(len(sizes)))
            found.append(
                TensorInfo(
                    sizes,
                    torch.float32,
                    order,
                    CPU,
                    dim_order_strides(sizes, order),
                    False,
                    dynamism,
                )
            )
    return found


def test_shape_test_is_shape_error() -> None:
    sources = Sources("test")
    for info in _infos():
        ok = sources.compile(f"def ok(s):\n    return {shape_test(info, 's')}\n", "shape")["ok"]
        for rank in range(4):
            for sizes in itertools.product(range(5), repeat=rank):
                want = shape_error(info, sizes) is None
                assert ok(torch.Size(sizes)) is want, (info, sizes)


def test_scalar_test_is_scalar_fits() -> None:
    sources = Sources("test")
    values: list[Any] = [0.5, 0.50005, 0.4999, 0.51, 3, 4, 3.0, True, False, None, "a", "b"]
    values += [np.float32(0.5), np.int64(3), np.bool_(True), -0.0, float("nan"), float("inf")]
    values += [float("-inf"), 1e300, np.float64("inf"), np.float64("nan")]
    for kind, traced in [
        ("float", 0.5),
        ("float", -1e6),
        ("float", 0.0),
        ("float", float("inf")),
        ("float", float("-inf")),
        ("float", float("nan")),
        ("int", 3),
        ("bool", True),
        ("bool", False),
        ("none", None),
        ("str", "a"),
    ]:
        test = arguments.scalar_test(kind, traced, "x", "w")
        ok = sources.compile(f"def ok(x):\n    return {test}\n", "scalar", {"w": traced})["ok"]
        for x in [*values, traced + 1e-4 if kind == "float" else traced]:
            fits = arguments.scalar_fits(kind, traced, x)
            own_type = type(x) is type(traced) or (kind == "none")
            assert ok(x) is (fits and own_type), (kind, traced, x)


def test_common_action_is_what_decide_returns() -> None:
    policies = [
        Policy(t, lay) for t in ("auto", "allow", "forbid") for lay in ("strict", "convert")
    ]
    sizes = (2, 3, 4)
    for planned, order in itertools.product((True, False), itertools.permutations(range(3))):
        expected = TensorInfo(
            sizes, torch.float32, order, CPU, dim_order_strides(sizes, order), planned, "static"
        )
        for got_order in itertools.permutations(range(3)):
            strides = dim_order_strides(sizes, got_order)
            got = TensorInfo(sizes, torch.float32, got_order, CPU, strides)
            contiguous = torch.empty_strided(sizes, strides).is_contiguous()
            action = common_action(expected, contiguous)
            if action is None:
                continue
            for policy in policies:
                assert decide(expected, got, policy) is action, (expected, got, policy)
        assert common_action(expected, True) in (Action.COPY, Action.SHARE) or order != (0, 1, 2)


def test_output_checks_are_output_error() -> None:
    for name in ("mlp", "scalar_io"):  # a static output and one with a bound
        m = ptexec.load(FIX / f"{name}.pte").load_method("forward")
        state = m.state
        spec = state.outputs[0]
        assert isinstance(spec.info, TensorInfo)

        def no(k: int) -> None:
            raise LookupError(k)

        checks = []
        for held in (False, True):  # held: the program's dtype is known, the sizes checked
            code = Code()
            code.add("def check(v):")
            with code.indented():
                lines = arguments.output_checks(state, 0, f"v[{spec.slot}]", "_no", code.env, held)
                code.add("\n".join(lines))
                code.add("return True")
            code.env["_no"] = no
            checks.append(code.compile(Sources("test"), "output check")["check"])
        sizes = spec.info.sizes
        values: list[Any] = [
            torch.zeros(sizes),
            torch.zeros(sizes, dtype=torch.float64),
            torch.zeros(*sizes, 1),
            torch.zeros(sizes[0] + 1, sizes[1]),
            torch.zeros(1, sizes[1]),
            torch.zeros(0, sizes[1]),
            torch.zeros(()),
            3,
            None,
        ]
        for value in values:
            table = list(state.values)
            table[spec.slot] = value
            saved = state.values[spec.slot]
            state.values[spec.slot] = value
            try:
                refused = arguments.output_error(state, 0) is not None
            finally:
                state.values[spec.slot] = saved
            for held, check in enumerate(checks):
                if held and not (
                    isinstance(value, torch.Tensor) and value.dtype == spec.info.dtype
                ):
                    continue  # a held output is always a tensor of the program's dtype
                try:
                    check(table)
                    generated = False
                except LookupError:
                    generated = True
                assert generated is refused, (name, value, held)


def test_held_outputs() -> None:
    """A planned output that no instruction gives a new object is held (its sizes alone
    checked); ``cond``'s output, which a ``move`` makes, is not."""
    for name, held in (("mlp", {0}), ("int_ops", set(range(9))), ("cond", set())):
        m = ptexec.load(FIX / f"{name}.pte").load_method("forward")
        replaced = {
            k
            for chain in m.state.chains
            for ins, st in zip(chain.instructions, chain.statements, strict=True)
            for k in effects(m.state.plan.values, ins, st).replaces
        }
        assert arguments.held_outputs(m.state, frozenset(replaced)) == held, name
        assert arguments.held_outputs(m.state, None) == frozenset()


def test_views_skip_their_bookkeeping_only_where_the_caller_gets_copies() -> None:
    """The fast call's guard skips views' and in-place writes' bookkeeping (version
    counts) only where nothing it makes or writes reaches the caller; values agree."""
    from ptexec.engine.runner import below_autograd_for

    m = ptexec.load(FIX / "transformer.pte").load_method("forward")
    views = getattr(torch._C, "_AutoDispatchBelowADInplaceOrView", None)
    if views is not None:
        assert below_autograd_for(m.state, True) is views
        assert below_autograd_for(m.state, False) is torch._C._AutoDispatchBelowAutograd
    (x,) = _inputs("transformer")
    general = ptexec.load(FIX / "transformer.pte").load_method("forward", fast_path=False)
    for _ in range(2):
        assert torch.equal(m.execute([x])[0], general.execute([x])[0])


@pytest.mark.parametrize("steps", ["0", "1"])
def test_output_checks_stop_once_the_method_is_settled(
    steps: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A straight-line method of static inputs whose sizes follow from sizes alone checks
    its outputs until a call leaves the table's geometry as it found it; a method whose
    outputs fail keeps checking (and refusing) on every call, and works again once the
    cause is gone. Results equal the general path's on every call. (With the native
    steps, copies between planned tensors are steps.)"""
    monkeypatch.setenv("PTEXEC_NATIVE_STEPS", steps)
    native_steps = native.module() is not None
    for name in ("mlp", "int_ops", "stateful"):
        m = ptexec.load(FIX / f"{name}.pte").load_method("forward")
        assert "if _unsettled[0]:" in m.source(), name
        # stateful: its copies between planned tensors (the state's too) copy bytes once
        # settled
        assert ("else: _memmove(_cd" in m.source()) is (name == "stateful" and not native_steps)
        general = ptexec.load(FIX / f"{name}.pte").load_method("forward", fast_path=False)
        inputs = _inputs(name)
        for _ in range(4):  # stateful: the state moves on alike
            for x, y in zip(m.execute(inputs), general.execute(inputs), strict=True):
                assert x.dtype == y.dtype and torch.equal(x, y), name
    for name in ("cond", "dynamic_mlp"):  # jumps; a dynamic input: checked on every call
        m = ptexec.load(FIX / f"{name}.pte").load_method("forward")
        assert "_unsettled" not in m.source(), name

    m = ptexec.load(FIX / "mlp.pte").load_method("forward")
    (x,) = _inputs("mlp")
    v = m.state.values
    # the last addmm's bias and weight, (4,) and (k, 4), given other memory in place (the
    # same objects: the native steps hold them): now it makes (2, 5)
    kept = {
        k: (v[k].untyped_storage(), v[k].storage_offset(), v[k].shape, v[k].stride())
        for k in (3, 13)
    }
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*resized")
        for _ in range(2):  # (a failed call gives them their memory back: again)
            v[3].set_(torch.zeros(1))
            v[13].set_(torch.zeros(v[13].shape[0], 5))
            with pytest.raises(ptexec.ExecutionError, match="output 0"):
                m.execute([x])
    for k, (memory, offset, shape, stride) in kept.items():
        v[k].set_(memory, offset, shape, stride)
    want = ptexec.load(FIX / "mlp.pte").load_method("forward", fast_path=False).execute([x])
    for _ in range(2):
        assert torch.equal(m.execute([x])[0], want[0])


def test_a_jump_on_a_comparison_with_a_scalar_compares_numbers() -> None:
    """``cond``'s predicate (``x.sum() > 0``, then a jump on it): the fast call compares
    the sum with the scalar as numbers, and takes the branch the general path takes on
    sums at and around zero, signed zeros, infinities and NaN."""
    m = ptexec.load(FIX / "cond.pte").load_method("forward")
    assert "v[2].item() > _jc2" in m.source()
    general = ptexec.load(FIX / "cond.pte").load_method("forward", fast_path=False)
    tiny = float(np.finfo(np.float32).tiny)
    sums = [0.0, -0.0, tiny, -tiny, 1e-45, -1e-45, 1.0, -1.0, float("inf"), -float("inf")]
    y = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    for total in [*sums, float("nan")]:
        x = torch.zeros(3, 4)
        x[0, 0] = total
        for a, b in zip(m.execute([x, y]), general.execute([x, y]), strict=True):
            assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)), total
            assert torch.equal(a.isnan(), b.isnan()), total


def test_a_bounded_input_is_copied_as_bytes_after_its_view_is_resized(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dense input of bounded sizes is copied as bytes into its view, resized to the
    input's sizes first; other layouts through torch's copy. Batches of every size, one
    after the other on one method, give the general path's results. (The bytes are copied
    by the native library's ``Puts`` where it is loaded, after the resize.)"""
    m = ptexec.load(FIX / "dynamic_mlp.pte").load_method("forward")
    source = m.source()
    if native.module() is not None:
        assert source.index("resize_to(V0, x0s, o0)") < source.index("_put(inputs)")
    else:
        assert "_memmove(D0, p0, q0 - p0)" in source
    general = ptexec.load(FIX / "dynamic_mlp.pte").load_method("forward", fast_path=False)
    gen = torch.Generator().manual_seed(3)
    for n in (16, 1, 5, 5, 16, 2):
        wide = torch.randn(n, 16, generator=gen)
        for case in (wide[:, :8], wide[:, :8].contiguous(), torch._neg_view(wide[:, 8:])):
            got, want = m.execute([case]), general.execute([case])
            assert torch.equal(got[0], want[0]), (n, case.stride())
            assert list(m.last_call.inputs) == ["copy"]
            assert m.last_call.h2h == general.last_call.h2h == case.nbytes
    outcome, covered = _run_both("dynamic_mlp", _inputs("dynamic_mlp"), monkeypatch)
    assert outcome[0] == "ok" and covered
