"""Copy elision and load-time folding: same answers as the plain program, and refusal
where a view would see a later write."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

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

MANIFEST = load_manifest()


@pytest.mark.parametrize("name", [n for n, e in MANIFEST.items() if e.get("runs", True)])
def test_rewrites_do_not_change_results(name: str) -> None:
    """Every fixture, optimized and not, call after call: equal outputs (floats within the
    fixture's tolerance: a GEMM reading a transposed view may round differently)."""
    pte, ptd = fixture_paths(name)
    options = load_options(name)
    progs = [ptexec.load(pte, data_path=ptd) for _ in range(2)]
    methods: list[dict[str, ptexec.Method]] = [{}, {}]
    for call in fixture_calls(name):
        results = []
        for prog, cache, optimize in zip(progs, methods, (True, False), strict=True):
            m = cache.get(call["method"])
            if m is None:
                m = cache[call["method"]] = prog.load_method(
                    call["method"], optimize=optimize, **options
                )
            inputs = [x.clone() if isinstance(x, torch.Tensor) else x for x in call["inputs"]]
            results.append(m.execute(inputs))  # fresh inputs: a program may write its inputs
        assert compare_outputs(results[0], results[1], *tolerance(name)) is None


def _statements(m: ptexec.Method) -> list[str]:
    return [s.code for s in m.state.chains[0].statements]


class TransposedState(torch.nn.Module):
    """A copy of the state, then the state changes, then the copy is read."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.arange(6.0).reshape(2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        before = self.state.t().contiguous()
        self.state.add_(x)
        return before * 2 + self.state.sum()


def test_a_copy_of_state_written_later_stays_a_copy() -> None:
    data = export_program(TransposedState(), (torch.ones(2, 3),))
    ours = ptexec.load(data).load_method("forward")
    eager = TransposedState()
    eager.state.zero_()  # the exporter does not keep a mutated buffer's initial value
    for _ in range(3):
        x = torch.randn(2, 3)
        torch.testing.assert_close(ours(x)[0], eager(x))


class Weights(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.ones(4, 4).tril()  # constants only: computed at load
        return self.fc(x) @ mask


def test_weights_are_viewed_and_constant_work_folded() -> None:
    data = export_program(Weights(), (torch.randn(3, 8),))
    m = ptexec.load(data).load_method("forward")
    plain = ptexec.load(data).load_method("forward", optimize=False)
    names = m.state.chains[0].names
    codes = _statements(m)
    assert "aten::permute_copy.out" in names
    for name, code in zip(names, codes, strict=True):
        if name in ("aten::permute_copy.out", "aten::full.out", "aten::tril.out"):
            assert code == "pass", f"{name} should run at load, not per call: {code}"
    x = torch.randn(3, 8)
    torch.testing.assert_close(m(x)[0], plain(x)[0])
    torch.testing.assert_close(m(x)[0], _same_weights(data)(x))


class Recurrent(torch.nn.Module):
    """One cell applied three times: the program transposes each weight once a step."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.LSTMCell(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(x.shape[0], 4)
        c = torch.zeros_like(h)
        for t in range(3):
            h, c = self.cell(x[:, t], (h, c))
        return h


def _geometry(m: ptexec.Method) -> list[object]:
    """Each value's geometry, its memory named by the order in which the table first
    shows it (each load has memory of its own)."""
    order: dict[int, int] = {}
    out: list[object] = []
    for t in m.state.values:
        if not isinstance(t, torch.Tensor):
            out.append(None)
            continue
        memory = order.setdefault(t.untyped_storage().data_ptr(), len(order))
        out.append((memory, t.storage_offset(), t.shape, t.stride(), t.dtype))
    return out


def test_a_view_made_again_is_the_first_ones_alias() -> None:
    """Loaded again, each step's transposed weight is an alias of the first step's (the
    same expression of the same constant): the same memory and geometry as the views the
    first load made, and the same results as the plain program."""
    from ptexec.loader import dataflow

    torch.manual_seed(0)
    module = Recurrent().eval()
    data = export_program(module, (torch.randn(2, 3, 4),))
    dataflow.clear_recipes()
    first = ptexec.load(data).load_method("forward")
    again = ptexec.load(data).load_method("forward")
    steps = [what for r in dataflow._recipes.values() for what, *_ in r[1]]
    assert steps.count("same view") >= 4, steps  # two weights, steps 2 and 3
    assert _geometry(again) == _geometry(first)
    plain = ptexec.load(data).load_method("forward", optimize=False)
    for _ in range(2):
        x = torch.randn(2, 3, 4)
        (got,) = again(x)
        torch.testing.assert_close(got, plain(x)[0])
        with torch.no_grad():
            torch.testing.assert_close(got, module(x))


class FillLike(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.where(x > 0, torch.full_like(x, 2.5), x)


def test_a_fill_of_a_computed_tensors_sizes_runs_at_load() -> None:
    """``full_like`` reads only its ``self``'s sizes, fixed here: it runs once, at load,
    though ``self`` is computed per call."""
    data = export_program(FillLike(), (torch.randn(3, 8),))
    m = ptexec.load(data).load_method("forward")
    names = m.state.chains[0].names
    codes = _statements(m)
    assert "aten::full_like.out" in names
    for name, code in zip(names, codes, strict=True):
        if name == "aten::full_like.out":
            assert code == "pass", f"{name} should run at load, not per call: {code}"
    for _ in range(3):
        x = torch.randn(3, 8)
        assert torch.equal(m(x)[0], FillLike()(x))


def _same_weights(data: bytes) -> torch.nn.Module:
    """An eager module with the weights the program carries (read back through ptexec)."""
    prog = ptexec.load(data)
    method = prog.load_method("forward", optimize=False)
    consts = [
        v for v in method.values() if isinstance(v, torch.Tensor) and v.shape in ((4, 8), (4,))
    ]
    module = Weights()
    with torch.no_grad():
        module.fc.weight.copy_(next(c for c in consts if c.shape == (4, 8)))
        module.fc.bias.copy_(next(c for c in consts if c.shape == (4,)))
    return module


# ---- the analysis on hand-made plans ------------------------------------------------------

from ptexec.format import program as p  # noqa: E402
from ptexec.kernels.registry import Alias, Statement  # noqa: E402
from ptexec.loader.dataflow import rewrite_chain  # noqa: E402


def _tensor(offset: int | None, numel: int = 16, sizes: tuple[int, ...] | None = None) -> p.Tensor:
    alloc = None if offset is None else p.AllocationDetails(1, offset)
    sizes = sizes or (numel,)
    return p.Tensor(6, 0, sizes, tuple(range(len(sizes))), False, 0, alloc, 0, p.STATIC, None)


def _run(
    values: list[p.EValue], calls: list[tuple[int, ...]], statements: list[Statement]
) -> list[Statement]:
    plan = p.ExecutionPlan(
        "f", None, tuple(values), (), (len(values) - 1,), (), (), (), (0, 1024), None
    )
    chain = p.Chain((), (), tuple(p.KernelCall(0, a) for a in calls), None)
    initial = [torch.zeros(16) for _ in values]
    return rewrite_chain(plan, chain, statements, ["aten::op"] * len(calls), initial, 1 << 20)


def _copy(src: int, dst: int) -> Statement:
    return Statement(
        f"copy(v[{src}], v[{dst}])",
        {},
        (),
        (dst,),
        Alias(f"v[{dst}] = view(v[{src}])", {}, src, (dst,)),
        (dst,),
    )


def _op(reads: tuple[int, ...], out: int) -> Statement:
    args = ", ".join(f"v[{r}]" for r in reads)
    return Statement(f"op({args}, v[{out}])", {}, (), (out,), None, (out,))


def test_a_view_is_refused_when_its_source_bytes_are_reused() -> None:
    # S at 0, D at 64; T reuses S's bytes while D is still to be read
    values = [_tensor(0), _tensor(64), _tensor(0), _tensor(128)]
    calls = [(0, 1), (2,), (1, 3)]
    out = _run(values, calls, [_copy(0, 1), _op((), 2), _op((1,), 3)])
    assert out[0].code.startswith("copy(")
    # without the reuse the copy becomes a view
    out = _run(values, [(0, 1), (1, 3)], [_copy(0, 1), _op((1,), 3)])
    assert out[0].code == "v[1] = view(v[0])"


def test_a_second_value_at_the_same_bytes_is_redirected() -> None:
    # W (value 2) is the emitter's static view of D (same bytes, other shape)
    values = [_tensor(0), _tensor(64), _tensor(64, sizes=(4, 4)), _tensor(128)]
    out = _run(values, [(0, 1), (2, 3)], [_copy(0, 1), _op((2,), 3)])
    assert out[0].code == "v[1] = view(v[0])\nv[2] = v[1].reshape(4, 4)"


def test_a_partial_reader_of_the_bytes_keeps_the_copy() -> None:
    values = [_tensor(0), _tensor(64), _tensor(96, numel=4), _tensor(128)]
    out = _run(values, [(0, 1), (2, 3)], [_copy(0, 1), _op((2,), 3)])
    assert out[0].code.startswith("copy(")


def test_a_reader_after_a_newer_tensor_is_not_the_views_business() -> None:
    # value 2 is written at D's bytes after D's last read: readers of 2 read the newer data
    values = [_tensor(0), _tensor(64), _tensor(64), _tensor(128), _tensor(192)]
    calls = [(0, 1), (1, 3), (2,), (2, 4)]
    out = _run(values, calls, [_copy(0, 1), _op((1,), 3), _op((), 2), _op((2,), 4)])
    assert out[0].code == "v[1] = view(v[0])"


def test_outputs_and_multiply_written_values_keep_their_copy() -> None:
    values = [_tensor(0), _tensor(64)]
    out = _run(values, [(0, 1)], [_copy(0, 1)])  # value 1 is the method's output
    assert out[0].code.startswith("copy(")
    values = [_tensor(0), _tensor(64), _tensor(128)]
    out = _run(values, [(0, 1), (1,), (1, 2)], [_copy(0, 1), _op((), 1), _op((1,), 2)])
    assert out[0].code.startswith("copy(")


# ---- views made once and held ----------------------------------------------------------------


def _view(src: int, dst: int, expr: str = "v[{src}].unsqueeze(0)") -> Statement:
    """A copy whose view form reads its source alone (as ATen's view forms say)."""
    return Statement(
        f"copy(v[{src}], v[{dst}])",
        {},
        (),
        (dst,),
        Alias(f"v[{dst}] = {expr.format(src=src)}", {}, src, (dst,), (src,)),
        (dst,),
    )


def _exec(st: Statement, table: list[object]) -> None:
    exec(st.code, {**st.env, "v": table})


def test_a_view_of_a_planned_static_tensor_is_made_once_and_follows_its_source() -> None:
    values = [_tensor(0), _tensor(64, sizes=(1, 16)), _tensor(128, sizes=(1, 16))]
    out = _run(values, [(0, 1), (1, 2)], [_view(0, 1), _op((1,), 2)])
    assert "_held" in out[0].code, out[0].code
    a, b = torch.arange(16.0), torch.arange(16.0) * -3
    table: list[object] = [a, None, None]
    _exec(out[0], table)
    first = table[1]
    assert isinstance(first, torch.Tensor) and torch.equal(first, a.unsqueeze(0))
    a.add_(1)  # new data in the same tensor: the held view reads it
    table[1] = None
    _exec(out[0], table)
    assert table[1] is first and torch.equal(first, a.unsqueeze(0))
    table[0] = b  # another object in the source's slot: a new view of it
    _exec(out[0], table)
    assert table[1] is not first and torch.equal(table[1], b.unsqueeze(0))  # type: ignore[arg-type]
    table[0] = a
    _exec(out[0], table)
    assert torch.equal(table[1], a.unsqueeze(0))  # type: ignore[arg-type]
    # a load of its own gets a cell of its own
    again = _run(values, [(0, 1), (1, 2)], [_view(0, 1), _op((1,), 2)])
    assert again[0].code == out[0].code
    cells = [v for k, v in out[0].env.items() if k.endswith("_held")]
    assert cells and all(c is not d for c in cells for d in again[0].env.values())


def test_a_view_of_a_held_view_is_held_too() -> None:
    values = [
        _tensor(0),
        _tensor(64, sizes=(1, 16)),
        _tensor(128, sizes=(3, 16)),
        _tensor(320, sizes=(3, 16)),
    ]
    sts = [_view(0, 1), _view(1, 2, "v[{src}].expand(3, 16)"), _op((2,), 3)]
    out = _run(values, [(0, 1), (1, 2), (2, 3)], sts)
    assert "_held" in out[0].code and "_held" in out[1].code
    a = torch.arange(16.0)
    table: list[object] = [a, None, None, None]
    for k in range(3):
        a.fill_(k)
        _exec(out[0], table)
        _exec(out[1], table)
        assert torch.equal(table[2], torch.full((3, 16), float(k)))  # type: ignore[arg-type]


def test_views_whose_source_may_change_are_made_per_call() -> None:
    cases = {
        "unplanned source": [_tensor(None), _tensor(64, sizes=(1, 16)), _tensor(128)],
        "dynamic source": [
            dataclasses.replace(_tensor(0), shape_dynamism=p.DYNAMIC_BOUND),
            _tensor(64, sizes=(1, 16)),
            _tensor(128),
        ],
    }
    for what, values in cases.items():
        out = _run(values, [(0, 1), (1, 2)], [_view(0, 1), _op((1,), 2)])
        assert out[0].code == "v[1] = v[0].unsqueeze(0)", what
    # a view that reads a scalar an instruction computes
    values = [_tensor(0), _tensor(64, sizes=(1, 16)), _tensor(128)]
    st = _view(0, 1)
    assert st.alias is not None
    st = dataclasses.replace(st, alias=dataclasses.replace(st.alias, reads=(0, 2)))
    out = _run(values, [(0, 1), (1, 2)], [st, _op((1,), 2)])
    assert "_held" not in out[0].code
    # a view of a view that is made per call (it has a redirect) is made per call too
    values = [
        _tensor(0),
        _tensor(64, sizes=(1, 16)),
        _tensor(64, sizes=(16, 1)),
        _tensor(128, sizes=(2, 1, 16)),
        _tensor(256),
    ]
    sts = [_view(0, 1), _view(1, 3, "v[{src}].expand(2, 1, 16)"), _op((2, 3), 4)]
    out = _run(values, [(0, 1), (1, 3), (2, 3, 4)], sts)
    assert "reshape" in out[0].code and "_held" not in out[0].code
    assert "_held" not in out[1].code


class ExpandedProduct(torch.nn.Module):
    """Views of the input and of an intermediate feeding a batched product."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a = (x * 2).unsqueeze(1).expand(3, 2, 4, 5)
        b = y.unsqueeze(1).expand(3, 2, 5, 6)
        return torch.matmul(a, b).sum(1) + a.mean()


def test_held_views_give_eagers_results_call_after_call() -> None:
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(3, 4, 5, generator=gen), torch.randn(3, 5, 6, generator=gen)
    data = export_program(ExpandedProduct(), (x, y))
    m = ptexec.load(data).load_method("forward")
    plain = ptexec.load(data).load_method("forward", optimize=False)
    assert any("_held" in code for code in _statements(m)), _statements(m)
    for _ in range(3):
        x, y = torch.randn(3, 4, 5, generator=gen), torch.randn(3, 5, 6, generator=gen)
        got = m(x, y)[0]
        assert torch.equal(got, plain(x, y)[0])
        torch.testing.assert_close(got, ExpandedProduct()(x, y))
    # the general path (a non-contiguous input) and a tool run the same statements
    xt = torch.randn(3, 5, 4, generator=gen).transpose(1, 2)
    assert torch.equal(m(xt, y)[0], plain(xt.contiguous(), y)[0])
    traced = m.trace([x, y])
    assert traced.outputs is not None and torch.equal(traced.outputs[0], plain(x, y)[0])


class FlatTranspose(torch.nn.Module):
    """A transpose made contiguous, then flattened: with every tensor at bytes of its own,
    the copies become views, and the flattening reads a transposed view."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.fc(x).reshape(4, 2).t().contiguous().reshape(2, 4)
        return y, y.flatten()


def test_a_held_reshape_that_copies_is_made_per_call() -> None:
    gen = torch.Generator().manual_seed(0)
    module = FlatTranspose().requires_grad_(False)
    data = export_program(module, (torch.randn(2, 4, generator=gen),), naive_plan=True)
    m = ptexec.load(data).load_method("forward")
    assert any("_held" in code for code in _statements(m)), _statements(m)
    for _ in range(3):
        x = torch.randn(2, 4, generator=gen)
        got, want = m(x), module(x)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b)
        traced = m.trace([x])
        assert traced.outputs is not None
        torch.testing.assert_close(traced.outputs[1], want[1])


def test_a_copy_that_stays_a_copy_reads_a_held_view() -> None:
    # value 1 is the method's output: it keeps its copy, of a view made once
    values = [_tensor(0), _tensor(64, sizes=(1, 16))]
    view = "v[0].unsqueeze(0)"
    st = Statement(
        f"v[1].copy_({view})", {}, (), (1,), Alias(f"v[1] = {view}", {}, 0, (1,), (0,)), (1,)
    )
    out = _run(values, [(0, 1)], [st])
    assert out[0].code.startswith("v[1].copy_(") and "_held" in out[0].code, out[0].code
    a, b = torch.arange(16.0), torch.arange(16.0) * -3
    dst = torch.empty(1, 16)
    table: list[object] = [a, dst]
    for k in range(2):
        a.add_(k)
        _exec(out[0], table)
        assert table[1] is dst and torch.equal(dst, a.unsqueeze(0))
    table[0] = b
    _exec(out[0], table)
    assert torch.equal(dst, b.unsqueeze(0))
    # a clone's view form is its source: nothing to hold
    clone = Statement(
        "v[1].copy_(v[0])", {}, (), (1,), Alias("v[1] = v[0]", {}, 0, (1,), (0,)), (1,)
    )
    assert _run(values, [(0, 1)], [clone])[0].code == "v[1].copy_(v[0])"


@pytest.mark.parametrize(
    ("name", "held"),
    [
        ("op_bmm", True),
        ("op_attention", False),
        ("dynconv_padmodes_int8_dynamic_pc", True),
        ("deit_tiny_int8_static_pc", True),
        ("yolo_int8_static_pc", True),  # the pieces of splits, held
    ],
)
def test_held_views_before_xnnpack_delegates_follow_new_inputs(name: str, held: bool) -> None:
    """Views of delegate outputs and of inputs, held from call to call, in front of
    ExecuTorch's XNNPACK backend (which copies strided inputs to dense memory): the
    results of new inputs are those of the program run as written, bit for bit.
    op_attention's expands keep their sources' sizes: each is its source itself (a slot
    given the source's tensor, or a plain copy of it), nothing is held."""
    pytest.importorskip("executorch")
    from ptexec.delegates.xnnpack.executorch_runner import executorch_unavailable

    if executorch_unavailable() is not None:
        pytest.skip("ExecuTorch's XNNPACK backend is not available")
    pte = Path(__file__).parent / "fixtures" / "xnnpack" / f"{name}.pte"
    m = ptexec.load(pte).load_method("forward", xnnpack="executorch")
    plain = ptexec.load(pte).load_method("forward", xnnpack="executorch", optimize=False)
    assert any("_held" in code for code in _statements(m)) is held
    if not held:
        assert any(re.fullmatch(r"v\[\d+\] = v\[\d+\]", c) for c in _statements(m))
    gen = torch.Generator().manual_seed(4)
    recorded = torch.load(pte.with_suffix(".io.pt"), weights_only=False)["calls"][0]["inputs"]
    for _ in range(3):
        inputs = [torch.randn(x.shape, generator=gen) for x in recorded]
        got, want = m.execute(inputs), plain.execute(inputs)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    if any(".copy_(_i" in c and "_held" in c for c in _statements(m)):  # copies of held views
        traced = m.trace(inputs)
        assert "copies a view made once" in {r.note for r in traced}
        assert traced.outputs is not None
        assert all(torch.equal(a, b) for a, b in zip(traced.outputs, want, strict=True))


@pytest.mark.parametrize("seed", range(6))
def test_byte_ranges_found_are_those_a_scan_finds(seed: int) -> None:
    """The bucketed index of planned byte ranges answers every overlap query as a scan of
    all ranges does: the overlapping ones filed by instructions strictly inside the
    window, each once (small buffers and large ones, ranges inside one bucket and across
    many); and those of them that contain the whole queried range, in instruction order."""
    import random

    from ptexec.loader.dataflow import _Ranges

    rng = random.Random(seed)
    sizes = [rng.choice([64, 4096, 1 << 20]) for _ in range(3)]
    ranges = _Ranges(sizes)
    filed: list[tuple[int, int, int, int, int]] = []  # (k, mem, start, end, value)
    for k in range(300):
        for _ in range(rng.randint(0, 3)):
            mem = rng.randrange(len(sizes))
            start = rng.randrange(sizes[mem])
            end = min(sizes[mem], start + rng.choice([1, 8, 64, 700, sizes[mem] // 3 + 1]))
            value = len(filed)  # (an instruction files each value once)
            ranges.add(k, ("planned", mem, start, end), value)
            filed.append((k, mem, start, end, value))
    for _ in range(400):
        mem = rng.randrange(len(sizes))
        start = rng.randrange(sizes[mem])
        end = min(sizes[mem], start + rng.choice([1, 16, 300, sizes[mem]]))
        lo = rng.randrange(-1, 300)
        hi = rng.randrange(lo, 302)
        expected = sorted(
            {
                (k, s, e, v)
                for k, m, s, e, v in filed
                if m == mem and lo < k < hi and s < end and start < e
            }
        )
        got = ranges.within(("planned", mem, start, end), lo, hi)
        assert sorted(got) == expected
        covering = list(ranges.covering(("planned", mem, start, end), lo, hi))
        assert sorted(covering) == [r for r in expected if r[1] <= start and end <= r[2]]
        assert [k for k, *_ in covering] == sorted(k for k, *_ in covering)


class NegatedAny(torch.nn.Module):
    """The mask exported attention computes: rows of a mask all set, as not-any-not."""

    def __init__(self, keep: bool = False) -> None:
        super().__init__()
        self.keep = keep  # also return the negated mask (read twice: not fused)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        unset = torch.logical_not(x == 0)
        rows = torch.logical_not(torch.any(unset, -1, keepdim=True))
        out = torch.where(rows, x + 1, x * 2)
        return (out, unset) if self.keep else (out,)


@pytest.mark.parametrize("keep", [False, True])
def test_a_negated_any_of_a_negation_runs_as_all(keep: bool) -> None:
    """``logical_not(any(logical_not(m)))`` runs as one ``all(m)`` where the intermediates
    are read by nothing else, and gives eager's booleans either way."""
    module = NegatedAny(keep)
    data = export_program(module, (torch.randn(3, 4, 5),))
    m = ptexec.load(data).load_method("forward")
    names = m.state.chains[0].names
    assert names.count("aten::logical_not.out") == 2
    fused = [c for c in _statements(m) if "_all(" in c]
    assert len(fused) == (0 if keep else 1)
    for k in range(4):
        x = torch.randn(3, 4, 5)
        x[k % 3, :2] = 0
        x[(k + 1) % 3, 1:] = 0
        x[2, k % 4] = 0 if k else 1
        if k == 3:
            x[1] = 0  # a row all set
        got, want = m(x), module(x)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and torch.equal(g, w)
